"""A perplexity run against a reference run of the same text, token by token (bench/*_fidelity.py)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from genie_workers.engine.perplexity import perplexity


def timed_perplexity(engine: Any, text: str, ctx: int) -> tuple[Any, float]:
    """perplexity(engine, text, ctx) and the seconds it took."""
    t = time.perf_counter()
    r = perplexity(engine, text, ctx)
    return r, time.perf_counter() - t


def against(r: Any, ref: Any) -> str:
    """Table cells: r's perplexity (its change from ref's), then the mean, 99th percentile and max of the per-token
    absolute NLL change."""
    d = np.abs(np.asarray(r.nll) - np.asarray(ref.nll))
    return f"{r.ppl:.4f} ({r.ppl / ref.ppl - 1:+.2%}) | {d.mean():.4f} | {np.percentile(d, 99):.4f} | {d.max():.4f}"
