"""BPE on the `tokenizers` library, rebuilt from GGUF metadata: byte-level (`gpt2` vocabularies) and
Gemma 4's BPE over raw UTF-8.

The pre-tokenizer regexes are llama.cpp's for each `tokenizer.ggml.pre` value (llama-vocab.cpp); each
regex splits the pieces the previous one left, keeping matches and the text between them, which is
`Split(behavior="isolated")` in `tokenizers`.

Gemma 4 (`gemma4`) has no GPT-2 byte alphabet: the caller has already spelled spaces as U+2581, the text
is split only into lines and runs of newlines, merges run over UTF-8 characters, and a character with no
token becomes <0xXX> byte tokens (`byte_fallback`). llama.cpp looks a run of newlines up whole before
merging it; for this vocabulary the merges give the same token for every run it has one for (the tests
check runs of 1 to 31), so no special case is needed here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from genie_common.errors import ModelFileError

from .vocab import Vocab

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> (regexes applied in order, ignore_merges)
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False),
    "gpt-2": ((_GPT2,), False),
    "smollm": ((r"\p{N}", _GPT2), False),
    "starcoder": ((r"\p{N}", _GPT2), False),
    "llama-bpe": ((_LLAMA3,), True),
    "llama3": ((_LLAMA3,), True),
    "qwen2": ((_QWEN2,), False),
    "qwen35": ((_QWEN2,), False),
    "gemma4": ((r"[^\n]+|\n+",), False),  # no byte-level step: see `BpeTokenizer`
}


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: char -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def split_merge(line: str, path: str) -> tuple[str, str]:
    """A merge rule "left right"; llama.cpp looks for the separating space from the second character on,
    so a left side may itself be a space."""
    cut = line.find(" ", 1)
    if cut < 0:
        raise ModelFileError(path, f"malformed merge {line!r}")
    return line[:cut], line[cut + 1 :]


class BpeTokenizer:
    def __init__(self, vocab: Vocab, path: str) -> None:
        if vocab.pre not in PRE_TOKENIZERS:
            known = ", ".join(sorted(PRE_TOKENIZERS))
            raise ModelFileError(path, f"unsupported BPE pre-tokenizer {vocab.pre!r} (known: {known})")
        regexes, ignore_merges = PRE_TOKENIZERS[vocab.pre]
        raw_utf8 = vocab.model == "gemma4"
        merges = [split_merge(line, path) for line in vocab.merges]
        try:
            model = models.BPE(
                vocab=dict(vocab.token_to_id), merges=merges, ignore_merges=ignore_merges, byte_fallback=raw_utf8
            )
        except Exception as e:  # the tokenizers library raises a bare Exception for merges of unknown tokens
            raise ModelFileError(path, f"tokenizer merges do not fit the vocabulary: {e}") from None
        self._tok = Tokenizer(model)
        splits: list[Any] = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        if not raw_utf8:
            splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        self._tok.pre_tokenizer = pre_tokenizers.Sequence(splits)

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        return self._tok.encode(text, add_special_tokens=False).ids
