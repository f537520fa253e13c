/* sema_composed.c - built-ins composed of the IR's own operators, so that each needs no operator,
 * kernel or gradient rule of its own: their gradients follow from those of the operators they are
 * made of, they fuse and lay out like the rest, and both backends and the float64 reference of
 * the tests run them as they are.
 *
 * Element-wise: abs, clamp, leaky_relu, minimum, maximum, and a tensor raised to a number
 * (x ** p), each a where() over comparisons and arithmetic. The branches are chosen so that the
 * gradient at a kink is PyTorch's: abs'(0) = 0 (sign(0)), leaky_relu'(0) = the slope, clamp
 * passes the gradient on its bounds (min <= x <= max), and maximum and minimum split it in
 * halves at a tie. A value is NaN where an operand is, as in PyTorch: every comparison with NaN
 * is false, and the branch all comparisons fail picks the operand itself. On compile-time
 * numbers they compute numbers.
 *
 * Activations: torch.nn's softplus, elu, selu, celu, mish, hardtanh, relu6, hardsigmoid,
 * hardswish, logsigmoid, softsign, prelu and glu, with PyTorch's values and gradients at their
 * kinks; an exponential in a branch not taken has its operand held at 0 there.
 *
 * Layers: conv1d (a 2-D convolution of a 1 x k window), conv_transpose2d (a convolution's data
 * gradient), groupnorm and instancenorm2d (a layer norm over each group's values, then a
 * per-channel scale and shift), upsample (nearest-neighbour: an expand between two reshapes),
 * maxpool1d and avgpool1d (2-D poolings of a 1 x k window); normalize and cosine_similarity
 * (sums of squares), one_hot (an equality with an iota), pad (slices, concatenations and
 * expands).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sema_args.h"

static IrNode *num(Sema *S, double v, SrcLoc loc) { return ir_const(S->g, v, DT_F32, loc); }

static int is_number(Value v) { return v.k == V_INT || v.k == V_FLOAT; }

static IrShape broadcast(const IrNode *a, const IrNode *b) {
    IrShape s;
    if (!ir_broadcast(&a->shape, &b->shape, &s)) ICE("composed: shapes checked before");
    return s;
}

IrNode *sema_binary(Sema *S, IrOp op, IrNode *a, IrNode *b, SrcLoc loc) {
    IrDtype dt = op >= OP_EQ && op <= OP_GE ? DT_U8 : DT_F32;
    return sema_node(S, op, broadcast(a, b), dt, loc, 2, a, b, NULL);
}

/* c ? a : b, broadcast to all three */
static IrNode *where(Sema *S, IrNode *c, IrNode *a, IrNode *b, SrcLoc loc) {
    IrShape s = broadcast(c, a);
    if (!ir_broadcast(&s, &b->shape, &s)) ICE("composed: shapes checked before");
    return sema_node(S, OP_WHERE, s, DT_F32, loc, 3, c, a, b);
}

IrNode *sema_unary(Sema *S, IrOp op, IrNode *x, SrcLoc loc) {
    return sema_node(S, op, x->shape, DT_F32, loc, 1, x, NULL, NULL);
}

/* abs(x) = x < 0 ? -x : (x > 0 ? x : 0 * x): PyTorch's gradient sign(x), 0 at 0, and NaN for NaN */
IrNode *sema_abs(Sema *S, IrNode *x, SrcLoc at) {
    IrNode *zero = num(S, 0, at);
    IrNode *pos = where(S, sema_binary(S, OP_GT, x, zero, at), x, sema_binary(S, OP_MUL, x, zero, at), at);
    return where(S, sema_binary(S, OP_LT, x, zero, at), sema_unary(S, OP_NEG, x, at), pos, at);
}

Value sema_b_abs(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    if (args[0].k == V_INT && args[0].i != INT64_MIN) return sema_int(args[0].i < 0 ? -args[0].i : args[0].i);
    if (is_number(args[0])) return sema_float(fabs(sema_num(args[0])));
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    if (!A->ok) return sema_error();
    return sema_tensor(sema_abs(S, x, c->loc));
}

/* leaky_relu(x, negative_slope=0.01) = x > 0 ? x : slope * x, as torch.nn.LeakyReLU */
Value sema_b_leaky_relu(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    double slope = arg_num(A, 1, 0.01, -1e6, 1e6);
    if (is_number(args[0]) && A->ok) {
        double v = sema_num(args[0]);
        return sema_float(v > 0 ? v : slope * v);
    }
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    if (!A->ok) return sema_error();
    SrcLoc at = c->loc;
    IrNode *scaled = sema_binary(S, OP_MUL, x, num(S, slope, at), at);
    return sema_tensor(where(S, sema_binary(S, OP_GT, x, num(S, 0, at), at), x, scaled, at));
}

/* clamp(x, min=none, max=none) = x < min ? min : (x > max ? max : x): the gradient passes where
 * min <= x <= max, as torch.clamp's */
Value sema_b_clamp(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = is_number(args[0]) ? NULL : arg_f32_tensor(A, 0, 0, 0);
    int has_lo = args[1].k != V_NONE, has_hi = args[2].k != V_NONE;
    double lo = has_lo ? arg_num(A, 1, 0, -HUGE_VAL, HUGE_VAL) : 0;
    double hi = has_hi ? arg_num(A, 2, 0, -HUGE_VAL, HUGE_VAL) : 0;
    if (!A->ok) return sema_error();
    if (!has_lo && !has_hi) {
        diag_error(c->loc, "clamp needs 'min', 'max' or both");
        diag_hint("clamp(x, min = 0), clamp(x, max = 1), clamp(x, -1, 1)");
        return sema_error();
    }
    if (has_lo && has_hi && lo > hi) {
        diag_error(c->loc, "clamp: 'min' %g is above 'max' %g", lo, hi);
        return sema_error();
    }
    if (!x) { /* the operand or the bound it passes, as given (an integer stays one) */
        double v = sema_num(args[0]);
        return has_lo && v < lo ? args[1] : has_hi && v > hi ? args[2] : args[0];
    }
    SrcLoc at = c->loc;
    IrNode *y = x;
    if (has_hi) {
        IrNode *bound = num(S, hi, at);
        y = where(S, sema_binary(S, OP_GT, x, bound, at), bound, y, at);
    }
    if (has_lo) {
        IrNode *bound = num(S, lo, at);
        y = where(S, sema_binary(S, OP_LT, x, bound, at), bound, y, at);
    }
    return sema_tensor(y);
}

/* maximum(a, b) = a > b ? a : (a < b ? b : (a + b) / 2), minimum the same with < and >: at a
 * tie the value is a (a + a is exact, and so is halving it) and each side gets half the
 * gradient, as torch.maximum and torch.minimum give it. */
static IrNode *extremum_of(Sema *S, IrNode *a, IrNode *b, IrOp first, IrOp second, SrcLoc at) {
    IrNode *tie = sema_binary(S, OP_MUL, sema_binary(S, OP_ADD, a, b, at), num(S, 0.5, at), at);
    IrNode *rest = where(S, sema_binary(S, second, a, b, at), b, tie, at);
    return where(S, sema_binary(S, first, a, b, at), a, rest, at);
}

static Value extremum(Sema *S, const AstExpr *c, const char *label, Value *args, IrOp first, IrOp second) {
    BEGIN_ARGS(S, c, args);
    IrNode *x[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (!is_number(args[i])) x[i] = arg_f32_tensor(A, i, 0, 0);
    }
    if (!A->ok) return sema_error();
    if (!x[0] && !x[1]) {
        double a = sema_num(args[0]), b = sema_num(args[1]);
        int pick_a = first == OP_GT ? a >= b : a <= b;
        return pick_a ? args[0] : args[1];
    }
    for (int i = 0; i < 2; i++)
        if (!x[i]) x[i] = num(S, sema_num(args[i]), c->loc);
    IrShape s;
    if (!ir_broadcast(&x[0]->shape, &x[1]->shape, &s)) {
        diag_error(c->loc, "%s: shapes %s and %s do not broadcast", c->name, sema_shape_str(S, &x[0]->shape),
                   sema_shape_str(S, &x[1]->shape));
        diag_hint("trailing dimensions must be equal or 1 (numpy broadcasting)");
        return sema_error();
    }
    return sema_tensor(extremum_of(S, x[0], x[1], first, second, c->loc));
}

Value sema_b_maximum(Sema *S, const AstExpr *c, const char *label, Value *args) {
    return extremum(S, c, label, args, OP_GT, OP_LT);
}

Value sema_b_minimum(Sema *S, const AstExpr *c, const char *label, Value *args) {
    return extremum(S, c, label, args, OP_LT, OP_GT);
}

/* ---- activations: PyTorch's torch.nn ones, each with its value and its gradient at the kinks.
 * Where a branch not taken holds an exponential, its operand is held at 0 there, so that it
 * cannot overflow: where() passes the not-taken branch a zero gradient, and 0 * inf is NaN. */

/* An activation builds its nodes from x and its parameters k[], and computes the same function
 * of a compile-time number. */
typedef struct {
    IrNode *(*build)(Sema *S, IrNode *x, const double *k, SrcLoc at);
    double (*number)(double x, const double *k);
} Activation;

static Value activation(Args *A, Activation f, const double *k) {
    if (!A->ok) return sema_error();
    if (is_number(A->a[0])) return sema_number_result(A->S, A->call, A->a[0], f.number(sema_num(A->a[0]), k));
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    if (!A->ok) return sema_error();
    return sema_tensor(f.build(A->S, x, k, A->call->loc));
}

/* x * k, or x itself for k = 1 */
static IrNode *times(Sema *S, IrNode *x, double k, SrcLoc at) {
    return k == 1 ? x : sema_binary(S, OP_MUL, x, num(S, k, at), at);
}

/* softplus(x, beta=1, threshold=20) = log1p(exp(beta x)) / beta, and x where beta x > threshold,
 * as torch.nn.Softplus (k = beta, threshold) */
static IrNode *softplus_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    IrNode *bx = times(S, x, k[0], at), *zero = num(S, 0, at);
    IrNode *linear = sema_binary(S, OP_GT, bx, num(S, k[1], at), at);
    IrNode *y = sema_unary(S, OP_LOG1P, sema_unary(S, OP_EXP, where(S, linear, zero, bx, at), at), at);
    if (k[0] != 1) y = sema_binary(S, OP_DIV, y, num(S, k[0], at), at);
    return where(S, linear, x, y, at);
}
static double softplus_num(double x, const double *k) { return k[0] * x > k[1] ? x : log1p(exp(k[0] * x)) / k[0]; }

/* x > 0 ? scale x : alpha scale (exp(in_scale x) - 1), PyTorch's elu with its scale and
 * input_scale (k = alpha, scale, in_scale): elu, selu, celu. At 0 the value is 0 and the
 * gradient the negative side's (alpha scale in_scale), as PyTorch's. */
static IrNode *elu_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    IrNode *zero = num(S, 0, at), *pos = sema_binary(S, OP_GT, x, zero, at);
    IrNode *neg = sema_unary(S, OP_EXPM1, times(S, where(S, pos, zero, x, at), k[2], at), at);
    return where(S, pos, times(S, x, k[1], at), times(S, neg, k[0] * k[1], at), at);
}
static double elu_num(double x, const double *k) { return x > 0 ? k[1] * x : k[0] * k[1] * expm1(k[2] * x); }

/* mish(x) = x tanh(softplus(x)), torch.nn.Mish: softplus taken as x above 20 changes nothing,
 * tanh of either being 1 in float32 there */
static IrNode *mish_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    (void)k;
    const double sp[2] = {1, 20};
    return sema_binary(S, OP_MUL, x, sema_unary(S, OP_TANH, softplus_of(S, x, sp, at), at), at);
}
static double mish_num(double x, const double *k) {
    (void)k;
    return x * tanh(log1p(exp(x)));
}

/* hardtanh(x, min_val=-1, max_val=1): x held to [min_val, max_val] as clamp, but without a
 * gradient on the bounds, as torch.nn.Hardtanh; relu6 is hardtanh(x, 0, 6), torch.nn.ReLU6 */
static IrNode *hardtanh_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    IrNode *lo = num(S, k[0], at), *hi = num(S, k[1], at);
    IrNode *y = where(S, sema_binary(S, OP_GE, x, hi, at), hi, x, at);
    return where(S, sema_binary(S, OP_LE, x, lo, at), lo, y, at);
}
static double hardtanh_num(double x, const double *k) { return x <= k[0] ? k[0] : x >= k[1] ? k[1] : x; }

/* hardsigmoid(x): 0 up to -3, 1 from 3, (x + 3) / 6 between; no gradient at -3 and 3, as
 * torch.nn.Hardsigmoid */
static IrNode *hardsigmoid_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    (void)k;
    IrNode *mid = sema_binary(S, OP_DIV, sema_binary(S, OP_ADD, x, num(S, 3, at), at), num(S, 6, at), at);
    IrNode *y = where(S, sema_binary(S, OP_GE, x, num(S, 3, at), at), num(S, 1, at), mid, at);
    return where(S, sema_binary(S, OP_LE, x, num(S, -3, at), at), num(S, 0, at), y, at);
}
static double hardsigmoid_num(double x, const double *k) {
    (void)k;
    return x <= -3 ? 0 : x >= 3 ? 1 : (x + 3) / 6;
}

/* hardswish(x): 0 below -3, x above 3, x (x + 3) / 6 between, as torch.nn.Hardswish, whose
 * gradient x / 3 + 1/2 holds on both ends (-1/2 at -3, 3/2 at 3) */
static IrNode *hardswish_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    (void)k;
    IrNode *mid = sema_binary(S, OP_MUL, x, sema_binary(S, OP_ADD, x, num(S, 3, at), at), at);
    mid = sema_binary(S, OP_DIV, mid, num(S, 6, at), at);
    IrNode *y = where(S, sema_binary(S, OP_GT, x, num(S, 3, at), at), x, mid, at);
    return where(S, sema_binary(S, OP_LT, x, num(S, -3, at), at), num(S, 0, at), y, at);
}
static double hardswish_num(double x, const double *k) {
    (void)k;
    return x < -3 ? 0 : x > 3 ? x : x * (x + 3) / 6;
}

/* logsigmoid(x) = log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), PyTorch's form (gradient 1/2
 * at 0: the minimum's tie) */
static IrNode *logsigmoid_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    (void)k;
    IrNode *lo = extremum_of(S, x, num(S, 0, at), OP_LT, OP_GT, at);
    IrNode *e = sema_unary(S, OP_EXP, sema_unary(S, OP_NEG, sema_abs(S, x, at), at), at);
    IrNode *tail = sema_unary(S, OP_LOG1P, e, at);
    return sema_binary(S, OP_SUB, lo, tail, at);
}
static double logsigmoid_num(double x, const double *k) {
    (void)k;
    return fmin(x, 0) - log1p(exp(-fabs(x)));
}

/* softsign(x) = x / (1 + |x|), torch.nn.Softsign */
static IrNode *softsign_of(Sema *S, IrNode *x, const double *k, SrcLoc at) {
    (void)k;
    return sema_binary(S, OP_DIV, x, sema_binary(S, OP_ADD, sema_abs(S, x, at), num(S, 1, at), at), at);
}
static double softsign_num(double x, const double *k) {
    (void)k;
    return x / (fabs(x) + 1);
}

Value sema_b_softplus(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    double k[2] = {arg_num(A, 1, 1, -1e6, 1e6), arg_num(A, 2, 20, -1e6, 1e6)};
    if (A->ok && k[0] == 0) {
        diag_error(arg_loc(c, "beta", 1), "softplus: 'beta' must not be 0");
        return sema_error();
    }
    return activation(A, (Activation){softplus_of, softplus_num}, k);
}

/* elu(x, alpha=1), selu(x) and celu(x, alpha=1): torch.nn.ELU, SELU (its fixed alpha and
 * scale) and CELU (elu of x / alpha, times alpha) */
Value sema_b_elu(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    double k[3] = {1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1};
    if (strcmp(c->name, "selu") != 0) {
        k[0] = arg_num(A, 1, 1, -1e6, 1e6), k[1] = 1;
        if (A->ok && strcmp(c->name, "celu") == 0) {
            if (k[0] == 0) {
                diag_error(arg_loc(c, "alpha", 1), "celu: 'alpha' must not be 0");
                return sema_error();
            }
            k[2] = 1 / k[0];
        }
    }
    return activation(A, (Activation){elu_of, elu_num}, k);
}

Value sema_b_hardtanh(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    double k[2] = {0, 6}; /* relu6 */
    if (strcmp(c->name, "hardtanh") == 0) {
        k[0] = arg_num(A, 1, -1, -HUGE_VAL, HUGE_VAL), k[1] = arg_num(A, 2, 1, -HUGE_VAL, HUGE_VAL);
        if (A->ok && k[0] > k[1]) {
            diag_error(c->loc, "hardtanh: 'min_val' %g is above 'max_val' %g", k[0], k[1]);
            return sema_error();
        }
    }
    return activation(A, (Activation){hardtanh_of, hardtanh_num}, k);
}

/* The activations without parameters: mish, hardsigmoid, hardswish, logsigmoid, softsign. */
Value sema_b_activation(Sema *S, const AstExpr *c, const char *label, Value *args) {
    static const struct {
        const char *name;
        Activation f;
    } table[] = {
        {"mish", {mish_of, mish_num}},
        {"hardsigmoid", {hardsigmoid_of, hardsigmoid_num}},
        {"hardswish", {hardswish_of, hardswish_num}},
        {"logsigmoid", {logsigmoid_of, logsigmoid_num}},
        {"softsign", {softsign_of, softsign_num}},
    };
    BEGIN_ARGS(S, c, args);
    const double none = 0;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strcmp(table[i].name, c->name) == 0) return activation(A, table[i].f, &none);
    ICE("sema_b_activation: %s", c->name);
}

/* prelu(x, num_parameters=1, init=0.25) = x > 0 ? x : a x with learned slopes LABEL.weight
 * [num_parameters] (each init), one for all of x or one per channel (axis 1), as torch.nn.PReLU;
 * at 0 the gradient is the slope's side, as PyTorch's */
Value sema_b_prelu(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    int64_t n = arg_int(A, 1, 1, 1);
    double init = arg_num(A, 2, 0.25, -1e6, 1e6);
    if (!A->ok) return sema_error();
    const IrShape s = x->shape;
    if (n > 1 && (s.rank < 2 || s.dim[1] != n)) {
        diag_error(c->loc, "prelu with %lld slopes takes [N, %lld, ...] (one per channel), found shape %s",
                   (long long)n, (long long)n, sema_shape_str(S, &s));
        diag_hint("num_parameters = 1 (the default) shares one slope over the whole tensor");
        return sema_error();
    }
    SrcLoc at = c->loc;
    const char *name = sema_layer_name(S, label, c->name);
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), ir_shape(1, n), INIT_CONST, init, at);
    if (!w) return sema_error();
    IrShape per_c = {.rank = s.rank > 1 ? s.rank - 1 : 1, .dim = {n}}; /* [C, 1, ...] against [N, C, ...] */
    for (int i = 1; i < per_c.rank; i++) per_c.dim[i] = 1;
    IrNode *slope = sema_binary(S, OP_MUL, x, sema_reshape(S, w->node, per_c, at), at);
    return sema_tensor(where(S, sema_binary(S, OP_GT, x, num(S, 0, at), at), x, slope, at));
}

/* glu(x, axis=-1) = a * sigmoid(b) for the halves a, b of x along the axis, torch.nn.GLU */
Value sema_b_glu(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    if (!A->ok) return sema_error();
    if (A->a[1].k == V_NONE) A->a[1] = sema_int(-1);
    int axis = arg_axis(A, 1, &x->shape);
    if (!A->ok) return sema_error();
    int64_t n = x->shape.dim[axis];
    if (n % 2) {
        diag_error(c->loc, "glu halves axis %d of shape %s, which is odd (%lld)", axis, sema_shape_str(S, &x->shape),
                   (long long)n);
        return sema_error();
    }
    IrNode *a = sema_slice(S, x, axis, 0, n / 2, c->loc), *b = sema_slice(S, x, axis, n / 2, n / 2, c->loc);
    return sema_tensor(sema_binary(S, OP_MUL, a, sema_unary(S, OP_SIGMOID, b, c->loc), c->loc));
}

/* x ** p for a float tensor x and a number p: an integer from -8 to 8 as products of x (by
 * squaring; a negative power is 1 over the positive one, 0 ones, as torch.pow even where x is
 * NaN), 0.5 as sqrt(x) and -0.5 as 1 / sqrt(x). Other powers would need exp(p log x), wrong for
 * x < 0 where an integer power is defined, and are refused. */
Value sema_tensor_pow(Sema *S, Value base, Value power, SrcLoc loc) {
    if (!sema_want_float_tensor(S, base, loc, "the left operand of '**'")) return sema_error();
    IrNode *x = base.t;
    if (x->dtype != DT_F32) {
        diag_error(loc, "the left operand of '**' must be an f32 tensor, found %s", sema_value_desc(S, base));
        return sema_error();
    }
    double p = power.k == V_INT ? (double)power.i : power.k == V_FLOAT ? power.f : NAN;
    if (p == 0.5 || p == -0.5) {
        IrNode *r = sema_node(S, OP_SQRT, x->shape, DT_F32, loc, 1, x, NULL, NULL);
        return sema_tensor(p > 0 ? r : sema_binary(S, OP_DIV, num(S, 1, loc), r, loc));
    }
    if (!(p == floor(p) && fabs(p) <= 8)) {
        diag_error(loc, "a tensor's power must be an integer from -8 to 8, 0.5 or -0.5, found %s",
                   sema_value_text(S, power));
        diag_hint("write exp(p * log(x)) for another power of a positive x");
        return sema_error();
    }
    int n = (int)fabs(p);
    IrNode *y = NULL, *sq = x; /* y = x^(bits of n seen so far), sq = x^(2^k) */
    for (; n; n >>= 1) {
        if (n & 1) y = y ? sema_binary(S, OP_MUL, y, sq, loc) : sq;
        if (n > 1) sq = sema_binary(S, OP_MUL, sq, sq, loc);
    }
    if (!y) return sema_tensor(sema_node(S, OP_EXPAND, x->shape, DT_F32, loc, 1, num(S, 1, loc), NULL, NULL));
    return sema_tensor(p < 0 ? sema_binary(S, OP_DIV, num(S, 1, loc), y, loc) : y);
}

/* groupnorm(x, groups, eps=1e-5, affine=true) on x [N, C, ...]: torch.nn.GroupNorm. The values
 * of each sample's group of C / groups channels (with their spatial positions) are normalised by
 * their mean and biased variance: x reshaped to [N, groups, M] through a layer norm over M with
 * unit weight and zero bias, then LABEL.weight [C] (ones) and LABEL.bias [C] (zeros) per
 * channel. */
static Value group_norm(Sema *S, const AstExpr *c, const char *label, IrNode *x, int64_t groups, double eps,
                        int affine) {
    const IrShape shape = x->shape;
    const int64_t C = shape.dim[1], M = ir_numel(&shape) / shape.dim[0] / groups;
    SrcLoc at = c->loc;
    IrShape rows = {.rank = 3, .dim = {shape.dim[0], groups, M}}, per_m = ir_shape(1, M);
    IrNode *ones = sema_node(S, OP_EXPAND, per_m, DT_F32, at, 1, num(S, 1, at), NULL, NULL);
    IrNode *zeros = sema_node(S, OP_EXPAND, per_m, DT_F32, at, 1, num(S, 0, at), NULL, NULL);
    IrNode *y = sema_node(S, OP_LAYERNORM, rows, DT_F32, at, 3, sema_reshape(S, x, rows, at), ones, zeros);
    y->attr.norm_eps = eps;
    y = sema_reshape(S, y, shape, at);
    if (!affine) return sema_tensor(y);
    /* the per-channel parameters as [C, 1, ...], broadcast over the positions */
    const char *name = sema_layer_name(S, label, c->name);
    IrShape per_c = {.rank = shape.rank - 1, .dim = {C}};
    for (int i = 1; i < per_c.rank; i++) per_c.dim[i] = 1;
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), ir_shape(1, C), INIT_ONES, 0, at);
    IrParam *b = w ? sema_new_param(S, arena_printf(S->arena, "%s.bias", name), ir_shape(1, C), INIT_ZEROS, 0, at)
                   : NULL;
    if (!b) return sema_error();
    w->norm = b->norm = 1;
    y = sema_binary(S, OP_MUL, y, sema_reshape(S, w->node, per_c, at), at);
    return sema_tensor(sema_binary(S, OP_ADD, y, sema_reshape(S, b->node, per_c, at), at));
}

Value sema_b_groupnorm(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    int64_t groups = arg_int(A, 1, 1, 1);
    double eps = arg_num(A, 2, 1e-5, 0, 1);
    int affine = arg_bool(A, 3, 1);
    if (!A->ok) return sema_error();
    if (x->shape.rank < 2 || x->shape.dim[1] % groups) {
        diag_error(c->loc, "groupnorm of shape %s into %lld groups: needs [N, C, ...] with C a multiple of the "
                   "groups", sema_shape_str(S, &x->shape), (long long)groups);
        return sema_error();
    }
    return group_norm(S, c, label, x, groups, eps, affine);
}

/* instancenorm2d(x, eps=1e-5, affine=false) on x [N, C, H, W]: torch.nn.InstanceNorm2d (without
 * running statistics, its default): each sample's channel normalised over its positions, a
 * group norm of C groups; with affine, LABEL.weight and LABEL.bias [C]. */
Value sema_b_instancenorm2d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    double eps = arg_num(A, 1, 1e-5, 0, 1);
    int affine = arg_bool(A, 2, 0);
    if (!A->ok) return sema_error();
    return group_norm(S, c, label, x, x->shape.dim[1], eps, affine);
}

/* upsample(x, scale=2) on x [N, C, H, W]: nearest-neighbour, each value repeated scale x scale
 * times, as torch.nn.Upsample(scale_factor=scale) (mode "nearest"): x as [N, C, H, 1, W, 1],
 * expanded to [N, C, H, scale, W, scale], read as [N, C, H * scale, W * scale]. The gradient
 * sums each block of scale x scale. */
Value sema_b_upsample(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    int64_t k = arg_int(A, 1, 2, 1);
    if (!A->ok) return sema_error();
    const IrShape s = x->shape;
    if (s.rank != 4) {
        diag_error(c->loc, "upsample takes an image batch [N, C, H, W], found shape %s", sema_shape_str(S, &s));
        return sema_error();
    }
    IrShape spread = {.rank = 6, .dim = {s.dim[0], s.dim[1], s.dim[2], 1, s.dim[3], 1}};
    IrShape big = {.rank = 6, .dim = {s.dim[0], s.dim[1], s.dim[2], k, s.dim[3], k}};
    IrShape out = {.rank = 4, .dim = {s.dim[0], s.dim[1], s.dim[2] * k, s.dim[3] * k}};
    if (!sema_check_shape(S, &out, c->loc)) return sema_error();
    IrNode *y = sema_node(S, OP_EXPAND, big, DT_F32, c->loc, 1, sema_reshape(S, x, spread, c->loc), NULL, NULL);
    return sema_tensor(sema_reshape(S, y, out, c->loc));
}

/* conv1d(x, out, k, stride=1, pad=0, dilation=1, groups=1, bias=true) on x [N, C, L]:
 * torch.nn.Conv1d, with its parameters LABEL.weight [out, C / groups, k] and LABEL.bias [out]:
 * the 2-D convolution of x as [N, C, 1, L] with a 1 x k kernel (a view of the weight), read back
 * as [N, out, L']. */
Value sema_b_conv1d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 0);
    int64_t out = arg_int(A, 1, 1, 1);
    int64_t k = arg_int(A, 2, 1, 1), stride = arg_int(A, 3, 1, 1), pad = arg_int(A, 4, 0, 0);
    int64_t dil = arg_int(A, 5, 1, 1), groups = arg_int(A, 6, 1, 1);
    int bias = arg_bool(A, 7, 1);
    if (!A->ok) return sema_error();
    if (x->shape.rank != 3) {
        diag_error(c->loc, "conv1d takes a batch of sequences [N, C, L], found shape %s",
                   sema_shape_str(S, &x->shape));
        return sema_error();
    }
    if (k > 1 << 20 || stride > 1 << 20 || pad > 1 << 20 || dil > 1 << 20) {
        diag_error(c->loc, "conv1d: kernel %lld, stride %lld, padding %lld or dilation %lld is too large",
                   (long long)k, (long long)stride, (long long)pad, (long long)dil);
        return sema_error();
    }
    SemaConv v = {{1, (int)k}, {1, (int)stride}, {0, (int)pad}, {1, (int)dil}, groups, bias};
    const int64_t N = x->shape.dim[0], C = x->shape.dim[1], L = x->shape.dim[2];
    IrNode *y = sema_conv(S, c, label, sema_reshape(S, x, ir_shape(4, N, C, (int64_t)1, L), c->loc), out, &v, 3);
    if (!y) return sema_error();
    return sema_tensor(sema_reshape(S, y, ir_shape(3, N, out, y->shape.dim[3]), c->loc));
}

/* conv_transpose2d(x, out, k, stride=1, pad=0, output_padding=0, dilation=1, groups=1, bias=true)
 * on x [N, C, H, W]: torch.nn.ConvTranspose2d, the gradient of a convolution from `out` to C
 * channels with respect to its input (the IR's CONV2D_BWD_DATA, whose own gradients are that
 * convolution and its filter gradient). Its filter LABEL.weight is that convolution's,
 * [C, out / groups, kh, kw], as PyTorch stores it; LABEL.bias [out]; both U(-b, b) with
 * b = 1 / sqrt(out / groups * kh * kw), PyTorch's default. The output is [N, out, H', W'] with
 * H' = (H - 1) stride - 2 pad + dilation (kh - 1) + output_padding + 1, which the convolution
 * takes back to H: output_padding must be below the stride. */
Value sema_b_conv_transpose2d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 4, 4);
    int64_t out = arg_int(A, 1, 1, 1);
    SemaConv v;
    int extra[2];
    arg_pair(A, 2, 1, 1, v.k);
    arg_pair(A, 3, 1, 1, v.stride);
    arg_pair(A, 4, 0, 0, v.pad);
    arg_pair(A, 5, 0, 0, extra);
    arg_pair(A, 6, 1, 1, v.dil);
    v.groups = arg_int(A, 7, 1, 1);
    v.bias = arg_bool(A, 8, 1);
    if (!A->ok) return sema_error();
    const int64_t N = x->shape.dim[0], C = x->shape.dim[1];
    if (C % v.groups || out % v.groups) {
        diag_error(c->loc, "groups=%lld must divide both the input channels (%lld) and the output channels (%lld)",
                   (long long)v.groups, (long long)C, (long long)out);
        return sema_error();
    }
    if (extra[0] >= v.stride[0] || extra[1] >= v.stride[1]) {
        diag_error(arg_loc(c, "output_padding", 5), "conv_transpose2d: output_padding %d,%d must be below the "
                   "stride %d,%d", extra[0], extra[1], v.stride[0], v.stride[1]);
        diag_hint("output_padding picks among the outputs a strided convolution takes to the same size");
        return sema_error();
    }
    int64_t hw[2];
    for (int i = 0; i < 2; i++)
        hw[i] = (x->shape.dim[2 + i] - 1) * v.stride[i] - 2 * (int64_t)v.pad[i] + (int64_t)v.dil[i] * (v.k[i] - 1) +
                extra[i] + 1;
    if (hw[0] < 1 || hw[1] < 1) {
        diag_error(c->loc, "conv_transpose2d of %s with a %dx%d kernel (padding %d,%d) has an empty output",
                   sema_shape_str(S, &x->shape), v.k[0], v.k[1], v.pad[0], v.pad[1]);
        return sema_error();
    }
    IrShape ys = ir_shape(4, N, out, hw[0], hw[1]);
    if (!sema_check_shape(S, &ys, c->loc)) return sema_error();
    SrcLoc at = c->loc;
    const char *name = sema_layer_name(S, label, c->name);
    double bound = 1.0 / sqrt((double)(out / v.groups * v.k[0] * v.k[1]));
    IrShape filter = ir_shape(4, C, out / v.groups, (int64_t)v.k[0], (int64_t)v.k[1]);
    IrParam *w = sema_new_param(S, arena_printf(S->arena, "%s.weight", name), filter, INIT_UNIFORM, bound, at);
    IrParam *b = w && v.bias ? sema_new_param(S, arena_printf(S->arena, "%s.bias", name), ir_shape(1, out),
                                              INIT_UNIFORM, bound, at)
                             : NULL;
    if (!w || (v.bias && !b)) return sema_error();
    IrNode *y = sema_node(S, OP_CONV2D_BWD_DATA, ys, DT_F32, at, 2, x, w->node, NULL);
    memcpy(y->attr.stride, v.stride, sizeof v.stride);
    memcpy(y->attr.pad, v.pad, sizeof v.pad);
    memcpy(y->attr.dil, v.dil, sizeof v.dil);
    y->attr.groups = (int)v.groups;
    if (b) y = sema_binary(S, OP_ADD, y, sema_reshape(S, b->node, ir_shape(3, out, (int64_t)1, (int64_t)1), at), at);
    return sema_tensor(y);
}

/* maxpool1d and avgpool1d(x, k, stride=k, pad=0) on x [N, C, L]: torch.nn.MaxPool1d and
 * AvgPool1d, the 2-D pooling of x as [N, C, 1, L] with a 1 x k window (avgpool1d counts the
 * padding in its average, as AvgPool1d's default). */
Value sema_b_pool1d(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 3, 3);
    int64_t k = arg_int(A, 1, 1, 1);
    int64_t stride = A->a[2].k == V_NONE ? k : arg_int(A, 2, 1, 1), pad = arg_int(A, 3, 0, 0);
    if (!A->ok) return sema_error();
    if (k > 1 << 20 || stride > 1 << 20) {
        diag_error(c->loc, "%s: a window of %lld or a stride of %lld is too large", c->name, (long long)k,
                   (long long)stride);
        return sema_error();
    }
    if (pad > k / 2) {
        diag_error(arg_at(A, 3), "%s: padding %lld is more than half the window of %lld", c->name, (long long)pad,
                   (long long)k);
        diag_hint("PyTorch allows pad <= kernel/2");
        return sema_error();
    }
    const int64_t N = x->shape.dim[0], C = x->shape.dim[1], L = x->shape.dim[2];
    const int64_t out = (L + 2 * pad - k) / stride + 1;
    if (L + 2 * pad < k) {
        diag_error(c->loc, "%s: a window of %lld does not fit input %s", c->name, (long long)k,
                   sema_shape_str(S, &x->shape));
        return sema_error();
    }
    IrOp op = strcmp(c->name, "maxpool1d") == 0 ? OP_MAXPOOL2D : OP_AVGPOOL2D;
    IrNode *y = sema_node(S, op, ir_shape(4, N, C, (int64_t)1, out), DT_F32, c->loc, 1,
                          sema_reshape(S, x, ir_shape(4, N, C, (int64_t)1, L), c->loc), NULL, NULL);
    y->attr.kernel[0] = 1, y->attr.kernel[1] = (int)k;
    y->attr.stride[0] = 1, y->attr.stride[1] = (int)stride;
    y->attr.pad[0] = 0, y->attr.pad[1] = (int)pad;
    return sema_tensor(sema_reshape(S, y, ir_shape(3, N, C, out), c->loc));
}

/* one_hot(idx, num): f32 [..., num], 1 where the last index equals idx and 0 elsewhere (an index
 * outside 0..num-1 gives a row of zeros; torch.nn.functional.one_hot refuses it), as an
 * equality of idx with an iota. */
Value sema_b_one_hot(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    Value v = A->a[0];
    int64_t n = arg_int(A, 1, 1, 1);
    if (!A->ok || v.k == V_ERR) return sema_error();
    if (v.k != V_TENSOR || ir_dtype_is_float(v.t->dtype) || v.t->shape.rank >= IR_MAX_RANK) {
        diag_error(arg_at(A, 0), "one_hot takes an integer tensor of indices of fewer than %d axes, found %s",
                   IR_MAX_RANK, sema_value_desc(S, v));
        return sema_error();
    }
    IrNode *idx = v.t;
    SrcLoc at = c->loc;
    if (idx->dtype != DT_I64) idx = sema_node(S, OP_CAST, idx->shape, DT_I64, at, 1, idx, NULL, NULL);
    IrShape s = idx->shape, col = idx->shape;
    s.dim[s.rank++] = n;
    col.dim[col.rank++] = 1;
    if (!sema_check_shape(S, &s, at)) return sema_error();
    IrNode *k = sema_node(S, OP_IOTA, s, DT_I64, at, 0, NULL, NULL, NULL);
    k->attr.axis = s.rank - 1;
    IrNode *eq = sema_node(S, OP_EQ, s, DT_U8, at, 2, sema_reshape(S, idx, col, at), k, NULL);
    return sema_tensor(sema_node(S, OP_CAST, s, DT_F32, at, 1, eq, NULL, NULL));
}

/* x / max(||x||, eps) along an axis: sqrt of the sum of squares held at eps^2 or more, which is
 * max(||x||, eps) without a zero under the square root (whose gradient would be 0 / 0). */
static IrNode *normalized(Sema *S, IrNode *x, int axis, double eps, SrcLoc at) {
    int mask[IR_MAX_RANK] = {0};
    mask[axis] = 1;
    IrNode *sq = sema_sum_axes(S, sema_binary(S, OP_MUL, x, x, at), mask, 1, at);
    IrNode *floor = num(S, eps * eps, at);
    IrNode *norm = sema_unary(S, OP_SQRT, where(S, sema_binary(S, OP_LT, sq, floor, at), floor, sq, at), at);
    return sema_binary(S, OP_DIV, x, norm, at);
}

/* normalize(x, axis=1, eps=1e-12): torch.nn.functional.normalize with p = 2, x / max(||x||, eps)
 * along the axis */
Value sema_b_normalize(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    double eps = arg_num(A, 2, 1e-12, 0, 1);
    if (!A->ok) return sema_error();
    if (A->a[1].k == V_NONE) A->a[1] = sema_int(x->shape.rank > 1 ? 1 : 0);
    int axis = arg_axis(A, 1, &x->shape);
    if (!A->ok) return sema_error();
    return sema_tensor(normalized(S, x, axis, eps, c->loc));
}

/* cosine_similarity(a, b, axis=1, eps=1e-8): the sum along the axis of a / max(||a||, eps) times
 * b / max(||b||, eps), both normalised first (the form PyTorch documents); a and b broadcast. */
Value sema_b_cosine_similarity(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *a = arg_f32_tensor(A, 0, 0, 1), *b = arg_f32_tensor(A, 1, 0, 1);
    double eps = arg_num(A, 3, 1e-8, 0, 1);
    if (!A->ok) return sema_error();
    IrShape s;
    if (!ir_broadcast(&a->shape, &b->shape, &s)) {
        diag_error(c->loc, "cosine_similarity: shapes %s and %s do not broadcast", sema_shape_str(S, &a->shape),
                   sema_shape_str(S, &b->shape));
        return sema_error();
    }
    SrcLoc at = c->loc;
    if (!ir_shape_eq(&a->shape, &s)) a = sema_node(S, OP_EXPAND, s, DT_F32, at, 1, a, NULL, NULL);
    if (!ir_shape_eq(&b->shape, &s)) b = sema_node(S, OP_EXPAND, s, DT_F32, at, 1, b, NULL, NULL);
    if (A->a[2].k == V_NONE) A->a[2] = sema_int(s.rank > 1 ? 1 : 0);
    int axis = arg_axis(A, 2, &s);
    if (!A->ok) return sema_error();
    IrNode *p = sema_binary(S, OP_MUL, normalized(S, a, axis, eps, at), normalized(S, b, axis, eps, at), at);
    int mask[IR_MAX_RANK] = {0};
    mask[axis] = 1;
    return sema_tensor(sema_sum_axes(S, p, mask, 0, at));
}

/* The n values pad() puts beside x along the axis, before it (`before`) or after: `value`
 * (constant), the edge repeated (replicate), or the values next to the edge mirrored about it
 * (reflect: x[n], ..., x[1] before, x[L-2], ..., x[L-1-n] after). */
static IrNode *pad_block(Sema *S, IrNode *x, int axis, int64_t n, int mode, double value, int before, SrcLoc at) {
    const int64_t L = x->shape.dim[axis];
    IrShape s = x->shape;
    s.dim[axis] = n;
    if (mode == 0) return sema_node(S, OP_EXPAND, s, DT_F32, at, 1, num(S, value, at), NULL, NULL);
    if (mode == 1) {
        IrNode *edge = sema_slice(S, x, axis, before ? 0 : L - 1, 1, at);
        return n == 1 ? edge : sema_node(S, OP_EXPAND, s, DT_F32, at, 1, edge, NULL, NULL);
    }
    IrNode *y = NULL;
    for (int64_t i = 0; i < n; i++) { /* in the order they will lie */
        int64_t src = before ? n - i : L - 2 - i;
        IrNode *one = sema_slice(S, x, axis, src, 1, at);
        y = y ? sema_concat(S, y, one, axis, at) : one;
    }
    return y;
}

/* pad(x, pads, mode="constant", value=0): torch.nn.functional.pad. pads = [before, after] of the
 * last axis, then of the one before it, and so on (up to x's rank pairs); a negative amount
 * crops. mode "constant" fills with value, "replicate" repeats the edge, "reflect" mirrors the
 * values beside it (fewer than the axis's length). Concatenations, slices and expands: the
 * gradient of a padded value goes back to where it came from. */
Value sema_b_pad(Sema *S, const AstExpr *c, const char *label, Value *args) {
    BEGIN_ARGS(S, c, args);
    IrNode *x = arg_f32_tensor(A, 0, 0, 1);
    const char *mode_name = arg_str(A, 2, "constant");
    double value = arg_num(A, 3, 0, -HUGE_VAL, HUGE_VAL);
    if (!A->ok) return sema_error();
    static const char *const modes[] = {"constant", "replicate", "reflect"};
    int mode = 0;
    while (mode < 3 && strcmp(modes[mode], mode_name) != 0) mode++;
    if (mode == 3) {
        diag_error(arg_at(A, 2), "pad: unknown mode \"%s\"", mode_name);
        diag_hint("mode is \"constant\" (with value), \"replicate\" or \"reflect\"");
        return sema_error();
    }
    if (mode && A->a[3].k != V_NONE) {
        diag_error(arg_at(A, 3), "pad: 'value' is for mode \"constant\", not \"%s\"", mode_name);
        return sema_error();
    }
    Value p = A->a[1];
    int ok = p.k == V_LIST && p.n >= 2 && p.n % 2 == 0 && p.n <= 2 * x->shape.rank;
    for (int i = 0; ok && i < p.n; i++) ok = p.items[i].k == V_INT && llabs(p.items[i].i) <= 1 << 20;
    if (!ok) {
        diag_error(arg_at(A, 1), "pad: 'pads' must be a list of pairs of integers [before, after], the last axis's "
                   "first, at most %d for shape %s, found %s%s", 2 * x->shape.rank, sema_shape_str(S, &x->shape),
                   sema_value_text(S, p), p.k == V_LIST ? arena_printf(S->arena, " of %d", p.n) : "");
        return sema_error();
    }
    SrcLoc at = c->loc;
    for (int j = 0; j < p.n / 2; j++) {
        const int axis = x->shape.rank - 1 - j;
        int64_t before = p.items[2 * j].i, after = p.items[2 * j + 1].i, L = x->shape.dim[axis];
        int64_t keep = L - (before < 0 ? -before : 0) - (after < 0 ? -after : 0);
        if (keep < 1) {
            diag_error(c->loc, "pad: cropping %lld and %lld from axis %d of shape %s leaves nothing",
                       (long long)(before < 0 ? -before : 0), (long long)(after < 0 ? -after : 0), axis,
                       sema_shape_str(S, &x->shape));
            return sema_error();
        }
        x = sema_slice(S, x, axis, before < 0 ? -before : 0, keep, at);
        L = keep;
        if (mode == 2 && (before >= L || after >= L)) {
            diag_error(c->loc, "pad: reflecting %lld and %lld values along axis %d of length %lld: each must be "
                       "below the length", (long long)(before > 0 ? before : 0), (long long)(after > 0 ? after : 0),
                       axis, (long long)L);
            return sema_error();
        }
        IrNode *y = x;
        if (before > 0) y = sema_concat(S, pad_block(S, x, axis, before, mode, value, 1, at), y, axis, at);
        if (after > 0) y = sema_concat(S, y, pad_block(S, x, axis, after, mode, value, 0, at), axis, at);
        if (!sema_check_shape(S, &y->shape, at)) return sema_error();
        x = y;
    }
    return sema_tensor(x);
}

