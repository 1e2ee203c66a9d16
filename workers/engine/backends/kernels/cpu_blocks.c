// CPU kernels for weights held as int8 blocks: w[r, k] = scale[r, b] * q[r, k] + offset[r, b],
// b = k / bs, bs = 16 or 32. Every GGUF quantization type this engine loads (Q4_0 ... Q6_K, Q8_0)
// is exactly this with its own block size, so the CPU backend keeps one byte per weight (plus the
// block scales) instead of four, and a decode step reads a quarter of the bytes.
//
// Compiled at first use with the system C compiler (cpu_kernels.py) and called through ctypes; the
// row loops run on OpenMP threads when the compiler has OpenMP. The dot product has an AVX2 path
// (x86-64 since 2013) and a plain C one the compiler vectorizes as it can (NEON on a Jetson).

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define PARALLEL_MIN_WORK (1 << 16)  // multiply-adds below which one thread is faster than waking others
#define GEMV_ROWS_A_CLAIM 32         // rows a thread takes at a time in the dynamic schedule

// Threads for the parallel loops (no-op without OpenMP); returns the number in effect.
int genie_set_threads(int n) {
#ifdef _OPENMP
    if (n > 0) omp_set_num_threads(n);
    return omp_get_max_threads();
#else
    (void)n;
    return 1;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 load_q8(const int8_t *p) {  // 8 int8 -> 8 float
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float hsum8(__m256 v) {  // the eight lanes' sum, in a fixed order
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// sum_k w[k] * x_i[k] over one row of K weights for R inputs x_i = x + i * K (R a constant: each call
// site is its own copy). Each 32-weight piece is widened to float once for all R inputs, which is what
// makes a product of several decode streams cheaper than that many products of one; each input's
// arithmetic is the same whatever R is (the products of a block summed first, then scaled once), so a
// stream gets the same sums alone as among others (tests/workers/test_batching.py).
static inline __attribute__((always_inline)) void rows_dot(const int8_t *qr, const float *sr, int64_t K,
                                                           int64_t BS, const float *x, int R, float *out) {
    __m256 acc0[4], acc1[4];
    for (int i = 0; i < R; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {  // 32 weights: one block of 32 or two of 16
        const __m256 w0 = load_q8(qr + k), w1 = load_q8(qr + k + 8);
        const __m256 w2 = load_q8(qr + k + 16), w3 = load_q8(qr + k + 24);
        for (int i = 0; i < R; i++) {
            const float *xi = x + i * K + k;
            __m256 lo = _mm256_mul_ps(w0, _mm256_loadu_ps(xi));
            __m256 hi = _mm256_mul_ps(w2, _mm256_loadu_ps(xi + 16));
            lo = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), lo);
            hi = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xi + 24), hi);
            if (BS == 32) {
                acc0[i] = _mm256_fmadd_ps(_mm256_add_ps(lo, hi), _mm256_broadcast_ss(sr + k / 32), acc0[i]);
            } else {
                acc0[i] = _mm256_fmadd_ps(lo, _mm256_broadcast_ss(sr + k / 16), acc0[i]);
                acc1[i] = _mm256_fmadd_ps(hi, _mm256_broadcast_ss(sr + k / 16 + 1), acc1[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) {
        out[i] = hsum8(_mm256_add_ps(acc0[i], acc1[i]));
    }
}
#else
static inline void rows_dot(const int8_t *qr, const float *sr, int64_t K, int64_t BS, const float *x, int R,
                            float *out) {
    for (int i = 0; i < R; i++) {
        const float *xi = x + i * K;
        float sum = 0.0f;
        for (int64_t b = 0; b < K / BS; b++) {
            float t = 0.0f;
            for (int64_t k = 0; k < BS; k++) t += (float)qr[b * BS + k] * xi[b * BS + k];
            sum += sr[b] * t;
        }
        out[i] = sum;
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define GEMV_ROW_GROUP 4  // weight rows a call of four_rows_sums takes

static inline __m512 load16_q8(const int8_t *p) {  // 16 int8 -> 16 float
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

// sum_k w_r[k] * x_i[k] for four weight rows w_r = qr + r * K (their block scales sr + r * nb) and R inputs
// (AVX-512): each 32-weight piece of a row widened once for the R inputs, each input's piece loaded once for
// the four rows, and the sums of a row and an input in registers until the row ends, where a row alone
// reduced a vector after every row (1.36x on a 1 536 x 576 product, 1.46x on Gemma 3's 262 144-row output head:
// bench/NOTES.md). Each (row, input) sum is the same sequence of operations whatever R is.
static inline __attribute__((always_inline)) void four_rows_dot(const int8_t *qr, const float *sr, int64_t K,
                                                                int64_t BS, const float *x, int R, float *out) {
    const int64_t nb = K / BS;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < R; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        __m512 x0[4], x1[4];
        for (int i = 0; i < R; i++) {
            x0[i] = _mm512_loadu_ps(x + i * K + k);
            x1[i] = _mm512_loadu_ps(x + i * K + k + 16);
        }
        for (int r = 0; r < 4; r++) {
            const __m512 w0 = load16_q8(qr + r * K + k), w1 = load16_q8(qr + r * K + k + 16);
            const float *s = sr + r * nb;
            for (int i = 0; i < R; i++) {
                if (BS == 32) {
                    const __m512 p = _mm512_fmadd_ps(w1, x1[i], _mm512_mul_ps(w0, x0[i]));
                    acc[r][i] = _mm512_fmadd_ps(p, _mm512_set1_ps(s[k / 32]), acc[r][i]);
                } else {
                    acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(w0, x0[i]), _mm512_set1_ps(s[k / 16]), acc[r][i]);
                    acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(w1, x1[i]), _mm512_set1_ps(s[k / 16 + 1]), acc[r][i]);
                }
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < R; i++) out[r * 4 + i] = _mm512_reduce_add_ps(acc[r][i]);
}

static inline __attribute__((always_inline)) void four_rows_sums(const int8_t *qr, const float *sr, int64_t K,
                                                                 int64_t BS, const float *x, int R, float *out) {
    four_rows_dot(qr, sr, K, BS, x, R, out);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define GEMV_ROW_GROUP 4

// Four weight rows against one input (AVX2): rows_dot's operations for each row, bit for bit, with the input's
// pieces loaded once for the four rows and each row's vector reduced once at the end (16 registers hold one
// input's accumulators, not four's: several inputs take rows_dot a row at a time, the same sums). 1.2-1.26x a
// product of blocks of 32 with one input, built for AVX2 alone on this machine (bench/NOTES.md).
static inline __attribute__((always_inline)) void four_rows_dot1(const int8_t *qr, const float *sr, int64_t K,
                                                                 int64_t BS, const float *x, float *out) {
    const int64_t nb = K / BS;
    __m256 acc0[4], acc1[4];
    for (int r = 0; r < 4; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        const __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        for (int r = 0; r < 4; r++) {
            const int8_t *q = qr + r * K + k;
            const float *s = sr + r * nb;
            __m256 lo = _mm256_mul_ps(load_q8(q), x0);
            __m256 hi = _mm256_mul_ps(load_q8(q + 16), x2);
            lo = _mm256_fmadd_ps(load_q8(q + 8), x1, lo);
            hi = _mm256_fmadd_ps(load_q8(q + 24), x3, hi);
            if (BS == 32) {
                acc0[r] = _mm256_fmadd_ps(_mm256_add_ps(lo, hi), _mm256_broadcast_ss(s + k / 32), acc0[r]);
            } else {
                acc0[r] = _mm256_fmadd_ps(lo, _mm256_broadcast_ss(s + k / 16), acc0[r]);
                acc1[r] = _mm256_fmadd_ps(hi, _mm256_broadcast_ss(s + k / 16 + 1), acc1[r]);
            }
        }
    }
    for (int r = 0; r < 4; r++) out[r * 4] = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
}

static inline __attribute__((always_inline)) void four_rows_sums(const int8_t *qr, const float *sr, int64_t K,
                                                                 int64_t BS, const float *x, int R, float *out) {
    if (R == 1 && BS == 32) {  // (blocks of 16 want a second accumulator a row: spilled, slower than a row alone)
        four_rows_dot1(qr, sr, K, BS, x, out);
        return;
    }
    float row[4];
    for (int r = 0; r < 4; r++) {
        rows_dot(qr + r * K, sr + r * (K / BS), K, BS, x, R, row);
        for (int i = 0; i < R; i++) out[r * 4 + i] = row[i];
    }
}
#else
#define GEMV_ROW_GROUP 1
#endif

// The sums of rows [0, NR) of qr against R inputs into out[r * 4 + i]: four rows at a time where the CPU has a
// kernel for it (NR = GEMV_ROW_GROUP), else one.
static inline __attribute__((always_inline)) void row_sums(const int8_t *qr, const float *sr, int64_t K, int64_t BS,
                                                           const float *x, int NR, int R, float *out) {
#if GEMV_ROW_GROUP > 1
    if (NR > 1) {
        four_rows_sums(qr, sr, K, BS, x, R, out);
        return;
    }
#endif
    (void)NR;
    rows_dot(qr, sr, K, BS, x, R, out);
}

// Rows [r, r + NR) against the n inputs, four at a time, plus the offsets' share: offset[b] * (sum of x over
// block b).
static inline __attribute__((always_inline)) void rows_gemv(const int8_t *q, const float *scale, const float *offset,
                                                            int64_t K, int64_t BS, const float *x, const float *xsum,
                                                            int64_t n, float *y, int64_t ldy, int64_t r, int NR) {
    const int64_t nb = K / BS;
    const int8_t *qr = q + r * K;
    const float *sr = scale + r * nb;
    float sums[16] = {0};
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const float *xs0 = x + i0 * K;
        switch (n - i0) {  // a constant R at each call: the loops unroll, the accumulators stay in registers
            case 1: row_sums(qr, sr, K, BS, xs0, NR, 1, sums); break;
            case 2: row_sums(qr, sr, K, BS, xs0, NR, 2, sums); break;
            case 3: row_sums(qr, sr, K, BS, xs0, NR, 3, sums); break;
            default: row_sums(qr, sr, K, BS, xs0, NR, 4, sums); break;
        }
        const int64_t m = n - i0 < 4 ? n - i0 : 4;
        for (int64_t j = 0; j < NR; j++)
            for (int64_t i = i0; i < i0 + m; i++) {
                float sum = sums[j * 4 + i - i0];
                if (offset != NULL) {
                    const float *orow = offset + (r + j) * nb, *xs = xsum + i * nb;
                    for (int64_t b = 0; b < nb; b++) sum += orow[b] * xs[b];
                }
                y[i * ldy + r + j] = sum;
            }
    }
}

// y[i * rows + r] = sum_k w[r, k] * x[i * K + k] for all rows r and the n inputs i; K % 32 == 0. Returns
// -1 (nothing written) when the offsets' block sums of x find no memory.
int genie_blk_gemv(const int8_t *q, const float *scale, const float *offset, int64_t K, int64_t bs, const float *x,
                   int64_t n, float *y, int64_t rows) {
    const int64_t nb = K / bs;
    float *xsum = NULL;  // xsum[i * nb + b]: x[i] summed over block b, for the offsets' share
    if (offset != NULL) {
        xsum = malloc(sizeof(float) * (size_t)(n * nb));
        if (xsum == NULL) return -1;
        for (int64_t j = 0; j < n * nb; j++) {  // in numpy's order for a sum of 16 or 32 (eight partial sums)
            const float *v = x + j * bs;
            float r[8];
            for (int t = 0; t < 8; t++) r[t] = v[t];
            for (int64_t k = 8; k < bs; k += 8)
                for (int t = 0; t < 8; t++) r[t] += v[k + t];
            xsum[j] = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        }
    }
// dynamic: rows are claimed in small runs, so a thread that another process holds up (a busy machine)
// delays only its own run, not the whole product behind a static share
// (rows in groups of GEMV_ROW_GROUP where the CPU has a kernel for it; the last rows of a product one at a time)
    const int64_t groups = rows / GEMV_ROW_GROUP, tail = rows - groups * GEMV_ROW_GROUP;
#pragma omp parallel for schedule(dynamic, GEMV_ROWS_A_CLAIM / GEMV_ROW_GROUP) if (rows * K * n >= PARALLEL_MIN_WORK)
    for (int64_t g = 0; g < groups + tail; g++) {
        const int64_t r = g < groups ? g * GEMV_ROW_GROUP : groups * GEMV_ROW_GROUP + (g - groups);
        const int nr = g < groups ? GEMV_ROW_GROUP : 1;
        if (bs == 32)
            rows_gemv(q, scale, offset, K, 32, x, xsum, n, y, rows, r, nr);
        else
            rows_gemv(q, scale, offset, K, 16, x, xsum, n, y, rows, r, nr);
    }
    free(xsum);
    return 0;
}

// out[(r - r0) * K + k] = w[r, k] for rows r in [r0, r1): float32 rows for a BLAS GEMM. Exact: every
// scale * q product of a GGUF type fits a float32 significand, so this equals the reference dequant.
// Serial: the many-token product runs one of these per thread of its own pool (cpu_kernels.py).
void genie_blk_dequant(const int8_t *q, const float *scale, const float *offset, int64_t K, int64_t bs,
                       float *out, int64_t r0, int64_t r1) {
    const int64_t nb = K / bs;
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *qr = q + r * K;
        float *o = out + (r - r0) * K;
        for (int64_t b = 0; b < nb; b++) {
            const float s = scale[r * nb + b];
            const float m = offset != NULL ? offset[r * nb + b] : 0.0f;
            for (int64_t k = 0; k < bs; k++) o[b * bs + k] = s * (float)qr[b * bs + k] + m;
        }
    }
}

// One query token's attention over a slot's INT8 K/V (the decode step): query heads [h * group, h * group + group)
// read KV head h. k, v: the slot's rows from the first visible position, n_kv * hd (hdv) bytes a position, head
// h at h * hd; ks, vs: their scales, n_kv floats a position. q [H, hd] is already rotated as the rows are; out
// [H, hdv] is left rotated. The arithmetic is NumpyBackend.attention's for one token: scores (q . k) * scale *
// k_scale, softcap, softmax (its exponentials exp_le0's, below), probabilities times v_scale, then their sum
// over the rows of v; but each int8 row is read once for the heads of its group, where the loop widened the
// whole slot to float32 for every head, and the softmax runs in runs of positions merged at the end (flash
// decoding's split). hd and hdv at most ATTN1_MAX_DIM, multiples of 16.
#define ATTN1_MAX_DIM 1024  // head dims genie_attn1_i8 takes (a row widened once into a buffer of this size)
#define ATTN1_RUN 64        // positions a thread takes at a time (fixed: the sums do not depend on the threads)
// multiply-adds below which genie_attn1_i8 runs on one thread: sleeping threads take ~8 us to wake, one thread
// does 2^18 of these in ~25 us (bench/NOTES.md, CPU note 2026-12-06)
#define ATTN1_PARALLEL_MIN (1 << 18)

// e^x for x <= 0 (a score less its row's maximum), Cephes' expf (2^n times a polynomial, within ~2e-7 of
// it): plain arithmetic, so the compiler makes a vector of it, where libm's expf is a call for each score
static inline float exp_le0(float x) {
    x = x < -87.0f ? -87.0f : x;                                        // e^-87 ~ 1.6e-38: still normal
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
    x = x - n * 0.693359375f + n * 2.12194440e-4f;                      // x - n ln 2, in two parts
    const float z = x * x;
    float y = 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return y * scale.f;
}

static inline float dot_f32(const float *a, const float *b, int64_t n) {  // n % 16 == 0
    float acc[16] = {0};  // sixteen partial sums: vectors of them, where one sum would be a chain of adds
    for (int64_t d = 0; d < n; d += 16)
        for (int i = 0; i < 16; i++) acc[i] += a[d + i] * b[d + i];
    float sum = 0.0f;
    for (int i = 0; i < 16; i++) sum += acc[i];
    return sum;
}

// Positions [j0, j1) of KV head h for the `group` query heads qh: each head's scores less their maximum,
// exponentiated, summed (sum) and weighted into a partial output (o [group, hdv]); max their maximum.
static void attn1_part(const float *qh, const int8_t *k, const float *ks, const int8_t *v, const float *vs,
                       int64_t j0, int64_t j1, int64_t h, int64_t n_kv, int64_t group, int64_t hd, int64_t hdv,
                       float scale, float softcap, float *scores, float *o, float *max, float *sum) {
    const int64_t n = j1 - j0, kstride = n_kv * hd, vstride = n_kv * hdv;
    float row[ATTN1_MAX_DIM];  // a K or V row widened once for the heads of the group
    for (int64_t j = 0; j < n; j++) {
        const int8_t *kr = k + (j0 + j) * kstride + h * hd;
        for (int64_t d = 0; d < hd; d++) row[d] = (float)kr[d];
        const float f = ks[(j0 + j) * n_kv + h];
        for (int64_t g = 0; g < group; g++) {
            float s = dot_f32(qh + g * hd, row, hd) * scale * f;
            if (softcap != 0.0f) s = softcap * tanhf(s / softcap);
            scores[g * n + j] = s;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *sg = scores + g * n, mx = -INFINITY, total = 0.0f;
        for (int64_t j = 0; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
        for (int64_t j = 0; j < n; j++) sg[j] = exp_le0(sg[j] - mx);
        for (int64_t j = 0; j < n; j++) total += sg[j];
        for (int64_t j = 0; j < n; j++) sg[j] *= vs[(j0 + j) * n_kv + h];
        max[g] = mx;
        sum[g] = total;
    }
    for (int64_t d = 0; d < group * hdv; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const int8_t *vr = v + (j0 + j) * vstride + h * hdv;
        for (int64_t d = 0; d < hdv; d++) row[d] = (float)vr[d];
        for (int64_t g = 0; g < group; g++) {
            const float pj = scores[g * n + j];
            float *og = o + g * hdv;
            for (int64_t d = 0; d < hdv; d++) og[d] += pj * row[d];
        }
    }
}

// One token's attention over t positions of INT8 K/V rows ([t, n_kv, hd], a scale per row and KV head): out
// [n_heads, hdv]. The positions go in runs of ATTN1_RUN, each KV head's runs on the OpenMP threads, then each
// head's runs merged in order (their maxima to the largest): the same sums whatever the threads. Returns -1
// when the partial results find no memory.
int genie_attn1_i8(const float *q, const int8_t *k, const float *ks, const int8_t *v, const float *vs, int64_t t,
                   int64_t n_heads, int64_t n_kv, int64_t hd, int64_t hdv, float scale, float softcap, float *out) {
    const int64_t group = n_heads / n_kv, runs = (t + ATTN1_RUN - 1) / ATTN1_RUN, parts = n_kv * runs;
    const int64_t per = group * (ATTN1_RUN + hdv + 2);  // a part's scores, output, maxima and sums
    float *buf = malloc(sizeof(float) * (size_t)(parts * per));
    if (buf == NULL) return -1;
#pragma omp parallel for schedule(dynamic, 1) if (parts > 1 && t * n_heads * (hd + hdv) >= ATTN1_PARALLEL_MIN)
    for (int64_t p = 0; p < parts; p++) {
        const int64_t h = p / runs, j0 = (p % runs) * ATTN1_RUN, j1 = j0 + ATTN1_RUN < t ? j0 + ATTN1_RUN : t;
        float *scores = buf + p * per, *o = scores + group * ATTN1_RUN, *mx = o + group * hdv, *sum = mx + group;
        attn1_part(q + h * group * hd, k, ks, v, vs, j0, j1, h, n_kv, group, hd, hdv, scale, softcap, scores, o,
                   mx, sum);
    }
    for (int64_t h = 0; h < n_kv; h++)
        for (int64_t g = 0; g < group; g++) {
            float top = -INFINITY, total = 0.0f;
            for (int64_t r = 0; r < runs; r++) {
                const float m = buf[(h * runs + r) * per + group * (ATTN1_RUN + hdv) + g];
                top = m > top ? m : top;
            }
            float *og = out + (h * group + g) * hdv;
            for (int64_t d = 0; d < hdv; d++) og[d] = 0.0f;
            for (int64_t r = 0; r < runs; r++) {
                const float *part = buf + (h * runs + r) * per + group * ATTN1_RUN;
                const float w = exp_le0(part[group * hdv + g] - top);
                total += part[group * hdv + group + g] * w;
                for (int64_t d = 0; d < hdv; d++) og[d] += part[g * hdv + d] * w;
            }
            for (int64_t d = 0; d < hdv; d++) og[d] /= total;
        }
    free(buf);
    return 0;
}
