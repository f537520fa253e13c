/* rt_data.c - binding data files to the model's inputs, assembling batches, and the prefetch
 * thread that assembles batch k+1 while the step trains on batch k.
 *
 * A file feeds an input when its per-sample shape equals the input's once every size-1 axis is
 * dropped from both (an IDX [N,28,28] feeds [1,28,28]). Elements are converted by value to the
 * input's dtype while a batch is gathered. The prefetcher has two slots; the producer fills the
 * slot of batch k once the consumer has moved on from batch k-2, so the order of batches, and so
 * every result, is independent of timing.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

static int dtype_size(RtDtype dt) {
    static const int size[] = {[RT_F32] = 4, [RT_F16] = 2, [RT_BF16] = 2, [RT_I32] = 4, [RT_I64] = 8, [RT_U8] = 1};
    return size[dt];
}

static int64_t input_sample_elems(const RtInput *in) {
    int64_t n = 1;
    for (int i = 0; i < in->rank; i++) n *= in->shape[i];
    return n;
}

size_t rt_batch_bytes(const RtModel *m, int input) {
    return (size_t)(m->batch * input_sample_elems(&m->inputs[input])) * (size_t)dtype_size(m->inputs[input].dtype);
}

static void shape_text(const int64_t *dims, int rank, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

/* Equal after dropping size-1 axes. */
static int shapes_fit(const int64_t *a, int ra, const int64_t *b, int rb) {
    int i = 0, j = 0;
    for (;;) {
        while (i < ra && a[i] == 1) i++;
        while (j < rb && b[j] == 1) j++;
        if (i == ra || j == rb) return i == ra && j == rb;
        if (a[i++] != b[j++]) return 0;
    }
}

static int check_input(const RtInput *in, const RtArray *a, RtError *err) {
    if (shapes_fit(a->shape + 1, a->rank - 1, in->shape, in->rank)) return 0;
    char got[256], want[256];
    shape_text(a->shape + 1, a->rank - 1, got, sizeof got);
    shape_text(in->shape, in->rank, want, sizeof want);
    return rt_fail(err, "input '%s': file '%s' has per-sample shape %s but the model expects %s",
                   in->name, a->path, got, want);
}

/* ---- values against the input's dtype
 *
 * Elements are converted by value as batches are gathered, so a value the input's dtype cannot
 * hold would change silently there: a float label 2.9 becoming class 2, NaN or 300 becoming
 * some u8. Such values are refused when the file is opened, with the sample and the value. An
 * input that a loss or metric reads as class indices, or an embedding as row indices, must hold
 * integers in [0, classes).
 */

typedef struct ValueRange {
    double lo, hi;      /* the closed range a value must lie in */
    int integral;       /* and be an integer */
    const char *what;   /* the range in words */
} ValueRange;

static const char *const dtype_names[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};

/* The range of input `in`; 0 when every value of file type t fits it as converted. */
static int value_range(const RtInput *in, RtFileType t, ValueRange *r, char *what, size_t size) {
    static const double file_lo[] = {[RT_FILE_U8] = 0, [RT_FILE_I8] = -128, [RT_FILE_I16] = -32768,
                                     [RT_FILE_I32] = -2147483648.0, [RT_FILE_I64] = -9223372036854775808.0,
                                     [RT_FILE_F16] = -65504, [RT_FILE_F32] = -FLT_MAX, [RT_FILE_F64] = -INFINITY};
    int file_integral = t < RT_FILE_F16;
    double file_hi = t == RT_FILE_U8 ? 255 : file_integral ? -file_lo[t] - 1 : -file_lo[t];
    switch (in->dtype) {
    case RT_U8: *r = (ValueRange){0, 255, 1, "the range of u8, [0, 255]"}; break;
    case RT_I32: *r = (ValueRange){INT32_MIN, INT32_MAX, 1, "the range of i32"}; break;
    case RT_I64: *r = (ValueRange){-9223372036854775808.0, 9223372036854775807.0, 1, "the range of i64"}; break;
    case RT_F16: *r = (ValueRange){-65504, 65504, 0, "the range of f16, [-65504, 65504]"}; break;
    default: /* f32, bf16 */ *r = (ValueRange){-FLT_MAX, FLT_MAX, 0, "the finite range of f32"}; break;
    }
    if (in->classes > 0) {
        snprintf(what, size, "the classes [0, %lld) of the loss, metric or embedding that reads '%s'", (long long)in->classes,
                 in->name);
        *r = (ValueRange){0, (double)(in->classes - 1), 1, what};
    }
    return !(file_lo[t] >= r->lo && file_hi <= r->hi && (file_integral || !r->integral));
}

/* Why v does not fit r, or NULL. A NaN or infinity in a float input is kept as it is: the run
 * stops on its loss, with a hint to check the data. */
static const char *misfit(const ValueRange *r, double v) {
    if (r->integral && v != floor(v)) return "not an integer"; /* NaN too */
    if (!isfinite(v) && !r->integral) return NULL;
    /* 9223372036854775807.0 is 2^63, which no i64 holds */
    if (v < r->lo || v > r->hi || (r->integral && v >= 9223372036854775808.0)) return "outside";
    return NULL;
}

static int check_values(const RtInput *in, const RtArray *a, RtError *err) {
    ValueRange r;
    char what[160];
    if (!value_range(in, a->type, &r, what, sizeof what)) return 0;
    int64_t n = a->shape[0] * a->sample_elems;
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1)) return rt_guard_failed(err);
    rt_guard_arm(&jb, a->path);
    for (int64_t i = 0; i < n; i++) {
        double v = rt_array_elem(a, i);
        const char *why = misfit(&r, v);
        if (!why) continue;
        rt_guard_disarm();
        char at[64] = "", detail[200];
        if (a->sample_elems > 1) snprintf(at, sizeof at, ", element %lld", (long long)(i % a->sample_elems));
        if (a->csv_first_line) /* a CSV file's samples are lines, its elements columns */
            snprintf(at, sizeof at, " (line %lld, column %lld)", (long long)(i / a->sample_elems + a->csv_first_line),
                     (long long)(i % a->sample_elems + 1));
        if (strcmp(why, "outside") == 0) snprintf(detail, sizeof detail, "outside %s", r.what);
        else snprintf(detail, sizeof detail, "%s, and input '%s' is %s", why, in->name, dtype_names[in->dtype]);
        /* the shortest digits that read back as the file's value (f32: 2.9, not 2.9000001) */
        int digits = a->type == RT_FILE_F64 ? 15 : a->type >= RT_FILE_F16 ? 7 : 19;
        return rt_fail(err, "input '%s': file '%s', sample %lld%s: the value %.*g is %s\n"
                            "  hint: values are converted to the input's dtype by value; convert the file yourself "
                            "if that is meant", in->name, a->path, (long long)(i / a->sample_elems), at, digits, v, detail);
    }
    rt_guard_disarm();
    return 0;
}

/* A file for input `in`: `cifar:FILES` (rt_cifar.c) gives the part the input holds, a CSV file's
 * rows of numbers take the input's per-sample shape when the counts agree; other files are read
 * as they are (rt_array.c). */
static int load_file(const RtInput *in, const char *file, RtArray *a, RtError *err) {
    int64_t per = input_sample_elems(in);
    if (strncmp(file, "cifar:", 6) == 0) {
        if (per != 1 && per != 3 * 32 * 32)
            return rt_fail(err, "'%s': CIFAR-10 files feed an input of 3072 values per sample (the images, "
                                "[3, 32, 32]) or of one (the labels), but '%s' has %lld", file, in->name, (long long)per);
        return rt_cifar_load(file + 6, per == 1, a, err);
    }
    if (rt_array_load(file, a, err)) return -1;
    if (!a->csv_first_line) return 0;
    if (a->sample_elems != per) {
        char want[256];
        shape_text(in->shape, in->rank, want, sizeof want);
        return rt_fail(err, "%s, line %d: %lld value(s) per line, but input '%s' needs %lld per sample (shape %s)",
                       file, a->csv_first_line, (long long)a->sample_elems, in->name, (long long)per, want);
    }
    a->rank = in->rank + 1;
    memcpy(a->shape + 1, in->shape, (size_t)in->rank * sizeof *in->shape);
    return 0;
}

int rt_dataset_open(const RtModel *m, const char *const *files, RtDataset *ds, RtError *err) {
    memset(ds, 0, sizeof *ds);
    ds->n = m->n_inputs;
    for (int i = 0; i < m->n_inputs; i++) {
        RtError e;
        if (load_file(&m->inputs[i], files[i], &ds->arrays[i], &e)) {
            rt_dataset_close(ds);
            return rt_fail(err, "input '%s': %s", m->inputs[i].name, e.msg);
        }
        if (check_input(&m->inputs[i], &ds->arrays[i], err) || check_values(&m->inputs[i], &ds->arrays[i], err)) {
            rt_dataset_close(ds);
            return -1;
        }
        int64_t n = ds->arrays[i].shape[0];
        if (i > 0 && n != ds->n_samples) {
            rt_fail(err, "input '%s' (%s) has %lld samples but input '%s' (%s) has %lld",
                    m->inputs[i].name, files[i], (long long)n, m->inputs[0].name, files[0],
                    (long long)ds->n_samples);
            rt_dataset_close(ds);
            return -1;
        }
        ds->n_samples = n;
    }
    if (ds->n_samples == 0) {
        rt_dataset_close(ds);
        return rt_fail(err, "the data set in '%s' has no samples", files[0]);
    }
    return 0;
}

void rt_dataset_close(RtDataset *ds) {
    for (int i = 0; i < ds->n; i++) rt_array_free(&ds->arrays[i]);
    ds->n = 0;
}

/* Convert `count` elements starting at flat element `from` of `a` into `out` (dtype dt). */
static void convert(const RtArray *a, int64_t from, int64_t count, RtDtype dt, void *out) {
    if (a->type == RT_FILE_U8 && dt == RT_F32) { /* the common image case, fast */
        const unsigned char *src = a->data + from;
        float *dst = out;
        for (int64_t i = 0; i < count; i++) dst[i] = src[i];
        return;
    }
    for (int64_t i = 0; i < count; i++) {
        double v = rt_array_elem(a, from + i);
        switch (dt) {
        case RT_F32: ((float *)out)[i] = (float)v; break;
        case RT_F16: ((uint16_t *)out)[i] = rt_f32_to_f16((float)v); break;
        case RT_BF16: ((uint16_t *)out)[i] = rt_f32_to_bf16((float)v); break;
        case RT_I32: ((int32_t *)out)[i] = (int32_t)v; break;
        case RT_I64: ((int64_t *)out)[i] = (int64_t)v; break;
        case RT_U8: ((uint8_t *)out)[i] = (uint8_t)v; break;
        }
    }
}

int rt_gather(const RtModel *m, const RtDataset *ds, const int64_t *idx, int64_t count,
              void *const *bufs, RtError *err) {
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1)) return rt_guard_failed(err);
    for (int k = 0; k < m->n_inputs; k++) {
        const RtArray *a = &ds->arrays[k];
        int64_t per = a->sample_elems;
        size_t row = (size_t)per * (size_t)dtype_size(m->inputs[k].dtype);
        unsigned char *dst = bufs[k];
        rt_guard_arm(&jb, a->path);
        for (int64_t r = 0; r < count; r++) convert(a, idx[r] * per, per, m->inputs[k].dtype, dst + r * row);
        if (count < m->batch) memset(dst + count * row, 0, (size_t)(m->batch - count) * row);
    }
    rt_guard_disarm();
    return 0;
}

int64_t rt_gather_from(const RtModel *m, const RtDataset *ds, int64_t start, int64_t *idx, void *const *bufs,
                       RtError *err) {
    int64_t count = ds->n_samples - start < m->batch ? ds->n_samples - start : m->batch;
    for (int64_t r = 0; r < count; r++) idx[r] = start + r;
    return rt_gather(m, ds, idx, count, bufs, err) ? -1 : count;
}

int rt_dataset_unchanged(const RtDataset *ds, RtError *err) {
    for (int i = 0; i < ds->n; i++)
        if (rt_array_unchanged(&ds->arrays[i], err)) return -1;
    return 0;
}

/* ---- prefetching */

static void *prefetch_main(void *arg) {
    RtPrefetch *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int64_t k = p->next_fill;
        /* slot k%2 held batch k-2; it is free once the consumer has taken batch k-1 */
        while (!p->stop && k < p->n_batches && p->next_take < k) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop || k >= p->n_batches) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        pthread_mutex_unlock(&p->mu);
        RtError err;
        const int64_t *idx = p->order + k * p->model->batch;
        int rc = rt_gather(p->model, p->ds, idx, p->model->batch, p->slots[k % 2], &err);
        if (!rc && p->aug)
            rc = rt_augment_batch(p->aug, p->model, p->seed, p->epoch, idx, p->model->batch, p->slots[k % 2], &err);
        pthread_mutex_lock(&p->mu);
        if (rc) { /* the consumer takes the batches before this one, then the error */
            p->failed = 1, p->err = err;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        p->ready[k % 2] = k;
        p->next_fill = k + 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

void rt_prefetch_start(RtPrefetch *p, const RtModel *m, const RtDataset *ds, const int64_t *order,
                       int64_t n_batches, const RtAugment *aug, uint64_t seed, int64_t epoch) {
    memset(p, 0, sizeof *p);
    p->model = m;
    p->ds = ds;
    p->order = order;
    p->n_batches = n_batches;
    p->aug = aug, p->seed = seed, p->epoch = epoch;
    p->ready[0] = p->ready[1] = -1;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < m->n_inputs; i++) {
            p->slots[s][i] = aligned_alloc(64, (rt_batch_bytes(m, i) + 63) / 64 * 64);
            if (!p->slots[s][i]) {
                fprintf(stderr, "error: out of memory for the batch buffers\n");
                exit(1);
            }
        }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, prefetch_main, p) != 0) {
        fprintf(stderr, "error: cannot start the data loader thread\n");
        exit(1);
    }
}

void *const *rt_prefetch_next(RtPrefetch *p) {
    pthread_mutex_lock(&p->mu);
    int64_t k = p->next_take;
    while (p->ready[k % 2] != k && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    if (p->ready[k % 2] != k) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    p->next_take = k + 1; /* releases the other slot (batch k-1) to the producer */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return p->slots[k % 2];
}

void rt_prefetch_stop(RtPrefetch *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < p->model->n_inputs; i++) free(p->slots[s][i]);
}
