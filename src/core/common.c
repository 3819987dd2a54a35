#include "common.h"

#include <stdarg.h>
#include <string.h>

void mt_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("moetron: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void *mt_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_die("out of memory allocating %zu bytes", bytes);
    return p;
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
