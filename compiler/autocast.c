/* autocast.c - mixed precision: matrix products and convolutions in bfloat16.
 *
 * Requires:    a differentiated graph with layouts chosen (layout_select has run); no fusion
 *              or memory plan yet.
 * Guarantees:  every float32 MATMUL, CONV2D, CONV2D_BWD_DATA and CONV2D_BWD_FILTER (forward and
 *              backward) reads bf16 operands and produces bf16; a CAST to bf16 sits before
 *              each operand (one per value, shared by its readers, in the operand's layout) and
 *              a CAST back to float32 right after the product, which every former reader of
 *              the product - and a parameter's gradient - now reads. Everything else stays
 *              float32: parameters (the master weights), gradients, optimizer state, batch-norm
 *              statistics, losses. So the schedule keeps its order and meaning, with the
 *              products' inputs rounded to bf16 (8 significant bits) and their sums taken in
 *              float32 by the libraries.
 * Invalidates: node ids (renumbered); n_fwd grows by the forward casts.
 *
 * The casts are element-wise, so fusion folds most of them into the groups that produce or
 * read the values; what remains is one pass per product that writes its bf16 result as float.
 */
#include <string.h>

#include "passes.h"

static int is_product(const IrNode *n) {
    return (n->op == OP_MATMUL || n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA ||
            n->op == OP_CONV2D_BWD_FILTER) &&
           n->dtype == DT_F32;
}

static IrNode *cast(IrGraph *g, IrNode *x, IrDtype dt, const IrNode *at) {
    IrNode *c = arena_alloc(g->arena, sizeof *c);
    c->op = OP_CAST;
    c->n_in = 1;
    c->in[0] = x;
    c->shape = x->shape;
    c->dtype = dt;
    c->layout = x->layout;
    c->phase = at->phase;
    c->loc = at->loc;
    c->attr.groups = 1;
    return c;
}

int autocast_bf16(IrGraph *g) {
    ir_renumber(g);
    size_t n0 = (size_t)g->n + 1;
    IrNode **to_bf16 = arena_alloc(g->arena, n0 * sizeof *to_bf16); /* value id -> its bf16 cast */
    IrNode **repl = arena_alloc(g->arena, n0 * sizeof *repl);       /* product id -> its cast back */
    IrNode **list = arena_alloc(g->arena, (3 * n0 + 16) * sizeof *list);
    int len = 0, n_fwd = g->n_fwd, added = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++) /* readers of a product read its float32 copy */
            if (repl[n->in[k]->id]) n->in[k] = repl[n->in[k]->id];
        if (!is_product(n)) {
            list[len++] = n;
            continue;
        }
        for (int k = 0; k < n->n_in; k++) {
            IrNode *x = n->in[k];
            if (x->dtype == DT_BF16) continue;
            if (!to_bf16[x->id]) {
                to_bf16[x->id] = cast(g, x, DT_BF16, n);
                list[len++] = to_bf16[x->id];
                added++, n_fwd += i < g->n_fwd;
            }
            n->in[k] = to_bf16[x->id];
        }
        n->dtype = DT_BF16;
        list[len++] = n;
        IrNode *back = cast(g, n, DT_F32, n);
        list[len++] = back;
        repl[n->id] = back;
        added++, n_fwd += i < g->n_fwd;
    }
    for (int i = 0; i < g->n_params; i++) /* a weight gradient straight from a product */
        if (g->params[i].grad && repl[g->params[i].grad->id]) g->params[i].grad = repl[g->params[i].grad->id];
    if (g->loss && repl[g->loss->id]) g->loss = repl[g->loss->id];
    if (g->correct && repl[g->correct->id]) g->correct = repl[g->correct->id];
    g->nodes = list;
    g->n = len;
    g->cap = (int)(3 * n0 + 16);
    g->n_fwd = n_fwd;
    ir_renumber(g);
    return added;
}
