/* augment_driver.c - runs libnetrt's augmentation on samples given as raw bytes, for
 * data_test.py to compare with its numpy reference of the documented draws (rt_augment.c).
 *
 *   augment_driver u8|f32 C H W OPS SEED EPOCH IN.raw OUT.raw SAMPLE...
 *
 * IN.raw holds one [C, H, W] sample per SAMPLE argument (that sample's index in the file);
 * OUT.raw receives them cropped and flipped as a training batch would be. A refused OPS prints
 * the trainer's message and exits 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

int main(int argc, char **argv) {
    if (argc < 11) {
        fprintf(stderr, "usage: augment_driver u8|f32 C H W OPS SEED EPOCH IN.raw OUT.raw SAMPLE...\n");
        return 2;
    }
    RtInput in = {.name = "image", .dtype = strcmp(argv[1], "u8") == 0 ? RT_U8 : RT_F32, .rank = 3,
                  .shape = {atoll(argv[2]), atoll(argv[3]), atoll(argv[4])}};
    int64_t count = argc - 10, idx[256];
    RtModel m = {.name = "augment", .batch = count, .n_inputs = 1, .inputs = &in};
    const char *specs[RT_MAX_INPUTS] = {argv[5]};
    RtAugment aug;
    RtError err;
    if (rt_augment_parse(&m, specs, &aug, &err)) return fprintf(stderr, "error: %s\n", err.msg), 2;
    size_t bytes = (size_t)(count * in.shape[0] * in.shape[1] * in.shape[2]) * (in.dtype == RT_U8 ? 1 : 4);
    unsigned char *buf = malloc(bytes);
    FILE *f = fopen(argv[8], "rb");
    if (!buf || !f || fread(buf, 1, bytes, f) != bytes) return fprintf(stderr, "cannot read %s\n", argv[8]), 1;
    fclose(f);
    for (int64_t r = 0; r < count && r < 256; r++) idx[r] = atoll(argv[10 + r]);
    void *bufs[1] = {buf};
    if (rt_augment_batch(&aug, &m, strtoull(argv[6], NULL, 10), atoll(argv[7]), idx, count, bufs, &err))
        return fprintf(stderr, "error: %s\n", err.msg), 1;
    f = fopen(argv[9], "wb");
    if (!f || fwrite(buf, 1, bytes, f) != bytes || fclose(f) != 0) return fprintf(stderr, "cannot write\n"), 1;
    free(buf);
    return 0;
}
