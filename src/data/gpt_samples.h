// gpt_samples.h — the sample order of Megatron-Core's GPTDataset for one indexed dataset
// and one split of it, bit-identical to megatron/core/datasets/gpt_dataset.py with the
// defaults of GPT pretraining (add_extra_token_to_sequence, drop_last_partial_sequence):
//
//   split      --split "969,30,1" -> proportions -> book-ends -> sequence range
//              [round(b0 * N), round(b1 * N)) of the N sequences (round half to even)
//   epochs     the fewest E with E * tokens_per_epoch >= num_samples * L + 1
//   documents  E copies of the range, shuffled with numpy.random.RandomState(seed); when the
//              last epoch contributes fewer than int(0.80 * samples per epoch) samples it is
//              shuffled separately and appended (the "separate final epoch")
//   samples    (E * tokens - 1) / L samples of L + 1 tokens each, consecutive samples
//              sharing one token (helpers.cpp build_sample_idx)
//   shuffle    the sample order: one shuffle of all samples, or with a separate final epoch
//              the samples before it and those of it shuffled apart
//
// docs/data.md "Sample order" describes each step.
#pragma once
#include <stdint.h>

#include "data/indexed.h"

typedef enum { GPT_SPLIT_TRAIN, GPT_SPLIT_VALID, GPT_SPLIT_TEST } GptSplit;

// Megatron's split matrix from --split ("969,30,1", "98,2,0", "1"): the numbers in the
// string (runs of digits and dots, as parse_and_normalize_split), padded to three with
// zeros and normalised; present[s] is 0 where split s has no width (its dataset is None).
// Dies naming --split on a malformed string.
typedef struct {
    int present[3];
    double begin[3], end[3];
} SplitMatrix;
void gpt_split_matrix(const char *split, SplitMatrix *m);
// The sequence range [*first, *first + *count) of split s over num_sequences sequences.
void gpt_split_range(const SplitMatrix *m, int s, int64_t num_sequences, int64_t *first, int64_t *count);

typedef struct {
    int64_t tokens_per_epoch;
    int32_t num_epochs;
    int separate_final_epoch;
    int64_t samples_before_final_epoch;  // the first shuffle part when separate_final_epoch
    int64_t n_documents;       // entries of document_index: num_epochs × sequences in the range
    int64_t n_samples;         // samples; sample_index has n_samples + 1 rows
    int32_t *document_index;   // (n_documents) sequence ids in reading order
    int64_t *sample_index;     // (n_samples + 1) × 2: position in document_index, token offset
    int64_t *shuffle_index;    // (n_samples) sample i is the shuffle_index[i]-th in reading order
} GptIndex;

// The number of epochs and whether the final one is shuffled separately (no allocation).
// num_samples < 0 means Megatron's None: exactly one epoch. tokens_per_epoch must be > 0.
void gpt_plan_epochs(GptIndex *g, int64_t tokens_per_epoch, int64_t num_samples, int seq_length);
// Build all three indices for sequences [first, first + count) of the given lengths.
// The caller has checked that the range holds at least one token.
void gpt_index_build(GptIndex *g, const int32_t *sequence_lengths, int64_t first, int64_t count,
                     int64_t num_samples, int seq_length, uint32_t seed);
// Frees the arrays of a built index (not of one whose arrays point into a cache mapping).
void gpt_index_free(GptIndex *g);
// Tokens of one epoch over sequences [first, first + count).
int64_t gpt_tokens_in_range(const int32_t *sequence_lengths, int64_t first, int64_t count);

// Sample i (0 <= i < n_samples): its seq_length + 1 tokens, read from ds.
void gpt_sample(const GptIndex *g, const IndexedDataset *ds, int seq_length, int64_t i, int32_t *tokens);
