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
