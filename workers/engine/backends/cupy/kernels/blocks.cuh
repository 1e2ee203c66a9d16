// Quantized weights in GGUF block layout, read by the product kernels (quant.cu): layouts,
// dequantization and dot products.
//
// Every supported type is read as sub-blocks of 32 consecutive values of a row (a whole block for the
// 32-value types, one eighth of a super-block for the K-quants), so one loop serves all of them:
// `deq32<TYPE>(row, sb, v)` writes the 32 floats of sub-block `sb` of `row`. Layouts follow ggml
// (ggml-common.h); the type numbers are GGML's.
// common.cuh (FULL, NEG_INF, warp_sum, block_reduce, gated) comes first in every module.
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

// The dp4a kernels' input (x8 buffers, q8_code) is described in common.cuh.

__device__ __forceinline__ unsigned ld_u16x2(const u8* p) {  // 4 weight bytes at a 2-byte aligned address
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (unsigned)__ldg(h) | ((unsigned)__ldg(h + 1) << 16);
}

// A lane's share of one super-block is loaded (octet_load) for several blocks before any is used
// (octet_dot), so each lane has that many loads in flight: one block at a time, a 4B model's warps spent
// most of their time waiting on one load each. Weights are read-only while a kernel runs: __ldg.
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
    return {__ldg(reinterpret_cast<const uint4*>(blk)), __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * (l >> 1) + (l & 1) * 16))};
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
    r.d = __ldg(reinterpret_cast<const unsigned short*>(blk + 208));
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
