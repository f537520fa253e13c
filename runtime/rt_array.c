/* rt_array.c - data files as arrays: NumPy .npy (memory-mapped, or gzipped and inflated) and IDX (the MNIST family;
 * plain or gzipped, decompressed through zlib).
 *
 * .npy: magic "\x93NUMPY", version 1.x (2-byte header length) or 2.x/3.x (4-byte), then a
 * Python dict literal with 'descr', 'fortran_order' and 'shape'. Only C order, little-endian
 * (or byte-sized) element types are accepted.
 * A gzipped .npy (recognised by content: gzip data that inflates to the .npy magic) is inflated
 * into memory and read the same way.
 * IDX: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64),
 * the number of dimensions, then each dimension as a big-endian u32; elements big-endian.
 * Every size is checked against the file's length before anything is read.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt_internal.h"

int rt_fail(RtError *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int rt_parse_finite(const char *text, double *v) {
    char *end;
    errno = 0;
    *v = strtod(text, &end);
    return !*text || *end || errno || !isfinite(*v) ? -1 : 0;
}

int rt_read_text(const char *path, char **text, RtError *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return rt_fail(err, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    int failed = buf ? ferror(f) : 0;
    fclose(f);
    if (!buf) return rt_fail(err, "%s: out of memory reading the file", path);
    if (failed) {
        free(buf);
        return rt_fail(err, "%s: cannot read", path);
    }
    buf[n] = 0;
    *text = buf;
    return 0;
}

void *rt_alloc(size_t bytes, const char *what) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %zu bytes for %s\n", bytes, what);
        exit(1);
    }
    return memset(p, 0, bytes);
}

/* ---- guarded copies out of mappings (rt_internal.h: rt_guard_arm) */

static _Thread_local sigjmp_buf *volatile guard_jmp;
static _Thread_local const char *volatile guard_path;
static struct sigaction sigbus_before;

static void on_sigbus(int sig, siginfo_t *info, void *uc) {
    (void)info, (void)uc;
    if (guard_jmp) siglongjmp(*guard_jmp, 1);
    /* not a guarded copy: back to the handler before ours, which the access then meets again */
    sigaction(sig, &sigbus_before, NULL);
}

/* At every mapping, unless the handler is ours already (another library may have replaced it
 * since; the handler before ours keeps every SIGBUS outside a guard). */
static void install_sigbus(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    struct sigaction sa;
    pthread_mutex_lock(&mu);
    if (sigaction(SIGBUS, NULL, &sa) == 0 && (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == on_sigbus) {
        pthread_mutex_unlock(&mu);
        return;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &sigbus_before);
    pthread_mutex_unlock(&mu);
}

void rt_guard_arm(sigjmp_buf *jb, const char *path) {
    guard_path = path;
    guard_jmp = jb;
}

void rt_guard_disarm(void) {
    guard_jmp = NULL;
}

int rt_guard_failed(RtError *err) {
    guard_jmp = NULL;
    return rt_fail(err, "%s: the file shrank while the trainer was reading it (its mapped pages are gone)\n"
                        "  hint: a data file must not change while a trainer uses it; write a new file and "
                        "rename it over the old one instead", guard_path);
}

int rt_array_unchanged(const RtArray *a, RtError *err) {
    struct stat st;
    if (!a->mapping) return 0;
    if (fstat(a->fd, &st) != 0) return rt_fail(err, "%s: cannot stat: %s", a->path, strerror(errno));
    int64_t mtime = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if ((size_t)st.st_size != a->mapping_len || mtime != a->mtime_ns)
        return rt_fail(err, "%s: the file changed while the trainer was using it (%s)\n"
                            "  hint: a data file must not change while a trainer uses it; write a new file and "
                            "rename it over the old one instead", a->path,
                       (size_t)st.st_size != a->mapping_len ? "its size changed" : "it was modified");
    return 0;
}

static const int type_size[] = {
    [RT_FILE_U8] = 1, [RT_FILE_I8] = 1,  [RT_FILE_I16] = 2, [RT_FILE_I32] = 4,
    [RT_FILE_I64] = 8, [RT_FILE_F16] = 2, [RT_FILE_F32] = 4, [RT_FILE_F64] = 8,
};

const char *rt_file_type_name(RtFileType t) {
    static const char *const names[] = {"u8", "i8", "i16", "i32", "i64", "f16", "f32", "f64"};
    return names[t];
}

static uint64_t load_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

static uint64_t load_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

double rt_array_elem(const RtArray *a, int64_t i) {
    int n = type_size[a->type];
    const unsigned char *p = a->data + i * n;
    uint64_t bits = a->big_endian ? load_be(p, n) : load_le(p, n);
    switch (a->type) {
    case RT_FILE_U8: return (double)(uint8_t)bits;
    case RT_FILE_I8: return (double)(int8_t)bits;
    case RT_FILE_I16: return (double)(int16_t)bits;
    case RT_FILE_I32: return (double)(int32_t)bits;
    case RT_FILE_I64: return (double)(int64_t)bits;
    case RT_FILE_F16: return rt_f16_to_f32((uint16_t)bits);
    case RT_FILE_F32: {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, sizeof f);
        return f;
    }
    case RT_FILE_F64: {
        double d;
        memcpy(&d, &bits, sizeof d);
        return d;
    }
    }
    return 0;
}

/* Check the shape and set sample_elems; `avail` is the number of element bytes present. */
static int finish_shape(RtArray *a, size_t avail, RtError *err) {
    if (a->rank < 1) return rt_fail(err, "%s: a data file needs at least one axis (the samples)", a->path);
    int64_t total = 1;
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] < 0 || (a->shape[i] && total > INT64_MAX / 16 / a->shape[i]))
            return rt_fail(err, "%s: the shape in the header is too large", a->path);
        total *= a->shape[i];
    }
    a->sample_elems = 1;
    for (int i = 1; i < a->rank; i++) a->sample_elems *= a->shape[i];
    if ((uint64_t)total * (uint64_t)type_size[a->type] > avail)
        return rt_fail(err, "%s: truncated: the header promises %lld elements (%lld bytes) but the file holds %zu bytes of data",
                       a->path, (long long)total, (long long)(total * type_size[a->type]), avail);
    return 0;
}

/* ---- .npy */

static int npy_descr(const char *h, RtArray *a, RtError *err) {
    static const struct {
        const char *descr;
        RtFileType type;
    } types[] = {{"|u1", RT_FILE_U8}, {"|i1", RT_FILE_I8}, {"<i2", RT_FILE_I16}, {"<i4", RT_FILE_I32},
                 {"<i8", RT_FILE_I64}, {"<f2", RT_FILE_F16}, {"<f4", RT_FILE_F32}, {"<f8", RT_FILE_F64},
                 {"<u1", RT_FILE_U8}, {"<i1", RT_FILE_I8}};
    const char *d = strstr(h, "'descr'");
    if (!d || !(d = strchr(d + 7, '\''))) return rt_fail(err, "%s: .npy header has no 'descr'", a->path);
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strncmp(d + 1, types[i].descr, 3) == 0 && d[4] == '\'') {
            a->type = types[i].type;
            return 0;
        }
    const char *end = strchr(d + 1, '\'');
    return rt_fail(err, "%s: unsupported element type '%.*s' (supported: u1 i1 i2 i4 i8 f2 f4 f8, little-endian)",
                   a->path, end ? (int)(end - d - 1) : 8, d + 1);
}

static int npy_shape(const char *h, RtArray *a, RtError *err) {
    const char *s = strstr(h, "'shape'");
    if (!s || !(s = strchr(s, '('))) return rt_fail(err, "%s: .npy header has no 'shape'", a->path);
    a->rank = 0;
    for (s++; *s && *s != ')';) {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || a->rank == RT_MAX_RANK + 1)
            return rt_fail(err, "%s: cannot read the shape in the .npy header", a->path);
        a->shape[a->rank++] = v;
        s = end;
        while (*s == 'L' || *s == ' ') s++;
    }
    if (*s != ')') return rt_fail(err, "%s: cannot read the shape in the .npy header", a->path);
    return 0;
}

static int npy_load(RtArray *a, const unsigned char *p, size_t len, RtError *err) {
    if (len < 10) return rt_fail(err, "%s: truncated .npy file", a->path);
    int v4 = p[6] >= 2;
    size_t hlen = v4 ? (size_t)load_le(p + 8, 4) : (size_t)load_le(p + 8, 2);
    size_t start = (v4 ? 12 : 10);
    if (hlen > len - start || (v4 && len < 12)) return rt_fail(err, "%s: truncated .npy header", a->path);
    char *h = strndup((const char *)p + start, hlen);
    int rc = npy_descr(h, a, err);
    if (!rc && strstr(h, "'fortran_order': True"))
        rc = rt_fail(err, "%s: Fortran-ordered arrays are not supported; save with np.ascontiguousarray", a->path);
    if (!rc) rc = npy_shape(h, a, err);
    free(h);
    if (rc) return rc;
    a->data = p + start + hlen;
    return finish_shape(a, len - start - hlen, err);
}

/* ---- IDX */

/* The element bytes an IDX header (its 4 + 4 * rank bytes) declares, with overflow checked. */
static int idx_declared_bytes(RtArray *a, const unsigned char *head, size_t *bytes, RtError *err) {
    static const int sizes[] = {[0x08] = 1, [0x09] = 1, [0x0B] = 2, [0x0C] = 4, [0x0D] = 4, [0x0E] = 8};
    uint64_t n = head[2] < sizeof sizes / sizeof *sizes ? (uint64_t)sizes[head[2]] : 0;
    if (!n) return rt_fail(err, "%s: unknown IDX element type 0x%02x", a->path, head[2]);
    for (int i = 0; i < head[3]; i++)
        if (__builtin_mul_overflow(n, load_be(head + 4 + 4 * i, 4), &n) || n > (uint64_t)INT64_MAX / 16)
            return rt_fail(err, "%s: the shape in the IDX header is too large", a->path);
    *bytes = (size_t)n;
    return 0;
}

static int idx_load(RtArray *a, const unsigned char *p, size_t len, RtError *err) {
    static const struct {
        int code;
        RtFileType type;
    } codes[] = {{0x08, RT_FILE_U8}, {0x09, RT_FILE_I8}, {0x0B, RT_FILE_I16},
                 {0x0C, RT_FILE_I32}, {0x0D, RT_FILE_F32}, {0x0E, RT_FILE_F64}};
    if (len < 4 || p[0] || p[1]) return rt_fail(err, "%s: not an IDX file (bad magic number)", a->path);
    int found = 0;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        if (codes[i].code == p[2]) a->type = codes[i].type, found = 1;
    if (!found) return rt_fail(err, "%s: unknown IDX element type 0x%02x", a->path, p[2]);
    a->rank = p[3];
    if (a->rank < 1 || a->rank > RT_MAX_RANK + 1)
        return rt_fail(err, "%s: IDX file with %d dimensions (1 to %d supported)", a->path, a->rank, RT_MAX_RANK + 1);
    if (len < 4 + 4 * (size_t)a->rank) return rt_fail(err, "%s: truncated IDX header", a->path);
    for (int i = 0; i < a->rank; i++) a->shape[i] = (int64_t)load_be(p + 4 + 4 * i, 4);
    a->big_endian = 1;
    a->data = p + 4 + 4 * a->rank;
    return finish_shape(a, len - 4 - 4 * (size_t)a->rank, err);
}

/* gzread exactly n bytes into buf (n may exceed what one gzread call takes); -1 with the message
 * on corrupt data, else the bytes read, fewer than n at the end of the stream. */
static int64_t gz_read_exact(gzFile f, const char *path, unsigned char *buf, size_t n, RtError *err) {
    size_t done = 0;
    while (done < n) {
        size_t want = n - done > (1u << 30) ? (1u << 30) : n - done;
        int got = gzread(f, buf + done, (unsigned)want);
        if (got < 0) {
            int code;
            return rt_fail(err, "%s: corrupt compressed data: %s", path, gzerror(f, &code));
        }
        if (got == 0) break;
        done += (size_t)got;
    }
    return (int64_t)done;
}

/* Read the `need` element bytes a header declared into dst, and one byte more to see whether the
 * stream goes on: a file holding fewer or more is refused. `format` names the header. */
static int gz_read_declared(gzFile f, const char *path, unsigned char *dst, size_t need, const char *format,
                            RtError *err) {
    int64_t got = gz_read_exact(f, path, dst, need + 1, err);
    if (got < 0) return -1;
    if ((size_t)got < need)
        return rt_fail(err, "%s: truncated: the %s header declares %zu bytes of elements but the file holds %lld", path,
                       format, need, (long long)got);
    if ((size_t)got > need)
        return rt_fail(err, "%s: holds more data than the %zu bytes of elements its %s header declares", path, need,
                       format);
    return 0;
}

/* The end of reading a compressed file into buf (total bytes) with status rc so far: close it,
 * then hand buf over, or free it on an error, the close's own included (Z_BUF_ERROR: the
 * stream ended early, i.e. a truncated file). */
static int gz_finish(gzFile f, const char *path, int rc, unsigned char *buf, size_t total, unsigned char **out,
                     size_t *len, RtError *err) {
    int closed = gzclose(f);
    if (!rc && closed != Z_OK) rc = rt_fail(err, "%s: corrupt or truncated compressed data", path);
    if (rc) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = total;
    return 0;
}

/* Read an IDX file, plain or gzipped (gzread passes a plain file through), inflating only what
 * its header declares: the header first, then exactly the element bytes it promises into one
 * allocation of that size, then a check that the stream ends there. A small file that inflates
 * far beyond its header is refused after one byte more than it declares, not read whole. A plain
 * file's length is checked against the header before anything is allocated. */
static int idx_read(RtArray *a, off_t file_size, unsigned char **out, size_t *len, RtError *err) {
    gzFile f = gzopen(a->path, "rb");
    if (!f) return rt_fail(err, "%s: cannot open: %s", a->path, strerror(errno));
    unsigned char head[4 + 4 * (RT_MAX_RANK + 1)];
    unsigned char *buf = NULL;
    size_t hlen = 4, need = 0;
    int64_t got = gz_read_exact(f, a->path, head, 4, err);
    int rc = got < 0 ? -1 : 0;
    if (!rc && (got < 4 || head[0] || head[1])) rc = rt_fail(err, "%s: not an IDX file (bad magic number)", a->path);
    if (!rc && (head[3] < 1 || head[3] > RT_MAX_RANK + 1))
        rc = rt_fail(err, "%s: IDX file with %d dimensions (1 to %d supported)", a->path, head[3], RT_MAX_RANK + 1);
    if (!rc) {
        hlen = 4 + 4 * (size_t)head[3];
        got = gz_read_exact(f, a->path, head + 4, hlen - 4, err);
        if (got >= 0 && (size_t)got < hlen - 4) rc = rt_fail(err, "%s: truncated IDX header", a->path);
        else if (got < 0) rc = -1;
    }
    if (!rc) rc = idx_declared_bytes(a, head, &need, err);
    if (!rc && gzdirect(f) && (uint64_t)file_size != hlen + need)
        rc = rt_fail(err, "%s: the IDX header declares %zu bytes of elements but the file holds %lld",
                     a->path, need, (long long)file_size - (long long)hlen);
    if (!rc && !(buf = malloc(hlen + need + 1)))
        rc = rt_fail(err, "%s: out of memory for the %zu bytes its IDX header declares", a->path, hlen + need);
    if (!rc) {
        memcpy(buf, head, hlen);
        rc = gz_read_declared(f, a->path, buf + hlen, need, "IDX", err);
    }
    return gz_finish(f, a->path, rc, buf, hlen + need, out, len, err);
}

/* ---- .npy.gz
 *
 * A gzipped .npy is inflated as an IDX file is: the preamble and header first, then exactly the
 * element bytes the header declares into one allocation, then a check that the stream ends
 * there. The whole file in memory is then read by npy_load, as a mapped .npy is. */

static int gz_is_npy(const char *path) {
    gzFile f = gzopen(path, "rb");
    unsigned char magic[6] = {0};
    int is = f && gzread(f, magic, 6) == 6 && !gzdirect(f) && memcmp(magic, "\x93NUMPY", 6) == 0;
    if (f) gzclose(f);
    return is;
}

/* The element bytes a .npy header declares, with overflow checked. */
static int npy_declared_bytes(RtArray *a, const char *h, size_t *bytes, RtError *err) {
    if (npy_descr(h, a, err) || npy_shape(h, a, err)) return -1;
    uint64_t n = (uint64_t)type_size[a->type];
    for (int i = 0; i < a->rank; i++)
        if (__builtin_mul_overflow(n, (uint64_t)a->shape[i], &n) || n > (uint64_t)INT64_MAX / 16)
            return rt_fail(err, "%s: the shape in the header is too large", a->path);
    *bytes = (size_t)n;
    return 0;
}

/* The preamble (*start bytes) and header of a gzipped .npy into a new allocation *buf of *head
 * bytes, plus a NUL after the header's text. */
static int npy_gz_header(gzFile f, const char *path, unsigned char **buf, size_t *start_out, size_t *head,
                         RtError *err) {
    unsigned char pre[12];
    size_t start = 10;
    int64_t got = gz_read_exact(f, path, pre, 10, err);
    if (got == 10 && pre[6] >= 2) { /* versions 2 and 3: a 4-byte header length */
        int64_t more = gz_read_exact(f, path, pre + 10, 2, err);
        start = 12, got = more < 0 ? -1 : 10 + more;
    }
    if (got < 0) return -1;
    if ((size_t)got < start) return rt_fail(err, "%s: truncated .npy header", path);
    size_t hlen = start == 12 ? (size_t)load_le(pre + 8, 4) : (size_t)load_le(pre + 8, 2);
    if (!(*buf = malloc(start + hlen + 1))) return rt_fail(err, "%s: out of memory for its .npy header", path);
    memcpy(*buf, pre, start);
    got = gz_read_exact(f, path, *buf + start, hlen, err);
    if (got < 0 || (size_t)got < hlen) {
        free(*buf);
        return got < 0 ? -1 : rt_fail(err, "%s: truncated .npy header", path);
    }
    (*buf)[start + hlen] = 0;
    *start_out = start, *head = start + hlen;
    return 0;
}

static int npy_gz_read(RtArray *a, unsigned char **out, size_t *len, RtError *err) {
    gzFile f = gzopen(a->path, "rb");
    if (!f) return rt_fail(err, "%s: cannot open: %s", a->path, strerror(errno));
    unsigned char *buf = NULL, *grown = NULL;
    size_t start = 0, head = 0, need = 0;
    int rc = npy_gz_header(f, a->path, &buf, &start, &head, err);
    if (!rc) rc = npy_declared_bytes(a, (const char *)buf + start, &need, err);
    if (!rc && !(grown = realloc(buf, head + need + 1)))
        rc = rt_fail(err, "%s: out of memory for the %zu bytes its .npy header declares", a->path, need);
    if (grown) buf = grown;
    if (!rc) rc = gz_read_declared(f, a->path, buf + head, need, ".npy", err);
    return gz_finish(f, a->path, rc, buf, head + need, out, len, err);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int rt_array_load(const char *path, RtArray *a, RtError *err) {
    memset(a, 0, sizeof *a);
    a->path = strdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return rt_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    unsigned char magic[6] = {0};
    ssize_t got = fstat(fd, &st) == 0 ? pread(fd, magic, sizeof magic, 0) : -1;
    if (got < 0 || S_ISDIR(st.st_mode)) {
        close(fd);
        return rt_fail(err, "%s: cannot read: %s", path, got < 0 ? strerror(errno) : "is a directory");
    }
    if (ends_with(path, ".csv")) {
        close(fd);
        return rt_csv_load(path, a, err);
    }
    if (got == 6 && memcmp(magic, "\x93NUMPY", 6) == 0) {
        void *m = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (m == MAP_FAILED) {
            close(fd);
            return rt_fail(err, "%s: cannot map: %s", path, strerror(errno));
        }
        install_sigbus();
        a->mapping = m;
        a->mapping_len = (size_t)st.st_size;
        a->fd = fd;
        a->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        /* the header is read out of the mapping too */
        sigjmp_buf jb;
        if (sigsetjmp(jb, 1)) return rt_guard_failed(err);
        rt_guard_arm(&jb, a->path);
        int rc = npy_load(a, m, (size_t)st.st_size, err);
        rt_guard_disarm();
        return rc;
    }
    close(fd);
    if (ends_with(path, ".npy")) return rt_fail(err, "%s: not a .npy file (bad magic number)", path);
    unsigned char *buf = NULL;
    size_t len = 0;
    if (gz_is_npy(path)) {
        if (npy_gz_read(a, &buf, &len, err)) return -1;
        a->heap = buf;
        return npy_load(a, buf, len, err);
    }
    if (idx_read(a, st.st_size, &buf, &len, err)) return -1;
    a->heap = buf;
    return idx_load(a, buf, len, err);
}

void rt_array_free(RtArray *a) {
    if (a->mapping) munmap(a->mapping, a->mapping_len), close(a->fd);
    free(a->heap);
    free(a->path);
    memset(a, 0, sizeof *a);
}
