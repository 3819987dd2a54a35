// test_fileio.c — atomic writes (content, overwrite, no temp left behind, failure
// cleanup), the streaming AtomicFile API, read_file_all, and the input-file checks:
// only regular files are read (a FIFO, /dev/zero, a directory are refused at once, without
// blocking), each kind of file bounded in size.
#include "core/fileio.h"
#include "testlib.h"

#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// A fresh empty directory under /tmp for this process.
static void make_test_dir(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/moetron_test_fileio_%s_%ld", tag, (long)getpid());
    mkdir(dir, 0700);
}

// Number of directory entries other than . and .. (temp files would show up here).
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_write_then_read(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "rw");
    snprintf(path, sizeof path, "%s/a.bin", dir);
    const char data[] = "hello\0world";
    CHECK(write_file_atomic(path, data, sizeof data, err, sizeof err) == 0, "write failed: %s", err);
    size_t len = 0;
    uint8_t *back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back != NULL, "read failed: %s", err);
    CHECK(len == sizeof data, "length %zu", len);
    CHECK(back && memcmp(back, data, sizeof data) == 0, "content differs");
    CHECK(back && back[len] == '\0', "missing terminating NUL");
    free(back);
    CHECK(count_entries(dir) == 1, "temp file left behind (%d entries)", count_entries(dir));
    remove(path);
    rmdir(dir);
}

static void test_overwrite_replaces_content(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "ow");
    snprintf(path, sizeof path, "%s/b.txt", dir);
    CHECK(write_file_atomic(path, "a long first version", 20, err, sizeof err) == 0, "%s", err);
    CHECK(write_file_atomic(path, "short", 5, err, sizeof err) == 0, "%s", err);
    size_t len;
    uint8_t *back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back && len == 5 && memcmp(back, "short", 5) == 0, "not replaced");
    free(back);
    CHECK(count_entries(dir) == 1, "temp file left behind");
    remove(path);
    rmdir(dir);
}

static void test_empty_and_large_files(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "big");
    snprintf(path, sizeof path, "%s/empty", dir);
    CHECK(write_file_atomic(path, NULL, 0, err, sizeof err) == 0, "%s", err);
    size_t len = 99;
    uint8_t *back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back && len == 0 && back[0] == '\0', "empty file read wrong");
    free(back);
    remove(path);

    size_t n = 3u << 20;  // 3 MiB, larger than any single read chunk
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    snprintf(path, sizeof path, "%s/large", dir);
    CHECK(write_file_atomic(path, data, n, err, sizeof err) == 0, "%s", err);
    back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back && len == n && memcmp(back, data, n) == 0, "large round trip differs");
    free(back);
    free(data);
    remove(path);
    rmdir(dir);
}

static void test_write_failure_cleans_up(void) {
    char err[256] = "";
    const char *path = "/tmp/moetron_no_such_dir_fileio/x/y.bin";
    CHECK(write_file_atomic(path, "x", 1, err, sizeof err) != 0, "write into missing dir succeeded");
    CHECK(strstr(err, "cannot create temporary file") != NULL, "err: %s", err);

    // A directory where the final file should go: the rename fails, the temp goes.
    char dir[256], target[300];
    make_test_dir(dir, sizeof dir, "fail");
    snprintf(target, sizeof target, "%s/target", dir);
    mkdir(target, 0700);
    char sub[400];
    snprintf(sub, sizeof sub, "%s/inner", target);
    mkdir(sub, 0700);  // non-empty directory: rename(file, dir) must fail
    err[0] = '\0';
    CHECK(write_file_atomic(target, "abc", 3, err, sizeof err) != 0, "rename over a directory succeeded");
    CHECK(strstr(err, "rename") != NULL, "err: %s", err);
    CHECK(count_entries(dir) == 1, "temp file left behind after failed rename");
    rmdir(sub);
    rmdir(target);
    rmdir(dir);
}

static void test_streaming_and_abort(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "stream");
    snprintf(path, sizeof path, "%s/s.txt", dir);
    AtomicFile af;
    CHECK(atomic_open(&af, path, err, sizeof err) == 0, "%s", err);
    atomic_write(&af, "abc", 3, err, sizeof err);
    atomic_write(&af, "", 0, err, sizeof err);
    atomic_write(&af, "def", 3, err, sizeof err);
    CHECK(atomic_commit(&af, err, sizeof err) == 0, "%s", err);
    size_t len;
    uint8_t *back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back && len == 6 && memcmp(back, "abcdef", 6) == 0, "streamed content wrong");
    free(back);

    CHECK(atomic_open(&af, path, err, sizeof err) == 0, "%s", err);
    atomic_write(&af, "zzz", 3, err, sizeof err);
    atomic_abort(&af);
    back = read_file_all(path, INFILE_DATA, &len, err, sizeof err);
    CHECK(back && len == 6 && memcmp(back, "abcdef", 6) == 0, "abort changed the file");
    free(back);
    CHECK(count_entries(dir) == 1, "abort left the temp file");
    remove(path);
    rmdir(dir);
}

static void test_read_errors(void) {
    char err[256] = "";
    size_t len = 7;
    CHECK(read_file_all("/tmp/moetron_definitely_missing_file", INFILE_DATA, &len, err, sizeof err) == NULL, "got data");
    CHECK(strncmp(err, "cannot open", 11) == 0, "err: %s", err);
    CHECK(len == 0, "len not reset");
    err[0] = '\0';
    CHECK(read_file_all("/tmp", INFILE_DATA, &len, err, sizeof err) == NULL, "reading a directory succeeded");
    CHECK(err[0] != '\0', "no error for a directory");
}

// The refusal names the kind of file, and nothing is read (a FIFO without a writer would
// block a plain open forever; /dev/zero would never end).
static void test_refuses_non_regular_files(void) {
    char dir[256], fifo[300], err[256];
    make_test_dir(dir, sizeof dir, "fifo");
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo failed");
    const struct {
        const char *path, *type;
    } cases[] = {{fifo, "(a FIFO)"}, {"/dev/zero", "(a character device)"}, {dir, "(a directory)"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = 7;
        uint64_t size = 7;
        err[0] = '\0';
        CHECK(read_file_all(cases[i].path, INFILE_CONFIG, &len, err, sizeof err) == NULL, "%s was read", cases[i].path);
        CHECK(strstr(err, "not a regular file") && strstr(err, cases[i].type), "%s: err '%s'", cases[i].path, err);
        CHECK(len == 0, "len not reset");
        err[0] = '\0';
        CHECK(open_input_file(cases[i].path, INFILE_DATA, &size, err, sizeof err) == -1, "%s opened", cases[i].path);
        CHECK(strstr(err, "not a regular file") != NULL && size == 0, "%s: err '%s'", cases[i].path, err);
        CHECK(open_input_stream(cases[i].path, INFILE_DATA, &size, err, sizeof err) == NULL, "%s streamed",
              cases[i].path);
    }
    remove(fifo);
    rmdir(dir);
}

// A symlink to a regular file is followed (datasets are often symlinked).
static void test_follows_symlinks(void) {
    char dir[256], path[300], link[300], err[256];
    make_test_dir(dir, sizeof dir, "link");
    snprintf(path, sizeof path, "%s/real.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    CHECK(write_file_atomic(path, "{}", 2, err, sizeof err) == 0, "%s", err);
    CHECK(symlink(path, link) == 0, "symlink failed");
    size_t len;
    uint8_t *back = read_file_all(link, INFILE_CONFIG, &len, err, sizeof err);
    CHECK(back && len == 2 && memcmp(back, "{}", 2) == 0, "symlinked file not read: %s", err);
    free(back);
    remove(link);
    remove(path);
    rmdir(dir);
}

// Sizes are checked from fstat before anything is read: a sparse 10 GiB "config.json" costs
// nothing to make and is refused at once; a one-line file of 5000 bytes too.
static void test_size_limits_per_kind(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "limit");
    snprintf(path, sizeof path, "%s/config.json", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)10 << 30) == 0, "cannot make a sparse file");
    if (fd >= 0) close(fd);
    size_t len;
    err[0] = '\0';
    CHECK(read_file_all(path, INFILE_CONFIG, &len, err, sizeof err) == NULL, "10 GiB config read");
    CHECK(strstr(err, "is 10737418240 bytes, more than the 256 MiB allowed for a JSON or tokenizer file"),
          "err: %s", err);
    uint64_t size;
    fd = open_input_file(path, INFILE_DATA, &size, err, sizeof err);  // fine as a data file
    CHECK(fd >= 0 && size == (uint64_t)10 << 30, "data-sized open failed: %s", err);
    if (fd >= 0) close(fd);

    static char note[5000];
    memset(note, '7', sizeof note);
    CHECK(write_file_atomic(path, note, sizeof note, err, sizeof err) == 0, "%s", err);
    err[0] = '\0';
    CHECK(read_file_all(path, INFILE_NOTE, &len, err, sizeof err) == NULL, "5000-byte note read");
    CHECK(strstr(err, "more than the 4 KiB allowed for a one-line text file"), "err: %s", err);
    uint8_t *back = read_file_all(path, INFILE_CONFIG, &len, err, sizeof err);
    CHECK(back && len == sizeof note, "5000 bytes as config: %s", err);
    free(back);
    remove(path);
    rmdir(dir);
}

// read_fd_all bounds a stream whose size is not known in advance (a pipe) by the kind too.
static void test_stream_bounded(void) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe failed");
    static char note[5000];
    memset(note, 'x', sizeof note);
    CHECK(write(fds[1], note, sizeof note) == (ssize_t)sizeof note, "pipe write");  // fits the pipe buffer
    close(fds[1]);
    char err[256] = "";
    size_t len = 7;
    CHECK(read_fd_all(fds[0], INFILE_NOTE, &len, err, sizeof err) == NULL, "oversized stream read");
    CHECK(strstr(err, "holds more than the 4 KiB allowed"), "err: %s", err);
    close(fds[0]);

    CHECK(pipe(fds) == 0, "pipe failed");
    CHECK(write(fds[1], note, 4096) == 4096, "pipe write");  // exactly the limit is fine
    close(fds[1]);
    uint8_t *back = read_fd_all(fds[0], INFILE_NOTE, &len, err, sizeof err);
    CHECK(back && len == 4096 && back[len] == '\0', "4096-byte stream: %s", err);
    free(back);
    close(fds[0]);
}

static void test_fsync_dir(void) {
    char dir[256], path[300], err[256];
    make_test_dir(dir, sizeof dir, "sync");
    snprintf(path, sizeof path, "%s/f", dir);
    CHECK(write_file_atomic(path, "1", 1, err, sizeof err) == 0, "%s", err);
    CHECK(fsync_dir_of(path) == 0, "fsync of /tmp subdir failed");
    CHECK(fsync_dir_of("relative_name_in_cwd") == 0, "fsync of . failed");
    CHECK(fsync_dir_of("/tmp/moetron_missing_dir/x") == -1, "missing dir reported success");
    remove(path);
    rmdir(dir);
}

int main(void) {
    RUN(test_write_then_read);
    RUN(test_overwrite_replaces_content);
    RUN(test_empty_and_large_files);
    RUN(test_write_failure_cleans_up);
    RUN(test_streaming_and_abort);
    RUN(test_read_errors);
    RUN(test_refuses_non_regular_files);
    RUN(test_follows_symlinks);
    RUN(test_size_limits_per_kind);
    RUN(test_stream_bounded);
    RUN(test_fsync_dir);
    TESTS_DONE();
}
