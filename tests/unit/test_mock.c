// test_mock.c — the built-in corpus: determinism, prefix property, token range, kind
// frequencies, and that every kind's documents are well-formed and *correct* (checked
// by independent parsers written here, not by reusing the generator's code).
#include <string.h>

#include "core/common.h"
#include "core/rng.h"
#include "data/mock.h"
#include "testlib.h"

#define EOD 256

// ---------------------------------------------------------------- small parsing helpers

typedef struct {
    const char *p, *end;
} Cursor;

static int lit(Cursor *c, const char *s) {
    size_t n = strlen(s);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0) return 0;
    c->p += n;
    return 1;
}

// A decimal number without superfluous leading zeros.
static int number(Cursor *c, long *out) {
    const char *s = c->p;
    long v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && c->p - s < 9) v = v * 10 + (*c->p++ - '0');
    int n = (int)(c->p - s);
    if (n == 0 || (n > 1 && s[0] == '0')) return 0;
    *out = v;
    return 1;
}

// A run of chars from `set`, length in [lo, hi]; copied NUL-terminated into out.
static int run_of(Cursor *c, const char *set, int lo, int hi, char *out) {
    int n = 0;
    while (c->p < c->end && *c->p && strchr(set, *c->p) && n <= hi) out[n++] = *c->p++;
    out[n] = '\0';
    return n >= lo && n <= hi;
}

static int at_end(const Cursor *c) { return c->p == c->end; }

static const char *LOWER = "abcdefghijklmnopqrstuvwxyz";

// ---------------------------------------------------------------- per-line verifiers

static int check_arith(Cursor c) {
    long a, b, r;
    if (!number(&c, &a)) return 0;
    int plus = lit(&c, "+");
    if (!plus && !lit(&c, "-")) return 0;
    if (!number(&c, &b) || !lit(&c, "=") || !number(&c, &r) || !at_end(&c)) return 0;
    if (a > 99 || b > 99) return 0;
    return plus ? r == a + b : r == a - b;
}

static int check_copy(Cursor c) {
    char s[64], t[64];
    if (!lit(&c, "copy: ") || !run_of(&c, LOWER, 2, 10, s) || !lit(&c, "|") ||
        !run_of(&c, LOWER, 2, 10, t) || !at_end(&c))
        return 0;
    return strcmp(s, t) == 0;
}

static int check_reverse(Cursor c) {
    char s[64], t[64];
    if (!lit(&c, "reverse: ") || !run_of(&c, LOWER, 2, 10, s) || !lit(&c, "|") ||
        !run_of(&c, LOWER, 2, 10, t) || !at_end(&c))
        return 0;
    int n = (int)strlen(s);
    if ((int)strlen(t) != n) return 0;
    for (int i = 0; i < n; i++)
        if (t[i] != s[n - 1 - i]) return 0;
    return 1;
}

static int check_sort(Cursor c) {
    char s[64], t[64];
    if (!lit(&c, "sort: ")) return 0;
    const char *set = (c.p < c.end && *c.p >= '0' && *c.p <= '9') ? "0123456789" : LOWER;
    if (!run_of(&c, set, 2, 10, s) || !lit(&c, "|") || !run_of(&c, set, 2, 10, t) ||
        !at_end(&c))
        return 0;
    int hist[256] = {0};
    for (const char *q = s; *q; q++) hist[(unsigned char)*q]++;
    for (const char *q = t; *q; q++) hist[(unsigned char)*q]--;
    for (int i = 0; i < 256; i++)
        if (hist[i]) return 0;  // not a permutation
    for (int i = 1; t[i]; i++)
        if (t[i - 1] > t[i]) return 0;  // not ascending
    return 1;
}

// Independent balance check: a counter per closing char would be wrong for "([)]", so
// repeatedly delete adjacent matched pairs until none remain.
static int balanced_by_reduction(const char *b) {
    char s[64];
    strcpy(s, b);
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int i = 0; s[i] && s[i + 1]; i++) {
            char x = s[i], y = s[i + 1];
            if ((x == '(' && y == ')') || (x == '[' && y == ']') || (x == '{' && y == '}') ||
                (x == '<' && y == '>')) {
                memmove(s + i, s + i + 2, strlen(s + i + 2) + 1);
                changed = 1;
                break;
            }
        }
    }
    return s[0] == '\0';
}

static int n_bracket_ok, n_bracket_bad;

static int check_brackets(Cursor c) {
    char b[64];
    if (!run_of(&c, "()[]{}<>", 1, 12, b) || !lit(&c, " ")) return 0;
    int ok = lit(&c, "ok");
    if (!ok && !lit(&c, "bad")) return 0;
    if (!at_end(&c)) return 0;
    if (ok != balanced_by_reduction(b)) return 0;
    if (ok) n_bracket_ok++;
    else n_bracket_bad++;
    return 1;
}

static int check_count(Cursor c) {
    char ch[4], s[64];
    long k;
    if (!lit(&c, "count ") || !run_of(&c, "abcde", 1, 1, ch) || !lit(&c, ": ") ||
        !run_of(&c, "abcde", 1, 12, s) || !lit(&c, "|") || !number(&c, &k) || !at_end(&c))
        return 0;
    long actual = 0;
    for (const char *q = s; *q; q++) actual += *q == ch[0];
    return k == actual;
}

static int check_recall(Cursor c) {
    char val[10];
    int seen[10] = {0}, n = 0;
    char d[4], v[4];
    while (lit(&c, "k")) {
        if (!run_of(&c, "0123456789", 1, 1, d) || !lit(&c, "=") || !run_of(&c, LOWER, 1, 1, v) ||
            !lit(&c, " "))
            return 0;
        int key = d[0] - '0';
        if (seen[key]) return 0;  // keys must be distinct, or the answer is ambiguous
        seen[key] = 1;
        val[key] = v[0];
        n++;
    }
    if (n < 2 || n > 6) return 0;
    if (!lit(&c, "? k") || !run_of(&c, "0123456789", 1, 1, d) || !lit(&c, " -> ") ||
        !run_of(&c, LOWER, 1, 1, v) || !at_end(&c))
        return 0;
    int key = d[0] - '0';
    return seen[key] && val[key] == v[0];
}

// ---------------------------------------------------------------- grammar

static const char *SG_DETS[] = {"the", "a", "an", "one", "this", "that", "every", NULL};
static const char *PL_DETS[] = {"the", "two", "three", "some", "these", "those", "many", NULL};
static const char *ADJ_WORDS[] = {"small", "big",   "red",  "old",  "happy",  "green",
                                  "quiet", "angry", "blue", "tiny", "orange", "empty", NULL};
static const char *SG_NOUNS[] = {"cat", "dog", "bird", "fox", "child", "mouse", "owl", "apple",
                                 "box", "ball", "tree", "girl", "boy", "egg", NULL};
static const char *PL_NOUNS[] = {"cats",  "dogs",  "birds", "foxes", "children",
                                 "mice",  "owls",  "apples", "boxes", "balls",
                                 "trees", "girls", "boys",  "eggs", NULL};
static const char *SG_VERBS[] = {"sees",    "chases",  "likes", "finds",
                                 "watches", "carries", "has",   "wants", NULL};
static const char *PL_VERBS[] = {"see", "chase", "like", "find", "watch", "carry", "have", "want", NULL};

static int in_list(const char *w, const char **list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(w, list[i]) == 0) return 1;
    return 0;
}

// Noun phrase words[*i..]: returns 1 (singular) / 2 (plural) / 0 (invalid).
static int check_np(char **w, int nw, int *i) {
    if (*i >= nw) return 0;
    const char *det = w[(*i)++];
    const char *adj = NULL;
    if (*i < nw && in_list(w[*i], ADJ_WORDS)) adj = w[(*i)++];
    if (*i >= nw) return 0;
    const char *noun = w[(*i)++];
    int sg = in_list(noun, SG_NOUNS), pl = in_list(noun, PL_NOUNS);
    if (!sg && !pl) return 0;
    if (sg && !in_list(det, SG_DETS)) return 0;
    if (pl && !in_list(det, PL_DETS)) return 0;
    const char *next = adj ? adj : noun;
    int vowel = strchr("aeiou", next[0]) != NULL;
    if (strcmp(det, "a") == 0 && vowel) return 0;
    if (strcmp(det, "an") == 0 && !vowel) return 0;
    return sg ? 1 : 2;
}

static int check_sentence(char *s) {  // s: words without the final '.'
    char *w[16];
    int nw = 0;
    for (char *tok = strtok(s, " "); tok; tok = strtok(NULL, " ")) {
        if (nw == 16) return 0;
        w[nw++] = tok;
    }
    int i = 0;
    int subj = check_np(w, nw, &i);
    if (!subj || i >= nw) return 0;
    const char *verb = w[i++];
    if (!in_list(verb, subj == 1 ? SG_VERBS : PL_VERBS)) return 0;
    if (!check_np(w, nw, &i)) return 0;
    return i == nw;
}

static int check_grammar_doc(const char *doc, int len) {
    if (len < 2 || doc[len - 1] != '\n' || memchr(doc, '\n', (size_t)len - 1)) return 0;
    char s[256];
    memcpy(s, doc, (size_t)len - 1);
    s[len - 1] = '\0';
    // Sentences are "... ." joined by exactly one space.
    int n = 0;
    char *p = s;
    while (*p) {
        char *dot = strchr(p, '.');
        if (!dot || dot == p) return 0;
        *dot = '\0';
        for (char *q = p; *q; q++)
            if (!(*q == ' ' || (*q >= 'a' && *q <= 'z'))) return 0;
        if (p[0] == ' ' || dot[-1] == ' ' || strstr(p, "  ")) return 0;
        if (!check_sentence(p)) return 0;
        n++;
        p = dot + 1;
        if (*p == ' ') {
            p++;
            if (!*p) return 0;
        } else if (*p) {
            return 0;
        }
    }
    return n >= 1;
}

// ---------------------------------------------------------------- document verifier

static int doc_chars_ok(const char *doc, int len) {
    for (int i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)doc[i];
        if (!(ch == '\n' || (ch >= 32 && ch < 127))) return 0;
    }
    return 1;
}

// Is doc[0..len) a well-formed, correct document of this kind (by name)?
static int verify(const char *name, const char *doc, int len) {
    if (len < MOCK_DOC_MIN || len > MOCK_DOC_MAX || !doc_chars_ok(doc, len)) return 0;
    if (strcmp(name, "grammar") == 0) return check_grammar_doc(doc, len);
    int (*line_check)(Cursor) = NULL;
    if (strcmp(name, "arith") == 0) line_check = check_arith;
    else if (strcmp(name, "copy") == 0) line_check = check_copy;
    else if (strcmp(name, "reverse") == 0) line_check = check_reverse;
    else if (strcmp(name, "sort") == 0) line_check = check_sort;
    else if (strcmp(name, "brackets") == 0) line_check = check_brackets;
    else if (strcmp(name, "count") == 0) line_check = check_count;
    else if (strcmp(name, "recall") == 0) line_check = check_recall;
    if (!line_check) return 0;
    if (doc[len - 1] != '\n') return 0;
    const char *p = doc, *end = doc + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        Cursor c = {p, nl};
        if (!line_check(c)) return 0;
        p = nl + 1;
    }
    return 1;
}

// Which kinds does this document verify as? Returns the kind when exactly one, else -1.
static int classify(const char *doc, int len) {
    int found = -1;
    for (int k = 0; k < mock_kind_count(); k++)
        if (verify(mock_kind_name(k), doc, len)) {
            if (found >= 0) return -1;
            found = k;
        }
    return found;
}

// ---------------------------------------------------------------- cases

static void test_kinds(void) {
    int n = mock_kind_count();
    CHECK(n >= 7, "only %d kinds", n);
    const char *expected[] = {"arith", "copy", "reverse", "sort", "brackets", "grammar", "count", "recall"};
    for (int i = 0; i < 8; i++) {
        int found = 0;
        for (int k = 0; k < n; k++) found += strcmp(mock_kind_name(k), expected[i]) == 0;
        CHECK(found == 1, "kind %s appears %d times", expected[i], found);
    }
}

static void test_documents_correct(void) {
    Rng rng;
    rng_seed(&rng, 1234);
    char buf[MOCK_DOC_MAX + 1];
    for (int k = 0; k < mock_kind_count(); k++) {
        const char *name = mock_kind_name(k);
        int bad = 0, ambiguous = 0, minlen = 1 << 30, maxlen = 0;
        n_bracket_ok = n_bracket_bad = 0;
        for (int s = 0; s < 1000; s++) {
            memset(buf, 'X', sizeof buf);
            int len = mock_document(&rng, k, buf, (int)sizeof buf);
            minlen = MT_MIN(minlen, len);
            maxlen = MT_MAX(maxlen, len);
            int ok_len = len >= MOCK_DOC_MIN && len <= MOCK_DOC_MAX && buf[len] == '\0' &&
                         (int)strlen(buf) == len;
            if (!ok_len || !verify(name, buf, len)) {
                if (bad++ < 3) CHECK(0, "kind %s, sample %d invalid (len %d): \"%s\"", name, s, len, buf);
            } else if (classify(buf, len) != k) {
                if (ambiguous++ < 3) CHECK(0, "kind %s, sample %d also parses as another kind: \"%s\"", name, s, buf);
            }
        }
        CHECK(bad == 0, "kind %s: %d/1000 invalid", name, bad);
        CHECK(ambiguous == 0, "kind %s: %d/1000 ambiguous", name, ambiguous);
        CHECK(minlen >= MOCK_DOC_MIN && maxlen <= MOCK_DOC_MAX, "kind %s: lengths %d..%d", name,
              minlen, maxlen);
        if (strcmp(name, "brackets") == 0)  // both verdicts must be common
            CHECK(n_bracket_ok > 500 && n_bracket_bad > 500, "brackets: %d ok / %d bad lines",
                  n_bracket_ok, n_bracket_bad);
    }
}

static void test_determinism(void) {
    enum { N = 20000 };
    int32_t *a = mt_malloc(N * sizeof *a), *b = mt_malloc(N * sizeof *b);
    mock_corpus(42, N, EOD, a);
    mock_corpus(42, N, EOD, b);
    CHECK(memcmp(a, b, N * sizeof *a) == 0, "same seed gave different corpora");
    mock_corpus(43, N, EOD, b);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += a[i] != b[i];
    CHECK(diff > N / 2, "seeds 42 and 43 differ in only %d/%d tokens", diff, N);
    free(a);
    free(b);
}

static void test_prefix(void) {
    enum { N = 30000 };
    int32_t *full = mt_malloc(N * sizeof *full), *part = mt_malloc(N * sizeof *part);
    mock_corpus(7, N, EOD, full);
    const int64_t ms[] = {0, 1, 2, 9, 10, 11, 57, 100, 1000, 4321, 29999};
    for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
        int64_t m = ms[j];
        for (int i = 0; i < N; i++) part[i] = -12345;
        mock_corpus(7, m, EOD, part);
        CHECK(m == 0 || memcmp(part, full, (size_t)m * sizeof *part) == 0,
              "first %lld tokens differ from the longer corpus", (long long)m);
        CHECK(part[m] == -12345, "corpus of %lld tokens wrote past its end", (long long)m);
    }
    free(full);
    free(part);
}

static void test_token_range(void) {
    enum { N = 100000 };
    int32_t *t = mt_malloc(N * sizeof *t);
    const int32_t eods[] = {EOD, 300};
    for (int e = 0; e < 2; e++) {
        int32_t eod = eods[e];
        mock_corpus(5, N, eod, t);
        int bad = 0, empty_docs = 0, n_eod = 0;
        for (int i = 0; i < N; i++) {
            int32_t x = t[i];
            if (x == eod) {
                n_eod++;
                if (i == 0 || t[i - 1] == eod) empty_docs++;
            } else if (!(x == '\n' || (x >= 32 && x < 127))) {
                bad++;  // stricter than [0, 255]: printable ASCII or '\n'
            }
        }
        CHECK(bad == 0, "eod %d: %d tokens out of range", eod, bad);
        CHECK(empty_docs == 0, "eod %d: %d empty documents", eod, empty_docs);
        CHECK(n_eod > N / (MOCK_DOC_MAX + 1), "eod %d: only %d documents", eod, n_eod);
    }
    free(t);
}

static void test_corpus_kinds_uniform(void) {
    enum { N = 100000 };
    int32_t *t = mt_malloc(N * sizeof *t);
    mock_corpus(99, N, EOD, t);
    int K = mock_kind_count();
    int counts[64] = {0}, docs = 0, unclassified = 0;
    char doc[MOCK_DOC_MAX + 2];
    int len = 0, overflow = 0;
    for (int i = 0; i < N; i++) {  // only whole documents: the last, cut one is skipped
        if (t[i] == EOD) {
            int k = overflow ? -1 : classify(doc, len);
            if (k < 0) {
                doc[MT_MIN(len, MOCK_DOC_MAX)] = '\0';
                if (unclassified++ < 3) CHECK(0, "corpus document %d not exactly one kind: \"%s\"", docs, doc);
            } else {
                counts[k]++;
            }
            docs++;
            len = 0;
            overflow = 0;
        } else if (len < MOCK_DOC_MAX + 1) {
            doc[len++] = (char)t[i];
        } else {
            overflow = 1;
        }
    }
    CHECK(unclassified == 0, "%d/%d documents unclassified", unclassified, docs);
    double mean = (double)docs / K;
    for (int k = 0; k < K; k++)
        CHECK(counts[k] > 0.7 * mean && counts[k] < 1.3 * mean, "kind %s: %d documents, mean %.1f",
              mock_kind_name(k), counts[k], mean);
    free(t);
}

static void test_buffer_capacity(void) {
    for (int k = 0; k < mock_kind_count(); k++) {
        for (int cap = 0; cap <= MOCK_DOC_MAX + 2; cap++) {
            Rng r1, r2;
            rng_seed(&r1, 1000 + (uint64_t)k);
            rng_seed(&r2, 1000 + (uint64_t)k);
            char full[MOCK_DOC_MAX + 1];
            int flen = mock_document(&r1, k, full, (int)sizeof full);
            char buf[MOCK_DOC_MAX + 16];
            memset(buf, '#', sizeof buf);
            int len = mock_document(&r2, k, buf, cap);
            int want = cap <= 0 ? 0 : MT_MIN(flen, cap - 1);
            CHECK(len == want, "kind %d cap %d: returned %d, want %d", k, cap, len, want);
            if (cap > 0) {
                CHECK(buf[len] == '\0', "kind %d cap %d: not NUL-terminated", k, cap);
                CHECK(memcmp(buf, full, (size_t)len) == 0, "kind %d cap %d: not a prefix", k, cap);
            }
            int spill = 0;
            for (int i = MT_MAX(cap, 0); i < (int)sizeof buf; i++) spill += buf[i] != '#';
            CHECK(spill == 0, "kind %d cap %d: wrote %d bytes past cap", k, cap, spill);
            CHECK(memcmp(&r1, &r2, sizeof r1) == 0, "kind %d cap %d: rng use depends on cap", k, cap);
        }
    }
}

int main(void) {
    RUN(test_kinds);
    RUN(test_documents_correct);
    RUN(test_determinism);
    RUN(test_prefix);
    RUN(test_token_range);
    RUN(test_corpus_kinds_uniform);
    RUN(test_buffer_capacity);
    TESTS_DONE();
}
