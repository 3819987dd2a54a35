#include "hf/hf_config.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "data/dataset.h"

static void write_dense_layer_list(JsonWriter *w, const Config *c) {
    jw_key(w, "mlp_only_layers");
    jw_begin_array(w);
    for (int l = 0; l < c->num_layers; l++)
        if (!c->moe_layer[l]) jw_int(w, l);
    jw_end_array(w);
}

static void write_flag_value(JsonWriter *w, const Config *c, const FlagSpec *f) {
    const char *field = (const char *)c + f->offset;
    switch (f->type) {
    case FLAG_INT: jw_int(w, *(const int *)field); break;
    case FLAG_INT64: jw_int(w, *(const int64_t *)field); break;
    case FLAG_DOUBLE: jw_double(w, *(const double *)field); break;
    case FLAG_BOOL: jw_bool(w, *(const int *)field); break;
    case FLAG_STRING:
    case FLAG_LIST: jw_string(w, field); break;
    }
}

static void write_moetron_section(JsonWriter *w, const Config *c) {
    jw_key(w, "moetron");
    jw_begin_object(w);
    jw_kv_int(w, "format_version", 1);
    jw_key(w, "flags");
    jw_begin_object(w);
    for (int i = 0; i < config_flag_count(); i++) {
        const FlagSpec *f = config_flag(i);
        if (!(f->commands & CMD_TRAIN)) continue;
        jw_key(w, f->name);
        write_flag_value(w, c, f);
    }
    jw_end_object(w);
    jw_end_object(w);
}

void hf_config_write(JsonWriter *w, const Config *c, HfFamily family) {
    jw_begin_object(w);
    jw_key(w, "architectures");
    jw_begin_array(w);
    jw_string(w, hf_architecture(family));
    jw_end_array(w);
    jw_kv_string(w, "model_type", hf_model_type(family));
    jw_kv_int(w, "vocab_size", c->padded_vocab_size);
    jw_kv_int(w, "hidden_size", c->hidden_size);
    jw_kv_int(w, "num_hidden_layers", c->num_layers);
    jw_kv_int(w, "num_attention_heads", c->num_attention_heads);
    jw_kv_int(w, "num_key_value_heads", c->kv_heads);
    jw_kv_int(w, "head_dim", c->head_dim);
    jw_kv_string(w, "hidden_act", "silu");
    jw_kv_int(w, "max_position_embeddings", c->max_positions);
    jw_kv_double(w, "rms_norm_eps", c->norm_epsilon);
    jw_kv_double(w, "rope_theta", c->rotary_base);
    jw_key(w, "rope_parameters");
    jw_begin_object(w);
    jw_kv_string(w, "rope_type", "default");
    jw_kv_double(w, "rope_theta", c->rotary_base);
    jw_end_object(w);
    jw_kv_bool(w, "tie_word_embeddings", !c->untie_embeddings_and_output_weights);
    jw_kv_bool(w, "attention_bias", 0);
    jw_kv_double(w, "attention_dropout", 0);
    jw_kv_double(w, "initializer_range", c->init_method_std);
    jw_kv_int(w, "eos_token_id", BYTE_EOD_TOKEN);
    jw_kv_int(w, "bos_token_id", BYTE_EOD_TOKEN);
    jw_kv_string(w, "torch_dtype", c->ckpt_bf16 ? "bfloat16" : "float32");
    jw_kv_string(w, "dtype", c->ckpt_bf16 ? "bfloat16" : "float32");
    jw_kv_bool(w, "use_cache", 1);
    jw_kv_bool(w, "output_router_logits", 0);
    jw_kv_double(w, "router_aux_loss_coef", c->balance_coeff[0]);
    jw_kv_int(w, "num_experts_per_tok", c->moe_router_topk);
    if (family == HF_MIXTRAL) {
        jw_kv_int(w, "num_local_experts", c->num_experts);
        jw_kv_int(w, "intermediate_size", c->moe_ffn);
        jw_kv_double(w, "router_jitter_noise", 0);
    } else {
        jw_kv_int(w, "num_experts", c->num_experts);
        jw_kv_int(w, "moe_intermediate_size", c->num_experts ? c->moe_ffn : c->ffn_hidden_size);
        jw_kv_int(w, "intermediate_size", c->ffn_hidden_size);
        jw_kv_int(w, "decoder_sparse_step", 1);
        write_dense_layer_list(w, c);
        jw_kv_bool(w, "norm_topk_prob", !c->moe_router_pre_softmax);
        jw_kv_bool(w, "use_sliding_window", 0);
    }
    write_moetron_section(w, c);
    jw_end_object(w);
}

// ---- reading ------------------------------------------------------------------------------

// Render a JSON scalar as the text a flag would be given on the command line.
static int json_scalar_text(const JsonValue *v, char *out, size_t cap) {
    switch (v->type) {
    case JSON_BOOL: snprintf(out, cap, "%d", v->boolean); return 1;
    case JSON_NUMBER:
        if (v->has_int64) snprintf(out, cap, "%lld", (long long)v->integer);
        else snprintf(out, cap, "%.17g", v->number);
        return 1;
    case JSON_STRING: snprintf(out, cap, "%s", v->string); return 1;
    default: return 0;
    }
}

static int flag_values_equal(const Config *a, const Config *b, const FlagSpec *f) {
    const char *x = (const char *)a + f->offset, *y = (const char *)b + f->offset;
    return f->type == FLAG_STRING ? strcmp(x, y) == 0 : memcmp(x, y, f->size) == 0;
}

static void restore_moetron_flags(Config *c, const JsonValue *flags, const char *path) {
    for (int i = 0; i < config_flag_count(); i++) {
        const FlagSpec *f = config_flag(i);
        const JsonValue *v = json_get(flags, f->name);
        if (!v || !strcmp(f->name, "load")) continue;
        char text[4200];
        if (!json_scalar_text(v, text, sizeof(text)))
            mt_die("%s: moetron.flags.%s must be a number, boolean or string", path, f->name);
        if (!c->flag_given[i]) {
            config_set_flag(c, f, text);
            continue;
        }
        Config saved = *c;
        config_set_flag(&saved, f, text);
        if (f->architecture && !flag_values_equal(c, &saved, f))
            mt_die("--%s differs from the checkpoint %s (which has %s); drop the flag to use the checkpoint's model",
                   f->name, path, text);
    }
}

static int hf_int(const JsonValue *root, const char *key, const char *path, int required) {
    int64_t v;
    if (json_get_int64(root, key, &v)) return (int)v;
    if (required) mt_die("%s: missing or non-integer \"%s\"", path, key);
    return -1;
}

static double hf_double(const JsonValue *root, const char *key, double fallback) {
    double v;
    return json_get_number(root, key, &v) ? v : fallback;
}

// Model shape from a plain Hugging Face config (no moetron section).
static void restore_hf_shape(Config *c, const JsonValue *root, const char *path) {
    const char *type = json_get_string(root, "model_type");
    if (!type || (strcmp(type, "qwen3_moe") && strcmp(type, "mixtral")))
        mt_die("%s: model_type %s is not supported; moetron reads qwen3_moe and mixtral", path,
               type ? type : "(missing)");
    int qwen = !strcmp(type, "qwen3_moe");
    for (int i = 0; i < config_flag_count(); i++)
        if (config_flag(i)->architecture && c->flag_given[i])
            mt_die("--%s: the model shape comes from %s; drop the flag", config_flag(i)->name, path);
    c->num_layers = hf_int(root, "num_hidden_layers", path, 1);
    c->hidden_size = hf_int(root, "hidden_size", path, 1);
    c->num_attention_heads = hf_int(root, "num_attention_heads", path, 1);
    int kv = hf_int(root, "num_key_value_heads", path, 0);
    c->group_query_attention = kv > 0 && kv != c->num_attention_heads;
    c->num_query_groups = kv > 0 ? kv : c->num_attention_heads;
    int head_dim = hf_int(root, "head_dim", path, 0);
    c->kv_channels = head_dim > 0 ? head_dim : 0;
    c->vocab_size = hf_int(root, "vocab_size", path, 1);
    c->make_vocab_size_divisible_by = 1;
    int max_pos = hf_int(root, "max_position_embeddings", path, 0);
    c->max_position_embeddings = max_pos > 0 ? max_pos : 0;
    if (c->seq_length > c->max_position_embeddings && c->max_position_embeddings > 0)
        c->seq_length = c->max_position_embeddings;
    // defaults for absent keys are those of the transformers config classes
    c->norm_epsilon = hf_double(root, "rms_norm_eps", qwen ? 1e-6 : 1e-5);
    const JsonValue *rope = json_get(root, "rope_parameters");
    double default_theta = qwen ? 10000 : 1e6;
    c->rotary_base = hf_double(rope ? rope : root, "rope_theta", hf_double(root, "rope_theta", default_theta));
    snprintf(c->moe_aux_loss_coeff, sizeof(c->moe_aux_loss_coeff), "%.17g", hf_double(root, "router_aux_loss_coef", 0.001));
    int tied = 0;
    json_get_bool(root, "tie_word_embeddings", &tied);
    c->untie_embeddings_and_output_weights = !tied;
    c->qk_layernorm = qwen;
    c->moe_router_topk = hf_int(root, "num_experts_per_tok", path, 1);
    // Qwen3-MoE's config class maps num_experts to num_local_experts, and transformers
    // writes the latter: accept either name for both families.
    int experts = hf_int(root, qwen ? "num_experts" : "num_local_experts", path, 0);
    c->num_experts = experts >= 0 ? experts : hf_int(root, qwen ? "num_local_experts" : "num_experts", path, 0);
    if (c->num_experts < 0) mt_die("%s: missing or non-integer \"num_experts\" / \"num_local_experts\"", path);
    c->moe_ffn_hidden_size = hf_int(root, qwen ? "moe_intermediate_size" : "intermediate_size", path, 1);
    c->ffn_hidden_size = qwen ? hf_int(root, "intermediate_size", path, 1) : c->moe_ffn_hidden_size;
    int norm_topk = !qwen;  // Mixtral always renormalises; Qwen3-MoE's default is false
    if (qwen) json_get_bool(root, "norm_topk_prob", &norm_topk);
    c->moe_router_pre_softmax = !norm_topk;
    if (qwen) {  // layer l is MoE unless listed in mlp_only_layers or off the sparse step
        int step = hf_int(root, "decoder_sparse_step", path, 0);
        if (step <= 0) step = 1;
        int moe[MT_MAX_LAYERS];
        for (int l = 0; l < c->num_layers && l < MT_MAX_LAYERS; l++) moe[l] = (l + 1) % step == 0;
        const JsonValue *dense = json_get(root, "mlp_only_layers");
        for (size_t i = 0; dense && dense->type == JSON_ARRAY && i < dense->count; i++) {
            int64_t l;
            if (json_as_int64(&dense->items[i], &l) && l >= 0 && l < c->num_layers && l < MT_MAX_LAYERS) moe[l] = 0;
        }
        size_t at = 0;
        at += snprintf(c->moe_layer_freq + at, sizeof(c->moe_layer_freq) - at, "[");
        for (int l = 0; l < c->num_layers && at < sizeof(c->moe_layer_freq) - 4; l++)
            at += snprintf(c->moe_layer_freq + at, sizeof(c->moe_layer_freq) - at, "%s%d", l ? "," : "", moe[l]);
        snprintf(c->moe_layer_freq + at, sizeof(c->moe_layer_freq) - at, "]");
    } else {
        strcpy(c->moe_layer_freq, "1");
    }
}

void config_from_checkpoint(Config *c, const char *ckpt_dir) {
    char path[MT_PATH_MAX + 32], err[512];
    snprintf(path, sizeof(path), "%s/config.json", ckpt_dir);
    JsonValue *root = json_parse_file(path, err, sizeof(err));
    if (!root) mt_die("%s: %s", path, err);
    if (root->type != JSON_OBJECT) mt_die("%s: expected a JSON object", path);
    const JsonValue *section = json_get(root, "moetron");
    const JsonValue *flags = section ? json_get(section, "flags") : NULL;
    if (section && (!flags || flags->type != JSON_OBJECT))
        mt_die("%s: the \"moetron\" section has no \"flags\" object; the checkpoint is damaged", path);
    if (flags) restore_moetron_flags(c, flags, path);
    else restore_hf_shape(c, root, path);
    json_free(root);
    config_validate(c);
}
