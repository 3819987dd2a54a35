// test_json.c — JSON parser (types, key order, escapes and unicode, numbers,
// every kind of syntax error with its position, depth limit, inputs without a
// NUL terminator, truncation and random mutation without crashes) and the
// writer (exact pretty/compact text, escaping, double and int64 round trips).
#include "core/json.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "testlib.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

// Parses a C string through an exactly-sized heap copy without a terminator, so
// ASan catches any read past the end.
static JsonValue *parse_exact(const char *text, size_t len, char *err, size_t errlen) {
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    JsonValue *v = json_parse(copy, len, err, errlen);
    free(copy);
    return v;
}

static JsonValue *parse(const char *text) {
    char err[256];
    JsonValue *v = parse_exact(text, strlen(text), err, sizeof err);
    if (!v) printf("     unexpected parse error for %s: %s\n", text, err);
    return v;
}

// Expects a parse error whose message contains `expect`.
static void check_rejects(const char *text, const char *expect) {
    char err[256] = "";
    JsonValue *v = parse_exact(text, strlen(text), err, sizeof err);
    CHECK(v == NULL, "accepted invalid JSON: %s", text);
    CHECK(strstr(err, expect) != NULL, "for %s: error \"%s\" lacks \"%s\"", text, err, expect);
    json_free(v);
}

static void test_parse_all_types(void) {
    JsonValue *v = parse("{\"n\": null, \"t\": true, \"f\": false, \"i\": -42, \"d\": 2.5e-3,"
                         " \"s\": \"hi\", \"a\": [1, [2, {}], []], \"o\": {\"x\": {\"y\": 1}}}");
    CHECK(v && v->type == JSON_OBJECT && v->count == 8, "top-level object");
    if (!v) return;
    const char *order[] = {"n", "t", "f", "i", "d", "s", "a", "o"};
    for (int i = 0; i < 8; i++) CHECK(strcmp(v->keys[i], order[i]) == 0, "key %d is %s", i, v->keys[i]);
    CHECK(json_get(v, "n")->type == JSON_NULL, "null");
    int b = -1;
    CHECK(json_get_bool(v, "t", &b) && b == 1, "true");
    CHECK(json_get_bool(v, "f", &b) && b == 0, "false");
    int64_t i64 = 0;
    CHECK(json_get_int64(v, "i", &i64) && i64 == -42, "int %lld", (long long)i64);
    double d = 0;
    CHECK(json_get_number(v, "d", &d) && d == 2.5e-3, "double %g", d);
    CHECK(!json_get(v, "d")->is_integer && json_get(v, "i")->is_integer, "is_integer flags");
    CHECK(strcmp(json_get_string(v, "s"), "hi") == 0 && json_get(v, "s")->length == 2, "string");
    const JsonValue *a = json_get(v, "a");
    CHECK(a->type == JSON_ARRAY && a->count == 3, "array");
    CHECK(json_at(a, 0)->number == 1 && json_at(json_at(a, 1), 1)->type == JSON_OBJECT, "nested");
    CHECK(json_at(a, 2)->type == JSON_ARRAY && json_at(a, 2)->count == 0, "empty array");
    CHECK(json_at(a, 3) == NULL && json_at(v, 0) == NULL, "json_at bounds / type");
    int64_t y = 0;
    CHECK(json_get_int64(json_get(json_get(v, "o"), "x"), "y", &y) && y == 1, "deep get");
    // Wrong types and missing keys fail without touching the output.
    d = 7;
    CHECK(!json_get_number(v, "s", &d) && d == 7, "number from string");
    CHECK(!json_get_number(v, "missing", &d), "missing key");
    CHECK(json_get_string(v, "i") == NULL, "string from number");
    CHECK(!json_get_bool(v, "n", &b), "bool from null");
    CHECK(json_get(a, "x") == NULL && json_get(NULL, "x") == NULL, "json_get on non-object");
    json_free(v);
}

static void test_scalars_at_top_level(void) {
    const char *texts[] = {"0", " -0 ", "\"x\"", "true", "null", "[]", "{}", "\t\r\n 17 \n"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        JsonValue *v = parse(texts[i]);
        CHECK(v != NULL, "rejected %s", texts[i]);
        json_free(v);
    }
}

static void test_numbers(void) {
    struct {
        const char *text;
        double value;
        int is_integer;
    } cases[] = {
        {"0", 0, 1},          {"-0", -0.0, 1},        {"123456789", 123456789, 1},
        {"1.5", 1.5, 0},      {"-2.25e2", -225, 0},   {"1E3", 1000, 0},
        {"1e+2", 100, 0},     {"5e-1", 0.5, 0},       {"0.1", 0.1, 0},
        {"1e-400", 0, 0},     {"1.7976931348623157e308", 1.7976931348623157e308, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        JsonValue *v = parse(cases[i].text);
        CHECK(v && v->type == JSON_NUMBER && v->number == cases[i].value && v->is_integer == cases[i].is_integer,
              "number %s", cases[i].text);
        json_free(v);
    }
    // int64 extremes are exact; one past them is not an int64.
    JsonValue *v = parse("[9223372036854775807, -9223372036854775808, 9223372036854775808, 2.0, 1e3, 1.5,"
                         " 1e300, 9007199254740993]");
    int64_t x = 0;
    CHECK(json_as_int64(json_at(v, 0), &x) && x == INT64_MAX, "INT64_MAX");
    CHECK(json_as_int64(json_at(v, 1), &x) && x == INT64_MIN, "INT64_MIN");
    CHECK(!json_as_int64(json_at(v, 2), &x), "2^63 accepted as int64");
    CHECK(json_as_int64(json_at(v, 3), &x) && x == 2, "2.0 as int64");
    CHECK(json_as_int64(json_at(v, 4), &x) && x == 1000, "1e3 as int64");
    CHECK(!json_as_int64(json_at(v, 5), &x), "1.5 accepted as int64");
    CHECK(!json_as_int64(json_at(v, 6), &x), "1e300 accepted as int64");
    CHECK(json_as_int64(json_at(v, 7), &x) && x == 9007199254740993LL, "2^53+1 must stay exact");
    json_free(v);
}

static void test_string_escapes_and_unicode(void) {
    JsonValue *v = parse("[\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
                         " \"x\\u0000y\", \"\\ud800\", \"\\udc00z\", \"\\ud800\\u0041\", \"caf\xc3\xa9 \xff\"]");
    CHECK(v && v->count == 8, "array of strings");
    if (!v) return;
    CHECK(strcmp(v->items[0].string, "a\"b\\c/d\b\f\n\r\t") == 0, "simple escapes");
    CHECK(strcmp(v->items[1].string, "\xc3\xa9\xe2\x82\xac") == 0, "BMP escapes to UTF-8");
    CHECK(strcmp(v->items[2].string, "\xf0\x9f\x98\x80") == 0, "surrogate pair to 4-byte UTF-8");
    CHECK(v->items[3].length == 3 && memcmp(v->items[3].string, "x\0y", 4) == 0, "\\u0000 kept with length");
    CHECK(strcmp(v->items[4].string, "\xef\xbf\xbd") == 0, "lone high surrogate -> U+FFFD");
    CHECK(strcmp(v->items[5].string, "\xef\xbf\xbdz") == 0, "lone low surrogate -> U+FFFD");
    CHECK(strcmp(v->items[6].string, "\xef\xbf\xbd" "A") == 0, "high surrogate + non-low -> U+FFFD A");
    CHECK(strcmp(v->items[7].string, "caf\xc3\xa9 \xff") == 0, "raw UTF-8 / invalid bytes pass through");
    json_free(v);

    JsonValue *o = parse("{\"k\\u0000x\": 1, \"k\": 2, \"k\": 3}");
    int64_t k = 0;
    CHECK(o && json_get_int64(o, "k", &k) && k == 2, "json_get finds the first exact key, got %lld",
          (long long)k);
    CHECK(o && o->key_lengths[0] == 3, "key with NUL keeps its length");
    json_free(o);
}

static void test_syntax_errors(void) {
    check_rejects("", "line 1 column 1: unexpected end of input");
    check_rejects("   ", "unexpected end of input");
    check_rejects("{\n  \"a\": 1,\n  \"b\": 2 \"c\"\n}", "line 3 column 10: expected ',' or '}'");
    check_rejects("[1 2]", "line 1 column 4: expected ',' or ']'");
    check_rejects("[1,]", "unexpected character ']'");
    check_rejects("{\"a\":1,}", "expected a string key");
    check_rejects("{\"a\" 1}", "expected ':'");
    check_rejects("{1: 2}", "expected a string key");
    check_rejects("{'a': 2}", "expected a string key");
    check_rejects("[1] x", "line 1 column 5: unexpected trailing characters");
    check_rejects("{} {}", "trailing characters");
    check_rejects("01", "leading zero");
    check_rejects("-", "expected a digit");
    check_rejects("+1", "unexpected character '+'");
    check_rejects(".5", "unexpected character '.'");
    check_rejects("1.", "expected a digit after '.'");
    check_rejects("1.e5", "expected a digit after '.'");
    check_rejects("1e", "digit in the exponent");
    check_rejects("1e+", "digit in the exponent");
    check_rejects("1e999", "number out of range");
    check_rejects("-1e999", "number out of range");
    check_rejects("NaN", "unexpected character 'N'");
    check_rejects("Infinity", "unexpected character 'I'");
    check_rejects("tru", "unexpected character 't'");
    check_rejects("nul", "unexpected character 'n'");
    check_rejects("True", "unexpected character 'T'");
    check_rejects("\"abc", "unterminated string");
    check_rejects("\"abc\\\"", "unterminated string");
    check_rejects("\"abc\\", "unterminated string");
    check_rejects("\"a\nb\"", "control character 0x0a in string");
    check_rejects("\"a\tb\"", "control character 0x09");
    check_rejects("\"\\x\"", "invalid escape '\\x'");
    check_rejects("\"\\u12\"", "invalid \\u escape");
    check_rejects("\"\\u12g4\"", "invalid \\u escape");
    check_rejects("\"\\ud800\\u12\"", "invalid \\u escape");
    check_rejects("[", "unexpected end of input");
    check_rejects("[1,", "unexpected end of input");
    check_rejects("{\"a\"", "unexpected end of input");
    check_rejects("{\"a\":", "unexpected end of input");
    check_rejects("\x01", "unexpected byte 0x01");
    char err[256] = "";
    CHECK(parse_exact("[1]\0", 4, err, sizeof err) == NULL && strstr(err, "trailing"), "NUL after value: %s", err);
}

static void test_error_without_buffer(void) {
    // A NULL / zero-size error buffer is allowed.
    CHECK(json_parse("[", 1, NULL, 0) == NULL, "accepted [");
    char tiny[8];
    CHECK(json_parse("[", 1, tiny, sizeof tiny) == NULL, "accepted [");
    CHECK(strlen(tiny) < sizeof tiny, "error overflowed a tiny buffer");
}

static char *nested_arrays(int depth) {
    char *s = malloc((size_t)depth * 2 + 1);
    for (int i = 0; i < depth; i++) s[i] = '[', s[depth * 2 - 1 - i] = ']';
    s[depth * 2] = '\0';
    return s;
}

static void test_depth_limit(void) {
    char *ok = nested_arrays(JSON_MAX_DEPTH);
    JsonValue *v = parse(ok);
    CHECK(v != NULL, "depth %d rejected", JSON_MAX_DEPTH);
    json_free(v);
    free(ok);

    char *deep = nested_arrays(JSON_MAX_DEPTH + 1);
    check_rejects(deep, "nesting deeper than 256");
    free(deep);

    // An object chain too, and a huge run of '[' that must not recurse deeply.
    size_t n = 300;
    char *objs = malloc(n * 6 + 2);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(objs + k, "{\"a\":");
    objs[k++] = '1';
    for (size_t i = 0; i < n; i++) objs[k++] = '}';
    objs[k] = '\0';
    check_rejects(objs, "nesting deeper");
    free(objs);

    size_t big = 1000000;
    char *brackets = malloc(big);
    memset(brackets, '[', big);
    char err[256];
    CHECK(json_parse(brackets, big, err, sizeof err) == NULL, "accepted a million '['");
    free(brackets);
}

static void test_not_nul_terminated(void) {
    char err[256];
    const char buf[] = {'[', '1', ',', '2', ']', 'x', 'y'};
    JsonValue *v = parse_exact(buf, 5, err, sizeof err);
    CHECK(v && v->count == 2, "prefix of a longer buffer");
    json_free(v);
    v = parse_exact("1234", 2, err, sizeof err);
    CHECK(v && v->number == 12, "number stops at len");
    json_free(v);
    v = parse_exact("\"ab\"", 3, err, sizeof err);
    CHECK(v == NULL && strstr(err, "unterminated"), "string cut by len");
    json_free(v);
    v = parse_exact("true", 3, err, sizeof err);
    CHECK(v == NULL, "literal cut by len");
    json_free(v);
}

static const char *sample_document =
    "{\"model\": {\"dim\": 64, \"layers\": [1, 2.5, -3e2], \"name\": \"m\\u00e9\\ud83d\\ude00\\n\"},\n"
    " \"flags\": [true, false, null], \"empty\": {}, \"list\": [], \"esc\": \"\\\"\\\\\\/\"}";

// Every prefix must either parse or fail cleanly (ASan checks the reads).
static void test_truncation_never_crashes(void) {
    size_t len = strlen(sample_document);
    int accepted = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        char err[256];
        JsonValue *v = parse_exact(sample_document, cut, err, sizeof err);
        if (v) accepted++;
        else CHECK(err[0] != '\0', "no error message at cut %zu", cut);
        json_free(v);
    }
    CHECK(accepted == 1, "%d prefixes accepted, expected only the full document", accepted);
}

static void test_random_mutations_never_crash(void) {
    Rng rng;
    rng_seed(&rng, 1234);
    size_t len = strlen(sample_document);
    const char interesting[] = "{}[]\",:\\u0123456789eE+-.tfn \n\x00\x80\xff";
    for (int iter = 0; iter < 20000; iter++) {
        char *buf = malloc(len);
        memcpy(buf, sample_document, len);
        int flips = 1 + (int)rng_below(&rng, 4);
        for (int f = 0; f < flips; f++) {
            size_t at = rng_below(&rng, len);
            buf[at] = rng_below(&rng, 2) ? (char)rng_u64(&rng)
                                         : interesting[rng_below(&rng, sizeof interesting - 1)];
        }
        size_t cut = rng_below(&rng, 8) == 0 ? rng_below(&rng, len + 1) : len;
        char err[128];
        JsonValue *v = json_parse(buf, cut, err, sizeof err);
        json_free(v);
        free(buf);
    }
    // Pure random bytes too.
    for (int iter = 0; iter < 5000; iter++) {
        size_t n = rng_below(&rng, 64);
        char *buf = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) buf[i] = interesting[rng_below(&rng, sizeof interesting - 1)];
        JsonValue *v = json_parse(buf, n, NULL, 0);
        json_free(v);
        free(buf);
    }
    CHECK(1, "survived");
}

static void test_writer_pretty_exact(void) {
    JsonWriter w;
    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_string(&w, "name", "moe");
    jw_kv_int(&w, "dim", 64);
    jw_kv_double(&w, "lr", 0.001);
    jw_kv_bool(&w, "tied", 0);
    jw_key(&w, "shape");
    jw_begin_array(&w);
    jw_int(&w, 2);
    jw_int(&w, -3);
    jw_end_array(&w);
    jw_key(&w, "empty_obj");
    jw_begin_object(&w);
    jw_end_object(&w);
    jw_key(&w, "empty_arr");
    jw_begin_array(&w);
    jw_end_array(&w);
    jw_key(&w, "nested");
    jw_begin_array(&w);
    jw_begin_object(&w);
    jw_key(&w, "x");
    jw_null(&w);
    jw_end_object(&w);
    jw_end_array(&w);
    jw_end_object(&w);
    const char *expect = "{\n"
                         "  \"name\": \"moe\",\n"
                         "  \"dim\": 64,\n"
                         "  \"lr\": 0.001,\n"
                         "  \"tied\": false,\n"
                         "  \"shape\": [\n"
                         "    2,\n"
                         "    -3\n"
                         "  ],\n"
                         "  \"empty_obj\": {},\n"
                         "  \"empty_arr\": [],\n"
                         "  \"nested\": [\n"
                         "    {\n"
                         "      \"x\": null\n"
                         "    }\n"
                         "  ]\n"
                         "}";
    CHECK(strcmp(jw_text(&w), expect) == 0, "pretty output:\n%s", jw_text(&w));
    CHECK(jw_len(&w) == strlen(expect), "jw_len");
    JsonValue *v = parse(jw_text(&w));
    CHECK(v && v->count == 8, "pretty output parses back");
    json_free(v);
    jw_free(&w);
    CHECK(strcmp(jw_text(&w), "") == 0 && jw_len(&w) == 0, "freed writer is empty");
}

static void test_writer_compact_jsonl(void) {
    JsonWriter w;
    jw_init_compact(&w);
    for (int step = 1; step <= 2; step++) {
        jw_begin_object(&w);
        jw_kv_int(&w, "step", step);
        jw_kv_double(&w, "loss", 2.5);
        jw_key(&w, "v");
        jw_begin_array(&w);
        jw_int(&w, 1);
        jw_string(&w, "a b");
        jw_string(&w, NULL);
        jw_end_array(&w);
        jw_end_object(&w);
    }
    const char *expect = "{\"step\":1,\"loss\":2.5,\"v\":[1,\"a b\",null]}\n"
                         "{\"step\":2,\"loss\":2.5,\"v\":[1,\"a b\",null]}";
    CHECK(strcmp(jw_text(&w), expect) == 0, "compact output:\n%s", jw_text(&w));
    jw_free(&w);

    JsonWriter empty;
    jw_init(&empty);
    CHECK(strcmp(jw_text(&empty), "") == 0, "unused writer text");
    jw_free(&empty);
}

static void test_writer_escaping_round_trip(void) {
    char all_bytes[256];
    for (int i = 0; i < 255; i++) all_bytes[i] = (char)(i + 1);  // 1..255, then NUL
    all_bytes[255] = '\0';
    const char *strings[] = {"", "plain", "quote\" backslash\\ slash/", "\b\f\n\r\t\x01\x1f\x7f",
                             "caf\xc3\xa9 \xf0\x9f\x98\x80", all_bytes};
    JsonWriter w;
    jw_init(&w);
    jw_begin_array(&w);
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) jw_string(&w, strings[i]);
    jw_string_n(&w, "a\0b", 3);
    jw_end_array(&w);
    CHECK(strstr(jw_text(&w), "\\u0001") && strstr(jw_text(&w), "\\n"), "escapes: %s", jw_text(&w));
    JsonValue *v = parse(jw_text(&w));
    CHECK(v != NULL, "escaped output parses");
    if (v) {
        for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
            CHECK(strcmp(v->items[i].string, strings[i]) == 0, "string %zu round trip", i);
        CHECK(v->items[6].length == 3 && memcmp(v->items[6].string, "a\0b", 3) == 0, "embedded NUL");
    }
    json_free(v);
    jw_free(&w);

    jw_init(&w);
    jw_begin_object(&w);
    jw_kv_int(&w, "we\"ird\nkey", 1);
    jw_end_object(&w);
    v = parse(jw_text(&w));
    int64_t x = 0;
    CHECK(v && json_get_int64(v, "we\"ird\nkey", &x) && x == 1, "escaped key");
    json_free(v);
    jw_free(&w);
}

static void test_writer_numbers_round_trip(void) {
    Rng rng;
    rng_seed(&rng, 99);
    double fixed[] = {0.0, -0.0, 1.0, 0.1, 1e-6, 10000.0, 1e300, -2.2250738585072014e-308, 4.9e-324,
                      1.7976931348623157e308, 3.141592653589793, 1.0 / 3.0, 123456789012345678.0};
    int64_t ints[] = {0, 1, -1, INT64_MAX, INT64_MIN, 9007199254740993LL};
    enum { N_RANDOM = 2000 };
    JsonWriter w;
    jw_init_compact(&w);
    jw_begin_array(&w);
    double randoms[N_RANDOM];
    for (int i = 0; i < N_RANDOM; i++) {
        uint64_t bits;
        do {
            bits = rng_u64(&rng);
            memcpy(&randoms[i], &bits, sizeof bits);
        } while (!isfinite(randoms[i]));
    }
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) jw_double(&w, fixed[i]);
    for (int i = 0; i < N_RANDOM; i++) jw_double(&w, randoms[i]);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) jw_int(&w, ints[i]);
    jw_double(&w, NAN);
    jw_double(&w, INFINITY);
    jw_double(&w, -INFINITY);
    jw_end_array(&w);
    JsonValue *v = parse(jw_text(&w));
    CHECK(v != NULL, "number array parses");
    if (!v) {
        jw_free(&w);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++, k++) {
        CHECK(memcmp(&v->items[k].number, &fixed[i], sizeof(double)) == 0, "double %.17g came back as %.17g",
              fixed[i], v->items[k].number);
        CHECK(!v->items[k].is_integer, "double %.17g written like an integer", fixed[i]);
    }
    int mismatches = 0;
    for (int i = 0; i < N_RANDOM; i++, k++)
        mismatches += memcmp(&v->items[k].number, &randoms[i], sizeof(double)) != 0;
    CHECK(mismatches == 0, "%d random doubles did not round trip", mismatches);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++, k++) {
        int64_t x = 0;
        CHECK(json_as_int64(&v->items[k], &x) && x == ints[i], "int64 %lld", (long long)ints[i]);
    }
    for (int i = 0; i < 3; i++, k++) CHECK(v->items[k].type == JSON_NULL, "non-finite not written as null");
    CHECK(strstr(jw_text(&w), "10000.0") && strstr(jw_text(&w), "1e-06"), "formats: %.200s", jw_text(&w));
    json_free(v);
    jw_free(&w);
}

static void test_parse_file(void) {
    char err[256] = "";
    CHECK(json_parse_file("/tmp/moetron_missing.json", err, sizeof err) == NULL, "missing file parsed");
    CHECK(strstr(err, "cannot open") != NULL, "err: %s", err);
    char path[128];
    snprintf(path, sizeof path, "/tmp/moetron_test_json_%ld.json", (long)getpid());
    const char *text = "{\"a\": [1, 2]}\n";
    CHECK(write_file_atomic(path, text, strlen(text), err, sizeof err) == 0, "%s", err);
    JsonValue *v = json_parse_file(path, err, sizeof err);
    CHECK(v && json_get(v, "a")->count == 2, "file parse: %s", err);
    json_free(v);
    CHECK(write_file_atomic(path, "{\n\"a\" 1}", 8, err, sizeof err) == 0, "%s", err);
    v = json_parse_file(path, err, sizeof err);
    CHECK(v == NULL && strstr(err, "line 2 column 5: expected ':'"), "err: %s", err);
    remove(path);
}

int main(void) {
    RUN(test_parse_all_types);
    RUN(test_scalars_at_top_level);
    RUN(test_numbers);
    RUN(test_string_escapes_and_unicode);
    RUN(test_syntax_errors);
    RUN(test_error_without_buffer);
    RUN(test_depth_limit);
    RUN(test_not_nul_terminated);
    RUN(test_truncation_never_crashes);
    RUN(test_random_mutations_never_crash);
    RUN(test_writer_pretty_exact);
    RUN(test_writer_compact_jsonl);
    RUN(test_writer_escaping_round_trip);
    RUN(test_writer_numbers_round_trip);
    RUN(test_parse_file);
    TESTS_DONE();
}
