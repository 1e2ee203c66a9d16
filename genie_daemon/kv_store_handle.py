"""The supervised KV-store process, and the daemon's admin line to it.

The store needs no handshake: it serves as soon as its socket is bound, and the daemon only asks it
admin questions (KV_LIST, KV_EVICT, KV_CLEAR, METRICS) on behalf of `genie-ctl`. If it exits, it is
restarted with backoff; the worker's lookups meanwhile time out and turns run cold. One that stops
answering (`watch`) is killed and restarted the same way. The backoff doubles
while the store keeps crashing and starts again from the first delay once it has run STABLE_AFTER_S.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import Error, Message

log = logging.getLogger("genie.daemon")
ADMIN_TIMEOUT_S = 2.0
# a store up this long before it exits ran stably: its restart waits the first delay again. It has no READY
# (the worker's backoff resets on READY), so uptime tells; without a reset every crash after the fifth cost
# 10 s of turns without saves or lookups, however long the run before it (issue 21 item 6)
STABLE_AFTER_S = 60.0


class KvStoreHandle:
    def __init__(
        self,
        config: DaemonConfig,
        ctx: zmq.asyncio.Context,
        stable_after_s: float = STABLE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`clock` and `sleep` are time as the backoff sees it (a test gives its own)."""
        self.config = config
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stable_after_s = stable_after_s
        self._clock = clock
        self._sleep = sleep
        self._backoff = config.restart_backoff_s
        self._started_at = clock()
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
        self._sock.setsockopt(zmq.IMMEDIATE, 1)  # a call the store is not there to take fails now, not later
        self._sock.connect(config.kv_endpoint)
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._hurried = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "genie_kvstore", *self.config.kv_store_args()
        )
        self._started_at = self._clock()
        log.info("event=kv_store_start pid=%s dir=%s", self.proc.pid, self.config.kv_cache_dir)

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def restart(self) -> None:
        code = self.proc.returncode if self.proc else None
        uptime_s = self._clock() - self._started_at
        if uptime_s >= self.stable_after_s:
            self._backoff = self.config.restart_backoff_s
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.config.restart_backoff_max_s)
        self.restarts += 1
        log.error(
            "event=kv_store_lost returncode=%s restarts=%d uptime_s=%.1f delay_s=%.1f",
            code,
            self.restarts,
            uptime_s,
            delay,
        )
        waits = [asyncio.ensure_future(self._sleep(delay)), asyncio.ensure_future(self._hurried.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:  # (also when this restart is cancelled: neither wait is left behind)
            for w in waits:
                w.cancel()
        await self.start()

    def hurry(self) -> None:
        """A restart waiting out its backoff starts the store now, and so will every later one (the daemon
        is stopping: the saves the worker kept for the store still reach it)."""
        self._hurried.set()

    async def watch(self, timeout_s: float) -> None:
        """Runs until cancelled: asks the store a question every third of `timeout_s` and kills one that
        answers none for `timeout_s` (stuck: a FIFO in the directory, a hung disk), for the supervisor to
        restart it as it restarts one that exited. Without this a stuck store cost every turn its lookup
        timeout and lost every save, unnoticed."""
        from genie_protocol.messages import Metrics

        interval = timeout_s / 3
        silent_since: float | None = None
        while True:
            await self._sleep(interval)
            if not self.is_alive():
                silent_since = None
                continue
            reply = await self.call(Metrics(request_id="watch"), timeout_s=interval)
            if not (isinstance(reply, Error) and reply.code == "kv_unavailable"):
                silent_since = None
                continue
            now = self._clock()
            silent_since = silent_since if silent_since is not None else now - interval
            if now - silent_since >= timeout_s and self.proc is not None:
                log.error("event=kv_store_unresponsive pid=%s silent_s=%.1f", self.proc.pid, now - silent_since)
                self.proc.kill()
                await self.proc.wait()
                silent_since = None

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._sock.close()

    async def call(self, msg: Message, timeout_s: float = ADMIN_TIMEOUT_S) -> Message:
        """Forwards an admin call under a fresh request id; the answer, or an ERROR naming the problem."""
        rid = getattr(msg, "request_id", None)
        async with self._lock:  # one call at a time: answers arrive in order
            body = msg.body()
            inner = f"d{next(self._ids)}"
            body["request_id"] = inner
            try:
                await self._sock.send_multipart(encode(type(msg).from_body(body)), flags=zmq.NOBLOCK)
            except zmq.Again:
                return Error(request_id=rid, code="kv_unavailable", message="the KV store is not running")
            try:
                while True:
                    frames = await asyncio.wait_for(self._sock.recv_multipart(), timeout_s)
                    reply, _ = decode(frames)
                    if getattr(reply, "request_id", None) == inner:
                        break
            except TimeoutError:
                return Error(request_id=rid, code="kv_unavailable", message="the KV store did not answer")
            except ProtocolError as e:
                return Error(request_id=rid, code="internal", message=f"bad answer from the KV store: {e.message}")
        out = reply.body()
        out["request_id"] = rid
        return type(reply).from_body(out)
