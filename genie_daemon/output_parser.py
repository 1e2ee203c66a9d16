"""A model's streamed text split into what the HTTP APIs send apart: reasoning, content and tool calls.

Qwen-family models (and others trained on its format) write reasoning as `<think>...</think>` and each
tool call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; models without that markup may
answer a request that offered tools with a bare JSON object `{"name": ..., "arguments": ...}` as their
whole reply. Calls are recognized only when tools were offered, and only to those tools (anything else
stays text). A reasoning request may get a reply that starts inside the reasoning (templates that open
`<think>` in the prompt): then text is held until `</think>` shows where it ends, and is content if it
never does. The parser is fed text pieces as they arrive and never lets markup reach the content: text
that could be the start of a tag is held back until it can be decided, and a reply that opens with `{`
while tools were offered is held back until the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Piece:
    kind: str  # "content" | "thinking"
    text: str


Event = Piece | ToolCall


def parse_call(text: str, tools: frozenset[str] | None = None) -> ToolCall | None:
    """A tool call from its JSON: {"name": one of `tools` (any when None), "arguments" | "parameters":
    object or JSON string}."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if tools is not None and obj["name"] not in tools:
        return None
    if "arguments" not in obj and "parameters" not in obj:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def _partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `tags` (to hold back)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class OutputParser:
    def __init__(self, tools: list[str] | None = None, think: bool = False) -> None:
        """`tools`: the offered tools' names (none: no calls); `think`: reasoning was requested."""
        self.tools = frozenset(tools or ())
        self.tools_offered = bool(self.tools)
        self.think = think
        self.strip_next = False  # the content after </think> starts after its blank lines
        self.buf = ""
        self.mode = "start"  # start | content | thinking | maybe_thinking | call | json (a whole-reply candidate)
        self.space = ""  # whitespace-only content held back: dropped if it only separates tool calls
        self.calls = 0
        self.seen_content = False

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        out = self._drain(final=True)
        if self.space and not self.calls:
            out.append(Piece("content", self.space))
        self.space = ""
        return out

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            if self.mode == "start":
                stripped = self.buf.lstrip()
                if not stripped and not final:
                    return out
                if stripped.startswith(THINK_OPEN):
                    self.buf, self.mode = stripped[len(THINK_OPEN) :], "thinking"
                elif not final and THINK_OPEN.startswith(stripped):
                    return out  # may still become <think>
                elif self.think:
                    self.mode = "maybe_thinking"
                elif self.tools_offered and stripped.startswith("{"):
                    self.mode = "json"
                else:
                    self.mode = "content"
                continue
            if self.mode == "maybe_thinking":  # reasoning requested, no <think>: held until </think> decides
                end = self.buf.find(THINK_CLOSE)
                if end >= 0:
                    self._emit(out, Piece("thinking", self.buf[:end]))
                    self.buf, self.mode, self.strip_next = self.buf[end + len(THINK_CLOSE) :], "content", True
                    continue
                if not final:
                    return out
                self.mode = "json" if self.tools_offered and self.buf.lstrip().startswith("{") else "content"
                continue
            if self.mode == "thinking":
                end = self.buf.find(THINK_CLOSE)
                if end < 0:
                    keep = 0 if final else _partial_suffix(self.buf, (THINK_CLOSE,))
                    self._emit(out, Piece("thinking", self.buf[: len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                self._emit(out, Piece("thinking", self.buf[:end]))
                self.buf, self.mode, self.strip_next = self.buf[end + len(THINK_CLOSE) :], "content", True
                continue
            if self.mode == "json":
                if not final:
                    return out
                call = parse_call(self.buf.strip(), self.tools)
                if call is None:
                    self.mode = "content"
                    continue
                self._emit(out, call)
                self.buf = ""
                return out
            if self.mode == "call":
                end = self.buf.find(CALL_CLOSE)
                if end < 0 and not final:
                    return out
                body = self.buf if end < 0 else self.buf[:end]
                call = parse_call(body.strip(), self.tools)
                # not a call after all: the text stays visible, markup and all
                self._emit(out, call or Piece("content", CALL_OPEN + body + ("" if end < 0 else CALL_CLOSE)))
                self.buf, self.mode = ("" if end < 0 else self.buf[end + len(CALL_CLOSE) :]), "content"
                if end < 0:
                    return out
                continue
            # content
            start = self.buf.find(CALL_OPEN) if self.tools_offered else -1
            if start >= 0:
                self._emit(out, Piece("content", self.buf[:start]))
                self.buf, self.mode = self.buf[start + len(CALL_OPEN) :], "call"
                continue
            keep = 0 if final or not self.tools_offered else _partial_suffix(self.buf, (CALL_OPEN,))
            self._emit(out, Piece("content", self.buf[: len(self.buf) - keep]))
            self.buf = self.buf[len(self.buf) - keep :]
            return out

    def _emit(self, out: list[Event], ev: Event) -> None:
        if isinstance(ev, ToolCall):
            if self.space and self.seen_content:  # trailing space of the text before the call
                out.append(Piece("content", self.space))
            self.calls += 1
            self.space = ""
            out.append(ev)
        elif ev.kind == "content":
            text = self.space + ev.text
            self.space = ""
            if self.strip_next:
                text = text.lstrip()
                self.strip_next = not text
            if text and not text.strip():
                self.space = text  # held: it may only separate tool calls
            elif text:
                self.seen_content = True
                out.append(Piece("content", text))
        elif ev.text:
            out.append(ev)
