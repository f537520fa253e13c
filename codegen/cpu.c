/* cpu.c - the CPU backend: one readable C file per model, for OpenBLAS + OpenMP + libnetrt.
 *
 * Requires: a planned graph (mp_plan has run).
 * The output defines the model description (inputs, parameters, recipe), three step functions
 * (forward_backward, eval_step, optimizer_step) and main(), which hands everything to rt_main().
 * Every IR node becomes one commented statement or loop; element-wise nodes become loops whose
 * broadcasting index arithmetic is folded into constants; library nodes call libnetrt kernels
 * with their geometry in a static const struct.
 */
#include <inttypes.h>
#include <string.h>

#include "codegen.h"

enum { PAR_MIN = 32768 }; /* elements below which a loop runs on one thread */

typedef struct Cg {
    const IrGraph *g;
    FILE *out;
    int eval; /* emitting eval_step: dropout is the identity */
} Cg;

static IrNode *root(const IrNode *n) {
    while (n->storage == ST_ALIAS) n = n->in[0];
    return (IrNode *)n;
}

static const char *ctype(IrDtype dt) { return ir_dtype_ctype(dt); }

/* A float literal that reads back exactly ("0.5f", "255.0f"); rotating static buffers, so a
 * few may appear in one printf. */
static const char *fl(double v) {
    static char bufs[8][40];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%.9g", v);
    if (!strpbrk(b, ".eni")) strcat(b, ".0"); /* e: exponent; n/i: nan, inf */
    strcat(b, "f");
    return b;
}

static void lit(FILE *o, double v) { fputs(fl(v), o); }

/* The C expression for a node's storage, typed as a pointer to its element type. */
static void ptr(Cg *c, const IrNode *n) {
    const IrNode *r = root(n);
    FILE *o = c->out;
    switch (r->storage) {
    case ST_ARENA: fprintf(o, "((%s *)(ctx->arena + %" PRId64 "))", ctype(n->dtype), r->offset); break;
    case ST_PARAM: fprintf(o, "(ctx->params + %" PRId64 ")", r->offset); break;
    case ST_GRAD: fprintf(o, "(ctx->grads + %" PRId64 ")", r->offset); break;
    case ST_INPUT: fprintf(o, "((%s *)ctx->inputs[%d])", ctype(n->dtype), r->index); break;
    default: ICE("cpu: node %%%d has no storage", n->id);
    }
}

/* Declare `v<id>` for a node that has storage; a view is its operand under a new name. */
static void decl(Cg *c, const IrNode *n) {
    fprintf(c->out, "    %s *v%d = ", ctype(n->dtype), n->id);
    if (n->storage == ST_ALIAS) fprintf(c->out, "v%d", n->in[0]->id);
    else ptr(c, n);
    fprintf(c->out, ";\n");
}

static void comment(Cg *c, const IrNode *n) {
    char shape[160];
    const char *file = n->loc.file ? strrchr(n->loc.file, '/') : NULL;
    file = file ? file + 1 : n->loc.file;
    fprintf(c->out, "    // %%%d = %s", n->id, ir_op_name(n->op));
    for (int i = 0; i < n->n_in; i++) fprintf(c->out, "%s%%%d", i ? ", " : "(", n->in[i]->id);
    fprintf(c->out, "%s %s%s", n->n_in ? ")" : "", ir_dtype_name(n->dtype),
            ir_shape_str(&n->shape, shape, sizeof shape));
    if (file) fprintf(c->out, "   %s:%d", file, n->loc.line);
    fprintf(c->out, "\n");
}

/* ---- element-wise */

/* Element of operand `x` read at output flat index `i` of a node with shape `out`. */
static void elem(Cg *c, const IrNode *x, const IrShape *out) {
    FILE *o = c->out;
    const char *cast = x->dtype == DT_F32 ? "" : "(float)";
    if (x->storage == ST_INLINE) return lit(o, x->attr.scalar);
    if (x->dtype == DT_F16 || x->dtype == DT_BF16)
        fprintf(o, "rt_%s_to_f32(", x->dtype == DT_F16 ? "f16" : "bf16"), cast = "";
    else fprintf(o, "%s", cast);
    int64_t n = ir_numel(&x->shape);
    if (ir_shape_eq(&x->shape, out) || n == ir_numel(out)) {
        fprintf(o, "v%d[i]", x->id);
    } else if (n == 1) {
        fprintf(o, "v%d[0]", x->id);
    } else {
        /* broadcast: sum over output axes of ((i / out_stride) % out_dim) * in_stride */
        fprintf(o, "v%d[", x->id);
        int64_t out_stride = 1, in_stride = 1, first = 1;
        for (int a = out->rank - 1; a >= 0; a--) {
            int ia = a - (out->rank - x->shape.rank);
            int64_t d = out->dim[a], xd = ia >= 0 ? x->shape.dim[ia] : 1;
            if (xd != 1) {
                fprintf(o, "%s", first ? "" : " + ");
                if (out_stride == 1) fprintf(o, "(i %% %" PRId64 ")", d);
                else if (out_stride * d == ir_numel(out)) fprintf(o, "(i / %" PRId64 ")", out_stride);
                else fprintf(o, "(i / %" PRId64 " %% %" PRId64 ")", out_stride, d);
                if (in_stride != 1) fprintf(o, " * %" PRId64, in_stride);
                first = 0;
                in_stride *= xd;
            }
            out_stride *= d;
        }
        fprintf(o, "]");
    }
    if (x->dtype == DT_F16 || x->dtype == DT_BF16) fprintf(o, ")");
}

/* The float expression of one element-wise node at index i. */
static void ew_expr(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    const IrShape *s = &n->shape;
#define A elem(c, n->in[0], s)
#define B elem(c, n->in[1], s)
    switch (n->op) {
    case OP_ADD: A, fprintf(o, " + "), B; break;
    case OP_SUB: A, fprintf(o, " - "), B; break;
    case OP_MUL: A, fprintf(o, " * "), B; break;
    case OP_DIV: A, fprintf(o, " / "), B; break;
    case OP_NEG: fprintf(o, "-"), A; break;
    case OP_RELU: fprintf(o, "fmaxf("), A, fprintf(o, ", 0.0f)"); break;
    case OP_SIGMOID: fprintf(o, "1.0f / (1.0f + expf(-"), A, fprintf(o, "))"); break;
    case OP_TANH: fprintf(o, "tanhf("), A, fprintf(o, ")"); break;
    case OP_GELU: fprintf(o, "gelu("), A, fprintf(o, ")"); break;
    case OP_EXP: fprintf(o, "expf("), A, fprintf(o, ")"); break;
    case OP_LOG: fprintf(o, "logf("), A, fprintf(o, ")"); break;
    case OP_SQRT: fprintf(o, "sqrtf("), A, fprintf(o, ")"); break;
    case OP_CAST:
    case OP_EXPAND: A; break;
    case OP_DROPOUT:
    case OP_DROPOUT_GRAD:
        if (c->eval) { A; break; }
        fprintf(o, "(rt_dropout_keep(ctx->seed, %d, i, %.17g) ? ", n->attr.seed_id, n->attr.p);
        A, fprintf(o, " * "), lit(o, 1.0 / (1.0 - n->attr.p)), fprintf(o, " : 0.0f)");
        break;
    case OP_BCE_LOGITS: fprintf(o, "bce_logits("), A, fprintf(o, ", "), B, fprintf(o, ")"); break;
    case OP_RELU_GRAD: fprintf(o, "("), A, fprintf(o, " > 0.0f ? "), B, fprintf(o, " : 0.0f)"); break;
    case OP_SIGMOID_GRAD: fprintf(o, "sigmoid_grad("), A, fprintf(o, ", "), B, fprintf(o, ")"); break;
    case OP_TANH_GRAD: fprintf(o, "tanh_grad("), A, fprintf(o, ", "), B, fprintf(o, ")"); break;
    case OP_GELU_GRAD: fprintf(o, "gelu_grad("), A, fprintf(o, ", "), B, fprintf(o, ")"); break;
    case OP_BCE_LOGITS_GRAD:
        fprintf(o, "bce_logits_grad("), A, fprintf(o, ", "), B, fprintf(o, ", ");
        elem(c, n->in[2], s), fprintf(o, ")");
        break;
    default: ICE("cpu: %s is not element-wise", ir_op_name(n->op));
    }
#undef A
#undef B
}

static void loop_head(Cg *c, int64_t n) {
    if (n >= PAR_MIN) fprintf(c->out, "    #pragma omp parallel for simd\n");
    fprintf(c->out, "    for (int64_t i = 0; i < %" PRId64 "; i++)\n", n);
}

static void emit_ew(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    loop_head(c, ir_numel(&n->shape));
    fprintf(o, "        v%d[i] = ", n->id);
    switch (n->dtype) {
    case DT_F32: ew_expr(c, n); break;
    case DT_F16: fprintf(o, "rt_f32_to_f16("), ew_expr(c, n), fprintf(o, ")"); break;
    case DT_BF16: fprintf(o, "rt_f32_to_bf16("), ew_expr(c, n), fprintf(o, ")"); break;
    default: /* casts to integer types, by value */
        if (n->in[0]->dtype == DT_F32 || n->in[0]->dtype == DT_F16 || n->in[0]->dtype == DT_BF16)
            fprintf(o, "(%s)", ctype(n->dtype)), ew_expr(c, n);
        else fprintf(o, "(%s)v%d[i]", ctype(n->dtype), n->in[0]->id);
    }
    fprintf(o, ";\n");
}

/* ---- reductions */

static void emit_sum_to(Cg *c, const IrNode *n) {
    /* out[o] = sum over the input elements that broadcast onto o; the loop runs over the
     * input in order and maps each index to its output index. */
    const IrNode *x = n->in[0];
    FILE *o = c->out;
    int64_t on = ir_numel(&n->shape);
    fprintf(o, "    {\n        double acc[%" PRId64 "];\n", on);
    fprintf(o, "        memset(acc, 0, sizeof acc);\n");
    fprintf(o, "        for (int64_t i = 0; i < %" PRId64 "; i++)\n", ir_numel(&x->shape));
    fprintf(o, "            acc[");
    /* output index of input index i: the broadcast map in reverse */
    int64_t in_stride = 1, out_stride = 1, first = 1;
    const IrShape *xs = &x->shape, *os = &n->shape;
    for (int a = xs->rank - 1; a >= 0; a--) {
        int oa = a - (xs->rank - os->rank);
        int64_t d = xs->dim[a], od = oa >= 0 ? os->dim[oa] : 1;
        if (od != 1) {
            fprintf(o, "%s(i / %" PRId64 " %% %" PRId64 ")", first ? "" : " + ", in_stride, d);
            if (out_stride != 1) fprintf(o, " * %" PRId64, out_stride);
            first = 0;
            out_stride *= od;
        }
        in_stride *= d;
    }
    if (first) fprintf(o, "0");
    fprintf(o, "] += v%d[i];\n", x->id);
    fprintf(o, "        for (int64_t o = 0; o < %" PRId64 "; o++) v%d[o] = (float)acc[o];\n    }\n", on, n->id);
}

static void emit_reduce(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    const IrNode *x = n->in[0];
    int64_t total = ir_numel(&x->shape);
    if (n->op == OP_SUM_TO) return emit_sum_to(c, n);
    if (n->op == OP_MEAN && n->attr.batch_masked) {
        int64_t row = total / x->shape.dim[0];
        fprintf(o, "    {\n        double acc = 0;\n");
        fprintf(o, "        for (int64_t i = 0; i < ctx->n_valid * %" PRId64 "; i++) acc += v%d[i];\n", row, x->id);
        fprintf(o, "        v%d[0] = (float)(acc / (double)(ctx->n_valid * %" PRId64 "));\n    }\n", n->id, row);
        return;
    }
    fprintf(o, "    {\n        double acc = 0;\n");
    fprintf(o, "        for (int64_t i = 0; i < %" PRId64 "; i++) acc += v%d[i];\n", total, x->id);
    fprintf(o, "        v%d[0] = (float)(acc%s);\n    }\n", n->id,
            n->op == OP_MEAN ? arena_printf(c->g->arena, " / %" PRId64 ".0", total) : "");
}

/* ---- library kernels */

static void emit_matmul(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1];
    int r = n->shape.rank, ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[r - 2], N = n->shape.dim[r - 1];
    int64_t K = a->shape.dim[r - 1 - ta];
    int64_t lda = a->shape.dim[r - 1], ldb = b->shape.dim[r - 1];
    int64_t batch = r == 3 ? n->shape.dim[0] : 1;
    FILE *o = c->out;
    if (batch > 1) fprintf(o, "    for (int64_t b = 0; b < %" PRId64 "; b++)\n    ", batch);
    fprintf(o, "    rt_gemm(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, v%d", ta, tb, M, N, K, a->id);
    if (batch > 1) fprintf(o, " + b * %" PRId64, M * K);
    fprintf(o, ", %" PRId64 ", v%d", lda, b->id);
    if (batch > 1) fprintf(o, " + b * %" PRId64, K * N);
    fprintf(o, ", %" PRId64 ", 0.0f, v%d", ldb, n->id);
    if (batch > 1) fprintf(o, " + b * %" PRId64, M * N);
    fprintf(o, ", %" PRId64 ");\n", N);
}

static void emit_conv(Cg *c, const IrNode *n) {
    const IrShape *x = n->op == OP_CONV2D_BWD_DATA ? &n->shape : &n->in[0]->shape;
    const IrShape *w = n->op == OP_CONV2D_BWD_FILTER ? &n->shape : &n->in[1]->shape;
    const IrShape *y = n->op == OP_CONV2D ? &n->shape
                     : n->op == OP_CONV2D_BWD_DATA ? &n->in[0]->shape : &n->in[1]->shape;
    const IrAttrs *a = &n->attr;
    FILE *o = c->out;
    fprintf(o, "    static const RtConv conv%d = {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
               ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %d, %d, %d, %d, %d, %d, %d};\n",
            n->id, x->dim[0], x->dim[1], x->dim[2], x->dim[3], w->dim[0], w->dim[2], w->dim[3],
            y->dim[2], y->dim[3], a->stride[0], a->stride[1], a->pad[0], a->pad[1], a->dil[0],
            a->dil[1], a->groups);
    const char *fn = n->op == OP_CONV2D ? "fwd" : n->op == OP_CONV2D_BWD_DATA ? "bwd_data" : "bwd_filter";
    fprintf(o, "    rt_conv2d_%s(&conv%d, v%d, v%d, v%d, ctx->scratch, ctx->scratch_per_thread);\n", fn,
            n->id, n->in[0]->id, n->in[1]->id, n->id);
}

static void emit_pool(Cg *c, const IrNode *n) {
    int bwd = n->op == OP_MAXPOOL2D_BWD || n->op == OP_AVGPOOL2D_BWD;
    const IrShape *x = bwd ? &n->shape : &n->in[0]->shape;
    const IrShape *y = bwd ? &n->in[n->n_in - 1]->shape : &n->shape;
    const IrAttrs *a = &n->attr;
    FILE *o = c->out;
    fprintf(o, "    static const RtPool pool%d = {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
               ", %" PRId64 ", %" PRId64 ", %d, %d, %d, %d, %d, %d};\n",
            n->id, x->dim[0], x->dim[1], x->dim[2], x->dim[3], y->dim[2], y->dim[3], a->kernel[0],
            a->kernel[1], a->stride[0], a->stride[1], a->pad[0], a->pad[1]);
    switch (n->op) {
    case OP_MAXPOOL2D: fprintf(o, "    rt_maxpool2d_fwd(&pool%d, v%d, v%d);\n", n->id, n->in[0]->id, n->id); break;
    case OP_AVGPOOL2D: fprintf(o, "    rt_avgpool2d_fwd(&pool%d, v%d, v%d);\n", n->id, n->in[0]->id, n->id); break;
    case OP_MAXPOOL2D_BWD:
        fprintf(o, "    rt_maxpool2d_bwd(&pool%d, v%d, v%d, v%d);\n", n->id, n->in[0]->id, n->in[1]->id, n->id);
        break;
    default: fprintf(o, "    rt_avgpool2d_bwd(&pool%d, v%d, v%d);\n", n->id, n->in[0]->id, n->id);
    }
}

static void emit_lib(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    const IrShape *s = &n->in[0]->shape;
    int64_t cols = s->rank ? s->dim[s->rank - 1] : 1, rows = ir_numel(s) / cols;
    switch (n->op) {
    case OP_MATMUL: emit_matmul(c, n); return;
    case OP_CONV2D:
    case OP_CONV2D_BWD_DATA:
    case OP_CONV2D_BWD_FILTER: emit_conv(c, n); return;
    case OP_MAXPOOL2D:
    case OP_MAXPOOL2D_BWD:
    case OP_AVGPOOL2D:
    case OP_AVGPOOL2D_BWD: emit_pool(c, n); return;
    case OP_SOFTMAX:
        fprintf(o, "    rt_softmax_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d);\n", rows, cols, n->in[0]->id, n->id);
        return;
    case OP_SOFTMAX_BWD:
        fprintf(o, "    rt_softmax_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d);\n", rows, cols,
                n->in[0]->id, n->in[1]->id, n->id);
        return;
    case OP_XENT:
        fprintf(o, "    rt_xent_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ctx->n_valid, v%d);\n", rows, cols,
                n->in[0]->id, n->in[1]->id, n->id);
        return;
    case OP_XENT_BWD:
        fprintf(o, "    rt_xent_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d);\n", rows, cols,
                n->in[0]->id, n->in[1]->id, n->in[2]->id, n->id);
        return;
    case OP_ACCURACY:
        fprintf(o, "    v%d[0] = rt_accuracy(%" PRId64 ", %" PRId64 ", v%d, v%d, ctx->n_valid);\n", n->id,
                rows, cols, n->in[0]->id, n->in[1]->id);
        return;
    default: ICE("cpu: no kernel for %s", ir_op_name(n->op));
    }
}

/* True if a node among [0, end) of the schedule, or a step output, reads `n`. */
static int read_before(const IrGraph *g, const IrNode *n, int end) {
    for (int i = n->id + 1; i < end; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] == n) return 1;
    for (int i = 0; i < g->n_params && end == g->n; i++)
        if (g->params[i].grad == n) return 1;
    return n == g->loss || n == g->correct;
}

static void emit_node(Cg *c, const IrNode *n) {
    if (n->storage == ST_INLINE) return;
    comment(c, n);
    if (n->storage == ST_INPUT || n->storage == ST_PARAM || n->storage == ST_ALIAS) {
        decl(c, n);
        if (!read_before(c->g, n, c->eval ? c->g->n_fwd : c->g->n))
            fprintf(c->out, "    (void)v%d; // read only by the %s pass\n", n->id,
                    c->eval ? "backward" : "evaluation");
        return;
    }
    decl(c, n);
    switch (ir_op_kind(n->op)) {
    case OPK_EW: emit_ew(c, n); break;
    case OPK_REDUCE: emit_reduce(c, n); break;
    case OPK_LIB: emit_lib(c, n); break;
    default: ICE("cpu: cannot emit %s", ir_op_name(n->op));
    }
}

/* ---- the step functions */

static void emit_outputs(Cg *c) {
    const IrGraph *g = c->g;
    fprintf(c->out, "    ctx->loss = v%d[0];\n", g->loss->id);
    if (g->correct) fprintf(c->out, "    ctx->correct = v%d[0];\n", g->correct->id);
    else fprintf(c->out, "    ctx->correct = 0;\n");
}

static void emit_forward_backward(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    fprintf(o, "// Forward pass, loss and metrics, then the backward pass into ctx->grads.\n");
    fprintf(o, "static void forward_backward(RtCtx *ctx) {\n");
    for (int i = 0; i < g->n; i++) {
        if (i == g->n_fwd) fprintf(o, "\n    // ---- backward\n");
        emit_node(c, g->nodes[i]);
    }
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (!p->grad || p->grad->storage == ST_GRAD) continue;
        int64_t n = ir_numel(&p->node->shape);
        fprintf(o, "    // gradient of %s\n", p->name);
        if (p->grad->storage == ST_INLINE) {
            fprintf(o, "    for (int64_t i = 0; i < %" PRId64 "; i++) ctx->grads[%" PRId64 " + i] = ", n, p->grad_offset);
            lit(o, p->grad->attr.scalar);
            fprintf(o, ";\n");
        } else {
            fprintf(o, "    memcpy(ctx->grads + %" PRId64 ", v%d, %" PRId64 " * sizeof(float));\n",
                    p->grad_offset, p->grad->id, n);
        }
    }
    emit_outputs(c);
    fprintf(o, "}\n\n");
}

static void emit_eval(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    c->eval = 1;
    fprintf(o, "// Forward pass in evaluation mode (dropout off): loss and metrics only.\n");
    fprintf(o, "static void eval_step(RtCtx *ctx) {\n");
    for (int i = 0; i < g->n_fwd; i++) emit_node(c, g->nodes[i]);
    emit_outputs(c);
    fprintf(o, "}\n\n");
    c->eval = 0;
}

static void emit_optimizer(Cg *c) {
    const IrGraph *g = c->g;
    const IrTrain *t = &g->train;
    FILE *o = c->out;
    int64_t n = g->n_grad_floats;
    fprintf(o, "// One fused update of every trainable parameter: params[i] from grads[i].\n");
    fprintf(o, "static void optimizer_step(RtCtx *ctx) {\n");
    fprintf(o, "    float *p = ctx->params, *g = ctx->grads;\n    const float lr = ctx->lr;\n");
    if (t->optim == OPTIM_SGD) {
        fprintf(o, "    // torch.optim.SGD: lr=schedule, momentum=%g, dampening=%g, weight_decay=%g, nesterov=%d\n",
                t->momentum, t->dampening, t->weight_decay, t->nesterov);
        if (t->momentum != 0) fprintf(o, "    float *buf = ctx->optstate;\n    const int first = ctx->step == 1;\n");
        if (t->momentum == 0) fprintf(o, "    (void)ctx;\n");
        loop_head(c, n);
        fprintf(o, "    {\n        float d = g[i]");
        if (t->weight_decay != 0) fprintf(o, " + %s * p[i]", fl(t->weight_decay));
        fprintf(o, ";\n");
        if (t->momentum != 0) {
            fprintf(o, "        buf[i] = first ? d : %s * buf[i] + %s * d;\n", fl(t->momentum), fl(1 - t->dampening));
            if (t->nesterov) fprintf(o, "        d = d + %s * buf[i];\n", fl(t->momentum));
            else fprintf(o, "        d = buf[i];\n");
        }
        fprintf(o, "        p[i] -= lr * d;\n    }\n");
    } else {
        fprintf(o, "    // torch.optim.AdamW: betas=(%g, %g), eps=%g, weight_decay=%g\n", t->beta1, t->beta2,
                t->eps, t->weight_decay);
        fprintf(o, "    float *m = ctx->optstate, *v = ctx->optstate + %" PRId64 ";\n", n);
        fprintf(o, "    const double bc1 = 1.0 - pow(%.17g, (double)ctx->step);\n", t->beta1);
        fprintf(o, "    const double bc2 = 1.0 - pow(%.17g, (double)ctx->step);\n", t->beta2);
        fprintf(o, "    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);\n");
        fprintf(o, "    const float decay = 1.0f - lr * %s;\n", fl(t->weight_decay));
        loop_head(c, n);
        fprintf(o, "    {\n        p[i] *= decay;\n");
        fprintf(o, "        m[i] = %s * m[i] + %s * g[i];\n", fl(t->beta1), fl(1 - t->beta1));
        fprintf(o, "        v[i] = %s * v[i] + %s * g[i] * g[i];\n", fl(t->beta2), fl(1 - t->beta2));
        fprintf(o, "        p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + %s);\n    }\n", fl(t->eps));
    }
    fprintf(o, "}\n\n");
}

/* ---- the model description */

static const char *const init_names[] = {
    [INIT_ZEROS] = "RT_INIT_ZEROS", [INIT_ONES] = "RT_INIT_ONES",
    [INIT_UNIFORM] = "RT_INIT_UNIFORM", [INIT_NORMAL] = "RT_INIT_NORMAL",
};
static const char *const dtype_enums[] = {
    [DT_F32] = "RT_F32", [DT_F16] = "RT_F16", [DT_BF16] = "RT_BF16",
    [DT_I32] = "RT_I32", [DT_I64] = "RT_I64", [DT_U8] = "RT_U8",
};
static const char *const sched_enums[] = {
    [SCHED_CONSTANT] = "RT_SCHED_CONSTANT", [SCHED_STEP] = "RT_SCHED_STEP", [SCHED_COSINE] = "RT_SCHED_COSINE",
};
static const char *const loss_names[] = {
    [LOSS_CROSS_ENTROPY] = "cross_entropy", [LOSS_MSE] = "mse", [LOSS_BCE_LOGITS] = "bce_logits",
};

static void dims(FILE *o, const IrShape *s, int from) {
    fprintf(o, "{");
    for (int i = from; i < s->rank; i++) fprintf(o, "%s%" PRId64, i > from ? ", " : "", s->dim[i]);
    fprintf(o, "}");
}

static void emit_description(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    fprintf(o, "static const RtInput inputs[] = {\n");
    for (int i = 0; i < g->n_inputs; i++) {
        const IrNode *n = g->inputs[i].node;
        fprintf(o, "    {\"%s\", %s, %d, ", n->name, dtype_enums[n->dtype], n->shape.rank - 1);
        dims(o, &n->shape, 1);
        fprintf(o, "},\n");
    }
    fprintf(o, "};\n\nstatic const RtParam params[] = {\n");
    fprintf(o, "    // name, rank, shape, offset, grad_offset, init, init_a\n");
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        fprintf(o, "    {\"%s\", %d, ", p->name, p->node->shape.rank);
        dims(o, &p->node->shape, 0);
        fprintf(o, ", %" PRId64 ", %" PRId64 ", %s, %s},\n", p->offset, p->grad_offset,
                init_names[p->init], fl(p->init_a));
    }
    fprintf(o, "};\n\n");
}

static void emit_model(Cg *c) {
    const IrGraph *g = c->g;
    const IrTrain *t = &g->train;
    FILE *o = c->out;
    int slots = t->optim == OPTIM_ADAMW ? 2 : t->momentum != 0 ? 1 : 0;
    fprintf(o, "static const RtModel model = {\n");
    fprintf(o, "    .name = \"%s\",\n    .source = \"%s\",\n", g->model_name, g->source_path);
    fprintf(o, "    .batch = %" PRId64 ",\n", g->batch);
    fprintf(o, "    .n_inputs = %d,\n    .inputs = inputs,\n", g->n_inputs);
    fprintf(o, "    .n_params = %d,\n    .params = %s,\n", g->n_params, g->n_params ? "params" : "NULL");
    fprintf(o, "    .n_param_floats = %" PRId64 ",\n    .n_grad_floats = %" PRId64 ",\n", g->n_param_floats,
            g->n_grad_floats);
    fprintf(o, "    .n_state_slots = %d,\n", slots);
    fprintf(o, "    .arena_bytes = %" PRId64 ",\n", g->arena_bytes > 64 ? g->arena_bytes : 64);
    fprintf(o, "    .scratch_per_thread = %" PRId64 ",\n", g->scratch_per_thread);
    fprintf(o, "    .optim = %s,\n", t->optim == OPTIM_SGD ? "RT_OPTIM_SGD" : "RT_OPTIM_ADAMW");
    fprintf(o, "    .schedule = {%s, %.17g, %.17g, %.17g, %.17g, %.17g},\n", sched_enums[t->sched], t->lr,
            t->warmup_epochs, t->step_epochs, t->gamma, t->min_lr);
    fprintf(o, "    .epochs = %" PRId64 ",\n    .eval_every = %" PRId64 ",\n    .log_every = %" PRId64 ",\n",
            t->epochs, t->eval_every, t->log_every);
    fprintf(o, "    .has_accuracy = %d,\n    .loss_name = \"%s\",\n", g->correct != NULL, loss_names[t->loss_kind]);
    fprintf(o, "    .forward_backward = forward_backward,\n    .optimizer_step = optimizer_step,\n");
    fprintf(o, "    .eval_step = eval_step,\n};\n\n");
}

static void emit_prologue(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    fprintf(o,
            "// %s.c - a trainer for model '%s', generated by netc from %s. Do not edit.\n"
            "//\n"
            "// The training step is forward_backward() followed by optimizer_step(); eval_step()\n"
            "// is the forward pass with dropout off. Every tensor lives at a fixed place chosen\n"
            "// at compile time: parameters and gradients in flat buffers (ctx->params,\n"
            "// ctx->grads; trainable parameters first), the batch in ctx->inputs, everything\n"
            "// else at an offset in ctx->arena (%" PRId64 " bytes, %" PRId64 " without reuse).\n"
            "// libnetrt's rt_main() owns the command line, data, logging and weight files.\n"
            "//\n"
            "// Build: cc -O2 -fopenmp %s.c -I<netc>/runtime libnetrt.a -lopenblas -lcjson -lz -lpthread -lm\n\n",
            g->model_name, g->model_name, g->source_path, g->arena_bytes, g->unplanned_bytes,
            g->model_name);
    fprintf(o, "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n#include \"netrt.h\"\n\n");
    fprintf(o, "// ---- element-wise helpers\n");
    fprintf(o, "static inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)); }\n");
    fprintf(o, "static inline float gelu_grad(float x, float dy) {\n"
               "    float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));\n"
               "    float pdf = expf(-0.5f * x * x) * 0.3989422804014327f;\n"
               "    return dy * (cdf + x * pdf);\n}\n");
    fprintf(o, "static inline float sigmoid_grad(float y, float dy) { return dy * y * (1.0f - y); }\n");
    fprintf(o, "static inline float tanh_grad(float y, float dy) { return dy * (1.0f - y * y); }\n");
    fprintf(o, "static inline float bce_logits(float x, float t) {\n"
               "    return fmaxf(x, 0.0f) - x * t + log1pf(expf(-fabsf(x)));\n}\n");
    fprintf(o, "static inline float bce_logits_grad(float x, float t, float dy) {\n"
               "    return dy * (1.0f / (1.0f + expf(-x)) - t);\n}\n");
    fprintf(o, "// keep -Wunused-function quiet for helpers this model does not use\n");
    fprintf(o, "static void (*const netc_helpers[])(void) __attribute__((unused)) = {\n"
               "    (void (*)(void))gelu, (void (*)(void))gelu_grad, (void (*)(void))sigmoid_grad,\n"
               "    (void (*)(void))tanh_grad, (void (*)(void))bce_logits, (void (*)(void))bce_logits_grad};\n\n");
}

static int emit(const IrGraph *g, FILE *out) {
    Cg c = {.g = g, .out = out};
    emit_prologue(&c);
    fprintf(out, "// ---- forward and backward\n");
    emit_forward_backward(&c);
    fprintf(out, "// ---- evaluation\n");
    emit_eval(&c);
    fprintf(out, "// ---- optimizer\n");
    emit_optimizer(&c);
    fprintf(out, "// ---- model description\n");
    emit_description(&c);
    emit_model(&c);
    fprintf(out, "// ---- entry point\n");
    fprintf(out, "int main(int argc, char **argv) { return rt_main(argc, argv, &model); }\n");
    return ferror(out) ? 1 : 0;
}

const CgBackend cg_cpu = {
    .name = "cpu",
    .description = "portable C with OpenBLAS and OpenMP, linked with libnetrt",
    .emit = emit,
};
