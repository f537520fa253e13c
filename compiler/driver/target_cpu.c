/* target_cpu.c - the toolchain half of the CPU target: its trainer links libnetrt with oneDNN
 * and OpenBLAS, those of the build that made netc. */
#include "toolchain.h"

static int cpu_link(const TcBuild *b) {
    const Toolchain *t = b->t;
    char inc_rt[TC_PATH + 8], inc_blas[TC_PATH + 8], lib_rt[TC_PATH + 16], rp_cjson[TC_PATH + 16];
    tc_cat3(inc_rt, sizeof inc_rt, "-I", t->rt_include, "");
    tc_cat3(inc_blas, sizeof inc_blas, "-I", NETC_CBLAS_INCLUDE_DIR, "");
    tc_cat3(lib_rt, sizeof lib_rt, "", t->rt_lib, "/libnetrt.a");
    tc_rpath_of(rp_cjson, sizeof rp_cjson, t->cjson.path);
    char *argv[] = {
        (char *)t->cc, "-std=gnu11", (char *)t->opt, (char *)t->werror, "-fopenmp", inc_rt, inc_blas,
        (char *)b->c_path, lib_rt, NETC_DNNL_LIBRARY, NETC_BLAS_LIBRARY, (char *)t->cjson.path, rp_cjson, "-lz",
        "-lpthread", "-lm", "-o", NULL, NULL,
    };
    int n = (int)(sizeof argv / sizeof *argv);
    return b->link(b, argv, n - 2);
}

const Target target_cpu = {
    .cg = &cg_cpu,
    .link = cpu_link,
};
