// activations.c — the saved activations, workspaces and staged batch of one micro-batch
// shape (B, T) as one buffer plan (core/buffer_plan.h): every buffer a spec in this rank's
// shapes (model/layout.h) — N = B·T tokens inside tensor-parallel blocks, N_local outside
// them; widths of this rank's heads and FFN slices — laid out in one allocation (one per buffer
// in the sanitizer build: core/buffer_plan.h).
#include <string.h>

#include "core/device.h"
#include "model/layers.h"
#include "moe/expert_parallel.h"

// Each declaration names its buffer by the field that receives it ("la->ln1").
#define SAVED(bp, field, rows, cols) buffer_real(bp, &(field), #field, rows, cols, BUF_SAVED)
#define SAVED_INT32(bp, field, rows, cols) buffer_int32(bp, &(field), #field, rows, cols, BUF_SAVED)
#define SAVED_DOUBLE(bp, field, rows, cols) buffer_double(bp, &(field), #field, rows, cols, BUF_SAVED)
#define WORKSPACE(bp, field, rows, cols) buffer_real(bp, &(field), #field, rows, cols, BUF_WORKSPACE)
// A buffer of real or bf16 elements (ops/gemm.h Storage), saved or a workspace.
#define STORED(bp, field, rows, cols, store, lifetime)                                  \
    ((store) == STORE_BF16 ? buffer_bf16(bp, &(field), #field, rows, cols, lifetime) \
                           : buffer_real(bp, &(field), #field, rows, cols, lifetime))
#define STORED_OR_ALIAS(bp, own, field, rows, cols, store, source) \
    ((own) ? STORED(bp, field, rows, cols, store, BUF_SAVED) : buffer_alias(bp, &(field), &(source)))
#define STAGE_IO(bp, field, rows, cols) buffer_real(bp, &(field), #field, rows, cols, BUF_STAGE_IO)
#define STAGE_IO_INT32(bp, field, rows, cols) buffer_int32(bp, &(field), #field, rows, cols, BUF_STAGE_IO)
// A saved buffer when `own`, else an alias of `source` (a stage that is off, a layout
// without sequence parallelism).
#define SAVED_OR_ALIAS(bp, own, field, rows, cols, source) \
    STORED_OR_ALIAS(bp, own, field, rows, cols, STORE_FP32, source)
#define WORKSPACE_OR_ALIAS(bp, own, field, rows, cols, source) \
    ((own) ? WORKSPACE(bp, field, rows, cols) : buffer_alias(bp, &(field), &(source)))

// Rows this rank's experts can receive from its N_local of the micro-batch's N tokens:
// N_local·k, or E·capacity when padding to capacity (decided on all N of every rank that
// shares the micro-batch: × CP with context parallelism, moe/router.h), plus the rows of
// --moe-router-padding-for-quantization.
static size_t moe_rows(const Config *c, const LayoutPlan *p, int N_local, int N) {
    if (c->moe_pad_expert_input_to_capacity)
        return dispatch_max_rows(N * p->cp_size, p->topk, p->experts, c->moe_expert_capacity_factor, 1, 1);
    return dispatch_max_rows(N_local, p->topk, p->experts, c->moe_expert_capacity_factor, 0, p->expert_row_align);
}

// Under expert parallelism the experts compute in the exchange's rows (moe/expert_parallel.h):
// the local plan's rows then need no expert activations, and with the allgather dispatcher
// (which gathers the tokens instead) no dispatched rows either.
static size_t local_expert_rows(const Model *m, size_t rows) { return m->ep.comm ? 0 : rows; }
static size_t local_dispatched_rows(const Model *m, size_t rows) {
    return m->ep.comm && m->ep.dispatcher == DISPATCH_ALLGATHER ? 0 : rows;
}

static void plan_router(BufferPlan *bp, MoeActs *ma, const LayoutPlan *p, int N, int B) {
    size_t E = p->experts, choices = (size_t)N * p->topk;
    SAVED(bp, ma->logits, N, E);
    SAVED(bp, ma->route.scores, N, E);
    SAVED(bp, ma->route.aux_scores, N, E);
    SAVED_INT32(bp, ma->route.topk_idx, choices, 1);
    SAVED(bp, ma->route.topk_probs, choices, 1);
    SAVED_INT32(bp, ma->route.kept, choices, 1);
    SAVED_INT32(bp, ma->route.tokens_per_expert, E, 1);
    SAVED_INT32(bp, ma->route.group_tokens_per_expert, E, 1);
    SAVED_INT32(bp, ma->route.aux_counts, E, 1);
    SAVED_INT32(bp, ma->route.seq_counts, B, E);  // every sequence: a rank's tokens may span them
    SAVED_DOUBLE(bp, ma->route.global_counts, E, 1);
    SAVED_DOUBLE(bp, ma->route.group_counts, E, 1);
}

// The routed experts on the N_local tokens of this rank; the shared expert on all N.
static void plan_moe(BufferPlan *bp, MoeActs *ma, ModelActs *a, const Model *m, int B, int T) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    int N_all = B * T, N = plan_local_tokens(p, N_all), H = p->hidden, I = p->moe_ffn, Hr = p->moe_hidden;
    size_t choices = (size_t)N * p->topk, rows = moe_rows(c, p, N, N_all), Is = p->shared_ffn;
    if (c->moe_input_jitter_eps > 0) {
        SAVED(bp, ma->jittered_input, N, H);
        SAVED(bp, ma->jitter, N, H);
    }
    plan_router(bp, ma, p, N, B);
    ma->plan = (DispatchPlan){.N = N, .k = p->topk, .E = p->experts, .align = p->expert_row_align};
    SAVED_INT32(bp, ma->plan.rows_per_expert, p->experts, 1);
    SAVED_INT32(bp, ma->plan.expert_offsets, p->experts + 1, 1);
    SAVED_INT32(bp, ma->plan.row_of_choice, choices, 1);
    SAVED_INT32(bp, ma->plan.token_of_row, rows, 1);
    if (Is) {
        int own_shared = !plan_recomputes(p, RECOMPUTE_SHARED_EXPERTS);
        ma->shared.gate_up_store = p->gate_up_store;
        STORED_OR_ALIAS(bp, own_shared, ma->shared.gate, N_all, Is, p->gate_up_store, a->recomputed.shared_gate);
        STORED_OR_ALIAS(bp, own_shared, ma->shared.up, N_all, Is, p->gate_up_store, a->recomputed.shared_up);
        ma->shared.act_store = p->swiglu_act_store;
        ma->shared.d_gate_up_store = p->swiglu_act_store;
        STORED_OR_ALIAS(bp, own_shared, ma->shared.act, N_all, Is, p->swiglu_act_store, a->recomputed.shared_act);
        SAVED(bp, ma->shared_gate, N, 1);
        SAVED_OR_ALIAS(bp, p->sequence_parallel, ma->shared_gate_full, N_all, 1, ma->shared_gate);
        buffer_alias(bp, &ma->shared_out, &a->shared_out);  // added to the block's output at once
    }
    if (c->moe_latent_size) {  // the rows dispatched, and the combined ones fc2 reads
        SAVED(bp, ma->latent_in, N, Hr);
        SAVED(bp, ma->latent_out, N, Hr);
    }
    size_t dispatched = local_dispatched_rows(m, rows), computed = local_expert_rows(m, rows);
    STORED(bp, ma->rows_in, dispatched, Hr, p->expert_rows_store, BUF_SAVED);
    SAVED(bp, ma->row_probs, dispatched, 1);
    ma->experts.gate_up_store = p->gate_up_store;
    STORED(bp, ma->experts.gate, computed, I, p->gate_up_store, BUF_SAVED);
    STORED(bp, ma->experts.up, computed, I, p->gate_up_store, BUF_SAVED);
    ma->experts.act_store = p->swiglu_act_store;
    ma->experts.d_gate_up_store = p->swiglu_act_store;
    STORED_OR_ALIAS(bp, !plan_recomputes(p, RECOMPUTE_MOE_ACT), ma->experts.act, computed, I, p->swiglu_act_store,
                    a->recomputed.moe_act);
    buffer_alias(bp, &ma->rows_out, &a->moe_rows_out);  // dead once combined
}

static void plan_mla(BufferPlan *bp, MlaActs *ma, ModelActs *a, const Config *c, int heads, int N, int own_up) {
    if (c->q_lora_rank) {
        SAVED(bp, ma->q_a, N, c->q_lora_rank);
        SAVED(bp, ma->q_a_norm, N, c->q_lora_rank);
        SAVED(bp, ma->q_a_rstd, N, 1);
    }
    SAVED(bp, ma->latent, N, c->kv_lora_rank);
    SAVED(bp, ma->latent_norm, N, c->kv_lora_rank);
    SAVED(bp, ma->latent_rstd, N, 1);
    SAVED(bp, ma->k_rope, N, c->qk_pos_emb_head_dim);
    SAVED_OR_ALIAS(bp, own_up, ma->kv_b, N, (size_t)heads * (c->qk_head_dim + c->v_head_dim), a->recomputed.mla_kv_b);
}

// q, k, v as the attention reads them (stored as qkv_store) and as computed in fp32: themselves,
// or when they are stored bf16 the backward's d_q, d_k, d_v (of their shapes, and free while a
// layer's attention forward runs: a backward writes and reads them within one layer's attention
// backward, which nothing interrupts), from which the forward rounds them at once.
static void plan_qkv_stored(BufferPlan *bp, LayerActs *la, ModelActs *a, const LayoutPlan *p, int N) {
    AttentionWidths w = p->width;
    la->qkv_store = p->qkv_store;
    STORED(bp, la->q, N, w.q, la->qkv_store, BUF_SAVED);
    STORED(bp, la->k, N, w.k, la->qkv_store, BUF_SAVED);
    STORED(bp, la->v, N, w.v, la->qkv_store, BUF_SAVED);
    int kept_fp32 = la->qkv_store == STORE_FP32;
    buffer_alias(bp, &la->q_fp32, kept_fp32 ? &la->q : &a->d_q);
    buffer_alias(bp, &la->k_fp32, kept_fp32 ? &la->k : &a->d_k);
    buffer_alias(bp, &la->v_fp32, kept_fp32 ? &la->v : &a->d_v);
}

// q/k/v and the stages before them: projection -> [QK-norm] -> [clip]; a stage that is off
// aliases the next one, so the code reads every stage regardless.
static void plan_qkv(BufferPlan *bp, LayerActs *la, ModelActs *a, const Model *m, int N) {
    const Config *c = &m->cfg;
    AttentionWidths w = m->plan.width;
    if (c->multi_latent_attention) {
        // --recompute-modules mla_up_proj: MLA's q, k, v (and kv_b) are buffers every layer shares
        int own_qkv = !plan_recomputes(&m->plan, RECOMPUTE_MLA_UP_PROJ);
        la->qkv_store = STORE_FP32;  // layout.h: MLA assembles them in place
        SAVED_OR_ALIAS(bp, own_qkv, la->q, N, w.q, a->recomputed.mla_q);
        SAVED_OR_ALIAS(bp, own_qkv, la->k, N, w.k, a->recomputed.mla_k);
        SAVED_OR_ALIAS(bp, own_qkv, la->v, N, w.v, a->recomputed.mla_v);
        plan_mla(bp, &la->mla, a, c, m->plan.heads, N, own_qkv);
        return;
    }
    plan_qkv_stored(bp, la, a, &m->plan, N);
    int clip = c->clip_qkv > 0, qk_norm = c->qk_layernorm;
    SAVED_OR_ALIAS(bp, clip, la->q_normed, N, w.q, la->q_fp32);
    SAVED_OR_ALIAS(bp, clip, la->k_normed, N, w.k, la->k_fp32);
    SAVED_OR_ALIAS(bp, clip, la->v_raw, N, w.v, la->v_fp32);
    SAVED_OR_ALIAS(bp, qk_norm, la->q_raw, N, w.q, la->q_normed);
    SAVED_OR_ALIAS(bp, qk_norm, la->k_raw, N, w.k, la->k_normed);
    SAVED(bp, la->q_rstd, N, m->plan.heads);
    SAVED(bp, la->k_rstd, N, m->plan.kv_heads);
}

// Every buffer of a layer of layer l's kind (names in the scope the caller set); a's
// sp_workspace: the (N,H) row-parallel partial sums of sequence parallelism, shared by every
// layer, and a's recomputed buffers, shared by every layer for the parts it recomputes.
static void plan_layer(BufferPlan *bp, LayerActs *la, ModelActs *a, const Model *m, int l, int B, int T) {
    const LayoutPlan *p = &m->plan;
    int N = B * T, N_local = plan_local_tokens(p, N), H = p->hidden, sp = p->sequence_parallel;
    int is_moe = m->layers[l].is_moe, gathers_ln2 = sp && (!is_moe || p->shared_ffn);
    int own_norms = !plan_recomputes(p, RECOMPUTE_LAYERNORM), own_attn = !plan_recomputes(p, RECOMPUTE_CORE_ATTN);
    int own_mlp = !plan_recomputes(p, RECOMPUTE_MLP);
    real **workspace = &a->sp_workspace;
    la->resid_store = l < p->layers ? p->residual_store : STORE_FP32;  // an MTP depth's layer: fp32
    STORED(bp, la->x_in, N_local, H, la->resid_store, BUF_SAVED);
    la->ln1_store = p->norm_store;
    la->ln2_store = is_moe ? p->moe_norm_store : p->norm_store;
    STORED_OR_ALIAS(bp, own_norms, la->ln1, N_local, H, la->ln1_store, a->recomputed.ln1);
    SAVED(bp, la->ln1_rstd, N_local, 1);
    STORED_OR_ALIAS(bp, sp, la->ln1_full, N, H, la->ln1_store, la->ln1);
    plan_qkv(bp, la, a, m, N);
    la->att_store = p->att_store;
    STORED_OR_ALIAS(bp, own_attn, la->att, N, p->width.out, la->att_store, a->recomputed.att);
    SAVED_OR_ALIAS(bp, own_attn, la->lse, N, p->heads, a->recomputed.lse);
    STORED(bp, la->x_mid, N_local, H, la->resid_store, BUF_SAVED);
    // the attention's fp32 output before the residual sum: x_mid itself, or with a bf16 stream the
    // forward's ffn_out (free until the FFN)
    buffer_alias(bp, &la->attn_out, la->resid_store == STORE_FP32 ? &la->x_mid : &a->ffn_out);
    buffer_alias(bp, &la->attn_partial, sp ? workspace : &la->attn_out);
    STORED_OR_ALIAS(bp, own_norms, la->ln2, N_local, H, la->ln2_store, a->recomputed.ln2);
    SAVED(bp, la->ln2_rstd, N_local, 1);
    STORED_OR_ALIAS(bp, gathers_ln2, la->ln2_full, N, H, la->ln2_store, la->ln2);
    buffer_alias(bp, &la->ffn_out, &a->ffn_out);  // dead once added to the residual
    if (is_moe) {
        // --recompute-modules moe: the block's buffers are the shared set's (bound after allocation)
        MoeActs *moe = plan_recomputes(p, RECOMPUTE_MOE) ? &a->recomputed.moe : &la->moe;
        if (moe == &la->moe) plan_moe(bp, moe, a, m, B, T);
        buffer_alias(bp, &la->ffn_partial, sp ? workspace : &moe->shared_out);
    } else {
        la->mlp.gate_up_store = p->gate_up_store;
        STORED_OR_ALIAS(bp, own_mlp, la->mlp.gate, N, p->ffn, p->gate_up_store, a->recomputed.mlp_gate);
        STORED_OR_ALIAS(bp, own_mlp, la->mlp.up, N, p->ffn, p->gate_up_store, a->recomputed.mlp_up);
        la->mlp.act_store = p->swiglu_act_store;
        la->mlp.d_gate_up_store = p->swiglu_act_store;
        STORED_OR_ALIAS(bp, own_mlp, la->mlp.act, N, p->ffn, p->swiglu_act_store, a->recomputed.mlp_act);
        buffer_alias(bp, &la->ffn_partial, sp ? workspace : &la->ffn_out);
    }
}

// ---- recomputation -------------------------------------------------------------------------
// The layers of a recompute group (layout.h) keep only the group's input: the first layer's
// x_in is its own; every other buffer of theirs is a recompute slot's, shared by the layers
// at the same place of every group (one set per place in a group and layer kind), which the
// forward overwrites group after group and the backward refills by recomputing each group
// just before its backward.

enum { SLOT_DENSE, SLOT_MOE, SLOT_KINDS };

static LayerActs *recompute_slot(ModelActs *a, int position, int is_moe) {
    return &a->recompute_slots[position * SLOT_KINDS + (is_moe ? SLOT_MOE : SLOT_DENSE)];
}

// The slots the chunk's recomputed layers use, each planned once (its name: its place and kind).
static void plan_recompute_slots(BufferPlan *bp, ModelActs *a, const Model *m, const StageChunk *k, int B, int T) {
    const LayoutPlan *p = &m->plan;
    a->recompute_slot_count = MT_MAX(p->recompute_group_max, 1) * SLOT_KINDS;
    a->recompute_slots = mt_calloc((size_t)a->recompute_slot_count, sizeof(LayerActs));
    unsigned char *planned = mt_calloc((size_t)a->recompute_slot_count, 1);
    for (int l = k->first_layer; l < chunk_layer_end(k); l++) {
        if (!plan_recomputed(p, l)) continue;
        int position = l - p->recompute_first[l], is_moe = m->layers[l].is_moe;
        LayerActs *slot = recompute_slot(a, position, is_moe);
        if (planned[slot - a->recompute_slots]++) continue;
        buffer_plan_scope(bp, "recompute slot %d (%s): ", position, is_moe ? "moe" : "dense");
        plan_layer(bp, slot, a, m, l, B, T);
    }
    free(planned);
}

// After the allocation: each recomputed layer's buffers are its slot's (a group's first layer
// keeps its own input), and with expert parallelism its exchange state too (the rows its
// experts computed live there, outside the plan).
static void bind_recompute_slots(ModelActs *a, const Model *m, const StageChunk *k) {
    const LayoutPlan *p = &m->plan;
    if (!p->recompute_groups) return;
    a->recompute_slot_of = mt_calloc((size_t)a->num_layers, 1);
    for (int l = k->first_layer; l < chunk_layer_end(k); l++) {
        if (!plan_recomputed(p, l)) continue;
        LayerActs *la = &a->layers[l], *slot = recompute_slot(a, l - p->recompute_first[l], m->layers[l].is_moe);
        if (m->ep.comm && m->layers[l].is_moe && !slot->moe.ep) ep_layer_prepare(&slot->moe, &m->ep, p->experts);
        real *own_input = la->x_in;
        *la = *slot;
        if (l == p->recompute_first[l]) la->x_in = own_input;
        a->recompute_slot_of[l] = 1;
    }
}

// --recompute-modules moe, after the allocation: each MoE layer's block state is a copy of the
// shared one (its buffers, and with expert parallelism one exchange state); what each
// layer's forward sets on the host (its routing report, counts) stays its own.
static void bind_recomputed_moe(ModelActs *a, const Model *m, const StageChunk *k) {
    const LayoutPlan *p = &m->plan;
    if (!plan_recomputes(p, RECOMPUTE_MOE)) return;
    MoeActs *shared = &a->recomputed.moe;
    if (m->ep.comm) ep_layer_prepare(shared, &m->ep, p->experts);
    for (int l = k->first_layer; l < chunk_mtp_end(p, k); l++)
        if (plan_layer_chunk(p, l) == a->chunk && m->layers[l].is_moe) a->layers[l].moe = *shared;
}

// Selective recomputation: one set of the recomputed parts' buffers, which every layer of
// the chunk shares (each layer's forward writes them and reads them at once; each layer's
// backward recomputes them just before it reads them: model/stage_pass.c and the blocks).
static void plan_recomputed_parts(BufferPlan *bp, ModelActs *a, const Model *m, const StageChunk *k, int B, int T) {
    const LayoutPlan *p = &m->plan;
    int N = B * T, N_local = plan_local_tokens(p, N), H = p->hidden, has_dense = 0, has_moe = 0;
    for (int l = k->first_layer; l < chunk_mtp_end(p, k); l++) {
        if (l >= chunk_layer_end(k) && l < p->layers) continue;  // between the decoder's and the MTP layers
        has_moe |= m->layers[l].is_moe;
        has_dense |= !m->layers[l].is_moe;
    }
    buffer_plan_scope(bp, "%s", "recomputed: ");
    if (plan_recomputes(p, RECOMPUTE_CORE_ATTN)) {
        STORED(bp, a->recomputed.att, N, p->width.out, p->att_store, BUF_WORKSPACE);
        WORKSPACE(bp, a->recomputed.lse, N, p->heads);
    }
    if (plan_recomputes(p, RECOMPUTE_LAYERNORM)) {  // stored as the layers' (ln2: fp32 when theirs differ)
        Storage dense_ln2 = has_dense ? p->norm_store : p->moe_norm_store;
        Storage moe_ln2 = has_moe ? p->moe_norm_store : p->norm_store;
        STORED(bp, a->recomputed.ln1, N_local, H, p->norm_store, BUF_WORKSPACE);
        STORED(bp, a->recomputed.ln2, N_local, H, dense_ln2 == moe_ln2 ? moe_ln2 : STORE_FP32, BUF_WORKSPACE);
    }
    if (has_dense && plan_recomputes(p, RECOMPUTE_MLP)) {
        STORED(bp, a->recomputed.mlp_gate, N, p->ffn, p->gate_up_store, BUF_WORKSPACE);
        STORED(bp, a->recomputed.mlp_up, N, p->ffn, p->gate_up_store, BUF_WORKSPACE);
        STORED(bp, a->recomputed.mlp_act, N, p->ffn, p->swiglu_act_store, BUF_WORKSPACE);
    }
    if (has_moe && p->shared_ffn && plan_recomputes(p, RECOMPUTE_SHARED_EXPERTS)) {
        STORED(bp, a->recomputed.shared_gate, N, p->shared_ffn, p->gate_up_store, BUF_WORKSPACE);
        STORED(bp, a->recomputed.shared_up, N, p->shared_ffn, p->gate_up_store, BUF_WORKSPACE);
        STORED(bp, a->recomputed.shared_act, N, p->shared_ffn, p->swiglu_act_store, BUF_WORKSPACE);
    }
    if (m->cfg.multi_latent_attention && plan_recomputes(p, RECOMPUTE_MLA_UP_PROJ)) {
        WORKSPACE(bp, a->recomputed.mla_q, N, p->width.q);
        WORKSPACE(bp, a->recomputed.mla_k, N, p->width.k);
        WORKSPACE(bp, a->recomputed.mla_v, N, p->width.v);
        WORKSPACE(bp, a->recomputed.mla_kv_b, N, (size_t)p->heads * (m->cfg.qk_head_dim + m->cfg.v_head_dim));
    }
    if (has_moe && plan_recomputes(p, RECOMPUTE_MOE)) plan_moe(bp, &a->recomputed.moe, a, m, B, T);
    if (has_moe && plan_recomputes(p, RECOMPUTE_MOE_ACT))
        STORED(bp, a->recomputed.moe_act, local_expert_rows(m, moe_rows(&m->cfg, p, N_local, N)), p->moe_ffn,
               p->swiglu_act_store, BUF_WORKSPACE);
}

// A chunk's layers: each recomputed group's input, every other layer whole.
static void plan_layers(BufferPlan *bp, ModelActs *a, const Model *m, const StageChunk *k, int B, int T) {
    const LayoutPlan *p = &m->plan;
    int N_local = plan_local_tokens(p, B * T), H = p->hidden;
    if (p->recompute_modules) plan_recomputed_parts(bp, a, m, k, B, T);
    for (int l = k->first_layer; l < chunk_layer_end(k); l++) {
        LayerActs *la = &a->layers[l];
        buffer_plan_scope(bp, "layer %d: ", l);
        if (!plan_recomputed(p, l)) plan_layer(bp, la, a, m, l, B, T);
        else if (p->recompute_first[l] == l) STORED(bp, la->x_in, N_local, H, p->residual_store, BUF_SAVED);
    }
    for (int l = p->layers; l < chunk_mtp_end(p, k); l++) {  // never in a recompute group
        buffer_plan_scope(bp, "mtp layer %d: ", l);
        plan_layer(bp, &a->layers[l], a, m, l, B, T);
    }
    if (p->recompute_groups) plan_recompute_slots(bp, a, m, k, B, T);
    buffer_plan_scope(bp, "%s", "");
}

static void plan_mla_scratch(BufferPlan *bp, ModelActs *a, const Config *c, int heads) {
    int N = a->N;
    WORKSPACE(bp, a->d_kv_b, N, (size_t)heads * (c->qk_head_dim + c->v_head_dim));
    WORKSPACE(bp, a->d_latent_norm, N, c->kv_lora_rank);
    WORKSPACE(bp, a->d_latent, N, c->kv_lora_rank);
    WORKSPACE(bp, a->d_k_rope, N, c->qk_pos_emb_head_dim);
    if (c->q_lora_rank) {
        WORKSPACE(bp, a->d_q_a_norm, N, c->q_lora_rank);
        WORKSPACE(bp, a->d_q_a, N, c->q_lora_rank);
    }
}

// dispatched: the local plan's rows whose gradients the dispatcher needs (local_dispatched_rows)
static void plan_moe_scratch(BufferPlan *bp, ModelActs *a, const Model *m, size_t dispatched) {
    const LayoutPlan *p = &m->plan;
    int N = a->N, N_local = a->N_local, H = p->hidden, Hr = p->moe_hidden, sp = p->sequence_parallel;
    // the input rows' gradients in the forward's output rows (plan_forward_scratch: the same rows and
    // width), dead by then: a micro-batch's forward and backward never overlap in its buffers (a
    // layer's recomputed forward runs after the later layer's backward has finished with these)
    buffer_alias(bp, &a->d_rows_in, &a->moe_rows_out);
    // the local dispatcher keeps the output rows' gradients as the input rows (token_dispatcher.c)
    STORED(bp, a->d_rows_out, dispatched, Hr, m->ep.comm ? STORE_FP32 : p->expert_rows_store, BUF_WORKSPACE);
    if (m->cfg.moe_latent_size) {
        WORKSPACE(bp, a->d_latent_out, N_local, Hr);
        WORKSPACE(bp, a->d_latent_in, N_local, Hr);
    }
    WORKSPACE(bp, a->d_row_probs, dispatched, 1);
    WORKSPACE(bp, a->d_choice_probs, N_local, p->topk);
    WORKSPACE(bp, a->d_router_logits, N_local, p->experts);
    WORKSPACE(bp, a->d_router_input, N_local, H);
    WORKSPACE(bp, a->d_shared_in, N_local, H);
    buffer_alias(bp, &a->d_shared_in_full, sp ? &a->d_norm_full : &a->d_shared_in);  // free while the shared expert runs
    WORKSPACE(bp, a->d_shared_gate, N_local, 1);
    WORKSPACE_OR_ALIAS(bp, sp, a->d_shared_gate_full, N, 1, a->d_shared_gate);
}

// What a layer's forward makes and uses up before it returns, one buffer every layer writes in
// turn: the FFN's output (added to the residual at once; its backward reads none of it), the
// shared expert's (added to the FFN's output) and the experts' output rows (dead once combined:
// the routing probabilities multiply before the down projection, so the backward needs none).
static void plan_forward_scratch(BufferPlan *bp, ModelActs *a, const Model *m) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    int N = a->N, N_local = a->N_local, H = p->hidden;
    WORKSPACE(bp, a->ffn_out, N_local, H);
    if (!c->num_experts) return;
    if (p->shared_ffn) WORKSPACE(bp, a->shared_out, N_local, H);
    WORKSPACE(bp, a->moe_rows_out, local_dispatched_rows(m, moe_rows(c, p, N_local, N)), p->moe_hidden);
}

static void plan_backward_scratch(BufferPlan *bp, ModelActs *a, const Model *m, int holds_head) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    int N = a->N, N_local = a->N_local, H = p->hidden, sp = p->sequence_parallel;
    AttentionWidths w = p->width;
    // FFN scratch serves dense layers (N rows of F), experts (rows of I), shared experts (N rows of Is)
    size_t rows = c->num_experts ? moe_rows(c, p, N_local, N) : 0;
    size_t ffn_scratch = MT_MAX((size_t)N * p->ffn, local_expert_rows(m, rows) * p->moe_ffn);
    ffn_scratch = MT_MAX(ffn_scratch, (size_t)N * p->shared_ffn);
    if (holds_head) WORKSPACE(bp, a->d_token_loss, N, 1);
    buffer_real(bp, &a->d_resid, "a->d_resid", N_local, H, BUF_STAGE_IO);  // the gradient a stage hands back
    WORKSPACE(bp, a->d_norm, N_local, H);
    // --hidden-dropout: a branch's gradient is a dropped copy of d_resid (model/dropout.h)
    int dropout = c->hidden_dropout > 0;
    if (dropout) WORKSPACE(bp, a->d_branch, N_local, H);
    if (sp) WORKSPACE(bp, a->d_out_full, N, H);
    else buffer_alias(bp, &a->d_out_full, dropout ? &a->d_branch : &a->d_resid);
    WORKSPACE_OR_ALIAS(bp, sp, a->d_norm_full, N, H, a->d_norm);
    WORKSPACE(bp, a->d_att, N, w.out);
    WORKSPACE(bp, a->d_q, N, w.q);
    WORKSPACE(bp, a->d_k, N, w.k);
    WORKSPACE(bp, a->d_v, N, w.v);
    WORKSPACE(bp, a->d_q_raw, N, w.q);
    WORKSPACE(bp, a->d_k_raw, N, w.k);
    if (c->multi_latent_attention) plan_mla_scratch(bp, a, c, p->heads);
    if (holds_head) WORKSPACE(bp, a->d_logits, N, p->vocab);
    STORED(bp, a->d_gate, ffn_scratch, 1, p->swiglu_act_store, BUF_WORKSPACE);  // ExpertActs.d_gate_up_store
    STORED(bp, a->d_up, ffn_scratch, 1, p->swiglu_act_store, BUF_WORKSPACE);
    WORKSPACE(bp, a->d_act, ffn_scratch, 1);
    if (rows) plan_moe_scratch(bp, a, m, local_dispatched_rows(m, rows));
}

// The batch as the model reads it (acts_stage_batch) and what leaves the last block (the
// residual stream, stored as the plan keeps it).
static void plan_stage_io(BufferPlan *bp, ModelActs *a, const LayoutPlan *p, int holds_head) {
    STAGE_IO_INT32(bp, a->input_ids, 4, a->N);
    STAGE_IO(bp, a->input_loss_mask, a->N, 1);
    if (holds_head) STAGE_IO(bp, a->loss_weight, a->N, 1);
    STORED(bp, a->x_final, a->N_local, p->hidden, p->residual_store, BUF_STAGE_IO);
}

// A multi-token-prediction depth's buffers (model.h: MtpActs).
static void plan_mtp_depth(BufferPlan *bp, MtpActs *d, const ModelActs *a, const LayoutPlan *p) {
    int N = a->N, N_local = a->N_local, H = p->hidden;
    STAGE_IO_INT32(bp, d->tokens, N, 1);
    STAGE_IO_INT32(bp, d->targets, N, 1);
    STAGE_IO(bp, d->loss_mask, N, 1);
    SAVED(bp, d->emb, N_local, H);
    SAVED(bp, d->emb_norm, N_local, H);
    SAVED(bp, d->emb_rstd, N_local, 1);
    SAVED(bp, d->hidden_norm, N_local, H);
    SAVED(bp, d->hidden_rstd, N_local, 1);
    SAVED(bp, d->cat, N_local, 2 * H);
    SAVED(bp, d->x_out, N_local, H);
    SAVED(bp, d->out, N_local, H);
    SAVED(bp, d->out_rstd, N_local, 1);
    SAVED_OR_ALIAS(bp, p->sequence_parallel, d->out_full, N, H, d->out);
    SAVED(bp, d->logits, N, p->vocab);
    SAVED(bp, d->token_loss, N, 1);
    SAVED(bp, d->token_lse, N, 1);
    SAVED(bp, d->loss_weight, N, 1);
}

// The depths of multi-token prediction and their backward scratch (the chunk holding the head).
static void plan_mtp(BufferPlan *bp, ModelActs *a, const LayoutPlan *p) {
    int N_local = a->N_local, H = p->hidden;
    a->mtp_depths = p->mtp_layers;
    if (!a->mtp_depths) return;
    a->mtp = mt_calloc((size_t)a->mtp_depths, sizeof(MtpActs));
    a->mtp_loss = mt_calloc((size_t)a->mtp_depths, sizeof(double));
    for (int k = 0; k < a->mtp_depths; k++) {
        buffer_plan_scope(bp, "mtp depth %d: ", k);
        plan_mtp_depth(bp, &a->mtp[k], a, p);
    }
    buffer_plan_scope(bp, "%s", "");
    WORKSPACE(bp, a->d_mtp_cat, N_local, 2 * H);
    WORKSPACE(bp, a->d_mtp_emb, N_local, H);
    WORKSPACE(bp, a->d_mtp_hidden, N_local, H);
}

// The final norm, logits and per-token loss (the chunk holding the LM head).
static void plan_head(BufferPlan *bp, ModelActs *a, const LayoutPlan *p) {
    int N = a->N, N_local = a->N_local, H = p->hidden;
    a->lnf_store = p->mtp_layers ? STORE_FP32 : p->norm_store;  // MTP's first depth normalizes lnf again
    STORED(bp, a->lnf, N_local, H, a->lnf_store, BUF_SAVED);
    SAVED(bp, a->lnf_rstd, N_local, 1);
    STORED_OR_ALIAS(bp, p->sequence_parallel, a->lnf_full, N, H, a->lnf_store, a->lnf);
    SAVED(bp, a->logits, N, p->vocab);
    SAVED(bp, a->token_loss, N, 1);
    SAVED(bp, a->token_lse, N, 1);
}

void acts_describe(ModelActs *a, const Model *m, int B, int T) { acts_describe_chunk(a, m, 0, B, T); }

EpExchangeShape acts_exchange_shape(const Model *m, int B, int T) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    // the router's capacity comes from the token group's tokens (moe/router.h): B·T × CP
    int limit = dispatch_capacity(B * T * p->cp_size, p->topk, p->experts, c->moe_expert_capacity_factor);
    return (EpExchangeShape){.tokens = plan_local_tokens(p, B * T), .topk = p->topk, .align = p->expert_row_align,
                             .capacity = c->moe_pad_expert_input_to_capacity ? limit : 0, .expert_limit = limit,
                             .hidden = p->moe_hidden, .moe_ffn = p->moe_ffn,
                             .act_shared = plan_recomputes(p, RECOMPUTE_MOE_ACT), .act_store = p->swiglu_act_store,
                             .gate_up_store = p->gate_up_store};
}

double model_exchange_scratch_bytes(const Model *m, int B, int T) {
    if (!m->ep.gather) return 0;
    EpExchangeShape shape = acts_exchange_shape(m, B, T);
    const LayoutPlan *p = &m->plan;
    int recomputes_moe = p->recompute_groups || plan_recomputes(p, RECOMPUTE_MOE);  // a recompute pass exchanges
    return ep_buffers_bytes(&m->ep, &shape, 0) * (recomputes_moe ? 2 : 1) + ep_buffers_bytes(&m->ep, &shape, 1);
}

// The exchange states the chunk's MoE layers hold (moe/expert_parallel.h): one each, but the
// recomputed layers share one per recompute slot (bind_recompute_slots) and with selective
// moe recomputation all share one (bind_recomputed_moe).
static int exchange_states(const Model *m, const StageChunk *k) {
    const LayoutPlan *p = &m->plan;
    int states = 0, slots = MT_MAX(p->recompute_group_max, 1);
    unsigned char *slot_seen = mt_calloc((size_t)slots, 1);
    for (int l = k->first_layer; l < chunk_mtp_end(p, k); l++) {
        if (!m->layers[l].is_moe || plan_layer_chunk(p, l) != k - p->chunk) continue;
        if (plan_recomputes(p, RECOMPUTE_MOE)) states = 1;
        else if (!plan_recomputed(p, l)) states++;
        else if (!slot_seen[l - p->recompute_first[l]]++) states++;
    }
    free(slot_seen);
    return states;
}

void acts_describe_chunk(ModelActs *a, const Model *m, int chunk, int B, int T) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    const StageChunk *k = &p->chunk[chunk];
    memset(a, 0, sizeof(*a));
    a->chunk = chunk;
    BufferPlan *bp = &a->buffers;
    buffer_plan_init(bp);
    a->B = B;
    a->T = T;
    a->N = B * T;
    a->N_local = plan_local_tokens(p, a->N);
    a->capacity_tokens = a->N;
    a->num_layers = config_all_layers(c);
    int N = a->N, N_local = a->N_local, H = p->hidden, sp = p->sequence_parallel;
    if (sp) buffer_real(bp, &a->sp_workspace, "row-parallel partial sums", N, H, BUF_WORKSPACE);
    a->layers = mt_calloc((size_t)a->num_layers, sizeof(LayerActs));
    plan_layers(bp, a, m, k, B, T);
    plan_stage_io(bp, a, p, k->holds_head);
    buffer_alias(bp, &a->x_entry, k->layers ? &a->layers[k->first_layer].x_in : &a->x_final);
    if (p->cp_size > 1) SAVED_INT32(bp, a->token_index, N_local, 1);
    if (k->holds_head) plan_head(bp, a, p);
    if (k->holds_head) plan_mtp(bp, a, p);
    plan_forward_scratch(bp, a, m);
    plan_backward_scratch(bp, a, m, k->holds_head);
    if (p->tp_size > 1 && (k->holds_embedding || k->holds_head))  // the vocab-parallel embedding's and loss's
        vocab_scratch_plan(bp, &a->vocab_scratch, N, H);
    buffer_plan_layout(bp);
    if (m->ep.comm) {
        EpExchangeShape shape = acts_exchange_shape(m, B, T);
        a->exchange_bytes = exchange_states(m, k) * ep_layer_bytes(&m->ep, &shape);
    }
}

void acts_alloc(ModelActs *a, const Model *m, int B, int T) { acts_alloc_chunk(a, m, 0, B, T); }

void acts_alloc_chunk(ModelActs *a, const Model *m, int chunk, int B, int T) {
    acts_describe_chunk(a, m, chunk, B, T);
    buffer_plan_allocate(&a->buffers);
    bind_recompute_slots(a, m, &m->plan.chunk[chunk]);
    bind_recomputed_moe(a, m, &m->plan.chunk[chunk]);
}

// Copies `count` items of src (when given) into dst and returns dst, or NULL without src.
static const void *staged(void *dst, const void *src, size_t count, size_t size) {
    if (!src) return NULL;
    device_upload(dst, src, count * size);
    return dst;
}

// Multi-token prediction's inputs (mtp_roll_inputs): the batch's own (a context-parallel
// rank's, rolled before slicing), or rolled here from the batch.
static void stage_mtp_inputs(ModelActs *a, const Batch *batch) {
    size_t n = (size_t)batch->B * batch->T, all = n * a->mtp_depths;
    int32_t *tokens = NULL, *targets = NULL;
    real *mask = NULL;
    if (!batch->mtp_tokens) {
        tokens = mt_malloc(all * sizeof(int32_t)), targets = mt_malloc(all * sizeof(int32_t));
        mask = mt_malloc(all * sizeof(real));
        mtp_roll_inputs(batch, a->mtp_depths, tokens, targets, mask);
    }
    for (int k = 0; k < a->mtp_depths; k++) {
        size_t at = (size_t)k * n;
        device_upload(a->mtp[k].tokens, (tokens ? tokens : batch->mtp_tokens) + at, n * sizeof(int32_t));
        device_upload(a->mtp[k].targets, (targets ? targets : batch->mtp_targets) + at, n * sizeof(int32_t));
        device_upload(a->mtp[k].loss_mask, (mask ? mask : batch->mtp_loss_mask) + at, n * sizeof(real));
    }
    free(tokens);
    free(targets);
    free(mask);
}

const Batch *acts_stage_batch(ModelActs *a, const Batch *batch) {
    size_t n = (size_t)batch->B * batch->T, cap = (size_t)a->capacity_tokens;
    MT_ASSERT(n <= cap);
    a->input = *batch;
    a->input.tokens = staged(a->input_ids, batch->tokens, n, sizeof(int32_t));
    a->input.targets = staged(a->input_ids + cap, batch->targets, n, sizeof(int32_t));
    a->input.positions = staged(a->input_ids + 2 * cap, batch->positions, n, sizeof(int32_t));
    a->input.key_start = staged(a->input_ids + 3 * cap, batch->key_start, n, sizeof(int32_t));
    a->input.loss_mask = staged(a->input_loss_mask, batch->loss_mask, n, sizeof(real));
    if (batch->targets && a->mtp_depths) stage_mtp_inputs(a, batch);
    return &a->input;
}

void acts_free(ModelActs *a) {
    for (int l = 0; l < a->num_layers; l++) {
        int shares_ep = (a->recompute_slot_of && a->recompute_slot_of[l]) || a->layers[l].moe.ep == a->recomputed.moe.ep;
        if (shares_ep) a->layers[l].moe.ep = NULL;  // a slot's or the shared block's, freed below
        ep_layer_free(&a->layers[l].moe);
        dispatch_plan_free(&a->layers[l].moe.plan);
        free(a->layers[l].moe.route.report);  // host memory: the router's downloaded report
        free(a->layers[l].moe.counts_before);
    }
    for (int s = 0; s < a->recompute_slot_count; s++) ep_layer_free(&a->recompute_slots[s].moe);
    ep_layer_free(&a->recomputed.moe);
    free(a->layers);
    free(a->mtp);
    free(a->mtp_loss);
    free(a->recompute_slots);
    free(a->recompute_slot_of);
    buffer_plan_free(&a->buffers);
    memset(a, 0, sizeof(*a));
}
