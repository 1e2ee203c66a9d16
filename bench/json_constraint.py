"""Which structured-generation library fits genie's NumPy/CuPy logit mask: llguidance (what genie uses),
xgrammar and outlines-core on the same vocabularies and schema, side by side.

    pip install xgrammar outlines-core   # the two it is compared with (dev only; xgrammar needs torch)
    python bench/json_constraint.py [--models smollm2-135m gemma3-270m]

For each library and model: the one-off cost (vocabulary view + schema compile) and the per-token cost of
computing the allowed-token mask and applying it to a float32 logit row, over a fixed JSON answer fed
token by token. A library that is not installed is listed as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genie_common.registry import resolve_model  # noqa: E402
from genie_workers.engine.constraint import JsonConstraint, _TokenizerView  # noqa: E402
from genie_workers.engine.model import Model  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "on": {"type": "boolean"},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
        "color": {"enum": ["warm white", "cold white", "red", "green", "blue"]},
    },
    "required": ["name", "on", "brightness", "color"],
    "additionalProperties": False,
}
ANSWER = '{"name":"Kitchen Light","on":true,"brightness":80,"color":"warm white"}'


def _ms(samples: list[float]) -> str:
    return f"{1000 * statistics.median(samples):.2f}"


def bench_llguidance(tok: Any, ids: list[int]) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    JsonConstraint(tok, SCHEMA)  # the vocabulary view, once per model
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = JsonConstraint(tok, SCHEMA)  # each request: the schema alone
    setup = time.perf_counter() - t0
    print(f"  (llguidance: first request {first:.2f} s with the vocabulary view, then {setup:.3f} s a schema)")
    row = np.zeros(tok.vocab.n_vocab, np.float32)
    times = []
    for t in ids:
        t1 = time.perf_counter()
        c.mask(row)
        times.append(time.perf_counter() - t1)
        c.advance(t)
    return setup, times


def bench_xgrammar(tok: Any, ids: list[int]) -> tuple[float, list[float]]:
    import xgrammar as xgr

    view = _TokenizerView(tok)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(
        [b if not b.startswith(b"\xff") else b"" for b in view.tokens],
        vocab_type=xgr.VocabType.RAW,
        vocab_size=tok.vocab.n_vocab,
        stop_token_ids=sorted(tok.vocab.eog_ids),
    )
    compiled = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")
    )
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, tok.vocab.n_vocab)
    setup = time.perf_counter() - t0
    times = []
    for t in ids:
        t1 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask.numpy()[0]
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: tok.vocab.n_vocab].astype(bool)
        row = np.where(allowed, np.zeros(tok.vocab.n_vocab, np.float32), -np.inf)
        times.append(time.perf_counter() - t1)
        assert np.isfinite(row[t]), "xgrammar forbade the answer's next token"
        matcher.accept_token(t)
    return setup, times


def bench_outlines(tok: Any, ids: list[int]) -> tuple[float, list[float]]:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    view = _TokenizerView(tok)
    eos = min(tok.vocab.eog_ids)
    t0 = time.perf_counter()
    by_text: dict[str, list[int]] = {}
    for i, b in enumerate(view.tokens):
        if b and not b.startswith(b"\xff") and i != eos:
            by_text.setdefault(b.decode("latin-1"), []).append(i)  # bytes 1:1 as chars
    vocabulary = Vocabulary(eos, by_text)
    regex = build_regex_from_schema(json.dumps(SCHEMA))
    guide = Guide(Index(regex, vocabulary))
    setup = time.perf_counter() - t0
    times = []
    for t in ids:
        t1 = time.perf_counter()
        row = np.full(tok.vocab.n_vocab, -np.inf, np.float32)
        row[guide.get_tokens()] = 0.0
        times.append(time.perf_counter() - t1)
        guide.advance(t)
    return setup, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    args = p.parse_args()
    print("| library | model | vocab | setup s | mask + apply ms/token (median) | max ms |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        from genie_workers.engine.backends.numpy_backend import NumpyBackend

        tok = Model.load(resolve_model(name), NumpyBackend()).tokenizer
        ids = tok.encode_piece(ANSWER)
        for lib, fn in (
            ("llguidance", bench_llguidance),
            ("xgrammar", bench_xgrammar),
            ("outlines-core", bench_outlines),
        ):
            try:
                setup, times = fn(tok, ids)
            except ImportError:
                print(f"| {lib} | {name} | {tok.vocab.n_vocab} | not installed | | |")
                continue
            except Exception as e:  # a library that cannot take this vocabulary or schema: say so
                print(f"| {lib} | {name} | {tok.vocab.n_vocab} | failed: {type(e).__name__}: {str(e)[:80]} | | |")
                continue
            print(
                f"| {lib} | {name} | {tok.vocab.n_vocab} | {setup:.2f} | {_ms(times)} | {1000 * max(times):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
