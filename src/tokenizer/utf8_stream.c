#include "tokenizer/utf8_stream.h"

#include <string.h>

static const char REPLACEMENT[] = "\xEF\xBF\xBD";  // U+FFFD

// The byte length of a character that starts with `lead`; 0 when no character does.
static int sequence_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;  // a continuation byte, an overlong lead (C0, C1) or beyond U+10FFFF
}

// Whether b may be byte `index` (>= 1) of the character that starts with lead: the second
// byte excludes overlong forms, surrogates and code points past U+10FFFF.
static int valid_continuation(unsigned char lead, int index, unsigned char b) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (index == 1) {
        if (lead == 0xE0) lo = 0xA0;
        else if (lead == 0xED) hi = 0x9F;
        else if (lead == 0xF0) lo = 0x90;
        else if (lead == 0xF4) hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

void utf8_stream_init(Utf8Stream *s, FILE *out) {
    memset(s, 0, sizeof(*s));
    s->out = out;
}

static void take_byte(Utf8Stream *s, unsigned char b) {
    if (s->n_pending > 0 && !valid_continuation(s->pending[0], s->n_pending, b)) {
        fputs(REPLACEMENT, s->out);  // the character was cut short; b starts afresh
        s->n_pending = 0;
    }
    if (s->n_pending == 0) {
        int len = sequence_length(b);
        if (len == 1) fputc(b, s->out);
        else if (len == 0) fputs(REPLACEMENT, s->out);
        else s->pending[s->n_pending++] = b;
        return;
    }
    s->pending[s->n_pending++] = b;
    if (s->n_pending == sequence_length(s->pending[0])) {
        fwrite(s->pending, 1, (size_t)s->n_pending, s->out);
        s->n_pending = 0;
    }
}

void utf8_stream_write(Utf8Stream *s, const void *bytes, size_t len) {
    const unsigned char *b = bytes;
    for (size_t i = 0; i < len; i++) take_byte(s, b[i]);
}

void utf8_stream_finish(Utf8Stream *s) {
    if (s->n_pending > 0) fputs(REPLACEMENT, s->out);
    s->n_pending = 0;
}
