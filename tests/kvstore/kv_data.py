"""Random KV snapshots and layouts for the KV-store tests."""

from __future__ import annotations

import numpy as np

from kvstore.format import KVLayout
from workers.engine.kv_cache import KVSnapshot

FINGERPRINT = bytes(range(32))
OTHER_MODEL = bytes(range(1, 33))


def layout(dtype: str = "int8", n_layers: int = 3, n_kv_heads: int = 2, head_dim: int = 16) -> KVLayout:
    return KVLayout(dtype, n_layers, n_kv_heads, head_dim, head_dim, tuple([0, 8, 0][:n_layers] + [0] * (n_layers - 3)))


def snapshot(lay: KVLayout, token_ids, rng: np.random.Generator) -> KVSnapshot:
    n = len(token_ids)
    store = {"int8": np.int8, "f16": np.float16, "f32": np.float32}[lay.dtype]

    def rows(d: int) -> np.ndarray:
        if lay.dtype == "int8":
            return rng.integers(-127, 128, (n, lay.n_kv_heads, d), dtype=np.int8)
        return rng.standard_normal((n, lay.n_kv_heads, d)).astype(store)

    k = [rows(lay.head_dim) for _ in range(lay.n_layers)]
    v = [rows(lay.v_head_dim) for _ in range(lay.n_layers)]
    scales = None
    if lay.dtype == "int8":
        scales = [rng.random((n, lay.n_kv_heads), dtype=np.float32) for _ in range(2 * lay.n_layers)]
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
