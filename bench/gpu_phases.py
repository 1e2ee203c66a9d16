"""Where the fused decode step's time goes, and how its knobs move it: on a synthetic Qwen3-shaped model
(bench/synthetic.py), each block of kernels/decode.cu records its clock at every phase boundary.

    python bench/gpu_phases.py [--models qwen3-4b qwen3-0.6b] [--kv int8] [--depth 1024]
                               [--variants 512:4:1 512:4:0 256:8:1 ...]

For each variant (threads per block : weight units in flight per octet : L2 prefetch on/off) prints the
GPU time of one step (CUDA events over 64 replays, no host work) and tok/s; for the first variant also a
table per phase type (medians over layers and steps): the input's preparation in every block, the
product (mean and slowest block) and the wait at the following barrier, in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import SHAPES, synthetic_file  # noqa: E402

# (phase, mark before its input, mark after the input, after the product, after the barrier), per layer
PHASES = [
    ("qkv", 0, 1, 2, 3),
    ("attention", 3, 3, 4, 5),
    ("o", 5, 6, 7, 8),
    ("gate_up", 8, 9, 10, 11),
    ("down", 11, 12, 13, 14),
]


def step_ms(engine, fused, pos: int, n: int = 64) -> float:
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    fused.run(5, pos)  # warm
    start.record()
    for i in range(n):
        fused.run(7 + i, pos)
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / n


def phase_table(fused, pos: int, n_layers: int, clock_mhz: float) -> list[str]:
    import cupy as cp

    from workers.engine.backends.cupy_decode import MARKS_PER_LAYER

    fused.record_marks(True)
    per_phase: dict[str, list[list[float]]] = {name: [[], [], [], []] for name, *_ in PHASES}
    out_rows: list[float] = []
    ns = []
    for i in range(8):
        fused.run(11 + i, pos)
        cp.cuda.Device().synchronize()
        raw = cp.asnumpy(fused.marks)
        n_marks = MARKS_PER_LAYER * n_layers + 2
        marks = raw[: fused.grid * n_marks].reshape(fused.grid, n_marks).astype(np.float64) / clock_mhz  # us
        ns.append((raw[-1] - raw[-2]) / 1000)
        for li in range(n_layers):
            m = marks[:, li * MARKS_PER_LAYER : (li + 1) * MARKS_PER_LAYER]
            for name, a, b, c, d in PHASES:
                prep, work, wait = m[:, b] - m[:, a], m[:, c] - m[:, b], m[:, d] - m[:, c]
                rows = per_phase[name]
                rows[0].append(float(np.median(prep)))
                rows[1].append(float(work.mean()))
                rows[2].append(float(work.max()))
                rows[3].append(float(np.median(wait)))
        tail = marks[:, n_layers * MARKS_PER_LAYER :]
        out_rows.append(float((tail[:, 1] - tail[:, 0]).max()))
    fused.record_marks(False)
    lines = [
        f"kernel {statistics.median(ns):.0f} us (globaltimer, block 0);"
        f" output layer {statistics.median(out_rows):.1f} us",
        "| phase | input us | product us (mean / slowest block) | barrier wait us | per layer us |",
        "|---|---|---|---|---|",
    ]
    for name, rows in per_phase.items():
        prep, mean, worst, wait = (statistics.median(r) for r in rows)
        lines.append(f"| {name} | {prep:.2f} | {mean:.2f} / {worst:.2f} | {wait:.2f} | {prep + worst + wait:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-0.6b"], choices=list(SHAPES))
    p.add_argument("--kv", default="int8", choices=["int8", "f16"])
    p.add_argument("--depth", type=int, default=1024)
    p.add_argument("--variants", nargs="+", default=["512:1:0", "512:2:0", "512:1:1"])
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import cupy as cp

    from workers.engine.backends.cupy_backend import CupyBackend
    from workers.engine.backends.cupy_decode import FusedDecode
    from workers.engine.engine import Engine, EngineConfig
    from workers.engine.model import Model

    backend = CupyBackend()
    clock_mhz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"] / 1000
    print(f"{backend.device_name}, SM clock {clock_mhz:.0f} MHz (for the clock64 marks)")
    for name in args.models:
        path = synthetic_file(name, args.out)
        model = Model.load(path, backend)
        config = EngineConfig(model=str(path), n_ctx=args.depth + 256, kv_dtype=args.kv, prefill_chunk=512)
        engine = Engine(config, model)
        rng = np.random.default_rng(0)
        prompt = rng.integers(300, model.config.n_vocab, args.depth).tolist()
        for pos in range(0, args.depth, 512):
            engine._run(0, prompt[pos : pos + 512], pos, None)
        print(f"\n{name}, {args.kv} KV, depth {args.depth}")
        print("| variant (threads:units:prefetch) | step us | tok/s |")
        print("|---|---|---|")
        tables = []
        for i, variant in enumerate(args.variants):
            threads, units, prefetch = (int(v) for v in variant.split(":"))
            backend.fused_threads, backend.fused_units, backend.fused_prefetch = threads, units, bool(prefetch)
            fused = FusedDecode(backend, model.config, model.weights, engine.kv, 0)
            ms = step_ms(engine, fused, args.depth)
            print(f"| {variant} | {ms * 1000:.0f} | {1000 / ms:.0f} |", flush=True)
            if i == 0:
                tables = phase_table(fused, args.depth, model.config.n_layers, clock_mhz)
        print("\n".join(tables))
        backend.fused_threads, backend.fused_units, backend.fused_prefetch = 512, 1, False
        del engine, model


if __name__ == "__main__":
    main()
