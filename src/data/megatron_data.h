// megatron_data.h — training samples from Megatron .bin/.idx datasets in exactly the order
// Megatron-Core's GPTDataset / BlendedDataset produce them (docs/data.md).
//
// Paths come from --data-path (prefixes, optionally weighted, split by --split over the
// documents) or --train-data-path / --valid-data-path / --test-data-path. Sample i of a
// split is seq_length + 1 tokens. The document, sample and shuffle indices are cached in
// --data-cache-path (or beside the data), reused when they match and rebuilt when stale.
#pragma once
#include <stdint.h>

#include "core/config.h"

typedef enum { DATA_TRAIN, DATA_VALID, DATA_TEST } DataSplit;

typedef struct MegatronData MegatronData;

// Whether the data flags name Megatron datasets (prefixes with .bin/.idx) rather than a text file.
int megatron_data_requested(const Config *c);
// The vocabulary every token id of the data must lie in.
typedef struct {
    int64_t size;        // ids 0 .. size - 1 are valid; 0: the ids are not checked
    const char *source;  // where the size comes from, for messages: "--vocab-size 320"
} TokenVocab;

// Build the three splits for num_samples[split] samples each (0: the split is not built).
// First every dataset named (all splits, every dataset of a blend) is checked to hold only
// ids inside the vocabulary: one scan of each .bin, whose result is cached beside the indices.
MegatronData *megatron_data_open(const Config *c, const int64_t num_samples[3], const TokenVocab *vocab);
void megatron_data_free(MegatronData *d);
// Samples the split holds (>= the number asked for; 0 when the split is empty).
int64_t megatron_data_size(const MegatronData *d, DataSplit split);
// Sample i of the split: seq_length + 1 tokens.
void megatron_data_sample(const MegatronData *d, DataSplit split, int64_t i, int32_t *tokens);
