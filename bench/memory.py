"""The memory plan against what the process really holds (issue 18): for each model, the plan printed at
load beside the memory the load and one full-context prompt took, in the same process.

    python bench/memory.py [--models smollm2-135m gemma3-270m] [--ctx 2048] [--backend auto]

CPU: the growth of the resident set (VmRSS) from before the engine is built to after a prompt filling the
context (the KV pool is touched only where written, so the prompt writes all of it); the load's peak
(ru_maxrss) too. GPU: the device memory the process holds (cudaMemGetInfo) before and after. Each model runs
in a child process of its own, so one's memory does not count in another's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def rss() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def child(model: str, ctx: int, backend: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from workers.engine.engine import Engine, EngineConfig
    from workers.engine.sampling import SamplingParams

    def used() -> int:
        if backend == "cupy":
            import cupy as cp

            free, total = cp.cuda.runtime.memGetInfo()
            return int(total - free)
        return rss()

    if backend == "cupy":
        import cupy as cp

        cp.cuda.runtime.memGetInfo()  # the CUDA context exists before the baseline
    before = used()
    engine = Engine(EngineConfig(model=model, backend=backend, n_ctx=ctx, n_slots=1))
    loaded = used()
    vocab = engine.model.config.n_vocab
    ids = np.random.default_rng(0).integers(10, min(vocab, 30000), engine.n_ctx - 1).tolist()
    *_, done = engine.generate(ids, SamplingParams(temperature=0, max_tokens=1))
    full = used()
    p = engine.plan
    return {
        "model": model,
        "backend": engine.backend.name,
        "ctx": engine.n_ctx,
        "plan": p.as_dict(),
        "plan_total": p.total,
        "load": loaded - before,
        "full": full - before,
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before if backend != "cupy" else 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2])))
        return
    head = "| model | backend | ctx | plan GiB (weights + KV + scratch) | held after load | after a full prompt |"
    print(head + " plan / held | load peak |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        cmd = [sys.executable, __file__, "--child", model, str(args.ctx), args.backend]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        pl = r["plan"]
        parts = f"{r['plan_total'] / GIB:.3f} ({pl['weights_mb']} + {pl['kv_mb']} + {pl['scratch_mb']} MB)"
        peak = f"{r['peak'] / GIB:.3f}" if r["peak"] else "-"
        print(
            f"| {model} | {r['backend']} | {r['ctx']} | {parts} | {r['load'] / GIB:.3f} | {r['full'] / GIB:.3f} | "
            f"{r['plan_total'] / r['full']:.2f} | {peak} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
