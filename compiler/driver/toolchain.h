/* toolchain.h - the toolchain half of a target, and what every trainer's build shares.
 *
 * A target is two tables. Its codegen half (CgBackend, codegen/codegen.h) is what the pipeline
 * needs and lives in the compiler library that tests link. Its toolchain half (Target, below)
 * says how its trainer is built on this machine: the runtime folder and libraries it links, where
 * they are, what --print-toolchain says of them, how its kernels are compiled and its link
 * line. That half looks at files, runs NVRTC and knows the build's paths, so only netc links it;
 * each target has one file of it here (target_cpu.c, target_cuda.c), and the driver reaches
 * them only through `targets`. The shared half (Toolchain: the C compiler, netrt.h and
 * libnetrt.a, cJSON) is found by toolchain.c.
 */
#ifndef NETC_TOOLCHAIN_H
#define NETC_TOOLCHAIN_H

#include "codegen.h"

enum { TC_PATH = 4096, TC_DIRS = 40 };

typedef struct ToolFile {
    char path[TC_PATH]; /* where it was found; "" = missing */
    const char *what;   /* the name the messages give it */
    const char *tried;  /* the places looked in, for the message when it is missing */
} ToolFile;

/* What every trainer's build uses, found once per run. */
typedef struct Toolchain {
    const char *cc, *cc_from;
    char rt_include[TC_PATH], rt_lib[TC_PATH]; /* netrt.h, libnetrt.a (and each target's folder below) */
    const char *rt_from;                       /* which of the places looked in; NULL = not found */
    char rt_tried[4 * TC_PATH];
    ToolFile cjson;
    char opt[8];         /* -O<level> */
    int cpu_level;       /* CPU trainers: the x86-64 level, 1, 3 or 4 (runtime/rt_cpu.c) */
    const char *cpu_from;
    char cpu_march[24];  /* -march=x86-64-v<level>, or "" for plain x86-64 */
    char cpu_lib[32];    /* the runtime built for it: libnetrt.a, libnetrt-x86-64-v<level>.a */
    const char *werror;  /* -Werror with --werror (CI), else -Wno-error */
} Toolchain;

/* One trainer to build: the generated sources and how the driver links them. */
typedef struct TcBuild {
    const Toolchain *t;
    CgPrecision precision;
    const int *sms; /* --arch: the GPU architectures to compile kernels for (90 = sm_90) */
    int n_sms;
    int distributed; /* --distributed: the trainer links libnetrt_mpi and MPI too */
    int system_malloc; /* --system-malloc: a CPU trainer does not link NETC_MALLOC_LIBRARY */
    const char *c_path, *cu_path, *images_path; /* the trainer's C, its kernels, their images */
    const char *out;                            /* the trainer */
    /* Run the C compiler on argv (NULL-terminated; argv[out_at], the output, is filled in) and
     * put the trainer at `out`, atomically. Returns 0, or 1 after saying why not. */
    int (*link)(const struct TcBuild *b, char **argv, int out_at);
} TcBuild;

typedef struct Target {
    const CgBackend *cg;
    const char *label;       /* what --print-toolchain calls its libraries as a whole ("CUDA") */
    const char *unavailable; /* NULL when this netc builds its trainers; else why not */
    /* Its runtime: a folder below the runtime's (beside libnetrt, which every trainer links)
     * holding its header and library, or NULL for a target that needs only libnetrt. */
    const char *runtime_folder, *runtime_header, *runtime_library;
    /* Look up its libraries (once, after the shared ones) and list them: a build needs each
     * one. NULL: it has none. */
    void (*find)(const Toolchain *t);
    int (*libraries)(const ToolFile **files); /* fills files (at most 8), returns how many */
    const char *missing_hint;                /* after the messages naming those that are missing */
    void (*print)(void); /* its --print-toolchain lines (libraries, kernel compiler), or NULL */
    /* Compile the kernels' source b->cu_path into the C table of images `images`; NULL for a
     * target without kernels. Returns 0, or 1 after saying why not. */
    int (*compile_kernels)(const TcBuild *b, FILE *images);
    /* The link line of its trainer, run through b->link. */
    int (*link)(const TcBuild *b);
} Target;

/* Every target, the default (cpu) first, ending with NULL. */
extern const Target *const targets[];
extern const Target target_cpu, target_cuda;

/* The target whose --backend name is `name`, or NULL. */
const Target *target_named(const char *name);

/* toolchain.c: the shared toolchain and every target's libraries, found on the first call;
 * cpu_level 0 is the highest level this machine runs. */
const Toolchain *toolchain(const char *cc, const char *runtime_dir, const char *opt_level, int werror, int cpu_level);
/* 0 when the runtime and every file a trainer of target `tg` links are there (tg NULL: the
 * shared ones); else says which is missing, where it looked and what to do, and returns 1. */
int toolchain_check(const Toolchain *t, const Target *tg);
/* --print-toolchain: netc's version and folder, then one line per tool of every target: where
 * it was found, or where netc looked. */
void toolchain_print(const Toolchain *t, const char *version);

/* A distributed trainer's link line: argv[n ..] gets libnetrt_mpi.a (before libnetrt.a, which it
 * calls) and the build's MPI libraries, at most up to argv[max - 1]; the new n, or -1 after
 * saying what is missing. */
int tc_add_mpi(const Toolchain *t, char **argv, int n, int max);

/* Helpers for the targets' searches and link lines. */
int tc_is_file(const char *path);
int tc_add_dir(const char **dirs, int n, const char *dir);
int tc_find_file(ToolFile *f, const char *what, const char *const *dirs, int n_dirs, const char *const *names,
                 int n_names);
const char *tc_env_dir(char *buf, size_t size, const char *var, const char *suffix);
const char *tc_dir_of(char *buf, size_t size, const char *path);
char *tc_cat3(char *buf, size_t size, const char *a, const char *b, const char *c);
void tc_rpath_of(char *buf, size_t size, const char *lib);
void tc_print_file(const char *label, const ToolFile *f);

#endif
