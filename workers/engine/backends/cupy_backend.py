"""The GPU backend on CuPy: weights stay in GGUF block layout on the device.

Products of one row (decode) run a quantized matrix-vector kernel that dequantizes in registers
(kernels/quant.cu; for Q4_K and Q6_K, int8 activations, dp4a or the tensor cores). Products of 2-64 rows
(the decode rows of a step of several streams, a short prompt) take the n-token kernel where the one-token
kernel is gemv1m, which gives every row its one-row numbers (cupy_rows.py). Products of more rows (a prompt
chunk) dequantize tiles of the weight to float32 scratch and multiply on the tensor cores through cuBLAS in
TF32: float32's range (float16 inputs overflowed to inf on the synthetic Qwen3 bench models), inputs rounded
to 10 mantissa bits, float32 accumulation. RMSNorm, RoPE, the gated activation, the KV write and attention
are one fused kernel each (kernels/ops.cu); what is left (residual adds, the float32 KV used by tests) is the
NumPy backend's code run on CuPy arrays. Decode steps and prompt chunks of the step sizes are captured as
CUDA graphs and replayed. (A second decode path, the whole step in one cooperative launch, was measured
slower and left the product: bench/NOTES.md v7.)
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from genie_common.gguf_file import TensorInfo

from ..batch import Batch
from ..kv_cache import LayerKV
from ..model_config import LayerConfig, ModelConfig, RopeMode
from . import cupy_rows
from .base import Backend, NextInput
from .capture_gemm import CaptureGemm
from .numpy_backend import NumpyBackend, dequantize_tensor
from .pdl import DependentLauncher
from .quant_consts import (
    _EP_GATED,
    _EP_NONE,
    _EP_NORM,
    _X_GATED,
    _X_NORM,
    ACTIVATIONS,
    EP_MAX_ROWS,
    MMA_MAX_THREADS,
    MMA_ROW_BYTES,
    MMA_STAGES,
    MMA_STATIC_SMEM,
    Q8_MAX_COLS,
    Q8_THREADS,
)

log = logging.getLogger(__name__)

GQA_MAX_TOKENS = 8  # attention_gqa's queries a launch (ops.cu)
GEMV1_ROWS = 4  # rows per warp of the one-token kernel, GEMV1_ROWS in quant.cu
# float32 weight scratch of the prefill path: the GPU memory bound allows no more. A captured prefill chunk keeps
# its scratch in the captures' pool, but smaller tiles there cost more than they save: 8 MiB halved the 4B's
# pp512 (15.9 k -> 8.4 k tok/s on the H200; tiles of 256 rows make the down projection's GEMMs thin)
PREFILL_SCRATCH_BYTES = 32 << 20
OCTET_TYPES = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K})  # int8-activation one-token kernels
THREADS = 256
# each module's source: kernels/ files in order (shared headers first; CuPy's disk cache keys on the text)
QUANT_SOURCES = ("common.cuh", "blocks.cuh", "quant.cu")
OPS_SOURCES = ("common.cuh", "kv_rows.cuh", "attend.cuh", "ops.cu")

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


class _Kernel:
    """A kernel of quant.cu or ops.cu, called as CuPy's RawKernel; while the backend captures a step it is
    launched with programmatic dependent launch (pdl.py), which every kernel of those files allows for by
    calling grid_dep_wait() before it touches what an earlier kernel wrote."""

    def __init__(self, raw: Any, backend: CupyBackend) -> None:
        self.raw = raw
        self._backend = backend

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0) -> None:
        b = self._backend
        if b.dependent_launch:
            assert b._pdl is not None
            b._pdl.launch(self.raw, grid, block, args, shared_mem)
        else:
            self.raw(grid, block, args, shared_mem=shared_mem)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return int(self.raw.max_dynamic_shared_size_bytes)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.raw.max_dynamic_shared_size_bytes = value


def _dependent_launcher() -> DependentLauncher | None:
    try:
        return DependentLauncher()
    except (OSError, AttributeError):  # no libcuda.so.1, or a driver before CUDA 12.0
        return None


@dataclass
class _Captured:
    """A decode step captured as a CUDA graph: replaying it recomputes `out` in place."""

    graph: Any  # its intermediates live in CupyBackend._capture_pool, never handed to eager code
    out: Any
    version: int  # the backend's buffer version it was captured against


@dataclass
class _Coded:
    """A one-token product's output that its kernel also coded as the next dp4a product's input (x8, the
    buffer q8_input writes): for the output of self_attention (then None), or as `then` asked (NextInput:
    act(gate) * up, or the residual add and norm without the RMS factor, with x_new and the group sums of
    squares ss the consumer applies it from)."""

    out: Any
    x8: Any
    then: NextInput | None = None
    x_new: Any = None
    ss: Any = None


def kernel_module(*files: str, options: tuple[str, ...] = ()) -> Any:
    """A RawModule of kernels/ files joined in order (NVRTC has no include path into the package). CuPy
    caches compiled modules on disk (~/.cupy/kernel_cache), keyed by the text: a second start compiles nothing."""
    import cupy

    kernels = resources.files(__package__).joinpath("kernels")
    code = "\n".join(kernels.joinpath(name).read_text("utf-8") for name in files)
    return cupy.RawModule(code=code, options=("-std=c++17", *options))


def cupy_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device: all mean "not available"
        return False


class CupyBackend(NumpyBackend):
    # four streams at once: a step's decode rows share one read of the weights (gemvn, cupy_rows.py) and one
    # attention launch a layer (attention_decn); 4B INT8 on the H200 (bench/NOTES.md v13)
    default_parallel = 4
    # a prompt chunk shorter than the engine's prefill_chunk is padded to the next of these and replays that
    # size's captured step: eager, a 33-token prompt's first token took 45 ms on the 4B
    step_buckets = (16, 32, 48, 64, 128, 256, 512)
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.xp = cupy
        super().__init__(block_kernels=False)  # its own kernels; the CPU ones are never built here
        self._module, self._ops = (kernel_module(*files) for files in (QUANT_SOURCES, OPS_SOURCES))
        for module in (self._module, self._ops):
            module.compile()  # now, not mid-generation: a compile failure is a start-up error
        self._kernels: dict[str, _Kernel] = {}
        self._ids = cupy.zeros(1, dtype=cupy.int64)  # staged token ids of the current step
        self._pos = cupy.zeros(1, dtype=cupy.int32)  # staged first position (the kernels read it here)
        self._step_pos = self._pos  # the one stage_inputs fills (and captured steps read)
        self._segment_pos = cupy.zeros(1, dtype=cupy.int32)  # a step of several segments: each one's first position
        self._logit_rows = cupy.zeros(1, dtype=cupy.int64)  # the rows whose logits a step returns (take_rows)
        self._dec = cupy.zeros(3, dtype=cupy.int32)  # a step's one-token segments: rows, slots, positions
        self._done = cupy.zeros(1024, dtype=cupy.int32)  # split-K attention's per-row merge counters
        self._argmax_buf: tuple[Any, ...] | None = None
        self._capturing = False
        self._version = 0  # bumped whenever a buffer captured steps read (ids, RoPE tables) is replaced
        self.use_graphs = True
        self.capture_prefill = True  # full prefill chunks as graphs too (the engine says which shapes repeat)
        self._capture_gemm: CaptureGemm | None = None
        # Every captured step allocates from this one pool, never from the default one, so nothing eager is ever
        # handed a buffer a graph writes. One pool for all of them: the steps replay one at a time on one stream,
        # and each reads only its own intermediates, written earlier in the same replay; its output stays
        # allocated while the step exists. So a step may reuse another's intermediates, and the pool holds the
        # largest step (a 4B prefill chunk of 512 tokens, ~0.2 GiB) rather than the sum of all of them. The
        # price: a replayed step's output is valid until the next step runs (the engine samples it at once).
        self._capture_pool = cupy.cuda.MemoryPool()
        # and one stream to capture on: CuPy's pool hands a freed block only to allocations on the stream it was
        # freed on, so a new stream per capture would share nothing
        self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        self.n_sm = int(props["multiProcessorCount"])
        # the kernel paths of this capability; GENIE_CUDA_COMPAT (sm87, 8.7) takes an older GPU's on a newer one
        self.capability = compat_capability((int(props["major"]), int(props["minor"])), os.environ.get(COMPAT_ENV))
        hopper = self.capability >= (9, 0)
        self._device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        # programmatic dependent launch in captured steps (pdl.py): compute capability 9.0 and later
        self.use_pdl = True
        # the one-token GEMVs' rows per warp: as many as keep this many blocks per SM, at most this many
        self.gemv_blocks_per_sm = 2
        self.gemv_max_rows = GEMV1_ROWS
        self.gemv_split_warps = 32  # rows split over warps below this many warps per SM (0: never split)
        self.pf_warps = PF_WARPS  # the prefill attention's warps a block (16 query rows each), as ops.cu is built
        self._pdl = _dependent_launcher() if hopper else None
        # thread-block clusters (compute capability 9.0 and later): one-token attention as attention_dec
        self._clusters = hopper
        self.use_clusters = True
        self.use_decode_rows = True  # a step's one-token segments' attention in one launch (attention_decn)
        self.dec_max_warps = 16  # DEC_MAX_WARPS of ops.cu as built: 8 gives every size two tasks' loads in flight
        self._coded: _Coded | None = None  # the last product's output coded for its consumer, until one takes it
        self._late_out: Any = None  # the last rows product's output, when its consumer codes it late (cupy_rows.py)
        self._ep_cnt = cupy.zeros(1024, dtype=cupy.int32)  # the product epilogues' group counters (quant.cu)
        self.use_epilogues = True  # NextInput hints coded by the producing kernel (off: q8_input launches)
        # one-token Q4_K/Q6_K products on the tensor cores, weights streamed by bulk copies (gemv1m): compute
        # capability 9.0 (gemv1q, dp4a, elsewhere)
        self._mma = hopper
        self.use_mma = True
        self.mma_threads = 256
        self.mma_blocks_per_sm = 2
        self.mma_stages = MMA_STAGES  # MMA_STAGES of quant.cu as built
        self.gemvn_groups = 2  # groups of four tokens a block of the n-token product (1, 2 or 4: gemvn{1,2,4}_*)
        self._smem_per_sm = int(props["sharedMemPerMultiprocessor"])

    @property
    def device_name(self) -> str:
        forced = f", {COMPAT_ENV}={self.capability[0]}.{self.capability[1]}" if os.environ.get(COMPAT_ENV) else ""
        return f"cupy ({self._device_name}{forced})"

    def _kernel(self, op: str, qtype: GGMLQuantizationType) -> _Kernel:
        return self._kernel_named(f"{op}_{KERNEL_TYPES[qtype]}")

    def _kernel_named(self, name: str) -> _Kernel:
        if name not in self._kernels:
            self._kernels[name] = _Kernel(self._module.get_function(name), self)
        return self._kernels[name]

    def _op(self, name: str) -> _Kernel:
        if name not in self._kernels:
            self._kernels[name] = _Kernel(self._ops.get_function(name), self)
        return self._kernels[name]

    @property
    def dependent_launch(self) -> bool:
        """Whether the kernels of a step being captured are launched with programmatic dependent launch."""
        return self._capturing and self.use_pdl and self._pdl is not None

    def unsupported(self, cfg: ModelConfig) -> str | None:
        for i, lc in enumerate(cfg.layers):
            problem = _head_dims_problem(lc.head_dim, lc.v_head_dim)
            if problem:
                return f"layer {i}: {problem}"
        return None

    # -- memory -------------------------------------------------------------------------------------
    def weight_bytes(self, tensors: list[TensorInfo], matrix: bool) -> int:
        return Backend.weight_bytes(self, tensors, matrix)  # GGUF blocks as stored (not NumPy's int8 rows)

    def free_memory(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0])

    def release_memory(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()
        self.xp.get_default_pinned_memory_pool().free_all_blocks()

    def scratch_bytes(self, cfg: ModelConfig, prefill_chunk: int, n_slots: int) -> tuple[int, int]:
        # a step's arrays, once more for the pool the captured steps allocate from, and the prefill GEMM's
        # dequantized tile; attention keeps no per-key scores (flash-style kernels)
        acts, _ = Backend.scratch_bytes(self, cfg, prefill_chunk, n_slots)
        return 2 * acts + PREFILL_SCRATCH_BYTES, 0

    # -- weights --------------------------------------------------------------------------------------
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

    # -- kernels -------------------------------------------------------------------------------------
    def dequant_into(self, w: QuantWeight, out: Any, ids: Any = None, scale: float = 1.0) -> Any:
        """out[i] = scale * row ids[i] of w (every row when ids is None), float32."""
        n_rows = w.rows if ids is None else int(ids.shape[0])
        n_sub = n_rows * (w.cols // 32)
        blocks = (n_sub + THREADS - 1) // THREADS
        ids_arg = ids if ids is not None else np.uint64(0)
        self._kernel("dequant", w.qtype)(
            (blocks,),
            (THREADS,),
            (w.data, ids_arg, out, np.int32(n_rows), np.int32(w.cols), np.int64(w.row_bytes), np.float32(scale)),
        )
        return out

    def gemv1_into(self, x: Any, w: QuantWeight, out: Any) -> Any:
        """out[r] = (x @ w.T)[0, r] for one token (decode): dp4a on int8 activations for Q4_K/Q6_K, else x
        staged in shared memory as float32."""
        assert x.shape == (1, w.cols) and x.flags.c_contiguous
        if w.qtype in OCTET_TYPES and w.cols <= Q8_MAX_COLS:
            self._gemv1q(w, self._q8_input(x, w.cols), out)
            return out
        kernel = self._kernel("gemv1", w.qtype)
        smem = w.cols * 4
        if smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem  # opt in past the default 48 KiB (Hopper: 227 KiB)
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
        # several rows per warp share the x registers, but only where the grid still gives every SM two
        # blocks: measured on the H200, 4 rows per warp everywhere lifted 4B decode 14 % and cost 0.6B 15 %
        return max(1, min(self.gemv_max_rows, w.rows // (THREADS // 32 * self.gemv_blocks_per_sm * self.n_sm)))

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
        self._kernel_named("q8_input")(
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
                np.int64(0),
                null,
            ),
        )
        return x8

    def _mma_tiles(self, w: QuantWeight, x8: Any, then: NextInput | None) -> int:
        """Tiles of 16 rows a block of gemv1m (quant.cu: Q4_K and Q6_K on the tensor cores) takes for w, or 0
        where that kernel does not apply: compute capability 9.0, 16-byte aligned weights and x8."""
        if not (self._mma and self.use_mma) or w.qtype not in MMA_ROW_BYTES:
            return 0
        if w.data.data.ptr % 16 or x8.data.ptr % 16 or w.rows * w.row_bytes % 16:  # no copy past the end
            return 0
        tiles = -(-w.rows // 16)
        per_block = -(-tiles // (self.n_sm * self._mma_shape(w)[0]))
        return 0 if then is not None and 16 * per_block > EP_MAX_ROWS else per_block

    def _mma_shape(self, w: QuantWeight) -> tuple[int, int, int]:
        """gemv1m's blocks an SM, threads a block and dynamic shared memory for w: mma_blocks_per_sm blocks of
        mma_threads where their rings fit an SM, else fewer blocks of more threads (the same warps an SM)."""
        smem = self.mma_stages * 16 * MMA_ROW_BYTES[w.qtype] + 2 * w.cols + w.cols // 4  # the ring, x8
        if w.qtype == GGMLQuantizationType.Q6_K:
            smem += w.cols // 2  # x8's 16-value sums of codes
        fit = self._smem_per_sm // (smem + MMA_STATIC_SMEM)
        blocks = max(1, min(self.mma_blocks_per_sm, fit))
        return blocks, min(MMA_MAX_THREADS, self.mma_threads * self.mma_blocks_per_sm // blocks), smem

    def _row_split(self, w: QuantWeight) -> int:
        """Warps a row of the dp4a GEMV is split over (a power of two, at most a block's 8): a matrix of too
        few rows to give every SM gemv_split_warps warps takes more warps a row, while each warp's slice keeps
        a unit (256 values) for each of its 4 octets."""
        want = self.gemv_split_warps * self.n_sm
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
    ) -> _Coded | None:
        """out = w @ x for x coded in x8 (times its RMS factor from the group sums of squares norm_ss, when
        given); with `then`, the kernel's epilogue codes the consumer's input (see _Coded), which it returns.
        `alone`: the `then` this row would have alone, when it differs (the rows path: the same kernel)."""
        mma_tiles = self._mma_tiles(w, x8, then if alone is None else alone)
        ks = self._row_split(w)
        rows_per_warp = self._rows_per_warp(w) if ks == 1 else 1
        rows_per_block = 16 * mma_tiles or THREADS // 32 // ks * rows_per_warp
        null = np.uint64(0)
        mode, act, coded = _EP_NONE, 0, None
        if then is not None:
            len_ = w.rows // 2 if then.act is not None else w.rows
            assert rows_per_block <= EP_MAX_ROWS and len_ % 32 == 0  # EP_MAX_GROUPS in quant.cu
            cp = self.xp
            coded = _Coded(out, cp.empty(2 * len_ + len_ // 4, dtype=cp.int8), then)
            if then.act is not None:
                mode, act = _EP_GATED, ACTIVATIONS[then.act]
            else:
                mode = _EP_NORM
                coded.x_new = cp.empty((1, len_), dtype=cp.float32)
                coded.ss = cp.empty(len_ // 32, dtype=cp.float32)
            if self._ep_cnt.size < len_ // 32:  # zero between launches (the coding blocks reset them)
                self._ep_cnt = cp.zeros(len_ // 32, dtype=cp.int32)
                self._version += 1  # captured steps hold the old counters
        residual = None if then is None else then.residual
        grid = ((w.rows + rows_per_block - 1) // rows_per_block,)
        if mma_tiles:
            kernel = self._kernel("gemv1m", w.qtype)
            _, threads, smem = self._mma_shape(w)
            if smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < smem:
                kernel.max_dynamic_shared_size_bytes = smem
            head: tuple = (w.data, x8, out, np.int32(w.rows), np.int32(w.cols), np.int32(mma_tiles))
            launch = partial(kernel, grid, (threads,), shared_mem=smem)
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
            launch = partial(self._kernel("gemv1q", w.qtype), grid, (THREADS,))
        launch(
            (
                *head,
                null if norm_ss is None else norm_ss,
                np.int32(0 if norm_ss is None else norm_ss.size),
                np.float32(eps),
                np.int32(mode),
                np.int32(act),
                null if coded is None else coded.x8,
                self._ep_cnt,
                null if residual is None else residual,
                null if mode != _EP_NORM else then.norm,  # type: ignore[union-attr]
                null if coded is None or coded.x_new is None else coded.x_new,
                null if coded is None or coded.ss is None else coded.ss,
            ),
        )
        return coded

    def _epilogue_for(self, then: NextInput | None, parts: list[QuantWeight]) -> NextInput | None:
        """`then` where one product's kernel can code its consumer's input: a single matrix whose output (act:
        each half) is whole 32-value groups; a norm's residual and weight float32 vectors of the output's size."""
        if then is None or not self.use_epilogues or len(parts) != 1:
            return None
        rows = parts[0].rows
        if then.act is not None:
            return then if rows % 64 == 0 and then.act in ACTIVATIONS else None
        cp = self.xp
        if then.norm is None or rows % 32 or then.norm.size != rows or then.norm.dtype != cp.float32:
            return None
        res = then.residual  # a row of it a row of the output (the rows path asks this for one row of many)
        if res is not None and (res.shape[-1] != rows or res.dtype != cp.float32 or not res.flags.c_contiguous):
            return None
        return then if then.norm.flags.c_contiguous else None

    def _matmul_part(self, x: Any, w: QuantWeight, out: Any, col0: int) -> None:
        if x.shape[0] == 1:
            self.gemv1_into(x, w, out[0, col0:])
        else:  # a short prompt too: the few-token GEMV made an 8-token prompt's first token 128 ms on the 4B
            self._prefill_matmul(x, w, out, col0)

    def _prefill_matmul(self, x: Any, w: QuantWeight, out: Any, col0: int) -> None:
        """out[:, col0:col0 + w.rows] = x @ w.T on the tensor cores: a tile of rows at a time is
        dequantized to bounded float32 scratch, then one cuBLAS TF32 GEMM writes the tile's columns of
        `out` in place."""
        cp = self.xp
        from cupy_backends.cuda.libs import cublas

        n, k = x.shape
        tile = max(256, PREFILL_SCRATCH_BYTES // (w.cols * 4))
        scratch = cp.empty((min(tile, w.rows), w.cols), dtype=cp.float32)
        handle = cp.cuda.device.get_cublas_handle()
        gemm: Callable[..., None]
        if self._capturing:  # CuPy refuses cuBLAS calls now; _capture set the handle's stream (capture_gemm.py)
            if self._capture_gemm is None:
                self._capture_gemm = CaptureGemm(handle)
            gemm = self._capture_gemm
        else:
            cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
            gemm = partial(cublas.gemmEx, handle)
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        ldo = out.shape[1]
        for r0 in range(0, w.rows, tile):
            rows = min(tile, w.rows - r0)
            part = QuantWeight(w.data[r0 * w.row_bytes : (r0 + rows) * w.row_bytes], w.qtype, rows, w.cols)
            dense = self.dequant_into(part, scratch[:rows])
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
                _CUBLAS_COMPUTE_32F_FAST_TF32,
                _CUBLAS_GEMM_DEFAULT,
            )

    def matmul(self, x: Any, weight: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        if x.shape[0] == 1:
            return self._one_matmul(x, weight, then)
        return cupy_rows.matmul(self, x, weight, then)  # a step's rows, or a prompt chunk (cupy_rows.py)

    def _one_matmul(self, x: Any, weight: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        cp = self.xp
        coded, self._coded = self._coded, None
        given = x
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        parts = weight.parts if isinstance(weight, GroupWeight) else [weight]
        if self._fusable(x, weight):  # one token, dp4a types: x quantized once for every part
            if coded is not None and coded.out is given and coded.then is None:  # coded as it was written
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
            coded = self._gemv1q(part, x8, out[0, col0:], norm_ss, eps, then)
            col0 += part.rows
        if then is not None:
            assert coded is not None
            coded.out = out  # the consumer is handed `out` itself, not the part's view
            self._coded = coded
        return out

    def _take_coded(self) -> _Coded | None:
        coded, self._coded = self._coded, None
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
        cp = self.xp
        coded = self._take_coded()
        if x.shape[0] > 1:
            return cupy_rows.add_norm_matmul(self, x, r, norm, eps, w, then)
        if not self._fusable(x, w):
            return super().add_norm_matmul(x, r, norm, eps, w, then)
        parts = w.parts if isinstance(w, GroupWeight) else [w]
        c = None if coded is None else coded.then
        same = c is not None and c.norm is norm and c.residual is x and c.eps == eps
        if coded is not None and same and coded.out is r:
            return coded.x_new, self._matmul_q8(coded.x8, parts, coded.ss, eps, then)  # the producer coded it
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        if r is not None:
            r = cp.ascontiguousarray(r, dtype=cp.float32)
        x_new = x if r is None else cp.empty_like(x)
        x8 = self._q8_input(x, x.shape[1], r, norm, None if r is None else x_new, eps, _X_NORM)
        return x_new, self._matmul_q8(x8, parts, then=then)

    def gated_matmul(self, gate_up: Any, kind: str, w: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        cp = self.xp
        coded = self._take_coded()
        if gate_up.shape[0] > 1:
            return cupy_rows.gated_matmul(self, gate_up, kind, w, then)
        if not self._fusable(gate_up, w):
            return super().gated_matmul(gate_up, kind, w, then)
        parts = w.parts if isinstance(w, GroupWeight) else [w]
        if coded is not None and coded.out is gate_up and coded.then is not None and coded.then.act == kind:
            return self._matmul_q8(coded.x8, parts, then=then)  # act(gate) * up coded by the gate/up product
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        cols = gate_up.shape[1] // 2
        x8 = self._q8_input(gate_up, cols, mode=_X_GATED, act=ACTIVATIONS[kind])
        return self._matmul_q8(x8, parts, then=then)

    def _attention_gqa(
        self, q: Any, kv: LayerKV, slot: int, window: int, scale: float, softcap: float, out: Any, group: int, dpl: int
    ) -> Any:
        """Decode attention, a block per (token, KV head) and split: attention_gqa_{group}_{dpl} in ops.cu."""
        cp = self.xp
        n, heads, hd = q.shape
        n_kv = heads // group
        blocks = n * n_kv
        n_splits = 1 if blocks >= 2 * self.n_sm else min(ATTENTION_MAX_SPLITS, -(-2 * self.n_sm // blocks))
        null = np.uint64(0)
        part_m = part_l = part_acc = null
        if n_splits > 1:
            part_m = cp.empty(n * heads * n_splits, dtype=cp.float32)
            part_l = cp.empty(n * heads * n_splits, dtype=cp.float32)
            part_acc = cp.empty(n * heads * n_splits * hd, dtype=cp.float32)
            if self._done.size < blocks:
                self._done = cp.zeros(blocks, dtype=cp.int32)
                self._version += 1
        self._op(f"attention_gqa_{group}_{dpl}")(
            (blocks, n_splits),
            (32 * ATTENTION_WARPS,),
            (
                q,
                kv.k[slot],
                kv.v[slot],
                null if kv.k_scale is None else kv.k_scale[slot],
                null if kv.v_scale is None else kv.v_scale[slot],
                out,
                part_m,
                part_l,
                part_acc,
                self._done,
                np.int32(heads),
                np.int32(n_kv),
                np.int32(hd & -hd),
                self._pos,
                np.int32(window),
                np.float32(scale),
                np.float32(softcap),
            ),
        )
        return out

    def prepare_qkv(
        self,
        qkv: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Any:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return super().prepare_qkv(qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        n = qkv.shape[0]
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        table = self._rope_table(lc.rope_base, lc.rope_scale, lc.rope_dim, int(positions[-1]) + 1, lc.rope_freq_factors)
        null = np.uint64(0)
        self._op("qkv_post")(
            (n, H + 2 * Hkv),
            (_threads(max(hd, hdv)),),
            (
                qkv,
                np.int32(H),
                np.int32(Hkv),
                np.int32(hd),
                np.int32(hdv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                np.int32(cfg.v_norm),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self._pos,
                kv.k[slot],
                kv.v[slot],
                null if kv.k_scale is None else kv.k_scale[slot],
                null if kv.v_scale is None else kv.v_scale[slot],
                np.int32(hd & -hd),
                np.int32(hdv & -hdv),
            ),
            shared_mem=max(hd, hdv) * 4,
        )
        return qkv[:, : (H + Hkv) * hd].reshape(n, H + Hkv, hd)[:, :H]

    def self_attention(
        self,
        qkv: Any,
        cfg: ModelConfig,
        lc: LayerConfig,
        qk_norm: Any,
        positions: np.ndarray,
        kv: LayerKV,
        slot: int,
        pos0: int,
    ) -> Any:
        """One token on Hopper and later: q/k norm, RoPE, the K/V store and attention in one launch of
        attention_dec (ops.cu: a cluster of blocks per KV head, merged in distributed shared memory), which also
        codes its output as the dp4a products' input: `matmul` of this very array uses that code (so the array
        must not be changed in place before it; layers.forward only multiplies it)."""
        cp = self.xp
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        group = H // Hkv
        if qkv.shape[0] != 1 or not self._dec_kernel_takes(cfg, lc, kv):
            return super().self_attention(qkv, cfg, lc, qk_norm, positions, kv, slot, pos0)
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        table = self._rope_table(lc.rope_base, lc.rope_scale, lc.rope_dim, int(positions[-1]) + 1, lc.rope_freq_factors)
        out = cp.empty((1, H * hdv), dtype=cp.float32)
        cols = H * hdv
        # the o product's input, coded by the kernel as q8_input would (matmul takes it for `out` itself)
        x8 = cp.empty(2 * cols + cols // 4, dtype=cp.int8) if cols <= Q8_MAX_COLS else None
        self._coded = None if x8 is None else _Coded(out, x8)
        null = np.uint64(0)
        self._op(f"attention_dec_{group}_{hd // 32}")(
            (Hkv * ATTENTION_CLUSTER,),
            (32 * _dec_warps(group, hd // 32, self.dec_max_warps),),
            (
                qkv,
                kv.k[slot],
                kv.v[slot],
                null if kv.k_scale is None else kv.k_scale[slot],
                null if kv.v_scale is None else kv.v_scale[slot],
                out,
                null if x8 is None else x8,
                np.int32(H),
                np.int32(Hkv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self._pos,
                np.int32(lc.sliding_window),
                np.float32(cfg.attn_scale),
                np.float32(cfg.attn_logit_softcap),
            ),
        )
        return out

    def _dec_kernel_takes(self, cfg: ModelConfig, lc: LayerConfig, kv: LayerKV) -> bool:
        """attention_dec (a cluster a KV head, Hopper) runs this layer's one-token attention."""
        H, Hkv, hd, hdv = cfg.n_heads, lc.n_kv_heads, lc.head_dim, lc.v_head_dim
        return (
            self.use_clusters
            and self._clusters
            and kv.k.dtype != self.xp.float32
            and hd == hdv
            and hd % 32 == 0
            and (H // Hkv, hd // 32) in DEC_KERNELS
            and not cfg.v_norm
            and (cfg.rope_mode != "neox" or lc.rope_dim // 2 & (lc.rope_dim // 2 - 1) == 0)
        )

    def decode_attention(
        self, qkv: Any, cfg: ModelConfig, lc: LayerConfig, qk_norm: Any, kv: LayerKV, batch: Batch
    ) -> Any:
        """Every one-token segment's attention_dec in one launch (attention_decn: a row of clusters a segment,
        its row, slot and position from the buffer stage_batch filled), written into its row of the output."""
        cp = self.xp
        if not (self.use_decode_rows and self._dec_kernel_takes(cfg, lc, kv)):
            return None
        n_dec = sum(1 for s in batch.segments if s.n == 1)
        H, Hkv, hd = cfg.n_heads, lc.n_kv_heads, lc.head_dim
        group = H // Hkv
        qkv = cp.ascontiguousarray(qkv, dtype=cp.float32)
        last = max(s.pos0 for s in batch.segments if s.n == 1)
        table = self._rope_table(lc.rope_base, lc.rope_scale, lc.rope_dim, last + 1, lc.rope_freq_factors)
        out = cp.empty((qkv.shape[0], H * hd), dtype=cp.float32)
        null = np.uint64(0)
        self._op(f"attention_decn_{group}_{hd // 32}")(
            (Hkv * ATTENTION_CLUSTER, n_dec),
            (32 * _dec_warps(group, hd // 32, self.dec_max_warps),),
            (
                qkv,
                kv.k,
                kv.v,
                null if kv.k_scale is None else kv.k_scale,
                null if kv.v_scale is None else kv.v_scale,
                out,
                np.int32(H),
                np.int32(Hkv),
                null if qk_norm is None else cp.ascontiguousarray(qk_norm),
                np.float32(cfg.rms_eps),
                table.cos,
                table.sin,
                np.int32(lc.rope_dim),
                np.int32(cfg.rope_mode == "neox"),
                self._dec,
                np.int32(n_dec),
                np.int64(kv.k.strides[0]),
                np.int64(0 if kv.k_scale is None else kv.k_scale.strides[0] // 4),
                np.int32(lc.sliding_window),
                np.float32(cfg.attn_scale),
                np.float32(cfg.attn_logit_softcap),
            ),
        )
        return out

    def embed(self, weight: QuantWeight, ids: Any, scale: float) -> Any:
        cp = self.xp
        dev_ids = ids if isinstance(ids, cp.ndarray) else cp.asarray(np.asarray(ids, dtype=np.int64))
        return self.dequant_into(weight, cp.empty((len(ids), weight.cols), dtype=cp.float32), dev_ids, scale)

    # -- steps and CUDA graphs ---------------------------------------------------------------------------
    def rope_table(self, base: float, scale: float, rope_dim: int, n_pos: int) -> Any:
        """The cos/sin tables [>= n_pos, rope_dim / 2] on the device (replacing one bumps `buffer_version`)."""
        return self._rope_table(base, scale, rope_dim, n_pos)

    def staged_inputs(self) -> tuple[Any, Any]:
        """The device buffers stage_inputs fills: token ids (int64) and the first position (int32)."""
        return self._ids, self._pos

    @property
    def buffer_version(self) -> int:
        """Bumped whenever a buffer that captured steps point to is replaced."""
        return self._version

    def stage_batch(self, batch: Batch) -> Any:
        ids = super().stage_batch(batch)
        if self._capturing:
            return ids
        n, k = len(batch.segments), len(batch.logit_rows)
        if n > 1:  # each segment's position, in one copy: stage_segment points at them
            self._segment_pos = self._staged(self._segment_pos, np.array([s.pos0 for s in batch.segments], np.int32))
            # the one-token segments' rows, slots and positions, for decode_attention
            dec = [(batch.rows(j).start, s.slot, s.pos0) for j, s in enumerate(batch.segments) if s.n == 1]
            if dec:
                self._dec = self._staged(self._dec, np.array(dec, np.int32).T.reshape(-1))
        if k:
            self._logit_rows = self._staged(self._logit_rows, batch.logit_rows.astype(np.int64))
        return ids

    def _staged(self, buffer: Any, values: np.ndarray) -> Any:
        """`values` copied into the front of `buffer` (grown when short: captured steps read the old one)."""
        if buffer.size < values.size:
            buffer = self.xp.zeros(max(values.size, 2 * buffer.size), dtype=buffer.dtype)
            self._version += 1
        buffer[: values.size].set(values)
        return buffer

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        return x[self._logit_rows[: len(rows)]]

    def stage_segment(self, i: int | None) -> None:
        self._pos = self._step_pos if i is None else self._segment_pos[i : i + 1]

    def stage_inputs(self, ids: np.ndarray, pos0: int) -> Any:
        cp = self.xp
        n = len(ids)
        if not self._capturing:  # while capturing, the graph reads whatever the buffers hold at replay
            if self._ids.shape[0] < n:
                self._ids = cp.zeros(max(n, 2 * self._ids.shape[0]), dtype=cp.int64)
                self._version += 1  # captured steps read the old buffer
            self._ids[:n].set(np.ascontiguousarray(ids, dtype=np.int64))
            self._pos.set(np.array([pos0], dtype=np.int32))
        return self._ids[:n]

    def forward_step(
        self,
        steps: dict[Hashable, Any],
        key: Hashable,
        run: Callable[[], Any],
        batch: Batch,
        capturable: bool,
    ) -> Any:
        cp = self.xp
        prefill = any(s.n > 1 for s in batch.segments)
        if not (self.use_graphs and capturable) or (prefill and not self.capture_prefill):
            return run()
        if max(s.pos0 + s.n for s in batch.segments) > self._rope_limit():
            return run()
        captured = steps.get(key)
        if captured is False:  # its capture failed once: eager from now on
            return run()
        if captured is None or captured.version != self._version:
            out = run()  # eagerly once: compiles kernels, builds tables, computes this step
            try:
                steps[key] = self._capture(run)
            except (cp.cuda.runtime.CUDARuntimeError, NotImplementedError, RuntimeError, MemoryError) as e:
                # a pass that syncs with the host or calls a library that refuses capture, or no memory left
                # for the graph's own: it stays eager (the eager pass above has computed this step)
                log.warning("event=capture_failed key=%s: %s; running it eagerly", key, e)
                steps[key] = False
            return out
        self.stage_batch(batch)
        captured.graph.launch(stream=cp.cuda.get_current_stream())
        return captured.out

    def _capture(self, run: Callable[[], Any]) -> _Captured:
        cp = self.xp
        pool, stream = self._capture_pool, self._capture_stream
        self._capturing = True
        try:
            with cp.cuda.using_allocator(pool.malloc), stream:
                from cupy_backends.cuda.libs import cublas

                # the prefill GEMMs' stream, set while CuPy still allows it (capture_gemm.py)
                cublas.setStream(cp.cuda.device.get_cublas_handle(), stream.ptr)
                stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    out = run()
                finally:
                    graph = stream.end_capture()
        finally:
            self._capturing = False
            self._coded = None  # no eager product may take a code the graph writes
        return _Captured(graph, out, self._version)

    def _rope_limit(self) -> int:
        """Positions every RoPE table covers: a replay past it must run eagerly (and grow the tables)."""
        return min((t.cos.shape[0] for t in self._rope_tables.values()), default=0)

    def _rope_table(
        self, base: float, scale: float, rope_dim: int, n_pos: int, freq_factors: tuple[float, ...] | None = None
    ) -> Any:
        before = self._rope_tables.get((base, scale, rope_dim, freq_factors))  # the key NumpyBackend files it under
        table = super()._rope_table(base, scale, rope_dim, n_pos, freq_factors)
        if before is not None and table is not before:
            self._version += 1  # captured steps read the replaced table
        return table

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

    # -- fused layer operations (kernels/ops.cu) ----------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        d = x.shape[-1]
        y = cp.empty_like(x)
        self._op("rms_norm")(
            (x.size // d,),
            (_threads(d),),
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
            (x.size // d,), (_threads(d),), (x, r, cp.ascontiguousarray(weight), y, np.int32(d), np.float32(eps))
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

    def kv_write(self, kv: LayerKV, slot: int, pos0: int, k: Any, v: Any) -> None:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return super().kv_write(kv, slot, pos0, k, v)
        k = cp.ascontiguousarray(k, dtype=cp.float32)
        v = cp.ascontiguousarray(v, dtype=cp.float32)
        n, heads, hd = k.shape
        hdv = v.shape[2]
        null = np.uint64(0)
        self._op("kv_write")(
            (n * heads, 2),  # y: K, then V
            (_threads(max(hd, hdv)),),
            (
                k,
                v,
                kv.k[slot],
                kv.v[slot],
                kv.k_scale[slot] if kv.k_scale is not None else null,
                kv.v_scale[slot] if kv.v_scale is not None else null,
                np.int32(heads),
                np.int32(hd),
                np.int32(hdv),
                np.int32(hd & -hd),
                np.int32(hdv & -hdv),
                self._pos,
            ),
            shared_mem=max(hd, hdv) * 4,
        )

    def attention(self, q: Any, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float) -> Any:
        cp = self.xp
        if kv.k.dtype == cp.float32:
            return super().attention(q, kv, slot, pos0, window, scale, softcap)
        q = cp.ascontiguousarray(q, dtype=cp.float32)
        n, heads, hd = q.shape
        n_kv, hdv = kv.k.shape[2], kv.v.shape[3]
        problem = _head_dims_problem(hd, hdv)
        if problem:
            raise ValueError(problem)
        out = cp.empty((n, heads * hdv), dtype=cp.float32)
        null = np.uint64(0)
        k_scale = null if kv.k_scale is None else kv.k_scale[slot]
        v_scale = null if kv.v_scale is None else kv.v_scale[slot]
        group = heads // n_kv
        pf_rows = 16 * self.pf_warps
        if n >= PREFILL_ATTENTION_MIN_TOKENS and hd == hdv and hd in PF_HEAD_DIMS and pf_rows % group == 0:
            kernel = self._op(f"attention_prefill_{hd}")
            smem = _prefill_attention_smem(hd, pf_rows)
            if smem > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < smem:
                kernel.max_dynamic_shared_size_bytes = smem
            kernel(
                (-(-n // (pf_rows // group)), n_kv),
                (32 * self.pf_warps,),
                (
                    q,
                    kv.k[slot],
                    kv.v[slot],
                    k_scale,
                    v_scale,
                    out,
                    np.int32(n),
                    np.int32(heads),
                    np.int32(n_kv),
                    np.int32(hd & -hd),
                    self._pos,
                    np.int32(window),
                    np.float32(scale),
                    np.float32(softcap),
                ),
                shared_mem=smem,
            )
            return out
        dpl = hd // 32
        if n <= GQA_MAX_TOKENS and hd == hdv and hd % 32 == 0 and (group, dpl) in GQA_KERNELS:
            return self._attention_gqa(q, kv, slot, window, scale, softcap, out, group, dpl)
        rows = n * heads
        # split-K when the rows alone cannot fill the GPU (decode): each split takes a share of the keys
        n_splits = 1 if rows >= 2 * self.n_sm else min(ATTENTION_MAX_SPLITS, -(-2 * self.n_sm // rows))
        part_m = part_l = part_acc = null
        if n_splits > 1:
            part_m = cp.empty(rows * n_splits, dtype=cp.float32)
            part_l = cp.empty(rows * n_splits, dtype=cp.float32)
            part_acc = cp.empty(rows * n_splits * hdv, dtype=cp.float32)
            if self._done.size < rows:  # the merge counters: zero between launches (the kernel resets them)
                self._done = cp.zeros(rows, dtype=cp.int32)
                self._version += 1  # captured steps hold the old counters
        blk = hd & -hd
        self._op("attention")(
            (rows, n_splits),
            (32 * ATTENTION_WARPS,),
            (
                q,
                kv.k[slot],
                kv.v[slot],
                k_scale,
                v_scale,
                out,
                part_m,
                part_l,
                part_acc,
                self._done,
                np.int32(heads),
                np.int32(n_kv),
                np.int32(hd),
                np.int32(hdv),
                np.int32(blk),
                np.int32(hdv & -hdv),
                self._pos,
                np.int32(window),
                np.float32(scale),
                np.float32(softcap),
            ),
        )
        return out


ARGMAX_BLOCKS, ARGMAX_THREADS = 64, 1024  # argmax_row's grid: the last block reduces one partial per thread
# cuBLAS / CUDA enums (cublas_api.h, library_types.h): gemmEx's data and compute types
_CUDA_R_32F = 0
_CUBLAS_COMPUTE_32F_FAST_TF32 = 77
_CUBLAS_GEMM_DEFAULT = -1
ATTENTION_WARPS = 8  # ATT_WARPS in ops.cu
ATTENTION_MAX_HEAD_DIM = 512  # MAX_HD in ops.cu
ATTENTION_MAX_SPLITS = 32
ATTENTION_CLUSTER = 8  # ATT_CL in ops.cu: blocks a KV head of attention_dec
# the GQA decode kernels (attention_gqa_G_DPL in ops.cu): (query heads per KV head, head dim / 32)
GQA_KERNELS = frozenset({(g, d) for g in (1, 2, 4, 8) for d in (2, 4, 8)} - {(8, 8)})
DEC_KERNELS = GQA_KERNELS - {(8, 4)}  # attention_dec's (group, head dim / 32): a warp a query head, the key, the value
# the tensor-core prefill kernel (attention_prefill in ops.cu): from this many tokens a pass
PREFILL_ATTENTION_MIN_TOKENS = 16
PF_WARPS, PF_KEYS = 4, 64  # as in ops.cu (PF_WARPS: its default; ops.cu takes -DPF_WARPS)
PF_HEAD_DIMS = frozenset({16, 32, 64, 128, 256})  # its instantiations (K and V head dims equal)


COMPAT_ENV = "GENIE_CUDA_COMPAT"


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


def _dec_warps(group: int, dpl: int, most: int = 16) -> int:
    """Warps a block of attention_dec_{group}_{dpl}: DEC_WARPS in ops.cu (most: DEC_MAX_WARPS)."""
    return 16 if group * dpl <= 16 and dpl <= 4 and (most >= 16 or group + 2 > 8) else 8


def _head_dims_problem(hd: int, hdv: int) -> str | None:
    """Why the attention kernels (ops.cu) cannot take these K/V head dims, or None."""
    if max(hd, hdv) > ATTENTION_MAX_HEAD_DIM or hd % 16 or hdv % 4:
        return (
            f"head dims {hd}/{hdv} (the GPU attention kernels take K head dims that are multiples of 16 and"
            f" V head dims that are multiples of 4, up to {ATTENTION_MAX_HEAD_DIM})"
        )
    return None


def _prefill_attention_smem(hd: int, rows: int) -> int:
    """attention_prefill's dynamic shared memory: Q, the K tile and the transposed V tile in FP16, scales."""
    return 2 * rows * (hd + 8) + 2 * PF_KEYS * (hd + 8) + 2 * hd * (PF_KEYS + 8) + 4 * 2 * PF_KEYS


def _threads(d: int) -> int:
    """Threads for a one-block-per-row kernel: a multiple of 32, at most 1024."""
    return min(1024, max(32, (d + 31) // 32 * 32))
