"""How `genie pull` shows a pull: a bar with bytes and rate on a terminal, a line per step otherwise
(a log or a pipe gets no carriage returns)."""

from __future__ import annotations

import time
from typing import TextIO

from .pull import PullProgress

BAR_WIDTH = 30


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class ProgressBar:
    """A `progress` callback for `pull` writing to `stream` (stderr)."""

    def __init__(self, stream: TextIO, is_tty: bool) -> None:
        self.stream = stream
        self.is_tty = is_tty
        self._status: str | None = None
        self._started_at = 0.0
        self._started_bytes = 0  # a resumed download's rate counts only this run's bytes
        self._bar_shown = False

    def __call__(self, p: PullProgress) -> None:
        if p.status == "downloading" and p.completed is not None:
            if self._status != "downloading":
                self._started_at, self._started_bytes = time.monotonic(), p.completed
                resumed = f", resuming at {_mb(p.completed)}" if p.completed else ""
                size = _mb(p.total) if p.total is not None else "size unknown"
                self._line(f"downloading ({size}{resumed})" if not self.is_tty else None)
                self._status = p.status
            if self.is_tty:
                self._bar(p.completed, p.total)
            return
        if self._bar_shown:
            self.stream.write("\n")
            self._bar_shown = False
        if p.status != self._status:
            self._status = p.status
            self._line(p.status)

    def _line(self, text: str | None) -> None:
        if text is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _bar(self, completed: int, total: int | None) -> None:
        elapsed_s = time.monotonic() - self._started_at
        rate = (completed - self._started_bytes) / elapsed_s if elapsed_s > 0 else 0.0
        if total:
            filled = BAR_WIDTH * completed // total
            bar = "█" * filled + "░" * (BAR_WIDTH - filled)
            text = f"\rdownloading {completed * 100 // total:3d}% {bar} {_mb(completed)} / {_mb(total)}"
        else:
            text = f"\rdownloading {_mb(completed)}"
        self.stream.write(f"{text}  {rate / 1e6:.1f} MB/s\033[K")
        self.stream.flush()
        self._bar_shown = True
