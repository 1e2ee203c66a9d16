"""Variants of the CuPy backend side by side on the synthetic Qwen3 shapes: the separate decode kernels
replayed as CUDA graphs and the prefill, with the backend's knobs set per variant (programmatic dependent
launch, the tensor-core products, the dp4a GEMV's weight units in flight, the attention kernels' warps).

    python bench/gpu_variants.py [--models qwen3-4b qwen3-0.6b] [--kv int8] [--depths 0 1024]
                                 [--variants base=use_pdl:0 pdl=use_pdl:1 ...] [--repeats 3]

A variant is NAME=KNOB:VALUE[,KNOB:VALUE...]; knobs are CupyTuning fields (use_pdl, use_mma, mma_threads,
mma_blocks_per_sm, ...), `units`
(OCTET_UNITS of quant.cu), `mma_stages` (MMA_STAGES: gemv1m's ring) and `pf_warps`
(PF_WARPS of attention.cu: warps a block of the prefill attention) and `dec_warps` (DEC_MAX_WARPS: the most warps
a block of the one-token attention), which recompile their module. Prints pp512
and tg128 tok/s per variant and depth beside llama.cpp's numbers (bench/gpu.py's anchors), and each
variant's logits over 8 replayed steps after a 512-token prompt against the first variant's (max |d|: 0
when the variant changes only scheduling).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu import ANCHORS  # noqa: E402
from synthetic import SHAPES, synthetic_file  # noqa: E402

DEFAULT_VARIANTS = ["pf4=pf_warps:4", "pf2=pf_warps:2", "pf1=pf_warps:1"]
# the short names a variant may use for CupyTuning's fields
ALIASES = {"units": "octet_units", "dec_warps": "dec_max_warps"}


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    name, _, knobs = text.partition("=")
    return name, {k: int(v) for k, v in (kv.split(":") for kv in knobs.split(",") if kv)}


def apply(backend, knobs: dict[str, int]) -> None:
    """The backend retuned to CupyTuning's defaults overridden by `knobs` (its fields, or their ALIASES); the
    kernel modules are built again only where a compiled size changed (CupyBackend.retune)."""
    from dataclasses import fields

    from genie_workers.engine.backends.cupy import CupyTuning

    types = {f.name: f.type for f in fields(CupyTuning)}
    changes = {f.name: getattr(CupyTuning(), f.name) for f in fields(CupyTuning)}
    for key, value in knobs.items():
        name = ALIASES.get(key, key)
        if name not in types:
            raise SystemExit(f"unknown knob {key!r} (CupyTuning: {', '.join(types)})")
        changes[name] = bool(value) if types[name] in (bool, "bool") else value
    backend.retune(**changes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-0.6b"], choices=list(SHAPES))
    p.add_argument("--kv", nargs="+", default=["int8"], choices=["int8", "f16"])
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1024])
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    args = p.parse_args()

    import cupy as cp
    import numpy as np

    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.backends.cupy import CupyBackend
    from genie_workers.engine.engine import Completion, Engine
    from genie_workers.engine.model import Model
    from genie_workers.engine.sampling import SamplingParams

    backend = CupyBackend()
    variants = [parse_variant(v) for v in args.variants]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        path = synthetic_file(name, args.out)
        model = Model.load(path, backend)
        vocab = model.config.n_vocab
        anchor = ANCHORS.get(name, {})
        for kv in args.kv:
            reference = None
            for label, knobs in variants:
                apply(backend, knobs)
                rng = np.random.default_rng(0)
                n_ctx = max(args.depths) + 1536  # the deepest run's 129 tokens, the check's 1 024 + 8
                options = EngineOptions(model=str(path), ctx=n_ctx, fp16_kv=kv == "f16", prefill_chunk=512, parallel=1)
                engine = Engine(options, model)

                def run(prompt: list[int], n_gen: int, engine: Engine = engine) -> Completion:
                    engine.kv.clear(0)
                    done = None
                    params = SamplingParams(temperature=0, max_tokens=n_gen, ignore_eos=True)
                    for ev in engine.generate(prompt, params):
                        done = ev
                    cp.cuda.Device().synchronize()
                    assert isinstance(done, Completion)
                    return done

                run(rng.integers(300, vocab, 512).tolist(), 4)  # compile, capture
                pp = []
                for _ in range(args.repeats):
                    prompt = rng.integers(300, vocab, 512).tolist()
                    t0 = time.perf_counter()
                    run(prompt, 0)
                    pp.append(512 / (time.perf_counter() - t0))
                pp512 = statistics.median(pp)
                pp_ratio = f" ({pp512 / anchor['pp512']:.2f}x)" if "pp512" in anchor else ""
                # logits of 8 replayed steps after two 512-token chunks (the second one replayed where
                # prefill chunks are captured), the same tokens for every variant
                engine.kv.clear(0)
                for pos in (0, 512):
                    engine._run(0, rng.integers(300, vocab, 512).tolist(), pos, None)
                steps = rng.integers(300, vocab, 8).tolist()
                logits = np.concatenate(
                    [cp.asnumpy(engine._run(0, [t], 1024 + i, slice(-1, None))) for i, t in enumerate(steps)]
                )
                if reference is None:
                    reference = logits
                diff = float(np.abs(logits - reference).max())
                cells = []
                for depth in args.depths:
                    runs = [run(rng.integers(300, vocab, depth + 1).tolist(), 128) for _ in range(args.repeats)]
                    tok_s = statistics.median(r.timings["decode_tok_s"] for r in runs)
                    ratio = f" ({tok_s / anchor[depth]:.2f}x)" if depth in anchor else ""
                    cells.append(f"{tok_s:.0f}{ratio}")
                free, total = cp.cuda.runtime.memGetInfo()
                graphs = backend.steps.capture_pool.total_bytes()  # every captured step's intermediates
                mem = f"{(total - free) / 2**30:.2f} ({graphs / 2**30:.2f})"
                rows.append(
                    f"| {name} | {kv} | {label} | {pp512:.0f}{pp_ratio} | {' | '.join(cells)} | {diff:.1e} | {mem} |"
                )
                print(rows[-1], flush=True)
                del engine
        del model
    depth_cols = " | ".join(f"tg128 @ {d}" for d in args.depths)
    print(f"\n| model | KV | variant | pp512 | {depth_cols} | max |d logits| | process GPU GiB (graphs' pools) |")
    print("|" + "---|" * (6 + len(args.depths)))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
