// vocab_parallel.c — vocab-parallel embedding and cross-entropy (vocab_parallel.h).
//
// The row movement runs in ops.h's ops (moe_permute is the gather of rows with zeros for
// the padding that both need); the per-token bookkeeping (which tokens this rank holds)
// and the cross-entropy's per-row statistics (row maxima and sums of exponentials against
// a maximum over the group), which ops.h has no op for, are host loops over the tensor
// memory, as the loss reduction of lm_head.c.
#include "model/vocab_parallel.h"

#include <math.h>

#include "core/device.h"
#include "ops/ops.h"

VocabSlice vocab_slice_of_plan(const LayoutPlan *p) {
    return (VocabSlice){.region = {.tp = p->tp, .sequence_parallel = p->sequence_parallel},
                        .vocab_first = p->vocab_first,
                        .vocab = p->vocab};
}

void vocab_scratch_plan(BufferPlan *bp, VocabScratch *s, int N, int H) {
    s->N = N;
    s->H = H;
    buffer_real(bp, &s->rows, "vocab_scratch.rows", N, H, BUF_WORKSPACE);
    buffer_real(bp, &s->owned_rows, "vocab_scratch.owned_rows", N, H, BUF_WORKSPACE);
    buffer_int32(bp, &s->index, "vocab_scratch.index", 2, N, BUF_WORKSPACE);
}

static int whole_vocab(const VocabSlice *s) { return s->region.tp->size == 1; }

static int fits(const VocabScratch *w, int N, int H) { return N <= w->N && H == w->H; }

// The token's row in this rank's slice, or −1 when another rank holds it.
static int32_t slice_row(const VocabSlice *s, int32_t token) {
    int32_t row = token - s->vocab_first;
    return row >= 0 && row < s->vocab ? row : -1;
}

// ---- embedding ---------------------------------------------------------------------------

void vocab_embedding_forward(const VocabSlice *s, VocabScratch *w, real *out, const int32_t *tokens,
                             const real *table, int N, int H) {
    if (whole_vocab(s)) {
        embedding_forward(out, tokens, table, N, H);
        return;
    }
    MT_ASSERT(fits(w, N, H));
    int32_t *row_of_token = w->index;  // (N)
    for (int n = 0; n < N; n++) row_of_token[n] = slice_row(s, tokens[n]);
    // partial (N,H): the rows held, zeros for the others; then the sum over TP
    moe_permute(w->rows, NULL, table, NULL, row_of_token, NULL, N, 1, H);
    tp_exit_forward(&s->region, w->rows, out, N, H);
}

// The positions (R) of the tokens this rank holds, in token order, and their slice rows (R).
static int list_held_tokens(const VocabSlice *s, const int32_t *tokens, int N, int32_t *positions,
                            int32_t *rows) {
    int held = 0;
    for (int n = 0; n < N; n++) {
        int32_t row = slice_row(s, tokens[n]);
        if (row < 0) continue;
        positions[held] = n;
        rows[held++] = row;
    }
    return held;
}

void vocab_embedding_backward(const VocabSlice *s, VocabScratch *w, real *dtable, const real *d_out,
                              const int32_t *tokens, int N, int H) {
    if (whole_vocab(s)) {
        embedding_backward(dtable, d_out, tokens, N, H);
        return;
    }
    MT_ASSERT(fits(w, N, H));
    tp_exit_backward(&s->region, d_out, w->rows, N, H);  // every token's gradient (N,H)
    int32_t *positions = w->index, *rows = w->index + N;
    int held = list_held_tokens(s, tokens, N, positions, rows);
    if (held == 0) return;
    // the held tokens' gradient rows (held, H), in token order, scattered into the slice
    moe_permute(w->owned_rows, NULL, w->rows, NULL, positions, NULL, held, 1, H);
    embedding_backward(dtable, w->owned_rows, rows, held, H);
}

// ---- cross-entropy -------------------------------------------------------------------------

// maxima (N): the largest logit of each row, over the whole vocabulary: this rank's row
// maxima gathered from every rank (P·N values), then the largest per row (exact, so the
// same on every rank).
static void group_row_maxima(const VocabSlice *s, real *maxima, const real *logits, int N) {
    const Comm *tp = s->region.tp;
    int V = s->vocab;
    real *mine = mt_malloc(((size_t)N + 1) * sizeof(real));
    real *every = mt_malloc(((size_t)tp->size * N + 1) * sizeof(real));  // (P, N)
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        real mx = row[0];
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        mine[n] = mx;
    }
    comm_allgather(tp, mine, every, (size_t)N);
    for (int n = 0; n < N; n++) {
        real mx = every[n];
        for (int q = 1; q < tp->size; q++) mx = MT_MAX(mx, every[(size_t)q * N + n]);
        maxima[n] = mx;
    }
    free(every);
    free(mine);
}

// stats (2N), summed over TP in rank order: [0, N) Σ_v e^(logit − max) of each row, in
// double; [N, 2N) the target's logit (only the rank holding it adds a non-zero).
static void group_row_stats(const VocabSlice *s, double *stats, const real *logits, const int32_t *targets,
                            const real *maxima, int N) {
    int V = s->vocab;
#pragma omp parallel for schedule(static) if (N > 64)
    for (int n = 0; n < N; n++) {
        const real *row = logits + (size_t)n * V;
        double sum = 0;
        for (int v = 0; v < V; v++) sum += real_exp(row[v] - maxima[n]);
        int32_t target = slice_row(s, targets[n]);
        stats[n] = sum;
        stats[N + n] = target >= 0 ? row[target] : 0;
    }
    comm_allreduce_sum_double(s->region.tp, stats, 2 * (size_t)N);
}

void vocab_cross_entropy_forward(const VocabSlice *s, real *losses, real *lse, const real *logits,
                                 const int32_t *targets, int N) {
    if (whole_vocab(s)) {
        cross_entropy_forward(losses, lse, logits, targets, N, s->vocab);
        return;
    }
    real *maxima = mt_malloc(((size_t)N + 1) * sizeof(real));
    double *stats = mt_malloc((2 * (size_t)N + 1) * sizeof(double));
    group_row_maxima(s, maxima, logits, N);
    group_row_stats(s, stats, logits, targets, maxima, N);
    for (int n = 0; n < N; n++) {
        double row_lse = maxima[n] + log(stats[n]);
        lse[n] = (real)row_lse;
        losses[n] = (real)(row_lse - stats[N + n]);
    }
    free(stats);
    free(maxima);
}

void vocab_cross_entropy_backward(const VocabSlice *s, VocabScratch *w, real *dlogits, const real *logits,
                                  const real *lse, const int32_t *targets, const real *weight, int N) {
    int V = s->vocab;
    if (whole_vocab(s)) {
        cross_entropy_backward(dlogits, logits, lse, targets, weight, N, V);
        return;
    }
    MT_ASSERT(N <= w->N);
    // The op subtracts the one-hot at every row's target: a target held elsewhere points at
    // column 0, whose element is then written again without the subtraction.
    int32_t *slice_target = w->index;  // (N)
    for (int n = 0; n < N; n++) slice_target[n] = MT_MAX(slice_row(s, targets[n]), 0);
    cross_entropy_backward(dlogits, logits, lse, slice_target, weight, N, V);
    for (int n = 0; n < N; n++) {
        if (slice_row(s, targets[n]) >= 0 || weight[n] == 0) continue;
        size_t first = (size_t)n * V;
        dlogits[first] = real_exp(logits[first] - lse[n]) * weight[n];
    }
}
