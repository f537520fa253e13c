/* rt_cuda_emu.c - libnetrt_cuda's API (netrt_cuda.h) and rt_cuda_device on the CPU, for the
 * emulation test (emu_vs_cpu.sh): a trainer built by netc --backend cuda, its host C and its
 * kernels (compiled by g++ with cuda_emu.h) linked with this file instead of libnetrt_cuda.
 *
 * What it mirrors of runtime/cuda/rt_cuda.c, the real device: the one zeroed arena, the kernels
 * looked up by name, plan() then a warm-up run of both steps on the zeroed arena (zeroed again
 * after), two staging slots holding an RtBatchHeader and the inputs at RtCudaModel.off_input,
 * copied to off_batch before each step, start() writing a fresh RtDevState, post_train and
 * read_eval reading the sums and resetting exactly the fields the real one resets. take_train
 * answers as a device running behind the host would: a post is not ready to a caller that does
 * not wait until EMU_SLOTS more launches (all the host can queue ahead) have been staged.
 *
 * What it does not test: every CUDA, cuBLASLt and cuDNN call. The streams and the CUDA Graphs
 * are not there (work runs when it is enqueued, so --no-graph changes nothing here, and a slot
 * goes straight to off_batch where rt_cuda.c copies it through a landing buffer on a copy
 * stream, whose events the stub's order of the work checks: tests/cuda/startup); matrix
 * products are rt_gemm (OpenBLAS) plus the epilogue, convolutions the CPU's rt_conv2d_* (or
 * rt_conv2d_nhwc_*, oneDNN, with the filter permuted between the KRSC order a channels-last
 * plan is given and oneDNN's KCRS); on bfloat16 or fp16 data (netc --precision bf16, fp16) the
 * same kernels on the operands widened to float32, the result (after the epilogue) rounded once
 * to bfloat16 or fp16 (to infinity beyond fp16's 65504, as the GPU's conversion does), as
 * cuBLASLt and cuDNN accumulate and apply the epilogue in float32. Kernels run block after
 * block, a block's threads as fibers (below), with the host's libm, and without FMA
 * contraction. Real launch limits, memory coherence, truly concurrent threads and the GPU's
 * arithmetic are out of its reach.
 *
 * A distributed trainer's collectives (RtCudaModel.coll) are the real libnetrt_nccl source,
 * opened before the warm-up and waited through at each read, as rt_cuda.c does; nccl_emu.c maps
 * its NCCL calls to MPI (emu_vs_cpu.sh --ranks).
 *
 * Checks a GPU would not make: every matrix product's and convolution's operands must lie
 * inside the arena, a guard zone after the arena must be untouched at close, a block reduction
 * must run in a block of 256 threads and never in divergent code, and (NETC_EMU_REVERSE) the
 * order of blocks and threads must not matter.
 */
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "netrt_cuda.h"

/* The kernels of the .cu, by name; emu_vs_cpu.sh generates this table beside it. fn calls the
 * kernel with the base, and *at when it is one that several nodes share (takes_at: its
 * signature has RtKAt after the base). */
typedef struct EmuKernel {
    const char *name;
    void (*fn)(unsigned char *base, const RtKAt *at);
    int takes_at;
} EmuKernel;
extern const EmuKernel emu_kernels[];
extern const int emu_n_kernels;

typedef struct {
    unsigned x, y, z;
} EmuDim3; /* cuda_emu.h's dim3 */
__thread EmuDim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

enum {
    EMU_SLOTS = 2,               /* staging slots, as rt_cuda.c */
    EMU_MAX_THREADS = 1024,      /* a block's threads, CUDA's limit */
    EMU_STACK = 256 << 10,       /* one fiber's stack, EMU_COLOR of it below the top left out */
    EMU_COLOR = 512,             /* fiber t's stack starts (t % 256) * EMU_COLOR bytes below its
                                  * region's top (fiber_stack) */
    EMU_GUARD = 1 << 20,         /* bytes after the arena that nothing may write */
    EMU_GUARD_BYTE = 0xA5,
    EMU_WIDE = 5,                /* float32 copies of bfloat16 A, B, C and bias (convolutions: 3),
                                  * and a channels-last convolution's filter in KCRS order */
    EMU_KCRS = 4,                /* the slot of that filter */
};

_Noreturn static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn static void die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fputs("error: cuda (emulated): ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* ---- fibers: a block's threads on one OS thread
 *
 * Each thread of a block is a fiber with its own stack. The scheduler switches to every ready
 * fiber in turn; a fiber runs until it returns from the kernel or calls __syncthreads(), then
 * switches back. When every fiber is at the barrier or done, the barrier opens and the round
 * repeats. Blocks run one after another, in ascending order, or descending with NETC_EMU_REVERSE
 * set (threads too): a kernel whose result depends on the order has a race on a GPU. Between
 * two barriers a thread runs alone, so a race among one block's threads shows only as far as
 * the order changes it. The switch saves the callee-saved registers on the fiber's stack;
 * x86-64 System V only. */

#if !defined(__x86_64__)
#error "rt_cuda_emu.c: the fiber switch is written for x86-64"
#endif

/* Save the callee-saved registers and the stack pointer to *save, continue on stack `to`. */
void emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".type emu_switch, @function\n"
        "emu_switch:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".size emu_switch, .-emu_switch\n");

enum { FIBER_READY, FIBER_BARRIER, FIBER_DONE };

typedef struct Block {
    const char *name;        /* the kernel's, for messages */
    const EmuKernel *kernel;
    unsigned char *base;
    const RtKAt *at;         /* a shared kernel's offsets, or NULL */
    unsigned n;              /* threads in the block */
    unsigned current;        /* the fiber running */
    int reverse;             /* NETC_EMU_REVERSE set: blocks and threads in descending order */
    int direct;              /* the block's first thread returned without a barrier: the others run
                                as plain calls (run_block) */
    void *sched_sp;          /* the scheduler's saved stack */
    void *sp[EMU_MAX_THREADS];
    unsigned char state[EMU_MAX_THREADS];
    unsigned char *stacks;   /* EMU_MAX_THREADS * EMU_STACK, mapped once */
} Block;

static Block g_block;

static void fiber_main(void) {
    Block *b = &g_block;
    b->kernel->fn(b->base, b->at);
    b->state[b->current] = FIBER_DONE;
    emu_switch(&b->sp[b->current], b->sched_sp);
    die("internal error: a finished fiber was resumed");
}

/* Every __syncthreads() of netrt_kernels.cuh is inside a block reduction, whose shared array
 * has one slot per thread of a 256-thread block: a smaller block would read stale slots. */
void emu_syncthreads(void) {
    Block *b = &g_block;
    if (b->direct)
        die("%s: block %u: thread %u waits at __syncthreads() while thread %u has returned (a barrier in divergent "
            "code)", b->name, emu_blockIdx.x, emu_threadIdx.x, b->reverse ? b->n - 1 : 0);
    if (emu_blockDim.x != 256)
        die("%s: a block reduction (__syncthreads) in a block of %u threads; netrt_kernels.cuh's need 256", b->name,
            emu_blockDim.x);
    b->state[b->current] = FIBER_BARRIER;
    emu_switch(&b->sp[b->current], b->sched_sp);
}

/* A fresh fiber: emu_switch pops six registers and returns into fiber_main with the stack
 * aligned as after a call. The fibers' regions are EMU_STACK apart, a multiple of a cache way's
 * span, so stacks starting at the regions' tops would put every fiber's frames in the same cache
 * sets, and a switch would miss its frame almost every time (most of the emulation's time in
 * the block reductions); each starts EMU_COLOR bytes further down than the one before instead,
 * 256 fibers' frames over 128 KiB of sets. */
static void *fiber_stack(Block *b, unsigned t) {
    uintptr_t top = (uintptr_t)(b->stacks + (size_t)(t + 1) * EMU_STACK - (size_t)(t % 256) * EMU_COLOR) &
                    ~(uintptr_t)15;
    void **sp = (void **)(top - 8 * sizeof(void *));
    for (int i = 0; i < 6; i++) sp[i] = NULL;
    sp[6] = (void *)fiber_main;
    sp[7] = NULL; /* fiber_main's return address: it never returns */
    return sp;
}

/* Run every thread of block emu_blockIdx to its end. A barrier that some threads reach while
 * others have returned is __syncthreads() in divergent code, which CUDA leaves undefined (it
 * may hang): an error here. So when the first thread returns without reaching a barrier, no
 * other may reach one, and they run as plain calls in the same order (a fiber that never
 * waits runs to its end before the next starts): the same results without two fiber switches
 * a thread, most of the emulation's time in element-wise kernels. */
static void run_block(Block *b) {
    unsigned first = b->reverse ? b->n - 1 : 0;
    b->sp[first] = fiber_stack(b, first);
    b->state[first] = FIBER_READY;
    b->current = first;
    emu_threadIdx = (EmuDim3){first, 0, 0};
    emu_switch(&b->sched_sp, b->sp[first]);
    if (b->state[first] == FIBER_DONE) {
        b->direct = 1;
        for (unsigned i = 1; i < b->n; i++) {
            emu_threadIdx = (EmuDim3){b->reverse ? b->n - 1 - i : i, 0, 0};
            b->kernel->fn(b->base, b->at);
        }
        b->direct = 0;
        return;
    }
    for (unsigned t = 0; t < b->n; t++) /* the first waits at its barrier */
        if (t != first) {
            b->sp[t] = fiber_stack(b, t);
            b->state[t] = FIBER_READY;
        }
    for (;;) {
        unsigned waiting = 0, done = 0;
        for (unsigned i = 0; i < b->n; i++) {
            unsigned t = b->reverse ? b->n - 1 - i : i;
            if (b->state[t] == FIBER_READY) {
                b->current = t;
                emu_threadIdx = (EmuDim3){t, 0, 0};
                emu_switch(&b->sched_sp, b->sp[t]);
            }
            waiting += b->state[t] == FIBER_BARRIER;
            done += b->state[t] == FIBER_DONE;
        }
        if (!waiting) return;
        if (done)
            die("%s: block %u: %u threads wait at __syncthreads() while %u have returned (a barrier in divergent "
                "code)", b->name, emu_blockIdx.x, waiting, done);
        for (unsigned t = 0; t < b->n; t++)
            if (b->state[t] == FIBER_BARRIER) b->state[t] = FIBER_READY;
    }
}

static void launch(const char *name, const EmuKernel *kernel, unsigned char *base, const RtKAt *at, unsigned grid,
                   unsigned block) {
    Block *b = &g_block;
    if (!b->stacks) {
        b->stacks = mmap(NULL, (size_t)EMU_MAX_THREADS * EMU_STACK, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b->stacks == MAP_FAILED) die("cannot map the fibers' stacks");
        for (size_t t = 0; t < EMU_MAX_THREADS; t++) /* a guard page under each: overflow faults */
            if (mprotect(b->stacks + t * EMU_STACK, 4096, PROT_NONE) != 0) die("cannot protect a fiber's stack");
        b->reverse = getenv("NETC_EMU_REVERSE") != NULL;
    }
    b->name = name, b->kernel = kernel, b->base = base, b->at = at, b->n = block;
    emu_gridDim = (EmuDim3){grid, 1, 1};
    emu_blockDim = (EmuDim3){block, 1, 1};
    for (unsigned i = 0; i < grid; i++) {
        emu_blockIdx = (EmuDim3){b->reverse ? grid - 1 - i : i, 0, 0};
        run_block(b);
    }
}

/* ---- the device */

struct RtCuda {
    const RtModel *model;
    const RtCudaModel *dm;
    const EmuKernel **kernels;         /* dm->n_kernels, indexed like dm->kernel_names */
    unsigned char *base;               /* the arena (`bytes`), then EMU_GUARD guard bytes */
    size_t bytes;                      /* rt_cuda.c's: device_bytes, a sharded optimizer's state, --accumulate's sum */
    int accumulate;                    /* --accumulate K (1: none) */
    int64_t accum_at;                  /* with K > 1: the step's summed gradients, last in the arena */
    int64_t state_floats;              /* the optimizer state's floats */
    long long *shard;                  /* --shard-optimizer: the slice table at dm->off_shard, or NULL */
    unsigned char *side;               /* --eval-async: rt_cuda.c's second arena, then guard bytes */
    size_t side_bytes;                 /* its size: the evaluation's regions alone (eval_bytes) */
    unsigned char *slot[EMU_SLOTS];    /* staging: RtBatchHeader, then the inputs */
    int next_slot;
    long launches;                     /* steps staged so far */
    RtDevState posted;                 /* post_train's copy of the sums */
    long posted_at;                    /* `launches` when it was made */
    size_t input_bytes[RT_MAX_INPUTS];
    int coll_open;                     /* dm->coll joined its ranks (nccl_emu.c) */
    float *conv_scratch;               /* the NCHW convolutions' per-thread scratch */
    size_t conv_scratch_floats;
    float *wide[EMU_WIDE];             /* bfloat16 operands and results widened to float32, a KCRS filter */
    size_t wide_floats[EMU_WIDE];
};

static RtCuda g_cu;

cudaStream_t rt_cuda_stream(const RtCuda *cu) {
    (void)cu;
    return NULL;
}
unsigned char *rt_cuda_base(const RtCuda *cu) { return cu->base; }
const RtModel *rt_cuda_model(const RtCuda *cu) { return cu->model; }
const RtCudaModel *rt_cuda_device_model(const RtCuda *cu) { return cu->dm; }

/* rt_cuda.c's launch, checked: a kernel's arguments must be those its signature has (a shared
 * kernel read through a NULL RtKAt, or offsets a kernel ignores, is a code generator's error
 * that a GPU would show as a crash or as wrong operands), and every offset of a shared kernel
 * an address inside the allocation. */
static void launch_checked(RtCuda *cu, int k, unsigned grid, unsigned block, const RtKAt *at) {
    if (k < 0 || k >= cu->dm->n_kernels) die("internal error: kernel %d of %d launched", k, cu->dm->n_kernels);
    const char *name = cu->dm->kernel_names[k];
    if (grid < 1 || grid > 0x7fffffffu || block < 1 || block > EMU_MAX_THREADS)
        die("launching %s: %u blocks of %u threads is not a valid launch", name, grid, block);
    if (block > 256) /* every kernel is __launch_bounds__(256) */
        die("launching %s with %u threads, above its __launch_bounds__(256)", name, block);
    if (cu->kernels[k]->takes_at != (at != NULL))
        die("internal error: %s %s operand offsets (RtKAt) and was launched %s them", name,
            at ? "takes no" : "takes its", at ? "with" : "without");
    for (int i = 0; at && i < RT_K_AT; i++)
        if (at->o[i] < 0 || at->o[i] >= (long long)cu->bytes)
            die("internal error: launching %s: offset %d is %lld, outside the %zu-byte allocation", name, i, at->o[i],
                cu->bytes);
    launch(name, cu->kernels[k], cu->base, at, grid, block);
}

void rt_cuda_launch(RtCuda *cu, int k, unsigned grid, unsigned block) { launch_checked(cu, k, grid, block, NULL); }

void rt_cuda_launch_at(RtCuda *cu, int k, unsigned grid, unsigned block, const RtKAt *at) {
    launch_checked(cu, k, grid, block, at);
}

static size_t dtype_bytes(RtDtype t) {
    static const size_t bytes[] = {[RT_F32] = 4, [RT_F16] = 2, [RT_BF16] = 2, [RT_I32] = 4, [RT_I64] = 8, [RT_U8] = 1};
    return bytes[t];
}

/* A library call's element type: float32, or bfloat16 or fp16 (accumulated in float32). */
static void check_dtype(RtDtype t, const char *op) {
    if (t != RT_F32 && t != RT_BF16 && t != RT_F16) die("internal error: %s planned on element type %d", op, (int)t);
}

/* Stop unless the n elements of `elem` bytes at p lie inside the arena: an operand the
 * generated code misplaced. */
static void check_inside(const RtCuda *cu, const void *p, int64_t n, size_t elem, const char *what, const char *op) {
    const unsigned char *lo = cu->base, *hi = cu->base + cu->bytes, *q = p;
    if (!p || q < lo || n < 0 || q + n * (int64_t)elem > hi)
        die("%s: %s (%lld %zu-byte elements at arena offset %lld) is not inside the %lld-byte arena", op, what,
            (long long)n, elem, p ? (long long)(q - lo) : -1LL, (long long)cu->bytes);
}

/* Stop if a result (n elements at out) overlaps an operand (m at in): cuBLASLt and cuDNN read
 * their operands while they write, so the memory plan must never share a buffer between them. */
static void check_apart(const void *out, int64_t n, const void *in, int64_t m, size_t elem, const char *what,
                        const char *op) {
    const unsigned char *o = out, *i = in;
    if (o < i + m * (int64_t)elem && i < o + n * (int64_t)elem) die("%s: the result overlaps %s", op, what);
}

/* Host scratch `slot` for n float32 values. */
static float *wide_scratch(RtCuda *cu, int slot, int64_t n) {
    if ((size_t)n > cu->wide_floats[slot]) {
        free(cu->wide[slot]);
        if (!(cu->wide[slot] = malloc((size_t)n * sizeof(float)))) die("out of host memory for library operands");
        cu->wide_floats[slot] = (size_t)n;
    }
    return cu->wide[slot];
}

/* The n elements at p as float32: p itself for float32 data, else bfloat16 or fp16 widened
 * into the host scratch `slot` (exactly: every bfloat16 and fp16 is a float32). */
static const float *widen(RtCuda *cu, int slot, const void *p, int64_t n, RtDtype t) {
    if (t == RT_F32) return p;
    float *f = wide_scratch(cu, slot, n);
    const uint16_t *h = p;
    if (t == RT_F16)
        for (int64_t i = 0; i < n; i++) f[i] = rt_f16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) f[i] = rt_bf16_to_f32(h[i]);
    return f;
}

/* Where a result of n elements at p is computed in float32: p itself, or host scratch `slot`
 * that narrow() then rounds to bfloat16 or fp16 at p. */
static float *result(RtCuda *cu, int slot, void *p, int64_t n, RtDtype t) {
    return t == RT_F32 ? p : wide_scratch(cu, slot, n);
}

/* Round rows x cols float32 results f (row stride ld, in elements) to type t, bfloat16 or fp16,
 * at p, leaving the elements between rows alone; nothing for float32, computed in place. */
static void narrow(void *p, const float *f, int64_t rows, int64_t cols, int64_t ld, RtDtype t) {
    uint16_t *h = p;
    if (t == RT_F32) return;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            h[i * ld + j] = t == RT_F16 ? rt_f32_to_f16(f[i * ld + j]) : rt_f32_to_bf16(f[i * ld + j]);
}

/* ---- matrix products: rt_gemm, then the epilogue */

struct RtGemmPlan {
    int trans_a, trans_b;
    int64_t M, N, K, lda, ldb, ldc, batch, sa, sb, sc;
    RtEpilogue epi;
    RtDtype dtype;
    RtGemmPlan *next;
};
static RtGemmPlan *gemm_plans;

RtGemmPlan *rt_cuda_gemm_plan(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                              int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc,
                              RtEpilogue epi, RtDtype dtype) {
    (void)cu;
    check_dtype(dtype, "a matrix product");
    /* rt_cuda_gemm.c's check: arguments no correct caller passes */
    if (M < 1 || N < 1 || K < 1 || batch < 1 || batch > INT32_MAX || lda < (trans_a ? M : K) ||
        ldb < (trans_b ? K : N) || ldc < N || epi < RT_EPI_NONE || epi > RT_EPI_GELU_AUX_BIAS ||
        (epi == RT_EPI_GELU_AUX_BIAS && (ldc % 8 || (batch > 1 && sc % 8))))
        die("internal error: bad matrix product C[%lld,%lld] K %lld ld %lld %lld %lld batch %lld epilogue %d",
            (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb, (long long)ldc,
            (long long)batch, (int)epi);
    RtGemmPlan *p = calloc(1, sizeof *p);
    if (!p) die("out of host memory");
    *p = (RtGemmPlan){trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, batch > 1 ? sa : 0, batch > 1 ? sb : 0,
                      batch > 1 ? sc : 0, epi, dtype, gemm_plans};
    gemm_plans = p;
    return p;
}

/* As rt_cuda_gemm.c's: NULL where cuBLASLt would have no algorithm, which the emulation plays
 * for the GELU epilogues when NETC_EMU_NO_GELU_EPILOGUE is set, and for every epilogue when
 * NETC_EMU_NO_EPILOGUE is (the generated fallback, a plain product and the group's kernel, then
 * runs; cuda_emu_rows_gelu_fallback, cuda_emu_mlp_epilogue_fallback). */
RtGemmPlan *rt_cuda_gemm_plan_try(RtCuda *cu, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                  int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                                  int64_t sc, RtEpilogue epi, RtDtype dtype) {
    if ((epi == RT_EPI_GELU_BIAS || epi == RT_EPI_GELU_AUX_BIAS) && getenv("NETC_EMU_NO_GELU_EPILOGUE")) return NULL;
    if (epi != RT_EPI_NONE && getenv("NETC_EMU_NO_EPILOGUE")) return NULL;
    return rt_cuda_gemm_plan(cu, trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, sa, sb, sc, epi, dtype);
}

/* Elements from a row-major rows x cols matrix's first element to its last, + 1. */
static int64_t extent(int64_t rows, int64_t cols, int64_t ld) { return (rows - 1) * ld + cols; }

/* GELU's tanh approximation as the generated CPU code computes it (codegen/cexpr.c's gelu_tanh):
 * what cuBLASLt's GELU epilogues stand for here; the real ones round in their own way. */
static float gelu_tanh(float x) {
    float u = 0.797884561f * (x + 0.044715f * (x * x * x));
    return x / (1.0f + rt_expf(-2.0f * u));
}

void rt_cuda_gemm(RtCuda *cu, const RtGemmPlan *p, const void *A, const void *B, void *C, const void *bias, void *aux) {
    if ((p->epi != RT_EPI_NONE) != (bias != NULL) || (p->epi == RT_EPI_GELU_AUX_BIAS) != (aux != NULL))
        die("internal error: matrix product with epilogue %d run %s a bias and %s an aux matrix", (int)p->epi,
            bias ? "with" : "without", aux ? "with" : "without");
    const int64_t last = p->batch - 1;
    const int64_t na = last * p->sa + extent(p->trans_a ? p->K : p->M, p->trans_a ? p->M : p->K, p->lda);
    const int64_t nb = last * p->sb + extent(p->trans_b ? p->N : p->K, p->trans_b ? p->K : p->N, p->ldb);
    const int64_t nc = last * p->sc + extent(p->M, p->N, p->ldc);
    const size_t e = dtype_bytes(p->dtype);
    check_inside(cu, A, na, e, "A", "matrix product");
    check_inside(cu, B, nb, e, "B", "matrix product");
    check_inside(cu, C, nc, e, "C", "matrix product");
    if (bias) check_inside(cu, bias, p->N, e, "the bias", "matrix product");
    check_apart(C, nc, A, na, e, "A", "matrix product");
    check_apart(C, nc, B, nb, e, "B", "matrix product");
    if (bias) check_apart(C, nc, bias, p->N, e, "the bias", "matrix product");
    if (aux) {
        check_inside(cu, aux, nc, e, "the aux matrix", "matrix product");
        check_apart(C, nc, aux, nc, e, "the aux matrix", "matrix product");
        if (p->dtype != RT_F32) die("internal error: a GELU epilogue with an aux matrix on dtype %d", (int)p->dtype);
    }
    const float *a = widen(cu, 0, A, na, p->dtype), *b = widen(cu, 1, B, nb, p->dtype);
    const float *fbias = bias ? widen(cu, 3, bias, p->N, p->dtype) : NULL;
    float *c = result(cu, 2, C, nc, p->dtype);
    for (int64_t k = 0; k < p->batch; k++) {
        float *ck = c + k * p->sc;
        rt_gemm(p->trans_a, p->trans_b, p->M, p->N, p->K, 1.0f, a + k * p->sa, p->lda, b + k * p->sb, p->ldb, 0.0f,
                ck, p->ldc);
        if (fbias)
            for (int64_t i = 0; i < p->M; i++)
                for (int64_t j = 0; j < p->N; j++) {
                    const int64_t at = i * p->ldc + j;
                    float v = ck[at] + fbias[j];
                    if (aux) ((float *)aux)[k * p->sc + at] = v;
                    ck[at] = p->epi == RT_EPI_RELU_BIAS && v < 0.0f ? 0.0f
                             : p->epi == RT_EPI_GELU_BIAS || p->epi == RT_EPI_GELU_AUX_BIAS ? gelu_tanh(v) : v;
                }
        narrow((uint16_t *)C + k * p->sc, ck, p->M, p->N, p->ldc, p->dtype);
    }
}

/* ---- convolutions: the CPU's kernels, NCHW (im2col + OpenBLAS) or NHWC (oneDNN)
 *
 * The filter follows rt_cuda_conv_plan's contract: KRSC beside NHWC activations (the generated
 * step has permuted the weights), KCRS beside NCHW. The CPU's oneDNN takes KCRS, so an NHWC
 * plan permutes the filter into host scratch before a forward or data-gradient convolution and
 * the filter gradient back to KRSC after one - exactly, so the results are the CPU trainer's. */

struct RtCudaConvPlan {
    RtConv c;
    int which, nhwc;
    RtDtype dtype;
    RtConvPlan *dnnl; /* the oneDNN primitive, built on first use */
    RtCudaConvPlan *next;
};
static RtCudaConvPlan *conv_plans;

RtCudaConvPlan *rt_cuda_conv_plan(RtCuda *cu, const RtConv *c, int which, int nhwc, RtDtype dtype) {
    (void)cu;
    check_dtype(dtype, "a convolution");
    int ok = which >= 0 && which <= 2 && c->groups >= 1 && c->C % c->groups == 0 && c->K % c->groups == 0 &&
             c->stride_h >= 1 && c->stride_w >= 1 && c->dil_h >= 1 && c->dil_w >= 1 && c->pad_h >= 0 &&
             c->pad_w >= 0 && c->N >= 1 && c->C >= 1 && c->H >= 1 && c->W >= 1 && c->K >= 1 && c->R >= 1 &&
             c->S >= 1 && c->P >= 1 && c->Q >= 1;
    /* cuDNN's output size for the geometry must be the planned one */
    ok = ok && c->P == (c->H + 2 * c->pad_h - c->dil_h * (c->R - 1) - 1) / c->stride_h + 1 &&
         c->Q == (c->W + 2 * c->pad_w - c->dil_w * (c->S - 1) - 1) / c->stride_w + 1;
    if (!ok) die("internal error: bad convolution (direction %d)", which);
    RtCudaConvPlan *p = calloc(1, sizeof *p);
    if (!p) die("out of host memory");
    p->c = *c, p->which = which, p->nhwc = nhwc, p->dtype = dtype, p->next = conv_plans;
    conv_plans = p;
    return p;
}

/* The filter [K, C/groups, R, S] from KRSC order to KCRS (to_krsc 0) or back (1). */
static void permute_filter(const RtConv *c, const float *src, float *dst, int to_krsc) {
    const int64_t K = c->K, C = c->C / c->groups, RS = c->R * c->S;
    for (int64_t k = 0; k < K; k++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t rs = 0; rs < RS; rs++) {
                int64_t kcrs = (k * C + ch) * RS + rs, krsc = (k * RS + rs) * C + ch;
                if (to_krsc) dst[krsc] = src[kcrs];
                else dst[kcrs] = src[krsc];
            }
}

static float *conv_scratch(RtCuda *cu, const RtConv *c) {
    size_t need = (size_t)rt_conv2d_scratch(c) * (size_t)omp_get_max_threads();
    if (need > cu->conv_scratch_floats) {
        free(cu->conv_scratch);
        cu->conv_scratch = malloc(need * sizeof(float));
        if (!cu->conv_scratch) die("out of host memory for convolution scratch");
        cu->conv_scratch_floats = need;
    }
    return cu->conv_scratch;
}

void rt_cuda_conv(RtCuda *cu, const RtCudaConvPlan *cp, const void *in0, const void *in1, void *out) {
    RtCudaConvPlan *p = (RtCudaConvPlan *)cp; /* the oneDNN slot is filled on first use */
    const RtConv *c = &p->c;
    int64_t x = c->N * c->C * c->H * c->W, w = c->K * (c->C / c->groups) * c->R * c->S, y = c->N * c->K * c->P * c->Q;
    static const char *const names[] = {"forward convolution", "data-gradient convolution",
                                        "filter-gradient convolution"};
    const char *op = names[p->which];
    const int64_t in0_n[] = {x, y, x}, in1_n[] = {w, w, y}, out_n[] = {y, x, w};
    const int64_t n0 = in0_n[p->which], n1 = in1_n[p->which], nout = out_n[p->which];
    const size_t e = dtype_bytes(p->dtype);
    check_inside(cu, in0, n0, e, "the first operand", op);
    check_inside(cu, in1, n1, e, "the second operand", op);
    check_apart(out, nout, in0, n0, e, "the first operand", op);
    check_apart(out, nout, in1, n1, e, "the second operand", op);
    check_inside(cu, out, nout, e, "the result", op);
    const float *a = widen(cu, 0, in0, n0, p->dtype), *b = widen(cu, 1, in1, n1, p->dtype);
    float *r = result(cu, 2, out, nout, p->dtype);
    float *kcrs = p->nhwc ? wide_scratch(cu, EMU_KCRS, w) : NULL;
    if (kcrs && p->which != 2) permute_filter(c, b, kcrs, 0), b = kcrs;
    int64_t per = rt_conv2d_scratch(c);
    switch (p->which) {
    case 0:
        if (p->nhwc) rt_conv2d_nhwc_fwd(c, &p->dnnl, a, b, r);
        else rt_conv2d_fwd(c, a, b, r, conv_scratch(cu, c), per);
        break;
    case 1:
        if (p->nhwc) rt_conv2d_nhwc_bwd_data(c, &p->dnnl, a, b, r);
        else rt_conv2d_bwd_data(c, a, b, r, conv_scratch(cu, c), per);
        break;
    default:
        if (p->nhwc) rt_conv2d_nhwc_bwd_filter(c, &p->dnnl, a, b, kcrs), permute_filter(c, kcrs, r, 1);
        else rt_conv2d_bwd_filter(c, a, b, r, conv_scratch(cu, c), per);
        break;
    }
    narrow(out, r, 1, nout, nout, p->dtype);
}

static void plans_free(void) {
    while (gemm_plans) {
        RtGemmPlan *p = gemm_plans;
        gemm_plans = p->next;
        free(p);
    }
    while (conv_plans) {
        RtCudaConvPlan *p = conv_plans;
        conv_plans = p->next;
        if (p->dnnl) rt_conv_plan_free(p->dnnl);
        free(p);
    }
}

/* ---- the hooks, as rt_cuda.c's */

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

/* rt_cuda.c's size_inputs: one batch of each input, inside the staged batch. */
static int size_inputs(RtCuda *cu, char *why, size_t size) {
    const RtModel *m = cu->model;
    const RtCudaModel *dm = cu->dm;
    if (m->n_inputs < 0 || m->n_inputs > RT_MAX_INPUTS)
        return fail(why, size, "internal error: %d inputs", m->n_inputs);
    if (dm->batch_bytes < (int64_t)sizeof(RtBatchHeader) || dm->off_batch < 0 ||
        dm->off_batch + dm->batch_bytes > dm->device_bytes)
        return fail(why, size, "internal error: the staged batch is not inside the arena");
    for (int i = 0; i < m->n_inputs; i++) {
        int64_t n = m->batch;
        for (int d = 0; d < m->inputs[i].rank; d++) n *= m->inputs[i].shape[d];
        cu->input_bytes[i] = (size_t)n * dtype_bytes(m->inputs[i].dtype);
        if (dm->off_input[i] < (int64_t)sizeof(RtBatchHeader) ||
            dm->off_input[i] + (int64_t)cu->input_bytes[i] > dm->batch_bytes)
            return fail(why, size, "internal error: input %s is not inside the staged batch", m->inputs[i].name);
    }
    return 0;
}

static int find_kernels(RtCuda *cu, char *why, size_t size) {
    const RtCudaModel *dm = cu->dm;
    cu->kernels = calloc(dm->n_kernels > 0 ? (size_t)dm->n_kernels : 1, sizeof *cu->kernels);
    if (!cu->kernels) return fail(why, size, "out of host memory");
    for (int k = 0; k < dm->n_kernels; k++) {
        for (int i = 0; i < emu_n_kernels && !cu->kernels[k]; i++)
            if (strcmp(emu_kernels[i].name, dm->kernel_names[k]) == 0) cu->kernels[k] = &emu_kernels[i];
        if (!cu->kernels[k]) return fail(why, size, "the kernels have no %s", dm->kernel_names[k]);
    }
    return 0;
}

/* rt_cuda.c's: zeroed, with its layout written again (write_layout: the slice table of a
 * sharded optimizer, --accumulate's K and sum in the step state) */
static void zero_arena(RtCuda *cu) {
    memset(cu->base, 0, cu->bytes);
    if (cu->shard)
        memcpy(cu->base + cu->dm->off_shard, cu->shard, ((size_t)cu->model->n_buckets * 3 + 1) * sizeof *cu->shard);
    RtDevState *st = (RtDevState *)(cu->base + cu->dm->off_state);
    st->accumulate = cu->accumulate, st->accum_at = cu->accum_at;
}

static int emu_open(const RtModel *m, const RtRanks *ranks, const RtDeviceOptions *o, char *why, size_t size) {
    RtCuda *cu = &g_cu;
    /* no graphs here (o->use_graph): every step runs as it is enqueued */
    if (cu->dm) return fail(why, size, "internal error: the CUDA device is already open");
    cu->model = m, cu->dm = m->device_model;
    cu->accumulate = o->accumulate > 1 ? o->accumulate : 1;
    if (!cu->dm || !cu->dm->train || !cu->dm->eval) return fail(why, size, "internal error: no CUDA step");
    if (size_inputs(cu, why, size) || find_kernels(cu, why, size)) return 1;
    if (cu->dm->coll && ranks && ranks->comm) { /* rt_cuda.c's order: before the warm-up step */
        if (cu->dm->coll->open(cu, ranks, why, size)) return 1;
        cu->coll_open = 1;
    }
    /* rt_cuda.c's size_arena: the optimizer state of this rank's slices after the rest, then
     * --accumulate's sum */
    cu->bytes = (size_t)cu->dm->device_bytes;
    cu->state_floats = (int64_t)m->n_state_slots * m->n_grad_floats;
    if (cu->dm->off_shard) {
        if (!(cu->shard = calloc((size_t)m->n_buckets * 3 + 1, sizeof *cu->shard)))
            return fail(why, size, "out of host memory");
        cu->state_floats = (int64_t)m->n_state_slots * rt_shard_table(m, ranks, cu->shard);
        cu->bytes += (size_t)cu->state_floats * sizeof(float);
    }
    if (cu->accumulate > 1) {
        cu->accum_at = (int64_t)((cu->bytes + 255) & ~(size_t)255);
        cu->bytes = (size_t)cu->accum_at + (size_t)m->n_grad_floats * sizeof(float);
    }
    size_t bytes = (cu->bytes + EMU_GUARD + 255) & ~(size_t)255;
    cu->base = aligned_alloc(256, bytes); /* cudaMalloc's alignment */
    if (!cu->base) return fail(why, size, "out of host memory for the %zu-byte arena", cu->bytes);
    zero_arena(cu);
    memset(cu->base + cu->bytes, EMU_GUARD_BYTE, EMU_GUARD);
    if (o->eval_async) {
        cu->side_bytes = (size_t)cu->dm->eval_bytes;
        if (!cu->side_bytes || cu->side_bytes > cu->bytes) return fail(why, size, "internal error: eval_bytes");
        cu->side = aligned_alloc(256, (cu->side_bytes + EMU_GUARD + 255) & ~(size_t)255);
        if (!cu->side) return fail(why, size, "out of host memory for a second arena");
        memset(cu->side, 0, cu->side_bytes);
        memset(cu->side + cu->side_bytes, EMU_GUARD_BYTE, EMU_GUARD);
    }
    if (cu->dm->plan) cu->dm->plan(cu);
    for (int s = 0; s < EMU_SLOTS; s++)
        if (!(cu->slot[s] = calloc(1, (size_t)cu->dm->batch_bytes))) return fail(why, size, "out of host memory");
    /* rt_cuda.c's warm-up: each step once on the zeroed arena, then zeroed again */
    if (cu->accumulate > 1)
        cu->dm->train(cu, RT_STEP_SUM), cu->dm->train(cu, RT_STEP_LAST);
    else
        cu->dm->train(cu, RT_STEP_WHOLE);
    cu->dm->eval(cu);
    zero_arena(cu);
    return 0;
}

static void emu_upload(const float *params, const float *optstate) {
    RtCuda *cu = &g_cu;
    const RtModel *m = cu->model;
    memcpy(cu->base + cu->dm->off_params, params, rt_device_param_floats(m) * sizeof(float));
    if (m->n_half_params) rt_half_params(m, params, (uint16_t *)(cu->base + cu->dm->off_half_params));
    size_t state_floats = (size_t)cu->state_floats;
    if (state_floats && optstate) memcpy(cu->base + cu->dm->off_optstate, optstate, state_floats * sizeof(float));
}

static void emu_download(float *params, float *optstate) {
    RtCuda *cu = &g_cu;
    const RtModel *m = cu->model;
    memcpy(params, cu->base + cu->dm->off_params, rt_device_param_floats(m) * sizeof(float));
    size_t state_floats = (size_t)cu->state_floats;
    if (state_floats && optstate) memcpy(optstate, cu->base + cu->dm->off_optstate, state_floats * sizeof(float));
}

static void emu_start(int64_t step, int64_t per_epoch, int64_t total, uint64_t seed, const RtLossScale *scale) {
    RtCuda *cu = &g_cu;
    RtDevState st;
    memset(&st, 0, sizeof st);
    st.step = step, st.per_epoch = per_epoch, st.total = total, st.seed = seed;
    st.accumulate = cu->accumulate, st.accum_at = cu->accum_at;
    st.schedule = cu->model->schedule, st.hyper = cu->model->hyper;
    if (scale) rt_devstate_set_scale(&st, scale);
    memcpy(cu->base + cu->dm->off_state, &st, sizeof st);
}

enum { EVAL = -1 }; /* stage_and_run's `part` for an evaluation step (rt_cuda.c's) */

static void stage_and_run(void *const *batch, int64_t n_valid, int part) {
    RtCuda *cu = &g_cu;
    int s = cu->next_slot;
    cu->next_slot = (s + 1) % EMU_SLOTS;
    cu->launches++;
    ((RtBatchHeader *)cu->slot[s])->n_valid = n_valid;
    for (int i = 0; i < cu->model->n_inputs; i++)
        memcpy(cu->slot[s] + cu->dm->off_input[i], batch[i], cu->input_bytes[i]);
    memcpy(cu->base + cu->dm->off_batch, cu->slot[s], (size_t)cu->dm->batch_bytes);
    if (part == EVAL)
        cu->dm->eval(cu);
    else
        cu->dm->train(cu, (RtStepPart)part);
}

static void emu_train_step(void *const *batch, RtStepPart part) {
    if ((part == RT_STEP_WHOLE) != (g_cu.accumulate == 1))
        die("internal error: a training launch of part %d with --accumulate %d", (int)part, g_cu.accumulate);
    stage_and_run(batch, g_cu.model->batch, (int)part);
}
static void emu_eval_step(void *const *batch, int64_t n_valid) { stage_and_run(batch, n_valid, EVAL); }

/* rt_cuda.c's read_state: the wait a distributed trainer's collectives watch */
static RtDevState *state(RtCuda *cu) {
    if (cu->coll_open) cu->dm->coll->wait(cu, NULL, "reading the device state");
    return (RtDevState *)(cu->base + cu->dm->off_state);
}

static void emu_post_train(void) {
    RtCuda *cu = &g_cu;
    RtDevState *st = (RtDevState *)(cu->base + cu->dm->off_state);
    cu->posted = *st, cu->posted_at = cu->launches;
    st->loss_sum = 0, st->loss_steps = 0;
    memset(st->correct_sum, 0, sizeof st->correct_sum);
}

static int emu_take_train(RtDeviceSums *sums, int wait) {
    RtCuda *cu = &g_cu;
    if (!wait && cu->launches < cu->posted_at + EMU_SLOTS) return 0; /* the device is still behind */
    if (wait && cu->coll_open) cu->dm->coll->wait(cu, NULL, "taking the device's sums");
    const RtDevState *st = &cu->posted;
    sums->loss = st->loss_sum;
    memcpy(sums->correct, st->correct_sum, sizeof sums->correct);
    sums->steps = st->loss_steps;
    sums->nonfinite_step = st->nonfinite_step;
    sums->grad_norm = st->grad_norm;
    sums->nonfinite_grads = st->nonfinite_grads;
    sums->scale = rt_devstate_scale(st);
    return 1;
}

static void emu_read_eval(double *loss_sum, double *correct) {
    RtDevState *st = state(&g_cu);
    *loss_sum = st->eval_loss;
    memcpy(correct, st->eval_correct, sizeof st->eval_correct);
    st->eval_loss = 0;
    memset(st->eval_correct, 0, sizeof st->eval_correct);
}

/* rt_cuda.c's --predict: the output's bytes, which must lie inside the arena, through the
 * generated conversion. */
static void emu_read_output(float *out) {
    RtCuda *cu = &g_cu;
    const RtCudaModel *dm = cu->dm;
    if (!dm->output_to_host) die("internal error: --predict on a model whose device step has no output");
    state(cu); /* the wait rt_cuda.c's copy makes */
    check_inside(cu, cu->base + dm->off_output, dm->output_bytes, 1, "the model's output", "--predict");
    dm->output_to_host(cu->base + dm->off_output, out);
}

/* rt_cuda.c's --eval-async: the parameters copied to the second arena, whose evaluation steps
 * run there (run at once here, as every step is: a step that read the first arena would see the
 * parameters of later training steps). */
static void emu_eval_async_begin(void) {
    RtCuda *cu = &g_cu;
    if (!cu->side) die("--eval-async's evaluation begun on a device opened without it");
    memcpy(cu->side + cu->dm->off_params, cu->base + cu->dm->off_params,
           rt_device_param_floats(cu->model) * sizeof(float));
    memcpy(cu->side + cu->dm->off_half_params, cu->base + cu->dm->off_half_params,
           (size_t)cu->model->n_half_params * sizeof(uint16_t));
    memset(cu->side + cu->dm->off_state, 0, sizeof(RtDevState));
}

/* rt_cuda.c's swap_lane: the library calls' operands are checked against the lane's arena */
static void swap_arenas(RtCuda *cu) {
    unsigned char *b = cu->base;
    size_t n = cu->bytes;
    cu->base = cu->side, cu->side = b;
    cu->bytes = cu->side_bytes, cu->side_bytes = n;
}

static void emu_eval_async_step(void *const *batch, int64_t n_valid) {
    swap_arenas(&g_cu);
    stage_and_run(batch, n_valid, EVAL);
    swap_arenas(&g_cu);
}

static void emu_eval_async_read(double *loss_sum, double *correct) {
    const RtDevState *st = (const RtDevState *)(g_cu.side + g_cu.dm->off_state);
    *loss_sum = st->eval_loss;
    memcpy(correct, st->eval_correct, sizeof st->eval_correct);
}

static void emu_close(void) {
    RtCuda *cu = &g_cu;
    for (int a = 0; a < 2; a++) {
        const unsigned char *arena = a ? cu->side : cu->base;
        size_t n = a ? cu->side_bytes : cu->bytes;
        for (size_t i = 0; arena && i < EMU_GUARD; i++)
            if (arena[n + i] != EMU_GUARD_BYTE)
                die("something wrote %zu bytes past the end of the %zu-byte %s arena", i, n,
                    a ? "evaluation's" : "step's");
    }
    plans_free();
    if (cu->coll_open) cu->dm->coll->close();
    for (int s = 0; s < EMU_SLOTS; s++) free(cu->slot[s]);
    free(cu->base), free(cu->side), free(cu->kernels), free(cu->conv_scratch), free(cu->shard);
    for (int i = 0; i < EMU_WIDE; i++) free(cu->wide[i]);
    memset(cu, 0, sizeof *cu);
}

const RtDevice rt_cuda_device = {
    .name = "cuda",
    .open = emu_open,
    .upload = emu_upload,
    .download = emu_download,
    .start = emu_start,
    .train_step = emu_train_step,
    .eval_step = emu_eval_step,
    .post_train = emu_post_train,
    .take_train = emu_take_train,
    .read_eval = emu_read_eval,
    .read_output = emu_read_output,
    .eval_async_begin = emu_eval_async_begin,
    .eval_async_step = emu_eval_async_step,
    .eval_async_read = emu_eval_async_read,
    .close = emu_close,
};
