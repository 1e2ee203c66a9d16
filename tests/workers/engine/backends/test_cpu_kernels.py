"""The CPU backend's int8 blocks and C kernels: unpacking each GGUF type is bit-exact against the gguf
package's dequantization; the kernels' products match float64 on random blocks of real shapes; whole
models give the same logits with and without the kernels; no compiler means float32 weights, not a
failure. Inputs are fresh random data every run; outputs are checked for NaN/inf."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from genie_common.gguf_file import TensorInfo
from genie_workers.engine.arch.layers import forward
from genie_workers.engine.backends import cpu_kernels
from genie_workers.engine.backends.base import Backend
from genie_workers.engine.backends.block_weight import (
    GROUPED,
    LAYOUTS,
    UNPACKERS,
    BlockWeight,
    concat_blocks,
    row_bytes,
    to_blocks,
)
from genie_workers.engine.backends.numpy_backend import GEMV_MAX_TOKENS, NumpyBackend
from genie_workers.engine.kv_cache import KVCache, KVCacheConfig
from genie_workers.engine.model import Model
from testkit.draws import drawn_rng
from testkit.quant_blocks import F16_FIELDS, Q, product_err, q8_coded, random_blocks, rel_err
from tests.child_env import child_env

ROOT = Path(__file__).parents[4]
# Gemma q, Gemma down, ragged rows, tall and narrow, one row
SHAPES = [(1024, 640), (640, 2048), (1001, 512), (9001, 256), (1, 256)]


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.BlockKernels:
    lib = cpu_kernels.load()
    if lib is None:
        if shutil.which(os.environ.get("CC", "cc")) is None:
            pytest.skip("no C compiler on this machine (the backend runs on float32 weights)")
        pytest.fail("the C kernels did not build although this machine has a C compiler")
    return cpu_kernels.BlockKernels(lib)


def tensor_of(raw: np.ndarray, qtype: Q, rows: int, cols: int, name: str = "w") -> TensorInfo:
    flat = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo(name, (rows, cols), qtype, 0, flat.nbytes, flat)


def signed_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """random_blocks with the float16 scale fields of random sign."""
    raw = random_blocks(qtype, rows, cols, rng)
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    blocks = raw.reshape(-1, block_bytes)
    for off in F16_FIELDS[qtype]:
        blocks[:, off + 1] ^= rng.integers(0, 2, len(blocks), dtype=np.uint8) << 7
    return raw


def fit(qtype: Q, cols: int) -> int:
    block = GGML_QUANT_SIZES[qtype][0]
    return -(-cols // block) * block


@pytest.mark.parametrize("qtype", list(UNPACKERS), ids=lambda q: q.name)
def test_unpacked_blocks_are_bit_exact(qtype):
    rng = drawn_rng()
    rows, cols = 37, fit(qtype, 512)
    raw = signed_blocks(qtype, rows, cols, rng)
    w = to_blocks(tensor_of(raw, qtype, rows, cols))
    assert w.shape == (rows, cols) and w.layout == LAYOUTS.get(qtype, 0)
    assert w.q.nbytes == rows * row_bytes(w.layout, cols)  # int8, or packed
    ref = dequantize(raw, qtype).reshape(rows, cols)
    np.testing.assert_array_equal(w.dequantize(), ref)
    ids = rng.integers(0, rows, 9)
    np.testing.assert_array_equal(w.dequantize(ids), ref[ids])


@pytest.mark.parametrize("qtype", list(UNPACKERS), ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_products_match_float64(kernels, qtype, shape):
    rng = drawn_rng()
    rows, cols = shape[0], fit(qtype, shape[1])
    raw = signed_blocks(qtype, rows, cols, rng)
    w = to_blocks(tensor_of(raw, qtype, rows, cols))
    dense = dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    # judged per product against the size of its terms: a 1-row matrix's single product may cancel to
    # near zero, where a relative error measures float32 rounding of the terms, not the kernel
    if w.layout in GROUPED:  # any number of inputs, coded as q8_0: exact for the coded inputs
        for n in (1, 3, 40):
            x = rng.standard_normal((n, cols), dtype=np.float32)
            got = kernels.products(x, w)
            assert product_err(got, q8_coded(x), dense) < 2e-6
            assert product_err(got, x, dense) < 1e-2  # the coding: half a step of 1/127 of a block's largest
        return
    for n in (1, 3, GEMV_MAX_TOKENS):
        x = rng.standard_normal((n, cols), dtype=np.float32)
        assert product_err(kernels.gemv(x, w), x, dense) < 2e-6
    x = rng.standard_normal((40, cols), dtype=np.float32)
    assert product_err(kernels.gemm(x, w), x, dense) < 2e-6
    out = np.full((min(rows, 5), cols), np.nan, dtype=np.float32)
    np.testing.assert_array_equal(kernels.dequantize(w, 0, min(rows, 5), out), dense[:5].astype(np.float32))


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and {"avx2", "fma"} <= set(line.split()) for line in f)
    except OSError:
        return False


# the kernel source's paths a CPU may take: this CPU's (AVX-512 here and in CI), AVX2 alone (most machines
# without a GPU in a home), the compiler's plain C
ISA_FLAGS = {
    "native": ["-O3", "-march=native", "-pthread"],
    "avx2": ["-O3", "-mavx2", "-mfma", "-mf16c", "-mno-avx512f", "-pthread"],  # F16C: every AVX2 CPU has it
    "plain": ["-O3", "-pthread"],
}


def _isa_kernels(isa: str, tmp_path: Path) -> cpu_kernels.BlockKernels:
    """The kernel library built for one path of ISA_FLAGS (skips where this machine cannot build or run it)."""
    if isa == "avx2" and not (_has_avx2() and sys.platform == "linux"):
        pytest.skip("this CPU does not run AVX2")
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip("no C compiler on this machine")
    source = Path(cpu_kernels.__file__).parent / "kernels" / cpu_kernels.SOURCE
    target = tmp_path / f"blocks-{isa}.so"
    try:
        cpu_kernels._build(cc, source, target, ISA_FLAGS[isa])
    except subprocess.CalledProcessError as e:
        empty = tmp_path / "empty.c"
        empty.write_text("int genie_probe(void) { return 0; }\n")
        try:  # a compiler without these flags skips; one that takes them and fails on the source is a fault
            cpu_kernels._build(cc, empty, tmp_path / "empty.so", ISA_FLAGS[isa])
        except subprocess.CalledProcessError:
            pytest.skip(f"this compiler does not build {isa}: {e.stderr.strip()[-200:]}")
        raise
    lib = ctypes.CDLL(str(target))
    cpu_kernels._declare(lib)
    return cpu_kernels.BlockKernels(lib)


@pytest.mark.parametrize("isa", list(ISA_FLAGS))
def test_every_instruction_sets_attention_matches_float64_and_a_row_is_the_same_alone(isa, tmp_path):
    """genie_attn_rows_i8 built for each path (AVX-512: 16 keys' dot products at once, the layouts of genie's
    models unrolled; else the loop form): rows over their own positions against float64, for SmolLM2's, Gemma 3's
    and Gemma 4's layouts, one no model has, and a softcap; and the last row alone bit for bit as among the others."""
    from genie_workers.engine.kv_cache import LayerKV

    kernels = _isa_kernels(isa, tmp_path)
    rng = np.random.default_rng(3)
    for n_heads, n_kv, hd, softcap in ((9, 3, 64, 0.0), (4, 1, 256, 0.0), (8, 1, 512, 0.0), (6, 2, 48, 20.0)):
        t_max = 300
        layer = LayerKV(
            rng.integers(-127, 128, (1, t_max, n_kv, hd), dtype=np.int8),
            rng.integers(-127, 128, (1, t_max, n_kv, hd), dtype=np.int8),
            rng.uniform(0.001, 0.05, (1, t_max, n_kv)).astype(np.float32),
            rng.uniform(0.001, 0.05, (1, t_max, n_kv)).astype(np.float32),
        )
        q = rng.standard_normal((3, n_heads, hd), dtype=np.float32)
        lo, end = np.array([0, 5, 70]), np.array([t_max, 200, 71])  # many runs, a ragged one, a single position
        got = kernels.attention_rows(q, layer, 0, lo, end, 0.125, softcap)
        k = layer.k[0].astype(np.float64) * layer.k_scale[0][..., None]
        v = layer.v[0].astype(np.float64) * layer.v_scale[0][..., None]
        for i in range(3):
            for h in range(n_heads):
                kv_h = h // (n_heads // n_kv)
                s = k[lo[i] : end[i], kv_h] @ q[i, h].astype(np.float64) * 0.125
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                p = np.exp(s - s.max())
                want = p @ v[lo[i] : end[i], kv_h] / p.sum()
                assert rel_err(got[i, h], want) < 1e-5, (isa, n_heads, hd, i, h)
        alone = kernels.attention_rows(q[2:], layer, 0, lo[2:], end[2:], 0.125, softcap)
        np.testing.assert_array_equal(alone[0], got[2])
    kernels.lib.genie_set_threads(cpu_kernels.default_threads())


@pytest.mark.parametrize("isa", list(ISA_FLAGS))
def test_every_instruction_sets_products_match_float64_and_batched_rows_equal_alone(isa, tmp_path):
    """genie_blk_gemv built for each path (four weight rows at a time on AVX-512 and AVX2, a row at a time in
    plain C): each product against float64, with a last group of fewer than four rows; and an input's sums
    among five inputs bit for bit its sums alone (a stream's decode does not depend on who else decodes).
    genie_gq_products (4- and 5-bit weights in groups): every path the same bits as the reference's build (this
    CPU's), tails of 2, 4 and 9 blocks, and an input alone the same as among 13 (a decode step's numbers are a
    prompt's)."""
    kernels = _isa_kernels(isa, tmp_path)
    lib = kernels.lib
    rng = drawn_rng()
    reference = cpu_kernels.BlockKernels(cpu_kernels.load())
    for qtype, cols in ((Q.Q4_1, 576), (Q.Q4_K, 768), (Q.Q4_1, 800), (Q.Q5_0, 1024), (Q.Q5_0, 640), (Q.Q4_1, 64)):
        rows = 37
        raw = signed_blocks(qtype, rows, cols, rng)
        if qtype != Q.Q4_K:  # subnormal float16 scales (and mins) in some blocks: the float16 path widens them exactly
            blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
            for off in F16_FIELDS[qtype]:
                blocks[::5, off : off + 2] = (
                    np.array([1, 0x3FF, 0x8001, 0x200], np.uint16)[np.arange(len(blocks[::5])) % 4]
                    .view(np.uint8)
                    .reshape(-1, 2)
                )
        w = to_blocks(tensor_of(raw, qtype, rows, cols))
        assert w.layout in GROUPED
        # Q4_1's and Q5_0's scales are GGUF's float16s: kept so (20 bytes a Q4_1 block); Q4_K's d * sc are not
        assert w.scale.dtype == (np.float32 if qtype == Q.Q4_K else np.float16)
        x = rng.standard_normal((13, cols), dtype=np.float32)
        together = kernels.products(x, w)
        np.testing.assert_array_equal(together, reference.products(x, w))
        assert product_err(together, q8_coded(x), dequantize(raw, qtype).reshape(rows, cols)) < 2e-6
        for i in (0, 12):
            np.testing.assert_array_equal(kernels.products(x[i : i + 1], w)[0], together[i])
    for qtype in (Q.Q8_0, Q.Q6_K):  # blocks of 32, of 16
        rows, cols = 37, fit(qtype, 512)
        raw = signed_blocks(qtype, rows, cols, rng)
        w = to_blocks(tensor_of(raw, qtype, rows, cols))
        dense = dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
        x = rng.standard_normal((5, cols), dtype=np.float32)
        together = kernels.gemv(x, w)
        assert product_err(together, x, dense) < 2e-6
        for i in range(5):
            np.testing.assert_array_equal(kernels.gemv(x[i : i + 1], w)[0], together[i])
    lib.genie_set_threads(cpu_kernels.default_threads())


# reads the inputs of one genie_gq_products call (int64 K, n, rows, high, half and byte counts, then w, scale,
# offset and x) from argv[1], writes y to argv[2]: the call as an aarch64 build makes it, under qemu
ARM_DRIVER = """
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int genie_gq_products(const uint8_t *w, const void *scale, const void *offset, int64_t K, const float *x, int64_t n,
                      float *y, int64_t rows, int high, int half);
int genie_set_threads(int n);
static void *part(FILE *f, int64_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (bytes && fread(p, 1, bytes, f) != (size_t)bytes) exit(3);
    return p;
}
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    int64_t h[9];
    if (f == NULL || fread(h, 8, 9, f) != 9) return 2;
    void *w = part(f, h[5]), *s = part(f, h[6]), *o = part(f, h[7]);
    float *x = part(f, h[8]), *y = malloc(sizeof(float) * h[1] * h[2]);
    genie_set_threads(2);
    if (genie_gq_products(w, s, h[7] ? o : NULL, h[0], x, h[1], y, h[2], (int)h[3], (int)h[4])) return 4;
    FILE *out = fopen(argv[2], "wb");
    fwrite(y, sizeof(float), h[1] * h[2], out);
    return fclose(out);
}
"""


@pytest.mark.parametrize("march", ["armv8.2-a+dotprod", "armv8-a"])
def test_an_arm_build_of_the_grouped_products_gives_this_machines_bits(kernels, march, tmp_path):
    """genie_gq_products built for aarch64 (with the dot product: the NEON path a Jetson's or a Pi 5's cores run;
    without: the plain C path) and run under qemu: the bits of this machine's build for Q4_1 (float16 scales),
    Q5_0 (the fifth bits) and Q4_K rows (float32 scales, a tail group), a decode step and a prompt. Skipped
    without the cross compiler and qemu (Debian: gcc-aarch64-linux-gnu, qemu-user)."""
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if cc is None or qemu is None:
        pytest.skip("no aarch64 cross compiler or qemu-aarch64 on this machine")
    (tmp_path / "driver.c").write_text(ARM_DRIVER)
    source = ROOT / "workers/engine/backends/kernels" / cpu_kernels.SOURCE
    exe = tmp_path / "gq"
    build = [
        cc,
        "-O3",
        f"-march={march}",
        "-pthread",
        "-std=c11",
        "-o",
        str(exe),
        str(tmp_path / "driver.c"),
        str(source),
        "-lm",
    ]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    rng = drawn_rng()
    for qtype, rows, cols in ((Q.Q4_1, 40, 576), (Q.Q5_0, 33, 640), (Q.Q4_K, 24, 1280)):
        w = to_blocks(tensor_of(signed_blocks(qtype, rows, cols, rng), qtype, rows, cols))
        assert w.layout in GROUPED
        for n in (1, 5):
            x = rng.standard_normal((n, cols), dtype=np.float32)
            parts = [
                np.ascontiguousarray(a) for a in (w.q, w.scale, w.offset if w.offset is not None else np.empty(0), x)
            ]
            high, half = int(w.layout == LAYOUTS[Q.Q5_0]), int(w.scale.dtype == np.float16)
            head = np.array([cols, n, rows, high, half, *(a.nbytes for a in parts)], dtype=np.int64)
            (tmp_path / "in").write_bytes(head.tobytes() + b"".join(a.tobytes() for a in parts))
            run = [qemu, "-L", "/usr/aarch64-linux-gnu", str(exe), str(tmp_path / "in"), str(tmp_path / "out")]
            subprocess.run(run, check=True, capture_output=True, timeout=300)
            got = np.fromfile(tmp_path / "out", dtype=np.float32).reshape(n, rows)
            np.testing.assert_array_equal(got, kernels.products(x, w), err_msg=f"{march} {qtype.name} n={n}")


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q5_1], ids=lambda q: q.name)
def test_int8_rows_keep_ggufs_float16_scales_and_give_the_float32_scales_numbers(kernels, qtype):
    """Q8_0 / Q4_0 / Q5_1 rows keep GGUF's float16 d (and m): gemv, its norm and gate forms and the prompt path's
    dequantized rows give the bits of the same matrix with float32 scales; a stacked group is float32."""
    import dataclasses

    rng = drawn_rng()
    rows, cols = 300, 640
    w = to_blocks(tensor_of(signed_blocks(qtype, rows, cols, rng), qtype, rows, cols))
    assert w.scale.dtype == np.float16 and (w.offset is None or w.offset.dtype == np.float16)
    wide = dataclasses.replace(
        w, scale=w.scale.astype(np.float32), offset=None if w.offset is None else w.offset.astype(np.float32)
    )
    x = rng.standard_normal((3, cols), dtype=np.float32)
    np.testing.assert_array_equal(kernels.gemv(x, w), kernels.gemv(x, wide))
    norm = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    np.testing.assert_array_equal(
        kernels.norm_product(x, x, norm, 1e-6, w)[1], kernels.norm_product(x, x, norm, 1e-6, wide)[1]
    )
    gate_up = rng.standard_normal((2, 2 * cols), dtype=np.float32)
    np.testing.assert_array_equal(
        kernels.gated_product(gate_up, "silu", w), kernels.gated_product(gate_up, "silu", wide)
    )
    out = np.empty((rows, cols), dtype=np.float32)
    np.testing.assert_array_equal(kernels.dequantize(w, 0, rows, out), w.dequantize())
    assert concat_blocks([w, w]).scale.dtype == np.float32


def test_gemm_in_chunks_of_rows(kernels, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "DEQUANT_CHUNK_BYTES", 100 * 256 * 4)  # chunks of 100 rows, a ragged last one
    rng = drawn_rng()
    raw = signed_blocks(Q.Q6_K, 1001, 256, rng)
    w = to_blocks(tensor_of(raw, Q.Q6_K, 1001, 256))
    x = rng.standard_normal((20, 256), dtype=np.float32)
    ref = x.astype(np.float64) @ dequantize(raw, Q.Q6_K).astype(np.float64).T
    assert rel_err(kernels.gemm(x, w), ref) < 1e-5


def random_parts(spec: tuple[tuple[Q, int], ...], cols: int, rng: np.random.Generator) -> tuple[list, list]:
    """Matrices of the given (type, rows), cols wide, as loaded and as float32 (gguf's dequantization)."""
    parts, dense = [], []
    for qtype, rows in spec:
        raw = signed_blocks(qtype, rows, cols, rng)
        parts.append(to_blocks(tensor_of(raw, qtype, rows, cols)))
        dense.append(dequantize(raw, qtype).reshape(rows, cols))
    return parts, dense


def test_group_of_different_block_types(kernels):
    """QKV or gate/up of mixed types (Q4_K offsets, Q6_K blocks of 16, Q8_0) stack into one matrix."""
    rng = drawn_rng()
    parts, dense = random_parts(((Q.Q4_K, 64), (Q.Q6_K, 32), (Q.Q8_0, 48)), 512, rng)
    g = concat_blocks(parts)
    assert g.block == 16 and g.offset is not None
    np.testing.assert_array_equal(g.dequantize(), np.concatenate(dense))
    x = rng.standard_normal((2, 512), dtype=np.float32)
    assert rel_err(kernels.gemv(x, g), x.astype(np.float64) @ np.concatenate(dense).astype(np.float64).T) < 1e-5


def test_grouped_parts_of_float16_and_float32_scales_stack(kernels):
    """Q4_1 (float16 scales) beside Q4_K (float32) in one grouped matrix: float32 for all, the same products; two
    Q4_1 parts keep float16."""
    rng = drawn_rng()
    parts, dense = random_parts(((Q.Q4_1, 40), (Q.Q4_K, 24), (Q.Q4_1, 8)), 512, rng)
    g = concat_blocks(parts)
    assert g.layout in GROUPED and g.scale.dtype == np.float32 and g.offset is not None and g.offset.dtype == np.float32
    np.testing.assert_array_equal(g.dequantize(), np.concatenate(dense))
    x = rng.standard_normal((3, 512), dtype=np.float32)
    assert product_err(kernels.products(x, g), q8_coded(x), np.concatenate(dense)) < 2e-6
    assert concat_blocks([parts[0], parts[2]]).scale.dtype == np.float16


def test_non_finite_block_scale_is_an_error_naming_the_tensor():
    rng = drawn_rng()
    raw = random_blocks(Q.Q8_0, 4, 64, rng)
    raw[2, 0:2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
    with pytest.raises(ValueError, match="blk.3.ffn_up.weight holds non-finite"):
        to_blocks(tensor_of(raw, Q.Q8_0, 4, 64, "blk.3.ffn_up.weight"))


def test_quantized_model_same_logits_with_and_without_kernels():
    """The Q4_K_M tiny model: int8 blocks (Q4_K in groups through genie_gq_products at every row count; Q6_K's
    decode steps through the C GEMV, its prefill through dequantized chunks and BLAS) against float32 weights,
    position by position."""
    path = ROOT / "testkit/fixtures/tiny/llama-q4_k_m.gguf"
    ids = drawn_rng().integers(3, 200, 24)
    logits = []
    for kernels_on in (True, False):
        backend = NumpyBackend(block_kernels=kernels_on)
        m = Model.load(path, backend)
        assert isinstance(m.weights.layers[0].qkv, BlockWeight) == kernels_on
        c = m.config
        kv = KVCache(KVCacheConfig(c.n_layers, c.n_kv_heads, c.head_dim, c.v_head_dim, 64, 1, "f32"), np)
        prefill = forward(c, m.weights, backend, kv, 0, ids[:16], 0, slice(None))
        steps = [forward(c, m.weights, backend, kv, 0, ids[p : p + 1], p, slice(None)) for p in range(16, 24)]
        logits.append(np.concatenate([prefill, *steps]))
    assert np.isfinite(logits[0]).all()
    # the Q4_K matrices meet q8_0-coded inputs (a product 5e-3 of its terms off float: test_kernel_products_...);
    # through this random model's layers the logits move 5-7 % of the largest (mean 3-4 %): a wrong kernel is
    # off by the logits' size. The products themselves are checked exactly against the coded inputs above.
    d = np.abs(logits[0] - logits[1])
    assert d.max() < 0.15 * np.abs(logits[1]).max() and d.mean() < 0.06 * np.abs(logits[1]).mean()


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = child_env(**env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


PROBE = (
    "import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
    "from genie_workers.engine.backends.numpy_backend import NumpyBackend\n"
    "print(NumpyBackend().device_name)"
)


def test_no_compiler_means_float32_weights(tmp_path):
    r = run_python(PROBE, CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "numpy (float32 weights)"
    assert "no C kernels for the CPU backend" in r.stderr and "float32 weights" in r.stderr


def test_kernels_can_be_disabled_and_threads_set(tmp_path):
    r = run_python(PROBE, GENIE_CPU_KERNELS="0", XDG_CACHE_HOME=str(tmp_path))
    assert r.stdout.strip() == "numpy (float32 weights)" and "GENIE_CPU_KERNELS=0" in r.stderr
    r = run_python(PROBE, GENIE_CPU_THREADS="1", XDG_CACHE_HOME=str(tmp_path))
    assert r.stdout.strip() == "numpy (int8 blocks, 1 threads)", r.stderr
    assert len(list((tmp_path / "genie/kernels").glob("cpu_blocks-*.so"))) == 1  # compiled into the cache
    again = run_python(PROBE, GENIE_CPU_THREADS="1", XDG_CACHE_HOME=str(tmp_path))
    assert again.stdout == r.stdout and len(list((tmp_path / "genie/kernels").iterdir())) == 1


BLAS_PROBE = """
from threadpoolctl import threadpool_info
from genie_workers.engine.backends.numpy_backend import NumpyBackend
b = NumpyBackend()
print(b.device_name, [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"])
"""


@pytest.mark.parametrize(
    "env, want",
    [
        ({"GENIE_CPU_THREADS": "2"}, "numpy (int8 blocks, 2 threads) [1]"),  # prefill's pool: BLAS single
        ({"GENIE_CPU_THREADS": "2", "GENIE_CPU_KERNELS": "0"}, "numpy (float32 weights) [2]"),
        ({"GENIE_CPU_THREADS": "1", "GENIE_CPU_KERNELS": "0"}, "numpy (float32 weights) [1]"),
    ],
)
def test_blas_threads_follow_genies_thread_setting(tmp_path, env, want):
    """BLAS left to itself took two spinning threads beside genie's: a 14-token prefill took 2.6-16.8 s
    instead of 0.26 s on a busy 2-core machine, and GENIE_CPU_THREADS=1 did not help (issue 16)."""
    r = run_python(BLAS_PROBE, XDG_CACHE_HOME=str(tmp_path), **env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_gemm_rows_claimed_by_a_pool_of_threads(threads):
    lib = cpu_kernels.load()
    if lib is None:
        pytest.skip("no C kernels on this machine")
    pooled = cpu_kernels.BlockKernels(lib, threads)
    rng = np.random.default_rng(threads)
    raw = signed_blocks(Q.Q6_K, 2047, 512, rng)
    w = to_blocks(tensor_of(raw, Q.Q6_K, 2047, 512))
    x = rng.standard_normal((77, 512), dtype=np.float32)
    ref = x.astype(np.float64) @ dequantize(raw, Q.Q6_K).astype(np.float64).T
    assert rel_err(pooled.gemm(x, w), ref) < 1e-5
    lib.genie_set_threads(cpu_kernels.default_threads())  # the module's other tests' setting


@pytest.mark.parametrize(
    ("n_heads", "n_kv", "hd", "hdv", "softcap", "window", "pos0"),
    [
        (9, 3, 64, 64, 0.0, 0, 211),  # runs of 64 positions on one thread
        (9, 3, 64, 64, 0.0, 0, 1100),  # ... on the pool's threads
        (8, 1, 256, 512, 50.0, 37, 211),
        (8, 1, 256, 512, 0.0, 0, 1100),
        (4, 4, 32, 32, 0.0, 0, 211),
    ],
)
def test_one_token_attention_over_int8_rows_is_the_numpy_loop(kernels, n_heads, n_kv, hd, hdv, softcap, window, pos0):
    """The attention in C of a decode step and of a prompt's tokens (genie_attn_rows_i8: the int8 rows read
    where they are) against NumpyBackend's loop over KV heads (which widens them to float32), for grouped heads,
    Gemma 4's head dims with a softcap and a sliding window, and plain multi-head attention; short and long enough
    for the threads; and each of a prompt's tokens the same bits as that token alone (as a decode step)."""
    from genie_workers.engine.kv_cache import LayerKV

    rng = drawn_rng()
    n_slots, n_ctx, slot = 2, 1200, 1
    layer = LayerKV(
        rng.integers(-127, 128, (n_slots, n_ctx, n_kv, hd), dtype=np.int8),
        rng.integers(-127, 128, (n_slots, n_ctx, n_kv, hdv), dtype=np.int8),
        rng.uniform(0.001, 0.05, (n_slots, n_ctx, n_kv)).astype(np.float32),
        rng.uniform(0.001, 0.05, (n_slots, n_ctx, n_kv)).astype(np.float32),
    )
    with_c, without = NumpyBackend(), NumpyBackend()
    without._blocks = None  # the loop the other one leaves for a single token
    for n in (1, 7, GEMV_MAX_TOKENS, GEMV_MAX_TOKENS + 13):  # the last in two calls of rows
        q = rng.standard_normal((n, n_heads, hd), dtype=np.float32)
        got = with_c.attention(q, layer, slot, pos0, window, 0.125, softcap)
        want = without.attention(q, layer, slot, pos0, window, 0.125, softcap)
        assert got.shape == (n, n_heads * hdv) and np.isfinite(got).all()
        assert rel_err(got, want) < 1e-5
        for i in (0, n - 1):
            alone = with_c.attention(q[i : i + 1], layer, slot, pos0 + i, window, 0.125, softcap)
            np.testing.assert_array_equal(alone[0], got[i])


def test_attention_of_more_query_heads_a_kv_head_than_the_c_code_holds_is_refused_not_overrun(kernels):
    """genie_attn_rows_i8 keeps a lane-sum buffer for ATTN1_MAX_GROUP query heads a KV head: more are refused (a
    ValueError from the call, and takes_attention says no, so the backend takes NumPy's loop)."""
    from genie_workers.engine.backends.cpu_kernels import ATTN1_MAX_GROUP
    from genie_workers.engine.kv_cache import LayerKV

    group = ATTN1_MAX_GROUP + 1
    assert kernels.takes_attention(64, 64, ATTN1_MAX_GROUP) and not kernels.takes_attention(64, 64, group)
    layer = LayerKV(
        np.zeros((1, 8, 1, 64), dtype=np.int8),
        np.zeros((1, 8, 1, 64), dtype=np.int8),
        np.ones((1, 8, 1), dtype=np.float32),
        np.ones((1, 8, 1), dtype=np.float32),
    )
    q = np.ones((1, group, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="query heads a KV head"):
        kernels.attention_rows(q, layer, 0, np.array([0]), np.array([8]), 0.125, 0.0)


@pytest.mark.parametrize(("lo", "end"), [(-1, 4), (0, 9), (5, 5), (6, 3)], ids=["before", "past", "none", "reversed"])
def test_attention_over_positions_outside_the_pool_is_refused_not_read(kernels, lo, end):
    """genie_attn_rows_i8 checks each row's positions against the pool's: a ValueError naming them, out untouched."""
    from genie_workers.engine.kv_cache import LayerKV

    layer = LayerKV(
        np.zeros((1, 8, 1, 64), dtype=np.int8),
        np.zeros((1, 8, 1, 64), dtype=np.int8),
        np.ones((1, 8, 1), dtype=np.float32),
        np.ones((1, 8, 1), dtype=np.float32),
    )
    q = np.ones((2, 2, 64), dtype=np.float32)
    out = np.full((2, 2, 64), 7.0, dtype=np.float32)
    with pytest.raises(ValueError, match="positions"):
        kernels.attention_rows(q, layer, 0, np.array([0, lo]), np.array([8, end]), 0.125, 0.0, out=out)
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match="float32 wanted"):
        kernels.attention_rows(q, layer, 0, np.array([0, 0]), np.array([8, 8]), 0.125, 0.0, out=out[:1])
    got = kernels.attention_rows(q, layer, 0, np.array([0, 2]), np.array([8, 3]), 0.125, 0.0, out=out)
    assert got is out and (out == 0.0).all()  # zero values everywhere


def test_array_addresses_for_the_c_code():
    """address(): a C-contiguous array's data, read-only and empty ones too; a strided one is refused, not read
    past (the C code walks rows as if they were packed)."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert cpu_kernels.address(a) == a.ctypes.data
    assert cpu_kernels.address(a[1]) == a.ctypes.data + 16
    ro = a.copy()
    ro.flags.writeable = False
    assert cpu_kernels.address(ro) == ro.ctypes.data
    empty = np.empty((0, 4), dtype=np.float32)
    assert cpu_kernels.address(empty) == empty.ctypes.data
    with pytest.raises(ValueError, match="C-contiguous"):
        cpu_kernels.address(a[:, ::2])


@pytest.mark.parametrize("d", [64, 576, 640, 2048, 37])
def test_norms_and_gates_are_numpys_and_a_row_gets_the_same_alone(kernels, d):
    """genie_add_rms_norm and genie_gated_act against the NumPy backend's formulas without the kernels (float32,
    within 1e-6 of the largest value), a row alone bit for bit as among others, the inputs left as they were, and an
    activation the C code does not know refused."""
    rng = drawn_rng()
    ref = NumpyBackend(block_kernels=False)
    x = rng.standard_normal((5, d), dtype=np.float32) * 3
    r = rng.standard_normal((5, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    before = x.copy(), r.copy()
    s, h = kernels.add_rms_norm(x, r, w, 1e-6)
    want_s, want_h = ref.add_rms_norm(x, r, w, 1e-6)
    np.testing.assert_array_equal(s, want_s)
    assert rel_err(h, want_h) < 1e-6
    same, h1 = kernels.add_rms_norm(x, None, w, 1e-6)
    assert same is x and rel_err(h1, ref.rms_norm(x, w, 1e-6)) < 1e-6
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(r, before[1])
    np.testing.assert_array_equal(kernels.add_rms_norm(x[3:4], r[3:4], w, 1e-6)[1], h[3:4])
    strided = np.repeat(r, 2, axis=1)[:, ::2]  # a copy is made for the C code, and kept until it is done
    for got, want in zip(kernels.add_rms_norm(x, strided, w, 1e-6), (s, h), strict=True):
        np.testing.assert_array_equal(got, want)
    gate_up = rng.standard_normal((5, 2 * d), dtype=np.float32) * 4
    gate_up[0, :6] = [0.0, 1e-7, -1e-7, 60.0, -60.0, -1e12]  # tanh's ends, a cube near float32's largest
    for kind in ("silu", "gelu_tanh"):
        got, want = kernels.gated_act(gate_up, kind), ref.gated_act(gate_up, kind)
        assert np.isfinite(got).all() and np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), kind
        np.testing.assert_array_equal(kernels.gated_act(gate_up[2:3], kind), got[2:3])
    with pytest.raises(ValueError, match="unknown activation relu"):
        kernels.gated_act(gate_up, "relu")
    with pytest.raises(ValueError, match="norm weight"):
        kernels.add_rms_norm(x, r, w[1:], 1e-6)


def test_one_token_attention_is_the_same_on_one_thread_and_two(kernels):
    """The runs of positions are fixed, not a share of the threads: the same sums, bit for bit."""
    from genie_workers.engine.kv_cache import LayerKV

    rng = np.random.default_rng(7)
    n_ctx, n_kv, hd = 1500, 3, 64
    layer = LayerKV(
        rng.integers(-127, 128, (1, n_ctx, n_kv, hd), dtype=np.int8),
        rng.integers(-127, 128, (1, n_ctx, n_kv, hd), dtype=np.int8),
        rng.uniform(0.001, 0.05, (1, n_ctx, n_kv)).astype(np.float32),
        rng.uniform(0.001, 0.05, (1, n_ctx, n_kv)).astype(np.float32),
    )
    q = rng.standard_normal((2, 9, hd), dtype=np.float32)
    lo, end = np.array([0, 100]), np.array([n_ctx, n_ctx - 7])
    outs = []
    try:
        for threads in (1, 2):
            kernels.lib.genie_set_threads(threads)
            outs.append(kernels.attention_rows(q, layer, 0, lo, end, 0.125, 0.0))
    finally:
        kernels.lib.genie_set_threads(cpu_kernels.default_threads())
    assert np.array_equal(outs[0], outs[1])


def test_head_dims_the_c_attention_does_not_take_keep_the_loop(kernels):
    assert kernels.takes_attention(64, 64) and kernels.takes_attention(256, 512)
    assert not kernels.takes_attention(72, 72) and not kernels.takes_attention(64, 2048)


def _pooled_products(rng: np.random.Generator, kernels: cpu_kernels.BlockKernels) -> list[tuple[Any, np.ndarray]]:
    """Products large enough for the pool's threads (2 048 x 640: gemv's 64 claims of 32 rows; the groups' two
    inputs a decode step's, a run of rows a thread) and their reference inputs: genie_blk_gemv (Q8_0) and
    genie_gq_products (Q4_1, Q5_0: groups) of two inputs."""
    rows, cols = 2048, 640
    x = rng.standard_normal((2, cols), dtype=np.float32)
    q8, q4, q5 = (
        to_blocks(tensor_of(signed_blocks(t, rows, cols, rng), t, rows, cols)) for t in (Q.Q8_0, Q.Q4_1, Q.Q5_0)
    )
    return [
        (lambda: kernels.gemv(x, q8), product_err_of(x, q8)),
        (lambda: kernels.products(x, q4), product_err_of(q8_coded(x), q4)),
        (lambda: kernels.products(x, q5), product_err_of(q8_coded(x), q5)),
    ]


def product_err_of(x: np.ndarray, w: BlockWeight) -> Any:
    return lambda got: product_err(got, x, w.dequantize().astype(np.float64))


def test_products_are_the_same_on_one_two_and_four_threads_and_from_two_callers_at_once(kernels):
    """Rows are claimed by whichever thread is free, each row's sums its own: the same bits on any number of
    threads; two Python threads calling at once (the second runs alone on its own thread) get what one gets."""
    import threading

    for product, err in _pooled_products(drawn_rng(), kernels):
        outs = []
        try:
            for threads in (1, 2, 4):
                kernels.lib.genie_set_threads(threads)
                outs.append(product())
            together: list[np.ndarray] = []

            def call(product: Any = product, together: list[np.ndarray] = together) -> None:
                together.extend(product() for _ in range(200))

            callers = [threading.Thread(target=call) for _ in range(2)]
            for t in callers:
                t.start()
            for t in callers:
                t.join()
        finally:
            kernels.lib.genie_set_threads(cpu_kernels.default_threads())
        assert err(outs[0]) < 2e-6
        for got in outs[1:] + together:
            np.testing.assert_array_equal(got, outs[0])
        assert len(together) == 400


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K, Q.Q4_1, Q.Q5_0, Q.Q4_K], ids=lambda q: q.name)
def test_a_norm_or_a_gate_and_its_product_in_one_call_are_the_two_calls(kernels, qtype):
    """genie_norm_products (Backend.add_norm_matmul's add, norm and product) against add_rms_norm then products()
    (grouped layouts) or gemv() (int8 rows), bit for bit, with and without the residual, for a decode step's rows
    and a prompt's; genie_gated_products (gated_matmul) against gated_act then the product alike; and the NumPy
    backend takes them for add_norm_matmul and gated_matmul (the same results as their two steps)."""
    rng = drawn_rng()
    rows, cols = 1000, 512
    w = to_blocks(tensor_of(signed_blocks(qtype, rows, cols, rng), qtype, rows, cols))
    norm = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    product = kernels.products if w.layout in GROUPED else kernels.gemv
    for n in (1, 3, 32 if w.layout in GROUPED else 7):
        x = rng.standard_normal((n, cols), dtype=np.float32)
        r = rng.standard_normal((n, cols), dtype=np.float32)
        for res in (r, None):
            s, y = kernels.norm_product(x, res, norm, 1e-6, w)
            want_s, h = kernels.add_rms_norm(x, res, norm, 1e-6)
            np.testing.assert_array_equal(s, want_s)
            np.testing.assert_array_equal(y, product(h, w))
            assert (s is x) == (res is None)
        gate_up = rng.standard_normal((n, 2 * cols), dtype=np.float32) * 3
        for act in ("silu", "gelu_tanh"):
            np.testing.assert_array_equal(
                kernels.gated_product(gate_up, act, w), product(kernels.gated_act(gate_up, act), w)
            )
    backend = NumpyBackend()
    x, r = x[:1], r[:1]
    got = backend.add_norm_matmul(x, r, norm, 1e-6, w)
    want = Backend.add_norm_matmul(backend, x, r, norm, 1e-6, w)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    gate_up = gate_up[:1]
    np.testing.assert_array_equal(
        backend.gated_matmul(gate_up, "silu", w), Backend.gated_matmul(backend, gate_up, "silu", w)
    )
    with pytest.raises(ValueError, match="unknown activation relu"):
        kernels.gated_product(gate_up, "relu", w)
    with pytest.raises(ValueError, match="norm weight"):
        kernels.norm_product(x, r, norm[1:], 1e-6, w)


def test_a_matrix_of_no_rows_gives_no_outputs(kernels):
    """A decode step's rows are one run a thread: a product with no rows has no run to hand out, not a division by
    a run of none (genie_gq_products, genie_blk_gemv)."""
    rng = np.random.default_rng(3)
    for qtype in (Q.Q8_0, Q.Q4_1):
        w = to_blocks(tensor_of(signed_blocks(qtype, 8, 640, rng), qtype, 8, 640))
        empty = BlockWeight(w.q[:0], w.scale[:0], None if w.offset is None else w.offset[:0], w.block, w.layout)
        for n in (1, 9):
            x = rng.standard_normal((n, 640), dtype=np.float32)
            got = kernels.products(x, empty) if w.layout in GROUPED else kernels.gemv(x, empty)
            assert got.shape == (n, 0)


def test_a_forked_child_runs_products_on_threads_of_its_own(kernels):
    """The pool's threads are its process's: a child forked after they started (none of them in it) starts
    its own (the child has two threads after a product on two) and gets the parent's numbers."""
    import warnings

    products = _pooled_products(drawn_rng(), kernels)
    kernels.lib.genie_set_threads(2)
    want = [product() for product, _ in products]  # the parent's worker thread is running now
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12 warns of fork in a process with threads
        pid = os.fork()
    if pid == 0:  # the child: its products, their bytes to the parent, and out without pytest's teardown
        try:
            got = b"".join(product().tobytes() for product, _ in products)
            os.write(write, len(os.listdir("/proc/self/task")).to_bytes(4, "little") + got)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        sent = f.read()
    threads, got = int.from_bytes(sent[:4], "little"), np.frombuffer(sent[4:], dtype=np.float32)
    _, status = os.waitpid(pid, 0)
    kernels.lib.genie_set_threads(cpu_kernels.default_threads())
    assert os.waitstatus_to_exitcode(status) == 0
    assert threads == 2
    np.testing.assert_array_equal(got, np.concatenate([w.reshape(-1) for w in want]))


@pytest.mark.parametrize(
    "H, Hkv, hd, hdv, rope_dim, mode, qk_norm, v_norm",
    [
        (9, 3, 64, 64, 64, "norm", False, False),  # SmolLM2's layout
        (4, 1, 256, 256, 256, "neox", True, False),  # Gemma 3's
        (8, 1, 80, 48, 32, "neox", True, True),  # head dims not a power of two, partial RoPE, V norm (Gemma 4)
    ],
)
def test_qkv_rows_into_an_int8_pool_are_numpys_and_a_row_gets_the_same_alone(
    kernels, H, Hkv, hd, hdv, rope_dim, mode, qk_norm, v_norm
):
    """genie_qkv_i8 against Backend.prepare_qkv's NumPy (norms, RoPE, kv_write's rotation and coding, q rotated
    as attention does): q within float rounding, each stored K/V value within one code; and a prompt's rows in
    one call are the rows one at a time, bit for bit (a warm prefix and a cold prompt store the same rows)."""
    from types import SimpleNamespace

    from genie_workers.engine.backends.base import Backend
    from genie_workers.engine.kv_cache import LayerKV, kv_rotation

    rng = drawn_rng()
    n, pos0, n_ctx = 37, 5, 64
    cfg = SimpleNamespace(n_heads=H, rms_eps=1e-6, rope_mode=mode, v_norm=v_norm)
    lc = SimpleNamespace(
        head_dim=hd, v_head_dim=hdv, n_kv_heads=Hkv, rope_base=10000.0, rope_scale=1.0, rope_dim=rope_dim,
        rope_freq_factors=None,
    )  # fmt: skip
    qkv = rng.standard_normal((n, (H + Hkv) * hd + Hkv * hdv), dtype=np.float32) * 3
    norm = rng.uniform(0.5, 1.5, (H + Hkv, hd)).astype(np.float32) if qk_norm else None
    positions = np.arange(pos0, pos0 + n)
    backend = NumpyBackend()

    def pool() -> LayerKV:
        return LayerKV(
            np.zeros((2, n_ctx, Hkv, hd), np.int8), np.zeros((2, n_ctx, Hkv, hdv), np.int8),
            np.zeros((2, n_ctx, Hkv), np.float32), np.zeros((2, n_ctx, Hkv), np.float32),
        )  # fmt: skip

    want_kv, got_kv, alone_kv = pool(), pool(), pool()
    backend._rotate = lambda x: x @ kv_rotation(x.shape[-1])  # the reference: the rotation as the matrix product
    want_q = backend._rotate(Backend.prepare_qkv(backend, qkv.copy(), cfg, lc, norm, positions, want_kv, 1, pos0))
    table = backend._rope_table(10000.0, 1.0, rope_dim, pos0 + n)
    cos, sin = table.cos[pos0 : pos0 + n], table.sin[pos0 : pos0 + n]
    got_q = kernels.qkv_i8(qkv, (H, Hkv), norm, 1e-6, v_norm, cos, sin, mode == "neox", got_kv, 1, pos0)
    alone_q = np.concatenate(
        [
            kernels.qkv_i8(qkv[i : i + 1], (H, Hkv), norm, 1e-6, v_norm, cos[i : i + 1], sin[i : i + 1],
                           mode == "neox", alone_kv, 1, pos0 + i)
            for i in range(n)
        ]
    )  # fmt: skip
    assert rel_err(got_q, want_q) < 1e-5
    rows = slice(pos0, pos0 + n)
    for part in ("k", "v"):  # codes with their scales
        g_codes, g_scales = getattr(got_kv, part), getattr(got_kv, f"{part}_scale")
        w_codes, w_scales = getattr(want_kv, part), getattr(want_kv, f"{part}_scale")
        got = g_codes[1, rows].astype(np.float32) * g_scales[1, rows][..., None]
        want = w_codes[1, rows].astype(np.float32) * w_scales[1, rows][..., None]
        assert np.all(np.abs(got - want) <= w_scales[1, rows][..., None] * 1.001 + 1e-7)
        np.testing.assert_allclose(g_scales[1, rows], w_scales[1, rows], rtol=1e-5)
        assert not g_codes[0].any() and not g_codes[1, :pos0].any() and not g_codes[1, pos0 + n :].any()
    np.testing.assert_array_equal(alone_q, got_q)
    for a, b in zip(
        (alone_kv.k, alone_kv.v, alone_kv.k_scale, alone_kv.v_scale),
        (got_kv.k, got_kv.v, got_kv.k_scale, got_kv.v_scale),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("H", "Hkv", "hd", "hdv", "window"), [(9, 3, 64, 64, 0), (4, 1, 256, 256, 20), (8, 1, 80, 48, 0)]
)
def test_a_layers_attention_in_one_call_is_its_three_calls_and_a_row_gets_the_same_alone(
    kernels, H, Hkv, hd, hdv, window
):
    """genie_attend_i8 against qkv_i8, attention_rows over each row's positions (the last `window`, or all) and the
    rotation back, bit for bit, for a prompt of more rows than one attention call takes; the same rows one at a
    time; and rows past the slot's positions refused with nothing written."""
    from genie_workers.engine.kv_cache import LayerKV

    rng = drawn_rng()
    n, pos0, n_ctx, neox = 45, 3, 64, True

    def pool() -> LayerKV:
        return LayerKV(
            np.zeros((2, n_ctx, Hkv, hd), np.int8), np.zeros((2, n_ctx, Hkv, hdv), np.int8),
            np.zeros((2, n_ctx, Hkv), np.float32), np.zeros((2, n_ctx, Hkv), np.float32),
        )  # fmt: skip

    qkv = rng.standard_normal((n, (H + Hkv) * hd + Hkv * hdv), dtype=np.float32) * 3
    norm = rng.uniform(0.5, 1.5, (H + Hkv, hd)).astype(np.float32)
    table = NumpyBackend()._rope_table(10000.0, 1.0, hd, pos0 + n)
    cos, sin = table.cos[pos0 : pos0 + n], table.sin[pos0 : pos0 + n]
    want_kv, got_kv, alone_kv = pool(), pool(), pool()
    q = kernels.qkv_i8(qkv, (H, Hkv), norm, 1e-6, False, cos, sin, neox, want_kv, 1, pos0)
    pos = np.arange(pos0, pos0 + n)
    lo = np.maximum(pos - window + 1, 0) if window else np.zeros(n, dtype=np.int64)
    want = kernels.rotate(kernels.attention_rows(q, want_kv, 1, lo, pos + 1, 0.1, 0.0)).reshape(n, H * hdv)
    got = kernels.attend_i8(qkv, (H, Hkv), norm, 1e-6, False, cos, sin, neox, got_kv, 1, pos0, window, 0.1, 0.0)
    np.testing.assert_array_equal(got, want)
    for i in range(n):
        one = kernels.attend_i8(qkv[i : i + 1], (H, Hkv), norm, 1e-6, False, cos[i : i + 1], sin[i : i + 1], neox,
                                alone_kv, 1, pos0 + i, window, 0.1, 0.0)  # fmt: skip
        np.testing.assert_array_equal(one, got[i : i + 1])
    for a, b in zip((got_kv.k, got_kv.v, got_kv.k_scale), (want_kv.k, want_kv.v, want_kv.k_scale), strict=True):
        np.testing.assert_array_equal(a, b)
    before = got_kv.k.copy()
    with pytest.raises(ValueError, match="positions 62..64 of 64"):
        kernels.attend_i8(qkv[:3], (H, Hkv), norm, 1e-6, False, cos[:3], sin[:3], neox, got_kv, 1, 62, 0, 0.1, 0.0)
    np.testing.assert_array_equal(got_kv.k, before)


@pytest.mark.parametrize("d", [64, 80, 256, 512])
def test_rotated_rows_are_the_rotation_matrix_product_and_a_row_gets_the_same_alone(kernels, d):
    """genie_rotate_rows (kv_rotation's Hadamard blocks as butterflies) against x @ kv_rotation(d), and a prompt's
    rows against each row alone, bit for bit; the input is left as it was."""
    from genie_workers.engine.kv_cache import kv_rotation

    rng = drawn_rng()
    x = rng.standard_normal((300, 3, d), dtype=np.float32)
    before = x.copy()
    got = kernels.rotate(x)
    assert rel_err(got, x @ kv_rotation(d)) < 1e-6
    np.testing.assert_array_equal(x, before)
    for i in (0, 151, 299):
        np.testing.assert_array_equal(kernels.rotate(x[i : i + 1]), got[i : i + 1])
    assert kernels.rotate_in_place(x) is x
    np.testing.assert_array_equal(x, got)


def _file_rss_kib(path: Path) -> int:
    """This process's resident KiB of its mappings of `path` (/proc/self/smaps)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's first line: its range, ..., its path
            ours = line.split()[-1] == str(path)
        elif ours and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")
def test_blocks_made_from_a_mapped_file_leave_none_of_its_pages_resident(tmp_path):
    """to_blocks lets go of each chunk's pages of the file as it goes (TensorInfo.release_bytes): a load holds a
    chunk of a large tensor beside its copy, not the whole tensor. Reading the data again brings them back (the
    measure sees pages), and an array that is not a mapping is left alone."""
    import gguf

    from genie_common.gguf_file import GGUFFile

    rows, cols = 4096, 2048  # Q8_0: 8.9 MB, past UNPACK_CHUNK_BYTES
    raw = random_blocks(Q.Q8_0, rows, cols, drawn_rng())
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw.reshape(rows, -1), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as gf:
        info = gf.tensors["w"]
        blocks = to_blocks(info)
        after_load = _file_rss_kib(path)
        assert int(info.data.sum()) > 0  # every page of the tensor read again
        read_back = _file_rss_kib(path)
    np.testing.assert_array_equal(blocks.dequantize(), dequantize(raw, Q.Q8_0).reshape(rows, cols))
    assert after_load < 512 and read_back > raw.nbytes // 1024 * 9 // 10, (after_load, read_back)
    own = tensor_of(raw, Q.Q8_0, rows, cols)
    own.release_bytes(0, own.n_bytes)  # no mapping: nothing to let go of, nothing changed
    np.testing.assert_array_equal(own.data, raw.reshape(-1))
