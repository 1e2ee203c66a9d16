"""A model's streamed text split into what clients get apart: reasoning, content and tool calls (the worker
runs it on each answer and sends the pieces typed: genie_common/events.py).

Qwen-family models (and others trained on its format) write reasoning as `<think>...</think>` and each
tool call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. Gemma 4 writes reasoning as
`<|channel>thought\n...<channel|>` (also after some content, and sometimes an empty channel or a stray
`<channel|>`, which are dropped) and a call as `<|tool_call>call:NAME{key:value,...}<tool_call|>` in its
own argument syntax (strings between `<|"|>` marks, bare keys; `parse_gemma4_call`). Models without such
markup may answer a request that offered tools with a bare JSON object `{"name": ..., "arguments": ...}`
as their whole reply. Both markups are recognized in any reply: their tags do not occur in each other's
output. Calls are recognized only when tools were offered, and only to those tools (anything else
stays text). A reasoning request may get a reply that starts inside the reasoning (templates that open
`<think>` in the prompt): then text is held until `</think>` shows where it ends, and is content if it
never does. The parser is fed text pieces as they arrive and never lets markup reach the content: text
that could be the start of a tag is held back until it can be decided, and a reply that opens with `{`
while tools were offered is held back until the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from genie_common.events import Event, Piece, ToolCall
from genie_common.families import ChatMarkup, markups, partial_suffix


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


_QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_KEY = re.compile(r"[^:}<]+")
_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


class _Syntax(ValueError):
    pass


def _skip_space(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _gemma4_value(s: str, i: int) -> tuple[Any, int]:
    """One value of Gemma 4's argument syntax at s[i:] and where it ends."""
    i = _skip_space(s, i)
    if s.startswith(_QUOTE, i):
        end = s.find(_QUOTE, i + len(_QUOTE))
        if end < 0:
            raise _Syntax("unterminated string")
        return s[i + len(_QUOTE) : end], end + len(_QUOTE)
    if s.startswith("{", i) or s.startswith("[", i):
        close = "}" if s[i] == "{" else "]"
        obj: dict[str, Any] = {}
        items: list[Any] = []
        i = _skip_space(s, i + 1)
        if s.startswith(close, i):
            return (obj if close == "}" else items), i + 1
        while True:
            if close == "]":
                value, i = _gemma4_value(s, i)
                items.append(value)
            else:
                if s.startswith(_QUOTE, i):  # a key may be quoted like a string
                    key, i = _gemma4_value(s, i)
                else:
                    m = _KEY.match(s, i)
                    if m is None:
                        raise _Syntax("expected a key")
                    key, i = m.group().strip(), m.end()
                i = _skip_space(s, i)
                if not s.startswith(":", i):
                    raise _Syntax("expected ':'")
                obj[key], i = _gemma4_value(s, i + 1)
            i = _skip_space(s, i)
            if s.startswith(",", i):
                i = _skip_space(s, i + 1)
            elif s.startswith(close, i):
                return (obj if close == "}" else items), i + 1
            else:
                raise _Syntax(f"expected ',' or {close!r}")
    for word, value in _WORDS.items():
        if s.startswith(word, i):
            return value, i + len(word)
    m = _NUMBER.match(s, i)
    if m is None:
        raise _Syntax("expected a value")
    text = m.group()
    return (float(text) if any(c in text for c in ".eE") else int(text)), m.end()


def parse_gemma4_call(text: str, tools: frozenset[str] | None = None) -> ToolCall | None:
    """A Gemma 4 call body, `NAME{key:value,...}`: NAME one of `tools` (any when None), the arguments
    in its syntax (strings between <|"|> marks, numbers, true/false/null, {...} and [...])."""
    brace = text.find("{")
    name = text[:brace].strip() if brace > 0 else ""
    if not name or (tools is not None and name not in tools):
        return None
    try:
        args, end = _gemma4_value(text, brace)
    except (_Syntax, ValueError, RecursionError):  # ValueError: a number too long for int()
        return None
    if _skip_space(text, end) != len(text) or not isinstance(args, dict):
        return None
    return ToolCall(name, args)


# a call body's parser for each syntax a family record names (genie_common/families.py)
CALL_PARSERS: dict[str, Callable[[str, frozenset[str] | None], ToolCall | None]] = {
    "json": parse_call,
    "gemma4": parse_gemma4_call,
}


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """The earliest occurrence of one of `tags` in `text` (the longest tag where two start together)."""
    best, found = -1, ""
    for tag in tags:
        i = text.find(tag)
        if i >= 0 and (best < 0 or i < best or (i == best and len(tag) > len(found))):
            best, found = i, tag
    return best, found


class OutputParser:
    def __init__(self, tools: list[str] | None = None, think: bool = False) -> None:
        """`tools`: the offered tools' names (none: no calls); `think`: reasoning was requested."""
        self.tools = frozenset(tools or ())
        self.tools_offered = bool(self.tools)
        self.think = think
        self.strip_next = False  # the content after </think> starts after its blank lines
        self.strip_think = False  # the reasoning after a tag with a header starts after its whitespace
        self.buf = ""
        self.mode = "start"  # start | content | thinking | maybe_thinking | call | json (a whole-reply candidate)
        self.markups = markups()  # every model family's tags (genie_common/families.py)
        self.markup = self.markups[0]  # whose tag opened the current reasoning block or call
        self.space = ""  # whitespace-only content held back: dropped if it only separates tool calls
        self.calls = 0
        self.seen_content = False
        self.opens = tuple(m.think_open for m in self.markups)
        self.closes = tuple(m.think_close for m in self.markups)
        # the tags that end plain content: calls (when tools were offered), late reasoning, stray tags
        content_tags = [m.call_open for m in self.markups if self.tools_offered and m.call_open]
        content_tags += [m.think_open for m in self.markups if m.late_think]
        content_tags += [t for m in self.markups for t in m.stray]
        self.content_tags = tuple(content_tags)

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        out = self._drain(final=True)
        if self.space and not self.calls:
            out.append(Piece("content", self.space))
        self.space = ""
        return out

    def _open_think(self, markup: ChatMarkup, rest: str) -> None:
        self.markup, self.buf, self.mode = markup, rest, "thinking"
        self.strip_think = markup.think_header

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            if self.mode == "start":
                stripped = self.buf.lstrip()
                if not stripped and not final:
                    return out
                opened = next((m for m in self.markups if stripped.startswith(m.think_open)), None)
                if opened is not None:
                    self._open_think(opened, stripped[len(opened.think_open) :])
                elif not final and any(tag.startswith(stripped) for tag in self.opens):
                    return out  # may still become a reasoning tag
                elif self.think:
                    self.mode = "maybe_thinking"
                elif self.tools_offered and stripped.startswith("{"):
                    self.mode = "json"
                else:
                    self.mode = "content"
                continue
            if self.mode == "maybe_thinking":  # reasoning requested, no opening tag: held until a close decides
                end, tag = _first(self.buf, self.closes)
                if end >= 0:
                    self._emit(out, Piece("thinking", self.buf[:end]))
                    self.buf, self.mode, self.strip_next = self.buf[end + len(tag) :], "content", True
                    continue
                if not final:
                    return out
                self.mode = "json" if self.tools_offered and self.buf.lstrip().startswith("{") else "content"
                continue
            if self.mode == "thinking":
                close = self.markup.think_close
                end = self.buf.find(close)
                if end < 0:
                    keep = 0 if final else partial_suffix(self.buf, (close,))
                    self._emit(out, Piece("thinking", self.buf[: len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                self._emit(out, Piece("thinking", self.buf[:end]))
                self.buf, self.mode, self.strip_next = self.buf[end + len(close) :], "content", True
                self.strip_think = False
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
                m = self.markup
                end = self.buf.find(m.call_close)
                if end < 0 and not final:
                    return out
                body = self.buf if end < 0 else self.buf[:end]
                call = CALL_PARSERS[m.call_syntax](body.strip(), self.tools)
                # not a call after all: the text stays visible, markup and all
                self._emit(out, call or Piece("content", m.call_open + body + ("" if end < 0 else m.call_close)))
                self.buf, self.mode = ("" if end < 0 else self.buf[end + len(m.call_close) :]), "content"
                if end < 0:
                    return out
                continue
            # content
            start, tag = _first(self.buf, self.content_tags)
            if start >= 0 and not final and any(t.startswith(self.buf[start:]) and t != tag for t in self.opens):
                start = -1  # a stray-looking tag that may still become a reasoning tag: wait for more
            if start >= 0:
                self._emit(out, Piece("content", self.buf[:start]))
                rest = self.buf[start + len(tag) :]
                caller = next((m for m in self.markups if m.call_open and tag == m.call_open), None)
                thinker = next((m for m in self.markups if tag == m.think_open), None)
                if caller is not None:
                    self.markup, self.buf, self.mode = caller, rest, "call"
                elif thinker is not None:
                    self._open_think(thinker, rest)
                else:
                    self.buf = rest  # a stray tag: dropped
                continue
            keep = 0 if final else partial_suffix(self.buf, self.content_tags)
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
        else:
            text = ev.text
            if self.strip_think:
                text = text.lstrip()
                self.strip_think = not text
            if text:
                out.append(Piece("thinking", text))
