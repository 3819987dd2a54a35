// layout.h — the layout plan of one rank: every shape the model code uses, computed once
// from the Config and the process groups (docs/architecture.md, "The layout plan").
//
// Below train/, shapes come from here, never from the Config: with tensor parallelism
// (TP) a rank holds heads/TP query heads, ffn/TP of the dense FFN, vocab/TP rows of the
// embedding and LM head; with expert tensor parallelism (ETP) I/ETP of each expert's FFN;
// with sequence parallelism (SP) the norms, residuals and router work on N/TP tokens.
//
//   column-parallel (q, k, v, gate, up, q_b, kv_b, lm_head):  W [out/TP, in] on each rank
//   row-parallel (o_proj, down):                             W [out, in/TP], outputs summed
//   vocab-parallel (embedding, lm_head):                     rows [vocab_first, +vocab)
//
// Key/value heads fewer than TP are replicated: each kv head is held by TP/kv_heads
// consecutive ranks (the kv_share group), whose gradients of it are summed.
#pragma once
#include "core/config.h"
#include "core/tensor_table.h"
#include "ops/gemm.h"
#include "parallel/comm.h"

// Per-token widths of attention on this rank: queries heads·head_dim, keys and values
// kv_heads·head_dim, the attention output heads·head_dim; with Multi-Latent Attention
// values are heads·v_head_dim and so is the output. (Local heads.)
typedef struct {
    int q, k, v, out;
} AttentionWidths;

// The process groups the model computes over (any may be a group of one).
typedef struct {
    const Comm *tp;     // dense tensor parallel
    const Comm *ep;     // expert parallel
    const Comm *etp;    // expert tensor parallel
    const Comm *etp_ep; // expert tensor x expert parallel (the exchange with ETP)
    const Comm *count;  // data-parallel ranks of one step (global aux counts, expert bias)
    const Comm *cp;     // context parallel: the ranks sharing each sequence
    const Comm *tp_cp;  // tensor x context parallel: the ranks sharing a micro-batch's tokens
    const Comm *cp_inner, *cp_outer;  // a2a+p2p: the all-to-all groups and the rings (groups.h)
    const Comm *pp;     // pipeline stages (NULL or size 1: this rank runs the whole model)
    const Comm *edp;    // expert data parallel: the ranks holding the same experts
    int described;      // the groups are descriptions (parallel_groups_describe): make no communicator
} ModelGroups;

// A model chunk: one virtual pipeline stage this rank runs (parallel/pipeline_layout.h).
typedef struct {
    int virtual_stage;            // its index among the pp·v stages
    int first_layer, layers;      // decoder layers [first_layer, first_layer + layers)
    int holds_embedding;          // virtual stage 0: the token embedding first
    int holds_head;               // the last virtual stage: final norm, LM head, loss
} StageChunk;

enum { AMAX_GROUPS = 2 };  // the groups one amax reduction runs over, one after the other

typedef struct {
    // groups
    const Comm *tp;        // size 1 without tensor parallelism
    Comm kv_share;         // the TP ranks holding this rank's kv heads (size 1 unless replicated)
    int tp_size, tp_rank;
    int etp_size, etp_rank;  // expert tensor parallel
    int sequence_parallel; // --sequence-parallel with TP > 1
    // context parallelism (CP): each sequence of T tokens cut into 2·CP chunks, this rank
    // holding chunks cp_rank and 2·CP−1−cp_rank (model/cp_batch.h): micro-batches of T/CP
    const Comm *cp, *cp_inner, *cp_outer;  // size 1 without CP; inner/outer: a2a+p2p (groups.h)
    int cp_size, cp_rank;
    CpCommType cp_comm[MT_MAX_LAYERS];     // per layer: its --cp-comm-type
    // The ranks a micro-batch's tokens are split over outside the tensor-parallel blocks
    // (sequence parallelism: TP, CP: CP, both: TP x CP), or NULL when every token is here.
    const Comm *token_group;
    // Delayed scaling's amax agreement (model/quant_layers.c), as Transformer Engine's amax
    // reduction group: a dense weight's quantizers are reduced over the tensor x context
    // parallel ranks, then the data-parallel ones; an expert's over the expert tensor
    // parallel ranks, then the expert data-parallel ones. NULL: a group of one.
    const Comm *dense_amax_groups[AMAX_GROUPS], *expert_amax_groups[AMAX_GROUPS];
    // model dimensions, global
    int hidden, layers, experts, topk;
    // multi-token prediction: its depths' transformer layers [layers, layers + mtp_layers)
    // run after the decoder's on the chunk holding the head (model/mtp.c)
    int mtp_layers;
    // --moe-router-padding-for-quantization: each expert's rows of this rank's plan rounded
    // up to a multiple of this (moe/dispatcher.h); 1 without the flag
    int expert_row_align;
    // pipeline parallelism (PP): the model chunks this rank runs, in increasing layer order
    // (chunk c is virtual stage c·pp + pp_rank); one chunk holding everything without PP
    int pp_size, pp_rank;
    int chunks;
    StageChunk *chunk;              // (chunks)
    int holds_embedding, holds_head;  // some chunk holds the embedding / the LM head
    // activation recomputation (--recompute-granularity full): per layer, the first layer of
    // its recompute group — the layer whose input the forward keeps; the group's activations
    // are recomputed from it just before the group's backward — or -1 where the layer keeps
    // all its activations. Groups never cross a chunk's end.
    int recompute_first[MT_MAX_LAYERS];
    int recompute_groups;      // groups of this rank's chunks
    int recompute_group_max;   // layers of the largest one (0 without recomputation)
    // --recompute-granularity selective: 1 << RecomputeModule of each part every layer
    // recomputes before its backward (its buffers shared by the layers: model/activations.c)
    unsigned recompute_modules;
    // attention of this rank
    int heads, heads_first;    // query heads and the first one's global index
    int kv_heads, kv_first;    // kv heads held (1 when replicated) and the first global one
    int kv_parts;              // pieces k/v projections are cut into (kv heads, or TP when more)
    int head_dim, v_head_dim;
    double softmax_scale;      // of q·k (model/rope_scaling.h: 1/sqrt(head_dim), MLA with YaRN's correction)
    AttentionWidths width;     // local widths
    int q_norm_width, k_norm_width;  // QK-norm weights held: per head d, or the local projection
    // feed-forward widths of this rank
    int ffn;         // dense SwiGLU: ffn_hidden_size / TP
    int shared_ffn;  // shared expert: moe_shared_expert_intermediate_size / TP
    int moe_ffn;     // each routed expert: moe_ffn_hidden_size / ETP
    int moe_hidden;  // the routed experts' rows (dispatch, exchange, experts, combine): the
                     // latent width with --moe-latent-size, else hidden
    // --bf16 on the cpu backend, whose GEMMs round their inputs exactly as ops.h bf16_pack does:
    // values only such GEMMs read may travel between ranks as bf16 (model.h model_exchanges_bf16;
    // MOETRON_EXCHANGE=fp32 keeps them fp32, to compare the two)
    int exchanges_bf16;
    // how every SwiGLU output (routed experts, shared expert, dense MLP) and the routed experts'
    // input rows (rows, moe_hidden) are kept (moe/experts.h): bf16 with --bf16 on the cpu backend,
    // whose GEMMs (their only readers) round them so anyway — the same bits at half the memory —
    // unless an FP8 / FP4 recipe quantizes from fp32 values; MOETRON_ACTIVATIONS=fp32 keeps them
    // fp32 (to compare the two).
    // The input rows also need an even width and bf16 exchanges (they travel as stored).
    Storage swiglu_act_store, expert_rows_store;
    // how the gate and up projections' results of every SwiGLU FFN are kept (moe/experts.h
    // ExpertActs): bf16 with --bf16 on the cpu backend, as Megatron's bf16 GEMMs return them
    // (each value rounded once from its fp32 sum; SwiGLU, forward and backward, reads those
    // values: this one changes the numerics, toward Megatron's), unless a recipe quantizes;
    // MOETRON_ACTIVATIONS=gemm-inputs keeps them fp32 (only the bf16 storage above: the bits of
    // fp32 storage), MOETRON_ACTIVATIONS=fp32 keeps every one of them fp32.
    Storage gate_up_store;
    // how the norms' outputs that only GEMMs read are kept (LayerActs.ln1_store, ln2_store): ln1
    // (the attention's projections) of every layer and ln2 of the dense layers (its FFN): bf16 as
    // swiglu_act_store is, the same bits at half the memory, with an even hidden size and bf16
    // exchanges (sequence parallelism gathers them as stored).
    Storage norm_store;
    // how a MoE layer's ln2 is kept (its router, dispatcher, shared expert and latent projection
    // read it): bf16 as gate_up_store is, as Megatron keeps it (its router upcasts the bf16 values
    // to --moe-router-dtype: the router then reads the rounded values, which changes the
    // numerics), with an even hidden size, unless --moe-input-jitter-eps (the jitter multiplies
    // fp32 values) or --moe-router-dtype fp64. Its gathers move it as kept whatever
    // MOETRON_EXCHANGE says (the same values either way: the knob changes no bits).
    Storage moe_norm_store;
    // how every layer's q, k, v are kept (LayerActs.qkv_store): bf16 as swiglu_act_store is (the
    // attention core's bf16-input GEMMs are their only readers: the same bits at half the
    // memory), with even widths and without context parallelism (its exchanges and merges take
    // fp32) or Multi-Latent Attention (which assembles them in place).
    Storage qkv_store;
    // how the attention's output is kept (LayerActs.att_store): bf16 as gate_up_store is, as
    // Megatron's bf16 attention returns it (o_proj's GEMMs round it so anyway; the backward's
    // D = rowsum(dO ⊙ O) then reads the rounded values: this one changes the numerics), without
    // context parallelism (its merges sum fp32 partial outputs).
    Storage att_store;
    // how the residual stream is kept (every decoder layer's input and x_mid, the chunk's output
    // x_final, what the pipeline's stages pass): bf16 as gate_up_store is, as Megatron keeps it
    // without --fp32-residual-connection (each sum x + branch rounded once from fp32; the norms
    // read the rounded values), with an even hidden size; fp32 with --fp32-residual-connection.
    // The multi-token prediction depths' layers keep theirs fp32 (LayerActs.resid_store).
    Storage residual_store;
    // vocabulary
    int vocab, vocab_first;  // rows of embedding / LM head held, the first one's token id
    int padded_vocab;        // all rows
} LayoutPlan;

// The plan of this rank; dies with one line naming the flags when the sizes do not divide.
// Collective over the world when TP > 1 (the kv_share group is made here).
void layout_plan_init(LayoutPlan *p, const Config *c, const ModelGroups *g);
void layout_plan_free(LayoutPlan *p);
// The plan of a model on one process (every width global).
void layout_plan_single(LayoutPlan *p, const Config *c);

// One past the last layer of a chunk.
static inline int chunk_layer_end(const StageChunk *k) { return k->first_layer + k->layers; }

// One past the last multi-token-prediction layer chunk k runs (from p->layers; none
// unless it holds the head).
static inline int chunk_mtp_end(const LayoutPlan *p, const StageChunk *k) {
    return p->layers + (k->holds_head ? p->mtp_layers : 0);
}

// The chunk of this rank that runs layer `layer` (decoder or MTP), or -1 (another stage's).
int plan_layer_chunk(const LayoutPlan *p, int layer);
static inline int plan_holds_layer(const LayoutPlan *p, int layer) { return plan_layer_chunk(p, layer) >= 0; }

// Whether layer l keeps only what its recompute group needs (model/activations.c), and
// whether it is the group's last layer (its backward comes first: the group is recomputed then).
static inline int plan_recomputed(const LayoutPlan *p, int l) { return p->recompute_first[l] >= 0; }
int plan_recompute_last(const LayoutPlan *p, int l);
static inline int plan_recomputes(const LayoutPlan *p, RecomputeModule module) {
    return (p->recompute_modules >> module) & 1;
}

// Tokens of a micro-batch of N on this rank outside the tensor-parallel matmuls: N/TP with
// sequence parallelism, else N.
static inline int plan_local_tokens(const LayoutPlan *p, int N) {
    return p->sequence_parallel ? N / p->tp_size : N;
}

// The index of this rank's first token among the micro-batch's N = N_local·TP (sequence
// parallelism splits them in rank order; without context parallelism).
static inline int plan_first_local_token(const LayoutPlan *p, int N_local) {
    return p->sequence_parallel ? p->tp_rank * N_local : 0;
}

// The global index (b·T + t in the whole micro-batch of B sequences of T = T_local·CP) of
// this rank's N_local tokens, increasing, into index (N_local); T_local the tokens of a
// sequence here. Used where work must match one process token by token (router, noise).
void plan_token_index(const LayoutPlan *p, int32_t *index, int B, int T_local);

// Shards of the tensors: cut along `axis` over TP, into `parts` pieces (kv heads), with
// partial gradients (tokens or heads split) or whole ones.
TensorShard plan_tp_shard(const LayoutPlan *p, int axis, int parts);
// A piece of a routed expert's matrix cut along `axis` over ETP.
TensorShard plan_etp_shard(const LayoutPlan *p, int axis);
// A tensor every TP rank holds whole; grad_partial when each rank sees part of the tokens
// or heads that make its gradient.
TensorShard plan_tp_replicated(const LayoutPlan *p, int grad_partial);
