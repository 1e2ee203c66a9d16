// The per-layer operations of the CuPy backend other than attention, one fused kernel each: RMSNorm (with the
// residual add), RoPE, the gated activation, the K/V write (INT8 with the Hadamard rotation of docs/kv-cache.md,
// or FP16) and the decode step's q/k/v post-processing, and greedy sampling. Each replaces a chain of CuPy array
// operations with one launch; numerics follow the NumPy backend. common.cuh and kv_rows.cuh come first in this
// module, attend.cuh too (backends/cupy/kernels.py: OPS_SOURCES).

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w[r % w_rows, :]; one block per row.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int d, int w_rows, float eps) {
    GRID_DEP_START();
    __shared__ float red[32];
    const long long r = blockIdx.x;
    const float* xr = x + r * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_reduce<false>(ss, red) / d + eps);
    const float* wr = w + (r % w_rows) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[r * d + i] = xr[i] * inv * wr[i];
}

// x[r, :] += res[r, :] in place, then y[r, :] = rms_norm(x[r, :]) * w: the residual add fused with the
// next norm. One block per row; each thread reads back only the elements it wrote.
extern "C" __global__ void add_rms_norm(float* x, const float* res, const float* w, float* y, int d, float eps) {
    GRID_DEP_START();
    __shared__ float red[32];
    const long long r = blockIdx.x;
    float* xr = x + r * d;
    const float* rr = res + r * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = xr[i] + rr[i];
        xr[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_reduce<false>(ss, red) / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[r * d + i] = xr[i] * inv * w[i];
}

// out[r, :] = (x[r, :] + rms_norm(y[r, :]) * w) * s: a post-norm's residual add (Gemma 4's FFN output and its
// per-layer input), times the layer's scale *s (1 when s is null). The norm's product is
// rounded before the add, as rms_norm then an add would round it. One block per row.
extern "C" __global__ void add_normed(const float* x, const float* y, const float* w, const float* s, float* out,
                                      int d, float eps) {
    GRID_DEP_START();
    __shared__ float red[32];
    const long long r = blockIdx.x;
    const float* yr = y + r * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += yr[i] * yr[i];
    const float inv = rsqrtf(block_reduce<false>(ss, red) / d + eps);
    const float scale = s == nullptr ? 1.f : *s;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        out[r * d + i] = __fmul_rn(__fadd_rn(x[r * d + i], __fmul_rn(__fmul_rn(yr[i], inv), w[i])), scale);
}

// The position of a batch's first token is read from device memory (pos0p), so a captured CUDA graph
// replays a decode step at any position.

// Rotary embedding in place on x [n_tok, n_heads, hd] at positions pos0 + t, tables [n_pos, rope_dim / 2].
extern "C" __global__ void rope(float* x, const float* cos_t, const float* sin_t, int n_tok, int n_heads, int hd,
                                int rope_dim, const int* pos0p, int neox) {
    GRID_DEP_START();
    const int half = rope_dim / 2, pos0 = *pos0p;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * n_heads * half) return;
    const int p = (int)(i % half);
    const long long row = i / half;  // token * n_heads + head
    const int t = (int)(row / n_heads);
    const float c = cos_t[(long long)(pos0 + t) * half + p], s = sin_t[(long long)(pos0 + t) * half + p];
    float* xr = x + row * hd;
    const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    const float x0 = xr[a], x1 = xr[b];
    xr[a] = x0 * c - x1 * s;
    xr[b] = x0 * s + x1 * c;
}

// out[t, j] = act(gu[t, j]) * gu[t, ffn + j]; kind 0 = SiLU, 1 = GELU (tanh approximation).
extern "C" __global__ void gated_act(const float* gu, float* out, int n_tok, int ffn, int kind) {
    GRID_DEP_START();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * ffn) return;
    const long long t = i / ffn, j = i % ffn;
    out[i] = gated(gu[t * 2 * ffn + j], gu[t * 2 * ffn + ffn + j], kind);
}


// out[t, j] = act(g[t, j]) * u[t * u_ld + j] for t < n_tok, j < cols: the gate and the up part apart (Gemma 4's
// per-layer input: its gate product beside a row of the step's per-layer embeddings, u_ld floats apart).
extern "C" __global__ void gated_pair(const float* g, const float* u, float* out, int n_tok, int cols, long long u_ld,
                                      int kind) {
    GRID_DEP_START();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tok * cols) return;
    const long long t = i / cols, j = i % cols;
    out[i] = gated(g[i], u[t * u_ld + j], kind);
}

// Store K rows [n_tok, n_heads, hd] and V rows [n_tok, n_heads, hdv] at positions pos0 + t of one slot's
// pools [n_ctx, n_heads, hd(v)] (the staged slot's: AT_SLOT): blockIdx.y 0 writes K, 1 writes V (one launch for both). One block per
// (token, head), blockDim.x >= 32; dynamic shared memory max(hd, hdv) floats.
extern "C" __global__ void kv_write(const float* k_src, const float* v_src, void* k_dst, void* v_dst, float* k_scales,
                                    float* v_scales, int n_heads, int hd, int hdv, int blk, int blk_v, const int* pos0p,
                                    long long k_slot, long long v_slot, long long s_slot) {
    AT_SLOT(pos0p, k_dst, v_dst, k_scales, v_scales, k_slot, v_slot, s_slot);
    GRID_DEP_START();
    extern __shared__ float buf[];
    __shared__ float red[32];
    const bool is_v = blockIdx.y == 1;
    const int d = is_v ? hdv : hd;
    const long long row = blockIdx.x;  // t * n_heads + h
    const float* src = (is_v ? v_src : k_src) + row * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) buf[i] = src[i];
    store_kv_row(buf, d, is_v ? blk_v : blk, is_v ? v_dst : k_dst, is_v ? v_scales : k_scales,
                 (long long)(*pos0p) * n_heads + row, red);
}

// After a layer's QKV product, in one launch: q and k heads normed (qk_norm rows [H + Hkv, hd], or none)
// and rotated in place (RoPE at pos0 + t, tables [n_pos, rope_dim / 2]), v heads normed without a weight
// when v_norm, k and v heads stored in the slot's pools as kv_write does. qkv [n_tok, (H + Hkv) * hd +
// Hkv * hdv]; grid (n_tok, H + 2 Hkv): block y < H a q head, then the k heads, then the v heads; dynamic
// shared memory max(hd, hdv) floats.
extern "C" __global__ void qkv_post(float* qkv, int n_heads, int n_kv, int hd, int hdv, const float* qk_norm, float eps,
                                    int v_norm, const float* cos_t, const float* sin_t, int rope_dim, int neox,
                                    const int* pos0p, void* k_dst, void* v_dst, float* k_scales, float* v_scales, int blk,
                                    int blk_v, long long k_slot, long long v_slot, long long s_slot) {
    AT_SLOT(pos0p, k_dst, v_dst, k_scales, v_scales, k_slot, v_slot, s_slot);
    GRID_DEP_START();
    extern __shared__ float buf[];
    __shared__ float red[32];
    const int t = blockIdx.x, head = blockIdx.y, pos0 = *pos0p;
    const long long row_len = (long long)(n_heads + n_kv) * hd + (long long)n_kv * hdv;
    if (head >= n_heads + n_kv) {  // a v head: store it
        const int vh = head - n_heads - n_kv;
        const float* src = qkv + t * row_len + (long long)(n_heads + n_kv) * hd + (long long)vh * hdv;
        float ss = 0.f;
        for (int i = threadIdx.x; i < hdv; i += blockDim.x) {
            buf[i] = src[i];
            ss += buf[i] * buf[i];
        }
        if (v_norm) {  // RMSNorm without a weight (Gemma 4); each thread scales the values it loaded
            const float inv = rsqrtf(block_reduce<false>(ss, red) / hdv + eps);
            for (int i = threadIdx.x; i < hdv; i += blockDim.x) buf[i] *= inv;
        }
        store_kv_row(buf, hdv, blk_v, v_dst, v_scales, (long long)(pos0 + t) * n_kv + vh, red);
        return;
    }
    float* x = qkv + t * row_len + (long long)head * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) buf[i] = x[i];
    norm_rope<false>(buf, hd, qk_norm ? qk_norm + (long long)head * hd : nullptr, eps, cos_t, sin_t, rope_dim, neox,
                     pos0 + t, red);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = buf[i];
    if (head >= n_heads) store_kv_row(buf, hd, blk, k_dst, k_scales, (long long)(pos0 + t) * n_kv + head - n_heads, red);
}


// Greedy sampling on the device, a row of x each blockIdx.y (rows `stride` floats apart): out[y] = the index of
// the largest of the row's x[0, n) (the first on ties, as numpy.argmax), or -1 when any value is not finite, so
// only those ints cross to the host. Each block reduces a strided share into the row's part_v / part_i
// (part_bad: a non-finite value seen); the row's last block to finish (counted in done[y], zero between
// launches) reduces those, one per thread (gridDim.x <= blockDim.x).
extern "C" __global__ void argmax_rows(const float* x, long long stride, int n, float* part_v, int* part_i, int* part_bad,
                                       int* done, int* out) {
    GRID_DEP_START();
    x += blockIdx.y * stride;
    part_v += blockIdx.y * gridDim.x, part_i += blockIdx.y * gridDim.x, part_bad += blockIdx.y * gridDim.x;
    done += blockIdx.y, out += blockIdx.y;
    __shared__ bool last;
    float best = NEG_INF;
    int idx = 0x7fffffff, bad = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        if (!isfinite(v)) bad = 1;
        if (v > best) best = v, idx = i;  // i increases within a thread: the first of equals stays
    }
    argmax_block(best, idx, bad);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = best, part_i[blockIdx.x] = idx, part_bad[blockIdx.x] = bad;
        __threadfence();
        last = atomicAdd(done, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = NEG_INF, idx = 0x7fffffff, bad = 0;
    if (threadIdx.x < gridDim.x) {
        best = __ldcg(part_v + threadIdx.x);
        idx = __ldcg(part_i + threadIdx.x);
        bad = __ldcg(part_bad + threadIdx.x);
    }
    argmax_block(best, idx, bad);
    if (threadIdx.x == 0) {
        out[0] = (bad || idx == 0x7fffffff) ? -1 : idx;
        done[0] = 0;
    }
}


// A decode step replayed straight after the one before it, of the same rows (steps.py, replay_ahead): row j's
// token, tok[j] (argmax_rows of that step), becomes its id, and every position the step reads moves one on: the
// step's own (step_pos[0]) and, with several rows (many), each row's in the segments' pairs and in dec's third
// part (rows, slots, positions). Nothing comes from the host between the two steps.
extern "C" __global__ void advance_decode(const int* tok, long long* ids, int n, int many, int* step_pos, int* seg_pos,
                                          int* dec) {
    const int j = threadIdx.x;
    if (j < n) {
        const int t = tok[j];
        ids[j] = t < 0 ? 0 : t;  // -1: non-finite logits end that row's sequence; its row of this step is never read
        if (many) {
            seg_pos[2 * j] += 1;
            dec[2 * n + j] += 1;
        }
    }
    if (j == 0) step_pos[0] += 1;
}

// A slot's rows of several pools, one after the other into out (a KV save: kv_cache.py, KVCache.start_export):
// array a (blockIdx.y) is tab[4a .. 4a + 3] = its base address, the bytes from one slot to the next, the bytes of
// a position, and the bytes of a position of the arrays before it; positions [0, n) of `slot` land at
// out + n * tab[4a + 3]. Sixteen bytes at a time where the run allows it (INT8 and FP16 rows; a single KV head's
// float scales are 4 bytes a position).
extern "C" __global__ void gather_slot_rows(const long long* tab, long long slot, long long n, char* out) {
    const long long* t = tab + 4 * blockIdx.y;
    const char* src = reinterpret_cast<const char*>(t[0]) + slot * t[1];
    char* dst = out + n * t[3];
    const long long len = n * t[2];
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
    if (((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst) | len) & 15) == 0) {
        const int4* s = reinterpret_cast<const int4*>(src);
        int4* d = reinterpret_cast<int4*>(dst);
        for (long long i = start; i < len / 16; i += step) d[i] = __ldg(s + i);
    } else {
        for (long long i = start; i < len; i += step) dst[i] = src[i];
    }
}
