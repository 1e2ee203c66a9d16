"""The CuPy backend against the NumPy backend: every quantized kernel on random blocks of real shapes,
and whole tiny models of each architecture. Skipped without CuPy and a GPU (CI has none); run on the GPU
machine. Inputs are fresh random data every run; kernel outputs are poisoned with NaN before the launch,
so an element the kernel never writes fails; errors are ||out - ref|| / ||ref|| against float64."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from tests.tiny_models import write_tiny_model
from workers.engine.backends.cupy_backend import GEMV_MAX_TOKENS, KERNEL_TYPES, CupyBackend, QuantWeight, cupy_available

pytestmark = pytest.mark.skipif(not cupy_available(), reason="needs CuPy and an NVIDIA GPU")

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
SHAPES = [(1024, 640), (640, 2048), (2560, 9728)]  # Gemma 270M q, Gemma down, Qwen3-4B down


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


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite elements"
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def gpu() -> CupyBackend:
    return CupyBackend()


@pytest.mark.parametrize("qtype", list(KERNEL_TYPES), ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_quantized_kernels_match_dequantize(gpu, qtype, shape):
    import cupy as cp

    rng = np.random.default_rng()
    rows, cols = shape
    if cols % GGML_QUANT_SIZES[qtype][0]:
        cols = cols // 256 * 256 + 256  # K-quant super-blocks hold 256 values: nearest shape they fit
    blocks = random_blocks(qtype, rows, cols, rng)
    dense = dequantize(blocks, qtype).astype(np.float64)  # the gguf package's reference
    w = QuantWeight(cp.asarray(blocks.reshape(-1)), qtype, rows, cols)

    out = gpu.dequant_into(w, cp.full((rows, cols), cp.nan, dtype=cp.float32))
    assert rel_err(cp.asnumpy(out), dense) < 1e-6

    ids = rng.integers(0, rows, 7)
    rows_out = gpu.dequant_into(w, cp.full((7, cols), cp.nan, dtype=cp.float32), cp.asarray(ids), scale=3.0)
    assert rel_err(cp.asnumpy(rows_out), 3.0 * dense[ids]) < 1e-6

    for n in (1, 3, GEMV_MAX_TOKENS):
        x = rng.standard_normal((n, cols), dtype=np.float32)
        y = gpu.gemv_into(cp.asarray(x), w, cp.full((n, rows), cp.nan, dtype=cp.float32), ldy=rows)
        assert rel_err(cp.asnumpy(y), x.astype(np.float64) @ dense.T) < 1e-5
    x = rng.standard_normal((40, cols), dtype=np.float32)  # the prefill path
    assert rel_err(cp.asnumpy(gpu.matmul(cp.asarray(x), w)), x.astype(np.float64) @ dense.T) < 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("kv_dtype", ["int8", "f16"])
def test_tiny_model_nll_matches_numpy(gpu, tmp_path, arch, kv_dtype):
    from workers.engine.backends.numpy_backend import NumpyBackend
    from workers.engine.engine import Engine, EngineConfig
    from workers.engine.model import Model

    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(arch, path, seed=3)
    ids = list(np.random.default_rng().integers(3, 300, 48))
    nll = {}
    for name, backend in (("numpy", NumpyBackend()), ("cupy", gpu)):
        engine = Engine(
            EngineConfig(model=str(path), n_ctx=64, kv_dtype=kv_dtype, prefill_chunk=16), Model.load(path, backend)
        )
        nll[name] = engine.token_nll([1, *ids], rows_per_pass=5)  # chunks of 5: the GEMV path, and KV reuse
    assert np.abs(nll["cupy"] - nll["numpy"]).mean() <= 0.05
    assert np.abs(nll["cupy"] - nll["numpy"]).max() < 1e-3
