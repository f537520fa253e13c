/* rt_cuda_nccl.c - libnetrt_nccl: the collectives of a distributed GPU trainer (netc
 * --distributed --backend cuda; docs/distributed.md), over NCCL. Only distributed trainers link
 * it, so plain GPU trainers need no NCCL.
 *
 * One GPU per rank, one NCCL communicator over all ranks, bootstrapped through the job's MPI
 * (rank 0's ncclUniqueId shared with RtComm.share). The collectives run on a stream of their
 * own, forked from the step's stream and joined back with events:
 *
 *     step stream:   ... dW of bucket 0 ... dW of bucket 1 ... step_loss  .-> step_end, optimizer
 *                              |                 |                |       |
 *     NCCL stream:        all-reduce 0      all-reduce 1      loss sum ---'
 *
 * so each bucket's mean over the ranks overlaps the rest of the backward pass, and the capture of
 * the step takes the whole fork and join into its CUDA Graph (NCCL supports capture: the same
 * collectives in the same order on every rank, replayed each step). The gradients' mean is one
 * ncclAvg per bucket (for float data NCCL multiplies each rank's values by 1/N, then sums: for N
 * a power of two the same bits as summing, then scaling, as the CPU trainer does). The loss and
 * correct predictions are summed, so every rank sees the same loss and stops at the same
 * non-finite step.
 *
 * With --shard-optimizer (ZeRO-1) each rank updates only its slices (rt_shard_slices: the r-th
 * of N nearly equal parts of every bucket): a bucket's mean is a group of N ncclReduce calls
 * (ncclAvg, in place), slice r's onto rank r, instead of one all-reduce (NCCL's reduce-scatter
 * needs equal parts, which buckets of any size cannot give); after the update, a group of N
 * ncclBroadcast calls per bucket hands each rank's updated slice of the parameters to the others.
 *
 * A wait for the device also watches NCCL: a failed collective (ncclCommGetAsyncError) or a step
 * that does not end within RtComm.timeout (a rank that died or hangs leaves the others inside a
 * collective) aborts the communicator and ends the job through MPI, with a message.
 */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rt_cuda_internal.h"

static struct {
    RtRanks ranks;
    ncclComm_t comm;
    cudaStream_t stream;   /* the collectives' */
    int n_events;
    cudaEvent_t *ready;    /* per bucket, then one for the loss: recorded on the step's stream */
    cudaEvent_t done;      /* recorded on the collectives' stream once the step's are queued */
    cudaEvent_t side_ready, side_done; /* around each collective the step waits for at once */
    RtSlice *slices;       /* --shard-optimizer: [ranks][buckets], every rank's slices; else NULL */
} g_nccl;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The job cannot go on: say why on this rank, and end every rank. */
_Noreturn static void end_job(const char *fmt, const char *what, const char *detail) {
    fflush(stdout);
    fprintf(stderr, "error: rank %d: ", g_nccl.ranks.rank);
    fprintf(stderr, fmt, what, detail);
    fputs("; ending the job\n", stderr);
    fflush(stderr);
    if (g_nccl.comm) /* a collective stuck on the device would keep the process alive */
        ncclCommAbort(g_nccl.comm), g_nccl.comm = NULL;
    g_nccl.ranks.comm->close(RT_EXIT_COMM, 0);
    exit(RT_EXIT_COMM);
}

static void check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess)
        return;
    /* NCCL keeps its last error message for the process, not in a communicator (NULL is taken):
     * after a failed ncclCommInitRank, which leaves none, its detail ("Duplicate GPU detected
     * ...") is still there */
    const char *last = ncclGetLastError(g_nccl.comm);
    char detail[512];
    snprintf(detail, sizeof detail, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    end_job("NCCL failed in %s: %s", what, detail);
}

static int nccl_open(RtCuda *cu, const RtRanks *ranks, char *why, size_t size) {
    const RtModel *m = rt_cuda_model(cu);
    g_nccl.ranks = *ranks;
    ncclUniqueId id;
    if (ranks->rank == 0) /* every rank waits for it: a failure ends them all */
        check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ranks->comm->share(&id, (int)sizeof id, "sharing the NCCL communicator's id");
    check(ncclCommInitRank(&g_nccl.comm, ranks->ranks, id, ranks->rank), "ncclCommInitRank");
    rt_cuda_check(cudaStreamCreateWithFlags(&g_nccl.stream, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags (the NCCL stream)");
    g_nccl.n_events = m->n_buckets + 1;
    g_nccl.ready = calloc((size_t)g_nccl.n_events, sizeof *g_nccl.ready);
    if (!g_nccl.ready) {
        snprintf(why, size, "out of host memory for %d events", g_nccl.n_events);
        return 1;
    }
    if (m->shard_optimizer) {
        g_nccl.slices = calloc((size_t)ranks->ranks * (size_t)m->n_buckets + 1, sizeof *g_nccl.slices);
        if (!g_nccl.slices) {
            snprintf(why, size, "out of host memory for %d ranks' slices of %d buckets", ranks->ranks, m->n_buckets);
            return 1;
        }
        for (int r = 0; r < ranks->ranks; r++)
            rt_shard_slices(m, r, ranks->ranks, g_nccl.slices + (size_t)r * m->n_buckets);
    }
    const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync; /* they order streams only */
    for (int k = 0; k < g_nccl.n_events; k++)
        rt_cuda_check(cudaEventCreateWithFlags(&g_nccl.ready[k], flags), "cudaEventCreateWithFlags");
    rt_cuda_check(cudaEventCreateWithFlags(&g_nccl.done, flags), "cudaEventCreateWithFlags");
    rt_cuda_check(cudaEventCreateWithFlags(&g_nccl.side_ready, flags), "cudaEventCreateWithFlags");
    rt_cuda_check(cudaEventCreateWithFlags(&g_nccl.side_done, flags), "cudaEventCreateWithFlags");
    return 0;
}

/* The NCCL stream waits for the step's stream as it is now (event k). */
static void fork_from(RtCuda *cu, int k) {
    rt_cuda_check(cudaEventRecord(g_nccl.ready[k], rt_cuda_stream(cu)), "cudaEventRecord (gradients ready)");
    rt_cuda_check(cudaStreamWaitEvent(g_nccl.stream, g_nccl.ready[k], 0), "cudaStreamWaitEvent (NCCL stream)");
}

/* Without a communicator (the evaluator of --eval-rank, which opens its device without one and
 * never trains: its warm-up step is thrown away) the collectives are left out. */
void rt_cuda_sum_start(RtCuda *cu, int k) {
    if (!g_nccl.comm)
        return;
    const RtModel *m = rt_cuda_model(cu);
    if (k < 0 || k >= m->n_buckets)
        rt_cuda_die("internal error: gradient bucket %d of %d", k, m->n_buckets);
    const RtBucket *b = &m->buckets[k];
    float *grads = (float *)(rt_cuda_base(cu) + rt_cuda_device_model(cu)->off_grads);
    fork_from(cu, k);
    if (!g_nccl.slices) {
        float *g = grads + b->offset;
        check(ncclAllReduce(g, g, (size_t)b->count, ncclFloat, ncclAvg, g_nccl.comm, g_nccl.stream),
              "ncclAllReduce (a gradient bucket)");
        return;
    }
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g_nccl.ranks.ranks; r++) { /* rank r's slice of the bucket, onto rank r */
        const RtSlice *s = &g_nccl.slices[(size_t)r * m->n_buckets + k];
        check(ncclReduce(grads + s->offset, grads + s->offset, (size_t)s->count, ncclFloat, ncclAvg, r, g_nccl.comm,
                         g_nccl.stream),
              "ncclReduce (a slice of a gradient bucket)");
    }
    check(ncclGroupEnd(), "ncclGroupEnd (a gradient bucket's slices)");
}

void rt_cuda_sum_join(RtCuda *cu) {
    if (!g_nccl.comm)
        return;
    RtDevState *st = (RtDevState *)(rt_cuda_base(cu) + rt_cuda_device_model(cu)->off_state);
    fork_from(cu, g_nccl.n_events - 1);
    /* loss and correct[RT_DEV_METRICS] are adjacent floats of RtDevState */
    _Static_assert(offsetof(RtDevState, correct) == offsetof(RtDevState, loss) + sizeof(float),
                   "RtDevState.correct right after loss");
    check(ncclAllReduce(&st->loss, &st->loss, 1 + RT_DEV_METRICS, ncclFloat, ncclSum, g_nccl.comm, g_nccl.stream),
          "ncclAllReduce (the step's loss)");
    rt_cuda_check(cudaEventRecord(g_nccl.done, g_nccl.stream), "cudaEventRecord (collectives queued)");
    rt_cuda_check(cudaStreamWaitEvent(rt_cuda_stream(cu), g_nccl.done, 0), "cudaStreamWaitEvent (the step's stream)");
}

/* Fork the collectives' stream from the step's, and join it back once what `enqueue` queues
 * there is done: the step waits for it, the host does not. */
static void beside_step(RtCuda *cu, void (*enqueue)(RtCuda *, void *), void *arg) {
    rt_cuda_check(cudaEventRecord(g_nccl.side_ready, rt_cuda_stream(cu)), "cudaEventRecord (the step's work ready)");
    rt_cuda_check(cudaStreamWaitEvent(g_nccl.stream, g_nccl.side_ready, 0), "cudaStreamWaitEvent (NCCL stream)");
    enqueue(cu, arg);
    rt_cuda_check(cudaEventRecord(g_nccl.side_done, g_nccl.stream), "cudaEventRecord (the collectives done)");
    rt_cuda_check(cudaStreamWaitEvent(rt_cuda_stream(cu), g_nccl.side_done, 0), "cudaStreamWaitEvent (the step's stream)");
}

static void broadcast_slices(RtCuda *cu, void *unused) {
    (void)unused;
    const RtModel *m = rt_cuda_model(cu);
    float *params = (float *)(rt_cuda_base(cu) + rt_cuda_device_model(cu)->off_params);
    for (int k = 0; k < m->n_buckets; k++) {
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < g_nccl.ranks.ranks; r++) { /* rank r's updated slice, in place everywhere */
            const RtSlice *s = &g_nccl.slices[(size_t)r * m->n_buckets + k];
            check(ncclBroadcast(params + s->offset, params + s->offset, (size_t)s->count, ncclFloat, r, g_nccl.comm,
                                g_nccl.stream),
                  "ncclBroadcast (a slice of the updated parameters)");
        }
        check(ncclGroupEnd(), "ncclGroupEnd (a bucket's updated parameters)");
    }
}

void rt_cuda_gather_params(RtCuda *cu) {
    if (!g_nccl.comm)
        return;
    if (!g_nccl.slices)
        rt_cuda_die("internal error: the parameters' slices gathered by a trainer whose optimizer is not sharded");
    beside_step(cu, broadcast_slices, NULL);
}

typedef struct Doubles {
    int64_t offset, n;
} Doubles;

static void sum_doubles(RtCuda *cu, void *arg) {
    const Doubles *d = arg;
    double *x = (double *)(rt_cuda_base(cu) + d->offset);
    check(ncclAllReduce(x, x, (size_t)d->n, ncclFloat64, ncclSum, g_nccl.comm, g_nccl.stream),
          "ncclAllReduce (sums of doubles)");
}

void rt_cuda_sum_doubles(RtCuda *cu, int64_t offset, int64_t n) {
    if (!g_nccl.comm)
        return;
    /* on the collectives' stream, after the bucket sums already started there: one stream keeps
     * the communicator's collectives in the order every rank issues them */
    Doubles d = {offset, n};
    beside_step(cu, sum_doubles, &d);
}

static void nccl_wait(RtCuda *cu, cudaEvent_t until, const char *what) {
    double t0 = now(), limit = g_nccl.ranks.comm->timeout();
    struct timespec nap = {0, 100000}; /* 0.1 ms: the host has nothing else to do */
    for (;;) {
        cudaError_t e = until ? cudaEventQuery(until) : cudaStreamQuery(rt_cuda_stream(cu));
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            rt_cuda_check(e, what);
        ncclResult_t async = ncclSuccess;
        check(ncclCommGetAsyncError(g_nccl.comm, &async), "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress)
            check(async, what);
        if (now() - t0 > limit) {
            char waited[64];
            snprintf(waited, sizeof waited, "%.0f s (NETC_DIST_TIMEOUT)", now() - t0);
            end_job("the GPU step did not end while %s, waited %s: a rank has died or hangs", what, waited);
        }
        nanosleep(&nap, NULL);
    }
}

static void nccl_close(void) {
    for (int k = 0; k < g_nccl.n_events; k++)
        if (g_nccl.ready[k])
            cudaEventDestroy(g_nccl.ready[k]);
    free(g_nccl.ready);
    free(g_nccl.slices);
    if (g_nccl.done)
        cudaEventDestroy(g_nccl.done);
    if (g_nccl.side_ready)
        cudaEventDestroy(g_nccl.side_ready);
    if (g_nccl.side_done)
        cudaEventDestroy(g_nccl.side_done);
    if (g_nccl.comm)
        ncclCommDestroy(g_nccl.comm);
    if (g_nccl.stream)
        cudaStreamDestroy(g_nccl.stream);
    g_nccl = (__typeof__(g_nccl)){0};
}

const RtCudaColl rt_cuda_nccl = {
    .name = "NCCL",
    .open = nccl_open,
    .wait = nccl_wait,
    .close = nccl_close,
};
