// test_fileio.c — atomic writes (content, overwrite, no temp left behind, failure
// cleanup), the streaming AtomicFile API, and read_file_all.
#include "core/fileio.h"
#include "testlib.h"

#include <dirent.h>
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
    uint8_t *back = read_file_all(path, &len, err, sizeof err);
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
    uint8_t *back = read_file_all(path, &len, err, sizeof err);
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
    uint8_t *back = read_file_all(path, &len, err, sizeof err);
    CHECK(back && len == 0 && back[0] == '\0', "empty file read wrong");
    free(back);
    remove(path);

    size_t n = 3u << 20;  // 3 MiB, larger than any single read chunk
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    snprintf(path, sizeof path, "%s/large", dir);
    CHECK(write_file_atomic(path, data, n, err, sizeof err) == 0, "%s", err);
    back = read_file_all(path, &len, err, sizeof err);
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
    uint8_t *back = read_file_all(path, &len, err, sizeof err);
    CHECK(back && len == 6 && memcmp(back, "abcdef", 6) == 0, "streamed content wrong");
    free(back);

    CHECK(atomic_open(&af, path, err, sizeof err) == 0, "%s", err);
    atomic_write(&af, "zzz", 3, err, sizeof err);
    atomic_abort(&af);
    back = read_file_all(path, &len, err, sizeof err);
    CHECK(back && len == 6 && memcmp(back, "abcdef", 6) == 0, "abort changed the file");
    free(back);
    CHECK(count_entries(dir) == 1, "abort left the temp file");
    remove(path);
    rmdir(dir);
}

static void test_read_errors(void) {
    char err[256] = "";
    size_t len = 7;
    CHECK(read_file_all("/tmp/moetron_definitely_missing_file", &len, err, sizeof err) == NULL, "got data");
    CHECK(strncmp(err, "cannot open", 11) == 0, "err: %s", err);
    CHECK(len == 0, "len not reset");
    err[0] = '\0';
    CHECK(read_file_all("/tmp", &len, err, sizeof err) == NULL, "reading a directory succeeded");
    CHECK(err[0] != '\0', "no error for a directory");
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
    RUN(test_fsync_dir);
    TESTS_DONE();
}
