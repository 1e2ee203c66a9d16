"""The HTTP fronts driven by the real `ollama` and `openai` client libraries, over a real socket, against a
scripted stand-in for the daemon that answers with recorded model outputs (Qwen-style tool calls and
reasoning, a bare JSON call), so every shape is checked exactly. tests/genie_daemon/test_http_live.py
drives the real daemon."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from genie_common.config import DaemonConfig
from genie_common.errors import PullError
from genie_common.models.local import LocalModel, ModelsDir
from genie_common.models.pull import PullProgress
from genie_daemon.http_server import HttpFront
from genie_daemon.metrics import DaemonMetrics
from genie_daemon.model_info import ModelInfo, describe
from genie_protocol.messages import Delta, Done, Error, Generate
from genie_workers.delta_stream import DeltaStream
from genie_workers.output_parser import OutputParser
from testkit.tiny_models import write_tiny_model

QWEN_CALLS = [
    "<think>\nThe user wants the kitchen light on.\n</think>\n\n<tool",
    '_call>\n{"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}\n</tool_call>',
]
JSON_CALL = ['{"name": "HassTurnOff", ', '"arguments": {"area": "Kitchen"}}']
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a device",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
    for name in ("HassTurnOn", "HassTurnOff")
]
# a template that renders tools and writes Qwen's reasoning opener: a model that can do both
TEMPLATE = "{% if tools %}{{ tools | tojson }}{% endif %}{% if not enable_thinking %}<think></think>{% endif %}"
USAGE = {"prompt_tokens": 120, "cached_tokens": 100, "completion_tokens": 7}
TIMINGS = {"ttft_ms": 30.0, "prefill_ms": 12.5, "decode_ms": 70.0, "prefill_tok_s": 1600.0, "decode_tok_s": 100.0}


class ScriptedService:
    """Answers every GENERATE with `script` (DELTA texts), then DONE; or with `error`."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.metrics = DaemonMetrics()
        self.ready = True
        self.script: list[str] = ["Hel", "lo!"]
        self.finish = "stop"
        self.error: Error | None = None
        self.delay_s = 0.0
        self.submitted: list[Generate] = []
        self.cancelled: list[str] = []
        self.unloads = 0
        self.worker_pid = 1
        self.info = ModelInfo("tiny", 123_456, "ab" * 32, "qwen3", "0.6B", "Q4_K_M", 1.7e9, 4096, TEMPLATE, {})
        self.local: dict[str, ModelInfo] = {}  # the models directory, by name
        self.loaded: list[str | None] = []  # the model each ensure_loaded asked for
        self.models_asked: list[str | None] = []  # the model each submitted request must run on
        self.pull_script: list[PullProgress | PullError] = []
        self.pulls: list[str] = []
        self.pulls_closed = 0  # pull streams left: finished, failed or abandoned
        self.playing = 0  # answers being played now
        self.most_at_once = 0

    async def submit(self, owner: Any, reply: Any, msg: Generate, model: str | None = None) -> None:
        self.submitted.append(msg)
        self.models_asked.append(model)
        asyncio.get_running_loop().create_task(self._play(reply, msg))

    async def _play(self, reply: Any, msg: Generate) -> None:
        self.playing += 1
        self.most_at_once = max(self.most_at_once, self.playing)
        try:
            await self._answer(reply, msg)
        finally:
            self.playing -= 1

    async def _answer(self, reply: Any, msg: Generate) -> None:
        rid = msg.request_id
        if self.error:
            await reply(Error(request_id=rid, code=self.error.code, message=self.error.message))
            return
        # the script is the model's text; like the worker, it goes out typed (workers/output_parser.py read
        # the markup), a DELTA for each piece the stream sends
        parser = OutputParser([t["function"]["name"] for t in msg.tools or []], think=msg.think)
        out: list[Delta] = []
        stream = DeltaStream(rid, out.append, 0.0)
        for i, text in enumerate(self.script):
            if rid in self.cancelled:
                await reply(Done(request_id=rid, finish_reason="cancelled"))
                return
            stream.events(parser.feed(text), [])
            if i == len(self.script) - 1:
                stream.events(parser.finish(), [])
            stream.flush()
            for delta in out:
                await reply(delta)
            out.clear()
            await asyncio.sleep(self.delay_s)
        done = Done(request_id=rid, finish_reason=self.finish, usage=USAGE, timings=TIMINGS)
        self.metrics.observe_done(done.finish_reason, done.usage, done.timings)
        await reply(done)

    async def cancel(self, owner: Any, rid: str) -> None:
        self.cancelled.append(rid)

    def status(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "loaded_model": "tiny",
            "worker_pid": self.worker_pid,
            "load_ms": 250.0,
            "queue": 0,
            "running": 0,
            "slots": {"in_use": 0, "total": 4},
        }

    async def kv_metrics(self) -> dict[str, Any]:
        return {"enabled": True, "hits": 3, "misses": 1, "evictions": 2, "bytes": 4096, "entries": 2}

    def model_info(self) -> ModelInfo:
        return self.info

    async def list_models(self) -> list[ModelInfo]:
        return [self.info] + [m for n, m in sorted(self.local.items()) if n != self.info.name]

    async def find_model(self, name: str) -> ModelInfo | None:
        if self.info.is_named(name):
            return self.info
        return self.local.get(name.removesuffix(":latest"))

    def serves(self, info: ModelInfo) -> bool:
        return info.name == self.info.name

    async def delete_model(self, info: ModelInfo) -> bool:
        return self.local.pop(info.name, None) is not None

    async def pull(
        self, source: str, keepalive_s: float | None = None
    ) -> AsyncGenerator[PullProgress | LocalModel, None]:
        self.pulls.append(source)
        try:
            for step in self.pull_script:
                if isinstance(step, PullError):
                    raise step
                yield step
                await asyncio.sleep(self.delay_s)
            yield LocalModel(source, Path(f"/m/{source}.gguf"), 9, "cd" * 32, source, "llama", "F32", 512, False, "")
        finally:
            self.pulls_closed += 1

    async def ensure_loaded(self, timeout_s: float, model: str | None = None) -> str | None:
        self.loaded.append(model)
        return None if self.ready else "the model is loading"

    async def unload(self, only_if_idle: bool = False) -> None:
        self.unloads += 1


@pytest.fixture
def served(request) -> Iterator[tuple[ScriptedService, str]]:
    key = getattr(request, "param", "")
    service = ScriptedService(DaemonConfig(http_port=0, api_key=key, ctx=4096))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    front = HttpFront(service)
    asyncio.run_coroutine_threadsafe(front.start(), loop).result(10)
    yield service, f"http://127.0.0.1:{front.port}"
    asyncio.run_coroutine_threadsafe(front.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def http(url: str, body: Any = None, method: str | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


_open_clients: list[Any] = []


def ollama_client(url: str, headers: dict | None = None) -> ollama.Client:
    client = ollama.Client(host=url, headers=headers)
    _open_clients.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _open_clients:
        _open_clients.pop().close()


# -- Ollama ---------------------------------------------------------------------------------------------
def test_ollama_chat_not_streamed(served):
    service, url = served
    r = ollama_client(url).chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={"seed": 3})
    assert r.message.content == "Hello!" and r.done and r.done_reason == "stop"
    assert r.eval_count == 7 and r.prompt_eval_count == 20  # 120 prompt tokens, 100 of them cached
    assert r.prompt_eval_duration == 12_500_000 and r.eval_duration == 70_000_000
    msg = service.submitted[-1]
    assert msg.messages == [{"role": "user", "content": "hi"}] and msg.params["seed"] == 3
    assert "max_tokens" not in msg.params  # num_predict absent: the daemon's max_tokens_default applies


@pytest.mark.parametrize(
    ("num_predict", "max_tokens"),
    [(None, None), (-1, None), (-2, 4096), (5, 5)],
    ids=["absent", "infinite", "fill-the-context", "five"],
)
def test_ollama_num_predict_and_the_default_cap(served, num_predict, max_tokens):
    """Ollama's -1 ("infinite", its default) gets the daemon's max_tokens_default, which the daemon adds to
    a GENERATE without max_tokens (issue 16: answers ran until the context was full); -2 fills the
    context; a cap that is hit is done_reason length, streamed or not."""
    service, url = served
    service.finish = "length"
    options = {} if num_predict is None else {"num_predict": num_predict}
    client = ollama_client(url)
    r = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=options)
    assert service.submitted[-1].params.get("max_tokens") == max_tokens and r.done_reason == "length"
    chunks = list(client.generate(model="tiny", prompt="hi", options=options, stream=True))
    assert service.submitted[-1].params.get("max_tokens") == max_tokens and chunks[-1].done_reason == "length"


def test_ollama_chat_streamed(served):
    _, url = served
    chunks = list(
        ollama_client(url).chat(model="tiny:latest", messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    assert "".join(c.message.content for c in chunks) == "Hello!"
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].eval_count == 7


def test_ollama_qwen_tool_call_and_thinking(served):
    service, url = served
    service.script = QWEN_CALLS
    client = ollama_client(url)
    r = client.chat(model="tiny", messages=[{"role": "user", "content": "light on"}], tools=TOOLS, think=True)
    assert r.message.content == "" and r.message.thinking.strip() == "The user wants the kitchen light on."
    (call,) = r.message.tool_calls
    assert call.function.name == "HassTurnOn" and call.function.arguments == {"name": "Kitchen Light"}
    assert service.submitted[-1].tools == TOOLS and service.submitted[-1].think
    chunks = list(client.chat(model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS, stream=True))
    with_calls = [c for c in chunks if c.message.tool_calls]
    assert len(with_calls) == 1 and with_calls[0].message.tool_calls[0].function.arguments == {"name": "Kitchen Light"}
    assert all("<tool_call>" not in (c.message.content or "") for c in chunks)


def test_ollama_json_tool_call_and_tool_results(served):
    service, url = served
    service.script = JSON_CALL
    history = [
        {"role": "user", "content": "kitchen off"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "HassTurnOff", "arguments": {}}}]},
        {"role": "tool", "content": '{"success": true}'},
    ]
    r = ollama_client(url).chat(model="tiny", messages=history, tools=TOOLS)
    assert r.message.tool_calls[0].function.name == "HassTurnOff"
    assert r.message.tool_calls[0].function.arguments == {"area": "Kitchen"}
    sent = service.submitted[-1].messages
    assert (
        sent[1]["tool_calls"][0]["function"] == {"name": "HassTurnOff", "arguments": {}} and sent[2]["role"] == "tool"
    )


def test_ollama_tags_show_ps_version_pull(served):
    service, url = served
    service.ready = False  # loading: tags still answers at once with the served model
    client = ollama_client(url)
    (m,) = client.list().models
    assert m.model == "tiny" and m.size == 123_456 and m.digest == "ab" * 32
    assert (
        m.details.family == "qwen3" and m.details.parameter_size == "0.6B" and m.details.quantization_level == "Q4_K_M"
    )
    assert client.ps().models == []
    assert http(url + "/health")[0] == 503
    service.ready = True
    assert http(url + "/health")[0] == 200
    assert client.ps().models[0].context_length == 4096
    shown = client.show("tiny")
    assert "tools" in shown.capabilities and shown.details.format == "gguf"
    assert json.loads(http(url + "/api/version")[1])["version"]
    assert client.pull("tiny").status == "success" and service.pulls == []  # served: nothing to fetch
    service.local = {"small": local_info("small")}
    assert [ln.status for ln in client.pull("small", stream=True)] == ["success"] and service.pulls == []


PULL_STEPS = [
    PullProgress("pulling manifest"),
    *(PullProgress("downloading", 4096, done, "sha256:" + "cd" * 32) for done in (0, 1024, 4096)),
    PullProgress("verifying sha256 digest", digest="sha256:" + "cd" * 32),
    PullProgress("writing manifest"),
    PullProgress("success"),
]


def test_ollama_pull_streams_the_status_lines(served):
    """Ollama's client sees the pull as Ollama streams it: its statuses in order, the downloading lines with
    digest, total and completed, `success` last; `stream: false` gets the last object; `:latest` is
    Ollama's tag, not part of the source."""
    service, url = served
    service.pull_script = PULL_STEPS
    client = ollama_client(url)
    lines = list(client.pull("qwen3-0.6b:latest", stream=True))  # a catalogue name
    assert [ln.status for ln in lines] == [p.status for p in PULL_STEPS] and service.pulls == ["qwen3-0.6b"]
    down = [ln for ln in lines if ln.status == "downloading"]
    assert [(ln.completed, ln.total, ln.digest) for ln in down] == [
        (p.completed, 4096, p.digest) for p in PULL_STEPS[1:4]
    ]
    url_source = "http://127.0.0.1:1/x.gguf"
    assert client.pull(url_source).status == "success" and service.pulls[-1] == url_source
    service.pull_script = PULL_STEPS[:2]  # a pull that reports no success of its own still ends with one
    assert [ln.status for ln in client.pull("hf://o/r/x.gguf", stream=True)][-1] == "success"
    assert service.pulls_closed == 3


def test_ollama_pull_failure_is_an_error_in_both_shapes(served):
    """A failed pull: streamed, an `error` line after the statuses so far (the 200 went out), which the
    client raises; whole, a 400 with Ollama's error body."""
    service, url = served
    service.pull_script = [PULL_STEPS[0], PullError("http://h/x.gguf: not a GGUF file (bad magic)")]
    client = ollama_client(url)
    seen = []
    with pytest.raises(ollama.ResponseError) as e:
        for line in client.pull("http://h/x.gguf", stream=True):
            seen.append(line.status)
    assert seen == ["pulling manifest"] and "bad magic" in str(e.value)
    status, body = http(url + "/api/pull", {"model": "http://h/x.gguf", "stream": False})
    assert status == 400 and "bad magic" in json.loads(body)["error"]
    assert http(url + "/api/pull", {"stream": False})[0] == 400  # no model
    with pytest.raises(ollama.ResponseError) as e:  # a name that is no catalogue model, hf:// nor URL
        list(client.pull("llama3:70b", stream=True))
    assert e.value.status_code == 404 and "catalogue" in str(e.value)


def test_ollama_pull_client_gone_cancels_it(served):
    """The client leaves mid-download: the pull's stream is closed at once (the daemon's cancels the
    pull's thread, pull_relay.py), not left running to the end."""
    service, url = served
    service.pull_script = [PullProgress("downloading", 10**9, i * 1000, "sha256:x") for i in range(500)]
    service.delay_s = 0.02
    body = b'{"model": "http://127.0.0.1:1/big.gguf"}'
    r = urllib.request.urlopen(urllib.request.Request(url + "/api/pull", data=body), timeout=10)
    assert json.loads(r.readline())["status"] == "downloading"
    r.close()
    deadline = time.monotonic() + 5
    while not service.pulls_closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert service.pulls_closed == 1


def test_a_model_given_by_path_is_named_by_its_stem(served, tmp_path):
    """`-m /models/x.gguf` is the model `x` in every listing and error, and either name addresses it
    (issue 16: clients were shown, and had to send, the whole path)."""
    service, url = served
    path = tmp_path / "models" / "tiny-q8.gguf"
    path.parent.mkdir()
    write_tiny_model("llama", path)
    service.info = describe(str(path), ModelsDir(tmp_path / "no-models"))
    client = ollama_client(url)
    assert [m.model for m in client.list().models] == ["tiny-q8"]
    assert [m.model for m in client.ps().models] == ["tiny-q8"]
    assert client.show("tiny-q8").details.format == "gguf" and client.show(str(path)).details.format == "gguf"
    for name in ("tiny-q8", "tiny-q8:latest", str(path)):
        r = client.chat(model=name, messages=[{"role": "user", "content": "hi"}])
        assert r.model == "tiny-q8" and r.message.content == "Hello!"
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="other", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and "'tiny-q8'" in str(e.value) and str(tmp_path) not in str(e.value)
    oa = openai_client(url)
    assert [m.id for m in oa.models.list().data] == ["tiny-q8"] and oa.models.retrieve("tiny-q8").id == "tiny-q8"
    r = oa.chat.completions.create(model="tiny-q8", messages=[{"role": "user", "content": "hi"}])
    assert r.model == "tiny-q8"
    assert ModelInfo.named(str(path)).name == "tiny-q8"  # while the file is unread (first start, loading)
    assert ModelInfo.named("qwen3-0.6b").name == "qwen3-0.6b"  # a name, not a path: kept whole


def test_ollama_generate_raw_and_templated(served):
    service, url = served
    client = ollama_client(url)
    assert client.generate(model="tiny", prompt="Once", raw=True).response == "Hello!"
    assert service.submitted[-1].prompt == "Once"
    client.generate(model="tiny", prompt="Once", system="Be brief")
    assert service.submitted[-1].messages == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Once"},
    ]


def test_ollama_keep_alive_zero_unloads(served):
    service, url = served
    r = ollama_client(url).chat(model="tiny", messages=[], keep_alive=0)
    assert r.done_reason == "unload" and service.unloads == 1


def test_ollama_errors(served):
    service, url = served
    client = ollama_client(url)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="other", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404
    service.error = Error(request_id="x", code="overloaded", message="16 requests are already waiting")
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 503 and "waiting" in str(e.value)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "format": "xml"}
    status, reply = http(url + "/api/chat", body)
    assert status == 400 and "format" in json.loads(reply)["error"]


def test_ollama_load_duration_on_the_first_reply_after_each_load(served):
    """The worker's load time (READY's load_ms) in ns on the first reply after each (re)load, as Ollama
    reports the load on the request that waited for it; 0 later (issue 16: it was always 0)."""
    service, url = served
    client = ollama_client(url)
    msgs = [{"role": "user", "content": "hi"}]
    assert client.chat(model="tiny", messages=msgs).load_duration == 250_000_000
    assert client.chat(model="tiny", messages=msgs).load_duration == 0
    service.worker_pid = 2  # a restart or a reload: another worker, its own load
    chunks = list(client.generate(model="tiny", prompt="hi", stream=True))
    assert chunks[-1].load_duration == 250_000_000 and chunks[-1].total_duration > 0
    assert client.generate(model="tiny", prompt="hi").load_duration == 0


def test_ollama_cached_tokens_in_the_raw_reply(served):
    _, url = served
    status, body = http(
        url + "/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": False}
    )
    reply = json.loads(body)
    assert status == 200 and reply["cached_tokens"] == 100 and reply["prompt_eval_count"] == 20


# -- OpenAI ---------------------------------------------------------------------------------------------
def openai_client(url: str, key: str = "unused") -> openai.OpenAI:
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)
    _open_clients.append(client)
    return client


def test_openai_chat_not_streamed_with_usage(served):
    _, url = served
    r = openai_client(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=9
    )
    assert r.choices[0].message.content == "Hello!" and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 120 and r.usage.completion_tokens == 7 and r.usage.total_tokens == 127
    assert r.usage.prompt_tokens_details.cached_tokens == 100


def test_openai_chat_streamed_role_first_and_usage(served):
    service, url = served
    stream = openai_client(url).chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 100
    assert service.submitted[-1].messages[1] == {"role": "user", "content": "hi"}


def test_openai_tool_calls_and_reasoning(served):
    service, url = served
    service.script = QWEN_CALLS
    client = openai_client(url)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "on"}], tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "HassTurnOn" and json.loads(call.function.arguments) == {"name": "Kitchen Light"}
    assert choice.message.model_extra["reasoning_content"].strip() == "The user wants the kitchen light on."
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "on"}], tools=TOOLS, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and json.loads(deltas[0].tool_calls[0].function.arguments) == {"name": "Kitchen Light"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    service.script = JSON_CALL
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "off"}], tools=TOOLS)
    assert r.choices[0].message.tool_calls[0].function.name == "HassTurnOff"
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "off"}], tools=TOOLS, tool_choice="none"
    )
    assert r.choices[0].message.content == "".join(JSON_CALL) and service.submitted[-1].tools is None


def test_openai_completions_models_and_errors(served):
    service, url = served
    client = openai_client(url)
    assert client.completions.create(model="tiny", prompt="Once", max_tokens=5).choices[0].text == "Hello!"
    assert service.submitted[-1].prompt == "Once" and service.submitted[-1].params["max_tokens"] == 5
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], response_format={"type": "yaml"}
        )
    service.finish = "length"
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("field", [None, "max_tokens", "max_completion_tokens"])
def test_openai_without_a_limit_gets_the_default_cap(served, field):
    """No max_tokens: the daemon's max_tokens_default applies (issue 16); the cap hit is finish_reason
    length, streamed or not, for chat and for completions."""
    service, url = served
    service.finish = "length"
    client = openai_client(url)
    extra = {} if field is None else {"extra_body": {field: 5}}
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, **extra)
    assert service.submitted[-1].params.get("max_tokens") == (None if field is None else 5)
    assert r.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, stream=True, **extra))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    chunks = list(client.completions.create(model="tiny", prompt="Once", stream=True, **extra))
    assert service.submitted[-1].params.get("max_tokens") == (None if field is None else 5)
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.5),
        ("temperature", -0.5),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
    ],
)
def test_openai_numbers_out_of_range_are_a_400(served, field, value):
    """OpenAI's own bounds (temperature 0..2, top_p 0..1, penalties -2..2): what OpenAI refuses, genie
    refuses too (issue 16: a temperature of 2.5 was sampled with)."""
    service, url = served
    client = openai_client(url)
    n = len(service.submitted)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], **{field: value})
    assert field in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", **{field: value})
    assert len(service.submitted) == n


def test_openai_numbers_at_their_bounds_are_accepted(served):
    service, url = served
    client = openai_client(url)
    msgs = [{"role": "user", "content": "x"}]
    for bounds in ({"temperature": 2, "top_p": 0}, {"temperature": 0, "top_p": 1}):
        client.chat.completions.create(model="tiny", messages=msgs, presence_penalty=-2, frequency_penalty=2, **bounds)
        assert service.submitted[-1].params["temperature"] == bounds["temperature"]


# -- both -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("served", ["s3cret"], indirect=True)
def test_api_key(served):
    _, url = served
    with pytest.raises(ollama.ResponseError) as e:
        ollama_client(url).list()
    assert e.value.status_code == 401
    assert ollama_client(url, headers={"Authorization": "Bearer s3cret"}).list().models[0].model == "tiny"
    with pytest.raises(openai.AuthenticationError):
        openai_client(url, "wrong").models.list()
    assert openai_client(url, "s3cret").models.list().data[0].id == "tiny"
    assert http(url + "/health")[0] == 200  # liveness probes need no key


def test_metrics_after_a_request(served):
    _, url = served
    ollama_client(url).chat(model="tiny", messages=[{"role": "user", "content": "hi"}])
    status, body = http(url + "/metrics")
    text = body.decode()
    assert status == 200
    for line in (
        "genie_generated_tokens_total 7.0",
        "genie_cached_tokens_total 100.0",
        "genie_kv_store_hits 3.0",
        "genie_ready 1.0",
        "genie_slots_total 4.0",
        "genie_requests_running 0.0",
    ):
        assert line in text, line
    assert 'genie_requests_total{finish="stop"} 1.0' in text and "genie_time_to_first_token_seconds_bucket" in text


def test_client_disconnect_cancels(served):
    service, url = served
    service.script = [f"w{i} " for i in range(200)]
    service.delay_s = 0.02
    req = urllib.request.Request(
        url + "/api/chat", data=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}).encode()
    )
    r = urllib.request.urlopen(req, timeout=10)
    assert json.loads(r.readline())["done"] is False
    r.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 5
    while not service.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert service.cancelled == [service.submitted[-1].request_id]


def test_requests_are_served_at_once_not_one_after_another(served):
    """Issue 17: the fronts hold no lock and no one-turn state. An Ollama stream is under way when an
    OpenAI one and a whole Ollama answer are asked for: all three are being answered at once, each
    whole and in order."""
    service, url = served
    service.script = [f"w{i} " for i in range(20)]
    service.delay_s = 0.03  # 0.6 s an answer
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    first = urllib.request.urlopen(urllib.request.Request(url + "/api/chat", data=json.dumps(chat).encode()))
    assert json.loads(first.readline())["done"] is False  # under way
    results: dict[str, str] = {}

    def openai_stream() -> None:
        chunks = openai_client(url).chat.completions.create(model="tiny", messages=chat["messages"], stream=True)
        results["openai"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def ollama_whole() -> None:
        results["ollama"] = ollama_client(url).chat(model="tiny", messages=chat["messages"]).message.content

    threads = [threading.Thread(target=f) for f in (openai_stream, ollama_whole)]
    for t in threads:
        t.start()
    rest = [json.loads(line) for line in first]
    for t in threads:
        t.join(10)
    whole = "".join(service.script)
    assert "".join(line["message"]["content"] for line in rest) == whole.removeprefix("w0 ") and rest[-1]["done"]
    assert results == {"openai": whole, "ollama": whole}
    assert service.most_at_once == 3


def test_json_formats_reach_the_worker(served):
    """Ollama's format and OpenAI's response_format become GENERATE's format (the worker constrains)."""
    service, url = served
    schema = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    msgs = [{"role": "user", "content": "x"}]
    ollama_client(url).chat(model="tiny", messages=msgs, format="json")
    assert service.submitted[-1].format == "json"
    ollama_client(url).chat(model="tiny", messages=msgs, format=schema)
    assert service.submitted[-1].format == schema
    client = openai_client(url)
    client.chat.completions.create(model="tiny", messages=msgs, response_format={"type": "json_object"})
    assert service.submitted[-1].format == "json"
    spec = {"name": "switch", "schema": schema}
    client.chat.completions.create(
        model="tiny", messages=msgs, response_format={"type": "json_schema", "json_schema": spec}
    )
    assert service.submitted[-1].format == schema
    client.chat.completions.create(model="tiny", messages=msgs)
    assert service.submitted[-1].format is None


def test_earlier_tool_calls_are_checked_in_both_shapes(served):
    """An assistant message's tool call: arguments an object or a JSON object string, else a 400."""
    service, url = served
    for args in ({"area": "Kitchen"}, '{"area": "Kitchen"}'):
        call = {"id": "call_1", "type": "function", "function": {"name": "HassTurnOff", "arguments": args}}
        history = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "ok"}]
        for path in ("/api/chat", "/v1/chat/completions"):
            status, _ = http(url + path, {"model": "tiny", "messages": history, "stream": False})
            assert status == 200
            sent = service.submitted[-1].messages[0]["tool_calls"][0]
            assert sent["function"]["arguments"] == {"area": "Kitchen"} and sent["id"] == "call_1"
    for args in ("[" * 5000, "not json", "[1, 2]", 7):
        call = {"function": {"name": "HassTurnOff", "arguments": args}}
        history = [{"role": "assistant", "content": "", "tool_calls": [call]}]
        for path in ("/api/chat", "/v1/chat/completions"):
            status, body = http(url + path, {"model": "tiny", "messages": history, "stream": False})
            assert status == 400 and b"arguments" in body, (path, args, body[:200])


# -- models of the models directory ---------------------------------------------------------------------
def local_info(name: str, family: str = "llama") -> ModelInfo:
    return ModelInfo(name, 9_999, "cd" * 32, family, "1.2M", "Q8_0", 1.8e9, 512, "", {}, configured=name, local=True)


def test_local_models_are_listed_shown_and_named_like_the_served_one(served):
    """/api/tags and /v1/models list the served model first, then the models directory's, with sha256,
    family, quantization and parameter size; /api/show and /v1/models/{id} answer for them; a request
    naming one runs on it only (submit's model: the daemon's queue loads it)."""
    service, url = served
    service.local = {"small": local_info("small"), "other": local_info("other", "gemma3")}
    client = ollama_client(url)
    listed = client.list().models
    assert [m.model for m in listed] == ["tiny", "other", "small"]
    small = listed[2]
    assert small.digest == "cd" * 32 and small.size == 9_999
    assert (small.details.family, small.details.quantization_level, small.details.parameter_size) == (
        "llama",
        "Q8_0",
        "1.2M",
    )
    assert client.show("small:latest").details.family == "llama"
    oa = openai_client(url)
    assert [m.id for m in oa.models.list().data] == ["tiny", "other", "small"]
    assert oa.models.retrieve("other").id == "other"
    r = client.chat(model="small", messages=[{"role": "user", "content": "hi"}])
    assert r.model == "small" and service.models_asked[-1] == "small"  # the daemon's queue loads it
    c = oa.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert c.model == "other" and service.models_asked[-1] == "other"
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert service.models_asked[-1] is None  # the stand-in's served model has no configured name
    with pytest.raises(ollama.ResponseError) as e:
        client.show("absent")
    assert e.value.status_code == 404 and "pull" in str(e.value)


def test_delete_removes_a_pulled_model_and_refuses_the_served_one(served):
    """DELETE /api/delete (the ollama client's `delete`): a pulled model goes; one that is not there is a
    404; the served model is refused, 409 when it was pulled (a worker restart would not find it), 400
    when genie did not pull it."""
    service, url = served
    service.local = {"small": local_info("small")}
    client = ollama_client(url)
    assert client.delete("small").status == "success" and "small" not in service.local
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("small")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("tiny")
    assert e.value.status_code == 400 and "pulled" in str(e.value)
    service.info = local_info("tiny")
    service.local = {"tiny": service.info}
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("tiny")
    assert e.value.status_code == 409 and "tiny" in service.local


def test_keep_alive_zero_naming_another_model_unloads_nothing(served):
    """keep_alive 0 unloads the named model if it is loaded; naming a model that is not loaded leaves the
    served one alone. An empty request naming a pulled model loads it."""
    service, url = served
    service.local = {"small": local_info("small")}
    client = ollama_client(url)
    assert client.chat(model="small", messages=[], keep_alive=0).done_reason == "unload" and service.unloads == 0
    assert client.generate(model="small", prompt="").done_reason == "load" and service.loaded[-1] == "small"
    assert client.chat(model="tiny", messages=[], keep_alive=0).done_reason == "unload" and service.unloads == 1
