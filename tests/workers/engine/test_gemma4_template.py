"""Gemma 4's chat template as its GGUF carries it (llama.cpp's gemma-4 vocab GGUF, testkit/fixtures/vocab/),
rendered and tokenized by genie: turns, reasoning stripped from earlier model turns, thinking on, tool
declarations, and tool results folded into the calling turn as llama.cpp does for this template. The
expected strings are what transformers' `render_jinja_template` renders for the same (folded) messages."""

from __future__ import annotations

from typing import Any

import pytest

from genie_common.gguf_file import GGUFFile
from genie_workers.engine.chat_template import chat_prompt_ids, fold_tool_results, folds_tool_results, render_chat
from genie_workers.engine.tokenizer import Tokenizer
from testkit.vocab_files import vocab_gguf

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
]
DECLARATION = (
    '<|tool>declaration:get_weather{description:<|"|>Weather for a city<|"|>,parameters:{properties:{city:'
    '{description:<|"|>City name<|"|>,type:<|"|>STRING<|"|>},unit:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],type:'
    '<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>'
)
CALL = {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
NO_THOUGHT = "<|channel>thought\n<channel|>"  # the empty thought block that keeps thinking off


@pytest.fixture(scope="module")
def gguf() -> tuple[str, Tokenizer]:
    path = vocab_gguf("gemma-4")
    with GGUFFile(path) as gf:
        template = gf.metadata["tokenizer.chat_template"]
        tok = Tokenizer.from_metadata(gf.metadata, str(path))
    assert isinstance(template, str)
    return template, tok


def render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return render_chat(template, messages, bos_token="<bos>", eos_token="<eos>", **kwargs)


def test_turns_and_empty_thought(gguf) -> None:
    template, _ = gguf
    assert render(template, [{"role": "user", "content": "Hi"}]) == (
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\n" + NO_THOUGHT
    )
    messages = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": " What is 2+2?"},
        {"role": "assistant", "content": "<|channel>thought\nadd them<channel|>4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert render(template, messages) == (
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n4<turn|>\n"
        "<|turn>user\nAnd 3+3?<turn|>\n<|turn>model\n" + NO_THOUGHT
    )


def test_thinking_on(gguf) -> None:
    template, _ = gguf
    out = render(template, [{"role": "user", "content": "Hi"}], enable_thinking=True)
    assert out == "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"


def test_tool_declarations(gguf) -> None:
    template, _ = gguf
    out = render(template, [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    assert out == (
        "<bos><|turn>system\n"
        + DECLARATION
        + "<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
        + NO_THOUGHT
    )


def test_tool_results_fold_into_the_calling_turn(gguf) -> None:
    """OpenAI-style (matched by tool_call_id) and Ollama-style (by position) results render the same."""
    template, _ = gguf
    assert folds_tool_results(template)
    head = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ]
    openai = head + [{"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 22}'}]
    ollama = head + [{"role": "tool", "name": "get_weather", "content": '{"temp": 22}'}]
    expected = (
        "<bos><|turn>system\n" + DECLARATION + "<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
        "<|tool_response>response:get_weather{temp:22}<tool_response|>" + NO_THOUGHT
    )
    assert render(template, openai, tools=TOOLS) == expected
    assert render(template, ollama, tools=TOOLS) == expected
    # the answer after the results closes the same turn; a result that is not JSON is a value
    done = head + [
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    assert render(template, done, tools=TOOLS).endswith(
        '<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>It is sunny.<turn|>\n'
        "<|turn>user\nThanks<turn|>\n<|turn>model\n" + NO_THOUGHT
    )


def test_fold_leaves_other_messages_alone() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ]
    folded = fold_tool_results(messages)
    assert folded[:2] == messages[:2]
    assert folded[2] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert not folds_tool_results("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def test_prompt_tokens(gguf) -> None:
    """One BOS (the template writes it), turn markers as single control tokens."""
    template, tok = gguf
    ids = chat_prompt_ids(tok, template, [{"role": "user", "content": "Hi there"}])
    pieces = [tok.vocab.tokens[i] for i in ids]
    assert pieces == [
        "<bos>", "<|turn>", "user", "\n", "Hi", "▁there", "<turn|>", "\n", "<|turn>", "model", "\n",
        "<|channel>", "thought", "\n", "<channel|>",
    ]  # fmt: skip
