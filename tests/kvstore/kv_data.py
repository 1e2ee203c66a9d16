"""Random KV snapshots and layouts for the KV-store tests."""

from __future__ import annotations

import numpy as np

from genie_kvstore.format import KVLayout
from genie_workers.engine.kv_cache import KVSnapshot

FINGERPRINT = bytes(range(32))
OTHER_MODEL = bytes(range(1, 33))


def layout(dtype: str = "int8", n_layers: int = 3, n_kv_heads: int = 2, head_dim: int = 16) -> KVLayout:
    return KVLayout.uniform(
        dtype, n_layers, n_kv_heads, head_dim, head_dim, tuple([0, 8, 0][:n_layers] + [0] * (n_layers - 3))
    )


def mixed_layout(dtype: str = "int8") -> KVLayout:
    """Pools of different shapes, as Gemma 4's: sliding ones of head dim 16, a global one of 32 and 4 KV heads."""
    return KVLayout(dtype, (2, 2, 4), (16, 16, 32), (16, 16, 32), (8, 8, 0))


def snapshot(lay: KVLayout, token_ids, rng: np.random.Generator) -> KVSnapshot:
    n = len(token_ids)
    store = {"int8": np.int8, "f16": np.float16, "f32": np.float32}[lay.dtype]

    def rows(n_kv: int, d: int) -> np.ndarray:
        if lay.dtype == "int8":
            return rng.integers(-127, 128, (n, n_kv, d), dtype=np.int8)
        return rng.standard_normal((n, n_kv, d)).astype(store)

    pools = [lay.pool(i) for i in range(lay.n_layers)]
    k = [rows(n_kv, hd) for n_kv, hd, _ in pools]
    v = [rows(n_kv, hdv) for n_kv, _, hdv in pools]
    scales = None
    if lay.dtype == "int8":
        scales = [rng.random((n, n_kv), dtype=np.float32) for _ in range(2) for n_kv, _, _ in pools]
    return KVSnapshot(
        lay.dtype,  # type: ignore[arg-type]
        np.asarray(token_ids, dtype=np.int32),
        k,
        v,
        scales[: lay.n_layers] if scales else None,
        scales[lay.n_layers :] if scales else None,
    )


def assert_same(a: KVSnapshot, b: KVSnapshot, n: int | None = None) -> None:
    n = a.n_tokens if n is None else n
    assert b.n_tokens == n and b.dtype == a.dtype
    np.testing.assert_array_equal(b.token_ids, a.token_ids[:n])
    for x, y in zip(a.k + a.v, b.k + b.v, strict=True):
        np.testing.assert_array_equal(y, x[:n])
    if a.k_scale is not None:
        assert b.k_scale is not None and b.v_scale is not None and a.v_scale is not None
        for x, y in zip(a.k_scale + a.v_scale, b.k_scale + b.v_scale, strict=True):
            np.testing.assert_array_equal(y, x[:n])
