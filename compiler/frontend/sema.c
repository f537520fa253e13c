/* sema.c - semantic analysis: evaluate a .net program into the forward IR graph.
 *
 * Requires: an AstProgram from the parser (it may hold statements that parsed after errors).
 * Guarantees: on success, a verified forward graph with inputs, parameters (hierarchical
 *   PyTorch-style names, initialisation), the loss (scalar f32), the optional accuracy node and
 *   the training recipe; g->n_fwd == g->n. On any error, NULL, with every error reported.
 *
 * The language is evaluated at compile time like a small interpreter: constants, blocks, loops
 * and conditionals run here and leave only tensor operations behind. Values are numbers,
 * booleans, strings, lists or tensors (IR nodes). An erroneous expression yields V_ERR, which
 * every consumer passes on silently so one mistake reports one error.
 *
 * Layers that create parameters name them from the label path in force: `layer1.0: basic(x)`
 * runs `basic` under the prefix `layer1.0`, so its `conv1: conv2d(...)` owns
 * `layer1.0.conv1.weight`. An unlabeled layer gets its builtin's name and a per-scope counter.
 * The built-in layers themselves live in sema_builtins.c.
 */
#include "sema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "netrt.h" /* the trainer's fixed tables a model must fit */

/* An input's per-sample shape (its rank less the batch axis) fills RtInput.shape, and a
 * parameter's whole shape fills RtParam.shape: both hold RT_MAX_RANK axes. */
_Static_assert((int)IR_MAX_RANK <= (int)RT_MAX_RANK, "a parameter's rank must fit RtParam.shape");

/* ---- diagnostics helpers */

const char *sema_shape_str(Sema *S, const IrShape *s) {
    char buf[200];
    return arena_strdup(S->arena, ir_shape_str(s, buf, sizeof buf));
}

static const char *kind_name(VKind k) {
    switch (k) {
    case V_ERR: return "error";
    case V_INT: return "an integer";
    case V_FLOAT: return "a number";
    case V_BOOL: return "a boolean";
    case V_STR: return "a string";
    case V_TENSOR: return "a tensor";
    case V_LIST: return "a list";
    case V_NONE: return "nothing";
    }
    return "?";
}

const char *sema_value_desc(Sema *S, Value v) {
    if (v.k == V_TENSOR)
        return arena_printf(S->arena, "a tensor %s%s", ir_dtype_name(v.t->dtype),
                            sema_shape_str(S, &v.t->shape));
    return kind_name(v.k);
}

/* A refused value as the error shows it: numbers, booleans and strings as written
 * (`found 1.5`), anything else by its kind; with the -D it came from, if any, since the
 * source line alone would not explain it. */
const char *sema_value_text(Sema *S, Value v) {
    const char *text;
    switch (v.k) {
    case V_INT: text = arena_printf(S->arena, "%lld", (long long)v.i); break;
    case V_FLOAT: text = arena_printf(S->arena, "%g", v.f); break;
    case V_BOOL: text = v.i ? "true" : "false"; break;
    case V_STR: text = arena_printf(S->arena, "\"%s\"", v.s); break;
    default: text = sema_value_desc(S, v); break;
    }
    if (!v.define) return text;
    return arena_printf(S->arena, "%s (set by -D %s=%s)", text, v.define->name, v.define->value);
}

/* `  hint: did you mean 'conv1'?` when a candidate came close. */
void sema_suggest_hint(const Suggest *s) {
    if (s->best) diag_hint("did you mean '%s'?", s->best);
}

Value sema_error(void) { return (Value){.k = V_ERR}; }

/* ---- environments */

/* Hash tables: a program's lookups cost constant time however many names it binds. */
static Value *env_lookup(Env *e, const char *name) {
    for (; e; e = e->parent) {
        Value *v = strmap_get(&e->vars, name);
        if (v) return v;
    }
    return NULL;
}

static void env_set(Sema *S, Env *e, const char *name, Value v) {
    Value *slot = strmap_get(&e->vars, name);
    if (!slot) {
        slot = arena_alloc(S->arena, sizeof *slot);
        strmap_put(S->arena, &e->vars, name, slot);
    }
    *slot = v;
}

/* ---- node creation with the global size limit */

IrNode *sema_node(Sema *S, IrOp op, IrShape shape, IrDtype dt, SrcLoc loc, int n_in, IrNode *a,
                  IrNode *b, IrNode *c) {
    if (S->g->n >= SEMA_MAX_NODES && !S->too_big) {
        diag_error(loc, "the model is too large (more than %d operations)", SEMA_MAX_NODES);
        S->too_big = 1;
    }
    return ir_add(S->g, op, shape, dt, loc, n_in, a, b, c);
}

/* Check a freshly computed shape against the size limit; 0 (and an error) if too large. */
int sema_check_shape(Sema *S, const IrShape *s, SrcLoc loc) {
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) {
        if (s->dim[i] < 1) {
            diag_error(loc, "dimension %d of shape %s is %lld; every dimension must be at least 1",
                       i, sema_shape_str(S, s), (long long)s->dim[i]);
            return 0;
        }
        if (!checked_mul(n, s->dim[i], &n) || n > IR_MAX_NUMEL) {
            diag_error(loc, "shape %s has more than 2^40 elements", sema_shape_str(S, s));
            return 0;
        }
    }
    return 1;
}

/* ---- compile-time arithmetic */

static int is_num(Value v) { return v.k == V_INT || v.k == V_FLOAT; }
double sema_num(Value v) { return v.k == V_INT ? (double)v.i : v.f; }
Value sema_int(int64_t i) { return (Value){.k = V_INT, .i = i}; }
Value sema_float(double f) { return (Value){.k = V_FLOAT, .f = f}; }
static Value mk_bool(int b) { return (Value){.k = V_BOOL, .i = b != 0}; }
Value sema_tensor(IrNode *t) { return (Value){.k = V_TENSOR, .t = t}; }

static Value int_arith(int op, int64_t a, int64_t b, SrcLoc loc) {
    int64_t r = 0;
    int ok = 1;
    switch (op) {
    case BIN_ADD: ok = checked_add(a, b, &r); break;
    case BIN_SUB: ok = !__builtin_sub_overflow(a, b, &r); break;
    case BIN_MUL: ok = checked_mul(a, b, &r); break;
    case BIN_FLOORDIV:
    case BIN_MOD:
        if (b == 0) {
            diag_error(loc, "integer division by zero");
            return sema_error();
        }
        if (a == INT64_MIN && b == -1) {
            ok = 0;
            break;
        }
        /* floor, as Python; the remainder from %, since a - (a // b) * b can overflow midway */
        int64_t q = a / b, m = a % b;
        if (m != 0 && (m < 0) != (b < 0)) q--, m += b;
        r = op == BIN_MOD ? m : q;
        break;
    case BIN_POW: /* by squaring: 1 ** 9223372036854775807 takes 63 steps, not 2^63 */
        if (b < 0) return sema_float(pow((double)a, (double)b));
        r = 1;
        for (int64_t e = b, base = a; e && ok; e >>= 1) {
            if (e & 1) ok = checked_mul(r, base, &r);
            /* a square that overflows while a bit remains means the result overflows too */
            if (ok && e > 1) ok = checked_mul(base, base, &base);
        }
        break;
    }
    if (!ok) {
        diag_error(loc, "integer overflow in %lld %s %lld", (long long)a, ast_binop_name(op),
                   (long long)b);
        return sema_error();
    }
    return sema_int(r);
}

/* The broadcast shape of a binary operator's tensor operands x and y, which must have one dtype;
 * 0 after an error (the hint names `cast`, a conversion that would fix it). */
static int operand_shape(Sema *S, int op, const IrNode *x, const IrNode *y, const char *cast, SrcLoc loc,
                         IrShape *out) {
    if (x->dtype != y->dtype) {
        diag_error(loc, "operands of '%s' have different dtypes: %s and %s", ast_binop_name(op),
                   ir_dtype_name(x->dtype), ir_dtype_name(y->dtype));
        diag_hint("convert one of them with a cast such as %s", cast);
        return 0;
    }
    if (!ir_broadcast(&x->shape, &y->shape, out)) {
        diag_error(loc, "shapes %s and %s do not broadcast for '%s'", sema_shape_str(S, &x->shape),
                   sema_shape_str(S, &y->shape), ast_binop_name(op));
        diag_hint("trailing dimensions must be equal or 1 (numpy broadcasting)");
        return 0;
    }
    return 1;
}

static Value num_arith(int op, Value a, Value b, SrcLoc loc) {
    if (a.k == V_INT && b.k == V_INT && op != BIN_DIV) return int_arith(op, a.i, b.i, loc);
    double x = sema_num(a), y = sema_num(b);
    switch (op) {
    case BIN_ADD: return sema_float(x + y);
    case BIN_SUB: return sema_float(x - y);
    case BIN_MUL: return sema_float(x * y);
    case BIN_DIV:
        if (y == 0) {
            diag_error(loc, "division by zero");
            return sema_error();
        }
        return sema_float(x / y);
    case BIN_FLOORDIV:
    case BIN_MOD:
        if (y == 0) {
            diag_error(loc, "division by zero");
            return sema_error();
        }
        return sema_float(op == BIN_MOD ? x - floor(x / y) * y : floor(x / y));
    case BIN_POW: return sema_float(pow(x, y));
    }
    ICE("num_arith: op %d", op);
}

static Value compare(int op, Value a, Value b, SrcLoc loc) {
    if (op == BIN_EQ || op == BIN_NE) {
        int eq;
        if (is_num(a) && is_num(b)) eq = sema_num(a) == sema_num(b);
        else if (a.k == V_BOOL && b.k == V_BOOL) eq = a.i == b.i;
        else if (a.k == V_STR && b.k == V_STR) eq = strcmp(a.s, b.s) == 0;
        else {
            diag_error(loc, "cannot compare %s with %s", kind_name(a.k), kind_name(b.k));
            return sema_error();
        }
        return mk_bool(op == BIN_EQ ? eq : !eq);
    }
    if (!is_num(a) || !is_num(b)) {
        diag_error(loc, "'%s' needs two numbers, found %s and %s", ast_binop_name(op),
                   kind_name(a.k), kind_name(b.k));
        return sema_error();
    }
    double x = sema_num(a), y = sema_num(b);
    switch (op) {
    case BIN_LT: return mk_bool(x < y);
    case BIN_LE: return mk_bool(x <= y);
    case BIN_GT: return mk_bool(x > y);
    default: return mk_bool(x >= y);
    }
}

/* ---- tensor arithmetic */

/* A float tensor operand, or 0 with an error naming what was found instead. */
int sema_want_float_tensor(Sema *S, Value v, SrcLoc loc, const char *what) {
    if (v.k == V_ERR) return 0;
    if (v.k != V_TENSOR) {
        diag_error(loc, "%s must be a tensor, found %s", what, sema_value_text(S, v));
        return 0;
    }
    if (!ir_dtype_is_float(v.t->dtype)) {
        diag_error(loc, "%s must be a floating-point tensor, found %s", what, sema_value_text(S, v));
        diag_hint("convert it first, e.g. f32(x)");
        return 0;
    }
    return 1;
}

static IrOp tensor_op(int op) {
    switch (op) {
    case BIN_ADD: return OP_ADD;
    case BIN_SUB: return OP_SUB;
    case BIN_MUL: return OP_MUL;
    case BIN_DIV: return OP_DIV;
    }
    return OP__COUNT;
}

Value sema_tensor_binop(Sema *S, int op, Value a, Value b, SrcLoc loc) {
    IrOp iop = tensor_op(op);
    if (iop == OP__COUNT) {
        diag_error(loc, "'%s' is not defined on tensors", ast_binop_name(op));
        diag_hint("tensors support + - * / and ** with a number as the power");
        return sema_error();
    }
    IrNode *x = a.k == V_TENSOR ? a.t : NULL, *y = b.k == V_TENSOR ? b.t : NULL;
    if ((x && !sema_want_float_tensor(S, a, loc, "the left operand")) ||
        (y && !sema_want_float_tensor(S, b, loc, "the right operand")))
        return sema_error();
    IrDtype dt = x ? x->dtype : y->dtype;
    if (!x) {
        if (!is_num(a)) goto bad;
        x = ir_const(S->g, sema_num(a), dt, loc);
    }
    if (!y) {
        if (!is_num(b)) goto bad;
        y = ir_const(S->g, sema_num(b), dt, loc);
    }
    IrShape out;
    if (!operand_shape(S, op, x, y, "f32(x)", loc, &out)) return sema_error();
    return sema_tensor(sema_node(S, iop, out, dt, loc, 2, x, y, NULL));
bad:
    diag_error(loc, "'%s' between %s and %s", ast_binop_name(op), sema_value_desc(S, a),
               sema_value_desc(S, b));
    return sema_error();
}

/* a == b, a < b, ... with a tensor on either side: a u8 tensor of 0 and 1 (no gradient). Two
 * tensors must have one dtype; a number is compared in the tensor's dtype (an integer tensor
 * exactly, as an integer). */
static Value tensor_compare(Sema *S, int op, Value a, Value b, SrcLoc loc) {
    static const IrOp ops[] = {[BIN_EQ] = OP_EQ, [BIN_NE] = OP_NE, [BIN_LT] = OP_LT,
                               [BIN_LE] = OP_LE, [BIN_GT] = OP_GT, [BIN_GE] = OP_GE};
    IrNode *x = a.k == V_TENSOR ? a.t : NULL, *y = b.k == V_TENSOR ? b.t : NULL;
    if ((!x && !is_num(a)) || (!y && !is_num(b))) {
        diag_error(loc, "'%s' between %s and %s", ast_binop_name(op), sema_value_desc(S, a), sema_value_desc(S, b));
        diag_hint("a tensor compares with a tensor or a number");
        return sema_error();
    }
    IrDtype dt = x ? x->dtype : y->dtype;
    if (!x) x = ir_const(S->g, sema_num(a), dt, loc);
    if (!y) y = ir_const(S->g, sema_num(b), dt, loc);
    IrShape out;
    if (!operand_shape(S, op, x, y, "i64(x)", loc, &out)) return sema_error();
    return sema_tensor(sema_node(S, ops[op], out, DT_U8, loc, 2, x, y, NULL));
}

/* ---- expressions */

/* [a, b] + [c] is [a, b, c], as in Python. */
static Value list_concat(Sema *S, Value a, Value b) {
    Value v = {.k = V_LIST, .n = a.n + b.n};
    v.items = arena_alloc(S->arena, (size_t)(v.n + 1) * sizeof *v.items);
    for (int i = 0; i < a.n; i++) v.items[i] = a.items[i];
    for (int i = 0; i < b.n; i++) v.items[a.n + i] = b.items[i];
    return v;
}

static Value eval_binary(Sema *S, Env *env, const AstExpr *e) {
    if (e->op == BIN_AND || e->op == BIN_OR) {
        Value a = sema_eval(S, env, e->lhs);
        if (a.k == V_ERR) return a;
        if (a.k != V_BOOL) goto notbool;
        if ((e->op == BIN_AND && !a.i) || (e->op == BIN_OR && a.i)) return a;
        Value b = sema_eval(S, env, e->rhs);
        if (b.k == V_ERR) return b;
        if (b.k != V_BOOL) goto notbool;
        return b;
    notbool:
        diag_error(e->loc, "'%s' needs true or false on both sides", ast_binop_name(e->op));
        return sema_error();
    }
    Value a = sema_eval(S, env, e->lhs), b = sema_eval(S, env, e->rhs);
    if (a.k == V_ERR || b.k == V_ERR) return sema_error();
    if (e->op >= BIN_EQ && e->op <= BIN_GE && (a.k == V_TENSOR || b.k == V_TENSOR))
        return tensor_compare(S, e->op, a, b, e->loc);
    if (e->op >= BIN_EQ && e->op <= BIN_GE) return compare(e->op, a, b, e->loc);
    if (e->op == BIN_POW && a.k == V_TENSOR && is_num(b)) return sema_tensor_pow(S, a, b, e->loc);
    if (a.k == V_TENSOR || b.k == V_TENSOR) return sema_tensor_binop(S, e->op, a, b, e->loc);
    if (is_num(a) && is_num(b)) return num_arith(e->op, a, b, e->loc);
    if (a.k == V_LIST && b.k == V_LIST && e->op == BIN_ADD) return list_concat(S, a, b);
    if (a.k == V_STR && b.k == V_STR && e->op == BIN_ADD)
        return (Value){.k = V_STR, .s = arena_printf(S->arena, "%s%s", a.s, b.s)};
    diag_error(e->loc, "'%s' between %s and %s", ast_binop_name(e->op), sema_value_desc(S, a),
               sema_value_desc(S, b));
    if (e->op == BIN_ADD && (a.k == V_STR || b.k == V_STR))
        diag_hint("str() turns a number into text: \"layer\" + str(i)");
    else if (e->op == BIN_ADD && (a.k == V_LIST || b.k == V_LIST))
        diag_hint("a list joins only a list: [a, b] + [c]");
    return sema_error();
}

static Value eval_unary(Sema *S, Env *env, const AstExpr *e) {
    Value a = sema_eval(S, env, e->lhs);
    if (a.k == V_ERR) return a;
    if (e->op == '!') {
        if (a.k == V_BOOL) return mk_bool(!a.i);
        diag_error(e->loc, "'not' needs true or false, found %s", sema_value_text(S, a));
        return sema_error();
    }
    if (a.k == V_INT) {
        if (a.i == INT64_MIN) {
            diag_error(e->loc, "integer overflow in negation");
            return sema_error();
        }
        return sema_int(-a.i);
    }
    if (a.k == V_FLOAT) return sema_float(-a.f);
    if (!sema_want_float_tensor(S, a, e->loc, "the operand of '-'")) return sema_error();
    return sema_tensor(sema_node(S, OP_NEG, a.t->shape, a.t->dtype, e->loc, 1, a.t, NULL, NULL));
}

static Value eval_list(Sema *S, Env *env, const AstExpr *e) {
    Value v = {.k = V_LIST, .n = e->n_items};
    v.items = arena_alloc(S->arena, (size_t)(e->n_items + 1) * sizeof *v.items);
    for (int i = 0; i < e->n_items; i++) {
        v.items[i] = sema_eval(S, env, e->items[i]);
        if (v.items[i].k == V_ERR) return sema_error();
    }
    return v;
}

/* An index i into n things, negative from the end; -1 after an error naming `what`. */
static int64_t index_in(Sema *S, Value v, SrcLoc loc, int64_t n, const char *what) {
    if (v.k == V_ERR) return -1;
    if (v.k != V_INT || v.i < -n || v.i >= n) {
        diag_error(loc, "%s must be an integer in [%lld, %lld], found %s", what, (long long)-n, (long long)(n - 1),
                   sema_value_text(S, v));
        return -1;
    }
    return v.i < 0 ? v.i + n : v.i;
}

/* The range a:b over n things as [*lo, *hi): each side an integer in [-n, n], negative from the
 * end, a side left out 0 or n; false after an error naming `what`. */
static bool range_in(Sema *S, Env *env, const AstExpr *r, int64_t n, const char *what, int64_t *lo, int64_t *hi) {
    const AstExpr *side[2] = {r->lhs, r->rhs};
    int64_t b[2] = {0, n};
    for (int i = 0; i < 2; i++) {
        if (!side[i]) continue;
        Value v = sema_eval(S, env, side[i]);
        if (v.k == V_ERR) return false;
        if (v.k != V_INT || v.i < -n || v.i > n) {
            diag_error(side[i]->loc, "the %s of a range over %s must be an integer in [%lld, %lld], found %s",
                       i ? "end" : "start", what, (long long)-n, (long long)n, sema_value_text(S, v));
            return false;
        }
        b[i] = v.i < 0 ? v.i + n : v.i;
    }
    *lo = b[0], *hi = b[1];
    return true;
}

/* l[i] and l[a:b] on a compile-time list. */
static Value index_list(Sema *S, Env *env, const AstExpr *e, Value base) {
    const AstExpr *it = e->n_items == 1 ? e->items[0] : NULL;
    if (!it || it->kind == AST_ELLIPSIS) {
        diag_error(e->loc, "a list takes one integer index or range, l[i] or l[a:b]");
        return sema_error();
    }
    char what[80];
    snprintf(what, sizeof what, "a list of %d", base.n);
    if (it->kind == AST_RANGE) {
        int64_t lo, hi;
        if (!range_in(S, env, it, base.n, what, &lo, &hi)) return sema_error();
        if (lo > hi) {
            diag_error(it->loc, "the range %lld:%lld over %s ends before it starts", (long long)lo, (long long)hi,
                       what);
            return sema_error();
        }
        return (Value){.k = V_LIST, .n = (int)(hi - lo), .items = base.items + lo};
    }
    Value i = sema_eval(S, env, it);
    snprintf(what, sizeof what, "the index into a list of %d", base.n);
    int64_t k = index_in(S, i, it->loc, base.n, what);
    return k < 0 ? sema_error() : base.items[k];
}

/* l[i] on a compile-time list; x[i, :, j] on a tensor: an integer selects along its axis and
 * drops it (a slice of one, then a reshape view), ':' keeps the axis, a:b keeps that range of
 * it (a slice), and axes past the last item are kept. */
static Value index_value(Sema *S, Env *env, const AstExpr *e, Value base) {
    if (base.k == V_ERR) return base;
    if (base.k == V_LIST) return index_list(S, env, e, base);
    if (base.k != V_TENSOR) {
        diag_error(e->loc, "only lists and tensors can be indexed, found %s", sema_value_desc(S, base));
        return sema_error();
    }
    IrNode *x = base.t;
    const IrShape shape = x->shape;
    int dots = -1; /* the item '...' is, or -1 */
    for (int i = 0; i < e->n_items; i++)
        if (e->items[i] && e->items[i]->kind == AST_ELLIPSIS) {
            if (dots >= 0) {
                diag_error(e->items[i]->loc, "an index has at most one '...'");
                return sema_error();
            }
            dots = i;
        }
    const int named = e->n_items - (dots >= 0); /* the axes the items other than '...' stand for */
    if (named > shape.rank) {
        diag_error(e->loc, "%d indices into a tensor of shape %s", named, sema_shape_str(S, &shape));
        return sema_error();
    }
    /* before '...' the items name the first axes, after it the last ones, from axis `after` */
    const int after = shape.rank - (e->n_items - dots - 1);
    IrShape out = {0};
    for (int a = 0; a < shape.rank; a++) {
        const AstExpr *it = dots < 0 || a < dots ? (a < e->n_items ? e->items[a] : NULL)
                            : a >= after ? e->items[a - after + dots + 1] : NULL;
        if (!it) {
            out.dim[out.rank++] = shape.dim[a];
            continue;
        }
        if (!ir_dtype_is_float(x->dtype) && x->dtype != DT_I64) {
            diag_error(e->loc, "indexing takes an f32 or i64 tensor, found %s", sema_value_desc(S, base));
            return sema_error();
        }
        char what[96];
        snprintf(what, sizeof what, "axis %d of shape %s", a, sema_shape_str(S, &shape));
        if (it->kind == AST_RANGE) {
            int64_t lo, hi;
            if (!range_in(S, env, it, shape.dim[a], what, &lo, &hi)) return sema_error();
            if (lo >= hi) {
                diag_error(it->loc, "the range %lld:%lld over %s is empty", (long long)lo, (long long)hi, what);
                diag_hint("a range a:b takes a <= i < b, counted from the end where negative");
                return sema_error();
            }
            x = sema_slice(S, x, a, lo, hi - lo, e->loc);
            out.dim[out.rank++] = hi - lo;
            continue;
        }
        Value i = sema_eval(S, env, it);
        snprintf(what, sizeof what, "the index into axis %d of shape %s", a, sema_shape_str(S, &shape));
        int64_t k = index_in(S, i, it->loc, shape.dim[a], what);
        if (k < 0) return sema_error();
        x = sema_slice(S, x, a, k, 1, e->loc);
    }
    return sema_tensor(sema_reshape(S, x, out, e->loc));
}

static Value eval_index(Sema *S, Env *env, const AstExpr *e) {
    return index_value(S, env, e, sema_eval(S, env, e->lhs));
}

/* `label: f(x)[i][j]`: the label names the call, whose result is then indexed. */
static Value labeled_index(Sema *S, Env *env, const AstExpr *e, const char *label) {
    if (e->kind != AST_INDEX) return sema_call(S, env, e, label);
    return index_value(S, env, e, labeled_index(S, env, e->lhs, label));
}

/* The label path `layer1.{i}.conv` as text; NULL after an error. */
static const char *eval_label(Sema *S, Env *env, const AstExpr *e) {
    const char *path = "";
    for (int i = 0; i < e->n_label; i++) {
        const AstLabelSeg *seg = &e->label[i];
        const char *text = seg->text;
        if (!text) {
            Value v = sema_eval(S, env, seg->expr);
            if (v.k == V_ERR) return NULL;
            if (v.k == V_INT) text = arena_printf(S->arena, "%lld", (long long)v.i);
            else if (v.k == V_STR) text = v.s;
            else {
                diag_error(seg->loc, "a label segment must be an integer or a string, found %s",
                           sema_value_desc(S, v));
                return NULL;
            }
        }
        path = i ? arena_printf(S->arena, "%s.%s", path, text) : text;
    }
    return path;
}

static Value eval_labeled(Sema *S, Env *env, const AstExpr *e) {
    const char *label = eval_label(S, env, e);
    if (!label) return sema_error();
    const AstExpr *target = e->lhs;
    while (target->kind == AST_INDEX) target = target->lhs;
    if (target->kind == AST_CALL && e->lhs->kind == AST_INDEX) return labeled_index(S, env, e->lhs, label);
    if (e->lhs->kind != AST_CALL) {
        diag_error(e->loc, "a label names a layer or block call, not an expression");
        diag_hint("write `name: dense(x, 10)`");
        return sema_error();
    }
    return sema_call(S, env, e->lhs, label);
}

/* Suggests the name in scope nearest to a misspelt one. */
static void suggest_name(Env *env, const char *name) {
    Suggest sg;
    suggest_init(&sg, name);
    for (; env; env = env->parent)
        for (int i = 0; i < env->vars.cap; i++)
            if (env->vars.keys[i]) suggest_try(&sg, env->vars.keys[i]);
    sema_suggest_hint(&sg);
}

Value sema_eval(Sema *S, Env *env, const AstExpr *e) {
    if (S->too_big) return sema_error();
    switch (e->kind) {
    case AST_INT: return sema_int(e->ival);
    case AST_FLOAT: return sema_float(e->fval);
    case AST_BOOL: return mk_bool((int)e->ival);
    case AST_STRING: return (Value){.k = V_STR, .s = e->str};
    case AST_NAME: {
        Value *v = env_lookup(env, e->name);
        if (v) return *v;
        diag_error(e->loc, "'%s' is not defined", e->name);
        suggest_name(env, e->name);
        return sema_error();
    }
    case AST_UNARY: return eval_unary(S, env, e);
    case AST_BINARY: return eval_binary(S, env, e);
    case AST_CALL: return sema_call(S, env, e, NULL);
    case AST_LABELED: return eval_labeled(S, env, e);
    case AST_LIST: return eval_list(S, env, e);
    case AST_INDEX: return eval_index(S, env, e);
    case AST_RANGE: case AST_ELLIPSIS: break; /* only items of AST_INDEX, read by index_value */
    }
    ICE("sema_eval: expression kind %d", e->kind);
}

/* ---- naming */

/* The name a layer's parameters live under: prefix + label, or prefix + base + counter. */
const char *sema_layer_name(Sema *S, const char *label, const char *base) {
    if (!label) {
        const char *key = arena_printf(S->arena, "%s/%s", S->prefix, base);
        int *count = strmap_get(&S->counters, key);
        if (!count) {
            count = arena_alloc(S->arena, sizeof *count);
            strmap_put(S->arena, &S->counters, key, count);
        }
        label = arena_printf(S->arena, "%s%d", base, (*count)++);
    }
    return *S->prefix ? arena_printf(S->arena, "%s.%s", S->prefix, label) : label;
}

/* ---- calls: argument binding, blocks */

/* Bind call arguments to `names` by position and keyword; unset entries are V_NONE. */
int sema_bind_args(Sema *S, Env *env, const AstExpr *call, const char *const *names, int n,
                   Value *out) {
    for (int i = 0; i < n; i++) out[i] = (Value){.k = V_NONE};
    int ok = 1;
    for (int a = 0; a < call->n_args; a++) {
        const AstArg *arg = &call->args[a];
        int slot = -1;
        if (!arg->kw) {
            slot = a < n ? a : -1;
            if (slot < 0) {
                diag_error(arg->loc, "too many arguments to '%s' (it takes %d)", call->name, n);
                ok = 0;
                continue;
            }
        } else {
            for (int i = 0; i < n; i++)
                if (strcmp(names[i], arg->kw) == 0) slot = i;
            if (slot < 0) {
                diag_error(arg->loc, "'%s' has no argument named '%s'", call->name, arg->kw);
                Suggest sg;
                suggest_init(&sg, arg->kw);
                for (int i = 0; i < n; i++) suggest_try(&sg, names[i]);
                sema_suggest_hint(&sg);
                ok = 0;
                continue;
            }
        }
        if (out[slot].k != V_NONE) {
            diag_error(arg->loc, "argument '%s' of '%s' given twice", names[slot], call->name);
            ok = 0;
            continue;
        }
        out[slot] = sema_eval(S, env, arg->value);
        if (out[slot].k == V_ERR) ok = 0;
    }
    return ok;
}

static const AstStmt *find_block(Sema *S, const char *name) {
    return strmap_get(&S->blocks, name);
}

static Value call_block(Sema *S, Env *env, const AstExpr *call, const AstStmt *blk,
                        const char *label) {
    if (S->depth >= SEMA_MAX_DEPTH) {
        diag_error(call->loc, "block calls nested more than %d deep", SEMA_MAX_DEPTH);
        diag_hint("is '%s' calling itself?", blk->name);
        return sema_error();
    }
    Value *args = arena_alloc(S->arena, (size_t)(blk->n + 1) * sizeof *args);
    if (!sema_bind_args(S, env, call, blk->names, blk->n, args)) return sema_error();
    Env *local = arena_alloc(S->arena, sizeof *local);
    local->parent = S->global;
    for (int i = 0; i < blk->n; i++) {
        if (args[i].k == V_NONE) {
            if (!blk->values[i]) {
                diag_error(call->loc, "missing argument '%s' of block '%s'", blk->names[i],
                           blk->name);
                return sema_error();
            }
            args[i] = sema_eval(S, S->global, blk->values[i]);
            if (args[i].k == V_ERR) return args[i];
        }
        env_set(S, local, blk->names[i], args[i]);
    }
    const char *saved_prefix = S->prefix;
    S->prefix = sema_layer_name(S, label, blk->name);
    S->depth++;
    Value saved_ret = S->ret;
    S->ret = (Value){.k = V_NONE};
    int saved_in_block = S->in_block;
    S->in_block = 1;
    sema_exec_body(S, local, blk->body, blk->n_body);
    Value r = S->ret;
    S->ret = saved_ret;
    S->in_block = saved_in_block;
    S->depth--;
    S->prefix = saved_prefix;
    if (r.k == V_NONE && S->too_big) return sema_error(); /* cut short, already reported */
    if (r.k == V_NONE) {
        diag_error(call->loc, "block '%s' ended without returning a value", blk->name);
        diag_note(blk->loc, "'%s' is defined here; end it with `return ...`", blk->name);
        return sema_error();
    }
    return r;
}

Value sema_call(Sema *S, Env *env, const AstExpr *call, const char *label) {
    const AstStmt *blk = find_block(S, call->name);
    if (blk) return call_block(S, env, call, blk, label);
    const SemaBuiltin *b = sema_find_builtin(call->name);
    if (!b) {
        diag_error(call->loc, "no layer, function or block named '%s'", call->name);
        Suggest sg; /* the program's own blocks first: they win a tie */
        suggest_init(&sg, call->name);
        for (int i = 0; i < S->blocks.cap; i++)
            if (S->blocks.keys[i]) suggest_try(&sg, S->blocks.keys[i]);
        sema_suggest_builtin(&sg);
        sema_suggest_hint(&sg);
        return sema_error();
    }
    Value args[SEMA_MAX_ARGS];
    if (!sema_bind_args(S, env, call, b->params, b->n_params, args)) return sema_error();
    for (int i = 0; i < b->n_required; i++)
        if (args[i].k == V_NONE) {
            diag_error(call->loc, "'%s' needs the argument '%s'", b->name, b->params[i]);
            diag_hint("%s(%s)", b->name, b->signature);
            return sema_error();
        }
    return b->fn(S, call, label, args);
}

/* ---- statements */

/* 1 for a condition that is true or false; 0 otherwise, with an error unless v is already V_ERR. */
int sema_want_bool(Sema *S, Value v, SrcLoc loc) {
    if (v.k == V_BOOL) return 1;
    if (v.k != V_ERR) diag_error(loc, "a condition must be true or false, found %s", sema_value_text(S, v));
    return 0;
}

static void exec_for(Sema *S, Env *env, const AstStmt *s) {
    Value lo = sema_eval(S, env, s->lo), hi = sema_eval(S, env, s->hi);
    if (lo.k == V_ERR || hi.k == V_ERR) return;
    if (lo.k != V_INT || hi.k != V_INT) {
        diag_error(s->loc, "a loop range needs integers, found %s .. %s", sema_value_text(S, lo),
                   sema_value_text(S, hi));
        return;
    }
    for (int64_t i = lo.i; i < hi.i && !diag_too_many() && !S->too_big; i++) {
        if (++S->iterations > SEMA_MAX_ITERATIONS) {
            diag_error(s->loc, "loops ran more than %d iterations in total", SEMA_MAX_ITERATIONS);
            S->too_big = 1;
            return;
        }
        env_set(S, env, s->name, sema_int(i));
        int errors = diag_error_count();
        sema_exec_body(S, env, s->body, s->n_body);
        if (S->ret.k != V_NONE) return;
        /* The same mistake would come back on every later iteration: one report is enough. */
        if (diag_error_count() > errors) return;
    }
}

static void exec_const(Sema *S, Env *env, const AstStmt *s) {
    for (int i = 0; i < s->n; i++) {
        Value v;
        SemaDefine *d = env == S->global ? sema_find_define(S, s->names[i]) : NULL;
        if (d) {
            v = sema_parse_define(S, d);
            v.define = d;
        } else {
            v = sema_eval(S, env, s->values[i]);
        }
        if (v.k == V_TENSOR) {
            diag_error(s->name_locs[i], "constant '%s' must be known at compile time, found %s",
                       s->names[i], sema_value_desc(S, v));
            v = sema_error();
        }
        env_set(S, env, s->names[i], v); /* V_ERR too, so later uses stay silent */
    }
}

/* Declare an input; NULL after an error (the name is then bound to V_ERR by the caller so
 * its uses stay silent). */
static IrNode *declare_input(Sema *S, const AstStmt *s) {
    IrDtype dt;
    if (!ir_dtype_from_name(s->dtype, &dt)) {
        diag_error(s->dtype_loc, "unknown dtype '%s'", s->dtype);
        diag_hint("dtypes are f32, f16, bf16, i32, i64, u8");
        return NULL;
    }
    IrShape shape = {.rank = s->n_dims};
    if (s->n_dims < 1 || s->n_dims > IR_MAX_RANK) {
        diag_error(s->loc, "input '%s' has rank %d; inputs have 1 to %d axes, the first the batch",
                   s->name, s->n_dims, IR_MAX_RANK);
        return NULL;
    }
    for (int i = 0; i < s->n_dims; i++) {
        Value v = sema_eval(S, S->global, s->dims[i]);
        if (v.k == V_ERR) return NULL;
        if (v.k != V_INT) {
            diag_error(s->dims[i]->loc, "a dimension must be an integer, found %s", sema_value_text(S, v));
            return NULL;
        }
        shape.dim[i] = v.i;
    }
    if (!sema_check_shape(S, &shape, s->dims[0]->loc)) return NULL;
    /* `const image = 28` then `input image : ...`: the input would silently take the name the
     * constant (and its -D) had */
    const Value *prior = env_lookup(S->global, s->name);
    if (prior && prior->k != V_TENSOR && prior->k != V_ERR) {
        diag_error(s->name_loc, "input '%s' would hide the compile-time value '%s' (%s) defined before it", s->name,
                   s->name, sema_value_text(S, *prior));
        diag_hint("give the input or the value another name");
        return NULL;
    }
    for (int i = 0; i < S->g->n_inputs; i++)
        if (strcmp(S->g->inputs[i].name, s->name) == 0) {
            diag_error(s->name_loc, "input '%s' is declared twice", s->name);
            return NULL;
        }
    if (S->g->n_inputs == RT_MAX_INPUTS) { /* the trainer binds its inputs in tables this long */
        diag_error(s->name_loc, "input '%s' is one more than the %d inputs a trainer takes (RT_MAX_INPUTS)",
                   s->name, RT_MAX_INPUTS);
        diag_hint("stack inputs of the same dtype into one input with an extra axis");
        return NULL;
    }
    if (S->g->n_inputs == 0) S->g->batch = shape.dim[0];
    else if (shape.dim[0] != S->g->batch) {
        diag_error(s->dims[0]->loc, "input '%s' has batch %lld but '%s' has %lld", s->name,
                   (long long)shape.dim[0], S->g->inputs[0].name, (long long)S->g->batch);
        diag_hint("the first axis of every input is the batch and must be the same");
        return NULL;
    }
    return ir_add_input(S->g, s->name, shape, dt, s->loc);
}

static void exec_input(Sema *S, const AstStmt *s) {
    IrNode *n = declare_input(S, s);
    env_set(S, S->global, s->name, n ? sema_tensor(n) : sema_error());
}

static void exec_stmt(Sema *S, Env *env, const AstStmt *s) {
    int top = env == S->global && !S->in_block;
    switch (s->kind) {
    case STMT_MODEL:
        if (S->g->model_name) diag_error(s->loc, "a file describes one model; 'model' appears twice");
        else S->g->model_name = s->name;
        return;
    case STMT_CONST: exec_const(S, env, s); return;
    case STMT_INPUT:
        if (!top) diag_error(s->loc, "inputs are declared at the top level, not inside a block");
        else exec_input(S, s);
        return;
    case STMT_ASSIGN: {
        Value v = sema_eval(S, env, s->value);
        env_set(S, env, s->name, v); /* V_ERR too, so later uses stay silent */
        return;
    }
    case STMT_BLOCK:
        if (!top) diag_error(s->loc, "blocks are defined at the top level");
        return; /* collected before execution */
    case STMT_RETURN:
        if (!S->in_block) {
            diag_error(s->loc, "'return' outside a block");
            return;
        }
        S->ret = sema_eval(S, env, s->value);
        return;
    case STMT_FOR: exec_for(S, env, s); return;
    case STMT_IF: {
        Value c = sema_eval(S, env, s->value);
        if (!sema_want_bool(S, c, s->value->loc)) return;
        if (c.i) sema_exec_body(S, env, s->body, s->n_body);
        else sema_exec_body(S, env, s->else_body, s->n_else);
        return;
    }
    case STMT_TRAIN:
        if (!top) diag_error(s->loc, "the train section belongs at the top level");
        else if (S->seen_train) diag_error(s->loc, "a model has one train section");
        else {
            S->seen_train = 1;
            sema_train(S, s);
        }
        return;
    }
}

void sema_exec_body(Sema *S, Env *env, AstStmt *const *body, int n) {
    for (int i = 0; i < n && S->ret.k == V_NONE && !diag_too_many() && !S->too_big; i++)
        exec_stmt(S, env, body[i]);
}

/* ---- -D overrides */

SemaDefine *sema_find_define(Sema *S, const char *name) {
    for (int i = 0; i < S->n_defs; i++)
        if (strcmp(S->defs[i].name, name) == 0) return &S->defs[i];
    return NULL;
}

Value sema_parse_define(Sema *S, SemaDefine *d) {
    (void)S;
    d->used = 1;
    const char *s = d->value;
    char *end;
    if (strcmp(s, "true") == 0 || strcmp(s, "false") == 0) return mk_bool(s[0] == 't');
    errno = 0;
    long long i = strtoll(s, &end, 10);
    if (*s && !*end && errno == 0) return sema_int(i);
    double f = strtod(s, &end);
    if (*s && !*end && isfinite(f)) return sema_float(f);
    diag_fatal_noloc("-D %s=%s: the value must be an integer, a number, true or false", d->name, s);
    return sema_error();
}

static void check_defines_used(Sema *S) {
    for (int i = 0; i < S->n_defs; i++)
        if (!S->defs[i].used)
            diag_fatal_noloc("-D %s: %s has no constant named '%s'", S->defs[i].name,
                             S->prog->path, S->defs[i].name);
}

/* ---- entry point */

static void collect_blocks(Sema *S) {
    for (int i = 0; i < S->prog->n_stmts; i++) {
        const AstStmt *s = S->prog->stmts[i];
        if (s->kind != STMT_BLOCK) continue;
        if (find_block(S, s->name) || sema_find_builtin(s->name)) {
            diag_error(s->name_loc, "'%s' is already defined%s", s->name,
                       sema_find_builtin(s->name) ? " as a built-in" : "");
            continue;
        }
        strmap_put(S->arena, &S->blocks, s->name, (void *)s);
    }
}

/* Drop the permutes and slices nothing reads: a transpose that a matrix product took as its
 * trans flag (sema_matmul) is never computed, nor a part of split() that is not used. Only
 * these: any other unread value stays as written. */
static void drop_unread_copies(Sema *S) {
    IrGraph *g = S->g;
    int *readers = arena_alloc(S->arena, ((size_t)g->n + 1) * sizeof *readers);
    for (int i = 0; i < g->n; i++) g->nodes[i]->id = i;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) readers[g->nodes[i]->in[k]->id]++;
    IrNode *kept[] = {g->loss, g->correct, g->output, S->named_output};
    for (size_t k = 0; k < sizeof kept / sizeof *kept; k++)
        if (kept[k]) readers[kept[k]->id]++;
    int n = 0;
    for (int i = g->n - 1; i >= 0; i--) {
        IrNode *x = g->nodes[i];
        if ((x->op == OP_PERMUTE || x->op == OP_SLICE) && !readers[i]) readers[x->in[0]->id]--, x->id = -1;
    }
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->id >= 0) g->nodes[n++] = g->nodes[i];
    g->n = n;
    ir_renumber(g);
}

IrGraph *sema_build(Arena *arena, const AstProgram *prog, SemaDefine *defs, int n_defs) {
    Sema S = {.arena = arena, .prog = prog, .defs = defs, .n_defs = n_defs, .prefix = ""};
    S.g = ir_graph_new(arena);
    S.g->source_path = prog->path;
    S.global = arena_alloc(arena, sizeof *S.global);
    S.ret = (Value){.k = V_NONE};
    collect_blocks(&S);
    sema_exec_body(&S, S.global, prog->stmts, prog->n_stmts);
    check_defines_used(&S);
    SrcLoc top = {.file = prog->path, .line = 1, .col = 1};
    if (!S.g->model_name && !diag_error_count()) {
        diag_error(top, "missing `model NAME` line");
        diag_hint("start the file with e.g. `model mlp`");
    }
    if (!S.g->n_inputs && !diag_error_count()) diag_error(top, "the model declares no inputs");
    if (!S.seen_train && !diag_error_count()) {
        diag_error(top, "the model has no train section");
        diag_hint("add `train { loss = cross_entropy(logits, label); optimizer = sgd(0.01) }`");
    }
    if (diag_error_count()) return NULL;
    drop_unread_copies(&S);
    S.g->n_fwd = S.g->n;
    sema_lora_apply(&S);
    if (diag_error_count()) return NULL;
    if (!ir_verify(S.g, "sema")) ICE("sema produced an invalid graph");
    return S.g;
}
