// Helpers shared by quant.cu and ops.cu. The backend prepends this file to each module's source (so
// CuPy's on-disk kernel cache, keyed by the source text, sees a change here), hence no #include of it.
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

// act(g) * u; kind 0 = SiLU, 1 = GELU (tanh approximation).
__device__ __forceinline__ float gated(float g, float u, int kind) {
    const float a = kind == 0 ? g * (0.5f + 0.5f * tanhf(0.5f * g))
                              : 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return a * u;
}
