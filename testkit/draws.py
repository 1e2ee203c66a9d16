"""Random inputs a failed test can draw again. Tests that draw new inputs every run (more of the input space over
time) take `drawn_rng()` where they took `np.random.default_rng()`: each test's generators come from one seed of
its own, which a failure's report names (tests/conftest.py), and `GENIE_TEST_SEED=<that seed>` draws them again."""

from __future__ import annotations

import os
import secrets

import numpy as np

ENV = "GENIE_TEST_SEED"

_seed: int | None = None
_calls = 0


def begin_test() -> int:
    """A new test: its seed (GENIE_TEST_SEED's, else a fresh one), its generators counted from the first."""
    global _seed, _calls
    _seed = int(os.environ[ENV]) if os.environ.get(ENV) else secrets.randbits(63)
    _calls = 0
    return _seed


def drawn_rng() -> np.random.Generator:
    """The test's next generator: its k-th call gets the seed's k-th, so a test's draws repeat in the same order."""
    global _calls
    seed = begin_test() if _seed is None else _seed  # None: outside a test (a script importing a test's helpers)
    rng = np.random.default_rng([seed, _calls])
    _calls += 1
    return rng


def drawn_seed() -> int | None:
    """The seed of the test now running, where it has drawn; None where it has not."""
    return _seed if _calls else None
