"""A small JSON-schema validator for the keywords the constraint tests' schemas use (the `jsonschema`
package is no dependency of genie). A keyword it does not know fails the check rather than pass unseen."""

from __future__ import annotations

import math
from typing import Any

ANNOTATIONS = {"title", "description", "default", "examples", "$comment"}
KNOWN = ANNOTATIONS | {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "anyOf",
}
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def violations(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Where `value` breaks `schema`: an empty list when it is valid."""
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: no value is allowed"]
    unknown = set(schema) - KNOWN
    if unknown:
        return [f"{path}: the checker does not know {sorted(unknown)}"]
    out: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(TYPES[t](value) for t in names):
            return [f"{path}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "anyOf" in schema and all(violations(value, sub, path) for sub in schema["anyOf"]):
        out.append(f"{path}: {value!r} matches none of anyOf")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}: {key!r} is missing" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties", True))
            out += violations(item, sub, f"{path}.{key}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            out.append(f"{path}: {len(value)} items")
        for k, item in enumerate(value):
            out += violations(item, schema.get("items", True), f"{path}[{k}]")
    if isinstance(value, str) and not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf):
        out.append(f"{path}: {len(value)} characters")
    if TYPES["number"](value) and not schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf):
        out.append(f"{path}: {value} is out of range")
    return out
