/* rt_hparams.c - the training recipe's values a user may change on the trainer's command line
 * (--lr, --weight-decay, --warmup-epochs, --step-epochs, --gamma, --min-lr, --end-lr, --power)
 * without recompiling.
 *
 * The runtime computes the learning-rate schedule itself (rt_lr_at reads RtModel.schedule and
 * hands the rate to the generated optimizer through RtCtx.lr), and a CPU trainer's optimizer
 * reads its hyperparameters through RtCtx.hyper; a GPU trainer's device gets both in its state
 * (RtDevState.schedule, .hyper), from which its kernels compute the rate and read the
 * hyperparameters. So an override changes nothing but that number: --lr X gives the same bits
 * as a model compiled with -D lr=X. The trainer applies the overrides to its own copy of the
 * RtModel, which the checkpoint fingerprint is computed from, so a checkpoint records them:
 * resuming it needs the same flags.
 */
#include <string.h>

#include "rt_internal.h"

typedef struct HParam {
    const char *flag;
    int kind;          /* the schedule it belongs to, or -1 for every schedule */
    int optim;         /* 1: a field of RtOptimParams, 0: of RtSchedule */
    size_t offset;     /* of its double there */
    int positive;      /* 0 is refused too (every value must be >= 0) */
    const char *meaning;
} HParam;

static const HParam hparams[] = {
    {"--lr", -1, 0, offsetof(RtSchedule, base_lr), 0, "base learning rate"},
    {"--weight-decay", -1, 1, offsetof(RtOptimParams, weight_decay), 0, "the optimizer's weight decay"},
    {"--warmup-epochs", -1, 0, offsetof(RtSchedule, warmup_epochs), 0, "epochs of linear warm-up"},
    {"--warmup-steps", -1, 0, offsetof(RtSchedule, warmup_steps), 0, "optimizer steps of linear warm-up"},
    {"--step-epochs", RT_SCHED_STEP, 0, offsetof(RtSchedule, step_epochs), 1, "step(): epochs between decays"},
    {"--step-steps", RT_SCHED_STEP, 0, offsetof(RtSchedule, step_steps), 1, "step(): optimizer steps between decays"},
    {"--gamma", RT_SCHED_STEP, 0, offsetof(RtSchedule, gamma), 0, "step(): factor of each decay"},
    {"--min-lr", RT_SCHED_COSINE, 0, offsetof(RtSchedule, min_lr), 0, "cosine(): learning rate at the end"},
    {"--end-lr", RT_SCHED_POLY, 0, offsetof(RtSchedule, min_lr), 0, "poly(): learning rate at the end"},
    {"--power", RT_SCHED_POLY, 0, offsetof(RtSchedule, power), 0, "poly(): the decay's exponent"},
};
enum { N_HPARAMS = sizeof hparams / sizeof hparams[0] };

static const char *const sched_names[] = {"constant()", "step(...)", "cosine(...)", "poly(...)"};

static const HParam *find(const char *flag) {
    for (int i = 0; i < N_HPARAMS; i++)
        if (strcmp(hparams[i].flag, flag) == 0) return &hparams[i];
    return NULL;
}

int rt_hparam_is_flag(const char *flag) { return find(flag) != NULL; }

/* The double h names in the schedule s or the hyperparameters o. */
static double *field(const HParam *h, RtSchedule *s, RtOptimParams *o) {
    return (double *)((h->optim ? (char *)o : (char *)s) + h->offset);
}

/* A value for a schedule the model does not use would be ignored without a word: refused. */
void rt_hparam_set(const RtModel *m, RtSchedule *s, RtOptimParams *o, const char *flag, const char *value) {
    const HParam *h = find(flag);
    if (h->kind >= 0 && (int)m->schedule.kind != h->kind)
        rt_die_usage("%s: the model's schedule is %s, which has no such value", flag, sched_names[m->schedule.kind]);
    double v;
    if (rt_parse_finite(value, &v) || v < 0 || (h->positive && v == 0))
        rt_die_usage(h->positive ? "%s needs a number > 0, found '%s'" : "%s needs a number >= 0, found '%s'", flag,
                     value);
    *field(h, s, o) = v;
    /* a value in epochs takes the place of its twin in steps, and the reverse (rt_lr_at reads
     * the one in steps when it is not 0) */
    if (h->offset == offsetof(RtSchedule, warmup_epochs) && !h->optim) s->warmup_steps = 0;
    if (h->offset == offsetof(RtSchedule, warmup_steps) && !h->optim) s->warmup_epochs = 0;
    if (h->offset == offsetof(RtSchedule, step_epochs) && !h->optim) s->step_steps = 0;
    if (h->offset == offsetof(RtSchedule, step_steps) && !h->optim) s->step_epochs = 0;
}

void rt_hparam_usage(const RtModel *m) {
    printf("\nthe model's training recipe (default: the model's value):\n");
    for (int i = 0; i < N_HPARAMS; i++) {
        const HParam *h = &hparams[i];
        if (h->kind >= 0 && (int)m->schedule.kind != h->kind) continue;
        char left[40];
        snprintf(left, sizeof left, "%s X", h->flag);
        RtSchedule s = m->schedule;
        RtOptimParams o = m->hyper;
        printf("  %-22s %s (default %.9g)\n", left, h->meaning, *field(h, &s, &o));
    }
}
