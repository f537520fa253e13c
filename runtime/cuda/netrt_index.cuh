/* netrt_index.cuh - the device functions of indices and sequences (included by
 * netrt_kernels.cuh, after its block reductions): embedding rows and their gradient, and the
 * cross-entropy with an ignore index. They compute what runtime/rt_index.c computes.
 *
 * An index or label out of range cannot stop the trainer from the device: the gathered row is
 * NaN (and a label's loss NaN), so the host stops on the non-finite loss at its next check. The
 * trainer's loader refuses token ids outside [0, rows) of an input an embedding reads directly
 * before any step runs, so this concerns computed indices only.
 *
 * The gradient of a gather is a scatter-add with no atomics. The positions are sorted by the row
 * they index, stably, so that each row's positions stay in increasing order: a radix sort of 8
 * bits a pass (one pass for tables of up to 255 rows, two up to 65535, one more per 8 bits),
 * each pass three kernels: every chunk of 256 positions counts its digits, one block turns the
 * counts into each (digit, chunk)'s first place, and every chunk moves its positions there, a
 * position after those of its chunk with the same digit before it. Then the thread of (position,
 * column) that starts a row's run of positions adds that run's dy rows, in increasing position:
 * the order rt_gather_rows_bwd adds them in, so the device's result is the CPU's, bit for bit.
 * An index outside [0, num) sorts last, as row num, and adds to nothing. The sort's counts and
 * its two position buffers ([n] each, one pass's input and the next's output) lie in the
 * partial-sum region, in that order (codegen/cuda.c, emit_index).
 *
 * Launch shapes:
 *   grid-stride over n * dim        gather, the gradient's zeroing, the runs' additions
 *   one block of 256 per chunk      the sort's counts and moves (grid-stride over the chunks)
 *   one block of 256                the sort's first places
 *   one block of 256 per row        cross-entropy with an ignore index
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

/* The row that position p adds its dy row to: idx[p], or num (sorted last, added to nothing) for
 * an index outside [0, num). */
static __device__ __forceinline__ int64_t rt_gather_key(const int64_t *idx, int64_t num, int64_t p) {
    const int64_t k = idx[p];
    return k >= 0 && k < num ? k : num;
}

/* The digit of position p in the sort's pass that reads bits [shift, shift + 8) of its row. */
static __device__ __forceinline__ int rt_gather_digit(const int64_t *idx, int64_t num, int shift, int64_t p) {
    return (int)(rt_gather_key(idx, num, p) >> shift & 255);
}

/* Chunk c's positions in this pass's order: src[c * 256 + t], or c * 256 + t itself in the first
 * pass (src NULL); each thread its own (256 threads: RT_K_BLOCK). Puts every position's digit in
 * digit[] (-1 past n) and returns the thread's position. */
static __device__ __forceinline__ int64_t rt_gather_sort_load(int64_t n, int64_t num, int shift, const int64_t *idx,
                                                              const int64_t *src, int64_t c, int *digit) {
    const int64_t e = c * RT_K_BLOCK + threadIdx.x, p = e < n ? (src ? src[e] : e) : -1;
    __syncthreads(); /* the previous chunk's digits are used up */
    digit[threadIdx.x] = p >= 0 ? rt_gather_digit(idx, num, shift, p) : -1;
    __syncthreads();
    return p;
}

/* The sort's first kernel: how many of chunk c's positions have digit d, at count[d * chunks + c]
 * (digit-major, so that the next kernel's running sum gives each (digit, chunk) its first place).
 * Thread d counts digit d: as many digits as threads. */
static __device__ __forceinline__ void rt_k_gather_sort_count(int64_t n, int64_t num, int shift, const int64_t *idx,
                                                              const int64_t *src, int64_t *count) {
    __shared__ int digit[RT_K_BLOCK];
    const int64_t chunks = (n + RT_K_BLOCK - 1) / RT_K_BLOCK;
    RT_K_ROWS(c, chunks) { /* uniform across the block */
        rt_gather_sort_load(n, num, shift, idx, src, c, digit);
        int k = 0;
        for (int u = 0; u < RT_K_BLOCK; u++) k += digit[u] == (int)threadIdx.x;
        count[threadIdx.x * chunks + c] = k;
    }
}

/* The second, one block: count[0, m) replaced by its exclusive running sum. Thread t sums its
 * own span of m / 256 counts, thread 0 the spans' sums, then each thread its span again. */
static __device__ __forceinline__ void rt_k_gather_sort_scan(int64_t m, int64_t *count) {
    __shared__ int64_t span[RT_K_BLOCK];
    const int64_t per = (m + RT_K_BLOCK - 1) / RT_K_BLOCK, a = threadIdx.x * per, b = a + per < m ? a + per : m;
    int64_t s = 0;
    for (int64_t i = a; i < b; i++) s += count[i];
    span[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int64_t t = 0, run = 0; t < RT_K_BLOCK; t++) {
            const int64_t v = span[t];
            span[t] = run, run += v;
        }
    __syncthreads();
    s = span[threadIdx.x];
    for (int64_t i = a; i < b; i++) {
        const int64_t v = count[i];
        count[i] = s, s += v;
    }
}

/* The third: each of chunk c's positions to dst[first place of (its digit, c) + the chunk's
 * positions before it with its digit], so the order within a digit is the pass's input order. */
static __device__ __forceinline__ void rt_k_gather_sort_move(int64_t n, int64_t num, int shift, const int64_t *idx,
                                                             const int64_t *src, const int64_t *first, int64_t *dst) {
    __shared__ int digit[RT_K_BLOCK];
    const int64_t chunks = (n + RT_K_BLOCK - 1) / RT_K_BLOCK;
    RT_K_ROWS(c, chunks) {
        const int64_t p = rt_gather_sort_load(n, num, shift, idx, src, c, digit);
        if (p < 0) continue;
        const int d = digit[threadIdx.x];
        int64_t r = 0;
        for (int u = 0; u < (int)threadIdx.x; u++) r += digit[u] == d;
        dst[first[d * chunks + c] + r] = p;
    }
}

/* The last: dtable[k][j] = ((0 + dy[p1][j]) + dy[p2][j]) + ... over row k's positions p1 < p2 <
 * ..., one run of `order` (the sorted positions), added by the thread of (the run's first place,
 * column j). The rows no position reads keep the zeroing's 0. */
static __device__ __forceinline__ void rt_k_gather_bwd_runs(int64_t n, int64_t num, int64_t dim, const int64_t *idx,
                                                            const int64_t *order, const float *dy, float *dtable) {
    RT_K_FOR(w, n * dim) {
        const int64_t e = w / dim, j = w - e * dim, k = rt_gather_key(idx, num, order[e]);
        if (k == num || (e > 0 && rt_gather_key(idx, num, order[e - 1]) == k)) continue;
        float s = 0.0f;
        for (int64_t f = e; f < n && rt_gather_key(idx, num, order[f]) == k; f++) s += dy[order[f] * dim + j];
        dtable[k * dim + j] = s;
    }
}

#endif
