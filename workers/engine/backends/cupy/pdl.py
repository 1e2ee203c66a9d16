"""Programmatic dependent launch (compute capability 9.0 and later) for the kernels of a captured decode step.

A decode step is some 380 dependent kernels (Qwen3-4B), most of them a few microseconds long: in a plain CUDA
graph each one starts only after its predecessor has finished and the launch has been processed. Launched
with the programmatic-stream-serialization attribute, a kernel may start while its predecessor still runs:
every kernel in kernels/quant.cu, layer_ops.cu and attention.cu calls grid_dep_wait() (common.cuh) before it reads what
an earlier kernel wrote or writes anything, so the early start only overlaps the launch, and, for the
one-token products, the first loads of weights, which no kernel writes. Stream capture keeps the attribute
as a programmatic edge of the graph.

CuPy's RawKernel has no way to pass launch attributes, so this calls the driver's cuLaunchKernelEx through
ctypes with the kernel's CUfunction; it is used only while a graph is being captured, where the host cost of
building the argument list is paid once.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h, CUlaunchAttributeID


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


_SCALARS: dict[type, Any] = {
    np.int32: ctypes.c_int32,
    np.int64: ctypes.c_int64,
    np.uint64: ctypes.c_uint64,
    np.float32: ctypes.c_float,
}


def _arg(value: Any) -> Any:
    """One kernel argument as the ctypes value whose address goes into kernelParams."""
    ptr = getattr(getattr(value, "data", None), "ptr", None)
    if ptr is not None:  # a cupy.ndarray: its device pointer
        return ctypes.c_uint64(ptr)
    kind = _SCALARS.get(type(value))
    if kind is None:
        raise TypeError(f"kernel argument of type {type(value).__name__}: pass a cupy array or a numpy scalar")
    return kind(value)


class DependentLauncher:
    """launch(kernel, grid, block, args, shared_mem) as RawKernel.__call__, with programmatic dependent launch."""

    def __init__(self) -> None:
        driver = ctypes.CDLL("libcuda.so.1")
        self._launch = driver.cuLaunchKernelEx  # AttributeError on a driver older than CUDA 12.0
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._attr = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        ctypes.memmove(ctypes.addressof(self._attr) + _LaunchAttribute.value.offset, (ctypes.c_int * 1)(1), 4)

    def launch(
        self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0
    ) -> None:
        import cupy as cp

        g, b = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
        values = [_arg(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        config = _LaunchConfig(*g, *b, shared_mem, cp.cuda.get_current_stream().ptr, ctypes.pointer(self._attr), 1)
        status = self._launch(ctypes.byref(config), kernel.kernel.ptr, params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernelEx of {kernel.name} failed: CUresult {status}")
