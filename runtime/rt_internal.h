/* rt_internal.h - declarations shared by libnetrt's modules; not part of the public API.
 *
 * Functions that can fail because of a user's file return 0 on success and -1 on failure with a
 * complete message (naming the file, and the input or tensor) in an RtError, so the command-line
 * driver decides how to exit and the unit tests can check the words.
 */
#ifndef NETRT_INTERNAL_H
#define NETRT_INTERNAL_H

#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <time.h>

#include "netrt.h"
#include "rt_file.h"

typedef struct RtError {
    char msg[1024];
} RtError;

int rt_fail(RtError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* *v = the whole of text as a finite number (strtod's forms; no overflow or underflow); 0, or -1
 * with *v unspecified. */
int rt_parse_finite(const char *text, double *v);
/* The whole text file at path into *text (malloc'd, NUL-terminated). */
int rt_read_text(const char *path, char **text, RtError *err);
/* Where rt_gemm sends its products (rt_gemm.c), decided at the first call from NETC_GEMM and the
 * CPU; a bad NETC_GEMM ends the process with status 2 (rt_main asks at start-up). */
typedef enum {
    RT_GEMM_BY_SIZE,   /* large ones to oneDNN's sgemm, the others to OpenBLAS (the default, save below) */
    RT_GEMM_ONEDNN,    /* all to oneDNN: asked for, AVX2 without AVX-512, or OpenBLAS behind the CPU */
    RT_GEMM_REFERENCE, /* all to rt_gemm_reference */
} RtGemmRoute;
RtGemmRoute rt_gemm_route(void);
/* rt_gemm in oneDNN's sgemm whatever the product's size (under NETC_GEMM=reference, the
 * reference): for products that oneDNN runs faster than OpenBLAS at every size, as Winograd's
 * (rt_winograd.c). */
void rt_gemm_onednn(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                    int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Whether OpenBLAS runs kernels of the CPU's generation (rt_gemm.c's openblas_behind, negated):
 * where it does not, nothing goes to it by default. */
int rt_openblas_current(void);
/* NETC_CONV (rt_gemm.c): how rt_dnnl.c computes the channels-last 3x3 convolutions that
 * rt_winograd.c takes; another value than these ends the process with status 2. */
typedef enum {
    RT_CONV_AUTO,   /* auto, the default, and winograd, its name before it took AVX-512 CPUs: rt_dnnl.c
                       chooses (Winograd's wherever it fits) */
    RT_CONV_DIRECT, /* direct: oneDNN's kernels for every convolution */
} RtConvChoice;
RtConvChoice rt_conv_choice(void);

/* Seconds on the monotonic clock: for intervals (step rates, waits, the profile). */
static inline double rt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* netc --profile (rt_prof.c): rt_prof_open at the start of training with forward_backward's runs
 * a step (--accumulate; nothing for a model without sites, or a device trainer), rt_prof_step
 * after each step with its seconds and its optimizer's, rt_prof_report at the end: where the
 * steps after the first went, by operator and by line. */
void rt_prof_open(const RtModel *m, int runs);
int rt_prof_on(void);
void rt_prof_step(double step_s, double optimizer_s);
void rt_prof_report(FILE *f, int threads);

/* 3x3 convolutions of stride 1 and padding 1 by Winograd's F(2x2, 3x3) on NHWC activations
 * (rt_winograd.c): which geometries it takes, the floats of scratch a call needs (one call at a
 * time), the forward, the data gradient and the weight gradient. */
int rt_winograd_fits(const RtConv *c);
size_t rt_winograd_scratch(const RtConv *c);
void rt_winograd_fwd(const RtConv *c, const float *x, const float *w, float *y, float *scratch);
void rt_winograd_bwd_data(const RtConv *c, const float *dy, const float *w, float *dx, float *scratch);
void rt_winograd_bwd_filter(const RtConv *c, const float *x, const float *dy, float *dw, float *scratch);

/* Sums along a row in double in RT_LANES partial sums, element j into lane j % RT_LANES, the
 * lanes added at the end by halving (rt_lanes_total: lane l + 8 onto lane l, then l + 4, l + 2,
 * l + 1): a fixed order, so the same bits at every vector width (the runtime is built for several
 * x86-64 levels, rt_cpu.c), and RT_LANES independent chains of additions, which vectorise, where
 * one running sum is a chain of dependent ones; the halving is 4 dependent additions where adding
 * the lanes in turn was 16, which a short row (a softmax of 128 keys) felt. A row's columns
 * j0 + l, l < RT_LANES, for j0 = 0, RT_LANES, ... up to rt_lanes_full(n), go to a static inline
 * lane loop of count RT_LANES, then its last n - rt_lanes_full(n) columns to the same loop: with
 * the constant count the compiler keeps the lanes in vector registers from block to block,
 * where a count that varied per block kept them in memory, a store and a load on every lane's
 * chain of additions (a layer norm's statistics of 128 columns took 1.7x the time). rt_rows.c:
 * the norms; rt_kernels.c: cross-entropy; rt_attention.c: the softmax. */
enum { RT_LANES = 16 };
static inline int64_t rt_lanes_full(int64_t n) { return n / RT_LANES * RT_LANES; }
static inline double rt_lanes_total(const double *part) {
    double h[RT_LANES];
    for (int l = 0; l < RT_LANES; l++) h[l] = part[l];
    for (int w = RT_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) h[l] += h[l + w];
    return h[0];
}

/* bytes of zeros, 64-byte aligned; out of memory ends the process with a message naming `what`. */
void *rt_alloc(size_t bytes, const char *what);

/* ---- arrays loaded from .npy or IDX files (rt_array.c) */

typedef enum { RT_FILE_U8, RT_FILE_I8, RT_FILE_I16, RT_FILE_I32, RT_FILE_I64, RT_FILE_F16,
               RT_FILE_F32, RT_FILE_F64 } RtFileType;

typedef struct RtArray {
    char *path;
    RtFileType type;
    int big_endian;              /* IDX stores elements big-endian */
    int rank;                    /* including the sample axis */
    int64_t shape[RT_MAX_RANK + 1];
    const unsigned char *data;   /* first element */
    int64_t sample_elems;        /* elements per sample */
    void *mapping;               /* mmap'd file (npy) or NULL */
    size_t mapping_len;
    int fd;                      /* with a mapping: the file, kept open to notice changes */
    int64_t mtime_ns;            /* its modification time when it was opened */
    void *heap;                  /* decompressed or read file (IDX, CSV, CIFAR) or NULL */
    int csv_first_line;          /* a CSV file: the line of sample 0 (2 after a header); else 0 */
} RtArray;

int rt_array_load(const char *path, RtArray *a, RtError *err);
void rt_array_free(RtArray *a);
/* 0 while a mapped file has its size and modification time of when it was opened; else -1
 * with a message naming it. Arrays read into memory never change. */
int rt_array_unchanged(const RtArray *a, RtError *err);

/* Copies out of mapped files. A file truncated under the trainer turns an access past its new
 * end into SIGBUS; a thread that copies out of a mapping arms a guard first, and libnetrt's
 * SIGBUS handler (installed when a file is mapped) jumps back to it:
 *
 *     sigjmp_buf jb;
 *     if (sigsetjmp(jb, 1)) return rt_guard_failed(err);
 *     rt_guard_arm(&jb, a->path);  ... copy ...  rt_guard_disarm();
 *
 * A SIGBUS outside an armed guard keeps its usual effect. */
void rt_guard_arm(sigjmp_buf *jb, const char *path);
void rt_guard_disarm(void);
int rt_guard_failed(RtError *err); /* disarms; the message names the file being read */
/* Element i (flat, across samples) as a double. */
double rt_array_elem(const RtArray *a, int64_t i);
/* A CSV file of numbers as f64 [lines, values per line] (rt_csv.c). */
int rt_csv_load(const char *path, RtArray *a, RtError *err);
/* CIFAR-10 binary files, spec "F1,F2,..." (after "cifar:"; at most RT_CIFAR_MAX_FILES): the labels
 * as u8 [N] or the images as u8 [N, 3, 32, 32] (rt_cifar.c). */
enum { RT_CIFAR_MAX_FILES = 8 };
int rt_cifar_load(const char *spec, int labels, RtArray *a, RtError *err);
const char *rt_file_type_name(RtFileType t);

/* ---- a set of files bound to the model's inputs, and batches (rt_data.c) */

typedef struct RtDataset {
    int n;                         /* = model->n_inputs */
    RtArray arrays[RT_MAX_INPUTS]; /* in model input order */
    int64_t n_samples;
} RtDataset;

/* files[i] is the file for model input i. Checks per-sample shapes (size-1 axes ignored),
 * sample counts, and that there is at least one sample. */
int rt_dataset_open(const RtModel *m, const char *const *files, RtDataset *ds, RtError *err);
void rt_dataset_close(RtDataset *ds);
/* Bytes of one batch of input i in the model's dtype. */
size_t rt_batch_bytes(const RtModel *m, int input);
/* Fill bufs[i] (one batch per input) with samples idx[0..count), converted by value; rows
 * count..batch-1 are zero. -1 when a mapped file shrank under the copy (see rt_guard_arm). */
int rt_gather(const RtModel *m, const RtDataset *ds, const int64_t *idx, int64_t count,
              void *const *bufs, RtError *err);
/* rt_gather of the batch of samples from `start` on (fewer at the data's end), idx[0..batch)
 * its scratch: the number of samples, or -1 as rt_gather. */
int64_t rt_gather_from(const RtModel *m, const RtDataset *ds, int64_t start, int64_t *idx, void *const *bufs,
                       RtError *err);
/* rt_array_unchanged() for every file of the data set. */
int rt_dataset_unchanged(const RtDataset *ds, RtError *err);

/* ---- augmentation of training batches (rt_augment.c) */

typedef struct RtAugment {
    int any;                   /* some input is augmented */
    int crop[RT_MAX_INPUTS];   /* per input: the padding P of a random crop, 0 = no crop */
    int flip[RT_MAX_INPUTS];   /* per input: a random horizontal flip */
} RtAugment;

/* specs[i]: input i's `--augment` OPS ("crop:4,flip"), or NULL. Refuses inputs that are not
 * images [C, H, W] per sample and unknown or out-of-range operations. */
int rt_augment_parse(const RtModel *m, const char *const *specs, RtAugment *aug, RtError *err);
/* The augmentation as text, "NAME=crop:P,flip;NAME=..." in input order ("" for none), as a
 * checkpoint records it. */
void rt_augment_text(const RtModel *m, const RtAugment *aug, char *buf, size_t size);
/* A resumed run's augmentation: the one the checkpoint recorded (text from rt_augment_text) when
 * *aug is none, else *aug, which must then equal it. */
int rt_augment_resume(const RtModel *m, RtAugment *aug, const char *recorded, const char *ckpt, RtError *err);
/* The 64-bit draw of sample `sample` (its index in the file) in epoch `epoch` (from 1). */
uint64_t rt_augment_draw(uint64_t seed, int64_t epoch, int64_t sample);
/* Crop and flip, in place, rows 0..count-1 of the batch buffers that rt_gather filled. */
int rt_augment_batch(const RtAugment *aug, const RtModel *m, uint64_t seed, int64_t epoch, const int64_t *idx,
                     int64_t count, void *const *bufs, RtError *err);

/* Prepares batch k+1 on a thread while the caller trains on batch k. */
typedef struct RtPrefetch {
    const RtModel *model;
    const RtDataset *ds;
    const int64_t *order; /* sample indices, batch after batch */
    int64_t n_batches;
    const RtAugment *aug;  /* augments each batch, or NULL */
    uint64_t seed;         /* the run's seed and this epoch: the augmentation's draws */
    int64_t epoch;
    void *slots[2][RT_MAX_INPUTS];
    int64_t ready[2];      /* batch number held by each slot, -1 = none */
    int64_t next_fill, next_take;
    int stop;
    int failed;            /* the loader stopped on a data file that changed; err says why */
    RtError err;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} RtPrefetch;

void rt_prefetch_start(RtPrefetch *p, const RtModel *m, const RtDataset *ds, const int64_t *order,
                       int64_t n_batches, const RtAugment *aug, uint64_t seed, int64_t epoch);
/* The next batch's buffers; valid until the following call. NULL when the loader failed
 * (p->err says why). */
void *const *rt_prefetch_next(RtPrefetch *p);
void rt_prefetch_stop(RtPrefetch *p);

/* ---- safetensors (rt_safetensors.c) */

/* The elements of a parameter: the product of its shape. */
int64_t rt_param_numel(const RtParam *p);
/* Write every parameter under its name (F32, PyTorch shape) atomically and durably through
 * rt_out_open/rt_out_commit (rt_file.h). On failure the old FILE is untouched. */
int rt_st_save(const char *path, const RtModel *m, const float *params, RtError *err);
/* Which parameters a weight file holds: all, all but LoRA's adapters, or only the adapters. */
typedef enum { RT_PICK_ALL, RT_PICK_BASE, RT_PICK_ADAPTERS } RtPick;
/* Save the picked parameters, each name with `prefix` (NULL: none) before it. */
int rt_st_save_pick(const char *path, const RtModel *m, const float *params, RtPick pick, const char *prefix,
                    RtError *err);
/* Read every parameter of the model from a safetensors file; all names must match exactly. */
int rt_st_load(const char *path, const RtModel *m, float *params, RtError *err);

/* How --init matches a file's tensors to the model's parameters (docs/trainer.md, Fine-tuning).
 * All zero: strictly, every parameter exactly once with its shape and nothing else. */
typedef struct RtInitRules {
    const char *skip;   /* comma-separated names, prefixes or globs: these keep their initialisation */
    const char *prefix; /* stripped from the file's names that start with it ("module.") */
    int partial;        /* load what the model has; missing and unexpected tensors are only listed */
    int checkpoint;     /* the file is a verified netc checkpoint: its optimizer state is ignored */
    int adapters;       /* the file holds LoRA's adapters and nothing else (rt_lora.c) */
    FILE *report;       /* every mismatch is listed here (stderr), or only the first in the error */
    FILE *notes;        /* what a non-strict load left alone is listed here (stdout), or nowhere */
} RtInitRules;

/* Read the parameters under the rules; every mismatch is found before the error is returned. */
int rt_st_load_rules(const char *path, const RtModel *m, float *params, const RtInitRules *r, RtError *err);
/* --init: a weight file, or a checkpoint (its checksum checked, its optimizer state ignored). */
int rt_st_init(const char *path, const RtModel *m, float *params, const RtInitRules *r, RtError *err);

/* ---- LoRA's adapters in PEFT's format (rt_lora.c) */
/* Parameter i of m: 1 a lora_A, 2 a lora_B, 0 anything else. */
int rt_lora_role(const RtModel *m, int i);
/* DIR/adapter_model.safetensors and DIR/adapter_config.json, as PEFT's save_pretrained writes
 * them, into DIR (the trainer makes it when it checks its outputs, before the run). */
int rt_lora_save(const char *dir, const RtModel *m, const float *params, RtError *err);
/* Read them back into the adapters of params, checking the configuration against the model's. */
int rt_lora_load(const char *dir, const RtModel *m, float *params, RtError *err);
/* The base model's parameters with every adapter merged, W + (alpha / r) B A, and no adapters: a
 * weight file of the model without LoRA. */
int rt_lora_save_merged(const char *path, const RtModel *m, const float *params, RtError *err);
/* The files of an adapter directory, into buf. */
const char *rt_lora_file(const char *dir, int config, char *buf, size_t size);

/* ---- randomness (rt_main.c; the learning-rate schedule, rt_lr_at, is in rt_recipe.h) */

void rt_init_params(const RtModel *m, float *params, uint64_t seed);

/* ---- checkpoints (rt_checkpoint.c) */

enum { RT_CKPT_VERSION = 1 }; /* the format version a checkpoint records and a trainer reads */

/* A loss scale as a checkpoint or --loss-scale gives it: a power of two (so that unscaling is
 * exact) from RT_LOSS_SCALE_MIN to _MAX (rt_devstate.h), into *scale; -1 for any other text. */
int rt_parse_loss_scale(const char *text, double *scale);

/* Where a run stands and the settings that decide what its remaining steps compute. After
 * `step` optimizer steps the run is `batch` batches into epoch `epoch` (counted from 1), so
 * step == (epoch - 1) * (samples / model batch) + batch. */
typedef struct RtTrainState {
    int64_t step, epoch, batch;
    int eval_done;        /* the evaluation due at this position (if any) has run */
    int64_t total_steps;  /* the run ends after this many steps */
    int64_t epochs, steps; /* the target as given: --steps N when steps > 0, else --epochs N */
    int64_t samples;      /* training samples */
    uint64_t seed;
    int shuffle;
    int threads;          /* recorded so a resume can warn: bit-identity needs the same count */
    char augment[256];    /* --augment as rt_augment_text writes it; "" = none */
    int ranks;            /* the ranks of a distributed run (1: one process); its global batch is
                           * ranks * accumulate * RtModel.batch, and its position counts batches of that size */
    int accumulate;       /* --accumulate: batches per rank and optimizer step (0 or 1: none) */
    int has_scale;        /* a loss-scaling trainer's run (netc --precision fp16): `scale` holds */
    RtLossScale scale;
    int has_best;         /* an evaluation of the run had a finite quality: the best, of `best_epoch`'s
                           * evaluation after step `best_step` (--save-best; the first metric's
                           * accuracy, or minus the loss of a model without one) */
    double best;
    int64_t best_epoch, best_step;
} RtTrainState;

/* Write parameters, optimizer state (n_state_slots * n_grad_floats floats) and the state
 * atomically and durably through rt_out_open/rt_out_commit. On failure the old FILE is untouched. */
int rt_ckpt_save(const char *path, const RtModel *m, const float *params, const float *optstate,
                 const RtTrainState *s, RtError *err);
/* Read a checkpoint this model wrote: checks the version, size, checksum, model fingerprint and
 * position before it copies anything into params, optstate and *s. `ranks` and `accumulate`:
 * this run's; the checkpoint must have been written at the same global batch (m->batch * ranks *
 * accumulate). */
int rt_ckpt_load(const char *path, const RtModel *m, int ranks, int accumulate, float *params, float *optstate,
                 RtTrainState *s, RtError *err);
/* Check a checkpoint's size and checksum, for reading its parameters as a weight file. */
int rt_ckpt_verify(const char *path, RtError *err);
/* 1 when the file is a safetensors file whose __metadata__ marks it as a netc checkpoint. */
int rt_ckpt_is_checkpoint(const char *path);
/* Fail early, before training, when checkpoints cannot be written to path (rt_out_probe). */
int rt_ckpt_check_writable(const char *path, RtError *err);

/* ---- what a run shows (rt_log.c) */

/* The standard output: permanent lines, and on a terminal a progress line redrawn between
 * them (never over them). */
typedef struct RtConsole {
    int tty, quiet;
    int shown;   /* width of the progress line on the screen, 0 when none is */
    double last; /* when it was last drawn (a monotonic clock, seconds) */
} RtConsole;

/* A whole line, ending in a newline; blanks the progress line first. */
void rt_console_line(RtConsole *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Redraw the progress line in place (terminals only, at most five times a second). */
void rt_console_progress(RtConsole *c, double now, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Blank the progress line: the output then ends with the last whole line and its newline. */
void rt_console_end(RtConsole *c);

/* MLPerf's :::MLLOG lines (--mllog). A failed write is reported once, closes the file and sets
 * `failed`; later events are dropped. */
typedef struct RtMllog {
    FILE *f;
    const char *path;
    int failed;
} RtMllog;

typedef enum { RT_ML_START, RT_ML_END, RT_ML_POINT } RtMlEvent;

/* `value` and `meta` are JSON text or NULL: the value (null when NULL), and fields added to the
 * metadata after the file and line. */
void rt_mllog_event(RtMllog *ml, RtMlEvent type, const char *key, const char *value, const char *meta,
                    const char *file, int line);
#define RT_MLLOG(ml, type, key, value, meta) rt_mllog_event(ml, type, key, value, meta, __FILE__, __LINE__)
/* The events of a run: init_start when the file is opened; the run's constants
 * (global_batch_size, opt_base_learning_rate, train_samples), init_stop and run_start before the
 * first step; epoch_start and epoch_stop (type RT_ML_START or RT_ML_END); run_stop with status
 * "success" or "aborted" when it is closed. Close returns -1 when the file could not be written. */
void rt_mllog_open(RtMllog *ml, FILE *f, const char *path);
void rt_mllog_run_start(RtMllog *ml, int64_t batch, double base_lr, int64_t samples);
void rt_mllog_epoch(RtMllog *ml, RtMlEvent type, int64_t epoch);
int rt_mllog_close(RtMllog *ml, int success);
/* v as JSON in buf, or "null" when it is not finite. */
const char *rt_json_num(char *buf, size_t size, double v);

/* ---- the recipe's values the command line may change (rt_hparams.c) */

int rt_hparam_is_flag(const char *flag);
/* Sets the value `flag` names in `s` or `o` (copies of m->schedule and m->hyper); a bad value, a
 * value the model's schedule does not have, or a GPU trainer is a usage error (exit 2). */
void rt_hparam_set(const RtModel *m, RtSchedule *s, RtOptimParams *o, const char *flag, const char *value);
/* The --help lines: each value the model's schedule has, with the model's value. */
void rt_hparam_usage(const RtModel *m);

/* ---- training to a quality target (rt_target.c; docs/trainer.md, "Training to a target") */

typedef struct RtTarget {
    double accuracy;      /* the first metric's evaluation accuracy to reach (0: none) */
    double loss;          /* the evaluation loss to get down to, when has_loss */
    int has_loss;
    int met;              /* an evaluation of this process met every target */
    int evaluated;        /* this process has evaluated; the last evaluation's values */
    int64_t last_epoch;
    double last_loss, last_accuracy;
} RtTarget;

/* The model's target (train { target_accuracy, target_loss }). */
void rt_target_init(RtTarget *t, const RtModel *m);
/* --target-accuracy A, --target-loss L (each replaces the model's), --no-target (drops the
 * model's); 0, or -1 with a usage error in err. */
int rt_target_option(RtTarget *t, const RtModel *m, const char *flag, const char *value, RtError *err);
int rt_target_on(const RtTarget *t);
/* "accuracy >= 0.759 and loss <= 2.69": the target in words, in buf; its length. */
int rt_target_text(const RtTarget *t, char *buf, size_t size);
/* An evaluation's loss and first metric's accuracy: 1 when it is the first to meet every target. */
int rt_target_eval(RtTarget *t, int64_t epoch, double loss, double accuracy);

/* ---- one rank of a distributed trainer (rt_dist.c; docs/distributed.md) */

typedef struct RtDist {
    const RtComm *comm;   /* NULL: the trainer runs as one process, rank 0 of 1 */
    const RtModel *m;
    int rank, ranks, local_rank; /* ranks: the training ranks */
    int evaluator;        /* --eval-rank: this process evaluates, and does not train (rank == ranks) */
    double wait_s;        /* seconds spent waiting for the other ranks, summed since it was last reset */
    /* --shard-optimizer (rt_dist_shard_open): this rank's slices, and per bucket k each rank's
     * floats (counts[k * ranks + r]) from the bucket's start (displs[k * ranks + r]) */
    RtShard shard;
    RtSlice *slices;
    int *counts, *displs;
} RtDist;

/* Join the job (m->comm) and fill *d, or make *d the only rank; with eval_rank (--eval-rank) the
 * job's last process is the evaluator. 1 after saying why it failed. */
int rt_dist_open(RtDist *d, const RtModel *m, int *argc, char ***argv, int eval_rank);
/* After forward_backward: wait for the buckets' sums and divide by the number of ranks times
 * the `accumulate` batches summed (with --shard-optimizer, of this rank's slices); one rank
 * that accumulates adds ctx->accum first, as rt_grads_ready does for several. Nothing for one
 * rank and one batch. */
void rt_dist_mean_grads(RtDist *d, RtCtx *ctx, int accumulate);
/* g += acc over n floats: --accumulate's sum of a step's batches, the last one's gradient plus
 * the earlier ones' (rt_grads_ready per bucket, rt_main for a lone process). */
void rt_grads_add(float *g, const float *acc, int64_t n);
/* --shard-optimizer: cut this rank's slices (one slice of the whole buffer, at ctx->grads, for
 * one rank) and point ctx->shard at them; the optimizer state floats they need. */
int64_t rt_dist_shard_open(RtDist *d, RtCtx *ctx);
/* --shard-optimizer, after optimizer_step: every rank's updated slices to every rank. */
void rt_dist_gather_params(RtDist *d, float *params);
/* --shard-optimizer with several ranks: the whole optimizer state (slots * n_grad_floats, as one
 * process holds it) from every rank's slices, on rank 0 (full is written on rank 0 only); and
 * this rank's slices of a whole state. */
void rt_dist_gather_state(RtDist *d, const float *mine, float *full);
void rt_dist_take_state(const RtDist *d, const float *full, float *mine);
/* x[0 .. n) summed over the ranks in place; the seconds it waited. */
double rt_dist_sum(RtDist *d, double *x, int n, const char *what);
/* This rank's samples of n_batches global batches of `order`: `batch` of each, into local. */
void rt_dist_shard(const RtDist *d, const int64_t *order, int64_t n_batches, int64_t batch, int64_t *local);
/* Every rank takes rank 0's running statistics (RtParam.buffer): batch norm's statistics are
 * each rank's own in training unless netc --sync-bn, and the model's are rank 0's, as PyTorch
 * DDP's broadcast_buffers; evaluation, checkpoints and the end of the run use them. */
void rt_dist_share_buffers(RtDist *d, float *params);
/* 1 when every rank holds the same parameters; else 0 after saying so (`when`: "after step 10"). */
int rt_dist_same_params(RtDist *d, const float *params, const char *when);
/* The CPUs this process may run on (mpirun binds a rank to one core by default for 2 ranks or
 * fewer), or 0 when unknown. */
int rt_dist_cpus(void);
/* Leave the job with the trainer's exit status (see RtComm.close), and free what it held. */
void rt_dist_close(RtDist *d, int status, int together);

/* ---- a layer-wise optimizer's update (rt_layerwise.c) */

/* Cut the floats this rank updates (ctx->shard's slices, or the whole trainable buffer) into
 * ctx->pieces (RtPieces in netrt.h); and free them. */
void rt_pieces_open(const RtModel *m, RtCtx *ctx);
void rt_pieces_close(RtCtx *ctx);

/* ---- --predict (rt_predict.c) */

/* 0 when files[] (per input, NULL for none) names exactly the inputs the model's output reads. */
int rt_predict_check(const RtModel *m, const char *const *files, RtError *err);
/* The output for every sample of files[], with the parameters in ctx (or, with a device, those
 * uploaded to it), as a float32 .npy at path (written atomically); *n_out is the number of samples. */
int rt_predict(const RtModel *m, RtCtx *ctx, const RtDevice *dev, const char *const *files, const char *path,
               int64_t *n_out, RtError *err);

/* ---- the trainer's command line (rt_options.c) */

/* The run as the command line asks for it: the model's defaults with the options' changes. */
typedef struct RtOptions {
    const char *data[RT_MAX_INPUTS], *eval[RT_MAX_INPUTS], *augment[RT_MAX_INPUTS], *predict[RT_MAX_INPUTS];
    const char *predict_out;  /* --predict-out: the model's output for the --predict files */
    int64_t epochs, steps, log_every, eval_every, checkpoint_every, stop_at;
    int64_t eval_every_steps; /* evaluations every this many optimizer steps instead of epochs (0: by epochs) */
    int accumulate;           /* --accumulate K: micro-batches of the model's batch per optimizer step */
    uint64_t seed;
    int shuffle, threads, quiet, list_params, gradcheck, n_eval, no_graph, update_after_backward;
    int eval_only;            /* one evaluation of the --init or --resume weights, no training */
    int eval_rank;            /* --eval-rank: the job's last process evaluates while the others train */
    int eval_async;           /* --eval-async: a GPU trainer evaluates on a second stream while it trains */
    int n_predict;            /* --predict files given */
    RtSchedule schedule;      /* the model's, with the command line's overrides (rt_hparams.c) */
    RtOptimParams hyper;      /* the same for the optimizer's hyperparameters */
    RtTarget target;          /* the model's quality target with the command line's changes, and whether
                               * an evaluation met it (rt_target.c) */
    int target_given;         /* --target-accuracy, --target-loss or --no-target */
    int epochs_given, steps_given, seed_given; /* a resume keeps the recorded values otherwise */
    double loss_scale;        /* --loss-scale: the first loss scale of a loss-scaling trainer */
    int64_t loss_scale_interval; /* --loss-scale-interval: finite steps in a row that double it */
    int loss_scale_given, loss_scale_interval_given;
    const char *init, *save, *log, *checkpoint, *resume, *mllog;
    const char *save_best;    /* --save-best: the parameters of the run's best evaluation so far */
    RtInitRules init_rules;   /* --init-skip, --init-prefix, --init-partial */
    const char *adapter, *save_adapter, *save_merged; /* LoRA's adapters in PEFT's format (rt_lora.c) */
    char adapter_files[2][PATH_MAX], save_adapter_files[2][PATH_MAX]; /* the two files of each directory */
} RtOptions;
/* *o from the command line, checked against the model and against itself; a bad option ends the
 * process with status 2 (rt_die_usage), --help with 0 after the usage. */
void rt_parse_options(int argc, char **argv, const RtModel *m, RtOptions *o);
/* A bad command line: the message on stderr with a hint to --help, and exit status 2. */
_Noreturn void rt_die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
