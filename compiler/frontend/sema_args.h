/* sema_args.h - the argument helpers of the built-ins (sema_builtins.c) and of the train
 * section's calls (sema_train.c): where an argument was written, and its value checked against
 * what the call accepts, with an error naming the argument, the call and what was found. */
#ifndef NETC_SEMA_ARGS_H
#define NETC_SEMA_ARGS_H

#include "sema.h"

typedef struct {
    Sema *S;
    const AstExpr *call;
    const SemaBuiltin *b;
    Value *a;
    int ok;
    const char *label; /* the call's label, to name the layer in errors; NULL if none */
} Args;

/* The argument helpers of a built-in; its `label` parameter names the layer in errors. */
#define BEGIN_ARGS(S, call, args)                                                        \
    Args A_ = {S, call, sema_find_builtin(call->name), args, 1, label};                  \
    Args *A = &A_

/* Where argument number `index` (or keyword `name`) was written, for error carets. */
SrcLoc arg_loc(const AstExpr *call, const char *name, int index);
/* Where argument i of the call was written */
SrcLoc arg_at(Args *A, int i);
/* A float tensor argument of at least `min_rank` axes (exactly `rank` if rank > 0); NULL after
 * an error (A->ok cleared). */
IrNode *arg_tensor(Args *A, int i, int rank, int min_rank);
/* x, argument i, unless it is f16 or bf16, which a library kernel's operand cannot be: NULL after
 * an error naming the layer (A->ok cleared) */
IrNode *arg_refuse_half(Args *A, int i, IrNode *x);
/* An integer >= min (def when the argument is absent); clears A->ok after an error */
int64_t arg_int(Args *A, int i, int64_t def, int64_t min);
/* A float32 tensor argument of at least `min_rank` axes (exactly `rank` if rank > 0); f16 and
 * bf16 ones are refused, naming the layer. NULL after an error (A->ok cleared). */
IrNode *arg_f32_tensor(Args *A, int i, int rank, int min_rank);
/* An int or a [h, w] list of ints >= min (both def when absent), as PyTorch's kernel_size,
 * stride and padding; clears A->ok after an error */
void arg_pair(Args *A, int i, int def, int min, int out[2]);
/* An axis of `shape` (negative ones count from the end); -1 after an error (A->ok cleared) */
int arg_axis(Args *A, int i, const IrShape *shape);
/* A string (def when the argument is absent); clears A->ok after an error */
const char *arg_str(Args *A, int i, const char *def);
/* true or false (def when the argument is absent); clears A->ok after an error */
int arg_bool(Args *A, int i, int def);
/* A number in [min, max], or in [min, max) when `open_max` (def when absent). */
double arg_num_in(Args *A, int i, double def, double min, double max, int open_max);
double arg_num(Args *A, int i, double def, double min, double max);

/* x summed over the axes whose mask is set, kept as axes of 1 (keepdim) or dropped */
IrNode *sema_sum_axes(Sema *S, IrNode *x, const int *mask, int keepdim, SrcLoc loc);
/* y, a unary function's value on the compile-time number v: a number, or an error that it
 * overflows */
Value sema_number_result(Sema *S, const AstExpr *c, Value v, double y);

/* A new parameter (NULL after an error: a name defined twice, too many, a shape too large). */
IrParam *sema_new_param(Sema *S, const char *name, IrShape shape, IrInit init, double a, SrcLoc loc);

/* A convolution's window: kernel, stride, padding and dilation as [h, w]; groups; a bias or not. */
typedef struct SemaConv {
    int k[2], stride[2], pad[2], dil[2];
    int64_t groups;
    int bias;
} SemaConv;
IrNode *sema_conv(Sema *S, const AstExpr *c, const char *label, IrNode *x, int64_t out, const SemaConv *v,
                  int weight_rank);

/* sema_rnn.c: lstm and gru */
Value sema_b_rnn(Sema *S, const AstExpr *c, const char *label, Value *args);

/* sema_losses.c: the losses and the metric */
Value sema_b_cross_entropy(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_mse(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_bce(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_l1(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_smooth_l1(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_accuracy(Sema *S, const AstExpr *c, const char *label, Value *args);

/* sema_composed.c: built-ins composed of other operators (element-wise ones of comparisons,
 * where and arithmetic; groupnorm and upsample) */
IrNode *sema_abs(Sema *S, IrNode *x, SrcLoc at); /* |x|, gradient sign(x) (0 at 0) */
/* a op b broadcast (u8 for a comparison, f32 otherwise), and op x, for shapes checked before */
IrNode *sema_binary(Sema *S, IrOp op, IrNode *a, IrNode *b, SrcLoc loc);
IrNode *sema_unary(Sema *S, IrOp op, IrNode *x, SrcLoc loc);
Value sema_b_abs(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_leaky_relu(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_clamp(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_maximum(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_minimum(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_conv1d(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_conv_transpose2d(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_groupnorm(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_upsample(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_softplus(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_elu(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_hardtanh(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_activation(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_glu(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_prelu(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_instancenorm2d(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_pool1d(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_one_hot(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_normalize(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_cosine_similarity(Sema *S, const AstExpr *c, const char *label, Value *args);
Value sema_b_pad(Sema *S, const AstExpr *c, const char *label, Value *args);

#endif
