"""The daemon: requests from its fronts (the ZMQ client and admin sockets, zmq_fronts.py; HTTP,
http_server.py) sent to the worker as its request queue (request_queue.py) says, the worker's answers relayed to
whoever asked; the worker and the KV store supervised, models loaded and switched."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable
from dataclasses import asdict, replace
from typing import Any

import zmq
import zmq.asyncio

from genie_common.config import DaemonConfig
from genie_common.errors import PullError
from genie_common.models.local import LocalModel
from genie_common.models.pull import PullProgress
from genie_protocol import PROTOCOL_VERSION
from genie_protocol.codec import Frame, decode, encode
from genie_protocol.errors import ProtocolError
from genie_protocol.kv_messages import KvSaveCounts
from genie_protocol.messages import (
    Cancel,
    Dead,
    Delta,
    Done,
    Error,
    Generate,
    Heartbeat,
    Hello,
    Message,
    Metrics,
    Prewarm,
    Ready,
    Reply,
)

from .http_server import HttpFront
from .kv_store_handle import KvStoreHandle
from .metrics import DaemonMetrics
from .model_info import ModelInfo, describe, known_at_once
from .model_store import ModelStore
from .request_queue import ReplyFn, Request, RequestQueue, Switch
from .socket_dir import PRIVATE_SOCKET_MODE, SocketDir
from .worker_handle import WorkerHandle
from .zmq_fronts import ZmqFronts

log = logging.getLogger("genie.daemon")
MAX_CLIENT_MSG_BYTES = 8 << 20
CANCEL_GRACE_S = 1.5  # on SIGTERM, how long a cancelled turn may take to end (a CPU layer is ~50 ms)
UNREACHABLE_RETRY_S = 0.1  # a request the worker's socket did not take is sent again this much later
MAX_EARLY_EXITS = 3  # workers in a row that exit before READY (not with code 2) before the load counts as failed


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        # first: a second daemon on this directory must stop here, before it binds over the first's sockets
        self.socket_dir = SocketDir(config.socket_dir, config.socket_group)
        self.ctx = zmq.asyncio.Context()
        try:
            self.clients = self._bind(config.client_endpoint, self.socket_dir.client_mode)
            # mandatory: a message for a worker whose connection is not there fails at once instead of going
            # nowhere (its request would stay "running" with the worker idle)
            self.workers = self._bind(config.worker_endpoint, mandatory=True)
            self.admin = self._bind(config.admin_endpoint)  # admin calls: the daemon's user only
        except BaseException:
            self.ctx.destroy(linger=0)
            self.socket_dir.release(self._endpoints())
            raise
        self.fronts = ZmqFronts(self, self.clients, self.admin)
        self.worker = WorkerHandle(config)
        self.kv = KvStoreHandle(config, self.ctx) if config.kv_store else None
        self.queue = RequestQueue()
        self._ids = itertools.count(1)
        self.started = time.monotonic()
        self.served = 0
        self.stopping = asyncio.Event()
        self.stop_reason = ""  # what asked it to stop: a signal's name, or genie-ctl stop
        self.wanted = True  # a model should be served (UNLOAD clears it, LOAD sets it)
        self.load_error: str | None = None
        self.recent_tok_s = 0.0  # decode speed of the last finished request
        self._switch: asyncio.Task[None] | None = None
        self._kv_restart: asyncio.Task[None] | None = None
        self._redispatch: asyncio.Task[None] | None = None
        self.metrics = DaemonMetrics()
        self.store = ModelStore(config.models_dir)
        self._model_info = known_at_once(config.model)  # the rest read from the file in a thread (model_info.py)
        # the configured model (genie.toml, -m) stays nameable whatever a request or LOAD loaded since
        self.home_model = config.model
        self._home_info = self._model_info
        self._info_task: asyncio.Task[None] | None = None
        self.http: HttpFront | None = None

    def _bind(self, endpoint: str, mode: int = PRIVATE_SOCKET_MODE, mandatory: bool = False) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_CLIENT_MSG_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, int(mandatory))  # clients: a reply to one gone is dropped
        sock.bind(endpoint)
        self.socket_dir.set_mode(endpoint, mode)
        return sock

    def _endpoints(self) -> list[str]:
        """Every socket of this daemon's, the KV store's included (the store binds it)."""
        c = self.config
        return [c.client_endpoint, c.worker_endpoint, c.admin_endpoint] + ([c.kv_endpoint] if c.kv_store else [])

    # -- replies ------------------------------------------------------------------------------------------
    async def fail(self, req: Request, code: str, message: str) -> None:
        await req.reply(Error(request_id=req.client_rid, code=code, message=message))

    async def kv_metrics(self) -> dict[str, Any]:
        if self.kv is None:
            return {"enabled": False}
        reply = await self.kv.call(Metrics(request_id="kv"), timeout_s=0.5)
        data = reply.data if isinstance(reply, Reply) else {"error": getattr(reply, "message", "no answer")}
        out = {"enabled": True, "pid": self.kv.pid, "restarts": self.kv.restarts, **data}
        if self.worker.kv_saves is not None:  # the daemon's own knowledge: there while the store is down too
            out["worker_saves"] = self.worker.kv_saves.body()
        return out

    def load(self, model: str) -> None:
        """Switches to `model` (or loads it again after an unload); STATUS shows when it is ready."""
        self.wanted = True
        self.load_error = None
        self.worker.config = self.config = replace(self.config, model=model)
        # the old worker takes nothing from now: config.model names the new model, and a request arriving
        # before the switch task stops it would otherwise go to it (a free slot) and run on the old one
        self.worker.mark_lost()
        self._model_info = known_at_once(model)
        self._switch = asyncio.create_task(self._load(self._switch))
        self._refresh_model_info()

    def is_current(self, model: str) -> bool:
        """Whether `model` is what the daemon serves, or is loading, now (a LOAD of it restarts nothing)."""
        return self.wanted and model == self.config.model and self.load_error is None

    async def unload(self, only_if_idle: bool = False) -> None:
        """Stops the worker; queued requests end with ERROR(unloaded). `only_if_idle`: not while another
        request runs or waits (an HTTP client's keep_alive 0 must not cut off the others)."""
        if only_if_idle and not self.queue.is_idle():
            return
        if self.wanted:
            self.wanted = False
            self._switch = asyncio.create_task(self._unload())

    async def ensure_loaded(self, timeout_s: float, model: str | None = None) -> str | None:
        """Loads the model if it was unloaded (an Ollama request does) and waits until it serves; None
        when ready, else why not. `model` (as config.model names it) other than the served one is loaded
        in its place once the requests running and waiting have ended on theirs: one model at a time,
        as Ollama with one loaded model switches."""
        deadline = time.monotonic() + timeout_s
        target = model or self.config.model
        while target != self.config.model or not self.wanted:
            if not self.wanted or self.queue.is_idle():
                self.load(target)
                break
            if self.stopping.is_set():
                return "genie is stopping"
            if time.monotonic() > deadline:
                return f"{target!r} waited {timeout_s:.0f} s for the requests on {self.config.model!r} to end"
            await asyncio.sleep(0.05)
        while not self.worker.ready or (self._switch is not None and not self._switch.done()):
            if self.load_error:
                return self.load_error
            if self.stopping.is_set():
                return "genie is stopping"
            if time.monotonic() > deadline:
                return f"the model did not become ready within {timeout_s:.0f} s"
            await asyncio.sleep(0.05)
        return None

    def model_info(self) -> ModelInfo:
        return self._model_info

    # the models directory, for the HTTP fronts (model_store.py)
    def _fixed_models(self) -> list[ModelInfo]:
        """The served model, and the configured one when another is served."""
        home = [] if self.home_model == self.config.model else [self._home_info]
        return [self._model_info, *home]

    async def list_models(self) -> list[ModelInfo]:
        return await self.store.list_models(self._fixed_models())

    async def find_model(self, name: str) -> ModelInfo | None:
        return await self.store.find_model(self._fixed_models(), name)

    def serves(self, info: ModelInfo) -> bool:
        """Whether `info` is the model loaded (or loading) now."""
        return self.wanted and info.configured == self.config.model

    async def delete_model(self, info: ModelInfo) -> bool:
        """Removes a model of the models directory; False when it was not there. The caller refuses the
        served one (`serves`): a worker restart would fail to load it."""
        return await self.store.delete(info)

    def pull(self, source: str, keepalive_s: float | None = None) -> AsyncGenerator[PullProgress | LocalModel, None]:
        return self.store.pull(source, keepalive_s)

    def _refresh_model_info(self) -> None:
        """Describes the served model from its file, in a thread (it reads the GGUF header)."""

        async def refresh(model: str) -> None:
            info = await asyncio.to_thread(describe, model, self.store.models)
            if model == self.config.model:
                self._model_info = info
            if model == self.home_model:
                self._home_info = info

        self._info_task = asyncio.create_task(refresh(self.config.model))

    async def _load(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None and not previous.done():  # one switch at a time: never two workers
            with contextlib.suppress(Exception):
                await previous
        await self.worker.stop()
        await self._drop_in_flight("model_changed", "another model was loaded during this request")
        if await self._have_model():  # with auto_pull, a catalogue name or a source is pulled first
            await self.worker.start()

    async def _unload(self) -> None:
        for req in self.queue.take_waiting():
            await self.fail(req, "unloaded", "the model was unloaded")
        await self.worker.stop()
        await self._drop_in_flight("unloaded", "the model was unloaded during this request")

    async def submit(self, owner: Hashable, reply: ReplyFn, msg: Generate | Prewarm, model: str | None = None) -> None:
        """Queues a request from any front (ZMQ or HTTP), or refuses it through `reply`. Its answers go
        to `reply`; `cancel(owner, msg.request_id)` ends it. With `model` it runs on that model only
        (loaded for it when it reaches the head of the queue), else on whichever is served."""
        refusal: tuple[str, str] | None = None
        if not self.wanted and model is None:
            refusal = ("unloaded", "no model is loaded (genie-ctl load MODEL)")
        elif self.stopping.is_set():
            refusal = ("shutting_down", "genie is stopping")
        elif self.load_error and model in (None, self.config.model):
            refusal = ("model_unavailable", self.load_error)
        elif self.queue.waiting() >= self.config.max_queue + self._free_slots():
            # max_queue counts the requests that wait: one that takes a free slot at once waits for nothing
            refusal = ("overloaded", f"{self.config.max_queue} requests are already waiting")
        if refusal:
            await reply(Error(request_id=msg.request_id, code=refusal[0], message=refusal[1]))
            return
        if isinstance(msg, Generate) and "max_tokens" not in msg.params:  # no limit asked: still an end
            msg = replace(msg, params={**msg.params, "max_tokens": self.config.max_tokens_default})
        req = Request(owner, reply, msg.request_id, msg, f"q{next(self._ids)}", model)
        self.queue.add(req, req.priority)
        await self.dispatch()

    async def cancel(self, owner: Hashable, rid: str) -> None:
        """Idempotent: a queued request ends at once, one in flight at its next chunk or step."""
        req = self.queue.withdraw(owner, rid)
        if req is not None:
            await req.reply(Done(request_id=rid, finish_reason="cancelled"))
            return
        run = self.queue.find_running(owner, rid)
        if run is not None:
            await self._cancel_in_flight(run)

    async def _cancel_in_flight(self, req: Request) -> None:
        if self.worker.identity:
            await self._to_worker(self.worker.identity, encode(Cancel(request_id=req.internal_id)))

    async def _to_worker(self, identity: bytes, frames: list[Frame]) -> bool:
        """Sends to the worker's inbound socket; False (logged) when its connection is not there (it is
        gone, or a message came before its READY): the caller ends what it sent, nothing waits on it."""
        try:
            await self.workers.send_multipart([identity, *frames])
            return True
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            log.error("event=worker_unreachable pid=%s", self.worker.pid)
            return False

    async def dispatch(self) -> None:
        """Sends the worker what the request queue says may run now, as long as it has a free slot (its READY
        said how many); loads the model the next request names when that is the queue's answer (the
        READY dispatches again). Called whenever a request arrives, ends or a worker is ready."""
        while True:
            identity = self.worker.identity if self.worker.ready else None
            step = self.queue.next(self._slots(), self.config.model if self.wanted else None)
            if isinstance(step, Switch):
                self.load(step.model)
                return
            if step is None:
                return
            assert identity is not None  # without a ready worker there are no slots: next() gives no request
            req = step
            body = req.msg.body()
            body["request_id"] = req.internal_id
            try:  # encoded before it runs: a value msgpack cannot carry fails this request, not the queue
                frames = encode(type(req.msg).from_body(body))
            except (ProtocolError, ValueError, TypeError, OverflowError) as e:
                await self.fail(req, "bad_request", f"the request cannot be encoded: {e}")
                continue
            self.queue.start(req)
            if not await self._to_worker(identity, frames):  # not connected: it waits for the worker
                self.queue.finish(req.internal_id)
                req.runs -= 1  # it never reached one
                self.queue.requeue([req])
                self._dispatch_later(UNREACHABLE_RETRY_S)
                return

    def _dispatch_later(self, delay_s: float) -> None:
        """Dispatches again in `delay_s` (once, however often asked meanwhile): a worker whose connection is
        not there either comes back or is found dead by the supervisor (its exit, its missing heartbeats)."""
        if self._redispatch is None or self._redispatch.done():

            async def later() -> None:
                await asyncio.sleep(delay_s)
                self._redispatch = None  # this dispatch may ask for another
                await self.dispatch()

            self._redispatch = asyncio.create_task(later())

    def _slots(self) -> int:
        """The requests the worker may hold now: its slots once it is ready, none before."""
        return self.worker.capacity if self.worker.ready and self.worker.identity is not None else 0

    def _free_slots(self) -> int:
        return max(0, self._slots() - len(self.queue.running))

    # -- the worker ---------------------------------------------------------------------------------------
    async def worker_loop(self) -> None:
        while True:
            identity, *frames = await self.workers.recv_multipart()
            try:
                msg, _ = decode(frames)
            except ProtocolError as e:
                log.error("event=bad_worker_frame error=%s", e.message)
                continue
            if identity not in self.worker.identities:
                continue  # a previous worker's last words
            if isinstance(msg, Hello) and (msg.protocol_version != PROTOCOL_VERSION or msg.pid != self.worker.pid):
                log.error("event=foreign_worker pid=%s version=%s", msg.pid, msg.protocol_version)
                await self.worker.kill()
                continue
            self.worker.seen()
            try:
                await self.on_worker(msg)
            except Exception:  # one message must never end the loop every answer and heartbeat comes through
                log.exception("event=worker_message_failed type=%s", type(msg).__name__)

    async def on_worker(self, msg: Message) -> None:
        handler = WORKER_HANDLERS.get(type(msg))
        if handler is not None:
            await handler(self, msg)

    async def _on_ready(self, msg: Ready) -> None:
        self.worker.on_ready(msg.body())
        if not self._model_info.digest:  # first start: the worker has just assembled the file
            self._refresh_model_info()
        await self.dispatch()

    async def _on_heartbeat(self, msg: Heartbeat) -> None:
        self.worker.thermal = msg.thermal
        if msg.kv_saves is not None:
            self.worker.kv_saves = KvSaveCounts.from_body(msg.kv_saves)

    async def _on_dead(self, msg: Dead) -> None:
        log.error("event=worker_dead reason=%r", msg.reason)

    async def _on_answer(self, msg: Delta | Done | Error) -> None:
        if msg.request_id in self.queue.running:  # else a request already ended here (cancelled, dropped)
            await self.relay(msg.request_id, msg)

    async def relay(self, internal_id: str, msg: Delta | Done | Error) -> None:
        req = self.queue.running[internal_id]
        body = msg.body()
        body["request_id"] = req.client_rid
        await req.reply(type(msg)(**body))  # checked when it arrived: not again
        req.answered = True
        if isinstance(msg, Done):
            self.metrics.observe_done(msg.finish_reason, msg.usage, msg.timings)
            if msg.timings.get("decode_tok_s"):
                self.recent_tok_s = float(msg.timings["decode_tok_s"])
        elif isinstance(msg, Error):
            self.metrics.observe_error(msg.code)
        if isinstance(msg, (Done, Error)):
            self.queue.finish(internal_id)
            self.served += 1
            await self.dispatch()

    async def supervise_loop(self) -> None:
        if self.kv:
            await self.kv.start()
        if await self._have_model():
            await self.worker.start()
        while True:
            await asyncio.sleep(0.2)
            if self.stopping.is_set():
                return
            if self.kv and not self.kv.is_alive() and (self._kv_restart is None or self._kv_restart.done()):
                self._kv_restart = asyncio.create_task(self.kv.restart())  # its backoff must not hold up the worker
            switching = self._switch is not None and not self._switch.done()
            if switching or not self.wanted or self.load_error or not self.worker.proc or self.worker.is_alive():
                continue
            code = self.worker.proc.returncode
            # exit code 2 before READY: the worker could not load the model, no use retrying; any other
            # exit before READY (killed for memory while loading, a crash) is retried a few times first
            if self.worker.count_exit() and (code == 2 or self.worker.early_exits >= MAX_EARLY_EXITS):
                reason = await self.worker.exit_reason()
                await self._load_failed(f"the worker could not load {self.config.model!r}: {reason}")
                continue
            log.error("event=worker_lost pid=%s returncode=%s", self.worker.pid, code)
            self.worker.mark_lost()  # first: a request that arrives meanwhile waits for the new worker
            await self._run_again_or_fail()
            await self.worker.restart()

    async def _have_model(self) -> bool:
        """With auto_pull, pulls the model to serve (config.model: the configured one at start, a LOAD's
        after) first when it is a source not here yet (a catalogue name, hf://…, a URL); False, with
        load_error saying why, when that fails."""
        model = self.config.model
        if not self.config.auto_pull or not await asyncio.to_thread(self.store.needs_pull, model):
            return True
        try:
            name = await self.store.pull_configured(model)
        except PullError as e:
            log.error("event=pull_failed model=%r error=%r", model, str(e))
            await self._load_failed(f"pulling {model!r} failed: {e}")
            return False
        if name != model:  # a URL or hf:// source: from now on the model is its name in the models directory
            self.worker.config = self.config = replace(self.config, model=name)
            self._model_info = known_at_once(name)
            if self.home_model == model:
                self.home_model, self._home_info = name, self._model_info
        self._refresh_model_info()
        return True

    async def _load_failed(self, error: str) -> None:
        """The served model cannot be loaded: every request waiting for it (those that name no model too)
        ends with ERROR(model_unavailable) saying why, as every new one does (`submit`) until a LOAD; the
        next one, for another model, may then load its own."""
        self.load_error = error
        log.error("event=load_failed model=%r error=%r", self.config.model, error)
        for req in self.queue.take_waiting(self.config.model, also_unnamed=True):
            await self.fail(req, "model_unavailable", error)
        await self.dispatch()

    async def _run_again_or_fail(self) -> None:
        """The worker died under the requests in flight. One whose owner has seen nothing of it yet (no
        DELTA) is run again on the next worker, once: its client sees a slower answer, not an error. One
        that had output, or that a worker died under before, ends with ERROR(worker_died)."""
        again: list[Request] = []
        for req in self.queue.take_running():
            if req.answered or req.runs > 1:
                await self.fail(req, "worker_died", "the worker stopped during this request; it is being restarted")
            else:
                again.append(req)
        if again:
            log.warning("event=requests_run_again n=%d", len(again))
            self.queue.requeue(again)

    async def _drop_in_flight(self, code: str, message: str) -> None:
        """Every request in flight ends with ERROR(code): its worker is gone or going."""
        for req in self.queue.take_running():
            await self.fail(req, code, message)

    def status(self) -> dict[str, Any]:
        return {
            "model": self.worker.info.get("model"),
            "backend": self.worker.info.get("backend"),
            "device": self.worker.info.get("device"),
            "load_ms": self.worker.info.get("load_ms"),  # the serving worker's load (Ollama's load_duration)
            "ctx": self.worker.info.get("ctx"),  # the context its KV slots hold (memory_plan.py sized it)
            "memory": self.worker.info.get("memory"),  # its plan: weights, KV, scratch and budget, MB
            "thermal": self.worker.thermal,  # {temp_c, throttled} from its last heartbeat (workers/thermal.py)
            "ready": self.worker.ready,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "daemon_pid": os.getpid(),
            "worker_pid": self.worker.pid,
            "worker_restarts": self.worker.restarts,
            "kv_store_pid": self.kv.pid if self.kv else None,
            "queue": self.queue.waiting(),
            "running": len(self.queue.running),  # requests in flight on the worker
            "slots": {"in_use": len(self.queue.running), "total": self.worker.capacity},
            "requests_served": self.served,
            "recent_decode_tok_s": round(self.recent_tok_s, 1),
            "loaded_model": self.config.model if self.wanted else None,
            "load_error": self.load_error,
            "pulling": asdict(self.store.progress) if self.store.progress else None,  # auto_pull at start
        }

    # -- lifetime -----------------------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """Asks the daemon to stop (a signal handler's call: it only sets a flag; run() does the rest)."""
        if not self.stopping.is_set():
            self.stop_reason = reason
            self.stopping.set()

    async def run(self) -> None:
        """Serves until `stopping` is set. Raises OSError when the HTTP port cannot be bound."""
        if self.config.http:
            self.http = HttpFront(self)
            await self.http.start()
        loops = [self.fronts.client_loop(), self.fronts.admin_loop(), self.worker_loop(), self.supervise_loop()]
        if self.kv:
            loops.append(self.kv.watch(self.config.kv_store_timeout_s))
        tasks = [asyncio.create_task(t) for t in loops]
        self._refresh_model_info()
        await self.stopping.wait()
        t0 = time.monotonic()
        log.info(
            "event=stopping reason=%s running=%d queued=%d",
            self.stop_reason,
            len(self.queue.running),
            self.queue.waiting(),
        )
        await self.drain()
        for t in tasks:
            t.cancel()
        await self.shutdown()
        log.info("event=shutdown reason=%s took_s=%.2f", self.stop_reason, time.monotonic() - t0)

    async def shutdown(self) -> None:
        """Stops the HTTP server, the worker and then the KV store (which writes the last turn's KV the
        worker handed it), closes the sockets and removes their files. A store waiting out its restart
        backoff is started now: the saves the worker kept for it are handed over as the worker stops."""
        self.store.stop()
        if self.http:
            await self.http.stop()
        if self.kv and not self.kv.is_alive():
            if self._kv_restart is None or self._kv_restart.done():
                self._kv_restart = asyncio.create_task(self.kv.restart())
            self.kv.hurry()
            await self._kv_restart
        await self.worker.stop()
        if self.kv:
            await self.kv.stop()
        for sock in (self.clients, self.workers, self.admin):
            sock.close()
        self.ctx.term()
        self.socket_dir.release(self._endpoints())

    async def drain(self) -> None:
        """SIGTERM: queued requests end as cancelled; those in flight go on for drain_timeout_s (default 0),
        then are cancelled, and their DONE is awaited a bounded time (the worker saves their KV after it)."""
        for req in self.queue.take_waiting():
            await req.reply(Done(request_id=req.client_rid, finish_reason="cancelled"))
        running = self.queue.running
        deadline = time.monotonic() + self.config.drain_timeout_s
        while running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if running:
            for req in list(running.values()):
                await self._cancel_in_flight(req)
            end = time.monotonic() + CANCEL_GRACE_S
            while running and time.monotonic() < end:
                await asyncio.sleep(0.02)
            # the worker did not answer a cancel: the client still gets an end
            await self._drop_in_flight("shutting_down", "genie stopped during this request")


# what each message from a worker is handled by (HELLO is checked as it arrives: worker_loop)
WORKER_HANDLERS: dict[type[Message], Callable[[Daemon, Any], Awaitable[None]]] = {
    Ready: Daemon._on_ready,
    Heartbeat: Daemon._on_heartbeat,
    Dead: Daemon._on_dead,
    Delta: Daemon._on_answer,
    Done: Daemon._on_answer,
    Error: Daemon._on_answer,
}
