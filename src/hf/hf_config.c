#include "hf/hf_config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "data/dataset.h"
#include "hf/hf_config_read.h"
#include "hf/hf_fp8.h"
#include "tokenizer/run_tokenizer.h"

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
        if (!(f->commands & CMD_TRAIN) || f->size == 0) continue;  // compat flags store nothing
        jw_key(w, f->name);
        write_flag_value(w, c, f);
    }
    jw_end_object(w);
    jw_end_object(w);
}

static void write_id_or_null(JsonWriter *w, const char *key, int32_t id) {
    jw_key(w, key);
    if (id >= 0) jw_int(w, id);
    else jw_null(w);
}

// The run's tokenizer's end-of-text and beginning-of-text ids (null when it has none);
// 256 for byte-level models.
static void write_special_ids(JsonWriter *w, const Config *c) {
    const RunTokenizer *rt = c->run_tokenizer;
    write_id_or_null(w, "eos_token_id", rt ? rt->eos_id : BYTE_EOD_TOKEN);
    write_id_or_null(w, "bos_token_id", rt ? rt->bos_id : BYTE_EOD_TOKEN);
}

// --ckpt-dtype fp8: DeepSeek-V3's own quantization_config (hf_fp8.h), which transformers'
// FineGrainedFP8 quantizer reads.
static void write_quantization_config(JsonWriter *w) {
    jw_key(w, "quantization_config");
    jw_begin_object(w);
    jw_kv_string(w, "activation_scheme", "dynamic");
    jw_kv_string(w, "fmt", "e4m3");
    jw_kv_string(w, "quant_method", "fp8");
    jw_key(w, "weight_block_size");
    jw_begin_array(w);
    jw_int(w, HF_FP8_BLOCK);
    jw_int(w, HF_FP8_BLOCK);
    jw_end_array(w);
    jw_end_object(w);
}

// rope_parameters as transformers v5 reads them: the type and theta, and YaRN's, Llama 3's
// or linear interpolation's parameters (model/rope_scaling.h).
static void write_rope_parameters(JsonWriter *w, const Config *c) {
    int yarn = !strcmp(c->rope_type, "yarn"), linear = !yarn && c->rotary_seq_len_interpolation_factor > 0;
    int llama3 = c->use_rope_scaling;
    jw_key(w, "rope_parameters");
    jw_begin_object(w);
    jw_kv_string(w, "rope_type", yarn ? "yarn" : linear ? "linear" : llama3 ? "llama3" : "default");
    jw_kv_double(w, "rope_theta", c->rotary_base);
    if (linear) jw_kv_double(w, "factor", c->rotary_seq_len_interpolation_factor);
    if (llama3) {
        jw_kv_double(w, "factor", c->rope_scaling_factor);
        jw_kv_double(w, "low_freq_factor", 1);
        jw_kv_double(w, "high_freq_factor", 4);
        jw_kv_int(w, "original_max_position_embeddings", c->original_max_position_embeddings);
    }
    if (yarn) {
        jw_kv_double(w, "factor", c->rotary_scaling_factor);
        jw_kv_int(w, "original_max_position_embeddings", c->original_max_position_embeddings);
        jw_kv_double(w, "beta_fast", c->beta_fast);
        jw_kv_double(w, "beta_slow", c->beta_slow);
        jw_kv_double(w, "mscale", c->mscale);
        jw_kv_double(w, "mscale_all_dim", c->mscale_all_dim);
    }
    jw_end_object(w);
}

// Keys every family shares.
static void write_common(JsonWriter *w, const Config *c, HfFamily family) {
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
    if (!c->multi_latent_attention) jw_kv_int(w, "head_dim", c->head_dim);
    jw_kv_string(w, "hidden_act", "silu");
    jw_kv_int(w, "max_position_embeddings", c->max_positions);
    jw_kv_double(w, "rms_norm_eps", c->norm_epsilon);
    jw_kv_double(w, "rope_theta", c->rotary_base);
    write_rope_parameters(w, c);
    jw_kv_bool(w, "tie_word_embeddings", !c->untie_embeddings_and_output_weights);
    jw_kv_bool(w, "attention_bias", 0);
    jw_kv_double(w, "attention_dropout", 0);
    jw_kv_double(w, "initializer_range", c->init_method_std);
    write_special_ids(w, c);
    jw_kv_string(w, "torch_dtype", c->ckpt_bf16 ? "bfloat16" : "float32");
    jw_kv_string(w, "dtype", c->ckpt_bf16 ? "bfloat16" : "float32");
    if (c->ckpt_fp8) write_quantization_config(w);
    jw_kv_bool(w, "use_cache", 1);
    jw_kv_bool(w, "output_router_logits", 0);
    jw_kv_double(w, "router_aux_loss_coef", c->balance_coeff[0]);
    jw_kv_int(w, "num_experts_per_tok", c->moe_router_topk);
}

static void write_qwen3_keys(JsonWriter *w, const Config *c) {
    jw_kv_int(w, "num_experts", c->num_experts);
    jw_kv_int(w, "moe_intermediate_size", c->num_experts ? c->moe_ffn : c->ffn_hidden_size);
    jw_kv_int(w, "intermediate_size", c->ffn_hidden_size);
    jw_kv_int(w, "decoder_sparse_step", 1);
    write_dense_layer_list(w, c);
    jw_kv_bool(w, "norm_topk_prob", !c->moe_router_pre_softmax);
    jw_kv_bool(w, "use_sliding_window", 0);
}

static void write_olmoe_keys(JsonWriter *w, const Config *c) {
    jw_kv_int(w, "num_experts", c->num_experts);
    jw_kv_int(w, "intermediate_size", c->moe_ffn);
    jw_kv_bool(w, "norm_topk_prob", !c->moe_router_pre_softmax);
    jw_key(w, "clip_qkv");
    if (c->clip_qkv > 0) jw_double(w, c->clip_qkv);
    else jw_null(w);
}

static void write_deepseek_keys(JsonWriter *w, const Config *c) {
    int first_dense = 0;
    while (first_dense < c->num_layers && !c->moe_layer[first_dense]) first_dense++;
    jw_kv_int(w, "n_routed_experts", c->num_experts);
    jw_kv_int(w, "moe_intermediate_size", c->moe_ffn);
    jw_kv_int(w, "intermediate_size", c->ffn_hidden_size);
    jw_kv_int(w, "n_shared_experts", c->moe_shared_expert_intermediate_size / c->moe_ffn);
    jw_kv_double(w, "routed_scaling_factor", c->moe_router_topk_scaling_factor > 0 ? c->moe_router_topk_scaling_factor : 1);
    jw_kv_int(w, "n_group", c->moe_router_num_groups ? c->moe_router_num_groups : 1);
    jw_kv_int(w, "topk_group", c->moe_router_num_groups ? c->moe_router_group_topk : 1);
    jw_kv_int(w, "first_k_dense_replace", first_dense);
    jw_kv_bool(w, "norm_topk_prob", c->moe_router_topk > 1);  // sigmoid probs are renormalised for k > 1
    jw_key(w, "q_lora_rank");
    if (c->q_lora_rank) jw_int(w, c->q_lora_rank);
    else jw_null(w);
    jw_kv_int(w, "kv_lora_rank", c->kv_lora_rank);
    jw_kv_int(w, "qk_nope_head_dim", c->qk_head_dim);
    jw_kv_int(w, "qk_rope_head_dim", c->qk_pos_emb_head_dim);
    jw_kv_int(w, "v_head_dim", c->v_head_dim);
    jw_kv_bool(w, "rope_interleave", c->rotary_interleaved);
    jw_kv_int(w, "num_nextn_predict_layers", c->mtp_num_layers);
}

void hf_config_write(JsonWriter *w, const Config *c, HfFamily family) {
    jw_begin_object(w);
    write_common(w, c, family);
    switch (family) {
    case HF_MIXTRAL:
        jw_kv_int(w, "num_local_experts", c->num_experts);
        jw_kv_int(w, "intermediate_size", c->moe_ffn);
        jw_kv_double(w, "router_jitter_noise", 0);
        break;
    case HF_OLMOE: write_olmoe_keys(w, c); break;
    case HF_DEEPSEEK_V3: write_deepseek_keys(w, c); break;
    case HF_QWEN3_MOE:
    case HF_MOETRON:
    default: write_qwen3_keys(w, c); break;
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

// Flags of the launch rather than of the run: a checkpoint resumes on any process layout,
// any device and any activation recomputation (and an upcycled one as the MoE model it is).
static int is_launch_flag(const char *name) {
    static const char *const launch[] = {"load", "device", "bf16", "tensor-model-parallel-size", "context-parallel-size",
                                         "pipeline-model-parallel-size", "expert-model-parallel-size",
                                         "expert-tensor-parallel-size", "cp-comm-type",
                                         "hierarchical-context-parallel-sizes", "adapt-threads",
                                         "pipeline-model-parallel-layout", "decoder-first-pipeline-num-layers",
                                         "decoder-last-pipeline-num-layers", "account-for-embedding-in-pipeline-split",
                                         "account-for-loss-in-pipeline-split", "num-layers-per-virtual-pipeline-stage",
                                         "num-virtual-stages-per-pipeline-rank",
                                         "microbatch-group-size-per-virtual-pipeline-stage",
                                         "moe-shared-expert-overlap", "overlap-moe-expert-parallel-comm",
                                         "delay-wgrad-compute", "recompute-granularity", "recompute-method",
                                         "recompute-num-layers", "recompute-modules", "recompute-activations",
                                         "distribute-saved-activations", "moe-use-upcycling",
                                         "moe-upcycling-granularity", "finetune", "no-load-optim", "no-load-rng"};
    for (size_t i = 0; i < sizeof(launch) / sizeof(launch[0]); i++)
        if (!strcmp(name, launch[i])) return 1;
    return 0;
}

// Nor does an upcycled run save into the dense checkpoint's directory: only where --save says.
static int upcycling_leaves(const Config *c, const char *flag) { return c->moe_use_upcycling && !strcmp(flag, "save"); }

// --finetune starts a new run from the weights: its logs are its own, not the checkpoint's
// run's (whose records and events a run from step 0 would otherwise cut and mix into).
static int finetune_leaves(const Config *c, const char *flag) {
    return c->finetune && (!strcmp(flag, "log-jsonl") || !strcmp(flag, "tensorboard-dir"));
}

// Quantile balancing keeps a tensor per MoE layer (and its own checkpoint family): a resumed
// run keeps or leaves it as the checkpoint did.
static void keep_quantile_balancing(const Config *c, const JsonValue *flags, const char *path) {
    if (c->moe_use_upcycling) return;  // a new MoE model, balanced as the command line says
    const JsonValue *v = json_get(flags, "moe-router-load-balancing-type");
    char saved[256] = "";
    if (!v || !json_scalar_text(v, saved, sizeof saved)) return;
    int was = strstr(saved, "quantile_balancing") != NULL;
    int is = strstr(c->moe_router_load_balancing_type, "quantile_balancing") != NULL;
    if (was != is)
        mt_die("--moe-router-load-balancing-type: %s was trained %s quantile_balancing (its bias tensors and checkpoint "
               "family go with it); keep the checkpoint's balancing type", path, was ? "with" : "without");
}

// A model flag given on the command line that a checkpoint saved before the flag existed
// (its model has the flag's default) cannot take another value.
static void check_flag_newer_than_checkpoint(const Config *c, const FlagSpec *f, int index, const char *path) {
    if (!f->architecture || !c->flag_given[index] || config_upcycling_reshapes(c, f->name)) return;
    Config defaults;
    config_defaults(&defaults);
    if (!flag_values_equal(c, &defaults, f))
        mt_die("--%s differs from the checkpoint %s (saved before the flag existed: its model has the default); drop "
               "the flag to use the checkpoint's model", f->name, path);
}

static void restore_moetron_flags(Config *c, const JsonValue *flags, const char *path) {
    for (int i = 0; i < config_flag_count(); i++) {
        const FlagSpec *f = config_flag(i);
        const JsonValue *v = json_get(flags, f->name);
        if (f->size == 0 || is_launch_flag(f->name) || upcycling_leaves(c, f->name) || finetune_leaves(c, f->name))
            continue;  // size 0: a no-op flag
        if (!v) {
            check_flag_newer_than_checkpoint(c, f, i, path);
            continue;
        }
        char text[sizeof(c->data_path) + 64];  // the longest flag value
        if (!json_scalar_text(v, text, sizeof(text)))
            mt_die("%s: moetron.flags.%s must be a number, boolean or string", path, f->name);
        if (!c->flag_given[i]) {
            config_note_file_key(c, (char *)c + f->offset, f->name);
            config_set_flag(c, f, text);
            continue;
        }
        Config saved = *c;
        config_set_flag(&saved, f, text);
        if (f->architecture && !flag_values_equal(c, &saved, f) && !config_upcycling_reshapes(c, f->name))
            mt_die("--%s differs from the checkpoint %s (which has %s); drop the flag to use the checkpoint's model",
                   f->name, path, text);
    }
    keep_quantile_balancing(c, flags, path);
}

// A tokenizer.json beside the weights is the model's tokenizer unless --tokenizer-model
// names another; else a tokenizer.model (a SentencePiece model a run with
// --tokenizer-type SentencePieceTokenizer saved), read as SentencePieceTokenizer unless
// --tokenizer-type says otherwise.
static void use_directory_tokenizer(Config *c, const char *ckpt_dir) {
    char path[MT_PATH_MAX + 32];
    static const char sentencepiece[] = "SentencePieceTokenizer";
    static const char huggingface[] = "HuggingFaceTokenizer";
    if (config_flag_given(c, "tokenizer-model")) return;
    snprintf(path, sizeof(path), "%s/tokenizer.json", ckpt_dir);
    if (access(path, R_OK) != 0) {
        snprintf(path, sizeof(path), "%s/tokenizer.model", ckpt_dir);
        if (access(path, R_OK) != 0) return;
        if (!c->tokenizer_type[0]) memcpy(c->tokenizer_type, sentencepiece, sizeof sentencepiece);
    } else if (!strcmp(c->tokenizer_type, "GPT2BPETokenizer") && !config_flag_given(c, "vocab-file") &&
               !config_flag_given(c, "merge-file")) {
        // the checkpoint holds vocab.json and merges.txt as the tokenizer.json they make: read
        // that, never the files' original paths again
        memcpy(c->tokenizer_type, huggingface, sizeof huggingface);
        c->vocab_file[0] = c->merge_file[0] = 0;
    }
    if (strlen(path) >= sizeof(c->tokenizer_model))
        mt_die("--load %s: the path of its tokenizer.json is longer than %d bytes", ckpt_dir, MT_PATH_MAX - 1);
    memcpy(c->tokenizer_model, path, strlen(path) + 1);
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
    config_values_from_file(c, path, flags ? "moetron.flags." : "");
    if (flags) {
        restore_moetron_flags(c, flags, path);
        // the rows the weights have, padded for the layout that saved them: kept on any other
        int64_t rows;
        if (json_get_int64(root, "vocab_size", &rows)) {
            if (rows < 1 || rows > INT32_MAX)
                mt_die("%s: \"vocab_size\" %lld is out of range; the checkpoint is damaged", path, (long long)rows);
            c->checkpoint_vocab_rows = (int)rows;
        }
    } else {
        hf_config_read_plain(c, root, path);
    }
    json_free(root);
    use_directory_tokenizer(c, ckpt_dir);
    config_validate(c);
}
