"""What the daemon hands each child process of its configuration: a typed record per child, serialized as
one JSON argument (`--part`) and parsed back into the same record there. The children declare no options
of their own; the defaults, the validation and the names are DaemonConfig's (config.py), stated once."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from genie_common.engine_options import EngineOptions


@dataclass(frozen=True)
class WorkerPart:
    """The worker's part (workers/worker.py)."""

    endpoint: str  # the daemon's worker socket
    engine: EngineOptions  # the daemon's, whole
    models_dir: str  # where `engine.model` may be a pulled model's name
    stream_interval_ms: float
    kv_endpoint: str  # "": no KV store
    thermal_sensor: str
    thermal_throttle_c: float
    thermal_resume_c: float


@dataclass(frozen=True)
class StorePart:
    """The KV store's part (kvstore/__main__.py)."""

    endpoint: str
    directory: str
    max_mb: int  # 0: no cap
    stale_tmp_s: float


Part = TypeVar("Part", WorkerPart, StorePart)


def to_arg(part: WorkerPart | StorePart) -> str:
    return json.dumps(asdict(part), separators=(",", ":"))


def from_arg(cls: type[Part], text: str) -> Part:
    """The record `text` serializes; a ValueError naming what is wrong (not JSON, a missing or unknown key, a
    value of another type) for anything else."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--part is not JSON: {e}") from None
    return _record(cls, data, "--part")


RECORDS: dict[str, type] = {r.__name__: r for r in (EngineOptions,)}  # records a part holds, by type name


def _record(cls: type[Any], data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object")
    names = {f.name: str(f.type) for f in fields(cls)}
    missing, unknown = set(names) - set(data), set(data) - set(names)
    if missing or unknown:
        raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, kind in names.items():
        if kind in RECORDS:
            values[name] = _record(RECORDS[kind], data[name], f"{where}: {name}")
        elif not _is_a(data[name], kind):
            raise ValueError(f"{where}: {name} = {data[name]!r} is not a {kind}")
        else:
            values[name] = float(data[name]) if kind == "float" else data[name]
    return cls(**values)


def _is_a(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)
