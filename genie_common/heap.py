"""Freed heap memory given back to the system when a process goes idle.

glibc keeps what a process frees for its next allocations: after a burst of requests of every size (prompts
of many lengths, KV saves of many sizes) the worker and the KV store went on holding the peak's free blocks,
idle, for good (issue 34 item 13). `malloc_trim(0)` returns the free pages of every arena; the processes
call it once when they go idle after work, never in a step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _trim() -> Callable[[], None] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


_TRIM = _trim()


def give_back() -> None:
    """Returns the heap's free pages to the system (a no-op where the C library has no malloc_trim)."""
    if _TRIM is not None:
        _TRIM()
