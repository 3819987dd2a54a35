// activations.c — allocation of the saved activations and backward scratch of one
// micro-batch shape (B, T), in this rank's shapes (model/layout.h): N = B·T tokens inside
// tensor-parallel blocks, N_local outside them; widths of this rank's heads and FFN slices.
#include <string.h>

#include "model/layers.h"
#include "moe/expert_parallel.h"

// Rows this rank's experts can receive from its N_local of the micro-batch's N tokens:
// N_local·k, or E·capacity when padding to capacity (decided on all N: moe/router.h).
static size_t moe_rows(const Config *c, int N_local, int N) {
    if (c->moe_pad_expert_input_to_capacity)
        return dispatch_max_rows(N, c->moe_router_topk, c->num_experts, c->moe_expert_capacity_factor, 1);
    return dispatch_max_rows(N_local, c->moe_router_topk, c->num_experts, c->moe_expert_capacity_factor, 0);
}

// The routed experts on the N_local tokens of this rank; the shared expert on all N.
static void alloc_moe_acts(MoeActs *ma, Arena *ar, const Model *m, int B, int T) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    int N_all = B * T, N = plan_local_tokens(p, N_all), E = p->experts, k = p->topk, H = p->hidden, I = p->moe_ffn;
    size_t choices = (size_t)N * k, rows = moe_rows(c, N, N_all), Is = p->shared_ffn;
    ma->jittered_input = c->moe_input_jitter_eps > 0 ? arena_reals(ar, (size_t)N * H) : NULL;
    ma->jitter = c->moe_input_jitter_eps > 0 ? arena_reals(ar, (size_t)N * H) : NULL;
    ma->logits = arena_reals(ar, (size_t)N * E);
    ma->route.scores = arena_reals(ar, (size_t)N * E);
    ma->route.aux_scores = arena_reals(ar, (size_t)N * E);
    ma->route.topk_idx = arena_ints(ar, choices);
    ma->route.topk_probs = arena_reals(ar, choices);
    ma->route.kept = arena_ints(ar, choices);
    ma->route.tokens_per_expert = arena_ints(ar, E);
    ma->route.group_tokens_per_expert = arena_ints(ar, E);
    ma->route.aux_counts = arena_ints(ar, E);
    ma->route.seq_counts = arena_ints(ar, (size_t)B * E);  // every sequence: a rank's tokens may span them
    ma->route.global_counts = arena_alloc(ar, E * sizeof(double));
    ma->route.group_counts = arena_alloc(ar, E * sizeof(double));
    ma->plan = (DispatchPlan){.N = N, .k = k, .E = E, .rows_per_expert = arena_ints(ar, E),
                              .expert_offsets = arena_ints(ar, E + 1), .row_of_choice = arena_ints(ar, choices),
                              .token_of_row = arena_ints(ar, rows)};
    if (Is) {
        size_t full = (size_t)N_all * Is;
        ma->shared = (ExpertActs){arena_reals(ar, full), arena_reals(ar, full), arena_reals(ar, full)};
        ma->shared_gate = arena_reals(ar, N);
        ma->shared_gate_full = p->sequence_parallel ? arena_reals(ar, N_all) : ma->shared_gate;
        ma->shared_out = arena_reals(ar, (size_t)N * H);
    }
    ma->rows_in = arena_reals(ar, rows * H);
    ma->row_probs = arena_reals(ar, rows);
    ma->experts.gate = arena_reals(ar, rows * I);
    ma->experts.up = arena_reals(ar, rows * I);
    ma->experts.act = arena_reals(ar, rows * I);
    ma->rows_out = arena_reals(ar, rows * H);
}

static void alloc_mla_acts(MlaActs *ma, Arena *ar, const Config *c, int heads, int N) {
    if (c->q_lora_rank) {
        ma->q_a = arena_reals(ar, (size_t)N * c->q_lora_rank);
        ma->q_a_norm = arena_reals(ar, (size_t)N * c->q_lora_rank);
        ma->q_a_rstd = arena_reals(ar, N);
    }
    ma->latent = arena_reals(ar, (size_t)N * c->kv_lora_rank);
    ma->latent_norm = arena_reals(ar, (size_t)N * c->kv_lora_rank);
    ma->latent_rstd = arena_reals(ar, N);
    ma->k_rope = arena_reals(ar, (size_t)N * c->qk_pos_emb_head_dim);
    ma->kv_b = arena_reals(ar, (size_t)N * heads * (c->qk_head_dim + c->v_head_dim));
}

// q/k/v and the stages before them: projection -> [QK-norm] -> [clip]; a stage that is off
// aliases the next one, so the code reads every stage regardless.
static void alloc_qkv(LayerActs *la, Arena *ar, const Model *m, int N) {
    const Config *c = &m->cfg;
    AttentionWidths w = m->plan.width;
    la->q = arena_reals(ar, (size_t)N * w.q);
    la->k = arena_reals(ar, (size_t)N * w.k);
    la->v = arena_reals(ar, (size_t)N * w.v);
    if (c->multi_latent_attention) {
        alloc_mla_acts(&la->mla, ar, c, m->plan.heads, N);
        return;
    }
    int clip = c->clip_qkv > 0;
    la->q_normed = clip ? arena_reals(ar, (size_t)N * w.q) : la->q;
    la->k_normed = clip ? arena_reals(ar, (size_t)N * w.k) : la->k;
    la->v_raw = clip ? arena_reals(ar, (size_t)N * w.v) : la->v;
    la->q_raw = c->qk_layernorm ? arena_reals(ar, (size_t)N * w.q) : la->q_normed;
    la->k_raw = c->qk_layernorm ? arena_reals(ar, (size_t)N * w.k) : la->k_normed;
    la->q_rstd = arena_reals(ar, (size_t)N * m->plan.heads);
    la->k_rstd = arena_reals(ar, (size_t)N * m->plan.kv_heads);
}

// workspace: the (N,H) row-parallel partial sums of sequence parallelism, shared by every layer
static void alloc_layer_acts(LayerActs *la, Arena *ar, const Model *m, int l, int B, int T, real *workspace) {
    const LayoutPlan *p = &m->plan;
    int N = B * T, N_local = plan_local_tokens(p, N), H = p->hidden, sp = p->sequence_parallel;
    int dense_ffn = !m->layers[l].is_moe, shared_ffn = m->layers[l].is_moe && p->shared_ffn;
    la->x_in = arena_reals(ar, (size_t)N_local * H);
    la->ln1 = arena_reals(ar, (size_t)N_local * H);
    la->ln1_rstd = arena_reals(ar, N_local);
    la->ln1_full = sp ? arena_reals(ar, (size_t)N * H) : la->ln1;
    alloc_qkv(la, ar, m, N);
    la->att = arena_reals(ar, (size_t)N * p->width.out);
    la->lse = arena_reals(ar, (size_t)N * p->heads);
    la->x_mid = arena_reals(ar, (size_t)N_local * H);
    la->attn_partial = sp ? workspace : la->x_mid;
    la->ln2 = arena_reals(ar, (size_t)N_local * H);
    la->ln2_rstd = arena_reals(ar, N_local);
    la->ln2_full = sp && (dense_ffn || shared_ffn) ? arena_reals(ar, (size_t)N * H) : la->ln2;
    la->ffn_out = arena_reals(ar, (size_t)N_local * H);
    if (m->layers[l].is_moe) {
        alloc_moe_acts(&la->moe, ar, m, B, T);
        la->ffn_partial = sp ? workspace : la->moe.shared_out;
    } else {
        size_t F = p->ffn;
        la->mlp = (ExpertActs){arena_reals(ar, N * F), arena_reals(ar, N * F), arena_reals(ar, N * F)};
        la->ffn_partial = sp ? workspace : la->ffn_out;
    }
}

static void alloc_mla_scratch(ModelActs *a, const Config *c, int heads) {
    Arena *ar = &a->arena;
    int N = a->N;
    a->d_kv_b = arena_reals(ar, (size_t)N * heads * (c->qk_head_dim + c->v_head_dim));
    a->d_latent_norm = arena_reals(ar, (size_t)N * c->kv_lora_rank);
    a->d_latent = arena_reals(ar, (size_t)N * c->kv_lora_rank);
    a->d_k_rope = arena_reals(ar, (size_t)N * c->qk_pos_emb_head_dim);
    if (c->q_lora_rank) {
        a->d_q_a_norm = arena_reals(ar, (size_t)N * c->q_lora_rank);
        a->d_q_a = arena_reals(ar, (size_t)N * c->q_lora_rank);
    }
}

static void alloc_backward_scratch(ModelActs *a, const Model *m) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    Arena *ar = &a->arena;
    int N = a->N, N_local = a->N_local, H = p->hidden, sp = p->sequence_parallel;
    AttentionWidths w = p->width;
    // FFN scratch serves dense layers (N rows of F), experts (rows of I), shared experts (N rows of Is)
    size_t rows = c->num_experts ? moe_rows(c, N_local, N) : 0;
    size_t ffn_scratch = MT_MAX((size_t)N * p->ffn, rows * p->moe_ffn);
    ffn_scratch = MT_MAX(ffn_scratch, (size_t)N * p->shared_ffn);
    a->d_token_loss = arena_reals(ar, N);
    a->d_resid = arena_reals(ar, (size_t)N_local * H);
    a->d_norm = arena_reals(ar, (size_t)N_local * H);
    a->d_out_full = sp ? arena_reals(ar, (size_t)N * H) : a->d_resid;
    a->d_norm_full = sp ? arena_reals(ar, (size_t)N * H) : a->d_norm;
    a->d_att = arena_reals(ar, (size_t)N * w.out);
    a->d_q = arena_reals(ar, (size_t)N * w.q);
    a->d_k = arena_reals(ar, (size_t)N * w.k);
    a->d_v = arena_reals(ar, (size_t)N * w.v);
    a->d_q_raw = arena_reals(ar, (size_t)N * w.q);
    a->d_k_raw = arena_reals(ar, (size_t)N * w.k);
    if (c->multi_latent_attention) alloc_mla_scratch(a, c, p->heads);
    a->d_logits = arena_reals(ar, (size_t)N * p->vocab);
    a->d_gate = arena_reals(ar, ffn_scratch);
    a->d_up = arena_reals(ar, ffn_scratch);
    a->d_act = arena_reals(ar, ffn_scratch);
    if (rows) {
        a->d_rows_in = arena_reals(ar, rows * H);
        a->d_rows_out = arena_reals(ar, rows * H);
        a->d_row_probs = arena_reals(ar, rows);
        a->d_choice_probs = arena_reals(ar, (size_t)N_local * p->topk);
        a->d_router_logits = arena_reals(ar, (size_t)N_local * p->experts);
        a->d_router_input = arena_reals(ar, (size_t)N_local * H);
        a->d_shared_in = arena_reals(ar, (size_t)N_local * H);
        a->d_shared_in_full = sp ? a->d_norm_full : a->d_shared_in;  // free while the shared expert runs
        a->d_shared_gate = arena_reals(ar, N_local);
        a->d_shared_gate_full = sp ? arena_reals(ar, N) : a->d_shared_gate;
    }
}

void acts_alloc(ModelActs *a, const Model *m, int B, int T) {
    const Config *c = &m->cfg;
    const LayoutPlan *p = &m->plan;
    memset(a, 0, sizeof(*a));
    arena_init(&a->arena);
    a->B = B;
    a->T = T;
    a->N = B * T;
    a->N_local = plan_local_tokens(p, a->N);
    a->capacity_tokens = a->N;
    a->num_layers = c->num_layers;
    int N = a->N, N_local = a->N_local, H = p->hidden, sp = p->sequence_parallel;
    real *workspace = sp ? arena_reals(&a->arena, (size_t)N * H) : NULL;
    a->layers = arena_alloc(&a->arena, c->num_layers * sizeof(LayerActs));
    memset(a->layers, 0, c->num_layers * sizeof(LayerActs));
    for (int l = 0; l < c->num_layers; l++) alloc_layer_acts(&a->layers[l], &a->arena, m, l, B, T, workspace);
    a->x_final = arena_reals(&a->arena, (size_t)N_local * H);
    a->lnf = arena_reals(&a->arena, (size_t)N_local * H);
    a->lnf_rstd = arena_reals(&a->arena, N_local);
    a->lnf_full = sp ? arena_reals(&a->arena, (size_t)N * H) : a->lnf;
    a->logits = arena_reals(&a->arena, (size_t)N * p->vocab);
    a->token_loss = arena_reals(&a->arena, N);
    a->token_lse = arena_reals(&a->arena, N);
    a->loss_weight = arena_reals(&a->arena, N);
    a->input_ids = arena_ints(&a->arena, 4 * (size_t)N);
    a->input_loss_mask = arena_reals(&a->arena, N);
    alloc_backward_scratch(a, m);
    if (p->tp_size > 1) vocab_scratch_alloc(&a->vocab_scratch, N, H);
}

// Copies `count` items of src (when given) into dst and returns dst, or NULL without src.
static const void *staged(void *dst, const void *src, size_t count, size_t size) {
    if (!src) return NULL;
    memcpy(dst, src, count * size);
    return dst;
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
    return &a->input;
}

void acts_free(ModelActs *a) {
    for (int l = 0; l < a->num_layers; l++) ep_layer_free(&a->layers[l].moe);
    if (a->vocab_scratch.rows) vocab_scratch_free(&a->vocab_scratch);
    arena_free(&a->arena);
}
