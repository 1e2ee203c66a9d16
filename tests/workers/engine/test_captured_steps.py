"""The engine's captured steps: those keyed by a batch's make-up are bounded, least recently used out first."""

from __future__ import annotations

from pathlib import Path

from workers.engine.captured_steps import CapturedSteps, shaped

from .test_batching import PaddingNumpy, model_path, on_backend, run_mixed


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
