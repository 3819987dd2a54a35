// layer_pattern.c — a recursive-descent reader of the grammar
//   expr := term ('+' term)*      term := atom ('*' count)*
//   atom := '[' [bit (',' bit)*] ']' | '(' expr ')'      bit := 0 | 1
// writing the values of each atom in place and copying them for a repetition.
#include "core/layer_pattern.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    int *out;
    int n, cap;
    char *err;
    size_t err_cap;
    int failed;
} PatternReader;

static int fail(PatternReader *r, const char *what) {
    if (!r->failed) snprintf(r->err, r->err_cap, "%s", what);
    r->failed = 1;
    return 0;
}

static void skip_space(PatternReader *r) {
    while (isspace((unsigned char)*r->p)) r->p++;
}

// Whether the next non-space character is ch (consumed when it is).
static int take(PatternReader *r, char ch) {
    skip_space(r);
    if (*r->p != ch) return 0;
    r->p++;
    return 1;
}

static int append(PatternReader *r, int v) {
    if (r->n >= r->cap) return fail(r, "more entries than --num-layers");
    r->out[r->n++] = v;
    return 1;
}

static int read_expr(PatternReader *r);

static int read_list(PatternReader *r) {
    if (take(r, ']')) return 1;
    do {
        skip_space(r);
        if (*r->p != '0' && *r->p != '1') return fail(r, "list entries must be 0 or 1");
        if (!append(r, *r->p++ - '0')) return 0;
    } while (take(r, ','));
    return take(r, ']') || fail(r, "expected ',' or ']' in a list");
}

static int read_atom(PatternReader *r) {
    if (take(r, '[')) return read_list(r);
    if (take(r, '(')) return read_expr(r) && (take(r, ')') || fail(r, "expected ')'"));
    return fail(r, "expected '[' or '('");
}

// An atom, then each '* count' repeats what it wrote.
static int read_term(PatternReader *r) {
    int start = r->n;
    if (!read_atom(r)) return 0;
    while (take(r, '*')) {
        skip_space(r);
        char *end;
        long count = strtol(r->p, &end, 10);
        if (end == r->p || count < 0) return fail(r, "'*' needs a non-negative count");
        r->p = end;
        int len = r->n - start;
        if (count == 0) r->n = start;
        for (long k = 1; k < count && len > 0; k++)
            for (int i = 0; i < len; i++)
                if (!append(r, r->out[start + i])) return 0;
    }
    return 1;
}

static int read_expr(PatternReader *r) {
    if (!read_term(r)) return 0;
    while (take(r, '+'))
        if (!read_term(r)) return 0;
    return 1;
}

int layer_pattern_expand(const char *text, int *out, int cap, char *err, size_t err_cap) {
    PatternReader r = {.p = text, .out = out, .cap = cap, .err = err, .err_cap = err_cap};
    if (!read_expr(&r)) return -1;
    skip_space(&r);
    if (*r.p) {
        fail(&r, "unexpected text after the expression");
        return -1;
    }
    return r.n;
}
