/* test_nhwc.c - the channels-last kernels (oneDNN convolutions, pooling, batch-norm sums)
 * against the row-major kernels that test_kernels.c checks, on the same values transposed.
 *
 * Tolerances: pooling and batch norm take the same windows in the same order and sum in
 * double, so they must agree exactly (pooling) or to float rounding of the final value
 * (batch-norm blocks group the double sums differently: 1e-6 relative). oneDNN's convolutions
 * sum in float32 in another order than im2col + SGEMM, so they agree to a few ulps of the
 * largest partial sum: 1e-4 relative to the result's magnitude, far below an indexing error.
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

#include "test_util.h"

/* [N,C,H,W] <-> [N,H,W,C] */
static float *to_nhwc(const float *x, int64_t N, int64_t C, int64_t H, int64_t W) {
    float *y = malloc((size_t)(N * C * H * W) * sizeof *y);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t s = 0; s < H * W; s++) y[(n * H * W + s) * C + c] = x[(n * C + c) * H * W + s];
    return y;
}
static float *to_nchw(const float *x, int64_t N, int64_t C, int64_t H, int64_t W) {
    float *y = malloc((size_t)(N * C * H * W) * sizeof *y);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t s = 0; s < H * W; s++) y[(n * C + c) * H * W + s] = x[(n * H * W + s) * C + c];
    return y;
}

static void assert_close(const float *got, const float *want, int64_t n, double tol, const char *what) {
    double scale = 1e-6;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * scale)) {
            print_error("%s[%lld]: got %g want %g (tolerance %g)\n", what, (long long)i, got[i], want[i], tol * scale);
            fail();
        }
}

static void test_conv(void **state) {
    (void)state;
    RtConv cases[] = {
        geometry(2, 3, 7, 4, 3, 1, 1, 1, 1),    geometry(3, 4, 9, 6, 3, 2, 1, 1, 2), /* stride 2, groups 2 */
        geometry(2, 2, 8, 3, 3, 1, 2, 2, 1),    /* dilation 2 */
        geometry(2, 3, 16, 8, 7, 2, 3, 1, 1),   /* a ResNet stem */
        geometry(2, 16, 5, 32, 1, 2, 0, 1, 1),  /* a strided 1x1 shortcut */
        geometry(2, 4, 6, 4, 3, 1, 1, 1, 4),    /* depthwise */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const RtConv *c = &cases[i];
        int64_t nx = c->N * c->C * c->H * c->W, nw = c->K * (c->C / c->groups) * c->R * c->S,
                ny = c->N * c->K * c->P * c->Q, per = rt_conv2d_scratch(c);
        float *x = randv(nx), *w = randv(nw), *dy = randv(ny), *s = calloc((size_t)(per * 64), 4);
        float *y = malloc((size_t)ny * 4), *dx = malloc((size_t)nx * 4), *dw = malloc((size_t)nw * 4);
        rt_conv2d_fwd(c, x, w, y, s, per);
        rt_conv2d_bwd_data(c, dy, w, dx, s, per);
        rt_conv2d_bwd_filter(c, x, dy, dw, s, per);

        float *xh = to_nhwc(x, c->N, c->C, c->H, c->W), *dyh = to_nhwc(dy, c->N, c->K, c->P, c->Q);
        float *yh = malloc((size_t)ny * 4), *dxh = malloc((size_t)nx * 4), *dwh = malloc((size_t)nw * 4);
        RtConvPlan *pf = NULL, *pd = NULL, *pw = NULL;
        for (int rep = 0; rep < 2; rep++) { /* the second call reuses each plan */
            rt_conv2d_nhwc_fwd(c, &pf, xh, w, yh);
            rt_conv2d_nhwc_bwd_data(c, &pd, dyh, w, dxh);
            rt_conv2d_nhwc_bwd_filter(c, &pw, xh, dyh, dwh);
        }
        assert_non_null(pf);
        rt_conv_plan_free(pf), rt_conv_plan_free(pd), rt_conv_plan_free(pw);
        float *y2 = to_nchw(yh, c->N, c->K, c->P, c->Q), *dx2 = to_nchw(dxh, c->N, c->C, c->H, c->W);
        assert_close(y2, y, ny, 1e-4, "conv2d_nhwc_fwd");
        assert_close(dx2, dx, nx, 1e-4, "conv2d_nhwc_bwd_data");
        assert_close(dwh, dw, nw, 1e-4, "conv2d_nhwc_bwd_filter");
        free(x), free(w), free(dy), free(s), free(y), free(dx), free(dw), free(xh), free(dyh);
        free(yh), free(dxh), free(dwh), free(y2), free(dx2);
    }
}

static void check_pool(RtPool p) {
    p.P = (p.H + 2 * p.pad_h - p.kh) / p.stride_h + 1;
    p.Q = (p.W + 2 * p.pad_w - p.kw) / p.stride_w + 1;
    int64_t nx = p.N * p.C * p.H * p.W, ny = p.N * p.C * p.P * p.Q;
    float *x = randv(nx), *dy = randv(ny);
    for (int64_t i = 0; i < nx; i += 7) x[i] = x[i / 2]; /* ties: the first maximum wins in both */
    for (int64_t i = 0; i + 1 < nx; i += 10) x[i + 1] = x[i]; /* ties inside a window's row */
    for (int64_t i = 0; i < ny; i += 9) dy[i] = -0.0f; /* routed as an addition into zeros routes it */
    float *y = malloc((size_t)ny * 4), *dx = malloc((size_t)nx * 4), *ya = malloc((size_t)ny * 4),
          *dxa = malloc((size_t)nx * 4);
    rt_maxpool2d_fwd(&p, x, y);
    rt_maxpool2d_bwd(&p, x, dy, dx);
    rt_avgpool2d_fwd(&p, x, ya);
    rt_avgpool2d_bwd(&p, dy, dxa);
    float *xh = to_nhwc(x, p.N, p.C, p.H, p.W), *dyh = to_nhwc(dy, p.N, p.C, p.P, p.Q);
    float *yh = malloc((size_t)ny * 4), *dxh = malloc((size_t)nx * 4);
    rt_maxpool2d_nhwc_fwd(&p, xh, yh);
    float *t = to_nchw(yh, p.N, p.C, p.P, p.Q);
    assert_memory_equal(t, y, (size_t)ny * 4);
    free(t);
    rt_maxpool2d_nhwc_bwd(&p, xh, dyh, dxh);
    t = to_nchw(dxh, p.N, p.C, p.H, p.W);
    assert_memory_equal(t, dx, (size_t)nx * 4);
    free(t);
    rt_avgpool2d_nhwc_fwd(&p, xh, yh);
    t = to_nchw(yh, p.N, p.C, p.P, p.Q);
    assert_memory_equal(t, ya, (size_t)ny * 4);
    free(t);
    rt_avgpool2d_nhwc_bwd(&p, dyh, dxh);
    t = to_nchw(dxh, p.N, p.C, p.H, p.W);
    assert_close(t, dxa, nx, 1e-6, "avgpool2d_nhwc_bwd"); /* overlapping windows add in another order */
    free(t);
    free(x), free(dy), free(y), free(dx), free(ya), free(dxa), free(xh), free(dyh), free(yh), free(dxh);
}

static void test_pooling(void **state) {
    (void)state;
    check_pool((RtPool){.N = 2, .C = 3, .H = 7, .W = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 2,
                        .pad_h = 1, .pad_w = 1});
    check_pool((RtPool){.N = 2, .C = 5, .H = 9, .W = 9, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                        .pad_h = 1, .pad_w = 1}); /* ResNet's stem pooling */
    check_pool((RtPool){.N = 3, .C = 8, .H = 4, .W = 4, .kh = 4, .kw = 4, .stride_h = 4, .stride_w = 4}); /* global */
    /* 2x2 at stride 2 (rt_nhwc.c's own kernels): LeNet's, and an odd plane whose last row and
     * column lie in no window */
    check_pool((RtPool){.N = 2, .C = 6, .H = 24, .W = 24, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2});
    check_pool((RtPool){.N = 2, .C = 5, .H = 9, .W = 7, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2});
}

static void test_batchnorm(void **state) {
    (void)state;
    enum { N = 3, C = 5, H = 13, W = 11 }; /* N*H*W = 429 rows: two blocks, one partial */
    int64_t nx = N * C * H * W;
    float *x = randv(nx), *dy = randv(nx);
    for (int64_t i = 0; i < nx; i++) x[i] = 3 * x[i] + 2; /* a mean far from 0 */
    float stats[2 * C], sums[2 * C], stats_h[2 * C], sums_h[2 * C];
    float run[2 * C + 1], run_h[2 * C + 1];
    for (int c = 0; c < 2 * C + 1; c++) run[c] = run_h[c] = (float)(c + 1);
    rt_bn_stats(N, C, H * W, x, stats, 1e-5, 0.1, run, 1);
    rt_bn_bwd_sums(N, C, H * W, x, stats, dy, sums);
    float *xh = to_nhwc(x, N, C, H, W), *dyh = to_nhwc(dy, N, C, H, W);
    rt_bn_stats_nhwc(N * H * W, C, xh, stats_h, 1e-5, 0.1, run_h, 1);
    rt_bn_bwd_sums_nhwc(N * H * W, C, xh, stats_h, dyh, sums_h);
    assert_close(stats_h, stats, 2 * C, 1e-6, "bn_stats_nhwc");
    assert_close(run_h, run, 2 * C + 1, 1e-6, "bn_stats_nhwc running statistics");
    assert_close(sums_h, sums, 2 * C, 1e-5, "bn_bwd_sums_nhwc"); /* float products, summed in double */
    rt_bn_stats_nhwc(N * H * W, C, xh, stats_h, 1e-5, 0.1, run_h, 0);
    rt_bn_stats(N, C, H * W, x, stats, 1e-5, 0.1, run, 0);
    assert_memory_equal(stats_h, stats, sizeof stats);
    free(x), free(dy), free(xh), free(dyh);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_batchnorm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
