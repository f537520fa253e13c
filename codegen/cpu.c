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

/* The pragma of a flat loop over n elements: threads and vectors when n is large enough. */
static void flat_pragma(Cg *c, int64_t n) {
    if (n >= PAR_MIN) cg_line(c, "#pragma omp parallel for simd");
}

/* An operand of n is broadcast to `total` elements: it has more than one and fewer. */
static int broadcast_in(const IrNode *n, int64_t total) {
    for (int k = 0; k < n->n_in; k++)
        if (ir_numel(&n->in[k]->shape) > 1 && ir_numel(&n->in[k]->shape) < total) return 1;
    return 0;
}

/* head, or another member of head's group, reads an operand broadcast to it (a bias, a
 * per-channel batch-norm value). */
static int reads_broadcast(const Cg *c, const IrNode *head) {
    int64_t total = ir_numel(&head->shape);
    const IrNode *n;
    if (!head->group) return broadcast_in(head, total);
    FOR_MEMBERS(n, head)
        if (broadcast_in(n, total)) return 1;
    return 0;
}

/* The extent of n's innermost physical axis longer than 1 when an element-wise loop over n
 * should be two-level (rows of it), else 0: an axis whose operands would otherwise index it with
 * `%` (a bias, a per-channel batch-norm value), long enough for the inner loop to vectorise, or
 * short (LeNet's 6 channels) while an operand is broadcast: a `%` on every element costs more
 * than a short inner loop. */
static int64_t inner_extent(const Cg *c, const IrNode *n) {
    int perm[IR_MAX_RANK];
    cg_phys_order(n, perm);
    for (int k = n->shape.rank - 1; k >= 0; k--) {
        int64_t d = n->shape.dim[perm[k]];
        if (d > 1) return (d >= 16 || reads_broadcast(c, n)) && d < ir_numel(&n->shape) ? d : 0;
    }
    return 0;
}

/* The head of a two-level loop's inner loop over columns [from, to) of its row r. */
static void inner_loop_head(Cg *c, int64_t from, int64_t to) {
    cg_line(c, "#pragma omp simd");
    if (from) cg_line(c, "for (int64_t c = %" PRId64 "; c < %" PRId64 "; c++) {", from, to);
    else cg_line(c, "for (int64_t c = 0; c < %" PRId64 "; c++) {", to); /* no level of its own */
    cg_line(c, "const int64_t i = r * %" PRId64 " + c;", c->inner);
}

/* Open an element-wise loop over n's elements, flat or two-level as c->inner says (set by the
 * caller: inner_extent); the body sees `i`, one level deeper, and a two-level loop's inner loop
 * runs over its first `end` columns (0: all). loop_close ends it. The two loops of a two-level
 * one count as one level: the column loop's line and the body stay at the row loop's inner
 * depth, and `}}` closes both. */
static void loop_open(Cg *c, const IrNode *n, int64_t end) {
    int64_t total = ir_numel(&n->shape);
    if (!c->inner) {
        flat_pragma(c, total);
        cg_open(c, "for (int64_t i = 0; i < %" PRId64 "; i++) {", total);
        return;
    }
    if (total >= PAR_MIN) cg_line(c, "#pragma omp parallel for");
    cg_open(c, "for (int64_t r = 0; r < %" PRId64 "; r++) {", total / c->inner);
    inner_loop_head(c, 0, end ? end : c->inner);
}

static void loop_close(Cg *c) {
    cg_close(c, c->inner ? "}}" : "}");
    c->inner = 0;
}

static int by_value(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The body of an element-wise loop over head's elements: the one node's store, or its group's. */
static void ew_body(Cg *c, const IrNode *head) {
    if (head->group) cg_group_body(c, head);
    else cg_ew_store(c, head, 0);
}

/* An element-wise loop over head's elements with its body. Where the body reads a folded
 * concatenation or slice gradient along the inner axis of a two-level loop (cexpr.c's
 * read_split), the choice of operand would be a test on every element, which the vectoriser
 * turns into masked loads (on the EPYC here 8x the time of a plain loop): the inner loop is
 * then cut where the choices change, one loop per part, each part's choices made here. */
static void emit_ew_loop(Cg *c, const IrNode *head) {
    int64_t cuts[CG_MAX_CUTS + 2];
    int n_cuts = 0;
    c->inner = inner_extent(c, head);
    if (c->inner) { /* a dry run of the body gathers the cuts */
        char *text = NULL;
        size_t size = 0;
        FILE *out = c->out;
        c->out = open_memstream(&text, &size);
        if (!c->out) ICE("cpu: open_memstream");
        c->cuts = cuts + 1, c->n_cuts = 0;
        ew_body(c, head);
        fclose(c->out);
        free(text);
        c->out = out, c->cuts = NULL, n_cuts = c->n_cuts;
    }
    if (!n_cuts) {
        loop_open(c, head, 0);
        ew_body(c, head);
        loop_close(c);
        return;
    }
    qsort(cuts + 1, (size_t)n_cuts, sizeof *cuts, by_value);
    cuts[0] = 0, cuts[n_cuts + 1] = c->inner;
    loop_open(c, head, cuts[1]); /* its inner loop over the first part */
    for (int k = 0; k <= n_cuts; k++) {
        if (k) {
            cg_line(c, "}");
            inner_loop_head(c, cuts[k], cuts[k + 1]);
        }
        c->seg_lo = cuts[k], c->seg_hi = cuts[k + 1];
        ew_body(c, head);
    }
    c->seg_lo = c->seg_hi = 0;
    loop_close(c);
}

static void emit_ew(Cg *c, const IrNode *n) {
    if (ir_numel(&n->shape) == 1 && n->op != OP_DROPOUT && n->op != OP_DROPOUT_GRAD) {
        cg_ew_store(c, n, 1); /* a scalar: no loop */
        return;
    }
    emit_ew_loop(c, n);
}

/* --sync-bn: batch-norm node n (statistics, or the backward sums) sums over the ranks: a batch
 * norm in training whose statistics are the batch's, not frozen ones. */
static int sync_bn(const Cg *c, const IrNode *n) {
    const IrNode *stats = n->op == OP_BN_BWD_SUMS ? n->in[1] : n;
    if (stats->op != OP_BN_STATS) ICE("cpu: batch-norm sums of %s", ir_op_name(stats->op));
    return c->g->sync_bn && !c->eval && !stats->attr.bn_frozen;
}

/* A channels-last group with batch-norm sums accumulated in its loop (fuse_reductions): rows of
 * C channels in blocks of RT_BN_BLOCK_ROWS, each block's partial sums in double, then the
 * blocks in order: the same arithmetic in the same order as rt_bn_bwd_sums_nhwc. */
static void emit_group_with_sums(Cg *c, const IrNode *head) {
    const IrNode *s;
    int64_t C = head->shape.dim[1], M = ir_numel(&head->shape) / C;
    int64_t nb = (M + RT_BN_BLOCK_ROWS - 1) / RT_BN_BLOCK_ROWS;
    cg_begin(c, "// fused group %d: one pass over %" PRId64 " rows of %" PRId64 " channels, accumulating the sums",
             head->group, M, C);
    FOR_SUMS(s, head) cg_put(c, " %%%d", s->id);
    cg_end(c, "%s", "");
    cg_group_header(c, head);
    FOR_SUMS(s, head) {
        cg_comment(c, s);
        cg_declare(c, s);
        cg_line(c, "static double part%d[%" PRId64 "]; // per block of rows: sum(dy), sum(dy * xhat)", s->id,
                nb * 2 * C);
    }
    cg_line(c, "#pragma omp parallel for schedule(static)%s", M * C >= PAR_MIN ? "" : " if (0)");
    cg_open(c, "for (int64_t b = 0; b < %" PRId64 "; b++) {", nb);
    FOR_SUMS(s, head) {
        cg_line(c, "double *p%d = part%d + b * %" PRId64 ";", s->id, s->id, 2 * C);
        cg_line(c, "for (int64_t c = 0; c < %" PRId64 "; c++) p%d[c] = 0;", 2 * C, s->id);
    }
    cg_line(c, "const int64_t end = (b + 1) * %d < %" PRId64 " ? (b + 1) * %d : %" PRId64 ";", RT_BN_BLOCK_ROWS, M,
            RT_BN_BLOCK_ROWS, M);
    cg_open(c, "for (int64_t r = b * %d; r < end; r++) {", RT_BN_BLOCK_ROWS);
    /* lanes across the channels, each channel's sums still over the rows in order: the same
     * bits as one channel at a time (which GCC left scalar, the pointers' aliasing unknown) */
    cg_line(c, "#pragma omp simd");
    cg_open(c, "for (int64_t c = 0; c < %" PRId64 "; c++) {", C);
    cg_line(c, "const int64_t i = r * %" PRId64 " + c;", C);
    c->inner = C;
    cg_group_body(c, head);
    c->inner = 0;
    FOR_SUMS(s, head) {
        int x = s->in[0]->id, st = s->in[1]->id, dy = s->in[2]->id;
        cg_line(c, "p%d[c] += t%d;", s->id, dy);
        cg_line(c, "p%d[%" PRId64 " + c] += (double)t%d * ((v%d[i] - v%d[c]) * v%d[%" PRId64 " + c]);", s->id, C, dy,
                x, st, st, C);
    }
    cg_close(c, "}");
    cg_close(c, "}");
    cg_close(c, "}");
    FOR_SUMS(s, head) {
        int sync = sync_bn(c, s); /* then the double sums are added over the ranks before they are rounded */
        if (sync) cg_line(c, "static double sum%d[%" PRId64 "];", s->id, 2 * C);
        cg_open(c, "for (int64_t c = 0; c < %" PRId64 "; c++) {", 2 * C);
        cg_line(c, "double s = 0;");
        cg_line(c, "for (int64_t b = 0; b < %" PRId64 "; b++) s += part%d[b * %" PRId64 " + c];", nb, s->id, 2 * C);
        if (sync) cg_line(c, "sum%d[c] = s;", s->id);
        else cg_line(c, "v%d[c] = (float)s;", s->id);
        cg_close(c, "}");
        if (sync) cg_line(c, "rt_bn_sums_sync(ctx, sum%d, %" PRId64 ", v%d); // over every rank's batch", s->id, C, s->id);
    }
}

/* A fused group: one loop over its elements. */
static void emit_group(Cg *c, const IrNode *head) {
    const IrNode *s;
    FOR_SUMS(s, head) {
        emit_group_with_sums(c, head);
        return;
    }
    cg_line(c, "// fused group %d: one loop over %" PRId64 " elements", head->group, ir_numel(&head->shape));
    cg_group_header(c, head);
    emit_ew_loop(c, head);
}

/* ---- reductions */

enum { SUM_COLS = 32, SUM_ROWS = 4 }; /* outputs summed side by side, rows added at a time by emit_sum_to_rows */

/* A SUM_TO over rows of out_n outputs (cg_sum_to_rows): each output's sum runs over the rows in
 * order from 0 in double, as emit_sum_to's loop has it, so the result is the same; but SUM_COLS
 * outputs advance together along each row, so their sums overlap instead of waiting on one
 * another's additions, and the loads are contiguous; and SUM_ROWS rows are added to a sum in
 * one statement, ((acc + x0) + x1) + ..., the same additions in the same order, so that the sum
 * goes through memory once per SUM_ROWS rows, not once a row (the bias gradients of a GPT-2
 * small took 2-2.8x the time one row at a time, 16 outputs side by side). */
static void emit_sum_to_rows(Cg *c, const IrNode *n, int64_t out_n, int64_t red_n) {
    int x = n->in[0]->id;
    const int64_t grouped = red_n - red_n % SUM_ROWS;
    if (out_n > SUM_COLS && out_n * red_n >= PAR_MIN) cg_line(c, "#pragma omp parallel for");
    cg_open(c, "for (int64_t o0 = 0; o0 < %" PRId64 "; o0 += %d) {", out_n, SUM_COLS);
    cg_line(c, "const int64_t cols = %" PRId64 " - o0 < %d ? %" PRId64 " - o0 : %d;", out_n, SUM_COLS, out_n, SUM_COLS);
    cg_line(c, "double acc[%d] = {0};", SUM_COLS);
    if (grouped > 0) {
        cg_line(c, "for (int64_t j = 0; j < %" PRId64 "; j += %d)", grouped, SUM_ROWS);
        c->depth++; /* the row loop's one statement */
        cg_line(c, "#pragma omp simd");
        cg_begin(c, "for (int64_t o = 0; o < cols; o++) acc[o] = acc[o]");
        for (int r = 0; r < SUM_ROWS; r++)
            fprintf(c->out, " + v%d[(j + %d) * %" PRId64 " + o0 + o]", x, r, out_n);
        cg_end(c, ";");
        c->depth--;
    }
    if (grouped < red_n) {
        cg_line(c, "for (int64_t j = %" PRId64 "; j < %" PRId64 "; j++)", grouped, red_n);
        c->depth++;
        cg_line(c, "#pragma omp simd");
        cg_line(c, "for (int64_t o = 0; o < cols; o++) acc[o] += v%d[j * %" PRId64 " + o0 + o];", x, out_n);
        c->depth--;
    }
    cg_line(c, "for (int64_t o = 0; o < cols; o++) v%d[o0 + o] = (float)acc[o];", n->id);
    cg_close(c, "}");
}

/* x summed down to the node's shape: for each output element, a loop over the reduced index
 * space of the axes that broadcasting stretched. */
static void emit_sum_to(Cg *c, const IrNode *n) {
    const IrNode *x = n->in[0];
    FILE *o = c->out;
    int64_t out_n = ir_numel(&n->shape), red_n = ir_numel(&x->shape) / out_n;
    if (out_n > 1 && x->dtype == DT_F32 && cg_sum_to_rows(n)) {
        emit_sum_to_rows(c, n, out_n, red_n);
        return;
    }
    if (out_n > 1 && ir_numel(&x->shape) >= PAR_MIN) cg_line(c, "#pragma omp parallel for");
    cg_open(c, "for (int64_t o = 0; o < %" PRId64 "; o++) {", out_n);
    cg_begin(c, "%s", "");
    cg_sum_to_base(o, n);
    cg_end(c, "%s", "");
    cg_line(c, "double acc = 0;");
    cg_line(c, "for (int64_t j = 0; j < %" PRId64 "; j++)", red_n);
    c->depth++; /* the loop's one statement */
    cg_begin(c, "acc += ");
    cg_sum_to_elem(o, n);
    cg_end(c, ";");
    c->depth--;
    cg_line(c, "v%d[o] = (float)acc;", n->id);
    cg_close(c, "}");
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
    cg_open(c, "{");
    if (masked)
        cg_line(c, "const int64_t count = ctx->n_valid * %" PRId64 "; // valid rows only", total / x->shape.dim[0]);
    else cg_line(c, "const int64_t count = %" PRId64 ";", total);
    cg_line(c, "double acc = 0;");
    if (total >= PAR_MIN) cg_line(c, "#pragma omp parallel for reduction(+ : acc)");
    cg_line(c, "for (int64_t i = 0; i < count; i++)");
    c->depth++; /* the loop's one statement */
    cg_begin(c, "acc += ");
    cg_load_open(o, x);
    cg_put(c, "v%d[i]", x->id);
    cg_load_close(o, x);
    cg_end(c, ";");
    c->depth--;
    cg_line(c, "v%d[0] = (float)(acc%s);", n->id, n->op == OP_MEAN ? " / (double)count" : "");
    cg_close(c, "}");
}

/* ---- library kernels */

/* The first line of a parallel region whose threads split `extent` rows (or columns) as
 * [r0, r1): the same split everywhere, so that a thread meets the same rows of a parameter in
 * the forward product, its gradient and its update, in its own core's cache. */
static void emit_thread_share(Cg *c, const char *r0, const char *r1, int64_t extent) {
    cg_line(c, "const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();");
    cg_line(c, "const int64_t %s = %" PRId64 " * th / nt, %s = %" PRId64 " * (th + 1) / nt;", r0, extent, r1, extent);
}

/* The call multiplying rows [r0, r1) of rank-2 product n's output, in a thread's share. */
static void emit_gemm_rows(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1];
    int ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t N = n->shape.dim[1], K = a->shape.dim[1 - ta], lda = a->shape.dim[1], ldb = b->shape.dim[1];
    /* rows r0.. of op(A): rows of A, or columns of A when it is transposed */
    cg_line(c, "rt_gemm(%d, %d, r1 - r0, %" PRId64 ", %" PRId64 ", 1.0f, v%d + r0 * %" PRId64 ", %" PRId64
               ", v%d, %" PRId64 ", 0.0f, v%d + r0 * %" PRId64 ", %" PRId64 ");",
            ta, tb, N, K, a->id, ta ? (int64_t)1 : lda, lda, b->id, ldb, n->id, N, N);
}

/* A rank-2 product with its epilogue group: each thread multiplies its own block of the output
 * (OpenBLAS runs single-threaded inside a parallel region) and applies the group to that block
 * while it is still in cache. A block of rows, or of columns when the output is wider than tall
 * (a dense layer at a small batch), so that each thread reads its part of the larger operand,
 * the weight, and no other's. */
static void emit_matmul_epilogue(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1], *head = NULL;
    int ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[0], N = n->shape.dim[1], K = a->shape.dim[1 - ta];
    int64_t lda = a->shape.dim[1], ldb = b->shape.dim[1];
    int cols = N > M;
    for (int i = n->id + 1; i < c->g->n && !head; i++)
        if (c->g->nodes[i]->group == n->epilogue) head = c->g->nodes[i];
    cg_line(c, "// with its epilogue, fused group %d (%s), on each thread's block of %s", n->epilogue,
            epilogue_kind(c->g, n), cols ? "columns" : "rows");
    cg_group_header(c, head);
    cg_line(c, "#pragma omp parallel");
    cg_open(c, "{");
    if (cols) {
        emit_thread_share(c, "c0", "c1", N);
        cg_open(c, "if (c1 > c0) {");
        /* columns c0.. of op(B): rows of B when it is transposed, else its columns */
        cg_line(c, "rt_gemm(%d, %d, %" PRId64 ", c1 - c0, %" PRId64 ", 1.0f, v%d, %" PRId64 ", v%d + c0 * %" PRId64
                   ", %" PRId64 ", 0.0f, v%d + c0, %" PRId64 ");",
                ta, tb, M, K, a->id, lda, b->id, tb ? ldb : (int64_t)1, ldb, n->id, N);
        cg_line(c, "for (int64_t r = 0; r < %" PRId64 "; r++)", M);
    } else {
        emit_thread_share(c, "r0", "r1", M);
        cg_open(c, "if (r1 > r0) {");
        emit_gemm_rows(c, n);
        cg_line(c, "for (int64_t r = r0; r < r1; r++)");
    }
    c->depth++; /* the row loop's one statement */
    cg_line(c, "#pragma omp simd");
    if (cols) cg_open(c, "for (int64_t c = c0; c < c1; c++) {");
    else cg_open(c, "for (int64_t c = 0; c < %" PRId64 "; c++) {", N);
    cg_line(c, "const int64_t i = r * %" PRId64 " + c;", N);
    c->inner = N;
    cg_group_body(c, head);
    c->inner = 0;
    cg_close(c, "}");
    c->depth--;
    cg_close(c, "}");
    cg_close(c, "}");
}

/* n writes the gradient of a parameter that forward_backward updates (Cg.in_backward). */
static int updated_in_backward(const Cg *c, const IrNode *n) {
    if (!c->in_backward || n->storage != ST_GRAD) return 0;
    for (int i = 0; i < c->g->n_params; i++)
        if (c->in_backward[i] >= 0 && c->g->params[i].grad_offset == n->offset &&
            ir_numel(&c->g->params[i].node->shape) == ir_numel(&n->shape))
            return 1;
    return 0;
}

static void emit_matmul(Cg *c, const IrNode *n) {
    const IrNode *a = n->in[0], *b = n->in[1];
    int r = n->shape.rank, ta = n->attr.trans_a, tb = n->attr.trans_b;
    int64_t M = n->shape.dim[r - 2], N = n->shape.dim[r - 1], K = a->shape.dim[r - 1 - ta];
    int64_t lda = a->shape.dim[r - 1], ldb = b->shape.dim[r - 1];
    if (n->op == OP_MATMUL_ROWS) { /* the rows of a whose label counts (ignored_rows.c) */
        cg_line(c, "rt_gemm_rows(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, %" PRId64 ", v%d, %" PRId64
                   ", v%d, %" PRId64 ", v%d, %" PRId64 ");",
                ta, tb, M, N, K, a->id, lda, b->id, ldb, n->id, N, n->in[2]->id, n->attr.ignore_index);
        return;
    }
    if (r == 3) {
        cg_line(c, "for (int64_t b = 0; b < %" PRId64 "; b++)", n->shape.dim[0]);
        c->depth++; /* the loop's one statement */
        cg_line(c, "rt_gemm(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, v%d + b * %" PRId64 ", %" PRId64
                   ", v%d + b * %" PRId64 ", %" PRId64 ", 0.0f, v%d + b * %" PRId64 ", %" PRId64 ");",
                ta, tb, M, N, K, a->id, M * K, lda, b->id, K * N, ldb, n->id, M * N, N);
        c->depth--;
        return;
    }
    if (n->epilogue) {
        emit_matmul_epilogue(c, n);
        return;
    }
    if (updated_in_backward(c, n)) {
        cg_line(c, "// each thread the rows of the gradient its update will read (emit_thread_share)");
        cg_line(c, "#pragma omp parallel");
        cg_open(c, "{");
        emit_thread_share(c, "r0", "r1", M);
        cg_line(c, "if (r1 > r0)");
        c->depth++;
        emit_gemm_rows(c, n);
        c->depth--;
        cg_close(c, "}");
        return;
    }
    cg_line(c, "rt_gemm(%d, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", 1.0f, v%d, %" PRId64 ", v%d, %" PRId64
               ", 0.0f, v%d, %" PRId64 ");",
            ta, tb, M, N, K, a->id, lda, b->id, ldb, n->id, N);
}

static void emit_bn(Cg *c, const IrNode *n);

/* ---- convolution + batch norm folding (evaluation) */

/* In eval_step, a convolution whose output only one batch norm reads (its statistics, from
 * the running buffers, and one application) is folded: the statistics are taken first, the
 * weights scaled per output channel by weight * invstd into fold_w<id>, and the batch norm
 * becomes `y + fold_b<id>[c]`, fold_b = bias - mean * weight * invstd. Not where the convolution
 * is the model's output, which --predict hands out unscaled. */
static void find_folds(Cg *c) {
    const IrGraph *g = c->g;
    int *readers = xcalloc((size_t)g->n + 1, sizeof *readers);
    for (int i = 0; i < g->n_fwd; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) readers[g->nodes[i]->in[k]->id]++;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *a = g->nodes[i];
        if (a->op != OP_BN_APPLY) continue;
        const IrNode *conv = a->in[0], *stats = ir_bn_stats(a);
        if (conv->op == OP_CONV2D && conv != g->output && stats->in[0] == conv && readers[conv->id] == 2 &&
            readers[stats->id] == 2 && readers[a->in[1]->id] == 1 && readers[a->in[2]->id] == 1 &&
            conv->dtype == DT_F32)
            c->fold[conv->id] = stats;
    }
    free(readers);
}

static const IrNode *fold_apply(const Cg *c, const IrNode *stats) {
    for (int i = stats->id + 1; i < c->g->n_fwd; i++)
        if (c->g->nodes[i]->op == OP_BN_APPLY && ir_bn_stats(c->g->nodes[i]) == stats) return c->g->nodes[i];
    ICE("cpu: folded batch norm %%%d has no application", stats->id);
}

static void emit_fold(Cg *c, const IrNode *conv, const IrNode *stats) {
    const IrNode *w = conv->in[1], *apply = fold_apply(c, stats);
    int64_t K = w->shape.dim[0], per_k = ir_numel(&w->shape) / K;
    cg_line(c, "// folded with batch norm %%%d (evaluation): its statistics now, the scale into the weights",
            apply->id);
    /* The statistics are taken before the convolution here, after it in the memory plan, which
     * may give them the bytes of a value the convolution still reads: they get their own. */
    c->decl[stats->id] = 1;
    cg_line(c, "static float fold_s%d[%" PRId64 "]; // its statistics: not in the arena, which the plan "
               "gives them after the convolution", conv->id, 2 * K);
    cg_line(c, "float *v%d = fold_s%d;", stats->id, conv->id);
    cg_declare(c, apply->in[3]);
    cg_declare(c, apply->in[4]);
    emit_bn(c, stats);
    cg_line(c, "static float fold_w%d[%" PRId64 "], fold_b%d[%" PRId64 "];", conv->id, K * per_k, conv->id, K);
    cg_line(c, "rt_bn_fold(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d, fold_w%d, fold_b%d);", K, per_k, w->id,
            stats->id, apply->in[3]->id, apply->in[4]->id, conv->id, conv->id);
}

static void emit_conv(Cg *c, const IrNode *n) {
    cg_conv_geometry(c, n, "conv");
    static const char *const fns[] = {[CG_CONV_FWD] = "fwd", [CG_CONV_BWD_DATA] = "bwd_data",
                                      [CG_CONV_BWD_FILTER] = "bwd_filter"};
    const char *fn = fns[cg_conv_which(n)];
    char wname[32];
    snprintf(wname, sizeof wname, "v%d", n->in[1]->id);
    if (c->eval && c->fold[n->id]) {
        emit_fold(c, n, c->fold[n->id]);
        snprintf(wname, sizeof wname, "fold_w%d", n->id);
    }
    if (ir_operand_nhwc(n, 0)) { /* oneDNN, channels-last activations */
        cg_line(c, "static RtConvPlan *plan%d; // built by the first call", n->id);
        cg_line(c, "rt_conv2d_nhwc_%s(&conv%d, &plan%d, v%d, %s, v%d);", fn, n->id, n->id, n->in[0]->id, wname, n->id);
        return;
    }
    cg_line(c, "rt_conv2d_%s(&conv%d, v%d, %s, v%d, ctx->scratch, ctx->scratch_per_thread);", fn, n->id,
            n->in[0]->id, wname, n->id);
}

static void emit_pool(Cg *c, const IrNode *n) {
    int max, bwd;
    cg_pool_kind(n, &max, &bwd);
    const IrShape *x = bwd ? &n->shape : &n->in[0]->shape;
    const IrShape *y = bwd ? &n->in[n->n_in - 1]->shape : &n->shape;
    const IrAttrs *a = &n->attr;
    cg_line(c, "static const RtPool pool%d = {.N = %" PRId64 ", .C = %" PRId64 ", .H = %" PRId64 ", .W = %" PRId64
               ", .P = %" PRId64 ", .Q = %" PRId64 ",",
            n->id, x->dim[0], x->dim[1], x->dim[2], x->dim[3], y->dim[2], y->dim[3]);
    c->depth++; /* the initializer's second line */
    cg_line(c, ".kh = %d, .kw = %d, .stride_h = %d, .stride_w = %d, .pad_h = %d, .pad_w = %d};", a->kernel[0],
            a->kernel[1], a->stride[0], a->stride[1], a->pad[0], a->pad[1]);
    c->depth--;
    cg_begin(c, "rt_%spool2d_%s%s(&pool%d", max ? "max" : "avg", ir_layout_eq(n->layout, LAYOUT_NHWC) ? "nhwc_" : "",
             bwd ? "bwd" : "fwd", n->id);
    for (int k = 0; k < n->n_in; k++) cg_put(c, ", v%d", n->in[k]->id);
    cg_end(c, ", v%d);", n->id);
}

/* The rows of a loss or metric's logits [..., C] that count: ctx->n_valid for [N, C]; for more
 * axes, the n_valid samples' rows when axis 0 is the batch, else all of them. */
static const char *valid_rows(Cg *c, const IrShape *s, int64_t rows, char *buf, size_t size) {
    if (s->rank <= 2) return "ctx->n_valid";
    if (s->dim[0] == c->g->batch) snprintf(buf, size, "ctx->n_valid * %" PRId64, rows / s->dim[0]);
    else snprintf(buf, size, "%" PRId64, rows);
    return buf;
}

/* Softmax, cross-entropy and accuracy see their first operand as [rows, last axis]. */
/* softmax, log-softmax and their gradients: they read attr.axis. */
static int op_has_axis(const IrNode *n) {
    return n->op == OP_SOFTMAX || n->op == OP_SOFTMAX_BWD || n->op == OP_LOG_SOFTMAX || n->op == OP_LOG_SOFTMAX_BWD;
}

/* Layer norm and RMS norm over the last axis D of x, [rows, D]: the kernel's call, its operands,
 * eps, then its results (`out`). */
static void emit_norm(Cg *c, const IrNode *n, int64_t rows, int64_t D) {
    int rms = n->op == OP_RMSNORM || n->op == OP_RMSNORM_BWD || n->op == OP_RMSNORM_BWD_PARAMS;
    char out[64];
    snprintf(out, sizeof out, "v%d", n->id);
    switch (n->op) {
    case OP_LAYERNORM:
        cg_begin(c, "rt_layernorm_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, ", rows, D, n->in[0]->id, n->in[1]->id,
                 n->in[2]->id);
        break;
    case OP_RMSNORM:
        cg_begin(c, "rt_rmsnorm_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ", rows, D, n->in[0]->id, n->in[1]->id);
        break;
    case OP_LAYERNORM_BWD:
    case OP_RMSNORM_BWD: /* dx, and with attr.norm_params the parameter gradients after it */
        cg_begin(c, "rt_norm_bwd(%" PRId64 ", %" PRId64 ", %d, v%d, v%d, v%d, ", rows, D, rms, n->in[0]->id,
                 n->in[1]->id, n->in[2]->id);
        if (n->attr.norm_params) snprintf(out, sizeof out, "v%d, v%d + %" PRId64, n->id, n->id, rows * D);
        else snprintf(out, sizeof out, "v%d, NULL", n->id);
        break;
    default: /* the parameter gradients alone: dy is operand 1 */
        cg_begin(c, "rt_norm_bwd(%" PRId64 ", %" PRId64 ", %d, v%d, NULL, v%d, ", rows, D, rms, n->in[0]->id,
                 n->in[1]->id);
        snprintf(out, sizeof out, "NULL, v%d", n->id);
        break;
    }
    cg_dbl(c->out, n->attr.norm_eps);
    cg_end(c, ", %s);", out);
}

/* Softmax, cross-entropy, accuracy and the norms see their first operand as [rows, last axis];
 * softmax and log-softmax along another axis as [outer, len, inner]. */
static void emit_rows(Cg *c, const IrNode *n) {
    const IrShape *s = &n->in[0]->shape;
    int64_t cols = s->rank ? s->dim[s->rank - 1] : 1, rows = ir_numel(s) / cols, outer = rows, len = cols, inner = 1;
    int a = n->in[0]->id, b = n->n_in > 1 ? n->in[1]->id : -1;
    char valid[64];
    const char *ign = n->attr.has_ignore ? "_ignore" : "";
    if (op_has_axis(n)) { /* softmax, log-softmax: [outer, len, inner] around attr.axis */
        cg_axis_split(s, n->attr.axis, &outer, &inner);
        len = s->dim[n->attr.axis];
    }
    switch (n->op) {
    case OP_SOFTMAX:
    case OP_SOFTMAX_BWD:
        if (inner > 1) {
            cg_begin(c, "rt_softmax_axis_%s(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, ",
                     n->op == OP_SOFTMAX ? "fwd" : "bwd", outer, len, inner, a);
            if (b >= 0) cg_put(c, "v%d, ", b);
            cg_end(c, "v%d);", n->id);
        } else if (n->op == OP_SOFTMAX) { /* rows of the axis's elements, contiguous */
            cg_line(c, "rt_softmax_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d);", outer, len, a, n->id);
        } else {
            cg_line(c, "rt_softmax_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", outer, len, a, b, n->id);
        }
        break;
    case OP_LOG_SOFTMAX:
        cg_line(c, "rt_log_softmax_fwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);", outer, len, inner, a, n->id);
        break;
    case OP_LOG_SOFTMAX_BWD:
        cg_line(c, "rt_log_softmax_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", outer, len, inner, a, b,
                n->id);
        break;
    case OP_LAYERNORM: case OP_LAYERNORM_BWD: case OP_LAYERNORM_BWD_PARAMS:
    case OP_RMSNORM: case OP_RMSNORM_BWD: case OP_RMSNORM_BWD_PARAMS:
        emit_norm(c, n, rows, cols);
        break;
    case OP_XENT:
        cg_begin(c, "rt_xent%s_fwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ", ign, rows, cols, a, b);
        cg_lit(c->out, n->attr.smoothing);
        if (n->attr.has_ignore) cg_put(c, ", %" PRId64, n->attr.ignore_index);
        cg_end(c, ", %s, v%d);", valid_rows(c, s, rows, valid, sizeof valid), n->id);
        break;
    case OP_XENT_BWD: /* the rows' log-sum-exp from the loss (operand 3); in place over the logits */
        cg_begin(c, "rt_xent%s_bwd(%" PRId64 ", %" PRId64 ", v%d, v%d, ", ign, rows, cols, a, b);
        cg_lit(c->out, n->attr.smoothing);
        if (n->attr.has_ignore) cg_put(c, ", %" PRId64, n->attr.ignore_index);
        cg_end(c, ", %s, v%d, v%d, v%d);", valid_rows(c, s, rows, valid, sizeof valid), n->in[3]->id, n->in[2]->id,
               n->id);
        break;
    case OP_ACCURACY: /* of a sequence, the samples' fractions of correct positions */
        if (n->attr.top_k > 1) { /* INT64_MIN: no label is ignored */
            cg_begin(c, "v%d[0] = rt_accuracy_top(%" PRId64 ", %" PRId64 ", v%d, v%d, ", n->id, rows, cols, a, b);
            if (n->attr.has_ignore) cg_put(c, "%" PRId64, n->attr.ignore_index);
            else cg_put(c, "INT64_MIN");
            cg_put(c, ", %d, %s)", n->attr.top_k, valid_rows(c, s, rows, valid, sizeof valid));
        } else if (n->attr.has_ignore)
            cg_begin(c, "v%d[0] = rt_accuracy_ignore(%" PRId64 ", %" PRId64 ", v%d, v%d, %" PRId64 ", %s)", n->id, rows,
                     cols, a, b, n->attr.ignore_index, valid_rows(c, s, rows, valid, sizeof valid));
        else
            cg_begin(c, "v%d[0] = rt_accuracy(%" PRId64 ", %" PRId64 ", v%d, v%d, %s)", n->id, rows, cols, a, b,
                     valid_rows(c, s, rows, valid, sizeof valid));
        /* with ignore_index, the correct positions, which the trainer divides by those it counts */
        if (s->rank > 2 && !n->attr.has_ignore) {
            cg_put(c, " / ");
            cg_lit(c->out, (double)(rows / s->dim[0]));
        }
        cg_end(c, ";");
        break;
    default: ICE("cpu: %s is not a per-row kernel", ir_op_name(n->op));
    }
}

/* Embedding rows and their gradient: the table [N, D], the indices any shape. */
static void emit_index(Cg *c, const IrNode *n) {
    const IrNode *table = n->op == OP_GATHER ? n->in[0] : NULL, *idx = n->in[n->op == OP_GATHER ? 1 : 0];
    const IrShape *ts = table ? &table->shape : &n->shape;
    int64_t count = ir_numel(&idx->shape), per = idx->shape.rank ? count / idx->shape.dim[0] : count;
    if (n->op == OP_GATHER_BWD) {
        cg_line(c, "rt_gather_rows_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", count, ts->dim[0],
                ts->dim[1], idx->id, n->in[1]->id, n->id);
        return;
    }
    if (n->op == OP_ROW_ORDER) {
        cg_line(c, "rt_row_order(%" PRId64 ", v%d, %" PRId64 ", v%d);", count, idx->id, n->attr.ignore_index, n->id);
        return;
    }
    if (n->op == OP_ROW_COMPACT) {
        cg_line(c, "rt_row_compact(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, %" PRId64 ", v%d);", n->shape.dim[0],
                n->shape.dim[1], n->in[0]->id, n->in[1]->id, n->in[2]->id, n->attr.ignore_index, n->id);
        return;
    }
    if (n->op != OP_GATHER) ICE("cpu: %s is not an index kernel", ir_op_name(n->op));
    const IrNode *root = ir_storage_root(table);
    cg_begin(c, "rt_gather_rows(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d, %" PRId64 ", ", count, ts->dim[0],
             ts->dim[1], table->id, idx->id, n->id, per);
    cg_cstr(c->out, arena_printf(c->g->arena, "the rows of %s%s%s (%s:%d)", root->name ? "'" : "",
                                 root->name ? root->name : "a table", root->name ? "'" : "",
                                 n->loc.file ? cg_base_name(n->loc.file) : "?", n->loc.line));
    cg_end(c, ");");
}

/* The end of a batch-norm statistics call: eps, momentum, the running statistics, and whether
 * they train (but for the synchronised kernel, which always does). */
static void bn_running(Cg *c, const IrNode *n) {
    const IrParam *rm = &c->g->params[n->attr.stat_param];
    FILE *o = c->out;
    cg_dbl(o, n->attr.eps);
    cg_put(c, ", ");
    cg_dbl(o, n->attr.momentum);
    cg_put(c, ", ctx->params + %" PRId64, rm->offset);
    if (!sync_bn(c, n)) cg_put(c, ", %d", !c->eval && !n->attr.bn_frozen);
    cg_put(c, "); // running statistics: ");
    cg_comment_text(o, rm->name);
    cg_end(c, "%s", "");
}

/* Batch-norm statistics and the backward sums: per channel, over N and the spatial axes. */
static void emit_bn(Cg *c, const IrNode *n) {
    const IrNode *x = n->in[0];
    int64_t N = x->shape.dim[0], C = x->shape.dim[1], HW = ir_numel(&x->shape) / (N * C);
    int nhwc = ir_layout_eq(x->layout, LAYOUT_NHWC); /* then x (and dy) are N * HW rows of C channels */
    if (sync_bn(c, n)) { /* over every rank's batch */
        cg_begin(c, "rt_%s_sync(ctx, %d, %" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, ",
                 n->op == OP_BN_STATS ? "bn_stats" : "bn_bwd_sums", nhwc, N, C, HW, x->id);
        if (n->op == OP_BN_BWD_SUMS) {
            cg_end(c, "v%d, v%d, v%d);", n->in[1]->id, n->in[2]->id, n->id);
            return;
        }
        cg_put(c, "v%d, ", n->id);
        bn_running(c, n);
        return;
    }
    if (n->op == OP_BN_BWD_SUMS) {
        if (nhwc)
            cg_line(c, "rt_bn_bwd_sums_nhwc(%" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d);", N * HW, C, x->id,
                    n->in[1]->id, n->in[2]->id, n->id);
        else
            cg_line(c, "rt_bn_bwd_sums(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d, v%d);", N, C, HW, x->id,
                    n->in[1]->id, n->in[2]->id, n->id);
        return;
    }
    if (n->op != OP_BN_STATS) ICE("cpu: %s is not a batch-norm reduction", ir_op_name(n->op));
    if (nhwc) cg_begin(c, "rt_bn_stats_nhwc(%" PRId64 ", %" PRId64 ", v%d, v%d, ", N * HW, C, x->id, n->id);
    else cg_begin(c, "rt_bn_stats(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, ", N, C, HW, x->id, n->id);
    bn_running(c, n);
}

/* Copies and reductions along an axis (cg_axis_split's [outer, n, inner]): one runtime call each
 * (rt_views.c). */
static void emit_axes(Cg *c, const IrNode *n) {
    const IrNode *x = n->in[0];
    int axis = n->attr.axis, elem = ir_dtype_size(n->dtype);
    int64_t outer, inner;
    switch (n->op) {
    case OP_PERMUTE: {
        const IrShape *s = &x->shape;
        cg_begin(c, "static const int64_t dims%d[] = {", n->id);
        for (int i = 0; i < s->rank; i++) cg_put(c, "%s%" PRId64, i ? ", " : "", s->dim[i]);
        cg_put(c, "};");
        cg_end(c, "%s", "");
        cg_begin(c, "static const int perm%d[] = {", n->id);
        for (int i = 0; i < s->rank; i++) cg_put(c, "%s%d", i ? ", " : "", n->attr.perm[i]);
        cg_put(c, "};");
        cg_end(c, "%s", "");
        cg_line(c, "rt_permute(%d, dims%d, perm%d, %d, v%d, v%d);", s->rank, n->id, n->id, elem, x->id, n->id);
        return;
    }
    case OP_SLICE:
        cg_axis_split(&x->shape, axis, &outer, &inner);
        cg_line(c, "rt_slice(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, v%d);", outer,
                x->shape.dim[axis], n->shape.dim[axis], inner, n->attr.start, elem, x->id, n->id);
        return;
    case OP_SLICE_BWD:
        cg_axis_split(&n->shape, axis, &outer, &inner);
        cg_line(c, "rt_slice_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, v%d);",
                outer, n->shape.dim[axis], x->shape.dim[axis], inner, n->attr.start, elem, x->id, n->id);
        return;
    case OP_CONCAT:
        cg_axis_split(&n->shape, axis, &outer, &inner);
        cg_line(c, "rt_concat(%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %d, v%d, v%d, v%d);", outer,
                x->shape.dim[axis], n->in[1]->shape.dim[axis], inner, elem, x->id, n->in[1]->id, n->id);
        return;
    case OP_MAX:
        cg_axis_split(&x->shape, axis, &outer, &inner);
        cg_line(c, "rt_max_axis(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d);", outer, x->shape.dim[axis], inner,
                x->id, n->id);
        return;
    case OP_MAX_BWD:
        cg_axis_split(&x->shape, axis, &outer, &inner);
        cg_line(c, "rt_max_axis_bwd(%" PRId64 ", %" PRId64 ", %" PRId64 ", v%d, v%d, v%d);", outer,
                x->shape.dim[axis], inner, x->id, n->in[1]->id, n->id);
        return;
    default: ICE("cpu: %s is not a copy along axes", ir_op_name(n->op));
    }
}

/* Attention and its gradient: the geometry as a constant RtAttn, one call of the fused kernel. */
static void emit_attention(Cg *c, const IrNode *n) {
    CgAttn a;
    cg_attention_dims(n, &a);
    const double dropout = cg_attn_dropout(c, n);
    static const char *const masks[] = {"RT_ATTN_NO_MASK", "RT_ATTN_ADD", "RT_ATTN_KEEP"};
    cg_begin(c, "%sRtAttn attn%d = {.BH = %" PRId64 ", .T = %" PRId64 ", .S = %" PRId64 ", .D = %" PRId64
             ", .E = %" PRId64 ", .scale = ", dropout > 0 ? "const " : "static const ", n->id, a.BH, a.T, a.S, a.D,
             a.E);
    cg_lit(c->out, n->attr.attn_scale);
    cg_end(c, ", .causal = %d,", n->attr.causal);
    c->depth++; /* the initializer's second line */
    cg_begin(c, ".mask = %s, .n_lead = %d, .lead = {", masks[a.mask], a.n_lead);
    for (int i = 0; i < a.n_lead; i++) cg_put(c, "%s%" PRId64, i ? ", " : "", a.lead[i]);
    cg_put(c, "}, .mask_lead = {");
    for (int i = 0; i < a.n_lead; i++) cg_put(c, "%s%" PRId64, i ? ", " : "", a.mask_lead[i]);
    cg_put(c, "}, .mask_t = %" PRId64 ", .mask_s = %" PRId64, a.mask_t, a.mask_s);
    if (a.group > 1) cg_put(c, ", .group = %" PRId64, a.group); /* grouped-query attention */
    if (dropout > 0) { /* attention dropout: the step's seed, so not static */
        cg_end(c, ",");
        cg_begin(c, ".dropout = ");
        cg_dbl(c->out, dropout);
        cg_put(c, ", .seed_id = %d, .seed = ctx->seed", n->attr.seed_id);
    }
    if (a.tokens) { /* heads read from the tokens: rows of the bases, [B, T, row] */
        static const char *const view[] = {"q", "k", "v", "o"};
        cg_end(c, ",");
        for (int i = 0; i < 4; i++) {
            int64_t batch = (i == 1 || i == 2 ? a.S : a.T) * a.row[i];
            if (i == 0) cg_begin(c, ".q = {.batch = %" PRId64 ", .row = %" PRId64 "}", batch, a.row[i]);
            else cg_put(c, ", .%s = {.batch = %" PRId64 ", .row = %" PRId64 "}", view[i], batch, a.row[i]);
        }
    }
    cg_end(c, "};");
    c->depth--;
    char mask[16] = "NULL", in[3][48];
    if (a.mask_node) snprintf(mask, sizeof mask, "v%d", a.mask_node->id);
    for (int i = 0; i < 3; i++) cg_attention_operand(n, &a, i, in[i], sizeof in[i]); /* where their first columns are */
    if (n->op == OP_ATTENTION || n->op == OP_ATTENTION_MASKED) {
        cg_line(c, "rt_attention_fwd(&attn%d, %s, %s, %s, %s, v%d, ctx->scratch, ctx->scratch_per_thread);", n->id,
                in[0], in[1], in[2], mask, n->id);
        return;
    }
    /* dq, dk, dv packed (autodiff): a base's columns that no operand has are 0 in its gradient */
    for (int i = 0; i < 3; i++)
        if (cg_attention_zeroed(n, &a, i))
            cg_line(c, "memset(v%d + %" PRId64 ", 0, %" PRId64 " * sizeof(float)); // columns no head has", n->id,
                    ir_attention_grad_at(n, i), ir_numel(&n->in[i]->shape));
    char grad[3][48];
    for (int i = 0; i < 3; i++) cg_attention_grad(n, &a, i, grad[i], sizeof grad[i]);
    cg_line(c, "rt_attention_bwd(&attn%d, %s, %s, %s, %s, v%d, v%d, %s, %s, %s, ctx->scratch, ctx->scratch_per_thread);"
               " // dq, dk, dv",
            n->id, in[0], in[1], in[2], mask, n->in[3]->id, n->in[4]->id, grad[0], grad[1], grad[2]);
}

static void emit_lib(Cg *c, const IrNode *n) {
    cg_check_lib_operands(n, "cpu");
    switch (ir_op_lib(n->op)) {
    case LIB_MATMUL: emit_matmul(c, n); break;
    case LIB_CONV: emit_conv(c, n); break;
    case LIB_POOL: emit_pool(c, n); break;
    case LIB_ROWS: emit_rows(c, n); break;
    case LIB_BN: emit_bn(c, n); break;
    case LIB_AXES: emit_axes(c, n); break;
    case LIB_ATTN: emit_attention(c, n); break;
    case LIB_INDEX: emit_index(c, n); break;
    case LIB_NONE: ICE("cpu: no kernel for %s", ir_op_name(n->op));
    }
}

static void emit_node(Cg *c, const IrNode *n) {
    IrOpKind kind = ir_op_kind(n->op);
    if (n->storage == ST_INLINE) return; /* written into its users as a literal */
    if (n->storage == ST_FOLDED) { /* no copy: its readers read its operands */
        cg_comment(c, n);
        cg_line(c, "// (folded: the loops that read %%%d read its operands in place)", n->id);
        return;
    }
    if (kind == OPK_SOURCE || kind == OPK_VIEW) {
        if (!c->read[n->id]) return;
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
    cg_blank(c);
    cg_line(c, "ctx->loss = v%d[0];", g->loss->id);
    const IrNode *metric[IR_MAX_METRICS];
    const int n_metrics = ir_metrics(g, metric);
    if (!n_metrics) cg_line(c, "ctx->correct[0] = 0;");
    for (int i = 0; i < n_metrics; i++) /* several: f32[n] of their counts */
        cg_line(c, "ctx->correct[%d] = v%d[%d];", i, g->correct->id, i);
}

/* --distributed: the buckets whose gradients are final after schedule position `position`
 * (g->n: the end of the backward pass) start their sums over the ranks. */
static void emit_grads_ready(Cg *c, int position) {
    const IrGraph *g = c->g;
    for (int k = 0; g->distributed && k < g->n_buckets; k++)
        if (g->buckets[k].ready == position)
            cg_line(c, "rt_grads_ready(ctx, %d); // its gradients are final: start their sum over the ranks", k);
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
        if (!header++) {
            cg_blank(c);
            cg_line(c, "// ---- gradients not computed in place");
        }
        cg_begin(c, "// d ");
        cg_comment_text(o, p->name);
        cg_end(c, "%s", "");
        if (!p->grad) {
            cg_line(c, "memset(ctx->grads + %" PRId64 ", 0, %" PRId64 " * sizeof(float));", p->grad_offset, n);
        } else if (p->grad->storage == ST_INLINE) {
            cg_begin(c, "for (int64_t i = 0; i < %" PRId64 "; i++) ctx->grads[%" PRId64 " + i] = ", n, p->grad_offset);
            cg_lit(o, cg_const_value(p->grad));
            cg_end(c, ";");
        } else {
            cg_line(c, "memcpy(ctx->grads + %" PRId64 ", v%d, %" PRId64 " * sizeof(float));", p->grad_offset,
                    p->grad->id, n);
        }
    }
}

/* ---- the update in the backward pass
 *
 * An element-wise optimizer's update of a parameter needs nothing but that parameter's floats,
 * gradient and state, so it may run as soon as the backward pass is done with the parameter
 * (param_done_at: its gradient final, no later node reading it). There the gradient was just
 * written and is still in cache, where optimizer_step, after the whole pass, reads it back from
 * memory: on the MLP the update is a sixth of the step. The arithmetic is rt_recipe.h's, element
 * by element, so the parameters come out the same bit for bit whichever function updates them.
 * Not with clip_grad_norm (the scale needs every gradient first), a layer-wise optimizer (whole
 * tensors' norms), or a distributed trainer (the gradients are summed over the ranks first). */

/* Comment lines naming the parameters with at[i] == when (or, when is -1, at[i] >= 0), after
 * `head` and wrapped before 100 columns. */
static void emit_param_names(Cg *c, const char *head, const int *at, int when) {
    size_t col = strlen(head) + 3;
    cg_begin(c, "// %s", head);
    for (int i = 0, first = 1; i < c->g->n_params; i++) {
        if (when >= 0 ? at[i] != when : at[i] < 0) continue;
        const char *name = c->g->params[i].name;
        if (!first && col + strlen(name) + 2 > 100 - 4 * (size_t)c->depth) {
            cg_end(c, ",");
            cg_begin(c, "//   ");
            col = 5;
        } else if (!first) {
            cg_put(c, ", ");
            col += 2;
        }
        cg_comment_text(c->out, name);
        col += strlen(name), first = 0;
    }
    cg_end(c, "%s", "");
}

/* The start of the backward pass: whether this step updates in it, and the step's constants. */
static void emit_in_backward_head(Cg *c, const int *at) {
    const IrGraph *g = c->g;
    emit_param_names(c, "updated in this pass, each as soon as the pass is done with it (its gradient in cache): ",
                     at, -1);
    cg_line(c, "// (optimizer_step updates the others); when the trainer asks (ctx->update_in_backward) and the");
    cg_line(c, "// loss is finite, else the trainer stops with the parameters as they were");
    cg_line(c, "ctx->update_in_backward = ctx->update_in_backward && isfinite(v%d[0]);", g->loss->id);
    cg_emit_optim_step(c, &g->train, "ctx->lr", "ctx->step", "*ctx->hyper");
    if (g->n_decay_floats < g->n_grad_floats) cg_emit_optim_no_decay(c, &g->train, "ctx->lr", "ctx->step");
}

/* After schedule position i: the update of the parameters the pass is done with there, each
 * thread its share of each. */
static void emit_in_backward_at(Cg *c, const int *at, int i) {
    const IrGraph *g = c->g;
    int any = 0;
    for (int k = 0; k < g->n_params; k++) any |= at[k] == i;
    if (!any) return;
    emit_param_names(c, "the pass is done with, so the update now: ", at, i);
    cg_line(c, "// each thread the rows it wrote the gradient of, or read in a product (emit_thread_share)");
    cg_open(c, "if (ctx->update_in_backward) {");
    cg_line(c, "#pragma omp parallel");
    cg_open(c, "{");
    cg_line(c, "const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();");
    for (int k = 0; k < g->n_params; k++) {
        if (at[k] != i) continue;
        const IrParam *p = &g->params[k];
        int64_t rows = p->node->shape.rank ? p->node->shape.dim[0] : 1;
        int64_t row = ir_numel(&p->node->shape) / rows;
        const char *nd = p->offset < g->n_decay_floats ? "" : "_nd";
        cg_line(c, "%s(h%s, s%s, ctx->params, ctx->grads, ctx->optstate, %" PRId64 ", %" PRId64 " + %" PRId64
                   " * th / nt * %" PRId64 ", %" PRId64 " + %" PRId64 " * (th + 1) / nt * %" PRId64 ");",
                rt_optimizer(g->train.optim)->range_fn, nd, nd, g->n_grad_floats, p->offset, rows, row, p->offset,
                rows, row);
    }
    cg_close(c, "}");
    cg_close(c, "}");
}

/* ---- netc --profile
 *
 * Each piece of forward_backward that writes code (a node, a fused group's loop, a bucket's
 * hand-over, the updates made in the backward pass) is followed by rt_prof_mark(site), and the
 * sites, what each piece computes and its .net line, are listed beside the model
 * (emit_prof_sites) for the trainer's report (runtime/rt_prof.c). A piece is written into a
 * buffer first, to see whether it wrote anything. Without --profile nothing of this is emitted. */
typedef struct CgProf {
    char **what;
    const IrNode **from; /* the node whose expression is the site's line, or NULL */
    int n, cap;
    FILE *out;           /* forward_backward's file while a piece goes into the buffer */
    char *text;
    size_t size;
} CgProf;

static void prof_open(Cg *c) {
    if (!c->prof) return;
    c->prof->out = c->out;
    if (!(c->out = open_memstream(&c->prof->text, &c->prof->size))) ICE("cpu: out of memory");
}

/* The piece since prof_open, and its mark if it wrote code. */
static void prof_close(Cg *c, const char *what, const IrNode *from) {
    CgProf *p = c->prof;
    if (!p) return;
    fclose(c->out);
    c->out = p->out;
    fwrite(p->text, 1, p->size, c->out);
    if (p->size) {
        if (p->n == p->cap) {
            p->cap = p->cap ? 2 * p->cap : 256;
            p->what = xrealloc(p->what, (size_t)p->cap * sizeof *p->what);
            p->from = xrealloc(p->from, (size_t)p->cap * sizeof *p->from);
        }
        p->what[p->n] = xstrdup(what), p->from[p->n] = from;
        cg_line(c, "rt_prof_mark(%d);", p->n++);
    }
    free(p->text);
    p->text = NULL;
}

/* What node head's piece computes: its operator, or its fused group's operators; in the
 * backward pass ", backward" where the name does not say so (a product's gradients are
 * matmuls too). */
static void prof_what(const Cg *c, const IrNode *head, int backward, char *buf, size_t size) {
    const IrNode *n;
    size_t len = 0;
    if (!head->group) len = (size_t)snprintf(buf, size, "%s", ir_op_name(head->op));
    else {
        len = (size_t)snprintf(buf, size, "fused");
        FOR_MEMBERS(n, head) {
            if (len + 1 < size)
                len += (size_t)snprintf(buf + len, size - len, "%s%s", len == 5 ? " " : "+", ir_op_name(n->op));
        }
    }
    if (backward && !strstr(buf, "_bwd") && !strstr(buf, "_grad") && len + 1 < size)
        snprintf(buf + len, size - len, ", backward");
}

static void emit_prof_sites(Cg *c) {
    CgProf *p = c->prof;
    cg_line(c, "// netc --profile: the pieces of forward_backward that rt_prof_mark(i) ends");
    cg_open(c, "static const RtProfSite prof_sites[%d] = {", p->n > 0 ? p->n : 1);
    for (int i = 0; i < p->n; i++) {
        const IrNode *n = p->from[i];
        cg_begin(c, "{");
        cg_cstr(c->out, p->what[i]);
        cg_put(c, ", ");
        cg_cstr(c->out, n && n->loc.file ? cg_base_name(n->loc.file) : "");
        cg_end(c, ", %d, %.17g},", n && n->loc.file ? n->loc.line : 0, n && !n->group ? 2.0 * (double)ir_node_macs(n) : 0.0);
        free(p->what[i]);
    }
    cg_close(c, "};");
    cg_blank(c);
    free(p->what), free(p->from);
}

static void emit_forward_backward(Cg *c) {
    const IrGraph *g = c->g;
    int *at = in_backward_positions(g, IN_BACKWARD_MIN_FLOATS);
    char what[96] = "";
    c->in_backward = at;
    cg_mark_reads(c, g->n, 1);
    cg_line(c, "// One training step's computation: the forward pass, loss and metrics, then the");
    cg_line(c, "// backward pass, which leaves every trainable parameter's gradient in ctx->grads.");
    cg_open(c, "static void forward_backward(RtCtx *ctx) {");
    if (c->prof) cg_line(c, "rt_prof_start();");
    for (int i = 0; i < g->n; i++) {
        if (i == g->n_fwd) {
            cg_blank(c);
            cg_line(c, "// ---- backward");
            if (at) emit_in_backward_head(c, at);
        }
        IrOpKind kind = ir_op_kind(g->nodes[i]->op);
        if (kind == OPK_SOURCE || kind == OPK_VIEW || g->nodes[i]->storage == ST_FOLDED) { /* no piece of their own */
            emit_node(c, g->nodes[i]);
        } else {
            prof_open(c);
            emit_node(c, g->nodes[i]);
            if (c->prof) prof_what(c, g->nodes[i], i >= g->n_fwd, what, sizeof what);
            prof_close(c, what, g->nodes[i]);
        }
        prof_open(c);
        emit_grads_ready(c, i);
        prof_close(c, "the ranks' sum of a bucket", NULL);
        prof_open(c);
        if (at) emit_in_backward_at(c, at, i);
        prof_close(c, "optimizer update in the backward pass", NULL);
    }
    c->in_backward = NULL;
    free(at);
    prof_open(c);
    emit_grad_copies(c);
    emit_grads_ready(c, g->n);
    prof_close(c, "gradient copies and the ranks' sums", NULL);
    prof_open(c);
    emit_outputs(c);
    prof_close(c, "the loss and metrics out", NULL);
    cg_close(c, "}");
    cg_blank(c);
}

/* --predict: the model's output, as float32 in logical (row-major) order, when ctx->output asks
 * for it. */
static void emit_output_copy(Cg *c) {
    if (!cg_has_output(c->g)) return;
    char src[16];
    snprintf(src, sizeof src, "v%d", c->g->output->id);
    cg_blank(c);
    cg_open(c, "if (ctx->output) { // the model's output, for --predict");
    cg_emit_output_convert(c, "ctx->output", src);
    cg_close(c, "}");
}

static void emit_eval(Cg *c) {
    const IrGraph *g = c->g;
    cg_mark_reads(c, g->n_fwd, 0);
    c->eval = 1;
    find_folds(c);
    cg_line(c, "// The forward pass in evaluation mode (dropout off), with the same buffers as the");
    cg_line(c, "// training step: loss and metrics, and the model's output when ctx->output is set.");
    cg_open(c, "static void eval_step(RtCtx *ctx) {");
    for (int i = 0; i < g->n_fwd; i++) emit_node(c, g->nodes[i]);
    emit_outputs(c);
    emit_output_copy(c);
    cg_close(c, "}");
    cg_blank(c);
    c->eval = 0;
}

/* ---- optimizer */

/* The start of optimizer_step: the step's constants (and no_decay's, when `no_decay`), then
 * with clip_grad_norm the gradients' 2-norm (from every rank's slices when sharded) and the
 * scale the gradients are multiplied by in place, as torch's clip_grad_norm_ does. */
static void emit_step_head(Cg *c, int no_decay) {
    const IrTrain *t = &c->g->train;
    cg_emit_optim_step(c, t, "ctx->lr", "ctx->step", "*ctx->hyper");
    if (no_decay) cg_emit_optim_no_decay(c, t, "ctx->lr", "ctx->step");
    if (t->clip_grad_norm <= 0) return;
    if (c->g->shard_optimizer)
        cg_line(c, "ctx->grad_norm = rt_shard_grad_norm(ctx); // of the whole gradient, over the ranks");
    else cg_line(c, "ctx->grad_norm = rt_grad_norm(ctx->grads, %" PRId64 ");", c->g->n_grad_floats);
    cg_emit_clip_scale(c, t, "ctx->grad_norm");
}

/* --shard-optimizer: the update of this rank's slices of the flat buffer (RtShard in netrt.h):
 * slice k is params[offset + j] from shard->grads[at + j] with its state at optstate + at. */
static void emit_sharded_optimizer(Cg *c) {
    const IrTrain *t = &c->g->train;
    int64_t nd = c->g->n_decay_floats;
    const char *update = rt_optimizer(t->optim)->update_fn, *clip = t->clip_grad_norm > 0 ? "g[j] *= clip; " : "";
    cg_line(c, "// The update of this rank's slices of the trainable parameters (netc --shard-optimizer, ZeRO-1):");
    cg_line(c, "// each rank updates its own and keeps their optimizer state, and the trainer then gathers the");
    cg_line(c, "// parameters; PyTorch's formulas, the learning rate, step and hyperparameters from ctx.");
    cg_open(c, "static void optimizer_step(RtCtx *ctx) {");
    emit_step_head(c, 1);
    cg_line(c, "const RtShard *shard = ctx->shard;");
    cg_open(c, "for (int k = 0; k < shard->n_slices; k++) {");
    cg_line(c, "const RtSlice r = shard->slices[k];");
    cg_line(c, "float *p = ctx->params + r.offset, *state = ctx->optstate + r.at;");
    cg_line(c, "%sfloat *g = shard->grads + r.at;", *clip ? "" : "const ");
    cg_line(c, "// floats [0, decay) of the slice lie before the parameters of no_decay (%" PRId64 " floats)", nd);
    cg_line(c, "const int64_t decay = r.offset + r.count <= %" PRId64 " ? r.count : r.offset < %" PRId64 " ? %" PRId64
            " - r.offset : 0;", nd, nd, nd);
    cg_line(c, "#pragma omp parallel for simd");
    cg_line(c, "for (int64_t j = 0; j < decay; j++) %s%s%s(h, s, p, g, state, shard->floats, j);%s", *clip ? "{ " : "",
            clip, update, *clip ? " }" : "");
    cg_line(c, "#pragma omp parallel for simd");
    cg_line(c, "for (int64_t j = decay; j < r.count; j++) %s%s%s(h_nd, s_nd, p, g, state, shard->floats, j);%s",
            *clip ? "{ " : "", clip, update, *clip ? " }" : "");
    cg_close(c, "}");
    cg_close(c, "}");
    cg_blank(c);
}

/* A layer-wise optimizer (LAMB, LARS): the update of ctx->pieces (RtPieces in netrt.h), the floats
 * this rank updates cut inside tensors, in three passes: the moments and each piece's sums of
 * squares, the tensors' norms (rt_piece_norms), and the update scaled per tensor. */
static void emit_layerwise_optimizer(Cg *c) {
    const IrTrain *t = &c->g->train;
    const RtOptimizer *o = rt_optimizer(t->optim);
    int64_t n = c->g->n_grad_floats, nd = c->g->n_decay_floats;
    int shard = c->g->shard_optimizer, clip = t->clip_grad_norm > 0;
    cg_line(c, "// One layer-wise update of the trainable parameters%s, each tensor's scaled by its",
            shard ? " of this rank's slices (netc --shard-optimizer)" : "");
    cg_line(c, "// trust ratio (%s in rt_recipe.h); the learning rate, step and hyperparameters from ctx.", o->name);
    cg_open(c, "static void optimizer_step(RtCtx *ctx) {");
    emit_step_head(c, nd < n);
    cg_line(c, "RtPieces *pc = ctx->pieces;");
    cg_line(c, "float *params = ctx->params, *grads = %s, *optstate = ctx->optstate;",
            shard ? "ctx->shard->grads" : "ctx->grads");
    if (shard) cg_line(c, "const int64_t floats = ctx->shard->floats; // per slot of the state");
    else cg_line(c, "const int64_t floats = %" PRId64 "; // per slot of the state", n);
    const char *hs = nd < n ? "hk, sk" : "h, s";
    for (int pass = 0; pass < 2; pass++) {
        if (pass) cg_line(c, "rt_piece_norms(ctx); // per tensor, the 2-norms of p and u%s", shard ? ", over the ranks" : "");
        cg_line(c, pass ? "// each tensor's factor, and the update p -= factor * u"
                        : "// the moments, and per piece the squares of the parameters p and the direction u");
        cg_line(c, "#pragma omp parallel for schedule(static)");
        cg_open(c, "for (int k = 0; k < pc->n; k++) {");
        cg_line(c, "const RtPiece r = pc->piece[k];");
        if (nd < n) {
            cg_line(c, "const int decay = r.offset < %" PRId64 "; // the no_decay tensors lie last", nd);
            cg_line(c, "const RtOptimParams hk = decay ? h : h_nd;");
            cg_line(c, "const RtOptimStep sk = decay ? s : s_nd;");
        }
        cg_line(c, pass ? "float *p = params + r.offset, *state = optstate + r.at;"
                        : "const float *p = params + r.offset; float *state = optstate + r.at;");
        if (pass) {
            cg_line(c, "const double *norm = pc->norms + 2 * r.tensor;");
            cg_line(c, "const float factor = %s(%s, %s, norm[0], norm[1]);", o->ratio_fn, hs, nd < n ? "decay" : "1");
            cg_line(c, "const float *u = grads + r.at;");
            cg_line(c, "#pragma omp simd");
            cg_line(c, "for (int64_t j = 0; j < r.count; j++) %s(%s, factor, p, u, state, floats, j);", o->apply_kept_fn,
                    hs);
        } else { /* u over the gradient, which nothing reads after this pass, in a loop that
                  * vectorises; then the sums in double, in order */
            cg_line(c, "float *g = grads + r.at; // u, once computed");
            cg_line(c, "#pragma omp simd");
            cg_line(c, "for (int64_t j = 0; j < r.count; j++) %sg[j] = %s(%s, p, g, state, floats, j);%s",
                    clip ? "{ g[j] *= clip; " : "", o->update_fn, hs, clip ? " }" : "");
            cg_line(c, "double pp = 0, uu = 0;");
            cg_line(c, "for (int64_t j = 0; j < r.count; j++) pp += (double)p[j] * p[j], uu += (double)g[j] * g[j];");
            cg_line(c, "pc->sums[2 * k] = pp, pc->sums[2 * k + 1] = uu;");
        }
        cg_close(c, "}");
    }
    cg_close(c, "}");
    cg_blank(c);
}

/* When forward_backward has updated the parameters of `at`: the others, as runs of floats
 * [from, to) of one decay group, each thread its share of each run. */
static void emit_rest_of_update(Cg *c, const int *at, const char *range) {
    const IrGraph *g = c->g;
    int64_t (*runs)[3] = xmalloc(((size_t)g->n_params + 1) * sizeof *runs), floats = 0;
    int n = 0;
    for (int64_t off = 0; off < g->n_grad_floats;) { /* the trainable parameters tile [0, n_grad_floats) */
        int k = 0;
        while (k < g->n_params && !(g->params[k].grad_offset == off && g->params[k].trainable)) k++;
        if (k == g->n_params) ICE("cpu: no trainable parameter at float %" PRId64, off);
        int64_t len = ir_numel(&g->params[k].node->shape), decay = off < g->n_decay_floats;
        if (at[k] < 0) {
            if (n && runs[n - 1][1] == off && runs[n - 1][2] == decay) runs[n - 1][1] += len;
            else runs[n][0] = off, runs[n][1] = off + len, runs[n][2] = decay, n++;
            floats += len;
        }
        off += len;
    }
    cg_open(c, "if (ctx->update_in_backward) {");
    emit_param_names(c, "forward_backward has updated ", at, -1);
    if (n) {
        cg_line(c, "// the others: runs of floats [from, to), decayed or not (no_decay)");
        cg_open(c, "static const int64_t runs[%d][3] = {", n);
        for (int k = 0; k < n; k++)
            cg_line(c, "{%" PRId64 ", %" PRId64 ", %" PRId64 "},", runs[k][0], runs[k][1], runs[k][2]);
        cg_close(c, "};");
        cg_line(c, "#pragma omp parallel%s", floats >= PAR_MIN ? "" : " if (0)");
        cg_open(c, "{");
        cg_line(c, "const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();");
        cg_open(c, "for (int k = 0; k < %d; k++) {", n);
        cg_line(c, "const int64_t from = runs[k][0], len = runs[k][1] - from;");
        if (g->n_decay_floats < g->n_grad_floats)
            cg_line(c, "%s(runs[k][2] ? h : h_nd, runs[k][2] ? s : s_nd, p, g, state, %" PRId64
                       ", from + len * th / nt, from + len * (th + 1) / nt);", range, g->n_grad_floats);
        else
            cg_line(c, "%s(h, s, p, g, state, %" PRId64 ", from + len * th / nt, from + len * (th + 1) / nt);", range,
                    g->n_grad_floats);
        cg_close(c, "}");
        cg_close(c, "}");
    }
    cg_line(c, "return;");
    cg_close(c, "}");
    free(runs);
}

static void emit_optimizer(Cg *c) {
    const IrTrain *t = &c->g->train;
    int64_t n = c->g->n_grad_floats, nd = c->g->n_decay_floats;
    if (rt_optimizer(t->optim)->apply_fn) {
        emit_layerwise_optimizer(c);
        return;
    }
    if (c->g->shard_optimizer) {
        emit_sharded_optimizer(c);
        return;
    }
    cg_line(c, "// One fused update of every trainable parameter, params[i] from grads[i], with");
    cg_line(c, "// PyTorch's formulas; the learning rate (schedule applied), step and hyperparameters come from ctx.");
    cg_open(c, "static void optimizer_step(RtCtx *ctx) {");
    emit_step_head(c, nd < n);
    const char *clip = t->clip_grad_norm > 0 ? "g[i] *= clip; " : "";
    cg_line(c, "float *p = ctx->params, *state = ctx->optstate;");
    cg_line(c, "%sfloat *g = ctx->grads;", t->clip_grad_norm > 0 ? "" : "const ");
    const char *range = rt_optimizer(t->optim)->range_fn;
    int *at = in_backward_positions(c->g, IN_BACKWARD_MIN_FLOATS);
    if (at) emit_rest_of_update(c, at, range);
    free(at);
    if (range && !*clip) { /* each thread its share of the decay and the no_decay floats */
        cg_line(c, "#pragma omp parallel%s", n >= PAR_MIN ? "" : " if (0)");
        cg_open(c, "{");
        cg_line(c, "const int64_t nt = omp_get_num_threads(), th = omp_get_thread_num();");
        cg_line(c, "%s(h, s, p, g, state, %" PRId64 ", %" PRId64 " * th / nt, %" PRId64 " * (th + 1) / nt);", range, n,
                nd, nd);
        if (nd < n)
            cg_line(c, "%s(h_nd, s_nd, p, g, state, %" PRId64 ", %" PRId64 " + %" PRId64 " * th / nt, %" PRId64
                       " + %" PRId64 " * (th + 1) / nt);", range, n, nd, n - nd, nd, n - nd);
        cg_close(c, "}");
        cg_close(c, "}");
        cg_blank(c);
        return;
    }
    flat_pragma(c, nd);
    cg_line(c, "for (int64_t i = 0; i < %" PRId64 "; i++) %s%s%s(h, s, p, g, state, %" PRId64 ", i);%s", nd,
            *clip ? "{ " : "", clip, rt_optimizer(t->optim)->update_fn, n, *clip ? " }" : "");
    if (nd < n) {
        flat_pragma(c, n - nd);
        cg_line(c, "for (int64_t i = %" PRId64 "; i < %" PRId64 "; i++) %s%s%s(h_nd, s_nd, p, g, state, %" PRId64
                ", i);%s", nd, n, *clip ? "{ " : "", clip, rt_optimizer(t->optim)->update_fn, n, *clip ? " }" : "");
    }
    cg_close(c, "}");
    cg_blank(c);
}

static void emit_model(Cg *c) {
    const IrGraph *g = c->g;
    cg_emit_buckets(c);
    if (c->prof) emit_prof_sites(c);
    cg_open(c, "static const RtModel model = {");
    cg_emit_model_head(c);
    cg_line(c, ".arena_bytes = %" PRId64 ",", g->arena_bytes > 64 ? g->arena_bytes : 64);
    cg_line(c, ".scratch_per_thread = %" PRId64 ",", g->scratch_per_thread);
    cg_emit_model_recipe(c);
    cg_line(c, ".forward_backward = forward_backward,");
    cg_line(c, ".optimizer_step = optimizer_step,");
    cg_line(c, ".eval_step = eval_step,");
    if (c->prof) cg_line(c, ".n_prof_sites = %d, .prof_sites = prof_sites,", c->prof->n);
    cg_close(c, "};");
    cg_blank(c);
}

static void emit_prologue(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    cg_begin(c, "// ");
    cg_comment_text(o, g->model_name);
    cg_put(c, ".c - the trainer for model '");
    cg_comment_text(o, g->model_name);
    cg_put(c, "', generated by netc from ");
    cg_comment_text(o, g->source_path);
    cg_end(c, ".");
    cg_line(c, "// Do not edit: change the .net file and run netc again.");
    cg_line(c, "//");
    cg_line(c, "// Every tensor of the training step has a home fixed at compile time:");
    cg_line(c, "//   ctx->params    every parameter, one flat float array (%" PRId64 " floats, trainable first)",
            g->n_param_floats);
    cg_line(c, "//   ctx->grads     their gradients; grads[i] belongs to params[i] (%" PRId64 " floats)",
            g->n_grad_floats);
    cg_line(c, "//   ctx->optstate  optimizer state, %d slot(s) of %" PRId64 " floats", cg_state_slots(&g->train),
            g->n_grad_floats);
    cg_line(c, "//   ctx->inputs    the batch (%" PRId64 " samples), one buffer per model input", g->batch);
    cg_line(c, "//   ctx->arena     every other value, at an offset from the memory plan: %" PRId64 " bytes",
            g->arena_bytes);
    cg_line(c, "//                  (%" PRId64 " without reuse of dead values' bytes)", g->unplanned_bytes);
    cg_line(c, "// A training step is forward_backward() then optimizer_step(); eval_step() is the forward");
    cg_line(c, "// pass alone. libnetrt's rt_main() owns the rest: command line, data loading, parameter");
    cg_line(c, "// initialisation, the training loop, logging and weight files.");
    cg_line(c, "//");
    cg_begin(c, "// Build: cc -std=gnu11 -O2 -fopenmp ");
    cg_comment_text(o, g->model_name);
    cg_end(c, ".c -I<netc>/runtime <build>/runtime/libnetrt.a");
    cg_line(c, "//            -ldnnl -lopenblas -lcjson -lz -lpthread -lm");
    cg_blank(c);
    cg_line(c, "#include <math.h>");
    cg_line(c, "#include <omp.h>");
    cg_line(c, "#include <stdint.h>");
    cg_line(c, "#include <string.h>");
    cg_blank(c);
    cg_line(c, "#include \"netrt.h\"");
    cg_blank(c);
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
    if (g->profile) e->c.prof = xcalloc(1, sizeof *e->c.prof);
    if (!(e->optimizer = open_memstream(&e->text, &e->size))) ICE("cpu: out of memory");
    emit_prologue(&e->c);
    cg_line(&e->c, "// ---- model description");
    cg_blank(&e->c);
    cg_emit_description(&e->c);
    return e;
}

static void cpu_step(CgEmit *e) {
    cg_line(&e->c, "// ---- forward and backward");
    cg_blank(&e->c);
    emit_forward_backward(&e->c);
}

static void cpu_optimizer(CgEmit *e) {
    FILE *trainer = e->c.out;
    e->c.out = e->optimizer;
    emit_optimizer(&e->c);
    e->c.out = trainer;
}

static void cpu_eval(CgEmit *e) {
    cg_line(&e->c, "// ---- evaluation");
    cg_blank(&e->c);
    emit_eval(&e->c);
}

static int cpu_model(CgEmit *e) {
    FILE *out = e->c.out;
    fclose(e->optimizer);
    cg_line(&e->c, "// ---- optimizer");
    cg_blank(&e->c);
    fputs(e->text, out); /* optimizer_step, printed by cpu_optimizer */
    cg_line(&e->c, "// ---- entry point");
    cg_blank(&e->c);
    emit_model(&e->c);
    cg_line(&e->c, "int main(int argc, char **argv) { return rt_main(argc, argv, &model); }");
    free(e->text);
    free(e->c.read);
    free(e->c.decl);
    free(e->c.done);
    free((void *)e->c.fold);
    free(e->c.prof);
    free(e);
    return ferror(out) ? 1 : 0;
}

/* Per-thread scratch of the im2col convolutions (rt_conv2d_*): one sample's unfolded input
 * and a weight-gradient accumulator. Channels-last convolutions (rt_conv2d_nhwc_*: oneDNN, or
 * the runtime's Winograd and im2col kernels) bring their own. */
static int64_t conv_scratch(const IrNode *n) {
    if (n->op != OP_CONV2D && n->op != OP_CONV2D_BWD_DATA && n->op != OP_CONV2D_BWD_FILTER) return 0;
    if (ir_operand_nhwc(n, 0)) return 0;
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

/* Per-thread scratch of the library kernels: the im2col convolutions' and attention's. */
static int64_t node_scratch(const IrNode *n) {
    if (ir_op_lib(n->op) != LIB_ATTN) return conv_scratch(n);
    CgAttn a;
    cg_attention_dims(n, &a);
    RtAttn r = {.BH = a.BH, .T = a.T, .S = a.S, .D = a.D, .E = a.E};
    return rt_attention_scratch(&r);
}

/* The kernels that may write their result over an operand (mp_plan's in_place): the gradient
 * of cross-entropy over its logits, which nothing reads after it, so that the classifier's
 * [rows, classes] gradient takes no buffer of its own, and that gradient's labelled rows moved
 * to its top (row_compact). */
static int in_place(const IrNode *n) {
    return n->op == OP_XENT_BWD || n->op == OP_ROW_COMPACT ? 0 : -1;
}

const CgBackend cg_cpu = {
    .name = "cpu",
    .description = "portable C with OpenBLAS and OpenMP, linked with libnetrt",
    .precisions = 1u << CG_FP32,
    .precision_note = "the CPU backend computes in float32",
    .fuse_reductions = 1,
    .compacts_rows = 1,
    .krsc_filters = 0, /* oneDNN reorders the weights itself */
    .node_scratch = node_scratch,
    .in_place = in_place,
    .emit_begin = cpu_begin,
    .emit_step = cpu_step,
    .emit_optimizer = cpu_optimizer,
    .emit_eval = cpu_eval,
    .emit_model = cpu_model,
};
