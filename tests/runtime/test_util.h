/* test_random.h - the runtime tests' deterministic test values: uniform in [-1, 1) from a
 * 64-bit LCG, so every run checks the same numbers. */
#ifndef NETC_TEST_RANDOM_H
#define NETC_TEST_RANDOM_H

#include <stdint.h>
#include <stdlib.h>

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

#endif
