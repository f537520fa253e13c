/* autodiff.c - reverse-mode differentiation of the forward graph.
 *
 * Requires:    the forward graph from sema: nodes[0..n) in schedule order, g->loss a scalar
 *              f32 node, params with `trainable` set; no backward-only operator (*_GRAD,
 *              *_BWD) anywhere in it.
 * Guarantees:  g->n_fwd is the old g->n; nodes[n_fwd..n) are the backward pass, each with
 *              phase PHASE_BWD and the loc of the forward node it differentiates; every
 *              trainable parameter has IrParam.grad, a node of its shape (a zero tensor,
 *              EXPAND of CONST 0, when the loss does not depend on it); frozen ones have NULL.
 *              The adjoint of a value used several times is the sum (ADD) of its uses'
 *              contributions. Integer values never get gradients.
 * Invalidates: nothing already computed: it only appends nodes (ids of forward nodes are
 *              renumbered to their positions, which the verifier requires anyway).
 *
 * The method: mark the nodes that need a gradient (reachable forward from a trainable
 * parameter through float values, and backward from the loss), seed d loss = 1, then walk the
 * forward schedule backwards and apply one rule per operator (differentiate() below), each
 * adding its operand contributions into `adj`. A contribution whose shape is larger than its
 * operand (numpy broadcasting) is summed back down to the operand's shape with SUM_TO.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct Ad {
    IrGraph *g;
    IrNode **adj;        /* adjoint of forward node i; NULL until a contribution arrives */
    unsigned char *need; /* forward node i lies on a path from a trainable param to the loss */
    SrcLoc loc;          /* loc of the forward node being differentiated */
} Ad;

/* ---- building backward nodes */

/* Append the node `spec` describes to the backward pass, at the forward node's source line. */
static IrNode *append(Ad *ad, IrNodeSpec spec) {
    spec.phase = PHASE_BWD;
    spec.loc = ad->loc;
    return ir_node_append(ad->g, &spec);
}

static IrNode *emit(Ad *ad, IrOp op, IrShape shape, IrDtype dt, int n_in, IrNode *a, IrNode *b,
                    IrNode *c) {
    return append(ad, (IrNodeSpec){.op = op, .n_in = n_in, .in = {a, b, c}, .shape = shape, .dtype = dt});
}

static IrNode *constant(Ad *ad, double value, IrDtype dt) {
    IrNode *n = emit(ad, OP_CONST, ir_scalar_shape(), dt, 0, NULL, NULL, NULL);
    n->attr.scalar = value;
    return n;
}

/* Element-wise binary op; the result has the broadcast shape and a's dtype. */
static IrNode *ew2(Ad *ad, IrOp op, IrNode *a, IrNode *b) {
    IrShape s;
    if (!ir_broadcast(&a->shape, &b->shape, &s))
        ICE("autodiff: %s operands do not broadcast", ir_op_name(op));
    return emit(ad, op, s, a->dtype, 2, a, b, NULL);
}

static IrNode *ew1(Ad *ad, IrOp op, IrNode *a) {
    return emit(ad, op, a->shape, a->dtype, 1, a, NULL, NULL);
}

/* Sum t over the axes that broadcasting added or stretched, down to `shape`. */
static IrNode *unbroadcast(Ad *ad, IrNode *t, const IrShape *shape) {
    if (ir_shape_eq(&t->shape, shape)) return t;
    if (shape->rank == 0) return emit(ad, OP_SUM, *shape, t->dtype, 1, t, NULL, NULL);
    return emit(ad, OP_SUM_TO, *shape, t->dtype, 1, t, NULL, NULL);
}

/* ---- adjoints */

static int wants(const Ad *ad, const IrNode *x) { return x->id < ad->g->n_fwd && ad->need[x->id]; }

/* Add contribution t to x's adjoint (t may still have the broadcast shape of x's user). */
static void accumulate(Ad *ad, IrNode *x, IrNode *t) {
    if (!wants(ad, x)) return;
    t = unbroadcast(ad, t, &x->shape);
    if (t->dtype != x->dtype) ICE("autodiff: %s gradient of %s has dtype %s", ir_op_name(x->op),
                                  ir_dtype_name(x->dtype), ir_dtype_name(t->dtype));
    IrNode **a = &ad->adj[x->id];
    *a = *a ? emit(ad, OP_ADD, x->shape, x->dtype, 2, *a, t, NULL) : t;
}

/* ---- the rules, one case per forward operator */

static void grad_arith(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *a = y->in[0], *b = y->n_in > 1 ? y->in[1] : NULL;
    switch (y->op) {
    case OP_ADD: accumulate(ad, a, dy); accumulate(ad, b, dy); break;
    case OP_SUB:
        accumulate(ad, a, dy);
        if (wants(ad, b)) accumulate(ad, b, ew1(ad, OP_NEG, dy));
        break;
    case OP_MUL:
        if (wants(ad, a)) accumulate(ad, a, ew2(ad, OP_MUL, dy, b));
        if (wants(ad, b)) accumulate(ad, b, ew2(ad, OP_MUL, dy, a));
        break;
    case OP_DIV: /* d(a/b)/db = -a/b^2 = -y/b */
        if (wants(ad, a)) accumulate(ad, a, ew2(ad, OP_DIV, dy, b));
        if (wants(ad, b))
            accumulate(ad, b, ew1(ad, OP_NEG, ew2(ad, OP_DIV, ew2(ad, OP_MUL, dy, y), b)));
        break;
    case OP_NEG: accumulate(ad, a, ew1(ad, OP_NEG, dy)); break;
    default: ICE("grad_arith: %s", ir_op_name(y->op));
    }
}

/* Unary element-wise functions, most of which reuse the forward input x or output y. */
static void grad_unary(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0], *dx;
    switch (y->op) {
    case OP_RELU: /* from the output: y > 0 exactly where x > 0, and x need not be kept */
        dx = ew2(ad, OP_RELU_GRAD, y, dy);
        break;
    case OP_SIGMOID: dx = ew2(ad, OP_SIGMOID_GRAD, y, dy); break;
    case OP_TANH: dx = ew2(ad, OP_TANH_GRAD, y, dy); break;
    case OP_GELU: dx = ew2(ad, OP_GELU_GRAD, x, dy); break;
    case OP_GELU_TANH: dx = ew2(ad, OP_GELU_TANH_GRAD, x, dy); break;
    case OP_SILU: dx = ew2(ad, OP_SILU_GRAD, x, dy); break;
    case OP_EXP: dx = ew2(ad, OP_MUL, dy, y); break;
    case OP_LOG: dx = ew2(ad, OP_DIV, dy, x); break;
    case OP_SIN: dx = ew2(ad, OP_MUL, dy, ew1(ad, OP_COS, x)); break;
    case OP_COS: dx = ew1(ad, OP_NEG, ew2(ad, OP_MUL, dy, ew1(ad, OP_SIN, x))); break;
    case OP_LOG1P: dx = ew2(ad, OP_DIV, dy, ew2(ad, OP_ADD, x, constant(ad, 1, x->dtype))); break;
    case OP_EXPM1: dx = ew2(ad, OP_MUL, dy, ew2(ad, OP_ADD, y, constant(ad, 1, y->dtype))); break;
    case OP_SQRT: /* d sqrt(x) = 1 / (2 sqrt(x)) */
        dx = ew2(ad, OP_DIV, ew2(ad, OP_MUL, dy, constant(ad, 0.5, dy->dtype)), y);
        break;
    case OP_DROPOUT: /* the same mask as the forward node: its p and seed_id */
        dx = append(ad, (IrNodeSpec){.op = OP_DROPOUT_GRAD, .n_in = 1, .in = {dy}, .shape = dy->shape,
                                     .dtype = dy->dtype, .attr = &y->attr});
        break;
    default: ICE("grad_unary: %s", ir_op_name(y->op));
    }
    accumulate(ad, x, dx);
}

/* Operators whose gradient changes shape or dtype rather than computing a derivative. */
static void grad_shape(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0];
    if (!wants(ad, x)) return;
    switch (y->op) {
    case OP_CAST: /* only float operands are wanted, so the cast back is float to float */
        accumulate(ad, x, emit(ad, OP_CAST, x->shape, x->dtype, 1, dy, NULL, NULL));
        break;
    case OP_EXPAND: accumulate(ad, x, unbroadcast(ad, dy, &x->shape)); break;
    case OP_RESHAPE:
        accumulate(ad, x, emit(ad, OP_RESHAPE, x->shape, x->dtype, 1, dy, NULL, NULL));
        break;
    case OP_SUM_TO:
    case OP_SUM: accumulate(ad, x, emit(ad, OP_EXPAND, x->shape, x->dtype, 1, dy, NULL, NULL)); break;
    case OP_MEAN: {
        /* With batch_masked only the first n_valid rows count, but the backward pass runs only
         * in training steps, where n_valid == batch: the mean is over all numel elements. */
        IrNode *s = ew2(ad, OP_MUL, dy, constant(ad, 1.0 / (double)ir_numel(&x->shape), dy->dtype));
        accumulate(ad, x, emit(ad, OP_EXPAND, x->shape, x->dtype, 1, s, NULL, NULL));
        break;
    }
    default: ICE("grad_shape: %s", ir_op_name(y->op));
    }
}

/* BCE_LOGITS(x, t) = max(x,0) - x*t + log(1 + exp(-|x|)): d/dx = sigmoid(x) - t, d/dt = -x. */
static void grad_bce(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0], *t = y->in[1];
    if (wants(ad, x)) {
        IrShape s;
        if (!ir_broadcast(&x->shape, &t->shape, &s) || !ir_broadcast(&s, &dy->shape, &s))
            ICE("grad_bce: operands do not broadcast");
        accumulate(ad, x, emit(ad, OP_BCE_LOGITS_GRAD, s, x->dtype, 3, x, t, dy));
    }
    if (wants(ad, t)) accumulate(ad, t, ew1(ad, OP_NEG, ew2(ad, OP_MUL, x, dy)));
}

/* C = op(A) op(B), op = transpose when the flag is set; per batch for rank 3. Each gradient is
 * one MATMUL with trans flags, never an explicit transpose:
 *   ta tb   dA            dB
 *   0  0    dC·Bᵀ         Aᵀ·dC
 *   0  1    dC·B          dCᵀ·A
 *   1  0    B·dCᵀ         A·dC
 *   1  1    Bᵀ·dCᵀ        dCᵀ·Aᵀ
 */
static IrNode *matmul(Ad *ad, IrNode *a, IrNode *b, int ta, int tb, const IrShape *shape) {
    IrNode *n = emit(ad, OP_MATMUL, *shape, a->dtype, 2, a, b, NULL);
    n->attr.trans_a = ta;
    n->attr.trans_b = tb;
    return n;
}

static void grad_matmul(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *a = y->in[0], *b = y->in[1];
    int ta = y->attr.trans_a, tb = y->attr.trans_b;
    /* b's gradient (a dense layer's weights) first, so that a's (the layer's input) comes
     * last and the previous layer's activation gradient follows it: its epilogue */
    if (wants(ad, b))
        accumulate(ad, b, tb ? matmul(ad, dy, a, 1, ta, &b->shape)
                             : matmul(ad, a, dy, !ta, 0, &b->shape));
    if (wants(ad, a))
        accumulate(ad, a, ta ? matmul(ad, b, dy, tb, 1, &a->shape)
                             : matmul(ad, dy, b, 0, !tb, &a->shape));
}

/* Library kernels whose gradient is another library kernel with the same attributes. */
static IrNode *lib(Ad *ad, IrOp op, const IrNode *fwd, const IrShape *shape, int n_in, IrNode *a,
                   IrNode *b, IrNode *c) {
    return append(ad, (IrNodeSpec){.op = op, .n_in = n_in, .in = {a, b, c}, .shape = *shape,
                                   .dtype = fwd->dtype, .attr = &fwd->attr});
}

static void grad_lib(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0], *w = y->n_in > 1 ? y->in[1] : NULL;
    switch (y->op) {
    case OP_CONV2D: /* the filter gradient first, so that the data gradient (and any sum it
                      * joins) sits next to the element-wise gradient of the layer before it,
                      * where the fusion pass can merge them */
        if (wants(ad, w))
            accumulate(ad, w, lib(ad, OP_CONV2D_BWD_FILTER, y, &w->shape, 2, x, dy, NULL));
        if (wants(ad, x))
            accumulate(ad, x, lib(ad, OP_CONV2D_BWD_DATA, y, &x->shape, 2, dy, w, NULL));
        break;
    case OP_CONV2D_BWD_DATA: /* a transposed convolution (conv_transpose2d), y = the gradient of
                              * conv(., w) at x: its data gradient is that convolution, and its
                              * filter's, the filter gradient with the operands' roles exchanged */
        if (wants(ad, w))
            accumulate(ad, w, lib(ad, OP_CONV2D_BWD_FILTER, y, &w->shape, 2, dy, x, NULL));
        if (wants(ad, x))
            accumulate(ad, x, lib(ad, OP_CONV2D, y, &x->shape, 2, dy, w, NULL));
        break;
    case OP_MAXPOOL2D:
        accumulate(ad, x, lib(ad, OP_MAXPOOL2D_BWD, y, &x->shape, 2, x, dy, NULL));
        break;
    case OP_AVGPOOL2D:
        accumulate(ad, x, lib(ad, OP_AVGPOOL2D_BWD, y, &x->shape, 1, dy, NULL, NULL));
        break;
    case OP_SOFTMAX: accumulate(ad, x, lib(ad, OP_SOFTMAX_BWD, y, &x->shape, 2, y, dy, NULL)); break;
    case OP_LOG_SOFTMAX: accumulate(ad, x, lib(ad, OP_LOG_SOFTMAX_BWD, y, &x->shape, 2, y, dy, NULL)); break;
    case OP_XENT: /* the labels (operand 1) are integers: no gradient; the loss y gives each row's
                   * log-sum-exp back to the kernel */
        accumulate(ad, x, append(ad, (IrNodeSpec){.op = OP_XENT_BWD, .n_in = 4, .in = {x, w, dy, y},
                                                  .shape = x->shape, .dtype = y->dtype, .attr = &y->attr}));
        break;
    case OP_GATHER: /* a table read twice (tied weights) sums both: accumulate */
        accumulate(ad, x, lib(ad, OP_GATHER_BWD, y, &x->shape, 2, w, dy, NULL));
        break;
    default: ICE("grad_lib: %s", ir_op_name(y->op));
    }
}

/* The copies along axes: each gradient is the opposite copy of dy.
 *   permute by p          dx = permute(dy) by the inverse of p
 *   slice at start        dx = slice_bwd(dy): zeros with dy placed at start
 *   concat(a, b)          da, db = the two slices of dy
 *   max along an axis     dx = max_bwd(x, dy): dy at the first maximal element */
static IrNode *axis_node(Ad *ad, IrOp op, const IrShape *shape, IrDtype dt, int n_in, IrNode *a, IrNode *b,
                         int axis, int64_t start) {
    IrNode *n = emit(ad, op, *shape, dt, n_in, a, b, NULL);
    n->attr.axis = axis;
    n->attr.start = start;
    return n;
}

static void grad_axes(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0];
    int axis = y->attr.axis;
    switch (y->op) {
    case OP_PERMUTE: {
        if (!wants(ad, x)) return;
        IrNode *dx = emit(ad, OP_PERMUTE, x->shape, x->dtype, 1, dy, NULL, NULL);
        for (int i = 0; i < y->shape.rank; i++) dx->attr.perm[y->attr.perm[i]] = i;
        accumulate(ad, x, dx);
        break;
    }
    case OP_SLICE:
        if (wants(ad, x)) accumulate(ad, x, axis_node(ad, OP_SLICE_BWD, &x->shape, x->dtype, 1, dy, NULL, axis, y->attr.start));
        break;
    case OP_CONCAT: {
        IrNode *b = y->in[1];
        if (wants(ad, x)) accumulate(ad, x, axis_node(ad, OP_SLICE, &x->shape, x->dtype, 1, dy, NULL, axis, 0));
        if (wants(ad, b))
            accumulate(ad, b, axis_node(ad, OP_SLICE, &b->shape, b->dtype, 1, dy, NULL, axis, x->shape.dim[axis]));
        break;
    }
    case OP_MAX:
        if (wants(ad, x)) accumulate(ad, x, axis_node(ad, OP_MAX_BWD, &x->shape, x->dtype, 2, x, dy, axis, 0));
        break;
    default: ICE("grad_axes: %s", ir_op_name(y->op));
    }
}

/* A frozen batch norm (fixed running statistics) is an affine map per channel:
 * dx = dy * (weight * invstd)[c], the scale broadcast as [C, 1, 1] over [N, C, H, W]. */
static IrNode *frozen_bn_dx(Ad *ad, IrNode *invstd, IrNode *w, IrNode *dy) {
    IrNode *scale = emit(ad, OP_MUL, w->shape, DT_F32, 2, invstd, w, NULL);
    IrShape per_c = ir_shape(3, w->shape.dim[0], (int64_t)1, (int64_t)1);
    return emit(ad, OP_MUL, dy->shape, DT_F32, 2, dy, emit(ad, OP_RESHAPE, per_c, DT_F32, 1, scale, NULL, NULL), NULL);
}

/* Batch norm in training mode: the gradient with respect to x includes the path through the
 * batch statistics, so BN_STATS itself is never differentiated. One reduction gives the
 * per-channel sums of dy and dy * xhat, two results taken by row views: they are the bias and
 * weight gradients, and dx needs them too. A frozen batch norm's statistics are constants, and
 * its dx is frozen_bn_dx. */
static void grad_bn(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0], *mean = y->in[1], *invstd = y->in[2], *w = y->in[3], *b = y->in[4];
    IrNode *stats = (IrNode *)ir_bn_stats(y);
    int frozen = stats->attr.bn_frozen;
    IrNode *sum[2] = {NULL, NULL}; /* sum(dy), sum(dy * xhat) */
    if (!frozen || wants(ad, w) || wants(ad, b)) {
        IrNode *sums = emit(ad, OP_BN_BWD_SUMS, stats->shape, DT_F32, 3, x, stats, dy);
        for (int r = 0; r < 2; r++) {
            sum[r] = emit(ad, OP_ROW, w->shape, DT_F32, 1, sums, NULL, NULL);
            sum[r]->attr.row = r;
        }
    }
    if (wants(ad, x) && frozen) {
        accumulate(ad, x, frozen_bn_dx(ad, invstd, w, dy));
    } else if (wants(ad, x)) {
        IrNodeSpec dx = {.op = OP_BN_BWD_DATA, .n_in = 7, .in = {x, mean, invstd, w, sum[0], sum[1], dy},
                         .shape = x->shape, .dtype = DT_F32};
        accumulate(ad, x, append(ad, dx));
    }
    if (wants(ad, b)) accumulate(ad, b, sum[0]);
    if (wants(ad, w)) accumulate(ad, w, sum[1]);
}

/* Attention: one backward node computes dq, dk and dv together (packed, with the kernels'
 * scratch after them), and PART views project them: one per operand, or with heads read from
 * tokens one per base (ir_attention_grad_at: the operands of one base write their columns of
 * one gradient). The mask gets no gradient: a mask that would need one is an error
 * (ad_differentiate reports it before any rule runs). */
static void grad_attention(Ad *ad, IrNode *y, IrNode *dy) {
    int masked = y->op == OP_ATTENTION_MASKED;
    IrNodeSpec spec = {.op = masked ? OP_ATTENTION_MASKED_BWD : OP_ATTENTION_BWD, .n_in = masked ? 6 : 5,
                       .in = {y->in[0], y->in[1], y->in[2], y, dy, masked ? y->in[3] : NULL},
                       .shape = ir_shape(1, ir_attention_bwd_numel(y)), .dtype = DT_F32, .attr = &y->attr};
    IrNode *packed = append(ad, spec);
    for (int i = 0; i < 3; i++) {
        IrNode *x = y->in[i];
        if (ir_attention_first(y, i) != i || !wants(ad, x)) continue;
        IrNode *d = emit(ad, OP_PART, x->shape, DT_F32, 1, packed, NULL, NULL);
        d->attr.part = ir_attention_grad_at(y, i);
        accumulate(ad, x, d);
    }
}

/* where(c, a, b): dy flows to a where c holds and to b elsewhere; c (a mask) gets none. */
static void grad_where(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *c = y->in[0], *a = y->in[1], *b = y->in[2];
    for (int k = 0; k < 2; k++) {
        IrNode *x = k ? b : a;
        if (!wants(ad, x)) continue;
        IrNode *zero = constant(ad, 0.0, dy->dtype);
        IrShape s;
        if (!ir_broadcast(&c->shape, &dy->shape, &s)) ICE("grad_where: operands do not broadcast");
        IrNode *d = append(ad, (IrNodeSpec){.op = OP_WHERE, .n_in = 3, .in = {c, k ? zero : dy, k ? dy : zero},
                                            .shape = s, .dtype = dy->dtype});
        accumulate(ad, x, d);
    }
}

/* Layer norm and RMS norm over the last axis: dx recomputes the row statistics from x
 * (*NORM_BWD), and one reduction over the rows gives the parameters' gradients: layernorm's
 * [2, D] (row 0 the weight's, row 1 the bias's, read through ROW views as batch norm's sums),
 * rmsnorm's [D]. When both are wanted, one node computes them in one pass over x and dy
 * (attr.norm_params): PART views take dx and each parameter's row, and each row is copied out
 * (EXPAND to its own shape) so that the packed result, dx's size, is not kept until the step's
 * end for the few floats the parameters' gradients are. A layernorm without a bias has zeros as
 * its bias operand, which wants no gradient. */
static void grad_norm(Ad *ad, IrNode *y, IrNode *dy) {
    IrNode *x = y->in[0], *w = y->in[1], *b = y->op == OP_LAYERNORM ? y->in[2] : NULL;
    int ln = y->op == OP_LAYERNORM;
    int want_params = wants(ad, w) || (b && wants(ad, b));
    if (want_params && wants(ad, x)) {
        const int64_t D = w->shape.dim[0], nx = ir_numel(&x->shape);
        IrAttrs attr = y->attr;
        attr.norm_params = 1;
        IrNode *packed = append(ad, (IrNodeSpec){.op = ln ? OP_LAYERNORM_BWD : OP_RMSNORM_BWD, .n_in = 3,
                                                 .in = {x, w, dy}, .shape = ir_shape(1, nx + (ln ? 2 : 1) * D),
                                                 .dtype = DT_F32, .attr = &attr});
        IrNode *dx = emit(ad, OP_PART, x->shape, DT_F32, 1, packed, NULL, NULL);
        accumulate(ad, x, dx);
        for (int r = 0; r < (ln ? 2 : 1); r++) {
            IrNode *p = r ? b : w;
            if (!wants(ad, p)) continue;
            IrNode *g = emit(ad, OP_PART, p->shape, DT_F32, 1, packed, NULL, NULL);
            g->attr.part = nx + r * D;
            accumulate(ad, p, emit(ad, OP_EXPAND, p->shape, DT_F32, 1, g, NULL, NULL));
        }
        return;
    }
    if (want_params) {
        IrShape ps = ir_shape(1, w->shape.dim[0]);
        if (ln) ps = ir_shape(2, (int64_t)2, w->shape.dim[0]);
        IrNode *sums = lib(ad, ln ? OP_LAYERNORM_BWD_PARAMS : OP_RMSNORM_BWD_PARAMS, y, &ps, 2, x, dy, NULL);
        for (int r = 0; r < (ln ? 2 : 1); r++) {
            IrNode *p = r ? b : w;
            if (!wants(ad, p)) continue;
            IrNode *g = sums;
            if (ln) {
                g = emit(ad, OP_ROW, p->shape, DT_F32, 1, sums, NULL, NULL);
                g->attr.row = r;
            }
            accumulate(ad, p, g);
        }
    }
    if (wants(ad, x)) accumulate(ad, x, lib(ad, ln ? OP_LAYERNORM_BWD : OP_RMSNORM_BWD, y, &x->shape, 3, x, w, dy));
}

/* Apply y's rule: add the contributions of dy (y's adjoint) to y's operands' adjoints. */
static void differentiate(Ad *ad, IrNode *y, IrNode *dy) {
    switch (y->op) {
    case OP_INPUT: case OP_PARAM: case OP_CONST: case OP_LOSS_SCALE: case OP_ACCURACY: case OP_BN_STATS: break;
    case OP_DETACH: break; /* never needed (mark_needed): no gradient passes */
    case OP_IOTA: case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE:
        break; /* integer results: never on a gradient's path */
    case OP_WHERE: grad_where(ad, y, dy); break;
    case OP_BN_APPLY: grad_bn(ad, y, dy); break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_NEG: grad_arith(ad, y, dy); break;
    case OP_RELU: case OP_SIGMOID: case OP_TANH: case OP_GELU: case OP_GELU_TANH: case OP_SILU:
    case OP_EXP: case OP_LOG: case OP_SQRT: case OP_SIN: case OP_COS: case OP_LOG1P: case OP_EXPM1:
    case OP_DROPOUT:
        grad_unary(ad, y, dy);
        break;
    case OP_CAST: case OP_EXPAND: case OP_RESHAPE: case OP_SUM_TO: case OP_SUM: case OP_MEAN:
        grad_shape(ad, y, dy);
        break;
    case OP_BCE_LOGITS: grad_bce(ad, y, dy); break;
    case OP_PERMUTE: case OP_SLICE: case OP_CONCAT: case OP_MAX: grad_axes(ad, y, dy); break;
    case OP_MATMUL: grad_matmul(ad, y, dy); break;
    case OP_CONV2D: case OP_CONV2D_BWD_DATA: case OP_MAXPOOL2D: case OP_AVGPOOL2D: case OP_SOFTMAX:
    case OP_LOG_SOFTMAX: case OP_XENT: case OP_GATHER:
        grad_lib(ad, y, dy);
        break;
    case OP_ATTENTION: case OP_ATTENTION_MASKED: grad_attention(ad, y, dy); break;
    case OP_LAYERNORM: case OP_RMSNORM: grad_norm(ad, y, dy); break;
    case OP_RELU_GRAD: case OP_SIGMOID_GRAD: case OP_TANH_GRAD: case OP_GELU_GRAD:
    case OP_DROPOUT_GRAD: case OP_BCE_LOGITS_GRAD:
    case OP_CONV2D_BWD_FILTER: case OP_MAXPOOL2D_BWD: case OP_AVGPOOL2D_BWD: case OP_SOFTMAX_BWD:
    case OP_XENT_BWD: case OP_GATHER_BWD: case OP_BN_BWD_DATA: case OP_BN_BWD_SUMS: case OP_ROW: case OP_LAYOUT: case OP_PERMUTE_VIEW:
    case OP_SLICE_BWD: case OP_MAX_BWD:
    case OP_ATTENTION_BWD: case OP_ATTENTION_MASKED_BWD: case OP_PART:
    case OP_GELU_TANH_GRAD: case OP_SILU_GRAD: case OP_LOG_SOFTMAX_BWD: case OP_LAYERNORM_BWD:
    case OP_LAYERNORM_BWD_PARAMS: case OP_RMSNORM_BWD: case OP_RMSNORM_BWD_PARAMS:
    case OP_MATMUL_ROWS: case OP_ROW_ORDER: case OP_ROW_COMPACT:
    case OP__COUNT:
        ICE("autodiff: backward-only or post-autodiff operator %s in the forward graph (%%%d)", ir_op_name(y->op),
            y->id);
    }
}

/* ---- which nodes need a gradient */

/* Operand k of y carries a gradient back. Dead ends among float edges: ACCURACY, BN_STATS,
 * the statistics operands of BN_APPLY (mean and invstd: its rule differentiates through them
 * itself) and the condition of WHERE. */
static int differentiable_edge(const IrNode *y, int k) {
    if (y->op == OP_ACCURACY || y->op == OP_BN_STATS || y->op == OP_DETACH) return 0;
    if (y->op == OP_WHERE && k == 0) return 0;
    return ir_dtype_is_float(y->dtype) && !(y->op == OP_BN_APPLY && (k == 1 || k == 2));
}

static void mark_needed(Ad *ad) {
    IrGraph *g = ad->g;
    int n = g->n_fwd;
    unsigned char *from_param = arena_alloc(g->arena, (size_t)n + 1);
    unsigned char *to_loss = arena_alloc(g->arena, (size_t)n + 1);
    for (int i = 0; i < g->n_params; i++)
        from_param[g->params[i].node->id] = (unsigned char)(g->params[i].trainable != 0);
    for (int i = 0; i < n; i++) {
        IrNode *y = g->nodes[i];
        for (int k = 0; k < y->n_in && !from_param[i]; k++)
            from_param[i] = from_param[y->in[k]->id];
        from_param[i] &= ir_dtype_is_float(y->dtype) && y->op != OP_DETACH;
    }
    to_loss[g->loss->id] = 1;
    for (int i = n - 1; i >= 0; i--) {
        IrNode *y = g->nodes[i];
        if (!to_loss[i]) continue;
        for (int k = 0; k < y->n_in; k++)
            if (differentiable_edge(y, k)) to_loss[y->in[k]->id] = ir_dtype_is_float(y->in[k]->dtype);
    }
    for (int i = 0; i < n; i++) ad->need[i] = from_param[i] && to_loss[i];
}

/* An attention mask that would need a gradient (it depends on a trainable parameter and the
 * loss on the attention): an error at the mask, since the fused kernels never form dS. */
static int check_masks(const Ad *ad) {
    int bad = 0;
    for (int i = 0; i < ad->g->n_fwd; i++) {
        const IrNode *y = ad->g->nodes[i];
        if (y->op == OP_ATTENTION_MASKED && ad->need[i] && ad->need[y->in[3]->id]) {
            diag_error(y->loc, "attention's mask gets no gradient, but this one depends on a trainable parameter");
            diag_hint("build the mask from inputs and constants, or freeze the parameters it is made from");
            bad = 1;
        }
    }
    return bad;
}

/* ---- parameters' gradients */

static void set_param_grads(Ad *ad) {
    IrGraph *g = ad->g;
    for (int i = 0; i < g->n_params; i++) {
        IrParam *p = &g->params[i];
        p->grad = NULL;
        if (!p->trainable) continue;
        p->grad = ad->adj[p->node->id];
        if (p->grad) continue;
        /* the loss does not depend on p: a zero gradient keeps the optimizer (weight decay)
         * uniform over all trainable parameters */
        ad->loc = p->node->loc;
        p->grad = emit(ad, OP_EXPAND, p->node->shape, p->node->dtype, 1,
                       constant(ad, 0.0, p->node->dtype), NULL, NULL);
    }
}

int ad_differentiate(IrGraph *g) {
    if (!g->loss) ICE("autodiff: the graph has no loss");
    ir_renumber(g);
    g->n_fwd = g->n;
    Ad ad = {.g = g};
    ad.adj = arena_alloc(g->arena, ((size_t)g->n_fwd + 1) * sizeof *ad.adj);
    ad.need = arena_alloc(g->arena, (size_t)g->n_fwd + 1);
    mark_needed(&ad);
    if (check_masks(&ad)) return 1;
    if (ad.need[g->loss->id]) {
        ad.loc = g->loss->loc;
        ad.adj[g->loss->id] = g->loss_scaling ? emit(&ad, OP_LOSS_SCALE, ir_scalar_shape(), g->loss->dtype, 0, NULL,
                                                     NULL, NULL)
                                              : constant(&ad, 1.0, g->loss->dtype);
    }
    for (int i = g->n_fwd - 1; i >= 0; i--) {
        IrNode *y = g->nodes[i];
        if (!ad.need[i]) continue;
        if (!ad.adj[i])
            ICE("autodiff: %%%d = %s needs a gradient but none arrived", i, ir_op_name(y->op));
        if (!ir_shape_eq(&ad.adj[i]->shape, &y->shape))
            ICE("autodiff: the gradient of %%%d = %s has the wrong shape", i, ir_op_name(y->op));
        ad.loc = y->loc;
        differentiate(&ad, y, ad.adj[i]);
    }
    set_param_grads(&ad);
#ifndef NDEBUG
    if (!ir_verify(g, "autodiff")) ICE("autodiff produced an invalid graph");
#endif
    return 0;
}
