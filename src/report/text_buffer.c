// text_buffer.c — see text_buffer.h.
#include "report/text_buffer.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/common.h"

static void reserve(TextBuffer *b, size_t more) {
    if (b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1) cap *= 2;
    b->text = mt_realloc(b->text, cap);
    b->cap = cap;
}

void tb_append_n(TextBuffer *b, const char *s, size_t n) {
    reserve(b, n);
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = 0;
}

void tb_append(TextBuffer *b, const char *s) { tb_append_n(b, s, strlen(s)); }

void tb_printf(TextBuffer *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    MT_ASSERT(n >= 0);
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->text + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void tb_append_html(TextBuffer *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': tb_append(b, "&amp;"); break;
        case '<': tb_append(b, "&lt;"); break;
        case '>': tb_append(b, "&gt;"); break;
        case '"': tb_append(b, "&quot;"); break;
        case '\'': tb_append(b, "&#39;"); break;
        default: tb_append_n(b, s, 1);
        }
    }
}

void tb_free(TextBuffer *b) {
    free(b->text);
    b->text = NULL;
    b->len = b->cap = 0;
}
