"""The daemon's two ZeroMQ fronts, as http_server.py is its HTTP one: the client socket (GENERATE, PREWARM
and CANCEL from voice pipelines and GenieClient, STATUS and HEALTH) and genie-ctl's admin socket (STATUS,
HEALTH, METRICS, LOAD, UNLOAD, the KV store's calls, PULL). Each decodes a frame, answers a malformed one
with ERROR, and hands the rest to the daemon (server.py), which owns the sockets."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import zmq.asyncio

from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.messages import (
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
    Unload,
)

if TYPE_CHECKING:
    from .server import Daemon


def _unsupported(msg: Message) -> Error:
    rid = getattr(msg, "request_id", None)
    return Error(request_id=rid, code="unsupported", message=f"{type(msg).__name__.upper()} is not served yet")


class ZmqFronts:
    def __init__(self, daemon: Daemon, clients: zmq.asyncio.Socket, admin: zmq.asyncio.Socket) -> None:
        self.daemon = daemon
        self.clients = clients
        self.admin = admin

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
            await self.on_client(identity, msg)

    async def on_client(self, client: bytes, msg: Message) -> None:
        d = self.daemon
        if isinstance(msg, (Generate, Prewarm)):
            await d.submit(client, partial(self.to_client, client), msg)
        elif isinstance(msg, Cancel):
            await d.cancel(client, msg.request_id)
        elif isinstance(msg, (Status, Health)):
            await self.to_client(client, Reply(request_id=msg.request_id, data=d.status()))
        else:
            await self.to_client(client, _unsupported(msg))

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
                reply = await self.on_admin(msg)
            await self.to_admin(peer.bytes, reply)

    async def on_admin(self, msg: Message) -> Message:
        d = self.daemon
        if isinstance(msg, Health):
            return Reply(request_id=msg.request_id, data=d.status())
        if isinstance(msg, (Status, Metrics)):
            state = {**d.status(), "kv": await d.kv_metrics()}
            data = d.metrics.counters(state) if isinstance(msg, Metrics) else state  # METRICS: /metrics' figures
            return Reply(request_id=msg.request_id, data=data)
        if isinstance(msg, (KvList, KvEvict, KvClear)):
            if d.kv is None:
                message = "the KV store is off (kv_store = false)"
                return Error(request_id=msg.request_id, code="kv_disabled", message=message)
            return await d.kv.call(msg)
        if isinstance(msg, Load):  # answered at once; `genie-ctl load` then watches STATUS until ready
            d.load(msg.model)
            return Reply(request_id=msg.request_id, data={"loading": msg.model})
        if isinstance(msg, Unload):
            await d.unload()
            return Reply(request_id=msg.request_id, data={"unloading": d.config.model})
        return _unsupported(msg)
