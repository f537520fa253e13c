/* test_kernels.c - libnetrt's kernels against plain reference loops, and their backward passes
 * against central finite differences of their forward passes.
 *
 * Tolerances: the kernels and the references both compute in float32 but sum in different
 * orders (SGEMM blocking), so they agree to a few ulps of the largest partial sums; 1e-4
 * relative to the magnitude of the result is far below any indexing mistake (which is O(1)).
 * Finite differences use double accumulation of float32 outputs with h = 1e-2 on inputs of size
 * ~1, so their error is ~1e-5 (rounding / h) + ~1e-4 (h^2 truncation): 2e-3 relative.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "netrt.h"

#include "test_close.h"
#include "test_util.h"

/* ---- convolution */

static void conv_ref(const RtConv *c, const float *x, const float *w, double *y) {
    int64_t cg = c->C / c->groups, kg = c->K / c->groups;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t k = 0; k < c->K; k++)
            for (int64_t p = 0; p < c->P; p++)
                for (int64_t q = 0; q < c->Q; q++) {
                    double s = 0;
                    int64_t g = k / kg;
                    for (int64_t ch = 0; ch < cg; ch++)
                        for (int64_t r = 0; r < c->R; r++)
                            for (int64_t t = 0; t < c->S; t++) {
                                int64_t h = p * c->stride_h - c->pad_h + r * c->dil_h;
                                int64_t v = q * c->stride_w - c->pad_w + t * c->dil_w;
                                if (h < 0 || h >= c->H || v < 0 || v >= c->W) continue;
                                s += (double)x[((n * c->C + g * cg + ch) * c->H + h) * c->W + v] *
                                     w[((k * cg + ch) * c->R + r) * c->S + t];
                            }
                    y[((n * c->K + k) * c->P + p) * c->Q + q] = s;
                }
}

static const RtConv *conv_cases(int *n) {
    static RtConv cases[5];
    cases[0] = geometry(2, 3, 7, 4, 3, 1, 1, 1, 1);
    cases[1] = geometry(3, 4, 9, 6, 3, 2, 1, 1, 2);  /* stride 2, groups 2 */
    cases[2] = geometry(2, 2, 8, 3, 3, 1, 2, 2, 1);  /* dilation 2 */
    cases[3] = geometry(1, 1, 28, 6, 5, 1, 2, 1, 1); /* LeNet's conv1 */
    cases[4] = geometry(2, 4, 6, 4, 1, 1, 0, 1, 4);  /* depthwise 1x1 */
    *n = 5;
    return cases;
}

static float *scratch_for(const RtConv *c, int64_t *per_thread) {
    *per_thread = rt_conv2d_scratch(c);
    return calloc((size_t)(*per_thread * 64), sizeof(float)); /* up to 64 threads */
}

static void test_conv_forward(void **state) {
    (void)state;
    int n;
    const RtConv *cases = conv_cases(&n);
    for (int i = 0; i < n; i++) {
        const RtConv *c = &cases[i];
        int64_t nx = c->N * c->C * c->H * c->W, nw = c->K * (c->C / c->groups) * c->R * c->S,
                ny = c->N * c->K * c->P * c->Q, per;
        float *x = randv(nx), *w = randv(nw), *y = malloc((size_t)ny * 4), *s = scratch_for(c, &per);
        double *ref = malloc((size_t)ny * 8);
        rt_conv2d_fwd(c, x, w, y, s, per);
        conv_ref(c, x, w, ref);
        assert_close(y, ref, ny, 1e-4, "conv2d_fwd");
        free(x), free(w), free(y), free(s), free(ref);
    }
}

/* <dy, conv(x, w)> is linear in x and w, so its gradients are exactly bwd_data and bwd_filter;
 * compare them with central differences of the forward kernel. */
static double dot_conv(const RtConv *c, const float *x, const float *w, const float *dy, float *y, float *s, int64_t per) {
    rt_conv2d_fwd(c, x, w, y, s, per);
    double d = 0;
    for (int64_t i = 0; i < c->N * c->K * c->P * c->Q; i++) d += (double)y[i] * dy[i];
    return d;
}

static void test_conv_backward(void **state) {
    (void)state;
    int n;
    const RtConv *cases = conv_cases(&n);
    for (int i = 0; i < n; i++) {
        const RtConv *c = &cases[i];
        int64_t nx = c->N * c->C * c->H * c->W, nw = c->K * (c->C / c->groups) * c->R * c->S,
                ny = c->N * c->K * c->P * c->Q, per;
        float *x = randv(nx), *w = randv(nw), *dy = randv(ny), *y = malloc((size_t)ny * 4);
        float *dx = malloc((size_t)nx * 4), *dw = malloc((size_t)nw * 4), *s = scratch_for(c, &per);
        rt_conv2d_bwd_data(c, dy, w, dx, s, per);
        rt_conv2d_bwd_filter(c, x, dy, dw, s, per);
        double *num_dx = malloc((size_t)nx * 8), *num_dw = malloc((size_t)nw * 8);
        const float h = 1e-2f;
        for (int64_t k = 0; k < nx; k++) {
            float x0 = x[k];
            x[k] = x0 + h;
            double up = dot_conv(c, x, w, dy, y, s, per);
            x[k] = x0 - h;
            num_dx[k] = (up - dot_conv(c, x, w, dy, y, s, per)) / (2 * h);
            x[k] = x0;
        }
        for (int64_t k = 0; k < nw; k++) {
            float w0 = w[k];
            w[k] = w0 + h;
            double up = dot_conv(c, x, w, dy, y, s, per);
            w[k] = w0 - h;
            num_dw[k] = (up - dot_conv(c, x, w, dy, y, s, per)) / (2 * h);
            w[k] = w0;
        }
        assert_close(dx, num_dx, nx, 2e-3, "conv2d_bwd_data");
        assert_close(dw, num_dw, nw, 2e-3, "conv2d_bwd_filter");
        free(x), free(w), free(dy), free(y), free(dx), free(dw), free(s), free(num_dx), free(num_dw);
    }
}

/* ---- pooling */

static void test_pooling(void **state) {
    (void)state;
    RtPool p = {.N = 2, .C = 3, .H = 7, .W = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1};
    p.P = (p.H + 2 * p.pad_h - p.kh) / p.stride_h + 1;
    p.Q = (p.W + 2 * p.pad_w - p.kw) / p.stride_w + 1;
    int64_t nx = p.N * p.C * p.H * p.W, ny = p.N * p.C * p.P * p.Q;
    float *x = malloc((size_t)nx * 4), *y = malloc((size_t)ny * 4), *dy = randv(ny), *dx = malloc((size_t)nx * 4);
    double *ref = malloc((size_t)ny * 8), *num = malloc((size_t)nx * 8);
    /* distinct values 0.01 apart in a scrambled order, so a 1e-3 step never changes which entry
     * of a window is the maximum (max pooling is differentiable there) */
    for (int64_t i = 0; i < nx; i++) x[i] = (float)((i * 37) % nx) * 0.01f - 1.0f;
    for (int avg = 0; avg < 2; avg++) {
        for (int64_t nc = 0; nc < p.N * p.C; nc++)
            for (int64_t i = 0; i < p.P; i++)
                for (int64_t j = 0; j < p.Q; j++) {
                    double m = avg ? 0 : -INFINITY;
                    for (int r = 0; r < p.kh; r++)
                        for (int s = 0; s < p.kw; s++) {
                            int64_t h = i * p.stride_h - p.pad_h + r, w = j * p.stride_w - p.pad_w + s;
                            if (h < 0 || h >= p.H || w < 0 || w >= p.W) continue;
                            double v = x[(nc * p.H + h) * p.W + w];
                            m = avg ? m + v / (p.kh * p.kw) : fmax(m, v);
                        }
                    ref[(nc * p.P + i) * p.Q + j] = m;
                }
        (avg ? rt_avgpool2d_fwd : rt_maxpool2d_fwd)(&p, x, y);
        assert_close(y, ref, ny, 1e-6, avg ? "avgpool2d_fwd" : "maxpool2d_fwd");
        if (avg) rt_avgpool2d_bwd(&p, dy, dx);
        else rt_maxpool2d_bwd(&p, x, dy, dx);
        for (int64_t k = 0; k < nx; k++) { /* central differences of <dy, pool(x)> */
            float x0 = x[k];
            double d[2];
            for (int side = 0; side < 2; side++) {
                x[k] = x0 + (side ? -1e-3f : 1e-3f);
                (avg ? rt_avgpool2d_fwd : rt_maxpool2d_fwd)(&p, x, y);
                d[side] = 0;
                for (int64_t i = 0; i < ny; i++) d[side] += (double)y[i] * dy[i];
            }
            x[k] = x0;
            num[k] = (d[0] - d[1]) / 2e-3;
        }
        /* both poolings are linear where no maximum changes, so the differences are exact up
         * to float rounding */
        assert_close(dx, num, nx, 2e-3, avg ? "avgpool2d_bwd" : "maxpool2d_bwd");
    }
    free(x), free(y), free(dy), free(dx), free(ref), free(num);
}

/* ---- softmax and cross-entropy */

static void test_softmax_and_xent(void **state) {
    (void)state;
    enum { R = 4, C = 7 };
    float *x = randv(R * C), y[R * C], dy[R * C], dx[R * C], loss[R], d2[R * C];
    int64_t label[R] = {0, 6, 3, 2};
    for (int i = 0; i < R * C; i++) x[i] *= 5, dy[i] = frand();
    rt_softmax_fwd(R, C, x, y);
    double ref[R * C], num[R * C];
    for (int r = 0; r < R; r++) {
        double s = 0;
        for (int j = 0; j < C; j++) s += exp(x[r * C + j]);
        for (int j = 0; j < C; j++) ref[r * C + j] = exp(x[r * C + j]) / s;
    }
    assert_close(y, ref, R * C, 1e-6, "softmax_fwd");
    rt_softmax_bwd(R, C, y, dy, dx);
    float dloss[R] = {0.5f, -1.0f, 2.0f, 0.25f};
    rt_xent_fwd(R, C, x, label, 0.1f, R, loss);
    rt_xent_bwd(R, C, x, label, 0.1f, R, loss, dloss, d2); /* with label smoothing 0.1 */
    double nxent[R * C];
    for (int k = 0; k < R * C; k++) {
        float x0 = x[k], yy[R * C];
        double up = 0, dn = 0;
        x[k] = x0 + 1e-2f;
        rt_softmax_fwd(R, C, x, yy);
        for (int i = 0; i < R * C; i++) up += (double)yy[i] * dy[i];
        rt_xent_fwd(R, C, x, label, 0.1f, R, loss);
        double lu = 0;
        for (int i = 0; i < R; i++) lu += (double)loss[i] * dloss[i];
        x[k] = x0 - 1e-2f;
        rt_softmax_fwd(R, C, x, yy);
        for (int i = 0; i < R * C; i++) dn += (double)yy[i] * dy[i];
        rt_xent_fwd(R, C, x, label, 0.1f, R, loss);
        double ld = 0;
        for (int i = 0; i < R; i++) ld += (double)loss[i] * dloss[i];
        x[k] = x0;
        num[k] = (up - dn) / 2e-2;
        nxent[k] = (lu - ld) / 2e-2;
    }
    assert_close(dx, num, R * C, 2e-3, "softmax_bwd");
    assert_close(d2, nxent, R * C, 2e-3, "xent_bwd");
    rt_xent_fwd(R, C, x, label, 0.1f, 2, loss); /* rows past n_valid count zero */
    assert_true(loss[2] == 0 && loss[3] == 0 && loss[0] > 0);
    /* smoothed loss = -sum_j target_j log softmax_j, target = 0.9 onehot + 0.1 / C */
    double want = 0;
    for (int j = 0; j < C; j++) want -= (0.1 / C + (j == label[1] ? 0.9 : 0.0)) * log(ref[C + j]);
    assert_true(fabs(loss[1] - want) < 1e-5 * fmax(1.0, fabs(want)));
    free(x);
}

/* The gradient of cross-entropy takes each row's log-sum-exp from the forward pass's loss.
 * Against softmax - target in double, a probability's relative error is at most the sum of:
 *   - the lse's error: the forward's exponentials are rt_expf's (2 ulp, 2^-22) of x - max
 *     rounded to float (2^-24 |x - max|), so the sum, and lse, are off by at most
 *     2^-24 max|x - max| + 2^-22; the lse recovered from the float loss adds half an ulp of the
 *     loss (rows past n_valid recompute it: the first part only);
 *   - x - lse rounded to float, 2^-24 |x - lse|, and rt_expf's 2 ulp of it, 2^-22;
 * and the result is rounded to float once. The gradient written over the logits has the same bits as one written apart
 * (the same operations, each element read before it is written). Rows past n_valid, whose loss
 * is 0, and ignored rows are covered, with and without label smoothing. */
static void test_xent_bwd_from_loss(void **state) {
    (void)state;
    enum { R = 6, C = 1000 };
    float *x = randv(R * C), *d = malloc(R * C * sizeof *d), *inplace = malloc(R * C * sizeof *inplace);
    float loss[R], dloss[R] = {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -0.75f};
    int64_t label[R] = {0, 999, 3, 500, 7, 42}, n_valid = 4, ignore = 7;
    for (int i = 0; i < R * C; i++) x[i] *= 8; /* losses from about 1 to 20 */
    x[42 * 1 + 5 * C] = 30;                     /* one confident row past n_valid */
    for (int smooth = 0; smooth < 2; smooth++) {
        float s = smooth ? 0.1f : 0.0f;
        for (int ign = 0; ign < 2; ign++) {
            if (ign) rt_xent_ignore_fwd(R, C, x, label, s, ignore, n_valid, loss);
            else rt_xent_fwd(R, C, x, label, s, n_valid, loss);
            memcpy(inplace, x, R * C * sizeof *x);
            if (ign) {
                rt_xent_ignore_bwd(R, C, x, label, s, ignore, n_valid, loss, dloss, d);
                rt_xent_ignore_bwd(R, C, inplace, label, s, ignore, n_valid, loss, dloss, inplace);
            } else {
                rt_xent_bwd(R, C, x, label, s, n_valid, loss, dloss, d);
                rt_xent_bwd(R, C, inplace, label, s, n_valid, loss, dloss, inplace);
            }
            assert_memory_equal(d, inplace, R * C * sizeof *d);
            for (int r = 0; r < R; r++) {
                const float *xr = x + r * C;
                double m = -INFINITY, sum = 0, spread = 0;
                for (int j = 0; j < C; j++) m = fmax(m, xr[j]);
                for (int j = 0; j < C; j++) sum += exp(xr[j] - m), spread = fmax(spread, m - xr[j]);
                double lse = m + log(sum), e_lse = ldexp(spread, -24) + ldexp(1.0, -22) +
                                                   (r < n_valid ? ldexp(fmax(fabs(loss[r]), 1.0), -24) : 0);
                for (int j = 0; j < C; j++) {
                    double p = exp(xr[j] - lse), t = (double)s / C + (j == label[r] ? 1.0 - s : 0.0);
                    double want = ign && label[r] == ignore ? 0.0 : dloss[r] * (p - t);
                    double e_p = e_lse + ldexp(fabs(xr[j] - lse), -24) + ldexp(1.0, -22);
                    double tol = fabs(dloss[r]) * p * e_p + ldexp(fabs(want), -24) + 1e-30;
                    if (fabs(d[r * C + j] - want) > tol)
                        fail_msg("xent_bwd row %d class %d (smoothing %g, ignore %d): %.9g, want %.9g (tolerance %.3g)",
                                 r, j, s, ign, d[r * C + j], want, tol);
                }
            }
        }
    }
    free(x), free(d), free(inplace);
}

/* ---- batch normalisation */

static void test_batchnorm(void **state) {
    (void)state;
    enum { N = 3, C = 2, HW = 5 };
    float *x = randv(N * C * HW), *dy = randv(N * C * HW), stats[2 * C], sums[2 * C];
    float running[2 * C + 1] = {0.5f, -1.0f, 2.0f, 3.0f, 7.0f}; /* mean, var, count */
    rt_bn_stats(N, C, HW, x, stats, 1e-5, 0.1, running, 1);
    for (int c = 0; c < C; c++) {
        double m = 0, v = 0, s0 = 0, s1 = 0, old_mean = c ? -1.0 : 0.5, old_var = c ? 3.0 : 2.0;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < HW; k++) m += x[(n * C + c) * HW + k];
        m /= N * HW;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < HW; k++) v += pow(x[(n * C + c) * HW + k] - m, 2);
        double inv = 1 / sqrt(v / (N * HW) + 1e-5);
        assert_true(fabs(stats[c] - m) < 1e-6 && fabs(stats[C + c] - inv) < 1e-5 * inv);
        /* running statistics: momentum 0.1 toward the batch mean and the unbiased variance */
        assert_true(fabs(running[c] - (0.9 * old_mean + 0.1 * m)) < 1e-6);
        assert_true(fabs(running[C + c] - (0.9 * old_var + 0.1 * v / (N * HW - 1))) < 1e-5);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < HW; k++) {
                int i = (n * C + c) * HW + k;
                s0 += dy[i], s1 += dy[i] * (x[i] - m) * inv;
            }
        rt_bn_bwd_sums(N, C, HW, x, stats, dy, sums);
        assert_true(fabs(sums[c] - s0) < 1e-5 && fabs(sums[C + c] - s1) < 1e-4);
    }
    assert_true(running[2 * C] == 8.0f); /* num_batches_tracked counts steps */
    float eval_stats[2 * C], frozen[2 * C + 1];
    memcpy(frozen, running, sizeof frozen);
    rt_bn_stats(N, C, HW, x, eval_stats, 1e-5, 0.1, running, 0); /* evaluation: running values, unchanged */
    assert_true(memcmp(frozen, running, sizeof frozen) == 0);
    assert_true(eval_stats[0] == running[0] && fabs(eval_stats[C] - 1 / sqrt(running[C] + 1e-5)) < 1e-6);
    free(x);
    free(dy);
}

/* Folding a batch norm (evaluation statistics) into the convolution before it gives the same
 * output as the convolution followed by the batch norm. Both sum the same products in float;
 * the folded one rounds the scaled weights first: 1e-5 relative. */
static void test_bn_fold(void **state) {
    (void)state;
    RtConv c = {.N = 2, .C = 3, .H = 6, .W = 5, .K = 4, .R = 3, .S = 3, .P = 6, .Q = 5, .stride_h = 1,
                .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 1};
    int64_t nx = c.N * c.C * c.H * c.W, nw = c.K * c.C * c.R * c.S, ny = c.N * c.K * c.P * c.Q, per;
    float *x = randv(nx), *w = randv(nw), *y = malloc((size_t)ny * 4), *yf = malloc((size_t)ny * 4);
    float *s = scratch_for(&c, &per), *gamma = randv(c.K), *beta = randv(c.K), wf[4 * 27], bf[4];
    float stats[8], running[9] = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 1.5f, 2.0f, 0.7f, 3.0f};
    rt_bn_stats(c.N, c.K, c.P * c.Q, y, stats, 1e-5, 0.1, running, 0);
    rt_conv2d_fwd(&c, x, w, y, s, per);
    rt_bn_fold(c.K, nw / c.K, w, stats, gamma, beta, wf, bf);
    rt_conv2d_fwd(&c, x, wf, yf, s, per);
    double *want = malloc((size_t)ny * 8);
    for (int64_t i = 0; i < ny; i++) {
        int64_t k = i / (c.P * c.Q) % c.K;
        want[i] = (y[i] - stats[k]) * stats[c.K + k] * gamma[k] + beta[k];
        yf[i] += bf[k];
    }
    assert_close(yf, want, ny, 1e-5, "conv2d with folded batch norm");
    free(x), free(w), free(y), free(yf), free(s), free(gamma), free(beta), free(want);
}

static void test_accuracy(void **state) {
    (void)state;
    float logits[3 * 3] = {1, 2, 3, 5, 1, 1, 0, 0, 0};
    int64_t label[3] = {2, 1, 0};
    assert_true(rt_accuracy(3, 3, logits, label, 3) == 2.0f); /* ties: the first maximum */
    assert_true(rt_accuracy(3, 3, logits, label, 1) == 1.0f);
}

/* Top-k accuracy by hand: ties rank the earlier class higher, as argmax's first maximum; a
 * NaN label logit, a label outside the classes or the ignored one is never right. */
static void test_accuracy_top(void **state) {
    (void)state;
    const float nan = NAN;
    float logits[5 * 4] = {
        4, 3, 2, 1,   /* label 2: third largest */
        1, 1, 1, 1,   /* label 3: all equal, the three before it rank above */
        0, 9, 9, 0,   /* label 2: second (class 1 equal and earlier) */
        1, nan, 2, 3, /* label 1: NaN, never right */
        1, 2, 3, 4,   /* label 7: not a class */
    };
    int64_t label[5] = {2, 3, 2, 1, 7};
    assert_true(rt_accuracy_top(5, 4, logits, label, INT64_MIN, 1, 5) == 0.0f);
    assert_true(rt_accuracy_top(5, 4, logits, label, INT64_MIN, 2, 5) == 1.0f);
    assert_true(rt_accuracy_top(5, 4, logits, label, INT64_MIN, 3, 5) == 2.0f);
    assert_true(rt_accuracy_top(5, 4, logits, label, INT64_MIN, 4, 5) == 3.0f);
    assert_true(rt_accuracy_top(5, 4, logits, label, INT64_MIN, 4, 2) == 2.0f); /* the first 2 rows */
    assert_true(rt_accuracy_top(5, 4, logits, label, 3, 4, 5) == 2.0f);         /* label 3 ignored */
}

/* top_k = 1 counts what argmax counts, on rows without NaN and with many ties (values from a
 * set of four), labels and ignored labels drawn at random. */
static void test_accuracy_top1_is_argmax(void **state) {
    (void)state;
    enum { R = 300, C = 7 };
    float x[R * C];
    int64_t label[R];
    uint64_t s = 12345;
    for (int i = 0; i < R * C; i++) x[i] = (float)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 62);
    for (int r = 0; r < R; r++) label[r] = (int64_t)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % C;
    assert_true(rt_accuracy_top(R, C, x, label, INT64_MIN, 1, R) == rt_accuracy(R, C, x, label, R));
    assert_true(rt_accuracy_top(R, C, x, label, 4, 1, R) == rt_accuracy_ignore(R, C, x, label, 4, R));
    /* every label is among all C */
    assert_true(rt_accuracy_top(R, C, x, label, INT64_MIN, C, R) == (float)R);
}

/* One product of test_gemm: C = alpha op(A) op(B) + beta C, scaled or not, checked element by
 * element, and C's columns past N (scaled: a row stride 3 wider) untouched. */
static void gemm_case(int64_t M, int64_t N, int64_t K, int ta, int tb, int scaled) {
    const int64_t pad = scaled ? 3 : 0, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const float alpha = scaled ? 0.5f : 1.0f, beta = scaled ? 1.0f : 0.0f;
    const double n_terms = (double)(K + scaled), gamma = n_terms * 0x1p-24 / (1 - n_terms * 0x1p-24);
    float *a = randv((ta ? K : M) * lda), *b = randv((tb ? N : K) * ldb), *c = randv(M * ldc);
    float *c0 = malloc(sizeof *c0 * (size_t)(M * ldc));
    memcpy(c0, c, sizeof *c0 * (size_t)(M * ldc));
    rt_gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = N; j < ldc; j++)
            if (c[i * ldc + j] != c0[i * ldc + j]) {
                print_error("gemm %lldx%lldx%lld ta %d tb %d wrote C[%lld,%lld] past its %lld columns\n", (long long)M,
                            (long long)N, (long long)K, ta, tb, (long long)i, (long long)j, (long long)N);
                fail();
            }
        for (int64_t j = 0; j < N; j++) {
            double sum = scaled ? c0[i * ldc + j] : 0, mag = fabs(sum);
            for (int64_t k = 0; k < K; k++) {
                double p = (double)alpha * (ta ? a[k * lda + i] : a[i * lda + k]) * (tb ? b[j * ldb + k] : b[k * ldb + j]);
                sum += p, mag += fabs(p);
            }
            double bound = gamma * mag;
            if (fabs(c[i * ldc + j] - sum) > bound) {
                print_error("gemm %lldx%lldx%lld ta %d tb %d alpha %g beta %g [%lld,%lld]: got %.9g want %.9g (bound %g)\n",
                            (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta, (long long)i, (long long)j,
                            c[i * ldc + j], sum, bound);
                fail();
            }
        }
    }
    free(a), free(b), free(c), free(c0);
}

/* rt_gemm on whichever library NETC_GEMM and the CPU route it to (CMakeLists.txt runs this file
 * under each route): a tiny product, a skinny one (a LoRA adapter's rank) and one past
 * GEMM_DNNL_MIN, in every orientation, each element within gamma_K sum_k |a_ik b_kj| of its
 * double sum, gamma_K = K u / (1 - K u) with u = 2^-24: the bound on a float32 dot product of
 * length K summed in any order (with or without fused multiply-adds). Then the same products
 * scaled and added to C (alpha 0.5, beta 1), with every matrix a row stride wider than its
 * columns: alpha 0.5 scales exactly, so each element is a sum of K + 1 terms (the products
 * halved, and C's value), within gamma_(K+1) of the sum of their magnitudes. */
static void test_gemm(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{5, 4, 3}, {64, 8, 96}, {96, 64, 8}, {256, 136, 128}};
    for (int scaled = 0; scaled < 2; scaled++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, scaled);
}

/* ---- the labelled rows only (rt_row_order, rt_row_compact, rt_gemm_rows) */

enum { LR = 37, LV = 19, LD = 11, IGNORE = -100 };

/* labels with every third row and the last one ignored, none, or all */
static int64_t fill_labels(int64_t *label, int pattern) {
    int64_t n = 0;
    for (int64_t r = 0; r < LR; r++) {
        int ignored = pattern == 0 ? r % 3 == 1 || r == LR - 1 : pattern == 2;
        label[r] = ignored ? IGNORE : r % LV;
        n += !ignored;
    }
    return n;
}

/* double reference of op(A) @ op(B) over the first n stored rows of A (the others zeros) */
static void gemm_rows_ref(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *a, const float *b, int64_t n,
                          double *c) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) {
                if ((ta ? k : i) >= n) continue; /* A's stored row k (trans_a) or i */
                s += (double)(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
            }
            c[i * N + j] = s;
        }
}

static void test_ignored_rows(void **state) {
    (void)state;
    for (int pattern = 0; pattern < 3; pattern++) {
        int64_t label[LR], order[LR];
        const int64_t n = fill_labels(label, pattern);
        rt_row_order(LR, label, IGNORE, order);
        int64_t k = 0; /* the counted rows in increasing order, then the others */
        for (int64_t r = 0; r < LR; r++)
            if (label[r] != IGNORE) assert_int_equal(order[k++], r);
        for (int64_t r = 0; r < LR; r++)
            if (label[r] == IGNORE) assert_int_equal(order[k++], r);

        /* compaction moves rows (memcpy): exact, out of place and over x itself */
        float *x = randv(LR * LV), *out = malloc(sizeof(float) * LR * LV), *inplace = malloc(sizeof(float) * LR * LV);
        memcpy(inplace, x, sizeof(float) * LR * LV);
        for (int64_t i = 0; i < LR * LV; i++) out[i] = NAN;
        rt_row_compact(LR, LV, x, order, label, IGNORE, out);
        rt_row_compact(LR, LV, inplace, order, label, IGNORE, inplace);
        for (int64_t i = 0; i < LR; i++)
            for (int64_t j = 0; j < LV; j++) {
                float want = i < n ? x[order[i] * LV + j] : 0.0f;
                assert_true(out[i * LV + j] == want && inplace[i * LV + j] == want);
            }

        /* the products over the first n rows of A, for each transposition of the other operand:
         * G^T B (the weight's gradient) and G op(B) (the input's); A is x, whose rows past n are
         * not zeros, so a product that reads them fails, and the output starts as NaN, so a row
         * left unwritten fails */
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t M = ta ? LV : LR, N = LD, K = ta ? LR : LV;
                float *b = randv(K * N), *c = malloc(sizeof(float) * M * N);
                double *ref = malloc(sizeof(double) * M * N);
                for (int64_t i = 0; i < M * N; i++) c[i] = NAN;
                gemm_rows_ref(ta, tb, M, N, K, x, b, n, ref);
                rt_gemm_rows(ta, tb, M, N, K, x, ta ? M : K, b, tb ? K : N, c, N, label, IGNORE);
                /* float32 products summed over at most LR terms in a blocked order: a few ulps
                 * of the largest partial sum, as test_gemm */
                assert_close(c, ref, M * N, 1e-5, ta ? "gemm_rows G^T B" : "gemm_rows G op(B)");
                if (!ta) /* rows past n: exactly zero, not merely small */
                    for (int64_t i = n * N; i < M * N; i++) assert_true(c[i] == 0.0f);
                free(b), free(c), free(ref);
            }
        free(x), free(out), free(inplace);
    }
}

/* rt_gemm_reference: within one rounding of the double product (it is that product, rounded
 * once: half an ulp of each element, 6e-8 relative to the largest), with beta; and the same bits
 * for every element when the product is cut into blocks of rows or of columns, as the CPU
 * trainer's epilogues cut it, which is what the emulation tests rely on. */
static void test_gemm_reference(void **state) {
    (void)state;
    enum { M = 13, N = 9, K = 70 };
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *a = randv(M * K), *b = randv(K * N), *c0 = randv(M * N), c[M * N], blocks[M * N];
            double ref[M * N];
            int64_t lda = ta ? M : K, ldb = tb ? K : N;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int k = 0; k < K; k++) s += (double)(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
                    ref[i * N + j] = 0.5 * s + 0.25 * c0[i * N + j];
                }
            memcpy(c, c0, sizeof c);
            rt_gemm_reference(ta, tb, M, N, K, 0.5f, a, lda, b, ldb, 0.25f, c, N);
            assert_close(c, ref, M * N, 1e-7, "gemm_reference");
            for (int by_rows = 0; by_rows < 2; by_rows++) {
                memcpy(blocks, c0, sizeof blocks);
                for (int64_t lo = 0, step = by_rows ? 4 : 2; lo < (by_rows ? M : N); lo += step) {
                    int64_t n = (by_rows ? M : N) - lo < step ? (by_rows ? M : N) - lo : step;
                    if (by_rows) /* rows lo.. of op(A) */
                        rt_gemm_reference(ta, tb, n, N, K, 0.5f, ta ? a + lo : a + lo * K, lda, b, ldb, 0.25f,
                                          blocks + lo * N, N);
                    else /* columns lo.. of op(B) */
                        rt_gemm_reference(ta, tb, M, n, K, 0.5f, a, lda, tb ? b + lo * K : b + lo, ldb, 0.25f,
                                          blocks + lo, N);
                }
                assert_memory_equal(blocks, c, sizeof c);
            }
            free(a), free(b), free(c0);
        }
}

/* rt_expf (rt_bits.h) against exp in double on every 997th float in its range: within 2 ulp
 * (measured over every 7th float: 0.99 ulp at most; libm's expf 0.50), an ulp being that of
 * the exact value; and its ends: 0 below ln FLT_MIN, +inf above ln FLT_MAX and for +inf, 0 for
 * -inf, 1 for +-0, NaN for NaN. */
/* |got - want| in units in the last place of the float nearest want (below the smallest normal
 * float, in its unit) */
static double ulp_error(float got, double want) {
    int e;
    frexp(want, &e);
    return fabs(got - want) / ldexp(1.0, (fabs(want) < 0x1p-126 ? -125 : e) - 24);
}

static void test_expf(void **state) {
    (void)state;
    const float lo = -87.3365479f, hi = 88.7228394f;
    double worst = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) {
        float x = rt_float_of((uint32_t)bits);
        if (!(x >= lo && x <= hi)) continue;
        double want = exp((double)x), err = ulp_error(rt_expf(x), want);
        if (err > worst) worst = err;
        if (err > 2.0) {
            print_error("rt_expf(%.9g) = %.9g, exp %.17g: %.3g ulp\n", x, rt_expf(x), want, err);
            fail();
        }
    }
    print_message("rt_expf: at most %.3f ulp\n", worst);
    assert_true(rt_expf(-88.0f) == 0.0f && rt_expf(-INFINITY) == 0.0f);
    assert_true(isinf(rt_expf(88.75f)) && isinf(rt_expf(INFINITY)) && rt_expf(88.72283f) < INFINITY);
    assert_true(rt_expf(0.0f) == 1.0f && rt_expf(-0.0f) == 1.0f && isnan(rt_expf(NAN)));
}

/* rt_expf_nonpos gives rt_expf's bits for every 97th float below 88 (every non-positive float,
 * -inf and the NaNs with the sign bit among them, and the positive ones whose 2^n it still
 * takes as one normal factor), so that the kernels may call either where x <= 0. */
static void test_expf_nonpos(void **state) {
    (void)state;
    uint64_t differ = 0, tried = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 97) {
        const float x = rt_float_of((uint32_t)bits);
        if (!(x < 88.0f) && x == x) continue;
        const float want = rt_expf(x), got = rt_expf_nonpos(x);
        tried++;
        if (rt_bits_of(got) != rt_bits_of(want) && !(isnan(got) && isnan(want)) && differ++ < 5)
            print_error("rt_expf_nonpos(%a) = %a, rt_expf %a\n", x, got, want);
    }
    print_message("rt_expf_nonpos: %llu floats, %llu differ\n", (unsigned long long)tried, (unsigned long long)differ);
    assert_int_equal(differ, 0);
    assert_true(rt_expf_nonpos(0.0f) == 1.0f && rt_expf_nonpos(-INFINITY) == 0.0f);
}

/* fn, an odd function's float version, against the exact one at every 97th float of [0, end) and
 * their negatives: within 2 ulp of the float nearest the exact value. The largest error. */
static double odd_within_2ulp(const char *name, float (*fn)(float), double (*exact)(double), uint32_t end) {
    double worst = 0;
    for (uint32_t bits = 0; bits < end; bits += 97) {
        for (int sign = 0; sign < 2; sign++) {
            float x = rt_float_of(bits | (sign ? 0x80000000u : 0));
            double want = exact((double)x), err = ulp_error(fn(x), want);
            if (err > worst) worst = err;
            if (err > 2.0) {
                print_error("%s(%.9g) = %.9g, exactly %.17g: %.3g ulp\n", name, x, fn(x), want, err);
                fail();
            }
        }
    }
    print_message("%s: at most %.3f ulp\n", name, worst);
    return worst;
}

/* rt_erff for |x| < 6 (erf is 1 beyond, in float) */
static void test_erff(void **state) {
    (void)state;
    odd_within_2ulp("rt_erff", rt_erff, erf, 0x40c00000u);
    assert_true(rt_erff(0.0f) == 0.0f && rt_erff(INFINITY) == 1.0f && rt_erff(-INFINITY) == -1.0f);
    assert_true(rt_erff(10.0f) == 1.0f && rt_erff(-4.5f) == -1.0f && isnan(rt_erff(NAN)));
}

/* rt_tanhf for |x| < 12 (tanh is 1 beyond, in float) */
static void test_tanhf(void **state) {
    (void)state;
    odd_within_2ulp("rt_tanhf", rt_tanhf, tanh, 0x41400000u);
    assert_true(rt_tanhf(0.0f) == 0.0f && rt_tanhf(INFINITY) == 1.0f && rt_tanhf(-INFINITY) == -1.0f);
    assert_true(rt_tanhf(30.0f) == 1.0f && rt_tanhf(-100.0f) == -1.0f && isnan(rt_tanhf(NAN)));
}

static void test_half(void **state) {
    (void)state;
    float values[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) { /* exactly representable: round trip */
        assert_true(rt_f16_to_f32(rt_f32_to_f16(values[i])) == values[i]);
        assert_true(fabsf(rt_bf16_to_f32(rt_f32_to_bf16(values[i])) - values[i]) <= fabsf(values[i]) / 128);
    }
    assert_true(isinf(rt_f16_to_f32(rt_f32_to_f16(1e6f))));
    assert_true(rt_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* a tie rounds to even */
    assert_true(rt_f32_to_bf16(1.0f) == 0x3f80);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),          cmocka_unit_test(test_gemm_reference), cmocka_unit_test(test_conv_forward),
        cmocka_unit_test(test_conv_backward), cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_softmax_and_xent), cmocka_unit_test(test_xent_bwd_from_loss), cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_accuracy_top), cmocka_unit_test(test_accuracy_top1_is_argmax),
        cmocka_unit_test(test_batchnorm),     cmocka_unit_test(test_bn_fold),
        cmocka_unit_test(test_half),          cmocka_unit_test(test_ignored_rows), cmocka_unit_test(test_expf),
        cmocka_unit_test(test_expf_nonpos),   cmocka_unit_test(test_erff),         cmocka_unit_test(test_tanhf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
