// fuzz_json.c — json_parse (src/core/json.c) on arbitrary bytes. A parsed value is written
// back with the JsonWriter and parsed again: the second parse must succeed and give the
// same value (types, counts, strings, numbers).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "fuzz.h"

static int depth_of(const JsonValue *v) {
    int d = 0;
    if (v->type == JSON_ARRAY || v->type == JSON_OBJECT)
        for (size_t i = 0; i < v->count; i++) {
            int c = depth_of(&v->items[i]);
            if (c > d) d = c;
        }
    return d + (v->type == JSON_ARRAY || v->type == JSON_OBJECT);
}

static void write_value(JsonWriter *w, const JsonValue *v) {
    switch (v->type) {
    case JSON_NULL: jw_null(w); break;
    case JSON_BOOL: jw_bool(w, v->boolean); break;
    case JSON_NUMBER:
        if (v->has_int64) jw_int(w, v->integer);
        else jw_double(w, v->number);
        break;
    case JSON_STRING: jw_string_n(w, v->string, v->length); break;
    case JSON_ARRAY:
        jw_begin_array(w);
        for (size_t i = 0; i < v->count; i++) write_value(w, &v->items[i]);
        jw_end_array(w);
        break;
    case JSON_OBJECT:
        jw_begin_object(w);
        for (size_t i = 0; i < v->count; i++) {
            jw_key(w, v->keys[i]);
            write_value(w, &v->items[i]);
        }
        jw_end_object(w);
        break;
    }
}

static void check_same(const JsonValue *a, const JsonValue *b) {
    if (a->type != b->type) fuzz_fail("round trip changed a type %d -> %d", a->type, b->type);
    switch (a->type) {
    case JSON_BOOL:
        if (a->boolean != b->boolean) fuzz_fail("round trip changed a boolean");
        break;
    case JSON_NUMBER:
        if (a->has_int64 ? !b->has_int64 || a->integer != b->integer : a->number != b->number)
            fuzz_fail("round trip changed a number %.17g -> %.17g", a->number, b->number);
        break;
    case JSON_STRING:
        if (a->length != b->length || memcmp(a->string, b->string, a->length))
            fuzz_fail("round trip changed a string");
        break;
    case JSON_ARRAY:
    case JSON_OBJECT:
        if (a->count != b->count) fuzz_fail("round trip changed a count %zu -> %zu", a->count, b->count);
        for (size_t i = 0; i < a->count; i++) {
            if (a->type == JSON_OBJECT && strcmp(a->keys[i], b->keys[i]))  // jw_key stops at a NUL
                fuzz_fail("round trip changed a key");
            check_same(&a->items[i], &b->items[i]);
        }
        break;
    default: break;
    }
}

typedef struct {
    const char *text;
    size_t size;
} Input;

static void body(void *ctx) {
    const Input *in = ctx;
    char err[256];
    JsonValue *v = json_parse(in->text, in->size, err, sizeof err);
    if (!v) {
        if (!err[0]) fuzz_fail("json_parse failed without a message");
        return;
    }
    // the accessors on whatever came out
    int64_t i64;
    double d;
    int b;
    json_as_int64(v, &i64);
    json_get_number(v, "a", &d);
    json_get_bool(v, "a", &b);
    json_get_string(v, "a");
    json_at(v, 0);
    if (depth_of(v) <= JW_MAX_DEPTH) {
        for (int compact = 0; compact < 2; compact++) {
            JsonWriter w;
            if (compact) jw_init_compact(&w);
            else jw_init(&w);
            write_value(&w, v);
            JsonValue *again = json_parse(jw_text(&w), jw_len(&w), err, sizeof err);
            if (!again) fuzz_fail("the writer's text does not parse: %s", err);
            check_same(v, again);
            json_free(again);
            jw_free(&w);
        }
    }
    json_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // libFuzzer's data is an exactly-sized heap block: a read past text + size is reported
    Input in = {(const char *)data, size};
    fuzz_run(body, &in);
    return 0;
}
