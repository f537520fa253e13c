/* nvrtc.h - the CUDA target's kernel compiler (target_cuda.c: compile_kernels). */
#ifndef NETC_NVRTC_H
#define NETC_NVRTC_H

#include <stdio.h>

/* The most architectures one nvrtc_compile takes (each compiles on its own thread); netc's
 * --arch refuses more (main.c). */
enum { NVRTC_MAX_ARCHS = 8 };

/* nvrtc.c: compile the CUDA C kernels at cu_path with NVRTC to a cubin for each architecture
 * in sms (80 = sm_80; at most NVRTC_MAX_ARCHS) and PTX for the lowest, and write them to
 * `images` as the C table netc_images (netrt_cuda.h); fmad lets NVRTC contract a * b + c to one
 * FMA. rt_dir holds
 * cuda/rt_devstate.h, cuda/netrt_kernels.cuh, rt_bits.h and rt_recipe.h. Returns 0, or 1 after
 * printing NVRTC's log or when writing failed; the caller closes `images`. */
int nvrtc_compile(const char *cu_path, const char *rt_dir, const int *sms, int n_sms, int fmad, FILE *images);

/* Whether this NVRTC compiles for every architecture in sms (nvrtcGetSupportedArchs): 0, or 1
 * with `why` naming the first it does not and the ones it does. A netc built without the CUDA
 * toolkit answers 0 (nvrtc_compile says what is missing). */
int nvrtc_check_archs(const int *sms, int n_sms, char *why, size_t size);

#endif
