"""GENIE_CUDA_COMPAT: the compute capability whose kernel paths the CuPy backend takes (no GPU needed to parse
it; test_cupy_backend.py runs the forced paths on a GPU)."""

from __future__ import annotations

import pytest

from genie_workers.engine.backends.cupy import compat_capability


@pytest.mark.parametrize(
    ("forced", "want"), [(None, (9, 0)), ("", (9, 0)), ("sm87", (8, 7)), ("sm_87", (8, 7)), (" 8.0 ", (8, 0))]
)
def test_a_capability_is_read_in_either_spelling(forced, want):
    assert compat_capability((9, 0), forced) == want


@pytest.mark.parametrize("forced", ["87", "sm", "eight", "8.7.1", "sm_8_7"])
def test_a_malformed_value_is_a_clear_error(forced):
    with pytest.raises(ValueError, match=r"GENIE_CUDA_COMPAT=.*such as sm87 or 8\.7"):
        compat_capability((9, 0), forced)


def test_a_newer_capability_than_the_gpu_is_refused():
    with pytest.raises(ValueError, match="this GPU is 8.7; it cannot run 9.0's paths"):
        compat_capability((8, 7), "sm90")
    assert compat_capability((10, 0), "sm100") == (10, 0)
