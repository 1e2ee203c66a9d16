"""The CuPy backend's tuning as one frozen object (no GPU needed): what it compiles in, what it refuses, and
that a knob can no longer be flipped as a backend attribute (it would be ignored)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from workers.engine.backends.cupy import OPS_SOURCES, QUANT_SOURCES, CupyBackend, CupyTuning, kernel_source
from workers.engine.backends.cupy.tuning import DEFINES


def test_defaults_compile_in_nothing_and_a_changed_size_is_a_define():
    assert CupyTuning().options("quant") == () and CupyTuning().options("ops") == ()
    t = CupyTuning(mma_stages=4, pf_warps=2, use_mma=False)
    assert t.options("quant") == ("-DMMA_STAGES=4",)
    assert t.options("ops") == ("-DPF_WARPS=2",)
    # every compiled knob's default is the one its kernel source states
    sources = {"quant": kernel_source(*QUANT_SOURCES), "ops": kernel_source(*OPS_SOURCES)}
    for name, (module, define, default) in DEFINES.items():
        stated = re.search(rf"#define {define} (\d+)", sources[module])
        assert stated is not None and int(stated[1]) == default == getattr(CupyTuning(), name), define


def test_bad_values_are_refused_and_the_object_is_frozen():
    with pytest.raises(ValueError, match="gemvn_groups"):
        CupyTuning(gemvn_groups=3)
    with pytest.raises(ValueError, match="gemvn_groups_wide"):
        CupyTuning(gemvn_groups_wide=8)
    with pytest.raises(ValueError, match="mma_threads"):
        CupyTuning(mma_threads=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CupyTuning().use_mma = False  # type: ignore[misc]


def test_a_knob_set_on_the_backend_is_an_error_not_ignored():
    backend = CupyBackend.__new__(CupyBackend)  # no GPU: only the attribute guard is exercised
    with pytest.raises(AttributeError, match=r"retune\(use_mma=...\)"):
        backend.use_mma = False  # type: ignore[attr-defined]
    backend.n_sm = 132  # any other attribute is the backend's own
    assert backend.n_sm == 132
