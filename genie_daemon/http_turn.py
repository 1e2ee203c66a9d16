"""What the HTTP fronts share: the service they call, typed reading of request fields (the body itself:
http_body.py), their errors, and one generation (`Turn`) submitted like any ZMQ client's and cancelled
when its HTTP client goes away."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from genie_common.config import DaemonConfig
from genie_common.events import Event, Piece, ToolCall
from genie_common.models.local import LocalModel
from genie_common.models.pull import PullProgress
from genie_protocol.codec import encode
from genie_protocol.errors import ProtocolError
from genie_protocol.messages import PARAMS, Delta, Done, Error, Generate, Message

from .metrics import DaemonMetrics
from .model_info import ModelInfo


class Service(Protocol):
    """What the HTTP fronts need from the daemon (tests serve them from a scripted stand-in)."""

    config: DaemonConfig
    metrics: DaemonMetrics

    async def submit(self, owner: Any, reply: Any, msg: Generate, model: str | None = None) -> None: ...
    async def cancel(self, owner: Any, rid: str) -> None: ...
    def status(self) -> dict[str, Any]: ...
    async def kv_metrics(self) -> dict[str, Any]: ...
    def model_info(self) -> ModelInfo: ...
    async def list_models(self) -> list[ModelInfo]: ...
    async def find_model(self, name: str) -> ModelInfo | None: ...
    def serves(self, info: ModelInfo) -> bool: ...
    async def delete_model(self, info: ModelInfo) -> bool: ...
    def pull(
        self, source: str, keepalive_s: float | None = None
    ) -> AsyncGenerator[PullProgress | LocalModel, None]: ...
    async def ensure_loaded(self, timeout_s: float, model: str | None = None) -> str | None: ...
    async def unload(self, only_if_idle: bool = False) -> None: ...


SERVICE: web.AppKey[Any] = web.AppKey("genie_service")


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (one NDJSON line or SSE payload)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class HttpError(Exception):
    """A request the API refuses: its HTTP status, a message for the client, a code where the refusal has
    one of its own (model_not_found, overloaded, ...; OpenAI's `code`) and the request's field it is about,
    as the API names it (OpenAI's `param`)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


# daemon ERROR codes -> HTTP status (anything else: 500)
ERROR_STATUS = {
    "bad_request": 400,
    "bad_message": 400,
    "too_large": 413,
    "overloaded": 503,
    "unloaded": 503,
    "shutting_down": 503,
    "worker_died": 503,
    "worker_unreachable": 503,
    "model_changed": 503,
    "not_ready": 503,
    "model_unavailable": 503,
}


def error_status(err: Error) -> int:
    return ERROR_STATUS.get(err.code, 500)


def param(body: dict[str, Any], key: str, name: str, where: str = "") -> Any:
    """body[key] as GENERATE's sampling field `name` takes it (its kind from genie_protocol.messages.PARAMS, where each
    field is declared once; a float field takes any finite JSON number); absent or null: None."""
    kind = PARAMS[name].kind
    return get(body, key, "number" if kind == "float" else kind, where=where)


def get(body: dict[str, Any], key: str, kind: str, default: Any = None, where: str = "") -> Any:
    """body[key] checked against `kind` (str, bool, int, number, list, dict); absent or null: default."""
    value = body.get(key)
    if value is None:
        return default
    name = f"{where}{key}"
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if kind == "list" and isinstance(value, list):
        return value
    if kind == "dict" and isinstance(value, dict):
        return value
    article = "an" if kind[0] in "aeiou" else "a"
    raise HttpError(400, f"{name} must be {article} {kind}", param=name)


def stop_list(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value] if value else None
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s] or None
    raise HttpError(400, f"{name} must be a string or a list of strings", param=name)


def model_name(body: dict[str, Any]) -> str:
    """The request's `model` (Ollama's older `name` too), or a 400."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise HttpError(400, "model is required and must be a string", param="model")
    return name


async def check_model(service: Service, name: Any) -> ModelInfo:
    """The model `name` addresses: the served one, or one of the models directory (which a request then
    loads); else 404, as Ollama answers a model it has not pulled."""
    if not isinstance(name, str) or not name:
        raise HttpError(400, "model is required and must be a string", param="model")
    info = await service.find_model(name)
    if info is None:
        served = service.model_info().name
        message = f"model {name!r} not found, try pulling it first (genie serves {served!r})"
        raise HttpError(404, message, "model_not_found", "model")
    return info


def refuse_unsupported(info: ModelInfo, model: str, asked: dict[str, str]) -> None:
    """A 400 when the request asks the model for what it cannot do, as Ollama refuses it (`"qwen2.5"
    does not support thinking`), rather than answer as if it had not asked: `asked` maps each capability
    the request wants (tools, thinking) to the request's field that asks for it."""
    for capability, param in asked.items():
        if info.lacks(capability):
            message = f"{json.dumps(model)} does not support {capability}"
            raise HttpError(400, message, "unsupported_parameter", param)


def build_generate(fields: dict[str, Any], names: dict[str, str]) -> Generate:
    """A GENERATE checked by the same rules as one from the ZMQ socket; their failure is a 400 that names
    the field as the API does: `names` maps GENERATE's fields (`params.top_p`, `ctx`) to the API's
    (`options.top_p`, `options.num_ctx`); a field it does not list has the same name in both."""
    try:
        msg = Generate.from_body({"request_id": f"http-{next(_ids)}", **fields})
        encode(msg)  # what msgpack cannot carry (an integer past 64 bits, a lone surrogate) is refused here
    except ProtocolError as e:
        if not e.field:
            raise HttpError(400, e.message) from None
        name = names.get(e.field, e.field)
        gap = "" if e.problem.startswith("[") else " "  # messages[3].content, not messages [3].content
        raise HttpError(400, f"{name}{gap}{e.problem}", param=name) from None
    except (ValueError, TypeError, OverflowError) as e:
        raise HttpError(400, f"the request holds a value that cannot be sent: {e}") from None
    assert isinstance(msg, Generate)
    return msg


_ids = itertools.count(1)
LOAD_TIMEOUT_S = 300.0  # how long a request waits for the model to (re)load


async def ensure_ready(service: Service, info: ModelInfo) -> None:
    """Ollama's load request (no messages): loads `info` if it is not served (in place of the one that is,
    once the requests running and waiting have ended, or after an unload) and waits until it serves, or a
    503 saying why not. A generation needs none of this: its Turn carries its model, which the daemon's
    queue loads when the request's turn comes."""
    problem = await service.ensure_loaded(LOAD_TIMEOUT_S, info.configured or None)
    if problem:
        raise HttpError(503, problem, "not_ready")


class Turn:
    """One generation for an HTTP request. Leaving the `async with` before DONE or ERROR (the client went
    away, or the handler failed) cancels it: a queued request ends at once, a running one at its next
    prefill chunk or decode step. It runs on `model` (config.model's form) only: the daemon loads it when
    the request reaches the head of its queue, if another is served (or none, after an unload); a model
    that fails to load ends it with ERROR(model_unavailable), a 503."""

    def __init__(self, service: Service, msg: Generate, model: str | None = None) -> None:
        self.service = service
        self.msg = msg
        self.model = model
        self.owner = object()
        self.events: asyncio.Queue[Message] = asyncio.Queue()
        self.ended = False

    async def __aenter__(self) -> Turn:
        await self.service.submit(self.owner, self.events.put, self.msg, self.model)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.ended:
            await asyncio.shield(self.service.cancel(self.owner, self.msg.request_id))

    async def stream(self) -> AsyncIterator[Delta | Done | Error]:
        while not self.ended:
            ev = await self.events.get()
            if isinstance(ev, (Done, Error)):
                self.ended = True
            if isinstance(ev, (Delta, Done, Error)):
                yield ev

    async def parsed(self) -> AsyncIterator[Event | Done | Error]:
        """The stream as content, reasoning and tool calls: the worker read the model's markup and sent them
        typed (DELTA's kind and tool_calls), so nothing here knows a model family."""
        async for ev in self.stream():
            if isinstance(ev, Delta):
                if ev.text:
                    yield Piece(ev.kind, ev.text)
                for call in ev.tool_calls or ():
                    yield ToolCall(call["name"], call["arguments"])
            else:
                yield ev


async def first_then_rest(events: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
    """The first event and an iterator over all. An ERROR first, or a DONE that ended the request
    before any output (cancelled by the daemon: shutdown, unload), is answered with its HTTP status."""
    it = aiter(events)
    first = await anext(it)
    if isinstance(first, Error):
        raise HttpError(error_status(first), first.message, first.code)
    if isinstance(first, Done) and first.finish_reason == "cancelled":
        raise HttpError(
            503, "the request was cancelled before it produced output (genie is stopping or unloading)", "not_ready"
        )

    async def chain() -> AsyncIterator[Any]:
        yield first
        async for ev in it:
            yield ev

    return first, chain()


@dataclass
class Answer:
    """A whole (not streamed) answer: its text, reasoning and tool calls, and the DONE that ended it."""

    content: str
    thinking: str
    calls: list[ToolCall]
    done: Done


async def gather(events: AsyncIterator[Any]) -> Answer:
    """Collects a parsed stream; an ERROR becomes the HttpError of its code."""
    content: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    async for ev in events:
        if isinstance(ev, Error):
            raise HttpError(error_status(ev), ev.message, ev.code)
        if isinstance(ev, Done):
            return Answer("".join(content), "".join(thinking), calls, ev)
        if isinstance(ev, ToolCall):
            calls.append(ev)
        elif ev.kind == "thinking":
            thinking.append(ev.text)
        else:
            content.append(ev.text)
    raise HttpError(503, "the request ended without an answer", "not_ready")


def check_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tool definitions ({type: function, function: {name, ...}}), None when it has none."""
    tools = get(body, "tools", "list")
    if not tools:
        return None
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise HttpError(400, f"tools[{i}] must be {{type: function, function: {{name, ...}}}}", param="tools")
    return tools


def tool_call_in(call: Any, where: str) -> dict[str, Any]:
    """An assistant message's earlier tool call, for the chat template: {function: {name, arguments}} with
    arguments an object (Ollama) or a JSON object string (OpenAI); an OpenAI `id` is kept."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise HttpError(400, f"{where} must be {{function: {{name, arguments}}}}", param="messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            raise HttpError(400, f"{where}.function.arguments must be a JSON object string", param="messages") from None
    if not isinstance(args, dict):
        raise HttpError(400, f"{where}.function.arguments must be a JSON object", param="messages")
    out: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out
