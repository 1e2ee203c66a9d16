"""The GPU backend on CuPy: weights stay in GGUF block layout on the device.

Matrix products with up to `GEMV_MAX_TOKENS` rows (decode) run a quantized matrix-vector kernel that
dequantizes in registers (kernels/quant.cu); longer ones (prefill) dequantize the weight to float32
scratch and use cuBLAS. Everything else is the NumPy backend's code run on CuPy arrays. This is the
correct baseline the fast paths (fused kernels, split-K attention, CUDA-graph decode) replace one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..gguf_file import TensorInfo
from .numpy_backend import NumpyBackend, dequantize_tensor

GEMV_MAX_TOKENS = 8  # MAX_TOK in quant.cu
THREADS = 256

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


@dataclass
class QuantWeight:
    """A [rows, cols] matrix as its GGUF blocks on the device."""

    data: Any  # cupy uint8 [rows * row_bytes]
    qtype: GGMLQuantizationType
    rows: int
    cols: int

    @property
    def row_bytes(self) -> int:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.qtype]
        return self.cols // block_elems * block_bytes


@dataclass
class GroupWeight:
    """Matrices sharing an input, each in its own type; outputs side by side."""

    parts: list[QuantWeight]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)


def cupy_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device: all mean "not available"
        return False


class CupyBackend(NumpyBackend):
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.xp = cupy
        super().__init__()
        source = resources.files(__package__).joinpath("kernels/quant.cu").read_text(encoding="utf-8")
        # CuPy caches the compiled module on disk (~/.cupy/kernel_cache): a second start compiles nothing
        self._module = cupy.RawModule(code=source, options=("-std=c++17",))
        self._kernels: dict[str, Any] = {}
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self._device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    @property
    def device_name(self) -> str:
        return f"cupy ({self._device_name})"

    def _kernel(self, op: str, qtype: GGMLQuantizationType) -> Any:
        name = f"{op}_{KERNEL_TYPES[qtype]}"
        if name not in self._kernels:
            self._kernels[name] = self._module.get_function(name)
        return self._kernels[name]

    # -- weights --------------------------------------------------------------------------------------
    def load_matrix(self, tensor: TensorInfo) -> QuantWeight:
        if tensor.qtype not in KERNEL_TYPES:
            raise ValueError(f"tensor {tensor.name}: no GPU kernel for {tensor.qtype.name}")
        rows = int(np.prod(tensor.shape[:-1]))
        return QuantWeight(self.xp.asarray(tensor.data), tensor.qtype, rows, tensor.shape[-1])

    def load_vector(self, tensor: TensorInfo) -> Any:
        return self.xp.asarray(dequantize_tensor(tensor).reshape(-1))

    def group(self, weights: list[QuantWeight]) -> GroupWeight:
        return GroupWeight(list(weights))

    # -- kernels -------------------------------------------------------------------------------------
    def dequant_into(self, w: QuantWeight, out: Any, ids: Any = None, scale: float = 1.0) -> Any:
        """out[i] = scale * row ids[i] of w (every row when ids is None), float32."""
        cp = self.xp
        n_rows = w.rows if ids is None else int(ids.shape[0])
        n_sub = n_rows * (w.cols // 32)
        blocks = (n_sub + THREADS - 1) // THREADS
        ids_arg = ids if ids is not None else np.uint64(0)
        self._kernel("dequant", w.qtype)(
            (blocks,),
            (THREADS,),
            (w.data, ids_arg, out, np.int32(n_rows), np.int32(w.cols), np.int64(w.row_bytes), np.float32(scale)),
        )
        del cp
        return out

    def gemv_into(self, x: Any, w: QuantWeight, out: Any, ldy: int) -> Any:
        """out[t * ldy + r] = (x @ w.T)[t, r] for x [n <= GEMV_MAX_TOKENS, cols] float32 contiguous."""
        n = x.shape[0]
        assert n <= GEMV_MAX_TOKENS and x.shape[1] == w.cols and x.flags.c_contiguous
        blocks = (w.rows * 32 + THREADS - 1) // THREADS
        self._kernel("gemv", w.qtype)(
            (blocks,),
            (THREADS,),
            (w.data, x, out, np.int32(w.rows), np.int32(w.cols), np.int64(w.row_bytes), np.int32(n), np.int32(ldy)),
        )
        return out

    def _matmul_part(self, x: Any, w: QuantWeight, out: Any, col0: int) -> None:
        cp = self.xp
        if x.shape[0] <= GEMV_MAX_TOKENS:
            # writes out[t, col0 + r]: the kernel's y starts at that column, rows of length out.shape[1]
            self.gemv_into(x, w, out[:, col0:], ldy=out.shape[1])
        else:
            dense = self.dequant_into(w, cp.empty((w.rows, w.cols), dtype=cp.float32))
            out[:, col0 : col0 + w.rows] = x @ dense.T

    def matmul(self, x: Any, weight: QuantWeight | GroupWeight) -> Any:
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        parts = weight.parts if isinstance(weight, GroupWeight) else [weight]
        out = cp.empty((x.shape[0], sum(p.rows for p in parts)), dtype=cp.float32)
        col0 = 0
        for part in parts:
            self._matmul_part(x, part, out, col0)
            col0 += part.rows
        return out

    def embed(self, weight: QuantWeight, ids: np.ndarray, scale: float) -> Any:
        cp = self.xp
        dev_ids = cp.asarray(np.asarray(ids, dtype=np.int64))
        return self.dequant_into(weight, cp.empty((len(ids), weight.cols), dtype=cp.float32), dev_ids, scale)

    def to_host(self, x: Any) -> np.ndarray:
        return self.xp.asnumpy(x)
