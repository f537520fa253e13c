/* rt_kernels.c - the library kernels generated steps call: matrix products, convolutions,
 * pooling, softmax, cross-entropy and accuracy. float32 throughout,
 * logical NCHW layouts.
 *
 * Convolutions are im2col + SGEMM per sample and group, parallel over the batch with OpenMP.
 * Each thread works in its own slice of the caller's scratch (rt_conv2d_scratch floats): the
 * column matrix of one sample-group [C/g*R*S, P*Q], then a private weight-gradient accumulator
 * [K, C/g*R*S] that bwd_filter sums across threads at the end. Inside the parallel region the
 * OpenMP builds of OpenBLAS and oneDNN run single-threaded, so the threads do not oversubscribe
 * the cores. Matrix products (rt_gemm) go to oneDNN's sgemm when large, else to OpenBLAS
 * (rt_gemm.c chooses).
 */
#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* Products of at least this many multiply-adds go to oneDNN's sgemm, the others to OpenBLAS
 * (with AVX2 but not AVX-512, all to oneDNN: rt_gemm.c): on a 2-core AVX-512 EPYC oneDNN's
 * reaches 215-230 GFLOP/s on GPT-2's products where OpenBLAS 0.3.21 reaches 175-200 (a GPT-2
 * step 13 % faster), while on small ones (a thread's rows of the MLP's, 3M multiply-adds) its
 * call costs more than it saves. Either way the products are
 * float32 sums in an order fixed by the library and the thread count. */
enum { GEMM_DNNL_MIN = 1 << 22 };

void rt_gemm_onednn(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (rt_gemm_route() == RT_GEMM_REFERENCE) {
        rt_gemm_reference(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                                  ldc);
    if (st != dnnl_success) {
        fprintf(stderr, "error: oneDNN's sgemm failed (status %d) on a %lld x %lld x %lld product\n", (int)st,
                (long long)M, (long long)N, (long long)K);
        exit(1);
    }
}

void rt_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
             int64_t ldc) {
    RtGemmRoute route = rt_gemm_route();
    if (route == RT_GEMM_REFERENCE || route == RT_GEMM_ONEDNN || M * N * K >= GEMM_DNNL_MIN) {
        rt_gemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, alpha, A,
                (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* ---- convolution */

/* The output columns q whose input column q*stride - pad + s*dil lies inside [0, W): [*lo, *hi). */
static void valid_cols(const RtConv *c, int64_t s, int64_t *lo, int64_t *hi) {
    int64_t off = s * c->dil_w - c->pad_w; /* w = q*stride + off */
    *lo = off >= 0 ? 0 : (-off + c->stride_w - 1) / c->stride_w;
    *hi = c->W - off <= 0 ? 0 : (c->W - off + c->stride_w - 1) / c->stride_w;
    if (*hi > c->Q) *hi = c->Q;
    if (*lo > *hi) *lo = *hi;
}

/* col[(c*R + r)*S + s][p*Q + q] = x[c][p*sh - ph + r*dh][q*sw - pw + s*dw], 0 outside. The
 * in-bounds columns of each row are found once, so the inner loop has no bounds checks (and is
 * a memcpy at stride 1). */
static void im2col(const RtConv *c, const float *x, float *col) {
    int64_t cg = c->C / c->groups;
    for (int64_t ch = 0; ch < cg; ch++)
        for (int64_t r = 0; r < c->R; r++)
            for (int64_t s = 0; s < c->S; s++) {
                float *row = col + ((ch * c->R + r) * c->S + s) * c->P * c->Q;
                int64_t lo, hi, off = s * c->dil_w - c->pad_w;
                valid_cols(c, s, &lo, &hi);
                for (int64_t p = 0; p < c->P; p++) {
                    int64_t h = p * c->stride_h - c->pad_h + r * c->dil_h;
                    float *out = row + p * c->Q;
                    if (h < 0 || h >= c->H) {
                        for (int64_t q = 0; q < c->Q; q++) out[q] = 0.0f;
                        continue;
                    }
                    const float *in = x + (ch * c->H + h) * c->W + off;
                    /* rows are short (tens of floats): plain loops beat memcpy/memset calls */
                    for (int64_t q = 0; q < lo; q++) out[q] = 0.0f;
                    if (c->stride_w == 1)
                        for (int64_t q = lo; q < hi; q++) out[q] = in[q];
                    else
                        for (int64_t q = lo; q < hi; q++) out[q] = in[q * c->stride_w];
                    for (int64_t q = hi; q < c->Q; q++) out[q] = 0.0f;
                }
            }
}

/* The adjoint of im2col: dx += scatter(col). */
static void col2im(const RtConv *c, const float *col, float *dx) {
    int64_t cg = c->C / c->groups;
    for (int64_t ch = 0; ch < cg; ch++)
        for (int64_t r = 0; r < c->R; r++)
            for (int64_t s = 0; s < c->S; s++) {
                const float *row = col + ((ch * c->R + r) * c->S + s) * c->P * c->Q;
                int64_t lo, hi, off = s * c->dil_w - c->pad_w;
                valid_cols(c, s, &lo, &hi);
                for (int64_t p = 0; p < c->P; p++) {
                    int64_t h = p * c->stride_h - c->pad_h + r * c->dil_h;
                    if (h < 0 || h >= c->H) continue;
                    float *out = dx + (ch * c->H + h) * c->W + off;
                    const float *in = row + p * c->Q;
                    for (int64_t q = lo; q < hi; q++) out[q * c->stride_w] += in[q];
                }
            }
}

/* Sizes shared by the three kernels. */
typedef struct {
    int64_t cg, kg, crs, pq, x_group, y_group, w_group;
} ConvDims;

static ConvDims conv_dims(const RtConv *c) {
    ConvDims d;
    d.cg = c->C / c->groups;
    d.kg = c->K / c->groups;
    d.crs = d.cg * c->R * c->S;
    d.pq = c->P * c->Q;
    d.x_group = d.cg * c->H * c->W;
    d.y_group = d.kg * d.pq;
    d.w_group = d.kg * d.crs;
    return d;
}

void rt_conv2d_fwd(const RtConv *c, const float *x, const float *w, float *y, float *scratch,
                   int64_t scratch_per_thread) {
    ConvDims d = conv_dims(c);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < c->N; n++) {
        float *col = scratch + omp_get_thread_num() * scratch_per_thread;
        for (int g = 0; g < c->groups; g++) {
            im2col(c, x + (n * c->groups + g) * d.x_group, col);
            rt_gemm(0, 0, d.kg, d.pq, d.crs, 1.0f, w + g * d.w_group, d.crs, col, d.pq, 0.0f,
                    y + (n * c->groups + g) * d.y_group, d.pq);
        }
    }
}

void rt_conv2d_bwd_data(const RtConv *c, const float *dy, const float *w, float *dx,
                        float *scratch, int64_t scratch_per_thread) {
    ConvDims d = conv_dims(c);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < c->N; n++) {
        float *col = scratch + omp_get_thread_num() * scratch_per_thread;
        memset(dx + n * c->C * c->H * c->W, 0, (size_t)(c->C * c->H * c->W) * sizeof *dx);
        for (int g = 0; g < c->groups; g++) {
            /* col [crs, pq] = w_g^T [crs, kg] @ dy_g [kg, pq] */
            rt_gemm(1, 0, d.crs, d.pq, d.kg, 1.0f, w + g * d.w_group, d.crs,
                    dy + (n * c->groups + g) * d.y_group, d.pq, 0.0f, col, d.pq);
            col2im(c, col, dx + (n * c->groups + g) * d.x_group);
        }
    }
}

void rt_conv2d_bwd_filter(const RtConv *c, const float *x, const float *dy, float *dw,
                          float *scratch, int64_t scratch_per_thread) {
    ConvDims d = conv_dims(c);
    int64_t wsize = c->K * d.crs, col_size = d.crs * d.pq;
    int threads = 1;
    #pragma omp parallel
    {
        #pragma omp single
        threads = omp_get_num_threads();
        float *col = scratch + omp_get_thread_num() * scratch_per_thread, *acc = col + col_size;
        memset(acc, 0, (size_t)wsize * sizeof *acc);
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < c->N; n++)
            for (int g = 0; g < c->groups; g++) {
                im2col(c, x + (n * c->groups + g) * d.x_group, col);
                /* acc_g [kg, crs] += dy_g [kg, pq] @ col^T [pq, crs] */
                rt_gemm(0, 1, d.kg, d.crs, d.pq, 1.0f, dy + (n * c->groups + g) * d.y_group, d.pq,
                        col, d.pq, 1.0f, acc + g * d.w_group, d.crs);
            }
    }
    /* sum the per-thread accumulators in a fixed order, so results do not depend on timing */
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < wsize; i++) {
        float s = 0;
        for (int t = 0; t < threads; t++) s += scratch[t * scratch_per_thread + col_size + i];
        dw[i] = s;
    }
}

/* ---- pooling */

/* Offset in one [H, W] plane of the first maximum of window (i, j); -1 if the window lies
 * wholly in the padding. Without padding every window is inside the plane (P and Q come from
 * the floor formula), so the bounds checks drop out. */
static int64_t window_argmax(const RtPool *p, const float *in, int64_t i, int64_t j) {
    int64_t h0 = i * p->stride_h - p->pad_h, w0 = j * p->stride_w - p->pad_w, at = -1;
    float m = -INFINITY;
    if (p->kh == 2 && p->kw == 2 && p->pad_h == 0 && p->pad_w == 0) { /* the common 2x2 window */
        int64_t a = h0 * p->W + w0, b = a + 1, c = a + p->W, d = c + 1;
        int64_t ab = in[b] > in[a] ? b : a, cd = in[d] > in[c] ? d : c;
        return in[cd] > in[ab] ? cd : ab;
    }
    if (p->pad_h == 0 && p->pad_w == 0) {
        at = h0 * p->W + w0;
        m = in[at];
        for (int r = 0; r < p->kh; r++)
            for (int s = 0; s < p->kw; s++) {
                int64_t k = (h0 + r) * p->W + w0 + s;
                if (in[k] > m) m = in[k], at = k;
            }
        return at;
    }
    for (int r = 0; r < p->kh; r++) {
        int64_t h = h0 + r;
        if (h < 0 || h >= p->H) continue;
        for (int s = 0; s < p->kw; s++) {
            int64_t w = w0 + s;
            if (w >= 0 && w < p->W && (at < 0 || in[h * p->W + w] > m)) m = in[h * p->W + w], at = h * p->W + w;
        }
    }
    return at;
}

void rt_maxpool2d_fwd(const RtPool *p, const float *x, float *y) {
    #pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < p->N * p->C; nc++) {
        const float *in = x + nc * p->H * p->W;
        float *out = y + nc * p->P * p->Q;
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) {
                int64_t at = window_argmax(p, in, i, j);
                out[i * p->Q + j] = at < 0 ? -INFINITY : in[at];
            }
    }
}

void rt_maxpool2d_bwd(const RtPool *p, const float *x, const float *dy, float *dx) {
    #pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < p->N * p->C; nc++) {
        const float *in = x + nc * p->H * p->W, *g = dy + nc * p->P * p->Q;
        float *out = dx + nc * p->H * p->W;
        memset(out, 0, (size_t)(p->H * p->W) * sizeof *out);
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) { /* the first maximum, as the forward pass */
                int64_t at = window_argmax(p, in, i, j);
                if (at >= 0) out[at] += g[i * p->Q + j];
            }
    }
}

void rt_avgpool2d_fwd(const RtPool *p, const float *x, float *y) {
    float scale = 1.0f / (float)(p->kh * p->kw); /* padding counts, as PyTorch's default */
    #pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < p->N * p->C; nc++) {
        const float *in = x + nc * p->H * p->W;
        float *out = y + nc * p->P * p->Q;
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) {
                float s = 0;
                for (int r = 0; r < p->kh; r++) {
                    int64_t h = i * p->stride_h - p->pad_h + r;
                    if (h < 0 || h >= p->H) continue;
                    for (int t = 0; t < p->kw; t++) {
                        int64_t w = j * p->stride_w - p->pad_w + t;
                        if (w >= 0 && w < p->W) s += in[h * p->W + w];
                    }
                }
                out[i * p->Q + j] = s * scale;
            }
    }
}

void rt_avgpool2d_bwd(const RtPool *p, const float *dy, float *dx) {
    float scale = 1.0f / (float)(p->kh * p->kw);
    #pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < p->N * p->C; nc++) {
        const float *g = dy + nc * p->P * p->Q;
        float *out = dx + nc * p->H * p->W;
        memset(out, 0, (size_t)(p->H * p->W) * sizeof *out);
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++)
                for (int r = 0; r < p->kh; r++) {
                    int64_t h = i * p->stride_h - p->pad_h + r;
                    if (h < 0 || h >= p->H) continue;
                    for (int t = 0; t < p->kw; t++) {
                        int64_t w = j * p->stride_w - p->pad_w + t;
                        if (w >= 0 && w < p->W) out[h * p->W + w] += g[i * p->Q + j] * scale;
                    }
                }
    }
}

/* ---- softmax, cross-entropy, accuracy */

void rt_softmax_fwd(int64_t rows, int64_t cols, const float *x, float *y) {
    #pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *in = x + r * cols;
        float *out = y + r * cols, m = -INFINITY;
        for (int64_t j = 0; j < cols; j++) m = fmaxf(m, in[j]);
        double s = 0;
        for (int64_t j = 0; j < cols; j++) s += out[j] = expf(in[j] - m);
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < cols; j++) out[j] *= inv;
    }
}

void rt_softmax_bwd(int64_t rows, int64_t cols, const float *y, const float *dy, float *dx) {
    #pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *gr = dy + r * cols;
        double dot = 0;
        for (int64_t j = 0; j < cols; j++) dot += (double)yr[j] * gr[j];
        for (int64_t j = 0; j < cols; j++) dx[r * cols + j] = yr[j] * (gr[j] - (float)dot);
    }
}

/* Labels of the rows that count: in [0, cols), or the ignore index when there is one. */
static void check_labels(int64_t rows, int64_t cols, const int64_t *label, const int64_t *ignore) {
    for (int64_t r = 0; r < rows; r++) {
        if ((label[r] >= 0 && label[r] < cols) || (ignore && label[r] == *ignore)) continue;
        if (ignore)
            fprintf(stderr, "error: label %lld in row %lld of the batch is outside [0, %lld) and is not the "
                            "ignore_index %lld\n", (long long)label[r], (long long)r, (long long)cols, (long long)*ignore);
        else
            fprintf(stderr, "error: label %lld in row %lld of the batch is outside [0, %lld)\n", (long long)label[r],
                    (long long)r, (long long)cols);
        fprintf(stderr, "  hint: the model's logits have %lld classes; check the label file\n", (long long)cols);
        exit(1);
    }
}

/* The lanes of a row's sum of exp(x - m): part[l] += e^(x[l] - m), for l < n. */
static inline void lanes_exp_add(double *restrict part, const float *restrict x, float m, int64_t n) {
#pragma omp simd
    for (int64_t l = 0; l < n; l++) part[l] += rt_expf_nonpos(x[l] - m);
}

/* log(sum(exp(x))) of one row, stable. The maximum is exact in any order, so the compiler may
 * take it in vector lanes; each exp(x - m) is rt_expf's (x - m rounded to float, as PyTorch's
 * float32 logsumexp takes it), summed in double in lanes (rt_internal.h). */
static double logsumexp(const float *x, int64_t cols) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < cols; j++) m = x[j] > m ? x[j] : m;
    double part[RT_LANES] = {0};
    const int64_t full = rt_lanes_full(cols);
    for (int64_t j0 = 0; j0 < full; j0 += RT_LANES) lanes_exp_add(part, x + j0, m, RT_LANES);
    lanes_exp_add(part, x + full, m, cols - full);
    return m + log(rt_lanes_total(part));
}

/* The mean of a row, summed in double in order (label smoothing's uniform part). */
static double row_mean(const float *x, int64_t cols) {
    double s = 0;
    for (int64_t j = 0; j < cols; j++) s += x[j];
    return s / (double)cols;
}

/* Cross-entropy of rows, and its gradient, with an optional ignore index (NULL: none). */
static void xent_fwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                     const int64_t *ignore, int64_t n_valid, float *loss) {
    check_labels(rows < n_valid ? rows : n_valid, cols, label, ignore);
    /* each row on one thread, in the same order of operations: the same bits for any count */
#pragma omp parallel for schedule(static) if (rows * cols >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        if (r >= n_valid || (ignore && label[r] == *ignore)) {
            loss[r] = 0;
            continue;
        }
        const float *x = logits + r * cols;
        double mean = smoothing != 0 ? row_mean(x, cols) : 0;
        loss[r] = (float)(logsumexp(x, cols) - (1.0 - smoothing) * x[label[r]] - smoothing * mean);
    }
}

/* The gradient needs each row's log-sum-exp. xent_fwd's loss holds it: loss = lse - (1 - s)
 * x[label] - s mean(x), so lse = loss + (1 - s) x[label] + s mean(x), with no exp and no pass
 * for the maximum. The loss is a float: this lse is within half an ulp of the loss of the
 * exact one, as near as a float lse saved by the forward pass would be. Rows at or after n_valid
 * have loss 0 and recompute theirs. dlogits may be logits itself: each row's lse is taken before
 * the row is written, and each element is read before it is written. */
static void xent_bwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                     const int64_t *ignore, int64_t n_valid, const float *loss, const float *dloss, float *dlogits) {
    double off = (double)smoothing / (double)cols; /* the smoothed target of every class */
    check_labels(rows, cols, label, ignore);
#pragma omp parallel for schedule(static) if (rows * cols >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * cols;
        float *d = dlogits + r * cols;
        if (ignore && label[r] == *ignore) { /* no contribution: the row's gradient is 0 */
            memset(d, 0, (size_t)cols * sizeof *d);
            continue;
        }
        const int64_t hit = label[r];
        double lse = r < n_valid ? (double)loss[r] + (1.0 - smoothing) * x[hit] +
                                       (smoothing != 0 ? smoothing * row_mean(x, cols) : 0)
                                 : logsumexp(x, cols);
        /* one pass over the row, each element written once; the probability is rt_expf's of
         * x - lse rounded to float (a vector loop; PyTorch's float32 softmax rounds it too) */
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) {
            double target = off + (j == hit ? 1.0 - smoothing : 0.0);
            d[j] = (float)(dloss[r] * ((double)rt_expf_nonpos((float)((double)x[j] - lse)) - target));
        }
    }
}

void rt_xent_fwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                 int64_t n_valid, float *loss) {
    xent_fwd(rows, cols, logits, label, smoothing, NULL, n_valid, loss);
}

void rt_xent_bwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                 int64_t n_valid, const float *loss, const float *dloss, float *dlogits) {
    xent_bwd(rows, cols, logits, label, smoothing, NULL, n_valid, loss, dloss, dlogits);
}

void rt_xent_ignore_fwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                        int64_t ignore, int64_t n_valid, float *loss) {
    xent_fwd(rows, cols, logits, label, smoothing, &ignore, n_valid, loss);
}

void rt_xent_ignore_bwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                        int64_t ignore, int64_t n_valid, const float *loss, const float *dloss, float *dlogits) {
    xent_bwd(rows, cols, logits, label, smoothing, &ignore, n_valid, loss, dloss, dlogits);
}

float rt_accuracy_ignore(int64_t rows, int64_t cols, const float *logits, const int64_t *label, int64_t ignore,
                         int64_t n_valid) {
    int64_t correct = 0;
    for (int64_t r = 0; r < rows && r < n_valid; r++) {
        if (label[r] == ignore) continue;
        const float *x = logits + r * cols;
        int64_t best = 0;
        for (int64_t j = 1; j < cols; j++)
            if (x[j] > x[best]) best = j;
        correct += best == label[r];
    }
    return (float)correct;
}

/* Top-k: a row is right when its label's logit is not NaN and fewer than top_k logits rank
 * above it, a logit ranking above when it is larger, or equal and earlier (argmax's first on
 * ties, so that top_k = 1 is the argmax's count on rows without NaN). */
float rt_accuracy_top(int64_t rows, int64_t cols, const float *logits, const int64_t *label, int64_t ignore,
                      int64_t top_k, int64_t n_valid) {
    int64_t correct = 0;
    for (int64_t r = 0; r < rows && r < n_valid; r++) {
        const int64_t l = label[r];
        if (l == ignore || l < 0 || l >= cols) continue;
        const float *x = logits + r * cols, xl = x[l];
        if (xl != xl) continue;
        int64_t above = 0;
        for (int64_t j = 0; j < cols; j++) above += x[j] > xl || (x[j] == xl && j < l);
        correct += above < top_k;
    }
    return (float)correct;
}

float rt_accuracy(int64_t rows, int64_t cols, const float *logits, const int64_t *label,
                  int64_t n_valid) {
    return rt_accuracy_ignore(rows, cols, logits, label, INT64_MIN, n_valid); /* no label is INT64_MIN */
}
