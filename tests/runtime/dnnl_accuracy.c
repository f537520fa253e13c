/* dnnl_accuracy.c - oneDNN's channels-last convolutions against float64, under the instruction
 * set oneDNN picks for this CPU and under a user's cap, kept so that the choice can be checked
 * again when oneDNN changes.
 *
 *   dnnl_accuracy [--report] [--isa NAME]
 *
 * Runs netc's three channels-last convolutions (rt_conv2d_nhwc_*) on ResNet geometries and
 * measures each result against a float64 loop on the same float32 inputs, and, as the yardstick
 * for float32 rounding, a plain float32 loop (one running sum per output element, in loop order).
 * The error of a tensor is max |got - exact| / max |exact|.
 *
 * It asserts that oneDNN ran at least the best instruction set this CPU has by the compiler's
 * CPU detection (the trainer leaves the choice to oneDNN), or with --isa NAME (a user's
 * ONEDNN_MAX_CPU_ISA=NAME) NAME, or the CPU's best where that is older; and, without --report,
 * that every result is within 4x the plain loop's error (+1e-7). A correct float32 kernel sums
 * the same terms in another order, blocked or in runs one after another, and is about as far from
 * the exact value as one running sum or nearer. Measured with oneDNN 2.6.3: AVX-512 (brgconv and
 * jit:avx512_core, an AMD EPYC with avx512_bf16) 0.13-1.25x the loop's error, AVX2 0.2-1.8x,
 * SSE41 0.1-1.6x; oneDNN 3.2 on an AVX2 AMD EPYC (brgconv:avx2 forward and data gradient)
 * 0.14-1.25x, SSE41 0.07-1.61x. Without AVX-512 the weight gradient is the runtime's im2col and
 * sgemm from 32 input channels (rt_dnnl.c; "im2col+sgemm" in the table, "im2col+openblas" where
 * the product goes to OpenBLAS: a result of 64K elements or more), 0.10-0.68x there, and
 * the data gradient below 8 input channels an sgemm and col2im ("sgemm+col2im"), 0.19-0.50x.
 * 4x leaves room for another order and nothing for a wrong one, which is off by
 * far more: a kernel that rounded its operands to bfloat16 would be about a thousand times the
 * loop's error (2^-9 against 1e-6 to 3e-6 at these sizes).
 * It also asserts the path of each result: the weight gradient's im2col+sgemm, and all three
 * directions by Winograd's F(2x2, 3x3) (rt_winograd.c: without AVX-512, 3x3 of stride 1 and
 * padding 1 from 32 channels in and out, unless NETC_CONV=direct; with NETC_CONV=winograd on
 * AVX-512 too), exactly where rt_dnnl.c's rules put them. Winograd's results, measured here on
 * the AVX2 EPYC: 0.1-0.9x the loop's error (its sums run in oneDNN's sgemm, and its transforms
 * add at most 9 terms). The cases include an odd height, an odd width, channels in and out
 * unequal, and tile counts that fill rt_winograd.c's blocks partly and that make one block.
 * Winograd's weight gradient must also give the same bits from 1 and 3 threads as from the
 * default. With --report it prints the same table and asserts only the instruction set and the
 * paths.
 */
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netrt.h"
#include "rt_internal.h" /* rt_openblas_current: the OpenBLAS weight gradient's condition */

#include "test_util.h"

enum { FWD, BWD_DATA, BWD_WEIGHTS };
static const char *direction[] = {"forward", "data gradient", "weight gradient"};

/* One direct convolution on NHWC activations and oihw weights (groups 1), in double or float:
 * FWD y = conv(x, w); BWD_DATA dx from dy and w; BWD_WEIGHTS dw from x and dy. Each output is
 * one running sum over its terms in loop order. The weights (and the weight gradient's sums) are
 * held as [R][S][K][C] so that the innermost loop runs along contiguous channels. */
#define DIRECT(NAME, T)                                                                              \
    static void NAME(const RtConv *c, int dir, const float *x, const float *w, const float *dy,     \
                     float *out) {                                                                   \
        int64_t K = c->K, C = c->C, RS = c->R * c->S;                                                \
        int64_t n_out = dir == FWD ? c->N * c->P * c->Q * K : dir == BWD_DATA ? c->N * c->H * c->W * C \
                                                                               : K * C * RS;         \
        T *acc = calloc((size_t)n_out, sizeof *acc), *wt = malloc((size_t)(K * C * RS) * sizeof *wt); \
        for (int64_t k = 0; k < K; k++)                                                              \
            for (int64_t ch = 0; ch < C; ch++)                                                       \
                for (int64_t rs = 0; rs < RS; rs++) wt[(rs * K + k) * C + ch] = w[(k * C + ch) * RS + rs]; \
        for (int64_t n = 0; n < c->N; n++)                                                           \
            for (int64_t p = 0; p < c->P; p++)                                                       \
                for (int64_t q = 0; q < c->Q; q++)                                                   \
                    for (int64_t rs = 0; rs < RS; rs++) {                                            \
                        int64_t h = p * c->stride_h - c->pad_h + rs / c->S * c->dil_h;               \
                        int64_t v = q * c->stride_w - c->pad_w + rs % c->S * c->dil_w;               \
                        if (h < 0 || h >= c->H || v < 0 || v >= c->W) continue;                      \
                        const float *xs = x + ((n * c->H + h) * c->W + v) * C;                       \
                        int64_t yi = ((n * c->P + p) * c->Q + q) * K;                                \
                        for (int64_t k = 0; k < K; k++) {                                            \
                            const T *wk = wt + (rs * K + k) * C;                                     \
                            if (dir == FWD) {                                                        \
                                T sum = acc[yi + k];                                                 \
                                for (int64_t ch = 0; ch < C; ch++) sum += (T)xs[ch] * wk[ch];        \
                                acc[yi + k] = sum;                                                   \
                            } else if (dir == BWD_DATA) {                                            \
                                T *dx = acc + ((n * c->H + h) * c->W + v) * C, g = dy[yi + k];       \
                                for (int64_t ch = 0; ch < C; ch++) dx[ch] += g * wk[ch];             \
                            } else {                                                                 \
                                T *dw = acc + (rs * K + k) * C, g = dy[yi + k];                      \
                                for (int64_t ch = 0; ch < C; ch++) dw[ch] += (T)xs[ch] * g;          \
                            }                                                                        \
                        }                                                                            \
                    }                                                                                \
        if (dir == BWD_WEIGHTS)                                                                      \
            for (int64_t k = 0; k < K; k++)                                                          \
                for (int64_t ch = 0; ch < C; ch++)                                                   \
                    for (int64_t rs = 0; rs < RS; rs++) out[(k * C + ch) * RS + rs] = (float)acc[(rs * K + k) * C + ch]; \
        else                                                                                         \
            for (int64_t i = 0; i < n_out; i++) out[i] = (float)acc[i];                              \
        free(acc), free(wt);                                                                         \
    }
DIRECT(direct_f64, double)
DIRECT(direct_f32, float)

/* The float64 value rounded once to float32 is the reference; its own rounding (u/2 relative)
 * is far below the errors measured. */
static double error(const float *got, const float *exact, int64_t n) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - exact[i]));
        scale = fmax(scale, fabs((double)exact[i]));
    }
    return diff / scale;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE41";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2_VNNI";
    case dnnl_cpu_isa_avx512_core: return "AVX512_CORE";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX512_CORE_VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX512_CORE_BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX512_CORE_AMX";
    default: return "OTHER";
    }
}

/* ONEDNN_MAX_CPU_ISA's names for the values isa_name prints; 0 for another name. */
static dnnl_cpu_isa_t isa_value(const char *name) {
    static const dnnl_cpu_isa_t all[] = {dnnl_cpu_isa_sse41,          dnnl_cpu_isa_avx,
                                         dnnl_cpu_isa_avx2,           dnnl_cpu_isa_avx512_core,
                                         dnnl_cpu_isa_avx512_core_vnni, dnnl_cpu_isa_avx512_core_bf16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(isa_name(all[i]), name) == 0) return all[i];
    return (dnnl_cpu_isa_t)0;
}

/* The best instruction set of the ones oneDNN's float32 kernels use that this CPU has (gcc's and
 * clang's CPU detection, independent of oneDNN's): what oneDNN must pick by default. */
static dnnl_cpu_isa_t best_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        if (__builtin_cpu_supports("avx512bf16")) return dnnl_cpu_isa_avx512_core_bf16;
        if (__builtin_cpu_supports("avx512vnni")) return dnnl_cpu_isa_avx512_core_vnni;
        return dnnl_cpu_isa_avx512_core;
    }
    if (__builtin_cpu_supports("avx2")) return dnnl_cpu_isa_avx2;
    if (__builtin_cpu_supports("avx")) return dnnl_cpu_isa_avx;
    return dnnl_cpu_isa_sse41;
}

/* Results that took another path than rt_dnnl.c's rules give: on every CPU, all three directions
 * of a 3x3 convolution of stride 1 and padding 1 with at least 32 channels in and out are
 * Winograd's and the data gradient of fewer than 8 input channels is a product and col2im
 * (unless NETC_CONV=direct); without AVX-512 the weight gradient of any other convolution of at
 * least 32 input channels is the runtime's im2col and sgemm; every other result is a oneDNN
 * primitive's. A silent fallback would change the speed and the rounding this table measures. */
static int wrong_paths;
/* Winograd weight gradients whose bits changed with the number of threads. */
static int thread_bits;

static const char *expected_path(const RtConv *c, int dir, int avx512) {
    const char *choice = getenv("NETC_CONV") && *getenv("NETC_CONV") ? getenv("NETC_CONV") : "auto";
    const int own = strcmp(choice, "direct") != 0;
    int wino = c->R == 3 && c->S == 3 && c->stride_h == 1 && c->stride_w == 1 && c->pad_h == 1 && c->pad_w == 1 &&
               c->dil_h == 1 && c->dil_w == 1 && c->groups == 1 && c->C >= 32 && c->K >= 32;
    if (wino && own) return "winograd";
    if (dir == BWD_DATA && c->C < 8 && c->groups == 1 && own) return "sgemm+col2im";
    if (avx512 || dir != BWD_WEIGHTS || c->C < 32 || c->groups != 1) return NULL;
    /* rt_dnnl.c's RT_WGRAD_OPENBLAS_MIN, written out: a changed rule must change this test too */
    return c->R * c->S * c->C * c->K >= 65536 && own && rt_openblas_current()
               ? "im2col+openblas" : "im2col+sgemm";
}

/* Winograd's weight gradient sums in an order fixed by the geometry (rt_winograd.c): the same
 * bits from 1 and 3 threads as from the default; 1 if not. */
static int same_bits_any_threads(const RtConv *c, const float *x, const float *dy, const float *got) {
    int64_t nw = c->K * c->C * c->R * c->S, threads = omp_get_max_threads(), differ = 0;
    float *again = malloc((size_t)nw * sizeof *again);
    for (int t = 1; t <= 3; t += 2) {
        RtConvPlan *plan = NULL;
        omp_set_num_threads(t);
        rt_conv2d_nhwc_bwd_filter(c, &plan, x, dy, again);
        rt_conv_plan_free(plan);
        if (memcmp(again, got, (size_t)nw * sizeof *again) != 0) {
            printf("  weight gradient from %d threads: other bits than from %d  <- expected the same\n", t,
                   (int)threads);
            differ = 1;
        }
    }
    omp_set_num_threads((int)threads);
    free(again);
    return differ;
}

/* One geometry, three directions; returns how many results are beyond the bound. */
static int check(const char *name, RtConv c) {
    int64_t nx = c.N * c.H * c.W * c.C, ny = c.N * c.P * c.Q * c.K, nw = c.K * c.C * c.R * c.S;
    float *x = randv(nx), *w = randv(nw), *dy = randv(ny);
    int64_t n_out[] = {ny, nx, nw};
    int failed = 0;
    for (int dir = FWD; dir <= BWD_WEIGHTS; dir++) {
        float *got = malloc((size_t)n_out[dir] * 4), *exact = malloc((size_t)n_out[dir] * 4),
              *loop = malloc((size_t)n_out[dir] * 4);
        RtConvPlan *plan = NULL;
        if (dir == FWD) rt_conv2d_nhwc_fwd(&c, &plan, x, w, got);
        else if (dir == BWD_DATA) rt_conv2d_nhwc_bwd_data(&c, &plan, dy, w, got);
        else rt_conv2d_nhwc_bwd_filter(&c, &plan, x, dy, got);
        direct_f64(&c, dir, x, w, dy, exact);
        direct_f32(&c, dir, x, w, dy, loop);
        double e = error(got, exact, n_out[dir]), e_loop = error(loop, exact, n_out[dir]);
        int bad = !(e <= 4 * e_loop + 1e-7);
        dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        int avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
        const char *want = expected_path(&c, dir, avx512), *impl = rt_conv_plan_impl(plan);
        int own = strncmp(impl, "im2col+", 7) == 0 || strcmp(impl, "winograd") == 0;
        int wrong = want ? strcmp(impl, want) != 0 : own;
        printf("  %-18s %-16s %-22s error %.2e, float32 loop %.2e (%.2fx)%s%s%s\n", name, direction[dir], impl, e,
               e_loop, e / e_loop, bad ? "  <- above 4x" : "", wrong ? "  <- expected " : "",
               wrong ? (want ? want : "a oneDNN primitive") : "");
        wrong_paths += wrong;
        failed += bad;
        if (dir == BWD_WEIGHTS && strcmp(impl, "winograd") == 0) thread_bits += same_bits_any_threads(&c, x, dy, got);
        rt_conv_plan_free(plan);
        free(got), free(exact), free(loop);
    }
    free(x), free(w), free(dy);
    return failed;
}

int main(int argc, char **argv) {
    int report = 0;
    const char *want_isa = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--report") == 0) report = 1;
        else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) want_isa = argv[++i];
        else return fprintf(stderr, "usage: dnnl_accuracy [--report] [--isa NAME]\n"), 2;
    }
    /* ResNet-18 (CIFAR) at batch 8: its 3x3 stem, a 3x3 layer at 32x32 (at width 16 and 64), the
     * stride-2 3x3 and its 1x1 shortcut, a stride-2 3x3 of the third stage; ResNet-50's 7x7
     * stride-2 stem on 3 channels. Every input is one column wider than high (geometry()); for
     * Winograd also 29 x 30 at batch 5 (1125 tiles: at 2 threads, as ctest runs it, 8 blocks of
     * 128 and one of 101) and 7 x 8 at batch 4, 128 channels to 96 (48 tiles: one block). For
     * the im2col weight gradient (rt_dnnl.c) ResNet-50's 1x1 convolutions of stride 1, which
     * read the input in place, as [K][C] (256->64) and as its transpose (64->256), both in oneDNN's
     * sgemm, and 1024->256 and 256->1024 (of 64K elements or more) in OpenBLAS's, and a 3x3/2
     * of 32 channels to 384 whose 3840 rows take two chunks of 3640 into one transposed product.
     * For the data gradient's product and col2im, the stems above (padding: taps cut at the
     * edges), LeNet's second convolution and a dilated 3x3 (taps added one by one). */
    struct { const char *name; RtConv c; } cases[] = {
        {"3x3 stem 3->64", geometry(8, 3, 32, 64, 3, 1, 1, 1, 1)},
        {"3x3 16->16", geometry(8, 16, 32, 16, 3, 1, 1, 1, 1)},
        {"3x3 64->64", geometry(8, 64, 32, 64, 3, 1, 1, 1, 1)},
        {"3x3 32->64 29x30", geometry(5, 32, 29, 64, 3, 1, 1, 1, 1)},
        {"3x3 128->96 7x8", geometry(4, 128, 7, 96, 3, 1, 1, 1, 1)},
        {"3x3/2 64->128", geometry(8, 64, 32, 128, 3, 2, 1, 1, 1)},
        {"1x1/2 64->128", geometry(8, 64, 32, 128, 1, 2, 0, 1, 1)},
        {"3x3/2 128->256", geometry(8, 128, 16, 256, 3, 2, 1, 1, 1)},
        {"7x7/2 stem 3->64", geometry(8, 3, 32, 64, 7, 2, 3, 1, 1)},
        {"1x1 64->256", geometry(4, 64, 14, 256, 1, 1, 0, 1, 1)},
        {"1x1 256->64", geometry(4, 256, 14, 64, 1, 1, 0, 1, 1)},
        {"1x1 1024->256", geometry(2, 1024, 14, 256, 1, 1, 0, 1, 1)},
        {"1x1 256->1024", geometry(2, 256, 14, 1024, 1, 1, 0, 1, 1)},
        {"3x3/2 32->384", geometry(15, 32, 31, 384, 3, 2, 1, 1, 1)},
        {"5x5 6->16 LeNet", geometry(16, 6, 14, 16, 5, 1, 0, 1, 1)},
        {"3x3 dil 2 4->8", geometry(4, 4, 12, 8, 3, 1, 2, 2, 1)},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) failed += check(cases[i].name, cases[i].c);
    /* after the first plan: the ISA oneDNN dispatched to */
    const char *isa = isa_name(dnnl_get_effective_cpu_isa());
    const char *env = getenv("ONEDNN_MAX_CPU_ISA") ? getenv("ONEDNN_MAX_CPU_ISA") : getenv("DNNL_MAX_CPU_ISA");
    printf("dnnl_accuracy: oneDNN %d.%d.%d ran %s (ONEDNN_MAX_CPU_ISA %s)\n", dnnl_version()->major,
           dnnl_version()->minor, dnnl_version()->patch, isa, env ? env : "unset: oneDNN's choice");
    dnnl_cpu_isa_t ran = dnnl_get_effective_cpu_isa(), best = best_isa(), want = best;
    if (want_isa) {
        dnnl_cpu_isa_t named = isa_value(want_isa);
        if (!named) return fprintf(stderr, "dnnl_accuracy: unknown --isa %s\n", want_isa), 2;
        if ((best & named) == named) want = named; /* the ISA values nest as bit masks */
    }
    /* by default at least the best (a newer CPU's AMX or AVX512_CORE_FP16 contains it: the ISA
     * values nest as bit masks); held to a set, that set, where AVX2_VNNI's float32 kernels are
     * AVX2's (oneDNN reports it on CPUs that have it) */
    int isa_ok = !want_isa ? (ran & best) == best : ran == want || (want == dnnl_cpu_isa_avx2 && ran == dnnl_cpu_isa_avx2_vnni);
    if (!isa_ok) {
        fprintf(stderr, "dnnl_accuracy: oneDNN ran %s, expected %s\n", isa, isa_name(want));
        return 1;
    }
    if (thread_bits) {
        fprintf(stderr, "dnnl_accuracy: %d Winograd weight gradients changed with the number of threads\n",
                thread_bits);
        return 1;
    }
    if (wrong_paths) {
        fprintf(stderr, "dnnl_accuracy: %d results took another path than the runtime's rule\n", wrong_paths);
        return 1;
    }
    if (report) {
        printf("dnnl_accuracy: report only; %s\n", failed ? "ABOVE the bound on this CPU" : "within the bound on this CPU");
        return 0;
    }
    if (failed) fprintf(stderr, "dnnl_accuracy: %d results beyond 4x the float32 loop's error\n", failed);
    return failed != 0;
}
