"""The CPU backend's C kernels (kernels/cpu_blocks.c): compiled at first use, called through ctypes.

Like the CuPy backend's CUDA sources, the C source ships with the package and is compiled on the
machine that runs it (`$CC`, else `cc`, with `-O3 -march=native`), once: the library is cached under
`$XDG_CACHE_HOME/genie/kernels` keyed by a hash of the source, the flags and the compiler's version.
Without a working compiler `load()` returns None and says why once in the log; the NumPy backend then
keeps float32 weights (slower, four times the memory), so nothing else changes. `GENIE_CPU_KERNELS=0`
forces that fallback.

All threads are genie's, one setting (`GENIE_CPU_THREADS`, default one per core the process may use):
the 4- and 5-bit types' products (any number of rows: genie_gq_products) and the other types' one-token
products split their rows over the C library's own threads; the other types' many-token products (prefill) run
on a pool of as many Python threads, each claiming a run of weight rows, dequantizing it and multiplying it with
single-threaded BLAS. BLAS's own threads are held to one with threadpoolctl: OpenBLAS splits a
product statically and spins while it waits, so on a machine with another busy process its threads
held each other up, and a 14-token prefill took 2.6-16.8 s instead of 0.26 s (issue 16). Claimed runs
leave a thread that the scheduler holds up only its own run to finish late. The C library's threads spin
for a moment between calls (a token's ~150 calls would otherwise wake a sleeping core each time), and not
at all while the machine is busy (they were seen waiting for a core): cpu_blocks.c, "the threads".
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import TypeVar

import numpy as np

from genie_common import env
from genie_common.atomic_file import atomic_path

from ..kv_cache import LayerKV
from .block_weight import GROUPED, GROUPS_HIGH, INT8, BlockWeight

log = logging.getLogger("genie.cpu")

SOURCE = "cpu_blocks.c"
# the later one for compilers without -march=native
FLAG_SETS = (["-O3", "-march=native", "-pthread"], ["-O3", "-pthread"])
COMPILE_TIMEOUT_S = 120
ATTN1_MAX_DIM = 1024  # cpu_blocks.c's: head dims genie_attn_rows_i8 takes
ATTN1_MAX_GROUP = 32  # and query heads a KV head
DEQUANT_CHUNK_BYTES = 1 << 20  # float32 rows a pool thread dequantizes and multiplies per claim, at most
CLAIMS_PER_THREAD = 4  # at least this many runs of rows per thread, so a held-up thread delays little

GATES = {"silu": 0, "gelu_tanh": 1}  # genie_gated_act's kinds
T = TypeVar("T")
_DONE = object()  # each(): no item left
_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p
_byte = ctypes.c_char


def address(a: np.ndarray) -> int:
    """A C-contiguous array's data address: ctypes' from_buffer takes ~0.3 us where numpy's `.ctypes.data` takes ~1 us,
    and a SmolLM2 decode token passes ~750 arrays (bench/NOTES.md, CPU note 2026-12-07)."""
    try:
        return ctypes.addressof(_byte.from_buffer(a))  # type: ignore[arg-type]  # an ndarray is a buffer
    except (TypeError, ValueError):  # read-only, empty or not contiguous
        if not a.flags.c_contiguous:
            raise ValueError(f"the C kernels take C-contiguous arrays, not strides {a.strides}") from None
        return a.ctypes.data


def _cache_dir() -> Path:
    return env.cache_home() / "genie" / "kernels"


def _compiler_id(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()[0] if out.stdout else cc


def _cpu_id() -> str:
    """What -march=native compiled for: a cache shared with (or moved to) another CPU must not load it."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.machine() + platform.processor()


def _build(cc: str, source: Path, target: Path, flags: list[str]) -> None:
    with atomic_path(target) as tmp:
        cmd = [cc, *flags, "-std=c11", "-shared", "-fPIC", "-o", str(tmp), str(source), "-lm"]
        subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=True)


def _compile() -> ctypes.CDLL:
    """The loaded library, compiled into the cache if it is not there yet; raises on any failure."""
    cc = env.c_compiler()
    ident = _compiler_id(cc) + _cpu_id()
    with resources.as_file(resources.files(__package__) / "kernels" / SOURCE) as source:
        text = source.read_bytes()
        errors = []
        for flags in FLAG_SETS:
            key = hashlib.sha256(text + ident.encode() + " ".join(flags).encode()).hexdigest()[:16]
            target = _cache_dir() / f"cpu_blocks-{key}.so"
            try:
                if not target.exists():
                    _build(cc, source, target, flags)
                return ctypes.CDLL(str(target))
            except (OSError, subprocess.SubprocessError) as e:
                detail = e.stderr.strip().splitlines()[-1] if isinstance(e, subprocess.CalledProcessError) else e
                errors.append(f"{' '.join(flags)}: {detail}")
    raise RuntimeError("; ".join(errors))


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def default_threads() -> int:
    threads = env.cpu_threads()
    if threads:
        return threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load() -> ctypes.CDLL | None:
    """The kernel library, or None (logged once) when disabled or no compiler can build it."""
    with _lock:
        if "lib" not in _loaded:
            lib = None
            if not env.cpu_kernels_enabled():
                log.info("CPU kernels disabled (GENIE_CPU_KERNELS=0): float32 weights")
            else:
                try:
                    lib = _compile()
                    _declare(lib)
                except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
                    log.warning("no C kernels for the CPU backend (%s): float32 weights, slower decode", e)
            _loaded["lib"] = lib
        return _loaded["lib"]


def _declare(lib: ctypes.CDLL) -> None:
    lib.genie_set_threads.argtypes = [ctypes.c_int]
    lib.genie_set_threads.restype = ctypes.c_int
    lib.genie_blk_gemv.argtypes = [_ptr, _ptr, _ptr, _i64, _i64, _ptr, _i64, _ptr, _i64, ctypes.c_int]
    lib.genie_blk_gemv.restype = ctypes.c_int
    lib.genie_blk_dequant.argtypes = [_ptr, _ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, ctypes.c_int]
    lib.genie_blk_dequant.restype = None
    lib.genie_gq_products.argtypes = [_ptr, _ptr, _ptr, _i64, _ptr, _i64, _ptr, _i64, ctypes.c_int, ctypes.c_int]
    lib.genie_gq_products.restype = ctypes.c_int
    f = ctypes.c_float
    # q, k, ks, v, vs, n, lo, t, positions, n_heads, n_kv, hd, hdv, scale, softcap, out
    lib.genie_attn_rows_i8.argtypes = [*[_ptr] * 5, _i64, _ptr, _ptr, *[_i64] * 5, f, f, _ptr]
    lib.genie_attn_rows_i8.restype = ctypes.c_int
    i, i64 = ctypes.c_int, _i64
    lib.genie_qkv_i8.argtypes = [_ptr, *[i64] * 5, _ptr, f, i, _ptr, _ptr, i64, i, *[_ptr] * 5]
    lib.genie_qkv_i8.restype = None
    lib.genie_rotate_rows.argtypes = [_ptr, i64, i64]
    lib.genie_rotate_rows.restype = None
    # qkv, n, H, Hkv, hd, hdv, qk_norm, eps, v_norm, cos, sin, rope_dim, neox, k, ks, v, vs, pos0, positions,
    # window, scale, softcap, out
    lib.genie_attend_i8.argtypes = [_ptr, *[i64] * 5, _ptr, f, i, _ptr, _ptr, i64, i, *[_ptr] * 4, *[i64] * 3]
    lib.genie_attend_i8.argtypes += [f, f, _ptr]
    lib.genie_attend_i8.restype = ctypes.c_int
    # x, r, norm, eps, s, n, K, kind, w, scale, offset, bs, high, half, y, rows
    lib.genie_norm_products.argtypes = [_ptr, _ptr, _ptr, f, _ptr, i64, i64, i, *[_ptr] * 3, i64, i, i, _ptr, i64]
    lib.genie_norm_products.restype = ctypes.c_int
    # gate_up, n, f, act, kind, w, scale, offset, bs, high, half, y, rows
    lib.genie_gated_products.argtypes = [_ptr, i64, i64, i, i, *[_ptr] * 3, i64, i, i, _ptr, i64]
    lib.genie_gated_products.restype = ctypes.c_int
    lib.genie_add_rms_norm.argtypes = [_ptr, _ptr, _ptr, i64, i64, f, _ptr, _ptr]
    lib.genie_add_rms_norm.restype = None
    lib.genie_gated_act.argtypes = [_ptr, i64, i64, i, _ptr]
    lib.genie_gated_act.restype = ctypes.c_int


def limit_blas_threads(n: int) -> None:
    """NumPy's BLAS uses at most `n` threads (threadpoolctl; process-wide)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")


def _product_args(w: BlockWeight, cols: int) -> tuple[int, int, int, int]:
    """genie_norm_products' and genie_gated_products' kind for w (0: grouped, 1: int8 rows), its rows, and its
    `high` and `half` flags; raises for inputs of another width or a layout neither product takes."""
    rows, w_cols = w.shape
    grouped = w.layout in GROUPED
    if cols != w_cols or cols % 32 or not (grouped or w.layout == INT8) or not w.q.flags.c_contiguous:
        raise ValueError(f"x has {cols} columns, the weight {w_cols} in layout {w.layout}")
    return (0 if grouped else 1), rows, int(w.layout == GROUPS_HIGH), int(w.scale.dtype == np.float16)


class BlockKernels:
    """Matrix products against BlockWeight matrices."""

    def __init__(self, lib: ctypes.CDLL, threads: int | None = None) -> None:
        self.lib = lib
        self.threads = int(lib.genie_set_threads(threads or default_threads()))
        limit_blas_threads(1)  # the many-token products are parallel in genie's own pool: see the top
        # the calling thread is one of the workers: the pool holds the others
        self._pool = ThreadPoolExecutor(self.threads - 1, "genie-gemm") if self.threads > 1 else None
        self._buffers = threading.local()  # each pool thread's dequantized rows

    def gemv(self, x: np.ndarray, w: BlockWeight) -> np.ndarray:
        """x [n, cols] float32 (small n) @ w.T -> [n, rows] for an int8 matrix: reads each weight row once for all n
        inputs."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, cols = x.shape
        rows, w_cols = w.shape
        if cols != w_cols or cols % 32 or w.layout != INT8:  # the C code reads cols values of x for every row
            raise ValueError(f"x has {cols} columns, the weight {w_cols} in layout {w.layout}")
        y = np.empty((n, rows), dtype=np.float32)
        half = int(w.scale.dtype == np.float16)
        rc = self.lib.genie_blk_gemv(*w.addresses, cols, w.block, address(x), n, address(y), rows, half)
        if rc == -1:
            raise MemoryError(f"genie_blk_gemv: no memory for {n} x {cols // w.block} block sums")
        if rc:
            raise ValueError(f"genie_blk_gemv: float16 scales of {cols // w.block} blocks a row, past the C code's")
        return y

    def products(self, x: np.ndarray, w: BlockWeight) -> np.ndarray:
        """x [n, cols] float32 (any n) @ w.T for a matrix in a GROUPED layout: inputs coded as q8_0, a row's
        numbers the same whatever other rows share the call (genie_gq_products)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, cols = x.shape
        rows, w_cols = w.shape
        if cols != w_cols or cols % 32 or w.layout not in GROUPED or not w.q.flags.c_contiguous:
            raise ValueError(f"x has {cols} columns, the weight {w_cols} in layout {w.layout}")
        y = np.empty((n, rows), dtype=np.float32)
        high, half = int(w.layout == GROUPS_HIGH), int(w.scale.dtype == np.float16)
        assert w.offset is None or w.offset.dtype == w.scale.dtype
        if self.lib.genie_gq_products(*w.addresses, cols, address(x), n, address(y), rows, high, half) == -1:
            raise MemoryError(f"genie_gq_products: no memory for {n} coded inputs of {cols}")
        return y

    @staticmethod
    def takes_attention(hd: int, hdv: int, group: int = 1) -> bool:
        """Whether genie_attn_rows_i8 takes these head dims (multiples of 16, at most ATTN1_MAX_DIM) and query
        heads a KV head (at most ATTN1_MAX_GROUP)."""
        return (
            0 < hd <= ATTN1_MAX_DIM
            and 0 < hdv <= ATTN1_MAX_DIM
            and hd % 16 == hdv % 16 == 0
            and 0 < group <= ATTN1_MAX_GROUP
        )

    def attention_rows(
        self, q: np.ndarray, kv: LayerKV, slot: int, lo: np.ndarray, end: np.ndarray, scale: float, softcap: float,
        out: np.ndarray | None = None,
    ) -> np.ndarray:  # fmt: skip
        """Each row's attention [n, n_heads, hdv]: row i's query q[i] [n_heads, hd] (rotated as the rows are) over
        positions [lo[i], end[i]) of `slot` in an INT8 layer pool, the output left rotated (into `out` when given, a
        C-contiguous float32 [n, n_heads, hdv]); a row's numbers are the same alone as among others
        (genie_attn_rows_i8, which checks the positions against the pool's)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        n, n_heads, hd = q.shape
        n_kv, hdv = kv.k.shape[2], kv.v.shape[3]
        lo, t = np.ascontiguousarray(lo, dtype=np.int64), np.ascontiguousarray(end, dtype=np.int64) - lo
        assert kv.k_scale is not None and kv.v_scale is not None and kv.k.shape[3] == hd and n_heads % n_kv == 0
        assert kv.k.flags.c_contiguous and kv.v.flags.c_contiguous and self.takes_attention(hd, hdv)
        assert lo.shape == t.shape == (n,)
        if out is None:
            out = np.empty((n, n_heads, hdv), dtype=np.float32)
        elif out.shape != (n, n_heads, hdv) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"attention rows into {out.shape} {out.dtype}: [{n}, {n_heads}, {hdv}] float32 wanted")
        ks, vs = kv.k_scale[slot], kv.v_scale[slot]
        rc = self.lib.genie_attn_rows_i8(
            address(q), address(kv.k[slot]), address(ks), address(kv.v[slot]), address(vs),
            n, address(lo), address(t), kv.k.shape[1], n_heads, n_kv, hd, hdv, scale, softcap, address(out),
        )  # fmt: skip
        if rc == -1:
            raise MemoryError(f"genie_attn_rows_i8: no memory for the partial results of {int(t.sum())} positions")
        if rc == -3:
            raise ValueError(f"attention over positions [{lo.tolist()}, {(lo + t).tolist()}) of {kv.k.shape[1]}")
        if rc:
            raise ValueError(f"genie_attn_rows_i8: {n_heads // n_kv} query heads a KV head, past {ATTN1_MAX_GROUP}")
        return out

    def _qkv_rows(
        self, qkv: np.ndarray, heads: tuple[int, int], qk_norm: np.ndarray | None, cos: np.ndarray, sin: np.ndarray,
        kv: LayerKV,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int, int]:  # fmt: skip
        """genie_qkv_i8's and genie_attend_i8's inputs checked against the pool and made C-contiguous float32: qkv,
        cos, sin, the qk norm (or None), hd and hdv."""
        (H, Hkv), n = heads, qkv.shape[0]
        hd, hdv = kv.k.shape[3], kv.v.shape[3]
        assert kv.k_scale is not None and kv.v_scale is not None and kv.k.shape[2] == Hkv
        assert kv.k.flags.c_contiguous and kv.v.flags.c_contiguous and self.takes_attention(hd, hdv)
        assert qkv.shape[1] == (H + Hkv) * hd + Hkv * hdv and cos.shape == sin.shape and cos.shape[0] == n
        assert 2 * cos.shape[1] <= hd and (qk_norm is None or qk_norm.shape == (H + Hkv, hd))
        qkv = np.ascontiguousarray(qkv, dtype=np.float32)
        cos, sin = np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32)
        norm = None if qk_norm is None else np.ascontiguousarray(qk_norm, dtype=np.float32)
        return qkv, cos, sin, norm, hd, hdv

    def qkv_i8(
        self, qkv: np.ndarray, heads: tuple[int, int], qk_norm: np.ndarray | None, eps: float, v_norm: bool,
        cos: np.ndarray, sin: np.ndarray, neox: bool, kv: LayerKV, slot: int, pos0: int,
    ) -> np.ndarray:  # fmt: skip
        """A layer's QKV rows [n, (H + Hkv) * hd + Hkv * hdv] (heads = (H, Hkv)): q and k normed (qk_norm rows [H +
        Hkv, hd], if any) and turned by RoPE (cos, sin [n, rope_dim / 2] of the rows' positions), v normed when
        v_norm; k and v rotated and coded into the INT8 pool `kv` at positions pos0.. of `slot`; returns q [n, H, hd]
        rotated as the stored rows are (genie_qkv_i8: the same numbers for a row whatever rows share the call). The
        engine takes attend_i8, which runs this inside; here q can be seen (the tests check it against NumPy's)."""
        qkv, cos, sin, norm, hd, hdv = self._qkv_rows(qkv, heads, qk_norm, cos, sin, kv)
        (H, Hkv), n = heads, qkv.shape[0]
        assert 0 <= pos0 and pos0 + n <= kv.k.shape[1] and kv.k_scale is not None and kv.v_scale is not None
        q = np.empty((n, H, hd), dtype=np.float32)
        self.lib.genie_qkv_i8(
            address(qkv), n, H, Hkv, hd, hdv, None if norm is None else address(norm), eps, int(v_norm), address(cos),
            address(sin), 2 * cos.shape[1], int(neox), address(q), address(kv.k[slot, pos0]),
            address(kv.k_scale[slot, pos0]), address(kv.v[slot, pos0]), address(kv.v_scale[slot, pos0]),
        )  # fmt: skip
        return q

    def attend_i8(
        self, qkv: np.ndarray, heads: tuple[int, int], qk_norm: np.ndarray | None, eps: float, v_norm: bool,
        cos: np.ndarray, sin: np.ndarray, neox: bool, kv: LayerKV, slot: int, pos0: int, window: int, scale: float,
        softcap: float,
    ) -> np.ndarray:  # fmt: skip
        """A layer's attention from its QKV rows [n, (H + Hkv) * hd + Hkv * hdv] at positions pos0.. of `slot`: qkv_i8
        (k and v into the INT8 pool), each row's attention over the positions it sees (the last `window`, or all)
        and the output turned back, [n, H * hdv] (genie_attend_i8: qkv_i8, attention_rows and rotate in one call;
        a row's numbers the same whatever rows share it)."""
        qkv, cos, sin, norm, hd, hdv = self._qkv_rows(qkv, heads, qk_norm, cos, sin, kv)
        (H, Hkv), n = heads, qkv.shape[0]
        assert kv.k_scale is not None and kv.v_scale is not None
        out = np.empty((n, H * hdv), dtype=np.float32)
        rc = self.lib.genie_attend_i8(
            address(qkv), n, H, Hkv, hd, hdv, None if norm is None else address(norm), eps, int(v_norm), address(cos),
            address(sin), 2 * cos.shape[1], int(neox), address(kv.k[slot]), address(kv.k_scale[slot]),
            address(kv.v[slot]), address(kv.v_scale[slot]), pos0, kv.k.shape[1], window, scale, softcap, address(out),
        )  # fmt: skip
        if rc == -1:
            raise MemoryError(f"genie_attend_i8: no memory for {n} rows' attention")
        if rc == -3:
            raise ValueError(f"attention rows at positions {pos0}..{pos0 + n - 1} of {kv.k.shape[1]}")
        if rc:
            raise ValueError(f"genie_attend_i8: {H} query heads over {Hkv} KV heads (at most {ATTN1_MAX_GROUP} a head)")
        return out

    def rotate(self, x: np.ndarray) -> np.ndarray:
        """x [..., d] @ kv_rotation(d) (d at most ATTN1_MAX_DIM) as a new array: genie_rotate_rows' butterflies, a
        row's numbers the same whatever rows share the call."""
        return self.rotate_in_place(np.array(x, dtype=np.float32, order="C"))

    def rotate_in_place(self, y: np.ndarray) -> np.ndarray:
        """rotate() of a C-contiguous float32 y, in y."""
        d = y.shape[-1]
        assert 0 < d <= ATTN1_MAX_DIM and y.dtype == np.float32 and y.flags.c_contiguous
        self.lib.genie_rotate_rows(address(y), y.size // d, d)
        return y

    def add_rms_norm(
        self, x: np.ndarray, r: np.ndarray | None, w: np.ndarray, eps: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(x + r, rms_norm(x + r) * w) for float32 rows x, r [n, d] and w [d], as new arrays; with r None, (x itself,
        rms_norm(x) * w) (genie_add_rms_norm)."""
        x, w = np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(w)
        d = x.shape[-1]
        if w.shape != (d,) or w.dtype != np.float32 or (r is not None and r.shape != x.shape):
            raise ValueError(f"rows {x.shape}, residual {None if r is None else r.shape}, norm weight {w.shape}")
        h = np.empty_like(x)
        s = x if r is None else np.empty_like(x)
        r = None if r is None else np.ascontiguousarray(r, dtype=np.float32)  # (held: the C code reads it)
        rr = None if r is None else address(r)
        self.lib.genie_add_rms_norm(address(x), rr, address(w), x.size // d, d, eps, address(s), address(h))
        return s, h

    def norm_product(
        self, x: np.ndarray, r: np.ndarray | None, norm: np.ndarray, eps: float, w: BlockWeight
    ) -> tuple[np.ndarray, np.ndarray]:
        """add_rms_norm(x, r, norm, eps) and its rows' product with w (products() for a GROUPED layout, else gemv())
        in one call: (x + r, rms_norm(x + r) * norm @ w.T); with r None the first is x itself
        (genie_norm_products)."""
        x, norm = np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(norm)
        n, cols = x.shape
        if norm.shape != (cols,) or norm.dtype != np.float32 or (r is not None and r.shape != x.shape):
            raise ValueError(f"rows {x.shape}, residual {None if r is None else r.shape}, norm weight {norm.shape}")
        kind, rows, high, half = _product_args(w, cols)
        s = x if r is None else np.empty_like(x)
        y = np.empty((n, rows), dtype=np.float32)
        r = None if r is None else np.ascontiguousarray(r, dtype=np.float32)  # (held: the C code reads it)
        rr = None if r is None else address(r)
        rc = self.lib.genie_norm_products(
            address(x), rr, address(norm), eps, address(s), n, cols, kind, *w.addresses, w.block, high, half,
            address(y), rows,
        )  # fmt: skip
        if rc == -1:
            raise MemoryError(f"genie_norm_products: no memory for {n} normed rows of {cols}")
        return s, y

    def gated_product(self, gate_up: np.ndarray, act: str, w: BlockWeight) -> np.ndarray:
        """gated_act(gate_up, act) @ w.T in one call, the product as norm_product's (genie_gated_products)."""
        gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
        n, f = gate_up.shape[0], gate_up.shape[1] // 2
        kind, rows, high, half = _product_args(w, f)
        y = np.empty((n, rows), dtype=np.float32)
        rc = self.lib.genie_gated_products(
            address(gate_up), n, f, GATES.get(act, -1), kind, *w.addresses, w.block, high, half, address(y), rows
        )
        if rc == -1:
            raise MemoryError(f"genie_gated_products: no memory for {n} gated rows of {f}")
        if rc == -2:
            raise ValueError(f"unknown activation {act}")
        return y

    def gated_act(self, gate_up: np.ndarray, kind: str) -> np.ndarray:
        """act(gate) * up of gate_up [..., 2f] -> [..., f], act silu or gelu_tanh (genie_gated_act)."""
        gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
        f = gate_up.shape[-1] // 2
        out = np.empty((*gate_up.shape[:-1], f), dtype=np.float32)
        if self.lib.genie_gated_act(address(gate_up), out.size // f if f else 0, f, GATES.get(kind, -1), address(out)):
            raise ValueError(f"unknown activation {kind}")
        return out

    def dequantize(self, w: BlockWeight, r0: int, r1: int, out: np.ndarray) -> np.ndarray:
        """float32 rows [r0, r1) of w into out[: r1 - r0] (C-contiguous)."""
        rows, cols = w.shape
        dst = out[: r1 - r0]
        # the C code trusts these: checked here, where a wrong call would otherwise write past a buffer
        if not (0 <= r0 <= r1 <= rows and dst.shape == (r1 - r0, cols) and dst.dtype == np.float32):
            raise ValueError(f"dequantize rows [{r0}, {r1}) of {w.shape} into {out.shape} {out.dtype}")
        assert dst.flags.c_contiguous and w.layout == INT8
        self.lib.genie_blk_dequant(*w.addresses, cols, w.block, address(dst), r0, r1, int(w.scale.dtype == np.float16))
        return dst

    def gemm(self, x: np.ndarray, w: BlockWeight) -> np.ndarray:
        """x [n, cols] (many rows) @ w.T: each thread claims a run of weight rows, dequantizes it and
        multiplies it with single-threaded BLAS, until no run is left."""
        rows, cols = w.shape
        step = max(1, min(DEQUANT_CHUNK_BYTES // (cols * 4), -(-rows // (self.threads * CLAIMS_PER_THREAD))))
        y = np.empty((x.shape[0], rows), dtype=np.float32)

        def work(r0: int) -> None:
            r1 = min(rows, r0 + step)
            np.matmul(x, self.dequantize(w, r0, r1, self._buffer(step, cols)).T, out=y[:, r0:r1])

        self.each(work, range(0, rows, step))
        return y

    def each(self, fn: Callable[[T], None], items: Iterable[T]) -> None:
        """fn(item) for every item, on the pool's threads and the caller's, each claiming the next item when it is
        done with one (NumPy and the C kernels let go of the GIL while they compute)."""
        todo = iter(items)
        claim = threading.Lock()

        def work() -> None:
            while True:
                with claim:
                    item = next(todo, _DONE)
                if item is _DONE:
                    return
                fn(item)  # type: ignore[arg-type]

        helpers = [self._pool.submit(work) for _ in range(self.threads - 1)] if self._pool else []
        work()
        for f in helpers:
            f.result()

    def _buffer(self, n_rows: int, cols: int) -> np.ndarray:
        buf = getattr(self._buffers, "buf", None)
        if buf is None or buf.size < n_rows * cols:
            buf = self._buffers.buf = np.empty(n_rows * cols, dtype=np.float32)
        return buf[: n_rows * cols].reshape(n_rows, cols)
