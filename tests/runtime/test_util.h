/* test_util.h - what the runtime tests share: deterministic test values (uniform in [-1, 1)
 * from a 64-bit LCG, so every run checks the same numbers) and convolution geometries. */
#ifndef NETC_TEST_UTIL_H
#define NETC_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>

#include "netrt.h"

static uint64_t rng = 12345;

static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1 << 24)) * 2 - 1;
}

/* n values from frand(); the caller frees them. */
static float *randv(int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = frand();
    return v;
}

/* An N x C x H x (H + 1) input, K filters of k x k, and the output size that follows. */
static inline RtConv geometry(int64_t N, int64_t C, int64_t H, int64_t K, int k, int stride, int pad, int dil, int groups) {
    RtConv c = {.N = N, .C = C, .H = H, .W = H + 1, .K = K, .R = k, .S = k, .stride_h = stride,
                .stride_w = stride, .pad_h = pad, .pad_w = pad, .dil_h = dil, .dil_w = dil, .groups = groups};
    c.P = (c.H + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    c.Q = (c.W + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    return c;
}

#endif
