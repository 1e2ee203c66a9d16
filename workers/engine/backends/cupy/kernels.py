"""The kernel modules (kernels/*.cu, compiled by NVRTC through CuPy) and how a kernel is launched; the compute
capability whose paths run (GENIE_CUDA_COMPAT forces an older one's on a newer GPU)."""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING, Any

from gguf import GGMLQuantizationType

from .pdl import DependentLauncher

if TYPE_CHECKING:
    from .core import CupyDevice

THREADS = 256
# each module's source: kernels/ files in order (shared headers first; CuPy's disk cache keys on the text)
QUANT_SOURCES = ("common.cuh", "blocks.cuh", "quant.cu")
OPS_SOURCES = ("common.cuh", "kv_rows.cuh", "attend.cuh", "layer_ops.cu", "attention.cu")
COMPAT_ENV = "GENIE_CUDA_COMPAT"

# GGML type -> kernel name suffix in quant.cu
KERNEL_TYPES: dict[GGMLQuantizationType, str] = {
    GGMLQuantizationType.F32: "f32",
    GGMLQuantizationType.F16: "f16",
    GGMLQuantizationType.BF16: "bf16",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
    GGMLQuantizationType.Q5_0: "q5_0",
    GGMLQuantizationType.Q5_1: "q5_1",
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_K: "q4_k",
    GGMLQuantizationType.Q5_K: "q5_k",
    GGMLQuantizationType.Q6_K: "q6_k",
}


def kernel_source(*files: str) -> str:
    """kernels/ files joined in order (NVRTC has no include path into the package)."""
    kernels = resources.files(__package__).joinpath("kernels")
    return "\n".join(kernels.joinpath(name).read_text("utf-8") for name in files)


def kernel_module(*files: str, options: tuple[str, ...] = ()) -> Any:
    """A RawModule of kernels/ files. CuPy caches compiled modules on disk (~/.cupy/kernel_cache), keyed by
    the text and options: a second start compiles nothing."""
    import cupy

    return cupy.RawModule(code=kernel_source(*files), options=("-std=c++17", *options))


def cupy_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device: all mean "not available"
        return False


class Kernel:
    """A kernel of quant.cu, layer_ops.cu or attention.cu, called as CuPy's RawKernel; while the backend
    captures a step it is launched with programmatic dependent launch (pdl.py), which every kernel of those
    files allows for by calling grid_dep_wait() before it touches what an earlier kernel wrote."""

    def __init__(self, raw: Any, dev: CupyDevice) -> None:
        self.raw = raw
        self._dev = dev

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0) -> None:
        dev = self._dev
        dev.chain.flush()  # products held for a chained launch (chain.py) run first
        if dev.dependent_launch:
            assert dev.pdl is not None
            dev.pdl.launch(self.raw, grid, block, args, shared_mem)
        else:
            self.raw(grid, block, args, shared_mem=shared_mem)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return int(self.raw.max_dynamic_shared_size_bytes)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.raw.max_dynamic_shared_size_bytes = value

    def allow_smem(self, smem: int) -> None:
        """Opts in to `smem` bytes of dynamic shared memory where the kernel's limit is lower: by default it is
        48 KiB less the kernel's static shared memory, so a launch below 48 KiB of dynamic memory may need it
        too (gemv1mc's 2-stage Q4_K ring for 768 values, 47.7 KiB beside 2.2 KiB static, failed without it)."""
        if self.max_dynamic_shared_size_bytes < smem:
            self.max_dynamic_shared_size_bytes = smem


def dependent_launcher() -> DependentLauncher | None:
    try:
        return DependentLauncher()
    except (OSError, AttributeError):  # no libcuda.so.1, or a driver before CUDA 12.0
        return None


def compat_capability(device: tuple[int, int], forced: str | None) -> tuple[int, int]:
    """The compute capability whose kernel paths run: the device's, or the older one `forced` names ("sm87",
    "sm_87", "8.7"; empty: the device's), so the Jetson's paths (no bulk copies, clusters or programmatic
    launch) run and are tested on an H200. One newer than the device is refused."""
    if not forced:
        return device
    m = re.fullmatch(r"\s*(?:sm_?(\d+)(\d)|(\d+)\.(\d+))\s*", forced)
    if m is None:
        raise ValueError(f"{COMPAT_ENV}={forced!r}: give a compute capability such as sm87 or 8.7")
    major, minor = (int(m[1]), int(m[2])) if m[1] else (int(m[3]), int(m[4]))
    if (major, minor) > device:
        raise ValueError(
            f"{COMPAT_ENV}={forced!r}: this GPU is {device[0]}.{device[1]}; it cannot run {major}.{minor}'s paths"
        )
    return (major, minor)


def threads_for(d: int) -> int:
    """Threads for a one-block-per-row kernel: a multiple of 32, at most 1024."""
    return min(1024, max(32, (d + 31) // 32 * 32))
