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
