/* nccl_emu.c - NCCL over MPI, and the few CUDA runtime calls runtime/cuda/rt_cuda_nccl.c makes, for
 * the emulation of a distributed GPU trainer (emu_vs_cpu.sh --ranks N): the real libnetrt_nccl
 * code, compiled against the real nccl.h and cuda_runtime.h, linked with this file and
 * rt_cuda_emu.c instead of NCCL and the CUDA runtime, and run under mpirun.
 *
 * As in rt_cuda_emu.c, work runs when it is enqueued: streams and events order nothing here, so
 * they are handles that are checked, not used. A collective is the MPI collective of the same
 * meaning over the communicator's ranks (MPI_COMM_WORLD's first `nranks`: with --eval-rank the
 * job's last process is the evaluator, which joins no communicator), with NCCL's arithmetic:
 * ncclAvg on float data multiplies each rank's values by (float)(1 / ranks) before the sum
 * (NCCL's PreMulSum), ncclSum adds. What it checks beyond that: every rank joins with the same
 * communicator id (the one rank 0 made, shared through MPI), at its MPI rank; collectives are in
 * place, on float32 data, with a live communicator and the NCCL stream; --shard-optimizer's reduces
 * and broadcasts inside a group.
 */
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_cuda_internal.h"

struct ncclComm {
    int rank, ranks;
    int live;
    MPI_Comm mpi; /* MPI_COMM_WORLD's ranks [0, ranks) */
};

/* the streams and events rt_cuda_nccl.c creates: distinct non-NULL handles, counted */
static char handles[64];
static int n_handles;

_Noreturn static void vdie(const char *who, const char *fmt, va_list ap) {
    fflush(stdout);
    fprintf(stderr, "error: %s (emulated): ", who);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    exit(1);
}

_Noreturn static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdie("nccl", fmt, ap);
}

/* ---- libnetrt_cuda's checks, as rt_cuda.c's */

void rt_cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) die("%s: CUDA error %d", what, (int)e);
}

_Noreturn void rt_cuda_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdie("cuda", fmt, ap);
}

/* ---- the CUDA runtime's streams and events */

static void *new_handle(void) {
    if (n_handles == (int)sizeof handles) die("more than %d streams and events", (int)sizeof handles);
    return &handles[n_handles++];
}

static void check_handle(const void *h, const char *what) {
    if ((const char *)h < handles || (const char *)h >= handles + n_handles) die("%s: not a stream or event made here", what);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (flags != cudaStreamNonBlocking) die("the NCCL stream must not synchronise with the legacy stream");
    *s = new_handle();
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!(flags & cudaEventDisableTiming)) die("an event that only orders streams needs no timing");
    *e = new_handle();
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    check_handle(e, "cudaEventRecord");
    (void)s; /* the step's stream: rt_cuda_emu.c's is NULL */
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    check_handle(e, "cudaStreamWaitEvent");
    (void)s, (void)flags;
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    (void)s;
    return cudaSuccess; /* the emulated work is done when it is enqueued */
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    check_handle(e, "cudaEventQuery");
    return cudaSuccess; /* as cudaStreamQuery */
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    check_handle(e, "cudaEventDestroy");
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    check_handle(s, "cudaStreamDestroy");
    return cudaSuccess;
}

/* ---- NCCL */

static const char ID_MAGIC[] = "netc-emu-nccl";

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s %ld", ID_MAGIC, (long)getpid());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    int up = 0, mpi_rank, mpi_ranks;
    MPI_Initialized(&up);
    if (!up) die("ncclCommInitRank before MPI was started");
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_ranks);
    if (rank != mpi_rank || nranks > mpi_ranks)
        die("ncclCommInitRank as rank %d of %d; MPI has rank %d of %d", rank, nranks, mpi_rank, mpi_ranks);
    MPI_Group world, first;
    MPI_Comm mpi;
    int range[1][3] = {{0, nranks - 1, 1}};
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_range_incl(world, 1, range, &first);
    MPI_Comm_create_group(MPI_COMM_WORLD, first, 0, &mpi); /* collective over those ranks alone */
    MPI_Group_free(&first), MPI_Group_free(&world);
    if (strncmp(id.internal, ID_MAGIC, sizeof ID_MAGIC - 1) != 0) die("rank %d: not an id ncclGetUniqueId made", rank);
    /* every rank has rank 0's id: the id's bytes, checked as their sum and its negation's maximum */
    long long mine = 0, mm[2];
    for (size_t i = 0; i < sizeof id.internal; i++) mine = mine * 131 + (unsigned char)id.internal[i];
    mm[0] = mine, mm[1] = -mine;
    MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_LONG_LONG, MPI_MAX, mpi);
    if (mm[0] != mine || mm[1] != -mine) die("rank %d joined with another communicator id than rank 0's", rank);
    *comm = calloc(1, sizeof **comm);
    if (!*comm) die("out of memory");
    **comm = (struct ncclComm){rank, nranks, 1, mpi};
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!comm || !comm->live) die("ncclAllReduce on a communicator that is not open");
    check_handle(stream, "ncclAllReduce's stream");
    if (send != recv) die("ncclAllReduce out of place; the trainer's are in place");
    if (type == ncclFloat64 && op == ncclSum) { /* --sync-bn's batch-norm sums */
        if (count > INT32_MAX) die("ncclAllReduce of %zu doubles, more than one MPI call here takes", count);
        MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_DOUBLE, MPI_SUM, comm->mpi);
        return ncclSuccess;
    }
    if (type != ncclFloat) die("ncclAllReduce on type %d; the trainer's are float32, or float64 sums", (int)type);
    if (op != ncclSum && op != ncclAvg) die("ncclAllReduce with operation %d", (int)op);
    if (count > INT32_MAX) die("ncclAllReduce of %zu floats, more than one MPI call here takes", count);
    float *x = recv;
    if (op == ncclAvg) { /* NCCL's average of floats: scaled by 1/ranks first, then summed */
        const float scale = (float)(1.0 / comm->ranks);
        for (size_t i = 0; i < count; i++) x[i] *= scale;
    }
    MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, comm->mpi);
    return ncclSuccess;
}

/* --shard-optimizer: a slice of a bucket onto its rank (ncclAvg as above), and a slice of the
 * parameters from its rank; in place. Each runs as it is called, in the order every rank calls
 * them, so a group needs nothing more than its brackets, checked. */
static int group_depth;

ncclResult_t ncclGroupStart(void) {
    if (group_depth++) die("ncclGroupStart inside a group; the trainer's groups are not nested");
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth-- != 1) die("ncclGroupEnd without ncclGroupStart");
    return ncclSuccess;
}

static void check_slice(const void *send, const void *recv, size_t count, ncclDataType_t type, int root,
                        ncclComm_t comm, cudaStream_t stream, const char *what) {
    if (!comm || !comm->live) die("%s on a communicator that is not open", what);
    check_handle(stream, what);
    if (send != recv) die("%s out of place; the trainer's are in place", what);
    if (type != ncclFloat) die("%s on type %d; the trainer's are float32", what, (int)type);
    if (root < 0 || root >= comm->ranks) die("%s to rank %d of %d", what, root, comm->ranks);
    if (count > INT32_MAX) die("%s of %zu floats, more than one MPI call here takes", what, count);
    if (!group_depth) die("%s outside a group; the trainer groups one per rank", what);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    check_slice(send, recv, count, type, root, comm, stream, "ncclReduce");
    if (op != ncclAvg) die("ncclReduce with operation %d; the trainer's average", (int)op);
    float *x = recv, scale = (float)(1.0 / comm->ranks);
    float *mine = malloc(count * sizeof *mine + 1); /* this rank's values scaled; x is written on the root only */
    if (!mine) die("out of memory");
    for (size_t i = 0; i < count; i++) mine[i] = x[i] * scale;
    MPI_Reduce(mine, comm->rank == root ? x : NULL, (int)count, MPI_FLOAT, MPI_SUM, root, comm->mpi);
    free(mine);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    check_slice(send, recv, count, type, root, comm, stream, "ncclBroadcast");
    MPI_Bcast(recv, (int)count, MPI_FLOAT, root, comm->mpi);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !comm->live) die("ncclCommGetAsyncError on a communicator that is not open");
    *err = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm || !comm->live) die("ncclCommDestroy on a communicator that is not open");
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Comm_free(&comm->mpi);
    free(comm);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm) comm->live = 0;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "an emulated NCCL error"; }
const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}
