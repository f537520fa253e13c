/* netrt_attention.cuh - scaled dot-product attention on the GPU: a deterministic kernel in the
 * manner of FlashAttention-2, of our own (included by netrt_kernels.cuh).
 *
 * NOTE: this code compiles under NVRTC (tests/cuda: cuda_kernels_nvrtc) and runs in the CPU
 * emulation (tests/cuda/emu/attention.net), but it has never run on a GPU; it is written for
 * correctness and determinism first, not speed (no tensor cores, one thread per row).
 *
 * The geometry is runtime/netrt.h's RtAttn: BH independent slices, q [T, D], k [S, D], v [S, E],
 * out [T, E] = softmax(q k^T * scale + mask) v, keys j > query i left out when causal; the mask
 * f32 (added) or u8 (0 leaves the key out), read through strides; under grouped-query attention
 * `group` query slices read one key/value slice (bh / group). D and E are template
 * parameters, so each thread keeps its query row and accumulator in registers. Each operand lies
 * where its view (RtKAttnView, netrt.h's RtAttnView) puts it: dense slices, or the heads read
 * from the tokens as the projections wrote them, a row stride apart (q and dq share q's view, k
 * and dk k's, v and dv v's, out and dout o's).
 *
 *   forward          one block per (slice, tile of 256 query rows), a thread per row; the keys
 *                    and values in tiles of KT rows through shared memory, the online softmax
 *                    per tile (running maximum m and sum l, o rescaled by exp(m_old - m_new)).
 *                    Under causal masking the tiles past the block's last row are not visited.
 *   backward, rows   the same grid: a thread per query row recomputes its log-sum-exp (one pass
 *                    over the keys), delta = dout . out, and dq (a second pass); lse and delta
 *                    go to the packed result's scratch tail for the next kernel.
 *   backward, keys   one block per (key/value slice, tile of 256 keys), a thread per key: dk and
 *                    dv summed over the query rows of its query slices in order, the rows in
 *                    tiles through shared memory.
 * No atomics: every sum has one owner and a fixed order, so replays give the same bits. The CPU
 * kernels (rt_attention.c) sum in another order (block products), so the two agree to float
 * rounding, not bit for bit. A row with no key left gives 0 and no gradient, as on the CPU.
 * With attention dropout (RtKAttn.dropout) each probability's factor comes from the counter-based
 * hash of rt_bits.h, the same on the CPU, so no mask is stored: the softmax's sums stay the
 * undropped ones, o and dv take the dropped probabilities, and dS = P (z dP - delta).
 */
#ifndef NETRT_ATTENTION_CUH
#define NETRT_ATTENTION_CUH

/* netrt.h's RtAttnView: floats between batch entries and between rows; 0, 0: dense slices. */
struct RtKAttnView {
    int64_t batch, row;
};

/* netrt.h's RtAttn, as the generated kernels write it. */
struct RtKAttn {
    int64_t BH, T, S, D, E;
    float scale;
    int causal, mask, n_lead; /* mask: 0 none, 1 f32 added, 2 u8 keep */
    int64_t lead[4], mask_lead[4];
    int64_t mask_t, mask_s;
    int64_t group; /* query slices per key/value slice; 0 (left out) or 1: one */
    double dropout; /* attention(..., dropout = p) in training, with the mask seed_id at the step's seed */
    int seed_id;
    unsigned long long seed;
    RtKAttnView q, k, v, o; /* where the slices lie; left out: dense */
};

/* Query slices per key/value slice: RtKAttn.group, 0 read as 1. */
static __device__ __forceinline__ int64_t rt_attn_group(const RtKAttn &a) { return a.group > 1 ? a.group : 1; }

/* netrt.h's rt_attn_at, rt_attn_ld: the first element of slice s of an operand viewed by w, whose
 * slices are rows x width with `heads` of them per batch entry, and the floats between its rows. */
static __device__ __forceinline__ int64_t rt_attn_at(const RtKAttnView &w, int64_t s, int64_t heads, int64_t rows,
                                                     int64_t width) {
    return w.row ? s / heads * w.batch + s % heads * width : s * rows * width;
}
static __device__ __forceinline__ int64_t rt_attn_ld(const RtKAttnView &w, int64_t width) {
    return w.row ? w.row : width;
}
/* Query slices per batch entry (the last leading axis), and key/value slices. */
static __device__ __forceinline__ int64_t rt_attn_heads(const RtKAttn &a) {
    return a.n_lead ? a.lead[a.n_lead - 1] : 1;
}
static __device__ __forceinline__ int64_t rt_attn_kv_heads(const RtKAttn &a) {
    return rt_attn_heads(a) / rt_attn_group(a);
}

/* Probability (bh, i, j)'s dropout factor: 0 where dropped, 1 / (1 - p) rounded to float where
 * kept, 1 without dropout (netrt.h's rt_attn_drop). */
static __device__ __forceinline__ float rt_attn_drop(const RtKAttn &a, int64_t bh, int64_t i, int64_t j) {
    if (a.dropout <= 0) return 1.0f;
    return rt_dropout_keep(a.seed, a.seed_id, (bh * a.T + i) * a.S + j, a.dropout) ? (float)(1.0 / (1.0 - a.dropout))
                                                                                   : 0.0f;
}

/* Key (or query) rows per shared-memory tile: 32, or as many as fit 4096 floats (16 KiB). */
#define RT_K_ATTN_TILE(D, E) ((D) + (E) <= 128 ? 32 : 4096 / ((D) + (E)) > 0 ? 4096 / ((D) + (E)) : 1)

static __device__ __forceinline__ int64_t rt_attn_mask_base(const RtKAttn &a, int64_t bh) {
    int64_t off = 0;
    for (int i = a.n_lead - 1; i >= 0; i--) {
        off += bh % a.lead[i] * a.mask_lead[i];
        bh /= a.lead[i];
    }
    return off;
}

/* The scaled score s of query i and key j with causal masking and the mask applied. */
static __device__ __forceinline__ float rt_attn_score(const RtKAttn &a, const void *mask, int64_t mbase, int64_t i,
                                                      int64_t j, float s) {
    if (a.causal && j > i) return -INFINITY;
    const int64_t at = mbase + i * a.mask_t + j * a.mask_s;
    if (a.mask == 1) return s + ((const float *)mask)[at];
    if (a.mask == 2 && !((const uint8_t *)mask)[at]) return -INFINITY;
    return s;
}

/* The larger of m and s, NaN once either is (fmaxf would skip a NaN score): as the CPU's. */
static __device__ __forceinline__ float rt_attn_max(float m, float s) { return s > m || s != s ? s : m; }

/* Copy rows [r0, r0 + n) of a slice of W columns whose rows lie ld floats apart into shared s
 * (rows W apart), the block's threads together. */
template <int W>
static __device__ __forceinline__ void rt_attn_load(float *s, const float *x, int64_t ld, int64_t r0, int64_t n) {
    for (int64_t t = threadIdx.x; t < n * W; t += blockDim.x) s[t] = x[(r0 + t / W) * ld + t % W];
}

/* n floats at x set to 0: the columns of a gradient that no operand's heads cover. */
static __device__ __forceinline__ void rt_k_attention_zero(float *x, int64_t n) {
    RT_K_FOR(t, n) x[t] = 0.0f;
}

template <int D, int E>
static __device__ __forceinline__ void rt_k_attention_fwd(const RtKAttn a, const float *q, const float *k, const float *v,
                                                          const void *mask, float *out) {
    /* s[] below sits in a stack frame (128 bytes at head size 64, ptxas -v for sm_90): unrolling
     * the keys' two loops whole keeps it in registers, but the unrolled kernel takes about a
     * minute to compile (BERT at 2 layers, whose layers share their forward kernels: 130 s
     * against 16 s for sm_90), so the loops stay rolled */
    enum { KT = RT_K_ATTN_TILE(D, E) };
    __shared__ float ks[KT * D], vs[KT * E];
    const int64_t tiles = (a.T + RT_K_BLOCK - 1) / RT_K_BLOCK, H = rt_attn_heads(a), HK = rt_attn_kv_heads(a);
    const int64_t ldq = rt_attn_ld(a.q, D), ldk = rt_attn_ld(a.k, D), ldv = rt_attn_ld(a.v, E), ldo = rt_attn_ld(a.o, E);
    for (int64_t b = blockIdx.x; b < a.BH * tiles; b += gridDim.x) { /* uniform across the block */
        const int64_t bh = b / tiles, i0 = b % tiles * RT_K_BLOCK, i = i0 + threadIdx.x;
        const int64_t last = i0 + RT_K_BLOCK < a.T ? i0 + RT_K_BLOCK : a.T;
        const int64_t kend = a.causal && last < a.S ? last : a.S, mbase = rt_attn_mask_base(a, bh);
        const float *qi = q + rt_attn_at(a.q, bh, H, a.T, D) + i * ldq;
        const float *kb = k + rt_attn_at(a.k, bh / rt_attn_group(a), HK, a.S, D);
        const float *vb = v + rt_attn_at(a.v, bh / rt_attn_group(a), HK, a.S, E);
        const bool live = i < a.T;
        float qr[D], o[E], m = -INFINITY, l = 0;
        for (int d = 0; d < D; d++) qr[d] = live ? qi[d] : 0.0f;
        for (int e = 0; e < E; e++) o[e] = 0;
        for (int64_t j0 = 0; j0 < kend; j0 += KT) {
            const int cols = (int)(kend - j0 < KT ? kend - j0 : KT);
            __syncthreads(); /* the previous tile is used up */
            rt_attn_load<D>(ks, kb, ldk, j0, cols);
            rt_attn_load<E>(vs, vb, ldv, j0, cols);
            __syncthreads();
            if (!live) continue;
            float s[KT], mx = m;
            for (int c = 0; c < cols; c++) {
                float dot = 0;
                for (int d = 0; d < D; d++) dot = __fadd_rn(dot, __fmul_rn(qr[d], ks[c * D + d]));
                s[c] = rt_attn_score(a, mask, mbase, i, j0 + c, __fmul_rn(dot, a.scale));
                mx = rt_attn_max(mx, s[c]);
            }
            if (mx == -INFINITY) continue; /* no key of this row so far */
            const float alpha = expf(m - mx);
            l = __fmul_rn(l, alpha);
            for (int e = 0; e < E; e++) o[e] = __fmul_rn(o[e], alpha);
            for (int c = 0; c < cols; c++) { /* l sums the probabilities, o the dropped ones */
                const float p = expf(s[c] - mx), pz = a.dropout > 0 ? __fmul_rn(p, rt_attn_drop(a, bh, i, j0 + c)) : p;
                l = __fadd_rn(l, p);
                for (int e = 0; e < E; e++) o[e] = __fadd_rn(o[e], __fmul_rn(pz, vs[c * E + e]));
            }
            m = mx;
        }
        float *yi = out + rt_attn_at(a.o, bh, H, a.T, E) + i * ldo;
        if (live)
            for (int e = 0; e < E; e++) yi[e] = l == 0 ? 0.0f : __fdiv_rn(o[e], l);
    }
}

/* The backward's first kernel: per query row its log-sum-exp (+INFINITY when no key is left, so
 * that every probability is exp(-inf) = 0), delta = dout . out, and dq. lse [BH * T] and delta
 * [BH * T] follow each other at `stats`. */
template <int D, int E>
static __device__ __forceinline__ void rt_k_attention_bwd_rows(const RtKAttn a, const float *q, const float *k,
                                                               const float *v, const void *mask, const float *out,
                                                               const float *dout, float *dq, float *stats) {
    enum { KT = RT_K_ATTN_TILE(D, E) };
    __shared__ float ks[KT * D], vs[KT * E];
    const int64_t tiles = (a.T + RT_K_BLOCK - 1) / RT_K_BLOCK, H = rt_attn_heads(a), HK = rt_attn_kv_heads(a);
    const int64_t ldq = rt_attn_ld(a.q, D), ldk = rt_attn_ld(a.k, D), ldv = rt_attn_ld(a.v, E), ldo = rt_attn_ld(a.o, E);
    for (int64_t b = blockIdx.x; b < a.BH * tiles; b += gridDim.x) {
        const int64_t bh = b / tiles, i0 = b % tiles * RT_K_BLOCK, i = i0 + threadIdx.x, row = bh * a.T + i;
        const int64_t last = i0 + RT_K_BLOCK < a.T ? i0 + RT_K_BLOCK : a.T;
        const int64_t kend = a.causal && last < a.S ? last : a.S, mbase = rt_attn_mask_base(a, bh);
        const int64_t at_q = rt_attn_at(a.q, bh, H, a.T, D) + i * ldq, at_o = rt_attn_at(a.o, bh, H, a.T, E) + i * ldo;
        const float *kb = k + rt_attn_at(a.k, bh / rt_attn_group(a), HK, a.S, D);
        const float *vb = v + rt_attn_at(a.v, bh / rt_attn_group(a), HK, a.S, E);
        const bool live = i < a.T;
        float qr[D], g[E], acc[D], m = -INFINITY, l = 0, delta = 0;
        for (int d = 0; d < D; d++) qr[d] = live ? q[at_q + d] : 0.0f, acc[d] = 0;
        double dd = 0;
        for (int e = 0; e < E; e++) {
            g[e] = live ? dout[at_o + e] : 0.0f;
            if (live) dd = __dadd_rn(dd, __dmul_rn((double)g[e], (double)out[at_o + e]));
        }
        delta = (float)dd;
        for (int pass = 0; pass < 2; pass++) { /* 0: the log-sum-exp; 1: dq */
            const float lse = m == -INFINITY ? INFINITY : m + logf(l);
            for (int64_t j0 = 0; j0 < kend; j0 += KT) {
                const int cols = (int)(kend - j0 < KT ? kend - j0 : KT);
                __syncthreads();
                rt_attn_load<D>(ks, kb, ldk, j0, cols);
                if (pass) rt_attn_load<E>(vs, vb, ldv, j0, cols);
                __syncthreads();
                if (!live) continue;
                for (int c = 0; c < cols; c++) {
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot = __fadd_rn(dot, __fmul_rn(qr[d], ks[c * D + d]));
                    const float s = rt_attn_score(a, mask, mbase, i, j0 + c, __fmul_rn(dot, a.scale));
                    if (!pass) { /* online: m, l */
                        if (s == -INFINITY) continue;
                        if (s > m || s != s) l = __fmul_rn(l, expf(m - s)), m = s;
                        l = __fadd_rn(l, expf(s - m));
                        continue;
                    }
                    const float p = expf(s - lse);
                    float dp = 0;
                    for (int e = 0; e < E; e++) dp = __fadd_rn(dp, __fmul_rn(g[e], vs[c * E + e]));
                    const float ds = __fmul_rn(p, __fmul_rn(rt_attn_drop(a, bh, i, j0 + c), dp) - delta);
                    for (int d = 0; d < D; d++) acc[d] = __fadd_rn(acc[d], __fmul_rn(ds, ks[c * D + d]));
                }
            }
            if (pass && live) {
                for (int d = 0; d < D; d++) dq[at_q + d] = __fmul_rn(acc[d], a.scale);
                stats[row] = lse;
                stats[a.BH * a.T + row] = delta;
            }
        }
    }
}

/* The backward's second kernel: per key its dk and dv, summed over the query rows in order
 * (under causal masking from the key tile's first row on), lse and delta from `stats`. */
template <int D, int E>
static __device__ __forceinline__ void rt_k_attention_bwd_keys(const RtKAttn a, const float *q, const float *k,
                                                               const float *v, const void *mask, const float *dout,
                                                               const float *stats, float *dk, float *dv) {
    enum { QT = RT_K_ATTN_TILE(D, E) };
    __shared__ float qs[QT * D], gs[QT * E], ls[QT], ds_[QT];
    const int64_t tiles = (a.S + RT_K_BLOCK - 1) / RT_K_BLOCK, G = rt_attn_group(a), H = rt_attn_heads(a);
    const int64_t HK = rt_attn_kv_heads(a), ldq = rt_attn_ld(a.q, D), ldo = rt_attn_ld(a.o, E);
    for (int64_t b = blockIdx.x; b < a.BH / G * tiles; b += gridDim.x) {
        const int64_t kv = b / tiles, j0 = b % tiles * RT_K_BLOCK, j = j0 + threadIdx.x;
        const int64_t at_k = rt_attn_at(a.k, kv, HK, a.S, D) + j * rt_attn_ld(a.k, D);
        const int64_t at_v = rt_attn_at(a.v, kv, HK, a.S, E) + j * rt_attn_ld(a.v, E);
        const int64_t first = a.causal ? (j0 < a.T ? j0 : a.T) : 0;
        const bool live = j < a.S;
        float kr[D], vr[E], gk[D], gv[E];
        for (int d = 0; d < D; d++) kr[d] = live ? k[at_k + d] : 0.0f, gk[d] = 0;
        for (int e = 0; e < E; e++) vr[e] = live ? v[at_v + e] : 0.0f, gv[e] = 0;
        for (int64_t bh = kv * G; bh < (kv + 1) * G; bh++) { /* the query slices that read kv, in order */
            const int64_t mbase = rt_attn_mask_base(a, bh);
            for (int64_t r0 = first; r0 < a.T; r0 += QT) {
                const int rows = (int)(a.T - r0 < QT ? a.T - r0 : QT);
                __syncthreads();
                rt_attn_load<D>(qs, q + rt_attn_at(a.q, bh, H, a.T, D), ldq, r0, rows);
                rt_attn_load<E>(gs, dout + rt_attn_at(a.o, bh, H, a.T, E), ldo, r0, rows);
                for (int t = threadIdx.x; t < rows; t += blockDim.x) {
                    ls[t] = stats[bh * a.T + r0 + t];
                    ds_[t] = stats[a.BH * a.T + bh * a.T + r0 + t];
                }
                __syncthreads();
                if (!live) continue;
                for (int r = 0; r < rows; r++) {
                    float dot = 0;
                    for (int d = 0; d < D; d++) dot = __fadd_rn(dot, __fmul_rn(qs[r * D + d], kr[d]));
                    const float s = rt_attn_score(a, mask, mbase, r0 + r, j, __fmul_rn(dot, a.scale));
                    const float p = expf(s - ls[r]);
                    if (p == 0) continue;
                    const float z = rt_attn_drop(a, bh, r0 + r, j), pz = __fmul_rn(p, z);
                    float dp = 0;
                    for (int e = 0; e < E; e++) {
                        gv[e] = __fadd_rn(gv[e], __fmul_rn(pz, gs[r * E + e]));
                        dp = __fadd_rn(dp, __fmul_rn(gs[r * E + e], vr[e]));
                    }
                    const float ds = __fmul_rn(p, __fmul_rn(z, dp) - ds_[r]);
                    for (int d = 0; d < D; d++) gk[d] = __fadd_rn(gk[d], __fmul_rn(ds, qs[r * D + d]));
                }
            }
        }
        if (live) {
            for (int d = 0; d < D; d++) dk[at_k + d] = __fmul_rn(gk[d], a.scale);
            for (int e = 0; e < E; e++) dv[at_v + e] = gv[e];
        }
    }
}

#endif
