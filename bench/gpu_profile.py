"""Where the GPU time of one step goes, per kernel: a prefill of 512 tokens (--prompt) and one decode step of a
synthetic Qwen3-shaped model (bench/synthetic.py), each run eagerly (no CUDA graph) under Nsight Compute.

    python bench/gpu_profile.py [--model qwen3-4b] [--kv int8] [--depth 1024] [--prompt 512] [--out DIR]

--prompt 33: a voice prompt's pass (it runs as its step bucket, 40 tokens, as TTFT's does).

Runs itself under `ncu` (which must be on PATH), profiling only the two measured steps, and prints a
table per step: kernel, launches, total time, share. ncu serializes kernels and flushes caches before
each one (not with --warm), so the totals are above what a graph replay takes; the shares are what to
read. bench/NOTES.md keeps each version's breakdown.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import SHAPES, synthetic_file  # noqa: E402

MARK = "genie_step_marker"


def workload(path: Path, kv: str, depth: int, prompt: int) -> None:
    """The profiled process: warm up, then one prefill and one decode step between profiler start/stop."""
    import cupy as cp
    import numpy as np

    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Engine

    engine = Engine(
        EngineOptions(
            model=str(path), backend="cupy", ctx=depth + 1024, fp16_kv=kv == "f16", prefill_chunk=512, parallel=1
        )
    )
    engine.backend.retune(use_graphs=False)  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    vocab = engine.model.config.n_vocab
    history = rng.integers(300, vocab, depth + prompt + 1).tolist()
    for pos in range(0, depth, 512):  # fill the KV up to the depth (warms every kernel up too)
        engine._run(0, history[pos : min(pos + 512, depth)], pos, None)
    engine._run(0, [int(history[depth])], depth, slice(-1, None))
    marker = cp.ElementwiseKernel("float32 x", "float32 y", "y = x", MARK)  # splits the steps in ncu's list
    x = cp.zeros(1, dtype=cp.float32)
    marker(x, x)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    engine._run(0, history[depth : depth + prompt], depth, slice(-1, None))
    marker(x, x)
    engine._run(0, [7], depth + prompt, slice(-1, None))
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-4b", choices=list(SHAPES))
    p.add_argument("--kv", default="int8", choices=["int8", "f16"])
    p.add_argument("--depth", type=int, default=1024)
    p.add_argument("--prompt", type=int, default=512, help="tokens of the profiled prefill (at most 512)")
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    p.add_argument("--warm", action="store_true", help="no cache flush before each kernel (ncu --cache-control none)")
    p.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    path = args.out / f"{args.model}-q4_k_m.gguf"
    if args.workload:
        workload(path, args.kv, args.depth, args.prompt)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    synthetic_file(args.model, args.out)
    cmd = [
        "ncu",
        "--clock-control",
        "none",
        "--cache-control",
        "none" if args.warm else "all",
        "--profile-from-start",
        "off",
        "--metrics",
        "gpu__time_duration.sum",
        "--csv",
        "--print-units",
        "base",
        sys.executable,
        __file__,
        "--workload",
        f"--model={args.model}",
        f"--kv={args.kv}",
        f"--depth={args.depth}",
        f"--prompt={args.prompt}",
        f"--out={args.out}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    if run.returncode:
        sys.exit(f"ncu failed ({run.returncode}):\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}")
    lines = run.stdout.splitlines()  # the workload's output, then ncu's CSV: kernels in launch order
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    steps: list[list[tuple[str, float]]] = [[]]
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name = row["Kernel Name"].split("(")[0].split("<")[0]
        if name == MARK:
            steps.append([])
        else:
            steps[-1].append((name, float(row["Metric Value"].replace(",", "")) / 1000))  # ns -> us
    for label, kernels in zip((f"prefill of {args.prompt} tokens", "one decode step"), steps, strict=False):
        total = sum(t for _, t in kernels)
        by_name: dict[str, list[float]] = defaultdict(list)
        for name, t in kernels:
            by_name[name].append(t)
        print(f"\n{args.model}, {args.kv} KV, depth {args.depth}: {label}, {len(kernels)} launches, {total:.0f} us")
        print("| kernel | launches | time us | share |")
        print("|---|---|---|---|")
        for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
            print(f"| {name} | {len(ts)} | {sum(ts):.0f} | {100 * sum(ts) / total:.1f} % |")


if __name__ == "__main__":
    main()
