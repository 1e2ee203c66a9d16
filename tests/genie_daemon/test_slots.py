"""The daemon's side of issue 17 against a worker this test plays on the daemon's own worker socket: how
many requests the worker is sent at once (its READY's parallel) and in which order, and what a cancel,
a lost worker, a model switch and SIGTERM's drain do with several in flight. test_parallel_live.py drives
the real worker."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import zmq
import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_daemon.server import CANCEL_GRACE_S, Daemon
from genie_daemon.worker_handle import WorkerHandle
from genie_protocol.codec import decode, encode
from genie_protocol.messages import Cancel, Delta, Done, Error, Generate, Heartbeat, Message, Ready, worker_identities

FIRST_PID = 4_000_000  # past any real pid: nothing is ever signalled


class PlayedWorker(WorkerHandle):
    """The daemon's handle on the worker the test plays: start() spawns nothing, it names the identities
    the test's sockets take (a new pid each start); the process is a stand-in whose exit the test decides."""

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config)
        self.starts = 0

    async def start(self) -> None:
        self.ready = self.served = False
        self.proc = SimpleNamespace(pid=FIRST_PID + self.starts, returncode=None)
        self.starts += 1
        self.identities = worker_identities(self.proc.pid)
        self.identity = self.identities[0]
        self.last_seen = time.monotonic()

    async def kill(self) -> None:
        self.mark_lost()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.returncode = -9

    async def stop(self, timeout_s: float = 10.0) -> None:
        await self.kill()


class Rig:
    """A daemon (no HTTP, no KV store) serving model `m1`, whose worker the test plays: `sent()` is what
    the daemon sent the worker, `answer()` what the worker says back, `ask()` a client's request."""

    def __init__(self, tmp: Path, slots: int, **options: Any) -> None:
        self.slots = slots
        self.config = DaemonConfig(
            model="m1",
            socket_dir=str(tmp / "run"),
            models_dir=str(tmp / "models"),
            kv_store=False,
            http=False,
            heartbeat_timeout_s=60.0,  # the played worker sends no heartbeats of its own
            restart_backoff_s=0.01,
            **options,
        )
        self.ctx = zmq.asyncio.Context()
        self.sockets: list[zmq.asyncio.Socket] = []
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Rig:
        self.daemon = Daemon(self.config)
        self.worker = self.daemon.worker = PlayedWorker(self.config)
        self.task = asyncio.create_task(self.daemon.run())
        await self.worker_ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.daemon.stopping.set()
        await asyncio.wait_for(self.task, 10)
        for sock in self.sockets:
            sock.close(linger=0)
        self.ctx.term()

    async def until(self, check: Any, what: str, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
            await asyncio.sleep(0.01)

    async def worker_ready(self, starts: int = 1, model: str = "m1") -> None:
        """The `starts`-th worker connects its two sockets as workers/worker.py does and says READY through
        the inbound one (the one the daemon then sends to)."""
        await self.until(lambda: self.worker.starts == starts, f"worker start {starts}")
        inbound, outbound = (self._dealer(identity) for identity in self.worker.identities)
        self.inbound, self.outbound = inbound, outbound
        ready = Ready(model=model, ctx=512, parallel=self.slots, backend="numpy", device="cpu", load_ms=1.0)
        await inbound.send_multipart(encode(ready))
        await self.until(lambda: self.worker.ready, "READY")

    def _dealer(self, identity: bytes) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(self.config.worker_endpoint)
        self.sockets.append(sock)
        return sock

    async def answer(self, msg: Message) -> None:
        await self.outbound.send_multipart(encode(msg))

    async def sent(self, timeout_s: float = 5.0) -> Message:
        frames = await asyncio.wait_for(self.inbound.recv_multipart(), timeout_s)
        return decode(frames)[0]

    async def nothing_sent(self, for_s: float = 0.3) -> bool:
        return not await self.inbound.poll(int(for_s * 1000))

    async def ask(self, rid: str, priority: str = "voice", model: str | None = None) -> asyncio.Queue[Message]:
        """A client's GENERATE; its answers arrive in the queue returned."""
        answers: asyncio.Queue[Message] = asyncio.Queue()
        msg = Generate(request_id=rid, prompt=f"say {rid}", priority=priority)
        await self.daemon.submit("client", answers.put, msg, model)
        return answers


async def next_answer(answers: asyncio.Queue[Message]) -> Message:
    return await asyncio.wait_for(answers.get(), 5)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_worker_gets_as_many_requests_as_it_has_slots_and_the_rest_wait(tmp_path):
    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            a, b, c = [await rig.ask(rid) for rid in "abc"]
            first, second = await rig.sent(), await rig.sent()
            assert isinstance(first, Generate) and isinstance(second, Generate)
            assert [first.prompt, second.prompt] == ["say a", "say b"]
            assert await rig.nothing_sent(), "a third request went to a worker with two slots"
            status = rig.daemon.status()
            assert status["running"] == 2 and status["queue"] == 1
            assert status["slots"] == {"in_use": 2, "total": 2}
            # answers come back interleaved, each under its client's own id
            await rig.answer(Delta(request_id=second.request_id, text="B"))
            await rig.answer(Delta(request_id=first.request_id, text="A"))
            got_b, got_a = await next_answer(b), await next_answer(a)
            assert (got_a.request_id, got_a.text, got_b.request_id, got_b.text) == ("a", "A", "b", "B")
            await rig.answer(Done(request_id=first.request_id, finish_reason="stop"))
            assert isinstance(await next_answer(a), Done)
            third = await rig.sent()  # a slot freed: the waiting request goes at once
            assert isinstance(third, Generate) and third.prompt == "say c"
            assert rig.daemon.status()["slots"] == {"in_use": 2, "total": 2} and rig.daemon.status()["queue"] == 0
            await rig.answer(Error(request_id=second.request_id, code="internal", message="boom"))
            await rig.answer(Done(request_id=third.request_id, finish_reason="length"))
            assert isinstance(await next_answer(b), Error) and isinstance(await next_answer(c), Done)
            status = rig.daemon.status()
            assert status["running"] == 0 and status["slots"]["in_use"] == 0 and status["requests_served"] == 3

    run(go())


def test_max_queue_counts_only_the_requests_that_wait(tmp_path):
    """With max_queue 0 every request that finds a free slot runs, and the one that would wait is refused
    (it refused them all: the queue bound was counted before a free slot took the new request)."""

    async def go() -> None:
        async with Rig(tmp_path, slots=2, max_queue=0) as rig:
            await rig.ask("a")
            await rig.ask("b")
            c = await rig.ask("c")
            refused = await next_answer(c)
            assert isinstance(refused, Error) and refused.code == "overloaded"
            first, second = await rig.sent(), await rig.sent()
            assert isinstance(first, Generate) and isinstance(second, Generate) and await rig.nothing_sent()
            await rig.answer(Done(request_id=first.request_id, finish_reason="stop"))
            await rig.until(lambda: rig.daemon.status()["running"] == 1, "a slot freed")
            await rig.ask("d")  # takes the free slot
            assert isinstance(await rig.sent(), Generate)

    run(go())


def test_voice_requests_take_a_free_slot_before_background_ones(tmp_path):
    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            await rig.ask("v0")
            await rig.ask("v1")
            in_flight = [await rig.sent(), await rig.sent()]
            for rid, priority in (("b1", "background"), ("v2", "voice"), ("b2", "background"), ("v3", "voice")):
                await rig.ask(rid, priority)
            order = []
            for msg in in_flight:
                await rig.answer(Done(request_id=msg.request_id, finish_reason="stop"))
            for _ in range(4):
                msg = await rig.sent()
                assert isinstance(msg, Generate)
                order.append(msg.prompt.removeprefix("say "))
                if len(order) >= 2:
                    await rig.answer(Done(request_id=msg.request_id, finish_reason="stop"))
            assert order == ["v2", "v3", "b1", "b2"]

    run(go())


def test_a_worker_that_says_no_capacity_gets_one_request_at_a_time(tmp_path):
    """parallel 0 (or a worker that never said) counts as one slot, never as none."""

    async def go() -> None:
        async with Rig(tmp_path, slots=0) as rig:
            await rig.ask("a")
            await rig.ask("b")
            assert isinstance(await rig.sent(), Generate) and await rig.nothing_sent()
            assert rig.daemon.status()["slots"] == {"in_use": 1, "total": 1}

    run(go())


def test_a_cancel_reaches_only_the_request_it_names(tmp_path):
    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            await rig.ask("a")
            b = await rig.ask("b")
            first, second = await rig.sent(), await rig.sent()
            await rig.daemon.cancel("client", "b")
            cancel = await rig.sent()
            assert isinstance(cancel, Cancel) and cancel.request_id == second.request_id != first.request_id
            assert await rig.nothing_sent()
            await rig.answer(Done(request_id=second.request_id, finish_reason="cancelled"))
            done = await next_answer(b)
            assert isinstance(done, Done) and done.finish_reason == "cancelled"
            assert rig.daemon.status()["running"] == 1  # a goes on

    run(go())


def test_a_lost_worker_runs_again_what_had_no_answer_and_ends_what_had(tmp_path):
    """Of the requests in flight on a worker that died, one that had a DELTA ends with worker_died; one
    that had none runs again on the next worker, ahead of the one that was waiting (issue 34 item 5)."""

    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            a, b, c = [await rig.ask(rid) for rid in "abc"]
            first = await rig.sent()
            await rig.sent()
            await rig.answer(Delta(request_id=first.request_id, text="x"))
            assert isinstance(await next_answer(a), Delta)
            rig.worker.proc.returncode = -9  # the worker died
            err = await next_answer(a)
            assert isinstance(err, Error) and err.code == "worker_died"
            await rig.until(lambda: rig.daemon.status()["queue"] == 2, "b back in the queue")
            assert b.empty() and c.empty()
            await rig.worker_ready(starts=2)
            again = [await rig.sent(), await rig.sent()]
            assert [m.prompt for m in again if isinstance(m, Generate)] == ["say b", "say c"]

    run(go())


def test_another_model_is_loaded_once_every_request_in_flight_has_ended(tmp_path):
    """The worker runs one model: a request naming another waits for both requests in flight on the
    served one, and the request behind it waits for the switch (queue order)."""

    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            await rig.ask("a")
            await rig.ask("b")
            first, second = await rig.sent(), await rig.sent()
            await rig.ask("other", model="m2")
            await rig.ask("d")
            await rig.answer(Done(request_id=first.request_id, finish_reason="stop"))
            assert await rig.nothing_sent() and rig.worker.starts == 1 and rig.daemon.config.model == "m1"
            await rig.answer(Done(request_id=second.request_id, finish_reason="stop"))
            await rig.worker_ready(starts=2, model="m2")
            assert rig.daemon.config.model == "m2"
            sent = [await rig.sent(), await rig.sent()]
            assert [m.prompt for m in sent if isinstance(m, Generate)] == ["say other", "say d"]

    run(go())


def test_sigterm_cancels_every_request_in_flight(tmp_path):
    """Drain: the waiting request ends as cancelled at once, each one in flight gets a CANCEL; one the
    worker does not end within the grace time still gets an end."""

    async def go() -> None:
        rig = Rig(tmp_path, slots=2)
        async with rig:
            a, b, c = [await rig.ask(rid) for rid in "abc"]
            first, second = await rig.sent(), await rig.sent()
            rig.daemon.stopping.set()
            done = await next_answer(c)
            assert isinstance(done, Done) and done.finish_reason == "cancelled"
            cancels = {(await rig.sent()).request_id, (await rig.sent()).request_id}
            assert cancels == {first.request_id, second.request_id}
            await rig.answer(Done(request_id=first.request_id, finish_reason="cancelled"))
            t0 = time.monotonic()
            ended = await asyncio.wait_for(b.get(), CANCEL_GRACE_S + 5)
            assert isinstance(ended, Error) and ended.code == "shutting_down"
            assert time.monotonic() - t0 < CANCEL_GRACE_S + 1
            assert isinstance(await next_answer(a), Done)

    run(go())


def test_a_request_after_a_switch_was_decided_goes_to_the_new_worker(tmp_path):
    """Once a switch is decided the old worker takes nothing more: a request that arrived before the
    switch had stopped it went to it, to run on the model being replaced."""

    async def go() -> None:
        async with Rig(tmp_path, slots=2) as rig:
            rig.daemon.load("m2")
            await rig.ask("x")
            assert await rig.nothing_sent(), "sent to the worker of the model being replaced"
            assert not rig.daemon.status()["ready"]
            await rig.worker_ready(starts=2, model="m2")
            msg = await rig.sent()
            assert isinstance(msg, Generate) and msg.prompt == "say x"

    run(go())


def test_a_request_the_worker_cannot_be_sent_waits_for_it_not_running_for_ever(tmp_path):
    """The worker's inbound connection is gone while it still counts as ready (a crash not yet noticed, or
    a READY that overtook that connection): the request sent it is not counted as running (it once stayed
    "running" with the worker idle and the client waiting for ever) nor failed (issue 34 item 5: it had no
    answer yet), but waits, and is sent again once the worker is connected again (or a new one is ready)."""

    async def go() -> None:
        async with Rig(tmp_path, slots=1) as rig:
            rig.inbound.close(linger=0)
            await asyncio.sleep(0.3)  # the ROUTER notices the disconnect
            lost = await rig.ask("lost")
            await asyncio.sleep(0.3)
            assert lost.empty() and not rig.daemon.queue.running and rig.daemon.status()["queue"] == 1
            rig.inbound = rig._dealer(rig.worker.identities[0])
            await rig.inbound.send_multipart(encode(Heartbeat(seq=1)))
            sent = await rig.sent()
            assert isinstance(sent, Generate) and sent.prompt == "say lost"
            await rig.answer(Done(request_id=sent.request_id, finish_reason="stop"))
            done = await next_answer(lost)
            assert isinstance(done, Done) and done.finish_reason == "stop"

    run(go())
