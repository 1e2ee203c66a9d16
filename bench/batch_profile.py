"""Where a step of several streams goes (issue 17): for each stream count, the wall time of a scheduler step
as the engine runs it (launching ahead where the backend does: what bench/batch.py's aggregate divides by),
the same timed with the GPU's work waited for before each sampling (no pass overlaps the host's work), the
GPU time of the replayed captured step, the sampling's time, the rest of the host's (of the timed step), and
what each kernel family costs inside the replayed step (the step captured
again with that family not launched: bench/gpu_replay.py's method; those graphs compute garbage, only their
time is read).

    python bench/batch_profile.py [--model qwen3-4b] [--kv int8] [--streams 1 4 8 16] [--steps 40] [--host N]

--host N: also the host's side of the steps as the engine runs them, under cProfile (its N costliest functions).

Streams get 128-token prompts and decode together; the steps timed are decode-only steps of all of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch import load, random_prompt, sync  # noqa: E402
from gpu_replay import graph_ms, skip  # noqa: E402

FAMILIES = ("gemvn", "gemv1m", "q8_input", "attention_dec", "add_rms_norm", "rms_norm", "dequant", "qkv_post")
# the 8.x chains, the dp4a products, and what a Gemma 4 step runs beside them (its generic attention, the GELU gate,
# prepare_q's RoPE)
FAMILIES += ("gemv1_chainc", "gemv1q", "attention_gqa", "gated_act", "rope")
FAMILIES += ("add_normed", "gated_pair", "q8_add_normed")  # a Gemma layer's post-norms, its per-layer input
WARM_STEPS = 3


def replay_ms(step) -> float:  # type: ignore[no-untyped-def]
    return graph_ms(step, 50, warm=5)


def captured_step(engine, slots: list[int]):  # type: ignore[no-untyped-def]
    """One decode step of these slots run directly (eager, then captured), its K/V rows taken back; the
    captured step."""
    from genie_workers.engine.batch import Segment

    engine._steps.clear()
    for _ in range(2):
        if len(slots) == 1:
            pos = engine.kv.n_held(slots[0])
            engine._run(slots[0], [1000], pos, slice(-1, None))
        else:
            segs = [Segment(s, engine.kv.n_held(s), (1000,), True) for s in slots]
            engine.run_step(segs, None)
        for s in slots:
            engine.kv.truncate(s, engine.kv.n_held(s) - 1)
    (step,) = [v for v in engine._steps.values() if v is not False]
    return step


def profile(engine, n: int, n_steps: int, rng: np.random.Generator, host_top: int = 0) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from genie_workers.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=WARM_STEPS + 3 * n_steps + 1, ignore_eos=True)
    engine.kv.clear()
    vocab = engine.model.config.n_vocab
    seqs = [engine.sequence(random_prompt(rng, vocab, 128), params) for _ in range(n)]
    sched = engine.scheduler
    for seq in seqs:
        sched.submit(seq)
    while any(not s.generated for s in seqs):
        engine.step()
    for _ in range(WARM_STEPS):
        engine.step()
    sync(engine)
    sampling = [0.0]
    real, real_ahead = engine.sample_rows, engine.greedy_ahead

    def timed(logits, rows):  # type: ignore[no-untyped-def]
        sync(engine)  # the step's GPU work done: what follows is the sampling's own
        t = time.perf_counter()
        out = real(logits, rows)
        sampling[0] += time.perf_counter() - t
        return out

    def timed_ahead(logits, rows):  # type: ignore[no-untyped-def]
        # a pass chained on the device (scheduler.py): the tokens read before the next pass is launched
        sync(engine)
        t = time.perf_counter()
        out = real_ahead(logits, rows)
        out.tokens()
        sampling[0] += time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    for _ in range(n_steps):
        engine.step()
    sync(engine)
    free = (time.perf_counter() - t0) / n_steps * 1000
    if host_top:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n_steps):
            engine.step()
        sync(engine)
        prof.disable()
        print(f"### {n} streams: the host's {n_steps} steps under cProfile, by own time")
        pstats.Stats(prof).sort_stats("tottime").print_stats(host_top)
    engine.sample_rows, engine.greedy_ahead = timed, timed_ahead
    slots = [s.slot for s in seqs]
    t0 = time.perf_counter()
    for _ in range(n_steps):
        engine.step()
    sync(engine)
    wall = (time.perf_counter() - t0) / n_steps * 1000
    del engine.sample_rows, engine.greedy_ahead
    while not sched.idle:
        engine.step()
    gpu = replay_ms(captured_step(engine, slots))
    row = {"free": free, "wall": wall, "gpu": gpu, "sample": sampling[0] / n_steps * 1000}
    for family in FAMILIES:
        skip(engine.backend, family)
        try:
            row[family] = gpu - replay_ms(captured_step(engine, slots))
        finally:
            skip(engine.backend, None)
    engine._steps.clear()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--kv", default="int8")
    p.add_argument("--streams", nargs="+", type=int, default=[1, 4, 8, 16])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    p.add_argument("--host", type=int, default=0, metavar="N", help="also the host's N costliest functions (cProfile)")
    args = p.parse_args()
    engine = load(args.model, args.kv, max(args.streams), "cupy", args.out, n_ctx=1024)
    rng = np.random.default_rng(0)
    head = ["streams", "tok/s", "ms a step", "timed: ms a step", "GPU (replay)", "sampling", "other host", *FAMILIES]
    rows = []
    for n in args.streams:
        r = profile(engine, n, args.steps, rng, args.host)
        other = r["wall"] - r["gpu"] - r["sample"]
        cells = [str(n), f"{n / r['free'] * 1000:.0f}", f"{r['free']:.2f}", f"{r['wall']:.2f}", f"{r['gpu']:.2f}"]
        cells += [f"{r['sample']:.2f}", f"{other:.2f}", *(f"{r[f]:.2f}" for f in FAMILIES)]
        rows.append("| " + " | ".join(cells) + " |")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
