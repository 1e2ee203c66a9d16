"""cuBLAS's GEMM for a stream that is being captured into a CUDA graph.

CuPy sets the cuBLAS handle's stream before every call, and refuses to while a stream captures ("calling
cuBLAS API during stream capture is currently unsupported"), although cuBLAS's GEMMs capture fine. A
prefill chunk captured as a graph (steps.py: CupySteps.forward_step) therefore sets the stream of
CuPy's handle before the capture begins and calls cublasGemmEx here, through ctypes, on the same library
CuPy loaded and the same handle.
"""

from __future__ import annotations

import ctypes
from pathlib import Path


def _loaded_cublas() -> str:
    """The path of the libcublas this process has loaded (CuPy's), from /proc/self/maps."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libcublas.so" in path:
            return path
    raise OSError("libcublas is not loaded in this process")


class CaptureGemm:
    def __init__(self, handle: int) -> None:
        """`handle`: CuPy's cuBLAS handle (cupy.cuda.device.get_cublas_handle(), which loads the library)."""
        self.handle = handle
        self._gemm = ctypes.CDLL(_loaded_cublas()).cublasGemmEx
        self._gemm.restype = ctypes.c_int
        i, p = ctypes.c_int, ctypes.c_void_p
        # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
        self._gemm.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]

    def __call__(self, *args: int) -> None:
        """cublasGemmEx(handle, *args) with args as CuPy's cublas.gemmEx takes them after the handle."""
        status = self._gemm(self.handle, *args)
        if status != 0:
            raise RuntimeError(f"cublasGemmEx failed during capture: cublasStatus_t {status}")
