// layers.h — the pieces of a decoder block, each a forward/backward pair over one
// micro-batch. Backward functions read the gradient of their output from a->d_resid
// (the residual stream) and add the gradient of their input back into it.
#pragma once
#include "model/model.h"
#include "parallel/tp_mappings.h"

// The tensor-parallel region of the model's blocks (parallel/tp_mappings.h).
TpRegion model_tp_region(const Model *m);
// tp_enter_forward (or tp_exit_backward: the same movement) of x (local rows, C) -> x_full
// (N, C) for rows that only bf16-input GEMMs read: with sequence parallelism and
// model_exchanges_bf16 they travel as bf16 (the same values for the GEMMs, half the bytes),
// through scratch (N, C), free during the call (the sp_workspace); x_full must not be scratch.
void model_tp_gather_gemm_rows(const Model *m, real *scratch, const real *x, real *x_full, int N, int C);
// The same for x and x_full stored as `store` (ops/gemm.h Storage; a norm's output, LayerActs):
// bf16 rows (C even) travel as they are stored, fp32 ones as model_tp_gather_gemm_rows moves them.
void model_tp_gather_stored(const Model *m, real *scratch, const real *x, real *x_full, Storage store, int N, int C);

// Per-token widths of attention of the whole model (every head): model/layout.h.
AttentionWidths attention_widths(const Config *c);

// Multi-Latent Attention: q, k, v from ln1; backward from d_q, d_k, d_v to a->d_norm (+=).
void mla_forward(const Model *m, int layer, LayerActs *la, const TokenLayout *tokens);
void mla_backward(Model *m, int layer, LayerActs *la, ModelActs *a);
// --recompute-modules mla_up_proj: q, k, v (and kv_b) again from the latents the forward kept.
void mla_recompute_up_projections(const Model *m, int layer, LayerActs *la, const TokenLayout *tokens);

// Causal attention of the ready q, k, v of la (or against the cache when kv) -> la->att, for
// a's tokens; with --attention-dropout in a training pass on the probabilities (model/dropout.h).
void attention_core_forward(const Model *m, int layer, LayerActs *la, const ModelActs *a, KvCache *kv);
// d_att -> d_q, d_k, d_v (overwritten)
void attention_core_backward(const Model *m, int layer, LayerActs *la, ModelActs *a);

// x_in -> x_mid = x_in + dropout(o_proj(attention(rope(qknorm(q,k)), v))),  q,k,v from RMSNorm(x_in);
// a: the pass's tokens (a->tokens) and batch (a->input: dropout, model/dropout.h)
void attention_block_forward(const Model *m, int layer, LayerActs *la, const ModelActs *a, KvCache *kv);
void attention_block_backward(Model *m, int layer, LayerActs *la, ModelActs *a);

// ln2 (N,H) -> ffn_out (N,H): dense SwiGLU
void mlp_forward(const Model *m, int layer, LayerActs *la, int N);
// d(ffn_out) (N,H) -> d_norm (N,H) overwritten
void mlp_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out);

// ln2 (N,H) -> ffn_out (N,H): router, dispatch, experts, combine, shared expert
// token_index: with context parallelism each of this rank's tokens' index in the micro-batch
// (ModelActs.token_index), else NULL.
// pass: PASS_FORWARD, or PASS_RECOMPUTE for a recomputed forward (model.h), which records
// no routing bookkeeping, routes with the counts the forward saw and has exchange scratch
// of its own.
void moe_forward(const Model *m, int layer, LayerActs *la, const Batch *batch, const int32_t *token_index,
                 PassKind pass);
// d(ffn_out) -> d_norm overwritten; router losses enter scaled by loss_scale
void moe_backward(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale);
// Each in phases, split where the token exchange is in flight (the caller may run other
// work between them; moe_forward / moe_backward are the phases in a row):
//   forward:  begin (router, the counts' exchange started) | exchange (the rows' started) |
//             experts (dispatch done, experts, combine started) | end (combine done, shared
//             expert added)
//   backward: begin (combine backward started) | experts (its rows arrived, the experts'
//             gradients, dispatch backward started) | end (the router's and shared expert's)
void moe_forward_begin(const Model *m, int layer, LayerActs *la, const Batch *batch, const int32_t *token_index,
                       PassKind pass);
void moe_forward_exchange(const Model *m, int layer, LayerActs *la);
void moe_forward_experts(const Model *m, int layer, LayerActs *la);
void moe_forward_end(const Model *m, int layer, LayerActs *la, int N);
void moe_backward_begin(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out);
void moe_backward_experts(Model *m, int layer, LayerActs *la, ModelActs *a);
void moe_backward_end(Model *m, int layer, LayerActs *la, ModelActs *a, const real *d_out, double loss_scale);

// The shared expert (model/shared_expert.c): ln2 -> la->moe.shared_out (N_local,H); d_out ->
// a->d_shared_in (and the gate's a->d_shared_gate); then _add adds those into a->d_norm.
void shared_expert_forward(const Model *m, const LayerParams *lp, LayerActs *la, int N);
void shared_expert_backward(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a, const real *d_out);
void shared_expert_backward_add(Model *m, const LayerParams *lp, LayerActs *la, ModelActs *a);
