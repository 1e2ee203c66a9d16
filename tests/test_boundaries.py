"""The process boundaries hold in the imports: each process's entry modules load no other process's package,
the import contracts in pyproject.toml (lint-imports) pass, and the one table of architectures a process
without the engine checks files against names exactly the engine's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES = ("genie_daemon", "genie_workers", "genie_kvstore", "genie_protocol", "genie_common")
FOLDERS = {p: SETUPTOOLS["package-dir"].get(p, p) for p in PACKAGES}  # import name -> the repository's folder


def loaded_packages(*modules: str) -> set[str]:
    """The genie packages a fresh interpreter holds after importing `modules`."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout)) & set(PACKAGES)


@pytest.mark.parametrize(
    ("modules", "allowed"),
    [
        (
            ("genie_daemon.server", "genie_daemon.http_server", "genie_daemon.ctl"),
            {"genie_daemon", "genie_protocol", "genie_common"},
        ),
        (("genie_kvstore.server", "genie_kvstore.__main__"), {"genie_kvstore", "genie_protocol", "genie_common"}),
        (
            ("genie_workers.cli", "genie_workers.worker"),
            {"genie_workers", "genie_kvstore", "genie_protocol", "genie_common"},
        ),
        (
            ("genie_protocol.client", "genie_protocol.codec", "genie_protocol.messages", "genie_protocol.kv_messages"),
            {"genie_protocol"},
        ),
        (
            ("genie_common.registry", "genie_common.config", "genie_common.model_commands"),
            {"genie_common", "genie_protocol"},
        ),
    ],
    ids=["daemon", "kv-store", "worker", "protocol", "common"],
)
def test_a_process_loads_no_other_process_package(modules, allowed):
    assert loaded_packages(*modules) <= allowed


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in run.stdout  # every contract ran


def test_every_package_folder_is_installed_under_genies_name():
    """pyproject.toml lists the packages one by one (their import names differ from their folders): a folder
    with an __init__.py left off the list would be missing from an installed genie, not from a checkout."""
    found = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    assert set(SETUPTOOLS["packages"]) == found


def test_the_architecture_names_are_the_engines():
    from genie_common.families import architecture_names
    from genie_workers.engine.arch import ARCHITECTURES

    assert tuple(ARCHITECTURES) == architecture_names()


ENV_READERS = {"genie_common/env.py", "protocol/endpoints.py"}  # protocol's: the client library's socket default


def test_environment_variables_are_read_in_one_module():
    """os.environ and os.getenv appear only in genie_common/env.py (and the client library's endpoints.py):
    a variable's name, default and parsing are stated once."""
    import ast

    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / FOLDERS[package]).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
                    if isinstance(node.value, ast.Name) and node.value.id == "os" and rel not in ENV_READERS:
                        found.append(f"{rel}:{node.lineno}")
    assert not found, f"environment read outside genie_common/env.py: {found}"
