/* rt_main.c - the trainer's main(): command line, buffers, parameter initialisation, the
 * training loop with its learning-rate schedule, evaluation, logging and --gradcheck.
 *
 * Everything is allocated once before the first step: the flat parameter, gradient and
 * optimizer-state buffers, the planned arena, the kernels' per-thread scratch, and the
 * prefetcher's two batch slots. The loop itself only calls the generated step functions.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

typedef struct Options {
    const char *data[RT_MAX_INPUTS], *eval[RT_MAX_INPUTS];
    int64_t epochs, steps, log_every;
    uint64_t seed;
    int shuffle, threads, quiet, list_params, gradcheck, n_eval;
    const char *init, *save, *log;
} Options;

typedef struct Trainer {
    const RtModel *m;
    Options o;
    RtCtx ctx;
    FILE *log;
    int tty;
} Trainer;

/* ---- small utilities */

uint64_t rt_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static double uniform01(uint64_t *state) {
    *state = rt_mix(*state);
    return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *alloc_or_die(size_t bytes, const char *what) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %zu bytes for %s\n", bytes, what);
        exit(1);
    }
    return memset(p, 0, bytes);
}

static _Noreturn void die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  hint: run with --help for the options\n");
    exit(2);
}

static int64_t param_numel(const RtParam *p) {
    int64_t n = 1;
    for (int i = 0; i < p->rank; i++) n *= p->shape[i];
    return n;
}

static const char *dtype_name(RtDtype dt) {
    static const char *const names[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    return names[dt];
}

/* ---- command line */

static void usage(const RtModel *m) {
    printf("usage: %s --data INPUT=FILE... [options]\n\n", m->name);
    printf("Train model '%s' (compiled by netc from %s).\n\nmodel inputs (per sample; batch %lld):\n",
           m->name, m->source, (long long)m->batch);
    for (int i = 0; i < m->n_inputs; i++) {
        printf("  %-12s %s[", m->inputs[i].name, dtype_name(m->inputs[i].dtype));
        for (int d = 0; d < m->inputs[i].rank; d++) printf("%s%lld", d ? ", " : "", (long long)m->inputs[i].shape[d]);
        printf("]\n");
    }
    printf("\noptions:\n"
           "  --data NAME=FILE       training data for input NAME (.npy or IDX, optionally gzipped)\n"
           "  --eval-data NAME=FILE  evaluation data, evaluated at the end of epochs\n"
           "  --epochs N             epochs to train (default %lld)\n"
           "  --steps N              stop after N optimizer steps (overrides --epochs)\n"
           "  --seed N               seed for initialisation, shuffling and dropout (default 0)\n"
           "  --no-shuffle           visit the samples in file order every epoch\n"
           "  --threads N            threads for the kernels (default: all cores)\n"
           "  --init FILE            initial parameters from a safetensors file\n"
           "  --save FILE            write the trained parameters as safetensors\n"
           "  --log FILE             JSON Lines log of training and evaluation\n"
           "  --log-every N          steps between log lines (default %lld)\n"
           "  --list-params          list the parameters and exit\n"
           "  --gradcheck            compare gradients with finite differences on one batch and exit\n"
           "  --quiet                print nothing but errors\n"
           "  --help                 this text\n",
           (long long)m->epochs, (long long)m->log_every);
}

static int find_input(const RtModel *m, const char *name, size_t len) {
    for (int i = 0; i < m->n_inputs; i++)
        if (strlen(m->inputs[i].name) == len && strncmp(m->inputs[i].name, name, len) == 0) return i;
    return -1;
}

static void bind(const RtModel *m, const char *flag, const char *arg, const char **files) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) die_usage("%s needs NAME=FILE, found '%s'", flag, arg);
    int i = find_input(m, arg, (size_t)(eq - arg));
    if (i < 0) {
        char names[512] = "";
        for (int k = 0; k < m->n_inputs; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", m->inputs[k].name);
        die_usage("%s %s: model '%s' has no input '%.*s' (its inputs: %s)", flag, arg, m->name,
                  (int)(eq - arg), arg, names);
    }
    if (files[i]) die_usage("%s given twice for input '%s'", flag, m->inputs[i].name);
    files[i] = eq + 1;
}

static int64_t number(const char *flag, const char *s, int64_t min) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < min) die_usage("%s needs an integer >= %lld, found '%s'", flag, (long long)min, s);
    return v;
}

static void parse_options(int argc, char **argv, const RtModel *m, Options *o) {
    *o = (Options){.epochs = m->epochs, .log_every = m->log_every, .shuffle = 1, .threads = omp_get_num_procs()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
#define VALUE() (has_value ? argv[++i] : (die_usage("%s needs a value", a), ""))
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) usage(m), exit(0);
        else if (strcmp(a, "--data") == 0) bind(m, a, VALUE(), o->data);
        else if (strcmp(a, "--eval-data") == 0) bind(m, a, VALUE(), o->eval);
        else if (strcmp(a, "--epochs") == 0) o->epochs = number(a, VALUE(), 1);
        else if (strcmp(a, "--steps") == 0) o->steps = number(a, VALUE(), 1);
        else if (strcmp(a, "--seed") == 0) o->seed = (uint64_t)number(a, VALUE(), 0);
        else if (strcmp(a, "--threads") == 0) o->threads = (int)number(a, VALUE(), 1);
        else if (strcmp(a, "--log-every") == 0) o->log_every = number(a, VALUE(), 1);
        else if (strcmp(a, "--init") == 0) o->init = VALUE();
        else if (strcmp(a, "--save") == 0) o->save = VALUE();
        else if (strcmp(a, "--log") == 0) o->log = VALUE();
        else if (strcmp(a, "--no-shuffle") == 0) o->shuffle = 0;
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1;
        else if (strcmp(a, "--list-params") == 0) o->list_params = 1;
        else if (strcmp(a, "--gradcheck") == 0) o->gradcheck = 1;
        else die_usage("unknown option '%s'", a);
#undef VALUE
    }
    if (o->threads > 1024) die_usage("--threads %d is more than 1024", o->threads);
    if (o->list_params) return;
    for (int i = 0; i < m->n_inputs; i++) {
        if (!o->data[i]) die_usage("no training data for input '%s': add --data %s=FILE", m->inputs[i].name, m->inputs[i].name);
        o->n_eval += o->eval[i] != NULL;
    }
    if (o->n_eval && o->n_eval != m->n_inputs)
        for (int i = 0; i < m->n_inputs; i++)
            if (!o->eval[i]) die_usage("--eval-data is given for some inputs but not for '%s'", m->inputs[i].name);
}

static void list_params(const RtModel *m) {
    int64_t total = 0, trainable = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        char shape[128] = "[";
        for (int d = 0; d < p->rank; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        strcat(shape, "]");
        printf("%-32s %-20s %12lld%s\n", p->name, shape, (long long)param_numel(p), p->grad_offset < 0 ? "  frozen" : "");
        total += param_numel(p);
        if (p->grad_offset >= 0) trainable += param_numel(p);
    }
    printf("total %lld parameters (%lld trainable)\n", (long long)total, (long long)trainable);
}

/* ---- parameters and schedule */

void rt_init_params(const RtModel *m, float *params, uint64_t seed) {
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        uint64_t state = rt_mix(seed * 0x100000001B3ull + (uint64_t)i + 1);
        float *x = params + p->offset;
        for (int64_t k = 0; k < param_numel(p); k++) {
            switch (p->init) {
            case RT_INIT_ZEROS: x[k] = 0; break;
            case RT_INIT_ONES: x[k] = 1; break;
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

double rt_lr_at(const RtSchedule *s, int64_t step, int64_t steps_per_epoch, int64_t total_steps) {
    double e = (double)step / (double)steps_per_epoch, lr = s->base_lr;
    switch (s->kind) {
    case RT_SCHED_CONSTANT: break;
    case RT_SCHED_STEP: lr = s->base_lr * pow(s->gamma, floor(e / s->step_epochs)); break;
    case RT_SCHED_COSINE: {
        double total = (double)total_steps / (double)steps_per_epoch;
        lr = s->min_lr + (s->base_lr - s->min_lr) * (1 + cos(M_PI * fmin(e / total, 1.0))) / 2;
        break;
    }
    }
    double warm = s->warmup_epochs * (double)steps_per_epoch;
    if (warm > 0 && (double)step < warm) lr *= ((double)step + 1) / warm;
    return lr;
}

/* ---- logging */

static void json_number(FILE *f, const char *key, double v) {
    if (isfinite(v)) fprintf(f, ", \"%s\": %.8g", key, v);
    else fprintf(f, ", \"%s\": null", key);
}

static void log_interval(Trainer *t, int64_t step, int64_t epoch, int64_t of, double loss, double lr, double rate) {
    if (t->log) {
        fprintf(t->log, "{\"step\": %lld, \"epoch\": %lld", (long long)step, (long long)epoch);
        json_number(t->log, "loss", loss);
        json_number(t->log, "lr", lr);
        json_number(t->log, "samples_per_s", rate);
        fprintf(t->log, "}\n");
        fflush(t->log);
    }
    if (t->o.quiet) return;
    printf("%sepoch %lld step %lld/%lld loss %.4f lr %.4g %.0f samples/s%s", t->tty ? "\r" : "",
           (long long)epoch, (long long)step, (long long)of, loss, lr, rate, t->tty ? "   " : "\n");
    fflush(stdout);
}

static void log_eval(Trainer *t, int64_t epoch, double loss, double acc) {
    if (t->log) {
        fprintf(t->log, "{\"eval\": true, \"epoch\": %lld", (long long)epoch);
        json_number(t->log, "loss", loss);
        if (t->m->has_accuracy) json_number(t->log, "accuracy", acc);
        fprintf(t->log, "}\n");
        fflush(t->log);
    }
    if (t->o.quiet) return;
    printf("%seval epoch %lld: loss %.4f", t->tty ? "\n" : "", (long long)epoch, loss);
    if (t->m->has_accuracy) printf(" accuracy %.4f", acc);
    printf("\n");
}

/* A progress line on a terminal: rate and time left, at most five times a second. */
static void progress(Trainer *t, int64_t epoch, int64_t done, int64_t total, double t0, double *last) {
    double tn = now();
    if (!t->tty || t->o.quiet || tn - *last < 0.2) return;
    *last = tn;
    double rate = (double)done * (double)t->m->batch / (tn - t0);
    double eta = rate > 0 ? (double)(total - done) * (double)t->m->batch / rate : 0;
    printf("\repoch %lld  %lld/%lld steps  %.0f samples/s  ETA %.0fs   ", (long long)epoch, (long long)done,
           (long long)total, rate, eta);
    fflush(stdout);
}

/* ---- evaluation */

static void evaluate(Trainer *t, const RtDataset *ds, void *const *bufs, int64_t epoch) {
    const RtModel *m = t->m;
    int64_t *idx = alloc_or_die((size_t)m->batch * sizeof *idx, "evaluation indices");
    double loss = 0, correct = 0;
    for (int64_t start = 0; start < ds->n_samples; start += m->batch) {
        int64_t count = ds->n_samples - start < m->batch ? ds->n_samples - start : m->batch;
        for (int64_t r = 0; r < count; r++) idx[r] = start + r;
        rt_gather(m, ds, idx, count, bufs);
        t->ctx.inputs = bufs;
        t->ctx.n_valid = count; /* the padded rows count neither in the loss nor the accuracy */
        m->eval_step(&t->ctx);
        loss += (double)t->ctx.loss * (double)count;
        correct += t->ctx.correct;
    }
    free(idx);
    log_eval(t, epoch, loss / (double)ds->n_samples, correct / (double)ds->n_samples);
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

static int check_finite(Trainer *t, int64_t step) {
    if (isfinite(t->ctx.loss)) return 0;
    fprintf(stderr, "%serror: the loss is %s at step %lld; stopping before any weights are saved\n"
                    "  hint: lower the learning rate, or check the data for NaN/Inf values\n",
            t->tty ? "\n" : "", isnan(t->ctx.loss) ? "NaN" : "infinite", (long long)step);
    return 3;
}

static int train(Trainer *t, const RtDataset *train_ds, const RtDataset *eval_ds, void *const *eval_bufs) {
    const RtModel *m = t->m;
    int64_t per_epoch = train_ds->n_samples / m->batch;
    if (per_epoch == 0) {
        fprintf(stderr, "error: %s has %lld samples, fewer than one batch of %lld\n", t->o.data[0],
                (long long)train_ds->n_samples, (long long)m->batch);
        return 1;
    }
    int64_t total = t->o.steps ? t->o.steps : t->o.epochs * per_epoch;
    int64_t *order = alloc_or_die((size_t)train_ds->n_samples * sizeof *order, "the sample order");
    int64_t step = 0;
    for (int64_t epoch = 1; step < total; epoch++) {
        for (int64_t i = 0; i < train_ds->n_samples; i++) order[i] = i;
        if (t->o.shuffle) shuffle(order, train_ds->n_samples, t->o.seed, epoch);
        int64_t n = per_epoch < total - step ? per_epoch : total - step, since = 0;
        RtPrefetch pf;
        rt_prefetch_start(&pf, m, train_ds, order, n);
        double t0 = now(), t_log = t0, last = 0, loss_sum = 0;
        for (int64_t b = 0; b < n; b++) {
            t->ctx.inputs = rt_prefetch_next(&pf);
            t->ctx.lr = (float)rt_lr_at(&m->schedule, step, per_epoch, total);
            t->ctx.step = step + 1;
            t->ctx.seed = rt_mix(t->o.seed ^ rt_mix((uint64_t)step));
            t->ctx.n_valid = m->batch;
            m->forward_backward(&t->ctx);
            int rc = check_finite(t, step + 1);
            if (rc) {
                rt_prefetch_stop(&pf);
                free(order);
                return rc;
            }
            m->optimizer_step(&t->ctx);
            loss_sum += t->ctx.loss;
            step++, since++;
            progress(t, epoch, b + 1, n, t0, &last);
            if (since == t->o.log_every || b == n - 1) {
                double tn = now();
                log_interval(t, step, epoch, total, loss_sum / (double)since, t->ctx.lr,
                             (double)(since * m->batch) / (tn - t_log));
                t_log = tn, loss_sum = 0, since = 0;
            }
        }
        rt_prefetch_stop(&pf);
        if (eval_ds && (epoch % m->eval_every == 0 || step == total)) evaluate(t, eval_ds, eval_bufs, epoch);
    }
    free(order);
    return 0;
}

/* ---- gradient check */

/* Tolerance: the loss is float32, so a finite difference carries rounding error of about
 * 1e-6 * |L| / h (h = 1e-2 * max(1, |p|)) plus O(h^2) truncation; 1e-3 * max(1, |L|) absolute
 * plus 2e-2 relative covers both with margin while a wrong gradient (wrong sign, missing factor,
 * wrong element) is off by far more. */
static int gradcheck(Trainer *t, const RtDataset *ds, void *const *bufs) {
    const RtModel *m = t->m;
    int64_t *idx = alloc_or_die((size_t)m->batch * sizeof *idx, "indices");
    int64_t count = ds->n_samples < m->batch ? ds->n_samples : m->batch;
    for (int64_t r = 0; r < count; r++) idx[r] = r;
    rt_gather(m, ds, idx, count, bufs);
    free(idx);
    RtCtx *c = &t->ctx;
    c->inputs = bufs, c->n_valid = count, c->seed = rt_mix(t->o.seed), c->step = 1;
    m->forward_backward(c);
    double loss = c->loss;
    float *ana = alloc_or_die((size_t)m->n_grad_floats * sizeof *ana + 4, "gradients");
    memcpy(ana, c->grads, (size_t)m->n_grad_floats * sizeof *ana);
    int checked = 0, failed = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        int64_t n = param_numel(p), k_max = n < 8 ? n : 8;
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
    c->params = alloc_or_die((size_t)m->n_param_floats * sizeof(float), "parameters");
    c->grads = alloc_or_die((size_t)m->n_grad_floats * sizeof(float), "gradients");
    c->optstate = alloc_or_die((size_t)(m->n_state_slots * m->n_grad_floats) * sizeof(float), "optimizer state");
    c->arena = alloc_or_die((size_t)m->arena_bytes, "activations");
    c->scratch_per_thread = m->scratch_per_thread;
    c->scratch = alloc_or_die((size_t)(t->o.threads * m->scratch_per_thread) * sizeof(float), "kernel scratch");
    rt_init_params(m, c->params, t->o.seed);
    RtError err;
    if (t->o.init && rt_st_load(t->o.init, m, c->params, &err)) {
        fprintf(stderr, "error: --init %s\n", err.msg);
        exit(1);
    }
}

static void **batch_buffers(const RtModel *m) {
    void **bufs = alloc_or_die(RT_MAX_INPUTS * sizeof *bufs, "batch buffers");
    for (int i = 0; i < m->n_inputs; i++) bufs[i] = alloc_or_die(rt_batch_bytes(m, i), "a batch");
    return bufs;
}

int rt_main(int argc, char **argv, const RtModel *m) {
    Trainer t = {.m = m, .tty = isatty(STDOUT_FILENO)};
    parse_options(argc, argv, m, &t.o);
    if (t.o.list_params) return list_params(m), 0;
    omp_set_num_threads(t.o.threads);
    openblas_set_num_threads(t.o.threads);
    RtDataset train_ds, eval_ds;
    open_data(m, t.o.data, &train_ds);
    if (t.o.n_eval) open_data(m, t.o.eval, &eval_ds);
    if (t.o.log && !(t.log = fopen(t.o.log, "w"))) {
        fprintf(stderr, "error: cannot write the log '%s': %s\n", t.o.log, strerror(errno));
        return 1;
    }
    setup_context(&t);
    void **bufs = batch_buffers(m);
    int rc = t.o.gradcheck ? gradcheck(&t, &train_ds, bufs)
                           : train(&t, &train_ds, t.o.n_eval ? &eval_ds : NULL, bufs);
    RtError err;
    if (!rc && !t.o.gradcheck && t.o.save && rt_st_save(t.o.save, m, t.ctx.params, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
    }
    if (t.log) fclose(t.log);
    return rc;
}
