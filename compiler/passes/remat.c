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
 *
 *              A forward DROPOUT value read in the backward pass is computed again right
 *              before its first backward reader, whatever that reader is, when its input x is
 *              kept for the backward pass anyway or another such dropout of the same x (through
 *              reshapes) is: LoRA's adapters on q, k and v each drop their own mask of the same
 *              normed input, and each keeps its dropped copy for its A's weight gradient, three
 *              activation-sized buffers a layer where the input is one. The mask is a
 *              counter-based hash of (step seed, mask id, element), so the copy drops the same
 *              elements of the same stored floats: every value keeps its bits.
 * Invalidates: node ids (renumbered).
 *
 * A SiLU or GELU value a product reads in the backward pass (GPT-2's GELU output, its c_proj's
 * input) stays kept: computing it again would take a buffer of its own there and one more pass
 * over it. A dropout is computed again even for a product, since the buffer the copy takes lives
 * from its first backward reader to its last only, where the kept value lived from the forward
 * pass on; a lone dropout of an input the backward pass does not read stays kept (keeping its
 * input instead would save nothing).
 */
#include "builder.h"
#include "passes.h"

#include <stdlib.h>

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

/* The first backward reader of v, of any kind, or NULL. */
static IrNode *first_backward_use(const IrBuilder *b, const IrNode *v) {
    int n;
    const IrUse *u = irb_uses(b, v, &n);
    for (int k = 0; k < n; k++)
        if (u[k].user->phase == PHASE_BWD) return u[k].user;
    return NULL;
}

static int read_in_backward(const IrBuilder *b, const IrNode *x) { return first_backward_use(b, x) != NULL; }

static const IrNode *unreshaped(const IrNode *x) {
    while (x->op == OP_RESHAPE) x = x->in[0];
    return x;
}

/* A forward dropout the backward pass reads (not a result): its value can be computed again there. */
static int kept_dropout(const IrBuilder *b, const IrNode *v) {
    return v->op == OP_DROPOUT && !irb_is_result(b, v) && read_in_backward(b, v);
}

/* Whether the backward pass reads x or a reshape of it. */
static int read_in_backward_viewed(const IrBuilder *b, const IrNode *x) {
    int n;
    const IrUse *u = irb_uses(b, x, &n);
    for (int k = 0; k < n; k++)
        if (u[k].user->phase == PHASE_BWD || (u[k].user->op == OP_RESHAPE && read_in_backward_viewed(b, u[k].user)))
            return 1;
    return 0;
}

/* Whether the input of kept_dropout d is worth keeping instead of d: the backward pass reads it
 * (or a reshape of it) already, or another kept dropout reads it too. Asked of the graph as it
 * came, before any copy makes the input read in the backward pass. */
static int input_kept_anyway(const IrBuilder *b, const IrGraph *g, const IrNode *d) {
    const IrNode *root = unreshaped(d->in[0]);
    if (read_in_backward_viewed(b, root)) return 1;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *v = g->nodes[i];
        if (v != d && kept_dropout(b, v) && unreshaped(v->in[0]) == root) return 1;
    }
    return 0;
}

/* v computed again right before first, its first backward reader, which with every later
 * backward reader reads the copy. */
static void compute_again(IrBuilder *b, IrNode *v, IrNode *first) {
    IrNode *again = irb_node(b, &(IrNodeSpec){.op = v->op, .n_in = 1, .in = {v->in[0]}, .shape = v->shape,
                                               .dtype = v->dtype, .layout = v->layout, .attr = &v->attr,
                                               .phase = PHASE_BWD, .loc = v->loc});
    irb_insert_before(b, first, again);
    irb_replace_uses(b, v, again, in_backward, NULL);
}

int remat_activations(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    char *dropped = xcalloc((size_t)g->n_fwd + 1, 1); /* the dropouts to compute again, chosen first */
    for (int i = 0; i < g->n_fwd; i++) dropped[i] = kept_dropout(b, g->nodes[i]) && input_kept_anyway(b, g, g->nodes[i]);
    for (int i = 0; i < g->n_fwd; i++) {
        IrNode *v = g->nodes[i], *first;
        if (dropped[i])
            compute_again(b, v, first_backward_use(b, v));
        else if (recomputable(v->op) && !irb_is_result(b, v) && read_in_backward(b, v->in[0]) &&
                 (first = first_backward_reader(b, v)))
            compute_again(b, v, first);
    }
    free(dropped);
    return irb_finish(b);
}
