/* test_files.c - libnetrt's data loaders (.npy, IDX plain and gzipped), dataset binding with
 * the size-1 axis rule, batch gathering with conversion by value, the prefetcher, safetensors
 * round trips and refusals, the learning-rate schedules, and the quality target's rule. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "rt_internal.h"

static char dir[256];

static const char *path_of(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A version-1 .npy file with the given descr and shape text, e.g. "<f4", "(3, 2)". */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    char *buf = calloc(1, *len + 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t n) {
    char header[128];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    unsigned char *buf = calloc(1, (size_t)(total + pad) + n);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((len + 1 + pad) & 0xff);
    buf[9] = (unsigned char)((len + 1 + pad) >> 8);
    memcpy(buf + 10, header, (size_t)len);
    memset(buf + 10 + len, ' ', (size_t)pad);
    buf[total + pad - 1] = '\n';
    memcpy(buf + total + pad, data, n);
    write_bytes(path, buf, (size_t)(total + pad) + n);
    free(buf);
}

static size_t idx_image(unsigned char *buf, int n, int h, int w) {
    unsigned char head[16] = {0, 0, 0x08, 3, 0, 0, 0, (unsigned char)n, 0, 0, 0, (unsigned char)h, 0, 0, 0, (unsigned char)w};
    memcpy(buf, head, 16);
    for (int i = 0; i < n * h * w; i++) buf[16 + i] = (unsigned char)(i % 251);
    return 16 + (size_t)(n * h * w);
}

static void test_npy_types(void **state) {
    (void)state;
    float f[6] = {1.5f, -2, 3, 4, 5, 6};
    int64_t l[3] = {7, -8, 9};
    uint16_t h[2] = {0x3c00, 0xc000}; /* 1.0, -2.0 */
    RtArray a;
    RtError err;
    write_npy(path_of("f.npy"), "<f4", "(3, 2)", f, sizeof f);
    assert_int_equal(rt_array_load(path_of("f.npy"), &a, &err), 0);
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.shape[0], 3);
    assert_int_equal(a.sample_elems, 2);
    assert_true(rt_array_elem(&a, 1) == -2.0);
    rt_array_free(&a);
    write_npy(path_of("l.npy"), "<i8", "(3,)", l, sizeof l);
    assert_int_equal(rt_array_load(path_of("l.npy"), &a, &err), 0);
    assert_true(rt_array_elem(&a, 1) == -8.0);
    rt_array_free(&a);
    write_npy(path_of("h.npy"), "<f2", "(2,)", h, sizeof h);
    assert_int_equal(rt_array_load(path_of("h.npy"), &a, &err), 0);
    assert_true(rt_array_elem(&a, 0) == 1.0 && rt_array_elem(&a, 1) == -2.0);
    rt_array_free(&a);
    write_npy(path_of("short.npy"), "<f4", "(30, 2)", f, sizeof f); /* header promises more */
    assert_int_equal(rt_array_load(path_of("short.npy"), &a, &err), -1);
    assert_non_null(strstr(err.msg, "truncated"));
    rt_array_free(&a);
    write_npy(path_of("c.npy"), "<c8", "(3,)", f, sizeof f);
    assert_int_equal(rt_array_load(path_of("c.npy"), &a, &err), -1);
    assert_non_null(strstr(err.msg, "<c8"));
    rt_array_free(&a);
}

static void test_idx_plain_and_gzip(void **state) {
    (void)state;
    unsigned char buf[16 + 4 * 3 * 2];
    size_t n = idx_image(buf, 4, 3, 2);
    write_bytes(path_of("x.idx"), buf, n);
    gzFile gz = gzopen(path_of("x.idx.gz"), "wb");
    gzwrite(gz, buf, (unsigned)n);
    gzclose(gz);
    for (int z = 0; z < 2; z++) {
        RtArray a;
        RtError err;
        assert_int_equal(rt_array_load(path_of(z ? "x.idx.gz" : "x.idx"), &a, &err), 0);
        assert_int_equal(a.rank, 3);
        assert_int_equal(a.shape[0], 4);
        assert_int_equal(a.sample_elems, 6);
        assert_true(rt_array_elem(&a, 7) == 7.0);
        rt_array_free(&a);
    }
    buf[0] = 1; /* bad magic */
    write_bytes(path_of("bad.idx"), buf, n);
    RtArray a;
    RtError err;
    assert_int_equal(rt_array_load(path_of("bad.idx"), &a, &err), -1);
    assert_non_null(strstr(err.msg, "bad.idx"));
    rt_array_free(&a);
}

static const RtInput inputs[] = {{"image", RT_F32, 3, {1, 3, 2}, 0}, {"label", RT_I64, 0, {0}, 5}};
static const RtModel model = {.name = "t", .batch = 2, .n_inputs = 2, .inputs = inputs};

static void test_dataset_binding_and_gather(void **state) {
    (void)state;
    unsigned char buf[16 + 4 * 3 * 2];
    write_bytes(path_of("img.idx"), buf, idx_image(buf, 4, 3, 2)); /* [4,3,2] feeds [1,3,2] */
    uint8_t labels[4] = {3, 1, 4, 1};
    write_npy(path_of("lab.npy"), "|u1", "(4,)", labels, sizeof labels);
    const char *files[] = {path_of("img.idx"), path_of("lab.npy")};
    RtDataset ds;
    RtError err;
    assert_int_equal(rt_dataset_open(&model, files, &ds, &err), 0);
    assert_int_equal(ds.n_samples, 4);
    float img[2 * 6];
    int64_t lab[2];
    void *bufs[2] = {img, lab};
    int64_t idx[2] = {2, 0};
    assert_int_equal(rt_gather(&model, &ds, idx, 1, bufs, &err), 0); /* one real row, one zero row */
    assert_true(img[0] == 12.0f && img[6] == 0.0f);
    assert_true(lab[0] == 4 && lab[1] == 0);
    int64_t order[4] = {3, 2, 1, 0};
    RtPrefetch pf;
    rt_prefetch_start(&pf, &model, &ds, order, 2, NULL, 0, 1);
    for (int b = 0; b < 2; b++) {
        void *const *got = rt_prefetch_next(&pf);
        assert_true(((int64_t *)got[1])[0] == labels[order[2 * b]]);
        assert_true(((float *)got[0])[6] == (float)(order[2 * b + 1] * 6));
    }
    rt_prefetch_stop(&pf);
    rt_dataset_close(&ds);

    uint8_t wrong[4 * 7] = {0}; /* per-sample [7] does not fit [1, 3, 2] */
    write_npy(path_of("wrong.npy"), "|u1", "(4, 7)", wrong, sizeof wrong);
    const char *bad[] = {path_of("wrong.npy"), path_of("lab.npy")};
    assert_int_equal(rt_dataset_open(&model, bad, &ds, &err), -1);
    assert_non_null(strstr(err.msg, "'image'"));
    assert_non_null(strstr(err.msg, "[7]"));
    assert_non_null(strstr(err.msg, "[1, 3, 2]"));
    write_npy(path_of("lab3.npy"), "|u1", "(3,)", labels, 3);
    const char *counts[] = {path_of("img.idx"), path_of("lab3.npy")};
    assert_int_equal(rt_dataset_open(&model, counts, &ds, &err), -1);
    assert_non_null(strstr(err.msg, "3 samples"));
}

/* A mapped file truncated under the trainer: the copy out of its lost pages fails with the
 * file's name instead of SIGBUS, in the calling thread and in the prefetcher, and the file is
 * seen to have changed. */
static void test_file_shrinks_under_gather(void **state) {
    (void)state;
    enum { N = 4096 }; /* samples of 6 floats: 96 KiB, many pages */
    float *img = calloc(N * 6, sizeof *img);
    uint8_t *lab = calloc(N, 1);
    write_npy(path_of("big.npy"), "<f4", "(4096, 1, 3, 2)", img, N * 6 * sizeof *img);
    write_npy(path_of("big_lab.npy"), "|u1", "(4096,)", lab, N);
    free(img), free(lab);
    const char *files[] = {path_of("big.npy"), path_of("big_lab.npy")};
    RtDataset ds;
    RtError err;
    assert_int_equal(rt_dataset_open(&model, files, &ds, &err), 0);
    assert_int_equal(rt_dataset_unchanged(&ds, &err), 0);
    assert_int_equal(truncate(path_of("big.npy"), 128), 0); /* the header only */
    float out[2 * 6];
    int64_t outl[2];
    void *bufs[2] = {out, outl};
    int64_t idx[2] = {N - 1, N / 2}; /* pages past the new end */
    assert_int_equal(rt_gather(&model, &ds, idx, 2, bufs, &err), -1);
    assert_non_null(strstr(err.msg, "big.npy"));
    assert_non_null(strstr(err.msg, "shrank"));
    assert_int_equal(rt_gather(&model, &ds, idx, 2, bufs, &err), -1); /* and again: the guard re-arms */
    assert_int_equal(rt_dataset_unchanged(&ds, &err), -1);
    assert_non_null(strstr(err.msg, "big.npy"));
    assert_non_null(strstr(err.msg, "changed"));
    int64_t order[8] = {0, 1, 2, 3, N - 4, N - 3, N - 2, N - 1};
    RtPrefetch pf;
    rt_prefetch_start(&pf, &model, &ds, order, 4, NULL, 0, 1);
    int taken = 0;
    while (rt_prefetch_next(&pf)) taken++;
    assert_true(taken < 4); /* batches past the end of the file fail */
    assert_non_null(strstr(pf.err.msg, "big.npy"));
    rt_prefetch_stop(&pf);
    rt_dataset_close(&ds);
}

static const RtParam params[] = {
    {"a.weight", 2, {2, 3}, 0, 0, RT_INIT_UNIFORM, 1.0f, RT_F32, 0},
    {"a.bias", 1, {2}, 6, 6, RT_INIT_ZEROS, 0.0f, RT_F32, 0},
    {"a.count", 0, {0}, 8, -1, RT_INIT_ZEROS, 0.0f, RT_I64, 1}, /* a counter buffer, I64 in files */
};
static const RtModel pmodel = {.name = "p", .n_params = 3, .params = params, .n_param_floats = 9};

static void test_safetensors(void **state) {
    (void)state;
    float p[9], q[9];
    rt_init_params(&pmodel, p, 7);
    for (int i = 0; i < 6; i++) assert_true(fabsf(p[i]) <= 1.0f);
    assert_true(p[6] == 0 && p[7] == 0 && p[8] == 0);
    p[8] = 1234;
    RtError err;
    assert_int_equal(rt_st_save(path_of("w.safetensors"), &pmodel, p, &err), 0);
    size_t len;
    char *file = slurp(path_of("w.safetensors"), &len);
    assert_non_null(strstr(file + 8, "\"a.count\":{\"dtype\":\"I64\",\"shape\":[]"));
    int64_t count;
    memcpy(&count, file + len - 8, 8); /* the last tensor: the counter as a little-endian int64 */
    assert_int_equal(count, 1234);
    free(file);
    memset(q, 0, sizeof q);
    assert_int_equal(rt_st_load(path_of("w.safetensors"), &pmodel, q, &err), 0);
    assert_memory_equal(p, q, sizeof p);
    /* a save into a missing directory fails and names the file */
    assert_int_equal(rt_st_save(path_of("nope/w.safetensors"), &pmodel, p, &err), -1);
    assert_non_null(strstr(err.msg, "nope/w.safetensors"));
    /* a model with another parameter set refuses the file, naming the tensor */
    static const RtParam other[] = {{"a.weight", 2, {3, 2}, 0, 0, RT_INIT_ZEROS, 0, RT_F32, 0},
                                    {"a.bias", 1, {2}, 6, 6, RT_INIT_ZEROS, 0, RT_F32, 0},
                                    {"a.count", 0, {0}, 8, -1, RT_INIT_ZEROS, 0, RT_I64, 1}};
    RtModel m2 = pmodel;
    m2.params = other;
    assert_int_equal(rt_st_load(path_of("w.safetensors"), &m2, q, &err), -1);
    assert_non_null(strstr(err.msg, "a.weight"));
    assert_non_null(strstr(err.msg, "[2, 3]"));
    /* truncation is detected */
    FILE *f = fopen(path_of("w.safetensors"), "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(path_of("t.safetensors"), buf, n - 5);
    assert_int_equal(rt_st_load(path_of("t.safetensors"), &pmodel, q, &err), -1);
}

/* No temporary file of this name remains in the test directory, nor in sub. */
static int temporaries_in(const char *sub) {
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q '[.]tmp[.]'", sub);
    return system(cmd) == 0;
}

/* rt_out (rt_file.c): an aborted or failed write leaves the old file, a commit replaces it, and
 * only regular files are replaced - also at the longest path Linux accepts, where the old
 * FILE.tmp.PID name was cut back to FILE itself and a failed save removed the user's file. */
static void test_atomic_output(void **state) {
    (void)state;
    RtOut o;
    write_bytes(path_of("out.bin"), "old\n", 4);
    assert_int_equal(rt_out_open(&o, path_of("out.bin"), 0666), 0);
    fputs("half written", o.f);
    rt_out_abort(&o);
    size_t len;
    char *text = slurp(path_of("out.bin"), &len);
    assert_memory_equal(text, "old\n", 4);
    free(text);
    assert_false(temporaries_in(dir));
    assert_int_equal(rt_out_open(&o, path_of("out.bin"), 0666), 0);
    fputs("new\n", o.f);
    assert_int_equal(rt_out_commit(&o), 0);
    text = slurp(path_of("out.bin"), &len);
    assert_memory_equal(text, "new\n", 4);
    free(text);
    assert_false(temporaries_in(dir));
    /* a named pipe and a symbolic link are not replaced */
    assert_int_equal(mkfifo(path_of("pipe"), 0600), 0);
    assert_int_equal(rt_out_open(&o, path_of("pipe"), 0666), -1);
    assert_non_null(strstr(o.why, "named pipe"));
    assert_int_equal(symlink("out.bin", path_of("link")), 0);
    assert_int_equal(rt_out_open(&o, path_of("link"), 0666), -1);
    assert_non_null(strstr(o.why, "symbolic link"));
    /* a 4095-byte path: written, and an aborted write keeps the old file */
    char deep[4096];
    snprintf(deep, sizeof deep, "%s", dir);
    for (size_t n = strlen(deep); n < 4095 - 256; n = strlen(deep)) {
        deep[n] = '/';
        memset(deep + n + 1, 'd', 200);
        deep[n + 201] = '\0';
        assert_true(mkdir(deep, 0700) == 0 || errno == EEXIST);
    }
    char target[4096];
    size_t n = strlen(deep);
    memcpy(target, deep, n);
    target[n] = '/';
    memset(target + n + 1, 'w', 4095 - n - 1);
    target[4095] = '\0';
    write_bytes(target, "old\n", 4);
    assert_int_equal(rt_out_open(&o, target, 0666), 0);
    fputs("half written", o.f);
    rt_out_abort(&o);
    text = slurp(target, &len);
    assert_true(len == 4 && memcmp(text, "old\n", 4) == 0);
    free(text);
    assert_int_equal(rt_out_open(&o, target, 0666), 0);
    fputs("new\n", o.f);
    assert_int_equal(rt_out_commit(&o), 0);
    text = slurp(target, &len);
    assert_true(len == 4 && memcmp(text, "new\n", 4) == 0);
    free(text);
    assert_false(temporaries_in(deep));
}

static void test_schedules(void **state) {
    (void)state;
    RtSchedule s = {.kind = RT_SCHED_STEP, .base_lr = 0.1, .step_epochs = 2, .gamma = 0.5};
    assert_true(fabs(rt_lr_at(&s, 0, 10, 100) - 0.1) < 1e-12);
    assert_true(fabs(rt_lr_at(&s, 25, 10, 100) - 0.05) < 1e-12); /* epoch 2.5 */
    s = (RtSchedule){.kind = RT_SCHED_COSINE, .base_lr = 1, .min_lr = 0.1};
    assert_true(fabs(rt_lr_at(&s, 50, 10, 100) - 0.55) < 1e-12); /* half way */
    assert_true(fabs(rt_lr_at(&s, 100, 10, 100) - 0.1) < 1e-12);
    s = (RtSchedule){.kind = RT_SCHED_CONSTANT, .base_lr = 1, .warmup_epochs = 1};
    assert_true(fabs(rt_lr_at(&s, 0, 10, 100) - 0.1) < 1e-12); /* first step is not 0 */
    assert_true(fabs(rt_lr_at(&s, 9, 10, 100) - 1.0) < 1e-12);
    assert_true(fabs(rt_lr_at(&s, 50, 10, 100) - 1.0) < 1e-12);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "%s/netrt-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) ? 0 : -1;
}

/* rt_target.c: one evaluation meets every target given, or none; NaN meets nothing; the first
 * evaluation to meet it is the one reported; the options replace the model's, --no-target drops
 * them, and bad values are refused. */
static void test_target(void **state) {
    (void)state;
    RtModel m = {.name = "m", .has_accuracy = 1, .target_accuracy = 0.75};
    RtTarget t;
    rt_target_init(&t, &m);
    assert_true(rt_target_on(&t));
    assert_int_equal(rt_target_eval(&t, 1, 0.5, 0.7499), 0);
    assert_int_equal(rt_target_eval(&t, 2, NAN, NAN), 0);
    assert_int_equal(rt_target_eval(&t, 3, 9.0, 0.75), 1); /* at least A: equal is enough */
    assert_true(t.met);
    assert_int_equal(rt_target_eval(&t, 4, 9.0, 0.9), 0); /* met once; the last evaluation kept */
    assert_true(t.met && t.last_epoch == 4 && t.last_accuracy == 0.9);

    RtError err;
    rt_target_init(&t, &m);
    assert_int_equal(rt_target_option(&t, &m, "--target-loss", "0.5", &err), 0);
    char text[96];
    rt_target_text(&t, text, sizeof text);
    assert_string_equal(text, "accuracy >= 0.75 and loss <= 0.5");
    assert_int_equal(rt_target_eval(&t, 1, 0.6, 0.8), 0); /* accuracy alone */
    assert_int_equal(rt_target_eval(&t, 2, 0.4, 0.7), 0); /* loss alone */
    assert_int_equal(rt_target_eval(&t, 3, 0.5, 0.75), 1);

    assert_int_equal(rt_target_option(&t, &m, "--no-target", "", &err), 0);
    assert_false(rt_target_on(&t));
    assert_int_equal(rt_target_option(&t, &m, "--target-accuracy", "1", &err), 0);
    assert_true(t.accuracy == 1 && !t.has_loss);
    const char *bad[] = {"0", "1.01", "-1", "nan", "0.5x", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(rt_target_option(&t, &m, "--target-accuracy", bad[i], &err), -1);
    assert_int_equal(rt_target_option(&t, &m, "--target-loss", "inf", &err), -1);
    assert_int_equal(rt_target_option(&t, &m, "--target-loss", "-3", &err), 0); /* any finite loss */
    m.has_accuracy = 0;
    assert_int_equal(rt_target_option(&t, &m, "--target-accuracy", "0.5", &err), -1);
    assert_non_null(strstr(err.msg, "reports no accuracy"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_types),
        cmocka_unit_test(test_idx_plain_and_gzip),
        cmocka_unit_test(test_dataset_binding_and_gather),
        cmocka_unit_test(test_file_shrinks_under_gather),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_atomic_output),
        cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_target),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
