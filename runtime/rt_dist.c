/* rt_dist.c - what rt_main does differently when it runs as one of several ranks (netc
 * --distributed; docs/distributed.md), through the trainer's RtComm.
 *
 * Global batch g is samples [g*B*N, (g+1)*B*N) of the epoch's order, the same order on every rank;
 * rank r takes the r-th B of them. Every rank sums its gradients with the others' (in buckets,
 * as the backward pass finishes them) and divides by N, so each holds the gradient of the mean
 * loss over the global batch, and the same update keeps the ranks' parameters equal. A trainer
 * without RtComm is one rank, and every function here leaves it as it was.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

int rt_dist_open(RtDist *d, const RtModel *m, int *argc, char ***argv) {
    *d = (RtDist){.comm = m->comm, .m = m, .rank = 0, .ranks = 1};
    if (!d->comm) return 0;
    char why[512] = "";
    if (d->comm->open(argc, argv, &d->rank, &d->ranks, &d->local_rank, why, sizeof why)) {
        fprintf(stderr, "error: this trainer is distributed (netc --distributed) and could not join its job "
                        "through %s: %s\n", d->comm->name, why);
        return 1;
    }
    return 0;
}

void rt_grads_ready(RtCtx *ctx, int k) {
    RtDist *d = ctx->dist;
    if (!d) return;
    const RtBucket *b = &d->m->buckets[k];
    d->comm->start_sum(ctx->grads + b->offset, b->count);
}

void rt_dist_mean_grads(RtDist *d, RtCtx *ctx) {
    if (d->ranks == 1) return;
    d->wait_s += d->comm->wait_sums("summing the gradients");
    float scale = 1.0f / (float)d->ranks;
    int64_t n = d->m->n_grad_floats;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) ctx->grads[i] *= scale;
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
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        fprintf(stderr, "error: out of memory (%lld running statistics) sharing them between the ranks\n",
                (long long)n);
        exit(1);
    }
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
}
