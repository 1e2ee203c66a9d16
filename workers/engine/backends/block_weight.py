"""GGUF quantized matrices as int8 blocks: w = scale * q + offset per block of 16 or 32 values.

Every quantized type the engine loads is exactly that once its bit fields are unpacked: Q8_0, Q4_0 and
Q5_0 are scale-only blocks of 32, Q4_1/Q5_1 add an offset, Q4_K/Q5_K are 32-value sub-blocks with a
6-bit scale and min under a float16 super-scale (scale = d * sc, offset = -dmin * m), Q6_K 16-value
sub-blocks with an int8 scale. Each scale * q product fits a float32 significand, so `dequantize` is
bit-identical to gguf's reference dequantization (tests check it type by type).

The CPU backend keeps matrices in this form: a byte per weight instead of four, read by the C kernels in
kernels/cpu_blocks.c (`layout`); the types whose values are 4 bits (Q4_1, Q4_K: 0 .. 15) two a byte in the groups
their q8 product reads (GROUPS), Q5_0's 5-bit values (q + 16) the same way with the fifth bits apart
(GROUPS_HIGH).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from genie_common.gguf_file import TensorInfo

Q = GGMLQuantizationType
UNPACK_CHUNK_BYTES = 8 << 20  # raw bytes unpacked at a time: bounds the temporaries
INT8 = 0  # BlockWeight.layout: a byte a value (genie_blk_gemv)
GROUPS = 3  # 4-bit values in cpu_blocks.c's groups of blocks, met by q8-coded inputs (genie_gq_products)
GROUPS_HIGH = 4  # ... 5-bit values (Q5_0's q + 16, the 16 in the offset) in the same groups, the fifth bits apart
GROUPED = frozenset({GROUPS, GROUPS_HIGH})


@dataclass(frozen=True)
class BlockWeight:
    q: np.ndarray  # int8 [rows, cols]; packed: uint8 [rows, row_bytes(layout, cols)]
    # float32 [rows, cols // block]; float16 for HALF_SCALES types (_half_where_exact)
    scale: np.ndarray
    offset: np.ndarray | None  # as scale (the same dtype), None for scale-only types
    block: int  # 16 or 32
    # INT8, GROUPS (pack_groups) or GROUPS_HIGH (pack_groups_high); blocks of 32 when packed
    layout: int = INT8

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.scale.shape[1] * self.block

    def values(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """int8 [n, cols]: the given rows' q values, unpacked."""
        if self.layout == GROUPS:
            return unpack_groups(self.q[rows], self.shape[1])
        if self.layout == GROUPS_HIGH:
            return unpack_groups_high(self.q[rows], self.shape[1])
        return self.q[rows]

    @cached_property
    def addresses(self) -> tuple[int, int, int | None]:
        """q's, scale's and offset's addresses, as the C kernels take them: read once (numpy's .ctypes costs
        ~1.6 us a call, and a SmolLM2 token makes ~120 products); the arrays never move."""
        return self.q.ctypes.data, self.scale.ctypes.data, None if self.offset is None else self.offset.ctypes.data

    def dequantize(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """float32 [n, cols] of the given rows."""
        q = self.values(rows)
        n, cols = q.shape
        w = q.reshape(n, cols // self.block, self.block).astype(np.float32)
        w *= self.scale[rows][..., None]
        if self.offset is not None:
            w += self.offset[rows][..., None]
        return w.reshape(n, cols)


@cache
def group_order(cols: int) -> np.ndarray:
    """int64 [vectors * 64]: the value (cols: padding) at each place of a row in cpu_blocks.c's GROUPS layout. A
    row's blocks of 32 in groups of 16 (lane L, values 4L .. 4L + 3 of each vector of 64: block L, vector j its
    values 4j .. 4j + 3), then a tail of t < 16 blocks as a group of T, the power of two >= t and >= 4 (16 / T
    lanes a block: lane L holds block L / (16 / T)'s values 4 (j (16 / T) + L % (16 / T)) + 0 .. 3)."""
    nb = cols // 32
    full, t = divmod(nb, 16)
    tail = max(4, 1 << (t - 1).bit_length()) if t else 0
    parts = []
    for g in range(full + (1 if t else 0)):
        T = 16 if g < full else tail
        lpb = 16 // T
        j, lane, e = np.meshgrid(np.arange(T // 2), np.arange(16), np.arange(4), indexing="ij")
        block = g * 16 + lane // lpb
        parts.append(np.where(block < nb, block * 32 + 4 * (j * lpb + lane % lpb) + e, cols).reshape(-1))
    return np.concatenate(parts)


def groups_row_bytes(cols: int) -> int:
    return len(group_order(cols)) // 2


def pack_groups(q: np.ndarray) -> np.ndarray:
    """int8 [n, cols] of values 0 .. 15 -> uint8 [n, groups_row_bytes(cols)]: the values in group_order, vectors
    2i and 2i + 1 in 64 bytes (byte b: vector 2i's value b in the low nibble, vector 2i + 1's in the high one)."""
    n, cols = q.shape
    v = np.concatenate([q.view(np.uint8), np.zeros((n, 1), np.uint8)], axis=1)[:, group_order(cols)]
    v = v.reshape(n, -1, 2, 64)
    return np.ascontiguousarray((v[:, :, 0] | (v[:, :, 1] << 4)).reshape(n, -1))


def unpack_groups(p: np.ndarray, cols: int) -> np.ndarray:
    """pack_groups' inverse: uint8 [n, groups_row_bytes(cols)] -> int8 [n, cols]."""
    n = p.shape[0]
    b = p.reshape(n, -1, 1, 64)
    v = np.concatenate([b & 0x0F, b >> 4], axis=2).reshape(n, -1)
    out = np.zeros((n, cols + 1), np.uint8)
    out[:, group_order(cols)] = v
    return out[:, :cols].view(np.int8)


def pack_groups_high(q: np.ndarray) -> np.ndarray:
    """int8 [n, cols] of values 0 .. 31 -> uint8 [n, groups_row_bytes(cols) // 32 * 40]: each pair of vectors as
    pack_groups' 64 bytes of low four bits, then the fifth bits of the pair's first vector (value b at bit b of a
    little-endian 64-bit word) and of its second: 80 bytes a pair (cpu_blocks.c's layout 4)."""
    n, cols = q.shape
    u = q.view(np.uint8)
    low = pack_groups((u & 0x0F).view(np.int8)).reshape(n, -1, 64)
    v = np.concatenate([u >> 4, np.zeros((n, 1), np.uint8)], axis=1)[:, group_order(cols)]
    high = np.packbits(v.reshape(n, -1, 2, 64), axis=-1, bitorder="little").reshape(n, -1, 16)
    return np.ascontiguousarray(np.concatenate([low, high], axis=-1).reshape(n, -1))


def unpack_groups_high(p: np.ndarray, cols: int) -> np.ndarray:
    """pack_groups_high's inverse: -> int8 [n, cols] of values 0 .. 31."""
    n = p.shape[0]
    b = p.reshape(n, -1, 80)
    low = unpack_groups(np.ascontiguousarray(b[:, :, :64]).reshape(n, -1), cols).view(np.uint8)
    bits = np.unpackbits(b[:, :, 64:], axis=-1, bitorder="little").reshape(n, -1)
    high = np.zeros((n, cols + 1), np.uint8)
    high[:, group_order(cols)] = bits
    return (low | (high[:, :cols] << 4)).view(np.int8)


PACK: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    GROUPS: pack_groups,
    GROUPS_HIGH: pack_groups_high,
}


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """float32 [blocks, 1] of the float16 at byte `at` of each block."""
    return raw[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-value nibble order: low nibbles of the 16 bytes first, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(word: np.ndarray, first: int, count: int) -> np.ndarray:
    """Bits first..first+count-1 of a uint32 [blocks, 1] -> uint8 [blocks, count] of 0/1."""
    return ((word >> np.arange(first, first + count, dtype=np.uint32)) & 1).astype(np.uint8)


Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # q [b, elems], scale [b, subs], offset


def _q8_0(raw: np.ndarray) -> Unpacked:
    return raw[:, 2:34].copy().view(np.int8), _f16(raw, 0), None


def _q4_0(raw: np.ndarray) -> Unpacked:
    return _nibbles(raw[:, 2:18]).view(np.int8) - 8, _f16(raw, 0), None


def _q4_1(raw: np.ndarray) -> Unpacked:
    return _nibbles(raw[:, 4:20]).view(np.int8), _f16(raw, 0), _f16(raw, 2)


def _q5_0(raw: np.ndarray) -> Unpacked:
    qh = raw[:, 2:6].copy().view("<u4")
    q = _nibbles(raw[:, 6:22]) | (_bits(qh, 0, 32) << 4)
    return q.view(np.int8) - 16, _f16(raw, 0), None


def _q5_1(raw: np.ndarray) -> Unpacked:
    qh = raw[:, 4:8].copy().view("<u4")
    q = _nibbles(raw[:, 8:24]) | (_bits(qh, 0, 32) << 4)
    return q.view(np.int8), _f16(raw, 0), _f16(raw, 2)


def _k_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in 12 bytes (ggml's get_scale_min_k4) -> uint8 [b, 8] each."""
    lo, hi = sc[:, 0:4], sc[:, 4:8]
    extra = sc[:, 8:12]
    scales = np.concatenate([lo & 63, (extra & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([hi & 63, (extra >> 4) | ((hi >> 6) << 4)], axis=1)
    return scales, mins


def _q4_k(raw: np.ndarray) -> Unpacked:
    d, dmin = _f16(raw, 0), _f16(raw, 2)
    sc, m = _k_scales(raw[:, 4:16])
    qs = raw[:, 16:144].reshape(-1, 4, 1, 32)  # 4 chunks of 64 values: low nibbles, then high
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)
    return q.view(np.int8), d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q5_k(raw: np.ndarray) -> Unpacked:
    d, dmin = _f16(raw, 0), _f16(raw, 2)
    sc, m = _k_scales(raw[:, 4:16])
    qh = raw[:, 16:48].reshape(-1, 1, 1, 32)
    qs = raw[:, 48:176].reshape(-1, 4, 1, 32)
    shift = np.arange(8, dtype=np.uint8).reshape(1, 4, 2, 1)  # sub-block j takes bit j of qh
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2) | (((qh >> shift) & 1) << 4)
    return q.reshape(-1, 256).view(np.int8), d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q6_k(raw: np.ndarray) -> Unpacked:
    ql = raw[:, 0:128].reshape(-1, 2, 2, 32)  # [half, l / 32, l % 32]
    qh = raw[:, 128:192].reshape(-1, 2, 1, 32)
    scales = raw[:, 192:208].copy().view(np.int8).astype(np.float32)  # [b, 16], one per 16 values
    d = _f16(raw, 208)
    # per half of 128 values: q1 = ql[l] low | qh bits 0-1, q2 = ql[l+32] low | bits 2-3,
    # q3 = ql[l] high | bits 4-5, q4 = ql[l+32] high | bits 6-7
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [b, 2, 4, 32]: q1, q2, q3, q4 low bits
    shift = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = low | (((qh >> shift) & 3) << 4)
    return q.reshape(-1, 256).view(np.int8) - 32, d * scales, None


UNPACKERS: dict[GGMLQuantizationType, tuple[Callable[[np.ndarray], Unpacked], int]] = {
    Q.Q8_0: (_q8_0, 32),
    Q.Q4_0: (_q4_0, 32),
    Q.Q4_1: (_q4_1, 32),
    Q.Q5_0: (_q5_0, 32),
    Q.Q5_1: (_q5_1, 32),
    Q.Q4_K: (_q4_k, 32),
    Q.Q5_K: (_q5_k, 32),
    Q.Q6_K: (_q6_k, 16),
}
LAYOUTS = {Q.Q4_1: GROUPS, Q.Q4_K: GROUPS, Q.Q5_0: GROUPS_HIGH}  # the types kept packed (blocks of 32)
# types whose scales and offsets stay float16: GGUF's own d and m (Q5_0's offset -16 d too), so a decode step reads
# 20 bytes a Q4_1 block, not 24, and 34 a Q8_0 block, not 36 (Gemma 3's 262 144-row head: 178 MB, not 189); Q4_K's
# and Q6_K's d * sc are no float16s. Int8 rows keep them so up to cpu_blocks.c's GEMV_HALF_BLOCKS blocks a row
# (which its gemv widens on the stack), and as float32 once stacked with other matrices (concat_blocks).
HALF_SCALES = frozenset({Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_0, Q.Q5_1})
GEMV_HALF_BLOCKS = 1024


def row_bytes(layout: int, cols: int) -> int:
    """A row's bytes of q in a layout."""
    if layout == GROUPS:
        return groups_row_bytes(cols)
    if layout == GROUPS_HIGH:
        return groups_row_bytes(cols) // 32 * 40
    return cols


def to_blocks(tensor: TensorInfo) -> BlockWeight:
    """Unpacks a quantized [rows, cols] tensor (a type in UNPACKERS) chunk by chunk, each chunk's pages of the file
    let go once it is done (TensorInfo.release_bytes)."""
    unpack, block = UNPACKERS[tensor.qtype]
    rows = int(np.prod(tensor.shape[:-1]))
    cols = tensor.shape[-1]
    block_elems, block_bytes = GGML_QUANT_SIZES[tensor.qtype]
    row_blocks = cols // block_elems
    raw = tensor.data.reshape(rows, row_blocks * block_bytes)
    layout = LAYOUTS.get(tensor.qtype, INT8)
    q = np.empty((rows, row_bytes(layout, cols)), np.uint8 if layout else np.int8)
    scale = np.empty((rows, cols // block), dtype=np.float32)
    offset = None
    step = max(1, UNPACK_CHUNK_BYTES // raw.shape[1])
    with np.errstate(all="ignore"):  # garbage float16 scales are reported below, not as a warning
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            cq, cs, co = unpack(raw[r0:r1].reshape(-1, block_bytes))
            if layout == GROUPS_HIGH:  # Q5_0's q + 16 (0 .. 31, unsigned as the product meets them), -16 s offsets
                cq, co = cq + np.int8(16), cs * np.float32(-16)
            q[r0:r1] = PACK[layout](cq.reshape(r1 - r0, cols)) if layout else cq.reshape(r1 - r0, cols)
            scale[r0:r1] = cs.reshape(r1 - r0, -1)
            if co is not None:
                if offset is None:
                    offset = np.empty_like(scale)
                offset[r0:r1] = co.reshape(r1 - r0, -1)
            tensor.release_bytes(r0 * raw.shape[1], r1 * raw.shape[1])  # the file's pages of the rows done
    if not np.isfinite(scale).all() or (offset is not None and not np.isfinite(offset).all()):
        raise ValueError(f"tensor {tensor.name} holds non-finite values (corrupt block scales?)")
    if tensor.qtype in HALF_SCALES and (layout != INT8 or cols // block <= GEMV_HALF_BLOCKS):
        scale, offset = _half_where_exact(scale, offset)
    return BlockWeight(q, scale, offset, block, layout)


def _half_where_exact(scale: np.ndarray, offset: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Scales and offsets as float16 when every one of them is a float16 (HALF_SCALES' always are, but for a Q5_0
    scale past 4094, whose -16 d is none: float32 then)."""
    parts = [a for a in (scale, offset) if a is not None]
    halves = [a.astype(np.float16) for a in parts]
    if not all(np.array_equal(h.astype(np.float32), a) for h, a in zip(halves, parts, strict=True)):
        return scale, offset
    return halves[0], halves[1] if offset is not None else None


def concat_blocks(weights: list[BlockWeight]) -> BlockWeight:
    """Stacks rows of matrices that share their input: the smaller block size, an offset if any has one, packed
    when all are in the same packed layout."""
    block = min(w.block for w in weights)
    affine = any(w.offset is not None for w in weights)

    def widen(a: np.ndarray, w: BlockWeight) -> np.ndarray:
        return np.repeat(a, w.block // block, axis=1) if w.block != block else a

    scale = np.concatenate([widen(w.scale, w) for w in weights])
    offset = None
    if affine:
        offset = np.concatenate(
            [widen(w.offset, w) if w.offset is not None else np.zeros_like(widen(w.scale, w)) for w in weights]
        )
    layout = weights[0].layout
    if layout and all(w.layout == layout for w in weights):  # (float16 parts beside float32 ones: all float32)
        return BlockWeight(np.concatenate([w.q for w in weights]), scale, offset, block, layout)
    f32 = np.float32
    offset = None if offset is None else offset.astype(f32, copy=False)  # INT8's kernels read float32
    return BlockWeight(np.concatenate([w.values() for w in weights]), scale.astype(f32, copy=False), offset, block)
