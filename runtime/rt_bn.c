/* rt_bn.c - batch normalisation: the per-channel statistics of the forward pass, the backward
 * pass's per-channel sums, and the folding into a convolution for evaluation.
 *
 * x is row-major [N, C, HW], or channels-last: M = N * HW rows of C channels. Every sum is in
 * double and runs in a fixed order that does not depend on the number of threads: per channel
 * over n then the spatial positions (row-major), or over fixed blocks of RT_BN_BLOCK_ROWS rows
 * added in order (channels-last). The statistics take two passes, the mean and then the squared
 * deviations from it, so there is no cancellation.
 *
 * Synchronised batch norm (netc --sync-bn) runs the same passes on each rank's part of the
 * global batch and sums each pass over the ranks (rt_dist_sum) before using it, so the ranks
 * normalise with the statistics of the whole global batch, as one process at batch N * B does,
 * and their backward passes see the sums of the whole global batch (mean_sums).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_internal.h"

typedef enum { SUM_X, SUM_SQDEV, SUM_BWD } SumKind;

/* Channels-last: SUM_X: s0 = sum x; SUM_SQDEV: s0 = sum (x - mean)^2; SUM_BWD: s0 = sum dy,
 * s1 = sum dy * (x - mean) * invstd with (mean, invstd) = stats. Each block of rows is summed on
 * its own, then the blocks in order. */
static void rows_sums(SumKind kind, int64_t M, int64_t C, const float *x, const float *dy, const double *mean,
                      const float *stats, double *s0, double *s1) {
    int64_t nb = (M + RT_BN_BLOCK_ROWS - 1) / RT_BN_BLOCK_ROWS;
    double *part = rt_alloc((size_t)(nb * C * 2) * sizeof *part, "batch-norm sums");
    #pragma omp parallel for schedule(static) if (M * C >= 32768)
    for (int64_t b = 0; b < nb; b++) {
        double *p0 = part + b * C * 2, *p1 = p0 + C;
        for (int64_t c = 0; c < 2 * C; c++) p0[c] = 0;
        int64_t end = (b + 1) * RT_BN_BLOCK_ROWS < M ? (b + 1) * RT_BN_BLOCK_ROWS : M;
        for (int64_t r = b * RT_BN_BLOCK_ROWS; r < end; r++) {
            const float *xr = x + r * C;
            if (kind == SUM_X) {
                for (int64_t c = 0; c < C; c++) p0[c] += xr[c];
            } else if (kind == SUM_SQDEV) {
                for (int64_t c = 0; c < C; c++) p0[c] += ((double)xr[c] - mean[c]) * ((double)xr[c] - mean[c]);
            } else {
                const float *dr = dy + r * C;
                for (int64_t c = 0; c < C; c++) {
                    p0[c] += dr[c];
                    p1[c] += (double)dr[c] * ((xr[c] - stats[c]) * stats[C + c]);
                }
            }
        }
    }
    for (int64_t c = 0; c < C; c++) s0[c] = 0, s1[c] = 0;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t c = 0; c < C; c++) s0[c] += part[b * C * 2 + c], s1[c] += part[b * C * 2 + C + c];
    free(part);
}

/* The same sums of row-major x [N, C, HW]: per channel, over n and then the positions. */
static void plane_sums(SumKind kind, int64_t N, int64_t C, int64_t HW, const float *x, const float *dy,
                       const double *mean, const float *stats, double *s0, double *s1) {
    #pragma omp parallel for if (N * C * HW >= 32768)
    for (int64_t c = 0; c < C; c++) {
        double a = 0, b = 0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = x + (n * C + c) * HW;
            if (kind == SUM_X) {
                for (int64_t k = 0; k < HW; k++) a += p[k];
            } else if (kind == SUM_SQDEV) {
                for (int64_t k = 0; k < HW; k++) a += ((double)p[k] - mean[c]) * ((double)p[k] - mean[c]);
            } else {
                const float *d = dy + (n * C + c) * HW, m = stats[c], invstd = stats[C + c];
                for (int64_t k = 0; k < HW; k++) {
                    a += d[k];
                    b += (double)d[k] * ((p[k] - m) * invstd);
                }
            }
        }
        s0[c] = a, s1[c] = b;
    }
}

static void channel_sums(SumKind kind, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x, const float *dy,
                         const double *mean, const float *stats, double *s0, double *s1) {
    if (nhwc) rows_sums(kind, N * HW, C, x, dy, mean, stats, s0, s1);
    else plane_sums(kind, N, C, HW, x, dy, mean, stats, s0, s1);
}

/* Training statistics over this rank's x, the sums of each pass added over the ranks of d
 * (NULL: this process alone): stats = (mean, 1/sqrt(biased var + eps)); the running statistics
 * move toward the mean and the unbiased variance of all M * ranks elements per channel. */
static void train_stats(RtDist *d, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x, float *stats,
                        double eps, double momentum, float *running) {
    double *mean = rt_alloc((size_t)C * 3 * sizeof *mean, "batch-norm sums"), *sq = mean + C, *unused = sq + C;
    double M = (double)(N * HW) * (d ? d->ranks : 1);
    channel_sums(SUM_X, nhwc, N, C, HW, x, NULL, NULL, NULL, mean, unused);
    if (d) rt_dist_sum(d, mean, (int)C, "summing batch-norm statistics");
    for (int64_t c = 0; c < C; c++) mean[c] /= M;
    channel_sums(SUM_SQDEV, nhwc, N, C, HW, x, NULL, mean, NULL, sq, unused);
    if (d) rt_dist_sum(d, sq, (int)C, "summing batch-norm statistics");
    float *rmean = running, *rvar = running + C;
    for (int64_t c = 0; c < C; c++) {
        double var = sq[c] / M, unbiased = M > 1 ? sq[c] / (M - 1) : var;
        stats[c] = (float)mean[c];
        stats[C + c] = (float)(1.0 / sqrt(var + eps));
        rmean[c] = (float)((1 - momentum) * rmean[c] + momentum * mean[c]);
        rvar[c] = (float)((1 - momentum) * rvar[c] + momentum * unbiased);
    }
    running[2 * C] += 1; /* num_batches_tracked */
    free(mean);
}

void rt_bn_stats(int64_t N, int64_t C, int64_t HW, const float *x, float *stats, double eps,
                 double momentum, float *running, int training) {
    if (training) {
        train_stats(NULL, 0, N, C, HW, x, stats, eps, momentum, running);
        return;
    }
    const float *rmean = running, *rvar = running + C;
    for (int64_t c = 0; c < C; c++) {
        stats[c] = rmean[c];
        stats[C + c] = (float)(1.0 / sqrt((double)rvar[c] + eps));
    }
}

void rt_bn_stats_nhwc(int64_t M, int64_t C, const float *x, float *stats, double eps, double momentum,
                      float *running, int training) {
    if (training) train_stats(NULL, 1, M, C, 1, x, stats, eps, momentum, running);
    else rt_bn_stats(1, C, 1, x, stats, eps, momentum, running, 0); /* x is not read: layout plays no part */
}

void rt_bn_stats_sync(RtCtx *ctx, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x, float *stats,
                      double eps, double momentum, float *running) {
    train_stats(ctx->dist, nhwc, N, C, HW, x, stats, eps, momentum, running);
}

/* s [2, C] averaged over the ranks of d (NULL: this process alone), into sums. Each rank's dy is
 * the gradient of its own mean loss, ranks times that of the global batch's mean loss, so the
 * mean over the ranks is the sum over the global batch: dx = weight * invstd * (dy - (s0 + xhat *
 * s1) / M) with this rank's count M is the global batch's dx, ranks times over, as every other
 * gradient of the rank; and the weight and bias gradients, s1 and s0, are equal on every rank,
 * which the mean of the gradients over the ranks leaves as they are. */
static void mean_sums(RtDist *d, double *s, int64_t C, float *sums) {
    if (d && d->ranks > 1) {
        rt_dist_sum(d, s, (int)(2 * C), "summing batch-norm gradients");
        for (int64_t c = 0; c < 2 * C; c++) s[c] /= d->ranks;
    }
    for (int64_t c = 0; c < 2 * C; c++) sums[c] = (float)s[c];
}

static void bwd_sums(RtDist *d, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x, const float *stats,
                     const float *dy, float *sums) {
    double *s = rt_alloc((size_t)C * 2 * sizeof *s, "batch-norm sums");
    channel_sums(SUM_BWD, nhwc, N, C, HW, x, dy, NULL, stats, s, s + C);
    mean_sums(d, s, C, sums);
    free(s);
}

void rt_bn_bwd_sums(int64_t N, int64_t C, int64_t HW, const float *x, const float *stats, const float *dy,
                    float *sums) {
    bwd_sums(NULL, 0, N, C, HW, x, stats, dy, sums);
}

void rt_bn_bwd_sums_nhwc(int64_t M, int64_t C, const float *x, const float *stats, const float *dy,
                         float *sums) {
    bwd_sums(NULL, 1, M, C, 1, x, stats, dy, sums);
}

void rt_bn_bwd_sums_sync(RtCtx *ctx, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x,
                         const float *stats, const float *dy, float *sums) {
    bwd_sums(ctx->dist, nhwc, N, C, HW, x, stats, dy, sums);
}

void rt_bn_sums_sync(RtCtx *ctx, double *s, int64_t C, float *sums) {
    mean_sums(ctx->dist, s, C, sums);
}

void rt_bn_fold(int64_t K, int64_t per_k, const float *w, const float *stats, const float *weight,
                const float *bias, float *w_out, float *b_out) {
    for (int64_t k = 0; k < K; k++) {
        float scale = weight[k] * stats[K + k];
        for (int64_t j = 0; j < per_k; j++) w_out[k * per_k + j] = w[k * per_k + j] * scale;
        b_out[k] = bias[k] - stats[k] * scale;
    }
}
