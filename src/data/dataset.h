// dataset.h — token corpus, train/valid/test split and the order samples are read in.
//
// The corpus is one token stream (documents separated by the end-of-document token).
// Sample i is tokens [i·L, i·L + L + 1): inputs are its first L tokens, targets the last
// L (one token of overlap between neighbouring samples). Samples are split into
// contiguous train / valid / test ranges by --split. The train range is read in a fresh
// permutation each epoch, deterministic from --seed; valid and test in order. A batch
// is a pure function of (seed, split, sample position), so resuming needs only the
// number of samples consumed.
#pragma once
#include "core/config.h"
#include "core/common.h"

#define BYTE_EOD_TOKEN 256
#define BYTE_VOCAB_SIZE 257

typedef enum { SPLIT_TRAIN, SPLIT_VALID, SPLIT_TEST } SplitKind;

typedef struct {
    int32_t *tokens;
    int64_t n_tokens;
    int seq_length;
    int64_t split_first[3], split_count[3];  // sample ranges
    uint64_t seed;
    int eod_mask_loss;
    // cached permutation of the train range for one epoch
    int64_t *epoch_order;
    int64_t cached_epoch;
    char source[MT_PATH_MAX + 32];  // for messages
} Dataset;

// Built-in corpus (--mock-data) or a byte-level text file (--data-path). Fatal on bad input.
void dataset_open(Dataset *ds, const Config *c);
void dataset_free(Dataset *ds);
// Fill a micro-batch of B samples starting at position `first` of the split's reading
// order: tokens/targets (B·L), loss_mask (B·L).
void dataset_batch(Dataset *ds, SplitKind split, int64_t first, int B, int32_t *tokens,
                   int32_t *targets, real *loss_mask);
