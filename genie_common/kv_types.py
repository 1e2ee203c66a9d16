"""The KV cache's shape and a sequence's KV as host arrays: what the engine allocates and the KV store saves
(the layout: docs/kv-cache.md). Shared by the worker and the KV-store process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

KVDtype = Literal["int8", "f16", "f32"]


@dataclass(frozen=True)
class KVCacheConfig:
    """The pools: n_layers of them (one per layer that writes K/V), each [n_slots, n_ctx, n_kv_heads,
    head_dim] (V: v_head_dim), unless `pool_shapes` gives each pool its own (n_kv_heads, head_dim,
    v_head_dim) (Gemma 4's sliding and global layers differ); then the three uniform fields are unused."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    n_ctx: int
    n_slots: int = 1
    dtype: KVDtype = "int8"
    pool_shapes: tuple[tuple[int, int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.pool_shapes is not None and len(self.pool_shapes) != self.n_layers:
            raise ValueError(f"{len(self.pool_shapes)} pool shapes for {self.n_layers} pools")

    @property
    def uniform(self) -> bool:
        return self.pool_shapes is None

    def pool_shape(self, i: int) -> tuple[int, int, int]:
        """(n_kv_heads, head_dim, v_head_dim) of pool i."""
        if self.pool_shapes is None:
            return self.n_kv_heads, self.head_dim, self.v_head_dim
        return self.pool_shapes[i]

    @property
    def bytes_per_token(self) -> int:
        elem = {"int8": 1, "f16": 2, "f32": 4}[self.dtype]
        total = 0
        for i in range(self.n_layers):
            n_kv, hd, hdv = self.pool_shape(i)
            total += n_kv * (hd + hdv) * elem + (2 * n_kv * 4 if self.dtype == "int8" else 0)
        return total


@dataclass
class KVSnapshot:
    """Positions [0, n) of one sequence as contiguous host arrays (what the KV store saves).

    k, v: per pool [n, n_kv_heads, head_dim] of the cache dtype; k_scale, v_scale: per pool
    [n, n_kv_heads] float32 (int8 only); token_ids: [n] int32.
    """

    dtype: KVDtype
    token_ids: np.ndarray
    k: list[np.ndarray]
    v: list[np.ndarray]
    k_scale: list[np.ndarray] | None
    v_scale: list[np.ndarray] | None

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])
