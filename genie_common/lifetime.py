"""Child processes of the daemon (the worker, the KV store) die with it."""

from __future__ import annotations

import ctypes
import signal


def exit_with_parent() -> None:
    """Linux: SIGTERM when the parent dies, so no child of the daemon outlives it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
