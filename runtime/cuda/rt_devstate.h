/* rt_devstate.h - what the training step keeps on the device, shared by the trainer's host code
 * (C, libnetrt_cuda) and its kernels (CUDA C compiled by NVRTC, which sees this file as a
 * header netc hands it). Plain C types only, so both compilers lay it out the same way.
 *
 * The device arena holds one RtDevState and, for each staged batch, one RtBatchHeader followed
 * by the model's inputs. The host writes the run's constants (step, per_epoch, total, seed,
 * accumulate, accum_at, the schedule and the optimizer's hyperparameters) once before the first
 * step; from then on only kernels write it, and the host reads the sums asynchronously at log
 * intervals and after evaluation.
 *
 * Under NVRTC the includer has already included rt_recipe.h (netrt_kernels.cuh, which defines
 * the fixed-width integers it needs first); its guard makes this include a no-op there.
 */
#ifndef RT_DEVSTATE_H
#define RT_DEVSTATE_H

#include "rt_recipe.h"

/* Threads in a block of every generated kernel's launch (some launch fewer, none more): netc
 * writes __launch_bounds__ of it, and the runtime checks each kernel can run it at start-up. */
enum { RT_CUDA_BLOCK = 256 };

/* The metrics a step counts correct predictions for: netrt.h's RT_MAX_METRICS (rt_cuda.c checks),
 * which the kernels' compiler does not see. */
enum { RT_DEV_METRICS = 4 };

typedef struct RtDevState {
    /* the run, set by the host before the first step (and again on resume) */
    long long step;          /* optimizer steps taken; advanced by the last kernel of each step */
    long long per_epoch;     /* steps per epoch, for the learning-rate schedule */
    long long total;         /* steps in the whole run */
    unsigned long long seed; /* the run's --seed */
    long long accumulate;    /* the trainer's --accumulate K: batches per step (1 without) */
    long long accum_at;      /* with K > 1: the byte offset in the allocation of the step's summed
                              * gradients, n_grad_floats floats the runtime allocates last */
    /* --accumulate: the step's batches so far, each run by the graph of RT_STEP_SUM */
    long long micro;          /* batches of this step already summed: 0 .. K - 1 */
    double micro_loss;        /* their losses, added in order */
    double micro_correct[RT_DEV_METRICS]; /* their correct predictions, per metric */
    /* this step's, written by its first kernel */
    unsigned long long step_seed; /* rt_step_seed(seed, step * accumulate + micro), the dropout
                                   * masks' seed: each batch of the step its own, as on the CPU */
    float lr;                     /* the schedule at `step` */
    float loss;                   /* this step's mean loss (over its --accumulate batches) */
    float correct[RT_DEV_METRICS]; /* this step's correct predictions per metric (summed over them),
                                   * right after loss: the ranks sum the two in one all-reduce */
    /* sums the host reads and resets */
    double loss_sum;          /* training loss summed over the steps since the last read */
    long long loss_steps;     /* steps in loss_sum */
    double correct_sum[RT_DEV_METRICS]; /* correct predictions per metric, summed over those steps */
    long long nonfinite_step; /* the first step (1-based) whose loss was NaN or Inf, 0 if none;
                                 from that step on the optimizer leaves the parameters alone */
    double eval_loss;         /* evaluation: loss * valid rows, summed over batches */
    double eval_correct[RT_DEV_METRICS]; /* evaluation: correct predictions per metric, summed */
    /* clip_grad_norm: this step's, written by the second clipping kernel, read by the optimizer */
    double grad_norm;         /* the gradients' 2-norm before clipping */
    float clip_scale;         /* what every gradient is multiplied by: rt_clip_scale(grad_norm, C),
                                 times 1 / loss_scale under --precision fp16 */
    /* --precision fp16: the dynamic loss scale (torch.cuda.amp.GradScaler's), set by the host
       before the first step (and again on resume), then moved by the clip_scale kernel */
    float loss_scale;         /* S: the loss gradient's seed, so every gradient is S times the true one */
    int scale_skip;           /* this step's gradients are not all finite: the optimizer skips it */
    int nonfinite_grads;      /* set with nonfinite_step: gradients not finite at the smallest scale */
    long long scale_good;     /* finite steps in a row since S last changed (the growth tracker) */
    long long scale_interval; /* S doubles after this many (growth_interval) */
    long long skipped_steps;  /* steps skipped in the whole run; the optimizer's count leaves them out
                               * (also in a trainer without loss scaling that resumed such a run) */
    /* the recipe, set by the host with the run's constants: RtModel.schedule and .hyper, the
     * model's values or those the trainer's --lr, --weight-decay, ... put in their place
     * (rt_hparams.c); the first kernel of a step computes lr from the schedule, the optimizer
     * reads the hyperparameters */
    RtSchedule schedule;
    RtOptimParams hyper;
} RtDevState;

/* --precision fp16: the loss scale never grows past RT_LOSS_SCALE_MAX (a float's largest power
 * of two); a step whose gradients are not finite at a scale of RT_LOSS_SCALE_MIN (fp16's
 * smallest subnormal) or below is not an overflow but divergence, and stops the run as a
 * non-finite loss does. */
#define RT_LOSS_SCALE_MAX 0x1p127f
#define RT_LOSS_SCALE_MIN 0x1p-24f

/* The second argument of a kernel that reads or writes tensors, which every node computing alike
 * on other tensors shares (the layers of a transformer): its operands' byte offsets in the device
 * allocation, and any per-node integers the kernel reads (a dropout mask's seed id), in the order
 * netc's generated code reads them. Passed by value, so a captured launch keeps its own copy. */
enum { RT_K_AT = 12 };
typedef struct RtKAt {
    long long o[RT_K_AT];
} RtKAt;

/* The head of a staged batch: the inputs follow at offsets the generated code fixes. */
typedef struct RtBatchHeader {
    long long n_valid; /* rows that hold real samples (all of them in training) */
    long long pad[31]; /* the inputs start 256 bytes in */
} RtBatchHeader;

#endif
