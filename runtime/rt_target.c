/* rt_target.c - training to a quality target, as MLPerf's runs do: a run stops at its first
 * evaluation whose quality reaches the target (ResNet-50's 75.9 % top-1 accuracy, BERT's 72 %
 * masked-LM accuracy, GPT-3's log perplexity 2.69, Llama 2 70B LoRA's evaluation loss 0.925),
 * instead of training a fixed number of epochs, and a run that ends without reaching it failed.
 *
 * The target comes from the train section (target_accuracy, target_loss; RtModel) and the
 * command line (--target-accuracy, --target-loss, --no-target). This file holds what the target
 * is, and whether an evaluation met it; rt_main decides where the run stops (every rank at the
 * same step) and what it writes.
 */
#include <stdio.h>
#include <string.h>

#include "rt_internal.h"

void rt_target_init(RtTarget *t, const RtModel *m) {
    *t = (RtTarget){.accuracy = m->target_accuracy, .loss = m->target_loss, .has_loss = m->has_target_loss};
}

int rt_target_option(RtTarget *t, const RtModel *m, const char *flag, const char *value, RtError *err) {
    if (strcmp(flag, "--no-target") == 0) {
        t->accuracy = 0, t->has_loss = 0;
        return 0;
    }
    double v;
    int bad = rt_parse_finite(value, &v) != 0;
    if (strcmp(flag, "--target-loss") == 0) {
        if (bad) return rt_fail(err, "%s needs a number, found '%s'", flag, value);
        t->loss = v, t->has_loss = 1;
        return 0;
    }
    if (bad || !(v > 0 && v <= 1))
        return rt_fail(err, "%s needs an accuracy, a number in (0, 1], found '%s'", flag, value);
    if (!m->has_accuracy)
        return rt_fail(err, "%s: model '%s' reports no accuracy (its train section has no metrics); a target on "
                            "its evaluation loss is --target-loss", flag, m->name);
    t->accuracy = v;
    return 0;
}

int rt_target_on(const RtTarget *t) { return t->accuracy > 0 || t->has_loss; }

int rt_target_text(const RtTarget *t, char *buf, size_t size) {
    int n = 0;
    buf[0] = 0;
    if (t->accuracy > 0) n += snprintf(buf, size, "accuracy >= %.6g", t->accuracy);
    if (t->has_loss && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "%sloss <= %.6g", n ? " and " : "", t->loss);
    return n;
}

/* Every target must be met by the same evaluation; NaN meets none. */
int rt_target_eval(RtTarget *t, int64_t epoch, double loss, double accuracy) {
    t->evaluated = 1, t->last_epoch = epoch, t->last_loss = loss, t->last_accuracy = accuracy;
    if (!rt_target_on(t) || t->met) return 0;
    int met = (t->accuracy <= 0 || accuracy >= t->accuracy) && (!t->has_loss || loss <= t->loss);
    if (met) t->met = 1;
    return met;
}
