"""Worker <-> KV-store messages (protocol/SPEC.md, "KV store"). Bulk KV travels as raw side frames: per
pool its K and V, then (INT8) per pool its K and V scales, in the layout the body names. Also the worker's
count of its saves, which its HEARTBEAT carries to the daemon."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import BAD_MESSAGE, ProtocolError
from .messages import Message
from .schema import Field, validate, wire

# The KV layout a save or lookup is for; the store checks it against every file it serves.
# Per pool (a layer that writes K/V): KV heads, K and V head dims, sliding window; each list n_layers long.
LAYOUT = {
    "dtype": Field("enum:int8|f16|f32", required=True),
    "n_layers": Field("int", required=True, limit=1024),
    "n_kv_heads": Field("int_list", required=True, limit=1024),
    "head_dim": Field("int_list", required=True, limit=1024),
    "v_head_dim": Field("int_list", required=True, limit=1024),
    "windows": Field("int_list", required=True, limit=1024),
}
LAYOUT_MAX = {"n_kv_heads": 1024, "head_dim": 4096, "v_head_dim": 4096}  # per entry
# KV side frames: per pool K and V, and for INT8 their two scale arrays
KV_MAX_SIDE_FRAMES = 4 * LAYOUT["n_layers"].limit


@dataclass
class _KvRequest(Message):
    """A save or lookup: names the model (fingerprint, 64 hex digits), the KV layout and the tokens."""

    request_id: str = wire("id")
    fingerprint: str = wire("str", limit=64)
    layout: dict[str, Any] = wire("dict")
    token_ids: list[int] = wire("token_ids")
    conv_id: str | None = wire("conv_id", default=None)

    @classmethod
    def from_body(cls, body: Any) -> Message:
        msg = super().from_body(body)
        rid = getattr(msg, "request_id", None)
        fp = getattr(msg, "fingerprint", "")
        if len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp):
            raise ProtocolError(BAD_MESSAGE, f"{cls.__name__}.fingerprint must be 64 lowercase hex digits", rid)
        try:
            layout = validate("KV layout", getattr(msg, "layout", None), LAYOUT)
        except ProtocolError as e:
            raise ProtocolError(e.code, e.message, rid) from None
        if layout["n_layers"] < 1:
            raise ProtocolError(BAD_MESSAGE, "KV layout sizes must be >= 1", rid)
        for key in ("n_kv_heads", "head_dim", "v_head_dim", "windows"):
            if len(layout[key]) != layout["n_layers"]:
                raise ProtocolError(BAD_MESSAGE, f"KV layout {key} needs one value per pool", rid)
        for key, most in LAYOUT_MAX.items():
            if any(not 1 <= v <= most for v in layout[key]):
                raise ProtocolError(BAD_MESSAGE, f"KV layout {key} must be in [1, {most}]", rid)
        return msg


@dataclass
class KvSave(_KvRequest):
    """Worker -> store at turn end: positions [0, len(token_ids)) of a conversation; answered by KV_SAVED."""

    TYPE = 0x30
    MAX_SIDE_FRAMES = KV_MAX_SIDE_FRAMES


@dataclass
class KvLookup(_KvRequest):
    """Worker -> store at turn start: the longest saved prefix of `token_ids` longer than `longer_than`
    (what the worker already holds); answered by KV_DATA."""

    TYPE = 0x31
    longer_than: int = wire("int", limit=1 << 31, default=0)


@dataclass
class KvData(Message):
    """Store -> worker: positions [0, n_tokens) of the best entry in side frames; n_tokens 0 = a miss."""

    TYPE = 0x32
    MAX_SIDE_FRAMES = KV_MAX_SIDE_FRAMES
    request_id: str = wire("id")
    n_tokens: int = wire("int", limit=1 << 31)


@dataclass
class KvSaved(Message):
    """Store -> worker: the save is durable on disk."""

    TYPE = 0x33
    request_id: str = wire("id")
    bytes: int = wire("int")


def _count(help_text: str) -> Any:
    return field(default=0, metadata={"help": help_text})


@dataclass
class KvSaveCounts:
    """A worker's KV saves since it started: HEARTBEAT's `kv_saves`, STATUS's `kv.worker_saves`, and /metrics'
    `genie_kv_worker_saves_<field>`, whose help text each field's is. Before, a save the store was not there to
    take was only a log line (issue 34 item 9)."""

    acked: int = _count("KV saves of this worker the store wrote durably (KV_SAVED)")
    kept: int = _count("KV saves the store did not take at once (down, restarting), kept for it in the worker")
    handed_over: int = _count("Kept KV saves the store took later")
    dropped: int = _count("KV saves lost: beyond the worker's backlog or what it keeps, or not copied to the host")
    held: int = _count("KV saves kept now, waiting for the store")
    held_bytes: int = _count("Bytes of the KV saves kept now")

    def body(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> KvSaveCounts:
        """From a HEARTBEAT's `kv_saves`: a field missing, or not a count, reads 0; other keys are ignored."""
        values = {f.name: body.get(f.name) for f in fields(cls)}
        return cls(**{k: v if type(v) is int and v >= 0 else 0 for k, v in values.items()})
