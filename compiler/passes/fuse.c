/* fuse.c - element-wise fusion and the fusion report.
 *
 * Requires:    a differentiated graph in schedule order; no memory plan yet.
 * Guarantees:  every element-wise node of a group has `group` set (groups numbered from 1 in
 *              schedule order); `internal` marks members whose value no node outside the group
 *              reads and that are neither the loss, the accuracy, nor a gradient the optimizer
 *              reads. The schedule, shapes and operands are unchanged, so the graph computes
 *              the same values; the memory plan gives internal members no storage and the
 *              backends evaluate a group as one loop at its first member's position.
 * Invalidates: nothing (run before mp_plan).
 *
 * Why runs of consecutive nodes: every operand of a member is then either a member or defined
 * before the run, and every reader outside the group comes after it, so evaluating the whole
 * group at its first position is always legal, with no scheduling analysis. Sema and autodiff
 * emit each layer's element-wise tail (bias, batch norm, residual add, activation; and their
 * gradients) consecutively, which is exactly what the rule catches.
 */
#include <string.h>

#include "passes.h"

static int is_f32_elementwise(const IrNode *n) {
    /* scalars keep their one-statement form; a half type joins only as a cast (the rounding
     * to bf16 before a product), which the group rounds where it is computed; a comparison's
     * u8 0 or 1 is exact in the group's float local (its integer operands are read from
     * memory and compared as integers) */
    int half_cast = n->op == OP_CAST && ir_dtype_is_half(n->dtype);
    int compare = ir_op_is_compare(n->op);
    return ir_op_kind(n->op) == OPK_EW && (n->dtype == DT_F32 || half_cast || compare) && ir_numel(&n->shape) > 1;
}

/* n can join a group whose first member is `head`. */
static int joins(const IrGraph *g, const IrNode *head, const IrNode *n) {
    return is_f32_elementwise(n) && ir_shape_eq(&n->shape, &head->shape) &&
           ir_layout_eq(n->layout, head->layout) && (n->id < g->n_fwd) == (head->id < g->n_fwd);
}

void mark_escaping(const IrGraph *g, unsigned char *escapes) {
    if (g->loss) escapes[g->loss->id] = 1;
    if (g->correct) escapes[g->correct->id] = 1;
    if (g->output) escapes[g->output->id] = 1;
    for (int i = 0; i < g->n_params; i++)
        for (IrNode *n = g->params[i].grad; n; n = ir_op_kind(n->op) == OPK_VIEW ? n->in[0] : NULL)
            escapes[n->id] = 1;
}

int fuse_elementwise(IrGraph *g) {
    ir_renumber(g);
    for (int i = 0; i < g->n; i++) g->nodes[i]->group = 0, g->nodes[i]->internal = 0;
    g->n_groups = 0;
    int *start = arena_alloc(g->arena, ((size_t)g->n + 1) * sizeof *start);
    for (int i = 0; i < g->n;) {
        IrNode *head = g->nodes[i];
        int end = i + 1;
        /* scalar constants between members are written into the loop as literals */
        while (end < g->n && (joins(g, head, g->nodes[end]) ||
                              (g->nodes[end]->op == OP_CONST && end + 1 < g->n &&
                               joins(g, head, g->nodes[end + 1]))))
            end++;
        int members = 0;
        for (int k = i; k < end; k++) members += g->nodes[k]->op != OP_CONST;
        if (!is_f32_elementwise(head) || members < 2) {
            i++;
            continue;
        }
        g->n_groups++;
        for (int k = i; k < end; k++)
            if (g->nodes[k]->op != OP_CONST) g->nodes[k]->group = g->n_groups, start[g->n_groups] = i;
        i = end;
    }
    /* a member is internal unless a node outside its group, or the end of the step, reads it */
    unsigned char *escapes = arena_alloc(g->arena, (size_t)g->n + 1);
    mark_escaping(g, escapes);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->group && n->in[k]->group != n->group) escapes[n->in[k]->id] = 1;
    }
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->group && !escapes[i]) g->nodes[i]->internal = 1;
    return g->n_groups;
}

/* ---- the report */

static const char *base_name(const char *path) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : path ? path : "?";
}

static int64_t bytes_of(const IrNode *n) { return ir_numel(&n->shape) * ir_dtype_size(n->dtype); }

/* A kernel launch per step: every node that computes (not sources, views or inline constants),
 * counting a fused group once and a matrix product's epilogue group not at all. */
static void count_kernels(const IrGraph *g, int from, int to, int *fused, int *unfused) {
    *fused = *unfused = 0;
    int last_group = 0;
    for (int i = from; i < to; i++) {
        const IrNode *n = g->nodes[i];
        IrOpKind kind = ir_op_kind(n->op);
        if (kind == OPK_SOURCE || kind == OPK_VIEW || n->storage == ST_INLINE || n->folded) continue;
        ++*unfused;
        if (n->fused_into) continue; /* accumulated in its group's loop */
        if (!n->group || n->group != last_group) ++*fused;
        last_group = n->epilogue ? n->epilogue : n->group; /* an epilogue runs inside its product */
    }
}

/* Bytes an unfused program moves for an internal value that fusion keeps in registers: one
 * write, and one read per use. */
static int64_t traffic_saved(const IrGraph *g, const IrNode *n) {
    int64_t reads = 0;
    for (int i = n->id + 1; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) reads += g->nodes[i]->in[k] == n;
    return bytes_of(n) * (1 + reads);
}

static void report_group(const IrGraph *g, int group, int64_t *saved, FILE *out) {
    char shape[160], layout[40];
    const IrNode *first = NULL;
    int lines[64], n_lines = 0;
    int64_t bytes = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->group != group) continue;
        if (!first) {
            first = n;
            fprintf(out, "  group %d  %s%s %s  %s:", group, ir_dtype_name(n->dtype),
                   ir_shape_str(&n->shape, shape, sizeof shape), ir_layout_str(n->layout, layout, sizeof layout),
                   n->id < g->n_fwd ? "forward" : "backward");
        }
        fprintf(out, " %s%s", ir_op_name(n->op), n->internal ? "" : "*");
        int seen = 0;
        for (int k = 0; k < n_lines; k++) seen |= lines[k] == n->loc.line;
        if (!seen && n_lines < 64) lines[n_lines++] = n->loc.line;
        if (n->internal) bytes += traffic_saved(g, n);
    }
    for (int i = first->id; i < g->n; i++)
        if (g->nodes[i]->fused_into == group) {
            fprintf(out, "\n      with %%%d bn_bwd_sums accumulated in the loop", i);
            bytes += bytes_of(g->nodes[i]->in[2]); /* the separate kernel reads dy back; x is read either way */
        }
    for (int i = 0; i < first->id; i++)
        if (g->nodes[i]->epilogue == group)
            fprintf(out, "\n      epilogue of %%%d matmul (%s)", i, epilogue_kind(g, g->nodes[i]));
    fprintf(out, "\n      from %s line", base_name(first->loc.file));
    fprintf(out, "%s", n_lines > 1 ? "s" : "");
    for (int k = 0; k < n_lines; k++) fprintf(out, "%s %d", k ? "," : "", lines[k]);
    fprintf(out, "; saves %.2f MiB of memory traffic per step\n", (double)bytes / (1 << 20));
    *saved += bytes;
}

void fuse_report(const IrGraph *g, FILE *out) {
    char shape[160], layout[40];
    fprintf(out, "fusion report for model %s (batch %lld)\n\n", g->model_name ? g->model_name : "?", (long long)g->batch);
    fprintf(out, "fused element-wise groups (* = stored: read outside the group; others stay in registers):\n");
    int64_t saved = 0;
    for (int k = 1; k <= g->n_groups; k++) report_group(g, k, &saved, out);
    if (!g->n_groups) fprintf(out, "  none\n");
    fprintf(out, "\nlayouts of the values the step stores:\n");
    int nhwc = 0, row = 0, other = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->storage != ST_ARENA && n->storage != ST_INPUT) continue;
        if (!n->layout.permuted) row++;
        else ir_layout_eq(n->layout, LAYOUT_NHWC) ? nhwc++ : other++;
    }
    fprintf(out, "  %d row-major, %d channels-last (nhwc)", row, nhwc);
    if (other) fprintf(out, ", %d in other orders of their axes", other);
    fprintf(out, "\n");
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if ((n->storage == ST_ARENA || n->storage == ST_INPUT) && n->shape.rank == 4)
            fprintf(out, "    %%%-5d %-18s %s%-20s %s  %s:%d\n", n->id, ir_op_name(n->op), ir_dtype_name(n->dtype),
                   ir_shape_str(&n->shape, shape, sizeof shape),
                   n->layout.permuted ? ir_layout_str(n->layout, layout, sizeof layout) : "nchw",
                   base_name(n->loc.file), n->loc.line);
    }
    int ff, fu, bf, bu;
    count_kernels(g, 0, g->n_fwd, &ff, &fu);
    count_kernels(g, g->n_fwd, g->n, &bf, &bu);
    fprintf(out, "\nkernels per training step (forward + backward + 1 optimizer loop):\n");
    fprintf(out, "  fused:   %d (%d forward, %d backward)\n", ff + bf + 1, ff, bf);
    fprintf(out, "  unfused: %d (%d forward, %d backward)\n", fu + bu + 1, fu, bu);
    fprintf(out, "memory traffic saved by fusion: %.2f MiB per step\n", (double)saved / (1 << 20));
    fprintf(out, "memory plan: arena peak %.2f MiB (%.2f MiB without reuse); parameters %.2f MiB, "
           "gradients %.2f MiB\n", (double)g->arena_bytes / (1 << 20), (double)g->unplanned_bytes / (1 << 20),
           (double)g->n_param_floats * 4 / (1 << 20), (double)g->n_grad_floats * 4 / (1 << 20));
}
