"""Perplexity over a long text, in windows of the context length.

Windows: if the model adds BOS, each window is [BOS] + tokens[i : i + ctx - 1] with step ctx - 1, so
every token is scored once; otherwise tokens[i : i + ctx] with step ctx, and each window's first
token is not scored. Each scored token's NLL is given what precedes it in its window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from genie_common.errors import RequestError

from .engine import Engine


@dataclass
class PerplexityResult:
    ppl: float
    nll: np.ndarray  # [n_scored] float64, in text order

    @property
    def n_scored(self) -> int:
        return int(self.nll.shape[0])


def perplexity(
    engine: Engine, text: str, ctx: int, progress: Callable[[int, int], None] | None = None
) -> PerplexityResult:
    if ctx < 2 or ctx > engine.n_ctx:
        raise RequestError(f"--ctx must be in [2, {engine.n_ctx}] (the engine's context)")
    tokens = engine.tokenizer.encode(text, add_bos=False)
    bos = engine.tokenizer.bos_id if engine.tokenizer.vocab.add_bos else None
    if bos is not None:
        windows = [[bos, *tokens[i : i + ctx - 1]] for i in range(0, len(tokens), ctx - 1)]
    else:
        windows = [tokens[i : i + ctx] for i in range(0, len(tokens), ctx)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise RequestError(f"the text has {len(tokens)} tokens; nothing to score")
    parts = []
    for k, window in enumerate(windows):
        parts.append(engine.token_nll(window))
        if progress:
            progress(k + 1, len(windows))
    nll = np.concatenate(parts)
    return PerplexityResult(math.exp(float(nll.mean())), nll)
