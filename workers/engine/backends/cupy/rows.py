"""Products of several rows on the GPU: the decode rows of a step of several streams, and short prompts.

A row gets here the numbers it gets alone, bit for bit. Rows whose weights go through gemv1m alone (Q4_K and Q6_K
from compute capability 8.0; on 8.x its cp.async form, gemv1mc, and gemvnc) are coded exactly as the one-token path
codes them, and multiplied by gemvn (quant.cu): gemv1m's weight stream and arithmetic with the tokens in the tensor
cores' columns, in one launch whose blocks read the weights from HBM once (groups of four tokens a block, the other
groups' blocks beside them read them from L2). The coding is the producer's where the one-token path's is: gemvn's
epilogue codes its consumer's input as gemv1m's does (a norm of the output plus the residual without its RMS factor,
which the consumer's gemvn applies, or act(gate) * up) when one launch takes every row, and attention_decn codes the
o product's input; a post-norm's add and the next coding are q8_add_normed's (a block a row: add_normed_matmul);
else q8_input (a launch for all rows, a block a row) codes them the same way (X_NORM_LATE for a norm the one-token
product's epilogue would have coded). Other rows run as they would alone: a row of another weight
type through the one-token kernels, a prompt chunk of more than ROWS_MAX tokens through the prefill GEMM.

The functions take the backend (its products part, products.py) first and use its one-token machinery: _mma_tiles,
_mma_shape, _epilogue_for, _gemv1q, _one_matmul, and `row_groups` as stage_rows set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGMLQuantizationType

from ..base import NextInput
from ..numpy_backend import row_calls
from .chain import Product
from .coded import Coded, CodeLate, plain
from .quant_consts import (
    _EP_GATED,
    _EP_NONE,
    _EP_NORM,
    ACTIVATIONS,
    EP_MAX_ROWS,
    GEMVN_MAX_GROUPS,
    MMA_STATIC_SMEM,
    MMA_UNITS,
    Q8_THREADS,
)

if TYPE_CHECKING:
    from .products import CupyProducts
    from .tuning import CupyTuning
    from .weights import GroupWeight, QuantWeight

ROWS_MAX = 64  # a prompt chunk up to this many tokens takes gemvn
STEP_GROUPS = 4  # groups of four tokens up to which gemvn takes groups_a_block's sets, past them prompt_groups'
X_PLAIN, X_GATED, X_NORM, X_NORM_LATE = 0, 1, 2, 3  # q8_input's modes (quant.cu)


def x8_row_bytes(cols: int) -> int:
    """Bytes of a one-token x8 buffer: two codes a value, a scale and a sum a 32-value group (common.cuh)."""
    return 2 * cols + cols // 4


def x8_quads(xp: Any, n: int, cols: int) -> Any:
    """An n-token x8 buffer (gemvn's input, common.cuh): the tokens in quads of four, 11 cols bytes a quad (four
    tokens' codes, scales, sums and the 16-value sums of codes Q6_K's offset takes), a quad a row.
    GEMVN_MAX_GROUPS - 1 quads more are allocated behind the view returned: gemvn's blocks take sets of ng quads,
    and the last set of any slice of L quads reads up to round_up(L, ng) <= L + ng - 1 from the slice's start
    (those columns are never written; the kernel reads them rather than test each group, which cost 14 % of a
    16-stream step)."""
    if cols % 128:
        raise ValueError(f"the n-token layout needs a multiple of 128 values, not {cols}")
    return xp.empty((-(-n // 4) + GEMVN_MAX_GROUPS - 1, 11 * cols), dtype=xp.int8)[: -(-n // 4)]


@dataclass(frozen=True)
class RowsInput:
    """What a rows product multiplies, as its producer left it: x itself (X_PLAIN), act(gate) * up of
    x = [gate | up] (X_GATED, act), or rms_norm(x + r) * norm (X_NORM, or X_NORM_LATE: coded without the RMS
    factor, which gemvn applies; r may be None), x + r written into `added` by the coding (q8_input) or by
    add_rms_norm (rows of the float path), as a row alone adds them. x8: the rows already coded by their
    producer (attention_decn, or gemvn's epilogue), in q8_rows's layout."""

    x: Any
    mode: int = X_PLAIN
    act: int = 0
    norm: Any = None
    eps: float = 0.0
    r: Any = None
    added: Any = None
    x8: Any = None
    ss: Any = None  # with x8 coded late by the producer: its rows' group sums of squares

    @property
    def cols(self) -> int:
        return self.x.shape[1] // 2 if self.mode == X_GATED else self.x.shape[1]


def _fits(gpu: CupyProducts, parts: list[QuantWeight], then: NextInput | None) -> bool:
    """Every part goes through gemv1m when one row goes alone (with `then` as that row's product has it),
    so gemvn gives each row its numbers."""
    then = gpu._epilogue_for(then, parts)
    probe = gpu.dev.buffers.ids  # any device buffer: allocations are 256-byte aligned, as every x8 is
    return gpu._fusable_parts(parts) and all(gpu._mma_tiles(p, probe, then) for p in parts)


def _late(gpu: CupyProducts, parts: list[QuantWeight], then: NextInput | None) -> bool:
    """Whether one row alone would have its consumer's input coded by this product's norm epilogue."""
    ep = gpu._epilogue_for(then, parts)
    return ep is not None and ep.act is None and ep.post_norm is None and gpu._fusable_parts(parts)


def _product(gpu: CupyProducts, inp: RowsInput, weight: QuantWeight | GroupWeight, then: NextInput | None) -> Any:
    """inp's rows (n >= 2, in the groups stage_rows gave) times weight.T -> [n, rows of weight]. Where one row
    alone would have had its consumer's input coded by this product's epilogue (`then`) and one gemvn launch
    takes every row, that launch's epilogue codes them (returned as Coded); else, where the consumer codes the
    output late as the one-row product's epilogue would have, returns CodeLate (coded.py)."""
    cp = gpu.xp
    parts = weight.parts if hasattr(weight, "parts") else [weight]
    n = inp.x.shape[0]
    fit = _fits(gpu, parts, then)
    alone = gpu._epilogue_for(then, parts)  # the `then` one row alone has: it picks gemv1m or gemv1q
    one_row = gpu._fusable_parts(parts)  # a lone row through the one-token kernels, coded by q8_input
    groups = gpu.dev.row_groups if sum(gpu.dev.row_groups) == n else (n,)
    out = cp.empty((n, sum(p.rows for p in parts)), dtype=cp.float32)
    calls = row_calls(groups, ROWS_MAX if fit else 1)
    coded = None
    for a, b in calls:
        if (b - a == 1 and one_row) or (1 < b - a <= ROWS_MAX and fit):
            x8, ss = q8_rows(gpu, inp, a, b)
            col0 = 0
            for part in parts:
                if b - a == 1:
                    gpu._gemv1q(part, x8[0], out[a, col0:], None if ss is None else ss[0], inp.eps, alone=alone)
                else:
                    # gemvn's epilogue codes groups of its own output; a post-norm's consumer codes the rows
                    # (add_normed_matmul), a separate up's gated_pair and q8_input
                    one = alone is None or (alone.post_norm is None and alone.up is None)  # group epilogues alone
                    whole = calls == [(0, n)]  # one launch a part: it may be held for a chained launch (chain.py)
                    ep = alone if whole and one else None
                    coded = gemvn(gpu, part, x8, b - a, out[a:b, col0:], ss, inp.eps, ep, hold=whole)
                col0 += part.rows
        else:
            gpu.dev.chain.flush()  # the rows may be a held product's output: the float path reads them by CuPy's copies
            out[a:b] = gpu._one_matmul(_float_rows(gpu, inp, a, b), weight)
    if coded is not None:
        coded.out = out  # the consumer is handed `out` itself
        return coded
    gpu.dev.chain.flush()  # `out` is for anyone: the products held with those that fed it go out now
    return CodeLate(out) if _late(gpu, parts, then) else out


def _float_rows(gpu: CupyProducts, inp: RowsInput, a: int, b: int) -> Any:
    """Rows a..b of what inp multiplies, in float32, as the composition alone makes them."""
    if inp.mode == X_GATED:
        return gpu.backend.gated_act(inp.x[a:b], _act_name(inp.act))
    if inp.mode in (X_NORM, X_NORM_LATE):
        if inp.r is None:
            return gpu.backend.rms_norm(inp.x[a:b], inp.norm, inp.eps)
        added, normed = gpu.backend.add_rms_norm(inp.x[a:b].copy(), inp.r[a:b], inp.norm, inp.eps)
        inp.added[a:b] = added
        return normed
    return inp.x[a:b]


def q8_rows(gpu: CupyProducts, inp: RowsInput, a: int, b: int) -> tuple[Any, Any]:
    """Rows a..b of inp coded for the products (q8_input, a block a row, which also writes the rows' x + r):
    an n-token x8 buffer (x8_quads; one row: a one-token buffer [1, x8_row_bytes]), and (late norm) the rows'
    group sums of squares. Rows its producer coded are taken as they are where they start a quad."""
    cp = gpu.xp
    cols, n = inp.cols, b - a
    if inp.x8 is not None and n > 1 and a % 4 == 0:
        return inp.x8[a // 4 : -(-b // 4)], None if inp.ss is None else inp.ss[a:b]
    x8 = x8_quads(cp, n, cols) if n > 1 else cp.empty((1, x8_row_bytes(cols)), dtype=cp.int8)
    late = inp.mode == X_NORM_LATE
    ss = cp.empty((n, cols // 32), dtype=cp.float32) if late else None
    null = np.uint64(0)
    x = inp.x[a:b]
    gpu.dev.kernel_named("q8_input")(
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
            np.int32(n > 1),
            null if ss is None else ss,
        ),
    )
    return x8, ss


def gemvn_smem(gpu: CupyProducts, w: QuantWeight, threads: int, ng: int) -> int:
    """gemvn's dynamic shared memory: the ring, then a block's tile sums, [2][warps][16 rows][4 ng tokens]."""
    return gpu._ring_bytes(w) + 2 * (threads // 32) * 16 * 4 * ng * 4


def groups_that_fit(gpu: CupyProducts, w: QuantWeight, threads: int, ng: int) -> int:
    """ng groups of four tokens a block of gemvn, halved until the block fits the shared memory a block may have
    on this GPU (an RTX 30's 99 KiB: 2 groups of a Q6_K matrix at 16 warps). A token's numbers do not depend on
    the groups beside it."""
    while ng > 1 and gemvn_smem(gpu, w, threads, ng) + MMA_STATIC_SMEM > gpu.dev.smem_per_block:
        ng //= 2
    return ng


def groups_a_block(tuning: CupyTuning, qtype: GGMLQuantizationType, tiles: int, cols: int, n: int, slots: int) -> int:
    """Groups of four tokens a block of gemvn takes for n tokens of a matrix of `tiles` tiles of 16 rows of
    `cols` values, with `slots` blocks resident on the GPU at once: 1, 2 or 4, at most the groups there are.
    gemvn_groups_staged for a Q4_K matrix whose rows take several column stages (at most 2 where twice its tiles
    fit the slots: E2B's down and global o, 96 tiles, on an H100's 264 slots, 16 tokens 23.1 -> 17.4 and 8.0 -> 6.5
    µs as 2 sets; the 4B's 160 tiles keep 4, v17), gemvn_groups_wide for one of at least four tiles a slot at up to
    16 tokens (gate_up), else gemvn_groups (bench/NOTES.md v17, v20; NOTES-gemma4.md §14)."""
    groups = -(-n // 4)
    q4 = qtype == GGMLQuantizationType.Q4_K
    if q4 and cols > MMA_UNITS * 256:  # rows of several column stages
        most = tuning.gemvn_groups_staged if 2 * tiles > slots else min(2, tuning.gemvn_groups_staged)
    elif q4 and groups <= 4 and tiles >= 4 * slots:  # many tiles a block slot, up to 16 tokens
        most = tuning.gemvn_groups_wide
    else:
        most = tuning.gemvn_groups
    return min(most, 1 << (groups - 1).bit_length())


# A block of gemvn's work shared by its groups of tokens (the weights' stages, their unpacking and scales) in
# groups' work: gemvnc2_q4_k's loop is ~170 instructions an item besides ~70 a group (sm_87 SASS)
BLOCK_WORK = 2.4


def prompt_groups(allowed: tuple[int, ...], groups: int, tiles: int, slots: int) -> int:
    """Groups of four tokens a block of gemvn takes for a prompt chunk of `groups` groups (more than 4), of the
    counts `allowed` (those instantiated whose block fits): the fastest by waves of blocks a tile each, ceil(tiles
    x sets / slots), times a tile's work, BLOCK_WORK + ng groups (a set's groups without a token are computed
    too); the larger of equals. 40 tokens (10 groups) of the 4B's gate_up on 8.x: 2 sets of 5, where 5 sets of 2
    read each tile's weights 5 times and 3 sets of 4 compute 2 empty groups (bench/NOTES.md v27)."""

    def cost(ng: int) -> float:
        return -(-tiles * -(-groups // ng) // slots) * (BLOCK_WORK + ng)

    return min(sorted(allowed, reverse=True), key=cost)


def gemvn(
    gpu: CupyProducts,
    w: QuantWeight,
    x8: Any,
    n: int,
    out: Any,
    ss: Any,
    eps: float,
    then: NextInput | None = None,
    hold: bool = False,
) -> Coded | None:
    """out[k, :w.rows] = w @ x_k for the n coded rows of x8 (times row k's RMS factor from ss[k]): one gemvn
    launch with gemv1m's warps for w, groups of four tokens a block (groups_a_block's for a step's decode rows,
    prompt_groups' for a prompt chunk), and as many tiles a block as
    make the blocks of all the sets one wave (the sets of more than gemvn_groups groups multiply the blocks:
    with gemv1m's tiles a block, 16 tokens ran as a wave and a half, the half costing nearly a wave). With
    `then` (an epilogue one row alone would have), the kernel also codes each row's consumer input as that
    epilogue codes it, into rows of q8_rows's layout, which it returns (Coded, rows of `then.residual`).
    `hold`: where the family chains, a launch of 2-4 tokens (one group of four a block, one set) may wait to go out in
    one launch with those that read it (chain.py, gemvn_chainc), as one token's products do (products.py _gemv1q)."""
    cp = gpu.xp
    blocks, threads, _ = gpu._mma_shape(w)
    groups = -(-n // 4)
    tiles, slots = -(-w.rows // 16), gpu.dev.n_sm * blocks
    if groups <= STEP_GROUPS:  # a step's decode rows (up to 16 streams): the tuning's rule
        ng = groups_that_fit(gpu, w, threads, groups_a_block(gpu.dev.tuning, w.qtype, tiles, w.cols, n, slots))
    else:  # a prompt chunk
        allowed = gpu.dev.family.n_groups[w.qtype == GGMLQuantizationType.Q6_K]
        fit = lambda g: gemvn_smem(gpu, w, threads, g) + MMA_STATIC_SMEM <= gpu.dev.smem_per_block  # noqa: E731
        ng = prompt_groups(tuple(g for g in allowed if fit(g)), groups, tiles, slots)
    sets = -(-groups // ng)
    tpb = -(-tiles * sets // slots)  # a tile's numbers do not depend on the block that takes it
    null = np.uint64(0)
    coded, mode, act = None, _EP_NONE, 0
    if then is not None:
        tpb = min(tpb, EP_MAX_ROWS // 16)  # the groups a block completes fit the epilogue's table
        width = w.rows // 2 if then.act is not None else w.rows  # the consumer's values
        coded = Coded(out, x8_quads(cp, n, width), then)
        if then.act is not None:
            mode, act = _EP_GATED, ACTIVATIONS[then.act]
        else:
            mode = _EP_NORM
            coded.x_new = cp.empty((n, width), dtype=cp.float32)
            coded.ss = cp.empty((n, width // 32), dtype=cp.float32)
        gpu.dev.buffers.at_least("ep_cnt", sets * width // 32)  # a set's counters each
    smem = gemvn_smem(gpu, w, threads, ng)
    assert gpu.dev.family.products is not None  # gemvn runs where _mma_tiles found the tensor-core products
    kernel = gpu.dev.kernel(gpu.dev.family.gemvn(ng), w.qtype)
    kernel.allow_smem(smem)
    grid = -(-w.rows // (16 * tpb)) * sets
    args = (
        w.data,
        x8,
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
        np.int32(mode),
        np.int32(act),
        null if coded is None else coded.x8,
        gpu.dev.buffers.ep_cnt,
        null if then is None or then.residual is None else then.residual,
        null if mode != _EP_NORM else then.norm,  # type: ignore[union-attr]
        null if coded is None or coded.x_new is None else coded.x_new,
        null if coded is None or coded.ss is None else coded.ss,
    )
    # 2-4 tokens (one group, one set): gemvn_chainc's products are gemvnc1's
    if hold and gpu._chaining and ng == 1 and sets == 1:
        gpu.dev.chain.add(Product(kernel, args, int(w.qtype), grid, threads, smem, n_token=True))
    else:
        kernel((grid,), (threads,), args, shared_mem=smem)
    return coded


# -- CupyProducts's compositions for n >= 2 rows ------------------------------------------------------------
def matmul(gpu: CupyProducts, x: Any, weight: Any, then: NextInput | None) -> Any:
    """x: an array, or attention_decn's output coded for this product (Coded, then None)."""
    cp = gpu.xp
    x8 = x.x8 if isinstance(x, Coded) and x.then is None else None
    return _product(gpu, RowsInput(cp.ascontiguousarray(plain(x), dtype=cp.float32), x8=x8), weight, then)


def add_norm_matmul(
    gpu: CupyProducts, x: Any, r: Any, norm: Any, eps: float, w: Any, then: NextInput | None
) -> tuple[Any, Any]:
    """r as its producer returned it: Coded (gemvn's epilogue coded this very norm of x + r, taken when it is for
    it), CodeLate (the rows are coded late, as one row alone is), or the array."""
    cp = gpu.xp
    coded = r if isinstance(r, Coded) else None
    c = None if coded is None else coded.then
    if coded is not None and c is not None and c.act is None and c.residual is x:
        if c.norm is norm and c.eps == eps:
            inp = RowsInput(
                x, X_NORM_LATE, norm=norm, eps=eps, r=coded.out, added=coded.x_new, x8=coded.x8, ss=coded.ss
            )
            return coded.x_new, _product(gpu, inp, w, then)
    late, r = isinstance(r, CodeLate), plain(r)
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    added = x
    if r is not None:
        r = cp.ascontiguousarray(r, dtype=cp.float32)
        added = cp.empty_like(x)  # x + r: written row by row by the coding or the float path
    mode = X_NORM_LATE if late else X_NORM
    inp = RowsInput(x, mode, norm=cp.ascontiguousarray(norm), eps=eps, r=r, added=None if r is None else added)
    return added, _product(gpu, inp, w, then)


def add_normed_matmul(
    gpu: CupyProducts, x: Any, y: Any, y_norm: Any, eps: float, scale: Any, norm: Any, w: Any, then: NextInput | None
) -> tuple[Any, Any] | None:
    """x' = add_normed(x, y, y_norm, eps, scale) and its product (rms-normed by `norm` first when given) for a
    step's rows, x' and its codes in one launch (q8_add_normed, a block a row: each row's numbers are those of
    add_normed and q8_input, as a token alone has them), where one gemvn launch takes every row; else None (the
    caller composes add_normed and the product, as before)."""
    cp = gpu.xp
    parts = w.parts if hasattr(w, "parts") else [w]
    n, cols = x.shape
    groups = gpu.dev.row_groups if sum(gpu.dev.row_groups) == n else (n,)
    if n > ROWS_MAX or cols % 128 or row_calls(groups, ROWS_MAX) != [(0, n)] or not _fits(gpu, parts, then):
        return None
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    x_new = cp.empty_like(x)
    x8 = x8_quads(cp, n, cols)
    gpu._q8_add_normed(x, y, y_norm, eps, scale, norm, x_new, x8, n_token=True)
    if norm is None:
        return x_new, _product(gpu, RowsInput(x_new, x8=x8), w, then)
    return x_new, _product(gpu, RowsInput(x_new, X_NORM, norm=norm, eps=eps, x8=x8), w, then)


def gated_matmul(
    gpu: CupyProducts, gate_up: Any, kind: str, w: Any, then: NextInput | None, coded: Coded | None
) -> Any:
    """`coded`: act(gate) * up as the producer of gate_up coded it (gemvn's epilogue), taken when it is."""
    cp = gpu.xp
    c = None if coded is None else coded.then
    x8 = coded.x8 if coded is not None and c is not None and c.act == kind else None
    inp = RowsInput(cp.ascontiguousarray(gate_up, dtype=cp.float32), X_GATED, act=ACTIVATIONS[kind], x8=x8)
    return _product(gpu, inp, w, then)


def _act_name(code: int) -> str:

    return next(name for name, c in ACTIVATIONS.items() if c == code)
