/* rt_rows.c - per-row kernels of the transformer layers: softmax and log-softmax along any axis,
 * layer norm and RMS norm over the last axis, forward and backward (declared in netrt.h).
 *
 * Every kernel is deterministic and independent of the number of threads: OpenMP splits only
 * independent outputs (rows, or columns of the parameter gradients), and every sum runs in a
 * fixed order in double (the norms' row sums in RT_LANES lanes, rt_internal.h).
 * runtime/cuda/netrt_rows.cuh computes the same formulas; its row sums add per-thread partial
 * sums by a fixed tree, so they can differ from these in the last bits,
 * while the norms' parameter gradients' sums (fixed blocks of RT_NORM_ROWS rows, then the blocks
 * in order) are the same on both.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* ---- softmax and log-softmax along an axis: x is [outer, n, inner], the axis the middle one */

/* Row (o, i) of [outer, n, inner]: its first element and the stride between its n elements. */
#define AXIS_ROW(r) (((r) / inner) * n * inner + (r) % inner)

void rt_softmax_axis_fwd(int64_t outer, int64_t n, int64_t inner, const float *x, float *y) {
    #pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t r = 0; r < outer * inner; r++) {
        const float *in = x + AXIS_ROW(r);
        float *out = y + AXIS_ROW(r), m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = fmaxf(m, in[j * inner]);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += out[j * inner] = expf(in[j * inner] - m);
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < n; j++) out[j * inner] *= inv;
    }
}

void rt_softmax_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *y, const float *dy, float *dx) {
    #pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t r = 0; r < outer * inner; r++) {
        const float *yr = y + AXIS_ROW(r), *gr = dy + AXIS_ROW(r);
        float *out = dx + AXIS_ROW(r);
        double dot = 0;
        for (int64_t j = 0; j < n; j++) dot += (double)yr[j * inner] * gr[j * inner];
        for (int64_t j = 0; j < n; j++) out[j * inner] = yr[j * inner] * (gr[j * inner] - (float)dot);
    }
}

/* y = (x - m) - log(sum(exp(x - m))), m the row's maximum, the sum in double. */
void rt_log_softmax_fwd(int64_t outer, int64_t n, int64_t inner, const float *x, float *y) {
    #pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t r = 0; r < outer * inner; r++) {
        const float *in = x + AXIS_ROW(r);
        float *out = y + AXIS_ROW(r), m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = fmaxf(m, in[j * inner]);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += expf(in[j * inner] - m);
        float l = (float)log(s);
        for (int64_t j = 0; j < n; j++) out[j * inner] = (in[j * inner] - m) - l;
    }
}

/* dx = dy - exp(y) * sum(dy), the sum in double. */
void rt_log_softmax_bwd(int64_t outer, int64_t n, int64_t inner, const float *y, const float *dy, float *dx) {
    #pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t r = 0; r < outer * inner; r++) {
        const float *yr = y + AXIS_ROW(r), *gr = dy + AXIS_ROW(r);
        float *out = dx + AXIS_ROW(r);
        double s = 0;
        for (int64_t j = 0; j < n; j++) s += gr[j * inner];
        float sf = (float)s;
        for (int64_t j = 0; j < n; j++) out[j * inner] = gr[j * inner] - expf(yr[j * inner]) * sf;
    }
}

/* ---- layer norm and RMS norm over the last axis of [rows, D] */

/* The lanes of a row's sums (rt_internal.h): part[l] += x[l], or += (x[l] - m)^2, for l < n. */
static inline void lanes_add(double *restrict part, const float *restrict x, int64_t n) {
#pragma omp simd
    for (int64_t l = 0; l < n; l++) part[l] += x[l];
}

static inline void lanes_add_sq(double *restrict part, const float *restrict x, double m, int64_t n) {
#pragma omp simd
    for (int64_t l = 0; l < n; l++) {
        const double d = x[l] - m;
        part[l] += d * d;
    }
}

/* sum of x[j] (m = NULL) or of (x[j] - *m)^2 */
static double row_sum(const float *x, int64_t D, const double *m) {
    double part[RT_LANES] = {0};
    const int64_t full = rt_lanes_full(D);
    if (!m) {
        for (int64_t j0 = 0; j0 < full; j0 += RT_LANES) lanes_add(part, x + j0, RT_LANES);
        lanes_add(part, x + full, D - full);
    } else {
        for (int64_t j0 = 0; j0 < full; j0 += RT_LANES) lanes_add_sq(part, x + j0, *m, RT_LANES);
        lanes_add_sq(part, x + full, *m, D - full);
    }
    return rt_lanes_total(part);
}

/* A row's statistics: layer norm's mean and 1/sqrt(var + eps) (biased variance, two passes in
 * double), or RMS norm's 0 and 1/sqrt(mean(x^2) + eps), each rounded once to float. */
static void row_stats(const float *x, int64_t D, int rms, double eps, float *mean, float *rstd) {
    const double m = rms ? 0 : row_sum(x, D, NULL) / (double)D, q = row_sum(x, D, &m);
    *mean = (float)m;
    *rstd = (float)(1.0 / sqrt(q / (double)D + eps));
}

void rt_layernorm_fwd(int64_t rows, int64_t D, const float *x, const float *w, const float *b, double eps, float *y) {
    #pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float m, rs;
        row_stats(xr, D, 0, eps, &m, &rs);
        for (int64_t j = 0; j < D; j++) y[r * D + j] = (xr[j] - m) * rs * w[j] + b[j];
    }
}

void rt_rmsnorm_fwd(int64_t rows, int64_t D, const float *x, const float *w, double eps, float *y) {
    #pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float m, rs;
        row_stats(xr, D, 1, eps, &m, &rs);
        for (int64_t j = 0; j < D; j++) y[r * D + j] = xr[j] * rs * w[j];
    }
}

/* The lanes of the sums of g = dy * w and of g * xhat, xhat = (x - m) * rs, for l < n. */
static inline void lanes_grad(double *restrict p1, double *restrict p2, const float *restrict x,
                              const float *restrict w, const float *restrict dy, float m, float rs, int64_t n) {
#pragma omp simd
    for (int64_t l = 0; l < n; l++) {
        const float g = dy[l] * w[l], xh = (x[l] - m) * rs;
        p1[l] += g;
        p2[l] += (double)g * xh;
    }
}

/* Row xr's part of the gradient: dxr = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w,
 * xhat = (x - mean) * rstd (RMS norm has no mean: dx = rstd * (g - xhat * mean(g * xhat)),
 * xhat = x * rstd), unless dxr is NULL; and, unless pw is NULL, dy * xhat added to pw and, for
 * layer norm, dy to pb (the parameter gradients' sums over the row's block). */
static void norm_bwd_row(int64_t D, int rms, const float *xr, const float *w, const float *gr, double eps, float *dxr,
                         double *pw, double *pb) {
    float m, rs, a = 0, c = 0;
    row_stats(xr, D, rms, eps, &m, &rs);
    if (dxr) {
        double p1[RT_LANES] = {0}, p2[RT_LANES] = {0}; /* sums of g and g * xh, in lanes */
        const int64_t full = rt_lanes_full(D);
        for (int64_t j0 = 0; j0 < full; j0 += RT_LANES) lanes_grad(p1, p2, xr + j0, w + j0, gr + j0, m, rs, RT_LANES);
        lanes_grad(p1, p2, xr + full, w + full, gr + full, m, rs, D - full);
        a = rms ? 0.0f : (float)(rt_lanes_total(p1) / (double)D), c = (float)(rt_lanes_total(p2) / (double)D);
    }
    if (dxr && pw) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) {
            float g = gr[j] * w[j], xh = (xr[j] - m) * rs;
            dxr[j] = rs * ((g - a) - xh * c);
            pw[j] += (double)gr[j] * xh;
            pb[j] += gr[j];
        }
    } else if (dxr) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) {
            float g = gr[j] * w[j], xh = (xr[j] - m) * rs;
            dxr[j] = rs * ((g - a) - xh * c);
        }
    } else {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) {
            float xh = (xr[j] - m) * rs;
            pw[j] += (double)gr[j] * xh;
            pb[j] += gr[j];
        }
    }
}

/* One task per block of RT_NORM_ROWS rows, its rows in order: each row is read once for dx and
 * the block's parameter sums (part[b] = its [2, D] sums, in double); then the blocks' sums
 * added in order, a thread per column. RMS norm's pb sums are computed and not used. */
void rt_norm_bwd(int64_t rows, int64_t D, int rms, const float *x, const float *w, const float *dy, double eps,
                 float *dx, float *params) {
    const int64_t nb = (rows + RT_NORM_ROWS - 1) / RT_NORM_ROWS;
    double *part = NULL;
    if (params && !(part = malloc((size_t)(nb * 2 * D) * sizeof *part))) {
        fprintf(stderr, "error: out of memory in a %s gradient (%lld rows of %lld)\n", rms ? "rmsnorm" : "layernorm",
                (long long)rows, (long long)D);
        exit(1);
    }
    #pragma omp parallel if (rows * D > 32768)
    {
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            double *pw = part ? part + b * 2 * D : NULL, *pb = pw ? pw + D : NULL;
            if (pw) memset(pw, 0, (size_t)(2 * D) * sizeof *pw);
            const int64_t r1 = (b + 1) * RT_NORM_ROWS < rows ? (b + 1) * RT_NORM_ROWS : rows;
            for (int64_t r = b * RT_NORM_ROWS; r < r1; r++)
                norm_bwd_row(D, rms, x + r * D, w, dy + r * D, eps, dx ? dx + r * D : NULL, pw, pb);
        }
        if (part) {
            #pragma omp for schedule(static)
            for (int64_t j = 0; j < D; j++) {
                double tw = 0, tb = 0;
                for (int64_t b = 0; b < nb; b++) tw += part[b * 2 * D + j], tb += part[b * 2 * D + D + j];
                params[j] = (float)tw;
                if (!rms) params[D + j] = (float)tb;
            }
        }
    }
    free(part);
}
