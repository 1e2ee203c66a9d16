"""Products of several rows on the GPU: the decode rows of a step of several streams, and short prompts.

A row gets here the numbers it gets alone, bit for bit. Rows whose weights go through gemv1m alone (Q4_K and
Q6_K on compute capability 9.0) are coded by q8_input (a launch for all of them, a block a row) exactly as
the one-token path codes them, and multiplied by gemvn (quant.cu): gemv1m's weight stream and arithmetic
with the tokens in the tensor cores' columns, in one launch whose blocks read the weights from HBM once
(groups of four tokens a block, the other groups' blocks beside them read them from L2). A row whose
input the one-token path would have had coded by the producing product's epilogue without its RMS factor
(a norm after a product given `then`) is coded the same way here (X_NORM_LATE), and the factor applied by
gemvn. Other rows run as they would alone: a row of another weight type through the one-token kernels, a
prompt chunk of more than ROWS_MAX tokens through the prefill GEMM.

The functions take the backend (its products part, products.py) first and use its one-token machinery: _mma_tiles,
_mma_shape, _epilogue_for, _gemv1q, _one_matmul, and `row_groups` as stage_rows set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..base import NextInput
from ..numpy_backend import row_calls
from .quant_consts import ACTIVATIONS, MMA_ROW_BYTES, Q8_THREADS

if TYPE_CHECKING:
    from .products import CupyProducts
    from .weights import GroupWeight, QuantWeight

ROWS_MAX = 64  # a prompt chunk up to this many tokens takes gemvn
X_PLAIN, X_GATED, X_NORM, X_NORM_LATE = 0, 1, 2, 3  # q8_input's modes (quant.cu)


def x8_row_bytes(cols: int) -> int:
    """Bytes of a row of an n-token x8 buffer: two codes a value, scales and sums a 32-value group, then the
    16-value sums of codes (int2) Q6_K's offset takes (common.cuh)."""
    return 2 * cols + cols // 4 + cols // 2


@dataclass(frozen=True)
class RowsInput:
    """What a rows product multiplies, as its producer left it: x itself (X_PLAIN), act(gate) * up of
    x = [gate | up] (X_GATED, act), or rms_norm(x + r) * norm (X_NORM, or X_NORM_LATE: coded without the RMS
    factor, which gemvn applies; r may be None), x + r written into `added` by the coding (q8_input) or by
    add_rms_norm (rows of the float path), as a row alone adds them. x8: the rows already coded by their
    producer (attention_decn), in q8_rows's layout."""

    x: Any
    mode: int = X_PLAIN
    act: int = 0
    norm: Any = None
    eps: float = 0.0
    r: Any = None
    added: Any = None
    x8: Any = None

    @property
    def cols(self) -> int:
        return self.x.shape[1] // 2 if self.mode == X_GATED else self.x.shape[1]


def _fits(gpu: CupyProducts, parts: list[QuantWeight], then: NextInput | None) -> bool:
    """Every part goes through gemv1m when one row goes alone (with `then` as that row's product has it),
    so gemvn gives each row its numbers."""
    then = gpu._epilogue_for(then, parts)
    probe = gpu._ids  # any device buffer: allocations are 256-byte aligned, as every x8 is
    return gpu._fusable_parts(parts) and all(gpu._mma_tiles(p, probe, then) for p in parts)


def _late(gpu: CupyProducts, parts: list[QuantWeight], then: NextInput | None) -> bool:
    """Whether one row alone would have its consumer's input coded by this product's norm epilogue."""
    ep = gpu._epilogue_for(then, parts)
    return ep is not None and ep.act is None and gpu._fusable_parts(parts)


def _product(gpu: CupyProducts, inp: RowsInput, weight: QuantWeight | GroupWeight, then: NextInput | None) -> Any:
    """inp's rows (n >= 2, in the groups stage_rows gave) times weight.T -> [n, rows of weight]; records
    whether the consumer of the output codes it late (as `then` would have had the one-row product do)."""
    cp = gpu.xp
    parts = weight.parts if hasattr(weight, "parts") else [weight]
    n = inp.x.shape[0]
    fit = _fits(gpu, parts, then)
    alone = gpu._epilogue_for(then, parts)  # the `then` one row alone has: it picks gemv1m or gemv1q
    one_row = gpu._fusable_parts(parts)  # a lone row through the one-token kernels, coded by q8_input
    groups = gpu._row_groups if sum(gpu._row_groups) == n else (n,)
    out = cp.empty((n, sum(p.rows for p in parts)), dtype=cp.float32)
    for a, b in row_calls(groups, ROWS_MAX if fit else 1):
        if (b - a == 1 and one_row) or (1 < b - a <= ROWS_MAX and fit):
            x8, ss = q8_rows(gpu, inp, a, b)
            col0 = 0
            for part in parts:
                if b - a == 1:
                    gpu._gemv1q(part, x8[0], out[a, col0:], None if ss is None else ss[0], inp.eps, alone=alone)
                else:
                    gemvn(gpu, part, x8, b - a, out[a:b, col0:], ss, inp.eps)
                col0 += part.rows
        else:
            out[a:b] = gpu._one_matmul(_float_rows(gpu, inp, a, b), weight)
    gpu._late_out = out if _late(gpu, parts, then) else None
    return out


def _float_rows(gpu: CupyProducts, inp: RowsInput, a: int, b: int) -> Any:
    """Rows a..b of what inp multiplies, in float32, as the composition alone makes them."""
    if inp.mode == X_GATED:
        return gpu.gated_act(inp.x[a:b], _act_name(inp.act))
    if inp.mode in (X_NORM, X_NORM_LATE):
        if inp.r is None:
            return gpu.rms_norm(inp.x[a:b], inp.norm, inp.eps)
        added, normed = gpu.add_rms_norm(inp.x[a:b].copy(), inp.r[a:b], inp.norm, inp.eps)
        inp.added[a:b] = added
        return normed
    return inp.x[a:b]


def q8_rows(gpu: CupyProducts, inp: RowsInput, a: int, b: int) -> tuple[Any, Any]:
    """Rows a..b of inp coded for the products (q8_input, a block a row, which also writes the rows' x + r):
    the x8 rows, and (late norm) the rows' group sums of squares."""
    cp = gpu.xp
    if inp.x8 is not None:
        return inp.x8[a:b], None
    cols, n = inp.cols, b - a
    stride = x8_row_bytes(cols)
    x8 = cp.empty(n * stride, dtype=cp.int8)
    late = inp.mode == X_NORM_LATE
    ss = cp.empty((n, cols // 32), dtype=cp.float32) if late else None
    null = np.uint64(0)
    x = inp.x[a:b]
    gpu._kernel_named("q8_input")(
        (n,),
        (Q8_THREADS,),
        (
            x,
            null if inp.r is None else inp.r[a:b],
            null if inp.norm is None else inp.norm,
            null if inp.r is None else inp.added[a:b],
            np.float32(inp.eps),
            np.int32(inp.mode),
            np.int32(inp.act),
            np.int32(cols),
            x8,
            np.int64(x.shape[1]),
            np.int64(stride),
            null if ss is None else ss,
        ),
    )
    return x8.reshape(n, stride), ss


def gemvn(gpu: CupyProducts, w: QuantWeight, x8: Any, n: int, out: Any, ss: Any, eps: float) -> None:
    """out[k, :w.rows] = w @ x_k for the n coded rows of x8 (times row k's RMS factor from ss[k]): one gemvn
    launch with gemv1m's warps for w, gemvn_groups groups of four tokens a block, and as many tiles a block as
    make the blocks of all the sets one wave (the sets of more than gemvn_groups groups multiply the blocks:
    with gemv1m's tiles a block, 16 tokens ran as a wave and a half, the half costing nearly a wave)."""
    blocks, threads, _ = gpu._mma_shape(w)
    groups = -(-n // 4)
    ng = min(gpu.tuning.gemvn_groups, 1 << (groups - 1).bit_length())  # 1, 2 or 4 groups a block
    sets = -(-groups // ng)
    tiles = -(-w.rows // 16)
    tpb = -(-tiles * sets // (gpu.n_sm * blocks))  # a tile's numbers do not depend on the block that takes it
    smem = gpu.tuning.mma_stages * 16 * MMA_ROW_BYTES[w.qtype] + 2 * (threads // 32) * 16 * 4 * ng * 4
    kernel = gpu._kernel(f"gemvn{ng}", w.qtype)
    kernel.allow_smem(smem)
    null = np.uint64(0)
    kernel(
        (-(-w.rows // (16 * tpb)) * sets,),
        (threads,),
        (
            w.data,
            x8,
            np.int64(x8.shape[1]),
            np.int32(n),
            out,
            np.int64(out.strides[0] // 4),
            np.int32(w.rows),
            np.int32(w.cols),
            np.int32(tpb),
            np.int32(sets),
            null if ss is None else ss,
            np.int32(0 if ss is None else ss.shape[1]),
            np.float32(eps),
        ),
        shared_mem=smem,
    )


# -- CupyProducts's compositions for n >= 2 rows ------------------------------------------------------------
def matmul(gpu: CupyProducts, x: Any, weight: Any, then: NextInput | None) -> Any:
    cp = gpu.xp
    coded = gpu._take_coded()
    x8 = coded.x8 if coded is not None and coded.out is x and coded.then is None else None
    return _product(gpu, RowsInput(cp.ascontiguousarray(x, dtype=cp.float32), x8=x8), weight, then)


def add_norm_matmul(
    gpu: CupyProducts, x: Any, r: Any, norm: Any, eps: float, w: Any, then: NextInput | None
) -> tuple[Any, Any]:
    cp = gpu.xp
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    late = r is not None and gpu._late_out is r
    gpu._late_out = None
    added = x
    if r is not None:
        r = cp.ascontiguousarray(r, dtype=cp.float32)
        added = cp.empty_like(x)  # x + r: written row by row by the coding or the float path
    mode = X_NORM_LATE if late else X_NORM
    inp = RowsInput(x, mode, norm=cp.ascontiguousarray(norm), eps=eps, r=r, added=None if r is None else added)
    return added, _product(gpu, inp, w, then)


def gated_matmul(gpu: CupyProducts, gate_up: Any, kind: str, w: Any, then: NextInput | None) -> Any:
    cp = gpu.xp
    gpu._late_out = None
    inp = RowsInput(cp.ascontiguousarray(gate_up, dtype=cp.float32), X_GATED, act=ACTIVATIONS[kind])
    return _product(gpu, inp, w, then)


def _act_name(code: int) -> str:

    return next(name for name, c in ACTIVATIONS.items() if c == code)
