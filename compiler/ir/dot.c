/* dot.c - the graph for Graphviz (netc --dump=dot): `netc model.net --dump=dot | dot -Tsvg`.
 *
 * One box per node: its operator and attributes, dtype and shape, and for an input or a
 * parameter its name (inputs are ellipses, parameters grey boxes); one edge per operand, from
 * the operand to its user. The loss and the metric are drawn bold. Nodes of one fused
 * element-wise group sit in a dashed cluster named after the group, with the matrix product
 * whose epilogue applies the group and batch-norm sums accumulated in its loop, so the picture
 * shows what each generated kernel computes. With whole_step the backward pass follows the
 * forward one, its boxes drawn in blue.
 *
 * Left out, since they would crowd the picture: scalar constants, which are written into their
 * users' boxes instead, and inputs and parameters that no drawn node reads (batch norm's running
 * statistics, in the forward graph).
 *
 * Names come from the user's .net file and are quoted for DOT; everything else is the
 * compiler's own text.
 */
#include <string.h>

#include "ir.h"

/* A string as the inside of a DOT quoted string. */
static void dot_text(const char *s, FILE *out) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', out);
        fputc(*s, out);
    }
}

static int in_picture(const IrNode *n, int whole_step) {
    return n->op != OP_CONST && (whole_step || n->phase == PHASE_FWD);
}

/* Whether n is drawn: a node of the picture, and for an input or a parameter, one that some node
 * of the picture reads (batch norm's running statistics are not read by the forward pass). */
static int drawn(const IrGraph *g, const IrNode *n, int whole_step) {
    if (!in_picture(n, whole_step)) return 0;
    if (n->op != OP_INPUT && n->op != OP_PARAM) return 1;
    for (int i = 0; i < g->n; i++) {
        const IrNode *user = g->nodes[i];
        if (!in_picture(user, whole_step)) continue;
        for (int k = 0; k < user->n_in; k++)
            if (user->in[k] == n) return 1;
    }
    return 0;
}

static void node_box(const IrGraph *g, const IrNode *n, FILE *out) {
    char shape[160];
    fprintf(out, "  n%d [label=\"%s", n->id, ir_op_name(n->op));
    ir_print_attrs(n, out);
    for (int i = 0; i < n->n_in; i++) /* the constants this node reads */
        if (n->in[i]->op == OP_CONST) fprintf(out, " %.6g", n->in[i]->attr.scalar);
    char layout[40];
    fprintf(out, "\\n%s%s%s%s", ir_dtype_name(n->dtype), ir_shape_str(&n->shape, shape, sizeof shape),
            n->layout.permuted ? " " : "", n->layout.permuted ? ir_layout_str(n->layout, layout, sizeof layout) : "");
    if (n->name) {
        fprintf(out, "\\n");
        dot_text(n->name, out);
    }
    fprintf(out, "\"");
    if (n->op == OP_INPUT) fprintf(out, ", shape=ellipse");
    if (n->op == OP_PARAM) fprintf(out, ", style=filled, fillcolor=gray90");
    if (n == g->loss || n == g->correct) fprintf(out, ", penwidth=2.5");
    if (n->phase == PHASE_BWD) fprintf(out, ", color=blue, fontcolor=blue");
    fprintf(out, "];\n");
}

/* The fused groups as clusters: every drawn node of group k, with the matrix product that applies
 * it as its epilogue and the batch-norm sums accumulated in its loop: one cluster, one kernel. */
static void group_clusters(const IrGraph *g, int whole_step, FILE *out) {
    for (int k = 1; k <= g->n_groups; k++) {
        int any = 0;
        for (int i = 0; i < g->n; i++) {
            const IrNode *n = g->nodes[i];
            int member = n->group == k || n->epilogue == k || n->fused_into == k;
            if (!member || !drawn(g, n, whole_step)) continue;
            if (!any) fprintf(out, "  subgraph cluster_group%d {\n    label=\"fused group %d\"; style=dashed;\n", k, k);
            fprintf(out, "    n%d;\n", n->id);
            any = 1;
        }
        if (any) fprintf(out, "  }\n");
    }
}

void ir_print_dot(const IrGraph *g, int whole_step, FILE *out) {
    fprintf(out, "digraph \"");
    dot_text(g->model_name ? g->model_name : "model", out);
    fprintf(out, "\" {\n  fontname=\"Helvetica\";\n  label=\"model ");
    dot_text(g->model_name ? g->model_name : "?", out);
    fprintf(out, ", batch %lld, %s\";\n  labelloc=t;\n", (long long)g->batch,
            whole_step ? "forward and backward (blue)" : "forward");
    /* one pass of network simplex for the boxes' x positions: the backward pass reads forward
     * values many ranks later, and each such edge is a chain of virtual nodes that dot would
     * otherwise keep straightening for minutes (BERT-base's whole step: over 10 minutes, 13 s
     * with this) */
    fprintf(out, "  nslimit=1;\n");
    fprintf(out, "  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n  edge [arrowsize=0.6];\n");
    for (int i = 0; i < g->n; i++)
        if (drawn(g, g->nodes[i], whole_step)) node_box(g, g->nodes[i], out);
    group_clusters(g, whole_step, out);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (!drawn(g, n, whole_step)) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->op != OP_CONST) fprintf(out, "  n%d -> n%d;\n", n->in[k]->id, n->id);
    }
    fprintf(out, "}\n");
}
