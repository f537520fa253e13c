/* rt_bits.h - the scalar functions whose every bit the host and the device must agree on: the
 * seed mixer, the dropout mask, and float32 to and from IEEE binary16 and bfloat16 (round to
 * nearest even). One definition serves the runtime and the generated CPU code (C, through
 * netrt.h) and the generated CUDA kernels (NVRTC, through netrt_kernels.cuh, which netc hands
 * this file as a header), so a mask or a rounding cannot drift between the two backends.
 *
 * NVRTC has no standard headers: under it the includer (netrt_kernels.cuh) has defined the
 * fixed-width integer types, and the bit casts are the device intrinsics.
 */
#ifndef RT_BITS_H
#define RT_BITS_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define RT_BITS_FN static __device__ __forceinline__
RT_BITS_FN uint32_t rt_bits_of(float f) { return __float_as_uint(f); }
RT_BITS_FN float rt_float_of(uint32_t u) { return __uint_as_float(u); }
#else
#include <stdint.h>
#include <string.h>
/* always inlined, as __forceinline__ on the device: a loop that calls one of these (a generated
 * activation's) vectorises only if the call is inlined, and GCC's -O2 heuristics declined some
 * once an activation called two of them (the exact GELU's gradient: rt_erff and rt_expf_nonpos) */
#define RT_BITS_FN static inline __attribute__((always_inline))
RT_BITS_FN uint32_t rt_bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
RT_BITS_FN float rt_float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#endif

/* splitmix64's finaliser: seeds for initialisation, shuffling and dropout. */
RT_BITS_FN uint64_t rt_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The dropout seed of the step after `step` steps were taken, from the run's --seed. */
RT_BITS_FN uint64_t rt_step_seed(uint64_t seed, int64_t step) { return rt_mix(seed ^ rt_mix((uint64_t)step)); }

/* Dropout mask bit for element i of mask `seed_id` at step seed `seed`: 1 = keep.
 * A counter-based hash, so the forward and backward passes agree without storing the mask. */
RT_BITS_FN int rt_dropout_keep(uint64_t seed, int seed_id, int64_t i, double p) {
    uint64_t z = seed ^ ((uint64_t)seed_id * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xBF58476D1CE4E5B9ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0) >= p;
}

RT_BITS_FN float rt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000 | (man << 13); /* inf, nan */
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    return rt_float_of(bits);
}

RT_BITS_FN uint16_t rt_f32_to_f16(float f) {
    uint32_t x = rt_bits_of(f);
    uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int32_t e = (int32_t)exp - 112;
    if (e >= 0x1f) return (uint16_t)(sign | 0x7c00); /* overflow to inf */
    if (e <= 0) {                                    /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e), half = man >> shift, rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into the exponent */
    return (uint16_t)half;
}

/* rt_expf's steps up to 2^n, shared with rt_expf_nonpos: e^r for xc's reduced argument r, and
 * *ni = n = round(xc / ln 2) (t's low bits, t = xc / ln 2 + 1.5 * 2^23). */
RT_BITS_FN float rt_exp_reduced(float xc, int32_t *ni) {
    const float big = 12582912.0f, t = xc * 1.44269504088896341f + big, n = t - big;
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    *ni = (int32_t)(rt_bits_of(t) - rt_bits_of(big));
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

/* e^x, within 2 ulp of the exact value for x in [-87.33, 88.72] (tests/runtime/test_kernels.c
 * measures it), in arithmetic a compiler vectorizes: libm's expf is a call per element, which
 * keeps the loops of the activations that read it (sigmoid, SiLU, GELU's tanh form) scalar, and
 * the device's expf is not the host's. n = round(x / ln 2) by adding 1.5 * 2^23 (t's low bits
 * then hold n), r = x - n ln 2 in two parts (Cody and Waite), e^r by Cephes' degree-6
 * polynomial, times 2^n as two factors 2^h 2^(n-h), each a normal number, so that n = 128 (x
 * within 2^-7 of ln FLT_MAX) neither overflows early nor rounds twice. Below ln FLT_MIN
 * (-87.34) it is 0 where expf gives subnormals, above ln FLT_MAX +inf, NaN stays NaN. */
RT_BITS_FN float rt_expf(float x) {
    const float lo = -87.3365479f, hi = 88.7228394f;
    int32_t ni;
    const float p = rt_exp_reduced(x < lo ? lo : x > hi ? hi : x, &ni);
    const int32_t h = ni / 2;
    const float s1 = rt_float_of((uint32_t)(h + 127) << 23), s2 = rt_float_of((uint32_t)(ni - h + 127) << 23);
    const float v = p * s1 * s2; /* computed for every x, then chosen, so that the loop has no branch */
    return x < lo ? 0.0f : x > hi ? rt_float_of(0x7f800000u) : v;
}

/* rt_expf(x) for x <= 0, bit for bit, in fewer operations (0.55 ns an element where rt_expf
 * takes 0.89, on an AVX2 EPYC): a softmax's e^(x - max), a sigmoid's e^-|x|. Here n is in
 * [-126, 0], so 2^n is one normal factor and p 2^n rounds once, as p 2^h 2^(n-h) does (the
 * first product is exact), and nothing overflows, so x needs no upper clamp. The same holds up
 * to x < 88 (n <= 127), where cross-entropy's x - lse may land when the lse is recovered from the
 * rounded loss; not above. Every float below 88 gave rt_expf's bits when this was written (all
 * 3.27e9, vectorised for x86-64 and x86-64-v3); test_kernels checks every 97th. */
RT_BITS_FN float rt_expf_nonpos(float x) {
    const float lo = -87.3365479f;
    int32_t ni;
    const float p = rt_exp_reduced(x < lo ? lo : x, &ni);
    const float v = p * rt_float_of((uint32_t)(ni + 127) << 23);
    return x < lo ? 0.0f : v;
}

/* erf(x) in float, within 2 ulp of the exact value (test_erff; measured 1.3), branch-free so
 * that the exact GELU's loops vectorise, and the same bits on both backends. Two pieces, both
 * computed and one chosen:
 *   |x| < 0.921875: x + x P(x^2), P of degree 6;
 *   above: 1 - e^Q(|x|), Q of degree 9 fitted to log(erfc) on [0.921875, 4] (|x| clamped to 4,
 *          where erfc is far below half an ulp of 1, so the result is 1).
 * The coefficients are least-squares fits in double weighted for erf's relative error, rounded
 * to float; every operation rounds once (no fused multiply-add), as the tests measured it. */
RT_BITS_FN float rt_erff(float x) {
    const float a = x < 0.0f ? -x : x, t = a * a, c = a < 4.0f ? a : 4.0f;
    float p = 8.364897076e-05f;
    p = p * t + -8.141363505e-04f;
    p = p * t + 5.200902466e-03f;
    p = p * t + -2.685933933e-02f;
    p = p * t + 1.128369421e-01f;
    p = p * t + -3.761263490e-01f;
    p = p * t + 1.283791661e-01f;
    const float small = a + a * p;
    float q = 9.966132666e-07f;
    q = q * c + -1.603487362e-05f;
    q = q * c + 9.067297651e-05f;
    q = q * c + -8.831683772e-06f;
    q = q * c + -3.067728598e-03f;
    q = q * c + 2.333091199e-02f;
    q = q * c + -1.063903496e-01f;
    q = q * c + -6.346029639e-01f;
    q = q * c + -1.129037976e+00f;
    q = q * c + 9.576410957e-05f;
    const float big = 1.0f - rt_expf(q), r = a < 0.921875f ? small : big;
    return x != x ? x : x < 0.0f ? -r : r;
}

/* tanh(x) in float, within 2 ulp of the exact value (test_tanhf; measured 1.31, where glibc's
 * tanhf is 2.16 off), branch-free so that its loops vectorise (an LSTM's and a GRU's gates, mish;
 * libm's tanhf is a call per element, 13 ns against 1.1 on an AMD EPYC with AVX-512), and the same
 * bits on both backends. Two pieces, both computed and one chosen:
 *   |x| < 0.625: x + x^3 P(x^2), Cephes' polynomial of degree 4;
 *   above: 1 - 2 / (e^(2|x|) + 1) by rt_expf, |x| clamped to 20, where tanh is 1 in float. */
RT_BITS_FN float rt_tanhf(float x) {
    const float a = x < 0.0f ? -x : x, s = a * a, c = a < 20.0f ? a : 20.0f;
    float p = -5.70498872745e-3f;
    p = p * s + 2.06390887954e-2f;
    p = p * s + -5.37397155531e-2f;
    p = p * s + 1.33314422036e-1f;
    p = p * s + -3.33332819422e-1f;
    const float small = a + a * s * p, big = 1.0f - 2.0f / (rt_expf(c + c) + 1.0f);
    const float r = a < 0.625f ? small : big;
    return x != x ? x : x < 0.0f ? -r : r;
}

RT_BITS_FN float rt_bf16_to_f32(uint16_t h) { return rt_float_of((uint32_t)h << 16); }

RT_BITS_FN uint16_t rt_f32_to_bf16(float f) {
    uint32_t x = rt_bits_of(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
