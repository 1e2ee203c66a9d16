"""Worker <-> KV-store messages (protocol/SPEC.md, "KV store"). Bulk KV travels as raw side frames:
all layers' K stacked, then V, then (INT8) K scales and V scales, in the layout the body names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BAD_MESSAGE, ProtocolError
from .messages import Message
from .schema import Field, validate

# The KV layout a save or lookup is for; the store checks it against every file it serves.
LAYOUT = {
    "dtype": Field("enum:int8|f16|f32", required=True),
    "n_layers": Field("int", required=True, limit=1024),
    "n_kv_heads": Field("int", required=True, limit=1024),
    "head_dim": Field("int", required=True, limit=4096),
    "v_head_dim": Field("int", required=True, limit=4096),
    "windows": Field("int_list", required=True, limit=1024),
}


@dataclass
class _KvRequest(Message):
    """A save or lookup: names the model (fingerprint, 64 hex digits), the KV layout and the tokens."""

    FIELDS = {
        "request_id": Field("id", required=True),
        "fingerprint": Field("str", required=True, limit=64),
        "layout": Field("dict", required=True),
        "token_ids": Field("token_ids", required=True),
        "conv_id": Field("conv_id"),
    }
    request_id: str
    fingerprint: str
    layout: dict[str, Any]
    token_ids: list[int]
    conv_id: str | None = None

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
        if any(v < 1 for k, v in layout.items() if k not in ("dtype", "windows")):
            raise ProtocolError(BAD_MESSAGE, "KV layout sizes must be >= 1", rid)
        if len(layout["windows"]) != layout["n_layers"]:
            raise ProtocolError(BAD_MESSAGE, "KV layout needs one window per layer", rid)
        return msg


@dataclass
class KvSave(_KvRequest):
    """Worker -> store at turn end: positions [0, len(token_ids)) of a conversation; answered by KV_SAVED."""

    TYPE = 0x30


@dataclass
class KvLookup(_KvRequest):
    """Worker -> store at turn start: the longest saved prefix of `token_ids` longer than `longer_than`
    (what the worker already holds); answered by KV_DATA."""

    TYPE = 0x31
    FIELDS = {**_KvRequest.FIELDS, "longer_than": Field("int", limit=1 << 31)}
    longer_than: int = 0


@dataclass
class KvData(Message):
    """Store -> worker: positions [0, n_tokens) of the best entry in side frames; n_tokens 0 = a miss."""

    TYPE = 0x32
    FIELDS = {"request_id": Field("id", required=True), "n_tokens": Field("int", required=True, limit=1 << 31)}
    request_id: str
    n_tokens: int


@dataclass
class KvSaved(Message):
    """Store -> worker: the save is durable on disk."""

    TYPE = 0x33
    FIELDS = {"request_id": Field("id", required=True), "bytes": Field("int", required=True)}
    request_id: str
    bytes: int
