/* rt_main.c - the trainer's main(): buffers, parameter initialisation, the training loop with
 * its learning-rate schedule, evaluation, logging, checkpoints and resuming, signals, and
 * --gradcheck. The command line is read and checked by rt_options.c.
 *
 * Everything is allocated once before the first step: the flat parameter, gradient and
 * optimizer-state buffers, the planned arena, the kernels' per-thread scratch, and the
 * prefetcher's two batch slots. The loop itself only calls the generated step functions.
 *
 * Every step is a pure function of (parameters, optimizer state, step, epoch, seed, data): the
 * dropout seed is rt_mix(seed ^ rt_mix(step)), the sample order comes from (seed, epoch), the
 * learning rate from (step, steps per epoch, total steps). So a checkpoint of the two buffers
 * and that position is all a resumed run needs to compute the same bits as an uninterrupted one.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

/* OpenBLAS's thread count, when the trainer links OpenBLAS: a CPU trainer does; a GPU trainer
 * does not, and this weak reference then stays NULL. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

/* Exit statuses (docs/trainer.md): 1 a file was refused or a write failed, 2 bad command line. */
enum { EXIT_NONFINITE = 3, EXIT_STOPPED = 4, EXIT_NO_DEVICE = 5, EXIT_TARGET_MISSED = 7 };


typedef struct Trainer {
    const RtModel *m;
    RtOptions o;
    RtCtx ctx;
    FILE *log;
    int log_failed;           /* a write to the log failed: the run stops and ends with status 1 */
    int best_failed;          /* a write of --save-best failed: the same */
    int tty;
    RtConsole con;            /* the standard output: log lines and the progress line (rt_log.c) */
    RtMllog ml;               /* --mllog */
    int64_t per_epoch, total; /* steps per epoch, and in the whole run */
    RtTrainState pos;         /* step, epoch, batch, eval_done: where the run stands */
    int ckpt_current;         /* the checkpoint file holds exactly this position */
    const RtDevice *dev;      /* the step runs there (m->device), or NULL */
    RtAugment aug;            /* --augment: crops and flips of training batches */
    double dev_loss;          /* device trainers: loss summed over dev_steps steps read back */
    double dev_correct[RT_MAX_METRICS]; /* and each metric's correct predictions */
    int64_t dev_steps;
    int posted;               /* the device has sums posted (RtDevice.post_train) that are not taken yet */
    int dev_stop;             /* the exit status a take found where the run could not stop (take_sums) */
    struct {                  /* the log line the posted sums end: its host side, kept until they arrive */
        int pending;
        int64_t step, epoch;
        double lr, samples, wait, counted;
    } line;
    double line_t;            /* when the device's last line was written: its samples/s count from there */
    double grad_norm;         /* clip_grad_norm: the last step's gradient norm, for the log */
    RtLossScale scale;        /* loss scaling (m->loss_scaling): as of the last read of the device */
    int carry_scale;          /* resumed a loss-scaling run without loss scaling (a CPU trainer): `scale` as
                               * the checkpoint recorded it, passed on to this run's checkpoints, and its
                               * skipped steps left out of the optimizer's count of updates */
    double counted;           /* the last step's positions the accuracy counts (counted_positions) */
    RtDist dist;              /* this process's rank among the trainer's ranks (rt_dist.c) */
    int stop_agreed;          /* distributed: some rank asked to stop; every rank stops after this step */
    int target_agreed;        /* --eval-rank with several ranks: training rank 0 found the target met */
    int gather_state;         /* --shard-optimizer with --checkpoint and several ranks: every rank sends
                               * its optimizer state to rank 0 for each checkpoint */
    float *eval_params;       /* --eval-rank, training rank 0: the parameters handed to the evaluator */
    int64_t eval_epoch;       /* and the epoch of the evaluation in flight, or 0 */
    int64_t eval_step;        /* and the step it evaluates */
    const RtDataset *eval_ds; /* the evaluation data (NULL: none), and the buffers its batches are */
    void *const *eval_bufs;   /* gathered in */
    int64_t eval_samples;     /* the samples it evaluates */
    struct {                  /* --eval-async: the evaluation in flight on the device's second stream */
        int active;
        const RtDataset *ds;  /* the evaluation data, and the buffers its batches are gathered in */
        void *const *bufs;
        int64_t *idx;
        int64_t epoch, step;  /* the epoch it evaluates, and the step */
        int64_t next;         /* the next batch of the data to consider handing over */
        int64_t steps;        /* training steps since the evaluation began */
        double counted;       /* positions the accuracy counts (counted_positions) */
    } ae;
} Trainer;

/* ---- small utilities */

static double uniform01(uint64_t *state) {
    *state = rt_mix(*state);
    return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}


/* A refused file or a failed write: exit 1. */
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

/* Samples per optimizer step, over all ranks and micro-batches. */
static int64_t global_batch(const Trainer *t) { return t->m->batch * t->dist.ranks * t->o.accumulate; }

/* ---- the parameters: --list-params and their first values */

static void list_params(const RtModel *m) {
    int64_t total = 0, trainable = 0, buffers = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        char shape[128] = "[";
        for (int d = 0; d < p->rank; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        strcat(shape, "]");
        int half = p->offset >= m->n_param_floats - m->n_half_params; /* netc --frozen-half */
        printf("%-32s %-20s %12lld%s%s\n", p->name, shape, (long long)rt_param_numel(p),
               p->buffer ? "  buffer" : p->grad_offset < 0 ? "  frozen" : "",
               !half ? "" : m->half_params_dtype == RT_BF16 ? " (bf16 on the device)" : " (fp16 on the device)");
        if (p->buffer) {
            buffers += rt_param_numel(p);
            continue;
        }
        total += rt_param_numel(p);
        if (p->grad_offset >= 0) trainable += rt_param_numel(p);
    }
    printf("total %lld parameters (%lld trainable, %.3g%%)", (long long)total, (long long)trainable,
           total ? 100.0 * (double)trainable / (double)total : 0.0);
    if (buffers) printf(", %lld buffer values (running statistics)", (long long)buffers);
    printf("\n");
    /* the static memory plan: what setup_context allocates, the same in every step */
    double mib = 1.0 / (1 << 20), grads = (double)m->n_grad_floats * 4 * mib;
    double params = (double)((m->n_param_floats - m->n_half_params) * 4 + m->n_half_params * 2) * mib;
    double state = (double)(m->n_state_slots * m->n_grad_floats) * 4 * mib, acts = (double)m->arena_bytes * mib;
    printf("memory: parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f MiB, activations %.1f MiB; "
           "%.1f MiB in all\n", params, grads, state, acts, params + grads + state + acts);
}

/* ---- parameters and schedule */

void rt_init_params(const RtModel *m, float *params, uint64_t seed) {
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        uint64_t state = rt_mix(seed * 0x100000001B3ull + (uint64_t)i + 1);
        float *x = params + p->offset;
        for (int64_t k = 0; k < rt_param_numel(p); k++) {
            switch (p->init) {
            case RT_INIT_ZEROS: x[k] = 0; break;
            case RT_INIT_ONES: x[k] = 1; break;
            case RT_INIT_CONST: x[k] = p->init_a; break;
            case RT_INIT_UNIFORM: x[k] = (float)(p->init_a * (2 * uniform01(&state) - 1)); break;
            case RT_INIT_NORMAL: { /* Box-Muller */
                double u = uniform01(&state), v = uniform01(&state);
                x[k] = (float)(p->init_a * sqrt(-2 * log(1 - u)) * cos(2 * M_PI * v));
                break;
            }
            }
        }
    }
}

/* ---- logging */

/* Each log line is flushed as it is written. A write error (a full disk) is reported once, the
 * log is closed, and the run stops after the current step as a signal would stop it. */
static void log_line_done(Trainer *t) {
    if (fflush(t->log) == 0 && !ferror(t->log)) return;
    int e = errno ? errno : EIO;
    fprintf(stderr, "%serror: cannot write the log '%s': %s; stopping the run\n", t->tty ? "\n" : "", t->o.log,
            strerror(e));
    fclose(t->log);
    t->log = NULL, t->log_failed = 1;
}

static void json_number(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ", \"%s\": %.8g", key, v);
    else fprintf(f, ", \"%s\": null", key);
}

/* Metric i's key in the JSON Lines log: "accuracy" for the first (whatever its top_k), then
 * "top5_accuracy" for a top-5 one, "accuracy_2" for a second arg-max one. */
static const char *metric_key(const RtModel *m, int i, char *buf, size_t size) {
    if (i == 0) return "accuracy";
    if (m->metric_top_k[i] > 1) snprintf(buf, size, "top%d_accuracy", m->metric_top_k[i]);
    else snprintf(buf, size, "accuracy_%d", i + 1);
    return buf;
}

/* The metrics on a console line: " accuracy 0.7012 top-5 accuracy 0.9012" (a top-k metric
 * named so, a second arg-max one "accuracy_2"); "" without. */
static void accuracy_text(const RtModel *m, const double *acc, char *out, size_t size) {
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; m->has_accuracy && i < m->n_metrics && used < size; i++) {
        if (m->metric_top_k[i] > 1)
            used += (size_t)snprintf(out + used, size - used, " top-%d accuracy %.4f", m->metric_top_k[i], acc[i]);
        else if (i == 0)
            used += (size_t)snprintf(out + used, size - used, " accuracy %.4f", acc[i]);
        else
            used += (size_t)snprintf(out + used, size - used, " accuracy_%d %.4f", i + 1, acc[i]);
    }
}

/* acc: the interval's training accuracies (RtModel.n_metrics), logged only where the model has
 * metrics. wait: the share of the interval a distributed trainer spent waiting for the other ranks. */
static void log_interval(Trainer *t, int64_t step, int64_t epoch, double loss, const double *acc, double lr,
                         double rate, double wait) {
    char key[32];
    if (t->log) {
        fprintf(t->log, "{\"step\": %lld, \"epoch\": %lld", (long long)step, (long long)epoch);
        json_number(t->log, "loss", loss);
        for (int i = 0; t->m->has_accuracy && i < t->m->n_metrics; i++)
            json_number(t->log, metric_key(t->m, i, key, sizeof key), acc[i]);
        json_number(t->log, "lr", lr);
        if (t->m->clip_grad_norm > 0) json_number(t->log, "grad_norm", t->grad_norm);
        if (t->m->loss_scaling) { /* the scale after the step, and the steps skipped so far */
            fprintf(t->log, ", \"loss_scale\": %.17g, \"skipped_steps\": %lld", t->scale.scale, /* exact */
                    (long long)t->scale.skipped);
        }
        json_number(t->log, "samples_per_s", rate);
        if (t->m->comm || t->o.accumulate > 1) { /* the batch of each rank and of the step */
            fprintf(t->log, ", \"ranks\": %d, \"batch\": %lld, \"global_batch\": %lld", t->dist.ranks,
                    (long long)t->m->batch, (long long)global_batch(t));
            if (t->o.accumulate > 1) fprintf(t->log, ", \"accumulate\": %d", t->o.accumulate);
        }
        if (t->m->comm) json_number(t->log, "comm_wait", wait); /* waiting for the other ranks */
        fprintf(t->log, "}\n");
        log_line_done(t);
    }
    char accuracy[160];
    accuracy_text(t->m, acc, accuracy, sizeof accuracy);
    char norm[96] = "";
    if (t->m->clip_grad_norm > 0) snprintf(norm, sizeof norm, " grad_norm %.4g", t->grad_norm);
    if (t->m->loss_scaling)
        snprintf(norm + strlen(norm), sizeof norm - strlen(norm), " scale %.4g (%lld skipped)", t->scale.scale,
                 (long long)t->scale.skipped);
    char comm[48] = "";
    if (t->dist.ranks > 1) snprintf(comm, sizeof comm, " (%.0f%% waiting)", 100 * wait);
    rt_console_line(&t->con, "epoch %lld step %lld/%lld loss %.4f%s lr %.4g%s %.0f samples/s%s", (long long)epoch,
                    (long long)step, (long long)t->total, loss, accuracy, lr, norm, rate, comm);
}

/* Epoch 0: the one evaluation of --eval-only, outside any training. */
static void log_eval(Trainer *t, int64_t epoch, int64_t step, double loss, const double *acc) {
    char key[32];
    if (t->log) {
        fprintf(t->log, "{\"eval\": true");
        if (epoch) fprintf(t->log, ", \"epoch\": %lld", (long long)epoch);
        if (epoch && t->o.eval_every_steps) fprintf(t->log, ", \"step\": %lld", (long long)step);
        json_number(t->log, "loss", loss);
        for (int i = 0; t->m->has_accuracy && i < t->m->n_metrics; i++)
            json_number(t->log, metric_key(t->m, i, key, sizeof key), acc[i]);
        fprintf(t->log, "}\n");
        log_line_done(t);
    }
    char accuracy[160], num[32], meta[48];
    accuracy_text(t->m, acc, accuracy, sizeof accuracy);
    if (t->m->has_accuracy) { /* MLPerf's quality: the first metric */
        snprintf(meta, sizeof meta, "\"epoch_num\": %lld", (long long)epoch);
        RT_MLLOG(&t->ml, RT_ML_POINT, "eval_accuracy", rt_json_num(num, sizeof num, acc[0]), meta);
    }
    if (epoch && t->o.eval_every_steps)
        rt_console_line(&t->con, "eval step %lld (epoch %lld): loss %.4f%s", (long long)step, (long long)epoch, loss,
                        accuracy);
    else if (epoch) rt_console_line(&t->con, "eval epoch %lld: loss %.4f%s", (long long)epoch, loss, accuracy);
    else rt_console_line(&t->con, "eval: loss %.4f%s", loss, accuracy); /* --eval-only */
}

/* The progress line on a terminal: the step counted as the log lines count it (of the whole
 * run), the rate over `done` steps since t0, and the time the rest of the run needs at it. */
static void progress(Trainer *t, int64_t done, double t0) {
    double tn = rt_now();
    double rate = (double)done * (double)global_batch(t) / (tn - t0);
    double eta = rate > 0 ? (double)(t->total - t->pos.step) * (double)global_batch(t) / rate : 0;
    rt_console_progress(&t->con, tn, "epoch %lld step %lld/%lld  %.0f samples/s  ETA %.0fs", (long long)t->pos.epoch,
                        (long long)t->pos.step, (long long)t->total, rate, eta);
}

/* ---- evaluation */

static int data_changed(Trainer *t, const RtError *err);

/* accuracy(..., ignore_index = I) (RtModel.metric_counts): the positions of the first n_valid
 * samples of the label input whose label is not I, counted in the batch the step reads; the
 * accuracy is the correct ones over these. 0 for another model. */
static double counted_positions(const RtModel *m, void *const *batch, int64_t n_valid) {
    if (!m->metric_counts) return 0;
    const RtInput *in = &m->inputs[m->metric_input];
    int64_t n = n_valid, counted = 0, ignore = m->metric_ignore;
    for (int d = 0; d < in->rank; d++) n *= in->shape[d];
    const void *p = batch[m->metric_input];
    for (int64_t i = 0; i < n; i++) { /* labels are integers (semantic analysis checks) */
        int64_t v = in->dtype == RT_I64 ? ((const int64_t *)p)[i]
                    : in->dtype == RT_I32 ? ((const int32_t *)p)[i] : ((const uint8_t *)p)[i];
        counted += v != ignore;
    }
    return (double)counted;
}

/* The accuracy of `correct` predictions among `samples` samples, or among `counted` positions. */
static double accuracy_of(const RtModel *m, double correct, double samples, double counted) {
    if (!m->metric_counts) return correct / samples;
    return counted > 0 ? correct / counted : 0;
}

/* acc[i] = accuracy_of metric i's correct[i] (each metric counts the same samples or positions). */
static void accuracies(const RtModel *m, const double *correct, double samples, double counted, double *acc) {
    for (int i = 0; i < RT_MAX_METRICS; i++) acc[i] = i < m->n_metrics ? accuracy_of(m, correct[i], samples, counted) : 0;
}

/* An evaluation's sums, added up over the ranks: the loss times the samples, each metric's correct
 * predictions, the positions counted (RtModel.metric_counts). */
enum { SUM_LOSS, SUM_CORRECT, SUM_COUNTED = SUM_CORRECT + RT_MAX_METRICS, N_SUMS };

/* Every rank takes rank 0's running statistics (rt_dist_share_buffers); a device trainer's on
 * the device too. */
static void share_buffers(Trainer *t) {
    const RtModel *m = t->m;
    int any = 0;
    for (int i = 0; i < m->n_params; i++) any |= m->params[i].buffer;
    if (t->dist.ranks == 1 || !any) return;
    if (t->dev) t->dev->download(t->ctx.params, NULL);
    rt_dist_share_buffers(&t->dist, t->ctx.params);
    if (t->dev) t->dev->upload(t->ctx.params, NULL);
}

/* The sums of an evaluation (loss x samples, correct predictions, positions counted) over this
 * rank's batches: batch nth is rank (nth mod ranks)'s, or every batch is (`all`). 0, or the exit
 * status after the evaluation data changed under the trainer. */
static int eval_sums(Trainer *t, const RtDataset *ds, void *const *bufs, int all, double sums[N_SUMS]) {
    const RtModel *m = t->m;
    RtError err;
    int64_t *idx = rt_alloc((size_t)m->batch * sizeof *idx, "evaluation indices");
    double loss = 0, correct[RT_MAX_METRICS] = {0}, counted = 0;
    int64_t nth = 0;
    for (int64_t start = 0; start < ds->n_samples; start += m->batch) {
        if (!all && nth++ % t->dist.ranks != t->dist.rank) continue;
        int64_t count = rt_gather_from(m, ds, start, idx, bufs, &err);
        if (count < 0) {
            if (t->dev) t->dev->read_eval(&loss, correct); /* drop the partial sums */
            free(idx);
            return data_changed(t, &err);
        }
        counted += counted_positions(m, bufs, count);
        if (t->dev) { /* the sums add up on the device */
            t->dev->eval_step(bufs, count);
            continue;
        }
        t->ctx.inputs = bufs;
        t->ctx.n_valid = count; /* the padded rows count neither in the loss nor the accuracy */
        m->eval_step(&t->ctx);
        loss += (double)t->ctx.loss * (double)count;
        for (int i = 0; i < RT_MAX_METRICS; i++) correct[i] += t->ctx.correct[i];
    }
    if (t->dev) t->dev->read_eval(&loss, correct);
    free(idx);
    sums[SUM_LOSS] = loss, sums[SUM_COUNTED] = counted;
    memcpy(sums + SUM_CORRECT, correct, sizeof correct);
    return 0;
}

/* The evaluation of `epoch` (after `step`) met the target: the run stops (target_stop), as if it
 * had ended there. */
static void target_reached(Trainer *t, int64_t epoch, int64_t step) {
    char text[96];
    rt_target_text(&t->o.target, text, sizeof text);
    if (t->o.eval_every_steps)
        rt_console_line(&t->con, "target reached (%s) by the evaluation after step %lld: training stops", text,
                        (long long)step);
    else
        rt_console_line(&t->con, "target reached (%s) by epoch %lld's evaluation: training stops", text,
                        (long long)epoch);
    if (!t->log) return;
    fprintf(t->log, "{\"target_reached\": true, \"epoch\": %lld, \"step\": %lld}\n", (long long)epoch,
            (long long)t->pos.step);
    log_line_done(t);
}

/* --save-best: the parameters the evaluation of (epoch, step) saw (NULL: still only on the
 * device), when its quality, the first metric's accuracy or minus the loss of a model without one,
 * beats the run's best so far (t->pos, which checkpoints keep; a tie keeps the earlier). Every
 * rank keeps the record; rank 0 writes the file, as --save. */
static void keep_best(Trainer *t, int64_t epoch, int64_t step, double loss, double accuracy, const float *params) {
    RtTrainState *p = &t->pos;
    double q = t->m->has_accuracy ? accuracy : -loss;
    if (!isfinite(q) || (p->has_best && q <= p->best)) return;
    p->has_best = 1, p->best = q, p->best_epoch = epoch, p->best_step = step;
    if (!t->o.save_best) return;
    if (!params) { /* the device's, as they are now: the evaluation was between steps */
        t->dev->download(t->ctx.params, NULL);
        params = t->ctx.params;
    }
    RtError err;
    if (!rt_st_save(t->o.save_best, t->m, params, &err)) return;
    fprintf(stderr, "%serror: %s; stopping the run\n", t->tty ? "\n" : "", err.msg);
    t->best_failed = 1;
}

/* An evaluation's line, from its sums over every rank; then the best and the target, which it
 * may have beaten and met. `params`: what it evaluated, as keep_best takes them. */
static void log_eval_sums(Trainer *t, int64_t samples, int64_t epoch, int64_t step, const double sums[N_SUMS],
                          const float *params) {
    char meta[48];
    snprintf(meta, sizeof meta, "\"epoch_num\": %lld", (long long)epoch);
    double n = (double)samples, loss = sums[SUM_LOSS] / n, acc[RT_MAX_METRICS];
    accuracies(t->m, sums + SUM_CORRECT, n, sums[SUM_COUNTED], acc);
    log_eval(t, epoch, step, loss, acc);
    RT_MLLOG(&t->ml, RT_ML_END, "eval_stop", NULL, meta);
    keep_best(t, epoch, step, loss, acc[0], params);
    if (rt_target_eval(&t->o.target, epoch, loss, acc[0])) target_reached(t, epoch, step);
}

static int take_sums(Trainer *t, int wait);

/* --eval-rank, training rank 0: the evaluation in flight logged once the evaluator has sent its
 * sums; when `wait`, after waiting for them. */
static void collect_eval(Trainer *t, int wait) {
    double sums[N_SUMS];
    int64_t epoch;
    if (!t->eval_epoch || !t->dist.comm->eval_result(sums, N_SUMS, &epoch, wait)) return;
    t->eval_epoch = 0;
    /* the training line before it; rank 0 alone is here, so a stop waits in t->dev_stop for the
     * next log point, where every rank finds it */
    if (t->dev) (void)take_sums(t, 1);
    log_eval_sums(t, t->eval_samples, epoch, t->eval_step, sums, t->eval_params);
}

/* --eval-rank, training rank 0: a copy of the parameters to the evaluator, once it has finished
 * the last evaluation (one at a time), and training goes on. */
static void hand_over_eval(Trainer *t, const RtDataset *ds, int64_t epoch) {
    size_t bytes = (size_t)t->m->n_param_floats * sizeof(float);
    collect_eval(t, 1);
    t->eval_samples = ds->n_samples;
    if (t->dev) t->dev->download(t->ctx.params, NULL);
    if (!t->eval_params) t->eval_params = rt_alloc(bytes, "the parameters to evaluate");
    memcpy(t->eval_params, t->ctx.params, bytes);
    t->dist.comm->eval_send(t->eval_params, t->m->n_param_floats, epoch);
    t->eval_epoch = epoch, t->eval_step = t->pos.step;
}

/* --eval-async: hand the device this rank's next batches of the evaluation in flight, `most` of
 * them at most (batch nth is rank nth mod ranks's, as eval_sums takes them). 0, or the exit
 * status after the evaluation data changed under the trainer. */
static int feed_eval(Trainer *t, int64_t most) {
    const RtModel *m = t->m;
    const RtDataset *ds = t->ae.ds;
    RtError err;
    for (; t->ae.next * m->batch < ds->n_samples && most > 0; t->ae.next++) {
        if (t->ae.next % t->dist.ranks != t->dist.rank) continue;
        int64_t count = rt_gather_from(m, ds, t->ae.next * m->batch, t->ae.idx, t->ae.bufs, &err);
        if (count < 0) {
            t->ae.active = 0;
            return data_changed(t, &err);
        }
        t->ae.counted += counted_positions(m, t->ae.bufs, count);
        t->dev->eval_async_step(t->ae.bufs, count);
        most--;
    }
    return 0;
}

/* --eval-async: the evaluation in flight, whole: its last batches handed over, its sums read
 * (waiting for the device's second stream), added up over the ranks and logged. Every rank
 * calls it at the same point of the run. */
static int finish_eval(Trainer *t) {
    if (!t->ae.active) return 0;
    int rc = feed_eval(t, INT64_MAX);
    if (rc) return rc;
    if ((rc = take_sums(t, 1))) return rc; /* the training line before it */
    double sums[N_SUMS] = {0};
    sums[SUM_COUNTED] = t->ae.counted;
    t->dev->eval_async_read(&sums[SUM_LOSS], &sums[SUM_CORRECT]);
    t->ae.active = 0;
    rt_dist_sum(&t->dist, sums, N_SUMS, "summing the evaluation");
    log_eval_sums(t, t->ae.ds->n_samples, t->ae.epoch, t->ae.step, sums, NULL); /* no --save-best */
    return 0;
}

/* --eval-async: after each training step, one more batch of the evaluation in flight; a step
 * after every rank has handed over its last one (the same step on every rank), its result. */
static int step_eval(Trainer *t) {
    if (!t->ae.active) return 0;
    int rc = feed_eval(t, 1);
    if (rc) return rc;
    int64_t batches = (t->ae.ds->n_samples + t->m->batch - 1) / t->m->batch;
    int64_t per_rank = (batches + t->dist.ranks - 1) / t->dist.ranks;
    return ++t->ae.steps > per_rank ? finish_eval(t) : 0;
}

/* --eval-async: the evaluation of the parameters as they are now starts on the device, after
 * the one before it has ended; the training steps go on beside it. */
static int begin_eval(Trainer *t, const RtDataset *ds, void *const *bufs, int64_t epoch) {
    int rc = finish_eval(t);
    if (rc) return rc;
    if (!t->ae.idx) t->ae.idx = rt_alloc((size_t)t->m->batch * sizeof *t->ae.idx, "evaluation indices");
    t->dev->eval_async_begin();
    t->ae.active = 1, t->ae.ds = ds, t->ae.bufs = bufs, t->ae.epoch = epoch, t->ae.step = t->pos.step;
    t->ae.next = 0, t->ae.steps = 0, t->ae.counted = 0;
    return 0;
}

/* 0, or the exit status after the evaluation data changed under the trainer. */
static int evaluate(Trainer *t, const RtDataset *ds, void *const *bufs, int64_t epoch) {
    RtError err;
    if (rt_dataset_unchanged(ds, &err)) return data_changed(t, &err);
    char meta[48];
    snprintf(meta, sizeof meta, "\"epoch_num\": %lld", (long long)epoch);
    RT_MLLOG(&t->ml, RT_ML_START, "eval_start", NULL, meta);
    share_buffers(t);
    if (t->o.eval_rank) {
        if (t->dist.rank == 0) hand_over_eval(t, ds, epoch);
        return 0;
    }
    if (t->o.eval_async) return begin_eval(t, ds, bufs, epoch);
    double sums[N_SUMS];
    int rc = eval_sums(t, ds, bufs, 0, sums);
    if (rc) return rc;
    rt_dist_sum(&t->dist, sums, N_SUMS, "summing the evaluation");
    log_eval_sums(t, ds->n_samples, epoch, t->pos.step, sums, t->dev ? NULL : t->ctx.params);
    return 0;
}

/* eval_every_steps = N: an evaluation after every N-th step of the run but its last, which
 * train() evaluates after as at the end of an epoch. A checkpoint or stop after such a step
 * comes after its evaluation, so a resumed run has none to make up. The evaluation's time is
 * left out of the samples/s of the interval around it (t0 and interval_t0: run_batches' clocks). */
static int step_evaluation(Trainer *t, double *t0, double *interval_t0) {
    int64_t every = t->o.eval_every_steps, step = t->pos.step;
    if (!t->eval_ds || !every || step % every != 0 || step >= t->total) return 0;
    double start = rt_now();
    int rc = t->dev ? take_sums(t, 1) : 0; /* the training line before it */
    if (!rc) rc = evaluate(t, t->eval_ds, t->eval_bufs, t->pos.epoch);
    double spent = rt_now() - start;
    *t0 += spent, *interval_t0 += spent, t->line_t += spent;
    return rc;
}

/* --eval-rank: the evaluator's part of the run, every evaluation training rank 0 hands over,
 * whole, until training ends; then training's exit status. */
static int serve_evals(Trainer *t, const RtDataset *ds, void *const *bufs) {
    int64_t epoch;
    for (int first = 1; t->dist.comm->eval_next(t->ctx.params, t->m->n_param_floats, &epoch); first = 0) {
        RtError err;
        if (rt_dataset_unchanged(ds, &err)) return data_changed(t, &err);
        if (t->dev) { /* the parameters, and (once) a device state whose sums are zero */
            t->dev->upload(t->ctx.params, NULL);
            if (first) t->dev->start(0, 1, 1, t->o.seed, NULL);
        }
        double sums[N_SUMS];
        int rc = eval_sums(t, ds, bufs, 1, sums);
        if (rc) return rc;
        t->dist.comm->eval_reply(sums, N_SUMS, epoch);
    }
    return (int)epoch;
}

/* ---- signals
 *
 * The first SIGINT or SIGTERM asks the loop to stop after the current step (or evaluation) and
 * write a checkpoint; a second one exits at once with status 128 + signal, removing a
 * half-written checkpoint's temporary file. The handler does only async-signal-safe things:
 * set a flag, write(), unlink(), _exit().
 */

static volatile sig_atomic_t stop_signal;
static volatile sig_atomic_t signal_quiet;

static void on_signal(int sig) {
    if (stop_signal) {
        rt_out_abandon();
        _exit(128 + sig);
    }
    stop_signal = sig;
    static const char msg[] = "\nstopping after this step; signal again to quit at once\n";
    if (!signal_quiet) {
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)ignored;
    }
}

/* The handler runs on a stack of its own (SA_ONSTACK). Otherwise the kernel writes the signal's
 * frame, with the vector registers' state (some 3 KB under AVX-512), just below the interrupted
 * code's stack pointer, and a signal that lands in code keeping data there clobbers it: with
 * oneDNN's matrix products, about one run in a hundred signalled at a random moment hung or
 * corrupted the heap (none in 600 with NETC_GEMM=reference). The kernel prefers the main thread
 * for a signal sent to the process, and this stack is the main thread's. */
static void catch_stop_signals(int quiet) {
    static char alt_stack[64 * 1024];
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    /* SA_RESTART: a checkpoint's write() and fsync() are not cut short by EINTR */
    sa.sa_flags = SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    signal_quiet = quiet;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- checkpoints */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* The first parameter (or the optimizer state) holding NaN or Inf, or NULL. A finite loss does
 * not prove finite parameters (an overflowing gradient), and a checkpoint must never hold them. */
static const char *nonfinite_params(const Trainer *t) {
    const RtModel *m = t->m;
    for (int i = 0; i < m->n_params; i++) {
        const float *x = t->ctx.params + m->params[i].offset;
        for (int64_t k = 0; k < rt_param_numel(&m->params[i]); k++)
            if (!isfinite(x[k])) return m->params[i].name;
    }
    return NULL;
}

/* The floats of the optimizer state this process holds. */
static int64_t state_floats(const Trainer *t) {
    return t->m->n_state_slots * (t->ctx.shard ? t->ctx.shard->floats : t->m->n_grad_floats);
}

static const char *nonfinite_state(Trainer *t) {
    const char *bad = nonfinite_params(t);
    if (bad) return bad;
    for (int64_t k = 0; k < state_floats(t); k++)
        if (!isfinite(t->ctx.optstate[k])) bad = "the optimizer state";
    if (t->gather_state) { /* each rank sees its own part: the verdict is every rank's */
        double any = bad != NULL;
        rt_dist_sum(&t->dist, &any, 1, "checking the optimizer state");
        if (any > 0) bad = "the optimizer state";
    }
    return bad;
}

static int device_sums(Trainer *t);

static int write_checkpoint(Trainer *t) {
    if (!(t->o.checkpoint || t->gather_state) || t->ckpt_current) return 0;
    collect_eval(t, 1); /* a run resumed from the checkpoint must not lose an evaluation it counts as done */
    if (t->dev) { /* the device holds the run: check its losses, then fetch its state */
        int rc = device_sums(t);
        if (rc) return rc;
        t->dev->download(t->ctx.params, t->ctx.optstate);
    }
    const char *bad = nonfinite_state(t);
    if (bad) {
        fprintf(stderr, "%serror: %s holds NaN or Inf after step %lld; stopping without writing a checkpoint "
                        "(the last one, if any, is kept)\n  hint: lower the learning rate\n",
                t->tty ? "\n" : "", bad, (long long)t->pos.step);
        return EXIT_NONFINITE;
    }
    RtTrainState s = t->pos; /* the position, and the number of samples */
    s.total_steps = t->total, s.epochs = t->o.epochs, s.steps = t->o.steps;
    s.seed = t->o.seed, s.shuffle = t->o.shuffle, s.threads = t->o.threads, s.ranks = t->dist.ranks;
    s.accumulate = t->o.accumulate;
    s.has_scale = t->m->loss_scaling || t->carry_scale, s.scale = t->scale;
    rt_augment_text(t->m, &t->aug, s.augment, sizeof s.augment);
    float *state = t->ctx.optstate, *whole = NULL; /* the whole state, as one process holds it */
    if (t->gather_state) {
        if (t->o.checkpoint)
            whole = state = rt_alloc((size_t)(t->m->n_state_slots * t->m->n_grad_floats) * sizeof *state,
                                         "the whole optimizer state");
        rt_dist_gather_state(&t->dist, t->ctx.optstate, whole);
    }
    t->ckpt_current = 1;
    if (!t->o.checkpoint) return 0; /* rank 0 writes */
    RtError err;
    int failed = rt_ckpt_save(t->o.checkpoint, t->m, t->ctx.params, state, &s, &err);
    free(whole);
    if (failed) {
        t->ckpt_current = 0;
        fprintf(stderr, "%serror: %s\n", t->tty ? "\n" : "", err.msg);
        return 1;
    }
    if (t->log) {
        fprintf(t->log, "{\"checkpoint\": ");
        json_string(t->log, t->o.checkpoint);
        fprintf(t->log, ", \"step\": %lld, \"epoch\": %lld}\n", (long long)s.step, (long long)s.epoch);
        log_line_done(t);
    }
    return 0;
}

/* A signal, or --stop-at short of the end, asks the run to stop after the current step. */
static int stop_asked(const Trainer *t) { return stop_signal || t->log_failed || t->ml.failed || t->best_failed; }

/* A distributed run stops where every rank agrees to: each step's sums carry the ranks' requests. */
static int stopping(const Trainer *t) {
    return (t->dist.ranks > 1 ? t->stop_agreed : stop_asked(t)) ||
           (t->o.stop_at && t->pos.step >= t->o.stop_at && t->pos.step < t->total);
}

/* The target is met: the run stops after this step. Every rank evaluates alike, and knows it
 * together, except under --eval-rank, where training rank 0 learns it and the step's sums tell
 * the others (target_agreed). */
static int target_stop(const Trainer *t) {
    return t->o.eval_rank && t->dist.ranks > 1 ? t->target_agreed : t->o.target.met;
}

/* After a stop: keep what can be kept and say how to go on. A failed log write ends the run
 * with status 1 (an I/O error), a signal or --stop-at with 4. */
static int stop_run(Trainer *t) {
    int log_failed = t->log_failed || t->ml.failed || t->best_failed;
    const char *name = t->best_failed       ? "the failed --save-best write"
                       : log_failed         ? "the failed log write"
                       : stop_signal == SIGINT ? "SIGINT"
                       : stop_signal           ? "SIGTERM"
                       : t->stop_agreed        ? "a signal to another rank"
                                               : "--stop-at";
    int status = log_failed ? 1 : EXIT_STOPPED;
    if (t->dist.rank > 0) { /* rank 0 says it, and writes the checkpoint (with the others' optimizer state) */
        int rc = t->gather_state ? write_checkpoint(t) : 0;
        return rc ? rc : status;
    }
    long long step = (long long)t->pos.step, total = (long long)t->total;
    if (!t->o.checkpoint) {
        fprintf(stderr, "%sstopped by %s after step %lld of %lld; nothing is saved (no --checkpoint was given)\n",
                t->tty ? "\n" : "", name, step, total);
        return status;
    }
    int rc = write_checkpoint(t);
    if (rc) return rc;
    fprintf(stderr, "%sstopped by %s after step %lld of %lld; checkpoint '%s' holds the run: continue it with "
                    "--resume %s\n", t->tty ? "\n" : "", name, step, total, t->o.checkpoint, t->o.checkpoint);
    return status;
}

/* A data file changed under the trainer: say which, and keep the run where a checkpoint was
 * asked for (the steps taken are sound; the rest needs the data back as it was). */
static int data_changed(Trainer *t, const RtError *err) {
    fprintf(stderr, "%serror: %s\n", t->tty ? "\n" : "", err->msg);
    if (!t->o.checkpoint) return 1;
    int rc = write_checkpoint(t);
    if (rc) return rc;
    fprintf(stderr, "checkpoint '%s' holds the run after step %lld: restore the data, then --resume %s\n",
            t->o.checkpoint, (long long)t->pos.step, t->o.checkpoint);
    return 1;
}

/* ---- training */

static void shuffle(int64_t *order, int64_t n, uint64_t seed, int64_t epoch) {
    uint64_t state = rt_mix(seed ^ rt_mix((uint64_t)epoch + 0x5EED));
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(uniform01(&state) * (double)(i + 1));
        int64_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

/* The run stops at `step`: `what` is not finite there (`after`: more of the reason). */
static int nonfinite_stop(Trainer *t, int64_t step, const char *what, const char *after, const char *hint) {
    if (t->dist.rank > 0) return EXIT_NONFINITE; /* the ranks' sums: every rank stops, rank 0 says why */
    fprintf(stderr, "%serror: %s at step %lld%s; stopping before any weights are saved\n  hint: %s\n",
            t->tty ? "\n" : "", what, (long long)step, after, hint);
    if (t->o.checkpoint) fprintf(stderr, "  note: checkpoint '%s' is left as it was\n", t->o.checkpoint);
    return EXIT_NONFINITE;
}

static int nonfinite_loss(Trainer *t, int64_t step, const char *what) {
    char loss[48];
    snprintf(loss, sizeof loss, "the loss is %s", what);
    return nonfinite_stop(t, step, loss, "", "lower the learning rate, or check the data for NaN/Inf values");
}

static int check_finite(Trainer *t, int64_t step) {
    if (isfinite(t->ctx.loss)) return 0;
    return nonfinite_loss(t, step, isnan(t->ctx.loss) ? "NaN" : "infinite");
}

/* Device trainers: take the sums posted at a log point (or by device_sums), waiting for the
 * device to get there when `wait`, else only if it already has (0 otherwise); add them to
 * t->dev_loss, and write the log line they end. The exit status of a non-finite loss they show,
 * kept in t->dev_stop for a caller that cannot stop the run there, or 0. The device checks every
 * step's loss itself and, from the first non-finite one on, leaves the parameters alone, so a run
 * that stops a few steps later still ends with the last good parameters, as on the CPU. */
static int take_sums(Trainer *t, int wait) {
    RtDeviceSums s;
    if (!t->posted || !t->dev->take_train(&s, wait)) return 0;
    t->posted = 0;
    /* a distributed trainer's device sums each step's loss and correct predictions over the ranks */
    t->dev_loss += s.loss / t->dist.ranks, t->dev_steps += s.steps;
    for (int i = 0; i < RT_MAX_METRICS; i++) t->dev_correct[i] += s.correct[i];
    t->grad_norm = s.grad_norm;
    if (t->m->loss_scaling) t->scale = s.scale;
    if (s.nonfinite_step && s.nonfinite_grads) /* loss scaling: not an overflow, divergence */
        return t->dev_stop = nonfinite_stop(t, s.nonfinite_step, "the gradients are NaN or infinite",
                                            " although the loss is finite, even with the loss scale at its "
                                            "smallest (2^-24)",
                                            "lower the learning rate, or train with --precision bf16 or fp32");
    if (s.nonfinite_step) return t->dev_stop = nonfinite_loss(t, s.nonfinite_step, "NaN or infinite");
    if (!t->line.pending) return 0;
    double tn = rt_now(), acc[RT_MAX_METRICS];
    accuracies(t->m, t->dev_correct, (double)(t->dev_steps * global_batch(t)), t->line.counted, acc);
    log_interval(t, t->line.step, t->line.epoch, t->dev_loss / (double)t->dev_steps, acc, t->line.lr,
                 t->line.samples / (tn - t->line_t), t->line.wait);
    t->line_t = tn, t->line.pending = 0;
    t->dev_loss = 0, t->dev_steps = 0;
    memset(t->dev_correct, 0, sizeof t->dev_correct);
    return 0;
}

/* Device trainers: every step queued so far in the sums (a checkpoint, the end of the run): the
 * line posted before, then the rest of the interval, waiting for both. */
static int device_sums(Trainer *t) {
    int rc = t->dev_stop ? t->dev_stop : take_sums(t, 1);
    if (rc) return rc;
    t->dev->post_train(), t->posted = 1;
    return take_sums(t, 1);
}

/* Device trainers at a log point: the interval's sums posted, to be taken once the device has
 * finished its steps (take_sums), while the host goes on queueing the next ones. The line of the
 * interval before is taken first, if the device is still on it, so one post is out at a time. */
static int post_line(Trainer *t, double samples, double wait, double counted) {
    int rc = take_sums(t, 1);
    if (rc || (rc = t->dev_stop)) return rc;
    const RtTrainState *p = &t->pos;
    t->line.pending = 1, t->line.step = p->step, t->line.epoch = p->epoch, t->line.lr = t->ctx.lr;
    t->line.samples = samples, t->line.wait = wait, t->line.counted = counted;
    t->dev->post_train(), t->posted = 1;
    return 0;
}

/* Steps in epoch e: all of them but in the last epoch of a --steps run. */
static int64_t epoch_steps(const Trainer *t, int64_t e) {
    int64_t left = t->total - (e - 1) * t->per_epoch;
    return left < t->per_epoch ? left : t->per_epoch;
}

/* The seed of this rank's dropout masks: the other ranks' differ from rank 0's, which are a lone
 * trainer's. */
static uint64_t rank_seed(const Trainer *t) {
    return t->dist.rank ? t->o.seed ^ rt_mix((uint64_t)t->dist.rank) : t->o.seed;
}

/* The host's update after a step's batches (not a device's, which updates on its own): the
 * mean gradient over the ranks and the step's K batches, the step's loss (the batches' mean,
 * `loss` their sum) and correct predictions over the ranks, the non-finite check, the optimizer. */
static int host_update(Trainer *t, int64_t step, double loss, const double *correct) {
    const RtModel *m = t->m;
    const int K = t->o.accumulate;
    t->ctx.loss = (float)(loss / K);
    for (int i = 0; i < RT_MAX_METRICS; i++) t->ctx.correct[i] = (float)correct[i];
    rt_dist_mean_grads(&t->dist, &t->ctx, K); /* the mean gradient over the ranks and the K batches */
    if (t->dist.ranks > 1) { /* the loss and accuracies over the ranks, and any stop asked */
        enum { LOSS, STOP, TARGET, COUNTED, CORRECT, N = CORRECT + RT_MAX_METRICS };
        double sums[N] = {[LOSS] = t->ctx.loss, [STOP] = stop_asked(t), [TARGET] = t->o.target.met,
                          [COUNTED] = t->counted};
        for (int i = 0; i < RT_MAX_METRICS; i++) sums[CORRECT + i] = t->ctx.correct[i];
        rt_dist_sum(&t->dist, sums, N, "summing the loss");
        t->ctx.loss = (float)(sums[LOSS] / t->dist.ranks);
        for (int i = 0; i < RT_MAX_METRICS; i++) t->ctx.correct[i] = (float)sums[CORRECT + i];
        t->stop_agreed = sums[STOP] > 0, t->target_agreed = sums[TARGET] > 0, t->counted = sums[COUNTED];
    }
    int rc = check_finite(t, step + 1); /* before the update: the last checkpoint stays the last good one */
    if (rc) return rc;
    m->optimizer_step(&t->ctx);
    if (m->shard_optimizer) rt_dist_gather_params(&t->dist, t->ctx.params);
    t->grad_norm = t->ctx.grad_norm;
    return 0;
}

/* One optimizer step on the next --accumulate batches of `pf` (K, one without it), at the
 * position t->pos, which it then advances. With K > 1 the gradients of the step's first K - 1
 * batches are summed in ctx.accum, the last one's added to them (bucket by bucket before the
 * ranks' sums: rt_grads_ready), and the optimizer takes their mean, the gradient of the mean loss
 * over the K batches: what one batch K times the size gives, up to the order of the sums. A
 * device does the same on its own (RtStepPart): the step is K launches, queued. */
static int train_step(Trainer *t, RtPrefetch *pf) {
    const RtModel *m = t->m;
    const int K = t->o.accumulate;
    int64_t step = t->pos.step;
    double t_step = rt_prof_on() ? rt_now() : 0;
    t->ctx.lr = (float)rt_lr_at(&m->schedule, step, t->per_epoch, t->total);
    t->ctx.step = step - t->scale.skipped; /* updates made: a loss-scaling run's skipped steps made none */
    t->ctx.n_valid = m->batch;
    double loss = 0, correct[RT_MAX_METRICS] = {0};
    t->counted = 0;
    for (int j = 0; j < K; j++) {
        void *const *batch = rt_prefetch_next(pf);
        if (!batch) return data_changed(t, &pf->err);
        t->counted += counted_positions(m, batch, m->batch);
        if (t->dev) { /* queued; the device keeps the learning rate, seeds, sums and step itself */
            t->dev->train_step(batch, K == 1 ? RT_STEP_WHOLE : j < K - 1 ? RT_STEP_SUM : RT_STEP_LAST);
            continue;
        }
        t->ctx.inputs = batch;
        t->ctx.seed = rt_step_seed(rank_seed(t), K > 1 ? step * K + j : step); /* each batch its masks */
        t->ctx.micro_left = K - 1 - j;
        t->ctx.update_in_backward = !t->o.update_after_backward && K == 1; /* the sum is not there yet */
        m->forward_backward(&t->ctx);
        loss += t->ctx.loss;
        for (int i = 0; i < RT_MAX_METRICS; i++) correct[i] += t->ctx.correct[i];
        if (j == 0 && K > 1) memcpy(t->ctx.accum, t->ctx.grads, (size_t)m->n_grad_floats * sizeof(float));
        else if (j < K - 1) rt_grads_add(t->ctx.accum, t->ctx.grads, m->n_grad_floats);
    }
    double t_update = rt_prof_on() ? rt_now() : 0;
    int rc = t->dev ? 0 : host_update(t, step, loss, correct);
    if (rc) return rc;
    if (rt_prof_on()) {
        double t_end = rt_now();
        rt_prof_step(t_end - t_step, t_end - t_update);
    }
    t->pos.step++, t->pos.batch++, t->pos.eval_done = 0;
    t->ckpt_current = 0;
    return 0;
}

/* Batches t->pos.batch .. n-1 of epoch t->pos.epoch, whose order is rebuilt from (seed, epoch)
 * so a resumed epoch sees the same batches as an uninterrupted one. Stops early on a signal. */
/* The steps since the last log line: their sums, kept until the line that reports them. */
typedef struct Interval {
    int64_t steps;
    double t0; /* when it began (evaluations inside it move it on by their time) */
    double loss, correct[RT_MAX_METRICS], counted;
} Interval;

/* The interval's log line, and a new interval. A device trainer's line is posted: it is written
 * when the device's sums arrive, without waiting for them inside an epoch. */
static int end_interval(Trainer *t, Interval *in) {
    double tn = rt_now(), samples = (double)(in->steps * global_batch(t)), wait = t->dist.wait_s / (tn - in->t0);
    int rc = 0;
    if (t->dev) {
        if (t->dist.ranks > 1) { /* the ranks' positions counted, and any stop asked, from here on */
            double sums[3] = {in->counted, stop_asked(t), t->o.target.met};
            rt_dist_sum(&t->dist, sums, 3, "summing the positions counted");
            in->counted = sums[0], t->stop_agreed = sums[1] > 0, t->target_agreed = sums[2] > 0;
        }
        rc = post_line(t, samples, wait, in->counted);
    } else {
        double acc[RT_MAX_METRICS];
        accuracies(t->m, in->correct, samples, in->counted, acc);
        log_interval(t, t->pos.step, t->pos.epoch, in->loss / (double)in->steps, acc, t->ctx.lr,
                     samples / (tn - in->t0), wait);
    }
    *in = (Interval){.t0 = tn};
    t->dist.wait_s = 0;
    return rc;
}

static int run_batches(Trainer *t, const RtDataset *ds, int64_t *order, int64_t *local, int64_t n) {
    const RtModel *m = t->m;
    RtTrainState *p = &t->pos;
    RtError err;
    if (p->batch >= n) return 0;
    if (rt_dataset_unchanged(ds, &err)) return data_changed(t, &err); /* checked at every epoch */
    for (int64_t i = 0; i < ds->n_samples; i++) order[i] = i;
    if (t->o.shuffle) shuffle(order, ds->n_samples, t->o.seed, p->epoch);
    const int64_t K = t->o.accumulate; /* batches per step (--accumulate), each rank's of the step's */
    if (t->dist.ranks > 1) rt_dist_shard(&t->dist, order, n * K, m->batch, local), order = local;
    int64_t first = p->batch;
    RtPrefetch pf;
    rt_prefetch_start(&pf, m, ds, order + first * K * m->batch, (n - first) * K, t->aug.any ? &t->aug : NULL,
                      t->o.seed, p->epoch);
    double t0 = rt_now();
    Interval in = {.t0 = t0};
    t->dist.wait_s = 0, t->line_t = t0;
    int rc = 0;
    while (p->batch < n && !stopping(t) && !target_stop(t)) {
        if ((rc = train_step(t, &pf))) break;
        in.loss += t->ctx.loss, in.counted += t->counted, in.steps++;
        for (int i = 0; i < RT_MAX_METRICS; i++) in.correct[i] += t->ctx.correct[i];
        progress(t, p->batch - first, t0);
        /* one rank: the posted line as soon as the device has got there; several take it at the
         * same point of the run on every rank, the next log point, so that they stop together */
        if (t->dev && t->dist.ranks == 1 && (rc = take_sums(t, 0))) break;
        /* same lines whether or not resumed */
        if ((p->batch % t->o.log_every == 0 || p->batch == n) && (rc = end_interval(t, &in))) break;
        if ((rc = step_evaluation(t, &t0, &in.t0))) break;
        collect_eval(t, 0); /* --eval-rank: an evaluation that has ended lands in the log after this step's line */
        if ((rc = step_eval(t))) break; /* --eval-async: the same */
        /* a run resumed from the checkpoint must not lose an evaluation it counts as done */
        if (t->o.checkpoint_every && p->step % t->o.checkpoint_every == 0 &&
            ((rc = finish_eval(t)) || (rc = write_checkpoint(t))))
            break;
    }
    /* stopped inside an interval (a signal, --stop-at, a target met): its steps get their line too,
     * on every rank alike, since every rank stops after the same step */
    if (!rc && in.steps) rc = end_interval(t, &in);
    rt_prefetch_stop(&pf); /* joins the loader thread on every way out */
    if (!rc && t->dev && !(rc = take_sums(t, 1))) rc = t->dev_stop; /* the epoch's last line, before its evaluation */
    return rc;
}

/* Epochs from t->pos until t->total steps; then the final checkpoint. A resumed run starts
 * inside its epoch and, when the checkpoint was taken between an epoch's last step and its
 * evaluation, runs that evaluation first. Evaluations, where there is evaluation data, read
 * t->eval_ds into t->eval_bufs. */
static int train(Trainer *t, const RtDataset *train_ds) {
    const RtModel *m = t->m;
    RtTrainState *p = &t->pos;
    int64_t *order = rt_alloc((size_t)train_ds->n_samples * sizeof *order, "the sample order");
    int64_t *local = t->dist.ranks > 1 ? rt_alloc((size_t)train_ds->n_samples * sizeof *local, "this rank's samples")
                                       : NULL;
    int rc = 0;
    catch_stop_signals(t->o.quiet);
    rt_prof_open(m, t->o.accumulate);
    for (;;) {
        int64_t n = epoch_steps(t, p->epoch);
        int steps_left = p->batch < n; /* no epoch_start or _stop for a resumed epoch's evaluation */
        if (steps_left) rt_mllog_epoch(&t->ml, RT_ML_START, p->epoch);
        if ((rc = run_batches(t, train_ds, order, local, n)) || stopping(t) || target_stop(t)) break;
        if (steps_left) rt_mllog_epoch(&t->ml, RT_ML_END, p->epoch);
        if (!p->eval_done) {
            int by_epoch = !t->o.eval_every_steps && p->epoch % t->o.eval_every == 0;
            if (t->eval_ds && (by_epoch || p->step == t->total) &&
                (rc = evaluate(t, t->eval_ds, t->eval_bufs, p->epoch)))
                break;
            p->eval_done = 1, t->ckpt_current = 0;
        }
        if (stopping(t) || target_stop(t) || p->step >= t->total) break;
        p->epoch++, p->batch = 0, p->eval_done = 0;
    }
    free(order), free(local);
    if (t->dist.rank == 0) rt_prof_report(stdout, t->o.threads);
    collect_eval(t, 1);
    if (!rc) rc = finish_eval(t);
    if (!rc && t->o.eval_rank && t->dist.ranks > 1) { /* rank 0's last evaluation may have met it */
        double met = t->o.target.met;
        rt_dist_sum(&t->dist, &met, 1, "agreeing on the target");
        t->target_agreed = met > 0;
    }
    if (!rc) rc = stopping(t) && !target_stop(t) ? stop_run(t) : write_checkpoint(t);
    return rc;
}
/* ---- gradient check */

/* Tolerance: the loss is float32, so a finite difference carries rounding error of about
 * 1e-6 * |L| / h (h = 1e-2 * max(1, |p|)) plus O(h^2) truncation; 1e-3 * max(1, |L|) absolute
 * plus 2e-2 relative covers both with margin while a wrong gradient (wrong sign, missing factor,
 * wrong element) is off by far more. */
static int gradcheck(Trainer *t, const RtDataset *ds, void *const *bufs) {
    const RtModel *m = t->m;
    /* A short batch's zero rows would count in the backward pass but not in the loss, so the
     * differences would disagree for no fault of the gradients: refused, as training does. */
    if (ds->n_samples < m->batch)
        die("--gradcheck needs one full batch: %s has %lld samples, fewer than one batch of %lld", t->o.data[0],
            (long long)ds->n_samples, (long long)m->batch);
    int64_t *idx = rt_alloc((size_t)m->batch * sizeof *idx, "indices");
    int64_t count = m->batch;
    for (int64_t r = 0; r < count; r++) idx[r] = r;
    RtError err;
    if (rt_gather(m, ds, idx, count, bufs, &err)) die("%s", err.msg);
    free(idx);
    RtCtx *c = &t->ctx;
    c->inputs = bufs, c->n_valid = count, c->seed = rt_mix(t->o.seed), c->step = 0;
    c->update_in_backward = 0; /* the parameters stay as they are */
    m->forward_backward(c);
    double loss = c->loss;
    float *ana = rt_alloc((size_t)m->n_grad_floats * sizeof *ana + 4, "gradients");
    memcpy(ana, c->grads, (size_t)m->n_grad_floats * sizeof *ana);
    int checked = 0, failed = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        int64_t n = rt_param_numel(p), k_max = n < 8 ? n : 8;
        if (p->grad_offset < 0) continue;
        for (int64_t k = 0; k < k_max; k++) {
            int64_t e = k_max > 1 ? k * (n - 1) / (k_max - 1) : 0;
            float *x = c->params + p->offset + e, x0 = *x;
            double h = 1e-2 * fmax(1.0, fabs(x0));
            *x = (float)(x0 + h);
            m->forward_backward(c);
            double lp = c->loss;
            *x = (float)(x0 - h);
            m->forward_backward(c);
            double lm = c->loss;
            *x = x0;
            double num = (lp - lm) / (2 * h), an = ana[p->grad_offset + e];
            double tol = 1e-3 * fmax(1.0, fabs(loss)) + 2e-2 * fmax(fabs(num), fabs(an));
            int ok = fabs(num - an) <= tol;
            checked++, failed += !ok;
            printf("%s %s[%lld]: analytic %.6g numeric %.6g\n", ok ? "ok  " : "FAIL", p->name, (long long)e, an, num);
        }
    }
    free(ana);
    printf("gradcheck: %d checked, %d failed (loss %.6g)\n", checked, failed, loss);
    return checked > 0 && failed == 0 ? 0 : 1;
}

/* ---- outputs
 *
 * Nothing a user has is destroyed. Before any work, every output is checked against every input
 * (the data, the --init weights, the checkpoint being resumed, this trainer's executable) and
 * against the other outputs, by device and inode, or by directory and name for a file that does
 * not exist yet. The one pair allowed is --checkpoint naming the --resume file: that is the run
 * continuing in its own checkpoint, which is read whole before the first step and later replaced
 * atomically. --save and --checkpoint replace only regular files, and each is probed by creating
 * and removing a temporary file beside it, so a missing directory or a read-only file system
 * stops the run before its first step, not after its last. The log is written through, not
 * replaced: it may also be a named pipe or a character device (a terminal, /dev/null).
 */

enum { MAX_FILES = (2 * RT_CIFAR_MAX_FILES + 1) * RT_MAX_INPUTS + 6, MAX_OUTPUTS = 9 };

typedef struct NamedFile {
    char what[160]; /* the option that names it, as the user wrote it */
    const char *path;
    RtFileId id;
} NamedFile;

static int add_file(NamedFile *files, int n, int follow, const char *path, const char *fmt, const char *arg) {
    if (!path) return n;
    snprintf(files[n].what, sizeof files[n].what, fmt, arg, path);
    files[n].path = path;
    rt_file_id(path, follow, &files[n].id);
    return n + 1;
}

/* A data argument: one file, or each file of a `cifar:F1,F2,...` list. */
static int add_data(NamedFile *files, int n, const char *spec, const char *fmt, const char *arg) {
    if (!spec || strncmp(spec, "cifar:", 6) != 0) return add_file(files, n, 1, spec, fmt, arg);
    for (const char *p = spec + 6; *p && n < MAX_FILES;) {
        size_t len = strcspn(p, ",");
        char file[PATH_MAX];
        snprintf(file, sizeof file, "%.*s", (int)(len < sizeof file ? len : sizeof file - 1), p);
        /* named by the argument as given: `file` is gone after this loop */
        snprintf(files[n].what, sizeof files[n].what, fmt, arg, spec);
        files[n].path = spec;
        rt_file_id(file, 1, &files[n++].id);
        p += len + (p[len] == ',');
    }
    return n;
}

static int list_inputs(const Trainer *t, NamedFile *in) {
    const RtOptions *o = &t->o;
    int n = 0;
    for (int i = 0; i < t->m->n_inputs; i++) {
        n = add_data(in, n, o->data[i], "--data %s=%s", t->m->inputs[i].name);
        n = add_data(in, n, o->eval[i], "--eval-data %s=%s", t->m->inputs[i].name);
        n = add_file(in, n, 1, o->predict[i], "--predict %s=%s", t->m->inputs[i].name);
    }
    n = add_file(in, n, 1, o->init, "--init%s %s", "");
    n = add_file(in, n, 1, o->resume, "--resume%s %s", "");
    for (int config = 0; config < 2 && o->adapter; config++)
        n = add_file(in, n, 1, o->adapter_files[config], "--adapter%s %s", "");
    return add_file(in, n, 1, "/proc/self/exe", "%sthis trainer's own executable", "");
}

/* The log: a regular file (replaced by a fresh run, appended to by a resumed one), or a file it
 * can be written through. Never a directory or a block device (a disk). */
static void check_log(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        char why[RT_WHY_MAX];
        if (errno != ENOENT) die("cannot write the log '%s': %s", path, strerror(errno));
        if (rt_out_probe(path, why, sizeof why) != 0) die("cannot write the log '%s': %s", path, why);
        return;
    }
    if (S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode))
        die("cannot write the log '%s': it is a %s", path, S_ISDIR(st.st_mode) ? "directory" : "block device");
    if (!S_ISREG(st.st_mode)) return; /* a pipe waits for its reader: not probed */
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) die("cannot write the log '%s': %s", path, strerror(errno));
    close(fd);
}

static void check_outputs(const Trainer *t) {
    const RtOptions *o = &t->o;
    NamedFile in[MAX_FILES], out[MAX_OUTPUTS];
    int n_in = list_inputs(t, in), n_out = 0;
    char why[RT_WHY_MAX];
    if (o->save && rt_out_probe(o->save, why, sizeof why) != 0) die("cannot save weights to '%s': %s", o->save, why);
    if (o->save_best && rt_out_probe(o->save_best, why, sizeof why) != 0)
        die("cannot save the best weights to '%s': %s", o->save_best, why);
    RtError err;
    if (o->checkpoint && rt_ckpt_check_writable(o->checkpoint, &err)) die("%s", err.msg);
    if (o->log) check_log(o->log);
    if (o->mllog) check_log(o->mllog);
    if (o->predict_out && rt_out_probe(o->predict_out, why, sizeof why) != 0)
        die("cannot write the predictions to '%s': %s", o->predict_out, why);
    if (o->save_merged && rt_out_probe(o->save_merged, why, sizeof why) != 0)
        die("cannot save the merged weights to '%s': %s", o->save_merged, why);
    struct stat st;
    if (o->save_adapter && mkdir(o->save_adapter, 0777) != 0 && errno != EEXIST)
        die("cannot make the adapter directory '%s': %s", o->save_adapter, strerror(errno));
    if (o->save_adapter && (stat(o->save_adapter, &st) != 0 || !S_ISDIR(st.st_mode)))
        die("cannot save the adapters to '%s': it is not a directory", o->save_adapter);
    for (int config = 0; config < 2 && o->save_adapter; config++) {
        const char *file = o->save_adapter_files[config];
        if (rt_out_probe(file, why, sizeof why) != 0) die("cannot save the adapters to '%s': %s", file, why);
        n_out = add_file(out, n_out, 0, file, "--save-adapter%s %s", "");
    }
    n_out = add_file(out, n_out, 0, o->save, "--save%s %s", "");
    n_out = add_file(out, n_out, 0, o->save_best, "--save-best%s %s", "");
    n_out = add_file(out, n_out, 0, o->checkpoint, "--checkpoint%s %s", "");
    n_out = add_file(out, n_out, 1, o->log, "--log%s %s", "");
    n_out = add_file(out, n_out, 1, o->mllog, "--mllog%s %s", "");
    n_out = add_file(out, n_out, 0, o->predict_out, "--predict-out%s %s", "");
    n_out = add_file(out, n_out, 0, o->save_merged, "--save-merged%s %s", "");
    for (int k = 0; k < n_out; k++) {
        for (int i = 0; i < n_in; i++) {
            int continuing = out[k].path == o->checkpoint && in[i].path == o->resume;
            if (!continuing && rt_same_file(&out[k].id, &in[i].id))
                rt_die_usage("%s names the same file as %s: writing it would destroy that input", out[k].what,
                             in[i].what);
        }
        for (int j = 0; j < k; j++)
            if (rt_same_file(&out[k].id, &out[j].id))
                rt_die_usage("%s and %s name the same file: one output would replace the other", out[j].what,
                             out[k].what);
    }
}

/* A fresh run replaces a regular log, a resumed run appends to it; a pipe or a device is written
 * as it is. The file is truncated only after it is open, and only when it is a regular file. */
static FILE *open_log(const Trainer *t, const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NOCTTY | O_CLOEXEC | (t->o.resume ? O_APPEND : 0), 0666);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (S_ISREG(st.st_mode) && !t->o.resume && ftruncate(fd, 0) != 0))
        die("cannot write the log '%s': %s", path, strerror(errno));
    FILE *f = fdopen(fd, t->o.resume ? "a" : "w");
    if (!f) die("cannot write the log '%s': %s", path, strerror(errno));
    return f;
}

/* A run that ended without an evaluation meeting its target failed (MLPerf's status "aborted"),
 * though what it trained is written as for any finished run. */
static int target_missed(Trainer *t) {
    const RtTarget *g = &t->o.target;
    char text[96], last[160] = "no evaluation in this process";
    rt_target_text(g, text, sizeof text);
    if (g->evaluated) {
        int n = snprintf(last, sizeof last, "the last evaluation, epoch %lld's, gave loss %.4f",
                         (long long)g->last_epoch, g->last_loss);
        if (t->m->has_accuracy) snprintf(last + n, sizeof last - (size_t)n, " accuracy %.4f", g->last_accuracy);
    }
    if (t->dist.rank == 0)
        fprintf(stderr, "%sthe run ended after step %lld without reaching its target (%s): %s\n",
                t->tty ? "\n" : "", (long long)t->pos.step, text, last);
    if (t->log) {
        fprintf(t->log, "{\"target_reached\": false, \"step\": %lld}\n", (long long)t->pos.step);
        log_line_done(t);
    }
    return EXIT_TARGET_MISSED;
}

/* The end of the run: the parameters, if asked for and finite, then the log and stdout closed
 * with their errors reported. Returns the run's exit status. */
static int finish(Trainer *t, int rc) {
    RtError err;
    rt_console_end(&t->con);
    const RtOptions *o = &t->o;
    const char *out = o->save ? o->save : o->save_adapter ? o->save_adapter : o->save_merged;
    const char *bad = rc || o->gradcheck || !out ? NULL : nonfinite_params(t);
    if (bad) {
        fprintf(stderr, "error: %s holds NaN or Inf at the end of the run; '%s' is not written (the old file, if "
                        "any, is unchanged)\n  hint: lower the learning rate\n", bad, out);
        rc = EXIT_NONFINITE;
    }
    if (!rc && !o->gradcheck &&
        ((o->save && rt_st_save(o->save, t->m, t->ctx.params, &err)) ||
         (o->save_adapter && rt_lora_save(o->save_adapter, t->m, t->ctx.params, &err)) ||
         (o->save_merged && rt_lora_save_merged(o->save_merged, t->m, t->ctx.params, &err)))) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
    }
    if (!rc && rt_target_on(&o->target) && !target_stop(t)) rc = target_missed(t);
    if (t->log && fclose(t->log) != 0 && !rc) {
        fprintf(stderr, "error: cannot write the log '%s': %s\n", t->o.log, strerror(errno));
        rc = 1;
    }
    t->log = NULL;
    if (rt_mllog_close(&t->ml, rc == 0) && !rc) rc = 1; /* a failed save is an aborted run too */
    if ((t->log_failed || t->best_failed) && !rc) rc = 1;
    if ((fflush(stdout) != 0 || ferror(stdout)) && !rc) {
        fprintf(stderr, "error: cannot write to the standard output: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}

/* ---- main */

static void open_data(const RtModel *m, const char *const *files, RtDataset *ds) {
    RtError err;
    if (rt_dataset_open(m, files, ds, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        exit(1);
    }
}

static void setup_context(Trainer *t) {
    const RtModel *m = t->m;
    RtCtx *c = &t->ctx;
    c->params = rt_alloc((size_t)m->n_param_floats * sizeof(float), "parameters");
    c->grads = rt_alloc((size_t)m->n_grad_floats * sizeof(float), "gradients");
    if (t->o.accumulate > 1 && !m->device) /* --accumulate: the sum of a step's earlier batches' gradients */
        c->accum = rt_alloc((size_t)m->n_grad_floats * sizeof(float), "the accumulated gradients");
    /* floats per slot; the evaluator of --eval-rank keeps none */
    int64_t state = t->dist.evaluator         ? 0
                    : m->shard_optimizer      ? rt_dist_shard_open(&t->dist, c)
                                              : m->n_grad_floats;
    c->optstate = rt_alloc((size_t)(m->n_state_slots * state) * sizeof(float), "optimizer state");
    if (rt_optimizer(m->optim)->apply_fn && !m->device) rt_pieces_open(m, c); /* LAMB on the CPU */
    if (m->shard_optimizer && !t->o.quiet)
        printf("sharded optimizer: rank 0 updates %lld of the %lld trainable parameters and keeps their optimizer "
               "state\n", (long long)state, (long long)m->n_grad_floats);
    c->arena = rt_alloc((size_t)m->arena_bytes, "activations");
    c->scratch_per_thread = m->scratch_per_thread;
    c->hyper = &m->hyper;
    c->scratch = rt_alloc((size_t)(t->o.threads * m->scratch_per_thread) * sizeof(float), "kernel scratch");
    rt_init_params(m, c->params, t->o.seed);
    RtError err;
    /* --eval-only or --predict with --resume FILE use the checkpoint's parameters, not its position
     * (rt_st_init takes a checkpoint as a weight file, without its optimizer state) */
    const char *file = t->o.init ? t->o.init : t->o.eval_only || t->o.predict_out ? t->o.resume : NULL;
    t->o.init_rules.report = stderr;
    t->o.init_rules.notes = t->o.quiet ? NULL : stdout;
    if (file && rt_st_init(file, m, c->params, &t->o.init_rules, &err))
        die("%s %s", t->o.init ? "--init" : "--resume", err.msg);
    if (t->o.adapter && rt_lora_load(t->o.adapter, m, c->params, &err)) die("--adapter %s", err.msg);
}

/* What setup_context allocated. */
static void free_context(RtCtx *c) {
    rt_pieces_close(c);
    free(c->params), free(c->grads), free(c->accum), free(c->optstate), free(c->arena), free(c->scratch);
}

/* A fresh run: from step 0 to --steps, or --epochs whole epochs. */
static void plan_run(Trainer *t, const RtDataset *ds) {
    t->per_epoch = ds->n_samples / global_batch(t);
    char ranks[96] = ""; /* a distributed run's batch is each rank's batch times the ranks */
    if (t->dist.ranks > 1 || t->o.accumulate > 1)
        snprintf(ranks, sizeof ranks, " (%d rank%s x --accumulate %d x batch %lld)", t->dist.ranks,
                 t->dist.ranks > 1 ? "s" : "", t->o.accumulate, (long long)t->m->batch);
    if (t->per_epoch == 0)
        die("%s has %lld samples, fewer than one %sbatch of %lld%s", t->o.data[0], (long long)ds->n_samples,
            t->dist.ranks > 1 || t->o.accumulate > 1 ? "global " : "", (long long)global_batch(t), ranks);
    t->total = t->o.steps;
    if (!t->o.steps && __builtin_mul_overflow(t->o.epochs, t->per_epoch, &t->total))
        rt_die_usage("--epochs %lld of %lld steps each is more than %lld steps", (long long)t->o.epochs,
                     (long long)t->per_epoch, (long long)INT64_MAX);
    t->pos = (RtTrainState){.epoch = 1, .samples = ds->n_samples};
}

/* The resumed run's length: the recorded one unless --epochs or --steps is given. A different
 * length is refused when the steps already taken would have had other learning rates (cosine
 * spans the whole run) or when the run is already past it; otherwise the result equals an
 * uninterrupted run of the new length. */
static void resume_target(Trainer *t, const RtTrainState *s) {
    long long recorded = (long long)s->total_steps;
    if (!t->o.epochs_given && !t->o.steps_given) {
        t->o.epochs = s->epochs, t->o.steps = s->steps, t->total = s->total_steps;
        return;
    }
    if (t->total == s->total_steps) return;
    if (t->m->schedule.kind == RT_SCHED_COSINE || t->m->schedule.kind == RT_SCHED_POLY)
        rt_die_usage("--%s changes the run in '%s' from %lld to %lld steps, but its %s schedule spans the whole "
                     "run, so the steps already taken would have had other learning rates; leave out --epochs and "
                     "--steps to finish the recorded run", t->o.steps_given ? "steps" : "epochs", t->o.resume,
                     recorded, (long long)t->total, t->m->schedule.kind == RT_SCHED_POLY ? "poly" : "cosine");
    if (t->total < s->step)
        rt_die_usage("checkpoint '%s' is at step %lld, past the %lld steps asked for", t->o.resume,
                     (long long)s->step, (long long)t->total);
    if (!t->o.quiet) printf("note: the run's length changes from %lld to %lld steps\n", recorded, (long long)t->total);
}

/* Continue the run a checkpoint recorded: parameters, optimizer state, position, seed and
 * shuffling; its length as discussed at resume_target(). */
static void resume(Trainer *t, const RtDataset *ds) {
    const char *f = t->o.resume;
    RtTrainState s;
    RtError err;
    int take = t->ctx.shard && t->dist.ranks > 1; /* this rank's slices of the whole state */
    float *state = take ? rt_alloc((size_t)(t->m->n_state_slots * t->m->n_grad_floats) * sizeof *state,
                                       "the whole optimizer state")
                        : t->ctx.optstate;
    if (rt_ckpt_load(f, t->m, t->dist.ranks, t->o.accumulate, t->ctx.params, state, &s, &err)) die("%s", err.msg);
    if (take) rt_dist_take_state(&t->dist, state, t->ctx.optstate), free(state);
    int was_accumulate = s.accumulate > 1 ? s.accumulate : 1;
    if ((s.ranks != t->dist.ranks || was_accumulate != t->o.accumulate) && !t->o.quiet) {
        char was[64] = "", is[64] = ""; /* --accumulate, where either run has it */
        if (was_accumulate > 1 || t->o.accumulate > 1)
            snprintf(was, sizeof was, ", --accumulate %d", was_accumulate),
                snprintf(is, sizeof is, ", --accumulate %d", t->o.accumulate);
        printf("note: checkpoint '%s' was written by %d rank%s of batch %lld%s; this run has %d of batch %lld%s, the "
               "same global batch\n", f, s.ranks, s.ranks > 1 ? "s" : "",
               (long long)(global_batch(t) / s.ranks / was_accumulate), was, t->dist.ranks, (long long)t->m->batch, is);
    }
    if (s.samples != ds->n_samples)
        die("checkpoint '%s' was written for %lld training samples, but %s has %lld\n"
            "  hint: resume with the same --data", f, (long long)s.samples, t->o.data[0], (long long)ds->n_samples);
    if (t->o.seed_given && t->o.seed != s.seed)
        rt_die_usage("--seed %llu differs from the seed %llu that checkpoint '%s' records; leave --seed out",
                     (unsigned long long)t->o.seed, (unsigned long long)s.seed, f);
    if (!t->o.shuffle && s.shuffle)
        rt_die_usage("--no-shuffle: the run in checkpoint '%s' shuffles; leave --no-shuffle out", f);
    t->o.seed = s.seed, t->o.shuffle = s.shuffle;
    if (s.has_scale && t->m->loss_scaling) { /* the scale goes on from where it was */
        if (t->o.loss_scale_given && t->o.loss_scale != s.scale.scale)
            rt_die_usage("--loss-scale %g: checkpoint '%s' records the run's loss scale, %g; leave --loss-scale out",
                         t->o.loss_scale, f, s.scale.scale);
        t->scale.scale = s.scale.scale, t->scale.good = s.scale.good, t->scale.skipped = s.scale.skipped;
        if (!t->o.loss_scale_interval_given) t->scale.interval = s.scale.interval; /* as recorded */
    } else if (s.has_scale) { /* this trainer does not scale: it updates at every step from here on */
        t->scale = s.scale, t->carry_scale = 1;
    }
    if (rt_augment_resume(t->m, &t->aug, s.augment, f, &err)) rt_die_usage("%s", err.msg);
    resume_target(t, &s);
    if (s.threads != t->o.threads && !t->o.quiet)
        printf("note: checkpoint '%s' was written with --threads %d; with %d the results may differ in the last bits\n",
               f, s.threads, t->o.threads);
    t->pos = s;
    if (!t->o.quiet)
        printf("resuming from '%s' at step %lld of %lld (epoch %lld, batch %lld)\n", f, (long long)s.step,
               (long long)t->total, (long long)s.epoch, (long long)s.batch);
}

static void **batch_buffers(const RtModel *m) {
    void **bufs = rt_alloc(RT_MAX_INPUTS * sizeof *bufs, "batch buffers");
    for (int i = 0; i < m->n_inputs; i++) bufs[i] = rt_alloc(rt_batch_bytes(m, i), "a batch");
    return bufs;
}

static void free_buffers(const RtModel *m, void **bufs) {
    for (int i = 0; i < m->n_inputs; i++) free(bufs[i]);
    free(bufs);
}

/* --eval-only and --predict: the weights, on the device too, with a device state whose sums are zero. */
static void use_weights(Trainer *t) {
    setup_context(t);
    if (!t->dev) return;
    t->dev->upload(t->ctx.params, t->ctx.optstate);
    t->dev->start(0, 1, 1, t->o.seed, NULL);
}

/* --eval-only: the weights, one evaluation printed and logged as the periodic ones are, and no
 * training data, steps or saved files. */
static int eval_only(Trainer *t) {
    const RtModel *m = t->m;
    RtDataset ds;
    open_data(m, t->o.eval, &ds);
    use_weights(t);
    if (t->o.log) t->log = open_log(t, t->o.log);
    void **bufs = batch_buffers(m);
    int rc = finish(t, evaluate(t, &ds, bufs, 0));
    free_buffers(m, bufs);
    free_context(&t->ctx);
    rt_dataset_close(&ds);
    if (t->dev) t->dev->close();
    return rc;
}

/* --predict: the weights, then the output for every sample (rt_predict.c). */
static int predict(Trainer *t) {
    use_weights(t);
    RtError err;
    int64_t n = 0;
    int rc = rt_predict(t->m, &t->ctx, t->dev, t->o.predict, t->o.predict_out, &n, &err);
    if (rc) fprintf(stderr, "error: %s\n", err.msg);
    else if (!t->o.quiet) printf("wrote the output of %lld samples to '%s'\n", (long long)n, t->o.predict_out);
    free_context(&t->ctx);
    if (t->dev) t->dev->close();
    return finish(t, rc ? 1 : 0);
}

/* Everything rt_main allocated, returned before it does, so that a leak checker (ASan's, or
 * valgrind's) reports only real leaks. */
static void release(Trainer *t, void **bufs, RtDataset *train_ds, RtDataset *eval_ds) {
    free_buffers(t->m, bufs);
    free_context(&t->ctx);
    rt_dataset_close(train_ds);
    if (t->o.n_eval) rt_dataset_close(eval_ds);
    if (t->dev) t->dev->close();
}

/* A distributed trainer's rank: rank 0 alone writes the console, the log and the files; every
 * rank reads the data and the weights it starts from. What one process does that needs the
 * whole data set in one place is refused when there are several ranks. */
static void join_ranks(Trainer *t, int *argc, char ***argv) {
    if (rt_dist_open(&t->dist, t->m, argc, argv, t->o.eval_rank)) exit(1);
    RtDist *d = &t->dist;
    if (d->ranks > 1 && (t->o.gradcheck || t->o.predict_out))
        rt_die_usage("%s runs as one process: start the trainer without mpirun (it has %d ranks)",
                     t->o.gradcheck ? "--gradcheck" : "--predict", d->ranks);
    if (d->ranks > 1) t->ctx.dist = d;
    t->gather_state = t->m->shard_optimizer && d->ranks > 1 && t->o.checkpoint;
    if (d->rank > 0) {
        RtOptions *o = &t->o;
        o->quiet = 1, t->con.quiet = 1, t->tty = 0;
        o->save = o->log = o->checkpoint = o->mllog = o->save_adapter = o->save_merged = o->save_best = NULL;
    }
    int cpus = d->comm ? rt_dist_cpus() : 0;
    if (cpus && cpus < t->o.threads && d->rank == 0) /* the others' are alike, as a rule */
        fprintf(stderr, "warning: rank 0 may run on %d CPU%s (its affinity) but has --threads %d: its threads would "
                        "share them\n  hint: mpirun --bind-to none, or --map-by slot:PE=%d\n",
                cpus, cpus > 1 ? "s" : "", t->o.threads, t->o.threads);
    if (d->comm && !t->o.quiet)
        printf("distributed: %d rank%s through %s, batch %lld per rank, global batch %lld; %d gradient bucket%s\n",
               d->ranks, d->ranks > 1 ? "s" : "", d->comm->name, (long long)t->m->batch, (long long)global_batch(t),
               t->m->n_buckets, t->m->n_buckets > 1 ? "s" : "");
    if (d->comm && !t->o.quiet && t->o.eval_rank)
        printf("evaluation: by process %d of the job, while the others train\n", d->ranks);
    if (!t->o.quiet && t->o.eval_async)
        printf("evaluation: on a second stream of the GPU, one batch per training step, while training goes on\n");
}

/* Every rank starts, and ends, with rank 0's parameters. */
static void check_same_params(Trainer *t, const char *when) {
    if (rt_dist_same_params(&t->dist, t->ctx.params, when)) return;
    fprintf(stderr, "  hint: every rank must read the same --init or --resume file\n");
    exit(1);
}

/* rt_main's status, after the distributed trainer's ranks leave their job: together when every
 * rank ends the same way (a finished run, a stop every rank agreed to, a non-finite loss, which
 * each rank sees in the same summed loss). */
static int leave(Trainer *t, int rc) {
    int together = rc == 0 || rc == EXIT_STOPPED || rc == EXIT_NONFINITE || rc == EXIT_TARGET_MISSED;
    if (t->o.eval_rank && together && !t->dist.evaluator && t->dist.rank == 0)
        t->dist.comm->eval_send(NULL, 0, rc); /* the evaluator's run ends with training, as it did */
    rt_dist_close(&t->dist, rc, together);
    free(t->eval_params), free(t->ae.idx);
    return rc;
}

/* --eval-rank's evaluator: the evaluation data and room for the parameters it is handed. */
static int evaluator(Trainer *t) {
    RtDataset ds;
    open_data(t->m, t->o.eval, &ds);
    setup_context(t);
    void **bufs = batch_buffers(t->m);
    int rc = serve_evals(t, &ds, bufs);
    free_buffers(t->m, bufs);
    free_context(&t->ctx);
    rt_dataset_close(&ds);
    return rc;
}

int rt_main(int argc, char **argv, const RtModel *model) {
    Trainer t = {.tty = isatty(STDOUT_FILENO)};
    if (model->n_inputs > RT_MAX_INPUTS) /* netc refuses such a model; a hand-written one */
        die("model '%s' has %d inputs; this trainer holds at most %d", model->name, model->n_inputs, RT_MAX_INPUTS);
    rt_parse_options(argc, argv, model, &t.o);
    rt_gemm_route(); /* a bad NETC_GEMM or NETC_CONV stops the trainer here */
    rt_conv_choice();
    t.con = (RtConsole){.tty = t.tty, .quiet = t.o.quiet};
    /* the run's model: the compiled one with the command line's recipe, which the checkpoint
     * fingerprint then covers */
    RtModel run_model = *model;
    run_model.schedule = t.o.schedule, run_model.hyper = t.o.hyper;
    const RtModel *m = t.m = &run_model;
    if (t.o.list_params) return list_params(m), 0;
    join_ranks(&t, &argc, &argv);
    RtError aug_err;
    if (rt_augment_parse(m, t.o.augment, &t.aug, &aug_err)) rt_die_usage("%s", aug_err.msg);
    check_outputs(&t);
    if (t.o.mllog) rt_mllog_open(&t.ml, open_log(&t, t.o.mllog), t.o.mllog);
    /* before anything may start a library's threads or plan for them (the device's start-up) */
    omp_set_num_threads(t.o.threads);
    if (openblas_set_num_threads) openblas_set_num_threads(t.o.threads);
    if (m->device) { /* before any data is read: a machine without the device stops here */
        char why[1024] = "";
        /* the evaluator of --eval-rank takes a GPU but no part in the collectives */
        RtRanks ranks = {t.dist.rank, t.dist.ranks, t.dist.local_rank, t.dist.evaluator ? NULL : t.dist.comm};
        /* a process that does not train keeps no sum of gradients */
        int trains = !t.dist.evaluator && !t.o.eval_only && !t.o.predict_out;
        RtDeviceOptions opts = {!t.o.no_graph, t.o.eval_async, trains ? t.o.accumulate : 1};
        if (m->device->open(m, &ranks, &opts, why, sizeof why)) {
            fprintf(stderr, "error: this trainer runs on a %s device: %s\n", m->device->name, why);
            return EXIT_NO_DEVICE;
        }
        t.dev = m->device;
    }
    if (t.o.eval_only) return leave(&t, eval_only(&t));
    if (t.o.predict_out) return leave(&t, predict(&t));
    if (t.dist.evaluator) return leave(&t, evaluator(&t));
    RtDataset train_ds, eval_ds;
    open_data(m, t.o.data, &train_ds);
    if (t.o.n_eval) open_data(m, t.o.eval, &eval_ds);
    setup_context(&t);
    t.scale = (RtLossScale){.scale = t.o.loss_scale, .interval = t.o.loss_scale_interval};
    if (!t.o.gradcheck) {
        plan_run(&t, &train_ds);
        if (t.o.resume) resume(&t, &train_ds);
    }
    check_same_params(&t, "at the start");
    /* a resumed run adds to the log of the run it continues */
    if (t.o.log) t.log = open_log(&t, t.o.log);
    rt_mllog_run_start(&t.ml, global_batch(&t), m->schedule.base_lr, train_ds.n_samples);
    if (t.dev) {
        t.dev->upload(t.ctx.params, t.ctx.optstate);
        t.dev->start(t.pos.step, t.per_epoch, t.total, rank_seed(&t), m->loss_scaling || t.carry_scale ? &t.scale : NULL);
    }
    void **bufs = batch_buffers(m);
    t.eval_ds = t.o.n_eval ? &eval_ds : NULL, t.eval_bufs = bufs;
    int rc = t.o.gradcheck ? gradcheck(&t, &train_ds, bufs) : train(&t, &train_ds);
    if (!rc && t.dev && !t.ckpt_current) rc = device_sums(&t);
    if (!rc && t.dev) t.dev->download(t.ctx.params, t.ctx.optstate);
    if (!rc) rt_dist_share_buffers(&t.dist, t.ctx.params);
    if (!rc) check_same_params(&t, "at the end of the run");
    rc = finish(&t, rc);
    release(&t, bufs, &train_ds, &eval_ds);
    return leave(&t, rc);
}
