// Decode attention (one query token) of the G query heads that share a KV head (GQA), over one slot's
// K/V pools: the body of attention.cu's attention_gqa kernels.
// common.cuh and kv_rows.cuh come first in the module.
#define TILE 32
#define KV_ANY 0  // gqa_attend's KV template argument: the pools' type read at run time (k_scale set: INT8)
#define KV_INT8 1
#define KV_F16 2

// N bytes (1, 2, 4, 8, 16 or 32; aligned) at p into w[0, ceil(N / 4)).
template <int N>
__device__ __forceinline__ void load_bytes(const void* p, unsigned* w) {
    if constexpr (N == 1) w[0] = *reinterpret_cast<const unsigned char*>(p);
    else if constexpr (N == 2) w[0] = *reinterpret_cast<const unsigned short*>(p);
    else if constexpr (N == 4) w[0] = *reinterpret_cast<const unsigned*>(p);
    else if constexpr (N == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x, w[1] = v.y;
    } else {  // 16 bytes a load: an FP16 row's 32 (a lane's 16 dims of a 512-dim head) in two
        static_assert(N % 16 == 0 && N <= 32, "1, 2, 4, 8, 16 or 32 bytes");
#pragma unroll
        for (int c = 0; c < N / 16; ++c) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[c];
            w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
        }
    }
}

__device__ __forceinline__ float dot16_i8(const int4 w, const float* q) {  // 16 int8 against q[0, 16)
    const int v[4] = {w.x, w.y, w.z, w.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 qq = *reinterpret_cast<const float4*>(q + 4 * i);
        s += qq.x * (float)(signed char)(v[i]) + qq.y * (float)(signed char)(v[i] >> 8) +
             qq.z * (float)(signed char)(v[i] >> 16) + qq.w * (float)(signed char)(v[i] >> 24);
    }
    return s;
}
__device__ __forceinline__ float dot8_f16(const uint4 w, const float* q) {  // 8 halves against q[0, 8)
    const unsigned v[4] = {w.x, w.y, w.z, w.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v[i]));
        s += q[2 * i] * f.x + q[2 * i + 1] * f.y;
    }
    return s;
}

// A lane's DPL values of V row vrow (DPL bytes for INT8, 2 DPL for FP16) as raw words.
template <int DPL>
__device__ __forceinline__ void load_v_row(const void* v_pool, long long vrow, int lane, bool int8, unsigned* raw) {
    constexpr int HD = 32 * DPL;
    if (int8) load_bytes<DPL>(reinterpret_cast<const signed char*>(v_pool) + vrow * HD + lane * DPL, raw);
    else load_bytes<2 * DPL>(reinterpret_cast<const __half*>(v_pool) + vrow * HD + lane * DPL, raw);
}
// acc[g] += p[g] of the key whose weight lane `src` holds, times that key's V values (raw, load_v_row's).
template <int G, int DPL>
__device__ __forceinline__ void accumulate_v(float (&acc)[G][DPL], const float (&p)[G], const unsigned* raw, int src,
                                             bool int8) {
    float v[DPL];
#pragma unroll
    for (int e = 0; e < DPL; ++e)
        v[e] = int8 ? (float)(signed char)(raw[e >> 2] >> (8 * (e & 3)))
                    : __half2float(__ushort_as_half((unsigned short)(raw[e >> 1] >> (16 * (e & 1)))));
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float pj = __shfl_sync(FULL, p[g], src);
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[g][e] += pj * v[e];
    }
}

// Attention of the G query heads that share KV head kvh, over keys [j0, j1] (none when j0 > j1) of one
// slot's pools, in two steps: a scan, in which each of the block's first WARPS warps keeps an online softmax
// (max m and sum l per head, warp-uniform) and an unnormalized accumulator (each lane DPL adjacent dims of
// every head), then gqa_merge. The queries are in qs [G * HD] (shared memory; rotated for INT8 KV). KV
// fixes the pools' type at compile time (KV_INT8 / KV_F16: one path compiled) or leaves it to k_scale
// (KV_ANY).
template <int G, int DPL>
__device__ __forceinline__ void gqa_init(float (&acc)[G][DPL], float (&m)[G], float (&l)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[g][e] = 0.f;
    }
}

// Scan, a key a lane: the warps take tiles of TILE keys in turn; every lane scores one key for all G heads
// (its whole K row in 16-byte loads), and accumulates its DPL dims of every head from the tile's V rows, so
// each K and V row is loaded once for the G heads that read it.
template <int G, int DPL, int WARPS, int KV>
__device__ void gqa_scan_tiles(const float* qs, const void* k_pool, const void* v_pool, const float* k_scale,
                               const float* v_scale, int n_kv, int kvh, int j0, int j1, float scale, float softcap,
                               float (&acc)[G][DPL], float (&m)[G], float (&l)[G]) {
    constexpr int HD = 32 * DPL;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool int8 = KV == KV_ANY ? k_scale != nullptr : KV == KV_INT8;
    __builtin_assume(__isGlobal(k_pool) && __isGlobal(v_pool) && __isShared(qs));  // direct loads, not generic
    gqa_init(acc, m, l);
    // a lane's DPL values of a V row: DPL (INT8) or 2 DPL (FP16) bytes, as VW words; VB keys' rows are loaded
    // before any is used, so their latencies overlap (one key at a time, each waited a whole load)
    constexpr int VW = (2 * DPL + 3) / 4, VB = 32 / VW > 16 ? 16 : 32 / VW;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[g][e] = 0.f;
    }
    for (int base = j0 + warp * TILE; warp < WARPS && base <= j1; base += WARPS * TILE) {
        const int j = base + lane;
        const bool live = j <= j1;
        const long long krow = (long long)j * n_kv + kvh;
        float ks = 1.f, vs = 1.f;
        if (int8 && live) ks = k_scale[krow], vs = v_scale[krow];  // issued before the K loads
        float s[G];
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = 0.f;
        if (live) {
            if (int8) {
                const int4* kr = reinterpret_cast<const int4*>(reinterpret_cast<const signed char*>(k_pool) + krow * HD);
#pragma unroll
                for (int c = 0; c < HD / 16; ++c) {
                    const int4 w = kr[c];
#pragma unroll
                    for (int g = 0; g < G; ++g) s[g] += dot16_i8(w, qs + g * HD + 16 * c);
                }
            } else {
                const uint4* kr = reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(k_pool) + krow * HD);
#pragma unroll
                for (int c = 0; c < HD / 8; ++c) {
                    const uint4 w = kr[c];
#pragma unroll
                    for (int g = 0; g < G; ++g) s[g] += dot8_f16(w, qs + g * HD + 8 * c);
                }
            }
        }
        float p[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float v = NEG_INF;
            if (live) {
                v = s[g] * scale * ks;
                if (softcap > 0.f) v = softcap * tanhf(v / softcap);
            }
            const float m_new = fmaxf(m[g], warp_max(v));  // lane 0's key is live: finite
            const float corr = __expf(m[g] - m_new);
            p[g] = live ? __expf(v - m_new) : 0.f;
            l[g] = l[g] * corr + warp_sum(p[g]);
            m[g] = m_new;
            p[g] *= vs;
#pragma unroll
            for (int e = 0; e < DPL; ++e) acc[g][e] *= corr;
        }
        const int n_keys = min(TILE, j1 - base + 1);
        for (int jj0 = 0; jj0 < n_keys; jj0 += VB) {
            unsigned raw[VB][VW];
#pragma unroll
            for (int k = 0; k < VB; ++k)  // rows past n_keys read the last live one (its weight below is 0)
                load_v_row<DPL>(v_pool, (long long)(base + min(jj0 + k, n_keys - 1)) * n_kv + kvh, lane, int8, raw[k]);
#pragma unroll
            for (int k = 0; k < VB; ++k) accumulate_v<G, DPL>(acc, p, raw[k], (jj0 + k) & 31, int8);
        }
    }
}

__device__ __forceinline__ float dot8_i8(const uint2 w, const float* q) {  // 8 int8 against q[0, 8)
    const float4 a = *reinterpret_cast<const float4*>(q), b = *reinterpret_cast<const float4*>(q + 4);
    return a.x * (float)(signed char)w.x + a.y * (float)(signed char)(w.x >> 8) + a.z * (float)(signed char)(w.x >> 16) +
           a.w * (float)(signed char)(w.x >> 24) + b.x * (float)(signed char)w.y + b.y * (float)(signed char)(w.y >> 8) +
           b.z * (float)(signed char)(w.y >> 16) + b.w * (float)(signed char)(w.y >> 24);
}

// A task's softmax step for 8 keys scored by quads (lane (k, q): key k's partial score of quarter q in s):
// the quad's sums, the warp's max and sum, the accumulators rescaled; p gets each key's weight times its V
// scale vs (0 for a dead key); ks is its K scale.
template <int G, int DPL>
__device__ __forceinline__ void quad_softmax(float (&s)[G], bool live, float scale, float ks, float vs, float softcap,
                                             int qd,
                                             float (&acc)[G][DPL], float (&m)[G], float (&l)[G], float (&p)[G]) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
        s[g] += __shfl_xor_sync(FULL, s[g], 1);
        s[g] += __shfl_xor_sync(FULL, s[g], 2);  // the quad's sum, in each of its lanes
        float v = NEG_INF;
        if (live) {
            v = s[g] * scale * ks;
            if (softcap > 0.f) v = softcap * tanhf(v / softcap);
        }
        const float m_new = fmaxf(m[g], warp_max(v));  // the task's first key is live: finite
        const float corr = __expf(m[g] - m_new);
        p[g] = live ? __expf(v - m_new) : 0.f;
        l[g] = l[g] * corr + warp_sum(qd == 0 ? p[g] : 0.f);  // one lane per key
        m[g] = m_new;
        p[g] *= vs;
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[g][e] *= corr;
    }
}

// Scan, 8 keys a warp at a time (the fused decode step): each warp takes tasks of 8 consecutive keys in
// turn. Lane (k, q) = (lane / 4, lane % 4) scores key k of the task against quarter q of the heads' dims
// (HD / 4), so a key's dot products are 4 short chains instead of one long one, the quad sums them, the
// warp's softmax takes the 8 keys at once, and each lane accumulates its DPL dims of every head from the 8
// V rows. Latency, not throughput, bounds a decode step's attention: this finishes a task in a fraction of
// a key-per-lane tile's time.
template <int G, int DPL, int WARPS, int KV>
__device__ void gqa_scan_quads(const float* qs, const void* k_pool, const void* v_pool, const float* k_scale,
                               const float* v_scale, int n_kv, int kvh, int j0, int j1, float scale, float softcap,
                               float (&acc)[G][DPL], float (&m)[G], float (&l)[G]) {
    constexpr int HD = 32 * DPL, QD = HD / 4, VW = (2 * DPL + 3) / 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kk = lane >> 2, qd = lane & 3;
    const bool int8 = KV == KV_ANY ? k_scale != nullptr : KV == KV_INT8;
    __builtin_assume(__isGlobal(k_pool) && __isGlobal(v_pool) && __isShared(qs));
    gqa_init(acc, m, l);
    for (int base = j0 + 8 * warp; warp < WARPS && base <= j1; base += 8 * WARPS) {
        const bool live = base + kk <= j1;
        const long long krow = (long long)min(base + kk, j1) * n_kv + kvh;  // dead keys read a live row
        float ks = 1.f, vs = 1.f;
        if (int8) ks = k_scale[krow], vs = v_scale[krow];
        float s[G];
#pragma unroll
        for (int g = 0; g < G; ++g) s[g] = 0.f;
        const float* qq = qs + qd * QD;
        if (int8) {
            const uint2* kr = reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(k_pool) + krow * HD + qd * QD);
            uint2 w[QD / 8];
#pragma unroll
            for (int c = 0; c < QD / 8; ++c) w[c] = kr[c];
#pragma unroll
            for (int c = 0; c < QD / 8; ++c)
#pragma unroll
                for (int g = 0; g < G; ++g) s[g] += dot8_i8(w[c], qq + g * HD + 8 * c);
        } else {
            const uint4* kr = reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(k_pool) + krow * HD + qd * QD);
            uint4 w[QD / 8];
#pragma unroll
            for (int c = 0; c < QD / 8; ++c) w[c] = kr[c];
#pragma unroll
            for (int c = 0; c < QD / 8; ++c)
#pragma unroll
                for (int g = 0; g < G; ++g) s[g] += dot8_f16(w[c], qq + g * HD + 8 * c);
        }
        // V rows of the task's keys (this lane's dims), loaded while the softmax runs
        unsigned raw[8][VW];
#pragma unroll
        for (int k = 0; k < 8; ++k) load_v_row<DPL>(v_pool, (long long)min(base + k, j1) * n_kv + kvh, lane, int8, raw[k]);
        float p[G];
        quad_softmax<G, DPL>(s, live, scale, ks, vs, softcap, qd, acc, m, l, p);
#pragma unroll
        for (int k = 0; k < 8; ++k) accumulate_v<G, DPL>(acc, p, raw[k], 4 * k, int8);  // p is 0 for a dead key
    }
}

// The warps' states merged in shared memory. With one split the block writes the G normalized heads,
// rotated back (INT8), to out [G * HD]; with more it writes its partial max, sum and (unnormalized)
// accumulator to part_m / part_l [rows, n_splits] and part_acc [rows, n_splits, HD] at rows q_row0.., and
// the group's last block to finish (counted in *done, zero between launches, reset by that block) merges
// every split into out. qs is reused for the output row. Needs n_splits <= 32 and every thread of the
// block; WARPS * G * HD floats of static shared memory.
template <int G, int DPL, int WARPS>
__device__ void gqa_merge(float (&acc)[G][DPL], float (&m)[G], float (&l)[G], float* qs, bool int8, int blk,
                          long long q_row0, int split, int n_splits, float* part_m, float* part_l, float* part_acc,
                          int* done, float* out) {
    constexpr int HD = 32 * DPL;
    __shared__ float accs[WARPS][G * HD];
    __shared__ float ms[WARPS][G], ls[WARPS][G];
    __shared__ float wsp[G][2 * 32 + 1];  // the last block's merge: per split max then weight, sum; l_all
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0 && warp < WARPS)
#pragma unroll
        for (int g = 0; g < G; ++g) ms[warp][g] = m[g], ls[warp][g] = l[g];
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G && warp < WARPS; ++g) {
        float m_all = NEG_INF;
        for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, ms[w][g]);
        const float f = m[g] == NEG_INF ? 0.f : __expf(m[g] - m_all);
#pragma unroll
        for (int e = 0; e < DPL; ++e) accs[warp][g * HD + lane * DPL + e] = acc[g][e] * f;
    }
    __syncthreads();
    // per head: the merged max and sum over the warps (every thread computes them; G * 8 values)
    float m_all[G], l_all[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m_all[g] = NEG_INF, l_all[g] = 0.f;
        for (int w = 0; w < WARPS; ++w) m_all[g] = fmaxf(m_all[g], ms[w][g]);
        for (int w = 0; w < WARPS; ++w)
            if (ms[w][g] != NEG_INF) l_all[g] += ls[w][g] * __expf(ms[w][g] - m_all[g]);
    }
    if (n_splits > 1) {
        for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
            float sum = 0.f;
            for (int w = 0; w < WARPS; ++w) sum += accs[w][i];
            part_acc[((q_row0 + i / HD) * n_splits + split) * HD + i % HD] = sum;
        }
        if (threadIdx.x < G) {
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (g == threadIdx.x) {
                    part_m[(q_row0 + g) * n_splits + split] = m_all[g];
                    part_l[(q_row0 + g) * n_splits + split] = l_all[g];
                }
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            last = atomicAdd(done, 1) == n_splits - 1;
            if (last) *done = 0;  // ready for the next launch (a graph replays this one)
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        // every split's max and sum at once into shared memory, then per head the split weights
        for (int i = threadIdx.x; i < G * n_splits; i += blockDim.x) {
            const int g = i / n_splits, sp = i % n_splits;
            wsp[g][sp] = __ldcg(part_m + (q_row0 + g) * n_splits + sp);
            wsp[g][32 + sp] = __ldcg(part_l + (q_row0 + g) * n_splits + sp);
        }
        __syncthreads();
        if (warp < G) {
            float mx = NEG_INF;
            for (int sp = lane; sp < n_splits; sp += 32) mx = fmaxf(mx, wsp[warp][sp]);
            mx = warp_max(mx);
            float lsum = 0.f;
            for (int sp = lane; sp < n_splits; sp += 32) {
                const float w = wsp[warp][sp] == NEG_INF ? 0.f : __expf(wsp[warp][sp] - mx);
                wsp[warp][sp] = w;
                lsum += wsp[warp][32 + sp] * w;
            }
            lsum = warp_sum(lsum);
            if (lane == 0) wsp[warp][64] = lsum;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
            const int g = i / HD, c = i % HD;
            float sum = 0.f;
#pragma unroll 8
            for (int sp = 0; sp < n_splits; ++sp) sum += __ldcg(part_acc + ((q_row0 + g) * n_splits + sp) * HD + c) * wsp[g][sp];
            qs[i] = sum / wsp[g][64];
        }
    } else {
        for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
            float sum = 0.f;
            for (int w = 0; w < WARPS; ++w) sum += accs[w][i];
            float la = 0.f;
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (g == i / HD) la = l_all[g];
            qs[i] = sum / la;
        }
    }

    if (int8) fwht(qs, G * HD, blk);  // back from the rotation (V's blk equals K's: hd == hdv)
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) out[i] = qs[i];
}

// The whole of it, a key a lane (attention.cu's attention_gqa kernels).
template <int G, int DPL, int WARPS, int KV = KV_ANY>
__device__ void gqa_attend(float* qs, const void* k_pool, const void* v_pool, const float* k_scale,
                           const float* v_scale, int n_kv, int kvh, int j0, int j1, float scale, float softcap,
                           int blk, long long q_row0, int split, int n_splits, float* part_m, float* part_l,
                           float* part_acc, int* done, float* out) {
    float acc[G][DPL], m[G], l[G];
    gqa_scan_tiles<G, DPL, WARPS, KV>(qs, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, j0, j1, scale, softcap, acc, m, l);
    gqa_merge<G, DPL, WARPS>(acc, m, l, qs, KV == KV_ANY ? k_scale != nullptr : KV == KV_INT8, blk, q_row0, split,
                             n_splits, part_m, part_l, part_acc, done, out);
}
