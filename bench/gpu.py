"""GPU throughput on synthetic models with the exact shapes of Qwen3-0.6B, Qwen3-4B and Gemma 4 E2B
(Q4_K_M), beside llama.cpp's numbers on the same H200 (../shared/ANCHORS.md, 2026-12-03, flash attention, F16
KV; none for E2B yet, so its row has no ratio).

    python bench/gpu.py [--models qwen3-0.6b qwen3-4b gemma4-e2b] [--kv int8 f16] [--depths 0 1024 4096]
                        [--repeats 3] [--out DIR] [--llama DIR/llama.json] [--tune KNOB:VALUE[,...]]

Writes the synthetic GGUFs (bench/synthetic.py) into --out (default /tmp/genie-bench), then for each model
and KV type prints pp512 (prefill of 512 tokens) and tg128 (128 greedy tokens, decode steps replayed as
CUDA graphs) after a prompt of each depth, the ratio to llama.cpp (--llama: bench/llama_gpu.py's figures of the
same call, for every model it ran; else ANCHORS below), and the GPU memory the process holds.
bench/NOTES.md keeps each version's numbers (the fused one-launch decode step's among them, v7-v10: it left
the product, slower than these separate kernels at depth).
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

from synthetic import SHAPES, synthetic_file  # noqa: E402

# llama.cpp on the H200, tokens/s (../shared/ANCHORS.md of 2026-12-03, the tree in llama-cpp-python 0.3.36's sdist):
# pp512, tg at depth 0 / 1024 / 4096; a llama.json of the same call (--llama) replaces them
ANCHORS = {
    "qwen3-4b": {"pp512": 13_651, 0: 338, 1024: 329, 4096: 301},
    "qwen3-0.6b": {"pp512": 35_399, 0: 754, 1024: 728, 4096: 642},
}


def bench_model(model, path: Path, kv: str, depths: list[int], repeats: int) -> dict:
    import cupy as cp

    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Completion, Engine
    from genie_workers.engine.sampling import SamplingParams

    n_ctx = max(depths) + 512 + 256
    backend = model.backend
    vocab = model.config.n_vocab
    rng = __import__("numpy").random.default_rng(0)
    out: dict = {"load_ms": model.load_ms}

    def run(engine: Engine, prompt: list[int], n_gen: int) -> Completion:
        engine.kv.clear(0)
        done = None
        for ev in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)):
            done = ev
        cp.cuda.Device().synchronize()
        assert isinstance(done, Completion)
        return done

    engine = Engine(
        EngineOptions(model=str(path), ctx=n_ctx, fp16_kv=kv == "f16", prefill_chunk=512, parallel=1), model
    )
    # warm-up: kernels compiled and loaded (cuBLAS loads a GEMM's kernels at its first use of a shape)
    run(engine, list(rng.integers(300, vocab, 64)), 4)
    run(engine, list(rng.integers(300, vocab, 512)), 4)
    pp = []
    for _ in range(repeats):
        prompt = list(rng.integers(300, vocab, 512))
        engine.kv.clear(0)
        t0 = time.perf_counter()
        for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=0)):
            pass
        cp.cuda.Device().synchronize()
        pp.append(512 / (time.perf_counter() - t0))
    out["pp512"] = statistics.median(pp)
    tg = {}
    for depth in depths:
        runs = [run(engine, list(rng.integers(300, vocab, depth + 1)), 128) for _ in range(repeats)]
        tg[depth] = statistics.median(r.timings["decode_tok_s"] for r in runs)
    out["tg"] = tg
    out["kv_gib"] = engine.kv.config.bytes_per_token * n_ctx / 2**30
    out["pool_gib"] = cp.get_default_memory_pool().used_bytes() / 2**30  # arrays in use
    out["graphs_gib"] = backend.steps.capture_pool.total_bytes() / 2**30  # the captured steps' memory
    free, total = cp.cuda.runtime.memGetInfo()
    out["gpu_mem_gib"] = (total - free) / 2**30  # all the device memory the process holds
    del engine
    out["gguf_gib"] = path.stat().st_size / 2**30
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--kv", nargs="+", default=["int8", "f16"], choices=["int8", "f16"])
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1024, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    p.add_argument("--llama", type=Path, help="llama.cpp's figures of this call (bench/llama_gpu.py's llama.json)")
    p.add_argument("--tune", default="", help="CupyTuning fields for the CuPy backend, e.g. prefill_gemm:1")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    anchors = ANCHORS
    if args.llama:
        from llama_gpu import load as load_llama

        anchors = {m: {"pp512": r["pp512"], **r["tg"]} for m, r in load_llama(args.llama).items()}
    from genie_workers.engine.backends.cupy import CupyBackend
    from genie_workers.engine.model import Model

    backend = CupyBackend()
    if args.tune:
        from gpu_variants import apply, parse_variant

        apply(backend, parse_variant(f"tuned={args.tune}")[1])
        print(f"tuning: {backend.tuning}")
    rows = []
    for name in args.models:
        path = synthetic_file(name, args.out)
        model = Model.load(path, backend)
        for kv in args.kv:
            r = bench_model(model, path, kv, args.depths, args.repeats)
            a = anchors.get(name, {})
            tg = " | ".join(
                f"{r['tg'][d]:.0f} ({r['tg'][d] / a[d]:.2f}x)" if d in a else f"{r['tg'][d]:.0f}" for d in args.depths
            )
            pp = f"{r['pp512']:.0f}" + (f" ({r['pp512'] / a['pp512']:.2f}x)" if "pp512" in a else "")
            mem = (
                f"{r['pool_gib']:.2f} + {r['graphs_gib']:.2f} / {r['gpu_mem_gib']:.2f}"
                f" (GGUF {r['gguf_gib']:.2f} + KV {r['kv_gib']:.2f})"
            )
            rows.append(f"| {name} | {kv} | {r['load_ms']:.0f} | {pp} | {tg} | {mem} |")
            print(rows[-1], flush=True)
        del model
    depth_cols = " | ".join(f"tg128 @ {d}" for d in args.depths)
    print(f"\n| model | KV | load ms | pp512 tok/s (x llama.cpp) | {depth_cols} | GPU GiB: arrays + graphs / process |")
    print("|" + "---|" * (5 + len(args.depths)))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
