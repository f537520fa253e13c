/* sema_train.c - the train section: the loss, metrics and output, the optimizer and its
 * hyperparameters (rt_recipe.h's table), the schedule and warm-up in epochs or steps, clipping,
 * freezing and the weight-decay groups (LoRA's setting is sema_lora.c's). docs/language.md's
 * "The train section" documents each setting. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sema.h"
#include "sema_args.h"

static const SemaBuiltin schedule_calls[] = {
    {"constant", "", NULL, 0, 0, {""}},
    {"step", "every, gamma=0.1, every_steps", NULL, 0, 3, {"every", "gamma", "every_steps"}},
    {"cosine", "min_lr=0", NULL, 0, 1, {"min_lr"}},
    {"poly", "power=1, end_lr=0", NULL, 0, 2, {"power", "end_lr"}},
};

/* Bind a recipe call such as sgd(0.1, momentum=0.9) to `b`, the one of its kind named like the
 * call (NULL when none is: an error naming the `allowed` ones, and the nearest of them `sg`
 * found). NULL after an error. */
static const SemaBuiltin *recipe_call(Sema *S, const AstExpr *e, const SemaBuiltin *b, const char *allowed,
                                      const Suggest *sg, Value *args) {
    if (!b || e->kind != AST_CALL) {
        diag_error(e->loc, "expected one of: %s", allowed);
        sema_suggest_hint(sg);
        return NULL;
    }
    if (!sema_bind_args(S, S->global, e, b->params, b->n_params, args)) return NULL;
    for (int i = 0; i < b->n_required; i++)
        if (args[i].k == V_NONE) {
            diag_error(e->loc, "'%s' needs the argument '%s'", b->name, b->params[i]);
            diag_hint("%s(%s)", b->name, b->signature);
            return NULL;
        }
    return b;
}

/* Every hyperparameter an optimizer may take after lr: how its value is checked and where it is
 * kept. An optimizer's signature in rt_recipe.h's table names those it takes, with defaults. */
typedef enum {
    HP_NUMBER, /* a number in [0, max] */
    HP_BOOL,   /* true or false: 1 or 0 */
    HP_BETAS,  /* a list of two numbers in [0, 1): beta1 and beta2 */
} HyperKind;

typedef struct {
    const char *name;
    HyperKind kind;
    double max;
    size_t offset; /* of its double in RtOptimParams (HP_NUMBER, HP_BOOL) */
} Hyper;

static const Hyper hypers[] = {
    {"momentum", HP_NUMBER, 1, offsetof(RtOptimParams, momentum)},
    {"dampening", HP_NUMBER, 1, offsetof(RtOptimParams, dampening)},
    {"weight_decay", HP_NUMBER, 1e6, offsetof(RtOptimParams, weight_decay)},
    {"nesterov", HP_BOOL, 0, offsetof(RtOptimParams, nesterov)},
    {"betas", HP_BETAS, 0, 0},
    {"eps", HP_NUMBER, 1, offsetof(RtOptimParams, eps)},
    {"eta", HP_NUMBER, 1e3, offsetof(RtOptimParams, eta)},
};

/* An optimizer's row as a built-in to bind calls with, and the defaults its signature gives:
 * "lr, betas=[0.9, 0.999], nesterov=false" has the parameters lr (required), betas and nesterov,
 * whose defaults are {0.9, 0.999} and {0}. */
typedef struct {
    SemaBuiltin b;
    char names[SEMA_MAX_ARGS][32];
    double def[SEMA_MAX_ARGS][2];
} OptimCall;

/* A default's numbers from the signature text at p (true is 1, false 0, [a, b] two numbers);
 * returns the text after it. */
static const char *signature_default(const char *p, double def[2]) {
    int list = *p == '[';
    p += list;
    for (int k = 0; k <= list; k++) {
        def[k] = strncmp(p, "true", 4) == 0 ? 1 : strtod(p, NULL);
        p += strcspn(p, ",]");
        if (k < list) p += strspn(p, ", ");
    }
    return p + list;
}

static void optim_call(const RtOptimizer *o, OptimCall *c) {
    *c = (OptimCall){.b = {o->name, o->signature, NULL, 0, 0, {""}}};
    for (const char *p = o->signature; *p && c->b.n_params < SEMA_MAX_ARGS; p += strspn(p, ", ")) {
        int i = c->b.n_params++;
        size_t len = strcspn(p, "=,");
        snprintf(c->names[i], sizeof c->names[i], "%.*s", (int)len, p);
        c->b.params[i] = c->names[i];
        p += len;
        if (*p == '=') p = signature_default(p + 1, c->def[i]);
        else c->b.n_required = i + 1;
    }
}

static const Hyper *find_hyper(const char *name) {
    for (size_t i = 0; i < sizeof hypers / sizeof *hypers; i++)
        if (strcmp(hypers[i].name, name) == 0) return &hypers[i];
    ICE("sema: rt_recipe.h's table of optimizers names a hyperparameter sema does not know: %s", name);
}

static void optim_betas(const AstExpr *e, Value betas, const double def[2], RtOptimParams *h) {
    h->beta1 = def[0], h->beta2 = def[1];
    if (betas.k == V_LIST && betas.n == 2 && betas.items[0].k != V_LIST) {
        h->beta1 = sema_num(betas.items[0]);
        h->beta2 = sema_num(betas.items[1]);
    } else if (betas.k != V_NONE) {
        diag_error(arg_loc(e, "betas", 1), "betas must be a list of two numbers, e.g. [0.9, 0.999]");
    }
    if (!(h->beta1 >= 0 && h->beta1 < 1 && h->beta2 >= 0 && h->beta2 < 1))
        diag_error(arg_loc(e, "betas", 1), "betas must lie in [0, 1)");
}

/* Argument i of an optimizer call (its hyperparameter hp) into h. */
static void optim_arg(Args *A, const OptimCall *c, int i, const Hyper *hp, RtOptimParams *h) {
    double *field = (double *)((char *)h + hp->offset);
    switch (hp->kind) {
    case HP_NUMBER: *field = arg_num(A, i, c->def[i][0], 0, hp->max); break;
    case HP_BOOL: *field = arg_bool(A, i, (int)c->def[i][0]); break;
    case HP_BETAS: optim_betas(A->call, A->a[i], c->def[i], h); break;
    }
}

static void train_optimizer(Sema *S, const AstExpr *e) {
    Value a[SEMA_MAX_ARGS];
    OptimCall calls[RT_N_OPTIMS];
    char allowed[256] = "";
    const SemaBuiltin *b = NULL;
    RtOptimKind kind = RT_OPTIM_SGD;
    Suggest sg;
    suggest_init(&sg, e->kind == AST_CALL ? e->name : "");
    for (int k = 0; k < RT_N_OPTIMS; k++) {
        optim_call(rt_optimizer((RtOptimKind)k), &calls[k]);
        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s(...)", k ? " " : "",
                 calls[k].b.name);
        if (e->kind == AST_CALL && strcmp(calls[k].b.name, e->name) == 0) b = &calls[k].b, kind = (RtOptimKind)k;
        suggest_try(&sg, calls[k].b.name);
    }
    if (!(b = recipe_call(S, e, b, allowed, &sg, a))) return;
    Args A_ = {S, e, b, a, 1, NULL}, *A = &A_;
    IrTrain *t = &S->g->train;
    t->optim = kind;
    t->lr = arg_num(A, 0, 0.01, 0, 1e6);
    for (int i = 1; i < b->n_params; i++) optim_arg(A, &calls[kind], i, find_hyper(b->params[i]), &t->hyper);
    const RtOptimParams *h = &t->hyper;
    if (A->ok && h->nesterov != 0 && (h->momentum == 0 || h->dampening != 0))
        diag_error(e->loc, "nesterov momentum needs momentum > 0 and dampening = 0 (as in PyTorch)");
}

static void train_schedule(Sema *S, const AstExpr *e) {
    Value a[SEMA_MAX_ARGS];
    const SemaBuiltin *b = NULL;
    Suggest sg;
    suggest_init(&sg, e->kind == AST_CALL ? e->name : "");
    for (size_t i = 0; i < sizeof schedule_calls / sizeof *schedule_calls; i++) {
        if (e->kind == AST_CALL && strcmp(schedule_calls[i].name, e->name) == 0) b = &schedule_calls[i];
        suggest_try(&sg, schedule_calls[i].name);
    }
    if (!(b = recipe_call(S, e, b, "constant() step(...) cosine(...) poly(...)", &sg, a))) return;
    Args A_ = {S, e, b, a, 1, NULL}, *A = &A_;
    IrTrain *t = &S->g->train;
    if (strcmp(b->name, "constant") == 0) t->sched = SCHED_CONSTANT;
    else if (strcmp(b->name, "step") == 0) {
        t->sched = SCHED_STEP;
        t->gamma = arg_num(A, 1, 0.1, 0, 1e6);
        /* every (epochs, may be fractional) or every_steps (optimizer steps): one of the two */
        if ((a[0].k == V_NONE) == (a[2].k == V_NONE)) {
            diag_error(e->loc, "step(...) needs one of 'every' (epochs) and 'every_steps' (optimizer steps)%s",
                       a[0].k == V_NONE ? "" : ", not both");
            diag_hint("step(every = 30, gamma = 0.1) or step(every_steps = 1000, gamma = 0.1)");
            return;
        }
        if (a[0].k != V_NONE) t->step_epochs = arg_num(A, 0, 1, 1e-9, 1e9);
        else if (a[2].k != V_INT && a[2].k != V_ERR)
            diag_error(arg_loc(e, "every_steps", 2), "'every_steps' of step must be an integer in [1, 1e+12], found %s",
                       sema_value_text(S, a[2]));
        else t->step_steps = arg_num(A, 2, 1, 1, 1e12);
    } else if (strcmp(b->name, "poly") == 0) {
        t->sched = SCHED_POLY;
        t->power = arg_num(A, 0, 1, 0, 100);
        t->min_lr = arg_num(A, 1, 0, 0, 1e6);
    } else {
        t->sched = SCHED_COSINE;
        t->min_lr = arg_num(A, 0, 0, 0, 1e6);
    }
}

/* A setting that must be a number in [min, max]; returns def after an error. */
static double train_num(Sema *S, const AstStmt *s, double min, double max, int integer) {
    Value v = sema_eval(S, S->global, s->value);
    if (v.k == V_ERR) return min;
    if ((v.k != V_INT && (integer || v.k != V_FLOAT)) || !(sema_num(v) >= min && sema_num(v) <= max)) {
        diag_error(s->value->loc, "'%s' must be %s in [%g, %g], found %s", s->name,
                   integer ? "an integer" : "a number", min, max, sema_value_text(S, v));
        return min;
    }
    return sema_num(v);
}

/* Suggests the parameter name, or name prefix ending before a '.', nearest to `pre`. */
static void suggest_param(Sema *S, const char *pre) {
    Suggest sg;
    suggest_init(&sg, pre);
    for (int p = 0; p < S->g->n_params; p++) {
        const char *name = S->g->params[p].name;
        for (const char *dot = strchr(name, '.'); dot; dot = strchr(dot + 1, '.'))
            suggest_try(&sg, arena_printf(S->arena, "%.*s", (int)(dot - name), name));
        suggest_try(&sg, name);
    }
    sema_suggest_hint(&sg);
}

static void train_freeze(Sema *S, const AstStmt *s) {
    /* After an error before the train section a layer may be missing its parameters: a name
     * that matches none then proves nothing, and saying so would be a false error. */
    int complete = S->errors_before_train == 0;
    Value one = sema_eval(S, S->global, s->value), v = one;
    if (one.k == V_STR) v = (Value){.k = V_LIST, .items = &one, .n = 1}; /* not &v: v changes */
    if (v.k != V_LIST) {
        if (v.k != V_ERR) diag_error(s->value->loc, "freeze takes a list of parameter names, e.g. [\"conv1\"]");
        return;
    }
    for (int i = 0; i < v.n; i++) {
        if (v.items[i].k != V_STR) {
            diag_error(s->value->loc, "freeze takes strings, found %s", sema_value_text(S, v.items[i]));
            continue;
        }
        const char *pre = v.items[i].s;
        size_t n = strlen(pre);
        int hits = 0;
        for (int p = 0; p < S->g->n_params; p++) {
            const char *name = S->g->params[p].name;
            if (strncmp(name, pre, n) == 0 && (name[n] == 0 || name[n] == '.')) {
                S->g->params[p].trainable = 0;
                hits++;
            }
        }
        if (!hits && complete) {
            diag_error(s->value->loc, "freeze: no parameter is named '%s' or starts with '%s.'", pre, pre);
            suggest_param(S, pre);
        }
    }
}

/* Whether entry `what` of no_decay names parameter p: "biases" every X.bias, "norms" every
 * weight and bias of a batchnorm2d, layernorm, rmsnorm or groupnorm (IrParam.norm), anything else a name
 * or prefix as in freeze. */
static int no_decay_matches(const IrParam *p, const char *what) {
    size_t n = strlen(what), len = strlen(p->name);
    if (p->buffer) return 0;
    if (strcmp(what, "biases") == 0) return len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
    if (strcmp(what, "norms") == 0) return p->norm;
    return strncmp(p->name, what, n) == 0 && (p->name[n] == 0 || p->name[n] == '.');
}

/* no_decay = ["biases", "norms", "NAME", ...]: parameters trained without weight decay, the
 * second parameter group of a PyTorch recipe. */
static void train_no_decay(Sema *S, const AstStmt *s) {
    Value one = sema_eval(S, S->global, s->value), v = one;
    if (one.k == V_STR) v = (Value){.k = V_LIST, .items = &one, .n = 1};
    if (v.k != V_LIST) {
        if (v.k != V_ERR) diag_error(s->value->loc, "no_decay takes a list of strings, e.g. [\"biases\", \"norms\"]");
        return;
    }
    for (int i = 0; i < v.n; i++) {
        if (v.items[i].k != V_STR) {
            diag_error(s->value->loc, "no_decay takes strings, found %s", sema_value_desc(S, v.items[i]));
            continue;
        }
        int hits = 0;
        for (int p = 0; p < S->g->n_params; p++)
            if (no_decay_matches(&S->g->params[p], v.items[i].s)) S->g->params[p].no_decay = 1, hits++;
        if (!hits && S->errors_before_train == 0) /* after an error some parameters may be missing */
            diag_error(s->value->loc, "no_decay: no parameter matches '%s' (\"biases\", \"norms\", or a parameter "
                       "name or prefix)", v.items[i].s);
    }
}

static const char *loss_name(const AstExpr *e) {
    while (e->kind == AST_LABELED) e = e->lhs;
    return e->kind == AST_CALL ? e->name : "expression";
}

static void train_loss(Sema *S, const AstStmt *s) {
    Value v = sema_eval(S, S->global, s->value);
    if (v.k == V_ERR) return;
    if (v.k != V_TENSOR || v.t->shape.rank != 0 || v.t->dtype != DT_F32) {
        diag_error(s->value->loc, "the loss must be a scalar f32 tensor, found %s", sema_value_desc(S, v));
        diag_hint("use a loss such as cross_entropy(logits, label), or mean(...)");
        return;
    }
    S->g->loss = v.t;
    S->g->train.loss_name = loss_name(s->value);
}

/* metrics = accuracy(...) or a list of up to IR_MAX_METRICS of them (the top-1 and top-5 of the
 * same logits, say). Several must count the same positions: every one with the same
 * ignore_index and labels, or none with one (the trainer counts the positions once). Their
 * counts are joined into one f32[n] value, g->correct, the step's result. */
static void train_metrics(Sema *S, const AstStmt *s) {
    Value v = sema_eval(S, S->global, s->value);
    if (v.k == V_ERR) return;
    const Value *items = v.k == V_LIST ? v.items : &v;
    const int n = v.k == V_LIST ? v.n : 1;
    if (n < 1 || n > IR_MAX_METRICS) {
        diag_error(s->value->loc, "metrics takes 1 to %d accuracies, found a list of %d", IR_MAX_METRICS, n);
        diag_hint("metrics = [accuracy(logits, label), accuracy(logits, label, top_k = 5)]");
        return;
    }
    IrNode *joined = NULL;
    for (int i = 0; i < n; i++) {
        if (items[i].k == V_ERR) return;
        if (items[i].k != V_TENSOR || items[i].t->op != OP_ACCURACY) {
            diag_error(s->value->loc, "metrics must be accuracy(logits, label)%s, found %s",
                       n > 1 ? " for each item" : "", sema_value_desc(S, items[i]));
            return;
        }
        IrNode *acc = items[i].t;
        const IrNode *first = items[0].t, *lab = acc->in[1], *lab0 = first->in[1];
        while (lab->op == OP_CAST) lab = lab->in[0];
        while (lab0->op == OP_CAST) lab0 = lab0->in[0];
        if (acc->attr.has_ignore != first->attr.has_ignore ||
            (acc->attr.has_ignore && (acc->attr.ignore_index != first->attr.ignore_index || lab != lab0))) {
            diag_error(s->value->loc, "metric %d counts other positions than metric 0: every accuracy of metrics "
                       "must have the same ignore_index and labels, or none an ignore_index", i);
            return;
        }
        for (int j = 0; j < i; j++)
            if (acc->attr.top_k > 1 && items[j].t->attr.top_k == acc->attr.top_k) {
                diag_error(s->value->loc, "metrics %d and %d are both the top-%d accuracy: the log would name them "
                           "alike", j, i, acc->attr.top_k);
                return;
            }
        if (n == 1) {
            joined = acc;
            break;
        }
        IrShape one = {.rank = 1, .dim = {1}};
        IrNode *r = sema_node(S, OP_RESHAPE, one, DT_F32, acc->loc, 1, acc, NULL, NULL);
        if (!joined) {
            joined = r;
            continue;
        }
        joined = sema_concat(S, joined, r, 0, s->value->loc);
    }
    S->g->correct = joined;
}

/* output = x: the value --predict writes, instead of the one the loss function reads first; a
 * float tensor with one row per sample. sema_train applies it once every loss is built. */
static void train_output(Sema *S, const AstStmt *s) {
    Value v = sema_eval(S, S->global, s->value);
    if (v.k == V_ERR || !sema_want_float_tensor(S, v, s->value->loc, "output")) return;
    const IrShape *sh = &v.t->shape;
    if (sh->rank < 1 || sh->dim[0] != S->g->batch) {
        diag_error(s->value->loc, "output must have one row per sample, [batch (%lld), ...], found shape %s",
                   (long long)S->g->batch, sema_shape_str(S, sh));
        return;
    }
    S->named_output = v.t;
}

/* target_accuracy = A, target_loss = L: the evaluation accuracy (the first metric) training
 * runs until it reaches, an accuracy in (0, 1], and the evaluation loss it runs until it gets
 * down to, any number. That a target accuracy has a metric is checked once the body is read. */
static void train_target(Sema *S, const AstStmt *s) {
    IrTrain *t = &S->g->train;
    int acc = strcmp(s->name, "target_accuracy") == 0;
    Value v = sema_eval(S, S->global, s->value);
    if (v.k == V_ERR) return;
    double x = v.k == V_INT || v.k == V_FLOAT ? sema_num(v) : NAN;
    if (acc ? !(x > 0 && x <= 1) : !isfinite(x)) {
        diag_error(s->value->loc, "'%s' must be %s, found %s", s->name,
                   acc ? "an accuracy, a number in (0, 1]" : "a number (the evaluation loss to reach)",
                   sema_value_text(S, v));
        return;
    }
    if (acc) t->target_accuracy = x;
    else t->target_loss = x, t->has_target_loss = 1;
}

/* The settings a train body gave that exclude one another, and whether it has an optimizer. */
typedef struct TrainSeen {
    int have_optim;
    const AstStmt *warmup, *warmup_steps, *epochs, *steps, *target_accuracy, *eval_every, *eval_every_steps;
} TrainSeen;

static void train_setting(Sema *S, const AstStmt *s, TrainSeen *seen) {
    IrTrain *t = &S->g->train;
    if (strcmp(s->name, "loss") == 0) train_loss(S, s);
    else if (strcmp(s->name, "metrics") == 0) train_metrics(S, s);
    else if (strcmp(s->name, "optimizer") == 0) train_optimizer(S, s->value), seen->have_optim = 1;
    else if (strcmp(s->name, "schedule") == 0) train_schedule(S, s->value);
    else if (strcmp(s->name, "warmup") == 0) t->warmup_epochs = train_num(S, s, 0, 1e6, 0), seen->warmup = s;
    else if (strcmp(s->name, "warmup_steps") == 0)
        t->warmup_steps = train_num(S, s, 0, 1e12, 1), seen->warmup_steps = s;
    else if (strcmp(s->name, "epochs") == 0) t->epochs = (int64_t)train_num(S, s, 1, 1e9, 1), seen->epochs = s;
    else if (strcmp(s->name, "steps") == 0) t->steps = (int64_t)train_num(S, s, 1, 1e12, 1), seen->steps = s;
    else if (strcmp(s->name, "clip_grad_norm") == 0) t->clip_grad_norm = train_num(S, s, 0, 1e9, 0);
    else if (strcmp(s->name, "accumulate") == 0) t->accumulate = (int64_t)train_num(S, s, 1, 1 << 20, 1);
    else if (strcmp(s->name, "eval_every") == 0)
        t->eval_every = (int64_t)train_num(S, s, 1, 1e9, 1), seen->eval_every = s;
    else if (strcmp(s->name, "eval_every_steps") == 0)
        t->eval_every_steps = (int64_t)train_num(S, s, 1, 1e12, 1), seen->eval_every_steps = s;
    else if (strcmp(s->name, "log_every") == 0) t->log_every = (int64_t)train_num(S, s, 1, 1e12, 1);
    else if (strcmp(s->name, "target_accuracy") == 0) train_target(S, s), seen->target_accuracy = s;
    else if (strcmp(s->name, "target_loss") == 0) train_target(S, s);
    else if (strcmp(s->name, "freeze") == 0) train_freeze(S, s);
    else if (strcmp(s->name, "no_decay") == 0) train_no_decay(S, s);
    else if (strcmp(s->name, "output") == 0) train_output(S, s);
    else if (strcmp(s->name, "lora") == 0) sema_train_lora(S, s);
    else {
        static const char *const keys[] = {"loss",      "metrics",   "optimizer", "schedule", "warmup",
                                           "warmup_steps", "epochs", "steps", "clip_grad_norm", "eval_every",
                                           "log_every", "freeze", "no_decay", "output", "lora", "accumulate",
                                           "target_accuracy", "target_loss", "eval_every_steps"};
        diag_error(s->name_loc, "unknown train setting '%s'", s->name);
        Suggest sg;
        suggest_init(&sg, s->name);
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) suggest_try(&sg, keys[i]);
        sema_suggest_hint(&sg);
        diag_hint("settings are loss, metrics, optimizer, schedule, warmup, warmup_steps, epochs, steps, "
                  "clip_grad_norm, accumulate, eval_every, eval_every_steps, log_every, freeze, no_decay, output, "
                  "lora, target_accuracy, target_loss");
    }
}

/* The settings of a train body; an `if` chooses among settings at compile time. */
static void train_body(Sema *S, AstStmt *const *body, int n, TrainSeen *seen) {
    for (int i = 0; i < n; i++) {
        const AstStmt *s = body[i];
        if (s->kind == STMT_IF) {
            Value c = sema_eval(S, S->global, s->value);
            if (!sema_want_bool(S, c, s->value->loc)) continue;
            if (c.i) train_body(S, s->body, s->n_body, seen);
            else train_body(S, s->else_body, s->n_else, seen);
            continue;
        }
        if (s->kind != STMT_ASSIGN) {
            diag_error(s->loc, "the train section holds settings of the form `name = value` and `if`");
            continue;
        }
        train_setting(S, s, seen);
    }
}

/* Two settings that say the same thing in different units: one of them. */
static void train_either(const AstStmt *a, const AstStmt *b, const char *why) {
    if (!a || !b) return;
    diag_error(b->name_loc, "'%s' and '%s' (line %d) both give %s; give one of them", b->name, a->name,
               a->name_loc.line, why);
}

void sema_train(Sema *S, const AstStmt *train) {
    TrainSeen seen = {0};
    S->errors_before_train = diag_error_count();
    train_body(S, train->body, train->n_body, &seen);
    train_either(seen.warmup, seen.warmup_steps, "the warm-up (in epochs and in optimizer steps)");
    train_either(seen.epochs, seen.steps, "the run's length (in epochs and in optimizer steps)");
    train_either(seen.eval_every, seen.eval_every_steps, "the evaluations' interval (in epochs and in optimizer steps)");
    if (S->named_output) S->g->output = S->named_output;
    if (seen.target_accuracy && !S->g->correct && !diag_error_count()) {
        diag_error(seen.target_accuracy->name_loc, "'target_accuracy' needs a metric to reach, and the train "
                                                   "section has none");
        diag_hint("add e.g. `metrics = accuracy(logits, label)`, or give `target_loss` instead");
    }
    if (!S->g->loss && !diag_error_count()) {
        diag_error(train->loc, "the train section has no loss");
        diag_hint("add e.g. `loss = cross_entropy(logits, label)`");
    }
    if (!seen.have_optim && !diag_error_count()) {
        diag_error(train->loc, "the train section has no optimizer");
        diag_hint("add e.g. `optimizer = sgd(0.01, momentum = 0.9)`");
    }
}
