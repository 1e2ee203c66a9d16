"""Chat prompts: the GGUF's own Jinja template rendered in a sandbox with the variables Hugging Face
passes, or a built-in turn format (Gemma's, else ChatML) for files without one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import RequestError

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


_ENV = _Environment(trim_blocks=True, lstrip_blocks=True)
_ENV.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
_ENV.filters["tojson"] = _tojson


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
    try:
        pieces = _ENV.from_string(template).generate(
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
