// tp_mappings.h — the paired forward/backward mappings at the boundaries of a
// tensor-parallel block (Megatron-Core's tensor_parallel/mappings.py, in rows of C values).
//
// A block is entered before its column-parallel matmuls (every rank needs all N tokens)
// and exited after its row-parallel matmul (each rank holds a partial sum of the output):
//
//                      enter forward     enter backward   exit forward     exit backward
//   without SP         identity          all-reduce       all-reduce       identity
//   sequence parallel  all-gather rows   reduce-scatter   reduce-scatter   all-gather rows
//
// With sequence parallelism a rank holds rows [rank·N/P, (rank+1)·N/P) of the N tokens
// outside the block; without it every rank holds all N. Sums run in rank order
// (parallel/comm.h). With a group of one every mapping is the identity (a copy when the
// buffers differ).
#pragma once
#include "parallel/comm.h"

typedef struct {
    const Comm *tp;         // the tensor-parallel group
    int sequence_parallel;  // tokens split over tp outside the block
} TpRegion;

// x (local rows, C) -> x_full (N, C). Without SP x_full may be x (nothing to do).
void tp_enter_forward(const TpRegion *r, const real *x, real *x_full, int N, int C);
// d_full (N, C), this rank's partial gradient -> d_x (local rows, C), summed over tp.
// Without SP d_x may be d_full (summed in place). d_full is clobbered.
void tp_enter_backward(const TpRegion *r, real *d_full, real *d_x, int N, int C);
// y_partial (N, C), this rank's partial sum -> y (local rows, C), summed over tp. Without
// SP y may be y_partial (summed in place).
void tp_exit_forward(const TpRegion *r, real *y_partial, real *y, int N, int C);
// d_y (local rows, C) -> d_full (N, C) on every rank. Without SP d_full may be d_y.
void tp_exit_backward(const TpRegion *r, const real *d_y, real *d_full, int N, int C);
