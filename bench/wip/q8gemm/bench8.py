# Prototype, not product code (bench/NOTES.md, CPU note 2026-12-06f): q8 GEMM tiles against OpenBLAS sgemm.
#   cd bench/wip/q8gemm && for f in q8g q8g8; do gcc -O3 -march=native -fPIC -shared -o lib$f.so $f.c; done
#   cd ../../.. && OPENBLAS_NUM_THREADS=1 python bench/wip/q8gemm/bench8.py
import ctypes, time, numpy as np
P = ctypes.c_void_p
def bench(lib, fn, gsz, M, N, K):
    G = K // gsz
    rng = np.random.default_rng(0)
    W = rng.integers(0, 16, (N, K), dtype=np.uint8); ws = rng.random((N, G*16), dtype=np.float32)
    X = rng.integers(-127, 128, (M, K), dtype=np.int8); xs = rng.random((M, G*16), dtype=np.float32)
    out = np.empty((M, N), np.float32)
    f = getattr(ctypes.CDLL(lib), fn); f.argtypes = [P,P,P,P,ctypes.c_int,ctypes.c_int,ctypes.c_int,P]
    args = [W.ctypes.data, ws.ctypes.data, X.ctypes.data, xs.ctypes.data, M, N, G, out.ctypes.data]
    t = []
    for _ in range(5):
        t0 = time.perf_counter(); f(*args); t.append(time.perf_counter() - t0)
    return min(t)
for M, N, K in ((512, 1536, 512), (512, 1536, 1536), (512, 576, 1536), (512, 2048, 640), (512, 640, 2048)):
    rng = np.random.default_rng(0)
    A = rng.random((M, K), dtype=np.float32); B = rng.random((K, N), dtype=np.float32)
    tb = min((lambda: (lambda t0: (A @ B, time.perf_counter() - t0)[1])(time.perf_counter()))() for _ in range(5))
    t16 = bench('bench/wip/q8gemm/libq8g.so', 'q8_gemm', 512, M, N, K) if K % 512 == 0 else float('nan')
    t8 = bench('bench/wip/q8gemm/libq8g8.so', 'q8_gemm8', 256, M, N, K) if K % 256 == 0 else float('nan')
    print(f"M {M} N {N} K {K}: sgemm {tb*1e3:.2f} ms, q8 16-block groups {t16*1e3:.2f} (x{tb/t16:.2f}), 8-block groups {t8*1e3:.2f} (x{tb/t8:.2f})")
