"""Frames on the wire: [1-byte message type + msgpack body] followed by optional raw side frames (bulk
arrays, never pickled). `decode` accepts nothing it has not checked: size limits first, then msgpack with
bounded lengths and nesting, then the message's field rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from . import kv_messages as kv
from . import messages as m
from .errors import BAD_FRAME, BAD_MESSAGE, ProtocolError
from .messages import Message
from .schema import check

# every message type by its byte, the one table (SPEC.md's): client and admin, daemon <-> worker, worker <-> KV store
MESSAGE_TYPES: dict[int, type[Message]] = {}
for _cls in (
    *(m.Generate, m.Delta, m.Done, m.Error, m.Cancel, m.Prewarm),
    *(m.Status, m.Health, m.Load, m.Unload, m.Metrics, m.KvList, m.KvEvict, m.KvClear, m.Pull, m.Stop, m.Reply),
    *(m.Hello, m.Ready, m.Heartbeat, m.Dead),
    *(kv.KvSave, kv.KvLookup, kv.KvData, kv.KvSaved),
):
    if _cls.TYPE in MESSAGE_TYPES:
        raise TypeError(f"{_cls.__name__} and {MESSAGE_TYPES[_cls.TYPE].__name__} share type 0x{_cls.TYPE:02x}")
    _cls.rules()  # every field declared with wire(): a TypeError at import, not at the first message
    MESSAGE_TYPES[_cls.TYPE] = _cls

MAX_BODY_BYTES = 4 << 20  # a GENERATE with a long conversation fits; anything larger is refused unread
# Side frames a message may carry are its type's own bound (Message.MAX_SIDE_FRAMES: 4 per KV pool for the
# KV messages); more than any type allows is refused before the body is read.
MAX_SIDE_FRAMES = max(cls.MAX_SIDE_FRAMES for cls in MESSAGE_TYPES.values())

Frame = bytes | bytearray | memoryview


def encode(msg: Message, side: Sequence[Frame] = ()) -> list[Frame]:
    """The frames of `msg`; a ProtocolError (with its request id) for a value msgpack cannot carry, such
    as an integer beyond 64 bits."""
    try:
        body = msgpack.packb(msg.body(), use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as e:
        rid = getattr(msg, "request_id", None)
        raise ProtocolError(BAD_MESSAGE, f"{type(msg).__name__.upper()} cannot be encoded: {e}", rid) from None
    return [bytes((msg.TYPE,)) + body, *side]


def _unpack(body: Frame) -> Any:
    limit = len(body)
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=True,
        max_str_len=limit,
        max_bin_len=limit,
        max_array_len=limit,
        max_map_len=limit // 2,
        max_ext_len=0,
    )


def decode(frames: Sequence[Frame], max_body_bytes: int = MAX_BODY_BYTES) -> tuple[Message, list[Frame]]:
    """The message of `frames` and its side frames; a ProtocolError (with the request id when one could
    be read) for anything else."""
    if not frames or len(frames[0]) == 0:
        raise ProtocolError(BAD_FRAME, "empty frame")
    n_side = len(frames) - 1
    if n_side > MAX_SIDE_FRAMES:
        raise ProtocolError(BAD_FRAME, f"{n_side} side frames (at most {MAX_SIDE_FRAMES})")
    head = memoryview(frames[0])
    if len(head) - 1 > max_body_bytes:
        raise ProtocolError(BAD_FRAME, f"body of {len(head) - 1} bytes (at most {max_body_bytes})")
    try:
        body = _unpack(head[1:])
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, UnicodeDecodeError) as e:
        rid = _salvage_request_id(head[1:])
        raise ProtocolError(BAD_FRAME, f"body is not valid msgpack: {type(e).__name__}", rid) from None
    cls = MESSAGE_TYPES.get(head[0])
    if cls is None:
        raise ProtocolError(BAD_FRAME, f"unknown message type 0x{head[0]:02x}", _request_id(body))
    if n_side > cls.MAX_SIDE_FRAMES:
        limit = f"a {cls.__name__.upper()} carries at most {cls.MAX_SIDE_FRAMES}"
        raise ProtocolError(BAD_FRAME, f"{n_side} side frames ({limit})", _request_id(body))
    return cls.from_body(body), list(frames[1:])


def _request_id(body: Any) -> str | None:
    """The body's request id if it is a valid one (protocol/schema.py), so the refusal can name it."""
    rid = body.get("request_id") if isinstance(body, dict) else None
    return rid if check("id", rid, 0) is None else None


def _salvage_request_id(body: Frame) -> str | None:
    """The request id of a body that does not parse as a whole, read from its leading map entries, so
    the sender still gets an ERROR for that request."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(body) + 1, max_ext_len=0)
    unpacker.feed(body)
    try:
        for _ in range(min(unpacker.read_map_header(), 64)):
            key = unpacker.unpack()
            if key == "request_id":
                return _request_id({"request_id": unpacker.unpack()})
            unpacker.skip()
    except Exception:  # whatever broke the whole body breaks here too: no id
        return None
    return None
