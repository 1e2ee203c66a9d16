"""The rest of a layer on the device, one fused kernel each (kernels/layer_ops.cu): RMSNorm (with the residual add),
RoPE, the gated activation; and the step's ends: rows stacked, the greedy token."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...host_copy import HostCopy
from ...model_config import RopeMode
from ...next_tokens import NextTokens
from ..numpy_backend import NumpyBackend
from .coded import plain
from .core import CupyDevice
from .host_copies import DeviceTokens, PinnedStaging, start_to_host
from .kernels import THREADS, threads_for
from .quant_consts import ACTIVATIONS

# argmax_rows's grid, a row of blocks a row: the last block of a row reduces one partial per thread
ARGMAX_BLOCKS, ARGMAX_THREADS = 64, 1024


class CupyLayerOps:
    """`backend`: the backend these are part of, whose NumPy compositions (on CuPy arrays) serve where these kernels
    do not, and whose RoPE tables rope reads."""

    def __init__(self, dev: CupyDevice, backend: NumpyBackend) -> None:
        self.dev = dev
        self.xp = dev.xp
        self.backend = backend
        self._gather_tables: dict[tuple[int, ...], tuple[Any, int]] = {}  # gather_slot's, by the arrays' addresses
        self._argmax_buf: tuple[Any, ...] | None = None
        self._ahead: Any = None  # greedy_ahead's last tokens (DeviceTokens), and the pinned buffer they come back to
        self._ahead_pinned: Any = None
        self._copy_stream = dev.xp.cuda.Stream(non_blocking=True)  # start_to_host's copies (host_copies.py)
        self._staging = PinnedStaging(dev.xp)  # ... and the pinned buffer they go through

    # -- fused layer operations (kernels/layer_ops.cu) ----------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        d = x.shape[-1]
        y = cp.empty_like(x)
        self.dev.op("rms_norm")(
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
        self.dev.op("add_rms_norm")(
            (x.size // d,), (threads_for(d),), (x, r, cp.ascontiguousarray(weight), y, np.int32(d), np.float32(eps))
        )
        return x, y

    def add_normed(self, x: Any, y: Any, weight: Any | None, eps: float, scale: Any | None = None) -> Any:
        y = plain(y)  # a product's output as it returned it (coded.py)
        if weight is None:
            return NumpyBackend.add_normed(self.backend, x, y, weight, eps, scale)
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        y = cp.ascontiguousarray(y, dtype=cp.float32)
        d = x.shape[-1]
        out = cp.empty_like(x)
        s = np.uint64(0) if scale is None else cp.ascontiguousarray(scale, dtype=cp.float32)  # null: no scale
        self.dev.op("add_normed")(
            (x.size // d,),
            (threads_for(d),),
            (x, y, cp.ascontiguousarray(weight), s, out, np.int32(d), np.float32(eps)),
        )
        return out

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
        # the frequency factors are in the table
        table = self.backend._rope_table(base, scale, rope_dim, int(positions[-1]) + 1, freq_factors)
        total = n * heads * (rope_dim // 2)
        self.dev.op("rope")(
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
                self.dev.pos,
                np.int32(mode == "neox"),
            ),
        )
        return x

    def gated_act(self, gate_up: Any, kind: str) -> Any:
        cp = self.xp
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        n, ffn = gate_up.shape[0], gate_up.shape[1] // 2
        out = cp.empty((n, ffn), dtype=cp.float32)
        self.dev.op("gated_act")(
            ((n * ffn + THREADS - 1) // THREADS,),
            (THREADS,),
            (gate_up, out, np.int32(n), np.int32(ffn), np.int32(ACTIVATIONS[kind])),
        )
        return out

    def gated_pair(self, gate: Any, up: Any, kind: str) -> Any:
        cp = self.xp
        gate = cp.ascontiguousarray(gate, dtype=cp.float32)
        n, cols = gate.shape
        if up.dtype != cp.float32 or up.strides[-1] != 4:
            up = cp.ascontiguousarray(up, dtype=cp.float32)
        out = cp.empty((n, cols), dtype=cp.float32)
        self.dev.op("gated_pair")(
            ((n * cols + THREADS - 1) // THREADS,),
            (THREADS,),
            (gate, up, out, np.int32(n), np.int32(cols), np.int64(up.strides[0] // 4), np.int32(ACTIVATIONS[kind])),
        )
        return out

    def stack_rows(self, parts: list[Any]) -> Any:
        # a copy per part: cupy.concatenate of many arrays sends their addresses from the host, which a step
        # being captured as a graph may not do; a part may be a one-token attention's Coded (coded.py)
        parts = [plain(p) for p in parts]
        n = sum(p.shape[0] for p in parts)
        out = self.xp.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype)
        row = 0
        for p in parts:
            out[row : row + p.shape[0]] = p
            row += p.shape[0]
        return out

    def to_host(self, x: Any) -> np.ndarray:
        self.dev.chain.flush()
        return self.xp.asnumpy(x)

    def start_to_host(self, x: Any) -> HostCopy:
        self.dev.chain.flush()
        return start_to_host(self.xp, x, self._copy_stream, self._staging)

    def gather_slot(self, arrays: list[Any], slot: int, n: int) -> Any:
        """One gather_slot_rows launch (layer_ops.cu) from a table of the arrays made on their first gather (the
        KV pools never move): a save's export took 0.4-0.5 ms of the engine thread on the H200 with it, 2.4 ms
        with CuPy's slicing and concatenates of the 4B's 144 arrays."""
        cp = self.xp
        key = tuple(int(a.data.ptr) for a in arrays)
        if key not in self._gather_tables:
            rows = [int(a[0, 0].nbytes) for a in arrays]  # the bytes of a position
            for a, r in zip(arrays, rows, strict=True):
                if not a.flags.c_contiguous or a.strides[1] != r:
                    raise ValueError("gather_slot takes C-contiguous pools [slots, positions, ...]")
            before = np.cumsum([0, *rows[:-1]])
            table = [[int(a.data.ptr), a.strides[0], r, int(b)] for a, r, b in zip(arrays, rows, before, strict=True)]
            self._gather_tables[key] = (cp.asarray(np.asarray(table, dtype=np.int64)), sum(rows))
        table, row_bytes = self._gather_tables[key]
        out = cp.empty(n * row_bytes, dtype=cp.uint8)
        if n and arrays:
            self.dev.op("gather_slot_rows")((8, len(arrays)), (256,), (table, np.int64(slot), np.int64(n), out))
        return out

    def greedy_tokens(self, logits: Any, rows: list[int]) -> list[int]:
        """Every row's argmax in one launch (argmax_rows: a row a grid row) and one copy back."""
        return [int(t) for t in self.xp.asnumpy(self._argmax_rows(logits, rows))]

    def greedy_ahead(self, logits: Any, rows: list[int]) -> NextTokens:
        """argmax_rows's tokens stay in its output for replay_ahead; their copy back goes into one pinned buffer
        (the tokens before are read first: the buffer is theirs until then)."""
        if self._ahead is not None:
            self._ahead.tokens()
        out = self._argmax_rows(logits, rows)
        if self._ahead_pinned is None or self._ahead_pinned.size < out.size:
            mem = self.xp.cuda.alloc_pinned_memory(4 * max(out.size, 64))
            self._ahead_pinned = np.ndarray((max(out.size, 64),), dtype=np.int32, buffer=mem)
        self._ahead = DeviceTokens(self.xp, out, self._ahead_pinned)
        return self._ahead

    def _argmax_rows(self, logits: Any, rows: list[int]) -> Any:
        """The rows' argmax (-1: a non-finite value) on the device, int32 [len(rows)]: argmax_rows's output,
        valid until its next launch."""
        cp = self.xp
        x = cp.ascontiguousarray(logits, dtype=cp.float32)
        if rows != list(range(rows[0], rows[0] + len(rows))):
            x, rows = x[cp.asarray(rows)], list(range(len(rows)))  # scattered rows: gathered first
        k = len(rows)
        if self._argmax_buf is None or self._argmax_buf[3].size < k:
            # per-block partials, each row's last-block counter (zero between launches), the results
            self._argmax_buf = (
                cp.empty(ARGMAX_BLOCKS * k, dtype=cp.float32),
                cp.empty(ARGMAX_BLOCKS * k, dtype=cp.int32),
                cp.empty(ARGMAX_BLOCKS * k, dtype=cp.int32),
                cp.zeros(k, dtype=cp.int32),
                cp.empty(k, dtype=cp.int32),
            )
        part_v, part_i, part_bad, done, out = self._argmax_buf
        n = x.shape[-1]
        first = x.reshape(-1, n)[rows[0] :]
        self.dev.op("argmax_rows")(
            (ARGMAX_BLOCKS, k),
            (ARGMAX_THREADS,),
            (first, np.int64(n), np.int32(n), part_v, part_i, part_bad, done, out),
        )
        return out[:k]
