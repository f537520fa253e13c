/* main.c - the netc driver: command line, the pipeline, and building the trainer.
 *
 *   netc FILE.net [-o OUT] [-D NAME=VALUE]... [--emit-dir DIR] [--dump=STAGE] ...
 *
 * compile() is the whole pipeline in one place, with the verifier between the passes. The
 * generated C is compiled by the system C compiler, started with an argument vector (never a
 * shell) in a process group of its own, and linked into netc's private temporary directory;
 * the trainer and the --emit-dir sources then appear atomically through rt_out (runtime/
 * rt_file.c), which replaces only regular files. Before any work the outputs are checked against
 * the inputs (the .net source, netc itself). SIGINT, SIGTERM and SIGHUP stop the C compiler,
 * remove the temporary directory and any half-written output, and end netc by the same signal.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
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

#ifdef NETC_HAVE_CUDA
#include <nvrtc.h>
#endif

extern char **environ;

#ifndef NETC_VERSION
#define NETC_VERSION "0.1.0"
#endif

enum { MAX_DEFINES = 256, MAX_ARCHS = 8 };

typedef enum { DUMP_NONE, DUMP_AST, DUMP_IR, DUMP_GRAD, DUMP_LAYOUT, DUMP_FUSED, DUMP_MEMPLAN, DUMP_C, DUMP_CU } DumpStage;

static const char *const dump_names[] = {
    [DUMP_NONE] = "", [DUMP_AST] = "ast", [DUMP_IR] = "ir", [DUMP_GRAD] = "grad", [DUMP_LAYOUT] = "layout",
    [DUMP_FUSED] = "fused", [DUMP_MEMPLAN] = "memplan", [DUMP_C] = "c", [DUMP_CU] = "cu",
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
    int row_major;  /* --layout=row-major: no channels-last tensors */
    int report;     /* --report: print the fusion report and stop */
    int sms[MAX_ARCHS]; /* --arch: the GPU architectures to compile kernels for (90 = sm_90) */
    int n_sms;
    int tf32;       /* --precision tf32: TF32 tensor-core products and convolutions */
    int bf16;       /* --precision bf16: products and convolutions in bf16, float32 master weights */
    int werror;     /* --werror: the trainer's C compiled with -Werror (CI) */
    int print_toolchain; /* --print-toolchain: say where the trainer's tools are, and stop */
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
            "  --emit-dir DIR       keep the generated C source in DIR\n"
            "  --dump=STAGE         print a stage to stdout and stop: ast, ir, grad, layout, fused, memplan, c,\n"
            "                       cu (the CUDA kernels of --backend cuda)\n"
            "  --report             print the fusion report (groups, layouts, kernels, traffic, memory) and stop\n"
            "  --no-fuse            do not fuse element-wise operators (one loop per operator)\n"
            "  --layout=LAYOUT      activations of convolution chains: channels-last (default) or row-major\n"
            "  --check              check the model (parse and analyse) and stop\n"
            "  --backend NAME       code generator: cpu (default) or cuda\n"
            "  --arch LIST          cuda: GPU architectures to compile kernels for, e.g. sm_80,sm_90\n"
            "                       (default: sm_90); PTX of the lowest is embedded too\n"
            "  --precision P        cuda: fp32 (default; no TF32), tf32, or bf16 (products and convolutions\n"
            "                       in bf16 with float32 master weights) for products and convolutions\n"
            "  -O LEVEL             C compiler optimisation level for the trainer (default: 2)\n"
            "  --cc CC              C compiler to build the trainer (default: $CC or the one netc was built with)\n"
            "  --runtime-dir DIR    where netrt.h and libnetrt.a live (default: $NETC_RUNTIME_DIR, runtime/ beside\n"
            "                       netc, or the build tree)\n"
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
    return usage_error("unknown stage '%s' for --dump (ast, ir, grad, layout, fused, memplan, c, cu)", stage);
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
        if (sscanf(p, "sm_%2d%n", &sm, &len) != 1 || (p[len] && p[len] != ',') || sm < 75)
            return usage_error("--arch takes a comma-separated list like sm_80,sm_90 (sm_75 or newer), found '%s'", list);
        if (o->n_sms == MAX_ARCHS) return usage_error("--arch: at most 8 architectures, found '%s'", list);
        for (int i = 0; i < o->n_sms; i++)
            if (o->sms[i] == sm) return usage_error("--arch names an architecture twice: '%s'", list);
        o->sms[o->n_sms++] = sm;
        p += len;
        if (!*p) return 0;
        p++;
    }
}

static int parse_args(int argc, char **argv, Options *o) {
    *o = (Options){.backend = "cpu", .opt_level = "2", .sms = {90}, .n_sms = 1};
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
        } else if (strcmp(a, "--werror") == 0) {
            o->werror = 1;
        } else if (strcmp(a, "--print-toolchain") == 0) {
            o->print_toolchain = 1;
        } else if (strcmp(a, "--report") == 0) {
            o->report = 1;
        } else if ((v = opt_value(argc, argv, &i, "-o", &err))) {
            o->output = v;
        } else if (strncmp(a, "-D", 2) == 0) {
            const char *d = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : "");
            if ((err = parse_define(o, d))) return err;
        } else if (strncmp(a, "-O", 2) == 0 && a[2]) {
            o->opt_level = a + 2;
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
            if (strcmp(v, "fp32") && strcmp(v, "tf32") && strcmp(v, "bf16"))
                return usage_error("--precision takes fp32, tf32 or bf16, found '%s' (fp16 is not implemented yet)", v);
            o->tf32 = strcmp(v, "tf32") == 0;
            o->bf16 = strcmp(v, "bf16") == 0;
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
    if ((o->tf32 || o->bf16) && strcmp(o->backend, "cuda") != 0)
        return usage_error("--precision is an option of --backend cuda (the CPU backend computes in float32)%s", "");
    if (strcmp(o->opt_level, "0") && strcmp(o->opt_level, "1") && strcmp(o->opt_level, "2") &&
        strcmp(o->opt_level, "3") && strcmp(o->opt_level, "s"))
        return usage_error("-O takes 0, 1, 2, 3 or s, found '%s'", o->opt_level);
    return 0;
}

static const CgBackend *find_backend(const char *name) {
    static const CgBackend *const backends[] = {&cg_cpu, &cg_cuda};
    for (size_t i = 0; i < sizeof backends / sizeof *backends; i++)
        if (strcmp(backends[i]->name, name) == 0) return backends[i];
    return NULL;
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

/* ---- the toolchain: where the trainer's compiler, headers and libraries are
 *
 * netc may run far from the tree it was built in (tests/gpu/pack.sh carries it to a GPU
 * machine), so nothing below is taken on trust from the build: every file is looked up, the
 * first place that has it wins, and `netc --print-toolchain` says which. The runtime comes from
 * --runtime-dir, $NETC_RUNTIME_DIR, a `runtime/` folder beside the netc executable, or the build
 * tree (whose headers and libraries live apart). The CUDA libraries come from $CUDA_HOME, the
 * runtime folder's `cuda/` (a packed copy of the CUDA headers and the static CUDA runtime), the
 * folders of $LD_LIBRARY_PATH (for cuBLASLt and cuDNN, e.g. PyTorch's site-packages/nvidia/...),
 * the build's CUDA, and /usr/local/cuda. */
enum { TC_PATH = 4096, TC_DIRS = 40 };

typedef struct ToolFile {
    char path[TC_PATH]; /* where it was found; "" = missing */
    const char *what;   /* the name the messages give it */
    const char *tried;  /* the places looked in, for the message when it is missing */
} ToolFile;

typedef struct Toolchain {
    const char *cc, *cc_from;
    char rt_include[TC_PATH], rt_lib[TC_PATH]; /* netrt.h, libnetrt.a (and cuda/ below each) */
    const char *rt_from;                       /* which of the places above */
    char rt_tried[4 * TC_PATH];
    ToolFile cjson;
    char opt[8]; /* -O<level> */
#ifdef NETC_HAVE_CUDA
    ToolFile cuda_include, cudart_static, cublaslt, cudnn; /* cuda_include: its cuda_runtime.h */
#endif
} Toolchain;

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The folder holding the running netc ("" if /proc cannot tell). */
static void exe_dir(char *dir, size_t size) {
    ssize_t n = readlink("/proc/self/exe", dir, size - 1);
    dir[n > 0 ? n : 0] = 0;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
}

/* Append `dir` to dirs (at most TC_DIRS, empty ones skipped) and return the new count. */
static int add_dir(const char **dirs, int n, const char *dir) {
    if (dir && *dir && n < TC_DIRS) dirs[n++] = dir;
    return n;
}

/* The first DIR/NAME (names in order of preference) that exists, into f; else f->tried lists
 * the folders. Returns 1 when found. */
static int find_file(ToolFile *f, const char *what, const char *const *dirs, int n_dirs, const char *const *names,
                     int n_names) {
    static char tried[8][TC_DIRS * 256];
    static int slot;
    char *t = tried[slot++ % 8];
    *t = 0;
    f->what = what, f->path[0] = 0, f->tried = t;
    for (int d = 0; d < n_dirs; d++) {
        for (int k = 0; k < n_names; k++) {
            snprintf(f->path, sizeof f->path, "%s/%s", dirs[d], names[k]);
            if (is_file(f->path)) return 1;
        }
        size_t len = strlen(t);
        snprintf(t + len, sizeof tried[0] - len, "%s%s", len ? ", " : "", dirs[d]);
    }
    f->path[0] = 0;
    return 0;
}

static void set_runtime(Toolchain *t, const char *inc, const char *lib, const char *from) {
    snprintf(t->rt_include, sizeof t->rt_include, "%s", inc);
    snprintf(t->rt_lib, sizeof t->rt_lib, "%s", lib);
    t->rt_from = from;
}

/* The runtime's folders. An explicit one (--runtime-dir, $NETC_RUNTIME_DIR) is taken as it is,
 * so that a wrong one is reported rather than silently replaced. */
static void find_runtime(const Options *o, Toolchain *t) {
    const char *env = getenv("NETC_RUNTIME_DIR");
    if (o->runtime_dir) return set_runtime(t, o->runtime_dir, o->runtime_dir, "--runtime-dir");
    if (env && *env) return set_runtime(t, env, env, "$NETC_RUNTIME_DIR");
    char beside[TC_PATH], hdr[TC_PATH + 16], lib[TC_PATH + 16];
    exe_dir(beside, sizeof beside);
    size_t n = strlen(beside);
    snprintf(beside + n, sizeof beside - n, "/runtime");
    snprintf(hdr, sizeof hdr, "%s/netrt.h", beside);
    if (is_file(hdr)) return set_runtime(t, beside, beside, "beside netc");
    snprintf(hdr, sizeof hdr, "%s/netrt.h", NETC_RT_INCLUDE_DIR);
    snprintf(lib, sizeof lib, "%s/libnetrt.a", NETC_RT_LIB_DIR);
    snprintf(t->rt_tried, sizeof t->rt_tried, "%s, the build tree (%s, %s)", beside, NETC_RT_INCLUDE_DIR,
             NETC_RT_LIB_DIR);
    set_runtime(t, NETC_RT_INCLUDE_DIR, NETC_RT_LIB_DIR, is_file(hdr) && is_file(lib) ? "the build tree" : NULL);
}

/* A $VAR's value with `suffix` appended, in a buffer of its own (NULL when VAR is unset). */
static const char *env_dir(char *buf, size_t size, const char *var, const char *suffix) {
    const char *v = getenv(var);
    if (!v || !*v) return NULL;
    snprintf(buf, size, "%s%s", v, suffix);
    return buf;
}

/* The folder of a file path, in a buffer of its own. */
static const char *dir_of(char *buf, size_t size, const char *path) {
    snprintf(buf, size, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
    return buf;
}

#ifdef NETC_HAVE_CUDA
/* The CUDA headers, the static CUDA runtime, cuBLASLt and cuDNN (rt_cuda: the runtime's cuda/). */
static void find_cuda(Toolchain *t, const char *rt_cuda) {
    const char *dirs[TC_DIRS];
    int n;
    static char home[4][TC_PATH], ld[TC_PATH * 4], built[3][TC_PATH];
    const char *h_inc = env_dir(home[0], TC_PATH, "CUDA_HOME", "/include");
    const char *h_lib64 = env_dir(home[1], TC_PATH, "CUDA_HOME", "/lib64");
    const char *h_lib = env_dir(home[2], TC_PATH, "CUDA_HOME", "/lib");
    char rt_cuda_inc[TC_PATH + 16];
    snprintf(rt_cuda_inc, sizeof rt_cuda_inc, "%s/include", rt_cuda);

    n = add_dir(dirs, add_dir(dirs, add_dir(dirs, 0, h_inc), rt_cuda_inc), NETC_CUDA_INCLUDE_DIR);
    n = add_dir(dirs, n, "/usr/local/cuda/include");
    const char *cuda_runtime_h[] = {"cuda_runtime.h"};
    find_file(&t->cuda_include, "the CUDA headers (cuda_runtime.h)", dirs, n, cuda_runtime_h, 1);
    char *slash = strrchr(t->cuda_include.path, '/');
    if (slash) *slash = 0; /* the folder, for -I */

    n = add_dir(dirs, add_dir(dirs, add_dir(dirs, add_dir(dirs, 0, h_lib64), h_lib), rt_cuda), NETC_CUDA_LIBRARY_DIR);
    n = add_dir(dirs, n, "/usr/local/cuda/lib64");
    const char *cudart[] = {"libcudart_static.a"};
    find_file(&t->cudart_static, "the static CUDA runtime (libcudart_static.a)", dirs, n, cudart, 1);

    /* cuBLASLt and cuDNN are shared: also where the loader will look ($LD_LIBRARY_PATH), and
     * by their versioned names, which is all that a pip wheel (PyTorch's nvidia/...) has. */
    n = add_dir(dirs, add_dir(dirs, 0, h_lib64), h_lib);
    const char *ldp = getenv("LD_LIBRARY_PATH");
    snprintf(ld, sizeof ld, "%s", ldp ? ldp : "");
    for (char *save = NULL, *d = strtok_r(ld, ":", &save); d; d = strtok_r(NULL, ":", &save)) n = add_dir(dirs, n, d);
    int n_shared = n;
    n = add_dir(dirs, n, dir_of(built[0], TC_PATH, NETC_CUBLASLT_LIBRARY));
    n = add_dir(dirs, n, "/usr/local/cuda/lib64");
    const char *cublaslt[] = {"libcublasLt.so", NETC_CUBLASLT_SONAME};
    find_file(&t->cublaslt, "cuBLASLt (" NETC_CUBLASLT_SONAME ")", dirs, n, cublaslt, 2);
    n = add_dir(dirs, n_shared, dir_of(built[1], TC_PATH, NETC_CUDNN_LIBRARY));
    n = add_dir(dirs, add_dir(dirs, n, "/usr/local/cuda/lib64"), "/usr/lib/x86_64-linux-gnu");
    const char *cudnn[] = {"libcudnn.so", NETC_CUDNN_SONAME};
    find_file(&t->cudnn, "cuDNN (" NETC_CUDNN_SONAME ")", dirs, n, cudnn, 2);
}
#endif

static const Toolchain *toolchain(const Options *o) {
    static Toolchain t; /* one per run: the options do not change */
    static int done;
    if (done) return &t;
    done = 1;
    const char *cc = getenv("CC");
    t.cc = o->cc ? o->cc : cc && *cc ? cc : NETC_CC;
    t.cc_from = o->cc ? "--cc" : cc && *cc ? "$CC" : "the compiler netc was built with";
    snprintf(t.opt, sizeof t.opt, "-O%s", o->opt_level);
    find_runtime(o, &t);
    char rt_cuda[TC_PATH + 8], build_lib[TC_PATH];
    snprintf(rt_cuda, sizeof rt_cuda, "%s/cuda", t.rt_lib);

    /* cJSON: a copy in the runtime folder (a pack brings one), else the build's. */
    const char *dirs[TC_DIRS];
    int n = add_dir(dirs, 0, t.rt_lib);
    n = add_dir(dirs, n, dir_of(build_lib, sizeof build_lib, NETC_CJSON_LIBRARY));
    const char *cjson[] = {"libcjson.so", "libcjson.so.1"};
    find_file(&t.cjson, "libcjson", dirs, n, cjson, 2);
#ifdef NETC_HAVE_CUDA
    find_cuda(&t, rt_cuda);
#endif
    return &t;
}

/* 0 when the runtime and every file a trainer of this backend links are there; else says
 * which is missing, where it looked and what to do, and returns 1. */
static int toolchain_check(const Toolchain *t, int cuda) {
    if (!t->rt_from) {
        fprintf(stderr, "netc: error: cannot find netc's runtime (netrt.h, libnetrt.a): looked in %s\n"
                        "  hint: name its folder with --runtime-dir DIR or $NETC_RUNTIME_DIR\n", t->rt_tried);
        return 1;
    }
    char p[TC_PATH + 32];
    const char *need[] = {"%s/netrt.h", "%s/libnetrt.a", "%s/cuda/netrt_cuda.h", "%s/cuda/libnetrt_cuda.a"};
    for (int i = 0; i < (cuda ? 4 : 2); i++) {
        snprintf(p, sizeof p, need[i], i % 2 ? t->rt_lib : t->rt_include);
        if (!is_file(p)) {
            fprintf(stderr, "netc: error: the runtime (%s, from %s) has no %s\n"
                            "  hint: name a complete runtime folder with --runtime-dir DIR or $NETC_RUNTIME_DIR\n",
                    i % 2 ? t->rt_lib : t->rt_include, t->rt_from, p);
            return 1;
        }
    }
    const ToolFile *files[] = {
        &t->cjson,
#ifdef NETC_HAVE_CUDA
        &t->cuda_include, &t->cudart_static, &t->cublaslt, &t->cudnn,
#endif
    };
    int n = cuda ? (int)(sizeof files / sizeof *files) : 1, rc = 0;
    for (int i = 0; i < n; i++)
        if (!files[i]->path[0]) {
            fprintf(stderr, "netc: error: cannot find %s: looked in %s\n", files[i]->what, files[i]->tried);
            rc = 1;
        }
    if (rc && cuda)
        fprintf(stderr, "  hint: set CUDA_HOME to the CUDA toolkit, or add the folders holding cuBLASLt and cuDNN "
                        "to LD_LIBRARY_PATH (PyTorch has them in site-packages/nvidia/*/lib)\n");
    return rc;
}

/* buf = a b c; a path too long for buf is left empty, and the compiler then names it missing. */
static char *cat3(char *buf, size_t size, const char *a, const char *b, const char *c) {
    if ((size_t)snprintf(buf, size, "%s%s%s", a, b, c) >= size) buf[0] = 0;
    return buf;
}

/* -Wl,-rpath,DIR for the folder of a shared library, so the trainer finds it where netc did. */
static void rpath_of(char *buf, size_t size, const char *lib) {
    char dir[TC_PATH];
    snprintf(buf, size, "-Wl,-rpath,%s", dir_of(dir, sizeof dir, lib));
}

/* The trainer's C is compiled with -Werror only when asked (--werror, as CI does): another
 * compiler version may warn where the one netc was tested with does not. */
static char *werror(const Options *o) {
    return o->werror ? "-Werror" : "-Wno-error";
}

#ifdef NETC_HAVE_CUDA
/* A CUDA trainer: the host C and the kernel images, linked with libnetrt_cuda, libnetrt, the
 * static CUDA runtime, cuBLASLt and cuDNN - not OpenBLAS or oneDNN, which only the CPU kernels
 * use, so the GPU machine needs neither. */
static int build_cuda_trainer(const Options *o, const char *c_path, const char *images_path, const char *out) {
    const Toolchain *t = toolchain(o);
    char inc_rt[TC_PATH + 8], inc_rt_cuda[TC_PATH + 16], inc_cuda[TC_PATH + 8], lib_rt[TC_PATH + 16],
        lib_rt_cuda[TC_PATH + 32], lib_dir[TC_PATH + 8], rp_cjson[TC_PATH + 16], rp_blas[TC_PATH + 16], rp_dnn[TC_PATH + 16];
    cat3(inc_rt, sizeof inc_rt, "-I", t->rt_include, "");
    cat3(inc_rt_cuda, sizeof inc_rt_cuda, "-I", t->rt_include, "/cuda");
    cat3(inc_cuda, sizeof inc_cuda, "-I", t->cuda_include.path, "");
    cat3(lib_rt, sizeof lib_rt, "", t->rt_lib, "/libnetrt.a");
    cat3(lib_rt_cuda, sizeof lib_rt_cuda, "", t->rt_lib, "/cuda/libnetrt_cuda.a");
    cat3(lib_dir, sizeof lib_dir, "-L", t->rt_lib, ""); /* a pack's libz.so, for -lz */
    rpath_of(rp_cjson, sizeof rp_cjson, t->cjson.path);
    rpath_of(rp_blas, sizeof rp_blas, t->cublaslt.path);
    rpath_of(rp_dnn, sizeof rp_dnn, t->cudnn.path);
    char *argv[] = {
        (char *)t->cc, "-std=gnu11", (char *)t->opt, "-Wall", "-Wextra", werror(o), "-fopenmp", inc_rt, inc_rt_cuda,
        inc_cuda, o->tf32 || o->bf16 ? "-DNETC_MATH=RT_MATH_TF32" : "-DNETC_MATH=RT_MATH_FP32",
        (char *)c_path, (char *)images_path, lib_rt_cuda, lib_rt, lib_dir, (char *)t->cjson.path,
        (char *)t->cudart_static.path, (char *)t->cublaslt.path, (char *)t->cudnn.path, rp_cjson, rp_blas, rp_dnn,
        "-lz", "-lpthread", "-ldl", "-lrt", "-lm", "-o", NULL, NULL,
    };
    int n = (int)(sizeof argv / sizeof *argv);
    return link_atomically(argv, n - 2, out, c_path);
}
#endif

/* Compile the generated C at c_path into the trainer `out`, atomically. */
static int build_trainer(const Options *o, const char *c_path, const char *out) {
    const Toolchain *t = toolchain(o);
    char inc_rt[TC_PATH + 8], inc_blas[TC_PATH + 8], lib_rt[TC_PATH + 16], rp_cjson[TC_PATH + 16];
    cat3(inc_rt, sizeof inc_rt, "-I", t->rt_include, "");
    cat3(inc_blas, sizeof inc_blas, "-I", NETC_CBLAS_INCLUDE_DIR, "");
    cat3(lib_rt, sizeof lib_rt, "", t->rt_lib, "/libnetrt.a");
    rpath_of(rp_cjson, sizeof rp_cjson, t->cjson.path);
    char *argv[] = {
        (char *)t->cc, "-std=gnu11", (char *)t->opt, werror(o), "-fopenmp", inc_rt, inc_blas, (char *)c_path,
        lib_rt, NETC_DNNL_LIBRARY, NETC_BLAS_LIBRARY, (char *)t->cjson.path, rp_cjson, "-lz", "-lpthread", "-lm",
        "-o", NULL, NULL,
    };
    int n = (int)(sizeof argv / sizeof *argv);
    return link_atomically(argv, n - 2, out, c_path);
}

/* Where the generated sources go: --emit-dir/NAME.c (.cu, _images.c), or the private directory. */
static int source_paths(const Options *o, const char *name, char paths[][4096]) {
    if (!o->emit_dir) {
        for (int i = WORK_C; i <= WORK_IMAGES; i++) snprintf(paths[i], 4096, "%s", work_files[i]);
        return 0;
    }
    if (mkdir(o->emit_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "netc: error: cannot create %s: %s\n", o->emit_dir, strerror(errno));
        return 1;
    }
    snprintf(paths[WORK_C], 4096, "%s/%.255s.c", o->emit_dir, name);
    snprintf(paths[WORK_CU], 4096, "%s/%.255s.cu", o->emit_dir, name);
    snprintf(paths[WORK_IMAGES], 4096, "%s/%.255s_images.c", o->emit_dir, name);
    return 0;
}

/* Write one generated file through rt_out: emit(g, stream), or a kernel image table. */
static int write_output(const char *path, int (*emit)(const IrGraph *, FILE *), const IrGraph *g, const Options *o,
                        const char *cu_path) {
    RtOut out;
    if (rt_out_open(&out, path, 0666) != 0) {
        fprintf(stderr, "netc: error: cannot write %s: %s\n", path, out.why);
        return 1;
    }
    int rc = emit ? emit(g, out.f)
                  : nvrtc_compile(cu_path, toolchain(o)->rt_include, o->sms, o->n_sms, o->tf32 || o->bf16, out.f);
    if (rc != 0 || ferror(out.f)) {
        rt_out_abort(&out);
        if (emit) fprintf(stderr, "netc: error: writing %s failed\n", path);
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

/* The kernels of a device backend: NAME.cu, compiled by NVRTC into NAME_images.c. */
static int emit_kernels(const Options *o, const CgBackend *be, const IrGraph *g, char paths[][4096]) {
    int rc = write_output(paths[WORK_CU], be->emit_kernels, g, o, NULL);
    if (!rc) rc = write_output(paths[WORK_IMAGES], NULL, g, o, paths[WORK_CU]);
    if (!o->emit_dir) unlink(paths[WORK_CU]);
    return rc;
}

static int emit_and_build(const Options *o, const CgBackend *be, const IrGraph *g) {
    char *out = output_path(o);
    const char *slash = strrchr(out, '/');
    char paths[N_WORK][4096];
    int rc = toolchain_check(toolchain(o), be->emit_kernels != NULL);
    if (!rc) rc = make_work_dir(slash ? slash + 1 : out);
    if (!rc) rc = source_paths(o, slash ? slash + 1 : out, paths);
    if (!rc) rc = write_output(paths[WORK_C], be->emit, g, o, NULL);
    if (!rc && be->emit_kernels) rc = emit_kernels(o, be, g, paths);
#ifdef NETC_HAVE_CUDA
    if (!rc) rc = be->emit_kernels ? build_cuda_trainer(o, paths[WORK_C], paths[WORK_IMAGES], out)
                                   : build_trainer(o, paths[WORK_C], out);
#else
    if (!rc) rc = build_trainer(o, paths[WORK_C], out);
#endif
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
    if (o->emit_dir && mkdir(o->emit_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "netc: error: cannot create %s: %s\n", o->emit_dir, strerror(errno));
        free(out);
        return 1;
    }
    if (o->emit_dir) {
        snprintf(emitted[n++], 4096, "%s/%.255s.c", o->emit_dir, name);
        if (be->emit_kernels) snprintf(emitted[n++], 4096, "%s/%.255s.cu", o->emit_dir, name);
        if (be->emit_kernels) snprintf(emitted[n++], 4096, "%s/%.255s_images.c", o->emit_dir, name);
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

/* The pipeline: parse, analyse, differentiate, plan, emit, build. */
static int compile(const Options *o, Arena *arena) {
    const CgBackend *be = find_backend(o->backend);
    if (!be) return usage_error("unknown backend '%s' (available: cpu, cuda)", o->backend);
    int builds = o->dump == DUMP_NONE && !o->check_only && !o->report;
    int rc = builds ? check_outputs(o, be) : 0;
    if (rc) return rc;
    AstProgram *prog = parse_file(arena, o->input);
    if (!prog || diag_error_count()) return 1;
    if (o->dump == DUMP_AST) return ast_print(prog, stdout), 0;
    IrGraph *g = sema_build(arena, prog, (SemaDefine *)o->defs, o->n_defs);
    if (!g) return 1;
    if (o->check_only) return 0;
    if (o->dump == DUMP_IR) return ir_print(g, stdout), 0;
    if (ad_differentiate(g) != 0) return 1;
    verify(g, "autodiff");
    if (o->dump == DUMP_GRAD) return ir_print(g, stdout), 0;
    layout_select(g, !o->row_major, be->krsc_filters);
    verify(g, "layout");
    if (o->bf16) autocast_bf16(g);
    verify(g, "autocast");
    if (o->dump == DUMP_LAYOUT) return ir_print(g, stdout), 0;
    if (!o->no_fuse) fuse_elementwise(g);
    verify(g, "fusion");
    if (!o->no_fuse) fuse_epilogues(g);
    verify(g, "epilogues");
    if (!o->no_fuse && be->fuse_reductions) fuse_reductions(g);
    verify(g, "reductions");
    if (o->dump == DUMP_FUSED) return ir_print(g, stdout), 0;
    mp_plan(g, be->node_scratch);
    verify(g, "memplan");
    if (o->report) return fuse_report(g, stdout), 0;
    if (o->dump == DUMP_MEMPLAN) return mp_print(g, stdout), 0;
    if (o->dump == DUMP_C) return be->emit(g, stdout);
    if (o->dump == DUMP_CU) {
        if (!be->emit_kernels) return usage_error("--dump=cu needs a backend with kernels (--backend cuda)%s", "");
        return be->emit_kernels(g, stdout);
    }
    return emit_and_build(o, be, g);
}

/* --print-toolchain: one line per tool, where it was found (or MISSING and where netc looked). */
static void print_file(const char *label, const ToolFile *f) {
    if (f->path[0]) printf("%-18s %s\n", label, f->path);
    else printf("%-18s MISSING (looked in %s)\n", label, f->tried);
}

static int print_toolchain(const Options *o) {
    const Toolchain *t = toolchain(o);
    char self[TC_PATH];
    exe_dir(self, sizeof self);
    printf("netc %s in %s\n", NETC_VERSION, self);
    printf("%-18s %s (%s)\n", "C compiler", t->cc, t->cc_from);
    if (t->rt_from) printf("%-18s %s (%s)\n", "runtime", t->rt_lib, t->rt_from);
    else printf("%-18s MISSING (looked in %s)\n", "runtime", t->rt_tried);
    if (t->rt_from && strcmp(t->rt_include, t->rt_lib)) printf("%-18s %s\n", "runtime headers", t->rt_include);
    print_file("cJSON", &t->cjson);
#ifdef NETC_HAVE_CUDA
    print_file("CUDA headers", &t->cuda_include);
    print_file("CUDA runtime", &t->cudart_static);
    print_file("cuBLASLt", &t->cublaslt);
    print_file("cuDNN", &t->cudnn);
    int v[2] = {0, 0};
    Dl_info info = {0};
    nvrtcVersion(&v[0], &v[1]);
    dladdr((void *)nvrtcVersion, &info);
    printf("%-18s %d.%d, %s\n", "NVRTC", v[0], v[1], info.dli_fname ? info.dli_fname : "(linked statically)");
#else
    printf("%-18s not built (this netc has no --backend cuda)\n", "CUDA");
#endif
    fflush(stdout);
    return toolchain_check(t, strcmp(o->backend, "cuda") == 0);
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
