// Quantized weights in GGUF block layout: dequantization and matrix-vector products.
//
// Every supported type is read as sub-blocks of 32 consecutive values of a row (a whole block for the
// 32-value types, one eighth of a super-block for the K-quants), so one loop serves all of them:
// `deq32<TYPE>(row, sb, v)` writes the 32 floats of sub-block `sb` of `row`. Layouts follow ggml
// (ggml-common.h); the type numbers are GGML's.
// common.cuh (FULL, NEG_INF, warp_sum, block_reduce, gated) is prepended by the backend.
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

// Q4_K and Q6_K, one token (decode): the bulk of a Q4_K_M model, so kernels of their own in the manner of
// llama.cpp's MMVQ. Each block first quantizes x to int8 in shared memory, in sub-blocks of 32 with a
// float scale and the sub-block's sum (llama.cpp's q8_1), so the products are __dp4a on packed bytes, four
// values an instruction, instead of a float conversion and FMA per value. Eight lanes take one 256-value
// super-block, each one 16-byte (Q4_K) or three 8-byte (Q6_K) runs of its quant bytes, so a warp streams
// four blocks at a time; a warp's rows and their blocks are one flattened loop, so short rows (4B: 10
// blocks) keep all four octets busy.

// The dp4a kernels' input: x in sub-blocks of 32 with a float scale d each, as two int8 codes per value,
// x ~ d * (q + q2 / 254): q as llama.cpp's q8_1, q2 the rounding error of q requantized (|x - d q| <= d / 2),
// so a product is two dp4a chains and the activations carry ~15 bits instead of 8 (with q alone a tiny
// Q4_K_M model's decode NLL moved 0.04-0.06 nat from NumPy's). Computed once per product by q8_input and
// read by every GEMV block from global memory (through L1), so the GEMV starts loading weights at once.
// Layout of an x8 buffer for `cols` values: xq [cols] int8, xr [cols] int8 (q2), xd [cols / 32] float
// scales, xs [cols / 32] float sums of the values as coded.
// q8_input also takes over the operation that produced x: X_PLAIN x itself; X_GATED act(x[i]) *
// x[cols + i] (x = [gate | up]: the FFN's activation); X_NORM rms_norm(x + r) * w (r may be NULL), writing
// x + r to x_new when that is not NULL (the residual add and the next layer's input norm). One block of
// up to 1024 threads.
#define X_PLAIN 0
#define X_GATED 1
#define X_NORM 2
#define Q8_MAX 16  // values per thread: cols <= Q8_MAX * blockDim.x (the backend checks)
extern "C" __global__ void q8_input(const float* __restrict__ x, const float* __restrict__ r, const float* __restrict__ w,
                                    float* x_new, float eps, int mode, int act, int cols, signed char* x8) {
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
        // |v| as bits orders like |v| itself: one integer max reduction instead of five shuffles
        const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(v[k]))));
        const float d = amax / 127.f;
        const int q = amax > 0.f ? __float2int_rn(v[k] / d) : 0;
        const int q2 = amax > 0.f ? max(-127, min(127, __float2int_rn((v[k] - q * d) * 254.f / d))) : 0;
        xq[sb * 32 + lane] = (signed char)q;
        xr[sb * 32 + lane] = (signed char)q2;
        const int sum = __reduce_add_sync(0xffffffffu, q), sum2 = __reduce_add_sync(0xffffffffu, q2);
        if (lane == 0) {
            xd[sb] = d;
            xs[sb] = d * ((float)sum + (float)sum2 * (1.f / 254.f));
        }
    }
}

__device__ __forceinline__ unsigned ld_u16x2(const u8* p) {  // 4 bytes at a 2-byte aligned address
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (unsigned)h[0] | ((unsigned)h[1] << 16);
}

// A lane's share of one super-block is loaded (octet_load) for several blocks before any is used
// (octet_dot), so each lane has that many loads in flight: one block at a time, a 4B model's warps spent
// most of their time waiting on one load each.
template <int T> struct OctetRaw;
template <int T> __device__ __forceinline__ OctetRaw<T> octet_load(const u8* blk, int l);
template <int T> __device__ __forceinline__ float octet_dot(const OctetRaw<T>& r, int b, int l, const signed char* xq,
                                                            const signed char* xr, const float* xd, const float* xs);

__device__ __forceinline__ int byte_of(const uint4& v, int k) {  // byte k (< 16) of v, k known per lane
    const unsigned w = k < 4 ? v.x : k < 8 ? v.y : k < 12 ? v.z : v.w;
    return (w >> (8 * (k & 3))) & 0xFF;
}

// Q4_K: lane l takes 16 of the 32 quant bytes of chunk c = l / 2: low nibbles are 16 values of sub-block
// 2c, high nibbles the same positions of sub-block 2c + 1. The two lanes of a chunk split its min term.
template <> struct OctetRaw<12> {
    uint4 head;  // d, dmin (f16), 12 bytes of 6-bit scales and mins
    uint4 q;     // 16 quant bytes
};
template <> __device__ __forceinline__ OctetRaw<12> octet_load<12>(const u8* blk, int l) {
    // whole 144-byte blocks on a 256-byte aligned allocation: both loads are 16-byte aligned
    return {*reinterpret_cast<const uint4*>(blk), *reinterpret_cast<const uint4*>(blk + 16 + 32 * (l >> 1) + (l & 1) * 16)};
}
template <> __device__ __forceinline__ float octet_dot<12>(const OctetRaw<12>& r, int b, int l, const signed char* xq,
                                                           const signed char* xr, const float* xd, const float* xs) {
    const int c = l >> 1, pos = (l & 1) * 16;
    const uint4 q = r.q;
    const int xo = b * 256 + 64 * c + pos;
    const unsigned lo[4] = {q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F};
    const unsigned hi[4] = {(q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                            (q.w >> 4) & 0x0F0F0F0F};
    float sl, sh;  // sum(q x) over this lane's 16 low-nibble and 16 high-nibble values, in units of d
    {
        const int4 a = *reinterpret_cast<const int4*>(xq + xo), a2 = *reinterpret_cast<const int4*>(xr + xo);
        const int4 h = *reinterpret_cast<const int4*>(xq + xo + 32), h2 = *reinterpret_cast<const int4*>(xr + xo + 32);
        const int s1 = __dp4a((int)lo[3], a.w, __dp4a((int)lo[2], a.z, __dp4a((int)lo[1], a.y, __dp4a((int)lo[0], a.x, 0))));
        const int s2 = __dp4a((int)lo[3], a2.w, __dp4a((int)lo[2], a2.z, __dp4a((int)lo[1], a2.y, __dp4a((int)lo[0], a2.x, 0))));
        const int t1 = __dp4a((int)hi[3], h.w, __dp4a((int)hi[2], h.z, __dp4a((int)hi[1], h.y, __dp4a((int)hi[0], h.x, 0))));
        const int t2 = __dp4a((int)hi[3], h2.w, __dp4a((int)hi[2], h2.z, __dp4a((int)hi[1], h2.y, __dp4a((int)hi[0], h2.x, 0))));
        sl = (float)s1 + (float)s2 * (1.f / 254.f);
        sh = (float)t1 + (float)t2 * (1.f / 254.f);
    }
    // scale_min_k4 on the head's bytes 4..15 for sub-blocks 2c and 2c + 1
    float sc[2], mn[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int j = 2 * c + i;
        if (j < 4) {
            sc[i] = byte_of(r.head, 4 + j) & 63;
            mn[i] = byte_of(r.head, 8 + j) & 63;
        } else {
            sc[i] = (byte_of(r.head, 8 + j) & 0xF) | ((byte_of(r.head, j) >> 6) << 4);
            mn[i] = (byte_of(r.head, 8 + j) >> 4) | ((byte_of(r.head, 4 + j) >> 6) << 4);
        }
    }
    const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&r.head.x));
    const int sb = b * 8 + 2 * c;
    return dm.x * (sc[0] * xd[sb] * sl + sc[1] * xd[sb + 1] * sh) - dm.y * 0.5f * (mn[0] * xs[sb] + mn[1] * xs[sb + 1]);
}

// Q6_K: lane l takes half h = l / 4 (128 values) and 8 positions k of each of its four 32-value groups:
// 8 bytes of each ql run (low nibbles: groups 0 and 1, high: 2 and 3) and of its qh run (2 bits a group).
// Blocks are 210 bytes, so only 2-byte loads are aligned.
template <> struct OctetRaw<14> {
    unsigned a[2], c[2], t[2];  // ql bytes k.. and k + 32.. of the half, qh bytes k..
    unsigned s[2];              // the half's 8 scale bytes as 4 pairs: this lane's are bytes k / 16 of each pair
    unsigned short d;
};
template <> __device__ __forceinline__ OctetRaw<14> octet_load<14>(const u8* blk, int l) {
    const int h = l >> 2, k = (l & 3) * 8;
    const u8* ql = blk + 64 * h + k;
    const u8* qh = blk + 128 + 32 * h + k;
    OctetRaw<14> r;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
        r.a[w] = ld_u16x2(ql + 4 * w);
        r.c[w] = ld_u16x2(ql + 32 + 4 * w);
        r.t[w] = ld_u16x2(qh + 4 * w);
    }
    r.s[0] = ld_u16x2(blk + 192 + 8 * h);
    r.s[1] = ld_u16x2(blk + 192 + 8 * h + 4);
    r.d = *reinterpret_cast<const unsigned short*>(blk + 208);
    return r;
}
template <> __device__ __forceinline__ float octet_dot<14>(const OctetRaw<14>& r, int b, int l, const signed char* xq,
                                                           const signed char* xr, const float* xd, const float* xs) {
    const int h = l >> 2, k = (l & 3) * 8;
    const int xo = b * 256 + 128 * h + k;
    int s[4] = {0, 0, 0, 0}, s2[4] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < 2; ++w) {
        const unsigned a = r.a[w], c = r.c[w], t = r.t[w];
        const int g[4] = {__vsubss4((a & 0x0F0F0F0F) | ((t << 4) & 0x30303030), 0x20202020),
                          __vsubss4((c & 0x0F0F0F0F) | ((t << 2) & 0x30303030), 0x20202020),
                          __vsubss4(((a >> 4) & 0x0F0F0F0F) | (t & 0x30303030), 0x20202020),
                          __vsubss4(((c >> 4) & 0x0F0F0F0F) | ((t >> 2) & 0x30303030), 0x20202020)};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s[i] = __dp4a(g[i], *reinterpret_cast<const int*>(xq + xo + 32 * i + 4 * w), s[i]);
            s2[i] = __dp4a(g[i], *reinterpret_cast<const int*>(xr + xo + 32 * i + 4 * w), s2[i]);
        }
    }
    // scale of group g: byte 2g + k / 16 of the half's 8; pair g' = 2g + k/16 >> 1... bytes 0,2,4,6 (+1)
    const int sh = 8 * (k >> 4);
    const float sc0 = (float)(signed char)(r.s[0] >> sh), sc1 = (float)(signed char)(r.s[0] >> (16 + sh));
    const float sc2 = (float)(signed char)(r.s[1] >> sh), sc3 = (float)(signed char)(r.s[1] >> (16 + sh));
    const int sb = b * 8 + 4 * h;
    const float d = __half2float(__ushort_as_half(r.d));
    const float f[4] = {(float)s[0] + (float)s2[0] * (1.f / 254.f), (float)s[1] + (float)s2[1] * (1.f / 254.f),
                        (float)s[2] + (float)s2[2] * (1.f / 254.f), (float)s[3] + (float)s2[3] * (1.f / 254.f)};
    return d * (sc0 * xd[sb] * f[0] + sc1 * xd[sb + 1] * f[1] + sc2 * xd[sb + 2] * f[2] + sc3 * xd[sb + 3] * f[3]);
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
template <int T>
__device__ void gemv1_octets(const u8* W, const signed char* x8, float* y, int rows, int cols, long long row_bytes, int rpw) {
    const signed char* xq = x8;
    const signed char* xr = x8 + cols;
    const float* xd = reinterpret_cast<const float*>(x8 + 2 * cols);
    const float* xs = xd + cols / 32;
    const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw;
    const int lane = threadIdx.x & 31;
    if (r0 >= rows) return;
    const int n_rows = min(rpw, rows - r0);
    const int nb = cols >> 8, l = lane & 7;
    float acc[GEMV1_ROWS] = {0.f, 0.f, 0.f, 0.f};
    // unit u = r * nb + b of this warp's rows; octet o takes units o, o + 4, ...
    int r = 0, b = lane >> 3;
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
            b += 4;
            next_unit(r, b, nb, n_rows);
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
#pragma unroll
    for (int i = 0; i < GEMV1_ROWS; ++i) {
        float s = acc[i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (lane == 0 && i < n_rows) y[r0 + i] = s;
    }
}
// The one-token products of the dp4a types, on an x8 buffer from q8_input: gemv1q_q4_k, gemv1q_q6_k.
#define INSTANTIATE_Q(T, NAME)                                                                              \
    extern "C" __global__ void gemv1q_##NAME(const u8* W, const signed char* x8, float* y, int rows,       \
                                             int cols, long long row_bytes, int rpw) {                      \
        gemv1_octets<T>(W, x8, y, rows, cols, row_bytes, rpw);                                              \
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
