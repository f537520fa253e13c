/* rt_safetensors.c - parameters as safetensors files, in PyTorch's names and layouts.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 *   {"fc1.weight": {"dtype": "F32", "shape": [128, 784], "data_offsets": [0, 401408]}, ...,
 *    "__metadata__": {"format": "pt"}}
 * padded with spaces to a multiple of 8, then the tensors' bytes. We write F32 in the model's
 * parameter order; we read F32, F16, BF16 and F64 (converted by value) in any order. The JSON
 * header is parsed with cJSON. Saving goes through rt_out_open/rt_out_commit (rt_file.c): a
 * temporary file created exclusively beside FILE, flushed to disk, renamed over FILE, and the
 * directory flushed, so FILE is either the old file or the complete new one, and after a
 * successful save the new one survives a crash.
 *
 * Loading finds every mismatch before it fails, so one run lists them all. It refuses a tensor
 * that is not a parameter, "netc:optimizer_state" included, unless the file is a checkpoint whose
 * checksum rt_st_init has verified: a file holding that tensor without its checkpoint metadata
 * has lost it. RtInitRules relax the match for fine-tuning (--init-skip, --init-partial,
 * --init-prefix), and LoRA's adapters (rt_lora.c) are optional in a model's weights and alone in
 * an adapter file. A file may hold a pick of the parameters: the base model, or the adapters.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_internal.h"

enum { MAX_HEADER = 100 << 20 }; /* a header past 100 MiB is not a weight file we wrote */

int64_t rt_param_numel(const RtParam *p) {
    int64_t n = 1;
    for (int i = 0; i < p->rank; i++) n *= p->shape[i];
    return n;
}

/* Parameter i goes into a file of the given pick: every one, or one side of LoRA's split. */
static int picked(const RtModel *m, int i, RtPick pick) {
    return pick == RT_PICK_ALL || (rt_lora_role(m, i) != 0) == (pick == RT_PICK_ADAPTERS);
}

static char *build_header(const RtModel *m, RtPick pick, const char *prefix) {
    cJSON *root = cJSON_CreateObject();
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        if (!picked(m, i, pick)) continue;
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", p->name);
        cJSON *t = cJSON_AddObjectToObject(root, name);
        cJSON_AddStringToObject(t, "dtype", p->file_dtype == RT_I64 ? "I64" : "F32");
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < p->rank; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += rt_param_numel(p) * (p->file_dtype == RT_I64 ? 8 : 4);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "model", m->name);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

static int write_weights(FILE *f, const RtModel *m, const float *params, RtPick pick, const char *prefix) {
    char *header = build_header(m, pick, prefix);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int bad = write_all(f, len8, 8) || write_all(f, header, hlen) || write_all(f, "        ", padded - hlen);
    free(header);
    for (int i = 0; i < m->n_params && !bad; i++) { /* the host is little-endian, as the format */
        const RtParam *p = &m->params[i];
        if (!picked(m, i, pick)) continue;
        if (p->file_dtype != RT_I64) {
            bad = write_all(f, params + p->offset, (size_t)rt_param_numel(p) * 4);
            continue;
        }
        for (int64_t k = 0; k < rt_param_numel(p) && !bad; k++) { /* a counter such as num_batches_tracked */
            int64_t v = (int64_t)params[p->offset + k];
            bad = write_all(f, &v, 8);
        }
    }
    return bad ? -1 : 0;
}

int rt_st_save_pick(const char *path, const RtModel *m, const float *params, RtPick pick, const char *prefix,
                    RtError *err) {
    RtOut out;
    int rc = rt_out_open(&out, path, 0666);
    if (rc == 0 && write_weights(out.f, m, params, pick, prefix) != 0) {
        snprintf(out.why, sizeof out.why, "%s", strerror(errno));
        rt_out_abort(&out);
        rc = -1;
    } else if (rc == 0) {
        rc = rt_out_commit(&out);
    }
    if (rc) return rt_fail(err, "cannot save weights to '%s': %s (the old file, if any, is unchanged)", path, out.why);
    return 0;
}

int rt_st_save(const char *path, const RtModel *m, const float *params, RtError *err) {
    return rt_st_save_pick(path, m, params, RT_PICK_ALL, NULL, err);
}

/* ---- loading */

static int elem_size(const char *dtype) {
    if (strcmp(dtype, "F32") == 0) return 4;
    if (strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0) return 2;
    if (strcmp(dtype, "F64") == 0 || strcmp(dtype, "I64") == 0) return 8;
    return 0;
}

static float load_elem(const unsigned char *p, const char *dtype) {
    if (dtype[0] == 'F' && dtype[1] == '3') {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (dtype[0] == 'F' && dtype[1] == '6') {
        double d;
        memcpy(&d, p, 8);
        return (float)d;
    }
    if (dtype[0] == 'I') {
        int64_t v;
        memcpy(&v, p, 8);
        return (float)v;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return dtype[0] == 'B' ? rt_bf16_to_f32(h) : rt_f16_to_f32(h);
}

static const RtParam *find_param(const RtModel *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

static void shape_text(const cJSON *shape, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    const cJSON *d;
    int first = 1;
    cJSON_ArrayForEach(d, shape) {
        if (n >= size) break;
        n += (size_t)snprintf(buf + n, size - n, "%s%.0f", first ? "" : ", ", d->valuedouble);
        first = 0;
    }
    if (n < size) snprintf(buf + n, size - n, "]");
}

/* The model's shape of p as text, "[10, 84]". */
static void param_shape_text(const RtParam *p, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < p->rank && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

/* One load in progress. A mismatch (a missing, unexpected, misshapen or unreadable tensor) is
 * not an error at once: every one is listed in `problems`, so one run shows them all. What a
 * non-strict load leaves alone (RtInitRules) is listed in `notes`. */
typedef struct Load {
    const char *path;
    const RtModel *m;
    const RtInitRules *r;
    const unsigned char *data;
    size_t data_len;
    float *params;
    char *hit;         /* per parameter: 1 loaded from the file, 2 found there but refused */
    char *skip_used;   /* per --init-skip pattern: it matched a parameter */
    FILE *problems, *notes; /* open_memstream()s over problem_text and note_text */
    char *problem_text, *note_text;
    size_t problem_len, note_len;
    int n_problems, n_notes;
    char first[512];   /* the first problem, repeated in the error message */
} Load;

static void problem(Load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(Load *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!l->n_problems++) vsnprintf(l->first, sizeof l->first, fmt, ap);
    va_end(ap);
    va_start(ap, fmt);
    fputs("  ", l->problems), vfprintf(l->problems, fmt, ap), fputc('\n', l->problems);
    va_end(ap);
}

static void note(Load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(Load *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    l->n_notes++;
    fputs("  ", l->notes), vfprintf(l->notes, fmt, ap), fputc('\n', l->notes);
    va_end(ap);
}

/* A parameter matches an --init-skip pattern as `freeze` names do (the name itself, or a prefix
 * followed by '.'), or as a shell glob when the pattern holds '*', '?' or '['. */
static int pattern_matches(const char *pat, size_t len, const char *name) {
    char buf[256];
    if (len >= sizeof buf) return 0;
    memcpy(buf, pat, len), buf[len] = 0;
    if (strpbrk(buf, "*?[")) return fnmatch(buf, name, 0) == 0;
    return strncmp(name, buf, len) == 0 && (name[len] == 0 || name[len] == '.');
}

static int skipped(Load *l, const char *name) {
    const char *s = l->r->skip;
    int hit = 0;
    for (int k = 0; s && *s; k++) {
        size_t len = strcspn(s, ",");
        if (len && pattern_matches(s, len, name)) l->skip_used[k] = 1, hit = 1;
        s += len + (s[len] == ',');
    }
    return hit;
}

/* Check one tensor entry against parameter p and copy it into params. A malformed entry or
 * offsets outside the file mean a broken file: an error at once. */
static int load_tensor(Load *l, const RtParam *p, const cJSON *t, RtError *err) {
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return rt_fail(err, "%s: tensor '%s' has a malformed header entry", l->path, t->string);
    int es = elem_size(dt->valuestring);
    int fits = cJSON_GetArraySize(shape) == p->rank;
    for (int d = 0; fits && d < p->rank; d++) {
        const cJSON *x = cJSON_GetArrayItem(shape, d);
        fits = cJSON_IsNumber(x) && x->valuedouble == (double)p->shape[d];
    }
    char got[256], want[256];
    shape_text(shape, got, sizeof got);
    param_shape_text(p, want, sizeof want);
    if (!es)
        problem(l, "tensor '%s' %s has dtype %s (F32, F16, BF16, F64 or I64 expected)", t->string, got,
                dt->valuestring);
    if (!fits) problem(l, "tensor '%s' has shape %s but the model's parameter is %s", t->string, got, want);
    l->hit[p - l->m->params] = es && fits ? 1 : 2;
    if (!es || !fits) return 0;
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    int64_t n = rt_param_numel(p);
    if (!(b >= 0 && e <= (double)l->data_len && e - b == (double)(n * es)))
        return rt_fail(err, "%s: tensor '%s' has data offsets [%.0f, %.0f] outside the file or not matching its shape",
                       l->path, t->string, b, e);
    const unsigned char *src = l->data + (size_t)b;
    float *dst = l->params + p->offset;
    for (int64_t i = 0; i < n; i++) dst[i] = load_elem(src + i * es, dt->valuestring);
    return 0;
}

/* One tensor of the file: its name with --init-prefix stripped names the parameter it fills. */
static int file_tensor(Load *l, const cJSON *root, const cJSON *t, RtError *err) {
    for (const cJSON *u = root->child; u != t; u = u->next)
        if (strcmp(u->string, t->string) == 0)
            return rt_fail(err, "%s: tensor '%s' appears twice in the header", l->path, t->string);
    const char *name = t->string, *pre = l->r->prefix;
    if (pre && strncmp(name, pre, strlen(pre)) == 0) name += strlen(pre);
    const RtParam *p = find_param(l->m, name);
    char got[256] = "";
    shape_text(cJSON_GetObjectItemCaseSensitive(t, "shape"), got, sizeof got);
    if (p && skipped(l, name)) {
        note(l, "ignored tensor '%s' %s of the file (--init-skip)", t->string, got);
        return 0;
    }
    if (p && l->r->adapters && !rt_lora_role(l->m, (int)(p - l->m->params))) {
        problem(l, "tensor '%s' %s is not one of model '%s''s LoRA adapters", t->string, got, l->m->name);
        return 0;
    }
    if (!p && l->r->partial) note(l, "ignored tensor '%s' %s: not a parameter of the model", t->string, got);
    else if (!p) problem(l, "unexpected tensor '%s' %s: not a parameter of model '%s'", t->string, got, l->m->name);
    else if (l->hit[p - l->m->params]) problem(l, "tensor '%s' fills parameter '%s' a second time", t->string, name);
    return p ? load_tensor(l, p, t, err) : 0;
}

/* The model's parameters that no tensor filled keep their initialisation when skipped or in a
 * partial load; otherwise each is missing. LoRA's adapters may be missing from a model's weights
 * (a base model's file), the base from an adapter file. */
static void unfilled_params(Load *l) {
    for (int i = 0; i < l->m->n_params; i++) {
        const RtParam *p = &l->m->params[i];
        char want[256];
        param_shape_text(p, want, sizeof want);
        if (l->hit[i] || (rt_lora_role(l->m, i) != 0) != l->r->adapters) continue;
        if (skipped(l, p->name) || l->r->partial)
            note(l, "kept the initialisation of '%s' %s", p->name, want);
        else
            problem(l, "missing tensor '%s%s' %s", l->r->prefix ? l->r->prefix : "", p->name, want);
    }
    const char *s = l->r->skip;
    for (int k = 0; s && *s; k++) {
        size_t len = strcspn(s, ",");
        if (!l->skip_used[k]) problem(l, "--init-skip '%.*s' matches no parameter of model '%s'", (int)len, s, l->m->name);
        s += len + (s[len] == ',');
    }
}

/* A hint for the commonest reason names do not match: a file saved from a model wrapped in
 * torch.nn.parallel.DistributedDataParallel, whose names all start with "module.". */
static const char *prefix_hint(const Load *l, const cJSON *root) {
    if (l->r->prefix || !root->child) return "";
    for (const cJSON *t = root->child; t; t = t->next)
        if (strcmp(t->string, "__metadata__") && strncmp(t->string, "module.", 7)) return "";
    return "\n  hint: the file's names start with 'module.' (saved from DistributedDataParallel): "
           "add --init-prefix module.";
}

static int count_hits(const Load *l) {
    int n = 0;
    for (int i = 0; i < l->m->n_params; i++) n += l->hit[i] == 1;
    return n;
}

/* Write what the load found: the notes, and the problems as one error. A non-strict load that
 * loaded nothing is a problem too: the file is not the model's, or its names need a prefix. */
static int finish_load(Load *l, const cJSON *root, RtError *err) {
    const char *hint = prefix_hint(l, root);
    if (!l->n_problems && l->m->n_params && !count_hits(l))
        problem(l, "no tensor of the file is a parameter of model '%s'", l->m->name);
    fflush(l->problems), fflush(l->notes);
    if (l->n_problems && l->r->report)
        fprintf(l->r->report, "%s: %d mismatch%s with model '%s':\n%s", l->path, l->n_problems,
                l->n_problems > 1 ? "es" : "", l->m->name, l->problem_text);
    if (l->n_problems)
        return rt_fail(err, "%s: %d mismatch%s with model '%s'%s: %s%s%s%s", l->path, l->n_problems,
                       l->n_problems > 1 ? "es" : "", l->m->name, l->r->report ? " (listed above)" : "",
                       l->n_problems > 1 ? "the first is " : "", l->first, hint,
                       l->r->partial || l->r->skip ? ""
                       : "\n  hint: --init-skip NAME,... keeps the initialisation of the named parameters (a new "
                         "head); --init-partial loads only the tensors the model has");
    if (l->n_notes && l->r->notes)
        fprintf(l->r->notes, "%s: loaded %d of %d parameters; not loaded:\n%s", l->path,
                count_hits(l), l->m->n_params, l->note_text);
    return 0;
}

/* Every tensor of the file, then every parameter the file did not fill. */
static int load_all(Load *l, const cJSON *root, RtError *err) {
    int rc = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, root) {
        if (strcmp(t->string, "__metadata__") == 0) continue;
        if (l->r->checkpoint && strcmp(t->string, "netc:optimizer_state") == 0) continue;
        if ((rc = file_tensor(l, root, t, err))) return rc;
    }
    unfilled_params(l);
    return finish_load(l, root, err);
}

/* torch.save writes a zip archive ("PK\3\4", PyTorch 1.6 on) or, before, a bare pickle
 * (0x80 and the protocol number 2 to 5): a common mistake worth naming, with the way out. A
 * safetensors file can start with the same bytes (a header of 0x280 bytes begins 80 02), so this
 * is asked only of a file that is not a safetensors file. */
static int is_torch_pickle(const unsigned char *buf) {
    return memcmp(buf, "PK\3\4", 4) == 0 || (buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5);
}

static int parse_and_load(const char *path, const RtModel *m, const unsigned char *buf, size_t len,
                          float *params, const RtInitRules *r, RtError *err) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    int header_fits = hlen <= MAX_HEADER && hlen <= len - 8;
    if ((!header_fits || hlen == 0 || buf[8] != '{') && is_torch_pickle(buf))
        return rt_fail(err, "%s: a PyTorch pickle (torch.save), not a safetensors file\n"
                       "  hint: convert it: python3 -c \"import torch, safetensors.torch as st; "
                       "st.save_file(torch.load('%s', map_location='cpu'), 'weights.safetensors')\"",
                       path, path);
    if (!header_fits)
        return rt_fail(err, "%s: not a safetensors file, or truncated (header length %llu, file %zu bytes)",
                       path, (unsigned long long)hlen, len);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rt_fail(err, "%s: the safetensors header is not valid JSON", path);
    }
    Load l = {.path = path, .m = m, .r = r, .data = buf + 8 + hlen, .data_len = len - 8 - (size_t)hlen,
              .params = params, .hit = calloc((size_t)m->n_params + 1, 1),
              .skip_used = calloc(r->skip ? strlen(r->skip) + 1 : 1, 1)};
    l.problems = open_memstream(&l.problem_text, &l.problem_len);
    l.notes = open_memstream(&l.note_text, &l.note_len);
    int rc = !l.hit || !l.skip_used || !l.problems || !l.notes
                 ? rt_fail(err, "out of memory reading weights '%s'", path)
                 : load_all(&l, root, err);
    if (l.problems) fclose(l.problems);
    if (l.notes) fclose(l.notes);
    free(l.problem_text), free(l.note_text), free(l.hit), free(l.skip_used);
    cJSON_Delete(root);
    return rc;
}

int rt_st_load_rules(const char *path, const RtModel *m, float *params, const RtInitRules *r, RtError *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return rt_fail(err, "cannot open weights '%s': %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return rt_fail(err, "cannot read weights '%s': %s", path, strerror(errno));
    }
    long size = ftell(f);
    rewind(f);
    if (size < 8) {
        fclose(f);
        return rt_fail(err, "%s: not a safetensors file (only %ld bytes)", path, size < 0 ? 0 : size);
    }
    unsigned char *buf = malloc((size_t)size);
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    int rc = got == (size_t)size ? parse_and_load(path, m, buf, (size_t)size, params, r, err)
                                 : rt_fail(err, "cannot read weights '%s'", path);
    free(buf);
    return rc;
}

int rt_st_load(const char *path, const RtModel *m, float *params, RtError *err) {
    return rt_st_load_rules(path, m, params, &(RtInitRules){0}, err);
}

/* A checkpoint also serves as a weight file: its checksum is checked, and its optimizer state is
 * not wanted here. */
int rt_st_init(const char *path, const RtModel *m, float *params, const RtInitRules *r, RtError *err) {
    if (!rt_ckpt_is_checkpoint(path)) return rt_st_load_rules(path, m, params, r, err);
    RtInitRules ck = *r;
    ck.checkpoint = 1;
    return rt_ckpt_verify(path, err) || rt_st_load_rules(path, m, params, &ck, err) ? -1 : 0;
}
