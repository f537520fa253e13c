/* buckets.c - the gradient buckets of a distributed step (netc --distributed), and their part
 * of --report; and where the backward pass is done with each parameter, which the buckets and
 * the CPU's update in the backward pass (codegen/cpu.c) start from.
 *
 * Every rank sums its gradients with the others'. One sum after the backward pass would leave
 * the network idle while the arithmetic waits, and the arithmetic idle while the network works;
 * instead the flat gradient buffer is cut into buckets, and each bucket's sum starts as soon as
 * the backward pass has written its last gradient, while the pass goes on. Parameters lie in
 * the buffer in the order the model declares them, which is forward order, and the backward
 * pass finishes them roughly last to first: the buckets are cut from the buffer's end, each
 * closing once it holds bucket_bytes (a parameter is never split), so the first bucket is ready
 * early and the last one, holding the first layers, at the end.
 *
 * A gradient is final at the schedule position of the node that writes it into the buffer (the
 * backends emit a fused group at or before each member's position, so the value is written by
 * then), or at the end of the pass for one the backend copies there (computed elsewhere, or a
 * parameter the loss does not read). The pass is done with a parameter once its gradient is
 * final and the last node reading it, directly or through views, has run (the memory plan's
 * last_use, which counts a fused group's reads until its last position).
 */
#include <stdlib.h>

#include "passes.h"

int grad_final_at(const IrGraph *g, const IrParam *p, const int *pos) {
    if (!p->grad) return g->n;
    const IrNode *r = ir_storage_root(p->grad);
    if (r->storage != ST_GRAD || r->offset != p->grad_offset) return g->n; /* copied at the end */
    return pos[p->grad->id] > pos[r->id] ? pos[p->grad->id] : pos[r->id];
}

int param_done_at(const IrGraph *g, const IrParam *p, const int *pos) {
    int at = grad_final_at(g, p, pos);
    return p->node->last_use > at ? p->node->last_use : at;
}

/* Why no parameter of g can be updated in the backward pass, or NULL when some may be. */
static const char *in_backward_refused(const IrGraph *g) {
    const IrTrain *t = &g->train;
    if (!rt_optimizer(t->optim)->range_fn) return "its optimizer needs whole tensors' norms first";
    if (t->clip_grad_norm > 0) return "clip_grad_norm needs every gradient first";
    if (g->distributed || g->shard_optimizer) return "the gradients are summed over the ranks first";
    return NULL;
}

int *in_backward_positions(const IrGraph *g, int64_t min_floats) {
    if (in_backward_refused(g)) return NULL;
    int *pos = schedule_positions(g);
    int *at = xmalloc(((size_t)g->n_params + 1) * sizeof *at), any = 0;
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        at[i] = -1;
        if (!p->trainable || p->grad_offset < 0 || ir_numel(&p->node->shape) < min_floats) continue;
        if (p->offset != p->grad_offset) ICE("in_backward: %s's gradient is not at its parameter's offset", p->name);
        int done = param_done_at(g, p, pos);
        if (done >= g->n_fwd && done < g->n) at[i] = done, any = 1;
    }
    /* the update tests the loss, defined in the forward pass */
    if (pos[g->loss->id] >= g->n_fwd) any = 0;
    free(pos);
    if (!any) free(at);
    return any ? at : NULL;
}

void in_backward_report(const IrGraph *g, int64_t min_floats, FILE *out) {
    const char *why = in_backward_refused(g);
    int *at = why ? NULL : in_backward_positions(g, min_floats), n = 0;
    int64_t floats = 0;
    for (int i = 0; at && i < g->n_params; i++)
        if (at[i] >= 0) n++, floats += ir_numel(&g->params[i].node->shape);
    fprintf(out, "\noptimizer: ");
    if (why) fprintf(out, "every parameter updated after the backward pass: %s\n", why);
    else fprintf(out, "%d parameter%s (%lld of %lld floats) updated in the backward pass, each as soon as the\n"
                      "  pass is done with it, the others after it (those of at least %lld floats; docs/compiler.md)\n",
                 n, n == 1 ? "" : "s", (long long)floats, (long long)g->n_grad_floats, (long long)min_floats);
    for (int i = 0; at && i < g->n_params; i++)
        if (at[i] >= 0)
            fprintf(out, "  %-40s after node %d of %d (%s)\n", g->params[i].name, at[i], g->n,
                    ir_op_name(g->nodes[at[i]]->op));
    free(at);
}

int *schedule_positions(const IrGraph *g) {
    int max_id = 0;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->id > max_id) max_id = g->nodes[i]->id;
    int *pos = calloc((size_t)max_id + 1, sizeof *pos);
    if (!pos) ICE("out of memory");
    for (int i = 0; i < g->n; i++) pos[g->nodes[i]->id] = i;
    return pos;
}

static int by_offset_desc(const void *a, const void *b) {
    const IrParam *x = *(const IrParam *const *)a, *y = *(const IrParam *const *)b;
    return (x->grad_offset < y->grad_offset) - (x->grad_offset > y->grad_offset);
}

int dist_buckets(IrGraph *g, int64_t bucket_bytes) {
    g->distributed = 1;
    g->bucket_bytes = bucket_bytes;
    int *pos = schedule_positions(g);
    const IrParam **order = calloc((size_t)g->n_params + 1, sizeof *order);
    if (!order) ICE("buckets: out of memory");
    int n = 0;
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].trainable && g->params[i].grad_offset >= 0) order[n++] = &g->params[i];
    qsort(order, (size_t)n, sizeof *order, by_offset_desc);
    g->buckets = arena_alloc(g->arena, (size_t)(n + 1) * sizeof *g->buckets);
    g->n_buckets = 0;
    IrBucket *b = NULL;
    for (int i = 0; i < n; i++) {
        const IrParam *p = order[i];
        int64_t floats = ir_numel(&p->node->shape);
        if (!b || b->count * 4 >= bucket_bytes) {
            b = &g->buckets[g->n_buckets++];
            *b = (IrBucket){.offset = p->grad_offset + floats, .ready = -1};
        }
        if (p->grad_offset + floats != b->offset) ICE("buckets: the gradient buffer has a hole before %s", p->name);
        b->offset = p->grad_offset, b->count += floats;
        int at = grad_final_at(g, p, pos);
        if (at > b->ready) b->ready = at;
    }
    free(pos);
    free(order);
    return g->n_buckets;
}

/* Bus bandwidths a user may meet, bytes/s: what nccl-tests reports as busbw, so that a sum of
 * S bytes over N ranks takes S * 2 (N - 1) / N / busbw seconds (a ring: each rank sends and
 * receives that much). */
static const struct {
    const char *name;
    double busbw;
} links[] = {
    {"NVLink (H100 SXM, 8 GPUs, ~370 GB/s)", 370e9},
    {"InfiniBand NDR 400 Gb/s (~48 GB/s)", 48e9},
    {"Ethernet 100 Gb/s (~12 GB/s)", 12e9},
};

void dist_report(const IrGraph *g, FILE *out) {
    if (!g->distributed) return;
    int64_t floats = 0;
    for (int k = 0; k < g->n_buckets; k++) floats += g->buckets[k].count;
    double bytes = 4.0 * (double)floats;
    fprintf(out, "\ndistributed: the gradients are summed over the ranks in %d bucket%s of about %.3g MiB\n",
            g->n_buckets, g->n_buckets == 1 ? "" : "s", (double)g->bucket_bytes / 1048576.0);
    fprintf(out, "  %-8s %14s %10s  %s\n", "bucket", "floats", "MiB", "ready after");
    for (int k = 0; k < g->n_buckets; k++) {
        const IrBucket *b = &g->buckets[k];
        char where[64];
        if (b->ready >= g->n) snprintf(where, sizeof where, "the backward pass");
        else snprintf(where, sizeof where, "node %d of %d (%s)", b->ready, g->n, ir_op_name(g->nodes[b->ready]->op));
        fprintf(out, "  %-8d %14lld %10.3f  %s\n", k, (long long)b->count, 4.0 * (double)b->count / 1048576.0, where);
    }
    double step_flop = 6.0 * (double)ir_forward_macs(g) * (double)g->batch; /* forward 2 per mult-add, backward twice that */
    fprintf(out, "  per step and rank: %.4g MB of gradients summed; %.4g GFLOP of arithmetic (batch %lld)\n",
            bytes / 1e6, step_flop / 1e9, (long long)g->batch);
    fprintf(out, "  time to sum them (each rank sends and receives 2(N-1)/N of them):\n");
    fprintf(out, "    %-40s %12s %12s %12s\n", "bus bandwidth", "2 ranks", "8 ranks", "64 ranks");
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        fprintf(out, "    %-40s", links[i].name);
        static const int ranks[] = {2, 8, 64};
        for (int r = 0; r < 3; r++)
            fprintf(out, " %9.3f ms", 1e3 * bytes * 2.0 * (ranks[r] - 1) / ranks[r] / links[i].busbw);
        fprintf(out, "\n");
    }
    fprintf(out, "  the sums overlap the backward pass (about 2/3 of the step's arithmetic); scaling stops where\n"
                 "  they take longer than it: compare the times above with the step's measured time\n");
    if (g->shard_optimizer)
        fprintf(out, "  --shard-optimizer: each bucket's sum is scattered (each rank receives its 1/N of it) and the\n"
                     "  updated parameters gathered after the step, the same bytes as the sums above; each rank\n"
                     "  updates 1/N of the %lld trainable floats and keeps only their optimizer state\n",
                (long long)g->n_grad_floats);
    if (g->shard_optimizer && rt_optimizer(g->train.optim)->apply_fn) {
        int tensors = 0;
        for (int i = 0; i < g->n_params; i++) tensors += g->params[i].trainable;
        int64_t pieces = 0; /* the GPU trainer's: 4096 floats each (codegen/cuda.c) */
        for (int i = 0; i < g->n_params; i++)
            if (g->params[i].trainable) pieces += (ir_numel(&g->params[i].node->shape) + 4095) / 4096;
        fprintf(out, "  %s: each tensor's trust ratio needs its norms from every rank's slices: one blocking sum of\n"
                     "  %d doubles per step (a GPU trainer: %lld, two per piece of 4096 floats)\n",
                rt_optimizer(g->train.optim)->name, 2 * tensors, (long long)(2 * pieces));
    }
    int layers = 0;
    int64_t channels = 0;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->op == OP_BN_STATS && !g->nodes[i]->attr.bn_frozen)
            layers++, channels += g->nodes[i]->shape.dim[1];
    if (!layers) return;
    if (g->sync_bn)
        fprintf(out, "  batch norm (--sync-bn): %d layer%s summed over the ranks in %d blocking sums per step (each\n"
                     "  layer's mean, variance and backward sums), %lld doubles in all, each a round trip between ranks\n",
                layers, layers == 1 ? "" : "s", 3 * layers, (long long)(4 * channels));
    else
        fprintf(out, "  batch norm: %d layer%s normalise with each rank's own batch (--sync-bn sums the statistics over\n"
                     "  the ranks); the running statistics are rank 0's\n", layers, layers == 1 ? "" : "s");
}
