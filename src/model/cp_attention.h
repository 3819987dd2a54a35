// cp_attention.h — ring attention over a context-parallel group (Megatron-Core semantics).
//
// Each sequence of T tokens is cut into 2·P chunks of C = T/(2·P) tokens (P the group's
// size); group rank r holds chunks r and 2·P−1−r, back to back in each batch row of its
// tensors (local token t < C is position r·C + t, local token C + t is (2·P−1−r)·C + t).
// The K/V blocks travel around the ring (rank r sends to r+1), each rank attends its two
// query chunks to every key chunk not entirely in their future and merges the blocks'
// results with attention_merge in ring order; the next block's transfer overlaps the
// compute. Backward passes K/V around again with their dK/dV, which return to their owner.
// Deterministic: the same order of every sum on every run.
#pragma once
#include "core/config.h"
#include "ops/ops.h"
#include "parallel/comm.h"

typedef struct {
    int B, C;                   // batch rows, tokens per chunk (each rank holds 2·C per row)
    int heads, kv_heads;        // GQA as in AttentionShape
    int head_dim, v_head_dim;   // v_head_dim 0 = head_dim
    real scale;
    const int32_t *key_start;   // (B·2C) of the local queries, positions in the whole
                                // sequence (packed documents), or NULL
    DropoutMask dropout;        // attention dropout as AttentionShape's (hashed by global head
    int head_first;             // and the chunks' positions in the whole sequence)
    int bf16_kv;                // q, k and v travel as bf16 (ops.h bf16_pack: the K/V blocks of p2p
                                // and allgather, the a2a's q, k, v): --bf16 on the cpu backend,
                                // whose attention reads them only through bf16-input GEMMs, so the
                                // same bits at half the bytes
} RingAttentionShape;

// q (B, 2C, heads, d), k (B, 2C, kv_heads, d), v (B, 2C, kv_heads, dv) of this rank's chunks
// -> out (B, 2C, heads, dv), lse (B, heads, 2C) over the whole sequence's keys.
void ring_attention_forward(const Comm *cp, real *out, real *lse, const real *q, const real *k, const real *v,
                            const RingAttentionShape *s);
// Given forward's out and lse: dq, dk, dv (shapes of q, k, v) accumulate (+=) this rank's
// chunks' gradients over the whole ring.
void ring_attention_backward(const Comm *cp, real *dq, real *dk, real *dv, const real *dout, const real *out,
                             const real *lse, const real *q, const real *k, const real *v,
                             const RingAttentionShape *s);

// Where the ring's time went since the last call (this process): the blocks' compute, the
// waits for K/V shifts not finished by then (what overlap did not hide) and the backward's
// dK/dV shifts (blocking); kv_shifts counts the K/V shifts.
typedef struct {
    double compute_s, kv_wait_s, dkdv_s;
    long kv_shifts;
} CpRingTimes;
CpRingTimes cp_ring_take_times(void);

// ---- every --cp-comm-type ----------------------------------------------------------------
// p2p        the ring above
// a2a        all-to-all between sequence and heads (Ulysses): each rank attends heads/P of
//            the heads over the whole sequence, then the outputs go back (heads and kv
//            heads divisible by P)
// allgather  every rank gathers the whole sequence's K/V and attends its own queries;
//            backward sums dK/dV back to their owners
// a2a+p2p    hierarchical: a2a within the inner group (consecutive CP ranks), then the
//            ring over the outer group (--hierarchical-context-parallel-sizes inner outer)
// (CpCommType and its names are in core/config.h, with the flag.)

// The groups one attention layer uses. CP rank = outer_rank · inner_size + inner_rank.
typedef struct {
    CpCommType type;
    const Comm *cp;     // the whole context-parallel group
    const Comm *inner;  // a2a+p2p: the a2a group (a2a: cp itself)
    const Comm *outer;  // a2a+p2p: the ring (p2p: cp itself)
} CpAttention;

// a2a and a2a+p2p (model/cp_a2a.c): the all-to-all over `inner` (heads and kv heads
// divisible by its size), then the ring over `outer` (a group of one for plain a2a); the
// shapes and contract of ring_attention_forward / _backward over the whole CP group.
void a2a_attention_forward(const Comm *inner, const Comm *outer, real *out, real *lse, const real *q,
                           const real *k, const real *v, const RingAttentionShape *s);
void a2a_attention_backward(const Comm *inner, const Comm *outer, real *dq, real *dk, real *dv, const real *dout,
                            const real *out, const real *lse, const real *q, const real *k, const real *v,
                            const RingAttentionShape *s);

// As ring_attention_forward / ring_attention_backward (same shapes, layouts and +=), with
// the layer's comm type; every type gives the same results up to the order of sums.
void cp_attention_forward(const CpAttention *g, real *out, real *lse, const real *q, const real *k, const real *v,
                          const RingAttentionShape *s);
void cp_attention_backward(const CpAttention *g, real *dq, real *dk, real *dv, const real *dout, const real *out,
                           const real *lse, const real *q, const real *k, const real *v,
                           const RingAttentionShape *s);
