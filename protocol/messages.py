"""The messages of protocol v1 (protocol/SPEC.md): one dataclass each, with its one-byte type and the
rules its body must satisfy. Client <-> daemon: GENERATE, CANCEL, PREWARM, DELTA, DONE, ERROR; admin:
STATUS, HEALTH, LOAD, UNLOAD, METRICS, KV_LIST, KV_EVICT, KV_CLEAR, STOP, answered by REPLY or ERROR, and PULL,
answered by progress REPLYs, then a last REPLY or ERROR."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypedDict, get_args

from .errors import BAD_MESSAGE, ProtocolError
from .schema import Field, rules_of, validate, wire

# How an answer ended (DONE.finish_reason): its stop (EOS or a stop string), its token cap, cancelled, or an error
FinishReason = Literal["stop", "length", "cancelled", "error"]
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
# GENERATE.priority, in the order the daemon's queues and the engine's prefills serve them; a GENERATE that names
# none is a voice request (DEFAULT_PRIORITY), and so is an engine sequence that names none
Priority = Literal["voice", "background"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)
DEFAULT_PRIORITY: Priority = "voice"


class Usage(TypedDict, total=False):
    """DONE.usage (SPEC.md); an answer that ended before the worker ran it (cancelled while queued) has none."""

    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, hydrated from saved KV or kept in the slot
    completion_tokens: int
    dropped_messages: int  # the oldest messages left out so that a conversation fits the context
    ctx: int  # the context it had: GENERATE's ctx, at most the worker's


class Timings(TypedDict, total=False):
    """DONE.timings (SPEC.md), as Usage."""

    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    prefill_tok_s: float
    decode_tok_s: float


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
    def rules(cls) -> dict[str, Field]:
        """Its fields' wire rules, derived once from their declarations (schema.wire)."""
        rules = cls.__dict__.get("_rules")
        if rules is None:
            rules = rules_of(cls)
            cls._rules = rules  # type: ignore[attr-defined]
        return rules

    @classmethod
    def from_body(cls, body: Any) -> Message:
        return cls(**validate(cls.__name__, body, cls.rules()))


@dataclass
class Generate(Message):
    TYPE = 0x01
    request_id: str = wire("id")
    messages: list[dict[str, Any]] | None = wire("messages", default=None)
    prompt: str | None = wire("str", default=None)
    token_ids: list[int] | None = wire("token_ids", default=None)
    params: dict[str, Any] = wire("dict", default_factory=dict)
    conv_id: str | None = wire("conv_id", default=None)
    stream: bool = wire("bool", default=True)
    priority: Priority = wire("enum:" + "|".join(PRIORITIES), default=DEFAULT_PRIORITY)
    think: bool = wire("bool", default=False)
    tools: list[dict[str, Any]] | None = wire(
        "tools", default=None
    )  # tool definitions the chat template renders (messages only)
    format: str | dict[str, Any] | None = wire(
        "format", default=None
    )  # "json" or a JSON schema: the output is constrained to it
    # the context the request asks for (Ollama's num_ctx): its prompt and answer fit in this many tokens, at
    # most the worker's (DONE's usage.ctx says which was used); None: the worker's
    ctx: int | None = wire("int", default=None)

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
            field = f"params.{e.field}" if e.field else ""
            raise ProtocolError(e.code, e.message, msg.request_id, field, e.problem) from None
        return msg


@dataclass
class Delta(Message):
    TYPE = 0x02
    request_id: str = wire("id")
    text: str = wire("str")
    token_ids: list[int] = wire("token_ids", default_factory=list)
    sentence_end: bool = wire("bool", default=False)
    # what `text` is: the answer, or reasoning (the model's markup is read by the worker, never sent)
    kind: str = wire("enum:content|thinking", default="content")
    # tool calls the model made, complete, each {name, arguments}: a DELTA of its own, after the text before them
    tool_calls: list[dict[str, Any]] | None = wire("tool_calls", default=None)


@dataclass
class Done(Message):
    TYPE = 0x03
    request_id: str = wire("id")
    finish_reason: FinishReason = wire("enum:" + "|".join(FINISH_REASONS))
    usage: Usage = wire("dict", default_factory=Usage)
    timings: Timings = wire("dict", default_factory=Timings)


@dataclass
class Error(Message):
    TYPE = 0x04
    code: str = wire("str", limit=64)
    message: str = wire("str", limit=4096)
    request_id: str | None = wire("id", default=None)


@dataclass
class Cancel(Message):
    TYPE = 0x05
    request_id: str = wire("id")


@dataclass
class Prewarm(Message):
    TYPE = 0x06
    request_id: str = wire("id")
    messages: list[dict[str, Any]] | None = wire("messages", default=None)
    prompt: str | None = wire("str", default=None)
    conv_id: str | None = wire("conv_id", default=None)
    priority: ClassVar[Priority] = "voice"  # served as a voice request (the wake word came): not on the wire


@dataclass
class AdminCall(Message):
    """Admin calls carry a request id (and at most one argument); each is answered by REPLY or ERROR."""

    request_id: str = wire("id")


@dataclass
class Status(AdminCall):
    TYPE = 0x10


@dataclass
class Health(AdminCall):
    TYPE = 0x11


@dataclass
class Load(AdminCall):
    TYPE = 0x12
    model: str = wire("str", limit=4096)


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
    entry_id: str = wire("id")  # as KV_LIST names it: c-<conv id>.<tag> or t-<hash>.<tag>


@dataclass
class KvClear(AdminCall):
    TYPE = 0x17


@dataclass
class Pull(AdminCall):
    """Answered by REPLYs {done: false, status, …} as the pull goes, then REPLY {done: true, …} or ERROR;
    a CANCEL of its request id on the admin socket stops it."""

    TYPE = 0x18
    model: str = wire("str", limit=4096)  # a catalogue name, hf://OWNER/REPO/FILE.gguf or an http(s) URL of a GGUF file


@dataclass
class Stop(AdminCall):
    """The daemon stops as on SIGTERM (turns cancelled, their KV saved, exit 0), after answering REPLY."""

    TYPE = 0x19


@dataclass
class Reply(Message):
    TYPE = 0x1F
    request_id: str = wire("id")
    data: dict[str, Any] = wire("dict")


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
    protocol_version: int = wire("int")
    pid: int = wire("int")


@dataclass
class Ready(Message):
    """Worker -> daemon: the model is loaded and requests may come."""

    TYPE = 0x21
    model: str = wire("str", limit=4096)
    ctx: int = wire("int")  # the context a KV slot holds (memory_plan.py sized it)
    parallel: int = wire("int")  # requests it serves at once, one per KV slot
    backend: str = wire("str", limit=256)
    device: str = wire("str", limit=256)
    load_ms: float = wire("float")
    # the worker's memory plan: weights_mb, kv_mb, scratch_mb, total_mb, budget_mb, ctx, slots
    memory: dict | None = wire("dict", default=None)


@dataclass
class Heartbeat(Message):
    """Worker -> daemon every second; the daemon counts a worker dead after three missed."""

    TYPE = 0x22
    seq: int = wire("int")
    busy: bool = wire("bool", default=False)
    thermal: dict | None = wire(
        "dict", default=None
    )  # {temp_c: float or None, throttled: bool, paused_steps: int} (workers/thermal.py)
    kv_saves: dict | None = wire("dict", default=None)  # its KV saves' counts: kv_messages.KvSaveCounts


@dataclass
class Dead(Message):
    """Worker -> daemon, last: a fatal error; the worker exits and the daemon restarts it."""

    TYPE = 0x23
    reason: str = wire("str", limit=4096)
