#include "data/dataset.h"

#include <math.h>
#include <string.h>

#include "core/fileio.h"
#include "core/rng.h"
#include "data/mock.h"
#include "cmd/prepare.h"
#include "tokenizer/run_tokenizer.h"

// ---- token-stream sources: the built-in corpus and text files -------------------------------

static void load_text_file(Dataset *ds, const char *path) {
    char err[512];
    size_t len;
    uint8_t *bytes = read_file_all(path, INFILE_TEXT, &len, err, sizeof(err));
    if (!bytes) mt_die("--data-path %s: %s", path, err);
    if (len == 0) {
        free(bytes);
        mt_die("--data-path %s is empty; give a text file with some content", path);
    }
    ds->n_tokens = (int64_t)len + 1;  // the file is one document: end it
    ds->tokens = mt_malloc(mt_size_product(ds->n_tokens, sizeof(int32_t)));
    for (size_t i = 0; i < len; i++) ds->tokens[i] = bytes[i];
    ds->tokens[len] = BYTE_EOD_TOKEN;
    free(bytes);
    snprintf(ds->reading, sizeof(ds->reading), "%.1000s read as bytes (no tokenizer): %lld tokens", path,
             (long long)ds->n_tokens);
}

// The text file tokenized with the run's tokenizer as `moetron prepare --append-eod` reads
// it: one document per paragraph (a .jsonl: per line, the --json-keys value), each ended by
// the tokenizer's end-of-text token.
static void tokenize_text_file(Dataset *ds, const Config *c) {
    const RunTokenizer *rt = c->run_tokenizer;
    if (tokenizer_vocab_size(rt->tok) > c->vocab_size)
        mt_die("--data-path %s: the tokenizer %s has %d tokens but --vocab-size is %d; use the tokenizer's vocabulary "
               "(leave --vocab-size out) or a smaller tokenizer", c->data_path, rt->path, tokenizer_vocab_size(rt->tok),
               c->vocab_size);
    ds->n_tokens = prepare_tokenize_stream(c->data_path, "--data-path", c->json_keys, rt->tok, rt->eos_id, c->workers,
                                           &ds->tokens);
    if (!ds->n_tokens) mt_die("--data-path %s tokenizes to no tokens; give a text file with some content", c->data_path);
    snprintf(ds->reading, sizeof(ds->reading), "%.1000s tokenized with %.1000s: %lld tokens", c->data_path, rt->path,
             (long long)ds->n_tokens);
}

static int32_t tokenizer_eod(const Config *c);

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
    if (ds->split_count[DATA_TRAIN] < 1)
        mt_die("%s: --split %s leaves no training samples (%lld samples of %d tokens in all)", ds->source,
               c->split, (long long)total, ds->seq_length);
}

size_t dataset_mock_bytes(const Config *c) { return mt_size_product(c->mock_data_tokens, sizeof(int32_t)); }

static void open_token_stream(Dataset *ds, const Config *c) {
    int tokenized = c->data_path[0] && c->run_tokenizer;
    if (!tokenized && c->vocab_size < BYTE_VOCAB_SIZE)
        mt_die("--vocab-size %d is too small for byte-level tokens; use at least %d", c->vocab_size, BYTE_VOCAB_SIZE);
    ds->eod = BYTE_EOD_TOKEN;
    if (tokenized) {
        snprintf(ds->source, sizeof(ds->source), "--data-path %.1000s", c->data_path);
        tokenize_text_file(ds, c);
        ds->eod = tokenizer_eod(c);
    } else if (c->data_path[0]) {
        snprintf(ds->source, sizeof(ds->source), "--data-path %.1000s", c->data_path);
        load_text_file(ds, c->data_path);
    } else {
        snprintf(ds->source, sizeof(ds->source), "the built-in corpus");
        ds->n_tokens = c->mock_data_tokens;
        ds->tokens = mt_malloc(dataset_mock_bytes(c));
        mock_corpus((uint64_t)c->seed, ds->n_tokens, BYTE_EOD_TOKEN, ds->tokens);
    }
    split_samples(ds, c);
}

// Fisher–Yates permutation of the train range for one epoch.
static void build_epoch_order(Dataset *ds, int64_t epoch) {
    int64_t n = ds->split_count[DATA_TRAIN];
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

// The L + 1 tokens of the sample at `position` of the split's reading order.
static const int32_t *stream_sample(Dataset *ds, SplitKind split, int64_t position) {
    int64_t count = ds->split_count[split], id;
    if (split != DATA_TRAIN) {
        id = position % count;
    } else {
        int64_t epoch = position / count;
        if (epoch != ds->cached_epoch) build_epoch_order(ds, epoch);
        id = ds->epoch_order[position % count];
    }
    return ds->tokens + (ds->split_first[split] + id) * ds->seq_length;
}

// ---- Megatron sources ---------------------------------------------------------------------------

// Sample counts of each split, as Megatron-Core's training loop asks for them: train_iters
// global batches; validation (train_iters / eval_interval + 1) · eval_iters batches. The
// test split is not read by moetron train, so it is not built (the train order depends only
// on the train count).
static void megatron_sample_counts(const Config *c, int64_t counts[3]) {
    int64_t gbs = c->global_batch_size;
    counts[DATA_TRAIN] = (int64_t)c->train_iters * gbs;
    int evals = c->eval_interval > 0 && c->eval_iters > 0 ? c->train_iters / c->eval_interval + 1 : 0;
    counts[DATA_VALID] = (int64_t)evals * c->eval_iters * gbs;
    counts[DATA_TEST] = 0;
}

// The end-of-document id of tokenized data: the tokenizer's; needed only by the flags that use it.
static int32_t tokenizer_eod(const Config *c) {
    int needed = c->eod_mask_loss || c->reset_position_ids || c->reset_attention_mask;
    if (!c->run_tokenizer) {
        if (needed)
            mt_die("--eod-mask-loss / --reset-position-ids / --reset-attention-mask need the end-of-document id of "
                   "the data: give --tokenizer-model (the tokenizer.json the data was prepared with)");
        return -1;
    }
    int32_t eod = c->run_tokenizer->eos_id;
    if (eod < 0 && needed)
        mt_die("tokenizer %s has no end-of-text token (<|endoftext|>, </s>, ...), which --eod-mask-loss and "
               "--reset-* use", c->run_tokenizer->path);
    return eod;
}

static void open_megatron(Dataset *ds, const Config *c) {
    int64_t counts[3];
    megatron_sample_counts(c, counts);
    snprintf(ds->source, sizeof(ds->source), "the Megatron datasets");
    ds->eod = tokenizer_eod(c);
    char source[48];
    snprintf(source, sizeof source, "--vocab-size %d", c->vocab_size);
    ds->megatron = megatron_data_open(c, counts, &(TokenVocab){c->vocab_size, source});
    if (megatron_data_size(ds->megatron, DATA_TRAIN) < 1)
        mt_die("the training split of the Megatron datasets is empty; check --split or --train-data-path");
}

// ---- batches ------------------------------------------------------------------------------------

void document_layout(const int32_t *row, int L, int32_t eod, int32_t *key_start, int32_t *positions) {
    int start = 0;
    for (int t = 0; t < L; t++) {
        if (key_start) key_start[t] = start;
        if (positions) positions[t] = t - start;
        if (row[t] == eod) start = t + 1;  // the end-of-document token closes its document
    }
}

// Row b of out from one sample of L + 1 tokens.
static void fill_row(const Dataset *ds, const int32_t *sample, DataBatch *out, int b) {
    int L = ds->seq_length;
    size_t at = (size_t)b * L;
    for (int t = 0; t <= L; t++)
        if (sample[t] < 0 || sample[t] >= ds->vocab_limit)
            mt_die("%s: token id %d is outside the model's vocabulary of %d; use the --vocab-size of the tokenizer "
                   "the data was prepared with", ds->source, sample[t], ds->vocab_limit);
    for (int t = 0; t < L; t++) {
        out->tokens[at + t] = sample[t];
        out->targets[at + t] = sample[t + 1];
        out->loss_mask[at + t] = ds->eod_mask_loss && sample[t] == ds->eod ? 0 : 1;
    }
    document_layout(sample, L, ds->eod, out->key_start ? out->key_start + at : NULL,
                    out->positions ? out->positions + at : NULL);
}

void dataset_batch(Dataset *ds, SplitKind split, int64_t first, DataBatch *out) {
    MT_ASSERT(dataset_split_size(ds, split) > 0 && out->L == ds->seq_length);
    for (int b = 0; b < out->B; b++) {
        const int32_t *sample;
        if (ds->megatron) {  // into the batch's own scratch: batches may be filled by two threads
            megatron_data_sample(ds->megatron, split, first + b, out->sample);
            sample = out->sample;
        } else {
            sample = stream_sample(ds, split, first + b);
        }
        fill_row(ds, sample, out, b);
    }
}

int64_t dataset_split_size(const Dataset *ds, SplitKind split) {
    return ds->megatron ? megatron_data_size(ds->megatron, split) : ds->split_count[split];
}

void dataset_open(Dataset *ds, const Config *c) {
    memset(ds, 0, sizeof(*ds));
    ds->seq_length = c->seq_length;
    ds->seed = (uint64_t)c->seed;
    ds->eod_mask_loss = c->eod_mask_loss;
    ds->vocab_limit = c->padded_vocab_size;
    ds->cached_epoch = -1;
    if (megatron_data_requested(c)) open_megatron(ds, c);
    else open_token_stream(ds, c);
    if (c->eval_interval > 0 && c->eval_iters > 0 && dataset_split_size(ds, DATA_VALID) < 1)
        mt_die("%s: --split %s leaves no validation samples; give the valid part a share, use more data, "
               "or set --eval-interval 0", ds->source, c->split);
}

void dataset_free(Dataset *ds) {
    free(ds->tokens);
    free(ds->epoch_order);
    if (ds->megatron) megatron_data_free(ds->megatron);
    memset(ds, 0, sizeof(*ds));
}

void data_batch_alloc(DataBatch *b, const Config *c, int B) {
    size_t n = (size_t)B * c->seq_length;
    memset(b, 0, sizeof(*b));
    b->B = B;
    b->L = c->seq_length;
    b->tokens = mt_malloc(n * sizeof(int32_t));
    b->targets = mt_malloc(n * sizeof(int32_t));
    b->loss_mask = mt_malloc(n * sizeof(real));
    b->sample = mt_malloc((size_t)(b->L + 1) * sizeof(int32_t));
    if (c->reset_position_ids) b->positions = mt_malloc(n * sizeof(int32_t));
    if (c->reset_attention_mask) b->key_start = mt_malloc(n * sizeof(int32_t));
}

void data_batch_free(DataBatch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->loss_mask);
    free(b->sample);
    free(b->positions);
    free(b->key_start);
    memset(b, 0, sizeof(*b));
}
