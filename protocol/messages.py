"""The messages of protocol v1 (protocol/SPEC.md): one dataclass each, with its one-byte type and the
rules its body must satisfy. Client <-> daemon: GENERATE, CANCEL, PREWARM, DELTA, DONE, ERROR; admin:
STATUS, HEALTH, LOAD, UNLOAD, METRICS, KV_LIST, KV_EVICT, KV_CLEAR, answered by REPLY or ERROR, and PULL,
answered by progress REPLYs, then a last REPLY or ERROR."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .errors import BAD_MESSAGE, ProtocolError
from .schema import Field, validate

# Sampling parameters a GENERATE may carry (all optional; the engine's defaults apply, but the daemon sets
# max_tokens when it is absent: SPEC.md).
# Every number is bounded here, at the boundary; the engine checks the finer ranges (temperature >= 0, ...).
PARAMS = {
    "temperature": Field("float", limit=100),
    "top_k": Field("int", limit=1 << 20),
    "top_p": Field("float", limit=1),
    "min_p": Field("float", limit=1),
    "repeat_penalty": Field("float", limit=100),
    "repeat_last_n": Field("int", limit=1 << 20),
    "seed": Field("int", limit=(1 << 63) - 1),
    "max_tokens": Field("int", limit=1 << 20),
    "stop": Field("str_list"),
    "ignore_eos": Field("bool"),
}


@dataclass
class Message:
    TYPE: ClassVar[int]
    FIELDS: ClassVar[dict[str, Field]]
    MAX_SIDE_FRAMES: ClassVar[int] = 64  # raw frames after the body (codec.py); the KV messages carry more

    def body(self) -> dict[str, Any]:
        # shallow on purpose: dataclasses.asdict deep-copies every list, and this runs once per token
        return {k: v for k in self._names() if (v := getattr(self, k)) is not None}

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in fields(cls))
            cls._field_names = names  # type: ignore[attr-defined]
        return names

    @classmethod
    def from_body(cls, body: Any) -> Message:
        return cls(**validate(cls.__name__, body, cls.FIELDS))


@dataclass
class Generate(Message):
    TYPE = 0x01
    FIELDS = {
        "request_id": Field("id", required=True),
        "messages": Field("messages"),
        "prompt": Field("str"),
        "token_ids": Field("token_ids"),
        "params": Field("dict"),
        "conv_id": Field("conv_id"),
        "stream": Field("bool"),
        "priority": Field("enum:voice|background"),
        "think": Field("bool"),
        "tools": Field("tools"),
        "format": Field("format"),
        "ctx": Field("int"),
    }
    request_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    token_ids: list[int] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    conv_id: str | None = None
    stream: bool = True
    priority: str = "voice"
    think: bool = False
    tools: list[dict[str, Any]] | None = None  # tool definitions the chat template renders (messages only)
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema: the output is constrained to it
    # the context the request asks for (Ollama's num_ctx): its prompt and answer fit in this many tokens, at
    # most the worker's (DONE's usage.ctx says which was used); None: the worker's
    ctx: int | None = None

    @classmethod
    def from_body(cls, body: Any) -> Message:
        msg = super().from_body(body)
        assert isinstance(msg, Generate)
        given = [k for k in ("messages", "prompt", "token_ids") if getattr(msg, k) is not None]
        if len(given) != 1 or msg.token_ids == []:
            raise ProtocolError(
                BAD_MESSAGE, "GENERATE needs exactly one of messages, prompt, token_ids", msg.request_id
            )
        if msg.ctx is not None and msg.ctx < 1:
            raise ProtocolError(BAD_MESSAGE, "GENERATE.ctx must be >= 1 (tokens)", msg.request_id)
        try:
            msg.params = validate("GENERATE.params", msg.params, PARAMS)
        except ProtocolError as e:
            raise ProtocolError(e.code, e.message, msg.request_id) from None
        return msg


@dataclass
class Delta(Message):
    TYPE = 0x02
    FIELDS = {
        "request_id": Field("id", required=True),
        "text": Field("str", required=True),
        "token_ids": Field("token_ids"),
        "sentence_end": Field("bool"),
    }
    request_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    sentence_end: bool = False


@dataclass
class Done(Message):
    TYPE = 0x03
    FIELDS = {
        "request_id": Field("id", required=True),
        "finish_reason": Field("enum:stop|length|cancelled|error", required=True),
        "usage": Field("dict"),
        "timings": Field("dict"),
    }
    request_id: str
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, cached_tokens, completion_tokens
    timings: dict[str, float] = field(default_factory=dict)  # ttft_ms, prefill_ms, decode_ms, prefill/decode_tok_s


@dataclass
class Error(Message):
    TYPE = 0x04
    FIELDS = {
        "request_id": Field("id"),
        "code": Field("str", required=True, limit=64),
        "message": Field("str", required=True, limit=4096),
    }
    code: str
    message: str
    request_id: str | None = None


@dataclass
class Cancel(Message):
    TYPE = 0x05
    FIELDS = {"request_id": Field("id", required=True)}
    request_id: str


@dataclass
class Prewarm(Message):
    TYPE = 0x06
    FIELDS = {
        "request_id": Field("id", required=True),
        "messages": Field("messages"),
        "prompt": Field("str"),
        "conv_id": Field("conv_id"),
    }
    request_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    conv_id: str | None = None


@dataclass
class AdminCall(Message):
    """Admin calls carry a request id (and at most one argument); each is answered by REPLY or ERROR."""

    FIELDS = {"request_id": Field("id", required=True)}
    request_id: str


@dataclass
class Status(AdminCall):
    TYPE = 0x10


@dataclass
class Health(AdminCall):
    TYPE = 0x11


@dataclass
class Load(AdminCall):
    TYPE = 0x12
    FIELDS = {**AdminCall.FIELDS, "model": Field("str", required=True, limit=4096)}
    model: str = ""


@dataclass
class Unload(AdminCall):
    TYPE = 0x13


@dataclass
class Metrics(AdminCall):
    TYPE = 0x14


@dataclass
class KvList(AdminCall):
    TYPE = 0x15


@dataclass
class KvEvict(AdminCall):
    TYPE = 0x16
    FIELDS = {**AdminCall.FIELDS, "entry_id": Field("id", required=True)}
    entry_id: str = ""  # as KV_LIST names it: c-<conv id>.<tag> or t-<hash>.<tag>


@dataclass
class KvClear(AdminCall):
    TYPE = 0x17


@dataclass
class Pull(AdminCall):
    """Answered by REPLYs {done: false, status, …} as the pull goes, then REPLY {done: true, …} or ERROR;
    a CANCEL of its request id on the admin socket stops it."""

    TYPE = 0x18
    FIELDS = {**AdminCall.FIELDS, "model": Field("str", required=True, limit=4096)}
    model: str = ""  # a catalogue name, hf://OWNER/REPO/FILE.gguf or an http(s) URL of a GGUF file


@dataclass
class Reply(Message):
    TYPE = 0x1F
    FIELDS = {"request_id": Field("id", required=True), "data": Field("dict", required=True)}
    request_id: str
    data: dict[str, Any]


# -- daemon <-> worker control ------------------------------------------------------------------------
def worker_identities(pid: int) -> tuple[bytes, bytes]:
    """A worker's two DEALER identities on the daemon's ROUTER: requests go to the first ("<pid>:in"),
    answers come from the second ("<pid>:out"), so the engine thread sends without handing every token
    to the I/O thread."""
    return f"{pid}:in".encode(), f"{pid}:out".encode()


@dataclass
class Hello(Message):
    """Worker -> daemon, first: who is starting."""

    TYPE = 0x20
    FIELDS = {"protocol_version": Field("int", required=True), "pid": Field("int", required=True)}
    protocol_version: int
    pid: int


@dataclass
class Ready(Message):
    """Worker -> daemon: the model is loaded and requests may come."""

    TYPE = 0x21
    FIELDS = {
        "model": Field("str", required=True, limit=4096),
        "n_ctx": Field("int", required=True),
        "kv_capacity": Field("int", required=True),
        "backend": Field("str", required=True, limit=256),
        "device": Field("str", required=True, limit=256),
        "load_ms": Field("float", required=True),
        "memory": Field("dict"),
    }
    model: str
    n_ctx: int
    kv_capacity: int  # sequences the KV pool holds
    backend: str
    device: str
    load_ms: float
    # the worker's memory plan: weights_mb, kv_mb, scratch_mb, total_mb, budget_mb, ctx, slots
    memory: dict | None = None


@dataclass
class Heartbeat(Message):
    """Worker -> daemon every second; the daemon counts a worker dead after three missed."""

    TYPE = 0x22
    FIELDS = {"seq": Field("int", required=True), "busy": Field("bool"), "thermal": Field("dict")}
    seq: int
    busy: bool = False
    thermal: dict | None = None  # {temp_c: float or None, throttled: bool, paused_steps: int} (workers/thermal.py)


@dataclass
class Dead(Message):
    """Worker -> daemon, last: a fatal error; the worker exits and the daemon restarts it."""

    TYPE = 0x23
    FIELDS = {"reason": Field("str", required=True, limit=4096)}
    reason: str


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Generate,
        Delta,
        Done,
        Error,
        Cancel,
        Prewarm,
        Status,
        Health,
        Load,
        Unload,
        Metrics,
        KvList,
        KvEvict,
        KvClear,
        Pull,
        Reply,
        Hello,
        Ready,
        Heartbeat,
        Dead,
    )
}
