/* netrt_index.cuh - the device functions of indices and sequences (included by
 * netrt_kernels.cuh, after its block reductions): embedding rows and their gradient, and the
 * cross-entropy with an ignore index. They compute what runtime/rt_index.c computes.
 *
 * An index or label out of range cannot stop the trainer from the device: the gathered row is
 * NaN (and a label's loss NaN), so the host stops on the non-finite loss at its next check. The
 * trainer's loader refuses token ids outside [0, rows) of an input an embedding reads directly
 * before any step runs, so this concerns computed indices only.
 *
 * The gradient of a gather is a scatter-add with no atomics: one thread per column of the table
 * adds the rows of dy in index order, the order rt_gather_rows_bwd adds them in, so the device's
 * result is the CPU's, bit for bit.
 *
 * Launch shapes:
 *   grid-stride over n * dim   gather, the gradient's zeroing
 *   grid-stride over dim       the gradient's additions
 *   one block of 256 per row   cross-entropy with an ignore index
 */
#ifndef NETRT_INDEX_CUH
#define NETRT_INDEX_CUH

/* out[t][j] = table[idx[t]][j]; NaN for an index outside [0, num). */
static __device__ __forceinline__ void rt_k_gather(int64_t n, int64_t num, int64_t dim, const float *table,
                                                   const int64_t *idx, float *out) {
    RT_K_FOR(e, n * dim) {
        int64_t t = e / dim, j = e - t * dim, k = idx[t];
        out[e] = k >= 0 && k < num ? table[k * dim + j] : NAN;
    }
}

/* The gradient's first kernel: dtable = 0. */
static __device__ __forceinline__ void rt_k_gather_bwd_zero(int64_t num, int64_t dim, float *dtable) {
    RT_K_FOR(e, num * dim) dtable[e] = 0.0f;
}

/* The second: dtable[idx[t]][j] += dy[t][j] for t = 0, 1, ..., one thread per column j. */
static __device__ __forceinline__ void rt_k_gather_bwd_add(int64_t n, int64_t num, int64_t dim, const int64_t *idx,
                                                           const float *dy, float *dtable) {
    RT_K_FOR(j, dim) {
        for (int64_t t = 0; t < n; t++) {
            int64_t k = idx[t];
            if (k >= 0 && k < num) dtable[k * dim + j] += dy[t * dim + j];
        }
    }
}

/* rt_k_xent_fwd where a row whose label is `ignore` gives 0. One block per row. */
static __device__ __forceinline__ void rt_k_xent_ignore_fwd(int64_t rows, int64_t cols, const float *logits,
                                                            const int64_t *label, float smoothing, int64_t ignore,
                                                            int64_t n_valid, float *loss) {
    RT_K_ROWS(r, rows) {
        int64_t y = r < n_valid ? label[r] : ignore;
        if (y == ignore || y < 0 || y >= cols) { /* the same branch for the whole block */
            if (threadIdx.x == 0) loss[r] = y == ignore ? 0.0f : NAN;
            continue;
        }
        const float *x = logits + r * cols;
        double mean = 0;
        if (smoothing != 0) {
            RT_K_COLS(j, cols) mean += x[j];
            mean = rt_block_sum(mean) / (double)cols;
        }
        double lse = rt_row_logsumexp(x, cols);
        if (threadIdx.x == 0)
            loss[r] = (float)__dsub_rn(__dsub_rn(lse, __dmul_rn(1.0 - smoothing, (double)x[y])),
                                       __dmul_rn((double)smoothing, mean));
    }
}

/* rt_k_xent_bwd where a row whose label is `ignore` gets 0. One block per row. */
static __device__ __forceinline__ void rt_k_xent_ignore_bwd(int64_t rows, int64_t cols, const float *logits,
                                                            const int64_t *label, float smoothing, int64_t ignore,
                                                            const float *dloss, float *dlogits) {
    const double off = (double)smoothing / (double)cols; /* the smoothed target of every class */
    RT_K_ROWS(r, rows) {
        const float *x = logits + r * cols;
        float *d = dlogits + r * cols;
        int64_t y = label[r];
        if (y == ignore || y < 0 || y >= cols) {
            RT_K_COLS(j, cols) d[j] = y == ignore ? 0.0f : NAN;
            continue;
        }
        double lse = rt_row_logsumexp(x, cols);
        RT_K_COLS(j, cols) {
            double target = off + (j == y ? 1.0 - smoothing : 0.0);
            d[j] = (float)(dloss[r] * (exp((double)x[j] - lse) - target));
        }
    }
}

#endif
