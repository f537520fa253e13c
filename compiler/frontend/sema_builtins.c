/* sema_builtins.c - the built-in layers, functions, views and reductions (the losses and the
 * metric: sema_losses.c; those made of other operators: sema_composed.c; the train section:
 * sema_train.c).
 *
 * Each built-in checks its arguments (shapes named in every error), creates its parameters
 * under PyTorch's names and initialisation, and emits IR. docs/language.md documents each one;
 * the table at the bottom of this file is the list of built-ins.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sema.h"
#include "sema_args.h"

/* ---- argument helpers */

/* Where argument number `index` (or keyword `name`) was written, for error carets. */
SrcLoc arg_loc(const AstExpr *call, const char *name, int index) {
    for (int i = 0; i < call->n_args; i++) {
        const AstArg *a = &call->args[i];
        if ((a->kw && strcmp(a->kw, name) == 0) || (!a->kw && i == index)) return a->value->loc;
    }
    return call->loc;
}

SrcLoc arg_at(Args *A, int i) { return arg_loc(A->call, A->b->params[i], i); }

int64_t arg_int(Args *A, int i, int64_t def, int64_t min) {
    Value v = A->a[i];
    if (v.k == V_NONE) return def;
    if (v.k == V_ERR) {
        A->ok = 0;
        return def;
    }
    if (v.k != V_INT || v.i < min) {
        diag_error(arg_at(A, i), "'%s' of %s must be an integer >= %lld, found %s", A->b->params[i],
                   A->b->name, (long long)min, sema_value_text(A->S, v));
        A->ok = 0;
        return def;
    }
    return v.i;
}

/* An int or a [h, w] list, as PyTorch's kernel_size/stride/padding. */
void arg_pair(Args *A, int i, int def, int min, int out[2]) {
    Value v = A->a[i];
    out[0] = out[1] = def;
    if (v.k == V_LIST && v.n == 2 && v.items[0].k == V_INT && v.items[1].k == V_INT &&
        v.items[0].i >= min && v.items[1].i >= min && v.items[0].i <= 1 << 20 &&
        v.items[1].i <= 1 << 20) {
        out[0] = (int)v.items[0].i;
        out[1] = (int)v.items[1].i;
        return;
    }
    if (v.k == V_LIST) {
        diag_error(arg_at(A, i), "'%s' of %s must be an integer or [h, w] with integers >= %d, "
                   "found a list of %d", A->b->params[i], A->b->name, min, v.n);
        A->ok = 0;
        return;
    }
    int64_t x = arg_int(A, i, def, min);
    if (x > 1 << 20) {
        diag_error(arg_at(A, i), "'%s' of %s is too large (%lld)", A->b->params[i], A->b->name,
                   (long long)x);
        A->ok = 0;
        return;
    }
    out[0] = out[1] = (int)x;
}

int arg_bool(Args *A, int i, int def) {
    Value v = A->a[i];
    if (v.k == V_NONE) return def;
    if (v.k != V_BOOL) {
        if (v.k != V_ERR)
            diag_error(arg_at(A, i), "'%s' of %s must be true or false, found %s", A->b->params[i],
                       A->b->name, sema_value_text(A->S, v));
        A->ok = 0;
        return def;
    }
    return (int)v.i;
}

/* A number in [min, max], or in [min, max) when `open_max`. */
double arg_num_in(Args *A, int i, double def, double min, double max, int open_max) {
    Value v = A->a[i];
    if (v.k == V_NONE) return def;
    double x = sema_num(v);
    if ((v.k != V_INT && v.k != V_FLOAT) || !(x >= min && (open_max ? x < max : x <= max))) {
        if (v.k != V_ERR)
            diag_error(arg_at(A, i), "'%s' of %s must be a number in [%g, %g%c, found %s",
                       A->b->params[i], A->b->name, min, max, open_max ? ')' : ']',
                       sema_value_text(A->S, v));
        A->ok = 0;
        return def;
    }
    return x;
}

double arg_num(Args *A, int i, double def, double min, double max) {
    return arg_num_in(A, i, def, min, max, 0);
}

const char *arg_str(Args *A, int i, const char *def) {
    Value v = A->a[i];
    if (v.k == V_NONE) return def;
    if (v.k != V_STR) {
        if (v.k != V_ERR)
            diag_error(arg_at(A, i), "'%s' of %s must be a string, found %s", A->b->params[i],
                       A->b->name, sema_value_text(A->S, v));
        A->ok = 0;
        return def;
    }
    return v.s;
}

/* A float tensor argument of at least `min_rank` axes (exactly `rank` if rank > 0). */
IrNode *arg_tensor(Args *A, int i, int rank, int min_rank) {
    Value v = A->a[i];
    char what[64];
    snprintf(what, sizeof what, "'%s' of %s", A->b->params[i], A->b->name);
    if (!sema_want_float_tensor(A->S, v, arg_at(A, i), what)) {
        A->ok = 0;
        return NULL;
    }
    int r = v.t->shape.rank;
    if ((rank && r != rank) || r < min_rank) {
        diag_error(arg_at(A, i), "%s must have %s%d axes, found shape %s", what,
                   rank ? "" : "at least ", rank ? rank : min_rank,
                   sema_shape_str(A->S, &v.t->shape));
        A->ok = 0;
        return NULL;
    }
    return v.t;
}

/* x, argument i, unless it is f16 or bf16: a float32 operand of a library kernel (matrix
 * product, convolution, pooling, batch norm, softmax rows, the mean squared error): the CPU
 * kernels and the CUDA target's fp32 path take float32 only, so f16 and bf16 values are refused
 * here, naming the layer, rather than failing in the code generator. */
IrNode *arg_refuse_half(Args *A, int i, IrNode *x) {
    if (!x || !ir_dtype_is_half(x->dtype)) return x;
    const char *layer = A->label ? arena_printf(A->S->arena, "%s '%s'", A->b->name, A->label) : A->b->name;
    diag_error(arg_at(A, i), "'%s' of %s must be an f32 tensor, found %s", A->b->params[i], layer,
               sema_value_desc(A->S, sema_tensor(x)));
    diag_hint("the CPU and CUDA fp32 kernels take f32 only: convert it with f32(x); for bf16 or fp16 "
              "products and convolutions compile with --backend cuda --precision bf16 (or fp16), which "
              "casts f32 values itself");
    A->ok = 0;
    return NULL;
}

IrNode *arg_f32_tensor(Args *A, int i, int rank, int min_rank) {
    return arg_refuse_half(A, i, arg_tensor(A, i, rank, min_rank));
}

IrParam *sema_new_param(Sema *S, const char *name, IrShape shape, IrInit init, double a, SrcLoc loc) {
    if (!sema_check_shape(S, &shape, loc)) return NULL;
    if (S->g->n_params >= SEMA_MAX_PARAMS) { /* too_big stops the evaluation */
        if (!S->too_big) diag_error(loc, "the model has too many parameters (more than %d tensors)", SEMA_MAX_PARAMS);
        S->too_big = 1;
        return NULL;
    }
    if (ir_find_param(S->g, name)) {
        diag_error(loc, "parameter '%s' is defined twice", name);
        diag_hint("give the layers different labels, e.g. `fc2: dense(...)`");
        return NULL;
    }
    return ir_add_param(S->g, name, shape, init, a, loc);
}

/* Reshape node, or the node itself when the shape is unchanged. */
static IrNode *reshape(Sema *S, IrNode *x, IrShape shape, SrcLoc loc) {
    if (ir_shape_eq(&x->shape, &shape)) return x;
    return sema_node(S, OP_RESHAPE, shape, x->dtype, loc, 1, x, NULL, NULL);
}

/* ---- layers */

static Value b_dense(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 2);
    int64_t out = arg_int(A, 1, 1, 1);
    int bias = arg_bool(A, 2, 1), transposed = arg_bool(A, 3, 0);
    int normal = A->a[4].k != V_NONE; /* std given: Hugging Face's N(0, std^2) and zero biases */
    double std = normal ? arg_num(A, 4, 0.02, 0, 1e6) : 0;
    if (!A->ok) return sema_error();
    int r = x->shape.rank;
    int64_t in = x->shape.dim[r - 1], rows = ir_numel(&x->shape) / in;
    const char *name = sema_layer_name(S, label, "dense");
    double bound = 1.0 / sqrt((double)in); /* torch.nn.Linear: kaiming_uniform(a=sqrt(5)) */
    /* transposed = true: the weight stored [in, out], as Hugging Face's Conv1D (GPT-2) */
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name),
                                transposed ? ir_shape(2, in, out) : ir_shape(2, out, in),
                                normal ? INIT_NORMAL : INIT_UNIFORM, normal ? std : bound, c->loc);
    if (!w) return sema_error();
    w->dense = transposed ? 2 : 1;
    IrParam *b = bias ? sema_new_param(S, arena_printf(S->arena, "%s.bias", name), ir_shape(1, out),
                                       normal ? INIT_ZEROS : INIT_UNIFORM, bound, c->loc)
                      : NULL;
    if (bias && !b) return sema_error();
    IrNode *x2 = reshape(S, x, ir_shape(2, rows, in), c->loc);
    IrNode *y = sema_node(S, OP_MATMUL, ir_shape(2, rows, out), DT_F32, c->loc, 2, x2, w->node, NULL);
    y->attr.trans_b = !transposed;
    if (b) y = sema_node(S, OP_ADD, y->shape, DT_F32, c->loc, 2, y, b->node, NULL);
    IrShape ys = x->shape;
    ys.dim[r - 1] = out;
    return sema_tensor(reshape(S, y, ys, c->loc));
}

/* Output size of a convolution or pooling window along one axis (PyTorch's formula). */
static int64_t window_out(int64_t in, int k, int stride, int pad, int dil) {
    int64_t span = (int64_t)dil * (k - 1) + 1;
    if (in + 2 * (int64_t)pad < span) return 0;
    return (in + 2 * (int64_t)pad - span) / stride + 1;
}

static Value b_conv2d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    int64_t out = arg_int(A, 1, 1, 1);
    SemaConv v;
    arg_pair(A, 2, 1, 1, v.k);
    arg_pair(A, 3, 1, 1, v.stride);
    arg_pair(A, 4, 0, 0, v.pad);
    arg_pair(A, 5, 1, 1, v.dil);
    v.groups = arg_int(A, 6, 1, 1);
    v.bias = arg_bool(A, 7, 1);
    if (!A->ok) return sema_error();
    IrNode *y = sema_conv(S, c, label, x, out, &v, 4);
    return y ? sema_tensor(y) : sema_error();
}

/* The convolution of x [N, C, H, W] into `out` channels, with its parameters LABEL.weight and
 * LABEL.bias (PyTorch's default initialisation); the weight has the filter's 4 axes
 * [out, C / groups, kh, kw], or with weight_rank 3 (conv1d's, kh = 1) [out, C / groups, kw], the
 * filter a view of it. NULL after an error. */
IrNode *sema_conv(Sema *S, const AstExpr *c, const char *label, IrNode *x, int64_t out, const SemaConv *v,
                  int weight_rank) {
    const int *k = v->k, *dil = v->dil, *pad = v->pad;
    const int64_t groups = v->groups, C = x->shape.dim[1];
    if (C % groups || out % groups) {
        diag_error(c->loc, "groups=%lld must divide both the input channels (%lld) and the output "
                   "channels (%lld)", (long long)groups, (long long)C, (long long)out);
        return NULL;
    }
    int64_t P = window_out(x->shape.dim[2], k[0], v->stride[0], pad[0], dil[0]);
    int64_t Q = window_out(x->shape.dim[3], k[1], v->stride[1], pad[1], dil[1]);
    if (P < 1 || Q < 1) {
        diag_error(c->loc, "a %dx%d kernel (dilation %d,%d, padding %d,%d) does not fit input %s",
                   k[0], k[1], dil[0], dil[1], pad[0], pad[1], sema_shape_str(S, &x->shape));
        return NULL;
    }
    const char *name = sema_layer_name(S, label, c->name);
    int64_t fan_in = C / groups * k[0] * k[1];
    double bound = 1.0 / sqrt((double)fan_in); /* torch.nn.Conv2d's and Conv1d's default */
    IrShape filter = ir_shape(4, out, C / groups, (int64_t)k[0], (int64_t)k[1]);
    IrShape ws = weight_rank == 4 ? filter : ir_shape(3, out, C / groups, (int64_t)k[1]);
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), ws, INIT_UNIFORM, bound, c->loc);
    if (!w) return NULL;
    IrParam *b = v->bias ? sema_new_param(S, arena_printf(S->arena, "%s.bias", name), ir_shape(1, out),
                                          INIT_UNIFORM, bound, c->loc)
                         : NULL;
    if (v->bias && !b) return NULL;
    IrShape ys = ir_shape(4, x->shape.dim[0], out, P, Q);
    if (!sema_check_shape(S, &ys, c->loc)) return NULL;
    IrNode *y = sema_node(S, OP_CONV2D, ys, DT_F32, c->loc, 2, x, reshape(S, w->node, filter, c->loc), NULL);
    memcpy(y->attr.stride, v->stride, sizeof v->stride);
    memcpy(y->attr.pad, v->pad, sizeof v->pad);
    memcpy(y->attr.dil, v->dil, sizeof v->dil);
    y->attr.groups = (int)groups;
    if (b) {
        IrNode *b3 = reshape(S, b->node, ir_shape(3, out, (int64_t)1, (int64_t)1), c->loc);
        y = sema_node(S, OP_ADD, ys, DT_F32, c->loc, 2, y, b3, NULL);
    }
    return y;
}

static Value b_pool(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    int k[2], st[2], pad[2];
    arg_pair(A, 1, 1, 1, k);
    if (A->a[2].k == V_NONE) memcpy(st, k, sizeof st);
    else arg_pair(A, 2, 1, 1, st);
    arg_pair(A, 3, 0, 0, pad);
    if (!A->ok) return sema_error();
    if (pad[0] > k[0] / 2 || pad[1] > k[1] / 2) {
        diag_error(arg_loc(c, "pad", 3), "padding %d,%d is more than half the %dx%d window",
                   pad[0], pad[1], k[0], k[1]);
        diag_hint("PyTorch allows pad <= kernel/2");
        return sema_error();
    }
    int64_t P = window_out(x->shape.dim[2], k[0], st[0], pad[0], 1);
    int64_t Q = window_out(x->shape.dim[3], k[1], st[1], pad[1], 1);
    if (P < 1 || Q < 1) {
        diag_error(c->loc, "a %dx%d window does not fit input %s", k[0], k[1],
                   sema_shape_str(S, &x->shape));
        return sema_error();
    }
    IrOp op = strcmp(c->name, "maxpool2d") == 0 ? OP_MAXPOOL2D : OP_AVGPOOL2D;
    IrNode *y = sema_node(S, op, ir_shape(4, x->shape.dim[0], x->shape.dim[1], P, Q), DT_F32,
                          c->loc, 1, x, NULL, NULL);
    memcpy(y->attr.kernel, k, sizeof k);
    memcpy(y->attr.stride, st, sizeof st);
    memcpy(y->attr.pad, pad, sizeof pad);
    return sema_tensor(y);
}

/* A running statistic: a parameter the optimizer never touches (PyTorch's "buffer"). */
static IrParam *new_buffer(Sema *S, const char *name, IrShape shape, IrInit init, IrDtype file_dt,
                           SrcLoc loc) {
    IrParam *p = sema_new_param(S, name, shape, init, 0, loc);
    if (p) p->trainable = 0, p->buffer = 1, p->file_dtype = file_dt;
    return p;
}

/* torch.nn.BatchNorm2d: y = (x - mean) / sqrt(var + eps) * weight + bias per channel, with the
 * batch's statistics in training (updating running_mean/var with `momentum`) and the running
 * statistics in evaluation; frozen=true (PyTorch's bn.eval() during training) takes the running
 * statistics in training too and leaves them alone. Two IR nodes: BN_STATS (per-channel mean
 * and 1/std) and BN_APPLY (element-wise, so the fusion pass can merge it with a following add
 * and ReLU). */
static Value b_batchnorm2d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    double eps = arg_num(A, 1, 1e-5, 1e-12, 1), momentum = arg_num(A, 2, 0.1, 0, 1);
    int frozen = arg_bool(A, 3, 0);
    if (!A->ok) return sema_error();
    int64_t C = x->shape.dim[1];
    const char *name = sema_layer_name(S, label, "batchnorm2d");
    IrShape per_c = ir_shape(1, C);
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), per_c, INIT_ONES, 0, c->loc);
    IrParam *b = w ? sema_new_param(S, arena_printf(S->arena, "%s.bias", name), per_c, INIT_ZEROS, 0, c->loc) : NULL;
    IrParam *rm = b ? new_buffer(S, arena_printf(S->arena, "%s.running_mean", name), per_c, INIT_ZEROS, DT_F32, c->loc) : NULL;
    IrParam *rv = rm ? new_buffer(S, arena_printf(S->arena, "%s.running_var", name), per_c, INIT_ONES, DT_F32, c->loc) : NULL;
    IrParam *nb = rv ? new_buffer(S, arena_printf(S->arena, "%s.num_batches_tracked", name), ir_scalar_shape(),
                                  INIT_ZEROS, DT_I64, c->loc) : NULL;
    if (!nb) return sema_error();
    w->norm = b->norm = 1;
    IrNode *stats = sema_node(S, OP_BN_STATS, ir_shape(2, (int64_t)2, C), DT_F32, c->loc, 1, x, NULL, NULL);
    stats->attr.eps = eps;
    stats->attr.momentum = momentum;
    stats->attr.stat_param = rm->node->index;
    stats->attr.bn_frozen = frozen;
    IrNode *mean = sema_node(S, OP_ROW, per_c, DT_F32, c->loc, 1, stats, NULL, NULL);
    IrNode *invstd = sema_node(S, OP_ROW, per_c, DT_F32, c->loc, 1, stats, NULL, NULL);
    invstd->attr.row = 1;
    IrNode *y = sema_node(S, OP_BN_APPLY, x->shape, DT_F32, c->loc, 3, x, mean, invstd);
    y->in[3] = w->node;
    y->in[4] = b->node;
    y->n_in = 5;
    return sema_tensor(y);
}

/* torch.nn.AdaptiveAvgPool2d for output sizes that divide the input: an average pool. */
static Value b_adaptive_avgpool2d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    int out[2];
    arg_pair(A, 1, 1, 1, out);
    if (!A->ok) return sema_error();
    int64_t H = x->shape.dim[2], W = x->shape.dim[3];
    if (H % out[0] || W % out[1]) {
        diag_error(c->loc, "adaptive_avgpool2d to %dx%d needs the input's height and width (%s) to "
                   "be multiples of it", out[0], out[1], sema_shape_str(S, &x->shape));
        diag_hint("an output of 1 (global average pooling) works for any input");
        return sema_error();
    }
    IrNode *y = sema_node(S, OP_AVGPOOL2D, ir_shape(4, x->shape.dim[0], x->shape.dim[1], (int64_t)out[0],
                          (int64_t)out[1]), DT_F32, c->loc, 1, x, NULL, NULL);
    y->attr.kernel[0] = y->attr.stride[0] = (int)(H / out[0]);
    y->attr.kernel[1] = y->attr.stride[1] = (int)(W / out[1]);
    return sema_tensor(y);
}

static Value b_flatten(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_tensor(A, 0, 0, 1);
    if (!A->ok) return sema_error();
    int64_t n = x->shape.dim[0];
    return sema_tensor(reshape(S, x, ir_shape(2, n, ir_numel(&x->shape) / n), c->loc));
}

static Value b_reshape(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_tensor(A, 0, 0, 0);
    Value dims = A->a[1];
    if (!A->ok) return sema_error();
    if (dims.k != V_LIST || dims.n < 1 || dims.n > IR_MAX_RANK) {
        diag_error(arg_loc(c, "shape", 1), "the shape of reshape must be a list of 1 to %d integers",
                   IR_MAX_RANK);
        return sema_error();
    }
    IrShape s = {.rank = dims.n};
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < dims.n; i++) {
        Value d = dims.items[i];
        if (d.k != V_INT || d.i == 0 || d.i < -1 || (d.i == -1 && infer >= 0)) {
            diag_error(arg_loc(c, "shape", 1), "shape entries must be positive integers, with at most one -1");
            return sema_error();
        }
        if (d.i == -1) infer = i;
        else if (!checked_mul(known, d.i, &known) || known > IR_MAX_NUMEL) known = IR_MAX_NUMEL + 1;
        s.dim[i] = d.i;
    }
    int64_t n = ir_numel(&x->shape);
    if (infer >= 0 && known <= n && n % known == 0) s.dim[infer] = n / known;
    if ((infer >= 0 && (known > n || n % known)) || (infer < 0 && known != n)) {
        diag_error(c->loc, "cannot reshape %s (%lld elements) to the requested shape",
                   sema_shape_str(S, &x->shape), (long long)n);
        return sema_error();
    }
    return sema_tensor(reshape(S, x, s, c->loc));
}

/* expand(x, shape): x broadcast to `shape` as torch's expand: numpy's rules from the last axis
 * (each axis of x equal to the shape's or 1, new axes in front), -1 keeping x's own axis. The
 * gradient sums over the broadcast axes. */
static Value b_expand(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    Value dims = A->a[1];
    if (!A->ok) return sema_error();
    const int r = x->shape.rank;
    IrShape s = {.rank = dims.n};
    int ok = dims.k == V_LIST && dims.n >= r && dims.n >= 1 && dims.n <= IR_MAX_RANK;
    for (int i = 0; ok && i < dims.n; i++) {
        const int xa = i - (dims.n - r); /* x's axis, or < 0 for a new one */
        const Value d = dims.items[i];
        ok = d.k == V_INT && (d.i >= 1 || (d.i == -1 && xa >= 0));
        s.dim[i] = ok && d.i == -1 ? x->shape.dim[xa] : d.i;
    }
    if (!ok) {
        diag_error(arg_loc(c, "shape", 1), "the shape of expand must be a list of %d to %d positive integers "
                   "(-1 keeps an axis of x), found %s", r > 1 ? r : 1, IR_MAX_RANK, sema_value_text(S, dims));
        return sema_error();
    }
    for (int a = 0; a < r; a++) {
        const int64_t from = x->shape.dim[a], to = s.dim[a + s.rank - r];
        if (from != 1 && from != to) {
            diag_error(c->loc, "expand of shape %s to %s: axis %d of x has %lld, which broadcasts only from 1",
                       sema_shape_str(S, &x->shape), sema_shape_str(S, &s), a, (long long)from);
            diag_hint("each axis of x must equal the shape's or be 1 (numpy broadcasting, from the last axis)");
            return sema_error();
        }
    }
    if (!sema_check_shape(S, &s, c->loc)) return sema_error();
    if (ir_shape_eq(&s, &x->shape)) return sema_tensor(x);
    return sema_tensor(sema_node(S, OP_EXPAND, s, x->dtype, c->loc, 1, x, NULL, NULL));
}

static double num_relu(double x) { return x > 0 ? x : 0; }
static double num_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double num_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double num_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
}
static double num_silu(double x) { return x * num_sigmoid(x); }
static double num_same(double x) { return x; }

/* The one-operand element-wise builtins: the operator each makes, the least rank of its
 * operand, and what it computes on a compile-time number (`sqrt(2 * fan_in)`), with the numbers
 * it is defined on there. (softmax and log_softmax, along an axis, are b_softmax.) */
typedef enum {
    DOMAIN_ALL,      /* every number */
    DOMAIN_NONNEG,   /* x >= 0 */
    DOMAIN_POSITIVE, /* x > 0 */
    DOMAIN_ABOVE_M1, /* x > -1 */
} NumDomain;

static const struct {
    const char *name;
    IrOp op;
    int min_rank;
    double (*num)(double);
    NumDomain domain;
} unary_ops[] = {
    {"relu", OP_RELU, 0, num_relu, DOMAIN_ALL}, {"sigmoid", OP_SIGMOID, 0, num_sigmoid, DOMAIN_ALL},
    {"tanh", OP_TANH, 0, tanh, DOMAIN_ALL},     {"gelu", OP_GELU, 0, num_gelu, DOMAIN_ALL},
    {"exp", OP_EXP, 0, exp, DOMAIN_ALL},        {"log", OP_LOG, 0, log, DOMAIN_POSITIVE},
    {"sqrt", OP_SQRT, 0, sqrt, DOMAIN_NONNEG},  {"silu", OP_SILU, 0, num_silu, DOMAIN_ALL},
    {"sin", OP_SIN, 0, sin, DOMAIN_ALL},        {"cos", OP_COS, 0, cos, DOMAIN_ALL},
    {"log1p", OP_LOG1P, 0, log1p, DOMAIN_ABOVE_M1}, {"expm1", OP_EXPM1, 0, expm1, DOMAIN_ALL},
    {"detach", OP_DETACH, 0, num_same, DOMAIN_ALL},
};

/* A unary function of a compile-time number: a number, or an error naming the value. */
static Value unary_number(Sema *S, const AstExpr *c, Value v, double (*fn)(double), NumDomain d) {
    double x = sema_num(v);
    if ((d == DOMAIN_NONNEG && !(x >= 0)) || (d == DOMAIN_POSITIVE && !(x > 0)) ||
        (d == DOMAIN_ABOVE_M1 && !(x > -1))) {
        diag_error(c->loc, "%s of %s is not defined", c->name, sema_value_text(S, v));
        return sema_error();
    }
    return sema_number_result(S, c, v, fn(x));
}

Value sema_number_result(Sema *S, const AstExpr *c, Value v, double y) {
    if (!isfinite(y)) {
        diag_error(c->loc, "%s of %s overflows", c->name, sema_value_text(S, v));
        return sema_error();
    }
    return sema_float(y);
}

static Value b_unary(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    size_t i = 0, n = sizeof unary_ops / sizeof *unary_ops;
    while (i < n && strcmp(unary_ops[i].name, c->name) != 0) i++;
    if (i == n) ICE("b_unary: %s", c->name);
    Value v = args[0];
    if ((v.k == V_INT || v.k == V_FLOAT) && unary_ops[i].num)
        return unary_number(S, c, v, unary_ops[i].num, unary_ops[i].domain);
    IrNode *x = arg_tensor(A, 0, 0, unary_ops[i].min_rank);
    if (!A->ok) return sema_error();
    return sema_tensor(sema_node(S, unary_ops[i].op, x->shape, x->dtype, c->loc, 1, x, NULL, NULL));
}

/* gelu(x, approximate="none"): the exact form (OP_GELU, as torch.nn.GELU()), or with
 * approximate="tanh" the tanh form (OP_GELU_TANH, GPT-2's, torch.nn.GELU(approximate='tanh')). */
static Value b_gelu(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    const char *approx = arg_str(A, 1, "none");
    if (!A->ok) return sema_error();
    if (strcmp(approx, "none") == 0) return b_unary(S, c, label, args);
    if (strcmp(approx, "tanh") != 0) {
        diag_error(arg_at(A, 1), "'approximate' of gelu must be \"none\" or \"tanh\", found \"%s\"", approx);
        return sema_error();
    }
    Value v = args[0];
    if (v.k == V_INT || v.k == V_FLOAT) return unary_number(S, c, v, num_gelu_tanh, DOMAIN_ALL);
    IrNode *x = arg_tensor(A, 0, 0, 0);
    if (!A->ok) return sema_error();
    return sema_tensor(sema_node(S, OP_GELU_TANH, x->shape, x->dtype, c->loc, 1, x, NULL, NULL));
}


/* The axis argument i of a builtin on x (arg_axis), or def when it is not given. */
static int arg_axis_or(Args *A, int i, const IrNode *x, int def) {
    if (A->a[i].k == V_NONE) return def;
    int axis = arg_axis(A, i, &x->shape);
    return axis < 0 ? def : axis;
}

/* softmax(x, axis=-1) and log_softmax(x, axis=-1) along any axis of an f32 tensor. */
static Value b_softmax(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    if (!A->ok) return sema_error();
    int axis = arg_axis_or(A, 1, x, x->shape.rank - 1);
    if (!A->ok) return sema_error();
    IrOp op = strcmp(c->name, "log_softmax") == 0 ? OP_LOG_SOFTMAX : OP_SOFTMAX;
    IrNode *y = sema_node(S, op, x->shape, x->dtype, c->loc, 1, x, NULL, NULL);
    y->attr.axis = axis;
    return sema_tensor(y);
}

/* layernorm(x, eps=1e-5, bias=true), torch.nn.LayerNorm(D) over the last axis D, and
 * rmsnorm(x, eps=1e-6), LlamaRMSNorm: parameters <label>.weight [D] (ones) and, for layernorm
 * with bias, <label>.bias [D] (zeros). One row kernel each (LAYERNORM, RMSNORM); a layernorm
 * without a bias reads zeros as its bias. */
static Value b_norm(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    int ln = strcmp(c->name, "layernorm") == 0;
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    double eps = arg_num(A, 1, ln ? 1e-5 : 1e-6, 0, 1);
    int bias = ln ? arg_bool(A, 2, 1) : 0;
    if (!A->ok) return sema_error();
    int64_t D = x->shape.dim[x->shape.rank - 1];
    const char *name = sema_layer_name(S, label, c->name);
    IrShape per_d = ir_shape(1, D);
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), per_d, INIT_ONES, 0, c->loc);
    if (!w) return sema_error();
    w->norm = 1;
    IrNode *b = NULL;
    if (bias) {
        IrParam *bp = sema_new_param(S, arena_printf(S->arena, "%s.bias", name), per_d, INIT_ZEROS, 0, c->loc);
        if (!bp) return sema_error();
        bp->norm = 1;
        b = bp->node;
    } else if (ln) {
        b = sema_node(S, OP_EXPAND, per_d, DT_F32, c->loc, 1, ir_const(S->g, 0.0, DT_F32, c->loc), NULL, NULL);
    }
    IrNode *y = sema_node(S, ln ? OP_LAYERNORM : OP_RMSNORM, x->shape, DT_F32, c->loc, ln ? 3 : 2, x, w->node, b);
    y->attr.norm_eps = eps;
    return sema_tensor(y);
}

static Value b_dropout(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_tensor(A, 0, 0, 0);
    double p = arg_num_in(A, 1, 0.5, 0, 1, 1);
    if (!A->ok) return sema_error();
    if (p == 0) return sema_tensor(x);
    IrNode *y = sema_node(S, OP_DROPOUT, x->shape, x->dtype, c->loc, 1, x, NULL, NULL);
    y->attr.p = p;
    y->attr.seed_id = S->g->n_dropout++;
    return sema_tensor(y);
}

/* x, unless it is a permute that swaps exactly its last two axes (transpose(w)): then that
 * permute's operand, with *t = 1, so that the product reads it transposed (trans_a/trans_b)
 * instead of a copy. A permute no product or other node reads is dropped at the end of sema. */
static IrNode *untranspose(IrNode *x, int *t) {
    int r = x->shape.rank;
    *t = 0;
    if (x->op != OP_PERMUTE) return x;
    for (int i = 0; i < r - 2; i++)
        if (x->attr.perm[i] != i) return x;
    if (x->attr.perm[r - 2] != r - 1 || x->attr.perm[r - 1] != r - 2) return x;
    *t = 1;
    return x->in[0];
}

/* The node x broadcast to batch axes `batch` followed by its own last two axes: x itself when
 * it has them already, else an EXPAND, which materialises the copy (a product's operand must be
 * a plain row-major matrix per batch; broadcast batch axes that differ are rare enough). */
static IrNode *to_batch(Sema *S, IrNode *x, const IrShape *batch, SrcLoc loc) {
    IrShape s = *batch;
    s.rank = batch->rank + 2;
    s.dim[s.rank - 2] = x->shape.dim[x->shape.rank - 2];
    s.dim[s.rank - 1] = x->shape.dim[x->shape.rank - 1];
    if (ir_shape_eq(&s, &x->shape)) return x;
    return sema_node(S, OP_EXPAND, s, x->dtype, loc, 1, x, NULL, NULL);
}

/* a @ b with numpy's rules: a [..., M, K], b [..., K, N] with batch axes that broadcast, both
 * of rank 2 or more. b of rank 2: a's leading axes fold into M around one rank-2 product
 * (reshape views, no copy); else the batch axes fold into one around the rank-3 batched
 * product. A transpose of an operand's last two axes becomes the product's trans flag. */
IrNode *sema_matmul(Sema *S, IrNode *a, IrNode *b, SrcLoc loc) {
    int ra = a->shape.rank, rb = b->shape.rank;
    int64_t K = a->shape.dim[ra - 1], M = a->shape.dim[ra - 2], N = b->shape.dim[rb - 1];
    IrShape ba = {.rank = ra - 2}, bb = {.rank = rb - 2}, batch;
    for (int i = 0; i < ra - 2; i++) ba.dim[i] = a->shape.dim[i];
    for (int i = 0; i < rb - 2; i++) bb.dim[i] = b->shape.dim[i];
    if (K != b->shape.dim[rb - 2]) {
        diag_error(loc, "matmul of shapes %s and %s: need [M,K]@[K,N] or [B,M,K]@[B,K,N]", sema_shape_str(S, &a->shape),
                   sema_shape_str(S, &b->shape));
        return NULL;
    }
    if (!ir_broadcast(&ba, &bb, &batch)) {
        diag_error(loc, "matmul of shapes %s and %s: the batch axes (all but the last two) do not broadcast",
                   sema_shape_str(S, &a->shape), sema_shape_str(S, &b->shape));
        diag_hint("a [..., M, K] @ b [..., K, N], batch axes equal or 1 (numpy broadcasting)");
        return NULL;
    }
    IrShape ys = batch;
    ys.rank = batch.rank + 2;
    ys.dim[ys.rank - 2] = M;
    ys.dim[ys.rank - 1] = N;
    if (!sema_check_shape(S, &ys, loc)) return NULL;
    int ta, tb;
    IrNode *a0 = untranspose(a, &ta), *b0 = untranspose(b, &tb);
    if (rb == 2 && (ra == 2 || !ta)) { /* [..., M, K] @ [K, N]: one product of rows * M */
        int64_t rows = ir_numel(&a->shape) / K;
        IrNode *y = sema_node(S, OP_MATMUL, ir_shape(2, rows, N), DT_F32, loc, 2,
                              reshape(S, a0, ir_shape(2, ta ? K : rows, ta ? rows : K), loc), b0, NULL);
        y->attr.trans_a = ta;
        y->attr.trans_b = tb;
        return reshape(S, y, ys, loc);
    }
    int64_t nb = ir_numel(&batch);
    IrNode *xa = to_batch(S, a0, &batch, loc), *xb = to_batch(S, b0, &batch, loc);
    const int64_t *da = &xa->shape.dim[xa->shape.rank - 2], *db = &xb->shape.dim[xb->shape.rank - 2];
    IrNode *y = sema_node(S, OP_MATMUL, ir_shape(3, nb, M, N), DT_F32, loc, 2,
                          reshape(S, xa, ir_shape(3, nb, da[0], da[1]), loc),
                          reshape(S, xb, ir_shape(3, nb, db[0], db[1]), loc), NULL);
    y->attr.trans_a = ta;
    y->attr.trans_b = tb;
    return reshape(S, y, ys, loc);
}

static Value b_matmul(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *a = arg_f32_tensor(A, 0, 0, 2), *b = arg_f32_tensor(A, 1, 0, 2);
    if (!A->ok) return sema_error();
    IrNode *y = sema_matmul(S, a, b, c->loc);
    return y ? sema_tensor(y) : sema_error();
}

/* Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention):
 * softmax(q k^T * scale + mask) v over the last two axes, one fused kernel (ATTENTION, or
 * ATTENTION_MASKED with the mask as a fourth operand). */
static Value b_attention(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *q = arg_f32_tensor(A, 0, 0, 2), *k = arg_f32_tensor(A, 1, 0, 2), *v = arg_f32_tensor(A, 2, 0, 2);
    int causal = arg_bool(A, 3, 0);
    Value mv = A->a[4];
    double scale = 0;
    if (A->a[5].k != V_NONE) scale = arg_num(A, 5, 1, -1e30, 1e30);
    double dropout = arg_num_in(A, 6, 0, 0, 1, 1); /* of the probabilities, in training */
    if (!A->ok) return sema_error();
    int r = q->shape.rank;
    if (!ir_attention_ok(q, k, v, NULL)) { /* the IR's rule for the operands (the mask follows) */
        diag_error(c->loc, "attention of q %s, k %s and v %s: need q [..., T, d], k [..., S, d] and v [..., S, e] "
                   "with the same leading axes (k and v may have fewer heads, a divisor of q's, in the last one)",
                   sema_shape_str(S, &q->shape), sema_shape_str(S, &k->shape), sema_shape_str(S, &v->shape));
        return sema_error();
    }
    if (A->a[5].k != V_NONE && !(scale != 0 && isfinite(scale))) {
        diag_error(arg_loc(c, "scale", 5), "'scale' of attention must be a finite number other than 0, found %s",
                   sema_value_text(S, A->a[5]));
        return sema_error();
    }
    int64_t Sk = k->shape.dim[r - 2];
    IrNode *mask = NULL;
    if (mv.k == V_ERR) return sema_error();
    if (mv.k != V_NONE) {
        IrShape scores = q->shape, s;
        scores.dim[r - 1] = Sk;
        if (mv.k != V_TENSOR || (mv.t->dtype != DT_F32 && mv.t->dtype != DT_U8)) {
            diag_error(arg_loc(c, "mask", 4), "'mask' of attention must be an f32 tensor (added to the scores) or a u8 "
                       "tensor (0 leaves a key out), found %s", sema_value_desc(S, mv));
            return sema_error();
        }
        if (mv.t->shape.rank > r || !ir_broadcast(&mv.t->shape, &scores, &s) || !ir_shape_eq(&s, &scores)) {
            diag_error(arg_loc(c, "mask", 4), "a mask of shape %s does not broadcast to the scores' shape %s "
                       "([..., T, S] of q %s and k %s)", sema_shape_str(S, &mv.t->shape),
                       sema_shape_str(S, &scores), sema_shape_str(S, &q->shape), sema_shape_str(S, &k->shape));
            return sema_error();
        }
        mask = mv.t;
    }
    if (A->a[5].k == V_NONE) scale = 1.0 / sqrt((double)q->shape.dim[r - 1]);
    IrShape ys = q->shape;
    ys.dim[r - 1] = v->shape.dim[r - 1];
    if (!sema_check_shape(S, &ys, c->loc)) return sema_error();
    IrNode *y = sema_node(S, mask ? OP_ATTENTION_MASKED : OP_ATTENTION, ys, DT_F32, c->loc, 3, q, k, v);
    if (mask) y->in[3] = mask, y->n_in = 4;
    y->attr.causal = causal;
    y->attr.attn_scale = scale;
    if (dropout > 0) y->attr.p = dropout, y->attr.seed_id = S->g->n_dropout++;
    return sema_tensor(y);
}

static Value b_cast(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    IrDtype dt;
    ir_dtype_from_name(c->name, &dt);
    Value v = args[0];
    if (v.k == V_ERR) return v;
    int int_dt = dt == DT_I32 || dt == DT_I64 || dt == DT_U8;
    if (v.k == V_INT || v.k == V_FLOAT)
        return int_dt ? sema_int((int64_t)sema_num(v)) : sema_float(sema_num(v));
    if (v.k != V_TENSOR) {
        diag_error(c->loc, "%s() converts a tensor or a number, found %s", c->name, sema_value_text(S, v));
        return sema_error();
    }
    if (v.t->dtype == dt) return v;
    return sema_tensor(sema_node(S, OP_CAST, v.t->shape, dt, c->loc, 1, v.t, NULL, NULL));
}

/* str(x): a compile-time value as text, for names built in loops: "layer" + str(i). */
static Value b_str(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    Value v = args[0];
    switch (v.k) {
    case V_ERR: return v;
    case V_STR: return v;
    case V_INT: return (Value){.k = V_STR, .s = arena_printf(S->arena, "%lld", (long long)v.i)};
    case V_FLOAT: return (Value){.k = V_STR, .s = arena_printf(S->arena, "%.17g", v.f)};
    case V_BOOL: return (Value){.k = V_STR, .s = v.i ? "true" : "false"};
    default:
        diag_error(c->loc, "str() converts an integer, a number, a boolean or a string, found %s",
                   sema_value_desc(S, v));
        return sema_error();
    }
}

static Value b_param(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    Value dims = A->a[0];
    const char *init = arg_str(A, 1, "normal");
    double std = arg_num(A, 2, 1.0, 0, 1e6), a = arg_num(A, 3, 1.0, 0, 1e6), value = arg_num(A, 4, 0, -1e6, 1e6);
    if (!A->ok) return sema_error();
    IrShape s = {.rank = dims.n};
    int ok = dims.k == V_LIST && dims.n <= IR_MAX_RANK;
    for (int i = 0; ok && i < dims.n; i++) {
        ok = dims.items[i].k == V_INT && dims.items[i].i >= 1;
        s.dim[i] = dims.items[i].i;
    }
    if (!ok) {
        diag_error(arg_loc(c, "shape", 0), "param's shape must be a list of up to %d positive integers",
                   IR_MAX_RANK);
        return sema_error();
    }
    IrInit kind = INIT_NORMAL;
    double ia = std;
    if (strcmp(init, "zeros") == 0) kind = INIT_ZEROS;
    else if (strcmp(init, "ones") == 0) kind = INIT_ONES;
    else if (strcmp(init, "uniform") == 0) kind = INIT_UNIFORM, ia = a;
    else if (strcmp(init, "constant") == 0) kind = INIT_CONST, ia = value;
    else if (strcmp(init, "normal") != 0) {
        diag_error(arg_loc(c, "init", 1), "unknown init \"%s\"", init);
        diag_hint("init is \"zeros\", \"ones\", \"constant\" (with value), \"uniform\" or \"normal\"");
        return sema_error();
    }
    IrParam *p = sema_new_param(S, sema_layer_name(S, label, "param"), s, kind, ia, c->loc);
    return p ? sema_tensor(p->node) : sema_error();
}

/* ---- views, copies along axes and reductions over chosen axes */

/* An axis number for a tensor of `rank` axes, negative from the end; -1 after an error naming
 * `what`, the shape and the value. */
int sema_axis(Sema *S, Value v, SrcLoc loc, const char *what, const IrShape *shape) {
    if (v.k == V_ERR) return -1;
    int r = shape->rank;
    if (v.k != V_INT || v.i < -r || v.i >= r) {
        if (r == 0) diag_error(loc, "%s: a scalar has no axes, found %s", what, sema_value_text(S, v));
        else
            diag_error(loc, "%s must be an axis of shape %s: an integer in [%d, %d], found %s", what,
                       sema_shape_str(S, shape), -r, r - 1, sema_value_text(S, v));
        return -1;
    }
    return (int)(v.i < 0 ? v.i + r : v.i);
}

int arg_axis(Args *A, int i, const IrShape *shape) {
    char what[64];
    snprintf(what, sizeof what, "'%s' of %s", A->b->params[i], A->b->name);
    int axis = sema_axis(A->S, A->a[i], arg_at(A, i), what, shape);
    if (axis < 0) A->ok = 0;
    return axis;
}

/* x with its axes permuted (output axis i is x's axis perm[i]): x itself for the identity. */
IrNode *sema_permute(Sema *S, IrNode *x, const int *perm, SrcLoc loc) {
    int identity = 1;
    IrShape s = x->shape;
    for (int i = 0; i < x->shape.rank; i++) {
        s.dim[i] = x->shape.dim[perm[i]];
        identity &= perm[i] == i;
    }
    if (identity) return x;
    IrNode *y = sema_node(S, OP_PERMUTE, s, x->dtype, loc, 1, x, NULL, NULL);
    memcpy(y->attr.perm, perm, sizeof y->attr.perm);
    return y;
}

/* x[..., start : start + len, ...] along axis: x itself for the whole axis. */
IrNode *sema_slice(Sema *S, IrNode *x, int axis, int64_t start, int64_t len, SrcLoc loc) {
    if (start == 0 && len == x->shape.dim[axis]) return x;
    IrShape s = x->shape;
    s.dim[axis] = len;
    IrNode *y = sema_node(S, OP_SLICE, s, x->dtype, loc, 1, x, NULL, NULL);
    y->attr.axis = axis;
    y->attr.start = start;
    return y;
}

IrNode *sema_reshape(Sema *S, IrNode *x, IrShape shape, SrcLoc loc) { return reshape(S, x, shape, loc); }

/* a and b joined along axis (every other axis equal, one dtype: checked by the caller) */
IrNode *sema_concat(Sema *S, IrNode *a, IrNode *b, int axis, SrcLoc loc) {
    IrShape s = a->shape;
    s.dim[axis] += b->shape.dim[axis];
    IrNode *y = sema_node(S, OP_CONCAT, s, a->dtype, loc, 2, a, b, NULL);
    y->attr.axis = axis;
    return y;
}

/* The tensor argument of a copy along axes: f32 or i64 (the dtypes the kernels move). */
static IrNode *arg_copy_tensor(Args *A, int i, int min_rank) {
    Value v = A->a[i];
    if (v.k == V_TENSOR && !ir_dtype_is_float(v.t->dtype)) {
        if (v.t->dtype != DT_I64) {
            diag_error(arg_at(A, i), "'%s' of %s must be an f32 or i64 tensor, found %s", A->b->params[i], A->b->name,
                       sema_value_desc(A->S, v));
            A->ok = 0;
            return NULL;
        }
        if (v.t->shape.rank < min_rank) {
            diag_error(arg_at(A, i), "'%s' of %s must have at least %d axes, found shape %s", A->b->params[i],
                       A->b->name, min_rank, sema_shape_str(A->S, &v.t->shape));
            A->ok = 0;
            return NULL;
        }
        return v.t;
    }
    return arg_f32_tensor(A, i, 0, min_rank);
}

static Value b_permute(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_copy_tensor(A, 0, 1);
    if (!A->ok) return sema_error();
    Value axes = A->a[1];
    int r = x->shape.rank, perm[IR_MAX_RANK] = {0}, seen[IR_MAX_RANK] = {0};
    if (axes.k != V_LIST || axes.n != r) {
        diag_error(arg_loc(c, "axes", 1), "the axes of permute must be a list of %d axes of shape %s, found %s", r,
                   sema_shape_str(S, &x->shape), sema_value_text(S, axes));
        return sema_error();
    }
    for (int i = 0; i < r; i++) {
        int a = sema_axis(S, axes.items[i], arg_loc(c, "axes", 1), "each entry of permute's axes", &x->shape);
        if (a < 0) return sema_error();
        if (seen[a]++) {
            diag_error(arg_loc(c, "axes", 1), "permute's axes name axis %d twice", a);
            diag_hint("the axes must be a reordering of 0 .. %d", r - 1);
            return sema_error();
        }
        perm[i] = a;
    }
    return sema_tensor(sema_permute(S, x, perm, c->loc));
}

static Value b_transpose(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_copy_tensor(A, 0, 2);
    if (!A->ok) return sema_error();
    if (A->a[1].k == V_NONE) A->a[1] = sema_int(-2);
    if (A->a[2].k == V_NONE) A->a[2] = sema_int(-1);
    int a = arg_axis(A, 1, &x->shape), b = arg_axis(A, 2, &x->shape);
    if (!A->ok) return sema_error();
    int perm[IR_MAX_RANK] = {0};
    for (int i = 0; i < x->shape.rank; i++) perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return sema_tensor(sema_permute(S, x, perm, c->loc));
}

/* An index along an axis of extent n, negative from the end, in [0, n] when `end` (an
 * exclusive end) or [0, n) otherwise; -1 after an error. */
static int64_t slice_index(Args *A, int i, int64_t n, int64_t def, int end) {
    Value v = A->a[i];
    if (v.k == V_NONE) return def;
    if (v.k == V_ERR) return A->ok = 0, -1;
    int64_t hi = end ? n : n - 1;
    if (v.k != V_INT || v.i < -n || v.i > hi) {
        diag_error(arg_at(A, i), "'%s' of slice must be an integer in [%lld, %lld] for an axis of %lld, found %s",
                   A->b->params[i], (long long)-n, (long long)hi, (long long)n, sema_value_text(A->S, v));
        A->ok = 0;
        return -1;
    }
    return v.i < 0 ? v.i + n : v.i;
}

static Value b_slice(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_copy_tensor(A, 0, 1);
    if (!A->ok) return sema_error();
    int axis = arg_axis(A, 1, &x->shape);
    if (!A->ok) return sema_error();
    int64_t n = x->shape.dim[axis];
    int64_t start = slice_index(A, 2, n, 0, 0), end = slice_index(A, 3, n, n, 1);
    if (!A->ok) return sema_error();
    if (end <= start) {
        diag_error(c->loc, "slice of shape %s along axis %d from %lld to %lld is empty", sema_shape_str(S, &x->shape),
                   axis, (long long)start, (long long)end);
        diag_hint("the end is exclusive and must lie after the start");
        return sema_error();
    }
    return sema_tensor(sema_slice(S, x, axis, start, end - start, c->loc));
}

static Value b_split(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_copy_tensor(A, 0, 1);
    if (!A->ok) return sema_error();
    if (A->a[2].k == V_NONE) A->a[2] = sema_int(-1);
    int axis = arg_axis(A, 2, &x->shape);
    if (!A->ok) return sema_error();
    Value parts = A->a[1];
    int64_t n = x->shape.dim[axis], sizes[256];
    int k = 0;
    if (parts.k == V_INT) {
        if (parts.i < 1 || parts.i > 256 || n % parts.i) {
            diag_error(arg_loc(c, "parts", 1), "split of shape %s into %s parts along axis %d: the axis (%lld) must "
                       "be a multiple of a count in [1, 256]", sema_shape_str(S, &x->shape), sema_value_text(S, parts),
                       axis, (long long)n);
            return sema_error();
        }
        for (k = 0; k < parts.i; k++) sizes[k] = n / parts.i;
    } else {
        int64_t total = 0;
        int ok = parts.k == V_LIST && parts.n >= 1 && parts.n <= 256;
        for (k = 0; ok && k < parts.n; k++) {
            ok = parts.items[k].k == V_INT && parts.items[k].i >= 1 && parts.items[k].i <= n;
            if (ok) sizes[k] = parts.items[k].i, total += sizes[k];
        }
        if (!ok || total != n) {
            diag_error(arg_loc(c, "parts", 1), "split of shape %s along axis %d takes a number of equal parts or a "
                       "list of positive sizes adding up to %lld, found %s", sema_shape_str(S, &x->shape), axis,
                       (long long)n, sema_value_text(S, parts));
            return sema_error();
        }
        k = parts.n;
    }
    Value v = {.k = V_LIST, .n = k};
    v.items = arena_alloc(S->arena, (size_t)(k + 1) * sizeof *v.items);
    int64_t start = 0;
    for (int i = 0; i < k; i++) {
        v.items[i] = sema_tensor(sema_slice(S, x, axis, start, sizes[i], c->loc));
        start += sizes[i];
    }
    return v;
}

static Value b_concat(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    Value xs = args[0];
    if (xs.k == V_ERR) return xs;
    if (xs.k != V_LIST || xs.n < 1) {
        diag_error(arg_loc(c, "xs", 0), "concat takes a list of tensors, found %s", sema_value_text(S, xs));
        return sema_error();
    }
    IrNode *y = NULL;
    for (int i = 0; i < xs.n; i++) {
        Value v = xs.items[i];
        if (v.k != V_TENSOR || (!ir_dtype_is_float(v.t->dtype) && v.t->dtype != DT_I64) ||
            ir_dtype_is_half(v.t->dtype) || v.t->shape.rank < 1) {
            diag_error(arg_loc(c, "xs", 0), "concat joins f32 or i64 tensors of at least one axis, found %s as "
                       "item %d", sema_value_desc(S, v), i);
            return sema_error();
        }
        if (i == 0) continue;
        IrNode *b = v.t;
        const IrShape *s0 = &xs.items[0].t->shape;
        int axis = 0;
        if (args[1].k != V_NONE && (axis = sema_axis(S, args[1], arg_loc(c, "axis", 1), "'axis' of concat", s0)) < 0)
            return sema_error();
        IrShape s = y ? y->shape : *s0;
        int same = b->shape.rank == s.rank && b->dtype == xs.items[0].t->dtype;
        for (int d = 0; same && d < s.rank; d++) same = d == axis || b->shape.dim[d] == s.dim[d];
        if (!same) {
            diag_error(c->loc, "concat along axis %d: item %d, %s%s, does not fit item 0, %s%s", axis, i,
                       ir_dtype_name(b->dtype), sema_shape_str(S, &b->shape), ir_dtype_name(xs.items[0].t->dtype),
                       sema_shape_str(S, s0));
            diag_hint("every axis but the one joined must be equal, and the dtypes too");
            return sema_error();
        }
        s.dim[axis] += b->shape.dim[axis];
        if (!sema_check_shape(S, &s, c->loc)) return sema_error();
        y = sema_concat(S, y ? y : xs.items[0].t, b, axis, c->loc);
    }
    if (!y && args[1].k != V_NONE && sema_axis(S, args[1], arg_loc(c, "axis", 1), "'axis' of concat",
                                                &xs.items[0].t->shape) < 0)
        return sema_error();
    return sema_tensor(y ? y : xs.items[0].t);
}

/* The axes a reduction runs over: none = all, an int, or a list of ints; mask[i] set for each.
 * Returns the number of axes, or -1 after an error. */
static int arg_axes(Args *A, int i, const IrShape *shape, int mask[IR_MAX_RANK]) {
    Value v = A->a[i];
    memset(mask, 0, IR_MAX_RANK * sizeof *mask);
    if (v.k == V_NONE) {
        for (int d = 0; d < shape->rank; d++) mask[d] = 1;
        return shape->rank;
    }
    char what[64];
    snprintf(what, sizeof what, "'axis' of %s", A->b->name);
    Value one = v;
    int n = v.k == V_LIST ? v.n : 1;
    if (v.k == V_LIST && n == 0) {
        diag_error(arg_at(A, i), "%s: an empty list of axes", what);
        return A->ok = 0, -1;
    }
    for (int k = 0; k < n; k++) {
        if (v.k == V_LIST) one = v.items[k];
        int a = sema_axis(A->S, one, arg_at(A, i), what, shape);
        if (a < 0) return A->ok = 0, -1;
        if (mask[a]++) {
            diag_error(arg_at(A, i), "%s names axis %d twice", what, a);
            return A->ok = 0, -1;
        }
    }
    return n;
}

/* x summed over the masked axes, kept as axes of 1 (keepdim) or dropped, in f32 or the IR of
 * the whole-tensor SUM when every axis goes and none is kept. */
IrNode *sema_sum_axes(Sema *S, IrNode *x, const int *mask, int keepdim, SrcLoc loc) {
    IrShape kept = x->shape, dropped = {0};
    for (int d = 0; d < x->shape.rank; d++) {
        if (mask[d]) kept.dim[d] = 1;
        else dropped.dim[dropped.rank++] = x->shape.dim[d];
    }
    IrNode *y = ir_shape_eq(&kept, &x->shape) ? x : sema_node(S, OP_SUM_TO, kept, x->dtype, loc, 1, x, NULL, NULL);
    return keepdim ? y : reshape(S, y, dropped, loc);
}

static int64_t masked_count(const IrShape *s, const int *mask) {
    int64_t n = 1;
    for (int d = 0; d < s->rank; d++)
        if (mask[d]) n *= s->dim[d];
    return n;
}

static IrNode *scale(Sema *S, IrNode *x, double k, SrcLoc loc) {
    return sema_node(S, OP_MUL, x->shape, x->dtype, loc, 2, x, ir_const(S->g, k, x->dtype, loc), NULL);
}

/* sum(x) and mean(x) of every element keep their one-node IR (SUM, MEAN); with axis or
 * keepdim they are a SUM_TO (and a scale) with reshape views around it. */
static Value b_reduce(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_tensor(A, 0, 0, 0);
    int keepdim = arg_bool(A, 2, 0);
    if (!A->ok) return sema_error();
    int mean = strcmp(c->name, "mean") == 0;
    IrOp op = mean ? OP_MEAN : OP_SUM;
    if (A->a[1].k == V_NONE && !keepdim)
        return sema_tensor(sema_node(S, op, ir_scalar_shape(), x->dtype, c->loc, 1, x, NULL, NULL));
    int mask[IR_MAX_RANK];
    if (arg_axes(A, 1, &x->shape, mask) < 0 || !arg_refuse_half(A, 0, x)) return sema_error();
    IrNode *y = sema_sum_axes(S, x, mask, keepdim, c->loc);
    if (mean) y = scale(S, y, 1.0 / (double)masked_count(&x->shape, mask), c->loc);
    return sema_tensor(y);
}

/* var(x, axis, keepdim, correction): sum((x - mean)^2) / (n - correction) over the axes. */
static Value b_var(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    int keepdim = arg_bool(A, 2, 0);
    int64_t correction = arg_int(A, 3, 1, 0);
    int mask[IR_MAX_RANK];
    if (!A->ok || arg_axes(A, 1, &x->shape, mask) < 0) return sema_error();
    int64_t n = masked_count(&x->shape, mask);
    if (n - correction <= 0) {
        diag_error(c->loc, "var over %lld elements of shape %s with correction=%lld divides by %lld", (long long)n,
                   sema_shape_str(S, &x->shape), (long long)correction, (long long)(n - correction));
        diag_hint("the variance needs more elements than the correction (correction=0 is the biased variance)");
        return sema_error();
    }
    IrNode *m = scale(S, sema_sum_axes(S, x, mask, 1, c->loc), 1.0 / (double)n, c->loc);
    IrNode *d = sema_node(S, OP_SUB, x->shape, DT_F32, c->loc, 2, x, m, NULL);
    IrNode *sq = sema_node(S, OP_MUL, x->shape, DT_F32, c->loc, 2, d, d, NULL);
    return sema_tensor(scale(S, sema_sum_axes(S, sq, mask, keepdim, c->loc), 1.0 / (double)(n - correction), c->loc));
}

/* max(x, axis, keepdim=false) of a tensor along one axis; of two numbers, the larger. */
static Value b_max(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    Value a = args[0], b = args[1];
    if ((a.k == V_INT || a.k == V_FLOAT) && (b.k == V_INT || b.k == V_FLOAT) && args[2].k == V_NONE) {
        if (a.k == V_INT && b.k == V_INT) return sema_int(a.i > b.i ? a.i : b.i);
        return sema_float(sema_num(a) > sema_num(b) ? sema_num(a) : sema_num(b));
    }
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    int keepdim = arg_bool(A, 2, 0);
    if (!A->ok) return sema_error();
    int axis = arg_axis(A, 1, &x->shape);
    if (!A->ok) return sema_error();
    IrShape kept = x->shape;
    kept.dim[axis] = 1;
    IrNode *y = sema_node(S, OP_MAX, kept, DT_F32, c->loc, 1, x, NULL, NULL);
    y->attr.axis = axis;
    if (!keepdim) {
        IrShape s = {.rank = 0};
        for (int d = 0; d < x->shape.rank; d++)
            if (d != axis) s.dim[s.rank++] = x->shape.dim[d];
        y = reshape(S, y, s, c->loc);
    }
    return sema_tensor(y);
}

/* logsumexp(x, axis, keepdim=false) = m + log(sum(exp(x - m))) along one axis, with m the
 * maximum, or 0 where that is infinite, as torch.logsumexp. m is detached: the gradient is then
 * softmax(x) alone, as PyTorch's, with no term through m that would cancel only up to
 * rounding. */
static Value b_logsumexp(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    int keepdim = arg_bool(A, 2, 0);
    if (!A->ok) return sema_error();
    int axis = arg_axis(A, 1, &x->shape);
    if (!A->ok) return sema_error();
    SrcLoc at = c->loc;
    IrShape kept = x->shape, dropped = {0};
    kept.dim[axis] = 1;
    for (int d = 0; d < x->shape.rank; d++)
        if (d != axis) dropped.dim[dropped.rank++] = x->shape.dim[d];
    IrNode *m = sema_node(S, OP_MAX, kept, DT_F32, at, 1, x, NULL, NULL), *zero = ir_const(S->g, 0, DT_F32, at);
    m->attr.axis = axis;
    m = sema_node(S, OP_DETACH, kept, DT_F32, at, 1, m, NULL, NULL);
    IrNode *finite = sema_node(S, OP_EQ, kept, DT_U8, at, 2, sema_node(S, OP_SUB, kept, DT_F32, at, 2, m, m, NULL),
                               zero, NULL);
    m = sema_node(S, OP_WHERE, kept, DT_F32, at, 3, finite, m, zero);
    IrNode *e = sema_node(S, OP_EXP, x->shape, DT_F32, at, 1, sema_node(S, OP_SUB, x->shape, DT_F32, at, 2, x, m, NULL),
                          NULL, NULL);
    int mask[IR_MAX_RANK] = {0};
    mask[axis] = 1;
    IrNode *s = sema_node(S, OP_LOG, kept, DT_F32, at, 1, sema_sum_axes(S, e, mask, 1, at), NULL, NULL);
    IrNode *y = sema_node(S, OP_ADD, kept, DT_F32, at, 2, s, m, NULL);
    return sema_tensor(keepdim ? y : reshape(S, y, dropped, at));
}

/* ---- indices, masks and tied weights */

/* An integer tensor of indices (any shape), cast to i64 if needed. */
static IrNode *arg_indices(Args *A, int i) {
    Value v = A->a[i];
    if (v.k == V_ERR) {
        A->ok = 0;
        return NULL;
    }
    if (v.k != V_TENSOR || ir_dtype_is_float(v.t->dtype)) {
        diag_error(arg_at(A, i), "'%s' of %s must be an integer tensor of indices, found %s", A->b->params[i],
                   A->b->name, sema_value_desc(A->S, v));
        diag_hint("token ids are an i64 (or i32) input, e.g. `input tokens : i64[batch, seq]`");
        A->ok = 0;
        return NULL;
    }
    if (v.t->dtype == DT_I64) return v.t;
    return sema_node(A->S, OP_CAST, v.t->shape, DT_I64, v.t->loc, 1, v.t, NULL, NULL);
}

/* torch.nn.Embedding: weight [num, dim] ~ N(0, std^2); idx [...] -> [..., dim]. */
static Value b_embedding(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *idx = arg_indices(A, 0);
    int64_t num = arg_int(A, 1, 1, 1), dim = arg_int(A, 2, 1, 1);
    double std = arg_num(A, 3, 1.0, 0, 1e6);
    if (!A->ok) return sema_error();
    if (idx->shape.rank >= IR_MAX_RANK) {
        diag_error(arg_at(A, 0), "the indices of embedding have %d axes; at most %d fit, with the rows' axis",
                   idx->shape.rank, IR_MAX_RANK - 1);
        return sema_error();
    }
    IrShape ys = idx->shape;
    ys.dim[ys.rank++] = dim;
    if (!sema_check_shape(S, &ys, c->loc)) return sema_error();
    const char *name = sema_layer_name(S, label, "embedding");
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), ir_shape(2, num, dim), INIT_NORMAL,
                                std, c->loc);
    if (!w) return sema_error();
    return sema_tensor(sema_node(S, OP_GATHER, ys, DT_F32, c->loc, 2, w->node, idx, NULL));
}

/* A labeled call with a literal label path (no {expr} segment) in e, whose parameters' names
 * would begin with it, so that `name` could be one of them: "late" for "late.weight". */
static const AstExpr *label_of(Sema *S, const AstExpr *e, const char *name) {
    if (!e) return NULL;
    if (e->kind == AST_LABELED) {
        const char *path = "";
        int literal = 1;
        for (int i = 0; i < e->n_label && literal; i++) {
            literal = e->label[i].text != NULL;
            if (literal) path = i ? arena_printf(S->arena, "%s.%s", path, e->label[i].text) : e->label[i].text;
        }
        size_t n = strlen(path);
        if (literal && n && strncmp(name, path, n) == 0 && name[n] == '.') return e;
    }
    const AstExpr *hit = label_of(S, e->lhs, name);
    if (!hit) hit = label_of(S, e->rhs, name);
    for (int i = 0; !hit && i < e->n_args; i++) hit = label_of(S, e->args[i].value, name);
    for (int i = 0; !hit && i < e->n_items; i++) hit = label_of(S, e->items[i], name);
    return hit;
}

/* The same in statements (top level, loops and conditionals; not blocks, whose labels get the
 * caller's prefix). */
static const AstExpr *label_in(Sema *S, AstStmt *const *body, int n, const char *name) {
    const AstExpr *hit = NULL;
    for (int i = 0; i < n && !hit; i++) {
        const AstStmt *st = body[i];
        if (st->kind == STMT_BLOCK || st->kind == STMT_TRAIN) continue;
        hit = label_of(S, st->value, name);
        if (!hit) hit = label_in(S, st->body, st->n_body, name);
        if (!hit) hit = label_in(S, st->else_body, st->n_else, name);
    }
    return hit;
}

/* weight("name"): the tensor of a parameter defined above, to read it again (tied weights: the
 * gradients of both readers add up). */
static Value b_weight(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    const char *name = arg_str(A, 0, NULL);
    if (!A->ok) return sema_error();
    if (!name) {
        diag_error(c->loc, "weight() takes the name of a parameter, e.g. weight(\"embed.weight\")");
        return sema_error();
    }
    IrParam *p = ir_find_param(S->g, name);
    if (p) return sema_tensor(p->node);
    diag_error(arg_at(A, 0), "no parameter '%s' is defined before this point", name);
    const AstExpr *later = S->prog ? label_in(S, S->prog->stmts, S->prog->n_stmts, name) : NULL;
    if (later && later->loc.line > c->loc.line) {
        diag_note(later->loc, "this layer creates it, further down");
        diag_hint("weight() reads a parameter that exists when it runs: move that layer above this line");
        return sema_error();
    }
    Suggest sg;
    suggest_init(&sg, name);
    for (int i = 0; i < S->g->n_params; i++) suggest_try(&sg, S->g->params[i].name);
    sema_suggest_hint(&sg);
    diag_hint("weight() reads a parameter that a layer above created; a layer's parameters are named "
              "LABEL.weight, LABEL.bias (see --summary)");
    return sema_error();
}

/* where(c, a, b): a where c is nonzero, else b; a and b float tensors or numbers. */
static Value b_where(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    Value cv = A->a[0], av = A->a[1], bv = A->a[2];
    if (cv.k == V_ERR || av.k == V_ERR || bv.k == V_ERR) return sema_error();
    if (cv.k != V_TENSOR) {
        diag_error(arg_at(A, 0), "the condition of where must be a tensor, found %s", sema_value_text(S, cv));
        diag_hint("a mask such as iota([T, T], 0) >= iota([T, T], 1); a number is a compile-time `if`");
        return sema_error();
    }
    IrNode *x[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        Value v = k ? bv : av;
        if (v.k == V_TENSOR && !arg_refuse_half(A, k + 1, arg_tensor(A, k + 1, 0, 0))) return sema_error();
        if (v.k == V_TENSOR) x[k] = v.t;
        else if (v.k != V_INT && v.k != V_FLOAT) {
            diag_error(arg_at(A, k + 1), "'%s' of where must be a float tensor or a number, found %s",
                       A->b->params[k + 1], sema_value_text(S, v));
            return sema_error();
        }
    }
    if (!x[0] && !x[1]) {
        diag_error(c->loc, "where needs a tensor in 'a' or 'b'; both are numbers");
        return sema_error();
    }
    for (int k = 0; k < 2; k++)
        if (!x[k]) x[k] = ir_const(S->g, sema_num(k ? bv : av), DT_F32, c->loc);
    IrShape s;
    if (!ir_broadcast(&cv.t->shape, &x[0]->shape, &s) || !ir_broadcast(&s, &x[1]->shape, &s)) {
        diag_error(c->loc, "where: shapes %s, %s and %s do not broadcast", sema_shape_str(S, &cv.t->shape),
                   sema_shape_str(S, &x[0]->shape), sema_shape_str(S, &x[1]->shape));
        diag_hint("trailing dimensions must be equal or 1 (numpy broadcasting)");
        return sema_error();
    }
    return sema_tensor(sema_node(S, OP_WHERE, s, DT_F32, c->loc, 3, cv.t, x[0], x[1]));
}

/* iota(shape, axis): i64 [shape], each element its index along axis (negative: from the end). */
static Value b_iota(Sema *S, const AstExpr *c, const char *label, Value *args) {
    (void)label;
    BEGIN_ARGS(S, c, args);
    Value dims = A->a[0], av = A->a[1];
    if (dims.k == V_ERR || av.k == V_ERR) return sema_error();
    IrShape s = {.rank = dims.n};
    int ok = dims.k == V_LIST && dims.n >= 1 && dims.n <= IR_MAX_RANK;
    for (int i = 0; ok && i < dims.n; i++) {
        ok = dims.items[i].k == V_INT && dims.items[i].i >= 1;
        s.dim[i] = dims.items[i].i;
    }
    if (!ok) {
        diag_error(arg_at(A, 0), "the shape of iota must be a list of 1 to %d positive integers, found %s",
                   IR_MAX_RANK, sema_value_text(S, dims));
        return sema_error();
    }
    if (av.k != V_INT || av.i < -s.rank || av.i >= s.rank) {
        diag_error(arg_at(A, 1), "the axis of iota must be an integer in [%d, %d) for shape %s, found %s", -s.rank,
                   s.rank, sema_shape_str(S, &s), sema_value_text(S, av));
        return sema_error();
    }
    if (!sema_check_shape(S, &s, c->loc)) return sema_error();
    IrNode *n = sema_node(S, OP_IOTA, s, DT_I64, c->loc, 0, NULL, NULL, NULL);
    n->attr.axis = (int)(av.i < 0 ? av.i + s.rank : av.i);
    return sema_tensor(n);
}

/* ---- the table */

#define CAST(n) {n, "x", b_cast, 1, 1, {"x"}}
#define UNARY(n) {n, "x", b_unary, 1, 1, {"x"}}
static const SemaBuiltin builtins[] = {
    {"dense", "x, out, bias=true, transposed=false, std=none", b_dense, 2, 5, {"x", "out", "bias", "transposed", "std"}},
    {"conv2d", "x, out, k, stride=1, pad=0, dilation=1, groups=1, bias=true", b_conv2d, 3, 8,
     {"x", "out", "k", "stride", "pad", "dilation", "groups", "bias"}},
    {"maxpool2d", "x, k, stride=k, pad=0", b_pool, 2, 4, {"x", "k", "stride", "pad"}},
    {"avgpool2d", "x, k, stride=k, pad=0", b_pool, 2, 4, {"x", "k", "stride", "pad"}},
    {"batchnorm2d", "x, eps=1e-5, momentum=0.1, frozen=false", b_batchnorm2d, 1, 4, {"x", "eps", "momentum", "frozen"}},
    {"adaptive_avgpool2d", "x, out=1", b_adaptive_avgpool2d, 1, 2, {"x", "out"}},
    {"flatten", "x", b_flatten, 1, 1, {"x"}},
    {"reshape", "x, shape", b_reshape, 2, 2, {"x", "shape"}},
    {"expand", "x, shape", b_expand, 2, 2, {"x", "shape"}},
    {"layernorm", "x, eps=1e-5, bias=true", b_norm, 1, 3, {"x", "eps", "bias"}},
    {"rmsnorm", "x, eps=1e-6", b_norm, 1, 2, {"x", "eps"}},
    UNARY("relu"), UNARY("sigmoid"), UNARY("tanh"), UNARY("silu"),
    {"gelu", "x, approximate=\"none\"", b_gelu, 1, 2, {"x", "approximate"}},
    UNARY("exp"), UNARY("log"), UNARY("sqrt"), UNARY("sin"), UNARY("cos"),
    UNARY("log1p"), UNARY("expm1"), UNARY("detach"),
    {"softmax", "x, axis=-1", b_softmax, 1, 2, {"x", "axis"}},
    {"log_softmax", "x, axis=-1", b_softmax, 1, 2, {"x", "axis"}},
    {"dropout", "x, p=0.5", b_dropout, 1, 2, {"x", "p"}},
    {"matmul", "a, b", b_matmul, 2, 2, {"a", "b"}},
    {"attention", "q, k, v, causal=false, mask, scale=1/sqrt(d), dropout=0", b_attention, 3, 7,
     {"q", "k", "v", "causal", "mask", "scale", "dropout"}},
    CAST("f32"), CAST("f16"), CAST("bf16"), CAST("i32"), CAST("i64"), CAST("u8"),
    {"str", "x", b_str, 1, 1, {"x"}},
    {"param", "shape, init=\"normal\", std=1, a=1, value=0", b_param, 1, 5, {"shape", "init", "std", "a", "value"}},
    {"mean", "x, axis=none, keepdim=false", b_reduce, 1, 3, {"x", "axis", "keepdim"}},
    {"sum", "x, axis=none, keepdim=false", b_reduce, 1, 3, {"x", "axis", "keepdim"}},
    {"max", "x, axis, keepdim=false", b_max, 2, 3, {"x", "axis", "keepdim"}},
    {"logsumexp", "x, axis, keepdim=false", b_logsumexp, 2, 3, {"x", "axis", "keepdim"}},
    {"var", "x, axis=none, keepdim=false, correction=1", b_var, 1, 4, {"x", "axis", "keepdim", "correction"}},
    {"permute", "x, axes", b_permute, 2, 2, {"x", "axes"}},
    {"transpose", "x, a=-2, b=-1", b_transpose, 1, 3, {"x", "a", "b"}},
    {"slice", "x, axis, start, end=none", b_slice, 3, 4, {"x", "axis", "start", "end"}},
    {"split", "x, parts, axis=-1", b_split, 2, 3, {"x", "parts", "axis"}},
    {"concat", "xs, axis=0", b_concat, 1, 2, {"xs", "axis"}},
    {"cross_entropy", "logits, label, smoothing=0, ignore_index=none", sema_b_cross_entropy, 2, 4,
     {"logits", "label", "smoothing", "ignore_index"}},
    {"mse", "pred, target", sema_b_mse, 2, 2, {"pred", "target"}},
    {"bce_with_logits", "logits, target", sema_b_bce, 2, 2, {"logits", "target"}},
    {"l1", "pred, target", sema_b_l1, 2, 2, {"pred", "target"}},
    {"smooth_l1", "pred, target, beta=1", sema_b_smooth_l1, 2, 3, {"pred", "target", "beta"}},
    {"huber", "pred, target, delta=1", sema_b_smooth_l1, 2, 3, {"pred", "target", "delta"}},
    {"accuracy", "logits, label, ignore_index=none, top_k=1", sema_b_accuracy, 2, 4,
     {"logits", "label", "ignore_index", "top_k"}},
    {"embedding", "idx, num, dim, std=1", b_embedding, 3, 4, {"idx", "num", "dim", "std"}},
    {"weight", "name", b_weight, 1, 1, {"name"}},
    {"where", "c, a, b", b_where, 3, 3, {"c", "a", "b"}},
    {"abs", "x", sema_b_abs, 1, 1, {"x"}},
    {"leaky_relu", "x, negative_slope=0.01", sema_b_leaky_relu, 1, 2, {"x", "negative_slope"}},
    {"clamp", "x, min=none, max=none", sema_b_clamp, 1, 3, {"x", "min", "max"}},
    {"maximum", "a, b", sema_b_maximum, 2, 2, {"a", "b"}},
    {"minimum", "a, b", sema_b_minimum, 2, 2, {"a", "b"}},
    {"conv1d", "x, out, k, stride=1, pad=0, dilation=1, groups=1, bias=true", sema_b_conv1d, 3, 8,
     {"x", "out", "k", "stride", "pad", "dilation", "groups", "bias"}},
    {"conv_transpose2d", "x, out, k, stride=1, pad=0, output_padding=0, dilation=1, groups=1, bias=true",
     sema_b_conv_transpose2d, 3, 9, {"x", "out", "k", "stride", "pad", "output_padding", "dilation", "groups", "bias"}},
    {"groupnorm", "x, groups, eps=1e-5, affine=true", sema_b_groupnorm, 2, 4, {"x", "groups", "eps", "affine"}},
    {"upsample", "x, scale=2", sema_b_upsample, 1, 2, {"x", "scale"}},
    {"softplus", "x, beta=1, threshold=20", sema_b_softplus, 1, 3, {"x", "beta", "threshold"}},
    {"elu", "x, alpha=1", sema_b_elu, 1, 2, {"x", "alpha"}},
    {"celu", "x, alpha=1", sema_b_elu, 1, 2, {"x", "alpha"}},
    {"selu", "x", sema_b_elu, 1, 1, {"x"}},
    {"hardtanh", "x, min_val=-1, max_val=1", sema_b_hardtanh, 1, 3, {"x", "min_val", "max_val"}},
    {"relu6", "x", sema_b_hardtanh, 1, 1, {"x"}},
    {"mish", "x", sema_b_activation, 1, 1, {"x"}},
    {"hardsigmoid", "x", sema_b_activation, 1, 1, {"x"}},
    {"hardswish", "x", sema_b_activation, 1, 1, {"x"}},
    {"logsigmoid", "x", sema_b_activation, 1, 1, {"x"}},
    {"softsign", "x", sema_b_activation, 1, 1, {"x"}},
    {"prelu", "x, num_parameters=1, init=0.25", sema_b_prelu, 1, 3, {"x", "num_parameters", "init"}},
    {"glu", "x, axis=-1", sema_b_glu, 1, 2, {"x", "axis"}},
    {"lstm", "x, hidden, layers=1, batch_first=false", sema_b_rnn, 2, 4, {"x", "hidden", "layers", "batch_first"}},
    {"gru", "x, hidden, layers=1, batch_first=false", sema_b_rnn, 2, 4, {"x", "hidden", "layers", "batch_first"}},
    {"instancenorm2d", "x, eps=1e-5, affine=false", sema_b_instancenorm2d, 1, 3, {"x", "eps", "affine"}},
    {"maxpool1d", "x, k, stride=k, pad=0", sema_b_pool1d, 2, 4, {"x", "k", "stride", "pad"}},
    {"avgpool1d", "x, k, stride=k, pad=0", sema_b_pool1d, 2, 4, {"x", "k", "stride", "pad"}},
    {"one_hot", "idx, num", sema_b_one_hot, 2, 2, {"idx", "num"}},
    {"pad", "x, pads, mode=\"constant\", value=0", sema_b_pad, 2, 4, {"x", "pads", "mode", "value"}},
    {"normalize", "x, axis=1, eps=1e-12", sema_b_normalize, 1, 3, {"x", "axis", "eps"}},
    {"cosine_similarity", "a, b, axis=1, eps=1e-8", sema_b_cosine_similarity, 2, 4, {"a", "b", "axis", "eps"}},
    {"iota", "shape, axis", b_iota, 2, 2, {"shape", "axis"}},
};

const SemaBuiltin *sema_find_builtin(const char *name) {
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++)
        if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
    return NULL;
}

void sema_suggest_builtin(Suggest *s) {
    for (size_t i = 0; i < sizeof builtins / sizeof *builtins; i++) suggest_try(s, builtins[i].name);
}
