/* codegen.h - targets. A target is a table of functions filled with designated initialisers (as
 * QBE's targets are), one per phase, so the driver names none. This half of a target, CgBackend,
 * is what the pipeline needs: the flags and the scratch sizes that steer the passes, the
 * precisions it computes in, and the emit phases. Each emitter reads a planned IrGraph (memplan
 * has run) and writes one self-contained C translation unit that defines the model's RtModel
 * and main(), to be compiled and linked with the target's runtime; a target with kernels also
 * writes their source. How those files become a trainer (the runtime folder and libraries, the
 * kernel compiler, the link line) is the toolchain half, which only netc links:
 * compiler/driver/toolchain.h's Target, which points at its CgBackend.
 */
#ifndef NETC_CODEGEN_H
#define NETC_CODEGEN_H

#include <stdint.h>
#include <stdio.h>

#include "ir.h"

/* The arithmetic of matrix products and convolutions (--precision); a target lists the ones
 * it implements as a mask of (1 << CgPrecision). */
typedef enum {
    CG_FP32, /* float32 throughout (the default; no TF32) */
    CG_TF32, /* TF32 tensor cores for products and convolutions */
    CG_BF16, /* products and convolutions in bf16, float32 master weights */
    CG_FP16, /* products and convolutions in fp16, float32 master weights, dynamic loss scaling */
} CgPrecision;

/* A target's state while it emits one graph; each target defines it in its own file. */
typedef struct CgEmit CgEmit;

typedef struct CgBackend {
    const char *name;        /* --backend NAME */
    const char *description;
    unsigned precisions;        /* (1 << CgPrecision) for each precision it implements */
    const char *precision_note; /* why it has no other (the --precision error); NULL if it has all */
    int fuse_reductions; /* the emitter accumulates batch-norm sums inside element-wise loops */
    int krsc_filters;    /* channels-last convolutions take filters channels-last (layout_select) */
    int has_kernels;     /* it writes device kernels' source (NAME.cu, --dump=cu) beside the host C */
    int compacts_rows;   /* it runs row_order, row_compact and matmul_rows (skip_ignored_rows) */
    /* Floats of per-thread host scratch the target's kernel for node n needs (mp_plan sizes
     * RtModel.scratch_per_thread with it), or NULL when its kernels need none. */
    int64_t (*node_scratch)(const IrNode *n);
    /* The operand of node n whose buffer the target's kernel may write n's result over, each
     * element read before it is written (mp_plan then lets them share it), or -1; NULL: none. */
    int (*in_place)(const IrNode *n);

    /* The emit phases, called by cg_emit in this order. begin writes the files' headers and
     * the model description to `trainer` (the host C) and `kernels` (the kernels' source; NULL
     * for a target without them). A target with kernels takes either as NULL and then writes
     * nothing there, so that each file can be written on its own. */
    CgEmit *(*emit_begin)(const IrGraph *g, FILE *trainer, FILE *kernels);
    void (*emit_step)(CgEmit *e);      /* the training step's computation: forward and backward */
    void (*emit_optimizer)(CgEmit *e); /* its update of every trainable parameter */
    void (*emit_eval)(CgEmit *e);      /* the forward pass in evaluation mode */
    /* The wrapper: the RtModel naming the phases, and main(). Frees e; returns 0, or 1 when
     * writing failed. */
    int (*emit_model)(CgEmit *e);
} CgBackend;

extern const CgBackend cg_cpu;
extern const CgBackend cg_cuda;

/* Run t's emit phases over the planned graph g: the trainer's C to `trainer`, the kernels'
 * source to `kernels` (NULL for a target without them; either NULL for one with them).
 * Returns 0, or 1 when writing failed. */
int cg_emit(const CgBackend *t, const IrGraph *g, FILE *trainer, FILE *kernels);

#endif
