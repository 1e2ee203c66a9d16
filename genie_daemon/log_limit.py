"""The daemon's log under a flood: at most one line a second of each kind, then a line counting the rest.

A kind is a logger, a level and a format string (`event=http_bad_request remote=%r ...`), whatever its
arguments: 5 000 malformed HTTP requests wrote 1 535 lines of one kind (issue 34 item 18). The first
record of a kind in each interval passes; the others are counted, and the count is written as
`event=log_suppressed kind=… count=N logger=…` (at their level) before the next record of that kind that
passes, or before any later record once the interval has ended, or when the daemon exits (`flush`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

INTERVAL_S = 1.0
SUMMARY = "event=log_suppressed kind=%r count=%d logger=%s"


@dataclass
class _Window:
    start: float
    name: str  # the logger's
    level: int
    label: str  # the format's first word (`event=…`), which names the kind in the summary
    suppressed: int = 0


class RepeatLimit(logging.Filter):
    """A filter for `handler` (the daemon's stderr) that passes one record of each kind per `interval_s`
    and writes the counts of the others through it."""

    def __init__(
        self, handler: logging.Handler, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.handler = handler
        self.interval_s = interval_s
        self.clock = clock
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()  # records come from the loop and from threads (model reads, pulls)
        self._summaries = threading.local()  # set while this filter writes a count: that record passes

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self._summaries, "writing", False):
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is not None and now - window.start < self.interval_s:
                window.suppressed += 1
                return False
            ended = self._take_ended(now)
            self._windows[kind] = _Window(now, record.name, record.levelno, str(record.msg).split(" ", 1)[0])
        self._write(ended)
        return True

    def flush(self) -> None:
        """Writes every count not written yet (the daemon's exit)."""
        with self._lock:
            ended = [w for w in self._windows.values() if w.suppressed]
            self._windows.clear()
        self._write(ended)

    def _take_ended(self, now: float) -> list[_Window]:
        """Removes the windows whose interval has ended; those that suppressed something, to be counted."""
        ended = [k for k, w in self._windows.items() if now - w.start >= self.interval_s]
        return [w for w in (self._windows.pop(k) for k in ended) if w.suppressed]

    def _write(self, windows: list[_Window]) -> None:
        self._summaries.writing = True
        try:
            for w in windows:
                args = (w.label, w.suppressed, w.name)
                self.handler.handle(logging.LogRecord(w.name, w.level, __file__, 0, SUMMARY, args, None))
        finally:
            self._summaries.writing = False


@contextmanager
def limited(handlers: list[logging.Handler]) -> Iterator[list[RepeatLimit]]:
    """A RepeatLimit on each of `handlers` (the root logger's, once logging is set up) while the block runs;
    then the counts not written yet are, and the handlers are left as they were (main() run in process, as
    tests do, left its filters on pytest's own handlers, which then dropped other tests' repeated lines)."""
    limits = [RepeatLimit(handler) for handler in handlers]
    for limit in limits:
        limit.handler.addFilter(limit)
    try:
        yield limits
    finally:
        for limit in limits:
            limit.flush()
            limit.handler.removeFilter(limit)
