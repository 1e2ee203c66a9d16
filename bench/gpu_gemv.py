"""One-token GEMV bandwidth on the GPU: the decode products of kernels/quant.cu (gemv1q: dp4a, weights in
flight in registers; gemv1m: on the tensor cores, weights streamed through shared memory by bulk copies) on
the Q4_K and Q6_K matrix shapes of Qwen3-4B, against a plain read of the same bytes, for the backend's knobs.

    python bench/gpu_gemv.py [--variants dp4a=use_mma:0 mma=use_mma:1 ...]

A variant is NAME=KNOB:VALUE[,...] as in gpu_variants.py: CupyTuning fields (use_mma, mma_threads,
mma_blocks_per_sm) and mma_stages, units (quant.cu's defines). gemv1q's rows a warp and its split over warps are
products.py's constants (GEMV1_ROWS, GEMV_BLOCKS_PER_SM, GEMV_SPLIT_WARPS): a variant of them is an edit of those.
Each matrix is cycled over enough copies (> 4x the L2) that every launch reads its weights from HBM, as a
decode step does. "alone": CUDA-event medians over 50 launches, each launched alone (launch latency and
ramp-up count); "graph": the launches over every copy captured as one CUDA graph with programmatic dependent
launch, as a decode step is, and replayed (each kernel's first weight loads overlap the one before). GB/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_variants import apply, parse_variant  # noqa: E402
from synthetic import _blocks  # noqa: E402

# the decode products of Qwen3-4B Q4_K_M: (label, type, rows, cols); gpu_rows.py times the same ones
SHAPES = [
    ("qk 5120x2560", Q.Q4_K, 5120, 2560),
    ("o 2560x4096", Q.Q4_K, 2560, 4096),
    ("gate_up 19456x2560", Q.Q4_K, 19456, 2560),
    ("down 2560x9728", Q.Q4_K, 2560, 9728),
    ("down 2560x9728", Q.Q6_K, 2560, 9728),
    ("v 1024x2560", Q.Q6_K, 1024, 2560),
    ("output 151936x2560", Q.Q6_K, 151936, 2560),
]

# Gemma 4 E2B's, for gpu_rows.py --model gemma4-e2b (bench/NOTES-gemma4.md §1.1: d 1 536, 8 heads of 256 / 512,
# FFN 6 144 and 12 288 in the 20 shared layers, per-layer inputs of 256): q / k / v of a sliding layer together, o
# of a global layer, and the down and PLE matrices, whose 1 536 rows are 96 tiles of 16 for the GPU's block slots
E2B_SHAPES = [
    ("qkv 2560x1536", Q.Q4_K, 2560, 1536),
    ("o 1536x2048", Q.Q4_K, 1536, 2048),
    ("o global 1536x4096", Q.Q4_K, 1536, 4096),
    ("gate_up 12288x1536", Q.Q4_K, 12288, 1536),
    ("gate_up shared 24576x1536", Q.Q4_K, 24576, 1536),
    ("down 1536x6144", Q.Q4_K, 1536, 6144),
    ("down shared 1536x12288", Q.Q4_K, 1536, 12288),
    ("down shared 1536x12288", Q.Q6_K, 1536, 12288),
    ("ple gate 256x1536", Q.Q4_K, 256, 1536),
    ("ple proj 1536x256", Q.Q4_K, 1536, 256),
    ("output 262144x1536", Q.Q6_K, 262144, 1536),
]

READ = r"""
extern "C" __global__ void read_all(const uint4* p, long long n, float* out) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = p[i];
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) out[0] = 1.f;
}
"""
DEFAULT_VARIANTS = ["dp4a=use_mma:0", "mma=use_mma:1", "m4s=mma_stages:4", "m512=mma_threads:512,mma_blocks_per_sm:1"]


def gb_per_s(launch: Callable[[Any], None], copies: list[Any], nbytes: int) -> float:
    """Bytes per second of `launch(weights)` cycling over `copies`, CUDA-event median of 50 launches."""
    import cupy as cp

    for i in range(5):
        launch(copies[i % len(copies)])
    times = []
    for i in range(50):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        launch(copies[i % len(copies)])
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return nbytes / statistics.median(times) / 1e9


def graph_gb_per_s(backend: Any, copies: list[Any], x8: Any, y: Any, nbytes: int) -> float:
    """Bytes per second of one product a copy, all of them captured as one graph (PDL), over 10 replays."""
    import cupy as cp

    captured = backend.steps._capture(lambda: [backend.products._gemv1q(w, x8, y) for w in copies])
    stream = cp.cuda.get_current_stream()
    captured.graph.launch(stream)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(10):
        captured.graph.launch(stream)
    b.record()
    b.synchronize()
    return 10 * len(copies) * nbytes / (cp.cuda.get_elapsed_time(a, b) * 1e-3) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    args = p.parse_args()

    import cupy as cp

    from genie_workers.engine.backends.cupy import CupyBackend, QuantWeight

    backend = CupyBackend()
    n_sm = backend.dev.n_sm
    read = cp.RawModule(code=READ).get_function("read_all")
    rng = np.random.default_rng(0)
    variants = [parse_variant(v) for v in args.variants]
    print("GB/s of one-token products launched alone")
    names = [f"{name} {mode}" for name, _ in variants for mode in ("alone", "graph")]
    print("| matrix | type | MB | read | " + " | ".join(names) + " |")
    print("|" + "---|" * (4 + len(names)), flush=True)
    dummy = cp.zeros(1, dtype=cp.float32)
    for label, qtype, rows, cols in SHAPES:
        block = _blocks(qtype, rows, cols, rng).reshape(-1)
        nbytes = block.nbytes
        n_copies = max(2, (4 * 50 * 2**20) // nbytes + 1)  # > 4x the L2
        copies = [QuantWeight(cp.asarray(block), qtype, rows, cols) for _ in range(n_copies)]
        x = cp.asarray(rng.standard_normal((1, cols), dtype=np.float32))
        x8 = backend.products._q8_input(x, cols)
        y = cp.empty(rows, dtype=cp.float32)
        read_bw = gb_per_s(
            lambda w, n=nbytes: read((4 * n_sm,), (512,), (w.data, np.int64(n // 16), dummy)), copies, nbytes
        )
        cells, ref = [], None
        for _, knobs in variants:
            apply(backend, knobs)
            bw = gb_per_s(lambda w, x8=x8, y=y: backend.products._gemv1q(w, x8, y), copies, nbytes)
            out = cp.asnumpy(y)
            ref = out if ref is None else ref
            diff = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30))
            cells.append(f"{bw:.0f}" + ("" if diff < 1e-5 else f" (!{diff:.0e})"))
            cells.append(f"{graph_gb_per_s(backend, copies, x8, y, nbytes):.0f}")
        print(f"| {label} | {qtype.name} | {nbytes / 1e6:.1f} | {read_bw:.0f} | {' | '.join(cells)} |", flush=True)
        del copies


if __name__ == "__main__":
    main()
