/* rt_layerwise.c - the pieces of a layer-wise optimizer's update (LAMB, rt_recipe.h; RtPieces
 * in netrt.h) and the tensors' norms from them.
 *
 * The floats a rank updates (the whole trainable buffer, or its shard's slices) are cut at
 * every tensor's edges and then into pieces of at most RT_PIECE floats; the cut depends on the
 * model and the shard alone, never on the threads. Without a shard each tensor's norm is its
 * pieces' sums added in piece order. With one, each rank adds its pieces of a tensor, and the
 * ranks' sums are added by MPI: the same for every rank, though not the one process's bits.
 */
#include <math.h>
#include <stdlib.h>

#include "rt_internal.h"

enum { RT_PIECE = 16384 }; /* floats per piece at most: worth a thread, and the norms' blocks */

typedef struct {
    int64_t offset, count;
} Span;

static int by_offset(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Every piece of [s.offset, s.offset + s.count) into out (NULL: count them); tensors are
 * sorted by offset and tile the trainable buffer. */
static int cut_slice(const Span *tensors, int nt, RtSlice s, RtPiece *out) {
    int n = 0, k = 0;
    while (k < nt && tensors[k].offset + tensors[k].count <= s.offset) k++;
    for (int64_t lo = s.offset, end = s.offset + s.count; lo < end; k++) {
        int64_t tend = tensors[k].offset + tensors[k].count, hi = tend < end ? tend : end;
        for (; lo < hi; n++) {
            int64_t len = hi - lo < RT_PIECE ? hi - lo : RT_PIECE;
            if (out) out[n] = (RtPiece){lo, len, s.at + (lo - s.offset), k};
            lo += len;
        }
    }
    return n;
}

void rt_pieces_open(const RtModel *m, RtCtx *ctx) {
    int nt = 0;
    for (int i = 0; i < m->n_params; i++) nt += m->params[i].grad_offset >= 0;
    Span *tensors = rt_alloc((size_t)(nt ? nt : 1) * sizeof *tensors, "the optimizer's tensors");
    for (int i = 0, k = 0; i < m->n_params; i++)
        if (m->params[i].grad_offset >= 0) tensors[k++] = (Span){m->params[i].offset, rt_param_numel(&m->params[i])};
    qsort(tensors, (size_t)nt, sizeof *tensors, by_offset);
    const RtSlice whole = {0, m->n_grad_floats, 0};
    const RtSlice *slices = ctx->shard ? ctx->shard->slices : &whole;
    int ns = ctx->shard ? ctx->shard->n_slices : 1, n = 0;
    for (int k = 0; k < ns; k++) n += cut_slice(tensors, nt, slices[k], NULL);
    RtPieces *pc = rt_alloc(sizeof *pc, "the optimizer's pieces");
    RtPiece *piece = rt_alloc((size_t)(n ? n : 1) * sizeof *piece, "the optimizer's pieces");
    for (int k = 0, at = 0; k < ns; k++) at += cut_slice(tensors, nt, slices[k], piece + at);
    *pc = (RtPieces){.n = n, .piece = piece, .n_tensors = nt,
                     .sums = rt_alloc((size_t)(n ? n : 1) * 2 * sizeof(double), "the optimizer's norms"),
                     .norms = rt_alloc((size_t)(nt ? nt : 1) * 2 * sizeof(double), "the optimizer's norms")};
    free(tensors);
    ctx->pieces = pc;
}

void rt_piece_norms(RtCtx *ctx) {
    RtPieces *pc = ctx->pieces;
    for (int t = 0; t < 2 * pc->n_tensors; t++) pc->norms[t] = 0;
    for (int k = 0; k < pc->n; k++) {
        pc->norms[2 * pc->piece[k].tensor] += pc->sums[2 * k];
        pc->norms[2 * pc->piece[k].tensor + 1] += pc->sums[2 * k + 1];
    }
    if (ctx->shard && ctx->dist) rt_dist_sum(ctx->dist, pc->norms, 2 * pc->n_tensors, "summing the tensors' norms");
    for (int t = 0; t < 2 * pc->n_tensors; t++) pc->norms[t] = sqrt(pc->norms[t]);
}

void rt_pieces_close(RtCtx *ctx) {
    RtPieces *pc = ctx->pieces;
    if (!pc) return;
    free((void *)pc->piece);
    free(pc->sums);
    free(pc->norms);
    free(pc);
    ctx->pieces = NULL;
}
