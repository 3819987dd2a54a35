// gpt_samples.c — Megatron-Core's GPTDataset sample order (gpt_samples.h).
#include "data/gpt_samples.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "core/np_random.h"
#include "core/progress.h"
#include "data/blend.h"

#define SEPARATE_FINAL_EPOCH_THRESHOLD 0.80  // GPTDataset's threshold

// parse_and_normalize_split: every run of [.0-9] is one number.
void gpt_split_matrix(const char *split, SplitMatrix *m) {
    double v[3] = {0, 0, 0};
    int n = 0;
    for (const char *p = split; *p;) {
        size_t run = strspn(p, ".0123456789");
        if (!run) {
            p++;
            continue;
        }
        char number[64], *end;
        if (run >= sizeof number) mt_die("--split '%s': a number is too long", split);
        memcpy(number, p, run);
        number[run] = 0;
        if (n == 3) mt_die("--split '%s' has more than three parts; give train,valid,test e.g. 969,30,1", split);
        v[n++] = strtod(number, &end);
        if (*end) mt_die("--split '%s': '%s' is not a number; give train,valid,test e.g. 969,30,1", split, number);
        p += run;
    }
    double normalised[3];
    if (np_sum_f64(v, 3) <= 0) mt_die("--split '%s' must have a positive sum, e.g. 969,30,1", split);
    blend_normalize(v, 3, normalised);
    // convert_split_vector_to_split_matrix: cumulative book-ends; None where a split has no width.
    double at = 0;
    for (int s = 0; s < 3; s++) {
        double next = at + normalised[s];
        m->present[s] = next > at;
        m->begin[s] = at;
        m->end[s] = next;
        at = next;
    }
}

void gpt_split_range(const SplitMatrix *m, int s, int64_t num_sequences, int64_t *first, int64_t *count) {
    // int(round(x)) in Python: round half to even, which rint does in the default rounding mode.
    int64_t begin = (int64_t)rint(m->begin[s] * (double)num_sequences);
    int64_t end = (int64_t)rint(m->end[s] * (double)num_sequences);
    *first = begin;
    *count = end > begin ? end - begin : 0;
}

int64_t gpt_tokens_in_range(const int32_t *sequence_lengths, int64_t first, int64_t count) {
    int64_t tokens = 0;
    for (int64_t i = first; i < first + count; i++) tokens += sequence_lengths[i];
    return tokens;
}

void gpt_plan_epochs(GptIndex *g, int64_t tokens_per_epoch, int64_t num_samples, int seq_length) {
    MT_ASSERT(tokens_per_epoch > 0 && seq_length > 0);
    memset(g, 0, sizeof *g);
    g->tokens_per_epoch = tokens_per_epoch;
    int64_t epochs = 1;
    if (num_samples >= 0) {
        if (num_samples > (INT64_MAX - 1) / seq_length) mt_die("--num-samples %lld is too large", (long long)num_samples);
        int64_t needed = num_samples * seq_length + 1;  // one extra token for the last target
        epochs = MT_MAX((needed + tokens_per_epoch - 1) / tokens_per_epoch, 1);
    }
    if (epochs > INT32_MAX)
        mt_die("%lld samples of %d tokens need %lld epochs of a %lld-token split; Megatron allows 2^31 - 1",
               (long long)num_samples, seq_length, (long long)epochs, (long long)tokens_per_epoch);
    g->num_epochs = (int32_t)epochs;
    g->n_samples = (epochs * tokens_per_epoch - 1) / seq_length;
    if (epochs == 1) return;
    // Shuffle the last epoch apart when it contributes too few samples to mix well.
    int64_t before_final = ((epochs - 1) * tokens_per_epoch - 1) / seq_length;
    int64_t from_final = num_samples - before_final;
    int64_t per_epoch = (tokens_per_epoch - 1) / seq_length;
    MT_ASSERT(from_final >= 0 && from_final <= per_epoch + 1);
    g->separate_final_epoch = from_final < (int64_t)(SEPARATE_FINAL_EPOCH_THRESHOLD * (double)per_epoch);
    g->samples_before_final_epoch = before_final;
}

// _build_document_index: `epochs` copies of the range, shuffled together.
static void shuffled_epochs(int32_t *out, int64_t first, int64_t count, int64_t epochs, NpRandomState *rs) {
    for (int64_t e = 0; e < epochs; e++)
        for (int64_t i = 0; i < count; i++) out[e * count + i] = (int32_t)(first + i);
    np_random_shuffle(rs, out, epochs * count, sizeof *out);
}

// helpers.cpp build_sample_idx with add_extra_token_to_sequence and drop_last_partial_sequence:
// walk the documents in order, each sample taking seq_length + 1 tokens and the next sample
// starting on its last token.
static void build_sample_index(GptIndex *g, const int32_t *sequence_lengths, int seq_length) {
    enum { REPORT_EVERY = 1 << 16 };  // samples between progress updates
    int64_t *out = g->sample_index;
    int64_t doc = 0, offset = 0;
    out[0] = 0;
    out[1] = 0;
    Progress pg;
    progress_begin(&pg, "sample index", "k samples", 1e3, (double)g->n_samples, PROGRESS_WHEN_SLOW);
    for (int64_t s = 1; s <= g->n_samples; s++) {
        if (s % REPORT_EVERY == 0) progress_update(&pg, (double)s);
        int64_t remaining = (int64_t)seq_length + 1;
        for (;;) {
            int64_t available = sequence_lengths[g->document_index[doc]] - offset;
            if (available >= remaining) {  // the sample ends inside this document
                offset += remaining - 1;
                break;
            }
            remaining -= available;
            doc++;
            offset = 0;
            MT_ASSERT(doc < g->n_documents);
        }
        out[2 * s] = doc;
        out[2 * s + 1] = offset;
    }
    progress_update(&pg, (double)g->n_samples);
    progress_end(&pg);
}

void gpt_index_build(GptIndex *g, const int32_t *sequence_lengths, int64_t first, int64_t count,
                     int64_t num_samples, int seq_length, uint32_t seed) {
    gpt_plan_epochs(g, gpt_tokens_in_range(sequence_lengths, first, count), num_samples, seq_length);
    NpRandomState rs;
    np_random_seed(&rs, seed);
    int64_t epochs = g->num_epochs;
    g->n_documents = epochs * count;
    g->document_index = mt_malloc((size_t)g->n_documents * sizeof *g->document_index);
    if (g->separate_final_epoch) {
        shuffled_epochs(g->document_index, first, count, epochs - 1, &rs);
        shuffled_epochs(g->document_index + (epochs - 1) * count, first, count, 1, &rs);
    } else {
        shuffled_epochs(g->document_index, first, count, epochs, &rs);
    }

    g->sample_index = mt_malloc((size_t)(g->n_samples + 1) * 2 * sizeof *g->sample_index);
    build_sample_index(g, sequence_lengths, seq_length);

    // _build_shuffle_index: [0, split) and [split, n) shuffled one after the other.
    int64_t n = g->n_samples, split = g->separate_final_epoch ? g->samples_before_final_epoch : n;
    g->shuffle_index = mt_malloc((size_t)(n ? n : 1) * sizeof *g->shuffle_index);
    for (int64_t i = 0; i < n; i++) g->shuffle_index[i] = i;
    np_random_shuffle(&rs, g->shuffle_index, split, sizeof *g->shuffle_index);
    if (split < n) np_random_shuffle(&rs, g->shuffle_index + split, n - split, sizeof *g->shuffle_index);
}

void gpt_index_free(GptIndex *g) {
    free(g->document_index);
    free(g->sample_index);
    free(g->shuffle_index);
    g->document_index = NULL;
    g->sample_index = NULL;
    g->shuffle_index = NULL;
}

void gpt_sample(const GptIndex *g, const IndexedDataset *ds, int seq_length, int64_t i, int32_t *tokens) {
    MT_ASSERT(i >= 0 && i < g->n_samples);
    int64_t k = g->shuffle_index[i];
    const int64_t *at = g->sample_index + 2 * k;
    int64_t first_doc = at[0], first_offset = at[1], last_doc = at[2], last_offset = at[3];
    int64_t filled = 0;
    for (int64_t d = first_doc; d <= last_doc; d++) {
        int64_t seq = g->document_index[d];
        int64_t offset = d == first_doc ? first_offset : 0;
        int64_t end = d == last_doc ? last_offset + 1 : ds->sequence_lengths[seq];
        int64_t length = end - offset;
        MT_ASSERT(length >= 0 && filled + length <= (int64_t)seq_length + 1);
        if (length) indexed_read(ds, seq, offset, length, tokens + filled);
        filled += length;
    }
    MT_ASSERT(filled == (int64_t)seq_length + 1);
}
