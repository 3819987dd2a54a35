// ops_parallel.h — the ops of tensor- and context-parallel gathers, slices and partial sums: their types and
// contracts (shapes, overwrite vs +=, reduction order); listed in op_list.h (MT_OPS_PARALLEL).
#pragma once
#include "ops/ops.h"

// rows_copy_strided: `rows` runs of `width` bytes, run r from src + r·src_pitch to
// dst + r·dst_pitch (overwritten); the runs do not overlap. Any element type: a CP
// sequence chunk taken out of or put back into the local tokens, (outer, C, ·) ↔ (outer, 2C, ·).
// lse_reset: lse[0..n) = −∞ (overwritten): log-sum-exps before any block is merged.

void rows_copy_strided(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, int rows);
// rows_gather: dst row i (width bytes, overwritten) = src row index[i], for i < rows.
// rows_scatter: dst row index[i] (overwritten) = src row i, for i < rows; the indices are distinct
// and only the rows they name are written. Any element type: rows of a token group's per-choice
// values reordered between member order and token order (the router's capacity decision).
void rows_gather(void *dst, const void *src, const int32_t *index, int rows, size_t width);
void rows_scatter(void *dst, const void *src, const int32_t *index, int rows, size_t width);
void lse_reset(real *lse, size_t n);
// batched_transpose: dst (batch, cols, rows) = src (batch, rows, cols) transposed per batch
// (overwritten; dst and src do not overlap): per-head log-sum-exps between head-major and
// token-major (CP's all-to-all attention).
void batched_transpose(real *dst, const real *src, int batch, int rows, int cols);
// heads_sum: dst (rows, width) = Σ_h src[(n·heads + h)·head_pitch + i] (overwritten), summed from 0 over
// h = 0, 1, … in order: the gradient of one row shared by every head (MLA's rotary key).
void heads_sum(real *dst, const real *src, int rows, int heads, size_t head_pitch, int width);
