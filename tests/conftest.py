"""Shared fixtures: the two real models, loaded once per test session."""

from __future__ import annotations

import pytest

from workers.engine.engine import Engine, EngineConfig
from workers.engine.registry import resolve_model

REAL_MODELS = ("gemma3-270m", "smollm2-135m")


@pytest.fixture(scope="session")
def model_path():
    return lambda name: resolve_model(name, progress=lambda _: None)


_engines: dict[tuple[str, str, int], Engine] = {}


@pytest.fixture(scope="session")
def make_engine():
    """make_engine(model, kv_dtype="int8", n_ctx=1024) -> a cached Engine; tests must not depend on its
    KV contents from earlier tests (every generate call reuses a prefix only when tokens match)."""

    def get(model: str, kv_dtype: str = "int8", n_ctx: int = 1024) -> Engine:
        key = (model, kv_dtype, n_ctx)
        if key not in _engines:
            _engines[key] = Engine(EngineConfig(model=model, kv_dtype=kv_dtype, n_ctx=n_ctx))  # type: ignore[arg-type]
        return _engines[key]

    return get
