// text_buffer.h — a growable NUL-terminated string for building a document in memory
// (the report's HTML page), with HTML escaping.
#pragma once
#include <stddef.h>

typedef struct {
    char *text;  // NUL-terminated; NULL until the first append
    size_t len, cap;
} TextBuffer;

void tb_append_n(TextBuffer *b, const char *s, size_t n);
void tb_append(TextBuffer *b, const char *s);
void tb_printf(TextBuffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// s with & < > " ' as character references: safe in HTML text and quoted attribute values.
void tb_append_html(TextBuffer *b, const char *s);
void tb_free(TextBuffer *b);
