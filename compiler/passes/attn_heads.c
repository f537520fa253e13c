/* attn_heads.c - attention reads its heads where the projections wrote them.
 *
 * Requires:    the forward graph from sema (no backward pass yet).
 * Guarantees:  an attention whose q, k and v are heads split off projections and whose result
 *              is only put back together reads and writes the projections' own rows: the
 *              copies that split and join the heads are gone, and so, after autodiff, are
 *              their gradients' copies and sums. The values computed are the same.
 * Invalidates: node ids (renumbered).
 *
 * A model writes multi-head attention as PyTorch does (models/gpt2.net):
 *
 *   qkv = split(dense(x, 3 * C), 3)                     slice   [B, T, 3C] -> [B, T, C]
 *   heads(t) = transpose(reshape(t, [B, T, H, d]), 1, 2) permute [B, T, H, d] -> [B, H, T, d]
 *   y = attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), causal = true)
 *   y = reshape(transpose(y, 1, 2), [B, T, C])          permute back
 *
 * Computed as written, the forward pass copies q, k and v twice each (slice, permute) and the
 * result once; the backward pass copies the three gradients back (permute), pads each to
 * [B, T, 3C] (slice_bwd) and adds the three. The fused kernel needs none of it: a head's rows
 * are its columns of the projection's rows, a row stride apart. So each operand that is
 * permute(reshape(z)) (z [B, T, H * d], or z a slice of a wider [B, T, W] along its last axis)
 * is replaced by its base (z, or the sliced tensor) with the heads, head size and first column
 * in the attention's attributes (attr.attn_heads, attn_hdim, attn_col; ir_attention_qkv), and
 * the result becomes [B, T, H * e], the heads side by side, which is what the permute back
 * made: that permute becomes a reshape (a view). autodiff then gives the attention one gradient
 * per base (ir_attention_grad_at): GPT-2's dq, dk and dv are written into the one [B, T, 3C]
 * gradient of the projection, each into its columns.
 *
 * Folded when at least one operand has that form, the operands of one base read disjoint
 * columns, and everything reading the result is the permute back; nothing is folded that the
 * graph itself reads (the loss, the model's output). An operand of another form is read as it
 * is, [B, H, T, d]: in Llama q and k are turned by the rotary embedding after the heads are
 * split, and only v and the result are folded. Copies left unread are removed. Both backends'
 * kernels read each operand through a view of its own (RtAttnView in netrt.h, RtKAttnView in
 * netrt_attention.cuh; dense where an operand is in the plain form).
 */
#include "passes.h"

/* permute [0, 2, 1, 3]: [B, T, H, d] <-> [B, H, T, d] */
static int swaps_heads(const IrNode *x) {
    static const int perm[4] = {0, 2, 1, 3};
    if (x->op != OP_PERMUTE || x->shape.rank != 4 || x->dtype != DT_F32) return 0;
    for (int i = 0; i < 4; i++)
        if (x->attr.perm[i] != perm[i]) return 0;
    return 1;
}

/* x = permute(reshape(z)) as above: its base, first column, heads and head size. */
static int heads_of(const IrNode *x, IrNode **base, int64_t *col, int *heads, int64_t *hdim) {
    if (!swaps_heads(x) || x->in[0]->op != OP_RESHAPE) return 0;
    const IrNode *r = x->in[0];
    IrNode *z = r->in[0];
    const int64_t B = r->shape.dim[0], T = r->shape.dim[1], H = r->shape.dim[2], d = r->shape.dim[3];
    if (z->shape.rank != 3 || z->shape.dim[0] != B || z->shape.dim[1] != T || z->shape.dim[2] != H * d) return 0;
    *base = z, *col = 0, *heads = (int)H, *hdim = d;
    if (z->op == OP_SLICE && z->attr.axis == 2) *base = z->in[0], *col = z->attr.start;
    return 1;
}

/* The graph itself reads x: the loss, the correct count, the model's output. */
static int kept(const IrGraph *g, const IrBuilder *b, const IrNode *x) { return irb_is_result(b, x) || x == g->output; }

/* x and the copies under it that nothing else reads any more, out of the schedule. */
static void drop_unread(IrBuilder *b, IrNode *x) {
    while ((x->op == OP_PERMUTE || x->op == OP_RESHAPE || x->op == OP_SLICE) && irb_remove_unread(b, x)) x = x->in[0];
}

/* Attention y with its heads read from tokens, or 0 when it does not have the form. */
static int fold(IrGraph *g, IrBuilder *b, IrNode *y) {
    if (ir_attention_tokens(y) || y->shape.rank != 4 || kept(g, b, y)) return 0;
    IrAttrs attr = y->attr;
    IrNodeSpec spec = {.op = y->op, .n_in = y->n_in, .dtype = DT_F32, .layout = y->layout, .attr = &attr,
                       .phase = y->phase, .loc = y->loc};
    int from_tokens = 0;
    for (int i = 0; i < 3; i++) { /* an operand of another form stays as it is, [B, H, T, d] */
        from_tokens += heads_of(y->in[i], &spec.in[i], &attr.attn_col[i], &attr.attn_heads[i], &attr.attn_hdim[i]);
        if (!attr.attn_heads[i]) spec.in[i] = y->in[i];
    }
    if (!from_tokens) return 0;
    if (y->n_in > 3) spec.in[3] = y->in[3]; /* the mask: read per (batch, head) as before */
    int n_uses;
    const IrUse *use = irb_uses(b, y, &n_uses);
    for (int i = 0; i < n_uses; i++)
        if (!swaps_heads(use[i].user) || kept(g, b, use[i].user)) return 0;
    const IrShape *q = &y->shape; /* [B, H, T, e] */
    spec.shape = ir_shape(3, q->dim[0], q->dim[2], q->dim[1] * q->dim[3]);
    IrNode *t = irb_node(b, &spec);
    IrShape qkv[3];
    if (!ir_attention_qkv(t, qkv)) return 0; /* operands of one base overlap: t is dropped unplaced */
    irb_insert_before(b, y, t);
    IrNode **users = arena_alloc(g->arena, (size_t)n_uses * sizeof *users); /* use[] changes below */
    for (int i = 0; i < n_uses; i++) users[i] = use[i].user;
    for (int i = 0; i < n_uses; i++) { /* the permute back: now the heads side by side already */
        IrNode *p = users[i];
        IrNodeSpec view = {.op = OP_RESHAPE, .n_in = 1, .in = {t}, .shape = p->shape, .dtype = DT_F32,
                           .layout = p->layout, .phase = p->phase, .loc = p->loc};
        IrNode *r = irb_node(b, &view);
        irb_insert_before(b, p, r);
        irb_replace_uses(b, p, r, NULL, NULL);
        irb_remove(b, p);
    }
    irb_remove(b, y);
    for (int i = 0; i < 3; i++)
        if (attr.attn_heads[i]) drop_unread(b, y->in[i]);
    return 1;
}

int fold_attention_heads(IrGraph *g) {
    IrBuilder *b = irb_begin(g);
    int folded = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        if ((n->op == OP_ATTENTION || n->op == OP_ATTENTION_MASKED) && irb_placed(b, n)) folded += fold(g, b, n);
    }
    irb_finish(b);
    return folded;
}
