/* passes.h - the entry points of the middle end, in pipeline order (see driver/main.c: compile()).
 * Each pass reads and rewrites an IrGraph; none knows the front end or a backend. A pass that
 * adds nodes does it through builder.h. */
#ifndef NETC_PASSES_H
#define NETC_PASSES_H

#include <stdio.h>

#include "builder.h"
#include "ir.h"

/* attn_heads.c: an attention whose q, k and v are heads split off projections (permute of a
 * reshape, maybe of a slice along the last axis) and whose result is only permuted back reads
 * the projections' rows and writes its result's rows directly (attr.attn_heads, attn_hdim,
 * attn_col): the copies are removed, and autodiff writes the operands' gradients into one
 * gradient per projection. Run on the forward graph, before autodiff (both backends' attention
 * kernels read such operands). Returns the number of attentions folded. */
int fold_attention_heads(IrGraph *g);

/* unused.c: warnings (diag_warning) for a value the loss, the metric and the output do not read,
 * an input nothing of theirs reads, and a trainable parameter the loss does not depend on. Run
 * on the forward graph from sema; changes nothing. */
void warn_unused(const IrGraph *g);
/* unused.c: take out of the forward graph every value that neither the loss, the metric, the
 * output nor a batch norm's running statistics need (inputs, parameters and constants stay).
 * Run after warn_unused, before autodiff. Returns the number of nodes taken out. */
int drop_unused(IrGraph *g);

/* autodiff.c: append the backward pass. Requires the forward graph from sema (loss set);
 * guarantees every trainable parameter that the loss depends on has IrParam.grad, a node of
 * the parameter's shape; parameters the loss does not depend on get a zero gradient (OP_CONST
 * expanded) so the optimizer still sees weight decay. Gradients of a value used several times
 * are summed. Frozen parameters get none. Returns 0 on success. */
int ad_differentiate(IrGraph *g);

/* reshapes.c: an element-wise node whose operands are reshapes of one shape with fewer leading
 * axes (a dense layer's rows), besides scalars and last-axis vectors, is computed in that shape
 * and reshaped after, so that it joins the product's element-wise tail (fusion, epilogues).
 * Same values, same bits. Run before layout selection. Returns the number of nodes moved. */
int ew_through_reshapes(IrGraph *g);

/* layout.c: choose each value's physical layout: channels-last (NHWC) through convolution
 * chains when `channels_last`, else row-major everywhere; with `krsc_filters` too, channels-last
 * convolutions read their filters and write their filter gradients channels-last (KRSC); with
 * `views` too, a permute whose readers all read its operand's bytes as they lie becomes an
 * OP_PERMUTE_VIEW (no copy) and a reshape reads its operand in place in any order of its axes
 * that allows it (ir_layout_reshaped); insert OP_LAYOUT conversions where a reader needs another
 * layout and after a KRSC parameter gradient. Returns the number of conversions. Run before fusion. */
int layout_select(IrGraph *g, int channels_last, int krsc_filters, int views);

/* fuse.c: element-wise fusion. Marks each maximal run of consecutive element-wise nodes of one
 * shape, layout and phase (forward or backward) as one group, which the backends emit as one
 * loop (one kernel) at the group's first position: a member that only other members read is
 * `internal` and never reaches memory. Covers activation chains, bias + activation after a
 * matrix product or convolution, batch norm + residual add + ReLU, and their backward
 * counterparts. Returns the number of groups. */
int fuse_elementwise(IrGraph *g);
/* Set escapes[id] for the values the step hands on whole at its end: the loss, the accuracy,
 * the model's output, each parameter's gradient and the views it is read through. */
void mark_escaping(const IrGraph *g, unsigned char *escapes);
/* epilogue.c: GEMM + bias + activation. A matrix product whose element-wise tail (bias,
 * activation, or in the backward pass the activation's gradient) follows it directly gets
 * that group as its `epilogue` (a lone element-wise node becomes a one-member group), which
 * the backends apply to each block of the product's rows as soon as it is computed (CPU: per
 * thread while the block is in cache; CUDA: the cuBLASLt epilogue of that form). Run after
 * fuse_elementwise. Returns the number of epilogues. */
int fuse_epilogues(IrGraph *g);
/* The cuBLASLt name of group `group`'s form as an epilogue of `mm` ("RELU_BIAS", "BIAS",
 * "GELU_BIAS", "DRELU", "DGELU", ...), or "custom" when it has none. */
const char *epilogue_kind(const IrGraph *g, const IrNode *mm);

/* fuse_reduce.c: batch norm's backward sums (BN_BWD_SUMS) join the fused group that computes
 * their dy (the ReLU gradient, with the residual gradient add before it): the group's loop
 * accumulates the per-channel sums while dy is in registers, instead of a second pass that
 * reads dy and x back. Channels-last groups only; the sums are bit-identical to the separate
 * kernel's. Run after fuse_elementwise. Returns the number of sums fused. */
int fuse_reductions(IrGraph *g);

/* views.c: a float32 permute, slice, slice gradient or concatenation whose every reader is an
 * element-wise node (outside a matrix product's epilogue, not batch norm) or another such view,
 * that the step does not hand on (loss, output, gradients), and whose operands no reader's own
 * fused loop computes, is `folded`: it gets no kernel and no storage, and its readers read its
 * operands in place through the view's index map. Same values, same bits. Run after fusion,
 * before mp_plan. Returns the number of nodes folded. */
int fold_views(IrGraph *g);

/* --report: every fused group with the .net lines it came from, each value's layout, kernels
 * per training step fused and unfused, memory traffic saved, and the memory plan's peak.
 * Requires a planned graph. */
void fuse_report(const IrGraph *g, FILE *out);

/* memplan.c: assign storage to every node: parameters and gradients into the flat buffers
 * (trainable first), inputs to the runtime's batch buffers, views alias their operand,
 * everything else an offset in one arena from liveness over the schedule. Sets the graph's
 * arena_bytes, unplanned_bytes, n_param_floats, n_grad_floats, and scratch_per_thread: the
 * largest node_scratch(n) (the target's per-thread kernel scratch in floats; NULL: none).
 * in_place(n) names the operand whose bytes the target's kernel for n may overwrite with its
 * result (-1: none; NULL: no kernel may); n then shares that operand's buffer when nothing
 * reads the operand after n. */
void mp_plan(IrGraph *g, int64_t (*node_scratch)(const IrNode *n), int (*in_place)(const IrNode *n));
/* --dump=memplan: each buffer's offset, size and lifetime, the arena size and the sum
 * without reuse. */
void mp_print(const IrGraph *g, FILE *out);

/* buckets.c: make the graph a distributed step's (netc --distributed): cut the flat gradient
 * buffer into buckets of about bucket_bytes from its end (the backward pass finishes the last
 * layers' gradients first), each ready after the schedule position that finishes its last
 * gradient. Requires a planned graph. Returns the number of buckets. */
int dist_buckets(IrGraph *g, int64_t bucket_bytes);
/* pos[id] = the schedule position of node id (calloc'd; the caller frees it). */
int *schedule_positions(const IrGraph *g);
/* The schedule position after which trainable parameter p's gradient is final in the buffer,
 * or g->n when the backend copies it there at the end of the pass. Requires a planned graph. */
int grad_final_at(const IrGraph *g, const IrParam *p, const int *pos);
/* The position after which the backward pass is done with p: its gradient is final and no
 * later node reads p, directly or through views (g->n: only at the end of the pass). From then
 * on the optimizer may update p (the CPU backend does, while the gradient is in cache). */
int param_done_at(const IrGraph *g, const IrParam *p, const int *pos);
/* The CPU trainer's update in the backward pass (codegen/cpu.c): an element-wise optimizer,
 * without clip_grad_norm, in a trainer of one process, updates each trainable parameter of at
 * least min_floats floats right after the schedule position param_done_at gives. Returns a
 * malloc'd array, in_backward[i] = that position for parameter i or -1 (updated after the pass),
 * or NULL when no parameter is updated in the pass. */
enum { IN_BACKWARD_MIN_FLOATS = 32768 };
int *in_backward_positions(const IrGraph *g, int64_t min_floats);
/* --report's part for it: which parameters, after which node. */
void in_backward_report(const IrGraph *g, int64_t min_floats, FILE *out);
/* --report's part for a distributed step: the buckets, the bytes each rank sends and receives
 * per step, and the time that takes at given bus bandwidths beside the step's arithmetic. */
void dist_report(const IrGraph *g, FILE *out);

/* remat.c: SiLU and GELU values the backward pass reads only in element-wise nodes, beside
 * their input, dropouts and norms whose inputs it has anyway, computed again there instead of
 * kept from the forward pass. Returns the copies added. */
int remat_activations(IrGraph *g);

/* ignored_rows.c: the products that read a cross-entropy's gradient, with an ignore index, run
 * over the rows whose label counts only (a target with CgBackend.compacts_rows). Returns the
 * nodes added. */
int skip_ignored_rows(IrGraph *g);

/* autocast.c: matrix products and convolutions in `half` (DT_BF16 or DT_F16) - casts to it
 * before them and back to float32 after them; parameters, gradients and optimizer state stay
 * float32 (netc --precision bf16 or fp16, CUDA backend); with frozen_half (--frozen-half), frozen
 * parameters read only by products are stored in `half` instead. Returns the casts added. */
int autocast_half(IrGraph *g, IrDtype half, int frozen_half);

#endif
