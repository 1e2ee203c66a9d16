"""The model families genie runs, one record each: the GGUF architectures that belong to it and the markup
its chat format writes (reasoning blocks, tool calls). The worker hides reasoning with these markers
(workers/engine/text_filters.py) and the daemon turns the markup into each API's events
(genie_daemon/output_parser.py); neither names a family itself. A process that never loads the engine (the
daemon's model list, `genie pull`'s check of a file) tests a model's architecture against
architecture_names(); the engine's architecture table (workers/engine/arch) has an entry for each, and
tests/test_boundaries.py holds the two equal. Adding a family is an architecture file there and a record
here (tests/genie_common/test_families.py shows one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatMarkup:
    """The tags a family's chat format writes around reasoning and tool calls."""

    think_open: str
    think_close: str
    call_open: str = ""  # "": the family writes no tool calls of its own markup
    call_close: str = ""
    call_syntax: str = "json"  # a call's body: "json" ({"name", "arguments"}) or "gemma4" (NAME{key:value})
    think_header: bool = False  # the whitespace after think_open belongs to the tag, not to the reasoning
    late_think: bool = False  # a reasoning block may also follow some content
    stray: tuple[str, ...] = ()  # lone tags to drop from content


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # GGUF general.architecture values
    markup: ChatMarkup | None = None  # None: no reasoning or tool-call markup of its own


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",)),
    Family("qwen", ("qwen2", "qwen3"), ChatMarkup("<think>", "</think>", "<tool_call>", "</tool_call>")),
    Family("gemma3", ("gemma3",)),
    Family(
        "gemma4",
        ("gemma4",),
        ChatMarkup(
            "<|channel>thought",
            "<channel|>",
            "<|tool_call>call:",
            "<tool_call|>",
            call_syntax="gemma4",
            think_header=True,
            late_think=True,
            stray=("<|channel>", "<channel|>"),
        ),
    ),
)


def architecture_names() -> tuple[str, ...]:
    """Every family's architectures, in the records' order."""
    return tuple(a for f in FAMILIES for a in f.architectures)


def markups() -> tuple[ChatMarkup, ...]:
    """Every family's markup (read when a parser or filter is made, so a family added at run time counts)."""
    return tuple(f.markup for f in FAMILIES if f.markup is not None)


def partial_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `tags`: what a stream must hold
    back because the next piece could complete a tag."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best
