/* diag.c - error messages with the source line and a caret under the column:
 *
 *     models/bad.net:7:25: error: expected ')' but found newline
 *         x = relu(dense(x, 3)
 *                             ^
 *       hint: every '(' needs a matching ')'
 *
 * The echoed line has its tabs expanded (tab stops every 8 columns) and the caret is placed
 * with the same rule; UTF-8 continuation bytes take no column. Very long lines are shown as a
 * window around the caret. No colours, so golden tests stay byte-stable. Everything goes to
 * stderr.
 */
#include "diag.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum {
    TAB_STOP = 8,
    ECHO_MAX = 200, /* bytes of a source line shown around the caret */
};

typedef struct Source {
    char *path;
    const char *text;
} Source;

static Source *sources;
static int n_sources, cap_sources;
static int n_errors;
static bool last_shown = true; /* was the last error printed (hints and notes follow it) */
static bool said_stopping;
static bool warnings_off;

const char *diag_add_source(const char *path, const char *text) {
    for (int i = 0; i < n_sources; i++) {
        if (strcmp(sources[i].path, path) == 0) {
            sources[i].text = text; /* the same file parsed again (tests, fuzzers) */
            return sources[i].path;
        }
    }
    if (n_sources == cap_sources) {
        cap_sources = cap_sources ? 2 * cap_sources : 4;
        sources = xrealloc(sources, (size_t)cap_sources * sizeof *sources);
    }
    sources[n_sources] = (Source){xstrdup(path), text};
    return sources[n_sources++].path;
}

static const char *source_text(const char *file) {
    for (int i = 0; i < n_sources; i++)
        if (sources[i].path == file || strcmp(sources[i].path, file) == 0) return sources[i].text;
    return NULL;
}

/* Columns a byte takes on screen, given the column it starts at. */
static int cell_width(unsigned char c, int col) {
    if (c == '\t') return TAB_STOP - col % TAB_STOP;
    if (c >= 0x80 && c < 0xC0) return 0; /* UTF-8 continuation */
    return 1;
}

static void echo_bytes(const char *p, const char *end, int *col) {
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        int w = cell_width(c, *col);
        if (c == '\t') fprintf(stderr, "%*s", w, "");
        else fputc(c < ' ' || c == 127 ? '?' : c, stderr);
        *col += w;
    }
}

/* The source line of loc and a caret under its column. */
static void echo_line(SrcLoc loc) {
    const char *text = loc.file ? source_text(loc.file) : NULL;
    if (!text || loc.line < 1) return;
    const char *p = text;
    for (int line = 1; line < loc.line; line++) {
        p = strchr(p, '\n');
        if (!p) return;
        p++;
    }
    const char *end = strchr(p, '\n');
    if (!end) end = p + strlen(p);
    if (end > p && end[-1] == '\r') end--;
    long at = loc.col - 1;
    if (at < 0) at = 0;
    if (at > end - p) at = end - p;
    const char *from = p, *to = end;
    if (to - from > ECHO_MAX) {
        from = p + (at > ECHO_MAX / 2 ? at - ECHO_MAX / 2 : 0);
        if (to - from > ECHO_MAX) to = from + ECHO_MAX;
    }
    int col = 0;
    if (from > p) col += fprintf(stderr, "...");
    echo_bytes(from, to, &col);
    fprintf(stderr, "%s\n", to < end ? "..." : "");
    int caret = from > p ? 3 : 0;
    for (const char *q = from; q < p + at; q++) caret += cell_width((unsigned char)*q, caret);
    fprintf(stderr, "%*s^\n", caret, "");
}

static void report(SrcLoc loc, const char *kind, const char *fmt, va_list ap) {
    if (!loc.file) fprintf(stderr, "netc: %s: ", kind);
    else if (loc.line < 1) fprintf(stderr, "%s: %s: ", loc.file, kind);
    else fprintf(stderr, "%s:%d:%d: %s: ", loc.file, loc.line, loc.col, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    echo_line(loc);
}

/* Counts an error; false once the limit is reached (the error is then not shown). */
static bool count_error(void) {
    if (diag_too_many()) {
        last_shown = false;
        return false;
    }
    n_errors++;
    last_shown = true;
    return true;
}

void diag_error(SrcLoc loc, const char *fmt, ...) {
    if (!count_error()) return;
    va_list ap;
    va_start(ap, fmt);
    report(loc, "error", fmt, ap);
    va_end(ap);
}

void diag_warning(SrcLoc loc, const char *fmt, ...) {
    last_shown = !warnings_off;
    if (warnings_off) return;
    va_list ap;
    va_start(ap, fmt);
    report(loc, "warning", fmt, ap);
    va_end(ap);
}

void diag_set_warnings(bool on) { warnings_off = !on; }

void diag_note(SrcLoc loc, const char *fmt, ...) {
    if (!last_shown) return;
    va_list ap;
    va_start(ap, fmt);
    report(loc, "note", fmt, ap);
    va_end(ap);
}

void diag_hint(const char *fmt, ...) {
    if (!last_shown) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("  hint: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void diag_fatal_noloc(const char *fmt, ...) {
    if (!count_error()) return;
    va_list ap;
    va_start(ap, fmt);
    report((SrcLoc){0}, "error", fmt, ap);
    va_end(ap);
}

int diag_error_count(void) { return n_errors; }

/* Says once that the compiler stops, the first time anyone asks after the limit is hit. */
bool diag_too_many(void) {
    if (n_errors < DIAG_MAX_ERRORS) return false;
    if (!said_stopping) {
        fprintf(stderr, "netc: too many errors, stopping\n");
        said_stopping = true;
    }
    return true;
}

void diag_reset(void) {
    for (int i = 0; i < n_sources; i++) free(sources[i].path);
    free(sources);
    sources = NULL;
    n_sources = cap_sources = 0;
    n_errors = 0;
    last_shown = true;
    said_stopping = false;
    warnings_off = false;
}
