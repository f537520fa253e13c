/* diag.h - compiler diagnostics: `file:line:col: error: message`, the source line, a caret,
 * and an optional hint, in the style of chibicc's verror_at.
 *
 * Sources are registered once (diag_add_source) so every later stage can point into them by
 * SrcLoc alone. Errors are counted; after DIAG_MAX_ERRORS the compiler stops with a note.
 */
#ifndef NETC_DIAG_H
#define NETC_DIAG_H

#include <stdbool.h>

typedef struct SrcLoc {
    const char *file; /* path as given on the command line; NULL = no location */
    int line, col;    /* 1-based; col counts bytes */
} SrcLoc;

enum { DIAG_MAX_ERRORS = 20 };

/* Register a source text under its path so carets can show the line. `text` must outlive
 * the compilation. Returns the interned path pointer to put in SrcLoc.file. */
const char *diag_add_source(const char *path, const char *text);

/* `file:line:col: error: <msg>` + source line + caret. Counts an error. */
void diag_error(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `file:line:col: warning: <msg>` + source line + caret: something legal that is likely a
 * mistake. Not counted: the compilation goes on and succeeds. Notes and hints after it follow
 * it (and are dropped with it under diag_set_warnings(false): netc -w). */
void diag_warning(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void diag_set_warnings(bool on);
/* `file:line:col: note: <msg>` + source line + caret; no count. */
void diag_note(SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* `  hint: <msg>` attached to the previous error or warning. */
void diag_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* `netc: error: <msg>` for errors with no source location (bad flags, missing file). */
void diag_fatal_noloc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

int diag_error_count(void);
/* True once DIAG_MAX_ERRORS is reached; callers stop producing more work. */
bool diag_too_many(void);
/* Forget sources and counts (tests and fuzzers compile many inputs in one process). */
void diag_reset(void);

#endif
