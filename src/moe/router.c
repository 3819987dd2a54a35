#include "moe/router.h"

#include <math.h>
#include <string.h>

#include "ops/ops.h"

// Indices of the k largest values of row (E), descending, lowest index first on ties.
static void topk_row(int32_t *idx, const real *row, int E, int k) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || row[e] > row[best])) best = e;
        }
        idx[j] = best;
    }
}

// Softmax over the k selected logits of one token.
static void softmax_selected(real *probs, const real *logits_row, const int32_t *idx, int k) {
    real mx = logits_row[idx[0]];  // idx is sorted descending
    double sum = 0;
    for (int j = 0; j < k; j++) sum += exp((double)logits_row[idx[j]] - mx);
    for (int j = 0; j < k; j++) probs[j] = (real)(exp((double)logits_row[idx[j]] - mx) / sum);
}

void router_forward(RouterOutput *out, const real *logits, const RouterShape *s) {
    int N = s->N, E = s->E, k = s->k;
    softmax_forward(out->scores, logits, N, E);
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        int32_t *idx = out->topk_idx + (size_t)n * k;
        real *probs = out->topk_probs + (size_t)n * k;
        const real *scores = out->scores + (size_t)n * E;
        // softmax is monotonic: the top-k of the logits and of the scores are the same set
        topk_row(idx, logits + (size_t)n * E, E, k);
        if (s->pre_softmax)
            for (int j = 0; j < k; j++) probs[j] = scores[idx[j]];
        else
            softmax_selected(probs, logits + (size_t)n * E, idx, k);
    }
    memset(out->tokens_per_expert, 0, E * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)N * k; i++) out->tokens_per_expert[out->topk_idx[i]]++;
    // aux = E/(k N²) Σ_e c_e Σ_x ŝ[x,e]
    double aux = 0;
    for (int e = 0; e < E; e++) {
        double column = 0;
        for (int n = 0; n < N; n++) column += out->scores[(size_t)n * E + e];
        aux += column * out->tokens_per_expert[e];
    }
    out->aux_loss = aux * E / ((double)k * N * N);
}

void router_backward(real *dlogits, const real *dprobs, const RouterOutput *out,
                     const RouterShape *s, double aux_grad_scale) {
    int N = s->N, E = s->E, k = s->k;
    // dL_aux/dŝ[x,e] = aux_grad_scale · E/(k N²) · c_e, the same for every token
    double aux_factor = aux_grad_scale * E / ((double)k * N * N);
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const int32_t *idx = out->topk_idx + (size_t)n * k;
        const real *probs = out->topk_probs + (size_t)n * k, *dp = dprobs + (size_t)n * k;
        const real *scores = out->scores + (size_t)n * E;
        real *dl = dlogits + (size_t)n * E;
        // gradient with respect to the full softmax scores ŝ (pre-softmax probs + aux)
        double dscores[E];
        for (int e = 0; e < E; e++) dscores[e] = aux_factor * out->tokens_per_expert[e];
        if (s->pre_softmax)
            for (int j = 0; j < k; j++) dscores[idx[j]] += dp[j];
        double dot = 0;
        for (int e = 0; e < E; e++) dot += scores[e] * dscores[e];
        for (int e = 0; e < E; e++) dl[e] = (real)(scores[e] * (dscores[e] - dot));
        if (!s->pre_softmax) {
            // p = softmax over the selected logits: dl[I_j] += p_j (dp_j − Σ p·dp)
            double pdot = 0;
            for (int j = 0; j < k; j++) pdot += (double)probs[j] * dp[j];
            for (int j = 0; j < k; j++) dl[idx[j]] += (real)(probs[j] * (dp[j] - pdot));
        }
    }
}
