"""pdl.py's ctypes view of the driver's launch structures (cuda.h, CUDA 12/13) and its argument packing: the
GPU test (test_cupy_backend.py::test_dependent_launch_replays_bit_for_bit) exercises the launches; these run
everywhere."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from genie_workers.engine.backends.cupy.pdl import _arg, _LaunchAttribute, _LaunchConfig


def test_launch_structures_have_the_driver_layout():
    # CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union
    assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8
    # CUlaunchConfig: 7 unsigned ints, the stream pointer aligned to 8, the attribute pointer, their count
    assert _LaunchConfig.hStream.offset == 32 and _LaunchConfig.attrs.offset == 40
    assert _LaunchConfig.numAttrs.offset == 48 and ctypes.sizeof(_LaunchConfig) == 56


def test_arguments_keep_their_width():
    assert isinstance(_arg(np.int32(-3)), ctypes.c_int32) and _arg(np.int32(-3)).value == -3
    assert isinstance(_arg(np.int64(1 << 40)), ctypes.c_int64)
    assert isinstance(_arg(np.uint64(0)), ctypes.c_uint64)
    assert isinstance(_arg(np.float32(0.5)), ctypes.c_float) and _arg(np.float32(0.5)).value == 0.5

    class Device:  # what a cupy.ndarray looks like to it: .data.ptr
        class data:
            ptr = 0xDEAD0000

    assert _arg(Device()).value == 0xDEAD0000


def test_an_argument_of_unknown_width_is_refused():
    with pytest.raises(TypeError, match="numpy scalar"):
        _arg(3)  # a Python int: int32 or int64? The kernel would read garbage
