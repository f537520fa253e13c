/* rt_cifar.c - CIFAR-10's binary files (data_batch_1.bin ... data_batch_5.bin, test_batch.bin).
 *
 * Each file is a sequence of 3073-byte records: the label (0-9), then the 32x32 image as three
 * planes of 1024 bytes (red, green, blue), rows top to bottom. A data argument `cifar:F1,F2,...`
 * reads the files in the order given as one data set; the input it feeds decides which part is
 * read: an input of 3072 values per sample gets the pixels as u8 [N, 3, 32, 32], an input of one
 * value the labels as u8 [N]. Both are then checked and converted by value like any other file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_internal.h"

enum { CIFAR_PIXELS = 3 * 32 * 32, CIFAR_RECORD = 1 + CIFAR_PIXELS };

/* The records in the file, whose size must be a whole number of them. */
static int count_records(const char *file, int64_t *records, RtError *err) {
    struct stat st;
    if (stat(file, &st) != 0) return rt_fail(err, "%s: cannot open: %s", file, strerror(errno));
    if (!S_ISREG(st.st_mode)) return rt_fail(err, "%s: cannot read: not a regular file", file);
    if (st.st_size == 0 || st.st_size % CIFAR_RECORD != 0)
        return rt_fail(err, "%s: %lld bytes is not a CIFAR-10 binary file: its size must be a positive multiple of "
                            "%d (a record is 1 label byte and 3072 pixel bytes)", file, (long long)st.st_size,
                       CIFAR_RECORD);
    *records = st.st_size / CIFAR_RECORD;
    return 0;
}

/* Copy the wanted part of each of the file's `records` records to out. */
static int read_records(const char *file, int64_t records, int labels, unsigned char *out, RtError *err) {
    FILE *f = fopen(file, "rb");
    if (!f) return rt_fail(err, "%s: cannot open: %s", file, strerror(errno));
    unsigned char rec[CIFAR_RECORD];
    for (int64_t r = 0; r < records; r++) {
        if (fread(rec, 1, sizeof rec, f) != sizeof rec) {
            const char *why = ferror(f) ? strerror(errno) : "the file shrank while it was read";
            fclose(f);
            return rt_fail(err, "%s: cannot read record %lld: %s", file, (long long)r, why);
        }
        if (labels) out[r] = rec[0];
        else memcpy(out + r * CIFAR_PIXELS, rec + 1, CIFAR_PIXELS);
    }
    fclose(f);
    return 0;
}

/* Split the comma-separated list in spec into at most max file names (pointers into copy). */
static int split_files(char *copy, char **files, int max, const char *spec, RtError *err) {
    int n = 0;
    for (char *save = NULL, *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        if (n == max) return rt_fail(err, "cifar:%s: more than %d files", spec, max);
        files[n++] = f;
    }
    if (n == 0) return rt_fail(err, "cifar:%s: no file named (write cifar:FILE or cifar:FILE1,FILE2,...)", spec);
    return n;
}

static int load_files(char **files, int n, int labels, RtArray *a, RtError *err) {
    int64_t records[RT_CIFAR_MAX_FILES], total = 0, per = labels ? 1 : CIFAR_PIXELS;
    for (int i = 0; i < n; i++) {
        if (count_records(files[i], &records[i], err)) return -1;
        total += records[i];
    }
    unsigned char *data = malloc((size_t)(total * per));
    if (!data) return rt_fail(err, "%s: out of memory for %lld records", a->path, (long long)total);
    a->heap = data, a->data = data;
    for (int i = 0; i < n; i++, data += records[i - 1] * per)
        if (read_records(files[i], records[i], labels, data, err)) return -1;
    a->type = RT_FILE_U8, a->shape[0] = total, a->sample_elems = per;
    if (labels) a->rank = 1;
    else a->rank = 4, a->shape[1] = 3, a->shape[2] = 32, a->shape[3] = 32;
    return 0;
}

int rt_cifar_load(const char *spec, int labels, RtArray *a, RtError *err) {
    memset(a, 0, sizeof *a);
    a->path = malloc(strlen(spec) + sizeof "cifar:");
    char *copy = strdup(spec), *files[RT_CIFAR_MAX_FILES];
    if (!a->path || !copy) {
        free(copy);
        return rt_fail(err, "cifar:%s: out of memory", spec);
    }
    sprintf(a->path, "cifar:%s", spec);
    int n = split_files(copy, files, RT_CIFAR_MAX_FILES, spec, err);
    int rc = n < 0 ? -1 : load_files(files, n, labels, a, err);
    free(copy);
    return rc;
}
