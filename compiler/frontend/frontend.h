/* frontend.h - the front end's entry points: parse a .net file (ast.h: parse_file) and evaluate it
 * into the forward IR graph (sema_build). The front end depends on the IR, nothing later. */
#ifndef NETC_FRONTEND_H
#define NETC_FRONTEND_H

#include "ast.h"
#include "ir.h"

/* A -D NAME=VALUE override of a model constant. */
typedef struct SemaDefine {
    const char *name;
    const char *value; /* as written; parsed as an integer, a float, true or false */
    int used;          /* set by sema; an unused define is an error */
} SemaDefine;

/* sema.c: evaluate the program (constants, blocks, loops, conditionals), infer shapes and build
 * the forward graph with the loss, metrics and training recipe. Errors go through diag;
 * returns NULL if there were any. */
IrGraph *sema_build(Arena *arena, const AstProgram *prog, SemaDefine *defs, int n_defs);

#endif
