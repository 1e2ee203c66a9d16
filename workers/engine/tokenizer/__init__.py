"""Tokenizer built from GGUF metadata; token ids equal llama.cpp's (`llama_tokenize`)."""

from __future__ import annotations

import codecs
from typing import Any

from genie_common.errors import RequestError

from .bpe import BpeTokenizer, byte_decoder
from .spm import SpmTokenizer
from .vocab import TokenType, Vocab, vocab_from_metadata

__all__ = ["StreamDecoder", "Tokenizer", "TokenType", "Vocab"]

_SPACE = "\u2581"


class Tokenizer:
    def __init__(self, vocab: Vocab, path: str) -> None:
        self.vocab = vocab
        self._impl = SpmTokenizer(vocab) if vocab.model == "llama" else BpeTokenizer(vocab, path)
        self._pieces: list[bytes | None] = [None] * vocab.n_vocab  # lazily filled token_to_bytes cache

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], path: str) -> Tokenizer:
        return cls(vocab_from_metadata(meta, path), path)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; `add_bos=None` follows the file's add_bos_token flag."""
        vocab = self.vocab
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates, e.g. undecodable bytes from a command line
            raise RequestError("the text is not valid UTF-8") from None
        out: list[int] = []
        if (vocab.add_bos if add_bos is None else add_bos) and vocab.bos_id is not None:
            out.append(vocab.bos_id)
        is_prev_special = True
        for frag in vocab.partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                is_prev_special = True
                continue
            if vocab.add_space_prefix and is_prev_special:
                frag = " " + frag
            if vocab.escapes_spaces:
                frag = frag.replace(" ", _SPACE)
            out.extend(self._impl.encode(frag))
            is_prev_special = False
        return out

    def encode_piece(self, text: str) -> list[int]:
        """Token ids of `text` as a piece inside a longer text: no BOS, no SentencePiece space prefix,
        special tokens' text as plain text (what llguidance asks when it forces bytes)."""
        if self.vocab.escapes_spaces:
            return self._impl.encode(text.replace(" ", _SPACE)) if text else []
        return self._impl.encode(text) if text else []

    def token_to_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes a token stands for; markup (control tokens, media placeholders) is empty unless `special`."""
        vocab = self.vocab
        if not 0 <= token_id < vocab.n_vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary of {vocab.n_vocab}")
        if vocab.is_markup(token_id):
            return vocab.tokens[token_id].encode("utf-8", "surrogateescape") if special else b""
        cached = self._pieces[token_id]
        if cached is None:
            cached = self._piece(token_id)
            self._pieces[token_id] = cached
        return cached

    def _piece(self, token_id: int) -> bytes:
        vocab = self.vocab
        text = vocab.tokens[token_id]
        ttype = int(vocab.types[token_id])
        if ttype == TokenType.USER_DEFINED:
            return text.encode("utf-8", "surrogateescape")
        if vocab.escapes_spaces:
            if ttype == TokenType.BYTE:
                return bytes([int(text[3:5], 16)])
            return text.replace(_SPACE, " ").encode("utf-8", "surrogateescape")
        table = byte_decoder()
        return bytes(table[c] for c in text if c in table)

    def decode(self, ids: list[int], special: bool = False) -> str:
        return b"".join(self.token_to_bytes(i, special) for i in ids).decode("utf-8", "replace")

    def stream(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)


class StreamDecoder:
    """Turns tokens into text pieces as they come, never splitting a UTF-8 sequence."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_to_bytes(token_id, self._special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
