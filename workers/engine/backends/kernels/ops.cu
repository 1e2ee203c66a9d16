// Fused per-layer operations of the CuPy backend: RMSNorm, RoPE, gated activation, KV write (INT8 with
// the Hadamard rotation of docs/kv-cache.md, or FP16), and attention over the KV pool. Each replaces a
// chain of CuPy array operations with one launch; numerics follow the NumPy backend.
#include <cuda_fp16.h>

#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no math.h INFINITY

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Sum or max over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < n_warps; ++i) r = IS_MAX ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

// In-place normalized Walsh-Hadamard transform of buf[0, d) in blocks of `blk` (a power of two dividing
// d): the kv_rotation matrix of docs/kv-cache.md. Called by every thread of the block.
__device__ void fwht(float* buf, int d, int blk) {
    for (int h = 1; h < blk; h <<= 1) {
        __syncthreads();
        for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
            const int base = (i / h) * 2 * h + (i % h);
            const float a = buf[base], b = buf[base + h];
            buf[base] = a + b;
            buf[base + h] = a - b;
        }
    }
    __syncthreads();
    const float norm = rsqrtf((float)blk);
    for (int i = threadIdx.x; i < d; i += blockDim.x) buf[i] *= norm;
    __syncthreads();
}

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w[r % w_rows, :]; one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int d, int w_rows, float eps) {
    __shared__ float red[32];
    const long long r = blockIdx.x;
    const float* xr = x + r * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_reduce<false>(ss, red) / d + eps);
    const float* wr = w + (r % w_rows) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[r * d + i] = xr[i] * inv * wr[i];
}

// The position of a batch's first token is read from device memory (pos0p), so a captured CUDA graph
// replays a decode step at any position.

// Rotary embedding in place on x [n_tok, n_heads, hd] at positions pos0 + t, tables [n_pos, rope_dim / 2].
extern "C" __global__ void rope(float* x, const float* cos_t, const float* sin_t, int n_tok, int n_heads, int hd,
                                int rope_dim, const int* pos0p, int neox) {
    const int half = rope_dim / 2, pos0 = *pos0p;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * n_heads * half) return;
    const int p = (int)(i % half);
    const long long row = i / half;  // token * n_heads + head
    const int t = (int)(row / n_heads);
    const float c = cos_t[(long long)(pos0 + t) * half + p], s = sin_t[(long long)(pos0 + t) * half + p];
    float* xr = x + row * hd;
    const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    const float x0 = xr[a], x1 = xr[b];
    xr[a] = x0 * c - x1 * s;
    xr[b] = x0 * s + x1 * c;
}

// out[t, j] = act(gu[t, j]) * gu[t, ffn + j]; kind 0 = SiLU, 1 = GELU (tanh approximation).
extern "C" __global__ void gated_act(const float* gu, float* out, int n_tok, int ffn, int kind) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * ffn) return;
    const long long t = i / ffn, j = i % ffn;
    const float g = gu[t * 2 * ffn + j], u = gu[t * 2 * ffn + ffn + j];
    float a;
    if (kind == 0) {
        a = g * (0.5f + 0.5f * tanhf(0.5f * g));
    } else {
        a = 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    }
    out[i] = a * u;
}

// Store rows src [n_tok, n_heads, hd] at positions pos0 + t of one slot: dst [n_ctx, n_heads, hd].
// INT8 (scales != NULL): rotate (fwht), scale = absmax / 127, round half to even, clamp; else FP16.
// One block per (token, head), blockDim.x >= 32; dynamic shared memory hd floats.
extern "C" __global__ void kv_write(const float* src, void* dst, float* scales, int n_heads, int hd, int blk,
                                    const int* pos0p) {
    extern __shared__ float buf[];
    const int pos0 = *pos0p;
    __shared__ float red[32];
    const long long row = blockIdx.x;  // t * n_heads + h
    const long long out_row = (long long)pos0 * n_heads + row;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = src[row * hd + i];
    if (scales == nullptr) {
        __half* d = reinterpret_cast<__half*>(dst) + out_row * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) d[i] = __float2half_rn(buf[i]);
        return;
    }
    fwht(buf, hd, blk);
    float m = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) m = fmaxf(m, fabsf(buf[i]));
    const float scale = block_reduce<true>(m, red) / 127.f;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    signed char* d = reinterpret_cast<signed char*>(dst) + out_row * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) d[i] = (signed char)fminf(fmaxf(rintf(buf[i] * inv), -127.f), 127.f);
    if (threadIdx.x == 0) scales[out_row] = scale;
}

// Causal attention of q [n_tok, n_heads, hd] (positions pos0 + t) over the slot's keys [lo, pos0 + t],
// lo = pos0 + t - window + 1 when window > 0. K/V pools [n_ctx, n_kv, hd(v)], INT8 with scales (rotated:
// q is rotated alike and the output rotated back) or FP16. Grid (n_tok * n_heads, n_splits): each block
// takes one contiguous share of its query's keys (split-K, "flash decoding"), its 8 warps every 8th key
// of that share with an online softmax, then the warps merge. With one split the block writes the output
// [n_tok, n_heads, hdv]; with more it writes its partial max, sum and (unnormalized) accumulator to
// part_m / part_l [rows, n_splits] and part_acc [rows, n_splits, hdv] for attention_merge.
#define ATT_WARPS 8
#define MAX_HD 512
extern "C" __global__ void attention(const float* q, const void* k_pool, const void* v_pool, const float* k_scale,
                                     const float* v_scale, float* out, float* part_m, float* part_l, float* part_acc,
                                     int n_heads, int n_kv, int hd, int hdv, int blk, int blk_v, const int* pos0p, int window,
                                     float scale, float softcap) {
    __shared__ float qs[MAX_HD];
    __shared__ float accs[ATT_WARPS][MAX_HD];
    __shared__ float ms[ATT_WARPS], ls[ATT_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x;  // t * n_heads + h
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int t = row / n_heads, h = row % n_heads, kvh = h / (n_heads / n_kv);
    const int qpos = *pos0p + t;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int share = (qpos - lo + n_splits) / n_splits;  // ceil((qpos - lo + 1) / n_splits)
    const int j0 = lo + split * share, j1 = min(qpos, j0 + share - 1);
    const bool int8 = k_scale != nullptr;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(long long)row * hd + i];
    if (int8) fwht(qs, hd, blk);
    __syncthreads();
    const int per_lane = (hdv + 31) / 32;
    float acc[MAX_HD / 32];
    for (int i = 0; i < per_lane; ++i) acc[i] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int j = j0 + warp; j <= j1; j += ATT_WARPS) {
        const long long krow = ((long long)j * n_kv + kvh);
        float s = 0.f;
        if (int8) {
            const signed char* kr = reinterpret_cast<const signed char*>(k_pool) + krow * hd;
            for (int i = lane; i < hd; i += 32) s += qs[i] * (float)kr[i];
            s = warp_sum(s) * scale * k_scale[krow];
        } else {
            const __half* kr = reinterpret_cast<const __half*>(k_pool) + krow * hd;
            for (int i = lane; i < hd; i += 32) s += qs[i] * __half2float(kr[i]);
            s = warp_sum(s) * scale;
        }
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float corr = __expf(m - m_new), p = __expf(s - m_new);
        l = l * corr + p;
        m = m_new;
        const float pv = int8 ? p * v_scale[krow] : p;
        if (int8) {
            const signed char* vr = reinterpret_cast<const signed char*>(v_pool) + krow * hdv;
            for (int i = 0; i < per_lane; ++i) {
                const int c = lane + 32 * i;
                acc[i] = acc[i] * corr + (c < hdv ? pv * (float)vr[c] : 0.f);
            }
        } else {
            const __half* vr = reinterpret_cast<const __half*>(v_pool) + krow * hdv;
            for (int i = 0; i < per_lane; ++i) {
                const int c = lane + 32 * i;
                acc[i] = acc[i] * corr + (c < hdv ? pv * __half2float(vr[c]) : 0.f);
            }
        }
    }
    if (lane == 0) {
        ms[warp] = m;
        ls[warp] = l;
    }
    __syncthreads();
    float m_all = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) m_all = fmaxf(m_all, ms[w]);
    const float f = (m == NEG_INF) ? 0.f : __expf(m - m_all);
    for (int i = 0; i < per_lane; ++i) {
        const int c = lane + 32 * i;
        if (c < hdv) accs[warp][c] = acc[i] * f;
    }
    __syncthreads();
    float l_all = 0.f;
    for (int w = 0; w < ATT_WARPS; ++w) l_all += (ms[w] == NEG_INF) ? 0.f : ls[w] * __expf(ms[w] - m_all);
    if (n_splits > 1) {
        const long long p = (long long)row * n_splits + split;
        for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
            float s = 0.f;
            for (int w = 0; w < ATT_WARPS; ++w) s += accs[w][c];
            part_acc[p * hdv + c] = s;
        }
        if (threadIdx.x == 0) {
            part_m[p] = m_all;
            part_l[p] = l_all;
        }
        return;
    }
    // reuse qs as the merged output row
    for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < ATT_WARPS; ++w) s += accs[w][c];
        qs[c] = s / l_all;
    }
    if (int8) fwht(qs, hdv, blk_v);
    __syncthreads();
    for (int c = threadIdx.x; c < hdv; c += blockDim.x) out[(long long)row * hdv + c] = qs[c];
}

// Merges the n_splits partial results of each (token, head) row: one block per row, dynamic shared
// memory hdv floats.
extern "C" __global__ void attention_merge(const float* part_m, const float* part_l, const float* part_acc,
                                           float* out, int n_splits, int hdv, int blk, int rotated) {
    extern __shared__ float row_out[];
    const long long row = blockIdx.x;
    float m_all = NEG_INF;
    for (int s = 0; s < n_splits; ++s) m_all = fmaxf(m_all, part_m[row * n_splits + s]);
    float l_all = 0.f;
    for (int s = 0; s < n_splits; ++s) {
        const float ms = part_m[row * n_splits + s];
        if (ms != NEG_INF) l_all += part_l[row * n_splits + s] * __expf(ms - m_all);
    }
    for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < n_splits; ++s) {
            const float ms = part_m[row * n_splits + s];
            if (ms != NEG_INF) acc += part_acc[(row * n_splits + s) * hdv + c] * __expf(ms - m_all);
        }
        row_out[c] = acc / l_all;
    }
    if (rotated) fwht(row_out, hdv, blk);
    __syncthreads();
    for (int c = threadIdx.x; c < hdv; c += blockDim.x) out[row * hdv + c] = row_out[c];
}
