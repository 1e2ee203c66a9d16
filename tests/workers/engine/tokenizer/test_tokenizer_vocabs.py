"""genie's BPE against llama.cpp's own tokenizer test vectors: byte-level BPE with the `qwen2` and
`llama-bpe` pre-tokenizers, and Gemma 4's BPE over raw UTF-8.

testkit/fixtures/vocab/ holds llama.cpp's vocab-only GGUFs (models/ggml-vocab-*.gguf in llama.cpp, taken
from the llama-cpp-python 0.3.36 sdist; Gemma 4's xz-compressed) with their `.inp`/`.out` files.
llama.cpp's tests/test-tokenizer-0 splits `.inp` on "\\n__ggml_vocab_test__\\n" and reads one line of
space-separated ids per case from `.out`; it tokenizes with add_special=false and parse_special=false, so no
BOS and special-token text is plain text.
"""

from __future__ import annotations

from typing import Any

import pytest

from genie_common.errors import ModelFileError
from genie_common.gguf_file import GGUFFile
from genie_workers.engine.tokenizer import Tokenizer
from genie_workers.engine.tokenizer.vocab import TokenType, vocab_from_metadata
from testkit.vocab_files import vector_file, vocab_gguf

# vocab name -> (tokenizer.ggml.model, pre-tokenizer genie uses)
VOCABS = {"qwen2": ("gpt2", "qwen2"), "llama-bpe": ("gpt2", "llama-bpe"), "gemma-4": ("gemma4", "gemma4")}
SEP = "\n__ggml_vocab_test__\n"


def read_cases(name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs, parsed the way llama.cpp's test-tokenizer-0.cpp `read_tests` does."""
    inp = vector_file(name)
    raw = inp.read_bytes().decode("utf-8")
    texts = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt == -1:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    lines = inp.with_suffix(".out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines), f"{name}: {len(texts)} inputs but {len(lines)} outputs"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


CASES = [
    pytest.param(name, text, ids, id=f"{name}-{k:02d}")
    for name in VOCABS
    for k, (text, ids) in enumerate(read_cases(name))
]


@pytest.fixture(scope="module")
def metadata() -> dict[str, dict[str, Any]]:
    out = {}
    for name in VOCABS:
        with GGUFFile(vocab_gguf(name)) as gf:
            out[name] = dict(gf.metadata)
    return out


@pytest.fixture(scope="module")
def tokenizers(metadata: dict[str, dict[str, Any]]) -> dict[str, Tokenizer]:
    return {name: Tokenizer.from_metadata(meta, name) for name, meta in metadata.items()}


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_metadata(tokenizers: dict[str, Tokenizer], name: str) -> None:
    vocab = tokenizers[name].vocab
    assert (vocab.model, vocab.pre) == VOCABS[name]
    assert len(read_cases(name)) == 46


def test_gemma4_special_tokens(tokenizers: dict[str, Tokenizer]) -> None:
    """llama.cpp's rules for Gemma 4: <eos>, <turn|> and <|tool_response>" end generation and are control
    tokens; "</s>" is then ordinary text; spaces are U+2581 and newline runs are their own tokens."""
    tok = tokenizers["gemma-4"]
    vocab = tok.vocab
    eog = {vocab.tokens[i] for i in tok.eog_ids}
    assert eog == {"<eos>", "<turn|>", "<|tool_response>"}
    assert vocab.types[vocab.token_to_id["</s>"]] == TokenType.NORMAL
    assert vocab.types[vocab.token_to_id["<|tool_response>"]] == TokenType.CONTROL
    assert (vocab.add_bos, vocab.bos_id, vocab.add_space_prefix) == (True, 2, False)
    turn = tok.encode("<|turn>user\nHi<turn|>\n", add_bos=True, parse_special=True)
    assert [vocab.tokens[i] for i in turn] == ["<bos>", "<|turn>", "user", "\n", "Hi", "<turn|>", "\n"]
    assert tok.decode(turn) == "user\nHi\n"
    assert tok.decode(turn, special=True) == "<bos><|turn>user\nHi<turn|>\n"
    assert tok.encode("<turn|>", add_bos=False, parse_special=False) != [vocab.token_to_id["<turn|>"]]
    assert [vocab.tokens[i] for i in tok.encode("a\n\n\nb", add_bos=False)] == ["a", "\n\n\n", "b"]
    # llama.cpp takes a run of newlines that is a token as that token; the merges must agree
    runs = [t for t in vocab.tokens if t and set(t) == {"\n"}]
    assert len(runs) == 31
    assert all(tok.encode(t, add_bos=False) == [vocab.token_to_id[t]] for t in runs)


def test_gemma4_forces_bos(metadata: dict[str, dict[str, Any]]) -> None:
    """llama.cpp starts every Gemma 4 prompt with BOS even when the file says add_bos_token = false."""
    meta = {**metadata["gemma-4"], "tokenizer.ggml.add_bos_token": False}
    assert vocab_from_metadata(meta, "g4").add_bos


def test_gemma4_needs_merges(metadata: dict[str, dict[str, Any]]) -> None:
    meta = {**metadata["gemma-4"], "tokenizer.ggml.merges": []}
    with pytest.raises(ModelFileError, match="gemma4 tokenizer without tokenizer.ggml.merges"):
        vocab_from_metadata(meta, "g4")


@pytest.mark.parametrize(("name", "text", "ids"), CASES)
def test_encode_matches_llama_cpp(tokenizers: dict[str, Tokenizer], name: str, text: str, ids: list[int]) -> None:
    assert tokenizers[name].encode(text, add_bos=False, parse_special=False) == ids


@pytest.mark.parametrize(("name", "text", "ids"), CASES)
def test_decode_round_trips(tokenizers: dict[str, Tokenizer], name: str, text: str, ids: list[int]) -> None:
    assert tokenizers[name].decode(ids) == text
