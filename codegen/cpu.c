/* cpu.c - the CPU backend: one readable C file per model, for oneDNN/OpenBLAS + OpenMP + libnetrt.
 *
 * Requires: a planned graph (mp_plan has run); every operand in a layout its operator reads
 * (layout_select): channels-last convolutions go to oneDNN, the others to im2col + OpenBLAS.
 * The output defines three step functions (forward_backward, eval_step, optimizer_step), the
 * model description (inputs, parameters, recipe, buffer sizes) and main(), which hands it all to
 * rt_main(). Every IR node becomes one commented statement or loop:
 *   - element-wise nodes are one loop over the output's physical elements; each operand's
 *     index is the broadcast map folded into constants, `(i / S % D) * T` per axis, with
 *     trivial terms dropped and contiguous axes merged (so same-shape operands read `x[i]`);
 *   - reductions loop over the output and, inside, over the reduced index space, in double;
 *   - library nodes call a libnetrt kernel, with their geometry in a `static const` struct.
 * Each node's pointer is a local `v<id>`, declared where the node is defined and only when the
 * step reads or writes it, so the file compiles warning-free with -Wall -Wextra -Werror.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cexpr.h"
#include "codegen.h"
#include "netrt.h" /* the kernels' constants the generated code must match */
#include "passes.h"

enum { PAR_MIN = 32768 }; /* elements below which a loop runs on one thread */


static void loop_head(Cg *c, int64_t n, const char *indent) {
    if (n >= PAR_MIN) fprintf(c->out, "%s#pragma omp parallel for simd\n", indent);
    fprintf(c->out, "%sfor (int64_t i = 0; i < %" PRId64 "; i++)", indent, n);
}

/* The extent of n's innermost physical axis longer than 1 when an element-wise loop over n
 * should be two-level (rows of it), else 0: a long enough axis whose operands would otherwise
 * index it with `%` (a bias, a per-channel batch-norm value). */
static int64_t inner_extent(const IrNode *n) {
    int perm[IR_MAX_RANK];
    cg_phys_order(n, perm);
    for (int k = n->shape.rank - 1; k >= 0; k--) {
        int64_t d = n->shape.dim[perm[k]];
        if (d > 1) return d >= 16 && d < ir_numel(&n->shape) ? d : 0;
    }
    return 0;
}

/* Open an element-wise loop over n's elements, flat or two-level (sets c->inner); the body
 * sees `i`. loop_close ends it. */
static void loop_open(Cg *c, const IrNode *n) {
    int64_t total = ir_numel(&n->shape);
    c->inner = inner_extent(n);
    if (!c->inner) {
        loop_head(c, total, "    ");
        fprintf(c->out, " {\n");
        return;
    }
    FILE *o = c->out;
    if (total >= PAR_MIN) fprintf(o, "    #pragma omp parallel for\n");
    fprintf(o, "    for (int64_t r = 0; r < %" PRId64 "; r++) {\n", total / c->inner);
    fprintf(o, "        #pragma omp simd\n");
    fprintf(o, "        for (int64_t c = 0; c < %" PRId64 "; c++) {\n", c->inner);
    fprintf(o, "        const int64_t i = r * %" PRId64 " + c;\n", c->inner);
}

static void loop_close(Cg *c) {
    fprintf(c->out, c->inner ? "    }}\n" : "    }\n");
    c->inner = 0;
}

static void emit_ew(Cg *c, const IrNode *n) {
    int scalar = ir_numel(&n->shape) == 1 && n->op != OP_DROPOUT && n->op != OP_DROPOUT_GRAD;
    if (!scalar) loop_open(c, n);
    c->depth = scalar ? 1 : 2;
    cg_ew_store(c, n, scalar);
    c->depth = 0;
    if (!scalar) loop_close(c);
}


/* A channels-last group with batch-norm sums accumulated in its loop (fuse_reductions): rows of
 * C channels in blocks of RT_BN_BLOCK_ROWS, each block's partial sums in double, then the
 * blocks in order: the same arithmetic in the same order as rt_bn_bwd_sums_nhwc. */
static void emit_group_with_sums(Cg *c, const IrNode *head) {
    FILE *o = c->out;
    const IrNode *s;
    int64_t C = head->shape.dim[1], M = ir_numel(&head->shape) / C;
    int64_t nb = (M + RT_BN_BLOCK_ROWS - 1) / RT_BN_BLOCK_ROWS;
    fprintf(o, "    // fused group %d: one pass over %" PRId64 " rows of %" PRId64 " channels, accumulating the sums",
            head->group, M, C);
    FOR_SUMS(s, head) fprintf(o, " %%%d", s->id);
    fprintf(o, "\n");
    cg_group_header(c, head);
    FOR_SUMS(s, head) {
        cg_comment(c, s);
        cg_declare(c, s);
        fprintf(o, "    static double part%d[%" PRId64 "]; // per block of rows: sum(dy), sum(dy * xhat)\n", s->id,
                nb * 2 * C);
    }
    fprintf(o, "    #pragma omp parallel for schedule(static)%s\n", M * C >= PAR_MIN ? "" : " if (0)");
    fprintf(o, "    for (int64_t b = 0; b < %" PRId64 "; b++) {\n", nb);
    FOR_SUMS(s, head)
        fprintf(o, "        double *p%d = part%d + b * %" PRId64 ";\n        for (int64_t c = 0; c < %" PRId64
                   "; c++) p%d[c] = 0;\n",
                s->id, s->id, 2 * C, 2 * C, s->id);
    fprintf(o, "        const int64_t end = (b + 1) * %d < %" PRId64 " ? (b + 1) * %d : %" PRId64 ";\n", RT_BN_BLOCK_ROWS,
            M, RT_BN_BLOCK_ROWS, M);
    fprintf(o, "        for (int64_t r = b * %d; r < end; r++)\n", RT_BN_BLOCK_ROWS);
    fprintf(o, "            for (int64_t c = 0; c < %" PRId64 "; c++) {\n", C);
    fprintf(o, "                const int64_t i = r * %" PRId64 " + c;\n", C);
    c->inner = C;
    c->depth = 4;
    cg_group_body(c, head);
    c->depth = 0;
    c->inner = 0;
    FOR_SUMS(s, head) {
        int x = s->in[0]->id, st = s->in[1]->id, dy = s->in[2]->id;
        fprintf(o, "                p%d[c] += t%d;\n", s->id, dy);
        fprintf(o, "                p%d[%" PRId64 " + c] += (double)t%d * ((v%d[i] - v%d[c]) * v%d[%" PRId64 " + c]);\n",
                s->id, C, dy, x, st, st, C);
    }
    fprintf(o, "            }\n    }\n");
    FOR_SUMS(s, head) {
        fprintf(o, "    for (int64_t c = 0; c < %" PRId64 "; c++) {\n        double s = 0;\n", 2 * C);
        fprintf(o, "        for (int64_t b = 0; b < %" PRId64 "; b++) s += part%d[b * %" PRId64 " + c];\n", nb, s->id,
                2 * C);
        fprintf(o, "        v%d[c] = (float)s;\n    }\n", s->id);
    }
}

/* A fused group: one loop over its elements. */
static void emit_group(Cg *c, const IrNode *head) {
    const IrNode *s;
    FOR_SUMS(s, head) {
        emit_group_with_sums(c, head);
        return;
    }
    fprintf(c->out, "    // fused group %d: one loop over %" PRId64 " elements\n", head->group, ir_numel(&head->shape));
    cg_group_header(c, head);
    loop_open(c, head);
    c->depth = 2;
    cg_group_body(c, head);
    c->depth = 0;
    loop_close(c);
}

/* ---- reductions */

/* x summed down to the node's shape: for each output element, a loop over the reduced index
 * space of the axes that broadcasting stretched. */
static void emit_sum_to(Cg *c, const IrNode *n) {
    const IrNode *x = n->in[0];
    FILE *o = c->out;
    int64_t out_n = ir_numel(&n->shape), red_n = ir_numel(&x->shape) / out_n;
    fprintf(o, "    ");
    if (out_n > 1 && ir_numel(&x->shape) >= PAR_MIN) fprintf(o, "#pragma omp parallel for\n    ");
    fprintf(o, "for (int64_t o = 0; o < %" PRId64 "; o++) {\n        ", out_n);
    cg_sum_to_base(o, n);
    fprintf(o, "\n        double acc = 0;\n");
    fprintf(o, "        for (int64_t j = 0; j < %" PRId64 "; j++)\n            acc += ", red_n);
    cg_sum_to_elem(o, n);
    fprintf(o, ";\n        v%d[o] = (float)acc;\n    }\n", n->id);
}

/* SUM and MEAN of all elements; a batch-masked MEAN counts only the first n_valid rows. */
static void emit_reduce(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    const IrNode *x = n->in[0];
    int64_t total = ir_numel(&x->shape);
    if (n->op == OP_SUM_TO) {
        emit_sum_to(c, n);
        return;
    }
    if (n->dtype != DT_F32) ICE("cpu: %s to %s", ir_op_name(n->op), ir_dtype_name(n->dtype));
    int masked = n->op == OP_MEAN && n->attr.batch_masked && x->shape.rank > 0;
    fprintf(o, "    {\n");
    if (masked)
        fprintf(o, "        const int64_t count = ctx->n_valid * %" PRId64 "; // valid rows only\n",
                total / x->shape.dim[0]);
    else fprintf(o, "        const int64_t count = %" PRId64 ";\n", total);
    fprintf(o, "        double acc = 0;\n");
    if (total >= PAR_MIN) fprintf(o, "        #pragma omp parallel for reduction(+ : acc)\n");
    fprintf(o, "        for (int64_t i = 0; i < count; i++)\n            acc += ");
    cg_load_open(o, x);
    fprintf(o, "v%d[i]", x->id);
    cg_load_close(o, x);
    fprintf(o, ";\n        v%d[0] = (float)(acc%s);\n    }\n", n->id,
            n->op == OP_MEAN ? " / (double)count" : "");
}

/* ---- library kernels */

/* A rank-2 product with its epilogue group: each thread multiplies its own block of rows
 * (OpenBLAS runs single-threaded inside a parallel region) and applies the group to that
 * block while it is still in cache. */
static void emit_matmul_epilogue(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1], *head = NULL;
    int ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[0], N = n->shape.dim[1], K = a->shape.dim[1 - ta];
    int64_t lda = a->shape.dim[1], ldb = b->shape.dim[1];
    FILE *o = c->out;
    for (int i = n->id + 1; i < c->g->n && !head; i++)
        if (c->g->nodes[i]->group == n->epilogue) head = c->g->nodes[i];
    fprintf(o, "    // with its epilogue, fused group %d (%s), on each thread's block of rows\n", n->epilogue,
            epilogue_kind(c->g, n));
    cg_group_header(c, head);
    fprintf(o, "    #pragma omp parallel\n    {\n");
    fprintf(o, "        const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();\n");
    fprintf(o, "        const int64_t r0 = %" PRId64 " * th / nt, r1 = %" PRId64 " * (th + 1) / nt;\n", M, M);
    fprintf(o, "        if (r1 > r0) {\n");
    /* rows r0.. of op(A): rows of A, or columns of A when it is transposed */
    fprintf(o, "            rt_gemm(%d, %d, r1 - r0, %" PRId64 ", %" PRId64 ", 1.0f, v%d + r0 * %" PRId64 ", %" PRId64
               ", v%d, %" PRId64 ", 0.0f, v%d + r0 * %" PRId64 ", %" PRId64 ");\n",
            ta, tb, N, K, a->id, ta ? (int64_t)1 : lda, lda, b->id, ldb, n->id, N, N);
    fprintf(o, "            for (int64_t r = r0; r < r1; r++)\n");
    fprintf(o, "                #pragma omp simd\n");
    fprintf(o, "                for (int64_t c = 0; c < %" PRId64 "; c++) {\n", N);
    fprintf(o, "                    const int64_t i = r * %" PRId64 " + c;\n", N);
    c->inner = N;
    c->depth = 5;
    cg_group_body(c, head);
    c->depth = 0;
    c->inner = 0;
    fprintf(o, "                }\n        }\n    }\n");
}

static void emit_matmul(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1];
    int r = n->shape.rank, ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[r - 2], N = n->shape.dim[r - 1], K = a->shape.dim[r - 1 - ta];
    int64_t lda = a->shape.dim[r - 1], ldb = b->shape.dim[r - 1];
    FILE *o = c->out;
    if (r == 3) {
        fprintf(o, "    for (int64_t b = 0; b < %" PRId64 "; b++)\n    ", n->shape.dim[0]);
        fprintf(o, "    rt_gemm(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, v%d + b * %" PRId64
                   ", %" PRId64 ", v%d + b * %" PRId64 ", %" PRId64 ", 0.0f, v%d + b * %" PRId64 ", %" PRId64 ");\n",
                ta, tb, M, N, K, a->id, M * K, lda, b->id, K * N, ldb, n->id, M * N, N);
        return;
    }
    if (n->epilogue) {
        emit_matmul_epilogue(c, n);
        return;
    }
    fprintf(o, "    rt_gemm(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, v%d, %" PRId64 ", v%d, %" PRId64
               ", 0.0f, v%d, %" PRId64 ");\n",
            ta, tb, M, N, K, a->id, lda, b->id, ldb, n->id, N);
}

static void emit_bn(Cg *c, const IrNode *n);

/* ---- convolution + batch norm folding (evaluation) */

/* In eval_step, a convolution whose output only one batch norm reads (its statistics, from
 * the running buffers, and one application) is folded: the statistics are taken first, the
 * weights scaled per output channel by weight * invstd into fold_w<id>, and the batch norm
 * becomes `y + fold_b<id>[c]`, fold_b = bias - mean * weight * invstd. */
static void find_folds(Cg *c) {
    const IrGraph *g = c->g;
    int *readers = xcalloc((size_t)g->n + 1, sizeof *readers);
    for (int i = 0; i < g->n_fwd; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) readers[g->nodes[i]->in[k]->id]++;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *a = g->nodes[i];
        if (a->op != OP_BN_APPLY) continue;
        const IrNode *conv = a->in[0], *stats = a->in[1];
        if (conv->op == OP_CONV2D && stats->op == OP_BN_STATS && stats->in[0] == conv && readers[conv->id] == 2 &&
            readers[stats->id] == 1 && conv->dtype == DT_F32)
            c->fold[conv->id] = stats;
    }
    free(readers);
}

static const IrNode *fold_apply(const Cg *c, const IrNode *stats) {
    for (int i = stats->id + 1; i < c->g->n_fwd; i++)
        if (c->g->nodes[i]->op == OP_BN_APPLY && c->g->nodes[i]->in[1] == stats) return c->g->nodes[i];
    ICE("cpu: folded batch norm %%%d has no application", stats->id);
}

static void emit_fold(Cg *c, const IrNode *conv, const IrNode *stats) {
    const IrNode *w = conv->in[1], *apply = fold_apply(c, stats);
    int64_t K = w->shape.dim[0], per_k = ir_numel(&w->shape) / K;
    FILE *o = c->out;
    fprintf(o, "    // folded with batch norm %%%d (evaluation): its statistics now, the scale into the weights\n",
            apply->id);
    cg_declare(c, stats);
    cg_declare(c, apply->in[2]);
    cg_declare(c, apply->in[3]);
    emit_bn(c, stats);
    fprintf(o, "    static float fold_w%d[%" PRId64 "], fold_b%d[%" PRId64 "];\n", conv->id, K * per_k, conv->id, K);
    fprintf(o, "    rt_bn_fold(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d, fold_w%d, fold_b%d);\n", K, per_k, w->id,
            stats->id, apply->in[2]->id, apply->in[3]->id, conv->id, conv->id);
}

static void emit_conv(Cg *c, const IrNode *n) {
    FILE *o = c->out;
    cg_conv_geometry(o, n, "conv");
    static const char *const fns[] = {[CG_CONV_FWD] = "fwd", [CG_CONV_BWD_DATA] = "bwd_data",
                                      [CG_CONV_BWD_FILTER] = "bwd_filter"};
    const char *fn = fns[cg_conv_which(n)];
    char wname[32];
    snprintf(wname, sizeof wname, "v%d", n->in[1]->id);
    if (c->eval && c->fold[n->id]) {
        emit_fold(c, n, c->fold[n->id]);
        snprintf(wname, sizeof wname, "fold_w%d", n->id);
    }
    if (ir_operand_layout(n, 0) == LAYOUT_NHWC) { /* oneDNN, channels-last activations */
        fprintf(o, "    static RtConvPlan *plan%d; // built by the first call\n", n->id);
        fprintf(o, "    rt_conv2d_nhwc_%s(&conv%d, &plan%d, v%d, %s, v%d);\n", fn, n->id, n->id, n->in[0]->id,
                wname, n->id);
        return;
    }
    fprintf(o, "    rt_conv2d_%s(&conv%d, v%d, %s, v%d, ctx->scratch, ctx->scratch_per_thread);\n", fn,
            n->id, n->in[0]->id, wname, n->id);
}

static void emit_pool(Cg *c, const IrNode *n) {
    int max, bwd;
    cg_pool_kind(n, &max, &bwd);
    const IrShape *x = bwd ? &n->shape : &n->in[0]->shape;
    const IrShape *y = bwd ? &n->in[n->n_in - 1]->shape : &n->shape;
    const IrAttrs *a = &n->attr;
    FILE *o = c->out;
    fprintf(o, "    static const RtPool pool%d = {.N = %" PRId64 ", .C = %" PRId64 ", .H = %" PRId64
               ", .W = %" PRId64 ", .P = %" PRId64 ", .Q = %" PRId64 ",\n        .kh = %d, .kw = %d"
               ", .stride_h = %d, .stride_w = %d, .pad_h = %d, .pad_w = %d};\n",
            n->id, x->dim[0], x->dim[1], x->dim[2], x->dim[3], y->dim[2], y->dim[3], a->kernel[0],
            a->kernel[1], a->stride[0], a->stride[1], a->pad[0], a->pad[1]);
    fprintf(o, "    rt_%spool2d_%s%s(&pool%d", max ? "max" : "avg", n->layout == LAYOUT_NHWC ? "nhwc_" : "",
            bwd ? "bwd" : "fwd", n->id);
    for (int k = 0; k < n->n_in; k++) fprintf(o, ", v%d", n->in[k]->id);
    fprintf(o, ", v%d);\n", n->id);
}

/* Softmax, cross-entropy and accuracy see their first operand as [rows, last axis]. */
static void emit_rows(Cg *c, const IrNode *n) {
    const IrShape *s = &n->in[0]->shape;
    int64_t cols = s->rank ? s->dim[s->rank - 1] : 1, rows = ir_numel(s) / cols;
    int a = n->in[0]->id, b = n->n_in > 1 ? n->in[1]->id : -1;
    FILE *o = c->out;
    switch (n->op) {
    case OP_SOFTMAX:
        fprintf(o, "    rt_softmax_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d);\n", rows, cols, a, n->id);
        break;
    case OP_SOFTMAX_BWD:
        fprintf(o, "    rt_softmax_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d);\n", rows, cols, a, b, n->id);
        break;
    case OP_XENT:
        fprintf(o, "    rt_xent_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ", rows, cols, a, b);
        cg_lit(o, n->attr.smoothing), fprintf(o, ", ctx->n_valid, v%d);\n", n->id);
        break;
    case OP_XENT_BWD:
        fprintf(o, "    rt_xent_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ", rows, cols, a, b);
        cg_lit(o, n->attr.smoothing), fprintf(o, ", v%d, v%d);\n", n->in[2]->id, n->id);
        break;
    case OP_ACCURACY:
        fprintf(o, "    v%d[0] = rt_accuracy(%" PRId64 ", %" PRId64 ", v%d, v%d, ctx->n_valid);\n", n->id,
                rows, cols, a, b);
        break;
    default: ICE("cpu: %s is not a per-row kernel", ir_op_name(n->op));
    }
}

/* Batch-norm statistics and the backward sums: per channel, over N and the spatial axes. */
static void emit_bn(Cg *c, const IrNode *n) {
    const IrNode *x = n->in[0];
    int64_t N = x->shape.dim[0], C = x->shape.dim[1], HW = ir_numel(&x->shape) / (N * C);
    FILE *o = c->out;
    int nhwc = x->layout == LAYOUT_NHWC; /* then x (and dy) are N * HW rows of C channels */
    if (n->op == OP_BN_BWD_SUMS) {
        if (nhwc)
            fprintf(o, "    rt_bn_bwd_sums_nhwc(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d);\n", N * HW, C, x->id,
                    n->in[1]->id, n->in[2]->id, n->id);
        else
            fprintf(o, "    rt_bn_bwd_sums(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d);\n", N, C, HW,
                    x->id, n->in[1]->id, n->in[2]->id, n->id);
        return;
    }
    if (n->op != OP_BN_STATS) ICE("cpu: %s is not a batch-norm reduction", ir_op_name(n->op));
    const IrParam *rm = &c->g->params[n->attr.stat_param];
    if (nhwc) fprintf(o, "    rt_bn_stats_nhwc(%" PRId64 ", %" PRId64 ", v%d, v%d, ", N * HW, C, x->id, n->id);
    else fprintf(o, "    rt_bn_stats(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, ", N, C, HW, x->id, n->id);
    cg_dbl(o, n->attr.eps), fprintf(o, ", "), cg_dbl(o, n->attr.momentum);
    fprintf(o, ", ctx->params + %" PRId64 ", %d); // running statistics: ", rm->offset, !c->eval);
    cg_comment_text(o, rm->name);
    fprintf(o, "\n");
}

static void emit_lib(Cg *c, const IrNode *n) {
    cg_check_lib_operands(n, "cpu");
    switch (ir_op_lib(n->op)) {
    case LIB_MATMUL: emit_matmul(c, n); break;
    case LIB_CONV: emit_conv(c, n); break;
    case LIB_POOL: emit_pool(c, n); break;
    case LIB_ROWS: emit_rows(c, n); break;
    case LIB_BN: emit_bn(c, n); break;
    case LIB_NONE: ICE("cpu: no kernel for %s", ir_op_name(n->op));
    }
}

static void emit_node(Cg *c, const IrNode *n) {
    IrOpKind kind = ir_op_kind(n->op);
    if (n->storage == ST_INLINE) return; /* written into its users as a literal */
    if (kind == OPK_SOURCE || kind == OPK_VIEW) {
        if (!c->read[n->id]) return;
        if (kind == OPK_VIEW && !ir_stored_as(cg_root(n), n->layout)) ICE("cpu: reshape across layouts");
        cg_comment(c, n);
        cg_declare(c, n);
        return;
    }
    if (n->group) {
        if (!c->done[n->group]) emit_group(c, n);
        return;
    }
    if (c->eval && n->op == OP_BN_STATS && c->fold[n->in[0]->id] == n) return; /* taken with its convolution */
    if (n->fused_into) return; /* accumulated in its group's loop */
    cg_comment(c, n);
    if (kind != OPK_EW) /* kernels and reductions read constants through pointers */
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->storage == ST_INLINE) cg_declare(c, n->in[k]);
    cg_declare(c, n);
    switch (kind) {
    case OPK_EW: emit_ew(c, n); break;
    case OPK_REDUCE: emit_reduce(c, n); break;
    default: emit_lib(c, n); break;
    }
}

/* ---- the step functions */

static void emit_outputs(Cg *c) {
    const IrGraph *g = c->g;
    fprintf(c->out, "\n    ctx->loss = v%d[0];\n", g->loss->id);
    if (g->correct) fprintf(c->out, "    ctx->correct = v%d[0];\n", g->correct->id);
    else fprintf(c->out, "    ctx->correct = 0;\n");
}

/* Gradients that could not be computed in place in ctx->grads are copied there last. */
static void emit_grad_copies(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    int header = 0;
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (!p->trainable || (p->grad && cg_in_place(p))) continue;
        int64_t n = ir_numel(&p->node->shape);
        if (!header++) fprintf(o, "\n    // ---- gradients not computed in place\n");
        fprintf(o, "    // d ");
        cg_comment_text(o, p->name);
        fprintf(o, "\n");
        if (!p->grad) {
            fprintf(o, "    memset(ctx->grads + %" PRId64 ", 0, %" PRId64 " * sizeof(float));\n", p->grad_offset, n);
        } else if (p->grad->storage == ST_INLINE) {
            fprintf(o, "    for (int64_t i = 0; i < %" PRId64 "; i++) ctx->grads[%" PRId64 " + i] = ", n, p->grad_offset);
            cg_lit(o, cg_const_value(p->grad));
            fprintf(o, ";\n");
        } else {
            fprintf(o, "    memcpy(ctx->grads + %" PRId64 ", v%d, %" PRId64 " * sizeof(float));\n", p->grad_offset,
                    p->grad->id, n);
        }
    }
}

static void emit_forward_backward(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    cg_mark_reads(c, g->n, 1);
    fprintf(o, "// One training step's computation: the forward pass, loss and metrics, then the\n"
               "// backward pass, which leaves every trainable parameter's gradient in ctx->grads.\n");
    fprintf(o, "static void forward_backward(RtCtx *ctx) {\n");
    for (int i = 0; i < g->n; i++) {
        if (i == g->n_fwd) fprintf(o, "\n    // ---- backward\n");
        emit_node(c, g->nodes[i]);
    }
    emit_grad_copies(c);
    emit_outputs(c);
    fprintf(o, "}\n\n");
}

static void emit_eval(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    cg_mark_reads(c, g->n_fwd, 0);
    c->eval = 1;
    find_folds(c);
    fprintf(o, "// The forward pass in evaluation mode (dropout off), with the same buffers as the\n"
               "// training step: loss and metrics only.\n");
    fprintf(o, "static void eval_step(RtCtx *ctx) {\n");
    for (int i = 0; i < g->n_fwd; i++) emit_node(c, g->nodes[i]);
    emit_outputs(c);
    fprintf(o, "}\n\n");
    c->eval = 0;
}

/* ---- optimizer */

static void emit_optimizer(Cg *c) {
    const IrTrain *t = &c->g->train;
    int64_t n = c->g->n_grad_floats;
    FILE *o = c->out;
    fprintf(o, "// One fused update of every trainable parameter, params[i] from grads[i], with\n"
               "// PyTorch's formulas; the learning rate (schedule applied) and step come from ctx.\n");
    fprintf(o, "static void optimizer_step(RtCtx *ctx) {\n");
    cg_emit_optim_step(o, t, "ctx->lr", "ctx->step");
    fprintf(o, "    float *p = ctx->params, *state = ctx->optstate;\n    const float *g = ctx->grads;\n");
    loop_head(c, n, "    ");
    fprintf(o, " %s(h, s, p, g, state, %" PRId64 ", i);\n}\n\n", rt_optimizer(t->optim)->update_fn, n);
}

static void emit_model(Cg *c) {
    const IrGraph *g = c->g;
    const IrTrain *t = &g->train;
    FILE *o = c->out;
    fprintf(o, "static const RtModel model = {\n    .name = "), cg_cstr(o, g->model_name);
    fprintf(o, ",\n    .source = "), cg_cstr(o, g->source_path);
    fprintf(o, ",\n    .batch = %" PRId64 ",\n", g->batch);
    fprintf(o, "    .n_inputs = %d,\n    .inputs = %s,\n", g->n_inputs, g->n_inputs ? "inputs" : "NULL");
    fprintf(o, "    .n_params = %d,\n    .params = %s,\n", g->n_params, g->n_params ? "params" : "NULL");
    fprintf(o, "    .n_param_floats = %" PRId64 ",\n    .n_grad_floats = %" PRId64 ",\n", g->n_param_floats,
            g->n_grad_floats);
    fprintf(o, "    .n_state_slots = %d,\n", cg_state_slots(t));
    fprintf(o, "    .arena_bytes = %" PRId64 ",\n", g->arena_bytes > 64 ? g->arena_bytes : 64);
    fprintf(o, "    .scratch_per_thread = %" PRId64 ",\n", g->scratch_per_thread);
    fprintf(o, "    .optim = %s,\n", rt_optimizer(t->optim)->enum_name);
    cg_emit_schedule(o, t);
    fprintf(o, "    .epochs = %" PRId64 ",\n    .eval_every = %" PRId64 ",\n    .log_every = %" PRId64 ",\n",
            t->epochs, t->eval_every, t->log_every);
    fprintf(o, "    .has_accuracy = %d,\n    .loss_name = \"%s\",\n", g->correct != NULL, cg_loss_names[t->loss_kind]);
    fprintf(o, "    .forward_backward = forward_backward,\n    .optimizer_step = optimizer_step,\n");
    fprintf(o, "    .eval_step = eval_step,\n};\n\n");
}

static void emit_prologue(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    fprintf(o, "// "), cg_comment_text(o, g->model_name);
    fprintf(o, ".c - the trainer for model '"), cg_comment_text(o, g->model_name);
    fprintf(o, "', generated by netc from "), cg_comment_text(o, g->source_path);
    fprintf(o, ".\n// Do not edit: change the .net file and run netc again.\n//\n");
    fprintf(o, "// Every tensor of the training step has a home fixed at compile time:\n"
               "//   ctx->params    every parameter, one flat float array (%" PRId64 " floats, trainable first)\n"
               "//   ctx->grads     their gradients; grads[i] belongs to params[i] (%" PRId64 " floats)\n"
               "//   ctx->optstate  optimizer state, %d slot(s) of %" PRId64 " floats\n"
               "//   ctx->inputs    the batch (%" PRId64 " samples), one buffer per model input\n"
               "//   ctx->arena     every other value, at an offset from the memory plan: %" PRId64 " bytes\n"
               "//                  (%" PRId64 " without reuse of dead values' bytes)\n",
            g->n_param_floats, g->n_grad_floats, cg_state_slots(&g->train), g->n_grad_floats, g->batch,
            g->arena_bytes, g->unplanned_bytes);
    fprintf(o, "// A training step is forward_backward() then optimizer_step(); eval_step() is the forward\n"
               "// pass alone. libnetrt's rt_main() owns the rest: command line, data loading, parameter\n"
               "// initialisation, the training loop, logging and weight files.\n//\n");
    fprintf(o, "// Build: cc -std=gnu11 -O2 -fopenmp "), cg_comment_text(o, g->model_name);
    fprintf(o, ".c -I<netc>/runtime <build>/runtime/libnetrt.a\n"
               "//            -ldnnl -lopenblas -lcjson -lz -lpthread -lm\n\n");
    fprintf(o, "#include <math.h>\n#include <omp.h>\n#include <stdint.h>\n#include <string.h>\n\n#include \"netrt.h\"\n\n");
    cg_emit_helpers(c);
}

/* ---- the emit phases (codegen.h)
 *
 * The file reads prologue, model description, forward_backward, eval_step, optimizer_step, the
 * RtModel and main(). The optimizer phase runs before the evaluation phase (cg_emit's order),
 * so its text waits in a buffer until cpu_model places it. */
struct CgEmit {
    Cg c;
    FILE *optimizer; /* optimizer_step's text, into text/size */
    char *text;
    size_t size;
};

static CgEmit *cpu_begin(const IrGraph *g, FILE *trainer, FILE *kernels) {
    (void)kernels; /* the CPU target has none */
    if (!g->loss) ICE("cpu: the graph has no loss");
    CgEmit *e = xcalloc(1, sizeof *e);
    e->c = (Cg){.g = g, .out = trainer};
    e->c.read = xcalloc((size_t)g->n + 1, 1);
    e->c.decl = xcalloc((size_t)g->n + 1, 1);
    e->c.done = xcalloc((size_t)g->n_groups + 1, 1);
    e->c.fold = xcalloc((size_t)g->n + 1, sizeof *e->c.fold);
    if (!(e->optimizer = open_memstream(&e->text, &e->size))) ICE("cpu: out of memory");
    emit_prologue(&e->c);
    fprintf(trainer, "// ---- model description\n\n");
    cg_emit_description(&e->c);
    return e;
}

static void cpu_step(CgEmit *e) {
    fprintf(e->c.out, "// ---- forward and backward\n\n");
    emit_forward_backward(&e->c);
}

static void cpu_optimizer(CgEmit *e) {
    FILE *trainer = e->c.out;
    e->c.out = e->optimizer;
    emit_optimizer(&e->c);
    e->c.out = trainer;
}

static void cpu_eval(CgEmit *e) {
    fprintf(e->c.out, "// ---- evaluation\n\n");
    emit_eval(&e->c);
}

static int cpu_model(CgEmit *e) {
    FILE *out = e->c.out;
    fclose(e->optimizer);
    fprintf(out, "// ---- optimizer\n\n%s", e->text);
    fprintf(out, "// ---- entry point\n\n");
    emit_model(&e->c);
    fprintf(out, "int main(int argc, char **argv) { return rt_main(argc, argv, &model); }\n");
    free(e->text);
    free(e->c.read);
    free(e->c.decl);
    free(e->c.done);
    free((void *)e->c.fold);
    free(e);
    return ferror(out) ? 1 : 0;
}

/* Per-thread scratch of the im2col convolutions (rt_conv2d_*): one sample's unfolded input
 * and a weight-gradient accumulator. Channels-last convolutions run in oneDNN, which brings
 * its own. */
static int64_t conv_scratch(const IrNode *n) {
    if (n->op != OP_CONV2D && n->op != OP_CONV2D_BWD_DATA && n->op != OP_CONV2D_BWD_FILTER) return 0;
    if (ir_operand_layout(n, 0) == LAYOUT_NHWC) return 0;
    const IrShape *x = n->op == OP_CONV2D_BWD_DATA ? &n->shape : &n->in[0]->shape;
    const IrShape *w = n->op == OP_CONV2D ? &n->in[1]->shape
                     : n->op == OP_CONV2D_BWD_DATA ? &n->in[1]->shape : &n->shape;
    const IrShape *y = n->op == OP_CONV2D ? &n->shape
                     : n->op == OP_CONV2D_BWD_DATA ? &n->in[0]->shape : &n->in[1]->shape;
    RtConv c = {.N = x->dim[0], .C = x->dim[1], .H = x->dim[2], .W = x->dim[3],
                .K = w->dim[0], .R = w->dim[2], .S = w->dim[3], .P = y->dim[2],
                .Q = y->dim[3], .groups = n->attr.groups};
    return rt_conv2d_scratch(&c);
}

const CgBackend cg_cpu = {
    .name = "cpu",
    .description = "portable C with OpenBLAS and OpenMP, linked with libnetrt",
    .precisions = 1u << CG_FP32,
    .precision_note = "the CPU backend computes in float32",
    .fuse_reductions = 1,
    .krsc_filters = 0, /* oneDNN reorders the weights itself */
    .node_scratch = conv_scratch,
    .emit_begin = cpu_begin,
    .emit_step = cpu_step,
    .emit_optimizer = cpu_optimizer,
    .emit_eval = cpu_eval,
    .emit_model = cpu_model,
};
