"""Many streams through the daemon (issue 17, acceptance 5 and 6): N concurrent Ollama `/api/chat` streams
against one, on a daemon started here with `--parallel N`, driven by the real `ollama` client.

    python bench/daemon_streams.py [-m smollm2-135m|qwen3-4b|PATH] [--streams 1 4] [--tokens 64] [--backend auto]
                                   [--daemon-arg=--no-kv-store ...] [--detail]

A model that is neither one of genie's nor a file is a synthetic GGUF of that shape (bench/synthetic.py, written
into /tmp/genie-bench: the GPU machine has no real model), with a plain chat template.

Each stream asks its own question (greedy, `num_predict` tokens, the end-of-generation token ignored so
every answer is that long). The questions are first asked one at a time, then all together twice (the first
captures the steps of several streams, new shapes; the second is timed); the table
gives tokens/s together (all answers' tokens over the wall time from the first request to the last DONE,
prefill included) against one at a time, and whether each answer is the text it was alone. Then the same
questions, rendered by the same template, run together in this process on an engine of as many slots
(once alone each first, as the daemon's were), timed the same way: issue 17 asks the daemon for at least
0.9x that. --daemon-arg: more of the daemon's options (e.g. --no-kv-store: no saves or lookups of KV).
--detail: each stream of the timed passes, from the pass's start: its first piece and its end, and the
worker's prefill and decode times.

With llama-cpp-python installed (a dev-only reference, as in bench/cpu.py) and a model file it can read, the same
questions (the same prompt tokens: the engine's chat template) run one at a time on it, greedy, as many tokens
each, 2 threads, timed the same way (prefill included): issue 38 asks 4 streams through the daemon for 1.3x that.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Name three colours.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
    "What is two plus two?",
    "Name a fruit that is yellow.",
    "What do bees make?",
    "Describe rain in one sentence.",
    "What is the opposite of cold?",
    "Name a planet.",
    "What sound does a cat make?",
    "Spell the word house.",
    "What colour is grass?",
    "Name a musical instrument.",
    "What day comes after Monday?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(model: str, parallel: int, backend: str, tmp: Path, more: list[str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "genie_daemon", "-m", model, "--backend", backend, "--parallel", str(parallel), *more]
    cmd += ["--socket-dir", str(tmp / "run"), "--kv-cache-dir", str(tmp / "kv"), "--http-port", str(port)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # and the caller's (wheels)
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115 (the daemon's, closed with the process)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path})
    return proc, port


TIMES: list[str] = []  # --detail: a line a stream of the timed pass


async def ask(client, model: str, question: str, tokens: int, t0: float = 0.0) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """The answer and its token count; with t0 (the pass's start), a line for TIMES: when its first piece and
    its end reached this client, and the worker's own prefill and decode times (DONE's timings)."""
    text, count, first = "", 0, None
    options = {"temperature": 0, "num_predict": tokens, "ignore_eos": True}
    stream = await client.chat(
        model=model, messages=[{"role": "user", "content": question}], stream=True, options=options
    )
    async for part in stream:
        first = first or time.perf_counter()
        text += part.message.content or ""
        if part.done:
            count = part.eval_count or 0
            if t0:
                prefill_ms, decode_ms = (part.prompt_eval_duration or 0) / 1e6, (part.eval_duration or 0) / 1e6
                TIMES.append(
                    f"first piece {(first - t0) * 1e3:6.1f} ms, done {(time.perf_counter() - t0) * 1e3:6.1f} ms; "
                    f"worker: prefill {prefill_ms:5.1f} ms, decode {decode_ms:6.1f} ms "
                    f"({count / max(1e-9, decode_ms / 1e3):.0f} tok/s)"
                )
    return text, count


async def run(port: int, n: int, tokens: int) -> tuple[list[str], float]:
    import ollama

    client = ollama.AsyncClient(host=f"http://127.0.0.1:{port}", timeout=600)
    deadline = time.monotonic() + 180
    while True:  # the worker loads the model on start: the first request waits for it
        try:
            model = (await client.list()).models[0].model or ""  # the name the daemon serves the model by
            await ask(client, model, "Hi", 1)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)
    questions = QUESTIONS[:n]
    alone, t_alone, n_alone = [], 0.0, 0
    for q in questions:
        t0 = time.perf_counter()
        text, count = await ask(client, model, q, tokens)
        t_alone += time.perf_counter() - t0
        alone.append(text)
        n_alone += count
    # twice, the second timed: the first captures the steps that several streams make (their shapes are new)
    await asyncio.gather(*(ask(client, model, q, tokens) for q in questions))
    t0 = time.perf_counter()
    together = await asyncio.gather(*(ask(client, model, q, tokens, t0) for q in questions))
    t_together = time.perf_counter() - t0
    n_together = sum(c for _, c in together)
    same = sum(a == t for a, (t, _) in zip(alone, together, strict=True))
    rate_alone, rate_together = n_alone / t_alone, n_together / t_together
    print(
        f"| {n} | {rate_alone:.1f} | {rate_together:.1f} | {rate_together / rate_alone:.2f} | {same} of {n} |",
        end="",
        flush=True,
    )
    return [t for t, _ in together], rate_together


def llama_one_at_a_time(model: str, prompts: list[list[int]], tokens: int) -> tuple[str, float] | None:
    """llama-cpp-python's tokens/s over these prompts one at a time (greedy, `tokens` each, prefill included), and
    its name; None without it or without a model file it reads."""
    try:
        import llama_cpp
        import numpy as np

        from genie_common.registry import resolve_model

        path = resolve_model(model)
    except Exception:  # not installed, or the model is not a file it can take: no reference, said by the caller
        return None
    n_ctx = max(len(ids) for ids in prompts) + tokens + 8
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, n_threads_batch=2, verbose=False
    )
    llm.reset()
    llm.eval(prompts[0][:8])  # its first call's set-up, outside the timing (the daemon's was too)
    t0 = time.perf_counter()
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        for i in range(tokens):  # greedy, the end-of-generation token ignored as the daemon's answers do
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if i + 1 < tokens:
                llm.eval([token])
    return f"llama-cpp-python {llama_cpp.__version__}", len(prompts) * tokens / (time.perf_counter() - t0)


def in_process(model: str, n: int, tokens: int, backend: str) -> tuple[float, list[str], list[str], list[list[int]]]:
    """The questions together on an engine in this process: tokens/s from the first submit to the last
    completion (the second time, as through the daemon), the texts, and the prompts' token ids."""
    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.engine import Completion, Engine
    from genie_workers.engine.sampling import SamplingParams

    engine = Engine(EngineOptions(model=model, backend=backend, parallel=n))
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    prompts = [engine.fit_chat([{"role": "user", "content": q}], tokens).ids for q in QUESTIONS[:n]]
    for ids in prompts:  # once alone each: compiles and captures, as the daemon's one-at-a-time pass did
        list(engine.generate(ids, params))
    for _ in range(2):
        lines: list[str] = []
        seqs = [engine.sequence(ids, params) for ids in prompts]
        texts = {seq: "" for seq in seqs}
        made = 0
        t0 = time.perf_counter()
        for seq in seqs:
            engine.scheduler.submit(seq)
        while not engine.scheduler.idle:
            for seq, ev in engine.step():
                if isinstance(ev, Completion):  # its text is the whole answer
                    texts[seq] = ev.text
                    made += ev.completion_tokens
                    t = ev.timings
                    lines.append(
                        f"first token {(seq.t_first - t0) * 1e3:6.1f} ms, done {(time.perf_counter() - t0) * 1e3:6.1f}"
                        f" ms; prefill {t['prefill_ms']:5.1f} ms, decode {t['decode_ms']:6.1f} ms"
                        f" ({t['decode_tok_s']:.0f} tok/s)"
                    )
        rate = made / (time.perf_counter() - t0)
    del engine
    return rate, [texts[s] for s in seqs], lines, prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="smollm2-135m")
    p.add_argument("--streams", nargs="+", type=int, default=[4])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--backend", default="auto")
    p.add_argument("--daemon-arg", action="append", default=[], help="another option for the daemon (repeatable)")
    p.add_argument("--detail", action="store_true", help="each stream's times, through the daemon and in process")
    args = p.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from genie_common.registry import MODELS

    model = args.model
    if model not in MODELS and not Path(model).exists():
        from synthetic import synthetic_file

        out = Path("/tmp/genie-bench")
        out.mkdir(parents=True, exist_ok=True)
        model = str(synthetic_file(model, out))
    more = " ".join(args.daemon_arg)
    print(f"## {args.model} through the daemon {more}, {args.tokens} tokens an answer, /api/chat (ollama client)")
    print(
        "| streams | one at a time tok/s | together tok/s | together / one at a time | same text as alone |"
        " in process together tok/s | daemon / in process | same text as in process |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rates, prompts = {}, []
    for n in args.streams:
        with tempfile.TemporaryDirectory() as d:
            proc, port = start(model, n, args.backend, Path(d), args.daemon_arg)
            try:
                texts, rate = asyncio.run(run(port, n, args.tokens))
            except BaseException:
                print((Path(d) / "daemon.log").read_text()[-3000:], file=sys.stderr)  # why, before it goes
                raise
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        local, local_texts, local_lines, prompts = in_process(model, n, args.tokens, args.backend)
        rates[n] = rate
        same = sum(a == b for a, b in zip(texts, local_texts, strict=True))
        print(f" {local:.1f} | {rate / local:.2f} | {same} of {n} |", flush=True)
        if args.detail:
            print("\nthrough the daemon:\n" + "\n".join(sorted(TIMES)))
            print("in process:\n" + "\n".join(sorted(local_lines)), flush=True)
            TIMES.clear()
    reference = llama_one_at_a_time(model, prompts, args.tokens)
    if reference is None:
        print("\n(no llama-cpp-python reference: not installed, or no model file it reads)")
        return
    name, ref = reference
    ratios = ", ".join(f"{n} streams {r / ref:.2f}x" for n, r in rates.items())
    print(f"\n{name}, {len(prompts)} questions one at a time (prefill included): {ref:.1f} tok/s")
    print(f"through the daemon together against it: {ratios}")


if __name__ == "__main__":
    main()
