/* memplan.c - the static memory plan: where every value of the training step lives.
 *
 * Requires: a differentiated graph (autodiff has run), nodes in schedule order.
 * Guarantees: every node has a storage class and offset:
 *   - parameters in one flat f32 buffer, trainable ones first in declaration order, so that
 *     grads[i] belongs to params[i] and the optimizer is one loop over [0, n_grad_floats);
 *   - a trainable parameter's gradient node is written straight into the gradient buffer when it
 *     can be (not a view, a source, or the gradient of another parameter); otherwise the backend
 *     copies it there at the end of the backward pass;
 *   - inputs in the runtime's batch buffers, scalar constants inline, views alias their operand;
 *   - everything else at a 64-byte aligned offset in one arena, from liveness over the schedule
 *     (greedy best fit, largest first), so values whose lifetimes do not overlap share bytes.
 *   The evaluation step runs a prefix of the schedule with the same offsets; a prefix of a
 *   valid plan is valid.
 * Invalidates: nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "netrt.h"
#include "passes.h"

enum { ALIGN = 64 };

/* The node whose storage a view ultimately reads. */
static IrNode *root_of(IrNode *n) {
    while (n->storage == ST_ALIAS) n = n->in[0];
    return n;
}

static void place_params(IrGraph *g) {
    int64_t off = 0;
    for (int pass = 1; pass >= 0; pass--) /* trainable first, then frozen */
        for (int i = 0; i < g->n_params; i++) {
            IrParam *p = &g->params[i];
            if (p->trainable != pass) continue;
            p->offset = off;
            p->node->storage = ST_PARAM;
            p->node->offset = off;
            p->grad_offset = pass ? off : -1;
            off += ir_numel(&p->node->shape);
            if (pass) g->n_grad_floats = off;
        }
    g->n_param_floats = off;
}

/* A gradient node may live in the gradient buffer if it is computed by its own kernel. */
static int grad_in_place(IrGraph *g, IrParam *p) {
    IrNode *n = p->grad;
    if (!n || n->storage != ST_NONE) return 0;
    IrOpKind k = ir_op_kind(n->op);
    if (k == OPK_SOURCE || k == OPK_VIEW || n->phase != PHASE_BWD) return 0;
    for (int i = 0; i < g->n_params; i++)
        if (&g->params[i] != p && g->params[i].grad == n) return 0;
    return 1;
}

static void classify(IrGraph *g) {
    for (int i = 0; i < g->n_params; i++) {
        IrParam *p = &g->params[i];
        if (p->trainable && grad_in_place(g, p)) {
            p->grad->storage = ST_GRAD;
            p->grad->offset = p->grad_offset;
        }
    }
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        if (n->storage != ST_NONE) continue;
        switch (n->op) {
        case OP_INPUT: n->storage = ST_INPUT; break;
        case OP_CONST: n->storage = ST_INLINE; break;
        default: n->storage = ir_op_kind(n->op) == OPK_VIEW ? ST_ALIAS : ST_ARENA;
        }
    }
}

/* first_use = defining position; last_use = last position reading it (through views). */
static void liveness(IrGraph *g) {
    for (int i = 0; i < g->n; i++) g->nodes[i]->first_use = g->nodes[i]->last_use = i;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            IrNode *r = root_of(n->in[k]);
            if (r->last_use < i) r->last_use = i;
        }
    }
    /* the step reads the loss and accuracy at its end; the copies into the gradient buffer
     * also run at the end */
    if (g->loss) root_of(g->loss)->last_use = g->n;
    if (g->correct) root_of(g->correct)->last_use = g->n;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad) root_of(g->params[i].grad)->last_use = g->n;
}

static int64_t bytes_of(const IrNode *n) {
    int64_t b = ir_numel(&n->shape) * ir_dtype_size(n->dtype);
    return (b + ALIGN - 1) / ALIGN * ALIGN;
}

static int by_size_desc(const void *a, const void *b) {
    const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
    int64_t sx = bytes_of(x), sy = bytes_of(y);
    if (sx != sy) return sx < sy ? 1 : -1;
    return x->id - y->id;
}

static int overlaps(const IrNode *a, const IrNode *b) {
    return a->first_use <= b->last_use && b->first_use <= a->last_use;
}

/* Lowest offset where `n` fits beside every placed buffer whose lifetime overlaps its own. */
static int64_t best_offset(IrNode *n, IrNode **placed, int n_placed) {
    int64_t size = bytes_of(n), off = 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < n_placed; i++) {
            IrNode *p = placed[i];
            if (!overlaps(n, p)) continue;
            if (off < p->offset + bytes_of(p) && p->offset < off + size) {
                off = p->offset + bytes_of(p);
                moved = 1;
            }
        }
    }
    return off;
}

static void place_arena(IrGraph *g) {
    IrNode **todo = xmalloc((size_t)(g->n + 1) * sizeof *todo);
    int n = 0;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->storage == ST_ARENA) todo[n++] = g->nodes[i];
    qsort(todo, (size_t)n, sizeof *todo, by_size_desc);
    g->arena_bytes = g->unplanned_bytes = 0;
    for (int i = 0; i < n; i++) {
        todo[i]->offset = best_offset(todo[i], todo, i);
        int64_t end = todo[i]->offset + bytes_of(todo[i]);
        if (end > g->arena_bytes) g->arena_bytes = end;
        g->unplanned_bytes += bytes_of(todo[i]);
    }
    free(todo);
}

static void size_scratch(IrGraph *g) {
    g->scratch_per_thread = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        if (n->op != OP_CONV2D && n->op != OP_CONV2D_BWD_DATA && n->op != OP_CONV2D_BWD_FILTER)
            continue;
        const IrShape *x = n->op == OP_CONV2D_BWD_DATA ? &n->shape : &n->in[0]->shape;
        const IrShape *w = n->op == OP_CONV2D ? &n->in[1]->shape
                         : n->op == OP_CONV2D_BWD_DATA ? &n->in[1]->shape : &n->shape;
        const IrShape *y = n->op == OP_CONV2D ? &n->shape
                         : n->op == OP_CONV2D_BWD_DATA ? &n->in[0]->shape : &n->in[1]->shape;
        RtConv c = {.N = x->dim[0], .C = x->dim[1], .H = x->dim[2], .W = x->dim[3],
                    .K = w->dim[0], .R = w->dim[2], .S = w->dim[3], .P = y->dim[2],
                    .Q = y->dim[3], .groups = n->attr.groups};
        int64_t s = rt_conv2d_scratch(&c);
        if (s > g->scratch_per_thread) g->scratch_per_thread = s;
    }
}

void mp_plan(IrGraph *g) {
    ir_renumber(g);
    for (int i = 0; i < g->n; i++) g->nodes[i]->storage = ST_NONE;
    place_params(g);
    classify(g);
    liveness(g);
    place_arena(g);
    size_scratch(g);
}

static const char *storage_name(IrStorage s) {
    static const char *const names[] = {
        [ST_NONE] = "none",   [ST_ARENA] = "arena", [ST_INPUT] = "input", [ST_PARAM] = "param",
        [ST_GRAD] = "grad",   [ST_ALIAS] = "alias", [ST_INLINE] = "inline",
    };
    return names[s];
}

void mp_print(const IrGraph *g, FILE *out) {
    char shape[160];
    fprintf(out, "memory plan for model %s\n", g->model_name ? g->model_name : "?");
    fprintf(out, "%-6s %-18s %-22s %-7s %12s %12s  %s\n", "value", "op", "shape", "storage",
            "offset", "bytes", "lifetime");
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->storage == ST_INLINE) continue;
        fprintf(out, "%%%-5d %-18s %-22s %-7s %12lld %12lld  [%d, %d]\n", n->id, ir_op_name(n->op),
                ir_shape_str(&n->shape, shape, sizeof shape), storage_name(n->storage),
                (long long)(n->storage == ST_ALIAS ? root_of((IrNode *)n)->id : n->offset),
                (long long)(ir_numel(&n->shape) * ir_dtype_size(n->dtype)), n->first_use, n->last_use);
    }
    double saved = g->unplanned_bytes ? 100.0 * (1.0 - (double)g->arena_bytes / (double)g->unplanned_bytes) : 0;
    fprintf(out, "arena: %lld bytes (without reuse: %lld bytes, saving %.1f%%)\n",
            (long long)g->arena_bytes, (long long)g->unplanned_bytes, saved);
    fprintf(out, "parameters: %lld floats (%lld trainable), gradients: %lld floats\n",
            (long long)g->n_param_floats, (long long)g->n_grad_floats, (long long)g->n_grad_floats);
    fprintf(out, "kernel scratch: %lld floats per thread\n", (long long)g->scratch_per_thread);
}
