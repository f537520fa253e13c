/* sema_losses.c - the losses and the metric of the train section's `loss =` and `metrics =`:
 * cross_entropy (of [N, C] logits or of sequences, with label smoothing and ignore_index), the
 * element-wise regression losses mse, l1, smooth_l1 and huber, bce_with_logits, and accuracy
 * (top-k, ignore_index). A loss is the mean over the batch's valid rows (batch_mean), as
 * PyTorch's reduction="mean", and its prediction becomes the model's output (--predict).
 */
#include <string.h>

#include "sema_args.h"

/* Logits [N, C] for a loss or metric. Logits of higher rank usually come from a dense layer fed
 * an unflattened image: dense acts on the last axis only, so the note points at that layer. */
static IrNode *arg_logits(Args *A, int i) {
    Value v = A->a[i];
    if (v.k == V_TENSOR && v.t->shape.rank > 2 && ir_dtype_is_float(v.t->dtype)) {
        diag_error(arg_at(A, i), "'%s' of %s must have 2 axes [N, classes], found shape %s",
                   A->b->params[i], A->b->name, sema_shape_str(A->S, &v.t->shape));
        diag_note(v.t->loc, "the %s value comes from here", sema_shape_str(A->S, &v.t->shape));
        diag_hint("dense acts on the last axis and keeps the others: flatten its input first, "
                  "e.g. dense(flatten(x), 10)");
        A->ok = 0;
        return NULL;
    }
    return arg_f32_tensor(A, i, 2, 2);
}

/* Integer class indices, argument 1, for logits [..., C]: the same leading axes, cast to i64 if
 * needed; NULL after an error. */
static IrNode *arg_labels(Args *A, const IrNode *logits) {
    Value v = A->a[1];
    if (v.k == V_ERR) return A->ok = 0, NULL;
    if (v.k != V_TENSOR || ir_dtype_is_float(v.t->dtype)) {
        diag_error(arg_at(A, 1), "'%s' of %s must be an integer tensor of class indices, found %s",
                   A->b->params[1], A->b->name, sema_value_desc(A->S, v));
        return A->ok = 0, NULL;
    }
    const int r = logits->shape.rank - 1;
    int same = v.t->shape.rank == r;
    for (int i = 0; same && i < r; i++) same = v.t->shape.dim[i] == logits->shape.dim[i];
    if (!same) {
        diag_error(arg_at(A, 1), "labels of shape %s do not match logits of shape %s",
                   sema_shape_str(A->S, &v.t->shape), sema_shape_str(A->S, &logits->shape));
        diag_hint(r == 1 ? "logits are [N, classes] and labels [N]"
                         : "logits are [..., classes] and labels [...], the same leading axes");
        return A->ok = 0, NULL;
    }
    if (v.t->dtype == DT_I64) return v.t;
    return sema_node(A->S, OP_CAST, v.t->shape, DT_I64, v.t->loc, 1, v.t, NULL, NULL);
}

/* The logits (argument 0) and labels (1) of cross_entropy and accuracy: [N, C] with [N], or a
 * sequence's [..., C] with [...] (labels of one axis fewer). 0 after an error. */
static int logits_labels(Args *A, IrNode **logits, IrNode **labels) {
    Value lv = A->a[0], v = A->a[1];
    int seq = lv.k == V_TENSOR && lv.t->shape.rank > 2 && ir_dtype_is_float(lv.t->dtype) && v.k == V_TENSOR &&
              v.t->shape.rank == lv.t->shape.rank - 1;
    *logits = seq ? arg_f32_tensor(A, 0, 0, 3) : arg_logits(A, 0);
    *labels = A->ok ? arg_labels(A, *logits) : NULL;
    return A->ok;
}

/* ---- losses and metrics: the mean over the batch's valid rows */

static IrNode *batch_mean(Sema *S, IrNode *x, SrcLoc loc) {
    IrNode *m = sema_node(S, OP_MEAN, ir_scalar_shape(), DT_F32, loc, 1, x, NULL, NULL);
    m->attr.batch_masked = x->shape.rank >= 1 && x->shape.dim[0] == S->g->batch;
    return m;
}

/* cross_entropy(logits [..., C], label [...], smoothing=0, ignore_index=none): the mean over
 * every position of the valid samples, as PyTorch's reduction="mean"; with ignore_index, the
 * positions whose label is it count for nothing and the mean is over the others (0/0 = NaN
 * when every one is ignored, as PyTorch). */
Value sema_b_cross_entropy(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *logits, *lab;
    if (!logits_labels(A, &logits, &lab)) return sema_error();
    double smoothing = arg_num(A, 2, 0, 0, 1);
    if (!A->ok) return sema_error();
    Value iv = A->a[3];
    if (iv.k == V_ERR) return sema_error();
    if (iv.k != V_NONE && iv.k != V_INT) {
        diag_error(arg_at(A, 3), "'ignore_index' of cross_entropy must be an integer, found %s",
                   sema_value_text(S, iv));
        diag_hint("PyTorch's usual value is -100: labels equal to it count for nothing");
        return sema_error();
    }
    IrNode *l = sema_node(S, OP_XENT, lab->shape, DT_F32, c->loc, 2, logits, lab, NULL);
    l->attr.smoothing = smoothing;
    S->g->output = logits;
    if (iv.k == V_NONE) return sema_tensor(batch_mean(S, l, c->loc));
    l->attr.has_ignore = 1;
    l->attr.ignore_index = iv.i;
    /* sum(loss) / count(label != ignore_index), both over the valid samples: the ratio of two
     * means, computed on the device */
    IrNode *k = ir_const(S->g, (double)iv.i, DT_I64, c->loc);
    IrNode *keep = sema_node(S, OP_NE, lab->shape, DT_U8, c->loc, 2, lab, k, NULL);
    IrNode *keepf = sema_node(S, OP_CAST, lab->shape, DT_F32, c->loc, 1, keep, NULL, NULL);
    IrNode *num = batch_mean(S, l, c->loc), *den = batch_mean(S, keepf, c->loc);
    return sema_tensor(sema_node(S, OP_DIV, ir_scalar_shape(), DT_F32, c->loc, 2, num, den, NULL));
}

/* The two operands of an element-wise loss, which must have the same shape. */
static int loss_pair(Args *A, IrNode **x, IrNode **t) {
    *x = arg_tensor(A, 0, 0, 1);
    *t = arg_tensor(A, 1, 0, 1);
    if (!A->ok) return 0;
    if (!ir_shape_eq(&(*x)->shape, &(*t)->shape)) {
        diag_error(A->call->loc, "%s: prediction %s and target %s must have the same shape",
                   A->b->name, sema_shape_str(A->S, &(*x)->shape), sema_shape_str(A->S, &(*t)->shape));
        return 0;
    }
    return 1;
}

Value sema_b_mse(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x, *t;
    if (!loss_pair(A, &x, &t) || !arg_refuse_half(A, 0, x) || !arg_refuse_half(A, 1, t)) return sema_error();
    IrNode *d = sema_node(S, OP_SUB, x->shape, DT_F32, c->loc, 2, x, t, NULL);
    IrNode *sq = sema_node(S, OP_MUL, x->shape, DT_F32, c->loc, 2, d, d, NULL);
    S->g->output = x;
    return sema_tensor(batch_mean(S, sq, c->loc));
}

Value sema_b_bce(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x, *t;
    if (!loss_pair(A, &x, &t)) return sema_error();
    IrNode *l = sema_node(S, OP_BCE_LOGITS, x->shape, DT_F32, c->loc, 2, x, t, NULL);
    S->g->output = x;
    return sema_tensor(batch_mean(S, l, c->loc));
}

/* a op b for b a scalar constant or of a's shape */
static IrNode *arith(Sema *S, IrOp op, IrNode *a, IrNode *b, SrcLoc at) {
    return sema_node(S, op, a->shape, DT_F32, at, 2, a, b, NULL);
}

/* |pred - target| and the pair, after the checks of an element-wise regression loss */
static IrNode *abs_error(Args *A, IrNode **x) {
    IrNode *t;
    if (!loss_pair(A, x, &t) || !arg_refuse_half(A, 0, *x) || !arg_refuse_half(A, 1, t)) return NULL;
    SrcLoc at = A->call->loc;
    return sema_abs(A->S, arith(A->S, OP_SUB, *x, t, at), at);
}

/* l1(pred, target) = mean |pred - target|, torch.nn.L1Loss (gradient 0 where they are equal) */
Value sema_b_l1(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x, *z = abs_error(A, &x);
    if (!z) return sema_error();
    S->g->output = x;
    return sema_tensor(batch_mean(S, z, c->loc));
}

/* smooth_l1(pred, target, beta=1) and huber(pred, target, delta=1), torch.nn.SmoothL1Loss and
 * HuberLoss: with z = |pred - target|, z < k ? 0.5 z^2 / beta : z - 0.5 beta, and z < k ?
 * 0.5 z^2 : delta (z - 0.5 delta), k being beta or delta; huber is smooth_l1 times delta.
 * smooth_l1 with beta = 0 is l1, as in PyTorch. */
Value sema_b_smooth_l1(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    int huber = strcmp(c->name, "huber") == 0;
    double k = arg_num(A, 2, 1, 0, 1e6);
    if (!A->ok) return sema_error();
    if (huber && k == 0) {
        diag_error(arg_at(A, 2), "huber: 'delta' must be above 0, found 0");
        diag_hint("l1(pred, target) is the loss without a quadratic part");
        return sema_error();
    }
    IrNode *x, *z = abs_error(A, &x);
    if (!z) return sema_error();
    S->g->output = x;
    if (k == 0) return sema_tensor(batch_mean(S, z, c->loc));
    SrcLoc at = c->loc;
    IrNode *quad = arith(S, OP_MUL, arith(S, OP_MUL, z, z, at), ir_const(S->g, 0.5, DT_F32, at), at);
    IrNode *lin = arith(S, OP_SUB, z, ir_const(S->g, 0.5 * k, DT_F32, at), at);
    if (huber) lin = arith(S, OP_MUL, lin, ir_const(S->g, k, DT_F32, at), at);
    else quad = arith(S, OP_DIV, quad, ir_const(S->g, k, DT_F32, at), at);
    IrNode *inside = sema_node(S, OP_LT, z->shape, DT_U8, at, 2, z, ir_const(S->g, k, DT_F32, at), NULL);
    IrNode *y = sema_node(S, OP_WHERE, z->shape, DT_F32, at, 3, inside, quad, lin);
    return sema_tensor(batch_mean(S, y, at));
}

Value sema_b_accuracy(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *logits, *lab;
    if (!logits_labels(A, &logits, &lab)) return sema_error();
    IrNode *acc = sema_node(S, OP_ACCURACY, ir_scalar_shape(), DT_F32, c->loc, 2, logits, lab, NULL);
    Value kv = A->a[3];
    if (kv.k == V_ERR) return sema_error();
    if (kv.k != V_NONE) { /* top-k accuracy: the label among the k largest logits */
        const int64_t classes = logits->shape.dim[logits->shape.rank - 1];
        if (kv.k != V_INT || kv.i < 1 || kv.i > classes) {
            diag_error(arg_at(A, 3), "'top_k' of accuracy must be an integer from 1 to the %lld classes, found %s",
                       (long long)classes, sema_value_text(S, kv));
            diag_hint("top_k = 5 counts a row right when its label is among its 5 largest logits");
            return sema_error();
        }
        if (kv.i > 1) acc->attr.top_k = (int)kv.i;
    }
    Value iv = A->a[2];
    if (iv.k == V_ERR) return sema_error();
    if (iv.k == V_NONE) return sema_tensor(acc);
    if (iv.k != V_INT) {
        diag_error(arg_at(A, 2), "'ignore_index' of accuracy must be an integer, found %s", sema_value_text(S, iv));
        diag_hint("-100, as the labels of a masked-LM batch mark the positions not to predict");
        return sema_error();
    }
    /* The trainer divides by the positions counted, which it counts in the label input's
     * batches itself: the labels must be an input, as they are in a masked-LM batch. */
    const IrNode *src = lab->op == OP_CAST ? lab->in[0] : lab;
    if (src->op != OP_INPUT) {
        diag_error(arg_at(A, 1), "accuracy with ignore_index needs its labels to be a model input, found %s",
                   sema_value_desc(S, A->a[1]));
        diag_hint("pass the labels input itself, e.g. accuracy(logits, labels, ignore_index = -100)");
        return sema_error();
    }
    acc->attr.has_ignore = 1;
    acc->attr.ignore_index = iv.i;
    return sema_tensor(acc);
}
