/* netrt_views.cuh - the device functions of the copies and reductions along axes (the IR's
 * LIB_AXES operators: permute, slice, slice_bwd, concat, max, max_bwd), included by
 * netrt_kernels.cuh. Each thread of a grid-stride loop writes its own outputs, reading the
 * elements rt_views.c reads: the same values, the same first maximum, bit for bit. The copies
 * are templates over the element type (float, int64_t).
 */
#ifndef NETRT_VIEWS_CUH
#define NETRT_VIEWS_CUH

/* A permute: the output's extents, and for each output axis the stride of the input axis it
 * comes from (elements). */
struct RtKPermute {
    int64_t od[6], os[6];
    int rank;
};

template <typename T>
static __device__ __forceinline__ void rt_k_permute(RtKPermute p, int64_t total, const T *x, T *y) {
    RT_K_FOR(o, total) {
        int64_t off = 0, rem = o;
        for (int i = p.rank - 1; i >= 0; i--) {
            off += rem % p.od[i] * p.os[i];
            rem /= p.od[i];
        }
        y[o] = x[off];
    }
}

/* y [outer, n_out, inner] = x [outer, n_in, inner][:, start : start + n_out, :] */
template <typename T>
static __device__ __forceinline__ void rt_k_slice(int64_t outer, int64_t n_in, int64_t n_out, int64_t inner,
                                                  int64_t start, const T *x, T *y) {
    RT_K_FOR(o, outer * n_out * inner) {
        int64_t i = o % inner, j = o / inner % n_out, b = o / (inner * n_out);
        y[o] = x[(b * n_in + start + j) * inner + i];
    }
}

/* dx [outer, n_full, inner]: dy [outer, n_part, inner] at start, zeros elsewhere */
template <typename T>
static __device__ __forceinline__ void rt_k_slice_bwd(int64_t outer, int64_t n_full, int64_t n_part, int64_t inner,
                                                      int64_t start, const T *dy, T *dx) {
    RT_K_FOR(o, outer * n_full * inner) {
        int64_t i = o % inner, j = o / inner % n_full, b = o / (inner * n_full);
        dx[o] = j >= start && j < start + n_part ? dy[(b * n_part + j - start) * inner + i] : (T)0;
    }
}

/* y [outer, na + nb, inner] = a then b along the axis */
template <typename T>
static __device__ __forceinline__ void rt_k_concat(int64_t outer, int64_t na, int64_t nb, int64_t inner, const T *a,
                                                   const T *b, T *y) {
    RT_K_FOR(o, outer * (na + nb) * inner) {
        int64_t i = o % inner, j = o / inner % (na + nb), r = o / (inner * (na + nb));
        y[o] = j < na ? a[(r * na + j) * inner + i] : b[(r * nb + j - na) * inner + i];
    }
}

/* The index along the axis of the first maximal element of x[0], x[inner], ... */
static __device__ __forceinline__ int64_t rt_k_first_max(int64_t n, int64_t inner, const float *x) {
    int64_t best = 0;
    for (int64_t j = 1; j < n; j++)
        if (x[j * inner] > x[best * inner]) best = j;
    return best;
}

/* y [outer, 1, inner] = the maximum of x [outer, n, inner] along the axis */
static __device__ __forceinline__ void rt_k_max_axis(int64_t outer, int64_t n, int64_t inner, const float *x,
                                                     float *y) {
    RT_K_FOR(o, outer * inner) {
        const float *xo = x + o / inner * n * inner + o % inner;
        y[o] = xo[rt_k_first_max(n, inner, xo) * inner];
    }
}

/* dx: dy at the first maximal element along the axis, zeros elsewhere (one thread per column) */
static __device__ __forceinline__ void rt_k_max_axis_bwd(int64_t outer, int64_t n, int64_t inner, const float *x,
                                                         const float *dy, float *dx) {
    RT_K_FOR(o, outer * inner) {
        int64_t base = o / inner * n * inner + o % inner;
        int64_t k = rt_k_first_max(n, inner, x + base);
        for (int64_t j = 0; j < n; j++) dx[base + j * inner] = j == k ? dy[o] : 0.0f;
    }
}

#endif
