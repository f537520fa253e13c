/* remat.c - activations computed again in the backward pass instead of kept for it.
 *
 * Requires:    a differentiated graph; no layouts, fusion or memory plan yet.
 * Guarantees:  a forward SILU, GELU or GELU_TANH value v = f(x) that the backward pass reads
 *              only in element-wise nodes, and whose input x the backward pass reads anyway
 *              (their gradients do), is computed again right before its first backward reader,
 *              and the backward pass reads that copy. v then dies with its last forward reader
 *              instead of living through the forward pass's tail and the backward pass to its
 *              layer, and the copy, an element-wise node among element-wise readers, fuses into
 *              their loop: one activation-sized buffer fewer per layer (SwiGLU's silu(gate) in
 *              a Llama: a third of its MLP's saved activations), for one more evaluation of f
 *              per element in a loop that reads x already. The copy applies the same function
 *              to the same stored float, so every value keeps its bits.
 * Invalidates: node ids (renumbered).
 *
 * A value a product reads in the backward pass (GPT-2's GELU output, its c_proj's input) stays
 * kept: computing it again would take a buffer of its own there and one more pass over it.
 */
#include "builder.h"
#include "passes.h"

static int recomputable(IrOp op) {
    return op == OP_SILU || op == OP_GELU || op == OP_GELU_TANH;
}

static int in_backward(const IrNode *user, const void *ctx) {
    (void)ctx;
    return user && user->phase == PHASE_BWD;
}

/* The first backward reader of v when every backward reader is element-wise, else NULL. */
static IrNode *first_backward_reader(const IrBuilder *b, const IrNode *v) {
    int n;
    const IrUse *u = irb_uses(b, v, &n);
    IrNode *first = NULL;
    for (int k = 0; k < n; k++) {
        if (u[k].user->phase != PHASE_BWD) continue;
        if (ir_op_kind(u[k].user->op) != OPK_EW) return NULL;
        if (!first) first = u[k].user;
    }
    return first;
}

static int read_in_backward(const IrBuilder *b, const IrNode *x) {
    int n;
    const IrUse *u = irb_uses(b, x, &n);
    for (int k = 0; k < n; k++)
        if (u[k].user->phase == PHASE_BWD) return 1;
    return 0;
}

int remat_activations(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    for (int i = 0; i < g->n_fwd; i++) {
        IrNode *v = g->nodes[i], *first;
        if (!recomputable(v->op) || irb_is_result(b, v) || !read_in_backward(b, v->in[0])) continue;
        if (!(first = first_backward_reader(b, v))) continue;
        IrNode *again = irb_node(b, &(IrNodeSpec){.op = v->op, .n_in = 1, .in = {v->in[0]}, .shape = v->shape,
                                                   .dtype = v->dtype, .layout = v->layout, .attr = &v->attr,
                                                   .phase = PHASE_BWD, .loc = v->loc});
        irb_insert_before(b, first, again);
        irb_replace_uses(b, v, again, in_backward, NULL);
    }
    return irb_finish(b);
}
