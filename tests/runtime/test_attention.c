/* test_attention.c - the fused attention kernels (rt_attention_fwd, rt_attention_bwd) against
 * the unfused reference (rt_attention_ref_*, whole [T, S] matrices in double) on random values:
 * no mask, causal (T == S and T != S, top-left aligned), additive and boolean masks broadcast
 * several ways, rows that lose every key, T not a multiple of the block, T = 1, d = 64, S != T,
 * d != e, grouped-query attention (2 and 4 query heads per key/value head), dropout of the
 * probabilities; heads read from tokens (RtAttnView). Also: the same bits for 1 and 2 threads.
 *
 *     test_attention            the cmocka tests
 *     test_attention --bench    times the kernels on B*H = 48, T = 256, d = 64
 *
 * Tolerances: the kernels compute in float32 from float32 values, the reference in double from
 * the same values. Each score is a d-term dot product (relative error ~ d * 2^-24 of the sum of
 * |terms|, a few 1e-7 with values in [-1, 1)); exp and the row sums add a few ulps per term of S;
 * out is a convex combination of v's rows, so its error stays ~1e-6 of max |v|: 1e-5 of the
 * largest |value| of each tensor leaves a margin of ten. The gradients are differences of such
 * sums (dS = P * (dP - delta) cancels): 5e-5 of each gradient's largest value. A wrong index,
 * a missed mask or a lost block moves values by 1e-2 and more.
 */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "netrt.h"

#include "test_util.h"

static void assert_near(const float *got, const double *want, int64_t n, double tol, const char *what) {
    double scale = 1e-2; /* a tensor that is 0 in exact arithmetic (rows with no key; dq with one
                          * key, where dS = dp - delta cancels exactly) against its terms' size */
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * scale)) {
            print_error("%s[%lld]: got %.9g want %.9g (tolerance %g)\n", what, (long long)i, got[i], want[i],
                        tol * scale);
            fail();
        }
}

typedef struct Case {
    const char *name;
    RtAttn a;
    int64_t mask_numel; /* elements of the mask (0: none) */
    int keep_every;     /* boolean masks: a key kept unless (index % keep_every == 0); 0: random */
} Case;

static RtAttn geom(int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, int64_t E, int causal) {
    return (RtAttn){.BH = B * H, .T = T, .S = S, .D = D, .E = E, .scale = (float)(1 / sqrt((double)D)),
                    .causal = causal, .n_lead = 2, .lead = {B, H}};
}

static float *scratch_for(const RtAttn *a, int64_t *per_thread) {
    *per_thread = rt_attention_scratch(a);
    return malloc((size_t)(*per_thread * omp_get_max_threads()) * sizeof(float));
}

static void *make_mask(const Case *c) {
    if (c->a.mask == RT_ATTN_ADD) {
        float *m = randv(c->mask_numel);
        for (int64_t i = 0; i < c->mask_numel; i++) m[i] = i % 7 == 3 ? -INFINITY : 2 * m[i];
        return m;
    }
    uint8_t *m = malloc((size_t)c->mask_numel);
    for (int64_t i = 0; i < c->mask_numel; i++) m[i] = c->keep_every ? i % c->keep_every != 0 : frand() > -0.5f;
    return m;
}

static void run_case(const Case *c) {
    const RtAttn *a = &c->a;
    const int64_t kvh = a->BH / rt_attn_group(a); /* key/value slices */
    int64_t nq = a->BH * a->T * a->D, nk = kvh * a->S * a->D, nv = kvh * a->S * a->E, no = a->BH * a->T * a->E;
    float *q = randv(nq), *k = randv(nk), *v = randv(nv), *dout = randv(no);
    for (int64_t i = 0; i < nq; i++) q[i] *= 3; /* scores of a few units: a peaked softmax */
    void *mask = a->mask ? make_mask(c) : NULL;
    float *out = malloc((size_t)no * sizeof *out), *dq = malloc((size_t)nq * sizeof *dq);
    float *dk = malloc((size_t)nk * sizeof *dk), *dv = malloc((size_t)nv * sizeof *dv);
    double *rout = malloc((size_t)no * sizeof *rout), *rdq = malloc((size_t)nq * sizeof *rdq);
    double *rdk = malloc((size_t)nk * sizeof *rdk), *rdv = malloc((size_t)nv * sizeof *rdv);
    int64_t per;
    float *scratch = scratch_for(a, &per);
    rt_attention_fwd(a, q, k, v, mask, out, scratch, per);
    rt_attention_bwd(a, q, k, v, mask, out, dout, dq, dk, dv, scratch, per);
    rt_attention_ref_fwd(a, q, k, v, mask, rout);
    rt_attention_ref_bwd(a, q, k, v, mask, dout, rdq, rdk, rdv);
    print_message("%s: BH %lld T %lld S %lld d %lld e %lld causal %d mask %d group %lld\n", c->name,
                  (long long)a->BH, (long long)a->T, (long long)a->S, (long long)a->D, (long long)a->E, a->causal,
                  a->mask, (long long)rt_attn_group(a));
    assert_near(out, rout, no, 1e-5, "out");
    assert_near(dq, rdq, nq, 5e-5, "dq");
    assert_near(dk, rdk, nk, 5e-5, "dk");
    assert_near(dv, rdv, nv, 5e-5, "dv");
    /* the same bits on one thread */
    float *out1 = malloc((size_t)no * sizeof *out1), *g1 = malloc((size_t)(nq + nk + nv) * sizeof *g1);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    rt_attention_fwd(a, q, k, v, mask, out1, scratch, per);
    rt_attention_bwd(a, q, k, v, mask, out, dout, g1, g1 + nq, g1 + nq + nk, scratch, per);
    omp_set_num_threads(threads);
    assert_memory_equal(out, out1, (size_t)no * sizeof *out);
    assert_memory_equal(dq, g1, (size_t)nq * sizeof *dq);
    assert_memory_equal(dk, g1 + nq, (size_t)nk * sizeof *dk);
    assert_memory_equal(dv, g1 + nq + nk, (size_t)nv * sizeof *dv);
    free(q), free(k), free(v), free(dout), free(mask), free(out), free(dq), free(dk), free(dv), free(rout);
    free(rdq), free(rdk), free(rdv), free(scratch), free(out1), free(g1);
}

static void test_plain(void **state) {
    (void)state;
    Case cases[] = {
        {"T = S = 70 (not a multiple of the block)", geom(2, 3, 70, 70, 16, 16, 0), 0, 0},
        {"T = 1", geom(1, 2, 1, 9, 64, 64, 0), 0, 0},
        {"d = 64, two blocks and a bit", geom(1, 2, 150, 150, 64, 64, 0), 0, 0},
        {"S != T, d != e", geom(2, 1, 37, 100, 12, 24, 0), 0, 0},
        {"S < T", geom(1, 3, 90, 20, 8, 8, 0), 0, 0},
        {"S = 600: three blocks of keys, online rescaling", geom(1, 2, 70, 600, 8, 8, 0), 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

static void test_causal(void **state) {
    (void)state;
    Case cases[] = {
        {"causal, T = S = 130", geom(2, 2, 130, 130, 8, 8, 1), 0, 0},
        {"causal, T = 1", geom(1, 1, 1, 1, 64, 64, 1), 0, 0},
        {"causal, T < S (top-left)", geom(1, 2, 50, 80, 16, 8, 1), 0, 0},
        {"causal, T > S (top-left)", geom(1, 2, 80, 50, 16, 8, 1), 0, 0},
        {"causal, d = 64", geom(1, 2, 200, 200, 64, 64, 1), 0, 0},
        {"causal, T = S = 530: blocks past the diagonal skipped", geom(1, 1, 530, 530, 8, 8, 1), 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
}

static void test_masks(void **state) {
    (void)state;
    Case c;
    /* additive [T, S] broadcast over batch and heads, some -inf entries */
    c = (Case){"additive [T, S]", geom(2, 3, 70, 300, 16, 16, 0), 70 * 300, 0};
    c.a.mask = RT_ATTN_ADD, c.a.mask_t = 300, c.a.mask_s = 1;
    run_case(&c);
    /* additive [B, 1, T, S] with causal: per sample, broadcast over heads */
    c = (Case){"additive [B, 1, T, S], causal", geom(2, 3, 70, 70, 8, 8, 1), 2 * 70 * 70, 0};
    c.a.mask = RT_ATTN_ADD, c.a.mask_lead[0] = 70 * 70, c.a.mask_t = 70, c.a.mask_s = 1;
    run_case(&c);
    /* boolean [B, 1, 1, S] padding mask; every 3rd key of the sequence left out */
    c = (Case){"bool [B, 1, 1, S]", geom(2, 2, 40, 75, 16, 16, 0), 2 * 75, 3};
    c.a.mask = RT_ATTN_KEEP, c.a.mask_lead[0] = 75, c.a.mask_s = 1;
    run_case(&c);
    /* boolean [B, H, T, S], random, with causal: rows whose every key is masked give 0 */
    c = (Case){"bool [B, H, T, S], causal", geom(2, 2, 67, 67, 8, 8, 1), 2 * 2 * 67 * 67, 0};
    c.a.mask = RT_ATTN_KEEP, c.a.mask_lead[0] = 2 * 67 * 67, c.a.mask_lead[1] = 67 * 67, c.a.mask_t = 67;
    c.a.mask_s = 1;
    run_case(&c);
    /* boolean [T, 1]: whole query rows left out (keep_every 2: rows 0, 2, 4, ...) */
    c = (Case){"bool [T, 1], rows with no key", geom(1, 2, 9, 12, 8, 8, 0), 9, 2};
    c.a.mask = RT_ATTN_KEEP, c.a.mask_t = 1;
    run_case(&c);
}

/* Grouped-query attention: q [B, H, T, d] against k, v [B, H / group, S, d]; dk and dv sum the
 * terms of every query head of their group. */
static void test_grouped(void **state) {
    (void)state;
    Case c;
    c = (Case){"group 2, causal", geom(2, 4, 70, 70, 16, 16, 1), 0, 0};
    c.a.group = 2;
    run_case(&c);
    c = (Case){"group 4 (one key/value head), S != T", geom(2, 4, 37, 90, 8, 12, 0), 0, 0};
    c.a.group = 4;
    run_case(&c);
    /* with a boolean [B, 1, 1, S] padding mask, read per query slice */
    c = (Case){"group 3, bool [B, 1, 1, S]", geom(2, 6, 40, 75, 16, 16, 0), 2 * 75, 3};
    c.a.group = 3, c.a.mask = RT_ATTN_KEEP, c.a.mask_lead[0] = 75, c.a.mask_s = 1;
    run_case(&c);
}

/* Attention dropout: the kernels drop the probabilities the reference drops (the counter-based
 * mask of rt_bits.h, the softmax's sums undropped, dS = P (z dP - delta)), about p of them, and the
 * result is not the undropped one. */
static void test_dropout(void **state) {
    (void)state;
    Case c = {"dropout 0.3, causal", geom(2, 3, 70, 70, 16, 16, 1), 0, 0};
    c.a.dropout = 0.3, c.a.seed_id = 2, c.a.seed = 12345;
    run_case(&c);
    c = (Case){"dropout 0.5, group 2, bool [B, 1, 1, S], S != T", geom(2, 4, 40, 75, 8, 12, 0), 2 * 75, 3};
    c.a.group = 2, c.a.mask = RT_ATTN_KEEP, c.a.mask_lead[0] = 75, c.a.mask_s = 1;
    c.a.dropout = 0.5, c.a.seed_id = 0, c.a.seed = 99;
    run_case(&c);
    RtAttn a = geom(1, 2, 64, 64, 8, 8, 0);
    a.dropout = 0.25, a.seed = 7;
    int64_t kept = 0, n = a.BH * a.T * a.S;
    for (int64_t bh = 0; bh < a.BH; bh++)
        for (int64_t i = 0; i < a.T; i++)
            for (int64_t j = 0; j < a.S; j++) kept += rt_attn_drop(&a, bh, i, j, 4.0f / 3) != 0;
    /* 8192 draws of keep with probability 0.75: a standard deviation of 0.005 */
    print_message("dropout 0.25: %lld of %lld probabilities kept\n", (long long)kept, (long long)n);
    assert_true(fabs((double)kept / (double)n - 0.75) < 0.03);
    int64_t nq = a.BH * a.T * a.D, per;
    float *q = randv(nq), *k = randv(nq), *v = randv(nq), *o = malloc((size_t)nq * sizeof *o);
    float *o0 = malloc((size_t)nq * sizeof *o0), *scratch = scratch_for(&a, &per);
    rt_attention_fwd(&a, q, k, v, NULL, o, scratch, per);
    a.dropout = 0;
    rt_attention_fwd(&a, q, k, v, NULL, o0, scratch, per);
    double diff = 0;
    for (int64_t i = 0; i < nq; i++) diff = fmax(diff, fabs(o[i] - o0[i]));
    assert_true(diff > 1e-2);
    free(q), free(k), free(v), free(o), free(o0), free(scratch);
}

/* Slice s of an operand viewed by w (rows x width, `heads` per batch entry) copied out dense. */
static void gather(const RtAttnView *w, const float *x, int64_t slices, int64_t heads, int64_t rows, int64_t width,
                   float *dense) {
    for (int64_t s = 0; s < slices; s++)
        for (int64_t i = 0; i < rows; i++)
            memcpy(dense + (s * rows + i) * width, x + rt_attn_at(w, s, heads, rows, width) + i * rt_attn_ld(w, width),
                   (size_t)width * sizeof *dense);
}

/* Heads read from tokens (RtAttnView), as GPT-2's packed projection holds them: q, k and v side
 * by side in the rows of one [B, T, W] buffer starting at column 3 (or k and v in a second one
 * when S != T), a spare column after them, out in rows of H * E + 2. The kernels read and write
 * through the views (against the reference reading the same views), and leave the columns
 * outside the operands as they were: dq, dk and dv land in a buffer of the operands' layout
 * filled with NaN first. */
static void run_view_case(const Case *c) {
    RtAttn a = c->a;
    const int64_t B = a.lead[0], H = rt_attn_heads(&a), HK = rt_attn_kv_heads(&a), T = a.T, S = a.S, D = a.D;
    const int64_t E = a.E, shared = S == T; /* k and v in q's buffer */
    const int64_t wq = 3 + H * D + (shared ? HK * (D + E) : 0) + 1, wkv = shared ? wq : HK * (D + E) + 1;
    const int64_t col_k = shared ? 3 + H * D : 0, col_v = col_k + HK * D, wo = H * E + 2;
    a.q = (RtAttnView){.batch = T * wq, .row = wq};
    a.k = (RtAttnView){.batch = S * wkv, .row = wkv};
    a.v = a.k, a.o = (RtAttnView){.batch = T * wo, .row = wo};
    int64_t nx = B * T * wq, ny = shared ? 0 : B * S * wkv, no = B * T * wo;
    float *x = randv(nx), *y = shared ? x : randv(ny), *dout = randv(no), *out = malloc((size_t)no * sizeof *out);
    for (int64_t i = 0; i < nx; i++) x[i] *= 3; /* scores of a few units, as run_case's */
    float *dx = malloc((size_t)nx * sizeof *dx), *dy = shared ? dx : malloc((size_t)ny * sizeof *dy);
    for (int64_t i = 0; i < nx; i++) dx[i] = NAN;
    for (int64_t i = 0; i < ny; i++) dy[i] = NAN;
    for (int64_t i = 0; i < no; i++) out[i] = NAN;
    const float *q = x + 3, *k = y + col_k, *v = y + col_v;
    void *mask = a.mask ? make_mask(c) : NULL;
    int64_t per, nq = a.BH * T * D, nk = B * HK * S * D, nv = B * HK * S * E, nd = a.BH * T * E;
    float *scratch = scratch_for(&a, &per);
    rt_attention_fwd(&a, q, k, v, mask, out, scratch, per);
    rt_attention_bwd(&a, q, k, v, mask, out, dout, dx + 3, dy + col_k, dy + col_v, scratch, per);
    double *rout = malloc((size_t)nd * sizeof *rout), *rdq = malloc((size_t)nq * sizeof *rdq);
    double *rdk = malloc((size_t)nk * sizeof *rdk), *rdv = malloc((size_t)nv * sizeof *rdv);
    rt_attention_ref_fwd(&a, q, k, v, mask, rout);
    rt_attention_ref_bwd(&a, q, k, v, mask, dout, rdq, rdk, rdv);
    print_message("%s, heads from tokens: BH %lld T %lld S %lld d %lld e %lld group %lld\n", c->name,
                  (long long)a.BH, (long long)T, (long long)S, (long long)D, (long long)E, (long long)rt_attn_group(&a));
    float *g = malloc((size_t)(nq + nk + nv + nd) * sizeof *g);
    gather(&a.o, out, a.BH, H, T, E, g); /* run_case's tolerances, for the same reasons */
    assert_near(g, rout, nd, 1e-5, "out");
    gather(&a.q, dx + 3, a.BH, H, T, D, g);
    assert_near(g, rdq, nq, 5e-5, "dq");
    gather(&a.k, dy + col_k, B * HK, HK, S, D, g);
    assert_near(g, rdk, nk, 5e-5, "dk");
    gather(&a.v, dy + col_v, B * HK, HK, S, E, g);
    assert_near(g, rdv, nv, 5e-5, "dv");
    for (int64_t r = 0; r < B * T; r++) { /* the columns no operand has: untouched */
        assert_true(isnan(dx[r * wq]) && isnan(dx[r * wq + 2]) && isnan(dx[r * wq + wq - 1]));
        assert_true(isnan(out[r * wo + H * E]) && isnan(out[r * wo + wo - 1]));
    }
    for (int64_t r = 0; r < B * S && !shared; r++) assert_true(isnan(dy[r * wkv + wkv - 1]));
    if (!shared) free(y), free(dy);
    free(x), free(dx), free(dout), free(out), free(mask), free(scratch), free(rout), free(rdq), free(rdk), free(rdv);
    free(g);
}

static void test_views(void **state) {
    (void)state;
    Case c = {"causal, T = S = 70", geom(2, 4, 70, 70, 16, 16, 1), 0, 0};
    run_view_case(&c);
    c = (Case){"group 2, S != T, d != e, bool [B, 1, 1, S], dropout", geom(2, 4, 37, 90, 8, 12, 0), 2 * 90, 3};
    c.a.group = 2, c.a.mask = RT_ATTN_KEEP, c.a.mask_lead[0] = 90, c.a.mask_s = 1;
    c.a.dropout = 0.2, c.a.seed = 5;
    run_view_case(&c);
    c = (Case){"T = S = 150, d = 64, group 4", geom(1, 4, 150, 150, 64, 64, 0), 0, 0};
    c.a.group = 4;
    run_view_case(&c);
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The GPT-2-like shape of the report: B*H = 48, T = S = 256, d = 64, best of 5: wall time, and
 * the process's CPU time (on a busy machine the better measure of the work, with one thread). */
static int bench(void) {
    for (int causal = 0; causal < 2; causal++) {
        RtAttn a = geom(4, 12, 256, 256, 64, 64, causal);
        int64_t n = a.BH * a.T * a.D, per;
        float *q = randv(n), *k = randv(n), *v = randv(n), *g = randv(n), *o = malloc((size_t)n * sizeof *o);
        float *d = malloc((size_t)(3 * n) * sizeof *d), *scratch = scratch_for(&a, &per);
        double fwd = 1e9, bwd = 1e9, cfwd = 1e9, cbwd = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            rt_attention_fwd(&a, q, k, v, NULL, o, scratch, per);
            double t1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            rt_attention_bwd(&a, q, k, v, NULL, o, g, d, d + n, d + 2 * n, scratch, per);
            double t2 = clock_s(CLOCK_MONOTONIC), c2 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            fwd = fmin(fwd, t1 - t0), bwd = fmin(bwd, t2 - t1), cfwd = fmin(cfwd, c1 - c0), cbwd = fmin(cbwd, c2 - c1);
        }
        printf("attention B*H=48 T=256 d=64 %s, %d threads: forward %.2f ms (cpu %.2f), backward %.2f ms (cpu %.2f)\n",
               causal ? "causal" : "full", omp_get_max_threads(), fwd * 1e3, cfwd * 1e3, bwd * 1e3, cbwd * 1e3);
        free(q), free(k), free(v), free(g), free(o), free(d), free(scratch);
    }
    return 0;
}

int main(int argc, char **argv) {
    (void)geometry; /* test_util.h's convolutions: not used here */
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_grouped),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
