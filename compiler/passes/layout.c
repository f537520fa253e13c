/* layout.c - physical layout selection: channels-last (NHWC) through convolution chains, and
 * permutes and reshapes as views of their operand's storage in another order of its axes.
 *
 * Requires:    a differentiated graph in schedule order; no fusion or memory plan yet.
 * Guarantees:  every operand is stored in a layout its operator reads (ir_operand_layout), so
 *              ir_verify's layout checks hold; inputs, parameters, gradients and every other
 *              tensor below rank 4 that is not a view (permute_view, reshape) stay row-major;
 *              shapes stay logical (NCHW), so the program computes the same values and weight
 *              files are unchanged. A conversion (OP_LAYOUT, element-wise) appears only where a
 *              value's producer and a reader that cannot stride through it disagree, or after a
 *              channels-last filter gradient that is a parameter's gradient (krsc_filters,
 *              below), never between two channels-last operators.
 * Invalidates: node ids (renumbered), n_fwd grows by the forward conversions and shrinks by the
 *              permutes merged away.
 *
 * With `views`, sweep 0 first merges chains of permutes, and sweep 1 gives each permute the
 * layout it would have as a view (ir_layout_permuted) and each reshape the layout its operand's
 * bytes have under its shape (ir_layout_reshaped, where they allow one), so that their readers
 * follow; sweep 2b, after sweep 2, makes a permute an OP_PERMUTE_VIEW where every reader reads
 * that layout as it lies, and a row-major copy elsewhere; sweep 3 gives every view the layout its
 * operand's final one gives (a reshape that cannot have one reads a row-major conversion).
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

static int nhwc(const IrNode *n) { return ir_layout_eq(n->layout, LAYOUT_NHWC) && sensitive(n); }

/* Every reader of n would rather have it channels-last. */
static int readers_want_nhwc(const IrBuilder *b, const IrNode *n) {
    int n_uses;
    const IrUse *use = irb_uses(b, n, &n_uses);
    for (int i = 0; i < n_uses; i++) {
        const IrNode *user = use[i].user;
        int ew_nhwc = ir_op_kind(user->op) == OPK_EW && nhwc(user) && ir_shape_eq(&user->shape, &n->shape);
        if (!ir_operand_nhwc(user, use[i].k) && !ew_nhwc) return 0;
    }
    return n_uses > 0;
}

/* Sweeps 1 and 2: set the layout of every node (and of every convolution's filter). With
 * `escapes` (when permutes may become views), a permute that is not one of the step's results
 * is given the layout it would have as a view, for its readers to follow; sweep 2b decides. */
static void choose(IrGraph *g, const IrBuilder *b, int krsc_filters, const unsigned char *escapes) {
    unsigned char *is_grad = arena_alloc(g->arena, (size_t)g->n + 1);
    for (int i = 0; i < g->n_params; i++)
        for (IrNode *n = g->params[i].grad; n; n = ir_op_kind(n->op) == OPK_VIEW ? n->in[0] : NULL) is_grad[n->id] = 1;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        n->layout = LAYOUT_ROW_MAJOR;
        n->attr.filter = LAYOUT_ROW_MAJOR;
        if (n->op == OP_PERMUTE && escapes && !escapes[n->id]) {
            n->layout = ir_layout_permuted(n->in[0]->layout, n->shape.rank, n->attr.perm);
            continue;
        }
        IrLayout view;
        if (n->op == OP_RESHAPE && escapes && !escapes[n->id] && ir_view_layout(n, &view)) {
            n->layout = view; /* read in place, in the order its operand's bytes lie */
            continue;
        }
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
    for (int i = g->n - 1; i >= 0; i--) {
        IrNode *n = g->nodes[i];
        if (ir_layout_eq(n->layout, LAYOUT_NHWC) || !matters(n) || is_grad[n->id]) continue;
        if (ir_op_kind(n->op) != OPK_EW && !is_pool(n->op)) continue;
        if (!readers_want_nhwc(b, n)) continue;
        if (is_pool(n->op)) { /* only when that moves no conversion onto its own operands */
            int ok = 1;
            for (int k = 0; k < n->n_in; k++) ok &= ir_stored_as(n->in[k], LAYOUT_NHWC);
            if (!ok) continue;
        }
        n->layout = LAYOUT_NHWC;
    }
}

/* Every reader of p reads it stored in `layout` as it is: an element-wise operator (it strides
 * through any layout), a reshape that can be read from it in place (not a step's result), or
 * one that wants a layout the same bytes already are. */
static int readers_read(const IrBuilder *b, const IrNode *p, IrLayout layout, const unsigned char *escapes) {
    IrNode as_view = *p;
    as_view.layout = layout;
    int n_uses;
    const IrUse *use = irb_uses(b, p, &n_uses);
    for (int i = 0; i < n_uses; i++) {
        const IrNode *user = use[i].user;
        IrLayout want;
        if (!user) return 0;
        if (user->op == OP_RESHAPE && !escapes[user->id]) {
            if (!ir_layout_reshaped(layout, &p->shape, &user->shape, &want)) return 0;
        } else if (ir_operand_layout(user, use[i].k, &want) ? !ir_stored_as(&as_view, want)
                                                             : ir_op_kind(user->op) != OPK_EW) {
            return 0;
        }
    }
    return n_uses > 0;
}

/* Sweep 0: a permute of a permute becomes one permute of the first one's operand (a permute
 * nothing else reads is dropped), and a permute that keeps every axis in place is its operand.
 * The step's results (escapes) stay where they are. */
static void merge_permutes(const IrGraph *g, IrBuilder *b, const unsigned char *escapes) {
    for (int i = 0; i < g->n; i++) {
        IrNode *p = g->nodes[i], *x = p->in[0];
        if (p->op != OP_PERMUTE) continue;
        if (x->op == OP_PERMUTE) {
            int perm[IR_MAX_RANK] = {0};
            for (int a = 0; a < p->shape.rank; a++) perm[a] = x->attr.perm[p->attr.perm[a]];
            memcpy(p->attr.perm, perm, sizeof perm);
            irb_set_operand(b, p, 0, x->in[0]);
            if (!escapes[x->id]) irb_remove_unread(b, x);
        }
        int identity = 1;
        for (int a = 0; a < p->shape.rank; a++) identity &= p->attr.perm[a] == a;
        if (identity && !escapes[p->id]) {
            irb_replace_uses(b, p, p->in[0], NULL, NULL);
            irb_remove(b, p);
        }
    }
}

/* Sweep 2b: a permute whose readers all read its operand's bytes in the permuted order (the
 * layout ir_layout_permuted gives, which sweep 1 gave it to try) becomes a view of them: a
 * channels-last activation permuted to [N, H, W, C] is row-major as it lies, and an [N, H, W, C]
 * input permuted to [N, C, H, W] is channels-last. The others are copies, row-major, and so is
 * a step's result. */
static void permute_views(IrGraph *g, const IrBuilder *b, const unsigned char *escapes) {
    for (int i = 0; i < g->n; i++) {
        IrNode *p = g->nodes[i];
        if (p->op != OP_PERMUTE || !irb_placed(b, p)) continue;
        IrLayout layout = ir_layout_permuted(p->in[0]->layout, p->shape.rank, p->attr.perm);
        if (!escapes[p->id] && readers_read(b, p, layout, escapes)) {
            p->op = OP_PERMUTE_VIEW;
            p->layout = layout;
        } else {
            p->layout = LAYOUT_ROW_MAJOR;
        }
    }
}

/* x stored in `layout`, computed at `at`'s place in the schedule. */
static IrNode *conversion(IrBuilder *b, IrNode *x, IrLayout layout, const IrNode *at) {
    return irb_unary(b, OP_LAYOUT, x, x->dtype, layout, at);
}

/* The graph's own references: a parameter's gradient becomes its conversion. */
static int graph_reference(const IrNode *user, const void *ctx) {
    (void)ctx;
    return user == NULL;
}

/* The conversions of one value made so far, one per layout. */
typedef struct Conversions {
    IrNode *node;
    struct Conversions *next;
} Conversions;

static IrNode **conversion_slot(IrGraph *g, Conversions **list, IrLayout layout) {
    for (Conversions *c = *list; c; c = c->next)
        if (ir_layout_eq(c->node->layout, layout)) return &c->node;
    Conversions *c = arena_alloc(g->arena, sizeof *c);
    *c = (Conversions){NULL, *list};
    *list = c;
    return &c->node;
}

/* Sweep 3: a conversion before the first reader that needs one; later readers share it. A
 * parameter's gradient that is not row-major (a KRSC filter gradient) is converted right after
 * it is computed, and the conversion becomes the gradient. A view's layout is then what its
 * operand's bytes give (ir_view_layout); a reshape reads row-major without `views`, or when it
 * is one of the step's results (escapes), as the runtime reads those. */
static void convert(IrGraph *g, IrBuilder *b, int krsc_filters, int views, const unsigned char *escapes) {
    Conversions **conv = arena_alloc(g->arena, ((size_t)g->n + 1) * sizeof *conv); /* by value */
    unsigned char *is_grad = arena_alloc(g->arena, (size_t)g->n + 1);
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad) is_grad[g->params[i].grad->id] = 1;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        if (!irb_placed(b, n)) continue; /* a permute sweep 0 merged away */
        int row_major = n->op == OP_RESHAPE && (!views || escapes[n->id]);
        /* a filter gradient whose activations are channels-last is produced KRSC, gradient or
         * not (turned back below), decided here, where its operands' layouts are final: under
         * --layout=row-major too, where a view's gradient read in place can be channels-last (a
         * patch embedding's tokens [N, h*w, D] as [N, D, h, w]) */
        if (krsc_filters && n->op == OP_CONV2D_BWD_FILTER && sensitive(n) && ir_operand_nhwc(n, 0))
            n->layout = LAYOUT_NHWC;
        for (int k = 0; k < n->n_in; k++) {
            IrNode *x = n->in[k];
            IrLayout want = LAYOUT_ROW_MAJOR;
            if (!(row_major || ir_operand_layout(n, k, &want)) || ir_stored_as(x, want)) continue;
            IrNode **slot = conversion_slot(g, &conv[x->id], want);
            if (!*slot) irb_insert_before(b, n, *slot = conversion(b, x, want, n));
            irb_set_operand(b, n, k, *slot);
        }
        if (n->op == OP_RESHAPE || n->op == OP_PERMUTE_VIEW)
            if (!ir_view_layout(n, &n->layout)) ICE("layout: %%%d %s cannot be read in place", n->id, ir_op_name(n->op));
        if (is_grad[n->id] && !ir_stored_as(n, LAYOUT_ROW_MAJOR)) {
            IrNode **slot = conversion_slot(g, &conv[n->id], LAYOUT_ROW_MAJOR);
            if (*slot) continue;
            IrNode *c = *slot = conversion(b, n, LAYOUT_ROW_MAJOR, n);
            irb_insert_after(b, n, c);
            irb_replace_uses(b, n, c, graph_reference, NULL);
        }
    }
}

int layout_select(IrGraph *g, int channels_last, int krsc_filters, int views) {
    ir_renumber(g);
    IrBuilder *b = irb_begin(g);
    unsigned char *escapes = arena_alloc(g->arena, (size_t)g->n + 1);
    mark_escaping(g, escapes);
    if (views) merge_permutes(g, b, escapes);
    if (channels_last) choose(g, b, krsc_filters, views ? escapes : NULL);
    else
        for (int i = 0; i < g->n; i++) g->nodes[i]->layout = g->nodes[i]->attr.filter = LAYOUT_ROW_MAJOR;
    if (views) permute_views(g, b, escapes);
    convert(g, b, krsc_filters, views, escapes);
    return irb_finish(b);
}
