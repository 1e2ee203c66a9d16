// Attention over the KV pool (the CuPy backend's attention.py launches these): split-K attention over a slot's
// keys, the few-token GQA kernel, attention_dec / attention_decn (a cluster of blocks a KV head, q/k norm, RoPE
// and the K/V store in the same launch) and the tensor-core prefill kernel. common.cuh, kv_rows.cuh, attend.cuh
// and layer_ops.cu come first in this module (backends/cupy/kernels.py: OPS_SOURCES).

// Causal attention of q [n_tok, n_heads, hd] (positions pos0 + t) over the slot's keys [lo, pos0 + t],
// lo = pos0 + t - window + 1 when window > 0. K/V pools [n_ctx, n_kv, hd(v)] (the staged slot's: AT_SLOT), INT8 with scales (rotated:
// q is rotated alike and the output rotated back) or FP16. Grid (n_tok * n_heads, n_splits): each block
// takes one contiguous share of its query's keys (split-K, "flash decoding"); its 8 warps take tiles of
// 32 keys in turn. In a tile every lane scores one key (its whole K row in 16-byte loads against q in
// shared memory), the warp updates its online softmax once per tile, then accumulates the tile's V rows,
// each lane owning 4 adjacent output dims, so one V row is one coalesced load. The warps then merge. With
// one split the block writes the output [n_tok, n_heads, hdv]; with more it writes its partial max, sum
// and (unnormalized) accumulator to part_m / part_l [rows, n_splits] and part_acc [rows, n_splits, hdv],
// and the row's last block to finish (counted in done[row], zero between launches) merges them and
// writes the output. Needs hd % 16 == 0 and hdv % 4 == 0.
#define ATT_WARPS 8
#define MAX_HD 512

extern "C" __global__ void attention(const float* q, const void* k_pool, const void* v_pool, const float* k_scale,
                                     const float* v_scale, float* out, float* part_m, float* part_l, float* part_acc,
                                     int* done, int n_heads, int n_kv, int hd, int hdv, int blk, int blk_v, const int* pos0p, int window,
                                     float scale, float softcap, long long k_slot, long long v_slot, long long s_slot) {
    AT_SLOT(pos0p, k_pool, v_pool, k_scale, v_scale, k_slot, v_slot, s_slot);
    GRID_DEP_START();
    __shared__ __align__(16) float qs[MAX_HD];
    __shared__ float accs[ATT_WARPS][MAX_HD];
    __shared__ float ms[ATT_WARPS], ls[ATT_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x;  // t * n_heads + h
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int t = row / n_heads, h = row % n_heads, kvh = h / (n_heads / n_kv);
    const int qpos = *pos0p + t;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int share = (qpos - lo + n_splits) / n_splits;  // ceil((qpos - lo + 1) / n_splits)
    const int j0 = lo + split * share, j1 = min(qpos, j0 + share - 1);
    const bool int8 = k_scale != nullptr;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(long long)row * hd + i];
    if (int8) fwht(qs, hd, blk);
    __syncthreads();
    const int n_v4 = (hdv / 4 + 31) / 32;  // groups of 4 dims per lane: dims 4 * lane + 128 * i + e
    float acc[MAX_HD / 128][4];
#pragma unroll
    for (int i = 0; i < MAX_HD / 128; ++i)
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int base = j0 + warp * TILE; base <= j1; base += ATT_WARPS * TILE) {
        const int j = base + lane;
        const bool live = j <= j1;
        const long long krow = (long long)j * n_kv + kvh;
        float s = NEG_INF;
        if (live) {
            float d = 0.f;
            // unrolled so that a lane's loads of its key row are in flight together (hd is a runtime value)
            if (int8) {
                const int4* kr = reinterpret_cast<const int4*>(reinterpret_cast<const signed char*>(k_pool) + krow * hd);
#pragma unroll 8
                for (int c = 0; c < hd / 16; ++c) d += dot16_i8(kr[c], qs + 16 * c);
                s = d * scale * k_scale[krow];
            } else {
                const uint4* kr = reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(k_pool) + krow * hd);
#pragma unroll 8
                for (int c = 0; c < hd / 8; ++c) d += dot8_f16(kr[c], qs + 8 * c);
                s = d * scale;
            }
            if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        }
        const float m_new = fmaxf(m, warp_max(s));  // lane 0's key is live: finite
        const float corr = __expf(m - m_new);
        float p = live ? __expf(s - m_new) : 0.f;
        l = l * corr + warp_sum(p);
        m = m_new;
        if (int8 && live) p *= v_scale[krow];
#pragma unroll
        for (int i = 0; i < MAX_HD / 128; ++i)
            for (int e = 0; e < 4; ++e) acc[i][e] *= corr;
        const int n_keys = min(TILE, j1 - base + 1);
#pragma unroll 16
        for (int jj = 0; jj < n_keys; ++jj) {
            const float pj = __shfl_sync(FULL, p, jj);
            const long long vrow = (long long)(base + jj) * n_kv + kvh;
#pragma unroll
            for (int i = 0; i < MAX_HD / 128; ++i) {
                const int c = 4 * lane + 128 * i;
                if (i < n_v4 && c < hdv) {
                    float v[4];
                    if (int8) {
                        const int w = *reinterpret_cast<const int*>(reinterpret_cast<const signed char*>(v_pool) + vrow * hdv + c);
                        for (int e = 0; e < 4; ++e) v[e] = (float)(signed char)(w >> (8 * e));
                    } else {
                        const uint2 w = *reinterpret_cast<const uint2*>(reinterpret_cast<const __half*>(v_pool) + vrow * hdv + c);
                        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
                        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
                        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
                    }
                    for (int e = 0; e < 4; ++e) acc[i][e] += pj * v[e];
                }
            }
        }
    }
    if (lane == 0) {
        ms[warp] = m;
        ls[warp] = l;
    }
    __syncthreads();
    float m_all = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) m_all = fmaxf(m_all, ms[w]);
    const float f = (m == NEG_INF) ? 0.f : __expf(m - m_all);
#pragma unroll
    for (int i = 0; i < MAX_HD / 128; ++i) {
        const int c = 4 * lane + 128 * i;
        if (i < n_v4 && c < hdv)
            for (int e = 0; e < 4; ++e) accs[warp][c + e] = acc[i][e] * f;
    }
    __syncthreads();
    float l_all = 0.f;
    for (int w = 0; w < ATT_WARPS; ++w) l_all += (ms[w] == NEG_INF) ? 0.f : ls[w] * __expf(ms[w] - m_all);
    if (n_splits > 1) {
        const long long p = (long long)row * n_splits + split;
        for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
            float s = 0.f;
            for (int w = 0; w < ATT_WARPS; ++w) s += accs[w][c];
            part_acc[p * hdv + c] = s;
        }
        if (threadIdx.x == 0) {
            part_m[p] = m_all;
            part_l[p] = l_all;
        }
        // the row's last block to finish merges every split's partials (threadFenceReduction's pattern)
        __shared__ bool last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            last = atomicAdd(&done[row], 1) == n_splits - 1;
            if (last) done[row] = 0;  // ready for the next launch (a graph replays this one)
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        // every split's max and sum at once into shared memory (accs is free now), then each split's weight
        float* wsp = &accs[0][0];  // [0, 64) maxes then weights exp(m_sp - m_all), [64, 128) sums, [128] l_all
        const long long p0 = (long long)row * n_splits;
        if (threadIdx.x < n_splits) {
            wsp[threadIdx.x] = __ldcg(part_m + p0 + threadIdx.x);
            wsp[64 + threadIdx.x] = __ldcg(part_l + p0 + threadIdx.x);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            float mx = NEG_INF;
            for (int sp = threadIdx.x; sp < n_splits; sp += 32) mx = fmaxf(mx, wsp[sp]);
            mx = warp_max(mx);
            float lsum = 0.f;
            for (int sp = threadIdx.x; sp < n_splits; sp += 32) {
                const float w = wsp[sp] == NEG_INF ? 0.f : __expf(wsp[sp] - mx);
                wsp[sp] = w;
                lsum += wsp[64 + sp] * w;
            }
            lsum = warp_sum(lsum);
            if (threadIdx.x == 0) wsp[128] = lsum;
        }
        __syncthreads();
        l_all = wsp[128];
        for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
            float acc_c = 0.f;
#pragma unroll 8
            for (int sp = 0; sp < n_splits; ++sp) acc_c += __ldcg(part_acc + (p0 + sp) * hdv + c) * wsp[sp];
            qs[c] = acc_c / l_all;
        }
    } else {
        // reuse qs as the merged output row
        for (int c = threadIdx.x; c < hdv; c += blockDim.x) {
            float s = 0.f;
            for (int w = 0; w < ATT_WARPS; ++w) s += accs[w][c];
            qs[c] = s / l_all;
        }
    }
    if (int8) fwht(qs, hdv, blk_v);
    __syncthreads();
    for (int c = threadIdx.x; c < hdv; c += blockDim.x) out[(long long)row * hdv + c] = qs[c];
}

// Decode attention with the query heads of a KV head together (GQA): grid (n_tok * n_kv, n_splits), block
// ATT_WARPS warps, the body gqa_attend (attend.cuh). Each block loads its G heads' queries (rotated for
// INT8) and takes one contiguous share of the keys; the output is [n_tok, n_heads, hd] as attention's.
// Needs hd == hdv == 32 DPL and G * hd <= 1024; done[t * n_kv + kvh] counts a group's splits.
template <int G, int DPL>
__device__ void attention_gqa(const float* q, const void* k_pool, const void* v_pool, const float* k_scale,
                              const float* v_scale, float* out, float* part_m, float* part_l, float* part_acc,
                              int* done, int n_heads, int n_kv, int blk, const int* pos0p, int window, float scale,
                              float softcap) {
    constexpr int HD = 32 * DPL;
    __shared__ __align__(16) float qs[G * HD];
    const int t = blockIdx.x / n_kv, kvh = blockIdx.x % n_kv;
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int qpos = *pos0p + t;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int share = (qpos - lo + n_splits) / n_splits;  // ceil((qpos - lo + 1) / n_splits)
    const int j0 = lo + split * share, j1 = min(qpos, j0 + share - 1);
    const long long q_row0 = (long long)t * n_heads + kvh * G;  // the group's heads are adjacent rows
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) qs[i] = q[q_row0 * HD + i];
    if (k_scale != nullptr) fwht(qs, G * HD, blk);  // blk divides HD: the G rows rotate independently
    __syncthreads();
    gqa_attend<G, DPL, ATT_WARPS>(qs, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, j0, j1, scale, softcap, blk, q_row0,
                                  split, n_splits, part_m, part_l, part_acc, done + blockIdx.x, out + q_row0 * HD);
}

#define GQA_INSTANTIATE(G, DPL)                                                                               \
    extern "C" __global__ void attention_gqa_##G##_##DPL(                                                     \
        const float* q, const void* k_pool, const void* v_pool, const float* k_scale, const float* v_scale,    \
        float* out, float* part_m, float* part_l, float* part_acc, int* done, int n_heads, int n_kv, int blk,  \
        const int* pos0p, int window, float scale, float softcap, long long k_slot, long long v_slot,           \
        long long s_slot) {                                                                                    \
        AT_SLOT(pos0p, k_pool, v_pool, k_scale, v_scale, k_slot, v_slot, s_slot);                             \
        GRID_DEP_START();                                                                                      \
        attention_gqa<G, DPL>(q, k_pool, v_pool, k_scale, v_scale, out, part_m, part_l, part_acc, done,     \
                              n_heads, n_kv, blk, pos0p, window, scale, softcap);                              \
    }
GQA_INSTANTIATE(1, 2)
GQA_INSTANTIATE(1, 4)
GQA_INSTANTIATE(1, 8)
GQA_INSTANTIATE(2, 2)
GQA_INSTANTIATE(2, 4)
GQA_INSTANTIATE(2, 8)
GQA_INSTANTIATE(4, 2)
GQA_INSTANTIATE(4, 4)
GQA_INSTANTIATE(4, 8)
GQA_INSTANTIATE(8, 2)
GQA_INSTANTIATE(8, 4)

// One-token decode attention for Hopper and later: a cluster of ATT_CL blocks per KV head, the layer's q/k norm,
// RoPE and K/V store included (qkv_post's work for the one token). Grid (n_kv * ATT_CL), block 32 * DEC_WARPS,
// clusters along x. Every block of a cluster norms, ropes (and, INT8, rotates) the G query heads of its KV
// head from the raw qkv row (a warp a head, in registers); the cluster's last block also stores the token's K
// and V rows (they are its keys' last). The cluster's blocks take contiguous shares of the keys in tasks of 8
// (gqa_scan_quads' arithmetic), merge their warps in shared memory, and the first G blocks each merge one head over the
// cluster through distributed shared memory (no global partials, no merge counters, no fence), rotate it back
// (INT8), write it to out [n_heads * HD] and, when x8 is not NULL, code it there as the o product's input
// (q8_code: the buffer q8_input would write for these values). Needs hd == hdv == 32 DPL, G <= ATT_CL, no v
// norm and, for NEOX RoPE, rope_dim / 2 a power of two (the backend checks).
// Before 9.0 (no clusters) attention_decg is the same kernel with the blocks' states merged through global
// memory (DEC_GLOBAL below): the same arithmetic in the same order, so the same numbers to the bit.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#ifndef ATT_CL
#define ATT_CL 8
#endif
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
__device__ __forceinline__ void cluster_sync() {  // every thread of every block of the cluster
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ float ld_peer(const float* p, unsigned rank) {  // *p in block `rank`'s shared memory
    float v = 0.f;
#if __CUDA_ARCH__ >= 900
    unsigned b;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(b) : "memory");
#endif
    return v;
}

// The queries in shared memory, a head's quarters QD = 8 DPL values apart by DEC_QP floats: the four quads of
// a warp then read four bank groups, not one (a head of 128 floats in place put all four on bank 0)
#define DEC_QP(DPL) (8 * (DPL) + 4)
#define DEC_HDP(DPL) (4 * DEC_QP(DPL))
// With an INT8 pool the same shared memory holds the queries as int8 codes (llama.cpp's q8_1 of the query; what it
// costs a real model: bench/attn_q8_fidelity.py): a quarter's 8 DPL codes DEC_Q8P bytes apart (16 more than
// theirs, so the four quads' 16-byte loads meet four bank groups), a head 4 DEC_Q8P; after the G heads a float
// scale a DEC_Q8B values (32, or a quarter's 16 where DPL is 2), max |q| / 127 of them, the codes round(q / scale)
// with ties to even. A task's scores are then dp4a's (4 products an instruction) and an FMA a scale, where float
// queries took a conversion and an FMA a value.
#define DEC_Q8P(DPL) (8 * (DPL) + 16)
#define DEC_Q8B(DPL) ((DPL) >= 4 ? 32 : 8 * (DPL))
#define DEC_Q8NB(DPL) (8 * (DPL) / DEC_Q8B(DPL))  // scales a quarter
template <int G, int DPL, class F>  // F: float or const float
__device__ __forceinline__ F* dec_q8_scales(F* qs) {
    static_assert(G * 4 * DEC_Q8P(DPL) + G * 4 * DEC_Q8NB(DPL) * 4 <= G * DEC_HDP(DPL) * 4, "the codes fit qs");
    return qs + G * DEC_Q8P(DPL);  // G * 4 * DEC_Q8P bytes: DEC_Q8P is a multiple of 16
}
// query head r's rotated row (lane l: values l DPL ..) coded into qs as above
template <int G, int DPL>
__device__ __forceinline__ void dec_q8_store(const float (&v)[DPL], float* qs, int r) {
    constexpr int LB = DEC_Q8B(DPL) / DPL;  // the lanes of a scale's values
    const int lane = threadIdx.x & 31, qd = lane >> 3;
    float a = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) a = fmaxf(a, fabsf(v[e]));
#pragma unroll
    for (int o = 1; o < LB; o <<= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, o));
    const float d = __fdiv_rn(a, 127.f);
    unsigned w[(DPL + 3) / 4] = {};
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
        const int c = d > 0.f ? __float2int_rn(__fdiv_rn(v[e], d)) : 0;
        w[e / 4] |= (unsigned)(c & 0xff) << (8 * (e % 4));
    }
    char* q8 = reinterpret_cast<char*>(qs) + (r * 4 + qd) * DEC_Q8P(DPL) + (lane & 7) * DPL;
    if constexpr (DPL == 2) *reinterpret_cast<unsigned short*>(q8) = (unsigned short)w[0];
    else if constexpr (DPL == 4) *reinterpret_cast<unsigned*>(q8) = w[0];
    else if constexpr (DPL == 8) *reinterpret_cast<uint2*>(q8) = make_uint2(w[0], w[1]);
    else *reinterpret_cast<uint4*>(q8) = make_uint4(w[0], w[1], w[2], w[3]);
    if (lane % LB == 0) dec_q8_scales<G, DPL>(qs)[(r * 4 + qd) * DEC_Q8NB(DPL) + (lane & 7) * DPL / DEC_Q8B(DPL)] = d;
}

// A head's row of 32 DPL values in a warp's registers (lane l: values l DPL ..): RMSNorm by w (when given; the
// lane's weights in w) and RoPE at the position whose table values the lane holds in c, sn (rope_pairs's):
// the arithmetic of norm_rope, without shared memory. NEOX pairs (p, p + rope_dim / 2) need rope_dim / 2 a
// power of two (the backend checks), NORM pairs are adjacent; dims from rope_dim on are not rotated.
template <int DPL>
__device__ __forceinline__ void norm_rope_regs(float (&v)[DPL], const float (&w)[DPL], bool has_w, float eps,
                                               const float (&c)[DPL], const float (&sn)[DPL], int rope_dim, int neox) {
    constexpr int HD = 32 * DPL;
    const int lane = threadIdx.x & 31;
    if (has_w) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < DPL; ++e) ss += v[e] * v[e];
        const float inv = rsqrtf(warp_sum(ss) / HD + eps);
#pragma unroll
        for (int e = 0; e < DPL; ++e) v[e] = v[e] * inv * w[e];
    }
    const int half = rope_dim / 2;
    float o[DPL];
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
        float other;
        if (!neox) other = v[e ^ 1];
        else if (half >= DPL) other = __shfl_xor_sync(FULL, v[e], half / DPL);
        else other = v[e ^ half];  // e ^ half < DPL: half < DPL is a power of two
        o[e] = other;
    }
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
        const int i = lane * DPL + e;
        if (i >= rope_dim) continue;
        const bool first = neox ? i < half : !(i & 1);
        v[e] = first ? v[e] * c[e] - o[e] * sn[e] : o[e] * sn[e] + v[e] * c[e];
    }
}
// the table values (cos, sin at position pos) for the lane's dims, and its norm weights: loaded ahead
template <int DPL>
__device__ __forceinline__ void rope_pairs(float (&c)[DPL], float (&sn)[DPL], const float* cos_t, const float* sin_t,
                                           int rope_dim, int neox, int pos) {
    const int lane = threadIdx.x & 31, half = rope_dim / 2;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
        const int i = lane * DPL + e;
        const int p = i < rope_dim ? (neox ? i & (half - 1) : i >> 1) : 0;
        c[e] = cos_t[(long long)pos * half + p];
        sn[e] = sin_t[(long long)pos * half + p];
    }
}

// A warp's task: 8 keys from base, lane (k, q) = (lane / 4, lane % 4) key k's quarter q of K and dims
// DPL lane .. of the 8 V rows, as raw words (room for FP16; INT8 fills the first half), with the key's scales.
template <int DPL>
struct DecTask {
    uint4 k[DPL];         // HD / 4 K values: DPL * 8 halves, or DPL * 8 int8 in k[0 .. DPL / 2)
    unsigned v[8][(2 * DPL + 3) / 4];
    float ks, vs;
};
template <int DPL>
__device__ __forceinline__ void dec_load(DecTask<DPL>& t, const void* k_pool, const void* v_pool, const float* k_scale,
                                         const float* v_scale, int n_kv, int kvh, int base, int j1, bool int8) {
    constexpr int HD = 32 * DPL, QD = HD / 4;
    const int lane = threadIdx.x & 31, kk = lane >> 2, qd = lane & 3;
    const long long krow = (long long)min(base + kk, j1) * n_kv + kvh;  // dead keys read a live row
    t.ks = t.vs = 1.f;
    if (int8) {
        t.ks = k_scale[krow], t.vs = v_scale[krow];
        // 16-byte loads: a quarter's QD = 8 DPL bytes start 16-byte aligned (the row's HD bytes do)
        const uint4* kr = reinterpret_cast<const uint4*>(reinterpret_cast<const signed char*>(k_pool) + krow * HD + qd * QD);
#pragma unroll
        for (int c = 0; c < QD / 16; ++c) t.k[c] = kr[c];
    } else {
        const uint4* kr = reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(k_pool) + krow * HD + qd * QD);
#pragma unroll
        for (int c = 0; c < QD / 8; ++c) t.k[c] = kr[c];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) load_v_row<DPL>(v_pool, (long long)min(base + k, j1) * n_kv + kvh, lane, int8, t.v[k]);
}
// one task into the warp's online softmax (gqa_scan_quads' arithmetic)
template <int G, int DPL>
__device__ __forceinline__ void dec_task(const DecTask<DPL>& t, const float* qs, int base, int j1, float scale, float softcap,
                                         bool int8, float (&acc)[G][DPL], float (&m)[G], float (&l)[G]) {
    constexpr int HD = 32 * DPL, QD = HD / 4;
    const int lane = threadIdx.x & 31, kk = lane >> 2, qd = lane & 3;
    const bool live = base + kk <= j1;
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.f;
    const float* qq = qs + qd * DEC_QP(DPL);
    if (int8) {  // the quarter's codes against the query's (dec_q8_store), a block's sum times its scale
        constexpr int NB = DEC_Q8NB(DPL), CB = DEC_Q8B(DPL) / 16;
        const char* q8 = reinterpret_cast<const char*>(qs) + qd * DEC_Q8P(DPL);
        const float* qsc = dec_q8_scales<G, DPL>(qs) + qd * NB;
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                int sum = 0;
#pragma unroll
                for (int cc = 0; cc < CB; ++cc) {
                    const int c = b * CB + cc;
                    const int4 qv = *reinterpret_cast<const int4*>(q8 + g * 4 * DEC_Q8P(DPL) + 16 * c);
                    sum = __dp4a((int)t.k[c].x, qv.x, sum);
                    sum = __dp4a((int)t.k[c].y, qv.y, sum);
                    sum = __dp4a((int)t.k[c].z, qv.z, sum);
                    sum = __dp4a((int)t.k[c].w, qv.w, sum);
                }
                s[g] = fmaf((float)sum, qsc[g * 4 * NB + b], s[g]);
            }
    } else {
#pragma unroll
        for (int c = 0; c < QD / 8; ++c)
#pragma unroll
            for (int g = 0; g < G; ++g) s[g] += dot8_f16(t.k[c], qq + g * DEC_HDP(DPL) + 8 * c);
    }
    float p[G];
    quad_softmax<G, DPL>(s, live, scale, t.ks, t.vs, softcap, qd, acc, m, l, p);
#pragma unroll
    for (int k = 0; k < 8; ++k) accumulate_v<G, DPL>(acc, p, t.v[k], 4 * k, int8);  // p is 0 for a dead key
}

// The token's rows of the block's G query heads (head group vh: query heads vh G .., of KV head pk), a row a warp
// by role (role = warp + i STRIDE: r < G query head vh G + r, normed, roped and (INT8) rotated into qs; where
// `last`, G the key and G + 1 the value of KV head pk, the key normed and roped, the value normed without a weight
// where v_norm, and stored into the pools at qpos). The norm weights and RoPE values load before the wait for the
// QKV product.
template <int G, int DPL, int ROLES, int STRIDE>
__device__ __forceinline__ void dec_rows(const float* qkv, void* k_pool, void* v_pool, float* k_scale, float* v_scale,
                                         float* qs, int n_heads, int n_kv, int vh, int pk, bool last, bool v_norm,
                                         const float* qk_norm, float eps, const float* cos_t, const float* sin_t,
                                         int rope_dim, int neox, int qpos, bool int8) {
    constexpr int HD = 32 * DPL;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float w[DPL], c[DPL], sn[DPL], v[DPL];
#pragma unroll
    for (int i = 0; i < ROLES; ++i) {
        const int role = warp + i * STRIDE;
        const int row = role < G ? vh * G + role : role == G && last ? n_heads + pk : role == G + 1 && last ? -1 : -2;
        if (row >= 0) {
            rope_pairs<DPL>(c, sn, cos_t, sin_t, rope_dim, neox, qpos);
#pragma unroll
            for (int e = 0; e < DPL; ++e) w[e] = qk_norm ? qk_norm[(long long)row * HD + lane * DPL + e] : 1.f;
        }
        if (i == 0) GRID_DEP_START();
        if (row != -2) {
            const long long src = row >= 0 ? (long long)row * HD : (long long)(n_heads + n_kv + pk) * HD;
#pragma unroll
            for (int e = 0; e < DPL; ++e) v[e] = qkv[src + lane * DPL + e];
        }
        if (row >= 0) norm_rope_regs<DPL>(v, w, qk_norm != nullptr, eps, c, sn, rope_dim, neox);
        else if (row == -1 && v_norm) {  // the value: RMSNorm without a weight (Gemma 4), nothing rotated
#pragma unroll
            for (int e = 0; e < DPL; ++e) w[e] = 1.f;
            norm_rope_regs<DPL>(v, w, true, eps, c, sn, 0, neox);
        }
        if (role < G) {  // a query head into shared memory: rotated and coded (INT8), or as it is (FP16)
            if (int8) {
                fwht_regs<DPL>(v);
                dec_q8_store<G, DPL>(v, qs, role);
            } else {
                float* q = qs + role * DEC_HDP(DPL) + (lane >> 3) * DEC_QP(DPL) + (lane & 7) * DPL;
#pragma unroll
                for (int e = 0; e < DPL; ++e) q[e] = v[e];
            }
        } else if (row != -2) {  // the token's key or value row into the pools
            const long long dst = (long long)qpos * n_kv + pk;
            store_row_regs<DPL>(v, row >= 0 ? k_pool : v_pool, row >= 0 ? k_scale : v_scale, dst);  // one copy
        }
    }
}
// A virtual warp's tasks from base to j1, 8 WARPS keys apart, into its online softmax (acc, m, l as gqa_init left
// them); `task` holds the first one's loads
template <int G, int DPL, int WARPS>
__device__ __forceinline__ void dec_scan(DecTask<DPL>& task, int base, int j1, const float* qs, const void* k_pool,
                                         const void* v_pool, const float* k_scale, const float* v_scale, int n_kv,
                                         int kvh, float scale, float softcap, bool int8, float (&acc)[G][DPL],
                                         float (&m)[G], float (&l)[G]) {
    while (base <= j1) {
        const int next = base + 8 * WARPS;
        if constexpr (WARPS == 8 && DPL <= 8) {  // the next task's loads go out before this one's arithmetic
            DecTask<DPL> nt;
            if (next <= j1) dec_load<DPL>(nt, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, next, j1, int8);
            dec_task<G, DPL>(task, qs, base, j1, scale, softcap, int8, acc, m, l);
            task = nt;
        } else {  // 16 warps (or DPL 16): two tasks' loads would not fit their registers (the first went out early)
            dec_task<G, DPL>(task, qs, base, j1, scale, softcap, int8, acc, m, l);
            if (next <= j1) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, next, j1, int8);
        }
        base = next;
    }
}

// Head g of KV head kvh merged over the `ranks` ranks (at most 32) in rank order (attention_dec's cluster block g,
// attention_decb's warp g): rank p's max m_of(p), sum l_of(p) and merged accumulator acc_of(p, e) (at lane
// DPL + e) weighed and summed, normalized, rotated back (INT8: V's blk equals K's, hd == hdv), written to out
// [n_heads * HD] and to hb (HD floats of shared memory, which dec_code reads the o product's input from).
template <int G, int DPL, class MOf, class LOf, class AccOf>
__device__ __forceinline__ void dec_head(int g, int kvh, int ranks, float* out, bool int8, float* hb, MOf m_of,
                                         LOf l_of, AccOf acc_of) {
    constexpr int HD = 32 * DPL;
    const int lane = threadIdx.x & 31;
    // RB ranks' rows loaded before any is added (32 registers), then added in rank order: a row comes from L2
    // (attention_decg's parts) or a peer's shared memory, and loaded as it was added the merge waited a round trip
    // every rank or two (32 ranks at depth 4 096 on 8.x); the same FMAs in the same order, so the same numbers.
    // The first RB rows go out with the maxima and sums, before the weights that need them: one round trip fewer
    constexpr int RB = DPL >= 32 ? 1 : 32 / DPL;
    float a[RB][DPL];
    const auto load = [&](int p0) {
#pragma unroll
        for (int q = 0; q < RB; ++q)
#pragma unroll
            for (int e = 0; e < DPL; ++e) a[q][e] = p0 + q < ranks ? acc_of(p0 + q, e) : 0.f;
    };
    load(0);
    float mp = NEG_INF, lp = 0.f;
    if (lane < ranks) mp = m_of(lane), lp = l_of(lane);
    const float mx = warp_max(mp);
    const float w = lane < ranks && mp != NEG_INF ? __expf(mp - mx) : 0.f;
    float wl = w * lp;  // the sum over the ranks in rank order, as every run
    float lsum = 0.f;
    for (int p = 0; p < ranks; ++p) lsum += __shfl_sync(FULL, wl, p);
    float v[DPL];
#pragma unroll
    for (int e = 0; e < DPL; ++e) v[e] = 0.f;
    for (int p0 = 0; p0 < ranks; p0 += RB) {
        if (p0 > 0) load(p0);
#pragma unroll
        for (int q = 0; q < RB; ++q) {
            if (p0 + q >= ranks) break;  // the same for every lane
            const float wp = __shfl_sync(FULL, w, p0 + q);
#pragma unroll
            for (int e = 0; e < DPL; ++e) v[e] += a[q][e] * wp;
        }
    }
    const float inv = 1.f / lsum;
#pragma unroll
    for (int e = 0; e < DPL; ++e) v[e] *= inv;
    if (int8) fwht_regs<DPL>(v);
    const long long h = (long long)kvh * G + g;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
        out[h * HD + lane * DPL + e] = v[e];
        hb[lane * DPL + e] = v[e];
    }
}
// The o product's input (x8 not NULL): n_sb sub-blocks of 32 merged heads' values (`heads`, shared memory, as
// dec_head left them, visible to the block), sub-blocks first_sb on of the token's row, coded at xa as q8_input
// would, a sub-block a warp over all the block's warps (where one warp coded its head's sub-blocks in turn); a
// sub-block's bytes do not depend on the warp that codes it
__device__ __forceinline__ void dec_code(const float* heads, int first_sb, int n_sb, const signed char* x8, X8At xa) {
    if (x8 == nullptr) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll 1  // one copy of the coding: this code runs once a launch, fetched from L2 (bench/NOTES.md v30)
    for (int sb = warp; sb < n_sb; sb += n_warps) q8_code(heads[sb * 32 + lane], first_sb + sb, lane, xa);
}

// P warps run the WARPS warps whose shares of the keys and merge order the arithmetic is defined by (virtual
// warps; physical warp p runs p, p + P, ...): P == WARPS for one stream, fewer for a step of many streams, whose
// blocks are then small enough for several an SM. A virtual warp's tasks, online softmax, and its place in the
// merges are the same for every P, so a stream's numbers do not depend on it.
// DEC_GLOBAL (attention_decg, attention_decgn; compute capability 8.x): a KV head's blocks are no cluster; the
// grid has n_ranks of them (1 to 32: the tuning's, the cluster's 8 unless it asks for as many as the SMs hold a
// KV head's, so a long context's token fills the GPU once), of which the depth uses dec_ranks_at's; each writes its state (max and sum per
// head, merged accumulator) to `parts` [row][n_kv][n_ranks][DecPart], and the last of them to count itself in
// done[row n_kv + kvh] (which it then zeroes for the next launch) merges every head over the ranks in rank order,
// a warp a head, as the cluster's blocks would. The split defines the arithmetic: attention_decb with the same
// n_ranks gives the same numbers.
// The ranks a KV head's keys are split over at a depth of n_tasks tasks of 8 keys: on 9.0 the cluster's (the
// backend passes ATT_CL); on 8.x as many of the grid's n_ranks as give each DEC_RANK_TASKS tasks (CupyTuning.dec_rank_tasks;
// 0: all of them), at least one, so a short context is not split over blocks that would have
// one task or none, whose fixed cost (the G query heads' norm and RoPE, a state to write and merge) then outweighs
// their keys. A function of the position only: a row's numbers alone and in a step's launch are the same.
#ifndef DEC_RANK_TASKS
#define DEC_RANK_TASKS 8
#endif
__device__ __forceinline__ int dec_ranks_at(int n_ranks, int n_tasks) {
#if PATHS_90
    return n_ranks;
#else
    if (DEC_RANK_TASKS == 0) return n_ranks;
    return max(1, min(n_ranks, (n_tasks + DEC_RANK_TASKS - 1) / DEC_RANK_TASKS));
#endif
}
template <int G, int DPL>
struct DecPart {
    static constexpr int FLOATS = G * 32 * DPL + 2 * G;  // the accumulator [G][HD], then m [G], then l [G]
};
// Head groups: a KV head's n_heads / n_kv query heads in hgs groups of G (a group of 8 heads of 256 or 512 dims
// as 2 of 4 or 4 of 2, whose accumulators fit), each group the blocks of a KV head of its own (its ranks, its parts
// and merge), all of them reading the KV head's keys; where `last`, every group's last rank stores the same bytes
// of the token's K and V rows. kv_mode: KV_VNORM (the values normed without a weight before they are stored),
// KV_SHARED (the layer reads an earlier layer's K/V: qkv holds the queries alone, nothing is stored).
#define KV_VNORM 1
#define KV_SHARED 2
template <int G, int DPL, int WARPS, int P = WARPS, bool DEC_GLOBAL = false>
__device__ void attention_dec(const float* qkv, void* k_pool, void* v_pool, float* k_scale, float* v_scale, float* out,
                              signed char* x8, int n_heads, int n_kv, const float* qk_norm, float eps, const float* cos_t,
                              const float* sin_t, int rope_dim, int neox, const int* pos0p, int window, float scale,
                              float softcap, long long x8_token = -1, float* parts = nullptr, int* done = nullptr,
                              int n_ranks = ATT_CL, int hgs = 1, int kv_mode = 0) {
    constexpr int HD = 32 * DPL;
    static_assert(WARPS >= G + 2, "a warp for each query head, the key and the value");
    static_assert(P <= WARPS && WARPS % P == 0, "physical warps run whole sets of virtual ones");
    __shared__ __align__(16) float qs[G * DEC_HDP(DPL)];  // the queries, quarters DEC_QP apart
    __shared__ __align__(16) float kvb[HD];                // the merged head (x8 coding)
    __shared__ float accs[WARPS][G * HD];  // the warps' accumulators; row 0 then the block's, read by peers
    __shared__ float ms[WARPS][G], ls[WARPS][G], fw[WARPS][G];  // fw: each warp's weight in the block's merge
    __shared__ float bm[G], bl[G];  // the block's max and sum per head, read by peers
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool int8 = k_scale != nullptr;
    // Before the wait for the QKV product, what does not depend on it: this block's share of the keys [lo, qpos]
    // in tasks of 8 and this warp's first task's loads (every key before qpos was stored by an earlier step; the
    // position was staged before the graph started), and the norm weights and RoPE table values of the row this
    // warp will norm first (role r < G: query head r; in the last block role G the key head, G + 1 the value)
    const int qpos = *pos0p;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int n_tasks = (qpos - lo + 8) / 8;
    // the blocks a KV head: a cluster's ATT_CL, or of the grid's n_ranks those this depth gives work (dec_ranks_at)
    const int grid_ranks = DEC_GLOBAL ? n_ranks : ATT_CL;
    const int ranks = DEC_GLOBAL ? dec_ranks_at(n_ranks, n_tasks) : ATT_CL;
    const unsigned rank = DEC_GLOBAL ? blockIdx.x % grid_ranks : cluster_rank();
    const int hg = blockIdx.x / grid_ranks, kvh = hg / hgs;  // the block's head group, and its KV head
    if (DEC_GLOBAL && (int)rank >= ranks) return;  // a block this depth does not use (the whole block leaves)
    const int t0 = (int)rank * n_tasks / ranks, t1 = ((int)rank + 1) * n_tasks / ranks;
    const int j0 = lo + 8 * t0, j1 = min(qpos, lo + 8 * t1 - 1);
    // the virtual warps with keys: a prefix (warp vw's first key is j0 + 8 vw); the rest hold nothing and are
    // left out of the merges, which they would not change (a max with -inf, sums of zeros)
    const int n_act = j1 < j0 ? 0 : min(WARPS, (j1 - j0 + 8) / 8);
    // ... where a warp runs several virtual warps (attention_decn). attention_dec (a warp each) merges them all,
    // with bounds the compiler knows: runtime bounds there cost one stream 4-5 % at depth 1024 (bench/NOTES v19)
    const int n_m = P == WARPS ? WARPS : n_act;
    DecTask<DPL> task;
    int base = j0 + 8 * warp;
    if (base <= j1) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
    constexpr int ROLES = P == WARPS ? 1 : (G + 2 + P - 1) / P;  // roles a warp takes at most
    dec_rows<G, DPL, ROLES, P>(qkv, k_pool, v_pool, k_scale, v_scale, qs, n_heads, n_kv, hg, kvh,
                               rank == ranks - 1 && !(kv_mode & KV_SHARED), kv_mode & KV_VNORM, qk_norm, eps, cos_t,
                               sin_t, rope_dim, neox, qpos, int8);
    __syncthreads();  // queries ready; the new K/V rows visible to this block's loads
    if (base <= j1 && base + 7 >= qpos)  // the task holding the new key read its rows before they were stored
        dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
    float acc[G][DPL], m[G], l[G];
    for (int i = 0; i < WARPS / P; ++i) {  // virtual warp vw: tasks from j0 + 8 vw, 8 WARPS keys apart
        const int vw = warp + i * P;
        if (P < WARPS && vw >= n_act) break;
        base = j0 + 8 * vw;
        if (P < WARPS && vw != warp && base <= j1) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
        gqa_init(acc, m, l);
        dec_scan<G, DPL, WARPS>(task, base, j1, qs, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, scale, softcap, int8,
                                acc, m, l);
        if constexpr (P < WARPS) {  // its state as it ends, scaled to the block's max below (P == WARPS: one
                                    // virtual warp a warp, its state stays in registers)
            if (lane == 0)
#pragma unroll
                for (int g = 0; g < G; ++g) ms[vw][g] = m[g], ls[vw][g] = l[g];
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int e = 0; e < DPL; ++e) accs[vw][g * HD + lane * DPL + e] = acc[g][e];
        }
    }
    // the warps merged: the block's max, sum and accumulator per head. Warp g takes head g's max and its warps'
    // weights f_w = exp(m_w - max) (fw); the column sums weigh the raw accumulators, each product rounded before
    // its sum (the bits of scaling each warp's accumulator first). Few instructions: this code runs once a launch.
    if constexpr (P == WARPS) {  // (P < WARPS: the virtual warps' states are in ms, ls and accs already)
        if (lane == 0)
#pragma unroll
            for (int g = 0; g < G; ++g) ms[warp][g] = m[g], ls[warp][g] = l[g];
#pragma unroll
        for (int g = 0; g < G; ++g)
#pragma unroll
            for (int e = 0; e < DPL; ++e) accs[warp][g * HD + lane * DPL + e] = acc[g][e];
    }
    __syncthreads();
    for (int g = warp; g < G; g += P) {
        const float mw = lane < n_m ? ms[lane][g] : NEG_INF;
        const float mb = warp_max(mw);
        const float f = mw == NEG_INF ? 0.f : __expf(mw - mb);
        const float lw = lane < n_m ? ls[lane][g] : 0.f;
        if (lane < n_m) fw[lane][g] = f;
        float lb = 0.f;  // in warp order; a warp without keys adds 0 * 0
#pragma unroll 1
        for (int w = 0; w < n_m; ++w) lb += __shfl_sync(FULL, lw, w) * __shfl_sync(FULL, f, w);
        if (lane == 0) bm[g] = mb, bl[g] = lb;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {  // in place into row 0: column i is this thread's
        const int g = i / HD;
        float sum = 0.f;  // n_m == 0: zeros, which the peers weigh by 0
#pragma unroll 4
        for (int w = 0; w < n_m; ++w) sum = __fadd_rn(sum, __fmul_rn(accs[w][i], fw[w][g]));
        accs[0][i] = sum;
    }
    const int cols = n_heads * HD;  // x8_token >= 0: that token of an n-token product's input
    const X8At xa = x8_token < 0 ? x8_row(x8, cols) : x8_quad(x8, x8_token, cols);
    if constexpr (DEC_GLOBAL) {
        constexpr int PF = DecPart<G, DPL>::FLOATS;
        const long long group = (long long)blockIdx.y * n_kv * hgs + hg;
        float* kv_parts = parts + group * n_ranks * PF;
        __shared__ int last;
        __syncthreads();  // row 0 of accs complete
        for (int i = threadIdx.x; i < G * HD; i += blockDim.x) kv_parts[rank * PF + i] = accs[0][i];
        if (threadIdx.x < G) {
            kv_parts[rank * PF + G * HD + threadIdx.x] = bm[threadIdx.x];
            kv_parts[rank * PF + G * HD + G + threadIdx.x] = bl[threadIdx.x];
        }
        __threadfence();  // this block's state before its count
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&done[group], 1) == ranks - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();  // the others' states after their counts
        for (int g = warp; g < G; g += P) {  // head g over the ranks in rank order, as the cluster's block g
            dec_head<G, DPL>(
                g, hg, ranks, out, int8, &accs[0][g * HD],
                [&](int p) { return __ldcg(kv_parts + p * PF + G * HD + g); },
                [&](int p) { return __ldcg(kv_parts + p * PF + G * HD + G + g); },
                [&](int p, int e) { return __ldcg(kv_parts + p * PF + g * HD + lane * DPL + e); });
        }
        if (threadIdx.x == 0) done[group] = 0;
        __syncthreads();  // every head merged
        dec_code(accs[0], hg * G * DPL, G * DPL, x8, xa);
    } else {
        cluster_sync();  // every block's state is complete
        if (rank < G) {  // head g = rank over the cluster, by one warp, peers in rank order
            const int g = rank;
            if (warp == 0)
                dec_head<G, DPL>(
                    g, hg, ATT_CL, out, int8, kvb, [&](int p) { return ld_peer(&bm[g], p); },
                    [&](int p) { return ld_peer(&bl[g], p); },
                    [&](int p, int e) { return ld_peer(&accs[0][g * HD + lane * DPL + e], p); });
            __syncthreads();  // the head in kvb
            dec_code(kvb, (hg * G + g) * DPL, DPL, x8, xa);
        }
        cluster_sync();  // no block leaves while a peer may still read its shared memory
    }
}

// attention_decb: a step's decode rows as attention_decn or attention_decgn computes them, without clusters: a
// block a (row, KV head) runs attention_dec's n_ranks blocks (a cluster's ATT_CL on 9.0) as virtual ranks, RG at a
// time (a group of P warps a rank, its WARPS virtual warps as attention_decn's P warps run them), merges each
// rank's warps as that block would, and each head over the ranks in rank order as block g would: a stream's
// numbers are attention_dec's to the bit. At a few hundred keys a cluster block's work is mostly its fixed cost
// (the G query heads' norm and RoPE, which every block of a cluster repeats, and two cluster barriers), paid here
// once a head; and 16 streams of 8 KV heads are 128 blocks, one wave, where attention_decn's 128 clusters of 8
// took three (62 fit at once).
// Dynamic shared memory: DecbSmem's FLOATS and RANK_FLOATS a rank (the backend computes the same floats).
template <int G, int DPL, int WARPS, int RG>
struct DecbSmem {
    static constexpr int HD = 32 * DPL;
    static constexpr int QS = G * DEC_HDP(DPL);  // the queries, as attention_dec's qs
    static constexpr int OB = G * HD;            // each head's merged row (x8 coding)
    static constexpr int ACC = WARPS * G * HD;   // a rank group's virtual warps' accumulators
    static constexpr int MS = WARPS * G;         // ... their maxima, and their sums
    static constexpr int GROUP = ACC + 2 * MS;
    static constexpr int RANK = G * HD;  // a rank's merged accumulator
    static constexpr int FLOATS = QS + OB + RG * GROUP;  // then n_ranks times RANK_FLOATS
    static constexpr int RANK_FLOATS = RANK + 2 * G;
};
__device__ __forceinline__ void group_sync(int id, int threads) {  // named barrier `id` of `threads` threads
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
template <int G, int DPL, int WARPS, int P, int RG>
__device__ void attention_decb(const float* qkv, void* k_pool, void* v_pool, float* k_scale, float* v_scale, float* out,
                               signed char* x8, int n_heads, int n_kv, const float* qk_norm, float eps,
                               const float* cos_t, const float* sin_t, int rope_dim, int neox, const int* pos0p,
                               int window, float scale, float softcap, long long x8_token, float* = nullptr,
                               int* = nullptr, int n_ranks = ATT_CL, int hgs = 1, int kv_mode = 0) {  // (DEC_ROWS's
                               // parts and done: attention_decgn's; hgs, kv_mode: attention_dec's)
    constexpr int HD = 32 * DPL, NW = P * RG;
    static_assert(NW >= G, "a warp for each head's merge over the ranks");
    static_assert(WARPS % P == 0, "groups run whole sets of virtual warps");
    using L = DecbSmem<G, DPL, WARPS, RG>;
    extern __shared__ __align__(16) float decb_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rg = warp / P, pw = warp % P;
    float* qs = decb_smem;
    float* ob = qs + L::QS;
    float* accs = ob + L::OB + rg * L::GROUP;  // [WARPS][G HD]
    float* ms = accs + L::ACC;                 // [WARPS][G]
    float* ls = ms + L::MS;
    float* racc = ob + L::OB + RG * L::GROUP;  // [n_ranks][G HD]
    float* rm = racc + n_ranks * L::RANK;      // [n_ranks][G]
    float* rl = rm + n_ranks * G;
    const int hg = blockIdx.x, kvh = hg / hgs;  // the block's head group, and its KV head
    const bool int8 = k_scale != nullptr;
    // as attention_dec: the keys' split and this warp's first task's loads (its group's first rank) before the
    // wait, then the token's rows (dec_rows: a warp a role, every role in this one block)
    const int qpos = *pos0p;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    const int n_tasks = (qpos - lo + 8) / 8;
    const int ranks = dec_ranks_at(n_ranks, n_tasks);  // as attention_dec's blocks at this depth
    // (a group past the last rank: j0 > qpos, no keys)
    int j0 = lo + 8 * (rg * n_tasks / ranks), j1 = min(qpos, lo + 8 * ((rg + 1) * n_tasks / ranks) - 1);
    DecTask<DPL> task;
    int base = j0 + 8 * pw;
    if (base <= j1) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
    dec_rows<G, DPL, (G + 2 + NW - 1) / NW, NW>(qkv, k_pool, v_pool, k_scale, v_scale, qs, n_heads, n_kv, hg, kvh,
                                                !(kv_mode & KV_SHARED), kv_mode & KV_VNORM, qk_norm, eps, cos_t,
                                                sin_t, rope_dim, neox, qpos, int8);
    __syncthreads();  // queries ready; the new K/V rows visible to the block's loads
    if (base <= j1 && base + 7 >= qpos) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
    for (int r = rg; r < ranks; r += RG) {  // virtual rank r: block r of attention_dec
        if (r != rg) {
            j0 = lo + 8 * (r * n_tasks / ranks);
            j1 = min(qpos, lo + 8 * ((r + 1) * n_tasks / ranks) - 1);
        }
        const int n_act = j1 < j0 ? 0 : min(WARPS, (j1 - j0 + 8) / 8);
        float acc[G][DPL], m[G], l[G];
        for (int i = 0; i < WARPS / P; ++i) {
            const int vw = pw + i * P;
            if (vw >= n_act) break;
            base = j0 + 8 * vw;
            if (i > 0 || r != rg) dec_load<DPL>(task, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, base, j1, int8);
            gqa_init(acc, m, l);
            dec_scan<G, DPL, WARPS>(task, base, j1, qs, k_pool, v_pool, k_scale, v_scale, n_kv, kvh, scale, softcap,
                                    int8, acc, m, l);
            if (lane == 0)
#pragma unroll
                for (int g = 0; g < G; ++g) ms[vw * G + g] = m[g], ls[vw * G + g] = l[g];
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int e = 0; e < DPL; ++e) accs[vw * G * HD + g * HD + lane * DPL + e] = acc[g][e];
        }
        group_sync(1 + rg, 32 * P);
        // the rank's warps merged, as attention_dec's block merges them
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mb = NEG_INF;
            for (int vw = 0; vw < n_act; ++vw) mb = fmaxf(mb, ms[vw * G + g]);
            for (int vw = pw; vw < n_act; vw += P) {
                const float mv = ms[vw * G + g], f = mv == NEG_INF ? 0.f : __expf(mv - mb);
#pragma unroll
                for (int e = 0; e < DPL; ++e) accs[vw * G * HD + g * HD + lane * DPL + e] *= f;
            }
            if (pw == 0 && lane == 0) {
                float lb = 0.f;
                for (int vw = 0; vw < n_act; ++vw)
                    if (ms[vw * G + g] != NEG_INF) lb += ls[vw * G + g] * __expf(ms[vw * G + g] - mb);
                rm[r * G + g] = mb, rl[r * G + g] = lb;
            }
        }
        group_sync(1 + rg, 32 * P);
        for (int i = pw * 32 + lane; i < G * HD; i += 32 * P) {
            float sum = 0.f;
            for (int vw = 0; vw < n_act; ++vw) sum += accs[vw * G * HD + i];
            racc[r * L::RANK + i] = sum;
        }
        group_sync(1 + rg, 32 * P);  // the group's accumulators free for its next rank
    }
    __syncthreads();  // every rank's state complete
    if (warp < G) {  // head g over the ranks in rank order, by warp g, as attention_dec's cluster block g
        const int g = warp;
        dec_head<G, DPL>(
            g, hg, ranks, out, int8, ob + g * HD, [&](int p) { return rm[p * G + g]; },
            [&](int p) { return rl[p * G + g]; },
            [&](int p, int e) { return racc[p * L::RANK + g * HD + lane * DPL + e]; });
    }
    __syncthreads();  // every head merged
    dec_code(ob, hg * G * DPL, G * DPL, x8, x8_quad(x8, x8_token, n_heads * HD));
}

// attention_decn_*: the decode rows of a step of several streams in one launch, blockIdx.y the row: dec holds
// n_dec rows of qkv and out, then their slots, then their positions; a slot's K and V pools start kv_stride bytes
// (its scales scale_stride floats) after the slot before it. x8 (or NULL): row r of the output coded as the o
// product's input, token r of the n-token layout (common.cuh).
// 16 warps a block where their accumulators fit the static shared memory and a task's loads fit 128 registers,
// else 8 (the backend's _dec_warps)
#ifndef DEC_MAX_WARPS
#define DEC_MAX_WARPS 16
#endif
#define DEC_WARPS(G, DPL) ((G) * (DPL) <= 16 && (DPL) <= 4 && (DEC_MAX_WARPS >= 16 || (G) + 2 > 8) ? 16 : 8)
// attention_decn's physical warps a block (DECN_WARPS, at most DEC_WARPS): 4 by default, so that four blocks of a
// step's many streams share an SM (sixteen warps a block made one an SM, and most of them idle at short depths)
#ifndef DECN_WARPS
#define DECN_WARPS 4
#endif
#define DECN_P(G, DPL) (DECN_WARPS < DEC_WARPS(G, DPL) ? DECN_WARPS : DEC_WARPS(G, DPL))
// attention_decb's rank groups of DECN_P warps: 16 warps a block, 8 where DPL = 8 (whose tasks need 255 registers)
#define DECB_RG_(DPL, P) (((DPL) <= 4 ? 16 : 8) / (P) > 1 ? ((DPL) <= 4 ? 16 : 8) / (P) : 1)
#define DECB_RG(G, DPL) DECB_RG_(DPL, DECN_P(G, DPL))
#define DECB_WARPS(G, DPL) (DECN_P(G, DPL) * DECB_RG(G, DPL))
// as many blocks an SM as leave a thread attention_dec's registers (128 for DPL <= 4 at 16 warps, else 255 at 8)
// A kernel over a step's decode rows (attention_decn_*, attention_decgn_*, attention_decb_*): blockIdx.y's row, its
// slot's pools and its position, into FN (attention_dec run on fewer warps, or attention_decb); parts and done:
// attention_decgn's merge through global memory (NULL for the others); n_ranks: blocks a head group (ATT_CL on
// 9.0); hgs, kv_mode: attention_dec's (a row of qkv is the queries alone under KV_SHARED)
#define DEC_ROWS(NAME, DPL, FN)                                                                                       \
    NAME(const float* qkv, char* k_pools, char* v_pools, float* k_scales, float* v_scales, float* out, signed char* x8, \
         int n_heads, int n_kv, const float* qk_norm, float eps, const float* cos_t, const float* sin_t, int rope_dim, \
         int neox, const int* dec, int n_dec, long long kv_stride, long long scale_stride, int window, float scale,    \
         float softcap, float* parts, int* done, int n_ranks, int hgs, int kv_mode) {                                 \
        const int* d = dec + blockIdx.y;                                                                              \
        const long long row = d[0], slot = d[n_dec];                                                                  \
        const long long qkv_cols = (long long)(n_heads + (kv_mode & KV_SHARED ? 0 : 2 * n_kv)) * 32 * DPL;            \
        FN(qkv + row * qkv_cols, k_pools + slot * kv_stride, v_pools + slot * kv_stride,                              \
           k_scales ? k_scales + slot * scale_stride : nullptr, v_scales ? v_scales + slot * scale_stride : nullptr,   \
           out + row * n_heads * 32 * DPL, x8, n_heads, n_kv, qk_norm, eps, cos_t, sin_t, rope_dim, neox, d + 2 * n_dec, \
           window, scale, softcap, row, parts, done, n_ranks, hgs, kv_mode);                                          \
    }
// One token (the slot and position staged: AT_SLOT) into FN; parts, done: attention_decg's (NULL for attention_dec);
// n_ranks: its blocks a head group (attention_dec's cluster: ATT_CL); hgs, kv_mode: attention_dec's
#define DEC_ONE(NAME, FN)                                                                                             \
    NAME(const float* qkv, void* k_pool, void* v_pool, float* k_scale, float* v_scale, float* out, signed char* x8,    \
         int n_heads, int n_kv, const float* qk_norm, float eps, const float* cos_t, const float* sin_t, int rope_dim, \
         int neox, const int* pos0p, int window, float scale, float softcap, long long k_slot, long long v_slot,        \
         long long s_slot, float* parts, int* done, int n_ranks, int hgs, int kv_mode) {                               \
        AT_SLOT(pos0p, k_pool, v_pool, k_scale, v_scale, k_slot, v_slot, s_slot);                                     \
        FN(qkv, k_pool, v_pool, k_scale, v_scale, out, x8, n_heads, n_kv, qk_norm, eps, cos_t, sin_t, rope_dim, neox,  \
           pos0p, window, scale, softcap, -1, parts, done, n_ranks, hgs, kv_mode);                                     \
    }
// 9.0: a cluster of ATT_CL blocks a KV head (attention_dec, attention_decn)
#define DEC_INSTANTIATE_CLUSTER(G, DPL)                                                                               \
    extern "C" __global__ void __cluster_dims__(ATT_CL, 1, 1) __launch_bounds__(32 * DEC_WARPS(G, DPL), 1)           \
        DEC_ONE(attention_dec_##G##_##DPL, (attention_dec<G, DPL, DEC_WARPS(G, DPL)>))                                  \
    extern "C" __global__ void __cluster_dims__(ATT_CL, 1, 1)                                                       \
        __launch_bounds__(32 * DECN_P(G, DPL), ((DPL) <= 4 ? 16 : 8) / DECN_P(G, DPL))                                  \
        DEC_ROWS(attention_decn_##G##_##DPL, DPL, (attention_dec<G, DPL, DEC_WARPS(G, DPL), DECN_P(G, DPL)>))
// 8.x: the same blocks merged through global memory (attention_decg, attention_decgn)
#define DEC_INSTANTIATE_GLOBAL(G, DPL)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS(G, DPL), 1)                                          \
        DEC_ONE(attention_decg_##G##_##DPL, (attention_dec<G, DPL, DEC_WARPS(G, DPL), DEC_WARPS(G, DPL), true>))        \
    extern "C" __global__ void __launch_bounds__(32 * DECN_P(G, DPL), ((DPL) <= 4 ? 16 : 8) / DECN_P(G, DPL))         \
        DEC_ROWS(attention_decgn_##G##_##DPL, DPL, (attention_dec<G, DPL, DEC_WARPS(G, DPL), DECN_P(G, DPL), true>))
// both families: attention_decb (a block a row and KV head)
#define DEC_INSTANTIATE_B(G, DPL)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * DECB_WARPS(G, DPL), 1)                                          \
        DEC_ROWS(attention_decb_##G##_##DPL, DPL,                                                                     \
                 (attention_decb<G, DPL, DEC_WARPS(G, DPL), DECN_P(G, DPL), DECB_RG(G, DPL)>))
// the (query heads a KV head, head dim / 32) the decode kernels are built for (DEC_KERNELS in attention.py)
#define DEC_SHAPES(X) X(1, 2) X(1, 4) X(1, 8) X(2, 2) X(2, 4) X(2, 8) X(4, 2) X(4, 4) X(4, 8) X(8, 2) X(2, 16)
DEC_SHAPES(DEC_INSTANTIATE_B)
#if PATHS_90
#if __CUDA_ARCH__ >= 900
DEC_SHAPES(DEC_INSTANTIATE_CLUSTER)
#endif
#else
DEC_SHAPES(DEC_INSTANTIATE_GLOBAL)
#endif
#endif

// Prefill attention on the tensor cores (FlashAttention-2's scheme with mma.sync): the queries of a prompt
// chunk against its keys and those before it. A block of PF_WARPS warps takes PF_ROWS query rows, the
// (token, head) pairs of PF_ROWS / G consecutive tokens and the G query heads of one KV head, so each K/V
// tile it stages serves all of them; each warp owns 16 rows. Per tile of PF_KEYS keys: K and V are staged
// in shared memory as FP16 (INT8 codes are exact in FP16; their scales are applied to the scores and
// folded into P; V as rows like K, its B fragments read transposed by ldmatrix), S = Q K^T comes from
// m16n8k16 MMAs (FP16 in, FP32 accumulate) into registers, the online softmax runs on those registers (a
// row's values sit in the four lanes of a quad), and P V accumulates into O, also in registers. Q is
// rotated (INT8) and pre-scaled in FP32 before its conversion to FP16; O is normalized, rotated back (INT8)
// and written as [n_tok, n_heads, HD]. Instantiated for HD == HDV in {16, 32, 64, 128, 256} and G dividing
// PF_ROWS, in tiles of KEYS = PF_KEYS keys, and of 32 (`_k32`) for 256 where a block may have less shared memory (an
// RTX 30 / 40: 99 KiB); dynamic shared memory as attention.py's _prefill_attention_smem sizes it. HD 512 (Gemma 4's global
// layers) in blocks of DV = 256 of V's dims (blockIdx.z), each computing all of S for its half of O, whose rows it
// writes unrotated: INT8 K/V's rotation back is the backend's next launch (fwht_rows), as a row needs all 512 dims.
#ifndef PF_WARPS
#define PF_WARPS 4
#endif
#define PF_ROWS (16 * PF_WARPS)
#define PF_KEYS 64
#define PF_RB 4  // Q rows a warp loads before it rotates any

__device__ __forceinline__ void mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
}
__device__ __forceinline__ unsigned lds32(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }
// four 8 x 8 FP16 matrices from shared memory, transposed: lanes 8 m .. 8 m + 7 give matrix m's rows (16 bytes
// each), and lane l gets matrix m's elements [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4] in r[m]: an MMA's B
// fragment of a row-major [k][n] tile
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// 8 INT8 codes as 8 halves (exact)
__device__ __forceinline__ uint4 i8x8_half(uint2 b) {
    uint4 r;
    unsigned* o = reinterpret_cast<unsigned*>(&r);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const unsigned w = e < 2 ? b.x : b.y;
        const int sh = 16 * (e & 1);
        const __half2 h = __halves2half2(__int2half_rn((signed char)(w >> sh)), __int2half_rn((signed char)(w >> (sh + 8))));
        o[e] = *reinterpret_cast<const unsigned*>(&h);
    }
    return r;
}

// lane's E values of a row of 32 E floats (l E .., 16-byte aligned from E = 4), or zeros where !live
template <int E>
__device__ __forceinline__ void load_lane(float (&v)[E], const float* row, bool live) {
    const int lane = threadIdx.x & 31;
    if constexpr (E % 4 == 0) {
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            const float4 f = live ? *reinterpret_cast<const float4*>(row + lane * E + e) : make_float4(0.f, 0.f, 0.f, 0.f);
            v[e] = f.x, v[e + 1] = f.y, v[e + 2] = f.z, v[e + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = live ? row[lane * E + e] : 0.f;
    }
}

// 8 K/V values at p as they lie in the pool (INT8 codes: 8 bytes; FP16: 16), and as 8 halves
template <bool I8> struct PfRaw { using T = uint4; };
template <> struct PfRaw<true> { using T = uint2; };
template <bool I8>
__device__ __forceinline__ typename PfRaw<I8>::T pf_load(const void* pool, long long off) {
    if constexpr (I8) return *reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(pool) + off);
    else return *reinterpret_cast<const uint4*>(reinterpret_cast<const __half*>(pool) + off);
}
__device__ __forceinline__ uint4 pf_half8(uint4 r) { return r; }
__device__ __forceinline__ uint4 pf_half8(uint2 b) { return i8x8_half(b); }

// One K/V tile of attention_prefill into shared memory (keys k0 .. k0 + KEYS - 1, zeros past kv_hi): K as FP16
// rows [KEYS][HD + 8], this block's DV of V's dims as rows [KEYS][DV + 8], and the keys' scales (1 for FP16).
// A thread's chunks of 8 values are c = tid, tid + NT, ...; it issues PF_LB chunks' loads (K and V) before it
// stores any, so a tile costs a few trips to memory, not one or two a chunk (a loop that stored each chunk as it
// came waited out every load in turn: 16 round trips a tile for HD 512). Data movement only: the bits staged are
// those of a chunk at a time.
#ifndef PF_LB
#define PF_LB 8
#endif
template <bool I8, int HD, int DV, int KEYS>
__device__ __forceinline__ void pf_stage(const void* k_pool, const void* v_pool, const float* k_scale, const float* v_scale,
                                         __half* Ks, __half* Vs, float* ksc, float* vsc, int k0, int kv_hi, int n_kv,
                                         int kvh, int dv0) {
    using Raw = typename PfRaw<I8>::T;
    constexpr int LDK = HD + 8, LDV = DV + 8, NT = 32 * PF_WARPS, CH = KEYS * (HD / 8), PER = (CH + NT - 1) / NT;
    constexpr int LB = PER < (I8 ? PF_LB : PF_LB / 2) ? PER : (I8 ? PF_LB : PF_LB / 2);
    constexpr int SPER = (KEYS + NT - 1) / NT;
    float ks[SPER], vs[SPER];
#pragma unroll
    for (int b = 0; b < SPER; ++b) {  // the scales' loads go out with the first chunks'
        const int jj = threadIdx.x + b * NT, j = k0 + jj;
        const bool in = I8 && jj < KEYS && j <= kv_hi;
        ks[b] = in ? k_scale[(long long)j * n_kv + kvh] : 1.f;
        vs[b] = in ? v_scale[(long long)j * n_kv + kvh] : 1.f;
    }
#pragma unroll 1
    for (int b0 = 0; b0 < PER; b0 += LB) {  // a batch at a time: unrolled, a 2-warp block's four spilled (sm_90, 80 bytes)
        Raw kr[LB], vr[LB];
#pragma unroll
        for (int b = 0; b < LB; ++b) {
            const int c = threadIdx.x + (b0 + b) * NT, jj = c / (HD / 8), i = (c % (HD / 8)) * 8, j = k0 + jj;
            const long long off = ((long long)j * n_kv + kvh) * HD + i;
            const bool in = (CH % NT == 0 || c < CH) && b0 + b < PER && j <= kv_hi;
            const bool v_in = in && (DV == HD || (i >= dv0 && i < dv0 + DV));
            kr[b] = in ? pf_load<I8>(k_pool, off) : Raw{};
            vr[b] = v_in ? pf_load<I8>(v_pool, off) : Raw{};
        }
#pragma unroll
        for (int b = 0; b < LB; ++b) {
            const int c = threadIdx.x + (b0 + b) * NT, jj = c / (HD / 8), i = (c % (HD / 8)) * 8;
            if ((CH % NT != 0 && c >= CH) || b0 + b >= PER) continue;
            *reinterpret_cast<uint4*>(Ks + jj * LDK + i) = pf_half8(kr[b]);
            if (DV != HD && (i < dv0 || i >= dv0 + DV)) continue;  // another block's V dims
            *reinterpret_cast<uint4*>(Vs + jj * LDV + i - dv0) = pf_half8(vr[b]);
        }
    }
#pragma unroll
    for (int b = 0; b < SPER; ++b) {
        const int jj = threadIdx.x + b * NT;
        if (jj < KEYS) ksc[jj] = ks[b], vsc[jj] = vs[b];
    }
}

template <int HD, int DV, int KEYS>
__device__ void attention_prefill(const float* q, const void* k_pool, const void* v_pool, const float* k_scale,
                                  const float* v_scale, float* out, int n_tok, int n_heads, int n_kv, int blk,
                                  const int* pos0p, int window, float scale, float softcap) {
    constexpr int LDQ = HD + 8, LDK = HD + 8, LDV = DV + 8, LDO = HD + 4;
    static_assert(DV % 16 == 0, "P V takes V's dims two n-tiles of 8 a ldmatrix");
    extern __shared__ __align__(16) unsigned char sm[];
    __half* Qs = reinterpret_cast<__half*>(sm);  // [PF_ROWS][LDQ]
    __half* Ks = Qs + PF_ROWS * LDQ;             // [KEYS][LDK]
    __half* Vs = Ks + KEYS * LDK;                // [KEYS][LDV]: this block's V dims
    float* ksc = reinterpret_cast<float*>(Vs + KEYS * LDV);  // [KEYS]
    float* vsc = ksc + KEYS;                               // [KEYS]
    float* Of = reinterpret_cast<float*>(Ks);  // [PF_ROWS][LDO] FP32 rows over the K/V area when it is idle (DV == HD)
    const int dv0 = DV == HD ? 0 : blockIdx.z * DV;  // this block's V dims: dv0 ..

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int G = n_heads / n_kv, tok_per_block = PF_ROWS / G;
    const int kvh = blockIdx.y, t0 = blockIdx.x * tok_per_block;
    const int pos0 = *pos0p;
    const bool int8 = k_scale != nullptr;

    // Q: each warp its 16 rows, rotated (INT8) and scaled in FP32, then FP16; rows past the chunk are 0. From 32
    // dims a row sits in the warp's registers (lane l: values l E ..), PF_RB rows' loads out before any is rotated
    // (fwht_regs: fwht_warp's butterflies, the same bits; the rotation's block is HD, the backend's hd & -hd);
    // a row a time through shared memory put 16 dependent global loads on a warp's path (a short prompt's blocks)
    if constexpr (HD >= 32) {
        constexpr int E = HD / 32;
#pragma unroll 1
        for (int r0 = 0; r0 < 16; r0 += PF_RB) {
            float v[PF_RB][E];
#pragma unroll
            for (int b = 0; b < PF_RB; ++b) {
                const int row = 16 * warp + r0 + b, t = t0 + row / G, h = kvh * G + row % G;
                load_lane<E>(v[b], q + ((long long)t * n_heads + h) * HD, t < n_tok);
            }
#pragma unroll
            for (int b = 0; b < PF_RB; ++b) {
                if (int8) fwht_regs<E>(v[b]);
                __half* dst = Qs + (16 * warp + r0 + b) * LDQ + lane * E;
#pragma unroll
                for (int e = 0; e < E; ++e) dst[e] = __float2half_rn(v[b][e] * scale);
            }
        }
    } else {
        for (int rr = 0; rr < 16; ++rr) {
            const int row = 16 * warp + rr, t = t0 + row / G, h = kvh * G + row % G;
            float* qr = Of + row * LDO;
            for (int i = lane; i < HD; i += 32) qr[i] = t < n_tok ? q[((long long)t * n_heads + h) * HD + i] : 0.f;
            if (int8) fwht_warp(qr, HD, blk);
            __syncwarp();
            for (int i = lane; i < HD; i += 32) Qs[row * LDQ + i] = __float2half_rn(qr[i] * scale);
        }
    }
    // this lane's two rows: 16 * warp + g and + 8
    int qpos[2], lo[2];
    bool live[2];
    for (int i = 0; i < 2; ++i) {
        const int t = t0 + (16 * warp + g + 8 * i) / G;
        live[i] = t < n_tok;
        qpos[i] = pos0 + t;
        lo[i] = window > 0 ? max(0, qpos[i] - window + 1) : 0;
    }
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float o[DV / 8][4];
#pragma unroll
    for (int d = 0; d < DV / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

    const int kv_hi = pos0 + min(t0 + tok_per_block, n_tok) - 1;
    const int kv_lo = window > 0 ? max(0, pos0 + t0 - window + 1) : 0;
    for (int k0 = kv_lo; k0 <= kv_hi; k0 += KEYS) {
        __syncthreads();  // every warp is done with the previous tile (and with Q's FP32 staging)
        if (int8)
            pf_stage<true, HD, DV, KEYS>(k_pool, v_pool, k_scale, v_scale, Ks, Vs, ksc, vsc, k0, kv_hi, n_kv, kvh, dv0);
        else
            pf_stage<false, HD, DV, KEYS>(k_pool, v_pool, k_scale, v_scale, Ks, Vs, ksc, vsc, k0, kv_hi, n_kv, kvh, dv0);
        __syncthreads();

        // S = Q K^T: KEYS / 8 n-tiles of 8 keys, k-steps of 16 dims
        float s[KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        const __half* qa = Qs + (16 * warp + g) * LDQ + 2 * tq;
#pragma unroll
        for (int kt = 0; kt < HD / 16; ++kt) {
            const unsigned a[4] = {lds32(qa + 16 * kt), lds32(qa + 8 * LDQ + 16 * kt), lds32(qa + 16 * kt + 8),
                                   lds32(qa + 8 * LDQ + 16 * kt + 8)};
#pragma unroll
            for (int n = 0; n < KEYS / 8; ++n) {
                const __half* kb = Ks + (8 * n + g) * LDK + 16 * kt + 2 * tq;
                mma16816(s[n], a, lds32(kb), lds32(kb + 8));
            }
        }
        // online softmax on the registers: s[n][0..1] row g, keys 8n + 2tq + {0, 1}; s[n][2..3] row g + 8
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1, jj = 8 * n + 2 * tq + (e & 1), j = k0 + jj;
                float v = NEG_INF;
                if (live[i] && j >= lo[i] && j <= qpos[i]) {
                    v = s[n][e] * ksc[jj];
                    if (softcap > 0.f) v = softcap * tanhf(v / softcap);
                }
                s[n][e] = v;
                mx[i] = fmaxf(mx[i], v);
            }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(FULL, mx[i], 2));
            const float m_new = fmaxf(m[i], mx[i]);
            corr[i] = m_new == NEG_INF ? 1.f : __expf(m[i] - m_new);
            m[i] = m_new;
        }
        float sum[2] = {0.f, 0.f};
        unsigned pa[KEYS / 8][2];  // P as FP16 pairs: [n][row g, row g + 8]
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e >> 1;
                p[e] = s[n][e] == NEG_INF ? 0.f : __expf(s[n][e] - m[i]);
                sum[i] += p[e];
                p[e] *= vsc[8 * n + 2 * tq + (e & 1)];
            }
            pa[n][0] = pack_half2(p[0], p[1]);
            pa[n][1] = pack_half2(p[2], p[3]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            sum[i] += __shfl_xor_sync(FULL, sum[i], 1);
            sum[i] += __shfl_xor_sync(FULL, sum[i], 2);
            l[i] = l[i] * corr[i] + sum[i];
        }
#pragma unroll
        for (int d = 0; d < DV / 8; ++d) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
        // O += P V: k-steps of 16 keys (P's n-tiles 2kt and 2kt + 1 are the A fragment), n-tiles of 8 dims, two
        // n-tiles' B fragments a transposing ldmatrix (lanes 0-15 address keys 16 kt .. + 15 at dims 8 d, 16-31 at
        // 8 d + 8)
#pragma unroll
        for (int kt = 0; kt < KEYS / 16; ++kt) {
            const unsigned a[4] = {pa[2 * kt][0], pa[2 * kt][1], pa[2 * kt + 1][0], pa[2 * kt + 1][1]};
            const __half* vb = Vs + (16 * kt + (lane & 15)) * LDV + 8 * (lane >> 4);
#pragma unroll
            for (int d = 0; d < DV / 8; d += 2) {
                unsigned b[4];
                ldsm_x4_trans(b, vb + 8 * d);
                mma16816(o[d], a, b[0], b[1]);
                mma16816(o[d + 1], a, b[2], b[3]);
            }
        }
    }
    const float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
    if constexpr (DV != HD) {  // this block's dims of its rows, unrotated: straight from the registers
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int row = 16 * warp + g + 8 * i, t = t0 + row / G, h = kvh * G + row % G;
            if (t >= n_tok) continue;
            float* dst = out + ((long long)t * n_heads + h) * HD + dv0 + 2 * tq;
#pragma unroll
            for (int d = 0; d < DV / 8; ++d)
                *reinterpret_cast<float2*>(dst + 8 * d) = make_float2(o[d][2 * i] * inv[i], o[d][2 * i + 1] * inv[i]);
        }
        return;
    }
    __syncthreads();  // the K/V area becomes the FP32 output rows
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) Of[(16 * warp + g + 8 * (e >> 1)) * LDO + 8 * d + 2 * tq + (e & 1)] = o[d][e] * inv[e >> 1];
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {  // (a row's rotation in registers from 32 dims, as Q's above)
        const int row = 16 * warp + rr, t = t0 + row / G, h = kvh * G + row % G;
        if (t >= n_tok) break;  // rows are token-major: the warp's later rows are past the chunk too
        float* orow = Of + row * LDO;
        float* dst = out + ((long long)t * n_heads + h) * HD;
        if constexpr (HD >= 32) {
            constexpr int E = HD / 32;
            float v[E];
            load_lane<E>(v, orow, true);
            if (int8) fwht_regs<E>(v);
            if constexpr (E % 4 == 0) {
#pragma unroll
                for (int e = 0; e < E; e += 4)
                    *reinterpret_cast<float4*>(dst + lane * E + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) dst[lane * E + e] = v[e];
            }
        } else {
            if (int8) fwht_warp(orow, HD, blk);
            for (int c = lane; c < HD; c += 32) dst[c] = orow[c];
        }
    }
}

#define PF_INSTANTIATE(NAME, HD, DV, KEYS)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * PF_WARPS) attention_prefill_##NAME(                    \
        const float* q, const void* k_pool, const void* v_pool, const float* k_scale, const float* v_scale,  \
        float* out, int n_tok, int n_heads, int n_kv, int blk, const int* pos0p, int window, float scale,    \
        float softcap, long long k_slot, long long v_slot, long long s_slot) {                              \
        AT_SLOT(pos0p, k_pool, v_pool, k_scale, v_scale, k_slot, v_slot, s_slot);                           \
        GRID_DEP_START();                                                                                    \
        attention_prefill<HD, DV, KEYS>(q, k_pool, v_pool, k_scale, v_scale, out, n_tok, n_heads, n_kv, blk, \
                                        pos0p, window, scale, softcap);                                    \
    }
PF_INSTANTIATE(16, 16, 16, PF_KEYS)
PF_INSTANTIATE(32, 32, 32, PF_KEYS)
PF_INSTANTIATE(64, 64, 64, PF_KEYS)
PF_INSTANTIATE(128, 128, 128, PF_KEYS)
PF_INSTANTIATE(256, 256, 256, PF_KEYS)
PF_INSTANTIATE(256_k32, 256, 256, 32)
PF_INSTANTIATE(512, 512, 256, 32)

// INT8 K/V's rotation back on rows of 32 E floats in place (fwht_regs: the same bits as attention_prefill's own),
// a warp a row: the rows attention_prefill_512 wrote unrotated.
extern "C" __global__ void fwht_rows_16(float* x, int rows) {
    GRID_DEP_START();
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    float v[16];
    float* r = x + (long long)row * 512;
    load_lane<16>(v, r, true);
    fwht_regs<16>(v);
#pragma unroll
    for (int e = 0; e < 16; e += 4) *reinterpret_cast<float4*>(r + lane * 16 + e) = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
}
