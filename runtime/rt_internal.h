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

#include "netrt.h"
#include "rt_file.h"

typedef struct RtError {
    char msg[1024];
} RtError;

int rt_fail(RtError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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
    void *heap;                  /* decompressed or read file (IDX) or NULL */
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
/* rt_array_unchanged() for every file of the data set. */
int rt_dataset_unchanged(const RtDataset *ds, RtError *err);

/* Prepares batch k+1 on a thread while the caller trains on batch k. */
typedef struct RtPrefetch {
    const RtModel *model;
    const RtDataset *ds;
    const int64_t *order; /* sample indices, batch after batch */
    int64_t n_batches;
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
                       int64_t n_batches);
/* The next batch's buffers; valid until the following call. NULL when the loader failed
 * (p->err says why). */
void *const *rt_prefetch_next(RtPrefetch *p);
void rt_prefetch_stop(RtPrefetch *p);

/* ---- safetensors (rt_safetensors.c) */

/* Write every parameter under its name (F32, PyTorch shape) atomically and durably through
 * rt_out_open/rt_out_commit (rt_file.h). On failure the old FILE is untouched. */
int rt_st_save(const char *path, const RtModel *m, const float *params, RtError *err);
/* Read every parameter of the model from a safetensors file; all names must match exactly. */
int rt_st_load(const char *path, const RtModel *m, float *params, RtError *err);

/* ---- randomness (rt_main.c; the learning-rate schedule, rt_lr_at, is in rt_recipe.h) */

void rt_init_params(const RtModel *m, float *params, uint64_t seed);

/* ---- checkpoints (rt_checkpoint.c) */

enum { RT_CKPT_VERSION = 1 }; /* the format version a checkpoint records and a trainer reads */

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
} RtTrainState;

/* Write parameters, optimizer state (n_state_slots * n_grad_floats floats) and the state
 * atomically and durably through rt_out_open/rt_out_commit. On failure the old FILE is untouched. */
int rt_ckpt_save(const char *path, const RtModel *m, const float *params, const float *optstate,
                 const RtTrainState *s, RtError *err);
/* Read a checkpoint this model wrote: checks the version, size, checksum, model fingerprint and
 * position before it copies anything into params, optstate and *s. */
int rt_ckpt_load(const char *path, const RtModel *m, float *params, float *optstate, RtTrainState *s,
                 RtError *err);
/* Read only the parameters of a checkpoint (for --init): any build of a model with the same
 * parameter names and shapes. */
int rt_ckpt_load_params(const char *path, const RtModel *m, float *params, RtError *err);
/* 1 when the file is a safetensors file whose __metadata__ marks it as a netc checkpoint. */
int rt_ckpt_is_checkpoint(const char *path);
/* Fail early, before training, when checkpoints cannot be written to path (rt_out_probe). */
int rt_ckpt_check_writable(const char *path, RtError *err);

/* ---- the recipe's values the command line may change (rt_hparams.c) */

int rt_hparam_is_flag(const char *flag);
/* Sets the value `flag` names in `s` or `o` (copies of m->schedule and m->hyper); a bad value, a
 * value the model's schedule does not have, or a GPU trainer is a usage error (exit 2). */
void rt_hparam_set(const RtModel *m, RtSchedule *s, RtOptimParams *o, const char *flag, const char *value);
/* The --help lines: each value the model's schedule has, with the model's value. */
void rt_hparam_usage(const RtModel *m);

/* ---- --predict (rt_predict.c) */

/* 0 when files[] (per input, NULL for none) names exactly the inputs the model's output reads. */
int rt_predict_check(const RtModel *m, const char *const *files, RtError *err);
/* The output for every sample of files[], with the parameters in ctx, as a float32 .npy at path
 * (written atomically); *n_out is the number of samples. */
int rt_predict(const RtModel *m, RtCtx *ctx, const char *const *files, const char *path, int64_t *n_out,
               RtError *err);

#endif
