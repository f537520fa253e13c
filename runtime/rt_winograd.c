/* rt_winograd.c - 3x3 convolutions of stride 1 and padding 1 by Winograd's minimal filtering
 * F(2x2, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), on
 * channels-last activations: forward, data gradient and weight gradient. rt_dnnl.c sends them
 * here on every CPU unless NETC_CONV=direct (rt_winograd_fits says which geometries).
 *
 * The output is cut into 2x2 tiles; tile t reads the 4x4 input patch d at (2i - 1, 2j - 1) (zero
 * outside the image). Per input channel c and output channel k
 *   y_tile = A^T [ sum_c (G g_kc G^T) . (B^T d_c B) ] A
 * where . is the element-wise product of 4x4 matrices: the sum over c is 16 matrix products, one
 * per position xi of the 4x4 transformed tile, M_xi[t][k] = sum_c V_xi[t][c] U_xi[c][k], each
 * computed by oneDNN's sgemm whatever its size (rt_gemm_onednn: on a 2-core AVX-512 EPYC
 * OpenBLAS's small products, one thread each, ran this file's convolutions 1.0-1.6x as long
 * from one process to the next; oneDNN's held within 10 %). That is 16 multiplications per
 * tile and channel pair where the direct convolution takes 36: 2.25x fewer, paid for by the
 * transforms of the inputs and the outputs
 * (additions only, along contiguous channels) and of the weights (once per call, in place of
 * oneDNN's reorder of the weights to its blocked format).
 *
 * The data gradient is the same correlation of dy, padded by 1, with the weights turned by 180
 * degrees and their two channel axes swapped: dx[c] = sum_k dy[k] * rot(w[k][c]). U is [c][k]
 * forward and [k][c] for the data gradient: [input channel][output channel] of the correlation.
 *
 * The weight gradient is the transpose of the forward: with U = G g G^T and y = A^T (U . V) A,
 * dU = sum over the tiles of (A dy A^T) . V, and dg = G^T dU G: 16 products summed over the
 * tiles, dU_xi[k][c] = sum_t W_xi[t][k] V_xi[t][c].
 *
 * Rounding: every transform's coefficient is 0, +-1 or +-1/2, so each transformed value is a
 * sum of at most 9 terms, and a forward output's error is within gamma_(C+10) of the sum of its
 * terms' magnitudes with every matrix's entries taken absolute. tests/runtime/dnnl_accuracy.c
 * measures all three directions against float64: 0.1-0.9x the error of a plain float32 loop.
 * The weight gradient's blocks and tasks are fixed by the geometry (RT_WINO_SUM_TILES,
 * RT_WINO_SUM_ROWS), so are its bits; the forward's blocks (RT_WINO_TILES) follow the thread
 * count too, as the bits of a threaded sgemm do.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* Tiles per block of the forward and the data gradient: a block's transformed inputs and
 * products (16 x 128 x (C + K) floats, 1 MiB at 64 channels) stay in the cache from the input
 * transform through the products to the output transform, one thread per block. With fewer than
 * RT_WINO_BLOCKS_PER_THREAD blocks a thread (at least 8 in all) the tiles go as one block whose
 * steps each use every thread, the products threaded by oneDNN: blocks of their own would leave
 * threads idle. Measured on the 2-core AVX2 EPYC, ResNet-18's geometries at batch 32: blocks of
 * 128 tiles 1.3-1.7x oneDNN's brgconv:avx2, one block 1.1-1.5x. */
enum { RT_WINO_TILES = 128, RT_WINO_BLOCKS_PER_THREAD = 4, RT_WINO_MIN_CHANNELS = 32 };

/* The weight gradient's sums (rt_winograd_bwd_filter): tiles per block, and the rows of dU (output
 * channels) per task of a block's 16 products. 256 and 512 tiles ran ResNet-18's 32x32 geometry at
 * batch 32 alike on the AVX2 EPYC, 2048 and one block of all 8192 slower; rows of 64 make 16 to
 * 128 tasks a block at ResNet's widths, enough for more threads than the 16 products. */
enum { RT_WINO_SUM_TILES = 512, RT_WINO_SUM_ROWS = 64 };

int rt_winograd_fits(const RtConv *c) {
    return c->R == 3 && c->S == 3 && c->stride_h == 1 && c->stride_w == 1 && c->pad_h == 1 && c->pad_w == 1 &&
           c->dil_h == 1 && c->dil_w == 1 && c->groups == 1 && c->P == c->H && c->Q == c->W &&
           c->C >= RT_WINO_MIN_CHANNELS && c->K >= RT_WINO_MIN_CHANNELS;
}

static int64_t tiles(const RtConv *c) { return c->N * ((c->H + 1) / 2) * ((c->W + 1) / 2); }

/* Tiles in a block of the forward and the data gradient: RT_WINO_TILES, or all as one block
 * while that block's scratch stays within RT_WINO_ONE_BLOCK_FLOATS (64 MiB: on many threads a
 * large batch's deep layers would take gigabytes). */
static int64_t block_tiles(const RtConv *c) {
    enum { RT_WINO_ONE_BLOCK_FLOATS = 1 << 24 };
    const int64_t threads = omp_get_max_threads() > 2 ? omp_get_max_threads() : 2, T = tiles(c);
    const int one = T < RT_WINO_TILES * RT_WINO_BLOCKS_PER_THREAD * threads &&
                    16 * T * (c->C + c->K) <= RT_WINO_ONE_BLOCK_FLOATS;
    return one ? T : RT_WINO_TILES;
}

size_t rt_winograd_scratch(const RtConv *c) {
    const int64_t tb = block_tiles(c), blocks = tb == tiles(c) ? 1 : omp_get_max_threads();
    const int64_t sum_tiles = tiles(c) < RT_WINO_SUM_TILES ? tiles(c) : RT_WINO_SUM_TILES;
    const int64_t work = blocks * tb > sum_tiles ? blocks * tb : sum_tiles;
    return (size_t)(16 * c->K * c->C + work * 16 * (c->C + c->K));
}

/* u[xi * stride] = (G g G^T)[xi] for the 3x3 g read with steps rs (rows) and ss (columns):
 * negative steps from its last element turn it by 180 degrees. G's rows: (1, 0, 0),
 * (1/2, 1/2, 1/2), (1/2, -1/2, 1/2), (0, 0, 1). */
static void filter_tile(const float *g, int64_t rs, int64_t ss, float *u, int64_t stride) {
    float t[4][3];
    for (int s = 0; s < 3; s++) {
        const float g0 = g[s * ss], g1 = g[rs + s * ss], g2 = g[2 * rs + s * ss];
        t[0][s] = g0, t[1][s] = 0.5f * (g0 + g1 + g2), t[2][s] = 0.5f * (g0 - g1 + g2), t[3][s] = g2;
    }
    for (int i = 0; i < 4; i++) {
        u[(4 * i + 0) * stride] = t[i][0];
        u[(4 * i + 1) * stride] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
        u[(4 * i + 2) * stride] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
        u[(4 * i + 3) * stride] = t[i][2];
    }
}

/* The 16 planes of transformed weights from w [K][C][3][3]: U[xi][c][k] for the forward,
 * U[xi][k][c] of the turned weights for the data gradient, so that both directions' products
 * read theirs untransposed as [CI][KO] (the forward's transposed read ran 1.1-1.4x as long on
 * a 2-core AVX-512 EPYC). A row of the plane goes through a local buffer: written straight,
 * the 16 planes K·C floats apart fall on the same cache sets (at 512 channels they are 1 MiB
 * apart) and the transform took 3x as long. */
static void filter_transform(const RtConv *c, const float *w, int turned, float *U) {
    enum { CB = 256 };
    const int64_t K = c->K, C = c->C, rows = turned ? K : C, cols = turned ? C : K;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float u[16 * CB];
        for (int64_t c0 = 0; c0 < cols; c0 += CB) {
            const int64_t cn = cols - c0 < CB ? cols - c0 : CB;
            for (int64_t i = 0; i < cn; i++) {
                if (turned) filter_tile(w + (r * C + c0 + i) * 9 + 8, -3, -1, u + i, CB);
                else filter_tile(w + ((c0 + i) * C + r) * 9, 3, 1, u + i, CB);
            }
            for (int xi = 0; xi < 16; xi++)
                memcpy(U + (xi * rows + r) * cols + c0, u + xi * CB, (size_t)cn * sizeof *u);
        }
    }
}

/* The tile geometry of an image of H x W with 2x2 output tiles. */
typedef struct {
    int64_t H, W, tiles_h, tiles_w;
} Tiling;

/* V[xi * vs + ch] = (B^T d B)[xi] for channel ch of tile t's 4x4 input patch of x [N][H][W][C].
 * B^T's rows: (1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1). */
static void input_tile(const Tiling *g, const float *x, int64_t C, int64_t t, const float *zeros, float *V,
                       int64_t vs) {
    const int64_t per_image = g->tiles_h * g->tiles_w, n = t / per_image;
    const int64_t h0 = t % per_image / g->tiles_w * 2 - 1, w0 = t % g->tiles_w * 2 - 1;
    const float *d[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int64_t h = h0 + i, w = w0 + j;
            d[4 * i + j] = h < 0 || h >= g->H || w < 0 || w >= g->W ? zeros : x + ((n * g->H + h) * g->W + w) * C;
        }
#pragma omp simd
    for (int64_t ch = 0; ch < C; ch++) {
        float r[4][4]; /* B^T d: its rows */
        for (int j = 0; j < 4; j++) {
            const float d0 = d[j][ch], d1 = d[4 + j][ch], d2 = d[8 + j][ch], d3 = d[12 + j][ch];
            r[0][j] = d0 - d2, r[1][j] = d1 + d2, r[2][j] = d2 - d1, r[3][j] = d1 - d3;
        }
        for (int i = 0; i < 4; i++) { /* (B^T d) B */
            V[(4 * i + 0) * vs + ch] = r[i][0] - r[i][2];
            V[(4 * i + 1) * vs + ch] = r[i][1] + r[i][2];
            V[(4 * i + 2) * vs + ch] = r[i][2] - r[i][1];
            V[(4 * i + 3) * vs + ch] = r[i][1] - r[i][3];
        }
    }
}

/* Tile t's 2x2 outputs of y [N][H][W][K], A^T m A of the 16 products m[xi * ms + k]; those past
 * an odd image's last row or column are not written. A^T's rows: (1, 1, 1, 0), (0, 1, -1, -1). */
static void output_tile(const Tiling *g, const float *m, int64_t ms, int64_t K, int64_t t, float *y) {
    const int64_t per_image = g->tiles_h * g->tiles_w, n = t / per_image;
    const int64_t h0 = t % per_image / g->tiles_w * 2, w0 = t % g->tiles_w * 2;
    const int down = h0 + 1 < g->H, right = w0 + 1 < g->W;
    float *o0 = y + ((n * g->H + h0) * g->W + w0) * K; /* the others only where they exist */
    float *o1 = right ? o0 + K : o0, *o2 = down ? o0 + g->W * K : o0, *o3 = down && right ? o2 + K : o0;
#pragma omp simd
    for (int64_t k = 0; k < K; k++) {
        float r0[4], r1[4]; /* A^T m: its two rows */
        for (int j = 0; j < 4; j++) {
            r0[j] = m[j * ms + k] + m[(4 + j) * ms + k] + m[(8 + j) * ms + k];
            r1[j] = m[(4 + j) * ms + k] - m[(8 + j) * ms + k] - m[(12 + j) * ms + k];
        }
        o0[k] = r0[0] + r0[1] + r0[2];
        if (right) o1[k] = r0[1] - r0[2] - r0[3];
        if (down) o2[k] = r1[0] + r1[1] + r1[2];
        if (down && right) o3[k] = r1[1] - r1[2] - r1[3];
    }
}

/* Tiles [t0, t0 + n) of the correlation below: their input transforms into V, the 16 products
 * into M, the output transforms. Called inside a parallel region (a block per thread) the tile
 * loops run on the calling thread and so does each product; called outside (one block of all
 * the tiles) the tile loops spread over the threads and oneDNN threads each product. */
static void correlate_block(const Tiling *g, const float *in, int64_t CI, const float *U, int64_t uplane,
                            int64_t KO, float *out, int64_t t0, int64_t n, const float *zeros,
                            float *V, float *M) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
    for (int64_t t = 0; t < n; t++) input_tile(g, in, CI, t0 + t, zeros, V + t * CI, n * CI);
    for (int xi = 0; xi < 16; xi++)
        rt_gemm_onednn(0, 0, n, KO, CI, 1.0f, V + xi * n * CI, CI, U + xi * uplane, KO, 0.0f, M + xi * n * KO, KO);
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
    for (int64_t t = 0; t < n; t++) output_tile(g, M + t * KO, n * KO, KO, t0 + t, out);
}

/* out [N][H][W][KO] = the 3x3 correlation (padding 1) of in [N][H][W][CI] with the transformed
 * weights U [16][CI][KO]: KO = K, CI = C forward, KO = C, CI = K for the data gradient. */
static void correlate(const RtConv *c, const float *in, int64_t CI, const float *U, int64_t KO, float *out,
                      float *scratch) {
    const Tiling g = {c->H, c->W, (c->H + 1) / 2, (c->W + 1) / 2};
    const int64_t T = tiles(c), tb = block_tiles(c), blocks = (T + tb - 1) / tb, uplane = c->K * c->C;
    float *work = scratch + 16 * uplane;
    float *zeros = rt_alloc((size_t)CI * sizeof *zeros, "a convolution's row of zeros");
    if (blocks == 1) {
        correlate_block(&g, in, CI, U, uplane, KO, out, 0, T, zeros, work, work + 16 * T * CI);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t t0 = b * tb, n = T - t0 < tb ? T - t0 : tb;
            float *V = work + (int64_t)omp_get_thread_num() * tb * 16 * (CI + KO);
            correlate_block(&g, in, CI, U, uplane, KO, out, t0, n, zeros, V, V + 16 * n * CI);
        }
    }
    free(zeros);
}

/* W[xi * ws + k] = (A dy A^T)[xi] of tile t's 2x2 output gradient in dy [N][H][W][K] (zero past
 * an odd image's last row or column): the transpose of output_tile. */
static void grad_tile(const Tiling *g, const float *dy, int64_t K, int64_t t, const float *zeros, float *W,
                      int64_t ws) {
    const int64_t per_image = g->tiles_h * g->tiles_w, n = t / per_image;
    const int64_t h0 = t % per_image / g->tiles_w * 2, w0 = t % g->tiles_w * 2;
    const int down = h0 + 1 < g->H, right = w0 + 1 < g->W;
    const float *o0 = dy + ((n * g->H + h0) * g->W + w0) * K;
    const float *o1 = right ? o0 + K : zeros, *o2 = down ? o0 + g->W * K : zeros;
    const float *o3 = down && right ? o0 + (g->W + 1) * K : zeros;
#pragma omp simd
    for (int64_t k = 0; k < K; k++) {
        const float a = o0[k], b = o1[k], c = o2[k], d = o3[k];
        const float r[4][2] = {{a, b}, {a + c, b + d}, {a - c, b - d}, {-c, -d}}; /* A dy */
        for (int i = 0; i < 4; i++) { /* (A dy) A^T */
            W[(4 * i + 0) * ws + k] = r[i][0];
            W[(4 * i + 1) * ws + k] = r[i][0] + r[i][1];
            W[(4 * i + 2) * ws + k] = r[i][0] - r[i][1];
            W[(4 * i + 3) * ws + k] = -r[i][1];
        }
    }
}

/* dw [K][C][3][3] = G^T dU G of each dU[xi][k][c]: the transpose of filter_tile, a row of k
 * through a local buffer as in filter_transform. */
static void weight_back_transform(const RtConv *c, const float *dU, float *dw) {
    enum { CB = 256 };
    const int64_t K = c->K, C = c->C;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) {
        float u[16 * CB];
        for (int64_t c0 = 0; c0 < C; c0 += CB) {
            const int64_t cn = C - c0 < CB ? C - c0 : CB;
            for (int xi = 0; xi < 16; xi++) memcpy(u + xi * CB, dU + (xi * K + k) * C + c0, (size_t)cn * sizeof *u);
            for (int64_t i = 0; i < cn; i++) {
                float t[3][4]; /* G^T dU: rows (1, 1/2, 1/2, 0), (0, 1/2, -1/2, 0), (0, 1/2, 1/2, 1) */
                for (int j = 0; j < 4; j++) {
                    const float m0 = u[j * CB + i], m1 = u[(4 + j) * CB + i], m2 = u[(8 + j) * CB + i];
                    const float m3 = u[(12 + j) * CB + i];
                    t[0][j] = m0 + 0.5f * (m1 + m2), t[1][j] = 0.5f * (m1 - m2), t[2][j] = 0.5f * (m1 + m2) + m3;
                }
                float *g = dw + (k * C + c0 + i) * 9;
                for (int r = 0; r < 3; r++) { /* (G^T dU) G */
                    g[3 * r + 0] = t[r][0] + 0.5f * (t[r][1] + t[r][2]);
                    g[3 * r + 1] = 0.5f * (t[r][1] - t[r][2]);
                    g[3 * r + 2] = 0.5f * (t[r][1] + t[r][2]) + t[r][3];
                }
            }
        }
    }
}

void rt_winograd_fwd(const RtConv *c, const float *x, const float *w, float *y, float *scratch) {
    filter_transform(c, w, 0, scratch);
    correlate(c, x, c->C, scratch, c->K, y, scratch);
}

void rt_winograd_bwd_data(const RtConv *c, const float *dy, const float *w, float *dx, float *scratch) {
    filter_transform(c, w, 1, scratch);
    correlate(c, dy, c->K, scratch, c->C, dx, scratch);
}

/* dU[xi][k][c] = sum over the tiles of W_xi[t][k] V_xi[t][c], then dw = G^T dU G. The tiles go
 * in blocks of RT_WINO_SUM_TILES, one after another, each block's 16 products added to dU (beta
 * 1 after the first) in tasks of RT_WINO_SUM_ROWS rows, one thread each: the tasks, and so the
 * sums' order, are a function of the geometry alone, whatever the number of threads. */
void rt_winograd_bwd_filter(const RtConv *c, const float *x, const float *dy, float *dw, float *scratch) {
    const Tiling g = {c->H, c->W, (c->H + 1) / 2, (c->W + 1) / 2};
    const int64_t T = tiles(c), C = c->C, K = c->K, tb = T < RT_WINO_SUM_TILES ? T : RT_WINO_SUM_TILES;
    float *dU = scratch, *V = dU + 16 * K * C, *W = V + 16 * tb * C;
    float *zeros = rt_alloc((size_t)(C > K ? C : K) * sizeof *zeros, "a convolution's row of zeros");
    for (int64_t t0 = 0; t0 < T; t0 += tb) {
        const int64_t n = T - t0 < tb ? T - t0 : tb;
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < n; t++) {
            input_tile(&g, x, C, t0 + t, zeros, V + t * C, n * C);
            grad_tile(&g, dy, K, t0 + t, zeros, W + t * K, n * K);
        }
        const int64_t parts = (K + RT_WINO_SUM_ROWS - 1) / RT_WINO_SUM_ROWS;
#pragma omp parallel for schedule(static)
        for (int64_t task = 0; task < 16 * parts; task++) {
            const int64_t xi = task / parts, k0 = task % parts * RT_WINO_SUM_ROWS;
            const int64_t rows = K - k0 < RT_WINO_SUM_ROWS ? K - k0 : RT_WINO_SUM_ROWS;
            rt_gemm_onednn(1, 0, rows, C, n, 1.0f, W + xi * n * K + k0, K, V + xi * n * C, C, t0 ? 1.0f : 0.0f,
                    dU + (xi * K + k0) * C, C);
        }
    }
    weight_back_transform(c, dU, dw);
    free(zeros);
}
