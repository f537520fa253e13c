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

#endif
