/* netrt_kernels.cuh - the device functions netc's generated CUDA kernels call.
 *
 * netc hands this header (and rt_devstate.h, rt_bits.h, rt_recipe.h) to NVRTC with every model's
 * generated .cu file.
 * Each generated `extern "C" __global__ void kNN(unsigned char *base)` finds its buffers at
 * constant offsets from `base` and calls one rt_k_* function below with constant geometry, so
 * the functions are inlined and their index arithmetic folds to multiplies and shifts.
 *
 * Everything is deterministic: no atomics, every sum in a fixed order, so a CUDA Graph replay
 * and individual launches give the same bits. The functions compute what the CPU kernels of
 * runtime/rt_kernels.c and runtime/rt_nhwc.c compute, with the same formulas in the same
 * precision; where they sum in a different order (one block of 256 threads per row, a tree
 * across the block) the results can differ from the CPU's in the last bits. A multiply whose
 * product is then added is written __fmul_rn / __dmul_rn, which NVRTC never contracts into an
 * FMA: the CPU build (x86-64, no FMA) rounds the product, so the device rounds it too.
 *
 * Launch shapes (T = the count named; "grid-stride" loops cover any grid):
 *   grid-stride over T         pooling, batch-norm partial and final sums
 *   one block of 256 per row   softmax, cross-entropy, log-softmax, layer and RMS norm (rows
 *                              grid-stride over the blocks; netrt_rows.cuh)
 *   one block of 256 per row   accuracy's counts (rows grid-stride over at most 1024 blocks)
 *   one block of 256           accuracy's total, mean
 *   one block per tile of 256 rows (or keys), a thread each: attention (netrt_attention.cuh)
 * (netrt_index.cuh, included at the end, says its own.)
 */
#ifndef NETRT_KERNELS_CUH
#define NETRT_KERNELS_CUH

// ---- what NVRTC lacks: fixed-width integers, INFINITY, NAN

#if !defined(__CUDACC_RTC__)
#include <stdint.h> /* nvcc and host compilers have it */
#elif !defined(NETRT_HAVE_STDINT) && !defined(_STDINT_H) && !defined(__CLANG_STDINT_H)
#define NETRT_HAVE_STDINT 1
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000) /* the host's quiet NaN */
#endif

enum {
    RT_K_BLOCK = 256,   /* threads of a block-per-row or one-block kernel */
    RT_K_BN_ROWS = 256, /* rows per partial sum of the batch-norm kernels (RT_BN_BLOCK_ROWS) */
    RT_K_NORM_ROWS = 32, /* rows per partial sum of the norms' parameter gradients (RT_NORM_ROWS) */
};

/* Grid-stride loop over [0, T); every thread of every block takes its share. */
#define RT_K_FOR(i, T) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (T); i += (int64_t)gridDim.x * blockDim.x)
/* One block per row: block b takes rows b, b + gridDim.x, ... (uniform across the block). */
#define RT_K_ROWS(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
/* The columns of the block's row that this thread takes. */
#define RT_K_COLS(j, cols) for (int64_t j = threadIdx.x; j < (cols); j += blockDim.x)

// ---- the host's bit-level helpers, bit for bit: the seed mixer, dropout mask, f16/bf16

#include "rt_bits.h"

// ---- the training recipe, as on the host: the learning-rate schedule, the optimizers' updates

#include "rt_recipe.h"

// ---- block reductions (blockDim.x == RT_K_BLOCK; every thread of the block must call)

/* The block's total of v, to every thread. A fixed tree in shared memory: thread t adds
 * t + 128, then t + 64, ..., so the result never depends on timing. */
static __device__ __forceinline__ double rt_block_sum(double v) {
    __shared__ double s[RT_K_BLOCK];
    const unsigned t = threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (unsigned k = RT_K_BLOCK / 2; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    double total = s[0];
    __syncthreads(); /* before a next call overwrites s */
    return total;
}

/* The index of row x[0, cols)'s first maximum as the CPU's scan finds it (best = 0, then each
 * later j with x[j] > x[best]): 0 when x[0] is NaN, else the first index of the largest value
 * that is not NaN (ties between -0 and +0 included, as > sees them). Each thread keeps the first
 * maximum of its columns j = t, t + 256, ...; the fixed tree then keeps the larger value, and
 * of two equal ones the smaller index, which is the scan's answer in any order. To every thread. */
static __device__ __forceinline__ int64_t rt_block_argmax(const float *x, int64_t cols) {
    __shared__ float sv[RT_K_BLOCK];
    __shared__ int64_t si[RT_K_BLOCK]; /* -1: no value that is not NaN */
    const unsigned t = threadIdx.x;
    float bv = 0;
    int64_t bi = -1;
    RT_K_COLS(j, cols) {
        const float v = x[j];
        if (v == v && (bi < 0 || v > bv)) bv = v, bi = j;
    }
    sv[t] = bv, si[t] = bi;
    __syncthreads();
    for (unsigned k = RT_K_BLOCK / 2; k > 0; k >>= 1) {
        if (t < k) {
            const float ov = sv[t + k];
            const int64_t oi = si[t + k];
            if (oi >= 0 && (si[t] < 0 || ov > sv[t] || (ov == sv[t] && oi < si[t]))) sv[t] = ov, si[t] = oi;
        }
        __syncthreads();
    }
    const int64_t best = x[0] != x[0] || si[0] < 0 ? 0 : si[0];
    __syncthreads(); /* before a next call overwrites sv, si */
    return best;
}

/* The block's maximum of v (fmaxf: NaNs are ignored, as the CPU's fmaxf scan), to every thread. */
static __device__ __forceinline__ float rt_block_max(float v) {
    __shared__ float s[RT_K_BLOCK];
    const unsigned t = threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (unsigned k = RT_K_BLOCK / 2; k > 0; k >>= 1) {
        if (t < k) s[t] = fmaxf(s[t], s[t + k]);
        __syncthreads();
    }
    float m = s[0];
    __syncthreads();
    return m;
}

// ---- pooling: one thread per output (forward) or per input (backward, a gather)
//
// The forward takes the CPU's windows in the CPU's order. The backward inverts it without
// atomics: each input element visits the windows that contain it, in the order (i, j) the CPU
// scatters them, and adds the gradient of those whose pick is this element, so the sums are
// the CPU's, bit for bit.

/* Geometry of a 2-D pooling (netrt.h's RtPool): x [N,C,H,W] -> y [N,C,P,Q], logically. */
struct RtKPool {
    int64_t N, C, H, W, P, Q;
    int kh, kw, sh, sw, ph, pw;
};

/* Where element i (in memory order) of a pooling's input (A, B = H, W) or output (A, B = P, Q)
 * lies: its plane coordinates (a, b), and the offsets of its (n, c) plane in x and in y with
 * each plane's row and column strides. Channels-last tensors are [N, A, B, C] in memory. */
struct RtKPoolAt {
    int64_t a, b;           /* row and column in the plane */
    int64_t x0, xrs, xcs;   /* input element (h, w) at x[x0 + h * xrs + w * xcs] */
    int64_t y0, yrs, ycs;   /* output element (i, j) at y[y0 + i * yrs + j * ycs] */
};

static __device__ __forceinline__ RtKPoolAt rt_pool_at(const RtKPool &p, int nhwc, int64_t i, int64_t A, int64_t B) {
    RtKPoolAt at;
    int64_t n, c;
    if (nhwc) {
        c = i % p.C, at.b = i / p.C % B, at.a = i / (p.C * B) % A, n = i / (p.C * B * A);
        at.x0 = n * p.H * p.W * p.C + c, at.xrs = p.W * p.C, at.xcs = p.C;
        at.y0 = n * p.P * p.Q * p.C + c, at.yrs = p.Q * p.C, at.ycs = p.C;
    } else {
        at.b = i % B, at.a = i / B % A, c = i / (A * B) % p.C, n = i / (A * B * p.C);
        at.x0 = (n * p.C + c) * p.H * p.W, at.xrs = p.W, at.xcs = 1;
        at.y0 = (n * p.C + c) * p.P * p.Q, at.yrs = p.Q, at.ycs = 1;
    }
    return at;
}

/* The offset (h * rs + w * cs) in an input plane of the first maximum of window (i, j), or -1
 * when the window lies wholly in the padding: the window's first element, then each later one
 * strictly greater (row by row). The NCHW CPU kernel picks an unpadded 2x2 window's by a tree,
 * max(max(a, b), max(c, d)), which differs from the scan only on NaNs; mirrored for the same
 * bits. rt_maxpool2d_nhwc_bwd always scans. */
static __device__ __forceinline__ int64_t rt_pool_argmax(const RtKPool &p, int nhwc, const float *in, int64_t rs,
                                                         int64_t cs, int64_t i, int64_t j) {
    int64_t h0 = i * p.sh - p.ph, w0 = j * p.sw - p.pw, at = -1;
    if (!nhwc && p.kh == 2 && p.kw == 2 && p.ph == 0 && p.pw == 0) {
        int64_t a = h0 * rs + w0 * cs, b = a + cs, c = a + rs, d = c + cs;
        int64_t ab = in[b] > in[a] ? b : a, cd = in[d] > in[c] ? d : c;
        return in[cd] > in[ab] ? cd : ab;
    }
    float m = -INFINITY;
    for (int r = 0; r < p.kh; r++) {
        int64_t h = h0 + r;
        if (h < 0 || h >= p.H) continue;
        for (int s = 0; s < p.kw; s++) {
            int64_t w = w0 + s, k = h * rs + w * cs;
            if (w >= 0 && w < p.W && (at < 0 || in[k] > m)) m = in[k], at = k;
        }
    }
    return at;
}

/* The windows along one axis that contain input row (or column) h: [*lo, *hi], empty when
 * *lo > *hi. Window i covers rows [i * stride - pad, i * stride - pad + k). */
static __device__ __forceinline__ void rt_pool_span(int64_t h, int k, int stride, int pad, int64_t P, int64_t *lo,
                                                    int64_t *hi) {
    int64_t first = h + pad - k + 1; /* i * stride >= first: the window reaches h */
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    *hi = (h + pad) / stride;      /* i * stride <= h + pad: the window starts at or before h */
    if (*hi > P - 1) *hi = P - 1;
}

/* Max pooling: y = the maximum of each window; -INFINITY for a window wholly in the padding.
 * Grid-stride over the N*C*P*Q outputs. */
static __device__ __forceinline__ void rt_k_maxpool_fwd(RtKPool p, int nhwc, const float *x, float *y) {
    RT_K_FOR(o, p.N * p.C * p.P * p.Q) {
        RtKPoolAt at = rt_pool_at(p, nhwc, o, p.P, p.Q);
        const float *in = x + at.x0;
        if (!nhwc) { /* rt_maxpool2d_fwd: the value at the first maximum */
            int64_t k = rt_pool_argmax(p, 0, in, at.xrs, at.xcs, at.a, at.b);
            y[o] = k < 0 ? -INFINITY : in[k];
            continue;
        }
        float m = -INFINITY; /* rt_maxpool2d_nhwc_fwd: a running maximum from -INFINITY */
        int64_t h0 = at.a * p.sh - p.ph, w0 = at.b * p.sw - p.pw;
        for (int r = 0; r < p.kh; r++) {
            int64_t h = h0 + r;
            if (h < 0 || h >= p.H) continue;
            for (int s = 0; s < p.kw; s++) {
                int64_t w = w0 + s;
                if (w < 0 || w >= p.W) continue;
                float v = in[h * at.xrs + w * at.xcs];
                m = v > m ? v : m;
            }
        }
        y[o] = m;
    }
}

/* dx = the sum of dy over the windows whose first maximum is this element. Grid-stride over
 * the N*C*H*W inputs. */
static __device__ __forceinline__ void rt_k_maxpool_bwd(RtKPool p, int nhwc, const float *x, const float *dy,
                                                        float *dx) {
    RT_K_FOR(e, p.N * p.C * p.H * p.W) {
        RtKPoolAt at = rt_pool_at(p, nhwc, e, p.H, p.W);
        int64_t i0, i1, j0, j1, self = at.a * at.xrs + at.b * at.xcs;
        rt_pool_span(at.a, p.kh, p.sh, p.ph, p.P, &i0, &i1);
        rt_pool_span(at.b, p.kw, p.sw, p.pw, p.Q, &j0, &j1);
        float g = 0;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t j = j0; j <= j1; j++)
                if (rt_pool_argmax(p, nhwc, x + at.x0, at.xrs, at.xcs, i, j) == self)
                    g += dy[at.y0 + i * at.yrs + j * at.ycs];
        dx[e] = g;
    }
}

/* Average pooling, the padding counted (PyTorch's default): y = (sum over the window's
 * elements inside the plane, row by row) * (1 / (kh * kw)). Grid-stride over the outputs. */
static __device__ __forceinline__ void rt_k_avgpool_fwd(RtKPool p, int nhwc, const float *x, float *y) {
    const float scale = __fdiv_rn(1.0f, (float)(p.kh * p.kw));
    RT_K_FOR(o, p.N * p.C * p.P * p.Q) {
        RtKPoolAt at = rt_pool_at(p, nhwc, o, p.P, p.Q);
        const float *in = x + at.x0;
        int64_t h0 = at.a * p.sh - p.ph, w0 = at.b * p.sw - p.pw;
        float s = 0;
        for (int r = 0; r < p.kh; r++) {
            int64_t h = h0 + r;
            if (h < 0 || h >= p.H) continue;
            for (int t = 0; t < p.kw; t++) {
                int64_t w = w0 + t;
                if (w >= 0 && w < p.W) s += in[h * at.xrs + w * at.xcs];
            }
        }
        y[o] = s * scale;
    }
}

/* dx = the sum of dy * (1 / (kh * kw)) over the windows that contain this element. Grid-stride
 * over the inputs. */
static __device__ __forceinline__ void rt_k_avgpool_bwd(RtKPool p, int nhwc, const float *dy, float *dx) {
    const float scale = __fdiv_rn(1.0f, (float)(p.kh * p.kw));
    RT_K_FOR(e, p.N * p.C * p.H * p.W) {
        RtKPoolAt at = rt_pool_at(p, nhwc, e, p.H, p.W);
        int64_t i0, i1, j0, j1;
        rt_pool_span(at.a, p.kh, p.sh, p.ph, p.P, &i0, &i1);
        rt_pool_span(at.b, p.kw, p.sw, p.pw, p.Q, &j0, &j1);
        float g = 0;
        for (int64_t i = i0; i <= i1; i++)
            for (int64_t j = j0; j <= j1; j++) g = __fadd_rn(g, __fmul_rn(dy[at.y0 + i * at.yrs + j * at.ycs], scale));
        dx[e] = g;
    }
}

// ---- softmax, cross-entropy, accuracy, mean: one block per row, or one block
//
// A row's threads take columns t, t + 256, ...; each sums its columns in order in double, and
// rt_block_sum adds the 256 partial sums by its fixed tree. The CPU sums a row left to right,
// so these sums (and what follows from them) can differ from the CPU's in the last bits.

/* Softmax over the last axis: y = exp(x - max) / sum. One block per row. */
static __device__ __forceinline__ void rt_k_softmax_fwd(int64_t rows, int64_t cols, const float *x, float *y) {
    RT_K_ROWS(r, rows) {
        const float *in = x + r * cols;
        float *out = y + r * cols, m = -INFINITY;
        RT_K_COLS(j, cols) m = fmaxf(m, in[j]);
        m = rt_block_max(m);
        double s = 0;
        RT_K_COLS(j, cols) s += out[j] = expf(in[j] - m);
        float inv = (float)(1.0 / rt_block_sum(s));
        RT_K_COLS(j, cols) out[j] *= inv;
    }
}

/* dx = y * (dy - sum(y * dy)). One block per row. */
static __device__ __forceinline__ void rt_k_softmax_bwd(int64_t rows, int64_t cols, const float *y, const float *dy,
                                                        float *dx) {
    RT_K_ROWS(r, rows) {
        const float *yr = y + r * cols, *gr = dy + r * cols;
        double dot = 0;
        RT_K_COLS(j, cols) dot = __dadd_rn(dot, __dmul_rn((double)yr[j], (double)gr[j]));
        float d = (float)rt_block_sum(dot);
        RT_K_COLS(j, cols) dx[r * cols + j] = yr[j] * (gr[j] - d);
    }
}

/* log(sum(exp(x))) of one row of `cols` floats, stable: the row's maximum m, then m + log of
 * the sum of rt_expf(x - m) in double, as rt_kernels.c's. Every thread of the block gets it. */
static __device__ __forceinline__ double rt_row_logsumexp(const float *x, int64_t cols) {
    float m = -INFINITY;
    RT_K_COLS(j, cols) m = fmaxf(m, x[j]);
    m = rt_block_max(m);
    double s = 0;
    RT_K_COLS(j, cols) s += rt_expf(x[j] - m);
    return m + log(rt_block_sum(s));
}

/* Softmax cross-entropy with label smoothing s, as rt_xent_ignore_fwd:
 *   loss[r] = logsumexp(x[r]) - (1 - s) x[r][label[r]] - s mean_j x[r][j],
 * 0 for rows at or after n_valid and rows whose label is `ignore` (RT_K_NO_IGNORE: none). A
 * label outside [0, cols) gives NaN (the device cannot stop the trainer; the host sees a
 * non-finite loss). One block per row. */
#define RT_K_NO_IGNORE ((int64_t)(-9223372036854775807LL - 1)) /* no label is this: rt_k_xent_fwd/bwd */
static __device__ __forceinline__ void rt_k_xent_ignore_fwd(int64_t rows, int64_t cols, const float *logits,
                                                            const int64_t *label, float smoothing, int64_t ignore,
                                                            int64_t n_valid, float *loss) {
    RT_K_ROWS(r, rows) {
        if (r >= n_valid || label[r] == ignore) {
            if (threadIdx.x == 0) loss[r] = 0.0f;
            continue;
        }
        int64_t y = label[r];
        if (y < 0 || y >= cols) { /* the same branch for the whole block */
            if (threadIdx.x == 0) loss[r] = NAN;
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

static __device__ __forceinline__ void rt_k_xent_fwd(int64_t rows, int64_t cols, const float *logits,
                                                     const int64_t *label, float smoothing, int64_t n_valid,
                                                     float *loss) {
    rt_k_xent_ignore_fwd(rows, cols, logits, label, smoothing, RT_K_NO_IGNORE, n_valid, loss);
}

/* dlogits[r][j] = dloss[r] * (softmax(x[r])[j] - target[j]), target = s / cols + (1 - s) at the
 * label, as rt_xent_ignore_bwd; 0 for a row whose label is `ignore`, NaN for one whose label is
 * outside [0, cols). The row's log-sum-exp comes from rt_k_xent_ignore_fwd's loss, as the CPU
 * kernel takes it: loss + (1 - s) x[label] + s mean(x); rows at or after n_valid (loss 0)
 * recompute it. One block per row. */
static __device__ __forceinline__ void rt_k_xent_ignore_bwd(int64_t rows, int64_t cols, const float *logits,
                                                            const int64_t *label, float smoothing, int64_t ignore,
                                                            int64_t n_valid, const float *loss, const float *dloss,
                                                            float *dlogits) {
    const double off = (double)smoothing / (double)cols; /* the smoothed target of every class */
    RT_K_ROWS(r, rows) {
        const float *x = logits + r * cols;
        float *d = dlogits + r * cols;
        int64_t y = label[r];
        if (y == ignore || y < 0 || y >= cols) {
            RT_K_COLS(j, cols) d[j] = y == ignore ? 0.0f : NAN;
            continue;
        }
        double lse;
        if (r < n_valid) {
            double mean = 0;
            if (smoothing != 0) { /* the same branch for the whole block */
                RT_K_COLS(j, cols) mean += x[j];
                mean = __dmul_rn((double)smoothing, rt_block_sum(mean) / (double)cols);
            }
            lse = __dadd_rn(__dadd_rn((double)loss[r], __dmul_rn(1.0 - smoothing, (double)x[y])), mean);
        } else {
            lse = rt_row_logsumexp(x, cols);
        }
        RT_K_COLS(j, cols) {
            double target = off + (j == y ? 1.0 - smoothing : 0.0);
            d[j] = (float)(dloss[r] * ((double)rt_expf((float)((double)x[j] - lse)) - target));
        }
    }
}

static __device__ __forceinline__ void rt_k_xent_bwd(int64_t rows, int64_t cols, const float *logits,
                                                     const int64_t *label, float smoothing, int64_t n_valid,
                                                     const float *loss, const float *dloss, float *dlogits) {
    rt_k_xent_ignore_bwd(rows, cols, logits, label, smoothing, RT_K_NO_IGNORE, n_valid, loss, dloss, dlogits);
}

/* The accuracy in two kernels: the rows among the first n_valid whose label is not `ignore`
 * (RT_K_NO_IGNORE: none) and whose argmax (the first on ties, rt_block_argmax) is the label,
 * counted by a block per row (its columns read side by side) into part[blockIdx.x], one count
 * per block of the grid; then their total into out[0]. Counts of whole rows add exactly in
 * double in any order, so the total is the CPU's, bit for bit. */
static __device__ __forceinline__ void rt_k_accuracy_part(int64_t rows, int64_t cols, const float *logits,
                                                          const int64_t *label, int64_t ignore, int64_t n_valid,
                                                          double *part) {
    const int64_t n = rows < n_valid ? rows : n_valid;
    double correct = 0;
    RT_K_ROWS(r, n) {
        if (label[r] == ignore) continue; /* the same branch for the whole block */
        correct += rt_block_argmax(logits + r * cols, cols) == label[r];
    }
    if (threadIdx.x == 0) part[blockIdx.x] = correct;
}

/* Top-k accuracy's counts (rt_accuracy_top): as rt_k_accuracy_part, a row right when its
 * label's logit is not NaN and fewer than top_k logits rank above it (larger, or equal and
 * earlier), which the block counts over its columns side by side; the counts are whole numbers,
 * so their sum is exact in any order. */
static __device__ __forceinline__ void rt_k_accuracy_top_part(int64_t rows, int64_t cols, const float *logits,
                                                              const int64_t *label, int64_t ignore, int64_t top_k,
                                                              int64_t n_valid, double *part) {
    const int64_t n = rows < n_valid ? rows : n_valid;
    double correct = 0;
    RT_K_ROWS(r, n) {
        const int64_t l = label[r];
        if (l == ignore || l < 0 || l >= cols) continue; /* the same branch for the whole block */
        const float *x = logits + r * cols, xl = x[l];
        if (xl != xl) continue;
        double above = 0;
        RT_K_COLS(j, cols) above += x[j] > xl || (x[j] == xl && j < l);
        correct += rt_block_sum(above) < (double)top_k;
    }
    if (threadIdx.x == 0) part[blockIdx.x] = correct;
}

/* out[0] = the total of part[0, blocks), rt_k_accuracy_part's counts. One block. */
static __device__ __forceinline__ void rt_k_accuracy_total(int64_t blocks, const double *part, float *out) {
    if (blockIdx.x != 0) return;
    double s = 0;
    for (int64_t i = threadIdx.x; i < blocks; i += blockDim.x) s += part[i];
    s = rt_block_sum(s);
    if (threadIdx.x == 0) out[0] = (float)s;
}

/* out[0] = the sum of x[0, count) in double, divided by count when `mean` (as the CPU divides,
 * not multiplied by a reciprocal): a SUM or MEAN of a whole tensor. One block: thread t sums
 * elements t, t + 256, ..., then the block's tree. */
static __device__ __forceinline__ void rt_k_mean(int64_t count, const float *x, int mean, float *out) {
    if (blockIdx.x != 0) return;
    double s = 0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += x[i];
    s = rt_block_sum(s);
    if (threadIdx.x == 0) out[0] = (float)(mean ? s / (double)count : s);
}

// ---- batch norm: per-channel sums over M = N*H*W rows, in fixed blocks of 256 rows
//
// Two kernels: a partial sum of each (block of RT_K_BN_ROWS rows, channel) into part
// [nb, 2, C] doubles (nb = ceil(M / 256)), then a final pass with one thread block per channel
// (ResNet-50 at batch 256 has nb = 12544 partials a channel in its first layer: one thread each
// would run them serially): thread t adds the partials t, t + 256, ... in order, and
// rt_block_sum adds the 256 results by its fixed tree, so the result never depends on timing.
// Each partial is summed row by row, as the channels-last CPU kernels (rt_nhwc.c) sum theirs;
// the CPU then adds the partials in order, and the row-major CPU kernels sum all M rows left
// to right, so the totals can differ from the CPU's in the last bits of the double, which
// rounding to float hides but for rare ties.
//
// The variance: the CPU takes two passes over x (the mean, then the squared deviations from
// it), which a two-kernel scheme cannot, since the mean is known only after every block is
// summed. Instead each block also sums its squared deviations from its own mean (the block is
// read twice, from cache), and the final kernel combines the blocks exactly (Chan et al.):
//   sq = sum_b [ sq_b + n_b (mean_b - mean)^2 ],
// which has no cancellation either (unlike sum x^2 - M mean^2), but rounds differently from the
// CPU's, so the variance can differ from it in the last bits.

/* Element (r, c) of M rows of C channels: x[r * C + c] channels-last, else NCHW planes of HW. */
static __device__ __forceinline__ int64_t rt_bn_at(int nhwc, int64_t C, int64_t HW, int64_t r, int64_t c) {
    return nhwc ? r * C + c : (r / HW * C + c) * HW + r % HW;
}

/* part[b][0][c] = the sum of x over block b's rows, part[b][1][c] = the sum of (x - the block's
 * mean)^2. Grid-stride over the nb*C (block, channel) pairs. */
static __device__ __forceinline__ void rt_k_bn_stats_part(int64_t M, int64_t C, int64_t HW, int nhwc, const float *x,
                                                          double *part) {
    const int64_t nb = (M + RT_K_BN_ROWS - 1) / RT_K_BN_ROWS;
    RT_K_FOR(i, nb * C) {
        int64_t b = i / C, c = i % C, r0 = b * RT_K_BN_ROWS;
        int64_t r1 = r0 + RT_K_BN_ROWS < M ? r0 + RT_K_BN_ROWS : M;
        double s = 0, sq = 0;
        for (int64_t r = r0; r < r1; r++) s += x[rt_bn_at(nhwc, C, HW, r, c)];
        double mean = s / (double)(r1 - r0);
        for (int64_t r = r0; r < r1; r++) {
            double d = (double)x[rt_bn_at(nhwc, C, HW, r, c)] - mean;
            sq = __dadd_rn(sq, __dmul_rn(d, d));
        }
        part[b * 2 * C + c] = s;
        part[b * 2 * C + C + c] = sq;
    }
}

/* stats[0][c] = mean, stats[1][c] = 1 / sqrt(var + eps), as rt_bn_stats. Training: of the
 * batch (biased variance), and running = [running_mean C, running_var C, num_batches_tracked]
 * moves by momentum toward the mean and the unbiased variance (M / (M - 1)); the block of
 * channel 0 counts the batch. Evaluation: from the running statistics, which stay; part is not
 * read. One block per channel. */
static __device__ __forceinline__ void rt_k_bn_stats_final(int64_t M, int64_t C, int64_t nb, const double *part,
                                                           float *stats, double eps, double momentum, float *running,
                                                           int training) {
    float *rmean = running, *rvar = running + C;
    RT_K_ROWS(c, C) {
        if (!training) {
            if (threadIdx.x == 0) {
                stats[c] = rmean[c];
                stats[C + c] = (float)(1.0 / sqrt((double)rvar[c] + eps));
            }
            continue;
        }
        double sum = 0, sq = 0;
        RT_K_COLS(b, nb) sum += part[b * 2 * C + c];
        double mean = rt_block_sum(sum) / (double)M;
        RT_K_COLS(b, nb) {
            int64_t rows = M - b * RT_K_BN_ROWS < RT_K_BN_ROWS ? M - b * RT_K_BN_ROWS : RT_K_BN_ROWS;
            double d = part[b * 2 * C + c] / (double)rows - mean;
            sq = __dadd_rn(sq, __dadd_rn(part[b * 2 * C + C + c], __dmul_rn((double)rows, __dmul_rn(d, d))));
        }
        sq = rt_block_sum(sq);
        if (threadIdx.x != 0) continue;
        double var = sq / (double)M, unbiased = M > 1 ? sq / (double)(M - 1) : var;
        stats[c] = (float)mean;
        stats[C + c] = (float)(1.0 / sqrt(var + eps));
        rmean[c] = (float)__dadd_rn(__dmul_rn(1 - momentum, (double)rmean[c]), __dmul_rn(momentum, mean));
        rvar[c] = (float)__dadd_rn(__dmul_rn(1 - momentum, (double)rvar[c]), __dmul_rn(momentum, unbiased));
        if (c == 0) running[2 * C] += 1; /* num_batches_tracked */
    }
}

/* part[b][0][c] = the sum of dy over block b's rows, part[b][1][c] = the sum of
 * dy * ((x - mean) * invstd), with (mean, invstd) = stats [2, C]. Grid-stride over the nb*C
 * (block, channel) pairs. */
static __device__ __forceinline__ void rt_k_bn_bwd_part(int64_t M, int64_t C, int64_t HW, int nhwc, const float *x,
                                                        const float *stats, const float *dy, double *part) {
    const int64_t nb = (M + RT_K_BN_ROWS - 1) / RT_K_BN_ROWS;
    RT_K_FOR(i, nb * C) {
        int64_t b = i / C, c = i % C, r0 = b * RT_K_BN_ROWS;
        int64_t r1 = r0 + RT_K_BN_ROWS < M ? r0 + RT_K_BN_ROWS : M;
        float mean = stats[c], invstd = stats[C + c];
        double s0 = 0, s1 = 0;
        for (int64_t r = r0; r < r1; r++) {
            int64_t k = rt_bn_at(nhwc, C, HW, r, c);
            s0 += dy[k];
            s1 = __dadd_rn(s1, __dmul_rn((double)dy[k], (double)__fmul_rn(x[k] - mean, invstd)));
        }
        part[b * 2 * C + c] = s0;
        part[b * 2 * C + C + c] = s1;
    }
}

/* sums[j] = (float) the sum over the nb blocks of part[b][j], j < 2C: [sum dy C, sum dy * xhat
 * C], as rt_bn_bwd_sums. One block per sum. */
static __device__ __forceinline__ void rt_k_bn_bwd_final(int64_t C, int64_t nb, const double *part, float *sums) {
    RT_K_ROWS(j, 2 * C) {
        double s = 0;
        RT_K_COLS(b, nb) s += part[b * 2 * C + j];
        s = rt_block_sum(s);
        if (threadIdx.x == 0) sums[j] = (float)s;
    }
}

/* ---- --sync-bn in a distributed trainer: batch norm over every rank's batch, as the CPU
 * trainer's rt_bn_stats_sync and rt_bn_bwd_sums_sync. The double sums below are added over the
 * ranks (rt_cuda_sum_doubles) between these kernels; each ends with a count that the same sum
 * turns into the global batch's rows, or the number of ranks. */

/* sums[j] = the sum over the nb blocks of part[b * stride + j], j < n, and sums[n] = count. One
 * block per sum. */
static __device__ __forceinline__ void rt_k_bn_sync_sums(int64_t n, int64_t stride, int64_t nb, const double *part,
                                                         double count, double *sums) {
    RT_K_ROWS(j, n + 1) {
        if (j == n) { /* the whole block takes this branch */
            if (threadIdx.x == 0) sums[n] = count;
            continue;
        }
        double s = 0;
        RT_K_COLS(b, nb) s += part[b * stride + j];
        s = rt_block_sum(s);
        if (threadIdx.x == 0) sums[j] = s;
    }
}

/* part[b * C + c] = the sum over block b's rows of (x - mean)^2, with the global batch's mean =
 * sums[c] / sums[C] (the sums of x and the rows, over every rank). */
static __device__ __forceinline__ void rt_k_bn_sync_sqdev(int64_t M, int64_t C, int64_t HW, int nhwc, const float *x,
                                                          const double *sums, double *part) {
    const int64_t nb = (M + RT_K_BN_ROWS - 1) / RT_K_BN_ROWS;
    RT_K_FOR(i, nb * C) {
        int64_t b = i / C, c = i % C, r0 = b * RT_K_BN_ROWS;
        int64_t r1 = r0 + RT_K_BN_ROWS < M ? r0 + RT_K_BN_ROWS : M;
        double mean = sums[c] / sums[C], sq = 0;
        for (int64_t r = r0; r < r1; r++) {
            double d = (double)x[rt_bn_at(nhwc, C, HW, r, c)] - mean;
            sq = __dadd_rn(sq, __dmul_rn(d, d));
        }
        part[b * C + c] = sq;
    }
}

/* stats and the running statistics of the global batch: s1 = [sum of x C, rows], s2 = [sum of
 * (x - mean)^2 C, rows], both over every rank (rt_k_bn_stats_final's formulas). */
static __device__ __forceinline__ void rt_k_bn_sync_final(int64_t C, const double *s1, const double *s2, float *stats,
                                                          double eps, double momentum, float *running) {
    float *rmean = running, *rvar = running + C;
    RT_K_FOR(c, C) {
        double M = s1[C], mean = s1[c] / M, var = s2[c] / M, unbiased = M > 1 ? s2[c] / (M - 1) : var;
        stats[c] = (float)mean;
        stats[C + c] = (float)(1.0 / sqrt(var + eps));
        rmean[c] = (float)__dadd_rn(__dmul_rn(1 - momentum, (double)rmean[c]), __dmul_rn(momentum, mean));
        rvar[c] = (float)__dadd_rn(__dmul_rn(1 - momentum, (double)rvar[c]), __dmul_rn(momentum, unbiased));
        if (c == 0) running[2 * C] += 1; /* num_batches_tracked */
    }
}

/* out[j] = (float) (s[j] / s[n]), j < n: the backward sums [sum dy C, sum dy * xhat C] averaged
 * over the ranks (s[n]: the number of ranks). */
static __device__ __forceinline__ void rt_k_bn_sync_mean(int64_t n, const double *s, float *out) {
    RT_K_FOR(j, n) out[j] = (float)(s[j] / s[n]);
}

#include "netrt_views.cuh" /* permute, slice, concat, max along an axis */
// ---- scaled dot-product attention: its own file

#include "netrt_attention.cuh"

// ---- indices and sequences: embedding rows, their gradient, cross-entropy with an ignore index

#include "netrt_index.cuh"

// ---- softmax and log-softmax along any axis, layer norm and RMS norm (per row)

#include "netrt_rows.cuh"

#endif
