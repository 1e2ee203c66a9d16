"""Sampling parameters and the sampler: repetition penalty, top-k, top-p, min-p, temperature, seed.

The order is llama.cpp's default chain (penalties -> top-k -> top-p -> min-p -> temperature -> draw),
so the same settings mean the same thing in both. Temperature 0 is greedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from genie_common import defaults
from genie_common.errors import RequestError

FLOAT32_BIG = float(np.finfo(np.float32).max) / 4  # penalized logits stay within this: differences stay finite


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.05  # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64  # tokens the penalty looks back over
    seed: int | None = None  # None = a fresh random seed
    max_tokens: int = defaults.MAX_TOKENS  # the daemon's max_tokens_default too
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        checks = [
            (math.isfinite(self.temperature) and self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0, "repeat_penalty must be > 0"),
            (self.repeat_last_n >= 0, "repeat_last_n must be >= 0"),
            (self.max_tokens >= 0, "max_tokens must be >= 0"),
            (self.seed is None or 0 <= self.seed < 2**64, "seed must be in [0, 2^64)"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings"),
        ]
        for ok, message in checks:
            if not ok:
                raise RequestError(message)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Draws tokens for one sequence; the same seed gives the same tokens."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """logits [vocab] float32, finite (not modified) -> token id, for any valid parameters."""
        p = self.params
        logits = apply_repeat_penalty(logits, history[-p.repeat_last_n :] if p.repeat_last_n else [], p.repeat_penalty)
        if p.is_greedy:
            return int(np.argmax(logits))
        # candidates, sorted by logit, highest first
        if 0 < p.top_k < logits.shape[0]:
            ids = np.argpartition(logits, -p.top_k)[-p.top_k :]
        else:
            ids = np.arange(logits.shape[0])
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        cand = logits[ids].astype(np.float64)
        if p.top_p < 1.0:
            probs = _softmax(cand)
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            ids, cand = ids[:keep], cand[:keep]
        if p.min_p > 0.0:
            keep = int(np.count_nonzero(cand >= cand[0] + math.log(p.min_p)))
            ids, cand = ids[: max(keep, 1)], cand[: max(keep, 1)]
        with np.errstate(over="ignore"):  # shifted first: a tiny temperature sends the rest to -inf, not NaN
            probs = _softmax((cand - cand[0]) / p.temperature)
        return int(ids[self.rng.choice(len(ids), p=probs)])


def apply_repeat_penalty(logits: np.ndarray, recent: list[int], penalty: float) -> np.ndarray:
    if penalty == 1.0 or not recent:
        return logits
    out = logits.copy()
    ids = np.unique(np.asarray(recent))
    vals = out[ids].astype(np.float64)
    penalized = np.where(vals > 0, vals / penalty, vals * penalty)
    # an extreme penalty (1e-300, 1e300) must not make infinities: inf - inf is the NaN that once reached
    # rng.choice and killed the worker; clipped, the order of the logits is what it would have been
    out[ids] = np.clip(penalized, -FLOAT32_BIG, FLOAT32_BIG)
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
