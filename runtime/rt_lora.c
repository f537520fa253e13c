/* rt_lora.c - LoRA's adapters on disk, in PEFT's format, so that Hugging Face's peft loads what
 * a trainer saves (PeftModel.from_pretrained(model, DIR)) and a trainer loads what peft saved:
 *
 *   DIR/adapter_model.safetensors   base_model.model.<module>.lora_A.weight [r, in]
 *                                   base_model.model.<module>.lora_B.weight [out, r]
 *   DIR/adapter_config.json         {"peft_type": "LORA", "r": 8, "lora_alpha": 16,
 *                                    "target_modules": ["q_proj", "v_proj"], ...}
 *
 * and the merged model, W + (alpha / r) B A in every adapted weight, as a weight file of the
 * model without LoRA (peft's merge_and_unload). Each file is written atomically (rt_file.h).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

static const char PEFT_PREFIX[] = "base_model.model.";

int rt_lora_role(const RtModel *m, int i) {
    if (!m->lora) return 0;
    for (int k = 0; k < m->lora->n_adapters; k++) {
        if (m->lora->adapters[k].a == i) return 1;
        if (m->lora->adapters[k].b == i) return 2;
    }
    return 0;
}

const char *rt_lora_file(const char *dir, int config, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s", dir, config ? "adapter_config.json" : "adapter_model.safetensors");
    return buf;
}

/* PEFT's LoraConfig as save_pretrained writes it, with the fields that say what the adapters
 * are; peft fills the others with its defaults. */
static char *config_json(const RtModel *m) {
    const RtLora *L = m->lora;
    int fan_in_fan_out = 0;
    for (int k = 0; k < L->n_adapters; k++) fan_in_fan_out |= L->adapters[k].transposed;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddNullToObject(c, "task_type");
    cJSON_AddNullToObject(c, "base_model_name_or_path");
    cJSON_AddNumberToObject(c, "r", L->r);
    cJSON_AddNumberToObject(c, "lora_alpha", L->alpha);
    cJSON_AddNumberToObject(c, "lora_dropout", L->dropout);
    cJSON *t = cJSON_AddArrayToObject(c, "target_modules");
    for (int i = 0; i < L->n_targets; i++) cJSON_AddItemToArray(t, cJSON_CreateString(L->targets[i]));
    cJSON_AddStringToObject(c, "bias", "none");
    cJSON_AddBoolToObject(c, "fan_in_fan_out", fan_in_fan_out);
    cJSON_AddBoolToObject(c, "inference_mode", 1);
    cJSON_AddBoolToObject(c, "init_lora_weights", 1);
    cJSON_AddNullToObject(c, "modules_to_save");
    cJSON_AddBoolToObject(c, "use_rslora", 0);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    return text;
}

static int write_text(const char *path, const char *text, RtError *err) {
    RtOut out;
    int rc = rt_out_open(&out, path, 0666);
    if (rc == 0 && (fputs(text, out.f) < 0 || fputc('\n', out.f) < 0)) {
        snprintf(out.why, sizeof out.why, "%s", strerror(errno));
        rt_out_abort(&out);
        rc = -1;
    } else if (rc == 0) {
        rc = rt_out_commit(&out);
    }
    return rc ? rt_fail(err, "cannot write '%s': %s (the old file, if any, is unchanged)", path, out.why) : 0;
}

int rt_lora_save(const char *dir, const RtModel *m, const float *params, RtError *err) {
    char path[4096];
    if (rt_st_save_pick(rt_lora_file(dir, 0, path, sizeof path), m, params, RT_PICK_ADAPTERS, PEFT_PREFIX, err))
        return -1;
    char *text = config_json(m);
    int rc = text ? write_text(rt_lora_file(dir, 1, path, sizeof path), text, err)
                  : rt_fail(err, "out of memory writing '%s'", path);
    free(text);
    return rc;
}

/* ---- loading */

/* name is one of names[0, n). */
static int listed(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return 1;
    return 0;
}

/* target_modules of a configuration (a list of names, or one name) is the model's set. */
static int same_targets(const cJSON *t, const RtLora *L) {
    if (!cJSON_IsString(t) && !cJSON_IsArray(t)) return 0;
    int n = 0, same = 1;
    const char **names = malloc((size_t)(cJSON_IsArray(t) ? cJSON_GetArraySize(t) + 1 : 1) * sizeof *names);
    if (!names) return 0;
    const cJSON *s;
    if (cJSON_IsString(t)) names[n++] = t->valuestring;
    else cJSON_ArrayForEach(s, t) {
        if (cJSON_IsString(s)) names[n++] = s->valuestring;
        else same = 0;
    }
    for (int i = 0; same && i < n; i++) same = listed(names[i], L->targets, L->n_targets);
    for (int k = 0; same && k < L->n_targets; k++) same = listed(L->targets[k], names, n);
    free(names);
    return same;
}

/* The configuration describes the adapters this model has: LoRA, the same rank, scale and
 * layers, plain (no rsLoRA or DoRA scaling, no trained biases). */
static int check_config(const char *path, const RtModel *m, RtError *err) {
    const RtLora *L = m->lora;
    char *text;
    if (rt_read_text(path, &text, err)) return -1;
    cJSON *c = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return rt_fail(err, "%s: not a JSON object", path);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(c, "lora_alpha");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(c, "bias");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c, "use_rslora");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(c, "use_dora");
    char targets[512] = "";
    for (int k = 0; k < L->n_targets; k++)
        snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s\"%s\"", k ? ", " : "", L->targets[k]);
    int rc = 0;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0)
        rc = rt_fail(err, "%s: peft_type is not \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble != L->r)
        rc = rt_fail(err, "%s: r is %g, but model '%s' has adapters of rank %d", path,
                     cJSON_IsNumber(r) ? r->valuedouble : -1.0, m->name, L->r);
    else if (!cJSON_IsNumber(alpha) || alpha->valuedouble != L->alpha)
        rc = rt_fail(err, "%s: lora_alpha is %g, but model '%s' scales its adapters by alpha = %g", path,
                     cJSON_IsNumber(alpha) ? alpha->valuedouble : -1.0, m->name, L->alpha);
    else if (!same_targets(cJSON_GetObjectItemCaseSensitive(c, "target_modules"), L))
        rc = rt_fail(err, "%s: target_modules differ from model '%s''s [%s]", path, m->name, targets);
    else if ((cJSON_IsString(bias) && strcmp(bias->valuestring, "none") != 0) || cJSON_IsTrue(rs) || cJSON_IsTrue(dora))
        rc = rt_fail(err, "%s: adapters with bias, use_rslora or use_dora are not LoRA as model '%s' computes it",
                     path, m->name);
    cJSON_Delete(c);
    return rc;
}

int rt_lora_load(const char *dir, const RtModel *m, float *params, RtError *err) {
    char path[4096];
    if (check_config(rt_lora_file(dir, 1, path, sizeof path), m, err)) return -1;
    RtInitRules rules = {.prefix = PEFT_PREFIX, .adapters = 1, .report = stderr};
    return rt_st_load_rules(rt_lora_file(dir, 0, path, sizeof path), m, params, &rules, err);
}

/* ---- merging */

int rt_lora_save_merged(const char *path, const RtModel *m, const float *params, RtError *err) {
    const RtLora *L = m->lora;
    size_t bytes = (size_t)m->n_param_floats * sizeof(float);
    float *merged = malloc(bytes);
    if (!merged) return rt_fail(err, "out of memory merging the adapters for '%s'", path);
    memcpy(merged, params, bytes);
    double scale = L->alpha / L->r;
    for (int k = 0; k < L->n_adapters; k++) {
        const RtAdapter *ad = &L->adapters[k];
        const RtParam *a = &m->params[ad->a], *b = &m->params[ad->b], *w = &m->params[ad->base];
        int64_t r = a->shape[0], in = a->shape[1], out = b->shape[0];
        const float *A = params + a->offset, *B = params + b->offset;
        float *W = merged + w->offset;
        for (int64_t o = 0; o < out; o++) /* (B A)[o][i] in double, rounded once into W */
            for (int64_t i = 0; i < in; i++) {
                double s = 0;
                for (int64_t j = 0; j < r; j++) s += (double)B[o * r + j] * A[j * in + i];
                float *wi = ad->transposed ? &W[i * out + o] : &W[o * in + i];
                *wi = (float)(*wi + scale * s);
            }
    }
    int rc = rt_st_save_pick(path, m, merged, RT_PICK_BASE, NULL, err);
    free(merged);
    return rc;
}
