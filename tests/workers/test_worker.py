"""The worker process end to end: a real `python -m genie_workers.worker` on a tiny model, with this test as
the daemon (a ROUTER socket)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from genie_common.config import DaemonConfig
from genie_protocol.codec import decode, encode
from genie_protocol.messages import (
    Cancel,
    Delta,
    Done,
    Error,
    Generate,
    Heartbeat,
    Hello,
    Message,
    Ready,
    Status,
    worker_identities,
)
from testkit.tiny_models import write_tiny_model
from tests.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


class FakeDaemon:
    def __init__(self, tmp: Path, model: Path, **options: Any) -> None:
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp}/worker.sock"
        self.router.bind(endpoint)
        # the worker's part as the daemon hands it over (DaemonConfig.worker_args), no KV store
        config = DaemonConfig(model=str(model), worker_endpoint=endpoint, ctx=512, kv_store=False, **options)
        cmd = [sys.executable, "-m", "genie_workers.worker", *config.worker_args()]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=child_env())
        self.identity = worker_identities(self.proc.pid)[0]  # requests go to the worker's inbound socket
        self.last_from = b""  # the identity the last message came from

    def recv(self, timeout_s: float = 30.0, skip_heartbeats: bool = True) -> Message:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(min(left, 0.5) * 1000)):
                if self.proc.poll() is not None:  # it died: say why rather than wait out the timeout
                    raise RuntimeError(f"the worker exited {self.proc.returncode}: {self.proc.stderr.read()}")
                if left <= 0:
                    raise TimeoutError("no message from the worker")
                continue
            self.last_from, *frames = self.router.recv_multipart()
            msg, _ = decode(frames)
            if not (skip_heartbeats and isinstance(msg, Heartbeat)):
                return msg

    def send(self, msg_or_frames) -> None:
        frames = msg_or_frames if isinstance(msg_or_frames, list) else encode(msg_or_frames)
        self.router.send_multipart([self.identity, *frames])

    def until_done(self, rid: str) -> tuple[list[Delta], Message]:
        deltas = []
        while True:
            msg = self.recv()
            if isinstance(msg, Delta) and msg.request_id == rid:
                deltas.append(msg)
            elif isinstance(msg, (Done, Error)) and msg.request_id == rid:
                return deltas, msg

    def close(self) -> str:
        """Stops the worker (SIGTERM) and returns what it wrote to stderr."""
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        finally:
            self.router.close()
            self.ctx.term()
        return err


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("worker")
    model = tmp / "tiny.gguf"
    write_tiny_model("llama", model)
    d = FakeDaemon(tmp, model, prefill_chunk=8, parallel=4)
    hello = d.recv()
    assert isinstance(hello, Hello) and hello.pid == d.proc.pid
    ready = d.recv()
    assert isinstance(ready, Ready) and ready.ctx == 512 and ready.backend in ("numpy", "cupy")
    # through the socket requests go to: once READY is here, the daemon's ROUTER can reach the worker
    assert d.last_from == d.identity
    yield d
    stderr = d.close()
    assert d.proc.returncode == 0, stderr


def test_generate_streams_deltas_then_done(daemon):
    daemon.send(
        Generate(
            request_id="g1", token_ids=[1, 50, 60, 70], params={"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}
        )
    )
    deltas, done = daemon.until_done("g1")
    assert isinstance(done, Done) and done.finish_reason == "length"
    assert done.usage["prompt_tokens"] == 4 and done.usage["completion_tokens"] == 6
    assert sum(len(d.token_ids) for d in deltas) <= 6 and all(d.request_id == "g1" for d in deltas)


def test_same_prompt_again_reuses_the_prefix(daemon):
    req = dict(token_ids=[1, 11, 12, 13, 14, 15], params={"temperature": 0.0, "max_tokens": 3, "ignore_eos": True})
    daemon.send(Generate(request_id="p1", **req))
    _, first = daemon.until_done("p1")
    daemon.send(Generate(request_id="p2", **req))
    _, second = daemon.until_done("p2")
    assert second.usage["cached_tokens"] == 5 and first.usage["completion_tokens"] == 3


def test_cancel_during_a_long_prefill(daemon):
    daemon.send(Generate(request_id="c1", token_ids=[1] + [3 + i % 300 for i in range(400)], params={"max_tokens": 50}))
    daemon.send(Cancel(request_id="c1"))
    deltas, done = daemon.until_done("c1")
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and not deltas
    assert done.usage["completion_tokens"] == 0


def test_bad_requests_get_errors_and_the_worker_goes_on(daemon):
    daemon.send(Generate(request_id="b1", token_ids=[1, 2], params={"temperature": -1.0}))
    _, err = daemon.until_done("b1")
    assert isinstance(err, Error) and "temperature" in err.message
    daemon.send(Generate(request_id="b2", token_ids=[1, 10**6]))
    _, err = daemon.until_done("b2")
    assert isinstance(err, Error) and "vocabulary" in err.message
    daemon.send([b"\x01\xc1garbage"])
    msg = daemon.recv()
    assert isinstance(msg, Error) and msg.code == "bad_frame"
    daemon.send(Status(request_id="s1"))
    _, err = daemon.until_done("s1")
    assert isinstance(err, Error)
    daemon.send(Generate(request_id="b3", prompt="hello", params={"max_tokens": 2}))
    _, done = daemon.until_done("b3")
    assert isinstance(done, Done)


def test_requests_run_at_once_and_one_cancel_leaves_the_others(daemon):
    """Three requests in three slots: every one streams before any has ended; a CANCEL ends one, the other
    two run to their limit (test_batching.py shows each gets the tokens it gets alone)."""
    params = {"temperature": 0.0, "max_tokens": 60, "ignore_eos": True}
    for i in range(3):
        daemon.send(Generate(request_id=f"m{i}", token_ids=[1, 40 + i, 41, 42, 43 + i], params=params))
    tokens: dict[str, list[int]] = {f"m{i}": [] for i in range(3)}
    ended: dict[str, Message] = {}
    while len(ended) < 3:
        msg = daemon.recv()
        rid = getattr(msg, "request_id", "")
        if isinstance(msg, Delta):
            tokens[rid] += msg.token_ids
            if rid == "m1" and len(tokens[rid]) >= 5:
                daemon.send(Cancel(request_id="m1"))
        elif isinstance(msg, (Done, Error)):
            assert all(tokens.values()), "a request ended before every other had begun"
            ended[rid] = msg
    assert ended["m1"].finish_reason == "cancelled" and 5 <= len(tokens["m1"]) < 60
    for rid in ("m0", "m2"):
        assert ended[rid].finish_reason == "length" and len(tokens[rid]) == 60


def test_a_request_gets_the_context_it_asks_for_up_to_the_workers(daemon):
    """GENERATE's ctx (Ollama's num_ctx): a 10-token prompt in a context of 16 ends with "length" after 7
    tokens (the last sampled one is not run); asked for more than the worker holds (512), it gets 512 and
    DONE says so."""
    params = {"temperature": 0.0, "max_tokens": 50, "ignore_eos": True}
    daemon.send(Generate(request_id="x1", token_ids=[1, *range(60, 69)], params=params, ctx=16))
    _, done = daemon.until_done("x1")
    assert done.finish_reason == "length" and done.usage["completion_tokens"] == 7 and done.usage["ctx"] == 16
    daemon.send(Generate(request_id="x2", token_ids=[1, 70, 71], params={**params, "max_tokens": 3}, ctx=100_000))
    _, done = daemon.until_done("x2")
    assert done.usage["ctx"] == 512 and done.usage["completion_tokens"] == 3
    daemon.send(Generate(request_id="x3", token_ids=[1, *range(60, 79)], params=params, ctx=16))
    _, err = daemon.until_done("x3")
    assert isinstance(err, Error) and "do not fit the context of 16" in err.message


def test_heartbeats_arrive_every_second(daemon):
    start = time.monotonic()
    beats = 0
    while beats < 2:
        if isinstance(daemon.recv(timeout_s=3, skip_heartbeats=False), Heartbeat):
            beats += 1
    assert time.monotonic() - start < 3


def _cuda_error() -> Exception:
    cls = type("CUDARuntimeError", (RuntimeError,), {"__module__": "cupy_backends.cuda.api.runtime"})
    return cls("cudaErrorIllegalAddress: an illegal memory access was encountered")


def _cupy_oom() -> Exception:  # cupy.cuda.memory.OutOfMemoryError is a MemoryError
    cls = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
    return cls("Out of memory allocating 2,147,483,648 bytes")


@pytest.mark.parametrize(
    "exc, fatal, code",
    [
        (ValueError("Probabilities contain NaN"), False, "internal"),
        (_cuda_error(), True, ""),
        (MemoryError(), False, "out_of_memory"),
        (
            type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})("out of memory"),
            False,
            "out_of_memory",
        ),
    ],
)
def test_an_unexpected_error_fails_its_request_and_only_a_device_error_the_worker(tmp_path, exc, fatal, code):
    """A step that raises: its requests fail (`internal`; `out_of_memory` when an allocation failed, on the
    host or the GPU: the OOM guard) and the next request is served, unless the error leaves the device in
    doubt (then the worker dies, for the daemon to start a fresh one)."""
    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Engine
    from genie_workers.worker import Worker, _Turn

    write_tiny_model("llama", tmp_path / "tiny.gguf")
    engine = Engine(EngineOptions(model=str(tmp_path / "tiny.gguf"), backend="numpy", ctx=64, parallel=2))
    sent: list = []
    worker = Worker.__new__(Worker)  # no sockets: what a step's failure does to the requests is under test
    worker.engine, worker.kv, worker.cancelled, worker.stopping = engine, None, {}, False
    worker.turns = {}
    worker.config = type("C", (), {"stream_interval_s": 0.0})()
    worker.send = sent.append  # type: ignore[method-assign]
    assert _Turn  # (the record _submit files each request under)
    run_step = engine.run_step

    def boom(*args):
        engine.run_step = run_step  # once
        raise exc

    engine.run_step = boom  # type: ignore[method-assign]
    worker._submit(Generate(request_id="r1", prompt="hi", params={"max_tokens": 4}))

    def drive() -> None:
        while not engine.scheduler.idle:
            for seq, ev in engine.step():
                worker._on_event(seq, ev)

    if fatal:
        with pytest.raises(type(exc)):
            drive()
        return
    drive()
    assert len(sent) == 1 and isinstance(sent[0], Error)
    assert sent[0].request_id == "r1" and sent[0].code == code
    assert "NaN" in sent[0].message if code == "internal" else "out of memory" in sent[0].message
    worker._submit(Generate(request_id="r2", prompt="hi", params={"max_tokens": 4}))
    drive()
    assert isinstance(sent[-1], Done) and sent[-1].request_id == "r2"


def test_an_output_parser_that_fails_costs_its_answer_the_typing_not_the_worker(monkeypatch):
    """The worker reads the model's markup (output_parser.py) on each answer; should that raise, the answer's
    rest, with what the parser held, goes out as plain content and the worker goes on (a step of the worker
    loop that raised would end the process)."""
    from genie_workers.delta_stream import DeltaStream
    from genie_workers.output_parser import OutputParser
    from genie_workers.worker import Worker, _Turn

    sent: list = []
    parser = OutputParser(["light_on"])
    turn = _Turn(Generate(request_id="r", prompt="x"), DeltaStream("r", sent.append, 0.0), 0, parser)
    worker = Worker.__new__(Worker)
    worker._typed(turn, "Sure. <tool", [1, 2])  # "<tool" is held: it may open a call
    assert [d.text for d in sent] == ["Sure. "]

    def broken(text):
        parser.buf += text
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(parser, "feed", broken)
    worker._typed(turn, "_call>{", [3])
    worker._typed(turn, " and more", [4])
    worker._typed(turn, None, [])
    turn.stream.flush()
    assert turn.parser is None
    assert "".join(d.text for d in sent) == "Sure. <tool_call>{ and more"
    assert [t for d in sent for t in d.token_ids] == [1, 2, 3, 4]


def test_a_message_that_cannot_be_encoded_ends_its_request_not_the_worker():
    """Text msgpack cannot carry (a lone surrogate) in a DELTA: the request gets ERROR(internal) naming why,
    and the worker goes on (an exception from send would have ended it)."""
    from genie_workers.worker import Worker

    frames: list = []
    worker = Worker.__new__(Worker)
    worker.out = type("Sock", (), {"send_multipart": lambda self, f, flags=0: frames.append(f)})()
    worker.stopping = False
    worker.send(Delta(request_id="r", text="bad \udc80 text"))
    worker.send(Delta(request_id="r2", text="fine"))
    first, second = (decode(f)[0] for f in frames)
    assert isinstance(first, Error) and first.request_id == "r" and first.code == "internal"
    assert "could not be sent" in first.message
    assert isinstance(second, Delta) and second.text == "fine"


def test_turns_that_end_together_get_every_done_before_any_save(tmp_path):
    """Two streams ending in the same step: both DONEs go out, then both saves run (a save takes milliseconds
    on a GPU, and the second client waited for the first one's), before the next step can reuse the slots."""
    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Engine
    from genie_workers.worker import Worker

    write_tiny_model("llama", tmp_path / "tiny.gguf")
    engine = Engine(EngineOptions(model=str(tmp_path / "tiny.gguf"), backend="numpy", ctx=64, parallel=2))
    log: list = []

    class Store:  # the KV link: saves and prefill timings, recorded
        def save(self, conv_id, slot):
            log.append(("save", conv_id, slot))

        def observe_prefill(self, n_tokens, seconds):
            pass

        def hydrate(self, *args, **kwargs):
            return 0

    worker = Worker.__new__(Worker)  # no sockets: the order of what a step's ends send and save is under test
    worker.engine, worker.kv, worker.cancelled, worker.stopping = engine, Store(), {}, False
    worker.turns, worker.saves = {}, []
    worker.config = type("C", (), {"stream_interval_s": 0.0})()
    worker.send = log.append  # type: ignore[method-assign]
    for rid in ("a", "b"):
        worker._submit(Generate(request_id=rid, prompt="hi", params={"max_tokens": 3}, conv_id=f"c-{rid}"))
    while not engine.idle:
        for seq, ev in engine.step(prepare=worker._prepare):
            worker._on_event(seq, ev)
        worker._save_ended()
    ends = [m.request_id if isinstance(m, Done) else m[1] for m in log if isinstance(m, (Done, tuple))]
    assert ends == ["a", "b", "c-a", "c-b"]
