/* builder.h - making nodes and rewriting a graph's schedule: the one way a pass adds nodes.
 *
 * Making. Every node is made by ir_node_new from an IrNodeSpec (operator, operands, shape,
 * dtype, layout, attributes, phase, source location); the front end and autodiff append theirs
 * to the schedule with ir_node_append (ir_add in ir.h is its short form).
 *
 * Rewriting. A pass that inserts nodes into a finished schedule opens an IrBuilder on the
 * graph, edits through it and closes it with irb_finish:
 *
 *   IrBuilder *b = irb_begin(g);
 *   for (int i = 0; i < n; i++) {                   // g->nodes is still the old schedule
 *       IrNode *x = g->nodes[i];
 *       IrNode *c = irb_unary(b, OP_CAST, x, DT_BF16, x->layout, x);
 *       irb_insert_after(b, x, c);                  // in x's part: forward or backward
 *       irb_replace_uses(b, x, c, reads_bf16, NULL); // the readers that want it, via use-lists
 *   }
 *   return irb_finish(b);                           // new schedule, n_fwd, ids renumbered
 *
 * While a builder is open:
 *   - g->nodes, g->n and g->n_fwd still describe the schedule as it was at irb_begin, so a pass
 *     can walk it while it edits; the edits reach them at irb_finish;
 *   - a node's id is a stable key, not its position: the old nodes keep the positions irb_begin
 *     numbered them with, new nodes get ids from the old g->n on, so a pass may index its own
 *     tables by the ids of the old nodes;
 *   - a node belongs to the forward part (nodes[0 .. n_fwd)) or the backward part; a node
 *     inserted before or after another joins that node's part, so n_fwd comes out right; its
 *     phase is the one it was made with (irb_unary: that of the node it is made for);
 *   - the builder keeps every node's use-list (who reads it, in which operand slot) up to date
 *     through its own edits: change operands only with irb_set_operand and irb_replace_uses.
 * A node made by the builder but never inserted is dropped at irb_finish (an internal error
 * if anything placed still reads it).
 */
#ifndef NETC_BUILDER_H
#define NETC_BUILDER_H

#include "ir.h"

/* Everything a new node is made of. */
typedef struct IrNodeSpec {
    IrOp op;
    int n_in;
    IrNode *in[IR_MAX_OPERANDS];
    IrShape shape;
    IrDtype dtype;
    IrLayout layout;
    const IrAttrs *attr; /* copied; NULL: the defaults (groups = 1, everything else 0) */
    IrPhase phase;
    SrcLoc loc;
} IrNodeSpec;

/* A node made from `spec`, not placed in any schedule. */
IrNode *ir_node_new(IrGraph *g, const IrNodeSpec *spec);
/* A node made from `spec`, appended to the end of g's schedule; its operands must already be
 * in it. g->n_fwd is the caller's (sema sets it once; autodiff appends the backward part). */
IrNode *ir_node_append(IrGraph *g, const IrNodeSpec *spec);

/* One reading of a value: user->in[k] is the value. */
typedef struct IrUse {
    IrNode *user;
    int k;
} IrUse;

typedef struct IrBuilder IrBuilder;

/* Open a builder on g: number the nodes by position and build every node's use-list. */
IrBuilder *irb_begin(IrGraph *g);
/* Write the edited schedule into g (nodes, n, n_fwd), number the nodes by position and close
 * the builder. Returns the number of nodes inserted. */
int irb_finish(IrBuilder *b);

/* A node made from `spec`, with a use-list, not placed yet. */
IrNode *irb_node(IrBuilder *b, const IrNodeSpec *spec);
/* A one-operand node of x's shape (a cast, a layout conversion) made for node `at`: at's
 * phase and source location. Not placed yet. */
IrNode *irb_unary(IrBuilder *b, IrOp op, IrNode *x, IrDtype dt, IrLayout layout, const IrNode *at);

/* Place n, made by this builder and not placed yet, right before / right after `at`, in at's
 * part of the schedule. */
void irb_insert_before(IrBuilder *b, IrNode *at, IrNode *n);
void irb_insert_after(IrBuilder *b, IrNode *at, IrNode *n);
/* Place n at the end of the schedule (in the backward part when there is one). */
void irb_append(IrBuilder *b, IrNode *n);
/* Take n out of the schedule; nothing may read it, and it may not be one of the graph's
 * results. It no longer reads its operands, and is dropped at irb_finish. */
void irb_remove(IrBuilder *b, IrNode *n);
/* irb_remove(n) when n is in the schedule and nothing reads it (a copy a rewrite left behind);
 * returns whether it did. */
int irb_remove_unread(IrBuilder *b, IrNode *n);
/* n is in the schedule: an old node, or a new one already inserted. */
int irb_placed(const IrBuilder *b, const IrNode *n);

/* The readers of x (one entry per operand slot that reads it), in schedule order as of
 * irb_begin; readers that edits added come after. Valid until the next edit. */
const IrUse *irb_uses(const IrBuilder *b, const IrNode *x, int *n_uses);
/* The graph itself reads x at the end of the step: it is the loss, the correct count or a
 * parameter's gradient. */
int irb_is_result(const IrBuilder *b, const IrNode *x);

/* user->in[k] = v, keeping both use-lists right. */
void irb_set_operand(IrBuilder *b, IrNode *user, int k, IrNode *v);
/* Which readings irb_replace_uses rewrites: user is the reading node, or NULL for the graph's
 * own references (the loss, the correct count, parameters' gradients). */
typedef int (*IrUseFilter)(const IrNode *user, const void *ctx);
/* Make the readings of `from` that `keep` accepts (every one, for NULL) read `to` instead,
 * except to's own: `to` may be computed from `from`. Returns how many were rewritten. */
int irb_replace_uses(IrBuilder *b, IrNode *from, IrNode *to, IrUseFilter keep, const void *ctx);

#endif
