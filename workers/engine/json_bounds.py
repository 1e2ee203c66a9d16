"""Bounds added to a client's JSON schema so that constrained output ends.

A grammar only keeps the output valid; it does not make it end. JSON lets a number, a string, an array
or an object go on forever, and a small model at temperature 0.8 often does: Gemma 3 270M, given Home
Assistant's AI Task schema (no bounds), wrote integers hundreds of digits long, a `"hobbies"` array of
hundreds of `","` strings and objects with endless invented keys, until the length cap (400 tokens: 4 of
4 seeds; `"json"` and a schema of optional properties 1 of 4). `bounded_schema` returns a copy in which
every value the client left unbounded has a bound; a bound the client gave stays. Every output of the
copy validates against the original schema. With these bounds no answer of 12 seeds per schema reached
the cap (longest: 74 tokens for the AI Task schema, 99 for "json"). The bounds (also in docs/http-api.md):

- strings: `maxLength` MAX_STRING_CHARS (also under `pattern` and `format`);
- integers and numbers: `minimum`/`maximum` ±MAX_NUMBER (15 digits, exact in a double); numbers also
  `multipleOf` 10^-NUMBER_DECIMALS, which caps the digits after the point;
- arrays: `maxItems` MAX_ITEMS, and a bounded value for `items` when the schema gives none;
- objects with `properties`: no keys beyond them, as llama.cpp's (and so Ollama's) schema converter
  reads a schema without `additionalProperties`, and also where the schema allows more (llguidance
  cannot bound their number while a declared property is optional); an object without `properties`
  (Ollama's "json", OpenAI's json_object) holds at most MAX_PROPERTIES keys of at most MAX_KEY_CHARS
  characters, whose values are any JSON at most ANY_VALUE_DEPTH containers deep, bounded the same way.
"""

from __future__ import annotations

from typing import Any

MAX_STRING_CHARS = 128
MAX_NUMBER = 10**15 - 1
NUMBER_DECIMALS = 6
MAX_ITEMS = 10
MAX_PROPERTIES = 10
MAX_KEY_CHARS = 32
ANY_VALUE_DEPTH = 1  # containers inside the value of an unbounded key or an untyped schema

# a key of an object without declared properties: 1 to MAX_KEY_CHARS characters a JSON string holds unescaped
KEY_PATTERN = f'^[^"\\\\\\x00-\\x1f]{{1,{MAX_KEY_CHARS}}}$'
ANNOTATIONS = frozenset(("title", "description", "default", "examples", "$comment", "deprecated", "readOnly"))
COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def any_value(depth: int = ANY_VALUE_DEPTH) -> dict[str, Any]:
    """Any JSON value, bounded: scalars, and `depth` levels of arrays and objects of such values."""
    options: list[dict[str, Any]] = [
        {"type": "string", "maxLength": MAX_STRING_CHARS},
        _bound_number({"type": "number"}),
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth > 0:
        inner = any_value(depth - 1)
        options.append({"type": "array", "maxItems": MAX_ITEMS, "items": inner})
        options.append(_free_object({"type": "object"}, inner))
    return {"anyOf": options}


def bounded_schema(schema: Any) -> Any:
    """A copy of `schema` with a bound on every string, number, array and object it leaves unbounded."""
    if schema is True or (isinstance(schema, dict) and set(schema) <= ANNOTATIONS | {"x-guidance"}):
        return {**(schema if isinstance(schema, dict) else {}), **any_value()}
    if not isinstance(schema, dict):
        return schema  # False: nothing is allowed, nothing to bound
    s = dict(schema)
    for key in SUBSCHEMA_LISTS:
        if isinstance(s.get(key), list):
            s[key] = [bounded_schema(sub) for sub in s[key]]
    for key in SUBSCHEMA_MAPS:
        if isinstance(s.get(key), dict):
            s[key] = {name: bounded_schema(sub) for name, sub in s[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(s.get(key), dict) or s.get(key) is True:
            s[key] = bounded_schema(s[key])
    if isinstance(s.get("items"), list):  # draft 4's tuple form
        s["items"] = [bounded_schema(sub) for sub in s["items"]]
    types = s.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if "enum" in s or "const" in s:
        return s  # a fixed set of values: bounded already
    composite = any(key in s for key in COMBINATORS)
    if "string" in types and "maxLength" not in s:
        s["maxLength"] = max(MAX_STRING_CHARS, _int(s.get("minLength")))
    if types & {"integer", "number"}:
        s = _bound_number(s)
    if "array" in types:
        if "maxItems" not in s:
            s["maxItems"] = max(MAX_ITEMS, _int(s.get("minItems")))
        if "items" not in s and not composite:
            s["items"] = any_value()
    if "object" in types and not composite:
        s = _bound_object(s)
    return s


def _bound_number(s: dict[str, Any]) -> dict[str, Any]:
    s = dict(s)
    low = _number(s.get("minimum", s.get("exclusiveMinimum")))
    high = _number(s.get("maximum", s.get("exclusiveMaximum")))
    # a bound the client gave beyond ours stays alone rather than make the range empty
    if low is None and (high is None or high >= -MAX_NUMBER):
        s["minimum"] = -MAX_NUMBER
    if high is None and (low is None or low <= MAX_NUMBER):
        s["maximum"] = MAX_NUMBER
    if s.get("type") != "integer" and "multipleOf" not in s:
        s["multipleOf"] = 10.0**-NUMBER_DECIMALS
    return s


def _bound_object(s: dict[str, Any]) -> dict[str, Any]:
    if "patternProperties" in s or s.get("additionalProperties") is False:
        if "properties" not in s and "maxProperties" not in s:
            s["maxProperties"] = max(MAX_PROPERTIES, _int(s.get("minProperties")))
        return s
    if "properties" in s:
        s["additionalProperties"] = False
        return s
    extra = s.get("additionalProperties")
    return _free_object(s, extra if isinstance(extra, dict) else any_value())


def _free_object(s: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """An object whose keys are free: bounded keys, each holding `value`, at most MAX_PROPERTIES of them."""
    s = dict(s)
    s["patternProperties"] = {KEY_PATTERN: value}
    s["additionalProperties"] = False
    if "maxProperties" not in s:
        s["maxProperties"] = max(MAX_PROPERTIES, _int(s.get("minProperties")))
    return s


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
