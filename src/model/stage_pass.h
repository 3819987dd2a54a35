// stage_pass.h — a forward or a backward pass over one model chunk as a sequence of steps,
// each ending where a MoE layer's token exchange is in flight (model/layers.h: the phases
// of moe_forward / moe_backward). Running a pass's steps back to back is the pass
// (model_stage_forward / model_stage_backward do that); the combined 1F1B schedule
// (--overlap-moe-expert-parallel-comm, train/pipeline.c) alternates the steps of one
// micro-batch's forward and another's backward, so that each pass's exchanges travel while
// the other computes. The two passes share nothing they write: each has its activations,
// each pass kind its exchange scratch, only the backward writes gradients and only the
// forward the router's bookkeeping; so the results do not depend on the interleaving.
#pragma once
#include "model/model.h"

typedef struct {
    PassKind kind;
    Model *m;
    ModelActs *a;
    const Batch *batch;      // forward: the batch, staged into a (acts_stage_batch)
    KvCache *kv;             // forward: generation's caches (per layer), or NULL
    int pos0;
    double loss_scale;       // backward
    GradsReadyFn ready;      // backward: as model_backward_notify's (or NULL)
    void *ctx;
    int started, finished;
    int layer, phase;        // the layer in progress and its phase (0: before its MoE exchange)
    long dropped;            // forward: the chunk's dropped routing choices so far
    const real *d_ffn;       // backward: d(the layer's FFN output), a->d_resid or its dropped copy
} StagePass;

// A pass of a->chunk, not started: model_stage_forward's / model_stage_backward's contracts.
void stage_pass_forward(StagePass *s, const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0);
void stage_pass_backward(StagePass *s, Model *m, ModelActs *a, double loss_scale, GradsReadyFn ready, void *ctx);
// Runs the pass to its next token exchange in flight, or to its end; returns 1 while steps
// remain, 0 once the pass is complete.
int stage_pass_advance(StagePass *s);

// One whole transformer layer l of a forward pass (no exchange left in flight): its x_in ->
// x_out (N_local,H), its router losses counted in the pass; and its backward, a->d_resid =
// d(x_out) -> d(x_in), recomputing what it needs first. For the layers outside the chunk's
// layer sequence: multi-token prediction's (model/mtp.c).
void stage_block_forward(StagePass *s, int l, real *x_out);
void stage_block_backward(StagePass *s, int l);

// Multi-token prediction (model/mtp.c) on the chunk holding the head: its forward after the
// head's (with targets), and its backward before the head's loss backward, leaving
// d(the final norm's output) of its depth 0 in a->d_mtp_hidden.
void mtp_forward(StagePass *s);
void mtp_backward(StagePass *s);
