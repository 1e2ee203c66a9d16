"""testkit/draws.py: the drawn inputs of a test, repeated from its seed."""

from __future__ import annotations

from testkit import draws


def test_a_seed_draws_the_same_generators_in_the_same_order(monkeypatch):
    monkeypatch.setenv(draws.ENV, "12345")
    assert draws.begin_test() == 12345
    assert draws.drawn_seed() is None  # nothing drawn yet: nothing to name
    first = [draws.drawn_rng().integers(1 << 40) for _ in range(3)]
    assert draws.drawn_seed() == 12345
    assert len(set(first)) == 3  # each call its own generator
    draws.begin_test()
    assert [draws.drawn_rng().integers(1 << 40) for _ in range(3)] == first


def test_without_the_variable_each_test_has_a_seed_of_its_own(monkeypatch):
    monkeypatch.delenv(draws.ENV, raising=False)
    seeds = {draws.begin_test() for _ in range(8)}
    assert len(seeds) == 8
