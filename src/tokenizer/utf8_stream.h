// utf8_stream.h — text written piece by piece (generated tokens) as valid UTF-8 only.
// A character split across pieces is held back until its last byte arrives; bytes that
// cannot start or continue a character (invalid, overlong, surrogate, or a sequence cut
// short by the next piece or by the end) come out as U+FFFD, as a UTF-8 decoder with
// replacement shows them.
#pragma once
#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *out;
    unsigned char pending[4];  // the start of a character still missing bytes
    int n_pending;
} Utf8Stream;

void utf8_stream_init(Utf8Stream *s, FILE *out);
// Writes what of bytes[0..len) (after the pending bytes) forms whole characters.
void utf8_stream_write(Utf8Stream *s, const void *bytes, size_t len);
// At the end of the text: a character still incomplete is written as U+FFFD.
void utf8_stream_finish(Utf8Stream *s);
