"""Output constrained to JSON (Ollama's `format`, OpenAI's `response_format`) with llguidance.

llguidance compiles a JSON schema to a grammar and, before each token, gives the set of tokens that keep
the output a valid prefix of it; the engine masks the rest of the logits to -inf, samples as usual, and
feeds the token back. Its tokenizer view is built once per model from genie's own tokenizer: each token's
bytes, the markup tokens, and genie's encode for the rare strings llguidance tokenizes itself. The schema
is first given bounds (json_bounds.py) so that the output also ends.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from genie_common.errors import ModelError, RequestError

from .json_bounds import bounded_schema
from .tokenizer import Tokenizer

ANY_OBJECT: dict[str, Any] = {"type": "object"}  # Ollama's "json" and OpenAI's json_object
GUIDANCE_DEFAULTS = {"whitespace_flexible": False, "lenient": True}


class _TokenizerView:
    """What llguidance's TokenizerWrapper reads from a tokenizer (see llguidance/_tokenizer.py)."""

    def __init__(self, tok: Tokenizer) -> None:
        vocab = tok.vocab
        self.eos_token_id = vocab.eos_id if vocab.eos_id is not None else min(vocab.eog_ids, default=0)
        self.bos_token_id = vocab.bos_id
        self.special_token_ids = [i for i in range(vocab.n_vocab) if vocab.is_markup(i)]
        # markup is marked with a 0xFF first byte (llguidance's convention), so the grammar never takes it
        # for literal text: the answer prints it as nothing, and a JSON string holding it would lose bytes
        special = set(self.special_token_ids)
        self.tokens = [
            (b"\xff" if i in special else b"") + tok.token_to_bytes(i, special=True) for i in range(vocab.n_vocab)
        ]
        self._tok = tok
        self._by_bytes: dict[bytes, int] | None = None  # for __call__'s fallback, built on first use
        self._longest = 1

    def __call__(self, text: bytes) -> list[int]:
        """Token ids whose bytes are exactly `text` (llguidance checks that); the tokenizer's own pieces
        when they are, else the longest token at each step (a SentencePiece vocabulary without a lone
        "▁" writes a space only as its <0x20> byte token)."""
        ids = self._tok.encode_piece(text.decode("utf-8", "replace"))
        if b"".join(self.tokens[i] for i in ids) == text:
            return ids
        if self._by_bytes is None:
            self._by_bytes = {}
            for i, b in enumerate(self.tokens):
                if b and not b.startswith(b"\xff"):
                    self._by_bytes.setdefault(b, i)
            self._longest = max(map(len, self._by_bytes), default=1)
        out, pos = [], 0
        while pos < len(text):
            for n in range(min(self._longest, len(text) - pos), 0, -1):
                tid = self._by_bytes.get(text[pos : pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                raise RequestError(f"format: the vocabulary cannot write the byte {text[pos]:#04x}")
        return out


_LL_TOKENIZERS: dict[int, Any] = {}  # id(Tokenizer) -> (Tokenizer, LLTokenizer): built once per model


def _ll_tokenizer(tok: Tokenizer) -> Any:
    import llguidance

    entry = _LL_TOKENIZERS.get(id(tok))
    if entry is None or entry[0] is not tok:
        view = llguidance.TokenizerWrapper(_TokenizerView(tok))
        ll = llguidance.LLTokenizer(view, n_vocab=tok.vocab.n_vocab, eos_token=sorted(tok.vocab.eog_ids) or None)
        entry = (tok, ll)
        _LL_TOKENIZERS[id(tok)] = entry
    return entry[1]


class JsonConstraint:
    """One request's grammar state: `mask(logits)` before sampling, `advance(token)` after."""

    def __init__(self, tok: Tokenizer, schema: dict[str, Any] | None) -> None:
        import llguidance
        import llguidance.numpy as llnp

        schema = bounded_schema(dict(schema or ANY_OBJECT))
        # unless the schema's own x-guidance says otherwise: compact JSON, since free whitespace lets a weak
        # model pad forever; keywords llguidance does not implement (propertyNames, an unknown string
        # format) are ignored, as Ollama's converter ignores them, rather than refuse the request
        try:
            schema["x-guidance"] = {**GUIDANCE_DEFAULTS, **(schema.get("x-guidance") or {})}
            grammar = llguidance.grammar_from("json_schema", json.dumps(schema))
        except (ValueError, TypeError) as e:
            raise RequestError(f"format: not a usable JSON schema: {e}") from None
        ll = _ll_tokenizer(tok)
        self.matcher = llguidance.LLMatcher(ll, grammar)
        if self.matcher.is_error():
            raise RequestError(f"format: not a usable JSON schema: {self.matcher.get_error()}")
        self._llnp = llnp
        self._bitmask = llnp.allocate_token_bitmask(1, ll.vocab_size)
        self._n_vocab = tok.vocab.n_vocab

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` [vocab] with every token the grammar forbids next set to -inf."""
        self._llnp.fill_next_token_bitmask(self.matcher, self._bitmask, 0)
        out = np.array(logits, dtype=np.float32, copy=True)[None]
        self._llnp.apply_token_bitmask_inplace(out, self._bitmask)
        return out[0]

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise ModelError(f"token {token} broke the JSON grammar: {self.matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The output is complete JSON and the grammar allows nothing more."""
        return bool(self.matcher.is_stopped())
