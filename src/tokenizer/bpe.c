// bpe.c — the byte-level BPE model (see bpe.h). The merge loop follows Hugging Face's
// Word::merge_all: a min-heap of (rank, position) over adjacent pairs; a popped entry whose
// pair has since changed (its merged id no longer matches) is skipped; each merge pushes
// the new pairs with its left and right neighbours.
#include "tokenizer/bpe.h"

#include <string.h>

#include "core/common.h"
#include "tokenizer/unicode.h"

void idvec_push(IdVec *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = mt_realloc(a->v, a->cap * sizeof(int32_t));
    }
    a->v[a->n++] = id;
}

// ---- the GPT-2 byte alphabet ---------------------------------------------------------
// The 68 bytes that do not stand for themselves are 0x00-0x20 (n = 0..32), 0x7F-0xA0
// (n = 33..66) and 0xAD (n = 67).

uint32_t byte_level_char(unsigned char b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0) return 0x121 + (b - 0x7F);
    if (b == 0xAD) return 0x143;
    return b;
}

int byte_level_byte(uint32_t cp) {
    if (cp < 0x100) return byte_level_char((unsigned char)cp) == cp ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7F + (cp - 0x121));
    return cp == 0x143 ? 0xAD : -1;
}

// ---- merge map -----------------------------------------------------------------------

static uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static size_t merge_slot(const MergeMap *mm, uint64_t key) {
    size_t mask = mm->slot_count - 1, i = (size_t)mix64(key) & mask;
    while (mm->keys[i] && mm->keys[i] != key) i = (i + 1) & mask;
    return i;
}

static void merge_map_grow(MergeMap *mm) {
    MergeMap old = *mm;
    mm->slot_count = old.slot_count ? 2 * old.slot_count : 1024;
    mm->keys = mt_calloc(mm->slot_count, sizeof(uint64_t));
    mm->ranks = mt_malloc(mm->slot_count * sizeof(int32_t));
    mm->merged = mt_malloc(mm->slot_count * sizeof(int32_t));
    for (size_t i = 0; i < old.slot_count; i++) {
        if (!old.keys[i]) continue;
        size_t j = merge_slot(mm, old.keys[i]);
        mm->keys[j] = old.keys[i];
        mm->ranks[j] = old.ranks[i];
        mm->merged[j] = old.merged[i];
    }
    free(old.keys);
    free(old.ranks);
    free(old.merged);
}

void bpe_add_merge(BpeModel *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    MergeMap *mm = &m->merges;
    if (2 * (mm->count + 1) >= mm->slot_count) merge_map_grow(mm);
    uint64_t key = pair_key(left, right);
    size_t i = merge_slot(mm, key);
    if (!mm->keys[i]) mm->count++;
    mm->keys[i] = key;
    mm->ranks[i] = rank;
    mm->merged[i] = merged;
}

// The slot of the merge of (left, right), or -1 when the pair has none.
static long find_merge(const MergeMap *mm, int32_t left, int32_t right) {
    if (!mm->count) return -1;
    size_t i = merge_slot(mm, pair_key(left, right));
    return mm->keys[i] ? (long)i : -1;
}

// ---- model ---------------------------------------------------------------------------

void bpe_model_init(BpeModel *m) {
    memset(m, 0, sizeof *m);
    strmap_init(&m->vocab);
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_id[b] = m->fallback_id[b] = -1;
}

void bpe_model_free(BpeModel *m) {
    strmap_free(&m->vocab);
    free(m->merges.keys);
    free(m->merges.ranks);
    free(m->merges.merged);
    memset(m, 0, sizeof *m);
}

void bpe_index_bytes(BpeModel *m) {
    for (int b = 0; b < 256; b++) {
        char utf8[4];
        size_t n = utf8_encode(byte_level_char((unsigned char)b), utf8);
        m->byte_id[b] = strmap_get(&m->vocab, utf8, n);
        char fallback[8];
        snprintf(fallback, sizeof fallback, "<0x%02X>", b);
        m->fallback_id[b] = strmap_get(&m->vocab, fallback, strlen(fallback));
    }
}

// ---- merging one piece ---------------------------------------------------------------

typedef struct {
    int32_t id;
    int32_t prev, next;  // neighbour symbol indices, -1 at the ends
    int removed;         // merged into its left neighbour
} Symbol;

typedef struct {
    int32_t rank, pos, merged;
} Candidate;

struct BpeScratch {
    Symbol *sym;
    size_t sym_cap;
    Candidate *heap;
    size_t heap_n, heap_cap;
    char *text;  // the piece in the byte-level alphabet (ignore_merges lookups)
    size_t text_cap;
};

BpeScratch *bpe_scratch_new(void) { return mt_calloc(1, sizeof(BpeScratch)); }

void bpe_scratch_free(BpeScratch *s) {
    if (!s) return;
    free(s->sym);
    free(s->heap);
    free(s->text);
    free(s);
}

static int candidate_before(const Candidate *a, const Candidate *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(BpeScratch *s, Candidate c) {
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? 2 * s->heap_cap : 64;
        s->heap = mt_realloc(s->heap, s->heap_cap * sizeof(Candidate));
    }
    size_t i = s->heap_n++;
    while (i > 0 && candidate_before(&c, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static Candidate heap_pop(BpeScratch *s) {
    Candidate top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= s->heap_n) break;
        if (child + 1 < s->heap_n && candidate_before(&s->heap[child + 1], &s->heap[child])) child++;
        if (!candidate_before(&s->heap[child], &last)) break;
        s->heap[i] = s->heap[child];
        i = child;
    }
    if (s->heap_n) s->heap[i] = last;
    return top;
}

// Pushes the pair (pos, its right neighbour) when it has a merge.
static void push_pair(const BpeModel *m, BpeScratch *s, int32_t pos) {
    if (pos < 0 || s->sym[pos].next < 0) return;
    long slot = find_merge(&m->merges, s->sym[pos].id, s->sym[s->sym[pos].next].id);
    if (slot >= 0)
        heap_push(s, (Candidate){.rank = m->merges.ranks[slot], .pos = pos, .merged = m->merges.merged[slot]});
}

// The piece written in the byte-level alphabet (char_level: as it is), looked up as one
// vocabulary token.
static int32_t whole_piece_id(const BpeModel *m, const unsigned char *bytes, size_t n, BpeScratch *s) {
    if (m->char_level) return strmap_get(&m->vocab, (const char *)bytes, n);
    if (s->text_cap < 2 * n) {
        s->text_cap = 2 * n;
        s->text = mt_realloc(s->text, s->text_cap);
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += utf8_encode(byte_level_char(bytes[i]), s->text + len);
    return strmap_get(&m->vocab, s->text, len);
}

static void add_symbol(BpeScratch *s, size_t *count, int32_t id) {
    s->sym[*count] = (Symbol){.id = id, .prev = (int32_t)*count - 1, .next = (int32_t)*count + 1};
    (*count)++;
}

// The "<0xXX>" ids of bytes[0..n) as symbols, when byte_fallback has them all: 1, else 0.
static int add_fallback_symbols(const BpeModel *m, const unsigned char *bytes, size_t n, BpeScratch *s,
                                size_t *count) {
    if (!m->byte_fallback) return 0;
    for (size_t i = 0; i < n; i++)
        if (m->fallback_id[bytes[i]] < 0) return 0;
    for (size_t i = 0; i < n; i++) add_symbol(s, count, m->fallback_id[bytes[i]]);
    return 1;
}

// The initial symbols: one per byte (char_level: per character); a unit without a token
// becomes its byte-fallback tokens (char_level), else unk_id (consecutive ones fused into
// one when fuse_unk), or is dropped when there is no unk_token.
static size_t initial_symbols(const BpeModel *m, const unsigned char *bytes, size_t n, BpeScratch *s) {
    if (s->sym_cap < n) {
        s->sym_cap = n;
        s->sym = mt_realloc(s->sym, n * sizeof(Symbol));
    }
    size_t count = 0, width;
    int last_was_unk = 0;
    for (size_t i = 0; i < n; i += width) {
        int32_t id;
        if (m->char_level) {
            uint32_t cp;
            width = utf8_decode((const char *)bytes + i, n - i, &cp);
            id = strmap_get(&m->vocab, (const char *)bytes + i, width);
            if (id < 0 && add_fallback_symbols(m, bytes + i, width, s, &count)) {
                last_was_unk = 0;
                continue;
            }
        } else {
            width = 1;
            id = m->byte_id[bytes[i]];
        }
        int unk = id < 0;
        if (unk && m->unk_id < 0) continue;
        if (unk && last_was_unk && m->fuse_unk) continue;
        last_was_unk = unk;
        add_symbol(s, &count, unk ? m->unk_id : id);
    }
    if (count) s->sym[count - 1].next = -1;
    return count;
}

void bpe_encode_piece(const BpeModel *m, const unsigned char *bytes, size_t n, BpeScratch *s, IdVec *out) {
    if (!n) return;
    if (m->ignore_merges) {
        int32_t id = whole_piece_id(m, bytes, n, s);
        if (id >= 0) {
            idvec_push(out, id);
            return;
        }
    }
    size_t count = initial_symbols(m, bytes, n, s);
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < count; i++) push_pair(m, s, (int32_t)i);
    while (s->heap_n) {
        Candidate c = heap_pop(s);
        Symbol *left = &s->sym[c.pos];
        if (left->removed || left->next < 0) continue;
        Symbol *right = &s->sym[left->next];
        long slot = find_merge(&m->merges, left->id, right->id);
        if (slot < 0 || m->merges.merged[slot] != c.merged) continue;  // stale entry
        left->id = c.merged;
        right->removed = 1;
        left->next = right->next;
        if (right->next >= 0) s->sym[right->next].prev = c.pos;
        push_pair(m, s, left->prev);
        push_pair(m, s, c.pos);
    }
    for (int32_t i = count ? 0 : -1; i >= 0; i = s->sym[i].next) idvec_push(out, s->sym[i].id);
}
