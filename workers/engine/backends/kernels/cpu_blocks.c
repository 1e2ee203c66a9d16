// CPU kernels for weights held as int8 blocks: w[r, k] = scale[r, b] * q[r, k] + offset[r, b],
// b = k / bs, bs = 16 or 32. Every GGUF quantization type this engine loads (Q4_0 ... Q6_K, Q8_0)
// is exactly this with its own block size, so the CPU backend keeps one byte per weight (plus the
// block scales) instead of four, and a decode step reads a quarter of the bytes.
//
// Compiled at first use with the system C compiler (cpu_kernels.py) and called through ctypes; the
// row loops run on the threads of a pool of genie's own (below). The dot products have AVX-512 and AVX2 paths
// (x86-64 since 2013), for the 4- and 5-bit groups an Armv8.2 dot-product path (a Jetson Orin's or a Pi 5's
// cores: gq_dot_neon), and a plain C one the compiler vectorizes as it can; the same bits on each.

#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PARALLEL_MIN_WORK (1 << 16)  // multiply-adds below which one thread is faster than waking others
#define GEMV_ROWS_A_CLAIM 32         // rows a thread takes at a time (a prompt's product)
#define RUN_INPUTS 4                 // inputs up to which a product's rows are one run a thread (decode steps)
#define ROTATE_ROWS_A_CLAIM 64       // rows of genie_rotate_rows a thread takes at a time

// ---- the threads ----------------------------------------------------------------------------------------------
// A decode token is ~120 products and ~30 attention calls, with a few to a few tens of microseconds of Python
// between them. Threads that sleep between calls (OpenMP's passive wait, genie's until 2026-12-06) are woken
// ~150 times a token, and a sleeping vCPU takes long to wake: two threads decoded no faster than one (SmolLM2,
// 75 tok/s either way); spinning a little between calls made it 97-100. But a thread that spins on a busy
// machine takes the core from the threads with work (beside one process spinning a core: 35 tok/s spinning
// against 68 sleeping). So the pool's threads spin for POOL_SPIN_NS after a call, and not at all for
// POOL_QUIET_NS once its threads were seen waiting for a core (their run delay, /proc/thread-self/schedstat,
// more than POOL_BUSY of the time); without that file they never spin. bench/NOTES.md (CPU note 2026-12-06b).
//
// A call (pool_run) publishes its function and context, then one word: generation (24 bits), items (20 bits) and
// the next item to claim (20 bits). Threads claim items by compare-and-swap on that word, so a thread that read
// a later call's function claims nothing of it under the earlier generation, and a call ends when every item
// it handed out is done: no thread is ever waited for except while it holds an item.
#define POOL_SPIN_NS 200000          // a thread's spin for the next call before it sleeps (between tokens: asleep)
#define POOL_QUIET_NS 1000000000LL   // no spinning for this long once the threads were seen waiting for a core
#define POOL_CHECK_NS 20000000LL     // run delays looked at every this long, at most
#define POOL_BUSY 0.25               // a share of the time a worker waited for a core (mean): a busy machine
#define POOL_MAX_THREADS 256
#define POOL_ITEMS_MAX ((1 << 20) - 1)
#define GEN_SHIFT 40
#define ITEMS_SHIFT 20
#define FIELD20 ((uint64_t)POOL_ITEMS_MAX)

typedef void (*pool_fn)(const void *ctx, int64_t item);

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    _Atomic int threads;                // in effect, the caller included
    int created;                        // workers started in this process (1 .. created)
    pthread_mutex_t running;            // held by the call in progress (another thread's call runs alone)
    _Atomic(pool_fn) fn;
    _Atomic(const void *) ctx;
    _Atomic uint64_t word;              // generation | items | next item
    _Atomic int64_t done;               // items of the current call done
    _Atomic int sleeping;               // workers asleep on `wake`
    _Atomic int caller_waits;           // the caller asleep on `finished`
    _Atomic int64_t quiet_until;        // no spinning before this time (ns)
    int64_t last_check, last_delay;     // the caller's last look at the workers' run delays
    _Atomic int delay_fd[POOL_MAX_THREADS];  // worker i's schedstat: -2 not opened yet, -1 not readable
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .finished = PTHREAD_COND_INITIALIZER,
          .threads = 1, .running = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t run_delay(int fd) {  // -1 where it cannot be read
    char buf[96];
    const ssize_t n = fd < 0 ? -1 : pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    long long on_cpu, waited;
    return sscanf(buf, "%lld %lld", &on_cpu, &waited) == 2 ? (int64_t)waited : -1;
}

// Whether the pool's threads spin between calls now; every POOL_CHECK_NS (the caller's thread) it looks at how
// long they waited for a core since the last look, and stops the spinning for POOL_QUIET_NS if that was too much.
static void pool_check_busy(void) {
    const int64_t t = now_ns();
    if (t - pool.last_check < POOL_CHECK_NS) return;
    int64_t delay = 0;
    for (int i = 1; i <= pool.created; i++) {
        const int fd = atomic_load(&pool.delay_fd[i]);
        if (fd == -2) return;  // a worker just started: look next time
        const int64_t d = run_delay(fd);
        if (d < 0) {  // no schedstat: never spin
            atomic_store(&pool.quiet_until, INT64_MAX);
            return;
        }
        delay += d;
    }
    const int spun = t >= atomic_load(&pool.quiet_until);
    const double window = (double)(t - pool.last_check) * pool.created;
    if (spun && pool.last_check && (double)(delay - pool.last_delay) > POOL_BUSY * window)
        atomic_store(&pool.quiet_until, t + POOL_QUIET_NS);
    pool.last_check = t;
    pool.last_delay = delay;
}

// Items of the call whose word is w, claimed one at a time until none is left or another call began.
static void pool_claim(uint64_t w) {
    const uint64_t gen = w >> GEN_SHIFT;
    for (;;) {
        if (w >> GEN_SHIFT != gen || (w & FIELD20) >= ((w >> ITEMS_SHIFT) & FIELD20)) return;
        const pool_fn fn = atomic_load(&pool.fn);
        const void *ctx = atomic_load(&pool.ctx);
        if (atomic_compare_exchange_weak(&pool.word, &w, w + 1)) {  // else w is the word now: look again
            fn(ctx, (int64_t)(w & FIELD20));
            const int64_t items = (int64_t)((w >> ITEMS_SHIFT) & FIELD20);
            if (atomic_fetch_add(&pool.done, 1) + 1 == items && atomic_load(&pool.caller_waits)) {
                pthread_mutex_lock(&pool.lock);
                pthread_cond_signal(&pool.finished);
                pthread_mutex_unlock(&pool.lock);
            }
            w = atomic_load(&pool.word);
        }
    }
}

static void *pool_worker(void *arg) {
    const int index = (int)(intptr_t)arg;  // 1 .. created
    atomic_store(&pool.delay_fd[index], open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC));
    uint64_t seen = atomic_load(&pool.word) >> GEN_SHIFT;
    for (;;) {
        uint64_t w = atomic_load(&pool.word);
        if (now_ns() >= atomic_load(&pool.quiet_until)) {
            const int64_t until = now_ns() + POOL_SPIN_NS;
            for (int i = 0; w >> GEN_SHIFT == seen; i++, w = atomic_load(&pool.word)) {
                cpu_relax();
                if ((i & 255) == 255 && now_ns() > until) break;
            }
        }
        if (w >> GEN_SHIFT == seen) {
            pthread_mutex_lock(&pool.lock);
            atomic_fetch_add(&pool.sleeping, 1);
            while ((w = atomic_load(&pool.word)) >> GEN_SHIFT == seen) pthread_cond_wait(&pool.wake, &pool.lock);
            atomic_fetch_sub(&pool.sleeping, 1);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = w >> GEN_SHIFT;
        if (index < atomic_load(&pool.threads)) pool_claim(w);  // a worker past the threads in effect sits this call out
    }
    return NULL;
}

// In a forked child (pthread_atfork, in the forking thread before anything else runs there): none of the parent's
// threads are in it, and a lock one of them held at the fork would be held for ever; the pool starts again empty.
static void pool_after_fork(void) {
    for (int i = 1; i <= pool.created; i++) {
        const int fd = atomic_load(&pool.delay_fd[i]);
        if (fd >= 0) close(fd);
    }
    pool.created = 0;
    pool.last_check = 0;
    atomic_store(&pool.sleeping, 0);
    atomic_store(&pool.caller_waits, 0);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_mutex_init(&pool.running, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.finished, NULL);
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

// fn(ctx, i) for i in [0, items) on the pool's threads and the caller's; returns when all are done. The items'
// order among the threads is not fixed: each must write only its own part of the results. Runs on the caller's
// thread alone with one thread, fewer than two items, more than POOL_ITEMS_MAX, or while another thread's call
// holds the pool.
static void pool_run(pool_fn fn, const void *ctx, int64_t items) {
    if (atomic_load(&pool.threads) < 2 || items < 2 || items > POOL_ITEMS_MAX ||
        pthread_mutex_trylock(&pool.running) != 0) {
        for (int64_t i = 0; i < items; i++) fn(ctx, i);
        return;
    }
    for (int i = pool.created + 1; i < atomic_load(&pool.threads); i++) {
        pthread_t t;
        atomic_store(&pool.delay_fd[i], -2);
        if (pthread_create(&t, NULL, pool_worker, (void *)(intptr_t)i) != 0) break;
        pthread_detach(t);
        pool.created = i;
    }
    pool_check_busy();
    atomic_store(&pool.fn, fn);
    atomic_store(&pool.ctx, ctx);
    atomic_store(&pool.done, 0);
    const uint64_t gen = ((atomic_load(&pool.word) >> GEN_SHIFT) + 1) & ((1u << 24) - 1);
    const uint64_t w = gen << GEN_SHIFT | (uint64_t)items << ITEMS_SHIFT;
    atomic_store(&pool.word, w);
    if (atomic_load(&pool.sleeping)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    pool_claim(w);
    const int64_t until = now_ns() + POOL_SPIN_NS;
    for (int i = 0; atomic_load(&pool.done) < items; i++) {
        cpu_relax();
        if ((i & 255) == 255 && now_ns() > until) {  // a thread holding an item is off its core: sleep
            pthread_mutex_lock(&pool.lock);
            atomic_store(&pool.caller_waits, 1);
            while (atomic_load(&pool.done) < items) pthread_cond_wait(&pool.finished, &pool.lock);
            atomic_store(&pool.caller_waits, 0);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    pthread_mutex_unlock(&pool.running);
}

// Threads for the parallel loops, the caller's included (at most POOL_MAX_THREADS); returns the number in effect.
int genie_set_threads(int n) {
    pthread_once(&pool_once, pool_init);
    if (n > 0) atomic_store(&pool.threads, n < POOL_MAX_THREADS ? n : POOL_MAX_THREADS);
    return atomic_load(&pool.threads);
}

// The float-input kernels (genie_blk_gemv, genie_blk_dequant) read int8 values, a byte a value (Q8_0's, Q6_K's,
// Q4_0's); the 4- and 5-bit types are in groups (GROUPS, below) with products of their own.

// The rows a decode product takes PREFETCH_ROWS rows after four being summed, and their scales, asked into the cache
// (a hint: past the matrix's end it reads nothing). The hardware's prefetchers stop at 4 KiB pages: Gemma 3's
// 262 144-row head ran at 137 ns a row on one thread without this, 83 with it (bench/NOTES.md, CPU note 2026-12-06d).
#define PREFETCH_ROWS 8
#define GEMV_HALF_BLOCKS 1024  // float16 scales a row genie_blk_gemv widens on the stack, at most (K 32 768 of Q8_0)
static inline void prefetch_rows(const int8_t *qr, const float *sr, int64_t stride, int64_t nb) {
    for (int64_t off = 0; off < 4 * stride; off += 64) __builtin_prefetch(qr + PREFETCH_ROWS * stride + off, 0, 3);
    for (int64_t off = 0; off < 4 * nb; off += 16) __builtin_prefetch(sr + PREFETCH_ROWS * nb + off, 0, 3);
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 load_q8(const int8_t *p) {  // 8 int8 -> 8 float
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

// 8 weights of a row from value idx (a multiple of 8) as floats
static inline __attribute__((always_inline)) __m256 load8_w(const int8_t *qr, int64_t idx) { return load_q8(qr + idx); }

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
        const __m256 w0 = load8_w(qr, k), w1 = load8_w(qr, k + 8);
        const __m256 w2 = load8_w(qr, k + 16), w3 = load8_w(qr, k + 24);
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

// 16 weights of a row from value idx (a multiple of 16) as floats
static inline __attribute__((always_inline)) __m512 load16_w(const int8_t *qr, int64_t idx) {
    return load16_q8(qr + idx);
}

// sum_k w_r[k] * x_i[k] for four weight rows w_r = qr + r * K (their block scales sr + r * nb) and R inputs
// (AVX-512): each 32-weight piece of a row widened once for the R inputs, each input's piece loaded once for
// the four rows, and the sums of a row and an input in registers until the row ends, where a row alone
// reduced a vector after every row (1.36x on a 1 536 x 576 product, 1.46x on Gemma 3's 262 144-row output head:
// bench/NOTES.md). Each (row, input) sum is the same sequence of operations whatever R is.
static inline __attribute__((always_inline)) void four_rows_dot(const int8_t *qr, const float *sr, int64_t K,
                                                                int64_t BS, const float *x, int R, float *out) {
    const int64_t nb = K / BS, stride = K;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < R; i++) acc[r][i] = _mm512_setzero_ps();
    prefetch_rows(qr, sr, stride, nb);
    for (int64_t k = 0; k < K; k += 32) {
        __m512 x0[4], x1[4];
        for (int i = 0; i < R; i++) {
            x0[i] = _mm512_loadu_ps(x + i * K + k);
            x1[i] = _mm512_loadu_ps(x + i * K + k + 16);
        }
        for (int r = 0; r < 4; r++) {
            const __m512 w0 = load16_w(qr + r * stride, k), w1 = load16_w(qr + r * stride, k + 16);
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
    const int64_t nb = K / BS, stride = K;
    __m256 acc0[4], acc1[4];
    for (int r = 0; r < 4; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    prefetch_rows(qr, sr, stride, nb);
    for (int64_t k = 0; k < K; k += 32) {
        const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        const __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        for (int r = 0; r < 4; r++) {
            const int8_t *q = qr + r * stride;
            const float *s = sr + r * nb;
            __m256 lo = _mm256_mul_ps(load8_w(q, k), x0);
            __m256 hi = _mm256_mul_ps(load8_w(q, k + 16), x2);
            lo = _mm256_fmadd_ps(load8_w(q, k + 8), x1, lo);
            hi = _mm256_fmadd_ps(load8_w(q, k + 24), x3, hi);
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
// block b); sr and orr: the scales and offsets (or NULL) of row r on, nb = K / BS a row.
static inline __attribute__((always_inline)) void rows_gemv(const int8_t *q, const float *sr, const float *orr,
                                                            int64_t K, int64_t BS, const float *x, const float *xsum,
                                                            int64_t n, float *y, int64_t ldy, int64_t r, int NR) {
    const int64_t nb = K / BS;
    const int8_t *qr = q + r * K;
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
                if (orr != NULL) {
                    const float *orow = orr + j * nb, *xs = xsum + i * nb;
                    for (int64_t b = 0; b < nb; b++) sum += orow[b] * xs[b];
                }
                y[i * ldy + r + j] = sum;
            }
    }
}

struct gemv_job {
    const int8_t *q;
    const void *scale, *offset;  // float32, or float16 with `half`
    const float *x, *xsum;
    int64_t K, bs, n, rows, groups, tail;
    float *y;
    int64_t per;  // row groups a claim
    int half;
};

static inline float gq_half(uint16_t h);
#if defined(__F16C__)
#include <immintrin.h>
#endif

// n float16s from h into dst as float32
static void halves_to_floats(const uint16_t *h, int64_t n, float *dst) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) dst[i] = gq_half(h[i]);
}

// A claim of `per` row groups: in groups of GEMV_ROW_GROUP where the CPU has a kernel for it, the last rows of a
// product one at a time. A prompt's rows are claimed in small runs (GEMV_ROWS_A_CLAIM), so a thread that another
// process holds up delays only its own run; a decode step's are one run a thread, which its core's prefetchers
// follow (faster also beside a busy core, as measured).
static void gemv_claim(const void *ctx, int64_t item) {
    const struct gemv_job *j = ctx;
    const int64_t per = j->per, g1 = (item + 1) * per;
    const int64_t nb = j->K / j->bs;
    float sbuf[GEMV_ROW_GROUP * GEMV_HALF_BLOCKS], obuf[GEMV_ROW_GROUP * GEMV_HALF_BLOCKS];
    for (int64_t g = item * per; g < g1 && g < j->groups + j->tail; g++) {
        const int64_t r = g < j->groups ? g * GEMV_ROW_GROUP : j->groups * GEMV_ROW_GROUP + (g - j->groups);
        const int nr = g < j->groups ? GEMV_ROW_GROUP : 1;
        const float *sr = (const float *)j->scale + r * nb, *orr = j->offset ? (const float *)j->offset + r * nb : NULL;
        if (j->half) {  // the rows' float16s widened (genie_blk_gemv keeps nb within GEMV_HALF_BLOCKS)
            halves_to_floats((const uint16_t *)j->scale + r * nb, nr * nb, sbuf);
            sr = sbuf;
            if (j->offset) halves_to_floats((const uint16_t *)j->offset + r * nb, nr * nb, obuf), orr = obuf;
        }
        if (j->bs == 32)
            rows_gemv(j->q, sr, orr, j->K, 32, j->x, j->xsum, j->n, j->y, j->rows, r, nr);
        else
            rows_gemv(j->q, sr, orr, j->K, 16, j->x, j->xsum, j->n, j->y, j->rows, r, nr);
    }
}

// y[i * rows + r] = sum_k w[r, k] * x[i * K + k] for all rows r and the n inputs i; K % 32 == 0; q int8 values;
// scale and offset float32, or with `half` float16 (GGUF's own: a Q8_0 row reads 34 bytes a block, not 36).
// Returns -1 (nothing written) when the offsets' block sums of x find no memory, -2 for float16 scales of more
// than GEMV_HALF_BLOCKS blocks a row.
int genie_blk_gemv(const int8_t *q, const void *scale, const void *offset, int64_t K, int64_t bs, const float *x,
                   int64_t n, float *y, int64_t rows, int half) {
    const int64_t nb = K / bs;
    if (half && nb > GEMV_HALF_BLOCKS) return -2;
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
    const int64_t groups = rows / GEMV_ROW_GROUP, tail = rows - groups * GEMV_ROW_GROUP;
    // a decode step's rows as one run a thread, as genie_gq_products' (bench/NOTES.md, CPU note item 7)
    const int64_t threads = atomic_load(&pool.threads);
    const int64_t run = (groups + tail + threads - 1) / threads;
    const int64_t per = n > RUN_INPUTS || run == 0 ? GEMV_ROWS_A_CLAIM / GEMV_ROW_GROUP : run;  // (run 0: no rows)
    const struct gemv_job job = {q, scale, offset, x, xsum, K, bs, n, rows, groups, tail, y, per, half};
    const int64_t claims = (groups + tail + per - 1) / per;
    if (rows * K * n >= PARALLEL_MIN_WORK) {
        pool_run(gemv_claim, &job, claims);
    } else {
        for (int64_t c = 0; c < claims; c++) gemv_claim(&job, c);
    }
    free(xsum);
    return 0;
}

// out[(r - r0) * K + k] = w[r, k] for rows r in [r0, r1): float32 rows for a BLAS GEMM. Exact: every
// scale * q product of a GGUF type fits a float32 significand, so this equals the reference dequant.
// Serial: the many-token product runs one of these per thread of its own pool (cpu_kernels.py).
static inline __attribute__((always_inline)) void dequant_rows(const int8_t *q, const void *scale, const void *offset,
                                                               int64_t K, int64_t bs, float *out, int64_t r0,
                                                               int64_t r1, int half) {
    const int64_t nb = K / bs;
    for (int64_t r = r0; r < r1; r++) {
        const int8_t *qr = q + r * K;
        float *o = out + (r - r0) * K;
        for (int64_t b = 0; b < nb; b++) {
            const float s = half ? gq_half(((const uint16_t *)scale)[r * nb + b]) : ((const float *)scale)[r * nb + b];
            const float m = offset == NULL ? 0.0f
                            : half         ? gq_half(((const uint16_t *)offset)[r * nb + b])
                                           : ((const float *)offset)[r * nb + b];
            for (int64_t k = 0; k < bs; k++) o[b * bs + k] = s * (float)qr[b * bs + k] + m;
        }
    }
}

void genie_blk_dequant(const int8_t *q, const void *scale, const void *offset, int64_t K, int64_t bs, float *out,
                       int64_t r0, int64_t r1, int half) {
    dequant_rows(q, scale, offset, K, bs, out, r0, r1, half);
}

// ---- 4-bit weights in groups, met by q8-coded inputs: one product for every number of inputs ----------------
// Layout 3 (GROUPS; block_weight.py packs it): a row's blocks of 32 go in groups of 16 (lane L of each vector of
// 64 values: block L, vector j its values 4j .. 4j + 3), then a tail of t < 16 blocks as one group of T blocks, T
// the power of two >= t and >= 4 (16 / T lanes a block: lane L holds block L / (16 / T)'s values 4 (j (16 / T) +
// L % (16 / T)) + 0 .. 3). Vectors 2i and 2i + 1 share 64 bytes: byte b holds vector 2i's value b in its low nibble
// and vector 2i + 1's in its high one. Layout 4 (GROUPS_HIGH: 5-bit values, Q5_0's q + 16) puts after those 64
// bytes two 64-bit words, the fifth bits of vector 2i's values (value b at bit b), then vector 2i + 1's: 80 bytes
// a pair. Scales and offsets stay a number a block: float32, or float16 where that holds them exactly (GGUF's
// own Q4_1 / Q5_0 scales: 4 of a block's bytes, not 8; block_weight.load chooses).
// An input is coded as llama.cpp's q8_0 (blocks of 32, d = max|x| / 127, codes round(x / d)) into the same layout.
// The arithmetic of an (input, row), the same for any number of inputs and on every instruction set: per group in
// order, exact integer sums a lane (a block's, or a part of one), then acc[L] = fmaf(sum[L], dx[L] * s[L], acc[L])
// and acc[L] = fmaf(o[L], xs[L], acc[L]) (a block's offset and the coded input's sum over it in the block's first
// lane, zeros elsewhere); the row's output is red16(acc). A decode step (one input) and a prompt (many) give a
// token the same bits, so a conversation continued from saved K/V continues as a cold run does.
#define GQ_TILE 4         // inputs and rows a tile
#define GQ_ROWS_A_CLAIM 16 // a prompt's claim (a decode step's: RUN_INPUTS)
#define GQ_INPUT_CHUNK 64 // inputs whose codes a claim's rows meet before the next ones (they stay in L1/L2)

typedef struct {
    int64_t K, nb, full, tail_T, groups, vecs;
} gq_shape;

static gq_shape gq_shape_of(int64_t K) {
    gq_shape s = {K, K / 32, 0, 0, 0, 0};
    s.full = s.nb / 16;
    const int64_t t = s.nb % 16;
    if (t) {
        s.tail_T = 4;
        while (s.tail_T < t) s.tail_T *= 2;
    }
    s.groups = s.full + (t ? 1 : 0);
    s.vecs = s.full * 8 + s.tail_T / 2;
    return s;
}

#define GQ_PAIR(H) ((H) ? 80 : 64)  // a pair of vectors' bytes (H: the 5-bit layout)

static inline int64_t gq_group_T(const gq_shape *s, int64_t g) { return g < s->full ? 16 : s->tail_T; }

// lane L's block in group g (>= nb: none)
static inline int64_t gq_lane_block(const gq_shape *s, int64_t g, int L) {
    return g * 16 + L / (16 / (int)gq_group_T(s, g));
}

// IEEE binary16 to float32 (exact, subnormals too)
static inline float gq_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, bits;
    if (e == 0x1Fu)
        bits = sign | 0x7F800000u | (m << 13);
    else if (e != 0)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else if (m == 0)
        bits = sign;
    else {  // subnormal: m 2^-24, normalized
        e = 113;
        while (!(m & 0x400u)) m <<= 1, e--;
        bits = sign | (e << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
// block b's number in a row's scales or offsets (half: float16 storage)
static inline float gq_at(const void *p, int64_t b, int half) {
    return half ? gq_half(((const uint16_t *)p)[b]) : ((const float *)p)[b];
}

// the lanes' weight scales and offsets of group g of a row (s_r, o_r: its blocks', float32 or with `half` float16;
// o_r NULL: zeros)
static inline void gq_lanes_c(const gq_shape *s, int64_t g, const void *s_r, const void *o_r, int half, float *ls,
                              float *lo) {
    const int lpb = 16 / (int)gq_group_T(s, g);
    for (int L = 0; L < 16; L++) {
        const int64_t b = gq_lane_block(s, g, L);
        ls[L] = b < s->nb ? gq_at(s_r, b, half) : 0.0f;
        lo[L] = b < s->nb && L % lpb == 0 && o_r != NULL ? gq_at(o_r, b, half) : 0.0f;
    }
}

static __attribute__((unused)) void gq_quantize_c(const float *x, int64_t K, int8_t *c, float *d) {
    for (int64_t b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[b * 32 + k]));
        d[b] = amax / 127.0f;
        const float id = d[b] != 0.0f ? 1.0f / d[b] : 0.0f;
        for (int k = 0; k < 32; k++) c[b * 32 + k] = (int8_t)nearbyintf(x[b * 32 + k] * id);
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define GQ_512 1
static void gq_quantize(const float *x, int64_t K, int8_t *c, float *d) {  // gq_quantize_c's numbers
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / 32; b++) {
        const __m512 a0 = _mm512_loadu_ps(x + b * 32), a1 = _mm512_loadu_ps(x + b * 32 + 16);
        d[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, a0), _mm512_andnot_ps(sign, a1))) / 127.0f;
        const __m512 id = _mm512_set1_ps(d[b] != 0.0f ? 1.0f / d[b] : 0.0f);
        _mm_storeu_si128((__m128i *)(c + b * 32), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a0, id))));
        _mm_storeu_si128((__m128i *)(c + b * 32 + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a1, id))));
    }
}
#else
#define GQ_512 0
#define gq_quantize gq_quantize_c
#endif

// input x coded: codes (vecs x 64 bytes, the group layout), dxl and xsl (groups x 16 lanes, as gq_lanes_c places
// a row's scales and offsets: the input block's d; d x the codes' sum over the block, in its first lane). c, d, xs:
// K bytes, K / 32 and K / 32 floats of scratch.
static void gq_code_input(const gq_shape *s, const float *x, int8_t *codes, float *dxl, float *xsl, int8_t *c,
                          float *d, float *xs) {
    gq_quantize(x, s->K, c, d);
    for (int64_t b = 0; b < s->nb; b++) {
        int32_t t = 0;
        for (int k = 0; k < 32; k++) t += c[b * 32 + k];
        xs[b] = d[b] * (float)t;
    }
    for (int64_t g = 0; g < s->groups; g++) {
        const int64_t T = gq_group_T(s, g);
        const int lpb = 16 / (int)T;
        gq_lanes_c(s, g, d, xs, 0, dxl + g * 16, xsl + g * 16);
        for (int64_t j = 0; j < T / 2; j++) {
            int8_t *dst = codes + (g * 8 + j) * 64;
            for (int L = 0; L < 16; L++) {
                const int64_t b = gq_lane_block(s, g, L);
                if (b < s->nb)
                    memcpy(dst + 4 * L, c + b * 32 + 4 * (j * lpb + L % lpb), 4);
                else
                    memset(dst + 4 * L, 0, 4);
            }
        }
    }
}

static inline float gq_red16(const float *a) {  // the vector paths' order
    float s8[8], s4[4];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// One (input, row) in plain C
static __attribute__((unused)) float gq_dot_c(const gq_shape *s, const uint8_t *w, const void *s_r, const void *o_r, int half,
                      const int8_t *codes, const float *dxl, const float *xsl, int H) {
    float acc[16] = {0}, ls[16], lo[16];
    for (int64_t g = 0; g < s->groups; g++) {
        int32_t sum[16] = {0};
        const int64_t v0 = g * 8, v1 = v0 + gq_group_T(s, g) / 2;
        for (int64_t v = v0; v < v1; v++)
            for (int i = 0; i < 64; i++) {
                const uint8_t *pair = w + v / 2 * GQ_PAIR(H), byte = pair[i];
                int u = v % 2 == 0 ? byte & 15 : byte >> 4;
                if (H) {
                    uint64_t bits;
                    memcpy(&bits, pair + 64 + 8 * (v % 2), 8);
                    u += (int)((bits >> i) & 1) * 16;
                }
                sum[i / 4] += u * codes[v * 64 + i];
            }
        gq_lanes_c(s, g, s_r, o_r, half, ls, lo);
        for (int L = 0; L < 16; L++) {
            acc[L] = fmaf((float)sum[L], dxl[g * 16 + L] * ls[L], acc[L]);
            acc[L] = fmaf(lo[L], xsl[g * 16 + L], acc[L]);
        }
    }
    return gq_red16(acc);
}

// group g's numbers (scales or offsets) of row n of a tile, as float32: P itself, or (half) its float16s widened
// into buf (16 floats; blocks past the row's end read as 0)
static inline const float *gq_group_floats(const gq_shape *s, const void *P, int64_t n, int64_t g, int half, float *buf) {
    if (!half) return (const float *)P + n * s->nb + g * 16;
    const uint16_t *h = (const uint16_t *)P + n * s->nb + g * 16;
    const int64_t have = s->nb - g * 16 < 16 ? s->nb - g * 16 : 16;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    _mm512_storeu_ps(buf, _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16((__mmask32)((1u << have) - 1), h))));
#elif defined(__F16C__)
    if (have == 16) {
        _mm256_storeu_ps(buf, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
        _mm256_storeu_ps(buf + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 8))));
    } else
        for (int i = 0; i < 16; i++) buf[i] = i < have ? gq_half(h[i]) : 0.0f;
#else
    for (int i = 0; i < 16; i++) buf[i] = i < have ? gq_half(h[i]) : 0.0f;
#endif
    return buf;
}

#if GQ_512
static inline __m512i gq_dot(__m512i acc, __m512i w, __m512i x) {  // lane sums of four u8 x s8 products (exact)
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, w, x);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}
static inline float gq_red16v(__m512 a) {  // gq_red16's order
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
// MR inputs x NR rows: y[m * rows + n] (the tile's first input and row). W: the rows (rb bytes apart), S / O their
// blocks' scales and offsets (nb apart); C, DX, XS: the inputs' codes and lanes
// (cb bytes / lb floats apart). The float accumulators stay in memory between groups: the 16 integer sums, the
// weights and the inputs fill the registers.
static inline __attribute__((always_inline)) void gq_tile(const gq_shape *s, const uint8_t *W, int64_t rb,
                                                          const void *S, const void *O, int half, const int8_t *C,
                                                          int64_t cb, const float *DX, const float *XS, int64_t lb,
                                                          int MR, int NR, float *y, int64_t rows, int H) {
    float acc[GQ_TILE][GQ_TILE][16] __attribute__((aligned(64)));
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) _mm512_store_ps(acc[m][n], _mm512_setzero_ps());
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    for (int64_t g = 0; g < s->groups; g++) {
        __m512i sum[GQ_TILE][GQ_TILE];
        for (int m = 0; m < MR; m++)
            for (int n = 0; n < NR; n++) sum[m][n] = _mm512_setzero_si512();
        const int64_t v0 = g * 8, v1 = v0 + gq_group_T(s, g) / 2;
        for (int64_t v = v0; v < v1; v += 2) {
            __m512i w0[GQ_TILE], w1[GQ_TILE], x[GQ_TILE];
            for (int n = 0; n < NR; n++) {
                const uint8_t *pair = W + n * rb + v / 2 * GQ_PAIR(H);
                const __m512i p = _mm512_loadu_si512((const void *)pair);
                w0[n] = _mm512_and_si512(p, lo4);
                w1[n] = _mm512_and_si512(_mm512_srli_epi16(p, 4), lo4);
                if (H) {  // 16 where the fifth bit is set
                    uint64_t b0, b1;
                    memcpy(&b0, pair + 64, 8);
                    memcpy(&b1, pair + 72, 8);
                    w0[n] = _mm512_mask_add_epi8(w0[n], b0, w0[n], _mm512_set1_epi8(16));
                    w1[n] = _mm512_mask_add_epi8(w1[n], b1, w1[n], _mm512_set1_epi8(16));
                }
            }
            for (int m = 0; m < MR; m++) x[m] = _mm512_loadu_si512((const void *)(C + m * cb + v * 64));
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = gq_dot(sum[m][n], w0[n], x[m]);
            for (int m = 0; m < MR; m++) x[m] = _mm512_loadu_si512((const void *)(C + m * cb + v * 64 + 64));
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = gq_dot(sum[m][n], w1[n], x[m]);
        }
        // the lanes' scales and offsets: a full group's 16 blocks as they are; a tail's blocks spread over their
        // lanes (lane L: block L / lpb), the offset in a block's first lane (gq_lanes_c's values)
        const int full = g < s->full, lpb = 16 / (int)gq_group_T(s, g);
        const __mmask16 have = full ? 0xFFFF : (__mmask16)((1u << (s->nb - g * 16)) - 1);
        const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i at = _mm512_srlv_epi32(iota, _mm512_set1_epi32(__builtin_ctz((unsigned)lpb)));
        const __mmask16 first = _mm512_cmpeq_epi32_mask(_mm512_and_si512(iota, _mm512_set1_epi32(lpb - 1)), _mm512_setzero_si512());
        __m512 ws[GQ_TILE], wo[GQ_TILE];
        float hs[16], ho[16];  // (float16 storage: the group's numbers widened)
        for (int n = 0; n < NR; n++) {
            ws[n] = _mm512_permutexvar_ps(at, _mm512_maskz_loadu_ps(have, gq_group_floats(s, S, n, g, half, hs)));
            wo[n] = O ? _mm512_maskz_mov_ps(first, _mm512_permutexvar_ps(at, _mm512_maskz_loadu_ps(have, gq_group_floats(s, O, n, g, half, ho))))
                      : _mm512_setzero_ps();
        }
        for (int m = 0; m < MR; m++) {
            const __m512 xd = _mm512_loadu_ps(DX + m * lb + g * 16), xs = _mm512_loadu_ps(XS + m * lb + g * 16);
            for (int n = 0; n < NR; n++) {
                __m512 a = _mm512_load_ps(acc[m][n]);
                a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m][n]), _mm512_mul_ps(xd, ws[n]), a);
                _mm512_store_ps(acc[m][n], _mm512_fmadd_ps(wo[n], xs, a));
            }
        }
    }
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) y[m * rows + n] = gq_red16v(_mm512_load_ps(acc[m][n]));
}
#define GQ_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__)
static inline __m256i gq_dot(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}
static inline float gq_red16v(__m256 lo, __m256 hi) {  // gq_red16's order
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
// 32 bits -> 32 bytes: 16 where the bit is set, else 0 (bit b: byte b)
static inline __m256i gq_fifth32(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                                2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}
// lanes 8h .. 8h + 7 of a group's scales (offsets where `first`: in a block's first lane only) from its blocks b
// (`have` of them; lane L: block L / lpb), gq_lanes_c's values
static inline __m256 gq_lanes8(const float *b, int64_t have, int lpb, int h, int first) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), lane = _mm256_add_epi32(iota, _mm256_set1_epi32(8 * h));
    const __m256i at = _mm256_srlv_epi32(lane, _mm256_set1_epi32(__builtin_ctz((unsigned)lpb)));  // the lanes' blocks
    const int64_t b0 = lpb == 1 ? 8 * h : 0;  // lpb 1: blocks 8h .. 8h + 7; else blocks 0 .. 7 hold every lane's
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(have - b0)), iota);
    const __m256 v = _mm256_maskload_ps(b + b0, in);
    __m256 r = _mm256_permutevar8x32_ps(v, _mm256_sub_epi32(at, _mm256_set1_epi32((int)b0)));
    if (first) {
        const __m256i lead = _mm256_cmpeq_epi32(_mm256_and_si256(lane, _mm256_set1_epi32(lpb - 1)), _mm256_setzero_si256());
        r = _mm256_and_ps(r, _mm256_castsi256_ps(lead));
    }
    return r;
}
// as the AVX-512 tile, a vector of 16 lanes as two halves (lanes 8h .. 8h + 7: bytes 32h .. 32h + 31)
static inline __attribute__((always_inline)) void gq_tile(const gq_shape *s, const uint8_t *W, int64_t rb,
                                                          const void *S, const void *O, int half, const int8_t *C,
                                                          int64_t cb, const float *DX, const float *XS, int64_t lb,
                                                          int MR, int NR, float *y, int64_t rows, int H) {
    float acc[GQ_TILE][GQ_TILE][16] __attribute__((aligned(32)));
    memset(acc, 0, sizeof acc);
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int64_t g = 0; g < s->groups; g++) {
        const int64_t v0 = g * 8, v1 = v0 + gq_group_T(s, g) / 2;
        const int lpb = 16 / (int)gq_group_T(s, g);
        for (int h = 0; h < 2; h++) {
            __m256i sum[GQ_TILE][GQ_TILE];
            for (int m = 0; m < MR; m++)
                for (int n = 0; n < NR; n++) sum[m][n] = _mm256_setzero_si256();
            for (int64_t v = v0; v < v1; v += 2) {
                __m256i w0[GQ_TILE], w1[GQ_TILE], x[GQ_TILE];
                for (int n = 0; n < NR; n++) {
                    const uint8_t *pair = W + n * rb + v / 2 * GQ_PAIR(H);
                    const __m256i p = _mm256_loadu_si256((const __m256i *)(pair + 32 * h));
                    w0[n] = _mm256_and_si256(p, lo4);
                    w1[n] = _mm256_and_si256(_mm256_srli_epi16(p, 4), lo4);
                    if (H) {
                        uint32_t b0, b1;
                        memcpy(&b0, pair + 64 + 4 * h, 4);
                        memcpy(&b1, pair + 72 + 4 * h, 4);
                        w0[n] = _mm256_add_epi8(w0[n], gq_fifth32(b0));
                        w1[n] = _mm256_add_epi8(w1[n], gq_fifth32(b1));
                    }
                }
                for (int m = 0; m < MR; m++) x[m] = _mm256_loadu_si256((const __m256i *)(C + m * cb + v * 64 + 32 * h));
                for (int m = 0; m < MR; m++)
                    for (int n = 0; n < NR; n++) sum[m][n] = gq_dot(sum[m][n], w0[n], x[m]);
                for (int m = 0; m < MR; m++)
                    x[m] = _mm256_loadu_si256((const __m256i *)(C + m * cb + v * 64 + 64 + 32 * h));
                for (int m = 0; m < MR; m++)
                    for (int n = 0; n < NR; n++) sum[m][n] = gq_dot(sum[m][n], w1[n], x[m]);
            }
            for (int m = 0; m < MR; m++) {
                const __m256 xd = _mm256_loadu_ps(DX + m * lb + g * 16 + 8 * h);
                const __m256 xs = _mm256_loadu_ps(XS + m * lb + g * 16 + 8 * h);
                for (int n = 0; n < NR; n++) {
                    float hs[16], ho[16];  // (float16 storage: the group's numbers widened)
                    const __m256 ws = gq_lanes8(gq_group_floats(s, S, n, g, half, hs), s->nb - g * 16, lpb, h, 0);
                    const __m256 wo = O ? gq_lanes8(gq_group_floats(s, O, n, g, half, ho), s->nb - g * 16, lpb, h, 1)
                                        : _mm256_setzero_ps();
                    __m256 a = _mm256_load_ps(acc[m][n] + 8 * h);
                    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][n]), _mm256_mul_ps(xd, ws), a);
                    _mm256_store_ps(acc[m][n] + 8 * h, _mm256_fmadd_ps(wo, xs, a));
                }
            }
        }
    }
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < NR; n++) y[m * rows + n] = gq_red16v(_mm256_load_ps(acc[m][n]), _mm256_load_ps(acc[m][n] + 8));
}
#define GQ_SIMD 1
#else
#define GQ_SIMD 0
#endif

#if !GQ_SIMD && defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
// gq_dot_c's numbers with Armv8.2's dot product (a Jetson Orin's or a Pi 5's cores): sdot sums four int8 products
// into each 32-bit lane of a 16-byte vector, so a 64-value vector's 16 lanes are four sdots on its four quarters,
// each lane a block's (or part of one's) exact integer sum as in the plain form; the 4-bit values (0..15) are
// int8 as they are, a 5-bit value's fifth bit (layout 4) adds 16 before the dot. The float part is gq_dot_c's
// lane by lane (fused multiply-adds in the same order), then gq_red16.
static inline uint8x16_t gq_fifth16(uint16_t bits) {  // 16 for each set bit i of bits, in byte i; else 0
    static const uint8_t each[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t rep = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(rep, vld1q_u8(each)), vdupq_n_u8(16));
}

static float gq_dot_neon(const gq_shape *s, const uint8_t *w, const void *s_r, const void *o_r, int half,
                         const int8_t *codes, const float *dxl, const float *xsl, int H) {
    float acc[16] = {0}, ls[16], lo[16];
    const uint8x16_t low4 = vdupq_n_u8(15);
    for (int64_t g = 0; g < s->groups; g++) {
        int32x4_t sum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        const int64_t v0 = g * 8, v1 = v0 + gq_group_T(s, g) / 2;
        for (int64_t v = v0; v < v1; v += 2) {  // a pair (T / 2 is even): 64 bytes, low nibbles v, high v + 1
            const uint8_t *pair = w + v / 2 * GQ_PAIR(H);
            uint64_t bits[2] = {0, 0};
            if (H) memcpy(bits, pair + 64, 16);
            for (int q = 0; q < 4; q++) {
                const uint8x16_t b = vld1q_u8(pair + 16 * q);
                uint8x16_t lo_u = vandq_u8(b, low4), hi_u = vshrq_n_u8(b, 4);
                if (H) {  // bit i of each word: value i's fifth bit; this quarter's values are 16q .. 16q + 15
                    lo_u = vaddq_u8(lo_u, gq_fifth16((uint16_t)(bits[0] >> (16 * q))));
                    hi_u = vaddq_u8(hi_u, gq_fifth16((uint16_t)(bits[1] >> (16 * q))));
                }
                sum[q] = vdotq_s32(sum[q], vreinterpretq_s8_u8(lo_u), vld1q_s8(codes + v * 64 + 16 * q));
                sum[q] = vdotq_s32(sum[q], vreinterpretq_s8_u8(hi_u), vld1q_s8(codes + (v + 1) * 64 + 16 * q));
            }
        }
        int32_t lane[16];
        for (int q = 0; q < 4; q++) vst1q_s32(lane + 4 * q, sum[q]);
        gq_lanes_c(s, g, s_r, o_r, half, ls, lo);
        for (int L = 0; L < 16; L++) {
            acc[L] = fmaf((float)lane[L], dxl[g * 16 + L] * ls[L], acc[L]);
            acc[L] = fmaf(lo[L], xsl[g * 16 + L], acc[L]);
        }
    }
    return gq_red16(acc);
}
#define GQ_DOT gq_dot_neon
#else
#define GQ_DOT gq_dot_c
#endif

struct gq_job {
    const uint8_t *w;
    const void *scale, *offset;  // float32, or float16 with `half`
    gq_shape s;
    const int8_t *codes;
    const float *dxl, *xsl;
    int64_t n, rows;
    float *y;
    int high;  // the 5-bit layout
    int half;  // scale and offset in float16
    int64_t per_claim;  // rows a claim, a multiple of GQ_TILE
};

// a claim of per_claim rows against every input, GQ_TILE x GQ_TILE at a time
static void gq_claim(const void *ctx, int64_t item) {
    const struct gq_job *j = ctx;
    const gq_shape *s = &j->s;
    const int64_t rb = s->vecs / 2 * GQ_PAIR(j->high), cb = s->vecs * 64, lb = s->groups * 16;
    const int64_t r1 = (item + 1) * j->per_claim < j->rows ? (item + 1) * j->per_claim : j->rows;
    for (int64_t m0 = 0; m0 < j->n; m0 += GQ_INPUT_CHUNK) {
        const int64_t m1 = m0 + GQ_INPUT_CHUNK < j->n ? m0 + GQ_INPUT_CHUNK : j->n;
        for (int64_t r = item * j->per_claim; r < r1; r += GQ_TILE) {
            const int nr = r1 - r < GQ_TILE ? (int)(r1 - r) : GQ_TILE;
            for (int64_t m = m0; m < m1; m += GQ_TILE) {
                const int mr = m1 - m < GQ_TILE ? (int)(m1 - m) : GQ_TILE;
                const uint8_t *W = j->w + r * rb;
                const size_t sz = j->half ? 2 : 4;  // a scale's bytes
                const void *S = (const char *)j->scale + r * s->nb * sz;
                const void *O = j->offset ? (const char *)j->offset + r * s->nb * sz : NULL;
                float *y = j->y + m * j->rows + r;
#if GQ_SIMD
                const int8_t *C = j->codes + m * cb;
                const float *DX = j->dxl + m * lb, *XS = j->xsl + m * lb;
                if (mr == GQ_TILE && nr == GQ_TILE && !j->high)  // (constant tiles: their arrays in registers)
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, GQ_TILE, GQ_TILE, y, j->rows, 0);
                else if (mr == GQ_TILE && nr == GQ_TILE)
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, GQ_TILE, GQ_TILE, y, j->rows, 1);
                else if (mr == 1 && nr == GQ_TILE && !j->high)  // a decode step of one stream
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, 1, GQ_TILE, y, j->rows, 0);
                else if (mr == 1 && nr == GQ_TILE)
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, 1, GQ_TILE, y, j->rows, 1);
                else if (!j->high)
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, mr, nr, y, j->rows, 0);
                else
                    gq_tile(s, W, rb, S, O, j->half, C, cb, DX, XS, lb, mr, nr, y, j->rows, 1);
#else
                for (int a = 0; a < mr; a++)
                    for (int b = 0; b < nr; b++)
                        y[a * j->rows + b] = GQ_DOT(s, W + b * rb, (const char *)S + b * s->nb * sz,
                                                      O ? (const char *)O + b * s->nb * sz : NULL, j->half,
                                                      j->codes + (m + a) * cb, j->dxl + (m + a) * lb,
                                                      j->xsl + (m + a) * lb, j->high);
#endif
            }
        }
    }
}

// y[i * rows + r] = sum_k w[r, k] x[i * K + k] for the n inputs and every row of w (layout 3, GROUPS, or with
// `high` 4, GROUPS_HIGH; scale and offset a number a block of 32, float32 or with `half` float16, offset NULL:
// none); K % 32 == 0. Returns -1 (nothing written) without memory for the coded inputs.
int genie_gq_products(const uint8_t *w, const void *scale, const void *offset, int64_t K, const float *x, int64_t n,
                      float *y, int64_t rows, int high, int half) {
    const gq_shape s = gq_shape_of(K);
    const int64_t cb = s.vecs * 64, lb = s.groups * 16;
    int8_t *codes = malloc((size_t)(n * cb + K)), *c = codes + n * cb;
    float *lanes = malloc(sizeof(float) * (size_t)(2 * n * lb + 2 * (K / 32)));
    if (codes == NULL || lanes == NULL) {
        free(codes);
        free(lanes);
        return -1;
    }
    float *dxl = lanes, *xsl = lanes + n * lb, *d = lanes + 2 * n * lb, *xs = d + K / 32;
    for (int64_t i = 0; i < n; i++)
        gq_code_input(&s, x + i * K, codes + i * cb, dxl + i * lb, xsl + i * lb, c, d, xs);
    // A decode step reads each row once: a thread's rows as one run, so that each core's prefetchers follow one
    // long stream, where 16-row claims interleaved the threads every few KB (bench/NOTES.md, CPU note item 7:
    // faster idle and beside a busy core alike).
    const int64_t threads = atomic_load(&pool.threads);
    const int64_t run = (rows + threads * GQ_TILE - 1) / (threads * GQ_TILE) * GQ_TILE;
    const int64_t per_claim = n > RUN_INPUTS || run == 0 ? GQ_ROWS_A_CLAIM : run;  // (run 0: no rows)
    const struct gq_job job = {w, scale, offset, s, codes, dxl, xsl, n, rows, y, high != 0, half != 0, per_claim};
    const int64_t claims = (rows + per_claim - 1) / per_claim;
    if (rows * K * n >= PARALLEL_MIN_WORK)
        pool_run(gq_claim, &job, claims);
    else
        for (int64_t i = 0; i < claims; i++) gq_claim(&job, i);
    free(codes);
    free(lanes);
    return 0;
}

// A query token's attention over a slot's INT8 K/V (a decode step's, or each of a prompt's tokens): query
// heads [h * group, h * group + group) read KV head h. k, v: the slot's rows, n_kv * hd (hdv) bytes a position,
// head h at h * hd; ks, vs: their scales, n_kv floats a position. q [H, hd] is already rotated as the rows are;
// out [H, hdv] is left rotated. The arithmetic is NumpyBackend.attention's for one token: scores (q . k) * scale *
// k_scale, softcap, softmax (its exponentials exp_le0's, below), probabilities times v_scale, then their sum
// over the rows of v; but each int8 row is read once for the heads of its group, where the loop widened the
// whole slot to float32 for every head, and the softmax runs in runs of positions merged at the end (flash
// decoding's split). hd and hdv at most ATTN1_MAX_DIM, multiples of 16.
#define ATTN1_MAX_DIM 1024  // head dims genie_attn_rows_i8 takes (a row widened once into a buffer of this size)
#define ATTN1_MAX_GROUP 32  // query heads a KV head it takes (their lane sums a buffer of this many on the stack)
#define ATTN1_RUN 64        // positions a thread takes at a time (fixed: the sums do not depend on the threads)
// multiply-adds below which genie_attn_rows_i8 runs on one thread: sleeping threads take ~8 us to wake, one thread
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

static inline float red16(const float *a) {  // sixteen partial sums as a tree, not a chain of 16 dependent adds
    float s8[8], s4[4];
    for (int j = 0; j < 8; j++) s8[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) s4[j] = s8[j] + s8[j + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static inline float dot_f32(const float *a, const float *b, int64_t n) {  // n % 16 == 0
    float acc[16] = {0};  // sixteen partial sums: vectors of them, where one sum would be a chain of adds
    for (int64_t d = 0; d < n; d += 16)
        for (int i = 0; i < 16; i++) acc[i] += a[d + i] * b[d + i];
    return red16(acc);
}

// Positions [j0, j1) of KV head h for the `group` query heads qh: each head's scores less their maximum,
// exponentiated, summed (sum) and weighted into a partial output (o [group, hdv]); max their maximum.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

// The attention's vectors: 16 floats on AVX-512, 8 on AVX2; the operations below are the same on both
#if defined(__AVX512F__)
#define AW 16
typedef __m512 vf;
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ZERO _mm512_setzero_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MUL _mm512_mul_ps
#define V_MAX _mm512_max_ps
#define V_FMA _mm512_fmadd_ps
static inline vf v_widen(const int8_t *p) {  // AW int8 -> AW float
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline vf v_pow2(vf n) {  // 2^n for an integral n in a normal's range
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
// v[j]'s AW lanes summed into lane j of the result, for AW vectors: pairs within 128-bit chunks, then the chunks
// (45 instructions for 16 sums, where a sum a vector takes ~8)
static inline vf v_sums(const vf *v) {
    vf t[8], u[4];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const vf w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const vf w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}
#else
#define AW 8
typedef __m256 vf;
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MUL _mm256_mul_ps
#define V_MAX _mm256_max_ps
#define V_FMA _mm256_fmadd_ps
static inline vf v_widen(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf v_pow2(vf n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf v_sums(const vf *v) {  // the network above on 256 bits
    vf t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        u[i] = _mm256_add_ps(_mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}
#endif

static inline vf v_exp_le0(vf x) {  // exp_le0 of AW values, its operations in its order
    x = V_MAX(x, V_SET1(-87.0f));
    const vf big = V_SET1(12582912.0f);
    const vf n = V_SUB(V_ADD(V_MUL(x, V_SET1(1.44269504088896341f)), big), big);
    x = V_ADD(V_SUB(x, V_MUL(n, V_SET1(0.693359375f))), V_MUL(n, V_SET1(2.12194440e-4f)));
    const vf z = V_MUL(x, x);
    vf y = V_SET1(1.9875691500e-4f);
    y = V_ADD(V_MUL(y, x), V_SET1(1.3981999507e-3f));
    y = V_ADD(V_MUL(y, x), V_SET1(8.3334519073e-3f));
    y = V_ADD(V_MUL(y, x), V_SET1(4.1665795894e-2f));
    y = V_ADD(V_MUL(y, x), V_SET1(1.6666665459e-1f));
    y = V_ADD(V_MUL(y, x), V_SET1(5.0000001201e-1f));
    y = V_ADD(V_ADD(V_MUL(y, z), x), V_SET1(1.0f));
    return V_MUL(y, v_pow2(n));
}

#define ATTN_V_CHUNK (2 * AW)  // V dims a pass over the run's keys takes (the group's accumulators in registers)

// The plain form's operations (below) in vectors: AW keys' dot products with a head at once (a vector of lane
// sums a key, then v_sums), the softmax AW scores a vector, V a chunk of dims at a time with the heads'
// accumulators in registers.
static inline __attribute__((always_inline)) void attn1_part_of(
    const float *qh, const int8_t *k, const float *ks, const int8_t *v, const float *vs, int64_t j0, int64_t j1,
    int64_t h, int64_t n_kv, int64_t group, int64_t hd, int64_t hdv, float scale, float softcap, float *scores,
    float *o, float *max, float *sum) {
    const int64_t n = j1 - j0, kstride = n_kv * hd, vstride = n_kv * hdv, nc = hd / AW;
    for (int64_t b = 0; b < n; b += AW) {
        const int64_t m = n - b < AW ? n - b : AW;
        vf kf[ATTN1_MAX_DIM / AW], lanes[ATTN1_MAX_GROUP][AW];
        for (int64_t j = 0; j < AW; j++) {
            if (j >= m) {
                for (int64_t g = 0; g < group; g++) lanes[g][j] = V_ZERO();
                continue;
            }
            const int8_t *kr = k + (j0 + b + j) * kstride + h * hd;
            for (int64_t c = 0; c < nc; c++) kf[c] = v_widen(kr + AW * c);
            for (int64_t g = 0; g < group; g++) {
                const float *qg = qh + g * hd;
                vf acc = V_MUL(V_LOAD(qg), kf[0]);
                for (int64_t c = 1; c < nc; c++) acc = V_FMA(V_LOAD(qg + AW * c), kf[c], acc);
                lanes[g][j] = acc;
            }
        }
        float f[AW] = {0};
        for (int64_t j = 0; j < m; j++) f[j] = ks[(j0 + b + j) * n_kv + h];
        const vf fs = V_MUL(V_SET1(scale), V_LOAD(f));
        for (int64_t g = 0; g < group; g++) {
            float s[AW];
            if (m == AW && softcap == 0.0f) {  // a whole vector of scores, straight to its place
                V_STORE(scores + g * n + b, V_MUL(v_sums(lanes[g]), fs));
                continue;
            }
            V_STORE(s, V_MUL(v_sums(lanes[g]), fs));
            for (int64_t j = 0; j < m; j++) scores[g * n + b + j] = softcap != 0.0f ? softcap * tanhf(s[j] / softcap) : s[j];
        }
    }
    for (int64_t g = 0; g < group; g++) {  // AW scores a vector, a last partial one padded
        float *sg = scores + g * n, lane_max[AW], top = -INFINITY;
        vf mx = V_SET1(-INFINITY), total = V_ZERO();
        for (int64_t j = 0; j < n; j += AW) {
            if (j + AW <= n) {
                mx = V_MAX(mx, V_LOAD(sg + j));
                continue;
            }
            float x[AW];
            for (int64_t i = 0; i < AW; i++) x[i] = j + i < n ? sg[j + i] : -INFINITY;
            mx = V_MAX(mx, V_LOAD(x));
        }
        V_STORE(lane_max, mx);
        for (int i = 0; i < AW; i++) top = lane_max[i] > top ? lane_max[i] : top;
        const vf vtop = V_SET1(top);
        for (int64_t j = 0; j < n; j += AW) {
            if (j + AW <= n) {  // a whole vector: the same operations as below, without the per-lane copies
                float f[AW];
                for (int64_t i = 0; i < AW; i++) f[i] = vs[(j0 + j + i) * n_kv + h];
                const vf e = v_exp_le0(V_SUB(V_LOAD(sg + j), vtop));
                total = V_ADD(total, e);
                V_STORE(sg + j, V_MUL(e, V_LOAD(f)));
                continue;
            }
            float x[AW], f[AW] = {0}, e[AW];
            for (int64_t i = 0; i < AW; i++) x[i] = j + i < n ? sg[j + i] - top : 0.0f;
            for (int64_t i = 0; i < AW && j + i < n; i++) f[i] = vs[(j0 + j + i) * n_kv + h];
            V_STORE(e, v_exp_le0(V_LOAD(x)));
            for (int64_t i = n - j; i < AW; i++) e[i] = 0.0f;  // no position there
            total = V_ADD(total, V_LOAD(e));
            V_STORE(x, V_MUL(V_LOAD(e), V_LOAD(f)));
            for (int64_t i = 0; i < AW && j + i < n; i++) sg[j + i] = x[i];
        }
        float t16[16] = {0};
        V_STORE(t16, total);
        max[g] = top;
        sum[g] = red16(t16);
    }
    for (int64_t d0 = 0; d0 < hdv; d0 += ATTN_V_CHUNK) {
        const int64_t nv = hdv - d0 < ATTN_V_CHUNK ? (hdv - d0) / AW : ATTN_V_CHUNK / AW;
        vf acc[ATTN1_MAX_GROUP][ATTN_V_CHUNK / AW];
        for (int64_t g = 0; g < group; g++)
            for (int64_t c = 0; c < nv; c++) acc[g][c] = V_ZERO();
        for (int64_t j = 0; j < n; j++) {
            const int8_t *vr = v + (j0 + j) * vstride + h * hdv + d0;
            vf vv[ATTN_V_CHUNK / AW];
            for (int64_t c = 0; c < nv; c++) vv[c] = v_widen(vr + AW * c);
            for (int64_t g = 0; g < group; g++) {
                const vf p = V_SET1(scores[g * n + j]);
                for (int64_t c = 0; c < nv; c++) acc[g][c] = V_FMA(p, vv[c], acc[g][c]);
            }
        }
        for (int64_t g = 0; g < group; g++)
            for (int64_t c = 0; c < nv; c++) V_STORE(o + g * hdv + d0 + AW * c, acc[g][c]);
    }
}
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// the layouts of the models genie serves as constants (their loops unrolled, the accumulators in registers),
// any other as the arguments say: the same operations either way
static void attn1_part(const float *qh, const int8_t *k, const float *ks, const int8_t *v, const float *vs,
                       int64_t j0, int64_t j1, int64_t h, int64_t n_kv, int64_t group, int64_t hd, int64_t hdv,
                       float scale, float softcap, float *scores, float *o, float *max, float *sum) {
#define ATTN1_PART(G, D) attn1_part_of(qh, k, ks, v, vs, j0, j1, h, n_kv, G, D, D, scale, softcap, scores, o, max, sum)
    if (hd == hdv && group == 3 && hd == 64)  // SmolLM2
        ATTN1_PART(3, 64);
    else if (hd == hdv && group == 4 && hd == 256)  // Gemma 3 270M
        ATTN1_PART(4, 256);
    else if (hd == hdv && group == 2 && hd == 128)  // Qwen3 0.6B / 4B: 16 / 32 heads on 8
        ATTN1_PART(2, 128);
    else if (hd == hdv && group == 4 && hd == 128)
        ATTN1_PART(4, 128);
    else
        attn1_part_of(qh, k, ks, v, vs, j0, j1, h, n_kv, group, hd, hdv, scale, softcap, scores, o, max, sum);
#undef ATTN1_PART
}
#else
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
#endif

// Rows' attention over INT8 K/V rows ([positions, n_kv, hd], a scale per row and KV head, from the slot's first
// position): row i's query q[i] [n_heads, hd] over positions [lo[i], lo[i] + t[i]) into out[i] [n_heads, hdv].
// Each row's positions go in runs of ATTN1_RUN from its lo, every row's runs of every KV head on the pool's
// threads, then each row's and head's runs merged in order (their maxima to the largest): a row's sums are the
// same whatever the threads and whatever other rows the call holds, so a prompt's rows get a decode step's numbers
// (a conversation continued from its saved K/V recomputes its last token alone). Returns -1 when the partial
// results find no memory, -2 for more than ATTN1_MAX_GROUP query heads a KV head.
struct attn_job {
    const float *q, *ks, *vs;
    const int8_t *k, *v;
    const int64_t *lo, *t, *first;  // first[i]: row i's first part; first[n]: the parts
    int64_t n, n_kv, group, hd, hdv, per;
    float scale, softcap, *buf;
};

static inline int64_t attn_runs(int64_t t) { return (t + ATTN1_RUN - 1) / ATTN1_RUN; }

static void attn_claim(const void *ctx, int64_t p) {  // part p: a run of positions of one row's KV head
    const struct attn_job *j = ctx;
    int64_t i = 0;
    while (j->first[i + 1] <= p) i++;
    const int64_t runs = attn_runs(j->t[i]), h = (p - j->first[i]) / runs, r = (p - j->first[i]) % runs;
    const int64_t j0 = j->lo[i] + r * ATTN1_RUN, end = j->lo[i] + j->t[i], j1 = j0 + ATTN1_RUN < end ? j0 + ATTN1_RUN : end;
    float *scores = j->buf + p * j->per, *o = scores + j->group * ATTN1_RUN, *mx = o + j->group * j->hdv;
    attn1_part(j->q + (i * j->n_kv + h) * j->group * j->hd, j->k, j->ks, j->v, j->vs, j0, j1, h, j->n_kv, j->group,
               j->hd, j->hdv, j->scale, j->softcap, scores, o, mx, mx + j->group);
}

// Returns 0; -1 without memory; -2 for more than ATTN1_MAX_GROUP query heads a KV head; -3 for a row's positions
// not within [0, positions) of the slot or none (the rows' bounds are checked here, once, not by the caller).
int genie_attn_rows_i8(const float *q, const int8_t *k, const float *ks, const int8_t *v, const float *vs, int64_t n,
                       const int64_t *lo, const int64_t *t, int64_t positions, int64_t n_heads, int64_t n_kv,
                       int64_t hd, int64_t hdv, float scale, float softcap, float *out) {
    const int64_t group = n_heads / n_kv, per = group * (ATTN1_RUN + hdv + 2);  // a part's scores, output, max, sum
    if (group > ATTN1_MAX_GROUP) return -2;
    for (int64_t i = 0; i < n; i++)
        if (lo[i] < 0 || t[i] <= 0 || t[i] > positions - lo[i]) return -3;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(n + 1)), work = 0;
    if (first == NULL) return -1;
    first[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        first[i + 1] = first[i] + n_kv * attn_runs(t[i]);
        work += t[i];
    }
    float *buf = malloc(sizeof(float) * (size_t)(first[n] * per));
    if (buf == NULL) {
        free(first);
        return -1;
    }
    const struct attn_job job = {q, ks, vs, k, v, lo, t, first, n, n_kv, group, hd, hdv, per, scale, softcap, buf};
    if (work * n_heads * (hd + hdv) >= ATTN1_PARALLEL_MIN) {
        pool_run(attn_claim, &job, first[n]);
    } else {
        for (int64_t p = 0; p < first[n]; p++) attn_claim(&job, p);
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t runs = attn_runs(t[i]);
        for (int64_t h = 0; h < n_kv; h++)
            for (int64_t g = 0; g < group; g++) {
                const float *parts = buf + (first[i] + h * runs) * per;
                float top = -INFINITY, total = 0.0f;
                for (int64_t r = 0; r < runs; r++) {
                    const float m = parts[r * per + group * (ATTN1_RUN + hdv) + g];
                    top = m > top ? m : top;
                }
                float *og = out + ((i * n_kv + h) * group + g) * hdv;
                for (int64_t d = 0; d < hdv; d++) og[d] = 0.0f;
                for (int64_t r = 0; r < runs; r++) {
                    const float *part = parts + r * per + group * ATTN1_RUN;
                    const float w = exp_le0(part[group * hdv + g] - top);
                    total += part[group * hdv + group + g] * w;
                    for (int64_t d = 0; d < hdv; d++) og[d] += part[g * hdv + d] * w;
                }
                for (int64_t d = 0; d < hdv; d++) og[d] /= total;
            }
    }
    free(buf);
    free(first);
    return 0;
}

// ---- a layer's QKV rows into rotated q and an INT8 KV slot ----------------------------------------------------
// NumpyBackend.prepare_qkv and kv_write for INT8 K/V, for any number of rows (a prompt's and a decode step's rows
// the same numbers): each head of each row of qkv [n, (H + Hkv) * hd + Hkv * hdv] (q heads, k heads, v heads) taken
// on its own, q and k RMS-normed with their rows of qk_norm [H + Hkv, hd] (when given), rotated by RoPE over their
// first rope_dim values (neox: pairs (j, j + rope_dim / 2), else (2j, 2j + 1); cos and sin [n, rope_dim / 2], the
// rows' positions' angles), v normed without a weight (v_norm); then rotated into the rows INT8 K/V are stored in
// (kv_rotation, by butterflies: rotate_row), q into q_out [n, H, hd], k and v coded as int8
// with a scale a row and head (absmax / 127, rounded half to even: quantize_int8) into k, ks, v, vs at the slot's
// positions of these rows ([n, Hkv, hd] / [n, Hkv] from the first). RoPE's products are NumPy's (no fused
// multiply-adds: -std=c11 keeps them apart), the norms' sums and the rotations in a fixed order of their own.
// hd and hdv at most ATTN1_MAX_DIM.
static float rms_inv(const float *x, int64_t d, float eps) {  // 1 / sqrt(mean(x^2) + eps)
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= d; j += 16)
        for (int t = 0; t < 16; t++) acc[t] += x[j + t] * x[j + t];
    float ss = 0.0f;
    for (int t = 0; t < 16; t++) ss += acc[t];
    for (; j < d; j++) ss += x[j] * x[j];
    return 1.0f / sqrtf(ss * (1.0f / (float)d) + eps);
}

// x @ kv_rotation(d) in place: a normalized Sylvester-Hadamard matrix on each block of the largest power of two
// dividing d, as Walsh-Hadamard butterflies (d log d additions, where the product is d^2 multiply-adds)
static void rotate_row(float *x, int64_t d) {
    const int64_t block = d & -d;
    const float scale = (float)(1.0 / sqrt((double)block));  // kv_rotation's entries are +-this float
    for (int64_t b0 = 0; b0 < d; b0 += block)
        for (int64_t len = 1; len < block; len <<= 1)
            for (int64_t i = b0; i < b0 + block; i += 2 * len)
                for (int64_t t = i; t < i + len; t++) {
                    const float a = x[t], b = x[t + len];
                    x[t] = a + b;
                    x[t + len] = a - b;
                }
    for (int64_t j = 0; j < d; j++) x[j] *= scale;
}

static void code_row(const float *x, int64_t d, int8_t *q, float *scale) {  // quantize_int8 of one row
    float top = 0.0f;
    for (int64_t j = 0; j < d; j++) {
        const float a = fabsf(x[j]);
        top = a > top ? a : top;
    }
    const float s = top / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int64_t j = 0; j < d; j++) {
        float c = nearbyintf(x[j] * inv);
        c = c < -127.0f ? -127.0f : (c > 127.0f ? 127.0f : c);
        q[j] = (int8_t)c;
    }
    *scale = s;
}

struct qkv_job {
    const float *qkv, *qk_norm, *cos, *sin;
    int64_t H, Hkv, hd, hdv, rope_dim;
    float eps;
    int v_norm, neox;
    float *q_out, *ks, *vs;
    int8_t *k, *v;
};

static void qkv_row(const void *ctx, int64_t i) {
    const struct qkv_job *j = ctx;
    const int64_t H = j->H, Hkv = j->Hkv, hd = j->hd, hdv = j->hdv, half = j->rope_dim / 2;
    const float *row = j->qkv + i * ((H + Hkv) * hd + Hkv * hdv);
    const float *c = j->cos + i * half, *s = j->sin + i * half;
    float x[ATTN1_MAX_DIM];
    for (int64_t h = 0; h < H + Hkv; h++) {
        for (int64_t d = 0; d < hd; d++) x[d] = row[h * hd + d];
        if (j->qk_norm != NULL) {
            const float inv = rms_inv(x, hd, j->eps), *w = j->qk_norm + h * hd;
            for (int64_t d = 0; d < hd; d++) x[d] = x[d] * inv * w[d];
        }
        for (int64_t p = 0; p < half; p++) {
            const int64_t a = j->neox ? p : 2 * p, b = j->neox ? p + half : 2 * p + 1;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * c[p] - x1 * s[p];
            x[b] = x0 * s[p] + x1 * c[p];
        }
        rotate_row(x, hd);
        if (h < H) {
            float *q = j->q_out + (i * H + h) * hd;
            for (int64_t d = 0; d < hd; d++) q[d] = x[d];
        } else {
            code_row(x, hd, j->k + (i * Hkv + h - H) * hd, j->ks + i * Hkv + h - H);
        }
    }
    for (int64_t h = 0; h < Hkv; h++) {
        const float *src = row + (H + Hkv) * hd + h * hdv;
        for (int64_t d = 0; d < hdv; d++) x[d] = src[d];
        if (j->v_norm) {
            const float inv = rms_inv(x, hdv, j->eps);
            for (int64_t d = 0; d < hdv; d++) x[d] = x[d] * inv;
        }
        rotate_row(x, hdv);
        code_row(x, hdv, j->v + (i * Hkv + h) * hdv, j->vs + i * Hkv + h);
    }
}

void genie_qkv_i8(const float *qkv, int64_t n, int64_t H, int64_t Hkv, int64_t hd, int64_t hdv, const float *qk_norm,
                  float eps, int v_norm, const float *cos, const float *sin, int64_t rope_dim, int neox, float *q_out,
                  int8_t *k, float *ks, int8_t *v, float *vs) {
    const struct qkv_job job = {qkv, qk_norm, cos, sin, H, Hkv, hd, hdv, rope_dim, eps, v_norm, neox, q_out, ks, vs,
                                k, v};
    if (n * (H + 2 * Hkv) * hd * 16 >= PARALLEL_MIN_WORK) {
        pool_run(qkv_row, &job, n);
    } else {
        for (int64_t i = 0; i < n; i++) qkv_row(&job, i);
    }
}

// x [n, d] @ kv_rotation(d) in place, row by row (rotate_row's butterflies): the attention outputs' way back and
// whatever else NumpyBackend rotates, the same numbers for a row whatever rows share the call.
struct rotate_job {
    float *x;
    int64_t n, d;
};

static void rotate_claim(const void *ctx, int64_t item) {  // a claim: ROTATE_ROWS_A_CLAIM rows
    const struct rotate_job *j = ctx;
    for (int64_t i = item * ROTATE_ROWS_A_CLAIM; i < (item + 1) * ROTATE_ROWS_A_CLAIM && i < j->n; i++)
        rotate_row(j->x + i * j->d, j->d);
}

void genie_rotate_rows(float *x, int64_t n, int64_t d) {
    const struct rotate_job job = {x, n, d};
    const int64_t claims = (n + ROTATE_ROWS_A_CLAIM - 1) / ROTATE_ROWS_A_CLAIM;
    if (n * d * 8 >= PARALLEL_MIN_WORK) {
        pool_run(rotate_claim, &job, claims);
    } else {
        for (int64_t c = 0; c < claims; c++) rotate_claim(&job, c);
    }
}

// ---- the stream's norms and the FFN's gate, a row at a time ---------------------------------------------------
// NumpyBackend's rms_norm, add_rms_norm and gated_act for float32 rows: a decode token makes two norms and a gate a
// layer, each a handful of NumPy calls of ~1 us apiece on rows of a few hundred floats (bench/NOTES.md, CPU note
// 2026-12-07). The sums in rms_inv's order; a row's numbers do not depend on the other rows.

// h [n, d] = rms_norm(x + r) * w (r may be NULL: rms_norm(x) * w); with r, the sum goes to s [n, d] (may be x)
void genie_add_rms_norm(const float *x, const float *r, const float *w, int64_t n, int64_t d, float eps, float *s,
                        float *h) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        if (r != NULL) {
            float *si = s + i * d;
            const float *ri = r + i * d;
            for (int64_t j = 0; j < d; j++) si[j] = xi[j] + ri[j];
            xi = si;
        }
        const float inv = rms_inv(xi, d, eps);
        float *hi = h + i * d;
        for (int64_t j = 0; j < d; j++) hi[j] = xi[j] * inv * w[j];
    }
}

static inline float tanh_of(float x) {  // (1 - e^-2|x|) / (1 + e^-2|x|), signed: exp_le0's arithmetic, a vector
    const float t = exp_le0(-2.0f * fabsf(x)), y = (1.0f - t) / (1.0f + t);
    return x < 0.0f ? -y : y;
}

// out [n, f] = act(gate) * up for gate_up [n, 2f] (a row's gate, then its up); kind 0: silu as x (1 + tanh(x / 2)) / 2,
// 1: gelu_tanh; returns -1 for another kind
int genie_gated_act(const float *gate_up, int64_t n, int64_t f, int kind, float *out) {
    if (kind != 0 && kind != 1) return -1;
    for (int64_t i = 0; i < n; i++) {
        const float *g = gate_up + i * 2 * f, *u = g + f;
        float *o = out + i * f;
        if (kind == 0) {
            for (int64_t j = 0; j < f; j++) o[j] = g[j] * (0.5f + 0.5f * tanh_of(0.5f * g[j])) * u[j];
        } else {
            for (int64_t j = 0; j < f; j++) {
                const float x = g[j], inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
                o[j] = 0.5f * x * (1.0f + tanh_of(inner)) * u[j];
            }
        }
    }
    return 0;
}

// ---- a layer's attention from its QKV rows, in one call ----------------------------------------------------------
// genie_qkv_i8 (q, and k and v into the slot's INT8 pools at positions pos0..), then each row's attention over the
// positions it sees (genie_attn_rows_i8: [max(0, p - window + 1), p + 1) with a window, else [0, p + 1)), in calls
// of ATTEND_ROWS rows (which bound the partial sums' buffer, not the numbers), then the output turned back
// (genie_rotate_rows) into out [n, H, hdv]: NumpyBackend.self_attention's three calls and the NumPy between them
// as one (a decode token made them ~30 times). k, ks, v, vs: the slot's rows from position 0, `positions` of them.
// Returns 0, or genie_attn_rows_i8's -1 / -2, or -3 for rows past the slot's positions (nothing written then).
#define ATTEND_ROWS 32
int genie_attend_i8(const float *qkv, int64_t n, int64_t H, int64_t Hkv, int64_t hd, int64_t hdv,
                    const float *qk_norm, float eps, int v_norm, const float *cos, const float *sin, int64_t rope_dim,
                    int neox, int8_t *k, float *ks, int8_t *v, float *vs, int64_t pos0, int64_t positions,
                    int64_t window, float scale, float softcap, float *out) {
    if (Hkv <= 0 || H % Hkv != 0 || H / Hkv > ATTN1_MAX_GROUP) return -2;
    if (pos0 < 0 || n < 0 || n > positions - pos0) return -3;
    float *q = malloc(sizeof(float) * (size_t)(n * H * hd + 1));
    int64_t *lo = malloc(sizeof(int64_t) * 2 * ATTEND_ROWS);
    if (q == NULL || lo == NULL) {
        free(q);
        free(lo);
        return -1;
    }
    int64_t *t = lo + ATTEND_ROWS;
    genie_qkv_i8(qkv, n, H, Hkv, hd, hdv, qk_norm, eps, v_norm, cos, sin, rope_dim, neox, q, k + pos0 * Hkv * hd,
                 ks + pos0 * Hkv, v + pos0 * Hkv * hdv, vs + pos0 * Hkv);
    int rc = 0;
    for (int64_t a = 0; a < n && rc == 0; a += ATTEND_ROWS) {
        const int64_t m = n - a < ATTEND_ROWS ? n - a : ATTEND_ROWS;
        for (int64_t i = 0; i < m; i++) {
            const int64_t p = pos0 + a + i;
            lo[i] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            t[i] = p + 1 - lo[i];
        }
        rc = genie_attn_rows_i8(q + a * H * hd, k, ks, v, vs, m, lo, t, positions, H, Hkv, hd, hdv, scale, softcap,
                                out + a * H * hdv);
    }
    if (rc == 0) genie_rotate_rows(out, n * H, hdv);
    free(q);
    free(lo);
    return rc;
}

// ---- a norm and the product it feeds, in one call ----------------------------------------------------------------
// Backend.add_norm_matmul: s = x + r (r may be NULL: s is x), y = (rms_norm(s) * norm) @ w.T through
// genie_gq_products (grouped: kind 0) or genie_blk_gemv (int8 rows: kind 1), the normed rows in a buffer of its
// own; the same numbers as genie_add_rms_norm and then the product. Returns the product's -1 without memory.
int genie_norm_products(const float *x, const float *r, const float *norm, float eps, float *s, int64_t n, int64_t K,
                        int kind, const void *w, const void *scale, const void *offset, int64_t bs, int high, int half,
                        float *y, int64_t rows) {
    float *h = malloc(sizeof(float) * (size_t)(n * K + 1));
    if (h == NULL) return -1;
    genie_add_rms_norm(x, r, norm, n, K, eps, r != NULL ? s : NULL, h);
    const int rc = kind == 0 ? genie_gq_products(w, scale, offset, K, h, n, y, rows, high, half)
                             : genie_blk_gemv(w, scale, offset, K, bs, h, n, y, rows, half);
    free(h);
    return rc;
}

// Backend.gated_matmul: y = genie_gated_act(gate_up, kind) @ w.T (kinds and product as genie_norm_products'), the
// gated rows in a buffer of its own. Returns -1 without memory, -2 for an unknown kind.
int genie_gated_products(const float *gate_up, int64_t n, int64_t f, int act, int kind, const void *w,
                         const void *scale, const void *offset, int64_t bs, int high, int half, float *y, int64_t rows) {
    float *g = malloc(sizeof(float) * (size_t)(n * f + 1));
    if (g == NULL) return -1;
    int rc = genie_gated_act(gate_up, n, f, act, g) ? -2 : 0;
    if (rc == 0)
        rc = kind == 0 ? genie_gq_products(w, scale, offset, f, g, n, y, rows, high, half)
                       : genie_blk_gemv(w, scale, offset, f, bs, g, n, y, rows, half);
    free(g);
    return rc;
}
