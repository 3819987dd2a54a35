// fileio.h — whole-file reads and crash-safe writes. A file written here is
// either the old version or the complete new one, never a half-written mix:
// bytes go to "<path>.tmp.<pid>", are flushed and fsync'ed, and the temp file
// is renamed over <path>. Error messages are one-line reasons without the path
// (the caller prefixes it).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Writes len bytes to path atomically. Returns 0 on success; on failure removes
// the temp file, leaves any existing file at path untouched and fills err.
int write_file_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);

// fsync()s the directory that holds path so that a rename into it survives a
// crash. Best effort: returns 0 on success, -1 if the directory could not be
// opened or synced (some filesystems do not support it).
int fsync_dir_of(const char *path);

// mkdir -p: creates dir and every missing parent (mode 0777 before the umask). Returns 0
// when the directory exists afterwards; -1 with errno set otherwise.
int make_directories(const char *dir);

// Reads the whole file. Returns a buffer of *len bytes followed by one extra NUL
// byte (handy for text), to be released with free(); NULL with err filled
// ("cannot open: ...", "read error: ...") on failure.
uint8_t *read_file_all(const char *path, size_t *len, char *err, size_t errlen);

// Streaming form of write_file_atomic, for files too large to assemble in memory:
//   AtomicFile af;
//   if (atomic_open(&af, path, err, n)) ...;
//   atomic_write(&af, a, na, err, n); atomic_write(&af, b, nb, err, n);
//   if (atomic_commit(&af, err, n)) ...;     // or atomic_abort(&af) to give up
// atomic_write and atomic_commit return 0 on success. After any failure the
// temp file is already removed and the AtomicFile released; later calls on it
// fail again with the first error, so checking only atomic_commit is enough.
typedef struct {
    FILE *fp;          // the open temp file; NULL once closed or failed
    char *path;        // final destination
    char *tmp_path;    // "<path>.tmp.<pid>"
    char first_error[160];
} AtomicFile;

int atomic_open(AtomicFile *af, const char *path, char *err, size_t errlen);
int atomic_write(AtomicFile *af, const void *data, size_t len, char *err, size_t errlen);
int atomic_commit(AtomicFile *af, char *err, size_t errlen);
void atomic_abort(AtomicFile *af);
