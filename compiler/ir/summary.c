/* summary.c - netc --summary: the forward graph as a table of layers, as torchinfo and Keras
 * print a model: each layer's output shape, parameters and multiply-adds, then the totals.
 *
 * A layer is a run of consecutive forward nodes. A node that reads a parameter belongs to the
 * layer the parameter's name gives (`conv1` of `conv1.weight`, `layer1.0.bn1` of
 * `layer1.0.bn1.running_var`); a node that reads none joins the layer before it when it comes
 * from the same .net expression (a dense layer's bias add), and otherwise is a layer of its own
 * named after its operator (relu, maxpool2d, add, reshape for flatten). The loss and the metrics
 * (the nodes of the lines that define them) are not layers.
 *
 * Multiply-adds are counted per sample for the products, as fvcore and the papers count them:
 * a convolution's output elements times its input channels per group times the kernel's size,
 * a matrix product's output elements times its inner size, attention's two products (q k^T and
 * P v, all of them even where causal masking leaves half out, as fvcore). Element-wise work, pooling and
 * normalisation count 0 (torchinfo also counts one per bias and batch-norm weight element per
 * output position). FLOPs are twice the multiply-adds.
 */
#include <string.h>

#include "ir.h"

typedef struct Layer {
    char name[128];
    const IrNode *first, *last; /* the first compute node and the last node of the run */
    int64_t params, macs;
} Layer;

/* The parameter a node reads, or NULL: an operand, or batch-norm statistics' running mean. */
static const IrParam *param_read(const IrGraph *g, const IrNode *n) {
    if (n->op == OP_BN_STATS) return &g->params[n->attr.stat_param];
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k]->op == OP_PARAM) return &g->params[n->in[k]->index];
    return NULL;
}

static void layer_of_param(const IrParam *p, char *buf, size_t size) {
    const char *dot = strrchr(p->name, '.');
    int len = dot ? (int)(dot - p->name) : (int)strlen(p->name);
    snprintf(buf, size, "%.*s", len, p->name);
}

static int same_loc(SrcLoc a, SrcLoc b) { return a.line == b.line && a.col == b.col; }

static int in_loss_or_metrics(const IrGraph *g, const IrNode *n) {
    return n->loc.line == g->loss->loc.line || (g->correct && n->loc.line == g->correct->loc.line);
}

/* The multiply-adds of node n over 1/share of its output (the batch for --summary's per-sample
 * counts, 1 for the whole run): a convolution's output elements (or its output gradient's) times
 * the filter's C/groups · R · S, a product's times its inner size, attention's two products. */
static int64_t macs_of(const IrNode *n, int64_t share) {
    int64_t out = ir_numel(&n->shape) / share;
    if (n->op == OP_CONV2D || n->op == OP_CONV2D_BWD_DATA) {
        const IrShape *w = &n->in[1]->shape; /* [K, C/groups, R, S] */
        int64_t dy = n->op == OP_CONV2D ? out : ir_numel(&n->in[0]->shape) / share;
        return dy * w->dim[1] * w->dim[2] * w->dim[3];
    }
    if (n->op == OP_CONV2D_BWD_FILTER) /* operands (x, dy); the result [K, C/groups, R, S] */
        return ir_numel(&n->in[1]->shape) / share * (ir_numel(&n->shape) / n->shape.dim[0]);
    if (n->op == OP_MATMUL) {
        const IrShape *a = &n->in[0]->shape;
        return out * a->dim[a->rank - (n->attr.trans_a ? 2 : 1)];
    }
    if (n->op == OP_ATTENTION || n->op == OP_ATTENTION_MASKED) { /* q k^T and P v, causal or not */
        IrShape qkv[3]; /* as [..., T|S, d|e], whatever form the operands are in */
        if (!ir_attention_qkv(n, qkv)) ICE("summary: attention with operands it cannot read");
        const IrShape *k = &qkv[1], *v = &qkv[2];
        int64_t e = v->dim[v->rank - 1], S = k->dim[k->rank - 2], d = k->dim[k->rank - 1];
        return out / e * S * (d + e);
    }
    return 0;
}

int64_t ir_node_macs(const IrNode *n) { return macs_of(n, 1); }

/* Per-sample multiply-adds of node n (see the header). */
static int64_t node_macs(const IrGraph *g, const IrNode *n) { return macs_of(n, g->batch); }

int64_t ir_forward_macs(const IrGraph *g) {
    int64_t macs = 0;
    for (int i = 0; i < g->n_fwd; i++) macs += node_macs(g, g->nodes[i]);
    return macs;
}

/* Adds the parameters n reads (each counted once, at its first reader) to the layer: every
 * parameter operand (a norm's weight and bias), not buffers. */
static void count_param(const IrGraph *g, const IrNode *n, Layer *l, char *seen) {
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k]->op != OP_PARAM) continue;
        const IrParam *p = &g->params[n->in[k]->index];
        if (p->buffer || seen[p->node->index]) continue;
        seen[p->node->index] = 1;
        l->params += ir_numel(&p->node->shape);
    }
}

/* Splits the forward nodes into layers; returns how many (at most g->n_fwd). */
static int collect(const IrGraph *g, Layer *layers, char *seen) {
    int n = 0;
    for (int i = 0; i < g->n_fwd; i++) {
        const IrNode *x = g->nodes[i];
        if (x->op == OP_INPUT || x->op == OP_PARAM || x->op == OP_CONST || in_loss_or_metrics(g, x)) continue;
        const IrParam *p = param_read(g, x);
        char name[128];
        if (p) layer_of_param(p, name, sizeof name);
        Layer *cur = n ? &layers[n - 1] : NULL;
        int joins = cur && (p ? strcmp(cur->name, name) == 0 : same_loc(cur->last->loc, x->loc));
        if (!joins) {
            cur = &layers[n++];
            *cur = (Layer){.first = x};
            snprintf(cur->name, sizeof cur->name, "%s", p ? name : ir_op_name(x->op));
        }
        if (ir_op_kind(cur->first->op) == OPK_VIEW && ir_op_kind(x->op) != OPK_VIEW) cur->first = x;
        cur->last = x;
        cur->macs += node_macs(g, x);
        count_param(g, x, cur, seen);
    }
    return n;
}

static void print_row(FILE *out, const char *name, const char *op, const char *shape, const char *params,
                      const char *macs, const char *where) {
    fprintf(out, "%-28s %-12s %-22s %12s %14s  %s\n", name, op, shape, params, macs, where);
}

void ir_summary(const IrGraph *g, FILE *out) {
    Layer *layers = arena_alloc(g->arena, (size_t)(g->n_fwd + 1) * sizeof *layers);
    char *seen = arena_alloc(g->arena, (size_t)g->n_params + 1); /* zeroed */
    int n = collect(g, layers, seen);
    fprintf(out, "model %s  batch %lld  (mult-adds per sample)\n", g->model_name, (long long)g->batch);
    print_row(out, "layer", "op", "output shape", "params", "mult-adds", "source");
    int64_t macs = 0;
    for (int i = 0; i < n; i++) {
        const Layer *l = &layers[i];
        char shape[96], params[32], m[32], where[64];
        snprintf(params, sizeof params, "%lld", (long long)l->params);
        snprintf(m, sizeof m, "%lld", (long long)l->macs);
        snprintf(where, sizeof where, "line %d", l->first->loc.line);
        print_row(out, l->name, ir_op_name(l->first->op), ir_shape_str(&l->last->shape, shape, sizeof shape),
                  params, m, where);
        macs += l->macs;
    }
    int64_t total = 0, trainable = 0;
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (p->buffer) continue;
        total += ir_numel(&p->node->shape);
        if (p->trainable) trainable += ir_numel(&p->node->shape);
    }
    fprintf(out, "total params: %lld (trainable %lld, frozen %lld)\n", (long long)total, (long long)trainable,
            (long long)(total - trainable));
    fprintf(out, "total mult-adds per sample: %lld (%.4g G); FLOPs = 2 x mult-adds = %lld\n", (long long)macs,
            (double)macs * 1e-9, (long long)(2 * macs));
}
