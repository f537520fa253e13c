/* rt_checkpoint.c - checkpoints: everything a run needs to continue bit-identically.
 *
 * A checkpoint is a safetensors file (the container is described in rt_safetensors.c):
 *   - every parameter under its own name, in PyTorch's shape, in model order, F32 (I64 for
 *     counters such as num_batches_tracked), as rt_st_save writes them, so the file also serves
 *     as a weight file;
 *   - "netc:optimizer_state", F32 [n_state_slots, n_grad_floats], when the optimizer has state
 *     (the ':' cannot occur in a parameter name, so it never collides with one);
 *   - "__metadata__": the format version, the model's name and fingerprint, the training
 *     position and settings, and "crc32" (docs/trainer.md lists every key).
 * The CRC-32 covers every tensor byte and then every other metadata entry as "key=value\n" in
 * byte order of the keys, so a damaged tensor or a damaged position is caught; damage to the
 * JSON syntax, names, shapes or offsets is caught by parsing and checking them.
 *
 * Writing is atomic and durable (rt_file.c): a temporary file FILE.tmp.RANDOM created
 * exclusively, fflush, fsync, rename over FILE, fsync of the directory. A crash at any moment
 * leaves the previous FILE or the complete new one, and at worst a stale temporary file that
 * nothing reads. Reading checks everything before it copies
 * anything into the caller's buffers.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt_internal.h"
#include "cuda/rt_devstate.h" /* the loss scale's range, RT_LOSS_SCALE_MIN and _MAX */

#define OPTSTATE_NAME "netc:optimizer_state"
enum { MAX_HEADER = 100 << 20 };

static int64_t optstate_floats(const RtModel *m) { return (int64_t)m->n_state_slots * m->n_grad_floats; }

static const char *optim_name(RtOptimKind k) { return rt_optimizer(k)->name; }

static int is_i64(const RtParam *p) { return p->file_dtype == RT_I64; }

/* ---- fingerprint: FNV-1a 64 of a text that names everything the saved buffers' meaning
 * depends on. Hyperparameters compiled into the step functions (momentum, betas) are not
 * visible to the runtime and so not part of it. */

static uint64_t fnv_text(uint64_t h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint64_t fnv_text(uint64_t h, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (const char *c = buf; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001B3ull;
    return h;
}

static uint64_t fnv_shape(uint64_t h, int rank, const int64_t *shape) {
    for (int d = 0; d < rank; d++) h = fnv_text(h, "%s%" PRId64, d ? "," : "[", shape[d]);
    return fnv_text(h, "];");
}

/* batch: the global batch, m->batch times the ranks of a distributed run, so that a run's
 * checkpoint resumes under any number of ranks that keeps it (or in one process of that batch). */
static uint64_t fingerprint(const RtModel *m, int64_t batch) {
    uint64_t h = 0xCBF29CE484222325ull;
    h = fnv_text(h, "model %s batch %" PRId64 " optim %d slots %d floats %" PRId64 " %" PRId64 ";",
                 m->name, batch, (int)m->optim, m->n_state_slots, m->n_param_floats, m->n_grad_floats);
    const RtSchedule *s = &m->schedule;
    h = fnv_text(h, "schedule %d %a %a %a %a %a;", (int)s->kind, s->base_lr, s->warmup_epochs,
                 s->step_epochs, s->gamma, s->min_lr);
    if (s->warmup_steps || s->step_steps) /* only when given: older checkpoints keep their fingerprint */
        h = fnv_text(h, "in steps %a %a;", s->warmup_steps, s->step_steps);
    if (s->kind == RT_SCHED_POLY) h = fnv_text(h, "power %a;", s->power);
    if (m->clip_grad_norm > 0) h = fnv_text(h, "clip_grad_norm %a;", m->clip_grad_norm);
    /* eta (LARS's) only when given: older checkpoints keep their fingerprint */
#define HYPER(name)                                                  \
    if (strcmp(#name, "eta") != 0 || m->hyper.name != 0) h = fnv_text(h, #name " %a;", m->hyper.name);
    RT_OPTIM_PARAMS(HYPER)
#undef HYPER
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        h = fnv_text(h, "param %s %" PRId64 " %" PRId64 " %d %d", p->name, p->offset, p->grad_offset,
                     (int)p->file_dtype, p->buffer);
        h = fnv_shape(h, p->rank, p->shape);
    }
    for (int i = 0; i < m->n_inputs; i++) {
        h = fnv_text(h, "input %s %d", m->inputs[i].name, (int)m->inputs[i].dtype);
        h = fnv_shape(h, m->inputs[i].rank, m->inputs[i].shape);
    }
    return h;
}

/* ---- checksum */

static uLong crc_bytes(uLong crc, const void *p, size_t n) {
    const unsigned char *b = p;
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, b, chunk);
        b += chunk, n -= chunk;
    }
    return crc;
}

static int by_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Continue crc over the metadata entries except "crc32", as "key=value\n" sorted by key.
 * Every entry must be a string (safetensors metadata is a string-to-string map). */
static uLong crc_metadata(uLong crc, const cJSON *meta) {
    int n = cJSON_GetArraySize(meta), k = 0;
    const cJSON **items = malloc(sizeof *items * (size_t)(n ? n : 1));
    if (!items) return crc;
    const cJSON *e;
    cJSON_ArrayForEach(e, meta) if (strcmp(e->string, "crc32") != 0) items[k++] = e;
    qsort(items, (size_t)k, sizeof *items, by_key);
    for (int i = 0; i < k; i++) {
        crc = crc_bytes(crc, items[i]->string, strlen(items[i]->string));
        crc = crc_bytes(crc, "=", 1);
        crc = crc_bytes(crc, items[i]->valuestring, strlen(items[i]->valuestring));
        crc = crc_bytes(crc, "\n", 1);
    }
    free(items);
    return crc;
}

/* ---- writing */

static void add_tensor(cJSON *root, const char *name, int i64, int rank, const int64_t *shape, int64_t *off) {
    cJSON *t = cJSON_AddObjectToObject(root, name);
    cJSON_AddStringToObject(t, "dtype", i64 ? "I64" : "F32");
    cJSON *sh = cJSON_AddArrayToObject(t, "shape");
    int64_t n = 1;
    for (int d = 0; d < rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d])), n *= shape[d];
    cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*off));
    *off += n * (i64 ? 8 : 4);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*off));
}

/* Where the tensor bytes go: into the checksum, or into the file. */
typedef struct Sink {
    uLong crc;
    FILE *f; /* NULL: checksum only */
    int bad;
} Sink;

static void sink(Sink *s, const void *p, size_t n) {
    if (!s->f) s->crc = crc_bytes(s->crc, p, n);
    else if (!s->bad && fwrite(p, 1, n, s->f) != n) s->bad = 1;
}

/* Every tensor's bytes, in file order. The host is little-endian, as the format. An I64
 * counter is held as a float of integer value, so the conversion is exact both ways. */
static void emit_tensors(Sink *s, const RtModel *m, const float *params, const float *optstate) {
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        const float *x = params + p->offset;
        int64_t n = rt_param_numel(p), chunk[256];
        if (!is_i64(p)) sink(s, x, (size_t)n * 4);
        for (int64_t k = 0; is_i64(p) && k < n; k += 256) {
            int64_t c = n - k < 256 ? n - k : 256;
            for (int64_t j = 0; j < c; j++) chunk[j] = (int64_t)x[k + j];
            sink(s, chunk, (size_t)c * 8);
        }
    }
    if (m->n_state_slots > 0) sink(s, optstate, (size_t)optstate_floats(m) * 4);
}

static void meta_int(cJSON *meta, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    cJSON_AddStringToObject(meta, key, buf);
}

static void add_metadata(cJSON *meta, const RtModel *m, const RtTrainState *s) {
    char buf[32];
    cJSON_AddStringToObject(meta, "format", "pt");
    meta_int(meta, "netc_checkpoint", RT_CKPT_VERSION);
    cJSON_AddStringToObject(meta, "model", m->name);
    const int64_t global = m->batch * s->ranks * (s->accumulate > 1 ? s->accumulate : 1);
    snprintf(buf, sizeof buf, "%016" PRIx64, fingerprint(m, global));
    cJSON_AddStringToObject(meta, "fingerprint", buf);
    cJSON_AddStringToObject(meta, "optimizer", optim_name(m->optim));
    meta_int(meta, "batch", global); /* the global batch */
    if (s->ranks > 1) meta_int(meta, "ranks", s->ranks); /* only when distributed */
    if (s->accumulate > 1) meta_int(meta, "accumulate", s->accumulate); /* only with --accumulate */
    meta_int(meta, "step", s->step);
    meta_int(meta, "epoch", s->epoch);
    meta_int(meta, "batch_in_epoch", s->batch);
    meta_int(meta, "eval_done", s->eval_done);
    meta_int(meta, "total_steps", s->total_steps);
    meta_int(meta, "epochs", s->epochs);
    meta_int(meta, "steps", s->steps);
    meta_int(meta, "samples", s->samples);
    snprintf(buf, sizeof buf, "%" PRIu64, s->seed);
    cJSON_AddStringToObject(meta, "seed", buf);
    meta_int(meta, "shuffle", s->shuffle);
    meta_int(meta, "threads", s->threads);
    if (s->augment[0]) cJSON_AddStringToObject(meta, "augment", s->augment); /* only when augmenting */
    if (s->has_best) { /* only after an evaluation: --save-best's record to beat, exactly */
        snprintf(buf, sizeof buf, "%.17g", s->best);
        cJSON_AddStringToObject(meta, "best_quality", buf);
        meta_int(meta, "best_epoch", s->best_epoch);
        meta_int(meta, "best_step", s->best_step);
    }
    if (s->has_scale) { /* only from a loss-scaling trainer: the scale, a power of two, printed exactly */
        snprintf(buf, sizeof buf, "%.17g", s->scale.scale);
        cJSON_AddStringToObject(meta, "loss_scale", buf);
        meta_int(meta, "loss_scale_good", s->scale.good);
        meta_int(meta, "loss_scale_interval", s->scale.interval);
        meta_int(meta, "skipped_steps", s->scale.skipped);
    }
}

/* The header (unpadded JSON) for these buffers; the checksum needs the tensor bytes first. */
static char *build_header(const RtModel *m, const float *params, const float *optstate, const RtTrainState *s) {
    cJSON *root = cJSON_CreateObject();
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++)
        add_tensor(root, m->params[i].name, is_i64(&m->params[i]), m->params[i].rank, m->params[i].shape, &off);
    if (m->n_state_slots > 0) {
        int64_t shape[2] = {m->n_state_slots, m->n_grad_floats};
        add_tensor(root, OPTSTATE_NAME, 0, 2, shape, &off);
    }
    Sink crc = {.crc = crc32(0L, Z_NULL, 0)};
    emit_tensors(&crc, m, params, optstate);
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    add_metadata(meta, m, s);
    char buf[16];
    snprintf(buf, sizeof buf, "%08lx", crc_metadata(crc.crc, meta));
    cJSON_AddStringToObject(meta, "crc32", buf);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static int write_file(FILE *f, const RtModel *m, const char *header, const float *params, const float *optstate) {
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    Sink out = {.f = f};
    sink(&out, len8, 8);
    sink(&out, header, hlen);
    sink(&out, "        ", padded - hlen);
    emit_tensors(&out, m, params, optstate);
    return out.bad ? -1 : 0;
}

int rt_ckpt_save(const char *path, const RtModel *m, const float *params, const float *optstate,
                 const RtTrainState *s, RtError *err) {
    char *header = build_header(m, params, optstate, s);
    RtOut out;
    int rc = rt_out_open(&out, path, 0666);
    if (rc == 0 && write_file(out.f, m, header, params, optstate) != 0) {
        snprintf(out.why, sizeof out.why, "%s", strerror(errno));
        rt_out_abort(&out);
        rc = -1;
    } else if (rc == 0) {
        rc = rt_out_commit(&out);
    }
    free(header);
    if (rc)
        return rt_fail(err, "cannot write checkpoint '%s': %s (the previous checkpoint, if any, is unchanged)",
                       path, out.why);
    return 0;
}

int rt_ckpt_check_writable(const char *path, RtError *err) {
    char why[RT_WHY_MAX];
    if (rt_out_probe(path, why, sizeof why) != 0) return rt_fail(err, "cannot write checkpoint '%s': %s", path, why);
    return 0;
}

/* ---- reading */

/* A checkpoint file read into memory with its header parsed. */
typedef struct Ckpt {
    const char *path;
    unsigned char *buf;
    size_t len;
    cJSON *root;
    const cJSON *meta;
    const unsigned char *data; /* the tensor bytes */
    size_t data_len;
} Ckpt;

static void ckpt_close(Ckpt *c) {
    cJSON_Delete(c->root);
    free(c->buf);
}

static int read_whole(Ckpt *c, RtError *err) {
    FILE *f = fopen(c->path, "rb");
    if (!f) return rt_fail(err, "cannot open checkpoint '%s': %s", c->path, strerror(errno));
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size < 0) {
        int e = errno;
        fclose(f);
        return rt_fail(err, "cannot read checkpoint '%s': %s", c->path, strerror(e));
    }
    rewind(f);
    c->len = (size_t)size;
    c->buf = malloc(c->len + 1);
    size_t got = c->buf ? fread(c->buf, 1, c->len, f) : 0;
    fclose(f);
    if (!c->buf || got != c->len) return rt_fail(err, "cannot read checkpoint '%s'", c->path);
    return 0;
}

static const char *meta_str(const Ckpt *c, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Read the file, parse its header and check that it is a checkpoint of our version. */
static int ckpt_open(Ckpt *c, const char *path, RtError *err) {
    *c = (Ckpt){.path = path};
    if (read_whole(c, err)) return -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0 && c->len >= 8; i--) hlen = hlen << 8 | c->buf[i];
    if (c->len < 8 || hlen > MAX_HEADER || hlen > c->len - 8)
        return rt_fail(err, "checkpoint '%s' is not a safetensors file, or is truncated (%zu bytes)", path, c->len);
    c->root = cJSON_ParseWithLength((const char *)c->buf + 8, (size_t)hlen);
    c->meta = cJSON_GetObjectItemCaseSensitive(c->root, "__metadata__");
    c->data = c->buf + 8 + hlen, c->data_len = c->len - 8 - (size_t)hlen;
    if (!cJSON_IsObject(c->root))
        return rt_fail(err, "checkpoint '%s' is not a safetensors file: its header is not valid JSON", path);
    const char *version = cJSON_IsObject(c->meta) ? meta_str(c, "netc_checkpoint") : NULL;
    if (!version)
        return rt_fail(err, "'%s' is a safetensors file but not a netc checkpoint (no netc_checkpoint in its "
                            "__metadata__)\n  hint: to start from its weights, use --init", path);
    if (strcmp(version, "1") != 0)
        return rt_fail(err, "checkpoint '%s' has format version %s; this trainer reads version %d", path, version,
                       RT_CKPT_VERSION);
    const cJSON *e;
    cJSON_ArrayForEach(e, c->meta) if (!cJSON_IsString(e))
        return rt_fail(err, "checkpoint '%s': metadata '%s' is not a string", path, e->string);
    return 0;
}

/* Every tensor's offsets inside the data, and the data exactly as long as the tensors need. */
static int check_size(const Ckpt *c, RtError *err) {
    double need = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, c->root) {
        if (strcmp(t->string, "__metadata__") == 0) continue;
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        const cJSON *b = cJSON_GetArrayItem(offs, 0), *e = cJSON_GetArrayItem(offs, 1);
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(e) || b->valuedouble < 0 || e->valuedouble < b->valuedouble)
            return rt_fail(err, "checkpoint '%s': tensor '%s' has malformed data_offsets", c->path, t->string);
        if (e->valuedouble > need) need = e->valuedouble;
    }
    if (need > (double)c->data_len)
        return rt_fail(err, "checkpoint '%s' is truncated: its tensors need %.0f bytes after the header, it has %zu",
                       c->path, need, c->data_len);
    if (need < (double)c->data_len)
        return rt_fail(err, "checkpoint '%s' has %zu bytes after its tensors' %.0f (not a file netc wrote whole)",
                       c->path, c->data_len - (size_t)need, need);
    return 0;
}

static int check_crc(const Ckpt *c, RtError *err) {
    const char *want = meta_str(c, "crc32");
    char got[16];
    snprintf(got, sizeof got, "%08lx", crc_metadata(crc_bytes(crc32(0L, Z_NULL, 0), c->data, c->data_len), c->meta));
    if (!want) return rt_fail(err, "checkpoint '%s' has no crc32 in its __metadata__", c->path);
    if (strcmp(want, got) != 0)
        return rt_fail(err, "checkpoint '%s' is corrupt: its contents have CRC-32 %s but it records %s "
                            "(changed or damaged after it was written)", c->path, got, want);
    return 0;
}

/* A run resumes at the global batch it was written with (the model's batch x ranks x
 * accumulated batches): the steps taken, the position in the epoch and the schedule all count
 * batches of that size. */
static int check_model(const Ckpt *c, const RtModel *m, int ranks, int accumulate, RtError *err) {
    const char *name = meta_str(c, "model"), *batch = meta_str(c, "batch"), *optim = meta_str(c, "optimizer");
    const char *fp = meta_str(c, "fingerprint"), *was_ranks = meta_str(c, "ranks");
    const char *was_accumulate = meta_str(c, "accumulate");
    char want_batch[32], want_fp[32];
    snprintf(want_batch, sizeof want_batch, "%" PRId64, m->batch * ranks * accumulate);
    snprintf(want_fp, sizeof want_fp, "%016" PRIx64, fingerprint(m, m->batch * ranks * accumulate));
    if (!name || strcmp(name, m->name) != 0)
        return rt_fail(err, "checkpoint '%s' was written by model '%s', not '%s'", c->path, name ? name : "?", m->name);
    if ((!batch || strcmp(batch, want_batch) != 0) && !was_ranks && !was_accumulate && ranks == 1 && accumulate == 1)
        return rt_fail(err, "checkpoint '%s' was written with batch %s; this trainer has batch %s\n"
                            "  hint: recompile with -D batch=%s, or give --accumulate to reach it", c->path,
                       batch ? batch : "?", want_batch, batch ? batch : "?");
    if (!batch || strcmp(batch, want_batch) != 0)
        return rt_fail(err, "checkpoint '%s' was written at a global batch of %s (%s rank%s, --accumulate %s); "
                            "this run's is %s (%d rank%s x --accumulate %d x batch %" PRId64 ")\n  hint: resume "
                            "with ranks x accumulate x batch = %s: the same ranks, other ranks with --accumulate "
                            "or -D batch to make up for them", c->path, batch ? batch : "?",
                       was_ranks ? was_ranks : "1", was_ranks && strcmp(was_ranks, "1") ? "s" : "",
                       was_accumulate ? was_accumulate : "1", want_batch, ranks, ranks > 1 ? "s" : "", accumulate,
                       m->batch, batch ? batch : "?");
    if (!optim || strcmp(optim, optim_name(m->optim)) != 0)
        return rt_fail(err, "checkpoint '%s' was written with optimizer %s; this trainer uses %s", c->path,
                       optim ? optim : "?", optim_name(m->optim));
    if (!fp || strcmp(fp, want_fp) != 0)
        return rt_fail(err, "checkpoint '%s' was written by a different build of model '%s' (fingerprint %s, "
                            "this trainer %s): the parameters, optimizer or learning-rate schedule differ",
                       c->path, m->name, fp ? fp : "?", want_fp);
    return 0;
}

/* The tensor `name` with dtype I64 (i64) or F32 and exactly this shape; its bytes in *bytes. */
static int find_tensor(const Ckpt *c, const char *name, int i64, int rank, const int64_t *shape,
                       const unsigned char **bytes, RtError *err) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c->root, name);
    if (!t) return rt_fail(err, "checkpoint '%s' lacks tensor '%s'", c->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const char *want = i64 ? "I64" : "F32";
    int ok = cJSON_IsString(dt) && strcmp(dt->valuestring, want) == 0 && cJSON_IsArray(sh) &&
             cJSON_GetArraySize(sh) == rank;
    double n = i64 ? 8 : 4;
    for (int d = 0; ok && d < rank; d++) {
        const cJSON *x = cJSON_GetArrayItem(sh, d);
        ok = cJSON_IsNumber(x) && x->valuedouble == (double)shape[d];
        n *= (double)shape[d];
    }
    if (!ok) return rt_fail(err, "checkpoint '%s': tensor '%s' is not %s of the model's shape", c->path, name, want);
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (e - b != n) /* check_size() has put both inside the data */
        return rt_fail(err, "checkpoint '%s': tensor '%s' has data offsets [%.0f, %.0f] that do not match its shape",
                       c->path, name, b, e);
    *bytes = c->data + (size_t)b;
    return 0;
}

/* No tensor in the file that the model does not have. */
static int check_no_extra(const Ckpt *c, const RtModel *m, RtError *err) {
    const cJSON *t;
    cJSON_ArrayForEach(t, c->root) {
        int known = strcmp(t->string, "__metadata__") == 0 || strcmp(t->string, OPTSTATE_NAME) == 0;
        for (int i = 0; i < m->n_params && !known; i++) known = strcmp(t->string, m->params[i].name) == 0;
        if (!known) return rt_fail(err, "checkpoint '%s': tensor '%s' is not a parameter of model '%s'", c->path,
                                   t->string, m->name);
    }
    return 0;
}

/* Copy every parameter; all are checked first, so params changes only on success. */
static int copy_params(const Ckpt *c, const RtModel *m, float *params, RtError *err) {
    const unsigned char **bytes = malloc(sizeof *bytes * (size_t)(m->n_params + 1));
    int rc = !bytes ? rt_fail(err, "out of memory reading checkpoint '%s'", c->path) : check_no_extra(c, m, err);
    for (int i = 0; i < m->n_params && !rc; i++) {
        const RtParam *p = &m->params[i];
        rc = find_tensor(c, p->name, is_i64(p), p->rank, p->shape, &bytes[i], err);
    }
    for (int i = 0; i < m->n_params && !rc; i++) {
        const RtParam *p = &m->params[i];
        if (!is_i64(p)) memcpy(params + p->offset, bytes[i], (size_t)rt_param_numel(p) * 4);
        for (int64_t k = 0; is_i64(p) && k < rt_param_numel(p); k++) {
            int64_t v;
            memcpy(&v, bytes[i] + 8 * k, 8);
            params[p->offset + k] = (float)v;
        }
    }
    free(bytes);
    return rc;
}

static int meta_u64(const Ckpt *c, const char *key, uint64_t min, uint64_t *out, RtError *err) {
    const char *s = meta_str(c, key);
    char *end;
    errno = 0;
    unsigned long long v = s && *s != '-' ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || *end || errno || v < min)
        return rt_fail(err, "checkpoint '%s': metadata '%s' is %s%s%s, not an integer >= %" PRIu64, c->path, key,
                       s ? "'" : "missing", s ? s : "", s ? "'" : "", min);
    *out = v;
    return 0;
}

static int meta_int64(const Ckpt *c, const char *key, int64_t min, int64_t *out, RtError *err) {
    uint64_t v = 0;
    if (meta_u64(c, key, (uint64_t)min, &v, err)) return -1;
    if (v > INT64_MAX) return rt_fail(err, "checkpoint '%s': metadata '%s' is out of range", c->path, key);
    *out = (int64_t)v;
    return 0;
}

int rt_parse_loss_scale(const char *text, double *scale) {
    double v;
    int e;
    if (rt_parse_finite(text, &v) || !(v >= RT_LOSS_SCALE_MIN && v <= RT_LOSS_SCALE_MAX) || frexp(v, &e) != 0.5)
        return -1;
    *scale = v;
    return 0;
}

/* A loss-scaling trainer's scale (RtLossScale), recorded by such a trainer only. */
static int read_scale(const Ckpt *c, RtTrainState *s, RtError *err) {
    const char *v = meta_str(c, "loss_scale");
    if (rt_parse_loss_scale(v, &s->scale.scale))
        return rt_fail(err, "checkpoint '%s': metadata 'loss_scale' is '%s', not a power of two from 2^-24 to "
                            "2^127", c->path, v);
    s->has_scale = 1;
    return meta_int64(c, "loss_scale_good", 0, &s->scale.good, err) ||
                   meta_int64(c, "loss_scale_interval", 1, &s->scale.interval, err) ||
                   meta_int64(c, "skipped_steps", 0, &s->scale.skipped, err)
               ? -1
               : 0;
}

/* The best evaluation's quality so far (--save-best), recorded once the run has evaluated. */
static int read_best(const Ckpt *c, RtTrainState *s, RtError *err) {
    const char *v = meta_str(c, "best_quality");
    if (rt_parse_finite(v, &s->best))
        return rt_fail(err, "checkpoint '%s': metadata 'best_quality' is '%s', not a finite number", c->path, v);
    s->has_best = 1;
    return meta_int64(c, "best_epoch", 1, &s->best_epoch, err) || meta_int64(c, "best_step", 0, &s->best_step, err)
               ? -1
               : 0;
}

static int read_state(const Ckpt *c, int64_t global, RtTrainState *s, RtError *err) {
    int64_t eval_done, shuffle, threads, was_ranks = 1, was_accumulate = 1;
    if (meta_str(c, "ranks") && meta_int64(c, "ranks", 2, &was_ranks, err)) return -1;
    if (meta_str(c, "accumulate") && meta_int64(c, "accumulate", 2, &was_accumulate, err)) return -1;
    s->ranks = was_ranks > 1 << 20 ? 1 << 20 : (int)was_ranks;
    s->accumulate = was_accumulate > 1 << 20 ? 1 << 20 : (int)was_accumulate;
    if (meta_int64(c, "step", 0, &s->step, err) || meta_int64(c, "epoch", 1, &s->epoch, err) ||
        meta_int64(c, "batch_in_epoch", 0, &s->batch, err) || meta_int64(c, "eval_done", 0, &eval_done, err) ||
        meta_int64(c, "total_steps", 1, &s->total_steps, err) || meta_int64(c, "epochs", 1, &s->epochs, err) ||
        meta_int64(c, "steps", 0, &s->steps, err) || meta_int64(c, "samples", global, &s->samples, err) ||
        meta_int64(c, "shuffle", 0, &shuffle, err) || meta_int64(c, "threads", 1, &threads, err) ||
        meta_u64(c, "seed", 0, &s->seed, err))
        return -1;
    s->eval_done = eval_done != 0, s->shuffle = shuffle != 0, s->threads = threads > 1024 ? 1024 : (int)threads;
    const char *augment = meta_str(c, "augment");
    if (augment && strlen(augment) >= sizeof s->augment)
        return rt_fail(err, "checkpoint '%s': metadata 'augment' is too long", c->path);
    snprintf(s->augment, sizeof s->augment, "%s", augment ? augment : "");
    if (meta_str(c, "loss_scale") && read_scale(c, s, err)) return -1;
    if (meta_str(c, "best_quality") && read_best(c, s, err)) return -1;
    int64_t per_epoch = s->samples / global, at;
    /* in exact arithmetic: a crafted epoch must not wrap around to the recorded step */
    int wraps = __builtin_mul_overflow(s->epoch - 1, per_epoch, &at) || __builtin_add_overflow(at, s->batch, &at);
    if (wraps || s->batch > per_epoch || s->step != at || s->step > s->total_steps)
        return rt_fail(err, "checkpoint '%s': inconsistent position (step %" PRId64 ", epoch %" PRId64
                            ", batch %" PRId64 " of %" PRId64 ", total %" PRId64 " steps)",
                       c->path, s->step, s->epoch, s->batch, per_epoch, s->total_steps);
    return 0;
}

int rt_ckpt_load(const char *path, const RtModel *m, int ranks, int accumulate, float *params, float *optstate,
                 RtTrainState *s, RtError *err) {
    Ckpt c;
    const unsigned char *opt = NULL;
    int64_t shape[2] = {m->n_state_slots, m->n_grad_floats};
    RtTrainState st = {0};
    int rc = ckpt_open(&c, path, err) || check_size(&c, err) || check_crc(&c, err) ||
             check_model(&c, m, ranks, accumulate, err) || read_state(&c, m->batch * ranks * accumulate, &st, err) ||
             (m->n_state_slots > 0 && find_tensor(&c, OPTSTATE_NAME, 0, 2, shape, &opt, err)) ||
             copy_params(&c, m, params, err);
    if (!rc) {
        if (opt) memcpy(optstate, opt, (size_t)optstate_floats(m) * 4);
        *s = st;
    }
    ckpt_close(&c);
    return rc ? -1 : 0;
}

int rt_ckpt_verify(const char *path, RtError *err) {
    Ckpt c;
    int rc = ckpt_open(&c, path, err) || check_size(&c, err) || check_crc(&c, err);
    ckpt_close(&c);
    return rc ? -1 : 0;
}

int rt_ckpt_is_checkpoint(const char *path) {
    Ckpt c;
    RtError err;
    int rc = ckpt_open(&c, path, &err);
    int is = c.meta && cJSON_IsObject(c.meta) && meta_str(&c, "netc_checkpoint") != NULL;
    ckpt_close(&c);
    return rc == 0 || is;
}
