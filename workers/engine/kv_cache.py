"""The engine's KV cache: a pool of sequence slots per layer, INT8 with per-(layer, position, KV head)
scales by default or FP16. The layout is documented in docs/kv-cache.md; the GPU kernels and the KV
store use the same one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from genie_common.kv_types import KVCacheConfig, KVDtype, KVSnapshot

from .host_copy import HostCopy

INT8_QMAX = 127.0
__all__ = [
    "INT8_QMAX",
    "KVCache",
    "KVCacheConfig",
    "KVDtype",
    "KVExport",
    "KVSnapshot",
    "LayerKV",
    "common_prefix_len",
    "kv_rotation",
]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def kv_rotation(head_dim: int) -> np.ndarray:
    """The orthogonal, symmetric, self-inverse [head_dim, head_dim] matrix INT8 K/V rows are stored in.

    A few channels of K carry most of its magnitude (after RoPE and q/k norms), and one absmax scale
    per row then leaves the others a handful of levels. A normalized Sylvester-Hadamard rotation
    spreads them over every channel; q.k is unchanged when q is rotated too, and attention over
    rotated V is rotated back once per output. Measured on Gemma 3 270M (apache-2.0 text, ctx 512):
    INT8/FP16 perplexity 1.0116 without, 1.0006 with (docs/kv-cache.md). Head dims that are not a
    power of two use blocks of the largest power of two dividing them.
    """
    block = head_dim & -head_dim
    h = np.ones((1, 1))
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    return np.kron(np.eye(head_dim // block), h / np.sqrt(block)).astype(np.float32)


@dataclass
class KVExport:
    """A slot's rows on their way to host memory (KVCache.start_export): every array's rows in one copy, in the
    order of the KV store's frames (kvstore/wire.py: each layer's K and V, then each layer's K and V scales)."""

    dtype: KVDtype
    token_ids: np.ndarray
    copy: HostCopy  # the bytes
    shapes: list[tuple[tuple[int, ...], np.dtype]]  # each array's, in order

    def flat(self) -> np.ndarray:
        """Every array's bytes one after the other (waits for the copy if it has not landed yet)."""
        return self.copy.result()

    def snapshot(self) -> KVSnapshot:
        """The arrays as a snapshot, views of `flat()`."""
        flat, arrays, at = self.flat(), [], 0
        for shape, dtype in self.shapes:
            size = int(np.prod(shape)) * dtype.itemsize
            arrays.append(flat[at : at + size].view(dtype).reshape(shape))
            at += size
        n_layers = len(self.shapes) // (4 if self.dtype == "int8" else 2)
        pairs, scales = arrays[: 2 * n_layers], arrays[2 * n_layers :]
        return KVSnapshot(
            dtype=self.dtype,
            token_ids=self.token_ids,
            k=pairs[0::2],
            v=pairs[1::2],
            k_scale=scales[0::2] if scales else None,
            v_scale=scales[1::2] if scales else None,
        )


@dataclass
class LayerKV:
    """One layer's pool. k, v: [n_slots, n_ctx, n_kv_heads, head_dim]; scales: [n_slots, n_ctx, n_kv_heads]."""

    k: Any
    v: Any
    k_scale: Any | None  # None unless dtype is int8
    v_scale: Any | None


class KVCache:
    """Owns the per-layer pools on the backend's device and which tokens each slot holds."""

    def __init__(self, config: KVCacheConfig, xp: Any, zeros: Any = None) -> None:
        """`zeros(shape, dtype)` makes each pool array (the backend's kv_zeros; default xp.zeros)."""
        self.config = config
        self.xp = xp
        zeros = zeros or (lambda shape, dtype: xp.zeros(shape, dtype=dtype))
        c = config
        store = {"int8": np.int8, "f16": np.float16, "f32": np.float32}[c.dtype]
        self.layers = []  # the pools, in the order of ModelConfig.kv_layers
        for i in range(c.n_layers):
            n_kv, hd, hdv = c.pool_shape(i)
            k = zeros((c.n_slots, c.n_ctx, n_kv, hd), store)
            v = zeros((c.n_slots, c.n_ctx, n_kv, hdv), store)
            scales = c.dtype == "int8"
            ks = zeros((c.n_slots, c.n_ctx, n_kv), np.float32) if scales else None
            vs = zeros((c.n_slots, c.n_ctx, n_kv), np.float32) if scales else None
            self.layers.append(LayerKV(k, v, ks, vs))
        # token ids whose K/V are written at positions [0, len) of each slot: written only by the methods below
        self._held: list[list[int]] = [[] for _ in range(c.n_slots)]

    # -- what each slot holds -----------------------------------------------------------------------
    def held(self, slot: int) -> tuple[int, ...]:
        """The token ids whose K/V positions [0, n) of `slot` hold."""
        return tuple(self._held[slot])

    def n_held(self, slot: int) -> int:
        return len(self._held[slot])

    def prefix_len(self, slot: int, ids: Sequence[int]) -> int:
        """How many of `ids`, from the first, `slot` holds."""
        return common_prefix_len(self._held[slot], ids)

    def extend(self, slot: int, ids: Sequence[int]) -> None:
        """A pass wrote the K/V of `ids` at the positions after what `slot` held."""
        self._held[slot].extend(int(t) for t in ids)

    def truncate(self, slot: int, n: int) -> None:
        """`slot` keeps its first n tokens (the rows past them are garbage a later pass overwrites)."""
        del self._held[slot][n:]

    def clear(self, slot: int | None = None) -> None:
        """`slot` (None: every slot) holds nothing reusable."""
        for s in range(self.config.n_slots) if slot is None else (slot,):
            self._held[s] = []

    def start_export(self, slot: int, n_tokens: int, gather: Any, start_to_host: Any) -> KVExport:
        """Positions [0, n) of `slot` on their way to host memory: the backend's `gather` takes every array's rows
        into one buffer of their own, behind the steps that wrote them (the slot may be given to another sequence
        at once), and its `start_to_host` copies that without waiting for it."""
        resident = self._held[slot]
        if not 0 <= n_tokens <= len(resident):
            raise ValueError(f"slot {slot} holds {len(resident)} tokens, cannot export {n_tokens}")
        n = n_tokens
        arrays = [a for layer in self.layers for a in (layer.k, layer.v)]
        if self.config.dtype == "int8":
            arrays += [a for layer in self.layers for a in (layer.k_scale, layer.v_scale)]
        shapes = [((n, *a.shape[2:]), np.dtype(a.dtype)) for a in arrays]
        return KVExport(
            dtype=self.config.dtype,
            token_ids=np.asarray(resident[:n], dtype=np.int32),
            copy=start_to_host(gather(arrays, slot, n)),
            shapes=shapes,
        )

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Make positions [0, n) of slot `dst` hold what they hold in slot `src` (a shared system prompt:
        rows copied instead of recomputed)."""
        if not 0 <= n_tokens <= len(self._held[src]):
            raise ValueError(f"slot {src} holds {len(self._held[src])} tokens, cannot copy {n_tokens}")
        self._held[dst] = []  # until every array is written, the slot holds nothing reusable
        for layer in self.layers:
            for a in (layer.k, layer.v, layer.k_scale, layer.v_scale):
                if a is not None:
                    a[dst, :n_tokens] = a[src, :n_tokens]
        self._held[dst] = list(self._held[src][:n_tokens])

    def load(self, slot: int, snap: KVSnapshot) -> None:
        """Make positions [0, n) of `slot` hold `snap`; checks every shape before touching the pool."""
        c = self.config
        n = snap.n_tokens
        if snap.dtype != c.dtype:
            raise ValueError(f"snapshot is {snap.dtype} KV, this cache is {c.dtype}")
        if n > c.n_ctx:
            raise ValueError(f"snapshot has {n} tokens, the context holds {c.n_ctx}")
        if len(snap.k) != c.n_layers or len(snap.v) != c.n_layers:
            raise ValueError(f"snapshot has {len(snap.k)} layers, the model {c.n_layers}")
        for i, (k, v) in enumerate(zip(snap.k, snap.v, strict=True)):
            n_kv, hd, hdv = c.pool_shape(i)
            if k.shape != (n, n_kv, hd) or v.shape != (n, n_kv, hdv):
                raise ValueError(f"snapshot layer shapes {k.shape}/{v.shape} do not match the cache")
        store = {"int8": np.int8, "f16": np.float16, "f32": np.float32}[c.dtype]
        if any(a.dtype != store for a in snap.k + snap.v):
            raise ValueError(f"snapshot K/V arrays are not {c.dtype}")
        if c.dtype == "int8":
            if snap.k_scale is None or snap.v_scale is None:
                raise ValueError("INT8 snapshot without scales")
            if len(snap.k_scale) != c.n_layers or len(snap.v_scale) != c.n_layers:
                raise ValueError("snapshot scales do not cover every layer")
            for i, (ks, vs) in enumerate(zip(snap.k_scale, snap.v_scale, strict=True)):
                n_kv = c.pool_shape(i)[0]
                if any(a.shape != (n, n_kv) or a.dtype != np.float32 for a in (ks, vs)):
                    raise ValueError("snapshot scale shapes do not match the cache")
        if len(snap.token_ids) != n:
            raise ValueError("snapshot token ids do not match its arrays")
        self._held[slot] = []  # until every array is written, the slot holds nothing reusable
        xp = self.xp
        for i, layer in enumerate(self.layers):
            layer.k[slot, :n] = xp.asarray(snap.k[i])
            layer.v[slot, :n] = xp.asarray(snap.v[i])
            if snap.k_scale is not None and snap.v_scale is not None:
                assert layer.k_scale is not None and layer.v_scale is not None
                layer.k_scale[slot, :n] = xp.asarray(snap.k_scale[i])
                layer.v_scale[slot, :n] = xp.asarray(snap.v_scale[i])
        self._held[slot] = [int(t) for t in snap.token_ids]
