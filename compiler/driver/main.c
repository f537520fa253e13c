/* main.c - the netc driver: command line, the pipeline, and building the trainer.
 *
 *   netc FILE.net [-o OUT] [-D NAME=VALUE]... [--emit-dir DIR] [--dump=STAGE] ...
 *
 * compile() is the whole pipeline in one place, with the verifier between the passes. The
 * --backend names a target (toolchain.h): its codegen half steers the passes and writes the
 * sources, its toolchain half finds its libraries, compiles its kernels and gives the link line,
 * so this file names no target. The generated C is compiled by the system C compiler, started
 * with an argument vector (never a shell) in a process group of its own, and linked into netc's
 * private temporary directory; the trainer and the --emit-dir sources then appear atomically
 * through rt_out (runtime/rt_file.c), which replaces only regular files. Before any work the outputs are checked against
 * the inputs (the .net source, netc itself). SIGINT, SIGTERM and SIGHUP stop the C compiler,
 * remove the temporary directory and any half-written output, and end netc by the same signal.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "frontend.h"
#include "codegen.h"
#include "diag.h"
#include "ir.h"
#include "nvrtc.h"
#include "passes.h"
#include "rt_file.h"
#include "toolchain.h"

extern char **environ;

#ifndef NETC_VERSION
#define NETC_VERSION "0.1.0"
#endif

enum { MAX_DEFINES = 256 };

/* The dot stages draw the graph as fused (the forward pass, or the whole step) for Graphviz. */
typedef enum { DUMP_NONE, DUMP_AST, DUMP_IR, DUMP_GRAD, DUMP_LAYOUT, DUMP_FUSED, DUMP_DOT, DUMP_DOT_STEP, DUMP_MEMPLAN,
               DUMP_C, DUMP_CU } DumpStage;

static const char *const dump_names[] = {
    [DUMP_NONE] = "", [DUMP_AST] = "ast", [DUMP_IR] = "ir", [DUMP_GRAD] = "grad", [DUMP_LAYOUT] = "layout",
    [DUMP_FUSED] = "fused", [DUMP_DOT] = "dot", [DUMP_DOT_STEP] = "dot-step", [DUMP_MEMPLAN] = "memplan",
    [DUMP_C] = "c", [DUMP_CU] = "cu",
};

typedef struct Options {
    const char *input;
    const char *output;   /* trainer executable; NULL = derived from the input name */
    const char *emit_dir; /* keep the generated C here */
    const char *backend;
    const char *cc;
    const char *runtime_dir;
    const char *opt_level;
    DumpStage dump;
    int check_only; /* --check: stop after semantic analysis */
    int no_fuse;    /* --no-fuse: every element-wise node its own loop */
    int no_remat;   /* --no-remat: keep every activation the backward pass reads */
    int all_rows;   /* --all-rows: the classifier's backward products over every row */
    int copy_views; /* --copy-views: permutes, slices and concatenations copy, none read in place */
    int row_major;  /* --layout=row-major: no channels-last tensors */
    int report;     /* --report: print the fusion report and stop */
    int summary;    /* --summary: print the table of layers and stop */
    int sms[NVRTC_MAX_ARCHS]; /* --arch: the GPU architectures to compile kernels for (90 = sm_90) */
    int n_sms;
    CgPrecision precision; /* --precision: the arithmetic of products and convolutions */
    int frozen_half; /* --frozen-half: frozen weights that only products read kept in their half type */
    int werror;     /* --werror: the trainer's C compiled with -Werror (CI) */
    int system_malloc; /* --system-malloc: a CPU trainer allocates with the C library's malloc */
    int profile;     /* --profile: a CPU trainer that reports where its step's time goes */
    const char *cpu; /* --cpu as given, or NULL */
    int cpu_level;   /* --cpu: the x86-64 level of a CPU trainer, 1, 3 or 4; 0: this machine's */
    int print_toolchain; /* --print-toolchain: say where the trainer's tools are, and stop */
    int distributed;     /* --distributed: a trainer of several ranks (mpirun), gradients summed over them */
    int64_t bucket_kib;  /* --bucket-kib: the size its gradient buckets are cut at */
    int sync_bn;         /* --sync-bn: batch norm's statistics over every rank's batch */
    int shard_optimizer; /* --shard-optimizer: ZeRO-1, the optimizer state split between the ranks */
    SemaDefine defs[MAX_DEFINES];
    int n_defs;
} Options;

static void usage(FILE *out) {
    fprintf(out,
            "usage: netc FILE.net [options]\n"
            "\n"
            "Compile a .net model into a standalone training executable.\n"
            "\n"
            "options:\n"
            "  -o FILE              the trainer to write (default: FILE.net without .net)\n"
            "  -D NAME=VALUE        override the model constant NAME (repeatable)\n"
            "  --emit-dir DIR       keep the generated C source in DIR (created with its parents)\n"
            "  --dump=STAGE         print a stage to stdout and stop: ast, ir, grad, layout, fused, memplan, c,\n"
            "                       cu (the CUDA kernels of --backend cuda); dot draws the network for Graphviz\n"
            "                       (dot -Tsvg), dot-step the whole training step\n"
            "  --report             print the fusion report (groups, layouts, kernels, traffic, memory) and stop\n"
            "  --summary            print each layer's output shape, parameters and mult-adds, and the totals\n"
            "  --no-fuse            do not fuse element-wise operators (one loop per operator), and copy\n"
            "                       attention's heads as written\n"
            "  --no-remat           keep SiLU, GELU, dropout and norm values for the backward pass instead of\n"
            "                       computing them again there\n"
            "  --copy-views         copy every permute, slice and concatenation instead of letting the\n"
            "                       element-wise loops that read them read their operands in place\n"
            "  --all-rows           cpu: run the classifier's backward products over every row, also those whose\n"
            "                       label is the cross-entropy's ignore_index (their gradient is zero)\n"
            "  --layout=LAYOUT      activations of convolution chains: channels-last (default) or row-major\n"
            "  --check              check the model (parse and analyse) and stop\n"
            "  -w                   no warnings (values never used, inputs never read, layers without a gradient)\n"
            "  --backend NAME       code generator: cpu (default) or cuda\n"
            "  --arch LIST          cuda: GPU architectures to compile kernels for, e.g. sm_80,sm_90,sm_100\n"
            "                       (default: sm_90); PTX of the lowest is embedded too\n"
            "  --precision P        cuda: fp32 (default; no TF32), tf32, bf16 (products and convolutions in\n"
            "                       bf16 with float32 master weights) or fp16 (the same in fp16, with a\n"
            "                       dynamic loss scale on the device)\n"
            "  --frozen-half        cuda, with --precision bf16 or fp16: keep each frozen weight that only matrix\n"
            "                       products and convolutions read (LoRA's base, a frozen backbone) in that type on\n"
            "                       the device, half its float32 memory; weight files keep the float32 values\n"
            "  -O LEVEL, -OLEVEL    C compiler optimisation level for the trainer: 0, 1, 2, 3 or s (default: 2)\n"
            "  --cc CC              C compiler to build the trainer (default: $CC or the one netc was built with)\n"
            "  --runtime-dir DIR    where netrt.h and libnetrt.a live (default: $NETC_RUNTIME_DIR, runtime/ beside\n"
            "                       netc, or the build tree)\n"
            "  --distributed        a data-parallel trainer: one process per rank under mpirun or srun, each step's\n"
            "                       gradients summed over the ranks (MPI; with --backend cuda, NCCL inside the\n"
            "                       step's CUDA Graph; docs/distributed.md)\n"
            "  --bucket-kib N       --distributed: cut the gradients into buckets of N KiB, each summed as soon as\n"
            "                       the backward pass has written it (default: 25600, 25 MiB)\n"
            "  --sync-bn            --distributed: batch norm normalises with the statistics of the global batch,\n"
            "                       summed over the ranks (default: each rank's own batch, as PyTorch DDP; CPU)\n"
            "  --shard-optimizer    --distributed: each rank keeps the optimizer state of its share of the\n"
            "                       parameters and updates them alone (ZeRO-1); the others gather them\n"
            "  --cpu LEVEL          cpu: the x86-64 level to compile the trainer for: x86-64 (every 64-bit x86\n"
            "                       CPU), x86-64-v3 (AVX2, FMA), x86-64-v4 (AVX-512) or host (default: the\n"
            "                       highest this machine runs); every level computes the same values\n"
            "  --system-malloc      cpu: the trainer allocates with the C library's malloc, not the jemalloc\n"
            "                       netc links when it was built with it (one shared library fewer to deploy)\n"
            "  --profile            cpu: the trainer times each piece of its step and prints, after training,\n"
            "                       where the time went by operator and by .net line (docs/trainer.md)\n"
            "  --werror             compile the trainer's C with -Werror (for CI)\n"
            "  --print-toolchain    print the compiler, runtime and libraries a trainer would use, and stop\n"
            "                       (exit 1 if one that --backend needs is missing)\n"
            "  --version            print the version\n"
            "  -h, --help           this text\n");
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "netc: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nnetc: run 'netc --help' for the options\n");
    return 2;
}

static int parse_define(Options *o, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) return usage_error("-D needs NAME=VALUE, found '%s'", arg);
    if (o->n_defs == MAX_DEFINES) return usage_error("too many -D options (the limit is 256)%s", "");
    for (int i = 0; i < o->n_defs; i++)
        if (strncmp(o->defs[i].name, arg, (size_t)(eq - arg)) == 0 &&
            o->defs[i].name[eq - arg] == 0)
            return usage_error("-D %s given twice", o->defs[i].name);
    o->defs[o->n_defs++] = (SemaDefine){.name = strndup(arg, (size_t)(eq - arg)), .value = eq + 1};
    return 0;
}

static int parse_dump(Options *o, const char *stage) {
    for (int i = 1; i < (int)(sizeof dump_names / sizeof *dump_names); i++)
        if (strcmp(stage, dump_names[i]) == 0) {
            o->dump = (DumpStage)i;
            return 0;
        }
    return usage_error("unknown stage '%s' for --dump (ast, ir, grad, layout, fused, dot, dot-step, memplan, c, cu)",
                       stage);
}

/* The value of an option written `--opt VALUE` or `--opt=VALUE`; NULL if this arg is not it. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *err) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != 0) return NULL;
    if (*i + 1 >= argc) {
        *err = usage_error("%s needs a value", name);
        return NULL;
    }
    return argv[++*i];
}

/* --arch sm_80,sm_90 */
static int parse_archs(Options *o, const char *list) {
    o->n_sms = 0;
    for (const char *p = list;;) {
        int sm, len = 0;
        if (sscanf(p, "sm_%3d%n", &sm, &len) != 1 || (p[len] && p[len] != ',') || sm < 75)
            return usage_error("--arch takes a comma-separated list like sm_80,sm_90,sm_100 (sm_75 or newer), found "
                               "'%s'", list);
        if (o->n_sms == NVRTC_MAX_ARCHS) return usage_error("--arch: at most 8 architectures, found '%s'", list);
        for (int i = 0; i < o->n_sms; i++)
            if (o->sms[i] == sm) return usage_error("--arch names an architecture twice: '%s'", list);
        o->sms[o->n_sms++] = sm;
        p += len;
        if (!*p) return 0;
        p++;
    }
}

/* --cpu x86-64|x86-64-v3|x86-64-v4|host */
static int parse_cpu(Options *o, const char *v) {
    static const struct { const char *name; int level; } levels[] = {
        {"host", 0}, {"x86-64", 1}, {"x86-64-v3", 3}, {"x86-64-v4", 4}};
    for (size_t i = 0; i < sizeof levels / sizeof *levels; i++)
        if (strcmp(v, levels[i].name) == 0) return o->cpu = v, o->cpu_level = levels[i].level, 0;
    return usage_error("--cpu takes x86-64, x86-64-v3, x86-64-v4 or host, found '%s'", v);
}

/* --precision fp32|tf32|bf16|fp16 */
static int parse_precision(Options *o, const char *v) {
    static const char *const names[] = {[CG_FP32] = "fp32", [CG_TF32] = "tf32", [CG_BF16] = "bf16", [CG_FP16] = "fp16"};
    for (int p = 0; p < (int)(sizeof names / sizeof *names); p++)
        if (strcmp(v, names[p]) == 0) {
            o->precision = (CgPrecision)p;
            return 0;
        }
    return usage_error("--precision takes fp32, tf32, bf16 or fp16, found '%s'", v);
}

/* The targets with a property, as `--backend A, --backend B` (prefix before each name). */
static const char *target_names(char *buf, size_t size, const char *prefix, int (*has)(const CgBackend *, unsigned),
                                unsigned arg) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; targets[i]; i++)
        if (!has || has(targets[i]->cg, arg))
            n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s%s", n ? ", " : "", prefix, targets[i]->cg->name);
    return buf;
}

static int computes_in(const CgBackend *cg, unsigned precision) { return (cg->precisions >> precision) & 1; }
static int has_kernels(const CgBackend *cg, unsigned unused) { return (void)unused, cg->has_kernels; }

/* --precision other than fp32 only for a target that implements it. An unknown --backend is
 * reported later (compile); until then the default target's note stands for it. */
static int check_precision(const Options *o) {
    const Target *tg = target_named(o->backend);
    const CgBackend *cg = tg ? tg->cg : targets[0]->cg;
    if (o->precision == CG_FP32 || (tg && computes_in(cg, o->precision))) return 0;
    char names[256], msg[512];
    target_names(names, sizeof names, "--backend ", computes_in, o->precision);
    snprintf(msg, sizeof msg, "--precision is an option of %s (%s)", names, cg->precision_note);
    return usage_error("%s", msg);
}

static int parse_args(int argc, char **argv, Options *o) {
    *o = (Options){.backend = "cpu", .opt_level = "2", .sms = {90}, .n_sms = 1, .bucket_kib = 25600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int err = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("netc %s\n", NETC_VERSION);
            exit(0);
        } else if (strcmp(a, "--check") == 0) {
            o->check_only = 1;
        } else if (strcmp(a, "--no-fuse") == 0) {
            o->no_fuse = 1;
        } else if (strcmp(a, "--no-remat") == 0) {
            o->no_remat = 1;
        } else if (strcmp(a, "--copy-views") == 0) {
            o->copy_views = 1;
        } else if (strcmp(a, "--all-rows") == 0) {
            o->all_rows = 1;
        } else if (strcmp(a, "--werror") == 0) {
            o->werror = 1;
        } else if (strcmp(a, "-w") == 0) {
            diag_set_warnings(false);
        } else if (strcmp(a, "--system-malloc") == 0) {
            o->system_malloc = 1;
        } else if (strcmp(a, "--print-toolchain") == 0) {
            o->print_toolchain = 1;
        } else if (strcmp(a, "--report") == 0) {
            o->report = 1;
        } else if (strcmp(a, "--summary") == 0) {
            o->summary = 1;
        } else if (strcmp(a, "--distributed") == 0) {
            o->distributed = 1;
        } else if (strcmp(a, "--sync-bn") == 0) {
            o->sync_bn = 1;
        } else if (strcmp(a, "--shard-optimizer") == 0) {
            o->shard_optimizer = 1;
        } else if (strcmp(a, "--frozen-half") == 0) {
            o->frozen_half = 1;
        } else if (strcmp(a, "--profile") == 0) {
            o->profile = 1;
        } else if ((v = opt_value(argc, argv, &i, "--bucket-kib", &err))) {
            char *end;
            long long kib = strtoll(v, &end, 10);
            if (*end || end == v || kib < 1 || kib > (1ll << 30))
                return usage_error("--bucket-kib takes a whole number of KiB from 1 to 1073741824, found '%s'", v);
            o->bucket_kib = kib;
        } else if ((v = opt_value(argc, argv, &i, "-o", &err))) {
            o->output = v;
        } else if (strncmp(a, "-D", 2) == 0) {
            const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : "");
            if ((err = parse_define(o, d))) return err;
        } else if (strncmp(a, "-O", 2) == 0) { /* -O2, or -O 2 as the docs write it */
            if (!a[2] && i + 1 == argc) return usage_error("-O needs a level: 0, 1, 2, 3 or s%s", "");
            o->opt_level = a[2] ? a + 2 : argv[++i];
        } else if ((v = opt_value(argc, argv, &i, "--emit-dir", &err))) {
            o->emit_dir = v;
        } else if ((v = opt_value(argc, argv, &i, "--dump", &err))) {
            if ((err = parse_dump(o, v))) return err;
        } else if ((v = opt_value(argc, argv, &i, "--layout", &err))) {
            if (strcmp(v, "channels-last") && strcmp(v, "row-major"))
                return usage_error("--layout takes channels-last or row-major, found '%s'", v);
            o->row_major = strcmp(v, "row-major") == 0;
        } else if ((v = opt_value(argc, argv, &i, "--backend", &err))) {
            o->backend = v;
        } else if ((v = opt_value(argc, argv, &i, "--arch", &err))) {
            if ((err = parse_archs(o, v))) return err;
        } else if ((v = opt_value(argc, argv, &i, "--precision", &err))) {
            if ((err = parse_precision(o, v))) return err;
        } else if ((v = opt_value(argc, argv, &i, "--cpu", &err))) {
            if ((err = parse_cpu(o, v))) return err;
        } else if ((v = opt_value(argc, argv, &i, "--cc", &err))) {
            o->cc = v;
        } else if ((v = opt_value(argc, argv, &i, "--runtime-dir", &err))) {
            o->runtime_dir = v;
        } else if (err) {
            return err;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (o->input) {
            return usage_error("more than one input file (already have '%s')", o->input);
        } else {
            o->input = a;
        }
        if (err) return err;
    }
    if (!o->input && !o->print_toolchain) return usage_error("no input file%s", "");
    int err = check_precision(o);
    if (err) return err;
#ifndef NETC_HAVE_MPI
    if (o->distributed)
        return usage_error("--distributed: this netc was built without MPI%s; install an MPI library (Debian: "
                           "libopenmpi-dev) and rebuild netc (scripts/setup.sh)", "");
#endif
    if (o->sync_bn && !o->distributed)
        return usage_error("--sync-bn sums batch norm's statistics over the ranks of a distributed trainer; give "
                           "--distributed too%s", "");
    if (o->shard_optimizer && !o->distributed)
        return usage_error("--shard-optimizer splits the optimizer state between the ranks of a distributed "
                           "trainer; give --distributed too%s", "");
    if (o->frozen_half && o->precision != CG_BF16 && o->precision != CG_FP16)
        return usage_error("--frozen-half keeps frozen weights in the type the products compute in; give "
                           "--backend cuda --precision bf16 (or fp16) too%s", "");
    if (o->profile && strcmp(o->backend, "cpu"))
        return usage_error("--profile times the pieces of a CPU trainer's step; a %s trainer's step is one "
                           "CUDA Graph: profile it with Nsight Systems (nsys profile ./trainer ...)", o->backend);
    if (o->cpu && strcmp(o->backend, "cpu"))
        return usage_error("--cpu %s: an option of --backend cpu; a GPU trainer's host code is compiled for plain "
                           "x86-64", o->cpu);
    if (strcmp(o->opt_level, "0") && strcmp(o->opt_level, "1") && strcmp(o->opt_level, "2") &&
        strcmp(o->opt_level, "3") && strcmp(o->opt_level, "s"))
        return usage_error("-O takes 0, 1, 2, 3 or s, found '%s'", o->opt_level);
    return 0;
}

/* The default trainer name: the input's file name without its directory and `.net`. */
static char *default_output(const char *input) {
    const char *base = strrchr(input, '/');
    base = base ? base + 1 : input;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".net") == 0) n -= 4;
    return strndup(base, n);
}

/* ---- the private temporary directory, the C compiler, and signals */

enum { WORK_C, WORK_CU, WORK_IMAGES, WORK_EXE, N_WORK }; /* the files netc may create in it */

static char work_dir[3072];              /* "" when there is none; short enough for any name in it */
static char work_files[N_WORK][4096];    /* removed with the directory */
static volatile sig_atomic_t work_ready; /* work_dir and work_files are complete */
static volatile pid_t compiler_group;    /* the running C compiler's process group, 0 when none */

/* Async-signal-safe: only unlink and rmdir of names netc made. */
static void remove_work_dir(void) {
    if (!work_ready) return;
    for (int i = 0; i < N_WORK; i++) unlink(work_files[i]);
    rmdir(work_dir);
    work_ready = 0;
}

static void on_signal(int sig) {
    if (compiler_group > 0) kill(-compiler_group, SIGTERM);
    rt_out_abandon();
    remove_work_dir();
    raise(sig); /* SA_RESETHAND: the default action, once this handler returns */
}

static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* The directory (mode 0700) where the C compiler writes the trainer, and the generated sources
 * unless --emit-dir keeps them; name is the trainer's file name. */
static int make_work_dir(const char *name) {
    const char *t = getenv("TMPDIR");
    int n = snprintf(work_dir, sizeof work_dir, "%s/netc.XXXXXX", t && *t ? t : "/tmp");
    if (n >= (int)sizeof work_dir || !mkdtemp(work_dir)) {
        fprintf(stderr, "netc: error: cannot create a temporary directory: %s\n",
                strerror(n >= (int)sizeof work_dir ? ENAMETOOLONG : errno));
        work_dir[0] = '\0';
        return 1;
    }
    static const char *const endings[N_WORK] = {".c", ".cu", "_images.c", ""};
    for (int i = 0; i < N_WORK; i++)
        snprintf(work_files[i], sizeof work_files[i], "%s/%.255s%s", work_dir, name, endings[i]);
    atomic_signal_fence(memory_order_seq_cst);
    work_ready = 1;
    return 0;
}

/* Run argv[0] with an argument vector in a new process group and wait; returns its exit status
 * or -1. The signal handler can stop the group as soon as it exists: the stop signals are
 * blocked while it is created and while it is reaped. */
static int run_command(char *const argv[]) {
    sigset_t stops, old, none;
    sigemptyset(&stops), sigemptyset(&none);
    sigaddset(&stops, SIGINT), sigaddset(&stops, SIGTERM), sigaddset(&stops, SIGHUP);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    pid_t pid;
    sigprocmask(SIG_BLOCK, &stops, &old);
    int rc = posix_spawnp(&pid, argv[0], NULL, &attr, argv, environ);
    if (rc == 0) compiler_group = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        fprintf(stderr, "netc: error: cannot run the C compiler '%s': %s\n", argv[0], strerror(rc));
        fprintf(stderr, "  hint: install gcc, or name another compiler with --cc or $CC\n");
        return -1;
    }
    siginfo_t info;
    while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) continue;
    int status = -1;
    sigprocmask(SIG_BLOCK, &stops, &old);
    compiler_group = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) continue;
    sigprocmask(SIG_SETMASK, &old, NULL);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Link argv (NULL-terminated, at most 64 entries) into the private directory, then copy the
 * trainer to `out` atomically. */
static int link_atomically(char **argv, int tmp_at, const char *out, const char *c_path) {
    argv[tmp_at] = work_files[WORK_EXE];
    int rc = run_command(argv);
    if (rc != 0) {
        if (rc > 0) fprintf(stderr, "netc: error: the C compiler failed (exit %d) on %s\n", rc, c_path);
        return 1;
    }
    char why[RT_WHY_MAX];
    if (rt_out_copy(work_files[WORK_EXE], out, 0777, why, sizeof why) != 0) {
        fprintf(stderr, "netc: error: cannot write %s: %s\n", out, why);
        return 1;
    }
    return 0;
}

/* The shared toolchain, found on the first call (toolchain.c). */
static const Toolchain *tools(const Options *o) {
    return toolchain(o->cc, o->runtime_dir, o->opt_level, o->werror, o->cpu_level);
}

/* Creates the --emit-dir and any missing folders above it, as `mkdir -p`; 1 after an error. */
static int make_emit_dir(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        fprintf(stderr, "netc: error: --emit-dir %s: the path is too long\n", dir);
        return 1;
    }
    for (char *p = path + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "netc: error: cannot create %s (for --emit-dir %s): %s\n", path, dir,
                    strerror(errno));
            return 1;
        }
        if (!(*p = c)) return 0;
    }
}

/* Where the generated sources go: --emit-dir/NAME.c (.cu, _images.c), or the private directory. */
static int source_paths(const Options *o, const char *name, char paths[][4096]) {
    if (!o->emit_dir) {
        for (int i = WORK_C; i <= WORK_IMAGES; i++) snprintf(paths[i], 4096, "%s", work_files[i]);
        return 0;
    }
    if (make_emit_dir(o->emit_dir)) return 1;
    snprintf(paths[WORK_C], 4096, "%s/%.255s.c", o->emit_dir, name);
    snprintf(paths[WORK_CU], 4096, "%s/%.255s.cu", o->emit_dir, name);
    snprintf(paths[WORK_IMAGES], 4096, "%s/%.255s_images.c", o->emit_dir, name);
    return 0;
}

/* What one generated file holds: the trainer's C, the kernels' source, or their images. */
typedef enum { OUT_TRAINER, OUT_KERNELS, OUT_IMAGES } OutKind;

static int write_contents(FILE *f, OutKind kind, const Target *tg, const IrGraph *g, const TcBuild *b) {
    switch (kind) {
    case OUT_TRAINER: return cg_emit(tg->cg, g, f, NULL);
    case OUT_KERNELS: return cg_emit(tg->cg, g, NULL, f);
    case OUT_IMAGES: return tg->compile_kernels(b, f);
    }
    ICE("no generated file of kind %d", (int)kind);
}

/* Write one generated file through rt_out. The kernel compiler says itself why it failed. */
static int write_output(const char *path, OutKind kind, const Target *tg, const IrGraph *g, const TcBuild *b) {
    RtOut out;
    if (rt_out_open(&out, path, 0666) != 0) {
        fprintf(stderr, "netc: error: cannot write %s: %s\n", path, out.why);
        return 1;
    }
    int rc = write_contents(out.f, kind, tg, g, b);
    if (rc != 0 || ferror(out.f)) {
        rt_out_abort(&out);
        if (kind != OUT_IMAGES) fprintf(stderr, "netc: error: writing %s failed\n", path);
        return 1;
    }
    if (rt_out_commit(&out) != 0) {
        fprintf(stderr, "netc: error: cannot write %s: %s\n", path, out.why);
        return 1;
    }
    return 0;
}

/* The output's path: -o, or the input's file name without its directory and `.net`. */
static char *output_path(const Options *o) {
    return o->output ? strdup(o->output) : default_output(o->input);
}

/* The kernels of a target with kernels: NAME.cu, compiled by the target into NAME_images.c. */
static int emit_kernels(const Options *o, const Target *tg, const IrGraph *g, const TcBuild *b) {
    int rc = write_output(b->cu_path, OUT_KERNELS, tg, g, NULL);
    if (!rc) rc = write_output(b->images_path, OUT_IMAGES, tg, g, b);
    if (!o->emit_dir) unlink(b->cu_path);
    return rc;
}

/* The driver's part of a link: argv into the private directory, then the trainer into place. */
static int link_trainer(const TcBuild *b, char **argv, int out_at) {
    return link_atomically(argv, out_at, b->out, b->c_path);
}

static int emit_and_build(const Options *o, const Target *tg, const IrGraph *g) {
    char *out = output_path(o);
    const char *slash = strrchr(out, '/');
    char paths[N_WORK][4096];
    TcBuild b = {.t = tools(o), .precision = o->precision, .sms = o->sms, .n_sms = o->n_sms,
                 .distributed = o->distributed, .system_malloc = o->system_malloc,
                 .c_path = paths[WORK_C], .cu_path = paths[WORK_CU], .images_path = paths[WORK_IMAGES],
                 .out = out, .link = link_trainer};
    int rc = toolchain_check(b.t, tg);
    if (!rc) rc = make_work_dir(slash ? slash + 1 : out);
    if (!rc) rc = source_paths(o, slash ? slash + 1 : out, paths);
    if (!rc) rc = write_output(paths[WORK_C], OUT_TRAINER, tg, g, NULL);
    if (!rc && tg->cg->has_kernels) rc = emit_kernels(o, tg, g, &b);
    if (!rc) rc = tg->link(&b);
    remove_work_dir();
    free(out);
    return rc;
}

/* ---- outputs against inputs
 *
 * The trainer (-o, or the source's name without `.net`) and the --emit-dir sources must not be
 * the .net source or netc itself (compared by device and inode, or by directory and name for a
 * file that does not exist yet), and may replace only a regular file; the trainer's directory is
 * probed by creating and removing a temporary file there. All before any work.
 */
static int refuse_output(const char *what, const char *path, const char *input, const char *hint) {
    fprintf(stderr, "netc: error: %s '%s' would replace %s: it is the same file\n  hint: %s\n", what, path, input, hint);
    return 2;
}

static int check_outputs(const Options *o, const CgBackend *be) {
    RtFileId source, self, id;
    rt_file_id(o->input, 1, &source);
    rt_file_id("/proc/self/exe", 1, &self);
    char *out = output_path(o), why[RT_WHY_MAX], emitted[3][4096];
    const char *name = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    int n = 0, rc = 0;
    /* the --emit-dir first: -o may name a file in it */
    if (o->emit_dir && make_emit_dir(o->emit_dir)) {
        free(out);
        return 1;
    }
    if (o->emit_dir) {
        snprintf(emitted[n++], 4096, "%s/%.255s.c", o->emit_dir, name);
        if (be->has_kernels) snprintf(emitted[n++], 4096, "%s/%.255s.cu", o->emit_dir, name);
        if (be->has_kernels) snprintf(emitted[n++], 4096, "%s/%.255s_images.c", o->emit_dir, name);
    }
    rt_file_id(out, 0, &id);
    if (rt_same_file(&id, &source))
        rc = refuse_output("the trainer", out, "the source", "name the trainer with -o, or give the source a .net ending");
    else if (rt_same_file(&id, &self))
        rc = refuse_output("the trainer", out, "netc itself", "name the trainer with -o");
    else if (rt_out_probe(out, why, sizeof why) != 0) {
        fprintf(stderr, "netc: error: cannot write the trainer '%s': %s\n", out, why);
        rc = 1;
    }
    for (int i = 0; i < n && !rc; i++) {
        rt_file_id(emitted[i], 0, &id);
        if (rt_same_file(&id, &source))
            rc = refuse_output("the generated source", emitted[i], "the .net source", "name another --emit-dir or -o");
        else if (id.exists && rt_out_check(emitted[i], why, sizeof why) != 0) {
            fprintf(stderr, "netc: error: cannot write %s: %s\n", emitted[i], why);
            rc = 1;
        }
    }
    free(out);
    return rc;
}

static int verify(const IrGraph *g, const char *stage) {
    if (ir_verify(g, stage)) return 1;
    ICE("the IR is invalid after %s", stage);
}

/* --frozen-half: an error when the model has no frozen parameter; a note naming the frozen ones
 * that stay float32 because something other than products and convolutions reads them. */
static int report_frozen_half(const IrGraph *g, const char *input) {
    int frozen = 0, kept = 0;
    for (int i = 0; i < g->n_params; i++)
        if (!g->params[i].trainable && !g->params[i].buffer) {
            frozen++;
            kept += g->params[i].node->dtype == DT_F32;
        }
    if (!frozen) {
        fprintf(stderr, "netc: error: %s: --frozen-half: model '%s' has no frozen parameters (give its train "
                        "section freeze = [...] or lora = lora(...))\n", input, g->model_name);
        return 1;
    }
    if (!kept) return 0;
    fprintf(stderr, "netc: note: --frozen-half: %d of the %d frozen parameters stay float32 (read by more than "
                    "products and convolutions):", kept, frozen);
    for (int i = 0, shown = 0; i < g->n_params; i++) {
        const IrParam *p = &g->params[i];
        if (p->trainable || p->buffer || p->node->dtype != DT_F32) continue;
        if (shown++ == 4) {
            fprintf(stderr, " ...");
            break;
        }
        fprintf(stderr, "%s %s", shown > 1 ? "," : "", p->name);
    }
    fprintf(stderr, "\n");
    return 0;
}

/* The pipeline: parse, analyse, differentiate, plan, emit, build. */
static int compile(const Options *o, Arena *arena) {
    const Target *tg = target_named(o->backend);
    char names[256], msg[512];
    if (!tg) {
        snprintf(msg, sizeof msg, "unknown backend '%s' (available: %s)", o->backend,
                 target_names(names, sizeof names, "", NULL, 0));
        return usage_error("%s", msg);
    }
    const CgBackend *be = tg->cg;
    int builds = o->dump == DUMP_NONE && !o->check_only && !o->report && !o->summary;
    if (builds && be->has_kernels && nvrtc_check_archs(o->sms, o->n_sms, msg, sizeof msg))
        return usage_error("%s", msg); /* before check_outputs makes the --emit-dir */
    int rc = builds ? check_outputs(o, be) : 0;
    if (rc) return rc;
    AstProgram *prog = parse_file(arena, o->input);
    if (!prog || diag_error_count()) return 1;
    if (o->dump == DUMP_AST) return ast_print(prog, stdout), 0;
    IrGraph *g = sema_build(arena, prog, (SemaDefine *)o->defs, o->n_defs);
    if (!g) return 1;
    warn_unused(g);
    if (o->check_only) return 0;
    if (o->dump == DUMP_IR) return ir_print(g, stdout), 0;
    if (o->summary) return ir_summary(g, stdout), 0;
    drop_unused(g);
    verify(g, "unused values");
    if (!o->no_fuse) fold_attention_heads(g);
    verify(g, "attention heads");
    g->loss_scaling = o->precision == CG_FP16; /* the loss gradient's seed is the loss scale */
    if (ad_differentiate(g) != 0) return 1;
    verify(g, "autodiff");
    if (o->dump == DUMP_GRAD) return ir_print(g, stdout), 0;
    if (!o->no_remat) remat_activations(g);
    verify(g, "remat");
    if (be->compacts_rows && !o->all_rows) skip_ignored_rows(g);
    verify(g, "ignored rows");
    if (!o->no_fuse) ew_through_reshapes(g);
    verify(g, "reshapes");
    layout_select(g, !o->row_major, be->krsc_filters, !o->no_fuse && !o->copy_views);
    verify(g, "layout");
    if (o->precision == CG_BF16 || o->precision == CG_FP16)
        autocast_half(g, o->precision == CG_BF16 ? DT_BF16 : DT_F16, o->frozen_half);
    verify(g, "autocast");
    if (o->frozen_half && (rc = report_frozen_half(g, o->input)) != 0) return rc;
    if (o->dump == DUMP_LAYOUT) return ir_print(g, stdout), 0;
    if (!o->no_fuse) fuse_elementwise(g);
    verify(g, "fusion");
    if (!o->no_fuse) fuse_epilogues(g);
    verify(g, "epilogues");
    if (!o->no_fuse && be->fuse_reductions) fuse_reductions(g);
    verify(g, "reductions");
    if (!o->no_fuse && !o->copy_views) fold_views(g);
    verify(g, "views");
    if (o->dump == DUMP_FUSED) return ir_print(g, stdout), 0;
    if (o->dump == DUMP_DOT || o->dump == DUMP_DOT_STEP) return ir_print_dot(g, o->dump == DUMP_DOT_STEP, stdout), 0;
    mp_plan(g, be->node_scratch, be->in_place);
    verify(g, "memplan");
    if (o->distributed) dist_buckets(g, o->bucket_kib * 1024);
    g->sync_bn = o->sync_bn, g->shard_optimizer = o->shard_optimizer, g->profile = o->profile;
    if (o->report) {
        fuse_report(g, stdout);
        if (be == &cg_cpu) in_backward_report(g, IN_BACKWARD_MIN_FLOATS, stdout);
        dist_report(g, stdout);
        return 0;
    }
    if (o->dump == DUMP_MEMPLAN) return mp_print(g, stdout), 0;
    if (o->dump == DUMP_C) return cg_emit(be, g, stdout, NULL);
    if (o->dump == DUMP_CU) {
        if (!be->has_kernels)
            return usage_error("--dump=cu needs a backend with kernels (%s)",
                               target_names(names, sizeof names, "--backend ", has_kernels, 0));
        return cg_emit(be, g, NULL, stdout);
    }
    return emit_and_build(o, tg, g);
}

/* --print-toolchain: where each tool is, then whether --backend's target has all it needs. */
static int print_toolchain(const Options *o) {
    const Toolchain *t = tools(o);
    toolchain_print(t, NETC_VERSION);
    return toolchain_check(t, target_named(o->backend));
}

int main(int argc, char **argv) {
    Options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    if (o.print_toolchain) return print_toolchain(&o);
    Arena arena = {0};
    catch_signals();
    rc = compile(&o, &arena);
    arena_free(&arena);
    for (int i = 0; i < o.n_defs; i++) free((char *)o.defs[i].name);
    return rc;
}
