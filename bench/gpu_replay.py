"""What each kernel family costs inside a replayed decode step: the step captured as a CUDA graph with
every kernel, then again with one family not launched at all, each graph replayed back to back and timed
with CUDA events.

    python bench/gpu_replay.py [--models qwen3-4b qwen3-0.6b] [--kv int8 f16] [--depth 1024] [--replays 200]

The graphs without a family compute garbage (its outputs are never written); only their time is read.
Prints µs a step per variant, and each family's share: the full step's time less the step without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from synthetic import SHAPES, synthetic_file  # noqa: E402

FAMILIES = ("q8_input", "attention_dec", "attention_gqa", "qkv_post", "gemv1m_q4_k", "gemv1m_q6_k")
FAMILIES += ("gemv1q_q4_k", "gemv1q_q6_k")


class Skipped:
    """A kernel not launched: calls do nothing; the shared-memory opt-in reads as granted."""

    max_dynamic_shared_size_bytes = 1 << 30

    def __call__(self, *args, **kwargs) -> None:
        pass

    def allow_smem(self, smem: int) -> None:
        pass


def skip(backend, family: str | None) -> None:
    """Kernels whose name starts with `family` become no-ops on this backend (None: none do)."""
    from genie_workers.engine.backends.cupy.chain import Chain
    from genie_workers.engine.backends.cupy.core import CupyDevice

    dev = backend.dev
    dev.kernels.clear()
    for attr in ("kernel_named", "op"):
        real = getattr(CupyDevice, attr)

        def pick(name: str, real=real):
            kernel = real(dev, name)
            return Skipped() if family and name.startswith(family) else kernel

        setattr(dev, attr, pick)
    # the 8.x chain launches gemv1_chainc / gemvn_chainc itself (cuLaunchKernel on the real kernel, whose occupancy
    # it also reads): it keeps the real kernels, and a skipped chain launches nothing
    chain = dev.chain
    chain._kernel = lambda n: CupyDevice.kernel_named(dev, "gemvn_chainc" if n else "gemv1_chainc")
    skipped = bool(family) and any(k.startswith(family) for k in ("gemv1_chainc", "gemvn_chainc"))
    chain._launch = (lambda *args: None) if skipped else Chain._launch.__get__(chain)


def replay_us(engine, pos: int, replays: int) -> float:
    """µs a replay of the captured one-token step at `pos` (captured now, then replayed `replays` times)."""
    engine._steps.clear()
    for _ in range(2):  # eager + capture, then one replay
        engine._run(0, [1000], pos, slice(-1, None))
        engine.kv.truncate(0, engine.kv.n_held(0) - 1)
    (step,) = [v for k, v in engine._steps.items() if k[1] == 1]
    return graph_ms(step, replays) * 1e3


def graph_ms(step, replays: int, warm: int = 10) -> float:  # type: ignore[no-untyped-def]
    """ms a replay of a captured step (bench/batch_profile.py times its steps with it too)."""
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    for _ in range(warm):
        step.graph.launch(stream=stream)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(replays):
        step.graph.launch(stream=stream)
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / replays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-0.6b"], choices=list(SHAPES))
    p.add_argument("--kv", nargs="+", default=["int8"], choices=["int8", "f16"])
    p.add_argument("--depth", type=int, default=1024)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--pdl", type=int, default=1, help="programmatic dependent launch in the graphs (0: off)")
    p.add_argument("--out", type=Path, default=Path("/tmp/genie-bench"))
    args = p.parse_args()

    import numpy as np

    from genie_common.engine_options import EngineOptions
    from genie_workers.engine.backends.cupy import CupyBackend, CupyTuning
    from genie_workers.engine.engine import Engine
    from genie_workers.engine.model import Model

    backend = CupyBackend(CupyTuning(use_pdl=bool(args.pdl)))
    args.out.mkdir(parents=True, exist_ok=True)
    print("| model | KV | variant | µs a step | family's share µs |")
    print("|---|---|---|---|---|")
    for name in args.models:
        path = synthetic_file(name, args.out)
        model = Model.load(path, backend)
        rng = np.random.default_rng(0)
        for kv in args.kv:
            engine = Engine(
                EngineOptions(model=str(path), ctx=args.depth + 64, fp16_kv=kv == "f16", prefill_chunk=512, parallel=1),
                model,
            )
            prompt = rng.integers(300, model.config.n_vocab, args.depth).tolist()
            for pos in range(0, args.depth, 512):
                engine._run(0, prompt[pos : pos + 512], pos, None)
            skip(backend, None)
            full = replay_us(engine, args.depth, args.replays)
            print(f"| {name} | {kv} | all kernels | {full:.0f} | |", flush=True)
            for family in FAMILIES:
                skip(backend, family)
                t = replay_us(engine, args.depth, args.replays)
                print(f"| {name} | {kv} | without {family} | {t:.0f} | {full - t:.0f} |", flush=True)
            skip(backend, None)
            del engine
        del model


if __name__ == "__main__":
    main()
