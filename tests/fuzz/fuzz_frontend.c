/* fuzz_frontend.c - feeds arbitrary input to the front end: lexer, parser, AST builders,
 * diagnostics, the AST printer and, for every input that parses without errors, semantic
 * analysis (sema_build: evaluation, shape inference, the IR and its verifier) and its warnings
 * (warn_unused) and the removal of unused values (drop_unused). Nothing may crash, hang, trip a
 * sanitizer, or allocate without bound.
 *
 * Built two ways:
 *   - with libFuzzer:  clang -fsanitize=fuzzer,address,undefined ... (LLVMFuzzerTestOneInput);
 *     seed it with models/, tests/fuzz/corpus/ and tests/golden/errors/, and add
 *     -close_fd_mask=2 to silence the compiler's error messages.
 *   - standalone, with -DNETC_FUZZ_MAIN (the ctest build):
 *       fuzz_frontend FILE...                       run each file once
 *       fuzz_frontend --random N [--seed S] [FILE...]
 *     The random mode runs N rounds of three inputs each: random bytes, a "token soup"
 *     (plausible tokens in random order, which gets deep into the grammar) and a mutant of a
 *     valid program (the FILEs, or a built-in seed), which is what reaches sema most often:
 *     lines spliced, duplicated, dropped or swapped, numbers swapped for 0, -1 or huge values.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "passes.h"

static FILE *sink;
static long n_parsed_clean, n_sema_ok; /* how deep the inputs got, for the summary line */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!sink) sink = fopen("/dev/null", "w");
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0; /* parse_string sees the input up to its first NUL */
    Arena arena = {0};
    AstProgram *prog = parse_string(&arena, "fuzz.net", text);
    if (prog && sink) ast_print(prog, sink);
    if (prog && diag_error_count() == 0) {
        n_parsed_clean++;
        IrGraph *g = sema_build(&arena, prog, NULL, 0);
        if (g) {
            n_sema_ok++;
            warn_unused(g); /* its warnings go to stderr with the errors */
            if (sink) ir_print(g, sink);
            drop_unused(g);
        }
    }
    arena_free(&arena);
    diag_reset();
    free(text);
    return 0;
}

#ifdef NETC_FUZZ_MAIN

enum { FUZZ_MAX_INPUT = 1 << 16, FUZZ_MAX_SEEDS = 256 };

static uint64_t rng_state;

static uint32_t rng(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

static size_t random_bytes(char *buf, size_t cap) {
    size_t n = rng() % cap;
    for (size_t i = 0; i < n; i++) buf[i] = (char)(rng() % 256);
    return n;
}

static const char *const soup[] = {
    "model", "const", "input", "block", "return", "for", "in", "if", "else", "train", "and",
    "or", "not", "true", "false", "x", "y", "layer1", "conv2d", "dense", "relu", "f32", "i64",
    "0", "1", "64", "0.5", "1e-3", "2.5e4", "9999999999999999999999", "1e999", "0x1f", "3x",
    "\"str\"", "\"a\\qb\"", "\"open", "(", ")", "[", "]", "{", "}", ",", ":", ";", "=", ".",
    "..", "+", "-", "*", "/", "//", "%", "**", "==", "!=", "<", "<=", ">", ">=", "\n", "\n",
    "\n", "# comment\n", "\t", "$", "@", "\xc3\xa9", "\xff", "\r\n", "k=", "{i}", "layer.0.1",
};

static size_t random_soup(char *buf, size_t cap) {
    size_t n = 0, count = rng() % 200;
    for (size_t i = 0; i < count; i++) {
        const char *t = soup[rng() % (sizeof soup / sizeof *soup)];
        size_t len = strlen(t);
        if (n + len + 2 >= cap) break;
        memcpy(buf + n, t, len);
        n += len;
        if (rng() % 2) buf[n++] = ' ';
    }
    return n;
}

/* ---- mutating valid programs */

/* Used when no seed files are given, so `--random N` alone still reaches sema. */
static const char builtin_seed[] =
    "model seed\n"
    "const batch = 4, n = 2, lr = 0.1\n"
    "input image : f32[batch, 2, 8, 8]\n"
    "input label : i64[batch]\n"
    "block unit(x, c, stride = 1) {\n"
    "  y = relu(conv: conv2d(x, c, k=3, stride=stride, pad=1, dilation=1, groups=2))\n"
    "  if stride != 1 {\n"
    "    x = down: conv2d(x, c, k=1, stride=stride)\n"
    "  } else if c > 100 {\n"
    "    x = x * 2\n"
    "  } else {\n"
    "    x = x + 0\n"
    "  }\n"
    "  return y + x\n"
    "}\n"
    "x = image / 255\n"
    "for i in 0..n {\n"
    "  x = layer.{i}: unit(x, 2)\n"
    "}\n"
    "x = maxpool2d(x, [2, 2], stride=2, pad=1)\n"
    "x = avgpool2d(x, 2)\n"
    "w = w: param([batch, 2, 3], init=\"uniform\", a=0.5)\n"
    "z = matmul(reshape(x, [batch, -1, 2]), w)\n"
    "h = dropout(relu(fc: dense(flatten(z), 16)), p=0.25)\n"
    "logits = out: dense(h, 10, bias=false)\n"
    "train {\n"
    "  loss = cross_entropy(logits, label) + mean(sigmoid(logits)) * 0\n"
    "  metrics = accuracy(logits, label)\n"
    "  optimizer = adamw(lr, betas=[0.9, 0.99], eps=1e-8, weight_decay=0.01)\n"
    "  schedule = step(2, gamma=0.5)\n"
    "  warmup = 1\n"
    "  epochs = 2\n"
    "  eval_every = 1\n"
    "  target_accuracy = 0.9\n"
    "  log_every = 5\n"
    "  freeze = [\"layer.0\"]\n"
    "}\n";

static const char *seeds[FUZZ_MAX_SEEDS];
static int n_seeds;

static const char *const numbers[] = {
    "0", "-1", "1", "2", "3", "-2", "7", "1000", "65536", "1048577", "2147483647", "2147483648",
    "4294967297", "9223372036854775807", "-9223372036854775807", "1099511627776",
    "0.0", "-0.5", "1e300", "1e-300", "0.999999", "[]", "[0]", "[1, 2]", "[-1, -1]", "true",
    "\"s\"", "[[1]]", "n", "batch", "i",
};

/* Lines of `text` as [start, end) pairs into it; returns how many (at most max). */
static int split_lines(const char *text, size_t len, size_t (*lines)[2], int max) {
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len && n < max; i++)
        if (i == len || text[i] == '\n') {
            if (i > start || i < len) {
                lines[n][0] = start;
                lines[n][1] = i < len ? i + 1 : i;
                n++;
            }
            start = i + 1;
        }
    return n;
}

static size_t put(char *buf, size_t n, size_t cap, const char *s, size_t len) {
    if (n + len >= cap) len = cap - n - 1;
    memcpy(buf + n, s, len);
    return n + len;
}

/* One line-level mutation of src into buf: drop, duplicate, swap, or splice a line from
 * another seed. */
static size_t mutate_lines(const char *src, size_t len, char *buf, size_t cap) {
    static size_t lines[512][2], other[512][2];
    int n = split_lines(src, len, lines, 512);
    if (n == 0) return put(buf, 0, cap, src, len);
    const char *o = seeds[rng() % n_seeds];
    int m = split_lines(o, strlen(o), other, 512);
    int kind = rng() % 4, a = rng() % n, b = rng() % n;
    size_t out = 0;
    for (int i = 0; i < n; i++) {
        int j = kind == 2 && i == a ? b : kind == 2 && i == b ? a : i;
        if (kind == 0 && i == a) continue;
        if (kind == 3 && i == a && m) {
            int k = rng() % m;
            out = put(buf, out, cap, o + other[k][0], other[k][1] - other[k][0]);
        }
        out = put(buf, out, cap, src + lines[j][0], lines[j][1] - lines[j][0]);
        if (kind == 1 && i == a) out = put(buf, out, cap, src + lines[j][0], lines[j][1] - lines[j][0]);
    }
    return out;
}

/* Replace one number (a run of digits) in src with an interesting value. */
static size_t mutate_number(const char *src, size_t len, char *buf, size_t cap) {
    size_t starts[1024];
    int n = 0;
    for (size_t i = 0; i < len && n < 1024; i++)
        if (src[i] >= '0' && src[i] <= '9' && (i == 0 || !strchr("0123456789._eE", src[i - 1]) ||
                                               (src[i - 1] == '.' && i > 1 && src[i - 2] == '.')))
            if (i == 0 || !((src[i - 1] >= 'a' && src[i - 1] <= 'z') || (src[i - 1] >= 'A' && src[i - 1] <= 'Z')))
                starts[n++] = i;
    if (n == 0) return put(buf, 0, cap, src, len);
    size_t s = starts[rng() % n], e = s;
    while (e < len && strchr("0123456789.eE", src[e]) && !(src[e] == '.' && e + 1 < len && src[e + 1] == '.'))
        e++;
    const char *num = numbers[rng() % (sizeof numbers / sizeof *numbers)];
    size_t out = put(buf, 0, cap, src, s);
    out = put(buf, out, cap, num, strlen(num));
    return put(buf, out, cap, src + e, len - e);
}

/* Insert a token from the soup at a random position. */
static size_t mutate_token(const char *src, size_t len, char *buf, size_t cap) {
    size_t at = len ? rng() % len : 0;
    const char *t = soup[rng() % (sizeof soup / sizeof *soup)];
    size_t out = put(buf, 0, cap, src, at);
    out = put(buf, out, cap, t, strlen(t));
    return put(buf, out, cap, src + at, len - at);
}

static size_t random_mutant(char *buf, size_t cap) {
    static char tmp[FUZZ_MAX_INPUT];
    const char *src = seeds[rng() % n_seeds];
    size_t len = put(buf, 0, cap, src, strlen(src));
    int rounds = 1 + rng() % 4;
    for (int r = 0; r < rounds; r++) {
        memcpy(tmp, buf, len);
        unsigned kind = rng() % 8;
        if (kind < 4) len = mutate_number(tmp, len, buf, cap);
        else if (kind < 7) len = mutate_lines(tmp, len, buf, cap);
        else len = mutate_token(tmp, len, buf, cap);
    }
    return len;
}

/* ---- the driver */

static const char *last_path; /* FUZZ_LAST=FILE: each input is written there before it runs */

static void run_one(const char *buf, size_t n) {
    if (last_path) {
        FILE *f = fopen(last_path, "wb");
        if (f) {
            fwrite(buf, 1, n, f);
            fclose(f);
        }
    }
    LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
}

static char *load(const char *path) {
    size_t len = 0;
    char *text = read_file(path, FUZZ_MAX_INPUT - 1, &len);
    if (!text) {
        fprintf(stdout, "fuzz_frontend: cannot read %s\n", path);
        exit(2);
    }
    return text;
}

static int usage(void) {
    fprintf(stdout, "usage: fuzz_frontend FILE...\n"
                    "       fuzz_frontend --random N [--seed S] [FILE...]\n");
    return 2;
}

int main(int argc, char **argv) {
    long iters = -1;
    rng_state = 1;
    char **files = xcalloc((size_t)argc, sizeof *files);
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--random") == 0 && i + 1 < argc) iters = atol(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) rng_state = strtoull(argv[++i], NULL, 10);
        else if (argv[i][0] == '-') return usage();
        else files[n_files++] = argv[i];
    }
    if (iters < 0 && n_files == 0) return usage();
    last_path = getenv("FUZZ_LAST");
    /* the compiler's messages are noise here; FUZZ_VERBOSE=1 keeps them for debugging */
    if (!getenv("FUZZ_VERBOSE") && !freopen("/dev/null", "w", stderr)) return 1;
    char **texts = xcalloc((size_t)n_files + 1, sizeof *texts);
    for (int i = 0; i < n_files; i++) {
        size_t len;
        texts[i] = load(files[i]);
        len = strlen(texts[i]);
        if (iters < 0) LLVMFuzzerTestOneInput((const uint8_t *)texts[i], len);
        else if (n_seeds < FUZZ_MAX_SEEDS) seeds[n_seeds++] = texts[i];
    }
    if (iters < 0) {
        printf("fuzz_frontend: %d files: %ld parsed cleanly, %ld passed sema\n", n_files,
               n_parsed_clean, n_sema_ok);
    } else {
        if (n_seeds == 0) seeds[n_seeds++] = builtin_seed;
        static char buf[FUZZ_MAX_INPUT];
        for (long i = 0; i < iters; i++) {
            run_one(buf, random_bytes(buf, 8192));
            run_one(buf, random_soup(buf, 8192));
            run_one(buf, random_mutant(buf, sizeof buf));
        }
        printf("fuzz_frontend: %ld rounds (random bytes, token soups, mutants of %d seeds): "
               "%ld parsed cleanly, %ld passed sema\n", iters, n_seeds, n_parsed_clean, n_sema_ok);
    }
    for (int i = 0; i < n_files; i++) free(texts[i]);
    free(texts);
    free(files);
    if (sink) fclose(sink);
    return 0;
}

#endif
