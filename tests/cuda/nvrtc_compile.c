/* nvrtc_compile.c - does runtime/cuda/netrt_kernels.cuh (with the netrt_*.cuh it includes) compile
 * under NVRTC, warning-free?
 *
 * Usage: nvrtc_compile DIR     (DIR holds netrt_kernels.cuh and rt_devstate.h; DIR/.. rt_bits.h
 *                              and rt_recipe.h)
 *
 * Compiles a small .cu that includes both headers the way netc's generated code does (handed
 * to NVRTC as headers, no system headers) and calls every device function from an
 * extern "C" __global__ kernel, with constant geometry as netc emits it, for sm_80 and sm_90.
 * Fails when a compilation fails, when NVRTC's log is not empty (a warning), or when a kernel
 * is missing from the cubin. Needs NVRTC only, no GPU: nothing here runs a kernel.
 */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_HDR = 8 }; /* the headers below */

#define KERNELS(X) \
    X(k_bits) X(k_maxpool_nchw_2x2) X(k_maxpool_nhwc_3x3) X(k_avgpool_nchw) X(k_avgpool_nhwc) \
    X(k_softmax) X(k_xent) X(k_accuracy) X(k_mean) X(k_bn_train_nhwc) X(k_bn_eval_nchw) X(k_bn_bwd) X(k_recipe) \
    X(k_views) \
    X(k_attention) X(k_attention_rows) X(k_attention_keys) X(k_attention_masked) X(k_attention_masked_keys) \
    X(k_attention_wide) X(k_index)

static const char source[] =
    "#include \"netrt_kernels.cuh\"\n"
    "#include \"rt_devstate.h\"\n"
    "#define F(off) ((float *)(base + (off)))\n"
    "#define D(off) ((double *)(base + (off)))\n"
    "#define L(off) ((const int64_t *)(base + (off)))\n"
    "#define I(off) ((int64_t *)(base + (off)))\n"
    "extern \"C\" __global__ void k_bits(unsigned char *base) {\n"
    "    RtDevState *st = (RtDevState *)base;\n"
    "    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n"
    "    if (i == 0) st->step_seed = rt_step_seed(st->seed, st->step);\n"
    "    uint16_t *h = (uint16_t *)(base + 4096);\n"
    "    float v = rt_dropout_keep(st->step_seed, 3, i, 0.25) ? F(8192)[i] : 0.0f;\n"
    "    h[i] = rt_f32_to_f16(v + rt_f16_to_f32(h[i]));\n"
    "    h[i + 1024] = rt_f32_to_bf16(v * rt_bf16_to_f32(h[i + 1024]));\n"
    "    F(8192)[i] = (float)(rt_mix((uint64_t)i) >> 40) + INFINITY * 0.0f + (isfinite(v) ? 0.0f : NAN);\n"
    "}\n"
    "extern \"C\" __global__ void k_maxpool_nchw_2x2(unsigned char *base) {\n"
    "    const RtKPool p = {8, 16, 32, 32, 16, 16, 2, 2, 2, 2, 0, 0};\n"
    "    rt_k_maxpool_fwd(p, 0, F(0), F(1 << 20));\n"
    "    rt_k_maxpool_bwd(p, 0, F(0), F(1 << 21), F(1 << 22));\n"
    "}\n"
    "extern \"C\" __global__ void k_maxpool_nhwc_3x3(unsigned char *base) {\n"
    "    const RtKPool p = {8, 64, 56, 56, 28, 28, 3, 3, 2, 2, 1, 1};\n"
    "    rt_k_maxpool_fwd(p, 1, F(0), F(1 << 24));\n"
    "    rt_k_maxpool_bwd(p, 1, F(0), F(1 << 25), F(1 << 26));\n"
    "}\n"
    "extern \"C\" __global__ void k_avgpool_nchw(unsigned char *base) {\n"
    "    const RtKPool p = {8, 16, 7, 7, 1, 1, 7, 7, 1, 1, 0, 0};\n"
    "    rt_k_avgpool_fwd(p, 0, F(0), F(1 << 20));\n"
    "    rt_k_avgpool_bwd(p, 0, F(1 << 21), F(1 << 22));\n"
    "}\n"
    "extern \"C\" __global__ void k_avgpool_nhwc(unsigned char *base) {\n"
    "    const RtKPool p = {8, 32, 15, 15, 8, 8, 3, 3, 2, 2, 1, 1};\n"
    "    rt_k_avgpool_fwd(p, 1, F(0), F(1 << 20));\n"
    "    rt_k_avgpool_bwd(p, 1, F(1 << 21), F(1 << 22));\n"
    "}\n"
    "extern \"C\" __global__ void k_softmax(unsigned char *base) {\n"
    "    rt_k_softmax_fwd(128, 1000, F(0), F(1 << 20));\n"
    "    rt_k_softmax_bwd(128, 1000, F(1 << 20), F(1 << 21), F(1 << 22));\n"
    "}\n"
    "extern \"C\" __global__ void k_xent(unsigned char *base) {\n"
    "    RtBatchHeader *b = (RtBatchHeader *)(base + 4096);\n"
    "    rt_k_xent_fwd(128, 10, F(0), L(4096 + 256), 0.1f, b->n_valid, F(1 << 20));\n"
    "    rt_k_xent_bwd(128, 10, F(0), L(4096 + 256), 0.0f, b->n_valid, F(1 << 20), F(1 << 21), F(1 << 22));\n"
    "}\n"
    "extern \"C\" __global__ void k_accuracy(unsigned char *base) {\n"
    "    rt_k_accuracy_part(128, 10, F(0), L(4096 + 256), RT_K_NO_IGNORE, 100, D(1 << 22));\n"
    "    rt_k_accuracy_part(128, 10, F(0), L(4096 + 256), -100, 100, D(1 << 22));\n"
    "    rt_k_accuracy_top_part(128, 10, F(0), L(4096 + 256), RT_K_NO_IGNORE, 5, 100, D(1 << 22));\n"
    "    rt_k_accuracy_total(128, D(1 << 22), F(1 << 20));\n"
    "}\n"
    "extern \"C\" __global__ void k_mean(unsigned char *base) {\n"
    "    rt_k_mean(4096, F(0), 1, F(1 << 20));\n"
    "}\n"
    "extern \"C\" __global__ void k_bn_train_nhwc(unsigned char *base) {\n"
    "    rt_k_bn_stats_part(8 * 32 * 32, 64, 32 * 32, 1, F(0), D(1 << 22));\n"
    "    rt_k_bn_stats_final(8 * 32 * 32, 64, 32, D(1 << 22), F(1 << 23), 1e-5, 0.1, F(1 << 24), 1);\n"
    "}\n"
    "extern \"C\" __global__ void k_bn_eval_nchw(unsigned char *base) {\n"
    "    rt_k_bn_stats_part(8 * 7 * 7, 512, 7 * 7, 0, F(0), D(1 << 22));\n"
    "    rt_k_bn_stats_final(8 * 7 * 7, 512, 2, D(1 << 22), F(1 << 23), 1e-5, 0.1, F(1 << 24), 0);\n"
    "}\n"
    "extern \"C\" __global__ void k_bn_bwd(unsigned char *base) {\n"
    "    rt_k_bn_bwd_part(8 * 32 * 32, 64, 32 * 32, 0, F(0), F(1 << 21), F(1 << 22), D(1 << 23));\n"
    "    rt_k_bn_bwd_final(64, 32, D(1 << 23), F(1 << 24));\n"
    "}\n"
    "extern \"C\" __global__ void k_views(unsigned char *base) {\n"
    "    rt_k_permute(RtKPermute{{8, 12, 64, 64}, {49152, 64, 1, 768}, 4}, 8 * 12 * 64 * 64, F(0), F(1 << 22));\n"
    "    rt_k_permute(RtKPermute{{8, 4}, {1, 8}, 2}, 32, (const int64_t *)L(0), (int64_t *)(base + (1 << 22)));\n"
    "    rt_k_slice(8, 2304, 768, 64, 768, F(0), F(1 << 22));\n"
    "    rt_k_slice(8, 16, 15, 1, 1, L(0), (int64_t *)(base + (1 << 22)));\n"
    "    rt_k_slice_bwd(8, 2304, 768, 64, 768, F(0), F(1 << 22));\n"
    "    rt_k_concat(8, 3, 5, 64, F(0), F(1 << 20), F(1 << 22));\n"
    "    rt_k_max_axis(8, 64, 12, F(0), F(1 << 20));\n"
    "    rt_k_max_axis_bwd(8, 64, 12, F(0), F(1 << 20), F(1 << 22));\n"
    "}\n"
    "#define ATTN const RtKAttn a = {48, 256, 256, 64, 64, 0.125f, 1, 0, 2, {4, 12, 1, 1}, {0, 0, 0, 0}, 0, 0}\n"
    "#define ATTN_MASKED const RtKAttn a = {8, 100, 77, 16, 24, 0.25f, 0, 2, 2, {4, 2, 1, 1}, {77, 0, 0, 0}, 0, 1}\n"
    "extern \"C\" __global__ void k_attention(unsigned char *base) {\n"
    "    ATTN;\n"
    "    rt_k_attention_fwd<64, 64>(a, F(0), F(1 << 22), F(1 << 23), (const void *)0, F(1 << 24));\n"
    "}\n"
    "extern \"C\" __global__ void k_attention_rows(unsigned char *base) {\n"
    "    ATTN;\n"
    "    rt_k_attention_bwd_rows<64, 64>(a, F(0), F(1 << 22), F(1 << 23), (const void *)0, F(1 << 24), F(1 << 25),\n"
    "                                    F(1 << 26), F(1 << 27));\n"
    "}\n"
    "extern \"C\" __global__ void k_attention_keys(unsigned char *base) {\n"
    "    ATTN;\n"
    "    rt_k_attention_bwd_keys<64, 64>(a, F(0), F(1 << 22), F(1 << 23), (const void *)0, F(1 << 25), F(1 << 27),\n"
    "                                    F(1 << 28), F(1 << 29));\n"
    "}\n"
    "extern \"C\" __global__ void k_attention_masked(unsigned char *base) {\n"
    "    ATTN_MASKED;\n"
    "    rt_k_attention_fwd<16, 24>(a, F(0), F(1 << 22), F(1 << 23), (const uint8_t *)(base + (1 << 30)), F(1 << 24));\n"
    "}\n"
    "extern \"C\" __global__ void k_attention_masked_keys(unsigned char *base) {\n"
    "    ATTN_MASKED;\n"
    "    rt_k_attention_bwd_keys<16, 24>(a, F(0), F(1 << 22), F(1 << 23), (const uint8_t *)(base + (1 << 30)),\n"
    "                                    F(1 << 25), F(1 << 27), F(1 << 28), F(1 << 29));\n"
    "}\n"
    "extern \"C\" __global__ void k_attention_wide(unsigned char *base) {\n"
    "    const RtKAttn a = {8, 100, 77, 200, 200, 0.5f, 1, 1, 1, {8, 1, 1, 1}, {7700, 0, 0, 0}, 77, 1};\n"
    "    rt_k_attention_bwd_rows<200, 200>(a, F(0), F(1 << 22), F(1 << 23), F(1 << 21), F(1 << 24), F(1 << 25),\n"
    "                                      F(1 << 26), F(1 << 27));\n"
    "}\n"
    "extern \"C\" __global__ void k_recipe(unsigned char *base) {\n"
    "    const RtDevState *st = (const RtDevState *)base;\n"
    "    const RtSchedule sched = {RT_SCHED_COSINE, 0.1, 0.5, 0, 0.1, 0.001};\n"
    "    const float lr = (float)rt_lr_at(&sched, st->step, st->per_epoch, st->total);\n"
    "    const RtOptimParams sgd = {0.9, 0.1, 1e-4, 0.9, 0.999, 1e-8, 0};\n"
    "    const RtOptimParams adamw = {0, 0, 0.01, 0.9, 0.999, 1e-8, 0};\n"
    "    const RtOptimStep s1 = rt_sgd_step(sgd, lr, st->step), s2 = rt_adamw_step(adamw, lr, st->step);\n"
    "    RT_K_FOR(i, 1000) {\n"
    "        rt_sgd_update(sgd, s1, F(1 << 20), F(1 << 21), F(1 << 22), 1000, i);\n"
    "        rt_adamw_update(adamw, s2, F(1 << 23), F(1 << 21), F(1 << 24), 1000, i);\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void k_index(unsigned char *base) {\n"
    "    rt_k_gather(512, 1000, 64, F(0), L(1 << 20), F(1 << 21));\n"
    "    rt_k_gather_bwd_zero(1000, 64, F(1 << 22));\n"
    "    rt_k_gather_sort_count(512, 1000, 8, L(1 << 20), L(1 << 23), I(1 << 24));\n"
    "    rt_k_gather_sort_scan(512, I(1 << 24));\n"
    "    rt_k_gather_sort_move(512, 1000, 8, L(1 << 20), L(1 << 23), L(1 << 24), I(1 << 25));\n"
    "    rt_k_gather_bwd_runs(512, 1000, 64, L(1 << 20), L(1 << 25), F(1 << 21), F(1 << 22));\n"
    "    RtBatchHeader *b = (RtBatchHeader *)(base + 4096);\n"
    "    rt_k_xent_ignore_fwd(128, 10, F(0), L(4096 + 256), 0.1f, -100, b->n_valid, F(1 << 20));\n"
    "    rt_k_xent_ignore_bwd(128, 10, F(0), L(4096 + 256), 0.1f, -100, b->n_valid, F(1 << 20), F(1 << 21),\n"
    "                         F(1 << 22));\n"
    "}\n";

#define NAME(k) #k,
static const char *const kernel_names[] = {KERNELS(NAME)};

static char *read_file(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "error: cannot read %s\n", path);
        exit(2);
    }
    text[n] = 0;
    fclose(f);
    return text;
}

/* Does `cubin` hold the string `name` (a kernel's symbol)? */
static int has_symbol(const char *cubin, size_t size, const char *name) {
    size_t len = strlen(name) + 1; /* with its NUL: k_bn_bwd must not match k_bn_bwd_x */
    for (size_t i = 0; i + len <= size; i++)
        if (memcmp(cubin + i, name, len) == 0) return 1;
    return 0;
}

/* 0 when the program compiles for `arch` with an empty log and every kernel in the cubin. */
static int compile(const char *arch, const char *const *headers, const char *const *names) {
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    /* netc's options (compiler/driver/nvrtc.c) but --fmad, which changes no diagnostics */
    const char *opts[] = {"-default-device", "-std=c++17", arch_opt, "--split-compile=0"};
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, source, "nvrtc_compile.cu", N_HDR, headers, names);
    if (rc != NVRTC_SUCCESS) {
        fprintf(stderr, "%s: nvrtcCreateProgram: %s\n", arch, nvrtcGetErrorString(rc));
        return 1;
    }
    rc = nvrtcCompileProgram(prog, 4, opts);
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    char *log = malloc(log_size + 1);
    nvrtcGetProgramLog(prog, log);
    log[log_size] = 0;
    int bad = rc != NVRTC_SUCCESS, noisy = strspn(log, " \t\r\n") != strlen(log);
    if (bad || noisy) fprintf(stderr, "%s: %s\n%s\n", arch, bad ? nvrtcGetErrorString(rc) : "warnings", log);
    free(log);
    if (!bad) {
        size_t size = 0;
        nvrtcGetCUBINSize(prog, &size);
        char *cubin = malloc(size);
        nvrtcGetCUBIN(prog, cubin);
        for (size_t k = 0; k < sizeof kernel_names / sizeof *kernel_names; k++)
            if (!has_symbol(cubin, size, kernel_names[k])) {
                fprintf(stderr, "%s: kernel %s is not in the cubin\n", arch, kernel_names[k]);
                bad = 1;
            }
        if (!bad && !noisy)
            printf("%s: ok, empty log, cubin %zu bytes, %zu kernels\n", arch, size,
                   sizeof kernel_names / sizeof *kernel_names);
        free(cubin);
    }
    nvrtcDestroyProgram(&prog);
    return bad || noisy;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR  (the directory of netrt_kernels.cuh and rt_devstate.h, below rt_bits.h and rt_recipe.h)\n", argv[0]);
        return 2;
    }
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    printf("NVRTC %d.%d\n", major, minor);
    /* the headers the kernels include: those in DIR, and rt_bits.h and rt_recipe.h above it */
    static const char *const names[N_HDR] = {"rt_devstate.h", "netrt_kernels.cuh", "netrt_views.cuh",
                                             "netrt_attention.cuh", "netrt_index.cuh", "netrt_rows.cuh",
                                             "rt_bits.h", "rt_recipe.h"};
    static const char *const dirs[N_HDR] = {"", "", "", "", "", "", "../", "../"};
    const char *headers[N_HDR];
    for (int h = 0; h < N_HDR; h++) {
        char rel[64];
        snprintf(rel, sizeof rel, "%s%s", dirs[h], names[h]);
        headers[h] = read_file(argv[1], rel);
    }
    int failed = compile("sm_80", headers, names);
    failed |= compile("sm_90", headers, names);
    for (int h = 0; h < N_HDR; h++) free((void *)headers[h]);
    return failed;
}
