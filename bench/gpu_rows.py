"""The n-token products on the GPU (gemvn, kernels/quant.cu; backends/cupy/rows.py) against the one-token gemv1m, on
the Q4_K and Q6_K matrix shapes of Qwen3-4B (or --model gemma4-e2b's): microseconds a product and the weights'
GB/s, for 1 (gemv1m) and 2 / 4 / 8 / 16 tokens (gemvn), each captured as a graph of one product a copy of the
matrix (> 4x the L2, so every launch reads its weights from HBM, as a decode step does) and replayed.

    python bench/gpu_rows.py [--model qwen3-4b|gemma4-e2b] [--tokens 1 2 4 8 16 32] [--groups 1|2|4] [--only gate_up]
                             [--tune KNOB:VALUE,...]

--tune: CupyTuning fields (bench/gpu_variants.py's knobs), e.g. gemvn_groups_wide:2.
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

from gpu_gemv import E2B_SHAPES, SHAPES  # noqa: E402
from synthetic import _blocks  # noqa: E402


def replay_us(backend: Any, run: Any, n_launches: int) -> float:
    """Microseconds a product: `run` (one product a copy) captured once, replayed 10 times."""
    import cupy as cp

    captured = backend.steps._capture(run)
    stream = cp.cuda.get_current_stream()
    captured.graph.launch(stream)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(10):
        captured.graph.launch(stream)
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / (10 * n_launches)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("qwen3-4b", "gemma4-e2b"), default="qwen3-4b", help="whose matrix shapes")
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    p.add_argument(
        "--groups", type=int, default=0, help="gemvn_groups, _staged and _wide, all three (0: the backend's)"
    )
    p.add_argument("--only", default="", help="only the matrices whose label contains this (e.g. gate_up)")
    p.add_argument("--tune", default="", help="CupyTuning fields for the backend, e.g. gemvn_groups:4")
    args = p.parse_args()

    import cupy as cp
    from gpu_variants import apply, parse_variant

    from genie_workers.engine.backends.cupy import CupyBackend, QuantWeight
    from genie_workers.engine.backends.cupy.rows import X_PLAIN, RowsInput, gemvn, q8_rows

    backend = CupyBackend()
    names = ("gemvn_groups", "gemvn_groups_staged", "gemvn_groups_wide")
    knobs = {name: args.groups for name in names} if args.groups else {}
    knobs.update(parse_variant(f"tuned={args.tune}")[1])
    if knobs:
        apply(backend, knobs)
    t = backend.tuning
    print(f"gemvn_groups {t.gemvn_groups}, staged {t.gemvn_groups_staged}, wide {t.gemvn_groups_wide}")
    rng = np.random.default_rng(0)
    print("µs a product (GB/s of its weights); 1 token: gemv1m, more: gemvn")
    print("| matrix | type | MB | " + " | ".join(f"{n} tok" for n in args.tokens) + " |")
    print("|" + "---|" * (3 + len(args.tokens)), flush=True)
    for label, qtype, rows, cols in E2B_SHAPES if args.model == "gemma4-e2b" else SHAPES:
        if args.only not in label:
            continue
        block = _blocks(qtype, rows, cols, rng).reshape(-1)
        nbytes = block.nbytes
        n_copies = max(2, (4 * 50 * 2**20) // nbytes + 1)
        copies = [QuantWeight(cp.asarray(block), qtype, rows, cols) for _ in range(n_copies)]
        cells = []
        for n in args.tokens:
            x = cp.asarray(rng.standard_normal((n, cols), dtype=np.float32))
            y = cp.empty((n, rows), dtype=cp.float32)
            if n == 1:
                x8 = backend.products._q8_input(x, cols)

                def run(x8: Any = x8, y: Any = y, n: int = n, copies: list = copies) -> None:
                    for w in copies:
                        backend.products._gemv1q(w, x8, y[0])
            else:
                x8, _ = q8_rows(backend.products, RowsInput(x, X_PLAIN), 0, n)

                def run(x8: Any = x8, y: Any = y, n: int = n, copies: list = copies) -> None:
                    for w in copies:
                        gemvn(backend.products, w, x8, n, y, None, 0.0)

            us = replay_us(backend, run, len(copies))
            cells.append(f"{us:.1f} ({nbytes / us / 1e3:.0f})")
        print(f"| {label} | {qtype.name} | {nbytes / 1e6:.1f} | {' | '.join(cells)} |", flush=True)
        del copies


if __name__ == "__main__":
    main()
