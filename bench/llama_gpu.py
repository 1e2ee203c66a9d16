"""llama.cpp on the same GPU and the same files, in the same call as genie's bench: llama-bench (prefill of 33
and 512 tokens, 128 tokens of decode after a prompt of each depth) and llama-batched-bench (S_TG: 128-token
prompts, then every stream decodes in every step) on the synthetic GGUFs bench/synthetic.py writes.

    python bench/llama_gpu.py [--models qwen3-4b qwen3-0.6b] [--bin .llama/build/bin] [--out DIR]
    # then: python bench/gpu.py --llama DIR/llama.json ...; python bench/batch.py --llama DIR/llama.json ...

The binaries come from ../shared/tools/llama-cpp-gpu.sh (`fetch` here, `build` on the GPU machine in the same
device call). Flash attention on, F16 KV (llama.cpp's default), all layers on the GPU. Prints a table and writes
DIR/llama.json, which gpu.py and batch.py read for their ratio columns in place of ../shared/ANCHORS.md's
figures: model -> {"pp33", "pp512", "tg": {depth: tok/s}, "s_tg": {streams: tok/s}, "ttft_ms": {33: ms}}.
TTFT as llama.cpp has it for a 33-token prompt: its pp33 time (the prompt's pass, which gives the last token's
logits, as genie's TTFT is its prompt's pass; until 2026-12-05 a decode step was added to it as well).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import SHAPES, synthetic_file  # noqa: E402

PROMPTS = (33, 512)


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """cmd run to its end; a failed run is the bench's error, with its last lines."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{tail}")
    return done


def single(binary: Path, gguf: Path, depths: list[int], repeats: int) -> dict:
    """llama-bench: pp33 and pp512 at depth 0, tg128 after each depth (tok/s)."""
    common = [str(binary), "-m", str(gguf), "-ngl", "99", "-fa", "1", "-r", str(repeats), "-o", "json"]
    pp = json.loads(run([*common, "-p", ",".join(map(str, PROMPTS)), "-n", "0"], 1800).stdout)
    tg = json.loads(run([*common, "-p", "0", "-n", "128", "-d", ",".join(map(str, depths))], 1800).stdout)
    out: dict = {f"pp{r['n_prompt']}": r["avg_ts"] for r in pp if r["n_gen"] == 0}
    out["tg"] = {r["n_depth"]: r["avg_ts"] for r in tg if r["n_prompt"] == 0}
    return out


def batched(binary: Path, gguf: Path, streams: list[int], prompt: int, gen: int) -> dict[int, float]:
    """llama-batched-bench: S_TG a stream count (every stream decodes in every step)."""
    n_ctx = max(streams) * (prompt + gen)
    done = run(
        [
            str(binary),
            "-m",
            str(gguf),
            "-ngl",
            "99",
            "-fa",
            "on",
            "-c",
            str(n_ctx),
            "-npp",
            str(prompt),
            "-ntg",
            str(gen),
            "-npl",
            ",".join(map(str, streams)),
            "--output-format",
            "jsonl",
        ],
        1800,
    )
    lines = (done.stdout + "\n" + done.stderr).splitlines()  # its LOG lines: stdout in some builds, stderr in others
    rows = [json.loads(line) for line in lines if line.startswith("{") and '"speed_tg"' in line]
    if not rows:
        raise SystemExit(f"llama-batched-bench printed no results:\n{done.stdout[-2000:]}")
    return {r["pl"]: r["speed_tg"] for r in rows}


def table(results: dict) -> str:
    depths = sorted({d for r in results.values() for d in r["tg"]})
    counts = sorted({n for r in results.values() for n in r["s_tg"]})
    head = ["model", "pp33", "pp512", *(f"tg128 @ {d}" for d in depths), *(f"S_TG {n}" for n in counts), "TTFT 33"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, r in results.items():
        cells = [model, f"{r['pp33']:.0f}", f"{r['pp512']:.0f}"]
        cells += [f"{r['tg'][d]:.0f}" if d in r["tg"] else "-" for d in depths]
        cells += [f"{r['s_tg'][n]:.0f}" if n in r["s_tg"] else "-" for n in counts]
        cells.append(f"{r['ttft_ms'][33]:.1f} ms")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-0.6b"], choices=list(SHAPES))
    p.add_argument("--bin", type=Path, default=ROOT / ".llama" / "build" / "bin")
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1024, 4096])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    p.add_argument("--file", type=Path, help="a GGUF of your own instead of the synthetic models (named by its stem)")
    args = p.parse_args()
    if args.file and not args.file.is_file():
        p.error(f"--file {args.file}: no such file")
    if 0 not in args.depths:
        p.error("--depths needs 0: TTFT takes a decode step at depth 0")
    for tool in ("llama-bench", "llama-batched-bench"):
        if not (args.bin / tool).is_file():
            p.error(f"no {args.bin / tool}: ../shared/tools/llama-cpp-gpu.sh build (or --bin)")
    results: dict = {}
    files = {args.file.stem: args.file} if args.file else {m: synthetic_file(m, args.out) for m in args.models}
    for model, gguf in files.items():
        r = single(args.bin / "llama-bench", gguf, args.depths, args.repeats)
        r["s_tg"] = batched(args.bin / "llama-batched-bench", gguf, args.streams, 128, 128)
        r["ttft_ms"] = {33: 1000 * 33 / r["pp33"]}
        results[model] = r
        print(f"{model}: {json.dumps(r)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llama.json").write_text(json.dumps(results, indent=1))
    print("\n" + table(results))
    print(f"\nwrote {args.out / 'llama.json'}")


def load(path: Path) -> dict:
    """llama.json as main writes it, its depth and stream keys ints again (JSON keeps them as strings)."""
    results = json.loads(path.read_text())
    for r in results.values():
        for key in ("tg", "s_tg", "ttft_ms"):
            r[key] = {int(k): v for k, v in r[key].items()}
    return results


if __name__ == "__main__":
    main()
