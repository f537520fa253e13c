/* cuda_emu.h - just enough CUDA C for g++ to compile a generated NAME.cu (and the
 * netrt_kernels.cuh it includes) as ordinary C++ for the host, so tests/cuda/emu can run a
 * netc --backend cuda trainer on the CPU:
 *
 *     g++ -include cuda_emu.h -x c++ -ffp-contract=off NAME.cu
 *
 * A kernel becomes a plain function of its one argument (the arena base). rt_cuda_emu.c runs a
 * launch block after block; within a block, each of the blockDim.x threads is a fiber with its
 * own stack on one OS thread, and __syncthreads() switches to the next fiber until every thread
 * of the block has reached the barrier (or returned). So the block reductions of
 * netrt_kernels.cuh (rt_block_sum, rt_block_max) run their shared-memory trees as written, and
 * __shared__ can be static storage: blocks never overlap.
 *
 * Arithmetic: the _rn intrinsics are the plain IEEE operations, and -ffp-contract=off (x86-64
 * has no FMA without -mfma anyway) keeps every product rounded, as the kernels ask of NVRTC.
 * Math functions are the host libm's, which can differ from CUDA's in the last bit (expf, exp,
 * log): this header checks the generated code, not the GPU's arithmetic.
 */
#ifndef CUDA_EMU_H
#define CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

using std::isfinite;
using std::isinf;
using std::isnan;

// ---- qualifiers: all of them mean nothing on the host
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* One block runs at a time on a worker thread, so a block's shared memory is that thread's. */
#define __shared__ static __thread

// ---- the launch geometry, set by rt_cuda_emu.c before it switches to a thread's fiber
struct dim3 {
    unsigned x, y, z;
};
extern "C" {
extern __thread dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
/* The barrier among the block's threads: switches fibers until all of them have arrived. */
void emu_syncthreads(void);
}
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define __syncthreads() emu_syncthreads()

// ---- bit casts and correctly rounded operations
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, sizeof f); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, sizeof i); return i; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, sizeof u); return u; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, sizeof d); return d; }
static inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, sizeof i); return i; }

static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

#endif
