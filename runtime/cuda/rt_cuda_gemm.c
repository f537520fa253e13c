/* rt_cuda_gemm.c - row-major matrix products through cuBLASLt, planned once, run many times.
 *
 * The maths. cuBLASLt is column-major, and a row-major matrix X[r,c] with leading dimension ld
 * is, byte for byte, the column-major matrix X^T (c rows, r columns, same ld). So instead of
 *     C = op(A) op(B)                  (row-major, C is M x N)
 * we ask cuBLASLt for its transpose, which has the same memory:
 *     C^T = op(B)^T op(A)^T            (column-major, C^T is N x M)
 * i.e. the cuBLASLt problem is m = N, n = M, k = K with its "A" operand our B and its "B"
 * operand our A. Our B's memory, seen column-major, is B^T when B is stored [K,N] (no trans_b),
 * which is already op(B)^T, so cuBLASLt's transa is N; when B is stored [N,K] (trans_b) the
 * memory reads as op(B) and cuBLASLt must transpose it. The same holds for A and transb.
 *
 * The bias. CUBLASLT_EPILOGUE_BIAS adds a vector whose length is the number of rows of the
 * column-major D (cuBLASLt's m), the same value in every column: D[i,j] += bias[i]. Our D is
 * C^T, whose rows are C's columns, so this is C[j,i] += bias[i], i < N: exactly the row-major
 * bias[N] broadcast over the M rows of C, with no further transposition. The bias batch
 * stride stays 0, so every product of a batch adds the same bias.
 *
 * GELU. CUBLASLT_EPILOGUE_GELU_BIAS applies GELU's tanh approximation after the bias (what
 * PyTorch's addmm with the GELU epilogue documents as approximate="tanh"; the CPU computes the
 * same formula in its own float operations, so the two agree to rounding, not bit for bit).
 * _GELU_AUX_BIAS also writes GELU's input into the aux matrix, a column-major N x M matrix like
 * D: our row-major [M, N] with leading dimension AUX_LD = ldc (cublasLt.h: in elements, a
 * multiple of 8, at least D's rows, N) and batch stride sc (also a multiple of 8), of D's type.
 *
 * Alignment. The heuristic cannot see the operand pointers; unless told otherwise it assumes
 * 256-byte aligned matrices and may pick kernels that need 16-byte aligned (vector) loads. The
 * parameters are one packed buffer and views may start anywhere, so a plan asks for two
 * algorithms: one for operands (and batch strides, and the bias) that are 16-byte aligned, and
 * one that only assumes element alignment (4 bytes for float, 2 for bf16; strides count
 * elements of the plan's size). rt_cuda_gemm picks by the actual pointers - host-side
 * arithmetic, so capture-safe, and the same pointers give the same choice in a graph and
 * without one. Planning fails only when neither exists; a run whose operands are misaligned
 * for the only one found stops with a message rather than handing cuBLASLt a bad algorithm.
 *
 * Arithmetic. RT_MATH_FP32 uses CUBLAS_COMPUTE_32F: the "default" float compute type, which
 * guarantees internal storage at least as precise as float, so it never rounds inputs to TF32
 * (that takes CUBLAS_COMPUTE_32F_FAST_TF32) and never uses the BF16x9 emulation (that takes the
 * _EMULATED_16BFX9 compute type). _PEDANTIC would add nothing we need and excludes kernels.
 * RT_MATH_TF32 uses CUBLAS_COMPUTE_32F_FAST_TF32. cuBLAS gives bitwise-identical results run
 * to run for one algorithm on one GPU model when the workspace is the caller's, which it is.
 *
 * Data types. RT_F32: every matrix CUDA_R_32F, as above. RT_BF16 (netc --precision bf16): A, B,
 * C, D and the bias CUDA_R_16BF, compute CUBLAS_COMPUTE_32F and scale type CUDA_R_32F (alpha and
 * beta stay float), so the products run on bf16 tensor cores and accumulate in float whatever
 * the RtCudaMath; the result is rounded to bf16 once, when D is written. The bias needs no
 * attribute: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE defaults to D's type (cublasLt.h: "Bias vector
 * elements are the same type as the elements of output matrix (Dtype)", exceptions only for
 * IMMA and fp8 kernels), which is float or bf16 exactly as the bias is stored. RT_F16 (netc
 * --precision fp16) is the same with CUDA_R_16F: fp16 tensor cores, float accumulation, the
 * result rounded to fp16 once - to infinity beyond 65504, which is how the step's overflow check
 * (a non-finite gradient norm) sees a loss scale that is too large.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_cuda_internal.h"

/* The most workspace one product may ask for; the heuristic only offers algorithms within it. */
enum { GEMM_MAX_WORKSPACE = 32 << 20 };

enum { ALGO_ANY, ALGO_ALIGNED16 }; /* index into RtGemmPlan.algo */

struct RtGemmPlan {
    cublasLtMatmulDesc_t desc;     /* compute type, transposes, epilogue (and, per run, the bias) */
    cublasLtMatrixLayout_t lt_a;   /* cuBLASLt's A: our B's memory */
    cublasLtMatrixLayout_t lt_b;   /* cuBLASLt's B: our A's memory */
    cublasLtMatrixLayout_t lt_d;   /* C^T, also used for C (beta = 0: never read) */
    cublasLtMatmulAlgo_t algo[2];  /* [ALGO_ANY] element-aligned operands, [ALGO_ALIGNED16] 16-byte */
    int has[2];                    /* the heuristic found algo[i] */
    int64_t sa, sb, sc;            /* batch strides in elements (0 for one product): alignment test */
    size_t elem;                   /* bytes per element: 4 (RT_F32) or 2 (RT_BF16) */
    RtEpilogue epi;
    char shape[160];               /* the product in words, for messages */
    RtGemmPlan *next;              /* every plan, for rt_cuda_gemm_plans_free */
};

static RtGemmPlan *plans;

static void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *v, size_t n,
                     const char *what) {
    rt_cuda_check_blas(cublasLtMatmulDescSetAttribute(d, attr, v, n), what);
}

/* The cuBLASLt type of every matrix (and the bias) for `dtype`, and its size in bytes; any
 * dtype but float32, bfloat16 and fp16 is a netc bug. */
static cudaDataType_t blas_type(RtDtype dtype, size_t *elem) {
    switch (dtype) {
    case RT_F32: *elem = 4; return CUDA_R_32F;
    case RT_BF16: *elem = 2; return CUDA_R_16BF;
    case RT_F16: *elem = 2; return CUDA_R_16F;
    default: rt_cuda_die("internal error: matrix product on dtype %d (only float32, bfloat16 and fp16)", (int)dtype);
    }
}

/* A column-major rows x cols matrix of `type` with leading dimension ld, `batch` of them
 * `stride` elements apart. */
static cublasLtMatrixLayout_t layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch,
                                     int64_t stride) {
    cublasLtMatrixLayout_t l;
    rt_cuda_check_blas(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        rt_cuda_check_blas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                            sizeof count),
                           "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        rt_cuda_check_blas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                            sizeof stride),
                           "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
    return l;
}

/* Ask the heuristic for the best algorithm when every operand is `align`-byte aligned. The
 * heuristic reads the bias pointer's value (never its memory) to learn the bias alignment,
 * so it gets a stand-in with exactly that alignment; rt_cuda_gemm sets the real one. Returns
 * the status; *ws is the algorithm's workspace. */
static cublasStatus_t heuristic(RtCuda *cu, RtGemmPlan *p, uint32_t align, cublasLtMatmulAlgo_t *algo, size_t *ws) {
    const void *stand_in = (const void *)(uintptr_t)align;
    if (p->epi != RT_EPI_NONE)
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in, sizeof stand_in,
                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    if (p->epi == RT_EPI_GELU_AUX_BIAS) /* the aux pointer's alignment too (cublasLt.h) */
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &stand_in, sizeof stand_in,
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    cublasLtMatmulPreference_t pref;
    rt_cuda_check_blas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t max_ws = GEMM_MAX_WORKSPACE;
    rt_cuda_check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                            sizeof max_ws),
                       "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    static const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
        rt_cuda_check_blas(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align),
                           "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    cublasLtMatmulHeuristicResult_t r = {0};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(rt_cuda_blaslt(cu), p->desc, p->lt_a, p->lt_b, p->lt_d,
                                                      p->lt_d, pref, 1, &r, &found);
    rt_cuda_check_blas(cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
    if (s == CUBLAS_STATUS_SUCCESS && (found < 1 || r.state != CUBLAS_STATUS_SUCCESS))
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS) {
        *algo = r.algo;
        *ws = r.workspaceSize;
    }
    return s;
}

static void plan_free(RtGemmPlan *p) {
    cublasLtMatrixLayoutDestroy(p->lt_a);
    cublasLtMatrixLayoutDestroy(p->lt_b);
    cublasLtMatrixLayoutDestroy(p->lt_d);
    cublasLtMatmulDescDestroy(p->desc);
    free(p);
}

/* The plan; where neither alignment has an algorithm, a stop with a message, or when `optional`
 * a note and NULL. */
static RtGemmPlan *make_plan(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                             int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc,
                             RtEpilogue epi, RtDtype dtype, int optional) {
    RtGemmPlan *p = calloc(1, sizeof *p);
    if (!p) rt_cuda_die("out of host memory for a matrix product plan");
    cudaDataType_t type = blas_type(dtype, &p->elem);
    snprintf(p->shape, sizeof p->shape, "C[%lld,%lld] = A%s B%s (K %lld, ld %lld %lld %lld, batch %lld, %s, %s)",
             (long long)M, (long long)N, trans_a ? "^T" : "", trans_b ? "^T" : "", (long long)K, (long long)lda,
             (long long)ldb, (long long)ldc, (long long)batch,
             epi == RT_EPI_NONE ? "no epilogue" : epi == RT_EPI_BIAS ? "+ bias" : epi == RT_EPI_RELU_BIAS ? "relu(+ bias)"
             : epi == RT_EPI_GELU_BIAS ? "gelu(+ bias)" : "gelu(+ bias), aux",
             rt_cuda_dtype_name(dtype));
    /* Arguments no correct caller passes: an internal error, not the user's. */
    if (M < 1 || N < 1 || K < 1 || batch < 1 || batch > INT32_MAX || lda < (trans_a ? M : K) ||
        ldb < (trans_b ? K : N) || ldc < N || epi < RT_EPI_NONE || epi > RT_EPI_GELU_AUX_BIAS ||
        (epi == RT_EPI_GELU_AUX_BIAS && (ldc % 8 || (batch > 1 && sc % 8))))
        rt_cuda_die("internal error: bad matrix product %s (epilogue %d)", p->shape, (int)epi);
    p->sa = batch > 1 ? sa : 0;
    p->sb = batch > 1 ? sb : 0;
    p->sc = batch > 1 ? sc : 0;
    p->epi = epi;

    /* bf16 and fp16 data: float accumulation on tensor cores, whatever the math setting (see the top). */
    cublasComputeType_t compute = dtype == RT_F32 && rt_cuda_math(cu) == RT_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                    : CUBLAS_COMPUTE_32F;
    rt_cuda_check_blas(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    /* cuBLASLt's A is our B: its memory is op(B)^T as stored unless trans_b (see the top). */
    cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof op_lt_a, "cublasLtMatmulDescSetAttribute(TRANSA)");
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof op_lt_b, "cublasLtMatmulDescSetAttribute(TRANSB)");
    cublasLtEpilogue_t e = epi == RT_EPI_BIAS          ? CUBLASLT_EPILOGUE_BIAS
                           : epi == RT_EPI_RELU_BIAS   ? CUBLASLT_EPILOGUE_RELU_BIAS
                           : epi == RT_EPI_GELU_BIAS   ? CUBLASLT_EPILOGUE_GELU_BIAS
                           : epi == RT_EPI_GELU_AUX_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                       : CUBLASLT_EPILOGUE_DEFAULT;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (epi == RT_EPI_GELU_AUX_BIAS) { /* the aux matrix is laid out as D (see the top) */
        int64_t aux_ld = ldc, aux_stride = p->sc;
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld,
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
        if (batch > 1)
            set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride, sizeof aux_stride,
                     "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_BATCH_STRIDE)");
    }
    /* The bias has D's type (float or bf16) by default: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE unset. */

    /* Each layout is the stored row-major matrix read column-major: stored rows become columns. */
    p->lt_a = layout(type, trans_b ? K : N, trans_b ? N : K, ldb, batch, sb);
    p->lt_b = layout(type, trans_a ? M : K, trans_a ? K : M, lda, batch, sa);
    p->lt_d = layout(type, N, M, ldc, batch, sc);

    /* Both alignments, the 16-byte one for speed; either alone is enough to plan (the TF32 and
     * bf16 tensor-core kernels, for one, may all want 16-byte operands). */
    size_t ws[2] = {0, 0};
    cublasStatus_t s[2];
    s[ALGO_ANY] = heuristic(cu, p, (uint32_t)p->elem, &p->algo[ALGO_ANY], &ws[ALGO_ANY]);
    s[ALGO_ALIGNED16] = heuristic(cu, p, 16, &p->algo[ALGO_ALIGNED16], &ws[ALGO_ALIGNED16]);
    for (int i = 0; i < 2; i++) p->has[i] = s[i] == CUBLAS_STATUS_SUCCESS;
    if (!p->has[ALGO_ANY] && !p->has[ALGO_ALIGNED16]) {
        if (!optional)
            rt_cuda_die("cuBLASLt has no algorithm for the matrix product %s within %d MiB of workspace: %s\n"
                        "  hint: this is a netc bug (or a cuBLASLt limit); please report the product above",
                        p->shape, GEMM_MAX_WORKSPACE >> 20, cublasLtGetStatusString(s[ALGO_ANY]));
        fprintf(stderr, "note: cuBLASLt has no algorithm for the matrix product %s (%s); its epilogue runs as a "
                        "kernel of its own\n", p->shape, cublasLtGetStatusString(s[ALGO_ANY]));
        plan_free(p);
        return NULL;
    }
    rt_cuda_reserve_workspace(cu, ws[ALGO_ANY] > ws[ALGO_ALIGNED16] ? ws[ALGO_ANY] : ws[ALGO_ALIGNED16]);

    p->next = plans;
    plans = p;
    return p;
}

RtGemmPlan *rt_cuda_gemm_plan(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                              int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                              int64_t sc, RtEpilogue epi, RtDtype dtype) {
    return make_plan(cu, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, sa, sb, sc, epi, dtype, 0);
}

RtGemmPlan *rt_cuda_gemm_plan_try(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                                  int64_t sc, RtEpilogue epi, RtDtype dtype) {
    return make_plan(cu, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, sa, sb, sc, epi, dtype, 1);
}

/* Whether a matrix at `ptr`, and every one `stride` elements of `elem` bytes after it, is
 * 16-byte aligned. */
static int aligned16(const void *ptr, int64_t stride, size_t elem) {
    return (uintptr_t)ptr % 16 == 0 && (uint64_t)stride * elem % 16 == 0;
}

void rt_cuda_gemm(RtCuda *cu, const RtGemmPlan *p, const void *A, const void *B, void *C, const void *bias, void *aux) {
    if ((p->epi != RT_EPI_NONE) != (bias != NULL) || (p->epi == RT_EPI_GELU_AUX_BIAS) != (aux != NULL))
        rt_cuda_die("internal error: matrix product with epilogue %d run %s a bias and %s an aux matrix", (int)p->epi,
                    bias ? "with" : "without", aux ? "with" : "without");
    /* Setting an attribute only writes host memory: safe while the stream is being captured. */
    if (bias)
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias,
                 "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    if (aux)
        set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux,
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    int aligned = aligned16(A, p->sa, p->elem) && aligned16(B, p->sb, p->elem) && aligned16(C, p->sc, p->elem) &&
                  (!bias || aligned16(bias, 0, p->elem)) && (!aux || aligned16(aux, p->sc, p->elem));
    int which = aligned && p->has[ALGO_ALIGNED16] ? ALGO_ALIGNED16 : ALGO_ANY;
    if (!p->has[which])
        rt_cuda_die("cuBLASLt has no algorithm for the matrix product %s on operands that are not 16-byte "
                    "aligned (A %p, B %p, C %p, bias %p, aux %p)",
                    p->shape, A, B, C, bias, aux);
    size_t ws_bytes = 0;
    void *ws = rt_cuda_workspace(cu, &ws_bytes);
    static const float one = 1.0f, zero = 0.0f; /* scale type CUDA_R_32F for both dtypes */
    rt_cuda_check_blas(cublasLtMatmul(rt_cuda_blaslt(cu), p->desc, &one, B, p->lt_a, A, p->lt_b, &zero, C, p->lt_d,
                                      C, p->lt_d, &p->algo[which], ws, ws_bytes, rt_cuda_stream(cu)),
                       "cublasLtMatmul");
}

void rt_cuda_gemm_plans_free(void) {
    while (plans) {
        RtGemmPlan *p = plans;
        plans = p->next;
        plan_free(p);
    }
}
