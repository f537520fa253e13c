/* cuda_step.c - the CUDA backend's kernels that keep the step's bookkeeping on the device, so
 * that the host never reads a value back during a run: the learning rate and dropout seed at the
 * start of a step, the loss and accuracy sums and the non-finite check after the backward pass,
 * the gradients' mean over accumulated batches and ranks, clip_grad_norm, the dynamic loss scale
 * and the optimizer (one kernel over the flat parameter buffer, or LAMB's and LARS's layer-wise
 * kernels). cuda.c places their launches in the step (walk).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "cuda_gen.h"
#include "passes.h"
/* The learning rate at st->step: rt_lr_at, as on the host, on the run's schedule (st->schedule:
 * the model's, or the one the trainer's options made of it), whose values the kernel names in a
 * comment. */
void cu_step_begin(Cu *u) {
    const IrTrain *t = &u->g->train;
    Cg *c = &u->c;
    cu_kernel_open(u);
    cg_line(c, "RtDevState *st = ctx->state;");
    cg_line(c, "st->step_seed = rt_step_seed(st->seed, st->step * st->accumulate + st->micro); // each batch its masks");
    int poly = t->sched == SCHED_POLY, in_steps = t->warmup_steps || t->step_steps || poly;
    cg_line(c, "// the model's schedule, which the trainer's --lr, --warmup-epochs, ... may change:");
    cg_line(c, "// {kind, base_lr, warmup_epochs, step_epochs, gamma, min_lr%s%s}",
            in_steps ? ", warmup_steps, step_steps" : "", poly ? ", power" : "");
    cg_begin(c, "// {%s, ", cg_sched_enums[t->sched]);
    cg_dbl(c->out, t->lr);
    cg_put(c, ", ");
    cg_dbl(c->out, t->warmup_epochs);
    cg_put(c, ", ");
    cg_dbl(c->out, t->step_epochs);
    cg_put(c, ", ");
    cg_dbl(c->out, t->gamma);
    cg_put(c, ", ");
    cg_dbl(c->out, t->min_lr);
    if (in_steps) {
        cg_put(c, ", ");
        cg_dbl(c->out, t->warmup_steps);
        cg_put(c, ", ");
        cg_dbl(c->out, t->step_steps);
    }
    if (poly) {
        cg_put(c, ", ");
        cg_dbl(c->out, t->power);
    }
    cg_end(c, "}");
    cg_line(c, "st->lr = (float)rt_lr_at(&st->schedule, st->step, st->per_epoch, st->total);");
    cu_kernel_close(u, "step_begin", 1, 1, "this step's learning rate and dropout seed");
}

/* Metric i's count of this batch's correct predictions, as the kernel reads it: g->correct, one
 * float per metric. */
static void metric_at(Cu *u, int i, char *buf, size_t size) {
    snprintf(buf, size, "*(const float *)(base + %" PRId64 ")", cu_dev_offset(u, u->g->correct) + 4 * (int64_t)i);
}

/* Loss and accuracies into the sums; a non-finite loss stops every later update. */
void cu_step_end(Cu *u, int eval) {
    const IrGraph *g = u->g;
    Cg *c = &u->c;
    const IrNode *metric[IR_MAX_METRICS];
    const int metrics = ir_metrics(g, metric);
    char correct[96];
    cu_kernel_open(u);
    cg_line(c, "RtDevState *st = ctx->state;");
    if (eval) {
        cg_line(c, "st->eval_loss += (double)*(const float *)(base + %" PRId64 ") * (double)ctx->n_valid;",
                cu_dev_offset(u, g->loss));
        for (int i = 0; i < metrics; i++) {
            metric_at(u, i, correct, sizeof correct);
            cg_line(c, "st->eval_correct[%d] += (double)%s;", i, correct);
        }
        cu_kernel_close(u, "eval_end", 1, 1, "evaluation sums");
        return;
    }
    /* --accumulate K: the mean of the step's K losses, added in order in double as the CPU
     * trainer adds them (for K = 1 the batch's own, exactly) */
    cg_line(c, "const float loss = (float)((st->micro_loss + (double)*(const float *)(base + %" PRId64
               ")) / (double)st->accumulate);", cu_dev_offset(u, g->loss));
    cg_line(c, "st->loss = loss;");
    for (int i = 0; i < metrics; i++) {
        metric_at(u, i, correct, sizeof correct);
        cg_line(c, "st->correct[%d] = (float)(st->micro_correct[%d] + (double)%s);", i, i, correct);
    }
    cg_line(c, "st->micro = 0, st->micro_loss = 0;");
    for (int i = 0; i < metrics; i++) cg_line(c, "st->micro_correct[%d] = 0;", i);
    if (g->distributed) { /* every rank adds up, and checks, the loss summed over the ranks */
        cu_kernel_close(u, "step_loss", 1, 1, "this rank's loss and correct predictions");
        cg_line(&u->step, "rt_cuda_sum_join(cu); // summed over the ranks, once every gradient's mean is done");
        cu_kernel_open(u);
        cg_line(c, "RtDevState *st = ctx->state;");
        cg_line(c, "const float loss = st->loss;");
    }
    cg_line(c, "if (!isfinite(loss) && st->nonfinite_step == 0) st->nonfinite_step = st->step + 1;");
    cg_line(c, "st->loss_sum += (double)loss;");
    cg_line(c, "st->loss_steps += 1;");
    for (int i = 0; i < metrics; i++) cg_line(c, "st->correct_sum[%d] += (double)st->correct[%d];", i, i);
    cu_kernel_close(u, "step_end", 1, 1, "loss sums, non-finite check");
}

/* --accumulate K (RtStepPart): the step's summed gradients, n_grad_floats floats at
 * RtDevState.accum_at, which the runtime allocates and zeroes. Each RT_STEP_SUM batch adds its
 * gradients to the sum (zero plus the first batch's: the CPU trainer's copy of it, but for a
 * -0.0f, which becomes +0.0f); RT_STEP_LAST adds the sum to the last batch's gradients, divides
 * by K - (g + sum) * (1 / K), as the CPU trainer rounds it - and zeroes the sum for the next
 * step. A distributed step does that bucket by bucket, before each bucket's mean over the ranks
 * (whose 1 / ranks follows: the same bits as the CPU's 1 / (ranks K) where both are powers of
 * two), and its SUM batches start no collective. */
static void emit_grads_mean(Cu *u, int64_t offset, int64_t count, const char *name) {
    Cg *c = &u->c;
    cu_kernel_open(u);
    cg_line(c, "const RtDevState *st = ctx->state;");
    if (offset)
        cg_line(c, "float *g = ctx->grads + %" PRId64 ", *sum = (float *)(base + st->accum_at) + %" PRId64 ";", offset,
                offset);
    else cg_line(c, "float *g = ctx->grads, *sum = (float *)(base + st->accum_at);");
    cg_line(c, "const float mean = 1.0f / (float)st->accumulate;");
    cg_open(c, "NETC_FOR(i, %" PRId64 ") {", count);
    cg_line(c, "g[i] = (g[i] + sum[i]) * mean;");
    cg_line(c, "sum[i] = 0.0f;");
    cg_close(c, "}");
    cg_line(&u->step, "if (part == RT_STEP_LAST)");
    u->step.depth++;
    cu_kernel_close(u, name, cu_grid_for(count), BLOCK, "--accumulate: the step's sum added, divided by K");
    u->step.depth--;
}

/* The gradients of the buckets final at `position` of the training step: with --accumulate the
 * step's sum added (emit_grads_mean), then their mean over the ranks started, but in RT_STEP_SUM
 * batches. */
void cu_grads_ready(Cu *u, int position) {
    const IrGraph *g = u->g;
    for (int k = 0; g->distributed && k < g->n_buckets; k++) {
        if (g->buckets[k].ready != position) continue;
        char name[32];
        snprintf(name, sizeof name, "grads_mean_b%d", k);
        emit_grads_mean(u, g->buckets[k].offset, g->buckets[k].count, name);
        cg_line(&u->step, "if (part != RT_STEP_SUM) rt_cuda_sum_start(cu, %d); // final: start their mean over the "
                          "ranks", k);
    }
}

/* The end of an RT_STEP_SUM batch: its gradients, loss and correct predictions added to the
 * step's, then no update; and a whole trainer's RT_STEP_LAST mean (a distributed one's is per
 * bucket, cu_grads_ready). */
void cu_grads_sum(Cu *u) {
    const IrGraph *g = u->g;
    Cg *c = &u->c;
    int64_t n = g->n_grad_floats;
    cu_kernel_open(u);
    cg_line(c, "RtDevState *st = ctx->state;");
    if (n) {
        cg_line(c, "float *sum = (float *)(base + st->accum_at);");
        cg_line(c, "NETC_FOR(i, %" PRId64 ") sum[i] += ctx->grads[i];", n);
    }
    cg_open(c, "if (blockIdx.x == 0 && threadIdx.x == 0) { // what step_end makes the step's mean of");
    cg_line(c, "st->micro_loss += (double)*(const float *)(base + %" PRId64 ");", cu_dev_offset(u, g->loss));
    const IrNode *metric[IR_MAX_METRICS];
    for (int i = 0, n = ir_metrics(g, metric); i < n; i++) {
        char correct[96];
        metric_at(u, i, correct, sizeof correct);
        cg_line(c, "st->micro_correct[%d] += (double)%s;", i, correct);
    }
    cg_line(c, "st->micro += 1;");
    cg_close(c, "}");
    cg_open(&u->step, "if (part == RT_STEP_SUM) { // --accumulate: one of the step's first K - 1 batches");
    cu_kernel_close(u, "grads_sum", cu_grid_for(n), BLOCK, "its gradients, loss and accuracy added to the step's");
    cg_line(&u->step, "return; // no update until the step's last batch");
    cg_close(&u->step, "}");
    if (!g->distributed && n) emit_grads_mean(u, 0, n, "grads_mean");
}

/* Gradients the memory plan could not place in the gradient buffer are copied there. */
void cu_grad_copies(Cu *u) {
    const IrGraph *g = u->g;
    Cg *c = &u->c;
    for (int i = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (!p->trainable || (p->grad && cg_in_place(p))) continue;
        int64_t n = ir_numel(&p->node->shape);
        char name[32], what[160];
        cu_kernel_open(u);
        cg_begin(c, "// d ");
        cg_comment_text(c->out, p->name);
        cg_end(c, "%s", ""); /* the name ends the line */
        if (p->grad && p->grad->storage != ST_INLINE) cg_declare(c, p->grad);
        cg_begin(c, "NETC_FOR(i, %" PRId64 ") ctx->grads[%" PRId64 " + i] = ", n, p->grad_offset);
        if (!p->grad) cg_put(c, "0.0f");
        else if (p->grad->storage == ST_INLINE) cg_lit(c->out, cg_const_value(p->grad));
        else cg_put(c, "v%d[i]", p->grad->id);
        cg_end(c, ";");
        snprintf(name, sizeof name, "grad%d", i);
        snprintf(what, sizeof what, "gradient of %.120s", p->name);
        cu_kernel_close(u, name, cu_grid_for(n), BLOCK, what);
    }
}

/* --shard-optimizer: the table of this rank's slices the runtime writes (netrt_cuda.h), and
 * with `floats` their floats, the stride of the slots of the state. */
static void emit_slices(Cu *u, int floats) {
    Cg *c = &u->c;
    cg_line(c, "// this rank's slices (netc --shard-optimizer): {offset, count, at} per bucket, then their floats");
    cg_line(c, "const long long *slice = (const long long *)(base + NETC_OFF_SHARD);");
    if (floats) cg_line(c, "const long long floats = slice[%d];", 3 * u->g->n_buckets);
}


/* --precision fp16: torch.cuda.amp.GradScaler's unscale_ and update() in the clip_scale kernel,
 * from the squares' sum `sq` of the scaled gradients: `unscale` = 1 / S (a power of two: exact),
 * the step skipped (st->scale_skip) and S halved when sq is not finite, S doubled after
 * scale_interval finite steps in a row. Not finite at the smallest scale is divergence: the run
 * stops as on a non-finite loss. */
static void emit_loss_scale(Cg *c) {
    cg_line(c, "// dynamic loss scaling: the gradients are S times the true ones");
    cg_line(c, "const float unscale = 1.0f / st->loss_scale;");
    cg_line(c, "st->scale_skip = !isfinite(sq);");
    cg_open(c, "if (st->scale_skip) { // an overflow: no update, and S halved");
    cg_line(c, "st->skipped_steps += 1, st->scale_good = 0;");
    cg_line(c, "if (st->loss_scale > RT_LOSS_SCALE_MIN) st->loss_scale *= 0.5f;");
    cg_line(c, "else if (st->nonfinite_step == 0) st->nonfinite_step = st->step + 1, st->nonfinite_grads = 1;");
    cg_close(c, "} else if (++st->scale_good == st->scale_interval) { // finite that many steps in a row: S doubled");
    c->depth++;
    cg_line(c, "if (st->loss_scale < RT_LOSS_SCALE_MAX) st->loss_scale *= 2.0f;");
    cg_line(c, "st->scale_good = 0;");
    cg_close(c, "}");
}

/* clip_grad_norm, and --precision fp16's dynamic loss scaling: the gradients' 2-norm in two
 * kernels with fixed trees, no atomics, and the scale the optimizer kernel reads
 * (st->clip_scale), all on the device. The first kernel's `nb` blocks each add the squares of
 * elements b*256 + t, b*256 + t + nb*256, ... per thread in double, then the block's 256 threads
 * by rt_block_sum's tree, into the partial-sum region; the second, one block, adds those nb sums
 * the same way. Under loss scaling the sum is the overflow check too: one gradient that is not
 * finite makes it NaN or Inf (emit_loss_scale). */
void cu_clip(Cu *u) {
    const IrTrain *t = &u->g->train;
    int64_t n = u->g->n_grad_floats, nb = (n + BLOCK - 1) / BLOCK;
    if (nb > CLIP_BLOCKS) nb = CLIP_BLOCKS;
    int shard = u->g->shard_optimizer, clip = t->clip_grad_norm > 0, scaling = u->g->loss_scaling;
    const char *what = clip && scaling ? "clip_grad_norm and the loss scale" : clip ? "clip_grad_norm" : "the loss scale";
    char why[96];
    Cg *c = &u->c;
    cu_part_room(u, (CLIP_BLOCKS + shard) * 8, what);
    cu_kernel_open(u);
    cg_line(c, "double *part = (double *)(base + NETC_OFF_PART);");
    cg_line(c, "double sq = 0;");
    if (shard) { /* this rank's slices, each the same way */
        emit_slices(u, 0);
        cg_open(c, "for (int k = 0; k < %d; k++) {", u->g->n_buckets);
        cg_line(c, "const float *g = ctx->grads + slice[3 * k];");
        cg_line(c, "for (long long j = (long long)blockIdx.x * %d + threadIdx.x; j < slice[3 * k + 1]; j += %" PRId64
                   ") {", BLOCK, nb * BLOCK);
        cg_line(c, "    const double x = (double)g[j];");
    } else {
        cg_line(c, "for (int64_t i = (int64_t)blockIdx.x * %d + threadIdx.x; i < %" PRId64 "; i += %" PRId64 ") {",
                BLOCK, n, nb * BLOCK);
        cg_line(c, "    const double x = (double)ctx->grads[i];");
    }
    cg_line(c, "    sq += x * x;");
    cg_line(c, "}");
    if (shard) cg_close(c, "}");
    cg_line(c, "sq = rt_block_sum(sq);");
    cg_line(c, "if (threadIdx.x == 0) part[blockIdx.x] = sq;");
    snprintf(why, sizeof why, "%s: the squares' sums per block", what);
    cu_kernel_close(u, "clip_sums", (unsigned)nb, BLOCK, why);
    cu_kernel_open(u);
    if (!shard) cg_line(c, "RtDevState *st = ctx->state;");
    cg_line(c, "%sdouble *part = (%sdouble *)(base + NETC_OFF_PART);", shard ? "" : "const ", shard ? "" : "const ");
    cg_line(c, "double sq = 0;");
    cg_line(c, "for (int b = (int)threadIdx.x; b < %" PRId64 "; b += %d) sq += part[b];", nb, BLOCK);
    cg_line(c, "sq = rt_block_sum(sq);");
    if (shard) { /* the ranks' sums added, then the norm */
        cg_line(c, "if (threadIdx.x == 0) part[%d] = sq;", CLIP_BLOCKS);
        snprintf(why, sizeof why, "%s: this rank's squares' sum", what);
        cu_kernel_close(u, "clip_total", 1, BLOCK, why);
        cg_line(&u->step, "rt_cuda_sum_doubles(cu, %" PRId64 ", 1); // the squares' sum over the ranks",
                u->map.part + CLIP_BLOCKS * 8);
        cu_kernel_open(u);
        cg_line(c, "RtDevState *st = ctx->state;");
        cg_line(c, "const double sq = ((const double *)(base + NETC_OFF_PART))[%d];", CLIP_BLOCKS);
    }
    cg_open(c, "if (threadIdx.x == 0) {");
    if (scaling) emit_loss_scale(c);
    cg_line(c, "st->grad_norm = sqrt(sq)%s;", scaling ? " * unscale" : "");
    if (clip) cg_emit_clip_scale(c, t, "st->grad_norm");
    cg_line(c, "st->clip_scale = %s;", clip && scaling ? "clip * unscale" : clip ? "clip" : "unscale");
    cg_close(c, "}");
    snprintf(why, sizeof why, "%s: the norm and the scale", what);
    cu_kernel_close(u, "clip_scale", 1, shard ? 1 : BLOCK, why);
}

/* The gradient bucket that holds trainable parameter p's gradient (buckets never split one). */
static int bucket_of(const IrGraph *g, const IrParam *p) {
    for (int b = 0; b < g->n_buckets; b++)
        if (g->buckets[b].offset <= p->grad_offset && p->grad_offset < g->buckets[b].offset + g->buckets[b].count)
            return b;
    ICE("cuda: %s lies in no gradient bucket", p->name);
}

/* The trainable tensors in flat order, each with the index of its first piece of PIECE floats
 * (the blocks of cu_layerwise's kernels), as a table in the kernel: {offset, count, first}. */
static void emit_piece_table(Cu *u) {
    const IrGraph *g = u->g;
    Cg *c = &u->c;
    int nt = 0;
    for (int i = 0; i < g->n_params; i++) nt += g->params[i].trainable;
    const IrParam **t = calloc((size_t)(nt ? nt : 1), sizeof *t);
    if (!t) ICE("cuda: out of memory");
    for (int i = 0, k = 0; i < g->n_params; i++)
        if (g->params[i].trainable) t[k++] = &g->params[i];
    for (int a = 1; a < nt; a++) /* by offset: few tensors */
        for (int b = a; b > 0 && t[b - 1]->grad_offset > t[b]->grad_offset; b--) {
            const IrParam *x = t[b];
            t[b] = t[b - 1], t[b - 1] = x;
        }
    int64_t first = 0, shard = g->shard_optimizer;
    cg_line(c, "// the trainable tensors in flat order: {offset, floats, first piece of %d floats%s}", PIECE,
            shard ? ", gradient bucket" : "");
    cg_open(c, "static const long long tensor[%d][%d] = {", nt, shard ? 4 : 3);
    for (int k = 0; k < nt; k++) {
        int64_t count = ir_numel(&t[k]->node->shape);
        if (shard)
            cg_line(c, "{%" PRId64 ", %" PRId64 ", %" PRId64 ", %d}, // %s", t[k]->grad_offset, count, first,
                    bucket_of(g, t[k]), t[k]->name);
        else cg_line(c, "{%" PRId64 ", %" PRId64 ", %" PRId64 "}, // %s", t[k]->grad_offset, count, first, t[k]->name);
        first += (count + PIECE - 1) / PIECE;
    }
    cg_close(c, "};");
    free(t);
}

/* The start of each optimizer kernel: nothing once a loss was not finite, nor on a step the
 * loss scale skips; the hyperparameters at the step, which counts the updates made (the steps
 * taken less those skipped, as torch.optim counts the step() calls that GradScaler lets through). */
static void emit_optim_head(Cu *u) {
    const IrTrain *t = &u->g->train;
    /* the updates made: a loss-scaling run's skipped steps (carried from its checkpoint into a
     * trainer that does not scale, rt_main.c) made none */
    const char *step = "st->step - st->skipped_steps";
    Cg *c = &u->c;
    cg_line(c, "const RtDevState *st = ctx->state;");
    if (u->g->loss_scaling) cg_line(c, "if (st->nonfinite_step || st->scale_skip) return;");
    else cg_line(c, "if (st->nonfinite_step) return;");
    cg_emit_optim_step(c, t, "st->lr", step, "st->hyper");
    if (u->g->n_decay_floats < u->g->n_grad_floats) cg_emit_optim_no_decay(c, t, "st->lr", step);
}

/* cu_layerwise's first or last pass (the block's piece found) with --shard-optimizer: the
 * same blocks and threads over the same pieces, each thread moving the elements of its piece
 * that lie in this rank's slice of the tensor's bucket, so that one rank computes the plain
 * trainer's bits. The pieces' sums of the first pass are then summed over the ranks. */
static void emit_layerwise_sharded(Cu *u, int pass, int clip, const char *hs) {
    const RtOptimizer *o = rt_optimizer(u->g->train.optim);
    int nt;
    const int64_t pieces = cu_layerwise_pieces(u->g, &nt);
    Cg *c = &u->c;
    emit_slices(u, 1);
    cg_line(c, "const long long *mine = slice + 3 * tensor[lo][3]; // this rank's part of the tensor's bucket");
    cg_line(c, "const long long a = mine[0], b = mine[0] + mine[1];");
    cg_line(c, "%sfloat *p = ctx->params + a;", pass == 0 ? "const " : "");
    cg_line(c, "float *state = ctx->optstate + mine[2];");
    if (pass == 2) {
        cg_line(c, "const float *g = ctx->grads + a;");
        cg_line(c, "for (long long i = from + threadIdx.x; i < to; i += %d)", BLOCK);
        cg_line(c, "    if (i >= a && i < b) %s(%s, factor[lo], p, g, state, floats, i - a);", o->apply_fn, hs);
        cu_kernel_close(u, "optimizer", (unsigned)pieces, BLOCK, "optimizer: each tensor's update by its factor, this rank's parameters");
        return;
    }
    if (clip) cg_line(c, "const float clip = st->clip_scale; // clip_grad_norm (cu_clip)");
    cg_line(c, "%sfloat *g = ctx->grads + a;", clip ? "" : "const ");
    cg_line(c, "double pp = 0, uu = 0;");
    cg_open(c, "for (long long i = from + threadIdx.x; i < to; i += %d) {", BLOCK);
    cg_line(c, "if (i < a || i >= b) continue;");
    if (clip) cg_line(c, "g[i - a] *= clip;");
    cg_line(c, "const float v = %s(%s, p, g, state, floats, i - a);", o->update_fn, hs);
    cg_line(c, "pp += (double)p[i - a] * p[i - a], uu += (double)v * v;");
    cg_close(c, "}");
    cg_line(c, "pp = rt_block_sum(pp);");
    cg_line(c, "uu = rt_block_sum(uu);");
    cg_line(c, "if (threadIdx.x == 0) sums[2 * blockIdx.x] = pp, sums[2 * blockIdx.x + 1] = uu;");
    cu_kernel_close(u, "optimizer_sums", (unsigned)pieces, BLOCK,
                 "optimizer: the moments, and each piece's squares of p and u, this rank's elements");
    cg_line(&u->step, "rt_cuda_sum_doubles(cu, %" PRId64 ", %" PRId64 "); // the pieces' squares over the ranks",
            u->map.part, 2 * pieces);
}

/* A layer-wise optimizer (LAMB, LARS: rt_recipe.h) in three kernels, as the CPU backend's three
 * passes: a block per piece of PIECE floats inside one tensor moves the moments and sums the
 * squares of p and of the direction u (rt_block_sum's fixed tree, in double); a thread per
 * tensor adds its pieces' sums in piece order into the tensor's factor; a block per piece
 * moves p. The sums and factors lie in the partial-sum region: [pieces][2] doubles, then
 * [tensors] floats. Every kernel does nothing once a loss was not finite. */
void cu_layerwise(Cu *u, int clip) {
    const IrTrain *t = &u->g->train;
    const RtOptimizer *o = rt_optimizer(t->optim);
    int64_t n = u->g->n_grad_floats, nd = u->g->n_decay_floats;
    int shard = u->g->shard_optimizer;
    int nt;
    const int64_t pieces = cu_layerwise_pieces(u->g, &nt);
    Cg *c = &u->c;
    cu_part_room(u, pieces * 16 + nt * 4, "the layer-wise optimizer");
    for (int pass = 0; pass < 3; pass++) {
        cu_kernel_open(u);
        emit_optim_head(u);
        emit_piece_table(u);
        if (pass < 2) cg_line(c, "double *sums = (double *)(base + NETC_OFF_PART); // [%" PRId64 "][2]", pieces);
        if (pass > 0)
            cg_line(c, "float *factor = (float *)(base + NETC_OFF_PART + %" PRId64 "LL); // [%d]", pieces * 16, nt);
        if (pass == 1) { /* a thread per tensor */
            cg_line(c, "const int k = (int)(blockIdx.x * blockDim.x + threadIdx.x);");
            cg_line(c, "if (k >= %d) return;", nt);
            cg_line(c, "const long long end = k + 1 < %d ? tensor[k + 1][2] : %" PRId64 ";", nt, pieces);
            cg_line(c, "double pp = 0, uu = 0;");
            cg_line(c, "for (long long b = tensor[k][2]; b < end; b++) pp += sums[2 * b], uu += sums[2 * b + 1];");
            if (nd < n) cg_line(c, "const int decay = tensor[k][0] < %" PRId64 "; // the no_decay tensors lie last", nd);
            cg_line(c, "factor[k] = %s(%s, %s, sqrt(pp), sqrt(uu));", o->ratio_fn,
                    nd < n ? "decay ? h : h_nd, decay ? s : s_nd" : "h, s", nd < n ? "decay" : "1");
            cu_kernel_close(u, "optimizer_factors", (unsigned)((nt + BLOCK - 1) / BLOCK), BLOCK,
                         "optimizer: each tensor's norms and factor");
            continue;
        }
        cg_line(c, "// this block's piece: the last tensor whose first piece is at most blockIdx.x");
        cg_line(c, "int lo = 0, hi = %d;", nt - 1);
        cg_open(c, "while (lo < hi) {");
        cg_line(c, "const int mid = (lo + hi + 1) / 2;");
        cg_line(c, "if (tensor[mid][2] <= (long long)blockIdx.x) lo = mid;");
        cg_line(c, "else hi = mid - 1;");
        cg_close(c, "}");
        cg_line(c, "const long long from = tensor[lo][0] + ((long long)blockIdx.x - tensor[lo][2]) * %d;", PIECE);
        cg_line(c, "const long long to = from + %d < tensor[lo][0] + tensor[lo][1] ? from + %d : tensor[lo][0] + "
                   "tensor[lo][1];", PIECE, PIECE);
        const char *hs = nd < n ? "decay ? h : h_nd, decay ? s : s_nd" : "h, s";
        if (nd < n) cg_line(c, "const int decay = tensor[lo][0] < %" PRId64 ";", nd);
        if (shard) {
            emit_layerwise_sharded(u, pass, clip, hs);
            continue;
        }
        if (pass == 0) {
            if (clip) cg_line(c, "const float clip = st->clip_scale; // clip_grad_norm (cu_clip)");
            cg_line(c, "%sfloat *g = ctx->grads;", clip ? "" : "const ");
            cg_line(c, "double pp = 0, uu = 0;");
            cg_open(c, "for (long long i = from + threadIdx.x; i < to; i += %d) {", BLOCK);
            if (clip) cg_line(c, "g[i] *= clip;");
            cg_line(c, "const float v = %s(%s, ctx->params, g, ctx->optstate, %" PRId64 ", i);", o->update_fn, hs, n);
            cg_line(c, "pp += (double)ctx->params[i] * ctx->params[i], uu += (double)v * v;");
            cg_close(c, "}");
            cg_line(c, "pp = rt_block_sum(pp);");
            cg_line(c, "uu = rt_block_sum(uu);");
            cg_line(c, "if (threadIdx.x == 0) sums[2 * blockIdx.x] = pp, sums[2 * blockIdx.x + 1] = uu;");
            cu_kernel_close(u, "optimizer_sums", (unsigned)pieces, BLOCK,
                         "optimizer: the moments, and each piece's squares of p and u");
        } else {
            cg_line(c, "for (long long i = from + threadIdx.x; i < to; i += %d) %s(%s, factor[lo], ctx->params, "
                       "ctx->grads, ctx->optstate, %" PRId64 ", i);", BLOCK, o->apply_fn, hs, n);
            cu_kernel_close(u, "optimizer", (unsigned)pieces, BLOCK, "optimizer: each tensor's update by its factor, every parameter");
        }
    }
}

/* cu_optimizer's kernel with --shard-optimizer, from its hyperparameters on: the update of
 * this rank's slices, their state at each slice's place `at` in slots of `floats`. */
static void emit_optimizer_sharded(Cu *u, int clip) {
    const RtOptimizer *o = rt_optimizer(u->g->train.optim);
    int64_t n = u->g->n_grad_floats, nd = u->g->n_decay_floats;
    Cg *c = &u->c;
    emit_slices(u, 1);
    cg_open(c, "for (int k = 0; k < %d; k++) {", u->g->n_buckets);
    cg_line(c, "const long long from = slice[3 * k];");
    cg_line(c, "float *p = ctx->params + from, *state = ctx->optstate + slice[3 * k + 2];");
    cg_line(c, "%sfloat *g = ctx->grads + from;", clip ? "" : "const ");
    const char *open = clip ? "{ g[j] *= clip; " : "", *close = clip ? " }" : "";
    if (nd == n)
        cg_line(c, "NETC_FOR(j, slice[3 * k + 1]) %s%s(h, s, p, g, state, floats, j);%s", open, o->update_fn, close);
    else /* the parameter groups by the element's place in the whole buffer */
        cg_line(c, "NETC_FOR(j, slice[3 * k + 1]) %s%s(from + j < %" PRId64 " ? h : h_nd, from + j < %" PRId64
                   " ? s : s_nd, p, g, state, floats, j);%s", open, o->update_fn, nd, nd, close);
    cg_close(c, "}");
    cu_kernel_close(u, "optimizer", cu_grid_for(n), BLOCK, "optimizer, this rank's slices of the parameters");
}

/* One update of the flat parameter buffer with PyTorch's formulas, skipped once a loss was
 * not finite. */
void cu_optimizer(Cu *u) {
    const IrTrain *t = &u->g->train;
    int64_t n = u->g->n_grad_floats, nd = u->g->n_decay_floats;
    if (n == 0) return;
    Cg *c = &u->c;
    /* clip: the gradients are multiplied by st->clip_scale, clip_grad_norm's and the loss scale's */
    int clip = t->clip_grad_norm > 0 || u->g->loss_scaling;
    if (clip) cu_clip(u);
    if (rt_optimizer(t->optim)->apply_fn) {
        cu_layerwise(u, clip);
        return;
    }
    cu_kernel_open(u);
    emit_optim_head(u);
    if (clip) cg_line(c, "const float clip = st->clip_scale; // clip_grad_norm (cu_clip)");
    if (u->g->shard_optimizer) {
        emit_optimizer_sharded(u, clip);
        return;
    }
    cg_line(c, "float *p = ctx->params, *state = ctx->optstate;");
    cg_line(c, "%sfloat *g = ctx->grads;", clip ? "" : "const ");
    const char *open = clip ? "{ g[i] *= clip; " : "", *close = clip ? " }" : "";
    if (nd == n)
        cg_line(c, "NETC_FOR(i, %" PRId64 ") %s%s(h, s, p, g, state, %" PRId64 ", i);%s", n, open,
                rt_optimizer(t->optim)->update_fn, n, close);
    else /* the two parameter groups are two ranges of one grid */
        cg_line(c, "NETC_FOR(i, %" PRId64 ") %s%s(i < %" PRId64 " ? h : h_nd, i < %" PRId64
                " ? s : s_nd, p, g, state, %" PRId64 ", i);%s", n, open, rt_optimizer(t->optim)->update_fn, nd, nd, n,
                close);
    cu_kernel_close(u, "optimizer", cu_grid_for(n), BLOCK, "optimizer, every parameter");
}
