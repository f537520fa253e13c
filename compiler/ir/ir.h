/* ir.h - the netc intermediate representation.
 *
 * A training program is one IrGraph: a list of IrNodes in schedule order (every operand comes
 * before its user), each an SSA value with a shape, a dtype and a physical layout. Semantic
 * analysis emits the forward part; autodiff appends the backward part; the optimizer update is
 * described by graph->train and emitted by the backend as one loop over flat buffers.
 *
 *   nodes[0 .. n_fwd)      forward pass, loss and metrics (also the evaluation step)
 *   nodes[n_fwd .. n)      backward pass; each trainable parameter's gradient ends in its
 *                          IrParam.grad node
 *
 * Shapes are logical and follow PyTorch (NCHW, Linear weight [out,in]); `layout` says how the
 * elements are stored. The memory plan fills `storage`/`offset`.
 */
#ifndef NETC_IR_H
#define NETC_IR_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"
#include "rt_recipe.h" /* the optimizers and their hyperparameters, shared with the trainers */
#include "util.h"

typedef enum {
#define OP(e, name, arity, kind, attrs, layouts, shape, lib, meaning) OP_##e,
#include "ops.def"
#undef OP
    OP__COUNT
} IrOp;

typedef enum {
    OPK_SOURCE, /* no operands */
    OPK_EW,     /* element-wise with broadcasting */
    OPK_REDUCE, /* reduction */
    OPK_LIB,    /* library kernel */
    OPK_VIEW,   /* reinterpretation of the operand's storage */
} IrOpKind;

/* The kernel family a library operator is dispatched to by both backends. */
typedef enum {
    LIB_NONE,   /* not a library operator */
    LIB_MATMUL, /* MATMUL */
    LIB_CONV,   /* CONV2D and its two gradients */
    LIB_POOL,   /* max and average pooling, forward and backward */
    LIB_ROWS,   /* softmax, log-softmax, cross-entropy, accuracy, layer and RMS norm: per row
                 * of the last axis (softmax and log-softmax: of attr.axis) */
    LIB_BN,     /* batch-norm statistics and backward sums */
    LIB_AXES,   /* copies and reductions along chosen axes: permute, slice, concat, max */
    LIB_ATTN,   /* scaled dot-product attention and its gradient */
    LIB_INDEX,  /* gather (embedding rows) and its scatter-add gradient */
} IrLibClass;

/* The attributes an operator reads (ops.def's attrs column), one bit per IrAttrs field or pair
 * of fields, in the order --dump prints them. */
enum {
    ATTR_NONE = 0,
    ATTR_VALUE = 1 << 0,         /* scalar */
    ATTR_TRANS = 1 << 1,         /* trans_a, trans_b */
    ATTR_KERNEL = 1 << 2,        /* kernel */
    ATTR_STRIDE = 1 << 3,        /* stride */
    ATTR_PAD = 1 << 4,           /* pad */
    ATTR_DILATION = 1 << 5,      /* dil */
    ATTR_GROUPS = 1 << 6,        /* groups */
    ATTR_FILTER = 1 << 7,        /* filter */
    ATTR_DROPOUT = 1 << 8,       /* p, seed_id */
    ATTR_BATCH_MASKED = 1 << 9,  /* batch_masked */
    ATTR_BN = 1 << 10,           /* eps, momentum, stat_param */
    ATTR_ROW = 1 << 11,          /* row */
    ATTR_SMOOTHING = 1 << 12,    /* smoothing */
    ATTR_PERM = 1 << 13,         /* perm[IR_MAX_RANK]: permute */
    ATTR_AXIS = 1 << 14,         /* axis: slice, slice_bwd, concat, max, max_bwd, iota, softmax, log_softmax */
    ATTR_SLICE = 1 << 15,        /* start: slice, slice_bwd */
    ATTR_NORM = 1 << 16,         /* norm_eps: layernorm, rmsnorm and their gradients */
    ATTR_ATTN = 1 << 17,         /* causal, attn_scale */
    ATTR_IGNORE = 1 << 18,       /* has_ignore, ignore_index: xent, xent_bwd */
    ATTR_PART = 1 << 19,         /* part */
    ATTR_TOPK = 1 << 20,         /* top_k: accuracy */
    ATTR__END = 1 << 21,
    ATTR_CONV = ATTR_STRIDE | ATTR_PAD | ATTR_DILATION | ATTR_GROUPS,
    ATTR_POOL = ATTR_KERNEL | ATTR_STRIDE | ATTR_PAD,
};

/* Element types. The order matches RtDtype in runtime/netrt.h. */
typedef enum {
    DT_F32,  /* float */
    DT_F16,  /* IEEE half, stored as uint16_t */
    DT_BF16, /* bfloat16, stored as uint16_t */
    DT_I32,  /* int32_t */
    DT_I64,  /* int64_t */
    DT_U8,   /* uint8_t */
    DT__COUNT
} IrDtype;

enum { IR_MAX_RANK = 6, IR_MAX_OPERANDS = 8 };
enum { IR_MAX_METRICS = 4 }; /* metrics = [...]: RT_MAX_METRICS (runtime/netrt.h) */

/* A physical layout: the order in which a tensor's logical axes lie in memory, outermost first
 * (order[i] is the logical axis at physical position i, the last one fastest). Row-major is
 * the identity order and the zero value, whatever the rank; ir_layout() gives every order its
 * one value, so two layouts are the same order exactly when ir_layout_eq says so. Channels-
 * last is one case: [N,C,H,W] stored in the order N, H, W, C. */
typedef struct IrLayout {
    signed char permuted;           /* 0: row-major, and order[] is all zero */
    signed char order[IR_MAX_RANK]; /* a permutation of 0 .. rank-1, zero beyond */
} IrLayout;

#define LAYOUT_ROW_MAJOR ((IrLayout){0, {0}})         /* contiguous, last axis fastest (PyTorch's default) */
#define LAYOUT_NHWC ((IrLayout){1, {0, 2, 3, 1}})     /* rank-4 [N,C,H,W] stored channels-last */

/* Every tensor is at most 2^40 elements; larger shapes are a compile error (also keeps every
 * size computation far from int64 overflow). */
#define IR_MAX_NUMEL ((int64_t)1 << 40)

typedef struct IrShape {
    int rank;
    int64_t dim[IR_MAX_RANK];
} IrShape;

/* Operator attributes; each operator reads only the fields its ops.def line names (ATTR_*),
 * and the others keep their defaults: zero, groups 1. */
typedef struct IrAttrs {
    int kernel[2], stride[2], pad[2], dil[2]; /* conv2d/pooling, (h, w) */
    int groups;                               /* conv2d */
    IrLayout filter;                          /* conv2d, conv2d_bwd_data: the layout w is read in,
                                               * LAYOUT_NHWC = KRSC (set by the layout pass; a
                                               * conv2d_bwd_filter's filter is its own result) */
    int trans_a, trans_b;                     /* matmul */
    double scalar;                            /* const value */
    double p;                                 /* dropout probability */
    int seed_id;                              /* dropout: which mask (shared by forward and grad) */
    int batch_masked;                         /* mean: only the first n_valid rows count */
    double eps, momentum;                     /* batch norm (PyTorch's momentum convention) */
    int stat_param;                           /* bn_stats: index of running_mean; running_var
                                               * and num_batches_tracked follow it */
    int bn_frozen;                            /* bn_stats: the running statistics in training
                                               * too, never updated (batchnorm2d frozen=true) */
    int row;                                  /* row: which row of operand 0 */
    double smoothing;                         /* xent: label smoothing */
    int perm[IR_MAX_RANK];                    /* permute: output axis i is input axis perm[i] */
    int axis; /* the axis an operator works along (ATTR_AXIS) */
    int64_t start;                            /* slice, slice_bwd: the first index along axis */
    int causal; double attn_scale;            /* attention: key j > query i masked out; the
                                               * scores' factor (1/sqrt(d) by default) */
    int attn_heads[3];                        /* attention: q, k, v's heads read from tokens
                                               * (fold_attention_heads); 0: that operand in the
                                               * plain form; any nonzero: the result's heads
                                               * written side by side in tokens too */
    int64_t attn_hdim[3], attn_col[3];        /* ... their head sizes and first columns */
    int64_t part;                             /* part: element offset into operand 0 */
    int has_ignore;                           /* xent, xent_bwd: rows whose label is ignore_index */
    int64_t ignore_index;                     /* count for nothing (ATTR_IGNORE) */
    int top_k;                                /* accuracy: right when the label is among the
                                               * top_k largest logits; 0 (the default) as 1 */
    double norm_eps;                          /* layernorm, rmsnorm: added to the variance */
    int norm_params;                          /* layernorm_bwd, rmsnorm_bwd: the parameter gradients
                                               * packed after dx (grad_norm) */
} IrAttrs;

typedef enum {
    ST_NONE,   /* not planned yet */
    ST_ARENA,  /* offset bytes into the step's arena */
    ST_INPUT,  /* the runtime's batch buffer for input number `index` */
    ST_PARAM,  /* flat parameter buffer, element offset `offset` */
    ST_GRAD,   /* flat gradient buffer, element offset `offset` */
    ST_ALIAS,  /* the storage of operand 0 (views) */
    ST_INLINE, /* scalar constants: no storage, the value is written into the code */
    ST_FUSED,  /* a value inside a fused group that nothing outside it reads: never stored */
    ST_STATE,  /* LOSS_SCALE: the loss scale in the trainer's device state */
    ST_FOLDED, /* a permute, slice, slice_bwd or concat its element-wise readers read through: none */
} IrStorage;

typedef enum { PHASE_FWD, PHASE_BWD } IrPhase;

typedef struct IrNode IrNode;
struct IrNode {
    int id; /* value number, printed %id; index in graph->nodes after ir_renumber() */
    IrOp op;
    int n_in;
    IrNode *in[IR_MAX_OPERANDS];
    IrShape shape;
    IrDtype dtype;
    IrLayout layout;
    IrAttrs attr;
    IrPhase phase;
    SrcLoc loc;         /* the .net expression this came from */
    const char *name;   /* INPUT/PARAM: the input's or parameter's name; others may be NULL */
    int index;          /* INPUT: input number; PARAM: parameter number */
    int group;          /* fused element-wise group (1-based; 0 = none), set by fuse_elementwise */
    int internal;       /* read only inside its group: kept in a register, never stored */
    int epilogue;       /* MATMUL: the fused group applied to its output as it is produced
                         * (0 = none), set by fuse_epilogues */
    int fused_into;     /* BN_BWD_SUMS: accumulated in the loop of this fused group, which
                         * computes its dy (0 = its own kernel), set by fuse_reductions */
    int folded;         /* PERMUTE, SLICE, SLICE_BWD, CONCAT: no kernel and no storage, its
                         * element-wise readers read its operands in place, set by fold_views */
    /* filled by the memory plan */
    IrStorage storage;
    int64_t offset;     /* bytes for ST_ARENA, elements for ST_PARAM/ST_GRAD */
    int first_use, last_use; /* schedule positions where the value is defined / last read */
};

typedef enum { INIT_ZEROS, INIT_ONES, INIT_UNIFORM, INIT_NORMAL, INIT_CONST } IrInit;

typedef struct IrParam {
    const char *name; /* hierarchical: layer1.0.conv1.weight */
    IrNode *node;     /* the OP_PARAM node */
    IrNode *grad;     /* gradient node (set by autodiff); NULL when frozen or unused */
    int trainable;
    int no_decay;     /* trained without weight decay (train { no_decay = ... }) */
    int norm;         /* a normalization layer's weight or bias (no_decay = ["norms"]) */
    int buffer;       /* running statistics: saved and loaded like a parameter, never trained */
    int dense;        /* the weight of a dense layer, which LoRA may adapt: 1 stored [out, in],
                       * 2 transposed, [in, out] */
    IrDtype file_dtype; /* dtype in weight files (num_batches_tracked is i64); stored as f32 */
    IrInit init;
    double init_a;    /* uniform: bound (U(-a, a)); normal: standard deviation */
    int64_t offset;   /* element offset in the flat parameter buffer (memory plan) */
    int64_t grad_offset; /* element offset in the flat gradient buffer, -1 if frozen */
} IrParam;

typedef struct IrInput {
    const char *name;
    IrNode *node;
    SrcLoc loc;
} IrInput;

typedef enum { SCHED_CONSTANT, SCHED_STEP, SCHED_COSINE, SCHED_POLY } IrSchedKind;

/* The training recipe from the train { } section; units as in docs/language.md. */
typedef struct IrTrain {
    RtOptimKind optim;    /* a row of rt_recipe.h's table of optimizers */
    RtOptimParams hyper;  /* its hyperparameters (the others keep their defaults) */
    double lr;
    IrSchedKind sched;
    double warmup_epochs; /* linear warm-up from 0 over this many epochs (may be fractional) */
    double step_epochs;   /* SCHED_STEP: multiply by gamma every step_epochs epochs */
    double gamma;
    double min_lr;        /* SCHED_COSINE: the floor; SCHED_POLY: end_lr */
    int64_t epochs;
    int64_t eval_every;   /* epochs between evaluations */
    int64_t eval_every_steps; /* eval_every_steps = N: optimizer steps between evaluations instead (0: not given) */
    int64_t log_every;    /* steps between log lines */
    const char *loss_name; /* the loss's built-in (cross_entropy, mse, ...), or "expression" */
    int64_t steps;        /* steps = N: optimizer steps instead of epochs (0: not given) */
    double warmup_steps;  /* warmup_steps = N: the warm-up in steps instead of epochs (0: none) */
    double step_steps;    /* SCHED_STEP with every_steps: multiply by gamma every step_steps steps */
    double clip_grad_norm; /* clip_grad_norm = C: global-norm gradient clipping (0: off) */
    double power;         /* SCHED_POLY: the decay's exponent */
    int64_t accumulate;   /* accumulate = K: batches per optimizer step, the trainer's --accumulate
                           * default (0: not given) */
    double target_accuracy; /* target_accuracy = A: stop once an evaluation's first metric reaches A (0: none) */
    double target_loss;   /* target_loss = L: stop once an evaluation's loss is at most L (has_target_loss) */
    int has_target_loss;
} IrTrain;

/* A low-rank adapter (train { lora = ... }): parameter indices of the dense weight it adapts and
 * of its factors lora_A [r, in] and lora_B [out, r]. */
typedef struct IrAdapter {
    int base, a, b;
} IrAdapter;

/* LoRA fine-tuning: y = W x + (alpha / r) B A dropout(x) on the targeted dense layers, every
 * other parameter frozen (docs/language.md, "LoRA"). r == 0: none. */
typedef struct IrLora {
    int r;
    double alpha, dropout;
    const char **targets; /* module names, PEFT's target_modules */
    int n_targets;
    IrAdapter *adapters;  /* per target in the order given, its weights in parameter order */
    int n_adapters;
    SrcLoc loc;           /* the lora setting */
} IrLora;

/* A bucket of a distributed step's gradients (buckets.c): floats [offset, offset + count) of
 * the flat gradient buffer, whose sum over the ranks starts once schedule position `ready` has
 * run (g->n: after the whole backward pass). */
typedef struct IrBucket {
    int64_t offset, count;
    int ready;
} IrBucket;

typedef struct IrGraph {
    Arena *arena;
    const char *model_name;
    const char *source_path;
    int64_t batch;
    IrNode **nodes;
    int n, cap;
    int n_fwd;         /* nodes[0..n_fwd) are the forward pass */
    IrInput *inputs;
    int n_inputs;
    IrParam *params;
    int n_params;
    StrMap param_index; /* name -> 1 + its index in params */
    IrNode *loss;      /* scalar f32 */
    IrNode *correct;   /* scalar f32 count of correct predictions, or NULL without accuracy;
                        * with several metrics, f32[n] of their counts, joined by reshapes and
                        * concats (ir_metrics finds them) */
    IrNode *output;    /* the model's output: the value the loss function reads first (the
                        * logits, mse's prediction), which eval_step hands out; NULL when the
                        * loss is written without a loss function */
    IrTrain train;
    IrLora lora;
    int n_dropout;     /* seed ids handed out so far */
    int n_groups;      /* fused element-wise groups */
    /* filled by the memory plan */
    int64_t arena_bytes;       /* size of the planned arena */
    int64_t unplanned_bytes;   /* sum of every arena buffer without reuse */
    int64_t n_param_floats;    /* flat parameter buffer */
    int64_t n_half_params;     /* its last n_half_params values: frozen parameters that a device
                                * trainer keeps in the products' half type (netc --frozen-half;
                                * their OP_PARAM nodes have that dtype) */
    int64_t n_grad_floats;     /* flat gradient buffer = trainable parameters */
    int64_t n_decay_floats;    /* the first n_decay_floats of them are decayed, the rest (no_decay) not */
    int64_t scratch_per_thread; /* floats of per-thread scratch the library kernels need */
    /* netc --distributed (buckets.c): the trainer runs as several ranks and sums its gradients
     * over them in these buckets */
    int distributed;
    int64_t bucket_bytes;      /* the size a bucket is cut at */
    IrBucket *buckets;
    int n_buckets;
    int sync_bn;               /* --sync-bn: batch norm's training statistics and backward sums are
                                * summed over the ranks (runtime/rt_bn.c) */
    int shard_optimizer;       /* --shard-optimizer: each rank updates its slices of the buckets
                                * (ZeRO-1; runtime/rt_dist.c) */
    int profile;               /* --profile: the CPU step marks the end of each piece of its code
                                * (runtime/rt_prof.c) */
    int loss_scaling;          /* --precision fp16: the loss gradient is seeded with the dynamic
                                * loss scale (OP_LOSS_SCALE), set before autodiff */
} IrGraph;

/* ---- the operator table */
const char *ir_op_name(IrOp op);
int ir_op_arity(IrOp op);
IrOpKind ir_op_kind(IrOp op);
const char *ir_op_meaning(IrOp op);
IrLibClass ir_op_lib(IrOp op);  /* LIB_NONE unless op is a library kernel */
/* op computes in the layout of its operands, reading each in its own (pooling): a layout flows
 * through it as through an element-wise operator. */
int ir_op_follows_layout(IrOp op);
/* op is a comparison (eq, ne, lt, le, gt, ge): a u8 0/1 result from operands of one dtype. */
int ir_op_is_compare(IrOp op);
const char *ir_dtype_name(IrDtype dt);   /* "f32" */
const char *ir_dtype_ctype(IrDtype dt);  /* "float" */
int ir_dtype_size(IrDtype dt);
int ir_dtype_is_float(IrDtype dt);       /* f32, f16, bf16 */
int ir_dtype_is_half(IrDtype dt);        /* f16, bf16 */
int ir_dtype_from_name(const char *name, IrDtype *out); /* 0 if unknown */

/* ---- physical layouts */
/* Row-major and channels-last order the elements of shape s differently: rank 4 with more
 * than one channel and more than one pixel (NHWC of [N, C, 1, 1] is row-major). */
int ir_layout_matters(const IrShape *s);
/* The layout that stores a rank-`rank` tensor's axes in `order` (outermost first). */
IrLayout ir_layout(int rank, const int order[]);
int ir_layout_eq(IrLayout a, IrLayout b);
/* "row-major", "nhwc", or the order, "order=0,2,1,3", in buf (32 bytes hold any). */
const char *ir_layout_str(IrLayout l, char *buf, size_t size);
/* The logical axes of a rank-`rank` tensor stored in l, in physical order: order[] itself, or
 * 0 .. rank-1 for row-major. */
void ir_layout_order(IrLayout l, int rank, int order[IR_MAX_RANK]);
/* The layout of y = permute(x, perm) read from x's storage in place, x stored in lx: where x's
 * axis perm[i] lies, y's axis i lies. */
IrLayout ir_layout_permuted(IrLayout lx, int rank, const int perm[]);
/* The layout of y (shape `y`) = reshape(x) read from x's storage in place, x (shape `x`) stored
 * in lx, in *ly; 0 when x's bytes do not lie so: each run of x's axes that y merges into one (or
 * one that it splits) must lie side by side in x's storage, in their logical order. An
 * [N,C,H,W] value stored channels-last reshaped to [N,C,H*W] lies in the order N, H*W, C. */
int ir_layout_reshaped(IrLayout lx, const IrShape *x, const IrShape *y, IrLayout *ly);
/* The layout of a view node n (ops.def's result letter p: permute_view, reshape) read in place
 * from its operand's storage as that is stored now; 0 when it cannot be (a reshape, see
 * ir_layout_reshaped). */
int ir_view_layout(const IrNode *n, IrLayout *out);
/* x's elements lie in memory as they would in `layout` (an order of x's axes: LAYOUT_NHWC only
 * at rank 4): the same order once x's axes of extent 1 are left out (so any layout when at most
 * one axis is longer than 1). */
int ir_stored_as(const IrNode *x, IrLayout layout);
/* The node whose storage n reads: n itself, or for a view (ST_ALIAS after the memory plan) the
 * value it ultimately aliases. */
const IrNode *ir_storage_root(const IrNode *n);
/* Whether n reads its operand k in one layout, *want (see ir_stored_as), or as it lies (0:
 * element-wise operators index through strides in any order; reductions and batch norm take
 * row-major or channels-last; a reshape any order it can be read in): ops.def's layouts column
 * applied to n and its operand's present layout. */
int ir_operand_layout(const IrNode *n, int k, IrLayout *want);
/* n reads its operand k channels-last (a convolution's activations or KRSC filter). */
int ir_operand_nhwc(const IrNode *n, int k);
/* Convolution node n (forward, data or filter gradient) may run channels-last: not a strided
 * 1x1 convolution whose input channels per group are not a multiple of 8, for which oneDNN
 * 2.6's AVX2 channels-last weight-gradient kernel writes out of bounds (oneDNN issue 6035). */
int ir_conv_nhwc_ok(const IrNode *n);

/* ---- shapes */
int64_t ir_numel(const IrShape *s);
int ir_shape_eq(const IrShape *a, const IrShape *b);
IrShape ir_shape(int rank, ...); /* ir_shape(2, (int64_t)4, (int64_t)8) */
IrShape ir_scalar_shape(void);
/* numpy broadcasting; returns 0 when the shapes do not broadcast */
int ir_broadcast(const IrShape *a, const IrShape *b, IrShape *out);
/* "[64, 1, 28, 28]" into buf */
const char *ir_shape_str(const IrShape *s, char *buf, size_t size);

/* attention's operands agree (ops.def): q [..., T, d], k [..., S, d], v [..., S, e] f32 with the
 * same leading axes (k's and v's last one may divide q's: grouped-query attention), and mask
 * (NULL: none) f32 or u8, broadcast to [..., T, S]. */
int ir_attention_ok(const IrNode *q, const IrNode *k, const IrNode *v, const IrNode *mask);
/* Whether attention n (or its gradient) reads any of its heads from tokens and writes its
 * result so (attr.attn_heads, fold_attention_heads). */
int ir_attention_tokens(const IrNode *n);
/* The metrics' accuracy nodes, in the order the train section lists them: g->correct itself, or
 * the items its reshapes and concats join (sema_train.c). Returns how many (0 without metrics). */
int ir_metrics(const IrGraph *g, const IrNode *out[IR_MAX_METRICS]);
/* Attention n's (or its gradient's) q, k and v as [..., T, d], [..., S, d], [..., S, e]: an
 * operand's own shape, or with its heads read from tokens (attr.attn_heads[i]) [B, heads, T,
 * head_dim] of the base [B, T, W] whose columns attn_col .. attn_col + heads * head_dim hold
 * them (the others then [B, heads, T, head_dim] themselves); 0 when the attributes do not fit
 * the bases, or two operands of one base overlap. */
int ir_attention_qkv(const IrNode *n, IrShape qkv[3]);
/* The first of n's operands 0 .. i read from tokens of operand i's base: i itself when none, or
 * in the plain form. */
int ir_attention_first(const IrNode *n, int i);
/* Where operand i's gradient starts in attention_bwd's packed result: the plain form's dq, dk,
 * dv one after another; heads read from tokens, one gradient per base (in the order of the
 * bases' first operands), which every operand of that base writes its columns of. */
int64_t ir_attention_grad_at(const IrNode *n, int i);
/* Elements of attention_bwd's packed result: the gradients, and lse and delta per query row. */
int64_t ir_attention_bwd_numel(const IrNode *n);
/* The bn_stats node whose results (its row views 0 and 1: mean and invstd) bn_apply or
 * bn_bwd_data n reads as its operands 1 and 2. */
const IrNode *ir_bn_stats(const IrNode *n);

/* ---- building */
IrGraph *ir_graph_new(Arena *arena);
/* Append a node; operands must already be in the graph. Returns the node for attrs to be set.
 * (builder.h makes nodes from a full description and inserts them anywhere.) */
IrNode *ir_add(IrGraph *g, IrOp op, IrShape shape, IrDtype dt, SrcLoc loc, int n_in, ...);
IrNode *ir_const(IrGraph *g, double value, IrDtype dt, SrcLoc loc);
IrParam *ir_add_param(IrGraph *g, const char *name, IrShape shape, IrInit init, double init_a,
                      SrcLoc loc);
/* Make n, an OP_PARAM node its caller places (a builder's), the graph's next parameter. */
IrParam *ir_register_param(IrGraph *g, IrNode *n, const char *name, IrInit init, double init_a);
IrNode *ir_add_input(IrGraph *g, const char *name, IrShape shape, IrDtype dt, SrcLoc loc);
IrParam *ir_find_param(IrGraph *g, const char *name);
/* Number nodes 0..n-1 in schedule order. */
void ir_renumber(IrGraph *g);

/* ---- checking and printing */
/* Check every invariant (operand order, arity, shapes per operator, dtypes). On failure print
 * what is wrong with the node and return 0. `stage` names the pass that ran last. */
int ir_verify(const IrGraph *g, const char *stage);
/* --dump=ir / --dump=grad: one line per node, stable for golden tests:
 *   %7 = conv2d(%3, %6) f32[64,6,28,28] stride=1,1 pad=2,2   # lenet.net:9 */
void ir_print(const IrGraph *g, FILE *out);
/* The attributes a node's operator reads, as ir_print writes them (" stride=1,1 pad=2,2"). */
void ir_print_attrs(const IrNode *n, FILE *out);
/* --dump=dot (dot.c): the forward graph, or with whole_step the forward and backward passes, in
 * Graphviz's DOT language: a box per node (operator, attributes, dtype and shape, the input's or
 * parameter's name), an edge per operand, a cluster per fused group. */
void ir_print_dot(const IrGraph *g, int whole_step, FILE *out);
/* --summary: the forward graph as a table of layers (output shape, parameters, per-sample
 * multiply-adds) and the totals, as torchinfo prints a model (summary.c). */
void ir_summary(const IrGraph *g, FILE *out);
/* The forward pass's multiply-adds per sample: products, convolutions and attention (summary.c). */
int64_t ir_forward_macs(const IrGraph *g);
/* The multiply-adds of one run of node n, the whole batch: a convolution's (forward, data or
 * weight gradient), a matrix product's, attention's forward; 0 for other operators (summary.c). */
int64_t ir_node_macs(const IrNode *n);
/* The operator table as the markdown list in docs/compiler.md (tests/ops checks the two agree). */
void ir_print_ops(FILE *out);

#endif
