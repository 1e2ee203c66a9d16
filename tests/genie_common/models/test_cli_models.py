"""`genie pull`, `genie list`, `genie rm` and `-m NAME`, run as subprocesses against local HTTP servers
(tests/genie_common/models/file_server.py) with GENIE_MODELS_DIR in tmp_path: an interrupted pull resumes with
a Range request and lands byte for byte; bad downloads are refused in one line and never listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.tiny_models import write_tiny_model
from tests.child_env import ROOT, child_env
from tests.genie_common.models.file_server import COMMIT, FileServer, serving

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("src") / "x.gguf"
    write_tiny_model("llama", path)
    return path.read_bytes()


def genie(models_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genie_workers.cli", *args],
        cwd=ROOT,
        env=child_env(GENIE_MODELS_DIR=str(models_dir), no_proxy="127.0.0.1", **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("genie: error:")]
    assert len(errors) == 1 and errors[0] == r.stderr.splitlines()[-1], r.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def listed(models_dir: Path) -> dict[str, dict[str, object]]:
    r = genie(models_dir, "list", "--json")
    assert r.returncode == 0, r.stderr
    return {m["name"]: m for m in json.loads(r.stdout)["models"]}


def leftovers(models_dir: Path) -> list[str]:
    """Files a refused pull must not leave: models, manifests, partial downloads, its lock file."""
    if not models_dir.exists():
        return []
    return sorted(p.name for p in models_dir.iterdir())


def test_interrupted_pull_resumes_then_list_run_rm(tmp_path: Path, tiny_bytes: bytes) -> None:
    models_dir = tmp_path / "models"
    half = len(tiny_bytes) // 2
    with serving(FileServer(files={"/x.gguf": tiny_bytes}, drop_after_bytes=half)) as srv:
        url = f"{srv.url}/x.gguf"
        first = genie(models_dir, "pull", url)
        assert_one_line_error(first, url, "resumes")
        assert (models_dir / ".x.part").stat().st_size == half
        assert "x" not in listed(models_dir)

        srv.drop_after_bytes = None
        second = genie(models_dir, "pull", url)
        assert second.returncode == 0, second.stderr
        resumed = srv.gets("/x.gguf")[-1]
        assert resumed.headers.get("Range") == f"bytes={half}-"
        assert "If-Range" in resumed.headers
    assert (models_dir / "x.gguf").read_bytes() == tiny_bytes
    assert not (models_dir / ".x.part").exists()
    # no terminal: one line per step, in Ollama's words
    steps = second.stderr.splitlines()
    assert steps[0].startswith(f"pulling x from {url}")
    assert steps[1:] == [
        "pulling manifest",
        f"downloading ({len(tiny_bytes) / 1e6:,.1f} MB, resuming at {half / 1e6:,.1f} MB)",
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]

    entry = listed(models_dir)["x"]
    assert entry["size_bytes"] == len(tiny_bytes)
    assert (entry["architecture"], entry["quant"], entry["context"], entry["source"]) == ("llama", "F32", 512, url)
    table = genie(models_dir, "list")
    assert table.returncode == 0 and any(line.split()[0] == "x" for line in table.stdout.splitlines()[1:])

    by_name = genie(models_dir, "run", "-m", "x", "-p", "hi", "-n", "4", "--temperature", "0", "--json")
    assert by_name.returncode == 0, by_name.stderr
    by_path = genie(models_dir, "run", "-m", str(models_dir / "x.gguf"), "-p", "hi", "-n", "4", "--temperature", "0")
    assert by_path.returncode == 0, by_path.stderr
    assert json.loads(by_name.stdout)["text"] == by_path.stdout.removesuffix("\n")

    removed = genie(models_dir, "rm", "x")
    assert removed.returncode == 0, removed.stderr
    assert leftovers(models_dir) == []
    again = genie(models_dir, "rm", "x")
    assert again.returncode == 1 and "no pulled model 'x'" in again.stderr
    assert "x" not in listed(models_dir)
    assert_one_line_error(genie(models_dir, "run", "-m", "x", "-p", "hi"), "'x'", "genie pull")


@pytest.mark.parametrize(
    "name, cut, reason",
    [("junk", None, "not a GGUF file"), ("cut", 1000, "truncated file: tensor")],
    ids=["random-bytes", "tensors-past-the-end"],
)
def test_a_file_genie_cannot_load_is_refused_and_never_listed(
    tmp_path: Path, tiny_bytes: bytes, name: str, cut: int | None, reason: str
) -> None:
    """Random bytes, or a whole header whose last tensor's data is cut short."""
    models_dir = tmp_path / "models"
    body = os.urandom(200_000) if cut is None else tiny_bytes[:-cut]
    with serving(FileServer(files={f"/{name}.gguf": body})) as srv:
        r = genie(models_dir, "pull", f"{srv.url}/{name}.gguf")
    assert_one_line_error(r, f"{name}.gguf", reason)
    assert leftovers(models_dir) == []
    assert name not in listed(models_dir)


def test_hf_pull_resumes_through_the_resolve_api(tmp_path: Path, tiny_bytes: bytes) -> None:
    models_dir = tmp_path / "models"
    half = len(tiny_bytes) // 3
    server = FileServer(hf_files={("org/tiny-GGUF", "Tiny-Q8.gguf"): tiny_bytes}, drop_after_bytes=half)
    with serving(server) as srv:
        source = "hf://org/tiny-GGUF/Tiny-Q8.gguf"
        first = genie(models_dir, "pull", source, HF_ENDPOINT=srv.url)
        assert_one_line_error(first, source, "resumes")
        srv.drop_after_bytes = None
        second = genie(models_dir, "pull", source, HF_ENDPOINT=srv.url)
        assert second.returncode == 0, second.stderr
        heads = [s for s in srv.seen if s.method == "HEAD"]
        assert heads and heads[0].path == "/org/tiny-GGUF/resolve/main/Tiny-Q8.gguf"
        # the bytes come from the commit the HEAD named, through the redirect, resumed with a Range
        assert srv.gets("/org/")[-1].path == f"/org/tiny-GGUF/resolve/{COMMIT}/Tiny-Q8.gguf"
        assert srv.gets("/cdn/")[-1].headers.get("Range") == f"bytes={half}-"
    assert (models_dir / "tiny-q8.gguf").read_bytes() == tiny_bytes
    entry = listed(models_dir)["tiny-q8"]
    assert entry["source"] == source and entry["size_bytes"] == len(tiny_bytes)


def test_hf_pull_with_a_wrong_sha256_is_refused(tmp_path: Path, tiny_bytes: bytes) -> None:
    models_dir = tmp_path / "models"
    key = ("org/tiny-GGUF", "Tiny-Q8.gguf")
    with serving(FileServer(hf_files={key: tiny_bytes}, hf_sha256={key: "ab" * 32})) as srv:
        r = genie(models_dir, "pull", "hf://org/tiny-GGUF/Tiny-Q8.gguf", "--name", "tiny", HF_ENDPOINT=srv.url)
    assert_one_line_error(r, "sha256", "ab" * 32)
    assert leftovers(models_dir) == []
    assert "tiny" not in listed(models_dir)


def test_hf_file_missing_is_one_line(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    with serving(FileServer()) as srv:
        r = genie(models_dir, "pull", "hf://org/none/none.gguf", HF_ENDPOINT=srv.url)
    assert_one_line_error(r, "HTTP 404")


def test_unknown_source_names_the_catalogue(tmp_path: Path) -> None:
    r = genie(tmp_path / "models", "pull", "no-such-model")
    assert_one_line_error(r, "no-such-model", "qwen3-4b", "hf://")


def test_hf_pull_takes_a_file_huggingface_hub_already_fetched(tmp_path: Path, tiny_bytes: bytes) -> None:
    """A file in huggingface_hub's cache (another tool fetched it) is copied from there: no download."""
    models_dir, hub = tmp_path / "models", tmp_path / "hub"
    repo_dir = hub / "models--org--tiny-GGUF"
    blob = repo_dir / "blobs" / "0123"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(tiny_bytes)
    snapshot = repo_dir / "snapshots" / COMMIT / "Tiny-Q8.gguf"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(blob)  # the cache's layout: a snapshot's file links to its blob
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    with serving(FileServer(hf_files={("org/tiny-GGUF", "Tiny-Q8.gguf"): tiny_bytes})) as srv:
        r = genie(models_dir, "pull", "hf://org/tiny-GGUF/Tiny-Q8.gguf", HF_ENDPOINT=srv.url, HF_HUB_CACHE=str(hub))
        assert r.returncode == 0, r.stderr
        assert [s.method for s in srv.seen] == ["HEAD"]  # the size and sha256 still come from the server
    assert (models_dir / "tiny-q8.gguf").read_bytes() == tiny_bytes and blob.read_bytes() == tiny_bytes
    assert listed(models_dir)["tiny-q8"]["source"] == "hf://org/tiny-GGUF/Tiny-Q8.gguf"


def test_list_available_shows_the_catalogue_and_where_each_comes_from(tmp_path: Path) -> None:
    from genie_common.models.catalogue import CATALOGUE

    r = genie(tmp_path / "models", "list", "--available", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)["catalogue"]}
    assert set(rows) == set(CATALOGUE) and {"qwen3-4b", "qwen3-0.6b", "gemma4-e2b"} <= set(rows)
    for name, entry in CATALOGUE.items():
        assert rows[name]["source"] == f"hf://{entry.repo}/{entry.filename}" and "GB" in rows[name]["description"]
    table = genie(tmp_path / "models", "list", "--available")
    assert table.returncode == 0 and "hf://unsloth/Qwen3-4B-GGUF/Qwen3-4B-Q4_K_M.gguf" in table.stdout
