"""`GenieClient`: the async client library voice pipelines use.

    async with GenieClient() as client:  # the daemon's default socket; or GenieClient("ipc://...")
        async for ev in client.generate(messages=[{"role": "user", "content": "Lights off?"}]):
            if isinstance(ev, Delta): speak(ev.text)

One DEALER socket; a reader task routes each answer to the request it belongs to. A request that gets no
message for `timeout_s` ends with an ERROR(timeout).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from .codec import decode, encode
from .endpoints import client_endpoint
from .errors import ProtocolError
from .messages import Cancel, Delta, Done, Error, Generate, Health, Message, Prewarm, Reply, Status


class GenieClient:
    def __init__(self, endpoint: str | None = None, timeout_s: float = 60.0) -> None:
        """`endpoint` None: the daemon's default socket, in $XDG_RUNTIME_DIR/genie/ else /run/genie/."""
        self.endpoint = endpoint or client_endpoint()
        self.timeout_s = timeout_s
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)  # ZeroMQ reconnects by itself after a daemon restart
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        self._pending: dict[str, asyncio.Queue[Message]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GenieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader:
            self._reader.cancel()
        self.sock.close()
        self.ctx.term()

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            try:
                msg, _ = decode(frames)
            except ProtocolError:
                continue
            queue = self._pending.get(getattr(msg, "request_id", None) or "")
            if queue is not None:
                queue.put_nowait(msg)

    def _open(self) -> tuple[str, asyncio.Queue[Message]]:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())
        rid = f"{self._prefix}{next(self._ids)}"
        self._pending[rid] = asyncio.Queue()
        return rid, self._pending[rid]

    async def _next(self, rid: str, queue: asyncio.Queue[Message]) -> Message:
        if not queue.empty():  # already here (a stream's tokens come faster than they are read): no waiting
            return queue.get_nowait()
        try:
            async with asyncio.timeout(self.timeout_s):  # (wait_for would run the wait as a task of its own)
                return await queue.get()
        except TimeoutError:
            return Error(request_id=rid, code="timeout", message=f"no answer within {self.timeout_s} s")

    async def generate(self, *, request_id: str | None = None, **fields: Any) -> AsyncIterator[Delta | Done | Error]:
        """Streams DELTA events and ends with DONE or ERROR. Fields as GENERATE's (messages, prompt,
        token_ids, params, conv_id, priority, think)."""
        rid, queue = self._open()
        if request_id:
            self._pending[request_id] = self._pending.pop(rid)
            rid = request_id
        try:
            await self.sock.send_multipart(encode(Generate(request_id=rid, **fields)))
            while True:
                msg = await self._next(rid, queue)
                if isinstance(msg, (Delta, Done, Error)):
                    yield msg
                if isinstance(msg, (Done, Error)):
                    return
        finally:
            self._pending.pop(rid, None)

    async def cancel(self, request_id: str) -> None:
        await self.sock.send_multipart(encode(Cancel(request_id=request_id)))

    async def prewarm(self, **fields: Any) -> Message:
        rid, queue = self._open()
        try:
            await self.sock.send_multipart(encode(Prewarm(request_id=rid, **fields)))
            return await self._next(rid, queue)
        finally:
            self._pending.pop(rid, None)

    async def status(self, health: bool = False) -> Reply | Error:
        rid, queue = self._open()
        try:
            await self.sock.send_multipart(encode((Health if health else Status)(request_id=rid)))
            msg = await self._next(rid, queue)
            return msg if isinstance(msg, (Reply, Error)) else Error(request_id=rid, code="bad_reply", message=str(msg))
        finally:
            self._pending.pop(rid, None)
