/* rt_dnnl.c - channels-last (NHWC) convolutions through oneDNN, and those the runtime does
 * itself where they are faster: 3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3)
 * (rt_winograd.c), the data gradient of few input channels by a product and col2im, and
 * without AVX-512 weight gradients by im2col + sgemm.
 *
 * Activations are NHWC, weights stay in PyTorch's [K, C/groups, R, S] (oihw) layout, so weight
 * files never change. Each generated convolution call owns one RtConvPlan (a static pointer in
 * the generated code): the first call creates the oneDNN primitive for its geometry, lets
 * oneDNN choose the weights' internal format, and prepares the reorder between that format and
 * oihw; later calls only set pointers and execute. Every call waits for completion, so the
 * caller sees plain synchronous kernels.
 *
 * Instruction set: oneDNN picks its kernels for the CPU (brgconv and jit AVX-512 kernels where the
 * CPU has AVX-512); oneDNN's own ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) holds it to an older set.
 * Each choice is float32-accurate: tests/runtime/dnnl_accuracy.c measures the three directions
 * against float64 under the default and under AVX2 and SSE41 caps. The runtime once held oneDNN
 * to AVX2 after a whole-network ResNet-18 step on AVX-512 came out 0.4 % off; that was ReLU, not
 * oneDNN (docs/testing.md, "Accuracy at the size of a real batch").
 */
#include <cblas.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

enum { FWD, BWD_DATA, BWD_WEIGHTS };

/* A result oneDNN does not compute: a weight gradient by im2col + sgemm, a 3x3 convolution's
 * any direction by Winograd's F(2x2, 3x3) (rt_winograd.c). */
enum { LIBRARY, IM2COL, IM2COL_OPENBLAS, COL2IM, WINOGRAD };

struct RtConvPlan {
    int own;                         /* LIBRARY, or the runtime's own: IM2COL(_OPENBLAS), COL2IM, WINOGRAD */
    dnnl_primitive_t conv;           /* oneDNN's primitive (LIBRARY only) */
    dnnl_memory_t act_in, act_out;   /* the NHWC activation operands (user pointers) */
    dnnl_memory_t wei_user, wei_lib; /* oihw weights (user) and oneDNN's format (same when equal) */
    dnnl_primitive_t reorder;        /* oihw -> library format (forward, data) or back (weights) */
};

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void check(dnnl_status_t s, const char *what) {
    if (s == dnnl_success) return;
    fprintf(stderr, "error: oneDNN failed in %s (status %d)\n", what, (int)s);
    abort();
}

static void init_engine(void) {
    if (engine) return;
    check(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine creation");
    check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream creation");
}

/* The two oneDNN APIs this file builds against: oneDNN 3 (scripts/setup.sh fetches it: its AVX2
 * convolutions are brgemm kernels, 1.3-1.5x faster than 2.6's on an AMD EPYC without AVX-512) and
 * Debian's oneDNN 2.6, where setup cannot fetch it. In 3, a memory descriptor is a handle made
 * and destroyed, and a primitive descriptor is made in one call; in 2, a descriptor is a struct
 * and an operation descriptor comes first. MemDesc is either; MdRef what queries return. */
#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t MemDesc;
typedef const_dnnl_memory_desc_t MdRef;
static MdRef md_ref(const MemDesc *m) { return *m; }
static void md_free(MemDesc m) { dnnl_memory_desc_destroy(m); }
static MemDesc md_tag(int ndims, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
    MemDesc m;
    check(dnnl_memory_desc_create_with_tag(&m, ndims, dims, dnnl_f32, tag), "memory descriptor");
    return m;
}
#else
typedef dnnl_memory_desc_t MemDesc;
typedef const dnnl_memory_desc_t *MdRef;
static MdRef md_ref(const MemDesc *m) { return m; }
static void md_free(MemDesc m) { (void)m; }
static MemDesc md_tag(int ndims, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
    MemDesc m;
    check(dnnl_memory_desc_init_by_tag(&m, ndims, dims, dnnl_f32, tag), "memory descriptor");
    return m;
}
#endif

static MemDesc act_md(int64_t n, int64_t c, int64_t h, int64_t w) {
    dnnl_dims_t d = {n, c, h, w};
    return md_tag(4, d, dnnl_nhwc);
}

/* oihw, or goihw with groups; `any` lets the primitive choose. */
static MemDesc wei_md(const RtConv *c, int any) {
    int64_t g = c->groups;
    dnnl_format_tag_t tag = any ? dnnl_format_tag_any : g > 1 ? dnnl_goihw : dnnl_oihw;
    if (g > 1) {
        dnnl_dims_t d = {g, c->K / g, c->C / g, c->R, c->S};
        return md_tag(5, d, tag);
    }
    dnnl_dims_t d = {c->K, c->C, c->R, c->S};
    return md_tag(4, d, tag);
}

/* Strides, dilations (oneDNN counts them from 0) and the padding before and after, as the
 * descriptors of all three directions want them. */
typedef struct Geometry {
    dnnl_dims_t strides, dil, pad_l, pad_r;
} Geometry;

static Geometry geometry(const RtConv *c) {
    return (Geometry){
        .strides = {c->stride_h, c->stride_w},
        .dil = {c->dil_h - 1, c->dil_w - 1},
        .pad_l = {c->pad_h, c->pad_w},
        /* the padding past the last window, from the output size */
        .pad_r = {(c->P - 1) * c->stride_h + (c->R - 1) * c->dil_h + 1 - c->H - c->pad_h,
                  (c->Q - 1) * c->stride_w + (c->S - 1) * c->dil_w + 1 - c->W - c->pad_w},
    };
}

/* The primitive descriptor of one direction; the backward ones take the forward one as their
 * hint (hint NULL: the forward one). */
static dnnl_primitive_desc_t conv_pd(int kind, const MemDesc *x, const MemDesc *w, const MemDesc *y,
                                     const Geometry *g, dnnl_primitive_desc_t hint) {
    dnnl_primitive_desc_t pd;
#if DNNL_VERSION_MAJOR >= 3
    if (kind == FWD)
        check(dnnl_convolution_forward_primitive_desc_create(&pd, engine, dnnl_forward_training, dnnl_convolution_direct,
                                                             *x, *w, NULL, *y, g->strides, g->dil, g->pad_l,
                                                             g->pad_r, NULL),
              "convolution primitive");
    else if (kind == BWD_DATA)
        check(dnnl_convolution_backward_data_primitive_desc_create(&pd, engine, dnnl_convolution_direct, *x, *w, *y,
                                                                   g->strides, g->dil, g->pad_l, g->pad_r, hint, NULL),
              "backward-data primitive");
    else
        check(dnnl_convolution_backward_weights_primitive_desc_create(&pd, engine, dnnl_convolution_direct, *x, *w, NULL,
                                                                      *y, g->strides, g->dil, g->pad_l, g->pad_r,
                                                                      hint, NULL),
              "backward-weights primitive");
#else
    dnnl_convolution_desc_t d;
    if (kind == FWD)
        check(dnnl_dilated_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct, x, w, NULL,
                                                         y, g->strides, g->dil, g->pad_l, g->pad_r),
              "convolution descriptor");
    else if (kind == BWD_DATA)
        check(dnnl_dilated_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, x, w, y, g->strides, g->dil,
                                                               g->pad_l, g->pad_r),
              "backward-data descriptor");
    else
        check(dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, x, w, NULL, y,
                                                                  g->strides, g->dil, g->pad_l, g->pad_r),
              "backward-weights descriptor");
    check(dnnl_primitive_desc_create(&pd, &d, NULL, engine, hint), "convolution primitive");
#endif
    return pd;
}

static dnnl_memory_t user_mem(MdRef md) {
    dnnl_memory_t m;
    check(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_NONE), "memory object");
    return m;
}

/* ---- the weight gradient as one matrix product, where oneDNN has no AVX-512
 *
 * Without AVX-512 (an AVX2 CPU, or oneDNN held to an older set), oneDNN's channels-last weight
 * gradient is its direct jit kernel, at 58-85 GFLOP/s on ResNet-18's 3x3 geometries on a 2-core
 * AVX2 AMD EPYC (Zen 3), where its sgemm runs the same sums as one product at 95-140: the rows
 * of the NHWC input's im2col, col[(n, p, q)][(r, s, c)] (each (r, s) a contiguous copy of C
 * channels), and dW[k][(r, s, c)] = sum over rows of dy[row][k] * col[row][(r, s, c)], then
 * permuted to oihw. Its sum runs over N·P·Q in the library's fixed blocking, float32-accurate as
 * oneDNN's (runtime_dnnl_accuracy). Rows go in chunks of at most RT_WGRAD_COL_FLOATS columns'
 * floats (a chunk after the first adds to the product: beta 1), so the scratch is bounded
 * whatever the batch; the chunks are a function of the geometry alone, so are the bits. A chunk
 * of 4 MiB is still in the cache when the sgemm packs it: 1-8 % faster than 32 MiB chunks on
 * ResNet-18's 3x3 geometries at batch 32 on the AVX2 EPYC (1, 4 and 8 MiB measured alike). A
 * 1x1 convolution of stride 1 without padding reads its input in place, its im2col, in one
 * product. Where R·S·C < K the product is computed transposed, [R·S·C][K] = colᵀ·dy: oneDNN's
 * AVX2 sgemm ran a result of four times as many rows as columns at 60-70 GFLOP/s there (1024 x
 * 256 over 3136 rows: ResNet-50's 256->1024 at 14x14; 512 x 128 over 12544) and its transpose at
 * 115-130; ResNet-50's weight gradients at 224x224, batch 16, took 0.83-0.95x the time. With
 * AVX-512 oneDNN's own kernel (jit:avx512_core, jit_1x1:avx512_core) stays: on the 2-core AVX-512
 * EPYC ResNet-50's 1x1 and strided 3x3 weight gradients at batch 16 ran within 10 % of this
 * product either way, in each direction in one run or another (the machine's noise).
 * So does it below RT_WGRAD_MIN_C input channels, where the im2col's copies are too short to pay
 * (LeNet's 1 and 6 channels: half its step in the im2col, at 1x PyTorch's speed against 2.6x). */
enum { RT_WGRAD_COL_FLOATS = 1 << 20, RT_WGRAD_MIN_C = 32 };

/* The product itself goes to OpenBLAS where its result has at least RT_WGRAD_OPENBLAS_MIN
 * elements: a sum over tens of thousands of rows into a [K][R·S·C] result, on which oneDNN's
 * AVX2 sgemm falls well below its peak and OpenBLAS's Zen kernels do not. On the 2-core AVX2
 * EPYC (best of 9-15 in each of 3 runs, orientation as chosen above; this machine's runs move by
 * up to 2x): 1x1 256->1024 at 3136 rows (ResNet-50's at batch 16) 55-112 GFLOP/s in oneDNN against
 * 122-136 in OpenBLAS, 1024->256 51-102 against 128-137, 128->512 at 3136-12544 rows 77-96 against
 * 104-116, the 3x3/2 weight gradients of 1152 x 256 62-124 against 85-133; at 576 x 128
 * (ResNet-18's first 3x3/2) they are even (0.93-1.0x), and below 64K elements oneDNN's is the
 * faster (64->256 over 50176 rows: 0.85x, 64x64: 0.7-0.98x). Only where OpenBLAS runs the CPU's
 * own kernels (rt_openblas_current), and not under NETC_CONV=direct. */
enum { RT_WGRAD_OPENBLAS_MIN = 1 << 16 };

static int avx512(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

static int gemm_weight_gradient(const RtConv *c) {
    return c->groups == 1 && c->C >= RT_WGRAD_MIN_C && !avx512();
}

static int openblas_weight_gradient(const RtConv *c) {
    return c->R * c->S * c->C * c->K >= RT_WGRAD_OPENBLAS_MIN && rt_conv_choice() != RT_CONV_DIRECT &&
           rt_openblas_current();
}

/* Winograd's F(2x2, 3x3) for all three directions of the 3x3 convolutions it takes
 * (rt_winograd.c), on every CPU. On the 2-core AVX2 EPYC, ResNet-18's four 3x3 geometries at
 * batch 32: 1.3-1.7x brgconv:avx2's speed forward and for the data gradient, and 1.1-2.2x the
 * im2col + sgemm weight gradient. On a 2-core AVX-512 EPYC (Zen 4), best of 10 in each of 3 runs
 * against oneDNN's brgconv:avx512_core and jit:avx512_core (218-272 GFLOP/s): ResNet-18's
 * geometries at batch 32 in 0.61-0.88x their time in every direction (64 channels at 32x32
 * forward 7.5-7.7 ms against 10.7-10.9, 512 at 4x4 7.8-8.1 against 8.9-9.4), ResNet-50's at
 * batch 16 in 0.59-0.92x (512 at 7x7, whose odd side wastes a quarter of the tiles, 0.92x).
 * NETC_CONV=direct leaves them to oneDNN, with im2col + sgemm and col2im. */
static int winograd(const RtConv *c) { return rt_winograd_fits(c) && rt_conv_choice() != RT_CONV_DIRECT; }

/* One scratch for every plan: the trainer runs one convolution at a time. */
static float *conv_scratch(size_t floats) {
    static float *buf;
    static size_t have;
    if (floats > have) {
        free(buf);
        buf = malloc(floats * sizeof *buf);
        if (!buf) {
            fprintf(stderr, "error: out of memory for a convolution's scratch (%zu floats)\n", floats);
            exit(1);
        }
        have = floats;
    }
    return buf;
}

/* Rows [m0, m1) of the NHWC input's im2col, each R·S·C floats. */
static void im2col_rows(const RtConv *c, const float *x, int64_t m0, int64_t m1, float *col) {
    int64_t rsc = c->R * c->S * c->C;
    #pragma omp parallel for schedule(static)
    for (int64_t m = m0; m < m1; m++) {
        int64_t n = m / (c->P * c->Q), p = m / c->Q % c->P, q = m % c->Q;
        float *row = col + (m - m0) * rsc;
        for (int64_t r = 0; r < c->R; r++) {
            int64_t h = p * c->stride_h - c->pad_h + r * c->dil_h, w0 = q * c->stride_w - c->pad_w;
            float *out = row + r * c->S * c->C;
            if (c->dil_w == 1 && h >= 0 && h < c->H && w0 >= 0 && w0 + c->S <= c->W) { /* S·C floats in a row */
                memcpy(out, x + ((n * c->H + h) * c->W + w0) * c->C, (size_t)(c->S * c->C) * sizeof *out);
                continue;
            }
            for (int64_t s = 0; s < c->S; s++, out += c->C) {
                int64_t w = w0 + s * c->dil_w;
                if (h < 0 || h >= c->H || w < 0 || w >= c->W) memset(out, 0, (size_t)c->C * sizeof *out);
                else memcpy(out, x + ((n * c->H + h) * c->W + w) * c->C, (size_t)c->C * sizeof *out);
            }
        }
    }
}

/* A 1x1 convolution of stride 1 and no padding: its im2col is the input itself. */
static int pointwise(const RtConv *c) {
    return c->R == 1 && c->S == 1 && c->stride_h == 1 && c->stride_w == 1 && c->pad_h == 0 && c->pad_w == 0;
}

/* How many of n items of `each` scratch floats go in one chunk: as many as RT_WGRAD_COL_FLOATS
 * holds, at least one, at most n. */
static int64_t chunk_of(int64_t each, int64_t n) {
    int64_t k = RT_WGRAD_COL_FLOATS / each;
    return k < 1 ? 1 : k > n ? n : k;
}

/* Row-major C[M][N] = Aᵀ B + beta C (A [K][M], B [K][N]) in oneDNN's sgemm or OpenBLAS's. */
static void sgemm_tn(int openblas, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc) {
    if (openblas)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f, A,
                    (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
    else
        check(dnnl_sgemm('T', 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc), "the weight gradient's sgemm");
}

static void gemm_bwd_filter(const RtConv *c, const float *x, const float *dy, float *dw, int openblas) {
    int64_t rsc = c->R * c->S * c->C, rows = c->N * c->P * c->Q;
    int in_place = pointwise(c);
    int64_t chunk = in_place ? rows : chunk_of(rsc, rows);
    /* [K][R·S·C] = dyᵀ·col, or its transpose where that has the fewer rows (above) */
    int flip = rsc < c->K;
    float *col = conv_scratch((size_t)((in_place ? 0 : chunk * rsc) + c->K * rsc));
    float *prod = in_place ? col : col + chunk * rsc;
    for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
        int64_t m1 = m0 + chunk < rows ? m0 + chunk : rows;
        const float *a = dy + m0 * c->K, *b = col;
        if (in_place) b = x + m0 * c->C;
        else im2col_rows(c, x, m0, m1, col);
        float beta = m0 ? 1.0f : 0.0f;
        if (flip) sgemm_tn(openblas, rsc, c->K, m1 - m0, b, rsc, a, c->K, beta, prod, c->K);
        else sgemm_tn(openblas, c->K, rsc, m1 - m0, a, c->K, b, rsc, beta, prod, rsc);
    }
    /* [K][R·S][C] or [R·S][C][K] -> [K][C][R·S] */
    int64_t dims[] = {c->K, c->R * c->S, c->C}, flipped[] = {c->R * c->S, c->C, c->K};
    if (flip) rt_permute(3, flipped, (const int[]){2, 1, 0}, sizeof(float), prod, dw);
    else rt_permute(3, dims, (const int[]){0, 2, 1}, sizeof(float), prod, dw);
}

/* ---- the data gradient of a convolution of few input channels
 *
 * dx = col2im(dy · W): the product of the output gradient's rows [N·P·Q][K] and the filters as a
 * [K][R·S·C] matrix (permuted from oihw) gives each row's im2col gradient, columns (r, s, c),
 * which is added into dx [N][H][W][C], a run of S·C floats per filter row. oneDNN's AVX2 kernel
 * for it (brg_fwd:avx2, a forward convolution of the turned filters) keeps the C channels in
 * 8-wide vectors: LeNet's second convolution (6 channels in, 5x5) took 0.74-0.78 ms at batch 64
 * on the AVX2 EPYC, this 0.38-0.48 (1.5 ms and 0.76 at batch 128), a quarter of LeNet's step;
 * from 8 channels oneDNN's is the faster (16 channels, 3x3: 0.85 ms against 1.7), and stays.
 * With AVX-512 too: on the 2-core AVX-512 EPYC LeNet's took 0.34-0.39 ms against 0.53-0.64 in
 * brg_fwd:avx512_core, and ResNet-50's 7x7 stem (not computed in training) 32 against 92.
 * Images go in chunks of at most RT_WGRAD_COL_FLOATS floats of columns; within an image the
 * additions run in a fixed order (rows, then r, s, c), one thread an image, so the bits are
 * those of the sgemm at the thread count. NETC_CONV=direct leaves it to oneDNN. */
enum { RT_COL2IM_MAX_C = 7 };

static int gemm_data_gradient(const RtConv *c) {
    return c->groups == 1 && c->C <= RT_COL2IM_MAX_C && rt_conv_choice() != RT_CONV_DIRECT;
}

static void gemm_bwd_data(const RtConv *c, const float *dy, const float *w, float *dx) {
    int64_t crs = c->C * c->R * c->S, per_image = c->P * c->Q;
    int64_t chunk = chunk_of(per_image * crs, c->N);
    float *w_krsc = conv_scratch((size_t)(c->K * crs + chunk * per_image * crs)), *dcol = w_krsc + c->K * crs;
    int64_t dims[] = {c->K, c->C, c->R * c->S}; /* [K][C][R·S] -> [K][R·S][C] */
    rt_permute(3, dims, (const int[]){0, 2, 1}, sizeof(float), w, w_krsc);
    for (int64_t n0 = 0; n0 < c->N; n0 += chunk) {
        int64_t n1 = n0 + chunk < c->N ? n0 + chunk : c->N;
        check(dnnl_sgemm('N', 'N', (n1 - n0) * per_image, crs, c->K, 1.0f, dy + n0 * per_image * c->K, c->K, w_krsc,
                         crs, 0.0f, dcol, crs),
              "the data gradient's sgemm");
        #pragma omp parallel for schedule(static)
        for (int64_t n = n0; n < n1; n++) {
            float *img = dx + n * c->H * c->W * c->C;
            memset(img, 0, (size_t)(c->H * c->W * c->C) * sizeof *img);
            for (int64_t pq = 0; pq < per_image; pq++) {
                const float *col = dcol + ((n - n0) * per_image + pq) * crs;
                int64_t h0 = pq / c->Q * c->stride_h - c->pad_h, w0 = pq % c->Q * c->stride_w - c->pad_w;
                for (int64_t r = 0; r < c->R; r++) {
                    int64_t h = h0 + r * c->dil_h;
                    if (h < 0 || h >= c->H) continue;
                    if (c->dil_w == 1) { /* the taps inside the row: S·C floats in a run, in both */
                        int64_t s0 = w0 < 0 ? -w0 : 0, s1 = w0 + c->S > c->W ? c->W - w0 : c->S;
                        float *to = img + (h * c->W + w0 + s0) * c->C;
                        const float *from = col + (r * c->S + s0) * c->C;
                        for (int64_t i = 0; i < (s1 - s0) * c->C; i++) to[i] += from[i];
                        continue;
                    }
                    for (int64_t s = 0; s < c->S; s++) {
                        int64_t x = w0 + s * c->dil_w;
                        if (x < 0 || x >= c->W) continue;
                        float *to = img + (h * c->W + x) * c->C;
                        const float *from = col + (r * c->S + s) * c->C;
                        for (int64_t ch = 0; ch < c->C; ch++) to[ch] += from[ch];
                    }
                }
            }
        }
    }
}

static RtConvPlan *make_plan(const RtConv *c, int kind) {
    init_engine();
    RtConvPlan *p = calloc(1, sizeof *p);
    if (!p) abort();
    if (kind == BWD_WEIGHTS && gemm_weight_gradient(c))                  /* gemm_bwd_filter */
        p->own = openblas_weight_gradient(c) ? IM2COL_OPENBLAS : IM2COL;
    if (kind == BWD_DATA && gemm_data_gradient(c)) p->own = COL2IM;     /* gemm_bwd_data */
    if (winograd(c)) p->own = WINOGRAD;
    if (p->own) return p; /* no primitive */
    MemDesc x = act_md(c->N, c->C, c->H, c->W), y = act_md(c->N, c->K, c->P, c->Q);
    MemDesc w_user = wei_md(c, 0), w_any = wei_md(c, 1);
    Geometry g = geometry(c);
    dnnl_primitive_desc_t hint = conv_pd(FWD, &x, &w_any, &y, &g, NULL);
    dnnl_primitive_desc_t pd = kind == FWD ? hint : conv_pd(kind, &x, &w_any, &y, &g, hint);
    check(dnnl_primitive_create(&p->conv, pd), "primitive creation");
    dnnl_query_t wq = kind == BWD_WEIGHTS ? dnnl_query_diff_weights_md : dnnl_query_weights_md;
    MdRef w_lib = dnnl_primitive_desc_query_md(pd, wq, 0);
    p->act_in = user_mem(md_ref(kind == BWD_DATA ? &y : &x));
    p->act_out = user_mem(md_ref(kind == FWD ? &y : kind == BWD_DATA ? &x : &y));
    p->wei_user = user_mem(md_ref(&w_user));
    if (dnnl_memory_desc_equal(w_lib, md_ref(&w_user))) {
        p->wei_lib = p->wei_user;
    } else { /* a blocked format: reorder once per call, in the right direction */
        check(dnnl_memory_create(&p->wei_lib, w_lib, engine, DNNL_MEMORY_ALLOCATE), "weights buffer");
        MdRef from = kind == BWD_WEIGHTS ? w_lib : md_ref(&w_user), to = kind == BWD_WEIGHTS ? md_ref(&w_user) : w_lib;
        dnnl_primitive_desc_t rpd;
        check(dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, NULL), "weights reorder");
        check(dnnl_primitive_create(&p->reorder, rpd), "weights reorder");
        dnnl_primitive_desc_destroy(rpd);
    }
    if (pd != hint) dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(hint);
    md_free(x), md_free(y), md_free(w_user), md_free(w_any);
    return p;
}

static void run_reorder(RtConvPlan *p, int to_user) {
    if (!p->reorder) return;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, to_user ? p->wei_lib : p->wei_user},
                               {DNNL_ARG_TO, to_user ? p->wei_user : p->wei_lib}};
    check(dnnl_primitive_execute(p->reorder, stream, 2, args), "weights reorder");
}

void rt_conv2d_nhwc_fwd(const RtConv *c, RtConvPlan **plan, const float *x, const float *w, float *y) {
    if (!*plan) *plan = make_plan(c, FWD);
    RtConvPlan *p = *plan;
    if (p->own == WINOGRAD) return rt_winograd_fwd(c, x, w, y, conv_scratch(rt_winograd_scratch(c)));
    dnnl_memory_set_data_handle(p->wei_user, (void *)w);
    dnnl_memory_set_data_handle(p->act_in, (void *)x);
    dnnl_memory_set_data_handle(p->act_out, y);
    run_reorder(p, 0);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->act_in}, {DNNL_ARG_WEIGHTS, p->wei_lib}, {DNNL_ARG_DST, p->act_out}};
    check(dnnl_primitive_execute(p->conv, stream, 3, args), "convolution");
    check(dnnl_stream_wait(stream), "convolution");
}

void rt_conv2d_nhwc_bwd_data(const RtConv *c, RtConvPlan **plan, const float *dy, const float *w, float *dx) {
    if (!*plan) *plan = make_plan(c, BWD_DATA);
    RtConvPlan *p = *plan;
    if (p->own == COL2IM) return gemm_bwd_data(c, dy, w, dx);
    if (p->own == WINOGRAD) return rt_winograd_bwd_data(c, dy, w, dx, conv_scratch(rt_winograd_scratch(c)));
    dnnl_memory_set_data_handle(p->wei_user, (void *)w);
    dnnl_memory_set_data_handle(p->act_in, (void *)dy);
    dnnl_memory_set_data_handle(p->act_out, dx);
    run_reorder(p, 0);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_DIFF_DST, p->act_in}, {DNNL_ARG_WEIGHTS, p->wei_lib},
                               {DNNL_ARG_DIFF_SRC, p->act_out}};
    check(dnnl_primitive_execute(p->conv, stream, 3, args), "convolution backward data");
    check(dnnl_stream_wait(stream), "convolution backward data");
}

void rt_conv2d_nhwc_bwd_filter(const RtConv *c, RtConvPlan **plan, const float *x, const float *dy, float *dw) {
    if (!*plan) *plan = make_plan(c, BWD_WEIGHTS);
    RtConvPlan *p = *plan;
    if (p->own == IM2COL || p->own == IM2COL_OPENBLAS) return gemm_bwd_filter(c, x, dy, dw, p->own == IM2COL_OPENBLAS);
    if (p->own == WINOGRAD) return rt_winograd_bwd_filter(c, x, dy, dw, conv_scratch(rt_winograd_scratch(c)));
    dnnl_memory_set_data_handle(p->act_in, (void *)x);
    dnnl_memory_set_data_handle(p->act_out, (void *)dy);
    dnnl_memory_set_data_handle(p->wei_user, dw);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->act_in}, {DNNL_ARG_DIFF_DST, p->act_out},
                               {DNNL_ARG_DIFF_WEIGHTS, p->wei_lib}};
    check(dnnl_primitive_execute(p->conv, stream, 3, args), "convolution backward weights");
    run_reorder(p, 1);
    check(dnnl_stream_wait(stream), "convolution backward weights");
}

const char *rt_conv_plan_impl(const RtConvPlan *p) {
    const_dnnl_primitive_desc_t pd;
    const char *impl = "?";
    if (p->own)
        return p->own == IM2COL ? "im2col+sgemm" : p->own == IM2COL_OPENBLAS ? "im2col+openblas"
               : p->own == COL2IM ? "sgemm+col2im" : "winograd";
    if (dnnl_primitive_get_primitive_desc(p->conv, &pd) == dnnl_success)
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return impl;
}

void rt_conv_plan_free(RtConvPlan *p) {
    if (!p) return;
    if (p->own) return free(p);
    dnnl_primitive_destroy(p->conv);
    if (p->reorder) dnnl_primitive_destroy(p->reorder);
    if (p->wei_lib != p->wei_user) dnnl_memory_destroy(p->wei_lib);
    dnnl_memory_destroy(p->wei_user);
    dnnl_memory_destroy(p->act_in);
    dnnl_memory_destroy(p->act_out);
    free(p);
}
