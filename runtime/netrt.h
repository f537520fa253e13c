/* netrt.h - libnetrt, the runtime every generated trainer links.
 *
 * The generated program describes its model in one constant RtModel (inputs, parameters,
 * buffer sizes, training recipe and three step functions) and hands it to rt_main(), which owns
 * everything else: the command line, data loading with a prefetch thread, parameter init,
 * safetensors load/save, the training loop, evaluation, logging.
 *
 * The step functions are generated; they call the library kernels declared at the end of this
 * header (BLAS-backed matrix products, convolutions, pooling, softmax, losses) and run their
 * own generated loops for element-wise work.
 */
#ifndef NETRT_H
#define NETRT_H

#include <stddef.h>
#include <stdint.h>

#include "rt_bits.h"
#include "rt_recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { RT_MAX_RANK = 6, RT_MAX_INPUTS = 16 };
enum { RT_MAX_METRICS = 4 }; /* metrics = [...]: the accuracies a model reports (IR_MAX_METRICS) */

/* Element types; same order as the compiler's IrDtype. */
typedef enum { RT_F32, RT_F16, RT_BF16, RT_I32, RT_I64, RT_U8 } RtDtype;

typedef struct RtInput {
    const char *name;           /* "image" */
    RtDtype dtype;              /* the dtype the step reads; files are converted by value */
    int rank;                   /* per-sample rank (the batch axis is not counted) */
    int64_t shape[RT_MAX_RANK]; /* per-sample shape */
    int64_t classes;            /* class indices (a loss's or metric's labels): each in [0, classes); 0 if not */
} RtInput;

typedef enum { RT_INIT_ZEROS, RT_INIT_ONES, RT_INIT_UNIFORM, RT_INIT_NORMAL, RT_INIT_CONST } RtInit;

typedef struct RtParam {
    const char *name;           /* "fc1.weight": the safetensors / PyTorch state_dict name */
    int rank;
    int64_t shape[RT_MAX_RANK]; /* logical (PyTorch) shape */
    int64_t offset;             /* element offset in RtCtx.params */
    int64_t grad_offset;        /* element offset in RtCtx.grads; -1 when frozen */
    RtInit init;
    float init_a;               /* uniform: bound a of U(-a, a); normal: std; const: the value */
    RtDtype file_dtype;         /* dtype in weight files: RT_F32, or RT_I64 for counters */
    int buffer;                 /* a running statistic (PyTorch buffer): saved, never trained */
} RtParam;

/* One low-rank adapter (train { lora = ... }, docs/language.md "LoRA"): indices in RtModel.params
 * of the dense weight it adapts and of its two factors. */
typedef struct RtAdapter {
    int base;       /* [out, in], or [in, out] when transposed */
    int a, b;       /* lora_A [r, in], lora_B [out, r] */
    int transposed; /* the base is stored [in, out] (Hugging Face's Conv1D): PEFT's fan_in_fan_out */
} RtAdapter;

/* LoRA fine-tuning: y = W x + (alpha / r) B A dropout(x) on the adapted dense layers; every
 * other parameter is frozen. The trainer saves and loads the adapters in PEFT's format
 * (rt_lora.c). */
typedef struct RtLora {
    int r;
    double alpha, dropout;
    int n_targets;
    const char *const *targets; /* PEFT's target_modules, as the train section lists them */
    int n_adapters;
    const RtAdapter *adapters;
} RtLora;

/* Everything one call of a step function reads and writes. */
typedef struct RtCtx {
    void *const *inputs;       /* one batch buffer per model input, in the input's dtype */
    float *params;             /* flat parameter buffer (RtModel.n_param_floats) */
    float *grads;              /* flat gradient buffer (RtModel.n_grad_floats) */
    float *optstate;           /* optimizer state: RtModel.n_state_slots * n_grad_floats */
    unsigned char *arena;      /* activations and temporaries (RtModel.arena_bytes) */
    float *scratch;            /* per-thread scratch for library kernels */
    int64_t scratch_per_thread; /* floats per thread in `scratch` */
    float lr;                  /* learning rate for this step (schedule applied) */
    int64_t step;              /* optimizer steps taken before this one (0 in the first): rt_recipe.h */
    uint64_t seed;             /* per-step seed for dropout masks */
    int64_t n_valid;           /* rows of the batch that hold real samples (eval tail) */
    float loss;                /* out: mean loss over the valid rows */
    float correct[RT_MAX_METRICS]; /* out: each metric's correct predictions among the valid rows */
    const RtOptimParams *hyper; /* the optimizer's hyperparameters (RtModel.hyper, or the command
                                * line's); optimizer_step reads them */
    float *output;             /* eval_step, when not NULL: out, the model's output for the whole
                                * batch, float32 [batch, RtModel.output_shape] row-major */
    double grad_norm;          /* out, with clip_grad_norm: the gradients' global 2-norm before
                                * clipping, set by optimizer_step */
    void *dist;                /* a distributed trainer's reductions in flight (rt_grads_ready), or
                                * NULL: one process */
    const struct RtShard *shard; /* netc --shard-optimizer: the part of the update this rank makes
                                * (optimizer_step reads its gradients there, and optstate is its
                                * state alone); NULL otherwise */
    struct RtPieces *pieces;   /* a layer-wise optimizer's (LAMB's) pieces of the update; NULL for
                                * the others */
    int update_in_backward;    /* in: forward_backward may apply the optimizer's update to the
                                * parameters the backward pass is done with (training steps only,
                                * not --gradcheck); out: it did (the loss was finite), so that
                                * optimizer_step updates only the others */
    /* The trainer's --accumulate K: a step's gradients are summed over K batches. accum holds the
     * sum of its earlier batches' gradients (NULL without it), and micro_left counts the batches
     * after this one: rt_grads_ready sums the buckets over the ranks only in the last (0), after
     * adding accum into them. */
    float *accum;
    int micro_left;
} RtCtx;

/* netc --shard-optimizer (ZeRO-1): the optimizer state is split between the ranks. Rank r owns
 * the r-th of N nearly equal parts of every gradient bucket: a slice of the flat trainable
 * buffer, floats [offset, offset + count). The gradients of its slices, summed over the ranks,
 * lie one slice after another in `grads` (slice k's at floats [at, at + count)), and the
 * optimizer state of its slices the same way in RtCtx.optstate, slot k of the state at
 * optstate[k * floats + at + j]. */
typedef struct RtSlice {
    int64_t offset, count, at;
} RtSlice;

typedef struct RtShard {
    int64_t floats;            /* the slices' floats in all */
    int n_slices;
    const RtSlice *slices;
    float *grads;              /* [floats]: the summed gradients of the slices */
} RtShard;

/* --shard-optimizer: the 2-norm of the whole summed gradient, from every rank's slices (for
 * clip_grad_norm). */
double rt_shard_grad_norm(RtCtx *ctx);

/* A layer-wise optimizer (LAMB, rt_recipe.h) scales each tensor's update by a factor of the
 * tensor's norms. optimizer_step updates the floats this rank updates (all of them, or its
 * shard's slices) in pieces, each inside one trainable tensor and short enough to be a thread's
 * work: parameters [offset, offset + count), gradients and state from `at` (= offset without a
 * shard; the shard's place with one). In a first pass it writes each piece's sums of squares,
 * in double, left to right; rt_piece_norms adds them per tensor in piece order (then over the
 * ranks when sharded) and takes the roots, so the norms are the same bits for any number of
 * threads. */
typedef struct RtPiece {
    int64_t offset, count, at;
    int tensor;                /* the tensor's index among the trainable ones, in flat order */
} RtPiece;

typedef struct RtPieces {
    int n;
    const RtPiece *piece;
    int n_tensors;
    double *sums;              /* [n][2]: per piece, the squares of the parameters and of the
                                * update direction (optimizer_step writes them) */
    double *norms;             /* [n_tensors][2]: per tensor, the two 2-norms (rt_piece_norms) */
} RtPieces;

/* The pieces' sums into the tensors' norms, over every rank when the update is sharded. */
void rt_piece_norms(RtCtx *ctx);

/* A trainer whose step runs on an accelerator (netc --backend cuda) gives rt_main these hooks;
 * rt_main then keeps the command line, data, logging and weight files, and the step functions
 * of RtModel are not called. Nothing here waits for the device unless it says so. */
typedef struct RtModel RtModel;

/* --precision fp16: the dynamic loss scale's state, as torch.cuda.amp.GradScaler keeps it. The
 * device moves it each step (runtime/cuda/rt_devstate.h); the host sets it before the first
 * step, reads it at log intervals and saves it in checkpoints. */
typedef struct RtLossScale {
    double scale;     /* S: the loss gradient's seed (--loss-scale, 65536 by default) */
    int64_t good;     /* finite steps in a row since S last changed */
    int64_t interval; /* S doubles after this many (--loss-scale-interval, 2000 by default) */
    int64_t skipped;  /* steps skipped in the run so far because a gradient overflowed */
} RtLossScale;

typedef struct RtDeviceSums {
    double loss;             /* training loss summed over `steps` steps */
    double correct[RT_MAX_METRICS]; /* each metric's correct predictions summed over them */
    int64_t steps;
    int64_t nonfinite_step;  /* the first step (1-based) whose loss was NaN or Inf, 0 if none */
    double grad_norm;        /* clip_grad_norm: the last step's gradient norm before clipping */
    int nonfinite_grads;     /* loss scaling: nonfinite_step's gradients, not its loss, were not finite
                              * even at the smallest scale */
    RtLossScale scale;       /* loss scaling: the scale after the last step */
} RtDeviceSums;

/* This process's place in its job (netc --distributed; one rank of one for other trainers):
 * its rank, the number of ranks, its rank among those on its machine (which GPU it takes), and
 * the job's collectives (NULL for a trainer that runs as one process, and for the evaluator of
 * --eval-rank, which takes no part in them). */
typedef struct RtRanks {
    int rank, ranks, local_rank;
    const struct RtComm *comm;
} RtRanks;

/* How the trainer runs its device: its options that shape the device's memory and graphs. */
typedef struct RtDeviceOptions {
    int use_graph;  /* 0: --no-graph, each step's work enqueued anew */
    int eval_async; /* --eval-async: a second arena and stream for evaluations */
    int accumulate; /* --accumulate K: batches per optimizer step (1: none) */
} RtDeviceOptions;

/* What one training launch of the device does; with --accumulate K a step is K of them. */
typedef enum {
    RT_STEP_WHOLE, /* the step's one batch: forward, backward, update (K = 1) */
    RT_STEP_SUM,   /* one of its first K - 1 batches: forward, backward, the gradients added to
                    * the step's sum, no update */
    RT_STEP_LAST,  /* its K-th: forward, backward, the sum added in and divided by K, the update */
} RtStepPart;

typedef struct RtDevice {
    const char *name; /* "cuda" */
    /* At start-up, before any data is read: find a usable device (a distributed trainer's
     * rank takes GPU local_rank of its machine's), load the kernels, allocate and plan. Returns
     * 0, or non-zero with the reason (no device, no driver, an architecture the trainer has no
     * kernels for) in `why`. */
    int (*open)(const RtModel *m, const RtRanks *ranks, const RtDeviceOptions *o, char *why, size_t size);
    /* Host parameters and optimizer state to the device, and back (waits). */
    void (*upload)(const float *params, const float *optstate);
    void (*download)(float *params, float *optstate);
    /* The run's constants: steps taken so far, steps per epoch and in the run, the seed; and for
     * a trainer with loss_scaling, or one resuming the checkpoint of such a run, the loss scale's
     * state, whose skipped steps the optimizer leaves out of its count (NULL otherwise). */
    void (*start)(int64_t step, int64_t per_epoch, int64_t total, uint64_t seed, const RtLossScale *scale);
    /* Enqueue one training launch, `part` of a step (RT_STEP_WHOLE without --accumulate), on
     * `batch`, host buffers as rt_gather fills them; returns once the batch is staged, without
     * waiting for the work. */
    void (*train_step)(void *const *batch, RtStepPart part);
    /* Enqueue one evaluation batch with `n_valid` real rows; its loss and accuracy add up on
     * the device. */
    void (*eval_step)(void *const *batch, int64_t n_valid);
    /* The training sums since the last post, without waiting: post_train has the device copy
     * them for the host behind the queued work, and start new ones, and returns at once;
     * take_train returns 1 with the copy once the device has made it, waiting for that when
     * `wait`, else returning 0 while the device is still on the work before it. One post is
     * taken before the next is made. */
    void (*post_train)(void);
    int (*take_train)(RtDeviceSums *s, int wait);
    /* Wait for the queued work and take the evaluation's sums since the last read (`correct`:
     * RT_MAX_METRICS of them). */
    void (*read_eval)(double *loss_sum, double *correct);
    /* --predict: wait for the queued work, and write the model's output of the last evaluation
     * batch into `out` as the CPU trainer's eval_step writes RtCtx.output: float32, logical
     * row-major order, [batch, output_shape...] (rows past that batch's n_valid are padding). */
    void (*read_output)(float *out);
    /* --eval-async (opened with eval_async): an evaluation beside the training steps, on a copy
     * of the parameters in a second arena and stream of the device.
     *   eval_async_begin  copy the parameters as the queued steps leave them, and zero the
     *                     evaluation's sums; returns at once;
     *   eval_async_step   enqueue one evaluation batch of `n_valid` real rows on the second
     *                     stream; returns once the batch is staged;
     *   eval_async_read   wait for the evaluation's batches and take its sums. */
    void (*eval_async_begin)(void);
    void (*eval_async_step)(void *const *batch, int64_t n_valid);
    void (*eval_async_read)(double *loss_sum, double *correct);
    void (*close)(void);
} RtDevice;

/* Rank `rank` of `ranks`: its slice of each of m's gradient buckets (slices[k] of bucket k: the
 * floats [count * rank / ranks, count * (rank + 1) / ranks) of it, `at` its place in the rank's
 * gradients and state); returns the slices' floats in all. What the CPU trainer updates, and
 * what a GPU trainer's device updates (netrt_cuda.h). */
int64_t rt_shard_slices(const RtModel *m, int rank, int ranks, RtSlice *slices);
/* The same as a GPU trainer's device reads them (netrt_cuda.h's off_shard): table[3 * n_buckets
 * + 1] gets {offset, count, at} per bucket, then the floats, which it returns. `ranks` NULL or
 * without a comm (one process, the evaluator of --eval-rank) is one rank: every float. */
int64_t rt_shard_table(const RtModel *m, const RtRanks *ranks, long long *table);

/* ---- data-parallel training (netc --distributed; docs/distributed.md)
 *
 * A distributed trainer runs as one process per rank (mpirun, srun). Every rank holds the whole
 * model; each step's gradients are summed over the ranks in buckets, contiguous ranges of the
 * flat gradient buffer that the generated backward pass hands over with rt_grads_ready() as
 * soon as their last gradient is written, so the sums overlap the rest of the pass. */
typedef struct RtBucket {
    int64_t offset, count;     /* floats of RtCtx.grads */
} RtBucket;

/* The collectives a distributed trainer uses (libnetrt_mpi: rt_comm_mpi). Every call but open,
 * close and the eval_ ones is collective over the training ranks: each makes the same calls in
 * the same order. A wait that gets no answer from the other ranks within the timeout
 * (docs/distributed.md) ends the whole job with a message naming `what`. */
typedef struct RtComm {
    const char *name;          /* "MPI" */
    /* Join the job: this process's rank, the number of training ranks, and its rank among those
     * on its machine. With `eval_rank` (the trainer's --eval-rank) the job's last process is the
     * evaluator (*evaluator = 1; its *rank is the number of training ranks), which the
     * collectives leave out. 0, or non-zero with the reason in `why`. */
    int (*open)(int *argc, char ***argv, int eval_rank, int *rank, int *ranks, int *local_rank, int *evaluator,
                char *why, size_t size);
    /* Start summing x[0 .. n) over the ranks, in place, and return at once. */
    void (*start_sum)(float *x, int64_t n);
    /* Wait for every sum started; returns the seconds spent waiting. */
    double (*wait_sums)(const char *what);
    /* x[0 .. n) summed over the ranks, in place (waits); returns the seconds spent waiting. */
    double (*sum)(double *x, int n, const char *what);
    /* 1 when every rank passed the same value, else 0 (on every rank). */
    int (*agree)(uint64_t v, const char *what);
    /* --shard-optimizer. Start summing x[0 .. sum of counts) over the ranks and leave rank r
     * counts[r] floats of the sum from float sum(counts[0 .. r)) on, in mine; wait_sums waits
     * for it. x is not written. */
    void (*start_sum_scatter)(const float *x, const int *counts, float *mine);
    /* Start filling x: rank r's counts[r] floats from x + displs[r] reach every rank (in place);
     * wait_sums waits for it. */
    void (*start_gather)(float *x, const int *counts, const int *displs);
    /* Rank r's n floats of mine to rank 0, into all (rank r's from all + displs[r]; all is read
     * on rank 0 only) (waits); the seconds spent waiting. */
    double (*gather_root)(const float *mine, int n, float *all, const int *counts, const int *displs,
                          const char *what);
    /* Rank 0's n bytes at x to every rank, in place (waits). */
    void (*share)(void *x, int n, const char *what);
    /* The seconds a wait for the other ranks may last (NETC_DIST_TIMEOUT, default 600). */
    double (*timeout)(void);
    /* --eval-rank, between training rank 0 and the evaluator only:
     *   eval_send    (rank 0) start handing the evaluator n floats of parameters at x to
     *                evaluate for `epoch` (x must stay as it is until eval_result returns 1),
     *                and return at once; or, with x NULL, say that training is over and ended
     *                with exit status `epoch` (waits);
     *   eval_result  (rank 0) 1 with the evaluator's n sums and their epoch once that evaluation
     *                has ended, else 0: waits for it when `wait`; moves the hand-over on;
     *   eval_next    (the evaluator) 1 with the next parameters in x and their epoch in *epoch
     *                (waits, for as long as training takes); or 0 when training is over, with
     *                its exit status in *epoch;
     *   eval_reply   (the evaluator) the evaluation's n sums (n <= 7) to rank 0. */
    void (*eval_send)(const float *x, int64_t n, int64_t epoch);
    int (*eval_result)(double *sums, int n, int64_t *epoch, int wait);
    int (*eval_next)(float *x, int64_t n, int64_t *epoch);
    void (*eval_reply)(const double *sums, int n, int64_t epoch);
    /* Leave the job: status 0 (or one every rank reached together, `together`) finishes it
     * normally; any other ends every rank's process at once with that status. */
    void (*close)(int status, int together);
} RtComm;

extern const RtComm rt_comm_mpi; /* libnetrt_mpi.a */

/* The exit status of a rank that ends its job because the others did not answer or a collective
 * failed (docs/trainer.md). */
enum { RT_EXIT_COMM = 6 };

/* Called by a distributed trainer's generated backward pass once every gradient of bucket k
 * (RtModel.buckets[k]) is final: starts its sum over the ranks. Nothing when ctx->dist is NULL. */
void rt_grads_ready(RtCtx *ctx, int k);

typedef struct RtModel {
    const char *name;          /* model name from the .net file */
    const char *source;        /* path of the .net file */
    int64_t batch;
    int n_inputs;
    const RtInput *inputs;
    int n_params;
    const RtParam *params;
    int64_t n_param_floats;    /* trainable parameters first, then frozen ones */
    int64_t n_grad_floats;     /* = trainable parameter floats; grads[i] belongs to params[i] */
    int n_state_slots;         /* optimizer state per trainable float: SGD+momentum 1, AdamW 2 */
    int accumulate;            /* accumulate = K in the train section: batches per optimizer step, the
                                * trainer's --accumulate default (0: one) */
    /* netc --frozen-half: the flat buffer's last n_half_params values are frozen parameters that
     * the device keeps in half_params_dtype (RT_BF16 or RT_F16), rounded from these float32 ones
     * when they are uploaded; the host's float32 values stay what files are written from */
    int64_t n_half_params;
    RtDtype half_params_dtype;
    int64_t arena_bytes;
    int64_t scratch_per_thread; /* floats */
    RtOptimKind optim;         /* a row of rt_recipe.h's table of optimizers */
    RtSchedule schedule;
    int64_t epochs;
    int64_t eval_every;        /* epochs */
    int64_t eval_every_steps;  /* eval_every_steps = N: evaluations every N optimizer steps instead (0: by epochs) */
    int64_t log_every;         /* steps */
    int has_accuracy;
    int n_metrics;             /* accuracies reported (metrics = [...]), 1 to RT_MAX_METRICS with has_accuracy */
    int metric_top_k[RT_MAX_METRICS]; /* each one's top_k (1 or 0: the arg-max), which the logs name */
    const char *loss_name;     /* the loss's built-in: "cross_entropy", "mse", ..., or "expression" */
    /* The model's output, the value its loss function reads first (the logits): per-sample
     * rank (-1 when the loss is written without a loss function) and shape, and a bit per
     * input it depends on (the others, such as labels, are not needed to compute it). */
    int output_rank;
    int64_t output_shape[RT_MAX_RANK];
    uint32_t output_inputs;
    RtOptimParams hyper;       /* the optimizer's hyperparameters as the .net gives them; a CPU
                                * trainer's optimizer_step reads them through RtCtx.hyper */
    /* forward + backward: sets ctx->loss, ctx->correct and fills ctx->grads (overwrites) */
    void (*forward_backward)(RtCtx *ctx);
    /* one optimizer update of ctx->params from ctx->grads at ctx->lr, ctx->step */
    void (*optimizer_step)(RtCtx *ctx);
    /* forward in evaluation mode (dropout off): sets ctx->loss and ctx->correct */
    void (*eval_step)(RtCtx *ctx);
    /* NULL for a CPU trainer; else the step runs on this device (see RtDevice) */
    const RtDevice *device;
    const void *device_model; /* the backend's own description of the device step */
    int64_t steps;             /* steps = N in the train section: the run's optimizer steps instead
                                * of `epochs` whole epochs (0: not given) */
    double clip_grad_norm;     /* clip_grad_norm = C: the gradients' global norm is clipped to C
                                * before each update (0: off) */
    double target_accuracy;    /* target_accuracy = A: training stops after the first evaluation whose
                                * first metric reaches A (0: none; rt_target.c) */
    double target_loss;        /* target_loss = L: ... whose loss is at most L (when has_target_loss) */
    int has_target_loss;
    int loss_scaling;          /* netc --precision fp16: the device keeps a dynamic loss scale
                                * (RtLossScale), which the trainer logs and checkpoints */
    /* netc --distributed: the collectives and the gradient buckets; NULL and 0 for a trainer
     * that runs as one process */
    const RtComm *comm;
    int n_buckets;
    const RtBucket *buckets;
    int shard_optimizer;       /* netc --shard-optimizer: optimizer_step updates ctx->shard's slices */
    const RtLora *lora;        /* train { lora = ... }: the adapters; NULL when the model has none */
    /* accuracy(logits, labels, ignore_index = I): the accuracy is the correct predictions over the
     * positions counted, those of input metric_input whose label is not metric_ignore, which the
     * trainer counts in each batch (masked-LM accuracy); without it (metric_counts 0), over the
     * samples */
    int metric_counts;
    int metric_input;
    int64_t metric_ignore;
    /* netc --profile: forward_backward marks the end of each of its n_prof_sites pieces
     * (rt_prof_mark), and the trainer prints where the step's time went; 0 and NULL otherwise */
    int n_prof_sites;
    const struct RtProfSite *prof_sites;
} RtModel;

/* netc --profile (rt_prof.c): one piece of a CPU trainer's forward_backward, the code of one
 * node of the step or of one fused group. */
typedef struct RtProfSite {
    const char *what; /* the operator ("conv2d_bwd_filter") or the fused group ("fused add+relu") */
    const char *file; /* the .net file of the expression it came from ("" if none) */
    int line;         /* and its line (0 if none) */
    double flops;     /* twice its multiply-adds: products, convolutions, attention's forward; else 0 */
} RtProfSite;
/* Called by a profiled forward_backward: at its start, and after each piece with its site. */
void rt_prof_start(void);
void rt_prof_mark(int site);

/* The x86-64 level this runtime was compiled for (rt_cpu.c): 1 (x86-64), 3 (x86-64-v3: AVX2,
 * FMA) or 4 (x86-64-v4: AVX-512); a trainer of level 3 or 4 checks the CPU before main. */
extern const int rt_cpu_level;
/* "x86-64", "x86-64-v3" or "x86-64-v4" */
const char *rt_cpu_level_name(int level);
/* 0 when this CPU runs code of `level`; else 1, with the features it lacks in buf (" avx2 fma") */
int rt_cpu_missing(int level, char *buf, size_t size);
/* The highest level this CPU runs: 4, 3 or 1. */
int rt_cpu_host_level(void);

/* The trainer's main(): parses the command line (see docs/trainer.md) and runs. */
int rt_main(int argc, char **argv, const RtModel *model);

/* ---- library kernels called by generated steps (all float32, row-major logical layouts) */

/* The 2-norm of g[0 .. n), for clip_grad_norm (rt_clip.c): squares summed in double over a
 * fixed partition of blocks, the blocks' sums added in order, whatever the number of threads. */
double rt_grad_norm(const float *g, int64_t n);
/* Its square: the sum before the square root. */
double rt_grad_sumsq(const float *g, int64_t n);

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, op = transpose when trans_* (cblas semantics). */
void rt_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
             int64_t ldc);
/* rt_gemm without a library, what it runs under NETC_GEMM=reference (docs/trainer.md): each
 * element of C one sum over k in increasing order, in double, rounded once to float (beta 0:
 * C is not read). An element's bits then depend on its operands alone, whatever the product's
 * shape, its split into calls, the thread count or the CPU, which no BLAS promises: two trainers
 * that split a product differently (the CPU's blocks of rows or columns for an epilogue, the
 * emulated GPU trainer's whole products) compute the same bits by construction (tests/cuda/emu). */
void rt_gemm_reference(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* Geometry of one 2-D convolution: x [N,C,H,W], w [K,C/groups,R,S], y [N,K,P,Q]. */
typedef struct RtConv {
    int64_t N, C, H, W, K, R, S, P, Q;
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
} RtConv;
/* Floats of per-thread scratch the three convolution kernels need for this geometry: the
 * im2col matrix of one sample and one group, plus a private weight-gradient accumulator.
 * The compiler sizes RtModel.scratch_per_thread with this same function. */
static inline int64_t rt_conv2d_scratch(const RtConv *c) {
    int64_t cg = c->C / c->groups;
    return cg * c->R * c->S * c->P * c->Q + c->K * cg * c->R * c->S;
}
void rt_conv2d_fwd(const RtConv *c, const float *x, const float *w, float *y, float *scratch,
                   int64_t scratch_per_thread);
void rt_conv2d_bwd_data(const RtConv *c, const float *dy, const float *w, float *dx,
                        float *scratch, int64_t scratch_per_thread);
void rt_conv2d_bwd_filter(const RtConv *c, const float *x, const float *dy, float *dw,
                          float *scratch, int64_t scratch_per_thread);

/* The same three convolutions on channels-last (NHWC) activations through oneDNN; weights stay
 * [K, C/groups, R, S]. `plan` points at a caller-owned slot (NULL at first): the first call
 * builds the primitive for this geometry there, later calls reuse it. */
typedef struct RtConvPlan RtConvPlan;
void rt_conv2d_nhwc_fwd(const RtConv *c, RtConvPlan **plan, const float *x, const float *w, float *y);
void rt_conv2d_nhwc_bwd_data(const RtConv *c, RtConvPlan **plan, const float *dy, const float *w, float *dx);
void rt_conv2d_nhwc_bwd_filter(const RtConv *c, RtConvPlan **plan, const float *x, const float *dy, float *dw);
/* The oneDNN implementation a plan runs, as oneDNN names it ("jit:avx2", "brgconv:avx512_core"). */
const char *rt_conv_plan_impl(const RtConvPlan *p);
/* A plan's primitives and buffers (a trainer keeps its plans until it exits). */
void rt_conv_plan_free(RtConvPlan *p);

/* Geometry of a 2-D pooling: x [N,C,H,W] -> y [N,C,P,Q]. */
typedef struct RtPool {
    int64_t N, C, H, W, P, Q;
    int kh, kw, stride_h, stride_w, pad_h, pad_w;
} RtPool;
void rt_maxpool2d_fwd(const RtPool *p, const float *x, float *y);
void rt_maxpool2d_bwd(const RtPool *p, const float *x, const float *dy, float *dx);
void rt_avgpool2d_fwd(const RtPool *p, const float *x, float *y);
void rt_avgpool2d_bwd(const RtPool *p, const float *dy, float *dx);

/* The same poolings on channels-last tensors: x [N,H,W,C] -> y [N,P,Q,C] in memory. */
void rt_maxpool2d_nhwc_fwd(const RtPool *p, const float *x, float *y);
void rt_maxpool2d_nhwc_bwd(const RtPool *p, const float *x, const float *dy, float *dx);
void rt_avgpool2d_nhwc_fwd(const RtPool *p, const float *x, float *y);
void rt_avgpool2d_nhwc_bwd(const RtPool *p, const float *dy, float *dx);

/* ---- copies and reductions along axes (rt_views.c); the copies move elements of `elem`
 * bytes, reductions are float32. A tensor seen along one axis is [outer, n, inner]. */
/* y = x with its axes permuted: output axis i is input axis perm[i]; dims are x's. */
void rt_permute(int rank, const int64_t *dims, const int *perm, int64_t elem, const void *x, void *y);
/* y [outer, n_out, inner] = x [outer, n_in, inner][:, start : start + n_out, :] */
void rt_slice(int64_t outer, int64_t n_in, int64_t n_out, int64_t inner, int64_t start, int64_t elem,
              const void *x, void *y);
/* dx [outer, n_full, inner]: zeros, with dy [outer, n_part, inner] at start along the axis */
void rt_slice_bwd(int64_t outer, int64_t n_full, int64_t n_part, int64_t inner, int64_t start, int64_t elem,
                  const void *dy, void *dx);
/* y [outer, na + nb, inner] = a [outer, na, inner] then b [outer, nb, inner] along the axis */
void rt_concat(int64_t outer, int64_t na, int64_t nb, int64_t inner, int64_t elem, const void *a, const void *b,
               void *y);
/* y [outer, 1, inner] = the maximum of x [outer, n, inner] along the axis; the gradient puts
 * dy at the first maximal element and zeros elsewhere. */
void rt_max_axis(int64_t outer, int64_t n, int64_t inner, const float *x, float *y);
void rt_max_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *x, const float *dy, float *dx);

/* Softmax over the last axis of a [rows, cols] matrix. */
void rt_softmax_fwd(int64_t rows, int64_t cols, const float *x, float *y);
void rt_softmax_bwd(int64_t rows, int64_t cols, const float *y, const float *dy, float *dx);
/* rt_rows.c: softmax and log-softmax along the middle axis of [outer, n, inner] (inner = 1: the
 * last axis), and layer norm and RMS norm over the last axis D of [rows, D]. */
void rt_softmax_axis_fwd(int64_t outer, int64_t n, int64_t inner, const float *x, float *y);
void rt_softmax_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *y, const float *dy, float *dx);
/* y = x - max - log(sum(exp(x - max))); dx = dy - exp(y) * sum(dy). */
void rt_log_softmax_fwd(int64_t outer, int64_t n, int64_t inner, const float *x, float *y);
void rt_log_softmax_bwd(int64_t outer, int64_t n, int64_t inner, const float *y, const float *dy, float *dx);
/* torch.nn.LayerNorm(D, eps): (x - mean) / sqrt(var + eps) * w + b (biased variance). */
void rt_layernorm_fwd(int64_t rows, int64_t D, const float *x, const float *w, const float *b, double eps, float *y);
/* LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * w. */
void rt_rmsnorm_fwd(int64_t rows, int64_t D, const float *x, const float *w, double eps, float *y);
/* The gradient of layer norm (rms = 0) or RMS norm (rms = 1) in one pass over x and dy, the row
 * statistics recomputed from x: dx (NULL: not wanted; then w may be NULL too) and the parameter
 * gradients `params` (NULL: not wanted): params[j] = sum over rows of dy * xhat, and for layer
 * norm params[D + j] = sum of dy, each summed in double over fixed blocks of RT_NORM_ROWS rows in
 * order, then the blocks in order (the device's partial and final sums alike). */
enum { RT_NORM_ROWS = 32 };
void rt_norm_bwd(int64_t rows, int64_t D, int rms, const float *x, const float *w, const float *dy, double eps,
                 float *dx, float *params);
/* Per-row softmax cross-entropy with label smoothing s (PyTorch's label_smoothing):
 * loss[r] = logsumexp(x[r]) - (1 - s) x[r][label[r]] - s mean_j x[r][j].
 * Rows at or after n_valid get loss 0. A label outside [0, cols) aborts with a message.
 * The gradient dloss[r] * (softmax(x[r]) - target) takes the rows' log-sum-exp from `loss`
 * (rt_xent_fwd's, for the same logits, labels and n_valid) and may be written over the logits
 * (dlogits == logits). */
void rt_xent_fwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label,
                 float smoothing, int64_t n_valid, float *loss);
void rt_xent_bwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label,
                 float smoothing, int64_t n_valid, const float *loss, const float *dloss, float *dlogits);

/* rt_index.c: embedding rows and the cross-entropy of sequences.
 * out[t] = table[idx[t]] for t < n, rows of dim floats; an index outside [0, num) stops the
 * trainer with a message naming `what`, the position within its sample (per_sample indices
 * each) and the value. */
void rt_gather_rows(int64_t n, int64_t num, int64_t dim, const float *table, const int64_t *idx, float *out,
               int64_t per_sample, const char *what);
/* dtable [num, dim] = sum over t with idx[t] == k of dy[t]: each thread owns a block of table
 * rows and adds in t order, so the result does not depend on the number of threads. */
void rt_gather_rows_bwd(int64_t n, int64_t num, int64_t dim, const int64_t *idx, const float *dy, float *dtable);
/* The rows whose label counts, for the products that skip the others (netc's ignored_rows.c):
 * rt_row_order writes order[0 .. rows), the positions r of the labels that are not `ignore` in
 * increasing order, then the others in increasing order. rt_row_compact writes out [rows, cols]:
 * row i is x's row order[i] for i below the count of labels that are not `ignore`, then zeros;
 * out may be x itself (each row is read before it is written). */
void rt_row_order(int64_t rows, const int64_t *label, int64_t ignore, int64_t *order);
void rt_row_compact(int64_t rows, int64_t cols, const float *x, const int64_t *order, const int64_t *label,
                    int64_t ignore, float *out);
/* rt_gemm with beta 0 as if A's stored rows (op(A)'s rows, or its columns under trans_a) past
 * the first n were zeros, n the count of label[0 .. A's rows) that are not `ignore`: C's rows
 * past n are 0, or under trans_a the product sums over n of them. */
void rt_gemm_rows(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float *C, int64_t ldc, const int64_t *label, int64_t ignore);
/* rt_xent_fwd/bwd where a row whose label is `ignore` gives loss 0 and gradient 0; other labels
 * outside [0, cols) abort with a message. */
void rt_xent_ignore_fwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                        int64_t ignore, int64_t n_valid, float *loss);
void rt_xent_ignore_bwd(int64_t rows, int64_t cols, const float *logits, const int64_t *label, float smoothing,
                        int64_t ignore, int64_t n_valid, const float *loss, const float *dloss, float *dlogits);

/* Batch-norm statistics of x [N, C, HW] (row-major): stats[0][c] = mean, stats[1][c] =
 * 1/sqrt(var + eps). Training: of this batch (biased variance), then running_mean/var (at
 * `running`, followed by running_var and num_batches_tracked) move by `momentum` toward the
 * batch's mean and unbiased variance, as torch.nn.BatchNorm2d. Evaluation: from the running
 * statistics, which stay unchanged. */
void rt_bn_stats(int64_t N, int64_t C, int64_t HW, const float *x, float *stats, double eps,
                 double momentum, float *running, int training);
/* sums[0][c] = sum of dy, sums[1][c] = sum of dy * (x - mean) * invstd over N and HW. */
void rt_bn_bwd_sums(int64_t N, int64_t C, int64_t HW, const float *x, const float *stats,
                    const float *dy, float *sums);
/* rt_bn_stats and rt_bn_bwd_sums on channels-last x and dy: M rows of C channels (M = N * H * W).
 * The sums run over fixed blocks of rows in a fixed order, so results do not depend on the
 * number of threads. */
enum { RT_BN_BLOCK_ROWS = 256 }; /* the fixed blocks of rows of the channels-last sums */
void rt_bn_stats_nhwc(int64_t M, int64_t C, const float *x, float *stats, double eps, double momentum,
                      float *running, int training);
void rt_bn_bwd_sums_nhwc(int64_t M, int64_t C, const float *x, const float *stats, const float *dy,
                         float *sums);
/* Synchronised batch norm (netc --sync-bn) in a distributed trainer (x row-major [N, C, HW], or
 * channels-last rows when nhwc, M = N * HW): rt_bn_stats in training, each pass's double sums
 * added over the ranks, so stats and the running statistics are the whole global batch's; and
 * rt_bn_bwd_sums averaged over the ranks (the sums of the global batch's mean-loss gradient:
 * rt_bn.c). With one rank, or ctx->dist NULL, they equal the kernels above bit for bit. */
void rt_bn_stats_sync(RtCtx *ctx, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x, float *stats,
                      double eps, double momentum, float *running);
void rt_bn_bwd_sums_sync(RtCtx *ctx, int nhwc, int64_t N, int64_t C, int64_t HW, const float *x,
                         const float *stats, const float *dy, float *sums);
/* A fused group's backward sums s [2, C] (double) averaged over the ranks, into sums (float). */
void rt_bn_sums_sync(RtCtx *ctx, double *s, int64_t C, float *sums);
/* Convolution + batch norm folding for evaluation: w [K, per_k] scaled per output channel,
 * w_out[k] = w[k] * weight[k] * invstd[k], and b_out[k] = bias[k] - mean[k] * weight[k] *
 * invstd[k], with (mean, invstd) = stats [2, K] from rt_bn_stats. */
void rt_bn_fold(int64_t K, int64_t per_k, const float *w, const float *stats, const float *weight,
                const float *bias, float *w_out, float *b_out);
/* Rows among the first n_valid whose argmax (first on ties) equals the label. */
float rt_accuracy(int64_t rows, int64_t cols, const float *logits, const int64_t *label,
                  int64_t n_valid);
/* The same among the rows whose label is not `ignore` (masked-LM accuracy's numerator). */
float rt_accuracy_ignore(int64_t rows, int64_t cols, const float *logits, const int64_t *label, int64_t ignore,
                         int64_t n_valid);
/* Top-k accuracy: the same rows (INT64_MIN as `ignore` for none) whose label's logit is not NaN
 * and has fewer than top_k logits above it, an equal one counting above when it comes first. */
float rt_accuracy_top(int64_t rows, int64_t cols, const float *logits, const int64_t *label, int64_t ignore,
                      int64_t top_k, int64_t n_valid);

/* ---- scaled dot-product attention (rt_attention.c)
 *
 * BH independent slices (the leading axes of q, k and v, flattened): q [T, D], k [S, D],
 * v [S, E] -> out [T, E] = softmax(q k^T * scale + mask) v, keys j > query i left out when
 * `causal`. The mask is read at mask[base(bh) + i * mask_t + j * mask_s] (a stride 0 broadcasts),
 * base(bh) the sum over the leading axes of the index along each times mask_lead: f32 added to
 * the scaled scores (RT_ATTN_ADD), or u8 where 0 leaves the key out (RT_ATTN_KEEP). A row with
 * no key left gives 0 and no gradient. Grouped-query attention: with `group` > 1, k and v hold
 * BH / group slices and query slice bh reads key/value slice bh / group (k and v have fewer
 * heads, the last leading axis; 0 is read as 1).
 *
 * Where the slices lie (RtAttnView, one for q and dq, k and dk, v and dv, out and dout): by
 * default one after another, slice s of rows x width at s * rows * width. With heads read from
 * tokens (row != 0: q, k and v as the projections wrote them, [batch, rows, ...] with each row
 * holding the heads side by side, maybe beside other projections' columns, and out written so),
 * the last leading axis is the heads: slice s = (b, h) starts at b * batch + h * width and its
 * row i lies `row` floats after row i - 1. The caller's pointer is the operand's first column. */
enum { RT_ATTN_NO_MASK, RT_ATTN_ADD, RT_ATTN_KEEP };
typedef struct RtAttnView {
    int64_t batch, row; /* floats between batch entries and between rows; 0, 0: dense slices */
} RtAttnView;
enum {
    RT_ATTN_BLOCK = 64, /* query rows per task */
    RT_ATTN_KEYS = 256, /* keys per block of the forward's online softmax */
};
typedef struct RtAttn {
    int64_t BH, T, S, D, E;
    float scale;
    int causal;
    int mask;                           /* RT_ATTN_NO_MASK, RT_ATTN_ADD, RT_ATTN_KEEP */
    int n_lead;                         /* leading axes (rank - 2) */
    int64_t lead[RT_MAX_RANK - 2];      /* their extents */
    int64_t mask_lead[RT_MAX_RANK - 2]; /* the mask's strides along them */
    int64_t mask_t, mask_s;             /* ... and along T and S */
    int64_t group;                      /* query slices per key/value slice; 0 or 1: one */
    /* attention(..., dropout = p) in training: probability (bh, i, j) is dropped where
     * rt_dropout_keep(seed, seed_id, (bh * T + i) * S + j, p) says so and the others scaled by
     * 1 / (1 - p) (rt_bits.h); the softmax's sums are the undropped ones. 0: none. */
    double dropout;
    int seed_id;
    uint64_t seed;                      /* the step's dropout seed (RtCtx.seed) */
    RtAttnView q, k, v, o;              /* where the slices lie; zero: dense */
} RtAttn;
/* Query slices per key/value slice: RtAttn.group, 0 read as 1. */
static inline int64_t rt_attn_group(const RtAttn *a) { return a->group > 1 ? a->group : 1; }
/* The first element of slice s of an operand viewed by w, whose slices are rows x width with
 * `heads` of them per batch entry, and the floats between its rows. */
static inline int64_t rt_attn_at(const RtAttnView *w, int64_t s, int64_t heads, int64_t rows, int64_t width) {
    return w->row ? s / heads * w->batch + s % heads * width : s * rows * width;
}
static inline int64_t rt_attn_ld(const RtAttnView *w, int64_t width) { return w->row ? w->row : width; }
/* Query slices per batch entry (the last leading axis), and key/value slices. */
static inline int64_t rt_attn_heads(const RtAttn *a) { return a->n_lead ? a->lead[a->n_lead - 1] : 1; }
static inline int64_t rt_attn_kv_heads(const RtAttn *a) { return rt_attn_heads(a) / rt_attn_group(a); }
/* Probability (bh, i, j)'s factor under RtAttn.dropout: 0 where dropped, else 1 / (1 - p) as
 * `inv_keep` gives it (rounded to float, as the element-wise dropout's). */
static inline float rt_attn_drop(const RtAttn *a, int64_t bh, int64_t i, int64_t j, float inv_keep) {
    return rt_dropout_keep(a->seed, a->seed_id, (bh * a->T + i) * a->S + j, a->dropout) ? inv_keep : 0.0f;
}
/* Floats of per-thread scratch the two kernels need: the forward one block of scores, one of o
 * and the row statistics; the backward the probabilities and their gradient for a block of
 * query rows against every key. The compiler sizes RtModel.scratch_per_thread with it. */
static inline int64_t rt_attention_scratch(const RtAttn *a) {
    int64_t fwd = RT_ATTN_BLOCK * (RT_ATTN_KEYS + a->E + 2), bwd = RT_ATTN_BLOCK * (2 * a->S + 1);
    return fwd > bwd ? fwd : bwd;
}
/* FlashAttention-2's forward: tiled, online softmax, no [T, S] matrix stored. */
void rt_attention_fwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask, float *out,
                      float *scratch, int64_t scratch_per_thread);
/* dq, dk, dv from the forward's operands and result and the result's gradient dout; one slice
 * per thread, the same bits for any number of threads. */
void rt_attention_bwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                      const float *out, const float *dout, float *dq, float *dk, float *dv, float *scratch,
                      int64_t scratch_per_thread);
/* The unfused reference the tests compare with: whole [T, S] matrices, in double; it reads the
 * operands through their views and writes out, dq, dk and dv as dense slices. */
void rt_attention_ref_fwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                          double *out);
void rt_attention_ref_bwd(const RtAttn *a, const float *q, const float *k, const float *v, const void *mask,
                          const float *dout, double *dq, double *dk, double *dv);

/* rt_mix, rt_step_seed, rt_dropout_keep and the f16/bf16 conversions: rt_bits.h; the learning-rate
 * schedule and the optimizers' updates: rt_recipe.h. Both are shared with the CUDA kernels so both
 * backends compute the same bits. */

#ifdef __cplusplus
}
#endif
#endif
