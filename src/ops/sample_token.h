// sample_token.h — the one source of generation's sampling arithmetic (ops_state.h,
// sample_next_token), for the cpu backend and the cuda kernel alike: one serial walk over
// the vocabulary in a fixed order, so both backends pick the same token, bit for bit.
// Nucleus order: descending weight, equal weights in token order (a total order, so the
// heap sort here gives the one sorted order any correct sort would).
#pragma once
#include <math.h>
#include <stdint.h>

#include "ops/ops_state.h"

#ifdef __CUDACC__
#define SAMPLE_FN static inline __host__ __device__
#else
#define SAMPLE_FN static inline
#endif

// x comes before y in the nucleus order.
SAMPLE_FN int sample_comes_first(const double *w, int32_t x, int32_t y) {
    if (w[x] != w[y]) return w[x] > w[y];
    return x < y;
}

// Restores the heap below `root` of order[0..end] (the root comes last in the nucleus order).
SAMPLE_FN void sample_sift_down(int32_t *order, const double *w, int root, int end) {
    for (;;) {
        int child = 2 * root + 1, pick = root;
        if (child > end) return;
        if (sample_comes_first(w, order[pick], order[child])) pick = child;
        if (child + 1 <= end && sample_comes_first(w, order[pick], order[child + 1])) pick = child + 1;
        if (pick == root) return;
        int32_t t = order[root];
        order[root] = order[pick];
        order[pick] = t;
        root = pick;
    }
}

// order (n) sorted into the nucleus order (heap sort: no recursion, no allocation).
SAMPLE_FN void sample_sort_by_weight(int32_t *order, const double *w, int n) {
    for (int start = (n - 2) / 2; start >= 0; start--) sample_sift_down(order, w, start, n - 1);
    for (int end = n - 1; end > 0; end--) {
        int32_t t = order[0];
        order[0] = order[end];
        order[end] = t;
        sample_sift_down(order, w, 0, end - 1);
    }
}

// Sampling weights of the tokens at or above the top-k threshold (0 for the others):
// exp((logit - max) / temperature), unnormalised. sorted (vocab) is scratch.
SAMPLE_FN void sample_tempered_weights(const real *logits, int vocab, int best, double temperature, int top_k,
                                       double *w, double *sorted) {
    double threshold = -INFINITY;  // the k-th largest logit when top_k is set
    if (top_k > 0 && top_k < vocab) {
        for (int v = 0; v < vocab; v++) sorted[v] = logits[v];
        for (int i = 0; i < top_k; i++)  // partial selection sort: top_k is small
            for (int j = i + 1; j < vocab; j++)
                if (sorted[j] > sorted[i]) {
                    double x = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = x;
                }
        threshold = sorted[top_k - 1];
    }
    for (int v = 0; v < vocab; v++) w[v] = logits[v] >= threshold ? exp((logits[v] - logits[best]) / temperature) : 0;
}

// Nucleus filtering (transformers' TopPLogitsWarper): keeps, from the most probable down,
// every token whose more probable tokens hold less than top_p of the probability (so at
// least one); the others get weight 0. order (vocab) is scratch.
SAMPLE_FN void sample_keep_top_p(double *w, int vocab, double top_p, int32_t *order) {
    double total = 0;
    for (int v = 0; v < vocab; v++) order[v] = v, total += w[v];
    sample_sort_by_weight(order, w, vocab);
    double mass_before = 0;
    for (int i = 0; i < vocab; i++) {
        double p = w[order[i]];
        if (i > 0 && mass_before >= top_p * total) w[order[i]] = 0;
        mass_before += p;
    }
}

// The next token (ops_state.h, sample_next_token); w (2·vocab) and order (vocab) scratch.
SAMPLE_FN int sample_token(const real *logits, int vocab, const SampleParams *p, double *w, int32_t *order) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (p->temperature <= 0) return best;
    sample_tempered_weights(logits, vocab, best, p->temperature, p->top_k, w, w + vocab);
    if (p->top_p < 1) sample_keep_top_p(w, vocab, p->top_p, order);
    double total = 0;
    for (int v = 0; v < vocab; v++) total += w[v];
    double r = p->u * total;
    for (int v = 0; v < vocab; v++) {
        if (w[v] == 0) continue;
        r -= w[v];
        if (r <= 0) return v;
    }
    return best;
}
