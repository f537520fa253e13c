/* ast.c - building the syntax tree (called from the grammar actions in parser.y), the parse
 * entry points, and the --dump=ast printer.
 *
 * Builders allocate everything from the compilation Arena. They also enforce the limits that
 * keep hostile input harmless: the depth of an expression tree (a+a+a+... needs no brackets to
 * get deep, and later stages recurse over it) and the number of nodes in a file.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ast.h"
#include "ast_build.h"
#include "parser.h"
#include "lexer.h"

/* ---- arena arrays */

/* Room for one more element in an arena array of n elements; doubles the capacity. */
static void *grow(Parser *P, void *items, int n, int *cap, size_t size) {
    if (n < *cap) return items;
    int ncap = *cap ? 2 * *cap : 4;
    void *p = arena_alloc(P->arena, (size_t)ncap * size);
    if (n) memcpy(p, items, (size_t)n * size);
    *cap = ncap;
    return p;
}

#define NEW_LIST(P, l) ((l) ? (l) : arena_alloc((P)->arena, sizeof *(l)))

/* Counts a node against PARSE_MAX_NODES; the lexer stops at the next token once it is hit. */
static void count_node(Parser *P, SrcLoc loc) {
    if (++P->n_nodes <= PARSE_MAX_NODES || P->stopped) return;
    diag_error(loc, "file too large to compile (more than %d expressions and statements)",
               PARSE_MAX_NODES);
    P->stopped = true;
}

/* ---- expressions */

/* Every expression is allocated inside an ExprNode, so a builder can read the depth of the
 * subtrees it is given without walking them. */
typedef struct ExprNode {
    AstExpr e;
    int depth;
} ExprNode;

static int depth_of(const AstExpr *e) { return e ? ((const ExprNode *)e)->depth : 0; }

static AstExpr *new_expr(Parser *P, AstExprKind kind, SrcLoc loc, int child_depth) {
    count_node(P, loc);
    ExprNode *n = arena_alloc(P->arena, sizeof *n);
    n->e.kind = kind;
    n->e.loc = loc;
    n->depth = child_depth + 1;
    if (n->depth > PARSE_MAX_EXPR_DEPTH && !P->stopped) {
        diag_error(loc, "expression too deeply nested (more than %d levels)",
                   PARSE_MAX_EXPR_DEPTH);
        diag_hint("split it into several statements");
        P->stopped = true;
    }
    return &n->e;
}

static int max_int(int a, int b) { return a > b ? a : b; }

AstExpr *ast_int(Parser *P, SrcLoc loc, Token t) {
    AstExpr *e = new_expr(P, AST_INT, loc, 0);
    e->ival = t.ival;
    return e;
}

AstExpr *ast_float(Parser *P, SrcLoc loc, Token t) {
    AstExpr *e = new_expr(P, AST_FLOAT, loc, 0);
    e->fval = t.fval;
    return e;
}

AstExpr *ast_bool(Parser *P, SrcLoc loc, int value) {
    AstExpr *e = new_expr(P, AST_BOOL, loc, 0);
    e->ival = value;
    return e;
}

AstExpr *ast_string(Parser *P, SrcLoc loc, Token t) {
    AstExpr *e = new_expr(P, AST_STRING, loc, 0);
    e->str = t.text;
    return e;
}

AstExpr *ast_name(Parser *P, SrcLoc loc, const char *name) {
    AstExpr *e = new_expr(P, AST_NAME, loc, 0);
    e->name = name;
    return e;
}

AstExpr *ast_unary(Parser *P, SrcLoc loc, int op, AstExpr *operand) {
    AstExpr *e = new_expr(P, AST_UNARY, loc, depth_of(operand));
    e->op = op;
    e->lhs = operand;
    return e;
}

/* A binary node is located at its left operand's first token, like every node. */
AstExpr *ast_binary(Parser *P, int op, AstExpr *lhs, AstExpr *rhs) {
    AstExpr *e = new_expr(P, AST_BINARY, lhs->loc, max_int(depth_of(lhs), depth_of(rhs)));
    e->op = op;
    e->lhs = lhs;
    e->rhs = rhs;
    return e;
}

/* name(args): positional arguments come first; a positional one after a keyword one is an
 * error here, so sema can bind arguments without re-checking the order. */
AstExpr *ast_call(Parser *P, SrcLoc loc, const char *name, ArgList *args) {
    int depth = 0, n = args ? args->n : 0;
    const AstArg *kw = NULL;
    for (int i = 0; i < n; i++) {
        const AstArg *a = &args->items[i];
        depth = max_int(depth, depth_of(a->value));
        if (a->kw && !kw) kw = a;
        if (!a->kw && kw) {
            diag_error(a->loc, "positional argument follows keyword argument '%s'", kw->kw);
            diag_hint("pass positional arguments first, e.g. conv2d(x, 6, k=5)");
            kw = NULL; /* one message per run of misplaced arguments */
        }
    }
    AstExpr *e = new_expr(P, AST_CALL, loc, depth);
    e->name = name;
    e->args = n ? args->items : NULL;
    e->n_args = n;
    return e;
}

AstExpr *ast_list(Parser *P, SrcLoc loc, ExprList *items) {
    int depth = 0, n = items ? items->n : 0;
    for (int i = 0; i < n; i++) depth = max_int(depth, depth_of(items->items[i]));
    AstExpr *e = new_expr(P, AST_LIST, loc, depth);
    e->items = n ? items->items : NULL;
    e->n_items = n;
    return e;
}

AstExpr *ast_index(Parser *P, AstExpr *base, ExprList *items) {
    int depth = depth_of(base);
    for (int i = 0; i < items->n; i++) depth = max_int(depth, depth_of(items->items[i]));
    AstExpr *e = new_expr(P, AST_INDEX, base->loc, depth);
    e->lhs = base;
    e->items = items->items;
    e->n_items = items->n;
    return e;
}

/* a:b inside an index, located at its ':'; either side may be NULL. */
AstExpr *ast_range(Parser *P, SrcLoc loc, AstExpr *start, AstExpr *end) {
    AstExpr *e = new_expr(P, AST_RANGE, loc, max_int(depth_of(start), depth_of(end)));
    e->lhs = start;
    e->rhs = end;
    return e;
}

AstExpr *ast_ellipsis(Parser *P, SrcLoc loc) { return new_expr(P, AST_ELLIPSIS, loc, 0); }

AstExpr *ast_labeled(Parser *P, LabelList *label, AstExpr *target) {
    int depth = depth_of(target);
    for (int i = 0; i < label->n; i++) depth = max_int(depth, depth_of(label->items[i].expr));
    AstExpr *e = new_expr(P, AST_LABELED, label->items[0].loc, depth);
    e->label = label->items;
    e->n_label = label->n;
    e->lhs = target;
    return e;
}

ExprList *ast_exprs_add(Parser *P, ExprList *l, AstExpr *e) {
    l = NEW_LIST(P, l);
    l->items = grow(P, l->items, l->n, &l->cap, sizeof *l->items);
    l->items[l->n++] = e;
    return l;
}

ArgList *ast_args_add(Parser *P, ArgList *l, const char *kw, SrcLoc loc, AstExpr *value) {
    l = NEW_LIST(P, l);
    l->items = grow(P, l->items, l->n, &l->cap, sizeof *l->items);
    l->items[l->n++] = (AstArg){kw, value, loc};
    return l;
}

/* ---- labels */

static LabelList *label_add(Parser *P, LabelList *l, AstLabelSeg seg) {
    l = NEW_LIST(P, l);
    l->items = grow(P, l->items, l->n, &l->cap, sizeof *l->items);
    l->items[l->n++] = seg;
    return l;
}

LabelList *ast_label_text(Parser *P, LabelList *l, SrcLoc loc, const char *text) {
    return label_add(P, l, (AstLabelSeg){text, NULL, loc});
}

LabelList *ast_label_expr(Parser *P, LabelList *l, SrcLoc loc, AstExpr *e) {
    return label_add(P, l, (AstLabelSeg){NULL, e, loc});
}

static bool all_digits(const char *s, size_t n) {
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* An integer segment, or a number the lexer read from `layer2.0.1`: "0.1" is two segments. */
LabelList *ast_label_number(Parser *P, LabelList *l, SrcLoc loc, Token t, bool is_float) {
    if (!is_float) return ast_label_text(P, l, loc, t.text);
    const char *dot = strchr(t.text, '.');
    size_t len = strlen(t.text);
    if (dot && all_digits(t.text, (size_t)(dot - t.text)) && all_digits(dot + 1, strlen(dot + 1))) {
        int left = (int)(dot - t.text);
        l = ast_label_text(P, l, loc, arena_strndup(P->arena, t.text, (size_t)left));
        SrcLoc right = {loc.file, loc.line, loc.col + left + 1};
        return ast_label_text(P, l, right, arena_strdup(P->arena, dot + 1));
    }
    diag_error(loc, "'%.*s' cannot be part of a label", len > 40 ? 40 : (int)len, t.text);
    diag_hint("label segments are names, integers or {expressions}: layer1.{i}.conv");
    return ast_label_text(P, l, loc, t.text);
}

/* ---- statements */

static AstStmt *new_stmt(Parser *P, AstStmtKind kind, SrcLoc loc) {
    count_node(P, loc);
    AstStmt *s = arena_alloc(P->arena, sizeof *s);
    s->kind = kind;
    s->loc = loc;
    return s;
}

static void set_body(AstStmt *s, StmtList *body) {
    s->body = body ? body->items : NULL;
    s->n_body = body ? body->n : 0;
}

StmtList *ast_stmts_add(Parser *P, StmtList *l, AstStmt *s) {
    l = NEW_LIST(P, l);
    l->items = grow(P, l->items, l->n, &l->cap, sizeof *l->items);
    l->items[l->n++] = s;
    return l;
}

void ast_add_top(Parser *P, AstStmt *s) { P->top = ast_stmts_add(P, P->top, s); }

StmtList *ast_recovered(Parser *P, StmtList *l) {
    P->recovering = false;
    return l;
}

PairList *ast_pairs_add(Parser *P, PairList *l, const char *name, SrcLoc loc, AstExpr *value) {
    l = NEW_LIST(P, l);
    int cap = l->cap;
    l->names = grow(P, l->names, l->n, &cap, sizeof *l->names);
    cap = l->cap;
    l->locs = grow(P, l->locs, l->n, &cap, sizeof *l->locs);
    l->values = grow(P, l->values, l->n, &l->cap, sizeof *l->values);
    l->names[l->n] = name;
    l->locs[l->n] = loc;
    l->values[l->n++] = value;
    return l;
}

static void set_pairs(AstStmt *s, PairList *l) {
    if (!l) return;
    s->names = l->names;
    s->name_locs = l->locs;
    s->values = l->values;
    s->n = l->n;
}

AstStmt *ast_stmt_model(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc) {
    AstStmt *s = new_stmt(P, STMT_MODEL, loc);
    s->name = name;
    s->name_loc = name_loc;
    return s;
}

AstStmt *ast_stmt_const(Parser *P, SrcLoc loc, PairList *defs) {
    AstStmt *s = new_stmt(P, STMT_CONST, loc);
    set_pairs(s, defs);
    return s;
}

AstStmt *ast_stmt_input(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc,
                        const char *dtype, SrcLoc dtype_loc, ExprList *dims) {
    AstStmt *s = new_stmt(P, STMT_INPUT, loc);
    s->name = name;
    s->name_loc = name_loc;
    s->dtype = dtype;
    s->dtype_loc = dtype_loc;
    s->dims = dims ? dims->items : NULL;
    s->n_dims = dims ? dims->n : 0;
    return s;
}

AstStmt *ast_stmt_assign(Parser *P, const char *name, SrcLoc name_loc, AstExpr *value) {
    AstStmt *s = new_stmt(P, STMT_ASSIGN, name_loc);
    s->name = name;
    s->name_loc = name_loc;
    s->value = value;
    return s;
}

AstStmt *ast_stmt_return(Parser *P, SrcLoc loc, AstExpr *value) {
    AstStmt *s = new_stmt(P, STMT_RETURN, loc);
    s->value = value;
    return s;
}

AstStmt *ast_stmt_block(Parser *P, SrcLoc loc, const char *name, SrcLoc name_loc,
                        PairList *params, StmtList *body) {
    AstStmt *s = new_stmt(P, STMT_BLOCK, loc);
    s->name = name;
    s->name_loc = name_loc;
    set_pairs(s, params);
    set_body(s, body);
    return s;
}

AstStmt *ast_stmt_for(Parser *P, SrcLoc loc, const char *var, SrcLoc var_loc, AstExpr *lo,
                      AstExpr *hi, StmtList *body) {
    AstStmt *s = new_stmt(P, STMT_FOR, loc);
    s->name = var;
    s->name_loc = var_loc;
    s->lo = lo;
    s->hi = hi;
    set_body(s, body);
    return s;
}

AstStmt *ast_stmt_if(Parser *P, SrcLoc loc, AstExpr *cond, StmtList *then, StmtList *els) {
    AstStmt *s = new_stmt(P, STMT_IF, loc);
    s->value = cond;
    set_body(s, then);
    s->else_body = els ? els->items : NULL;
    s->n_else = els ? els->n : 0;
    return s;
}

AstStmt *ast_stmt_elif(Parser *P, SrcLoc loc, AstExpr *cond, StmtList *then, AstStmt *nested) {
    return ast_stmt_if(P, loc, cond, then, ast_stmts_add(P, NULL, nested));
}

AstStmt *ast_stmt_train(Parser *P, SrcLoc loc, StmtList *body) {
    AstStmt *s = new_stmt(P, STMT_TRAIN, loc);
    set_body(s, body);
    return s;
}

/* ---- entry points */

/* Parses text[0..len) (NUL-terminated, in the arena, registered with diag). */
static AstProgram *parse_text(Arena *arena, const char *path, const char *text, size_t len) {
    Parser P = {.arena = arena, .path = path, .text = text, .line = 1, .col = 1};
    AstProgram *prog = arena_alloc(arena, sizeof *prog);
    prog->path = path;
    const char *nul = memchr(text, 0, len);
    if (nul) {
        int line = 1, col = 1;
        for (const char *p = text; p < nul; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        diag_error((SrcLoc){path, line, col}, "the file contains a NUL byte");
        diag_hint("is it a text file?");
        return prog;
    }
    yyscan_t scanner;
    if (yylex_init_extra(&P, &scanner)) ICE("cannot start the lexer: %s", strerror(errno));
    yy_scan_bytes(text, (int)len, scanner);
    yyparse(scanner, &P);
    yylex_destroy(scanner);
    if (P.top) {
        prog->stmts = P.top->items;
        prog->n_stmts = P.top->n;
    }
    return prog;
}

AstProgram *parse_string(Arena *arena, const char *path, const char *text) {
    size_t len = strlen(text);
    char *copy = arena_strndup(arena, text, len);
    return parse_text(arena, diag_add_source(path, copy), copy, len);
}

AstProgram *parse_file(Arena *arena, const char *path) {
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
        diag_fatal_noloc("%s: is a directory, not a .net file", path);
        return NULL;
    }
    size_t len = 0;
    char *heap = NULL;
    if (exists && st.st_size > PARSE_MAX_FILE) errno = EFBIG;
    else heap = read_file(path, PARSE_MAX_FILE, &len);
    if (!heap) {
        if (errno == EFBIG)
            diag_fatal_noloc("%s: file too large (more than %d MiB)", path, PARSE_MAX_FILE >> 20);
        else
            diag_fatal_noloc("cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = arena_alloc(arena, len + 1);
    memcpy(text, heap, len + 1);
    free(heap);
    return parse_text(arena, diag_add_source(path, text), text, len);
}

/* ---- printing (--dump=ast) */

const char *ast_binop_name(int op) {
    switch (op) {
    case BIN_ADD: return "+";
    case BIN_SUB: return "-";
    case BIN_MUL: return "*";
    case BIN_DIV: return "/";
    case BIN_MOD: return "%";
    case BIN_FLOORDIV: return "//";
    case BIN_POW: return "**";
    case BIN_EQ: return "==";
    case BIN_NE: return "!=";
    case BIN_LT: return "<";
    case BIN_LE: return "<=";
    case BIN_GT: return ">";
    case BIN_GE: return ">=";
    case BIN_AND: return "and";
    case BIN_OR: return "or";
    default: return "?";
    }
}

/* The shortest text that reads back as the same double, always with a '.' or an exponent. */
static void print_float(double v, FILE *out) {
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    bool looks_float = strpbrk(buf, ".eEn") != NULL; /* n: inf, nan */
    fprintf(out, "%s%s", buf, looks_float ? "" : ".0");
}

static void print_string(const char *s, FILE *out) {
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c < ' ' || c == 127) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

static void print_expr(const AstExpr *e, FILE *out);

static void print_label(const AstExpr *e, FILE *out) {
    for (int i = 0; i < e->n_label; i++) {
        if (i) fputc('.', out);
        if (e->label[i].text) {
            fputs(e->label[i].text, out);
        } else {
            fputc('{', out);
            print_expr(e->label[i].expr, out);
            fputc('}', out);
        }
    }
}

static void print_expr(const AstExpr *e, FILE *out) {
    switch (e->kind) {
    case AST_INT: fprintf(out, "%lld", (long long)e->ival); return;
    case AST_FLOAT: print_float(e->fval, out); return;
    case AST_BOOL: fputs(e->ival ? "true" : "false", out); return;
    case AST_STRING: print_string(e->str, out); return;
    case AST_NAME: fputs(e->name, out); return;
    case AST_UNARY:
        fprintf(out, "(%s ", e->op == '!' ? "not" : "-");
        print_expr(e->lhs, out);
        fputc(')', out);
        return;
    case AST_BINARY:
        fprintf(out, "(%s ", ast_binop_name(e->op));
        print_expr(e->lhs, out);
        fputc(' ', out);
        print_expr(e->rhs, out);
        fputc(')', out);
        return;
    case AST_CALL:
        fprintf(out, "(call %s", e->name);
        for (int i = 0; i < e->n_args; i++) {
            fputc(' ', out);
            if (e->args[i].kw) fprintf(out, "%s=", e->args[i].kw);
            print_expr(e->args[i].value, out);
        }
        fputc(')', out);
        return;
    case AST_LABELED:
        fputs("(label ", out);
        print_label(e, out);
        fputc(' ', out);
        print_expr(e->lhs, out);
        fputc(')', out);
        return;
    case AST_LIST:
        fputc('[', out);
        for (int i = 0; i < e->n_items; i++) {
            if (i) fputc(' ', out);
            print_expr(e->items[i], out);
        }
        fputc(']', out);
        return;
    case AST_INDEX:
        fputs("(index ", out);
        print_expr(e->lhs, out);
        for (int i = 0; i < e->n_items; i++) {
            fputc(' ', out);
            if (e->items[i]) print_expr(e->items[i], out);
            else fputc(':', out);
        }
        fputc(')', out);
        return;
    case AST_ELLIPSIS: fputs("...", out); return;
    case AST_RANGE:
        fputs("(range ", out);
        if (e->lhs) print_expr(e->lhs, out);
        fputc(':', out);
        if (e->rhs) print_expr(e->rhs, out);
        fputc(')', out);
        return;
    }
    ICE("unknown expression kind %d", (int)e->kind);
}

static void print_stmt(const AstStmt *s, int indent, FILE *out);

/* Each statement of a body on its own line, indented; the caller closes the parenthesis. */
static void print_body(AstStmt *const *body, int n, int indent, FILE *out) {
    for (int i = 0; i < n; i++) {
        fprintf(out, "\n%*s", indent, "");
        print_stmt(body[i], indent, out);
    }
}

static void print_pairs(const AstStmt *s, const char *kv_sep, FILE *out) {
    for (int i = 0; i < s->n; i++) {
        fprintf(out, "%s%s", i ? " " : "", s->names[i]);
        if (s->values[i]) {
            fputs(kv_sep, out);
            print_expr(s->values[i], out);
        }
    }
}

static void print_stmt(const AstStmt *s, int indent, FILE *out) {
    switch (s->kind) {
    case STMT_MODEL: fprintf(out, "(model %s", s->name); break;
    case STMT_CONST:
        fputs("(const ", out);
        print_pairs(s, " ", out);
        break;
    case STMT_INPUT:
        fprintf(out, "(input %s %s [", s->name, s->dtype);
        for (int i = 0; i < s->n_dims; i++) {
            if (i) fputc(' ', out);
            print_expr(s->dims[i], out);
        }
        fputc(']', out);
        break;
    case STMT_ASSIGN:
        fprintf(out, "(assign %s ", s->name);
        print_expr(s->value, out);
        break;
    case STMT_RETURN:
        fputs("(return ", out);
        print_expr(s->value, out);
        break;
    case STMT_BLOCK:
        fprintf(out, "(block %s (", s->name);
        print_pairs(s, "=", out);
        fputc(')', out);
        print_body(s->body, s->n_body, indent + 2, out);
        break;
    case STMT_FOR:
        fprintf(out, "(for %s ", s->name);
        print_expr(s->lo, out);
        fputc(' ', out);
        print_expr(s->hi, out);
        print_body(s->body, s->n_body, indent + 2, out);
        break;
    case STMT_IF:
        fputs("(if ", out);
        print_expr(s->value, out);
        print_body(s->body, s->n_body, indent + 4, out);
        if (s->else_body) {
            fprintf(out, "\n%*selse", indent + 2, "");
            print_body(s->else_body, s->n_else, indent + 4, out);
        }
        break;
    case STMT_TRAIN:
        fputs("(train", out);
        print_body(s->body, s->n_body, indent + 2, out);
        break;
    }
    fputc(')', out);
}

void ast_print(const AstProgram *prog, FILE *out) {
    for (int i = 0; i < prog->n_stmts; i++) {
        print_stmt(prog->stmts[i], 0, out);
        fputc('\n', out);
    }
}
