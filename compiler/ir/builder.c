/* builder.c - making nodes, and the rewriting sessions of builder.h.
 *
 * While a builder is open the schedule is a doubly linked list threaded through one entry per
 * node (indexed by the node's id), so inserting costs O(1) however long the graph is; each
 * entry also holds the node's use-list and its part of the schedule. irb_finish walks the list
 * once to write the new schedule back into the graph.
 */
#include "builder.h"

#include <string.h>

/* ---- making nodes */

IrNode *ir_node_new(IrGraph *g, const IrNodeSpec *spec) {
    if (spec->n_in < 0 || spec->n_in > IR_MAX_OPERANDS)
        ICE("%s with %d operands", ir_op_name(spec->op), spec->n_in);
    IrNode *n = arena_alloc(g->arena, sizeof *n);
    n->op = spec->op;
    n->n_in = spec->n_in;
    memcpy(n->in, spec->in, sizeof n->in);
    n->shape = spec->shape;
    n->dtype = spec->dtype;
    n->layout = spec->layout;
    if (spec->attr) n->attr = *spec->attr;
    else n->attr.groups = 1;
    n->phase = spec->phase;
    n->loc = spec->loc;
    return n;
}

IrNode *ir_node_append(IrGraph *g, const IrNodeSpec *spec) {
    IrNode *n = ir_node_new(g, spec);
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        IrNode **nodes = arena_alloc(g->arena, (size_t)cap * sizeof *nodes);
        if (g->n) memcpy(nodes, g->nodes, (size_t)g->n * sizeof *nodes);
        g->nodes = nodes;
        g->cap = cap;
    }
    n->id = g->n;
    g->nodes[g->n++] = n;
    return n;
}

/* ---- the session's bookkeeping */

typedef struct Entry {
    IrNode *node;
    IrNode *prev, *next; /* neighbours in the schedule, while placed */
    IrUse *uses;         /* who reads node */
    int n_uses, cap_uses;
    unsigned char placed;
    unsigned char backward; /* in the backward part */
} Entry;

struct IrBuilder {
    IrGraph *g;
    Entry *e; /* by node id */
    int n, cap;
    IrNode *head, *tail; /* the schedule */
    int inserted;
};

static Entry *entry(const IrBuilder *b, const IrNode *n) {
    if (n->id < 0 || n->id >= b->n || b->e[n->id].node != n)
        ICE("builder: %s node %%%d was not made by this builder nor in its graph", ir_op_name(n->op), n->id);
    return &b->e[n->id];
}

/* Room for one more entry; n gets the next id. */
static void add_entry(IrBuilder *b, IrNode *n) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        Entry *more = arena_alloc(b->g->arena, (size_t)b->cap * sizeof *more);
        if (b->n) memcpy(more, b->e, (size_t)b->n * sizeof *more);
        b->e = more;
    }
    n->id = b->n;
    b->e[b->n++] = (Entry){.node = n};
}

static void add_use(IrBuilder *b, IrNode *x, IrNode *user, int k) {
    Entry *e = entry(b, x);
    if (e->n_uses == e->cap_uses) {
        e->cap_uses = e->cap_uses ? 2 * e->cap_uses : 4;
        IrUse *more = arena_alloc(b->g->arena, (size_t)e->cap_uses * sizeof *more);
        if (e->n_uses) memcpy(more, e->uses, (size_t)e->n_uses * sizeof *more);
        e->uses = more;
    }
    e->uses[e->n_uses++] = (IrUse){user, k};
}

/* Shifting rather than swapping keeps the list in schedule order. */
static void remove_use(IrBuilder *b, IrNode *x, const IrNode *user, int k) {
    Entry *e = entry(b, x);
    for (int i = 0; i < e->n_uses; i++)
        if (e->uses[i].user == user && e->uses[i].k == k) {
            memmove(&e->uses[i], &e->uses[i + 1], (size_t)(e->n_uses - i - 1) * sizeof *e->uses);
            e->n_uses--;
            return;
        }
    ICE("builder: %%%d is not operand %d of %%%d", x->id, k, user->id);
}

static void register_node(IrBuilder *b, IrNode *n) {
    add_entry(b, n);
    for (int k = 0; k < n->n_in; k++) add_use(b, n->in[k], n, k);
}

/* Thread n into the list between prev and next (either NULL at an end). */
static void link(IrBuilder *b, IrNode *n, IrNode *prev, IrNode *next, int backward) {
    Entry *e = entry(b, n);
    e->prev = prev;
    e->next = next;
    e->placed = 1;
    e->backward = (unsigned char)backward;
    if (prev) entry(b, prev)->next = n;
    else b->head = n;
    if (next) entry(b, next)->prev = n;
    else b->tail = n;
}

IrBuilder *irb_begin(IrGraph *g) {
    IrBuilder *b = arena_alloc(g->arena, sizeof *b);
    b->g = g;
    b->cap = g->n + 64; /* the old nodes and room for a few insertions before the first doubling */
    b->e = arena_alloc(g->arena, (size_t)b->cap * sizeof *b->e);
    ir_renumber(g);
    for (int i = 0; i < g->n; i++) register_node(b, g->nodes[i]);
    for (int i = 0; i < g->n; i++) link(b, g->nodes[i], b->tail, NULL, i >= g->n_fwd);
    return b;
}

/* Everything placed reads only placed nodes, and the graph's results are placed. */
static void check_placed(const IrBuilder *b) {
    for (IrNode *n = b->head; n; n = entry(b, n)->next)
        for (int k = 0; k < n->n_in; k++)
            if (!irb_placed(b, n->in[k]))
                ICE("builder: %s %%%d reads %%%d, which was never inserted", ir_op_name(n->op), n->id,
                    n->in[k]->id);
    for (int i = 0; i < b->n; i++)
        if (!b->e[i].placed && irb_is_result(b, b->e[i].node))
            ICE("builder: result %%%d was never inserted", i);
}

int irb_finish(IrBuilder *b) {
    IrGraph *g = b->g;
    check_placed(b);
    int n = 0, n_fwd = 0;
    for (IrNode *x = b->head; x; x = entry(b, x)->next) n++;
    IrNode **nodes = arena_alloc(g->arena, ((size_t)n + 1) * sizeof *nodes);
    n = 0;
    for (IrNode *x = b->head; x; x = entry(b, x)->next) {
        int backward = entry(b, x)->backward;
        if (!backward && n_fwd < n) ICE("builder: forward %%%d after the backward part began", x->id);
        if (!backward) n_fwd++;
        nodes[n++] = x;
    }
    g->nodes = nodes;
    g->n = g->cap = n;
    g->n_fwd = n_fwd;
    ir_renumber(g);
    return b->inserted;
}

/* ---- making and placing nodes */

IrNode *irb_node(IrBuilder *b, const IrNodeSpec *spec) {
    IrNode *n = ir_node_new(b->g, spec);
    register_node(b, n);
    return n;
}

IrNode *irb_unary(IrBuilder *b, IrOp op, IrNode *x, IrDtype dt, IrLayout layout, const IrNode *at) {
    return irb_node(b, &(IrNodeSpec){.op = op, .n_in = 1, .in = {x}, .shape = x->shape, .dtype = dt,
                                     .layout = layout, .phase = at->phase, .loc = at->loc});
}

int irb_placed(const IrBuilder *b, const IrNode *n) { return entry(b, n)->placed; }

static void check_new(const IrBuilder *b, const IrNode *at, const IrNode *n) {
    if (irb_placed(b, n)) ICE("builder: %%%d is already in the schedule", n->id);
    if (at && !irb_placed(b, at)) ICE("builder: inserting next to %%%d, not in the schedule", at->id);
}

void irb_insert_before(IrBuilder *b, IrNode *at, IrNode *n) {
    check_new(b, at, n);
    Entry *e = entry(b, at);
    link(b, n, e->prev, at, e->backward);
    b->inserted++;
}

void irb_insert_after(IrBuilder *b, IrNode *at, IrNode *n) {
    check_new(b, at, n);
    Entry *e = entry(b, at);
    link(b, n, at, e->next, e->backward);
    b->inserted++;
}

void irb_append(IrBuilder *b, IrNode *n) {
    check_new(b, NULL, n);
    int backward = b->tail ? entry(b, b->tail)->backward : 0;
    link(b, n, b->tail, NULL, backward);
    b->inserted++;
}

/* Nothing reads n: no node, and not the graph (a result, or the model's output). */
static int unread(const IrBuilder *b, const IrNode *n) {
    return !entry(b, n)->n_uses && !irb_is_result(b, n) && n != b->g->output;
}

void irb_remove(IrBuilder *b, IrNode *n) {
    Entry *e = entry(b, n);
    if (!e->placed) ICE("builder: removing %%%d, not in the schedule", n->id);
    if (!unread(b, n)) ICE("builder: removing %s %%%d, which is still read", ir_op_name(n->op), n->id);
    if (e->prev) entry(b, e->prev)->next = e->next;
    else b->head = e->next;
    if (e->next) entry(b, e->next)->prev = e->prev;
    else b->tail = e->prev;
    e->prev = e->next = NULL;
    e->placed = 0;
    for (int k = 0; k < n->n_in; k++) remove_use(b, n->in[k], n, k);
}

int irb_remove_unread(IrBuilder *b, IrNode *n) {
    if (!entry(b, n)->placed || !unread(b, n)) return 0;
    irb_remove(b, n);
    return 1;
}

/* ---- uses */

const IrUse *irb_uses(const IrBuilder *b, const IrNode *x, int *n_uses) {
    const Entry *e = entry(b, x);
    *n_uses = e->n_uses;
    return e->uses;
}

int irb_is_result(const IrBuilder *b, const IrNode *x) {
    const IrGraph *g = b->g;
    if (x == g->loss || x == g->correct) return 1;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad == x) return 1;
    return 0;
}

void irb_set_operand(IrBuilder *b, IrNode *user, int k, IrNode *v) {
    if (k < 0 || k >= user->n_in) ICE("builder: %%%d has no operand %d", user->id, k);
    remove_use(b, user->in[k], user, k);
    user->in[k] = v;
    add_use(b, v, user, k);
}

/* The graph's own references to `from` (loss, correct count, gradients), if keep accepts them. */
static int replace_results(IrBuilder *b, IrNode *from, IrNode *to, IrUseFilter keep, const void *ctx) {
    IrGraph *g = b->g;
    int count = 0;
    if (keep && !keep(NULL, ctx)) return 0;
    IrNode **refs[2] = {&g->loss, &g->correct};
    for (int i = 0; i < 2; i++)
        if (*refs[i] == from) *refs[i] = to, count++;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].grad == from) g->params[i].grad = to, count++;
    return count;
}

int irb_replace_uses(IrBuilder *b, IrNode *from, IrNode *to, IrUseFilter keep, const void *ctx) {
    if (from == to) ICE("builder: replacing %%%d by itself", from->id);
    int count = 0;
    Entry *e = entry(b, from);
    for (int i = 0; i < e->n_uses;) {
        IrUse u = e->uses[i];
        if (u.user == to || (keep && !keep(u.user, ctx))) {
            i++;
            continue;
        }
        irb_set_operand(b, u.user, u.k, to); /* removes uses[i]: the next one moves into place */
        count++;
    }
    return count + replace_results(b, from, to, keep, ctx);
}
