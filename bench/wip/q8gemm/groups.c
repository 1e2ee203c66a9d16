// Prototype (bench/NOTES.md, CPU note 2026-12-06f), not product code: products of 4-bit weights (w = s q + o,
// q 0 .. 15, blocks of BS = 16 or 32) with q8-coded inputs, one arithmetic for every number of inputs.
//
// The group layout. A row's blocks go in groups of 16 (a full group: lane L of every vector holds block L's
// values), then a tail of t < 16 blocks as one group of T = the power of two >= t blocks (16 / T lanes a block).
// A group of T blocks has T BS / 64 vectors of 64 values (an even number: a tail has at least 128 values);
// lane L (values 4L .. 4L + 3 of a vector) belongs to block L / (16 / T), and vector j's lane holds the block's
// values 4 (j (16 / T) + L % (16 / T)) + 0 .. 3. Vectors 2i and 2i + 1 of 4-bit values are 64 bytes: byte b holds
// vector 2i's value b in its low nibble and vector 2i + 1's in its high one (one load, an and, a shift and an and).
// Inputs are coded as llama.cpp's q8_0 (blocks of 32, d = max|x| / 127) into the same layout.
//
// The arithmetic of an (input, row), the same for any tile: per group in order, int32 lane sums (exact), then
// acc[L] = fmaf((float)sum[L], dx[L] * s[L], acc[L]), then acc[L] = fmaf(o[L], xs[L], acc[L]) (the block's offset
// and the coded input's sum over the block in its first lane, zeros in the others); out = red16(acc).
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define HAVE_512 1
#else
#define HAVE_512 0
#endif

#define CB 8192  // the coded inputs' rows: bytes and lanes apart (gq_products)
#define LB 512

typedef struct {
    int64_t K, BS, nb, full, tail_T, groups, vecs;  // vecs: a row's vectors of 64 values
} Shape;

static Shape shape_of(int64_t K, int64_t BS) {
    Shape s = {K, BS, K / BS, 0, 0, 0, 0};
    s.full = s.nb / 16;
    const int64_t t = s.nb % 16;
    s.tail_T = 0;
    if (t) {
        s.tail_T = 1;
        while (s.tail_T < t) s.tail_T *= 2;
        if (s.tail_T * BS < 128) s.tail_T = 128 / BS;  // at least a pair of vectors
    }
    s.groups = s.full + (t ? 1 : 0);
    s.vecs = (s.full * 16 * BS + s.tail_T * BS) / 64;
    return s;
}
int64_t gq_row_bytes(int64_t K, int64_t BS) { return shape_of(K, BS).vecs * 32; }
int64_t gq_row_lanes(int64_t K, int64_t BS) { return shape_of(K, BS).groups * 16; }  // scales a row, by lane

// group g's blocks, first block and vectors
static inline void group_of(const Shape *s, int64_t g, int64_t *T, int64_t *b0, int64_t *v0) {
    *T = g < s->full ? 16 : s->tail_T;
    *b0 = g * 16;
    *v0 = g * 16 * s->BS / 64;
}
// the value index within the row at vector j (of its group), lane L, element e
static inline int64_t value_at(const Shape *s, int64_t T, int64_t b0, int64_t j, int L, int e) {
    const int lpb = 16 / (int)T;
    const int64_t block = b0 + L / lpb;
    return block * s->BS + 4 * (j * lpb + L % lpb) + e;
}

// q: rows x K values 0 .. 15 (a byte each); scale, offset: rows x nb. Out: packed rows (gq_row_bytes), lane
// scales (rows x gq_row_lanes: the block's scale per lane, 0 where no block), offsets as given (rows x nb).
void gq_pack(const uint8_t *q, const float *scale, const float *offset, int64_t rows, int64_t K, int64_t BS,
             uint8_t *packed, float *lane_scale, float *lane_offset) {
    const Shape s = shape_of(K, BS);
    const int64_t rb = s.vecs * 32, nl = s.groups * 16;
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *pr = packed + r * rb;
        float *ls = lane_scale + r * nl, *lo = lane_offset + r * nl;
        memset(pr, 0, rb);
        for (int64_t g = 0; g < s.groups; g++) {
            int64_t T, b0, v0;
            group_of(&s, g, &T, &b0, &v0);
            const int lpb = 16 / (int)T;
            for (int L = 0; L < 16; L++) {
                const int64_t b = b0 + L / lpb;
                ls[g * 16 + L] = b < s.nb ? scale[r * s.nb + b] : 0.0f;
                lo[g * 16 + L] = b < s.nb && L % lpb == 0 ? offset[r * s.nb + b] : 0.0f;
            }
            for (int64_t j = 0; j < T * BS / 64; j++)
                for (int L = 0; L < 16; L++)
                    for (int e = 0; e < 4; e++) {
                        const int64_t idx = value_at(&s, T, b0, j, L, e), i = 4 * L + e;
                        const uint8_t v = idx < K && idx / BS < s.nb && (b0 + L / lpb) < s.nb ? q[r * K + idx] : 0;
                        uint8_t *byte = pr + (v0 + j) / 2 * 64 + i;
                        *byte |= (v0 + j) % 2 == 0 ? v : (uint8_t)(v << 4);
                    }
        }
    }
}

// an input's q8_0 codes, linear (c: K values, d: a scale a block of 32), the same on every path
static void quantize_c(const float *x, int64_t K, int8_t *c, float *d) {
    for (int64_t b = 0; b < (K + 31) / 32; b++) {
        float amax = 0.0f;
        for (int k = 0; k < 32 && b * 32 + k < K; k++) amax = fmaxf(amax, fabsf(x[b * 32 + k]));
        d[b] = amax / 127.0f;
        const float id = d[b] != 0.0f ? 1.0f / d[b] : 0.0f;
        for (int k = 0; k < 32 && b * 32 + k < K; k++) c[b * 32 + k] = (int8_t)nearbyintf(x[b * 32 + k] * id);
    }
}
#if HAVE_512
static void quantize_512(const float *x, int64_t K, int8_t *c, float *d) {
    const int64_t whole = K / 32;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < whole; b++) {
        const __m512 a = _mm512_loadu_ps(x + b * 32), bb = _mm512_loadu_ps(x + b * 32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, a), _mm512_andnot_ps(sign, bb)));
        d[b] = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(d[b] != 0.0f ? 1.0f / d[b] : 0.0f);
        _mm_storeu_si128((__m128i *)(c + b * 32), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
        _mm_storeu_si128((__m128i *)(c + b * 32 + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(bb, id))));
    }
    if (whole * 32 < K) quantize_c(x + whole * 32, K - whole * 32, c + whole * 32, d + whole);
}
#endif

// an input coded: codes in the group layout (vecs x 64), lane scales dxl (groups x 16: the input block's d for
// the lane's weight block), lane sums xsl (groups x 16: d x the codes' sum over the weight block in its first lane)
static void code_input(const Shape *s, const float *x, int8_t *codes, float *dxl, float *xsl, int use_c) {
    float d[4096], xs[8192];
    int8_t c[65536] __attribute__((aligned(64)));
#if HAVE_512
    if (!use_c) quantize_512(x, s->K, c, d);
    else
#endif
        quantize_c(x, s->K, c, d);
    for (int64_t b = 0; b < s->nb; b++) {
        int32_t t = 0;
        for (int64_t k = 0; k < s->BS; k++) t += c[b * s->BS + k];
        xs[b] = d[b * s->BS / 32] * (float)t;
    }
    for (int64_t g = 0; g < s->groups; g++) {
        int64_t T, b0, v0;
        group_of(s, g, &T, &b0, &v0);
        const int lpb = 16 / (int)T;
        for (int L = 0; L < 16; L++) {
            const int64_t b = b0 + L / lpb;
            dxl[g * 16 + L] = b < s->nb ? d[b * s->BS / 32] : 0.0f;
            xsl[g * 16 + L] = b < s->nb && L % lpb == 0 ? xs[b] : 0.0f;
        }
        for (int64_t j = 0; j < T * s->BS / 64; j++) {
            int32_t *dst = (int32_t *)(codes + (v0 + j) * 64);
            for (int L = 0; L < 16; L++) {  // lane L: 4 codes (a 32-bit word) of its block
                const int64_t b = b0 + L / lpb;
                int32_t word = 0;
                if (b < s->nb) memcpy(&word, c + value_at(s, T, b0, j, L, 0), 4);
                dst[L] = word;
            }
        }
    }
}

static inline float red16(const float *a) {  // (the vector path's order)
    float s8[8], s4[4];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// plain C: one (input, row), the groups' share
static float dot_c(const Shape *s, const uint8_t *pr, const float *ls, const float *lo, const int8_t *codes,
                   const float *dxl, const float *xsl) {
    float acc[16] = {0};
    for (int64_t g = 0; g < s->groups; g++) {
        int64_t T, b0, v0;
        group_of(s, g, &T, &b0, &v0);
        int32_t sum[16] = {0};
        for (int64_t j = v0; j < v0 + T * s->BS / 64; j++)
            for (int i = 0; i < 64; i++) {
                const uint8_t byte = pr[j / 2 * 64 + i];
                const int w = j % 2 == 0 ? byte & 15 : byte >> 4;
                sum[i / 4] += w * codes[j * 64 + i];
            }
        for (int L = 0; L < 16; L++) {
            acc[L] = fmaf((float)sum[L], dxl[g * 16 + L] * ls[g * 16 + L], acc[L]);
            acc[L] = fmaf(lo[g * 16 + L], xsl[g * 16 + L], acc[L]);
        }
    }
    return red16(acc);
}

#if HAVE_512
static inline float red16v(__m512 a) {  // red16's order
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    // (s4[0] + s4[2]) + (s4[1] + s4[3])
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
// MR inputs x NR rows (MR, NR <= 4); C, DX, XS: the coded inputs, rows CB bytes / 512 lanes apart
static inline __attribute__((always_inline)) void tile_512(const Shape *s, const uint8_t *W, int64_t rb,
                                                           const float *LS, const float *LO, int64_t nl,
                                                           const int8_t *C, const float *DX, const float *XS,
                                                           int MR, int NR, float (*out)[4]) {
    float acc[4][4][16] __attribute__((aligned(64)));  // in memory between groups: the registers hold the sums
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) _mm512_store_ps(acc[m][n], _mm512_setzero_ps());
    for (int64_t g = 0; g < s->groups; g++) {
        int64_t T, b0, v0;
        group_of(s, g, &T, &b0, &v0);
        __m512i sum[4][4];
        for (int m = 0; m < MR; m++)
            for (int n = 0; n < NR; n++) sum[m][n] = _mm512_setzero_si512();
        const int64_t v1 = v0 + T * s->BS / 64;
        const __m512i lo4 = _mm512_set1_epi8(0x0F);
        for (int64_t j = v0; j < v1; j += 2) {
            __m512i w0[4], w1[4], x[4];
            for (int n = 0; n < NR; n++) {
                const __m512i v = _mm512_loadu_si512((const void *)(W + n * rb + j * 32));
                w0[n] = _mm512_and_si512(v, lo4);
                w1[n] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            }
            for (int m = 0; m < MR; m++) x[m] = _mm512_loadu_si512((const void *)(C + m * CB + j * 64));
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = _mm512_dpbusd_epi32(sum[m][n], w0[n], x[m]);
            for (int m = 0; m < MR; m++) x[m] = _mm512_loadu_si512((const void *)(C + m * CB + j * 64 + 64));
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = _mm512_dpbusd_epi32(sum[m][n], w1[n], x[m]);
        }
        __m512 ws[4], wo[4];
        for (int n = 0; n < NR; n++) {
            ws[n] = _mm512_loadu_ps(LS + n * nl + g * 16);
            wo[n] = _mm512_loadu_ps(LO + n * nl + g * 16);
        }
        for (int m = 0; m < MR; m++) {
            const __m512 xd = _mm512_loadu_ps(DX + m * LB + g * 16), xs = _mm512_loadu_ps(XS + m * LB + g * 16);
            for (int n = 0; n < NR; n++) {
                __m512 a = _mm512_load_ps(acc[m][n]);
                a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m][n]), _mm512_mul_ps(xd, ws[n]), a);
                _mm512_store_ps(acc[m][n], _mm512_fmadd_ps(wo[n], xs, a));
            }
        }
    }
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) out[m][n] = red16v(_mm512_load_ps(acc[m][n]));
}
#endif

#if !HAVE_512 && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_256 1
static inline __m256i dot4(__m256i acc, __m256i w, __m256i x) {  // lane sums of four u8 x s8 products (exact)
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}
static inline float red16_256(__m256 lo, __m256 hi) {  // red16's order: s8 = lo + hi, then as red16
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
// as tile_512, a 16-lane vector as two halves (lanes 0-7, 8-15)
static inline __attribute__((always_inline)) void tile_256(const Shape *s, const uint8_t *W, int64_t rb,
                                                           const float *LS, const float *LO, int64_t nl,
                                                           const int8_t *C, const float *DX, const float *XS,
                                                           int MR, int NR, float (*out)[4]) {
    float acc[4][4][16] __attribute__((aligned(32)));
    memset(acc, 0, sizeof acc);
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int64_t g = 0; g < s->groups; g++) {
        int64_t T, b0, v0;
        group_of(s, g, &T, &b0, &v0);
        const int64_t v1 = v0 + T * s->BS / 64;
        for (int h = 0; h < 2; h++) {  // the half of every vector: lanes 8h .. 8h + 7, bytes 32h .. 32h + 31
            __m256i sum[4][4];
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = _mm256_setzero_si256();
            for (int64_t j = v0; j < v1; j += 2) {
                __m256i w0[4], w1[4], x[4];
                for (int n = 0; n < NR; n++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(W + n * rb + j * 32 + 32 * h));
                    w0[n] = _mm256_and_si256(v, lo4);
                    w1[n] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                }
                for (int m = 0; m < MR; m++) x[m] = _mm256_loadu_si256((const __m256i *)(C + m * CB + j * 64 + 32 * h));
                for (int m = 0; m < MR; m++)
                    for (int n = 0; n < NR; n++) sum[m][n] = dot4(sum[m][n], w0[n], x[m]);
                for (int m = 0; m < MR; m++)
                    x[m] = _mm256_loadu_si256((const __m256i *)(C + m * CB + j * 64 + 64 + 32 * h));
                for (int m = 0; m < MR; m++)
                    for (int n = 0; n < NR; n++) sum[m][n] = dot4(sum[m][n], w1[n], x[m]);
            }
            for (int m = 0; m < MR; m++) {
                const __m256 xd = _mm256_loadu_ps(DX + m * LB + g * 16 + 8 * h);
                const __m256 xs = _mm256_loadu_ps(XS + m * LB + g * 16 + 8 * h);
                for (int n = 0; n < NR; n++) {
                    const __m256 ws = _mm256_loadu_ps(LS + n * nl + g * 16 + 8 * h);
                    const __m256 wo = _mm256_loadu_ps(LO + n * nl + g * 16 + 8 * h);
                    __m256 a = _mm256_load_ps(acc[m][n] + 8 * h);
                    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][n]), _mm256_mul_ps(xd, ws), a);
                    _mm256_store_ps(acc[m][n] + 8 * h, _mm256_fmadd_ps(wo, xs, a));
                }
            }
        }
    }
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) out[m][n] = red16_256(_mm256_load_ps(acc[m][n]), _mm256_load_ps(acc[m][n] + 8));
}
#else
#define HAVE_256 0
#endif

// out[m][r] = sum_k w[r][k] x[m][k] for M inputs (coded here) and N rows; use_c: the plain C path
void gq_products(const uint8_t *W, const float *LS, const float *LO, int64_t N, int64_t K, int64_t BS,
                 const float *X, int64_t M, float *out, int use_c) {
    const Shape s = shape_of(K, BS);
    const int64_t rb = s.vecs * 32, nl = s.groups * 16;
    static int8_t C[64][8192];
    static float DX[64][512], XS[64][512];
    for (int64_t m0 = 0; m0 < M; m0 += 64) {
        const int64_t mc = M - m0 < 64 ? M - m0 : 64;
        for (int64_t m = 0; m < mc; m++) code_input(&s, X + (m0 + m) * K, C[m], DX[m], XS[m], use_c);
        for (int64_t n0 = 0; n0 < N; n0 += 4) {
            const int nr = N - n0 < 4 ? (int)(N - n0) : 4;
            for (int64_t mt = 0; mt < mc; mt += 4) {
                const int mr = mc - mt < 4 ? (int)(mc - mt) : 4;
                float a[4][4];
#if HAVE_512
                if (!use_c) {
                    if (mr == 4 && nr == 4)
                        tile_512(&s, W + n0 * rb, rb, LS + n0 * nl, LO + n0 * nl, nl, C[mt], DX[mt], XS[mt], 4, 4, a);
                    else
                        tile_512(&s, W + n0 * rb, rb, LS + n0 * nl, LO + n0 * nl, nl, C[mt], DX[mt], XS[mt], mr, nr, a);
                } else
#elif HAVE_256
                if (!use_c) {
                    if (mr == 4 && nr == 4)
                        tile_256(&s, W + n0 * rb, rb, LS + n0 * nl, LO + n0 * nl, nl, C[mt], DX[mt], XS[mt], 4, 4, a);
                    else
                        tile_256(&s, W + n0 * rb, rb, LS + n0 * nl, LO + n0 * nl, nl, C[mt], DX[mt], XS[mt], mr, nr, a);
                } else
#endif
                    for (int m = 0; m < mr; m++)
                        for (int n = 0; n < nr; n++)
                            a[m][n] = dot_c(&s, W + (n0 + n) * rb, LS + (n0 + n) * nl, LO + (n0 + n) * nl, C[mt + m],
                                            DX[mt + m], XS[mt + m]);
                for (int m = 0; m < mr; m++)
                    for (int n = 0; n < nr; n++) out[(m0 + mt + m) * N + n0 + n] = a[m][n];
            }
        }
    }
}
