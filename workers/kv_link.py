"""The worker's link to the KV-store process: at turn start a lookup, from the engine thread (waits at most
`timeout_s`, then the turn goes on cold); at turn end a save, never waited for. The engine thread only gathers
the slot's rows into a buffer of their own on the device (behind the step that wrote them, ahead of any that
overwrites them) and queues the save; a saver thread copies the rows to the host and sends them, on a socket of
its own, as fast as the store takes them. A burst of saves (eight streams ending in one step) cost the 4B's
engine thread ~4 ms each when it made them itself: gathering, copying and sending 144 frames.

KV travels on these sockets only — worker and store, never through the daemon (docs/architecture.md).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import NamedTuple

import zmq

from kvstore.policy import ReusePolicy
from kvstore.wire import layout_body, snapshot_from_frames
from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.kv_messages import KvData, KvLookup, KvSave, KvSaved
from protocol.messages import Error
from workers.kv_engine import engine_layout

from .engine.engine import Engine
from .engine.kv_cache import KVExport
from .engine.scheduler import common_prefix_len

log = logging.getLogger("genie.worker")

SAVE_QUEUE = 4  # saves in the saver socket's queue
SAVE_BACKLOG = 8  # saves waiting for the saver thread at most; a save beyond them is dropped at once
OUTBOX_S = 2.0  # a save the store has not taken in this long is dropped (the store is gone, not started, or stuck)
ANSWER_S = 30.0  # how long the saver thread keeps reading for the answers to the saves it sent
# A store that starts beside a fresh worker may bind its socket after the worker connected (the daemon starts
# both at once, and under load the store can be the later): until the link has reached a store once, and only
# in its first STARTUP_S, a lookup waits up to STARTUP_WAIT_S for the connection instead of running the turn
# cold (the first turn after a restart is the one whose saved KV matters most). After that an absent store
# costs nothing again.
STARTUP_S = 30.0
STARTUP_WAIT_S = 1.0


class KvLink:
    def __init__(self, ctx: zmq.Context, endpoint: str, engine: Engine, timeout_s: float = 1.0) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.fingerprint = engine.model.fingerprint.hex()
        self.kv_layout = engine_layout(engine)
        self.layout = layout_body(self.kv_layout)
        self.sock = _store_socket(ctx, endpoint)  # lookups, from the engine thread
        self._ids = itertools.count(1)
        self.saves_acked = 0
        self.saves_dropped = 0
        self._count = threading.Lock()
        self._saved: tuple[str | None, list[int]] | None = None  # (conv id, tokens) of this worker's last save
        self._born = time.monotonic()
        self._reached = False  # a lookup has left for the store at least once (its socket is connected)
        self.policy = ReusePolicy()  # what is worth saving and looking up on this backend (kvstore/policy.py)
        self._saves: queue.Queue[_Outgoing | None] = queue.Queue()  # for the saver thread; None: stop
        self._close_by = 0.0  # closing: the time after which a save the store does not take is dropped at once
        self._unanswered, self._last_sent = 0, 0.0  # the saver's: saves sent and not answered, the last one's time
        self._saver = threading.Thread(target=self._save_loop, args=(ctx, endpoint), name="kv-saver", daemon=True)
        self._saver.start()

    def close(self) -> None:
        """The saves queued still leave within OUTBOX_S (those the store does not take are dropped), then the
        sockets close."""
        self._close_by = time.monotonic() + OUTBOX_S  # then what is left is dropped at once
        self._saves.put(None)
        self._saver.join(timeout=OUTBOX_S + 5)
        self.sock.close()

    @property
    def pending(self) -> bool:
        """Saves are queued or being sent."""
        return self._saves.unfinished_tasks > 0

    def flush(self, timeout_s: float) -> bool:
        """Waits until every save queued has been sent or dropped (at most timeout_s); whether they all were."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self.pending

    def hydrate(self, prompt: list[int], conv_id: str | None, slot: int = 0, timeout_s: float | None = None) -> int:
        """Loads the longest saved prefix of `prompt` into `slot` if it beats what the slot holds; returns the
        tokens loaded (0: nothing better, the store did not answer in time, or the answer was unusable).
        Never raises for the store's sake: the turn then simply runs cold."""
        try:
            return self._hydrate(prompt, conv_id, slot, self.timeout_s if timeout_s is None else timeout_s)
        except zmq.ZMQError as e:
            log.warning("event=kv_lookup_failed error=%r", str(e))
            return 0

    def _hydrate(self, prompt: list[int], conv_id: str | None, slot: int, timeout_s: float) -> int:
        held = common_prefix_len(self.engine.kv.resident[slot], prompt)
        if not self.policy.worth_looking_up(len(prompt), held, conv_id):
            return 0
        if self._saved is not None:  # (a fresh worker has saved nothing: everything on disk may help it)
            saved_conv, saved = self._saved
            if conv_id == saved_conv and held >= len(saved) and common_prefix_len(saved, prompt) == len(saved):
                return 0  # the next turn of what this worker saved last: the store has nothing longer to give
        rid = f"l{next(self._ids)}"
        msg = KvLookup(
            request_id=rid,
            fingerprint=self.fingerprint,
            layout=self.layout,
            token_ids=list(prompt),
            conv_id=conv_id,
            longer_than=max(held, self.policy.shortest(conv_id) - 1),
        )
        self._await_store(timeout_s)
        try:
            self.sock.send_multipart(encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            return 0
        self._reached = True
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        while (left := deadline - time.monotonic()) > 0 and self.sock.poll(int(left * 1000) + 1):
            reply, side = self._receive()
            if not isinstance(reply, (KvData, Error)) or reply.request_id != rid:
                continue  # the answer to a lookup that timed out earlier
            if isinstance(reply, Error):
                log.warning("event=kv_lookup_failed code=%s message=%r", reply.code, reply.message)
                return 0
            if reply.n_tokens == 0:
                self.policy.observe_lookup(0, time.monotonic() - t0)
                return 0
            if not held < reply.n_tokens <= len(prompt):
                log.warning("event=kv_lookup_bad_answer n_tokens=%d prompt=%d", reply.n_tokens, len(prompt))
                return 0
            try:
                snapshot = snapshot_from_frames(self.kv_layout, prompt[: reply.n_tokens], side)
                self.engine.import_kv(snapshot, slot)
            except ValueError as e:
                log.warning("event=kv_lookup_bad_answer error=%r", str(e))
                return 0
            self.policy.observe_lookup(reply.n_tokens, time.monotonic() - t0)
            return reply.n_tokens
        log.warning("event=kv_lookup_timeout timeout_s=%s", timeout_s)
        return 0

    def _await_store(self, most_s: float) -> None:
        """A fresh link that has not reached a store yet waits (at most STARTUP_WAIT_S) for its connection."""
        if not self._reached and time.monotonic() - self._born < STARTUP_S:
            self.sock.poll(int(min(most_s, STARTUP_WAIT_S) * 1000), zmq.POLLOUT)  # writable once connected

    def observe_prefill(self, n_tokens: int, seconds: float) -> None:
        """A turn's prefill: what recomputing costs on this backend, against which a lookup is weighed."""
        self.policy.observe_prefill(n_tokens, seconds)

    def save(self, conv_id: str | None, slot: int = 0) -> bool:
        """Queues what `slot` holds for the store (when hydrating it would beat recomputing it): its rows are
        gathered on the device, the saver thread does the rest. Never waits, and never raises for the store's
        sake (the save is then lost, with a log line)."""
        if not self.policy.worth_saving(len(self.engine.kv.resident[slot]), conv_id):
            return False
        if self._saves.unfinished_tasks >= SAVE_BACKLOG:
            self._dropped(f"{SAVE_BACKLOG} saves are waiting for the KV store")
            return False
        try:
            export = self.engine.start_export_kv(slot)
        except Exception as e:  # no device memory for the gathered rows, say: the save is lost, not the worker
            self._dropped(f"{type(e).__name__}: {e}")
            return False
        msg = KvSave(
            request_id=f"s{next(self._ids)}",
            fingerprint=self.fingerprint,
            layout=self.layout,
            token_ids=[int(t) for t in export.token_ids],
            conv_id=conv_id,
        )
        self._saves.put(_Outgoing(msg, export, time.monotonic()))
        self._saved = (conv_id, msg.token_ids)
        return True

    # -- the saver thread ------------------------------------------------------------------------------
    def _save_loop(self, ctx: zmq.Context, endpoint: str) -> None:
        sock = _store_socket(ctx, endpoint)
        try:
            while True:
                try:  # while answers are due, the socket is read every 50 ms between saves
                    out = self._saves.get(timeout=0.05 if self._answers_due() else None)
                except queue.Empty:
                    self._drain(sock)
                    continue
                if out is None:
                    break
                try:
                    self._send(sock, out)
                except Exception as e:  # a copy that failed: this save is lost, not the thread
                    self._dropped(f"{type(e).__name__}: {e}")
                finally:
                    self._saves.task_done()
                self._drain(sock)
            self._saves.task_done()
        finally:
            sock.close()

    def _send(self, sock: zmq.Socket, out: _Outgoing) -> None:
        """One save: its rows to the host (the copy waits for the gather, not the engine), then to the store in
        one frame, retried while the store does not take it, dropped once it is OUTBOX_S old."""
        frames = encode(out.msg, [out.export.flat().data.cast("B")])
        while True:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:  # not connected (IMMEDIATE), or SAVE_QUEUE saves already queued
                now = time.monotonic()
                if now - out.since > OUTBOX_S or 0 < self._close_by < now:
                    self._dropped("the KV store is not taking saves")
                    return
                self._drain(sock)
                sock.poll(10, zmq.POLLOUT)
                continue
            except zmq.ZMQError as e:
                self._dropped(str(e))
                return
            self._unanswered, self._last_sent = self._unanswered + 1, time.monotonic()
            return

    def _answers_due(self) -> bool:
        """Saves sent that the store has not answered yet (not counting any sent over ANSWER_S ago: a store
        that died does not keep the thread waking)."""
        return self._unanswered > 0 and time.monotonic() - self._last_sent < ANSWER_S

    def _dropped(self, reason: str) -> None:
        with self._count:  # the engine thread and the saver both drop
            self.saves_dropped += 1
        log.warning("event=kv_save_dropped reason=%r", reason)

    def _drain(self, sock: zmq.Socket) -> None:
        """The store's answers to saves (KV_SAVED, or ERROR): counted and logged."""
        try:
            while sock.poll(0):
                self._receive(sock)
        except zmq.ZMQError as e:
            log.warning("event=kv_receive_failed error=%r", str(e))

    def _receive(self, sock: zmq.Socket | None = None) -> tuple[object, list]:
        frames = (sock or self.sock).recv_multipart(copy=False)
        try:
            msg, side = decode([f.buffer for f in frames])
        except ProtocolError as e:
            log.warning("event=kv_bad_reply error=%r", e.message)
            return None, []
        if isinstance(msg, KvSaved):
            self.saves_acked += 1
            self._unanswered = max(0, self._unanswered - 1)
        elif isinstance(msg, Error) and not (msg.request_id or "").startswith("l"):  # lookups log their own
            self._unanswered = max(0, self._unanswered - 1)
            log.warning("event=kv_save_failed request=%s code=%s message=%r", msg.request_id, msg.code, msg.message)
        return msg, side


class _Outgoing(NamedTuple):
    msg: KvSave
    export: KVExport  # the rows, on their way to the host
    since: float  # monotonic time the save was started


def _store_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)  # the last turn's save still leaves on exit
    sock.setsockopt(zmq.SNDHWM, SAVE_QUEUE)
    # no queueing for a store that is not there (not started yet, restarting): a lookup then costs nothing
    # instead of its full timeout, and a save is retried, then dropped
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, 1 << 31)
    sock.connect(endpoint)
    return sock
