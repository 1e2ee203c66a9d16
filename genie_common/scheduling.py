"""How long the kernel lets a genie process run before another may take its core: its scheduler slice.

Since Linux 6.6 (EEVDF) a thread that wakes on a core running another ordinary thread waits, as a rule, until that
thread's slice ends (the kernel's default grows with the cores: 1.4 ms on a 2-core machine); since 6.12 a thread may
ask for a shorter slice of its own, and one whose slice is shorter than the running thread's takes the core on
waking. The daemon wakes for every message between the clients and the worker, and the CPU backend's worker
computes on every core, so the hops of a request's first token waited for slices to end: `bench/service.py` on 2
cores, the hop to the first token 2.2-2.9 ms with the kernel's slices, 0.66-0.83 ms with these (bench/NOTES.md).
The daemon and the KV store it starts (lookups sit on the first token's path too) ask for the least slice, and so
do the worker's receiving thread and its ZeroMQ I/O thread, which carries every DELTA out; the worker's other
threads, its engine's, take the kernel's default back (a process the daemon starts inherits the daemon's slice), so
they run as long as any other process's. (The BLAS threads NumPy starts on import keep the short slice: they idle,
genie's own threads do its products.) A kernel before 6.12 keeps the request and ignores it; a system without
sched_setattr, or a process under another policy than SCHED_OTHER (set by its unit, say), is left as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("genie.scheduling")

SHORT_SLICE_NS = 100_000  # the least slice the kernel grants
DEFAULT_SLICE = 0  # sched_runtime 0 for SCHED_OTHER: the kernel's own slice

# sched_setattr / sched_getattr by machine (the Linux ABIs genie runs on)
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
# struct sched_attr, its first version (48 bytes; every kernel since 3.14 takes it): size, policy, flags,
# nice, priority, runtime, deadline, period
_ATTR = struct.Struct("IIQiIQQQ")


def latency_sensitive() -> bool:
    """The least slice for this thread, the threads it starts and the processes it spawns."""
    return _set_slice(SHORT_SLICE_NS)


def compute() -> bool:
    """The kernel's own slice for this thread and what it starts (a parent's short one is not inherited)."""
    return _set_slice(DEFAULT_SLICE)


@contextmanager
def latency_sensitive_starts() -> Iterator[None]:
    """Threads started inside (a ZeroMQ context's I/O thread, started with its first socket) get the least
    slice; this thread has the kernel's own again after."""
    latency_sensitive()
    try:
        yield
    finally:
        compute()


def slice_ns(tid: int = 0) -> int | None:
    """The slice the kernel reports for a thread (0: this one); 0 where ordinary threads have none (before 6.12),
    None where it cannot be read."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or not hasattr(os, "sched_getscheduler"):
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if _libc().syscall(numbers[1], tid, buf, _ATTR.size, 0) != 0:
        return None
    return _ATTR.unpack(buf.raw)[5]


def _set_slice(runtime_ns: int) -> bool:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or not hasattr(os, "sched_getscheduler") or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return False
    # the thread's nice value goes back as it is: sched_setattr sets it too
    attr = _ATTR.pack(_ATTR.size, os.SCHED_OTHER, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, runtime_ns, 0, 0)
    if _libc().syscall(numbers[0], 0, ctypes.create_string_buffer(attr), 0) != 0:
        log.info("event=sched_slice_unchanged error=%r", os.strerror(ctypes.get_errno()))
        return False
    return True


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
