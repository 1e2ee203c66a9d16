"""One `pull` (genie_common/models/pull.py) run for the daemon: in a thread of its own, its progress relayed to the
event loop as an async stream, and cancelled when whoever reads the stream goes away.

The thread is a daemon thread, not the loop's executor: asyncio.run waits for its executor's threads at
exit, and a download stalled on the network would hold the daemon's SIGTERM up for as long as it stalls.
Progress comes faster than an HTTP client may read it (a callback per chunk of a local copy): successive
"downloading" lines of one digest are merged, so the queue never holds more than the statuses themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from functools import partial

from genie_common.errors import GenieError, PullError
from genie_common.models.local import LocalModel, ModelsDir
from genie_common.models.pull import PullProgress, pull

DOWNLOADING = "downloading"


class PullRelay:
    def __init__(self, source: str, models: ModelsDir, name: str | None = None) -> None:
        self.source, self.models, self.name = source, models, name
        self.cancelled = threading.Event()
        self._pending: deque[PullProgress] = deque()
        self._wake = asyncio.Event()
        self._result: LocalModel | BaseException | None = None
        self._loop = asyncio.get_running_loop()

    def cancel(self) -> None:
        self.cancelled.set()

    async def events(self, keepalive_s: float | None = None) -> AsyncIterator[PullProgress | LocalModel]:
        """The pull's progress, then the model it added; PullError when it failed. With `keepalive_s`, the
        last progress again whenever none came for that long (a stalled download still says it lives).
        Leaving the iteration early (a client gone, a handler cancelled) cancels the pull."""
        thread = threading.Thread(target=self._run, name=f"pull {self.source}"[:60], daemon=True)
        thread.start()
        last: PullProgress | None = None
        try:
            while True:
                while self._pending:
                    last = self._pending.popleft()
                    yield last
                if self._result is not None:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), keepalive_s)
                except TimeoutError:
                    if last is not None:
                        yield last
            if isinstance(self._result, BaseException):
                raise self._result
            yield self._result
        finally:
            self.cancel()  # a no-op once it ended; else the thread stops at its next chunk

    def _run(self) -> None:
        try:
            result: LocalModel | BaseException = pull(
                self.source, self.models, progress=self._progress, name=self.name, cancel=self.cancelled.is_set
            )
        except GenieError as e:  # the pull's own refusals; anything else is a bug, passed on whole
            result = e if isinstance(e, PullError) else PullError(str(e))
        except Exception as e:
            result = e
        self._deliver(partial(self._finish, result))

    def _finish(self, result: LocalModel | BaseException) -> None:
        self._result = result

    def _progress(self, p: PullProgress) -> None:
        self._deliver(partial(self._queue, p))

    def _queue(self, p: PullProgress) -> None:
        if p.status == DOWNLOADING and self._pending:
            last = self._pending[-1]
            if last.status == DOWNLOADING and last.digest == p.digest:
                self._pending[-1] = p
                return
        self._pending.append(p)

    def _deliver(self, change: Callable[[], None]) -> None:
        """Runs `change` on the loop's thread (where the stream reads) and wakes the reader."""

        def apply() -> None:
            change()
            self._wake.set()

        with contextlib.suppress(RuntimeError):  # the loop closed: the daemon is gone, and nobody reads
            self._loop.call_soon_threadsafe(apply)
