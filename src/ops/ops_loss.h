// ops_loss.h — the ops of the LM head loss reductions and vocab-parallel cross-entropy: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_LOSS).
#pragma once
#include "ops/ops.h"

// sums (2) = (Σ_n w_n, Σ_n w_n·token_loss_n) over n = 0..N−1 in double, w_n = loss_mask[n]
// (all 1 when loss_mask is NULL); overwritten. The cpu sums in order n = 0, 1, ...; the
// cuda backend in a fixed tree order (same bits run to run).
void lm_loss_sums(double *sums, const real *token_loss, const real *loss_mask, int N);

// weight (N) = counted > 0 ? (real)(w_n / counted) : 0, w_n as in lm_loss_sums; overwritten.
void lm_loss_weights(real *weight, const real *loss_mask, double counted, int N);

// dst (n) = (real)(src · scale), the product in double; overwritten (dst may be src).
void vec_scale_double(real *dst, const real *src, double scale, size_t n);

// ---- vocab-parallel embedding and cross-entropy (model/vocab_parallel.c) ------------------
// A rank holds rows [first, first + vocab) of the vocabulary; "held" = the token falls there.

// rows (N) = tokens[n] − first where held, else `missing` (−1: skip, 0: column 0); overwritten.
void vocab_slice_rows(int32_t *rows, const int32_t *tokens, int first, int vocab, int32_t missing, int N);

// dtable (vocab, C) += dout (N, C) row n at row rows[n], for rows[n] ≥ 0 (others skipped);
// each table element sums its tokens in order n = 0, 1, ... (no atomics).
void vocab_embedding_grad(real *dtable, const real *dout, const int32_t *rows, int N, int C);

// maxima (N) = the largest of each row of logits (N, V) (row[0], then v = 1.. in order, a NaN
// never replaces it); overwritten.
void vocab_row_max(real *maxima, const real *logits, int N, int V);

// Given every (P, N): the row maxima of the P ranks of the group (rank order), overwrites
// maxima (N) = max_q every[q·N + n] (q in order) and stats (2N): [0, N) Σ_v e^(logit − maxima)
// of each row in double (v in order on the cpu), [N, 2N) the target's logit where this
// rank holds it (targets global, first as in vocab_slice_rows), else 0.
void vocab_row_stats(double *stats, real *maxima, const real *every, const real *logits, const int32_t *targets,
                     int first, int P, int N, int V);

// From the group's maxima (N) and summed stats (2N) of vocab_row_stats: lse (N) =
// (real)(maxima + log stats[n]) and losses (N) = (real)(that lse in double − stats[N + n]); overwritten.
void vocab_ce_finish(real *losses, real *lse, const real *maxima, const double *stats, int N);

// After cross_entropy_backward with a target held elsewhere sent to column 0: for those
// rows n with weight[n] ≠ 0, dlogits[n·V] = e^(logits[n·V] − lse[n])·weight[n] again
// (without the one-hot); other elements untouched. targets global, first as above.
void vocab_ce_foreign_targets(real *dlogits, const real *logits, const real *lse, const int32_t *targets,
                              const real *weight, int first, int N, int V);
