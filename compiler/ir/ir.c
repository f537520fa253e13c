/* ir.c - the operator table, shapes, graph building, the verifier and the printer.
 *
 * The verifier checks what every later stage relies on: operands precede their users, the
 * arity matches ops.def, and each operator's output shape and dtype agree with its operands.
 * The printer's text is the golden-test format, so it changes only on purpose.
 */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

static const struct {
    const char *name;
    int arity;
    IrOpKind kind;
    const char *meaning;
} op_table[] = {
#define OP(e, name, arity, kind, meaning) [OP_##e] = {name, arity, kind, meaning},
#include "ops.def"
#undef OP
};

const char *ir_op_name(IrOp op) { return op_table[op].name; }
int ir_op_arity(IrOp op) { return op_table[op].arity; }
IrOpKind ir_op_kind(IrOp op) { return op_table[op].kind; }
const char *ir_op_meaning(IrOp op) { return op_table[op].meaning; }

static const struct {
    const char *name, *ctype;
    int size;
} dtype_table[DT__COUNT] = {
    [DT_F32] = {"f32", "float", 4},     [DT_F16] = {"f16", "uint16_t", 2},
    [DT_BF16] = {"bf16", "uint16_t", 2}, [DT_I32] = {"i32", "int32_t", 4},
    [DT_I64] = {"i64", "int64_t", 8},   [DT_U8] = {"u8", "uint8_t", 1},
};

const char *ir_dtype_name(IrDtype dt) { return dtype_table[dt].name; }
const char *ir_dtype_ctype(IrDtype dt) { return dtype_table[dt].ctype; }
int ir_dtype_size(IrDtype dt) { return dtype_table[dt].size; }

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

static void append(IrGraph *g, IrNode *n) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        IrNode **nodes = arena_alloc(g->arena, (size_t)cap * sizeof *nodes);
        if (g->n) memcpy(nodes, g->nodes, (size_t)g->n * sizeof *nodes);
        g->nodes = nodes;
        g->cap = cap;
    }
    n->id = g->n;
    g->nodes[g->n++] = n;
}

IrNode *ir_unary_at(IrGraph *g, IrOp op, IrNode *x, IrDtype dt, IrLayout layout, const IrNode *at) {
    IrNode *c = arena_alloc(g->arena, sizeof *c);
    c->op = op;
    c->n_in = 1;
    c->in[0] = x;
    c->shape = x->shape;
    c->dtype = dt;
    c->layout = layout;
    c->phase = at->phase;
    c->loc = at->loc;
    c->attr.groups = 1;
    return c;
}

IrNode *ir_add(IrGraph *g, IrOp op, IrShape shape, IrDtype dt, SrcLoc loc, int n_in, ...) {
    if (n_in > IR_MAX_OPERANDS) ICE("%s with %d operands", ir_op_name(op), n_in);
    IrNode *n = arena_alloc(g->arena, sizeof *n);
    n->op = op;
    n->shape = shape;
    n->dtype = dt;
    n->loc = loc;
    n->n_in = n_in;
    n->attr.groups = 1;
    va_list ap;
    va_start(ap, n_in);
    for (int i = 0; i < n_in; i++) n->in[i] = va_arg(ap, IrNode *);
    va_end(ap);
    append(g, n);
    return n;
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
    g->params = grow16(g->arena, g->params, g->n_params, sizeof *g->params);
    IrNode *n = ir_add(g, OP_PARAM, shape, DT_F32, loc, 0);
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

int ir_stored_as(const IrNode *x, IrLayout layout) {
    return x->layout == layout || !ir_layout_matters(&x->shape);
}

int ir_conv_nhwc_ok(const IrNode *n) {
    const IrShape *w = n->op == OP_CONV2D_BWD_FILTER ? &n->shape : &n->in[1]->shape;
    int strided = n->attr.stride[0] > 1 || n->attr.stride[1] > 1;
    return !(w->dim[2] == 1 && w->dim[3] == 1 && strided && w->dim[1] % 8 != 0);
}

int ir_operand_layout(const IrNode *n, int k) {
    switch (ir_op_kind(n->op)) {
    case OPK_EW:
    case OPK_REDUCE: return -1;
    case OPK_SOURCE: return LAYOUT_ROW_MAJOR;
    case OPK_VIEW: return LAYOUT_ROW_MAJOR; /* views reinterpret row-major storage */
    case OPK_LIB: break;
    }
    switch (n->op) {
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA: return k == 0 ? (int)n->layout : (int)n->attr.filter; /* oihw, or ohwi (KRSC) */
    case OP_CONV2D_BWD_FILTER: /* x and dy alike: channels-last if either is and it may */
        return ir_conv_nhwc_ok(n) && (n->in[0]->layout == LAYOUT_NHWC || n->in[1]->layout == LAYOUT_NHWC)
                   ? LAYOUT_NHWC : LAYOUT_ROW_MAJOR;
    case OP_MAXPOOL2D:
    case OP_MAXPOOL2D_BWD:
    case OP_AVGPOOL2D:
    case OP_AVGPOOL2D_BWD: return n->layout;
    case OP_BN_STATS: return -1;
    case OP_BN_BWD_SUMS: return k == 0 ? -1 : k == 1 ? LAYOUT_ROW_MAJOR : (int)n->in[0]->layout;
    default: return LAYOUT_ROW_MAJOR;
    }
}

/* ---- verifier */

static int is_float(IrDtype dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16; }

static int verify_fail(const char *stage, const IrNode *n, const char *what) {
    char buf[160];
    fprintf(stderr, "netc: IR verification failed after %s: %%%d = %s %s: %s\n", stage, n->id,
            ir_op_name(n->op), ir_shape_str(&n->shape, buf, sizeof buf), what);
    return 0;
}

/* Batch-norm operands: x [N, C, ...] (the output's shape), stats/sums [2, C], weight/bias [C]. */
static int bn_operands_ok(const IrNode *n) {
    const IrShape *x = &n->in[0]->shape;
    if (x->rank < 2 || !ir_shape_eq(x, &n->shape)) return 0;
    int64_t C = x->dim[1];
    for (int i = 1; i < n->n_in; i++) {
        const IrShape *s = &n->in[i]->shape;
        int per_channel = s->rank == 1 && s->dim[0] == C;
        int two_rows = s->rank == 2 && s->dim[0] == 2 && s->dim[1] == C;
        int is_dy = n->op == OP_BN_BWD_DATA && i == 4;
        if (is_dy ? !ir_shape_eq(s, x) : !(per_channel || two_rows)) return 0;
    }
    return 1;
}

/* The output shape each operator must have, given its operands; 0 if any shape is wrong. */
static int expected_shape(const IrNode *n, IrShape *want) {
    const IrNode *a = n->in[0], *b = n->n_in > 1 ? n->in[1] : NULL;
    switch (ir_op_kind(n->op)) {
    case OPK_SOURCE: *want = n->shape; return 1;
    case OPK_VIEW:
        *want = n->shape;
        if (n->op == OP_ROW)
            return a->shape.rank >= 1 && n->attr.row >= 0 && n->attr.row < a->shape.dim[0] &&
                   ir_numel(&a->shape) == a->shape.dim[0] * ir_numel(&n->shape);
        return ir_numel(&a->shape) == ir_numel(&n->shape);
    case OPK_EW:
        if (n->op == OP_BN_APPLY || n->op == OP_BN_BWD_DATA) return *want = n->shape, bn_operands_ok(n);
        if (n->op == OP_EXPAND) {
            IrShape s;
            *want = n->shape;
            return ir_broadcast(&a->shape, &n->shape, &s) && ir_shape_eq(&s, &n->shape);
        }
        *want = a->shape;
        for (int i = 1; i < n->n_in; i++)
            if (!ir_broadcast(want, &n->in[i]->shape, want)) return 0;
        return 1;
    case OPK_REDUCE:
        if (n->op == OP_SUM_TO) {
            IrShape s;
            *want = n->shape;
            return ir_broadcast(&a->shape, &n->shape, &s) && ir_shape_eq(&s, &a->shape);
        }
        *want = ir_scalar_shape();
        return 1;
    case OPK_LIB: break;
    }
    *want = n->shape;
    switch (n->op) {
    case OP_MATMUL: {
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
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER:
    case OP_MAXPOOL2D:
    case OP_MAXPOOL2D_BWD:
    case OP_AVGPOOL2D:
    case OP_AVGPOOL2D_BWD: return a->shape.rank == 4 && n->shape.rank == 4;
    case OP_SOFTMAX: *want = a->shape; return a->shape.rank >= 1;
    case OP_SOFTMAX_BWD: *want = a->shape; return ir_shape_eq(&a->shape, &b->shape);
    case OP_XENT:
        *want = ir_shape(1, a->shape.dim[0]);
        return a->shape.rank == 2 && b->shape.rank == 1 && b->shape.dim[0] == a->shape.dim[0] &&
               b->dtype == DT_I64;
    case OP_XENT_BWD: *want = a->shape; return a->shape.rank == 2;
    case OP_ACCURACY: *want = ir_scalar_shape(); return a->shape.rank == 2 && b->dtype == DT_I64;
    case OP_BN_STATS:
    case OP_BN_BWD_SUMS:
        if (a->shape.rank < 2) return 0;
        *want = ir_shape(2, (int64_t)2, a->shape.dim[1]);
        return n->op == OP_BN_STATS || ir_shape_eq(&n->in[2]->shape, &a->shape);
    default: return 1;
    }
}

static int verify_node(const IrGraph *g, const IrNode *n, int pos, const char *stage) {
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
    if (!expected_shape(n, &want) || !ir_shape_eq(&want, &n->shape))
        return verify_fail(stage, n, "shape does not follow from the operands");
    if (n->layout == LAYOUT_NHWC && n->shape.rank != 4) return verify_fail(stage, n, "channels-last below rank 4");
    int nhwc_op = ir_op_kind(n->op) == OPK_EW || (n->op >= OP_CONV2D && n->op <= OP_CONV2D_BWD_FILTER) ||
                  (n->op >= OP_MAXPOOL2D && n->op <= OP_AVGPOOL2D_BWD);
    if (n->layout == LAYOUT_NHWC && !nhwc_op) return verify_fail(stage, n, "this operator has no channels-last form");
    /* a filter channels-last (KRSC) only beside channels-last activations: the libraries take
     * the two in one format */
    int krsc = n->op == OP_CONV2D_BWD_FILTER ? n->layout == LAYOUT_NHWC
             : (n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA) && n->attr.filter == LAYOUT_NHWC;
    if (krsc && ir_operand_layout(n, 0) != LAYOUT_NHWC)
        return verify_fail(stage, n, "a channels-last filter beside row-major activations");
    for (int i = 0; i < n->n_in; i++) {
        int want = ir_operand_layout(n, i);
        if (want >= 0 && !ir_stored_as(n->in[i], (IrLayout)want))
            return verify_fail(stage, n, "an operand is stored in a layout the operator does not read");
    }
    int ew_float = ir_op_kind(n->op) == OPK_EW && n->op != OP_CAST;
    if ((ew_float || ir_op_kind(n->op) == OPK_REDUCE) && !is_float(n->dtype))
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

static void print_attrs(const IrNode *n, FILE *out) {
    const IrAttrs *a = &n->attr;
    switch (n->op) {
    case OP_CONST: fprintf(out, " value=%.9g", a->scalar); break;
    case OP_MATMUL:
        if (a->trans_a) fprintf(out, " trans_a");
        if (a->trans_b) fprintf(out, " trans_b");
        break;
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER:
        fprintf(out, " stride=%d,%d pad=%d,%d dilation=%d,%d groups=%d", a->stride[0],
                a->stride[1], a->pad[0], a->pad[1], a->dil[0], a->dil[1], a->groups);
        if (n->op != OP_CONV2D_BWD_FILTER && a->filter == LAYOUT_NHWC) fprintf(out, " filter=krsc");
        break;
    case OP_MAXPOOL2D:
    case OP_MAXPOOL2D_BWD:
    case OP_AVGPOOL2D:
    case OP_AVGPOOL2D_BWD:
        fprintf(out, " kernel=%d,%d stride=%d,%d pad=%d,%d", a->kernel[0], a->kernel[1],
                a->stride[0], a->stride[1], a->pad[0], a->pad[1]);
        break;
    case OP_DROPOUT:
    case OP_DROPOUT_GRAD: fprintf(out, " p=%g mask=%d", a->p, a->seed_id); break;
    case OP_MEAN:
        if (a->batch_masked) fprintf(out, " batch_masked");
        break;
    case OP_BN_STATS: fprintf(out, " eps=%g momentum=%g running=%d", a->eps, a->momentum, a->stat_param); break;
    case OP_ROW: fprintf(out, " row=%d", a->row); break;
    case OP_XENT:
    case OP_XENT_BWD:
        if (a->smoothing != 0) fprintf(out, " smoothing=%g", a->smoothing);
        break;
    default: break;
    }
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
    if (n->layout == LAYOUT_NHWC) fprintf(out, " nhwc");
    print_attrs(n, out);
    if (n->group) fprintf(out, " group=%d%s", n->group, n->internal ? " internal" : "");
    if (n->epilogue) fprintf(out, " epilogue=%d", n->epilogue);
    if (n->fused_into) fprintf(out, " in_group=%d", n->fused_into);
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
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        fprintf(out, "param %s = %%%d%s", p->name, p->node->id, p->buffer ? " buffer" : p->trainable ? "" : " frozen");
        if (p->grad) fprintf(out, "  grad %%%d", p->grad->id);
        fprintf(out, "\n");
    }
}
