"""The KV-store process: one ROUTER socket, requests served one at a time.

Workers send KV_SAVE at the end of a turn (KV in raw side frames; answered by KV_SAVED once the entry is
durable) and KV_LOOKUP at the start of one (answered by KV_DATA, with the KV of the longest saved prefix
or n_tokens 0). The daemon sends KV_LIST, KV_EVICT, KV_CLEAR and METRICS for `genie-ctl`. A bad request
gets an ERROR and the loop goes on; so does a failed disk write (the save is lost, the store is not: METRICS
counts it, and says what the last error was).

    python -m genie_kvstore --endpoint ipc:///run/genie/kv.sock --dir ~/.cache/genie/kv [--max-mb 1024]
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from genie_common import heap
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.kv_messages import KvData, KvLookup, KvSave, KvSaved
from genie_protocol.messages import Error, KvClear, KvEvict, KvList, Message, Metrics, Reply, Status

from .cache_dir import CacheDir
from .format import KVLayout
from .store import KVStore, NotSaved, StoreConfig, StoreMetrics
from .wire import layout_from_body, snapshot_frames, snapshot_from_frames

log = logging.getLogger("genie.kvstore")

POLL_MS = 200  # only for noticing SIGTERM: idle, the store wakes five times a second
DRAIN_S = 2.0  # on SIGTERM, how long the store goes on serving what already arrived (the last turn's save)


@dataclass(frozen=True)
class ServerConfig:
    endpoint: str
    store: StoreConfig
    max_message_bytes: int = 1 << 31  # one save's KV frames: Gemma 270M, 2 000 tokens INT8 = 19 MB


class KVStoreServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.files = CacheDir(config.store.directory)  # made private before any store writes there
        self.stores: dict[tuple[bytes, KVLayout], KVStore] = {}
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
        self.sock.bind(config.endpoint)
        if config.endpoint.startswith("ipc://"):  # saved KV is the conversations' text: the daemon's user only
            os.chmod(config.endpoint[len("ipc://") :], 0o600)
        self.stopping = False
        self._worked = False  # a save or lookup was served since the heap was last given back
        self.last_error: str | None = None  # the disk's last refusal (a save, a lookup), for STATUS's kv
        # what each request type is answered by (anything else: ERROR unsupported)
        self._handlers: dict[type[Message], Callable[[Any, list], tuple[Message, list[memoryview]]]] = {
            KvSave: self._save,
            KvLookup: self._lookup,
            KvList: self._list,
            KvEvict: self._evict,
            KvClear: self._clear,
            Metrics: self._metrics,
            Status: self._metrics,
        }

    def _store(self, fingerprint_hex: str, layout: KVLayout) -> KVStore:
        key = (bytes.fromhex(fingerprint_hex), layout)
        if key not in self.stores:
            self.stores[key] = KVStore(self.config.store, key[0], layout, self.files)
        return self.stores[key]

    def serve(self) -> int:
        log.info("event=kv_listening endpoint=%s dir=%s", self.config.endpoint, self.config.store.directory)
        try:
            while not self.stopping:
                if self.sock.poll(POLL_MS):
                    self._serve_one()
                elif self._worked:  # idle after saves or lookups: the memory their frames took goes back
                    heap.give_back()
                    self._worked = False
            # what arrived before SIGTERM is still served: the daemon stops the worker first, whose last
            # save may be waiting here
            deadline = time.monotonic() + DRAIN_S
            while time.monotonic() < deadline and self.sock.poll(0):
                self._serve_one()
            return 0
        finally:
            self.sock.close()
            self.ctx.term()

    def _serve_one(self) -> None:
        peer, *frames = self.sock.recv_multipart(copy=False)
        reply, side = self.handle([f.buffer for f in frames])
        self.sock.send_multipart([peer.bytes, *encode(reply, side)], copy=False)

    def handle(self, frames: list[memoryview]) -> tuple[Message, list[memoryview]]:
        try:
            msg, side = decode(frames)
        except ProtocolError as e:  # logged here too: the sender may be a worker that cannot tell anyone
            log.warning("event=kv_refused request=%s code=%s message=%r", e.request_id, e.code, e.message)
            return Error(request_id=e.request_id, code=e.code, message=e.message), []
        rid = getattr(msg, "request_id", None)
        try:
            return self._dispatch(msg, side)
        except ValueError as e:  # the request's fault: a bad conv id, frames that do not fit the layout
            log.warning("event=kv_refused request=%s code=bad_request message=%r", rid, str(e))
            return Error(request_id=rid, code="bad_request", message=str(e)), []
        except OSError as e:  # the disk's: full, read-only, gone
            log.error("event=kv_io_error request=%s error=%r", rid, e)
            self.last_error = f"{type(e).__name__}: {e}"
            return Error(request_id=rid, code="kv_io", message=self.last_error), []

    def _dispatch(self, msg: Message, side: list) -> tuple[Message, list[memoryview]]:
        handler = self._handlers.get(type(msg))
        if handler is None:
            name = type(msg).__name__.upper()
            rid = getattr(msg, "request_id", None)
            return Error(request_id=rid, code="unsupported", message=f"{name} is not for the KV store"), []
        return handler(msg, side)

    def _save(self, msg: KvSave, side: list) -> tuple[Message, list[memoryview]]:
        self._worked = True
        layout = layout_from_body(msg.layout)
        snapshot = snapshot_from_frames(layout, msg.token_ids, side)
        saved = self._store(msg.fingerprint, layout).save(snapshot, msg.conv_id or "")
        if isinstance(saved, NotSaved):
            if saved.code != "kv_too_large":  # (a skip, not an error)
                self.last_error = saved.message
            return Error(request_id=msg.request_id, code=saved.code, message=saved.message), []
        return KvSaved(request_id=msg.request_id, bytes=saved.bytes), []

    def _lookup(self, msg: KvLookup, side: list) -> tuple[Message, list[memoryview]]:
        self._worked = True
        layout = layout_from_body(msg.layout)
        store = self._store(msg.fingerprint, layout)
        snap = store.hydrate(msg.token_ids, msg.conv_id or "", longer_than=msg.longer_than)
        if snap is None:
            return KvData(request_id=msg.request_id, n_tokens=0), []
        return KvData(request_id=msg.request_id, n_tokens=snap.n_tokens), snapshot_frames(snap)

    def _list(self, msg: KvList, side: list) -> tuple[Message, list[memoryview]]:
        return Reply(request_id=msg.request_id, data={"entries": self.files.list_entries()}), []

    def _evict(self, msg: KvEvict, side: list) -> tuple[Message, list[memoryview]]:
        return Reply(request_id=msg.request_id, data={"evicted": self.files.evict(msg.entry_id)}), []

    def _clear(self, msg: KvClear, side: list) -> tuple[Message, list[memoryview]]:
        return Reply(request_id=msg.request_id, data={"cleared": self.files.clear()}), []

    def _metrics(self, msg: Metrics | Status, side: list) -> tuple[Message, list[memoryview]]:
        return Reply(request_id=msg.request_id, data=self.metrics()), []

    def metrics(self) -> dict[str, object]:
        total = StoreMetrics()
        for store in self.stores.values():
            for k, v in store.metrics.as_dict().items():
                setattr(total, k, getattr(total, k) + v)
        # no header read: STATUS is polled, and reading every header would hold up the worker's lookups
        sizes = [f.stat.st_size for f in self.files.entry_files()]
        cap = self.config.store.max_bytes
        counts = {**total.as_dict(), "entries": len(sizes), "bytes": sum(sizes), "max_bytes": cap}
        return {**counts, "last_error": self.last_error}


def serve(config: ServerConfig) -> int:
    server = KVStoreServer(config)
    return server.serve()


__all__ = ["KVStoreServer", "ServerConfig", "Path"]
