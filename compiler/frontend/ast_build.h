/* ast_build.h - the front end's private interface: the state the lexer and the parser share,
 * and the AST builders that the grammar actions call (one call per action, SQLite-style).
 *
 * Only lexer.l, parser.y and ast.c include this. Everything it allocates lives in the
 * compilation Arena; nothing here is ever freed by hand.
 */
#ifndef NETC_AST_BUILD_H
#define NETC_AST_BUILD_H

#include "ast.h"

/* Limits that keep hostile input from crashing or exhausting the compiler. */
enum {
    PARSE_MAX_FILE = 16 << 20,     /* bytes in one source file */
    PARSE_MAX_NEST = 256,          /* open ( [ { at one point */
    PARSE_MAX_EXPR_DEPTH = 1000,   /* levels in one expression tree (a+a+a+... is deep) */
    PARSE_MAX_NODES = 1 << 20,     /* expressions + statements in one file */
};

/* Growable arrays in the Arena (doubling; the old copies are simply abandoned). */
typedef struct ExprList { AstExpr **items; int n, cap; } ExprList;
typedef struct ArgList { AstArg *items; int n, cap; } ArgList;
typedef struct StmtList { AstStmt **items; int n, cap; } StmtList;
typedef struct LabelList { AstLabelSeg *items; int n, cap; } LabelList;
/* `a = 1, b` pairs: const definitions and block parameters (value NULL = no default). */
typedef struct PairList { const char **names; SrcLoc *locs; AstExpr **values; int n, cap; } PairList;

/* A literal token's value: its source text and, for numbers, what it means. */
typedef struct Token {
    const char *text;
    int64_t ival;
    double fval;
} Token;

/* The innermost open bracket, as the lexer tracks it. */
typedef struct OpenBracket {
    char kind;  /* '(', '[' or '{'; 0 = none */
    bool index; /* a '[' after a value: an index, whose ':' is a range's, not a label's */
    SrcLoc loc;
} OpenBracket;

/* State shared by the lexer (as yyextra) and the parser (as a %parse-param). */
typedef struct Parser {
    Arena *arena;
    const char *path; /* interned by diag_add_source */
    const char *text; /* the source, NUL-terminated */
    StmtList *top;    /* top-level statements parsed so far */
    long n_nodes;
    bool stopped;     /* a hard limit was hit: the lexer now returns end of file */
    bool recovering;  /* between a syntax error and the newline where parsing resumes */

    /* lexer position: where the next byte is */
    int line, col;
    OpenBracket open[PARSE_MAX_NEST];
    int depth;
    bool pending_nl; /* a significant newline was seen; emitted before the next token */
    bool eof_nl;     /* the last NEWLINE was made up at the end of the file, not read */
    SrcLoc nl_loc;

    /* the last token returned (the parser's lookahead when it reports an error) */
    int last_kind, prev_kind;   /* token kinds; 0 = none yet */
    SrcLoc prev_end;            /* just past the token before the lookahead */
    SrcLoc last_end;            /* just past the lookahead */
    bool nl_skipped;            /* a newline inside ( ) or [ ] preceded the lookahead */
    bool skipping_nl;           /* such a newline was seen since the last token */
    OpenBracket open_before;    /* innermost open bracket before the lookahead was read */
    const char *last_text;      /* the lookahead's text (identifiers, numbers, strings) */
} Parser;

/* ---- lexer helpers (lexer.l) */
/* After a syntax error: forget ( and [ left open on the broken line, so newlines count again. */
void lex_recover(Parser *P);

/* ---- builders (ast.c). A NULL list argument means an empty list; the *_add functions
 * start a new list when given NULL. */
void ast_add_top(Parser *P, AstStmt *s);
/* Parsing resumes after a syntax error: the lexer counts newlines inside brackets again. */
StmtList *ast_recovered(Parser *P, StmtList *l);

StmtList *ast_stmts_add(Parser *P, StmtList *l, AstStmt *s);

AstStmt *ast_stmt_model(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc);
AstStmt *ast_stmt_const(Parser *P, SrcLoc loc, PairList *defs);
AstStmt *ast_stmt_input(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc,
                        const char *dtype, SrcLoc dtype_loc, ExprList *dims);
AstStmt *ast_stmt_assign(Parser *P, const char *name, SrcLoc name_loc, AstExpr *value);
AstStmt *ast_stmt_return(Parser *P, SrcLoc loc, AstExpr *value);
AstStmt *ast_stmt_block(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc,
                        PairList *params, StmtList *body);
AstStmt *ast_stmt_for(Parser *P, SrcLoc loc, const char *var, SrcLoc var_loc, AstExpr *lo,
                      AstExpr *hi, StmtList *body);
AstStmt *ast_stmt_if(Parser *P, SrcLoc loc, AstExpr *cond, StmtList *then, StmtList *els);
/* if cond { then } else if ...: the else branch holds the one nested if statement */
AstStmt *ast_stmt_elif(Parser *P, SrcLoc loc, AstExpr *cond, StmtList *then, AstStmt *nested);
AstStmt *ast_stmt_train(Parser *P, SrcLoc loc, StmtList *body);

PairList *ast_pairs_add(Parser *P, PairList *l, const char *name, SrcLoc loc, AstExpr *value);

AstExpr *ast_int(Parser *P, SrcLoc loc, Token t);
AstExpr *ast_float(Parser *P, SrcLoc loc, Token t);
AstExpr *ast_bool(Parser *P, SrcLoc loc, int value);
AstExpr *ast_string(Parser *P, SrcLoc loc, Token t);
AstExpr *ast_name(Parser *P, SrcLoc loc, const char *name);
AstExpr *ast_unary(Parser *P, SrcLoc loc, int op, AstExpr *operand);
AstExpr *ast_binary(Parser *P, int op, AstExpr *lhs, AstExpr *rhs);
AstExpr *ast_call(Parser *P, SrcLoc loc, const char *name, ArgList *args);
AstExpr *ast_list(Parser *P, SrcLoc loc, ExprList *items);
/* base[items]: an item NULL stands for ':' */
AstExpr *ast_index(Parser *P, AstExpr *base, ExprList *items);
AstExpr *ast_range(Parser *P, SrcLoc loc, AstExpr *start, AstExpr *end);
AstExpr *ast_ellipsis(Parser *P, SrcLoc loc);
AstExpr *ast_labeled(Parser *P, LabelList *label, AstExpr *target);

ExprList *ast_exprs_add(Parser *P, ExprList *l, AstExpr *e);
ArgList *ast_args_add(Parser *P, ArgList *l, const char *kw, SrcLoc loc, AstExpr *value);

LabelList *ast_label_text(Parser *P, LabelList *l, SrcLoc loc, const char *text);
LabelList *ast_label_number(Parser *P, LabelList *l, SrcLoc loc, Token t, bool is_float);
LabelList *ast_label_expr(Parser *P, LabelList *l, SrcLoc loc, AstExpr *e);

#endif
