"""CPU throughput of genie beside llama-cpp-python (when installed), both models, same prompt.

    python bench/cpu.py [--models gemma3-270m smollm2-135m] [--prompt-tokens 512] [--gen-tokens 64] [--load N]

Each engine runs in its own child process (so peak RSS is its own), prefills the same prompt of
`--prompt-tokens` tokens and decodes `--gen-tokens` greedy tokens, three times; the table shows the
median. llama-cpp-python is a dev-only reference (never a dependency): without it, only genie's
column is printed. `--load N` runs every engine twice, idle and beside N processes that each spin
one core (a busy machine: the voice pipeline's speech models, a browser), and prints both with the
ratio loaded / idle.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT / "testkit/fixtures/text/apache-2.0.txt"
REPEATS = 3


def prompt_tokens(tokenizer_encode, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The first n tokens of the bench text, repeated as often as n needs (a 2 750-token prompt, as long as Home
    Assistant's entity list, is about 1.3 times the text)."""
    text = TEXT.read_text(encoding="utf-8")
    ids = tokenizer_encode(text)
    copies = 1
    while len(ids) < n:
        copies += 1
        ids = tokenizer_encode("\n\n".join([text] * copies))
    return ids[:n]


def child_genie(model: str, n_prompt: int, n_gen: int) -> dict:
    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Completion, Engine
    from genie_workers.engine.sampling import SamplingParams

    engine = Engine(EngineOptions(model=model, backend="numpy", ctx=n_prompt + n_gen + 8, parallel=1))
    ids = prompt_tokens(lambda t: engine.tokenizer.encode(t, add_bos=True), n_prompt)
    prefill, decode = [], []
    for _ in range(REPEATS):
        engine.kv.clear(0)  # cold: no prefix reuse between repeats
        done = None
        for ev in engine.generate(ids, SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)):
            done = ev
        assert isinstance(done, Completion)
        prefill.append(done.timings["prefill_tok_s"])
        decode.append(done.timings["decode_tok_s"])
    return {"load_ms": engine.model.load_ms, "prefill": prefill, "decode": decode}


def child_llama(model: str, n_prompt: int, n_gen: int) -> dict:
    import llama_cpp
    import numpy as np

    from genie_common.registry import resolve_model

    t0 = time.perf_counter()
    n_ctx = n_prompt + n_gen + 8  # n_batch = n_ctx: llama-cpp-python keeps n_batch rows of logits
    llm = llama_cpp.Llama(
        model_path=str(resolve_model(model)), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, n_threads_batch=2, verbose=False
    )
    load_ms = (time.perf_counter() - t0) * 1000
    ids = prompt_tokens(
        lambda t: (
            [llm.token_bos()] * bool(llm.metadata.get("tokenizer.ggml.add_bos_token") == "true")
            + llm.tokenize(t.encode(), add_bos=False)
        ),
        n_prompt,
    )
    prefill, decode = [], []
    for _ in range(REPEATS):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        for _ in range(n_gen - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t2 = time.perf_counter()
        prefill.append(n_prompt / (t1 - t0))
        decode.append((n_gen - 1) / (t2 - t1))
    return {"load_ms": load_ms, "prefill": prefill, "decode": decode}


def spinners(n: int) -> list[subprocess.Popen]:
    """`n` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run_child(engine: str, model: str, args: argparse.Namespace, load: int = 0) -> dict | None:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        engine,
        "--models",
        model,
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--gen-tokens",
        str(args.gen_tokens),
    ]
    busy = spinners(load)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    if proc.returncode != 0:
        print(f"{engine} on {model} failed:\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--load", type=int, default=0, help="also run beside this many processes spinning a core each")
    p.add_argument("--child", choices=["genie", "llama"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = child_genie if args.child == "genie" else child_llama
        out = fn(args.models[0], args.prompt_tokens, args.gen_tokens)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    try:
        import llama_cpp

        reference = f"llama-cpp-python {llama_cpp.__version__}"
    except ImportError:
        reference = None
    print(
        f"CPU bench: {os.cpu_count()} cores, prompt {args.prompt_tokens} tok, {args.gen_tokens} generated, "
        f"median of {REPEATS}; reference: {reference or 'not installed'}\n"
    )
    cols = ["model", "engine", "busy cores", "load ms", "prefill tok/s", "decode tok/s", "peak RSS MB"]
    cols += ["prefill / decode vs ref", "prefill / decode vs idle"]
    rows = []
    engines = ["genie", "llama"] if reference else ["genie"]
    for model in args.models:
        idle: dict[str, tuple[float, float]] = {}  # engine -> its idle medians
        for load in sorted({0, args.load}):
            results = {engine: run_child(engine, model, args, load) for engine in engines}
            ref = results.get("llama")
            for engine, r in results.items():
                if r is None:
                    continue
                prefill, decode = statistics.median(r["prefill"]), statistics.median(r["decode"])
                vs_ref = vs_idle = "-"
                if ref is not None and engine == "genie":
                    vs_ref = (
                        f"{prefill / statistics.median(ref['prefill']):.2f}x / "
                        f"{decode / statistics.median(ref['decode']):.2f}x"
                    )
                if load == 0:
                    idle[engine] = (prefill, decode)
                elif engine in idle:
                    vs_idle = f"{prefill / idle[engine][0]:.2f}x / {decode / idle[engine][1]:.2f}x"
                name = "genie (numpy)" if engine == "genie" else str(reference)
                row = [model, name, str(load), f"{r['load_ms']:.0f}", f"{prefill:.1f}", f"{decode:.1f}"]
                rows.append([*row, f"{r['peak_rss_mb']:.0f}", vs_ref, vs_idle])
    if not rows:
        raise SystemExit("every engine failed; see the errors above")
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
