"""Products with the weights: one token through the GEMV kernels of quant.cu (dp4a on int8 codes of the input
for Q4_K and Q6_K, gemv1m on the tensor cores from compute capability 8.0, each able to code its consumer's
input in its epilogue), several rows through rows.py, a prompt chunk through cuBLAS (TF32) on dequantized
tiles of the weight."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ..base import NextInput
from ..numpy_backend import NumpyBackend
from . import core, rows
from .capture_gemm import CaptureGemm
from .chain import Product
from .coded import Coded, plain
from .core import CupyDevice
from .kernels import THREADS
from .quant_consts import (
    _EP_GATED,
    _EP_GATED_UP,
    _EP_NONE,
    _EP_NORM,
    _EP_POSTNORM,
    _X_GATED,
    _X_NORM,
    ACTIVATIONS,
    EP_MAX_ROWS,
    MMA_MAX_THREADS,
    MMA_ROW_BYTES,
    MMA_STATIC_SMEM,
    Q8_MAX_COLS,
    Q8_THREADS,
    QA_MAX_COLS,
)
from .weights import CupyWeights, GroupWeight, QuantWeight

OCTET_TYPES = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K})  # int8-activation one-token kernels
# gemv1q (the dp4a one-token product): rows a warp at most (GEMV1_ROWS in quant.cu), as many as still give every SM
# GEMV_BLOCKS_PER_SM blocks; a row split over several warps where the rows give an SM fewer than GEMV_SPLIT_WARPS
GEMV1_ROWS, GEMV_BLOCKS_PER_SM, GEMV_SPLIT_WARPS = 4, 2, 32
# cuBLAS / CUDA enums (cublas_api.h, library_types.h): gemmEx's data and compute types
_CUDA_R_32F = 0
# CUBLAS_COMPUTE_32F_FAST_TF32, _FAST_16F, _FAST_16BF: the prefill GEMM's compute, by CupyTuning.prefill_gemm
_PREFILL_COMPUTE = (77, 74, 75)
_CUBLAS_GEMM_DEFAULT = -1


class CupyProducts:
    """The products with the weights. `backend`: the backend they are part of, whose NumPy compositions (on CuPy
    arrays) serve where these kernels do not, and whose layer operations the rows' float path takes."""

    def __init__(self, dev: CupyDevice, weights: CupyWeights, backend: NumpyBackend) -> None:
        self.dev = dev
        self.xp = dev.xp
        self.weights = weights
        self.backend = backend

    def gemv1_into(self, x: Any, w: QuantWeight, out: Any) -> Any:
        """out[r] = (x @ w.T)[0, r] for one token (decode): dp4a on int8 activations for Q4_K/Q6_K, else x
        staged in shared memory as float32."""
        assert x.shape == (1, w.cols) and x.flags.c_contiguous
        if w.qtype in OCTET_TYPES and w.cols <= Q8_MAX_COLS:
            self._gemv1q(w, self._q8_input(x, w.cols), out)
            return out
        kernel = self.dev.kernel("gemv1", w.qtype)
        smem = w.cols * 4
        kernel.allow_smem(smem)
        rows_per_warp = self._rows_per_warp(w)
        rows_per_block = THREADS // 32 * rows_per_warp
        kernel(
            ((w.rows + rows_per_block - 1) // rows_per_block,),
            (THREADS,),
            (w.data, x, out, np.int32(w.rows), np.int32(w.cols), np.int64(w.row_bytes), np.int32(rows_per_warp)),
            shared_mem=smem,
        )
        return out

    def _rows_per_warp(self, w: QuantWeight) -> int:
        # several rows per warp share the x registers, but only where the grid still gives every SM
        # GEMV_BLOCKS_PER_SM blocks: 4 rows per warp everywhere lifted 4B decode 14 % and cost 0.6B 15 % (H200)
        return max(1, min(GEMV1_ROWS, w.rows // (THREADS // 32 * GEMV_BLOCKS_PER_SM * self.dev.n_sm)))

    def _q8_input(
        self,
        x: Any,
        cols: int,
        r: Any = None,
        nw: Any = None,
        x_new: Any = None,
        eps: float = 0.0,
        mode: int = 0,
        act: int = 0,
    ) -> Any:
        """The dp4a kernels' input (q8_input in quant.cu): x, act(gate) * up (_X_GATED) or rms_norm(x + r)
        (_X_NORM, writing x + r to x_new) as two int8 codes a value per 32 values, with scales and sums."""
        x8 = self.xp.empty(2 * cols + cols // 4, dtype=self.xp.int8)  # two codes a value, scales, sums
        null = np.uint64(0)
        self.dev.kernel_named("q8_input")(
            (1,),
            (Q8_THREADS,),
            (
                x,
                null if r is None else r,
                null if nw is None else nw,
                null if x_new is None else x_new,
                np.float32(eps),
                np.int32(mode),
                np.int32(act),
                np.int32(cols),
                x8,
                np.int64(0),
                np.int32(0),  # one token
                null,
            ),
        )
        return x8

    def _mma_tiles(self, w: QuantWeight, x8: Any, then: NextInput | None) -> int:
        """Tiles of 16 rows a block of gemv1m (quant.cu: Q4_K and Q6_K on the tensor cores) takes for w, or 0
        where that kernel does not apply: a kernel family with tensor-core products (8.0 or later), 16-byte
        aligned weights and x8, and a block that fits the GPU's shared memory (_mma_fits)."""
        if self.dev.family.products is None or not self.dev.tuning.use_mma or w.qtype not in MMA_ROW_BYTES:
            return 0
        if w.data.data.ptr % 16 or x8.data.ptr % 16 or w.rows * w.row_bytes % 16:  # no copy past the end
            return 0
        if not self._mma_fits(w):
            return 0
        tiles = -(-w.rows // 16)
        per_block = -(-tiles // (self.dev.n_sm * self._mma_shape(w)[0]))
        grouped = then is not None and then.post_norm is None  # a post-norm's epilogue counts blocks, not groups
        return 0 if grouped and 16 * per_block > EP_MAX_ROWS else per_block

    def _ring_bytes(self, w: QuantWeight) -> int:
        """gemv1m's and gemvn's ring of weight stages in shared memory, for w's type."""
        return self.dev.stages(self.dev.tuning) * 16 * MMA_ROW_BYTES[w.qtype]

    def _mma_fits(self, w: QuantWeight) -> bool:
        """Whether a block of gemv1m for w, and of gemvn for w at one group of tokens (it takes fewer groups a
        block where more do not fit), fits the shared memory a block may have on this GPU (an RTX 30: 99 KiB; an
        Orin: 163 KiB; 9.0: 227 KiB)."""
        _, threads, smem = self._mma_shape(w)
        return max(smem, rows.gemvn_smem(self, w, threads, 1)) + MMA_STATIC_SMEM <= self.dev.smem_per_block

    def _mma_shape(self, w: QuantWeight) -> tuple[int, int, int]:
        """gemv1m's blocks an SM, threads a block and dynamic shared memory for w: mma_blocks_per_sm blocks of
        mma_threads where their rings fit an SM, else fewer blocks of more threads (the same warps an SM)."""
        smem = self._ring_bytes(w) + 2 * w.cols + w.cols // 4  # the ring, x8
        if w.qtype == GGMLQuantizationType.Q6_K:
            smem += w.cols // 2  # x8's 16-value sums of codes
        fit = self.dev.smem_per_sm // (smem + MMA_STATIC_SMEM)
        t = self.dev.tuning
        blocks = max(1, min(t.mma_blocks_per_sm, fit))
        return blocks, min(MMA_MAX_THREADS, t.mma_threads * t.mma_blocks_per_sm // blocks), smem

    def _row_split(self, w: QuantWeight) -> int:
        """Warps a row of the dp4a GEMV is split over (a power of two, at most a block's 8): a matrix of too
        few rows to give every SM GEMV_SPLIT_WARPS warps takes more warps a row, while each warp's slice keeps
        a unit (256 values) for each of its 4 octets."""
        want = GEMV_SPLIT_WARPS * self.dev.n_sm
        ks = 1
        while ks < THREADS // 32 and w.rows * ks < want and (w.cols // 256) // (4 * ks * 2) >= 1:
            ks *= 2
        return ks

    def _gemv1q(
        self,
        w: QuantWeight,
        x8: Any,
        out: Any,
        norm_ss: Any = None,
        eps: float = 0.0,
        then: NextInput | None = None,
        alone: NextInput | None = None,
        hold: bool = False,
    ) -> Coded | None:
        """out = w @ x for x coded in x8 (times its RMS factor from the group sums of squares norm_ss, when
        given); with `then`, the kernel's epilogue codes the consumer's input (see Coded), which it returns.
        `alone`: the `then` this row would have alone, when it differs (the rows path: the same kernel).
        `hold`: where the family chains, a tensor-core product may wait to go out in one launch with those that
        read it (chain.py); its caller then sees that something launches or flushes before `out` is read."""
        mma_tiles = self._mma_tiles(w, x8, then if alone is None else alone)
        ks = self._row_split(w)
        rows_per_warp = self._rows_per_warp(w) if ks == 1 else 1
        rows_per_block = 16 * mma_tiles or THREADS // 32 // ks * rows_per_warp
        null = np.uint64(0)
        mode, act, coded = _EP_NONE, 0, None
        if then is not None and then.post_norm is not None:  # the block that completes the product codes the row
            assert mma_tiles, "EP_POSTNORM is gemv1m's (_epilogue_for)"
            cp = self.xp
            coded = Coded(out, cp.empty(2 * w.rows + w.rows // 4, dtype=cp.int8), then)
            coded.x_new = cp.empty((1, w.rows), dtype=cp.float32)
            mode = _EP_POSTNORM
        elif then is not None:
            len_ = w.rows // 2 if then.act is not None and then.up is None else w.rows
            assert rows_per_block <= EP_MAX_ROWS and len_ % 32 == 0  # EP_MAX_GROUPS in quant.cu
            cp = self.xp
            coded = Coded(out, cp.empty(2 * len_ + len_ // 4, dtype=cp.int8), then)
            if then.act is not None:
                mode, act = _EP_GATED if then.up is None else _EP_GATED_UP, ACTIVATIONS[then.act]
            else:
                mode = _EP_NORM
                coded.x_new = cp.empty((1, len_), dtype=cp.float32)
                coded.ss = cp.empty(len_ // 32, dtype=cp.float32)
            self.dev.buffers.at_least("ep_cnt", len_ // 32)  # a counter a group
        residual = None if then is None else then.residual if then.up is None else then.up
        grid = ((w.rows + rows_per_block - 1) // rows_per_block,)
        if mma_tiles:
            assert self.dev.family.products is not None  # _mma_tiles is 0 where the family has none
            kernel = self.dev.kernel(self.dev.family.products[0], w.qtype)
            _, threads, smem = self._mma_shape(w)
            kernel.allow_smem(smem)
            head: tuple = (w.data, x8, out, np.int32(w.rows), np.int32(w.cols), np.int32(mma_tiles))
            launch = partial(kernel, grid, (threads,), shared_mem=smem)
            if hold and self._chaining:  # one launch with its consumer (chain.py)
                launch = partial(self._hold, kernel, int(w.qtype), grid[0], threads, smem)
        else:
            head = (
                w.data,
                x8,
                out,
                np.int32(w.rows),
                np.int32(w.cols),
                np.int64(w.row_bytes),
                np.int32(rows_per_warp),
                np.int32(ks),
            )
            launch = partial(self.dev.kernel("gemv1q", w.qtype), grid, (THREADS,))
        launch(
            (
                *head,
                null if norm_ss is None else norm_ss,
                np.int32(0 if norm_ss is None else norm_ss.size),
                np.float32(eps),
                np.int32(mode),
                np.int32(act),
                null if coded is None else coded.x8,
                self.dev.buffers.ep_cnt,
                null if residual is None else residual,
                null if mode not in (_EP_NORM, _EP_POSTNORM) or then.norm is None else then.norm,  # type: ignore[union-attr]
                null if coded is None or coded.x_new is None else coded.x_new,
                null if coded is None or coded.ss is None else coded.ss,
                null if mode != _EP_POSTNORM else then.post_norm,  # type: ignore[union-attr]
                null if mode != _EP_POSTNORM or then.scale is None else then.scale,  # type: ignore[union-attr]
                np.float32(then.eps if mode == _EP_POSTNORM else 0.0),  # type: ignore[union-attr]
            ),
        )
        return coded

    @property
    def _chaining(self) -> bool:
        """Whether held products go out chained (chain.py): the family's chains (8.x) or a bench's chains_90."""
        return (self.dev.family.chains or self.dev.tuning.chains_90) and self.dev.tuning.use_chains

    def _hold(self, kernel: Any, qtype: int, grid: int, threads: int, smem: int, args: tuple) -> None:
        self.dev.chain.add(Product(kernel, args, qtype, grid, threads, smem))

    def _epilogue_for(self, then: NextInput | None, parts: list[QuantWeight]) -> NextInput | None:
        """`then` where one product's kernel can code its consumer's input: a single matrix whose output (act:
        each half) is whole 32-value groups; a norm's residual and weight float32 vectors of the output's size;
        a post-norm's also its weight (and scale) such, where the tuning asks (post_epilogues) and gemv1m takes the
        product (quant.cu's EP_POSTNORM is its epilogue's alone) with a block that divides q8_add_normed's."""
        if then is None or len(parts) != 1:
            return None
        rows = parts[0].rows
        cp = self.xp
        if then.act is not None and then.up is not None:  # the output is the gate; the up a float32 row of its size
            up = then.up
            fits = up.dtype == cp.float32 and up.shape[-1] == rows and up.strides[-1] == 4 and rows % 32 == 0
            return then if fits and then.act in ACTIVATIONS else None
        if then.act is not None:
            return then if rows % 64 == 0 and then.act in ACTIVATIONS else None
        if then.post_norm is not None:
            if not self.dev.tuning.post_epilogues:
                return None
            vectors = [then.post_norm, *(v for v in (then.norm,) if v is not None)]
            probe = self.dev.buffers.ids  # any device buffer: allocations are 256-byte aligned, as every x8 is
            if rows % 32 or then.residual is None or not self._mma_tiles(parts[0], probe, then):
                return None
            if Q8_THREADS % self._mma_shape(parts[0])[1]:
                return None
            if then.scale is not None and (then.scale.size != 1 or then.scale.dtype != cp.float32):
                return None
        elif then.norm is None:
            return None
        else:
            vectors = [then.norm]
        if any(v.size != rows or v.dtype != cp.float32 or not v.flags.c_contiguous for v in vectors) or rows % 32:
            return None
        res = then.residual  # a row of it a row of the output (the rows path asks this for one row of many)
        if res is not None and (res.shape[-1] != rows or res.dtype != cp.float32 or not res.flags.c_contiguous):
            return None
        return then

    def _matmul_part(self, x: Any, w: QuantWeight, out: Any, col0: int) -> None:
        if x.shape[0] == 1:
            self.gemv1_into(x, w, out[0, col0:])
        else:  # a short prompt too: the few-token GEMV made an 8-token prompt's first token 128 ms on the 4B
            self._prefill_matmul(x, w, out, col0)

    def _prefill_matmul(self, x: Any, w: QuantWeight, out: Any, col0: int) -> None:
        """out[:, col0:col0 + w.rows] = x @ w.T on the tensor cores: a tile of rows at a time is
        dequantized to bounded float32 scratch, then one cuBLAS GEMM (TF32, or as the tuning's prefill_gemm says)
        writes the tile's columns of `out` in place."""
        cp = self.xp
        from cupy_backends.cuda.libs import cublas

        n, k = x.shape
        tile = max(256, core.PREFILL_SCRATCH_BYTES // (w.cols * 4))  # core's: tests shrink it
        scratch = cp.empty((min(tile, w.rows), w.cols), dtype=cp.float32)
        handle = cp.cuda.device.get_cublas_handle()
        gemm: Callable[..., None]
        if self.dev.capturing:  # CuPy refuses cuBLAS calls now; _capture set the handle's stream (capture_gemm.py)
            if self.dev.capture_gemm is None:
                self.dev.capture_gemm = CaptureGemm(handle)
            gemm = self.dev.capture_gemm
        else:
            cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
            gemm = partial(cublas.gemmEx, handle)
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        ldo = out.shape[1]
        for r0 in range(0, w.rows, tile):
            rows = min(tile, w.rows - r0)
            part = QuantWeight(w.data[r0 * w.row_bytes : (r0 + rows) * w.row_bytes], w.qtype, rows, w.cols)
            dense = self.weights.dequant_into(part, scratch[:rows])
            # column-major view: out^T [rows, n] (ld = ldo) = dense [rows, k] (stored k-major) @ x^T
            gemm(
                cublas.CUBLAS_OP_T,
                cublas.CUBLAS_OP_N,
                rows,
                n,
                k,
                one.ctypes.data,
                dense.data.ptr,
                _CUDA_R_32F,
                k,
                x.data.ptr,
                _CUDA_R_32F,
                k,
                zero.ctypes.data,
                out.data.ptr + (col0 + r0) * 4,
                _CUDA_R_32F,
                ldo,
                _PREFILL_COMPUTE[self.dev.tuning.prefill_gemm],
                _CUBLAS_GEMM_DEFAULT,
            )

    def matmul(self, x: Any, weight: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        """x @ weight.T; x may be what its producer returned (Coded: attention's output coded for this product).
        Returns Coded where the kernel also coded the consumer's input that `then` names (coded.py)."""
        if plain(x).shape[0] == 1:
            return self._one_matmul(x, weight, then)
        return rows.matmul(self, x, weight, then)  # a step's rows, or a prompt chunk (rows.py)

    def _one_matmul(self, x: Any, weight: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        cp = self.xp
        coded = x if isinstance(x, Coded) and x.then is None else None  # coded as it was written, for any product
        x = cp.ascontiguousarray(plain(x), dtype=cp.float32)
        parts = weight.parts if isinstance(weight, GroupWeight) else [weight]
        if self._fusable(x, weight):  # one token, dp4a types: x quantized once for every part
            if coded is not None:
                return self._matmul_q8(coded.x8, parts, then=then)
            return self._matmul_q8(self._q8_input(x, x.shape[1]), parts, then=then)
        out = cp.empty((x.shape[0], sum(p.rows for p in parts)), dtype=cp.float32)
        col0 = 0
        for part in parts:
            self._matmul_part(x, part, out, col0)
            col0 += part.rows
        return out

    def _matmul_q8(
        self, x8: Any, parts: list[QuantWeight], norm_ss: Any = None, eps: float = 0.0, then: NextInput | None = None
    ) -> Any:
        out = self.xp.empty((1, sum(p.rows for p in parts)), dtype=self.xp.float32)
        then = self._epilogue_for(then, parts)
        col0 = 0
        for part in parts:
            coded = self._gemv1q(part, x8, out[0, col0:], norm_ss, eps, then, hold=True)
            col0 += part.rows
        if then is None:  # `out` is for anyone: the products held with those that fed it go out now (chain.py)
            self.dev.chain.flush()
            return out
        assert coded is not None
        coded.out = out  # the consumer is handed `out` itself, not the part's view
        return coded

    # -- fused compositions (decode: one token, dp4a weights) ---------------------------------------------
    def _fusable(self, x: Any, weight: QuantWeight | GroupWeight) -> bool:
        """One token through the dp4a kernels."""
        parts = weight.parts if isinstance(weight, GroupWeight) else [weight]
        return x.shape[0] == 1 and self._fusable_parts(parts)

    def _fusable_parts(self, parts: list[QuantWeight]) -> bool:
        """Every part takes int8 codes of its input (q8_input takes rows of up to Q8_MAX_COLS values)."""
        return all(p.qtype in OCTET_TYPES and p.cols <= Q8_MAX_COLS for p in parts)

    def add_norm_matmul(
        self, x: Any, r: Any, norm: Any, eps: float, w: QuantWeight | GroupWeight, then: NextInput | None = None
    ) -> tuple[Any, Any]:
        """r may be what its producer returned: Coded (this very norm of x + r coded by the product's epilogue), or
        CodeLate (rows)."""
        cp = self.xp
        if x.shape[0] > 1:
            return rows.add_norm_matmul(self, x, r, norm, eps, w, then)
        coded, r = r if isinstance(r, Coded) else None, plain(r)
        if not self._fusable(x, w):
            return NumpyBackend.add_norm_matmul(self.backend, x, r, norm, eps, w, then)
        parts = w.parts if isinstance(w, GroupWeight) else [w]
        c = None if coded is None else coded.then
        if coded is not None and c is not None and c.norm is norm and c.residual is x and c.eps == eps:
            return coded.x_new, self._matmul_q8(coded.x8, parts, coded.ss, eps, then)  # the producer coded it
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        if r is not None:
            r = cp.ascontiguousarray(r, dtype=cp.float32)
        x_new = x if r is None else cp.empty_like(x)
        x8 = self._q8_input(x, x.shape[1], r, norm, None if r is None else x_new, eps, _X_NORM)
        return x_new, self._matmul_q8(x8, parts, then=then)

    def add_normed_matmul(
        self,
        x: Any,
        y: Any,
        y_norm: Any,
        eps: float,
        scale: Any,
        norm: Any,
        w: QuantWeight | GroupWeight,
        then: NextInput | None = None,
    ) -> tuple[Any, Any]:
        # one token: x' and its codes as y's product coded them in its last block (NextInput.post_norm, where
        # tuning.post_epilogues asks), else the add and the coding in one launch (q8_add_normed), the numbers of
        # add_normed's and q8_input's two; a step's rows: q8_add_normed, a block a row, where one gemvn launch
        # takes them all (rows.py)
        coded, y = y if isinstance(y, Coded) else None, plain(y)
        if y_norm is not None and x.shape[0] == 1 and self._fusable(x, w):
            cp = self.xp
            parts = w.parts if isinstance(w, GroupWeight) else [w]
            c = None if coded is None else coded.then
            if coded is not None and c is not None and c.post_norm is y_norm and c.residual is x:
                if c.scale is scale and c.norm is norm and c.eps == eps:
                    return coded.x_new, self._matmul_q8(coded.x8, parts, then=then)
            if x.shape[1] <= QA_MAX_COLS:
                x = cp.ascontiguousarray(x, dtype=cp.float32)
                x_new = cp.empty_like(x)
                x8 = cp.empty(2 * x.shape[1] + x.shape[1] // 4, dtype=cp.int8)
                self._q8_add_normed(x, y, y_norm, eps, scale, norm, x_new, x8, n_token=False)
                return x_new, self._matmul_q8(x8, parts, then=then)
        if y_norm is not None and x.shape[0] > 1 and x.shape[1] <= QA_MAX_COLS:
            done = rows.add_normed_matmul(self, x, y, y_norm, eps, scale, norm, w, then)
            if done is not None:
                return done
        return NumpyBackend.add_normed_matmul(self.backend, x, y, y_norm, eps, scale, norm, w, then)

    def _q8_add_normed(
        self, x: Any, y: Any, y_norm: Any, eps: float, scale: Any, norm: Any, x_new: Any, x8: Any, n_token: bool
    ) -> None:
        """x_new = add_normed(x, y, y_norm, eps, scale) and its codes (normed by `norm` when given) into x8: a
        one-token buffer, or (n_token) the n-token layout of gemvn's input, a block a row of x."""
        cp = self.xp
        null = np.uint64(0)
        self.dev.kernel_named("q8_add_normed")(
            (x.shape[0],),
            (Q8_THREADS,),
            (
                x,
                cp.ascontiguousarray(y, dtype=cp.float32),
                cp.ascontiguousarray(y_norm, dtype=cp.float32),
                null if scale is None else cp.ascontiguousarray(scale, dtype=cp.float32),
                x_new,
                np.float32(eps),
                null if norm is None else cp.ascontiguousarray(norm, dtype=cp.float32),
                np.int32(x.shape[1]),
                x8,
                np.int64(x.shape[1]),
                np.int32(n_token),
            ),
        )

    def gated_matmul(
        self, gate_up: Any, kind: str, w: QuantWeight | GroupWeight, then: NextInput | None = None, up: Any = None
    ) -> Any:
        cp = self.xp
        coded, gate_up = gate_up if isinstance(gate_up, Coded) else None, plain(gate_up)
        if up is not None:  # rows: gated_pair, then their product; one token: q8_input takes up beside the gate
            if gate_up.shape[0] > 1 or not self._fusable(gate_up, w) or up.dtype != cp.float32 or up.strides[-1] != 4:
                return NumpyBackend.gated_matmul(self.backend, gate_up, kind, w, then, up)
            c = None if coded is None else coded.then
            if coded is not None and c is not None and c.act == kind and c.up is up:
                return self._matmul_q8(coded.x8, w.parts if isinstance(w, GroupWeight) else [w], then=then)
            gate = cp.ascontiguousarray(gate_up, dtype=cp.float32)
            x8 = self._q8_input(gate, gate.shape[1], r=up, mode=_X_GATED, act=ACTIVATIONS[kind])
            return self._matmul_q8(x8, w.parts if isinstance(w, GroupWeight) else [w], then=then)
        if gate_up.shape[0] > 1:
            return rows.gated_matmul(self, gate_up, kind, w, then, coded)
        if not self._fusable(gate_up, w):
            return NumpyBackend.gated_matmul(self.backend, gate_up, kind, w, then)
        parts = w.parts if isinstance(w, GroupWeight) else [w]
        if coded is not None and coded.then is not None and coded.then.act == kind:
            return self._matmul_q8(coded.x8, parts, then=then)  # act(gate) * up coded by the gate/up product
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        cols = gate_up.shape[1] // 2
        x8 = self._q8_input(gate_up, cols, mode=_X_GATED, act=ACTIVATIONS[kind])
        return self._matmul_q8(x8, parts, then=then)
