// json.h — a small strict JSON parser (RFC 8259) and a pretty/compact writer.
// Used for config.json, checkpoint metadata, safetensors headers and JSONL
// metrics. The parser never reads outside [text, text+len), needs no NUL
// terminator, and reports the first error as "line L column C: <what>".
#pragma once
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 256  // arrays/objects nested deeper than this are rejected

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue {
    JsonType type;
    int boolean;            // JSON_BOOL: 0 or 1
    double number;          // JSON_NUMBER: the value as a double
    int is_integer;         // JSON_NUMBER: the literal had no fraction and no exponent
    int has_int64;          // ... and its exact value fits in int64_t, stored in `integer`
    int64_t integer;
    char *string;           // JSON_STRING: UTF-8, NUL-terminated; may hold NULs from \u0000
    size_t length;          // JSON_STRING: bytes in string, not counting the terminator
    size_t count;           // JSON_ARRAY / JSON_OBJECT: number of items
    struct JsonValue *items;  // [count] the elements, or the object's values in file order
    char **keys;            // JSON_OBJECT: [count] NUL-terminated keys, parallel to items
    size_t *key_lengths;    // JSON_OBJECT: [count] key lengths (keys may hold \u0000)
} JsonValue;

// Parses exactly one JSON value (surrounded by optional whitespace) from
// text[0..len). Returns NULL and fills err on error. Duplicate object keys are
// kept (json_get finds the first). Invalid UTF-8 passes through unchanged; a
// lone surrogate escape (\ud800 without its pair) becomes U+FFFD. Numbers that
// overflow a double (1e999) are rejected.
JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen);
// Reads and parses a file; err is "cannot open: ..." or the parse error.
JsonValue *json_parse_file(const char *path, char *err, size_t errlen);
void json_free(JsonValue *v);  // NULL is fine

// Lookups: NULL when obj is not an object / the key is missing / i is out of range.
const JsonValue *json_get(const JsonValue *obj, const char *key);
const JsonValue *json_at(const JsonValue *arr, size_t i);

// Typed getters: return 1 and set *out on success, 0 (leaving *out alone) when the
// key is missing or has the wrong type. json_get_int64 accepts integer literals
// that fit in int64_t, and also integral doubles such as 2.0 or 1e3 up to 2^53.
int json_get_number(const JsonValue *obj, const char *key, double *out);
int json_get_int64(const JsonValue *obj, const char *key, int64_t *out);
int json_get_bool(const JsonValue *obj, const char *key, int *out);
const char *json_get_string(const JsonValue *obj, const char *key);  // NULL unless a string
// The same conversions for a value already in hand.
int json_as_int64(const JsonValue *v, int64_t *out);

// ---------------------------------------------------------------------------
// Writer: builds JSON text in a growable buffer. Pretty mode indents by two
// spaces, one item per line, and writes empty containers as {} and [];
// compact mode writes everything on one line without spaces. Values written at
// the top level one after another are separated by a newline (JSONL).
//   JsonWriter w; jw_init(&w);
//   jw_begin_object(&w); jw_kv_int(&w, "step", 10); jw_end_object(&w);
//   fputs(jw_text(&w), fp); jw_free(&w);
// Misuse (a value in an object without a key, unbalanced end) is an internal
// error and dies.
#define JW_MAX_DEPTH 64

typedef struct JsonWriter {
    char *buf;                 // NUL-terminated text so far (NULL until first write)
    size_t len, cap;
    int compact;               // 1: single line, no spaces
    int depth;                 // open containers
    int after_key;             // a key was written and awaits its value
    int top_level_count;       // values completed at depth 0
    char open[JW_MAX_DEPTH];   // '{' or '[' for each open container
    int has_items[JW_MAX_DEPTH];
} JsonWriter;

void jw_init(JsonWriter *w);
void jw_init_compact(JsonWriter *w);
void jw_begin_object(JsonWriter *w);
void jw_end_object(JsonWriter *w);
void jw_begin_array(JsonWriter *w);
void jw_end_array(JsonWriter *w);
void jw_key(JsonWriter *w, const char *key);
void jw_string(JsonWriter *w, const char *s);  // NULL writes null
void jw_string_n(JsonWriter *w, const char *s, size_t n);
void jw_int(JsonWriter *w, int64_t v);
// Shortest of %.15g / %.17g that parses back to exactly v; integral values get
// a ".0" (10000.0) so they read back as floats in Python. NaN and Inf write null.
void jw_double(JsonWriter *w, double v);
void jw_bool(JsonWriter *w, int v);
void jw_null(JsonWriter *w);
void jw_kv_string(JsonWriter *w, const char *key, const char *s);
void jw_kv_int(JsonWriter *w, const char *key, int64_t v);
void jw_kv_double(JsonWriter *w, const char *key, double v);
void jw_kv_bool(JsonWriter *w, const char *key, int v);
const char *jw_text(JsonWriter *w);  // "" when nothing was written
size_t jw_len(JsonWriter *w);
void jw_free(JsonWriter *w);  // releases the buffer; w may be re-initialized
