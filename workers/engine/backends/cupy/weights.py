"""Weights on the device in GGUF block layout: a matrix as its blocks, neighbours of one type merged into one
matrix, dequantization (rows of a matrix, the embedding's rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from genie_common.gguf_file import TensorInfo

from ..numpy_backend import dequantize_tensor
from .core import CupyDevice
from .kernels import KERNEL_TYPES, THREADS


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


class CupyWeights:
    def __init__(self, dev: CupyDevice) -> None:
        self.dev = dev
        self.xp = dev.xp

    def load_matrix(self, tensor: TensorInfo) -> QuantWeight:
        if tensor.qtype not in KERNEL_TYPES:
            raise ValueError(f"tensor {tensor.name}: no GPU kernel for {tensor.qtype.name}")
        if tensor.shape[-1] % 32:  # the kernels read rows as 32-value sub-blocks
            raise ValueError(
                f"tensor {tensor.name}: rows of {tensor.shape[-1]} values; the GPU kernels need a multiple of 32"
            )
        rows = int(np.prod(tensor.shape[:-1]))
        return QuantWeight(self.xp.asarray(tensor.data), tensor.qtype, rows, tensor.shape[-1])

    def load_vector(self, tensor: TensorInfo) -> Any:
        return self.xp.asarray(dequantize_tensor(tensor).reshape(-1))

    def group(self, weights: list[QuantWeight]) -> QuantWeight | GroupWeight:
        """Neighbours of one type become one matrix (one launch instead of two: gate and up, Q and K)."""
        merged: list[QuantWeight] = []
        for w in weights:
            prev = merged[-1] if merged else None
            if prev is not None and prev.qtype == w.qtype and prev.cols == w.cols:
                data = self.xp.concatenate([prev.data, w.data])
                merged[-1] = QuantWeight(data, w.qtype, prev.rows + w.rows, w.cols)
            else:
                merged.append(w)
        return merged[0] if len(merged) == 1 else GroupWeight(merged)

    def dequant_into(self, w: QuantWeight, out: Any, ids: Any = None, scale: float = 1.0) -> Any:
        """out[i] = scale * row ids[i] of w (every row when ids is None), float32."""
        n_rows = w.rows if ids is None else int(ids.shape[0])
        n_sub = n_rows * (w.cols // 32)
        blocks = (n_sub + THREADS - 1) // THREADS
        ids_arg = ids if ids is not None else np.uint64(0)
        self.dev.kernel("dequant", w.qtype)(
            (blocks,),
            (THREADS,),
            (w.data, ids_arg, out, np.int32(n_rows), np.int32(w.cols), np.int64(w.row_bytes), np.float32(scale)),
        )
        return out

    def embed(self, weight: QuantWeight, ids: Any, scale: float) -> Any:
        cp = self.xp
        dev_ids = ids if isinstance(ids, cp.ndarray) else cp.asarray(np.asarray(ids, dtype=np.int64))
        return self.dequant_into(weight, cp.empty((len(ids), weight.cols), dtype=cp.float32), dev_ids, scale)
