/* rt_file.h - replacing a user's file safely: the one way netc and every trainer write an output
 * (weights, checkpoints, the trainer executable, the generated sources), and the identity checks
 * that keep an output from being one of the run's inputs.
 *
 * An output is written to a temporary file in the target's directory, created exclusively under
 * an unpredictable name (NAME.tmp.XXXXXXXXXXXX), flushed and fsync'ed, then renamed over the
 * target, and the directory is fsync'ed: the target is at every moment the old file or the
 * complete new one. A target that exists must be a regular file (never a symbolic link, a
 * directory or a device), and only the temporary file this process created is ever removed.
 * The functions return 0, or -1 with the reason in `why`; they print nothing. Used by libnetrt
 * and compiled into netc as well, so it depends on libc only.
 */
#ifndef NETRT_FILE_H
#define NETRT_FILE_H

#include <limits.h>
#include <stdio.h>
#include <sys/types.h>

enum { RT_WHY_MAX = 256 };

/* An output being written. */
typedef struct RtOut {
    int dir;                 /* the target's directory, open; -1 when none */
    char name[NAME_MAX + 1]; /* the target's name in dir */
    char tmp[NAME_MAX + 1];  /* the temporary file's name in dir; "" when there is none */
    int fd;                  /* the temporary file, -1 once closed */
    FILE *f;                 /* a stream on fd, for the caller's writes */
    int slot;                /* where rt_out_abandon() finds it, -1 when not registered */
    char why[RT_WHY_MAX];    /* the reason for the last failure */
} RtOut;

/* The target may be replaced: it is absent or a regular file (a symbolic link is refused, not
 * followed), and its directory exists. */
int rt_out_check(const char *path, char *why, size_t size);
/* Check the target and create the temporary file with permissions mode (less the umask). */
int rt_out_open(RtOut *o, const char *path, mode_t mode);
/* Flush, fsync and close the temporary file, rename it over the target, fsync the directory.
 * On failure the temporary file is removed and the target is as it was. Releases o. */
int rt_out_commit(RtOut *o);
/* Remove the temporary file and release o; the target is as it was. */
void rt_out_abort(RtOut *o);
/* Can an output be written to path? Creates and removes a temporary file beside it, exactly
 * as rt_out_open does; for refusing a run before its work rather than after. */
int rt_out_probe(const char *path, char *why, size_t size);
/* Write the contents of the file src to path through rt_out_open/rt_out_commit. */
int rt_out_copy(const char *src, const char *path, mode_t mode, char *why, size_t size);
/* Async-signal-safe: remove the temporary files of the outputs being written. */
void rt_out_abandon(void);

/* What a path names, to tell whether two paths are one file: the file's device and inode when
 * it exists, else its directory's and its name. */
typedef struct RtFileId {
    int exists;
    dev_t dev;
    ino_t ino;
    int dir_known;
    dev_t dir_dev;
    ino_t dir_ino;
    char name[NAME_MAX + 1];
} RtFileId;

/* follow: 1 to identify what a symbolic link points to (stat), 0 the link itself (lstat). */
void rt_file_id(const char *path, int follow, RtFileId *id);
int rt_same_file(const RtFileId *a, const RtFileId *b);

#endif
