// Rows of the KV pool and of attention heads, shared by layer_ops.cu and attention.cu: the
// Walsh-Hadamard rotation of INT8 K/V (docs/kv-cache.md), storing a row, and a head's q/k norm and RoPE.
// common.cuh comes first in the module.

// In-place normalized Walsh-Hadamard transform of buf[0, d) in blocks of `blk` (a power of two dividing
// d): the kv_rotation matrix of docs/kv-cache.md. Called by every thread of the block (WARP false) or of
// one warp (WARP true: that warp's row alone); both do the same arithmetic.
template <bool WARP>
__device__ void fwht_by(float* buf, int d, int blk) {
    const int t = WARP ? (threadIdx.x & 31) : threadIdx.x, n = WARP ? 32 : blockDim.x;
    for (int h = 1, s = 0; h < blk; h <<= 1, ++s) {
        if (WARP) __syncwarp(); else __syncthreads();
        for (int i = t; i < d / 2; i += n) {
            const int base = ((i >> s) << (s + 1)) + (i & (h - 1));  // (i / h) * 2 h + i % h: h is a power of two
            const float a = buf[base], b = buf[base + h];
            buf[base] = a + b;
            buf[base + h] = a - b;
        }
    }
    if (WARP) __syncwarp(); else __syncthreads();
    const float norm = rsqrtf((float)blk);
    for (int i = t; i < d; i += n) buf[i] *= norm;
    if (WARP) __syncwarp(); else __syncthreads();
}
__device__ __forceinline__ void fwht(float* buf, int d, int blk) { fwht_by<false>(buf, d, blk); }
__device__ __forceinline__ void fwht_warp(float* row, int d, int blk) { fwht_by<true>(row, d, blk); }

// The same transform of one row of 32 E values (E a power of two, blk = 32 E) held in a warp's registers, lane
// l holding values l E .. l E + E - 1: the butterflies of fwht_by in the same order, so the same result to the
// bit, without shared memory or barriers (the decode attention's rows).
template <int E>
__device__ __forceinline__ void fwht_regs(float (&v)[E]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 1; h < E; h <<= 1)
#pragma unroll
        for (int e = 0; e < E; ++e)
            if (!(e & h)) {
                const float a = v[e], b = v[e | h];
                v[e] = a + b;
                v[e | h] = a - b;
            }
#pragma unroll
    for (int m = 1; m < 32; m <<= 1)
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const float o = __shfl_xor_sync(0xffffffffu, v[e], m);
            v[e] = (lane & m) ? o - v[e] : v[e] + o;
        }
    const float norm = rsqrtf((float)(32 * E));
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] *= norm;
}

// store_row_by for such a row (INT8 when scales != NULL: rotated, absmax / 127, round half to even, clamp;
// else FP16): the same bytes.
template <int E>
__device__ __forceinline__ void store_row_regs(float (&v)[E], void* dst, float* scales, long long out_row) {
    const int lane = threadIdx.x & 31;
    if (scales == nullptr) {
        __half* o = reinterpret_cast<__half*>(dst) + out_row * 32 * E + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] = __float2half_rn(v[e]);
        return;
    }
    fwht_regs<E>(v);
    float m = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) m = fmaxf(m, fabsf(v[e]));
    const float scale = warp_max(m) / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    signed char* o = reinterpret_cast<signed char*>(dst) + out_row * 32 * E + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = (signed char)fminf(fmaxf(rintf(v[e] * inv), -127.f), 127.f);
    if (lane == 0) scales[out_row] = scale;
}

// Store one row buf[0, d) (in shared memory) at row `out_row` of a pool: INT8 when scales != NULL (rotate
// with fwht, scale = absmax / 127, round half to even, clamp; the scale to scales[out_row]), else FP16.
// Called by every thread of the block (WARP false; red: 32 floats of shared scratch) or of one warp (WARP
// true: that warp's row alone); both store the same bytes.
template <bool WARP>
__device__ void store_row_by(float* buf, int d, int blk, void* dst, float* scales, long long out_row, float* red) {
    const int t = WARP ? (threadIdx.x & 31) : threadIdx.x, n = WARP ? 32 : blockDim.x;
    if (scales == nullptr) {
        if (WARP) __syncwarp(); else __syncthreads();
        __half* o = reinterpret_cast<__half*>(dst) + out_row * d;
        for (int i = t; i < d; i += n) o[i] = __float2half_rn(buf[i]);
        return;
    }
    fwht_by<WARP>(buf, d, blk);
    float m = 0.f;
    for (int i = t; i < d; i += n) m = fmaxf(m, fabsf(buf[i]));
    const float scale = (WARP ? warp_max(m) : block_reduce<true>(m, red)) / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    signed char* o = reinterpret_cast<signed char*>(dst) + out_row * d;
    for (int i = t; i < d; i += n) o[i] = (signed char)fminf(fmaxf(rintf(buf[i] * inv), -127.f), 127.f);
    if (t == 0) scales[out_row] = scale;
}
__device__ __forceinline__ void store_kv_row(float* buf, int d, int blk, void* dst, float* scales, long long out_row, float* red) {
    store_row_by<false>(buf, d, blk, dst, scales, out_row, red);
}

// A q or k head in buf[0, hd): RMSNorm by its weight row w (when not NULL: x * rsqrt(mean(x^2) + eps) * w),
// then RoPE at position pos (tables [n_pos, rope_dim / 2]; NEOX rotates halves, NORM adjacent pairs). Called
// by every thread of the block (WARP false; red: 32 floats of shared scratch) or of one warp (WARP true:
// that warp's head alone; red unused); ends synchronized.
template <bool WARP>
__device__ void norm_rope(float* buf, int hd, const float* w, float eps, const float* cos_t, const float* sin_t,
                          int rope_dim, int neox, int pos, float* red) {
    const int t = WARP ? (threadIdx.x & 31) : threadIdx.x, n = WARP ? 32 : blockDim.x;
    if (WARP) __syncwarp(); else __syncthreads();  // buf is complete
    if (w != nullptr) {
        float ss = 0.f;
        for (int i = t; i < hd; i += n) ss += buf[i] * buf[i];
        const float inv = rsqrtf((WARP ? warp_sum(ss) : block_reduce<false>(ss, red)) / hd + eps);
        if (!WARP) __syncthreads();
        for (int i = t; i < hd; i += n) buf[i] = buf[i] * inv * w[i];
    }
    if (WARP) __syncwarp(); else __syncthreads();
    const int half = rope_dim / 2;
    for (int p = t; p < half; p += n) {
        const float c = cos_t[(long long)pos * half + p], s = sin_t[(long long)pos * half + p];
        const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
        const float x0 = buf[a], x1 = buf[b];
        buf[a] = x0 * c - x1 * s;
        buf[b] = x0 * s + x1 * c;
    }
    if (WARP) __syncwarp(); else __syncthreads();
}
