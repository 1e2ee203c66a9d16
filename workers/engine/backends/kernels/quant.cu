// Matrix-vector products and dequantization on GGUF blocks (blocks.cuh): the decode path's GEMV kernels
// when the fused decode step (decode.cu) does not run, and the prefill path's dequantization.
// common.cuh and blocks.cuh come first in this module.

// y[t * ldy + r] = sum_c W[r, c] * x[t, c] for t < n_tok (at most MAX_TOK): one warp per row, the
// lanes striding over the row's sub-blocks.
#define MAX_TOK 8
template <int T>
__device__ void gemv(const u8* W, const float* x, float* y, int rows, int cols, long long row_bytes, int n_tok,
                     int ldy) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= rows) return;
    const u8* row = W + (long long)warp * row_bytes;
    float acc[MAX_TOK];
    for (int t = 0; t < MAX_TOK; ++t) acc[t] = 0.f;
    float v[32];
    for (int sb = lane; sb < cols / 32; sb += 32) {
        deq32<T>(row, sb, v);
        for (int t = 0; t < n_tok; ++t) {
            const float* xs = x + (long long)t * cols + sb * 32;
            float s = 0.f;
            for (int i = 0; i < 32; ++i) s += v[i] * xs[i];
            acc[t] += s;
        }
    }
    for (int t = 0; t < n_tok; ++t) {
        float s = acc[t];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (lane == 0) y[(long long)t * ldy + warp] = s;
    }
}

// The one-token product (decode): x is staged once per block in shared memory; each of the 8 warps
// takes `rpw` (<= GEMV1_ROWS) consecutive rows, loading each 32-value slice of x into registers once for
// all of them (every warp used to re-read all of x from L2: for a 4B model 4-7x the weight bytes). The
// caller picks rpw > 1 only for tall matrices, where the grid still fills the GPU.
// Dynamic shared memory: cols floats.
#define GEMV1_ROWS 4
template <int T>
__device__ void gemv1(const u8* W, const float* x, float* y, int rows, int cols, long long row_bytes, int rpw) {
    extern __shared__ float xs[];
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw;
    const int lane = threadIdx.x & 31;
    if (r0 >= rows) return;
    const int n_rows = min(rpw, rows - r0);
    float acc[GEMV1_ROWS] = {0.f, 0.f, 0.f, 0.f};
    float xv[32];
    for (int sb = lane; sb < cols / 32; sb += 32) {
        const float4* x4 = reinterpret_cast<const float4*>(xs + sb * 32);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float4 f = x4[i];
            xv[4 * i] = f.x;
            xv[4 * i + 1] = f.y;
            xv[4 * i + 2] = f.z;
            xv[4 * i + 3] = f.w;
        }
#pragma unroll
        for (int r = 0; r < GEMV1_ROWS; ++r)
            if (r < n_rows) acc[r] += dot32<T>(W + (long long)(r0 + r) * row_bytes, sb, xv);
    }
#pragma unroll
    for (int r = 0; r < GEMV1_ROWS; ++r) {
        float s = acc[r];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (lane == 0 && r < n_rows) y[r0 + r] = s;
    }
}

// Q4_K and Q6_K, one token (decode): the bulk of a Q4_K_M model, so kernels of their own in the manner of
// llama.cpp's MMVQ. Each block first quantizes x to int8 in shared memory, in sub-blocks of 32 with a
// float scale and the sub-block's sum (llama.cpp's q8_1), so the products are __dp4a on packed bytes, four
// values an instruction, instead of a float conversion and FMA per value. Eight lanes take one 256-value
// super-block, each one 16-byte (Q4_K) or three 8-byte (Q6_K) runs of its quant bytes, so a warp streams
// four blocks at a time; a warp's rows and their blocks are one flattened loop, so short rows (4B: 10
// blocks) keep all four octets busy.
//
// q8_input writes the x8 buffer that blocks.cuh describes, and takes over the operation that produced x:
// X_PLAIN x itself; X_GATED act(x[i]) *
// x[cols + i] (x = [gate | up]: the FFN's activation); X_NORM rms_norm(x + r) * w (r may be NULL), writing
// x + r to x_new when that is not NULL (the residual add and the next layer's input norm). One block of
// up to 1024 threads.
#define X_PLAIN 0
#define X_GATED 1
#define X_NORM 2
#define Q8_MAX 16  // values per thread: cols <= Q8_MAX * blockDim.x (the backend checks)
extern "C" __global__ void q8_input(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ w,
                                    float* x_new, float eps, int mode, int act, int cols, signed char* x8) {
    // one block, a few microseconds: the product that reads x8 may start now and load its weights meanwhile
    grid_dep_launch();
    grid_dep_wait();
    __shared__ float red[32];
    signed char* xq = x8;
    signed char* xr = x8 + cols;
    float* xd = reinterpret_cast<float*>(x8 + 2 * cols);
    float* xs = xd + cols / 32;
    // thread t holds values t + k * blockDim.x: sub-block (t >> 5) + k * n_warps, lane t & 31 of it, so a warp
    // quantizes whole sub-blocks; every load is issued before any is used
    const int lane = threadIdx.x & 31, n_warps = blockDim.x >> 5, n_sb = cols / 32;
    float v[Q8_MAX], wv[Q8_MAX];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < Q8_MAX; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = 0.f;
        if (i < cols) {
            if (mode == X_GATED) {
                v[k] = gated(x[i], x[cols + i], act);
            } else {
                v[k] = x[i];
                if (mode == X_NORM) {
                    if (r) v[k] += r[i];
                    wv[k] = w[i];
                    if (x_new) x_new[i] = v[k];
                    ss += v[k] * v[k];
                }
            }
        }
    }
    if (mode == X_NORM) {  // as the rms_norm kernel: (x + r) * rsqrt(mean((x + r)^2) + eps) * w
        const float inv = rsqrtf(block_reduce<false>(ss, red) / cols + eps);
#pragma unroll
        for (int k = 0; k < Q8_MAX; ++k) v[k] = v[k] * inv * wv[k];
    }
#pragma unroll
    for (int k = 0; k < Q8_MAX; ++k) {
        const int sb = (threadIdx.x >> 5) + k * n_warps;
        if (sb >= n_sb) break;
        q8_code(v[k], sb, lane, xq, xr, xd, xs);
    }
}

// The one-token product for those types; same grid and rows per warp as the generic gemv1; no shared
// memory: x8 (a few KiB) is read through L1.
#ifndef OCTET_UNITS
#define OCTET_UNITS 2  // blocks a lane loads before using any (bench/gpu_gemv.py: 2 beat 4 and 8)
#endif
__device__ __forceinline__ void next_unit(int& r, int& b, int nb, int n_rows) {
    while (b >= nb && r < n_rows) {
        b -= nb;
        ++r;
    }
}
// A product's epilogue (EP_GATED, EP_NORM): the block that completes a 32-value group of what the consumer
// multiplies codes it into ep_x8 as q8_input would, so the consumer needs no q8_input launch. EP_GATED: the
// output is [gate | up] (rows = 2 len) and the group is act(gate) * up; EP_NORM: the group is y + res (res may
// be NULL), also written to xnew, times the norm weight w, without the RMS factor: int8 codes do not change
// when their 32 values are scaled alike, so the consumer applies it (gemv1_octets' nss), from the group sums
// of squares written to ss (each a warp's fixed-order sum). A group is complete when every block holding one
// of its rows has written them: cnt[g] counts them (zero between launches; the coding block resets it).
#define EP_NONE 0
#define EP_GATED 1
#define EP_NORM 2
#define EP_MAX_GROUPS 8  // groups a block's rows touch: at most 32 rows a block (the backend checks), so <= 4
struct Epilogue {
    int mode, act;
    signed char* x8;
    int* cnt;
    const float* res;
    const float* w;
    float* xnew;
    float* ss;
};
// blocks of rpb rows holding a row of group g: its rows, or (gated) its gate rows and its up rows
__device__ int group_blocks(int g, int len, int rpb, bool gated) {
    const int a0 = 32 * g / rpb, a1 = (32 * g + 31) / rpb;
    if (!gated) return a1 - a0 + 1;
    const int b0 = (len + 32 * g) / rpb, b1 = (len + 32 * g + 31) / rpb;
    return (a1 - a0 + 1) + (b1 - b0 + 1) - max(0, min(a1, b1) - max(a0, b0) + 1);
}
__device__ __forceinline__ int count_acq_rel(int* p) {  // atomicAdd(p, 1), releasing this block's rows, acquiring others'
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
}
__device__ void gemv_epilogue(const float* y, int rows, int rpb, const Epilogue& ep) {
    __shared__ int groups[EP_MAX_GROUPS], codes[EP_MAX_GROUPS];
    const bool is_gated = ep.mode == EP_GATED;
    const int len = is_gated ? rows / 2 : rows;  // values the consumer multiplies
    const int rb0 = blockIdx.x * rpb, rb1 = min(rows, rb0 + rpb) - 1;  // this block's rows [rb0, rb1]
    // the groups they touch: [a0, a1] (rows, or gate rows), then [b0, b1] (up rows), each a contiguous run
    int a0 = 0, a1 = -1, b0 = 0, b1 = -1;
    if (rb0 < len) a0 = rb0 / 32, a1 = min(rb1, len - 1) / 32;
    if (rb1 >= len) b0 = (max(rb0, len) - len) / 32, b1 = (rb1 - len) / 32;
    if (b1 >= b0 && a1 >= a0 && b0 <= a1 + 1 && a0 <= b1 + 1) a0 = min(a0, b0), a1 = max(a1, b1), b1 = b0 - 1;  // one run
    const int na = a1 - a0 + 1, n = na + max(0, b1 - b0 + 1);
    __syncthreads();  // this block's rows of y are written
    if (threadIdx.x < n) {
        const int g = threadIdx.x < na ? a0 + threadIdx.x : b0 + threadIdx.x - na;
        const int c = count_acq_rel(ep.cnt + g) == group_blocks(g, len, rpb, is_gated) - 1;
        if (c) ep.cnt[g] = 0;  // ready for the next launch (a graph replays this one)
        groups[threadIdx.x] = g, codes[threadIdx.x] = c;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* xd = reinterpret_cast<float*>(ep.x8 + 2 * len);
    for (int k = warp; k < n; k += blockDim.x >> 5) {
        if (!codes[k]) continue;
        __threadfence();  // the other blocks' rows (their counts were acquired by this block's thread k)
        const int g = groups[k], i = 32 * g + lane;
        float v;
        if (is_gated) {
            v = gated(__ldcg(y + i), __ldcg(y + len + i), ep.act);
        } else {
            v = __ldcg(y + i);
            if (ep.res) v += ep.res[i];
            ep.xnew[i] = v;
            const float sq = warp_sum(v * v);
            if (lane == 0) ep.ss[g] = sq;
            v *= ep.w[i];
        }
        q8_code(v, g, lane, ep.x8, ep.x8 + len, xd, xd + len / 32);
    }
}

// A warp takes rpw consecutive rows, or, split ks ways (ks warps of a block, rpw = 1), a ks-th of one row's
// units: warp slice s holds octets 4 s .. 4 s + 3 of the row's 4 ks, which step through its units together
// (long rows, such as a down projection's, then have more loads in flight per SM and a shorter chain per
// warp); the slices' sums meet in shared memory. nss (not NULL: x8 was coded by an EP_NORM epilogue without
// its RMS factor) holds n_ss group sums of squares: every row is scaled by rsqrt(sum / cols + eps).
template <int T>
__device__ void gemv1_octets(const u8* W, const signed char* x8, float* y, int rows, int cols, long long row_bytes,
                             int rpw, int ks, const float* nss, int n_ss, float eps, const Epilogue& ep) {
    __shared__ float part[32][GEMV1_ROWS];
    const signed char* xq = x8;
    const signed char* xr = x8 + cols;
    const float* xd = reinterpret_cast<const float*>(x8 + 2 * cols);
    const float* xs = xd + cols / 32;
    const int warp = threadIdx.x >> 5, slice = warp % ks;
    const int r0 = (blockIdx.x * ((blockDim.x >> 5) / ks) + warp / ks) * rpw;
    const int lane = threadIdx.x & 31;
    const int n_rows = r0 < rows ? min(rpw, rows - r0) : 0;  // 0: a warp past the last row touches nothing
    const int nb = cols >> 8, l = lane & 7, step = 4 * ks;
    bool waited = false;  // the first round of weight loads goes out before the wait for x8 (common.cuh)
    float acc[GEMV1_ROWS] = {0.f, 0.f, 0.f, 0.f};
    // unit u = r * nb + b of this warp's rows; octet o of slice s takes units 4 s + o, 4 s + o + step, ...
    int r = 0, b = (lane >> 3) + 4 * slice;
    next_unit(r, b, nb, n_rows);
    const u8* base = W + (long long)r0 * row_bytes;
    while (r < n_rows) {
        OctetRaw<T> raw[OCTET_UNITS];
        int rs[OCTET_UNITS], bs[OCTET_UNITS];
#pragma unroll
        for (int i = 0; i < OCTET_UNITS; ++i) {
            rs[i] = r;
            bs[i] = b;
            if (r < n_rows) raw[i] = octet_load<T>(base + (long long)r * row_bytes + (long long)b * Blk<T>::bytes, l);
            b += step;
            next_unit(r, b, nb, n_rows);
        }
        if (!waited) {
            GRID_DEP_START();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < OCTET_UNITS; ++i) {
            if (rs[i] >= n_rows) break;
            const float v = octet_dot<T>(raw[i], bs[i], l, xq, xr, xd, xs);
#pragma unroll
            for (int j = 0; j < GEMV1_ROWS; ++j)
                if (j == rs[i]) acc[j] += v;
        }
    }
    if (!waited) GRID_DEP_START();  // a warp without rows: the epilogue and the norm factor read what came before
    float inv = 1.f;
    if (nss != nullptr) {
        float s = 0.f;
        for (int i = lane; i < n_ss; i += 32) s += __ldcg(nss + i);
        inv = rsqrtf(warp_sum(s) / cols + eps);  // the same fixed-order sum in every warp
    }
#pragma unroll
    for (int i = 0; i < GEMV1_ROWS; ++i) {
        float s = acc[i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        acc[i] = s;
    }
    if (ks == 1) {
        if (lane == 0)
            for (int i = 0; i < n_rows; ++i) y[r0 + i] = acc[i] * inv;
    } else {
        if (lane == 0) part[warp][0] = acc[0];
        __syncthreads();  // every warp of the block gets here: none returned early
        if (slice == 0 && lane == 0 && n_rows > 0) {
            float s = 0.f;
            for (int j = 0; j < ks; ++j) s += part[warp + j][0];  // in slice order: the same sum every run
            y[r0] = s * inv;
        }
    }
    if (ep.mode != EP_NONE) gemv_epilogue(y, rows, ((blockDim.x >> 5) / ks) * rpw, ep);
}
// The one-token products of the dp4a types, on an x8 buffer from q8_input or a producer's epilogue:
// gemv1q_q4_k, gemv1q_q6_k.
#define INSTANTIATE_Q(T, NAME)                                                                                \
    extern "C" __global__ void gemv1q_##NAME(const u8* W, const signed char* x8, float* y, int rows, int cols,  \
                                             long long row_bytes, int rpw, int ks, const float* nss, int n_ss,  \
                                             float eps, int ep_mode, int ep_act, signed char* ep_x8, int* ep_cnt, \
                                             const float* ep_res, const float* ep_w, float* ep_xnew, float* ep_ss) { \
        const Epilogue ep{ep_mode, ep_act, ep_x8, ep_cnt, ep_res, ep_w, ep_xnew, ep_ss};                        \
        gemv1_octets<T>(W, x8, y, rows, cols, row_bytes, rpw, ks, nss, n_ss, eps, ep);                          \
    }
INSTANTIATE_Q(12, q4_k)
INSTANTIATE_Q(14, q6_k)

// out[r, c] for the rows listed in `ids` (embedding lookup) or every row (ids == NULL), times `scale`: one
// thread per 32-value sub-block. Consecutive threads' sub-blocks are consecutive in `out`, so the block
// stages its values in shared memory and writes them out coalesced (a thread writing its own 128 bytes
// left the prefill's weight dequantization at a tenth of the bandwidth). Block size DEQ_THREADS.
#define DEQ_THREADS 256
template <int T>
__device__ void dequant_rows(const u8* W, const long long* ids, float* out, int n_rows, int cols, long long row_bytes, float scale) {
    __shared__ float buf[DEQ_THREADS * 33];  // a padded row per thread: no bank conflicts either way
    const long long first = (long long)blockIdx.x * DEQ_THREADS;
    const long long i = first + threadIdx.x;
    const int per_row = cols / 32;
    const long long n_sub = (long long)n_rows * per_row;
    if (i < n_sub) {
        const int r = (int)(i / per_row), sb = (int)(i % per_row);
        const long long src = ids ? ids[r] : r;
        float v[32];
        deq32<T>(W + src * row_bytes, sb, v);
#pragma unroll
        for (int k = 0; k < 32; ++k) buf[threadIdx.x * 33 + k] = v[k] * scale;
    }
    __syncthreads();
    const int n_here = (int)min((long long)DEQ_THREADS, n_sub - first) * 32;
    float* o = out + first * 32;  // sub-block i is out[32 i, 32 i + 32): rows are contiguous in out
    for (int j = threadIdx.x; j < n_here; j += DEQ_THREADS) o[j] = buf[(j >> 5) * 33 + (j & 31)];
}

#define INSTANTIATE(T, NAME)                                                                              \
    extern "C" __global__ void gemv_##NAME(const u8* W, const float* x, float* y, int rows, int cols,     \
                                           long long row_bytes, int n_tok, int ldy) {                     \
        GRID_DEP_START();                                                                                 \
        gemv<T>(W, x, y, rows, cols, row_bytes, n_tok, ldy);                                              \
    }                                                                                                     \
    extern "C" __global__ void gemv1_##NAME(const u8* W, const float* x, float* y, int rows, int cols,    \
                                            long long row_bytes, int rpw) {                               \
        GRID_DEP_START();                                                                                 \
        gemv1<T>(W, x, y, rows, cols, row_bytes, rpw);                                                    \
    }                                                                                                     \
    extern "C" __global__ void dequant_##NAME(const u8* W, const long long* ids, float* out, int n_rows,  \
                                              int cols, long long row_bytes, float scale) {               \
        GRID_DEP_START();                                                                                 \
        dequant_rows<T>(W, ids, out, n_rows, cols, row_bytes, scale);                                     \
    }

INSTANTIATE(0, f32)
INSTANTIATE(1, f16)
INSTANTIATE(30, bf16)
INSTANTIATE(2, q4_0)
INSTANTIATE(3, q4_1)
INSTANTIATE(6, q5_0)
INSTANTIATE(7, q5_1)
INSTANTIATE(8, q8_0)
INSTANTIATE(12, q4_k)
INSTANTIATE(13, q5_k)
INSTANTIATE(14, q6_k)
