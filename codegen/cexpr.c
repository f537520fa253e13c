/* cexpr.c - expressions and declarations both backends emit (see cexpr.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cexpr.h"
#include "passes.h"

/* The value of an inline node: a constant, or a view of one. */
double cg_const_value(const IrNode *n) {
    while (n->op != OP_CONST) n = n->in[0];
    return n->attr.scalar;
}

/* ---- literals */

/* A float literal that reads back exactly, in as few digits as that takes: 0.01f, 1.0f. */
static void fmt_float(char *buf, size_t size, double v) {
    float f = (float)v;
    if (f != f) { snprintf(buf, size, "NAN"); return; }
    if (f > 3.4e38f || f < -3.4e38f) { snprintf(buf, size, "%sINFINITY", f < 0 ? "-" : ""); return; }
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, size, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", size - strlen(buf) - 1);
    strncat(buf, "f", size - strlen(buf) - 1);
}

void cg_lit(FILE *o, double v) {
    char buf[48];
    fmt_float(buf, sizeof buf, v);
    fputs(buf, o);
}

/* A double in as few digits as reproduce it exactly. */
void cg_dbl(FILE *o, double v) {
    char buf[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, o);
}

/* A C string literal (names and paths come from the user). */
void cg_cstr(FILE *o, const char *s) {
    fputc('"', o);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(o, "\\%c", ch);
        else if (ch < 32 || ch >= 127) fprintf(o, "\\%03o", ch);
        else fputc(ch, o);
    }
    fputc('"', o);
}

/* Text for a // comment: no line breaks. */
void cg_comment_text(FILE *o, const char *s) {
    for (; s && *s; s++) fputc((unsigned char)*s < 32 ? '?' : *s, o);
}

const char *cg_base_name(const char *path) {
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : path;
}

/* ---- index arithmetic */


/* Logical axes of n in physical order, outermost first. */
void cg_phys_order(const IrNode *n, int perm[IR_MAX_RANK]) { ir_layout_order(n->layout, n->shape.rank, perm); }

/* Element stride of each logical axis of n's storage. */
void cg_elem_strides(const IrNode *n, int64_t st[IR_MAX_RANK]) {
    int perm[IR_MAX_RANK];
    cg_phys_order(n, perm);
    int64_t s = 1;
    for (int k = n->shape.rank - 1; k >= 0; k--) {
        st[perm[k]] = s;
        s *= n->shape.dim[perm[k]];
    }
}

/* Print the index `sum over axes of (var / S % D) * T` for axes given innermost first, where S
 * is the product of the inner axes' extents. Axes of extent 1 vanish, neighbours that are
 * contiguous in the operand merge, and `/ 1`, `% D` on the outermost axis and `* 1` are left
 * out: a same-shape operand reads `var`, a bias [C] over [N, C] reads `var % C`.
 *
 * With `inner` > 0 the loop is two-level, `i = r * inner + c` with c < inner the output's
 * innermost extent, and the terms are written in r and c so that no `%` or `/` is left on the
 * inner loop: the bias reads `c`, a per-channel operand of a channels-last value too, and the
 * inner loop vectorises. */
/* The axes `in` (innermost first) with those of extent 1 left out and neighbours that are
 * contiguous in the operand (or both broadcast) merged; their count. */
static int merge_axes(const CgAxis *in, int n, CgAxis ax[IR_MAX_RANK * 2]) {
    int m = 0;
    for (int k = 0; k < n; k++) {
        if (in[k].dim == 1) continue;
        CgAxis *last = m ? &ax[m - 1] : NULL;
        if (last && ((last->stride == 0 && in[k].stride == 0) ||
                     (last->stride != 0 && in[k].stride == last->stride * last->dim)))
            last->dim *= in[k].dim;
        else ax[m++] = in[k];
    }
    return m;
}

void cg_index_expr(FILE *o, const char *var, const CgAxis *in, int n, int64_t inner) {
    CgAxis ax[IR_MAX_RANK * 2];
    int m = merge_axes(in, n, ax);
    int64_t total = 1;
    for (int k = 0; k < n; k++) total *= in[k].dim;
    int64_t S = 1;
    int terms = 0;
    for (int k = 0; k < m; k++) {
        if (ax[k].stride != 0) {
            int outer = S * ax[k].dim == total;
            fprintf(o, "%s", terms++ ? " + " : "");
            if (inner && S == 1 && !outer) { /* the inner axis, maybe with some outer ones merged */
                int paren = ax[k].stride != 1 || ax[k].dim != inner;
                fprintf(o, "%s", paren ? "(" : "");
                if (ax[k].dim == inner) fprintf(o, "c");
                else fprintf(o, "r %% %" PRId64 " * %" PRId64 " + c", ax[k].dim / inner, inner);
                fprintf(o, "%s", paren ? ")" : "");
            } else {
                const char *v = inner && S != 1 ? "r" : var; /* an outer axis: r / (S / inner) */
                int64_t div = inner && S != 1 ? S / inner : S;
                int paren = ax[k].stride != 1 && (div != 1 || !outer);
                fprintf(o, "%s%s", paren ? "(" : "", v);
                if (div != 1) fprintf(o, " / %" PRId64, div);
                if (!outer) fprintf(o, " %% %" PRId64, ax[k].dim);
                if (paren) fprintf(o, ")");
            }
            if (ax[k].stride != 1) fprintf(o, " * %" PRId64, ax[k].stride);
        }
        S *= ax[k].dim;
    }
    if (!terms) fprintf(o, "0");
}

/* The axes of `out`'s physical loop (innermost first) with x's strides: x broadcast to out. */
int cg_broadcast_axes(const IrNode *x, const IrNode *out, CgAxis ax[IR_MAX_RANK]) {
    int perm[IR_MAX_RANK];
    int64_t st[IR_MAX_RANK];
    cg_phys_order(out, perm);
    cg_elem_strides(x, st);
    int r = out->shape.rank, n = 0;
    for (int k = r - 1; k >= 0; k--) {
        int a = perm[k], xa = a - (r - x->shape.rank);
        int stretched = xa < 0 || x->shape.dim[xa] == 1;
        ax[n++] = (CgAxis){out->shape.dim[a], stretched ? 0 : st[xa]};
    }
    return n;
}

/* Whether n reads x in aligned runs of four: n's elements 4q .. 4q+3 read x's elements
 * 4p .. 4p+3, where p is the index the axes `quad` (in units of four elements, innermost first)
 * give for q; their count, 0 when x is not read so. It is read so when x broadcasts to n, its
 * innermost axis (once merged) lies contiguous along n's with an extent a multiple of 4, and
 * every other stride is a multiple of 4: a same-shape operand in n's order (p = q), a bias or
 * per-channel operand of a channels-last value with C % 4 == 0 (p = q % (C / 4)). An operand
 * that n reads other than by broadcasting (batch norm's per-channel ones, chan_elem) its caller
 * must leave out (cuda.c's vec_member). */
int cg_quad_axes(const IrNode *x, const IrNode *n, CgAxis quad[IR_MAX_RANK * 2]) {
    CgAxis ax[IR_MAX_RANK];
    /* only an operand that broadcasts to n (NumPy's rule) is read along these axes */
    int lead = n->shape.rank - x->shape.rank;
    if (lead < 0) return 0;
    for (int k = 0; k < x->shape.rank; k++)
        if (x->shape.dim[k] != 1 && x->shape.dim[k] != n->shape.dim[lead + k]) return 0;
    int k = cg_broadcast_axes(x, n, ax), m = merge_axes(ax, k, quad);
    if (m == 0 || quad[0].stride != 1 || quad[0].dim % 4) return 0;
    quad[0].dim /= 4;
    for (int a = 1; a < m; a++) {
        if (quad[a].stride % 4) return 0;
        quad[a].stride /= 4;
    }
    return m;
}

/* ---- pointers and declarations */

/* The C expression for a node's storage, typed as a pointer to its element type. */
void cg_ptr(Cg *c, const IrNode *n) {
    const IrNode *r = ir_storage_root(n);
    const char *t = ir_dtype_ctype(n->dtype);
    int64_t elems = 0; /* a row view starts inside its root */
    for (const IrNode *v = n; v != r; v = v->in[0])
        if (v->op == OP_ROW) elems += v->attr.row * ir_numel(&v->shape);
        else if (v->op == OP_PART) elems += v->attr.part;
    switch (r->storage) {
    case ST_ARENA:
        cg_put(c, "(%s *)(ctx->arena + %" PRId64 ")", t, r->offset);
        if (elems) cg_put(c, " + %" PRId64, elems);
        break;
    case ST_PARAM:
        if (r->dtype != DT_F32) /* kept in half on the device (--frozen-half): a permuting cast reads it */
            cg_put(c, "(%s *)ctx->half_params + %" PRId64, t, r->offset - cg_half_params_from(c->g) + elems);
        else cg_put(c, "ctx->params + %" PRId64, r->offset + elems);
        break;
    case ST_GRAD: cg_put(c, "ctx->grads + %" PRId64, r->offset + elems); break;
    case ST_INPUT: cg_put(c, "(const %s *)ctx->inputs[%d] + %" PRId64, t, r->index, elems); break;
    case ST_STATE: cg_put(c, "&ctx->state->loss_scale"); break; /* a device trainer's (rt_devstate.h) */
    default: ICE("codegen: %%%d = %s has no storage to point at", n->id, ir_op_name(n->op));
    }
}

void cg_declare(Cg *c, const IrNode *n) {
    if (c->decl[n->id]) return;
    c->decl[n->id] = 1;
    if (n->storage == ST_INLINE) { /* a constant that a kernel reads through a pointer */
        cg_begin(c, "const %s v%d[1] = {", ir_dtype_ctype(n->dtype), n->id);
        cg_lit(c->out, cg_const_value(n));
        cg_end(c, "};");
        return;
    }
    const char *q = ir_storage_root(n)->storage == ST_INPUT ? "const " : "", *t = ir_dtype_ctype(n->dtype);
    int k = c->at_slot ? c->at_slot(c, n, 0) : -1;
    cg_begin(c, "%s%s *v%d = ", q, t, n->id);
    if (k >= 0) cg_put(c, "(%s%s *)(base + at.o[%d])", q, t, k);
    else cg_ptr(c, n);
    cg_end(c, ";");
}

/* `// %12 = relu(%11) f32[64, 128]   lenet.net:9` */
void cg_comment(Cg *c, const IrNode *n) {
    char shape[160];
    FILE *o = c->out;
    cg_begin(c, "// %%%d = %s", n->id, ir_op_name(n->op));
    if (n->name) {
        cg_put(c, " ");
        cg_comment_text(o, n->name);
    }
    for (int i = 0; i < n->n_in; i++) cg_put(c, "%s%%%d", i ? ", " : "(", n->in[i]->id);
    cg_put(c, "%s %s%s", n->n_in ? ")" : "", ir_dtype_name(n->dtype), ir_shape_str(&n->shape, shape, sizeof shape));
    if (n->op == OP_ROW) cg_put(c, " row=%d", n->attr.row); /* which of a packed result's parts */
    if (n->op == OP_PART) cg_put(c, " part=%" PRId64, n->attr.part);
    char layout[40];
    if (n->layout.permuted) cg_put(c, " %s", ir_layout_str(n->layout, layout, sizeof layout));
    if (n->loc.file) {
        cg_put(c, "   ");
        cg_comment_text(o, cg_base_name(n->loc.file));
        cg_put(c, ":%d", n->loc.line);
    }
    cg_end(c, "%s", "");
}

/* ---- printing the generated code */

static void indent(Cg *c) {
    for (int i = 0; i < c->depth; i++) fputs("    ", c->out);
}

/* Each printer: what comes before the formatted text, the text, what comes after. */
#define CG_PRINT(before, after)         \
    do {                                \
        va_list ap;                     \
        before;                         \
        va_start(ap, fmt);              \
        vfprintf(c->out, fmt, ap);      \
        va_end(ap);                     \
        after;                          \
    } while (0)

void cg_line(Cg *c, const char *fmt, ...) { CG_PRINT(indent(c), fputc('\n', c->out)); }
void cg_open(Cg *c, const char *fmt, ...) { CG_PRINT(indent(c), (fputc('\n', c->out), c->depth++)); }
void cg_close(Cg *c, const char *fmt, ...) {
    if (c->depth == 0) ICE("codegen: a block closed that was never opened");
    CG_PRINT((c->depth--, indent(c)), fputc('\n', c->out));
}
void cg_begin(Cg *c, const char *fmt, ...) { CG_PRINT(indent(c), (void)0); }
void cg_put(Cg *c, const char *fmt, ...) { CG_PRINT((void)0, (void)0); }
void cg_end(Cg *c, const char *fmt, ...) { CG_PRINT((void)0, fputc('\n', c->out)); }
void cg_blank(Cg *c) { fputc('\n', c->out); }

/* ---- element-wise */

/* An element of x read as a float: cg_load_open prints the conversion's opening (none for float32),
 * the caller prints the element, cg_load_close the closing. */
void cg_load_open(FILE *o, const IrNode *x) {
    if (x->dtype == DT_F16) fprintf(o, "rt_f16_to_f32(");
    else if (x->dtype == DT_BF16) fprintf(o, "rt_bf16_to_f32(");
    else if (x->dtype != DT_F32) fprintf(o, "(float)");
}

void cg_load_close(FILE *o, const IrNode *x) {
    if (ir_dtype_is_half(x->dtype)) fprintf(o, ")");
}

/* ---- folded views (passes/views.c): a loop reads through them to the values they view */

/* Which element of a folded view (or of a value under it) a loop over n reads: its coordinate
 * along axis a is that of n's logical axis loop[a] plus shift[a], or shift[a] alone where
 * loop[a] < 0 (an axis of 1). */
typedef struct ViewMap {
    int loop[IR_MAX_RANK];
    int64_t shift[IR_MAX_RANK];
} ViewMap;

/* The coordinate of the loop's element i along n's logical axis a, as an index expression. */
static void loop_coord(Cg *c, const IrNode *n, int a) {
    int perm[IR_MAX_RANK];
    CgAxis ax[IR_MAX_RANK];
    int k = 0;
    cg_phys_order(n, perm);
    for (int j = n->shape.rank - 1; j >= 0; j--) ax[k++] = (CgAxis){n->shape.dim[perm[j]], perm[j] == a ? 1 : 0};
    cg_index_expr(c->out, "i", ax, k, c->inner);
}

/* x's element under the map m, where x is a value with storage (or an inline constant): its
 * storage strides summed over the loop's axes, the shifts as a constant offset. */
static void read_stored(Cg *c, const IrNode *x, const IrNode *n, const ViewMap *m) {
    if (x->storage == ST_INLINE) {
        cg_lit(c->out, cg_const_value(x));
        return;
    }
    int perm[IR_MAX_RANK];
    int64_t st[IR_MAX_RANK], off = 0;
    CgAxis ax[IR_MAX_RANK] = {{0, 0}};
    cg_elem_strides(x, st);
    cg_phys_order(n, perm);
    for (int a = 0; a < x->shape.rank; a++) off += m->shift[a] * st[a];
    int k = 0;
    for (int j = n->shape.rank - 1; j >= 0; j--) {
        ax[k] = (CgAxis){n->shape.dim[perm[j]], 0};
        for (int a = 0; a < x->shape.rank; a++)
            if (m->loop[a] == perm[j]) ax[k].stride += st[a];
        k++;
    }
    cg_load_open(c->out, x);
    cg_put(c, "v%d[", x->id);
    if (off > 0) cg_put(c, "%" PRId64 " + ", off);
    cg_index_expr(c->out, "i", ax, k, c->inner);
    if (off < 0) cg_put(c, " - %" PRId64, -off);
    cg_put(c, "]");
    cg_load_close(c->out, x);
}

static void read_view(Cg *c, const IrNode *x, const IrNode *n, const ViewMap *m);

/* The loop's coordinate along n's logical axis a is c, the inner index of a two-level loop. */
static int coord_is_inner(const Cg *c, const IrNode *n, int a) {
    int perm[IR_MAX_RANK];
    if (!c->inner || a < 0) return 0;
    cg_phys_order(n, perm);
    for (int j = n->shape.rank - 1; j >= 0; j--)
        if (n->shape.dim[perm[j]] > 1) return perm[j] == a && n->shape.dim[a] == c->inner;
    return 0;
}

/* A choice along n's axis a whose side changes where the loop's coordinate reaches `at`: -1 when
 * the loop's part of c (seg_lo, seg_hi) lies wholly before `at`, 1 wholly at or after it, 0 when
 * it must be tested; when cuts are being gathered, `at` is one. */
static int side_of(Cg *c, const IrNode *n, int a, int64_t at) {
    if (!coord_is_inner(c, n, a)) return 0;
    if (c->cuts && at > 0 && at < c->inner) {
        int k = 0;
        while (k < c->n_cuts && c->cuts[k] != at) k++;
        if (k == c->n_cuts && k < CG_MAX_CUTS) c->cuts[c->n_cuts++] = at;
    }
    if (c->seg_hi <= c->seg_lo) return 0;
    return c->seg_hi <= at ? -1 : c->seg_lo >= at ? 1 : 0;
}

/* `coordinate < bound ? below : at or above` along axis a of a view, with `above` read with the
 * coordinate less `bound` there; decided here when the coordinate is a constant. */
static void read_split(Cg *c, const IrNode *below, const IrNode *above, int a, int64_t bound, const IrNode *n,
                       const ViewMap *m) {
    ViewMap mb = *m;
    mb.shift[a] -= bound;
    int side = m->loop[a] < 0 ? (m->shift[a] < bound ? -1 : 1) : side_of(c, n, m->loop[a], bound - m->shift[a]);
    if (side) {
        read_view(c, side < 0 ? below : above, n, side < 0 ? m : &mb);
        return;
    }
    cg_put(c, "(");
    loop_coord(c, n, m->loop[a]);
    cg_put(c, " < %" PRId64 " ? ", bound - m->shift[a]);
    read_view(c, below, n, m);
    cg_put(c, " : ");
    read_view(c, above, n, &mb);
    cg_put(c, ")");
}

/* The element of x that a loop over n reads under the map m, through x's folded views. */
static void read_view(Cg *c, const IrNode *x, const IrNode *n, const ViewMap *m) {
    if (x->storage != ST_FOLDED) {
        read_stored(c, x, n, m);
        return;
    }
    ViewMap mu = *m;
    int a = x->attr.axis;
    switch (x->op) {
    case OP_PERMUTE: /* x's axis i is its operand's axis perm[i] */
        for (int i = 0; i < x->shape.rank; i++) mu.loop[x->attr.perm[i]] = m->loop[i], mu.shift[x->attr.perm[i]] = m->shift[i];
        read_view(c, x->in[0], n, &mu);
        break;
    case OP_SLICE: /* x's element k along a is its operand's start + k */
        mu.shift[a] += x->attr.start;
        read_view(c, x->in[0], n, &mu);
        break;
    case OP_CONCAT: /* the first operand's elements along a, then the second's */
        read_split(c, x->in[0], x->in[1], a, x->in[0]->shape.dim[a], n, m);
        break;
    case OP_SLICE_BWD: { /* dy's elements at start .. start + len along a, zeros around them */
        int64_t lo = x->attr.start, hi = lo + x->in[0]->shape.dim[a];
        mu.shift[a] -= lo;
        int64_t from = lo - m->shift[a]; /* the loop's coordinate where dy starts */
        int inside = -1; /* whether the loop's elements all lie in dy (1), none do (0), or either (-1) */
        if (m->loop[a] < 0) inside = m->shift[a] >= lo && m->shift[a] < hi;
        else {
            int start = side_of(c, n, m->loop[a], from), end = side_of(c, n, m->loop[a], from + hi - lo);
            if (start < 0 || end > 0) inside = 0;
            else if (start > 0 && end < 0) inside = 1;
        }
        if (inside >= 0) {
            if (inside) read_view(c, x->in[0], n, &mu);
            else cg_put(c, "0.0f");
            break;
        }
        cg_put(c, "((uint64_t)(");
        loop_coord(c, n, m->loop[a]);
        if (from) cg_put(c, " %c %" PRId64, from > 0 ? '-' : '+', from > 0 ? from : -from);
        cg_put(c, ") < %" PRId64 " ? ", hi - lo); /* from <= coordinate < from + len, in one test */
        read_view(c, x->in[0], n, &mu);
        cg_put(c, " : 0.0f)");
        break;
    }
    default: ICE("codegen: %%%d = %s folded", x->id, ir_op_name(x->op));
    }
}

/* A folded operand x of element-wise node n at n's element i. */
static void read_folded(Cg *c, const IrNode *x, const IrNode *n) {
    ViewMap m;
    int lead = n->shape.rank - x->shape.rank;
    for (int a = 0; a < x->shape.rank; a++) m.loop[a] = x->shape.dim[a] == 1 ? -1 : lead + a, m.shift[a] = 0;
    read_view(c, x, n, &m);
}

/* Call f on each value with storage that reading x reads: x, or through a folded x its
 * operands'. */
static void for_each_read(Cg *c, const IrNode *x, void (*f)(Cg *c, const IrNode *x)) {
    if (x->storage != ST_FOLDED) f(c, x);
    else
        for (int k = 0; k < x->n_in; k++) for_each_read(c, x->in[k], f);
}

static void declare_stored(Cg *c, const IrNode *x) {
    if (x->storage != ST_INLINE) cg_declare(c, x);
}

void cg_declare_read(Cg *c, const IrNode *x) { for_each_read(c, x, declare_stored); }

int64_t cg_read_numel(const IrNode *x) {
    if (x->storage != ST_FOLDED) return ir_numel(&x->shape);
    int64_t m = 0;
    for (int k = 0; k < x->n_in; k++) {
        int64_t e = cg_read_numel(x->in[k]);
        if (e > m) m = e;
    }
    return m;
}

/* Operand x of element-wise node n at output index i, as a float (raw: in x's own type). */
void cg_elem_as(Cg *c, const IrNode *x, const IrNode *n, int raw) {
    FILE *o = c->out;
    if (x->storage == ST_INLINE) {
        cg_lit(o, cg_const_value(x));
        return;
    }
    if (c->group && x->group == c->group) { /* computed earlier in this iteration */
        cg_put(c, "t%d", x->id);
        return;
    }
    if (x->storage == ST_FOLDED) { /* float32, like everything under it */
        read_folded(c, x, n);
        return;
    }
    if (!raw) cg_load_open(o, x);
    CgAxis quad[IR_MAX_RANK * 2];
    if (c->vec && c->vec[x->id] && cg_quad_axes(x, n, quad)) { /* loaded four at a time (cuda.c) */
        cg_put(c, "l%d.e[j]", x->id);
    } else {
        CgAxis ax[IR_MAX_RANK];
        int k = cg_broadcast_axes(x, n, ax);
        cg_put(c, "v%d[", x->id);
        cg_index_expr(o, "i", ax, k, c->inner);
        cg_put(c, "]");
    }
    if (!raw) cg_load_close(o, x);
}

void cg_elem(Cg *c, const IrNode *x, const IrNode *n) { cg_elem_as(c, x, n, 0); }

/* f(a), f(a, b), f(a, b, c) over the node's operands. */
static void call(Cg *c, const char *f, const IrNode *n) {
    cg_put(c, "%s(", f);
    for (int k = 0; k < n->n_in; k++) {
        if (k) cg_put(c, ", ");
        cg_elem(c, n->in[k], n);
    }
    cg_put(c, ")");
}

static void infix(Cg *c, const IrNode *n, const char *op) {
    cg_elem(c, n->in[0], n);
    cg_put(c, " %s ", op);
    cg_elem(c, n->in[1], n);
}

/* The row-major (logical) position of element i of n, as an index expression. */
static void logical_index(Cg *c, const IrNode *n) {
    IrNode logical = *n;
    logical.layout = LAYOUT_ROW_MAJOR;
    CgAxis ax[IR_MAX_RANK];
    int k = cg_broadcast_axes(&logical, n, ax);
    cg_index_expr(c->out, "i", ax, k, c->inner);
}

static void dropout(Cg *c, const IrNode *n) {
    if (c->eval) {
        cg_elem(c, n->in[0], n);
        return;
    }
    int k = c->at_slot ? c->at_slot(c, NULL, n->attr.seed_id) : -1;
    if (k >= 0) cg_put(c, "rt_dropout_keep(ctx->seed, (int)at.o[%d], ", k);
    else cg_put(c, "rt_dropout_keep(ctx->seed, %d, ", n->attr.seed_id);
    logical_index(c, n); /* the mask follows the logical element, whatever the layout */
    cg_put(c, ", ");
    cg_dbl(c->out, n->attr.p);
    cg_put(c, ") ? ");
    cg_elem(c, n->in[0], n);
    cg_put(c, " * ");
    cg_lit(c->out, 1.0 / (1.0 - n->attr.p));
    cg_put(c, " : 0.0f");
}

/* The channel (axis 1) of element i of n, as an index expression. */
static void chan(Cg *c, const IrNode *n) {
    IrNode per_c = {.shape = {.rank = n->shape.rank - 1}};
    per_c.shape.dim[0] = n->shape.dim[1];
    for (int a = 1; a < per_c.shape.rank; a++) per_c.shape.dim[a] = 1;
    CgAxis ax[IR_MAX_RANK];
    int k = cg_broadcast_axes(&per_c, n, ax);
    cg_index_expr(c->out, "i", ax, k, c->inner);
}

/* v<id>[c] for a per-channel operand [C]: read along the channel axis, not broadcast. */
static void chan_elem(Cg *c, const IrNode *n, const IrNode *x) {
    cg_put(c, "v%d[", x->id);
    chan(c, n);
    cg_put(c, "]");
}

/* x normalised: (x - mean[c]) * invstd[c] */
static void xhat(Cg *c, const IrNode *n) {
    cg_put(c, "(");
    cg_elem(c, n->in[0], n);
    cg_put(c, " - ");
    chan_elem(c, n, n->in[1]);
    cg_put(c, ") * ");
    chan_elem(c, n, n->in[2]);
}

static void bn_apply(Cg *c, const IrNode *n) {
    if (c->eval && c->fold[n->in[0]->id] == ir_bn_stats(n)) { /* the scale is in the weights */
        cg_elem(c, n->in[0], n);
        cg_put(c, " + fold_b%d[", n->in[0]->id);
        chan(c, n);
        cg_put(c, "]");
        return;
    }
    xhat(c, n);
    cg_put(c, " * ");
    chan_elem(c, n, n->in[3]);
    cg_put(c, " + ");
    chan_elem(c, n, n->in[4]);
}

/* weight * invstd * (dy - (sum(dy) + xhat * sum(dy * xhat)) / M) */
static void bn_bwd_data(Cg *c, const IrNode *n) {
    chan_elem(c, n, n->in[3]);
    cg_put(c, " * ");
    chan_elem(c, n, n->in[2]);
    cg_put(c, " * (");
    cg_elem(c, n->in[6], n);
    cg_put(c, " - (");
    chan_elem(c, n, n->in[4]);
    cg_put(c, " + ");
    xhat(c, n);
    cg_put(c, " * ");
    chan_elem(c, n, n->in[5]);
    cg_put(c, ") * ");
    cg_lit(c->out, (double)n->shape.dim[1] / (double)ir_numel(&n->shape));
    cg_put(c, ")");
}

/* where(c, a, b): c tested against zero in its own type. */
static void where(Cg *c, const IrNode *n) {
    const IrNode *cond = n->in[0];
    cg_put(c, "(");
    cg_elem_as(c, cond, n, !ir_dtype_is_half(cond->dtype));
    cg_put(c, " != 0 ? ");
    cg_elem(c, n->in[1], n);
    cg_put(c, " : ");
    cg_elem(c, n->in[2], n);
    cg_put(c, ")");
}

/* An operand of a comparison: a float one as a float, an integer one in its own type (exact;
 * a constant as a double literal, which C compares exactly with any integer below 2^53). */
static void cmp_operand(Cg *c, const IrNode *x, const IrNode *n) {
    if (ir_dtype_is_float(x->dtype)) cg_elem(c, x, n);
    else if (x->storage == ST_INLINE) cg_dbl(c->out, cg_const_value(x));
    else cg_elem_as(c, x, n, 1);
}

/* The integer value of a comparison (0 or 1) or an iota at index i. */
static void int_expr(Cg *c, const IrNode *n) {
    static const char *const ops[] = {[OP_EQ] = "==", [OP_NE] = "!=", [OP_LT] = "<",
                                      [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    if (n->op == OP_IOTA) { /* the coordinate along attr.axis */
        loop_coord(c, n, n->attr.axis);
        return;
    }
    if (!ir_op_is_compare(n->op)) ICE("codegen: integer %s", ir_op_name(n->op));
    cmp_operand(c, n->in[0], n);
    cg_put(c, " %s ", ops[n->op]);
    cmp_operand(c, n->in[1], n);
}

/* The float expression of one element-wise node at index i. */
void cg_ew_expr(Cg *c, const IrNode *n) {
    switch (n->op) {
    case OP_ADD: infix(c, n, "+"); break;
    case OP_SUB: infix(c, n, "-"); break;
    case OP_MUL: infix(c, n, "*"); break;
    case OP_DIV: infix(c, n, "/"); break;
    case OP_NEG: /* -(x): a negative literal after '-' would read as '--' */
        cg_put(c, "-(");
        cg_elem(c, n->in[0], n);
        cg_put(c, ")");
        break;
    case OP_RELU: call(c, "relu", n); break;
    case OP_SIGMOID: call(c, "sigmoid", n); break;
    case OP_TANH: call(c, "rt_tanhf", n); break;
    case OP_GELU: call(c, "gelu", n); break;
    case OP_GELU_TANH: call(c, "gelu_tanh", n); break;
    case OP_SILU: call(c, "silu", n); break;
    case OP_EXP: call(c, "rt_expf", n); break;
    case OP_LOG: call(c, "logf", n); break;
    case OP_SQRT: call(c, "sqrtf", n); break;
    case OP_SIN: call(c, "sinf", n); break;
    case OP_COS: call(c, "cosf", n); break;
    case OP_LOG1P: call(c, "log1pf", n); break;
    case OP_EXPM1: call(c, "expm1f", n); break;
    case OP_CAST:
    case OP_DETACH:
    case OP_EXPAND:
    case OP_LAYOUT: cg_elem(c, n->in[0], n); break;
    case OP_DROPOUT:
    case OP_DROPOUT_GRAD: dropout(c, n); break;
    case OP_BCE_LOGITS: call(c, "bce_logits", n); break;
    case OP_RELU_GRAD: call(c, "relu_grad", n); break;
    case OP_SIGMOID_GRAD: call(c, "sigmoid_grad", n); break;
    case OP_TANH_GRAD: call(c, "tanh_grad", n); break;
    case OP_GELU_GRAD: call(c, "gelu_grad", n); break;
    case OP_GELU_TANH_GRAD: call(c, "gelu_tanh_grad", n); break;
    case OP_SILU_GRAD: call(c, "silu_grad", n); break;
    case OP_BCE_LOGITS_GRAD: call(c, "bce_logits_grad", n); break;
    case OP_BN_APPLY: bn_apply(c, n); break;
    case OP_BN_BWD_DATA: bn_bwd_data(c, n); break;
    case OP_WHERE: where(c, n); break;
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: /* 0 or 1, in a group's float */
        int_expr(c, n);
        break;
    default: ICE("codegen: %s is not element-wise", ir_op_name(n->op));
    }
}

/* The comments and pointer declarations of a group's members, before its loop. */
void cg_group_header(Cg *c, const IrNode *head) {
    const IrNode *n;
    c->done[head->group] = 1;
    FOR_MEMBERS(n, head) {
        cg_comment(c, n);
        if (!n->internal) cg_declare(c, n);
    }
}

/* Another member of head's group reads x. */
static int read_in_group(const Cg *c, const IrNode *head, const IrNode *x) {
    const IrNode *n;
    FOR_MEMBERS(n, head)
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == x) return 1;
    return 0;
}

/* The body of a group's loop at index i: each member a local t<id>, stored only when
 * something outside the group reads it. */
void cg_group_body(Cg *c, const IrNode *head) {
    const IrNode *n;
    c->group = head->group;
    FOR_MEMBERS(n, head) {
        if (ir_dtype_is_half(n->dtype)) { /* a cast to a half type: t, if read, is the rounded value */
            const char *h = ir_dtype_name(n->dtype);
            cg_begin(c, "const uint16_t h%d = rt_f32_to_%s(", n->id, h);
            cg_ew_expr(c, n);
            cg_end(c, ");");
            if (read_in_group(c, head, n)) cg_line(c, "const float t%d = rt_%s_to_f32(h%d);", n->id, h, n->id);
            if (n->internal) continue;
            if (c->vec) cg_line(c, "s%d.e[j] = h%d;", n->id, n->id);
            else cg_line(c, "v%d[i] = h%d;", n->id, n->id);
            continue;
        }
        cg_begin(c, "const float t%d = ", n->id);
        cg_ew_expr(c, n);
        cg_end(c, ";");
        if (n->internal) continue;
        if (c->vec) cg_line(c, "s%d.e[j] = t%d;", n->id, n->id);
        else cg_line(c, "v%d[i] = t%d;", n->id, n->id);
    }
    c->group = 0;
}

/* The memory plan put p's gradient (or the node its view chain reads) at its place in ctx->grads. */
int cg_in_place(const IrParam *p) {
    const IrNode *r = ir_storage_root(p->grad);
    return r->storage == ST_GRAD && r->offset == p->grad_offset;
}

/* A trainable parameter's gradient is copied from its node's pointer at the end of the step. */
int cg_needs_copy(const IrParam *p) {
    return p->trainable && p->grad && p->grad->storage != ST_INLINE && !cg_in_place(p);
}

static void mark_read(Cg *c, const IrNode *x) {
    if (!x->internal) c->read[x->id] = 1; /* a fused group reads its own members from locals */
}

/* Mark the values whose pointer the function uses: operands of the computing nodes in
 * [0, end), the loss and accuracy, and gradients copied at the end. A view is declared with
 * its root's storage, so it does not use its operand's pointer; a folded node's readers read
 * its operands. */
void cg_mark_reads(Cg *c, int end, int with_grads) {
    const IrGraph *g = c->g;
    memset(c->read, 0, (size_t)g->n + 1);
    memset(c->decl, 0, (size_t)g->n + 1);
    memset(c->done, 0, (size_t)g->n_groups + 1);
    for (int i = 0; i < end; i++) {
        const IrNode *n = g->nodes[i];
        if (ir_op_kind(n->op) == OPK_VIEW || n->storage == ST_FOLDED) continue;
        for (int k = 0; k < n->n_in; k++) for_each_read(c, n->in[k], mark_read);
    }
    c->read[g->loss->id] = 1;
    if (g->correct) c->read[g->correct->id] = 1;
    if (g->output) c->read[g->output->id] = 1;
    for (int i = 0; with_grads && i < g->n_params; i++)
        if (cg_needs_copy(&g->params[i])) c->read[g->params[i].grad->id] = 1;
}

int cg_state_slots(const IrTrain *t) { return rt_optimizer(t->optim)->slots(t->hyper); }

void cg_emit_optim_step(Cg *c, const IrTrain *t, const char *lr, const char *step, const char *hyper) {
    const RtOptimizer *opt = rt_optimizer(t->optim);
    const RtOptimParams *h = &t->hyper;
    cg_line(c, "// optimizer = %s(...): %s and %s in rt_recipe.h", opt->name, opt->step_fn, opt->update_fn);
    /* every hyperparameter, named in a comment and then valued, in RtOptimParams' order */
#define NAME(name)                  \
    cg_put(c, "%s" #name, sep);     \
    sep = ", ";
#define VALUE(name)                 \
    cg_put(c, "%s", sep);           \
    cg_dbl(c->out, h->name);        \
    sep = ", ";
    const char *sep = "";
    cg_begin(c, "// {");
    RT_OPTIM_PARAMS(NAME)
    cg_end(c, "}");
    cg_begin(c, "// the model's values, which the trainer's options may change: {");
    sep = "";
    RT_OPTIM_PARAMS(VALUE)
    cg_end(c, "}");
    cg_line(c, "const RtOptimParams h = %s;", hyper);
#undef NAME
#undef VALUE
    cg_line(c, "const RtOptimStep s = %s(h, %s, %s);", opt->step_fn, lr, step);
}

/* clip_grad_norm = C: the scale every gradient is multiplied by before the update, as the
 * float `clip`, from the gradients' 2-norm `norm` (a double expression). */
void cg_emit_clip_scale(Cg *c, const IrTrain *t, const char *norm) {
    cg_line(c, "// clip_grad_norm: torch.nn.utils.clip_grad_norm_ before the update, g *= min(C / (norm + 1e-6), 1)");
    cg_begin(c, "const float clip = rt_clip_scale(%s, ", norm);
    cg_dbl(c->out, t->clip_grad_norm);
    cg_end(c, ");");
}

void cg_emit_optim_no_decay(Cg *c, const IrTrain *t, const char *lr, const char *step) {
    cg_line(c, "// the parameters of no_decay: the same update without weight decay");
    cg_line(c, "RtOptimParams h_nd = h;");
    cg_line(c, "h_nd.weight_decay = 0;");
    cg_line(c, "const RtOptimStep s_nd = %s(h_nd, %s, %s);", rt_optimizer(t->optim)->step_fn, lr, step);
}

/* ---- the model description */

const char *const cg_init_enums[] = {
    [INIT_ZEROS] = "RT_INIT_ZEROS", [INIT_ONES] = "RT_INIT_ONES",
    [INIT_UNIFORM] = "RT_INIT_UNIFORM", [INIT_NORMAL] = "RT_INIT_NORMAL",
    [INIT_CONST] = "RT_INIT_CONST",
};
const char *const cg_dtype_enums[] = {
    [DT_F32] = "RT_F32", [DT_F16] = "RT_F16", [DT_BF16] = "RT_BF16",
    [DT_I32] = "RT_I32", [DT_I64] = "RT_I64", [DT_U8] = "RT_U8",
};
const char *const cg_sched_enums[] = {
    [SCHED_CONSTANT] = "RT_SCHED_CONSTANT", [SCHED_STEP] = "RT_SCHED_STEP", [SCHED_COSINE] = "RT_SCHED_COSINE",
    [SCHED_POLY] = "RT_SCHED_POLY",
};

void cg_dims(FILE *o, const IrShape *s, int from) {
    if (from >= s->rank) { /* a scalar: {} is not C11 */
        fprintf(o, "{0}");
        return;
    }
    fprintf(o, "{");
    for (int i = from; i < s->rank; i++) fprintf(o, "%s%" PRId64, i > from ? ", " : "", s->dim[i]);
    fprintf(o, "}");
}

/* The classes an input's values index when a loss or metric reads it as labels directly (the
 * logits' last axis; the fewest when several read it), else 0: the trainer checks its data
 * against this range when it loads the file. */
static int64_t input_classes(const IrGraph *g, const IrNode *input) {
    int64_t classes = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = g->nodes[i];
        int64_t c;
        if (n->op == OP_GATHER && n->in[1] == input) { /* token ids: the table's rows */
            c = n->in[0]->shape.dim[0];
        } else {
            if ((n->op != OP_XENT && n->op != OP_XENT_BWD && n->op != OP_ACCURACY) || n->in[1] != input) continue;
            if (n->attr.has_ignore) return 0; /* ignore_index may lie outside: the kernel checks the others */
            c = n->in[0]->shape.dim[n->in[0]->shape.rank - 1];
        }
        if (!classes || c < classes) classes = c;
    }
    return classes;
}

/* train { lora = ... }: the adapters as parameter indices, and PEFT's configuration. */
static void emit_lora(Cg *c, const IrLora *L) {
    const IrGraph *g = c->g;
    cg_open(c, "static const RtAdapter adapters[] = {");
    cg_line(c, "// base weight, lora_A, lora_B, base stored [in, out]");
    for (int k = 0; k < L->n_adapters; k++) {
        const IrAdapter *a = &L->adapters[k];
        cg_line(c, "{%d, %d, %d, %d}, // %s", a->base, a->a, a->b, g->params[a->base].dense == 2,
                g->params[a->base].name);
    }
    cg_close(c, "};");
    cg_begin(c, "static const char *const lora_targets[] = {");
    for (int i = 0; i < L->n_targets; i++) {
        cg_put(c, i ? ", " : "");
        cg_cstr(c->out, L->targets[i]);
    }
    cg_end(c, "};");
    cg_open(c, "static const RtLora lora = {");
    cg_begin(c, ".r = %d, .alpha = ", L->r);
    cg_dbl(c->out, L->alpha);
    cg_put(c, ", .dropout = ");
    cg_dbl(c->out, L->dropout);
    cg_end(c, ",");
    cg_line(c, ".n_targets = %d, .targets = lora_targets, .n_adapters = %d, .adapters = adapters,",
            L->n_targets, L->n_adapters);
    cg_close(c, "};");
    cg_blank(c);
}

void cg_emit_description(Cg *c) {
    const IrGraph *g = c->g;
    FILE *o = c->out;
    if (g->n_inputs) {
        cg_line(c, "// per-sample shapes: the batch axis is not counted; classes: the range of labels (0: none)");
        cg_open(c, "static const RtInput inputs[] = {");
        for (int i = 0; i < g->n_inputs; i++) {
            const IrNode *n = g->inputs[i].node;
            cg_begin(c, "{");
            cg_cstr(o, n->name);
            cg_put(c, ", %s, %d, ", cg_dtype_enums[n->dtype], n->shape.rank - 1);
            cg_dims(o, &n->shape, 1);
            cg_end(c, ", %" PRId64 "},", input_classes(g, n));
        }
        cg_close(c, "};");
        cg_blank(c);
    }
    if (g->n_params) {
        cg_open(c, "static const RtParam params[] = {");
        cg_line(c, "// name, rank, shape, offset, grad_offset, init, init_a, file dtype, buffer");
        for (int i = 0; i < g->n_params; i++) {
            const IrParam *p = &g->params[i];
            cg_begin(c, "{");
            cg_cstr(o, p->name);
            cg_put(c, ", %d, ", p->node->shape.rank);
            cg_dims(o, &p->node->shape, 0);
            cg_put(c, ", %" PRId64 ", %" PRId64 ", %s, ", p->offset, p->grad_offset, cg_init_enums[p->init]);
            cg_lit(o, p->init_a);
            cg_end(c, ", %s, %d},", cg_dtype_enums[p->file_dtype], p->buffer);
        }
        cg_close(c, "};");
        cg_blank(c);
    }
    if (g->lora.r) emit_lora(c, &g->lora);
}

/* The .schedule member of the RtModel initializer, on two lines. */
static void emit_schedule(Cg *c, const IrTrain *t) {
    static const char member[] = ".schedule = {";
    FILE *o = c->out;
    cg_begin(c, "%s.kind = %s, .base_lr = ", member, cg_sched_enums[t->sched]);
    cg_dbl(o, t->lr);
    cg_put(c, ", .warmup_epochs = ");
    cg_dbl(o, t->warmup_epochs);
    cg_put(c, ", .step_epochs = ");
    cg_dbl(o, t->step_epochs);
    cg_end(c, ",");
    cg_begin(c, "%*s.gamma = ", (int)strlen(member), ""); /* aligned under .kind */
    cg_dbl(o, t->gamma);
    cg_put(c, ", .min_lr = ");
    cg_dbl(o, t->min_lr);
    if (t->sched == SCHED_POLY) {
        cg_put(c, ", .power = ");
        cg_dbl(o, t->power);
    }
    if (!t->warmup_steps && !t->step_steps) {
        cg_end(c, "},");
        return;
    }
    cg_end(c, ",");
    cg_begin(c, "%*s.warmup_steps = ", (int)strlen(member), ""); /* in steps (only when given) */
    cg_dbl(o, t->warmup_steps);
    cg_put(c, ", .step_steps = ");
    cg_dbl(o, t->step_steps);
    cg_end(c, "},");
}

/* The RtModel initializer's members both targets write the same way: the model and its
 * buffers, up to the state slots. */
void cg_emit_model_head(Cg *c) {
    const IrGraph *g = c->g;
    cg_begin(c, ".name = ");
    cg_cstr(c->out, g->model_name);
    cg_end(c, ",");
    cg_begin(c, ".source = ");
    cg_cstr(c->out, g->source_path);
    cg_end(c, ",");
    cg_line(c, ".batch = %" PRId64 ",", g->batch);
    cg_line(c, ".n_inputs = %d,", g->n_inputs);
    cg_line(c, ".inputs = %s,", g->n_inputs ? "inputs" : "NULL");
    cg_line(c, ".n_params = %d,", g->n_params);
    cg_line(c, ".params = %s,", g->n_params ? "params" : "NULL");
    cg_line(c, ".n_param_floats = %" PRId64 ",", g->n_param_floats);
    cg_line(c, ".n_grad_floats = %" PRId64 ",", g->n_grad_floats);
    cg_line(c, ".n_state_slots = %d,", cg_state_slots(&g->train));
    if (g->n_half_params)
        cg_line(c, ".n_half_params = %" PRId64 ", .half_params_dtype = %s,", g->n_half_params,
                cg_dtype_enums[cg_half_params_dtype(g)]);
    if (g->lora.r) cg_line(c, ".lora = &lora,");
}

int64_t cg_half_params_from(const IrGraph *g) { return g->n_param_floats - g->n_half_params; }

IrDtype cg_half_params_dtype(const IrGraph *g) {
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i].node->dtype != DT_F32) return g->params[i].node->dtype;
    return DT_F32;
}

int cg_has_output(const IrGraph *g) {
    return g->output && g->output->shape.rank >= 1 && g->output->shape.dim[0] == g->batch;
}

/* The model's output, from `src` (its elements as the graph stores them, of its C type) into `dst`
 * (float *) as float32 in logical row-major order: converted from a half type, and a permuted
 * layout (channels-last) visited in its storage order and written back in logical order. */
void cg_emit_output_convert(Cg *c, const char *dst, const char *src) {
    const IrNode *y = c->g->output;
    static const char *const to_f32[DT__COUNT] = {[DT_F16] = "rt_f16_to_f32", [DT_BF16] = "rt_bf16_to_f32"};
    const char *conv = to_f32[y->dtype] ? to_f32[y->dtype] : y->dtype == DT_F32 ? "" : "(float)";
    const IrShape *s = &y->shape;
    if (y->layout.permuted && ir_layout_matters(s)) {
        cg_line(c, "int64_t k = 0; // %s's elements in storage order", src);
        for (int p = 0; p < s->rank; p++) {
            int a = y->layout.order[p];
            cg_line(c, "%*sfor (int64_t a%d = 0; a%d < %" PRId64 "; a%d++)", 4 * p, "", a, a, s->dim[a], a);
        }
        cg_begin(c, "%*s%s[", 4 * s->rank, "", dst);
        for (int a = 2; a < s->rank; a++) cg_put(c, "(");
        cg_put(c, "a0");
        for (int a = 1; a < s->rank; a++) cg_put(c, " * %" PRId64 " + a%d%s", s->dim[a], a, a < s->rank - 1 ? ")" : "");
        if (*conv) cg_end(c, "] = %s(%s[k++]);", conv, src);
        else cg_end(c, "] = %s[k++];", src);
    } else if (y->dtype == DT_F32) {
        cg_line(c, "memcpy(%s, %s, %" PRId64 " * sizeof(float));", dst, src, ir_numel(s));
    } else {
        cg_line(c, "for (int64_t i = 0; i < %" PRId64 "; i++) %s[i] = %s(%s[i]);", ir_numel(s), dst, conv, src);
    }
}

/* The inputs the output depends on, as a bit mask over input numbers. */
static uint32_t output_inputs(const IrGraph *g) {
    unsigned char *needs = calloc((size_t)g->n + 1, 1);
    uint32_t mask = 0;
    if (!needs) ICE("out of memory");
    needs[g->output->id] = 1;
    for (int i = g->n_fwd - 1; i >= 0; i--) { /* operands come before their users */
        const IrNode *n = g->nodes[i];
        if (!needs[n->id]) continue;
        if (n->op == OP_INPUT) mask |= 1u << n->index;
        for (int k = 0; k < n->n_in; k++) needs[n->in[k]->id] = 1;
    }
    free(needs);
    return mask;
}

/* The model's output for --predict: its per-sample shape and the inputs it reads. */
static void emit_output_desc(Cg *c) {
    const IrGraph *g = c->g;
    if (!cg_has_output(g)) {
        cg_line(c, ".output_rank = -1,");
        return;
    }
    const IrShape *s = &g->output->shape;
    cg_begin(c, ".output_rank = %d, .output_shape = {", s->rank - 1);
    for (int d = 1; d < s->rank; d++) fprintf(c->out, "%s%" PRId64, d > 1 ? ", " : "", s->dim[d]);
    cg_end(c, "}, .output_inputs = 0x%" PRIx32 ",", output_inputs(g));
}

/* ... and the training recipe: optimizer, schedule, epochs, logging, loss. */
void cg_emit_model_recipe(Cg *c) {
    const IrGraph *g = c->g;
    const IrTrain *t = &g->train;
    cg_line(c, ".optim = %s,", rt_optimizer(t->optim)->enum_name);
    emit_schedule(c, t);
    cg_line(c, ".epochs = %" PRId64 ",", t->epochs);
    if (t->steps) cg_line(c, ".steps = %" PRId64 ",", t->steps);
    if (t->clip_grad_norm > 0) {
        cg_begin(c, ".clip_grad_norm = ");
        cg_dbl(c->out, t->clip_grad_norm);
        cg_end(c, ",");
    }
    if (g->loss_scaling) cg_line(c, ".loss_scaling = 1, // --precision fp16: a dynamic loss scale on the device");
    if (t->target_accuracy > 0) {
        cg_begin(c, ".target_accuracy = ");
        cg_dbl(c->out, t->target_accuracy);
        cg_end(c, ",");
    }
    if (t->has_target_loss) {
        cg_begin(c, ".target_loss = ");
        cg_dbl(c->out, t->target_loss);
        cg_end(c, ", .has_target_loss = 1,");
    }
    cg_line(c, ".eval_every = %" PRId64 ",", t->eval_every);
    if (t->eval_every_steps) cg_line(c, ".eval_every_steps = %" PRId64 ",", t->eval_every_steps);
    cg_line(c, ".log_every = %" PRId64 ",", t->log_every);
    if (t->accumulate > 1) cg_line(c, ".accumulate = %" PRId64 ",", t->accumulate);
    cg_line(c, ".has_accuracy = %d,", g->correct != NULL);
    const IrNode *metric[IR_MAX_METRICS];
    const int n_metrics = ir_metrics(g, metric);
    if (n_metrics) {
        cg_begin(c, ".n_metrics = %d, .metric_top_k = {", n_metrics);
        for (int i = 0; i < n_metrics; i++)
            cg_put(c, "%s%d", i ? ", " : "", metric[i]->attr.top_k > 1 ? metric[i]->attr.top_k : 1);
        cg_end(c, "},");
    }
    const IrNode *acc = n_metrics ? metric[0] : NULL;
    if (acc && acc->attr.has_ignore) { /* the trainer counts the positions of the labels (every metric's) */
        const IrNode *lab = acc->in[1];
        while (lab->op == OP_CAST) lab = lab->in[0];
        if (lab->op != OP_INPUT) ICE("accuracy with ignore_index reads labels that are not an input");
        cg_line(c, ".metric_counts = 1, .metric_input = %d, .metric_ignore = %" PRId64 ",", lab->index,
                acc->attr.ignore_index);
    }
    cg_line(c, ".loss_name = \"%s\",", t->loss_name ? t->loss_name : "expression");
    emit_output_desc(c);
    cg_begin(c, ".hyper = {");
    const char *sep = "";
#define VALUE(name)                 \
    cg_put(c, "%s." #name " = ", sep); \
    cg_dbl(c->out, t->hyper.name);  \
    sep = ", ";
    RT_OPTIM_PARAMS(VALUE)
#undef VALUE
    cg_end(c, "},");
    if (g->distributed) {
        cg_line(c, ".comm = &rt_comm_mpi,");
        cg_line(c, ".n_buckets = %d,", g->n_buckets);
        cg_line(c, ".buckets = gradient_buckets,");
        if (g->shard_optimizer) cg_line(c, ".shard_optimizer = 1,");
    }
}

/* ---- a distributed step's gradient buckets (compiler/passes/buckets.c) */

void cg_emit_buckets(Cg *c) {
    const IrGraph *g = c->g;
    if (!g->distributed) return;
    cg_line(c, "// The gradients are summed over the ranks in these ranges of ctx->grads, each as soon as the");
    cg_line(c, "// backward pass has written it (rt_grads_ready); %" PRId64 " floats in all.", g->n_grad_floats);
    cg_open(c, "static const RtBucket gradient_buckets[%d] = {", g->n_buckets > 0 ? g->n_buckets : 1);
    for (int k = 0; k < g->n_buckets; k++)
        cg_line(c, "{%" PRId64 ", %" PRId64 "},", g->buckets[k].offset, g->buckets[k].count);
    if (!g->n_buckets) cg_line(c, "{0, 0},");
    cg_close(c, "};");
    cg_blank(c);
}

/* ---- prologue: header comment and the scalar helpers this model uses */

static const struct {
    IrOp op;
    const char *code;
} helpers[] = {
    {OP_RELU, "static inline float relu(float x) { return x < 0.0f ? 0.0f : x; }\n"},
    {OP_RELU_GRAD, "static inline float relu_grad(float y, float dy) { return y <= 0.0f ? 0.0f : dy; }\n"},
    {OP_SIGMOID, "// exp of a non-positive number only, so large |x| cannot overflow; rt_expf_nonpos (rt_bits.h)\n"
                 "// and no branch, so that the loop vectorizes\n"
                 "static inline float sigmoid(float x) {\n"
                 "    float e = rt_expf_nonpos(-fabsf(x));\n"
                 "    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);\n}\n"},
    {OP_SIGMOID_GRAD, "static inline float sigmoid_grad(float y, float dy) { return dy * y * (1.0f - y); }\n"},
    {OP_TANH_GRAD, "static inline float tanh_grad(float y, float dy) { return dy * (1.0f - y * y); }\n"},
    {OP_GELU, "// the exact GELU, x * Phi(x), as torch.nn.GELU(); rt_erff (rt_bits.h) vectorizes\n"
              "static inline float gelu(float x) { return 0.5f * x * (1.0f + rt_erff(x * 0.707106781f)); }\n"},
    {OP_GELU_GRAD, "// d/dx x * Phi(x) = Phi(x) + x * phi(x)\n"
                   "static inline float gelu_grad(float x, float dy) {\n"
                   "    float cdf = 0.5f * (1.0f + rt_erff(x * 0.707106781f));\n"
                   "    float pdf = 0.398942280f * rt_expf_nonpos(-0.5f * x * x);\n"
                   "    return dy * (cdf + x * pdf);\n}\n"},
    {OP_GELU_TANH, "// the tanh approximation of GELU, as torch.nn.GELU(approximate='tanh') (GPT-2's):\n"
                   "// 0.5 x (1 + tanh(u)) = x sigmoid(2u), one exp (rt_expf, which vectorizes) instead of\n"
                   "// libm's much slower tanhf (exp(-2u) = inf for very negative u gives x * 0, as tanh(u) = -1 does)\n"
                   "static inline float gelu_tanh(float x) {\n"
                   "    float u = 0.797884561f * (x + 0.044715f * (x * x * x));\n"
                   "    return x / (1.0f + rt_expf(-2.0f * u));\n}\n"},
    {OP_GELU_TANH_GRAD, "// d/dx gelu_tanh = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, t = tanh(u); with s = sigmoid(2u),\n"
                        "// 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s): s (1 + 2 x (1 - s) du/dx)\n"
                        "static inline float gelu_tanh_grad(float x, float dy) {\n"
                        "    float s = 1.0f / (1.0f + rt_expf(-1.595769122f * (x + 0.044715f * (x * x * x))));\n"
                        "    float du = 0.797884561f * (1.0f + 0.134145f * (x * x));\n"
                        "    return dy * (s * (1.0f + (2.0f * x) * ((1.0f - s) * du)));\n}\n"},
    {OP_SILU, "// x * sigmoid(x), exp of a non-positive number only, no branch (the loop vectorizes)\n"
              "static inline float silu(float x) {\n"
              "    float e = rt_expf_nonpos(-fabsf(x));\n"
              "    return (x >= 0.0f ? x : x * e) / (1.0f + e);\n}\n"},
    {OP_SILU_GRAD, "// d/dx x sigmoid(x) = s (1 + x (1 - s))\n"
                   "static inline float silu_grad(float x, float dy) {\n"
                   "    float e = rt_expf_nonpos(-fabsf(x)), s = (x >= 0.0f ? 1.0f : e) / (1.0f + e);\n"
                   "    return dy * (s * (1.0f + x * (1.0f - s)));\n}\n"},
    {OP_BCE_LOGITS, "// binary cross-entropy of a logit, stable for large |x|: max(x, 0) - x t + log(1 + e^-|x|)\n"
                    "static inline float bce_logits(float x, float t) {\n"
                    "    return fmaxf(x, 0.0f) - x * t + log1pf(rt_expf_nonpos(-fabsf(x)));\n}\n"},
    {OP_BCE_LOGITS_GRAD, "static inline float bce_logits_grad(float x, float t, float dy) {\n"
                         "    float e = rt_expf_nonpos(-fabsf(x)), s = (x >= 0.0f ? 1.0f : e) / (1.0f + e);\n"
                         "    return dy * (s - t);\n}\n"},
};

/* A helper's code with its declarations qualified for the backend (c->fn_qual; in C always
 * inlined, as rt_bits.h's functions are: the loop that calls a helper vectorises only if it is
 * inlined, which GCC's -O2 heuristics do not promise for the larger ones). */
static void put_helper(Cg *c, const char *code) {
    static const char plain[] = "static inline ";
    const char *q = c->fn_qual ? c->fn_qual : "static inline __attribute__((always_inline)) ";
    for (const char *at; (at = strstr(code, plain)); code = at + sizeof plain - 1) {
        fwrite(code, 1, (size_t)(at - code), c->out);
        fputs(q, c->out);
    }
    fputs(code, c->out);
}

void cg_emit_helpers(Cg *c) {
    const IrGraph *g = c->g;
    int any = 0;
    for (size_t h = 0; h < sizeof helpers / sizeof *helpers; h++)
        for (int i = 0; i < g->n; i++)
            if (g->nodes[i]->op == helpers[h].op) {
                if (!any++) cg_line(c, "// ---- element-wise functions");
                put_helper(c, helpers[h].code);
                break;
            }
    if (any) cg_blank(c);
}

/* `v<id>[i] = <the node's value at i>;` (v<id>[0] when `scalar`), converted to its dtype: a
 * half type by rounding, an integer by value (truncating). */
void cg_ew_store(Cg *c, const IrNode *n, int scalar) {
    if (c->vec) cg_begin(c, "s%d.e[j] = ", n->id);
    else cg_begin(c, "v%d[%s] = ", n->id, scalar ? "0" : "i"); /* a scalar's operands all index 0 */
    if (ir_dtype_is_half(n->dtype)) {
        cg_put(c, "rt_f32_to_%s(", ir_dtype_name(n->dtype));
        cg_ew_expr(c, n);
        cg_put(c, ")");
    } else if (n->op == OP_IOTA || ir_op_is_compare(n->op)) {
        cg_put(c, "(%s)(", ir_dtype_ctype(n->dtype));
        int_expr(c, n);
        cg_put(c, ")");
    } else if (!ir_dtype_is_float(n->dtype)) {
        if (n->op != OP_CAST && n->op != OP_EXPAND) ICE("codegen: integer %s", ir_op_name(n->op));
        cg_put(c, "(%s)", ir_dtype_ctype(n->dtype));
        cg_elem_as(c, n->in[0], n, !ir_dtype_is_half(n->in[0]->dtype));
    } else {
        cg_ew_expr(c, n);
    }
    cg_end(c, ";");
}

/* The loops of x summed down to n's shape (SUM_TO): `kept`, n's axes innermost first with x's
 * strides, and `red`, the axes broadcasting stretched, in x's physical order, innermost first. */
static void sum_to_axes(const IrNode *n, CgAxis kept[IR_MAX_RANK], int *nk, CgAxis red[IR_MAX_RANK], int *nr) {
    const IrNode *x = n->in[0];
    int xr = x->shape.rank, lead = xr - n->shape.rank;
    int perm[IR_MAX_RANK];
    int64_t st[IR_MAX_RANK];
    *nk = *nr = 0;
    cg_elem_strides(x, st);
    cg_phys_order(n, perm);
    for (int k = n->shape.rank - 1; k >= 0; k--)
        kept[(*nk)++] = (CgAxis){n->shape.dim[perm[k]], n->shape.dim[perm[k]] == 1 ? 0 : st[perm[k] + lead]};
    cg_phys_order(x, perm);
    for (int k = xr - 1; k >= 0; k--) {
        int a = perm[k];
        if (a < lead || n->shape.dim[a - lead] == 1) red[(*nr)++] = (CgAxis){x->shape.dim[a], st[a]};
    }
}

/* A SUM_TO's two index expressions, for both backends' loops: `const T *x = v<x> + ...;`, the
 * first of x's elements that output element `o` sums, and its j-th one, `x[...]` as a float. */
void cg_sum_to_base(FILE *o, const IrNode *n) {
    const IrNode *x = n->in[0];
    CgAxis kept[IR_MAX_RANK], red[IR_MAX_RANK];
    int nk, nr;
    sum_to_axes(n, kept, &nk, red, &nr);
    fprintf(o, "const %s *x = v%d + ", ir_dtype_ctype(x->dtype), x->id);
    cg_index_expr(o, "o", kept, nk, 0);
    fprintf(o, ";");
}

void cg_sum_to_elem(FILE *o, const IrNode *n) {
    const IrNode *x = n->in[0];
    CgAxis kept[IR_MAX_RANK], red[IR_MAX_RANK];
    int nk, nr;
    sum_to_axes(n, kept, &nk, red, &nr);
    cg_load_open(o, x);
    fprintf(o, "x[");
    cg_index_expr(o, "j", red, nr, 0);
    fprintf(o, "]");
    cg_load_close(o, x);
}

int cg_sum_to_rows(const IrNode *n) {
    CgAxis kept[IR_MAX_RANK], red[IR_MAX_RANK];
    int nk, nr;
    sum_to_axes(n, kept, &nk, red, &nr);
    int64_t stride = 1; /* what the next axis of extent above 1 must step by */
    for (int k = 0; k < nk + nr; k++) {
        const CgAxis *a = k < nk ? &kept[k] : &red[k - nk];
        if (a->dim == 1) continue;
        if (a->stride != stride) return 0;
        stride *= a->dim;
    }
    return 1;
}

int cg_conv_which(const IrNode *n) {
    switch (n->op) {
    case OP_CONV2D: return CG_CONV_FWD;
    case OP_CONV2D_BWD_DATA: return CG_CONV_BWD_DATA;
    case OP_CONV2D_BWD_FILTER: return CG_CONV_BWD_FILTER;
    default: ICE("codegen: %s is not a convolution", ir_op_name(n->op));
    }
}

void cg_axis_split(const IrShape *s, int axis, int64_t *outer, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++) *outer *= s->dim[i];
    for (int i = axis + 1; i < s->rank; i++) *inner *= s->dim[i];
}

void cg_pool_kind(const IrNode *n, int *max, int *bwd) {
    switch (n->op) {
    case OP_MAXPOOL2D: *max = 1, *bwd = 0; break;
    case OP_MAXPOOL2D_BWD: *max = 1, *bwd = 1; break;
    case OP_AVGPOOL2D: *max = 0, *bwd = 0; break;
    case OP_AVGPOOL2D_BWD: *max = 0, *bwd = 1; break;
    default: ICE("codegen: %s is not a pooling", ir_op_name(n->op));
    }
}

/* `static const RtConv NAME<id> = {...};`: the geometry of convolution node n (netrt.h), on two
 * lines. */
void cg_conv_geometry(Cg *c, const IrNode *n, const char *name) {
    int which = cg_conv_which(n);
    const IrShape *x = which == CG_CONV_BWD_DATA ? &n->shape : &n->in[0]->shape;
    const IrShape *w = which == CG_CONV_BWD_FILTER ? &n->shape : &n->in[1]->shape;
    const IrShape *y = which == CG_CONV_FWD ? &n->shape
                     : which == CG_CONV_BWD_DATA ? &n->in[0]->shape : &n->in[1]->shape;
    const IrAttrs *a = &n->attr;
    cg_line(c, "static const RtConv %s%d = {.N = %" PRId64 ", .C = %" PRId64 ", .H = %" PRId64 ", .W = %" PRId64
               ", .K = %" PRId64 ", .R = %" PRId64 ", .S = %" PRId64 ", .P = %" PRId64 ", .Q = %" PRId64 ",",
            name, n->id, x->dim[0], x->dim[1], x->dim[2], x->dim[3], w->dim[0], w->dim[2], w->dim[3], y->dim[2],
            y->dim[3]);
    c->depth++; /* the initializer's second line */
    cg_line(c, ".stride_h = %d, .stride_w = %d, .pad_h = %d, .pad_w = %d, .dil_h = %d, .dil_w = %d, .groups = %d};",
            a->stride[0], a->stride[1], a->pad[0], a->pad[1], a->dil[0], a->dil[1], a->groups);
    c->depth--;
}

double cg_attn_dropout(const Cg *c, const IrNode *n) { return c->eval ? 0 : n->attr.p; }

void cg_attention_dims(const IrNode *n, CgAttn *a) {
    const IrNode *m = n->op == OP_ATTENTION_MASKED ? n->in[3] : n->op == OP_ATTENTION_MASKED_BWD ? n->in[5] : NULL;
    IrShape s[3]; /* q, k, v as [..., T|S, d|e] */
    if (!ir_attention_qkv(n, s)) ICE("codegen: attention with operands it cannot read");
    const IrShape *q = &s[0], *k = &s[1], *v = &s[2];
    int r = q->rank;
    *a = (CgAttn){.T = q->dim[r - 2], .S = k->dim[r - 2], .D = q->dim[r - 1], .E = v->dim[r - 1], .n_lead = r - 2,
                  .BH = 1, .group = 1, .mask_node = m, .tokens = ir_attention_tokens(n)};
    for (int i = 0; i < r - 2; i++) a->lead[i] = q->dim[i], a->BH *= q->dim[i];
    if (r > 2) a->group = q->dim[r - 3] / k->dim[r - 3];
    for (int i = 0; i < 3; i++) /* an operand in the plain form: dense slices, row 0 */
        if (n->attr.attn_heads[i]) a->row[i] = n->in[i]->shape.dim[2], a->col[i] = n->attr.attn_col[i];
    if (a->tokens) a->row[3] = q->dim[1] * a->E;
    if (!m) return;
    a->mask = m->dtype == DT_U8 ? 2 : 1;
    int64_t stride = 1, st[IR_MAX_RANK] = {0};
    for (int i = m->shape.rank - 1; i >= 0; i--) {
        st[i] = m->shape.dim[i] == 1 ? 0 : stride; /* an axis of 1 broadcasts */
        stride *= m->shape.dim[i];
    }
    for (int ax = 0; ax < r; ax++) { /* the scores' axes, the mask right-aligned to them */
        int ma = ax - (r - m->shape.rank);
        int64_t s = ma < 0 ? 0 : st[ma];
        if (ax < r - 2) a->mask_lead[ax] = s;
        else if (ax == r - 2) a->mask_t = s;
        else a->mask_s = s;
    }
}

void cg_attention_operand(const IrNode *n, const CgAttn *a, int i, char *buf, size_t size) {
    if (a->tokens && a->col[i]) snprintf(buf, size, "v%d + %" PRId64, n->in[i]->id, a->col[i]);
    else snprintf(buf, size, "v%d", n->in[i]->id);
}

void cg_attention_grad(const IrNode *n, const CgAttn *a, int i, char *buf, size_t size) {
    int64_t at = ir_attention_grad_at(n, i) + (a->tokens ? a->col[i] : 0);
    if (at) snprintf(buf, size, "v%d + %" PRId64, n->id, at);
    else snprintf(buf, size, "v%d", n->id);
}

int cg_attention_zeroed(const IrNode *n, const CgAttn *a, int i) {
    if (!n->attr.attn_heads[i] || ir_attention_first(n, i) != i) return 0;
    int64_t covered = 0;
    for (int j = i; j < 3; j++)
        if (ir_attention_first(n, j) == i) covered += n->attr.attn_heads[j] * n->attr.attn_hdim[j];
    return covered < a->row[i];
}

/* The library kernels of both backends take float tensors (labels: int64) in the layouts
 * ir_operand_layout names; anything else is a compiler bug. */
void cg_check_lib_operands(const IrNode *n, const char *backend) {
    for (int k = 0; k <= n->n_in; k++) {
        const IrNode *x = k < n->n_in ? n->in[k] : n;
        IrLayout want;
        if (k < n->n_in && ir_operand_layout(n, k, &want) && !ir_stored_as(x, want))
            ICE("%s: %s on a tensor in another layout", backend, ir_op_name(n->op));
        if (x->dtype == DT_U8 && ir_op_lib(n->op) == LIB_ATTN) continue; /* a boolean mask */
        if (x->dtype != DT_F32 && x->dtype != DT_I64) ICE("%s: %s on %s", backend, ir_op_name(n->op), ir_dtype_name(x->dtype));
    }
}
