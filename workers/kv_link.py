"""The worker's link to the KV-store process: at turn start a lookup, from the engine thread (waits at most
`timeout_s`, then the turn goes on cold); at turn end a save, never waited for. The engine thread only gathers
the slot's rows into a buffer of their own on the device (behind the step that wrote them, ahead of any that
overwrites them) and queues the save; a saver thread copies the rows to the host and sends them, on a socket of
its own, as fast as the store takes them. A burst of saves (eight streams ending in one step) cost the 4B's
engine thread ~4 ms each when it made them itself: gathering, copying and sending 144 frames.

A save the store does not take (it is down: killed, restarting) is kept in host memory, the newest KEEP_SAVES
within KEEP_BYTES, and handed to the store once it takes saves again; before, it was dropped after OUTBOX_S,
and the next turns hydrated a shorter prefix (issue 34 item 9). `counts` (kv_messages.KvSaveCounts) says what
became of the saves; the worker's heartbeat carries it to the daemon.

KV travels on these sockets only — worker and store, never through the daemon (docs/architecture.md).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import NamedTuple

import zmq

from genie_kvstore.policy import ReusePolicy
from genie_kvstore.wire import layout_body, snapshot_from_frames
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.kv_messages import KvData, KvLookup, KvSave, KvSaveCounts, KvSaved
from genie_protocol.messages import Error
from genie_workers.kv_engine import engine_layout

from .engine.engine import Engine
from .engine.kv_cache import KVExport, common_prefix_len

log = logging.getLogger("genie.worker")

SAVE_QUEUE = 4  # saves in the saver socket's queue
SAVE_BACKLOG = 8  # saves waiting for the saver thread at most; a save beyond them is dropped at once
OUTBOX_S = 2.0  # a save the store has not taken in this long is kept for it (the store is gone, not started, or stuck)
# what is kept for a store that is not taking saves: the newest saves, at most this many and this many bytes of
# host memory (a 150-token turn of the 4B is 11.5 MB at INT8 KV, a 2 000-token Gemma 3 270M one 19 MB)
KEEP_SAVES = 8
KEEP_BYTES = 256 << 20
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
        self.counts = KvSaveCounts()  # written under _count: the engine thread and the saver both count
        self._count = threading.Lock()
        self._held: deque[_Held] = deque()  # the saver's: saves kept for the store, oldest first
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
        """Saves are queued or being sent (not counting those kept for a store that is not taking them)."""
        return self._saves.unfinished_tasks > 0

    def counts_now(self) -> KvSaveCounts:
        """What became of this worker's saves so far (the heartbeat's, from the I/O thread)."""
        with self._count:
            return replace(self.counts)

    def flush(self, timeout_s: float) -> bool:
        """Waits until every save queued has been sent, kept or dropped (at most timeout_s); whether they all were."""
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
        held = self.engine.kv.prefix_len(slot, prompt)
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
        if not self.policy.worth_saving(self.engine.kv.n_held(slot), conv_id):
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
                try:  # while answers are due or saves kept, the socket is looked at every 50 ms between saves
                    out = self._saves.get(timeout=0.05 if self._answers_due() or self._held else None)
                except queue.Empty:
                    self._drain(sock)
                    self._hand_over(sock)
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
            self._hand_over_before_closing(sock)
            self._saves.task_done()
        finally:
            sock.close()

    def _send(self, sock: zmq.Socket, out: _Outgoing) -> None:
        """One save: its rows to the host (the copy waits for the gather, not the engine), then to the store in
        one frame, after what is kept for it (the store takes saves in order); retried while the store does not
        take it, and kept for it once OUTBOX_S old, or at once while older ones wait."""
        flat = out.export.flat()
        save = _Held(out.msg, encode(out.msg, [flat.data.cast("B")]), flat.nbytes)
        self._let_go_superseded(out.msg)
        while not (self._hand_over(sock) and self._offer(sock, save)):
            now = time.monotonic()
            if self._held or now - out.since > OUTBOX_S or 0 < self._close_by < now:
                self._keep(save)
                return
            self._drain(sock)
            sock.poll(10, zmq.POLLOUT)

    def _offer(self, sock: zmq.Socket, save: _Held) -> bool:
        """Sends one save if the store takes it now; whether it did."""
        try:
            sock.send_multipart(save.frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # not connected (IMMEDIATE), or SAVE_QUEUE saves already queued
            return False
        except zmq.ZMQError as e:  # kept, as if not taken: KEEP_SAVES bounds what a broken socket holds
            log.warning("event=kv_save_send_failed error=%r", str(e))
            return False
        self._unanswered, self._last_sent = self._unanswered + 1, time.monotonic()
        return True

    def _keep(self, save: _Held) -> None:
        """Keeps a save the store did not take; the oldest kept go beyond KEEP_SAVES and KEEP_BYTES."""
        self._held.append(save)
        with self._count:
            c = self.counts
            c.kept, c.held, c.held_bytes = c.kept + 1, c.held + 1, c.held_bytes + save.nbytes
        log.warning("event=kv_save_kept tokens=%d held=%d: the store is not taking saves", save.tokens, len(self._held))
        while len(self._held) > KEEP_SAVES or sum(h.nbytes for h in self._held) > KEEP_BYTES:
            self._unhold(self._held[0])
            self._dropped(f"more than {KEEP_SAVES} saves or {KEEP_BYTES >> 20} MB kept for the KV store")

    def _unhold(self, save: _Held, handed_over: bool = False) -> None:
        """`save` is no longer kept: the store took it, or it is let go."""
        self._held.remove(save)
        with self._count:
            c = self.counts
            c.held, c.held_bytes = c.held - 1, c.held_bytes - save.nbytes
            c.handed_over += int(handed_over)

    def _hand_over(self, sock: zmq.Socket) -> bool:
        """Sends what is kept, oldest first, as far as the store takes it; whether nothing is left kept."""
        while self._held:
            save = self._held[0]
            if not self._offer(sock, save):
                return False
            self._unhold(save, handed_over=True)
            log.info("event=kv_save_handed_over tokens=%d held=%d", save.tokens, len(self._held))
        return True

    def _let_go_superseded(self, msg: KvSave) -> None:
        """A kept save that the new one covers (the same conversation's, or one without an id whose tokens
        begin the new one's) would only be replaced in the store: it goes now, neither lost nor handed over."""
        for save in [h for h in self._held if _covers(msg, h.msg)]:
            self._unhold(save)

    def _hand_over_before_closing(self, sock: zmq.Socket) -> None:
        """Closing: what is kept still leaves until the close deadline; the rest is lost."""
        while not self._hand_over(sock) and time.monotonic() < self._close_by:
            sock.poll(10, zmq.POLLOUT)
        while self._held:
            self._unhold(self._held[0])
            self._dropped("the worker stopped before the KV store took it")

    def _answers_due(self) -> bool:
        """Saves sent that the store has not answered yet (not counting any sent over ANSWER_S ago: a store
        that died does not keep the thread waking)."""
        return self._unanswered > 0 and time.monotonic() - self._last_sent < ANSWER_S

    def _dropped(self, reason: str) -> None:
        with self._count:  # the engine thread and the saver both drop
            self.counts.dropped += 1
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
            with self._count:
                self.counts.acked += 1
            self._unanswered = max(0, self._unanswered - 1)
        elif isinstance(msg, Error) and not (msg.request_id or "").startswith("l"):  # lookups log their own
            self._unanswered = max(0, self._unanswered - 1)
            log.warning("event=kv_save_failed request=%s code=%s message=%r", msg.request_id, msg.code, msg.message)
        return msg, side


class _Outgoing(NamedTuple):
    msg: KvSave
    export: KVExport  # the rows, on their way to the host
    since: float  # monotonic time the save was started


@dataclass(frozen=True, eq=False)  # one save is itself only: never compared by its megabytes
class _Held:
    """A save on the host, ready to send (the saver's)."""

    msg: KvSave
    frames: list  # encoded: the body, then every array's bytes in one frame
    nbytes: int  # of the KV

    @property
    def tokens(self) -> int:
        return len(self.msg.token_ids)


def _covers(new: KvSave, old: KvSave) -> bool:
    """Whether the store would replace `old`'s entry with `new`'s (store.py: the same conversation's name, or an
    entry without an id whose tokens all begin the new one)."""
    if new.conv_id is not None or old.conv_id is not None:
        return new.conv_id == old.conv_id
    return new.token_ids[: len(old.token_ids)] == old.token_ids


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
