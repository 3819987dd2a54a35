// test_utf8_stream.c — generated text comes out as valid UTF-8: characters split across
// pieces are held back until whole, invalid bytes and cut sequences become U+FFFD.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "tokenizer/utf8_stream.h"

#define FFFD "\xEF\xBF\xBD"

// What the stream writes for the pieces (NULL-terminated list), finished at the end.
static char *stream_pieces(const char *const *pieces) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    Utf8Stream s;
    utf8_stream_init(&s, f);
    for (int i = 0; pieces[i]; i++) utf8_stream_write(&s, pieces[i], strlen(pieces[i]));
    utf8_stream_finish(&s);
    fclose(f);
    return text;
}

static void expect(const char *const *pieces, const char *want, const char *what) {
    char *got = stream_pieces(pieces);
    CHECK(strcmp(got, want) == 0, "%s: got '%s', want '%s'", what, got, want);
    free(got);
}

static void test_split_characters_held_back(void) {
    expect((const char *const[]){"caf\xC3", "\xA9", NULL}, "caf\xC3\xA9", "2-byte split");
    expect((const char *const[]){"\xE2", "\x82", "\xAC!", NULL}, "\xE2\x82\xAC!", "3-byte split twice");
    expect((const char *const[]){"\xF0\x9F", "\x98\x80", NULL}, "\xF0\x9F\x98\x80", "4-byte split");
    // nothing of a character is written before it is whole
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    Utf8Stream s;
    utf8_stream_init(&s, f);
    utf8_stream_write(&s, "a\xC3", 2);
    fflush(f);
    CHECK(size == 1 && text[0] == 'a', "only 'a' written so far (%zu bytes)", size);
    utf8_stream_finish(&s);
    fclose(f);
    free(text);
}

static void test_invalid_bytes_replaced(void) {
    expect((const char *const[]){"a\xFFz", NULL}, "a" FFFD "z", "0xFF");
    expect((const char *const[]){"\x80", NULL}, FFFD, "lone continuation byte");
    expect((const char *const[]){"\xC0\xAF", NULL}, FFFD FFFD, "overlong lead");
    expect((const char *const[]){"\xED\xA0\x80", NULL}, FFFD FFFD FFFD, "surrogate");
    expect((const char *const[]){"\xC3", "A", NULL}, FFFD "A", "sequence cut by an ASCII byte");
    expect((const char *const[]){"\xE2\x82", NULL}, FFFD, "incomplete at the end");
    expect((const char *const[]){"\xE2\x82", "\xC3\xA9", NULL}, FFFD "\xC3\xA9", "cut by another character");
}

int main(void) {
    RUN(test_split_characters_held_back);
    RUN(test_invalid_bytes_replaced);
    return tl_failed_cases != 0;
}
