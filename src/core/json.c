// json.c — strict recursive-descent JSON parser and a pretty/compact writer.
// The parser works on (text, len) with every read bounds-checked, so it is safe
// on arbitrary bytes; recursion is bounded by JSON_MAX_DEPTH.
#include "json.h"

#include "common.h"
#include "fileio.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

// ===========================================================================
// Parser

typedef struct {
    const char *text;
    size_t len;
    size_t pos;  // next byte to read; error positions are reported from here
    char *err;
    size_t errlen;
    int failed;
} Parser;

static int peek(const Parser *p) { return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1; }

static void skip_whitespace(Parser *p) {
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

// Records "line L column C: <message>" for the byte at p->pos (first error wins).
static int parse_error(Parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int parse_error(Parser *p, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    if (!p->err || !p->errlen) return -1;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->text[i] == '\n') line++, column = 1;
        else column++;
    }
    char message[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "line %zu column %zu: %s", line, column, message);
    return -1;
}

// "unexpected character 'x'", "unexpected byte 0x01" or "unexpected end of input".
static int unexpected(Parser *p) {
    int c = peek(p);
    if (c < 0) return parse_error(p, "unexpected end of input");
    if (c >= 0x20 && c < 0x7f) return parse_error(p, "unexpected character '%c'", c);
    return parse_error(p, "unexpected byte 0x%02x", c);
}

static void free_contents(JsonValue *v) {
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        free_contents(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lengths);
    memset(v, 0, sizeof *v);
}

static int parse_value(Parser *p, JsonValue *out, int depth);

// ---- literals --------------------------------------------------------------

static int parse_literal(Parser *p, JsonValue *out) {
    static const struct {
        const char *word;
        JsonType type;
        int boolean;
    } literals[] = {{"true", JSON_BOOL, 1}, {"false", JSON_BOOL, 0}, {"null", JSON_NULL, 0}};
    for (size_t i = 0; i < sizeof literals / sizeof literals[0]; i++) {
        size_t n = strlen(literals[i].word);
        if (p->len - p->pos >= n && memcmp(p->text + p->pos, literals[i].word, n) == 0) {
            out->type = literals[i].type;
            out->boolean = literals[i].boolean;
            p->pos += n;
            return 0;
        }
    }
    return unexpected(p);
}

// ---- numbers ---------------------------------------------------------------

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static void skip_digits(Parser *p) {
    while (is_digit(peek(p))) p->pos++;
}

// Exact value of an integer literal [-]digits, if it fits in int64_t.
static int integer_literal_value(const char *s, size_t n, int64_t *out) {
    int negative = s[0] == '-';
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t value = 0;
    for (size_t i = negative ? 1 : 0; i < n; i++) {
        uint64_t digit = (uint64_t)(s[i] - '0');
        if (value > (limit - digit) / 10) return 0;
        value = value * 10 + digit;
    }
    if (negative) *out = value == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)value;
    else *out = (int64_t)value;
    return 1;
}

// number = [-] (0 | [1-9][0-9]*) [. [0-9]+] [(e|E) [+|-] [0-9]+]
static int parse_number(Parser *p, JsonValue *out) {
    size_t start = p->pos;
    if (peek(p) == '-') p->pos++;
    if (peek(p) == '0') {
        p->pos++;
        if (is_digit(peek(p))) return parse_error(p, "invalid number: leading zero");
    } else if (is_digit(peek(p))) {
        skip_digits(p);
    } else {
        return parse_error(p, "invalid number: expected a digit");
    }
    int is_integer = 1;
    if (peek(p) == '.') {
        p->pos++;
        if (!is_digit(peek(p))) return parse_error(p, "invalid number: expected a digit after '.'");
        skip_digits(p);
        is_integer = 0;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-') p->pos++;
        if (!is_digit(peek(p))) return parse_error(p, "invalid number: expected a digit in the exponent");
        skip_digits(p);
        is_integer = 0;
    }
    // strtod needs a NUL-terminated copy; the input itself may not have one.
    size_t n = p->pos - start;
    char small[64];
    char *copy = n < sizeof small ? small : mt_malloc(n + 1);
    memcpy(copy, p->text + start, n);
    copy[n] = '\0';
    double value = strtod(copy, NULL);
    out->type = JSON_NUMBER;
    out->number = value;
    out->is_integer = is_integer;
    out->has_int64 = is_integer && integer_literal_value(copy, n, &out->integer);
    if (copy != small) free(copy);
    if (isinf(value)) {
        p->pos = start;
        return parse_error(p, "number out of range");
    }
    return 0;
}

// ---- strings ---------------------------------------------------------------

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads 4 hex digits at text[at..at+4) (at+4 <= limit); -1 if malformed.
static long read_hex4(const char *text, size_t at, size_t limit) {
    if (at + 4 > limit) return -1;
    long code = 0;
    for (size_t i = 0; i < 4; i++) {
        int h = hex_value((unsigned char)text[at + i]);
        if (h < 0) return -1;
        code = code * 16 + h;
    }
    return code;
}

static size_t utf8_encode(unsigned long code, char *out) {
    if (code < 0x80) {
        out[0] = (char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (char)(0xC0 | (code >> 6));
        out[1] = (char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (char)(0xE0 | (code >> 12));
        out[1] = (char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (code >> 18));
    out[1] = (char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (char)(0x80 | (code & 0x3F));
    return 4;
}

// Decodes the \u escape whose 'u' is at text[*i]; on return *i is the last byte
// consumed. A valid surrogate pair becomes one code point; a lone surrogate
// becomes U+FFFD.
static int decode_unicode_escape(Parser *p, size_t *i, size_t end, unsigned long *code) {
    long first = read_hex4(p->text, *i + 1, end);
    if (first < 0) {
        p->pos = *i - 1;
        return parse_error(p, "invalid \\u escape: expected 4 hex digits");
    }
    *i += 4;
    *code = (unsigned long)first;
    if (first >= 0xDC00 && first <= 0xDFFF) *code = 0xFFFD;
    if (first >= 0xD800 && first <= 0xDBFF) {
        long second = -1;
        if (*i + 2 < end && p->text[*i + 1] == '\\' && p->text[*i + 2] == 'u')
            second = read_hex4(p->text, *i + 3, end);
        if (second >= 0xDC00 && second <= 0xDFFF) {
            *code = 0x10000 + (((unsigned long)first - 0xD800) << 10) + ((unsigned long)second - 0xDC00);
            *i += 6;
        } else {
            *code = 0xFFFD;
        }
    }
    return 0;
}

// Finds the closing quote of the string whose opening quote is at p->pos.
static int find_string_end(Parser *p, size_t *end) {
    size_t i = p->pos + 1;
    while (i < p->len) {
        char c = p->text[i];
        if (c == '"') {
            *end = i;
            return 0;
        }
        i += c == '\\' ? 2 : 1;
    }
    return parse_error(p, "unterminated string");
}

static int decode_escape(Parser *p, size_t *i, size_t end, char *out, size_t *n) {
    char e = p->text[*i];
    const char *simple = "\"\"\\\\//b\bf\fn\nr\rt\t";
    for (const char *s = simple; *s; s += 2) {
        if (e == s[0]) {
            out[(*n)++] = s[1];
            return 0;
        }
    }
    if (e == 'u') {
        unsigned long code = 0;
        if (decode_unicode_escape(p, i, end, &code)) return -1;
        *n += utf8_encode(code, out + *n);
        return 0;
    }
    p->pos = *i - 1;
    if ((unsigned char)e >= 0x20 && (unsigned char)e < 0x7f) return parse_error(p, "invalid escape '\\%c'", e);
    return parse_error(p, "invalid escape");
}

// Parses the string at p->pos into a new NUL-terminated buffer. Decoded text is
// never longer than its source, so the source length bounds the allocation.
static int parse_string(Parser *p, char **out, size_t *out_len) {
    size_t end = 0;
    if (find_string_end(p, &end)) return -1;
    char *buf = mt_malloc(end - p->pos);
    size_t n = 0;
    for (size_t i = p->pos + 1; i < end; i++) {
        unsigned char c = (unsigned char)p->text[i];
        if (c < 0x20) {
            p->pos = i;
            free(buf);
            return parse_error(p, "control character 0x%02x in string (use an escape)", c);
        }
        if (c != '\\') {
            buf[n++] = (char)c;
            continue;
        }
        i++;  // the escape letter; find_string_end guarantees i < end
        if (decode_escape(p, &i, end, buf, &n)) {
            free(buf);
            return -1;
        }
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    p->pos = end + 1;
    return 0;
}

// ---- containers ------------------------------------------------------------

static void grow_items(JsonValue *v, size_t *cap, int with_keys) {
    if (v->count < *cap) return;
    *cap = *cap ? *cap * 2 : 4;
    v->items = mt_realloc(v->items, *cap * sizeof *v->items);
    if (with_keys) {
        v->keys = mt_realloc(v->keys, *cap * sizeof *v->keys);
        v->key_lengths = mt_realloc(v->key_lengths, *cap * sizeof *v->key_lengths);
    }
    memset(&v->items[v->count], 0, (*cap - v->count) * sizeof *v->items);
}

static int check_depth(Parser *p, int depth) {
    if (depth > JSON_MAX_DEPTH) return parse_error(p, "nesting deeper than %d", JSON_MAX_DEPTH);
    return 0;
}

// array = '[' [value (',' value)*] ']'
static int parse_array(Parser *p, JsonValue *out, int depth) {
    if (check_depth(p, depth)) return -1;
    out->type = JSON_ARRAY;
    p->pos++;  // '['
    skip_whitespace(p);
    if (peek(p) == ']') {
        p->pos++;
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        grow_items(out, &cap, 0);
        if (parse_value(p, &out->items[out->count], depth)) return -1;
        out->count++;
        skip_whitespace(p);
        int c = peek(p);
        p->pos += c == ',' || c == ']';
        if (c == ']') return 0;
        if (c != ',') return c < 0 ? unexpected(p) : parse_error(p, "expected ',' or ']'");
    }
}

// object = '{' [string ':' value (',' string ':' value)*] '}'
static int parse_object(Parser *p, JsonValue *out, int depth) {
    if (check_depth(p, depth)) return -1;
    out->type = JSON_OBJECT;
    p->pos++;  // '{'
    skip_whitespace(p);
    if (peek(p) == '}') {
        p->pos++;
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        skip_whitespace(p);
        if (peek(p) != '"') return peek(p) < 0 ? unexpected(p) : parse_error(p, "expected a string key");
        grow_items(out, &cap, 1);
        size_t i = out->count;
        if (parse_string(p, &out->keys[i], &out->key_lengths[i])) return -1;
        out->count++;  // from here on free_contents owns the key
        skip_whitespace(p);
        if (peek(p) != ':') return peek(p) < 0 ? unexpected(p) : parse_error(p, "expected ':'");
        p->pos++;
        if (parse_value(p, &out->items[i], depth)) return -1;
        skip_whitespace(p);
        int c = peek(p);
        p->pos += c == ',' || c == '}';
        if (c == '}') return 0;
        if (c != ',') return c < 0 ? unexpected(p) : parse_error(p, "expected ',' or '}'");
    }
}

// Parses one value into *out (zeroed by the caller). On failure the partial
// value is freed and *out is zeroed again.
static int parse_value(Parser *p, JsonValue *out, int depth) {
    skip_whitespace(p);
    int c = peek(p);
    int rc;
    if (c == '{') rc = parse_object(p, out, depth + 1);
    else if (c == '[') rc = parse_array(p, out, depth + 1);
    else if (c == '"') {
        out->type = JSON_STRING;
        rc = parse_string(p, &out->string, &out->length);
    } else if (c == '-' || is_digit(c)) rc = parse_number(p, out);
    else if (c == 't' || c == 'f' || c == 'n') rc = parse_literal(p, out);
    else rc = unexpected(p);
    if (rc) free_contents(out);
    return rc;
}

JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    Parser p = {.text = text, .len = len, .pos = 0, .err = err, .errlen = errlen, .failed = 0};
    if (err && errlen) err[0] = '\0';
    JsonValue *v = mt_calloc(1, sizeof *v);
    if (parse_value(&p, v, 0) == 0) {
        skip_whitespace(&p);
        if (p.pos == p.len) return v;
        parse_error(&p, "unexpected trailing characters after the JSON value");
        free_contents(v);
    }
    free(v);
    return NULL;
}

JsonValue *json_parse_file(const char *path, char *err, size_t errlen) {
    size_t len;
    uint8_t *bytes = read_file_all(path, INFILE_CONFIG, &len, err, errlen);
    if (!bytes) return NULL;
    JsonValue *v = json_parse((const char *)bytes, len, err, errlen);
    free(bytes);
    return v;
}

void json_free(JsonValue *v) {
    if (!v) return;
    free_contents(v);
    free(v);
}

// ===========================================================================
// Accessors

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->count; i++)
        if (obj->key_lengths[i] == n && memcmp(obj->keys[i], key, n) == 0) return &obj->items[i];
    return NULL;
}

const JsonValue *json_at(const JsonValue *arr, size_t i) {
    if (!arr || arr->type != JSON_ARRAY || i >= arr->count) return NULL;
    return &arr->items[i];
}

int json_as_int64(const JsonValue *v, int64_t *out) {
    if (!v || v->type != JSON_NUMBER) return 0;
    if (v->has_int64) {
        *out = v->integer;
        return 1;
    }
    if (v->is_integer) return 0;  // an integer literal too large for int64_t
    const double exact_limit = 9007199254740992.0;  // 2^53
    if (v->number != floor(v->number) || fabs(v->number) > exact_limit) return 0;
    *out = (int64_t)v->number;
    return 1;
}

int json_get_number(const JsonValue *obj, const char *key, double *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER) return 0;
    *out = v->number;
    return 1;
}

int json_get_int64(const JsonValue *obj, const char *key, int64_t *out) {
    return json_as_int64(json_get(obj, key), out);
}

int json_get_bool(const JsonValue *obj, const char *key, int *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_BOOL) return 0;
    *out = v->boolean;
    return 1;
}

const char *json_get_string(const JsonValue *obj, const char *key) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->string : NULL;
}

// ===========================================================================
// Writer

void jw_init(JsonWriter *w) { memset(w, 0, sizeof *w); }

void jw_init_compact(JsonWriter *w) {
    jw_init(w);
    w->compact = 1;
}

static void append(JsonWriter *w, const char *s, size_t n) {
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        while (cap < w->len + n + 1) cap *= 2;
        w->buf = mt_realloc(w->buf, cap);
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void append_str(JsonWriter *w, const char *s) { append(w, s, strlen(s)); }

static void newline_and_indent(JsonWriter *w) {
    if (w->compact) return;
    append(w, "\n", 1);
    for (int i = 0; i < w->depth; i++) append(w, "  ", 2);
}

// Separator before a new item of the innermost container (comma, newline, indent).
static void start_item(JsonWriter *w) {
    int *has_items = &w->has_items[w->depth - 1];
    if (*has_items) append(w, ",", 1);
    *has_items = 1;
    newline_and_indent(w);
}

static void begin_value(JsonWriter *w) {
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth == 0) {
        if (w->top_level_count > 0) append(w, "\n", 1);
        return;
    }
    MT_ASSERT(w->open[w->depth - 1] == '[');  // object members need jw_key first
    start_item(w);
}

static void end_value(JsonWriter *w) {
    if (w->depth == 0) w->top_level_count++;
}

static void write_escaped(JsonWriter *w, const char *s, size_t n) {
    append(w, "\"", 1);
    size_t run = 0;  // bytes copied verbatim in one go
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        append(w, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': append_str(w, "\\\""); break;
        case '\\': append_str(w, "\\\\"); break;
        case '\n': append_str(w, "\\n"); break;
        case '\r': append_str(w, "\\r"); break;
        case '\t': append_str(w, "\\t"); break;
        case '\b': append_str(w, "\\b"); break;
        case '\f': append_str(w, "\\f"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            append_str(w, esc);
        }
    }
    append(w, s + run, n - run);
    append(w, "\"", 1);
}

static void begin_container(JsonWriter *w, char open) {
    begin_value(w);
    MT_ASSERT(w->depth < JW_MAX_DEPTH);
    append(w, &open, 1);
    w->open[w->depth] = open;
    w->has_items[w->depth] = 0;
    w->depth++;
}

static void end_container(JsonWriter *w, char open, char close) {
    MT_ASSERT(w->depth > 0 && w->open[w->depth - 1] == open && !w->after_key);
    w->depth--;
    if (w->has_items[w->depth]) newline_and_indent(w);
    append(w, &close, 1);
    end_value(w);
}

void jw_begin_object(JsonWriter *w) { begin_container(w, '{'); }
void jw_end_object(JsonWriter *w) { end_container(w, '{', '}'); }
void jw_begin_array(JsonWriter *w) { begin_container(w, '['); }
void jw_end_array(JsonWriter *w) { end_container(w, '[', ']'); }

void jw_key(JsonWriter *w, const char *key) {
    MT_ASSERT(w->depth > 0 && w->open[w->depth - 1] == '{' && !w->after_key);
    start_item(w);
    write_escaped(w, key, strlen(key));
    append_str(w, w->compact ? ":" : ": ");
    w->after_key = 1;
}

static void write_scalar(JsonWriter *w, const char *text) {
    begin_value(w);
    append_str(w, text);
    end_value(w);
}

void jw_string_n(JsonWriter *w, const char *s, size_t n) {
    begin_value(w);
    write_escaped(w, s, n);
    end_value(w);
}

void jw_string(JsonWriter *w, const char *s) {
    if (!s) jw_null(w);
    else jw_string_n(w, s, strlen(s));
}

void jw_int(JsonWriter *w, int64_t v) {
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, v);
    write_scalar(w, text);
}

void jw_double(JsonWriter *w, double v) {
    if (!isfinite(v)) {
        jw_null(w);
        return;
    }
    char text[40];
    snprintf(text, sizeof text, "%.15g", v);
    if (strtod(text, NULL) != v) snprintf(text, sizeof text, "%.17g", v);
    if (!strpbrk(text, ".eE")) strcat(text, ".0");  // keep it a float for readers like Python
    write_scalar(w, text);
}

void jw_bool(JsonWriter *w, int v) { write_scalar(w, v ? "true" : "false"); }
void jw_null(JsonWriter *w) { write_scalar(w, "null"); }

void jw_kv_string(JsonWriter *w, const char *key, const char *s) {
    jw_key(w, key);
    jw_string(w, s);
}

void jw_kv_int(JsonWriter *w, const char *key, int64_t v) {
    jw_key(w, key);
    jw_int(w, v);
}

void jw_kv_double(JsonWriter *w, const char *key, double v) {
    jw_key(w, key);
    jw_double(w, v);
}

void jw_kv_bool(JsonWriter *w, const char *key, int v) {
    jw_key(w, key);
    jw_bool(w, v);
}

const char *jw_text(JsonWriter *w) { return w->buf ? w->buf : ""; }
size_t jw_len(JsonWriter *w) { return w->len; }

void jw_free(JsonWriter *w) {
    free(w->buf);
    memset(w, 0, sizeof *w);
}
