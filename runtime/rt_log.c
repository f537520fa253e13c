/* rt_log.c - what a trainer shows while it runs: the lines on the standard output, with the
 * progress line a terminal gets between them, and MLPerf's :::MLLOG lines (--mllog).
 *
 * On a terminal the progress line is drawn with a carriage return and no newline, so it can be
 * redrawn in place. A permanent line (a log interval, an evaluation) first blanks it, then is
 * printed whole with its newline; the progress line is drawn again only after that, below it.
 * So every log line stays on the screen, and the run ends on a newline (rt_console_end).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "rt_internal.h"

/* Blank the progress line, if one is on the screen, and leave the cursor at its start. */
static void clear_progress(RtConsole *c) {
    if (!c->shown) return;
    printf("\r%*s\r", c->shown, "");
    c->shown = 0;
}

void rt_console_line(RtConsole *c, const char *fmt, ...) {
    if (c->quiet) return;
    clear_progress(c);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

void rt_console_progress(RtConsole *c, double now, const char *fmt, ...) {
    if (!c->tty || c->quiet || now - c->last < 0.2) return;
    c->last = now;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    clear_progress(c);
    printf("\r%s", line);
    c->shown = n;
    fflush(stdout);
}

void rt_console_end(RtConsole *c) {
    clear_progress(c);
    fflush(stdout);
}

/* ---- MLPerf's log
 *
 * One line per event, as mlperf_logging's mllog writes them: ":::MLLOG " and a JSON object with
 * the keys namespace, time_ms (wall-clock milliseconds since the Unix epoch), event_type
 * (INTERVAL_START, INTERVAL_END or POINT_IN_TIME), key, value and metadata, in that order;
 * metadata holds the file and line that logged the event, then the event's own fields.
 */

static const char *const event_names[] = {"INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"};

void rt_mllog_event(RtMllog *ml, RtMlEvent type, const char *key, const char *value, const char *meta,
                    const char *file, int line) {
    if (!ml->f) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    const char *base = strrchr(file, '/');
    fprintf(ml->f, ":::MLLOG {\"namespace\": \"\", \"time_ms\": %lld, \"event_type\": \"%s\", \"key\": \"%s\", "
                   "\"value\": %s, \"metadata\": {\"file\": \"%s\", \"lineno\": %d%s%s}}\n",
            ms, event_names[type], key, value ? value : "null", base ? base + 1 : file, line, meta ? ", " : "",
            meta ? meta : "");
    if (fflush(ml->f) == 0 && !ferror(ml->f)) return;
    /* A failed write (a full disk) is reported once; the run then stops as after a failed --log. */
    int e = errno ? errno : EIO;
    fprintf(stderr, "error: cannot write the MLPerf log '%s': %s; stopping the run\n", ml->path, strerror(e));
    fclose(ml->f);
    ml->f = NULL, ml->failed = 1;
}

/* A number as JSON: not-finite values are null, as in the JSON Lines log. */
const char *rt_json_num(char *buf, size_t size, double v) {
    if (!isfinite(v)) return "null";
    snprintf(buf, size, "%.8g", v);
    return buf;
}

void rt_mllog_open(RtMllog *ml, FILE *f, const char *path) {
    *ml = (RtMllog){.f = f, .path = path};
    RT_MLLOG(ml, RT_ML_START, "init_start", NULL, NULL);
}

void rt_mllog_run_start(RtMllog *ml, int64_t batch, double base_lr, int64_t samples) {
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)batch);
    RT_MLLOG(ml, RT_ML_POINT, "global_batch_size", num, NULL);
    RT_MLLOG(ml, RT_ML_POINT, "opt_base_learning_rate", rt_json_num(num, sizeof num, base_lr), NULL);
    snprintf(num, sizeof num, "%lld", (long long)samples);
    RT_MLLOG(ml, RT_ML_POINT, "train_samples", num, NULL);
    RT_MLLOG(ml, RT_ML_END, "init_stop", NULL, NULL);
    RT_MLLOG(ml, RT_ML_START, "run_start", NULL, NULL);
}

void rt_mllog_epoch(RtMllog *ml, RtMlEvent type, int64_t epoch) {
    char meta[48];
    snprintf(meta, sizeof meta, "\"epoch_num\": %lld", (long long)epoch);
    RT_MLLOG(ml, type, type == RT_ML_START ? "epoch_start" : "epoch_stop", NULL, meta);
}

int rt_mllog_close(RtMllog *ml, int success) {
    RT_MLLOG(ml, RT_ML_END, "run_stop", NULL, success ? "\"status\": \"success\"" : "\"status\": \"aborted\"");
    if (!ml->f) return ml->failed ? -1 : 0;
    int rc = fclose(ml->f) == 0 ? 0 : -1;
    if (rc) fprintf(stderr, "error: cannot write the MLPerf log '%s': %s\n", ml->path, strerror(errno));
    ml->f = NULL;
    return rc;
}
