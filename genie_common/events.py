"""What a model's answer is made of once its markup is read (workers/output_parser.py does that, for every
model family): content, reasoning and tool calls. The worker sends them typed (DELTA's kind and tool_calls,
protocol/SPEC.md); the daemon formats them for each API without knowing any model family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Piece:
    kind: str  # "content" | "thinking"
    text: str


Event = Piece | ToolCall
