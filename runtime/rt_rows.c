/* rt_rows.c - per-row kernels of the transformer layers: softmax and log-softmax along any axis,
 * layer norm and RMS norm over the last axis, forward and backward (declared in netrt.h).
 *
 * Every kernel is deterministic and independent of the number of threads: OpenMP splits only
 * independent outputs (rows, or columns of the parameter gradients), and every sum runs in a
 * fixed order in double (the norms' row sums in RT_LANES lanes, rt_internal.h).
 * runtime/cuda/netrt_rows.cuh computes the same formulas; its row sums add per-thread partial
 * sums by a fixed tree, so they can differ from these in the last bits,
 * while the parameter gradients' sums (fixed blocks of RT_ROWS_BLOCK rows, then the blocks in
 * order) are the same on both.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

/* sum of x[j] (m = NULL) or of (x[j] - *m)^2 */
static double row_sum(const float *x, int64_t D, const double *m) {
    double part[RT_LANES] = {0};
    for (int64_t j0 = 0; j0 < D; j0 += RT_LANES) {
        const int64_t n = rt_lanes_at(j0, D);
        if (!m) {
#pragma omp simd
            for (int64_t l = 0; l < n; l++) part[l] += x[j0 + l];
        } else {
#pragma omp simd
            for (int64_t l = 0; l < n; l++) {
                const double d = x[j0 + l] - *m;
                part[l] += d * d;
            }
        }
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

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd; RMS
 * norm has no mean: dx = rstd * (g - xhat * mean(g * xhat)), xhat = x * rstd. */
void rt_norm_bwd(int64_t rows, int64_t D, int rms, const float *x, const float *w, const float *dy, double eps,
                 float *dx) {
    #pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *gr = dy + r * D;
        float m, rs;
        row_stats(xr, D, rms, eps, &m, &rs);
        double p1[RT_LANES] = {0}, p2[RT_LANES] = {0}; /* sums of g and g * xh, in lanes */
        for (int64_t j0 = 0; j0 < D; j0 += RT_LANES) {
            const int64_t n = rt_lanes_at(j0, D);
#pragma omp simd
            for (int64_t l = 0; l < n; l++) {
                float g = gr[j0 + l] * w[j0 + l], xh = (xr[j0 + l] - m) * rs;
                p1[l] += g;
                p2[l] += (double)g * xh;
            }
        }
        float a = rms ? 0.0f : (float)(rt_lanes_total(p1) / (double)D), c = (float)(rt_lanes_total(p2) / (double)D);
        for (int64_t j = 0; j < D; j++) {
            float g = gr[j] * w[j], xh = (xr[j] - m) * rs;
            dx[r * D + j] = rs * ((g - a) - xh * c);
        }
    }
}

/* out[j] = sum over rows of dy * xhat (the weight's gradient) and, for layer norm, out[D + j] =
 * sum of dy (the bias's): over fixed blocks of RT_ROWS_BLOCK rows, each summed in double, then
 * the blocks in order, as the device's partial and final sums. A thread takes a strip of
 * NORM_COLS columns and walks the rows in order, reading each row's strip contiguously. */
enum { NORM_COLS = 64 };
void rt_norm_bwd_params(int64_t rows, int64_t D, int rms, const float *x, const float *dy, double eps, float *out) {
    float *stats = malloc((size_t)(2 * rows) * sizeof *stats);
    if (!stats) {
        fprintf(stderr, "error: out of memory in a %s parameter gradient (%lld rows)\n", rms ? "rmsnorm" : "layernorm",
                (long long)rows);
        exit(1);
    }
    #pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t r = 0; r < rows; r++) row_stats(x + r * D, D, rms, eps, &stats[2 * r], &stats[2 * r + 1]);
    int64_t strips = (D + NORM_COLS - 1) / NORM_COLS;
    #pragma omp parallel for schedule(static) if (rows * D > 32768)
    for (int64_t s = 0; s < strips; s++) {
        int64_t j0 = s * NORM_COLS, nj = D - j0 < NORM_COLS ? D - j0 : NORM_COLS;
        double tw[NORM_COLS] = {0}, tb[NORM_COLS] = {0};
        for (int64_t b0 = 0; b0 < rows; b0 += RT_ROWS_BLOCK) {
            int64_t b1 = b0 + RT_ROWS_BLOCK < rows ? b0 + RT_ROWS_BLOCK : rows;
            double pw[NORM_COLS] = {0}, pb[NORM_COLS] = {0};
            for (int64_t r = b0; r < b1; r++) {
                const float *xr = x + r * D + j0, *gr = dy + r * D + j0;
                float m = stats[2 * r], rs = stats[2 * r + 1];
                for (int64_t j = 0; j < nj; j++) {
                    float xh = (xr[j] - m) * rs;
                    pw[j] += (double)gr[j] * xh;
                    pb[j] += gr[j];
                }
            }
            for (int64_t j = 0; j < nj; j++) tw[j] += pw[j], tb[j] += pb[j];
        }
        for (int64_t j = 0; j < nj; j++) {
            out[j0 + j] = (float)tw[j];
            if (!rms) out[D + j0 + j] = (float)tb[j];
        }
    }
    free(stats);
}
