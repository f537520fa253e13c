/* codegen.h - backends. A backend is a table of functions filled with designated initialisers
 * (as QBE's targets are); main.c picks one by name. Each emitter reads a planned IrGraph
 * (memplan has run) and writes one self-contained C translation unit that defines the model's
 * RtModel and main(), to be compiled and linked with libnetrt; a device backend also writes the
 * kernels' source, which the driver compiles (nvrtc.c) and links in.
 */
#ifndef NETC_CODEGEN_H
#define NETC_CODEGEN_H

#include <stdint.h>
#include <stdio.h>

#include "ir.h"

typedef struct CgBackend {
    const char *name;        /* --backend NAME */
    const char *description;
    /* Write the trainer's C source for a planned graph. Returns 0 on success. */
    int (*emit)(const IrGraph *g, FILE *out);
    /* Write the device kernels' source (CUDA C), or NULL for a backend without them. */
    int (*emit_kernels)(const IrGraph *g, FILE *out);
    int fuse_reductions; /* the emitter accumulates batch-norm sums inside element-wise loops */
    int krsc_filters;    /* channels-last convolutions take filters channels-last (layout_select) */
    /* Floats of per-thread host scratch the target's kernel for node n needs (mp_plan sizes
     * RtModel.scratch_per_thread with it), or NULL when its kernels need none. */
    int64_t (*node_scratch)(const IrNode *n);
} CgBackend;

extern const CgBackend cg_cpu;
extern const CgBackend cg_cuda;

#endif
