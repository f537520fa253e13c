/* toolchain.c - where the trainer's compiler, headers and libraries are (see toolchain.h).
 *
 * netc may run far from the tree it was built in (tests/gpu/pack.sh carries it to a GPU
 * machine), so nothing below is taken on trust from the build: every file is looked up, the
 * first place that has it wins, and `netc --print-toolchain` says which. The runtime comes from
 * --runtime-dir, $NETC_RUNTIME_DIR, a `runtime/` folder beside the netc executable, or the build
 * tree (whose headers and libraries live apart). cJSON, which libnetrt uses, comes from the
 * runtime folder (a pack brings a copy) or the build. Each target then looks up its own
 * libraries (target_*.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "netrt.h"
#include "toolchain.h"

const Target *const targets[] = {&target_cpu, &target_cuda, NULL};

const Target *target_named(const char *name) {
    for (int i = 0; targets[i]; i++)
        if (strcmp(targets[i]->cg->name, name) == 0) return targets[i];
    return NULL;
}

int tc_add_mpi(const Toolchain *t, char **argv, int n, int max) {
#ifdef NETC_HAVE_MPI
    static char lib_mpi[TC_PATH + 16], mpi_libs[sizeof NETC_MPI_LIBRARY]; /* argv points into them */
    memcpy(mpi_libs, NETC_MPI_LIBRARY, sizeof mpi_libs); /* the library paths, blank-separated */
    argv[n++] = tc_cat3(lib_mpi, sizeof lib_mpi, "", t->rt_lib, "/libnetrt_mpi.a");
    if (access(lib_mpi, R_OK) != 0) {
        fprintf(stderr, "netc: error: --distributed: the runtime folder %s has no libnetrt_mpi.a\n"
                        "  hint: copy it there from the build's runtime/ folder, or name another with "
                        "--runtime-dir\n", t->rt_lib);
        return -1;
    }
    for (char *p = strtok(mpi_libs, " "); p && n < max; p = strtok(NULL, " ")) argv[n++] = p;
    return n;
#else
    (void)t, (void)argv, (void)n, (void)max;
    fprintf(stderr, "netc: error: --distributed: this netc was built without MPI\n");
    return -1;
#endif
}

int tc_is_file(const char *path) {
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
int tc_add_dir(const char **dirs, int n, const char *dir) {
    if (dir && *dir && n < TC_DIRS) dirs[n++] = dir;
    return n;
}

/* The first DIR/NAME (names in order of preference) that exists, into f; else f->tried lists
 * the folders. Returns 1 when found. */
int tc_find_file(ToolFile *f, const char *what, const char *const *dirs, int n_dirs, const char *const *names,
                 int n_names) {
    static char tried[8][TC_DIRS * 256];
    static int slot;
    char *t = tried[slot++ % 8];
    *t = 0;
    f->what = what, f->path[0] = 0, f->tried = t;
    for (int d = 0; d < n_dirs; d++) {
        for (int k = 0; k < n_names; k++) {
            snprintf(f->path, sizeof f->path, "%s/%s", dirs[d], names[k]);
            if (tc_is_file(f->path)) return 1;
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
static void find_runtime(const char *runtime_dir, Toolchain *t) {
    const char *env = getenv("NETC_RUNTIME_DIR");
    if (runtime_dir) return set_runtime(t, runtime_dir, runtime_dir, "--runtime-dir");
    if (env && *env) return set_runtime(t, env, env, "$NETC_RUNTIME_DIR");
    char beside[TC_PATH], hdr[TC_PATH + 16], lib[TC_PATH + 16];
    exe_dir(beside, sizeof beside);
    size_t n = strlen(beside);
    snprintf(beside + n, sizeof beside - n, "/runtime");
    snprintf(hdr, sizeof hdr, "%s/netrt.h", beside);
    if (tc_is_file(hdr)) return set_runtime(t, beside, beside, "beside netc");
    snprintf(hdr, sizeof hdr, "%s/netrt.h", NETC_RT_INCLUDE_DIR);
    snprintf(lib, sizeof lib, "%s/libnetrt.a", NETC_RT_LIB_DIR);
    snprintf(t->rt_tried, sizeof t->rt_tried, "%s, the build tree (%s, %s)", beside, NETC_RT_INCLUDE_DIR,
             NETC_RT_LIB_DIR);
    set_runtime(t, NETC_RT_INCLUDE_DIR, NETC_RT_LIB_DIR, tc_is_file(hdr) && tc_is_file(lib) ? "the build tree" : NULL);
}

/* A $VAR's value with `suffix` appended, in a buffer of its own (NULL when VAR is unset). */
const char *tc_env_dir(char *buf, size_t size, const char *var, const char *suffix) {
    const char *v = getenv(var);
    if (!v || !*v) return NULL;
    snprintf(buf, size, "%s%s", v, suffix);
    return buf;
}

/* The folder of a file path, in a buffer of its own. */
const char *tc_dir_of(char *buf, size_t size, const char *path) {
    snprintf(buf, size, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
    return buf;
}

/* The trainer's C is compiled with -Werror only when asked (--werror, as CI does): another
 * compiler version may warn where the one netc was tested with does not. Every target's
 * libraries are looked up too, so that --print-toolchain can say where they all are. */
const Toolchain *toolchain(const char *cc, const char *runtime_dir, const char *opt_level, int werror, int cpu_level) {
    static Toolchain t; /* one per run: the options do not change */
    static int done;
    if (done) return &t;
    done = 1;
    const char *env_cc = getenv("CC");
    t.cc = cc ? cc : env_cc && *env_cc ? env_cc : NETC_CC;
    t.cc_from = cc ? "--cc" : env_cc && *env_cc ? "$CC" : "the compiler netc was built with";
    snprintf(t.opt, sizeof t.opt, "-O%s", opt_level);
    t.werror = werror ? "-Werror" : "-Wno-error";
    t.cpu_level = cpu_level ? cpu_level : rt_cpu_host_level();
    t.cpu_from = cpu_level ? "--cpu" : "this machine's; --cpu chooses another";
    if (t.cpu_level > 1) {
        snprintf(t.cpu_march, sizeof t.cpu_march, "-march=%s", rt_cpu_level_name(t.cpu_level));
        snprintf(t.cpu_lib, sizeof t.cpu_lib, "libnetrt-%s.a", rt_cpu_level_name(t.cpu_level));
    } else {
        snprintf(t.cpu_lib, sizeof t.cpu_lib, "libnetrt.a");
    }
    find_runtime(runtime_dir, &t);
    char build_lib[TC_PATH];

    /* cJSON: a copy in the runtime folder (a pack brings one), else the build's. */
    const char *dirs[TC_DIRS];
    int n = tc_add_dir(dirs, 0, t.rt_lib);
    n = tc_add_dir(dirs, n, tc_dir_of(build_lib, sizeof build_lib, NETC_CJSON_LIBRARY));
    const char *cjson[] = {"libcjson.so", "libcjson.so.1"};
    tc_find_file(&t.cjson, "libcjson", dirs, n, cjson, 2);
    for (int i = 0; targets[i]; i++)
        if (targets[i]->find) targets[i]->find(&t);
    return &t;
}

/* 0 when `dir`/`name` (dir: the runtime's headers or libraries) is there; else says so. */
static int need_runtime_file(const Toolchain *t, const char *dir, const char *folder, const char *name) {
    char p[TC_PATH + 32];
    snprintf(p, sizeof p, "%s%s%s/%s", dir, folder ? "/" : "", folder ? folder : "", name);
    if (tc_is_file(p)) return 0;
    fprintf(stderr, "netc: error: the runtime (%s, from %s) has no %s\n"
                    "  hint: name a complete runtime folder with --runtime-dir DIR or $NETC_RUNTIME_DIR\n",
            dir, t->rt_from, p);
    return 1;
}

/* The runtime folders: netrt.h and libnetrt.a, then the target's own header and library. */
static int check_runtime(const Toolchain *t, const Target *tg) {
    if (!t->rt_from) {
        fprintf(stderr, "netc: error: cannot find netc's runtime (netrt.h, libnetrt.a): looked in %s\n"
                        "  hint: name its folder with --runtime-dir DIR or $NETC_RUNTIME_DIR\n", t->rt_tried);
        return 1;
    }
    if (need_runtime_file(t, t->rt_include, NULL, "netrt.h") || need_runtime_file(t, t->rt_lib, NULL, "libnetrt.a"))
        return 1;
    char cpu_lib[TC_PATH + 48];
    if (tg == &target_cpu && !tc_is_file(tc_cat3(cpu_lib, sizeof cpu_lib, t->rt_lib, "/", t->cpu_lib))) {
        fprintf(stderr, "netc: error: the runtime (%s, from %s) has no %s, its build for %s CPUs (%s)\n"
                        "  hint: copy it there from the build's runtime/ folder, or compile the trainer for every "
                        "x86-64 CPU with --cpu x86-64\n",
                t->rt_lib, t->rt_from, t->cpu_lib, rt_cpu_level_name(t->cpu_level), t->cpu_from);
        return 1;
    }
    if (!tg || !tg->runtime_folder) return 0;
    return need_runtime_file(t, t->rt_include, tg->runtime_folder, tg->runtime_header) ||
           need_runtime_file(t, t->rt_lib, tg->runtime_folder, tg->runtime_library);
}

int toolchain_check(const Toolchain *t, const Target *tg) {
    if (check_runtime(t, tg)) return 1;
    const ToolFile *files[9] = {&t->cjson};
    int n = 1 + (tg && tg->libraries ? tg->libraries(files + 1) : 0), rc = 0;
    for (int i = 0; i < n; i++)
        if (!files[i]->path[0]) {
            fprintf(stderr, "netc: error: cannot find %s: looked in %s\n", files[i]->what, files[i]->tried);
            rc = 1;
        }
    if (rc && tg && tg->missing_hint) fprintf(stderr, "  hint: %s\n", tg->missing_hint);
    return rc;
}

/* buf = a b c; a path too long for buf is left empty, and the compiler then names it missing. */
char *tc_cat3(char *buf, size_t size, const char *a, const char *b, const char *c) {
    if ((size_t)snprintf(buf, size, "%s%s%s", a, b, c) >= size) buf[0] = 0;
    return buf;
}

/* -Wl,-rpath,DIR for the folder of a shared library, so the trainer finds it where netc did. */
void tc_rpath_of(char *buf, size_t size, const char *lib) {
    char dir[TC_PATH];
    snprintf(buf, size, "-Wl,-rpath,%s", tc_dir_of(dir, sizeof dir, lib));
}

/* One line per tool: where it was found, or MISSING and where netc looked. */
void tc_print_file(const char *label, const ToolFile *f) {
    if (f->path[0]) printf("%-18s %s\n", label, f->path);
    else printf("%-18s MISSING (looked in %s)\n", label, f->tried);
}

void toolchain_print(const Toolchain *t, const char *version) {
    char self[TC_PATH];
    exe_dir(self, sizeof self);
    printf("netc %s in %s\n", version, self);
    printf("%-18s %s (%s)\n", "C compiler", t->cc, t->cc_from);
    if (t->rt_from) printf("%-18s %s (%s)\n", "runtime", t->rt_lib, t->rt_from);
    else printf("%-18s MISSING (looked in %s)\n", "runtime", t->rt_tried);
    if (t->rt_from && strcmp(t->rt_include, t->rt_lib)) printf("%-18s %s\n", "runtime headers", t->rt_include);
    printf("%-18s %s (%s), runtime %s\n", "CPU level", rt_cpu_level_name(t->cpu_level), t->cpu_from,
           t->cpu_lib);
    tc_print_file("cJSON", &t->cjson);
    for (int i = 0; targets[i]; i++) {
        if (targets[i]->unavailable) printf("%-18s not built (%s)\n", targets[i]->label, targets[i]->unavailable);
        else if (targets[i]->print) targets[i]->print();
    }
    fflush(stdout);
}
