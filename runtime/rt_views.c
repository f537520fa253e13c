/* rt_views.c - copies and reductions along chosen axes: permute, slice and its gradient,
 * concat, and the maximum along an axis with its gradient (the IR's LIB_AXES operators).
 *
 * Every kernel is a pure copy or a fixed-order scan, so the results are bit-reproducible and
 * do not depend on the number of threads: OpenMP splits only independent outputs. The copies
 * take the element size in bytes, so they move f32 and i64 alike.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netrt.h"

enum { PAR_MIN = 32768, TILE = 32 }; /* elements below which a kernel runs on one thread */

/* One element of `elem` bytes from x[i] to y[j]. */
static inline void copy1(char *y, int64_t j, const char *x, int64_t i, int64_t elem) {
    switch (elem) {
    case 4: ((uint32_t *)(void *)y)[j] = ((const uint32_t *)(const void *)x)[i]; break;
    case 8: ((uint64_t *)(void *)y)[j] = ((const uint64_t *)(const void *)x)[i]; break;
    default: memcpy(y + j * elem, x + i * elem, (size_t)elem); break;
    }
}

void rt_permute(int rank, const int64_t *dims, const int *perm, int64_t elem, const void *xv, void *yv) {
    const char *x = xv;
    char *y = yv;
    enum { MAX_RANK = 8 }; /* above the IR's IR_MAX_RANK */
    int64_t istride[MAX_RANK] = {0}, od[MAX_RANK] = {0}, os[MAX_RANK] = {0}, total = 1;
    if (rank < 1 || rank > MAX_RANK) { /* not made by netc */
        fprintf(stderr, "error: rt_permute of rank %d\n", rank);
        exit(1);
    }
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) istride[i] = s, s *= dims[i];
    for (int i = 0; i < rank; i++) od[i] = dims[perm[i]], os[i] = istride[perm[i]], total *= od[i];
    if (total == 0) return;
    int64_t Q = od[rank - 1], sQ = os[rank - 1];
    int64_t P = rank >= 2 ? od[rank - 2] : 1, sP = rank >= 2 ? os[rank - 2] : 0;
    int64_t batches = total / (P * Q);
    if (sQ == 1) { /* the last axis stays last: rows copied whole */
        int64_t rows = total / Q;
        #pragma omp parallel for schedule(static) if (total >= PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            int64_t off = 0, rem = r;
            for (int i = rank - 2; i >= 0; i--) off += (rem % od[i]) * os[i], rem /= od[i];
            memcpy(y + r * Q * elem, x + off * elem, (size_t)(Q * elem));
        }
        return;
    }
    /* the last axis comes from elsewhere: [P, Q] planes copied in TILE x TILE blocks, so that
     * reads and writes both stay within a few cache lines (a swap of the last two axes reads
     * the block's columns as rows) */
    int64_t tp = (P + TILE - 1) / TILE, tq = (Q + TILE - 1) / TILE;
    #pragma omp parallel for schedule(static) if (total >= PAR_MIN)
    for (int64_t t = 0; t < batches * tp; t++) {
        int64_t b = t / tp, p0 = t % tp * TILE, base = 0, rem = b;
        for (int i = rank - 3; i >= 0; i--) base += (rem % od[i]) * os[i], rem /= od[i];
        int64_t p1 = p0 + TILE < P ? p0 + TILE : P;
        for (int64_t qt = 0; qt < tq; qt++) {
            int64_t q0 = qt * TILE, q1 = q0 + TILE < Q ? q0 + TILE : Q;
            if (elem == 4) { /* f32: the common case, without the element-size switch */
                const uint32_t *xs = (const uint32_t *)(const void *)x + base;
                uint32_t *ys = (uint32_t *)(void *)y + b * P * Q;
                for (int64_t p = p0; p < p1; p++)
                    for (int64_t q = q0; q < q1; q++) ys[p * Q + q] = xs[p * sP + q * sQ];
                continue;
            }
            for (int64_t p = p0; p < p1; p++)
                for (int64_t q = q0; q < q1; q++) copy1(y, (b * P + p) * Q + q, x, base + p * sP + q * sQ, elem);
        }
    }
}

void rt_slice(int64_t outer, int64_t n_in, int64_t n_out, int64_t inner, int64_t start, int64_t elem,
              const void *xv, void *yv) {
    const char *x = xv;
    char *y = yv;
    size_t row = (size_t)(n_out * inner * elem);
    #pragma omp parallel for schedule(static) if (outer * n_out * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) memcpy(y + o * (int64_t)row, x + ((o * n_in + start) * inner) * elem, row);
}

void rt_slice_bwd(int64_t outer, int64_t n_full, int64_t n_part, int64_t inner, int64_t start, int64_t elem,
                  const void *dyv, void *dxv) {
    const char *dy = dyv;
    char *dx = dxv;
    #pragma omp parallel for schedule(static) if (outer * n_full * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        char *d = dx + o * n_full * inner * elem;
        memset(d, 0, (size_t)(start * inner * elem));
        memcpy(d + start * inner * elem, dy + o * n_part * inner * elem, (size_t)(n_part * inner * elem));
        memset(d + (start + n_part) * inner * elem, 0, (size_t)((n_full - start - n_part) * inner * elem));
    }
}

void rt_concat(int64_t outer, int64_t na, int64_t nb, int64_t inner, int64_t elem, const void *av, const void *bv,
               void *yv) {
    const char *a = av, *b = bv;
    char *y = yv;
    size_t ra = (size_t)(na * inner * elem), rb = (size_t)(nb * inner * elem);
    #pragma omp parallel for schedule(static) if (outer * (na + nb) * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        memcpy(y + o * (int64_t)(ra + rb), a + o * (int64_t)ra, ra);
        memcpy(y + o * (int64_t)(ra + rb) + ra, b + o * (int64_t)rb, rb);
    }
}

/* The index along the axis of the first maximal element of x[o, :, i]. */
static int64_t first_max(int64_t n, int64_t inner, const float *x) {
    int64_t best = 0;
    for (int64_t j = 1; j < n; j++)
        if (x[j * inner] > x[best * inner]) best = j;
    return best;
}

void rt_max_axis(int64_t outer, int64_t n, int64_t inner, const float *x, float *y) {
    #pragma omp parallel for schedule(static) if (outer * n * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *xo = x + o * n * inner + i;
            y[o * inner + i] = xo[first_max(n, inner, xo) * inner];
        }
}

void rt_max_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *x, const float *dy, float *dx) {
    #pragma omp parallel for schedule(static) if (outer * n * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        memset(dx + o * n * inner, 0, (size_t)(n * inner) * sizeof(float));
        for (int64_t i = 0; i < inner; i++) {
            int64_t j = first_max(n, inner, x + o * n * inner + i);
            dx[(o * n + j) * inner + i] = dy[o * inner + i];
        }
    }
}
