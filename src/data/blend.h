// blend.h — Megatron-Core's data blends: the path lists of --data-path / --train-data-path /
// --valid-data-path / --test-data-path and how BlendedMegatronDatasetBuilder and
// BlendedDataset mix several datasets into one split (docs/data.md "Blending").
#pragma once
#include <stdint.h>

// A parsed list (get_blend_from_list): n prefixes, and n weights when the list gives them.
typedef struct {
    int n;
    char **prefixes;
    double *weights;  // NULL: no weights
} BlendList;

// Parses a list flag's value as Config stores it (entries joined by commas): "A", "A,B" or
// "0.3,A,0.7,B". Weights are present when the list has an even number of entries and every
// other entry, starting with the first, is a number. Returns 0 (and an empty list) for "".
// Dies naming flag on a list that mixes weights and prefixes or has a weight that is not
// positive and finite.
int blend_parse(BlendList *b, const char *list, const char *flag);
void blend_free(BlendList *b);

// numpy.sum of a float64 array (NumPy's pairwise summation, so the last bit matches).
double np_sum_f64(const double *a, int64_t n);
// megatron.core.datasets.utils.normalize: w / numpy.sum(w).
void blend_normalize(const double *w, int n, double *out);

// The surplus BlendedMegatronDatasetBuilder builds per dataset (mid_level_dataset_surplus).
#define BLEND_MID_LEVEL_SURPLUS 0.005
// _get_size_per_split_per_dataset for one dataset and split: the samples a dataset of
// normalised weight w contributes to a split of target samples (surplus 0), or the samples
// built for it (surplus BLEND_MID_LEVEL_SURPLUS): ceil(ceil(target * w) * (1 + surplus)).
int64_t blend_dataset_samples(double weight, int64_t target, double surplus);

// helpers.cpp build_blending_indices: for each of size samples, the dataset furthest below
// its share (weight × position; the first on ties) and that dataset's next sample number.
void blend_build_indices(const double *weights, int n_datasets, int64_t size, int16_t *dataset_index,
                         int64_t *dataset_sample_index);
