/* test_rows.c - rt_rows.c's kernels (softmax and log-softmax along an axis, layer norm, RMS
 * norm) against plain double reference loops, their backward passes against central finite
 * differences of their forward passes, and the parameter gradients' sums against a double
 * reference over several blocks of RT_NORM_ROWS, bit-identical with 1 and 2 threads and whether
 * dx is computed in the same pass or not.
 *
 * Tolerances: forward values are float32 results of double sums, within a few ulps of the
 * double reference: 1e-5 relative to the largest value. Finite differences use double
 * accumulation of float32 outputs with h = 1e-2 on inputs of size ~1: ~1e-5 (rounding / h) plus
 * ~1e-4 (h^2 truncation), so 2e-3 relative. The parameter gradients sum float32 products
 * (xhat rounded to float, ~6e-8 relative each) in double: 1e-5 relative to the largest sum.
 */
#include <math.h>
#include <omp.h>
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

/* ---- softmax and log-softmax along the middle axis of [O, N, I] */

enum { O = 3, N = 5, I = 4 };

static void softmax_ref(const float *x, int log_form, double *y) {
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) {
            double m = -INFINITY, s = 0;
            for (int j = 0; j < N; j++) m = fmax(m, x[(o * N + j) * I + i]);
            for (int j = 0; j < N; j++) s += exp(x[(o * N + j) * I + i] - m);
            for (int j = 0; j < N; j++) {
                double v = x[(o * N + j) * I + i] - m;
                y[(o * N + j) * I + i] = log_form ? v - log(s) : exp(v) / s;
            }
        }
}

/* sum(f(x) * dy) for f the softmax (log_form 0) or log-softmax (1) of x along the axis. */
static double softmax_dot(const float *x, const float *dy, int log_form) {
    float y[O * N * I];
    if (log_form) rt_log_softmax_fwd(O, N, I, x, y);
    else rt_softmax_axis_fwd(O, N, I, x, y);
    double s = 0;
    for (int k = 0; k < O * N * I; k++) s += (double)y[k] * dy[k];
    return s;
}

static void test_softmax_axis(void **state) {
    (void)state;
    float *x = randv(O * N * I), *dy = randv(O * N * I), y[O * N * I], dx[O * N * I];
    for (int k = 0; k < O * N * I; k++) x[k] *= 4;
    double ref[O * N * I], num[O * N * I];
    for (int log_form = 0; log_form < 2; log_form++) {
        const char *what = log_form ? "log_softmax" : "softmax_axis";
        if (log_form) rt_log_softmax_fwd(O, N, I, x, y);
        else rt_softmax_axis_fwd(O, N, I, x, y);
        softmax_ref(x, log_form, ref);
        assert_close(y, ref, O * N * I, 1e-5, what);
        if (log_form) rt_log_softmax_bwd(O, N, I, y, dy, dx);
        else rt_softmax_axis_bwd(O, N, I, y, dy, dx);
        for (int k = 0; k < O * N * I; k++) {
            float x0 = x[k];
            x[k] = x0 + 1e-2f;
            double up = softmax_dot(x, dy, log_form);
            x[k] = x0 - 1e-2f;
            double dn = softmax_dot(x, dy, log_form);
            x[k] = x0;
            num[k] = (up - dn) / 2e-2;
        }
        assert_close(dx, num, O * N * I, 2e-3, what);
    }
    /* along the last axis (inner 1) the strided kernel is the row kernel, bit for bit */
    float a[O * N * I], b[O * N * I];
    rt_softmax_axis_fwd(O * N, I, 1, x, a);
    rt_softmax_fwd(O * N, I, x, b);
    assert_memory_equal(a, b, sizeof a);
    free(x);
    free(dy);
}

/* ---- layer norm and RMS norm over the last axis of [R, D] */

static void norm_ref(const float *x, const float *w, const float *b, int64_t R, int64_t D, int rms, double eps,
                     double *y) {
    for (int64_t r = 0; r < R; r++) {
        double m = 0, q = 0;
        for (int64_t j = 0; j < D; j++) m += rms ? 0 : x[r * D + j] / (double)D;
        for (int64_t j = 0; j < D; j++) q += (x[r * D + j] - m) * (x[r * D + j] - m) / (double)D;
        for (int64_t j = 0; j < D; j++)
            y[r * D + j] = (x[r * D + j] - m) / sqrt(q + eps) * w[j] + (b ? b[j] : 0);
    }
}

/* sum(norm(x) * dy) in double from the float kernel. */
static double norm_dot(const float *x, const float *w, const float *b, const float *dy, int64_t R, int64_t D, int rms) {
    float *y = malloc((size_t)(R * D) * sizeof *y);
    if (rms) rt_rmsnorm_fwd(R, D, x, w, 1e-5, y);
    else rt_layernorm_fwd(R, D, x, w, b, 1e-5, y);
    double s = 0;
    for (int64_t k = 0; k < R * D; k++) s += (double)y[k] * dy[k];
    free(y);
    return s;
}

static void test_norms(void **state) {
    (void)state;
    enum { R = 300, D = 12, RS = 3 }; /* R rows: 9 blocks of RT_NORM_ROWS and part of a tenth */
    float *x = randv(R * D), *dy = randv(R * D), *w = randv(D), *b = randv(D), *y = malloc(R * D * sizeof *y);
    double *ref = malloc(R * D * sizeof *ref), num[RS * D];
    for (int k = 0; k < R * D; k++) x[k] = 3 * x[k] + 1; /* a mean and scale to remove */
    for (int rms = 0; rms < 2; rms++) {
        const char *what = rms ? "rmsnorm" : "layernorm";
        if (rms) rt_rmsnorm_fwd(R, D, x, w, 1e-5, y);
        else rt_layernorm_fwd(R, D, x, w, b, 1e-5, y);
        norm_ref(x, w, rms ? NULL : b, R, D, rms, 1e-5, ref);
        assert_close(y, ref, R * D, 1e-5, what);

        /* dx on the first RS rows against finite differences */
        float dx[RS * D];
        rt_norm_bwd(RS, D, rms, x, w, dy, 1e-5, dx, NULL);
        for (int k = 0; k < RS * D; k++) {
            float x0 = x[k];
            x[k] = x0 + 1e-2f;
            double up = norm_dot(x, w, b, dy, RS, D, rms);
            x[k] = x0 - 1e-2f;
            double dn = norm_dot(x, w, b, dy, RS, D, rms);
            x[k] = x0;
            num[k] = (up - dn) / 2e-2;
        }
        assert_close(dx, num, RS * D, 2e-3, what);

        /* the parameter gradients: sum over rows of dy * xhat and of dy */
        float p1[2 * D], p2[2 * D];
        double want[2 * D];
        float ones[D], zeros[D];
        for (int j = 0; j < D; j++) ones[j] = 1, zeros[j] = 0;
        norm_ref(x, ones, zeros, R, D, rms, 1e-5, ref); /* xhat */
        for (int j = 0; j < D; j++) {
            want[j] = want[D + j] = 0;
            for (int r = 0; r < R; r++) want[j] += dy[r * D + j] * ref[r * D + j], want[D + j] += dy[r * D + j];
        }
        omp_set_num_threads(1);
        rt_norm_bwd(R, D, rms, x, NULL, dy, 1e-5, NULL, p1);
        omp_set_num_threads(2);
        rt_norm_bwd(R, D, rms, x, NULL, dy, 1e-5, NULL, p2);
        assert_close(p1, want, rms ? D : 2 * D, 1e-5, what);
        assert_memory_equal(p1, p2, (rms ? D : 2 * D) * sizeof *p1); /* independent of the threads */

        /* both in one pass: the same operations in the same order as each alone, so the same bits */
        float *dx_all = malloc(R * D * sizeof *dx_all), *dx_one = malloc(R * D * sizeof *dx_one), p3[2 * D];
        rt_norm_bwd(R, D, rms, x, w, dy, 1e-5, dx_all, p3);
        rt_norm_bwd(R, D, rms, x, w, dy, 1e-5, dx_one, NULL);
        assert_memory_equal(p3, p1, (rms ? D : 2 * D) * sizeof *p1);
        assert_memory_equal(dx_all, dx_one, R * D * sizeof *dx_all);
        assert_memory_equal(dx_all, dx, RS * D * sizeof *dx); /* the rows checked above */
        free(dx_all), free(dx_one);
    }
    free(x), free(dy), free(w), free(b), free(y), free(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_axis),
        cmocka_unit_test(test_norms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
