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
#include <pthread.h>
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

/* What one NVRTC compilation made: the cubin, and the PTX when it was asked for. */
typedef struct {
    unsigned char *cubin, *ptx;
    size_t cubin_size, ptx_size;
} Images;

/* One NVRTC compilation for sm_`sm`: its cubin, and with want_ptx also the PTX it went through
 * (the same PTX a compilation for compute_`sm` gives, without compiling again). Returns 0, or 1
 * after printing NVRTC's log. */
static int compile_one(const char *src, const char *path, int sm, int want_ptx, int fmad, const char *const *hdr,
                       const char *const *hdr_names, int n_hdr, Images *img) {
    char arch[64];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d", sm);
    /* --fmad=false: a product is rounded before it is added, as in the CPU backend's C, so
     * --precision fp32 trainers can match the CPU reference (netrt_kernels.cuh rounds the same
     * way on purpose); tf32 trainers, built for speed, let NVRTC contract to FMAs.
     * --split-compile=0: NVRTC's optimizer on all the machine's processors (a model's kernels are
     * one large module); an NVRTC that does not know the option is asked again without it. */
    const char *opts[] = {arch, "-std=c++17", "-default-device", fmad ? "--fmad=true" : "--fmad=false",
                          "--split-compile=0"};
    const int all = sizeof opts / sizeof *opts;
    int n_opts = all;
    nvrtcProgram prog;
    nvrtcResult r;
    for (;;) {
        if ((r = nvrtcCreateProgram(&prog, src, path, n_hdr, hdr, hdr_names)) != NVRTC_SUCCESS) {
            fprintf(stderr, "netc: error: NVRTC: %s\n", nvrtcGetErrorString(r));
            return 1;
        }
        r = nvrtcCompileProgram(prog, n_opts, opts);
        if (r != NVRTC_ERROR_INVALID_OPTION || n_opts < all) break;
        nvrtcDestroyProgram(&prog);
        n_opts = all - 1; /* all but --split-compile */
    }
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    if (r != NVRTC_SUCCESS || log_size > 1) {
        char *log = malloc(log_size + 1);
        if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS && log_size > 1)
            fprintf(stderr, "%s: NVRTC (sm_%d) says:\n%s\n", path, sm, log);
        free(log);
    }
    if (r != NVRTC_SUCCESS) {
        fprintf(stderr, "netc: error: NVRTC could not compile %s for sm_%d: %s\n", path, sm, nvrtcGetErrorString(r));
    } else {
        r = nvrtcGetCUBINSize(prog, &img->cubin_size);
        if (r == NVRTC_SUCCESS && !(img->cubin = malloc(img->cubin_size))) r = NVRTC_ERROR_OUT_OF_MEMORY;
        if (r == NVRTC_SUCCESS) r = nvrtcGetCUBIN(prog, (char *)img->cubin);
        if (r == NVRTC_SUCCESS && want_ptx) r = nvrtcGetPTXSize(prog, &img->ptx_size);
        if (r == NVRTC_SUCCESS && want_ptx && !(img->ptx = malloc(img->ptx_size))) r = NVRTC_ERROR_OUT_OF_MEMORY;
        if (r == NVRTC_SUCCESS && want_ptx) r = nvrtcGetPTX(prog, (char *)img->ptx);
        if (r != NVRTC_SUCCESS)
            fprintf(stderr, "netc: error: NVRTC's images of %s for sm_%d: %s\n", path, sm, nvrtcGetErrorString(r));
    }
    nvrtcDestroyProgram(&prog);
    return r != NVRTC_SUCCESS;
}

/* One architecture's compilation on its own thread (NVRTC allows concurrent calls on different
 * programs); each of its messages reaches stderr whole (stdio locks the stream per call). */
typedef struct {
    const char *src, *path;
    const char *const *hdr, *const *hdr_names;
    int n_hdr, sm, want_ptx, fmad, bad;
    Images img;
} Job;

static void *compile_job(void *arg) {
    Job *j = arg;
    j->bad = compile_one(j->src, j->path, j->sm, j->want_ptx, j->fmad, j->hdr, j->hdr_names, j->n_hdr, &j->img);
    return NULL;
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
    Job jobs[NVRTC_MAX_ARCHS];
    pthread_t th[NVRTC_MAX_ARCHS];
    int started[NVRTC_MAX_ARCHS] = {0};
    if (n_sms > NVRTC_MAX_ARCHS) { /* main.c's --arch refuses more */
        fprintf(stderr, "netc: internal error: %d architectures, the kernel compiler takes at most %d\n", n_sms,
                NVRTC_MAX_ARCHS);
        goto out;
    }
    for (int i = 0; i < n_sms; i++) { /* the cubins, and the PTX of the lowest architecture */
        jobs[i] = (Job){src, cu_path, (const char *const *)hdr, names, N_HDR, sms[i], i == low, fmad, 0, {0}};
        started[i] = n_sms > 1 && pthread_create(&th[i], NULL, compile_job, &jobs[i]) == 0;
        if (!started[i]) compile_job(&jobs[i]); /* one architecture, or no thread to be had */
    }
    int bad = 0;
    for (int i = 0; i < n_sms; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        bad |= jobs[i].bad;
    }
    for (int i = 0; i < n_sms && !bad; i++) {
        char name[32];
        snprintf(name, sizeof name, "cubin_%d", sms[i]);
        write_bytes(o, name, jobs[i].img.cubin, jobs[i].img.cubin_size);
        snprintf(name, sizeof name, "ptx_%d", sms[i]);
        if (jobs[i].img.ptx) write_bytes(o, name, jobs[i].img.ptx, jobs[i].img.ptx_size);
    }
    for (int i = 0; i < n_sms; i++) free(jobs[i].img.cubin), free(jobs[i].img.ptx);
    if (bad) goto out;
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

int nvrtc_check_archs(const int *sms, int n_sms, char *why, size_t size) {
    int n = 0, major = 0, minor = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n < 1) return 0; /* nvrtc_compile says why */
    int *have = malloc((size_t)n * sizeof *have);
    if (!have || nvrtcGetSupportedArchs(have) != NVRTC_SUCCESS) return free(have), 0;
    nvrtcVersion(&major, &minor);
    int rc = 0;
    for (int i = 0; i < n_sms && !rc; i++) {
        int found = 0;
        for (int k = 0; k < n; k++) found |= have[k] == sms[i];
        if (found) continue;
        size_t len = (size_t)snprintf(why, size, "--arch: NVRTC %d.%d cannot compile for sm_%d; it compiles for ", major,
                                      minor, sms[i]);
        for (int k = 0; k < n && len < size; k++)
            len += (size_t)snprintf(why + len, size - len, "%ssm_%d", k ? ", " : "", have[k]);
        rc = 1;
    }
    free(have);
    return rc;
}

#else

int nvrtc_check_archs(const int *sms, int n_sms, char *why, size_t size) {
    (void)sms, (void)n_sms, (void)why, (void)size;
    return 0;
}

int nvrtc_compile(const char *cu_path, const char *rt_dir, const int *sms, int n_sms, int fmad, FILE *o) {
    (void)cu_path, (void)rt_dir, (void)sms, (void)n_sms, (void)fmad, (void)o;
    fprintf(stderr, "netc: error: this netc was built without the CUDA toolkit, so it cannot compile kernels\n"
                    "  hint: install the CUDA toolkit and cuDNN and rebuild netc (cmake -DNETC_CUDA=ON)\n");
    return 1;
}

#endif
