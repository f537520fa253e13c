/* rt_options.c - the trainer's command line: --help's usage (the model's inputs, output and
 * options), and every option read into an RtOptions and checked, against the model (its inputs,
 * its LoRA adapters, a device trainer's options) and against the other options, before anything
 * is read or written. A bad command line ends the process here with status 2 and a message that
 * names the option and the value (docs/trainer.md lists the options and the exit statuses).
 */
#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

_Noreturn void rt_die_usage(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  hint: run with --help for the options\n");
    exit(2);
}

static const char *dtype_name(RtDtype dt) {
    static const char *const names[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    return names[dt];
}

static void usage(const RtModel *m) {
    printf("usage: %s --data INPUT=FILE... [options]\n\n", m->name);
    printf("Train model '%s' (compiled by netc from %s, for %s CPUs).\n\nmodel inputs (per sample; batch %lld):\n",
           m->name, m->source, rt_cpu_level_name(rt_cpu_level), (long long)m->batch);
    for (int i = 0; i < m->n_inputs; i++) {
        printf("  %-12s %s[", m->inputs[i].name, dtype_name(m->inputs[i].dtype));
        for (int d = 0; d < m->inputs[i].rank; d++) printf("%s%lld", d ? ", " : "", (long long)m->inputs[i].shape[d]);
        if (m->inputs[i].classes) printf("]  indices in [0, %lld)\n", (long long)m->inputs[i].classes);
        else printf("]\n");
    }
    if (m->output_rank >= 0) { /* what --predict writes, and the inputs it needs */
        printf("\nmodel output (per sample; what --predict writes): f32[");
        for (int d = 0; d < m->output_rank; d++) printf("%s%lld", d ? ", " : "", (long long)m->output_shape[d]);
        printf("], from input%s", m->output_inputs & (m->output_inputs - 1) ? "s" : "");
        for (int i = 0, k = 0; i < m->n_inputs; i++)
            if ((m->output_inputs >> i) & 1) printf("%s %s", k++ ? "," : "", m->inputs[i].name);
        printf("\n");
    }
    printf("\noptions:\n"
           "  --data NAME=FILE       training data for input NAME: .npy or IDX (either optionally gzipped),\n"
           "                         .csv (numbers, one sample per line), or cifar:F1.bin,F2.bin,... (CIFAR-10)\n"
           "  --eval-data NAME=FILE  evaluation data, evaluated at the end of epochs\n"
           "  --eval-every N         epochs between evaluations, and after the last (default %lld)\n"
           "  --eval-every-steps N   evaluate every N optimizer steps instead (and after the last)\n"
           "%s"
           "  --augment NAME=OPS     augment training images NAME [C,H,W] in the loader, OPS from crop:P\n"
           "                         (random crop after zero-padding P) and flip (horizontal); e.g. crop:4,flip\n"
           "  --epochs N             epochs to train (default %lld)\n"
           "  --steps N              stop after N optimizer steps (overrides --epochs)\n"
           "  --seed N               seed for initialisation, shuffling and dropout (default 0)\n"
           "  --no-shuffle           visit the samples in file order every epoch\n"
           "  --threads N            threads for the kernels (default: all cores)\n"
           "  --init FILE            initial parameters from a safetensors file\n"
           "  --init-skip NAME,...   keep the initialisation of these parameters (names, prefixes, globs)\n"
           "  --init-partial         load the tensors the model has, keep the initialisation of the rest\n"
           "  --init-prefix P        strip P from the file's tensor names (module. from DDP)\n"
           "  --save FILE            write the trained parameters as safetensors\n"
           "  --save-best FILE       write the parameters of the best evaluation so far (the first metric's\n"
           "                         accuracy, or the lowest loss), each time one beats the best\n"
           "%s"
           "  --checkpoint FILE      write parameters, optimizer state and position to FILE at the end,\n"
           "                         on SIGINT/SIGTERM or --stop-at, and every --checkpoint-every N steps\n"
           "  --checkpoint-every N   optimizer steps between checkpoints (needs --checkpoint)\n"
           "  --resume FILE          continue the run a checkpoint recorded; gives the same bits as\n"
           "                         a run that was never stopped\n"
           "  --stop-at STEP         stop after optimizer step STEP as if signalled (for time-limited jobs)\n"
           "  --log FILE             JSON Lines log of training and evaluation\n"
           "  --log-every N          steps between log lines (default %lld)\n"
           "  --mllog FILE           MLPerf's :::MLLOG lines (init, epochs, evaluations, run_stop)\n"
           "  --list-params          list the parameters and exit\n"
           "  --gradcheck            compare gradients with finite differences on one batch and exit\n"
           "  --eval-only            evaluate the --init or --resume weights on --eval-data once and exit\n"
           "  --predict NAME=FILE    samples of input NAME (only the inputs the model's output reads) to predict\n"
           "  --predict-out FILE     write the model's output (the value its loss reads first, e.g. the logits)\n"
           "                         for every --predict sample as float32 .npy, using the --init or --resume\n"
           "                         weights, and exit\n"
           "  --quiet                print nothing but errors\n",
           (long long)m->eval_every,
           m->comm ? "  --eval-rank            the job's last process evaluates, while the others train on\n"
                     "                         (mpirun -np N+1 for N training ranks)\n" : "",
           (long long)m->epochs,
           m->lora ? "  --adapter DIR          LoRA's adapters from DIR/adapter_model.safetensors (PEFT's format)\n"
                     "  --save-adapter DIR     write the trained adapters to DIR as PEFT saves them\n"
                     "  --save-merged FILE     write the model with the adapters merged in, W + (alpha/r) B A\n"
                   : "",
           (long long)m->log_every);
    printf("  --accumulate K         K batches' gradients per optimizer step (gradient accumulation): a global\n"
           "                         batch of K x the model's batch (x the ranks), at the memory of one batch\n"
           "                         (default: the model's accumulate setting, or 1)\n");
    RtTarget target;
    char text[96] = "none";
    rt_target_init(&target, m);
    if (rt_target_on(&target)) rt_target_text(&target, text, sizeof text);
    printf("  --target-accuracy A    stop at the first evaluation whose accuracy (the first metric) is at\n"
           "                         least A, and fail (status 7) a run that ends without one\n"
           "  --target-loss L        the same with an evaluation loss of at most L\n"
           "  --no-target            drop the model's target (%s) and those given before it\n", text);
    if (!m->device)
        printf("  --update-after-backward\n"
               "                         update every parameter after the whole backward pass, not each as\n"
               "                         soon as the pass is done with it (same results; for comparison)\n");
    if (m->device)
        printf("  --no-graph             launch the step's kernels one by one instead of replaying the\n"
               "                         captured %s graph (same results; for comparison and debugging)\n"
               "  --eval-async           evaluate on a copy of the parameters on a second stream, one\n"
               "                         batch per training step, while training goes on\n",
               m->device->name);
    if (m->loss_scaling)
        printf("  --loss-scale S         the dynamic loss scale's first value, a power of two (default 65536);\n"
               "                         halved on a step whose gradients overflow, which is skipped\n"
               "  --loss-scale-interval N\n"
               "                         double the loss scale after N steps in a row without an overflow\n"
               "                         (default 2000)\n");
    printf("  --help                 this text\n"
           "\nexit status: 0 done, 1 a file was refused or a write failed, 2 bad command line,\n"
           "3 the loss or the parameters became NaN/Inf, 4 stopped before the end (SIGINT, SIGTERM\n"
           "or --stop-at; the checkpoint, if any, holds the run)%s, 7 the run ended without\n"
           "reaching its target\n",
           m->device ? ", 5 no usable device" : "");
    rt_hparam_usage(m);
}

static int find_input(const RtModel *m, const char *name, size_t len) {
    for (int i = 0; i < m->n_inputs; i++)
        if (strlen(m->inputs[i].name) == len && strncmp(m->inputs[i].name, name, len) == 0) return i;
    return -1;
}

static void bind(const RtModel *m, const char *flag, const char *arg, const char **files) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) rt_die_usage("%s needs NAME=FILE, found '%s'", flag, arg);
    int i = find_input(m, arg, (size_t)(eq - arg));
    if (i < 0) {
        char names[512] = "";
        for (int k = 0; k < m->n_inputs; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", m->inputs[k].name);
        rt_die_usage("%s %s: model '%s' has no input '%.*s' (its inputs: %s)", flag, arg, m->name,
                     (int)(eq - arg), arg, names);
    }
    if (files[i]) rt_die_usage("%s given twice for input '%s'", flag, m->inputs[i].name);
    files[i] = eq + 1;
}

static int64_t number(const char *flag, const char *s, int64_t min) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < min)
        rt_die_usage("%s needs an integer >= %lld, found '%s'", flag, (long long)min, s);
    return v;
}

/* A number that must fit a smaller type: checked before it is narrowed. */
static int64_t number_at_most(const char *flag, const char *s, int64_t min, int64_t max) {
    int64_t v = number(flag, s, min);
    if (v > max) rt_die_usage("%s %s is more than %lld", flag, s, (long long)max);
    return v;
}

/* --predict reads weights and the files of the inputs the output reads, and writes the output. */
static void check_predict(const RtModel *m, const RtOptions *o) {
    if (!o->n_predict) rt_die_usage("--predict-out needs the samples to predict: add --predict NAME=FILE");
    if (!o->predict_out) rt_die_usage("--predict needs --predict-out OUT.npy, the file to write");
    RtError err;
    if (rt_predict_check(m, o->predict, &err)) rt_die_usage("%s", err.msg);
}

/* --eval-only and --predict read weights and data, and write nothing but their own output. */
static void check_eval_only(const RtModel *m, const RtOptions *o) {
    const char *what = o->eval_only ? "--eval-only" : "--predict";
    if (o->eval_only && o->predict_out) rt_die_usage("--eval-only and --predict: give one");
    if (!o->init && !o->resume) rt_die_usage("%s needs the weights to use: add --init FILE or --resume FILE", what);
    if (o->save || o->checkpoint || o->gradcheck || o->stop_at || o->save_adapter || o->save_merged || o->save_best)
        rt_die_usage("%s trains nothing: leave out --save, --save-best, --save-adapter, --save-merged, --checkpoint, "
                     "--stop-at and --gradcheck", what);
    if (!o->eval_only) {
        check_predict(m, o);
        return;
    }
    for (int i = 0; i < m->n_inputs; i++)
        if (!o->eval[i]) rt_die_usage("--eval-only: no evaluation data for input '%s': add --eval-data %s=FILE",
                                      m->inputs[i].name, m->inputs[i].name);
}

/* The value of an option about LoRA's adapters, which only a model with adapters takes. */
static const char *lora_option(const RtModel *m, const char *option, const char *value) {
    if (!m->lora)
        rt_die_usage("%s: model '%s' has no LoRA adapters (a train section's lora = lora(...) adds them)", option,
                     m->name);
    return value;
}

/* --loss-scale S: a power of two, so that unscaling (1 / S) is exact, within the device's range. */
static double loss_scale_option(const char *option, const char *value) {
    double v;
    if (rt_parse_loss_scale(value, &v))
        rt_die_usage("%s needs a power of two from 2^-24 to 2^127 (65536, 0.5, ...), found '%s'", option, value);
    return v;
}

/* A target is a training run's: the model's is dropped for the other uses; a training run with
 * one evaluates, or it could never know it got there. */
static void check_target(RtOptions *o, int using) {
    if (using || o->gradcheck) {
        if (o->target_given && rt_target_on(&o->target))
            rt_die_usage("--target-accuracy and --target-loss are for training runs: leave them out of %s",
                         o->gradcheck ? "--gradcheck" : o->eval_only ? "--eval-only" : "--predict");
        o->target.accuracy = 0, o->target.has_loss = 0;
        return;
    }
    if (!rt_target_on(&o->target) || o->n_eval) return;
    char text[96];
    rt_target_text(&o->target, text, sizeof text);
    rt_die_usage("the run trains until an evaluation reaches its target (%s, %s), and has no --eval-data to evaluate "
                 "on: add --eval-data NAME=FILE for every input%s",
                 text, o->target_given ? "from the command line" : "from the model's train section",
                 o->target_given ? "" : ", or --no-target to train the model's epochs without one");
}

/* The options against each other and against the model: what the run could not do, refused
 * before anything is read or written. */
static void check_options(const RtModel *m, RtOptions *o) {
    if (o->checkpoint_every && !o->checkpoint) rt_die_usage("--checkpoint-every needs --checkpoint FILE");
    if (o->stop_at && !o->checkpoint) rt_die_usage("--stop-at needs --checkpoint FILE, or the stopped run is lost");
    if (o->resume && o->init) rt_die_usage("--resume and --init both set the parameters; give one");
    if (o->resume && o->adapter) rt_die_usage("--resume and --adapter both set the adapters; give one");
    if (!o->init && (o->init_rules.skip || o->init_rules.prefix || o->init_rules.partial))
        rt_die_usage("--init-skip, --init-prefix and --init-partial need --init FILE");
    if (o->resume && o->gradcheck) rt_die_usage("--resume and --gradcheck do not go together");
    if (o->gradcheck && m->device)
        rt_die_usage("--gradcheck runs in CPU trainers only: build one from the same .net with netc --backend cpu");
    if (o->list_params) return;
    int using = o->eval_only || o->predict_out || o->n_predict;
    if (using) check_eval_only(m, o);
    for (int i = 0; i < m->n_inputs; i++) {
        if (!o->data[i] && !using)
            rt_die_usage("no training data for input '%s': add --data %s=FILE", m->inputs[i].name, m->inputs[i].name);
        o->n_eval += o->eval[i] != NULL;
    }
    if (o->n_eval && o->n_eval != m->n_inputs)
        for (int i = 0; i < m->n_inputs; i++)
            if (!o->eval[i]) rt_die_usage("--eval-data is given for some inputs but not for '%s'", m->inputs[i].name);
    if (o->eval_rank && (using || o->gradcheck))
        rt_die_usage("--eval-rank evaluates beside training: leave out --eval-only, --predict and --gradcheck");
    if (o->eval_rank && !o->n_eval) rt_die_usage("--eval-rank needs the data to evaluate: add --eval-data NAME=FILE");
    if (o->eval_async && using) /* --gradcheck is refused for any device trainer above */
        rt_die_usage("--eval-async evaluates beside training: leave out --eval-only and --predict");
    if (o->eval_async && o->eval_rank)
        rt_die_usage("--eval-async and --eval-rank both evaluate beside training (on the GPU, in another process); "
                     "give one");
    if (o->eval_async && !o->n_eval) rt_die_usage("--eval-async needs the data to evaluate: add --eval-data NAME=FILE");
    check_target(o, using);
    if (o->save_best && o->gradcheck) rt_die_usage("--gradcheck trains nothing: leave out --save-best");
    if (o->save_best && !o->n_eval)
        rt_die_usage("--save-best keeps the parameters of the best evaluation, and there is no --eval-data to evaluate "
                     "on: add --eval-data NAME=FILE for every input");
    if (o->save_best && o->eval_async)
        rt_die_usage("--save-best writes the parameters an evaluation saw, which --eval-async keeps on the GPU only: "
                     "evaluate between steps, or beside training with --eval-rank");
}


void rt_parse_options(int argc, char **argv, const RtModel *m, RtOptions *o) {
    *o = (RtOptions){.epochs = m->epochs, .steps = m->steps, .log_every = m->log_every, .eval_every = m->eval_every,
                   .eval_every_steps = m->eval_every_steps, .shuffle = 1,
                   .threads = omp_get_num_procs(), .schedule = m->schedule, .hyper = m->hyper,
                   .loss_scale = 65536, .loss_scale_interval = 2000, /* GradScaler's defaults */
                   .accumulate = m->accumulate > 1 ? m->accumulate : 1};
    rt_target_init(&o->target, m);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
#define VALUE() (has_value ? argv[++i] : (rt_die_usage("%s needs a value", a), ""))
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) usage(m), exit(0);
        else if (strcmp(a, "--data") == 0) bind(m, a, VALUE(), o->data);
        else if (strcmp(a, "--eval-data") == 0) bind(m, a, VALUE(), o->eval);
        else if (strcmp(a, "--augment") == 0) bind(m, a, VALUE(), o->augment);
        else if (strcmp(a, "--epochs") == 0) o->epochs = number(a, VALUE(), 1), o->epochs_given = 1;
        else if (strcmp(a, "--steps") == 0) o->steps = number(a, VALUE(), 1), o->steps_given = 1;
        else if (strcmp(a, "--seed") == 0) o->seed = (uint64_t)number(a, VALUE(), 0), o->seed_given = 1;
        else if (strcmp(a, "--threads") == 0) o->threads = (int)number_at_most(a, VALUE(), 1, 1024);
        else if (strcmp(a, "--log-every") == 0) o->log_every = number(a, VALUE(), 1);
        else if (strcmp(a, "--eval-every") == 0) o->eval_every = number(a, VALUE(), 1), o->eval_every_steps = 0;
        else if (strcmp(a, "--eval-every-steps") == 0) o->eval_every_steps = number(a, VALUE(), 1);
        else if (strcmp(a, "--init") == 0) o->init = VALUE();
        else if (strcmp(a, "--init-skip") == 0) o->init_rules.skip = VALUE();
        else if (strcmp(a, "--init-prefix") == 0) o->init_rules.prefix = VALUE();
        else if (strcmp(a, "--init-partial") == 0) o->init_rules.partial = 1;
        else if (strcmp(a, "--save") == 0) o->save = VALUE();
        else if (strcmp(a, "--save-best") == 0) o->save_best = VALUE();
        else if (strcmp(a, "--adapter") == 0) o->adapter = lora_option(m, a, VALUE());
        else if (strcmp(a, "--save-adapter") == 0) o->save_adapter = lora_option(m, a, VALUE());
        else if (strcmp(a, "--save-merged") == 0) o->save_merged = lora_option(m, a, VALUE());
        else if (strcmp(a, "--checkpoint") == 0) o->checkpoint = VALUE();
        else if (strcmp(a, "--checkpoint-every") == 0) o->checkpoint_every = number(a, VALUE(), 1);
        else if (strcmp(a, "--resume") == 0) o->resume = VALUE();
        else if (strcmp(a, "--stop-at") == 0) o->stop_at = number(a, VALUE(), 1);
        else if (strcmp(a, "--accumulate") == 0) o->accumulate = (int)number_at_most(a, VALUE(), 1, 1 << 20);
        else if (strcmp(a, "--log") == 0) o->log = VALUE();
        else if (strcmp(a, "--mllog") == 0) o->mllog = VALUE();
        else if (strcmp(a, "--no-shuffle") == 0) o->shuffle = 0;
        else if (strcmp(a, "--quiet") == 0) o->quiet = 1;
        else if (strcmp(a, "--list-params") == 0) o->list_params = 1;
        else if (strcmp(a, "--gradcheck") == 0) o->gradcheck = 1;
        else if (strcmp(a, "--no-graph") == 0 && m->device) o->no_graph = 1;
        else if (strcmp(a, "--loss-scale") == 0 && m->loss_scaling)
            o->loss_scale = loss_scale_option(a, VALUE()), o->loss_scale_given = 1;
        else if (strcmp(a, "--loss-scale-interval") == 0 && m->loss_scaling)
            o->loss_scale_interval = number(a, VALUE(), 1), o->loss_scale_interval_given = 1;
        else if (strcmp(a, "--update-after-backward") == 0 && !m->device) o->update_after_backward = 1;
        else if (strcmp(a, "--eval-only") == 0) o->eval_only = 1;
        else if (strcmp(a, "--eval-rank") == 0 && m->comm) o->eval_rank = 1;
        else if (strcmp(a, "--eval-async") == 0) {
            if (!m->device)
                rt_die_usage("--eval-async evaluates on a second stream of a GPU trainer (netc --backend cuda); a "
                             "distributed CPU trainer evaluates beside training with --eval-rank");
            o->eval_async = 1;
        }
        else if (strcmp(a, "--predict") == 0) bind(m, a, VALUE(), o->predict), o->n_predict++;
        else if (strcmp(a, "--predict-out") == 0) o->predict_out = VALUE();
        else if (rt_hparam_is_flag(a)) rt_hparam_set(m, &o->schedule, &o->hyper, a, VALUE());
        else if (strcmp(a, "--target-accuracy") == 0 || strcmp(a, "--target-loss") == 0 ||
                 strcmp(a, "--no-target") == 0) {
            RtError err;
            const char *value = strcmp(a, "--no-target") == 0 ? "" : VALUE();
            if (rt_target_option(&o->target, m, a, value, &err)) rt_die_usage("%s", err.msg);
            o->target_given = 1;
        }
        else rt_die_usage("unknown option '%s'", a);
#undef VALUE
    }
    if (o->epochs_given && !o->steps_given) o->steps = 0; /* --epochs takes the place of the model's steps = N */
    for (int config = 0; config < 2; config++) { /* for the checks of inputs against outputs */
        if (o->adapter) rt_lora_file(o->adapter, config, o->adapter_files[config], PATH_MAX);
        if (o->save_adapter) rt_lora_file(o->save_adapter, config, o->save_adapter_files[config], PATH_MAX);
    }
    check_options(m, o);
}
