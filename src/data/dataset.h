// dataset.h — the training data of a run: where samples come from, the train/valid/test
// split, the order samples are read in, and how a sample becomes a batch row.
//
// Sources: the built-in corpus (--mock-data) or a text file (--data-path FILE), tokenized
// with the run's tokenizer as `moetron prepare --append-eod` reads it, or as bytes without
// one (the file one document, then 256): one token stream, sample i is tokens [i·L, i·L + L + 1), samples split into contiguous
// ranges by --split, the train range read in a fresh permutation each epoch from --seed.
// Megatron .bin/.idx datasets (--data-path PREFIX..., --train-data-path ...): samples in
// exactly Megatron-Core's GPTDataset / BlendedDataset order (megatron_data.h).
// Either way a batch is a pure function of (seed, split, sample position), so resuming
// needs only the number of samples consumed.
//
// A sample of L + 1 tokens gives inputs (its first L) and targets (its last L); with
// --eod-mask-loss positions whose input is the end-of-document token carry no loss, with
// --reset-position-ids positions restart after it, with --reset-attention-mask tokens see
// only their own document (as Megatron-Core's GPTDataset builds them).
#pragma once
#include "core/common.h"
#include "core/config.h"
#include "data/megatron_data.h"

#define BYTE_EOD_TOKEN 256
#define BYTE_VOCAB_SIZE 257

typedef DataSplit SplitKind;  // DATA_TRAIN, DATA_VALID, DATA_TEST

typedef struct {
    int seq_length;
    int32_t eod;                // end-of-document id (-1: unknown, no flag needs it)
    int eod_mask_loss;          // (the resets are in each DataBatch: its positions / key_start)
    int32_t vocab_limit;        // tokens must be below this (the model's padded vocabulary)
    // token-stream sources (mock, text)
    int32_t *tokens;
    int64_t n_tokens;
    int64_t split_first[3], split_count[3];  // sample ranges
    uint64_t seed;
    int64_t *epoch_order;       // cached permutation of the train range for one epoch
    int64_t cached_epoch;
    // Megatron sources
    MegatronData *megatron;
    char source[MT_PATH_MAX + 32];  // for messages
    char reading[2 * MT_PATH_MAX + 64];  // how a text file was read (tokenizer or bytes, tokens); "" otherwise
} Dataset;

// One micro-batch of B rows of L tokens.
typedef struct {
    int B, L;
    int32_t *tokens, *targets;  // (B·L)
    real *loss_mask;            // (B·L)
    int32_t *positions;         // (B·L) with --reset-position-ids, else NULL
    int32_t *key_start;         // (B·L) with --reset-attention-mask, else NULL
    int32_t *sample;            // (L + 1) scratch
} DataBatch;

void data_batch_alloc(DataBatch *b, const Config *c, int B);
void data_batch_free(DataBatch *b);

// Open the run's data (fatal on bad input). Megatron datasets are built for the sample
// counts Megatron-Core's training loop asks for (train_iters·global batch; validation and
// test from --eval-interval / --eval-iters).
void dataset_open(Dataset *ds, const Config *c);
// Bytes of the built-in corpus's tokens (--mock-data-tokens of a validated c).
size_t dataset_mock_bytes(const Config *c);
void dataset_free(Dataset *ds);
// Samples of the split (0 when it is empty).
int64_t dataset_split_size(const Dataset *ds, SplitKind split);
// Fill out (B rows) with the samples at positions first .. first + B − 1 of the split's order.
// Safe to call from one other thread for the train split while the caller reads the others.
void dataset_batch(Dataset *ds, SplitKind split, int64_t first, DataBatch *out);

// Per token of row[0..L): the first token of its document (after the last end-of-document
// token before it) into key_start, and its position in the document into positions
// (either may be NULL).
void document_layout(const int32_t *row, int L, int32_t eod, int32_t *key_start, int32_t *positions);
