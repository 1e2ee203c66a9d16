"""Backends side by side behind one interface; `auto` picks the best one present."""

from __future__ import annotations

from collections.abc import Callable

from genie_common.errors import GenieError

from .base import Backend
from .numpy_backend import NumpyBackend


def _cupy() -> Backend:
    from .cupy import CupyBackend, cupy_available

    if not cupy_available():
        raise GenieError("the cupy backend needs CuPy and an NVIDIA GPU (pip install 'genie[gpu]')")
    try:
        return CupyBackend()
    except Exception as e:  # CUDA kernels that fail to compile or load on this driver
        raise GenieError(f"the cupy backend could not start: {type(e).__name__}: {e}") from None


BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": NumpyBackend, "cupy": _cupy}
BACKEND_CHOICES = ("auto", *BACKENDS)


def select_backend(name: str) -> Backend:
    """`auto` is CuPy when it finds a GPU, else NumPy."""
    if name == "auto":
        from .cupy import cupy_available

        return _cupy() if cupy_available() else NumpyBackend()
    factory = BACKENDS.get(name)
    if factory is None:
        raise GenieError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_CHOICES)})")
    return factory()


__all__ = ["BACKENDS", "BACKEND_CHOICES", "Backend", "select_backend"]
