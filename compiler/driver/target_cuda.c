/* target_cuda.c - the toolchain half of the CUDA target: its kernels compiled by NVRTC
 * (nvrtc.c), its trainer linked with libnetrt_cuda, libnetrt, the static CUDA runtime, cuBLASLt
 * and cuDNN - not OpenBLAS or oneDNN, which only the CPU kernels use, so the GPU machine needs
 * neither.
 *
 * The CUDA libraries come from $CUDA_HOME, the runtime folder's `cuda/` (a packed copy of the
 * CUDA headers and the static CUDA runtime), the folders of $LD_LIBRARY_PATH (for cuBLASLt and
 * cuDNN, e.g. PyTorch's site-packages/nvidia/...), the build's CUDA, and /usr/local/cuda. A netc
 * built without the CUDA toolkit still emits CUDA trainers' sources, but says it cannot build them.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc.h"
#include "toolchain.h"

#ifdef NETC_HAVE_CUDA
#include <nvrtc.h>
#endif

static ToolFile cuda_include, cudart_static, cublaslt, cudnn; /* cuda_include: its cuda_runtime.h */
static ToolFile nccl; /* a distributed trainer's only */

#ifdef NETC_HAVE_CUDA
/* The CUDA headers, the static CUDA runtime, cuBLASLt and cuDNN. */
static void cuda_find(const Toolchain *t) {
    const char *dirs[TC_DIRS];
    int n;
    static char home[4][TC_PATH], ld[TC_PATH * 4], built[3][TC_PATH];
    const char *h_inc = tc_env_dir(home[0], TC_PATH, "CUDA_HOME", "/include");
    const char *h_lib64 = tc_env_dir(home[1], TC_PATH, "CUDA_HOME", "/lib64");
    const char *h_lib = tc_env_dir(home[2], TC_PATH, "CUDA_HOME", "/lib");
    char rt_cuda[TC_PATH + 8], rt_cuda_inc[TC_PATH + 16];
    snprintf(rt_cuda, sizeof rt_cuda, "%s/cuda", t->rt_lib);
    snprintf(rt_cuda_inc, sizeof rt_cuda_inc, "%s/include", rt_cuda);

    n = tc_add_dir(dirs, tc_add_dir(dirs, tc_add_dir(dirs, 0, h_inc), rt_cuda_inc), NETC_CUDA_INCLUDE_DIR);
    n = tc_add_dir(dirs, n, "/usr/local/cuda/include");
    const char *cuda_runtime_h[] = {"cuda_runtime.h"};
    tc_find_file(&cuda_include, "the CUDA headers (cuda_runtime.h)", dirs, n, cuda_runtime_h, 1);
    char *slash = strrchr(cuda_include.path, '/');
    if (slash) *slash = 0; /* the folder, for -I */

    n = tc_add_dir(dirs, tc_add_dir(dirs, tc_add_dir(dirs, tc_add_dir(dirs, 0, h_lib64), h_lib), rt_cuda),
                   NETC_CUDA_LIBRARY_DIR);
    n = tc_add_dir(dirs, n, "/usr/local/cuda/lib64");
    const char *cudart[] = {"libcudart_static.a"};
    tc_find_file(&cudart_static, "the static CUDA runtime (libcudart_static.a)", dirs, n, cudart, 1);

    /* cuBLASLt and cuDNN are shared: also where the loader will look ($LD_LIBRARY_PATH), and
     * by their versioned names, which is all that a pip wheel (PyTorch's nvidia/...) has. */
    n = tc_add_dir(dirs, tc_add_dir(dirs, 0, h_lib64), h_lib);
    const char *ldp = getenv("LD_LIBRARY_PATH");
    snprintf(ld, sizeof ld, "%s", ldp ? ldp : "");
    for (char *save = NULL, *d = strtok_r(ld, ":", &save); d; d = strtok_r(NULL, ":", &save)) n = tc_add_dir(dirs, n, d);
    int n_shared = n;
    n = tc_add_dir(dirs, n, tc_dir_of(built[0], TC_PATH, NETC_CUBLASLT_LIBRARY));
    n = tc_add_dir(dirs, n, "/usr/local/cuda/lib64");
    const char *cublaslt_names[] = {"libcublasLt.so", NETC_CUBLASLT_SONAME};
    tc_find_file(&cublaslt, "cuBLASLt (" NETC_CUBLASLT_SONAME ")", dirs, n, cublaslt_names, 2);
    n = tc_add_dir(dirs, n_shared, tc_dir_of(built[1], TC_PATH, NETC_CUDNN_LIBRARY));
    n = tc_add_dir(dirs, tc_add_dir(dirs, n, "/usr/local/cuda/lib64"), "/usr/lib/x86_64-linux-gnu");
    const char *cudnn_names[] = {"libcudnn.so", NETC_CUDNN_SONAME};
    tc_find_file(&cudnn, "cuDNN (" NETC_CUDNN_SONAME ")", dirs, n, cudnn_names, 2);
#ifdef NETC_HAVE_NCCL
    n = tc_add_dir(dirs, n_shared, NETC_NCCL_LIBRARY_DIR);
    n = tc_add_dir(dirs, tc_add_dir(dirs, n, "/usr/local/cuda/lib64"), "/usr/lib/x86_64-linux-gnu");
    const char *nccl_names[] = {"libnccl.so", "libnccl.so.2"};
    tc_find_file(&nccl, "NCCL (libnccl.so.2)", dirs, n, nccl_names, 2);
#endif
}

static int cuda_libraries(const ToolFile **files) {
    files[0] = &cuda_include, files[1] = &cudart_static, files[2] = &cublaslt, files[3] = &cudnn;
    return 4;
}

/* The libraries, and the NVRTC netc runs (its version, and the file the loader took it from). */
static void cuda_print(void) {
    tc_print_file("CUDA headers", &cuda_include);
    tc_print_file("CUDA runtime", &cudart_static);
    tc_print_file("cuBLASLt", &cublaslt);
    tc_print_file("cuDNN", &cudnn);
#ifdef NETC_HAVE_NCCL
    tc_print_file("NCCL", &nccl);
#endif
    int v[2] = {0, 0};
    Dl_info info = {0};
    nvrtcVersion(&v[0], &v[1]);
    dladdr((void *)nvrtcVersion, &info);
    printf("%-18s %d.%d, %s\n", "NVRTC", v[0], v[1], info.dli_fname ? info.dli_fname : "(linked statically)");
}
#endif

/* tf32, bf16 and fp16 trainers, built for speed, let NVRTC contract a * b + c to one FMA. */
static int cuda_compile_kernels(const TcBuild *b, FILE *images) {
    return nvrtc_compile(b->cu_path, b->t->rt_include, b->sms, b->n_sms, b->precision != CG_FP32, images);
}

/* A distributed trainer's: libnetrt_nccl (before libnetrt_cuda, which it calls), NCCL, and
 * libnetrt_mpi with MPI (before libnetrt) into argv from n; the new n, or -1 after saying why not. */
static int add_distributed(const Toolchain *t, char **argv, int n, int max) {
    static char lib_nccl[TC_PATH + 32], rp_nccl[TC_PATH + 16];
    tc_cat3(lib_nccl, sizeof lib_nccl, "", t->rt_lib, "/cuda/libnetrt_nccl.a");
    if (!tc_is_file(lib_nccl)) {
        fprintf(stderr, "netc: error: --distributed --backend cuda: the runtime folder %s/cuda has no "
                        "libnetrt_nccl.a (netc was built without NCCL, or the folder lacks it)\n"
                        "  hint: build netc where NCCL is found (the CUDA toolkit's, or NCCL_LIBRARY), or name "
                        "another runtime with --runtime-dir\n", t->rt_lib);
        return -1;
    }
    if (!nccl.path[0]) {
        fprintf(stderr, "netc: error: --distributed --backend cuda needs %s; looked in %s\n"
                        "  hint: set CUDA_HOME, or add the folder holding libnccl.so.2 to LD_LIBRARY_PATH "
                        "(PyTorch has it in site-packages/nvidia/nccl/lib)\n", nccl.what ? nccl.what : "NCCL",
                nccl.tried ? nccl.tried : "nowhere (this netc was built without NCCL)");
        return -1;
    }
    tc_rpath_of(rp_nccl, sizeof rp_nccl, nccl.path);
    argv[n++] = lib_nccl;
    argv[n++] = nccl.path;
    argv[n++] = rp_nccl;
    return tc_add_mpi(t, argv, n, max);
}

/* The host C and the kernel images, linked with libnetrt_cuda, libnetrt and the CUDA libraries. */
static int cuda_link(const TcBuild *b) {
    const Toolchain *t = b->t;
    char inc_rt[TC_PATH + 8], inc_rt_cuda[TC_PATH + 16], inc_cuda[TC_PATH + 8], lib_rt[TC_PATH + 16],
        lib_rt_cuda[TC_PATH + 32], lib_dir[TC_PATH + 8], rp_cjson[TC_PATH + 16], rp_blas[TC_PATH + 16], rp_dnn[TC_PATH + 16];
    tc_cat3(inc_rt, sizeof inc_rt, "-I", t->rt_include, "");
    tc_cat3(inc_rt_cuda, sizeof inc_rt_cuda, "-I", t->rt_include, "/cuda");
    tc_cat3(inc_cuda, sizeof inc_cuda, "-I", cuda_include.path, "");
    tc_cat3(lib_rt, sizeof lib_rt, "", t->rt_lib, "/libnetrt.a");
    tc_cat3(lib_rt_cuda, sizeof lib_rt_cuda, "", t->rt_lib, "/cuda/libnetrt_cuda.a");
    tc_cat3(lib_dir, sizeof lib_dir, "-L", t->rt_lib, ""); /* a pack's libz.so, for -lz */
    tc_rpath_of(rp_cjson, sizeof rp_cjson, t->cjson.path);
    tc_rpath_of(rp_blas, sizeof rp_blas, cublaslt.path);
    tc_rpath_of(rp_dnn, sizeof rp_dnn, cudnn.path);
    char *argv[64] = {
        (char *)t->cc, "-std=gnu11", (char *)t->opt, "-Wall", "-Wextra", (char *)t->werror, "-fopenmp", inc_rt,
        inc_rt_cuda, inc_cuda, b->precision != CG_FP32 ? "-DNETC_MATH=RT_MATH_TF32" : "-DNETC_MATH=RT_MATH_FP32",
        (char *)b->c_path, (char *)b->images_path,
    };
    int n = 13;
    if (b->distributed && (n = add_distributed(t, argv, n, 40)) < 0)
        return 1;
    char *tail[] = {lib_rt_cuda, lib_rt, lib_dir, (char *)t->cjson.path, cudart_static.path, cublaslt.path,
                    cudnn.path, rp_cjson, rp_blas, rp_dnn, "-lz", "-lpthread", "-ldl", "-lrt", "-lm", "-o"};
    for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
        argv[n++] = tail[i];
    argv[n + 1] = NULL;
    return b->link(b, argv, n);
}

const Target target_cuda = {
    .cg = &cg_cuda,
    .label = "CUDA",
#ifdef NETC_HAVE_CUDA
    .find = cuda_find,
    .libraries = cuda_libraries,
    .print = cuda_print,
#else
    .unavailable = "this netc has no --backend cuda",
#endif
    .runtime_folder = "cuda",
    .runtime_header = "netrt_cuda.h",
    .runtime_library = "libnetrt_cuda.a",
    .missing_hint = "set CUDA_HOME to the CUDA toolkit, or add the folders holding cuBLASLt and cuDNN "
                    "to LD_LIBRARY_PATH (PyTorch has them in site-packages/nvidia/*/lib)",
    .compile_kernels = cuda_compile_kernels,
    .link = cuda_link,
};
