// report.c — `moetron report RUN [--output FILE]`: one self-contained HTML page of a run's
// --log-jsonl (docs/metrics.md, "moetron report"). RUN is the log itself, or a directory
// holding exactly one .jsonl file (a run's --save directory with its log inside). The
// page goes to --output, by default the log's path with .html for .jsonl, written
// atomically; it can be made while the run still writes the log.
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/commands.h"
#include "core/common.h"
#include "core/fileio.h"
#include "report/report_page.h"
#include "report/run_log.h"
#include "report/text_buffer.h"

static const char LOG_EXTENSION[] = ".jsonl";
static const char PAGE_EXTENSION[] = ".html";

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

// The one .jsonl file directly in dir, into path; fatal when there is none or several.
static void log_in_directory(const char *dir, char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) mt_die("%s: cannot open the directory: %s", dir, strerror(errno));
    char found[2][256];
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!ends_with(e->d_name, LOG_EXTENSION)) continue;
        if (count < 2) snprintf(found[count], sizeof(found[count]), "%s", e->d_name);
        count++;
    }
    closedir(d);
    if (count == 0) mt_die("%s: no %s file in this directory; give the run's --log-jsonl file", dir, LOG_EXTENSION);
    if (count > 1)
        mt_die("%s: %d %s files in this directory (%s, %s%s); give the one to report", dir, count, LOG_EXTENSION,
               found[0], found[1], count > 2 ? ", ..." : "");
    size_t dir_len = strlen(dir);
    while (dir_len > 1 && dir[dir_len - 1] == '/') dir_len--;  // "run/" joins as "run/x.jsonl"
    int n = snprintf(path, size, "%.*s/%s", (int)dir_len, dir, found[0]);
    if (n < 0 || (size_t)n >= size) mt_die("%s/%s: the path is too long", dir, found[0]);
}

// The last component of path without trailing slashes, and without `extension` when it ends so.
static void base_name(const char *path, const char *extension, char *out, size_t size) {
    size_t end = strlen(path);
    while (end > 1 && path[end - 1] == '/') end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(out, size, "%.*s", (int)(end - start), path + start);
    if (ends_with(out, extension) && strlen(out) > strlen(extension)) out[strlen(out) - strlen(extension)] = 0;
}

// The default page: the log's path with .html in place of .jsonl (appended to another name).
static void default_output(const char *log_path, char *out, size_t size) {
    size_t keep = strlen(log_path) - (ends_with(log_path, LOG_EXTENSION) ? strlen(LOG_EXTENSION) : 0);
    int n = snprintf(out, size, "%.*s%s", (int)keep, log_path, PAGE_EXTENSION);
    if (n < 0 || (size_t)n >= size) mt_die("%s: the path is too long for its page; give --output", log_path);
}

int report_main(Config *c) {
    const char *run = c->report_run;
    if (!run[0]) mt_die("moetron report needs RUN: the --log-jsonl file of a run, or the directory holding it");
    char log_path[MT_PATH_MAX + 256], run_name[256], output[MT_PATH_MAX + 256];
    struct stat st;
    int is_directory = stat(run, &st) == 0 && S_ISDIR(st.st_mode);
    if (is_directory) log_in_directory(run, log_path, sizeof(log_path));
    else snprintf(log_path, sizeof(log_path), "%s", run);
    base_name(run, LOG_EXTENSION, run_name, sizeof(run_name));
    if (c->report_output[0]) snprintf(output, sizeof(output), "%s", c->report_output);
    else default_output(log_path, output, sizeof(output));
    if (!strcmp(output, log_path)) mt_die("--output %s: that is the log itself; name another file", output);

    RunLog log;
    run_log_read(&log, log_path);
    TextBuffer page = {0};
    report_page(&page, &log, run_name);
    char err[256];
    int failed = write_file_atomic(output, page.text, page.len, err, sizeof(err));
    tb_free(&page);
    if (failed) {
        run_log_free(&log);
        mt_die("--output %s: cannot write the page: %s", output, err);
    }
    printf("moetron report: wrote %s (%ld step records, %ld evaluations%s)\n", output, log.step_records,
           log.eval_records, log.cut_short ? "; the last line, still being written, left out" : "");
    run_log_free(&log);
    return 0;
}
