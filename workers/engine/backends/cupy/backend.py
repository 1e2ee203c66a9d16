"""The CuPy backend, composed of its parts: the device every part shares (core.py: kernels, the staged position and
slot, the buffers captured steps read), the weights, the products, attention, the other layer operations, and the
staged and captured steps. It is the NumPy backend run on CuPy arrays wherever a part has no kernel of its own: the
parts fall back to its compositions, which call back into the parts' kernels. Each Backend method hands its call to
its part; the long argument lists are handed on as they come (base.py names them)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import fields
from typing import Any

import numpy as np

from genie_common import env
from genie_common.gguf_file import TensorInfo

from ...batch import Batch
from ...host_copy import HostCopy
from ...kv_cache import KVCache, LayerKV
from ...model_config import LayerConfig, ModelConfig
from ...next_tokens import NextTokens
from ..base import Backend, NextInput
from ..numpy_backend import NumpyBackend
from .attention import CupyAttention, _head_dims_problem
from .core import PREFILL_SCRATCH_BYTES, CupyDevice
from .kernels import COMPAT_ENV
from .layer_ops import CupyLayerOps
from .products import CupyProducts
from .steps import CupySteps
from .tuning import CupyTuning
from .weights import CupyWeights, GroupWeight, QuantWeight

TUNING_FIELDS = frozenset(f.name for f in fields(CupyTuning))


class CupyBackend(NumpyBackend):
    name = "cupy"
    launches_ahead = True
    # four streams at once: a step's decode rows share one read of the weights (gemvn, rows.py) and one
    # attention launch a layer (attention_decn); 4B INT8 on the H200 (bench/NOTES.md v13)
    default_parallel = 4
    # a prompt chunk shorter than the engine's prefill_chunk is padded to the next of these and replays that
    # size's captured step: eager, a 33-token prompt's first token took 45 ms on the 4B
    step_buckets = (8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in TUNING_FIELDS:  # set here it would be ignored, silently
            raise AttributeError(f"{name} is part of the backend's tuning: backend.retune({name}=...)")
        super().__setattr__(name, value)

    def __init__(self, tuning: CupyTuning | None = None) -> None:
        import cupy

        self.xp = cupy
        super().__init__(block_kernels=False)  # its own kernels; the CPU ones are never built here
        self.dev = CupyDevice(tuning or CupyTuning())
        self.weights = CupyWeights(self.dev)
        self.products = CupyProducts(self.dev, self.weights, self)
        self.attn = CupyAttention(self.dev, self)
        self.ops = CupyLayerOps(self.dev, self)
        self.steps = CupySteps(self.dev, self)

    @property
    def tuning(self) -> CupyTuning:
        return self.dev.tuning

    def retune(self, **changes: Any) -> None:
        """Another tuning for the device every part reads it from (CupyDevice.retune)."""
        self.dev.retune(**changes)

    @property
    def captures_steps(self) -> bool:  # type: ignore[override]
        return self.dev.tuning.use_graphs

    @property
    def device_name(self) -> str:
        cc = self.dev.capability
        return f"cupy ({self.dev.name}{f', {COMPAT_ENV}={cc[0]}.{cc[1]}' if env.cuda_compat() else ''})"

    def unsupported(self, cfg: ModelConfig) -> str | None:
        for i, lc in enumerate(cfg.layers):
            problem = _head_dims_problem(lc.head_dim, lc.v_head_dim)
            if problem:
                return f"layer {i}: {problem}"
        return None

    # -- memory -------------------------------------------------------------------------------------------------
    def weight_bytes(self, tensors: list[TensorInfo], matrix: bool) -> int:
        return Backend.weight_bytes(self, tensors, matrix)  # GGUF blocks as stored (not NumPy's int8 rows)

    def kv_zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.zeros(shape, dtype=dtype)  # device memory, allocated whole (NumPy's host mapping is not)

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

    # -- weights ------------------------------------------------------------------------------------------------
    def load_matrix(self, tensor: TensorInfo) -> QuantWeight:
        return self.weights.load_matrix(tensor)

    def load_vector(self, tensor: TensorInfo) -> Any:
        return self.weights.load_vector(tensor)

    def group(self, weights: list[QuantWeight]) -> QuantWeight | GroupWeight:
        return self.weights.group(weights)

    def embed(self, weight: QuantWeight, ids: Any, scale: float) -> Any:
        return self.weights.embed(weight, ids, scale)

    # -- steps --------------------------------------------------------------------------------------------------
    def reserve_steps(self, max_tokens: int, max_segments: int, n_ctx: int) -> None:
        self.steps.reserve_steps(max_tokens, max_segments)
        self._rope_positions = max(self._rope_positions, n_ctx)  # no RoPE table replaced below the context

    def stage_inputs(self, ids: np.ndarray, pos0: int, slot: int = 0) -> Any:
        return self.steps.stage_inputs(ids, pos0, slot)

    def stage_batch(self, batch: Batch) -> Any:
        return self.steps.stage_batch(batch)

    def stage_segment(self, i: int | None) -> None:
        self.steps.stage_segment(i)

    def stage_rows(self, groups: tuple[int, ...]) -> None:
        self.dev.row_groups = groups

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        return self.steps.take_rows(x, rows)

    def forward_step(
        self, steps: dict[Hashable, Any], key: Hashable, run: Callable[[], Any], batch: Batch, capturable: bool
    ) -> Any:
        return self.steps.forward_step(steps, key, run, batch, capturable)

    def replay_ahead(self, steps: dict[Hashable, Any], key: Hashable, batch: Batch, ahead: NextTokens) -> Any | None:
        return self.steps.replay_ahead(steps, key, batch, ahead)

    def _rope_table(
        self, base: float, scale: float, rope_dim: int, n_pos: int, freq_factors: tuple[float, ...] | None = None
    ) -> Any:
        before = self._rope_tables.get((base, scale, rope_dim, freq_factors))  # the key NumpyBackend files it under
        table = super()._rope_table(base, scale, rope_dim, n_pos, freq_factors)
        if before is not None and table is not before:
            self.dev.buffers.replaced()  # captured steps read the replaced table
        return table

    # -- products -----------------------------------------------------------------------------------------------
    def matmul(self, x: Any, weight: QuantWeight | GroupWeight, then: NextInput | None = None) -> Any:
        return self.products.matmul(x, weight, then)

    def add_norm_matmul(
        self, x: Any, r: Any, norm: Any, eps: float, w: QuantWeight | GroupWeight, then: NextInput | None = None
    ) -> tuple[Any, Any]:
        return self.products.add_norm_matmul(x, r, norm, eps, w, then)

    def add_normed_matmul(self, *args: Any, **kwargs: Any) -> Any:  # base.py's arguments
        return self.products.add_normed_matmul(*args, **kwargs)

    def gated_matmul(
        self, gate_up: Any, kind: str, w: QuantWeight | GroupWeight, then: NextInput | None = None, up: Any = None
    ) -> Any:
        return self.products.gated_matmul(gate_up, kind, w, then, up)

    # -- attention ----------------------------------------------------------------------------------------------
    def prepare_qkv(self, *args: Any, **kwargs: Any) -> Any:  # base.py's arguments
        return self.attn.prepare_qkv(*args, **kwargs)

    def self_attention(self, *args: Any, **kwargs: Any) -> Any:  # base.py's arguments
        return self.attn.self_attention(*args, **kwargs)

    def shared_attention(self, *args: Any, **kwargs: Any) -> Any:  # base.py's arguments
        return self.attn.shared_attention(*args, **kwargs)

    def decode_attention(
        self, qkv: Any, cfg: ModelConfig, lc: LayerConfig, qk_norm: Any, kv: LayerKV, batch: Batch, shared: bool = False
    ) -> Any:
        return self.attn.decode_attention(qkv, cfg, lc, qk_norm, kv, batch, shared)

    def decode_steps_by_count(self, cfg: ModelConfig, kv: KVCache) -> bool:
        return self.attn.decode_steps_by_count(cfg, kv)

    def mixed_steps_by_shape(self, cfg: ModelConfig, kv: KVCache) -> bool:
        return self.attn.mixed_steps_by_shape(cfg, kv)

    def kv_write(self, kv: LayerKV, slot: int, pos0: int, k: Any, v: Any) -> None:
        self.attn.kv_write(kv, slot, pos0, k, v)

    def attention(self, q: Any, kv: LayerKV, slot: int, pos0: int, window: int, scale: float, softcap: float) -> Any:
        return self.attn.attention(q, kv, slot, pos0, window, scale, softcap)

    # -- the other layer operations -----------------------------------------------------------------------------
    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return self.ops.rms_norm(x, weight, eps)

    def add_rms_norm(self, x: Any, r: Any, weight: Any, eps: float) -> tuple[Any, Any]:
        return self.ops.add_rms_norm(x, r, weight, eps)

    def add_normed(self, x: Any, y: Any, weight: Any | None, eps: float, scale: Any | None = None) -> Any:
        return self.ops.add_normed(x, y, weight, eps, scale)

    def rope(self, *args: Any, **kwargs: Any) -> Any:  # base.py's arguments
        return self.ops.rope(*args, **kwargs)

    def gated_act(self, gate_up: Any, kind: str) -> Any:
        return self.ops.gated_act(gate_up, kind)

    def gated_pair(self, gate: Any, up: Any, kind: str) -> Any:
        return self.ops.gated_pair(gate, up, kind)

    def stack_rows(self, parts: list[Any]) -> Any:
        return self.ops.stack_rows(parts)

    def to_host(self, x: Any) -> np.ndarray:
        return self.ops.to_host(x)

    def start_to_host(self, x: Any) -> HostCopy:
        return self.ops.start_to_host(x)

    def gather_slot(self, arrays: list[Any], slot: int, n: int) -> Any:
        return self.ops.gather_slot(arrays, slot, n)

    def greedy_tokens(self, logits: Any, rows: list[int]) -> list[int]:
        return self.ops.greedy_tokens(logits, rows)

    def greedy_ahead(self, logits: Any, rows: list[int]) -> NextTokens:
        return self.ops.greedy_ahead(logits, rows)
