// state.cu — the cuda backend's state ops (contracts in ops_state.h): sampling generation's
// next token. One thread walks the vocabulary in the cpu's order (src/ops/cpu/state.c) with
// the same arithmetic, so the token is the cpu's: a heap sort with the cpu's total order
// (descending weight, equal weights in token order) gives qsort's order. One token per
// generated position: the serial walk costs O(top_k·vocab + vocab·log vocab) on one thread.
#include "ops/cuda/cuda_internal.h"

#include <math.h>

// x comes before y in the nucleus order: more probable first, equal weights in token order.
__device__ static bool comes_first(const double *w, int32_t x, int32_t y) {
    if (w[x] != w[y]) return w[x] > w[y];
    return x < y;
}

// Restores the heap below `root` of order[0..end] (the root comes last in the nucleus order).
__device__ static void sift_down(int32_t *order, const double *w, int root, int end) {
    for (;;) {
        int child = 2 * root + 1, pick = root;
        if (child > end) return;
        if (comes_first(w, order[pick], order[child])) pick = child;
        if (child + 1 <= end && comes_first(w, order[pick], order[child + 1])) pick = child + 1;
        if (pick == root) return;
        int32_t t = order[root];
        order[root] = order[pick];
        order[pick] = t;
        root = pick;
    }
}

// order (n) sorted into the nucleus order.
__device__ static void sort_by_weight(int32_t *order, const double *w, int n) {
    for (int start = (n - 2) / 2; start >= 0; start--) sift_down(order, w, start, n - 1);
    for (int end = n - 1; end > 0; end--) {
        int32_t t = order[0];
        order[0] = order[end];
        order[end] = t;
        sift_down(order, w, 0, end - 1);
    }
}

// The weights at or above the top-k threshold (cpu: tempered_weights); sorted (vocab) scratch.
__device__ static void tempered_weights(const float *logits, int vocab, int best, double temperature, int top_k,
                                        double *w, double *sorted) {
    double threshold = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        for (int v = 0; v < vocab; v++) sorted[v] = logits[v];
        for (int i = 0; i < top_k; i++)
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

// Nucleus filtering (cpu: keep_top_p).
__device__ static void keep_top_p(double *w, int vocab, double top_p, int32_t *order) {
    double total = 0;
    for (int v = 0; v < vocab; v++) order[v] = v, total += w[v];
    sort_by_weight(order, w, vocab);
    double mass_before = 0;
    for (int i = 0; i < vocab; i++) {
        double p = w[order[i]];
        if (i > 0 && mass_before >= top_p * total) w[order[i]] = 0;
        mass_before += p;
    }
}

__device__ static int sample(const float *logits, int vocab, const SampleParams &p, double *w, int32_t *order) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (p.temperature <= 0) return best;
    tempered_weights(logits, vocab, best, p.temperature, p.top_k, w, w + vocab);
    if (p.top_p < 1) keep_top_p(w, vocab, p.top_p, order);
    double total = 0;
    for (int v = 0; v < vocab; v++) total += w[v];
    double r = p.u * total;
    for (int v = 0; v < vocab; v++) {
        if (w[v] == 0) continue;
        r -= w[v];
        if (r <= 0) return v;
    }
    return best;
}

__global__ void sample_next_token_kernel(int32_t *token, const float *logits, int vocab, SampleParams p, double *work,
                                         int32_t *order) {
    if (blockIdx.x == 0 && threadIdx.x == 0) token[0] = sample(logits, vocab, p, work, order);
}

void cuda_sample_next_token(int32_t *token, const real *logits, int vocab, const SampleParams *p, double *work,
                            int32_t *order) {
    sample_next_token_kernel<<<1, 1, 0, cuda_stream()>>>(token, logits, vocab, *p, work, order);
    CUDA_CHECK_LAUNCH();
}
