// Matrix-vector products and dequantization on GGUF blocks (blocks.cuh): the decode path's GEMV kernels
// when the fused decode step (decode.cu) does not run, and the prefill path's dequantization.
// common.cuh and blocks.cuh come first in this module.

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
// x[cols + i] (x = [gate | up]: the FFN's activation), or act(x[i]) * r[i] where r is not NULL (one row: Gemma 4's
// per-layer input); X_NORM rms_norm(x + r) * w (r may be NULL), writing
// x + r to x_new when that is not NULL (the residual add and the next layer's input norm); X_NORM_LATE
// (x + r) * w without the RMS factor, each 32-value group's sum of squares to ss, exactly as a product's
// EP_NORM epilogue codes it (the product applies the factor: nss). A block a row: row b of x, r and x_new
// starts x_stride floats after row b - 1; x8 is one row (n_token 0) or token b of an n-token product's input
// (common.cuh: tokens in quads, with their 16-value sums of codes). Blocks of up to 1024 threads.
#define X_PLAIN 0
#define X_GATED 1
#define X_NORM 2
#define X_NORM_LATE 3
#define Q8_MAX 16  // values per thread: cols <= Q8_MAX * blockDim.x (the backend checks)
extern "C" __global__ void __launch_bounds__(1024) q8_input(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ w,
                                    float* x_new, float eps, int mode, int act, int cols, signed char* x8,
                                    long long x_stride, int n_token, float* ss_out) {
    // one block a row, a few microseconds: the product that reads x8 may start now and load its weights meanwhile
    grid_dep_launch();
    grid_dep_wait();
    __shared__ float red[32];
    x += blockIdx.x * x_stride;
    if (r) r += blockIdx.x * x_stride;
    if (x_new) x_new += blockIdx.x * x_stride;
    if (ss_out) ss_out += blockIdx.x * (cols / 32);
    const X8At x8at = n_token ? x8_quad(x8, blockIdx.x, cols) : x8_row(x8, cols);  // n_token: gemvn's layout
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
                v[k] = gated(x[i], r ? r[i] : x[cols + i], act);
            } else {
                v[k] = x[i];
                if (mode == X_NORM || mode == X_NORM_LATE) {
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
        if (mode == X_NORM_LATE) {  // as gemv_epilogue's EP_NORM
            const float sq = warp_sum(__fmul_rn(v[k], v[k]));
            if (lane == 0) ss_out[sb] = sq;
            v[k] *= wv[k];
        }
        q8_code(v[k], sb, lane, x8at);
    }
}

// Each row's x' = (x + rms_norm(y) * yw) * s (s may be NULL) written to x_new, then coded as q8_input codes x'
// (X_NORM with w; X_PLAIN where w is NULL): layer_ops.cu's add_normed and q8_input in one launch, with their
// numbers (each takes the values t + k * blockDim.x a thread, as add_normed's loop does at 1024 threads, and sums
// in block_reduce's order; add_normed's fewer warps for d < 1024 are the warps here that add an exact 0). A post-norm's
// residual add and the product that reads the stream after it (Gemma 3, 4). A block a row: row b of x, y and x_new
// starts x_stride floats after row b - 1; x8 is one row (n_token 0) or token b of an n-token product's input. Every
// load is issued before the first reduction (one trip to memory, not three): at most QA_MAX values a thread.
#define QA_MAX 8  // cols <= QA_MAX * 1024 (the backend checks)
extern "C" __global__ void __launch_bounds__(1024) q8_add_normed(const float* __restrict__ x, const float* __restrict__ y,
                                         const float* __restrict__ yw, const float* __restrict__ s, float* __restrict__ x_new,
                                         float eps, const float* __restrict__ w, int cols, signed char* x8,
                                         long long x_stride, int n_token) {
    grid_dep_launch();
    grid_dep_wait();
    __shared__ float red[32];
    x += blockIdx.x * x_stride;
    y += blockIdx.x * x_stride;
    x_new += blockIdx.x * x_stride;
    const X8At x8at = n_token ? x8_quad(x8, blockIdx.x, cols) : x8_row(x8, cols);
    const int n_warps = blockDim.x >> 5, n_sb = cols / 32;
    float v[QA_MAX], xv[QA_MAX], ywv[QA_MAX], wv[QA_MAX];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < QA_MAX; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = 0.f;
        if (i < cols) {
            v[k] = y[i];
            xv[k] = x[i];
            ywv[k] = yw[i];
            if (w) wv[k] = w[i];
        }
    }
    const float scale = s == nullptr ? 1.f : *s;
#pragma unroll
    for (int k = 0; k < QA_MAX; ++k) ss += v[k] * v[k];  // the values past cols add an exact 0, as add_normed's none
    const float inv_y = rsqrtf(block_reduce<false>(ss, red) / cols + eps);
    ss = 0.f;
#pragma unroll
    for (int k = 0; k < QA_MAX; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < cols) {
            v[k] = __fmul_rn(__fadd_rn(xv[k], __fmul_rn(__fmul_rn(v[k], inv_y), ywv[k])), scale);
            x_new[i] = v[k];
            if (w) ss += v[k] * v[k];
        }
    }
    if (w) {  // as q8_input's X_NORM
        const float inv = rsqrtf(block_reduce<false>(ss, red) / cols + eps);
#pragma unroll
        for (int k = 0; k < QA_MAX; ++k) v[k] = v[k] * inv * wv[k];
    }
#pragma unroll
    for (int k = 0; k < QA_MAX; ++k) {
        const int sb = (threadIdx.x >> 5) + k * n_warps;
        if (sb >= n_sb) break;
        q8_code(v[k], sb, threadIdx.x & 31, x8at);
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
// EP_POSTNORM: the output is a post-norm's y (Gemma 3, 4): the block that completes the product (the last of its
// blocks to count itself in cnt[0]) computes the row's x' = (res + rms_norm(y) * pw) * ps (ps NULL: no scale)
// into xnew and codes x' normed by w (w NULL: x' itself), as q8_add_normed does (postnorm_row): the launch of
// add_normed and the consumer's coding is gone, and on 8.x a chain runs on through the post-norm.
// EP_GATED_UP: the output is the gate alone and res the up (Gemma 4's per-layer input): the group is
// act(gate) * up, as q8_input's X_GATED with its r codes it.
#define EP_NONE 0
#define EP_GATED 1
#define EP_NORM 2
#define EP_POSTNORM 3
#define EP_GATED_UP 4
#define EP_MAX_GROUPS 16  // groups a block's rows touch: at most 224 rows a block (the backend checks), so <= 8 a run
struct Epilogue {
    int mode, act;
    signed char* x8;
    int* cnt;
    const float* res;
    const float* w;
    float* xnew;
    float* ss;
    const float* pw;  // EP_POSTNORM: the post-norm's weight, the scale (NULL: none) and the norms' eps
    const float* ps;
    float eps;
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
// The groups of the consumer's input that block blk's rows (rpb a block) complete: groups[k] for k < the count
// returned, codes[k] set where this block is the last to hold one of group k's rows (counted in ep.cnt)
__device__ int ep_groups(int rows, int rpb, int blk, const Epilogue& ep, int* groups, int* codes) {
    const bool is_gated = ep.mode == EP_GATED;
    const int len = is_gated ? rows / 2 : rows;  // values the consumer multiplies
    const int rb0 = blk * rpb, rb1 = min(rows, rb0 + rpb) - 1;  // this block's rows [rb0, rb1]
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
    return n;
}
// Group g of one token's consumer input coded by a warp: y the token's product output (rows values), x8 where
// its code goes (len = the consumer's values), res / xnew / ss its rows. UP: the kernel has EP_GATED_UP (the
// one-token products'; in gemvn's it only moved registers: gemvnc3_q4_k spilled 8 bytes more on sm_87)
template <bool UP>
__device__ __forceinline__ void ep_code(const float* y, int len, int g, const Epilogue& ep, const X8At& x8,
                                        const float* res, float* xnew, float* ss) {
    const int lane = threadIdx.x & 31, i = 32 * g + lane;
    float v;
    if (ep.mode == EP_GATED || (UP && ep.mode == EP_GATED_UP)) {  // the up: y's second half, or res
        v = gated(__ldcg(y + i), !UP || ep.mode == EP_GATED ? __ldcg(y + len + i) : __ldcg(res + i), ep.act);
    } else {
        v = __ldcg(y + i);
        if (res) v += __ldcg(res + i);  // through L2: a chain's earlier product may have written it (gemv1_chainc)
        xnew[i] = v;
        const float sq = warp_sum(__fmul_rn(v, v));  // as q8_input's X_NORM_LATE
        if (lane == 0) ss[g] = sq;
        v *= ep.w[i];
    }
    q8_code(v, g, lane, x8);
}
// EP_POSTNORM's row: q8_add_normed's numbers with this block's threads (blockDim.x a power of two that divides
// Q8_BLOCK): thread t runs that kernel's threads t + j blockDim.x (j < Q8_BLOCK / blockDim.x) in turn, each with
// its values t + j blockDim.x + k Q8_BLOCK and its sums in the same order, and a warp's butterflies a virtual warp
// at a time into block_reduce's slots, which are then added in block_reduce's order.
#define Q8_BLOCK 1024  // q8_add_normed's block (quant_consts.Q8_THREADS)
__device__ float postnorm_sum(const float* red) {  // block_reduce<false>'s total of the Q8_BLOCK threads' sums
    __syncthreads();  // red's slots are written
    float r = red[0];
    for (int i = 1; i < Q8_BLOCK / 32; ++i) r += red[i];
    return r;
}
// Out of line: it runs once a launch, and inlined it cost gemv1mc_q6_k a spill (sm_87: 98 registers -> 64 and 32
// bytes spilled); the Epilogue by value: a reference gave it an address, so every thread of gemv1_chainc copied its
// whole Chain into local memory at the start (162 STL.64) and gemv1m kept an 80-byte frame
__device__ __noinline__ void postnorm_row(const float* y, int cols, const Epilogue ep) {
    __shared__ float red[Q8_BLOCK / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int vts = Q8_BLOCK / blockDim.x;
    for (int j = 0; j < vts; ++j) {
        float ss = 0.f;
        for (int i = threadIdx.x + j * blockDim.x; i < cols; i += Q8_BLOCK) {
            const float v = __ldcg(y + i);
            ss += v * v;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp + j * n_warps] = ss;
    }
    const float inv_y = rsqrtf(postnorm_sum(red) / cols + ep.eps);
    const float scale = ep.ps == nullptr ? 1.f : *ep.ps;
    __syncthreads();  // every thread has read red
    for (int j = 0; j < vts; ++j) {
        float ss = 0.f;
        for (int i = threadIdx.x + j * blockDim.x; i < cols; i += Q8_BLOCK) {
            const float v = __fmul_rn(__fadd_rn(__ldcg(ep.res + i), __fmul_rn(__fmul_rn(__ldcg(y + i), inv_y), ep.pw[i])), scale);
            ep.xnew[i] = v;
            ss += v * v;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp + j * n_warps] = ss;
    }
    const float inv = ep.w ? rsqrtf(postnorm_sum(red) / cols + ep.eps) : 1.f;
    const X8At x8 = x8_row(ep.x8, cols);
    for (int j = 0; j < vts; ++j) {
        const int t = threadIdx.x + j * blockDim.x;  // its sub-blocks: (t >> 5) + k (Q8_BLOCK / 32), whole a warp
        for (int k = 0; t + k * Q8_BLOCK < cols; ++k) {
            const int i = t + k * Q8_BLOCK;
            float v = ep.xnew[i];  // this thread's own store
            if (ep.w) v = v * inv * ep.w[i];
            q8_code(v, (t >> 5) + k * (Q8_BLOCK / 32), lane, x8);
        }
    }
}
__device__ void postnorm_epilogue(const float* y, int rows, int rpb, const Epilogue& ep) {
    __shared__ int last;
    __syncthreads();  // this block's rows of y are written
    if (threadIdx.x == 0) {
        last = count_acq_rel(ep.cnt) == (rows + rpb - 1) / rpb - 1;
        if (last) ep.cnt[0] = 0;  // ready for the next launch (a graph replays this one)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other blocks' rows (their counts were acquired by thread 0)
    postnorm_row(y, rows, ep);
}
// POST: the kernel has EP_POSTNORM (gemv1m's; in gemv1q's it put the accumulators in local memory, a 96-byte frame,
// and the backend gives it no post-norm)
template <bool POST>
__device__ void gemv_epilogue(const float* y, int rows, int rpb, const Epilogue& ep, int blk) {
    if constexpr (POST) {
        if (ep.mode == EP_POSTNORM) {
            postnorm_epilogue(y, rows, rpb, ep);
            return;
        }
    }
    __shared__ int groups[EP_MAX_GROUPS], codes[EP_MAX_GROUPS];
    const int len = ep.mode == EP_GATED ? rows / 2 : rows;
    const int n = ep_groups(rows, rpb, blk, ep, groups, codes);
    const int warp = threadIdx.x >> 5;
    for (int k = warp; k < n; k += blockDim.x >> 5) {
        if (!codes[k]) continue;
        __threadfence();  // the other blocks' rows (their counts were acquired by this block's thread k)
        ep_code<true>(y, len, groups[k], ep, x8_row(ep.x8, len), ep.res, ep.xnew, ep.ss);
    }
}
// The n-token product's epilogue: gemv_epilogue for each of the n_tok tokens of the block's set (their rows are
// the same, so a group is counted once for all of them: ep.cnt is the set's). Token k: y row k (y_stride), its
// code token k of ep.x8 (the n-token layout, whose quads the set's first token starts), its res / xnew rows len
// floats apart, its ss row len / 32.
__device__ void gemvn_epilogue(const float* y, long long y_stride, int n_tok, int rows, int rpb, int blk,
                               const Epilogue& ep) {
    __shared__ int groups[EP_MAX_GROUPS], codes[EP_MAX_GROUPS];
    const int len = ep.mode == EP_GATED ? rows / 2 : rows;
    const int n = ep_groups(rows, rpb, blk, ep, groups, codes);
    const int warp = threadIdx.x >> 5;
    for (int it = warp; it < n * n_tok; it += blockDim.x >> 5) {
        const int k = it / n_tok, t = it % n_tok;
        if (!codes[k]) continue;
        __threadfence();
        const long long r = (long long)t * len;
        ep_code<false>(y + t * y_stride, len, groups[k], ep, x8_quad(ep.x8, t, len), ep.res ? ep.res + r : nullptr,
                ep.xnew ? ep.xnew + r : nullptr, ep.ss ? ep.ss + r / 32 : nullptr);
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
    if (ep.mode != EP_NONE) gemv_epilogue<false>(y, rows, ((blockDim.x >> 5) / ks) * rpw, ep, blockIdx.x);
}
// Shared-memory staging of the one-token products' weights (Hopper): bulk copies (cp.async.bulk) that complete
// on an mbarrier, so one lane can keep tens of KB in flight without holding them in registers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {  // arrive, expecting `bytes`
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
}
#endif

// Q4_K and Q6_K on the tensor cores (Hopper). gemv1q's dp4a dot products spend 40-55 integer instructions of a
// warp on each 256 weights (unpacking, scales, two dp4a chains), which bounds them near 1.4 TB/s, even with the
// weights staged in shared memory (bench/NOTES.md v10). Here a warp takes 16 rows at a time and multiplies their
// quants by x8's codes with mma.m16n8k32 (s8 x s8 -> s32): one instruction for 16 rows x 32 values.
// Fragments (PTX ISA, m16n8k32 .s8; lane = 4 g + t): A a0/a2 row g, a1/a3 row g + 8, k = 4t..4t+3 (a0, a1)
// and 16 + 4t.. (a2, a3); B b0 k = 4t.., b1 k = 16 + 4t.., column g; C c0, c1 row g, columns 2t, 2t + 1,
// c2, c3 row g + 8. A dot product does not depend on the order of its k, so mma k 4t + i is value 8t + i of
// the 32 and 16 + 4t + i is value 8t + 4 + i: a lane reads 8 consecutive quants of a row and 8 consecutive
// codes of x (values 16-31 are the lanes t >= 2).
// Only two of B's eight columns need x (xq and xr, the two codes of common.cuh), so the other columns carry
// the next groups of the same rows, each in mma's of its own chained into one accumulator: lane t ends with
// group t's integer sums for rows g and g + 8, and every lane applies its own group's scales.
//   Q4_K (32-value groups): 4 chained mma's, sub-blocks 4q .. 4q + 3 of a unit in columns (2j, 2j + 1).
//   Q6_K (16-value groups): 2 chained mma's of 2 sub-blocks, each sub-block's halves in columns of their own
//   (a half's B is zero in the other half's lanes); quants go in as 0..63 and the 32 offset comes off the
//   integer sums with x8's 16-value sums of codes, so the integers are the dp4a path's.
// The weights stream through a ring of MMA_STAGES stages in shared memory by bulk copies, the first stages
// issued before the wait for the predecessor (weights are constants). A block takes `tpb` tiles of 16 rows,
// each in column stages of at most MMA_U units: 16 row copies a stage, rows MmaRow<T> bytes apart in shared
// memory (the padding spreads them over the banks); Q6_K rows start at 2-byte boundaries, so each copy is the
// row's bytes widened to 16-byte lines, the row `mma_off` bytes in. A tile that is one column stage (rows of
// up to MMA_U units) is one contiguous run: one copy, rows packed. Warp w takes the (unit, half) items w,
// w + n_warps, ... of a stage, and a tile's sums meet in shared memory in warp order: nothing depends on timing.
#ifndef MMA_STAGES
#error "MMA_STAGES: the backend builds this module with its kernel family's ring (family.py)"
#endif
#ifndef MMA_ILP
#error "MMA_ILP: the backend builds this module with its kernel family's form of gemv1m's items (family.py)"
#endif
#define MMA_U 10  // units a stage row: a Qwen3 row of 2 560 values in one stage
template <int T> struct MmaRow;
template <> struct MmaRow<12> { static const int bytes = MMA_U * 144 + 32; };  // 368 words: rows 16 banks apart
template <> struct MmaRow<14> { static const int bytes = 2128; };  // 2 100 + 16 of widening + 12: 20 banks apart
__device__ __forceinline__ void mma_s8(int* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ uint2 lds8_a2(const u8* p) {  // 8 bytes at a 2-byte aligned shared address
    const unsigned* a = reinterpret_cast<const unsigned*>(reinterpret_cast<size_t>(p) & ~(size_t)3);
    const unsigned sh = (unsigned)(reinterpret_cast<size_t>(p) & 2) * 8;
    const unsigned w0 = a[0], w1 = a[1], w2 = a[2];
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}
__device__ __forceinline__ int mma_off(long long unit, int bytes) { return (int)((unit * bytes) & 15); }
// A group's term added to a lane's partial sum, from its integer sums c0 (xq) and c1 (xr) as one integer
// 254 c0 + c1 (exact in a float: |c0|, |c1| <= 16 * 32 * 127), every rounding spelled out, so the one-token and
// the n-token products (gemvn below) give a token the same float. xd254: x8's scale of the group / 254.
// Q4_K: ds = d sc, dm = dmin m, xs: x8's sum of the group. Q6_K: ds = d sc; off = 32 (254 sq + sr) from x8's
// 16-value sums of codes sq, sr (the quants go in as 0..63).
__device__ __forceinline__ float q4k_acc(float acc, float ds, float dm, float xd254, float xs, int c0, int c1) {
    return __fmaf_rn(-dm, xs, __fmaf_rn(__fmul_rn(ds, xd254), (float)(254 * c0 + c1), acc));
}
__device__ __forceinline__ float q6k_acc(float acc, float ds, float xd254, int c0, int c1, int off) {
    return __fmaf_rn(__fmul_rn(ds, xd254), (float)(254 * c0 + c1 - off), acc);
}
__device__ __forceinline__ float div254(float xd) { return __fmul_rn(xd, 1.f / 254.f); }
__device__ __forceinline__ int q6k_off(int2 sums) { return 32 * (254 * sums.x + sums.y); }

// One item: sub-blocks 4q .. 4q + 3 of unit u of the stage's rows g (r0) and g + 8 (r1); adds lane (g, t)'s
// groups to acc0 (row g) and acc1 (row g + 8). xc: this lane's code of B (xq for even g, xr for odd g), sbu:
// the item's first sub-block of x, gs: Q6_K's 16-value sums of codes (xq's, xr's) of x.
template <int T> __device__ __forceinline__ void mma_item(const u8* r0, const u8* r1, int q, int g, int t, const signed char* xc,
                                                          int sbu, const float* xd, const float* xs, const int2* gs,
                                                          float& acc0, float& acc1);
template <> __device__ __forceinline__ void mma_item<12>(const u8* r0, const u8* r1, int q, int g, int t, const signed char* xc,
                                                         int sbu, const float* xd, const float* xs, const int2* gs,
                                                         float& acc0, float& acc1) {
    const uint2 w00 = *reinterpret_cast<const uint2*>(r0 + 16 + 64 * q + 8 * t);  // chunk 2q, row g
    const uint2 w01 = *reinterpret_cast<const uint2*>(r1 + 16 + 64 * q + 8 * t);  // row g + 8
    const uint2 w10 = *reinterpret_cast<const uint2*>(r0 + 48 + 64 * q + 8 * t);  // chunk 2q + 1
    const uint2 w11 = *reinterpret_cast<const uint2*>(r1 + 48 + 64 * q + 8 * t);
    const uint2 xb = *reinterpret_cast<const uint2*>(xc + 32 * (sbu + (g >> 1)) + 8 * t);
#if MMA_ILP
    // four mmas of their own (B is zero outside sub-block j's column pair, so each fills only its own columns and
    // their sum is the chained sum, exactly): none waits for another's result
    int cj[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // sub-block 4q + j: chunk 2q + j / 2, low nibbles for even j
        const uint2 wa = j < 2 ? w00 : w10, wb = j < 2 ? w01 : w11;
        const int sh = (j & 1) * 4;
        const bool mine = (g >> 1) == j;
        cj[j][0] = cj[j][1] = cj[j][2] = cj[j][3] = 0;
        mma_s8(cj[j], (wa.x >> sh) & 0x0F0F0F0F, (wb.x >> sh) & 0x0F0F0F0F, (wa.y >> sh) & 0x0F0F0F0F,
               (wb.y >> sh) & 0x0F0F0F0F, mine ? xb.x : 0u, mine ? xb.y : 0u);
    }
    int c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = (cj[0][i] + cj[1][i]) + (cj[2][i] + cj[3][i]);
#else
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // sub-block 4q + j: chunk 2q + j / 2, low nibbles for even j
        const uint2 wa = j < 2 ? w00 : w10, wb = j < 2 ? w01 : w11;
        const int sh = (j & 1) * 4;
        const bool mine = (g >> 1) == j;
        mma_s8(c, (wa.x >> sh) & 0x0F0F0F0F, (wb.x >> sh) & 0x0F0F0F0F, (wa.y >> sh) & 0x0F0F0F0F,
               (wb.y >> sh) & 0x0F0F0F0F, mine ? xb.x : 0u, mine ? xb.y : 0u);
    }
#endif
    // sub-block j = 4q + t of the unit: scale_min_k4 on the head's bytes 4..15, byte t of each word
    const int sb = sbu + t;
    const float xdv = xd[sb], xsv = xs[sb];
    const uint4 h0 = *reinterpret_cast<const uint4*>(r0), h1 = *reinterpret_cast<const uint4*>(r1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const uint4 h = r ? h1 : h0;
        const int b1 = (h.y >> (8 * t)) & 0xFF, b2 = (h.z >> (8 * t)) & 0xFF, b3 = (h.w >> (8 * t)) & 0xFF;
        const int sc = q ? (b3 & 0xF) | ((b1 >> 6) << 4) : b1 & 63;
        const int mn = q ? (b3 >> 4) | ((b2 >> 6) << 4) : b2 & 63;
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
        float& acc = r ? acc1 : acc0;
        acc = q4k_acc(acc, __fmul_rn(dm.x, (float)sc), __fmul_rn(dm.y, (float)mn), div254(xdv), xsv, c[2 * r], c[2 * r + 1]);
    }
}
template <> __device__ __forceinline__ void mma_item<14>(const u8* r0, const u8* r1, int q, int g, int t, const signed char* xc,
                                                         int sbu, const float* xd, const float* xs, const int2* gs,
                                                         float& acc0, float& acc1) {
    // half q of the super-block: ql runs A (ql + 64q) and B (+ 32), qh run (128 + 32q); sub-block 4q + ts is
    // A (even ts) or B (odd), low nibbles for ts < 2, with qh bits 2 ts, 2 ts + 1
    uint2 a[2], b[2], h[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u8* u = r ? r1 : r0;
        a[r] = lds8_a2(u + 64 * q + 8 * t);
        b[r] = lds8_a2(u + 64 * q + 32 + 8 * t);
        h[r] = lds8_a2(u + 128 + 32 * q + 8 * t);
    }
    const int cp = g >> 1;  // this lane's column pair: sub-block cp / 2 of the chained pair, half cp & 1
    // MMA_ILP: the pair's two mmas of their own (each fills only its own columns: their sum is the chained sum)
    int cm[2][2][4];
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // sub-blocks 4q + 2p, 4q + 2p + 1
        const uint2 xb = *reinterpret_cast<const uint2*>(xc + 32 * (sbu + 2 * p + (cp >> 1)) + 8 * t);
        const bool half = (cp & 1) == (t >> 1);  // B's rows of this lane are in its column's half
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int ts = 2 * p + m, ns = (ts >> 1) * 4, hs = 2 * ts;
            unsigned w[2][2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint2 run = m ? b[r] : a[r];
                w[r][0] = ((run.x >> ns) & 0x0F0F0F0F) | (((h[r].x >> hs) & 0x03030303) << 4);
                w[r][1] = ((run.y >> ns) & 0x0F0F0F0F) | (((h[r].y >> hs) & 0x03030303) << 4);
            }
            const bool mine = half && (cp >> 1) == m;
            int* acc = MMA_ILP ? cm[p][m] : cm[p][0];
            if (MMA_ILP || m == 0) acc[0] = acc[1] = acc[2] = acc[3] = 0;
            mma_s8(acc, w[0][0], w[1][0], w[0][1], w[1][1], mine ? xb.x : 0u, mine ? xb.y : 0u);
        }
    }
    int c[2][4];
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) c[p][i] = MMA_ILP ? cm[p][0][i] + cm[p][1][i] : cm[p][0][i];
    // lane t: pair p's sub-block 4q + 2p + t / 2, half t & 1: 16-value group gi of the super-block
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int sb = sbu + 2 * p + (t >> 1), gi = 2 * (4 * q + 2 * p + (t >> 1)) + (t & 1);
        const int2 sums = gs[2 * sb + (t & 1)];
        const float xdv = xd[sb];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const u8* u = r ? r1 : r0;
            const float d = __half2float(*reinterpret_cast<const __half*>(u + 208));
            const int sc = reinterpret_cast<const signed char*>(u)[192 + gi];
            float& acc = r ? acc1 : acc0;
            acc = q6k_acc(acc, __fmul_rn(d, (float)sc), div254(xdv), c[p][2 * r], c[p][2 * r + 1], q6k_off(sums));
        }
    }
}

// cp.async (compute capability 8.0): 16 bytes from global to shared memory, completing in the issuing thread's
// groups (commit_group; wait_group N: all but the N newest of its groups are complete)
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {  // dst: a shared address (smem_u32)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// The weight stream of gemv1m and gemvn: a block's tiles of 16 rows, each in column stages of at most MMA_U
// units, through a ring of MMA_STAGES stages in shared memory. BULK (compute capability 9.0): filled by bulk
// copies that warp 0 issues and that complete on an mbarrier a stage. Else (8.x: gemv1mc, gemvnc): every thread
// of the block copies its share of a stage's 16-byte lines with cp.async, a commit group a stage, and a stage is
// waited for by every thread and then a block barrier. The same bytes land at the same places either way, so
// the products' numbers do not depend on which copies brought them.
template <int T, bool BULK>
struct MmaStream {
    static constexpr int ROW = MmaRow<T>::bytes, STAGE = 16 * ROW, UB = Blk<T>::bytes;
    const u8* W;
    u8* ring;
    unsigned long long* full;
    int rows, nb, ncs, cu, tile0, n_stages, row_step;
    bool whole;  // a tile of whole rows (one column stage) is one contiguous run of bytes: one copy, rows packed
    __device__ MmaStream(const u8* W_, u8* ring_, unsigned long long* full_, int rows_, int cols, int tpb, int blk)
        : W(W_), ring(ring_), full(full_), rows(rows_) {
        nb = cols >> 8;
        ncs = (nb + MMA_U - 1) / MMA_U;
        cu = (nb + ncs - 1) / ncs;
        tile0 = blk * tpb;
        n_stages = min(tpb, (rows + 15) / 16 - tile0) * ncs;
        whole = ncs == 1;
        row_step = whole ? nb * UB : ROW;
    }
    // stage s by cp.async: a tile of whole rows as one run of 16-byte lines, the threads taking them in turn;
    // else blockDim.x / 16 threads a row (a block is whole warps), each its row's lines c0, c0 + that, ...: a
    // line costs a copy and two additions, its row's unit and offset found once a stage (bench/NOTES.md v23)
    __device__ void issue_async(int s) {
        const int tile = tile0 + s / ncs, cs = s % ncs, ub = cs * cu, nu = min(cu, nb - ub);
        const int nr = min(16, rows - 16 * tile);
        const unsigned dst = smem_u32(ring + (s % MMA_STAGES) * STAGE);
        if (whole) {
            const int n = nr * nb * UB / 16, step = 16 * blockDim.x;
            const u8* src = W + (long long)16 * tile * nb * UB + 16 * threadIdx.x;
            unsigned d = dst + 16 * threadIdx.x;
#pragma unroll 4
            for (int i = threadIdx.x; i < n; i += blockDim.x, src += step, d += step) cp_async16(d, src);
            return;
        }
        const int tpr = blockDim.x >> 4, r = threadIdx.x / tpr, c0 = threadIdx.x - r * tpr, step = 16 * tpr;
        if (r >= nr) return;
        const long long unit = (long long)(16 * tile + r) * nb + ub;
        const int off = mma_off(unit, UB), end = off + nu * UB;  // the row's bytes from the line it starts in
        const u8* src = W + unit * UB - off + 16 * c0;
        unsigned d = dst + r * ROW + 16 * c0;
#pragma unroll 4
        for (int c = 16 * c0; c < end; c += step, src += step, d += step) cp_async16(d, src);
    }
    // stage s: tile s / ncs, units [cs * cu, min(nb, cs * cu + cu)) of its rows, a row a lane of warp 0
    __device__ void issue(int s, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const int tile = tile0 + s / ncs, cs = s % ncs, ub = cs * cu, nu = min(cu, nb - ub);
        const int nr = min(16, rows - 16 * tile);
        unsigned long long* bar = &full[s % MMA_STAGES];
        u8* dst = ring + (s % MMA_STAGES) * STAGE;
        if (whole) {  // nr rows of a matrix of whole 16-byte lines: a multiple of 16 bytes (the backend checks)
            if (lane == 0) {
                mbar_expect(bar, nr * nb * UB);
                bulk_copy(dst, W + (long long)16 * tile * nb * UB, nr * nb * UB, bar);
            }
            return;
        }
        const long long unit = (long long)(16 * tile + lane) * nb + ub;
        const int off = mma_off(unit, UB), bytes = lane < nr ? (off + nu * UB + 15) & ~15 : 0;
        const int total = __reduce_add_sync(FULL, bytes);
        if (lane == 0) mbar_expect(bar, total);
        __syncwarp();
        if (lane < nr) bulk_copy(dst + lane * ROW, W + unit * UB - off, bytes, bar);
#endif
    }
    // warp 0: the barriers, then the first stages, before the wait for the predecessor (weights are constants)
    __device__ void start(int warp, int lane) {
        if constexpr (!BULK) {  // every thread: the first stages, a commit group each (empty ones too, so that a
            // stage's group is always the MMA_STAGES - 1 th before the newest when it is waited for)
            for (int s = 0; s < MMA_STAGES; ++s) {
                if (s < n_stages) issue_async(s);
                cp_async_commit();
            }
            return;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (warp != 0) return;
        if (lane == 0) {
            for (int i = 0; i < MMA_STAGES; ++i)
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&full[i])) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp();
        for (int s = 0; s < min(MMA_STAGES, n_stages); ++s) issue(s, lane);
#endif
    }
    // row r of stage s in shared memory (its unit ub of the stage first); waits for the stage
    __device__ const u8* row(int s, int r) const {
        const int tile = tile0 + s / ncs, ub = (s % ncs) * cu;
        return ring + (s % MMA_STAGES) * STAGE + r * row_step + (whole ? 0 : mma_off((long long)(16 * tile + r) * nb + ub, UB));
    }
    __device__ void wait(int s) {
        if constexpr (!BULK) {  // this thread's lines of stage s, then everyone's
            cp_async_wait<MMA_STAGES - 1>();
            __syncthreads();
            return;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        mbar_wait(&full[s % MMA_STAGES], (s / MMA_STAGES) & 1);
#endif
    }
    // after the block's __syncthreads: the stage is read, its slot takes stage s + MMA_STAGES
    __device__ void refill(int s, int warp, int lane) {
        if constexpr (!BULK) {
            if (s + MMA_STAGES < n_stages) issue_async(s + MMA_STAGES);
            cp_async_commit();
            return;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (warp == 0 && s + MMA_STAGES < n_stages) {
            if (lane == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the reads before the copy
            issue(s + MMA_STAGES, lane);
        }
#endif
    }
};

// dynamic shared memory: MMA_STAGES * 16 * MmaRow<T>::bytes (the ring), x8 (2 cols + cols / 4 bytes), then for
// Q6_K cols / 16 int2 sums of codes
// blk: the block's place in the product's grid; wait_input(): returns once the product's inputs (x8g, nss, the
// epilogue's residual) are written, called after the first weight stages are issued (weights are constants)
template <int T, bool BULK, class Wait>
__device__ void gemv1_mma(const u8* W, const signed char* x8g, float* y, int rows, int cols, int tpb, const float* nss,
                          int n_ss, float eps, const Epilogue& ep, int blk, Wait wait_input) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#if __CUDA_ARCH__ < 900
    if constexpr (BULK) __trap();  // bulk copies are 9.0's; 8.x launches the cp.async form
#endif
    extern __shared__ __align__(16) u8 smem[];
    __shared__ unsigned long long full[MMA_STAGES];
    __shared__ float red[2][16][16], inv_s;  // a tile's sums: [tile parity][warp][row]
    MmaStream<T, BULK> st(W, smem, full, rows, cols, tpb, blk);
    signed char* x8 = reinterpret_cast<signed char*>(smem + MMA_STAGES * MmaStream<T, BULK>::STAGE);
    int2* gs = reinterpret_cast<int2*>(x8 + 2 * cols + cols / 4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n_warps = blockDim.x >> 5;
    st.start(warp, lane);
    wait_input();
    const int x8_lines = (2 * cols + cols / 4) / 16;
    for (int i = threadIdx.x; i < x8_lines; i += blockDim.x)
        reinterpret_cast<int4*>(x8)[i] = __ldcg(reinterpret_cast<const int4*>(x8g) + i);
    if (warp == 0) {
        float inv = 1.f;
        if (nss != nullptr) {
            float s = 0.f;
            for (int i = lane; i < n_ss; i += 32) s += __ldcg(nss + i);
            inv = rsqrtf(warp_sum(s) / cols + eps);
        }
        if (lane == 0) inv_s = inv;
    }
    if (T == 14) {  // the 16-value sums of both codes (from global memory: x8 in shared memory is not complete)
        for (int i = threadIdx.x; i < cols / 16; i += blockDim.x) {
            const int4 a = __ldcg(reinterpret_cast<const int4*>(x8g) + i), b = __ldcg(reinterpret_cast<const int4*>(x8g + cols) + i);
            int sq = 0, sr = 0;
            sq = __dp4a(a.x, 0x01010101, __dp4a(a.y, 0x01010101, __dp4a(a.z, 0x01010101, __dp4a(a.w, 0x01010101, sq))));
            sr = __dp4a(b.x, 0x01010101, __dp4a(b.y, 0x01010101, __dp4a(b.z, 0x01010101, __dp4a(b.w, 0x01010101, sr))));
            gs[i] = make_int2(sq, sr);
        }
    }
    __syncthreads();  // the barriers' initialisation, x8, its sums and the norm factor
    const float inv = inv_s;
    const signed char* xc = x8 + (g & 1) * cols;  // this lane's code of B: xq (even g) or xr (odd g)
    const float* xd = reinterpret_cast<const float*>(x8 + 2 * cols);
    const float* xs = xd + cols / 32;
    float acc0 = 0.f, acc1 = 0.f;  // rows g and g + 8 of the tile, this lane's groups
    for (int s = 0; s < st.n_stages; ++s) {
        const int tile = st.tile0 + s / st.ncs, cs = s % st.ncs, ub = cs * st.cu, nu = min(st.cu, st.nb - ub);
        const u8* g0 = st.row(s, g);
        const u8* g8 = st.row(s, g + 8);
        st.wait(s);
#if MMA_ILP
#pragma unroll 2  // two items' loads and mmas out before either's sums
#endif
        for (int item = warp; item < 2 * nu; item += n_warps) {
            const int u = item >> 1, q = item & 1;  // unit u of the stage, its sub-blocks 4q .. 4q + 3
            mma_item<T>(g0 + u * MmaStream<T, BULK>::UB, g8 + u * MmaStream<T, BULK>::UB, q, g, t, xc, 8 * (ub + u) + 4 * q, xd, xs, gs,
                        acc0, acc1);
        }
        const bool last = cs == st.ncs - 1;  // the tile's sums are complete
        const int par = (s / st.ncs) & 1;
        if (last) {
            acc0 += __shfl_xor_sync(FULL, acc0, 1);
            acc0 += __shfl_xor_sync(FULL, acc0, 2);
            acc1 += __shfl_xor_sync(FULL, acc1, 1);
            acc1 += __shfl_xor_sync(FULL, acc1, 2);
            if (t == 0) red[par][warp][g] = acc0, red[par][warp][g + 8] = acc1;
            acc0 = acc1 = 0.f;
        }
        __syncthreads();  // the stage is read (and a finished tile's sums are in red)
        st.refill(s, warp, lane);
        if (last && threadIdx.x < 16) {
            const int row = 16 * tile + threadIdx.x;
            float v = 0.f;
            for (int w = 0; w < n_warps; ++w) v += red[par][w][threadIdx.x];
            if (row < rows) y[row] = v * inv;
        }
    }
    if (ep.mode != EP_NONE) gemv_epilogue<true>(y, rows, 16 * tpb, ep, blk);
#endif
}

// The n-token product (2-64 tokens: several streams' decode rows, a short prompt): gemv1m's weight stream, tiles
// and items, with the tokens in B's columns, four an mma (columns 2k and 2k + 1: token k's xq and xr), NG
// groups of four a launch. A token gets the float gemv1m gives it alone, bit for bit: the integer sums are
// exact, each group's term is added by the same expression (q4k_acc, q6k_acc), and a lane keeps gemv1m's four
// partial sums apart (acc[.][j]: what gemv1m's lane t = j sums), added in its order: the items a warp takes,
// (j0 + j1) + (j2 + j3), then the warps in order, times the token's norm factor. So a launch must have
// gemv1m's warps for the matrix (the backend gives it that block size), and a token's x8 row is what q8_input
// or the producer's epilogue would have coded for it alone. x8: n_tok tokens in the n-token layout (common.cuh:
// quads of four tokens qst bytes apart), read through L1; y: row k at y + k y_stride; nss: n_ss group sums of
// squares a token (or NULL).
// Q4_K: a lane's B for token 4 tg + g / 2 is 8 codes of sub-block j; C lane (g, t): token 4 tg + t, rows g, g + 8;
// the eight lanes (g, t) of a quad's codes of one sub-block read its 256 bytes in order (lane 4 g + t: 8 g + t..).
// x8 of an n-token product: by the read-only path (__ldg) where an earlier kernel wrote it, or (CH) where an earlier
// product of the same chained launch did (gemvn_chainc) by plain loads, which the block's wait orders after the
// producer's stores: its ld.acquire.gpu also invalidates the SM's L1 (sm_87 SASS: CCTL.IVALL); the read-only path's
// loads are not ordered by it
template <bool CH, class V>
__device__ __forceinline__ V ld_x8(const V* p) {
    if constexpr (CH) return *p;
    else return __ldg(p);
}
template <int NG, bool CH>
__device__ __forceinline__ void mma_item_n12(const u8* r0, const u8* r1, int q, int g, int t, const signed char* x8,
                                             long long qst, int n_tok, int cols, int sbu, float (&acc)[2][4][NG]) {
    const uint2 w00 = *reinterpret_cast<const uint2*>(r0 + 16 + 64 * q + 8 * t);
    const uint2 w01 = *reinterpret_cast<const uint2*>(r1 + 16 + 64 * q + 8 * t);
    const uint2 w10 = *reinterpret_cast<const uint2*>(r0 + 48 + 64 * q + 8 * t);
    const uint2 w11 = *reinterpret_cast<const uint2*>(r1 + 48 + 64 * q + 8 * t);
    unsigned A[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint2 wa = j < 2 ? w00 : w10, wb = j < 2 ? w01 : w11;
        const int sh = (j & 1) * 4;
        A[j][0] = (wa.x >> sh) & 0x0F0F0F0F, A[j][1] = (wb.x >> sh) & 0x0F0F0F0F;
        A[j][2] = (wa.y >> sh) & 0x0F0F0F0F, A[j][3] = (wb.y >> sh) & 0x0F0F0F0F;
    }
    // sub-block j's scales for rows g and g + 8: lane (g, t) decodes j = t as gemv1m does, the quad shares them
    float ds[2][4], dm[2][4];
    const uint4 h0 = *reinterpret_cast<const uint4*>(r0), h1 = *reinterpret_cast<const uint4*>(r1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const uint4 h = r ? h1 : h0;
        const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&h.x));
        const int b1 = (h.y >> (8 * t)) & 0xFF, b2 = (h.z >> (8 * t)) & 0xFF, b3 = (h.w >> (8 * t)) & 0xFF;
        const int sc = q ? (b3 & 0xF) | ((b1 >> 6) << 4) : b1 & 63;
        const int mn = q ? (b3 >> 4) | ((b2 >> 6) << 4) : b2 & 63;
        const float my_ds = __fmul_rn(d.x, (float)sc), my_dm = __fmul_rn(d.y, (float)mn);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            ds[r][j] = __shfl_sync(FULL, my_ds, (g << 2) | j);
            dm[r][j] = __shfl_sync(FULL, my_dm, (g << 2) | j);
        }
    }
#pragma unroll
    for (int tg = 0; tg < NG; ++tg) {
        // B's token (a pad's codes are zero; its column's scales, read from the quad's unused slot, reach only
        // that column's sums, which are never written). A set's last groups may hold no token: their quads lie
        // in the three x8_quads allocates past the tokens' (rows.py), and their columns are never written either.
        // No test of n_tok here: a branch in this unrolled loop cost 14 % of a 16-stream step (bench/NOTES.md v19).
        const int tb = 4 * tg + (g >> 1);
        const signed char* qb = x8 + tg * qst;  // the quad of tokens 4 tg .. 4 tg + 3
        const signed char* xb = qb + 256LL * sbu + 8 * (4 * g + t);
        const float* xd = reinterpret_cast<const float*>(qb + 8 * cols) + 4 * sbu + 4 * t;
        uint2 b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = tb < n_tok ? ld_x8<CH>(reinterpret_cast<const uint2*>(xb + 256 * j)) : make_uint2(0u, 0u);
        const float4 xd4 = ld_x8<CH>(reinterpret_cast<const float4*>(xd)), xs4 = ld_x8<CH>(reinterpret_cast<const float4*>(xd + cols / 8));
        const float xdj[4] = {xd4.x, xd4.y, xd4.z, xd4.w}, xsj[4] = {xs4.x, xs4.y, xs4.z, xs4.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int c[4] = {0, 0, 0, 0};
            mma_s8(c, A[j][0], A[j][1], A[j][2], A[j][3], b[j].x, b[j].y);
            const float xd254 = div254(xdj[j]);
            acc[0][j][tg] = q4k_acc(acc[0][j][tg], ds[0][j], dm[0][j], xd254, xsj[j], c[0], c[1]);
            acc[1][j][tg] = q4k_acc(acc[1][j][tg], ds[1][j], dm[1][j], xd254, xsj[j], c[2], c[3]);
        }
    }
}
// Q6_K: sub-block ts of the item (half q of the super-block), 16-value half h: an mma of its own (B zero in the
// other half's k), term into acc[.][2 (ts & 1) + h] (gemv1m's lane t = 2 (ts & 1) + h of pair p = ts / 2)
template <int NG, bool CH>
__device__ __forceinline__ void mma_item_n14(const u8* r0, const u8* r1, int q, int g, int t, const signed char* x8,
                                             long long qst, int n_tok, int cols, int sbu, float (&acc)[2][4][NG]) {
    uint2 a[2], b[2], h[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u8* u = r ? r1 : r0;
        a[r] = lds8_a2(u + 64 * q + 8 * t);
        b[r] = lds8_a2(u + 64 * q + 32 + 8 * t);
        h[r] = lds8_a2(u + 128 + 32 * q + 8 * t);
    }
    unsigned A[4][4];
#pragma unroll
    for (int ts = 0; ts < 4; ++ts) {
        const int ns = (ts >> 1) * 4, hs = 2 * ts;
        unsigned w[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint2 run = (ts & 1) ? b[r] : a[r];
            w[r][0] = ((run.x >> ns) & 0x0F0F0F0F) | (((h[r].x >> hs) & 0x03030303) << 4);
            w[r][1] = ((run.y >> ns) & 0x0F0F0F0F) | (((h[r].y >> hs) & 0x03030303) << 4);
        }
        A[ts][0] = w[0][0], A[ts][1] = w[1][0], A[ts][2] = w[0][1], A[ts][3] = w[1][1];
    }
    float ds[2][8];  // [row][2 ts + h]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u8* u = r ? r1 : r0;
        const float d = __half2float(*reinterpret_cast<const __half*>(u + 208));
#pragma unroll
        for (int i = 0; i < 8; ++i) ds[r][i] = __fmul_rn(d, (float)reinterpret_cast<const signed char*>(u)[192 + 8 * q + i]);
    }
    const bool lo = (t >> 1) == 0;  // this lane's B rows hold values 0-15 of a sub-block (else 16-31)
#pragma unroll
    for (int tg = 0; tg < NG; ++tg) {
        const int tb = 4 * tg + (g >> 1);
        const signed char* qb = x8 + tg * qst;  // the quad of tokens 4 tg .. 4 tg + 3
        const signed char* xb = qb + 256LL * sbu + 8 * (4 * g + t);
        const float* xd = reinterpret_cast<const float*>(qb + 8 * cols) + 4 * sbu + 4 * t;
        const int2* gs = reinterpret_cast<const int2*>(qb + 9 * cols) + 8 * sbu + 8 * t;
        uint2 bv[4];
#pragma unroll
        for (int ts = 0; ts < 4; ++ts) bv[ts] = tb < n_tok ? ld_x8<CH>(reinterpret_cast<const uint2*>(xb + 256 * ts)) : make_uint2(0u, 0u);
        const float4 xd4 = ld_x8<CH>(reinterpret_cast<const float4*>(xd));
        const float xdj[4] = {xd4.x, xd4.y, xd4.z, xd4.w};
#pragma unroll
        for (int ts = 0; ts < 4; ++ts) {
            const float xd254 = div254(xdj[ts]);
            const int4 sums = ld_x8<CH>(reinterpret_cast<const int4*>(gs + 2 * ts));  // both halves' sums
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const bool mine = lo == (hf == 0);
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, A[ts][0], A[ts][1], A[ts][2], A[ts][3], mine ? bv[ts].x : 0u, mine ? bv[ts].y : 0u);
                const int off = q6k_off(hf ? make_int2(sums.z, sums.w) : make_int2(sums.x, sums.y));
                const int j = 2 * (ts & 1) + hf;
                acc[0][j][tg] = q6k_acc(acc[0][j][tg], ds[0][2 * ts + hf], xd254, c[0], c[1], off);
                acc[1][j][tg] = q6k_acc(acc[1][j][tg], ds[1][2 * ts + hf], xd254, c[2], c[3], off);
            }
        }
    }
}
template <int T, int NG, bool CH>
__device__ __forceinline__ void mma_item_n(const u8* r0, const u8* r1, int q, int g, int t, const signed char* x8, long long qst,
                                           int n_tok, int cols, int sbu, float (&acc)[2][4][NG]) {
    if constexpr (T == 12) mma_item_n12<NG, CH>(r0, r1, q, g, t, x8, qst, n_tok, cols, sbu, acc);
    else mma_item_n14<NG, CH>(r0, r1, q, g, t, x8, qst, n_tok, cols, sbu, acc);
}
// dynamic shared memory: the ring, then the tiles' sums [2][n_warps][16][4 NG] floats
// Block b takes tokens [4 NG s, 4 NG s + 4 NG) for s = b % sets of the tiles of b / sets: the sets of one
// stretch of tiles run side by side, so the weights come from HBM once and from L2 for the other sets.
// ep (mode EP_NONE: none): each token's consumer input coded as the one-token product's epilogue codes it
// (gemvn_epilogue), into ep.x8 in the n-token layout; ep.cnt: a set's counters each.
// CH: a product of gemvn_chainc (x8 written in the same launch: ld_x8). blk: the block's place in the product's grid;
// wait_input(): returns once the inputs are written, called after the first weight stages are issued, by every block.
template <int T, int NG, bool BULK, bool CH, class Wait>
__device__ void gemvn_mma(const u8* W, const signed char* x8, int n_tok, float* y, long long y_stride, int rows,
                          int cols, int tpb, int sets, const float* nss, int n_ss, float eps, Epilogue ep, int blk,
                          Wait wait_input) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#if __CUDA_ARCH__ < 900
    if constexpr (BULK) __trap();  // bulk copies are 9.0's; 8.x launches the cp.async form
#endif
    constexpr int NT = 4 * NG;
    extern __shared__ __align__(16) u8 smem[];
    __shared__ unsigned long long full[MMA_STAGES];
    __shared__ float inv_s[NT];
    const int set = (unsigned)blk % sets;  // blk >= 0: unsigned, as blockIdx.x was (the same SASS)
    const long long qst = x8_quad_bytes(cols);
    x8 += set * NG * qst;  // the set's quads
    y += set * NT * y_stride;
    if (nss != nullptr) nss += set * NT * n_ss;
    if (ep.mode != EP_NONE) {  // this set's tokens' rows, and its counters
        const long long len = ep.mode == EP_GATED ? rows / 2 : rows, t0 = (long long)set * NT;
        ep.x8 += (t0 / 4) * x8_quad_bytes((int)len);
        ep.cnt += set * (len / 32);
        if (ep.res) ep.res += t0 * len;
        if (ep.xnew) ep.xnew += t0 * len;
        if (ep.ss) ep.ss += t0 * len / 32;
    }
    n_tok = min(NT, n_tok - set * NT);
    if (n_tok <= 0) {  // a set past the tokens (the backend launches none); in a chain past the wait all the same
        if constexpr (CH) wait_input();  // (its counters)
        return;
    }
    MmaStream<T, BULK> st(W, smem, full, rows, cols, tpb, (unsigned)blk / sets);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int n_warps = blockDim.x >> 5;
    float* red = reinterpret_cast<float*>(smem + MMA_STAGES * MmaStream<T, BULK>::STAGE);
    st.start(warp, lane);
    wait_input();
    for (int k = warp; k < n_tok; k += n_warps) {  // each token's norm factor, as gemv1m's warp 0 makes it
        float inv = 1.f;
        if (nss != nullptr) {
            float s = 0.f;
            for (int i = lane; i < n_ss; i += 32) s += __ldcg(nss + k * n_ss + i);
            inv = rsqrtf(warp_sum(s) / cols + eps);
        }
        if (lane == 0) inv_s[k] = inv;
    }
    __syncthreads();  // the barriers' initialisation and the norm factors
    float acc[2][4][NG];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < NG; ++k) acc[r][j][k] = 0.f;
    for (int s = 0; s < st.n_stages; ++s) {
        const int tile = st.tile0 + s / st.ncs, cs = s % st.ncs, ub = cs * st.cu, nu = min(st.cu, st.nb - ub);
        const u8* g0 = st.row(s, g);
        const u8* g8 = st.row(s, g + 8);
        st.wait(s);
        for (int item = warp; item < 2 * nu; item += n_warps) {
            const int u = item >> 1, q = item & 1;
            mma_item_n<T, NG, CH>(g0 + u * MmaStream<T, BULK>::UB, g8 + u * MmaStream<T, BULK>::UB, q, g, t, x8, qst, n_tok,
                                  cols, 8 * (ub + u) + 4 * q, acc);
        }
        const bool last = cs == st.ncs - 1;
        float* part = red + ((s / st.ncs) & 1) * n_warps * 16 * NT;  // [warp][row][token]
        if (last) {
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int k = 0; k < NG; ++k) {
                    part[(warp * 16 + g + 8 * r) * NT + 4 * k + t] =
                        __fadd_rn(__fadd_rn(acc[r][0][k], acc[r][1][k]), __fadd_rn(acc[r][2][k], acc[r][3][k]));
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[r][j][k] = 0.f;
                }
        }
        __syncthreads();
        st.refill(s, warp, lane);
        if (last) {
            for (int i = threadIdx.x; i < 16 * n_tok; i += blockDim.x) {
                const int rr = i & 15, k = i >> 4, row = 16 * tile + rr;
                float v = 0.f;
                for (int w = 0; w < n_warps; ++w) v += part[(w * 16 + rr) * NT + k];
                if (row < rows) y[k * y_stride + row] = v * inv_s[k];
            }
        }
    }
    if (ep.mode != EP_NONE) gemvn_epilogue(y, y_stride, n_tok, rows, 16 * tpb, (unsigned)blk / sets, ep);
    // a chain's next product on this block starts its copies into the dynamic shared memory (its ring may reach
    // where this one's tile sums are still read, a Q6_K ring after a Q4_K's) and writes inv_s: after everyone here
    if constexpr (CH) __syncthreads();
#endif
}
// gemv1m_* and gemvn*_* stream the weights by bulk copies (9.0); gemv1mc_* and gemvnc*_* by cp.async (8.x)
#define INSTANTIATE_M(T, NAME, OP, BULK)                                                                          \
    extern "C" __global__ void __launch_bounds__(512) OP##_##NAME(                                                 \
        const u8* W, const signed char* x8, float* y, int rows, int cols, int tpb, const float* nss, int n_ss,     \
        float eps, int ep_mode, int ep_act, signed char* ep_x8, int* ep_cnt, const float* ep_res, const float* ep_w, \
        float* ep_xnew, float* ep_ss, const float* ep_pw, const float* ep_ps, float ep_eps) {                     \
        const Epilogue ep{ep_mode, ep_act, ep_x8, ep_cnt, ep_res, ep_w, ep_xnew, ep_ss, ep_pw, ep_ps, ep_eps};    \
        gemv1_mma<T, BULK>(W, x8, y, rows, cols, tpb, nss, n_ss, eps, ep, blockIdx.x, [] { GRID_DEP_START(); });  \
    }
#define INSTANTIATE_N(T, NG, NAME, OP, BULK)                                                                      \
    extern "C" __global__ void __launch_bounds__(512) OP##NG##_##NAME(                                             \
        const u8* W, const signed char* x8, int n_tok, float* y, long long y_stride, int rows, int cols, int tpb,  \
        int sets, const float* nss, int n_ss, float eps, int ep_mode, int ep_act, signed char* ep_x8, int* ep_cnt,  \
        const float* ep_res, const float* ep_w, float* ep_xnew, float* ep_ss) {                                   \
        const Epilogue ep{ep_mode, ep_act, ep_x8, ep_cnt, ep_res, ep_w, ep_xnew, ep_ss, nullptr, nullptr, 0.f};   \
        gemvn_mma<T, NG, BULK, false>(W, x8, n_tok, y, y_stride, rows, cols, tpb, sets, nss, n_ss, eps, ep, blockIdx.x, \
                                      [] { GRID_DEP_START(); });                                                 \
    }
#define INSTANTIATE_MMA(OP1, OPN, BULK)          \
    INSTANTIATE_M(12, q4_k, OP1, BULK)           \
    INSTANTIATE_M(14, q6_k, OP1, BULK)           \
    INSTANTIATE_N(12, 1, q4_k, OPN, BULK)        \
    INSTANTIATE_N(12, 2, q4_k, OPN, BULK)        \
    INSTANTIATE_N(12, 4, q4_k, OPN, BULK)        \
    INSTANTIATE_N(14, 1, q6_k, OPN, BULK)        \
    INSTANTIATE_N(14, 2, q6_k, OPN, BULK)        \
    INSTANTIATE_N(14, 4, q6_k, OPN, BULK)
#if PATHS_90
INSTANTIATE_MMA(gemv1m, gemvn, true)
// a prompt chunk's sets of 3, 5 and 8 groups by cp.async (family.n_cp_async): their bulk forms spill (sm_90: 148
// bytes at 5 groups, 356 at 8), these not or hardly (3: 0; 5: 20 for Q4_K, 12 for Q6_K; 8: 4)
INSTANTIATE_N(12, 3, q4_k, gemvnc, false)
INSTANTIATE_N(12, 5, q4_k, gemvnc, false)
INSTANTIATE_N(12, 8, q4_k, gemvnc, false)
INSTANTIATE_N(14, 3, q6_k, gemvnc, false)
INSTANTIATE_N(14, 5, q6_k, gemvnc, false)
#else
INSTANTIATE_MMA(gemv1mc, gemvnc, false)
// 8.x's prompt chunks (more than four groups) take sets of 3, 5 and, for Q4_K, 8 groups too (rows.prompt_groups,
// KernelFamily.n_groups): under __launch_bounds__(512)'s 128 registers these spill at most 16 bytes on sm_87 and
// sm_86 (Q6_K at 8 spills 424; on sm_90 their bulk form spills more: 9.0 takes these cp.async ones, above)
INSTANTIATE_N(12, 3, q4_k, gemvnc, false)
INSTANTIATE_N(12, 5, q4_k, gemvnc, false)
INSTANTIATE_N(12, 8, q4_k, gemvnc, false)
INSTANTIATE_N(14, 3, q6_k, gemvnc, false)
INSTANTIATE_N(14, 5, q6_k, gemvnc, false)
#endif

// Several one-token products in one launch (8.x, which has no programmatic dependent launch; 9.0 where a bench asks,
// CupyTuning.chains_90: their cp.async form there too): a decode layer's
// o, gate/up and down and the next layer's q/k and v, each coding the next one's input in its epilogue. Every
// block of the launch is resident at once (the backend checks the occupancy), and block b runs block b - base of
// each product's own grid in turn (a product that does not read its predecessor may start where that one's
// blocks end, so that the two run side by side: the next layer's v beside its q/k, chain.py): it issues its
// first weight stages of product k, then waits until every block of the product k reads from (dep) has counted
// itself done, as gemv1mc waits for its predecessor kernel; so the next product's weights are on their way while
// the last blocks of this one finish, which a kernel boundary does not allow. A product's numbers are gemv1mc's
// for the same block. sync: CHAIN_MAX done counters, then
// CHAIN_MAX counters of blocks past a wait, zero between launches (the last block past a product's last
// reader's wait zeroes both). gemvn_chainc: the same for the n-token products of a step's rows (gemvnc1's, one
// group of four tokens a block), whose numbers are gemvnc1's.
#define CHAIN_MAX 8
struct ChainOp {  // one product: gemv1mc's (or gemvnc1's) arguments, and its place in the chain
    const u8* W;
    const signed char* x8;
    float* y;
    const float* nss;
    Epilogue ep;
    int rows, cols, tpb, type, n_ss;
    int grid;       // its blocks (<= the launch's)
    int dep;        // the product whose output it reads (-1: written before the launch)
    int counted;    // a later product reads its output: its blocks count themselves done
    int last_wait;  // the last product that waits for dep: the last block past its wait zeroes the counters
    int base;       // its first block in the launch: blocks base .. base + grid - 1 run its blocks 0 .. grid - 1
    float eps;
    long long y_stride;  // gemvn_chainc's: y's rows apart, the tokens and their sets
    int n_tok, sets;
};
struct Chain {
    ChainOp op[CHAIN_MAX];
    int* sync;
    int n;
};
static_assert(sizeof(ChainOp) == 176 && sizeof(Chain) == 1424, "chain.py's OP and CHAIN describe these");
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// The chain's products in turn: run(o, blk, wait) runs block blk of product o, calling wait() once its first
// weights are on their way
template <class Run>
__device__ __forceinline__ void run_chain(const Chain& c, Run run) {
    int* done = c.sync;
    int* passed = c.sync + CHAIN_MAX;
    GRID_DEP_START();
    for (int k = 0; k < c.n; ++k) {
        const ChainOp& o = c.op[k];
        auto wait = [&] {
            if (o.dep < 0) return;
            if (threadIdx.x == 0) {
                const int want = c.op[o.dep].grid;
                while (ld_acquire(done + o.dep) < want) __nanosleep(32);
                if (o.last_wait && atomicAdd(passed + k, 1) == (int)gridDim.x - 1) done[o.dep] = 0, passed[k] = 0;
            }
            __syncthreads();
        };
        const int blk = (int)blockIdx.x - o.base;
        if (blk < 0 || blk >= o.grid) {  // no rows of this product: past its wait all the same (the counters)
            wait();
            continue;
        }
        run(o, blk, wait);
        if (o.counted) {
            __syncthreads();  // the block's rows and codes are written
            if (threadIdx.x == 0) count_acq_rel(done + k);  // released, as the epilogues count their groups
        }
    }
}
extern "C" __global__ void __launch_bounds__(512) gemv1_chainc(const Chain c) {
    run_chain(c, [](const ChainOp& o, int blk, auto wait) {
        if (o.type == 12)
            gemv1_mma<12, false>(o.W, o.x8, o.y, o.rows, o.cols, o.tpb, o.nss, o.n_ss, o.eps, o.ep, blk, wait);
        else
            gemv1_mma<14, false>(o.W, o.x8, o.y, o.rows, o.cols, o.tpb, o.nss, o.n_ss, o.eps, o.ep, blk, wait);
    });
}
extern "C" __global__ void __launch_bounds__(512) gemvn_chainc(const Chain c) {
    run_chain(c, [](const ChainOp& o, int blk, auto wait) {
        if (o.type == 12)
            gemvn_mma<12, 1, false, true>(o.W, o.x8, o.n_tok, o.y, o.y_stride, o.rows, o.cols, o.tpb, o.sets, o.nss,
                                          o.n_ss, o.eps, o.ep, blk, wait);
        else
            gemvn_mma<14, 1, false, true>(o.W, o.x8, o.n_tok, o.y, o.y_stride, o.rows, o.cols, o.tpb, o.sets, o.nss,
                                          o.n_ss, o.eps, o.ep, blk, wait);
    });
}

// The one-token products of the dp4a types, on an x8 buffer from q8_input or a producer's epilogue:
// gemv1q_q4_k, gemv1q_q6_k (gemv1m_* above is the tensor-core form, for compute capability 9.0).
#define INSTANTIATE_Q(T, NAME)                                                                                \
    extern "C" __global__ void gemv1q_##NAME(const u8* W, const signed char* x8, float* y, int rows, int cols,  \
                                             long long row_bytes, int rpw, int ks, const float* nss, int n_ss,  \
                                             float eps, int ep_mode, int ep_act, signed char* ep_x8, int* ep_cnt, \
                                             const float* ep_res, const float* ep_w, float* ep_xnew, float* ep_ss, \
                                             const float* ep_pw, const float* ep_ps, float ep_eps) {             \
        const Epilogue ep{ep_mode, ep_act, ep_x8, ep_cnt, ep_res, ep_w, ep_xnew, ep_ss, ep_pw, ep_ps, ep_eps};  \
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
