// mock.c — generators for the built-in corpus. Each kind produces "pieces" (one line,
// or one sentence for the grammar kind); a document is a few pieces of one kind, kept
// within MOCK_DOC_MIN..MOCK_DOC_MAX bytes.
#include "data/mock.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"

#define PIECE_CAP 128  // every piece generator writes well under this

static int below(Rng *rng, int n) { return (int)rng_below(rng, (uint64_t)n); }
static int between(Rng *rng, int lo, int hi) { return lo + below(rng, hi - lo + 1); }

static void random_string(Rng *rng, const char *alphabet, int len, char *out) {
    int n = (int)strlen(alphabet);
    for (int i = 0; i < len; i++) out[i] = alphabet[below(rng, n)];
    out[len] = '\0';
}

static const char LOWER[] = "abcdefghijklmnopqrstuvwxyz";

// ---- arith: "a+b=c\n" or "a-b=c\n", 0 <= a,b <= 99, subtraction never negative.
static int gen_arith(Rng *rng, char *out) {
    int a = below(rng, 100), b = below(rng, 100);
    int plus = below(rng, 2);
    if (!plus && a < b) {
        int t = a;
        a = b;
        b = t;
    }
    return snprintf(out, PIECE_CAP, "%d%c%d=%d\n", a, plus ? '+' : '-', b,
                    plus ? a + b : a - b);
}

// ---- copy: "copy: s|s\n", s 2..10 random lowercase letters.
static int gen_copy(Rng *rng, char *out) {
    char s[16];
    random_string(rng, LOWER, between(rng, 2, 10), s);
    return snprintf(out, PIECE_CAP, "copy: %s|%s\n", s, s);
}

// ---- reverse: "reverse: s|r\n", s 2..10 random lowercase letters, r = s reversed.
static int gen_reverse(Rng *rng, char *out) {
    char s[16], r[16];
    int n = between(rng, 2, 10);
    random_string(rng, LOWER, n, s);
    for (int i = 0; i < n; i++) r[i] = s[n - 1 - i];
    r[n] = '\0';
    return snprintf(out, PIECE_CAP, "reverse: %s|%s\n", s, r);
}

// ---- sort: "sort: s|t\n", s 2..10 chars, all digits or all lowercase letters
// (repeats allowed), t = s sorted ascending.
static int gen_sort(Rng *rng, char *out) {
    char s[16], t[16];
    int n = between(rng, 2, 10);
    random_string(rng, below(rng, 2) ? "0123456789" : LOWER, n, s);
    memcpy(t, s, (size_t)n + 1);
    for (int i = 1; i < n; i++)  // insertion sort
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            char c = t[j];
            t[j] = t[j - 1];
            t[j - 1] = c;
        }
    return snprintf(out, PIECE_CAP, "sort: %s|%s\n", s, t);
}

// ---- brackets: "b ok\n" or "b bad\n", b 1..12 chars of ()[]{}<>; "ok" exactly when b
// is balanced and properly nested. About half are balanced by construction, the rest
// corrupted by one edit (the verdict is always computed, never assumed).
static const char OPENS[] = "([{<", CLOSES[] = ")]}>";

static int brackets_balanced(const char *b, int n) {
    char stack[PIECE_CAP];
    int top = 0;
    for (int i = 0; i < n; i++) {
        const char *o = strchr(OPENS, b[i]);
        if (o) {
            stack[top++] = CLOSES[o - OPENS];
        } else {
            if (top == 0 || stack[top - 1] != b[i]) return 0;
            top--;
        }
    }
    return top == 0;
}

static int gen_brackets(Rng *rng, char *out) {
    char b[16], stack[16];
    int pairs = between(rng, 1, 6), opens_left = pairs, top = 0, n = 0;
    while (opens_left > 0 || top > 0) {
        if (top == 0 || (opens_left > 0 && below(rng, 2))) {
            int k = below(rng, 4);
            b[n++] = OPENS[k];
            stack[top++] = CLOSES[k];
            opens_left--;
        } else {
            b[n++] = stack[--top];
        }
    }
    if (below(rng, 2)) {  // corrupt with one edit
        int i = below(rng, n);
        switch (below(rng, 3)) {
        case 0:  // replace one char by a random bracket (may happen to keep it balanced)
            b[i] = below(rng, 2) ? OPENS[below(rng, 4)] : CLOSES[below(rng, 4)];
            break;
        case 1:  // swap two neighbours
            if (n >= 2) {
                int j = i == n - 1 ? i - 1 : i + 1;
                char c = b[i];
                b[i] = b[j];
                b[j] = c;
            }
            break;
        default:  // drop one char, unless that would leave nothing
            if (n > 1) {
                memmove(b + i, b + i + 1, (size_t)(n - i - 1));
                n--;
            }
            break;
        }
    }
    b[n] = '\0';
    return snprintf(out, PIECE_CAP, "%s %s\n", b, brackets_balanced(b, n) ? "ok" : "bad");
}

// ---- count: "count c: s|k\n", c one of a..e, s 1..12 letters of a..e, k = number of
// times c occurs in s (decimal, may be 0).
static int gen_count(Rng *rng, char *out) {
    static const char ALPHA[] = "abcde";
    char s[16];
    int n = between(rng, 1, 12);
    random_string(rng, ALPHA, n, s);
    char c = ALPHA[below(rng, 5)];
    int k = 0;
    for (int i = 0; i < n; i++) k += s[i] == c;
    return snprintf(out, PIECE_CAP, "count %c: %s|%d\n", c, s, k);
}

// ---- recall: "kA=x kB=y ... ? kB -> y\n": 2..6 pairs with distinct digit keys and
// lowercase values (repeats allowed), then a query of one of those keys and its value.
static int gen_recall(Rng *rng, char *out) {
    int keys[10];
    for (int i = 0; i < 10; i++) keys[i] = i;
    int n = between(rng, 2, 6);
    for (int i = 0; i < n; i++) {  // partial Fisher-Yates: n distinct keys
        int j = i + below(rng, 10 - i);
        int t = keys[i];
        keys[i] = keys[j];
        keys[j] = t;
    }
    char vals[6];
    int len = 0;
    for (int i = 0; i < n; i++) {
        vals[i] = LOWER[below(rng, 26)];
        len += snprintf(out + len, PIECE_CAP - len, "k%d=%c ", keys[i], vals[i]);
    }
    int q = below(rng, n);
    len += snprintf(out + len, PIECE_CAP - len, "? k%d -> %c\n", keys[q], vals[q]);
    return len;
}

// ---- grammar: sentences "DET [ADJ] NOUN VERB DET [ADJ] NOUN." joined by single
// spaces, the document ending in '\n'. Each determiner agrees in number with its noun
// ("the" fits both), the verb agrees with the subject noun, and "a" becomes "an"
// before a vowel.
static const char *const DET_SG[] = {"the", "a", "one", "this", "that", "every"};
static const char *const DET_PL[] = {"the", "two", "three", "some", "these", "those", "many"};
static const char *const ADJS[] = {"small", "big", "red", "old",   "happy", "green",
                                   "quiet", "angry", "blue", "tiny", "orange", "empty"};
static const char *const NOUN_SG[] = {"cat", "dog",  "bird", "fox",   "child", "mouse", "owl",
                                      "apple", "box", "ball", "tree", "girl", "boy",   "egg"};
static const char *const NOUN_PL[] = {"cats",  "dogs",  "birds", "foxes", "children",
                                      "mice",  "owls",  "apples", "boxes", "balls",
                                      "trees", "girls", "boys",  "eggs"};
static const char *const VERB_SG[] = {"sees", "chases", "likes", "finds",
                                      "watches", "carries", "has", "wants"};
static const char *const VERB_PL[] = {"see", "chase", "like", "find",
                                      "watch", "carry", "have", "want"};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int gen_noun_phrase(Rng *rng, char *out, int *plural) {
    int pl = below(rng, 2);
    const char *det = pl ? DET_PL[below(rng, COUNT(DET_PL))] : DET_SG[below(rng, COUNT(DET_SG))];
    const char *adj = below(rng, 2) ? ADJS[below(rng, COUNT(ADJS))] : NULL;
    int ni = below(rng, COUNT(NOUN_SG));
    const char *noun = pl ? NOUN_PL[ni] : NOUN_SG[ni];
    const char *next = adj ? adj : noun;
    if (strcmp(det, "a") == 0 && strchr("aeiou", next[0])) det = "an";
    *plural = pl;
    if (adj) return snprintf(out, PIECE_CAP, "%s %s %s", det, adj, noun);
    return snprintf(out, PIECE_CAP, "%s %s", det, noun);
}

static int gen_sentence(Rng *rng, char *out) {
    char subj[PIECE_CAP], obj[PIECE_CAP];
    int subj_pl, obj_pl;
    gen_noun_phrase(rng, subj, &subj_pl);
    int vi = below(rng, COUNT(VERB_SG));
    gen_noun_phrase(rng, obj, &obj_pl);
    return snprintf(out, PIECE_CAP, "%s %s %s.", subj, subj_pl ? VERB_PL[vi] : VERB_SG[vi], obj);
}

typedef struct {
    const char *name;
    int (*gen)(Rng *rng, char *out);  // one piece, NUL-terminated; returns its length
    int min_pieces, max_pieces;       // target piece count per document
} Kind;

static const Kind KINDS[] = {
    {"arith", gen_arith, 2, 6},      {"copy", gen_copy, 1, 4},
    {"reverse", gen_reverse, 1, 4},  {"sort", gen_sort, 1, 4},
    {"brackets", gen_brackets, 2, 6}, {"grammar", gen_sentence, 1, 3},
    {"count", gen_count, 1, 4},      {"recall", gen_recall, 1, 3},
};

int mock_kind_count(void) { return COUNT(KINDS); }

const char *mock_kind_name(int kind) {
    MT_ASSERT(kind >= 0 && kind < COUNT(KINDS));
    return KINDS[kind].name;
}

int mock_document(Rng *rng, int kind, char *buf, int cap) {
    MT_ASSERT(kind >= 0 && kind < COUNT(KINDS));
    const Kind *k = &KINDS[kind];
    int grammar = k->gen == gen_sentence;
    // The grammar kind joins sentences with ' ' and ends with '\n': reserve that byte.
    int limit = MOCK_DOC_MAX - grammar;
    char doc[MOCK_DOC_MAX + 1], piece[PIECE_CAP];
    int len = 0, pieces = 0;
    int target = between(rng, k->min_pieces, k->max_pieces);
    while (pieces < target || len + grammar < MOCK_DOC_MIN) {
        int n = k->gen(rng, piece);
        int sep = grammar && pieces > 0;
        MT_ASSERT(n > 0 && n + 1 < PIECE_CAP);
        if (len + sep + n > limit) break;  // never happens before MOCK_DOC_MIN is reached
        if (sep) doc[len++] = ' ';
        memcpy(doc + len, piece, (size_t)n);
        len += n;
        pieces++;
    }
    if (grammar) doc[len++] = '\n';
    MT_ASSERT(len >= MOCK_DOC_MIN && len <= MOCK_DOC_MAX);
    if (cap <= 0) return 0;
    int out = MT_MIN(len, cap - 1);
    memcpy(buf, doc, (size_t)out);
    buf[out] = '\0';
    return out;
}

void mock_corpus(uint64_t seed, int64_t n_tokens, int32_t eod, int32_t *tokens) {
    Rng rng;
    rng_seed_stream(&rng, seed, 0x6d6f636b64617461ULL);  // "mockdata": apart from model init
    char doc[MOCK_DOC_MAX + 1];
    int64_t pos = 0;
    while (pos < n_tokens) {
        int len = mock_document(&rng, below(&rng, COUNT(KINDS)), doc, (int)sizeof doc);
        for (int i = 0; i < len && pos < n_tokens; i++) tokens[pos++] = (unsigned char)doc[i];
        if (pos < n_tokens) tokens[pos++] = eod;
    }
}
