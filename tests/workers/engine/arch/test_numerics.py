"""Per-token NLL against llama.cpp on a real English text, for both real models (acceptance numbers).

The fixtures come from scripts/make_fixtures/nll.py (llama-cpp-python 0.3.36, F16 KV, ctx 512). llama.cpp
quantizes activations to Q8 inside its matmuls; genie's CPU products do the same for 4- and 5-bit weights
(cpu_blocks.c's groups) and compute in float32 for the others, and the two differ by ~0.07 nat per token; an
exact fp32 reference gets about the same.
"""

import json

import numpy as np
import pytest

from genie_workers.engine.perplexity import perplexity
from testkit import FIXTURES

TEXT = (FIXTURES / "text/apache-2.0.txt").read_text(encoding="utf-8")
MODELS = ("gemma3-270m", "smollm2-135m")
pytestmark = pytest.mark.slow  # ~2 minutes: runs in CI, skip locally with -m "not slow"
_results: dict[tuple[str, str], object] = {}


def ppl(make_engine, model: str, kv: str):
    if (model, kv) not in _results:
        _results[(model, kv)] = perplexity(make_engine(model, kv_dtype=kv, n_ctx=512), TEXT, 512)
    return _results[(model, kv)]


@pytest.mark.parametrize("model", MODELS)
def test_fp16_kv_nll_matches_llama_cpp(make_engine, model):
    ref = json.loads((FIXTURES / f"nll/{model}.json").read_text())
    r = ppl(make_engine, model, "f16")
    assert r.n_scored == len(ref["nll"])
    delta = np.abs(r.nll - np.asarray(ref["nll"]))
    assert delta.mean() <= 0.10, f"mean |dNLL| {delta.mean():.4f}"
    assert abs(r.ppl / ref["ppl"] - 1) <= 0.015, f"ppl {r.ppl:.4f} vs llama.cpp {ref['ppl']:.4f}"


@pytest.mark.parametrize("model", MODELS)
def test_int8_kv_costs_at_most_half_a_percent_of_perplexity(make_engine, model):
    f16, int8 = ppl(make_engine, model, "f16"), ppl(make_engine, model, "int8")
    assert int8.ppl <= 1.005 * f16.ppl, f"int8 {int8.ppl:.4f} vs f16 {f16.ppl:.4f}"


DECODE_TOKENS = 300


@pytest.mark.parametrize("model", MODELS)
def test_decode_steps_nll_matches_llama_cpp(make_engine, model):
    """The text's first DECODE_TOKENS scored tokens one pass a token (the decode path: one-row products, the
    one-token attention) against llama.cpp's NLL of the same positions, as the prompt path is above."""
    ref = np.asarray(json.loads((FIXTURES / f"nll/{model}.json").read_text())["nll"][:DECODE_TOKENS])
    engine = make_engine(model, kv_dtype="f16", n_ctx=512)
    ids = engine.tokenizer.encode(TEXT, add_bos=False)
    if engine.tokenizer.vocab.add_bos:  # perplexity()'s first window: every token scored after BOS
        ids = [engine.tokenizer.bos_id, *ids]
    nll = engine.token_nll(ids[: DECODE_TOKENS + 1], rows_per_pass=1)
    delta = np.abs(nll - ref)
    assert delta.mean() <= 0.10, f"mean |dNLL| {delta.mean():.4f}"
    assert abs(nll.mean() / ref.mean() - 1) <= 0.015, f"mean NLL {nll.mean():.4f} vs llama.cpp {ref.mean():.4f}"
