/* util.c - arenas, heap helpers and file reading shared by every compiler stage. */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ice_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "netc: internal compiler error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nnetc: this is a bug in netc; please report it with the .net file\n");
    exit(70);
}

static void out_of_memory(size_t size) {
    fprintf(stderr, "netc: out of memory allocating %zu bytes\n", size);
    exit(71);
}

void *xmalloc(size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) out_of_memory(size);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *xrealloc(void *p, size_t size) {
    void *q = realloc(p, size ? size : 1);
    if (!q) out_of_memory(size);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

struct ArenaChunk {
    ArenaChunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

enum { ARENA_CHUNK = 1 << 16 };

void *arena_alloc(Arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    ArenaChunk *c = a->head;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
        c = xmalloc(sizeof(ArenaChunk) + cap);
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    return memset(p, 0, size);
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void arena_free(Arena *a) {
    for (ArenaChunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
}

void vec_push(Vec *v, void *item) {
    if (v->len == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 8;
        v->items = xrealloc(v->items, (size_t)v->cap * sizeof *v->items);
    }
    v->items[v->len++] = item;
}

void vec_free(Vec *v) {
    free(v->items);
    *v = (Vec){0};
}

char *read_file(const char *path, size_t max_bytes, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max_bytes) {
                free(buf);
                fclose(f);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err || len > max_bytes) {
        free(buf);
        errno = err ? EIO : EFBIG;
        return NULL;
    }
    buf[len] = 0;
    if (len_out) *len_out = len;
    return buf;
}

/* ---- string maps */

static uint64_t str_hash(const char *s) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The slot holding key, or the empty slot where it would go; m->cap is a power of two. */
static int strmap_slot(const StrMap *m, const char *key) {
    int i = (int)(str_hash(key) & (uint64_t)(m->cap - 1));
    while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (m->cap - 1);
    return i;
}

void *strmap_get(const StrMap *m, const char *key) {
    if (!m->cap) return NULL;
    int i = strmap_slot(m, key);
    return m->keys[i] ? m->vals[i] : NULL;
}

void strmap_put(Arena *a, StrMap *m, const char *key, void *val) {
    if (2 * (m->len + 1) > m->cap) { /* the arena keeps the old table: the copies sum to < 2x */
        StrMap big = {.cap = m->cap ? 2 * m->cap : 8};
        big.keys = arena_alloc(a, (size_t)big.cap * sizeof *big.keys);
        big.vals = arena_alloc(a, (size_t)big.cap * sizeof *big.vals);
        for (int i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                int j = strmap_slot(&big, m->keys[i]);
                big.keys[j] = m->keys[i], big.vals[j] = m->vals[i], big.len++;
            }
        *m = big;
    }
    int i = strmap_slot(m, key);
    if (!m->keys[i]) m->keys[i] = key, m->len++;
    m->vals[i] = val;
}

/* ---- "did you mean" */

enum { SUGGEST_MAX_LEN = 64 }; /* longer names are not compared */

void suggest_init(Suggest *s, const char *name) {
    size_t len = strlen(name);
    *s = (Suggest){.name = name, .dist = len > 5 ? (int)len / 3 + 1 : 2};
    if ((size_t)s->dist > len) s->dist = (int)len; /* 'y' is no typo of 'x' */
}

/* Edit distance with transpositions ("imgae" is one edit from "image"): the optimal string
 * alignment distance, over three rows of the table; `limit` when the lengths alone exceed it. */
static int edit_distance(const char *a, const char *b, int limit) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > SUGGEST_MAX_LEN || lb > SUGGEST_MAX_LEN) return limit;
    if ((la > lb ? la - lb : lb - la) >= (size_t)limit) return limit;
    int rows[3][SUGGEST_MAX_LEN + 1];
    int *two = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && two[j - 2] + 1 < best)
                best = two[j - 2] + 1;
            cur[j] = best;
        }
        int *t = two;
        two = prev, prev = cur, cur = t;
    }
    return prev[lb];
}

void suggest_try(Suggest *s, const char *candidate) {
    if (strcmp(candidate, s->name) == 0) return;
    int d = edit_distance(s->name, candidate, s->dist);
    if (d < s->dist) s->dist = d, s->best = candidate;
}
