/* rt_cuda.c - the device behind rt_cuda_device: one GPU, a step stream and a copy stream, one
 * arena, two staging slots and the graph-frozen step (DESIGN.md, "The training step on a GPU").
 *
 * open() finds the GPU and the kernel image for its architecture, loads the kernels, creates the
 * streams and the cuBLASLt and cuDNN handles, allocates the arena (every buffer is at a constant
 * offset from its base) and the landing buffer, lets the generated plan() build the library
 * plans, allocates the one shared workspace, warms up, and captures two CUDA Graphs: a training
 * and an evaluation step (with --accumulate, two training graphs: RT_STEP_SUM for a step's first
 * batches, whose gradients the device sums, and RT_STEP_LAST for its last, which updates; the
 * sum lives after everything else in the arena). A batch travels
 *
 *     host: slot s (pinned)  --copy stream-->  landing  --step stream, in the graph-->  arena batch
 *
 *     copy stream:  wait landing_free -> copy slot s -> landing -> record slot_free[s]
 *     step stream:  wait slot_free[s] -> graph: copy landing -> arena batch -> record
 *                   landing_free -> the step's kernels and library calls
 *
 * so a step is one cudaGraphLaunch, and the next batch crosses the bus while the step before
 * runs: its copy waits only until that step has taken the last batch out of the landing buffer
 * (a device-to-device copy, its first node), not for the step's end. The host refills slot s as
 * soon as slot_free[s] says its copy is done - it never waits for a step itself - and slots
 * alternate, so it fills one while the other's copy may still be running. A graph's event record
 * node records its event at each launch (cudaEventRecordExternal), which the copy stream's wait
 * takes as it takes a cudaEventRecord. The loss and accuracy sums stay in the device's
 * RtDevState; the host reads them (the only full wait) at log intervals.
 *
 * A distributed trainer (RtCudaModel.coll, libnetrt_nccl) takes GPU local_rank of its machine's,
 * joins its ranks' NCCL communicator before the warm-up, and its step forks the collectives onto
 * a second stream and joins them back, inside the capture (rt_cuda_nccl.c); every wait for the
 * stream then goes through coll->wait, which watches the collectives.
 *
 * --eval-async gives the device a second lane (struct Lane): an arena of the same layout, a
 * stream, a copy stream, a landing buffer, a workspace, staging slots and an evaluation graph of
 * its own. An evaluation then starts
 * by copying the parameters into that arena in the step stream's order, and its batches run on the
 * second stream while the training steps go on on the first. The generated code knows nothing of
 * it: the lane's fields are swapped into RtCuda while its work is enqueued or captured, so
 * rt_cuda_base, rt_cuda_stream and rt_cuda_workspace, and every launch and library call, take
 * the lane's.
 *
 * The runtime API is linked statically, so a trainer starts on a machine without a driver and
 * open() can say what is missing instead of the dynamic loader failing first.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_cuda_internal.h"

enum { RT_CUDA_SLOTS = 2 }; /* staging slots: the host fills one while the device reads the other */
_Static_assert((int)RT_DEV_METRICS == (int)RT_MAX_METRICS, "RtDevState counts as many metrics as RtCtx");

/* What a lane of work owns; RtCuda holds the step's, and `side` --eval-async's (swap_lane). */
typedef struct Lane {
    unsigned char *base;
    cudaStream_t stream;
    void *workspace;
    unsigned char *landing;
    cudaStream_t copy_stream;
    cudaEvent_t landing_free;
    unsigned char *slot[RT_CUDA_SLOTS];
    cudaEvent_t slot_free[RT_CUDA_SLOTS];
    int next_slot;
    cudaGraphExec_t eval_graph;
} Lane;

struct RtCuda {
    const RtModel *model;       /* batch size and inputs */
    const RtCudaModel *dm;      /* the generated device step */
    int use_graph;              /* 0: --no-graph, enqueue each step's work directly */
    int capturing;              /* inside a stream capture: failed checks suggest --no-graph */
    cudaLibrary_t library;      /* the loaded kernel image */
    cudaKernel_t *kernels;      /* dm->n_kernels, indexed like dm->kernel_names */
    cudaStream_t stream;        /* the step's work runs on this non-blocking stream */
    cublasLtHandle_t blaslt;
    cudnnHandle_t dnn;
    unsigned char *base;        /* the arena: `bytes` */
    size_t bytes;               /* dm->device_bytes, a sharded optimizer's state, --accumulate's sum (size_arena) */
    int accumulate;             /* --accumulate K: batches per step, RT_STEP_SUM K - 1 times, then RT_STEP_LAST */
    int64_t accum_at;           /* with K > 1: the step's summed gradients, last in the arena (RtDevState.accum_at) */
    int64_t state_floats;       /* the optimizer state's floats on this device */
    long long *shard;           /* --shard-optimizer: the slice table at dm->off_shard, or NULL */
    size_t workspace_reserved;  /* the largest reservation made while planning */
    int workspace_ready;        /* planning is over: the workspace is allocated */
    void *workspace;            /* workspace_reserved bytes shared by every library plan */
    char refused[512];          /* why a plan could not be built (rt_cuda_refuse), or "" */
    unsigned char *landing;                  /* device memory: the next batch, copied in beside a step */
    cudaStream_t copy_stream;                /* the batches' copies from the staging slots to `landing` */
    cudaEvent_t landing_free;                /* recorded once a step has copied it on into the arena */
    unsigned char *slot[RT_CUDA_SLOTS];      /* pinned staging: RtBatchHeader, then the inputs */
    cudaEvent_t slot_free[RT_CUDA_SLOTS];    /* recorded once a slot's copy to `landing` is done: the
                                              * host may refill the slot, the step read its batch */
    int next_slot;
    size_t input_bytes[RT_MAX_INPUTS];       /* one batch of each input */
    RtDevState *host_state;                  /* pinned copy of the device's RtDevState */
    RtDevState *posted;                      /* pinned: the copy post_train asks for, behind the steps */
    cudaEvent_t posted_copied;               /* recorded once that copy is done */
    int coll_open;                           /* dm->coll joined its ranks (close it at teardown) */
    cudaGraphExec_t train_graph[3];          /* by RtStepPart: WHOLE, or with --accumulate SUM and LAST */
    cudaGraphExec_t eval_graph;
    int eval_async;                          /* --eval-async: `side` exists */
    Lane side;                               /* its lane, while the step's is in the fields above */
    cudaEvent_t snapshot;                    /* the step stream's parameters copied to the side arena */
    unsigned char *output;                   /* pinned: --predict's output as the device holds it */
};

/* A trainer drives one device. */
static RtCuda g_cu;

/* ---- checks */

static const char *capture_hint(void) {
    return g_cu.capturing ? "\nhint: this call is not allowed while the step is captured as a CUDA graph;"
                            " run the trainer with --no-graph"
                          : "";
}

_Noreturn void rt_cuda_die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fputs("error: cuda: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

void rt_cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess)
        rt_cuda_die("%s: %s%s", what, cudaGetErrorString(e), capture_hint());
}

void rt_cuda_check_blas(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        rt_cuda_die("%s: cuBLASLt: %s (%s)%s", what, cublasLtGetStatusString(s), cublasLtGetStatusName(s),
                    capture_hint());
}

void rt_cuda_check_dnn(cudnnStatus_t s, const char *what) {
    if (s != CUDNN_STATUS_SUCCESS)
        rt_cuda_die("%s: cuDNN: %s%s", what, cudnnGetErrorString(s), capture_hint());
}

/* `why` of a failed open(); it never exits, the caller decides. */
static int fail(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t size, const char *fmt, ...) {
    va_list ap;
    if (why && size) {
        va_start(ap, fmt);
        vsnprintf(why, size, fmt, ap);
        va_end(ap);
    }
    return 1;
}

/* ---- accessors for the generated code and the plan files */

cudaStream_t rt_cuda_stream(const RtCuda *cu) { return cu->stream; }
const RtModel *rt_cuda_model(const RtCuda *cu) { return cu->model; }
const RtCudaModel *rt_cuda_device_model(const RtCuda *cu) { return cu->dm; }
unsigned char *rt_cuda_base(const RtCuda *cu) { return cu->base; }
cublasLtHandle_t rt_cuda_blaslt(RtCuda *cu) { return cu->blaslt; }
cudnnHandle_t rt_cuda_dnn(RtCuda *cu) { return cu->dnn; }
RtCudaMath rt_cuda_math(const RtCuda *cu) { return cu->dm->math; }
size_t rt_cuda_arena_bytes(const RtCuda *cu) { return cu->bytes; }

void rt_cuda_reserve_workspace(RtCuda *cu, size_t bytes) {
    if (cu->workspace_ready && bytes > cu->workspace_reserved)
        rt_cuda_die("internal error: %zu bytes of workspace asked for after planning (%zu allocated)", bytes,
                    cu->workspace_reserved);
    if (bytes > cu->workspace_reserved)
        cu->workspace_reserved = bytes;
}

void rt_cuda_refuse(RtCuda *cu, const char *fmt, ...) {
    va_list ap;
    if (cu->refused[0])
        return;
    va_start(ap, fmt);
    vsnprintf(cu->refused, sizeof cu->refused, fmt, ap);
    va_end(ap);
}

void *rt_cuda_workspace(const RtCuda *cu, size_t *bytes) {
    if (bytes)
        *bytes = cu->workspace_reserved;
    return cu->workspace;
}

/* The kernel's arguments: the base, and for a shared kernel its RtKAt (copied by the launch). */
static void launch(RtCuda *cu, int k, unsigned grid, unsigned block, const RtKAt *at) {
    if (k < 0 || k >= cu->dm->n_kernels)
        rt_cuda_die("internal error: kernel %d of %d launched", k, cu->dm->n_kernels);
    void *args[] = {&cu->base, (void *)at};
    dim3 g = {grid, 1, 1}, b = {block, 1, 1};
    cudaError_t e = cudaLaunchKernel((const void *)cu->kernels[k], g, b, args, 0, cu->stream);
    if (e != cudaSuccess) {
        char what[256];
        snprintf(what, sizeof what, "launching %s (%u blocks of %u threads)", cu->dm->kernel_names[k], grid, block);
        rt_cuda_check(e, what);
    }
}

void rt_cuda_launch(RtCuda *cu, int k, unsigned grid, unsigned block) { launch(cu, k, grid, block, NULL); }

void rt_cuda_launch_at(RtCuda *cu, int k, unsigned grid, unsigned block, const RtKAt *at) {
    launch(cu, k, grid, block, at);
}

/* ---- finding the device */

/* The CUDA version as "13.0" from the runtime's or driver's 13000. */
static void version_text(int v, char *buf, size_t size) { snprintf(buf, size, "%d.%d", v / 1000, v % 1000 / 10); }

static int driver_installed(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h)
        dlclose(h);
    return h != NULL;
}

/* Why cudaGetDeviceCount found no usable GPU, in the user's terms. */
static int explain_no_device(cudaError_t e, char *why, size_t size) {
    const char *err = cudaGetErrorString(e);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char runtime[16], driver[16];
    int driver_version = 0;
    cudaDriverGetVersion(&driver_version);
    version_text(CUDART_VERSION, runtime, sizeof runtime);
    version_text(driver_version, driver, sizeof driver);
    if (e == cudaErrorStubLibrary)
        return fail(why, size, "the libcuda.so.1 found is the CUDA toolkit's stub, not a driver "
                               "(remove .../lib64/stubs from LD_LIBRARY_PATH): %s", err);
    if (!driver_installed())
        return fail(why, size, "no NVIDIA driver is installed (libcuda.so.1 not found): %s", err);
    switch (e) {
    case cudaErrorNoDevice:
        if (visible)
            return fail(why, size, "no CUDA device is visible (check CUDA_VISIBLE_DEVICES, now \"%s\"): %s", visible,
                        err);
        return fail(why, size, "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi): %s", err);
    case cudaErrorInsufficientDriver:
        return fail(why, size, "the NVIDIA driver is too old for this trainer (CUDA %s runtime; the driver "
                               "supports CUDA %s): %s", runtime, driver, err);
    case cudaErrorSystemDriverMismatch:
        return fail(why, size, "the NVIDIA driver's library and kernel module are different versions "
                               "(reboot, or reinstall the driver): %s", err);
    case cudaErrorInitializationError:
    case cudaErrorSystemNotReady:
        return fail(why, size, "the NVIDIA driver failed to initialise (check nvidia-smi): %s", err);
    case cudaErrorDevicesUnavailable:
        return fail(why, size, "every visible GPU is busy or in exclusive-process mode: %s", err);
    default:
        return fail(why, size, "the CUDA runtime found no usable GPU (CUDA %s runtime, driver for CUDA %s): %s",
                    runtime, driver, err);
    }
}

/* The first visible GPU; a distributed trainer's rank takes GPU local_rank of its machine's.
 * NCCL runs one rank per GPU: ncclCommInitRank refuses two ranks on one device ("Duplicate GPU
 * detected", since NCCL 2.5), so a training rank beyond the machine's GPUs is refused here, by
 * name. --eval-rank's evaluator joins no communicator: it takes local_rank modulo their number
 * (docs/distributed.md: -np 9 on 8 GPUs evaluates on GPU 0 beside rank 0). */
static int find_device(const RtCudaModel *dm, const RtRanks *ranks, struct cudaDeviceProp *prop, char *why,
                       size_t size) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return explain_no_device(e == cudaSuccess ? cudaErrorNoDevice : e, why, size);
    }
    if (dm->coll && ranks && ranks->comm && ranks->local_rank >= count)
        return fail(why, size, "rank %d is local rank %d of its machine, which has %d visible GPU%s: NCCL takes "
                               "one GPU a rank (start at most %d rank%s a machine)", ranks->rank, ranks->local_rank,
                    count, count == 1 ? "" : "s", count, count == 1 ? "" : "s");
    int dev = dm->coll && ranks ? ranks->local_rank % count : 0;
    e = cudaSetDevice(dev);
    /* The host waits (a staging slot, the sums at a log interval) block instead of spinning, so
     * the host time a step takes is the host's work, and the loader threads keep their cores. */
    if (e == cudaSuccess)
        e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(prop, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(why, size, "visible GPU %d cannot be opened: %s", dev, cudaGetErrorString(e));
    }
    return 0;
}

/* ---- choosing and loading the kernel image */

/* A cubin for sm_XZ runs on compute capability X.Y when Z <= Y; PTX for sm_N is compiled by the
 * driver for any device at or above N. Prefer the newest cubin, then the newest PTX. */
static const RtCudaImage *pick_image(const RtCudaModel *dm, int major, int minor) {
    const RtCudaImage *best = NULL;
    for (const RtCudaImage *im = dm->images; im && im->data; im++)
        if (!im->ptx && im->sm / 10 == major && im->sm % 10 <= minor && (!best || im->sm > best->sm))
            best = im;
    if (best)
        return best;
    for (const RtCudaImage *im = dm->images; im && im->data; im++)
        if (im->ptx && im->sm <= 10 * major + minor && (!best || im->sm > best->sm))
            best = im;
    return best;
}

/* "sm_80, sm_90" for the images of one kind; returns how many there are. */
static int list_images(const RtCudaModel *dm, int ptx, char *buf, size_t size) {
    int n = 0;
    size_t len = 0;
    buf[0] = 0;
    for (const RtCudaImage *im = dm->images; im && im->data; im++) {
        if (im->ptx != ptx || len >= size)
            continue;
        len += snprintf(buf + len, size - len, "%ssm_%d", n ? ", " : "", im->sm);
        n++;
    }
    return n;
}

static int explain_no_image(const RtCudaModel *dm, const struct cudaDeviceProp *prop, char *why, size_t size) {
    char cubins[256], ptxs[256], carried[600];
    int n_cubin = list_images(dm, 0, cubins, sizeof cubins), n_ptx = list_images(dm, 1, ptxs, sizeof ptxs);
    if (n_cubin && n_ptx)
        snprintf(carried, sizeof carried, "kernels for %s (cubin) and %s (PTX)", cubins, ptxs);
    else if (n_cubin || n_ptx)
        snprintf(carried, sizeof carried, "kernels for %s (%s)", n_cubin ? cubins : ptxs, n_cubin ? "cubin" : "PTX");
    else
        snprintf(carried, sizeof carried, "no kernels");
    return fail(why, size, "the GPU (%s) is sm_%d%d, but this trainer carries %s; rebuild it with netc --arch sm_%d%d",
                prop->name, prop->major, prop->minor, carried, prop->major, prop->minor);
}

/* Why the driver refused image `im` (error e), when loading it or, lazily, a kernel of it. */
static int image_refused(const RtCudaImage *im, cudaError_t e, const char *kernel, char *why, size_t size) {
    (void)cudaGetLastError();
    if (e == cudaErrorUnsupportedPtxVersion)
        return fail(why, size, "the NVIDIA driver is too old to compile this trainer's sm_%d PTX (update the "
                               "driver, or rebuild with netc --arch for this GPU): %s", im->sm, cudaGetErrorString(e));
    return fail(why, size, "the sm_%d %s kernel image does not load%s%s%s: %s", im->sm, im->ptx ? "PTX" : "cubin",
                kernel ? " on this GPU (kernel " : "", kernel ? kernel : "", kernel ? ")" : "", cudaGetErrorString(e));
}

static int load_kernels(RtCuda *cu, const RtCudaImage *im, char *why, size_t size) {
    const RtCudaModel *dm = cu->dm;
    cudaError_t e = cudaLibraryLoadData(&cu->library, im->data, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
        cu->library = NULL;
        return image_refused(im, e, NULL, why, size);
    }
    cu->kernels = calloc(dm->n_kernels > 0 ? dm->n_kernels : 1, sizeof *cu->kernels);
    if (!cu->kernels)
        return fail(why, size, "out of host memory");
    for (int k = 0; k < dm->n_kernels; k++) {
        e = cudaLibraryGetKernel(&cu->kernels[k], cu->library, dm->kernel_names[k]);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fail(why, size, "the sm_%d kernel image has no kernel %s (the trainer is damaged, or its "
                                   "images come from different builds): %s", im->sm, dm->kernel_names[k],
                        cudaGetErrorString(e));
        }
        /* Under lazy loading (CUDA's default since 12.2) a library is loaded, and PTX compiled,
         * at a kernel's first use: asking for its attributes does that here, so an image the
         * driver cannot load is this message and not the first launch's stop, and a kernel that
         * cannot run a block of the generated size says so before any capture. */
        struct cudaFuncAttributes attr;
        e = cudaFuncGetAttributes(&attr, (const void *)cu->kernels[k]);
        if (e != cudaSuccess)
            return image_refused(im, e, dm->kernel_names[k], why, size);
        if (attr.maxThreadsPerBlock < RT_CUDA_BLOCK)
            return fail(why, size, "kernel %s runs at most %d threads a block on this GPU, fewer than the %d it is "
                                   "launched with (%d registers a thread): a netc bug, please report it",
                        dm->kernel_names[k], attr.maxThreadsPerBlock, RT_CUDA_BLOCK, attr.numRegs);
    }
    return 0;
}

/* ---- the arena, the library handles and the staging slots */

static size_t dtype_bytes(RtDtype t) {
    switch (t) {
    case RT_F32: return 4;
    case RT_F16: return 2;
    case RT_BF16: return 2;
    case RT_I32: return 4;
    case RT_I64: return 8;
    case RT_U8: return 1;
    }
    rt_cuda_die("internal error: input dtype %d", (int)t);
}

/* One batch of each input, and a check that the staged batch holds them where the generated
 * code says. */
static int size_inputs(RtCuda *cu, char *why, size_t size) {
    const RtModel *m = cu->model;
    const RtCudaModel *dm = cu->dm;
    if (m->n_inputs < 0 || m->n_inputs > RT_MAX_INPUTS)
        return fail(why, size, "internal error: %d inputs (at most %d)", m->n_inputs, RT_MAX_INPUTS);
    if (dm->batch_bytes < (int64_t)sizeof(RtBatchHeader) || dm->off_batch < 0 ||
        dm->off_batch + dm->batch_bytes > dm->device_bytes)
        return fail(why, size, "internal error: the staged batch (%lld bytes at %lld) is not inside the %lld-byte arena",
                    (long long)dm->batch_bytes, (long long)dm->off_batch, (long long)dm->device_bytes);
    for (int i = 0; i < m->n_inputs; i++) {
        const RtInput *in = &m->inputs[i];
        int64_t n = m->batch;
        for (int d = 0; d < in->rank; d++)
            n *= in->shape[d];
        cu->input_bytes[i] = (size_t)n * dtype_bytes(in->dtype);
        if (dm->off_input[i] < (int64_t)sizeof(RtBatchHeader) ||
            dm->off_input[i] + (int64_t)cu->input_bytes[i] > dm->batch_bytes)
            return fail(why, size, "internal error: input %s (%zu bytes at %lld) is not inside the %lld-byte staged batch",
                        in->name, cu->input_bytes[i], (long long)dm->off_input[i], (long long)dm->batch_bytes);
    }
    return 0;
}

static void create_handles(RtCuda *cu) {
    rt_cuda_check(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    rt_cuda_check(cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags (the batches' copy stream)");
    rt_cuda_check_blas(cublasLtCreate(&cu->blaslt), "cublasLtCreate");
    rt_cuda_check_dnn(cudnnCreate(&cu->dnn), "cudnnCreate");
    rt_cuda_check_dnn(cudnnSetStream(cu->dnn, cu->stream), "cudnnSetStream");
}

/* The arena and the landing buffer of one batch beside it; running out of memory is the user's
 * to fix, so it is a `why`. */
static int alloc_arena(RtCuda *cu, const char *gpu, char *why, size_t size) {
    size_t bytes = cu->bytes, batch = (size_t)cu->dm->batch_bytes, free_bytes = 0, total = 0;
    cudaError_t e = cudaMalloc((void **)&cu->base, bytes ? bytes : 1);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&cu->landing, batch);
    else
        cu->base = NULL;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        cu->landing = NULL;
        cudaMemGetInfo(&free_bytes, &total);
        return fail(why, size, "the model needs %.1f MiB of GPU memory (the arena, and one batch on its way in), but "
                               "the GPU (%s) has %.1f MiB free; lower the batch size", (bytes + batch) / 1048576.0,
                    gpu, (free_bytes + (cu->base ? bytes : 0)) / 1048576.0);
    }
    rt_cuda_check(e, "cudaMalloc (the device arena, the landing buffer)");
    /* On the step's stream: a cudaMemset goes on the legacy stream, which a non-blocking stream
     * does not wait for, so the layout write_layout copies next could land before the zeros. */
    rt_cuda_check(cudaMemsetAsync(cu->base, 0, bytes, cu->stream), "cudaMemsetAsync (the device arena)");
    return 0;
}

/* The workspace every library plan shares, the largest any asked for: like the arena, the
 * user's to fit, so running out is a `why`. */
static int alloc_workspace(RtCuda *cu, const char *gpu, char *why, size_t size) {
    size_t free_bytes = 0, total = 0;
    cu->workspace_ready = 1;
    if (!cu->workspace_reserved)
        return 0;
    cudaError_t e = cudaMalloc(&cu->workspace, cu->workspace_reserved);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        cu->workspace = NULL;
        cudaMemGetInfo(&free_bytes, &total);
        return fail(why, size, "the model needs %.1f MiB of GPU memory for the arena and %.1f MiB of library "
                               "workspace, but the GPU (%s) has %.1f MiB free after the arena; lower the batch size",
                    cu->bytes / 1048576.0, cu->workspace_reserved / 1048576.0, gpu,
                    free_bytes / 1048576.0);
    }
    rt_cuda_check(e, "cudaMalloc (the library workspace)");
    return 0;
}

/* The staging slots and the copy's events of the lane in RtCuda's fields. */
static void alloc_slots(RtCuda *cu) {
    size_t bytes = (size_t)cu->dm->batch_bytes;
    const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
    rt_cuda_check(cudaEventCreateWithFlags(&cu->landing_free, flags), "cudaEventCreateWithFlags");
    /* the landing buffer is free from the start; the first batch's copy waits for this record */
    rt_cuda_check(cudaEventRecord(cu->landing_free, cu->stream), "cudaEventRecord (the landing buffer free)");
    for (int s = 0; s < RT_CUDA_SLOTS; s++) {
        rt_cuda_check(cudaHostAlloc((void **)&cu->slot[s], bytes, cudaHostAllocDefault), "cudaHostAlloc (a staging slot)");
        memset(cu->slot[s], 0, bytes);
        rt_cuda_check(cudaEventCreateWithFlags(&cu->slot_free[s], flags), "cudaEventCreateWithFlags");
        /* recorded once, free from the start: a distributed trainer's watched wait queries it */
        rt_cuda_check(cudaEventRecord(cu->slot_free[s], cu->stream), "cudaEventRecord (a free staging slot)");
    }
}

static void alloc_staging(RtCuda *cu) {
    alloc_slots(cu);
    rt_cuda_check(cudaHostAlloc((void **)&cu->host_state, sizeof *cu->host_state, cudaHostAllocDefault),
                  "cudaHostAlloc (the device state)");
    memset(cu->host_state, 0, sizeof *cu->host_state);
    rt_cuda_check(cudaHostAlloc((void **)&cu->posted, sizeof *cu->posted, cudaHostAllocDefault),
                  "cudaHostAlloc (the device's sums for the log)");
    memset(cu->posted, 0, sizeof *cu->posted);
    rt_cuda_check(cudaEventCreateWithFlags(&cu->posted_copied, cudaEventDisableTiming | cudaEventBlockingSync),
                  "cudaEventCreateWithFlags");
}

/* The arena's bytes: what netc sized, then the optimizer state this device keeps - every
 * trainable float's, or with --shard-optimizer (dm->off_shard) only its rank's slices'
 * (rt_shard_slices; all of them for a process outside the ranks' collectives: one rank, or the
 * evaluator of --eval-rank) - then with --accumulate the step's summed gradients. */
static int size_arena(RtCuda *cu, const RtRanks *ranks, char *why, size_t size) {
    const RtModel *m = cu->model;
    cu->bytes = (size_t)cu->dm->device_bytes;
    cu->state_floats = (int64_t)m->n_state_slots * m->n_grad_floats;
    if (cu->dm->off_shard) {
        if (!(cu->shard = calloc((size_t)m->n_buckets * 3 + 1, sizeof *cu->shard)))
            return fail(why, size, "out of host memory for %d gradient buckets", m->n_buckets);
        cu->state_floats = (int64_t)m->n_state_slots * rt_shard_table(m, ranks, cu->shard);
        cu->bytes += (size_t)cu->state_floats * sizeof(float);
    }
    if (cu->accumulate > 1) {
        cu->accum_at = (int64_t)((cu->bytes + 255) & ~(size_t)255);
        cu->bytes = (size_t)cu->accum_at + (size_t)m->n_grad_floats * sizeof(float);
    }
    return 0;
}

/* What the kernels read before any run starts (the slice table, where --accumulate's sum lives
 * and its K): once allocated, and again after the warm-up zeroes the arena. */
static void write_layout(RtCuda *cu) {
    if (cu->shard)
        rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_shard, cu->shard,
                                      ((size_t)cu->model->n_buckets * 3 + 1) * sizeof *cu->shard,
                                      cudaMemcpyHostToDevice, cu->stream),
                      "cudaMemcpyAsync (the optimizer's slices to the device)");
    const RtDevState st = {.accumulate = cu->accumulate, .accum_at = cu->accum_at}; /* pageable: waited for */
    rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_state, &st, sizeof st, cudaMemcpyHostToDevice, cu->stream),
                  "cudaMemcpyAsync (the step state's layout to the device)");
    rt_cuda_check(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize (after the arena's layout)");
}

#define SWAP(a, b)                                                                                        \
    do {                                                                                                  \
        __typeof__(a) swap_ = (a);                                                                        \
        (a) = (b), (b) = swap_;                                                                           \
    } while (0)

/* --eval-async: the step's lane out of RtCuda and the side lane in, or back (cuDNN's handle
 * follows the stream; the library plans take the workspace and stream from RtCuda). */
static void swap_lane(RtCuda *cu) {
    Lane *l = &cu->side;
    SWAP(cu->base, l->base);
    SWAP(cu->stream, l->stream);
    SWAP(cu->workspace, l->workspace);
    SWAP(cu->landing, l->landing);
    SWAP(cu->copy_stream, l->copy_stream);
    SWAP(cu->landing_free, l->landing_free);
    SWAP(cu->next_slot, l->next_slot);
    SWAP(cu->eval_graph, l->eval_graph);
    for (int s = 0; s < RT_CUDA_SLOTS; s++) {
        SWAP(cu->slot[s], l->slot[s]);
        SWAP(cu->slot_free[s], l->slot_free[s]);
    }
    rt_cuda_check_dnn(cudnnSetStream(cu->dnn, cu->stream), "cudnnSetStream");
}

/* --eval-async's lane: a second arena of the same layout up to the evaluation's last region
 * (eval_bytes), a landing buffer, the same workspace again, streams and staging slots; running
 * out of memory is the user's to fix. */
static int open_side(RtCuda *cu, const char *gpu, char *why, size_t size) {
    Lane *l = &cu->side;
    size_t bytes = (size_t)cu->dm->eval_bytes, batch = (size_t)cu->dm->batch_bytes;
    if (!bytes || bytes > cu->bytes)
        return fail(why, size, "internal error: the evaluation's %zu bytes of the %zu-byte arena", bytes, cu->bytes);
    cudaError_t e = cudaMalloc((void **)&l->base, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&l->landing, batch);
    if (e == cudaSuccess && cu->workspace_reserved)
        e = cudaMalloc(&l->workspace, cu->workspace_reserved);
    if (e == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total = 0;
        (void)cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total);
        return fail(why, size, "--eval-async needs a second arena of %.1f MiB (with one batch on its way in) and "
                               "%.1f MiB of workspace for the evaluation, but the GPU (%s) has %.1f MiB free; evaluate "
                               "without --eval-async, or lower the batch size", (bytes + batch) / 1048576.0,
                    cu->workspace_reserved / 1048576.0, gpu, free_bytes / 1048576.0);
    }
    rt_cuda_check(e, "cudaMalloc (the evaluation's arena)");
    rt_cuda_check(cudaEventCreateWithFlags(&cu->snapshot, cudaEventDisableTiming | cudaEventBlockingSync),
                  "cudaEventCreateWithFlags");
    swap_lane(cu);
    rt_cuda_check(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags (the evaluation's stream)");
    rt_cuda_check(cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags (the evaluation's copy stream)");
    /* zeroed on its own stream, which everything of the lane follows (alloc_arena) */
    rt_cuda_check(cudaMemsetAsync(cu->base, 0, bytes, cu->stream), "cudaMemsetAsync (the evaluation's arena)");
    alloc_slots(cu);
    swap_lane(cu);
    return 0;
}

/* Wait for `until` (an event recorded on the stream), or with NULL for all the queued work; a
 * distributed trainer's wait also watches its collectives. */
static void wait_until(RtCuda *cu, cudaEvent_t until, const char *what) {
    if (cu->coll_open)
        cu->dm->coll->wait(cu, until, what);
    else
        rt_cuda_check(until ? cudaEventSynchronize(until) : cudaStreamSynchronize(cu->stream), what);
}

static void sync_stream(RtCuda *cu, const char *what) { wait_until(cu, NULL, what); }

/* --eval-async's lane, all its queued work: watched like the step's, since the side stream waits
 * for a snapshot taken after the step's collectives. */
static void sync_side(RtCuda *cu, const char *what) {
    swap_lane(cu);
    sync_stream(cu, what);
    swap_lane(cu);
}

/* ---- the step, enqueued directly or captured */

enum { EVAL = -1 }; /* enqueue_step's `part` for an evaluation step; else the RtStepPart of a training one */

/* The training parts this run launches, into part[]: RT_STEP_WHOLE, or with --accumulate
 * RT_STEP_SUM and RT_STEP_LAST; returns how many. */
static int train_parts(const RtCuda *cu, RtStepPart part[2]) {
    if (cu->accumulate == 1)
        return part[0] = RT_STEP_WHOLE, 1;
    return part[0] = RT_STEP_SUM, part[1] = RT_STEP_LAST, 2;
}

static void run_step(RtCuda *cu, int part) {
    if (part == EVAL)
        cu->dm->eval(cu);
    else
        cu->dm->train(cu, (RtStepPart)part);
}

/* The landed batch into the arena, then the step. In a capture the event record becomes a graph
 * node (cudaEventRecordExternal), so every launch of the graph records it again. */
static void enqueue_step(RtCuda *cu, int part, int in_graph) {
    rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_batch, cu->landing, (size_t)cu->dm->batch_bytes,
                                  cudaMemcpyDeviceToDevice, cu->stream),
                  "cudaMemcpyAsync (the landed batch into the arena)");
    rt_cuda_check(cudaEventRecordWithFlags(cu->landing_free, cu->stream,
                                           in_graph ? cudaEventRecordExternal : cudaEventRecordDefault),
                  "cudaEventRecordWithFlags (the landing buffer free)");
    run_step(cu, part);
}

/* Libraries may allocate or load lazily on their first call, which a capture forbids: run each
 * step once on the zeroed arena first. Parameters and state are uploaded and started later, but
 * the arena is zeroed again so nothing of this run is left behind. */
static void warm_up(RtCuda *cu) {
    RtStepPart part[2];
    for (int p = 0, n = train_parts(cu, part); p < n; p++)
        run_step(cu, part[p]);
    run_step(cu, EVAL);
    sync_stream(cu, "the warm-up step");
    rt_cuda_check(cudaMemsetAsync(cu->base, 0, cu->bytes, cu->stream), "cudaMemsetAsync (the arena)");
    rt_cuda_check(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize");
    write_layout(cu);
    if (!cu->eval_async)
        return;
    swap_lane(cu); /* the evaluation's lane the same way */
    run_step(cu, EVAL);
    rt_cuda_check(cudaMemsetAsync(cu->base, 0, (size_t)cu->dm->eval_bytes, cu->stream),
                  "cudaMemsetAsync (the evaluation's arena)");
    rt_cuda_check(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize (the evaluation's warm-up)");
    swap_lane(cu);
}

/* Thread-local capture mode: a call of this thread that would synchronise with the device fails
 * the capture instead of silently leaving the graph incomplete. Not global: NCCL's proxy thread
 * makes CUDA calls of its own while a distributed step's collectives are captured (NCCL's own
 * tests capture this way), and no other thread of the trainer calls CUDA (the loader thread
 * reads files only). */
static int capture(RtCuda *cu, int part, const char *name, cudaGraphExec_t *exec, char *why, size_t size) {
    cudaGraph_t graph = NULL;
    cu->capturing = 1;
    rt_cuda_check(cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    enqueue_step(cu, part, 1);
    cudaError_t e = cudaStreamEndCapture(cu->stream, &graph);
    cu->capturing = 0;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        return fail(why, size, "the %s step cannot be captured as a CUDA graph (%s): %s; run the trainer with "
                               "--no-graph", name, e == cudaErrorStreamCaptureUnjoined ? "internal error: work forked "
                               "onto the collectives' stream was not joined back" : "a call in it synchronised with "
                               "the device", cudaGetErrorString(e));
    }
    e = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    rt_cuda_check(e, "cudaGraphInstantiate");
    return 0;
}

static int capture_graphs(RtCuda *cu, char *why, size_t size) {
    static const char *const names[] = {[RT_STEP_WHOLE] = "training", [RT_STEP_SUM] = "training (a batch summed)",
                                        [RT_STEP_LAST] = "training (a step's last batch)"};
    RtStepPart part[2];
    int n = train_parts(cu, part);
    for (int p = 0; p < n; p++)
        if (capture(cu, part[p], names[part[p]], &cu->train_graph[part[p]], why, size))
            return 1;
    if (capture(cu, EVAL, "evaluation", &cu->eval_graph, why, size))
        return 1;
    if (!cu->eval_async)
        return 0;
    swap_lane(cu);
    int failed = capture(cu, EVAL, "evaluation (--eval-async)", &cu->eval_graph, why, size);
    swap_lane(cu);
    return failed;
}

/* ---- the hooks */

/* A lane's evaluation graph, staging slots, copy stream, landing buffer and their events, those
 * that exist; `o` is the side's Lane or the step's RtCuda, whose fields have the same names. */
#define FREE_LANE(o)                                                                                      \
    do {                                                                                                  \
        if ((o)->eval_graph)                                                                              \
            cudaGraphExecDestroy((o)->eval_graph);                                                        \
        for (int s_ = 0; s_ < RT_CUDA_SLOTS; s_++) {                                                      \
            if ((o)->slot_free[s_])                                                                       \
                cudaEventDestroy((o)->slot_free[s_]);                                                     \
            if ((o)->slot[s_])                                                                            \
                cudaFreeHost((o)->slot[s_]);                                                              \
        }                                                                                                 \
        if ((o)->landing_free)                                                                            \
            cudaEventDestroy((o)->landing_free);                                                          \
        if ((o)->copy_stream)                                                                             \
            cudaStreamDestroy((o)->copy_stream);                                                          \
        if ((o)->landing)                                                                                 \
            cudaFree((o)->landing);                                                                       \
    } while (0)

/* Release whatever exists, in reverse order of creation; also the way out of a failed open(). */
static void teardown(RtCuda *cu) {
    Lane *l = &cu->side;
    FREE_LANE(l);
    if (l->stream)
        cudaStreamDestroy(l->stream);
    if (l->workspace)
        cudaFree(l->workspace);
    if (l->base)
        cudaFree(l->base);
    if (cu->snapshot)
        cudaEventDestroy(cu->snapshot);
    for (int p = 0; p < 3; p++)
        if (cu->train_graph[p])
            cudaGraphExecDestroy(cu->train_graph[p]);
    FREE_LANE(cu);
    if (cu->posted_copied)
        cudaEventDestroy(cu->posted_copied);
    if (cu->posted)
        cudaFreeHost(cu->posted);
    if (cu->output)
        cudaFreeHost(cu->output);
    if (cu->host_state)
        cudaFreeHost(cu->host_state);
    if (cu->coll_open)
        cu->dm->coll->close();
    rt_cuda_gemm_plans_free();
    rt_cuda_conv_plans_free();
    if (cu->workspace)
        cudaFree(cu->workspace);
    if (cu->base)
        cudaFree(cu->base);
    if (cu->dnn)
        cudnnDestroy(cu->dnn);
    if (cu->blaslt)
        cublasLtDestroy(cu->blaslt);
    if (cu->stream)
        cudaStreamDestroy(cu->stream);
    free(cu->kernels);
    free(cu->shard);
    if (cu->library)
        cudaLibraryUnload(cu->library);
    memset(cu, 0, sizeof *cu);
}

/* Everything after the device is found and its image chosen; non-zero with `why` on failure. */
static int set_up(RtCuda *cu, const RtRanks *ranks, const RtCudaImage *im, const char *gpu, char *why,
                  size_t size) {
    if (load_kernels(cu, im, why, size))
        return 1;
    create_handles(cu);
    if (cu->dm->coll && ranks && ranks->comm) { /* before the warm-up step, whose collectives need every rank */
        if (cu->dm->coll->open(cu, ranks, why, size))
            return 1;
        cu->coll_open = 1;
    }
    if (size_arena(cu, ranks, why, size) || alloc_arena(cu, gpu, why, size))
        return 1;
    write_layout(cu);
    if (cu->dm->plan)
        cu->dm->plan(cu);
    if (cu->refused[0])
        return fail(why, size, "%s (the GPU, %s, has too little memory left beside the %.1f MiB arena); lower the "
                               "batch size", cu->refused, gpu, cu->bytes / 1048576.0);
    if (alloc_workspace(cu, gpu, why, size) || (cu->eval_async && open_side(cu, gpu, why, size)))
        return 1;
    alloc_staging(cu);
    warm_up(cu);
    return cu->use_graph ? capture_graphs(cu, why, size) : 0;
}

static int cuda_open(const RtModel *m, const RtRanks *ranks, const RtDeviceOptions *o, char *why, size_t size) {
    RtCuda *cu = &g_cu;
    struct cudaDeviceProp prop;
    if (cu->dm)
        return fail(why, size, "internal error: the CUDA device is already open");
    cu->model = m;
    cu->dm = m->device_model;
    cu->use_graph = o->use_graph;
    cu->eval_async = o->eval_async;
    cu->accumulate = o->accumulate > 1 ? o->accumulate : 1;
    if (!cu->dm || !cu->dm->train || !cu->dm->eval) {
        memset(cu, 0, sizeof *cu);
        return fail(why, size, "internal error: the trainer has no CUDA step");
    }
    if (size_inputs(cu, why, size) || find_device(cu->dm, ranks, &prop, why, size)) {
        memset(cu, 0, sizeof *cu);
        return 1;
    }
    const RtCudaImage *im = pick_image(cu->dm, prop.major, prop.minor);
    if (!im) {
        memset(cu, 0, sizeof *cu);
        return explain_no_image(m->device_model, &prop, why, size);
    }
    if (set_up(cu, ranks, im, prop.name, why, size)) {
        teardown(cu);
        return 1;
    }
    return 0;
}

static void cuda_upload(const float *params, const float *optstate) {
    RtCuda *cu = &g_cu;
    const RtModel *m = cu->model;
    size_t state_floats = (size_t)cu->state_floats;
    rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_params, params, rt_device_param_floats(m) * sizeof(float),
                                  cudaMemcpyHostToDevice, cu->stream),
                  "cudaMemcpyAsync (parameters to the device)");
    uint16_t *half = NULL; /* netc --frozen-half: the frozen parameters it keeps in half */
    if (m->n_half_params) {
        if (!(half = malloc((size_t)m->n_half_params * sizeof *half)))
            rt_cuda_die("out of host memory for %lld frozen parameters in half", (long long)m->n_half_params);
        rt_half_params(m, params, half);
        rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_half_params, half, (size_t)m->n_half_params * sizeof *half,
                                      cudaMemcpyHostToDevice, cu->stream),
                      "cudaMemcpyAsync (frozen parameters in half to the device)");
    }
    if (state_floats && optstate)
        rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_optstate, optstate, state_floats * sizeof(float),
                                      cudaMemcpyHostToDevice, cu->stream),
                      "cudaMemcpyAsync (optimizer state to the device)");
    /* the host buffers are pageable and the caller's to reuse once this returns */
    sync_stream(cu, "cudaStreamSynchronize (after the upload)");
    free(half);
}

static void cuda_download(float *params, float *optstate) {
    RtCuda *cu = &g_cu;
    const RtModel *m = cu->model;
    size_t state_floats = (size_t)cu->state_floats;
    /* not the frozen parameters kept in half: the host's float32 values are theirs */
    rt_cuda_check(cudaMemcpyAsync(params, cu->base + cu->dm->off_params, rt_device_param_floats(m) * sizeof(float),
                                  cudaMemcpyDeviceToHost, cu->stream),
                  "cudaMemcpyAsync (parameters from the device)");
    if (state_floats && optstate)
        rt_cuda_check(cudaMemcpyAsync(optstate, cu->base + cu->dm->off_optstate, state_floats * sizeof(float),
                                      cudaMemcpyDeviceToHost, cu->stream),
                      "cudaMemcpyAsync (optimizer state from the device)");
    sync_stream(cu, "cudaStreamSynchronize (after the download)");
}

/* A fresh RtDevState: the run's constants, every sum zero. Before the first step, so it waits. */
static void cuda_start(int64_t step, int64_t per_epoch, int64_t total, uint64_t seed, const RtLossScale *scale) {
    RtCuda *cu = &g_cu;
    memset(cu->host_state, 0, sizeof *cu->host_state);
    cu->host_state->step = step;
    cu->host_state->per_epoch = per_epoch;
    cu->host_state->total = total;
    cu->host_state->seed = seed;
    cu->host_state->accumulate = cu->accumulate;
    cu->host_state->accum_at = cu->accum_at;
    cu->host_state->schedule = cu->model->schedule; /* the run's recipe, the trainer's options applied */
    cu->host_state->hyper = cu->model->hyper;
    if (scale) rt_devstate_set_scale(cu->host_state, scale);
    rt_cuda_check(cudaMemcpyAsync(cu->base + cu->dm->off_state, cu->host_state, sizeof *cu->host_state,
                                  cudaMemcpyHostToDevice, cu->stream),
                  "cudaMemcpyAsync (the run's state to the device)");
    rt_cuda_check(cudaStreamSynchronize(cu->stream), "cudaStreamSynchronize (after writing the run's state)");
}

/* Fill the next staging slot (once its last copy is done), copy it to the landing buffer on the
 * copy stream (once the step before has taken the last batch on into the arena), and enqueue the
 * step behind that copy. */
static void stage_and_run(void *const *batch, int64_t n_valid, int part) {
    RtCuda *cu = &g_cu;
    int s = cu->next_slot;
    cu->next_slot = (s + 1) % RT_CUDA_SLOTS;
    /* watched: the slot's copy two batches ago waited for the landing buffer, which frees as the
     * step after it starts, behind every collective before; so a rank that hangs stops the others
     * here (wait_until) a step or two later */
    wait_until(cu, cu->slot_free[s], "cudaEventSynchronize (waiting for a staging slot)");
    ((RtBatchHeader *)cu->slot[s])->n_valid = n_valid;
    for (int i = 0; i < cu->model->n_inputs; i++)
        memcpy(cu->slot[s] + cu->dm->off_input[i], batch[i], cu->input_bytes[i]);
    rt_cuda_check(cudaStreamWaitEvent(cu->copy_stream, cu->landing_free, 0),
                  "cudaStreamWaitEvent (the copy stream, for the landing buffer)");
    rt_cuda_check(cudaMemcpyAsync(cu->landing, cu->slot[s], (size_t)cu->dm->batch_bytes, cudaMemcpyHostToDevice,
                                  cu->copy_stream),
                  "cudaMemcpyAsync (staging slot to the device)");
    /* the copy done: the slot free for the host, the batch in `landing` for the step */
    rt_cuda_check(cudaEventRecord(cu->slot_free[s], cu->copy_stream), "cudaEventRecord (staging slot free)");
    rt_cuda_check(cudaStreamWaitEvent(cu->stream, cu->slot_free[s], 0), "cudaStreamWaitEvent (the step, for its batch)");
    if (cu->use_graph)
        rt_cuda_check(cudaGraphLaunch(part == EVAL ? cu->eval_graph : cu->train_graph[part], cu->stream),
                      part == EVAL ? "cudaGraphLaunch (evaluation step)" : "cudaGraphLaunch (training step)");
    else
        enqueue_step(cu, part, 0);
}

static void cuda_train_step(void *const *batch, RtStepPart part) {
    if ((part == RT_STEP_WHOLE) != (g_cu.accumulate == 1))
        rt_cuda_die("internal error: a training launch of part %d with --accumulate %d", (int)part, g_cu.accumulate);
    stage_and_run(batch, g_cu.model->batch, (int)part);
}
static void cuda_eval_step(void *const *batch, int64_t n_valid) { stage_and_run(batch, n_valid, EVAL); }

/* The device state as of the end of the queued work: the one place the host waits for steps. */
static const RtDevState *read_state(RtCuda *cu) {
    rt_cuda_check(cudaMemcpyAsync(cu->host_state, cu->base + cu->dm->off_state, sizeof *cu->host_state,
                                  cudaMemcpyDeviceToHost, cu->stream),
                  "cudaMemcpyAsync (the device state to the host)");
    sync_stream(cu, "cudaStreamSynchronize (the queued steps)");
    return cu->host_state;
}

/* Reset one field of the device's RtDevState, in stream order after the read. */
#define ZERO_STATE_FIELD(cu, field)                                                                      \
    rt_cuda_check(cudaMemsetAsync((cu)->base + (cu)->dm->off_state + offsetof(RtDevState, field), 0,     \
                                  sizeof(((RtDevState *)0)->field), (cu)->stream),                       \
                  "cudaMemsetAsync (resetting RtDevState." #field ")")

/* The training sums since the last post, copied behind the queued steps into `posted` and reset
 * in stream order; the host goes on queueing steps and takes the copy once the device has got
 * there (cudaEventQuery), or waits for it (a blocking-sync event: the host sleeps). */
static void cuda_post_train(void) {
    RtCuda *cu = &g_cu;
    rt_cuda_check(cudaMemcpyAsync(cu->posted, cu->base + cu->dm->off_state, sizeof *cu->posted,
                                  cudaMemcpyDeviceToHost, cu->stream),
                  "cudaMemcpyAsync (the device's sums to the host)");
    rt_cuda_check(cudaEventRecord(cu->posted_copied, cu->stream), "cudaEventRecord (the device's sums copied)");
    ZERO_STATE_FIELD(cu, loss_sum);
    ZERO_STATE_FIELD(cu, correct_sum);
    ZERO_STATE_FIELD(cu, loss_steps);
}

static int cuda_take_train(RtDeviceSums *sums, int wait) {
    RtCuda *cu = &g_cu;
    if (!wait) {
        cudaError_t e = cudaEventQuery(cu->posted_copied);
        if (e == cudaErrorNotReady)
            return 0;
        rt_cuda_check(e, "cudaEventQuery (the device's sums for the log)");
    } else {
        wait_until(cu, cu->posted_copied, "cudaEventSynchronize (the device's sums for the log)");
    }
    const RtDevState *st = cu->posted;
    sums->loss = st->loss_sum;
    memcpy(sums->correct, st->correct_sum, sizeof sums->correct);
    sums->steps = st->loss_steps;
    sums->nonfinite_step = st->nonfinite_step;
    sums->grad_norm = st->grad_norm;
    sums->nonfinite_grads = st->nonfinite_grads;
    sums->scale = rt_devstate_scale(st);
    return 1;
}

static void cuda_read_eval(double *loss_sum, double *correct) {
    RtCuda *cu = &g_cu;
    const RtDevState *st = read_state(cu);
    *loss_sum = st->eval_loss;
    memcpy(correct, st->eval_correct, sizeof st->eval_correct);
    ZERO_STATE_FIELD(cu, eval_loss);
    ZERO_STATE_FIELD(cu, eval_correct);
}

/* --predict: the output of the last evaluation batch, copied behind it into pinned memory (taken
 * at the first call) and converted by the generated output_to_host. */
static void cuda_read_output(float *out) {
    RtCuda *cu = &g_cu;
    const RtCudaModel *dm = cu->dm;
    if (!dm->output_to_host)
        rt_cuda_die("internal error: --predict on a model whose device step has no output");
    if (!cu->output)
        rt_cuda_check(cudaHostAlloc((void **)&cu->output, (size_t)dm->output_bytes, cudaHostAllocDefault),
                      "cudaHostAlloc (the model's output on the host)");
    rt_cuda_check(cudaMemcpyAsync(cu->output, cu->base + dm->off_output, (size_t)dm->output_bytes,
                                  cudaMemcpyDeviceToHost, cu->stream),
                  "cudaMemcpyAsync (the model's output to the host)");
    sync_stream(cu, "cudaStreamSynchronize (the model's output)");
    dm->output_to_host(cu->output, out);
}

/* --eval-async's hooks (netrt.h): the parameters copied in the step stream's order, which the
 * evaluation's stream waits for; its batches staged and run in its lane. */
static void cuda_eval_async_begin(void) {
    RtCuda *cu = &g_cu;
    const RtCudaModel *dm = cu->dm;
    rt_cuda_check(cudaMemcpyAsync(cu->side.base + dm->off_params, cu->base + dm->off_params,
                                  rt_device_param_floats(cu->model) * sizeof(float), cudaMemcpyDeviceToDevice,
                                  cu->stream),
                  "cudaMemcpyAsync (the parameters to evaluate)");
    if (cu->model->n_half_params) /* frozen, but the second arena was never uploaded to */
        rt_cuda_check(cudaMemcpyAsync(cu->side.base + dm->off_half_params, cu->base + dm->off_half_params,
                                      (size_t)cu->model->n_half_params * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                                      cu->stream),
                      "cudaMemcpyAsync (the frozen parameters in half to evaluate)");
    rt_cuda_check(cudaEventRecord(cu->snapshot, cu->stream), "cudaEventRecord (the parameters to evaluate)");
    rt_cuda_check(cudaStreamWaitEvent(cu->side.stream, cu->snapshot, 0), "cudaStreamWaitEvent (the evaluation)");
    rt_cuda_check(cudaMemsetAsync(cu->side.base + dm->off_state, 0, sizeof(RtDevState), cu->side.stream),
                  "cudaMemsetAsync (the evaluation's sums)");
}

static void cuda_eval_async_step(void *const *batch, int64_t n_valid) {
    swap_lane(&g_cu);
    stage_and_run(batch, n_valid, EVAL);
    swap_lane(&g_cu);
}

static void cuda_eval_async_read(double *loss_sum, double *correct) {
    RtCuda *cu = &g_cu;
    rt_cuda_check(cudaMemcpyAsync(cu->host_state, cu->side.base + cu->dm->off_state, sizeof *cu->host_state,
                                  cudaMemcpyDeviceToHost, cu->side.stream),
                  "cudaMemcpyAsync (the evaluation's sums to the host)");
    sync_side(cu, "cudaStreamSynchronize (the evaluation's batches)");
    *loss_sum = cu->host_state->eval_loss;
    memcpy(correct, cu->host_state->eval_correct, sizeof cu->host_state->eval_correct);
}

static void cuda_close(void) {
    RtCuda *cu = &g_cu;
    if (cu->side.stream) /* an evaluation the run left behind (its data changed) */
        sync_side(cu, "cudaStreamSynchronize (closing the evaluation)");
    if (cu->stream)
        sync_stream(cu, "cudaStreamSynchronize (closing the device)");
    teardown(cu);
}

const RtDevice rt_cuda_device = {
    .name = "cuda",
    .open = cuda_open,
    .upload = cuda_upload,
    .download = cuda_download,
    .start = cuda_start,
    .train_step = cuda_train_step,
    .eval_step = cuda_eval_step,
    .post_train = cuda_post_train,
    .take_train = cuda_take_train,
    .read_eval = cuda_read_eval,
    .read_output = cuda_read_output,
    .eval_async_begin = cuda_eval_async_begin,
    .eval_async_step = cuda_eval_async_step,
    .eval_async_read = cuda_eval_async_read,
    .close = cuda_close,
};
