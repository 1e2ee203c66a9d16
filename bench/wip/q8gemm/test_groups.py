# Prototype check (bench/wip/q8gemm/groups.c; bench/NOTES.md, CPU note 2026-12-06f): the same bits on AVX-512 and plain C, alone and in a tile, and the
# coded inputs' exact product to float rounding; speed against OpenBLAS sgemm. Build:
#   gcc -O3 -march=native -fPIC -shared -o /tmp/q8g/libgroups.so bench/wip/q8gemm/groups.c
#   gcc -O3 -march=x86-64-v2 -fPIC -shared -o /tmp/q8g/libgroups_c.so bench/wip/q8gemm/groups.c
#   gcc -O3 -march=haswell ... libgroups_avx2.so; gcc -O3 -march=alderlake ... libgroups_vnni256.so
#   OPENBLAS_NUM_THREADS=1 python bench/wip/q8gemm/test_groups.py [--speed] [--decode]
import ctypes, sys, time
import numpy as np
P, I = ctypes.c_void_p, ctypes.c_int64
def load(path):
    lib = ctypes.CDLL(path)
    lib.gq_pack.argtypes = [P, P, P, I, I, I, P, P, P]
    lib.gq_products.argtypes = [P, P, P, I, I, I, P, I, P, ctypes.c_int]
    lib.gq_row_bytes.argtypes = lib.gq_row_lanes.argtypes = [I, I]
    lib.gq_row_bytes.restype = lib.gq_row_lanes.restype = I
    return lib
lib, libc = load('/tmp/q8g/libgroups.so'), load('/tmp/q8g/libgroups_c.so')
lib2, lib2v = load('/tmp/q8g/libgroups_avx2.so'), load('/tmp/q8g/libgroups_vnni256.so')  # -march=haswell, alderlake

def setup(N, K, BS, rng):
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    s = (rng.random((N, K // BS), dtype=np.float32) * 0.02).astype(np.float32)
    o = (-rng.random((N, K // BS), dtype=np.float32) * 0.1).astype(np.float32)
    W = np.zeros((N, lib.gq_row_bytes(K, BS)), np.uint8); LS = np.zeros((N, lib.gq_row_lanes(K, BS)), np.float32)
    LO = np.zeros_like(LS)
    lib.gq_pack(q.ctypes.data, s.ctypes.data, o.ctypes.data, N, K, BS, W.ctypes.data, LS.ctypes.data, LO.ctypes.data)
    return q, s, o, W, LS, LO

def products(l, W, LS, LO, N, K, BS, X, use_c):
    out = np.zeros((len(X), N), np.float32)
    l.gq_products(W.ctypes.data, LS.ctypes.data, LO.ctypes.data, N, K, BS, X.ctypes.data, len(X), out.ctypes.data, use_c)
    return out

def coded(x):  # q8_0 as groups.c codes it (float64 result of the coded input)
    xb = x.reshape(len(x), -1, 32)
    d = (np.abs(xb).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    c = np.rint(xb * idv)
    return (c * d).reshape(x.shape).astype(np.float64)

rng = np.random.default_rng(1)
ok = True
for N, K, BS in ((37, 576, 32), (40, 640, 32), (21, 1536, 32), (9, 576, 16), (13, 2048, 16), (8, 96, 32), (5, 64, 16)):
    q, s, o, W, LS, LO = setup(N, K, BS, rng)
    X = rng.standard_normal((13, K), dtype=np.float32)
    a = products(lib, W, LS, LO, N, K, BS, X, 0)
    c = products(lib, W, LS, LO, N, K, BS, X, 1)
    c2 = products(libc, W, LS, LO, N, K, BS, X, 1)
    v2 = products(lib2, W, LS, LO, N, K, BS, X, 0)
    v2v = products(lib2v, W, LS, LO, N, K, BS, X, 0)
    alone = np.stack([products(lib, W, LS, LO, N, K, BS, X[i:i + 1], 0)[0] for i in range(len(X))])
    w = (np.repeat(s, BS, 1) * q + np.repeat(o, BS, 1)).astype(np.float64)
    ref = coded(X) @ w.T
    err = np.abs(a - ref).max() / np.abs(ref).max()
    same = np.array_equal(a.view(np.int32), c.view(np.int32)) and np.array_equal(c.view(np.int32), c2.view(np.int32)) \
        and np.array_equal(a.view(np.int32), v2.view(np.int32)) and np.array_equal(a.view(np.int32), v2v.view(np.int32))
    print(f"N {N} K {K} BS {BS}: AVX-512 = AVX2 = AVX-VNNI = C = x86-64-v2 C {same}, alone = tile {np.array_equal(a.view(np.int32), alone.view(np.int32))}, rel err vs coded {err:.1e}")
    ok &= same and np.array_equal(a, alone) and err < 1e-5
print("ALL OK" if ok else "FAIL")
if "--speed" in sys.argv:
    for M, N, K, BS in ((512, 1536, 576, 32), (512, 576, 1536, 32), (512, 2048, 640, 32), (512, 640, 2048, 32), (1, 1536, 576, 32), (4, 1536, 576, 32)):
        q, s, o, W, LS, LO = setup(N, K, BS, rng)
        X = rng.standard_normal((M, K), dtype=np.float32); B = rng.standard_normal((K, N), dtype=np.float32)
        t = min((lambda t0: (products(lib, W, LS, LO, N, K, BS, X, 0), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(7))
        tb = min((lambda t0: (X @ B, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(7))
        print(f"M {M} N {N} K {K}: groups {t*1e3:.3f} ms, sgemm {tb*1e3:.3f} ms, x{tb/t:.2f}")
if "--decode" in sys.argv:  # against main's decode product (float inputs, genie_blk_gemv), 1 thread
    sys.path.insert(0, '.')
    from genie_workers.engine.backends import cpu_kernels
    from genie_workers.engine.backends.block_weight import BlockWeight, NIBBLES, pack_nibbles
    kern = cpu_kernels.BlockKernels(cpu_kernels.load(), threads=1)
    for M, N, K in ((1, 1536, 576), (1, 576, 1536), (4, 1536, 576), (1, 2048, 640), (1, 640, 2048), (1, 49152, 576)):
        q, s, o, W, LS, LO = setup(N, K, 32, rng)
        bw = BlockWeight(pack_nibbles(q.astype(np.int8)), s, o, 32, NIBBLES)
        X = rng.standard_normal((M, K), dtype=np.float32)
        ref = X.astype(np.float64) @ bw.dequantize().astype(np.float64).T
        a, b = products(lib, W, LS, LO, N, K, 32, X, 0), kern.gemv(X, bw)
        t2 = min((lambda t0: (products(lib2, W, LS, LO, N, K, 32, X, 0), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(21))
        ta = min((lambda t0: (products(lib, W, LS, LO, N, K, 32, X, 0), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(21))
        tb = min((lambda t0: (kern.gemv(X, bw), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(21))
        e = lambda y: np.abs(y - ref).max() / np.abs(ref).max()
        print(f"M {M} N {N} K {K}: groups {ta*1e6:.0f} us (err vs float {e(a):.1e}), genie_blk_gemv {tb*1e6:.0f} us ({e(b):.1e}), x{tb/ta:.2f}; AVX2 build {t2*1e6:.0f} us")
