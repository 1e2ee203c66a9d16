"""Backends side by side behind one interface; `auto` picks the best one present."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import GenieError
from .base import Backend
from .numpy_backend import NumpyBackend

BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": NumpyBackend}
BACKEND_CHOICES = ("auto", *BACKENDS)


def select_backend(name: str) -> Backend:
    if name == "auto":
        return NumpyBackend()
    factory = BACKENDS.get(name)
    if factory is None:
        raise GenieError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_CHOICES)})")
    return factory()


__all__ = ["BACKENDS", "BACKEND_CHOICES", "Backend", "select_backend"]
