/* rt_attention.c - scaled dot-product attention on the CPU: the fused kernels the generated
 * code calls (rt_attention_fwd, rt_attention_bwd) and a plain reference (rt_attention_ref_*)
 * that forms the whole [T, S] matrix in double, for the tests.
 *
 * Every (batch * head) slice is independent: q [T, D], k [S, D], v [S, E], out [T, E], each
 * where its RtAttnView puts it (rows one after another, or a row stride apart when the heads are
 * read from the tokens as the projections wrote them), with the mask read through strides,
 * broadcast where its stride is 0. Under grouped-query
 * attention `group` query slices share one key/value slice (slice bh reads bh / group).
 *
 * Forward (FlashAttention-2): one task per (slice, block of RT_ATTN_BLOCK query rows); the keys
 * in blocks of RT_ATTN_KEYS, each block's scores S = q k^T * scale by one small product
 * (OpenBLAS, single-threaded inside the parallel region), masked, then the online softmax: the
 * row's running maximum m and sum l, the accumulated o rescaled by exp(m_old - m_new) and
 * o += P v. No [T, S] matrix exists; a thread's scratch is one block of scores and one of o.
 * Under causal masking the key blocks past the query block's diagonal are never visited. With
 * attention dropout, o += (P z) v, z each probability's factor (rt_attn_drop: 0, or 1 / (1 - p)),
 * while l sums P undropped.
 *
 * Backward: one task per key/value slice, so dk and dv accumulate in a fixed order without races
 * (the result is the same bits for any number of threads): its query slices one after another.
 * Per block of query rows, the scores of all the keys it sees are recomputed into scratch
 * ([RT_ATTN_BLOCK, S]), their row maximum and sum give the probabilities P exactly (no
 * statistics are saved by the forward), and (z = 1 without dropout)
 *   dP = dO v^T,  dS = P * (z dP - delta),  delta = sum(dO * O) per row,
 *   dv += (P z)^T dO,  dq = scale * dS k,  dk += scale * dS^T q.
 * A query row whose every key is masked out gives 0 and passes no gradient (PyTorch's math
 * kernel gives NaN there).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* The mask's offset for slice bh: its strides along the leading axes, bh split into them. */
static int64_t mask_base(const RtAttn *a, int64_t bh) {
    int64_t off = 0;
    for (int i = a->n_lead - 1; i >= 0; i--) {
        off += bh % a->lead[i] * a->mask_lead[i];
        bh /= a->lead[i];
    }
    return off;
}

/* How many of keys j0 .. j0 + n query row i sees: all n, or under causal masking those up to
 * its diagonal, a prefix (0 when the block starts past it). The kernels compute the scores of
 * the prefix only and set the probabilities of the rest to 0, what e^-inf would give: a third
 * of a causal softmax's exponentials at T = 128 in blocks of 64 were of keys left out. */
static int64_t keys_live(const RtAttn *a, int64_t i, int64_t j0, int64_t n) {
    if (!a->causal) return n;
    const int64_t live = i + 1 - j0;
    return live < 0 ? 0 : live < n ? live : n;
}

/* Scores s[0, n) of query row i against keys j0 .. j0 + n: the mask applied in place (a key
 * left out is -INFINITY, an additive mask added). */
static void mask_row(const RtAttn *a, const void *mask, int64_t mbase, int64_t i, int64_t j0, int64_t n, float *s) {
    if (a->mask == RT_ATTN_ADD) {
        const float *m = (const float *)mask + mbase + i * a->mask_t + j0 * a->mask_s;
        for (int64_t c = 0; c < n; c++) s[c] += m[c * a->mask_s];
    } else if (a->mask == RT_ATTN_KEEP) {
        const uint8_t *m = (const uint8_t *)mask + mbase + i * a->mask_t + j0 * a->mask_s;
        for (int64_t c = 0; c < n; c++)
            if (!m[c * a->mask_s]) s[c] = -INFINITY;
    }
}

/* The largest of m and s[0, n), NaN if any is: a NaN score makes its row NaN, as in PyTorch
 * (fmaxf would skip it), and only a row whose scores are all -INFINITY has no key. */
static inline float row_max(float m, const float *s, int64_t n) {
    int nan = m != m;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t c = 0; c < n; c++) {
        m = s[c] > m ? s[c] : m;
        nan |= s[c] != s[c];
    }
    return nan ? NAN : m;
}

/* s[l] = e^(s[l] - mx), added to lane l of part, for l < n. */
static inline void lanes_exp(double *restrict part, float *restrict s, float mx, int64_t n) {
#pragma omp simd
    for (int64_t l = 0; l < n; l++) {
        const float e = rt_expf_nonpos(s[l] - mx);
        s[l] = e;
        part[l] += e;
    }
}

/* s[c] = e^(s[c] - mx) for c in [0, n), and their sum in double, in lanes (rt_internal.h): a
 * fixed order whatever the vector width, where a simd reduction would add in the width's. */
static double exp_sum(float *s, int64_t n, float mx) {
    double part[RT_LANES] = {0};
    const int64_t full = rt_lanes_full(n);
    for (int64_t c0 = 0; c0 < full; c0 += RT_LANES) lanes_exp(part, s + c0, mx, RT_LANES);
    if (full < n) { /* the rest through the same loop, padded with scores of keys left out: e^-inf is
                     * 0, and adding 0 leaves a lane as it was (a lane's sum is never -0) */
        float rest[RT_LANES];
        for (int64_t l = 0; l < RT_LANES; l++) rest[l] = full + l < n ? s[full + l] : -INFINITY;
        lanes_exp(part, rest, mx, RT_LANES);
        memcpy(s + full, rest, (size_t)(n - full) * sizeof *s);
    }
    return rt_lanes_total(part);
}

/* Keys that query rows [i0, i0 + rows) can see: all S, or under causal masking up to the last
 * row's diagonal (top-left aligned, as PyTorch's is_causal). */
static int64_t keys_seen(const RtAttn *a, int64_t i0, int64_t rows) {
    return a->causal && i0 + rows < a->S ? i0 + rows : a->S;
}

void rt_attention_fwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask, float *out,
                      float *scratch, int64_t scratch_per_thread) {
    const int64_t B = RT_ATTN_BLOCK, BK = RT_ATTN_KEYS, T = a->T, S = a->S, D = a->D, E = a->E;
    const int64_t nqb = (T + B - 1) / B, G = rt_attn_group(a), H = rt_attn_heads(a), HK = rt_attn_kv_heads(a);
    const int64_t ldq = rt_attn_ld(&a->q, D), ldk = rt_attn_ld(&a->k, D), ldv = rt_attn_ld(&a->v, E);
    const int64_t ldo = rt_attn_ld(&a->o, E);
    const float inv_keep = (float)(1.0 / (1.0 - a->dropout));
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < a->BH * nqb; task++) {
        const int64_t bh = task / nqb, i0 = task % nqb * B, rows = T - i0 < B ? T - i0 : B;
        const int64_t kend = keys_seen(a, i0, rows), mbase = mask_base(a, bh);
        float *sc = scratch + omp_get_thread_num() * scratch_per_thread, *o = sc + B * BK, *m = o + B * E, *l = m + B;
        const float *qi = q + rt_attn_at(&a->q, bh, H, T, D) + i0 * ldq;
        const float *kb = k + rt_attn_at(&a->k, bh / G, HK, S, D), *vb = v + rt_attn_at(&a->v, bh / G, HK, S, E);
        memset(o, 0, (size_t)(rows * E) * sizeof *o);
        for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            const int64_t cols = kend - j0 < BK ? kend - j0 : BK;
            rt_gemm(0, 1, rows, cols, D, a->scale, qi, ldq, kb + j0 * ldk, ldk, 0.0f, sc, cols);
            for (int64_t r = 0; r < rows; r++) {
                float *s = sc + r * cols;
                const int64_t live = keys_live(a, i0 + r, j0, cols);
                memset(s + live, 0, (size_t)(cols - live) * sizeof *s);
                mask_row(a, mask, mbase, i0 + r, j0, live, s);
                const float mx = row_max(m[r], s, live);
                if (mx == -INFINITY) { /* no key of this row so far: nothing to add */
                    memset(s, 0, (size_t)live * sizeof *s);
                    continue;
                }
                const float alpha = rt_expf_nonpos(m[r] - mx);
                l[r] = l[r] * alpha + (float)exp_sum(s, live, mx);
                m[r] = mx;
                if (a->dropout > 0) /* the sum above is the undropped one: o gets the dropped probabilities */
                    for (int64_t c = 0; c < live; c++) s[c] *= rt_attn_drop(a, bh, i0 + r, j0 + c, inv_keep);
                if (alpha != 1.0f)
                    for (int64_t e = 0; e < E; e++) o[r * E + e] *= alpha;
            }
            rt_gemm(0, 0, rows, E, cols, 1.0f, sc, cols, vb + j0 * ldv, ldv, 1.0f, o, E);
        }
        float *yi = out + rt_attn_at(&a->o, bh, H, T, E) + i0 * ldo;
        for (int64_t r = 0; r < rows; r++) {
            float *y = yi + r * ldo;
            const float inv = l[r] == 0 ? 0.0f : 1.0f / l[r];
            for (int64_t e = 0; e < E; e++) y[e] = o[r * E + e] * inv;
        }
    }
}

/* One query slice bh's part of the backward: its dq, and its terms added into dk and dv of the
 * key/value slice kb, vb it reads (dkb, dvb: k's and v's row strides); P is the thread's scratch. */
static void bwd_slice(const RtAttn *a, int64_t bh, const float *q, const float *kb, const float *vb, const void *mask,
                      const float *out, const float *dout, float *dq, float *dkb, float *dvb, float *P) {
    const int64_t B = RT_ATTN_BLOCK, T = a->T, D = a->D, E = a->E, mbase = mask_base(a, bh), H = rt_attn_heads(a);
    const int64_t ldq = rt_attn_ld(&a->q, D), ldk = rt_attn_ld(&a->k, D), ldv = rt_attn_ld(&a->v, E);
    const int64_t ldo = rt_attn_ld(&a->o, E), at_q = rt_attn_at(&a->q, bh, H, T, D), at_o = rt_attn_at(&a->o, bh, H, T, E);
    const float inv_keep = (float)(1.0 / (1.0 - a->dropout));
    float *dP = P + B * a->S, *delta = dP + B * a->S;
    for (int64_t i0 = 0; i0 < T; i0 += B) {
        const int64_t rows = T - i0 < B ? T - i0 : B, n = keys_seen(a, i0, rows);
        const float *qi = q + at_q + i0 * ldq, *oi = out + at_o + i0 * ldo, *gi = dout + at_o + i0 * ldo;
        rt_gemm(0, 1, rows, n, D, a->scale, qi, ldq, kb, ldk, 0.0f, P, n);
        for (int64_t r = 0; r < rows; r++) {
            float *p = P + r * n;
            const int64_t live = keys_live(a, i0 + r, 0, n);
            mask_row(a, mask, mbase, i0 + r, 0, live, p);
            const float mx = row_max(-INFINITY, p, live);
            const int64_t seen = mx == -INFINITY ? 0 : live; /* no key: no probability, no gradient */
            const float inv = seen ? (float)(1.0 / exp_sum(p, live, mx)) : 0.0f;
            /* the keys left out set to 0 in the same loop: a memset call per row cost more */
            for (int64_t c = 0; c < n; c++) p[c] = c < seen ? p[c] * inv : 0.0f;
            double d = 0;
            for (int64_t e = 0; e < E; e++) d += (double)gi[r * ldo + e] * oi[r * ldo + e];
            delta[r] = (float)d;
        }
        rt_gemm(0, 1, rows, n, E, 1.0f, gi, ldo, vb, ldv, 0.0f, dP, n);
        /* with dropout, out = (P z) v: dS = P (z dP - delta) (delta = dout . out is still the row's
         * sum of P z dP), and dv takes P z, into which P turns here; a key the causal mask leaves
         * out has P = 0 and dS = 0 */
        for (int64_t r = 0; r < rows; r++) {
            float *pr = P + r * n, *dr = dP + r * n;
            const int64_t live = keys_live(a, i0 + r, 0, n);
            if (a->dropout > 0) {
                for (int64_t c = 0; c < live; c++) {
                    const float z = rt_attn_drop(a, bh, i0 + r, c, inv_keep);
                    dr[c] = pr[c] * (z * dr[c] - delta[r]);
                    pr[c] *= z;
                }
                memset(dr + live, 0, (size_t)(n - live) * sizeof *dr);
            } else {
                for (int64_t c = 0; c < n; c++) dr[c] = c < live ? pr[c] * (dr[c] - delta[r]) : 0.0f;
            }
        }
        rt_gemm(1, 0, n, E, rows, 1.0f, P, n, gi, ldo, 1.0f, dvb, ldv);
        rt_gemm(0, 0, rows, D, n, a->scale, dP, n, kb, ldk, 0.0f, dq + at_q + i0 * ldq, ldq);
        rt_gemm(1, 0, n, D, rows, a->scale, dP, n, qi, ldq, 1.0f, dkb, ldk);
    }
}

/* rows x width floats `ld` apart set to 0. */
static void zero_rows(float *x, int64_t rows, int64_t width, int64_t ld) {
    for (int64_t r = 0; r < rows; r++) memset(x + r * ld, 0, (size_t)width * sizeof *x);
}

void rt_attention_bwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                      const float *out, const float *dout, float *dq, float *dk, float *dv, float *scratch,
                      int64_t scratch_per_thread) {
    const int64_t S = a->S, D = a->D, E = a->E, G = rt_attn_group(a), HK = rt_attn_kv_heads(a);
#pragma omp parallel for schedule(static)
    for (int64_t kv = 0; kv < a->BH / G; kv++) {
        const int64_t at_k = rt_attn_at(&a->k, kv, HK, S, D), at_v = rt_attn_at(&a->v, kv, HK, S, E);
        float *dkb = dk + at_k, *dvb = dv + at_v;
        zero_rows(dkb, S, D, rt_attn_ld(&a->k, D));
        zero_rows(dvb, S, E, rt_attn_ld(&a->v, E));
        for (int64_t bh = kv * G; bh < (kv + 1) * G; bh++) /* the query slices that read kv, in order */
            bwd_slice(a, bh, q, k + at_k, v + at_v, mask, out, dout, dq, dkb, dvb,
                      scratch + omp_get_thread_num() * scratch_per_thread);
    }
}

/* ---- the reference: the [T, S] matrices of one slice at a time, in double */

/* Each probability's dropout factor in slice bh (1 without dropout), in double. */
static void ref_drop(const RtAttn *a, int64_t bh, double *Z) {
    for (int64_t i = 0; i < a->T; i++)
        for (int64_t j = 0; j < a->S; j++)
            Z[i * a->S + j] = a->dropout > 0 ? rt_attn_drop(a, bh, i, j, (float)(1.0 / (1.0 - a->dropout))) : 1.0;
}

/* Probabilities P [T, S] of slice bh in double; a row with no key left is 0. */
static void ref_probs(const RtAttn *a, const float *q, const float *k, const void *mask, int64_t bh, double *P) {
    const int64_t T = a->T, S = a->S, D = a->D, mbase = mask_base(a, bh), ldq = rt_attn_ld(&a->q, D);
    const int64_t ldk = rt_attn_ld(&a->k, D), kv = bh / rt_attn_group(a);
    q += rt_attn_at(&a->q, bh, rt_attn_heads(a), T, D);
    k += rt_attn_at(&a->k, kv, rt_attn_kv_heads(a), S, D);
    for (int64_t i = 0; i < T; i++) {
        double *p = P + i * S, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < S; j++) {
            double s = 0;
            for (int64_t d = 0; d < D; d++) s += (double)q[i * ldq + d] * k[j * ldk + d];
            s *= a->scale;
            int64_t at = mbase + i * a->mask_t + j * a->mask_s;
            if (a->mask == RT_ATTN_ADD) s += ((const float *)mask)[at];
            if ((a->causal && j > i) || (a->mask == RT_ATTN_KEEP && !((const uint8_t *)mask)[at])) s = -INFINITY;
            p[j] = s;
            if (s > mx) mx = s;
        }
        for (int64_t j = 0; j < S; j++) sum += p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
        for (int64_t j = 0; j < S; j++) p[j] = sum > 0 ? p[j] / sum : 0;
    }
}

void rt_attention_ref_fwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                          double *out) {
    const int64_t T = a->T, S = a->S, E = a->E, G = rt_attn_group(a), ldv = rt_attn_ld(&a->v, E);
    double *P = malloc((size_t)(T * S) * sizeof *P), *Z = malloc((size_t)(T * S) * sizeof *Z);
    for (int64_t bh = 0; bh < a->BH; bh++) {
        const float *vb = v + rt_attn_at(&a->v, bh / G, rt_attn_kv_heads(a), S, E);
        ref_probs(a, q, k, mask, bh, P);
        ref_drop(a, bh, Z);
        for (int64_t i = 0; i < T; i++)
            for (int64_t e = 0; e < E; e++) {
                double o = 0;
                for (int64_t j = 0; j < S; j++) o += P[i * S + j] * Z[i * S + j] * vb[j * ldv + e];
                out[(bh * T + i) * E + e] = o;
            }
    }
    free(P);
    free(Z);
}

void rt_attention_ref_bwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                          const float *dout, double *dq, double *dk, double *dv) {
    const int64_t T = a->T, S = a->S, D = a->D, E = a->E, G = rt_attn_group(a), H = rt_attn_heads(a);
    const int64_t HK = rt_attn_kv_heads(a), ldq = rt_attn_ld(&a->q, D), ldk = rt_attn_ld(&a->k, D);
    const int64_t ldv = rt_attn_ld(&a->v, E), ldo = rt_attn_ld(&a->o, E);
    double *P = malloc((size_t)(T * S) * sizeof *P), *dS = malloc((size_t)(T * S) * sizeof *dS);
    double *Z = malloc((size_t)(T * S) * sizeof *Z);
    memset(dk, 0, (size_t)(a->BH / G * S * D) * sizeof *dk);
    memset(dv, 0, (size_t)(a->BH / G * S * E) * sizeof *dv);
    for (int64_t bh = 0; bh < a->BH; bh++) {
        const int64_t kv = bh / G;
        const float *g = dout + rt_attn_at(&a->o, bh, H, T, E), *qb = q + rt_attn_at(&a->q, bh, H, T, D);
        const float *kb = k + rt_attn_at(&a->k, kv, HK, S, D), *vb = v + rt_attn_at(&a->v, kv, HK, S, E);
        ref_probs(a, q, k, mask, bh, P);
        ref_drop(a, bh, Z);
        for (int64_t i = 0; i < T; i++) { /* out = (P Z) v: dS = P (Z dP - sum_j P Z dP) */
            double rowdot = 0;
            for (int64_t j = 0; j < S; j++) {
                double dp = 0;
                for (int64_t e = 0; e < E; e++) dp += (double)g[i * ldo + e] * vb[j * ldv + e];
                dS[i * S + j] = Z[i * S + j] * dp;
                rowdot += P[i * S + j] * Z[i * S + j] * dp;
            }
            for (int64_t j = 0; j < S; j++) dS[i * S + j] = P[i * S + j] * (dS[i * S + j] - rowdot);
        }
        for (int64_t i = 0; i < T; i++)
            for (int64_t d = 0; d < D; d++) {
                double s = 0;
                for (int64_t j = 0; j < S; j++) s += dS[i * S + j] * kb[j * ldk + d];
                dq[(bh * T + i) * D + d] = s * a->scale;
            }
        for (int64_t j = 0; j < S; j++) {
            for (int64_t d = 0; d < D; d++) {
                double s = 0;
                for (int64_t i = 0; i < T; i++) s += dS[i * S + j] * qb[i * ldq + d];
                dk[(kv * S + j) * D + d] += s * a->scale;
            }
            for (int64_t e = 0; e < E; e++) {
                double s = 0;
                for (int64_t i = 0; i < T; i++) s += P[i * S + j] * Z[i * S + j] * g[i * ldo + e];
                dv[(kv * S + j) * E + e] += s;
            }
        }
    }
    free(P);
    free(dS);
    free(Z);
}
