/* memplan.c - the static memory plan: where every value of the training step lives.
 *
 * Requires: a differentiated graph (autodiff has run), nodes in schedule order.
 * Guarantees: every node has a storage class and offset:
 *   - parameters in one flat f32 buffer, trainable ones first in declaration order, so that
 *     grads[i] belongs to params[i] and the optimizer is one loop over [0, n_grad_floats); the
 *     trainable ones without weight decay (no_decay) after the others, so each of the two
 *     parameter groups is one range, [0, n_decay_floats) and [n_decay_floats, n_grad_floats);
 *     frozen ones after them, those a device keeps in half (netc --frozen-half) last, the
 *     final n_half_params values;
 *   - a trainable parameter's gradient node (or the node a view chain over it reads) is written
 *     straight into the gradient buffer when it can be (computed by its own backward kernel,
 *     not already the gradient of another parameter); otherwise the backend copies it there
 *     at the end of the backward pass;
 *   - inputs in the runtime's batch buffers, scalar constants (and views of them) inline, other
 *     views alias their operand; folded nodes (views.c) have none, and what they read lives
 *     until their readers have run;
 *   - everything else at a 64-byte aligned offset in one arena, from liveness over the schedule
 *     (greedy best fit, largest first; in graphs of more than BEST_FIT_MAX buffers, first fit
 *     in schedule order, which takes n log n time), so values whose lifetimes do not overlap
 *     share bytes.
 *   The evaluation step runs a prefix of the schedule with the same offsets; a prefix of a
 *   valid plan is valid.
 * Invalidates: nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { ALIGN = 64 };


/* The group of the flat buffer a parameter belongs to, in the order they are placed: frozen
 * parameters kept in half (autocast_half's frozen_half) last, so that the device's float32
 * parameters are one prefix of the host's flat buffer. */
enum { GROUP_DECAY, GROUP_NO_DECAY, GROUP_FROZEN, GROUP_FROZEN_HALF, N_GROUPS };

static int param_group(const IrParam *p) {
    if (!p->trainable) return p->node->dtype == DT_F32 ? GROUP_FROZEN : GROUP_FROZEN_HALF;
    return p->no_decay ? GROUP_NO_DECAY : GROUP_DECAY;
}

static void place_params(IrGraph *g) {
    int64_t off = 0, half_from = 0;
    g->n_grad_floats = g->n_decay_floats = 0;
    for (int group = 0; group < N_GROUPS; group++) {
        for (int i = 0; i < g->n_params; i++) {
            IrParam *p = &g->params[i];
            if (param_group(p) != group) continue;
            p->offset = off;
            p->node->storage = ST_PARAM;
            p->node->offset = off;
            p->grad_offset = p->trainable ? off : -1;
            off += ir_numel(&p->node->shape);
        }
        if (group == GROUP_DECAY) g->n_decay_floats = off;
        if (group == GROUP_NO_DECAY) g->n_grad_floats = off;
        if (group == GROUP_FROZEN) half_from = off;
    }
    g->n_param_floats = off;
    g->n_half_params = off - half_from;
}

/* The node whose storage would hold p's gradient: the gradient node itself, or the node a
 * chain of views over it reads (a bias gradient is often SUM_TO [C,1,1] reshaped to [C]).
 * It may live in the gradient buffer if its own kernel computes it in the backward pass and
 * no other parameter's gradient has claimed it; otherwise NULL, and the backend copies the
 * gradient into place at the end of the backward pass. */
static IrNode *grad_home(IrParam *p) {
    IrNode *n = p->grad;
    for (; n && ir_op_kind(n->op) == OPK_VIEW; n = n->in[0])
        if (n->op == OP_ROW || n->op == OP_PART) return NULL; /* a part of a larger buffer: copied */
    if (!n || n->storage != ST_NONE || n->phase != PHASE_BWD) return NULL;
    if (ir_op_kind(n->op) == OPK_SOURCE || n->dtype != DT_F32) return NULL;
    return n;
}

static void classify(IrGraph *g) {
    for (int i = 0; i < g->n_params; i++) {
        IrParam *p = &g->params[i];
        IrNode *home = p->trainable ? grad_home(p) : NULL;
        if (home) {
            home->storage = ST_GRAD;
            home->offset = p->grad_offset;
        }
    }
    for (int i = 0; i < g->n; i++) {
        IrNode *n = g->nodes[i];
        if (n->storage != ST_NONE) continue;
        if (n->internal) {
            n->storage = ST_FUSED;
            continue;
        }
        if (n->folded) { /* its readers read its operands */
            n->storage = ST_FOLDED;
            continue;
        }
        switch (n->op) {
        case OP_INPUT: n->storage = ST_INPUT; break;
        case OP_CONST: n->storage = ST_INLINE; break;
        case OP_LOSS_SCALE: n->storage = ST_STATE; break;
        default:
            if (ir_op_kind(n->op) != OPK_VIEW) n->storage = ST_ARENA;
            else n->storage = n->in[0]->storage == ST_INLINE ? ST_INLINE : ST_ALIAS; /* a view of a constant is one */
        }
    }
}

static void keep_to_end(IrGraph *g, IrNode *n) {
    for (; n; n = n->storage == ST_ALIAS ? n->in[0] : NULL) n->last_use = g->n;
}

/* The evaluation step copies the model's output out after its last forward node. */
static void keep_to_forward_end(IrGraph *g, IrNode *n) {
    for (; n; n = n->storage == ST_ALIAS ? n->in[0] : NULL)
        if (n->last_use < g->n_fwd) n->last_use = g->n_fwd;
}

/* A read of r at position `at` keeps r alive until then, and through views what they read:
 * an alias's operand, and every operand of a folded node, which its readers read in place. */
static void read_until(IrNode *r, int at) {
    if (r->last_use < at) r->last_use = at;
    if (r->storage == ST_ALIAS) read_until(r->in[0], at);
    else if (r->storage == ST_FOLDED)
        for (int k = 0; k < r->n_in; k++) read_until(r->in[k], at);
}

/* first_use = defining position; last_use = last position reading it (through views).
 * A fused group runs as one loop over all its positions, so its members are defined at the
 * group's first position and everything they read is read until its last: no member's output
 * can then share bytes with a value a later member still reads at another index. */
static void liveness(IrGraph *g) {
    int *first = xmalloc(((size_t)g->n_groups + 1) * sizeof *first);
    int *last = xmalloc(((size_t)g->n_groups + 1) * sizeof *last);
    for (int i = g->n - 1; i >= 0; i--) first[g->nodes[i]->group] = i;
    for (int i = 0; i < g->n; i++) last[g->nodes[i]->group] = i;
    /* a matrix product and its epilogue group run interleaved, block by block: one span */
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->epilogue) first[g->nodes[i]->epilogue] = i;
    int *lo = xmalloc(((size_t)g->n + 1) * sizeof *lo), *hi = xmalloc(((size_t)g->n + 1) * sizeof *hi);
    for (int i = 0; i < g->n; i++) {
        int grp = g->nodes[i]->group ? g->nodes[i]->group : g->nodes[i]->epilogue;
        lo[i] = grp ? first[grp] : i;
        hi[i] = grp ? last[grp] : i;
        if (g->nodes[i]->fused_into) lo[i] = first[g->nodes[i]->fused_into]; /* computed in that loop */
    }
    free(first);
    free(last);
    for (int i = 0; i < g->n; i++) g->nodes[i]->first_use = g->nodes[i]->last_use = lo[i];
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) read_until(g->nodes[i]->in[k], hi[i]);
    free(lo);
    free(hi);
    /* the step reads the loss and accuracy at its end; the copies into the gradient buffer
     * also run at the end */
    keep_to_end(g, g->loss);
    keep_to_end(g, g->correct);
    keep_to_forward_end(g, g->output);
    for (int i = 0; i < g->n_params; i++) keep_to_end(g, g->params[i].grad);
}

static int64_t bytes_of(const IrNode *n) {
    int64_t b = ir_numel(&n->shape) * ir_dtype_size(n->dtype);
    return (b + ALIGN - 1) / ALIGN * ALIGN;
}

static int by_size_desc(const void *a, const void *b) {
    const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
    int64_t sx = bytes_of(x), sy = bytes_of(y);
    if (sx != sy) return sx < sy ? 1 : -1;
    return x->id - y->id;
}

static int overlaps(const IrNode *a, const IrNode *b) {
    return a->first_use <= b->last_use && b->first_use <= a->last_use;
}

static int by_offset(const void *a, const void *b) {
    const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Lowest offset where `n` fits beside every placed buffer whose lifetime overlaps its own:
 * sweep the conflicting buffers in address order and take the first gap that is big enough. */
static int64_t best_offset(IrNode *n, IrNode **placed, int n_placed, IrNode **conflicts) {
    int m = 0;
    for (int i = 0; i < n_placed; i++)
        if (overlaps(n, placed[i])) conflicts[m++] = placed[i];
    qsort(conflicts, (size_t)m, sizeof *conflicts, by_offset);
    int64_t size = bytes_of(n), off = 0;
    for (int i = 0; i < m; i++) {
        if (conflicts[i]->offset >= off + size) break; /* the gap before it fits */
        int64_t end = conflicts[i]->offset + bytes_of(conflicts[i]);
        if (end > off) off = end;
    }
    return off;
}

/* Best fit, largest first: each buffer looks at every placed one, so the time grows with the
 * buffers times those live at once, quadratic in a deep network whose activations all live
 * until the backward pass. Every model in models/ has a few hundred; above this many buffers
 * the plan is made in schedule order instead (place_in_order). */
enum { BEST_FIT_MAX = 4096 };

static void place_best_fit(IrNode **todo, int n) {
    IrNode **conflicts = xmalloc((size_t)(n + 1) * sizeof *conflicts);
    qsort(todo, (size_t)n, sizeof *todo, by_size_desc);
    for (int i = 0; i < n; i++) todo[i]->offset = best_offset(todo[i], todo, i, conflicts);
    free(conflicts);
}

static int by_first_use(const void *a, const void *b) {
    const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
    return x->first_use != y->first_use ? (x->first_use < y->first_use ? -1 : 1) : x->id - y->id;
}

static int by_last_use(const void *a, const void *b) {
    const IrNode *x = *(IrNode *const *)a, *y = *(IrNode *const *)b;
    return x->last_use != y->last_use ? (x->last_use < y->last_use ? -1 : 1) : x->id - y->id;
}

typedef struct Gap {
    int64_t offset, size;
} Gap;

/* Return [offset, offset + size) to the address-ordered gaps, merged with its neighbours. */
static void free_range(Gap *gaps, int *n_gaps, int64_t offset, int64_t size) {
    int lo = 0, hi = *n_gaps;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (gaps[mid].offset < offset) lo = mid + 1;
        else hi = mid;
    }
    int merge_prev = lo > 0 && gaps[lo - 1].offset + gaps[lo - 1].size == offset;
    int merge_next = lo < *n_gaps && offset + size == gaps[lo].offset;
    if (merge_prev && merge_next) {
        gaps[lo - 1].size += size + gaps[lo].size;
        memmove(gaps + lo, gaps + lo + 1, (size_t)(*n_gaps - lo - 1) * sizeof *gaps);
        (*n_gaps)--;
    } else if (merge_prev) {
        gaps[lo - 1].size += size;
    } else if (merge_next) {
        gaps[lo].offset = offset, gaps[lo].size += size;
    } else {
        memmove(gaps + lo + 1, gaps + lo, (size_t)(*n_gaps - lo) * sizeof *gaps);
        gaps[lo] = (Gap){offset, size};
        (*n_gaps)++;
    }
}

/* A linear-scan plan for large graphs: buffers in schedule order, each in the lowest free gap
 * that holds it (else on top), and released once the schedule is past its last use. The time
 * is the sorts plus the free gaps walked, which stay few: buffers freed side by side merge. */
static void place_in_order(IrNode **todo, int n) {
    IrNode **by_end = xmalloc((size_t)(n + 1) * sizeof *by_end);
    Gap *gaps = xmalloc((size_t)(n + 1) * sizeof *gaps);
    memcpy(by_end, todo, (size_t)n * sizeof *todo);
    qsort(todo, (size_t)n, sizeof *todo, by_first_use);
    qsort(by_end, (size_t)n, sizeof *by_end, by_last_use);
    int n_gaps = 0, freed = 0;
    int64_t top = 0;
    for (int i = 0; i < n; i++) {
        IrNode *x = todo[i];
        /* closed lifetimes: a buffer last read where x is defined still overlaps it */
        for (; freed < n && by_end[freed]->last_use < x->first_use; freed++)
            free_range(gaps, &n_gaps, by_end[freed]->offset, bytes_of(by_end[freed]));
        int64_t size = bytes_of(x);
        int k = 0;
        while (k < n_gaps && gaps[k].size < size) k++;
        if (k < n_gaps) {
            x->offset = gaps[k].offset;
            gaps[k].offset += size, gaps[k].size -= size;
            if (!gaps[k].size) memmove(gaps + k, gaps + k + 1, (size_t)(--n_gaps - k) * sizeof *gaps);
        } else {
            x->offset = top;
            top += size;
        }
    }
    free(by_end);
    free(gaps);
}

/* The value whose bytes n's kernel may write its result over, or NULL. The target names the
 * operand (in_place: -1 for none); it is taken when that operand reads a whole arena buffer of
 * n's size, directly or through reshapes, row-major like n (a reshape of a row-major value is
 * row-major), that nothing reads after n: the kernel then reads each element before it writes
 * the same one, so the two share one buffer. */
static IrNode *in_place_of(const IrNode *n, int (*in_place)(const IrNode *)) {
    int k = in_place && n->storage == ST_ARENA ? in_place(n) : -1;
    if (k < 0 || !ir_stored_as(n, LAYOUT_ROW_MAJOR)) return NULL;
    IrNode *r = n->in[k];
    for (; r->storage == ST_ALIAS; r = r->in[0])
        if (r->op != OP_RESHAPE) return NULL;
    if (!ir_stored_as(r, LAYOUT_ROW_MAJOR)) return NULL;
    if (r->storage != ST_ARENA || bytes_of(r) != bytes_of(n) || r->last_use != n->first_use) return NULL;
    return r;
}

/* Buffers a kernel writes in place join the buffer they overwrite: one lifetime, placed once
 * (host[i] is the node whose offset node i takes, itself when it has its own). */
static void place_arena(IrGraph *g, int (*in_place)(const IrNode *)) {
    IrNode **todo = xmalloc((size_t)(g->n + 1) * sizeof *todo), **host = xmalloc((size_t)(g->n + 1) * sizeof *host);
    int *own_end = xmalloc((size_t)(g->n + 1) * sizeof *own_end);
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *x = g->nodes[i], *over = in_place_of(x, in_place);
        host[i] = over ? host[over->id] : x;
        own_end[i] = x->last_use;
        if (over) host[i]->last_use = x->last_use; /* x is the host's last user: the span ends with x's */
        else if (x->storage == ST_ARENA) todo[n++] = x;
    }
    if (n <= BEST_FIT_MAX) place_best_fit(todo, n);
    else place_in_order(todo, n);
    g->arena_bytes = g->unplanned_bytes = 0;
    for (int i = 0; i < g->n; i++) {
        IrNode *x = g->nodes[i];
        if (x->storage != ST_ARENA) continue;
        x->offset = host[i]->offset;
        x->last_use = own_end[i];
        int64_t end = x->offset + bytes_of(x);
        if (end > g->arena_bytes) g->arena_bytes = end;
        g->unplanned_bytes += bytes_of(x);
    }
    free(todo);
    free(host);
    free(own_end);
}

/* The largest per-thread scratch any node's kernel needs, as the target sizes it. */
static void size_scratch(IrGraph *g, int64_t (*node_scratch)(const IrNode *)) {
    g->scratch_per_thread = 0;
    for (int i = 0; node_scratch && i < g->n; i++) {
        int64_t s = node_scratch(g->nodes[i]);
        if (s > g->scratch_per_thread) g->scratch_per_thread = s;
    }
}

void mp_plan(IrGraph *g, int64_t (*node_scratch)(const IrNode *), int (*in_place)(const IrNode *)) {
    ir_renumber(g);
    for (int i = 0; i < g->n; i++) g->nodes[i]->storage = ST_NONE;
    place_params(g);
    classify(g);
    liveness(g);
    place_arena(g, in_place);
    size_scratch(g, node_scratch);
}

static const char *storage_name(IrStorage s) {
    static const char *const names[] = {
        [ST_NONE] = "none",   [ST_ARENA] = "arena", [ST_INPUT] = "input", [ST_PARAM] = "param",
        [ST_GRAD] = "grad",   [ST_ALIAS] = "alias", [ST_INLINE] = "inline", [ST_FUSED] = "fused",
        [ST_STATE] = "state", [ST_FOLDED] = "folded",
    };
    return names[s];
}

/* One line per planned value (constants are written into the code and have none):
 *   %7     conv2d    f32[64, 6, 28, 28]   arena   0   1204224   [7, 31]
 * offset is bytes into the arena, elements into the parameter or gradient buffer, the input
 * number, or for a view the value whose storage it shares. */
void mp_print(const IrGraph *g, FILE *out) {
    char shape[160], where[32];
    fprintf(out, "memory plan for model %s\n", g->model_name ? g->model_name : "?");
    fprintf(out, "%-7s %-18s %-4s %-22s %-7s %12s %12s  %s\n", "value", "op", "type", "shape", "storage",
            "offset", "bytes", "lifetime");
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        if (n->storage == ST_INLINE) continue;
        if (n->storage == ST_ALIAS) snprintf(where, sizeof where, "%%%d", ir_storage_root(n)->id);
        else if (n->storage == ST_INPUT) snprintf(where, sizeof where, "#%d", n->index);
        else if (n->storage == ST_STATE) snprintf(where, sizeof where, "state");
        else if (n->storage == ST_FUSED) snprintf(where, sizeof where, "g%d", n->group);
        else if (n->storage == ST_FOLDED) snprintf(where, sizeof where, "-");
        else snprintf(where, sizeof where, "%lld", (long long)n->offset);
        fprintf(out, "%%%-6d %-18s %-4s %-22s %-7s %12s %12lld  [%d, %d]\n", n->id, ir_op_name(n->op),
                ir_dtype_name(n->dtype), ir_shape_str(&n->shape, shape, sizeof shape),
                storage_name(n->storage), where,
                (long long)(ir_numel(&n->shape) * ir_dtype_size(n->dtype)), n->first_use, n->last_use);
    }
    double saved = g->unplanned_bytes ? 100.0 * (1.0 - (double)g->arena_bytes / (double)g->unplanned_bytes) : 0;
    fprintf(out, "arena: %lld bytes (without reuse: %lld bytes, saving %.1f%%)\n",
            (long long)g->arena_bytes, (long long)g->unplanned_bytes, saved);
    fprintf(out, "parameters: %lld floats (%lld bytes), %lld trainable\n", (long long)g->n_param_floats,
            (long long)g->n_param_floats * 4, (long long)g->n_grad_floats);
    if (g->n_half_params)
        fprintf(out, "frozen parameters kept in half on the device: the last %lld (%lld bytes there)\n",
                (long long)g->n_half_params, (long long)g->n_half_params * 2);
    fprintf(out, "gradients: %lld floats (%lld bytes)\n", (long long)g->n_grad_floats,
            (long long)g->n_grad_floats * 4);
    fprintf(out, "kernel scratch: %lld floats per thread\n", (long long)g->scratch_per_thread);
}
