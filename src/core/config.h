// config.h — every setting of a run, named after its Megatron-LM flag
// (--num-layers -> num_layers). Filled by args.c from defaults, a checkpoint and the
// command line, then validated in one place (config_validate) before any work starts.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define MT_MAX_LAYERS 256
#define MT_PATH_MAX 1024
#define MT_FLAG_SLOTS 320  // at least the number of flags (checked in args.c)

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE, LR_WSD } LrDecayStyle;
typedef enum { WSD_LINEAR, WSD_COSINE, WSD_EXPONENTIAL, WSD_MINUS_SQRT } WsdDecayStyle;

typedef struct {
    // ---- model shape ----
    int num_layers;
    int mtp_num_layers;           // multi-token prediction depths after the decoder (0 = none)
    double mtp_loss_scaling_factor;  // the MTP losses' weight: factor / depths each
    int hidden_size;
    int ffn_hidden_size;          // dense SwiGLU width
    int num_attention_heads;
    int group_query_attention;    // bool
    int num_query_groups;         // kv heads when group_query_attention
    int kv_channels;              // head dim; 0 = hidden_size / num_attention_heads
    int seq_length;
    int max_position_embeddings;  // 0 = seq_length
    int vocab_size;               // tokenizer vocabulary (before padding)
    int make_vocab_size_divisible_by;
    double norm_epsilon;
    double rotary_base;
    int rotary_interleaved;       // rotate pairs (2i, 2i+1) instead of (i, i + d/2)
    // RoPE scaling (model/rope_scaling.h): plain, YaRN or linear position interpolation
    char rope_type[16];           // rope | yarn
    double rotary_scaling_factor; // yarn: the context extension factor s
    int original_max_position_embeddings;  // yarn, llama 3: the pretraining context (0: 4096 yarn, 8192 llama 3)
    double beta_fast, beta_slow;  // yarn: the ramp's ends, in rotations over that context
    double mscale, mscale_all_dim;  // yarn: the attention-scale terms (MLA: softmax scale too)
    double rotary_seq_len_interpolation_factor;  // linear interpolation: positions / factor (0 = off)
    int use_rope_scaling;         // Llama 3's frequency scaling (Megatron's --use-rope-scaling)
    double rope_scaling_factor;   // its factor
    int qk_layernorm;
    char qk_layernorm_scope[16];  // head | projection (OLMoE: one norm over all heads)
    double clip_qkv;              // clamp q, k, v to [-x, x] after projection (0 = off)
    // Multi-Latent Attention (DeepSeek-V2/V3)
    int multi_latent_attention;
    int q_lora_rank;              // 0 = queries projected directly (no low-rank q)
    int kv_lora_rank;
    int qk_head_dim;              // per-head query/key width without position embedding
    int qk_pos_emb_head_dim;      // rotary part, one key shared by all heads
    int v_head_dim;
    int untie_embeddings_and_output_weights;
    double init_method_std;
    // Megatron compatibility: accepted so Megatron scripts run; only these values exist.
    int swiglu, disable_bias_linear;
    char normalization[32];            // RMSNorm
    char position_embedding_type[32];  // rope
    // ---- mixture of experts ----
    int num_experts;              // 0 = dense model
    int moe_ffn_hidden_size;      // 0 = ffn_hidden_size
    int moe_router_topk;
    char moe_layer_freq[1024];    // "1", "2" or a list "[0,1,1,1]"
    int moe_router_pre_softmax;
    char moe_router_score_function[32];       // softmax | sigmoid | sqrtsoftplus
    double moe_router_topk_scaling_factor;    // 0 = none
    int moe_router_num_groups, moe_router_group_topk;
    int moe_router_enable_expert_bias;
    double moe_router_bias_update_rate;
    char moe_router_load_balancing_type[128]; // list: aux_loss seq_aux_loss global_aux_loss | none
    char moe_aux_loss_coeff[128];             // list, one per load-balancing type
    double moe_z_loss_coeff;
    double moe_input_jitter_eps;
    double attention_dropout, hidden_dropout;  // training only, 0 = off (model/dropout.h)
    char moe_router_dtype[16];                // fp32 | fp64
    double moe_expert_capacity_factor;        // 0 = dropless
    char moe_token_drop_policy[16];           // probs | position
    int moe_pad_expert_input_to_capacity;
    int moe_shared_expert_intermediate_size;  // 0 = no shared expert
    int moe_latent_size;          // routed experts' width L (fc1/fc2 latent projections); 0 = off (H)
    int moe_shared_expert_gate;
    int moe_router_force_load_balancing;
    double moe_router_quantile_balancing_ema;  // quantile balancing: the bias's memory (0 = none)
    int moe_use_upcycling;         // --load names a dense checkpoint: its MLPs become the experts
    int moe_upcycling_granularity; // each dense MLP cut into this many experts' widths (granular upcycling)
    char moe_routing_trace_path[MT_PATH_MAX];  // per-rank JSONL of the training top-k picks ("" = off)
    int moe_enable_routing_replay;             // read the picks from that trace instead of choosing them
    int moe_per_layer_logging;
    // ---- training ----
    int micro_batch_size;
    int global_batch_size;
    int train_iters;
    int exit_interval;            // stop (after saving) at multiples of this step
    double exit_duration_in_mins; // stop (after saving) once the run has lasted this long (0 = never)
    int exit_signal_handler;      // SIGTERM / SIGINT: finish the step, save, exit 0
    int check_for_nan_in_loss_and_grad;  // skip steps whose loss or gradient is not finite
    int nan_skip_limit;           // ... and stop after this many in a row
    double loss_spike_factor;     // report a loss above this multiple of the recent mean (0 = never)
    int keep_checkpoints;         // keep the newest N iteration directories (0 = all)
    double distributed_timeout_minutes;  // a collective waiting longer ends the job
    double lr, min_lr;
    int lr_warmup_iters;
    double lr_warmup_fraction;    // warmup = this x the decay steps (0 = --lr-warmup-iters / -samples)
    double lr_warmup_init;        // the learning rate warmup starts from
    int64_t train_samples;        // sample-based runs: train_iters = this / global batch (0 = --train-iters)
    int64_t lr_warmup_samples, lr_decay_samples, lr_wsd_decay_samples;  // the schedule in samples
    char lr_decay_style[32];
    int lr_decay_iters;           // 0 = train_iters
    int lr_wsd_decay_iters;
    char lr_wsd_decay_style[32];
    double weight_decay, adam_beta1, adam_beta2, adam_eps, clip_grad;
    int seed;
    int eval_interval, eval_iters;
    // ---- parallelism (docs/parallelism.md): group sizes; dp and edp follow from the world size ----
    int tensor_model_parallel_size, context_parallel_size, pipeline_model_parallel_size;
    int sequence_parallel;
    // pipeline placement and schedule (model/pipeline_layout.h, train/pp_schedule.h)
    char pipeline_model_parallel_layout[1024];  // Megatron's layout string, "" = counted split
    int decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers;  // -1 = even split
    int account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split;
    int num_layers_per_virtual_pipeline_stage, num_virtual_stages_per_pipeline_rank;  // 0 = not given
    int microbatch_group_size_per_vp_stage;  // interleaved schedule's micro-batch groups (0 = PP)
    // expert-parallel communication hidden behind compute (docs/parallelism.md)
    int moe_shared_expert_overlap;         // the shared expert computes while routed rows travel
    int overlap_moe_expert_parallel_comm;  // one micro-batch's exchanges behind another's compute
    int delay_wgrad_compute;               // experts' weight gradients while their input gradients travel
    char cp_comm_type[1024];       // list: p2p | a2a | allgather | a2a+p2p, one for all layers or one per layer
    char hierarchical_context_parallel_sizes[64];  // list: inner outer (a2a+p2p)
    int expert_model_parallel_size, expert_tensor_parallel_size;
    // activation recomputation (docs/memory.md): which layers keep only their input and run
    // their forward again just before their backward
    char recompute_granularity[16];  // "" (none) | full | selective
    char recompute_method[16];       // "" | uniform (groups of N layers) | block (the first N of a chunk)
    int recompute_num_layers;        // N; 0 = not given
    char recompute_modules[128];     // list: what selective recomputation recomputes (RecomputeModule)
    int recompute_activations;       // --recompute-activations: sets recompute_granularity selective
    int distribute_saved_activations;  // refused (config_validate): --sequence-parallel does it
    int profile;                    // --profile: time per op kind, printed at the end
    int adapt_threads;              // --adapt-threads: the thread governor (train/thread_governor.h)
    int use_distributed_optimizer;  // ZeRO-1: optimizer state sharded over the data-parallel ranks
    int plan_world_size;            // moetron plan --world-size (0: the fewest the layout needs)
    // --use-precision-aware-optimizer (docs/memory.md): the AdamW moments stored narrower
    int use_precision_aware_optimizer;
    char main_grads_dtype[8];       // fp32 (moetron's gradients are fp32)
    char main_params_dtype[8];      // fp32 (moetron's weights are fp32: their own main parameters)
    char exp_avg_dtype[8];          // fp32 | bf16 | fp16 | fp8
    char exp_avg_sq_dtype[8];       // fp32 | bf16 | fp16 | fp8
    int optimizer_cpu_offload;         // the optimizer's state and step on the host (docs/memory.md)
    double optimizer_offload_fraction;  // of the state (by elements, in tensor order) offloaded
    char device[16];              // cpu | cuda | auto
    int bf16;                     // GEMM inputs rounded to bf16, fp32 accumulation (docs/precision.md)
    int fp32_residual_connection; // --bf16 keeps the residual stream fp32 (else bf16 on the cpu)
    int fp16;                     // GEMM inputs rounded to IEEE half, fp32 accumulation, loss scaling
    double loss_scale;            // > 0: a constant loss scale (fp16, bf16 or the distributed optimizer)
    double initial_loss_scale;    // --fp16's dynamic loss scaling: its first scale,
    double min_loss_scale;        //   the lowest it backs off to,
    double loss_scale_window;     //   steps without an overflow before the scale doubles,
    int hysteresis;               //   overflowing steps (since the last growth) before it halves
    // FP8 / FP4 training (docs/precision.md, "FP8 and FP4 training"): Megatron-LM's flags
    char fp8_format[16];          // "" (off) | e4m3 | hybrid (E4M3 forward, E5M2 gradients)
    char fp8_recipe[16];          // delayed | tensorwise | blockwise | mxfp8
    int fp8_amax_history_len;     // delayed: amaxes in the window
    char fp8_amax_compute_algo[16];  // delayed: most_recent | max
    int fp8_margin;               // delayed: the scale divided by 2^margin
    char fp4_format[16];          // "" (off) | e2m1
    char fp4_recipe[16];          // nvfp4
    int first_last_layers_bf16;   // the first / last layers' GEMMs unquantized
    int moe_router_padding_for_quantization;  // experts' rows rounded up (LayoutPlan.expert_row_align)
    int num_layers_at_start_in_bf16, num_layers_at_end_in_bf16;
    char moe_token_dispatcher_type[16];  // alltoall | allgather (how tokens reach experts on other EP ranks)
    // ---- data ----
    int mock_data;
    char data_path[8192];         // list: a byte text file, or Megatron prefixes with optional weights "0.3 A 0.7 B"
    char train_data_path[8192], valid_data_path[8192], test_data_path[8192];  // lists, as --data-path
    char data_cache_path[MT_PATH_MAX];  // where sample-index caches go ("" = beside the data)
    char split[64];
    int eod_mask_loss;            // no loss where the input token is end-of-document (as Megatron-Core)
    int reset_position_ids;       // positions restart after each end-of-document
    int reset_attention_mask;     // tokens attend only within their document
    int64_t mock_data_tokens;
    // ---- checkpoints and logging ----
    char save[MT_PATH_MAX];
    int save_interval;
    char load[MT_PATH_MAX];
    int finetune;                 // --load: the weights only; iteration 0, fresh optimizer, schedule, RNG, data
    int no_load_optim;            // --load: fresh AdamW moments, loss scaler and learning-rate schedule
    int no_load_rng;              // --load: the random streams start afresh at the loaded iteration
    int log_interval;
    char log_jsonl[MT_PATH_MAX];
    // TensorBoard (Megatron-LM's flags; docs/metrics.md, "TensorBoard")
    char tensorboard_dir[MT_PATH_MAX];  // event files written here by world rank 0 ("" = none)
    int tensorboard_log_interval;       // scalars of every N-th step
    int tensorboard_queue_size;         // accepted; moetron writes each logged step at once
    int log_timers_to_tensorboard;      // iteration-time (and throughput with log_throughput)
    int log_validation_ppl_to_tensorboard;
    int log_memory_to_tensorboard;
    int log_world_size_to_tensorboard;
    int log_loss_scale_to_tensorboard;  // on by default, as Megatron's
    int log_params_norm;                // the L2 norm of the parameters after each logged step
    int log_num_zeros_in_grad;          // count the zeros of the clipped gradients each step
    int log_throughput;                 // TFLOP/s per process in TensorBoard (with the timers)
    // Weights & Biases: accepted for Megatron scripts, nothing is sent (a note says so)
    char wandb_project[256];
    char wandb_exp_name[256];
    char wandb_save_dir[MT_PATH_MAX];
    char wandb_entity[256];
    double peak_tflops;
    char hf_architecture[32];     // auto | mixtral | qwen3_moe | olmoe | deepseek_v3
    char ckpt_dtype[16];          // fp32 | bf16 | fp8: weights in model safetensors
    char max_shard_size[32];      // "5GB", "500MB", bytes: split model safetensors above this
    char tokenizer_model[MT_PATH_MAX]; // tokenizer.json, its directory, or a SentencePiece .model
    char tokenizer_type[32];      // Megatron-LM's --tokenizer-type ("": tokenizer.json when --tokenizer-model is given)
    char vocab_file[MT_PATH_MAX]; // GPT2BPETokenizer: vocab.json
    char merge_file[MT_PATH_MAX]; // GPT2BPETokenizer: merges.txt           // 0 = measure this machine's GEMM ceiling at start-up
    // ---- generate ----
    char prompt[4096];
    int max_new_tokens;
    double temperature;
    int top_k;
    double top_p;  // nucleus sampling in generate (1 = off)
    // ---- forward ----
    char input[MT_PATH_MAX];
    char dump[MT_PATH_MAX];
    int grads;
    // ---- data (moetron data) ----
    int64_t num_samples;
    // ---- prepare ----
    char json_keys[256];          // list of keys of a .jsonl input
    char output_prefix[MT_PATH_MAX];
    int append_eod;
    int workers;
    // ---- report ----
    char report_run[MT_PATH_MAX];     // RUN, the one argument that is not a flag: a --log-jsonl file or its directory
    char report_output[MT_PATH_MAX];  // --output: the HTML page ("" = RUN's log with .html for .jsonl)

    // ---- derived by config_validate (not flags) ----
    int head_dim, kv_heads, padded_vocab_size, moe_ffn, max_positions;
    int rope_dim;                  // rotary width per head: head_dim, or qk_pos_emb_head_dim with MLA
    int qk_norm_whole;             // --qk-layernorm-scope projection
    int ckpt_bf16;                 // --ckpt-dtype bf16 or fp8: tensors not in FP8 are BF16, F32 master weights kept
    int ckpt_fp8;                  // --ckpt-dtype fp8: the linear layers' matrices FP8 with 128x128 block scales
    int64_t max_shard_bytes;       // --max-shard-size in bytes
    // ---- from a plain Hugging Face config.json (not flags) ----
    int checkpoint_vocab_rows;     // --load of a moetron checkpoint: its padded vocabulary (kept whatever the TP), else 0
    int hf_mtp_layers;             // DeepSeek-V3 num_nextn_predict_layers: layers after the last whose tensors are skipped
    int num_micro_batches;
    int decay_iters;               // --lr-decay-iters, or --train-iters when 0
    // the learning-rate schedule in optimizer steps (fractional for sample-based flags, as
    // Megatron's scheduler counts samples): warmup, decay and WSD's final decay
    double warmup_steps, decay_steps, wsd_decay_steps;
    double balance_coeff[3];       // per BalanceType (moe/router.h); 0 = off
    int sinkhorn_routing;          // --moe-router-load-balancing-type sinkhorn
    int quantile_balancing;        // --moe-router-load-balancing-type quantile_balancing
    int score_function;            // ScoreFunction
    int drop_policy;               // DropPolicy
    int router_fp64;
    int moe_layer[MT_MAX_LAYERS];  // 1 where layer l is an MoE layer (the MTP layers' after the decoder's)
    int cp_comm[MT_MAX_LAYERS];    // per layer: its --cp-comm-type (CpCommType)
    int moment_dtype[2];           // MomentDtype (ops/ops.h) of exp_avg, exp_avg_sq
    int quant_recipe;              // QuantRecipe (ops/quantized_linear.h) of --fp8-* / --fp4-*; 0 = off
    unsigned recompute_module_mask; // selective recomputation: 1 << RecomputeModule of each listed
    int cp_a2a_size;               // a2a+p2p: the inner (all-to-all) group of --hierarchical-context-parallel-sizes, else 1
    LrDecayStyle decay_style;
    WsdDecayStyle wsd_style;
    double split_fraction[3];      // train, valid, test
    unsigned char flag_given[MT_FLAG_SLOTS]; // per flag index: set on the command line
    const struct RunTokenizer *run_tokenizer;  // the run's tokenizer, read at start-up (run_tokenizer.h); NULL: bytes
    // ---- values read from a config.json (config_note_file_key): errors name the file's key ----
    char values_file[MT_PATH_MAX + 32];      // the file ("" = every value is a flag or a default)
    const char *values_key_prefix;           // "moetron.flags." for a checkpoint's flag section, else ""
    const char *value_key[MT_FLAG_SLOTS];    // per flag index: its key in values_file (NULL = not from it)
    unsigned command;                        // the Command running (set by config_parse_args; 0 = none)
} Config;

// --cp-comm-type: how a layer's attention runs over the context-parallel group (model/cp_attention.h).
typedef enum { CP_COMM_P2P, CP_COMM_A2A, CP_COMM_ALLGATHER, CP_COMM_A2A_P2P, CP_COMM_TYPES } CpCommType;
// --recompute-modules (Megatron-Core's names), in RECOMPUTE_MODULE_NAMES order.
typedef enum {
    RECOMPUTE_CORE_ATTN,       // the attention core's output and log-sum-exps
    RECOMPUTE_MOE_ACT,         // the routed experts' SwiGLU product
    RECOMPUTE_LAYERNORM,       // the two norms' outputs of each layer
    RECOMPUTE_MLP,             // the dense FFN's gate, up and product
    RECOMPUTE_SHARED_EXPERTS,  // the shared expert's gate, up and product
    RECOMPUTE_MLA_UP_PROJ,     // MLA's up projections: q, k, v and the per-head kv
    RECOMPUTE_MOE,             // the whole MoE block: router, dispatch, experts, shared expert
    RECOMPUTE_MODULES
} RecomputeModule;
extern const char *const RECOMPUTE_MODULE_NAMES[RECOMPUTE_MODULES];
extern const char *const CP_COMM_TYPE_NAMES[CP_COMM_TYPES];  // "p2p", "a2a", "allgather", "a2a+p2p"

typedef enum { CMD_TRAIN = 1, CMD_GENERATE = 2, CMD_FORWARD = 4, CMD_DATA = 8, CMD_PREPARE = 16, CMD_PLAN = 32, CMD_REPORT = 64 } Command;
#define CMD_LAST CMD_REPORT  // the highest command bit

// Every transformer layer of the model: the decoder's, then the multi-token-prediction
// depths' (layer num_layers + k is depth k's).
static inline int config_all_layers(const Config *c) { return c->num_layers + c->mtp_num_layers; }

void config_defaults(Config *c);
// Parse argv (after the command word) into c; unknown flags and bad values are fatal.
void config_parse_args(Config *c, Command cmd, int argc, char **argv);
// Whether --name was given on the command line (after config_parse_args).
int config_flag_given(const Config *c, const char *name);
// Check consistency and fill the derived fields; fatal with one clear line. Every integer
// flag and every size derived from flags (products such as tokens per micro-batch, widths,
// corpus sizes) is bounded here, so the code that sizes buffers from them cannot overflow.
// A value noted as read from a file is named by its key there: `FILE: "hidden_size" ...`.
void config_validate(Config *c);
// The GEMM inputs' precision of --bf16 / --fp16 (a GemmInputs of ops/gemm.h); known before
// validation, which a run with --load does only once the checkpoint's config is read.
int config_gemm_inputs(const Config *c);
// The values below came from `path` (a config.json); key_prefix goes before every key
// ("moetron.flags." for a checkpoint's flag section, "" for a Hugging Face config).
void config_values_from_file(Config *c, const char *path, const char *key_prefix);
// The flag stored at `field` (a field of c) was set from `key` of that file (a string that
// outlives c); errors about it name the key instead of the flag.
void config_note_file_key(Config *c, const void *field, const char *key);
// --moe-use-upcycling turns a dense checkpoint into an MoE model: the MoE flags of the
// command line (--num-experts, --moe-*) shape it, whatever the checkpoint says.
int config_upcycling_reshapes(const Config *c, const char *flag);
// Print the flag reference for a command (--help) or as markdown (docs/flags.md).
void config_print_help(Command cmd, int markdown);

// Iterate over the flags that describe the model and training (stored in checkpoints).
// FLAG_LIST: one or more values ("--flag a b" or "--flag a,b"), stored comma-separated.
typedef enum { FLAG_INT, FLAG_INT64, FLAG_DOUBLE, FLAG_BOOL, FLAG_STRING, FLAG_LIST } FlagType;
// What a flag does (docs/flags.md's status column): implemented; a Megatron-LM flag that
// only names an implementation choice moetron always makes (accepted, changes nothing;
// values outside `accepts` refused); a Megatron-LM flag for something moetron does not do
// (refused whenever given).
typedef enum { FLAG_IMPLEMENTED, FLAG_NOOP, FLAG_UNSUPPORTED } FlagStatus;
typedef struct {
    const char *name;   // without the leading "--"
    FlagType type;
    size_t offset;      // into Config
    size_t size;        // for strings: buffer size; 0: no field (FLAG_NOOP, FLAG_UNSUPPORTED flags store nothing)
    unsigned commands;  // Command mask where the flag is accepted
    int architecture;   // 1 when the flag shapes the model (must match a checkpoint)
    const char *help;
    FlagStatus status;
    const char *accepts;  // FLAG_NOOP: the values accepted, comma-separated (NULL: any of its type)
} FlagSpec;
// Set a flag from its textual value (the same checks as on the command line).
void config_set_flag(Config *c, const FlagSpec *f, const char *value);
int config_flag_count(void);
const FlagSpec *config_flag(int i);
