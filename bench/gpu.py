"""GPU throughput on synthetic models with the exact shapes of Qwen3-0.6B and Qwen3-4B (Q4_K_M), beside
llama.cpp's numbers on the same H200 (../shared/ANCHORS.md, b11312, flash attention, F16 KV).

    python bench/gpu.py [--models qwen3-0.6b qwen3-4b] [--kv int8 f16] [--depths 0 1024 4096] [--out DIR]

Writes the synthetic GGUFs (bench/synthetic.py) into --out (default /tmp/genie-bench), then for each model
and KV type prints pp512 (prefill of 512 tokens) and tg128 (128 greedy tokens) after a prompt of each
depth, GPU memory in use, and the ratio to llama.cpp. bench/NOTES.md keeps each version's numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import SHAPES, write_synthetic  # noqa: E402

# llama.cpp b11312 on the H200, tokens/s (../shared/ANCHORS.md): pp512, tg at depth 0 / 1024 / 4096
ANCHORS = {
    "qwen3-4b": {"pp512": 13_548, 0: 320, 1024: 312, 4096: 289},
    "qwen3-0.6b": {"pp512": 36_826, 0: 690, 1024: 672, 4096: 626},
}


def bench_model(name: str, path: Path, kv: str, depths: list[int], repeats: int) -> dict:
    import cupy as cp

    from workers.engine.engine import Completion, Engine, EngineConfig
    from workers.engine.sampling import SamplingParams

    n_ctx = max(depths) + 512 + 256
    engine = Engine(EngineConfig(model=str(path), backend="cupy", n_ctx=n_ctx, kv_dtype=kv, prefill_chunk=512))
    vocab = engine.model.config.n_vocab
    rng = __import__("numpy").random.default_rng(0)

    def run(prompt: list[int], n_gen: int) -> Completion:
        engine.kv.resident[0] = []
        done = None
        for ev in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)):
            done = ev
        cp.cuda.Device().synchronize()
        assert isinstance(done, Completion)
        return done

    out: dict = {"load_ms": engine.model.load_ms}
    # warm-up: kernels compiled and loaded (cuBLAS loads a GEMM's kernels at its first use of a shape), pools filled
    run(list(rng.integers(300, vocab, 64)), 4)
    run(list(rng.integers(300, vocab, 512)), 4)
    pp = []
    for _ in range(repeats):
        prompt = list(rng.integers(300, vocab, 512))
        engine.kv.resident[0] = []
        t0 = time.perf_counter()
        for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=0)):
            pass
        cp.cuda.Device().synchronize()
        pp.append(512 / (time.perf_counter() - t0))
    out["pp512"] = statistics.median(pp)
    for depth in depths:
        tg = [run(list(rng.integers(300, vocab, depth + 1)), 128).timings.decode_tok_s for _ in range(repeats)]
        out[depth] = statistics.median(tg)
    pool = cp.get_default_memory_pool()
    out["gpu_mem_gib"] = pool.total_bytes() / 2**30
    out["kv_gib"] = engine.kv.config.bytes_per_token * n_ctx / 2**30
    out["gguf_gib"] = path.stat().st_size / 2**30
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--kv", nargs="+", default=["int8", "f16"], choices=["int8", "f16"])
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1024, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        path = args.out / f"{name}-q4_k_m.gguf"
        if not path.exists():
            t0 = time.perf_counter()
            write_synthetic(SHAPES[name], path)
            print(
                f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s", flush=True
            )
        for kv in args.kv:
            r = bench_model(name, path, kv, args.depths, args.repeats)
            a = ANCHORS[name]
            tg = " | ".join(f"{r[d]:.0f} ({r[d] / a[d]:.2f}x)" if d in a else f"{r[d]:.0f}" for d in args.depths)
            rows.append(
                f"| {name} | {kv} | {r['load_ms']:.0f} | {r['pp512']:.0f} ({r['pp512'] / a['pp512']:.2f}x) | {tg} "
                f"| {r['gpu_mem_gib']:.2f} (GGUF {r['gguf_gib']:.2f} + KV {r['kv_gib']:.2f}) |"
            )
            print(rows[-1], flush=True)
    depth_cols = " | ".join(f"tg128 @ {d}" for d in args.depths)
    print(f"\n| model | KV | load ms | pp512 tok/s (x llama.cpp) | {depth_cols} | GPU memory GiB |")
    print("|" + "---|" * (5 + len(args.depths)))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
