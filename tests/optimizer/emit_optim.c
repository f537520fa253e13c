/* emit_optim.c - write the CPU backend's trainer for a tiny graph whose optimizer is given on
 * the command line, so that its optimizer_step() can be run against torch.optim.
 *
 *   emit_optim OUT.c sgd MOMENTUM DAMPENING WEIGHT_DECAY NESTEROV
 *   emit_optim OUT.c adamw BETA1 BETA2 EPS WEIGHT_DECAY
 *   ... no_decay     (either, then) the 600-float parameter trained without weight decay
 *
 * The graph has two trainable parameters (600 and 30 floats) and one frozen one (10 floats),
 * so the update must cover exactly the first 630 floats of the flat buffer. With no_decay the
 * first parameter moves behind the second: 30 decayed floats, then 600 without decay.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "passes.h"

int main(int argc, char **argv) {
    if (argc != 7 && !(argc == 8 && strcmp(argv[7], "no_decay") == 0)) {
        fprintf(stderr, "usage: emit_optim OUT.c sgd|adamw A B C D [no_decay]\n");
        return 2;
    }
    SrcLoc loc = {"optim.net", 1, 1};
    Arena arena = {0};
    IrGraph *g = ir_graph_new(&arena);
    g->model_name = "optim";
    g->source_path = "optim.net";
    g->batch = 2;
    IrParam *w = ir_add_param(g, "w", ir_shape(2, (int64_t)20, (int64_t)30), INIT_NORMAL, 1, loc);
    IrParam *frozen = ir_add_param(g, "frozen", ir_shape(1, (int64_t)10), INIT_ONES, 0, loc);
    IrParam *b = ir_add_param(g, "b", ir_shape(1, (int64_t)30), INIT_ZEROS, 0, loc);
    frozen->trainable = 0;
    w->no_decay = argc == 8;
    IrNode *x = ir_add_input(g, "x", ir_shape(2, (int64_t)2, (int64_t)30), DT_F32, loc);
    IrNode *h = ir_add(g, OP_MATMUL, ir_shape(2, (int64_t)2, (int64_t)20), DT_F32, loc, 2, x, w->node);
    h->attr.trans_b = 1;
    IrNode *y = ir_add(g, OP_MUL, x->shape, DT_F32, loc, 2, x, b->node);
    IrNode *s = ir_add(g, OP_ADD, ir_scalar_shape(), DT_F32, loc, 2,
                       ir_add(g, OP_SUM, ir_scalar_shape(), DT_F32, loc, 1, h),
                       ir_add(g, OP_SUM, ir_scalar_shape(), DT_F32, loc, 1, y));
    g->loss = s;
    IrTrain *t = &g->train;
    if (strcmp(argv[2], "sgd") == 0) {
        t->optim = RT_OPTIM_SGD;
        t->hyper.momentum = atof(argv[3]);
        t->hyper.dampening = atof(argv[4]);
        t->hyper.weight_decay = atof(argv[5]);
        t->hyper.nesterov = atoi(argv[6]);
    } else {
        t->optim = RT_OPTIM_ADAMW;
        t->hyper.beta1 = atof(argv[3]);
        t->hyper.beta2 = atof(argv[4]);
        t->hyper.eps = atof(argv[5]);
        t->hyper.weight_decay = atof(argv[6]);
    }
    if (!ir_verify(g, "emit_optim") || ad_differentiate(g) != 0) return 1;
    mp_plan(g, cg_cpu.node_scratch, cg_cpu.in_place);
    FILE *f = fopen(argv[1], "w");
    if (!f) return perror(argv[1]), 1;
    int rc = cg_emit(&cg_cpu, g, f, NULL);
    if (fclose(f) != 0) rc = 1;
    arena_free(&arena);
    return rc;
}
