// Quantized weights in GGUF block layout: dequantization and matrix-vector products.
//
// Every supported type is read as sub-blocks of 32 consecutive values of a row (a whole block for the
// 32-value types, one eighth of a super-block for the K-quants), so one loop serves all of them:
// `deq32<TYPE>(row, sb, v)` writes the 32 floats of sub-block `sb` of `row`. Layouts follow ggml
// (ggml-common.h); the type numbers are GGML's.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned char u8;

__device__ __forceinline__ float f16(const u8* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

template <int T> struct Blk;  // bytes per block, values per block
template <> struct Blk<0>  { static const int bytes = 4,   vals = 1;   };  // F32
template <> struct Blk<1>  { static const int bytes = 2,   vals = 1;   };  // F16
template <> struct Blk<30> { static const int bytes = 2,   vals = 1;   };  // BF16
template <> struct Blk<2>  { static const int bytes = 18,  vals = 32;  };  // Q4_0
template <> struct Blk<3>  { static const int bytes = 20,  vals = 32;  };  // Q4_1
template <> struct Blk<6>  { static const int bytes = 22,  vals = 32;  };  // Q5_0
template <> struct Blk<7>  { static const int bytes = 24,  vals = 32;  };  // Q5_1
template <> struct Blk<8>  { static const int bytes = 34,  vals = 32;  };  // Q8_0
template <> struct Blk<12> { static const int bytes = 144, vals = 256; };  // Q4_K
template <> struct Blk<13> { static const int bytes = 176, vals = 256; };  // Q5_K
template <> struct Blk<14> { static const int bytes = 210, vals = 256; };  // Q6_K

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float& sc, float& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int T> __device__ __forceinline__ void deq32(const u8* row, int sb, float* v);

template <> __device__ __forceinline__ void deq32<0>(const u8* row, int sb, float* v) {
    const float* p = reinterpret_cast<const float*>(row) + sb * 32;
    for (int i = 0; i < 32; ++i) v[i] = p[i];
}
template <> __device__ __forceinline__ void deq32<1>(const u8* row, int sb, float* v) {
    const __half* p = reinterpret_cast<const __half*>(row) + sb * 32;
    for (int i = 0; i < 32; ++i) v[i] = __half2float(p[i]);
}
template <> __device__ __forceinline__ void deq32<30>(const u8* row, int sb, float* v) {
    const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(row) + sb * 32;
    for (int i = 0; i < 32; ++i) v[i] = __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ void deq32<8>(const u8* row, int sb, float* v) {
    const u8* b = row + sb * 34;
    const float d = f16(b);
    for (int i = 0; i < 32; ++i) v[i] = d * (float)(signed char)b[2 + i];
}
template <> __device__ __forceinline__ void deq32<2>(const u8* row, int sb, float* v) {
    const u8* b = row + sb * 18;
    const float d = f16(b);
    for (int j = 0; j < 16; ++j) {
        v[j] = ((b[2 + j] & 0xF) - 8) * d;
        v[j + 16] = ((b[2 + j] >> 4) - 8) * d;
    }
}
template <> __device__ __forceinline__ void deq32<3>(const u8* row, int sb, float* v) {
    const u8* b = row + sb * 20;
    const float d = f16(b), m = f16(b + 2);
    for (int j = 0; j < 16; ++j) {
        v[j] = (b[4 + j] & 0xF) * d + m;
        v[j + 16] = (b[4 + j] >> 4) * d + m;
    }
}
template <> __device__ __forceinline__ void deq32<6>(const u8* row, int sb, float* v) {
    const u8* b = row + sb * 22;
    const float d = f16(b);
    const unsigned qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((unsigned)b[5] << 24);
    for (int j = 0; j < 16; ++j) {
        const int x0 = ((b[6 + j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = ((b[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        v[j] = x0 * d;
        v[j + 16] = x1 * d;
    }
}
template <> __device__ __forceinline__ void deq32<7>(const u8* row, int sb, float* v) {
    const u8* b = row + sb * 24;
    const float d = f16(b), m = f16(b + 2);
    const unsigned qh = b[4] | (b[5] << 8) | (b[6] << 16) | ((unsigned)b[7] << 24);
    for (int j = 0; j < 16; ++j) {
        const int x0 = (b[8 + j] & 0xF) | (((qh >> j) << 4) & 0x10);
        const int x1 = (b[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10);
        v[j] = x0 * d + m;
        v[j + 16] = x1 * d + m;
    }
}
template <> __device__ __forceinline__ void deq32<12>(const u8* row, int sb, float* v) {
    const u8* b = row + (sb >> 3) * 144;
    const int s = sb & 7;
    float sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float d = f16(b) * sc, mn = f16(b + 2) * m;
    const u8* q = b + 16 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
    for (int l = 0; l < 32; ++l) v[l] = d * ((q[l] >> shift) & 0xF) - mn;
}
template <> __device__ __forceinline__ void deq32<13>(const u8* row, int sb, float* v) {
    const u8* b = row + (sb >> 3) * 176;
    const int s = sb & 7;
    float sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float d = f16(b) * sc, mn = f16(b + 2) * m;
    const u8* qh = b + 16;
    const u8* ql = b + 48 + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
    for (int l = 0; l < 32; ++l) v[l] = d * (((ql[l] >> shift) & 0xF) + (((qh[l] >> s) & 1) << 4)) - mn;
}
template <> __device__ __forceinline__ void deq32<14>(const u8* row, int sb, float* v) {
    const u8* b = row + (sb >> 3) * 210;
    const int s = sb & 7, h = s >> 2, t = s & 3;
    const u8* ql = b + 64 * h + (t & 1) * 32;
    const u8* qh = b + 128 + 32 * h;
    const signed char* sc = reinterpret_cast<const signed char*>(b + 192) + 8 * h + 2 * t;
    const float d = f16(b + 208);
    const int nshift = (t >> 1) * 4, hshift = 2 * t;
    for (int l = 0; l < 32; ++l) {
        const int q = (((ql[l] >> nshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        v[l] = d * sc[l >> 4] * q;
    }
}

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

// dot32<T>(row, sb, xv): the dot product of sub-block sb of a row with 32 activations in registers.
// Generic: dequantize, then multiply. Q4_K (the bulk of Q4_K_M files) has its own: two 16-byte loads for
// the 32 quant bytes and d * sc * sum(q x) - dmin * m * sum(x), two multiplies per value fewer.
template <int T> __device__ __forceinline__ float dot32(const u8* row, int sb, const float* xv) {
    float v[32];
    deq32<T>(row, sb, v);
    float s = 0.f;
    for (int i = 0; i < 32; ++i) s += v[i] * xv[i];
    return s;
}
template <> __device__ __forceinline__ float dot32<12>(const u8* row, int sb, const float* xv) {
    const u8* b = row + (sb >> 3) * 144;
    const int s = sb & 7;
    float sc, m;
    scale_min_k4(s, b + 4, sc, m);
    // 144-byte blocks in rows of whole blocks on a 256-byte aligned allocation: qs is 16-byte aligned
    const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (s >> 1));
    const uint4 a = q[0], c = q[1];
    const unsigned w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    const int shift = (s & 1) * 4;
    float qx = 0.f, sx = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float xi = xv[4 * k + j];
            qx += (float)((w[k] >> (8 * j + shift)) & 0xF) * xi;
            sx += xi;
        }
    }
    return f16(b) * sc * qx - f16(b + 2) * m * sx;
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

// Q4_K and Q6_K, one token: the bulk of a Q4_K_M model (Q6_K: output layers and the more-bits layers),
// so their own layout of the work. A half-warp takes a whole 256-value super-block and each of its 16 lanes
// a contiguous run of its quant bytes, so a half-warp reads its block in one coalesced pass and the two
// halves take neighbouring blocks. The generic kernel gave each lane one 32-value sub-block: Q4_K lanes 2i
// and 2i+1 loaded the same 32 bytes, and neighbouring lanes read bytes a block apart.
// half_warp_dot<T>(blk, xb, l): lane l's share of block blk against its 256 activations xb.
template <int T> __device__ __forceinline__ float half_warp_dot(const u8* blk, const float* xb, int l);

// Q4_K: 8 contiguous quant bytes = 8 values of sub-block 2c (low nibbles) and 8 of sub-block 2c + 1 (high).
template <> __device__ __forceinline__ float half_warp_dot<12>(const u8* blk, const float* xb, int l) {
    const int chunk = l >> 2;     // which 64 values of the block: sub-blocks 2 * chunk and 2 * chunk + 1
    const int pos = (l & 3) * 8;  // first of this lane's 8 positions within those sub-blocks
    // rows are whole 144-byte blocks on a 256-byte aligned allocation: this 8-byte load is aligned
    const uint2 q = *reinterpret_cast<const uint2*>(blk + 16 + 32 * chunk + pos);
    const float* xl = xb + 64 * chunk + pos;  // low nibbles' activations
    const float* xh = xl + 32;                // high nibbles'
    const float4 l0 = *reinterpret_cast<const float4*>(xl), l1 = *reinterpret_cast<const float4*>(xl + 4);
    const float4 h0 = *reinterpret_cast<const float4*>(xh), h1 = *reinterpret_cast<const float4*>(xh + 4);
    const float xlo[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const float xhi[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    float qlo = 0.f, qhi = 0.f, slo = 0.f, shi = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned byte = ((j < 4 ? q.x : q.y) >> (8 * (j & 3))) & 0xFF;
        qlo += (float)(byte & 0xF) * xlo[j];
        qhi += (float)(byte >> 4) * xhi[j];
        slo += xlo[j];
        shi += xhi[j];
    }
    float sc0, m0, sc1, m1;
    scale_min_k4(2 * chunk, blk + 4, sc0, m0);
    scale_min_k4(2 * chunk + 1, blk + 4, sc1, m1);
    return f16(blk) * (sc0 * qlo + sc1 * qhi) - f16(blk + 2) * (m0 * slo + m1 * shi);
}

// Q6_K: 4 consecutive bytes of each of the lane's half's two ql runs and of its qh run = 16 values in four
// 32-apart groups. Blocks are 210 bytes, so only byte loads are safely aligned.
template <> __device__ __forceinline__ float half_warp_dot<14>(const u8* blk, const float* xb, int l) {
    const int h = l >> 3;       // which 128 values of the block
    const int k = (l & 7) * 4;  // first of this lane's 4 positions in that half
    const u8* ql = blk + 64 * h + k;
    const u8* qh = blk + 128 + 32 * h + k;
    const float* x = xb + 128 * h + k;
    float s[4] = {0.f, 0.f, 0.f, 0.f};  // the four groups: values k + j, + 32, + 64, + 96
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int lo = ql[j], hi = ql[j + 32], top = qh[j];
        s[0] += (float)(((lo & 0xF) | ((top & 3) << 4)) - 32) * x[j];
        s[1] += (float)(((hi & 0xF) | (((top >> 2) & 3) << 4)) - 32) * x[j + 32];
        s[2] += (float)(((lo >> 4) | (((top >> 4) & 3) << 4)) - 32) * x[j + 64];
        s[3] += (float)(((hi >> 4) | (((top >> 6) & 3) << 4)) - 32) * x[j + 96];
    }
    const signed char* sc = reinterpret_cast<const signed char*>(blk + 192) + 8 * h + (k >> 4);
    return f16(blk + 208) * (sc[0] * s[0] + sc[2] * s[1] + sc[4] * s[2] + sc[6] * s[3]);
}

// The one-token product for those types; same grid, rows per warp and shared x as the generic gemv1.
template <int T>
__device__ void gemv1_half_warps(const u8* W, const float* x, float* y, int rows, int cols, long long row_bytes, int rpw) {
    extern __shared__ float xs[];
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw;
    const int lane = threadIdx.x & 31;
    if (r0 >= rows) return;
    const int n_rows = min(rpw, rows - r0);
    const int half = lane >> 4, l = lane & 15;
    const int n_blocks = cols >> 8;
    for (int r = 0; r < n_rows; ++r) {
        const u8* row = W + (long long)(r0 + r) * row_bytes;
        float acc = 0.f;
        for (int b = half; b < n_blocks; b += 2) acc += half_warp_dot<T>(row + b * Blk<T>::bytes, xs + (b << 8), l);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
        if (lane == 0) y[r0 + r] = acc;
    }
}
template <>
__device__ void gemv1<12>(const u8* W, const float* x, float* y, int rows, int cols, long long row_bytes, int rpw) {
    gemv1_half_warps<12>(W, x, y, rows, cols, row_bytes, rpw);
}
template <>
__device__ void gemv1<14>(const u8* W, const float* x, float* y, int rows, int cols, long long row_bytes, int rpw) {
    gemv1_half_warps<14>(W, x, y, rows, cols, row_bytes, rpw);
}

// out[r, c] for the rows listed in `ids` (embedding lookup) or every row (ids == NULL): one thread per
// sub-block, times `scale`.
template <int T>
__device__ void dequant_rows(const u8* W, const long long* ids, float* out, int n_rows, int cols, long long row_bytes, float scale) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = cols / 32;
    if (i >= (long long)n_rows * per_row) return;
    const int r = (int)(i / per_row), sb = (int)(i % per_row);
    const long long src = ids ? ids[r] : r;
    float v[32];
    deq32<T>(W + src * row_bytes, sb, v);
    float* o = out + (long long)r * cols + sb * 32;
    for (int k = 0; k < 32; ++k) o[k] = v[k] * scale;
}

#define INSTANTIATE(T, NAME)                                                                              \
    extern "C" __global__ void gemv_##NAME(const u8* W, const float* x, float* y, int rows, int cols,     \
                                           long long row_bytes, int n_tok, int ldy) {                     \
        gemv<T>(W, x, y, rows, cols, row_bytes, n_tok, ldy);                                              \
    }                                                                                                     \
    extern "C" __global__ void gemv1_##NAME(const u8* W, const float* x, float* y, int rows, int cols,    \
                                            long long row_bytes, int rpw) {                               \
        gemv1<T>(W, x, y, rows, cols, row_bytes, rpw);                                                    \
    }                                                                                                     \
    extern "C" __global__ void dequant_##NAME(const u8* W, const long long* ids, float* out, int n_rows,  \
                                              int cols, long long row_bytes, float scale) {               \
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
