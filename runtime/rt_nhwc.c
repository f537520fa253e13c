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

/* 2x2 windows at stride 2 without padding (LeNet's, VGG's): disjoint, four pixels each at
 * known offsets, so the kernels below take each output row at once, with no window bounds,
 * and the backward pass writes each input gradient once instead of adding into zeros. */
static int pool_2x2(const RtPool *p) {
    return p->kh == 2 && p->kw == 2 && p->stride_h == 2 && p->stride_w == 2 && p->pad_h == 0 && p->pad_w == 0;
}

/* The same order of comparisons as the general kernel: from -inf, each pixel of the window
 * in row order replaces the maximum when greater (so a NaN never does, as there). */
static void maxpool_2x2_fwd(const RtPool *p, const float *x, float *y) {
    const int64_t C = p->C, row = p->W * C;
    #pragma omp parallel for schedule(static)
    for (int64_t ni = 0; ni < p->N * p->P; ni++) {
        const int64_t n = ni / p->P, i = ni % p->P;
        const float *r0 = x + (n * p->H + 2 * i) * row, *r1 = r0 + row;
        float *out = y + ni * p->Q * C;
        for (int64_t j = 0; j < p->Q; j++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t a = 2 * j * C + c, b = a + C;
                float m = -INFINITY;
                m = r0[a] > m ? r0[a] : m;
                m = r0[b] > m ? r0[b] : m;
                m = r1[a] > m ? r1[a] : m;
                m = r1[b] > m ? r1[b] : m;
                out[j * C + c] = m;
            }
    }
}

/* Each window routes its gradient to its first maximum, as the general kernel does (the first
 * value, replaced only by a strictly greater one), and 0 to its other pixels; 0.0f + g, not g,
 * so that a gradient of -0 lands as the general kernel's addition into zeros leaves it (+0). */
static void maxpool_2x2_bwd(const RtPool *p, const float *x, const float *dy, float *dx) {
    const int64_t C = p->C, row = p->W * C, plane = p->H * row;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < p->N; n++) {
        if (2 * p->P != p->H || 2 * p->Q != p->W) /* an odd last row or column, in no window */
            memset(dx + n * plane, 0, (size_t)plane * sizeof *dx);
        for (int64_t i = 0; i < p->P; i++) {
            const int64_t off = n * plane + 2 * i * row;
            const float *r0 = x + off, *r1 = r0 + row, *g = dy + (n * p->P + i) * p->Q * C;
            float *d0 = dx + off, *d1 = d0 + row;
            for (int64_t j = 0; j < p->Q; j++)
                for (int64_t c = 0; c < C; c++) {
                    const int64_t a = 2 * j * C + c, b = a + C;
                    float best = r0[a];
                    int k = 0;
                    if (r0[b] > best) best = r0[b], k = 1;
                    if (r1[a] > best) best = r1[a], k = 2;
                    if (r1[b] > best) k = 3;
                    const float v = 0.0f + g[j * C + c];
                    d0[a] = k == 0 ? v : 0.0f;
                    d0[b] = k == 1 ? v : 0.0f;
                    d1[a] = k == 2 ? v : 0.0f;
                    d1[b] = k == 3 ? v : 0.0f;
                }
        }
    }
}

void rt_maxpool2d_nhwc_fwd(const RtPool *p, const float *x, float *y) {
    const int64_t C = p->C;
    if (pool_2x2(p)) {
        maxpool_2x2_fwd(p, x, y);
        return;
    }
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
    if (pool_2x2(p)) {
        maxpool_2x2_bwd(p, x, dy, dx);
        return;
    }
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
