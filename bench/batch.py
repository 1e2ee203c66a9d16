"""Many streams at once (issue 17): aggregate decode speed at 1 / 2 / 4 / 8 / 16 streams, and time to
first token for short prompts, in-process, beside llama.cpp's batched numbers.

    python bench/batch.py [--models qwen3-4b qwen3-0.6b gemma4-e2b] [--kv int8 f16] [--streams 1 2 4 8 16]
                          [--prompt 128] [--gen 128] [--ttft 8 33 128 512] [--voice 7] [--backend auto] [--whole]
                          [--tune KNOB:VALUE[,KNOB:VALUE...]] [--launch-ahead auto|on|off] [--repeats 3] [--out DIR]
                          [--llama DIR/llama.json]

GPU models are the synthetic files of the exact shapes (bench/synthetic.py, written into --out); on a CPU
pass the real ones (`--models smollm2-135m gemma3-270m`). Each stream gets its own random prompt of
--prompt tokens, all are submitted together, prefilled, and then --gen greedy tokens each are decoded
together: the table gives the aggregate tokens/s of the steps in which all of them decode (from the step
after every prompt has given its first token to the one in which the first stream ends: the prompts are
admitted over several steps, so the first ones end first, and the steps after that run fewer streams; what
llama.cpp's `llama-batched-bench` reports as S_TG, where every stream decodes in every step), its ratio to
genie's one stream, and llama.cpp's figure with the ratio to it; the median of --repeats runs (their range
beside it), after an untimed run of 8 tokens that captures the steps of that many streams (else the first run
pays a capture, ~30 ms, inside its timed steps): the numbers of --llama (bench/llama_gpu.py, the same call),
else those in ../shared/ANCHORS.md measured on the same H200 (none for E2B there, none on a CPU). TTFT: median of 7 of
submit -> first token sampled, on an idle engine holding nothing of the prompt. --voice N: a voice request
(33-token prompt, 16 tokens) while N background streams decode: its TTFT (median of 5) against the same on an
idle engine, and the background streams' tok/s together while it runs against before it came. --tune: the
CuPy backend retuned to these CupyTuning fields (bench/gpu_variants.py's knobs, e.g. use_chains:0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# llama.cpp on the H200, 128-token prompts + 128 tokens each, aggregate decode tok/s by stream count
# (../shared/ANCHORS.md of 2026-12-03, llama-batched-bench, F16 KV); a llama.json of the same call replaces them
ANCHORS = {
    "qwen3-4b": {1: 317, 2: 561, 4: 871, 8: 1226, 16: 2479},
    "qwen3-0.6b": {1: 682, 2: 1194, 4: 2054, 8: 3391, 16: 4637},
}
TTFT_ANCHOR_MS = {("qwen3-4b", 33): 9.0}  # llama.cpp: pp33, 33 / 3 669 tok/s (../shared/ANCHORS.md; +-20-40 %)
REPEATS = 7


def load(  # type: ignore[no-untyped-def]
    model: str, kv: str, n_slots: int, backend: str, out: Path, n_ctx: int, ahead: bool | None = None
):
    from genie_common.engine_options import EngineOptions
    from genie_common.registry import MODELS
    from genie_workers.engine.engine import Engine

    path = model
    if model not in MODELS and not Path(model).exists():
        from synthetic import synthetic_file

        path = str(synthetic_file(model, out))
    options = EngineOptions(model=path, backend=backend, ctx=n_ctx, fp16_kv=kv == "f16", parallel=n_slots)
    return Engine(options, launch_ahead=ahead)


def random_prompt(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(300, vocab, n).tolist()  # no BOS: prompts share no prefix


def sync(engine) -> None:  # type: ignore[no-untyped-def]
    if engine.backend.name == "cupy":
        import cupy as cp

        cp.cuda.get_current_stream().synchronize()


def aggregate(  # type: ignore[no-untyped-def]
    engine, n: int, n_prompt: int, n_gen: int, rng: np.random.Generator, whole: bool = False
) -> float:
    """Decode tok/s of n streams together: the steps from the one after every prompt has given its first
    token until one stream ends (all n decode in each); `whole`: until the last ends (the measure before
    2026-12-02, which counts the tail of fewer streams too)."""
    from genie_workers.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)
    engine.kv.clear()
    vocab = engine.model.config.n_vocab
    seqs = [engine.sequence(random_prompt(rng, vocab, n_prompt), params) for _ in range(n)]
    for seq in seqs:
        engine.scheduler.submit(seq)
    sched = engine.scheduler
    while any(not s.generated for s in seqs):
        engine.step()
    sync(engine)
    t0, before = time.perf_counter(), sum(len(s.generated) for s in seqs)
    while all(len(s.generated) < n_gen for s in seqs) or (whole and not sched.idle):
        engine.step()
    sync(engine)
    rate = (sum(len(s.generated) for s in seqs) - before) / (time.perf_counter() - t0)
    while not sched.idle:
        engine.step()
    return rate


def ttft_ms(engine, n_prompt: int, rng: np.random.Generator) -> float:  # type: ignore[no-untyped-def]
    from genie_workers.engine.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    vocab = engine.model.config.n_vocab
    for _ in range(REPEATS + 1):  # the first compiles and captures
        engine.kv.clear()
        seq = engine.sequence(random_prompt(rng, vocab, n_prompt), params)
        engine.scheduler.submit(seq)
        while not seq.generated:
            engine.step()
        times.append((seq.t_first - seq.t_start) * 1000)
        while not engine.scheduler.idle:
            engine.step()
    return statistics.median(times[1:])


def voice_under_load(engine, n_bg: int, rng: np.random.Generator, n_prompt: int = 33) -> None:  # type: ignore[no-untyped-def]
    """Prints the voice request's TTFT idle and under n_bg background streams, and their rate before and
    while it runs (issue 17's acceptance 4: at most 2x, at least 50 %)."""
    from genie_workers.engine.engine import Completion
    from genie_workers.engine.sampling import SamplingParams

    sched, vocab = engine.scheduler, engine.model.config.n_vocab
    voice = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def step() -> list:  # type: ignore[type-arg]
        return [(seq, ev) for seq, ev in engine.step() if isinstance(ev, Completion)]

    def ask() -> tuple[float, float]:
        """A voice request to its end: its TTFT in ms, and the seconds it took."""
        seq = engine.sequence(random_prompt(rng, vocab, n_prompt), voice, priority="voice")
        t0 = time.perf_counter()
        sched.submit(seq)
        while not any(s is seq for s, _ in step()):
            pass
        return (seq.t_first - seq.t_start) * 1000, time.perf_counter() - t0

    engine.kv.clear()
    idle = statistics.median([ask()[0] for _ in range(6)][1:])  # the first compiles and captures
    stop = False
    long = SamplingParams(temperature=0, max_tokens=engine.n_ctx - 129, ignore_eos=True)
    bg = [engine.sequence(random_prompt(rng, vocab, 128), long, cancel=lambda: stop) for _ in range(n_bg)]
    for seq in bg:
        sched.submit(seq)
    while any(not s.generated for s in bg):
        step()

    def made() -> int:
        return sum(len(s.generated) for s in bg)

    sync(engine)
    t0, before = time.perf_counter(), made()
    for _ in range(32):
        step()
    sync(engine)
    rate_before = (made() - before) / (time.perf_counter() - t0)
    loaded, during, spent = [], 0, 0.0
    for _ in range(5):
        before = made()
        ttft, seconds = ask()
        loaded.append(ttft)
        during, spent = during + made() - before, spent + seconds
    rate_during = during / spent
    stop = True
    while not sched.idle:
        step()
    loaded_ms = statistics.median(loaded)
    print(f"\n| {n_prompt}-token voice request | TTFT ms (median of 5) | {n_bg} background streams, tok/s together |")
    print("|---|---|---|")
    print(f"| idle | {idle:.1f} | - |")
    print(
        f"| while they decode | {loaded_ms:.1f} ({loaded_ms / idle:.2f}x idle) | {rate_during:,.0f} while it runs, "
        f"{rate_before:,.0f} before ({rate_during / rate_before:.0%}) |",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-0.6b"])
    p.add_argument("--kv", nargs="+", default=["int8", "f16"])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--ttft", nargs="*", type=int, default=[8, 33, 128, 512])
    p.add_argument("--voice", type=int, default=0, help="background streams for the voice-under-load row (0: none)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--whole", action="store_true", help="time until the last stream ends, the tail included")
    p.add_argument("--tune", default="", help="CupyTuning fields for the CuPy backend, e.g. use_chains:0")
    p.add_argument(
        "--launch-ahead",
        choices=["auto", "on", "off"],
        default="auto",
        help="Engine(launch_ahead=...) (auto: on for a GPU backend)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs a stream count, the median reported")
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    p.add_argument("--llama", type=Path, help="llama.cpp's figures of this call (bench/llama_gpu.py's llama.json)")
    args = p.parse_args()
    anchors, ttft_anchors = ANCHORS, TTFT_ANCHOR_MS
    if args.llama:
        from llama_gpu import load as load_llama

        same_run = load_llama(args.llama)
        anchors = {m: {n: round(v) for n, v in r["s_tg"].items()} for m, r in same_run.items()}
        ttft_anchors = {(m, n): round(ms, 1) for m, r in same_run.items() for n, ms in r["ttft_ms"].items()}
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for model in args.models:
        for kv in args.kv:
            n_ctx = max(args.prompt + args.gen, max(args.ttft or [0]) + 8, 1024 if args.voice else 0)
            n_slots = max(*args.streams, args.voice + 1)
            ahead = {"auto": None, "on": True, "off": False}[args.launch_ahead]
            engine = load(model, kv, n_slots, args.backend, args.out, n_ctx, ahead)
            if args.tune:
                from gpu_variants import apply, parse_variant

                apply(engine.backend, parse_variant(f"tuned={args.tune}")[1])
                print(f"\ntuning: {engine.backend.tuning}")  # type: ignore[attr-defined]
            print(f"\n## {model}, {kv} KV, {engine.backend.device_name}, {args.prompt}-token prompts + {args.gen} each")
            head = "range | x one stream | llama.cpp tok/s | genie / llama.cpp"
            print(f"| streams | genie tok/s (median of {args.repeats}) | {head} |")
            print("|---|---|---|---|---|---|")
            one = None
            for n in args.streams:
                aggregate(engine, n, args.prompt, 8, rng)  # compiles and captures the steps of n streams
                runs = [aggregate(engine, n, args.prompt, args.gen, rng, args.whole) for _ in range(args.repeats)]
                tok_s = statistics.median(runs)
                one = one or (tok_s if n == 1 else None)
                ref = anchors.get(model, {}).get(n)
                ratio = f"{tok_s / one:.2f}" if one else "-"
                vs = f"{tok_s / ref:.2f}" if ref else "-"
                spread = f"{min(runs):,.0f}-{max(runs):,.0f}"
                print(f"| {n} | {tok_s:,.0f} | {spread} | {ratio} | {ref or '-'} | {vs} |", flush=True)
            if args.ttft:
                print("\n| prompt tokens | TTFT ms (median of 7) | llama.cpp ms |")
                print("|---|---|---|")
                for n_prompt in args.ttft:
                    ref = ttft_anchors.get((model, n_prompt))
                    print(f"| {n_prompt} | {ttft_ms(engine, n_prompt, rng):.1f} | {ref or '-'} |", flush=True)
            if args.voice:
                voice_under_load(engine, args.voice, rng)
            del engine


if __name__ == "__main__":
    main()
