"""Ollama's HTTP API, as Home Assistant's Ollama integration and the `ollama` client library use it.

Streams are NDJSON, one object a line: `message.content` (chat) or `response` (generate) deltas,
`message.thinking` for reasoning, each tool call whole in one line with `arguments` as an object, and a
last line with `done: true`, `done_reason`, the token counts and the durations in nanoseconds. As in
Ollama, `prompt_eval_count` counts the prompt tokens evaluated; genie adds `cached_tokens`, the prompt
tokens its KV already held (resident or hydrated from the KV store).

Models are Ollama's too: /api/tags lists the served model and the models directory, a request naming one
of its models loads it in place of the served one, /api/pull streams a pull's progress in Ollama's status
lines (pull_relay.py) and /api/delete removes a pulled model.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aiohttp import web

from genie_common.errors import PullError
from genie_common.events import Piece, ToolCall
from genie_common.models.local import LocalModel
from genie_common.models.pull import PullProgress
from genie_common.models.sources import parse_source
from genie_protocol.messages import Done, Error

from .http_body import read_json
from .http_turn import (
    SERVICE,
    HttpError,
    Service,
    Turn,
    build_generate,
    check_model,
    check_tools,
    dumps,
    ensure_ready,
    first_then_rest,
    gather,
    get,
    model_name,
    param,
    refuse_unsupported,
    stop_list,
    tool_call_in,
)
from .load_report import LoadReport
from .model_info import ModelInfo, iso_time

VERSION = "0.12.0"  # the Ollama API version whose endpoints and fields genie implements
NS = 1_000_000  # ms -> ns
LOAD_REPORT: web.AppKey[LoadReport] = web.AppKey("ollama_load_report")


def add_routes(app: web.Application) -> None:
    app[LOAD_REPORT] = LoadReport()
    app.router.add_get("/", root)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_post("/api/pull", pull)
    app.router.add_delete("/api/delete", delete)


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running (genie)")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


def _details(info: ModelInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.family,
        "families": [info.family] if info.family else [],
        "parameter_size": info.parameter_size,
        "quantization_level": info.quantization,
    }


def _entry(info: ModelInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "model": info.name,
        "modified_at": iso_time(info.modified_at or None),
        "size": info.size,
        "digest": info.digest,
        "details": _details(info),
    }


async def tags(request: web.Request) -> web.Response:
    """The served model, at once also while it loads (Home Assistant polls this every 30 s), then every
    model of the models directory."""
    models = await request.app[SERVICE].list_models()
    return web.json_response({"models": [_entry(m) for m in models]})


def _serving_ctx(service: Service) -> int:
    """The context the worker holds (sized from its memory budget), else the configured one (0: auto)."""
    return int(service.status().get("ctx") or service.config.ctx)


async def ps(request: web.Request) -> web.Response:
    service: Service = request.app[SERVICE]
    if not service.status()["ready"]:
        return web.json_response({"models": []})
    info = service.model_info()
    loaded = {
        **_entry(info),
        "expires_at": "2318-08-21T00:00:00Z",  # genie keeps its model loaded until told otherwise
        "size_vram": info.size if str(service.status().get("backend")) == "cupy" else 0,
        "context_length": _serving_ctx(service),
    }
    return web.json_response({"models": [loaded]})


async def show(request: web.Request) -> web.Response:
    body = await read_json(request)
    info = await check_model(request.app[SERVICE], model_name(body))
    return web.json_response(
        {
            "modelfile": "",
            "parameters": "",
            "template": info.chat_template,
            "details": _details(info),
            "model_info": info.metadata,
            "capabilities": list(info.capabilities),
            "modified_at": iso_time(info.modified_at or None),
        }
    )


def _status_line(p: PullProgress) -> dict[str, Any]:
    line: dict[str, Any] = {"status": p.status}
    for key in ("digest", "total", "completed"):
        if getattr(p, key) is not None:
            line[key] = getattr(p, key)
    return line


async def pull(request: web.Request) -> web.StreamResponse:
    """Ollama's pull: `model` is a catalogue name, `hf://…` or an http(s) URL of a GGUF file (pull.py), with
    or without `:latest`. Streamed: the status lines as they come, `success` last, or an `error` line;
    else one object. A model genie has (`/api/tags` lists it) has nothing to fetch: success at once; a
    name that is none of those is a 404, as Ollama answers a model its library does not have. A client
    that goes away cancels the pull."""
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    source = model_name(body).removesuffix(":latest")
    stream = get(body, "stream", "bool", True)
    if await service.find_model(source) is not None:
        return await _reply_lines(request, stream, [{"status": "success"}])
    try:
        parse_source(source)
    except PullError as e:
        raise HttpError(404, str(e), "model_not_found") from None
    async with contextlib.aclosing(service.pull(source)) as events:  # left early: the pull is cancelled
        if not stream:
            try:
                async for _ in events:
                    pass
            except PullError as e:
                raise HttpError(400, str(e), "pull_failed") from None
            return web.json_response({"status": "success"})
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        last: dict[str, Any] = {}
        try:
            async for ev in events:
                if isinstance(ev, LocalModel):
                    break
                last = _status_line(ev)
                await resp.write(dumps(last) + b"\n")
        except PullError as e:  # after the 200 went out: Ollama's error line, which its clients raise
            last = {"error": str(e)}
            await resp.write(dumps(last) + b"\n")
    if "error" not in last and last.get("status") != "success":
        await resp.write(dumps({"status": "success"}) + b"\n")
    await resp.write_eof()
    return resp


async def _reply_lines(request: web.Request, stream: bool, lines: list[dict[str, Any]]) -> web.StreamResponse:
    if not stream:
        return web.json_response(lines[-1])
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    for line in lines:
        await resp.write(dumps(line) + b"\n")
    await resp.write_eof()
    return resp


async def delete(request: web.Request) -> web.Response:
    """Removes a model of the models directory; 404 for none, 400 for the packaged model or a file genie
    did not pull, 409 for the model being served (a worker restart would no longer find it: load another
    or unload it first)."""
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    info = await check_model(service, model_name(body))
    if not info.local:
        raise HttpError(400, f"{info.name!r} was not pulled: genie deletes only models of its models directory")
    if service.serves(info):
        raise HttpError(409, f"{info.name!r} is being served: load another model or unload it first", "model_in_use")
    if not await service.delete_model(info):
        raise HttpError(404, f"model {info.name!r} not found", "model_not_found")
    return web.json_response({})


# -- generation ---------------------------------------------------------------------------------------
OPTIONS = {  # Ollama option -> GENERATE's sampling field (genie_protocol.messages.PARAMS: its kind)
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
}


# GENERATE's fields as this API names them, for build_generate's errors (those it does not list: the same)
FIELD_NAMES = {f"params.{param}": f"options.{name}" for name, param in OPTIONS.items()} | {
    "params.max_tokens": "options.num_predict",
    "params.stop": "options.stop",
    "params.ignore_eos": "options.ignore_eos",
    "ctx": "options.num_ctx",
}


FILL = 1 << 20  # num_predict -2 before the worker said its context: the most GENERATE takes (it stops at its end)


def _ctx(service: Service, body: dict[str, Any]) -> dict[str, Any]:
    """The request's context (options.num_ctx, Home Assistant sends 8192) as GENERATE's ctx: honoured up to
    what the worker holds, and the final line's context_length says which was used."""
    n = get(get(body, "options", "dict", {}), "num_ctx", "int", where="options.")
    if n is None:
        return {}
    if n < 1:
        raise HttpError(400, "options.num_ctx must be >= 1")
    return {"ctx": n}


def _params(body: dict[str, Any], ctx: int) -> dict[str, Any]:
    options = get(body, "options", "dict", {})
    params: dict[str, Any] = {}
    for name, field in OPTIONS.items():
        value = param(options, name, field, where="options.")
        if value is not None:
            params[field] = value
    if params.get("seed", 0) < 0:  # -1 is Ollama's (and llama.cpp's) "a random seed"
        del params["seed"]
    n = get(options, "num_predict", "int", -1, where="options.")
    if n == -2:  # Ollama's "fill the context": the worker ends the answer where its context ends
        params["max_tokens"] = min(get(options, "num_ctx", "int", where="options.") or ctx or FILL, FILL)
    elif n >= 0:  # -1, Ollama's "infinite" and default: none here, so the daemon's max_tokens_default applies
        params["max_tokens"] = n
    stop = stop_list(options.get("stop"), "options.stop")
    if stop:
        params["stop"] = stop
    if get(options, "ignore_eos", "bool", False, where="options."):  # genie's extension (benchmarks, tests)
        params["ignore_eos"] = True
    return params


def _think(body: dict[str, Any]) -> bool:
    value = body.get("think")
    if value is None or isinstance(value, bool):
        return bool(value)
    if value in ("low", "medium", "high"):
        return True
    raise HttpError(400, "think must be a boolean or one of low, medium, high")


def _asked(tools: list[dict[str, Any]] | None, think: bool) -> dict[str, str]:
    """What the request asks of the model beyond completion, by the field that asks (refuse_unsupported)."""
    return ({"tools": "tools"} if tools else {}) | ({"thinking": "think"} if think else {})


def _keep_alive_zero(body: dict[str, Any]) -> bool:
    value = body.get("keep_alive")
    if value is None:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, str):
        return value.strip() in ("0", "0s", "0m", "0h")
    raise HttpError(400, "keep_alive must be a number of seconds or a duration such as 5m")


def _format(body: dict[str, Any]) -> str | dict[str, Any] | None:
    """`format`: "json" or a JSON schema; the output is constrained to it (workers/engine/constraint.py)."""
    value = body.get("format")
    if value in (None, ""):
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise HttpError(400, 'format must be "json" or a JSON schema object')


def _messages(raw: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]."
        if not isinstance(m, dict):
            raise HttpError(400, f"messages[{i}] must be an object")
        role = get(m, "role", "str", where=where)
        if role not in ("system", "user", "assistant", "tool"):
            raise HttpError(400, f"{where}role must be system, user, assistant or tool")
        if m.get("images"):
            raise HttpError(400, f"{where}images: genie serves text models only")
        msg: dict[str, Any] = {"role": role, "content": get(m, "content", "str", "", where=where)}
        calls = get(m, "tool_calls", "list", where=where)
        if calls:
            msg["tool_calls"] = [tool_call_in(c, f"{where}tool_calls[{j}]") for j, c in enumerate(calls)]
        name = get(m, "tool_name", "str", where=where)
        if name:
            msg["name"] = name
        out.append(msg)
    return out


async def chat(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    info = await check_model(service, body.get("model"))
    raw = get(body, "messages", "list", [])
    if not raw:  # Ollama's load (and, with keep_alive 0, unload) request
        return await _load_or_unload(service, body, info, {"message": {"role": "assistant", "content": ""}})
    tools = check_tools(body)
    think = _think(body)
    refuse_unsupported(info, body["model"], _asked(tools, think))
    fields = {
        "messages": _messages(raw),
        "params": _params(body, _serving_ctx(service)),
        "think": think,
        "tools": tools,
        "format": _format(body),
        **_ctx(service, body),
    }
    stream = get(body, "stream", "bool", True)
    return await _run(request, service, info, fields, stream, "chat", _keep_alive_zero(body))


async def generate(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    info = await check_model(service, body.get("model"))
    prompt = get(body, "prompt", "str", "")
    if not prompt:
        return await _load_or_unload(service, body, info, {"response": ""})
    if body.get("images"):
        raise HttpError(400, "images: genie serves text models only")
    if get(body, "suffix", "str"):
        raise HttpError(400, "suffix (fill-in-the-middle) is not supported")
    if get(body, "template", "str"):
        raise HttpError(400, "template overrides are not supported: the model's own chat template is used")
    think = _think(body)
    refuse_unsupported(info, body["model"], _asked(None, think))
    fields: dict[str, Any] = {"params": _params(body, _serving_ctx(service)), "think": think}
    fields |= _ctx(service, body)
    fields["format"] = _format(body)
    if get(body, "raw", "bool", False):
        fields["prompt"] = prompt
    else:
        system = get(body, "system", "str")
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        fields["messages"] = msgs
    stream = get(body, "stream", "bool", True)
    return await _run(request, service, info, fields, stream, "generate", _keep_alive_zero(body))


async def _load_or_unload(
    service: Service, body: dict[str, Any], info: ModelInfo, empty: dict[str, Any]
) -> web.Response:
    if _keep_alive_zero(body):
        if service.serves(info):  # another model is not loaded: nothing to unload
            await service.unload()
        reason = "unload"
    else:
        await ensure_ready(service, info)
        reason = "load"
    head = {"model": info.name, "created_at": iso_time()}
    return web.json_response({**head, **empty, "done_reason": reason, "done": True})


async def _run(
    request: web.Request,
    service: Service,
    info: ModelInfo,
    fields: dict[str, Any],
    stream: bool,
    kind: str,
    unload_after: bool,
) -> web.StreamResponse:
    msg = build_generate(fields, FIELD_NAMES)
    t0 = time.monotonic()  # before a wait for the model to load: Ollama's total_duration includes the load
    async with Turn(service, msg, info.configured or None) as turn:  # loads the model if it is not served
        first, events = await first_then_rest(turn.parsed())
        load_ns = request.app[LOAD_REPORT].take_ns(service.status())  # the worker that answers
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            async for ev in events:
                line = _line(ev, info, kind, t0, load_ns)
                if line is not None:
                    await resp.write(dumps(line) + b"\n")
            await resp.write_eof()
            result: web.StreamResponse = resp
        else:
            result = web.json_response(await _collect(events, info, kind, t0, load_ns))
    if unload_after:
        await service.unload(only_if_idle=True)
    return result


def _line(ev: Any, info: ModelInfo, kind: str, t0: float, load_ns: int) -> dict[str, Any] | None:
    head = {"model": info.name, "created_at": iso_time()}
    if isinstance(ev, Error):
        return {"error": ev.message}
    if isinstance(ev, Done):
        return {**head, **_empty(kind), **_final(ev, t0, load_ns)}
    if kind == "generate":
        if isinstance(ev, Piece):
            return {**head, "response": ev.text if ev.kind == "content" else "", "done": False} | (
                {"thinking": ev.text} if ev.kind == "thinking" else {}
            )
        return None  # no tools offered: never a call
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if isinstance(ev, ToolCall):
        message["tool_calls"] = [{"function": {"name": ev.name, "arguments": ev.arguments}}]
    elif ev.kind == "thinking":
        message["thinking"] = ev.text
    else:
        message["content"] = ev.text
    return {**head, "message": message, "done": False}


def _empty(kind: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}


def _final(done: Done, t0: float, load_ns: int) -> dict[str, Any]:
    usage, t = done.usage, done.timings
    prompt, cached = int(usage.get("prompt_tokens", 0)), int(usage.get("cached_tokens", 0))
    return {
        "done": True,
        "done_reason": done.finish_reason,
        "total_duration": int((time.monotonic() - t0) * 1e9),
        "load_duration": load_ns,  # the first reply after each load only (load_report.py)
        "prompt_eval_count": prompt - cached,
        "prompt_eval_duration": int(float(t.get("prefill_ms", 0.0)) * NS),
        "eval_count": int(usage.get("completion_tokens", 0)),
        "eval_duration": int(float(t.get("decode_ms", 0.0)) * NS),
        "cached_tokens": cached,
        # the oldest messages left out to fit the context (genie's; Ollama only logs it)
        "dropped_messages": int(usage.get("dropped_messages", 0)),
    } | ({"context_length": int(usage["ctx"])} if "ctx" in usage else {})  # genie's: the context it had


async def _collect(events: Any, info: ModelInfo, kind: str, t0: float, load_ns: int) -> dict[str, Any]:
    r = await gather(events)
    head: dict[str, Any] = {"model": info.name, "created_at": iso_time()}
    if kind == "generate":
        out = {**head, "response": r.content} | ({"thinking": r.thinking} if r.thinking else {})
        return {**out, **_final(r.done, t0, load_ns)}
    message: dict[str, Any] = {"role": "assistant", "content": r.content}
    if r.thinking:
        message["thinking"] = r.thinking
    if r.calls:
        message["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}} for c in r.calls]
    return {**head, "message": message, **_final(r.done, t0, load_ns)}
