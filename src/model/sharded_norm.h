// sharded_norm.h — RMSNorm over a row whose C_total columns are split over a group (the
// whole-projection QK-norm of OLMoE, --qk-layernorm-scope projection, with tensor
// parallelism): each rank holds C columns of every row; the mean of squares spans all of
// them. Pieces held by `replicas` ranks each (kv heads fewer than TP) count once.
//   y = x·r·w,  r = (Σ_all x² / C_total + eps)^(-1/2)
// With a group of one these are rmsnorm_forward / rmsnorm_backward, bit for bit.
#pragma once
#include "parallel/comm.h"

typedef struct {
    const Comm *group;  // the ranks sharing each row
    int replicas;       // ranks holding each piece of the row (1: every piece once)
} NormShards;

// x (N,C) -> y (N,C), rstd (N); w (C) the weights of these columns
void rmsnorm_sharded_forward(real *y, real *rstd, const real *x, const real *w, int N, int C, real eps,
                             const NormShards *s);
// dy (N,C) this rank's gradient (with replicas: its part) -> dx (N,C) +=, dw (C) +=
void rmsnorm_sharded_backward(real *dx, real *dw, const real *dy, const real *x, const real *w, const real *rstd,
                              int N, int C, const NormShards *s);
