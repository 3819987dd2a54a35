// state.c — the cpu backend's state ops (contracts in ops_state.h): sampling generation's
// next token (the host code generate.c had, unchanged in arithmetic and order).
#include <math.h>
#include <stdlib.h>

#include "ops/cpu/cpu_ops.h"

// Sampling weights of the tokens at or above the top-k threshold (0 for the others):
// exp((logit - max) / temperature), unnormalised. sorted (vocab) is scratch.
static void tempered_weights(const real *logits, int vocab, int best, double temperature, int top_k, double *w,
                             double *sorted) {
    // threshold = k-th largest logit when top_k is set
    double threshold = -INFINITY;
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

static const double *g_weights;  // what by_weight_descending compares (qsort has no context)

// More probable first; equal weights in token order.
static int by_weight_descending(const void *a, const void *b) {
    int x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_weights[x] != g_weights[y]) return g_weights[x] > g_weights[y] ? -1 : 1;
    return x - y;
}

// Nucleus filtering (transformers' TopPLogitsWarper): keeps, from the most probable down,
// every token whose more probable tokens hold less than top_p of the probability (so at
// least one); the others get weight 0. order (vocab) is scratch.
static void keep_top_p(double *w, int vocab, double top_p, int32_t *order) {
    double total = 0;
    for (int v = 0; v < vocab; v++) order[v] = v, total += w[v];
    g_weights = w;
    qsort(order, vocab, sizeof(int32_t), by_weight_descending);
    double mass_before = 0;
    for (int i = 0; i < vocab; i++) {
        double p = w[order[i]];
        if (i > 0 && mass_before >= top_p * total) w[order[i]] = 0;
        mass_before += p;
    }
}

static int sample(const real *logits, int vocab, const SampleParams *p, double *w, int32_t *order) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (p->temperature <= 0) return best;
    tempered_weights(logits, vocab, best, p->temperature, p->top_k, w, w + vocab);
    if (p->top_p < 1) keep_top_p(w, vocab, p->top_p, order);
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

void cpu_sample_next_token(int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work,
                           int32_t *order) {
    token[0] = sample(logits, vocab, p, work, order);
}
