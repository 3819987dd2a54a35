#include "hf/hf_config_read.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "hf/hf_family.h"

typedef struct {
    const JsonValue *root;
    const char *path;
} HfKeys;

static int key_int(const HfKeys *k, const char *key, int required) {
    int64_t v;
    if (json_get_int64(k->root, key, &v)) {
        if (v < -INT32_MAX || v > INT32_MAX) mt_die("%s: \"%s\" %lld is out of range", k->path, key, (long long)v);
        return (int)v;
    }
    if (required) mt_die("%s: missing or non-integer \"%s\"", k->path, key);
    return -1;
}

// key_int into *field (a field of c), noted as read from key (errors about it name the key).
static void read_int(Config *c, const HfKeys *k, int *field, const char *key, int required) {
    *field = key_int(k, key, required);
    config_note_file_key(c, field, key);
}

static double key_double(const HfKeys *k, const char *key, double fallback) {
    double v;
    return json_get_number(k->root, key, &v) ? v : fallback;
}

static int key_bool(const HfKeys *k, const char *key, int fallback) {
    int v = fallback;
    json_get_bool(k->root, key, &v);
    return v;
}

static int key_is_null_or_absent(const HfKeys *k, const char *key) {
    const JsonValue *v = json_get(k->root, key);
    return !v || v->type == JSON_NULL;
}

// Keys with values moetron cannot represent.
static void reject_unsupported(const HfKeys *k, HfFamily family) {
    const char *act = json_get_string(k->root, "hidden_act");
    if (act && strcmp(act, "silu"))
        mt_die("%s: hidden_act \"%s\" is not supported; moetron's experts use SwiGLU (silu)", k->path, act);
    if (key_bool(k, "attention_bias", 0))
        mt_die("%s: attention_bias true is not supported; moetron's linear layers have no biases", k->path);
    if (key_bool(k, "use_sliding_window", 0) || (family == HF_MIXTRAL && !key_is_null_or_absent(k, "sliding_window")))
        mt_die("%s: sliding-window attention (use_sliding_window / sliding_window) is not supported; "
               "set it to false / null", k->path);
    if (key_double(k, "router_jitter_noise", 0) != 0)
        mt_die("%s: router_jitter_noise %g (noise on the whole MoE input) is not supported; set it to 0 (moetron's "
               "--moe-input-jitter-eps jitters the router input only)", k->path, key_double(k, "router_jitter_noise", 0));
}

// The load-balancing loss for fine-tuning, unless given on the command line: the aux
// loss with router_aux_loss_coef; for DeepSeek-V3 (no such key in its config class) the
// sequence-wise aux loss with 1e-4, as DeepSeek-V3 trained (router_aux_loss_coef, when
// present, sets its coefficient).
static void read_balancing(Config *c, const HfKeys *k, HfFamily family) {
    int deepseek = family == HF_DEEPSEEK_V3;
    if (!config_flag_given(c, "moe-router-load-balancing-type"))
        strcpy(c->moe_router_load_balancing_type, deepseek ? "seq_aux_loss" : "aux_loss");
    if (config_flag_given(c, "moe-aux-loss-coeff")) return;
    double fallback = deepseek ? 1e-4 : family == HF_OLMOE ? 0.01 : 0.001;
    snprintf(c->moe_aux_loss_coeff, sizeof(c->moe_aux_loss_coeff), "%.17g",
             key_double(k, "router_aux_loss_coef", fallback));
    if (json_get(k->root, "router_aux_loss_coef")) config_note_file_key(c, c->moe_aux_loss_coeff, "router_aux_loss_coef");
}

// A --seq-length the user gave is never changed (above max_position_embeddings it is
// config_validate's error); the default is lowered to it, with a note when training.
static void limit_default_seq_length(Config *c, const HfKeys *k) {
    int max_pos = c->max_position_embeddings;
    if (max_pos <= 0 || c->seq_length <= max_pos || config_flag_given(c, "seq-length")) return;
    if (c->command == CMD_TRAIN)
        printf("note: --seq-length %d lowered to %d, the max_position_embeddings of %s (give --seq-length to choose)\n",
               c->seq_length, max_pos, k->path);
    c->seq_length = max_pos;
}

// The type of a RoPE object: "rope_type", else "type", else default.
static const char *rope_object_type(const JsonValue *rope) {
    const char *type = json_get_string(rope, "rope_type");
    if (!type) type = json_get_string(rope, "type");
    return type ? type : "default";
}

// The object describing RoPE's scaling: the older rope_scaling (transformers v4, DeepSeek-V3's
// published config.json) when it is there, else rope_parameters (v5); NULL for neither.
// *name is its key, for errors, *type its type.
static const JsonValue *rope_scaling_object(const HfKeys *k, const char **name, const char **type) {
    const JsonValue *legacy = key_is_null_or_absent(k, "rope_scaling") ? NULL : json_get(k->root, "rope_scaling");
    const JsonValue *params = key_is_null_or_absent(k, "rope_parameters") ? NULL : json_get(k->root, "rope_parameters");
    if (legacy && params && strcmp(rope_object_type(params), "default") &&
        strcmp(rope_object_type(params), rope_object_type(legacy)))
        mt_die("%s: rope_scaling (\"%s\") and rope_parameters (\"%s\") disagree; keep one", k->path,
               rope_object_type(legacy), rope_object_type(params));
    *name = legacy ? "rope_scaling" : "rope_parameters";
    const JsonValue *rope = legacy ? legacy : params;
    *type = rope ? rope_object_type(rope) : "default";
    return rope;
}

// "<object>.<key>" for the numbers read from a scaling object: the names errors give them
// (config_note_file_key keeps the pointer, so these live as long as the program).
static const char *rope_key_name(const char *object, const char *key) {
    static const char *const names[] = {"rope_parameters.factor", "rope_parameters.beta_fast",
                                        "rope_parameters.beta_slow", "rope_scaling.factor", "rope_scaling.beta_fast",
                                        "rope_scaling.beta_slow"};
    size_t olen = strlen(object);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strncmp(names[i], object, olen) && names[i][olen] == '.' && !strcmp(names[i] + olen + 1, key))
            return names[i];
    return key;
}

// A number of the scaling object into *field, noted as read from "<object>.<key>".
static void read_rope_number(Config *c, const HfKeys *k, const JsonValue *rope, const char *object, const char *key,
                             double *field) {
    const JsonValue *v = json_get(rope, key);
    if (!v || v->type == JSON_NULL) return;  // absent: the config class's default, as set
    if (!json_get_number(rope, key, field)) mt_die("%s: %s.%s must be a number", k->path, object, key);
    config_note_file_key(c, field, rope_key_name(object, key));
}

// YaRN as transformers reads it: factor (else max_position_embeddings over the original
// context), original_max_position_embeddings (else max_position_embeddings), beta_fast 32,
// beta_slow 1, mscale and mscale_all_dim as given (absent: the plain ratio's mscale, 0).
static void read_yarn(Config *c, const HfKeys *k, HfFamily family, const JsonValue *rope, const char *object) {
    strcpy(c->rope_type, "yarn");
    // as transformers: the object's value, else max_position_embeddings (read before: 0 when
    // absent); a top-level original_max_position_embeddings (Phi-3's way) before either
    int max_pos = c->max_position_embeddings;
    int64_t original = max_pos;
    json_get_int64(rope, "original_max_position_embeddings", &original);
    json_get_int64(k->root, "original_max_position_embeddings", &original);
    if (original < 1 || original > INT32_MAX)
        mt_die("%s: %s needs original_max_position_embeddings (a positive integer)", k->path, object);
    c->original_max_position_embeddings = (int)original;
    c->rotary_scaling_factor = max_pos > 0 ? (double)max_pos / (double)original : 1.0;
    read_rope_number(c, k, rope, object, "factor", &c->rotary_scaling_factor);
    c->beta_fast = 32;
    c->beta_slow = 1;
    read_rope_number(c, k, rope, object, "beta_fast", &c->beta_fast);
    read_rope_number(c, k, rope, object, "beta_slow", &c->beta_slow);
    // transformers scales cos/sin by mscale(s, mscale) / mscale(s, mscale_all_dim) when both
    // are given, else by mscale(s, 1): mscale 1 over mscale_all_dim 0 here. MLA's softmax
    // correction takes mscale_all_dim alone, which moetron ties to the cos/sin scale.
    double mscale = 0, mscale_all_dim = 0;
    json_get_number(rope, "mscale", &mscale);
    json_get_number(rope, "mscale_all_dim", &mscale_all_dim);
    int both = mscale != 0 && mscale_all_dim != 0;
    if (!both && mscale_all_dim != 0 && family == HF_DEEPSEEK_V3)
        mt_die("%s: %s.mscale_all_dim %g without mscale is not supported; give mscale (DeepSeek-V3: 1.0)", k->path,
               object, mscale_all_dim);
    c->mscale = both ? mscale : 1.0;
    c->mscale_all_dim = both ? mscale_all_dim : 0.0;
    int truncate = 1;
    json_get_bool(rope, "truncate", &truncate);
    if (!truncate) mt_die("%s: %s.truncate false is not supported (moetron floors and ceils the correction range)",
                          k->path, object);
}

// Llama 3's scaling: factor and original_max_position_embeddings; its low and high frequency
// factors must be Llama 3's 1 and 4 (moetron, as Megatron-Core, fixes them).
static void read_llama3(Config *c, const HfKeys *k, const JsonValue *rope, const char *object) {
    double low = 1, high = 4;
    int64_t original = 0;
    json_get_number(rope, "low_freq_factor", &low);
    json_get_number(rope, "high_freq_factor", &high);
    if (low != 1 || high != 4)
        mt_die("%s: %s low_freq_factor %g and high_freq_factor %g are not supported (Llama 3's 1 and 4 are)", k->path,
               object, low, high);
    if (!json_get_int64(rope, "original_max_position_embeddings", &original) || original < 1 || original > INT32_MAX)
        mt_die("%s: %s needs original_max_position_embeddings (a positive integer)", k->path, object);
    c->use_rope_scaling = 1;
    c->original_max_position_embeddings = (int)original;
    read_rope_number(c, k, rope, object, "factor", &c->rope_scaling_factor);
}

// rope_parameters / rope_scaling: plain ("default"), "yarn", "llama3" or "linear"; other types are
// refused by name.
static void read_rope_scaling(Config *c, const HfKeys *k, HfFamily family) {
    const char *object, *type;
    const JsonValue *rope = rope_scaling_object(k, &object, &type);
    if (!rope || !strcmp(type, "default")) return;
    const JsonValue *attention_factor = json_get(rope, "attention_factor");
    if (attention_factor && attention_factor->type != JSON_NULL)
        mt_die("%s: %s.attention_factor is not supported (moetron derives it from factor, mscale and mscale_all_dim); "
               "remove it", k->path, object);
    if (!strcmp(type, "yarn")) {
        read_yarn(c, k, family, rope, object);
    } else if (!strcmp(type, "llama3")) {
        read_llama3(c, k, rope, object);
    } else if (!strcmp(type, "linear")) {
        c->rotary_seq_len_interpolation_factor = 1.0;
        read_rope_number(c, k, rope, object, "factor", &c->rotary_seq_len_interpolation_factor);
    } else {
        mt_die("%s: %s type \"%s\" is not supported (default, yarn, llama3 and linear are)", k->path, object, type);
    }
}

// Every family: sizes, norms, RoPE, embeddings, router top-k and aux coefficient.
static void read_common(Config *c, const HfKeys *k, HfFamily family, int dense) {
    read_int(c, k, &c->num_layers, "num_hidden_layers", 1);
    if (c->num_layers > MT_MAX_LAYERS)
        mt_die("%s: num_hidden_layers %d exceeds the supported %d", k->path, c->num_layers, MT_MAX_LAYERS);
    read_int(c, k, &c->hidden_size, "hidden_size", 1);
    read_int(c, k, &c->num_attention_heads, "num_attention_heads", 1);
    int kv = key_int(k, "num_key_value_heads", 0);
    config_note_file_key(c, &c->num_query_groups, "num_key_value_heads");
    c->group_query_attention = family != HF_DEEPSEEK_V3 && kv > 0 && kv != c->num_attention_heads;
    c->num_query_groups = c->group_query_attention ? kv : c->num_attention_heads;
    int head_dim = family == HF_DEEPSEEK_V3 ? -1 : key_int(k, "head_dim", 0);
    c->kv_channels = head_dim > 0 ? head_dim : 0;
    if (head_dim > 0) config_note_file_key(c, &c->kv_channels, "head_dim");
    read_int(c, k, &c->vocab_size, "vocab_size", 1);
    c->make_vocab_size_divisible_by = 1;
    int max_pos = key_int(k, "max_position_embeddings", 0);
    c->max_position_embeddings = max_pos > 0 ? max_pos : 0;
    config_note_file_key(c, &c->max_position_embeddings, "max_position_embeddings");
    limit_default_seq_length(c, k);
    // defaults for absent keys are those of the transformers config classes
    // (a dense model's: LlamaConfig's and Qwen3Config's, 1e-6 and theta 10000 both)
    int eps_1e6 = family == HF_QWEN3_MOE || family == HF_DEEPSEEK_V3 || dense;
    c->norm_epsilon = key_double(k, "rms_norm_eps", eps_1e6 ? 1e-6 : 1e-5);
    config_note_file_key(c, &c->norm_epsilon, "rms_norm_eps");
    read_rope_scaling(c, k, family);
    const JsonValue *rope = json_get(k->root, "rope_parameters");
    double default_theta = family == HF_MIXTRAL && !dense ? 1e6 : 10000;
    double theta = key_double(k, "rope_theta", default_theta);
    if (rope) json_get_number(rope, "rope_theta", &theta);
    c->rotary_base = theta;
    int nested = rope && json_get(rope, "rope_theta");
    config_note_file_key(c, &c->rotary_base, nested ? "rope_parameters.rope_theta" : "rope_theta");
    read_balancing(c, k, family);
    c->untie_embeddings_and_output_weights = !key_bool(k, "tie_word_embeddings", 0);
    if (!dense) read_int(c, k, &c->moe_router_topk, "num_experts_per_tok", 1);
}

static void set_layer_pattern(Config *c, const int *moe) {
    size_t at = 0, cap = sizeof(c->moe_layer_freq);
    at += snprintf(c->moe_layer_freq + at, cap - at, "[");
    for (int l = 0; l < c->num_layers && l < MT_MAX_LAYERS && at < cap - 4; l++)
        at += snprintf(c->moe_layer_freq + at, cap - at, "%s%d", l ? "," : "", moe[l]);
    snprintf(c->moe_layer_freq + at, cap - at, "]");
}

// Qwen3-MoE's config class maps num_experts to num_local_experts, and transformers writes
// the latter: accept either name.
static void read_expert_count(Config *c, const HfKeys *k, const char *name, const char *alias) {
    int experts = key_int(k, name, 0);
    if (experts < 0) experts = key_int(k, alias, 0), name = alias;
    if (experts < 0) mt_die("%s: missing or non-integer \"%s\"", k->path, name);
    c->num_experts = experts;
    config_note_file_key(c, &c->num_experts, name);
}

// Dense models (Qwen3, Llama) with the MoE family that names the same tensors: read to
// train them as they are, or to upcycle them (--moe-use-upcycling, whose --num-experts
// and --moe-* flags then shape the experts).
static const struct {
    const char *model_type;
    HfFamily family;
} DENSE_FAMILIES[] = {{"qwen3", HF_QWEN3_MOE}, {"llama", HF_MIXTRAL}};

static HfFamily dense_family_of(const char *model_type) {
    for (size_t i = 0; model_type && i < sizeof DENSE_FAMILIES / sizeof DENSE_FAMILIES[0]; i++)
        if (!strcmp(model_type, DENSE_FAMILIES[i].model_type)) return DENSE_FAMILIES[i].family;
    return HF_FAMILY_COUNT;
}

static void read_dense(Config *c, const HfKeys *k, HfFamily family) {
    c->qk_layernorm = family == HF_QWEN3_MOE;  // Qwen3's per-head QK-norm
    read_int(c, k, &c->ffn_hidden_size, "intermediate_size", 1);
    if (!c->moe_use_upcycling) c->num_experts = 0;
    if (!config_flag_given(c, "moe-layer-freq")) strcpy(c->moe_layer_freq, "1");
}

static void read_mixtral(Config *c, const HfKeys *k) {
    read_expert_count(c, k, "num_local_experts", "num_experts");
    read_int(c, k, &c->moe_ffn_hidden_size, "intermediate_size", 1);
    read_int(c, k, &c->ffn_hidden_size, "intermediate_size", 1);
    c->moe_router_pre_softmax = 0;  // Mixtral always renormalises the top-k
    strcpy(c->moe_layer_freq, "1");
}

static void read_qwen3(Config *c, const HfKeys *k) {
    c->qk_layernorm = 1;
    read_expert_count(c, k, "num_experts", "num_local_experts");
    read_int(c, k, &c->moe_ffn_hidden_size, "moe_intermediate_size", 1);
    read_int(c, k, &c->ffn_hidden_size, "intermediate_size", 1);
    c->moe_router_pre_softmax = !key_bool(k, "norm_topk_prob", 0);
    // layer l is MoE unless listed in mlp_only_layers or off the sparse step
    int step = key_int(k, "decoder_sparse_step", 0);
    if (step <= 0) step = 1;
    int moe[MT_MAX_LAYERS];
    for (int l = 0; l < c->num_layers && l < MT_MAX_LAYERS; l++) moe[l] = (l + 1) % step == 0;
    const JsonValue *dense = json_get(k->root, "mlp_only_layers");
    for (size_t i = 0; dense && dense->type == JSON_ARRAY && i < dense->count; i++) {
        int64_t l;
        if (json_as_int64(&dense->items[i], &l) && l >= 0 && l < c->num_layers && l < MT_MAX_LAYERS) moe[l] = 0;
    }
    set_layer_pattern(c, moe);
}

static void read_olmoe(Config *c, const HfKeys *k) {
    c->qk_layernorm = 1;
    strcpy(c->qk_layernorm_scope, "projection");
    if (c->kv_channels && (int64_t)c->kv_channels * c->num_attention_heads != c->hidden_size)
        mt_die("%s: head_dim %d times num_attention_heads %d must equal hidden_size %d for OLMoE's QK-norm",
               k->path, c->kv_channels, c->num_attention_heads, c->hidden_size);
    read_expert_count(c, k, "num_experts", "num_local_experts");
    read_int(c, k, &c->moe_ffn_hidden_size, "intermediate_size", 1);
    read_int(c, k, &c->ffn_hidden_size, "intermediate_size", 1);
    c->moe_router_pre_softmax = !key_bool(k, "norm_topk_prob", 0);
    c->clip_qkv = key_is_null_or_absent(k, "clip_qkv") ? 0 : key_double(k, "clip_qkv", 0);
    config_note_file_key(c, &c->clip_qkv, "clip_qkv");
    if (!key_is_null_or_absent(k, "clip_qkv") && c->clip_qkv <= 0)
        mt_die("%s: clip_qkv must be a positive number or null", k->path);
    strcpy(c->moe_layer_freq, "1");
}

static void read_deepseek_attention(Config *c, const HfKeys *k) {
    c->multi_latent_attention = 1;
    c->q_lora_rank = key_is_null_or_absent(k, "q_lora_rank") ? 0 : key_int(k, "q_lora_rank", 1);
    config_note_file_key(c, &c->q_lora_rank, "q_lora_rank");
    read_int(c, k, &c->kv_lora_rank, "kv_lora_rank", 1);
    read_int(c, k, &c->qk_head_dim, "qk_nope_head_dim", 1);
    read_int(c, k, &c->qk_pos_emb_head_dim, "qk_rope_head_dim", 1);
    read_int(c, k, &c->v_head_dim, "v_head_dim", 1);
    c->rotary_interleaved = key_bool(k, "rope_interleave", 1);
}

static void read_deepseek(Config *c, const HfKeys *k) {
    read_deepseek_attention(c, k);
    read_expert_count(c, k, "n_routed_experts", "num_local_experts");
    c->moe_ffn_hidden_size = key_int(k, "moe_intermediate_size", 1);
    c->ffn_hidden_size = key_int(k, "intermediate_size", 1);
    strcpy(c->moe_router_score_function, "sigmoid");
    c->moe_router_pre_softmax = 0;
    c->moe_router_enable_expert_bias = 1;  // e_score_correction_bias: updated as Megatron does
    int shared = key_int(k, "n_shared_experts", 0);
    int64_t shared_size = shared > 0 ? (int64_t)shared * c->moe_ffn_hidden_size : 0;
    if (shared_size > INT32_MAX || shared_size < 0)
        mt_die("%s: n_shared_experts %d times moe_intermediate_size %d is out of range", k->path, shared,
               c->moe_ffn_hidden_size);
    c->moe_shared_expert_intermediate_size = (int)shared_size;
    config_note_file_key(c, &c->moe_shared_expert_intermediate_size, "n_shared_experts");
    c->moe_router_topk_scaling_factor = key_double(k, "routed_scaling_factor", 2.5);
    config_note_file_key(c, &c->moe_router_topk_scaling_factor, "routed_scaling_factor");
    int groups = key_int(k, "n_group", 0), group_topk = key_int(k, "topk_group", 0);
    if (groups > 1) {
        if (group_topk <= 0 || c->moe_router_topk != 2 * (int64_t)group_topk)
            mt_die("%s: n_group %d with topk_group %d and num_experts_per_tok %d: DeepSeek-V3 ranks groups by their "
                   "top-2 experts, which moetron represents only when num_experts_per_tok = 2 * topk_group",
                   k->path, groups, group_topk, c->moe_router_topk);
        c->moe_router_num_groups = groups;
        c->moe_router_group_topk = group_topk;
        config_note_file_key(c, &c->moe_router_num_groups, "n_group");
        config_note_file_key(c, &c->moe_router_group_topk, "topk_group");
    }
    int norm_topk = key_bool(k, "norm_topk_prob", 1);
    if (!norm_topk && c->moe_router_topk > 1)
        mt_die("%s: norm_topk_prob false with sigmoid routing is not supported (moetron renormalises the top-k "
               "sigmoid scores, as Megatron-Core does)", k->path);
    // multi-token-prediction layers (model.layers.L.*, L >= num_hidden_layers; transformers
    // skips them, and saves a config that names one without its tensors): the first
    // --mtp-num-layers of them are the model's depths, the others skipped
    int mtp = key_int(k, "num_nextn_predict_layers", 0);
    c->hf_mtp_layers = mtp > 0 ? mtp : 0;
    int first_dense = key_int(k, "first_k_dense_replace", 0);
    if (first_dense < 0) first_dense = 3;  // the config class default
    int moe[MT_MAX_LAYERS];
    for (int l = 0; l < c->num_layers && l < MT_MAX_LAYERS; l++) moe[l] = l >= first_dense;
    set_layer_pattern(c, moe);
}

void hf_config_read_plain(Config *c, const JsonValue *root, const char *path) {
    const char *type = json_get_string(root, "model_type");
    HfFamily family = hf_family_from_model_type(type), dense_family = dense_family_of(type);
    int dense = dense_family != HF_FAMILY_COUNT;
    if (dense) family = dense_family;
    if (family == HF_FAMILY_COUNT || family == HF_MOETRON)
        mt_die("%s: model_type %s is not supported; moetron reads mixtral, qwen3_moe, olmoe and deepseek_v3 (and the "
               "dense qwen3 and llama)", path, type ? type : "(missing)");
    for (int i = 0; i < config_flag_count(); i++) {
        const char *name = config_flag(i)->name;
        int chosen_here = !strcmp(name, "hf-architecture") || !strcmp(name, "mtp-num-layers");
        if (config_flag(i)->architecture && c->flag_given[i] && !chosen_here && !config_upcycling_reshapes(c, name))
            mt_die("--%s: the model shape comes from %s; drop the flag", name, path);
    }
    HfKeys k = {root, path};
    reject_unsupported(&k, family);
    read_common(c, &k, family, dense);
    switch (dense ? HF_FAMILY_COUNT : family) {
    case HF_MIXTRAL: read_mixtral(c, &k); break;
    case HF_QWEN3_MOE: read_qwen3(c, &k); break;
    case HF_OLMOE: read_olmoe(c, &k); break;
    case HF_DEEPSEEK_V3: read_deepseek(c, &k); break;
    default: read_dense(c, &k, family); break;
    }
    if (c->mtp_num_layers > c->hf_mtp_layers)
        mt_die("--mtp-num-layers %d: %s has %d multi-token-prediction layer(s) (num_nextn_predict_layers); give at most "
               "that many", c->mtp_num_layers, path, c->hf_mtp_layers);
    // saved back as the family it came from (an upcycled dense model's MoE family; a dense one
    // as the first family that holds it), unless --hf-architecture says otherwise
    if (!config_flag_given(c, "hf-architecture"))
        snprintf(c->hf_architecture, sizeof(c->hf_architecture), "%s",
                 dense && !c->moe_use_upcycling ? "auto" : hf_model_type(family));
}
