"""Field rules for message bodies: declared as data, checked by one function.

A rule is (kind, required, limit): kind is one of the keys of `_CHECKS`; limit bounds a string's length,
a list's length, or a number's magnitude. A message declares each field once, as a dataclass attribute
whose value is `wire(kind, ...)`: its rule is derived from it (required: the attribute has no default).
Nothing from the wire reaches genie without passing here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import BAD_MESSAGE, ProtocolError

MAX_ID_LEN = 128
CONV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_TEXT_LEN = 1 << 20  # one prompt or message: 1 MiB of text
MAX_MESSAGES = 1024
MAX_TOKENS_IN = 1 << 17
MAX_STOP = 16
MAX_TOOLS = 128


@dataclass(frozen=True)
class Field:
    # str | int | float | bool | token_ids | messages | str_list | dict | tools | tool_calls | format | enum:<a>|<b>
    kind: str
    required: bool = False
    limit: int = 0  # 0: the kind's default


WIRE = "genie_wire"  # the dataclass field metadata key wire() sets


def wire(
    kind: str, *, limit: int = 0, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING
) -> Any:
    """A message attribute carried on the wire as `kind` (limit as in Field); without a default it is
    required there too."""
    meta = {WIRE: (kind, limit)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def rules_of(cls: type) -> dict[str, Field]:
    """The rules of a message dataclass's attributes, from their wire() declarations; an attribute declared
    without one is a programming error, reported here."""
    rules = {}
    for f in dataclasses.fields(cls):
        if WIRE not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with wire()")
        kind, limit = f.metadata[WIRE]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        rules[f.name] = Field(kind, required, limit)
    return rules


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_messages(v: Any) -> str | None:
    if not isinstance(v, list) or not 0 < len(v) <= MAX_MESSAGES:
        return f"must be a list of 1 to {MAX_MESSAGES} messages"
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            return f"[{i}] must be a map"
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            return f"[{i}].role must be system, user, assistant or tool"
        content = m.get("content", "")
        if not isinstance(content, str) or len(content) > MAX_TEXT_LEN:
            return f"[{i}].content must be a string of at most {MAX_TEXT_LEN} characters"
        if any(not isinstance(k, str) for k in m):
            return f"[{i}] keys must be strings"
    return None


def check(kind: str, value: Any, limit: int) -> str | None:
    """None if `value` satisfies the rule, else what is wrong with it."""
    if kind.startswith("enum:"):
        options = kind[5:].split("|")
        return None if value in options else f"must be one of {', '.join(options)}"
    if kind == "str":
        n = limit or MAX_TEXT_LEN
        return None if isinstance(value, str) and len(value) <= n else f"must be a string of at most {n} characters"
    if kind == "id":
        ok = isinstance(value, str) and 0 < len(value) <= MAX_ID_LEN and value.isprintable()
        return None if ok else f"must be a printable string of 1 to {MAX_ID_LEN} characters"
    if kind == "conv_id":  # it names a file of the KV store: a strict charset, no path
        ok = isinstance(value, str) and CONV_ID.fullmatch(value) is not None and ".." not in value
        return None if ok else "must be 1 to 128 of A-Z a-z 0-9 . _ - starting with a letter or digit"
    if kind == "int":
        n = limit or (1 << 62)
        return None if _is_int(value) and abs(value) <= n else f"must be an integer within ±{n}"
    if kind == "float":
        bound = limit or 1e300
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok and abs(value) <= bound else f"must be a finite number within ±{bound:g}"
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "token_ids":
        ok = (
            isinstance(value, list)
            and len(value) <= MAX_TOKENS_IN
            and all(_is_int(t) and 0 <= t < 1 << 31 for t in value)
        )
        return None if ok else f"must be a list of at most {MAX_TOKENS_IN} non-negative token ids"
    if kind == "int_list":
        n = limit or 1024
        ok = isinstance(value, list) and len(value) <= n and all(_is_int(v) and 0 <= v < 1 << 31 for v in value)
        return None if ok else f"must be a list of at most {n} non-negative integers"
    if kind == "str_list":
        n = limit or MAX_STOP
        ok = (
            isinstance(value, list) and len(value) <= n and all(isinstance(s, str) and 0 < len(s) <= 256 for s in value)
        )
        return None if ok else f"must be a list of at most {n} non-empty strings of at most 256 characters"
    if kind == "messages":
        return _check_messages(value)
    if kind == "dict":
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
        return None if ok else "must be a map with string keys"
    if kind == "format":
        ok = value == "json" or (isinstance(value, dict) and all(isinstance(k, str) for k in value))
        return None if ok else 'must be "json" or a JSON schema (a map)'
    if kind == "tool_calls":
        ok = isinstance(value, list) and 0 < len(value) <= MAX_TOOLS
        ok = ok and all(
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and 0 < len(c["name"]) <= MAX_ID_LEN
            and isinstance(c.get("arguments"), dict)
            and all(isinstance(k, str) for k in c["arguments"])
            for c in value
        )
        return None if ok else f"must be a list of 1 to {MAX_TOOLS} maps {{name, arguments}}"
    if kind == "tools":
        ok = isinstance(value, list) and len(value) <= MAX_TOOLS and all(isinstance(t, dict) for t in value)
        return None if ok else f"must be a list of at most {MAX_TOOLS} maps (tool definitions)"
    raise AssertionError(f"unknown rule kind {kind}")


def validate(name: str, body: Any, fields: dict[str, Field]) -> dict[str, Any]:
    """The body as a dict of known fields; unknown fields are ignored (forward compatibility)."""
    request_id = body.get("request_id") if isinstance(body, dict) else None
    rid = request_id if isinstance(request_id, str) and check("id", request_id, 0) is None else None
    if not isinstance(body, dict):
        raise ProtocolError(BAD_MESSAGE, f"{name}: the body must be a map", rid)
    out: dict[str, Any] = {}
    for key, rule in fields.items():
        if key not in body or body[key] is None:
            if rule.required:
                raise ProtocolError(BAD_MESSAGE, f"{name}: missing field {key!r}", rid)
            continue
        problem = check(rule.kind, body[key], rule.limit)
        if problem:
            raise ProtocolError(BAD_MESSAGE, f"{name}.{key} {problem}", rid, key, problem)
        out[key] = body[key]
    return out
