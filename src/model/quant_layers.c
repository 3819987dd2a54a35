// quant_layers.c — which of the model's weight matrices the FP8 / FP4 recipe quantizes
// (ops/quantized_linear.h), as Megatron-LM with Transformer Engine: the linear layers of
// attention (q/k/v or MLA's projections, o_proj), the dense FFN, the shared expert, latent
// MoE's projections and the routed experts (each expert its own quantizers, as TE's GroupedLinear;
// q/k/v, and each gate with its up, one set: Megatron-Core's fused GEMMs); not the router,
// the shared-expert gate, norms, the attention core, the embedding or the LM head; no
// layer of the first / last ones --first-last-layers-bf16 keeps. The multi-token-prediction
// depths' layers and projections under the FP8 recipes, as Megatron-Core's global FP8
// context; FP4 leaves them in high precision (Megatron-Core does not quantize them to FP4).
#include "model/model.h"

#include <string.h>

#include "core/device.h"
#include "ops/quantized_linear.h"

// Megatron-LM's is_first_last_bf16_layer (global layer index); a depth's layer with FP4.
static int layer_in_bf16(const Config *c, int layer) {
    if (layer >= c->num_layers) return c->quant_recipe == QUANT_NVFP4;
    if (!c->first_last_layers_bf16) return 0;
    return layer < c->num_layers_at_start_in_bf16 || layer >= c->num_layers - c->num_layers_at_end_in_bf16;
}

// One weight the recipe quantizes, and whether it shares the quantizers of the weight listed
// before it: q, k and v are one GEMM in Megatron-Core (linear_qkv), as are an FFN's gate and
// up (linear_fc1), so Transformer Engine keeps one set of quantizers for each pair or triple.
typedef struct {
    TensorId id;
    int fused;  // shares the previous entry's QuantLinear
} QuantizedWeight;

// A layer's quantized weights as listed: into `out` when non-NULL; their count, and the
// QuantLinears they need (the weights less those sharing another's).
typedef struct {
    QuantizedWeight *out;
    int weights, linears;
} WeightList;

// Appends `id` unless it is absent (−1); `fused` holds only when the weight before it in the
// layer's list was there to share with.
static void list_weight(WeightList *list, TensorId id, int fused, TensorId before) {
    if (id < 0) return;
    fused = fused && before >= 0;
    if (list->out) list->out[list->weights] = (QuantizedWeight){id, fused};
    list->weights++;
    list->linears += !fused;
}

// The weight tensors of layer l the recipe quantizes, into list (whose out may be NULL: counts only).
static void quantized_weights(const Model *m, int l, WeightList *list) {
    const LayerParams *lp = &m->layers[l];
    TensorId eh_proj = l >= m->plan.layers ? m->mtp[l - m->plan.layers].eh_proj : -1;  // a depth's projection
    list_weight(list, lp->q_proj, 0, -1);
    list_weight(list, lp->k_proj, 1, lp->q_proj);
    list_weight(list, lp->v_proj, 1, lp->k_proj);
    TensorId unfused[] = {lp->o_proj, lp->q_a_proj, lp->q_b_proj, lp->kv_a_proj, lp->kv_b_proj};
    for (size_t i = 0; i < sizeof(unfused) / sizeof(unfused[0]); i++) list_weight(list, unfused[i], 0, -1);
    list_weight(list, lp->shared_gate, 0, -1);
    list_weight(list, lp->shared_up, 1, lp->shared_gate);
    TensorId after_shared[] = {lp->shared_down, lp->fc1_latent_proj, lp->fc2_latent_proj, eh_proj};
    for (size_t i = 0; i < sizeof(after_shared) / sizeof(after_shared[0]); i++)
        list_weight(list, after_shared[i], 0, -1);
    int groups = lp->is_moe ? m->ep.local : 1;
    for (int g = 0; g < groups; g++) {
        TensorId gate = lp->is_moe ? lp->expert_gate[g] : lp->mlp_gate;
        list_weight(list, gate, 0, -1);
        list_weight(list, lp->is_moe ? lp->expert_up[g] : lp->mlp_up, 1, gate);
        list_weight(list, lp->is_moe ? lp->expert_down[g] : lp->mlp_down, 0, -1);
    }
}

void model_quant_init(Model *m) {
    const Config *c = &m->cfg;
    if (!c->quant_recipe) return;
    int count = 0, most = 0;  // QuantLinears in all; the most weights of one layer
    for (int l = 0; l < config_all_layers(c); l++)
        if (plan_holds_layer(&m->plan, l) && !layer_in_bf16(c, l)) {
            WeightList counted = {0};
            quantized_weights(m, l, &counted);
            count += counted.linears;
            most = MT_MAX(most, counted.weights);
        }
    QuantRecipeConfig qc = {.recipe = (QuantRecipe)c->quant_recipe, .hybrid = !strcmp(c->fp8_format, "hybrid"),
                            .history_len = c->fp8_amax_history_len, .margin = c->fp8_margin,
                            .algo = strcmp(c->fp8_amax_compute_algo, "max") ? AMAX_HISTORY_MOST_RECENT
                                                                            : AMAX_HISTORY_MAX,
                            .seed = (uint64_t)c->seed};
    m->quant = quant_context_new(&qc, count);
    m->quant_of = mt_calloc((size_t)MT_MAX(m->tt.count, 1), sizeof(QuantLinear *));
    m->quant_of_expert = mt_calloc((size_t)MT_MAX(count, 1), 1);
    QuantizedWeight *w = mt_malloc((size_t)MT_MAX(most, 1) * sizeof(QuantizedWeight));
    for (int l = 0; l < config_all_layers(c); l++) {
        if (!plan_holds_layer(&m->plan, l) || layer_in_bf16(c, l)) continue;
        WeightList listed = {.out = w};
        quantized_weights(m, l, &listed);
        QuantLinear *q = NULL;
        for (int i = 0; i < listed.weights; i++) {
            if (!w[i].fused) q = quant_context_linear(m->quant);
            m->quant_of[w[i].id] = q;
            m->quant_of_expert[q->slot] = (m->tt.descs[w[i].id].flags & TENSOR_EXPERT) != 0;
        }
    }
    free(w);
}

QuantLinear *model_quant(const Model *m, TensorId id) { return m->quant_of && id >= 0 ? m->quant_of[id] : NULL; }

void model_quant_free(Model *m) {
    quant_context_free(m->quant);
    free(m->quant_of);
    free(m->quant_of_expert);
    m->quant = NULL;
    m->quant_of = NULL;
    m->quant_of_expert = NULL;
}

#ifndef MT_DOUBLE  // (the double-precision build has no quantized path: amaxes are fp32 `real`s)
static int group_of_many(const Comm *g) { return g && g->size > 1; }

// The step amaxes of the linears whose kind (expert or not) is `expert`, packed run by run
// into amax (back 0: out of the context; 1: back into it); their count.
static int move_step_amaxes(Model *m, int expert, float *amax, int back) {
    QuantContext *q = m->quant;
    int packed = 0;
    for (int first = 0; first < q->linears;) {
        int end = first;
        while (end < q->linears && m->quant_of_expert[end] == m->quant_of_expert[first]) end++;
        if (m->quant_of_expert[first] == expert) {
            float *at = amax + (size_t)packed * QUANT_OPERANDS;
            if (back) quant_context_set_step_amaxes(q, first, end - first, at);
            else quant_context_step_amaxes(q, first, end - first, at);
            packed += end - first;
        }
        first = end;
    }
    return packed;
}

void model_quant_reduce_amaxes(Model *m) {
    if (!m->quant || m->quant->cfg.recipe != QUANT_DELAYED || !m->quant->linears) return;
    float *amax = device_calloc((size_t)m->quant->linears * QUANT_OPERANDS, sizeof(float));
    for (int expert = 0; expert <= 1; expert++) {
        const Comm *const *groups = expert ? m->plan.expert_amax_groups : m->plan.dense_amax_groups;
        int reduced = 0;
        for (int i = 0; i < AMAX_GROUPS; i++) reduced |= group_of_many(groups[i]);
        int linears = reduced ? move_step_amaxes(m, expert, amax, 0) : 0;
        if (!linears) continue;
        for (int i = 0; i < AMAX_GROUPS; i++)
            if (group_of_many(groups[i])) comm_allreduce_max(groups[i], amax, (size_t)linears * QUANT_OPERANDS);
        move_step_amaxes(m, expert, amax, 1);
    }
    device_free(amax);
}
#else
void model_quant_reduce_amaxes(Model *m) { (void)m; }
#endif
