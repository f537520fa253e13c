/* fuse_reduce.c - batch norm's backward sums inside the fused group that computes their dy.
 *
 * Requires:    fused groups (fuse_elementwise has run); no memory plan yet.
 * Guarantees:  a BN_BWD_SUMS node s = sums(x, stats, dy) has s->fused_into = G when dy is a
 *              member of fused group G (a lone element-wise dy becomes a group of one), G is
 *              channels-last f32 in the backward pass, x has
 *              G's shape and layout, and x and stats are defined before G's first member. The
 *              backends then accumulate s in G's loop over rows of channels (in the same fixed
 *              blocks of rows, and the same order, as the separate kernel, so the sums are
 *              bit-identical) and skip s at its own position; the memory plan defines s at
 *              G's first position. Values and schedule are unchanged.
 * Invalidates: nothing.
 *
 * In a residual block's backward pass G is `add` (the two branches' gradients) + `relu_grad`,
 * and its dy feeds two batch norms (the block's last and the shortcut's): both sums join G, so
 * batch norm + add + ReLU backward reads its gradient once for the sums instead of three times.
 */
#include "passes.h"

int fuse_reductions(IrGraph *g) {
    int *first = arena_alloc(g->arena, ((size_t)g->n + 1) * sizeof *first); /* room for new groups */
    for (int i = g->n - 1; i >= 0; i--)
        if (g->nodes[i]->group) first[g->nodes[i]->group] = i;
    int count = 0;
    for (int i = g->n_fwd; i < g->n; i++) {
        IrNode *s = g->nodes[i], *x = s->in[0], *stats = s->in[1], *dy = s->in[2];
        s->fused_into = 0;
        if (s->op != OP_BN_BWD_SUMS || ir_op_kind(dy->op) != OPK_EW || !ir_layout_eq(dy->layout, LAYOUT_NHWC) ||
            dy->dtype != DT_F32)
            continue;
        if (!ir_layout_eq(x->layout, LAYOUT_NHWC) || !ir_shape_eq(&x->shape, &dy->shape) || x->dtype != DT_F32) continue;
        int head = dy->group ? first[dy->group] : dy->id;
        if (x->id >= head || stats->id >= head || head < g->n_fwd) continue;
        if (!dy->group) { /* a lone ReLU gradient: a group of one, stored as before */
            dy->group = ++g->n_groups;
            dy->internal = 0;
            first[dy->group] = dy->id;
        }
        s->fused_into = dy->group;
        count++;
    }
    return count;
}
