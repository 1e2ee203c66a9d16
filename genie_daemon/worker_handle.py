"""One supervised worker process: spawn, liveness from its heartbeats, kill, restart with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

from genie_common.config import DaemonConfig
from genie_protocol.kv_messages import KvSaveCounts
from genie_protocol.messages import worker_identities

log = logging.getLogger("genie.daemon")
WORKER_ERROR = b"genie-worker: error: "  # how the worker's main() says why it could not start (exit code 2)


class WorkerHandle:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.identity: bytes | None = None  # where requests go: its inbound DEALER
        self.identities: tuple[bytes, ...] = ()  # every identity it may speak from
        self.ready = False
        self.info: dict[str, object] = {}
        self.thermal: dict | None = None  # its last heartbeat's {temp_c, throttled}
        self.kv_saves: KvSaveCounts | None = None  # its last heartbeat's: what became of its KV saves
        self.last_seen = 0.0
        self.restarts = 0
        self.last_error: str | None = None  # the reason its last `genie-worker: error:` line gave
        self._relay: asyncio.Task[None] | None = None
        self.served = False  # the current process sent READY (ready is cleared by mark_lost too)
        self.early_exits = 0  # workers in a row that exited before their READY
        self._backoff = config.restart_backoff_s

    async def start(self) -> None:
        self.ready, self.served, self.identity, self.last_error = False, False, None, None
        self.kv_saves = None
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "genie_workers.worker", *self.config.worker_args(), stderr=asyncio.subprocess.PIPE
        )
        assert self.proc.stderr is not None
        self._relay = asyncio.create_task(self._relay_log(self.proc.stderr))
        self.identities = worker_identities(self.proc.pid)
        self.identity = self.identities[0]
        self.last_seen = time.monotonic()  # the load itself sends no heartbeat before HELLO: see is_alive
        log.info("event=worker_start pid=%s", self.proc.pid)

    async def _relay_log(self, stream: asyncio.StreamReader) -> None:
        """The worker's log, line by line, into the daemon's; the reason of a failed load (its last
        `genie-worker: error:` line) kept for `exit_reason`."""
        out = getattr(sys.stderr, "buffer", None)
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the stream's limit: passed on in pieces
                line = await stream.read(1 << 16)
            if not line:
                return
            if line.startswith(WORKER_ERROR):
                self.last_error = line[len(WORKER_ERROR) :].decode("utf-8", "replace").strip()
            if out is not None:
                out.write(line)
                out.flush()
            else:
                sys.stderr.write(line.decode("utf-8", "replace"))

    async def exit_reason(self) -> str:
        """Why the worker that exited did: its own error line, else its exit code."""
        if self._relay is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._relay), 1.0)  # the last lines of its log first
        code = self.proc.returncode if self.proc else None
        return self.last_error or f"it exited with code {code} (see the daemon log)"

    def count_exit(self) -> int:
        """Called once for a worker found exited: how many in a row (this one included) exited before
        their READY, 0 when this one had served."""
        self.early_exits = 0 if self.served else self.early_exits + 1
        return self.early_exits

    def seen(self) -> None:
        self.last_seen = time.monotonic()

    def on_ready(self, info: dict[str, object]) -> None:
        self.ready, self.served, self.info = True, True, info
        self._backoff = self.config.restart_backoff_s
        m = info.get("memory")
        memory = m if isinstance(m, dict) else {}
        log.info(
            "event=worker_ready pid=%s model=%s backend=%s slots=%d ctx=%s memory_mb=%s",
            self.pid,
            info.get("model"),
            info.get("backend"),
            self.capacity,
            info.get("ctx"),
            # its plan: weights + KV + scratch = total of budget
            "+".join(str(memory.get(k)) for k in ("weights_mb", "kv_mb", "scratch_mb"))
            + f"={memory.get('total_mb')}/{memory.get('budget_mb')}",
        )

    @property
    def capacity(self) -> int:
        """Requests the worker runs at once: its READY's `parallel`, one per KV slot. 1 until a worker has
        said (none is sent anything before its READY anyway) or when it says 0."""
        slots = self.info.get("parallel")
        return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 1 else 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_alive(self) -> bool:
        if self.proc is None or self.proc.returncode is not None:
            return False
        # heartbeats start with the I/O thread, after the model loaded; until then only the exit counts (and
        # one that has served is judged by them even once the daemon stopped sending it requests)
        return not self.served or time.monotonic() - self.last_seen < self.config.heartbeat_timeout_s

    def mark_lost(self) -> None:
        """Takes no more requests (it stopped answering, or exited) until a new worker is READY."""
        self.ready, self.identity = False, None

    async def kill(self) -> None:
        # not ready before the first await: a request arriving while the process dies must wait for the
        # next worker, not go to this one and stay "running" for ever
        self.mark_lost()
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def restart(self) -> None:
        await self.kill()
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.config.restart_backoff_max_s)
        self.restarts += 1
        log.warning("event=worker_restart restarts=%d delay_s=%.1f", self.restarts, delay)
        await asyncio.sleep(delay)
        await self.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        self.mark_lost()
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                await self.kill()
