/* rt_index.c - the kernels of indices and sequences: embedding rows (gather) and their
 * gradient (a scatter-add), and the cross-entropy of [..., C] logits with an ignore index.
 *
 * Every kernel is deterministic and bit-reproducible whatever the number of threads: a thread
 * owns whole outputs (rows of the loss, rows of the table), and each output's additions happen
 * in one fixed order (the indices' order). No float atomics.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* ---- gather and its gradient */

void rt_gather_rows(int64_t n, int64_t num, int64_t dim, const float *table, const int64_t *idx, float *out,
               int64_t per_sample, const char *what) {
    for (int64_t t = 0; t < n; t++) { /* checked on one thread first: the message names the first bad one */
        if (idx[t] >= 0 && idx[t] < num) continue;
        fprintf(stderr, "error: index %lld at position %lld (sample %lld) of %s is outside [0, %lld)\n"
                        "  hint: the table has %lld rows; check the token ids of this input\n",
                (long long)idx[t], (long long)(t % per_sample), (long long)(t / per_sample), what, (long long)num,
                (long long)num);
        exit(1);
    }
#pragma omp parallel for schedule(static) if (n * dim >= 32768)
    for (int64_t t = 0; t < n; t++) memcpy(out + t * dim, table + idx[t] * dim, (size_t)dim * sizeof *out);
}

/* ---- the rows whose label counts */

static int64_t counted(int64_t rows, const int64_t *label, int64_t ignore) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += label[r] != ignore;
    return n;
}

void rt_row_order(int64_t rows, const int64_t *label, int64_t ignore, int64_t *order) {
    int64_t k = 0;
    for (int64_t r = 0; r < rows; r++)
        if (label[r] != ignore) order[k++] = r;
    for (int64_t r = 0; r < rows; r++)
        if (label[r] == ignore) order[k++] = r;
}

void rt_row_compact(int64_t rows, int64_t cols, const float *x, const int64_t *order, const int64_t *label,
                    int64_t ignore, float *out) {
    const int64_t n = counted(rows, label, ignore);
    /* in increasing i, whose source order[i] >= i (the counted rows come first, in order), so
     * over x itself no row is written before it is read; one thread, for the same reason */
    for (int64_t i = 0; i < n; i++)
        if (out != x || order[i] != i) memcpy(out + i * cols, x + order[i] * cols, (size_t)cols * sizeof *out);
#pragma omp parallel for schedule(static) if ((rows - n) * cols >= 32768)
    for (int64_t i = n; i < rows; i++) memset(out + i * cols, 0, (size_t)cols * sizeof *out);
}

void rt_gemm_rows(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float *C, int64_t ldc, const int64_t *label, int64_t ignore) {
    const int64_t n = counted(trans_a ? K : M, label, ignore);
    if (trans_a) {
        if (n) rt_gemm(1, trans_b, M, N, n, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
        else
            for (int64_t r = 0; r < M; r++) memset(C + r * ldc, 0, (size_t)N * sizeof *C);
        return;
    }
    if (n) rt_gemm(0, trans_b, n, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
    for (int64_t r = n; r < M; r++) memset(C + r * ldc, 0, (size_t)N * sizeof *C);
}

void rt_gather_rows_bwd(int64_t n, int64_t num, int64_t dim, const int64_t *idx, const float *dy, float *dtable) {
#pragma omp parallel if (n * dim >= 32768)
    {
        /* each thread owns the table rows [r0, r1) and adds dy's rows into them in index order */
        const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();
        const int64_t r0 = num * th / nt, r1 = num * (th + 1) / nt;
        memset(dtable + r0 * dim, 0, (size_t)((r1 - r0) * dim) * sizeof *dtable);
        for (int64_t t = 0; t < n; t++) {
            int64_t k = idx[t];
            if (k < r0 || k >= r1) continue;
            float *d = dtable + k * dim;
            const float *g = dy + t * dim;
            for (int64_t j = 0; j < dim; j++) d[j] += g[j];
        }
    }
}
