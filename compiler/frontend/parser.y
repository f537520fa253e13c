/* parser.y - the grammar of .net files (see docs/language.md for the language).
 *
 * Each action is one call into an AST builder in ast.c. Statements end at a newline or ';';
 * the lexer drops newlines inside ( ) and [ ] and folds blank lines. After a syntax error the
 * parser skips to the end of the line (`error sep`) and carries on, so one run reports every
 * broken line. Syntax errors are worded by yyreport_syntax_error below ("expected ')' but
 * found newline"), never with bison's token names.
 */
%require "3.7"
%define api.pure full
%define parse.error custom
%define parse.lac full
%define api.location.type {SrcLoc}
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {Parser *P}

%code requires {
#include "ast_build.h"
#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif
}

%code provides {
int yylex(YYSTYPE *yylval, SrcLoc *yylloc, yyscan_t scanner);
}

%code {
#include <stdio.h>
#include <string.h>

/* A rule's location is that of its first symbol (an empty rule: the symbol before it). */
#define YYLLOC_DEFAULT(Cur, Rhs, N) ((Cur) = (N) ? YYRHSLOC(Rhs, 1) : YYRHSLOC(Rhs, 0))
/* Deeper than this only with thousands of prefix operators in a row; reported, not fatal. */
#define YYMAXDEPTH 10000

static void yyerror(SrcLoc *loc, yyscan_t scanner, Parser *P, const char *msg);
}

%initial-action { @$ = (SrcLoc){P->path, 1, 1}; }

%union {
    Token tok;
    AstExpr *expr;
    AstStmt *stmt;
    StmtList *stmts;
    ExprList *exprs;
    ArgList *args;
    PairList *pairs;
    LabelList *label;
}

%token END 0 "end of file"
%token NEWLINE "newline"
%token <tok> IDENT "identifier" INT "integer" FLOAT "number" STRING "string"
/* keywords: K_MODEL..K_FALSE must stay contiguous (yyreport_syntax_error relies on it) */
%token K_MODEL "model" K_CONST "const" K_INPUT "input" K_BLOCK "block" K_RETURN "return"
       K_FOR "for" K_IN "in" K_IF "if" K_ELSE "else" K_TRAIN "train"
       K_AND "and" K_OR "or" K_NOT "not" K_TRUE "true" K_FALSE "false"
%token LPAREN "(" RPAREN ")" LBRACKET "[" RBRACKET "]" LBRACE "{" RBRACE "}"
       COMMA "," COLON ":" SEMI ";" ASSIGN "=" DOT "." DOTDOT ".."
/* ':' inside an index's brackets (the lexer tells them apart): x[:, 1:3] */
%token RANGE "range's :"
%token ELLIPSIS "..."
/* binary operators: PLUS..GE must stay contiguous */
%token PLUS "+" MINUS "-" STAR "*" SLASH "/" FLOORDIV "//" PERCENT "%" POW "**"
       EQ "==" NE "!=" LT "<" LE "<=" GT ">" GE ">="

%left "or"
%left "and"
%precedence "not"
%nonassoc "==" "!=" "<" "<=" ">" ">="
%left "+" "-"
%left "*" "/" "//" "%"
%precedence UMINUS
%right "**"

%type <stmt> stmt if_stmt
%type <stmts> lines body
%type <pairs> const_defs params param_list
%type <expr> expr primary postfix default_opt
%type <exprs> items item_list index_list
%type <expr> index
%type <args> args arg_list
%type <label> label

%%

program:
    %empty
  | program sep
  | program stmt sep                     { ast_add_top(P, $2); }
  | program error sep                    { yyerrok; ast_recovered(P, NULL); }
  ;

sep: NEWLINE | ";" ;

/* The statements of a { } body; the last may end at the '}' without a newline. */
lines:
    %empty                               { $$ = NULL; }
  | lines sep                            { $$ = $1; }
  | lines stmt sep                       { $$ = ast_stmts_add(P, $1, $2); }
  | lines error sep                      { yyerrok; $$ = ast_recovered(P, $1); }
  ;

body:
    "{" lines "}"                        { $$ = $2; }
  | "{" lines stmt "}"                   { $$ = ast_stmts_add(P, $2, $3); }
  | "{" lines error "}"                  { yyerrok; $$ = ast_recovered(P, $2); }
  ;

stmt:
    "model" IDENT                        { $$ = ast_stmt_model(P, @1, $2.text, @2); }
  | "const" const_defs                   { $$ = ast_stmt_const(P, @1, $2); }
  | "input" IDENT ":" IDENT "[" items "]"
                                         { $$ = ast_stmt_input(P, @1, $2.text, @2, $4.text, @4, $6); }
  | IDENT "=" expr                       { $$ = ast_stmt_assign(P, $1.text, @1, $3); }
  | "return" expr                        { $$ = ast_stmt_return(P, @1, $2); }
  | "block" IDENT "(" params ")" body    { $$ = ast_stmt_block(P, @1, $2.text, @2, $4, $6); }
  | "for" IDENT "in" expr ".." expr body { $$ = ast_stmt_for(P, @1, $2.text, @2, $4, $6, $7); }
  | if_stmt
  | "train" body                         { $$ = ast_stmt_train(P, @1, $2); }
  ;

if_stmt:
    "if" expr body                       { $$ = ast_stmt_if(P, @1, $2, $3, NULL); }
  | "if" expr body "else" body           { $$ = ast_stmt_if(P, @1, $2, $3, $5); }
  | "if" expr body "else" if_stmt        { $$ = ast_stmt_elif(P, @1, $2, $3, $5); }
  ;

const_defs:
    IDENT "=" expr                       { $$ = ast_pairs_add(P, NULL, $1.text, @1, $3); }
  | const_defs "," IDENT "=" expr        { $$ = ast_pairs_add(P, $1, $3.text, @3, $5); }
  ;

/* block parameters, each with an optional default; a trailing comma is allowed */
params:
    %empty                               { $$ = NULL; }
  | param_list
  | param_list ","
  ;

param_list:
    IDENT default_opt                    { $$ = ast_pairs_add(P, NULL, $1.text, @1, $2); }
  | param_list "," IDENT default_opt     { $$ = ast_pairs_add(P, $1, $3.text, @3, $4); }
  ;

default_opt:
    %empty                               { $$ = NULL; }
  | "=" expr                             { $$ = $2; }
  ;

expr:
    expr "or" expr                       { $$ = ast_binary(P, BIN_OR, $1, $3); }
  | expr "and" expr                      { $$ = ast_binary(P, BIN_AND, $1, $3); }
  | "not" expr                           { $$ = ast_unary(P, @1, '!', $2); }
  | expr "==" expr                       { $$ = ast_binary(P, BIN_EQ, $1, $3); }
  | expr "!=" expr                       { $$ = ast_binary(P, BIN_NE, $1, $3); }
  | expr "<" expr                        { $$ = ast_binary(P, BIN_LT, $1, $3); }
  | expr "<=" expr                       { $$ = ast_binary(P, BIN_LE, $1, $3); }
  | expr ">" expr                        { $$ = ast_binary(P, BIN_GT, $1, $3); }
  | expr ">=" expr                       { $$ = ast_binary(P, BIN_GE, $1, $3); }
  | expr "+" expr                        { $$ = ast_binary(P, BIN_ADD, $1, $3); }
  | expr "-" expr                        { $$ = ast_binary(P, BIN_SUB, $1, $3); }
  | expr "*" expr                        { $$ = ast_binary(P, BIN_MUL, $1, $3); }
  | expr "/" expr                        { $$ = ast_binary(P, BIN_DIV, $1, $3); }
  | expr "//" expr                       { $$ = ast_binary(P, BIN_FLOORDIV, $1, $3); }
  | expr "%" expr                        { $$ = ast_binary(P, BIN_MOD, $1, $3); }
  | "-" expr %prec UMINUS                { $$ = ast_unary(P, @1, '-', $2); }
  | expr "**" expr                       { $$ = ast_binary(P, BIN_POW, $1, $3); }
  | primary
  ;

primary:
    postfix
  | label ":" primary                    { $$ = ast_labeled(P, $1, $3); }
  ;

/* A value and its indexing; `name: f(x)[0]` labels the call and indexes its result. */
postfix:
    INT                                  { $$ = ast_int(P, @1, $1); }
  | FLOAT                                { $$ = ast_float(P, @1, $1); }
  | STRING                               { $$ = ast_string(P, @1, $1); }
  | "true"                               { $$ = ast_bool(P, @1, 1); }
  | "false"                              { $$ = ast_bool(P, @1, 0); }
  | IDENT                                { $$ = ast_name(P, @1, $1.text); }
  | IDENT "(" args ")"                   { $$ = ast_call(P, @1, $1.text, $3); }
  | "(" expr ")"                         { $$ = $2; }
  | "[" items "]"                        { $$ = ast_list(P, @1, $2); }
  | postfix "[" index_list "]"           { $$ = ast_index(P, $1, $3); }
  ;

/* l[i], x[:, -1]: an integer picks an element (an axis of a tensor away), ':' keeps an axis,
 * a:b, a: and :b take a range of it, and '...' stands for the axes no other item names. */
index_list:
    index                                { $$ = ast_exprs_add(P, NULL, $1); }
  | index_list "," index                 { $$ = ast_exprs_add(P, $1, $3); }
  ;

index:
    expr
  | RANGE                                { $$ = NULL; }
  | expr RANGE expr                      { $$ = ast_range(P, @2, $1, $3); }
  | expr RANGE                           { $$ = ast_range(P, @2, $1, NULL); }
  | RANGE expr                           { $$ = ast_range(P, @1, NULL, $2); }
  | ELLIPSIS                             { $$ = ast_ellipsis(P, @1); }
  ;

/* call arguments: positional, then keyword (`k=5`); the builder reports the wrong order */
args:
    %empty                               { $$ = NULL; }
  | arg_list
  | arg_list ","
  ;

arg_list:
    expr                                 { $$ = ast_args_add(P, NULL, NULL, @1, $1); }
  | IDENT "=" expr                       { $$ = ast_args_add(P, NULL, $1.text, @1, $3); }
  | arg_list "," expr                    { $$ = ast_args_add(P, $1, NULL, @3, $3); }
  | arg_list "," IDENT "=" expr          { $$ = ast_args_add(P, $1, $3.text, @3, $5); }
  ;

/* list items and input dimensions; may be empty, a trailing comma is allowed */
items:
    %empty                               { $$ = NULL; }
  | item_list
  | item_list ","
  ;

item_list:
    expr                                 { $$ = ast_exprs_add(P, NULL, $1); }
  | item_list "," expr                   { $$ = ast_exprs_add(P, $1, $3); }
  ;

/* A label path `layer1.{i}.conv`: names, integers and {expr} joined by dots. The lexer reads
 * `0.1` in `layer2.0.1` as one number; the builder splits it into two segments. The keyword
 * `model` is also a segment, for Hugging Face's names (`model.layers.{i}`). */
label:
    IDENT                                { $$ = ast_label_text(P, NULL, @1, $1.text); }
  | "model"                              { $$ = ast_label_text(P, NULL, @1, "model"); }
  | label "." "model"                    { $$ = ast_label_text(P, $1, @3, "model"); }
  | INT                                  { $$ = ast_label_number(P, NULL, @1, $1, false); }
  | FLOAT                                { $$ = ast_label_number(P, NULL, @1, $1, true); }
  | "{" expr "}"                         { $$ = ast_label_expr(P, NULL, @1, $2); }
  | label "." IDENT                      { $$ = ast_label_text(P, $1, @3, $3.text); }
  | label "." INT                        { $$ = ast_label_number(P, $1, @3, $3, false); }
  | label "." FLOAT                      { $$ = ast_label_number(P, $1, @3, $3, true); }
  | label "." "{" expr "}"               { $$ = ast_label_expr(P, $1, @3, $4); }
  ;

%%

/* ---- syntax error messages
 *
 * The message names what the parser expected and what it found, in words. Expected tokens are
 * summarised: all the tokens that can start an expression read "expression", those that can
 * start a statement read "statement", and operators, '.' and ':' (which could continue almost
 * anything) are left out when something else is possible. A missing closing bracket before a
 * newline or the end of the file is reported at the end of the line, with a note at the
 * bracket it should match.
 */

enum { MAX_LISTED = 4 };

static bool sym_is_keyword(int k) { return k >= YYSYMBOL_K_MODEL && k <= YYSYMBOL_K_FALSE; }
static bool sym_is_binop(int k) {
    return (k >= YYSYMBOL_PLUS && k <= YYSYMBOL_GE) || k == YYSYMBOL_K_AND || k == YYSYMBOL_K_OR;
}
static bool sym_is_compare(int k) { return k >= YYSYMBOL_EQ && k <= YYSYMBOL_GE; }
static bool sym_starts_expr(int k) {
    switch (k) {
    case YYSYMBOL_IDENT: case YYSYMBOL_INT: case YYSYMBOL_FLOAT: case YYSYMBOL_STRING:
    case YYSYMBOL_LPAREN: case YYSYMBOL_LBRACKET: case YYSYMBOL_LBRACE: case YYSYMBOL_MINUS:
    case YYSYMBOL_K_NOT: case YYSYMBOL_K_TRUE: case YYSYMBOL_K_FALSE:
    case YYSYMBOL_K_MODEL: /* a label's first segment */
        return true;
    default: return false;
    }
}
static bool sym_starts_stmt(int k) {
    switch (k) {
    case YYSYMBOL_IDENT: case YYSYMBOL_K_MODEL: case YYSYMBOL_K_CONST: case YYSYMBOL_K_INPUT:
    case YYSYMBOL_K_BLOCK: case YYSYMBOL_K_RETURN: case YYSYMBOL_K_FOR: case YYSYMBOL_K_IF:
    case YYSYMBOL_K_TRAIN: case YYSYMBOL_NEWLINE: case YYSYMBOL_SEMI: case YYSYMBOL_YYEOF:
        return true;
    default: return false;
    }
}

/* An expected token as it reads in "expected X". */
static const char *sym_desc(int k, char *buf, size_t size) {
    switch (k) {
    case YYSYMBOL_YYEOF: case YYSYMBOL_NEWLINE: case YYSYMBOL_IDENT: case YYSYMBOL_INT:
    case YYSYMBOL_FLOAT: case YYSYMBOL_STRING:
        return yysymbol_name(k);
    case YYSYMBOL_RANGE: return "':'";
    default:
        snprintf(buf, size, "'%s'", yysymbol_name(k));
        return buf;
    }
}

/* The lookahead as it reads in "but found X". */
static void found_desc(Parser *P, int k, char *buf, size_t size) {
    const char *text = P->last_text ? P->last_text : "";
    int n = (int)strlen(text) > 40 ? 37 : 40;
    const char *more = (int)strlen(text) > 40 ? "..." : "";
    switch (k) {
    case YYSYMBOL_IDENT: snprintf(buf, size, "identifier '%.*s%s'", n, text, more); return;
    case YYSYMBOL_INT: case YYSYMBOL_FLOAT: snprintf(buf, size, "number %.*s%s", n, text, more); return;
    case YYSYMBOL_STRING: snprintf(buf, size, "string"); return;
    default: break;
    }
    char tmp[32];
    if (sym_is_keyword(k)) snprintf(buf, size, "keyword '%s'", yysymbol_name(k));
    else snprintf(buf, size, "%s", sym_desc(k, tmp, sizeof tmp));
}

typedef struct Expected {
    yysymbol_kind_t syms[YYNTOKENS];
    int n;
    bool has[YYNTOKENS];
} Expected;

/* Remove the symbols pred selects; with keep_one, not when that would remove them all. */
static void drop(Expected *x, bool (*pred)(int), bool keep_one) {
    int j = 0;
    for (int i = 0; i < x->n; i++)
        if (!pred(x->syms[i])) x->syms[j++] = x->syms[i];
    if (j > 0 || !keep_one) x->n = j;
}
/* After a name: an operator, a label's '.' or ':', a call's '(', an index's '[' or a keyword
 * argument's '='. */
static bool sym_continues(int k) {
    return sym_is_binop(k) || k == YYSYMBOL_DOT || k == YYSYMBOL_COLON || k == YYSYMBOL_RANGE || k == YYSYMBOL_LPAREN ||
           k == YYSYMBOL_LBRACKET || k == YYSYMBOL_ASSIGN;
}
static bool sym_is_semi_or_else(int k) { return k == YYSYMBOL_SEMI || k == YYSYMBOL_K_ELSE; }

/* "expected expression", "expected ',' or ')'", ...; "" when too many to list. */
static void expected_desc(Expected *x, char *buf, size_t size) {
    const char *lead[2];
    int n_lead = 0;
    if (x->has[YYSYMBOL_K_CONST]) { /* only a statement starts with 'const' */
        lead[n_lead++] = "statement";
        drop(x, sym_starts_stmt, false);
    }
    if (x->has[YYSYMBOL_INT] && x->has[YYSYMBOL_LBRACKET]) {
        lead[n_lead++] = "expression";
        drop(x, sym_starts_expr, false);
    } else {
        drop(x, sym_continues, true);
    }
    if (x->has[YYSYMBOL_NEWLINE]) drop(x, sym_is_semi_or_else, true);
    drop(x, sym_is_binop, true);
    int total = n_lead + x->n;
    buf[0] = 0;
    if (total == 0 || total > MAX_LISTED) return;
    size_t len = 0;
    for (int i = 0; i < total && len < size; i++) {
        char tmp[32];
        const char *s = i < n_lead ? lead[i] : sym_desc(x->syms[i - n_lead], tmp, sizeof tmp);
        const char *sep = i == 0 ? "" : i == total - 1 ? " or " : ", ";
        len += (size_t)snprintf(buf + len, size - len, "%s%s", sep, s);
    }
}

/* The column of the first non-blank character of a line (1-based). */
static int line_indent(const char *text, int line) {
    for (int l = 1; l < line && text; l++) {
        text = strchr(text, '\n');
        if (text) text++;
    }
    int col = 1;
    while (text && (text[col - 1] == ' ' || text[col - 1] == '\t')) col++;
    return col;
}

static int closer_of(char open) {
    return open == '(' ? YYSYMBOL_RPAREN : open == '[' ? YYSYMBOL_RBRACKET : YYSYMBOL_RBRACE;
}

/* `x = f(a` then a newline or the end of the file: say so at the end of the line. */
static bool report_unclosed(const yypcontext_t *ctx, Parser *P, int found, const Expected *x) {
    OpenBracket open = P->open_before;
    if (!open.kind || open.kind == 's' || !x->has[closer_of(open.kind)]) return false;
    bool at_end = found == YYSYMBOL_YYEOF || found == YYSYMBOL_NEWLINE;
    if (!at_end && !(P->nl_skipped && found != closer_of(open.kind))) return false;
    char close = open.kind == '(' ? ')' : open.kind == '[' ? ']' : '}';
    SrcLoc at = P->prev_kind ? P->prev_end : P->last_end;
    diag_error(at, "expected '%c' but found %s", close,
               found == YYSYMBOL_YYEOF ? "end of file" : "newline");
    diag_hint("every '%c' needs a matching '%c'", open.kind, close);
    /* an argument on a line indented past the call's: most likely a missing comma */
    if (found != YYSYMBOL_YYEOF && x->has[YYSYMBOL_COMMA] && sym_starts_expr(found) &&
        yypcontext_location(ctx)->col > line_indent(P->text, open.loc.line))
        diag_hint("if the list goes on on the next line, a ',' is missing here");
    diag_note(open.loc, "to match this '%c'", open.kind);
    return true;
}

static void syntax_hints(Parser *P, int found, const Expected *x) {
    bool stmt_start = x->has[YYSYMBOL_K_CONST];
    if (found == YYSYMBOL_K_ELSE && stmt_start)
        diag_hint("'else' must follow the '}' that ends an if");
    else if (sym_is_keyword(found) && (x->has[YYSYMBOL_IDENT] || x->has[YYSYMBOL_INT]) && !stmt_start)
        diag_hint("'%s' is a reserved word and cannot be used as a name", yysymbol_name(found));
    int prev = P->prev_kind > 0 ? YYTRANSLATE(P->prev_kind) : -1;
    if (found == YYSYMBOL_ASSIGN && sym_is_keyword(prev))
        diag_hint("'%s' is a reserved word and cannot be used as a name", yysymbol_name(prev));
    else if (found == YYSYMBOL_ASSIGN && x->has[YYSYMBOL_EQ])
        diag_hint("use '==' to compare; '=' only assigns, at the start of a statement");
    if (sym_is_compare(found) && !x->has[found] && x->has[YYSYMBOL_K_AND])
        diag_hint("comparisons do not chain: write `a < b and b < c`");
    bool in_brackets = P->open_before.kind == '(' || P->open_before.kind == '[';
    if (found == YYSYMBOL_IDENT && prev == YYSYMBOL_IDENT && x->has[YYSYMBOL_DOT] && !in_brackets)
        diag_hint("to name a layer, put ':' after the name: `fc1: dense(x, 10)`");
    if (found == YYSYMBOL_DOT && x->has[YYSYMBOL_LBRACKET])
        diag_hint("a number needs a digit before the point: 0.5");
    if (found == YYSYMBOL_RANGE && !x->has[found])
        diag_hint("a range is a:b, a: or :b, without a step");
    if (x->has[YYSYMBOL_DOTDOT] && !x->has[found])
        diag_hint("a loop runs over a range of integers: `for i in 0..n { ... }`");
}

static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, Parser *P) {
    (void)scanner;
    if (P->stopped) return 0; /* the lexer already said why it stopped */
    Expected x = {0};
    int n = yypcontext_expected_tokens(ctx, x.syms, YYNTOKENS);
    x.n = n < 0 ? 0 : n;
    for (int i = 0; i < x.n; i++) x.has[x.syms[i]] = true;
    int found = yypcontext_token(ctx);
    if (found == YYSYMBOL_NEWLINE && P->eof_nl) found = YYSYMBOL_YYEOF; /* no newline at the end */
    if (!report_unclosed(ctx, P, found, &x)) {
        char what[128], exp[160];
        found_desc(P, found, what, sizeof what);
        SrcLoc at = *yypcontext_location(ctx);
        if ((found == YYSYMBOL_YYEOF || found == YYSYMBOL_NEWLINE) && P->prev_kind) at = P->prev_end;
        Expected shown = x;
        expected_desc(&shown, exp, sizeof exp);
        if (*exp) diag_error(at, "expected %s but found %s", exp, what);
        else diag_error(at, "unexpected %s", what);
        syntax_hints(P, found, &x);
    }
    lex_recover(P);
    return 0;
}

/* Bison calls this only when its stack is full ("memory exhausted"). */
static void yyerror(SrcLoc *loc, yyscan_t scanner, Parser *P, const char *msg) {
    (void)scanner;
    (void)msg;
    if (P->stopped) return;
    diag_error(*loc, "nesting too deep (the parser's stack is full)");
    diag_hint("split long chains of prefix operators, labels or else-ifs");
    P->stopped = true;
}
