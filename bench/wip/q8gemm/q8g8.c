// lane = (block, half): 8 blocks of 32 a group of 256 values; zmm lane L: block L/2, values of half (L&1)... (4 dpbusd a group)
#include <immintrin.h>
#include <stdint.h>
#define MR 4
#define NR 4
void q8_gemm8(const uint8_t *W, const float *ws, const int8_t *X, const float *xs, int M, int N, int G, float *out) {
    const int64_t rb = (int64_t)G * 256;
    for (int n0 = 0; n0 < N; n0 += NR)
        for (int m0 = 0; m0 < M; m0 += MR) {
            __m512 f[MR][NR];
            for (int m = 0; m < MR; m++) for (int n = 0; n < NR; n++) f[m][n] = _mm512_setzero_ps();
            for (int g = 0; g < G; g++) {
                __m512i s[MR][NR];
                for (int m = 0; m < MR; m++) for (int n = 0; n < NR; n++) s[m][n] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m512i w[NR], x[MR];
                    for (int n = 0; n < NR; n++) w[n] = _mm512_loadu_si512(W + (n0 + n) * rb + g * 256 + j * 64);
                    for (int m = 0; m < MR; m++) x[m] = _mm512_loadu_si512(X + (m0 + m) * rb + g * 256 + j * 64);
                    for (int m = 0; m < MR; m++) for (int n = 0; n < NR; n++) s[m][n] = _mm512_dpbusd_epi32(s[m][n], w[n], x[m]);
                }
                __m512 wsv[NR];
                for (int n = 0; n < NR; n++) wsv[n] = _mm512_loadu_ps(ws + (int64_t)(n0 + n) * G * 16 + g * 16);
                for (int m = 0; m < MR; m++) {
                    const __m512 xv = _mm512_loadu_ps(xs + (int64_t)(m0 + m) * G * 16 + g * 16);
                    for (int n = 0; n < NR; n++) f[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][n]), _mm512_mul_ps(xv, wsv[n]), f[m][n]);
                }
            }
            for (int m = 0; m < MR; m++) for (int n = 0; n < NR; n++) out[(int64_t)(m0 + m) * N + n0 + n] = _mm512_reduce_add_ps(f[m][n]);
        }
}
