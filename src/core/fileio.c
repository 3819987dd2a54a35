// fileio.c — bounded reads of regular input files and atomic (temp file + fsync + rename) writes.
#include "fileio.h"

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void set_err(char *err, size_t errlen, const char *what, int errnum) {
    if (err && errlen) snprintf(err, errlen, "%s: %s", what, strerror(errnum));
}

static void copy_err(char *err, size_t errlen, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
}

// ---------------------------------------------------------------------------
// AtomicFile

static void release(AtomicFile *af) {
    free(af->path);
    free(af->tmp_path);
    af->path = NULL;
    af->tmp_path = NULL;
    af->fp = NULL;
}

// Records the first failure, closes and removes the temp file.
static int fail(AtomicFile *af, const char *what, int errnum, char *err, size_t errlen) {
    snprintf(af->first_error, sizeof af->first_error, "%s: %s", what, strerror(errnum));
    copy_err(err, errlen, af->first_error);
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) remove(af->tmp_path);
    release(af);
    return -1;
}

int atomic_open(AtomicFile *af, const char *path, char *err, size_t errlen) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 32;
    af->path = mt_strdup(path);
    af->tmp_path = mt_malloc(n);
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp_path, "wb");
    if (!af->fp) {
        int e = errno;
        free(af->tmp_path);  // nothing was created, so nothing to remove
        af->tmp_path = NULL;
        return fail(af, "cannot create temporary file", e, err, errlen);
    }
    return 0;
}

int atomic_write(AtomicFile *af, const void *data, size_t len, char *err, size_t errlen) {
    if (!af->fp) {
        copy_err(err, errlen, af->first_error[0] ? af->first_error : "file is not open");
        return -1;
    }
    if (len && fwrite(data, 1, len, af->fp) != len) return fail(af, "write error", errno, err, errlen);
    return 0;
}

int atomic_commit(AtomicFile *af, char *err, size_t errlen) {
    if (!af->fp) return atomic_write(af, NULL, 0, err, errlen);
    if (fflush(af->fp) != 0) return fail(af, "write error", errno, err, errlen);
    if (fsync(fileno(af->fp)) != 0) return fail(af, "fsync failed", errno, err, errlen);
    FILE *fp = af->fp;
    af->fp = NULL;
    if (fclose(fp) != 0) return fail(af, "write error on close", errno, err, errlen);
    if (rename(af->tmp_path, af->path) != 0)
        return fail(af, "cannot rename temporary file into place", errno, err, errlen);
    fsync_dir_of(af->path);  // best effort: makes the rename itself durable
    release(af);
    return 0;
}

void atomic_abort(AtomicFile *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) remove(af->tmp_path);
    release(af);
}

// ---------------------------------------------------------------------------

int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen) {
    AtomicFile af;
    if (atomic_open(&af, path, err, errlen)) return -1;
    if (atomic_write(&af, data, len, err, errlen)) return -1;
    return atomic_commit(&af, err, errlen);
}

int fsync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) dir = mt_strdup(".");
    else if (slash == path) dir = mt_strdup("/");
    else {
        size_t n = (size_t)(slash - path);
        dir = mt_malloc(n + 1);
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    free(dir);
    if (fd < 0) return -1;
    int rc = fsync(fd) == 0 ? 0 : -1;
    close(fd);
    return rc;
}

// ---------------------------------------------------------------------------
// Input files

#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define TIB ((uint64_t)1 << 40)
#define READ_CHUNK_BYTES ((size_t)1 << 16)  // first buffer when the size is not known in advance

// The largest file of each kind, what it is called in messages, and what to do about one
// that is larger. Files read whole are bounded well below memory; mapped and streamed data
// files by the address space.
static const struct {
    uint64_t max_bytes;
    const char *what, *fix;
} INPUT_KINDS[] = {
    [INFILE_CONFIG] = {256 * MIB, "a JSON or tokenizer file", "check that the path names the intended file"},
    [INFILE_NOTE] = {4 * KIB, "a one-line text file", "check that the path names the intended file"},
    [INFILE_TEXT] = {4 * GIB, "a plain-text --data-path corpus",
                    "turn a larger corpus into a Megatron dataset with moetron prepare and train on that"},
    [INFILE_LOG] = {4 * GIB, "a --log-jsonl log", "give the resumed run a new --log-jsonl file"},
    [INFILE_WEIGHTS] = {TIB, "a safetensors file", "split the weights into shards (model.safetensors.index.json)"},
    [INFILE_DATA] = {64 * TIB, "a data file", "split the data into several files"},
};

// "256 MiB" for the limits above (all whole powers of 1024 times a small number).
static void format_limit(char *out, size_t n, uint64_t bytes) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && bytes >= KIB && bytes % KIB == 0) {
        bytes /= KIB;
        u++;
    }
    snprintf(out, n, "%llu %s", (unsigned long long)bytes, units[u]);
}

// how_large: "is N bytes, more than" or "holds more than"; then "the 256 MiB allowed for ...; fix".
static void set_too_large(char *err, size_t errlen, InputFileKind kind, const char *how_large) {
    char limit[32];
    format_limit(limit, sizeof limit, INPUT_KINDS[kind].max_bytes);
    if (err && errlen)
        snprintf(err, errlen, "%s the %s allowed for %s; %s", how_large, limit, INPUT_KINDS[kind].what,
                 INPUT_KINDS[kind].fix);
}

static const char *file_type_name(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "an unknown kind of file";
}

int open_input_file(const char *path, InputFileKind kind, uint64_t *size, char *err, size_t errlen) {
    *size = 0;
    // Non-blocking, so that opening a FIFO returns at once (and fstat then refuses it).
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, "cannot open", errno);
        return -1;
    }
    struct stat st;
    int errnum = 0;
    if (fstat(fd, &st) != 0) {
        errnum = errno;
        set_err(err, errlen, "cannot stat", errnum);
    } else if (!S_ISREG(st.st_mode)) {
        errnum = EINVAL;
        if (err && errlen) snprintf(err, errlen, "not a regular file (%s)", file_type_name(st.st_mode));
    } else if ((uint64_t)st.st_size > INPUT_KINDS[kind].max_bytes) {
        errnum = EFBIG;
        char how_large[64];
        snprintf(how_large, sizeof how_large, "is %llu bytes, more than", (unsigned long long)st.st_size);
        set_too_large(err, errlen, kind, how_large);
    } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        errnum = errno;
        set_err(err, errlen, "cannot set blocking reads", errnum);
    }
    if (errnum) {
        close(fd);
        errno = errnum;
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

FILE *open_input_stream(const char *path, InputFileKind kind, uint64_t *size, char *err, size_t errlen) {
    int fd = open_input_file(path, kind, size, err, errlen);
    if (fd < 0) return NULL;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        set_err(err, errlen, "cannot open", errno);
        close(fd);
    }
    return fp;
}

uint8_t *read_fd_all(int fd, InputFileKind kind, size_t *len, char *err, size_t errlen) {
    *len = 0;
    // Start from the size on disk when there is one, and read at most one byte more than the
    // limit: reaching it means the input (a pipe, or a file that grew) is too large.
    uint64_t limit = INPUT_KINDS[kind].max_bytes;
    struct stat st;
    size_t cap = READ_CHUNK_BYTES;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) cap = (size_t)st.st_size + 1;
    cap = (size_t)MT_MIN((uint64_t)cap, limit + 2);
    uint8_t *buf = mt_malloc(cap);
    size_t n = 0;
    for (;;) {
        if (n + 1 == cap) {
            if (n > limit) break;
            cap = (size_t)MT_MIN(2 * (uint64_t)cap, limit + 2);
            buf = mt_realloc(buf, cap);
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            set_err(err, errlen, "read error", errno);
            free(buf);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n > limit) {
        set_too_large(err, errlen, kind, "holds more than");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

uint8_t *read_file_all(const char *path, InputFileKind kind, size_t *len, char *err, size_t errlen) {
    uint64_t size;
    *len = 0;
    int fd = open_input_file(path, kind, &size, err, errlen);
    if (fd < 0) return NULL;
    uint8_t *buf = read_fd_all(fd, kind, len, err, errlen);
    close(fd);
    return buf;
}

int make_directories(const char *dir) {
    char *path = mt_strdup(dir);
    int rc = 0;
    for (char *p = path + 1; *p && !rc; p++) {
        if (*p != '/') continue;
        *p = 0;
        rc = mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
        *p = '/';
    }
    if (!rc) rc = mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
    int errnum = errno;
    free(path);
    errno = errnum;
    return rc;
}

// Writes all len bytes; 0, or the errno of the failure (ENOSPC when nothing more fits).
static int write_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return ENOSPC;
        data += n, len -= (size_t)n;
    }
    return 0;
}

int append_whole(int fd, const void *data, size_t len, int *partial_left) {
    *partial_left = 0;
    off_t before = lseek(fd, 0, SEEK_END);
    int errnum = write_all(fd, data, len);
    if (errnum) *partial_left = before >= 0 && lseek(fd, 0, SEEK_END) > before && ftruncate(fd, before);
    return errnum;
}
