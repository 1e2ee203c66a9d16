import numpy as np
import pytest

from genie_common.errors import RequestError
from genie_workers.engine.sampling import Sampler, SamplingParams, apply_repeat_penalty


def logits(seed: int = 0, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, n).astype(np.float32)


def draw(params: SamplingParams, x: np.ndarray, n: int = 50) -> list[int]:
    s = Sampler(params)
    return [s.sample(x, []) for _ in range(n)]


def test_greedy_is_argmax():
    x = logits()
    assert draw(SamplingParams(temperature=0), x, 3) == [int(np.argmax(x))] * 3


def test_same_seed_same_tokens_other_seed_other_tokens():
    x = logits()
    p = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    assert draw(p, x) == draw(p, x)
    assert draw(p, x) != draw(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=8), x)


def test_top_k_limits_candidates():
    x = logits()
    top3 = set(np.argsort(-x)[:3].tolist())
    got = set(draw(SamplingParams(temperature=5.0, top_k=3, top_p=1.0, min_p=0.0, seed=1), x, 300))
    assert got <= top3 and len(got) == 3


def test_top_p_keeps_smallest_prefix_reaching_p():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    got = set(draw(SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=2), x, 400))
    assert got == {0, 1}


def test_min_p_drops_tokens_below_fraction_of_best():
    x = np.log(np.array([0.6, 0.3, 0.07, 0.03], dtype=np.float32))
    got = set(draw(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1, seed=3), x, 400))
    assert got == {0, 1, 2}


def test_repeat_penalty_divides_positive_and_multiplies_negative():
    x = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    out = apply_repeat_penalty(x, [0, 1, 0], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert x.tolist() == [2.0, -2.0, 1.0]  # input untouched


def test_repeat_penalty_changes_greedy_choice():
    x = np.array([3.0, 2.5, 0.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))
    assert s.sample(x, []) == 0
    assert s.sample(x, [0]) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(top_k=-1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(min_p=2.0),
        dict(repeat_penalty=0.0),
        dict(max_tokens=-1),
        dict(seed=-5),
        dict(stop=("",)),
        dict(temperature=float("nan")),
    ],
)
def test_bad_values_are_request_errors(kwargs):
    with pytest.raises(RequestError):
        SamplingParams(**kwargs)


def test_the_engine_takes_exactly_the_sampling_fields_generate_declares():
    """GENERATE's sampling fields are declared once, in genie_protocol.messages.PARAMS (names, kinds, bounds): the
    worker builds SamplingParams from them by name, so the two must name the same fields."""
    from dataclasses import fields

    from genie_protocol.messages import PARAMS
    from genie_workers.engine.sampling import SamplingParams

    assert {f.name for f in fields(SamplingParams)} == set(PARAMS)
