/* ast.h - the syntax tree of a .net file, exactly as written: no names resolved, no
 * constants folded, no blocks expanded. Semantic analysis (sema.c) walks it to build the IR.
 *
 * Every node carries the SrcLoc of its first token. All nodes live in the compilation Arena.
 */
#ifndef NETC_AST_H
#define NETC_AST_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"
#include "util.h"

typedef struct AstExpr AstExpr;
typedef struct AstStmt AstStmt;

typedef enum {
    AST_INT,     /* ival */
    AST_FLOAT,   /* fval */
    AST_BOOL,    /* ival: 0 or 1 */
    AST_STRING,  /* str (quotes removed, escapes \" \\ \n \t decoded) */
    AST_NAME,    /* name */
    AST_UNARY,   /* op: '-', '!' (the keyword `not`); operand in lhs */
    AST_BINARY,  /* op: one of AstBinOp; lhs, rhs */
    AST_CALL,    /* name(args): builtin layer, block call or cast */
    AST_LABELED, /* label: expr -- names the parameters the call creates (conv1: conv2d(...)) */
    AST_LIST,    /* [a, b, c]: shapes and string lists */
    AST_INDEX,   /* lhs[i, :, j]: items, a NULL item for ':' (the whole axis) */
    AST_RANGE,   /* lhs:rhs, an item of AST_INDEX; a side left out is NULL (a:, :b) */
    AST_ELLIPSIS, /* ..., an item of AST_INDEX: the axes the other items leave */
} AstExprKind;

typedef enum {
    BIN_ADD = '+', BIN_SUB = '-', BIN_MUL = '*', BIN_DIV = '/', BIN_MOD = '%',
    BIN_FLOORDIV = 256, /* // */
    BIN_POW,            /* ** */
    BIN_EQ, BIN_NE, BIN_LT, BIN_LE, BIN_GT, BIN_GE,
    BIN_AND, BIN_OR,
} AstBinOp;

typedef struct AstArg {
    const char *kw; /* keyword name, or NULL for a positional argument */
    AstExpr *value;
    SrcLoc loc;
} AstArg;

/* One segment of a label path such as layer1.{i}.conv1: either literal text (an identifier or
 * an integer) or an expression in braces evaluated at compile time. */
typedef struct AstLabelSeg {
    const char *text; /* non-NULL for a literal segment */
    AstExpr *expr;    /* non-NULL for a {expr} segment */
    SrcLoc loc;
} AstLabelSeg;

struct AstExpr {
    AstExprKind kind;
    SrcLoc loc;
    int64_t ival;
    double fval;
    const char *str;  /* AST_STRING */
    const char *name; /* AST_NAME, AST_CALL callee */
    int op;           /* AST_UNARY, AST_BINARY */
    AstExpr *lhs, *rhs;
    AstArg *args; /* AST_CALL */
    int n_args;
    AstLabelSeg *label; /* AST_LABELED: label segments; the labeled expression is lhs */
    int n_label;
    AstExpr **items; /* AST_LIST, AST_INDEX */
    int n_items;
};

typedef enum {
    STMT_MODEL,  /* model NAME: name */
    STMT_CONST,  /* const a = 1, b = 2: names/values, n */
    STMT_INPUT,  /* input NAME : DTYPE[dims]: name, dtype (+dtype_loc), dims/n_dims */
    STMT_ASSIGN, /* NAME = expr: name, value */
    STMT_BLOCK,  /* block NAME(params) { body }: name, params/defaults/n_params, body/n_body */
    STMT_RETURN, /* return expr: value */
    STMT_FOR,    /* for VAR in lo..hi { body }: name (loop variable), lo, hi, body */
    STMT_IF,     /* if cond { body } else { else_body }: value = cond */
    STMT_TRAIN,  /* train { key = expr ... }: body holds STMT_ASSIGN settings */
} AstStmtKind;

struct AstStmt {
    AstStmtKind kind;
    SrcLoc loc;
    const char *name;
    SrcLoc name_loc;
    AstExpr *value;
    /* STMT_CONST: n pairs; STMT_BLOCK: n parameters with optional defaults (NULL = none) */
    const char **names;
    SrcLoc *name_locs;
    AstExpr **values;
    int n;
    /* STMT_INPUT */
    const char *dtype;
    SrcLoc dtype_loc;
    AstExpr **dims;
    int n_dims;
    /* STMT_FOR */
    AstExpr *lo, *hi;
    /* STMT_BLOCK, STMT_FOR, STMT_IF (then), STMT_TRAIN */
    AstStmt **body;
    int n_body;
    AstStmt **else_body; /* STMT_IF; an `else if` is an else_body holding one STMT_IF */
    int n_else;
};

typedef struct AstProgram {
    const char *path;
    AstStmt **stmts;
    int n_stmts;
} AstProgram;

/* Parse a .net file. Syntax errors are reported through diag and counted; the returned tree
 * holds every statement that parsed (error recovery resumes at the next line). Returns NULL
 * only when the file cannot be read (reported through diag_fatal_noloc). */
AstProgram *parse_file(Arena *arena, const char *path);
/* Same, from a string (tests and fuzzers); `path` names it in messages. */
AstProgram *parse_string(Arena *arena, const char *path, const char *text);

/* --dump=ast: the tree as indented S-expressions, stable for golden tests. */
void ast_print(const AstProgram *prog, FILE *out);

/* Name of a binary operator as written ("+", "//", "and", ...). */
const char *ast_binop_name(int op);

#endif
