/* rt_dist.c - what rt_main does differently when it runs as one of several ranks (netc
 * --distributed; docs/distributed.md), through the trainer's RtComm.
 *
 * Global batch g is samples [g*B*N, (g+1)*B*N) of the epoch's order, the same order on every rank;
 * rank r takes the r-th B of them. Every rank sums its gradients with the others' (in buckets,
 * as the backward pass finishes them) and divides by N, so each holds the gradient of the mean
 * loss over the global batch, and the same update keeps the ranks' parameters equal. With
 * --accumulate K an optimizer step takes K such global batches: each rank sums its K batches'
 * gradients first (the last one's buckets as they are written), the ranks then theirs, and the
 * sum is divided by N K. A trainer without RtComm is one rank, and every function here leaves it
 * as it was.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

int rt_dist_open(RtDist *d, const RtModel *m, int *argc, char ***argv, int eval_rank) {
    *d = (RtDist){.comm = m->comm, .m = m, .rank = 0, .ranks = 1};
    if (!d->comm) return 0;
    char why[512] = "";
    if (d->comm->open(argc, argv, eval_rank, &d->rank, &d->ranks, &d->local_rank, &d->evaluator, why, sizeof why)) {
        fprintf(stderr, "error: this trainer is distributed (netc --distributed) and could not join its job "
                        "through %s: %s\n", d->comm->name, why);
        return 1;
    }
    return 0;
}

void rt_grads_add(float *g, const float *acc, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; i++) g[i] += acc[i];
}

void rt_grads_ready(RtCtx *ctx, int k) {
    RtDist *d = ctx->dist;
    if (!d || ctx->micro_left) return; /* --accumulate: summed with the step's last batch */
    const RtBucket *b = &d->m->buckets[k];
    if (ctx->accum) rt_grads_add(ctx->grads + b->offset, ctx->accum + b->offset, b->count);
    if (d->m->shard_optimizer) /* only this rank's slice of the sum */
        d->comm->start_sum_scatter(ctx->grads + b->offset, d->counts + k * d->ranks, d->shard.grads + d->slices[k].at);
    else d->comm->start_sum(ctx->grads + b->offset, b->count);
}

void rt_dist_mean_grads(RtDist *d, RtCtx *ctx, int accumulate) {
    if (d->ranks > 1) d->wait_s += d->comm->wait_sums("summing the gradients");
    else if (accumulate > 1) rt_grads_add(ctx->grads, ctx->accum, d->m->n_grad_floats); /* no bucket sum added it */
    else return;
    float scale = 1.0f / (float)(d->ranks * accumulate), *g = d->m->shard_optimizer ? d->shard.grads : ctx->grads;
    int64_t n = d->m->shard_optimizer ? d->shard.floats : d->m->n_grad_floats;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] *= scale;
}

int64_t rt_shard_slices(const RtModel *m, int rank, int ranks, RtSlice *slices) {
    int64_t at = 0;
    /* the buckets lie last to first in the buffer (netc cuts them from its end): the slices in
     * the buffer's order, so that one rank's are the whole buffer in place */
    for (int k = m->n_buckets - 1; k >= 0; k--) { /* rank r: floats [count * r / R, count * (r + 1) / R) */
        const RtBucket *b = &m->buckets[k];
        int64_t lo = b->count * rank / ranks, hi = b->count * (rank + 1) / ranks;
        slices[k] = (RtSlice){b->offset + lo, hi - lo, at};
        at += hi - lo;
    }
    return at;
}

int64_t rt_shard_table(const RtModel *m, const RtRanks *ranks, long long *table) {
    int nb = m->n_buckets, in_job = ranks && ranks->comm;
    RtSlice *slices = rt_alloc(((size_t)nb + 1) * sizeof *slices, "the optimizer's slices");
    int64_t floats = rt_shard_slices(m, in_job ? ranks->rank : 0, in_job ? ranks->ranks : 1, slices);
    for (int k = 0; k < nb; k++)
        table[3 * k] = slices[k].offset, table[3 * k + 1] = slices[k].count, table[3 * k + 2] = slices[k].at;
    table[3 * nb] = floats;
    free(slices);
    return floats;
}

int64_t rt_dist_shard_open(RtDist *d, RtCtx *ctx) {
    const RtModel *m = d->m;
    int nb = m->n_buckets, R = d->ranks;
    ctx->shard = &d->shard;
    if (R == 1) { /* the whole buffer: the update of the plain trainer, in the same order */
        d->slices = rt_alloc(sizeof *d->slices, "the optimizer's slices");
        d->slices[0] = (RtSlice){0, m->n_grad_floats, 0};
        d->shard = (RtShard){.floats = m->n_grad_floats, .n_slices = 1, .slices = d->slices, .grads = ctx->grads};
        return m->n_grad_floats;
    }
    d->slices = rt_alloc((size_t)nb * sizeof *d->slices, "the optimizer's slices");
    d->counts = rt_alloc((size_t)nb * R * sizeof *d->counts, "the optimizer's slices");
    d->displs = rt_alloc((size_t)nb * R * sizeof *d->displs, "the optimizer's slices");
    for (int k = 0; k < nb; k++) {
        const RtBucket *b = &m->buckets[k];
        if (b->count / R >= INT32_MAX) {
            fprintf(stderr, "error: gradient bucket %d holds %lld floats, too many for MPI's counts in %d slices\n"
                            "  hint: netc --bucket-kib with a smaller size\n", k, (long long)b->count, R);
            exit(1);
        }
    }
    for (int r = 0; r < R; r++) { /* every rank's slices, as counts and displacements in the buckets */
        rt_shard_slices(m, r, R, d->slices);
        for (int k = 0; k < nb; k++)
            d->counts[k * R + r] = (int)d->slices[k].count,
            d->displs[k * R + r] = (int)(d->slices[k].offset - m->buckets[k].offset);
    }
    int64_t at = rt_shard_slices(m, d->rank, R, d->slices);
    d->shard = (RtShard){.floats = at, .n_slices = nb, .slices = d->slices,
                         .grads = rt_alloc((size_t)at * sizeof(float), "this rank's gradients")};
    return at;
}

double rt_shard_grad_norm(RtCtx *ctx) {
    const RtShard *sh = ctx->shard;
    double sq = rt_grad_sumsq(sh->grads, sh->floats);
    if (ctx->dist) rt_dist_sum(ctx->dist, &sq, 1, "summing the gradient norm");
    return sqrt(sq);
}

void rt_dist_gather_params(RtDist *d, float *params) {
    if (d->ranks == 1) return;
    for (int k = 0; k < d->m->n_buckets; k++)
        d->comm->start_gather(params + d->m->buckets[k].offset, d->counts + k * d->ranks, d->displs + k * d->ranks);
    d->wait_s += d->comm->wait_sums("gathering the updated parameters");
}

/* Slot s of the state of rank r's slices of bucket k: at rank r's float `at` of slot s. The
 * state of each rank lies slot after slot, [slots, its floats]. */
void rt_dist_gather_state(RtDist *d, const float *mine, float *full) {
    const RtModel *m = d->m;
    int R = d->ranks, slots = m->n_state_slots;
    if (!slots) return; /* SGD without momentum keeps no state */
    int *counts = rt_alloc((size_t)R * 2 * sizeof *counts, "gathering the optimizer state"), *displs = counts + R;
    RtSlice *slices = rt_alloc((size_t)m->n_buckets * sizeof *slices, "gathering the optimizer state");
    int64_t total = 0;
    for (int r = 0; r < R; r++) { /* rank r's floats: its share of every bucket */
        int64_t n = 0;
        for (int k = 0; k < m->n_buckets; k++) n += d->counts[k * R + r];
        if (n * slots >= INT32_MAX) {
            fprintf(stderr, "error: rank %d's optimizer state (%lld floats) is too large for MPI's counts\n", r,
                    (long long)(n * slots));
            exit(1);
        }
        counts[r] = (int)(n * slots), displs[r] = (int)total;
        total += n * slots;
    }
    float *packed = d->rank == 0 ? rt_alloc((size_t)total * sizeof *packed, "gathering the optimizer state") : NULL;
    d->wait_s += d->comm->gather_root(mine, (int)(d->shard.floats * slots), packed, counts, displs,
                                      "gathering the optimizer state");
    if (packed) {
        int64_t n_grad = m->n_grad_floats;
        for (int r = 0; r < R; r++) {
            const float *p = packed + displs[r];
            int64_t floats = rt_shard_slices(m, r, R, slices);
            for (int k = 0; k < m->n_buckets; k++)
                for (int s = 0; s < slots; s++)
                    memcpy(full + s * n_grad + slices[k].offset, p + s * floats + slices[k].at,
                           (size_t)slices[k].count * sizeof *full);
        }
        free(packed);
    }
    free(slices), free(counts);
}

void rt_dist_take_state(const RtDist *d, const float *full, float *mine) {
    const RtShard *sh = &d->shard;
    for (int s = 0; s < d->m->n_state_slots; s++)
        for (int k = 0; k < sh->n_slices; k++)
            memcpy(mine + s * sh->floats + sh->slices[k].at, full + s * d->m->n_grad_floats + sh->slices[k].offset,
                   (size_t)sh->slices[k].count * sizeof *mine);
}

double rt_dist_sum(RtDist *d, double *x, int n, const char *what) {
    if (d->ranks == 1) return 0;
    double s = d->comm->sum(x, n, what);
    d->wait_s += s;
    return s;
}

void rt_dist_shard(const RtDist *d, const int64_t *order, int64_t n_batches, int64_t batch, int64_t *local) {
    for (int64_t g = 0; g < n_batches; g++)
        memcpy(local + g * batch, order + (g * d->ranks + d->rank) * batch, (size_t)batch * sizeof *local);
}

void rt_dist_share_buffers(RtDist *d, float *params) {
    if (d->ranks == 1) return;
    const RtModel *m = d->m;
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].buffer) n += rt_param_numel(&m->params[i]);
    if (!n) return;
    double *v = rt_alloc((size_t)n * sizeof *v, "sharing the running statistics between the ranks");
    /* rank 0's values plus zeros from every other rank: rank 0's values, exactly */
    for (int pass = 0; pass < 2; pass++) {
        int64_t at = 0;
        for (int i = 0; i < m->n_params; i++) {
            const RtParam *p = &m->params[i];
            if (!p->buffer) continue;
            float *x = params + p->offset;
            for (int64_t k = 0, c = rt_param_numel(p); k < c; k++, at++)
                if (pass == 0) v[at] = d->rank == 0 ? x[k] : 0.0;
                else x[k] = (float)v[at];
        }
        if (pass == 0) rt_dist_sum(d, v, (int)n, "sharing rank 0's running statistics");
    }
    free(v);
}

/* FNV-1a over the bytes: equal parameters give equal hashes; different ones almost surely not. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int rt_dist_same_params(RtDist *d, const float *params, const char *when) {
    if (d->ranks == 1) return 1;
    uint64_t h = hash_bytes(params, (size_t)d->m->n_param_floats * sizeof *params);
    if (d->comm->agree(h, "comparing the ranks' parameters")) return 1;
    fprintf(stderr, "error: rank %d: the ranks hold different parameters %s\n", d->rank, when);
    return 0;
}

int rt_dist_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    return CPU_COUNT(&set);
}

void rt_dist_close(RtDist *d, int status, int together) {
    if (d->comm) d->comm->close(status, together);
    if (d->shard.grads && d->ranks > 1) free(d->shard.grads);
    free(d->slices), free(d->counts), free(d->displs);
    d->slices = NULL, d->counts = d->displs = NULL, d->shard = (RtShard){0};
}
