"""The memory plan against what the process really holds (issue 18): for each model, the plan printed at
load beside the memory the load and one full-context prompt took, in the same process.

    python bench/memory.py [--models smollm2-135m gemma3-270m qwen3-4b] [--ctx 2048|0] [--mem-budget-mb N]
                           [--backend numpy|cupy]

CPU: the growth of the resident set (VmRSS) from before the engine is built to after a prompt filling the
context (the KV pool is touched only where written, so the prompt writes all of it). GPU: the device memory
the process holds (cudaMemGetInfo) before and after. Both: the host's peak resident set while the model
loads (VmHWM, reset before the load, less the resident set before: on a Jetson host and GPU share the DRAM,
so a load that held the weights twice would not fit; on the GPU the kernels are compiled first, apart).
--ctx 0 sizes the context from the budget (--mem-budget-mb); then a prompt
one token past that context must be refused (a clear error) and the next request answered. A model that is
not installed (qwen3-4b) is a synthetic file of its shape (bench/synthetic.py). Each model runs in a child
process of its own, so one's memory does not count in another's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key}")


def rss() -> int:
    return status("VmRSS")


def hwm() -> int:
    """The resident set's peak since the last reset_hwm (VmHWM)."""
    return status("VmHWM")


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # Linux 4.0+: the peak resident set starts again from the current one


def child(model: str, ctx: int, backend: str, budget_mb: int) -> dict:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import numpy as np

    from genie_common.engine_options import EngineOptions
    from genie_common.errors import RequestError
    from genie_common.registry import MODELS
    from genie_workers.engine.engine import Engine
    from genie_workers.engine.sampling import SamplingParams

    if model not in MODELS and not Path(model).exists():
        from synthetic import synthetic_file

        model = str(synthetic_file(model, Path("/tmp/genie-bench")))
    size = Path(model).stat().st_size if Path(model).exists() else 0

    def used() -> int:
        if backend == "cupy":
            import cupy as cp

            free, total = cp.cuda.runtime.memGetInfo()
            return int(total - free)
        return rss()

    compile_peak = 0
    if backend == "cupy":
        import cupy as cp

        from genie_workers.engine.backends.cupy import CupyBackend

        cp.cuda.runtime.memGetInfo()  # the CUDA context exists before the baseline
        base = rss()
        CupyBackend()  # compiles the kernels into CuPy's disk cache (a first start's cost), so the load measures
        compile_peak = hwm() - base  # the load: the engine's backend then reads them from that cache
    reset_hwm()
    before, rss_before = used(), rss()
    engine = Engine(EngineOptions(model=model, backend=backend, ctx=ctx, parallel=1, mem_budget_mb=budget_mb))
    loaded = used()
    host_peak = hwm() - rss_before
    vocab = engine.model.config.n_vocab
    rng = np.random.default_rng(0)
    greedy = SamplingParams(temperature=0, max_tokens=1)
    too_long = ""
    if ctx == 0:  # one token past the context: refused, and the next request still answered
        try:
            list(engine.generate(rng.integers(10, min(vocab, 30000), engine.n_ctx + 1).tolist(), greedy))
            too_long = "answered (!)"
        except RequestError as e:
            too_long = f"refused: {e}"
    ids = rng.integers(10, min(vocab, 30000), engine.n_ctx - 1).tolist()
    *_, done = engine.generate(ids, greedy)
    full = used()
    p = engine.plan
    return {
        "file": size,
        "host_peak": host_peak,
        "compile_peak": compile_peak,
        "too_long": too_long,
        "model": model,
        "backend": engine.backend.name,
        "ctx": engine.n_ctx,
        "plan": p.as_dict(),
        "plan_total": p.total,
        "load": loaded - before,
        "full": full - before,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--mem-budget-mb", type=int, default=0)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2], int(args.child[3]))))
        return
    head = "| model | backend | ctx | plan GiB (weights + KV + scratch) | held after load | after a full prompt |"
    print(head + " plan / held | host peak at load (bound: 0.2 x file + 400 MB) |")
    print("|---|---|---|---|---|---|---|---|")
    refusals = []
    for model in args.models:
        cmd = [sys.executable, __file__, "--child", model, str(args.ctx), args.backend, str(args.mem_budget_mb)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        pl = r["plan"]
        parts = f"{r['plan_total'] / GIB:.3f} ({pl['weights_mb']} + {pl['kv_mb']} + {pl['scratch_mb']} MB)"
        bound = (0.2 * r["file"] + 400 * 2**20) / GIB
        print(
            f"| {model} | {r['backend']} | {r['ctx']} | {parts} | {r['load'] / GIB:.3f} | {r['full'] / GIB:.3f} | "
            f"{r['plan_total'] / r['full']:.2f} | {r['host_peak'] / GIB:.3f} ({bound:.3f}) |",
            flush=True,
        )
        if r["compile_peak"]:
            refusals.append(
                f"{model}: compiling the kernels (a first start, before the load) peaked at "
                f"{r['compile_peak'] / GIB:.3f} GiB over the process before it"
            )
        if r["too_long"]:
            refusals.append(f"{model}: a prompt of ctx + 1 tokens: {r['too_long']}; the next request answered")
    for line in refusals:
        print(line)


if __name__ == "__main__":
    main()
