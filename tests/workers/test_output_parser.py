"""Recorded model outputs split into content, reasoning and tool calls, fed whole and in every split."""

from __future__ import annotations

import pytest

from genie_workers.output_parser import OutputParser, Piece, ToolCall, parse_gemma4_call

QWEN = (
    "<think>\nThe user wants the kitchen light on.\n</think>\n\n"
    '<tool_call>\n{"name": "HassTurnOn", "arguments": {"name": "Kitchen Light", "domain": ["light"]}}\n</tool_call>\n'
    '<tool_call>\n{"name": "HassLightSet", "arguments": "{\\"brightness\\": 40}"}\n</tool_call>'
)


TOOLS = ["HassTurnOn", "HassTurnOff", "HassLightSet", "x"]


def run(text: str, step: int, tools: bool = True, think: bool = False) -> list:
    p = OutputParser(TOOLS if tools else None, think=think)
    events = []
    for i in range(0, len(text), step):
        events += p.feed(text[i : i + step])
    events += p.finish()
    # adjacent pieces of one kind joined: how they were split must not matter
    merged: list = []
    for ev in events:
        if merged and isinstance(ev, Piece) and isinstance(merged[-1], Piece) and merged[-1].kind == ev.kind:
            merged[-1] = Piece(ev.kind, merged[-1].text + ev.text)
        else:
            merged.append(ev)
    return merged


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 13, 1000])
def test_qwen_reasoning_and_two_calls(step):
    assert run(QWEN, step) == [
        Piece("thinking", "\nThe user wants the kitchen light on.\n"),
        ToolCall("HassTurnOn", {"name": "Kitchen Light", "domain": ["light"]}),
        ToolCall("HassLightSet", {"brightness": 40}),
    ]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_content_around_a_call_keeps_no_markup(step):
    text = 'Turning it on. <tool_call>{"name": "HassTurnOn", "arguments": {}}</tool_call> Done.'
    events = run(text, step)
    assert events == [Piece("content", "Turning it on. "), ToolCall("HassTurnOn", {}), Piece("content", " Done.")]
    assert not any("<tool_call>" in e.text for e in events if isinstance(e, Piece))


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_whole_reply_json_object_is_a_call_when_tools_were_offered(step):
    text = '  {"name": "HassTurnOff", "parameters": {"area": "Kitchen"}}\n'
    assert run(text, step) == [ToolCall("HassTurnOff", {"area": "Kitchen"})]
    assert run(text, step, tools=False) == [Piece("content", text)]


def test_json_that_is_not_a_call_is_content():
    text = '{"temperature": 21.5}'
    assert run(text, 3) == [Piece("content", text)]


def test_broken_call_stays_visible():
    text = "Hi <tool_call>{not json}</tool_call> there"
    assert run(text, 2) == [Piece("content", "Hi <tool_call>{not json}</tool_call> there")]


def test_unterminated_call_and_reasoning_are_flushed_at_the_end():
    assert run('<tool_call>{"name": "x", "arguments": {}}', 4) == [ToolCall("x", {})]
    assert run("<think>still thinking", 4) == [Piece("thinking", "still thinking")]


def test_text_that_only_looks_like_a_tag_start():
    assert run("<thinking about it>", 1) == [Piece("content", "<thinking about it>")]
    assert run("a < b and c <tool", 1) == [Piece("content", "a < b and c <tool")]


def test_calls_only_to_offered_tools_and_only_with_arguments():
    text = '{"name": "Kitchen", "state": "on"}'  # an answer in JSON, not a call
    assert run(text, 4) == [Piece("content", text)]
    text = '{"name": "HassTurnOn"}'  # no arguments key: not a call either
    assert run(text, 4) == [Piece("content", text)]
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'  # not an offered tool
    assert run(text, 3) == [Piece("content", text)]


def test_no_tools_offered_means_no_calls():
    text = 'Raw text <tool_call>{"name": "x", "arguments": {}}</tool_call> tail'
    assert run(text, 5, tools=False) == [Piece("content", text)]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_reasoning_that_starts_inside_think(step):
    """Templates that open <think> in the prompt: the reply begins with reasoning and a bare </think>."""
    text = "The user asks about lights.\n</think>\n\nThe kitchen light is on."
    assert run(text, step, think=True) == [
        Piece("thinking", "The user asks about lights.\n"),
        Piece("content", "The kitchen light is on."),
    ]
    assert run("No reasoning here.", step, think=True) == [Piece("content", "No reasoning here.")]


# -- Gemma 4 ----------------------------------------------------------------------------------------

GEMMA4 = (
    "<|channel>thought\nThe user wants the kitchen light on.<channel|>"
    '<|tool_call>call:HassTurnOn{domain:[<|"|>light<|"|>],name:<|"|>Kitchen Light<|"|>}<tool_call|>'
    "<|tool_call>call:HassLightSet{brightness:40,on:true,color:null,level:-1.5e2}<tool_call|>"
)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 13, 1000])
def test_gemma4_reasoning_and_two_calls(step):
    assert run(GEMMA4, step) == [
        Piece("thinking", "The user wants the kitchen light on."),
        ToolCall("HassTurnOn", {"domain": ["light"], "name": "Kitchen Light"}),
        ToolCall("HassLightSet", {"brightness": 40, "on": True, "color": None, "level": -150.0}),
    ]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_gemma4_content_with_late_and_empty_channels(step):
    """Gemma 4 may close its reply with another (empty) thought block, an empty channel or a lone
    <channel|>: none of it is content."""
    text = "The light is on.<|channel>thought\n<channel|><|channel><channel|>"
    assert run(text, step) == [Piece("content", "The light is on.")]
    text = "Sure.<|channel>thought\nchecked twice<channel|> Done."
    assert run(text, step) == [Piece("content", "Sure."), Piece("thinking", "checked twice"), Piece("content", "Done.")]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_gemma4_call_text_around_and_broken(step):
    text = 'Turning it on. <|tool_call>call:x{a:<|"|>b, c}<|"|>}<tool_call|> Done.'
    assert run(text, step) == [
        Piece("content", "Turning it on. "),
        ToolCall("x", {"a": "b, c}"}),
        Piece("content", " Done."),
    ]
    broken = "Hi <|tool_call>call:x{a:<tool_call|> there"
    assert run(broken, step) == [Piece("content", broken)]
    unknown = "<|tool_call>call:rm_rf{}<tool_call|>"  # not an offered tool
    assert run(unknown, step) == [Piece("content", unknown)]
    assert run("<|tool_call>call:x{a:1}<tool_call|>", step, tools=False) == [
        Piece("content", "<|tool_call>call:x{a:1}<tool_call|>")
    ]


@pytest.mark.parametrize(
    ("body", "call"),
    [
        ("x{}", ToolCall("x", {})),
        ("x{ a : 1 , b:[ ] ,c:{}}", ToolCall("x", {"a": 1, "b": [], "c": {}})),
        ('x{<|"|>quoted key<|"|>:<|"|><|"|>}', ToolCall("x", {"quoted key": ""})),
        ('x{n:{m:[1,2.5,<|"|>s<|"|>,[false]]}}', ToolCall("x", {"n": {"m": [1, 2.5, "s", [False]]}})),
        ("x", None),  # no arguments
        ("{a:1}", None),  # no name
        ("x{a:1} trailing", None),
        ("x{a:1,}", None),
        ("x{a}", None),
        ("x{a:bare}", None),
        ('x{a:<|"|>open}', None),
        ("x{a:" + "[" * 5000 + "]" * 5000 + "}", None),  # too deep: not a call, not a crash
        ("x{a:" + "9" * 5000 + "}", None),  # a number past int()'s digit limit
    ],
)
def test_gemma4_argument_syntax(body, call):
    assert parse_gemma4_call(body, frozenset({"x"})) == call
