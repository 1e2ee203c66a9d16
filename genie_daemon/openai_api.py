"""OpenAI's HTTP API (chat completions, completions, models), as the `openai` client library and Home
Assistant's OpenAI-compatible integrations use it.

Streams are server-sent events: a first chunk with the role, then content (or `reasoning_content`)
deltas, each tool call whole in one delta (its `arguments` a JSON string, as OpenAI sends them), a last
chunk with `finish_reason` (stop | length | tool_calls), with `stream_options.include_usage` a chunk with
`usage`, then `data: [DONE]`. `usage.prompt_tokens_details.cached_tokens` counts the prompt tokens genie's
KV already held.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from genie_common.events import Piece, ToolCall
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
    error_status,
    first_then_rest,
    gather,
    get,
    param,
    refuse_unsupported,
    stop_list,
    tool_call_in,
)
from .model_info import ModelInfo


def error_object(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An error as OpenAI writes it: `type` by who is at fault, as OpenAI types each error (a bad request,
    an unknown model or path, a wrong key: invalid_request_error; its own trouble, overloaded or failed:
    server_error), `param` the request's field it is about, `code` a code of the error's own or null."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"message": message, "type": kind, "param": param, "code": code}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)


def _model_obj(info: ModelInfo) -> dict[str, Any]:
    return {"id": info.name, "object": "model", "created": int(info.modified_at), "owned_by": "genie"}


async def models(request: web.Request) -> web.Response:
    """The same models as Ollama's /api/tags: the served one, then the models directory's."""
    listed = await request.app[SERVICE].list_models()
    return web.json_response({"object": "list", "data": [_model_obj(m) for m in listed]})


async def model(request: web.Request) -> web.Response:
    info = await check_model(request.app[SERVICE], request.match_info["name"])
    return web.json_response(_model_obj(info))


BOUNDS = {  # OpenAI's ranges: outside them OpenAI answers 400, and so does genie
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),  # checked for compatibility, not applied
    "presence_penalty": (-2.0, 2.0),  # checked for compatibility, not applied
}


def _params(body: dict[str, Any]) -> dict[str, Any]:
    if get(body, "n", "int", 1) != 1:
        raise HttpError(400, "n must be 1: genie generates one choice", param="n")
    if get(body, "logprobs", "bool", False) or body.get("top_logprobs") is not None:
        raise HttpError(400, "logprobs are not supported", param="logprobs")
    for name, (low, high) in BOUNDS.items():
        value = get(body, name, "number")
        if value is not None and not low <= value <= high:
            raise HttpError(400, f"{name} must be between {low:g} and {high:g}", param=name)
    params: dict[str, Any] = {}
    for name in ("temperature", "top_p", "seed"):  # the sampling fields OpenAI's API has
        value = param(body, name, name)
        if value is not None:
            params[name] = value
    if params.get("seed", 0) < 0:  # a negative seed: a random one, as llama.cpp's server takes it
        del params["seed"]
    limit = get(body, "max_completion_tokens", "int", get(body, "max_tokens", "int"))
    if limit is not None and limit < 0:
        name = _limit_name(body)
        raise HttpError(400, f"{name} must be >= 0", param=name)
    if limit is not None:  # else none: the daemon's max_tokens_default applies
        params["max_tokens"] = limit
    stop = stop_list(body.get("stop"), "stop")
    if stop:
        params["stop"] = stop
    if get(body, "ignore_eos", "bool", False):  # genie's extension, as llama.cpp's server has it
        params["ignore_eos"] = True
    return params


def _limit_name(body: dict[str, Any]) -> str:
    """The token limit's field as the request wrote it."""
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def _field_names(body: dict[str, Any]) -> dict[str, str]:
    """GENERATE's fields as this API names them, for build_generate's errors."""
    names = {f"params.{name}": name for name in ("temperature", "top_p", "seed", "stop", "ignore_eos")}
    return names | {"params.max_tokens": _limit_name(body), "format": "response_format"}


def _format(body: dict[str, Any]) -> str | dict[str, Any] | None:
    """response_format: json_object (any JSON object) or json_schema (its `schema`); text: none."""
    fmt = get(body, "response_format", "dict")
    kind = None if fmt is None else fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = get(fmt, "json_schema", "dict", {}, where="response_format.")
        schema = get(spec, "schema", "dict", where="response_format.json_schema.")
        return schema if schema is not None else "json"
    raise HttpError(400, "response_format.type must be text, json_object or json_schema", param="response_format")


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (images are refused)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                message = f"{where}content[{j}] must be a text part: genie serves text models only"
                raise HttpError(400, message, param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise HttpError(400, f"{where}content must be a string or a list of text parts", param="messages")


def _messages(raw: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]."
        if not isinstance(m, dict):
            raise HttpError(400, f"messages[{i}] must be an object", param="messages")
        role = get(m, "role", "str", where=where)
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise HttpError(400, f"{where}role must be system, developer, user, assistant or tool", param="messages")
        msg: dict[str, Any] = {"role": role, "content": _content(m.get("content"), where)}
        calls = get(m, "tool_calls", "list", where=where)
        if calls:
            msg["tool_calls"] = [tool_call_in(c, f"{where}tool_calls[{j}]") for j, c in enumerate(calls)]
        for key in ("tool_call_id", "name"):
            value = get(m, key, "str", where=where)
            if value:
                msg[key] = value
        out.append(msg)
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = check_tools(body)
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto", "required") and not (
        isinstance(choice, dict) and isinstance(choice.get("function"), dict)
    ):
        message = "tool_choice must be none, auto, required or {type: function, function: {name}}"
        raise HttpError(400, message, param="tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):  # one named function: offer only that one
        named = [t for t in tools if t["function"]["name"] == choice["function"].get("name")]
        if not named:
            raise HttpError(400, "tool_choice names a function that is not in tools", param="tool_choice")
        return named
    return tools


def _usage(done: Done) -> dict[str, Any]:
    u = done.usage
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(u.get("cached_tokens", 0))},
        "dropped_messages": int(u.get("dropped_messages", 0)),  # genie's: oldest messages left out to fit
    }


def _finish(done: Done, n_calls: int) -> str:
    if n_calls:
        return "tool_calls"
    return "length" if done.finish_reason == "length" else "stop"


def _call_out(call: ToolCall, index: int, rid: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": f"call_{rid}_{index}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    info = await check_model(service, body.get("model"))
    raw = get(body, "messages", "list")
    if not raw:
        raise HttpError(400, "messages is required: a non-empty list", param="messages")
    tools = _tools(body)
    think = get(body, "reasoning_effort", "str") not in (None, "none", "minimal")
    asked = ({"tools": "tools"} if tools else {}) | ({"thinking": "reasoning_effort"} if think else {})
    refuse_unsupported(info, body["model"], asked)
    fields = {
        "messages": _messages(raw),
        "params": _params(body),
        "tools": tools,
        "think": think,
        "format": _format(body),
    }
    return await _run(request, service, info, body, fields, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    service: Service = request.app[SERVICE]
    body = await read_json(request)
    info = await check_model(service, body.get("model"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise HttpError(400, "prompt must be a non-empty string", param="prompt")
    if get(body, "echo", "bool", False) or get(body, "suffix", "str"):
        raise HttpError(400, "echo and suffix are not supported", param="echo" if body.get("echo") else "suffix")
    fields = {"prompt": prompt, "params": _params(body), "format": _format(body)}
    return await _run(request, service, info, body, fields, "text")


async def _run(
    request: web.Request,
    service: Service,
    info: ModelInfo,
    body: dict[str, Any],
    fields: dict[str, Any],
    kind: str,
) -> web.StreamResponse:
    stream = get(body, "stream", "bool", False)
    options = get(body, "stream_options", "dict", {})
    include_usage = get(options, "include_usage", "bool", False, where="stream_options.")
    msg = build_generate(fields, _field_names(body))
    rid = uuid.uuid4().hex[:24]
    head = {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{rid}",
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": info.name,
    }
    async with Turn(service, msg, info.configured or None) as turn:  # loads the model if it is not served
        first, events = await first_then_rest(turn.parsed())
        if not stream:
            return web.json_response(await _collect(events, head, kind, rid))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + dumps(obj) + b"\n\n")

        if kind == "chat":
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await send({**head, "choices": [role]})
        n_calls = 0
        async for ev in events:
            if isinstance(ev, Error):
                await send({"error": error_object(error_status(ev), ev.message, ev.code)})
                break
            if isinstance(ev, Done):
                finish = _finish(ev, n_calls)
                last: dict[str, Any] = {"delta": {}} if kind == "chat" else {"text": ""}
                await send({**head, "choices": [{"index": 0, **last, "finish_reason": finish}]})
                if include_usage:
                    await send({**head, "choices": [], "usage": _usage(ev)})
                break
            if kind == "text":
                if isinstance(ev, Piece) and ev.kind == "content":
                    await send({**head, "choices": [{"index": 0, "text": ev.text, "finish_reason": None}]})
                continue
            if isinstance(ev, ToolCall):
                delta: dict[str, Any] = {"tool_calls": [_call_out(ev, n_calls, rid)]}
                n_calls += 1
            elif ev.kind == "thinking":
                delta = {"reasoning_content": ev.text}
            else:
                delta = {"content": ev.text}
            await send({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _collect(events: Any, head: dict[str, Any], kind: str, rid: str) -> dict[str, Any]:
    r = await gather(events)
    obj = {**head, "object": "chat.completion" if kind == "chat" else "text_completion"}
    if kind == "text":
        choice: dict[str, Any] = {"index": 0, "text": r.content, "finish_reason": _finish(r.done, 0)}
        return {**obj, "choices": [choice], "usage": _usage(r.done)}
    message: dict[str, Any] = {"role": "assistant", "content": r.content if r.content or not r.calls else None}
    if r.thinking:
        message["reasoning_content"] = r.thinking
    if r.calls:
        message["tool_calls"] = [_call_out(c, i, rid) for i, c in enumerate(r.calls)]
        for c in message["tool_calls"]:
            del c["index"]
    choice = {"index": 0, "message": message, "finish_reason": _finish(r.done, len(r.calls))}
    return {**obj, "choices": [choice], "usage": _usage(r.done)}
