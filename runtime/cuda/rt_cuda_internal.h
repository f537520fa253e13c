/* rt_cuda_internal.h - what libnetrt_cuda's files share: the device context and its checks.
 * rt_cuda.c owns RtCuda (device, stream, handles, arena, staging, graphs); rt_cuda_gemm.c and
 * rt_cuda_conv.c build and run library plans through the accessors below.
 */
#ifndef RT_CUDA_INTERNAL_H
#define RT_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cudnn.h>

#include "netrt_cuda.h"

/* Stop the trainer with "error: cuda: WHAT: MESSAGE" (exit status 1) unless the call worked. */
void rt_cuda_check(cudaError_t e, const char *what);
void rt_cuda_check_blas(cublasStatus_t s, const char *what);
void rt_cuda_check_dnn(cudnnStatus_t s, const char *what);
_Noreturn void rt_cuda_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

cublasLtHandle_t rt_cuda_blaslt(RtCuda *cu);
cudnnHandle_t rt_cuda_dnn(RtCuda *cu);
RtCudaMath rt_cuda_math(const RtCuda *cu);
size_t rt_cuda_arena_bytes(const RtCuda *cu); /* the arena at rt_cuda_base */

/* Planning (before any capture) asks for at least `bytes` of shared workspace; the stream runs
 * one library call at a time, so every plan uses the same one. */
void rt_cuda_reserve_workspace(RtCuda *cu, size_t bytes);
/* At run time: the workspace (allocated once planning is over) and its size. */
void *rt_cuda_workspace(const RtCuda *cu, size_t *bytes);

/* A plan that cannot be built for want of device memory: the user's to fix, like an arena that
 * does not fit, so open() fails with this reason (exit status 5) once plan() returns. The
 * first reason is kept. */
void rt_cuda_refuse(RtCuda *cu, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The data type of a product or convolution in messages: "float32", "bf16" or "fp16". */
static inline const char *rt_cuda_dtype_name(RtDtype d) {
    return d == RT_BF16 ? "bf16" : d == RT_F16 ? "fp16" : "float32";
}

/* Plans are kept until the trainer exits; rt_cuda.c frees them all at close. */
void rt_cuda_gemm_plans_free(void);
void rt_cuda_conv_plans_free(void);

#endif
