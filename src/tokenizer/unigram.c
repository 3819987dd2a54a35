// unigram.c — the Unigram model's best path (see unigram.h).
#include "tokenizer/unigram.h"

#include <float.h>
#include <string.h>

#include "core/common.h"
#include "tokenizer/unicode.h"

#define UNKNOWN_PENALTY 10.0f    // sentencepiece's kUnkPenalty
#define USER_DEFINED_BONUS 0.1   // subtracted from length * max_score (a double there)

UnigramModel *unigram_new(int n_ids) {
    UnigramModel *m = mt_calloc(1, sizeof *m);
    strmap_init(&m->pieces);
    m->n_ids = n_ids;
    m->score = mt_calloc((size_t)n_ids + 1, sizeof(float));
    m->user_defined = mt_calloc((size_t)n_ids + 1, 1);
    m->min_score = FLT_MAX;
    m->max_score = FLT_MIN;  // as sentencepiece: the smallest positive float, not -FLT_MAX
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_id[b] = -1;
    return m;
}

int unigram_add_piece(UnigramModel *m, const char *text, size_t len, int32_t id, float score, int user_defined) {
    if (!strmap_put(&m->pieces, text, len, id)) return 0;
    m->score[id] = score;
    m->user_defined[id] = (unsigned char)user_defined;
    m->max_piece_len = MT_MAX(m->max_piece_len, len);
    if (!user_defined) {
        m->min_score = MT_MIN(m->min_score, score);
        m->max_score = MT_MAX(m->max_score, score);
    }
    return 1;
}

void unigram_free(UnigramModel *m) {
    if (!m) return;
    strmap_free(&m->pieces);
    free(m->score);
    free(m->user_defined);
    free(m);
}

typedef struct {
    int32_t id;
    float score;      // best path score up to here
    long starts_at;   // -1: no path ends here yet
} PathNode;

// A path ending at `end` that starts at `start` with the given total score replaces the
// best one there when it is better (the first one found wins ties).
static void offer(PathNode *node, double total, long start, int32_t id) {
    if (node->starts_at != -1 && !(total > (double)node->score)) return;
    node->score = (float)total;
    node->starts_at = start;
    node->id = id;
}

// Appends a node's ids: its piece, or for an unknown node its bytes' pieces (byte
// fallback) or the unknown id, once for a run of unknown nodes (as sentencepiece merges them).
static void emit(const UnigramModel *m, const char *s, const PathNode *node, size_t end, int after_unknown,
                 IdVec *out) {
    size_t start = (size_t)node->starts_at;
    if (node->id == m->unk_id && m->byte_fallback) {
        int all = 1;
        for (size_t i = start; i < end; i++) all &= m->byte_id[(unsigned char)s[i]] >= 0;
        if (all) {
            for (size_t i = start; i < end; i++) idvec_push(out, m->byte_id[(unsigned char)s[i]]);
            return;
        }
    }
    if (node->id != m->unk_id || !after_unknown) idvec_push(out, node->id);
}

void unigram_encode(const UnigramModel *m, const char *s, size_t len, IdVec *out) {
    if (!len) return;
    PathNode *best = mt_malloc((len + 1) * sizeof(PathNode));
    for (size_t i = 0; i <= len; i++) best[i] = (PathNode){.id = -1, .score = 0, .starts_at = -1};
    float unknown_score = m->min_score - UNKNOWN_PENALTY;
    for (size_t start = 0, width; start < len; start += width) {
        uint32_t cp;
        width = utf8_decode(s + start, len - start, &cp);
        float here = best[start].score;
        int single = 0;  // a piece covers exactly this character
        size_t longest = MT_MIN(m->max_piece_len, len - start);
        for (size_t n = 1; n <= longest; n++) {
            int32_t id = strmap_get(&m->pieces, s + start, n);
            if (id < 0) continue;
            double total = m->user_defined[id] ? (double)((float)n * m->max_score) - USER_DEFINED_BONUS + here
                                               : (double)(m->score[id] + here);
            offer(&best[start + n], total, (long)start, id);
            single |= n == width;
        }
        if (!single) offer(&best[start + width], (double)(unknown_score + here), (long)start, m->unk_id);
    }
    // Back from the end, then the nodes in order.
    size_t *ends = mt_malloc(len * sizeof(size_t)), n_nodes = 0;
    for (size_t end = len; end > 0; end = (size_t)best[end].starts_at) ends[n_nodes++] = end;
    for (size_t i = n_nodes; i-- > 0;)
        emit(m, s, &best[ends[i]], ends[i], i + 1 < n_nodes && best[ends[i + 1]].id == m->unk_id, out);
    free(ends);
    free(best);
}
