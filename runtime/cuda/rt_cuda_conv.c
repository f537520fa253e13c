/* rt_cuda_conv.c - 2-D convolutions and their two gradients through cuDNN's legacy API.
 *
 * One plan is one direction of one convolution: forward y = conv(x, w), the data gradient dx
 * from (dy, w), or the filter gradient dw from (x, dy). Activations x [N,C,H,W] and y [N,K,P,Q]
 * are NHWC or NCHW in memory as the layout pass decided, and the filter [K, C/groups, R, S] (w
 * or dw) is in the same format: KRSC beside NHWC activations (as PyTorch's channels-last
 * convolutions pass it, and as cuDNN's channels-last kernels want it), KCRS beside NCHW. The
 * parameters and their gradients stay KCRS (PyTorch's layout, so weight files never change):
 * for an NHWC convolution the generated step permutes the weights into a KRSC buffer of the
 * memory plan before the forward convolution (the data gradient reads the same copy) and a KRSC
 * filter gradient back after it - element-wise kernels, fused with the bf16 casts under
 * --precision bf16 (compiler/passes/layout.c, autocast.c). So this file passes every pointer to cuDNN
 * as it is: no copy, no cudnnTransformTensor (deprecated in cuDNN 9, and not documented for
 * bf16). The operation is cross-correlation, as in PyTorch, accumulated in float.
 *
 * Data types. RT_F32: x, w, y CUDNN_DATA_FLOAT. RT_BF16 (netc --precision bf16): all of them
 * CUDNN_DATA_BFLOAT16, while the convolution descriptor's compute type stays CUDNN_DATA_FLOAT -
 * bf16 tensors accumulated in float, the result rounded to bf16 once when it is written. RT_F16
 * (--precision fp16): the same with CUDNN_DATA_HALF (cuDNN's "pseudo-half" configuration:
 * half data, float compute). The
 * alpha and beta of every call stay float: cuDNN takes double scaling factors only for double
 * data.
 *
 * The algorithm is chosen once, at planning. The candidates are cuDNN's heuristic ranking
 * (cudnnGet*Algorithm_v7, which ranks without running anything) and, after it, the algorithm
 * PyTorch's deterministic mode falls back to (IMPLICIT_PRECOMP_GEMM forward, ALGO_1 for both
 * gradients), which cuDNN runs for every geometry. Only algorithms cuDNN reports deterministic
 * are taken: a graph replay and a run without graphs must give the same bits, and the filter
 * gradient's atomic-add algorithms would not. The heuristic's flags are not trusted alone: each
 * candidate must report its workspace, need at most CONV_MAX_WORKSPACE of it, get that much
 * device memory beside the arena, and run once on scratch operands carved from the arena
 * (zeroed again before training); the first that does all four is the plan's.
 *
 * Arithmetic (cudnnMathType_t, set on the convolution descriptor):
 *   RT_MATH_FP32: CUDNN_FMA_MATH, which restricts cuDNN to kernels built on FMA instructions -
 *     no tensor cores, so no TF32. CUDNN_DEFAULT_MATH would not do: for float data on Ampere
 *     and later it permits TF32 tensor-core kernels. Heuristic results marked TENSOR_OP (or
 *     ALLOW_CONVERSION, FP16 down-conversion) are refused; the descriptor stays FMA whatever
 *     math type a result reports, and an algorithm whose workspace query fails with the
 *     descriptors as they will run is passed over.
 *   RT_MATH_TF32: CUDNN_TENSOR_OP_MATH, which permits tensor-core kernels, TF32 for float data,
 *     but no down-conversion to FP16 (that is ALLOW_CONVERSION, refused here too). cuDNN
 *     decides whether a kernel uses tensor cores from the algorithm and the descriptor's math
 *     type together, so the descriptor takes the math type of the result chosen.
 *   bf16 and fp16 data, whatever the RtCudaMath: as RT_MATH_TF32 - CUDNN_TENSOR_OP_MATH asked, tensor-op
 *     (and FMA or default) results accepted, ALLOW_CONVERSION refused, the descriptor taking the
 *     chosen result's math type. CUDNN_FMA_MATH would restrict cuDNN to FMA-instruction kernels,
 *     and its bf16 convolutions are tensor-core kernels. Unlike TF32 for float data, tensor cores
 *     round nothing here: the inputs are already bf16 and the accumulation is float.
 * Only deterministic algorithms are taken for either data type.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_cuda_internal.h"

enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER }; /* the `which` of rt_cuda_conv_plan */

struct RtCudaConvPlan {
    int which;
    const char *what;             /* describe()'s words while planning, for a trial's stop */
    cudnnTensorDescriptor_t x, y; /* x and y (or dx and dy): NHWC or NCHW */
    cudnnFilterDescriptor_t w;    /* w or dw: [K, C/groups, R, S], KRSC (NHWC) or KCRS (NCHW) as x */
    cudnnConvolutionDescriptor_t conv;
    union {
        cudnnConvolutionFwdAlgo_t fwd;
        cudnnConvolutionBwdDataAlgo_t bwd_data;
        cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    } algo;
    RtCudaConvPlan *next; /* every plan, for rt_cuda_conv_plans_free */
};

static RtCudaConvPlan *plans;

/* One heuristic result, whatever the direction. */
typedef struct {
    int algo; /* the direction's cudnnConvolution*Algo_t */
    cudnnStatus_t status;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} Candidate;

/* The cuDNN type of every tensor for `dtype`, and its size in bytes; any dtype but float32,
 * bfloat16 and fp16 is a netc bug. */
static cudnnDataType_t dnn_type(RtDtype dtype, size_t *elem) {
    switch (dtype) {
    case RT_F32: *elem = 4; return CUDNN_DATA_FLOAT;
    case RT_BF16: *elem = 2; return CUDNN_DATA_BFLOAT16;
    case RT_F16: *elem = 2; return CUDNN_DATA_HALF;
    default: rt_cuda_die("internal error: convolution on dtype %d (only float32, bfloat16 and fp16)", (int)dtype);
    }
}

/* The geometry in words, for messages. */
static const char *describe(const RtConv *c, int which, int nhwc, RtDtype dtype) {
    static char buf[512];
    static const char *const dir[] = {"forward", "data gradient", "filter gradient"};
    snprintf(buf, sizeof buf,
             "%s convolution x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] y [%lld,%lld,%lld,%lld] (%s, %s), "
             "stride %dx%d, pad %dx%d, dilation %dx%d, groups %d",
             which >= 0 && which < 3 ? dir[which] : "unknown", (long long)c->N, (long long)c->C, (long long)c->H,
             (long long)c->W, (long long)c->K, (long long)(c->groups > 0 ? c->C / c->groups : c->C),
             (long long)c->R, (long long)c->S, (long long)c->N, (long long)c->K, (long long)c->P,
             (long long)c->Q, nhwc ? "NHWC" : "NCHW", rt_cuda_dtype_name(dtype), c->stride_h,
             c->stride_w, c->pad_h, c->pad_w, c->dil_h, c->dil_w, c->groups);
    return buf;
}

/* Stop on a geometry no correct caller passes, or one cuDNN's int dimensions cannot hold. */
static void check_geometry(const RtConv *c, int which, int nhwc, RtDtype dtype) {
    const int64_t dims[] = {c->N, c->C, c->H, c->W, c->K, c->R, c->S, c->P, c->Q};
    int ok = which >= CONV_FWD && which <= CONV_BWD_FILTER && c->groups >= 1 && c->C % c->groups == 0 &&
             c->K % c->groups == 0 && c->stride_h >= 1 && c->stride_w >= 1 && c->dil_h >= 1 && c->dil_w >= 1 &&
             c->pad_h >= 0 && c->pad_w >= 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) ok = ok && dims[i] >= 1 && dims[i] <= INT_MAX;
    if (!ok) rt_cuda_die("internal error: bad %s", describe(c, which, nhwc, dtype));
}

/* x, y, w and the convolution, of `type`; the filter in the activations' format (KRSC beside
 * NHWC). */
static void make_descriptors(RtCudaConvPlan *p, const RtConv *c, int nhwc, cudnnMathType_t math,
                             cudnnDataType_t type) {
    cudnnTensorFormat_t act = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    rt_cuda_check_dnn(cudnnCreateTensorDescriptor(&p->x), "cudnnCreateTensorDescriptor");
    rt_cuda_check_dnn(cudnnSetTensor4dDescriptor(p->x, act, type, (int)c->N, (int)c->C, (int)c->H,
                                                 (int)c->W),
                      "cudnnSetTensor4dDescriptor(x)");
    rt_cuda_check_dnn(cudnnCreateTensorDescriptor(&p->y), "cudnnCreateTensorDescriptor");
    rt_cuda_check_dnn(cudnnSetTensor4dDescriptor(p->y, act, type, (int)c->N, (int)c->K, (int)c->P,
                                                 (int)c->Q),
                      "cudnnSetTensor4dDescriptor(y)");
    rt_cuda_check_dnn(cudnnCreateFilterDescriptor(&p->w), "cudnnCreateFilterDescriptor");
    rt_cuda_check_dnn(cudnnSetFilter4dDescriptor(p->w, type, act, (int)c->K, (int)(c->C / c->groups),
                                                 (int)c->R, (int)c->S),
                      "cudnnSetFilter4dDescriptor");
    rt_cuda_check_dnn(cudnnCreateConvolutionDescriptor(&p->conv), "cudnnCreateConvolutionDescriptor");
    rt_cuda_check_dnn(cudnnSetConvolution2dDescriptor(p->conv, c->pad_h, c->pad_w, c->stride_h, c->stride_w, c->dil_h,
                                                      c->dil_w, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                      "cudnnSetConvolution2dDescriptor");
    rt_cuda_check_dnn(cudnnSetConvolutionGroupCount(p->conv, c->groups), "cudnnSetConvolutionGroupCount");
    rt_cuda_check_dnn(cudnnSetConvolutionMathType(p->conv, math), "cudnnSetConvolutionMathType");
}

/* cuDNN's heuristic ranking for the plan's direction, best first, into a malloc'd array. */
static Candidate *rank_algorithms(cudnnHandle_t h, const RtCudaConvPlan *p, int *n) {
    int max = 0, got = 0;
    Candidate *out = NULL;
#define RANK(MAXCOUNT, PERF_T, GET, ...)                                                             \
    do {                                                                                            \
        rt_cuda_check_dnn(MAXCOUNT(h, &max), #MAXCOUNT);                                            \
        PERF_T *r = calloc(max > 0 ? (size_t)max : 1, sizeof *r);                                   \
        out = calloc(max > 0 ? (size_t)max : 1, sizeof *out);                                       \
        if (!r || !out) rt_cuda_die("out of host memory while choosing a convolution algorithm");   \
        rt_cuda_check_dnn(GET(h, __VA_ARGS__, max, &got, r), #GET);                                 \
        for (int i = 0; i < got; i++)                                                               \
            out[i] = (Candidate){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType};     \
        free(r);                                                                                    \
    } while (0)
    switch (p->which) {
    case CONV_FWD:
        RANK(cudnnGetConvolutionForwardAlgorithmMaxCount, cudnnConvolutionFwdAlgoPerf_t,
             cudnnGetConvolutionForwardAlgorithm_v7, p->x, p->w, p->conv, p->y);
        break;
    case CONV_BWD_DATA:
        RANK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount, cudnnConvolutionBwdDataAlgoPerf_t,
             cudnnGetConvolutionBackwardDataAlgorithm_v7, p->w, p->y, p->conv, p->x);
        break;
    default:
        RANK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, cudnnConvolutionBwdFilterAlgoPerf_t,
             cudnnGetConvolutionBackwardFilterAlgorithm_v7, p->x, p->y, p->conv, p->w);
        break;
    }
#undef RANK
    *n = got;
    return out;
}

/* The most workspace one convolution may use. cuDNN's fastest algorithms sometimes ask for
 * gigabytes; an algorithm above this is passed over for the next candidate. */
#define CONV_MAX_WORKSPACE ((size_t)1 << 30)

/* PyTorch's deterministic defaults, which cuDNN implements for every geometry: the last
 * candidate of each direction (by `which`). */
static const int fallback_algo[3] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};

/* Store `algo` in the plan and ask cuDNN for its workspace; a status other than success means
 * the algorithm cannot run with these descriptors. */
static cudnnStatus_t try_algorithm(cudnnHandle_t h, RtCudaConvPlan *p, int algo, size_t *bytes) {
    switch (p->which) {
    case CONV_FWD:
        p->algo.fwd = (cudnnConvolutionFwdAlgo_t)algo;
        return cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y, p->algo.fwd, bytes);
    case CONV_BWD_DATA:
        p->algo.bwd_data = (cudnnConvolutionBwdDataAlgo_t)algo;
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv, p->x, p->algo.bwd_data, bytes);
    default:
        p->algo.bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)algo;
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv, p->w, p->algo.bwd_filter,
                                                              bytes);
    }
}

/* Whether a heuristic result may be used at all; `tensor_ops`: tensor-core results are allowed
 * (RT_MATH_TF32, or bf16 data; see the top of the file). */
static int acceptable(const Candidate *k, int tensor_ops) {
    if (k->status != CUDNN_STATUS_SUCCESS || k->determinism != CUDNN_DETERMINISTIC) return 0;
    if (k->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return 0;
    return tensor_ops || k->math == CUDNN_FMA_MATH || k->math == CUDNN_DEFAULT_MATH;
}

/* The plan's algorithm on in0, in1 and out as rt_cuda_conv's. */
static cudnnStatus_t run_algorithm(cudnnHandle_t h, const RtCudaConvPlan *p, const void *in0, const void *in1,
                                   void *out, void *ws, size_t ws_bytes) {
    static const float one = 1.0f, zero = 0.0f; /* float scaling factors for float and bf16 data alike */
    switch (p->which) {
    case CONV_FWD: /* y = conv(x = in0, w = in1) */
        return cudnnConvolutionForward(h, &one, p->x, in0, p->w, in1, p->conv, p->algo.fwd, ws, ws_bytes, &zero, p->y,
                                       out);
    case CONV_BWD_DATA: /* dx from (dy = in0, w = in1) */
        return cudnnConvolutionBackwardData(h, &one, p->w, in1, p->y, in0, p->conv, p->algo.bwd_data, ws, ws_bytes,
                                            &zero, p->x, out);
    default: /* dw from (x = in0, dy = in1) */
        return cudnnConvolutionBackwardFilter(h, &one, p->x, in0, p->y, in1, p->conv, p->algo.bwd_filter, ws,
                                              ws_bytes, &zero, p->w, out);
    }
}

/* Run the plan's algorithm once, before any capture, on scratch operands carved from the start
 * of the arena (x, the filter, y: all three are live together in the step, so the arena holds
 * them; warm_up zeroes it again) with a workspace of its own. Each operand starts on a 256-byte
 * boundary, as cudaMalloc's do, so that an algorithm is not refused (or passed) for the scratch
 * layout's alignment alone. Non-zero, with `why`, when the workspace cannot be had or the
 * algorithm fails; a fault that leaves the GPU unusable (an illegal or misaligned address: a
 * sticky error, no other candidate could run after it) stops the trainer, naming the algorithm. */
static int trial(RtCuda *cu, const RtCudaConvPlan *p, const RtConv *c, size_t elem, size_t ws_bytes, int *no_memory,
                 char *why, size_t size) {
    size_t x = (size_t)(c->N * c->C * c->H * c->W) * elem, y = (size_t)(c->N * c->K * c->P * c->Q) * elem;
    size_t w = (size_t)(c->K * (c->C / c->groups) * c->R * c->S) * elem;
    size_t x_at = 0, w_at = (x + 255) / 256 * 256, y_at = w_at + (w + 255) / 256 * 256;
    unsigned char *base = rt_cuda_base(cu);
    if (y_at + y > rt_cuda_arena_bytes(cu)) /* packed instead: at most 510 bytes more than they need */
        w_at = x, y_at = x + w;
    if (y_at + y > rt_cuda_arena_bytes(cu))
        rt_cuda_die("internal error: a convolution's operands (%zu bytes) exceed the %zu-byte arena", x + w + y,
                    rt_cuda_arena_bytes(cu));
    void *ws = NULL;
    if (ws_bytes && cudaMalloc(&ws, ws_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, size, "its %.1f MiB workspace does not fit beside the arena", ws_bytes / 1048576.0);
        *no_memory = 1;
        return 1;
    }
    /* (x, w) -> y, (y, w) -> x, (x, y) -> w: in0 and out are x or y by direction */
    unsigned char *xp = base + x_at, *wp = base + w_at, *yp = base + y_at;
    void *in0 = p->which == CONV_BWD_DATA ? yp : xp, *in1 = p->which == CONV_BWD_FILTER ? yp : wp;
    void *out = p->which == CONV_FWD ? yp : p->which == CONV_BWD_DATA ? xp : wp;
    cudnnStatus_t st = run_algorithm(rt_cuda_dnn(cu), p, in0, in1, out, ws, ws_bytes);
    cudaError_t e = cudaStreamSynchronize(rt_cuda_stream(cu));
    if (e != cudaSuccess && cudaGetLastError() != cudaSuccess && cudaGetLastError() != cudaSuccess)
        rt_cuda_die("cuDNN's algorithm %d faulted in its trial run of the %s: %s (the GPU is unusable after it)\n"
                    "  hint: a cuDNN or netc bug; please report the convolution above",
                    (int)p->algo.fwd, p->what, cudaGetErrorString(e));
    if (ws)
        rt_cuda_check(cudaFree(ws), "cudaFree (a trial workspace)");
    if (st != CUDNN_STATUS_SUCCESS || e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, size, "it failed when run: %s",
                 st != CUDNN_STATUS_SUCCESS ? cudnnGetErrorString(st) : cudaGetErrorString(e));
        return 1;
    }
    return 0;
}

/* The first acceptable candidate that reports a workspace within CONV_MAX_WORKSPACE and runs;
 * its index, or -1 with the last reason in `why` and *no_memory set when some candidate was
 * passed over only because its workspace did not fit. The plan keeps its algorithm and math. */
static int choose(RtCuda *cu, RtCudaConvPlan *p, const RtConv *c, size_t elem, const Candidate *cand, int n,
                  int tensor_ops, size_t *bytes, int *no_memory, char *why, size_t size) {
    cudnnHandle_t h = rt_cuda_dnn(cu);
    snprintf(why, size, "no candidate is deterministic with the math asked");
    for (int i = 0; i < n; i++) {
        if (!acceptable(&cand[i], tensor_ops)) continue;
        if (tensor_ops)
            rt_cuda_check_dnn(cudnnSetConvolutionMathType(p->conv, cand[i].math), "cudnnSetConvolutionMathType");
        cudnnStatus_t st = try_algorithm(h, p, cand[i].algo, bytes);
        if (st != CUDNN_STATUS_SUCCESS)
            snprintf(why, size, "algorithm %d reports no workspace: %s", cand[i].algo, cudnnGetErrorString(st));
        else if (*bytes > CONV_MAX_WORKSPACE)
            snprintf(why, size, "algorithm %d asks for %.1f MiB of workspace, more than the %zu MiB allowed",
                     cand[i].algo, *bytes / 1048576.0, CONV_MAX_WORKSPACE >> 20);
        else if (!trial(cu, p, c, elem, *bytes, no_memory, why, size))
            return i;
    }
    return -1;
}

RtCudaConvPlan *rt_cuda_conv_plan(RtCuda *cu, const RtConv *c, int which, int nhwc, RtDtype dtype) {
    size_t elem = 0;
    cudnnDataType_t type = dnn_type(dtype, &elem);
    check_geometry(c, which, nhwc, dtype);
    RtCudaMath math = rt_cuda_math(cu);
    /* bf16 and fp16 always take tensor-op math: their kernels are tensor-core kernels (see the top). */
    int tensor_ops = dtype != RT_F32 || math == RT_MATH_TF32;
    cudnnMathType_t asked = tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    RtCudaConvPlan *p = calloc(1, sizeof *p);
    if (!p) rt_cuda_die("out of host memory for a convolution plan");
    p->which = which;
    make_descriptors(p, c, nhwc, asked, type);

    int n_out, k_out, p_out, q_out;
    rt_cuda_check_dnn(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &n_out, &k_out, &p_out, &q_out),
                      "cudnnGetConvolution2dForwardOutputDim");
    if (n_out != c->N || k_out != c->K || p_out != c->P || q_out != c->Q)
        rt_cuda_die("internal error: cuDNN computes y [%d,%d,%d,%d] for the %s", n_out, k_out, p_out, q_out,
                    describe(c, which, nhwc, dtype));

    int n = 0;
    Candidate *ranked = rank_algorithms(rt_cuda_dnn(cu), p, &n);
    /* then the fallback, with the math asked (FMA for float32: it has FMA kernels) */
    Candidate *cand = realloc(ranked, (size_t)(n + 1) * sizeof *cand);
    if (!cand) rt_cuda_die("out of host memory while choosing a convolution algorithm");
    cand[n] = (Candidate){fallback_algo[which], CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, asked};
    size_t bytes = 0;
    char why[256];
    int no_memory = 0;
    p->what = describe(c, which, nhwc, dtype); /* describe's buffer: unchanged until choose returns */
    int chosen = choose(cu, p, c, elem, cand, n + 1, tensor_ops, &bytes, &no_memory, why, sizeof why);
    free(cand);
    if (chosen < 0 && no_memory) { /* open() fails with this, exit status 5 */
        rt_cuda_refuse(cu, "no convolution algorithm for the %s has its workspace: %s",
                       describe(c, which, nhwc, dtype), why);
        bytes = 0;
    } else if (chosen < 0)
        rt_cuda_die("cuDNN has no deterministic %s algorithm that runs the %s (%d ranked, then PyTorch's "
                    "default; the last: %s)\n"
                    "  hint: compile with the other netc --layout (row-major or channels-last): cuDNN's "
                    "algorithms differ by layout",
                    dtype == RT_BF16 ? "BF16" : dtype == RT_F16 ? "FP16" : math == RT_MATH_TF32 ? "TF32" : "FP32",
                    describe(c, which, nhwc, dtype),
                    n, why);
    rt_cuda_reserve_workspace(cu, bytes);

    p->next = plans;
    plans = p;
    return p;
}

void rt_cuda_conv(RtCuda *cu, const RtCudaConvPlan *p, const void *in0, const void *in1, void *out) {
    size_t ws_bytes = 0;
    void *ws = rt_cuda_workspace(cu, &ws_bytes);
    static const char *const what[] = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                       "cudnnConvolutionBackwardFilter"};
    rt_cuda_check_dnn(run_algorithm(rt_cuda_dnn(cu), p, in0, in1, out, ws, ws_bytes), what[p->which]);
}

void rt_cuda_conv_plans_free(void) {
    while (plans) {
        RtCudaConvPlan *p = plans;
        plans = p->next;
        cudnnDestroyTensorDescriptor(p->x);
        cudnnDestroyTensorDescriptor(p->y);
        cudnnDestroyFilterDescriptor(p->w);
        cudnnDestroyConvolutionDescriptor(p->conv);
        free(p);
    }
}
