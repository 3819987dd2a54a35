// fileio.c — whole-file reads and atomic (temp file + fsync + rename) writes.
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

uint8_t *read_file_all(const char *path, size_t *len, char *err, size_t errlen) {
    *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        set_err(err, errlen, "cannot open", errno);
        return NULL;
    }
    // Start from the size on disk (if it is a regular file) but keep reading
    // until EOF, so pipes and files that grow meanwhile work too.
    struct stat st;
    size_t cap = 1 << 16;
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        cap = (size_t)st.st_size + 1;
    uint8_t *buf = mt_malloc(cap);
    size_t n = 0;
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            buf = mt_realloc(buf, cap);
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, fp);
        n += got;
        if (got == 0) break;
    }
    if (ferror(fp)) {
        set_err(err, errlen, "read error", errno);
        fclose(fp);
        free(buf);
        return NULL;
    }
    fclose(fp);
    buf[n] = '\0';
    *len = n;
    return buf;
}
