/* nvrtc.c - compile a model's CUDA C kernels with NVRTC and write them as a C table of images.
 *
 * For each target architecture NVRTC produces a cubin; for the lowest one also PTX, which the
 * driver can compile for newer GPUs. The images go into a C file as byte arrays
 * (`netc_images`, netrt_cuda.h's RtCudaImage, ending with a NULL entry), which the generated
 * host C points RtCudaModel.images at and the trainer links, so
 * the machine that trains needs neither nvcc nor NVRTC. The kernels include the runtime headers
 * named in compile_images (cuda/rt_devstate.h, cuda/netrt_kernels.cuh and the cuda/netrt_*.cuh
 * it includes, rt_bits.h, rt_recipe.h), handed to NVRTC from the runtime directory.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc.h"

#ifdef NETC_HAVE_CUDA
#include <nvrtc.h>

static char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (size) *size = n;
    return buf;
}

static void write_bytes(FILE *o, const char *name, const unsigned char *data, size_t size) {
    fprintf(o, "static const unsigned char %s[%zu] = {", name, size);
    for (size_t i = 0; i < size; i++) fprintf(o, "%s%u,", i % 24 ? "" : "\n    ", data[i]);
    fprintf(o, "\n};\n\n");
}

/* One NVRTC compilation for `arch` ("sm_90" for a cubin, "compute_90" for PTX). Returns the
 * image (malloc'ed) or NULL after printing NVRTC's log. */
static unsigned char *compile_one(const char *src, const char *path, const char *arch, int ptx, int fmad,
                                  const char *const *hdr, const char *const *hdr_names, int n_hdr, size_t *size) {
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, path, n_hdr, hdr, hdr_names);
    if (r != NVRTC_SUCCESS) {
        fprintf(stderr, "netc: error: NVRTC: %s\n", nvrtcGetErrorString(r));
        return NULL;
    }
    char opt_arch[64];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
    /* --fmad=false: a product is rounded before it is added, as in the CPU backend's C, so
     * --precision fp32 trainers can match the CPU reference (netrt_kernels.cuh rounds the same
     * way on purpose); tf32 trainers, built for speed, let NVRTC contract to FMAs. */
    const char *opts[] = {opt_arch, "-std=c++17", "-default-device", fmad ? "--fmad=true" : "--fmad=false"};
    r = nvrtcCompileProgram(prog, 4, opts);
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    if (r != NVRTC_SUCCESS || log_size > 1) {
        char *log = malloc(log_size + 1);
        if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS && log_size > 1)
            fprintf(stderr, "%s: NVRTC (%s) says:\n%s\n", path, arch, log);
        free(log);
    }
    unsigned char *img = NULL;
    if (r == NVRTC_SUCCESS) {
        r = ptx ? nvrtcGetPTXSize(prog, size) : nvrtcGetCUBINSize(prog, size);
        img = r == NVRTC_SUCCESS ? malloc(*size) : NULL;
        if (img) r = ptx ? nvrtcGetPTX(prog, (char *)img) : nvrtcGetCUBIN(prog, (char *)img);
        if (r != NVRTC_SUCCESS) free(img), img = NULL;
    } else {
        fprintf(stderr, "netc: error: NVRTC could not compile %s for %s: %s\n", path, arch, nvrtcGetErrorString(r));
    }
    nvrtcDestroyProgram(&prog);
    return img;
}

int nvrtc_compile(const char *cu_path, const char *rt_dir, const int *sms, int n_sms, int fmad, FILE *o) {
    enum { N_HDR = 8 };
    static const char *const names[N_HDR] = {"rt_devstate.h",   "netrt_kernels.cuh", "netrt_views.cuh",
                                             "netrt_attention.cuh", "netrt_index.cuh", "netrt_rows.cuh",
                                             "rt_bits.h",       "rt_recipe.h"};
    static const char *const dirs[N_HDR] = {"/cuda", "/cuda", "/cuda", "/cuda", "/cuda", "/cuda", "", ""}; /* under rt_dir */
    char *hdr[N_HDR] = {NULL};
    char *src = read_all(cu_path, NULL);
    int rc = 1;
    if (!src) {
        fprintf(stderr, "netc: error: cannot read %s: %s\n", cu_path, strerror(errno));
        return 1;
    }
    for (int h = 0; h < N_HDR; h++) {
        char p[4096];
        snprintf(p, sizeof p, "%s%s/%s", rt_dir, dirs[h], names[h]);
        if (!(hdr[h] = read_all(p, NULL))) {
            fprintf(stderr, "netc: error: cannot read %s: %s\n  hint: --runtime-dir names the runtime's directory\n", p,
                    strerror(errno));
            goto out;
        }
    }
    fprintf(o, "// The kernels of %s, compiled by netc with NVRTC: one cubin per architecture and PTX\n"
               "// for newer ones. Do not edit.\n\n#include \"netrt_cuda.h\"\n\n", cu_path);
    int low = 0;
    for (int i = 1; i < n_sms; i++)
        if (sms[i] < sms[low]) low = i;
    for (int i = 0; i <= n_sms; i++) { /* the cubins, then the PTX of the lowest architecture */
        int ptx = i == n_sms, sm = sms[ptx ? low : i];
        char arch[32], name[32];
        snprintf(arch, sizeof arch, "%s_%d", ptx ? "compute" : "sm", sm);
        snprintf(name, sizeof name, "%s_%d", ptx ? "ptx" : "cubin", sm);
        size_t size = 0;
        unsigned char *img = compile_one(src, cu_path, arch, ptx, fmad, (const char *const *)hdr, names, N_HDR, &size);
        if (!img) goto out;
        write_bytes(o, name, img, size);
        free(img);
    }
    fprintf(o, "const RtCudaImage netc_images[] = {\n");
    for (int i = 0; i < n_sms; i++)
        fprintf(o, "    {%d, 0, cubin_%d, sizeof cubin_%d},\n", sms[i], sms[i], sms[i]);
    fprintf(o, "    {%d, 1, ptx_%d, sizeof ptx_%d},\n    {0, 0, NULL, 0}, /* the end */\n};\n", sms[low], sms[low],
            sms[low]);
    rc = ferror(o) ? 1 : 0;
out:
    free(src);
    for (int h = 0; h < N_HDR; h++) free(hdr[h]);
    return rc;
}

#else

int nvrtc_compile(const char *cu_path, const char *rt_dir, const int *sms, int n_sms, int fmad, FILE *o) {
    (void)cu_path, (void)rt_dir, (void)sms, (void)n_sms, (void)fmad, (void)o;
    fprintf(stderr, "netc: error: this netc was built without the CUDA toolkit, so it cannot compile kernels\n"
                    "  hint: install the CUDA toolkit and cuDNN and rebuild netc (cmake -DNETC_CUDA=ON)\n");
    return 1;
}

#endif
