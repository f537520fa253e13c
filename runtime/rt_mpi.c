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
 *
 * With --eval-rank the job's last process evaluates (docs/distributed.md "Asynchronous
 * evaluation"): the collectives run over a communicator of the other processes, the training
 * ranks, and training rank 0 hands the evaluator each evaluation's parameters and takes its
 * sums back with point-to-point messages on MPI_COMM_WORLD, polled at every step.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "netrt.h"
#include "rt_internal.h"

enum { MAX_CHUNK = 1 << 30 }; /* MPI counts are int */

static int rank_, finished_;
static MPI_Comm train_ = MPI_COMM_NULL; /* the training ranks: the whole job, or all but the evaluator */
static int evaluator_ = -1;            /* --eval-rank: the evaluator's rank in MPI_COMM_WORLD */
static double timeout_s = 600;
static MPI_Request *reqs;
static int n_reqs, cap_reqs;

/* An exit before close(): the job cannot go on without this rank. */
static void abort_on_exit(int status, void *unused) {
    (void)unused;
    if (finished_) return;
    finished_ = 1;
    MPI_Abort(MPI_COMM_WORLD, status ? status : RT_EXIT_COMM);
}

static int mpi_open(int *argc, char ***argv, int eval_rank, int *rank, int *ranks, int *local_rank, int *evaluator,
                    char *why, size_t size) {
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
    int world;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
    rank_ = *rank;
    if (provided < MPI_THREAD_FUNNELED) {
        snprintf(why, size, "this MPI library does not support MPI_THREAD_FUNNELED");
        return 1;
    }
    *ranks = world, *evaluator = 0, train_ = MPI_COMM_WORLD;
    if (!eval_rank) return 0;
    if (world < 2) {
        snprintf(why, size, "--eval-rank takes the job's last process for evaluation, and this job has one: start "
                            "it with a process more than the training ranks (mpirun -np N+1)");
        return 1;
    }
    evaluator_ = world - 1, *evaluator = *rank == evaluator_, *ranks = world - 1;
    MPI_Comm_split(MPI_COMM_WORLD, *evaluator, *rank, &train_); /* the evaluator's holds itself alone */
    return 0;
}

/* Poll requests [0, n) until all are done; the seconds it took. */
static double wait_all(MPI_Request *r, int n, const char *what) {
    double t0 = rt_now();
    for (;;) {
        int done = 0;
        MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (done) return rt_now() - t0;
        double waited = rt_now() - t0;
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
        MPI_Iallreduce(MPI_IN_PLACE, x + at, count, MPI_FLOAT, MPI_SUM, train_, new_request());
    }
    progress();
}

static void start_sum_scatter(const float *x, const int *counts, float *mine) {
    MPI_Ireduce_scatter(x, mine, counts, MPI_FLOAT, MPI_SUM, train_, new_request());
    progress();
}

static void start_gather(float *x, const int *counts, const int *displs) {
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, counts, displs, MPI_FLOAT, train_, new_request());
}

static double gather_root(const float *mine, int n, float *all, const int *counts, const int *displs,
                          const char *what) {
    MPI_Request r;
    MPI_Igatherv(mine, n, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, train_, &r);
    return wait_all(&r, 1, what);
}

static double wait_sums(const char *what) {
    double s = wait_all(reqs, n_reqs, what);
    n_reqs = 0;
    return s;
}

static double sum(double *x, int n, const char *what) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, train_, &r);
    return wait_all(&r, 1, what);
}

static int agree(uint64_t v, const char *what) {
    uint64_t mm[2] = {v, ~v}; /* the maximum of v and of its complement: both equal v's iff all agree */
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, mm, 2, MPI_UINT64_T, MPI_MAX, train_, &r);
    wait_all(&r, 1, what);
    return mm[0] == v && mm[1] == ~v;
}

static void share(void *x, int n, const char *what) {
    MPI_Request r;
    MPI_Ibcast(x, n, MPI_BYTE, 0, train_, &r);
    wait_all(&r, 1, what);
}

static double timeout(void) { return timeout_s; }

/* ---- --eval-rank: training rank 0 and the evaluator */

enum { TAG_EPOCH = 7100, TAG_PARAMS, TAG_RESULT, MAX_SUMS = 7 };

static struct {
    int64_t epoch;               /* the epoch handed over, or -1 - the exit status when training is over */
    MPI_Request *sends;          /* its epoch, then the parameters in chunks of MAX_CHUNK floats */
    int n_sends, pending;        /* pending: a result is expected */
    MPI_Request result;
    double reply[1 + MAX_SUMS];  /* the epoch, then the sums */
} ev;

/* The messages n floats of parameters take (MPI counts are int); and start sending them to
 * rank `peer` (or receiving them from it), one request per message. */
static int chunks(int64_t n) { return (int)((n + MAX_CHUNK - 1) / MAX_CHUNK); }

static void start_chunks(float *x, int64_t n, int peer, int send, MPI_Request *r) {
    for (int c = 0; c < chunks(n); c++) {
        int64_t at = (int64_t)c * MAX_CHUNK;
        int count = n - at < MAX_CHUNK ? (int)(n - at) : MAX_CHUNK;
        if (send) MPI_Isend(x + at, count, MPI_FLOAT, peer, TAG_PARAMS, MPI_COMM_WORLD, &r[c]);
        else MPI_Irecv(x + at, count, MPI_FLOAT, peer, TAG_PARAMS, MPI_COMM_WORLD, &r[c]);
    }
}

static MPI_Request *requests(int n) {
    MPI_Request *r = malloc((size_t)n * sizeof *r);
    if (!r) {
        fprintf(stderr, "error: out of memory for the evaluation's messages\n");
        exit(1);
    }
    return r;
}

static void eval_send(const float *x, int64_t n, int64_t epoch) {
    if (ev.n_sends) /* the evaluator took the last parameters before it replied: done at once */
        wait_all(ev.sends, ev.n_sends, "handing the evaluation rank the parameters");
    free(ev.sends);
    ev.n_sends = 1 + (x ? chunks(n) : 0), ev.sends = requests(ev.n_sends);
    ev.epoch = x ? epoch : -1 - epoch;
    MPI_Isend(&ev.epoch, 1, MPI_INT64_T, evaluator_, TAG_EPOCH, MPI_COMM_WORLD, &ev.sends[0]);
    if (!x) { /* the end: nothing may be left in flight when MPI_Finalize comes */
        if (ev.pending) MPI_Cancel(&ev.result), MPI_Request_free(&ev.result), ev.pending = 0;
        wait_all(ev.sends, ev.n_sends, "telling the evaluation rank that training is over");
        free(ev.sends), ev.sends = NULL, ev.n_sends = 0;
        return;
    }
    start_chunks((float *)x, n, evaluator_, 1, ev.sends + 1); /* MPI_Isend's buffer is const */
    MPI_Irecv(ev.reply, 1 + MAX_SUMS, MPI_DOUBLE, evaluator_, TAG_RESULT, MPI_COMM_WORLD, &ev.result);
    ev.pending = 1;
}

static int eval_result(double *sums, int n, int64_t *epoch, int wait) {
    if (!ev.pending) return 0;
    int done = 0;
    if (ev.n_sends) /* a large hand-over moves on only while this rank calls MPI */
        MPI_Testall(ev.n_sends, ev.sends, &done, MPI_STATUSES_IGNORE);
    if (wait) wait_all(&ev.result, 1, "waiting for the evaluation rank's result");
    else if (MPI_Test(&ev.result, &done, MPI_STATUS_IGNORE), !done) return 0;
    ev.pending = 0;
    *epoch = (int64_t)ev.reply[0];
    memcpy(sums, ev.reply + 1, (size_t)n * sizeof *sums);
    return 1;
}

/* Poll r without a timeout, sleeping between tests: the evaluator waits while the others train
 * (if they fail, mpirun or their MPI_Abort ends it). */
static void wait_long(MPI_Request *r) {
    struct timespec nap = {0, 1000000}; /* 1 ms: this process must not take the training ranks' cores */
    for (int done = 0; MPI_Test(r, &done, MPI_STATUS_IGNORE), !done;) nanosleep(&nap, NULL);
}

static int eval_next(float *x, int64_t n, int64_t *epoch) {
    MPI_Request r;
    MPI_Irecv(epoch, 1, MPI_INT64_T, 0, TAG_EPOCH, MPI_COMM_WORLD, &r);
    wait_long(&r);
    if (*epoch < 0) {
        *epoch = -1 - *epoch;
        return 0;
    }
    int k = chunks(n);
    MPI_Request *recvs = requests(k);
    start_chunks(x, n, 0, 0, recvs);
    wait_all(recvs, k, "receiving the parameters to evaluate");
    free(recvs);
    return 1;
}

static void eval_reply(const double *sums, int n, int64_t epoch) {
    double msg[1 + MAX_SUMS] = {(double)epoch};
    memcpy(msg + 1, sums, (size_t)(n < MAX_SUMS ? n : MAX_SUMS) * sizeof *sums);
    MPI_Request r;
    MPI_Isend(msg, 1 + MAX_SUMS, MPI_DOUBLE, 0, TAG_RESULT, MPI_COMM_WORLD, &r);
    wait_long(&r); /* rank 0 takes it when it next polls, after a training step */
}

static void mpi_close(int status, int together) {
    if (finished_) return;
    finished_ = 1;
    free(reqs), free(ev.sends);
    reqs = NULL, ev.sends = NULL;
    if (train_ != MPI_COMM_WORLD && train_ != MPI_COMM_NULL) MPI_Comm_free(&train_);
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
    .eval_send = eval_send,
    .eval_result = eval_result,
    .eval_next = eval_next,
    .eval_reply = eval_reply,
    .close = mpi_close,
};
