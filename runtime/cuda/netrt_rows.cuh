/* netrt_rows.cuh - the device functions of the per-row transformer kernels: softmax and
 * log-softmax along any axis, layer norm and RMS norm over the last axis, forward and backward.
 * Included by netrt_kernels.cuh (after its block reductions); runtime/rt_rows.c is the CPU's
 * version of each, with the same formulas in the same precision.
 *
 * One block of RT_K_BLOCK threads per row (rows grid-stride over the blocks): a row's threads
 * take columns t, t + 256, ...; each sums its columns in order in double, and rt_block_sum adds
 * the 256 partial sums by its fixed tree, so the row sums can differ from the CPU's (left to
 * right) in the last bits. The norms' parameter gradients are three kernels with the CPU's
 * order exactly: the row statistics (a block per row, by the data gradient's kernel when there is
 * one) into the partial-sum region, a partial sum per (fixed block of RT_K_NORM_ROWS =
 * RT_NORM_ROWS rows, column), then the blocks in order per column. No atomics anywhere.
 */
#ifndef NETRT_ROWS_CUH
#define NETRT_ROWS_CUH

// ---- softmax and log-softmax along the middle axis of [outer, n, inner] (inner = 1: the last)

/* Row r of the outer * inner rows: its first element; its n elements are `inner` apart. */
static __device__ __forceinline__ int64_t rt_axis_row(int64_t r, int64_t n, int64_t inner) {
    return (r / inner) * n * inner + r % inner;
}

static __device__ __forceinline__ void rt_k_softmax_axis_fwd(int64_t outer, int64_t n, int64_t inner, const float *x,
                                                             float *y) {
    RT_K_ROWS(r, outer * inner) {
        const float *in = x + rt_axis_row(r, n, inner);
        float *out = y + rt_axis_row(r, n, inner), m = -INFINITY;
        RT_K_COLS(j, n) m = fmaxf(m, in[j * inner]);
        m = rt_block_max(m);
        double s = 0;
        RT_K_COLS(j, n) s += out[j * inner] = expf(in[j * inner] - m);
        float inv = (float)(1.0 / rt_block_sum(s));
        RT_K_COLS(j, n) out[j * inner] *= inv;
    }
}

static __device__ __forceinline__ void rt_k_softmax_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *y,
                                                             const float *dy, float *dx) {
    RT_K_ROWS(r, outer * inner) {
        int64_t o = rt_axis_row(r, n, inner);
        const float *yr = y + o, *gr = dy + o;
        double dot = 0;
        RT_K_COLS(j, n) dot = __dadd_rn(dot, __dmul_rn((double)yr[j * inner], (double)gr[j * inner]));
        float d = (float)rt_block_sum(dot);
        RT_K_COLS(j, n) dx[o + j * inner] = yr[j * inner] * (gr[j * inner] - d);
    }
}

/* y = (x - m) - log(sum(exp(x - m))), as rt_log_softmax_fwd. */
static __device__ __forceinline__ void rt_k_log_softmax_fwd(int64_t outer, int64_t n, int64_t inner, const float *x,
                                                            float *y) {
    RT_K_ROWS(r, outer * inner) {
        int64_t o = rt_axis_row(r, n, inner);
        const float *in = x + o;
        float m = -INFINITY;
        RT_K_COLS(j, n) m = fmaxf(m, in[j * inner]);
        m = rt_block_max(m);
        double s = 0;
        RT_K_COLS(j, n) s += expf(in[j * inner] - m);
        float l = (float)log(rt_block_sum(s));
        RT_K_COLS(j, n) y[o + j * inner] = (in[j * inner] - m) - l;
    }
}

/* dx = dy - exp(y) * sum(dy), as rt_log_softmax_bwd. */
static __device__ __forceinline__ void rt_k_log_softmax_bwd(int64_t outer, int64_t n, int64_t inner, const float *y,
                                                            const float *dy, float *dx) {
    RT_K_ROWS(r, outer * inner) {
        int64_t o = rt_axis_row(r, n, inner);
        double s = 0;
        RT_K_COLS(j, n) s += dy[o + j * inner];
        float sf = (float)rt_block_sum(s);
        RT_K_COLS(j, n) dx[o + j * inner] = dy[o + j * inner] - __fmul_rn(expf(y[o + j * inner]), sf);
    }
}

// ---- layer norm (rms = 0) and RMS norm (rms = 1) over the last axis D of [rows, D]

/* A row's mean (0 for RMS norm) and 1/sqrt(var + eps), or 1/sqrt(mean(x^2) + eps), each rounded
 * once to float, as rt_rows.c's row_stats. Every thread of the block gets them. */
static __device__ __forceinline__ void rt_norm_row_stats(const float *x, int64_t D, int rms, double eps, float *mean,
                                                         float *rstd) {
    double m = 0, q = 0;
    if (!rms) {
        RT_K_COLS(j, D) m += x[j];
        m = rt_block_sum(m) / (double)D;
    }
    RT_K_COLS(j, D) {
        double d = x[j] - m;
        q = __dadd_rn(q, __dmul_rn(d, d));
    }
    q = rt_block_sum(q);
    *mean = (float)m;
    *rstd = (float)(1.0 / sqrt(q / (double)D + eps));
}

/* y = (x - mean) * rstd * w + b (layer norm; b may be NULL only for RMS norm), x * rstd * w. */
static __device__ __forceinline__ void rt_k_norm_fwd(int64_t rows, int64_t D, int rms, const float *x, const float *w,
                                                     const float *b, double eps, float *y) {
    RT_K_ROWS(r, rows) {
        const float *xr = x + r * D;
        float m, rs;
        rt_norm_row_stats(xr, D, rms, eps, &m, &rs);
        if (rms)
            RT_K_COLS(j, D) y[r * D + j] = __fmul_rn(__fmul_rn(xr[j], rs), w[j]);
        else
            RT_K_COLS(j, D) y[r * D + j] = __fadd_rn(__fmul_rn(__fmul_rn(xr[j] - m, rs), w[j]), b[j]);
    }
}

/* dx = rstd * ((g - mean(g)) - xhat * mean(g * xhat)), g = dy * w (no mean(g) for RMS norm),
 * as rt_norm_bwd; with `stats` (not NULL) each row's mean and rstd there too, as rt_k_norm_stats
 * writes them for the parameter gradients. */
static __device__ __forceinline__ void rt_k_norm_bwd(int64_t rows, int64_t D, int rms, const float *x, const float *w,
                                                     const float *dy, double eps, float *dx, float *stats) {
    RT_K_ROWS(r, rows) {
        const float *xr = x + r * D, *gr = dy + r * D;
        float m, rs;
        rt_norm_row_stats(xr, D, rms, eps, &m, &rs);
        if (stats && threadIdx.x == 0) stats[2 * r] = m, stats[2 * r + 1] = rs;
        double s1 = 0, s2 = 0;
        RT_K_COLS(j, D) {
            float g = __fmul_rn(gr[j], w[j]), xh = __fmul_rn(xr[j] - m, rs);
            s1 += g;
            s2 = __dadd_rn(s2, __dmul_rn((double)g, (double)xh));
        }
        s1 = rt_block_sum(s1);
        s2 = rt_block_sum(s2);
        float a = rms ? 0.0f : (float)(s1 / (double)D), c = (float)(s2 / (double)D);
        RT_K_COLS(j, D) {
            float g = __fmul_rn(gr[j], w[j]), xh = __fmul_rn(xr[j] - m, rs);
            dx[r * D + j] = __fmul_rn(rs, (g - a) - __fmul_rn(xh, c));
        }
    }
}

/* The parameter gradients, kernel 1: stats[2r], stats[2r + 1] = row r's mean and rstd. One
 * block per row. */
static __device__ __forceinline__ void rt_k_norm_stats(int64_t rows, int64_t D, int rms, const float *x, double eps,
                                                       float *stats) {
    RT_K_ROWS(r, rows) {
        float m, rs;
        rt_norm_row_stats(x + r * D, D, rms, eps, &m, &rs);
        if (threadIdx.x == 0) stats[2 * r] = m, stats[2 * r + 1] = rs;
    }
}

/* Kernel 2: part[b][0][j] = the sum of dy * xhat over block b's rows, part[b][1][j] = the sum
 * of dy, in row order. One thread per (block, column). */
static __device__ __forceinline__ void rt_k_norm_params_part(int64_t rows, int64_t D, const float *x, const float *dy,
                                                             const float *stats, double *part) {
    int64_t nb = (rows + RT_K_NORM_ROWS - 1) / RT_K_NORM_ROWS;
    RT_K_FOR(t, nb * D) {
        int64_t b = t / D, j = t % D, r1 = (b + 1) * RT_K_NORM_ROWS < rows ? (b + 1) * RT_K_NORM_ROWS : rows;
        double pw = 0, pb = 0;
        for (int64_t r = b * RT_K_NORM_ROWS; r < r1; r++) {
            float g = dy[r * D + j], xh = __fmul_rn(x[r * D + j] - stats[2 * r], stats[2 * r + 1]);
            pw = __dadd_rn(pw, __dmul_rn((double)g, (double)xh));
            pb += g;
        }
        part[b * 2 * D + j] = pw;
        part[b * 2 * D + D + j] = pb;
    }
}

/* Kernel 3: out[j] = the blocks' sums of dy * xhat in order, and for layer norm out[D + j] =
 * those of dy. One thread per column. */
static __device__ __forceinline__ void rt_k_norm_params_final(int64_t D, int64_t nb, int rms, const double *part,
                                                              float *out) {
    RT_K_FOR(j, D) {
        double tw = 0, tb = 0;
        for (int64_t b = 0; b < nb; b++) tw += part[b * 2 * D + j], tb += part[b * 2 * D + D + j];
        out[j] = (float)tw;
        if (!rms) out[D + j] = (float)tb;
    }
}

#endif
