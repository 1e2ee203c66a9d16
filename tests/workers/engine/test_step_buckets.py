"""Short prompt chunks padded to a captured step's size (Backend.step_buckets): the same answer as unpadded,
the pad never counted as held, and a chunk that would run past the context left unpadded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from genie_common.engine_options import EngineOptions
from genie_workers.engine.backends.cupy import cupy_available
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.engine import Engine
from genie_workers.engine.model import Model
from genie_workers.engine.sampling import SamplingParams
from testkit.tiny_models import write_tiny_model

ROOT = Path(__file__).parents[3]


class Padding(NumpyBackend):
    step_buckets = (16, 32)


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> tuple[Engine, Engine]:
    path = tmp_path_factory.mktemp("buckets") / "tiny.gguf"
    write_tiny_model("qwen3", path, seed=5)
    made = []
    for backend in (NumpyBackend(), Padding()):
        options = EngineOptions(model=str(path), ctx=48, prefill_chunk=32, parallel=1)
        made.append(Engine(options, Model.load(path, backend)))
    return made[0], made[1]


def logits_of(engine: Engine, ids: list[int]) -> np.ndarray:
    engine.kv.clear(0)
    return engine.backend.to_host(engine._run(0, ids, 0, slice(-1, None)))


@pytest.mark.parametrize("n", [2, 9, 16, 17, 31])
def test_a_padded_chunk_gives_the_unpadded_logits(engines: tuple[Engine, Engine], n: int) -> None:
    plain, padding = engines
    ids = [1, *np.random.default_rng(n).integers(3, 380, n - 1).tolist()]
    want, got = logits_of(plain, ids), logits_of(padding, ids)
    assert got.shape == want.shape == (1, plain.model.config.n_vocab)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())  # BLAS over more rows
    assert list(padding.kv.held(0)) == ids  # the pad's rows are past what the slot holds


def test_answers_and_the_next_turn_match_unpadded(engines: tuple[Engine, Engine]) -> None:
    """A 9-token prompt (padded to 16), its answer, then a longer turn reusing it (a 7-token chunk at 21)."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = [1, *np.random.default_rng(1).integers(3, 380, 8).tolist()]
    answers = []
    for engine in engines:
        engine.kv.clear(0)
        *_, done = engine.generate(first, params)
        *_, again = engine.generate(first + done.token_ids + [50, 51, 52, 53], params)
        assert again.cached_tokens == len(first) + len(done.token_ids) - 1
        answers.append((done.token_ids, again.token_ids))
    assert answers[0] == answers[1]


def test_no_padding_past_the_context(engines: tuple[Engine, Engine]) -> None:
    _, padding = engines
    assert padding._bucket(9, 0) == 16 and padding._bucket(16, 0) == 16 and padding._bucket(32, 0) == 32
    assert padding._bucket(9, 40) == 9  # 40 + 16 > 48: the chunk runs as it is
    assert padding._bucket(1, 0) == 1 and padding._bucket(33, 0) == 33  # a decode step; past prefill_chunk


@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and an NVIDIA GPU")
def test_cupy_replays_one_captured_step_for_every_short_prompt() -> None:
    """Prompts of 9, 13 and 16 tokens all run as the captured 16-token step (one capture, then replays with
    other ids, positions and logit rows), each within TF32's error of the logits CuPy gives the prompt unpadded
    and uncaptured. The reference is CuPy's own: NumPy's products code their inputs to 8 bits (numpy_backend.py)
    and the prefill GEMM does not, which alone moves this Q4_K_M model's logits by up to 4.8 % of their largest."""
    from genie_workers.engine.backends.cupy.backend import CupyBackend

    class Unpadded(CupyBackend):
        step_buckets = ()

    path = ROOT / "testkit/fixtures/tiny/llama-q4_k_m.gguf"
    options = EngineOptions(model=str(path), backend="cupy", ctx=128, prefill_chunk=64, parallel=1)
    gpu, plain = Engine(options), Engine(options, Model.load(str(path), Unpadded()))
    for n in (9, 13, 16):
        ids = [1, *np.random.default_rng(n).integers(3, 200, n - 1).tolist()]
        got, want = logits_of(gpu, ids), logits_of(plain, ids)
        assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()  # TF32's error, should the sizes' forms differ
    padded = [key for key in gpu._steps if isinstance(key, tuple) and "padded" in key]
    assert padded == [("step", 16, "padded", True)] and gpu._steps[padded[0]] is not False
    assert not [key for key in plain._steps if isinstance(key, tuple) and "padded" in key]
