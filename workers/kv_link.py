"""The worker's link to the KV-store process, used from the engine thread: at turn start a lookup (waits
at most `timeout_s`, then the turn goes on cold), at turn end a save (sent, never waited for).

KV travels on this socket only — worker and store, never through the daemon (docs/architecture.md).
"""

from __future__ import annotations

import itertools
import logging
import time

import zmq

from kvstore.policy import ReusePolicy
from kvstore.wire import layout_body, snapshot_frames, snapshot_from_frames
from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.kv_messages import KvData, KvLookup, KvSave, KvSaved
from protocol.messages import Error
from workers.kv_engine import engine_layout

from .engine.engine import Engine
from .engine.scheduler import common_prefix_len

log = logging.getLogger("genie.worker")

SAVE_QUEUE = 4  # saves waiting to leave; beyond it a save is dropped (the store is gone or stuck)
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
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 2000)  # the last turn's save still leaves on exit
        self.sock.setsockopt(zmq.SNDHWM, SAVE_QUEUE)
        # no queueing for a store that is not there (not started yet, restarting): a lookup then costs
        # nothing instead of its full timeout, and a save is dropped at once
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 1 << 31)
        self.sock.connect(endpoint)
        self._ids = itertools.count(1)
        self.saves_acked = 0
        self.saves_dropped = 0
        self._saved: tuple[str | None, list[int]] | None = None  # (conv id, tokens) of this worker's last save
        self._born = time.monotonic()
        self._reached = False  # a message has left for the store at least once
        self.policy = ReusePolicy()  # what is worth saving and looking up on this backend (kvstore/policy.py)

    def close(self) -> None:
        self.sock.close()

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
                continue  # a save's ack, or the answer to a lookup that timed out earlier
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
        """Sends what `slot` holds to the store (when hydrating it would beat recomputing it); never blocks,
        and never raises for the store's sake (the save is then lost, with a log line)."""
        try:
            return self._save(conv_id, slot)
        except zmq.ZMQError as e:
            self.saves_dropped += 1
            log.warning("event=kv_save_dropped error=%r", str(e))
            return False

    def _save(self, conv_id: str | None, slot: int) -> bool:
        self._drain()
        if not self.policy.worth_saving(len(self.engine.kv.resident[slot]), conv_id):
            return False
        snapshot = self.engine.export_kv(slot)
        msg = KvSave(
            request_id=f"s{next(self._ids)}",
            fingerprint=self.fingerprint,
            layout=self.layout,
            token_ids=[int(t) for t in snapshot.token_ids],
            conv_id=conv_id,
        )
        self._await_store(STARTUP_WAIT_S)
        try:
            self.sock.send_multipart(encode(msg, snapshot_frames(snapshot)), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.saves_dropped += 1
            log.warning("event=kv_save_dropped reason='the KV store is not taking saves'")
            return False
        self._reached = True
        self._saved = (conv_id, msg.token_ids)
        return True

    def _drain(self) -> None:
        while self.sock.poll(0):
            self._receive()

    def _receive(self) -> tuple[object, list]:
        frames = self.sock.recv_multipart(copy=False)
        try:
            msg, side = decode([f.buffer for f in frames])
        except ProtocolError as e:
            log.warning("event=kv_bad_reply error=%r", e.message)
            return None, []
        if isinstance(msg, KvSaved):
            self.saves_acked += 1
        elif isinstance(msg, Error) and not (msg.request_id or "").startswith("l"):  # lookups log their own
            log.warning("event=kv_save_failed request=%s code=%s message=%r", msg.request_id, msg.code, msg.message)
        return msg, side
