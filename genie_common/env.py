"""Every environment variable genie's processes read, here and nowhere else (the one exception is
XDG_RUNTIME_DIR in protocol/endpoints.py: the client library's default socket directory, which may not
depend on the service's packages). The daemon's own options (GENIE_<OPTION>) are read through `option`,
by config.load_config, after genie.toml and before flags."""

from __future__ import annotations

import os
from pathlib import Path


def option(name: str) -> str | None:
    """GENIE_<NAME> for the daemon option `name`, unparsed (config.py parses it by the option's type)."""
    return os.environ.get(f"GENIE_{name.upper()}")


def cache_home() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache: compiled CPU kernels and saved KV live under genie/ there."""
    base = os.environ.get("XDG_CACHE_HOME")
    return Path(base) if base else Path.home() / ".cache"


def config_home() -> Path:
    """$XDG_CONFIG_HOME, else ~/.config (genie.toml: genie/genie.toml there)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    return Path(base) if base else Path.home() / ".config"


def data_home() -> Path:
    """$XDG_DATA_HOME, else ~/.local/share (pulled models: genie/models there)."""
    base = os.environ.get("XDG_DATA_HOME")
    return Path(base) if base else Path.home() / ".local" / "share"


def models_dir_override() -> Path | None:
    """GENIE_MODELS_DIR: the models directory in place of the data home's."""
    value = os.environ.get("GENIE_MODELS_DIR")
    return Path(value).expanduser() if value else None


def hf_endpoint() -> str | None:
    """HF_ENDPOINT, as the Hugging Face tools read it: a mirror to pull from."""
    return os.environ.get("HF_ENDPOINT") or None


def c_compiler() -> str:
    """CC, else cc: the compiler of the CPU backend's kernel library."""
    return os.environ.get("CC") or "cc"


def cpu_threads() -> int | None:
    """GENIE_CPU_THREADS when it is a positive integer: the CPU backend's threads."""
    value = os.environ.get("GENIE_CPU_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def cpu_kernels_enabled() -> bool:
    """GENIE_CPU_KERNELS=0 turns the CPU backend's C kernels off (float32 weights)."""
    return os.environ.get("GENIE_CPU_KERNELS", "1") != "0"


def cuda_compat() -> str | None:
    """GENIE_CUDA_COMPAT (sm87, 8.7): an older GPU's kernel paths on a newer one."""
    return os.environ.get("GENIE_CUDA_COMPAT") or None
