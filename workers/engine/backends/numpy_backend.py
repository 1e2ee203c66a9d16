"""The CPU backend: NumPy for the activations, quantized weights as int8 blocks.

Quantized matrices are unpacked at load time into int8 blocks with a scale (and offset) a block, float32 or for
Q4_1, Q5_0, Q8_0, Q4_0 and Q5_1 GGUF's own float16s (block_weight.py):
one byte per weight (half a byte for the 4-bit types, five eighths for Q5_0). The 4- and 5-bit types' products,
any number of rows, run genie_gq_products on q8-coded inputs (a row's numbers whatever shares its call); the other
types' products with up to `GEMV_MAX_TOKENS` rows (decode) run the C kernel that reads the rows directly
(cpu_kernels.py), longer ones (prefill) dequantize a chunk of rows at a time to float32 and hand it to BLAS.
Without a C compiler the backend
falls back to what NumPy alone does well: every matrix dequantized to float32 once (four bytes per
weight; NumPy has no fast int8 or float16 product). F32/F16/BF16 matrices are float32 either way.

The compute methods are written against `self.xp`, so the CuPy backend inherits them as its plain
reference path and overrides the weight handling and the hot operations with its own kernels.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from genie_common.gguf_file import TensorInfo

from ..kv_cache import INT8_QMAX, LayerKV, kv_rotation
from ..model_config import LayerConfig, ModelConfig, RopeMode
from . import cpu_kernels
from .base import Array, Backend, NextInput, Weight
from .block_weight import (
    GEMV_HALF_BLOCKS,
    GROUPED,
    GROUPS_HIGH,
    HALF_SCALES,
    INT8,
    LAYOUTS,
    UNPACKERS,
    BlockWeight,
    concat_blocks,
    row_bytes,
    to_blocks,
)

DEQUANT_CHUNK_BYTES = 16 << 20  # bounds the temporaries of dequantizing a large tensor
# products with more rows than this dequantize to float32 and use BLAS. The C kernel's rows read once for all
# inputs (four weight rows at a time, on the pool's spinning threads) win up to ~32-40 rows on 2 cores: prefill
# Gemma 3 270M 24 / 33 / 48 tokens 47 / 59 / 85 ms against BLAS's 60 / 73 / 80; SmolLM2 57 / 76 / 92 against
# 78 / 77 / 85 (bench/NOTES.md, CPU note 2026-12-06b): a voice prompt with its chat template comes sooner
GEMV_MAX_TOKENS = 32
AFFINE_TYPES = frozenset({GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q4_K})
AFFINE_TYPES |= {GGMLQuantizationType.Q5_K}  # the block types with an offset (a min) besides the scale
_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def dequantize_tensor(tensor: TensorInfo, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [rows, cols] of any supported type, in row chunks so peak memory stays near the output."""
    rows = int(np.prod(tensor.shape[:-1]))
    cols = tensor.shape[-1]
    if out is None:
        out = np.empty((rows, cols), dtype=np.float32)
    if tensor.qtype == GGMLQuantizationType.F32:
        out[:] = tensor.data.view(np.float32).reshape(rows, cols)
        if not np.isfinite(out).all():
            raise ValueError(f"tensor {tensor.name} holds non-finite values")
        return out
    block_elems, block_bytes = GGML_QUANT_SIZES[tensor.qtype]
    row_bytes = cols // block_elems * block_bytes
    raw = tensor.data.reshape(rows, row_bytes)
    step = max(1, DEQUANT_CHUNK_BYTES // max(row_bytes, cols * 4))
    with np.errstate(all="ignore"):  # garbage block scales are reported below, not as a warning
        for r0 in range(0, rows, step):
            chunk = out[r0 : r0 + step]
            chunk[:] = dequantize(raw[r0 : r0 + step], tensor.qtype)
            if not np.isfinite(chunk).all():
                raise ValueError(f"tensor {tensor.name} holds non-finite values (corrupt block scales?)")
    return out


@dataclass
class _RopeTable:
    cos: np.ndarray  # [n_ctx, rope_dim // 2]
    sin: np.ndarray


class NumpyBackend(Backend):
    name = "numpy"
    xp = np
    stops_between_layers = True
    # 2 cores, SmolLM2: 4 streams decode 2.2x one stream's tokens/s (the int8 rows are read once for all)
    default_parallel = 4

    def __init__(self, block_kernels: bool = True) -> None:
        """`block_kernels=False` keeps every matrix as float32 (the fallback when no C compiler works)."""
        self._rope_tables: dict[tuple[float, float, int, tuple[float, ...] | None], _RopeTable] = {}
        self._rope_positions = 4096  # the fewest positions a RoPE table is built for (CuPy's reserve_steps: n_ctx)
        self._rotations: dict[int, np.ndarray] = {}
        self._row_groups: tuple[int, ...] = ()  # stage_rows
        lib = cpu_kernels.load() if block_kernels else None
        self._blocks = cpu_kernels.BlockKernels(lib) if lib is not None else None
        if self._blocks is None:  # float32 weights: every product is BLAS's, on genie's threads
            cpu_kernels.limit_blas_threads(cpu_kernels.default_threads())

    @property
    def device_name(self) -> str:
        if self._blocks is None:
            return "numpy (float32 weights)"
        return f"numpy (int8 blocks, {self._blocks.threads} threads)"

    def kv_zeros(self, shape: tuple[int, ...], dtype: Any) -> Array:
        """An anonymous mapping of its own, which the kernel backs page by page as positions are written.
        np.zeros asks for transparent huge pages on a large array (NumPy's madvise), so the first row written
        in each slot of each pool took 2 MB: 4 slots of Gemma 3 270M's 36 pools held 260 MB more after a few
        short turns, for ever (issue 34 item 13; bench/service_memory.py)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if nbytes == 0:
            return np.zeros(shape, dtype=dtype)
        pool = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):  # also where the kernel's THP setting is "always"
            pool.madvise(mmap.MADV_NOHUGEPAGE)
        return np.frombuffer(pool, dtype=dtype).reshape(shape)  # the array keeps the mapping

    def _rotation(self, head_dim: int) -> Any:
        if head_dim not in self._rotations:
            self._rotations[head_dim] = self.xp.asarray(kv_rotation(head_dim))
        return self._rotations[head_dim]

    def _rotate(self, x: Any) -> Any:
        """x [..., d] @ kv_rotation(d): with the C kernels as butterflies (the same numbers for a row of a prompt and
        of a decode step, as genie_qkv_i8's), else the product."""
        if self._blocks is not None and self.xp is np and x.shape[-1] <= cpu_kernels.ATTN1_MAX_DIM:
            return self._blocks.rotate(x)
        return x @ self._rotation(x.shape[-1])

    def weight_bytes(self, tensors: list[TensorInfo], matrix: bool) -> int:
        n = sum(int(np.prod(t.shape)) for t in tensors)
        blocks = self._blocks is not None and all(t.qtype in UNPACKERS and t.shape[-1] % 32 == 0 for t in tensors)
        if not (matrix and blocks):
            return n * 4  # float32
        block = min(UNPACKERS[t.qtype][1] for t in tensors)  # a group takes its parts' smallest block
        affine = any(t.qtype in AFFINE_TYPES or LAYOUTS.get(t.qtype) == GROUPS_HIGH for t in tensors)
        layouts = {LAYOUTS.get(t.qtype, INT8) for t in tensors}  # packed when all parts share a packed layout
        layout = layouts.pop() if len(layouts) == 1 else INT8
        cols = tensors[0].shape[-1]
        values = n // cols * row_bytes(layout, cols)
        # float16 as to_blocks keeps them, float32 once an int8 group is stacked (concat_blocks)
        half = all(t.qtype in HALF_SCALES for t in tensors) and (
            layout in GROUPED or (len(tensors) == 1 and cols // block <= GEMV_HALF_BLOCKS)
        )
        return values + n // block * (2 if half else 4) * (2 if affine else 1)  # and a scale (and offset) a block

    def scratch_bytes(self, cfg: Any, prefill_chunk: int, n_slots: int) -> tuple[int, int]:
        fixed, _ = super().scratch_bytes(cfg, prefill_chunk, n_slots)
        threads = self._blocks.threads if self._blocks is not None else 1
        # the prefill GEMM's dequantized rows (a buffer a thread); attention's scores of a chunk against
        # every key: [chunk, query heads of a KV head, keys] and its temporaries, per context token
        group = max(cfg.n_heads // lc.n_kv_heads for lc in cfg.layers)
        return fixed + threads * DEQUANT_CHUNK_BYTES, prefill_chunk * group * 4 * 3

    def load_matrix(self, tensor: TensorInfo) -> Weight:
        if self._blocks is not None and tensor.qtype in UNPACKERS and tensor.shape[-1] % 32 == 0:
            return to_blocks(tensor)
        return dequantize_tensor(tensor)

    def load_vector(self, tensor: TensorInfo) -> Array:
        return dequantize_tensor(tensor).reshape(-1)

    def group(self, weights: list[Weight]) -> Weight:
        if all(isinstance(w, BlockWeight) for w in weights):
            return concat_blocks(weights)
        return np.concatenate([w.dequantize() if isinstance(w, BlockWeight) else w for w in weights], axis=0)

    def embed(self, weight: Weight, ids: np.ndarray, scale: float) -> Array:
        x = weight.dequantize(ids) if isinstance(weight, BlockWeight) else weight[ids]
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def stage_rows(self, groups: tuple[int, ...]) -> None:
        self._row_groups = groups

    def matmul(self, x: Array, weight: Weight, then: NextInput | None = None) -> Array:
        if isinstance(weight, BlockWeight) and weight.layout in GROUPED:  # a row's numbers whatever shares the call
            return self._product(x, weight, then)
        small_max = GEMV_MAX_TOKENS if isinstance(weight, BlockWeight) else 0
        return self.grouped_rows(x, small_max, self._product, weight, then)

    def grouped_rows(self, x: Array, small_max: int, product: Any, weight: Weight, then: NextInput | None) -> Array:
        """product(rows, weight) for the rows of a step of several sequences (stage_rows), each group as it runs
        alone: groups of at most `small_max` rows (whose kernel gives a row the same numbers whatever rows
        share its call) together, at most small_max rows a call; every other group in a call of its own.
        Rows of one group (one sequence) are one call, with the `then` hint."""
        n = x.shape[0]
        groups = self._row_groups if sum(self._row_groups) == n else (n,)
        if len(groups) == 1:
            return product(x, weight, then)
        return self.stack_rows([product(x[a:b], weight) for a, b in row_calls(groups, small_max)])

    def _product(self, x: Array, weight: Weight, then: NextInput | None = None) -> Array:
        if isinstance(weight, BlockWeight):
            assert self._blocks is not None
            if weight.layout in GROUPED:
                return self._blocks.products(x, weight)
            if x.shape[0] <= GEMV_MAX_TOKENS:
                return self._blocks.gemv(x, weight)
            return self._blocks.gemm(x, weight)
        return x @ weight.T

    def _c_norm(self, x: Array, weight: Array) -> bool:
        """Whether genie_add_rms_norm takes this norm: float32 rows over the last axis, one weight row."""
        return (
            self._blocks is not None and self.xp is np and weight.ndim == 1 and x.dtype == weight.dtype == np.float32
            and x.shape[-1] == weight.shape[0] > 0
        )  # fmt: skip

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        if self._c_norm(x, weight):
            assert self._blocks is not None
            return self._blocks.add_rms_norm(x, None, weight, eps)[1]
        xp = self.xp
        ms = xp.einsum("...i,...i->...", x, x)[..., None] * np.float32(1.0 / x.shape[-1])
        return x * (np.float32(1.0) / xp.sqrt(ms + np.float32(eps))) * weight

    def _rope_table(
        self, base: float, scale: float, rope_dim: int, n_pos: int, freq_factors: tuple[float, ...] | None = None
    ) -> _RopeTable:
        key = (base, scale, rope_dim, freq_factors)
        table = self._rope_tables.get(key)
        if table is None or table.cos.shape[0] < n_pos:
            n = max(n_pos, self._rope_positions, 2 * table.cos.shape[0] if table is not None else 0)
            # ggml's loop: theta_0 = pos, theta_{i+1} = theta_i * base^(-2/d), all in float32
            theta_scale = np.float32(base) ** np.float32(-2.0 / rope_dim)
            theta = np.empty((n, rope_dim // 2), dtype=np.float32)
            t = np.arange(n, dtype=np.float32)
            for i in range(rope_dim // 2):
                theta[:, i] = t
                t = t * theta_scale
            theta *= np.float32(scale)
            if freq_factors is not None:  # as ggml: each pair's angle divided by its factor
                theta /= np.asarray(freq_factors, dtype=np.float32)
            table = _RopeTable(self.xp.asarray(np.cos(theta)), self.xp.asarray(np.sin(theta)))
            self._rope_tables[key] = table
        return table

    def rope(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        base: float,
        scale: float,
        rope_dim: int,
        mode: RopeMode,
        freq_factors: tuple[float, ...] | None = None,
    ) -> np.ndarray:
        table = self._rope_table(base, scale, rope_dim, int(positions.max()) + 1, freq_factors)
        p0, p1 = int(positions[0]), int(positions[-1]) + 1  # positions are consecutive
        cos = table.cos[p0:p1][:, None, :]  # [n, 1, rope_dim/2]
        sin = table.sin[p0:p1][:, None, :]
        if mode == "neox":
            half = rope_dim // 2
            x0, x1 = x[..., :half].copy(), x[..., half:rope_dim].copy()
            x[..., :half] = x0 * cos - x1 * sin
            x[..., half:rope_dim] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0:rope_dim:2].copy(), x[..., 1:rope_dim:2].copy()
            x[..., 0:rope_dim:2] = x0 * cos - x1 * sin
            x[..., 1:rope_dim:2] = x0 * sin + x1 * cos
        return x

    def add_rms_norm(self, x: Array, r: Array, weight: Array, eps: float) -> tuple[Array, Array]:
        if self._c_norm(x, weight) and r.shape == x.shape:
            assert self._blocks is not None
            return self._blocks.add_rms_norm(x, r, weight, eps)
        return super().add_rms_norm(x, r, weight, eps)

    def _one_call(self, x: Array, w: Weight) -> bool:
        """Whether a product of these rows with w may run in one C call: a row's numbers are the same whatever rows
        share it (grouped layouts; int8 rows of a decode-sized step, which matmul would also run as one call)."""
        if not isinstance(w, BlockWeight) or self._blocks is None or self.xp is not np or x.ndim != 2:
            return False
        return w.layout in GROUPED or (w.layout == INT8 and x.shape[0] <= GEMV_MAX_TOKENS)

    def add_norm_matmul(
        self, x: Array, r: Array | None, norm: Array, eps: float, w: Weight, then: NextInput | None = None
    ) -> tuple[Array, Array]:
        if self._one_call(x, w) and self._c_norm(x, norm) and (r is None or r.shape == x.shape):
            assert self._blocks is not None and isinstance(w, BlockWeight)
            return self._blocks.norm_product(x, r, norm, eps, w)
        return super().add_norm_matmul(x, r, norm, eps, w, then)

    def gated_matmul(
        self, gate_up: Array, kind: str, w: Weight, then: NextInput | None = None, up: Array | None = None
    ) -> Array:
        if up is None and self._one_call(gate_up, w) and kind in cpu_kernels.GATES and gate_up.dtype == np.float32:
            assert self._blocks is not None and isinstance(w, BlockWeight)
            return self._blocks.gated_product(gate_up, kind, w)
        return super().gated_matmul(gate_up, kind, w, then, up)

    def gated_act(self, gate_up: Array, kind: str) -> Array:
        xp = self.xp
        if self._blocks is not None and xp is np and kind in cpu_kernels.GATES:
            return self._blocks.gated_act(gate_up, kind)
        ffn = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :ffn], gate_up[..., ffn:]
        if kind == "silu":  # x * sigmoid(x), with sigmoid through tanh: no overflow for large |x|
            return gate * (np.float32(0.5) + np.float32(0.5) * xp.tanh(np.float32(0.5) * gate)) * up
        if kind == "gelu_tanh":
            inner = _SQRT_2_OVER_PI * (gate + np.float32(0.044715) * gate * gate * gate)
            return np.float32(0.5) * gate * (np.float32(1.0) + xp.tanh(inner)) * up
        raise ValueError(f"unknown activation {kind}")

    def kv_write(self, kv: LayerKV, slot: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        n = k.shape[0]
        if kv.k_scale is None:
            kv.k[slot, pos0 : pos0 + n] = k
            kv.v[slot, pos0 : pos0 + n] = v
            return
        assert kv.v_scale is not None
        if k.shape[-1] == v.shape[-1]:  # one rotation and one quantize pass for K and V together
            h = k.shape[1]
            q, s = quantize_int8(self._rotate(self.xp.concatenate([k, v], axis=1)), self.xp)
            kv.k[slot, pos0 : pos0 + n], kv.v[slot, pos0 : pos0 + n] = q[:, :h], q[:, h:]
            kv.k_scale[slot, pos0 : pos0 + n], kv.v_scale[slot, pos0 : pos0 + n] = s[:, :h], s[:, h:]
            return
        for src, dst, dst_scale in ((k, kv.k, kv.k_scale), (v, kv.v, kv.v_scale)):
            q, s = quantize_int8(self._rotate(src), self.xp)
            dst[slot, pos0 : pos0 + n] = q
            dst_scale[slot, pos0 : pos0 + n] = s

    def self_attention(
        self,
        qkv: np.ndarray,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: np.ndarray | None,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> np.ndarray:
        """With the C kernels and an INT8 pool: prepare_qkv's norms, RoPE, rotation and K/V store, the attention of the
        rotated q and the output's way back in one call of genie_attend_i8, whatever the number of rows (a prompt's
        and a decode step's rows the same numbers)."""
        blocks, H, hd, hdv = self._blocks, cfg.n_heads, lc.head_dim, lc.v_head_dim
        group = H // lc.n_kv_heads
        if blocks is None or self.xp is not np or kv.k_scale is None or not blocks.takes_attention(hd, hdv, group):
            return super().self_attention(qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        table = self._rope_table(lc.rope_base, lc.rope_scale, lc.rope_dim, int(positions[-1]) + 1, lc.rope_freq_factors)
        p0, p1 = int(positions[0]), int(positions[-1]) + 1  # positions are consecutive
        cos, sin, neox = table.cos[p0:p1], table.sin[p0:p1], cfg.rope_mode == "neox"
        return blocks.attend_i8(
            qkv, (H, lc.n_kv_heads), qk_norm, cfg.rms_eps, cfg.v_norm, cos, sin, neox, kv, slot, pos0,
            lc.sliding_window, cfg.attn_scale, cfg.attn_logit_softcap,
        )  # fmt: skip

    def attention(
        self, q: np.ndarray, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float
    ) -> np.ndarray:
        if kv.k_scale is not None:  # K and V rows are stored rotated (kv_rotation): rotate q alike
            q = self._rotate(q)
        return self._attend(q, kv, slot, pos0, window, scale, softcap)

    def _attend(
        self, q: np.ndarray, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float
    ) -> np.ndarray:
        """attention() of a q already rotated as an INT8 pool's rows are; the output rotated back."""
        xp = self.xp
        n, n_heads, _ = q.shape
        n_kv_heads = kv.k.shape[2]
        group = n_heads // n_kv_heads
        end = pos0 + n
        lo = max(0, pos0 - window + 1) if window else 0  # first key any of these queries can see
        v_dim = kv.v.shape[3]
        is_int8 = kv.k_scale is not None  # the output is un-rotated below
        blocks = self._blocks
        if is_int8 and blocks is not None and blocks.takes_attention(q.shape[-1], v_dim, group):
            # a decode step or a prompt's tokens: the int8 rows read where they are (cpu_kernels.py), each token's
            # numbers the same as alone, so a conversation continued from its saved K/V recomputes its last token
            # to the bit; a prompt in calls of GEMV_MAX_TOKENS rows (each call's partial sums: rows x positions)
            pos = np.arange(pos0, end)
            first = np.maximum(pos - window + 1, 0) if window else np.zeros(n, dtype=np.int64)
            out = np.empty((n, n_heads, v_dim), dtype=np.float32)
            for a in range(0, n, GEMV_MAX_TOKENS):
                b = min(n, a + GEMV_MAX_TOKENS)
                blocks.attention_rows(q[a:b], kv, slot, first[a:b], pos[a:b] + 1, scale, softcap, out=out[a:b])
            return blocks.rotate_in_place(out).reshape(n, n_heads * v_dim)
        bias = None  # a single query sees every key in [lo, end): no mask to build
        if n > 1:  # -inf where a query may not see a key (after it, or out of its window), added to its scores
            q_pos = np.arange(pos0, end)[:, None]
            k_pos = np.arange(lo, end)[None, :]
            masked = k_pos > q_pos
            if window:
                masked |= q_pos - k_pos >= window
            bias = xp.asarray(np.where(masked, np.float32(-np.inf), np.float32(0.0))[:, None, :])
        out = xp.empty((n, n_heads, v_dim), dtype=np.float32)
        t = end - lo

        def head(h: int) -> None:  # query heads [h * group, (h + 1) * group) over KV head h
            keys = kv.k[slot, lo:end, h].astype(np.float32)  # [T, hd]
            values = kv.v[slot, lo:end, h].astype(np.float32)  # [T, hdv]
            qh = q[:, h * group : (h + 1) * group].reshape(n * group, -1)  # [n * g, hd]: one GEMM, not n
            scores = (qh @ keys.T).reshape(n, group, t)
            scores *= np.float32(scale)
            if kv.k_scale is not None:
                scores *= kv.k_scale[slot, lo:end, h]
            if softcap:
                scores = np.float32(softcap) * xp.tanh(scores / np.float32(softcap))
            if bias is not None:
                scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            probs = xp.exp(scores, out=scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            if kv.v_scale is not None:
                probs *= kv.v_scale[slot, lo:end, h]
            out[:, h * group : (h + 1) * group] = (probs.reshape(n * group, t) @ values).reshape(n, group, -1)

        if blocks is not None and xp is np:  # a prompt's KV heads on genie's threads
            blocks.each(head, range(n_kv_heads))
        else:
            for h in range(n_kv_heads):
                head(h)
        if is_int8:
            out = self._rotate(out)
        return out.reshape(n, n_heads * v_dim)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return np.float32(cap) * self.xp.tanh(x / np.float32(cap))

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)


def quantize_int8(x: Any, xp: Any = np) -> tuple[Any, Any]:
    """x [..., d] -> (int8 values, float32 scale per row): scale = absmax / 127, round half to even, clamp."""
    scale = (xp.abs(x).max(axis=-1) / np.float32(INT8_QMAX)).astype(np.float32)
    inv = xp.where(scale > 0, np.float32(1.0) / xp.where(scale > 0, scale, np.float32(1.0)), np.float32(0.0))
    q = xp.clip(xp.rint(x * inv[..., None]), -INT8_QMAX, INT8_QMAX).astype(np.int8)
    return q, scale


def row_calls(groups: tuple[int, ...], small_max: int) -> list[tuple[int, int]]:
    """The row ranges [a, b) of a step's product calls for row groups of these sizes (a sequence's rows each):
    groups of at most small_max rows together, at most small_max rows a call, in order; a larger group alone."""
    calls, run, start = [], 0, 0
    for g in groups:
        small = g <= small_max
        if run and (not small or run + g > small_max):
            calls.append((start - run, start))
            run = 0
        if small:
            run += g
        else:
            calls.append((start, start + g))
        start += g
    if run:
        calls.append((start - run, start))
    return calls
