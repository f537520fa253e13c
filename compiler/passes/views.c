/* views.c - permutes, slices and concatenations that their element-wise readers read in place.
 *
 * Requires:    a differentiated graph in schedule order with its fused groups and epilogues
 *              (fuse_elementwise, fuse_epilogues); no memory plan yet.
 * Guarantees:  `folded` is set on each float32 PERMUTE, SLICE, SLICE_BWD and CONCAT whose every
 *              reader is an element-wise node or another folded one, as fold_views() says below.
 *              The memory plan gives a folded node no storage (ST_FOLDED) and keeps what it reads
 *              alive until its readers have run; the backends emit nothing for it, and a loop
 *              that reads it reads its operands instead, at the index the view maps its element
 *              to (codegen/cexpr.c, read_folded): a permute's strides, a slice's offset, the
 *              operand a concatenation's element comes from, a slice gradient's dy or zero. The
 *              schedule, shapes and operands are unchanged, and the same floats are read, so the
 *              step computes the same bits.
 * Invalidates: nothing (run before mp_plan).
 *
 * Why: such a node is a copy, one read and one write of its whole result, and a buffer. In a
 * Llama block the rotary embedding of q and k (x cos + [-x2, x1] sin, on heads permuted out of
 * a projection) is a permute, two slices and a concatenation, and its gradient as many again;
 * folded, the embedding's loop reads the projection's rows directly.
 *
 * Not folded, each for its reason:
 *   - a value a library kernel, a reduction or batch norm reads: they read whole contiguous
 *     tensors (and batch norm its per-channel operands by channel, not by broadcasting);
 *   - the loss, the accuracy, the model's output and the gradients the optimizer reads: the step
 *     hands them on whole;
 *   - a reader in a matrix product's epilogue: on a GPU cuBLASLt reads its bias by pointer;
 *   - a view whose operands a reader's own fused loop computes: that loop writes element i of a
 *     member while another thread reads the view of it at some other index, maybe before it is
 *     written.
 */
#include "passes.h"

static int is_view_op(IrOp op) { return op == OP_PERMUTE || op == OP_SLICE || op == OP_SLICE_BWD || op == OP_CONCAT; }

/* r reads its operands element by element (cexpr.c's cg_elem_as), or is itself folded. */
static int reads_elementwise(const IrNode *r, const unsigned char *epilogue_group) {
    if (r->folded) return 1;
    if (ir_op_kind(r->op) != OPK_EW || r->op == OP_BN_APPLY || r->op == OP_BN_BWD_DATA) return 0;
    return !(r->group && epilogue_group[r->group]);
}

/* Some value that folded view v reads through (its operands, through folded ones) is a member
 * of fused group `group`. */
static int reads_member(const IrNode *v, int group) {
    for (int k = 0; k < v->n_in; k++) {
        const IrNode *u = v->in[k];
        if (u->folded ? reads_member(u, group) : u->group == group) return 1;
    }
    return 0;
}

int fold_views(IrGraph *g) {
    IrBuilder *b = irb_begin(g); /* for its use-lists: nothing is edited */
    unsigned char *handed = arena_alloc(g->arena, (size_t)g->n + 1);
    unsigned char *epilogue_group = arena_alloc(g->arena, (size_t)g->n_groups + 1);
    mark_escaping(g, handed); /* the loss, the output, the gradients: handed on whole */
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->epilogue) epilogue_group[g->nodes[i]->epilogue] = 1;
    /* every candidate folded, then unfolded until each folded one's readers allow it: unfolding
     * only takes readers away from the rule (a node unfolded reads like a kernel), so this ends */
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        n->folded = is_view_op(n->op) && n->dtype == DT_F32 && !handed[i];
    }
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int i = g->n - 1; i >= 0; i--) {
            IrNode *v = g->nodes[i];
            int n_uses;
            const IrUse *use = irb_uses(b, v, &n_uses);
            for (int j = 0; v->folded && j < n_uses; j++) {
                const IrNode *r = use[j].user;
                if (!reads_elementwise(r, epilogue_group) || (!r->folded && r->group && reads_member(v, r->group)))
                    v->folded = 0, changed = 1;
            }
        }
    }
    irb_finish(b);
    int count = 0;
    for (int i = 0; i < g->n; i++) count += g->nodes[i]->folded;
    return count;
}
