"""The request queue's decisions (request_queue.py): what the worker gets next, how many at once, when a model
switch may happen. tests/genie_daemon/test_slots.py drives them through the daemon's sockets."""

from __future__ import annotations

import itertools

from genie_daemon.request_queue import Request, RequestQueue, Switch
from genie_protocol.messages import Generate

_ids = itertools.count()


def req(rid: str, owner: str = "a", model: str | None = None) -> Request:
    async def reply(msg: object) -> None:
        raise AssertionError("the queue never answers")

    return Request(owner, reply, rid, Generate(request_id=rid, prompt="x"), f"q{next(_ids)}", model)


def started(s: RequestQueue, slots: int, served: str | None = "m") -> list[str]:
    """Takes what `next` gives, as the daemon's dispatch does, until it gives no request."""
    out = []
    while isinstance(step := s.next(slots, served), Request):
        s.start(step)
        out.append(step.client_rid)
    return out


def test_voice_before_background_each_in_arrival_order_up_to_the_slots():
    s = RequestQueue()
    for rid, priority in (("b1", "background"), ("v1", "voice"), ("b2", "background"), ("v2", "voice")):
        s.add(req(rid), priority)
    assert started(s, 3) == ["v1", "v2", "b1"]
    assert len(s.running) == 3 and s.waiting() == 1 and not s.is_idle()
    assert started(s, 3) == []  # every slot taken
    done = s.finish(next(iter(s.running)))
    assert done is not None and done.client_rid == "v1"
    assert started(s, 3) == ["b2"] and s.waiting() == 0


def test_no_slot_while_no_worker_is_ready():
    s = RequestQueue()
    s.add(req("v1"), "voice")
    assert s.next(0, "m") is None and s.waiting() == 1


def test_another_model_is_loaded_only_when_nothing_is_in_flight_and_blocks_those_behind():
    """The worker runs one model: a request naming another waits for the requests in flight on the old
    one, and those queued behind it wait too (queue order), even with slots free."""
    s = RequestQueue()
    s.add(req("v1"), "voice")
    s.add(req("other", model="n"), "voice")
    s.add(req("v3"), "voice")
    assert started(s, 4) == ["v1"]
    assert s.next(4, "m") is None  # v1 still runs on m
    s.finish(next(iter(s.running)))
    assert s.next(4, "m") == Switch("n")
    assert started(s, 4, served="n") == ["other", "v3"]  # a request that names no model runs on any


def test_after_an_unload_a_request_naming_a_model_loads_it():
    s = RequestQueue()
    s.add(req("v1", model="m"), "voice")
    assert s.next(1, None) == Switch("m")


def test_withdraw_find_and_take():
    s = RequestQueue()
    s.add(req("x", owner="a"), "voice")
    s.add(req("x", owner="b", model="n"), "background")
    s.add(req("y", owner="a", model="n"), "voice")
    assert s.withdraw("b", "y") is None
    taken = s.withdraw("b", "x")
    assert taken is not None and taken.owner == "b" and s.waiting() == 2
    assert [r.client_rid for r in s.take_waiting("n")] == ["y"] and s.waiting() == 1
    assert started(s, 2) == ["x"] and s.find_running("a", "x") is not None and s.find_running("b", "x") is None
    assert [r.client_rid for r in s.take_running()] == ["x"] and s.is_idle()
    assert s.finish("q-unknown") is None
