/* netrt_cuda.h - libnetrt_cuda, what a trainer built with `netc --backend cuda` links besides
 * libnetrt: the device, its kernels, cuDNN and cuBLASLt plans, and the graph-frozen step.
 *
 * The generated host program describes its device step in one constant RtCudaModel: the kernel
 * images netc compiled with NVRTC, the names of the kernels, where every buffer lives in the one
 * device arena, and three functions - plan (build every library plan), train and eval (enqueue
 * one step's work on the stream). RtModel.device = &rt_cuda_device then makes rt_main run the
 * step on the GPU: rt_cuda_device's hooks open the device before any data is read, capture the
 * training and evaluation steps as CUDA Graphs (unless --no-graph), stage each batch through
 * pinned memory, and read the loss and accuracy sums only at log intervals.
 *
 * Every kernel the generated code launches takes one argument, the device arena's base address;
 * every buffer is at a constant offset from it (the memory plan's), so the launches, the plans
 * and the graph never change after start-up.
 */
#ifndef NETRT_CUDA_H
#define NETRT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "netrt.h"
#include "rt_devstate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The loss scale's part of the device state (netc --precision fp16), set from the host's
 * RtLossScale before the first step and read back into one with the sums. */
static inline void rt_devstate_set_scale(RtDevState *st, const RtLossScale *s) {
    st->loss_scale = (float)s->scale, st->scale_good = s->good, st->scale_interval = s->interval,
    st->skipped_steps = s->skipped;
}
static inline RtLossScale rt_devstate_scale(const RtDevState *st) {
    return (RtLossScale){st->loss_scale, st->scale_good, st->scale_interval, st->skipped_steps};
}

/* The parameters the device keeps in float32: the flat buffer's first values, all but the last
 * RtModel.n_half_params (netc --frozen-half), which rt_half_params rounds into `out`, as the
 * kernels' casts (rt_bits.h) would round them, for the device's half region. */
static inline size_t rt_device_param_floats(const RtModel *m) { return (size_t)(m->n_param_floats - m->n_half_params); }
static inline void rt_half_params(const RtModel *m, const float *params, uint16_t *out) {
    const float *x = params + rt_device_param_floats(m);
    for (int64_t i = 0; i < m->n_half_params; i++)
        out[i] = m->half_params_dtype == RT_BF16 ? rt_f32_to_bf16(x[i]) : rt_f32_to_f16(x[i]);
}

/* One compiled form of the model's kernels: a cubin for one architecture, or PTX that the
 * driver compiles for any architecture at or above `sm`. A table of them (netc's NAME_images.c,
 * `netc_images`) ends with an entry whose `data` is NULL. */
typedef struct RtCudaImage {
    int sm;                    /* 80 = sm_80, 90 = sm_90 */
    int ptx;                   /* 1: PTX text (NUL-terminated), 0: cubin */
    const unsigned char *data;
    size_t size;
} RtCudaImage;

/* Arithmetic of matrix products and convolutions on float32 data. */
typedef enum {
    RT_MATH_FP32, /* full float32: no TF32 tensor cores (what the CPU comparison needs) */
    RT_MATH_TF32, /* float32 storage, TF32 tensor-core products (bf16 products use tensor cores anyway) */
} RtCudaMath;

typedef struct RtCuda RtCuda;

/* The collectives of a distributed trainer's device step (netc --distributed --backend cuda):
 * libnetrt_nccl's rt_cuda_nccl, which only distributed trainers link. */
typedef struct RtCudaColl {
    const char *name; /* "NCCL" */
    /* Once the device is chosen and the stream exists, before planning: join the ranks'
     * communicator (its id from rank 0 through ranks->comm). 0, or non-zero with `why`. Not
     * called for the evaluator of --eval-rank (ranks->comm NULL): its steps' collectives are
     * left out. */
    int (*open)(RtCuda *cu, const RtRanks *ranks, char *why, size_t size);
    /* Wait for `until` (recorded on the stream), or with NULL for all the work queued on the
     * stream, as cudaEventSynchronize or cudaStreamSynchronize, but end the whole job (exit
     * status RT_EXIT_COMM on every rank) when a collective fails or the other ranks do not
     * answer within RtComm.timeout. */
    void (*wait)(RtCuda *cu, cudaEvent_t until, const char *what);
    void (*close)(void);
} RtCudaColl;

extern const RtCudaColl rt_cuda_nccl; /* libnetrt_nccl.a */

typedef struct RtCudaModel {
    const RtCudaImage *images;       /* ends with {.data = NULL}: netc's netc_images */
    const char *const *kernel_names; /* extern "C" names in the images, indexed by the generated enum */
    int n_kernels;
    int64_t device_bytes;            /* the one device allocation (with off_shard: all but the state) */
    int64_t eval_bytes;              /* its first bytes, all that an evaluation step touches (the state,
                                      * batch, parameters, arena and partial sums; the gradients and
                                      * optimizer state lie after): what --eval-async copies */
    int64_t off_params, off_grads, off_optstate, off_state;
    int64_t off_half_params;         /* RtModel.n_half_params values in half (netc --frozen-half) */
    /* netc --shard-optimizer: where the device finds the slices this rank updates (ZeRO-1;
     * rt_shard_slices), written by the runtime at start-up: long long [n_buckets][3] {offset,
     * count, at}, then the slices' floats F. The optimizer state is then [slots][F] floats at
     * off_optstate, after everything else, and device_bytes leaves it out. 0: not sharded. */
    int64_t off_shard;
    int64_t off_batch;               /* the staged batch: RtBatchHeader, then the inputs */
    int64_t batch_bytes;             /* header + inputs: what one pinned staging slot holds */
    int64_t off_input[RT_MAX_INPUTS]; /* each input's offset inside the staged batch */
    RtCudaMath math;
    /* Build every cuDNN/cuBLASLt plan with rt_cuda_gemm_plan / rt_cuda_conv_plan; called once,
     * after the kernels are loaded and the arena is allocated, before any capture. */
    void (*plan)(RtCuda *cu);
    /* Enqueue on rt_cuda_stream(cu), without waiting for anything: forward, backward, metric
     * sums, optimizer (train), or the forward in evaluation mode and its sums (eval). The
     * staged batch is already at off_batch. train's `part` (--accumulate): RT_STEP_SUM adds the
     * batch's gradients to the step's sum at RtDevState.accum_at and stops before the update;
     * RT_STEP_LAST adds that sum to the batch's gradients, divides by K and zeroes it, bucket by
     * bucket before each bucket's mean over the ranks, then updates as RT_STEP_WHOLE does. */
    void (*train)(RtCuda *cu, RtStepPart part);
    void (*eval)(RtCuda *cu);
    /* --predict: the model's output (RtModel.output_rank >= 0) as the evaluation step leaves it,
     * output_bytes at off_output, and output_to_host, which turns those bytes, copied to the
     * host, into float32 in logical row-major order [batch, output_shape...] (from half types,
     * and from a channels-last layout). NULL for a model without an output. */
    int64_t off_output, output_bytes;
    void (*output_to_host)(const void *device_bytes, float *out);
    const RtCudaColl *coll;          /* netc --distributed: the ranks' collectives; else NULL */
} RtCudaModel;

/* The hooks rt_main drives (RtModel.device). The RtModel's `device_model` points at the
 * RtCudaModel. */
extern const RtDevice rt_cuda_device;

/* ---- for the generated step functions */

cudaStream_t rt_cuda_stream(const RtCuda *cu);
unsigned char *rt_cuda_base(const RtCuda *cu); /* the device arena */

const RtModel *rt_cuda_model(const RtCuda *cu);            /* the trainer's model (its buckets) */
const RtCudaModel *rt_cuda_device_model(const RtCuda *cu); /* its device step (offsets) */

/* A distributed trainer's step (libnetrt_nccl), on a second stream that the step's stream
 * forks and joins with events, so a capture takes the collectives into the step's graph:
 *   rt_cuda_sum_start  bucket k's gradients (RtModel.buckets[k] of the gradient buffer) are
 *                      final: start their mean over the ranks, in place, while the backward
 *                      pass goes on;
 *   rt_cuda_sum_join   the step's loss and correct predictions (RtDevState.loss, .correct,
 *                      written by then) summed over the ranks, and the stream waits for every
 *                      collective the step started. */
void rt_cuda_sum_start(RtCuda *cu, int k);
void rt_cuda_sum_join(RtCuda *cu);
/* --shard-optimizer: rank r's gradients of its slices are the mean over the ranks
 * (rt_cuda_sum_start reduces each bucket onto its ranks' slices: NCCL reduces to each slice's
 * rank); after the update, rt_cuda_gather_params hands each rank's updated slices of the
 * parameters to every other (NCCL broadcasts, in place), before the step's stream goes on. */
void rt_cuda_gather_params(RtCuda *cu);
/* --sync-bn: the n doubles at `offset` in the device allocation (a batch norm's sums) summed over
 * the ranks, in place, before the step's stream goes on (the step waits, the host does not). */
void rt_cuda_sum_doubles(RtCuda *cu, int64_t offset, int64_t n);

/* Launch kernel `k` (index into kernel_names) with `grid` blocks of `block` threads and the
 * arena base as its one argument, on the stream. */
void rt_cuda_launch(RtCuda *cu, int k, unsigned grid, unsigned block);
/* The same for a kernel that several nodes share: the base, then *at (rt_devstate.h's RtKAt,
 * copied into the launch, or into the graph when the step is being captured). */
void rt_cuda_launch_at(RtCuda *cu, int k, unsigned grid, unsigned block, const RtKAt *at);

/* A row-major matrix product on the device, cblas semantics, on `dtype` data (RT_F32, or RT_BF16
 * for A, B, C and the bias alike, accumulated in float32 - netc --precision bf16):
 *   C[M,N] = op(A) @ op(B), op = transpose when trans_*, leading dimensions lda, ldb, ldc,
 * `batch` of them at element strides sa, sb, sc (batch 1: strides ignored), then the epilogue:
 *   RT_EPI_NONE           C = A B
 *   RT_EPI_BIAS           C = A B + bias[N] (broadcast over rows)
 *   RT_EPI_RELU_BIAS      C = relu(A B + bias)
 *   RT_EPI_GELU_BIAS      C = gelu_tanh(A B + bias), GELU's tanh approximation (cuBLASLt's GELU;
 *                         the erf form, torch.nn.GELU()'s default, stays a generated kernel)
 *   RT_EPI_GELU_AUX_BIAS  the same, and aux = A B + bias (GELU's input, which its gradient
 *                         reads), laid out as C (ldc, sc); ldc and sc must be multiples of 8
 * Built once (algorithm chosen, workspace reserved) and run as often as wanted; `aux` is NULL but
 * for RT_EPI_GELU_AUX_BIAS. */
typedef enum { RT_EPI_NONE, RT_EPI_BIAS, RT_EPI_RELU_BIAS, RT_EPI_GELU_BIAS, RT_EPI_GELU_AUX_BIAS } RtEpilogue;
typedef struct RtGemmPlan RtGemmPlan;
RtGemmPlan *rt_cuda_gemm_plan(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                              int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                              int64_t sc, RtEpilogue epi, RtDtype dtype);
/* The same, but NULL (and a note on stderr) where cuBLASLt has no algorithm for it, where
 * rt_cuda_gemm_plan stops the trainer: for the GELU epilogues, which the generated code can
 * replace by a plain product and its own kernel. */
RtGemmPlan *rt_cuda_gemm_plan_try(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                                  int64_t sc, RtEpilogue epi, RtDtype dtype);
void rt_cuda_gemm(RtCuda *cu, const RtGemmPlan *p, const void *A, const void *B, void *C, const void *bias, void *aux);

/* A convolution on the device through cuDNN: `which` 0 = forward y = conv(x, w), 1 = data
 * gradient dx from (dy, w), 2 = filter gradient dw from (x, dy); activations NHWC when `nhwc`
 * (else NCHW), and the filter w or dw [K, C/groups, R, S] in the same format: KRSC when `nhwc`
 * (the generated step permutes the parameters, which stay KCRS), KCRS otherwise; every tensor
 * `dtype` (RT_F32, or RT_BF16 accumulated in float32). The algorithm is chosen at planning. */
typedef struct RtCudaConvPlan RtCudaConvPlan;
RtCudaConvPlan *rt_cuda_conv_plan(RtCuda *cu, const RtConv *c, int which, int nhwc, RtDtype dtype);
/* in0, in1: (x, w), (dy, w) or (x, dy) by `which`; out: y, dx or dw (overwritten). */
void rt_cuda_conv(RtCuda *cu, const RtCudaConvPlan *p, const void *in0, const void *in1, void *out);

#ifdef __cplusplus
}
#endif
#endif
