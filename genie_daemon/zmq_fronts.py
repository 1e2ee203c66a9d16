"""The daemon's two ZeroMQ fronts, as http_server.py is its HTTP one: the client socket (GENERATE, PREWARM
and CANCEL from voice pipelines and GenieClient, STATUS and HEALTH) and genie-ctl's admin socket (STATUS,
HEALTH, METRICS, LOAD, UNLOAD, the KV store's calls, PULL). Each decodes a frame, answers a malformed one
with ERROR, and hands the rest to the daemon (server.py), which owns the sockets, through the narrow interface
below (ZmqService): the fronts import nothing of the daemon's."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any, Protocol

import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import (
    Cancel,
    Error,
    Generate,
    Health,
    KvClear,
    KvEvict,
    KvList,
    Load,
    Message,
    Metrics,
    Prewarm,
    Pull,
    Reply,
    Status,
    Stop,
    Unload,
)

from .kv_store_handle import KvStoreHandle
from .metrics import DaemonMetrics
from .model_store import ModelStore

log = logging.getLogger("genie.daemon")


class ZmqService(Protocol):
    """What the ZeroMQ fronts need from the daemon: requests in and out, its state, the KV store and the
    models directory it owns, and the admin calls that load, unload and stop."""

    config: DaemonConfig
    metrics: DaemonMetrics
    kv: KvStoreHandle | None
    store: ModelStore

    async def submit(self, owner: Hashable, reply: Any, msg: Generate | Prewarm, model: str | None = None) -> None: ...
    async def cancel(self, owner: Hashable, rid: str) -> None: ...
    def status(self) -> dict[str, Any]: ...
    async def kv_metrics(self) -> dict[str, Any]: ...
    def is_current(self, model: str) -> bool: ...
    def load(self, model: str) -> None: ...
    async def unload(self, only_if_idle: bool = False) -> None: ...
    def stop(self, reason: str) -> None: ...


def _unsupported(msg: Message) -> Error:
    rid = getattr(msg, "request_id", None)
    return Error(request_id=rid, code="unsupported", message=f"{type(msg).__name__.upper()} is not served yet")


class ZmqFronts:
    def __init__(self, daemon: ZmqService, clients: zmq.asyncio.Socket, admin: zmq.asyncio.Socket) -> None:
        self.daemon = daemon
        self.clients = clients
        self.admin = admin
        # what each message type is answered by, per socket (anything else: ERROR unsupported)
        self._client_handlers: dict[type[Message], Callable[[bytes, Any], Awaitable[None]]] = {
            Generate: self._submit,
            Prewarm: self._submit,
            Cancel: self._cancel,
            Status: self._client_status,
            Health: self._client_status,
        }
        self._admin_handlers: dict[type[Message], Callable[[Any], Awaitable[Message]]] = {
            Health: self._health,
            Status: self._status,
            Metrics: self._status,
            KvList: self._kv,
            KvEvict: self._kv,
            KvClear: self._kv,
            Load: self._load,
            Unload: self._unload,
            Stop: self._stop,
        }

    # -- clients ------------------------------------------------------------------------------------------
    async def to_client(self, client: bytes, msg: Message) -> None:
        await self.clients.send_multipart([client, *encode(msg)])

    async def client_loop(self) -> None:
        while True:
            client, *frames = await self.clients.recv_multipart(copy=False)
            identity = client.bytes
            try:
                msg, _ = decode([f.buffer for f in frames])
            except ProtocolError as e:
                await self.to_client(identity, Error(request_id=e.request_id, code=e.code, message=e.message))
                continue
            try:
                await self.on_client(identity, msg)
            except Exception as e:  # a bug met by one message: it is answered, and the loop goes on
                log.exception("event=client_message_failed type=%s", type(msg).__name__)
                rid = getattr(msg, "request_id", None)
                await self.to_client(
                    identity, Error(request_id=rid, code="internal", message=f"{type(e).__name__}: {e}"[:4096])
                )

    async def on_client(self, client: bytes, msg: Message) -> None:
        handler = self._client_handlers.get(type(msg))
        if handler is None:
            await self.to_client(client, _unsupported(msg))
        else:
            await handler(client, msg)

    async def _submit(self, client: bytes, msg: Generate | Prewarm) -> None:
        await self.daemon.submit(client, partial(self.to_client, client), msg)

    async def _cancel(self, client: bytes, msg: Cancel) -> None:
        await self.daemon.cancel(client, msg.request_id)

    async def _client_status(self, client: bytes, msg: Status | Health) -> None:
        await self.to_client(client, Reply(request_id=msg.request_id, data=self.daemon.status()))

    # -- genie-ctl ----------------------------------------------------------------------------------------
    async def to_admin(self, peer: bytes, msg: Message) -> None:
        await self.admin.send_multipart([peer, *encode(msg)])

    async def admin_loop(self) -> None:
        while True:
            peer, *frames = await self.admin.recv_multipart(copy=False)
            try:
                msg, _ = decode([f.buffer for f in frames])
            except ProtocolError as e:
                reply: Message = Error(request_id=e.request_id, code=e.code, message=e.message)
            else:
                if isinstance(msg, (Pull, Cancel)):  # answered as the pull goes, by its own task
                    self.daemon.store.on_admin(peer.bytes, msg, self.to_admin)
                    continue
                try:
                    reply = await self.on_admin(msg)
                except Exception as e:  # a bug met by one call: it is answered, and the loop goes on
                    log.exception("event=admin_call_failed type=%s", type(msg).__name__)
                    rid = getattr(msg, "request_id", None)
                    reply = Error(request_id=rid, code="internal", message=f"{type(e).__name__}: {e}"[:4096])
            await self.to_admin(peer.bytes, reply)

    async def on_admin(self, msg: Message) -> Message:
        handler = self._admin_handlers.get(type(msg))
        return _unsupported(msg) if handler is None else await handler(msg)

    async def _health(self, msg: Health) -> Message:
        return Reply(request_id=msg.request_id, data=self.daemon.status())

    async def _status(self, msg: Status | Metrics) -> Message:
        d = self.daemon
        state = {**d.status(), "kv": await d.kv_metrics()}
        data = d.metrics.counters(state) if isinstance(msg, Metrics) else state  # METRICS: /metrics' figures
        return Reply(request_id=msg.request_id, data=data)

    async def _kv(self, msg: KvList | KvEvict | KvClear) -> Message:
        if self.daemon.kv is None:
            message = "the KV store is off (kv_store = false)"
            return Error(request_id=msg.request_id, code="kv_disabled", message=message)
        return await self.daemon.kv.call(msg)

    async def _load(self, msg: Load) -> Message:  # answered at once; `genie-ctl load` then watches STATUS
        d = self.daemon
        problem = await asyncio.to_thread(d.store.why_not_loadable, msg.model, d.config.auto_pull)
        if problem:  # the served model stays
            return Error(request_id=msg.request_id, code="bad_model", message=problem[:4096])
        if not d.is_current(msg.model):  # the model served or loading already: nothing to restart
            d.load(msg.model)
        return Reply(request_id=msg.request_id, data={"loading": msg.model})

    async def _stop(self, msg: Stop) -> Message:  # the REPLY leaves before the sockets close (drain first)
        self.daemon.stop("genie-ctl stop")
        return Reply(request_id=msg.request_id, data={"stopping": os.getpid()})

    async def _unload(self, msg: Unload) -> Message:
        await self.daemon.unload()
        return Reply(request_id=msg.request_id, data={"unloading": self.daemon.config.model})
