"""The GPU worker process: owns the engine and serves the daemon over two DEALER sockets.

Socket input stays out of the compute loop (as vLLM's engine core does): an I/O thread owns the inbound
socket, decodes what arrives (acting on CANCEL at once, queueing everything else) and beats the heartbeat;
the main thread runs the engine and sends its answers on a second DEALER socket of its own — handing every
token to the I/O thread cost ~100 µs a token in GIL hand-offs on a 2-core machine. With a KV store
(its part's `kv_endpoint`), a third socket (kv_link.py) looks up a saved prefix before a turn, and a fourth, on
kv_link's saver thread, saves after it.
A bad request, or one that fails (out of memory among it), gets an ERROR reply and the others go on; a
fatal error sends DEAD and the process exits, for the daemon to restart it. A failing KV store is never
fatal: the turn runs cold, the save is kept for the store's return or lost (kv_link.py); the heartbeat
carries the counts.

    python -m genie_workers.worker --part '{...}'    (the daemon starts it: DaemonConfig.worker_args)
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import zmq

from genie_common import heap, scheduling
from genie_common.child_config import WorkerPart, from_arg
from genie_common.errors import GenieError
from genie_common.lifetime import exit_with_parent
from genie_common.models.local import ModelsDir
from genie_protocol import PROTOCOL_VERSION
from genie_protocol.codec import decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import (
    Cancel,
    Dead,
    Done,
    Error,
    Generate,
    Heartbeat,
    Hello,
    Message,
    Prewarm,
    Ready,
    Usage,
    worker_identities,
)

from .delta_stream import DeltaStream
from .engine.engine import Engine
from .engine.sampling import SamplingParams
from .engine.sequence import Delta, Event, Failed
from .engine.sequence import Sequence as EngineSequence
from .kv_link import KvLink
from .output_parser import OutputParser
from .thermal import ThermalGovernor, find_sensor

log = logging.getLogger("genie.worker")
LOOKUP_BUSY_S = 0.05  # how long a KV lookup may hold up the streams already decoding
STALE_CANCEL_S = 60.0  # a CANCEL whose request is not running after this long came after its end


@dataclass(frozen=True)
class WorkerConfig:
    endpoint: str  # the daemon's worker-facing ROUTER socket
    # the rest is the daemon's configuration (its part: child_config.WorkerPart), whose defaults are DaemonConfig's
    stream_interval_s: float  # DELTAs of one request at most this often (delta_stream.py); 0: every token
    kv_endpoint: str  # the KV-store process (kv_link.py); empty: no persistent KV
    thermal_sensor: str  # a file of millidegrees to watch (thermal.py); empty: NVML, else the thermal zones
    thermal_throttle_c: float  # above this the worker slows down ...
    thermal_resume_c: float  # ... until it is at or below this again
    heartbeat_s: float = 1.0  # the worker's own beat: the daemon counts it dead after heartbeat_timeout_s


@dataclass
class _Turn:
    """What the worker keeps of a request while the engine runs it."""

    msg: Generate | Prewarm
    stream: DeltaStream
    dropped: int  # the oldest messages left out to fit the context
    # reads the model's markup: the answer goes out as content, reasoning and tool calls (None: it failed on
    # this answer, whose rest goes out as plain content)
    parser: OutputParser | None


class _IoThread(threading.Thread):
    """Owns the inbound DEALER socket: says HELLO and READY, then receives requests (acting on CANCEL at once)
    and beats the heartbeat."""

    def __init__(
        self,
        ctx: zmq.Context,
        config: WorkerConfig,
        inbox: queue.Queue[Message],
        cancelled: dict[str, float],
        thermal: ThermalGovernor,
        kv: KvLink | None,
    ) -> None:
        super().__init__(name="worker-io", daemon=True)
        self.config = config
        self.thermal = thermal
        self.kv = kv  # its save counts go out with each beat
        self.inbox = inbox
        self.cancelled = cancelled
        self.busy = False
        self.stopped = threading.Event()
        self.dealer = _dealer(ctx, config.endpoint, worker_identities(os.getpid())[0])
        self.greeting: tuple[Message, ...] = ()  # HELLO and READY, sent first when the thread starts

    def run(self) -> None:
        scheduling.latency_sensitive()  # a request or a CANCEL takes a core from the engine's threads at once
        # READY leaves through the socket requests come in by: the daemon's ROUTER can route to a peer only
        # once that peer's connection is through, and a READY from the outbound socket could arrive first,
        # so the first GENERATE went nowhere and its request stayed "running" for ever
        for msg in self.greeting:
            self.dealer.send_multipart(encode(msg))
        seq = 0
        next_beat = time.monotonic()
        while not self.stopped.is_set():
            now = time.monotonic()
            if now >= next_beat:
                self.thermal.poll()  # once a beat, busy or idle: a cooled device is noticed while idle too
                kv_saves = self.kv.counts_now().body() if self.kv else None
                beat = Heartbeat(seq=seq, busy=self.busy, thermal=self.thermal.report(), kv_saves=kv_saves)
                self.dealer.send_multipart(encode(beat))
                seq += 1
                next_beat = now + self.config.heartbeat_s
            if self.dealer.poll(timeout=max(1, int(min(next_beat - now, 0.2) * 1000))):
                self._receive(self.dealer.recv_multipart(copy=False))
        self.dealer.close()

    def _receive(self, frames: list[zmq.Frame]) -> None:
        try:
            msg, _ = decode([f.buffer for f in frames])
        except ProtocolError as e:
            self.dealer.send_multipart(encode(Error(request_id=e.request_id, code=e.code, message=e.message)))
            return
        if isinstance(msg, Cancel):  # now, not after the running generation: the engine polls this set
            self.cancelled[msg.request_id] = time.monotonic()
        elif isinstance(msg, (Generate, Prewarm)):
            self.inbox.put(msg)
        else:
            reply = Error(
                request_id=getattr(msg, "request_id", None),
                code="bad_request",
                message=f"a worker does not serve {type(msg).__name__.upper()}",
            )
            self.dealer.send_multipart(encode(reply))


def _dealer(ctx: zmq.Context, endpoint: str, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 2000)  # DEAD and the last DONE still leave on exit
    sock.setsockopt(zmq.MAXMSGSIZE, 8 << 20)
    sock.connect(endpoint)
    return sock


class Worker:
    def __init__(self, config: WorkerConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.ctx: zmq.Context = zmq.Context.instance()
        # the context's I/O thread starts with its first socket, this one, and carries every DELTA out: it takes a
        # core from the engine's threads at once (scheduling.py)
        with scheduling.latency_sensitive_starts():
            self.out = _dealer(self.ctx, config.endpoint, worker_identities(os.getpid())[1])  # the engine thread's own
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.cancelled: dict[str, float] = {}  # request id -> when its CANCEL came (the I/O thread writes it)
        source, read = find_sensor(config.thermal_sensor, gpu=engine.backend.name == "cupy")
        log.info("event=thermal_sensor source=%s throttle_c=%s", source, config.thermal_throttle_c)
        self.thermal = ThermalGovernor(read, config.thermal_throttle_c, config.thermal_resume_c)
        self.kv = KvLink(self.ctx, config.kv_endpoint, engine) if config.kv_endpoint else None
        self.io = _IoThread(self.ctx, config, self.inbox, self.cancelled, self.thermal, self.kv)
        self.turns: dict[EngineSequence, _Turn] = {}  # the requests in the engine's scheduler
        self.saves: list[tuple[str | None, int]] = []  # (conv id, slot) of the turns a step ended, to save
        self.stopping = False

    def send(self, msg: Message) -> None:
        """Never blocks: a daemon that takes nothing (gone, or stuck for a thousand messages) stops this
        worker, which ends its turn as cancelled and exits (a child never outlives its daemon). A message that
        cannot be encoded (what a model wrote that msgpack cannot carry) ends its request with ERROR instead of
        ending the worker."""
        try:
            frames = encode(msg)
        except ProtocolError as e:
            rid = getattr(msg, "request_id", None)
            log.error("event=unsendable type=%s request=%s error=%r", type(msg).__name__, rid, e.message)
            reason = f"the answer could not be sent: {e.message}"
            frames = encode(Error(request_id=rid, code="internal", message=reason))
        try:
            self.out.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            if not self.stopping:
                log.error("event=daemon_unreachable: stopping")
            self.stopping = True

    def serve(self) -> int:
        """Runs until SIGTERM/SIGINT (exit 0) or a fatal error (DEAD, exit 1)."""
        e = self.engine
        t0 = time.monotonic()
        captured = e.capture_decode_steps()  # before READY: no request waits for these
        if captured:
            log.info("event=decode_steps_captured counts=%d ms=%.0f", captured, (time.monotonic() - t0) * 1000)
        ready = Ready(
            model=e.model.name,
            ctx=e.n_ctx,
            parallel=e.kv.config.n_slots,
            backend=e.backend.name,
            device=e.backend.device_name,
            load_ms=e.model.load_ms,
            memory=e.plan.as_dict(),
        )
        self.io.greeting = (Hello(protocol_version=PROTOCOL_VERSION, pid=os.getpid()), ready)
        self.io.start()
        worked = False  # steps ran since the heap was last given back
        try:
            # on SIGTERM every turn ends as cancelled (a DONE each), then the loop ends
            while not (self.stopping and e.idle):
                self._take_requests(wait=e.idle and not self.stopping)
                if e.idle:
                    self._forget_stale_cancels()
                    if worked:  # idle for a wait with nothing new: what the work freed goes back
                        heap.give_back()
                        worked = False
                    continue
                worked = True
                self.io.busy = True
                limit = 1 if self.thermal.throttled else None  # hot: no new stream while one runs
                t0 = time.monotonic()
                for seq, ev in e.step(limit, self._prepare):
                    self._on_event(seq, ev)
                self._save_ended()
                pause = self.thermal.pause_s(time.monotonic() - t0)
                if pause:  # hot: as long again as the step took, half the speed
                    time.sleep(pause)
                self.io.busy = not e.idle
            return 0
        except Exception as exc:  # fatal: tell the daemon, then exit for it to restart us
            self.send(Dead(reason=f"{type(exc).__name__}: {exc}"[:4000]))
            return 1
        finally:
            self.io.stopped.set()
            self.io.join(timeout=3)
            self.out.close()
            if self.kv:
                self.kv.close()

    def _forget_stale_cancels(self) -> None:
        """A CANCEL that came after its request had ended (the daemon had not seen the DONE yet) names nothing:
        forgotten after a minute, so the set does not grow for ever (a live request is seconds from its CANCEL)."""
        now = time.monotonic()
        for rid, at in list(self.cancelled.items()):
            if now - at > STALE_CANCEL_S:
                self.cancelled.pop(rid, None)

    def _take_requests(self, wait: bool) -> None:
        """Every request that arrived, into the scheduler (waiting a little for one when there is no work)."""
        while True:
            try:
                msg = self.inbox.get(timeout=0.2) if wait else self.inbox.get_nowait()
            except queue.Empty:
                return
            wait = False
            self._submit(msg)

    def _submit(self, msg: Message) -> None:
        assert isinstance(msg, (Generate, Prewarm))
        rid = msg.request_id
        stream = DeltaStream(rid, self.send, self.config.stream_interval_s)
        try:
            params = SamplingParams(max_tokens=0) if isinstance(msg, Prewarm) else _sampling(msg.params)
            asked = msg.ctx if isinstance(msg, Generate) else None
            n_ctx = self.engine.request_ctx(asked)
            if asked is not None and asked > n_ctx:  # never a silent smaller context: DONE's usage.ctx says it
                log.warning("event=ctx_capped request=%s asked=%d used=%d", rid, asked, n_ctx)
            ids, dropped = self._prompt_ids(msg, params.max_tokens, n_ctx)
            if dropped:
                log.warning("event=context_truncated request=%s dropped_messages=%d", rid, dropped)
            fmt = msg.format if isinstance(msg, Generate) else None
            constraint = self.engine.json_constraint(fmt) if fmt is not None else None
            # SIGTERM (the daemon stopping, or the daemon gone: exit_with_parent) ends the turn like a CANCEL
            cancel = lambda: rid in self.cancelled or self.stopping  # noqa: E731
            seq = self.engine.sequence(ids, params, cancel, constraint, msg.priority, n_ctx=n_ctx)
        except GenieError as e:  # the request's fault: reply and go on
            self.send(Error(request_id=rid, code="bad_request", message=str(e)))
            self.cancelled.pop(rid, None)
            return
        except Exception as e:  # tokenizing or compiling its grammar failed: this request, not the worker
            self.cancelled.pop(rid, None)
            self._failed(rid, e)
            return
        parser = OutputParser(_tool_names(msg), think=msg.think) if isinstance(msg, Generate) else OutputParser()
        self.turns[seq] = _Turn(msg, stream, dropped, parser)
        self.engine.scheduler.submit(seq)

    def _prepare(self, seq: EngineSequence) -> None:
        """A sequence has its slot: load a saved prefix of its prompt into it when the store has one. The
        lookup holds up the engine thread: while other streams decode it waits LOOKUP_BUSY_S at most (the
        store answers in milliseconds; a late answer means the turn runs cold, not that the others stall)."""
        if self.kv:
            others = len(self.engine.scheduler.running) > 1
            timeout = LOOKUP_BUSY_S if others else None
            self.kv.hydrate(seq.prompt, self.turns[seq].msg.conv_id, seq.slot, timeout_s=timeout)

    def _on_event(self, seq: EngineSequence, ev: Event) -> None:
        turn = self.turns[seq]
        rid = turn.msg.request_id
        if isinstance(ev, Delta):
            if isinstance(turn.msg, Generate):
                self._typed(turn, ev.text, ev.token_ids)
            return
        del self.turns[seq]
        self.cancelled.pop(rid, None)
        if isinstance(turn.msg, Generate) and not isinstance(ev, Failed):
            self._typed(turn, None, [])  # what the parser held back to decide
        turn.stream.flush()
        if isinstance(ev, Failed):
            self._failed(rid, ev.error)
            return
        if self.kv:
            self.kv.observe_prefill(ev.prompt_tokens - ev.cached_tokens, ev.timings["prefill_ms"] / 1000)
        usage = Usage(
            prompt_tokens=ev.prompt_tokens,
            cached_tokens=ev.cached_tokens,
            completion_tokens=ev.completion_tokens,
            dropped_messages=turn.dropped,  # the oldest turns left out to fit the context
            ctx=seq.n_ctx,  # the context it had: what it asked for (Generate.ctx), at most the worker's
        )
        self.send(Done(request_id=rid, finish_reason=ev.finish_reason, usage=usage, timings=ev.timings))
        if self.kv:
            self.saves.append((turn.msg.conv_id, seq.slot))

    def _save_ended(self) -> None:
        """The KV of the turns the step ended, to the store: queued after every DONE of the step went out (a
        client never waits for a save), their rows gathered before the next step may give the slots to another
        request (KvLink.save: the rest happens on its saver thread)."""
        saves, self.saves = self.saves, []
        for conv_id, slot in saves:
            assert self.kv is not None
            self.kv.save(conv_id, slot)

    def _typed(self, turn: _Turn, text: str | None, token_ids: list[int]) -> None:
        """A piece of the answer (None: its end) out as content, reasoning and tool calls. A parser that fails
        on it costs this answer its typing, never the worker: the rest goes out as plain content."""
        if turn.parser is not None:
            try:
                events = turn.parser.feed(text) if text is not None else turn.parser.finish()
            except Exception:
                log.exception("event=output_parser_failed request=%s", turn.msg.request_id)
                text, turn.parser = turn.parser.buf, None  # what it held, this piece included
            else:
                turn.stream.events(events, token_ids)
                return
        if text or token_ids:
            turn.stream.add(text or "", token_ids)

    def _failed(self, rid: str, e: Exception) -> None:
        """One request's failure as its ERROR: the others go on, unless the device can no longer be trusted."""
        if isinstance(e, GenieError):  # the request's fault: reply and go on
            self.send(Error(request_id=rid, code="bad_request", message=str(e)))
            return
        if _out_of_memory(e):  # this request's step did not fit: it fails, the worker goes on serving
            self.engine.backend.release_memory()
            log.error("event=out_of_memory request=%s error=%r", rid, str(e)[:500])
            message = "out of memory for this request (a shorter prompt or context, or a larger memory budget)"
            self.send(Error(request_id=rid, code="out_of_memory", message=message))
            return
        if _device_state_unknown(e):
            raise e  # fatal: DEAD, and the daemon starts a fresh worker
        # a bug met by one request: that request fails, the others go on (the engine's state is whole: a slot
        # counts a token as held only once its forward pass returned)
        log.error("event=request_failed request=%s", rid, exc_info=e)
        self.send(Error(request_id=rid, code="internal", message=f"{type(e).__name__}: {e}"[:2000]))

    def _prompt_ids(self, msg: Generate | Prewarm, answer_tokens: int, n_ctx: int) -> tuple[list[int], int]:
        """The prompt's tokens, and how many of its oldest messages were dropped to fit the context."""
        if msg.messages is not None:
            tools = msg.tools if isinstance(msg, Generate) else None
            think = getattr(msg, "think", False)
            fitted = self.engine.fit_chat(msg.messages, answer_tokens, think=think, tools=tools, n_ctx=n_ctx)
            return fitted.ids, fitted.dropped
        if msg.prompt is not None:
            return self.engine.text_prompt(msg.prompt, n_ctx), 0
        assert isinstance(msg, Generate) and msg.token_ids is not None
        return list(msg.token_ids), 0


def _out_of_memory(e: Exception) -> bool:
    """An allocation that failed (host MemoryError; CuPy's OutOfMemoryError is one; CUDA's own, which is not
    sticky): the request that needed it fails, nothing else is harmed."""
    return isinstance(e, MemoryError) or "cudaErrorMemoryAllocation" in str(e)


def _device_state_unknown(e: Exception) -> bool:
    """An error after which the device (GPU memory, a CUDA context) cannot be trusted: CuPy's and CUDA's own
    errors other than a failed allocation."""
    return type(e).__module__.split(".")[0] in ("cupy", "cupy_backends", "cuda")


def _tool_names(msg: Generate) -> list[str]:
    """The names of the tools a request offers ({"function": {"name": ...}} each; others name none)."""
    fns = [t.get("function") for t in msg.tools or [] if isinstance(t, dict)]
    return [f["name"] for f in fns if isinstance(f, dict) and isinstance(f.get("name"), str)]


def _sampling(params: dict) -> SamplingParams:
    p = dict(params)
    if "stop" in p:
        p["stop"] = tuple(p["stop"])
    return SamplingParams(**p)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="genie-worker", description="genie's GPU worker process, started by the daemon")
    p.add_argument("--part", required=True, help="its part of the daemon's configuration, JSON (child_config.py)")
    args = p.parse_args(argv)
    # its events (the memory plan, the heat sensor) go to the daemon's log, in the daemon's format
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    exit_with_parent()
    scheduling.compute()  # not the daemon's short slice: before the engine's threads start (scheduling.py)
    try:
        part = from_arg(WorkerPart, args.part)
        # the daemon's models directory, not this process's default: a pulled name wins, as in the registry
        pulled = ModelsDir(Path(part.models_dir)).get(part.engine.model) if part.models_dir else None
        options = replace(part.engine, model=str(pulled.path)) if pulled else part.engine
        config = WorkerConfig(
            endpoint=part.endpoint,
            stream_interval_s=part.stream_interval_ms / 1000,
            kv_endpoint=part.kv_endpoint,
            thermal_sensor=part.thermal_sensor,
            thermal_throttle_c=part.thermal_throttle_c,
            thermal_resume_c=part.thermal_resume_c,
        )
        worker = Worker(config, Engine(options))
    except (GenieError, ValueError) as e:
        print(f"genie-worker: error: {e}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: object) -> None:  # only sets a flag; the loop acts on it
        worker.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # what loading made (the tokenizer's tables, the model's metadata, the backend's kernels) lives as long as
    # the process: out of the collector's way, so that a full collection, which otherwise walks it all (15 ms
    # with SmolLM2 on a 2-core machine), does not stall a step now and then
    gc.collect()
    gc.freeze()
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
