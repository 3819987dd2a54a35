// model.h — the decoder-only MoE transformer: parameters, activations, forward, backward.
//
//   tokens → embedding → [ block × L ] → final RMSNorm → LM head → cross-entropy
//   block:  x ← x + attention(RMSNorm(x));  x ← x + ffn(RMSNorm(x))
//           ffn = dense SwiGLU, or MoE (router → dispatch → SwiGLU experts → combine)
//
// A forward over one micro-batch saves what backward needs in a ModelActs; backward
// accumulates parameter gradients into the tensor table. Tokens are flattened b·T + t.
#pragma once
#include "core/buffer_plan.h"
#include "core/config.h"
#include "core/tensor_table.h"
#include "hf/hf_family.h"
#include "model/layout.h"
#include "model/vocab_parallel.h"
#include "moe/expert_parallel.h"
#include "moe/moe_acts.h"
#include "moe/router.h"
#include "ops/ops.h"
#include "parallel/comm.h"

// The kinds of pass over a model chunk: PASS_RECOMPUTE is a forward run again just before a
// recompute group's backward (--recompute-granularity full), which counts nothing the
// forward counted.
typedef enum { PASS_FORWARD, PASS_BACKWARD, PASS_RECOMPUTE, PASS_KINDS } PassKind;

typedef struct {
    TensorId input_norm, q_proj, k_proj, v_proj, o_proj;  // q_proj -1 with MLA and --q-lora-rank; k/v -1 with MLA
    TensorId q_norm, k_norm;           // -1 without --qk-layernorm (per head, or whole projection)
    // Multi-Latent Attention (-1 without it): q_a/q_a_norm/q_b with --q-lora-rank, else q_proj
    TensorId q_a_proj, q_a_norm, q_b_proj;  // [rq,H], [rq], [heads·(dn+dr), rq]
    TensorId kv_a_proj, kv_a_norm, kv_b_proj;  // [rkv+dr, H], [rkv], [heads·(dn+dv), rkv]
    TensorId post_attn_norm;
    int is_moe;
    TensorId mlp_gate, mlp_up, mlp_down;  // dense layers
    TensorId router;                      // MoE layers
    TensorId expert_bias;                 // (E) with --moe-router-enable-expert-bias, else -1
    TensorId qb_bias;                     // (E) quantile balancing's bias (moe/router.h), else -1
    TensorId *expert_gate, *expert_up, *expert_down;  // (local experts) each: this process's experts
    TensorId shared_gate, shared_up, shared_down;     // shared expert, or -1
    TensorId shared_expert_gate;                      // [1,H] with --moe-shared-expert-gate, or -1
    TensorId fc1_latent_proj, fc2_latent_proj;        // [L,H], [H,L] with --moe-latent-size, or -1
    ExpertWeights shared_params, shared_grads;        // the shared expert as one group
    // The FFN's SwiGLU weights as per-group pointers (1 group for a dense layer, one per
    // expert for MoE), into the parameters and into the gradients; set by model_build.
    ExpertWeights ffn_params, ffn_grads;
} LayerParams;

// A multi-token-prediction depth's own tensors (model/mtp.c); its transformer layer is
// layers[num_layers + depth], like any other.
typedef struct {
    TensorId enorm, hnorm;  // [H] each: the next token's embedding, the previous depth's hidden state
    TensorId eh_proj;       // [H, 2H] of [enorm(embedding), hnorm(hidden)], whole on every TP rank
    TensorId final_norm;    // [H] before the shared LM head
} MtpParams;

typedef struct {
    Config cfg;
    HfFamily family;
    LayoutPlan plan;                      // this rank's shapes (model/layout.h)
    ExpertParallel ep;
    const Comm *count_group;              // global_aux_loss counts are summed over it (NULL: here)
    char family_note[256];                // why the family is HF_MOETRON, else ""
    RouterConfig router;                  // the router settings of every MoE layer
    RouterState *router_state;            // (all layers), mutable during training forwards
    TensorTable tt;
    TensorId embed, final_norm, lm_head;  // lm_head == embed when tied; -1 on a stage without them
    TensorId embed_copy;                  // a last pipeline stage's copy of the first stage's embedding: the
                                          // tied LM head, or the multi-token-prediction depths' table; else -1
    LayerParams *layers;                  // (num_layers + mtp_num_layers) by global index; the plan's
                                          // stage layers built
    MtpParams *mtp;                       // (mtp_num_layers) on the stage holding the head, else NULL
    real *rope_cos_sin;                   // (max_positions, head_dim/2, 2)
    char (*remote_names)[MT_NAME_MAX];    // (n_remote) tensors other expert-parallel ranks hold
    int n_remote;
    struct EpBuffers *ep_buffers[PASS_KINDS];  // scratch of the token exchange (expert parallel only),
                                               // one per pass kind: a forward and a backward may overlap
    struct QuantContext *quant;           // --fp8-format / --fp4-format (ops/quantized_linear.h), else NULL
    struct QuantLinear **quant_of;        // (tt.count) each weight's quantizers; NULL: not quantized
    uint8_t *quant_of_expert;             // (linears of quant) 1: quantizers of a routed expert's weight
    struct RoutingTrace *routing_trace;   // --moe-routing-trace-path (moe/routing_trace.h), else NULL
} Model;

// ---- one micro-batch ------------------------------------------------------------------
typedef struct {
    int B, T;
    const int32_t *tokens;   // (B·T)
    const int32_t *targets;  // (B·T) next-token labels; NULL in generation
    const real *loss_mask;   // (B·T) 1 = counts toward the loss; NULL = all count
    const int32_t *positions;  // (B·T) RoPE positions (--reset-position-ids); NULL = t
    const int32_t *key_start;  // (B·T) first key of the row each token sees (--reset-attention-mask); NULL = 0
    int training;            // router input jitter, global-aux and expert-bias bookkeeping
    uint64_t noise_seed;     // seeds jitter / forced-balance noise of this micro-batch
    long iteration;          // training: the step, and the global sample the micro-batch
    int64_t first_sample;    // starts at (the routing trace's key: moe/routing_trace.h)
    // Multi-token prediction's inputs when the batch is a context-parallel rank's slice
    // (model/cp_batch.h): (depths, B·T) each, rolled along the whole sequences before the
    // slicing (mtp_roll_inputs); NULL: the model rolls tokens, targets and loss_mask itself.
    const int32_t *mtp_tokens, *mtp_targets;
    const real *mtp_loss_mask;
} Batch;

// Multi-Latent Attention activations (per layer). rq, rkv: ranks; dn, dr, dv: no-position,
// rotary and value widths per head; dq = dn + dr.
typedef struct {
    real *q_a, *q_a_norm, *q_a_rstd;  // (N,rq), (N,rq), (N) with --q-lora-rank
    real *latent;                     // (N,rkv) compressed keys/values
    real *latent_norm, *latent_rstd;  // (N,rkv), (N)
    real *k_rope;                     // (N,dr) the shared rotary key, after RoPE
    real *kv_b;                       // (N, heads·(dn+dv)) per head [k no-position part, v]
} MlaActs;

// A multi-token-prediction depth k's activations (model/mtp.c): its inputs rolled k+1
// tokens left along each sequence, the two norms and their projection (the input of its
// transformer layer, layers[num_layers + k].x_in), the final norm and its loss.
typedef struct {
    int32_t *tokens, *targets;  // (N) the tokens k+1 ahead (0 past a sequence's end) and their labels
    real *loss_mask;            // (N) the labels' mask, 0 past a sequence's end
    real *emb;                  // (N_local,H) embedding of tokens
    real *emb_norm, *emb_rstd;  // (N_local,H), (N_local)
    real *hidden_norm, *hidden_rstd;  // of the previous depth's output (depth 0: the final norm's)
    real *cat;                  // (N_local,2H) [emb_norm, hidden_norm]
    real *x_out;                // (N_local,H) the transformer layer's output
    real *out, *out_rstd;       // (N_local,H), (N_local) after the depth's final norm
    real *out_full;             // (N,H) out of every token: gathered with sequence parallelism, else out
    real *logits;               // (N,V/TP)
    real *token_loss, *token_lse, *loss_weight;  // (N)
} MtpActs;

typedef struct {
    // N: the micro-batch's tokens; N_local: this rank's (N/TP with sequence parallelism, else N)
    real *x_in;                   // (N_local,H) block input (the residual stream), stored as resid_store
    Storage resid_store;          // how x_in, x_mid and the layer's output are stored (layout.h
                                  // residual_store; fp32 in the multi-token prediction depths)
    real *ln1, *ln1_rstd;         // (N_local,H), (N_local)
    real *ln1_full;               // (N,H) ln1 of every token: gathered with sequence parallelism, else ln1
    Storage ln1_store, ln2_store;  // how ln1 / ln1_full and ln2 / ln2_full are stored (layout.h norm_store)
    real *q, *k, *v;              // (N,q_width), (N,k_width), (N,v_width): as attention sees them,
                                  // stored as qkv_store (layout.h)
    Storage qkv_store, att_store;  // how q, k, v and att are stored (layout.h)
    real *q_fp32, *k_fp32, *v_fp32;  // q, k, v as computed (RoPE applied): q, k, v themselves when
                                     // stored fp32, else ModelActs' d_q, d_k, d_v (workspaces free
                                     // outside a layer's attention backward), rounded into them
    real *q_raw, *k_raw, *v_raw;  // projections (aliases of the next stage when it is off)
    real *q_normed, *k_normed;    // after QK-norm, before --clip-qkv (aliases when off)
    real *q_rstd, *k_rstd;        // (N·heads), (N·kv_heads): per head, or (N) per projection
    MlaActs mla;                  // with --multi-latent-attention
    real *att, *lse;              // (N,v_width) stored as att_store, (B,heads,T)
    real *x_mid;                  // (N_local,H) after the attention residual, stored as resid_store
    real *attn_out;               // (N_local,H) the attention's output summed over TP, fp32: x_mid
                                  // itself when the stream is fp32, else the forward's ffn_out
    real *ln2, *ln2_rstd;         // (N_local,H), (N_local)
    real *ln2_full;               // (N,H) ln2 of every token (dense FFN, shared expert), or ln2
    // (N,H) workspaces of sequence parallelism: a row-parallel output before its sum
    real *attn_partial;           // o_proj's (or x_mid)
    real *ffn_partial;            // the dense FFN's or the shared expert's (or ffn_out, shared_out)
    ExpertActs mlp;               // dense layers: (N,F/TP) each
    MoeActs moe;                  // MoE layers: on the N_local tokens
    real *ffn_out;                // (N_local,H)
} LayerActs;

// Per-layer key/value cache for generation (batch 1).
typedef struct {
    real *k, *v;   // (capacity, k_width), (capacity, v_width): keys after RoPE, values
    int capacity;  // positions (--max-position-embeddings)
    int k_width, v_width;
} KvCache;

// One cache per layer, sized for the model's attention; freed with kv_caches_free.
KvCache *kv_caches_new(const Model *m);
void kv_caches_free(KvCache *kv, const Model *m);

typedef struct {
    int num_layers;
    int chunk;              // the model chunk (LayoutPlan.chunk) these activations are for
    int B, T, N;            // shape of the last forward
    int N_local;            // tokens this rank holds outside tensor-parallel blocks (layout.h)
    TokenLayout tokens;     // positions and visible keys of the last forward's tokens
    int32_t *token_index;   // (N_local) with context parallelism: each token's index in the
                            // whole micro-batch (plan_token_index), else unused
    int capacity_tokens;    // B·T the buffers were allocated for
    Batch input;            // the last forward's batch, its arrays copied into tensor memory
    int32_t *input_ids;     // (4, capacity_tokens) tokens, targets, positions, key_start of input
    real *input_loss_mask;  // (capacity_tokens)
    BufferPlan buffers;     // every buffer below as a spec, in one allocation (model/activations.c)
    double exchange_bytes;  // with expert parallelism, the MoE layers' exchange state outside the plan
                            // (moe/expert_parallel.h, at its bound: ep_layer_bytes per state)
    LayerActs *layers;      // (num_layers + MTP layers), host memory; the plan's stage layers laid out
    MtpActs *mtp;           // (MTP depths) on the chunk holding the head (mtp_depths of them), else NULL
    int mtp_depths;
    // --recompute-granularity selective: the buffers every layer shares for the parts it
    // recomputes (model/activations.c), each (when that part is recomputed) sized as one layer's
    struct {
        real *att, *lse;                               // core_attn
        real *ln1, *ln2;                               // layernorm
        real *mlp_gate, *mlp_up, *mlp_act;             // mlp
        real *shared_gate, *shared_up, *shared_act;    // shared_experts
        real *moe_act;                                 // moe_act
        real *mla_q, *mla_k, *mla_v, *mla_kv_b;        // mla_up_proj
        MoeActs moe;                                   // moe: every MoE layer's block buffers
    } recomputed;
    LayerActs *recompute_slots;  // the recompute groups' shared layer buffers (model/activations.c), or NULL
    int recompute_slot_count;
    unsigned char *recompute_slot_of;  // (num_layers) 1 where a layer's buffers are a slot's (allocated), or NULL
    real *sp_workspace;     // (N,H) sequence parallelism: every layer's row-parallel partial sums
    // what every layer's forward makes and uses up before it returns, one buffer for all
    // (model/activations.c plan_forward_scratch): the layers' ffn_out, shared_out and rows_out
    real *ffn_out;          // (N_local,H) the FFN's output, added to the residual at once
    real *shared_out;       // (N_local,H) the shared expert's, added to the FFN's output
    real *moe_rows_out;     // (rows,moe_hidden) the experts' output rows, read by the combine alone
    real *x_entry;          // (N_local,H) input of the chunk's first block (x_final without blocks):
                            // the embedding's output, or what the previous pipeline stage sent
    real *x_final;          // (N_local,H) output of the last block
    real *lnf, *lnf_rstd;   // (N_local,H), (N_local)
    real *lnf_full;         // (N,H) lnf of every token (gathered with sequence parallelism), or lnf
    Storage lnf_store;      // how lnf and lnf_full are stored: LayoutPlan.norm_store when only the
                            // LM head's GEMMs read them (no multi-token prediction), else fp32
    real *logits;           // (N,V/TP) this rank's vocabulary slice
    real *token_loss;       // (N)
    real *token_lse;        // (N) logsumexp of each token's logits (for backward)
    real *loss_weight;      // (N) d(loss)/d(token_loss) of this micro-batch
    // backward scratch, shared by all layers
    VocabScratch vocab_scratch;  // the vocab-parallel embedding's (tensor parallelism only)
    real *d_token_loss;     // (N)
    real *d_resid, *d_norm;  // (N_local,H)
    real *d_branch;          // (N_local,H) with --hidden-dropout: d_resid dropped (a branch's gradient)
    real *d_out_full;        // (N,H) d_resid of every token entering a row-parallel backward (or d_resid)
    real *d_norm_full;       // (N,H) this rank's part of d_norm before its sum over TP (or d_norm)
    real *d_att, *d_q, *d_k, *d_v, *d_q_raw, *d_k_raw, *d_logits;
    // Multi-Latent Attention: (N,heads·(dn+dv)), (N,rkv) ×2, (N,dr), (N,rq) ×2
    real *d_kv_b, *d_latent_norm, *d_latent, *d_k_rope, *d_q_a_norm, *d_q_a;
    real *d_rows_in, *d_rows_out, *d_row_probs, *d_choice_probs, *d_router_logits, *d_router_input;
    real *d_latent_out;     // (N_local,L) latent MoE: the gradient of the combined rows (fc2's input)
    real *d_latent_in;      // (N_local,L) latent MoE: the gradient of the dispatched rows (fc1's output)
    real *d_shared_in;      // (N_local,H) shared expert input gradient
    real *d_shared_in_full; // (N,H) this rank's part of it before the sum over TP (or d_shared_in)
    real *d_shared_gate;    // (N_local)
    real *d_shared_gate_full;  // (N) this rank's part before the sum over TP (or d_shared_gate)
    real *d_gate, *d_up, *d_act;
    // multi-token prediction: (N_local,2H) d(cat); (N_local,H) d(emb); d(hidden) handed to the
    // previous depth (depth 0: to the final norm's output)
    real *d_mtp_cat, *d_mtp_emb, *d_mtp_hidden;
    // results of the last forward
    double lm_loss;         // mean masked cross-entropy
    double balance_loss[3]; // per BalanceType: mean over MoE layers of L / coeff
    double z_loss;          // mean over MoE layers of L_z / coeff
    double dropped_frac;    // dropped choices / all choices, over MoE layers
    double aux_objective;   // Σ over MoE layers of the router losses with coefficients
    double *mtp_loss;       // (mtp_depths) each depth's mean masked cross-entropy (with targets)
    double mtp_objective;   // their sum times --mtp-loss-scaling-factor / depths
} ModelActs;

// Multi-token prediction's inputs of a batch with targets: depth k's tokens, labels and loss
// mask, each (depths, B·T), rolled k+1 positions left along each sequence with token 0 and
// mask 0 past its end, as Megatron-Core rolls them (model/mtp.c).
void mtp_roll_inputs(const Batch *b, int depths, int32_t *tokens, int32_t *targets, real *loss_mask);

// The router settings a validated Config describes.
RouterConfig model_router_config(const Config *c);

// Describe every tensor (HF names of the chosen family) and allocate the table.
void model_build(Model *m, const Config *cfg);
// The same for one rank of a parallel run (groups NULL: model_build): the table holds this
// rank's experts and this rank's pieces of the tensor-parallel tensors, under their global
// names; shapes come from the rank's layout plan (m->plan).
void model_build_on(Model *m, const Config *cfg, const ModelGroups *groups);
// model_build_on in two halves: describe every tensor and lay out the flat buffers (sizes
// known, nothing large allocated: what a memory estimate needs), then allocate them.
// Collective over the world when the groups have tensor parallelism.
void model_describe(Model *m, const Config *cfg, const ModelGroups *groups);
void model_allocate(Model *m);
// Megatron-Core init: normal(0, std) matrices, std/sqrt(2L) for output projections, ones for norms.
void model_init_weights(Model *m, uint64_t seed);
void model_free(Model *m);
// The FP8 / FP4 recipe's quantizers of the weights it quantizes (model/quant_layers.c):
// made by model_allocate, freed by model_free; model_quant(m, id) is weight id's, or NULL
// (the plain GEMM) when the recipe is off or leaves it in high precision.
void model_quant_init(Model *m);
void model_quant_free(Model *m);
struct QuantLinear *model_quant(const Model *m, TensorId id);
// Delayed scaling, at the end of a step before the new scales: each quantizer's amax of the
// step becomes the maximum over the ranks holding copies or shards of its weight (the
// plan's amax groups), so every rank derives the same scales as one process would.
void model_quant_reduce_amaxes(Model *m);
// The whole model's parameters, and those one token uses (the shared ones and k of E
// experts'), from the one-process layout's table (no allocation; any rank the same).
void model_parameter_counts(const Config *c, double *all, double *active);

// The activations of micro-batches of B × T tokens: acts_describe declares and lays out
// every buffer (a->buffers.bytes is what they take; nothing large is allocated),
// acts_alloc also allocates them. acts_free ends either. The _chunk forms are for one model
// chunk of a pipeline rank (its layers only, the head's buffers only where it is); the plain
// ones for chunk 0.
void acts_describe(ModelActs *a, const Model *m, int B, int T);
void acts_alloc(ModelActs *a, const Model *m, int B, int T);
void acts_describe_chunk(ModelActs *a, const Model *m, int chunk, int B, int T);
void acts_alloc_chunk(ModelActs *a, const Model *m, int chunk, int B, int T);
void acts_free(ModelActs *a);
// The expert-parallel exchange of micro-batches of B × T tokens (moe/expert_parallel.h), and the
// bytes of the exchange scratch the model's passes share (ep_buffers_bytes of each; 0 without it).
EpExchangeShape acts_exchange_shape(const Model *m, int B, int T);
double model_exchange_scratch_bytes(const Model *m, int B, int T);
// Copies the batch's arrays into the activations' tensor memory (core/device.h), so ops
// can read them whatever memory the caller's batch is in; returns that copy (a->input).
const Batch *acts_stage_batch(ModelActs *a, const Batch *batch);

// The forward of one model chunk (a->chunk) over one micro-batch: from the tokens when the
// chunk holds the embedding, else from a->x_entry (the previous stage's output, put there by
// the caller); to the loss (a->lm_loss, with targets) when it holds the head, else to
// a->x_final. The router losses of a->balance_loss, z_loss, dropped_frac are the chunk's
// shares of the means over every MoE layer of the model; aux_objective its layers' sum.
void model_stage_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0);
// Its backward: from the loss when the chunk holds the head, else from a->d_resid (the next
// stage's gradient of x_final, put there by the caller); leaves d(x_entry) in a->d_resid
// when it does not hold the embedding. ready as model_backward_notify's.
typedef void (*GradsReadyFn)(void *ctx, int part);
void model_stage_backward(Model *m, ModelActs *a, double loss_scale, GradsReadyFn ready, void *ctx);
// MoE layers of the whole model.
int model_moe_layers(const Config *c);
// Whether values that only bf16-input GEMMs read may travel between ranks as bf16 (ops.h
// bf16_pack; the experts' rows, context parallelism's K/V blocks): --bf16 on the cpu backend,
// whose GEMMs round their inputs exactly as the packing does, so the results are the same
// bits. MOETRON_EXCHANGE=fp32 keeps them fp32 (to compare the two).
int model_exchanges_bf16(const Model *m);
// Which of those do: the experts' rows (both dispatchers; not under an FP8 / FP4 recipe, whose
// quantizers read the fp32 values; rows of an even width), and sequence parallelism's
// all-gathers of rows only GEMMs read (the same conditions; model_tp_gather_gemm_rows).
int model_expert_rows_bf16(const Model *m);
int model_tp_gathers_bf16(const Model *m);

// Forward one micro-batch through the whole model (one chunk holding it all). With batch->targets: returns the lm loss and sets a->lm_loss,
// a->aux_loss. kv (per layer, or NULL) switches to cached generation: the B·T tokens sit
// at positions pos0.. and attend to the cache.
double model_forward(const Model *m, ModelActs *a, const Batch *batch, KvCache *kv, int pos0);
// Backward of the last forward; loss_scale multiplies the whole objective (1/micro-batches).
void model_backward(Model *m, ModelActs *a, const Batch *batch, double loss_scale);

// Parts of the parameters whose gradients become final, in the order backward finishes
// them: the head (final norm and, untied, lm_head), each layer from the last, then the
// embedding (with the tied LM head).
typedef enum { GRADS_HEAD = -1, GRADS_EMBEDDING = -2 } GradsPart;  // or a layer index
// model_backward, calling ready(ctx, part) as each part's gradients are complete.
void model_backward_notify(Model *m, ModelActs *a, const Batch *batch, double loss_scale, GradsReadyFn ready,
                           void *ctx);
// The element ranges of a part in the flat parameters: its dense tensors and its experts
// (empty for parts without experts).
typedef struct {
    int64_t begin, end;
} ElemRange;
void model_grads_part_ranges(const Model *m, int part, ElemRange *dense, ElemRange *experts);
// Whether tensor id belongs to a part (GRADS_HEAD: final norm and LM head, the tied copy
// included; GRADS_EMBEDDING: the embedding; else the layer's).
int model_part_has_tensor(const Model *m, int part, TensorId id);

// Tensor parallelism: sum over their holders the gradients each TP rank computes only part
// of (TensorShard.grad_partial) in one part, or in all (model/tp_grads.c). Before the
// data-parallel sums.
void model_sum_partial_grads(Model *m, int part);
void model_sum_all_partial_grads(Model *m);

// --moe-use-upcycling with granularity G > 1, after the weights are in: each router keeps
// its first E/G rows (as initialised), each repeated for G consecutive experts (the slices of
// one copy of the dense MLP), as Megatron-Core's upcycling sets the router.
void model_upcycle_routers(Model *m);

// Start a new global batch: apply the expert-bias update from the counts of the one
// that ended (when enabled and apply_bias_update: not for a skipped step) and clear the
// router bookkeeping.
void model_end_global_batch(Model *m, int apply_bias_update);

// Model FLOPs of one training step per token (forward + backward), see docs/metrics.md.
double model_train_flops_per_token(const Config *cfg);
