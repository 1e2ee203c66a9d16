"""Chat prompts: the GGUF's own Jinja template rendered in a sandbox with the variables Hugging Face
passes, or a built-in turn format (Gemma's, else ChatML) for files without one.

Gemma 4's first template (the one its first GGUFs carry) takes a tool's results from the model turn that
called it (`tool_responses`) and has no place for role "tool" messages: for it, each run of tool messages
is folded into the assistant message before it, as llama.cpp does (common/parsers/gemma4.cpp).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from genie_common.errors import RequestError

from .tokenizer import Tokenizer

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")

GEMMA_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + m['content'] + '\n\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}"
    "{% if m['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


MAX_PROMPT_CHARS = 4 << 20  # a rendered prompt larger than this is a runaway template, not a prompt
MAX_REPEAT_CHARS = 1 << 20


def _raise(message: str = "raise_exception() called") -> None:
    raise TemplateError(message)


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, plus a bound on `str * n` so a template cannot allocate gigabytes in one step."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise TemplateError(f"exponent {right} is too large")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT_CHARS:
                    raise TemplateError(f"repetition of {len(seq)} x {n} is too large")
        return super().call_binop(context, operator, left, right)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


# set up as Hugging Face's apply_chat_template sets it up
_ENV = _Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
_ENV.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
_ENV.filters["tojson"] = _tojson


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """The template compiled once: compiling took ~2 ms of the ~2 ms a request's prompt took to render, on the
    engine thread, and a context fit renders several times (a model has one template; tests make a few)."""
    return _ENV.from_string(template)


def builtin_template(arch: str) -> str:
    return GEMMA_TEMPLATE if arch.startswith("gemma") else CHATML_TEMPLATE


def validate_messages(messages: Sequence[Any]) -> list[Message]:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object")
        if m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        content = m.get("content", "")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string")
        out.append({**m, "content": content})
    return out


def folds_tool_results(template: str) -> bool:
    """Gemma 4's first template, known as llama.cpp knows it: its tool-call opener, and not the OpenAI
    section its later template added (which reads role "tool" messages itself)."""
    return "'<|tool_call>call:'" in template and "OpenAI Chat Completions" not in template


def _tool_result(msg: Message, call: dict[str, Any] | None) -> dict[str, Any]:
    content = msg.get("content", "")
    try:
        response: Any = json.loads(content)
    except (ValueError, RecursionError):
        response = content
    fn = call.get("function") if isinstance(call, dict) else None
    name = (fn.get("name") if isinstance(fn, dict) else None) or msg.get("name") or msg.get("tool_call_id") or ""
    return {"name": name, "response": response}


def fold_tool_results(messages: list[Message]) -> list[Message]:
    """assistant(tool_calls) → tool… → [assistant(content)] as one assistant message with `tool_calls`,
    `tool_responses` (each {name, response}: the call's name, the result parsed as JSON where it is JSON)
    and the closing answer as its `content`. A result is matched to its call by `tool_call_id`, else by
    position; what the calling message said besides its calls is dropped, as llama.cpp does (the format
    puts text after the results)."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        calls = msg.get("tool_calls")
        if msg["role"] != "assistant" or not isinstance(calls, list) or not calls:
            out.append(msg)
            i += 1
            continue
        by_id = {c["id"]: c for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}
        results: list[dict[str, Any]] = []
        i += 1
        while i < len(messages) and messages[i]["role"] == "tool":
            tool = messages[i]
            call = by_id.get(tool.get("tool_call_id", "")) or (
                calls[len(results)] if len(results) < len(calls) else None
            )
            results.append(_tool_result(tool, call))
            i += 1
        content = ""
        if i < len(messages) and messages[i]["role"] == "assistant" and not messages[i].get("tool_calls"):
            if messages[i]["content"]:
                content = messages[i]["content"]
                i += 1
        folded: Message = {"role": "assistant", "content": content, "tool_calls": calls}
        if results:
            folded["tool_responses"] = results
        out.append(folded)
    return out


def render_chat(
    template: str,
    messages: Sequence[Any],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool = False,
) -> str:
    """The prompt text for `messages`; a template that fails is a RequestError naming why."""
    msgs = validate_messages(messages)
    if folds_tool_results(template):
        msgs = fold_tool_results(msgs)
    try:
        pieces = _compiled(template).generate(
            messages=msgs,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            enable_thinking=enable_thinking,
            bos_token=bos_token,
            eos_token=eos_token,
        )
        out: list[str] = []
        size = 0
        for piece in pieces:
            size += len(piece)
            if size > MAX_PROMPT_CHARS:
                raise TemplateError(f"the rendered prompt exceeds {MAX_PROMPT_CHARS} characters")
            out.append(piece)
        return "".join(out)
    except (TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError, RecursionError) as e:
        # a template is code from the model file: any failure of it is this request's error
        raise RequestError(f"chat template failed: {type(e).__name__}: {e}") from None


def chat_prompt_ids(
    tokenizer: Tokenizer,
    template: str,
    messages: Sequence[Any],
    *,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool = False,
) -> list[int]:
    """A chat's prompt tokens: the template rendered with the vocabulary's BOS and EOS texts, tokenized
    with special tokens parsed, BOS added as the file says unless the template already wrote it."""
    vocab = tokenizer.vocab
    bos = vocab.tokens[vocab.bos_id] if vocab.bos_id is not None else ""
    eos = vocab.tokens[vocab.eos_id] if vocab.eos_id is not None else ""
    text = render_chat(template, messages, bos_token=bos, eos_token=eos, tools=tools, enable_thinking=enable_thinking)
    add_bos = vocab.add_bos and not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_bos=add_bos, parse_special=True)
