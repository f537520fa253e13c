/* rt_augment.c - image augmentation of training batches in the loader thread: a random crop of
 * the image padded with zeros (torchvision's RandomCrop(size, padding=P)) and a horizontal flip
 * with probability 1/2 (RandomHorizontalFlip).
 *
 * `--augment NAME=OPS` names an input whose per-sample shape is [C, H, W] (a rank-4 input
 * [batch, C, H, W] of any dtype: the moves copy elements) and OPS, a comma-separated list of
 * `crop:P` (1 <= P <= min(H, W)) and `flip`. The draws for a sample are one 64-bit hash of the
 * run's seed, the epoch (from 1) and the sample's index in the file,
 *
 *     r = rt_mix(rt_mix(rt_mix(seed ^ 0xA06) ^ epoch) ^ sample)
 *
 * from which dy = r % (2P + 1), dx = (r >> 20) % (2P + 1) (0 without crop) and flip = (r >> 40) & 1:
 * out[c][y][x] = in[c][y + dy - P][x' + dx - P] (zero outside the image), with x' = W - 1 - x when
 * flipped, else x. So a batch depends only on (seed, epoch, samples), not on timing or on where a
 * run was resumed, and every augmented input of a sample gets the same draws (an image and its
 * mask move together). Evaluation batches and --gradcheck are never augmented.
 */
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

static int elem_size(RtDtype dt) {
    static const int size[] = {[RT_F32] = 4, [RT_F16] = 2, [RT_BF16] = 2, [RT_I32] = 4, [RT_I64] = 8, [RT_U8] = 1};
    return size[dt];
}

uint64_t rt_augment_draw(uint64_t seed, int64_t epoch, int64_t sample) {
    return rt_mix(rt_mix(rt_mix(seed ^ 0xA06) ^ (uint64_t)epoch) ^ (uint64_t)sample);
}

/* One operation of an OPS list, "crop:P" or "flip", into input i's entry of aug. */
static int parse_op(const RtModel *m, int i, const char *op, size_t len, RtAugment *aug, RtError *err) {
    const RtInput *in = &m->inputs[i];
    if (len == 4 && strncmp(op, "flip", 4) == 0) return aug->flip[i] = 1, 0;
    if (len > 5 && strncmp(op, "crop:", 5) == 0) {
        char *end;
        long p = strtol(op + 5, &end, 10);
        int64_t most = in->shape[1] < in->shape[2] ? in->shape[1] : in->shape[2];
        if (end == op + len && p >= 1 && p <= most) return aug->crop[i] = (int)p, 0;
        return rt_fail(err, "--augment %s: crop:P needs a padding P from 1 to %lld (the image's smaller side), "
                            "found '%.*s'", in->name, (long long)most, (int)(len - 5), op + 5);
    }
    return rt_fail(err, "--augment %s: unknown operation '%.*s' (known: crop:P, flip; e.g. %s=crop:4,flip)",
                   in->name, (int)len, op, in->name);
}

static int parse_input(const RtModel *m, int i, const char *ops, RtAugment *aug, RtError *err) {
    const RtInput *in = &m->inputs[i];
    if (in->rank != 3)
        return rt_fail(err, "--augment %s: crop and flip act on images [batch, C, H, W], but input '%s' has rank %d "
                            "(%d per sample)", in->name, in->name, in->rank + 1, in->rank);
    for (const char *p = ops;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (parse_op(m, i, p, len, aug, err)) return -1;
        if (!c) return 0;
        p = c + 1;
    }
}

int rt_augment_parse(const RtModel *m, const char *const *specs, RtAugment *aug, RtError *err) {
    memset(aug, 0, sizeof *aug);
    for (int i = 0; i < m->n_inputs; i++) {
        if (!specs[i]) continue;
        if (parse_input(m, i, specs[i], aug, err)) return -1;
        aug->any = 1;
    }
    return 0;
}

void rt_augment_text(const RtModel *m, const RtAugment *aug, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < m->n_inputs && n < size; i++) {
        if (!aug->crop[i] && !aug->flip[i]) continue;
        n += (size_t)snprintf(buf + n, size - n, "%s%s=", n ? ";" : "", m->inputs[i].name);
        if (aug->crop[i] && n < size) n += (size_t)snprintf(buf + n, size - n, "crop:%d", aug->crop[i]);
        if (aug->flip[i] && n < size) n += (size_t)snprintf(buf + n, size - n, "%sflip", aug->crop[i] ? "," : "");
    }
}

/* Parse text that rt_augment_text wrote. */
static int parse_text(const RtModel *m, const char *text, RtAugment *aug, const char *ckpt, RtError *err) {
    char copy[256];
    snprintf(copy, sizeof copy, "%s", text);
    memset(aug, 0, sizeof *aug);
    for (char *save = NULL, *part = strtok_r(copy, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(part, '=');
        int i = 0;
        if (eq) *eq = 0;
        while (eq && i < m->n_inputs && strcmp(m->inputs[i].name, part) != 0) i++;
        if (!eq || i == m->n_inputs || parse_input(m, i, eq + 1, aug, err))
            return rt_fail(err, "checkpoint '%s': cannot read its metadata 'augment' ('%s')", ckpt, text);
        aug->any = 1;
    }
    return 0;
}

int rt_augment_resume(const RtModel *m, RtAugment *aug, const char *recorded, const char *ckpt, RtError *err) {
    if (!aug->any) return parse_text(m, recorded, aug, ckpt, err);
    char given[256];
    rt_augment_text(m, aug, given, sizeof given);
    if (strcmp(given, recorded) == 0) return 0;
    return rt_fail(err, "--augment %s differs from the augmentation '%s' that checkpoint '%s' records; leave --augment "
                        "out", given, recorded[0] ? recorded : "none", ckpt);
}

/* Crop and flip one sample of input `in` from src to dst (elements of `es` bytes). */
static void move_sample(const RtInput *in, int es, int pad, int dy, int dx, int flip, const unsigned char *src,
                        unsigned char *dst) {
    int64_t C = in->shape[0], H = in->shape[1], W = in->shape[2];
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < H; y++) {
            int64_t sy = y + dy - pad;
            unsigned char *out = dst + ((c * H + y) * W) * es;
            if (sy < 0 || sy >= H) {
                memset(out, 0, (size_t)(W * es));
                continue;
            }
            const unsigned char *row = src + ((c * H + sy) * W) * es;
            for (int64_t x = 0; x < W; x++) {
                int64_t sx = (flip ? W - 1 - x : x) + dx - pad;
                if (sx < 0 || sx >= W) memset(out + x * es, 0, (size_t)es);
                else memcpy(out + x * es, row + sx * es, (size_t)es);
            }
        }
}

int rt_augment_batch(const RtAugment *aug, const RtModel *m, uint64_t seed, int64_t epoch, const int64_t *idx,
                     int64_t count, void *const *bufs, RtError *err) {
    for (int i = 0; i < m->n_inputs; i++) {
        if (!aug->crop[i] && !aug->flip[i]) continue;
        const RtInput *in = &m->inputs[i];
        int es = elem_size(in->dtype), pad = aug->crop[i];
        size_t bytes = (size_t)(in->shape[0] * in->shape[1] * in->shape[2] * es);
        unsigned char *copy = malloc(bytes);
        if (!copy) return rt_fail(err, "out of memory for augmenting input '%s'", in->name);
        for (int64_t r = 0; r < count; r++) {
            uint64_t d = rt_augment_draw(seed, epoch, idx[r]);
            unsigned char *s = (unsigned char *)bufs[i] + (size_t)r * bytes;
            memcpy(copy, s, bytes);
            move_sample(in, es, pad, (int)(d % (uint64_t)(2 * pad + 1)), (int)((d >> 20) % (uint64_t)(2 * pad + 1)),
                        aug->flip[i] && ((d >> 40) & 1), copy, s);
        }
        free(copy);
    }
    return 0;
}
