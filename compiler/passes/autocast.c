/* autocast.c - mixed precision: matrix products and convolutions in bfloat16.
 *
 * Requires:    a differentiated graph with layouts chosen (layout_select has run); no fusion
 *              or memory plan yet.
 * Guarantees:  every float32 MATMUL, CONV2D, CONV2D_BWD_DATA and CONV2D_BWD_FILTER (forward and
 *              backward) reads bf16 operands and produces bf16: an operand that is another
 *              product's result is read as it is, any other through a CAST to bf16 placed
 *              right after the value (one per value, in its layout, shared by every product
 *              that reads it); a CAST back to float32, placed before the product's first other
 *              reader, is what those readers - and a parameter's gradient - now read. Everything else stays
 *              float32: parameters (the master weights), gradients, optimizer state, batch-norm
 *              statistics, losses. So the schedule keeps its order and meaning, with the
 *              products' inputs rounded to bf16 (8 significant bits) and their sums taken in
 *              float32 by the libraries.
 * Invalidates: node ids (renumbered); n_fwd grows by the forward casts.
 *
 * The casts are element-wise, so fusion folds most of them into the groups that produce or
 * read the values; what remains is one pass per product that writes its bf16 result as float.
 * A layout conversion (OP_LAYOUT) that only products read, or that is the one reader of a
 * product, becomes the cast itself: an element-wise node reads its operand in any layout and
 * writes its own, so the permutation and the rounding are one pass even without fusion (on the
 * CUDA backend, every KRSC filter and filter gradient of a channels-last convolution).
 */
#include <string.h>

#include "passes.h"

static int is_product(const IrNode *n) {
    return (n->op == OP_MATMUL || n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA ||
            n->op == OP_CONV2D_BWD_FILTER) &&
           n->dtype == DT_F32;
}

static IrNode *cast(IrGraph *g, IrNode *x, IrDtype dt, const IrNode *at) {
    return ir_unary_at(g, OP_CAST, x, dt, x->layout, at);
}

/* How each value is read: by how many operand slots, how many of them products', and whether
 * the end of the step reads it (the loss, the accuracy, a parameter's gradient). */
typedef struct Reads {
    int *all, *by_products;
    unsigned char *escapes;
} Reads;

static Reads count_reads(IrGraph *g) {
    size_t n0 = (size_t)g->n + 1;
    Reads r = {arena_alloc(g->arena, n0 * sizeof(int)), arena_alloc(g->arena, n0 * sizeof(int)),
               arena_alloc(g->arena, n0)};
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) {
            r.all[g->nodes[i]->in[k]->id]++;
            if (is_product(g->nodes[i])) r.by_products[g->nodes[i]->in[k]->id]++;
        }
    if (g->loss) r.escapes[g->loss->id] = 1;
    if (g->correct) r.escapes[g->correct->id] = 1;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad) r.escapes[g->params[i].grad->id] = 1;
    return r;
}

/* A layout conversion whose every reader is a product: it can round to bf16 as it permutes. */
static int conversion_for_products(const Reads *r, const IrNode *n) {
    return n->op == OP_LAYOUT && !r->escapes[n->id] && r->all[n->id] == r->by_products[n->id];
}

/* A layout conversion that is the only reader of a product (`of_product`, already bf16): it can
 * widen the product as it permutes. */
static int conversion_of_product(const Reads *r, const IrNode *n, int of_product) {
    const IrNode *x = n->in[0];
    return n->op == OP_LAYOUT && of_product && r->all[x->id] == 1 && !r->escapes[x->id];
}

int autocast_bf16(IrGraph *g) {
    ir_renumber(g);
    size_t n0 = (size_t)g->n + 1;
    unsigned char *need = arena_alloc(g->arena, n0);                   /* a product reads it */
    unsigned char *placed = arena_alloc(g->arena, n0);                 /* product id: its cast back is in */
    IrNode **to_bf16 = arena_alloc(g->arena, n0 * sizeof *to_bf16); /* value id -> its bf16 cast */
    IrNode **repl = arena_alloc(g->arena, n0 * sizeof *repl);       /* product id -> its cast back */
    IrNode **list = arena_alloc(g->arena, (3 * n0 + 16) * sizeof *list);
    int len = 0, n_fwd = g->n_fwd, added = 0;
    Reads reads = count_reads(g);
    for (int i = 0; i < g->n; i++)
        if (is_product(g->nodes[i]))
            for (int k = 0; k < g->nodes[i]->n_in; k++)
                if (!is_product(g->nodes[i]->in[k])) need[g->nodes[i]->in[k]->id] = 1;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        int product = is_product(n);
        if (i == g->n_fwd) n_fwd = len;
        int cast_back = n->n_in && conversion_of_product(&reads, n, repl[n->in[0]->id] != NULL);
        if (cast_back) { /* the product's cast back, permuting as it widens */
            n->op = OP_CAST;
            placed[n->in[0]->id] = 1; /* no other cast back: nothing else reads the product */
        }
        for (int k = 0; k < n->n_in && !cast_back; k++) {
            IrNode *x = n->in[k];
            if (product) { /* a product's bf16 result as it is, anything else through its cast */
                n->in[k] = repl[x->id] ? x : to_bf16[x->id];
                if (!n->in[k]) ICE("autocast: %%%d has no bf16 cast", x->id);
            } else if (repl[x->id]) { /* other readers read the float32 copy, made just before */
                if (!placed[x->id]) list[len++] = repl[x->id], placed[x->id] = 1;
                n->in[k] = repl[x->id];
            }
        }
        list[len++] = n;
        if (product) {
            n->dtype = DT_BF16;
            repl[n->id] = cast(g, n, DT_F32, n);
            added++;
        } else if (need[n->id] && conversion_for_products(&reads, n)) { /* the cast, permuting as it rounds */
            n->op = OP_CAST;
            n->dtype = DT_BF16;
            to_bf16[n->id] = n;
        } else if (need[n->id]) { /* right after the value, so fusion can take it into its group */
            to_bf16[n->id] = list[len++] = cast(g, n, DT_BF16, n);
            added++;
        }
    }
    if (g->n_fwd == g->n) n_fwd = len;
    for (int i = 0; i < g->n_params; i++) { /* a weight gradient straight from a product */
        IrNode *p = g->params[i].grad;
        if (!p || !repl[p->id]) continue;
        if (!placed[p->id]) list[len++] = repl[p->id], placed[p->id] = 1;
        g->params[i].grad = repl[p->id];
    }
    if ((g->loss && repl[g->loss->id]) || (g->correct && repl[g->correct->id]))
        ICE("autocast: the loss is a product"); /* losses are reductions, never products */
    g->nodes = list;
    g->n = len;
    g->cap = (int)(3 * n0 + 16);
    g->n_fwd = n_fwd;
    ir_renumber(g);
    return added;
}
