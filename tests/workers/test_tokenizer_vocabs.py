"""genie's byte-level BPE against llama.cpp's own tokenizer test vectors for the `qwen2` and `llama-bpe`
pre-tokenizers.

tests/fixtures/vocab/ holds llama.cpp's vocab-only GGUFs (models/ggml-vocab-*.gguf in llama.cpp, taken
from the llama-cpp-python 0.3.36 sdist) with their `.inp`/`.out` files. llama.cpp's tests/test-tokenizer-0
splits `.inp` on "\\n__ggml_vocab_test__\\n" and reads one line of space-separated ids per case from
`.out`; it tokenizes with add_special=false and parse_special=false, so no BOS and special-token text is
plain text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.gguf_file import GGUFFile
from workers.engine.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vocab"
VOCABS = ("qwen2", "llama-bpe")
SEP = "\n__ggml_vocab_test__\n"


def read_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs, parsed the way llama.cpp's test-tokenizer-0.cpp `read_tests` does."""
    base = FIXTURES / f"ggml-vocab-{name}.gguf"
    raw = base.with_name(base.name + ".inp").read_bytes().decode("utf-8")
    texts = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt == -1:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    lines = base.with_name(base.name + ".out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines), f"{name}: {len(texts)} inputs but {len(lines)} outputs"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


CASES = [
    pytest.param(name, text, ids, id=f"{name}-{k:02d}")
    for name in VOCABS
    for k, (text, ids) in enumerate(read_cases(name))
]


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    loaded: dict[str, Tokenizer] = {}
    for name in VOCABS:
        path = FIXTURES / f"ggml-vocab-{name}.gguf"
        with GGUFFile(path) as gf:
            loaded[name] = Tokenizer.from_metadata(gf.metadata, str(path))
    return loaded


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_metadata(tokenizers: dict[str, Tokenizer], name: str) -> None:
    vocab = tokenizers[name].vocab
    assert vocab.model == "gpt2"
    assert vocab.pre == name
    assert len(read_cases(name)) == 46


@pytest.mark.parametrize(("name", "text", "ids"), CASES)
def test_encode_matches_llama_cpp(tokenizers: dict[str, Tokenizer], name: str, text: str, ids: list[int]) -> None:
    assert tokenizers[name].encode(text, add_bos=False, parse_special=False) == ids


@pytest.mark.parametrize(("name", "text", "ids"), CASES)
def test_decode_round_trips(tokenizers: dict[str, Tokenizer], name: str, text: str, ids: list[int]) -> None:
    assert tokenizers[name].decode(ids) == text
