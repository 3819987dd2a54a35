// vocab_parallel.h — the embedding and the cross-entropy with the vocabulary split over
// the tensor-parallel (TP) group (Megatron-Core's VocabParallelEmbedding and
// vocab_parallel_cross_entropy, in moetron's ops).
//
// Each TP rank holds rows [vocab_first, vocab_first + vocab) of the padded vocabulary: of
// the embedding table, of the LM head, hence the same columns of the logits. No rank ever
// holds logits over the whole vocabulary: the cross-entropy exchanges per-token statistics
// only (N values per rank).
//
//   embedding:      tokens (N) -> out (local rows, H): own rows looked up, others zero,
//                   summed over TP (tp_exit_forward: all-reduce, or with sequence
//                   parallelism a reduce-scatter to this rank's N/TP rows)
//   cross-entropy:  logits (N, vocab) of this rank's columns, targets (N) global ids ->
//                   losses (N), lse (N), the same on every rank and equal (up to the order
//                   of float sums) to cross_entropy_forward over the whole vocabulary
//
// With a TP group of one the functions call the single-process ops (embedding_*,
// cross_entropy_*) directly: bit-identical results.
#pragma once
#include "core/buffer_plan.h"
#include "model/layout.h"
#include "parallel/tp_mappings.h"

// This rank's piece of the vocabulary and the group it is cut over.
typedef struct {
    TpRegion region;         // the TP group, and whether tokens are split over it outside blocks
    int vocab_first, vocab;  // rows held: [vocab_first, vocab_first + vocab) of the padded vocabulary
} VocabSlice;

// The slice of the rank a layout plan describes.
VocabSlice vocab_slice_of_plan(const LayoutPlan *p);

// Tensor memory the functions work in, for micro-batches of up to N tokens of width H
// (part of the activations' buffer plan: model/activations.c).
typedef struct {
    real *rows;        // (N, H): the partial embedding sum; the gathered embedding gradient
    int32_t *index;    // (N): each token's row in the slice (−1, or 0 for a target, where another rank holds it)
    int N, H;
} VocabScratch;

// Declares s's buffers for up to N tokens of width H in bp (core/buffer_plan.h), as
// workspaces; they are set when bp is allocated.
void vocab_scratch_plan(BufferPlan *bp, VocabScratch *s, int N, int H);

// tokens (N) global ids, table (vocab, H) this rank's rows -> out (local rows, H): rows
// [r·N/TP, (r+1)·N/TP) of the embedding with sequence parallelism, all N without (out is
// not one of w's buffers).
void vocab_embedding_forward(const VocabSlice *s, VocabScratch *w, real *out, const int32_t *tokens,
                             const real *table, int N, int H);
// d_out (local rows, H) -> dtable (vocab, H) += the gradient rows of this rank's tokens,
// tokens summed in order (as embedding_backward).
void vocab_embedding_backward(const VocabSlice *s, VocabScratch *w, real *dtable, const real *d_out,
                              const int32_t *tokens, int N, int H);

// logits (N, vocab) this rank's columns, targets (N) global ids -> losses (N) = lse − the
// target's logit, lse (N) = logsumexp over the whole vocabulary; statistics in double,
// summed over TP in rank order: the same bits on every rank. Collective over TP.
void vocab_cross_entropy_forward(const VocabSlice *s, real *losses, real *lse, const real *logits,
                                 const int32_t *targets, int N);
// dlogits (N, vocab) = (softmax(logits) − onehot(target) where this rank holds the target)
// · weight[n], overwritten (as cross_entropy_backward); lse from the forward. Local: no
// collective.
void vocab_cross_entropy_backward(const VocabSlice *s, VocabScratch *w, real *dlogits, const real *logits,
                                  const real *lse, const int32_t *targets, const real *weight, int N);
