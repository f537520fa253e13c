/* util.h - memory arenas, growable arrays, checked arithmetic and the ICE macro.
 *
 * A compilation allocates everything (AST, IR, strings) from one Arena and frees it with
 * one call to arena_free(). Nothing in the compiler frees individual objects.
 */
#ifndef NETC_UTIL_H
#define NETC_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Internal compiler error: a bug in netc, never the user's fault. Never returns. */
#define ICE(...) ice_at(__FILE__, __LINE__, __VA_ARGS__)
_Noreturn void ice_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef struct ArenaChunk ArenaChunk;
typedef struct Arena {
    ArenaChunk *head; /* newest chunk first */
} Arena;

void *arena_alloc(Arena *a, size_t size);           /* zeroed, 16-byte aligned */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);

/* Heap allocation that aborts with a message when memory runs out. */
void *xmalloc(size_t size);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t size);
char *xstrdup(const char *s);

/* A growable array of pointers (heap-backed; free with vec_free). */
typedef struct Vec {
    void **items;
    int len, cap;
} Vec;
void vec_push(Vec *v, void *item);
void vec_free(Vec *v);

/* A string-keyed hash map in an arena (open addressing, doubling at half full): what keeps
 * name lookups in the front end constant-time, so compiling stays linear in the program's size.
 * Keys are not copied; a zeroed StrMap is empty. */
typedef struct StrMap {
    const char **keys;
    void **vals;
    int len, cap;
} StrMap;
void *strmap_get(const StrMap *m, const char *key);   /* NULL when absent */
void strmap_put(Arena *a, StrMap *m, const char *key, void *val); /* insert or replace */

/* "Did you mean": the candidate nearest to a misspelt name by edit distance (insertions,
 * deletions, substitutions), if it is near enough to be a likely typo: one edit for names of up
 * to 5 characters (none for one character), a third of the length for longer ones. Feed every candidate in scope to suggest_try; best stays
 * NULL when none is close. */
typedef struct Suggest {
    const char *name; /* the misspelt name */
    const char *best; /* the nearest candidate so far, or NULL */
    int dist;         /* its distance */
} Suggest;
void suggest_init(Suggest *s, const char *name);
void suggest_try(Suggest *s, const char *candidate);

/* Checked 64-bit arithmetic: return false on overflow. */
static inline bool checked_mul(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool checked_add(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Read a whole file into a NUL-terminated heap buffer; NULL with errno set on failure.
 * Files larger than max_bytes are refused (errno = EFBIG). */
char *read_file(const char *path, size_t max_bytes, size_t *len_out);

#endif
