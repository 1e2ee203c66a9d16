"""The HTTP fronts' errors name the API's own fields, never genie's wire message (`GENERATE.params.top_p`),
and OpenAI's errors carry the `type`, `param` and `code` OpenAI gives the same error (issue 34 item 16).
Driven over a real socket against the scripted stand-in of test_http_api.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from genie_protocol.messages import Error
from tests.genie_daemon.test_http_api import http, served  # noqa: F401  (served: the fixture)

MSG = [{"role": "user", "content": "x"}]
TOO_MANY_TOOLS = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]
TOO_MANY_STOPS = [f"s{i}" for i in range(17)]

OLLAMA = [  # (path, body, the field its error must name)
    ("/api/chat", {"options": {"top_p": 1.5}}, "options.top_p"),
    ("/api/chat", {"options": {"min_p": 2}}, "options.min_p"),
    ("/api/chat", {"options": {"temperature": 1000}}, "options.temperature"),
    ("/api/chat", {"options": {"top_k": 2**21}}, "options.top_k"),
    ("/api/chat", {"options": {"repeat_penalty": 101}}, "options.repeat_penalty"),
    ("/api/chat", {"options": {"num_predict": 2**21}}, "options.num_predict"),
    ("/api/chat", {"options": {"stop": TOO_MANY_STOPS}}, "options.stop"),
    ("/api/chat", {"options": {"num_ctx": 2**63}}, "options.num_ctx"),
    ("/api/chat", {"tools": TOO_MANY_TOOLS}, "tools"),
    ("/api/chat", {"messages": MSG * 1025}, "messages"),
    ("/api/generate", {"prompt": "x", "options": {"top_p": 1.5}}, "options.top_p"),
]
OPENAI = [
    ("/v1/chat/completions", {"top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"stop": TOO_MANY_STOPS}, "stop"),
    ("/v1/chat/completions", {"max_tokens": 2**21}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 2**21}, "max_completion_tokens"),
    ("/v1/chat/completions", {"seed": 2**63}, "seed"),
    ("/v1/chat/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"tools": TOO_MANY_TOOLS}, "tools"),
    ("/v1/chat/completions", {"messages": MSG * 1025}, "messages"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2**21}, "max_tokens"),
]


def refuse(url: str, path: str, fields: dict[str, Any]) -> tuple[int, Any]:
    body = {"model": "tiny", "messages": MSG, **fields}
    if path.endswith(("/generate", "/completions")) and "chat" not in path:
        del body["messages"]
    status, raw = http(url + path, body)
    return status, json.loads(raw)["error"]


@pytest.mark.parametrize(("path", "fields", "name"), OLLAMA, ids=[f"{p}:{n}" for p, _, n in OLLAMA])
def test_ollama_errors_name_its_own_fields(served, path, fields, name):  # noqa: F811
    service, url = served
    status, error = refuse(url, path, fields)
    assert status == 400 and error.startswith(name) and "GENERATE" not in error, error
    assert not service.submitted


@pytest.mark.parametrize(("path", "fields", "name"), OPENAI, ids=[f"{p}:{n}" for p, _, n in OPENAI])
def test_openai_errors_name_its_own_fields_in_message_and_param(served, path, fields, name):  # noqa: F811
    service, url = served
    status, error = refuse(url, path, fields)
    assert status == 400 and error["message"].startswith(name) and "GENERATE" not in error["message"], error
    assert error["param"] == name and error["type"] == "invalid_request_error", error
    assert not service.submitted


def openai_error(url: str, path: str, body: Any = None, headers: dict | None = None) -> tuple[int, dict]:
    status, raw = http(url + path, body, headers=headers)
    return status, json.loads(raw)["error"]


def test_openai_error_types_are_openais(served):  # noqa: F811
    """The type by kind of error, as OpenAI answers each: a client's mistake (400, 404, 405) is an
    invalid_request_error, with a code where OpenAI has one (model_not_found); genie's own trouble (503
    overloaded or loading, 500) a server_error (issue 34 item 16: the type was genie's code, e.g.
    `model_not_found` or `not_ready`)."""
    service, url = served
    status, e = openai_error(url, "/v1/chat/completions", {"model": "nope", "messages": MSG})
    assert (status, e["type"], e["code"], e["param"]) == (404, "invalid_request_error", "model_not_found", "model")
    status, e = openai_error(url, "/v1/models/nope")
    assert (status, e["type"], e["code"]) == (404, "invalid_request_error", "model_not_found")
    status, e = openai_error(url, "/v1/nothing")
    assert (status, e["type"], e["param"]) == (404, "invalid_request_error", None)
    status, e = openai_error(url, "/v1/models", {"x": 1})
    assert (status, e["type"]) == (405, "invalid_request_error")
    status, e = openai_error(url, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "n": 2})
    assert (status, e["type"], e["param"]) == (400, "invalid_request_error", "n")
    service.error = Error(request_id="x", code="overloaded", message="16 requests are already waiting")
    status, e = openai_error(url, "/v1/chat/completions", {"model": "tiny", "messages": MSG})
    assert (status, e["type"], e["code"]) == (503, "server_error", "overloaded")
    service.error = Error(request_id="x", code="internal", message="RuntimeError: boom")
    status, e = openai_error(url, "/v1/chat/completions", {"model": "tiny", "messages": MSG})
    assert (status, e["type"]) == (500, "server_error")


def test_openai_error_in_a_stream_has_openais_type(served):  # noqa: F811
    """An ERROR after the stream began is a `data: {"error": ...}` event with the same type."""
    service, url = served
    service.script = ["Hel", "lo", "!"]
    body = {"model": "tiny", "messages": MSG, "stream": True}
    calls = {"n": 0}
    real = service._answer

    async def fail_midway(reply: Any, msg: Any) -> None:
        calls["n"] += 1

        async def relay(ev: Any) -> None:
            if type(ev).__name__ == "Done":
                ev = Error(request_id=ev.request_id, code="worker_died", message="the worker died")
            await reply(ev)

        await real(relay, msg)

    service._answer = fail_midway  # type: ignore[method-assign]
    status, raw = http(url + "/v1/chat/completions", body)
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    errors = [ev["error"] for ev in events if "error" in ev]
    assert status == 200 and errors and errors[0]["type"] == "server_error" and errors[0]["code"] == "worker_died"


@pytest.mark.parametrize("served", ["s3cret"], indirect=True)
def test_openai_wrong_key_is_openais_401(served):  # noqa: F811
    """OpenAI answers a wrong key 401 with type invalid_request_error and code invalid_api_key."""
    _, url = served
    status, e = openai_error(url, "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert (status, e["type"], e["code"]) == (401, "invalid_request_error", "invalid_api_key")
