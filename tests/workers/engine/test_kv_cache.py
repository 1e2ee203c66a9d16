"""What a KV pool's slots hold, as the KVCache alone keeps it (the engine, the scheduler and the KV link ask it)."""

from __future__ import annotations

import numpy as np
import pytest

from genie_common.kv_types import KVCacheConfig
from genie_workers.engine.kv_cache import KVCache


@pytest.fixture
def kv() -> KVCache:
    return KVCache(KVCacheConfig(1, 1, 4, 4, n_ctx=16, n_slots=3, dtype="f16"), np)


def test_a_slot_holds_what_passes_wrote_and_keeps_a_prefix_when_cut(kv):
    kv.extend(1, [5, 6, 7])
    kv.extend(1, np.asarray([8], dtype=np.int64))  # a step's ids as the engine has them
    assert kv.held(1) == (5, 6, 7, 8) and kv.n_held(1) == 4 and kv.held(0) == ()
    assert kv.prefix_len(1, [5, 6, 9]) == 2 and kv.prefix_len(1, [5, 6, 7, 8, 9]) == 4 and kv.prefix_len(0, [5]) == 0
    kv.truncate(1, 2)
    assert kv.held(1) == (5, 6)


def test_what_held_returns_is_a_copy_nobody_can_write_through(kv):
    kv.extend(0, [1, 2])
    held = kv.held(0)
    assert isinstance(held, tuple)
    kv.extend(0, [3])
    assert held == (1, 2) and kv.held(0) == (1, 2, 3)


def test_clear_empties_one_slot_or_all(kv):
    for slot in range(3):
        kv.extend(slot, [slot, 9])
    kv.clear(1)
    assert [kv.n_held(s) for s in range(3)] == [2, 0, 2]
    kv.clear()
    assert [kv.held(s) for s in range(3)] == [(), (), ()]


def test_a_copied_prefix_is_held_by_the_slot_it_went_to(kv):
    kv.extend(0, [4, 5, 6])
    kv.copy_prefix(0, 2, 2)
    assert kv.held(2) == (4, 5)
    with pytest.raises(ValueError, match="holds 3 tokens, cannot copy 4"):
        kv.copy_prefix(0, 1, 4)
