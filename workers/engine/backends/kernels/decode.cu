// The fused decode step: one token through the whole model in one launch (decode_step).
//
// A decode step is ~10 small dependent operations per layer; as separate kernels each pays a launch, a
// ramp-up and a drain (4B: ~380 kernels at ~9 us each, against 0.54 ms for its weight bytes). Here one
// block per SM runs every phase of every layer, with a grid-wide barrier between phases that read what
// others wrote. The launch is cooperative, so all blocks are resident and the barriers cannot deadlock.
// Measured (bench/NOTES.md v7) it is not yet faster than the separate kernels: at 16 warps an SM (its
// registers allow no more) the products are bound by instruction issue, and each phase pays ~4 us of input
// coding and ~2.5 us of barrier.
// Per layer, five phases:
//   1. QKV: the residual add and input norm (each block redundantly, into its shared memory), the block's
//      share of the QKV rows (+ bias) -> qkv
//   2. attention: one item per (KV head, split of the keys): the G query heads normed and rotated, and in
//      the split holding the new position its K and V rows stored, a warp a row; then gqa_scan_quads and
//      gqa_merge (attend.cuh), whose last block per KV head merges the splits -> attn
//   3. O: attn -> o
//   4. gate/up: the residual add (+ post-attention norm) and FFN norm, act(gate) * up -> h
//   5. down: h -> p (added to the residual, after the post-FFN norm, by the next phase 1)
// then the final norm, the output layer (-> logits, softcapped) and the argmax (-> token). The residual
// stream alternates between x0 and x1: the phase that adds to it reads one and writes the other (block
// 0), so no block reads what another writes in the same phase.
//
// Products: each block codes its input as the x8 buffer of blocks.cuh in shared memory (plus a float copy
// for the types without a dp4a kernel) and takes a contiguous share of the output rows. A row's 256-value
// units (a K-quant super-block, or 8 blocks of 32) go to the block's octets of 8 lanes in turn, two rounds
// of DK_UNITS loads in flight per octet; each unit's dot goes to shared memory and each row sums its units
// in order, so results do not depend on timing. Numerics are the separate kernels' (q8 codes, float32 elsewhere) up
// to float rounding.
// Cross-block data (every activation buffer) is read with __ldcg: L1 is not coherent within a launch.
//
// common.cuh, blocks.cuh, kv_rows.cuh and attend.cuh come first in this module. The backend compiles it
// per model shape with:
//   DK_G, DK_DPL   query heads per KV head; head dim / 32
//   DK_MAXC        the longest product input (max of d_model, n_heads * head_dim, ffn), a multiple of 32
//   DK_D           d_model
//   DK_TYPES       bit mask of the GGML types the model's matrices use (the others are compiled out)
//   DK_KV          the pools' type: KV_INT8 or KV_F16 (attend.cuh)
//   DK_PREFETCH    1: before each barrier, ask L2 for the block's weights of the next product (measured
//                  slower: bench/NOTES.md v7)
//   DK_THREADS, DK_UNITS  the block size; the 256-value weight units of an octet's round of loads

#ifndef DK_THREADS
#define DK_THREADS 512
#endif
#define DK_WARPS (DK_THREADS / 32)
#define DK_OCTETS (DK_THREADS / 8)
#ifndef DK_UNITS
#define DK_UNITS 1
#endif
#define DK_SCRATCH 4096   // per-unit dots in shared memory
#define DK_OUT 1024       // rows a block finishes at a time
#define DK_MAX_SPLITS 32  // gqa_attend's limit
#define DK_HD (32 * DK_DPL)
#define DK_ATT_WARPS (DK_WARPS < 8192 / (DK_G * DK_HD) ? DK_WARPS : 8192 / (DK_G * DK_HD))  // accs <= 32 KiB
#define DK_X8_BYTES (2 * DK_MAXC + 8 * (DK_MAXC / 32))
static_assert(DK_G + 2 <= DK_WARPS, "attention_phase takes a warp per query head, K and V row");
#ifndef DK_PREFETCH
#define DK_PREFETCH 0
#endif

// Descriptors written by the backend (cupy_decode.py packs the same fields with numpy): every field is 8
// bytes, so the layouts have no padding; dk_sizes lets the host check them.
struct Mat {  // a [rows, cols] weight in GGUF block layout
    const u8* w;
    long long row_bytes, qtype, rows, cols;
};
struct Layer {
    Mat qkv[3];  // side by side: q | k | v rows (neighbours of one type merged)
    long long n_qkv;
    Mat o, gate, up, down;
    const float *attn_norm, *ffn_norm;
    const float *qk_norm, *bqkv, *post_attn_norm, *post_ffn_norm;  // NULL when the model has none
    void *k, *v;                                                    // this slot's pools [n_ctx, n_kv, hd]
    float *k_scale, *v_scale;                                       // [n_ctx, n_kv]; NULL for FP16
    const float *cos_t, *sin_t;                                     // RoPE tables [n_ctx, rope_dim / 2]
    long long window;                                               // 0: global
};
struct Step {
    const Layer* layers;
    long long n_layers, d, n_heads, n_kv, ffn, rope_dim, neox, act, max_splits, blk;
    Mat embed, output;
    const float* out_norm;
    double eps, embed_scale, attn_scale, attn_softcap, final_softcap;
    const long long* ids;  // the token, staged by the backend
    const int* pos;        // its position
    float *x0, *x1, *qkv, *attn, *o, *h, *p, *logits;  // [d] [d] [qkv rows] [H hd] [d] [ffn] [d] [vocab]
    float *part_m, *part_l, *part_acc;                 // attention partials [H, DK_MAX_SPLITS(, hd)]
    int* att_done;                                     // [n_kv] split counters, zero between launches
    unsigned* bar;                                     // [96] grid_sync's counters; zero between launches
    float* am_v;                                       // argmax partials [grid]
    int *am_i, *am_bad, *am_done, *token;
    long long* marks;  // NULL, or [grid, n_marks] clock64() at each phase boundary + 2 globaltimer readings
    long long n_marks;
};
extern "C" __device__ long long dk_sizes[3] = {sizeof(Mat), sizeof(Layer), sizeof(Step)};
extern "C" __device__ int dk_smem_bytes = 4 * DK_MAXC + DK_X8_BYTES + 4 * (DK_SCRATCH + 2 * DK_OUT);

extern __shared__ __align__(16) unsigned char dk_smem[];

// Phase boundaries for bench/gpu_phases.py: per layer, MARKS_PER_LAYER in the order of decode_step.
#define MARKS_PER_LAYER 15
#define DK_MARK(e)                                                                                     \
    do {                                                                                               \
        if (s.marks != nullptr && threadIdx.x == 0) s.marks[(long long)blockIdx.x * s.n_marks + (e)] = clock64(); \
    } while (0)
__device__ __forceinline__ long long global_ns() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// -- grid-wide barrier ------------------------------------------------------------------------------------
// bar: arrivals at bar[0], the generation at bar[32] (its own 128-byte line: blocks poll it while others'
// atomics land on the count), exits at bar[64]. The last block to arrive resets the count and bumps the
// generation; the others wait for the bump. The fences make each block's writes visible before its arrival
// and order its later reads after the others' (cooperative groups' grid sync does the same). `gen` counts
// the barriers this block has passed; the last block out of the launch resets everything for the next one.
#define BAR_COUNT 0
#define BAR_GEN 32
#define BAR_EXIT 64
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned& gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(bar + BAR_COUNT, 1u) == gridDim.x - 1) {
            bar[BAR_COUNT] = 0;
            __threadfence();
            atomicAdd(bar + BAR_GEN, 1u);
        } else {
            while (*reinterpret_cast<volatile unsigned*>(bar + BAR_GEN) == gen) {
            }
        }
        __threadfence();
    }
    ++gen;
    __syncthreads();
}

// -- product inputs in shared memory ------------------------------------------------------------------------
struct Input {
    float* xf;        // [cols] float32
    signed char* x8;  // the x8 buffer of blocks.cuh for cols values
    int cols;
};
__device__ __forceinline__ Input input_of(int cols) {
    float* xf = reinterpret_cast<float*>(dk_smem);
    return {xf, reinterpret_cast<signed char*>(xf + DK_MAXC), cols};
}
__device__ __forceinline__ float* scratch_smem() { return reinterpret_cast<float*>(dk_smem + 4 * DK_MAXC + DK_X8_BYTES); }
__device__ __forceinline__ float* out_smem() { return scratch_smem() + DK_SCRATCH; }  // [2 * DK_OUT]

// A product's input is held in registers first: thread t takes the float4s t, t + DK_THREADS, ... (at most
// DK_VEC), so every load of it is in flight at once, and a sub-block of 32 values is the 8 float4s of one
// octet of lanes, which code it together.
#define DK_VEC ((DK_MAXC + 4 * DK_THREADS - 1) / (4 * DK_THREADS))
#define DK_VEC_D ((DK_D + 4 * DK_THREADS - 1) / (4 * DK_THREADS))  // for the residual stream (d_model values)
__device__ __forceinline__ float4 ldcg4(const float* p, int f) { return __ldcg(reinterpret_cast<const float4*>(p) + f); }
__device__ __forceinline__ float4 ldg4(const float* p, int f) { return __ldg(reinterpret_cast<const float4*>(p) + f); }
__device__ __forceinline__ float sum_sq(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }

// xf and the x8 codes of the input from each thread's float4s v[k]: q8_code's coding (the octet's absmax,
// both codes, the sub-block's sum), with x * (127 / absmax) for x / d (a code may round apart at a .5 tie;
// eight IEEE divisions per float4 made the input take microseconds); ends synchronized.
template <int VEC>
__device__ void store_input(const Input& in, const float4* v) {
    signed char* xq = in.x8;
    signed char* xr = in.x8 + in.cols;
    float* xd = reinterpret_cast<float*>(in.x8 + 2 * in.cols);
    float* xs = xd + in.cols / 32;
    const unsigned mask = 0xFFu << (threadIdx.x & 24);  // this lane's octet
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        const int f = threadIdx.x + k * DK_THREADS;
        if (f >= in.cols / 4) break;  // whole octets: cols is a multiple of 32
        reinterpret_cast<float4*>(in.xf)[f] = v[k];
        const float a4 = fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w)));
        const float amax = __uint_as_float(__reduce_max_sync(mask, __float_as_uint(a4)));
        const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;  // one division, not eight
        const float e[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        int q[4], q2[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q[i] = __float2int_rn(e[i] * inv);
            q2[i] = max(-127, min(127, __float2int_rn((e[i] - q[i] * d) * (254.f * inv))));
        }
        reinterpret_cast<char4*>(xq)[f] = make_char4(q[0], q[1], q[2], q[3]);
        reinterpret_cast<char4*>(xr)[f] = make_char4(q2[0], q2[1], q2[2], q2[3]);
        const int sum = __reduce_add_sync(mask, q[0] + q[1] + q[2] + q[3]);
        const int sum2 = __reduce_add_sync(mask, q2[0] + q2[1] + q2[2] + q2[3]);
        if ((threadIdx.x & 7) == 0) {
            xd[f / 8] = d;
            xs[f / 8] = d * ((float)sum + (float)sum2 * (1.f / 254.f));
        }
    }
    __syncthreads();
}

// The input is src[0, cols) (written by other blocks).
__device__ __noinline__ void plain_input(const Input& in, const float* src) {
    float4 v[DK_VEC];
#pragma unroll
    for (int k = 0; k < DK_VEC; ++k) {
        const int f = threadIdx.x + k * DK_THREADS;
        v[k] = f < in.cols / 4 ? ldcg4(src, f) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    store_input<DK_VEC>(in, v);
}

// The residual add and a norm: v = base + f(add) with f(add) = add, or rms_norm(add) * add_w when add_w is
// set (a post-norm); add may be NULL, and base NULL means xf already holds it (the embedding). Block 0
// stores v to x_out (when set); the input is rms_norm(v) * w.
__device__ __noinline__ void residual_input(const Input& in, const float* base, const float* add, const float* add_w,
                                            float* x_out, const float* w, float eps, float* red) {
    const int n4 = in.cols / 4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 v[DK_VEC_D], a[DK_VEC_D], ww[DK_VEC_D], aw[DK_VEC_D];
    float ss_a = 0.f;
#pragma unroll
    for (int k = 0; k < DK_VEC_D; ++k) {  // every load first: one memory latency for all of them
        const int f = threadIdx.x + k * DK_THREADS;
        const bool in_row = f < n4;
        v[k] = !in_row ? zero : base != nullptr ? ldcg4(base, f) : reinterpret_cast<const float4*>(in.xf)[f];
        a[k] = in_row && add != nullptr ? ldcg4(add, f) : zero;
        ww[k] = in_row ? ldg4(w, f) : zero;
        aw[k] = in_row && add_w != nullptr ? ldg4(add_w, f) : zero;
        ss_a += sum_sq(a[k]);
    }
    float inv_add = 1.f;
    if (add_w != nullptr) {
        inv_add = rsqrtf(block_reduce<false>(ss_a, red) / in.cols + eps);
        __syncthreads();  // red is reused below
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < DK_VEC_D; ++k) {
        const int f = threadIdx.x + k * DK_THREADS;
        if (f >= n4) break;
        float4 t = a[k];
        if (add_w != nullptr) t = make_float4(t.x * inv_add * aw[k].x, t.y * inv_add * aw[k].y, t.z * inv_add * aw[k].z, t.w * inv_add * aw[k].w);
        v[k] = make_float4(v[k].x + t.x, v[k].y + t.y, v[k].z + t.z, v[k].w + t.w);
        if (x_out != nullptr && blockIdx.x == 0) reinterpret_cast<float4*>(x_out)[f] = v[k];
        ss += sum_sq(v[k]);
    }
    const float inv = rsqrtf(block_reduce<false>(ss, red) / in.cols + eps);
#pragma unroll
    for (int k = 0; k < DK_VEC_D; ++k)
        v[k] = make_float4(v[k].x * inv * ww[k].x, v[k].y * inv * ww[k].y, v[k].z * inv * ww[k].z, v[k].w * inv * ww[k].w);
    __syncthreads();  // xf is rewritten (the embedding was read from it)
    store_input<DK_VEC_D>(in, v);
}

// -- matrix rows ---------------------------------------------------------------------------------------------
#define DK_HAS(T) ((DK_TYPES >> (T)) & 1)
#define DK_DISPATCH(qtype, CALL)                          \
    switch ((int)(qtype)) {                               \
        case 0: if (DK_HAS(0)) CALL(0); break;            \
        case 1: if (DK_HAS(1)) CALL(1); break;            \
        case 30: if (DK_HAS(30)) CALL(30); break;         \
        case 2: if (DK_HAS(2)) CALL(2); break;            \
        case 3: if (DK_HAS(3)) CALL(3); break;            \
        case 6: if (DK_HAS(6)) CALL(6); break;            \
        case 7: if (DK_HAS(7)) CALL(7); break;            \
        case 8: if (DK_HAS(8)) CALL(8); break;            \
        case 12: if (DK_HAS(12)) CALL(12); break;         \
        case 13: if (DK_HAS(13)) CALL(13); break;         \
        case 14: if (DK_HAS(14)) CALL(14); break;         \
    }

__device__ __forceinline__ float octet_sum(float v) {  // over the 8 lanes of this lane's octet
    const unsigned mask = 0xFFu << (threadIdx.x & 24);
    v += __shfl_xor_sync(mask, v, 4);
    v += __shfl_xor_sync(mask, v, 2);
    return v + __shfl_xor_sync(mask, v, 1);
}

// Q4_K's octet_dot (blocks.cuh) in about a third of the instructions, same arithmetic up to float rounding:
// the high nibbles stay in place (x16, an unsigned dp4a), the two codes are combined as integers (254 q + q2),
// and a lane's two 6-bit scale pairs come from the 16 bits of each scale word that hold them, without
// branches (lanes 0-3 of an octet read the plain kind, 4-7 the split 4+2-bit kind).
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {  // unsigned bytes of a times signed bytes of b
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ float q4k_dot(const OctetRaw<12>& r, int b, int l, const signed char* xq, const signed char* xr,
                                         const float* xd, const float* xs) {
    const int c = l >> 1, xo = b * 256 + 64 * c + (l & 1) * 16, sb = b * 8 + 2 * c;
    const int4 a = *reinterpret_cast<const int4*>(xq + xo), a2 = *reinterpret_cast<const int4*>(xr + xo);
    const int4 h = *reinterpret_cast<const int4*>(xq + xo + 32), h2 = *reinterpret_cast<const int4*>(xr + xo + 32);
    const unsigned q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
    const int av[4] = {a.x, a.y, a.z, a.w}, av2[4] = {a2.x, a2.y, a2.z, a2.w};
    const int hv[4] = {h.x, h.y, h.z, h.w}, hv2[4] = {h2.x, h2.y, h2.z, h2.w};
    int s1 = 0, s2 = 0, t1 = 0, t2 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned lo = q[i] & 0x0F0F0F0F, hi = q[i] & 0xF0F0F0F0;
        s1 = __dp4a((int)lo, av[i], s1);
        s2 = __dp4a((int)lo, av2[i], s2);
        t1 = dp4a_us(hi, hv[i], t1);
        t2 = dp4a_us(hi, hv2[i], t2);
    }
    const int lo_sum = 254 * s1 + s2, hi_sum = 254 * (t1 >> 4) + (t2 >> 4);  // exact: t1, t2 are multiples of 16
    const int shift = (c & 1) * 16;
    const unsigned y = r.head.y >> shift, z = r.head.z >> shift, w = r.head.w >> shift;
    const bool split = c >= 2;  // sub-blocks 4..7
    const unsigned sc = split ? (w & 0x0F0F) | ((y >> 2) & 0x3030) : y & 0x3F3F;
    const unsigned mn = split ? ((w >> 4) & 0x0F0F) | ((z >> 2) & 0x3030) : z & 0x3F3F;
    const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&r.head.x));
    const float2 d2 = *reinterpret_cast<const float2*>(xd + sb), s2f = *reinterpret_cast<const float2*>(xs + sb);
    const float dot = (float)(lo_sum * (int)(sc & 0xFF)) * d2.x + (float)(hi_sum * (int)((sc >> 8) & 0xFF)) * d2.y;
    const float mins = (float)(mn & 0xFF) * s2f.x + (float)((mn >> 8) & 0xFF) * s2f.y;
    return dm.x * dot * (1.f / 254.f) - dm.y * 0.5f * mins;
}

// scratch[u] = the dot of unit u = i * units_per_row + b (row r0 + i, values [256 b, 256 b + 256)) with the
// input, for rows i < n. Octet o takes units o, o + DK_OCTETS, ...: its (row, unit) pair advances by
// DK_OCTETS units a step, so no unit index is divided.
__device__ __forceinline__ void next_unit(int& r, int& b, int step_r, int step_b, int upr) {
    r += step_r;
    b += step_b;
    if (b >= upr) b -= upr, ++r;
}
template <int T>
__device__ void dot_units(const Mat& m, long long r0, int n, const Input& in, float* scratch) {
    const int oct = threadIdx.x >> 3, l = threadIdx.x & 7, cols = (int)m.cols;
    const long long rb = m.row_bytes;
    const u8* base = m.w + r0 * rb;
    __builtin_assume(__isGlobal(base));
    __builtin_assume(__isShared(in.x8));
    __builtin_assume(__isShared(in.xf));
    if constexpr (T == 12 || T == 14) {  // dp4a on the x8 codes (octet_load / octet_dot of blocks.cuh)
        const int nb = cols >> 8, n_units = n * nb, step_r = DK_OCTETS / nb, step_b = DK_OCTETS % nb;
        const signed char* xq = in.x8;
        const signed char* xr = in.x8 + cols;
        const float* xd = reinterpret_cast<const float*>(in.x8 + 2 * cols);
        const float* xs = xd + cols / 32;
        // two rounds of DK_UNITS units in registers: a round's loads are issued before the previous round is
        // computed, so the loads of one overlap the arithmetic of the other
        constexpr int ROUND = DK_OCTETS * DK_UNITS;
        int r = oct / nb, b = oct % nb;
        OctetRaw<T> raw_a[DK_UNITS], raw_b[DK_UNITS];
        int ba[DK_UNITS], bb[DK_UNITS];
        auto load = [&](int u0, OctetRaw<T>* raw, int* bs) {
#pragma unroll
            for (int i = 0; i < DK_UNITS; ++i) {
                bs[i] = b;
                if (u0 + i * DK_OCTETS < n_units) raw[i] = octet_load<T>(base + (long long)r * rb + (long long)b * Blk<T>::bytes, l);
                next_unit(r, b, step_r, step_b, nb);
            }
        };
        auto compute = [&](int u0, const OctetRaw<T>* raw, const int* bs) {
#pragma unroll
            for (int i = 0; i < DK_UNITS; ++i) {
                const int u = u0 + i * DK_OCTETS;
                if (u < n_units) {  // the same for the whole octet
                    float v;
                    if constexpr (T == 12)
                        v = q4k_dot(raw[i], bs[i], l, xq, xr, xd, xs);
                    else
                        v = octet_dot<T>(raw[i], bs[i], l, xq, xr, xd, xs);
                    v = octet_sum(v);
                    if (l == 0) scratch[u] = v;
                }
            }
        };
        load(oct, raw_a, ba);
        for (int u0 = oct; u0 < n_units; u0 += 2 * ROUND) {
            if (u0 + ROUND < n_units) load(u0 + ROUND, raw_b, bb);
            compute(u0, raw_a, ba);
            if (u0 + ROUND >= n_units) break;
            if (u0 + 2 * ROUND < n_units) load(u0 + 2 * ROUND, raw_a, ba);
            compute(u0 + ROUND, raw_b, bb);
        }
    } else {  // float32 input: lane l takes sub-block l of each unit of 8 (dot32 of blocks.cuh)
        const int n_sb = cols / 32, upr = (n_sb + 7) >> 3, n_units = n * upr;
        const int step_r = DK_OCTETS / upr, step_b = DK_OCTETS % upr;
        int r = oct / upr, b = oct % upr;
        for (int u = oct; u < n_units; u += DK_OCTETS) {
            const int sb = b * 8 + l;
            const float v = octet_sum(sb < n_sb ? dot32<T>(base + (long long)r * rb, sb, in.xf + sb * 32) : 0.f);
            if (l == 0) scratch[u] = v;
            next_unit(r, b, step_r, step_b, upr);
        }
    }
}

// out[i] (shared) = row r0 + i of m times the input, i < n (n <= DK_OUT, n * units_per_row <= DK_SCRATCH).
// One copy for every caller (not inlined): the type switch instantiates dot_units per type.
__device__ __noinline__ void dot_rows(const Mat& m, long long r0, int n, const Input& in, float* out) {
    float* scratch = scratch_smem();
#define DK_DOT(T) dot_units<T>(m, r0, n, in, scratch)
    DK_DISPATCH(m.qtype, DK_DOT)
#undef DK_DOT
    __syncthreads();
    const int upr = (int)((m.cols + 255) >> 8);
    for (int i = threadIdx.x; i < n; i += DK_THREADS) {
        float s = 0.f;
        for (int b = 0; b < upr; ++b) s += scratch[i * upr + b];
        out[i] = s;
    }
    __syncthreads();
}

__device__ __forceinline__ int rows_per_chunk(const Mat& m) {
    return min(DK_OUT, DK_SCRATCH / (int)((m.cols + 255) >> 8));
}

// This block's share [lo, hi) of `total` output rows.
__device__ __forceinline__ void block_share(long long total, long long& lo, long long& hi) {
    lo = total * blockIdx.x / gridDim.x;
    hi = total * (blockIdx.x + 1) / gridDim.x;
}
// The output row of parts[0, n_parts) (side by side) at which their weight bytes reach `bytes`.
__device__ long long row_at_bytes(const Mat* parts, int n_parts, long long bytes) {
    long long row = 0;
    for (int p = 0; p < n_parts; ++p) {
        const long long rb = parts[p].row_bytes, size = parts[p].rows * rb;
        if (bytes < size || p == n_parts - 1) return row + min(parts[p].rows, (bytes + rb / 2) / rb);
        bytes -= size, row += parts[p].rows;
    }
    return row;
}
// This block's share of the rows of parts of several types: equal bytes, not rows (a Q6_K row of the same
// width is 1.5 Q4_K rows of work).
__device__ void block_share_bytes(const Mat* parts, int n_parts, long long& lo, long long& hi) {
    long long total = 0;
    for (int p = 0; p < n_parts; ++p) total += parts[p].rows * parts[p].row_bytes;
    lo = row_at_bytes(parts, n_parts, total * blockIdx.x / gridDim.x);
    hi = row_at_bytes(parts, n_parts, total * (blockIdx.x + 1) / gridDim.x);
}

// A thread's running argmax over the logits it wrote (the output layer).
struct Argmax {
    float best;
    int idx, bad;
};

// Rows [lo, hi) of a product whose outputs are parts[0, n_parts) side by side: dst[row] = value (+ bias[row]),
// softcapped when cap > 0; am, when set, follows the largest (a thread's rows increase: the first of equals).
__device__ __noinline__ void product(const Mat* parts, int n_parts, long long lo, long long hi, const Input& in,
                                     float* dst, const float* bias, float cap, Argmax* am) {
    float* out = out_smem();
    long long base = 0;
    for (int p = 0; p < n_parts; ++p) {
        const Mat& m = parts[p];
        const long long a = max(lo, base), b = min(hi, base + m.rows);
        const int chunk = rows_per_chunk(m);
        for (long long r = a; r < b; r += chunk) {
            const int n = (int)min((long long)chunk, b - r);
            dot_rows(m, r - base, n, in, out);
            for (int i = threadIdx.x; i < n; i += DK_THREADS) {
                float v = out[i];
                if (bias != nullptr) v += bias[r + i];
                if (cap > 0.f) v = cap * tanhf(v / cap);
                dst[r + i] = v;
                if (am != nullptr) {
                    if (!isfinite(v)) am->bad = 1;
                    if (v > am->best) am->best = v, am->idx = (int)(r + i);
                }
            }
            __syncthreads();
        }
        base += m.rows;
    }
}

// Asks L2 for rows [lo, hi) of the parts (their bytes, 16-byte aligned inside), spread over the threads.
__device__ void prefetch_rows(const Mat* parts, int n_parts, long long lo, long long hi) {
#if DK_PREFETCH
    constexpr long long CHUNK = 16384;
    long long base = 0;
    for (int p = 0; p < n_parts; ++p) {
        const Mat& m = parts[p];
        const long long a = max(lo, base), b = min(hi, base + m.rows);
        if (a < b) {
            const unsigned long long first = (reinterpret_cast<unsigned long long>(m.w + (a - base) * m.row_bytes) + 15) & ~15ull;
            const unsigned long long last = reinterpret_cast<unsigned long long>(m.w + (b - base) * m.row_bytes) & ~15ull;
            for (unsigned long long c = first + threadIdx.x * CHUNK; c < last; c += DK_THREADS * CHUNK) {
                const unsigned size = (unsigned)min((unsigned long long)CHUNK, last - c);
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(c), "r"(size) : "memory");
            }
        }
        base += m.rows;
    }
#endif
}
__device__ __forceinline__ void prefetch_share(const Mat* parts, int n_parts) {
    long long lo, hi;
    block_share_bytes(parts, n_parts, lo, hi);
    prefetch_rows(parts, n_parts, lo, hi);
}

template <int T>
__device__ void embed_rows(const Mat& m, long long id, float scale, float* xf) {
    const u8* row = m.w + id * m.row_bytes;
    for (int sb = threadIdx.x; sb < (int)m.cols / 32; sb += DK_THREADS) {
        float v[32];
        deq32<T>(row, sb, v);
#pragma unroll
        for (int k = 0; k < 32; ++k) xf[sb * 32 + k] = v[k] * scale;
    }
}

// -- attention -----------------------------------------------------------------------------------------------
__device__ __noinline__ void attention_phase(const Step& s, const Layer& L, int pos, float eps) {
    constexpr int G = DK_G, HD = DK_HD;
    __shared__ __align__(16) float qs[G * HD];
    __shared__ __align__(16) float kv_rows[2][HD];
    const int n_kv = (int)s.n_kv, H = (int)s.n_heads, rope_dim = (int)s.rope_dim, neox = (int)s.neox, blk = (int)s.blk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int lo = L.window > 0 ? max(0, pos - (int)L.window + 1) : 0, len = pos - lo + 1;
    // splits of one task of 8 keys per warp, up to max_splits (the grid's share per KV head), so a block's
    // item takes about one task's time (gqa_scan_quads)
    const int n_splits = max(1, min((int)s.max_splits, (len + 8 * DK_ATT_WARPS - 1) / (8 * DK_ATT_WARPS)));
    const int share = (len + n_splits - 1) / n_splits;
    constexpr bool int8 = DK_KV == KV_INT8;
    for (int item = blockIdx.x; item < n_kv * n_splits; item += gridDim.x) {
        const int kvh = item / n_splits, split = item % n_splits;
        const int j0 = lo + split * share, j1 = min(pos, j0 + share - 1);
        const bool holds_new = j0 <= pos && j1 == pos;  // this split stores the new K and V rows first
        // a warp per row: the G query heads (normed, rotated by RoPE, then into the pools' basis), K, V
        if (warp < G) {
            const int h = kvh * G + warp;
            float* row = qs + warp * HD;
            for (int i = lane; i < HD; i += 32) row[i] = __ldcg(s.qkv + (long long)h * HD + i);
            norm_rope<true>(row, HD, L.qk_norm ? L.qk_norm + (long long)h * HD : nullptr, eps, L.cos_t, L.sin_t, rope_dim,
                            neox, pos, nullptr);
            if (int8) fwht_warp(row, HD, blk);  // blk divides HD: each head rotates alone
        } else if (holds_new && warp == G) {
            float* row = kv_rows[0];
            for (int i = lane; i < HD; i += 32) row[i] = __ldcg(s.qkv + (long long)(H + kvh) * HD + i);
            norm_rope<true>(row, HD, L.qk_norm ? L.qk_norm + (long long)(H + kvh) * HD : nullptr, eps, L.cos_t, L.sin_t,
                            rope_dim, neox, pos, nullptr);
            store_row_by<true>(row, HD, blk, L.k, L.k_scale, (long long)pos * n_kv + kvh, nullptr);
        } else if (holds_new && warp == G + 1) {
            float* row = kv_rows[1];
            for (int i = lane; i < HD; i += 32) row[i] = __ldcg(s.qkv + (long long)(H + n_kv) * HD + (long long)kvh * HD + i);
            store_row_by<true>(row, HD, blk, L.v, L.v_scale, (long long)pos * n_kv + kvh, nullptr);
        }
        __syncthreads();  // the queries are in qs, the new rows in the pools for this block's reads below
        float acc[G][DK_DPL], m[G], l[G];
        gqa_scan_quads<G, DK_DPL, DK_ATT_WARPS, DK_KV>(qs, L.k, L.v, L.k_scale, L.v_scale, n_kv, kvh, j0, j1,
                                                       (float)s.attn_scale, (float)s.attn_softcap, acc, m, l);
        gqa_merge<G, DK_DPL, DK_ATT_WARPS>(acc, m, l, qs, int8, blk, (long long)kvh * G, split, n_splits, s.part_m,
                                           s.part_l, s.part_acc, s.att_done + kvh, s.attn + (long long)kvh * G * HD);
        __syncthreads();  // qs and kv_rows are reused by the next item
    }
}

// -- the output layer and the argmax ------------------------------------------------------------------------
__device__ __noinline__ void output_phase(const Step& s, const Input& in) {
    __shared__ bool last;
    long long lo, hi;
    block_share(s.output.rows, lo, hi);
    Argmax am = {NEG_INF, 0x7fffffff, 0};
    product(&s.output, 1, lo, hi, in, s.logits, nullptr, (float)s.final_softcap, &am);
    float best = am.best;
    int idx = am.idx, bad = am.bad;
    argmax_block(best, idx, bad);
    if (threadIdx.x == 0) {
        s.am_v[blockIdx.x] = best, s.am_i[blockIdx.x] = idx, s.am_bad[blockIdx.x] = bad;
        __threadfence();
        last = atomicAdd(s.am_done, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = NEG_INF, idx = 0x7fffffff, bad = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += DK_THREADS) {
        const float v = __ldcg(s.am_v + b);
        const int i = __ldcg(s.am_i + b);
        if (argmax_better(v, i, best, idx)) best = v, idx = i;
        bad |= __ldcg(s.am_bad + b);
    }
    argmax_block(best, idx, bad);
    if (threadIdx.x == 0) {
        *s.token = (bad || idx == 0x7fffffff) ? -1 : idx;
        *s.am_done = 0;
    }
}

// -- the step -----------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(DK_THREADS, 1) decode_step(const Step* __restrict__ sp) {
    const Step& s = *sp;
    __shared__ float red[32];
    unsigned gen = 0;  // barriers passed
    const int pos = *s.pos;
    const int d = (int)s.d, ffn = (int)s.ffn;
    const float eps = (float)s.eps;
    const int act = (int)s.act;
    const Layer* prev = nullptr;
    long long lo, hi;
    if (s.marks != nullptr && blockIdx.x == 0 && threadIdx.x == 0) s.marks[gridDim.x * s.n_marks] = global_ns();
    for (int li = 0; li < (int)s.n_layers; ++li) {
        const Layer& L = s.layers[li];
        const int mk = li * MARKS_PER_LAYER;
        // 1. QKV
        DK_MARK(mk);
        Input in = input_of(d);
        if (prev == nullptr) {
#define DK_EMBED(T) embed_rows<T>(s.embed, s.ids[0], (float)s.embed_scale, in.xf)
            DK_DISPATCH(s.embed.qtype, DK_EMBED)
#undef DK_EMBED
            __syncthreads();
            residual_input(in, nullptr, nullptr, nullptr, s.x1, L.attn_norm, eps, red);
        } else {
            residual_input(in, s.x0, s.p, prev->post_ffn_norm, s.x1, L.attn_norm, eps, red);
        }
        DK_MARK(mk + 1);
        block_share_bytes(L.qkv, (int)L.n_qkv, lo, hi);
        product(L.qkv, (int)L.n_qkv, lo, hi, in, s.qkv, L.bqkv, 0.f, nullptr);
        DK_MARK(mk + 2);
        prefetch_share(&L.o, 1);
        grid_sync(s.bar, gen);
        DK_MARK(mk + 3);
        // 2. attention
        attention_phase(s, L, pos, eps);
        DK_MARK(mk + 4);
        prefetch_share(&L.gate, 1);
        prefetch_share(&L.up, 1);
        grid_sync(s.bar, gen);
        DK_MARK(mk + 5);
        // 3. O
        in = input_of((int)L.o.cols);
        plain_input(in, s.attn);
        DK_MARK(mk + 6);
        block_share(d, lo, hi);
        product(&L.o, 1, lo, hi, in, s.o, nullptr, 0.f, nullptr);
        DK_MARK(mk + 7);
        prefetch_share(&L.down, 1);
        grid_sync(s.bar, gen);
        DK_MARK(mk + 8);
        // 4. gate and up: h = act(gate) * up
        in = input_of(d);
        residual_input(in, s.x1, s.o, L.post_attn_norm, s.x0, L.ffn_norm, eps, red);
        DK_MARK(mk + 9);
        block_share(ffn, lo, hi);
        {
            float* out = out_smem();
            const int chunk = rows_per_chunk(L.gate);
            for (long long j = lo; j < hi; j += chunk) {
                const int n = (int)min((long long)chunk, hi - j);
                dot_rows(L.gate, j, n, in, out);
                dot_rows(L.up, j, n, in, out + DK_OUT);
                for (int i = threadIdx.x; i < n; i += DK_THREADS) s.h[j + i] = gated(out[i], out[DK_OUT + i], act);
                __syncthreads();
            }
        }
        DK_MARK(mk + 10);
        if (li + 1 < (int)s.n_layers)
            prefetch_share(s.layers[li + 1].qkv, (int)s.layers[li + 1].n_qkv);
        else
            prefetch_share(&s.output, 1);
        grid_sync(s.bar, gen);
        DK_MARK(mk + 11);
        // 5. down
        in = input_of(ffn);
        plain_input(in, s.h);
        DK_MARK(mk + 12);
        block_share(d, lo, hi);
        product(&L.down, 1, lo, hi, in, s.p, nullptr, 0.f, nullptr);
        DK_MARK(mk + 13);
        grid_sync(s.bar, gen);
        DK_MARK(mk + 14);
        prev = &L;
    }
    const int mk = (int)s.n_layers * MARKS_PER_LAYER;
    Input in = input_of(d);
    residual_input(in, s.x0, s.p, prev->post_ffn_norm, nullptr, s.out_norm, eps, red);
    DK_MARK(mk);
    output_phase(s, in);
    DK_MARK(mk + 1);
    if (s.marks != nullptr && blockIdx.x == 0 && threadIdx.x == 0) s.marks[gridDim.x * s.n_marks + 1] = global_ns();
    if (threadIdx.x == 0) {  // the last block out resets the generation for the next launch
        __threadfence();
        if (atomicAdd(s.bar + BAR_EXIT, 1u) == gridDim.x - 1) {
            s.bar[BAR_GEN] = 0;
            s.bar[BAR_EXIT] = 0;
            __threadfence();
        }
    }
}
