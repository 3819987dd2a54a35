// vocab_parallel.c — vocab-parallel embedding and cross-entropy (vocab_parallel.h).
//
// Every per-token step is an op: the row movement in ops.h's (moe_permute is the gather of
// rows with zeros for the padding), the slice rows of the tokens, the held tokens' gradient
// and the cross-entropy's per-row statistics (row maxima and sums of exponentials against
// a maximum over the group) in ops_loss.h's. The host only sequences them and the
// collectives, which run on tensor memory.
#include "model/vocab_parallel.h"

#include "core/device.h"
#include "ops/ops.h"
#include "ops/ops_loss.h"

VocabSlice vocab_slice_of_plan(const LayoutPlan *p) {
    return (VocabSlice){.region = {.tp = p->tp, .sequence_parallel = p->sequence_parallel},
                        .vocab_first = p->vocab_first,
                        .vocab = p->vocab};
}

void vocab_scratch_plan(BufferPlan *bp, VocabScratch *s, int N, int H) {
    s->N = N;
    s->H = H;
    buffer_real(bp, &s->rows, "vocab_scratch.rows", N, H, BUF_WORKSPACE);
    buffer_int32(bp, &s->index, "vocab_scratch.index", N, 1, BUF_WORKSPACE);
}

static int whole_vocab(const VocabSlice *s) { return s->region.tp->size == 1; }

static int fits(const VocabScratch *w, int N, int H) { return N <= w->N && H == w->H; }

// ---- embedding ---------------------------------------------------------------------------

void vocab_embedding_forward(const VocabSlice *s, VocabScratch *w, real *out, const int32_t *tokens,
                             const real *table, int N, int H) {
    if (whole_vocab(s)) {
        embedding_forward(out, tokens, table, N, H);
        return;
    }
    MT_ASSERT(fits(w, N, H));
    int32_t *row_of_token = w->index;  // (N)
    vocab_slice_rows(row_of_token, tokens, s->vocab_first, s->vocab, -1, N);
    // partial (N,H): the rows held, zeros for the others; then the sum over TP
    moe_permute(w->rows, STORE_FP32, NULL, table, STORE_FP32, NULL, row_of_token, NULL, N, 1, H);
    tp_exit_forward(&s->region, w->rows, out, N, H);
}

void vocab_embedding_backward(const VocabSlice *s, VocabScratch *w, real *dtable, const real *d_out,
                              const int32_t *tokens, int N, int H) {
    if (whole_vocab(s)) {
        embedding_backward(dtable, d_out, tokens, N, H);
        return;
    }
    MT_ASSERT(fits(w, N, H));
    tp_exit_backward(&s->region, d_out, w->rows, N, H);  // every token's gradient (N,H)
    // the held tokens' gradient rows, in token order, added into the slice
    int32_t *rows = w->index;  // (N)
    vocab_slice_rows(rows, tokens, s->vocab_first, s->vocab, -1, N);
    vocab_embedding_grad(dtable, w->rows, rows, N, H);
}

// ---- cross-entropy -------------------------------------------------------------------------

// The cross-entropy forward's scratch, tensor memory kept between calls and grown to the
// largest request: stats (2N doubles), then this rank's row maxima (N), the group's (P, N)
// and their maxima (N). The forward runs one call at a time, so one block serves all.
typedef struct {
    double *stats;
    real *mine, *every, *maxima;
} CeScratch;

static CeScratch ce_scratch(int P, int N) {
    static void *block;
    static size_t bytes;
    size_t stats_bytes = 2 * (size_t)N * sizeof(double), need = stats_bytes + ((size_t)P + 2) * N * sizeof(real);
    if (need > bytes) {
        device_free(block);
        block = device_calloc(need, 1);
        bytes = need;
    }
    real *reals = (real *)((char *)block + stats_bytes);
    return (CeScratch){.stats = block, .mine = reals, .every = reals + N, .maxima = reals + (size_t)(P + 1) * N};
}

// The group's row maxima (the largest logit of each row over the whole vocabulary: this
// rank's gathered from every rank, then the largest per row, exact, so the same on every
// rank) and stats (2N), summed over TP in rank order: [0, N) Σ_v e^(logit − max) of each
// row, in double; [N, 2N) the target's logit (only the rank holding it adds a non-zero).
static void group_row_stats(const VocabSlice *s, const CeScratch *w, const real *logits, const int32_t *targets,
                            int N) {
    const Comm *tp = s->region.tp;
    vocab_row_max(w->mine, logits, N, s->vocab);
    comm_allgather(tp, w->mine, w->every, (size_t)N);
    vocab_row_stats(w->stats, w->maxima, w->every, logits, targets, s->vocab_first, tp->size, N, s->vocab);
    comm_allreduce_sum_double(tp, w->stats, 2 * (size_t)N);
}

void vocab_cross_entropy_forward(const VocabSlice *s, real *losses, real *lse, const real *logits,
                                 const int32_t *targets, int N) {
    if (whole_vocab(s)) {
        cross_entropy_forward(losses, lse, logits, targets, N, s->vocab);
        return;
    }
    CeScratch w = ce_scratch(s->region.tp->size, N);
    group_row_stats(s, &w, logits, targets, N);
    vocab_ce_finish(losses, lse, w.maxima, w.stats, N);
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
    vocab_slice_rows(slice_target, targets, s->vocab_first, V, 0, N);
    cross_entropy_backward(dlogits, logits, lse, slice_target, weight, N, V);
    vocab_ce_foreign_targets(dlogits, logits, lse, targets, weight, s->vocab_first, N, V);
}
