#include "data/dataset.h"

#include <math.h>
#include <string.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "data/mock.h"

static void load_text_file(Dataset *ds, const char *path) {
    char err[512];
    size_t len;
    uint8_t *bytes = read_file_all(path, &len, err, sizeof(err));
    if (!bytes) mt_die("--data-path %s: %s", path, err);
    if (len == 0) {
        free(bytes);
        mt_die("--data-path %s is empty; give a text file with some content", path);
    }
    ds->n_tokens = (int64_t)len + 1;
    ds->tokens = mt_malloc(ds->n_tokens * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) ds->tokens[i] = bytes[i];
    ds->tokens[len] = BYTE_EOD_TOKEN;
    free(bytes);
}

static void split_samples(Dataset *ds, const Config *c) {
    int64_t total = (ds->n_tokens - 1) / ds->seq_length;
    if (total < 1)
        mt_die("%s has %lld tokens, fewer than --seq-length %d + 1; lower --seq-length or use more data",
               ds->source, (long long)ds->n_tokens, ds->seq_length);
    double cumulative = 0;
    int64_t begin = 0;
    for (int s = 0; s < 3; s++) {
        cumulative += c->split_fraction[s];
        int64_t end = s == 2 ? total : (int64_t)llround(cumulative * total);
        ds->split_first[s] = begin;
        ds->split_count[s] = end - begin;
        begin = end;
    }
    if (ds->split_count[SPLIT_TRAIN] < 1)
        mt_die("%s: --split %s leaves no training samples (%lld samples of %d tokens in all)", ds->source,
               c->split, (long long)total, ds->seq_length);
    if (c->eval_interval > 0 && c->eval_iters > 0 && ds->split_count[SPLIT_VALID] < 1)
        mt_die("%s: --split %s leaves no validation samples; give the valid part a share, use more data, "
               "or set --eval-interval 0", ds->source, c->split);
}

void dataset_open(Dataset *ds, const Config *c) {
    memset(ds, 0, sizeof(*ds));
    ds->seq_length = c->seq_length;
    ds->seed = (uint64_t)c->seed;
    ds->eod_mask_loss = c->eod_mask_loss;
    ds->cached_epoch = -1;
    if (c->vocab_size < BYTE_VOCAB_SIZE)
        mt_die("--vocab-size %d is too small for byte-level tokens; use at least %d", c->vocab_size, BYTE_VOCAB_SIZE);
    if (c->data_path[0]) {
        snprintf(ds->source, sizeof(ds->source), "--data-path %.1000s", c->data_path);
        load_text_file(ds, c->data_path);
    } else {
        snprintf(ds->source, sizeof(ds->source), "the built-in corpus");
        ds->n_tokens = c->mock_data_tokens;
        ds->tokens = mt_malloc(ds->n_tokens * sizeof(int32_t));
        mock_corpus((uint64_t)c->seed, ds->n_tokens, BYTE_EOD_TOKEN, ds->tokens);
    }
    split_samples(ds, c);
}

void dataset_free(Dataset *ds) {
    free(ds->tokens);
    free(ds->epoch_order);
    memset(ds, 0, sizeof(*ds));
}

// Fisher–Yates permutation of the train range for one epoch.
static void build_epoch_order(Dataset *ds, int64_t epoch) {
    int64_t n = ds->split_count[SPLIT_TRAIN];
    if (!ds->epoch_order) ds->epoch_order = mt_malloc(n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) ds->epoch_order[i] = i;
    Rng rng;
    rng_seed_stream(&rng, ds->seed, 0x5A3B1E00ULL + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&rng, (uint64_t)i + 1);
        int64_t t = ds->epoch_order[i];
        ds->epoch_order[i] = ds->epoch_order[j];
        ds->epoch_order[j] = t;
    }
    ds->cached_epoch = epoch;
}

static int64_t sample_id(Dataset *ds, SplitKind split, int64_t position) {
    int64_t count = ds->split_count[split];
    if (split != SPLIT_TRAIN) return ds->split_first[split] + position % count;
    int64_t epoch = position / count;
    if (epoch != ds->cached_epoch) build_epoch_order(ds, epoch);
    return ds->split_first[split] + ds->epoch_order[position % count];
}

void dataset_batch(Dataset *ds, SplitKind split, int64_t first, int B, int32_t *tokens,
                   int32_t *targets, real *loss_mask) {
    int L = ds->seq_length;
    MT_ASSERT(ds->split_count[split] > 0);
    for (int b = 0; b < B; b++) {
        const int32_t *text = ds->tokens + sample_id(ds, split, first + b) * L;
        for (int t = 0; t < L; t++) {
            tokens[b * L + t] = text[t];
            targets[b * L + t] = text[t + 1];
            loss_mask[b * L + t] = ds->eod_mask_loss && text[t + 1] == BYTE_EOD_TOKEN ? 0 : 1;
        }
    }
}
