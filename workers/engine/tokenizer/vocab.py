"""The vocabulary as the GGUF file describes it: token texts, scores, types, special ids, flags.

Token types follow llama.cpp (`llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte. Special-token splitting copies llama.cpp's `tokenizer_st_partition`: the special
tokens are tried longest text first, each splitting every still-raw fragment at its non-overlapping
occurrences; user-defined tokens are always split out, control and unknown ones only when the caller
asks to parse special tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from genie_common.errors import ModelFileError


class TokenType(IntEnum):
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Texts llama.cpp also treats as end-of-generation when the file's ids do not say so; it forces such
# tokens to CONTROL ("control-looking token"), so they are split out only with parse_special and
# print as nothing (Gemma's "</s>", id 212, is USER_DEFINED in the file). "<reponame>" and
# "<|repo_name|>" are fill-in-the-middle "repo" markers, which llama.cpp also ends generation on;
# "<turn|>" and "<|tool_response>" are Gemma 4's end of turn and its tool-response opener (after a call
# the model stops there for the result).
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<eos>",
    "</s>",
    "<|eom_id|>",
    "<reponame>",
    "<|repo_name|>",
    "<turn|>",
    "<|tool_response>",
)
# Where one of these markers ends generation, "</s>" is an ordinary token (Gemma 4 writes it as text):
# llama.cpp then takes it back out of the end-of-generation set and makes it NORMAL.
NORMAL_S_MARKERS = ("<|tool_response>", "<|plamo:eos|>")
# Placeholders that stand for an image, audio or video clip in a multimodal prompt (Gemma 3, 3n and 4;
# Qwen2-VL; Llama 3.2 Vision). An answer is text for a reader or a speech engine, so they print as nothing,
# like control tokens. Gemma 3's GGUFs mark "<start_of_image>", "<end_of_image>" and "[multimodal]"
# USER_DEFINED, which llama.cpp prints as text, and Gemma 3 270M writes "<start_of_image>" between the
# sentences of plain answers (2 of 8 seeds of "The capital of France is" within 48 tokens). Their type
# stays as the file says, so prompts still split them out whole and token ids stay llama.cpp's; a NORMAL
# token of the same spelling (Gemma 4's "[multimodal]") is what plain text merges into, and stays text.
MEDIA_TEXTS = (
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    "<start_of_audio>",
    "<end_of_audio>",
    "<audio_soft_token>",
    "[multimodal]",
    "<|image>",
    "<image|>",
    "<|audio>",
    "<audio|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# token types that print as nothing unless special text is asked for (llama.cpp: CONTROL and UNKNOWN, and
# UNUSED, which its detokenizer has no case for)
HIDDEN_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED)

Fragment = str | int  # raw text still to tokenize, or a token id already decided


@dataclass
class Vocab:
    model: str  # "llama" (SentencePiece), "gpt2" (byte-level BPE) or "gemma4" (BPE over raw UTF-8, spaces as ▁)
    pre: str
    tokens: list[str]
    scores: np.ndarray  # [n_vocab] float32
    types: np.ndarray  # [n_vocab] int32, TokenType values
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    token_to_id: dict[str, int] = field(repr=False, default_factory=dict)
    _special_all: list[int] = field(repr=False, default_factory=list)
    _special_user: list[int] = field(repr=False, default_factory=list)
    _markup: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, bool))  # [n_vocab] is_markup
    media_ids: tuple[int, ...] = ()  # the media placeholders (MEDIA_TEXTS) this vocabulary has
    # the longest token's spelling in UTF-8 bytes, at least the bytes any token stands for: a text of n
    # bytes is at least n / max_token_bytes tokens, known before tokenizing it
    max_token_bytes: int = 1

    def __post_init__(self) -> None:
        self.token_to_id = dict(zip(self.tokens, range(len(self.tokens)), strict=True))
        self.max_token_bytes = max((len(t.encode("utf-8", "surrogateescape")) for t in self.tokens), default=1) or 1
        named_eog = [i for i in (self.token_to_id.get(text) for text in EOG_TEXTS) if i is not None]
        self.types = self.types.copy()
        self.types[named_eog] = TokenType.CONTROL
        eog = set(self.eog_ids) | set(named_eog)
        s_id = self.token_to_id.get("</s>")
        if s_id is not None and any(self.token_to_id.get(m) in eog for m in NORMAL_S_MARKERS):
            eog.discard(s_id)
            self.types[s_id] = TokenType.NORMAL
        self.eog_ids = frozenset(eog)
        self._markup = np.isin(self.types, [int(t) for t in HIDDEN_TYPES])
        media = [self.token_to_id.get(text) for text in MEDIA_TEXTS]
        self.media_ids = tuple(i for i in media if i is not None and self.types[i] != TokenType.NORMAL)
        self._markup[list(self.media_ids)] = True
        special_types = [int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)]
        tokens = self.tokens
        ids = [i for i in np.nonzero(np.isin(self.types, special_types))[0].tolist() if tokens[i]]
        ids.sort(key=lambda i: len(self.tokens[i].encode("utf-8", "surrogateescape")), reverse=True)
        self._special_all = ids
        self._special_user = [i for i in ids if self.types[i] == TokenType.USER_DEFINED]

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def escapes_spaces(self) -> bool:
        """Tokens spell spaces as U+2581 and unknown bytes as <0xXX> (SentencePiece and Gemma 4), rather
        than in GPT-2's byte-to-character alphabet."""
        return self.model in ("llama", "gemma4")

    def is_markup(self, token_id: int) -> bool:
        """Never text of an answer: control, unknown and unused tokens, and media placeholders."""
        return bool(self._markup[token_id])

    def partition(self, text: str, parse_special: bool) -> list[Fragment]:
        """Split `text` into raw-text pieces and special-token ids, as llama.cpp does."""
        fragments: list[Fragment] = [text] if text else []
        for token_id in self._special_all if parse_special else self._special_user:
            special = self.tokens[token_id]
            if not any(isinstance(f, str) and special in f for f in fragments):
                continue
            split: list[Fragment] = []
            for frag in fragments:
                if isinstance(frag, int) or special not in frag:
                    split.append(frag)
                    continue
                pieces = frag.split(special)
                for k, piece in enumerate(pieces):
                    if k:
                        split.append(token_id)
                    if piece:
                        split.append(piece)
            fragments = split
        return fragments


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def vocab_from_metadata(meta: dict[str, Any], path: str) -> Vocab:
    """Build the vocabulary from GGUF metadata; a missing, mistyped or inconsistent field names the file."""
    model = meta.get("tokenizer.ggml.model")
    if model not in ("llama", "gpt2", "gemma4"):
        raise ModelFileError(path, f"unsupported tokenizer model {model!r} (genie reads 'llama', 'gpt2' and 'gemma4')")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelFileError(path, "tokenizer.ggml.tokens is missing or not a list of strings")
    n = len(tokens)

    def numbers(key: str, kinds: str, default: np.ndarray, dtype: type) -> np.ndarray:
        value = meta.get(key)
        if value is None:
            return default
        if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds or value.shape != (n,):
            raise ModelFileError(path, f"{key} must be an array of {n} numbers")
        return value.astype(dtype)

    scores = numbers("tokenizer.ggml.scores", "iuf", np.zeros(n, np.float32), np.float32)
    types = numbers("tokenizer.ggml.token_type", "iu", np.full(n, TokenType.NORMAL, np.int32), np.int32)
    merges = meta.get("tokenizer.ggml.merges") or []
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise ModelFileError(path, "tokenizer.ggml.merges is not a list of strings")
    if model in ("gpt2", "gemma4") and not merges:
        raise ModelFileError(path, f"{model} tokenizer without tokenizer.ggml.merges")
    bad_byte = next((i for i in np.nonzero(types == TokenType.BYTE)[0] if not _BYTE_TOKEN.fullmatch(tokens[i])), None)
    if bad_byte is not None:
        raise ModelFileError(path, f"byte token {bad_byte} is {tokens[bad_byte]!r}, not <0xXX>")

    def token_id(key: str) -> int | None:
        value = meta.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
            raise ModelFileError(path, f"{key} = {value!r} is not a token id of the vocabulary of {n}")
        return value

    def flag(key: str, default: bool) -> bool:
        value = meta.get(key, default)
        if not isinstance(value, bool):
            raise ModelFileError(path, f"{key} = {value!r} is not a boolean")
        return value

    pre = meta.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str):
        raise ModelFileError(path, f"tokenizer.ggml.pre = {pre!r} is not a string")
    if model == "gemma4":
        pre = "gemma4"  # llama.cpp fixes the pre-tokenizer of this model, whatever the file says
    bos_id = token_id("tokenizer.ggml.bos_token_id")
    eos_id = token_id("tokenizer.ggml.eos_token_id")
    eog = {
        i
        for i in (eos_id, token_id("tokenizer.ggml.eot_token_id"), token_id("tokenizer.ggml.eom_token_id"))
        if i is not None
    }
    return Vocab(
        model=model,
        pre=pre,
        tokens=tokens,
        scores=scores,
        types=types,
        merges=merges,
        bos_id=bos_id,
        eos_id=eos_id,
        # Gemma 4 always starts with BOS: llama.cpp overrides a file that says otherwise
        add_bos=(flag("tokenizer.ggml.add_bos_token", model == "llama") or model == "gemma4") and bos_id is not None,
        # only SentencePiece prepends a space; llama.cpp's BPE paths ignore the flag
        add_space_prefix=flag("tokenizer.ggml.add_space_prefix", model == "llama") and model == "llama",
        eog_ids=frozenset(eog),
    )
