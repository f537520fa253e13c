/* epilogue.c - GEMM + bias + activation: a matrix product's element-wise tail as its epilogue.
 *
 * Requires:    fused groups (fuse_elementwise has run); no memory plan yet.
 * Guarantees:  a rank-2 f32 MATMUL m has m->epilogue = g when fused group g starts right after
 *              m in the schedule (scalar constants between are fine), has m's shape, layout
 *              and phase, and reads m. A lone element-wise node in that place (a dense
 *              layer's bias without an activation) becomes a one-member group first. Every
 *              operand of g is then m, a member of g, or defined before m, so g can run on
 *              each block of m's rows as soon as that block exists; the memory plan keeps m's
 *              operands and g's values apart for the whole span. Values and schedule are
 *              unchanged.
 * Invalidates: nothing.
 *
 * The forms cuBLASLt names (and the CUDA backend maps to): bias add (BIAS), bias + ReLU
 * (RELU_BIAS), bias + GELU (GELU_BIAS); backward, the activation's gradient applied to the
 * product dX = dY W (DRELU, DGELU). Any other group is still an epilogue on the CPU ("custom").
 * The bias gradient (a column sum) stays a separate reduction.
 */
#include "passes.h"

/* The first non-constant node after position i, or NULL. */
static IrNode *next_computing(const IrGraph *g, int i) {
    for (int k = i + 1; k < g->n; k++)
        if (g->nodes[k]->op != OP_CONST) return g->nodes[k];
    return NULL;
}

static int reads(const IrNode *n, const IrNode *x) {
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] == x) return 1;
    return 0;
}

int fuse_epilogues(IrGraph *g) {
    int count = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *m = g->nodes[i], *head = next_computing(g, i);
        m->epilogue = 0;
        if (m->op != OP_MATMUL || m->shape.rank != 2 || m->dtype != DT_F32 || !head) continue;
        if (ir_op_kind(head->op) != OPK_EW || head->dtype != DT_F32 || !ir_shape_eq(&head->shape, &m->shape) ||
            !ir_layout_eq(head->layout, m->layout) || head->phase != m->phase || (head->id < g->n_fwd) != (i < g->n_fwd))
            continue;
        if (!head->group) { /* a lone element-wise node: a group of one, stored as before */
            head->group = ++g->n_groups;
            head->internal = 0;
        }
        int reads_m = 0;
        for (int k = head->id; k < g->n && (g->nodes[k]->group == head->group || g->nodes[k]->op == OP_CONST); k++)
            reads_m |= g->nodes[k]->group == head->group && reads(g->nodes[k], m);
        if (!reads_m) continue;
        m->epilogue = head->group;
        count++;
    }
    return count;
}

const char *epilogue_kind(const IrGraph *g, const IrNode *mm) {
    int members = 0, bias = 0, relu = 0, gelu = 0, gelu_tanh = 0, drelu = 0, dgelu = 0;
    int64_t cols = mm->shape.dim[1];
    for (int i = mm->id + 1; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->op == OP_CONST) continue;
        if (n->group != mm->epilogue) break;
        members++;
        switch (n->op) {
        case OP_ADD:
            for (int k = 0; k < 2; k++) /* x + b with b one value per column */
                if (n->in[k]->group != n->group && n->in[k] != mm && ir_numel(&n->in[k]->shape) == cols &&
                    n->in[k]->shape.dim[n->in[k]->shape.rank - 1] == cols)
                    bias++;
            break;
        case OP_RELU: relu++; break;
        case OP_GELU: gelu++; break;
        case OP_GELU_TANH: gelu_tanh++; break;
        case OP_RELU_GRAD: drelu += n->in[1] == mm; break;
        case OP_GELU_GRAD: dgelu += n->in[1] == mm; break;
        default: break;
        }
    }
    if (members == 1 && bias == 1) return "BIAS";
    if (members == 2 && bias == 1 && relu == 1) return "RELU_BIAS";
    if (members == 2 && bias == 1 && gelu == 1) return "GELU_BIAS";
    if (members == 2 && bias == 1 && gelu_tanh == 1) return "GELU_TANH_BIAS";
    if (members == 1 && relu == 1) return "RELU";
    if (members == 1 && gelu == 1) return "GELU";
    if (members == 1 && drelu == 1) return "DRELU";
    if (members == 1 && dgelu == 1) return "DGELU";
    return "custom";
}
