/* cuda_gen.h - what the CUDA backend's two files share (cuda.c: the kernels, library calls, the
 * device map and the two files' texts; cuda_step.c: the step's bookkeeping on the device, from
 * the learning rate to the optimizer). Not an interface of the code generator: codegen.h is. */
#ifndef NETC_CUDA_GEN_H
#define NETC_CUDA_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "cexpr.h"
#include "netrt.h"
#include "rt_devstate.h"

enum {
    BLOCK = RT_CUDA_BLOCK, /* threads per block of every generated kernel (rt_devstate.h) */
    MAX_GRID = 1 << 20,   /* blocks of a grid-stride kernel; more elements loop */
    BN_ROWS = 256,        /* rows per partial sum of the batch-norm kernels (RT_K_BN_ROWS) */
    NORM_ROWS = 32,       /* rows per partial sum of the norms' parameter gradients (RT_K_NORM_ROWS) */
    ALIGN = 256,          /* every region of the device arena starts at a multiple of this */
    CLIP_BLOCKS = 256,    /* blocks of the first clip_grad_norm kernel at most (cu_clip) */
    ACC_BLOCKS = 1024,    /* blocks counting an accuracy's rows at most (emit_rows) */
    SUM_RUN_ROWS = 256,   /* rows per run of a SUM_TO over rows (emit_sum_to), at least */
    SUM_RUNS = 64,        /* runs of rows of a SUM_TO over rows at most */
    PIECE = 16 * BLOCK,   /* floats per block of a layer-wise optimizer's kernels (cu_layerwise) */
};

/* Where everything lives in the device allocation, in bytes from its base. */
typedef struct Map {
    int64_t state, batch, params, grads, optstate, arena, part, total;
    int64_t shard; /* --shard-optimizer: this rank's slices (netrt_cuda.h's off_shard); else 0 */
    int64_t half_params; /* --frozen-half: the flat buffer's last n_half_params values, in half */
    int64_t eval_end; /* what an evaluation step touches ends here: state to partial sums */
    int64_t batch_bytes;
    int64_t input[RT_MAX_INPUTS]; /* inside the staged batch */
} Map;

enum {
    KERNEL_NAME = 64, /* k8_add_relu_l11 and the like, with room to spare */
    WHAT = 320,       /* a launch's comment (node_what): its text, an id, a file's base name (at most 255), a line */
};

typedef struct Kernel {
    char name[KERNEL_NAME];
    char *key; /* its body as twin_key gives it, to find twins */
    int n_at;  /* the entries of its RtKAt it reads: 0, it takes none */
} Kernel;

/* Every text being written has its own printer, a Cg whose out is that text and whose depth
 * follows its blocks: c, the emitter's state, prints the kernel being written; cu, step and plan
 * (whose other fields stay zero) print the kernels and the bodies of the host functions, which
 * the two files' printers (emit_cu_prologue, emit_host) copy in at the depth they were printed at.
 * A format that ends in "\n" leaves a blank line after its line; cg_blank prints one alone, and
 * an empty piece of a line is "%s", "" (the printers' formats are checked, and an empty one is
 * refused). */
typedef struct Cu {
    Cg c;              /* c.out: the body of the kernel being written, at depth 1 in its braces */
    const IrGraph *g;
    Map map;
    Cg cu;             /* the kernels, in launch order */
    Cg step;           /* the body of the host function being written (train or eval) */
    Cg plan;           /* the body of the host plan() function */
    unsigned char *planned; /* planned[id]: node id's library plan exists (2: and a fallback, emit_matmul) */
    int *readers;      /* readers[id]: nodes of the training step that read node id */
    Kernel *kernels;
    int n_kernels, cap;
    char *buf;         /* the kernel body being written */
    size_t buf_size;
    int64_t at[RT_K_AT]; /* what its launch passes as its RtKAt, at[0..n_at) (at_slot) */
    int n_at;
    int *renum;        /* twin_key's numbering of the ids, one per node */
    unsigned char *vec; /* vec[id]: VEC_LOAD or VEC_STORE in the four-a-thread loop being written */
    int *vec_ids, n_vec; /* those ids, in the order the loop's operands and outputs come (plan_vec) */
} Cu;

/* ---- cuda.c */

/* Bytes from the base to node n's first element (views included). */
int64_t cu_dev_offset(const Cu *u, const IrNode *n);
/* Blocks of a grid-stride kernel over n elements: at most MAX_GRID. */
unsigned cu_grid_for(int64_t n);
/* Start a kernel in u->c; cu_kernel_close finishes it: written to the .cu file unless a twin
 * exists, and launched from the host step with `grid` blocks of `block` threads. */
void cu_kernel_open(Cu *u);
void cu_kernel_close(Cu *u, const char *name, unsigned grid, unsigned block, const char *what);
/* A layer-wise optimizer's blocks: the pieces of at most PIECE floats its trainable tensors are
 * cut into, each tensor on its own; *tensors the tensors. */
int64_t cu_layerwise_pieces(const IrGraph *g, int *tensors);
/* A kernel uses `bytes` of the partial-sum region: an internal error if the map has less. */
void cu_part_room(const Cu *u, int64_t bytes, const char *what);

/* ---- cuda_step.c: the step's bookkeeping, each a kernel or a few */

void cu_step_begin(Cu *u);               /* learning rate, dropout seed, the step's sums cleared */
void cu_step_end(Cu *u, int eval);       /* loss and accuracies into the sums, the non-finite check */
void cu_grads_ready(Cu *u, int position); /* the buckets final at `position`: mean over steps and ranks */
void cu_grads_sum(Cu *u);                /* the end of an accumulating batch, and the step's mean */
void cu_grad_copies(Cu *u);              /* gradients the plan placed elsewhere, into the buffer */
void cu_clip(Cu *u);                     /* clip_grad_norm's global norm and factor */
void cu_layerwise(Cu *u, int clip);      /* LAMB's and LARS's per-tensor trust ratios and update */
void cu_optimizer(Cu *u);                /* one update of the flat parameter buffer */

#endif
