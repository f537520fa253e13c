/* rt_csv.c - data files of numbers as text: one sample per line, its values separated by commas.
 *
 * Every value is read as a double (strtod: decimal or exponent notation, `nan`, `inf`), so the
 * array is f64 [lines, values per line] and is converted by value to the input's dtype like any
 * other file; rt_dataset_open then gives it the input's per-sample shape when the counts agree.
 * A first line in which no field is a number is a header and is skipped. Every line must hold as
 * many values as the first data line; an empty line, an empty field or a field that is not a
 * number is an error naming the file, the line, the column and what was found.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* The end of the line starting at p (its '\n' or the terminating NUL), a '\r' before it left out. */
static const char *line_end(const char *p, const char **next) {
    const char *e = strchr(p, '\n');
    if (!e) e = p + strlen(p);
    *next = *e ? e + 1 : e;
    if (e > p && e[-1] == '\r') e--;
    return e;
}

/* Parse one field [p, e) as a number; 0 when it is one, with the value. */
static int field_number(const char *p, const char *e, double *v) {
    while (p < e && (*p == ' ' || *p == '\t')) p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (p == e) return -1;
    char *end;
    *v = strtod(p, &end);
    return end == e ? 0 : -1;
}

/* Split the line [p, e) at commas into out (when not NULL); returns the number of fields, or -1
 * with the message when a field is not a number. */
static int64_t parse_line(const RtArray *a, const char *p, const char *e, int64_t line, double *out, int64_t max,
                          RtError *err) {
    int64_t col = 0;
    for (;;) {
        const char *c = memchr(p, ',', (size_t)(e - p));
        const char *fe = c ? c : e;
        double v;
        if (field_number(p, fe, &v))
            return rt_fail(err, "%s, line %lld, column %lld: expected a number, found '%.*s'", a->path,
                           (long long)line, (long long)col + 1, (int)(fe - p > 40 ? 40 : fe - p), p);
        if (out && col < max) out[col] = v;
        col++;
        if (!c) return col;
        p = c + 1;
    }
}

/* 1 when no comma-separated field of the line [p, e) is a number: a header. */
static int is_header(const char *p, const char *e) {
    for (;;) {
        const char *c = memchr(p, ',', (size_t)(e - p));
        double v;
        if (!field_number(p, c ? c : e, &v)) return 0;
        if (!c) return 1;
        p = c + 1;
    }
}

/* Count the data lines (a final newline ends the last line, it does not start another). */
static int64_t count_lines(const char *p) {
    int64_t n = 0;
    for (const char *next; *p; p = next, n++) line_end(p, &next);
    return n;
}

static int parse_rows(RtArray *a, const char *p, int64_t first_line, double *vals, int64_t rows, int64_t cols,
                      RtError *err) {
    for (int64_t r = 0; r < rows; r++) {
        const char *next, *e = line_end(p, &next);
        int64_t line = first_line + r;
        if (e == p) return rt_fail(err, "%s, line %lld: empty line, expected %lld numbers", a->path, (long long)line,
                                   (long long)cols);
        int64_t n = parse_line(a, p, e, line, vals + r * cols, cols, err);
        if (n < 0) return -1;
        if (n != cols)
            return rt_fail(err, "%s, line %lld: %lld value(s), but line %lld has %lld", a->path, (long long)line,
                           (long long)n, (long long)first_line, (long long)cols);
        p = next;
    }
    return 0;
}

int rt_csv_load(const char *path, RtArray *a, RtError *err) {
    char *text = NULL;
    if (rt_read_text(path, &text, err)) return -1;
    const char *p = text, *next, *e = line_end(p, &next);
    a->csv_first_line = 1;
    if (*p && is_header(p, e)) p = next, a->csv_first_line = 2;
    int64_t rows = count_lines(p), cols = 0;
    e = line_end(p, &next);
    if (rows == 0 || e == p) {
        free(text);
        return rt_fail(err, "%s: no samples: %s", path, rows ? "the first data line is empty" : "the file holds no data lines");
    }
    if ((cols = parse_line(a, p, e, a->csv_first_line, NULL, 0, err)) < 0) {
        free(text);
        return -1;
    }
    double *vals = malloc((size_t)rows * (size_t)cols * sizeof *vals);
    int rc = vals ? parse_rows(a, p, a->csv_first_line, vals, rows, cols, err)
                  : rt_fail(err, "%s: out of memory for %lld x %lld values", path, (long long)rows, (long long)cols);
    free(text);
    if (rc) {
        free(vals);
        return -1;
    }
    a->type = RT_FILE_F64, a->rank = 2, a->shape[0] = rows, a->shape[1] = cols, a->sample_elems = cols;
    a->heap = vals, a->data = (const unsigned char *)vals;
    return 0;
}
