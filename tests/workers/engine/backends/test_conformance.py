"""The backend conformance suite: every backend present (NumPy always, CuPy where there is a GPU) against the
interface's definitions (backends/base.py), each op checked against a float64 reference written here from
the definition, not from any backend's code. Tolerances are those of the arithmetic each path is allowed:
int8 codes of a product's input (a half step of 1/127 of a 32-value group's largest value), TF32 in the
GPU's prefill GEMM, INT8 and FP16 KV storage; a layout, scale or indexing mistake is orders larger."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from genie_common.gguf_file import TensorInfo
from genie_workers.engine.backends import Backend
from genie_workers.engine.backends.cupy import cupy_available
from genie_workers.engine.backends.numpy_backend import NumpyBackend
from genie_workers.engine.kv_cache import KVCache, KVCacheConfig
from testkit.quant_blocks import product_err, random_blocks, rel_err

Q = GGMLQuantizationType
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# one row (decode), a few (a step of several streams), a short prompt, a prompt chunk (the GPU's GEMM)
ROW_COUNTS = [1, 3, 40, 100]


def _cupy_backend() -> Backend:
    from genie_workers.engine.backends.cupy import CupyBackend

    return CupyBackend()


BACKENDS = {
    "numpy": NumpyBackend,
    "cupy": pytest.param(_cupy_backend, marks=pytest.mark.skipif(not cupy_available(), reason="needs a GPU")),
}


@pytest.fixture(scope="module", params=list(BACKENDS.values()), ids=list(BACKENDS))
def backend(request) -> Backend:
    return request.param()


def host(backend: Backend, x) -> np.ndarray:
    return np.asarray(backend.to_host(x), dtype=np.float64)


def tensor(qtype: Q, rows: int, cols: int, rng: np.random.Generator, name: str = "w") -> tuple[TensorInfo, np.ndarray]:
    """A GGUF tensor of random valid blocks, and its values dequantized (float64)."""
    blocks = random_blocks(qtype, rows, cols, rng)
    flat = np.ascontiguousarray(blocks).reshape(-1)
    dense = dequantize(blocks, qtype).reshape(rows, cols).astype(np.float64)
    return TensorInfo(name, (rows, cols), qtype, 0, flat.nbytes, flat), dense


@pytest.mark.parametrize("n", ROW_COUNTS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_matmul_is_x_times_the_dequantized_weight(backend, qtype, n):
    rng = np.random.default_rng(7)
    info, dense = tensor(qtype, 96, 512, rng)
    w = backend.load_matrix(info)
    x = rng.standard_normal((n, 512), dtype=np.float32)
    out = host(backend, backend.matmul(backend.xp.asarray(x), w))
    assert out.shape == (n, 96)
    assert product_err(out, x, dense) < 5e-3  # int8 codes of x: at most 1/254 of a term; TF32: 5e-4


def test_grouped_matrices_give_their_products_side_by_side(backend):
    rng = np.random.default_rng(8)
    (a, da), (b, db), (c, dc) = (tensor(q, r, 512, rng) for q, r in ((Q.Q4_K, 64), (Q.Q4_K, 32), (Q.Q6_K, 96)))
    grouped = backend.group([backend.load_matrix(t) for t in (a, b, c)])
    for n in (1, 5):
        x = rng.standard_normal((n, 512), dtype=np.float32)
        out = host(backend, backend.matmul(backend.xp.asarray(x), grouped))
        assert out.shape == (n, 192)
        assert product_err(out, x, np.concatenate([da, db, dc])) < 5e-3


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_embed_is_the_rows_times_the_scale(backend, qtype):
    rng = np.random.default_rng(9)
    info, dense = tensor(qtype, 50, 256, rng)
    ids = np.array([3, 0, 49, 3], dtype=np.int64)
    staged = backend.stage_inputs(ids, 0)
    out = host(backend, backend.embed(backend.load_matrix(info), staged, 2.5))
    np.testing.assert_allclose(out, 2.5 * dense[ids], rtol=1e-6, atol=1e-7)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def test_rms_norm_and_the_residual_add_before_it(backend):
    rng = np.random.default_rng(10)
    xp = backend.xp
    x = rng.standard_normal((5, 640), dtype=np.float32)
    r = rng.standard_normal((5, 640), dtype=np.float32)
    w = rng.uniform(0.5, 1.5, 640).astype(np.float32)
    ref = _rms(x.astype(np.float64), w, 1e-6)
    assert rel_err(host(backend, backend.rms_norm(xp.asarray(x), xp.asarray(w), 1e-6)), ref) < 1e-6
    heads = x.reshape(5, 10, 64)  # a per-head norm (q/k norms): the weight broadcast from the right
    out = host(backend, backend.rms_norm(xp.asarray(heads), xp.asarray(w[:64]), 1e-6))
    assert rel_err(out, _rms(heads.astype(np.float64), w[:64], 1e-6)) < 1e-6
    added, normed = backend.add_rms_norm(xp.asarray(x.copy()), xp.asarray(r), xp.asarray(w), 1e-6)
    s = x.astype(np.float64) + r
    assert rel_err(host(backend, added), s) < 1e-7
    assert rel_err(host(backend, normed), _rms(s, w, 1e-6)) < 1e-6


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_activation(backend, kind):
    rng = np.random.default_rng(11)
    gate_up = rng.standard_normal((3, 2 * 384), dtype=np.float32) * 3
    g, u = gate_up[:, :384].astype(np.float64), gate_up[:, 384:].astype(np.float64)
    if kind == "silu":
        ref = g / (1 + np.exp(-g)) * u
    else:
        ref = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
    assert rel_err(host(backend, backend.gated_act(backend.xp.asarray(gate_up), kind)), ref) < 1e-6


@pytest.mark.parametrize("mode", ["neox", "norm"])
@pytest.mark.parametrize("factors", [False, True])
def test_rope_rotates_each_pair_by_its_angle(backend, mode, factors):
    rng = np.random.default_rng(12)
    n, heads, hd, rope_dim, pos0 = 4, 3, 64, 32, 70
    base, scale = 10000.0, 0.5
    ff = tuple(float(f) for f in rng.uniform(1, 4, rope_dim // 2)) if factors else None
    x = rng.standard_normal((n, heads, hd), dtype=np.float32)
    positions = np.arange(pos0, pos0 + n)
    backend.stage_inputs(np.zeros(n, dtype=np.int64), pos0)  # where a device backend's kernels read pos0
    out = host(backend, backend.rope(backend.xp.asarray(x.copy()), positions, base, scale, rope_dim, mode, ff))
    i = np.arange(rope_dim // 2)
    angle = positions[:, None] * scale * base ** (-2.0 * i / rope_dim) / (np.asarray(ff) if ff else 1.0)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    ref = x.astype(np.float64)
    a, b = (
        (ref[..., : rope_dim // 2], ref[..., rope_dim // 2 : rope_dim])
        if mode == "neox"
        else (
            ref[..., 0:rope_dim:2],
            ref[..., 1:rope_dim:2],
        )
    )
    rotated = ref.copy()
    lo, hi = (
        (slice(0, rope_dim // 2), slice(rope_dim // 2, rope_dim))
        if mode == "neox"
        else (
            slice(0, rope_dim, 2),
            slice(1, rope_dim, 2),
        )
    )
    rotated[..., lo], rotated[..., hi] = a * cos - b * sin, a * sin + b * cos
    assert rel_err(out, rotated) < 1e-5  # float32 angles of positions near 70 rad
    np.testing.assert_array_equal(out[..., rope_dim:], x[..., rope_dim:])  # the rest unrotated


def _attention_ref(q, keys, values, pos0, window, scale, softcap, group):
    """float64 causal attention of q [n, H, hd] at pos0.. over keys/values [T, Hkv, d]."""
    n, heads, _ = q.shape
    out = np.zeros((n, heads, values.shape[-1]))
    for t in range(n):
        p = pos0 + t
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            s = keys[lo : p + 1, h // group] @ q[t, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            e = np.exp(s - s.max())
            out[t, h] = e @ values[lo : p + 1, h // group] / e.sum()
    return out.reshape(n, -1)


ATTENTION_TOL = {"f32": 1e-5, "f16": 1e-3, "int8": 1.5e-2}  # measured on NumPy: 1e-7, 2.5e-4, 7e-3


@pytest.mark.parametrize("kv_dtype", ["int8", "f16", "f32"])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (8, 0.0), (0, 30.0)])
def test_kv_write_then_causal_attention(backend, kv_dtype, window, softcap):
    """A prompt (20 tokens: the GPU's prefill attention), one token, then five (its few-token kernel), into
    slot 1 of 2: each chunk's attention over every key so far, masked causally and by the window."""
    rng = np.random.default_rng(13)
    heads, n_kv, hd, slot = 4, 2, 64, 1
    cache = KVCache(KVCacheConfig(1, n_kv, hd, hd, 64, n_slots=2, dtype=kv_dtype), backend.xp)
    kv = cache.layers[0]
    keys = rng.standard_normal((26, n_kv, hd), dtype=np.float32)
    values = rng.standard_normal((26, n_kv, hd), dtype=np.float32)
    scale = 1 / np.sqrt(hd)
    pos0 = 0
    for n in (20, 1, 5):
        q = rng.standard_normal((n, heads, hd), dtype=np.float32)
        backend.stage_inputs(np.zeros(n, dtype=np.int64), pos0, slot)
        xp = backend.xp
        backend.kv_write(kv, slot, pos0, xp.asarray(keys[pos0 : pos0 + n]), xp.asarray(values[pos0 : pos0 + n]))
        out = host(backend, backend.attention(xp.asarray(q), kv, slot, pos0, window, float(scale), softcap))
        ref = _attention_ref(q.astype(np.float64), keys, values, pos0, window, scale, softcap, heads // n_kv)
        assert out.shape == (n, heads * hd)
        assert rel_err(out, ref) < ATTENTION_TOL[kv_dtype], (n, pos0)
        pos0 += n
    untouched = backend.to_host(kv.k[0])
    assert not np.any(untouched), "slot 0 was written"


def test_softcap_greedy_token_and_rows(backend):
    rng = np.random.default_rng(14)
    xp = backend.xp
    x = rng.standard_normal((3, 100), dtype=np.float32) * 50
    assert rel_err(host(backend, backend.softcap(xp.asarray(x), 30.0)), 30 * np.tanh(x.astype(np.float64) / 30)) < 1e-6
    logits = rng.standard_normal((2, 1000), dtype=np.float32)
    logits[-1, 17] = logits[-1, 900] = 9.0  # a tie: the first
    assert backend.greedy_tokens(xp.asarray(logits), [1]) == [17]
    logits[-1, 5] = np.nan
    assert backend.greedy_tokens(xp.asarray(logits), [1]) == [-1]
    many = rng.standard_normal((4, 3000), dtype=np.float32)
    many[1, 7] = many[1, 2900] = 50.0  # a tie: the first
    many[2, 11] = np.inf  # a row with a value that is not finite: -1, the others unaffected
    first, last = int(np.argmax(many[0])), int(np.argmax(many[3]))
    assert backend.greedy_tokens(xp.asarray(many), [0, 1, 2, 3]) == [first, 7, -1, last]
    assert backend.greedy_tokens(xp.asarray(many), [1, 2]) == [7, -1]
    assert backend.greedy_tokens(xp.asarray(many), [3, 0, 1]) == [last, first, 7]  # any rows, in any order
    parts = [rng.standard_normal((k, 8), dtype=np.float32) for k in (1, 3, 2)]
    stacked = host(backend, backend.stack_rows([xp.asarray(p) for p in parts]))
    np.testing.assert_array_equal(stacked, np.concatenate(parts))
