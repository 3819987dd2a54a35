// bpe_train.c — byte-level BPE training (the rule is in bpe_train.h).
//
// Training keeps, for every adjacent pair, its count and the list of words it occurs in,
// and a max-heap of (count, pair). A merge visits only the words in its pair's list and
// updates the counts of the pairs around each replaced occurrence; the heap is updated
// lazily: a pair whose count grew gets a fresh entry, and an entry whose count is stale
// (the pair shrank) is re-pushed with the true count when it reaches the top. Every pair
// always has an entry at least as large as its count, so the top entry that is not stale
// is the largest pair.
#include "tokenizer/bpe_train.h"

#include <string.h>

#include "core/common.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"

// ---- word counts ----------------------------------------------------------------------

void bpe_counts_init(BpeWordCounts *c) {
    memset(c, 0, sizeof *c);
    strmap_init(&c->words);
}

void bpe_counts_free(BpeWordCounts *c) {
    strmap_free(&c->words);
    free(c->counts);
    memset(c, 0, sizeof *c);
}

size_t bpe_counts_distinct(const BpeWordCounts *c) { return c->words.count; }

static void count_word(BpeWordCounts *c, const char *word, size_t len, int64_t times) {
    int32_t i = strmap_get(&c->words, word, len);
    if (i < 0) {
        i = (int32_t)c->words.count;
        if ((size_t)i == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 1024;
            c->counts = mt_realloc(c->counts, c->cap * sizeof(int64_t));
        }
        c->counts[i] = 0;
        strmap_put(&c->words, word, len, i);
    }
    c->counts[i] += times;
}

void bpe_counts_add_text(BpeWordCounts *c, const char *text, size_t len) {
    for (size_t pos = 0, end; pos < len; pos = end) {
        end = pretok_next(PRETOK_GPT2, text, len, pos);
        count_word(c, text + pos, end - pos, 1);
    }
}

void bpe_counts_merge(BpeWordCounts *into, const BpeWordCounts *from) {
    for (size_t i = 0; i < from->words.count; i++) {
        size_t len;
        const char *word = strmap_key(&from->words, i, &len);
        count_word(into, word, len, from->counts[from->words.entries[i].value]);
    }
}

// ---- training state -------------------------------------------------------------------

#define PAIR_KEY(left, right) (((uint64_t)(uint32_t)(left) << 32) | (uint32_t)(right))

typedef struct {
    uint64_t key;      // PAIR_KEY(left, right)
    int64_t count;
    int32_t *words;    // words it occurs in (possibly stale: a word may no longer hold it)
    uint32_t n_words, cap_words;
    int64_t grown_step;  // the last merge step in which the count grew
} Pair;

typedef struct {
    int64_t count;
    uint64_t key;
} HeapEntry;

typedef struct {
    // words: symbols (token ids) back to back; word w is sym[start[w] .. start[w] + len[w])
    int32_t *sym;
    size_t *start;
    uint32_t *len;
    int64_t *count;
    int64_t *visited;  // the merge step that last rewrote the word
    size_t n_words;
    // pairs: open addressing on key + 1 (0 = empty) -> index into pairs
    Pair *pairs;
    size_t n_pairs, cap_pairs;
    uint64_t *slot_key;
    int32_t *slot_pair;
    size_t slot_count;
    // max-heap, and the pairs that grew in the current merge step
    HeapEntry *heap;
    size_t heap_n, heap_cap;
    uint64_t *grown;
    size_t n_grown, cap_grown;
    int64_t step;
    // vocabulary being built
    StrMap token_ids;  // raw bytes -> id
    char *bytes;
    size_t bytes_len, bytes_cap;
    size_t *offset;
    int n_tokens, cap_tokens;
    int32_t (*merges)[2];
    int n_merges, cap_merges;
} Trainer;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t pair_slot(const Trainer *t, uint64_t key) {
    size_t mask = t->slot_count - 1, i = (size_t)mix64(key) & mask;
    while (t->slot_key[i] && t->slot_key[i] != key + 1) i = (i + 1) & mask;
    return i;
}

static void pair_rehash(Trainer *t, size_t slot_count) {
    free(t->slot_key);
    free(t->slot_pair);
    t->slot_count = slot_count;
    t->slot_key = mt_calloc(slot_count, sizeof(uint64_t));
    t->slot_pair = mt_malloc(slot_count * sizeof(int32_t));
    for (size_t p = 0; p < t->n_pairs; p++) {
        size_t s = pair_slot(t, t->pairs[p].key);
        t->slot_key[s] = t->pairs[p].key + 1;
        t->slot_pair[s] = (int32_t)p;
    }
}

// The pair (creating it with count 0 when create is set), or NULL.
static Pair *pair_get(Trainer *t, uint64_t key, int create) {
    size_t s = pair_slot(t, key);
    if (t->slot_key[s]) return &t->pairs[t->slot_pair[s]];
    if (!create) return NULL;
    if (2 * (t->n_pairs + 1) >= t->slot_count) {
        pair_rehash(t, 2 * t->slot_count);
        s = pair_slot(t, key);
    }
    if (t->n_pairs == t->cap_pairs) {
        t->cap_pairs = t->cap_pairs ? 2 * t->cap_pairs : 4096;
        t->pairs = mt_realloc(t->pairs, t->cap_pairs * sizeof(Pair));
    }
    if (t->n_pairs >= INT32_MAX) mt_die("BPE training: more than %d distinct pairs", INT32_MAX);
    Pair *p = &t->pairs[t->n_pairs];
    memset(p, 0, sizeof *p);
    p->key = key;
    p->grown_step = -1;
    t->slot_key[s] = key + 1;
    t->slot_pair[s] = (int32_t)t->n_pairs++;
    return p;
}

// Heap order: larger count first, then smaller key (smaller left id, then smaller right id).
static int heap_before(const HeapEntry *a, const HeapEntry *b) {
    return a->count != b->count ? a->count > b->count : a->key < b->key;
}

static void heap_push(Trainer *t, int64_t count, uint64_t key) {
    if (t->heap_n == t->heap_cap) {
        t->heap_cap = t->heap_cap ? 2 * t->heap_cap : 4096;
        t->heap = mt_realloc(t->heap, t->heap_cap * sizeof(HeapEntry));
    }
    size_t i = t->heap_n++;
    HeapEntry e = {count, key};
    while (i > 0 && heap_before(&e, &t->heap[(i - 1) / 2])) {
        t->heap[i] = t->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->heap[i] = e;
}

static HeapEntry heap_pop(Trainer *t) {
    HeapEntry top = t->heap[0], last = t->heap[--t->heap_n];
    size_t i = 0, n = t->heap_n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap_before(&t->heap[child + 1], &t->heap[child])) child++;
        if (!heap_before(&t->heap[child], &last)) break;
        t->heap[i] = t->heap[child];
        i = child;
    }
    if (n) t->heap[i] = last;
    return top;
}

// Adds delta occurrences of (left, right) in word w. A pair that grows is registered with
// w and noted in grown.
static void pair_add(Trainer *t, int32_t left, int32_t right, int64_t delta, int32_t w) {
    Pair *p = pair_get(t, PAIR_KEY(left, right), delta > 0);
    if (!p) return;
    p->count += delta;
    if (delta <= 0) return;
    if (p->grown_step != t->step) {
        p->grown_step = t->step;
        if (t->n_grown == t->cap_grown) {
            t->cap_grown = t->cap_grown ? 2 * t->cap_grown : 1024;
            t->grown = mt_realloc(t->grown, t->cap_grown * sizeof(uint64_t));
        }
        t->grown[t->n_grown++] = p->key;
    }
    if (p->n_words && p->words[p->n_words - 1] == w) return;
    if (p->n_words == p->cap_words) {
        p->cap_words = p->cap_words ? 2 * p->cap_words : 4;
        p->words = mt_realloc(p->words, p->cap_words * sizeof(int32_t));
    }
    p->words[p->n_words++] = w;
}

static int32_t add_token(Trainer *t, const char *bytes, size_t len) {
    int32_t existing = strmap_get(&t->token_ids, bytes, len);
    if (existing >= 0) return existing;
    if (t->n_tokens == t->cap_tokens) {
        t->cap_tokens = 2 * t->cap_tokens;
        t->offset = mt_realloc(t->offset, (size_t)(t->cap_tokens + 1) * sizeof(size_t));
    }
    if (t->bytes_len + len > t->bytes_cap) {
        t->bytes_cap = MT_MAX(2 * t->bytes_cap, t->bytes_len + len);
        t->bytes = mt_realloc(t->bytes, t->bytes_cap);
    }
    memcpy(t->bytes + t->bytes_len, bytes, len);
    t->bytes_len += len;
    int32_t id = t->n_tokens++;
    t->offset[t->n_tokens] = t->bytes_len;
    strmap_put(&t->token_ids, t->bytes + t->offset[id], len, id);
    return id;
}

static void init_alphabet(Trainer *t) {
    t->cap_tokens = 1024;
    t->offset = mt_malloc((size_t)(t->cap_tokens + 1) * sizeof(size_t));
    t->offset[0] = 0;
    strmap_init(&t->token_ids);
    // bytes in the order of their byte-level characters (U+0021 .. U+0143)
    for (uint32_t cp = 0; t->n_tokens < 256; cp++) {
        int b = byte_level_byte(cp);
        char c = (char)b;
        if (b >= 0) add_token(t, &c, 1);
    }
}

static void init_words(Trainer *t, const BpeWordCounts *c) {
    int32_t byte_token[256];
    for (int b = 0; b < 256; b++) {
        char ch = (char)b;
        byte_token[b] = strmap_get(&t->token_ids, &ch, 1);
    }
    size_t total = 0, n = 0;
    for (size_t i = 0; i < c->words.count; i++)
        if (c->words.entries[i].length > 1) total += c->words.entries[i].length, n++;
    t->sym = mt_malloc(MT_MAX(total, 1) * sizeof(int32_t));
    t->start = mt_malloc(MT_MAX(n, 1) * sizeof(size_t));
    t->len = mt_malloc(MT_MAX(n, 1) * sizeof(uint32_t));
    t->count = mt_malloc(MT_MAX(n, 1) * sizeof(int64_t));
    t->visited = mt_malloc(MT_MAX(n, 1) * sizeof(int64_t));
    if (n > INT32_MAX) mt_die("BPE training: more than %d distinct words", INT32_MAX);
    size_t at = 0;
    for (size_t i = 0; i < c->words.count; i++) {
        size_t len;
        const unsigned char *word = (const unsigned char *)strmap_key(&c->words, i, &len);
        if (len < 2) continue;  // a single byte has no pair and never changes
        size_t w = t->n_words++;
        t->start[w] = at;
        t->len[w] = (uint32_t)len;
        t->count[w] = c->counts[c->words.entries[i].value];
        t->visited[w] = -1;
        for (size_t k = 0; k < len; k++) t->sym[at++] = byte_token[word[k]];
    }
    pair_rehash(t, 1 << 16);
    t->step = -1;
    for (size_t w = 0; w < t->n_words; w++) {
        const int32_t *s = t->sym + t->start[w];
        for (uint32_t k = 0; k + 1 < t->len[w]; k++) pair_add(t, s[k], s[k + 1], t->count[w], (int32_t)w);
    }
    for (size_t p = 0; p < t->n_pairs; p++) heap_push(t, t->pairs[p].count, t->pairs[p].key);
}

// Replaces (a, b) by x in word w, left to right, updating the counts of the pairs around
// each occurrence.
static void merge_in_word(Trainer *t, int32_t w, int32_t a, int32_t b, int32_t x) {
    int32_t *s = t->sym + t->start[w];
    uint32_t n = t->len[w], out = 0;
    int64_t c = t->count[w];
    for (uint32_t r = 0; r < n;) {
        if (r + 1 < n && s[r] == a && s[r + 1] == b) {
            if (out > 0) {
                pair_add(t, s[out - 1], a, -c, w);
                pair_add(t, s[out - 1], x, c, w);
            }
            if (r + 2 < n) {
                pair_add(t, b, s[r + 2], -c, w);
                pair_add(t, x, s[r + 2], c, w);
            }
            pair_add(t, a, b, -c, w);
            s[out++] = x;
            r += 2;
        } else {
            s[out++] = s[r++];
        }
    }
    t->len[w] = out;
}

static void trainer_free_work(Trainer *t) {
    for (size_t p = 0; p < t->n_pairs; p++) free(t->pairs[p].words);
    free(t->pairs);
    free(t->slot_key);
    free(t->slot_pair);
    free(t->heap);
    free(t->grown);
    free(t->sym);
    free(t->start);
    free(t->len);
    free(t->count);
    free(t->visited);
    strmap_free(&t->token_ids);
}

void bpe_train(const BpeWordCounts *c, int target_tokens, BpeVocab *out) {
    Trainer t;
    memset(&t, 0, sizeof t);
    init_alphabet(&t);
    init_words(&t, c);
    while (t.n_tokens < target_tokens && t.heap_n) {
        HeapEntry top = heap_pop(&t);
        Pair *p = pair_get(&t, top.key, 0);
        if (p->count != top.count) {  // stale: the pair shrank since this entry was pushed
            if (p->count > 0) heap_push(&t, p->count, p->key);
            continue;
        }
        if (p->count <= 0) continue;
        int32_t a = (int32_t)(top.key >> 32), b = (int32_t)(uint32_t)top.key;
        size_t la = t.offset[a + 1] - t.offset[a], lb = t.offset[b + 1] - t.offset[b];
        char *joined = mt_malloc(la + lb);
        memcpy(joined, t.bytes + t.offset[a], la);
        memcpy(joined + la, t.bytes + t.offset[b], lb);
        int32_t x = add_token(&t, joined, la + lb);
        free(joined);
        if (t.n_merges == t.cap_merges) {
            t.cap_merges = t.cap_merges ? 2 * t.cap_merges : 1024;
            t.merges = mt_realloc(t.merges, (size_t)t.cap_merges * sizeof *t.merges);
        }
        t.step = t.n_merges;
        t.n_grown = 0;
        t.merges[t.n_merges][0] = a;
        t.merges[t.n_merges++][1] = b;
        // the word list may grow while we walk it (only for pairs holding x): take it over
        int32_t *words = p->words;
        uint32_t n_words = p->n_words;
        p->words = NULL;
        p->n_words = p->cap_words = 0;
        for (uint32_t i = 0; i < n_words; i++) {
            int32_t w = words[i];
            if (t.visited[w] == t.step) continue;
            t.visited[w] = t.step;
            merge_in_word(&t, w, a, b, x);
        }
        free(words);
        for (size_t i = 0; i < t.n_grown; i++) {
            const Pair *g = pair_get(&t, t.grown[i], 0);
            if (g->count > 0) heap_push(&t, g->count, g->key);
        }
        MT_ASSERT(pair_get(&t, top.key, 0)->count == 0);
    }
    out->n_tokens = t.n_tokens;
    out->bytes = t.bytes;
    out->offset = t.offset;
    out->n_merges = t.n_merges;
    out->merges = t.merges;
    trainer_free_work(&t);
}

void bpe_vocab_free(BpeVocab *v) {
    free(v->bytes);
    free(v->offset);
    free(v->merges);
    memset(v, 0, sizeof *v);
}
