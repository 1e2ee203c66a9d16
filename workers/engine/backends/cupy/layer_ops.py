"""The rest of a layer on the device, one fused kernel each (kernels/ops.cu): RMSNorm (with the residual add),
RoPE, the gated activation; and the step's ends: rows stacked, the greedy token."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...model_config import RopeMode
from .core import CupyCore
from .kernels import THREADS, threads_for
from .quant_consts import ACTIVATIONS

ARGMAX_BLOCKS, ARGMAX_THREADS = 64, 1024  # argmax_row's grid: the last block reduces one partial per thread


class CupyLayerOps(CupyCore):
    # -- fused layer operations (kernels/ops.cu) ----------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        d = x.shape[-1]
        y = cp.empty_like(x)
        self._op("rms_norm")(
            (x.size // d,),
            (threads_for(d),),
            (x, cp.ascontiguousarray(weight), y, np.int32(d), np.int32(weight.size // d), np.float32(eps)),
        )
        return y

    def add_rms_norm(self, x: Any, r: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        cp = self.xp
        if not (x.flags.c_contiguous and x.dtype == cp.float32):
            x = cp.ascontiguousarray(x, dtype=cp.float32)
        r = cp.ascontiguousarray(r, dtype=cp.float32)
        d = x.shape[-1]
        y = cp.empty_like(x)
        self._op("add_rms_norm")(
            (x.size // d,), (threads_for(d),), (x, r, cp.ascontiguousarray(weight), y, np.int32(d), np.float32(eps))
        )
        return x, y

    def rope(
        self,
        x: Any,
        positions: np.ndarray,
        base: float,
        scale: float,
        rope_dim: int,
        mode: RopeMode,
        freq_factors: tuple[float, ...] | None = None,
    ) -> Any:
        cp = self.xp
        x = cp.ascontiguousarray(x)
        n, heads, hd = x.shape
        table = self._rope_table(base, scale, rope_dim, int(positions[-1]) + 1, freq_factors)  # factors in the table
        total = n * heads * (rope_dim // 2)
        self._op("rope")(
            ((total + THREADS - 1) // THREADS,),
            (THREADS,),
            (
                x,
                table.cos,
                table.sin,
                np.int32(n),
                np.int32(heads),
                np.int32(hd),
                np.int32(rope_dim),
                self._pos,
                np.int32(mode == "neox"),
            ),
        )
        return x

    def gated_act(self, gate_up: Any, kind: str) -> Any:
        cp = self.xp
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        n, ffn = gate_up.shape[0], gate_up.shape[1] // 2
        out = cp.empty((n, ffn), dtype=cp.float32)
        self._op("gated_act")(
            ((n * ffn + THREADS - 1) // THREADS,),
            (THREADS,),
            (gate_up, out, np.int32(n), np.int32(ffn), np.int32(ACTIVATIONS[kind])),
        )
        return out

    def stack_rows(self, parts: list[Any]) -> Any:
        # a copy per part: cupy.concatenate of many arrays sends their addresses from the host, which a step
        # being captured as a graph may not do
        n = sum(p.shape[0] for p in parts)
        out = self.xp.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype)
        row = 0
        for p in parts:
            out[row : row + p.shape[0]] = p
            row += p.shape[0]
        return out

    def to_host(self, x: Any) -> np.ndarray:
        return self.xp.asnumpy(x)

    def greedy_token(self, logits: Any) -> int:
        cp = self.xp
        row = cp.ascontiguousarray(logits[-1], dtype=cp.float32)
        if self._argmax_buf is None:  # per-block partials, the last-block counter (zero between launches), the result
            self._argmax_buf = (
                cp.empty(ARGMAX_BLOCKS, dtype=cp.float32),
                cp.empty(ARGMAX_BLOCKS, dtype=cp.int32),
                cp.empty(ARGMAX_BLOCKS, dtype=cp.int32),
                cp.zeros(1, dtype=cp.int32),
                cp.empty(1, dtype=cp.int32),
            )
        part_v, part_i, part_bad, done, out = self._argmax_buf
        self._op("argmax_row")(
            (ARGMAX_BLOCKS,), (ARGMAX_THREADS,), (row, np.int32(row.size), part_v, part_i, part_bad, done, out)
        )
        return int(cp.asnumpy(out)[0])
