/* codegen.c - the order of a target's emit phases (see codegen.h). */
#include "codegen.h"

/* The phases in the order the trainer runs them: the step's computation, its update, the
 * evaluation pass; then the wrapper that names them. A target places each phase's text where
 * its files want it. */
int cg_emit(const CgBackend *t, const IrGraph *g, FILE *trainer, FILE *kernels) {
    CgEmit *e = t->emit_begin(g, trainer, kernels);
    t->emit_step(e);
    t->emit_optimizer(e);
    t->emit_eval(e);
    return t->emit_model(e);
}
