"""The engine's captured steps: those keyed by a batch's make-up are bounded, least recently used out first; and
what they read is sized for the engine's largest step before the first is captured, so none goes stale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from genie_common.engine_options import EngineOptions
from genie_workers.engine.backends.cupy import cupy_available
from genie_workers.engine.captured_steps import CapturedSteps, shaped
from genie_workers.engine.engine import Engine

from .test_batching import PaddingNumpy, greedy, model_path, on_backend, prompt, run_mixed


def mixed(i: int) -> tuple:
    return ("mixed", ((1, True), (8 * (i + 1), False)))


def test_the_keys_of_a_batchs_make_up_are_shaped_and_the_others_not() -> None:
    assert shaped(mixed(0)) and shaped(("decode", (0, 2, 3)))
    assert not shaped(("decode", 4)) and not shaped(("step", 16, "padded", True)) and not shaped(("step", 1, None))


def test_the_least_recently_used_shaped_step_goes_first_and_the_others_stay() -> None:
    steps = CapturedSteps(most_shaped=3)
    steps[("decode", 2)] = "decode 2"
    steps[("step", 16, "padded", True)] = "prompt 16"
    for i in range(3):
        steps[mixed(i)] = i
    assert steps.get(mixed(0)) == 0  # used again: now the most recent
    steps[("decode", (0, 1))] = "slots 0 1"  # a fourth shaped step: mixed(1) is the oldest
    assert mixed(1) not in steps and steps.evicted == 1
    assert [k for k in steps if shaped(k)] == [mixed(2), mixed(0), ("decode", (0, 1))]
    for i in range(10, 20):
        steps[mixed(i)] = i
    assert len([k for k in steps if shaped(k)]) == 3 and steps.evicted == 11
    assert steps[("decode", 2)] == "decode 2" and steps[("step", 16, "padded", True)] == "prompt 16"


class CapturingNumpy(PaddingNumpy):
    """Keeps a token for every capturable step, as a GPU keeps a graph."""

    def forward_step(self, steps, key, run, batch, capturable):  # type: ignore[no-untyped-def]
        out = super().forward_step(steps, key, run, batch, capturable)
        if capturable and steps.get(key) is None:
            steps[key] = object()
        return out


def test_an_engine_keeps_at_most_its_bound_of_mixed_steps(tmp_path: Path) -> None:
    backend = CapturingNumpy()
    engine = on_backend(model_path(tmp_path, "llama"), backend)
    assert isinstance(engine._steps, CapturedSteps)
    engine._steps.most_shaped = 2
    run_mixed(engine)
    made = {key for key, capturable in backend.keys if capturable and shaped(key)}  # NumPy: decode steps by slots
    assert len(made) > 2 and any(key[0] == "mixed" for key in made)  # more shapes than the bound came
    assert len([k for k in engine._steps if shaped(k)]) == 2 and engine._steps.evicted >= len(made) - 2


class ReservingNumpy(PaddingNumpy):
    """Records what the engine reserved, and each step's rows and segments."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: list[tuple[int, int, int]] = []
        self.rows: list[int] = []
        self.segments: list[int] = []

    def reserve_steps(self, max_tokens: int, max_segments: int, n_ctx: int) -> None:
        super().reserve_steps(max_tokens, max_segments, n_ctx)
        self.reserved.append((max_tokens, max_segments, n_ctx))

    def stage_inputs(self, ids: np.ndarray, pos0: int, slot: int = 0):  # type: ignore[no-untyped-def]
        self.rows.append(len(ids))
        return super().stage_inputs(ids, pos0, slot)

    def stage_batch(self, batch):  # type: ignore[no-untyped-def]
        self.segments.append(len(batch.segments))
        return super().stage_batch(batch)


def test_an_engine_reserves_its_largest_step_and_its_steps_stay_within_it(tmp_path: Path) -> None:
    """Engine tells its backend once, before any step: a budget of 32 prompt tokens, each chunk padded to its
    bucket (16 at least), over 4 slots; then streams that join mid-way, and 4 short prompts at once (each padded
    from 3 to 16 tokens), run no step of more rows or segments."""
    backend = ReservingNumpy()
    engine = on_backend(model_path(tmp_path, "llama"), backend)  # chunks of 32, 4 slots, 160 positions
    assert backend.reserved == [(2 * 32 + 16 * 4, 4, 160)]
    run_mixed(engine)
    for i in range(4):
        engine.scheduler.submit(engine.sequence(prompt(10 + i, 3), greedy(2)))
    while not engine.scheduler.idle:
        engine.step()
    assert max(backend.segments) == 4 and 4 * 16 in backend.rows  # the four padded chunks in one step
    assert max(backend.rows) <= backend.reserved[0][0]


@pytest.mark.skipif(not cupy_available(), reason="needs a GPU")
def test_larger_steps_after_the_first_leave_every_captured_step_current(tmp_path: Path) -> None:
    """On the GPU, steps of more streams and longer chunks than any before (streams joining mid-way, then a
    60-token prompt: 16 groups of four rows in the n-token products) replace no buffer a captured step reads:
    the steps captured first stay current (a replaced buffer used to make every one of them stale, so a burst of
    requests through the daemon paid an eager pass and a capture for a prompt it had captured before)."""
    path = model_path(tmp_path, "llama-q4_k_m")
    engine = Engine(EngineOptions(model=str(path), backend="cupy", ctx=160, prefill_chunk=64, parallel=4))
    gpu = engine.backend
    list(engine.generate(prompt(1, 5), greedy(3)))  # a chunk padded to 8 tokens and decode steps, captured
    first = {k: v for k, v in engine._steps.items() if v not in (None, False)}
    assert first, engine._steps
    version = gpu.dev.buffers.version  # type: ignore[attr-defined]
    run_mixed(engine)
    list(engine.generate(prompt(2, 60), greedy(2)))
    assert gpu.dev.buffers.version == version  # type: ignore[attr-defined]
    assert all(engine._steps.get(k) is v and v.version == version for k, v in first.items())
