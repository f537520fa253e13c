/* rt_file.c - replacing a user's file safely, and telling files apart (see rt_file.h).
 *
 * Everything happens relative to the target's directory, held open: the temporary file is
 * created there with openat(O_CREAT | O_EXCL | O_NOFOLLOW) under a random name, so a planted
 * file or symbolic link of that name is never opened, truncated or followed (creation simply
 * tries another name), and a long path never shortens into the target's own name. Renaming and
 * removing use the same directory and the name this process created, and nothing else is ever
 * removed. The temporary files being written are registered so that a signal handler can
 * remove them (rt_out_abandon).
 */
#include "rt_file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LIVE = 8, RANDOM_CHARS = 12, CREATE_TRIES = 64 };

static void say(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
}

/* ---- paths */

/* Split path into its directory (a new string) and its last component (pointing into path).
 * NULL with why set when the path cannot name a file. */
static char *split(const char *path, const char **name, char *why, size_t size) {
    size_t n = strlen(path);
    if (n == 0) return say(why, size, "no file name was given"), NULL;
    if (path[n - 1] == '/') return say(why, size, "it names a directory (it ends in '/')"), NULL;
    const char *slash = strrchr(path, '/');
    *name = slash ? slash + 1 : path;
    if (strcmp(*name, ".") == 0 || strcmp(*name, "..") == 0) return say(why, size, "it is a directory"), NULL;
    if (strlen(*name) > NAME_MAX) return say(why, size, "%s", strerror(ENAMETOOLONG)), NULL;
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) say(why, size, "%s", strerror(ENOMEM));
    return dir;
}

/* What kind of file st is, in words, for a target that is not a regular file. */
static const char *kind(const struct stat *st) {
    if (S_ISLNK(st->st_mode)) return "a symbolic link (name the file it points to)";
    if (S_ISDIR(st->st_mode)) return "a directory";
    if (S_ISCHR(st->st_mode)) return "a character device";
    if (S_ISBLK(st->st_mode)) return "a block device";
    if (S_ISFIFO(st->st_mode)) return "a named pipe";
    if (S_ISSOCK(st->st_mode)) return "a socket";
    return "not a regular file";
}

/* The target `name` in dir: absent, or a regular file. */
static int check_target(int dir, const char *name, char *why, size_t size) {
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : (say(why, size, "%s", strerror(errno)), -1);
    if (S_ISREG(st.st_mode)) return 0;
    snprintf(why, size, "it is %s, and only a regular file is ever replaced", kind(&st));
    return -1;
}

int rt_out_check(const char *path, char *why, size_t size) {
    const char *name;
    char *dir_path = split(path, &name, why, size);
    if (!dir_path) return -1;
    int dir = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = dir < 0 ? -1 : check_target(dir, name, why, size);
    if (dir < 0) snprintf(why, size, "its directory '%s': %s", dir_path, strerror(errno));
    else close(dir);
    free(dir_path);
    return rc;
}

/* ---- the outputs being written, for rt_out_abandon() */

static RtOut *volatile live[MAX_LIVE];

static void enlist(RtOut *o) {
    atomic_signal_fence(memory_order_seq_cst); /* o->dir and o->tmp are complete first */
    for (int i = 0; i < MAX_LIVE; i++)
        if (!live[i]) {
            live[i] = o, o->slot = i;
            return;
        }
}

static void delist(RtOut *o) {
    if (o->slot >= 0) live[o->slot] = NULL;
    o->slot = -1;
    atomic_signal_fence(memory_order_seq_cst);
}

void rt_out_abandon(void) {
    for (int i = 0; i < MAX_LIVE; i++) {
        RtOut *o = live[i];
        if (o && o->tmp[0]) unlinkat(o->dir, o->tmp, 0);
    }
}

/* ---- writing */

/* RANDOM_CHARS letters and digits from the kernel's generator (a clock-and-counter mix if it
 * cannot be read): the name is not predictable, and O_EXCL makes a collision harmless anyway. */
static void random_suffix(char *out) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static unsigned counter;
    unsigned char bytes[RANDOM_CHARS];
    if (getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != (ssize_t)sizeof bytes) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long x = (unsigned long long)ts.tv_nsec ^ (unsigned long long)getpid() << 32 ^ ++counter;
        for (int i = 0; i < RANDOM_CHARS; i++) x = x * 6364136223846793005ull + 1442695040888963407ull,
                                                 bytes[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < RANDOM_CHARS; i++) out[i] = alphabet[bytes[i] % (sizeof alphabet - 1)];
    out[RANDOM_CHARS] = '\0';
}

/* Create NAME.tmp.RANDOM in o->dir, NAME shortened so the whole is a valid file name. */
static int create_temporary(RtOut *o, mode_t mode) {
    int keep = (int)strlen(o->name), room = NAME_MAX - 5 - RANDOM_CHARS;
    if (keep > room) keep = room;
    for (int tries = 0; tries < CREATE_TRIES; tries++) {
        char suffix[RANDOM_CHARS + 1];
        random_suffix(suffix);
        snprintf(o->tmp, sizeof o->tmp, "%.*s.tmp.%s", keep, o->name, suffix);
        o->fd = openat(o->dir, o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (o->fd >= 0) return 0;
        if (errno != EEXIST) break;
    }
    say(o->why, sizeof o->why, "%s", strerror(errno));
    o->tmp[0] = '\0';
    return -1;
}

static void release(RtOut *o) {
    delist(o);
    if (o->f) fclose(o->f);
    else if (o->fd >= 0) close(o->fd);
    o->f = NULL, o->fd = -1;
    if (o->dir >= 0) close(o->dir);
    o->dir = -1;
}

int rt_out_open(RtOut *o, const char *path, mode_t mode) {
    *o = (RtOut){.dir = -1, .fd = -1, .slot = -1};
    const char *name;
    char *dir_path = split(path, &name, o->why, sizeof o->why);
    if (!dir_path) return -1;
    snprintf(o->name, sizeof o->name, "%s", name);
    o->dir = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (o->dir < 0) snprintf(o->why, sizeof o->why, "its directory '%s': %s", dir_path, strerror(errno));
    free(dir_path);
    if (o->dir < 0 || check_target(o->dir, o->name, o->why, sizeof o->why) || create_temporary(o, mode)) {
        release(o);
        return -1;
    }
    enlist(o);
    if (!(o->f = fdopen(o->fd, "wb"))) {
        say(o->why, sizeof o->why, "%s", strerror(errno));
        rt_out_abort(o);
        return -1;
    }
    return 0;
}

void rt_out_abort(RtOut *o) {
    if (o->f) fclose(o->f);
    else if (o->fd >= 0) close(o->fd);
    o->f = NULL, o->fd = -1;
    if (o->tmp[0]) unlinkat(o->dir, o->tmp, 0);
    release(o);
    o->tmp[0] = '\0';
}

int rt_out_commit(RtOut *o) {
    int bad = fflush(o->f) != 0 || fsync(o->fd) != 0;
    int saved = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, saved = errno;
    o->f = NULL, o->fd = -1;
    if (bad) {
        say(o->why, sizeof o->why, "%s", strerror(saved));
        rt_out_abort(o);
        return -1;
    }
    /* The target was checked when the output was opened; something else may have appeared there. */
    if (check_target(o->dir, o->name, o->why, sizeof o->why) != 0) {
        rt_out_abort(o);
        return -1;
    }
    if (renameat(o->dir, o->tmp, o->dir, o->name) != 0) {
        say(o->why, sizeof o->why, "%s", strerror(errno));
        rt_out_abort(o);
        return -1;
    }
    delist(o);
    o->tmp[0] = '\0';
    /* Some file systems cannot sync a directory (EINVAL); only an I/O error is a failure. */
    int rc = fsync(o->dir) != 0 && errno == EIO ? -1 : 0;
    if (rc) say(o->why, sizeof o->why, "syncing its directory: %s", strerror(EIO));
    release(o);
    return rc;
}

int rt_out_probe(const char *path, char *why, size_t size) {
    RtOut o;
    if (rt_out_open(&o, path, 0600) != 0) {
        snprintf(why, size, "%s", o.why);
        return -1;
    }
    rt_out_abort(&o);
    return 0;
}

int rt_out_copy(const char *src, const char *path, mode_t mode, char *why, size_t size) {
    FILE *in = fopen(src, "rb");
    if (!in) return snprintf(why, size, "cannot read '%s': %s", src, strerror(errno)), -1;
    RtOut o;
    if (rt_out_open(&o, path, mode) != 0) {
        snprintf(why, size, "%s", o.why);
        fclose(in);
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, o.f) != n) break;
    int bad = ferror(in) || ferror(o.f);
    int saved = errno;
    fclose(in);
    if (bad) {
        snprintf(why, size, "%s", strerror(saved));
        rt_out_abort(&o);
        return -1;
    }
    if (rt_out_commit(&o) != 0) return snprintf(why, size, "%s", o.why), -1;
    return 0;
}

/* ---- identity */

void rt_file_id(const char *path, int follow, RtFileId *id) {
    *id = (RtFileId){0};
    struct stat st;
    if ((follow ? stat(path, &st) : lstat(path, &st)) == 0) id->exists = 1, id->dev = st.st_dev, id->ino = st.st_ino;
    const char *name;
    char why[RT_WHY_MAX];
    char *dir = split(path, &name, why, sizeof why);
    if (dir && stat(dir, &st) == 0) {
        id->dir_known = 1, id->dir_dev = st.st_dev, id->dir_ino = st.st_ino;
        snprintf(id->name, sizeof id->name, "%s", name);
    }
    free(dir);
}

int rt_same_file(const RtFileId *a, const RtFileId *b) {
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    if (a->exists || b->exists) return 0;
    return a->dir_known && b->dir_known && a->dir_dev == b->dir_dev && a->dir_ino == b->dir_ino &&
           strcmp(a->name, b->name) == 0;
}
