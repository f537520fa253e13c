/* rt_clip.c - the gradients' global norm for clip_grad_norm (torch.nn.utils.clip_grad_norm_).
 *
 * The flat gradient buffer is cut into RT_CLIP_PARTS blocks fixed by n alone (at least
 * RT_CLIP_MIN floats each); each block's squares are added in double, left to right, by
 * whichever thread takes it, and the blocks' sums are then added in block order. So the norm
 * is the same bits for any number of threads, run after run. The CUDA backend forms the same
 * sum with its own fixed tree (codegen/cuda_step.c: cu_clip), which can differ in the last bits
 * of the double, far below the float the scale is rounded to.
 */
#include <math.h>
#include <omp.h>

#include "netrt.h"

enum {
    RT_CLIP_PARTS = 1024, /* blocks at most */
    RT_CLIP_MIN = 16384,  /* floats per block at least: a block is worth a thread */
};

double rt_grad_norm(const float *g, int64_t n) { return sqrt(rt_grad_sumsq(g, n)); }

double rt_grad_sumsq(const float *g, int64_t n) {
    double part[RT_CLIP_PARTS];
    int64_t len = (n + RT_CLIP_PARTS - 1) / RT_CLIP_PARTS;
    if (len < RT_CLIP_MIN) len = RT_CLIP_MIN;
    int nb = (int)((n + len - 1) / len);
    #pragma omp parallel for schedule(static) if (nb > 1)
    for (int b = 0; b < nb; b++) {
        int64_t lo = (int64_t)b * len, hi = lo + len < n ? lo + len : n;
        double s = 0;
        for (int64_t i = lo; i < hi; i++) s += (double)g[i] * (double)g[i];
        part[b] = s;
    }
    double total = 0;
    for (int b = 0; b < nb; b++) total += part[b];
    return total;
}
