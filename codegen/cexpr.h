/* cexpr.h - what the C and CUDA backends share: literals, the index arithmetic of broadcast
 * and channels-last operands, pointers into the trainer's buffers, the float expression of every
 * element-wise operator, fused groups' bodies, and the model description rt_main reads.
 *
 * Both backends emit the same C expressions: a CPU loop and a CUDA kernel differ only in the
 * loop around them (an OpenMP loop, a grid-stride loop), so an element-wise operator has one
 * definition for both. The pointer expressions name `ctx->arena`, `ctx->params`,
 * `ctx->grads` and `ctx->inputs[k]`; the CPU step functions get `ctx` as their argument, a CUDA
 * kernel builds one from the arena's base address.
 */
#ifndef NETC_CEXPR_H
#define NETC_CEXPR_H

#include <stdio.h>

#include "ir.h"

typedef struct Cg {
    const IrGraph *g;
    FILE *out;
    int eval;               /* emitting eval_step: dropout is the identity */
    unsigned char *read;    /* read[id]: the function being emitted reads node id */
    unsigned char *decl;    /* decl[id]: v<id> is declared in the function being emitted */
    unsigned char *done;    /* done[group]: the fused group's loop is already emitted */
    int group;              /* the fused group whose loop is being emitted, or 0 */
    const IrNode **fold;    /* eval_step: fold[id] = the BN_STATS folded into convolution id */
    const char *fn_qual;    /* how the scalar helpers are declared: "static inline " (C) or with __device__ */
    int64_t inner;          /* the loop being emitted is two-level, i = r * inner + c (0: flat i) */
    int64_t seg_lo, seg_hi; /* CPU: a two-level loop's c runs over [seg_lo, seg_hi) (seg_hi 0: all of it);
                             * a folded view's choice along c is then made here where it can be */
    int64_t *cuts;          /* CPU, when set: the body is not kept, and each value of c where a
                             * folded view's choice along c changes is added here (CG_MAX_CUTS) */
    int n_cuts;
    int depth;              /* indentation of the next line, in levels of 4 spaces (cg_line) */
    const int *in_backward; /* CPU, forward_backward: the position after which the backward pass updates
                             * parameter i (in_backward[i]), -1 when optimizer_step does; or NULL */
    struct CgProf *prof;    /* CPU, --profile: forward_backward's pieces marked so far (cpu.c) */
    /* CUDA: the kernel being written finds what differs between nodes in its argument `at`
     * (RtKAt, cuda.c), or NULL. Then cg_declare's pointer to a node n is base + at.o[k] and a
     * dropout mask's seed id `number` is at.o[k], k = at_slot(c, n, 0) or at_slot(c, NULL,
     * number), a constant in the text where it returns -1. */
    int (*at_slot)(struct Cg *c, const IrNode *n, int64_t number);
    /* CUDA: the loop being emitted takes four adjacent elements a thread, i = 4 q + j, and
     * vec[id] says node id is read (an operand) or written (an output) four at a time, by one
     * 16-byte (half types: 8-byte) access outside the loop over j: the operand's value is
     * l<id>.e[j], the output's s<id>.e[j]. An operand so read lies in aligned runs of four
     * along the loop (cg_quad_axes). NULL: one element a thread, v<id>[i]. */
    const unsigned char *vec;
} Cg;

enum { CG_MAX_CUTS = 8 }; /* a two-level loop's inner loop is split in at most CG_MAX_CUTS + 1 */

typedef struct CgAxis {
    int64_t dim;    /* extent of this loop axis */
    int64_t stride; /* elements the operand moves per step along it; 0 = broadcast */
} CgAxis;

/* A fused group's members, in schedule order (constants between them are skipped). */
#define FOR_MEMBERS(n, head)                                                                       \
    for (int i_ = (head)->id; i_ < c->g->n &&                                                     \
                              (c->g->nodes[i_]->group == (head)->group || c->g->nodes[i_]->op == OP_CONST); \
         i_++)                                                                                     \
        if (((n) = c->g->nodes[i_])->group == (head)->group)

/* The batch-norm sums accumulated in a group's loop (fuse_reductions), in schedule order. */
#define FOR_SUMS(s, head)                                    \
    for (int j_ = (head)->id; j_ < c->g->n; j_++)            \
        if (((s) = c->g->nodes[j_])->fused_into == (head)->group)

/* ---- printing the generated code
 *
 * Every line is printed at c->depth levels of four spaces, so no emitter passes indentation
 * around. cg_line prints one whole line; cg_open prints a line that opens a block and indents
 * what follows; cg_close takes the indentation back and prints the closing line. A line made of
 * pieces starts with cg_begin (the indentation and the first piece), goes on with cg_put (or
 * cg_lit, cg_dbl, ... on c->out) and ends with cg_end (the last piece and the newline); a line
 * whose first or last piece another printer writes begins or ends with the format "%s" and "".
 * The format strings are printf's, without the newline. cg_blank prints an empty line, which
 * has no indentation. */
void cg_line(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_open(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_close(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_begin(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_put(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_end(Cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_blank(Cg *c);

/* Look-up tables from IR enums to the runtime's names. */
extern const char *const cg_init_enums[];
extern const char *const cg_dtype_enums[];
extern const char *const cg_sched_enums[];

double cg_const_value(const IrNode *n);
void cg_lit(FILE *o, double v);
void cg_dbl(FILE *o, double v);
void cg_cstr(FILE *o, const char *s);
void cg_comment_text(FILE *o, const char *s);
const char *cg_base_name(const char *path);
void cg_phys_order(const IrNode *n, int perm[IR_MAX_RANK]);
void cg_elem_strides(const IrNode *n, int64_t st[IR_MAX_RANK]);
void cg_index_expr(FILE *o, const char *var, const CgAxis *in, int n, int64_t inner);
int cg_broadcast_axes(const IrNode *x, const IrNode *out, CgAxis ax[IR_MAX_RANK]);
int cg_quad_axes(const IrNode *x, const IrNode *n, CgAxis quad[IR_MAX_RANK * 2]);
void cg_ptr(Cg *c, const IrNode *n);
void cg_declare(Cg *c, const IrNode *n);
void cg_comment(Cg *c, const IrNode *n);
void cg_load_open(FILE *o, const IrNode *x);
void cg_load_close(FILE *o, const IrNode *x);
void cg_elem_as(Cg *c, const IrNode *x, const IrNode *n, int raw);
void cg_elem(Cg *c, const IrNode *x, const IrNode *n);
/* Declare what reading operand x reads: x, or for a folded x (passes/views.c) the values under
 * it; and the largest of their element counts. */
void cg_declare_read(Cg *c, const IrNode *x);
int64_t cg_read_numel(const IrNode *x);
void cg_ew_expr(Cg *c, const IrNode *n);
void cg_group_header(Cg *c, const IrNode *head);
void cg_group_body(Cg *c, const IrNode *head);
int cg_in_place(const IrParam *p);
int cg_needs_copy(const IrParam *p);
void cg_mark_reads(Cg *c, int end, int with_grads);
int cg_state_slots(const IrTrain *t);
/* The graph has an output --predict can hand out: a value with the batch as its first axis. */
int cg_has_output(const IrGraph *g);
/* Its conversion to float32 in logical row-major order, from `src` (a pointer of its C type,
 * as the graph stores it) into the float * `dst`, for --predict. */
void cg_emit_output_convert(Cg *c, const char *dst, const char *src);
void cg_dims(FILE *o, const IrShape *s, int from);
void cg_emit_description(Cg *c);
/* The start of a step's optimizer update (rt_recipe.h): the hyperparameters as `h`, the value of
 * the C expression `hyper` (an RtOptimParams: the run's, which the trainer's options may have
 * changed; the model's values in a comment), and this step's constants as `s`, from the C
 * expressions `lr` and `step` (steps taken before it). */
void cg_emit_optim_step(Cg *c, const IrTrain *t, const char *lr, const char *step, const char *hyper);
/* After cg_emit_optim_step, for a model with no_decay parameters: `h_nd` and `s_nd`, the same
 * with weight_decay 0, for the range [n_decay_floats, n_grad_floats). */
void cg_emit_optim_no_decay(Cg *c, const IrTrain *t, const char *lr, const char *step);
/* With clip_grad_norm: `const float clip`, the factor rt_clip_scale gives for the gradients'
 * 2-norm `norm` (a double expression), which the update loop multiplies each gradient by. */
void cg_emit_clip_scale(Cg *c, const IrTrain *t, const char *norm);
/* The members of the RtModel initializer that every target writes alike, at c->depth: the
 * model and its buffers (.name .. .n_state_slots), and the recipe (.optim .. .loss_name). */
void cg_emit_model_head(Cg *c);
/* The first of the flat parameter buffer's values a device keeps in half (netc --frozen-half):
 * also the number it keeps in float32, all of them when there are none. */
int64_t cg_half_params_from(const IrGraph *g);
/* The type of the frozen parameters a device keeps in half (netc --frozen-half; IrGraph's
 * n_half_params), DT_F32 when there are none. */
IrDtype cg_half_params_dtype(const IrGraph *g);
void cg_emit_model_recipe(Cg *c);
/* --distributed: the table of gradient buckets the RtModel names (before it); nothing for a
 * trainer of one process. */
void cg_emit_buckets(Cg *c);
void cg_emit_helpers(Cg *c);
void cg_ew_store(Cg *c, const IrNode *n, int scalar);
void cg_sum_to_base(FILE *o, const IrNode *n);
void cg_sum_to_elem(FILE *o, const IrNode *n);
/* SUM_TO n adds, for its output o, x[j * out + o] over j (out: n's elements): the axes it sums
 * away all lie outside the kept ones in x's memory, and both are contiguous (a bias's gradient,
 * a channels-last per-channel sum). */
int cg_sum_to_rows(const IrNode *n);
void cg_conv_geometry(Cg *c, const IrNode *n, const char *name);
/* Which of the three convolutions n is (the runtimes' order); any other operator is a bug. */
enum { CG_CONV_FWD, CG_CONV_BWD_DATA, CG_CONV_BWD_FILTER };
int cg_conv_which(const IrNode *n);
/* An attention node's geometry (forward or backward): the BH slices (the leading axes lead[0,
 * n_lead) flattened), q [T, D], k [S, D], v [S, E]; mask 0 none, 1 f32 added, 2 u8 keep, read at
 * the strides mask_lead (leading axes), mask_t and mask_s, 0 where it broadcasts; group query
 * slices per key/value slice (grouped-query attention; 1 without). */
/* Attention node n's dropout probability in the step being emitted: attr.p in training, 0 in
 * eval_step (every probability is used there). */
double cg_attn_dropout(const Cg *c, const IrNode *n);
typedef struct CgAttn {
    int64_t BH, T, S, D, E, group;
    int n_lead;
    int64_t lead[IR_MAX_RANK], mask_lead[IR_MAX_RANK], mask_t, mask_s;
    int mask;
    const IrNode *mask_node;
    int tokens;       /* heads read from tokens (attr.attn_heads): the operands' rows are */
    int64_t row[4];   /* row[0..3] floats apart (q, k, v, out; 0: an operand in the plain form, */
    int64_t col[3];   /* dense slices) and q, k, v start at columns col[0..2] of them */
} CgAttn;
void cg_attention_dims(const IrNode *n, CgAttn *a);
/* The C expression for where operand i (q, k, v) of attention n starts ("v12", "v12 + 256"),
 * and for where its gradient starts in attention_bwd n's packed result. */
void cg_attention_operand(const IrNode *n, const CgAttn *a, int i, char *buf, size_t size);
void cg_attention_grad(const IrNode *n, const CgAttn *a, int i, char *buf, size_t size);
/* Whether attention_bwd n must zero the gradient of operand i's base first: its first operand
 * of that base, with columns that no operand's heads cover. */
int cg_attention_zeroed(const IrNode *n, const CgAttn *a, int i);

/* Which pooling n is: max or average, forward or backward; any other operator is a bug. */
void cg_pool_kind(const IrNode *n, int *max, int *bwd);
/* A tensor of shape s around its axis `axis`, as [outer, s->dim[axis], inner]: what the
 * kernels along an axis (slice, concat, max, softmax, log-softmax) index by. */
void cg_axis_split(const IrShape *s, int axis, int64_t *outer, int64_t *inner);
void cg_check_lib_operands(const IrNode *n, const char *backend);

#endif
