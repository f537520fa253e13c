/* autocast.c - mixed precision: matrix products and convolutions in bfloat16 (--precision
 * bf16) or IEEE half (--precision fp16; written "bf16" below, the pass is the same).
 *
 * Requires:    a differentiated graph with layouts chosen (layout_select has run); no fusion
 *              or memory plan yet. Under fp16 the graph was differentiated with loss_scaling,
 *              so the gradients the products see are the loss scale times the true ones, which
 *              keeps the small ones above fp16's subnormals (autodiff.c, codegen/cuda.c).
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
 *              With frozen_half (netc --frozen-half), a frozen parameter that only products
 *              read (directly, or through a layout conversion only they read, which becomes a
 *              permuting bf16-to-bf16 cast) is itself bf16 (its OP_PARAM node's dtype): no
 *              rounding in the step, and the memory plan puts it among the last values of the
 *              flat buffer, which a device trainer keeps in bf16 - rounded once when the
 *              parameters are uploaded, as the cast would round it in every step, so the
 *              products read the same bits.
 * Invalidates: node ids (renumbered); n_fwd grows by the forward casts.
 *
 * The casts are element-wise, so fusion folds most of them into the groups that produce or
 * read the values; what remains is one pass per product that writes its bf16 result as float.
 * A layout conversion (OP_LAYOUT) that only products read, or that is the one reader of a
 * product, becomes the cast itself: an element-wise node reads its operand in any layout and
 * writes its own, so the permutation and the rounding are one pass even without fusion (on the
 * CUDA backend, every KRSC filter and filter gradient of a channels-last convolution).
 */
#include "passes.h"

static int is_product(const IrNode *n) {
    return (n->op == OP_MATMUL || n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA ||
            n->op == OP_CONV2D_BWD_FILTER) &&
           n->dtype == DT_F32;
}

static int reads_f32(const IrNode *user, const void *ctx) {
    (void)ctx;
    return !user || !is_product(user);
}

static int reads_half(const IrNode *user, const void *ctx) {
    (void)ctx;
    return user && is_product(user);
}

/* Every reading of x is by a product (none by the graph itself), and there is one. */
static int read_by_products_only(const IrBuilder *b, const IrNode *x) {
    int n_uses;
    const IrUse *use = irb_uses(b, x, &n_uses);
    for (int i = 0; i < n_uses; i++)
        if (!is_product(use[i].user)) return 0;
    return n_uses > 0 && !irb_is_result(b, x);
}

/* Product p now yields bf16; every other reader (and the graph, for a gradient) reads a cast
 * back to float32, left unplaced here: place_casts_back() puts it before its first reader. A
 * layout conversion that is p's only reader becomes the cast back itself, widening as it
 * permutes. */
static void cast_back(IrBuilder *b, IrNode *p, IrDtype half) {
    int n_uses;
    const IrUse *use = irb_uses(b, p, &n_uses);
    p->dtype = half;
    if (n_uses == 1 && use[0].user->op == OP_LAYOUT && !irb_is_result(b, p)) {
        use[0].user->op = OP_CAST;
        return;
    }
    irb_replace_uses(b, p, irb_unary(b, OP_CAST, p, DT_F32, p->layout, p), reads_f32, NULL);
}

/* Value x is read by products: they read a bf16 cast placed right after x, so that fusion can
 * take it into x's group. A layout conversion that only products read becomes the cast
 * itself, rounding as it permutes. */
static void cast_for_products(IrBuilder *b, IrNode *x, IrDtype half) {
    if (x->op == OP_LAYOUT && read_by_products_only(b, x)) {
        x->op = OP_CAST;
        x->dtype = half;
        return;
    }
    IrNode *c = irb_unary(b, OP_CAST, x, half, x->layout, x);
    irb_insert_after(b, x, c);
    irb_replace_uses(b, x, c, reads_half, NULL);
}

/* Frozen parameter x can be kept in half (--frozen-half): products read it, directly or through
 * layout conversions that only products read (a channels-last filter, which becomes a permuting
 * cast from half to half when visited), and nothing else does. */
static int half_frozen(const IrGraph *g, const IrBuilder *b, const IrNode *x) {
    if (x->op != OP_PARAM || g->params[x->index].trainable || irb_is_result(b, x)) return 0;
    int n_uses;
    const IrUse *use = irb_uses(b, x, &n_uses);
    for (int i = 0; i < n_uses; i++)
        if (!is_product(use[i].user) && !(use[i].user->op == OP_LAYOUT && read_by_products_only(b, use[i].user)))
            return 0;
    return n_uses > 0;
}

/* Some product reads x. */
static int feeds_product(const IrBuilder *b, const IrNode *x) {
    int n_uses;
    const IrUse *use = irb_uses(b, x, &n_uses);
    for (int i = 0; i < n_uses; i++)
        if (is_product(use[i].user)) return 1;
    return 0;
}

/* n's operands that are casts back not yet placed go right before it, in operand order. */
static void place_casts_back(IrBuilder *b, IrNode *n) {
    for (int k = 0; k < n->n_in; k++)
        if (!irb_placed(b, n->in[k])) irb_insert_before(b, n, n->in[k]);
}

/* One walk in schedule order. A value's readers come after it, so when it is visited they are
 * as they were: the products among them are still float32, which is how they are recognised. */
int autocast_half(IrGraph *g, IrDtype half, int frozen_half) {
    if (half != DT_BF16 && half != DT_F16) ICE("autocast: %s is not a half type", ir_dtype_name(half));
    if ((g->loss && is_product(g->loss)) || (g->correct && is_product(g->correct)))
        ICE("autocast: the loss is a product"); /* losses are reductions, never products */
    IrBuilder *b = irb_begin(g);
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        place_casts_back(b, n);
        if (frozen_half && half_frozen(g, b, n))
            n->dtype = half; /* stored in half: the products read it as it is, or permuted */
        else if (is_product(n)) cast_back(b, n, half);
        else if (feeds_product(b, n)) cast_for_products(b, n, half);
    }
    for (int i = 0; i < g->n_params; i++) { /* a weight gradient straight from a product */
        IrNode *grad = g->params[i].grad;
        if (grad && !irb_placed(b, grad)) irb_append(b, grad);
    }
    return irb_finish(b);
}
