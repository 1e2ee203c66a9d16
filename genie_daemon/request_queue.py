"""What the worker runs next: the requests waiting (voice ahead of background, each queue in arrival order)
and those in flight on the worker, at most one per KV slot it has. It decides; the daemon (server.py)
sends, answers and loads models."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from genie_protocol.messages import PRIORITIES, Generate, Message, Prewarm, Priority

ReplyFn = Callable[[Message], Awaitable[None]]


@dataclass
class Request:
    owner: Hashable  # who asked: a ZMQ client's ROUTER identity, or an HTTP request's token
    reply: ReplyFn  # sends this request's DELTA / DONE / ERROR to its owner
    client_rid: str
    msg: Generate | Prewarm
    internal_id: str  # what the worker sees: unique across clients
    model: str | None = None  # the model it must run on (an HTTP request names one); None: the one served
    queued_at: float = field(default_factory=time.monotonic)
    answered: bool = False  # a DELTA of it has reached its owner: it cannot be run again unseen
    runs: int = 0  # times it was sent to a worker

    @property
    def priority(self) -> Priority:
        return self.msg.priority


@dataclass(frozen=True)
class Switch:
    """The next request must run on `model`, which is not served, and nothing is in flight: load it."""

    model: str


class RequestQueue:
    def __init__(self) -> None:
        self.queues: dict[Priority, deque[Request]] = {p: deque() for p in PRIORITIES}
        self.running: dict[str, Request] = {}  # in flight on the worker, by internal id

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def is_idle(self) -> bool:
        """Nothing in flight and nothing waiting."""
        return not self.running and not self.waiting()

    def add(self, req: Request, priority: Priority) -> None:
        self.queues[priority].append(req)

    def next(self, slots: int, served: str | None) -> Request | Switch | None:
        """What to do now. `slots`: the requests the worker may hold at once (0 while none is ready);
        `served`: the model loaded (None after an unload). The first waiting request, taken from its
        queue, when a slot is free and it may run on the served model (the caller then `start`s it);
        a Switch when it names another model and nothing is in flight (the worker runs one model, so
        the switch waits for every request in flight on the old one to end, and the requests behind it
        wait for the switch: queue order is kept); else None."""
        queue = next((q for q in self.queues.values() if q), None)
        if queue is None:
            return None
        head = queue[0]
        if head.model is not None and head.model != served:
            return None if self.running else Switch(head.model)
        if len(self.running) >= slots:
            return None
        return queue.popleft()

    def start(self, req: Request) -> None:
        req.runs += 1
        self.running[req.internal_id] = req

    def requeue(self, reqs: list[Request]) -> None:
        """Puts requests taken from a worker back at the head of their queues, in the order given (they were
        waiting before any that still wait)."""
        for req in reversed(reqs):
            self.queues[req.priority].appendleft(req)

    def finish(self, internal_id: str) -> Request | None:
        return self.running.pop(internal_id, None)

    def withdraw(self, owner: Hashable, client_rid: str) -> Request | None:
        """Takes a waiting request out of its queue; None when `owner` has none of that id waiting."""
        for q in self.queues.values():
            for req in q:
                if req.owner == owner and req.client_rid == client_rid:
                    q.remove(req)
                    return req
        return None

    def find_running(self, owner: Hashable, client_rid: str) -> Request | None:
        return next((r for r in self.running.values() if r.owner == owner and r.client_rid == client_rid), None)

    def take_waiting(self, model: str | None = None, also_unnamed: bool = False) -> list[Request]:
        """Empties the queues (with `model`: of the requests that must run on it only, and with
        `also_unnamed` those that may run on whichever is served too), in serving order."""
        taken: list[Request] = []
        for q in self.queues.values():
            mine = [r for r in q if model is None or r.model == model or (also_unnamed and r.model is None)]
            for req in mine:
                q.remove(req)
            taken += mine
        return taken

    def take_running(self) -> list[Request]:
        """Every request in flight, no longer counted as such (its worker is gone or going)."""
        taken = list(self.running.values())
        self.running.clear()
        return taken
