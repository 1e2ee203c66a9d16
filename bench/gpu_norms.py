"""A post-norm's launch alone on the GPU: q8_add_normed (kernels/quant.cu; a decode token of Gemma 4 E2B runs it 104
times, a quarter of its 9.0 time in bench/NOTES-gemma4.md §10) against the smallest launch of its module and against
the two launches it replaced (add_normed, then q8_input's coding), and q8_input's norm and coding alone (38 a token
of E2B on 9.0; a block a row of a step's rows), at E2B's 1 536 and Qwen3-4B's 2 560 columns:
microseconds a launch in a captured graph of LAUNCHES dependent launches on one stream, replayed. Block sizes
other than the backend's 1 024 threads sum in another order (other numbers): they are here for their time only.

    python bench/gpu_norms.py [--cols 1536 2560] [--threads 1024 512 256]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_rows import replay_us  # noqa: E402

LAUNCHES = 200


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cols", nargs="+", type=int, default=[1536, 2560])
    p.add_argument("--threads", nargs="+", type=int, default=[1024, 512, 256])
    args = p.parse_args()

    import cupy as cp

    from genie_workers.engine.backends.cupy import CupyBackend
    from genie_workers.engine.backends.cupy.quant_consts import _X_NORM, Q8_THREADS

    backend = CupyBackend()
    print(f"{backend.dev.name}, family {backend.dev.family.name}; µs a launch, {LAUNCHES} dependent launches a graph")
    rng = np.random.default_rng(0)
    null = np.uint64(0)
    q8_add_normed = backend.dev.kernel_named("q8_add_normed")
    q8_input = backend.dev.kernel_named("q8_input")

    def norm_launch(x: Any, y: Any, yw: Any, w: Any, x_new: Any, x8: Any, cols: int, threads: int) -> None:
        args_ = (x, y, yw, null, x_new, np.float32(1e-6), null if w is None else w, np.int32(cols), x8)
        q8_add_normed((1,), (threads,), (*args_, np.int64(cols), np.int32(0)))

    def input_launch(x: Any, w: Any, x8: Any, cols: int, threads: int) -> None:  # q8_input's X_NORM of one row
        args_ = (x, null, w, null, np.float32(1e-6), np.int32(_X_NORM), np.int32(0), np.int32(cols), x8)
        q8_input((1,), (threads,), (*args_, np.int64(0), np.int32(0), null))

    def two_launches(x: Any, y: Any, yw: Any, w: Any, cols: int) -> None:  # what q8_add_normed replaced
        out = backend.add_normed(x[None], y[None], yw, 1e-6)  # the add, then the coding with the next norm
        backend.products._q8_input(out[0], cols, nw=w, eps=1e-6, mode=_X_NORM)

    def floor_launch(x: Any, x8: Any) -> None:  # q8_input coding one sub-block with one warp: the smallest launch
        args_ = (x, null, null, null, np.float32(0), np.int32(0), np.int32(0), np.int32(32), x8)
        q8_input((1,), (32,), (*args_, np.int64(0), np.int32(0), null))

    def us(launch: Callable[[], None]) -> str:
        def run() -> None:
            for _ in range(LAUNCHES):
                launch()

        return f"{replay_us(backend, run, LAUNCHES):.2f}"

    floor = partial(floor_launch, cp.asarray(rng.standard_normal(32, dtype=np.float32)), cp.empty(72, dtype=cp.int8))
    print(f"| launch | µs |\n|---|---|\n| q8_input, 32 values, 1 warp (the floor) | {us(floor)} |", flush=True)
    for cols in args.cols:
        x, y, yw, w = (cp.asarray(rng.standard_normal(cols, dtype=np.float32)) for _ in range(4))
        x_new = cp.empty(cols, dtype=cp.float32)
        x8 = cp.empty(2 * cols + cols // 4, dtype=cp.int8)
        for threads in args.threads:
            if cols > 8 * threads:  # QA_MAX values a thread
                continue
            for label, weight in (("normed", w), ("plain", None)):
                launch = partial(norm_launch, x, y, yw, weight, x_new, x8, cols, threads)
                print(f"| q8_add_normed {cols} cols, {threads} threads, codes {label} | {us(launch)} |", flush=True)
        for threads in args.threads:
            if cols <= 16 * threads:  # Q8_MAX values a thread
                launch = partial(input_launch, x, w, x8, cols, threads)
                print(f"| q8_input {cols} cols, {threads} threads, normed | {us(launch)} |", flush=True)
        two = partial(two_launches, x, y, yw, w, cols)
        print(f"| add_normed + q8_input {cols} cols ({Q8_THREADS} threads), two launches | {us(two)} |", flush=True)


if __name__ == "__main__":
    main()
