"""One-token GEMV bandwidth on the GPU: the decode kernels of kernels/quant.cu on the Q4_K and Q6_K matrix
shapes of Qwen3-4B, against a plain read of the same bytes, for the kernel's tuning knobs.

    python bench/gpu_gemv.py

Each matrix is cycled over enough copies (> 4x the L2) that every launch reads its weights from HBM, as
a decode step does; times are CUDA-event medians over 50 launches. Prints GB/s per shape and variant.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import _blocks  # noqa: E402

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


def main() -> None:
    import cupy as cp
    from gguf import GGMLQuantizationType as Q

    from workers.engine.backends.cupy_backend import QUANT_SOURCES, kernel_module

    n_sm = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    read = cp.RawModule(code=READ).get_function("read_all")
    rng = np.random.default_rng(0)
    shapes = [
        ("qk 5120x2560", Q.Q4_K, 5120, 2560),
        ("o 2560x4096", Q.Q4_K, 2560, 4096),
        ("gate_up 19456x2560", Q.Q4_K, 19456, 2560),
        ("down 2560x9728", Q.Q4_K, 2560, 9728),
        ("down 2560x9728", Q.Q6_K, 2560, 9728),
        ("output 151936x2560", Q.Q6_K, 151936, 2560),
    ]
    variants = [(units, threads) for units in (2, 4, 8) for threads in (128, 256)]
    modules = {u: kernel_module(*QUANT_SOURCES, options=(f"-DOCTET_UNITS={u}",)) for u in (2, 4, 8)}
    print("GB/s (best rows per warp); u = OCTET_UNITS, t = threads per block")
    print("| matrix | type | MB | read | " + " | ".join(f"u{u} t{t}" for u, t in variants) + " |")
    print("|" + "---|" * (4 + len(variants)))
    dummy = cp.zeros(1, dtype=cp.float32)
    for label, qtype, rows, cols in shapes:
        block = _blocks(qtype, rows, cols, rng).reshape(-1)
        nbytes = block.nbytes
        copies = [cp.asarray(block) for _ in range(max(2, (4 * 50 * 2**20) // nbytes + 1))]  # > 4x the L2
        x = cp.asarray(rng.standard_normal(cols, dtype=np.float32))
        y = cp.empty(rows, dtype=cp.float32)
        read_bw = gb_per_s(lambda w, n=nbytes: read((4 * n_sm,), (512,), (w, np.int64(n // 16), dummy)), copies, nbytes)
        cells = []
        args = (x, y, np.int32(rows), np.int32(cols), np.int64(nbytes // rows))
        for units, threads in variants:
            kernel = modules[units].get_function("gemv1_q4_k" if qtype == Q.Q4_K else "gemv1_q6_k")
            best = (0.0, 0)
            for rpw in (1, 2, 4):
                grid = (-(-rows // (threads // 32 * rpw)),)
                launch = partial(_launch, kernel, grid, threads, args, np.int32(rpw), cols + cols // 4)
                best = max(best, (gb_per_s(launch, copies, nbytes), rpw))
            cells.append(f"{best[0]:.0f} ({best[1]})")
        print(f"| {label} | {qtype.name} | {nbytes / 1e6:.1f} | {read_bw:.0f} | " + " | ".join(cells) + " |")


def _launch(kernel: Any, grid: tuple[int], threads: int, args: tuple, rpw: Any, smem: int, w: Any) -> None:
    kernel(grid, (threads,), (w, *args, rpw), shared_mem=smem)


if __name__ == "__main__":
    main()
