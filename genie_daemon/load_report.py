"""Ollama's `load_duration`: the worker's load time, reported once per load.

Ollama loads a model on the request that needs it and reports the load on that reply; later replies
spend nothing loading. genie loads at start and on LOAD or after an unload, so the first reply after each
load of a worker (a new worker pid: a start, a restart, a reload) carries the worker's load time (READY's
`load_ms`), later ones 0.
"""

from __future__ import annotations

from typing import Any

NS_PER_MS = 1_000_000


class LoadReport:
    def __init__(self) -> None:
        self._reported_pid: Any = None  # the worker whose load was last reported

    def take_ns(self, status: dict[str, Any]) -> int:
        """The load time in ns if the serving worker's load was not reported yet, else 0."""
        pid, load_ms = status.get("worker_pid"), status.get("load_ms")
        if pid is None or not isinstance(load_ms, (int, float)) or pid == self._reported_pid:
            return 0
        self._reported_pid = pid
        return int(load_ms * NS_PER_MS)
