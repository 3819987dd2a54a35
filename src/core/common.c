#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

static char die_prefix[64];
static void (*die_end_all)(void);

void mt_set_die_handler(const char *prefix, void (*end_all)(void)) {
    snprintf(die_prefix, sizeof(die_prefix), "%s", prefix ? prefix : "");
    die_end_all = end_all;
}

// Writes "moetron: error: <prefix><message>\n" to stderr as one line.
static void write_error_line(const char *fmt, va_list ap) {
    // The whole line in one write, so the lines of several processes do not interleave.
    va_list again;
    va_copy(again, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    size_t head = strlen("moetron: error: ") + strlen(die_prefix), cap = head + (len > 0 ? len : 0) + 2;
    char fallback[1024], *line = malloc(cap);
    if (!line) line = fallback, cap = sizeof(fallback);
    snprintf(line, cap, "moetron: error: %s", die_prefix);
    vsnprintf(line + head, cap - head - 1, fmt, again);
    va_end(again);
    // One line whatever the message quotes: control characters from file contents or
    // arguments (a newline in a JSON string, an escape sequence) show as '?'.
    for (char *c = line + head; *c; c++)
        if ((unsigned char)*c < 0x20 && *c != '\t') *c = '?';
    strcat(line, "\n");
    fputs(line, stderr);
    if (line != fallback) free(line);
}

void mt_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    write_error_line(fmt, ap);
    va_end(ap);
    if (die_end_all) die_end_all();
    exit(1);
}

void mt_die_from_thread(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    write_error_line(fmt, ap);
    va_end(ap);
    _exit(1);
}

void mt_flush_stdout(void) {
    int failed = fflush(stdout) != 0;
    int errnum = errno;
    if (failed || ferror(stdout))
        mt_die("writing standard output failed: %s; free space where it goes or redirect it",
               failed ? strerror(errnum) : "write error");
}

void *mt_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_die("out of memory allocating %zu bytes", bytes);
    return p;
}

size_t mt_size_product(int64_t count, size_t size) {
    MT_ASSERT(count >= 0 && (size == 0 || (uint64_t)count <= SIZE_MAX / size));
    return (size_t)count * size;
}

void *mt_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mt_die("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *mt_realloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p) mt_die("out of memory reallocating %zu bytes", bytes);
    return p;
}

char *mt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = mt_malloc(n);
    memcpy(p, s, n);
    return p;
}
