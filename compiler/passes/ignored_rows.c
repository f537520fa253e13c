/* ignored_rows.c - the classifier's backward products over the labelled rows only.
 *
 * Requires:    a differentiated graph; no layouts, fusion or memory plan yet; a target whose
 *              kernels implement row_order, row_compact and matmul_rows (the CPU's).
 * Guarantees:  where a cross-entropy with an ignore index has a gradient G [R, V] (xent_bwd,
 *              zero on every row whose label is ignored) that only sums and products read, the
 *              products G^T B (a weight's gradient) and G op(B) (its input's gradient) run over
 *              the rows whose label counts and no others:
 *                order = row_order(labels)            those rows first, then the rest
 *                Gc    = row_compact(G, order, labels) their rows of G first, then zeros
 *                dW    = matmul_rows(Gc, gather(B, order), labels)   under trans_a
 *                dX    = gather_bwd(order, matmul_rows(Gc, W, labels))  each row put back once
 *              matmul_rows takes the count from the labels at run time, so the shapes stay
 *              static. The rows left out are zero rows of G: every gradient keeps its value,
 *              not its bits (the products' sums run over fewer terms, blocked differently).
 *              A sum over G (the bias gradient) reads G as before.
 * Invalidates: node ids (renumbered).
 *
 * BERT's masked-LM loss labels 15 % of the positions: its decoder's two backward products, a
 * seventh of the step's arithmetic at BERT-base, shrink to a seventh of themselves. The forward
 * product stays whole: the logits are the model's output (evaluation, --predict).
 */
#include "builder.h"
#include "passes.h"

#define MAX_PRODUCTS 8

/* A product that reads G's [R, V] matrix as its left operand and can run over its labelled
 * rows: G^T B with B's rows those of G (B is gathered into the same order), or G op(B). */
static int takes_rows(const IrNode *p, const IrNode *mat) {
    if (p->op != OP_MATMUL || p->in[0] != mat || p->in[1] == mat || p->shape.rank != 2 || p->dtype != DT_F32)
        return 0;
    return !p->attr.trans_a || !p->attr.trans_b;
}

/* The products that read mat, when every reader of mat is one or a sum (and there is one). */
static int products(const IrBuilder *b, const IrNode *mat, IrNode **out) {
    int n, count = 0;
    const IrUse *u = irb_uses(b, mat, &n);
    for (int k = 0; k < n; k++) {
        if (u[k].user->op == OP_SUM_TO) continue;
        if (!takes_rows(u[k].user, mat) || count == MAX_PRODUCTS) return 0;
        out[count++] = u[k].user;
    }
    return count;
}

/* G's [R, V] matrix (G itself, or its one reshape to it, every other reader of G a sum) when
 * the matrix's readers are products that can run over the labelled rows, and sums; its products
 * in out[0 .. *n_out), in schedule order. */
static IrNode *gradient_matrix(const IrBuilder *b, IrNode *grad, IrNode **out, int *n_out) {
    if (irb_is_result(b, grad)) return NULL;
    IrNode *mat = grad;
    if (grad->shape.rank != 2) {
        int64_t V = grad->shape.dim[grad->shape.rank - 1], R = ir_numel(&grad->shape) / V;
        int n;
        const IrUse *u = irb_uses(b, grad, &n);
        mat = NULL;
        for (int k = 0; k < n; k++) {
            IrNode *user = u[k].user;
            if (user->op == OP_SUM_TO) continue;
            if (user->op != OP_RESHAPE || mat || user->shape.rank != 2 || user->shape.dim[0] != R) return NULL;
            mat = user;
        }
        if (!mat || irb_is_result(b, mat)) return NULL;
    }
    *n_out = products(b, mat, out);
    return *n_out ? mat : NULL;
}

static IrNode *node(IrBuilder *b, IrOp op, IrShape shape, IrDtype dt, const IrAttrs *attr, const IrNode *at, int n_in,
                    IrNode *x, IrNode *y, IrNode *z) {
    return irb_node(b, &(IrNodeSpec){.op = op, .n_in = n_in, .in = {x, y, z}, .shape = shape, .dtype = dt,
                                     .attr = attr, .phase = PHASE_BWD, .loc = at->loc});
}

/* Products p[0 .. n) of mat, G's matrix, over the rows whose label (labels) is not ignored. */
static void over_labelled_rows(IrBuilder *b, IrNode *grad, IrNode *mat, IrNode **p, int n) {
    IrNode *labels = grad->in[1];
    IrAttrs ignore = {.groups = 1, .has_ignore = 1, .ignore_index = grad->attr.ignore_index};
    int64_t R = mat->shape.dim[0];
    IrNode *order = node(b, OP_ROW_ORDER, ir_shape(1, R), DT_I64, &ignore, grad, 1, labels, NULL, NULL);
    IrNode *compact = node(b, OP_ROW_COMPACT, mat->shape, DT_F32, &ignore, grad, 3, mat, order, labels);
    irb_insert_before(b, p[0], order);
    irb_insert_after(b, order, compact);
    for (int i = 0; i < n; i++) {
        IrAttrs attr = ignore;
        attr.trans_a = p[i]->attr.trans_a, attr.trans_b = p[i]->attr.trans_b;
        IrNode *other = p[i]->in[1], *result;
        if (attr.trans_a) { /* G^T B: B's rows in G's new order */
            other = node(b, OP_GATHER, other->shape, other->dtype, NULL, p[i], 2, other, order, NULL);
            irb_insert_before(b, p[i], other);
        }
        IrNode *rows = node(b, OP_MATMUL_ROWS, p[i]->shape, DT_F32, &attr, p[i], 3, compact, other, labels);
        irb_insert_before(b, p[i], rows);
        result = rows;
        if (!attr.trans_a) { /* G op(B): its rows back where G's came from */
            result = node(b, OP_GATHER_BWD, p[i]->shape, DT_F32, NULL, p[i], 2, order, rows, NULL);
            irb_insert_after(b, rows, result);
        }
        irb_replace_uses(b, p[i], result, NULL, NULL);
        irb_remove(b, p[i]);
    }
}

int skip_ignored_rows(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    for (int i = g->n_fwd; i < g->n; i++) {
        IrNode *grad = g->nodes[i], *p[MAX_PRODUCTS], *mat;
        int n;
        if (grad->op != OP_XENT_BWD || !grad->attr.has_ignore || grad->dtype != DT_F32) continue;
        if ((mat = gradient_matrix(b, grad, p, &n))) over_labelled_rows(b, grad, mat, p, n);
    }
    return irb_finish(b);
}
