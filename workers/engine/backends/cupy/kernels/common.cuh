// Helpers shared by every module (quant.cu; layer_ops.cu + attention.cu). The backend joins each module's files
// into one source (so CuPy's on-disk kernel cache, keyed by the source text, sees a change here), hence
// no #include of it or of the other .cuh files.
#include <cuda_fp16.h>

// The kernel family a module holds (the backend's -DPATHS_90): 1, compute capability 9.0's (bulk copies, clusters);
// 0, 8.x's (cp.async, attention merged through global memory), also on a newer GPU told to take 8.x's paths.
#ifndef PATHS_90
#define PATHS_90 0
#endif

// Programmatic dependent launch (sm_90 and later; pdl.py launches the kernels of a step being captured with
// it). grid_dep_wait() returns once the kernel before this one in the stream has finished and its writes are
// visible: every kernel of quant.cu, layer_ops.cu and attention.cu calls it before it reads what an earlier kernel wrote or
// writes anything (only constant weights may be loaded before). grid_dep_launch() lets the next kernel start
// (its blocks then run up to their own wait). Both are no-ops on a plain launch and before sm_90.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// the start of a kernel that reads nothing before its predecessor finishes
#define GRID_DEP_START() \
    do {                 \
        grid_dep_wait(); \
        grid_dep_launch(); \
    } while (0)

// A step's K/V slot is staged beside its first position (pos0p[1]): the kernels that read or write a slot's K/V
// take the whole pools and the bytes a slot spans in each (AT_SLOT), so a captured step replays for any slot.
template <class T>
__device__ __forceinline__ T* slot_at(T* pool, long long slot, long long bytes) {
    return pool == nullptr ? pool : (T*)((const char*)pool + slot * bytes);
}
#define AT_SLOT(pos0p, k, v, ks, vs, k_slot, v_slot, s_slot) \
    do {                                                    \
        const long long slot_ = (pos0p)[1];                 \
        k = slot_at(k, slot_, k_slot);                      \
        v = slot_at(v, slot_, v_slot);                      \
        ks = slot_at(ks, slot_, s_slot);                    \
        vs = slot_at(vs, slot_, s_slot);                    \
    } while (0)

// a shared-memory address as the 32-bit form PTX's shared-state instructions take
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

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

// act(g) * u; kind 0 = SiLU, 1 = GELU (tanh approximation).
__device__ __forceinline__ float gated(float g, float u, int kind) {
    const float a = kind == 0 ? g * (0.5f + 0.5f * tanhf(0.5f * g))
                              : 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return a * u;
}

// The index of the largest value (the first on ties, as numpy.argmax) and whether any value was not finite:
// argmax_rows (layer_ops.cu).
__device__ __forceinline__ bool argmax_better(float v, int i, float best, int idx) {
    return v > best || (v == best && i < idx);  // larger value wins, then the smaller index
}
// (best, idx, bad) over the block; thread 0 gets the result
__device__ void argmax_block(float& best, int& idx, int& bad) {
    __shared__ float sv[32];
    __shared__ int si[32], sbad[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL, best, o);
        const int oi = __shfl_xor_sync(FULL, idx, o);
        if (argmax_better(ov, oi, best, idx)) best = ov, idx = oi;
        bad |= __shfl_xor_sync(FULL, bad, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = best, si[warp] = idx, sbad[warp] = bad;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            if (argmax_better(sv[w], si[w], best, idx)) best = sv[w], idx = si[w];
            bad |= sbad[w];
        }
}

// The dp4a kernels' input: x in sub-blocks of 32 with a float scale d each, as two int8 codes per value,
// x ~ d * (q + q2 / 254): q as llama.cpp's q8_1, q2 the rounding error of q requantized (|x - d q| <= d / 2),
// so a product is two dp4a chains and the activations carry ~15 bits instead of 8 (with q alone a tiny
// Q4_K_M model's decode NLL moved 0.04-0.06 nat from NumPy's). q8_input (quant.cu) computes it once per
// product in global memory, the decode attention (attention.cu) for the o product as it writes its output.
// Layout of an x8 buffer for `cols` values (the one-token products'): xq [cols] int8, xr [cols] int8 (q2),
// xd [cols / 32] float scales, xs [cols / 32] float sums of the values as coded.
// The n-token layout (gemvn's input, cols a multiple of 128): tokens in fours, a quad x8_quad_bytes(cols) = 11 cols
// bytes (four one-token rows and their 16-value sums): codes [cols / 32][4 tokens][xq, xr][32 values], then xd
// [cols / 128][4 tokens][4 sub-blocks], xs likewise, then gs [cols / 128][4 tokens][4 sub-blocks][2] int2, the
// 16-value sums of xq and of xr. The eight lanes of an mma that load a sub-block's codes for four tokens read 256
// consecutive bytes (the one-token rows of four tokens, 7.7 KB apart for 2 560 values, made gemvn L1-bound).
struct X8At {  // where q8_code puts one token's sub-blocks
    signed char* q;  // value 32 sb + i: q[sb * q_step + i]; its second code r_off bytes on
    float* d;        // scale of sub-block sb: d[at(sb)]; its sum s_off floats on
    int2* gs;        // the n-token layout's 16-value sums of codes: gs[gs_at(sb) + half]
    int q_step, r_off, s_off;
    bool quad;
    __device__ __forceinline__ int at(int sb) const { return quad ? (sb >> 2) * 16 + (sb & 3) : sb; }
    __device__ __forceinline__ int gs_at(int sb) const { return quad ? (sb >> 2) * 32 + 2 * (sb & 3) : 2 * sb; }
};
__device__ __forceinline__ long long x8_quad_bytes(int cols) { return 11LL * cols; }
__device__ __forceinline__ X8At x8_row(signed char* x8, int cols) {  // a one-token buffer
    return X8At{x8, reinterpret_cast<float*>(x8 + 2 * cols), nullptr, 32, cols, cols / 32, false};
}
__device__ __forceinline__ X8At x8_quad(signed char* x8, long long k, int cols) {  // token k of an n-token buffer
    signed char* qd = x8 + (k >> 2) * x8_quad_bytes(cols);
    const int j = (int)(k & 3);
    return X8At{qd + 64 * j, reinterpret_cast<float*>(qd + 8 * cols) + 4 * j,
                reinterpret_cast<int2*>(qd + 9 * cols) + 8 * j, 256, 32, cols / 8, true};
}

// One sub-block of an x8 buffer, coded by the 32 lanes of a warp (lane i holds value i, v): one integer
// max reduction for the scale (|v| as bits orders like |v| itself), then both codes and the sub-block's sum
// (and, in the n-token layout, its 16-value sums of codes, Q6_K's offset in gemvn).
__device__ __forceinline__ void q8_code(float v, int sb, int lane, const X8At& x) {
    const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v))));
    const float d = amax / 127.f;
    // every rounding spelled out: the one-token and the n-token paths code a value to the same bytes
    const int q = amax > 0.f ? __float2int_rn(__fdiv_rn(v, d)) : 0;
    const int q2 = amax > 0.f ? max(-127, min(127, __float2int_rn(__fdiv_rn(__fmul_rn(__fsub_rn(v, __fmul_rn((float)q, d)), 254.f), d)))) : 0;
    x.q[sb * x.q_step + lane] = (signed char)q;
    x.q[sb * x.q_step + x.r_off + lane] = (signed char)q2;
    const int sum = __reduce_add_sync(0xffffffffu, q), sum2 = __reduce_add_sync(0xffffffffu, q2);
    if (lane == 0) {
        x.d[x.at(sb)] = d;
        x.d[x.at(sb) + x.s_off] = __fmul_rn(d, __fmaf_rn((float)sum2, 1.f / 254.f, (float)sum));
    }
    if (x.quad) {  // lanes 0 and 16: the sums of each half's codes
        int h = q, h2 = q2;
        for (int o = 8; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o), h2 += __shfl_xor_sync(0xffffffffu, h2, o);
        if ((lane & 15) == 0) x.gs[x.gs_at(sb) + (lane >> 4)] = make_int2(h, h2);
    }
}
