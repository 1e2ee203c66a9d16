"""Golden logits from llama.cpp for the tiny random models of testkit/tiny_models.py.

Dev-only: needs llama-cpp-python (`pip install llama-cpp-python`, a long CPU build); never run in CI.
CI only reads what this writes, into testkit/fixtures/tiny/:

  {arch}.npz            for llama, qwen2, qwen3, gemma3: `ids` [n] int32 and `logits` [n, vocab] float32
                        (every position), llama.cpp on the F32 model from write_tiny_model(arch, seed=0)
  llama-q4_k_m.gguf     QUANT_SOURCE (a llama with 256-multiple rows) requantized by llama.cpp to Q4_K_M
  llama-q4_k_m.npz      its logits, as above

llama.cpp runs on the CPU with an F32 KV cache and no flash attention. The models themselves are not
stored (except the quantized one): tests rebuild them byte for byte from the seed.

Usage, from the repository root:  python3 scripts/make_fixtures/tiny_logits.py
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from testkit.tiny_models import ARCH_PARAMS, QUANT_SOURCE, write_tiny_model  # noqa: E402

OUT = ROOT / "testkit" / "fixtures" / "tiny"
# BOS, then 29 ids spread over byte and normal tokens: 30 > the gemma3 sliding window of 8.
IDS = np.array([1] + [(i * 37 + 11) % 381 + 3 for i in range(29)], dtype=np.int32)
GGML_TYPE_F32 = 0
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


def llama_cpp_logits(model_path: Path, ids: np.ndarray) -> np.ndarray:
    llm = llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=64,
        n_batch=64,
        n_ubatch=64,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        flash_attn=False,
        n_threads=2,
        n_threads_batch=2,
        n_gpu_layers=0,
        verbose=False,
    )
    llm.reset()
    llm.eval(ids.tolist())
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    assert logits.shape == (len(ids), llm.n_vocab())
    llm.close()
    assert np.isfinite(logits).all()
    return logits


def save(name: str, logits: np.ndarray) -> None:
    np.savez_compressed(OUT / f"{name}.npz", ids=IDS, logits=logits.astype(np.float32))
    print(f"{name}: logits {logits.shape}, max |logit| {np.abs(logits).max():.3f}")


def quantize(src: Path, dst: Path) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed with {rc}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCH_PARAMS:
            path = Path(tmp) / f"{arch}.gguf"
            write_tiny_model(arch, path, seed=0)
            save(arch, llama_cpp_logits(path, IDS))

        src = Path(tmp) / "llama-f32.gguf"
        q = dict(QUANT_SOURCE)
        write_tiny_model(q.pop("arch"), src, **q)
        dst = OUT / "llama-q4_k_m.gguf"
        quantize(src, dst)
        import gguf

        types = sorted({t.tensor_type.name for t in gguf.GGUFReader(dst).tensors})
        print(f"{dst.name}: {dst.stat().st_size} bytes, tensor types {types}")
        assert {"Q4_K", "Q6_K"} <= set(types), types
        save("llama-q4_k_m", llama_cpp_logits(dst, IDS))


if __name__ == "__main__":
    main()
