"""attention_decg's phases, a block at a time: `git apply bench/wip/dec-trace.patch` (DEC_TRACE points in
attention_dec), then on the GPU

    GENIE_CUDA_COMPAT=sm87 python3 bench/wip/dec_trace.py [qwen3-4b]

One eager decode step of the synthetic model at depths 0, 1024 and 4096 (three steps each, the last kept):
clock64 cycles of each phase as thread 0 saw it, and globaltimer spans of the blocks (bench/NOTES.md v30).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import synthetic_file  # noqa: E402

SLOTS = 10  # dec-trace.patch's dec_trace[512][10]: cycles 0-5 and 8, globaltimer 6 (start) and 7 (end)
PHASES = {
    "rows (entry -> dec_rows done)": (0, 1),
    "sync (queries)": (1, 2),
    "scan (warp 0)": (2, 3),
    "merge, parts written": (3, 4),
    "fences and count": (4, 5),
}


def main() -> None:
    import cupy as cp

    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.backends.cupy import core

    built = core.CupyDevice.options

    def traced(self, module, tuning):  # the ops module with the trace points compiled in
        options = built(self, module, tuning)
        return (*options, "-DDEC_TRACE") if module == "ops" else options

    core.CupyDevice.options = traced  # type: ignore[method-assign]
    from genie_workers.engine.engine import Engine

    model = sys.argv[1] if len(sys.argv) > 1 else "qwen3-4b"
    out = Path("/tmp/genie-bench")
    synthetic_file(model, out)
    opts = EngineOptions(model=str(out / f"{model}-q4_k_m.gguf"), backend="cupy", ctx=8192, prefill_chunk=512)
    engine = Engine(opts)
    engine.backend.retune(use_graphs=False)
    trace = engine.backend.dev.modules["ops"].get_global("dec_trace")
    history = np.random.default_rng(0).integers(300, engine.model.config.n_vocab, 8192).tolist()
    pos = 0
    for depth in (0, 1024, 4096):
        while pos < depth:
            n = min(512, depth - pos)
            engine._run(0, history[pos : pos + n], pos, None)
            pos += n
        for _ in range(3):
            trace.memset(0, 512 * SLOTS * 8)
            engine._run(0, [int(history[pos])], pos, slice(-1, None))
            cp.cuda.Device().synchronize()
        pos += 1
        t = cp.ndarray((512, SLOTS), dtype=cp.uint64, memptr=trace).get().astype(np.int64)
        t = t[t[:, 6] > 0]
        start = t[:, 6].min()
        work = t[t[:, 2] > 0]
        last = work[work[:, 8] > 0]
        print(
            f"\n{model} depth {depth}: {len(t)} blocks, {len(work)} with keys; kernel span "
            f"{(t[:, 7].max() - start) / 1e3:.2f} us"
        )
        for name, (a, b) in PHASES.items():
            d = work[:, b] - work[:, a]
            print(f"  {name:32s} cycles median {np.median(d):7.0f}  max {d.max():7.0f}")
        d = last[:, 8] - last[:, 5]
        print(f"  {'dec_head (the last blocks)':32s} cycles median {np.median(d):7.0f}  max {d.max():7.0f}")
        span = (work[:, 7] - work[:, 6]) / 1e3
        print(f"  block span us: median {np.median(span):.2f}, max {span.max():.2f}")


if __name__ == "__main__":
    main()
