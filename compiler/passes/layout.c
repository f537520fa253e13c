/* layout.c - physical layout selection: channels-last (NHWC) through convolution chains.
 *
 * Requires:    a differentiated graph in schedule order; no fusion or memory plan yet.
 * Guarantees:  every operand is stored in a layout its operator reads (ir_operand_layout), so
 *              ir_verify's layout checks hold; inputs, parameters, gradients, views and every
 *              tensor below rank 4 stay row-major; shapes stay logical (NCHW), so the program
 *              computes the same values and weight files are unchanged. A conversion (OP_LAYOUT,
 *              element-wise) appears only where a value's producer and a reader that cannot
 *              stride through it disagree, or after a channels-last filter gradient that is a
 *              parameter's gradient (krsc_filters, below), never between two channels-last
 *              operators.
 * Invalidates: node ids (renumbered), n_fwd grows by the forward conversions.
 *
 * The choice, in three sweeps:
 *   1. forward: convolutions (forward and data gradient) produce NHWC; an element-wise
 *      operator or a pooling whose rank-4 operand is NHWC produces NHWC too, so the layout
 *      flows through bias, batch norm, residual adds, activations, pooling and their
 *      gradients;
 *   2. backward: a row-major element-wise operator or pooling whose every reader wants NHWC
 *      becomes NHWC (the element-wise loop reads its operands in any layout, so `image / 255`
 *      before the first convolution does the transposition for free);
 *   3. conversions where a reader still needs another layout: an input fed straight to a
 *      convolution, a channels-last value flattened for a dense layer.
 * Only f32 values with more than one channel and more than one pixel are affected: for the
 * others both layouts are the same bytes. A convolution oneDNN cannot run channels-last
 * (ir_conv_nhwc_ok) stays row-major, with conversions around it.
 *
 * Filters. With `krsc_filters` (the CUDA backend: cuDNN's channels-last convolutions want the
 * filter channels-last too), a channels-last convolution also reads its filter [K,C/groups,R,S]
 * channels-last - KRSC, PyTorch's channels_last weight - (attr.filter), and a channels-last
 * filter gradient is produced KRSC (its layout). Parameters and their gradients stay row-major
 * (KCRS), so the ordinary conversions do the permutation: sweep 3 converts a weight once, before
 * the forward convolution, and the data-gradient convolution reads the same copy; a filter
 * gradient is converted back right after it (a gradient read elsewhere, a sum of several
 * filter gradients, reads it by strides instead). Without it (the CPU backend: oneDNN takes the
 * filter as it is) filters stay row-major.
 */
#include <string.h>

#include "passes.h"

static int sensitive(const IrNode *n) { return n->dtype == DT_F32 && ir_layout_matters(&n->shape); }

/* Pooling: an operator that computes in its operands' layout (ops.def), so a layout flows
 * through it as through an element-wise one. */
static int is_pool(IrOp op) { return ir_op_follows_layout(op); }

/* The layout decides how n is computed: a pooling reads or writes a full plane even when its
 * other side is one pixel (global average pooling). */
static int matters(const IrNode *n) {
    return sensitive(n) || (is_pool(n->op) && sensitive(n->in[0]));
}

static int nhwc(const IrNode *n) { return n->layout == LAYOUT_NHWC && sensitive(n); }

/* Readers of each node, from one scan. */
typedef struct Users {
    int *start; /* readers of node i: reader[start[i] .. start[i + 1]) */
    IrNode **reader;
} Users;

static Users find_users(const IrGraph *g) {
    Users u;
    u.start = arena_alloc(g->arena, ((size_t)g->n + 2) * sizeof *u.start);
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) u.start[g->nodes[i]->in[k]->id + 2]++;
    for (int i = 0; i < g->n; i++) u.start[i + 2] += u.start[i + 1];
    u.reader = arena_alloc(g->arena, ((size_t)u.start[g->n + 1] + 1) * sizeof *u.reader);
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) u.reader[u.start[g->nodes[i]->in[k]->id + 1]++] = g->nodes[i];
    return u;
}

/* Every reader of n would rather have it channels-last. */
static int readers_want_nhwc(const Users *u, const IrNode *n) {
    if (u->start[n->id] == u->start[n->id + 1]) return 0;
    for (int r = u->start[n->id]; r < u->start[n->id + 1]; r++) {
        const IrNode *user = u->reader[r];
        for (int k = 0; k < user->n_in; k++) {
            if (user->in[k] != n) continue;
            int want = ir_operand_layout(user, k);
            int ew_nhwc = ir_op_kind(user->op) == OPK_EW && nhwc(user) && ir_shape_eq(&user->shape, &n->shape);
            if (want != LAYOUT_NHWC && !ew_nhwc) return 0;
        }
    }
    return 1;
}

/* Sweeps 1 and 2: set the layout of every node (and of every convolution's filter). */
static void choose(IrGraph *g, int krsc_filters) {
    unsigned char *is_grad = arena_alloc(g->arena, (size_t)g->n + 1);
    for (int i = 0; i < g->n_params; i++)
        for (IrNode *n = g->params[i].grad; n; n = ir_op_kind(n->op) == OPK_VIEW ? n->in[0] : NULL) is_grad[n->id] = 1;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        n->layout = LAYOUT_ROW_MAJOR;
        n->attr.filter = LAYOUT_ROW_MAJOR;
        if (!matters(n) || is_grad[n->id]) continue;
        if (n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA) {
            if (ir_conv_nhwc_ok(n)) n->layout = LAYOUT_NHWC;
            if (ir_conv_nhwc_ok(n) && krsc_filters) n->attr.filter = LAYOUT_NHWC;
        } else if (ir_op_kind(n->op) == OPK_EW) {
            for (int k = 0; k < n->n_in; k++)
                if (nhwc(n->in[k]) && ir_shape_eq(&n->in[k]->shape, &n->shape)) n->layout = LAYOUT_NHWC;
        } else if (is_pool(n->op) && nhwc(n->in[0])) {
            n->layout = LAYOUT_NHWC;
        }
    }
    Users u = find_users(g);
    for (int i = g->n - 1; i >= 0; i--) {
        IrNode *n = g->nodes[i];
        if (n->layout == LAYOUT_NHWC || !matters(n) || is_grad[n->id]) continue;
        if (ir_op_kind(n->op) != OPK_EW && !is_pool(n->op)) continue;
        if (!readers_want_nhwc(&u, n)) continue;
        if (is_pool(n->op)) { /* only when that moves no conversion onto its own operands */
            int ok = 1;
            for (int k = 0; k < n->n_in; k++) ok &= ir_stored_as(n->in[k], LAYOUT_NHWC);
            if (!ok) continue;
        }
        n->layout = LAYOUT_NHWC;
    }
    /* last, when the layouts of x and dy are final: a filter gradient beside channels-last
     * activations is produced KRSC, gradient or not (convert() turns a gradient back) */
    for (int i = 0; i < g->n && krsc_filters; i++) {
        IrNode *n = g->nodes[i];
        if (n->op == OP_CONV2D_BWD_FILTER && sensitive(n) && ir_operand_layout(n, 0) == LAYOUT_NHWC)
            n->layout = LAYOUT_NHWC;
    }
}

typedef struct NodeList {
    IrNode **at;
    int n, cap;
} NodeList;

static void push(IrGraph *g, NodeList *l, IrNode *n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : g->n + 16;
        IrNode **grown = arena_alloc(g->arena, (size_t)l->cap * sizeof *grown);
        if (l->n) memcpy(grown, l->at, (size_t)l->n * sizeof *grown);
        l->at = grown;
    }
    l->at[l->n++] = n;
}

/* x stored in `layout`, computed at `at`'s place in the schedule. */
static IrNode *conversion(IrGraph *g, IrNode *x, IrLayout layout, const IrNode *at) {
    return ir_unary_at(g, OP_LAYOUT, x, x->dtype, layout, at);
}

/* Sweep 3: a conversion before the first reader that needs one; later readers share it. A
 * parameter's gradient that is not row-major (a KRSC filter gradient) is converted right after
 * it is computed, and the conversion becomes the gradient. */
static int convert(IrGraph *g) {
    IrNode **conv = arena_alloc(g->arena, ((size_t)g->n + 1) * 2 * sizeof *conv); /* [value][layout] */
    unsigned char *is_grad = arena_alloc(g->arena, (size_t)g->n + 1);
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad) is_grad[g->params[i].grad->id] = 1;
    NodeList list = {0};
    int n_fwd = g->n_fwd, added = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            IrNode *x = n->in[k];
            int want = ir_operand_layout(n, k);
            if (want < 0 || ir_stored_as(x, (IrLayout)want)) continue;
            IrNode **slot = &conv[x->id * 2 + want];
            if (!*slot) {
                push(g, &list, *slot = conversion(g, x, (IrLayout)want, n));
                added++;
                if (i < g->n_fwd) n_fwd++;
            }
            n->in[k] = *slot;
        }
        push(g, &list, n);
        if (is_grad[n->id] && !ir_stored_as(n, LAYOUT_ROW_MAJOR) && !conv[n->id * 2 + LAYOUT_ROW_MAJOR]) {
            push(g, &list, conv[n->id * 2 + LAYOUT_ROW_MAJOR] = conversion(g, n, LAYOUT_ROW_MAJOR, n));
            added++;
            if (i < g->n_fwd) n_fwd++;
        }
    }
    for (int i = 0; i < g->n_params; i++) {
        IrParam *p = &g->params[i];
        if (p->grad && !ir_stored_as(p->grad, LAYOUT_ROW_MAJOR)) p->grad = conv[p->grad->id * 2 + LAYOUT_ROW_MAJOR];
    }
    if (added) {
        g->nodes = list.at;
        g->n = list.n;
        g->cap = list.cap;
        g->n_fwd = n_fwd;
    }
    ir_renumber(g);
    return added;
}

int layout_select(IrGraph *g, int channels_last, int krsc_filters) {
    ir_renumber(g);
    if (!channels_last) {
        for (int i = 0; i < g->n; i++) g->nodes[i]->layout = g->nodes[i]->attr.filter = LAYOUT_ROW_MAJOR;
        return 0;
    }
    choose(g, krsc_filters);
    return convert(g);
}
