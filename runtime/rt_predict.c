/* rt_predict.c - --predict NAME=FILE ... --predict-out OUT.npy: the model's output for every
 * sample of the files, written as one float32 .npy array [samples, output shape...].
 *
 * The output is the value the train section names (output = x), else the one the model's loss
 * function reads first (the logits); the generated eval_step copies it, in logical row-major
 * order, into RtCtx.output, and a GPU trainer's device (`dev`) runs its evaluation step and hands
 * the output back in the same form through read_output. Only the inputs it depends on
 * (RtModel.output_inputs) are read: the others, such as the labels, are fed as zeros, which
 * change the loss the step computes but not the output. The samples are visited in file order
 * in batches of the compiled size; the last batch is padded with zero rows, which are not
 * written. The file goes through rt_out_open/rt_out_commit (rt_file.c), so OUT is either as it
 * was or complete.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* What --predict must be given: a file for every input the output reads, and no other. */
int rt_predict_check(const RtModel *m, const char *const *files, RtError *err) {
    if (m->output_rank < 0)
        return rt_fail(err, "--predict: model '%s' has no output: its train section names none (output = x) and "
                            "its loss is not written with a loss function (cross_entropy, mse, bce_with_logits) "
                            "whose first operand would be it", m->name);
    for (int i = 0; i < m->n_inputs; i++) {
        const char *name = m->inputs[i].name;
        int needed = (m->output_inputs >> i) & 1;
        if (needed && !files[i]) return rt_fail(err, "--predict: the output reads input '%s': add --predict %s=FILE", name, name);
        if (!needed && files[i])
            return rt_fail(err, "--predict %s=%s: the model's output does not depend on input '%s'; leave it out",
                           name, files[i], name);
    }
    return 0;
}

/* The .npy header of a float32 array [n, shape...], padded so the data starts at a multiple of
 * 64 bytes (format version 1.0). Returns its length. */
static size_t npy_header(const RtModel *m, int64_t n, char *buf, size_t size) {
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld,", (long long)n);
    for (int d = 0; d < m->output_rank; d++)
        len += snprintf(dict + len, sizeof dict - (size_t)len, " %lld,", (long long)m->output_shape[d]);
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    size_t total = (10 + (size_t)len + 1 + 63) / 64 * 64, pad = total - 10 - (size_t)len - 1;
    if (total > size) return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (char)((total - 10) & 0xff), buf[9] = (char)((total - 10) >> 8);
    memcpy(buf + 10, dict, (size_t)len);
    memset(buf + 10 + len, ' ', pad);
    buf[total - 1] = '\n';
    return total;
}

/* The inputs the output reads, as a model of their own, so the data set opens only their files. */
static void reading_model(const RtModel *m, const char *const *files, RtModel *sub, RtInput *inputs,
                          const char **sub_files, int *index) {
    *sub = *m;
    sub->n_inputs = 0;
    for (int i = 0; i < m->n_inputs; i++)
        if ((m->output_inputs >> i) & 1) {
            index[sub->n_inputs] = i;
            sub_files[sub->n_inputs] = files[i];
            inputs[sub->n_inputs++] = m->inputs[i];
        }
    sub->inputs = inputs;
}

static int write_batches(const RtModel *m, const RtModel *sub, const RtDataset *ds, RtCtx *ctx, const RtDevice *dev,
                         void *const *bufs, void *const *sub_bufs, FILE *f, RtError *err) {
    int64_t per_sample = 1, *idx = calloc((size_t)m->batch, sizeof *idx);
    for (int d = 0; d < m->output_rank; d++) per_sample *= m->output_shape[d];
    float *out = calloc((size_t)(m->batch * per_sample), sizeof *out);
    int rc = idx && out ? 0 : rt_fail(err, "out of memory for one batch of predictions");
    for (int64_t start = 0; !rc && start < ds->n_samples; start += m->batch) {
        int64_t count = rt_gather_from(sub, ds, start, idx, sub_bufs, err); /* sub's batch is m's */
        if (count < 0) {
            rc = -1;
            break;
        }
        if (dev) {
            dev->eval_step(bufs, count);
            dev->read_output(out);
        } else {
            ctx->inputs = bufs, ctx->n_valid = count, ctx->output = out;
            m->eval_step(ctx);
        }
        if (fwrite(out, sizeof *out, (size_t)(count * per_sample), f) != (size_t)(count * per_sample))
            rc = rt_fail(err, "cannot write the predictions: %s", strerror(errno ? errno : EIO));
    }
    ctx->output = NULL;
    free(idx), free(out);
    return rc;
}

int rt_predict(const RtModel *m, RtCtx *ctx, const RtDevice *dev, const char *const *files, const char *path,
               int64_t *n_out, RtError *err) {
    RtModel sub;
    RtInput inputs[RT_MAX_INPUTS];
    const char *sub_files[RT_MAX_INPUTS];
    int index[RT_MAX_INPUTS];
    reading_model(m, files, &sub, inputs, sub_files, index);
    RtDataset ds;
    if (rt_dataset_open(&sub, sub_files, &ds, err)) return -1;
    void *bufs[RT_MAX_INPUTS] = {0}, *sub_bufs[RT_MAX_INPUTS] = {0};
    int rc = 0;
    for (int i = 0; i < m->n_inputs; i++) /* zeroed: the inputs the output does not read stay zero */
        if (!(bufs[i] = calloc(1, rt_batch_bytes(m, i)))) rc = rt_fail(err, "out of memory for a batch");
    for (int k = 0; k < sub.n_inputs; k++) sub_bufs[k] = bufs[index[k]];
    RtOut out;
    char header[512];
    size_t hlen = npy_header(m, ds.n_samples, header, sizeof header);
    if (!rc && rt_out_open(&out, path, 0666)) rc = rt_fail(err, "cannot write '%s': %s", path, out.why);
    else if (!rc) {
        rc = fwrite(header, 1, hlen, out.f) == hlen ? write_batches(m, &sub, &ds, ctx, dev, bufs, sub_bufs, out.f, err)
                                                   : rt_fail(err, "cannot write '%s': %s", path, strerror(errno));
        if (rc) rt_out_abort(&out);
        else if (rt_out_commit(&out)) rc = rt_fail(err, "cannot write '%s': %s", path, out.why);
    }
    *n_out = ds.n_samples;
    for (int i = 0; i < m->n_inputs; i++) free(bufs[i]);
    rt_dataset_close(&ds);
    return rc;
}
