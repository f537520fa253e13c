/* rt_nhwc.c - pooling on channels-last (NHWC) tensors.
 *
 * A channels-last tensor is M = N * H * W rows of C channels, so every kernel here runs its
 * inner loop over the channels of one pixel (contiguous, vectorisable) and its outer loops over
 * pixels. The results equal the row-major kernels' in rt_kernels.c: the same windows in the
 * same order, the same first maximum.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* ---- pooling: one output pixel at a time, all channels together */

/* The window of output pixel (i, j), clipped to the plane: rows [h0, h1), columns [w0, w1). */
static void window(const RtPool *p, int64_t i, int64_t j, int64_t *h0, int64_t *h1, int64_t *w0, int64_t *w1) {
    int64_t h = i * p->stride_h - p->pad_h, w = j * p->stride_w - p->pad_w;
    *h0 = h < 0 ? 0 : h;
    *h1 = h + p->kh > p->H ? p->H : h + p->kh;
    *w0 = w < 0 ? 0 : w;
    *w1 = w + p->kw > p->W ? p->W : w + p->kw;
}

void rt_maxpool2d_nhwc_fwd(const RtPool *p, const float *x, float *y) {
    const int64_t C = p->C;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) {
                float *out = y + ((n * p->P + i) * p->Q + j) * C;
                int64_t h0, h1, w0, w1;
                window(p, i, j, &h0, &h1, &w0, &w1);
                for (int64_t c = 0; c < C; c++) out[c] = -INFINITY; /* a window wholly in padding */
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        const float *in = x + ((n * p->H + h) * p->W + w) * C;
                        for (int64_t c = 0; c < C; c++) out[c] = in[c] > out[c] ? in[c] : out[c];
                    }
            }
}

void rt_maxpool2d_nhwc_bwd(const RtPool *p, const float *x, const float *dy, float *dx) {
    const int64_t C = p->C, plane = p->H * p->W * C;
    #pragma omp parallel
    {
        /* per channel: the window's maximum so far and its offset in the sample's plane */
        float *best = rt_alloc((size_t)C * sizeof *best, "a channels-last pooling");
        int64_t *at = rt_alloc((size_t)C * sizeof *at, "a channels-last pooling");
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < p->N; n++) {
            const float *xn = x + n * plane;
            float *dxn = dx + n * plane;
            memset(dxn, 0, (size_t)plane * sizeof *dxn);
            for (int64_t i = 0; i < p->P; i++)
                for (int64_t j = 0; j < p->Q; j++) {
                    const float *g = dy + ((n * p->P + i) * p->Q + j) * C;
                    int64_t h0, h1, w0, w1;
                    window(p, i, j, &h0, &h1, &w0, &w1);
                    if (h0 >= h1 || w0 >= w1) continue; /* wholly in padding: no input to route to */
                    /* the first maximum, as the row-major kernel finds it: the first value, replaced
                     * only by a strictly greater one; masks, not branches, since which wins is data */
                    int64_t first = (h0 * p->W + w0) * C;
                    for (int64_t c = 0; c < C; c++) best[c] = xn[first + c], at[c] = first + c;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = h == h0 ? w0 + 1 : w0; w < w1; w++) {
                            int64_t pix = (h * p->W + w) * C;
                            for (int64_t c = 0; c < C; c++) {
                                const float v = xn[pix + c];
                                const int64_t more = -(int64_t)(v > best[c]); /* all ones where v wins */
                                best[c] = v > best[c] ? v : best[c];
                                at[c] ^= (at[c] ^ (pix + c)) & more;
                            }
                        }
                    for (int64_t c = 0; c < C; c++) dxn[at[c]] += g[c];
                }
        }
        free(best);
        free(at);
    }
}

void rt_avgpool2d_nhwc_fwd(const RtPool *p, const float *x, float *y) {
    const int64_t C = p->C;
    const float scale = 1.0f / (float)(p->kh * p->kw); /* padding counts, as PyTorch's default */
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) {
                float *out = y + ((n * p->P + i) * p->Q + j) * C;
                int64_t h0, h1, w0, w1;
                window(p, i, j, &h0, &h1, &w0, &w1);
                memset(out, 0, (size_t)C * sizeof *out);
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        const float *in = x + ((n * p->H + h) * p->W + w) * C;
                        for (int64_t c = 0; c < C; c++) out[c] += in[c];
                    }
                for (int64_t c = 0; c < C; c++) out[c] *= scale;
            }
}

void rt_avgpool2d_nhwc_bwd(const RtPool *p, const float *dy, float *dx) {
    const int64_t C = p->C, plane = p->H * p->W * C;
    const float scale = 1.0f / (float)(p->kh * p->kw);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < p->N; n++) {
        float *dxn = dx + n * plane;
        memset(dxn, 0, (size_t)plane * sizeof *dxn);
        for (int64_t i = 0; i < p->P; i++)
            for (int64_t j = 0; j < p->Q; j++) {
                const float *g = dy + ((n * p->P + i) * p->Q + j) * C;
                int64_t h0, h1, w0, w1;
                window(p, i, j, &h0, &h1, &w0, &w1);
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        float *out = dxn + (h * p->W + w) * C;
                        for (int64_t c = 0; c < C; c++) out[c] += g[c] * scale;
                    }
            }
    }
}
