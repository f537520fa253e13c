/* fuzz_frontend.c - feeds arbitrary input to the front end (lexer, parser, AST builders,
 * diagnostics and the AST printer). Nothing may crash, hang, or allocate without bound.
 *
 * Built two ways:
 *   - with libFuzzer:  clang -fsanitize=fuzzer,address,undefined ... (LLVMFuzzerTestOneInput);
 *     add -close_fd_mask=2 to silence the compiler's error messages.
 *   - standalone, with -DNETC_FUZZ_MAIN: `fuzz_frontend [N] [SEED]` parses N random byte
 *     strings and N random "token soups" (plausible tokens in random order, which get much
 *     deeper into the grammar than random bytes do). Run it under -fsanitize=address,undefined.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ast.h"

static FILE *sink;

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
    arena_free(&arena);
    diag_reset();
    free(text);
    return 0;
}

#ifdef NETC_FUZZ_MAIN

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

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    if (!freopen("/dev/null", "w", stderr)) return 1;
    static char buf[8192];
    for (int i = 0; i < iters; i++) {
        size_t n = random_bytes(buf, sizeof buf);
        LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
        n = random_soup(buf, sizeof buf);
        LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
    }
    printf("fuzz_frontend: %d random inputs and %d token soups parsed\n", iters, iters);
    return 0;
}

#endif
