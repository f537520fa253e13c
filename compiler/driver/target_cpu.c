/* target_cpu.c - the toolchain half of the CPU target: its trainer links libnetrt with oneDNN
 * and OpenBLAS, those of the build that made netc (with a run path to oneDNN's folder: setup's
 * oneDNN 3.2 lives in the build tree); a distributed one (--distributed) links
 * libnetrt_mpi and the build's MPI library too. The generated code is compiled with
 * -fno-math-errno: no trainer reads errno after a math function, and with it sqrtf is one
 * instruction that vectorises (the optimizers' updates) instead of a call kept for its errno;
 * every value stays the same (sqrt is correctly rounded either way, libm's functions are the
 * same functions). And with -fno-trapping-math: no trainer reads the floating-point exception
 * flags, and with it a loop that chooses between values (relu's x < 0 ? 0 : x, the activations'
 * sign tests, rt_expf's range) is one vector select instead of a branch per element, so such
 * loops vectorise at all (GPT-2 small's step 7 % faster, its saved weights the same bytes):
 * the flags are the only thing it changes, not one value. For the x86-64 level of --cpu (the
 * machine's by default) with -march and the runtime built for it, and -ffp-contract=off, which
 * keeps the values of every level the same (runtime/rt_cpu.c).
 *
 * The trainer links jemalloc when netc's build found it (NETC_MALLOC_LIBRARY, empty otherwise)
 * and --system-malloc does not say no: oneDNN's sgemm allocates page-aligned packing buffers at
 * every call in every thread that multiplies, and the C library's malloc leaves the small
 * blocks it cuts off to align them in a per-thread cache, where they keep the freed buffers
 * from merging; the worker threads' heaps grow by tens of MiB around them (docs/trainer.md,
 * "Memory beyond the plan"). */
#include <stdio.h>

#include "toolchain.h"

static int cpu_link(const TcBuild *b) {
    const Toolchain *t = b->t;
    char inc_rt[TC_PATH + 8], inc_blas[TC_PATH + 8], lib_rt[TC_PATH + 48], rp_cjson[TC_PATH + 16],
        rp_dnnl[TC_PATH + 16];
    tc_cat3(inc_rt, sizeof inc_rt, "-I", t->rt_include, "");
    tc_cat3(inc_blas, sizeof inc_blas, "-I", NETC_CBLAS_INCLUDE_DIR, "");
    tc_cat3(lib_rt, sizeof lib_rt, t->rt_lib, "/", t->cpu_lib);
    tc_rpath_of(rp_cjson, sizeof rp_cjson, t->cjson.path);
    tc_rpath_of(rp_dnnl, sizeof rp_dnnl, NETC_DNNL_LIBRARY); /* setup's oneDNN 3.2 is in the build tree */
    char *argv[64] = {
        (char *)t->cc, "-std=gnu11", (char *)t->opt, (char *)t->werror, "-fopenmp", "-fno-math-errno",
        "-fno-trapping-math", "-ffp-contract=off", inc_rt, inc_blas, (char *)b->c_path,
    };
    int n = 11;
    if (t->cpu_march[0]) argv[n++] = (char *)t->cpu_march;
    if (b->distributed && (n = tc_add_mpi(t, argv, n, 40)) < 0) return 1;
    char *tail[] = {lib_rt, NETC_DNNL_LIBRARY, rp_dnnl, NETC_BLAS_LIBRARY, (char *)t->cjson.path, rp_cjson, "-lz",
                    "-lpthread", "-lm"};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++) argv[n++] = tail[i];
    /* after everything that calls malloc: a linker that drops libraries nothing before them
     * needs (--as-needed) keeps it */
    if (NETC_MALLOC_LIBRARY[0] && !b->system_malloc) argv[n++] = NETC_MALLOC_LIBRARY;
    argv[n++] = "-o";
    argv[n + 1] = NULL;
    return b->link(b, argv, n);
}

/* The libraries of the build that made netc, which every CPU trainer links. */
static void cpu_print(void) {
    printf("%-18s %s\n", "oneDNN", NETC_DNNL_LIBRARY);
    printf("%-18s %s\n", "OpenBLAS", NETC_BLAS_LIBRARY);
    printf("%-18s %s\n", "malloc", NETC_MALLOC_LIBRARY[0] ? NETC_MALLOC_LIBRARY : "the C library's (no jemalloc found)");
}

const Target target_cpu = {
    .cg = &cg_cpu,
    .link = cpu_link,
    .print = cpu_print,
};
