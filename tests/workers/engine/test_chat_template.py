"""Chat prompts: a GGUF's own Jinja template (SmolLM2's), the built-in Gemma and ChatML formats, message
validation, and the sandbox: a template that fails or misbehaves is a RequestError, never anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from genie_common.errors import RequestError
from genie_common.gguf_file import GGUFFile
from genie_common.registry import resolve_model
from genie_workers.engine.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, builtin_template, render_chat

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def smol_template() -> str:
    path = resolve_model("smollm2-135m", progress=lambda _: None)
    with GGUFFile(path) as gf:
        template = gf.metadata["tokenizer.chat_template"]
    assert isinstance(template, str)
    return template


# -- SmolLM2's own template --------------------------------------------------------------------------


def test_smollm2_default_system_prompt(smol_template: str) -> None:
    assert render_chat(smol_template, USER) == (
        f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_system_message_replaces_default(smol_template: str) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert render_chat(smol_template, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_without_generation_prompt(smol_template: str) -> None:
    out = render_chat(smol_template, USER, add_generation_prompt=False)
    assert out.endswith("<|im_start|>user\nHi<|im_end|>\n")


# -- built-in templates ------------------------------------------------------------------------------


def test_builtin_choice() -> None:
    assert builtin_template("gemma3") == GEMMA_TEMPLATE
    assert builtin_template("gemma") == GEMMA_TEMPLATE
    for arch in ("llama", "qwen2", "qwen3"):
        assert builtin_template(arch) == CHATML_TEMPLATE


def test_gemma_builtin() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert render_chat(builtin_template("gemma3"), messages) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_builtin_no_system() -> None:
    out = render_chat(builtin_template("gemma3"), USER)
    assert out == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert render_chat(builtin_template("gemma3"), USER, add_generation_prompt=False) == (
        "<start_of_turn>user\nHi<end_of_turn>\n"
    )


def test_chatml_builtin() -> None:
    messages = [{"role": "system", "content": "S"}, *USER, {"role": "assistant", "content": "A"}]
    assert render_chat(builtin_template("qwen2"), messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>assistant\n"
    )


def test_none_content_is_empty() -> None:
    out = render_chat(CHATML_TEMPLATE, [{"role": "assistant", "content": None}], add_generation_prompt=False)
    assert out == "<|im_start|>assistant\n<|im_end|>\n"


def test_variables_passed() -> None:
    template = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ tools | length }}"
    out = render_chat(template, USER, bos_token="<s>", eos_token="</s>", tools=[{"a": 1}], enable_thinking=True)
    assert out == "<s>|</s>|True|True|1"


# -- bad messages ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param({"role": "user", "content": "hi"}, id="dict-not-list"),
        pytest.param("hello", id="string"),
        pytest.param(None, id="none"),
        pytest.param(42, id="int"),
        pytest.param([], id="empty"),
        pytest.param(["hi"], id="item-not-object"),
        pytest.param([{"role": "wizard", "content": "hi"}], id="unknown-role"),
        pytest.param([{"content": "hi"}], id="no-role"),
        pytest.param([{"role": "user", "content": 5}], id="int-content"),
        pytest.param([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], id="list-content"),
        pytest.param([*USER, {"role": "user", "content": {"x": 1}}], id="second-bad"),
    ],
)
def test_bad_messages(messages: object) -> None:
    with pytest.raises(RequestError, match="messages"):
        render_chat(CHATML_TEMPLATE, messages)  # type: ignore[arg-type]


# -- failing and hostile templates -------------------------------------------------------------------


def test_raise_exception() -> None:
    with pytest.raises(RequestError, match="Only user and assistant roles are supported"):
        render_chat("{{ raise_exception('Only user and assistant roles are supported') }}", USER)


def test_raise_exception_x() -> None:
    with pytest.raises(RequestError) as info:
        render_chat("{% if true %}{{ raise_exception('x') }}{% endif %}", USER)
    assert str(info.value).endswith("x")


@pytest.mark.parametrize(
    "template",
    [
        "{% if %}",
        "{{ undefined_thing.attr }}",
        "{% for m in messages %}",
        "{{ messages[0]['content'] | no_such_filter }}",
    ],
)
def test_broken_template(template: str) -> None:
    with pytest.raises(RequestError, match="chat template failed"):
        render_chat(template, USER)


ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__']['exec']('open(\"MARKER\", \"w\")') }}",
    "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",
    "{{ messages[0].update({'content': 'pwned'}) }}",
    "{{ messages[0]['content'].__len__() }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_sandbox_escape_refused(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError, match="chat template failed"):
        render_chat(template.replace("MARKER", str(marker)), messages)
    assert not marker.exists()
    assert messages == [{"role": "user", "content": "hi"}]


def test_unsafe_attribute_renders_nothing() -> None:
    # a bare unsafe attribute is an undefined value: it renders empty, it never reaches the object
    assert render_chat("[{{ ''.__class__ }}]", USER) == "[]"


# Templates from a GGUF are input: a runtime error inside one is a bad request, like a syntax error.
RUNTIME_ERRORS = {
    "zero-division": "{{ 1 / 0 }}",
    "str-plus-int": "{{ 'a' + 1 }}",
    "huge-range": "{% for i in range(10**9) %}{% endfor %}",
    "tojson-undefined": "{{ nothing | tojson }}",
    "raise-no-args": "{{ raise_exception() }}",
}


@pytest.mark.parametrize("case", RUNTIME_ERRORS)
def test_runtime_error_in_template(case: str) -> None:
    with pytest.raises(RequestError):
        render_chat(RUNTIME_ERRORS[case], USER)


# -- filters and globals ------------------------------------------------------------------------------


def test_tojson_keeps_non_ascii() -> None:
    messages = [{"role": "user", "content": "héllo ✓ 日本 🎉"}]
    out = render_chat("{{ messages | tojson }}", messages)
    assert out == '[{"role": "user", "content": "héllo ✓ 日本 🎉"}]'
    assert "\\u" not in out


def test_tojson_options() -> None:
    out = render_chat("{{ {'b': 1, 'a': 'ü'} | tojson(indent=2, sort_keys=true) }}", USER)
    assert out == '{\n  "a": "ü",\n  "b": 1\n}'
    assert render_chat("{{ 'ü' | tojson(ensure_ascii=true) }}", USER) == '"\\u00fc"'


def test_tojson_tools() -> None:
    tools = [{"type": "function", "function": {"name": "météo", "parameters": {}}}]
    out = render_chat("{% for t in tools %}{{ t | tojson }}{% endfor %}", USER, tools=tools)
    assert out == '{"type": "function", "function": {"name": "météo", "parameters": {}}}'


def test_strftime_now() -> None:
    out = render_chat("{{ strftime_now('%Y') }}", USER)
    assert out.isdigit() and len(out) == 4


def test_messages_not_mutated() -> None:
    messages = [{"role": "user", "content": None, "extra": 1}]
    render_chat(CHATML_TEMPLATE, messages)
    assert messages == [{"role": "user", "content": None, "extra": 1}]


def test_loop_controls_as_hugging_face_allows() -> None:
    """Hugging Face renders templates with jinja2's loopcontrols extension: {% break %} and {% continue %}."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{{ m['content'] }};{% if loop.index == 2 %}{% break %}{% endif %}{% endfor %}"
    )
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat(template, messages) == "a;"
