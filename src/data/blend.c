// blend.c — Megatron-Core's blend lists, blend sizes and blending indices (blend.h).
#include "data/blend.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#include "core/common.h"

// A weight as Python's float() reads one (surrounding spaces allowed); 0 if s is not a number.
static int parse_number(const char *s, double *out) {
    char *end;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return 0;
    *out = strtod(s, &end);
    if (end == s) return 0;
    while (isspace((unsigned char)*end)) end++;
    return *end == 0;
}

static char *trimmed_copy(const char *s, size_t len) {
    while (len && isspace((unsigned char)*s)) s++, len--;
    while (len && isspace((unsigned char)s[len - 1])) len--;
    char *out = mt_malloc(len + 1);
    memcpy(out, s, len);
    out[len] = 0;
    return out;
}

int blend_parse(BlendList *b, const char *list, const char *flag) {
    memset(b, 0, sizeof *b);
    if (!list || !*list) return 0;
    // Split on commas.
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    char **entries = mt_malloc((size_t)n * sizeof *entries);
    const char *start = list;
    for (int i = 0; i < n; i++) {
        const char *comma = strchr(start, ',');
        size_t len = comma ? (size_t)(comma - start) : strlen(start);
        entries[i] = trimmed_copy(start, len);
        if (!entries[i][0]) mt_die("--%s '%s': entry %d is empty", flag, list, i + 1);
        start = comma ? comma + 1 : start + len;
    }
    int weighted = 0;
    if (n % 2 == 0) {
        int numbers = 0;
        double w;
        for (int i = 0; i < n; i += 2) numbers += parse_number(entries[i], &w);
        if (numbers && numbers < n / 2) {
            for (int i = 0; i < n; i += 2)
                if (!parse_number(entries[i], &w))
                    mt_die("--%s '%s': entry %d '%s' is not a weight but other entries are; give a weight before "
                           "every prefix (0.3 A 0.7 B) or none (A B)",
                           flag, list, i + 1, entries[i]);
        }
        weighted = numbers == n / 2;
    }
    if (!weighted) {
        b->n = n;
        b->prefixes = entries;
        return n;
    }
    b->n = n / 2;
    b->prefixes = mt_malloc((size_t)b->n * sizeof *b->prefixes);
    b->weights = mt_malloc((size_t)b->n * sizeof *b->weights);
    for (int i = 0; i < b->n; i++) {
        parse_number(entries[2 * i], &b->weights[i]);
        if (!(b->weights[i] > 0) || !isfinite(b->weights[i]))
            mt_die("--%s '%s': weight '%s' of %s must be a positive number", flag, list, entries[2 * i],
                   entries[2 * i + 1]);
        free(entries[2 * i]);
        b->prefixes[i] = entries[2 * i + 1];
    }
    free(entries);
    return b->n;
}

void blend_free(BlendList *b) {
    for (int i = 0; i < b->n; i++) free(b->prefixes[i]);
    free(b->prefixes);
    free(b->weights);
    memset(b, 0, sizeof *b);
}

// NumPy's pairwise_sum for float64: below 8 elements a plain loop, up to 128 eight
// accumulators combined as a tree, above that the halves (cut at a multiple of 8) recursively.
double np_sum_f64(const double *a, int64_t n) {
    if (n < 8) {
        double sum = 0.;
        for (int64_t i = 0; i < n; i++) sum += a[i];
        return sum;
    }
    if (n <= 128) {
        double r[8];
        memcpy(r, a, sizeof r);
        int64_t i;
        for (i = 8; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) sum += a[i];
        return sum;
    }
    int64_t half = n / 2;
    half -= half % 8;
    return np_sum_f64(a, half) + np_sum_f64(a + half, n - half);
}

void blend_normalize(const double *w, int n, double *out) {
    double sum = np_sum_f64(w, n);
    for (int i = 0; i < n; i++) out[i] = w[i] / sum;
}

int64_t blend_dataset_samples(double weight, int64_t target, double surplus) {
    double share = ceil((double)target * weight);
    return (int64_t)ceil(share * (1 + surplus));
}

void blend_build_indices(const double *weights, int n_datasets, int64_t size, int16_t *dataset_index,
                         int64_t *dataset_sample_index) {
    MT_ASSERT(n_datasets > 0 && n_datasets < 32767);
    int64_t *taken = mt_calloc((size_t)n_datasets, sizeof *taken);
    for (int64_t s = 0; s < size; s++) {
        double position = MT_MAX((double)s, 1.0);
        int best = 0;
        double best_error = weights[0] * position - (double)taken[0];
        for (int d = 1; d < n_datasets; d++) {
            double error = weights[d] * position - (double)taken[d];
            if (error > best_error) {
                best_error = error;
                best = d;
            }
        }
        dataset_index[s] = (int16_t)best;
        dataset_sample_index[s] = taken[best]++;
    }
    free(taken);
}
