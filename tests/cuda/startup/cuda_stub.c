/* cuda_stub.c - the CUDA runtime, cuBLASLt and cuDNN as libnetrt_cuda calls them, answered on
 * the CPU, so that the real start-up path of a GPU trainer runs in CI without a GPU.
 *
 * tests/cuda/startup/startup.sh links a trainer's generated host C, its NVRTC images and the
 * real libnetrt_cuda against this file instead of cudart, cuBLASLt and cuDNN. What the runtime
 * does then runs as written: pick_image chooses among the trainer's own cubins and PTX,
 * load_kernels looks every kernel name up in that image, plan() builds every cuBLASLt and cuDNN
 * plan, the arena and the staging slots are allocated, the step is warmed up and captured as
 * four graphs, and training steps replay them. What no CPU can do is skipped: kernels and
 * library calls are checked and counted, never computed.
 *
 * The stub is strict where the real libraries are, so that a mistake that would cost the first
 * day on a GPU fails here:
 *   - an image loads only onto a device it can run on: a cubin's ELF header names its
 *     architecture (EM_CUDA, e_flags), which must have the device's major version and a minor
 *     at or below it; PTX (".target sm_NN") loads onto sm_NN and newer. A kernel is found only
 *     if the image defines it (a GLOBAL FUNC symbol of the cubin, a ".entry" of the PTX).
 *   - while a stream is captured (in thread-local mode: the trainer's one thread that calls
 *     CUDA), calls that may synchronise (cudaMalloc, cudaFree, cudaMemset,
 *     cudaStreamSynchronize, cudaEventSynchronize, cudaHostAlloc) fail and invalidate the
 *     capture; a captured copy must use pinned host memory.
 *   - every device pointer a copy, memset, product or convolution touches must lie, with its
 *     whole extent, inside one device allocation; a kernel's one argument must be an
 *     allocation's base (the arena).
 *   - a matrix product's layouts must agree with its transposes (m x k times k x n); a
 *     convolution's output dimensions are computed as cuDNN computes them.
 *   - cuDNN's heuristic ranks first a non-deterministic algorithm, a tensor-op one, one whose
 *     workspace is 4 GiB and one that fails when run, so the planner's refusals and its fallback
 *     to PyTorch's default are exercised; cuBLASLt offers one algorithm.
 *   - the device is asked to block, not spin, when the host waits (cudaSetDeviceFlags, and
 *     cudaEventBlockingSync on every event): the log says when it is not.
 *   - a capture may fork: a stream that waits for an event recorded on a captured stream joins
 *     the capture, and its work must be joined back (the origin waits for an event recorded
 *     after it) before cudaStreamEndCapture, which otherwise fails as CUDA's does
 *     (cudaErrorStreamCaptureUnjoined); an event recorded outside the capture cannot be waited
 *     for inside it (cudaErrorStreamCaptureIsolation).
 *   - the streams' work is ordered as on a GPU, where streams run concurrently: every access to
 *     device or pinned memory must happen after every overlapping access of another stream, or
 *     of the host, that it conflicts with, through events and synchronisations (below, "the
 *     order of the work"); a staging buffer refilled or read while a copy may still be using
 *     it aborts the run here, which the stub's immediate copies would otherwise hide.
 *   - with NETC_STUB_NCCL (a distributed trainer: libnetrt_nccl), NCCL for one rank: a
 *     communicator from an id ncclGetUniqueId made; in-place float all-reduces of device memory
 *     on a stream of their own, never the step's stream, captured like any other work.
 * Any violation prints "cuda_stub: ..." and aborts (exit by SIGABRT): a test cannot mistake it
 * for a clean run.
 *
 * Environment: NETC_STUB_SM=90 makes one device of compute capability 9.0 visible (unset: no
 * device); NETC_STUB_MEM_MIB its memory (default 81920); NETC_STUB_LOG=FILE receives one line
 * per event the test reads (image chosen, kernels found, plans, captures, a summary at exit).
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <elf.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_devstate.h"

#ifndef EM_CUDA
#define EM_CUDA 190
#endif

/* ---- the log and the checks */

static FILE *log_file;
static struct {
    long kernels_found, attributes, launches, captured_launches, graph_launches, gemms, convs, transforms, copies;
    long offset_launches; /* launches of kernels that take an RtKAt (rt_cuda_launch_at) */
    long collectives, captured_collectives;
    long second_stream_launches; /* graphs launched on another stream than the first one captured on */
    long stream_syncs;           /* cudaStreamSynchronize and cudaStreamQuery: the host waits for all its work */
    long queries_not_ready;      /* cudaEventQuery answered cudaErrorNotReady */
} counts;

static void stub_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void stub_log(const char *fmt, ...) {
    static int opened;
    if (!opened) {
        const char *path = getenv("NETC_STUB_LOG");
        opened = 1;
        log_file = path ? fopen(path, "a") : NULL;
    }
    if (!log_file)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(log_file, fmt, ap);
    va_end(ap);
    fputc('\n', log_file);
    fflush(log_file);
}

static _Noreturn void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void violation(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fputs("cuda_stub: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

__attribute__((destructor)) static void summary(void) {
    stub_log("summary: %ld kernels found, %ld kernel attributes, %ld kernel launches (%ld captured), "
             "%ld launches with operand offsets, %ld graph launches, %ld products, "
             "%ld convolutions, %ld filter transforms, %ld copies, %ld collectives, %ld captured collectives, "
             "%ld graph launches on a second stream, %ld stream waits, %ld events not ready",
             counts.kernels_found, counts.attributes, counts.launches, counts.captured_launches, counts.offset_launches,
             counts.graph_launches, counts.gemms, counts.convs,
             counts.transforms, counts.copies, counts.collectives, counts.captured_collectives,
             counts.second_stream_launches, counts.stream_syncs, counts.queries_not_ready);
}

/* ---- the device: compute capability and memory from the environment */

static int device_sm(void) {
    const char *s = getenv("NETC_STUB_SM");
    return s && *s ? atoi(s) : 0;
}

static size_t device_memory(void) {
    const char *s = getenv("NETC_STUB_MEM_MIB");
    return (size_t)(s && *s ? atoll(s) : 81920) << 20;
}

/* ---- allocations: device memory and pinned host memory are host memory, tracked by range */

typedef struct Alloc {
    unsigned char *p;
    size_t size;
    int pinned; /* cudaHostAlloc, else cudaMalloc */
    struct Alloc *next;
} Alloc;

static Alloc *allocs;
static size_t device_used;

static Alloc *find_alloc(const void *p, size_t bytes, int pinned) {
    const unsigned char *q = p;
    for (Alloc *a = allocs; a; a = a->next)
        if (a->pinned == pinned && q >= a->p && q <= a->p + a->size && bytes <= (size_t)(a->p + a->size - q))
            return a;
    return NULL;
}

static void check_device(const void *p, size_t bytes, const char *what) {
    if (!find_alloc(p, bytes, 0))
        violation("%s: %zu bytes at %p are not inside one device allocation", what, bytes, p);
}

static cudaError_t add_alloc(void **p, size_t size, int pinned) {
    if (!pinned && device_used + size > device_memory())
        return cudaErrorMemoryAllocation;
    Alloc *a = calloc(1, sizeof *a);
    size_t rounded = (size + 255) / 256 * 256;
    if (!a || !(a->p = aligned_alloc(256, rounded ? rounded : 256)))
        violation("out of host memory for %zu bytes", size);
    memset(a->p, 0, rounded);
    a->size = size, a->pinned = pinned, a->next = allocs, allocs = a;
    if (!pinned)
        device_used += size;
    *p = a->p;
    return cudaSuccess;
}

static void forget(const unsigned char *p, size_t bytes);

static cudaError_t free_alloc(void *p, int pinned) {
    for (Alloc **a = &allocs; *a; a = &(*a)->next)
        if ((*a)->p == p && (*a)->pinned == pinned) {
            Alloc *dead = *a;
            *a = dead->next;
            forget(dead->p, dead->size); /* cudaFree waits for the device: its accesses are over */
            if (!pinned)
                device_used -= dead->size;
            free(dead->p);
            free(dead);
            return cudaSuccess;
        }
    return p ? cudaErrorInvalidValue : cudaSuccess;
}

/* ---- the order of the work
 *
 * The stub does a copy when it is enqueued, so its bytes are always right here; on a GPU the
 * streams run concurrently, and only events order one stream's work against another's or the
 * host's. So each agent - the host, and each stream - keeps a vector clock. Work on a stream
 * advances the stream's own entry; enqueueing it takes the host's clock (what the host did
 * before the call happens before the work); recording an event copies the stream's clock into
 * the event; a stream that waits for the event, and the host when it synchronises with it (or
 * with a whole stream, or finds it done by a query), take the larger of each entry.
 *
 * Each access to device or pinned memory - a copy or memset (its bytes), a kernel (the whole
 * arena it is given), a product, convolution or transform (the whole allocation of each
 * operand) - is checked against the last access of every other agent to overlapping bytes:
 * where either writes, the earlier must happen before the later, else the run aborts
 * ("unordered"). A host-to-device copy out of pinned memory counts as the host writing its
 * source first, as the trainer fills a staging slot (or the pinned step state) right before it
 * copies it out. Captured work is kept in its graph as a list of these accesses and event
 * records, and a launch replays the list on its stream in capture order (a capture's forked
 * streams are joined back before it ends, so a graph is taken as ordered within itself). Not
 * modelled: the host's reads of pinned memory a copy filled, and the collectives' in-place sums
 * (the gradients a backward kernel, taken as touching the whole arena, is still writing
 * elsewhere; their fork and join are checked above). */

enum { MAX_AGENTS = 16, MAX_ACCESSES = 4096, HOST = 0 };
typedef struct {
    unsigned long t[MAX_AGENTS];
} Clock;
typedef struct {
    int agent;           /* HOST, or a stream's number */
    unsigned long stamp; /* the agent's clock entry when it accessed */
    const unsigned char *p;
    size_t bytes;
    int write;
    const char *what;
} Access;
/* captured work: an access (by the launching stream, or by the host before the launch), or an
 * event record */
typedef struct {
    cudaEvent_t record; /* non-NULL: an event record node */
    int by_host;        /* the host's fill of a pinned source, before the launch */
    const unsigned char *p;
    size_t bytes;
    int write;
    const char *what;
} Node;

static Clock host_clock;
static int n_agents = 1;                 /* the host and the streams created so far */
static Access accesses[MAX_ACCESSES];    /* each agent's last access of each kind to each range */
static int n_accesses;
static Node *captured;                   /* the capture under way: its nodes */
static long n_captured, captured_cap;

static void merge(Clock *into, const Clock *from) {
    for (int i = 0; i < MAX_AGENTS; i++)
        if (from->t[i] > into->t[i])
            into->t[i] = from->t[i];
}

static const char *agent_name(int agent, char *buf, size_t size) {
    if (agent == HOST)
        return "the host";
    snprintf(buf, size, "stream %d", agent);
    return buf;
}

/* Agent `agent`, whose clock is c, accesses [p, p + bytes): check it against the other agents'
 * conflicting accesses, then remember it (in place of the agent's earlier one of the same kind
 * to the same bytes, which its program order puts before this one). */
static void access_now(int agent, Clock *c, const unsigned char *p, size_t bytes, int write, const char *what) {
    unsigned long stamp = ++c->t[agent];
    Access *same = NULL;
    for (int i = 0; i < n_accesses; i++) {
        Access *a = &accesses[i];
        if (a->agent == agent) {
            if (a->p == p && a->bytes == bytes && a->write == write)
                same = a;
            continue;
        }
        if (!(a->write || write) || a->p >= p + bytes || p >= a->p + a->bytes || c->t[a->agent] >= a->stamp)
            continue;
        char n1[32], n2[32];
        violation("unordered: %s %s %zu bytes at %p (%s), and %s %s %zu bytes at %p (%s) before it, with no event "
                  "or synchronisation between the two: on a GPU they may run at the same time",
                  agent_name(agent, n1, sizeof n1), write ? "writes" : "reads", bytes, (const void *)p, what,
                  agent_name(a->agent, n2, sizeof n2), a->write ? "wrote" : "read", a->bytes, (const void *)a->p,
                  a->what);
    }
    if (!same) {
        if (n_accesses == MAX_ACCESSES)
            violation("more than %d distinct accesses to remember", MAX_ACCESSES);
        same = &accesses[n_accesses++];
    }
    *same = (Access){agent, stamp, p, bytes, write, what};
}

/* cudaFree's memory: its accesses are over, and new allocations may reuse its addresses. */
static void forget(const unsigned char *p, size_t bytes) {
    int kept = 0;
    for (int i = 0; i < n_accesses; i++)
        if (accesses[i].p >= p + bytes || p >= accesses[i].p + accesses[i].bytes)
            accesses[kept++] = accesses[i];
    n_accesses = kept;
}

static void add_node(Node n) {
    if (n_captured == captured_cap &&
        !(captured = realloc(captured, (size_t)(captured_cap = captured_cap ? 2 * captured_cap : 256) * sizeof *captured)))
        violation("out of host memory");
    captured[n_captured++] = n;
}

/* ---- streams, capture, graphs, events */

struct CUstream_st {
    int agent;        /* its number in the order of the work */
    Clock clock;
    int capturing;    /* between cudaStreamBeginCapture and cudaStreamEndCapture, or forked into it */
    int forked;       /* joined the capture by waiting for a captured event */
    long work, joined; /* forked: work captured on it, and how much of it the origin waited for */
    int invalidated;  /* a prohibited call happened during the capture */
    long nodes;       /* work captured so far (the origin's count holds the forked streams' too) */
};
/* a graph, and its instance, remember the stream it was captured on */
struct CUgraph_st {
    long nodes;
    cudaStream_t origin;
    Node *node; /* its accesses and event records, in capture order */
    long n_node;
};
struct CUgraphExec_st {
    long nodes;
    cudaStream_t origin;
    Node *node;
    long n_node;
};
static cudaStream_t first_capture; /* the stream of the first capture: the training step's */
struct CUevent_st {
    int recorded;
    int queried;              /* cudaEventQuery has answered since the last recording */
    cudaStream_t captured_on; /* recorded during the capture on this stream, else NULL */
    long work;                /* captured_on's work when it was recorded */
    Clock clock;              /* its stream's at the last recording that ran */
};

enum { MAX_FORKED = 8 };
static cudaStream_t forked[MAX_FORKED]; /* the streams forked into the capture */
static int n_forked;

static cudaStream_t capturing_stream; /* one capture at a time is all netc does */

/* A call that may synchronise with the device, made during a global-mode capture. */
static int prohibited(const char *call) {
    if (!capturing_stream)
        return 0;
    capturing_stream->invalidated = 1;
    stub_log("prohibited during capture: %s", call);
    return 1;
}

/* Work enqueued on `s`: captured as a node, or done now. Returns 1 when it is to be done now,
 * the stream having taken the host's clock. */
static int enqueue(cudaStream_t s) {
    if (!s)
        violation("work enqueued on the legacy default stream (the trainer uses its own stream)");
    if (s->capturing) {
        capturing_stream->nodes++;
        s->work++;
        return 0;
    }
    if (capturing_stream)
        violation("work enqueued on another stream during a global-mode capture");
    merge(&s->clock, &host_clock);
    return 1;
}

/* Work on `s` (enqueued just before) accesses [p, p + bytes): a node of the capture, or now. */
static void touch(cudaStream_t s, const void *p, size_t bytes, int write, const char *what) {
    if (s->capturing)
        add_node((Node){.p = p, .bytes = bytes, .write = write, .what = what});
    else
        access_now(s->agent, &s->clock, p, bytes, write, what);
}

/* Work on `s` writes somewhere in the device allocation holding p. */
static void touch_alloc(cudaStream_t s, const void *p, const char *what) {
    const Alloc *a = find_alloc(p, 0, 0);
    if (a)
        touch(s, a->p, a->size, 1, what);
}

/* ---- the CUDA runtime */

static cudaError_t last_error = cudaSuccess;

static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error (stub)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (stub)";
    case cudaErrorMemoryAllocation: return "out of memory (stub)";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device (stub)";
    case cudaErrorInvalidKernelImage: return "device kernel image is invalid (stub)";
    case cudaErrorSymbolNotFound: return "named symbol not found (stub)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (stub)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (stub)";
    default: return "an error (stub)";
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_sm() ? 1 : 0;
    return *count ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) { return device == 0 && device_sm() ? cudaSuccess : ret(cudaErrorInvalidDevice); }

cudaError_t cudaSetDeviceFlags(unsigned int flags) {
    unsigned schedule = flags & cudaDeviceScheduleMask;
    stub_log("device schedule: %s", schedule == cudaDeviceScheduleBlockingSync ? "blocking sync"
                                    : schedule == cudaDeviceScheduleSpin       ? "spin"
                                    : schedule == cudaDeviceScheduleYield      ? "yield"
                                                                               : "auto");
    return device_sm() ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0 || !device_sm())
        return ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "stub sm_%d", device_sm());
    prop->major = device_sm() / 10;
    prop->minor = device_sm() % 10;
    prop->totalGlobalMem = device_memory();
    prop->multiProcessorCount = 132;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *total = device_memory();
    *free_bytes = device_memory() - device_used;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) {
    if (prohibited("cudaMalloc"))
        return ret(cudaErrorStreamCaptureUnsupported);
    return ret(add_alloc(p, size, 0));
}

cudaError_t cudaFree(void *p) {
    if (prohibited("cudaFree"))
        return ret(cudaErrorStreamCaptureUnsupported);
    return ret(free_alloc(p, 0));
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    (void)flags;
    if (prohibited("cudaHostAlloc"))
        return ret(cudaErrorStreamCaptureUnsupported);
    return ret(add_alloc(p, size, 1));
}

cudaError_t cudaFreeHost(void *p) { return ret(free_alloc(p, 1)); }

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    if (prohibited("cudaMemset"))
        return ret(cudaErrorStreamCaptureUnsupported);
    check_device(p, bytes, "cudaMemset");
    memset(p, value, bytes);
    access_now(HOST, &host_clock, p, bytes, 1, "cudaMemset");
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    check_device(p, bytes, "cudaMemsetAsync");
    if (enqueue(s))
        memset(p, value, bytes);
    touch(s, p, bytes, 1, "cudaMemsetAsync");
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    if (kind == cudaMemcpyHostToDevice) {
        check_device(dst, bytes, "cudaMemcpyAsync to the device");
        if (s && s->capturing && !find_alloc(src, bytes, 1))
            violation("a captured host-to-device copy reads %zu bytes of pageable memory at %p", bytes, src);
    } else if (kind == cudaMemcpyDeviceToHost) {
        check_device(src, bytes, "cudaMemcpyAsync from the device");
    } else if (kind == cudaMemcpyDeviceToDevice) {
        check_device(src, bytes, "cudaMemcpyAsync (source)");
        check_device(dst, bytes, "cudaMemcpyAsync (destination)");
    } else {
        violation("cudaMemcpyAsync of kind %d (the trainer names every direction)", (int)kind);
    }
    counts.copies++;
    const char *what = kind == cudaMemcpyHostToDevice   ? "cudaMemcpyAsync to the device"
                       : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync from the device"
                                                        : "cudaMemcpyAsync on the device";
    int pinned_src = find_alloc(src, bytes, 1) != NULL, pinned_dst = find_alloc(dst, bytes, 1) != NULL;
    if (kind == cudaMemcpyHostToDevice && pinned_src) { /* the host filled it, just before */
        if (s && s->capturing)
            add_node((Node){.by_host = 1, .p = src, .bytes = bytes, .write = 1, .what = "the host filling a pinned buffer"});
        else
            access_now(HOST, &host_clock, src, bytes, 1, "the host filling a pinned buffer");
    }
    if (enqueue(s))
        memcpy(dst, src, bytes);
    if (kind != cudaMemcpyHostToDevice || pinned_src)
        touch(s, src, bytes, 0, what);
    if (kind != cudaMemcpyDeviceToHost || pinned_dst)
        touch(s, dst, bytes, 1, what);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    (void)flags;
    if (n_agents == MAX_AGENTS || !(*s = calloc(1, sizeof **s)))
        violation("more than %d streams, or out of host memory", MAX_AGENTS - 1);
    (*s)->agent = n_agents++;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s && s->capturing)
        violation("a stream destroyed during its capture");
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    if (prohibited("cudaStreamSynchronize"))
        return ret(cudaErrorStreamCaptureUnsupported);
    counts.stream_syncs++;
    if (s)
        merge(&host_clock, &s->clock);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    if (!s || s->capturing || capturing_stream)
        violation("cudaStreamBeginCapture on a stream that is capturing, or on the legacy stream");
    if (mode != cudaStreamCaptureModeThreadLocal) /* relaxed would let a synchronising call pass */
        violation("capture mode %d: the trainer captures in thread-local mode", (int)mode);
    s->capturing = 1, s->invalidated = 0, s->nodes = 0;
    capturing_stream = s;
    n_captured = 0;
    if (!first_capture)
        first_capture = s;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    if (!s || !s->capturing)
        violation("cudaStreamEndCapture on a stream that is not capturing");
    s->capturing = 0;
    capturing_stream = NULL;
    *graph = NULL;
    int unjoined = 0;
    for (int i = 0; i < n_forked; i++) {
        unjoined |= forked[i]->work > forked[i]->joined;
        forked[i]->capturing = forked[i]->forked = 0;
    }
    n_forked = 0;
    if (unjoined) {
        stub_log("capture ended with a forked stream's work not joined back");
        return ret(cudaErrorStreamCaptureUnjoined);
    }
    if (s->invalidated)
        return ret(cudaErrorStreamCaptureInvalidated);
    if (!(*graph = calloc(1, sizeof **graph)))
        violation("out of host memory");
    (*graph)->nodes = s->nodes, (*graph)->origin = s;
    if (n_captured && !((*graph)->node = malloc((size_t)n_captured * sizeof *captured)))
        violation("out of host memory");
    if (n_captured)
        memcpy((*graph)->node, captured, (size_t)n_captured * sizeof *captured);
    (*graph)->n_node = n_captured;
    stub_log("captured a graph of %ld nodes", s->nodes);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    (void)flags;
    if (!graph || !(*exec = calloc(1, sizeof **exec)))
        violation("cudaGraphInstantiate without a graph");
    (*exec)->nodes = graph->nodes, (*exec)->origin = graph->origin, (*exec)->n_node = graph->n_node;
    if (graph->n_node && !((*exec)->node = malloc((size_t)graph->n_node * sizeof *graph->node)))
        violation("out of host memory");
    if (graph->n_node)
        memcpy((*exec)->node, graph->node, (size_t)graph->n_node * sizeof *graph->node);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    if (g)
        free(g->node);
    free(g);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
    if (g)
        free(g->node);
    free(g);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
    if (!g || !g->nodes)
        violation("cudaGraphLaunch of an empty or missing graph");
    /* legal in CUDA, but the trainer's lanes each replay their own graphs on their own stream */
    if (s != g->origin)
        violation("cudaGraphLaunch on another stream than the one the graph was captured on");
    for (long i = 0; i < g->n_node; i++) /* the host's fills come before the call */
        if (g->node[i].by_host)
            access_now(HOST, &host_clock, g->node[i].p, g->node[i].bytes, 1, g->node[i].what);
    enqueue(s);
    for (long i = 0; i < g->n_node; i++) {
        const Node *n = &g->node[i];
        if (n->record)
            n->record->clock = s->clock;
        else if (!n->by_host)
            access_now(s->agent, &s->clock, n->p, n->bytes, n->write, n->what);
    }
    counts.graph_launches++;
    counts.second_stream_launches += s != first_capture;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    if (!(flags & cudaEventBlockingSync))
        stub_log("an event whose waits spin (no cudaEventBlockingSync)");
    if (!(*e = calloc(1, sizeof **e)))
        violation("out of host memory");
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
    if (!e)
        violation("cudaEventRecordWithFlags without an event");
    if ((flags & cudaEventRecordExternal) && !(s && s->capturing))
        violation("cudaEventRecordExternal outside a capture");
    if (s && s->capturing && !(flags & cudaEventRecordExternal))
        violation("an event recorded in a capture without cudaEventRecordExternal: a graph launch would not "
                  "record it");
    if (enqueue(s))
        e->clock = s->clock;
    else
        add_node((Node){.record = e});
    e->recorded = 1, e->queried = 0;
    return cudaSuccess;
}

/* Fork and join: recorded on a captured stream, the event is a node the capture can wait for. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e)
        violation("cudaEventRecord without an event");
    if (s && s->capturing) {
        e->captured_on = s, e->work = s->work;
    } else {
        enqueue(s);
        e->captured_on = NULL;
        e->clock = s->clock;
    }
    e->recorded = 1, e->queried = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    if (!s || !e || flags)
        violation("cudaStreamWaitEvent on the legacy stream, without an event, or with flags %u", flags);
    if (!e->recorded)
        violation("cudaStreamWaitEvent on an event never recorded");
    if (capturing_stream && s->capturing && !e->captured_on)
        return ret(cudaErrorStreamCaptureIsolation); /* a captured stream waits for outside work */
    if (e->captured_on && !s->capturing) { /* the fork */
        if (n_forked == MAX_FORKED)
            violation("more than %d streams forked into one capture", MAX_FORKED);
        s->capturing = s->forked = 1, s->work = s->joined = 0;
        forked[n_forked++] = s;
    } else if (e->captured_on && e->captured_on->forked && !s->forked && e->work > e->captured_on->joined) {
        e->captured_on->joined = e->work; /* a join: the origin waits for the forked stream's work so far */
    } else if (!s->capturing) {
        merge(&s->clock, &e->clock);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (!s)
        violation("cudaStreamQuery on the legacy stream");
    if (prohibited("cudaStreamQuery"))
        return ret(cudaErrorStreamCaptureUnsupported);
    counts.stream_syncs++; /* a distributed trainer's wait polls the stream */
    merge(&host_clock, &s->clock);
    return cudaSuccess; /* the stub's work is done when it is enqueued */
}

/* The work before the event is done, except at the first query after each recording: a device
 * behind the host, so that a trainer's answer to cudaErrorNotReady runs too. */
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e || !e->recorded)
        violation("cudaEventQuery without an event, or on one never recorded");
    if (prohibited("cudaEventQuery"))
        return ret(cudaErrorStreamCaptureUnsupported);
    if (!e->queried) {
        e->queried = 1;
        counts.queries_not_ready++;
        return cudaErrorNotReady; /* not an error: CUDA does not record it as the last one */
    }
    merge(&host_clock, &e->clock);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (prohibited("cudaEventSynchronize"))
        return ret(cudaErrorStreamCaptureUnsupported);
    merge(&host_clock, &e->clock);
    return cudaSuccess;
}

/* ---- kernel images */

typedef struct Kernel {
    char *name;
    long param_bytes; /* its parameters' bytes, as the image declares them */
} Kernel;
struct CUlib_st {
    int sm, ptx;
    int n;
    Kernel *kernels;
};
struct CUkern_st { int unused; };

static struct CUlib_st *loaded; /* the one library the trainer loads */

static void add_kernel(struct CUlib_st *lib, const char *name, size_t len, long param_bytes) {
    lib->kernels = realloc(lib->kernels, (size_t)(lib->n + 1) * sizeof *lib->kernels);
    if (!lib->kernels || !(lib->kernels[lib->n].name = strndup(name, len)))
        violation("out of host memory");
    lib->kernels[lib->n].param_bytes = param_bytes;
    lib->n++;
}

/* A kernel's parameter bytes in a cubin: EIATTR_CBANK_PARAM_SIZE (0x19) of its .nv.info.NAME
 * section, whose attributes are a format byte (3: a 16-bit value follows, 4: a 16-bit size and
 * that many bytes), the attribute, then the value or the size. -1 where there is none. */
static long cubin_param_bytes(const unsigned char *img, const char *name) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    const char *sections = (const char *)(img + sh[eh->e_shstrndx].sh_offset);
    for (int i = 0; i < eh->e_shnum; i++) {
        const char *s = sections + sh[i].sh_name;
        if (strncmp(s, ".nv.info.", 9) != 0 || strcmp(s + 9, name) != 0)
            continue;
        const unsigned char *a = img + sh[i].sh_offset, *end = a + sh[i].sh_size;
        while (a + 4 <= end) {
            unsigned v = a[2] | (unsigned)a[3] << 8;
            if (a[0] == 3 && a[1] == 0x19)
                return (long)v;
            a += a[0] == 4 ? 4 + v : a[0] == 3 ? 4 : 2;
        }
    }
    return -1;
}

/* A cubin: its architecture from e_flags (bits 8-15 from ELF ABI version 8, as CUDA 12.8 and
 * later write it; bits 0-7 before), its kernels from the GLOBAL FUNC symbols of .symtab. */
static int read_cubin(const unsigned char *img, struct CUlib_st *lib) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_CUDA)
        return 0;
    lib->sm = (int)(eh->e_ident[EI_ABIVERSION] >= 8 ? (eh->e_flags >> 8) & 0xff : eh->e_flags & 0xff);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        const char *names = (const char *)(img + sh[sh[i].sh_link].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++)
            if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && ELF64_ST_BIND(sym[k].st_info) == STB_GLOBAL) {
                const char *name = names + sym[k].st_name;
                add_kernel(lib, name, strlen(name), cubin_param_bytes(img, name));
            }
    }
    return 1;
}

/* A PTX entry's parameter bytes: `.param .u64 NAME_param_0` 8, `.param .align 8 .b8
 * NAME_param_1[96]` 96, summed up to the list's closing parenthesis; -1 for another type. */
static long ptx_param_bytes(const char *list) {
    const char *end = strchr(list, ')');
    long bytes = 0;
    for (const char *p = strstr(list, ".param "); p && end && p < end; p = strstr(p + 1, ".param ")) {
        const char *u64 = strstr(p, ".u64 "), *b8 = strstr(p, ".b8 "), *next = strstr(p + 1, ".param ");
        const char *stop = next && next < end ? next : end;
        if (u64 && u64 < stop)
            bytes += 8;
        else if (b8 && b8 < stop && strchr(b8, '[') && strchr(b8, '[') < stop)
            bytes += atol(strchr(b8, '[') + 1);
        else
            return -1;
    }
    return end ? bytes : -1;
}

/* PTX text: ".target sm_NN" and every ".entry NAME(" with its parameters. */
static int read_ptx(const char *text, struct CUlib_st *lib) {
    const char *t = strstr(text, ".target sm_");
    if (strncmp(text, "//", 2) != 0 || !t)
        return 0;
    lib->sm = atoi(t + strlen(".target sm_"));
    lib->ptx = 1;
    for (const char *e = strstr(text, ".entry "); e; e = strstr(e + 1, ".entry ")) {
        const char *name = e + strlen(".entry "), *end = strchr(name, '(');
        if (end)
            add_kernel(lib, name, (size_t)(end - name), ptx_param_bytes(end + 1));
    }
    return 1;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, enum cudaJitOption *jit_options,
                                void **jit_values, unsigned int n_jit, enum cudaLibraryOption *lib_options,
                                void **lib_values, unsigned int n_lib) {
    (void)jit_options, (void)jit_values, (void)n_jit, (void)lib_options, (void)lib_values, (void)n_lib;
    struct CUlib_st *lib = calloc(1, sizeof *lib);
    const unsigned char *img = code;
    int dev = device_sm();
    if (!lib)
        violation("out of host memory");
    if (!(memcmp(img, ELFMAG, SELFMAG) == 0 ? read_cubin(img, lib) : read_ptx(code, lib))) {
        free(lib);
        return ret(cudaErrorInvalidKernelImage);
    }
    int runs = lib->ptx ? lib->sm <= dev : lib->sm / 10 == dev / 10 && lib->sm % 10 <= dev % 10;
    stub_log("image %s sm_%d with %d kernels, on a device sm_%d: %s", lib->ptx ? "PTX" : "cubin", lib->sm, lib->n,
             dev, runs ? "loaded" : "refused");
    if (!runs) {
        for (int k = 0; k < lib->n; k++) free(lib->kernels[k].name);
        free(lib->kernels);
        free(lib);
        return ret(cudaErrorNoKernelImageForDevice);
    }
    *library = loaded = lib;
    return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t lib, const char *name) {
    for (int k = 0; lib && k < lib->n; k++)
        if (strcmp(lib->kernels[k].name, name) == 0) {
            *kernel = (cudaKernel_t)&lib->kernels[k];
            counts.kernels_found++;
            return cudaSuccess;
        }
    stub_log("kernel %s not in the image", name);
    return ret(cudaErrorSymbolNotFound);
}

/* A kernel's attributes, which load a lazily loaded library (rt_cuda.c's load_kernels):
 * NETC_STUB_LAZY_LOAD_FAIL plays an image the driver refuses only then (a PTX it cannot
 * compile), NETC_STUB_MAX_THREADS a kernel that cannot run a block of that many threads. */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    const Kernel *k = func;
    if (!loaded || k < loaded->kernels || k >= loaded->kernels + loaded->n)
        violation("cudaFuncGetAttributes of %p, not a kernel of the loaded image", func);
    if (getenv("NETC_STUB_LAZY_LOAD_FAIL"))
        return ret(cudaErrorInvalidPtx);
    memset(attr, 0, sizeof *attr);
    const char *max = getenv("NETC_STUB_MAX_THREADS");
    attr->maxThreadsPerBlock = max ? atoi(max) : 1024;
    attr->numRegs = 32;
    counts.attributes++;
    return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t lib) {
    if (lib != loaded)
        violation("cudaLibraryUnload of a library that was not loaded");
    for (int k = 0; k < lib->n; k++) free(lib->kernels[k].name);
    free(lib->kernels);
    free(lib);
    loaded = NULL;
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t s) {
    const Kernel *k = func;
    if (!loaded || k < loaded->kernels || k >= loaded->kernels + loaded->n)
        violation("cudaLaunchKernel of %p, not a kernel of the loaded image", func);
    if (grid.x < 1 || grid.y != 1 || grid.z != 1 || block.x < 1 || block.x > 1024 || block.y != 1 || block.z != 1)
        violation("launching %s with grid (%u,%u,%u) and block (%u,%u,%u)", k->name, grid.x, grid.y, grid.z, block.x,
                  block.y, block.z);
    if (shared)
        violation("launching %s with %zu bytes of dynamic shared memory (netc's kernels use none)", k->name, shared);
    const unsigned char *base = args ? *(unsigned char *const *)args[0] : NULL;
    const Alloc *a = base ? find_alloc(base, 0, 0) : NULL;
    if (!a || a->p != base)
        violation("launching %s with an argument that is not the base of a device allocation", k->name);
    /* rt_cuda.c passes {&base, at}: at NULL for a kernel of the base alone, an RtKAt of offsets
     * inside the allocation for one whose image declares both (read past the array otherwise) */
    const RtKAt *at = args[1];
    if (k->param_bytes != (long)sizeof(void *) && k->param_bytes != (long)(sizeof(void *) + sizeof(RtKAt)))
        violation("%s: the image declares %ld bytes of parameters, neither the base (%zu) nor the base and an RtKAt "
                  "(%zu)", k->name, k->param_bytes, sizeof(void *), sizeof(void *) + sizeof(RtKAt));
    if ((k->param_bytes > (long)sizeof(void *)) != (at != NULL))
        violation("launching %s (%ld bytes of parameters) %s an RtKAt", k->name, k->param_bytes, at ? "with" : "without");
    for (int i = 0; at && i < RT_K_AT; i++)
        if (at->o[i] < 0 || (size_t)at->o[i] >= a->size)
            violation("launching %s with offset %d at %lld, outside the %zu-byte allocation", k->name, i, at->o[i],
                      a->size);
    counts.offset_launches += at != NULL;
    counts.launches++;
    if (!enqueue(s))
        counts.captured_launches++;
    touch(s, a->p, a->size, 1, "a kernel");
    return cudaSuccess;
}

/* ---- cuBLASLt: layouts and descriptors are stored, a product is checked */

struct cublasLtContext { int unused; };
typedef struct {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} Layout;
typedef struct {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa, transb;
    uint32_t epilogue;
    const void *bias;
    const void *aux;            /* EPILOGUE_AUX_POINTER: GELU's input, with _GELU_AUX_BIAS */
    int64_t aux_ld, aux_stride; /* in elements */
} MatmulDesc;
typedef struct { uint64_t max_workspace; } Preference;

const char *cublasLtGetStatusString(cublasStatus_t s) { return s ? "an error (stub)" : "success (stub)"; }
const char *cublasLtGetStatusName(cublasStatus_t s) { return s ? "CUBLAS_STATUS_STUB_ERROR" : "CUBLAS_STATUS_SUCCESS"; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = calloc(1, sizeof **h);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *d, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    Layout *l = calloc(1, sizeof *l);
    if (!l)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *l = (Layout){type, rows, cols, ld, 1, 0};
    if (ld < (int64_t)rows)
        violation("a column-major layout of %llu rows with leading dimension %lld", (unsigned long long)rows,
                  (long long)ld);
    *d = (cublasLtMatrixLayout_t)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

static void set_attr(void *field, size_t field_size, const void *buf, size_t size, const char *what) {
    if (size != field_size)
        violation("%s set with %zu bytes, expected %zu", what, size, field_size);
    memcpy(field, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t d, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    Layout *l = (Layout *)d;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: set_attr(&l->batch, sizeof l->batch, buf, size, "BATCH_COUNT"); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        set_attr(&l->stride, sizeof l->stride, buf, size, "STRIDED_BATCH_OFFSET");
        break;
    default: violation("matrix layout attribute %d is not one the runtime sets", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    MatmulDesc *m = calloc(1, sizeof *m);
    if (!m)
        return CUBLAS_STATUS_ALLOC_FAILED;
    m->compute = compute, m->scale = scale, m->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    *d = (cublasLtMatmulDesc_t)m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    MatmulDesc *m = (MatmulDesc *)d;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: set_attr(&m->transa, sizeof m->transa, buf, size, "TRANSA"); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: set_attr(&m->transb, sizeof m->transb, buf, size, "TRANSB"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: set_attr(&m->epilogue, sizeof m->epilogue, buf, size, "EPILOGUE"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: set_attr(&m->bias, sizeof m->bias, buf, size, "BIAS_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: set_attr(&m->aux, sizeof m->aux, buf, size, "EPILOGUE_AUX_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: set_attr(&m->aux_ld, sizeof m->aux_ld, buf, size, "EPILOGUE_AUX_LD"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
        set_attr(&m->aux_stride, sizeof m->aux_stride, buf, size, "EPILOGUE_AUX_BATCH_STRIDE");
        break;
    default: violation("matmul descriptor attribute %d is not one the runtime sets", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = calloc(1, sizeof(Preference));
    return *p ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    Preference *q = (Preference *)p;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        set_attr(&q->max_workspace, sizeof q->max_workspace, buf, size, "MAX_WORKSPACE_BYTES");
    /* the alignment hints are read by the real heuristic only */
    return CUBLAS_STATUS_SUCCESS;
}

/* op(A) is m x k, op(B) is k x n, D is m x n (column-major), and every type is the compute's. */
static void check_product(const MatmulDesc *m, const Layout *a, const Layout *b, const Layout *c, const Layout *d) {
    uint64_t am = m->transa ? a->cols : a->rows, ak = m->transa ? a->rows : a->cols;
    uint64_t bk = m->transb ? b->cols : b->rows, bn = m->transb ? b->rows : b->cols;
    if (am != d->rows || bn != d->cols || ak != bk || c->rows != d->rows || c->cols != d->cols)
        violation("a product of op(A) %llux%llu and op(B) %llux%llu into D %llux%llu", (unsigned long long)am,
                  (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn,
                  (unsigned long long)d->rows, (unsigned long long)d->cols);
    if (a->batch != d->batch || b->batch != d->batch || a->type != b->type || a->type != d->type)
        violation("a product whose operands differ in batch count or type");
    if (m->compute != CUBLAS_COMPUTE_32F && m->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        violation("a product with compute type %d (the runtime computes in float32 or TF32)", (int)m->compute);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
    (void)h;
    check_product((const MatmulDesc *)desc, (const Layout *)a, (const Layout *)b, (const Layout *)c,
                  (const Layout *)d);
    if (requested < 1)
        violation("cublasLtMatmulAlgoGetHeuristic asked for %d results", requested);
    uint32_t epi = ((const MatmulDesc *)desc)->epilogue;
    if (((epi == CUBLASLT_EPILOGUE_GELU_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) &&
         getenv("NETC_STUB_NO_GELU_EPILOGUE")) ||
        (epi != CUBLASLT_EPILOGUE_DEFAULT && getenv("NETC_STUB_NO_EPILOGUE"))) { /* as a cuBLASLt without such
                                                                                   * kernels answers */
        *returned = 0;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&results[0], 0, sizeof results[0]);
    uint64_t ws = 1 << 20;
    results[0].workspaceSize = ws < ((Preference *)pref)->max_workspace ? ws : ((Preference *)pref)->max_workspace;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_bytes(cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    case CUDA_R_16F: return 2;
    default: violation("a matrix of data type %d", (int)t);
    }
}

static void check_matrix(const void *p, const Layout *l, const char *what) {
    size_t one = (size_t)((l->cols - 1) * (uint64_t)l->ld + l->rows) * type_bytes(l->type);
    check_device(p, one + (size_t)(l->batch - 1) * (size_t)l->stride * type_bytes(l->type), what);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s) {
    const MatmulDesc *m = (const MatmulDesc *)desc;
    (void)h, (void)alpha, (void)beta;
    check_product(m, (const Layout *)a, (const Layout *)b, (const Layout *)c, (const Layout *)d);
    check_matrix(A, (const Layout *)a, "cublasLtMatmul A");
    check_matrix(B, (const Layout *)b, "cublasLtMatmul B");
    check_matrix(C, (const Layout *)c, "cublasLtMatmul C");
    check_matrix(D, (const Layout *)d, "cublasLtMatmul D");
    const Layout *dl = (const Layout *)d;
    if (m->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        check_device(m->bias, dl->rows * type_bytes(dl->type), "cublasLtMatmul bias");
    if (m->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) { /* cublasLt.h: AUX_LD and its stride in elements, % 8 */
        if (m->aux_ld % 8 || m->aux_ld < (int64_t)dl->rows || (dl->batch > 1 && m->aux_stride % 8))
            violation("a GELU aux matrix with leading dimension %lld and batch stride %lld for D %llux%llu",
                      (long long)m->aux_ld, (long long)m->aux_stride, (unsigned long long)dl->rows,
                      (unsigned long long)dl->cols);
        Layout aux = *dl;
        aux.ld = m->aux_ld, aux.stride = m->aux_stride;
        check_matrix(m->aux, &aux, "cublasLtMatmul GELU aux matrix");
    } else if (m->epilogue != CUBLASLT_EPILOGUE_DEFAULT && m->epilogue != CUBLASLT_EPILOGUE_BIAS &&
               m->epilogue != CUBLASLT_EPILOGUE_RELU_BIAS && m->epilogue != CUBLASLT_EPILOGUE_GELU_BIAS) {
        violation("a product with epilogue %u (the runtime asks for BIAS, RELU_BIAS, GELU_BIAS, GELU_AUX_BIAS)",
                  (unsigned)m->epilogue);
    }
    if (!algo)
        violation("cublasLtMatmul without an algorithm");
    if (ws_bytes)
        check_device(ws, ws_bytes, "cublasLtMatmul workspace");
    counts.gemms++;
    enqueue(s);
    touch_alloc(s, A, "cublasLtMatmul");
    touch_alloc(s, B, "cublasLtMatmul");
    touch_alloc(s, D, "cublasLtMatmul");
    if (ws_bytes)
        touch_alloc(s, ws, "cublasLtMatmul's workspace");
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuDNN: descriptors are stored, output dimensions computed, calls checked */

struct cudnnContext { cudaStream_t stream; };
struct cudnnTensorStruct { cudnnTensorFormat_t format; cudnnDataType_t type; int n, c, h, w; };
struct cudnnFilterStruct { cudnnDataType_t type; cudnnTensorFormat_t format; int k, c, r, s; };
struct cudnnConvolutionStruct {
    int pad_h, pad_w, u, v, dil_h, dil_w, groups;
    cudnnMathType_t math;
};

const char *cudnnGetErrorString(cudnnStatus_t s) { return s ? "CUDNN_STATUS_STUB_ERROR" : "CUDNN_STATUS_SUCCESS"; }

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = calloc(1, sizeof **h);
    return *h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    free(h);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w) {
    if (n < 1 || c < 1 || h < 1 || w < 1)
        return CUDNN_STATUS_BAD_PARAM;
    *d = (struct cudnnTensorStruct){format, type, n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int r, int s) {
    if (k < 1 || c < 1 || r < 1 || s < 1)
        return CUDNN_STATUS_BAD_PARAM;
    *d = (struct cudnnFilterStruct){type, format, k, c, r, s};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
    *d = calloc(1, sizeof **d);
    if (*d)
        (*d)->groups = 1;
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dil_h, int dil_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
    if (mode != CUDNN_CROSS_CORRELATION || compute != CUDNN_DATA_FLOAT)
        violation("a convolution of mode %d computing in type %d (PyTorch's is cross-correlation in float)",
                  (int)mode, (int)compute);
    d->pad_h = pad_h, d->pad_w = pad_w, d->u = u, d->v = v, d->dil_h = dil_h, d->dil_w = dil_w;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
    d->groups = groups;
    return groups >= 1 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
    d->math = math;
    return CUDNN_STATUS_SUCCESS;
}

/* cuDNN's output size: 1 + (in + 2 pad - dilation (kernel - 1) - 1) / stride. */
static int out_dim(int in, int pad, int dil, int k, int stride) { return 1 + (in + 2 * pad - dil * (k - 1) - 1) / stride; }

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t d,
                                                    const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                    int *n, int *k, int *p, int *q) {
    if (x->c != w->c * d->groups || x->type != w->type || x->format != w->format)
        violation("a convolution of x with %d channels and a filter of %d x %d groups (or their types or "
                  "formats differ)", x->c, w->c, d->groups);
    *n = x->n, *k = w->k;
    *p = out_dim(x->h, d->pad_h, d->dil_h, w->r, d->u);
    *q = out_dim(x->w, d->pad_w, d->dil_w, w->s, d->v);
    return CUDNN_STATUS_SUCCESS;
}

/* x, w and y fit together as the convolution says. */
static void check_conv(const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                       const cudnnConvolutionDescriptor_t d, const cudnnTensorDescriptor_t y) {
    int n, k, p, q;
    cudnnGetConvolution2dForwardOutputDim(d, x, w, &n, &k, &p, &q);
    if (y->n != n || y->c != k || y->h != p || y->w != q || y->type != x->type || y->format != x->format)
        violation("a convolution whose y [%d,%d,%d,%d] is not the [%d,%d,%d,%d] of x and w", y->n, y->c, y->h, y->w,
                  n, k, p, q);
}

/* The heuristic, the same for every direction, ranks four algorithms that a careful planner
 * must pass over before PyTorch's deterministic default (algorithm 1 in every direction):
 *   0  non-deterministic;
 *   2  deterministic, tensor cores (right for bf16 or TF32, wrong for float32);
 *   3  deterministic, FMA, but wanting STUB_HUGE_WORKSPACE;
 *   4  deterministic, FMA, but failing when run (its status in the ranking says success).
 * Algorithm 1 with FMA math runs, with STUB_CONV_WORKSPACE. */
enum { STUB_ALGOS = 4, STUB_CONV_WORKSPACE = 2 << 20 };
#define STUB_HUGE_WORKSPACE ((size_t)4 << 30)

#define STUB_RANKING(PERF_T, ALGO_T)                                                                       \
    do {                                                                                                   \
        static const struct { int algo; cudnnDeterminism_t det; cudnnMathType_t math; } ranks[STUB_ALGOS] = { \
            {0, CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH},                                                  \
            {2, CUDNN_DETERMINISTIC, CUDNN_TENSOR_OP_MATH},                                                \
            {3, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH},                                                      \
            {4, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH},                                                      \
        };                                                                                                 \
        *returned = requested < STUB_ALGOS ? requested : STUB_ALGOS;                                       \
        for (int i = 0; i < *returned; i++) {                                                              \
            memset(&perf[i], 0, sizeof perf[i]);                                                           \
            perf[i].algo = (ALGO_T)ranks[i].algo;                                                          \
            perf[i].status = CUDNN_STATUS_SUCCESS;                                                         \
            perf[i].determinism = ranks[i].det;                                                            \
            perf[i].mathType = ranks[i].math;                                                              \
            perf[i].memory = ranks[i].algo == 3 ? STUB_HUGE_WORKSPACE : STUB_CONV_WORKSPACE;               \
        }                                                                                                  \
    } while (0)

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t h, int *count) {
    (void)h;
    *count = STUB_ALGOS;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t h, int *count) {
    (void)h;
    *count = STUB_ALGOS;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t h, int *count) {
    (void)h;
    *count = STUB_ALGOS;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t d,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int *returned, cudnnConvolutionFwdAlgoPerf_t *perf) {
    (void)h;
    check_conv(x, w, d, y);
    STUB_RANKING(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t d,
                                                          const cudnnTensorDescriptor_t dx, const int requested,
                                                          int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf) {
    (void)h;
    check_conv(dx, w, d, dy);
    STUB_RANKING(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t d,
                                                            const cudnnFilterDescriptor_t dw, const int requested,
                                                            int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
    (void)h;
    check_conv(x, dw, d, dy);
    STUB_RANKING(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t);
    return CUDNN_STATUS_SUCCESS;
}

/* Whether algorithm `algo` can run under the descriptor's math type: tensor-core algorithm 2
 * needs tensor-op math; the rest are FMA kernels, allowed under any math type. */
static int runs_with(const cudnnConvolutionDescriptor_t d, int algo) { return algo != 2 || d->math != CUDNN_FMA_MATH; }

static cudnnStatus_t workspace(const cudnnConvolutionDescriptor_t d, int algo, const char *dir, size_t *bytes) {
    if (algo == 0)
        violation("the %s plan asked for the non-deterministic algorithm's workspace", dir);
    if (!runs_with(d, algo))
        return CUDNN_STATUS_NOT_SUPPORTED;
    *bytes = algo == 3 ? STUB_HUGE_WORKSPACE : STUB_CONV_WORKSPACE;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t d,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *bytes) {
    (void)h;
    check_conv(x, w, d, y);
    return workspace(d, (int)algo, "forward", bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t h, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t d,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes) {
    (void)h;
    check_conv(dx, w, d, dy);
    return workspace(d, (int)algo, "data-gradient", bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t h, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t d,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes) {
    (void)h;
    check_conv(x, dw, d, dy);
    return workspace(d, (int)algo, "filter-gradient", bytes);
}

static size_t dnn_bytes(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT: return 4;
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_HALF: return 2;
    default: violation("a tensor of cuDNN data type %d", (int)t);
    }
}

static size_t tensor_bytes(const cudnnTensorDescriptor_t t) { return (size_t)t->n * t->c * t->h * t->w * dnn_bytes(t->type); }
static size_t filter_bytes(const cudnnFilterDescriptor_t f) { return (size_t)f->k * f->c * f->r * f->s * dnn_bytes(f->type); }

/* One convolution call: the operands inside device allocations, a workspace as large as the
 * algorithm's. Algorithm 4 fails here; every call is logged ("convolution: WHAT algorithm N,
 * math M: ran|failed"), so a test sees which algorithm each direction ends up with. */
static cudnnStatus_t conv_call(cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void *xp,
                               const cudnnFilterDescriptor_t w, const void *wp, const cudnnConvolutionDescriptor_t d,
                               const cudnnTensorDescriptor_t y, const void *yp, int algo, void *ws, size_t ws_bytes,
                               const char *what) {
    size_t need = 0;
    check_conv(x, w, d, y);
    check_device(xp, tensor_bytes(x), what);
    check_device(wp, filter_bytes(w), what);
    check_device(yp, tensor_bytes(y), what);
    if (algo == 0 || workspace(d, algo, what, &need) != CUDNN_STATUS_SUCCESS)
        violation("%s with algorithm %d under math type %d", what, algo, (int)d->math);
    if (ws_bytes < need)
        violation("%s with %zu bytes of workspace, less than its algorithm's %zu", what, ws_bytes, need);
    if (ws_bytes)
        check_device(ws, ws_bytes, what);
    stub_log("convolution: %s algorithm %d, math %s: %s", what, algo,
             d->math == CUDNN_FMA_MATH ? "FMA" : d->math == CUDNN_TENSOR_OP_MATH ? "tensor-op" : "other",
             algo == 4 ? "failed" : "ran");
    if (algo == 4)
        return CUDNN_STATUS_EXECUTION_FAILED;
    counts.convs++;
    enqueue(h->stream);
    touch_alloc(h->stream, xp, what);
    touch_alloc(h->stream, wp, what);
    touch_alloc(h->stream, yp, what);
    if (ws_bytes)
        touch_alloc(h->stream, ws, what);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t x,
                                      const void *xp, const cudnnFilterDescriptor_t w, const void *wp,
                                      const cudnnConvolutionDescriptor_t d, cudnnConvolutionFwdAlgo_t algo, void *ws,
                                      size_t ws_bytes, const void *beta, const cudnnTensorDescriptor_t y, void *yp) {
    (void)alpha, (void)beta;
    return conv_call(h, x, xp, w, wp, d, y, yp, (int)algo, ws, ws_bytes, "cudnnConvolutionForward");
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, const cudnnFilterDescriptor_t w,
                                           const void *wp, const cudnnTensorDescriptor_t dy, const void *dyp,
                                           const cudnnConvolutionDescriptor_t d, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta,
                                           const cudnnTensorDescriptor_t dx, void *dxp) {
    (void)alpha, (void)beta;
    return conv_call(h, dx, dxp, w, wp, d, dy, dyp, (int)algo, ws, ws_bytes, "cudnnConvolutionBackwardData");
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t x,
                                             const void *xp, const cudnnTensorDescriptor_t dy, const void *dyp,
                                             const cudnnConvolutionDescriptor_t d,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws, size_t ws_bytes,
                                             const void *beta, const cudnnFilterDescriptor_t dw, void *dwp) {
    (void)alpha, (void)beta;
    return conv_call(h, x, xp, dw, dwp, d, dy, dyp, (int)algo, ws, ws_bytes, "cudnnConvolutionBackwardFilter");
}

cudnnStatus_t cudnnTransformTensor(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t x,
                                   const void *xp, const void *beta, const cudnnTensorDescriptor_t y, void *yp) {
    (void)alpha, (void)beta;
    if (x->n != y->n || x->c != y->c || x->h != y->h || x->w != y->w || x->type != y->type)
        violation("cudnnTransformTensor between [%d,%d,%d,%d] and [%d,%d,%d,%d]", x->n, x->c, x->h, x->w, y->n, y->c,
                  y->h, y->w);
    check_device(xp, tensor_bytes(x), "cudnnTransformTensor source");
    check_device(yp, tensor_bytes(y), "cudnnTransformTensor destination");
    counts.transforms++;
    enqueue(h->stream);
    touch_alloc(h->stream, xp, "cudnnTransformTensor");
    touch_alloc(h->stream, yp, "cudnnTransformTensor");
    return CUDNN_STATUS_SUCCESS;
}

#ifdef NETC_STUB_NCCL
/* ---- NCCL for one rank (a distributed trainer started alone, MPI's singleton) */

#include <nccl.h>

struct ncclComm {
    int live;
};
static const char ID_TEXT[] = "cuda_stub nccl id";

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_TEXT, sizeof ID_TEXT);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (memcmp(id.internal, ID_TEXT, sizeof ID_TEXT) != 0)
        violation("ncclCommInitRank with an id ncclGetUniqueId did not make");
    if (nranks != 1 || rank != 0)
        violation("ncclCommInitRank as rank %d of %d: the stub runs one rank", rank, nranks);
    if (prohibited("ncclCommInitRank") || !(*comm = calloc(1, sizeof **comm)))
        violation("ncclCommInitRank during a capture, or out of host memory");
    (*comm)->live = 1;
    stub_log("nccl: communicator of 1 rank");
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
    if (!comm || !comm->live)
        violation("ncclAllReduce on a communicator that is not open");
    int f64 = type == ncclFloat64 && op == ncclSum; /* --sync-bn's batch-norm sums */
    if (send != recv || (!f64 && (type != ncclFloat || (op != ncclSum && op != ncclAvg))))
        violation("ncclAllReduce: out of place, type %d or operation %d (the trainer's are in place, float sums "
                  "and averages, double sums)", (int)type, (int)op);
    check_device(recv, count * (f64 ? sizeof(double) : sizeof(float)), "ncclAllReduce");
    if (capturing_stream == s)
        violation("ncclAllReduce on the step's own stream: the collectives have a stream of their own");
    if (!enqueue(s))
        counts.captured_collectives++;
    counts.collectives++;
    return ncclSuccess;
}

/* --shard-optimizer: a slice of a bucket reduced onto, or of the parameters broadcast from, its
 * rank (rank 0 here), in place, one per rank inside a group */
static int group_depth;

ncclResult_t ncclGroupStart(void) {
    if (group_depth++)
        violation("ncclGroupStart inside a group");
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth-- != 1)
        violation("ncclGroupEnd without ncclGroupStart");
    return ncclSuccess;
}

static void slice_collective(const void *send, const void *recv, size_t count, ncclDataType_t type, int root,
                             ncclComm_t comm, cudaStream_t s, const char *what) {
    if (!comm || !comm->live)
        violation("%s on a communicator that is not open", what);
    if (send != recv || type != ncclFloat || root != 0)
        violation("%s: out of place, type %d or root %d (the trainer's are in place, float32, to or from one of "
                  "the ranks)", what, (int)type, root);
    if (!group_depth)
        violation("%s outside a group (the trainer's make one per bucket)", what);
    check_device(recv, count * sizeof(float), what);
    if (capturing_stream == s)
        violation("%s on the step's own stream: the collectives have a stream of their own", what);
    if (!enqueue(s))
        counts.captured_collectives++;
    counts.collectives++;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s) {
    if (op != ncclAvg)
        violation("ncclReduce with operation %d (the trainer's average)", (int)op);
    slice_collective(send, recv, count, type, root, comm, s, "ncclReduce");
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t s) {
    slice_collective(send, recv, count, type, root, comm, s, "ncclBroadcast");
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !comm->live)
        violation("ncclCommGetAsyncError on a communicator that is not open");
    *err = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm || !comm->live)
        violation("ncclCommDestroy on a communicator that is not open");
    if (capturing_stream)
        violation("ncclCommDestroy during a capture");
    free(comm);
    stub_log("nccl: communicator destroyed");
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) { return r ? "an error (stub)" : "no error (stub)"; }
const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}
#endif
