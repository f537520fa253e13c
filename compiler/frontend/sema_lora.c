/* sema_lora.c - LoRA fine-tuning, train { lora = lora(targets, r, alpha, dropout) }: which dense
 * layers get low-rank adapters (PEFT's target_modules rule), and, once the whole program has been
 * evaluated, the adapters themselves: two parameters and four nodes beside each adapted product,
 *
 *   y = x W^T  +  ((dropout(x) A^T) B^T) * (alpha / r)       A [r, in], B [out, r]
 *
 * as PEFT's LoraLayer computes it (A as torch.nn.Linear initialises it, B zero, so training
 * starts from the base model's function). Every other parameter is frozen. docs/language.md,
 * "LoRA", is the user's description. */
#include <math.h>
#include <string.h>

#include "builder.h"
#include "sema.h"
#include "sema_args.h"

static const SemaBuiltin lora_call = {"lora", "targets, r=8, alpha=8, dropout=0", NULL, 1, 4,
                                      {"targets", "r", "alpha", "dropout"}};

/* The module a weight belongs to: "model.layers.0.self_attn.q_proj.weight" -> its first len
 * bytes, "model.layers.0.self_attn.q_proj". 0 when the name does not end in ".weight". */
static size_t module_len(const char *name) {
    size_t n = strlen(name);
    return n > 7 && strcmp(name + n - 7, ".weight") == 0 ? n - 7 : 0;
}

/* PEFT's rule for a list of target_modules: a module is targeted when its name is the target or
 * ends with '.' and the target. */
static int targets_module(const char *target, const char *module, size_t len) {
    size_t t = strlen(target);
    if (t > len || strncmp(module + len - t, target, t) != 0) return 0;
    return t == len || module[len - t - 1] == '.';
}

/* The last segment of every dense layer's name, nearest to `target`, as a hint. */
static void suggest_dense(Sema *S, const char *target) {
    Suggest sg;
    suggest_init(&sg, target);
    for (int p = 0; p < S->g->n_params; p++) {
        const IrParam *w = &S->g->params[p];
        size_t len = module_len(w->name);
        if (!w->dense || !len) continue;
        const char *name = arena_printf(S->arena, "%.*s", (int)len, w->name), *dot = strrchr(name, '.');
        suggest_try(&sg, dot ? dot + 1 : name);
    }
    sema_suggest_hint(&sg);
}

/* Mark the dense weights `target` names; an error when it names none, or names a module that is
 * not a dense layer (an embedding, a norm: PEFT's other adapters, which netc does not have). */
static int match_target(Sema *S, const char *target, SrcLoc loc, int complete) {
    IrLora *L = &S->g->lora;
    int hits = 0;
    for (int p = 0; p < S->g->n_params; p++) {
        const IrParam *w = &S->g->params[p];
        size_t len = module_len(w->name);
        if (!len || w->buffer || !targets_module(target, w->name, len)) continue;
        if (!w->dense) {
            diag_error(loc, "lora: '%.*s' is not a dense layer; LoRA adapts dense layers only", (int)len, w->name);
            return 0;
        }
        int dup = 0;
        for (int k = 0; k < L->n_adapters; k++) dup |= L->adapters[k].base == p;
        if (!dup) L->adapters[L->n_adapters++] = (IrAdapter){.base = p, .a = -1, .b = -1};
        hits++;
    }
    if (!hits && complete) {
        diag_error(loc, "lora: no dense layer is named '%s' or ends in '.%s'", target, target);
        suggest_dense(S, target);
    }
    return hits > 0;
}

void sema_train_lora(Sema *S, const AstStmt *s) {
    IrGraph *g = S->g;
    const AstExpr *e = s->value;
    Value a[SEMA_MAX_ARGS];
    if (e->kind != AST_CALL || strcmp(e->name, "lora") != 0) {
        diag_error(e->loc, "expected lora(targets, r=8, alpha=8, dropout=0)");
        diag_hint("e.g. lora = lora([\"q_proj\", \"v_proj\"], r = 8, alpha = 16, dropout = 0.05)");
        return;
    }
    if (!sema_bind_args(S, S->global, e, lora_call.params, lora_call.n_params, a)) return;
    Args A_ = {S, e, &lora_call, a, 1, NULL}, *A = &A_;
    double r = arg_num(A, 1, 8, 1, 1 << 16), alpha = arg_num(A, 2, 8, 1e-12, 1e12);
    double dropout = arg_num_in(A, 3, 0, 0, 1, 1);
    if (A->ok && a[1].k == V_FLOAT) {
        diag_error(arg_loc(e, "r", 1), "'r' of lora must be an integer, found %s", sema_value_text(S, a[1]));
        return;
    }
    Value t = a[0];
    if (t.k == V_STR) t = (Value){.k = V_LIST, .items = &a[0], .n = 1};
    if (t.k == V_NONE) {
        diag_error(e->loc, "'lora' needs the argument 'targets', the dense layers to adapt");
        diag_hint("lora(%s), e.g. lora([\"q_proj\", \"v_proj\"], r = 8)", lora_call.signature);
        return;
    }
    if (t.k != V_LIST || t.n == 0) {
        if (t.k != V_ERR)
            diag_error(arg_loc(e, "targets", 0), "'targets' of lora must be a list of layer names, e.g. "
                       "[\"q_proj\", \"v_proj\"], found %s", t.k == V_LIST ? "an empty list" : sema_value_text(S, t));
        return;
    }
    if (!A->ok) return;
    IrLora *L = &g->lora;
    *L = (IrLora){.r = (int)r, .alpha = alpha, .dropout = dropout, .loc = e->loc,
                  .targets = arena_alloc(S->arena, (size_t)t.n * sizeof *L->targets),
                  .adapters = arena_alloc(S->arena, (size_t)(g->n_params + 1) * sizeof *L->adapters)};
    int complete = S->errors_before_train == 0, ok = 1;
    for (int i = 0; i < t.n; i++) {
        if (t.items[i].k != V_STR || !*t.items[i].s) {
            diag_error(arg_loc(e, "targets", 0), "'targets' of lora must hold layer names, found %s",
                       sema_value_text(S, t.items[i]));
            ok = 0;
            continue;
        }
        L->targets[L->n_targets++] = t.items[i].s;
        ok &= match_target(S, t.items[i].s, arg_loc(e, "targets", 0), complete);
    }
    if (!ok) L->r = 0;
}

/* The adapter of dense weight L->adapters[k].base: its parameters and nodes beside the product
 * that reads the weight, whose readers then read the sum. */
static void add_adapter(Sema *S, IrBuilder *b, IrAdapter *ad) {
    IrGraph *g = S->g;
    const IrLora *L = &g->lora;
    IrNode *w = g->params[ad->base].node;
    const char *wname = g->params[ad->base].name;
    int n_uses;
    const IrUse *u = irb_uses(b, w, &n_uses);
    if (n_uses != 1 || u[0].user->op != OP_MATMUL || u[0].k != 1) {
        diag_error(L->loc, "lora: '%s' is read outside its dense layer (by weight(...)); an adapter there "
                   "would not reach the other reading", wname);
        return;
    }
    IrNode *m = u[0].user, *x = m->in[0];
    int64_t rows = x->shape.dim[0], in = x->shape.dim[1], out = m->shape.dim[1];
    size_t len = module_len(wname);
    IrNodeSpec spec = {.op = OP_PARAM, .dtype = DT_F32, .phase = m->phase, .loc = m->loc};
    spec.shape = ir_shape(2, (int64_t)L->r, in);
    IrNode *an = irb_node(b, &spec);
    ad->a = g->n_params;
    ir_register_param(g, an, arena_printf(S->arena, "%.*s.lora_A.weight", (int)len, wname), INIT_UNIFORM,
                      1.0 / sqrt((double)in)); /* torch.nn.Linear's kaiming_uniform(a=sqrt(5)), as PEFT */
    spec.shape = ir_shape(2, out, (int64_t)L->r);
    IrNode *bn = irb_node(b, &spec);
    ad->b = g->n_params;
    ir_register_param(g, bn, arena_printf(S->arena, "%.*s.lora_B.weight", (int)len, wname), INIT_ZEROS, 0);
    IrNode *chain[8], *at = m;
    int n = 0;
    chain[n++] = an, chain[n++] = bn;
    IrNode *xd = x;
    if (L->dropout > 0) {
        IrAttrs da = {.groups = 1, .p = L->dropout, .seed_id = g->n_dropout++};
        xd = chain[n++] = irb_node(b, &(IrNodeSpec){OP_DROPOUT, 1, {x}, x->shape, DT_F32, LAYOUT_ROW_MAJOR, &da,
                                                    m->phase, m->loc});
    }
    IrAttrs tb = {.groups = 1, .trans_b = 1};
    IrNode *h = chain[n++] = irb_node(b, &(IrNodeSpec){OP_MATMUL, 2, {xd, an}, ir_shape(2, rows, (int64_t)L->r),
                                                       DT_F32, LAYOUT_ROW_MAJOR, &tb, m->phase, m->loc});
    IrNode *d = chain[n++] = irb_node(b, &(IrNodeSpec){OP_MATMUL, 2, {h, bn}, m->shape, DT_F32, LAYOUT_ROW_MAJOR,
                                                       &tb, m->phase, m->loc});
    IrAttrs sa = {.groups = 1, .scalar = L->alpha / L->r};
    IrNode *scale = chain[n++] = irb_node(b, &(IrNodeSpec){OP_CONST, 0, {0}, ir_scalar_shape(), DT_F32,
                                                           LAYOUT_ROW_MAJOR, &sa, m->phase, m->loc});
    IrNode *ds = chain[n++] = irb_node(b, &(IrNodeSpec){OP_MUL, 2, {d, scale}, m->shape, DT_F32, LAYOUT_ROW_MAJOR,
                                                        NULL, m->phase, m->loc});
    IrNode *y = chain[n++] = irb_node(b, &(IrNodeSpec){OP_ADD, 2, {m, ds}, m->shape, DT_F32, LAYOUT_ROW_MAJOR,
                                                       NULL, m->phase, m->loc});
    for (int i = 0; i < n; i++) irb_insert_after(b, at, chain[i]), at = chain[i];
    irb_replace_uses(b, m, y, NULL, NULL);
}

void sema_lora_apply(Sema *S) {
    IrGraph *g = S->g;
    IrLora *L = &g->lora;
    if (!L->r) return;
    for (int p = 0; p < g->n_params; p++) g->params[p].trainable = 0; /* only the adapters train */
    if (g->n_params + 2 * L->n_adapters > SEMA_MAX_PARAMS) {
        diag_error(L->loc, "lora: %d adapters make more than %d parameter tensors", L->n_adapters, SEMA_MAX_PARAMS);
        return;
    }
    IrBuilder *b = irb_begin(g);
    for (int k = 0; k < L->n_adapters; k++) add_adapter(S, b, &L->adapters[k]);
    irb_finish(b);
}
