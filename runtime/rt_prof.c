/* rt_prof.c - netc --profile: where a CPU trainer's training step goes.
 *
 * A profiled forward_backward calls rt_prof_start at its start and rt_prof_mark(i) after each
 * piece of its code (one node of the step, or one fused group's loop: the model's prof_sites),
 * so the wall-clock time between two marks is the piece's, OpenMP's parallel regions inside it
 * included. A mark is one clock read (tens of nanoseconds) against pieces of microseconds and
 * more; a trainer built without --profile has no marks at all. The trainer also times each
 * step whole and its optimizer update (rt_prof_step); what is left of a step (waiting for the
 * next batch) is reported as the rest. The first step is left out where there are more: it
 * creates oneDNN's primitives and touches the arena for the first time.
 *
 * The report sums the pieces by operator, and by operator and .net line: a block's line stands
 * for every instance of the block (ResNet-50's 16 bottlenecks), forward and backward apart. A
 * row of products, convolutions or attention's forward also has its speed: the FLOPs of its
 * sites (twice the multiply-adds the compiler counts, ir_node_macs: a direct convolution's, so
 * Winograd's can pass the machine's peak) over their time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netrt.h"
#include "rt_internal.h"

enum { RT_PROF_ROWS = 25 }; /* the rows of the report's second table */

static struct {
    const RtModel *m;
    int runs;        /* forward_backward's runs a step: --accumulate's batches */
    double *site_s;  /* seconds in each site over the steps counted; NULL: not profiling */
    double last;     /* the clock at the last mark */
    double step_s, optimizer_s;
    int64_t steps;
    int first_seen;  /* the first step has run: its times are these, kept apart */
    double *first_site_s, first_step_s, first_optimizer_s;
} prof;

void rt_prof_open(const RtModel *m, int runs) {
    if (!m->n_prof_sites || m->device) return;
    size_t bytes = (size_t)m->n_prof_sites * sizeof *prof.site_s;
    prof.m = m, prof.runs = runs;
    prof.site_s = rt_alloc(bytes, "the profile"); /* zeroed */
    prof.first_site_s = rt_alloc(bytes, "the profile");
}

int rt_prof_on(void) { return prof.site_s != NULL; }

void rt_prof_start(void) {
    if (prof.site_s) prof.last = rt_now();
}

void rt_prof_mark(int site) {
    if (!prof.site_s) return;
    double t = rt_now();
    prof.site_s[site] += t - prof.last;
    prof.last = t;
}

/* The first step's times are moved apart, and reported only when no other step ran. */
void rt_prof_step(double step_s, double optimizer_s) {
    if (!prof.site_s) return;
    if (!prof.first_seen) {
        memcpy(prof.first_site_s, prof.site_s, (size_t)prof.m->n_prof_sites * sizeof *prof.site_s);
        memset(prof.site_s, 0, (size_t)prof.m->n_prof_sites * sizeof *prof.site_s);
        prof.first_seen = 1, prof.first_step_s = step_s, prof.first_optimizer_s = optimizer_s;
        return;
    }
    prof.step_s += step_s, prof.optimizer_s += optimizer_s, prof.steps++;
}

typedef struct {
    const RtProfSite *site; /* the first of the row's sites */
    double s, flops;
    int pieces;
} Row;

static int same_row(const RtProfSite *a, const RtProfSite *b, int by_line) {
    return strcmp(a->what, b->what) == 0 && (!by_line || (a->line == b->line && strcmp(a->file, b->file) == 0));
}

static int slower_first(const void *a, const void *b) {
    double x = ((const Row *)a)->s, y = ((const Row *)b)->s;
    return (x < y) - (x > y);
}

/* The sites summed into rows (by operator, or by operator and line), slowest first. */
static int rows_of(Row *rows, int by_line) {
    int n = 0;
    for (int i = 0; i < prof.m->n_prof_sites; i++) {
        const RtProfSite *s = &prof.m->prof_sites[i];
        int r = 0;
        while (r < n && !same_row(rows[r].site, s, by_line)) r++;
        if (r == n) rows[n++] = (Row){.site = s};
        rows[r].s += prof.site_s[i], rows[r].flops += s->flops, rows[r].pieces++;
    }
    qsort(rows, (size_t)n, sizeof *rows, slower_first);
    return n;
}

static void print_rows(FILE *f, const Row *rows, int n, int shown, int by_line) {
    double per = 1e3 / (double)prof.steps, whole = prof.step_s;
    fprintf(f, "| share of the step | ms a step | GFLOP/s | pieces | %s |\n",
            by_line ? "operator | .net line" : "operator");
    fprintf(f, "|---|---|---|---|%s\n", by_line ? "---|---|" : "---|");
    double rest = 0;
    for (int r = 0; r < n; r++) {
        if (r >= shown) {
            rest += rows[r].s;
            continue;
        }
        fprintf(f, "| %.1f %% | %.3f | ", 100 * rows[r].s / whole, rows[r].s * per);
        if (rows[r].flops > 0 && rows[r].s > 0)
            fprintf(f, "%.1f ", rows[r].flops * (double)(prof.steps * prof.runs) / rows[r].s * 1e-9);
        fprintf(f, "| %d | %s |", rows[r].pieces, rows[r].site->what);
        if (by_line && rows[r].site->line) fprintf(f, " %s:%d |", rows[r].site->file, rows[r].site->line);
        else if (by_line) fprintf(f, " |");
        fputc('\n', f);
    }
    if (n > shown) fprintf(f, "| %.1f %% | %.3f | | | %d more rows |%s\n", 100 * rest / whole, rest * per,
                           n - shown, by_line ? " |" : "");
}

void rt_prof_report(FILE *f, int threads) {
    if (!prof.site_s || !prof.first_seen) return;
    int first_left_out = prof.steps > 0;
    if (!first_left_out) {
        memcpy(prof.site_s, prof.first_site_s, (size_t)prof.m->n_prof_sites * sizeof *prof.site_s);
        prof.step_s = prof.first_step_s, prof.optimizer_s = prof.first_optimizer_s, prof.steps = 1;
    }
    double fb = 0, per = 1e3 / (double)prof.steps, whole = prof.step_s;
    for (int i = 0; i < prof.m->n_prof_sites; i++) fb += prof.site_s[i];
    double rest = whole - fb - prof.optimizer_s;
    fprintf(f, "\nprofile (netc --profile): %lld step%s%s, %.3f ms a step on %d thread%s\n", (long long)prof.steps,
            prof.steps == 1 ? "" : "s", first_left_out ? " after the first" : " (the first included)", whole * per,
            threads, threads == 1 ? "" : "s");
    fprintf(f, "forward and backward %.3f ms (%.1f %%), optimizer %.3f ms (%.1f %%), the rest (waiting for the "
               "next batch) %.3f ms (%.1f %%)\n\n",
            fb * per, 100 * fb / whole, prof.optimizer_s * per, 100 * prof.optimizer_s / whole, rest * per,
            100 * rest / whole);
    Row *rows = rt_alloc((size_t)prof.m->n_prof_sites * sizeof *rows, "the profile");
    int n = rows_of(rows, 0);
    print_rows(f, rows, n, n, 0);
    fprintf(f, "\nBy operator and line (a block's line counts every instance of the block):\n\n");
    n = rows_of(rows, 1);
    print_rows(f, rows, n, RT_PROF_ROWS, 1);
    free(rows);
}
