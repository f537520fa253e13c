/* rt_mpi.c - libnetrt_mpi: the collectives of a distributed CPU trainer (RtComm) over MPI.
 *
 * Only trainers built with netc --distributed link this file, so plain trainers need no MPI.
 * The main thread makes every MPI call (MPI_THREAD_FUNNELED): the OpenMP threads compute and the
 * prefetch thread reads data, neither communicates.
 *
 * No wait blocks inside MPI: a wait polls its requests (which also drives Open MPI's progress)
 * and, when the other ranks have not answered within the timeout (NETC_DIST_TIMEOUT seconds,
 * default 600), says which wait it was and ends the job with MPI_Abort. A rank that dies is
 * seen by mpirun, which ends the others; a rank that hangs is seen by this timeout. A process that
 * exits before close() (an error message and exit(1) anywhere in libnetrt) aborts the job too,
 * with its own exit status, so no rank is left waiting for it.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "netrt.h"

enum { MAX_CHUNK = 1 << 30 }; /* MPI counts are int */

static int rank_, finished_;
static double timeout_s = 600;
static MPI_Request *reqs;
static int n_reqs, cap_reqs;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* An exit before close(): the job cannot go on without this rank. */
static void abort_on_exit(int status, void *unused) {
    (void)unused;
    if (finished_) return;
    finished_ = 1;
    MPI_Abort(MPI_COMM_WORLD, status ? status : RT_EXIT_COMM);
}

static int mpi_open(int *argc, char ***argv, int *rank, int *ranks, int *local_rank, char *why, size_t size) {
    const char *t = getenv("NETC_DIST_TIMEOUT");
    if (t && *t) {
        char *end;
        double v = strtod(t, &end);
        if (*end || !(v > 0)) {
            snprintf(why, size, "NETC_DIST_TIMEOUT must be a number of seconds above 0, found '%s'", t);
            return 1;
        }
        timeout_s = v;
    }
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        snprintf(why, size, "MPI_Init_thread failed");
        return 1;
    }
    on_exit(abort_on_exit, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, ranks);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
    rank_ = *rank;
    if (provided < MPI_THREAD_FUNNELED) {
        snprintf(why, size, "this MPI library does not support MPI_THREAD_FUNNELED");
        return 1;
    }
    return 0;
}

/* Poll requests [0, n) until all are done; the seconds it took. */
static double wait_all(MPI_Request *r, int n, const char *what) {
    double t0 = now();
    for (;;) {
        int done = 0;
        MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (done) return now() - t0;
        double waited = now() - t0;
        if (waited > timeout_s) {
            fprintf(stderr, "error: rank %d: no answer from the other ranks for %.0f s while %s (NETC_DIST_TIMEOUT); "
                            "a rank has died or hangs: ending the job\n", rank_, waited, what);
            fflush(stderr);
            finished_ = 1;
            MPI_Abort(MPI_COMM_WORLD, RT_EXIT_COMM);
        }
        sched_yield();
    }
}

/* A request of the list wait_sums waits for. */
static MPI_Request *new_request(void) {
    if (n_reqs == cap_reqs) {
        cap_reqs = cap_reqs ? 2 * cap_reqs : 64;
        reqs = realloc(reqs, (size_t)cap_reqs * sizeof *reqs);
        if (!reqs) {
            fprintf(stderr, "error: out of memory for the gradient reductions\n");
            exit(1);
        }
    }
    return &reqs[n_reqs++];
}

/* A test of the collectives in flight lets MPI move them on while the backward pass computes. */
static void progress(void) {
    int done;
    MPI_Testall(n_reqs, reqs, &done, MPI_STATUSES_IGNORE);
}

static void start_sum(float *x, int64_t n) {
    for (int64_t at = 0; at < n; at += MAX_CHUNK) {
        int count = n - at < MAX_CHUNK ? (int)(n - at) : MAX_CHUNK;
        MPI_Iallreduce(MPI_IN_PLACE, x + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, new_request());
    }
    progress();
}

static void start_sum_scatter(const float *x, const int *counts, float *mine) {
    MPI_Ireduce_scatter(x, mine, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, new_request());
    progress();
}

static void start_gather(float *x, const int *counts, const int *displs) {
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, counts, displs, MPI_FLOAT, MPI_COMM_WORLD, new_request());
}

static double gather_root(const float *mine, int n, float *all, const int *counts, const int *displs,
                          const char *what) {
    MPI_Request r;
    MPI_Igatherv(mine, n, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD, &r);
    return wait_all(&r, 1, what);
}

static double wait_sums(const char *what) {
    double s = wait_all(reqs, n_reqs, what);
    n_reqs = 0;
    return s;
}

static double sum(double *x, int n, const char *what) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    return wait_all(&r, 1, what);
}

static int agree(uint64_t v, const char *what) {
    uint64_t mm[2] = {v, ~v}; /* the maximum of v and of its complement: both equal v's iff all agree */
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, mm, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &r);
    wait_all(&r, 1, what);
    return mm[0] == v && mm[1] == ~v;
}

static void share(void *x, int n, const char *what) {
    MPI_Request r;
    MPI_Ibcast(x, n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    wait_all(&r, 1, what);
}

static double timeout(void) { return timeout_s; }

static void mpi_close(int status, int together) {
    if (finished_) return;
    finished_ = 1;
    free(reqs);
    reqs = NULL;
    if (status && !together) MPI_Abort(MPI_COMM_WORLD, status);
    MPI_Finalize();
}

const RtComm rt_comm_mpi = {
    .name = "MPI",
    .open = mpi_open,
    .start_sum = start_sum,
    .wait_sums = wait_sums,
    .sum = sum,
    .agree = agree,
    .start_sum_scatter = start_sum_scatter,
    .start_gather = start_gather,
    .gather_root = gather_root,
    .share = share,
    .timeout = timeout,
    .close = mpi_close,
};
