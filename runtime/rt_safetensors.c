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
 * Loading refuses a tensor that is not a parameter, "netc:optimizer_state" included: a file
 * holding one is a checkpoint, which the trainer reads with rt_ckpt_load_params instead (it
 * checks the checksum first), so one that reaches here has lost its checkpoint metadata.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_internal.h"

enum { MAX_HEADER = 100 << 20 }; /* a header past 100 MiB is not a weight file we wrote */

static int64_t param_numel(const RtParam *p) {
    int64_t n = 1;
    for (int i = 0; i < p->rank; i++) n *= p->shape[i];
    return n;
}

static char *build_header(const RtModel *m) {
    cJSON *root = cJSON_CreateObject();
    int64_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const RtParam *p = &m->params[i];
        cJSON *t = cJSON_AddObjectToObject(root, p->name);
        cJSON_AddStringToObject(t, "dtype", p->file_dtype == RT_I64 ? "I64" : "F32");
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < p->rank; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += param_numel(p) * (p->file_dtype == RT_I64 ? 8 : 4);
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

static int write_weights(FILE *f, const RtModel *m, const float *params) {
    char *header = build_header(m);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int bad = write_all(f, len8, 8) || write_all(f, header, hlen) || write_all(f, "        ", padded - hlen);
    free(header);
    for (int i = 0; i < m->n_params && !bad; i++) { /* the host is little-endian, as the format */
        const RtParam *p = &m->params[i];
        if (p->file_dtype != RT_I64) {
            bad = write_all(f, params + p->offset, (size_t)param_numel(p) * 4);
            continue;
        }
        for (int64_t k = 0; k < param_numel(p) && !bad; k++) { /* a counter such as num_batches_tracked */
            int64_t v = (int64_t)params[p->offset + k];
            bad = write_all(f, &v, 8);
        }
    }
    return bad ? -1 : 0;
}

int rt_st_save(const char *path, const RtModel *m, const float *params, RtError *err) {
    RtOut out;
    int rc = rt_out_open(&out, path, 0666);
    if (rc == 0 && write_weights(out.f, m, params) != 0) {
        snprintf(out.why, sizeof out.why, "%s", strerror(errno));
        rt_out_abort(&out);
        rc = -1;
    } else if (rc == 0) {
        rc = rt_out_commit(&out);
    }
    if (rc) return rt_fail(err, "cannot save weights to '%s': %s (the old file, if any, is unchanged)", path, out.why);
    return 0;
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

/* Check one tensor entry against the model and copy it into params. */
static int load_tensor(const char *path, const RtModel *m, const cJSON *t, const unsigned char *data,
                       size_t data_len, float *params, RtError *err) {
    const RtParam *p = find_param(m, t->string);
    if (!p) return rt_fail(err, "%s: tensor '%s' is not a parameter of model '%s'", path, t->string, m->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return rt_fail(err, "%s: tensor '%s' has a malformed header entry", path, t->string);
    int es = elem_size(dt->valuestring);
    if (!es) return rt_fail(err, "%s: tensor '%s' has dtype %s (F32, F16, BF16, F64 or I64 expected)", path, t->string, dt->valuestring);
    int fits = cJSON_GetArraySize(shape) == p->rank;
    for (int d = 0; fits && d < p->rank; d++) {
        const cJSON *x = cJSON_GetArrayItem(shape, d);
        fits = cJSON_IsNumber(x) && x->valuedouble == (double)p->shape[d];
    }
    if (!fits) {
        char got[256], want[256] = "[";
        shape_text(shape, got, sizeof got);
        for (int d = 0; d < p->rank; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        strcat(want, "]");
        return rt_fail(err, "%s: tensor '%s' has shape %s but the model's parameter is %s", path, t->string, got, want);
    }
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, e = cJSON_GetArrayItem(offs, 1)->valuedouble;
    int64_t n = param_numel(p);
    if (!(b >= 0 && e <= (double)data_len && e - b == (double)(n * es)))
        return rt_fail(err, "%s: tensor '%s' has data offsets [%.0f, %.0f] outside the file or not matching its shape",
                       path, t->string, b, e);
    const unsigned char *src = data + (size_t)b;
    float *dst = params + p->offset;
    for (int64_t i = 0; i < n; i++) dst[i] = load_elem(src + i * es, dt->valuestring);
    return 0;
}

/* torch.save writes a zip archive ("PK\3\4", PyTorch 1.6 on) or, before, a bare pickle
 * (0x80 and the protocol number 2 to 5): a common mistake worth naming, with the way out. */
static int is_torch_pickle(const unsigned char *buf) {
    return memcmp(buf, "PK\3\4", 4) == 0 || (buf[0] == 0x80 && buf[1] >= 2 && buf[1] <= 5);
}

static int parse_and_load(const char *path, const RtModel *m, const unsigned char *buf, size_t len,
                          float *params, RtError *err) {
    if (is_torch_pickle(buf))
        return rt_fail(err, "%s: a PyTorch pickle (torch.save), not a safetensors file\n"
                       "  hint: convert it: python3 -c \"import torch, safetensors.torch as st; "
                       "st.save_file(torch.load('%s', map_location='cpu'), 'weights.safetensors')\"",
                       path, path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > MAX_HEADER || hlen > len - 8)
        return rt_fail(err, "%s: not a safetensors file, or truncated (header length %llu, file %zu bytes)",
                       path, (unsigned long long)hlen, len);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rt_fail(err, "%s: the safetensors header is not valid JSON", path);
    }
    int rc = 0, found = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, root) {
        if (strcmp(t->string, "__metadata__") == 0) continue;
        for (const cJSON *u = root->child; u != t && !rc; u = u->next)
            if (strcmp(u->string, t->string) == 0)
                rc = rt_fail(err, "%s: tensor '%s' appears twice in the header", path, t->string);
        if (rc || (rc = load_tensor(path, m, t, buf + 8 + hlen, len - 8 - (size_t)hlen, params, err))) break;
        found++;
    }
    for (int i = 0; !rc && i < m->n_params; i++)
        if (!cJSON_GetObjectItemCaseSensitive(root, m->params[i].name))
            rc = rt_fail(err, "%s: parameter '%s' of model '%s' is missing", path, m->params[i].name, m->name);
    (void)found;
    cJSON_Delete(root);
    return rc;
}

int rt_st_load(const char *path, const RtModel *m, float *params, RtError *err) {
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
    int rc = got == (size_t)size ? parse_and_load(path, m, buf, (size_t)size, params, err)
                                 : rt_fail(err, "cannot read weights '%s'", path);
    free(buf);
    return rc;
}
