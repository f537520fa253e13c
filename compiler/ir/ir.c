/* ir.c - the operator table, shapes, graph building, the verifier and the printer.
 *
 * The verifier checks what every later stage relies on: operands precede their users, the
 * arity matches ops.def, and each operator's output shape and dtype agree with its operands.
 * What differs between operators - attributes, operand layouts, shape rule - is read from
 * ops.def's columns; an operator missing from the table, or a column entry the code does not
 * know, is an internal error, never a silent default.
 * The printer's text is the golden-test format, so it changes only on purpose.
 */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

#include "builder.h"

/* The verifier's rule for an operator's output shape (ops.def's shape column): the shape n
 * must have given its operands, in *want; 0 if an operand's shape is wrong. */
typedef int ShapeRule(const IrNode *n, IrShape *want);
#define OP(e, name, arity, kind, attrs, layouts, shape, lib, meaning) static ShapeRule shape_##shape;
#include "ops.def"
#undef OP

typedef struct OpInfo {
    const char *name;
    int arity;
    IrOpKind kind;
    unsigned attrs;      /* ATTR_* */
    const char *layouts; /* operand letters, '>', the result's */
    ShapeRule *shape;
    IrLibClass lib;
    const char *meaning;
} OpInfo;

static const OpInfo op_table[] = {
#define OP(e, name, arity, kind, attrs, layouts, shape, lib, meaning) \
    [OP_##e] = {name, arity, kind, attrs, layouts, shape_##shape, lib, meaning},
#include "ops.def"
#undef OP
};

/* The table's line for op; an operator outside it is a compiler bug. */
static const OpInfo *op_entry(IrOp op) {
    if ((unsigned)op >= OP__COUNT) ICE("operator %d is not in ops.def", (int)op);
    return &op_table[op];
}

const char *ir_op_name(IrOp op) { return op_entry(op)->name; }
int ir_op_arity(IrOp op) { return op_entry(op)->arity; }
IrOpKind ir_op_kind(IrOp op) { return op_entry(op)->kind; }
const char *ir_op_meaning(IrOp op) { return op_entry(op)->meaning; }
IrLibClass ir_op_lib(IrOp op) { return op_entry(op)->lib; }
static unsigned op_attrs(IrOp op) { return op_entry(op)->attrs; }

/* op's layouts column, checked against its arity. */
static const char *layouts_of(IrOp op) {
    const OpInfo *e = op_entry(op);
    if (strlen(e->layouts) != (size_t)e->arity + 2 || e->layouts[e->arity] != '>')
        ICE("ops.def: %s's layouts \"%s\" do not match its %d operands", e->name, e->layouts, e->arity);
    return e->layouts;
}

static char operand_letter(IrOp op, int k) {
    if (k < 0 || k >= ir_op_arity(op)) ICE("%s has no operand %d", ir_op_name(op), k);
    return layouts_of(op)[k];
}

static char result_letter(IrOp op) { return layouts_of(op)[ir_op_arity(op) + 1]; }
static int result_nhwc(IrOp op) { return result_letter(op) == 'n'; }

int ir_op_follows_layout(IrOp op) {
    for (int k = 0; k < ir_op_arity(op); k++)
        if (operand_letter(op, k) != 'o') return 0;
    return ir_op_arity(op) > 0 && result_nhwc(op);
}

int ir_op_is_compare(IrOp op) {
    return op == OP_EQ || op == OP_NE || op == OP_LT || op == OP_LE || op == OP_GT || op == OP_GE;
}

static const struct {
    const char *name, *ctype;
    int size;
    int is_float;
    int is_half; /* a 16-bit float, stored as uint16_t and computed in float */
} dtype_table[DT__COUNT] = {
    [DT_F32] = {"f32", "float", 4, 1, 0},     [DT_F16] = {"f16", "uint16_t", 2, 1, 1},
    [DT_BF16] = {"bf16", "uint16_t", 2, 1, 1}, [DT_I32] = {"i32", "int32_t", 4, 0, 0},
    [DT_I64] = {"i64", "int64_t", 8, 0, 0},   [DT_U8] = {"u8", "uint8_t", 1, 0, 0},
};

const char *ir_dtype_name(IrDtype dt) { return dtype_table[dt].name; }
const char *ir_dtype_ctype(IrDtype dt) { return dtype_table[dt].ctype; }
int ir_dtype_size(IrDtype dt) { return dtype_table[dt].size; }
int ir_dtype_is_float(IrDtype dt) { return dtype_table[dt].is_float; }
int ir_dtype_is_half(IrDtype dt) { return dtype_table[dt].is_half; }

int ir_dtype_from_name(const char *name, IrDtype *out) {
    for (int i = 0; i < DT__COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (IrDtype)i;
            return 1;
        }
    return 0;
}

/* ---- shapes */

int64_t ir_numel(const IrShape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) n *= s->dim[i];
    return n;
}

int ir_shape_eq(const IrShape *a, const IrShape *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

IrShape ir_shape(int rank, ...) {
    IrShape s = {.rank = rank};
    va_list ap;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++) s.dim[i] = va_arg(ap, int64_t);
    va_end(ap);
    return s;
}

IrShape ir_scalar_shape(void) { return (IrShape){0}; }

int ir_broadcast(const IrShape *a, const IrShape *b, IrShape *out) {
    IrShape r = {.rank = a->rank > b->rank ? a->rank : b->rank};
    for (int i = 0; i < r.rank; i++) {
        int ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        if (da != db && da != 1 && db != 1) return 0;
        r.dim[i] = da == 1 ? db : da;
    }
    *out = r;
    return 1;
}

const char *ir_shape_str(const IrShape *s, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < s->rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)s->dim[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

/* ---- building */

IrGraph *ir_graph_new(Arena *arena) {
    IrGraph *g = arena_alloc(arena, sizeof *g);
    g->arena = arena;
    g->train = (IrTrain){.optim = RT_OPTIM_SGD, .hyper = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}, .lr = 0.01,
                         .sched = SCHED_CONSTANT, .gamma = 0.1, .epochs = 1,
                         .eval_every = 1, .log_every = 100};
    return g;
}

/* The front end's and autodiff's way in: builder.c makes the node and appends it. */
IrNode *ir_add(IrGraph *g, IrOp op, IrShape shape, IrDtype dt, SrcLoc loc, int n_in, ...) {
    if (n_in < 0 || n_in > IR_MAX_OPERANDS) ICE("%s with %d operands", ir_op_name(op), n_in);
    IrNodeSpec spec = {.op = op, .n_in = n_in, .shape = shape, .dtype = dt, .loc = loc};
    va_list ap;
    va_start(ap, n_in);
    for (int i = 0; i < n_in; i++) spec.in[i] = va_arg(ap, IrNode *);
    va_end(ap);
    return ir_node_append(g, &spec);
}

IrNode *ir_const(IrGraph *g, double value, IrDtype dt, SrcLoc loc) {
    IrNode *n = ir_add(g, OP_CONST, ir_scalar_shape(), dt, loc, 0);
    n->attr.scalar = value;
    return n;
}

/* Room for one more element in an arena array of n elements: capacity 16, then doubling
 * (the arena never frees the old copy, so growing by a constant would cost O(n^2) memory). */
static void *grow16(Arena *a, void *items, int n, size_t size) {
    if (n && (n < 16 || (n & (n - 1)))) return items;
    void *more = arena_alloc(a, (size_t)(n ? 2 * n : 16) * size);
    if (n) memcpy(more, items, (size_t)n * size);
    return more;
}

IrParam *ir_add_param(IrGraph *g, const char *name, IrShape shape, IrInit init, double init_a,
                      SrcLoc loc) {
    return ir_register_param(g, ir_add(g, OP_PARAM, shape, DT_F32, loc, 0), name, init, init_a);
}

IrParam *ir_register_param(IrGraph *g, IrNode *n, const char *name, IrInit init, double init_a) {
    g->params = grow16(g->arena, g->params, g->n_params, sizeof *g->params);
    n->name = name;
    n->index = g->n_params;
    strmap_put(g->arena, &g->param_index, name, (void *)(intptr_t)(g->n_params + 1));
    IrParam *p = &g->params[g->n_params++];
    *p = (IrParam){.name = name, .node = n, .trainable = 1, .init = init, .init_a = init_a,
                   .grad_offset = -1};
    return p;
}

IrNode *ir_add_input(IrGraph *g, const char *name, IrShape shape, IrDtype dt, SrcLoc loc) {
    g->inputs = grow16(g->arena, g->inputs, g->n_inputs, sizeof *g->inputs);
    IrNode *n = ir_add(g, OP_INPUT, shape, dt, loc, 0);
    n->name = name;
    n->index = g->n_inputs;
    g->inputs[g->n_inputs++] = (IrInput){.name = name, .node = n, .loc = loc};
    return n;
}

IrParam *ir_find_param(IrGraph *g, const char *name) {
    intptr_t i = (intptr_t)strmap_get(&g->param_index, name);
    return i ? &g->params[i - 1] : NULL;
}

void ir_renumber(IrGraph *g) {
    for (int i = 0; i < g->n; i++) g->nodes[i]->id = i;
}

/* ---- physical layouts */

int ir_layout_matters(const IrShape *s) {
    return s->rank == 4 && s->dim[1] > 1 && s->dim[2] * s->dim[3] > 1;
}

const IrNode *ir_storage_root(const IrNode *n) {
    while (n->storage == ST_ALIAS) n = n->in[0];
    return n;
}

IrLayout ir_layout(int rank, const int order[]) {
    IrLayout l = LAYOUT_ROW_MAJOR;
    for (int i = 0; i < rank; i++)
        if (order[i] != i) l.permuted = 1;
    for (int i = 0; i < rank && l.permuted; i++) l.order[i] = (signed char)order[i];
    return l;
}

int ir_layout_eq(IrLayout a, IrLayout b) {
    if (a.permuted != b.permuted) return 0;
    for (int i = 0; i < IR_MAX_RANK; i++)
        if (a.order[i] != b.order[i]) return 0;
    return 1;
}

void ir_layout_order(IrLayout l, int rank, int order[IR_MAX_RANK]) {
    for (int i = 0; i < rank; i++) order[i] = l.permuted ? l.order[i] : i;
}

IrLayout ir_layout_permuted(IrLayout lx, int rank, const int perm[]) {
    int x_order[IR_MAX_RANK], y_axis[IR_MAX_RANK], order[IR_MAX_RANK];
    ir_layout_order(lx, rank, x_order);
    for (int i = 0; i < rank; i++) y_axis[perm[i]] = i; /* x's axis perm[i] is y's axis i */
    for (int i = 0; i < rank; i++) order[i] = y_axis[x_order[i]];
    return ir_layout(rank, order);
}

int ir_layout_reshaped(IrLayout lx, const IrShape *x, const IrShape *y, IrLayout *ly) {
    int x_order[IR_MAX_RANK], pos[IR_MAX_RANK], n_pos = 0;
    ir_layout_order(lx, x->rank, x_order);
    for (int p = 0; p < x->rank; p++) /* pos: an axis's place among x's axes longer than 1 */
        if (x->dim[x_order[p]] != 1) pos[x_order[p]] = n_pos++;
    /* match runs of x's and y's axes longer than 1 with equal products, left to right */
    int group_at[IR_MAX_RANK], first_y[IR_MAX_RANK], end_y[IR_MAX_RANK], n_groups = 0;
    for (int p = 0; p < n_pos; p++) group_at[p] = -1;
    for (int i = 0, j = 0;;) {
        while (i < x->rank && x->dim[i] == 1) i++;
        while (j < y->rank && y->dim[j] == 1) j++;
        if (i == x->rank || j == y->rank) {
            if (i != x->rank || j != y->rank) return 0;
            break;
        }
        int i0 = i, j0 = j;
        int64_t px = x->dim[i++], py = y->dim[j++];
        while (px != py) {
            int *k = px < py ? &i : &j;
            const IrShape *s = px < py ? x : y;
            while (*k < s->rank && s->dim[*k] == 1) (*k)++;
            if (*k == s->rank) return 0;
            *(px < py ? &px : &py) *= s->dim[(*k)++];
        }
        for (int a = i0 + 1, next = pos[i0] + 1; a < i; a++) /* side by side, in order */
            if (x->dim[a] != 1 && pos[a] != next++) return 0;
        group_at[pos[i0]] = n_groups;
        first_y[n_groups] = j0, end_y[n_groups] = j, n_groups++;
    }
    /* y's axes longer than 1 where their groups lie, then each axis of 1 before the first
     * later axis (so that a row-major x gives a row-major y) */
    int order[IR_MAX_RANK], n = 0;
    for (int p = 0; p < n_pos; p++) {
        if (group_at[p] < 0) continue; /* not the first x axis of a group */
        for (int b = first_y[group_at[p]]; b < end_y[group_at[p]]; b++)
            if (y->dim[b] != 1) order[n++] = b;
    }
    for (int u = 0; u < y->rank; u++) {
        if (y->dim[u] != 1) continue;
        int t = 0;
        while (t < n && order[t] < u) t++;
        memmove(order + t + 1, order + t, (size_t)(n - t) * sizeof *order);
        order[t] = u, n++;
    }
    *ly = ir_layout(y->rank, order);
    return 1;
}

int ir_view_layout(const IrNode *n, IrLayout *out) {
    const IrNode *x = n->in[0];
    switch (n->op) {
    case OP_PERMUTE_VIEW: *out = ir_layout_permuted(x->layout, n->shape.rank, n->attr.perm); return 1;
    case OP_RESHAPE: return ir_layout_reshaped(x->layout, &x->shape, &n->shape, out);
    default: ICE("%s is not a view read in another layout", ir_op_name(n->op));
    }
}

int ir_stored_as(const IrNode *x, IrLayout layout) {
    int have[IR_MAX_RANK], want[IR_MAX_RANK], m = 0, k = 0;
    ir_layout_order(x->layout, x->shape.rank, have);
    ir_layout_order(layout, x->shape.rank, want);
    for (;; m++, k++) { /* the axes longer than 1, in physical order, must agree */
        while (m < x->shape.rank && x->shape.dim[have[m]] == 1) m++;
        while (k < x->shape.rank && x->shape.dim[want[k]] == 1) k++;
        if (m == x->shape.rank || k == x->shape.rank) return m == k;
        if (have[m] != want[k]) return 0;
    }
}

int ir_conv_nhwc_ok(const IrNode *n) {
    const IrShape *w = n->op == OP_CONV2D_BWD_FILTER ? &n->shape : &n->in[1]->shape;
    int strided = n->attr.stride[0] > 1 || n->attr.stride[1] > 1;
    return !(w->dim[2] == 1 && w->dim[3] == 1 && strided && w->dim[1] % 8 != 0);
}

/* A filter gradient's activations (letter 'c'): channels-last together if either is and the
 * convolution may run channels-last. */
static int acts_nhwc(const IrNode *n) {
    if (!ir_conv_nhwc_ok(n)) return 0;
    for (int k = 0; k < n->n_in; k++)
        if (operand_letter(n->op, k) == 'c' && ir_layout_eq(n->in[k]->layout, LAYOUT_NHWC)) return 1;
    return 0;
}

int ir_operand_layout(const IrNode *n, int k, IrLayout *want) {
    char letter = operand_letter(n->op, k);
    switch (letter) {
    case 'a': return 0;
    case 'b':
        if (ir_stored_as(n->in[k], LAYOUT_ROW_MAJOR) ||
            (n->in[k]->shape.rank == 4 && ir_stored_as(n->in[k], LAYOUT_NHWC)))
            return 0;
        *want = LAYOUT_ROW_MAJOR;
        return 1;
    case 'r': *want = LAYOUT_ROW_MAJOR; return 1;
    case 'o': *want = n->layout; return 1;
    case 'f': *want = n->attr.filter; return 1; /* oihw, or ohwi (KRSC) */
    case 'c': *want = acts_nhwc(n) ? LAYOUT_NHWC : LAYOUT_ROW_MAJOR; return 1;
    case 'x': *want = n->in[0]->layout; return 1;
    case 'v': { /* a reshape: any layout its view can be read from in place, else row-major */
        IrLayout view;
        if (ir_view_layout(n, &view)) return 0;
        *want = LAYOUT_ROW_MAJOR;
        return 1;
    }
    default: ICE("ops.def: %s has layout letter '%c'", ir_op_name(n->op), letter);
    }
}

int ir_operand_nhwc(const IrNode *n, int k) {
    IrLayout want;
    return ir_operand_layout(n, k, &want) && ir_layout_eq(want, LAYOUT_NHWC);
}

/* ---- shape rules, one per ops.def shape column entry */

/* Sources: the shape they are given. */
static int shape_given(const IrNode *n, IrShape *want) { return *want = n->shape, 1; }

static int shape_reshape(const IrNode *n, IrShape *want) {
    *want = n->shape;
    return ir_numel(&n->in[0]->shape) == ir_numel(&n->shape);
}

static int shape_row(const IrNode *n, IrShape *want) {
    const IrShape *a = &n->in[0]->shape;
    *want = n->shape;
    return a->rank >= 1 && n->attr.row >= 0 && n->attr.row < a->dim[0] &&
           ir_numel(a) == a->dim[0] * ir_numel(&n->shape);
}

static int shape_part(const IrNode *n, IrShape *want) {
    *want = n->shape;
    return n->attr.part >= 0 && n->attr.part + ir_numel(&n->shape) <= ir_numel(&n->in[0]->shape);
}

/* Element-wise: the operands broadcast together. */
static int shape_broadcast(const IrNode *n, IrShape *want) {
    *want = n->in[0]->shape;
    for (int i = 1; i < n->n_in; i++)
        if (!ir_broadcast(want, &n->in[i]->shape, want)) return 0;
    return 1;
}

static int shape_expand(const IrNode *n, IrShape *want) {
    IrShape s;
    *want = n->shape;
    return ir_broadcast(&n->in[0]->shape, &n->shape, &s) && ir_shape_eq(&s, &n->shape);
}

/* Batch-norm operands: x [N, C, ...] (the output's shape), the per-channel ones [C], and
 * bn_bwd_data's last, dy, x's shape. */
static int shape_bn(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    *want = n->shape;
    if (x->rank < 2 || !ir_shape_eq(x, &n->shape)) return 0;
    int64_t C = x->dim[1];
    for (int i = 1; i < n->n_in; i++) {
        const IrShape *s = &n->in[i]->shape;
        int is_dy = n->op == OP_BN_BWD_DATA && i == n->n_in - 1;
        if (is_dy ? !ir_shape_eq(s, x) : !(s->rank == 1 && s->dim[0] == C)) return 0;
    }
    return 1;
}

static int shape_sum_to(const IrNode *n, IrShape *want) {
    IrShape s;
    *want = n->shape;
    return ir_broadcast(&n->in[0]->shape, &n->shape, &s) && ir_shape_eq(&s, &n->in[0]->shape);
}

static int shape_scalar(const IrNode *n, IrShape *want) {
    (void)n;
    return *want = ir_scalar_shape(), 1;
}

static int shape_matmul(const IrNode *n, IrShape *want) {
    const IrNode *a = n->in[0], *b = n->in[1];
    int r = a->shape.rank;
    if (r < 2 || r > 3 || b->shape.rank != r) return 0;
    int64_t m = a->shape.dim[r - 2 + n->attr.trans_a], ka = a->shape.dim[r - 1 - n->attr.trans_a];
    int64_t kb = b->shape.dim[r - 2 + n->attr.trans_b], nn = b->shape.dim[r - 1 - n->attr.trans_b];
    if (ka != kb || (r == 3 && a->shape.dim[0] != b->shape.dim[0])) return 0;
    *want = a->shape;
    want->dim[r - 2] = m;
    want->dim[r - 1] = nn;
    return 1;
}

/* matmul_rows(a, b, labels): a rank-2 product, and a label for each row of a (of op(a)'s
 * columns under trans_a: the rows the product sums over) */
static int shape_matmul_rows(const IrNode *n, IrShape *want) {
    const IrNode *a = n->in[0], *labels = n->in[2];
    return shape_matmul(n, want) && a->shape.rank == 2 && labels->dtype == DT_I64 &&
           ir_numel(&labels->shape) == a->shape.dim[0];
}

/* Convolutions and pooling: rank 4 in and out (sema checks the window arithmetic). */
static int shape_rank4(const IrNode *n, IrShape *want) {
    *want = n->shape;
    return n->in[0]->shape.rank == 4 && n->shape.rank == 4;
}

/* softmax and log_softmax (and their gradients): attr.axis is one of the operand's axes. */
static int axis_ok(const IrNode *n) { return n->attr.axis >= 0 && n->attr.axis < n->in[0]->shape.rank; }

static int shape_softmax(const IrNode *n, IrShape *want) {
    *want = n->in[0]->shape;
    return want->rank >= 1 && axis_ok(n);
}

static int shape_softmax_bwd(const IrNode *n, IrShape *want) {
    *want = n->in[0]->shape;
    return ir_shape_eq(&n->in[0]->shape, &n->in[1]->shape) && axis_ok(n);
}

/* Layer and RMS norm over the last axis D of x (operand 0, the output's shape): the weight and
 * bias are [D], a gradient's dy (its last operand) has x's shape. A gradient with
 * attr.norm_params is flat: dx, then the parameter gradients (layernorm's [2, D], rmsnorm's [D]). */
static int shape_norm(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    *want = *x;
    if (x->rank < 1) return 0;
    int64_t D = x->dim[x->rank - 1];
    int bwd = n->op == OP_LAYERNORM_BWD || n->op == OP_RMSNORM_BWD;
    if (n->attr.norm_params && !bwd) return 0;
    if (n->attr.norm_params) *want = ir_shape(1, ir_numel(x) + (n->op == OP_LAYERNORM_BWD ? 2 : 1) * D);
    for (int i = 1; i < n->n_in; i++) {
        const IrShape *s = &n->in[i]->shape;
        if (bwd && i == n->n_in - 1 ? !ir_shape_eq(s, x) : !(s->rank == 1 && s->dim[0] == D)) return 0;
    }
    return 1;
}

/* The parameter gradients of a norm over the last axis D of x: layernorm's [2, D] (weight,
 * bias), rmsnorm's [D]; operand 1 (dy) has x's shape. */
static int shape_norm_params(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    *want = n->shape;
    if (x->rank < 1 || !ir_shape_eq(x, &n->in[1]->shape)) return 0;
    int64_t D = x->dim[x->rank - 1];
    *want = n->op == OP_LAYERNORM_BWD_PARAMS ? ir_shape(2, (int64_t)2, D) : ir_shape(1, D);
    return 1;
}

/* Labels [...] (i64) index the classes of logits [..., C]: the same leading axes. */
static int labels_match(const IrNode *logits, const IrNode *labels) {
    const IrShape *a = &logits->shape, *b = &labels->shape;
    if (a->rank < 2 || b->rank != a->rank - 1 || labels->dtype != DT_I64) return 0;
    for (int i = 0; i < b->rank; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

static int shape_xent(const IrNode *n, IrShape *want) {
    *want = n->in[1]->shape;
    return labels_match(n->in[0], n->in[1]);
}

static int shape_xent_bwd(const IrNode *n, IrShape *want) {
    *want = n->in[0]->shape;
    return want->rank >= 2 && labels_match(n->in[0], n->in[1]) && ir_shape_eq(&n->in[2]->shape, &n->in[1]->shape) &&
           ir_shape_eq(&n->in[3]->shape, &n->in[1]->shape);
}

static int shape_accuracy(const IrNode *n, IrShape *want) {
    *want = ir_scalar_shape();
    return labels_match(n->in[0], n->in[1]);
}

/* gather(table [N, D], idx [...]) -> [..., D] */
static int shape_gather(const IrNode *n, IrShape *want) {
    const IrShape *t = &n->in[0]->shape, *idx = &n->in[1]->shape;
    *want = *idx;
    if (t->rank != 2 || idx->rank >= IR_MAX_RANK || n->in[1]->dtype != DT_I64) return 0;
    want->dim[want->rank++] = t->dim[1];
    return 1;
}

/* gather_bwd(idx [...], dy [..., D]) -> [N, D] */
static int shape_gather_bwd(const IrNode *n, IrShape *want) {
    const IrShape *idx = &n->in[0]->shape, *dy = &n->in[1]->shape;
    *want = n->shape;
    if (n->shape.rank != 2 || dy->rank != idx->rank + 1 || n->in[0]->dtype != DT_I64) return 0;
    for (int i = 0; i < idx->rank; i++)
        if (idx->dim[i] != dy->dim[i]) return 0;
    return dy->dim[dy->rank - 1] == n->shape.dim[1];
}

/* row_order(labels [...]) -> i64 [R], R the number of labels */
static int shape_row_order(const IrNode *n, IrShape *want) {
    *want = ir_shape(1, ir_numel(&n->in[0]->shape));
    return n->in[0]->dtype == DT_I64 && n->dtype == DT_I64;
}

/* row_compact(x [R, C], order, labels) -> [R, C]; order and labels R i64 each */
static int shape_row_compact(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    *want = *x;
    return x->rank == 2 && n->in[1]->dtype == DT_I64 && n->in[2]->dtype == DT_I64 &&
           ir_numel(&n->in[1]->shape) == x->dim[0] && ir_numel(&n->in[2]->shape) == x->dim[0];
}

static int shape_bn_stats(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    *want = n->shape;
    if (x->rank < 2) return 0;
    *want = ir_shape(2, (int64_t)2, x->dim[1]);
    return 1;
}

const IrNode *ir_bn_stats(const IrNode *n) {
    const IrNode *mean = n->in[1], *invstd = n->in[2];
    if ((n->op != OP_BN_APPLY && n->op != OP_BN_BWD_DATA) || mean->op != OP_ROW || invstd->op != OP_ROW ||
        mean->attr.row != 0 || invstd->attr.row != 1 || mean->in[0] != invstd->in[0] || mean->in[0]->op != OP_BN_STATS)
        ICE("%%%d = %s does not read the two results of one bn_stats", n->id, ir_op_name(n->op));
    return mean->in[0];
}

static int shape_bn_sums(const IrNode *n, IrShape *want) {
    return shape_bn_stats(n, want) && ir_shape_eq(&n->in[2]->shape, &n->in[0]->shape);
}

/* Permute: perm is a permutation of the operand's axes and the node's axis i is its perm[i]. */
static int shape_permute(const IrNode *n, IrShape *want) {
    const IrShape *x = &n->in[0]->shape;
    int seen[IR_MAX_RANK] = {0};
    *want = n->shape;
    if (x->rank != n->shape.rank) return 0;
    for (int i = 0; i < x->rank; i++) {
        int p = n->attr.perm[i];
        if (p < 0 || p >= x->rank || seen[p]++) return 0;
        want->dim[i] = x->dim[p];
    }
    return 1;
}

/* `small` is `big` but for a part [start, start + small's extent) of axis `axis`. */
static int part_along(const IrShape *small, const IrShape *big, int axis, int64_t start) {
    if (small->rank != big->rank || axis < 0 || axis >= big->rank || start < 0 ||
        start + small->dim[axis] > big->dim[axis])
        return 0;
    for (int i = 0; i < big->rank; i++)
        if (i != axis && small->dim[i] != big->dim[i]) return 0;
    return 1;
}

static int shape_slice(const IrNode *n, IrShape *want) {
    *want = n->shape;
    return part_along(&n->shape, &n->in[0]->shape, n->attr.axis, n->attr.start);
}

static int shape_slice_bwd(const IrNode *n, IrShape *want) {
    *want = n->shape;
    return part_along(&n->in[0]->shape, &n->shape, n->attr.axis, n->attr.start);
}

static int shape_concat(const IrNode *n, IrShape *want) {
    const IrShape *a = &n->in[0]->shape, *b = &n->in[1]->shape;
    int axis = n->attr.axis;
    *want = *a;
    if (axis < 0 || axis >= a->rank) return 0;
    want->dim[axis] += b->dim[axis];
    return part_along(a, want, axis, 0) && part_along(b, want, axis, a->dim[axis]);
}

/* Max along an axis: the operand's shape with that axis 1. */
static int shape_max_axis(const IrNode *n, IrShape *want) {
    *want = n->in[0]->shape;
    if (n->attr.axis < 0 || n->attr.axis >= want->rank) return 0;
    want->dim[n->attr.axis] = 1;
    return 1;
}

static int shape_max_bwd(const IrNode *n, IrShape *want) {
    IrShape y;
    *want = n->in[0]->shape;
    return shape_max_axis(n, &y) && ir_shape_eq(&y, &n->in[1]->shape);
}

/* Attention: q [..., T, d], k [..., S, d], v [..., S, e] with the same leading axes, f32, except
 * that k's and v's last leading axis (the heads) may divide q's (grouped-query attention); the
 * result [..., T, e]; a mask (operand 3) f32 or u8 and broadcast to [..., T, S]. */
static int attention_shapes_ok(const IrShape *a, const IrShape *b, const IrShape *c, const IrNode *mask) {
    int r = a->rank;
    if (r < 2 || b->rank != r || c->rank != r) return 0;
    for (int i = 0; i < r - 2; i++)
        if (c->dim[i] != b->dim[i] || (b->dim[i] != a->dim[i] && (i != r - 3 || a->dim[i] % b->dim[i]))) return 0;
    if (b->dim[r - 1] != a->dim[r - 1] || c->dim[r - 2] != b->dim[r - 2]) return 0;
    if (!mask) return 1;
    IrShape scores = *a, s;
    scores.dim[r - 1] = b->dim[r - 2];
    return (mask->dtype == DT_F32 || mask->dtype == DT_U8) && mask->shape.rank <= r &&
           ir_broadcast(&mask->shape, &scores, &s) && ir_shape_eq(&s, &scores);
}

int ir_attention_ok(const IrNode *q, const IrNode *k, const IrNode *v, const IrNode *mask) {
    return q->dtype == DT_F32 && k->dtype == DT_F32 && v->dtype == DT_F32 &&
           attention_shapes_ok(&q->shape, &k->shape, &v->shape, mask);
}

int ir_attention_tokens(const IrNode *n) {
    return n->attr.attn_heads[0] || n->attr.attn_heads[1] || n->attr.attn_heads[2];
}

static void metrics_of(const IrNode *n, const IrNode *out[IR_MAX_METRICS], int *count) {
    if (n->op == OP_CONCAT || n->op == OP_RESHAPE) {
        for (int k = 0; k < n->n_in; k++) metrics_of(n->in[k], out, count);
        return;
    }
    if (n->op != OP_ACCURACY) ICE("the metrics' counts come from %s, not accuracy", ir_op_name(n->op));
    if (*count == IR_MAX_METRICS) ICE("more than %d metrics", IR_MAX_METRICS);
    out[(*count)++] = n;
}

int ir_metrics(const IrGraph *g, const IrNode *out[IR_MAX_METRICS]) {
    int count = 0;
    if (g->correct) metrics_of(g->correct, out, &count);
    return count;
}

int ir_attention_qkv(const IrNode *n, IrShape qkv[3]) {
    const IrAttrs *a = &n->attr;
    const int tokens = ir_attention_tokens(n);
    for (int i = 0; i < 3; i++) {
        const IrShape *x = &n->in[i]->shape;
        if (n->in[i]->dtype != DT_F32) return 0;
        if (!a->attn_heads[i]) { /* plain; beside operands read from tokens, [B, heads, T, head_dim] */
            if (tokens && x->rank != 4) return 0;
            qkv[i] = *x;
            continue;
        }
        if (x->rank != 3 || a->attn_heads[i] < 1 || a->attn_hdim[i] < 1 || a->attn_col[i] < 0 ||
            a->attn_col[i] + a->attn_heads[i] * a->attn_hdim[i] > x->dim[2])
            return 0;
        qkv[i] = ir_shape(4, x->dim[0], (int64_t)a->attn_heads[i], x->dim[1], a->attn_hdim[i]);
    }
    /* two operands of one base read disjoint columns: their gradients share it (autodiff) */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < i; j++)
            if (a->attn_heads[i] && a->attn_heads[j] && n->in[i] == n->in[j] && a->attn_col[i] < a->attn_col[j] + a->attn_heads[j] * a->attn_hdim[j] &&
                a->attn_col[j] < a->attn_col[i] + a->attn_heads[i] * a->attn_hdim[i])
                return 0;
    return 1;
}

/* The result of attention n whose q, k, v are s: [..., T, e]; heads read from tokens,
 * [B, T, heads * e], the heads side by side. */
static IrShape attention_out(const IrNode *n, const IrShape s[3]) {
    if (ir_attention_tokens(n)) return ir_shape(3, s[0].dim[0], s[0].dim[2], s[0].dim[1] * s[2].dim[3]);
    IrShape y = s[0];
    y.dim[y.rank - 1] = s[2].dim[s[2].rank - 1];
    return y;
}

static int shape_attention(const IrNode *n, IrShape *want) {
    IrShape s[3];
    if (!ir_attention_qkv(n, s)) return 0;
    *want = attention_out(n, s);
    return attention_shapes_ok(&s[0], &s[1], &s[2], n->n_in > 3 ? n->in[3] : NULL);
}

int ir_attention_first(const IrNode *n, int i) {
    for (int j = 0; j < i && n->attr.attn_heads[i]; j++)
        if (n->attr.attn_heads[j] && n->in[j] == n->in[i]) return j;
    return i;
}

int64_t ir_attention_grad_at(const IrNode *n, int i) {
    int64_t at = 0;
    i = ir_attention_first(n, i);
    for (int j = 0; j < i; j++)
        if (ir_attention_first(n, j) == j) at += ir_numel(&n->in[j]->shape);
    return at;
}

int64_t ir_attention_bwd_numel(const IrNode *n) {
    IrShape s[3];
    if (!ir_attention_qkv(n, s)) return 0;
    int64_t grads = 0;
    for (int j = 0; j < 3; j++)
        if (ir_attention_first(n, j) == j) grads += ir_numel(&n->in[j]->shape);
    return grads + 2 * (ir_numel(&s[0]) / s[0].dim[s[0].rank - 1]);
}

static int shape_attention_bwd(const IrNode *n, IrShape *want) {
    IrShape s[3];
    if (!ir_attention_qkv(n, s) || !attention_shapes_ok(&s[0], &s[1], &s[2], n->n_in > 5 ? n->in[5] : NULL))
        return 0;
    *want = ir_shape(1, ir_attention_bwd_numel(n));
    IrShape o = attention_out(n, s);
    return ir_shape_eq(&n->in[3]->shape, &o) && ir_shape_eq(&n->in[4]->shape, &o);
}

/* ---- verifier */

static int verify_fail(const char *stage, const IrNode *n, const char *what) {
    char buf[160];
    fprintf(stderr, "netc: IR verification failed after %s: %%%d = %s %s: %s\n", stage, n->id,
            ir_op_name(n->op), ir_shape_str(&n->shape, buf, sizeof buf), what);
    return 0;
}

/* The attribute holds the value every operator that does not read it leaves there. */
static int attr_is_default(unsigned attr, const IrAttrs *a) {
    switch (attr) {
    case ATTR_VALUE: return a->scalar == 0;
    case ATTR_TRANS: return !a->trans_a && !a->trans_b;
    case ATTR_KERNEL: return !a->kernel[0] && !a->kernel[1];
    case ATTR_STRIDE: return !a->stride[0] && !a->stride[1];
    case ATTR_PAD: return !a->pad[0] && !a->pad[1];
    case ATTR_DILATION: return !a->dil[0] && !a->dil[1];
    case ATTR_GROUPS: return a->groups == 1;
    case ATTR_FILTER: return ir_layout_eq(a->filter, LAYOUT_ROW_MAJOR);
    case ATTR_DROPOUT: return a->p == 0 && !a->seed_id;
    case ATTR_BATCH_MASKED: return !a->batch_masked;
    case ATTR_BN: return a->eps == 0 && a->momentum == 0 && !a->stat_param && !a->bn_frozen;
    case ATTR_ROW: return !a->row;
    case ATTR_SMOOTHING: return a->smoothing == 0;
    case ATTR_PERM:
        for (int i = 0; i < IR_MAX_RANK; i++)
            if (a->perm[i]) return 0;
        return 1;
    case ATTR_AXIS: return !a->axis;
    case ATTR_SLICE: return !a->start;
    case ATTR_ATTN: return !a->causal && a->attn_scale == 0 && !a->attn_heads[0] && !a->attn_heads[1] && !a->attn_heads[2];
    case ATTR_PART: return !a->part;
    case ATTR_IGNORE: return !a->has_ignore && a->ignore_index == 0;
    case ATTR_TOPK: return !a->top_k;
    case ATTR_NORM: return a->norm_eps == 0 && !a->norm_params;
    default: ICE("attr_is_default: attribute bit %#x", attr);
    }
}

/* Every attribute n's operator does not read (ops.def) holds its default. */
static int attrs_unused_default(const IrNode *n) {
    for (unsigned bit = 1; bit < ATTR__END; bit <<= 1)
        if (!(op_attrs(n->op) & bit) && !attr_is_default(bit, &n->attr)) return 0;
    return 1;
}

/* n reads or writes a filter channels-last (KRSC): a convolution whose attr.filter says so,
 * or a filter gradient (operands 'c') produced channels-last. */
static int krsc_filter(const IrNode *n) {
    if (op_attrs(n->op) & ATTR_FILTER) return ir_layout_eq(n->attr.filter, LAYOUT_NHWC);
    return n->n_in > 0 && operand_letter(n->op, 0) == 'c' && ir_layout_eq(n->layout, LAYOUT_NHWC);
}

/* l is ir_layout's value for an order of a rank-`rank` tensor's axes: row-major all zero, or
 * a permutation other than the identity, each axis once, zero beyond the rank. */
static int layout_fits(IrLayout l, int rank) {
    int seen[IR_MAX_RANK] = {0}, identity = 1;
    for (int i = 0; i < IR_MAX_RANK; i++) {
        if ((i >= rank || !l.permuted) && l.order[i] != 0) return 0;
        if (i < rank && l.permuted && (l.order[i] < 0 || l.order[i] >= rank || seen[l.order[i]]++)) return 0;
        if (i < rank && l.order[i] != i) identity = 0;
    }
    return !l.permuted || !identity;
}

static int verify_layouts(const IrNode *n, const char *stage) {
    if (!layout_fits(n->layout, n->shape.rank))
        return verify_fail(stage, n, "its layout is not an order of the axes of its shape");
    if (result_letter(n->op) == 'p') {
        IrLayout view;
        if (!ir_view_layout(n, &view) || !ir_layout_eq(n->layout, view))
            return verify_fail(stage, n, "a view's layout is not its operand's storage read in its shape");
    } else if (n->layout.permuted && !result_nhwc(n->op)) {
        return verify_fail(stage, n, "this operator has no permuted form");
    }
    /* a filter channels-last (KRSC) only beside channels-last activations: the libraries take
     * the two in one format */
    if (krsc_filter(n) && !ir_operand_nhwc(n, 0))
        return verify_fail(stage, n, "a channels-last filter beside row-major activations");
    for (int i = 0; i < n->n_in; i++) {
        IrLayout want;
        if (ir_operand_layout(n, i, &want) && !ir_stored_as(n->in[i], want))
            return verify_fail(stage, n, "an operand is stored in a layout the operator does not read");
    }
    return 1;
}

static int verify_node(const IrGraph *g, const IrNode *n, int pos, const char *stage) {
    if ((ir_op_kind(n->op) == OPK_LIB) != (ir_op_lib(n->op) != LIB_NONE))
        ICE("ops.def: %s's kind and library class disagree", ir_op_name(n->op));
    if (n->id != pos) return verify_fail(stage, n, "id does not match its schedule position");
    if (n->n_in != ir_op_arity(n->op)) return verify_fail(stage, n, "wrong number of operands");
    for (int i = 0; i < n->n_in; i++) {
        const IrNode *in = n->in[i];
        if (!in || in->id >= pos || g->nodes[in->id] != in)
            return verify_fail(stage, n, "operand is not defined before its use");
    }
    if (n->shape.rank < 0 || n->shape.rank > IR_MAX_RANK) return verify_fail(stage, n, "bad rank");
    for (int i = 0; i < n->shape.rank; i++)
        if (n->shape.dim[i] < 1) return verify_fail(stage, n, "dimension below 1");
    IrShape want;
    if (!op_entry(n->op)->shape(n, &want) || !ir_shape_eq(&want, &n->shape))
        return verify_fail(stage, n, "shape does not follow from the operands");
    if (!verify_layouts(n, stage)) return 0;
    if (!attrs_unused_default(n)) return verify_fail(stage, n, "an attribute the operator does not read is set");
    int ew_float = ir_op_kind(n->op) == OPK_EW && n->op != OP_CAST && n->op != OP_IOTA && !ir_op_is_compare(n->op);
    if (ir_op_is_compare(n->op) && (n->dtype != DT_U8 || n->in[0]->dtype != n->in[1]->dtype))
        return verify_fail(stage, n, "a comparison is u8 of two operands of one dtype");
    if (n->op == OP_IOTA && (n->dtype != DT_I64 || n->attr.axis < 0 || n->attr.axis >= n->shape.rank))
        return verify_fail(stage, n, "iota is i64 with an axis of its shape");
    if ((ew_float || ir_op_kind(n->op) == OPK_REDUCE) && !ir_dtype_is_float(n->dtype))
        return verify_fail(stage, n, "arithmetic on a non-float dtype");
    return 1;
}

int ir_verify(const IrGraph *g, const char *stage) {
    for (int i = 0; i < g->n; i++)
        if (!verify_node(g, g->nodes[i], i, stage)) return 0;
    if (g->loss && (g->loss->shape.rank != 0 || g->loss->dtype != DT_F32)) {
        fprintf(stderr, "netc: IR verification failed after %s: loss is not a scalar f32\n", stage);
        return 0;
    }
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (p->grad && !ir_stored_as(p->grad, LAYOUT_ROW_MAJOR)) {
            fprintf(stderr, "netc: IR verification failed after %s: gradient of '%s' is not row-major\n", stage,
                    p->name);
            return 0;
        }
        if (p->grad && !ir_shape_eq(&p->grad->shape, &p->node->shape)) {
            fprintf(stderr, "netc: IR verification failed after %s: gradient of '%s' has the wrong shape\n",
                    stage, p->name);
            return 0;
        }
    }
    return 1;
}

/* ---- printer */

/* One attribute as --dump prints it: flags and label smoothing only when set. */
static void print_attr(unsigned attr, const IrNode *n, FILE *out) {
    const IrAttrs *a = &n->attr;
    switch (attr) {
    case ATTR_VALUE: fprintf(out, " value=%.9g", a->scalar); break;
    case ATTR_TRANS:
        if (a->trans_a) fprintf(out, " trans_a");
        if (a->trans_b) fprintf(out, " trans_b");
        break;
    case ATTR_KERNEL: fprintf(out, " kernel=%d,%d", a->kernel[0], a->kernel[1]); break;
    case ATTR_STRIDE: fprintf(out, " stride=%d,%d", a->stride[0], a->stride[1]); break;
    case ATTR_PAD: fprintf(out, " pad=%d,%d", a->pad[0], a->pad[1]); break;
    case ATTR_DILATION: fprintf(out, " dilation=%d,%d", a->dil[0], a->dil[1]); break;
    case ATTR_GROUPS: fprintf(out, " groups=%d", a->groups); break;
    case ATTR_FILTER:
        if (ir_layout_eq(a->filter, LAYOUT_NHWC)) fprintf(out, " filter=krsc");
        break;
    case ATTR_DROPOUT: /* attention's only when it drops */
        if (a->p != 0) fprintf(out, " p=%g mask=%d", a->p, a->seed_id);
        break;
    case ATTR_BATCH_MASKED:
        if (a->batch_masked) fprintf(out, " batch_masked");
        break;
    case ATTR_BN:
        fprintf(out, " eps=%g momentum=%g running=%d%s", a->eps, a->momentum, a->stat_param, a->bn_frozen ? " frozen" : "");
        break;
    case ATTR_ROW: fprintf(out, " row=%d", a->row); break;
    case ATTR_SMOOTHING:
        if (a->smoothing != 0) fprintf(out, " smoothing=%g", a->smoothing);
        break;
    case ATTR_PERM:
        for (int i = 0; i < n->shape.rank; i++) fprintf(out, "%s%d", i ? "," : " perm=", a->perm[i]);
        break;
    case ATTR_AXIS: fprintf(out, " axis=%d", a->axis); break;
    case ATTR_SLICE: fprintf(out, " start=%lld", (long long)a->start); break;
    case ATTR_ATTN:
        if (a->causal) fprintf(out, " causal");
        fprintf(out, " scale=%.9g", a->attn_scale);
        if (ir_attention_tokens(n)) /* heads read from tokens */
            fprintf(out, " heads=%d,%d,%d head_dim=%lld,%lld,%lld cols=%lld,%lld,%lld", a->attn_heads[0],
                    a->attn_heads[1], a->attn_heads[2], (long long)a->attn_hdim[0], (long long)a->attn_hdim[1],
                    (long long)a->attn_hdim[2], (long long)a->attn_col[0], (long long)a->attn_col[1],
                    (long long)a->attn_col[2]);
        break;
    case ATTR_PART: fprintf(out, " part=%lld", (long long)a->part); break;
    case ATTR_IGNORE:
        if (a->has_ignore) fprintf(out, " ignore_index=%lld", (long long)a->ignore_index);
        break;
    case ATTR_TOPK:
        if (a->top_k > 1) fprintf(out, " top_k=%d", a->top_k);
        break;
    case ATTR_NORM: fprintf(out, " eps=%g%s", a->norm_eps, a->norm_params ? " params" : ""); break;
    default: ICE("print_attr: attribute bit %#x", attr);
    }
}

/* softmax and log_softmax along their operand's last axis, which --dump does not print (as
 * before softmax had an axis). */
static int last_axis(const IrNode *n) {
    int rows = n->op == OP_SOFTMAX || n->op == OP_SOFTMAX_BWD || n->op == OP_LOG_SOFTMAX ||
               n->op == OP_LOG_SOFTMAX_BWD;
    return rows && n->n_in > 0 && n->attr.axis == n->in[0]->shape.rank - 1;
}

/* The attributes n's operator reads (ops.def), in the order of the ATTR_* bits. */
void ir_print_attrs(const IrNode *n, FILE *out) {
    for (unsigned bit = 1; bit < ATTR__END; bit <<= 1)
        if ((op_attrs(n->op) & bit) && !(bit == ATTR_AXIS && last_axis(n))) print_attr(bit, n, out);
}

const char *ir_layout_str(IrLayout l, char *buf, size_t size) {
    if (!l.permuted) return "row-major";
    if (ir_layout_eq(l, LAYOUT_NHWC)) return "nhwc";
    int used = snprintf(buf, size, "order="), zeros = 0;
    for (int i = 0; i < IR_MAX_RANK && used < (int)size; i++) {
        if (l.order[i] == 0 && zeros++) break; /* axis 0 once; zeros after it lie beyond the rank */
        used += snprintf(buf + used, size - (size_t)used, "%s%d", i ? "," : "", l.order[i]);
    }
    return buf;
}

static void print_node(const IrNode *n, FILE *out) {
    char shape[160];
    fprintf(out, "  %%%d = %s", n->id, ir_op_name(n->op));
    if (n->name) fprintf(out, " \"%s\"", n->name);
    if (n->n_in) {
        fprintf(out, "(");
        for (int i = 0; i < n->n_in; i++) fprintf(out, "%s%%%d", i ? ", " : "", n->in[i]->id);
        fprintf(out, ")");
    }
    fprintf(out, " %s%s", ir_dtype_name(n->dtype), ir_shape_str(&n->shape, shape, sizeof shape));
    char layout[40];
    if (n->layout.permuted) fprintf(out, " %s", ir_layout_str(n->layout, layout, sizeof layout));
    ir_print_attrs(n, out);
    if (n->group) fprintf(out, " group=%d%s", n->group, n->internal ? " internal" : "");
    if (n->epilogue) fprintf(out, " epilogue=%d", n->epilogue);
    if (n->fused_into) fprintf(out, " in_group=%d", n->fused_into);
    if (n->folded) fprintf(out, " folded");
    if (n->loc.file) {
        const char *base = strrchr(n->loc.file, '/');
        fprintf(out, "   # %s:%d", base ? base + 1 : n->loc.file, n->loc.line);
    }
    fprintf(out, "\n");
}

void ir_print(const IrGraph *g, FILE *out) {
    fprintf(out, "model %s  batch=%lld  params=%d  inputs=%d\n", g->model_name ? g->model_name : "?",
            (long long)g->batch, g->n_params, g->n_inputs);
    for (int i = 0; i < g->n; i++) {
        if (i == 0) fprintf(out, "forward:\n");
        if (i == g->n_fwd && g->n_fwd < g->n) fprintf(out, "backward:\n");
        print_node(g->nodes[i], out);
    }
    if (g->loss) fprintf(out, "loss = %%%d\n", g->loss->id);
    if (g->correct) fprintf(out, "correct = %%%d\n", g->correct->id);
    if (g->output) fprintf(out, "output = %%%d\n", g->output->id);
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        fprintf(out, "param %s = %%%d%s", p->name, p->node->id, p->buffer ? " buffer" : p->trainable ? "" : " frozen");
        if (p->grad) fprintf(out, "  grad %%%d", p->grad->id);
        fprintf(out, "\n");
    }
}

/* ---- the operator table as docs/compiler.md lists it */

static const char *const kind_names[] = {
    [OPK_SOURCE] = "source", [OPK_EW] = "element-wise", [OPK_REDUCE] = "reduction",
    [OPK_LIB] = "library", [OPK_VIEW] = "view",
};

static const char *const lib_names[] = {
    [LIB_NONE] = "", [LIB_MATMUL] = " (matmul)", [LIB_CONV] = " (conv)", [LIB_POOL] = " (pool)",
    [LIB_ROWS] = " (rows)", [LIB_BN] = " (bn)", [LIB_AXES] = " (axes)", [LIB_ATTN] = " (attention)",
    [LIB_INDEX] = " (index)",
};

/* The attributes' names as --dump prints them, in the order of the ATTR_* bits. */
static const char *const attr_names[] = {
    "value", "trans_a trans_b", "kernel", "stride", "pad", "dilation", "groups", "filter",
    "p mask", "batch_masked", "eps momentum running frozen", "row", "smoothing", "perm", "axis", "start",
    "eps params", "causal scale heads head_dim cols", "ignore_index", "part", "top_k",
};
_Static_assert(1 << sizeof attr_names / sizeof *attr_names == ATTR__END, "one name per attribute bit");

void ir_print_ops(FILE *out) {
    fprintf(out, "| operator | operands | kind | attributes | meaning |\n|---|---|---|---|---|\n");
    for (int op = 0; op < OP__COUNT; op++) {
        fprintf(out, "| `%s` | %d | %s%s |", ir_op_name(op), ir_op_arity(op), kind_names[ir_op_kind(op)],
                lib_names[ir_op_lib(op)]);
        const char *sep = " ";
        for (unsigned i = 0; (1u << i) < ATTR__END; i++)
            if (op_attrs(op) & (1u << i)) fprintf(out, "%s%s", sep, attr_names[i]), sep = ", ";
        fprintf(out, " | %s |\n", ir_op_meaning(op));
    }
}
