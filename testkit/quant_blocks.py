"""Random GGUF blocks of every type for kernel tests, and the error measure they use."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
# byte offsets of the float16 scale fields in each block type: filled with sane values, the rest random
F16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, row_bytes] uint8 of valid blocks with random values."""
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8)
    if qtype == Q.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if qtype == Q.BF16:
        return (
            (rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        )
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_elems
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = (rng.uniform(0.001, 0.02, n_blocks).astype(np.float16)).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def product_err(out: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    """max |out - x @ w.T| / (|x| @ |w|.T): each product's error against the size of its terms, which is
    what float32 accumulation bounds (rel_err of a product that cancels to near zero is not)."""
    assert np.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite elements"
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return float((np.abs(out.astype(np.float64) - x64 @ w64.T) / (np.abs(x64) @ np.abs(w64).T + 1e-300)).max())


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite elements"
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def q8_coded(x: np.ndarray) -> np.ndarray:
    """float64 [n, cols]: x as q8_0 codes it (blocks of 32, d = max|x| / 127 in float32, codes round(x / d)): the
    inputs a GROUPS product (genie_gq_products) meets, whose product with the weights it computes exactly to
    float32 rounding."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    return (np.rint(xb * inv).astype(np.float64) * d).reshape(x.shape)
