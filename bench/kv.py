"""Persistent KV: time to first token of a warm turn (history hydrated from disk) against a cold one, and
the store's save and hydrate throughput.

    python bench/kv.py [-m gemma3-270m] [--history 2000] [--new 30] [--backend numpy] [--fp16-kv]

A conversation of `--history` tokens (the Apache-2.0 text) is prefilled and saved to a fresh KV cache
directory; then, three times each, alternating: a cold turn (empty KV, the whole history + `--new` tokens
prefilled) and a warm turn (the slot emptied as after a restart, the history hydrated from disk, only the
new tokens prefilled), after one untimed run of each. Warm TTFT includes finding, mapping and checking
the file and loading it into the KV cache. Median of the runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from genie_common.engine_options import EngineOptions  # noqa: E402
from genie_kvstore.store import KVStore, Saved, StoreConfig  # noqa: E402
from genie_workers.engine.engine import Completion, Engine  # noqa: E402
from genie_workers.engine.sampling import SamplingParams  # noqa: E402
from genie_workers.kv_engine import engine_layout  # noqa: E402

TEXT = ROOT / "testkit/fixtures/text/apache-2.0.txt"
REPEATS = 5
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1)


def ttft_ms(engine: Engine, ids: list[int]) -> tuple[float, int]:
    for ev in engine.generate(ids, FIRST_TOKEN):
        if isinstance(ev, Completion):
            return ev.timings["ttft_ms"], ev.cached_tokens
    raise AssertionError("no completion")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gemma3-270m")
    p.add_argument("--history", type=int, default=2000)
    p.add_argument("--new", type=int, default=30)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--fp16-kv", action="store_true")
    args = p.parse_args()
    n_ctx = args.history + args.new + 16
    options = EngineOptions(model=args.model, backend=args.backend, ctx=n_ctx, fp16_kv=args.fp16_kv, parallel=1)
    engine = Engine(options)
    text_ids = engine.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_bos=True)
    if len(text_ids) < args.history + args.new:
        raise SystemExit(f"the bench text has {len(text_ids)} tokens, fewer than {args.history + args.new}")
    history, prompt = text_ids[: args.history], text_ids[: args.history + args.new]
    directory = Path(tempfile.mkdtemp(prefix="genie-kv-bench-"))
    store = KVStore(StoreConfig(directory, max_bytes=0), engine.model.fingerprint, engine_layout(engine))

    engine.kv.clear(0)
    ttft_ms(engine, history)  # the history's KV, as a finished turn leaves it
    engine.kv.clear(0)
    engine.kv.extend(0, history)  # what is saved: exactly the history (its last token's KV is written)
    saves = []
    for i in range(REPEATS):
        snap = engine.export_kv(0)
        t0 = time.perf_counter()
        saved = store.save(snap, conv_id=f"bench{i}")
        saves.append(time.perf_counter() - t0)
    if not isinstance(saved, Saved):
        raise SystemExit(f"the bench's save failed: {saved}")
    size = saved.bytes

    engine.kv.clear(0)
    ttft_ms(engine, prompt)  # warm-up of both paths (first launches, allocator, CUDA graphs): untimed
    engine.kv.clear(0)
    engine.kv.extend(0, history[:-1])
    ttft_ms(engine, prompt)
    cold, warm, reads, imports, firsts = [], [], [], [], []
    for i in range(REPEATS):
        engine.kv.clear(0)
        cold.append(ttft_ms(engine, prompt)[0])
        engine.kv.clear(0)  # as after a restart: nothing resident
        t0 = time.perf_counter()
        snap = store.hydrate(prompt, conv_id=f"bench{i}")  # find, map, check the checksum
        t1 = time.perf_counter()
        assert snap is not None and snap.n_tokens == args.history
        engine.import_kv(snap)  # into the KV cache (the device's, for CuPy)
        t2 = time.perf_counter()
        first, n_cached = ttft_ms(engine, prompt)
        assert n_cached == args.history, n_cached
        reads.append(t1 - t0)
        imports.append(t2 - t1)
        firsts.append(first)
        warm.append((t2 - t0) * 1000 + first)

    c, w = statistics.median(cold), statistics.median(warm)
    mb = size / 1e6
    print(
        f"{engine.model.name}, {engine.backend.device_name}, {engine.kv_dtype} KV, "
        f"history {args.history} + {args.new} new tokens, median of {REPEATS}\n"
    )
    print("| measure | value | target |")
    print("|---|---|---|")
    print(f"| cold TTFT (prefill {len(prompt)} tokens) | {c:.0f} ms | |")
    print(f"| warm TTFT (hydrate {args.history} + prefill {args.new}) | {w:.0f} ms | |")
    print(f"| warm / cold | {w / c:.3f} | ≤ 0.25 |")
    print(f"| entry size | {mb:.1f} MB | |")
    print(f"| save (write, fsync, rename) | {mb / statistics.median(saves):.0f} MB/s | |")
    read, imp = statistics.median(reads), statistics.median(imports)
    print(f"| hydrate: find, map and check | {read * 1000:.1f} ms ({mb / read:.0f} MB/s) | |")
    print(f"| hydrate: load into the KV cache | {imp * 1000:.1f} ms ({mb / imp:.0f} MB/s) | |")
    print(f"| warm: prefill {args.new} + first token | {statistics.median(firsts):.0f} ms | |")


if __name__ == "__main__":
    main()
