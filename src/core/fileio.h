// fileio.h — bounded reads of regular input files and crash-safe writes. A file written here is
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

// What an input file is, which bounds how large it may be (the limits are listed in
// fileio.c and docs/reliability.md).
typedef enum {
    INFILE_CONFIG,   // JSON (config.json, trainer_state.json, checksums, shard index) and tokenizer files
    INFILE_NOTE,     // one-line text files (latest_checkpointed_iteration.txt)
    INFILE_TEXT,     // a plain-text corpus read whole (--data-path FILE)
    INFILE_LOG,      // a --log-jsonl log, read whole when a resumed run trims it
    INFILE_WEIGHTS,  // safetensors (mapped; a tensor read when asked)
    INFILE_DATA,     // mapped or streamed: .bin/.idx, index caches, prepare's input, checksummed files
} InputFileKind;

// Opens path for reading when it is a regular file of at most the kind's size, following
// symlinks. A FIFO, device, directory or socket is refused without blocking (the open is
// non-blocking and the type comes from fstat of the opened descriptor, so nothing can swap
// the file in between). Returns the descriptor (blocking again) and its size in *size; -1
// with err filled ("cannot open: ...", "not a regular file (a FIFO)", "is N bytes, more
// than ...") and errno set (ENOENT when there is no such file).
int open_input_file(const char *path, InputFileKind kind, uint64_t *size, char *err, size_t errlen);
// open_input_file as a FILE * ("rb"); NULL on failure.
FILE *open_input_stream(const char *path, InputFileKind kind, uint64_t *size, char *err, size_t errlen);

// Reads fd to its end, at most the kind's size (more is an error). Returns a buffer of *len
// bytes followed by one extra NUL byte (handy for text), to be released with free(); NULL
// with err filled on failure. fd stays open.
uint8_t *read_fd_all(int fd, InputFileKind kind, size_t *len, char *err, size_t errlen);

// open_input_file + read_fd_all: the whole of a regular file of at most the kind's size.
uint8_t *read_file_all(const char *path, InputFileKind kind, size_t *len, char *err, size_t errlen);

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

// mkdir -p: creates dir and every missing parent (mode 0777 before the umask). Returns 0
// when the directory exists afterwards; -1 with errno set otherwise.
int make_directories(const char *dir);

// Appends len bytes to fd (a log opened O_APPEND) in plain write calls, nothing buffered.
// Returns 0, or the errno of the failure (ENOSPC when the disk is full); then the part
// written is cut off again, so the file keeps whole records, and *partial_left is set when
// even that failed.
int append_whole(int fd, const void *data, size_t len, int *partial_left);
