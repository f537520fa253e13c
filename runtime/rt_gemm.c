/* rt_gemm.c - where rt_gemm (rt_kernels.c) sends a matrix product, and the reference product.
 *
 * By default large products go to oneDNN's sgemm and the others to OpenBLAS, but all to oneDNN
 * where the CPU has AVX2 and not AVX-512, or where OpenBLAS runs kernels older than the CPU;
 * NETC_GEMM overrides the choice
 * (docs/trainer.md, "Matrix products on the CPU"). This file references neither library, so
 * that rt_main can check NETC_GEMM at start-up in every trainer, a GPU trainer (linked without
 * them) included.
 */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rt_internal.h"

extern char *openblas_get_corename(void) __attribute__((weak));

/* OpenBLAS picks its kernels by the CPU's model number, and a model newer than its release gets
 * its oldest generic kernels: 0.3.21 runs Prescott's (SSE3) on an Intel Xeon of family 6 model
 * 207, where the MLP's epoch took 0.80 s against 0.48 s with its SkylakeX kernels or with
 * oneDNN's sgemm, which picks its kernels by the CPU's instruction sets. True when the CPU has
 * AVX2 but OpenBLAS's kernels are none of its AVX2 ones, and OPENBLAS_CORETYPE (the user's own
 * choice of kernels) is unset. */
static int openblas_behind(void) {
    static const char *const avx2_cores[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids",
                                             "excavator"};
    if (!openblas_get_corename || getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_supports("avx2")) return 0;
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof avx2_cores / sizeof *avx2_cores; i++)
        if (strcasecmp(core, avx2_cores[i]) == 0) return 0;
    return 1;
}

int rt_openblas_current(void) { return !openblas_behind(); }

/* With AVX2 and without AVX-512 oneDNN's sgemm is at least as fast as OpenBLAS's on every
 * product rt_gemm is given, the small ones too (the long sums of the convolutions' weight
 * gradients are another matter: rt_dnnl.c): on the 2-core AVX2 EPYC (Zen 3, OpenBLAS 0.3.21 running
 * its Zen kernels, oneDNN 3.2) a LoRA adapter's rank-8 products took 30-80 us in oneDNN against
 * 70-180 us in OpenBLAS, the MLP's and the attention's 64-784 wide ones 0.6-1.0x OpenBLAS's
 * time, and the rank-8 LoRA Llama's step was 5 % faster. With AVX-512 (a 2-core EPYC) OpenBLAS's call cost
 * less on small products, which keep going there (rt_kernels.c, GEMM_DNNL_MIN). */
static int onednn_everywhere(void) {
    return (__builtin_cpu_supports("avx2") && !__builtin_cpu_supports("avx512f")) || openblas_behind();
}

/* The index of environment variable `name`'s value in values[0, n) (values[0], "auto", where it is
 * unset or empty); another value ends the process with status 2, as a bad option, naming them. */
static int env_choice(const char *name, const char *const *values, int n) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    for (int i = 0; i < n; i++)
        if (strcmp(v, values[i]) == 0) return i;
    fprintf(stderr, "error: %s is '%s': expected ", name, v);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", values[i], i + 2 < n ? ", " : i + 1 < n ? " or " : "\n");
    exit(2);
}

static RtGemmRoute route;
static pthread_once_t route_once = PTHREAD_ONCE_INIT;

/* NETC_GEMM: auto (the default: all to oneDNN with AVX2 but not AVX-512, else by size),
 * by-size, onednn or reference. */
static void choose_route(void) {
    static const char *const values[] = {"auto", "by-size", "onednn", "reference"};
    static const RtGemmRoute routes[] = {RT_GEMM_BY_SIZE, RT_GEMM_BY_SIZE, RT_GEMM_ONEDNN, RT_GEMM_REFERENCE};
    int i = env_choice("NETC_GEMM", values, 4);
    route = i == 0 && onednn_everywhere() ? RT_GEMM_ONEDNN : routes[i];
}

RtGemmRoute rt_gemm_route(void) {
    pthread_once(&route_once, choose_route);
    return route;
}

static RtConvChoice conv_choice;
static pthread_once_t conv_once = PTHREAD_ONCE_INIT;

/* NETC_CONV: auto (the default: rt_dnnl.c chooses, Winograd's for every 3x3 convolution it
 * takes), direct (oneDNN's for every one) or winograd (the same as auto, which until December
 * 2026 left AVX-512 CPUs to oneDNN). */
static void choose_conv(void) {
    static const char *const values[] = {"auto", "direct", "winograd"};
    static const RtConvChoice choices[] = {RT_CONV_AUTO, RT_CONV_DIRECT, RT_CONV_AUTO};
    conv_choice = choices[env_choice("NETC_CONV", values, 3)];
}

RtConvChoice rt_conv_choice(void) {
    pthread_once(&conv_once, choose_conv);
    return conv_choice;
}

void rt_gemm_reference(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#pragma omp parallel if (!omp_in_parallel() && M * N * K >= (1 << 20))
    {
        float *a = rt_alloc(sizeof *a * (size_t)K, "a reference matrix product's row");      /* row i of op(A) */
        double *acc = rt_alloc(sizeof *acc * (size_t)N, "a reference matrix product's row"); /* of the result */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            for (int64_t k = 0; k < K; k++) a[k] = trans_a ? A[k * lda + i] : A[i * lda + k];
            if (trans_b) /* a dot product per element, k in order */
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++) s += (double)a[k] * B[j * ldb + k];
                    acc[j] = s;
                }
            else { /* row by row of B: each element's sum still runs over k in order */
                for (int64_t j = 0; j < N; j++) acc[j] = 0;
                for (int64_t k = 0; k < K; k++)
                    for (int64_t j = 0; j < N; j++) acc[j] += (double)a[k] * B[k * ldb + j];
            }
            for (int64_t j = 0; j < N; j++) /* beta 0: C is not read (cblas) */
                C[i * ldc + j] = (float)(alpha * acc[j] + (beta != 0.0f ? (double)beta * C[i * ldc + j] : 0.0));
        }
        free(a), free(acc);
    }
}
