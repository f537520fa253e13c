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
 *              per element in a loop that reads x already.
 *
 *              A forward DROPOUT value read in the backward pass is computed again right
 *              before its first backward reader, whatever that reader is, when its input is
 *              cheap to have there: the input, through reshapes and permutes, is a value the
 *              backward pass reads anyway (o_proj's adapter drops the attention's output, which
 *              the attention's gradient reads: the permute between them is computed again too),
 *              one another such dropout drops too (LoRA's adapters on q, k and v each drop their
 *              own mask of the same normed input), or a norm computed again below. Each kept
 *              dropped copy is an activation-sized buffer for its A's weight gradient.
 *
 *              Then a forward RMSNORM or LAYERNORM value the backward pass reads (itself or a
 *              reshape of it: the products' weight gradients, the dropouts' copies), whose input
 *              the backward pass reads anyway (the norm's own gradient does), is computed again
 *              right before its first backward reader: one pass over rows instead of a buffer
 *              kept from the forward pass to the layer's backward. The copy lives from its first
 *              backward reader to its last, within its layer.
 *
 *              Every copy is the same operator on the same stored floats (a dropout's mask is
 *              a counter-based hash of (step seed, mask id, element), a norm's rows are summed
 *              in the same order by the same kernel), so every value keeps its bits.
 * Invalidates: node ids (renumbered).
 *
 * A SiLU or GELU value a product reads in the backward pass (GPT-2's GELU output, its c_proj's
 * input) stays kept: computing it again would take a buffer of its own there and one more pass
 * over it. A dropout is computed again even for a product, since the buffer the copy takes lives
 * from its first backward reader to its last only, where the kept value lived from the forward
 * pass on; a lone dropout of an input the backward pass does not read and cannot compute again
 * cheaply stays kept (keeping its input instead would save nothing).
 */
#include "builder.h"
#include "passes.h"

#include <stdlib.h>

static int recomputable(IrOp op) {
    return op == OP_SILU || op == OP_GELU || op == OP_GELU_TANH;
}

static int is_norm(IrOp op) {
    return op == OP_RMSNORM || op == OP_LAYERNORM;
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

/* The value x is a chain of reshapes and permutes of. */
static const IrNode *source(const IrNode *x) {
    while (x->op == OP_RESHAPE || x->op == OP_PERMUTE) x = x->in[0];
    return x;
}

/* A forward dropout the backward pass reads (not a result): its value can be computed again there. */
static int kept_dropout(const IrBuilder *b, const IrNode *v) {
    return v->op == OP_DROPOUT && !irb_is_result(b, v) && read_in_backward(b, v);
}

/* The first backward reader of v or of a reshape of it, or NULL; "first" by id, which is the
 * schedule's position only for nodes that were there when the builder was opened (remat_norms
 * opens one of its own for that). */
static IrNode *first_backward_viewer(const IrBuilder *b, const IrNode *v) {
    int n;
    const IrUse *u = irb_uses(b, v, &n);
    IrNode *first = NULL;
    for (int k = 0; k < n; k++) {
        IrNode *r = u[k].user->phase == PHASE_BWD ? u[k].user
                    : u[k].user->op == OP_RESHAPE ? first_backward_viewer(b, u[k].user) : NULL;
        if (r && (!first || r->id < first->id)) first = r;
    }
    return first;
}

/* Whether the backward pass reads x or a reshape of it. */
static int read_in_backward_viewed(const IrBuilder *b, const IrNode *x) { return first_backward_viewer(b, x) != NULL; }

/* A forward norm whose input the backward pass reads anyway: its value, once the backward pass
 * reads it, is computed again there (remat_norms). */
static int norm_again(const IrBuilder *b, const IrNode *h) {
    return h->phase == PHASE_FWD && is_norm(h->op) && !irb_is_result(b, h) && read_in_backward(b, h->in[0]);
}

/* Whether the input of kept_dropout d is cheap to have in the backward pass: its source is read
 * there already (or a reshape of it is), another kept dropout reads it too, or it is a norm
 * computed again there. Asked of the graph as it came, before any copy makes the input read in
 * the backward pass. */
static int input_kept_anyway(const IrBuilder *b, const IrGraph *g, const IrNode *d) {
    const IrNode *root = source(d->in[0]);
    if (read_in_backward_viewed(b, root) || norm_again(b, root)) return 1;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *v = g->nodes[i];
        if (v != d && kept_dropout(b, v) && source(v->in[0]) == root) return 1;
    }
    return 0;
}

/* A backward copy of forward node v reading `in` (v's own operands for NULL), placed before at. */
static IrNode *copy_before(IrBuilder *b, const IrNode *v, IrNode *const *in, IrNode *at) {
    IrNodeSpec s = {.op = v->op, .n_in = v->n_in, .shape = v->shape, .dtype = v->dtype, .layout = v->layout,
                    .attr = &v->attr, .phase = PHASE_BWD, .loc = v->loc};
    for (int k = 0; k < v->n_in; k++) s.in[k] = in ? in[k] : v->in[k];
    IrNode *again = irb_node(b, &s);
    irb_insert_before(b, at, again);
    return again;
}

static int has_permute(const IrNode *x) {
    for (; x->op == OP_RESHAPE || x->op == OP_PERMUTE; x = x->in[0])
        if (x->op == OP_PERMUTE) return 1;
    return 0;
}

/* x for a backward reader placed at `at`: x itself when it is its source or reshapes of it (an
 * alias of a value kept anyway), else its chain of reshapes and permutes computed again there. */
static IrNode *operand_again(IrBuilder *b, IrNode *x, IrNode *at) {
    if (!has_permute(x)) return x;
    IrNode *in = operand_again(b, x->in[0], at);
    return copy_before(b, x, &in, at);
}

/* v computed again from x right before first, its first backward reader, which with every later
 * backward reader reads the copy. */
static void compute_again(IrBuilder *b, IrNode *v, IrNode *x, IrNode *first) {
    IrNode *again = copy_before(b, v, &x, first);
    irb_replace_uses(b, v, again, in_backward, NULL);
}

/* The backward readers of v, and of its forward reshapes, read again (v's copy) and copies of
 * those reshapes over it, placed before at. */
static void views_read_again(IrBuilder *b, IrNode *v, IrNode *again, IrNode *at) {
    irb_replace_uses(b, v, again, in_backward, NULL);
    int n;
    const IrUse *u = irb_uses(b, v, &n);
    IrNode **reshapes = xcalloc((size_t)n + 1, sizeof *reshapes);
    int m = 0;
    for (int k = 0; k < n; k++)
        if (u[k].user->op == OP_RESHAPE && read_in_backward_viewed(b, u[k].user)) reshapes[m++] = u[k].user;
    for (int k = 0; k < m; k++) views_read_again(b, reshapes[k], copy_before(b, reshapes[k], &again, at), at);
    free(reshapes);
}

static int remat_values(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    char *dropped = xcalloc((size_t)g->n_fwd + 1, 1); /* the dropouts to compute again, chosen first */
    for (int i = 0; i < g->n_fwd; i++) dropped[i] = kept_dropout(b, g->nodes[i]) && input_kept_anyway(b, g, g->nodes[i]);
    for (int i = 0; i < g->n_fwd; i++) {
        IrNode *v = g->nodes[i], *first;
        if (dropped[i]) {
            first = first_backward_use(b, v);
            compute_again(b, v, operand_again(b, v->in[0], first), first);
        } else if (recomputable(v->op) && !irb_is_result(b, v) && read_in_backward(b, v->in[0]) &&
                   (first = first_backward_reader(b, v)))
            compute_again(b, v, v->in[0], first);
    }
    free(dropped);
    return irb_finish(b);
}

/* The norms, once the dropouts' copies read them: a builder of its own, whose ids are the
 * schedule's positions with those copies in it. */
static int remat_norms(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    for (int i = 0; i < g->n_fwd; i++) {
        IrNode *h = g->nodes[i], *first;
        if (norm_again(b, h) && (first = first_backward_viewer(b, h)))
            views_read_again(b, h, copy_before(b, h, NULL, first), first);
    }
    return irb_finish(b);
}

int remat_activations(IrGraph *g) {
    int n = remat_values(g);
    return n + remat_norms(g);
}
