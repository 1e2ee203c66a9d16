"""The real Qwen3 chat template (llama.cpp's models/templates/Qwen-Qwen3-0.6B.jinja, from the
llama-cpp-python 0.3.36 sdist) rendered by genie: thinking on/off, reasoning stripped from earlier turns,
tools and tool responses. Expected strings follow the template's own logic (what Hugging Face's
apply_chat_template renders)."""

from __future__ import annotations

from typing import Any

import pytest

from genie_workers.engine.chat_template import render_chat
from testkit import FIXTURES

TEMPLATE = (FIXTURES / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + TOOL_JSON
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


def render(messages: list[dict[str, Any]], enable_thinking: bool = True, **kwargs: Any) -> str:
    kwargs.setdefault("add_generation_prompt", True)
    return render_chat(
        TEMPLATE, messages, bos_token="", eos_token="<|im_end|>", enable_thinking=enable_thinking, **kwargs
    )


def test_thinking_off_prefills_empty_think_block() -> None:
    out = render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_thinking_on_leaves_assistant_turn_open() -> None:
    out = render([{"role": "user", "content": "Hi"}], enable_thinking=True)
    assert out.endswith("<|im_start|>assistant\n")
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_system_message(enable_thinking: bool) -> None:
    out = render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], enable_thinking)
    assert out.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_no_generation_prompt() -> None:
    out = render([{"role": "user", "content": "Hi"}], enable_thinking=False, add_generation_prompt=False)
    assert out == "<|im_start|>user\nHi<|im_end|>\n"


def test_earlier_turns_lose_their_reasoning() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThey greet.\n</think>\n\nHello!"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4"},
        {"role": "user", "content": "Thanks"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render(messages, enable_thinking=True) == expected
    assert render(messages, enable_thinking=False) == expected + "<think>\n\n</think>\n\n"


def test_last_assistant_turn_keeps_reasoning() -> None:
    """Without a generation prompt the final assistant turn (after the last user query) is rendered whole,
    its reasoning in a <think> block; one without reasoning gets an empty block."""
    with_reasoning = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4"},
    ]
    assert render(with_reasoning, add_generation_prompt=False) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nEasy.\n</think>\n\n4<|im_end|>\n"
    )
    plain = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert render(plain, add_generation_prompt=False) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n"
    )


def test_reasoning_content_field() -> None:
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Easy."},
    ]
    assert render(messages, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nEasy.\n</think>\n\n4<|im_end|>\n"
    )


def test_tools_render_in_system_block() -> None:
    out = render([{"role": "user", "content": "Weather in Paris?"}], enable_thinking=False, tools=TOOLS)
    assert TOOL_JSON in out
    assert out == (
        "<|im_start|>system\n"
        + TOOLS_BLOCK
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_tools_with_system_message() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    out = render(messages, tools=TOOLS)
    assert out == (
        "<|im_start|>system\nBe brief.\n\n"
        + TOOLS_BLOCK
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_call_and_tool_responses() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "<think>\nNeed the tool twice.\n</think>\n\n",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "tool", "content": '{"temp_c": 25}'},
    ]
    out = render(messages, enable_thinking=True, tools=TOOLS)
    assert out == (
        "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        # after the last user query, so the reasoning stays
        "<|im_start|>assistant\n<think>\nNeed the tool twice.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        # consecutive tool messages share one user turn
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response>\n'
        '<tool_response>\n{"temp_c": 25}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
