"""The buffers captured steps read (cupy/step_buffers.py), with NumPy standing in for CuPy (no GPU needed): a buffer
grows only by replacement, and every replacement, and only a replacement, makes the steps captured before stale."""

from __future__ import annotations

import numpy as np

from genie_workers.engine.backends.cupy.step_buffers import StepBuffers


class _Host(np.ndarray):
    """A NumPy array with CuPy's `set` (a host-to-device copy), which `staged` uses."""

    def set(self, values: np.ndarray) -> None:
        self[...] = values


class _HostXp:
    """The part of CuPy's module StepBuffers uses, on the host."""

    int32, int64, float32 = np.int32, np.int64, np.float32

    @staticmethod
    def zeros(n: int, dtype: object) -> _Host:
        return np.zeros(n, dtype=dtype).view(_Host)


def test_a_buffer_large_enough_is_kept_and_the_captures_stay_current():
    b = StepBuffers(_HostXp())
    before, version = b.done, b.version
    assert b.at_least("done", 1024) is before and b.version == version
    assert b.at_least("done", 0) is before and b.version == version


def test_a_short_buffer_is_replaced_zeroed_and_every_capture_goes_stale():
    b = StepBuffers(_HostXp())
    old, version = b.ep_cnt, b.version
    old[:] = 7  # a counter left non-zero would be the old buffer's, never the new one's
    new = b.at_least("ep_cnt", 5000, spare=6000)
    assert new is b.ep_cnt and new is not old and new.size == 6000 and not new.any()
    assert b.version == version + 1
    assert b.at_least("ep_cnt", 5999) is new and b.version == version + 1


def test_staged_values_land_in_front_and_a_short_buffer_doubles():
    b = StepBuffers(_HostXp())
    version = b.version
    ids = b.staged("ids", np.arange(3, dtype=np.int64))
    assert ids.size == 3 and list(ids) == [0, 1, 2] and b.version == version + 1  # 1 -> max(3, 2)
    again = b.staged("ids", np.array([9, 8], dtype=np.int64))
    assert again is ids and list(again[:2]) == [9, 8] and b.version == version + 1
    grown = b.staged("ids", np.arange(4, dtype=np.int64))
    assert grown.size == 6 and b.version == version + 2  # twice its 3


def test_something_else_the_graphs_read_replaced_makes_them_stale_too():
    b = StepBuffers(_HostXp())
    version = b.version
    b.replaced()  # a RoPE table grown, a kernel module rebuilt (retune)
    assert b.version == version + 1
