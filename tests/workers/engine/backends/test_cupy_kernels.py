"""A kernel's launch settings that need no GPU to check (test_cupy_backend.py launches them on one)."""

from __future__ import annotations

from types import SimpleNamespace

from genie_workers.engine.backends.cupy.kernels import Kernel


def raw_with_static(static: int) -> SimpleNamespace:
    """A RawKernel's attributes as the driver reports them: the dynamic limit is 48 KiB less the static memory."""
    return SimpleNamespace(max_dynamic_shared_size_bytes=48 * 1024 - static)


def test_dynamic_memory_under_48_kib_is_opted_in_when_static_memory_leaves_less():
    raw = raw_with_static(2208)
    Kernel(raw, dev=None).allow_smem(48832)  # a 2-stage Q4_K ring for 768 values and its x8
    assert raw.max_dynamic_shared_size_bytes == 48832


def test_a_limit_already_high_enough_is_left_as_it_is():
    raw = raw_with_static(0)
    raw.max_dynamic_shared_size_bytes = 100_000
    Kernel(raw, dev=None).allow_smem(60_000)
    assert raw.max_dynamic_shared_size_bytes == 100_000
    Kernel(raw, dev=None).allow_smem(0)
    assert raw.max_dynamic_shared_size_bytes == 100_000
