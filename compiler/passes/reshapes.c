/* reshapes.c - element-wise operators on the shape their operands were computed in.
 *
 * Requires:    a differentiated graph in schedule order, every value row-major (before layout
 *              selection).
 * Guarantees:  an element-wise node whose operands are reshapes of values of one shape S'
 *              (and scalars, or vectors along the last axis, of no more axes than S') is
 *              computed in S' and reshaped after, when S' only merges S's leading axes;
 *              reshapes left unread are removed.
 *              Each element gets the same operation on the same values: the same bits.
 * Invalidates: node ids (renumbered).
 *
 * A dense layer on [B, T, C] is a product of [B*T, C] rows, its bias added to those rows, and a
 * reshape back to [B, T, N]: the activation after it, and in the backward pass the activation's
 * gradient after the data gradient's product, read reshapes. Fusion takes runs of consecutive
 * element-wise nodes of one shape, so GELU in GPT-2's MLP made a loop of its own, one pass over
 * [B*T, 4C] more, and the product's epilogue stopped at the bias. Computed on the product's
 * shape instead, GELU joins the bias in the epilogue (GEMM + bias + GELU, and dX with the GELU
 * gradient), and the reshape, a view, moves after it.
 */
#include "passes.h"

/* Operators whose element i depends on nothing but element i of each operand and i's row-major
 * position (dropout's mask): not iota (an axis's index), expand (its shape), batch norm's (the
 * channel axis) or layout conversions. */
static int flat(const IrNode *n) {
    switch (n->op) {
    case OP_IOTA: case OP_EXPAND: case OP_LAYOUT: case OP_BN_APPLY: case OP_BN_BWD_DATA: return 0;
    default: return ir_op_kind(n->op) == OPK_EW && ir_numel(&n->shape) > 1;
    }
}

/* The shape n can be computed in: that of the values its reshape operands view, with fewer
 * axes and the same last one; 0 when there is none. */
static int source_shape(const IrNode *n, IrShape *from) {
    const IrShape *s = &n->shape;
    int found = 0;
    for (int k = 0; k < n->n_in; k++) {
        const IrNode *x = n->in[k];
        if (x->op == OP_RESHAPE && ir_shape_eq(&x->shape, s)) {
            const IrShape *v = &x->in[0]->shape;
            if (v->rank >= s->rank || v->dim[v->rank - 1] != s->dim[s->rank - 1]) return 0;
            if (found && !ir_shape_eq(v, from)) return 0;
            *from = *v, found = 1;
        } else if (ir_numel(&x->shape) != 1 && !(x->shape.rank == 1 && x->shape.dim[0] == s->dim[s->rank - 1])) {
            return 0; /* broadcast differently in the other shape, or computed in this one */
        }
    }
    for (int k = 0; found && k < n->n_in; k++) /* a [1, 1, 1] beside [30, 2] would add an axis */
        if (n->in[k]->op != OP_RESHAPE && n->in[k]->shape.rank > from->rank) return 0;
    return found;
}

int ew_through_reshapes(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    int moved = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        IrShape from;
        if (!flat(n) || !ir_layout_eq(n->layout, LAYOUT_ROW_MAJOR) || !source_shape(n, &from)) continue;
        IrNodeSpec spec = {.op = n->op, .n_in = n->n_in, .shape = from, .dtype = n->dtype, .layout = n->layout,
                           .attr = &n->attr, .phase = n->phase, .loc = n->loc};
        for (int k = 0; k < n->n_in; k++) spec.in[k] = n->in[k]->op == OP_RESHAPE ? n->in[k]->in[0] : n->in[k];
        IrNode *m = irb_node(b, &spec);
        irb_insert_before(b, n, m);
        IrNodeSpec view = {.op = OP_RESHAPE, .n_in = 1, .in = {m}, .shape = n->shape, .dtype = n->dtype,
                           .layout = n->layout, .phase = n->phase, .loc = n->loc};
        IrNode *r = irb_node(b, &view);
        irb_insert_after(b, m, r);
        irb_replace_uses(b, n, r, NULL, NULL);
        if (g->output == n) g->output = r;
        irb_remove(b, n);
        for (int k = 0; k < n->n_in; k++) /* the reshapes it read, if nothing else does */
            if (n->in[k]->op == OP_RESHAPE) irb_remove_unread(b, n->in[k]);
        moved++;
    }
    irb_finish(b);
    return moved;
}
