// test_megatron_order.c — the index arithmetic of Megatron-Core's GPT and blended datasets
// (data/gpt_samples.h, data/blend.h) against numbers megatron-core 0.16 and NumPy 2.4
// printed for the same inputs (the comment above each case says which call). The
// end-to-end comparison with real files is tests/conformance/megatron_gpt_dataset.py.
#include "data/blend.h"
#include "data/gpt_samples.h"
#include "testlib.h"

#include <string.h>

static int same_i64(const int64_t *a, const int64_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

// numpy.sum(numpy.array([1/(i+1) + i*1e-3 for i in range(n)])), bit for bit (pairwise).
static void test_numpy_sum(void) {
    struct {
        int n;
        double want;
    } cases[] = {{3, 0x1.d619f0fb38a94p+0}, {10, 0x1.7caafde311645p+1}, {130, 0x1.baacc7be0299ap+3},
                 {300, 0x1.990fb21499f98p+5}};
    double a[300];
    for (int i = 0; i < 300; i++) a[i] = 1.0 / (i + 1) + i * 1e-3;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double got = np_sum_f64(a, cases[c].n);
        CHECK(got == cases[c].want, "n %d: %a, numpy %a", cases[c].n, got, cases[c].want);
    }
}

// convert_split_vector_to_split_matrix(parse_and_normalize_split(split)), then
// int(round(b * N)) for each book-end (Python's round half to even: 1,1,2 of 6 -> 1.5 -> 2).
static void test_split_ranges(void) {
    struct {
        const char *split;
        int64_t n;
        int64_t want[3][2];  // {-1, -1}: no split
    } cases[] = {
        {"969,30,1", 1000, {{0, 969}, {969, 999}, {999, 1000}}},
        {"969,30,1", 2001, {{0, 1939}, {1939, 1999}, {1999, 2001}}},
        {"1,1,1", 7, {{0, 2}, {2, 5}, {5, 7}}},
        {"1,1,2", 6, {{0, 2}, {2, 3}, {3, 6}}},
        {"98,2,0", 250, {{0, 245}, {245, 250}, {-1, -1}}},
        {"0.1,0.2,0.3", 10, {{0, 2}, {2, 5}, {5, 10}}},
        {"98/2", 250, {{0, 245}, {245, 250}, {-1, -1}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SplitMatrix m;
        gpt_split_matrix(cases[c].split, &m);
        for (int s = 0; s < 3; s++) {
            int present = cases[c].want[s][0] >= 0;
            CHECK(m.present[s] == present, "%s split %d present %d", cases[c].split, s, m.present[s]);
            if (!present) continue;
            int64_t first, count;
            gpt_split_range(&m, s, cases[c].n, &first, &count);
            CHECK(first == cases[c].want[s][0] && first + count == cases[c].want[s][1],
                  "%s of %lld, split %d: [%lld, %lld), Megatron [%lld, %lld)", cases[c].split, (long long)cases[c].n,
                  s, (long long)first, (long long)(first + count), (long long)cases[c].want[s][0],
                  (long long)cases[c].want[s][1]);
        }
    }
}

// get_blend_from_list on the comma-joined list.
static void test_blend_lists(void) {
    BlendList b;
    CHECK(blend_parse(&b, "", "data-path") == 0 && b.n == 0, "empty list");
    blend_parse(&b, "data/A", "data-path");
    CHECK(b.n == 1 && !b.weights && !strcmp(b.prefixes[0], "data/A"), "one prefix");
    blend_free(&b);
    blend_parse(&b, "A, B", "data-path");
    CHECK(b.n == 2 && !b.weights && !strcmp(b.prefixes[1], "B"), "two prefixes (entries stripped)");
    blend_free(&b);
    blend_parse(&b, "30,A,70,B", "data-path");
    CHECK(b.n == 2 && b.weights && b.weights[0] == 30 && b.weights[1] == 70 && !strcmp(b.prefixes[0], "A") &&
              !strcmp(b.prefixes[1], "B"),
          "weighted pair");
    blend_free(&b);
    blend_parse(&b, "A,B,C", "data-path");
    CHECK(b.n == 3 && !b.weights, "odd count: prefixes only");
    blend_free(&b);
}

// _get_size_per_split_per_dataset(normalize(w), sizes[, surplus=0.005]).
static void test_blend_sizes(void) {
    double w2[2], w3[3];
    blend_normalize((double[]){0.3, 0.7}, 2, w2);
    blend_normalize((double[]){0.2, 0.5, 0.3}, 3, w3);
    int64_t targets[3] = {1000, 37, 1};
    int64_t want_target[2][3] = {{300, 12, 1}, {700, 26, 1}}, want_built[2][3] = {{302, 13, 2}, {704, 27, 2}};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 3; s++) {
            CHECK(blend_dataset_samples(w2[d], targets[s], 0) == want_target[d][s], "target d%d s%d", d, s);
            CHECK(blend_dataset_samples(w2[d], targets[s], BLEND_MID_LEVEL_SURPLUS) == want_built[d][s],
                  "built d%d s%d: %lld", d, s, (long long)blend_dataset_samples(w2[d], targets[s], 0.005));
        }
    int64_t want3[3][2] = {{804, 201}, {2010, 503}, {1206, 302}}, sizes3[2] = {4000, 999};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++)
            CHECK(blend_dataset_samples(w3[d], sizes3[s], BLEND_MID_LEVEL_SURPLUS) == want3[d][s],
                  "three datasets: d%d s%d", d, s);
}

// helpers.build_blending_indices(dataset_index, dataset_sample_index, normalize(normalize(w)), ...).
static void test_blending_indices(void) {
    double w[3], twice[3];
    blend_normalize((double[]){0.3, 0.7}, 2, w);
    blend_normalize(w, 2, twice);
    int16_t di[15];
    int64_t dsi[15];
    blend_build_indices(twice, 2, 12, di, dsi);
    int16_t want_di[12] = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1};
    int64_t want_dsi[12] = {0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7};
    CHECK(!memcmp(di, want_di, sizeof want_di) && same_i64(dsi, want_dsi, 12), "0.3/0.7 blend differs");

    blend_normalize((double[]){2, 5, 3}, 3, w);
    blend_normalize(w, 3, twice);
    blend_build_indices(twice, 3, 15, di, dsi);
    int16_t want_di3[15] = {1, 2, 0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2, 1, 2};
    int64_t want_dsi3[15] = {0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 2, 5, 3, 6, 4};
    CHECK(!memcmp(di, want_di3, sizeof want_di3) && same_i64(dsi, want_dsi3, 15), "2/5/3 blend differs");
}

// Sequence lengths {7,3,1,12,0,4,9,2,6,5}, range [2, 9), L = 5, seed 42: Megatron's
// _build_document_index, helpers.build_sample_idx and _build_shuffle_index for 3 samples
// (one epoch), 12 (two epochs together) and 16 (three, the last shuffled separately).
static void test_gpt_index(void) {
    static const int32_t lengths[10] = {7, 3, 1, 12, 0, 4, 9, 2, 6, 5};
    static const struct {
        int64_t num_samples;
        int epochs, separate, n_docs, n_samples;
        int32_t doc[21];
        int64_t sample[42], shuffle[20];
    } cases[] = {
        {3, 1, 0, 7, 6, {2, 3, 7, 4, 6, 5, 8}, {0, 0, 1, 4, 1, 9, 4, 0, 4, 5, 5, 1, 6, 2}, {3, 0, 1, 2, 5, 4}},
        {12, 2, 0, 14, 13, {4, 6, 2, 7, 7, 3, 4, 3, 8, 6, 2, 5, 5, 8},
         {0, 0, 1, 5, 3, 0, 5, 1, 5, 6, 5, 11, 7, 4, 7, 9, 8, 2, 9, 1, 9, 6, 11, 1, 12, 2, 13, 3},
         {8, 10, 0, 6, 11, 9, 3, 1, 4, 5, 2, 12, 7}},
        {16, 3, 1, 21, 20, {4, 6, 2, 7, 7, 3, 4, 3, 8, 6, 2, 5, 5, 8, 2, 8, 5, 3, 6, 7, 4},
         {0, 0, 1, 5, 3, 0, 5, 1, 5, 6, 5, 11, 7, 4, 7, 9, 8, 2, 9, 1, 9, 6,
          11, 1, 12, 2, 13, 3, 15, 1, 16, 0, 17, 1, 17, 6, 17, 11, 18, 4, 19, 0},
         {12, 7, 6, 2, 8, 9, 3, 10, 5, 0, 4, 11, 1, 13, 19, 15, 17, 18, 16, 14}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        GptIndex g;
        gpt_index_build(&g, lengths, 2, 7, cases[c].num_samples, 5, 42);
        long long k = (long long)cases[c].num_samples;
        CHECK(g.tokens_per_epoch == 34 && g.num_epochs == cases[c].epochs &&
                  g.separate_final_epoch == cases[c].separate,
              "%lld samples: %d epochs (separate %d)", k, g.num_epochs, g.separate_final_epoch);
        CHECK(g.n_documents == cases[c].n_docs && g.n_samples == cases[c].n_samples, "%lld samples: sizes", k);
        if (g.n_documents != cases[c].n_docs || g.n_samples != cases[c].n_samples) {
            gpt_index_free(&g);
            continue;
        }
        CHECK(!memcmp(g.document_index, cases[c].doc, (size_t)g.n_documents * sizeof(int32_t)),
              "%lld samples: document index differs", k);
        CHECK(same_i64(g.sample_index, cases[c].sample, 2 * (g.n_samples + 1)), "%lld samples: sample index differs",
              k);
        CHECK(same_i64(g.shuffle_index, cases[c].shuffle, g.n_samples), "%lld samples: shuffle index differs", k);
        gpt_index_free(&g);
    }
}

int main(void) {
    RUN(test_numpy_sum);
    RUN(test_split_ranges);
    RUN(test_blend_lists);
    RUN(test_blend_sizes);
    RUN(test_blending_indices);
    RUN(test_gpt_index);
    TESTS_DONE();
}
