"""Freed heap memory given back to the system when a process goes idle.

glibc keeps what a process frees for its next allocations: after a burst of requests of every size (prompts
of many lengths, KV saves of many sizes) the worker and the KV store went on holding the peak's free blocks,
idle, for good (issue 34 item 13). `malloc_trim(0)` returns the free pages of every arena; the processes
call it once when they go idle after work, never in a step. The KV store also keeps its large blocks out of
the heap (`map_large_blocks`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _libc_function(name: str, argtypes: list[type]) -> Callable[..., int] | None:
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), name)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune this way
        return None
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


_TRIM = _libc_function("malloc_trim", [ctypes.c_size_t])
_MALLOPT = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])


def give_back() -> None:
    """Returns the heap's free pages to the system (a no-op where the C library has no malloc_trim)."""
    if _TRIM is not None:
        _TRIM(0)


def map_large_blocks(threshold_bytes: int = 128 << 10) -> None:
    """Blocks of `threshold_bytes` or more are mapped for themselves and unmapped when freed, from now on.

    glibc starts so, but raises the threshold to the largest block freed so far (up to 32 MB): in the KV
    store, whose every save arrives as a frame of megabytes, from its first save on the frames came from
    the heap, and live blocks left between them kept 5-6 MB more than before a load, idle, after the trim
    (issue 34 item 13: 40 -> 46 MB). Setting the threshold fixes it where it is. Not for the worker: its
    steps' temporaries of this size would each cost a mapping."""
    if _MALLOPT is not None:
        _MALLOPT(M_MMAP_THRESHOLD, threshold_bytes)
