"""Shared fixtures: the two real models, loaded once per test session and shared by engines."""

from __future__ import annotations

import pytest

from genie_common.engine_options import EngineOptions
from genie_common.registry import resolve_model
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.engine import Engine
from genie_workers.engine.model import Model
from testkit import draws

_models: dict[str, Model] = {}
_engines: dict[tuple[str, str, int], Engine] = {}


def load_model(name: str) -> Model:
    if name not in _models:
        _models[name] = Model.load(resolve_model(name, progress=lambda _: None), NumpyBackend())
    return _models[name]


@pytest.fixture(scope="session")
def make_engine():
    """make_engine(model, kv_dtype="int8", n_ctx=1024) -> an Engine cached for the session, its weights
    shared with every other engine of the same model. Tests must not rely on what earlier tests left in
    its KV: generate reuses a prefix only where the tokens match."""

    def get(model: str, kv_dtype: str = "int8", n_ctx: int = 1024) -> Engine:
        key = (model, kv_dtype, n_ctx)
        if key not in _engines:
            options = EngineOptions(model=model, ctx=n_ctx, parallel=1)
            _engines[key] = Engine(options, model=load_model(model), kv_dtype=kv_dtype)  # type: ignore[arg-type]
        return _engines[key]

    return get


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each test's drawn_rng() generators from a seed of its own (testkit/draws.py), set before its fixtures."""
    draws.begin_test()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that drew its inputs names the seed that draws them again."""
    report = (yield).get_result()
    seed = draws.drawn_seed()
    if report.failed and seed is not None:
        report.sections.append(("drawn inputs", f"{draws.ENV}={seed} draws this test's inputs again"))
