"""genie's logits on tiny random models of each architecture against llama.cpp's (golden files).

The models are rebuilt from a seed by tests/tiny_models.py (byte-identical to the ones the goldens
were computed on); the goldens come from scripts/make_fixtures/tiny_logits.py (llama-cpp-python, CPU,
F32 KV cache). Only the Q4_K_M model is committed as a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers.engine.arch.layers import forward  # noqa: E402
from workers.engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from workers.engine.kv_cache import KVCache, KVCacheConfig  # noqa: E402
from workers.engine.model import Model  # noqa: E402

_spec = importlib.util.spec_from_file_location("tiny_models", ROOT / "tests" / "tiny_models.py")
tiny_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_models)  # type: ignore[union-attr]
write_tiny_model = tiny_models.write_tiny_model

FIXTURES = ROOT / "tests" / "fixtures" / "tiny"
ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
# F32 everywhere: only summation order differs, except gemma3, whose GELU llama.cpp's CPU backend
# evaluates through an fp16 lookup table (GGML_GELU_FP16).
TOLERANCE = {"llama": 1e-4, "qwen2": 1e-4, "qwen3": 1e-4, "gemma3": 5e-3}


def _golden(name: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(FIXTURES / f"{name}.npz") as z:
        return z["ids"].astype(np.int64), z["logits"]


def _logits(path: Path, ids: np.ndarray, chunks: list[int] | None = None) -> np.ndarray:
    """genie's logits at every position of `ids`, in one forward pass or in chunks of the given sizes."""
    b = NumpyBackend()
    m = Model.load(path, b)
    c = m.config
    kv_config = KVCacheConfig(c.n_layers, c.n_kv_heads, c.head_dim, c.v_head_dim, n_ctx=64, n_slots=1, dtype="f32")
    kv = KVCache(kv_config, np)
    out, pos = [], 0
    for size in chunks or [len(ids)]:
        logits = forward(c, m.weights, b, kv, 0, ids[pos : pos + size], pos, slice(None))
        out.append(np.asarray(logits, dtype=np.float32))
        pos += size
    assert pos == len(ids)
    return np.concatenate(out)


def _report(got: np.ndarray, want: np.ndarray) -> str:
    d = np.abs(got - want)
    worst = np.unravel_index(d.argmax(), d.shape)
    per_pos = " ".join(f"{x:.1e}" for x in d.max(axis=1))
    return f"max |d| {d.max():.3e} at (pos, token) {worst}; per position: {per_pos}"


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_matches_llama_cpp(arch: str, tmp_path: Path) -> None:
    ids, want = _golden(arch)
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(arch, path, seed=0)
    got = _logits(path, ids)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOLERANCE[arch], _report(got, want)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_chunked_prefill_and_decode(arch: str, tmp_path: Path) -> None:
    """The same logits when the prompt goes through the KV cache: a prefill chunk, then single tokens."""
    ids, want = _golden(arch)
    path = tmp_path / f"{arch}.gguf"
    write_tiny_model(arch, path, seed=0)
    got = _logits(path, ids, chunks=[5, 12] + [1] * (len(ids) - 17))
    assert np.abs(got - want).max() <= TOLERANCE[arch], _report(got, want)


def test_q4_k_m_model_matches_llama_cpp() -> None:
    """llama.cpp quantizes activations to Q8_K inside its K-quant matmuls and genie does not, so the
    logits differ by more than rounding (logit std here is ~1.3). Measured when the fixture was made
    (llama-cpp-python 0.3.36): top-1 agreement 29/30, mean |d| 0.054, max |d| 0.58. A float64 re-run
    of the same graph with Q8_K-rounded matmul inputs lands within mean 4e-4 of llama.cpp, and without
    that rounding within 1.5e-5 of genie, so the gap is the activation quantization alone."""
    ids, want = _golden("llama-q4_k_m")
    got = _logits(FIXTURES / "llama-q4_k_m.gguf", ids)
    d = np.abs(got - want)
    top1 = (got.argmax(-1) == want.argmax(-1)).mean()
    assert top1 >= 0.9, f"top-1 agreement {top1:.2f}; {_report(got, want)}"
    assert d.mean() <= MEAN_Q4_BOUND, _report(got, want)
    assert d.max() <= MAX_Q4_BOUND, _report(got, want)


MEAN_Q4_BOUND = 0.1  # measured 0.054: ~2x margin
MAX_Q4_BOUND = 1.0  # measured 0.58


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_writer_is_deterministic(arch: str, tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    hp_a = write_tiny_model(arch, a, seed=0)
    hp_b = write_tiny_model(arch, b, seed=0)
    assert hp_a == hp_b
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert a.stat().st_size < 2 * 1024 * 1024
    c = tmp_path / "c.gguf"
    write_tiny_model(arch, c, seed=1)
    assert c.read_bytes() != a.read_bytes()
