/* sema.h - internal interface between the evaluator (sema.c), the built-in layers
 * (sema_builtins.c) and the train section (sema_train.c). The public entry point is sema_build()
 * in frontend.h. */
#ifndef NETC_SEMA_H
#define NETC_SEMA_H

#include <errno.h>

#include "ast.h"
#include "ir.h"
#include "frontend.h"

enum {
    SEMA_MAX_DEPTH = 64,            /* nested block calls */
    SEMA_MAX_ITERATIONS = 1000000,  /* loop iterations over the whole compilation */
    SEMA_MAX_NODES = 2000000,       /* IR operations */
    SEMA_MAX_PARAMS = 10000,        /* parameter tensors (each new one is looked up linearly) */
    SEMA_MAX_ARGS = 12,             /* parameters of any built-in */
};

typedef enum {
    V_ERR,    /* an error was reported; consumers stay silent */
    V_NONE,   /* no value (unset argument, no return yet) */
    V_INT,    /* i */
    V_FLOAT,  /* f */
    V_BOOL,   /* i: 0 or 1 */
    V_STR,    /* s */
    V_TENSOR, /* t */
    V_LIST,   /* items, n */
} VKind;

typedef struct Value {
    VKind k;
    int64_t i;
    double f;
    const char *s;
    IrNode *t;
    struct Value *items;
    int n;
    const SemaDefine *define; /* the -D this value came from, for errors; NULL if none */
} Value;

typedef struct Env {
    StrMap vars;        /* name -> Value * */
    struct Env *parent; /* a block's locals see the top level; the top level has none */
} Env;

typedef struct Sema {
    Arena *arena;
    IrGraph *g;
    const AstProgram *prog;
    SemaDefine *defs;
    int n_defs;
    Env *global;
    StrMap blocks;      /* name -> its block statement */
    const char *prefix; /* parameter name prefix in force ("" at the top) */
    StrMap counters;    /* automatic layer names: "prefix/base" -> int * next number */
    int depth, in_block, seen_train, too_big;
    int errors_before_train; /* errors reported before the train section: layers may be missing */
    int64_t iterations;
    Value ret; /* the return value of the block being run; V_NONE until `return` */
    IrNode *named_output; /* train { output = x }: the value --predict writes instead of the loss's */
} Sema;

struct SemaBuiltin;
typedef Value (*SemaBuiltinFn)(Sema *S, const AstExpr *call, const char *label, Value *args);

typedef struct SemaBuiltin {
    const char *name;
    const char *signature; /* for hints: "x, out, bias=true" */
    SemaBuiltinFn fn;
    int n_required;
    int n_params;
    const char *params[SEMA_MAX_ARGS];
} SemaBuiltin;

/* sema.c */
Value sema_eval(Sema *S, Env *env, const AstExpr *e);
Value sema_call(Sema *S, Env *env, const AstExpr *call, const char *label);
void sema_exec_body(Sema *S, Env *env, AstStmt *const *body, int n);
int sema_bind_args(Sema *S, Env *env, const AstExpr *call, const char *const *names, int n,
                   Value *out);
Value sema_tensor_binop(Sema *S, int op, Value a, Value b, SrcLoc loc);
/* sema_composed.c: x ** p, a float tensor to the power of a number */
Value sema_tensor_pow(Sema *S, Value base, Value power, SrcLoc loc);
IrNode *sema_node(Sema *S, IrOp op, IrShape shape, IrDtype dt, SrcLoc loc, int n_in, IrNode *a,
                  IrNode *b, IrNode *c);
int sema_check_shape(Sema *S, const IrShape *s, SrcLoc loc);
int sema_want_float_tensor(Sema *S, Value v, SrcLoc loc, const char *what);
int sema_want_bool(Sema *S, Value v, SrcLoc loc);
const char *sema_layer_name(Sema *S, const char *label, const char *base);
const char *sema_shape_str(Sema *S, const IrShape *s);
const char *sema_value_desc(Sema *S, Value v);
const char *sema_value_text(Sema *S, Value v);
void sema_suggest_hint(const Suggest *s);
SemaDefine *sema_find_define(Sema *S, const char *name);
Value sema_parse_define(Sema *S, SemaDefine *d);
Value sema_error(void);
Value sema_int(int64_t i);
Value sema_float(double f);
Value sema_tensor(IrNode *t);
double sema_num(Value v);

/* sema_builtins.c */
const SemaBuiltin *sema_find_builtin(const char *name);
void sema_suggest_builtin(Suggest *s);
/* sema_train.c */
void sema_train(Sema *S, const AstStmt *train);
/* sema_lora.c: the train setting `lora = lora(...)`, and its adapters once the program is built */
void sema_train_lora(Sema *S, const AstStmt *s);
void sema_lora_apply(Sema *S);
int sema_axis(Sema *S, Value v, SrcLoc loc, const char *what, const IrShape *shape);
/* x with its axes permuted (output axis i is x's axis perm[i]); perm has IR_MAX_RANK entries */
IrNode *sema_permute(Sema *S, IrNode *x, const int *perm, SrcLoc loc);
IrNode *sema_slice(Sema *S, IrNode *x, int axis, int64_t start, int64_t len, SrcLoc loc);
IrNode *sema_concat(Sema *S, IrNode *a, IrNode *b, int axis, SrcLoc loc);
IrNode *sema_reshape(Sema *S, IrNode *x, IrShape shape, SrcLoc loc);
IrNode *sema_matmul(Sema *S, IrNode *a, IrNode *b, SrcLoc loc);

#endif
