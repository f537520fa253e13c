/* unused.c - warnings for what a model computes, declares or trains and never uses: a value
 * that neither the loss, the metric nor the output reads (a typo that reads the layer before,
 * a branch left over), an input nothing reads (the trainer would still ask for its data), and
 * a layer whose parameters get no gradient because the loss does not depend on them (autodiff
 * gives them a zero gradient, so an optimizer with weight decay shrinks them at every step).
 *
 *     lenet.net:9:6: warning: this value is never used: the loss, the metric and the output do not
 *     read it, so it is not computed
 *     h2 = relu(fc2: dense(h1, 84))
 *          ^
 *
 * Warnings change nothing in what is compiled. One warning of a kind per source line (a loop or
 * a block repeats its lines), in line order, at most MAX_WARNINGS; `netc -w` turns them off.
 *
 * drop_unused then takes out of the graph the values nothing needs, so that neither the step
 * nor the evaluation computes them and the memory plan gives them no room: what the loss, the
 * metric and the output do not read, directly or through others, except a batch norm's
 * training statistics, which move its running statistics (a side effect PyTorch's forward pass
 * has too), and what those read. Inputs, parameters and constants stay: the trainer's inputs
 * and weight files are the model's as written. */
#include <stdlib.h>
#include <string.h>

#include "builder.h"
#include "diag.h"
#include "passes.h"
#include "util.h"

enum { MAX_WARNINGS = 20 };

typedef enum { W_VALUE, W_INPUT, W_PARAMS } WarnKind; /* on one line, in this order */

typedef struct Found {
    SrcLoc loc;
    WarnKind kind;
    int index; /* W_INPUT: the input's number; W_PARAMS: the parameter's */
} Found;

/* Marks in `live` every forward value the roots read, directly or through others. */
static void reach(const IrGraph *g, IrNode *const *roots, int n_roots, unsigned char *live) {
    for (int r = 0; r < n_roots; r++)
        if (roots[r]) live[roots[r]->id] = 1;
    for (int i = g->n_fwd - 1; i >= 0; i--) {
        const IrNode *x = g->nodes[i];
        if (!live[i]) continue;
        for (int k = 0; k < x->n_in; k++) live[x->in[k]->id] = 1;
    }
}

static int by_line(const void *pa, const void *pb) {
    const Found *a = pa, *b = pb;
    if (a->loc.line != b->loc.line) return a->loc.line < b->loc.line ? -1 : 1;
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    return a->loc.col < b->loc.col ? -1 : a->loc.col > b->loc.col;
}

static void warn(const IrGraph *g, const Found *f) {
    if (f->kind == W_VALUE) {
        diag_warning(f->loc, "this value is never used: the loss, the metric and the output do not read it, "
                             "so it is not computed");
        return;
    }
    if (f->kind == W_INPUT) {
        const char *name = g->inputs[f->index].name;
        diag_warning(f->loc, "input '%s' is never read: the loss, the metric and the output do not depend on it", name);
        diag_hint("the trainer still needs its data (--data %s=FILE); remove the line if the model does not need it",
                  name);
        return;
    }
    const char *name = g->params[f->index].name, *dot = strrchr(name, '.');
    int len = dot ? (int)(dot - name) : (int)strlen(name);
    if (dot)
        diag_warning(f->loc, "layer '%.*s' gets no gradient: the loss does not depend on its parameters", len, name);
    else
        diag_warning(f->loc, "parameter '%s' gets no gradient: the loss does not depend on it", name);
    diag_hint("freeze it (train { freeze = [\"%.*s\"] }) to keep it as it is: otherwise an optimizer with weight decay "
              "shrinks it at every step",
              len, name);
}

void warn_unused(const IrGraph *g) {
    for (int i = 0; i < g->n_fwd; i++)
        if (g->nodes[i]->id != i) ICE("warn_unused: the graph is not numbered");
    unsigned char *live = xcalloc((size_t)g->n_fwd + 1, 1), *to_loss = xcalloc((size_t)g->n_fwd + 1, 1);
    int *readers = xcalloc((size_t)g->n_fwd + 1, sizeof *readers);
    IrNode *roots[] = {g->loss, g->correct, g->output};
    reach(g, roots, 3, live);
    reach(g, roots, 1, to_loss);
    for (int i = 0; i < g->n_fwd; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) readers[g->nodes[i]->in[k]->id]++;
    Found *found = xcalloc((size_t)g->n_fwd + 1, sizeof *found);
    int n = 0;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op == OP_INPUT && !live[i])
            found[n++] = (Found){g->inputs[x->index].loc, W_INPUT, x->index};
        else if (x->op == OP_PARAM && g->params[x->index].trainable && !g->params[x->index].buffer && !to_loss[i])
            found[n++] = (Found){x->loc, W_PARAMS, x->index};
        else if (ir_op_kind(x->op) != OPK_SOURCE && !live[i] && !readers[i] && x->loc.file)
            found[n++] = (Found){x->loc, W_VALUE, i};
    }
    qsort(found, (size_t)n, sizeof *found, by_line);
    int shown = 0;
    for (int i = 0; i < n; i++) {
        /* a kind once per line (loops and blocks repeat their lines): sorted, its repeats follow it */
        if (i && found[i - 1].loc.line == found[i].loc.line && found[i - 1].kind == found[i].kind) continue;
        if (shown++ == MAX_WARNINGS) {
            fprintf(stderr, "netc: more warnings, not shown\n");
            break;
        }
        warn(g, &found[i]);
    }
    free(found), free(live), free(to_loss), free(readers);
}

int drop_unused(IrGraph *g) {
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->id != i) ICE("drop_unused: the graph is not numbered");
    if (g->n != g->n_fwd) ICE("drop_unused: run on the forward graph, before autodiff");
    int n_roots = 0;
    IrNode **roots = xcalloc((size_t)g->n + 3, sizeof *roots);
    roots[n_roots++] = g->loss, roots[n_roots++] = g->correct, roots[n_roots++] = g->output;
    for (int i = 0; i < g->n; i++) /* the running statistics move, whoever reads the batch's */
        if (g->nodes[i]->op == OP_BN_STATS && !g->nodes[i]->attr.bn_frozen) roots[n_roots++] = g->nodes[i];
    unsigned char *live = xcalloc((size_t)g->n + 1, 1);
    reach(g, roots, n_roots, live);
    IrBuilder *b = irb_begin(g);
    int dropped = 0;
    for (int i = g->n - 1; i >= 0; i--) /* readers first: a dead value's readers are dead too */
        if (!live[i] && ir_op_kind(g->nodes[i]->op) != OPK_SOURCE) irb_remove(b, g->nodes[i]), dropped++;
    irb_finish(b);
    free(roots), free(live);
    return dropped;
}
