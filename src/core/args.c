// args.c — the flag table, the command-line parser and config validation.
//
// Every flag is described once in FLAGS below (name, type, where it lives in Config,
// which commands accept it, help text). Parsing, --help, docs/flags.md and the
// "moetron" section of checkpoint config.json all iterate over this table.
#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/config.h"
#include "core/device.h"
#include "core/layer_pattern.h"
#include "ops/gemm.h"
#include "ops/quantized_linear.h"
#include "parallel/pipeline_layout.h"

#define ALL (CMD_TRAIN | CMD_GENERATE | CMD_FORWARD)
#define DT (CMD_TRAIN | CMD_DATA)  // training data: train and `moetron data`
#define TR CMD_TRAIN
#define F(name, type, field, cmds, arch, help) \
    {name, type, offsetof(Config, field), sizeof(((Config *)0)->field), cmds, arch, help, FLAG_IMPLEMENTED, NULL}
// A Megatron-LM flag moetron keeps a field for whose only value is what moetron does.
#define F_NOOP(name, type, field, cmds, help) \
    {name, type, offsetof(Config, field), sizeof(((Config *)0)->field), cmds, 0, help, FLAG_NOOP, NULL}
// The entries of megatron_compat_flags.h: no field, checked as they are parsed.
#define NOOP(name, type, cmds, accepts, help) {name, type, 0, 0, cmds, 0, help, FLAG_NOOP, accepts}
#define UNSUPPORTED(name, type, cmds, help) {name, type, 0, 0, cmds, 0, help, FLAG_UNSUPPORTED, NULL}

static const FlagSpec FLAGS[] = {
    // model shape
    F("num-layers", FLAG_INT, num_layers, TR, 1, "transformer blocks"),
    F("mtp-num-layers", FLAG_INT, mtp_num_layers, TR | CMD_FORWARD, 1, "multi-token prediction (DeepSeek-V3): depths after the decoder, depth k predicting the token k+2 ahead through one more transformer layer of the last layer's kind (0 = none); with --load of a Hugging Face DeepSeek-V3 directory, its first N num_nextn_predict_layers (without the flag they are skipped)"),
    F("mtp-loss-scaling-factor", FLAG_DOUBLE, mtp_loss_scaling_factor, TR, 0, "the MTP losses' weight in the objective: each depth's loss times this / --mtp-num-layers"),
    F("hidden-size", FLAG_INT, hidden_size, TR, 1, "model width H"),
    F("ffn-hidden-size", FLAG_INT, ffn_hidden_size, TR, 1, "dense SwiGLU width (0 = 4*H)"),
    F("num-attention-heads", FLAG_INT, num_attention_heads, TR, 1, "query heads"),
    F("group-query-attention", FLAG_BOOL, group_query_attention, TR, 1, "use --num-query-groups key/value heads"),
    F("num-query-groups", FLAG_INT, num_query_groups, TR, 1, "key/value heads with --group-query-attention"),
    F("kv-channels", FLAG_INT, kv_channels, TR, 1, "head dimension (0 = H / heads)"),
    F("seq-length", FLAG_INT, seq_length, DT, 0, "tokens per training sequence"),
    F("max-position-embeddings", FLAG_INT, max_position_embeddings, TR, 1, "longest position the model supports (0 = --seq-length)"),
    F("vocab-size", FLAG_INT, vocab_size, DT | CMD_PREPARE, 1, "tokenizer vocabulary (default: the --tokenizer-model's, else byte-level 257 = 256 bytes + end-of-document); every token id of Megatron data must be below it (data: when given, else the size of --tokenizer-model); prepare: the size of the BPE vocabulary to train"),
    F("make-vocab-size-divisible-by", FLAG_INT, make_vocab_size_divisible_by, TR, 1, "pad the vocabulary to a multiple of this"),
    F("norm-epsilon", FLAG_DOUBLE, norm_epsilon, TR, 1, "RMSNorm epsilon"),
    F("rotary-base", FLAG_DOUBLE, rotary_base, TR, 1, "RoPE base theta"),
    F("rope-type", FLAG_STRING, rope_type, TR, 1, "rope: plain rotary embeddings; yarn: YaRN context extension (--rotary-scaling-factor, --original-max-position-embeddings, --beta-fast, --beta-slow, --mscale, --mscale-all-dim); with --multi-latent-attention and a --rotary-scaling-factor other than 1 the default is yarn (Megatron-Core's MLA default)"),
    F("rotary-scaling-factor", FLAG_DOUBLE, rotary_scaling_factor, TR, 1, "yarn: context extension factor (frequencies below the ramp divided by it)"),
    F("original-max-position-embeddings", FLAG_INT, original_max_position_embeddings, TR, 1, "yarn and --use-rope-scaling: the context length the model was pretrained on (0: 4096 for yarn, 8192 for Llama 3's scaling)"),
    F("beta-fast", FLAG_DOUBLE, beta_fast, TR, 1, "yarn: rotations over the original context above which a frequency is kept"),
    F("beta-slow", FLAG_DOUBLE, beta_slow, TR, 1, "yarn: rotations over the original context below which a frequency is divided by the factor"),
    F("mscale", FLAG_DOUBLE, mscale, TR, 1, "yarn: cos and sin times (0.1*mscale*ln(s)+1) / (0.1*mscale_all_dim*ln(s)+1)"),
    F("mscale-all-dim", FLAG_DOUBLE, mscale_all_dim, TR, 1, "yarn: the divisor's term above; with MLA the softmax scale is also multiplied by (0.1*mscale_all_dim*ln(s)+1)^2"),
    F("use-rope-scaling", FLAG_BOOL, use_rope_scaling, TR, 1, "Llama 3's RoPE scaling: frequencies whose wavelength passes --original-max-position-embeddings (default 8192) divided by --rope-scaling-factor, those below a quarter of it kept, a smooth blend between"),
    F("rope-scaling-factor", FLAG_DOUBLE, rope_scaling_factor, TR, 1, "--use-rope-scaling: the factor (Llama 3.1: 8)"),
    F("rotary-seq-len-interpolation-factor", FLAG_DOUBLE, rotary_seq_len_interpolation_factor, TR, 1, "linear position interpolation: every rotary frequency divided by this (0 = off)"),
    F("rotary-interleaved", FLAG_BOOL, rotary_interleaved, TR, 1, "rotate adjacent pairs (2i, 2i+1) rather than the two halves (DeepSeek-V3's rope_interleave)"),
    F("qk-layernorm", FLAG_BOOL, qk_layernorm, TR, 1, "per-head RMSNorm on queries and keys (Qwen3-MoE family)"),
    F("qk-layernorm-scope", FLAG_STRING, qk_layernorm_scope, TR, 1, "head: one RMSNorm per head (Qwen3-MoE); projection: over all heads of q and of k (OLMoE)"),
    F("clip-qkv", FLAG_DOUBLE, clip_qkv, TR, 1, "clamp queries, keys and values to [-x, x] after projection (OLMoE; 0 = off)"),
    F("multi-latent-attention", FLAG_BOOL, multi_latent_attention, TR, 1, "Multi-Latent Attention (DeepSeek-V3): low-rank keys/values, decoupled RoPE key"),
    F("q-lora-rank", FLAG_INT, q_lora_rank, TR, 1, "MLA: rank of the query compression (0 = full-rank q projection)"),
    F("kv-lora-rank", FLAG_INT, kv_lora_rank, TR, 1, "MLA: rank of the key/value compression"),
    F("qk-head-dim", FLAG_INT, qk_head_dim, TR, 1, "MLA: query/key head width without the rotary part"),
    F("qk-pos-emb-head-dim", FLAG_INT, qk_pos_emb_head_dim, TR, 1, "MLA: rotary query/key width (the rotary key is shared by all heads)"),
    F("v-head-dim", FLAG_INT, v_head_dim, TR, 1, "MLA: value head width"),
    F("untie-embeddings-and-output-weights", FLAG_BOOL, untie_embeddings_and_output_weights, TR, 1, "separate LM head instead of the embedding matrix"),
    F("init-method-std", FLAG_DOUBLE, init_method_std, TR, 0, "std of the normal weight init; output projections get std/sqrt(2*layers)"),
    F_NOOP("swiglu", FLAG_BOOL, swiglu, TR, "no-op: the MLPs and experts are always SwiGLU (--no-swiglu is refused)"),
    F_NOOP("disable-bias-linear", FLAG_BOOL, disable_bias_linear, TR, "no-op: linear layers never have biases (--no-disable-bias-linear is refused)"),
    F_NOOP("normalization", FLAG_STRING, normalization, TR, "no-op at RMSNorm: the only normalisation (LayerNorm is refused)"),
    F("position-embedding-type", FLAG_STRING, position_embedding_type, TR, 0, "rope (the only position embedding)"),
    // mixture of experts
    F("num-experts", FLAG_INT, num_experts, TR, 1, "routed experts per MoE layer (0 = dense model)"),
    F("moe-ffn-hidden-size", FLAG_INT, moe_ffn_hidden_size, TR, 1, "expert SwiGLU width (0 = --ffn-hidden-size)"),
    F("moe-router-topk", FLAG_INT, moe_router_topk, TR, 1, "experts per token"),
    F("moe-layer-freq", FLAG_STRING, moe_layer_freq, TR, 1, "N: every N-th layer is MoE (from layer 0); or a list like [0,1,1,1], also written as Megatron's Python expressions [0]*1+[1]*3 or ([0]+[1]*3)"),
    F("moe-router-pre-softmax", FLAG_BOOL, moe_router_pre_softmax, TR, 1, "softmax over all experts before top-k (default: top-k of logits, then softmax over the k); with sigmoid or sqrtsoftplus scores it changes nothing, as in Megatron (whose DeepSeek-V3 scripts pass it)"),
    F("moe-router-score-function", FLAG_STRING, moe_router_score_function, TR, 1, "softmax, sigmoid, sqrtsoftplus"),
    F("moe-router-topk-scaling-factor", FLAG_DOUBLE, moe_router_topk_scaling_factor, TR, 1, "multiply the routing probs by this (0 = off)"),
    F("moe-router-num-groups", FLAG_INT, moe_router_num_groups, TR, 1, "group-limited routing: expert groups (0 = off)"),
    F("moe-router-group-topk", FLAG_INT, moe_router_group_topk, TR, 1, "group-limited routing: groups a token may use"),
    F("moe-router-enable-expert-bias", FLAG_BOOL, moe_router_enable_expert_bias, TR, 1, "aux-loss-free balancing: a per-expert bias that steers selection (sigmoid/sqrtsoftplus)"),
    F("moe-router-bias-update-rate", FLAG_DOUBLE, moe_router_bias_update_rate, TR, 0, "expert-bias step per global batch"),
    F("moe-router-load-balancing-type", FLAG_LIST, moe_router_load_balancing_type, TR, 0, "aux_loss, seq_aux_loss, global_aux_loss, none, or several; or, alone and without an aux loss, sinkhorn (Sinkhorn-balanced top-k in training) or quantile_balancing (a per-expert bias from each step's routing quantiles)"),
    F("moe-aux-loss-coeff", FLAG_LIST, moe_aux_loss_coeff, TR, 0, "coefficient of each load-balancing loss"),
    F("moe-z-loss-coeff", FLAG_DOUBLE, moe_z_loss_coeff, TR, 0, "router z-loss coefficient (0 = off)"),
    F("attention-dropout", FLAG_DOUBLE, attention_dropout, TR, 0, "dropout probability on the attention softmax probabilities in training (default 0; Megatron's is 0.1)"),
    F("hidden-dropout", FLAG_DOUBLE, hidden_dropout, TR, 0, "dropout probability on the attention and MLP/MoE outputs before each residual add, in training (default 0; Megatron's is 0.1)"),
    F("moe-input-jitter-eps", FLAG_DOUBLE, moe_input_jitter_eps, TR, 0, "multiply the router input by U(1-eps, 1+eps) in training (0 = off)"),
    F("moe-router-dtype", FLAG_STRING, moe_router_dtype, TR, 0, "fp32, fp64: precision of the router logits"),
    F("moe-expert-capacity-factor", FLAG_DOUBLE, moe_expert_capacity_factor, TR, 1, "capacity per expert = ceil(k*N/E * factor) (0 = dropless)"),
    F("moe-token-drop-policy", FLAG_STRING, moe_token_drop_policy, TR, 1, "probs, position: which tokens an over-full expert keeps"),
    F("moe-pad-expert-input-to-capacity", FLAG_BOOL, moe_pad_expert_input_to_capacity, TR, 1, "give every expert exactly its capacity of rows"),
    F("moe-shared-expert-intermediate-size", FLAG_INT, moe_shared_expert_intermediate_size, TR, 1, "width of a shared expert every token uses (0 = none)"),
    F("moe-latent-size", FLAG_INT, moe_latent_size, TR, 1, "latent MoE: tokens projected from H to this width before dispatch (fc1_latent_proj), routed experts of this width, the combined result projected back (fc2_latent_proj); the router and the shared expert read H (0 = off)"),
    F("moe-shared-expert-gate", FLAG_BOOL, moe_shared_expert_gate, TR, 1, "scale the shared expert by sigmoid(x*w_gate)"),
    F("moe-router-force-load-balancing", FLAG_BOOL, moe_router_force_load_balancing, TR, 0, "benchmarking: route on random normal logits"),
    F("moe-use-upcycling", FLAG_BOOL, moe_use_upcycling, TR, 0, "--load names a dense checkpoint: start this MoE model from it, every expert a copy of its layer's MLP (or a slice of it, --moe-upcycling-granularity), as Megatron-Core's upcycling"),
    F("moe-upcycling-granularity", FLAG_INT, moe_upcycling_granularity, TR, 0, "granular upcycling: each dense MLP cut into this many slices of --moe-ffn-hidden-size (default dense width / this); --num-experts a multiple of it"),
    F("moe-router-quantile-balancing-ema", FLAG_DOUBLE, moe_router_quantile_balancing_ema, TR, 0, "quantile_balancing: each step's new bias = ema * bias + (1 - ema) * the step's mean quantile, then centred (0 = no memory)"),
    F("moe-routing-trace-path", FLAG_STRING, moe_routing_trace_path, TR, 0, "write every training forward's top-k picks of every MoE layer to DIR/rank_NNNNN.jsonl (one file per rank); with --moe-enable-routing-replay read them from there instead"),
    F("moe-enable-routing-replay", FLAG_BOOL, moe_enable_routing_replay, TR, 0, "route the training forwards on the picks --moe-routing-trace-path recorded (the probs are the router's scores of those experts), as Megatron-Core's router replay"),
    F("moe-per-layer-logging", FLAG_BOOL, moe_per_layer_logging, TR, 0, "per-MoE-layer metrics in --log-jsonl"),
    // training
    F("micro-batch-size", FLAG_INT, micro_batch_size, TR, 0, "sequences per forward/backward"),
    F("global-batch-size", FLAG_INT, global_batch_size, TR, 0, "sequences per optimizer step (gradient accumulation)"),
    F("train-iters", FLAG_INT, train_iters, TR, 0, "optimizer steps"),
    F("exit-interval", FLAG_INT, exit_interval, TR, 0, "save and exit after a step that is a multiple of this (0 = never)"),
    F("exit-duration-in-mins", FLAG_DOUBLE, exit_duration_in_mins, TR, 0, "save and exit after the first step that ends this many minutes after the start (0 = never)"),
    F("exit-signal-handler", FLAG_BOOL, exit_signal_handler, TR, 0, "on SIGTERM or SIGINT finish the step, save (with --save) and exit 0"),
    F("check-for-nan-in-loss-and-grad", FLAG_BOOL, check_for_nan_in_loss_and_grad, TR, 0, "skip (and log) a step whose loss or gradient norm is NaN or Inf instead of stopping (--no-check-for-nan-in-loss-and-grad: stop at the first)"),
    F("nan-skip-limit", FLAG_INT, nan_skip_limit, TR, 0, "stop after this many skipped non-finite steps in a row"),
    F("loss-spike-factor", FLAG_DOUBLE, loss_spike_factor, TR, 0, "report a step whose loss exceeds this multiple of the mean of the previous 20 (0 = never)"),
    F("keep-checkpoints", FLAG_INT, keep_checkpoints, TR, 0, "keep only the newest N iteration directories in --save (0 = keep all)"),
    F("distributed-timeout-minutes", FLAG_DOUBLE, distributed_timeout_minutes, TR, 0, "end every rank when a collective waits longer than this (MPI runs)"),
    F("lr", FLAG_DOUBLE, lr, TR, 0, "peak learning rate"),
    F("min-lr", FLAG_DOUBLE, min_lr, TR, 0, "learning rate at the end of decay"),
    F("train-samples", FLAG_INT64, train_samples, TR, 0, "sample-based run: train this many samples, --train-iters = this / --global-batch-size (as Megatron; not with --train-iters)"),
    F("lr-warmup-iters", FLAG_INT, lr_warmup_iters, TR, 0, "linear warmup steps from --lr-warmup-init"),
    F("lr-warmup-fraction", FLAG_DOUBLE, lr_warmup_fraction, TR, 0, "warmup over this fraction of the decay steps (--lr-decay-iters, or --lr-decay-samples), as Megatron; not with --lr-warmup-iters / --lr-warmup-samples (0 = off)"),
    F("lr-warmup-samples", FLAG_INT64, lr_warmup_samples, TR, 0, "with --train-samples: the warmup in samples (steps of --global-batch-size samples each, fractions kept)"),
    F("lr-warmup-init", FLAG_DOUBLE, lr_warmup_init, TR, 0, "the learning rate warmup starts from"),
    F("lr-decay-samples", FLAG_INT64, lr_decay_samples, TR, 0, "with --train-samples: the decay in samples (0 = --train-samples)"),
    F("lr-wsd-decay-samples", FLAG_INT64, lr_wsd_decay_samples, TR, 0, "with --train-samples and WSD: the final decay in samples"),
    F("lr-decay-style", FLAG_STRING, lr_decay_style, TR, 0, "constant, linear, cosine, WSD"),
    F("lr-decay-iters", FLAG_INT, lr_decay_iters, TR, 0, "steps over which lr decays (0 = --train-iters)"),
    F("lr-wsd-decay-iters", FLAG_INT, lr_wsd_decay_iters, TR, 0, "WSD: length of the final decay phase"),
    F("lr-wsd-decay-style", FLAG_STRING, lr_wsd_decay_style, TR, 0, "WSD decay shape: linear, cosine, exponential, minus_sqrt"),
    F("weight-decay", FLAG_DOUBLE, weight_decay, TR, 0, "decoupled weight decay (matrices only)"),
    F("adam-beta1", FLAG_DOUBLE, adam_beta1, TR, 0, "Adam beta1"),
    F("adam-beta2", FLAG_DOUBLE, adam_beta2, TR, 0, "Adam beta2"),
    F("adam-eps", FLAG_DOUBLE, adam_eps, TR, 0, "Adam epsilon"),
    F("clip-grad", FLAG_DOUBLE, clip_grad, TR, 0, "clip the global gradient L2 norm to this (0 = off)"),
    F("seed", FLAG_INT, seed, DT | CMD_GENERATE, 0, "random seed (init, data order, sampling)"),
    F("eval-interval", FLAG_INT, eval_interval, TR, 0, "held-out loss every N steps (0 = never)"),
    F("eval-iters", FLAG_INT, eval_iters, TR, 0, "micro-batches per held-out evaluation"),
    // parallelism
    F("tensor-model-parallel-size", FLAG_INT, tensor_model_parallel_size, TR, 0, "processes a dense layer's tensors are split over (TP)"),
    F("sequence-parallel", FLAG_BOOL, sequence_parallel, TR, 0, "with TP: norms, residuals and the router work on 1/TP of the tokens (all-gather before, reduce-scatter after each tensor-parallel block); needed for MoE layers with TP"),
    F("context-parallel-size", FLAG_INT, context_parallel_size, TR, 0, "processes a sequence is split over (CP)"),
    F("pipeline-model-parallel-size", FLAG_INT, pipeline_model_parallel_size, TR, 0, "pipeline stages the layers are split over (PP)"),
    F("pipeline-model-parallel-layout", FLAG_STRING, pipeline_model_parallel_layout, TR, 0, "the layers of each pipeline stage in Megatron's syntax: E embedding, t decoder layer, m multi-token-prediction layer (all in the stage of L), L loss, | between stages, (..)*n and x*n repeat, e.g. \"E|(tt|)*3,tL\"; PP x virtual stages"),
    F("decoder-first-pipeline-num-layers", FLAG_INT, decoder_first_pipeline_num_layers, TR, 0, "decoder layers on the first pipeline rank, the rest even over the others (-1: an even split)"),
    F("decoder-last-pipeline-num-layers", FLAG_INT, decoder_last_pipeline_num_layers, TR, 0, "decoder layers on the last pipeline rank, the rest even over the others (-1: an even split)"),
    F("account-for-embedding-in-pipeline-split", FLAG_BOOL, account_for_embedding_in_pipeline_split, TR, 0, "the embedding counts as a layer of the first stage in the even split"),
    F("account-for-loss-in-pipeline-split", FLAG_BOOL, account_for_loss_in_pipeline_split, TR, 0, "the LM head and loss count as a layer of the last stage in the even split"),
    F("num-layers-per-virtual-pipeline-stage", FLAG_INT, num_layers_per_virtual_pipeline_stage, TR, 0, "interleaved 1F1B: layers of each virtual stage (model chunk)"),
    F("num-virtual-stages-per-pipeline-rank", FLAG_INT, num_virtual_stages_per_pipeline_rank, TR, 0, "interleaved 1F1B: model chunks of each pipeline rank"),
    F("microbatch-group-size-per-virtual-pipeline-stage", FLAG_INT, microbatch_group_size_per_vp_stage, TR, 0, "interleaved 1F1B: micro-batches run through one chunk before the next (0 = PP)"),
    F("moe-shared-expert-overlap", FLAG_BOOL, moe_shared_expert_overlap, TR, 0, "compute the shared expert while the routed tokens travel to and from the experts (alltoall dispatcher; results unchanged)"),
    F("overlap-moe-expert-parallel-comm", FLAG_BOOL, overlap_moe_expert_parallel_comm, TR, 0, "run each steady-state forward and backward of the 1F1B schedule together, one micro-batch's token exchanges in flight while the other computes (EP above 1, alltoall dispatcher; with PP needs virtual stages; results unchanged)"),
    F("delay-wgrad-compute", FLAG_BOOL, delay_wgrad_compute, TR, 0, "with --overlap-moe-expert-parallel-comm: the experts' weight gradients while their input gradients travel back"),
    F("expert-model-parallel-size", FLAG_INT, expert_model_parallel_size, TR, 0, "processes the experts of a layer are distributed over (EP)"),
    F("expert-tensor-parallel-size", FLAG_INT, expert_tensor_parallel_size, TR, 0, "processes each expert's tensors are split over (ETP)"),
    F("cp-comm-type", FLAG_LIST, cp_comm_type, TR, 0, "with CP: p2p (ring attention), a2a (all-to-all over heads), allgather (gather K/V) or a2a+p2p; one value, or one per layer"),
    F("hierarchical-context-parallel-sizes", FLAG_LIST, hierarchical_context_parallel_sizes, TR, 0, "a2a+p2p: the sizes of the inner all-to-all group and the outer ring (product: --context-parallel-size)"),
    F("moe-token-dispatcher-type", FLAG_STRING, moe_token_dispatcher_type, TR, 0, "alltoall, allgather: how tokens reach experts on other expert-parallel ranks (one process: the same); flex (Megatron's fused DeepEP / HybridEP exchange) runs as alltoall, the same tokens reaching the same experts"),
    F("device", FLAG_STRING, device, ALL, 0, "cpu, cuda, auto: where the model computes (auto: a GPU when this build has CUDA and one is visible, else the cpu; default $MOETRON_DEVICE, else auto); cpu-strict: the cpu with tensor memory closed to host code outside ops (a check for developers)"),
    F("bf16", FLAG_BOOL, bf16, ALL, 0, "GEMM inputs rounded to bf16 (nearest even), fp32 accumulation, fp32 master weights, everything else fp32 (docs/precision.md); the cpu uses AVX-512 BF16 where the CPU has it and an exact emulation elsewhere"),
    F("fp32-residual-connection", FLAG_BOOL, fp32_residual_connection, ALL, 0, "with --bf16, keep the residual stream (every block's input and output) in fp32; without it the cpu keeps it bf16, as Megatron does (docs/precision.md)"),
    F("fp16", FLAG_BOOL, fp16, ALL, 0, "GEMM inputs rounded to IEEE half, fp32 accumulation, fp32 master weights, with loss scaling (dynamic unless --loss-scale): steps whose gradients overflow are skipped"),
    F("loss-scale", FLAG_DOUBLE, loss_scale, TR, 0, "a constant loss scale (with --fp16, --bf16 or --use-distributed-optimizer, as Megatron); 0: dynamic with --fp16, none otherwise"),
    F("initial-loss-scale", FLAG_DOUBLE, initial_loss_scale, TR, 0, "--fp16's dynamic loss scaling: the first scale"),
    F("min-loss-scale", FLAG_DOUBLE, min_loss_scale, TR, 0, "--fp16's dynamic loss scaling: the scale never backs off below this"),
    F("loss-scale-window", FLAG_DOUBLE, loss_scale_window, TR, 0, "--fp16's dynamic loss scaling: steps without an overflow before the scale doubles"),
    F("hysteresis", FLAG_INT, hysteresis, TR, 0, "--fp16's dynamic loss scaling: overflowing steps (since the scale last grew) before the scale halves"),
    F("fp8-format", FLAG_STRING, fp8_format, TR, 0, "FP8 GEMMs (emulated: quantized, dequantized, multiplied in fp32; docs/precision.md): e4m3 everywhere, or hybrid (E4M3 inputs and weights, E5M2 gradients); the linear layers of attention, the dense FFN and the experts (not the router, norms, attention core, embedding, LM head)"),
    F("fp8-recipe", FLAG_STRING, fp8_recipe, TR, 0, "with --fp8-format: delayed (a scale per tensor from an amax history), tensorwise (from the tensor's amax), blockwise (1x128 / 128x128 tiles), mxfp8 (32-element blocks, E8M0 scales)"),
    F("fp8-amax-history-len", FLAG_INT, fp8_amax_history_len, TR, 0, "--fp8-recipe delayed: steps of amaxes in the window"),
    F("fp8-amax-compute-algo", FLAG_STRING, fp8_amax_compute_algo, TR, 0, "--fp8-recipe delayed: most_recent or max (of the window)"),
    F("fp8-margin", FLAG_INT, fp8_margin, TR, 0, "--fp8-recipe delayed: the scale divided by 2^margin"),
    F("fp4-format", FLAG_STRING, fp4_format, TR, 0, "e2m1: NVFP4 GEMMs (emulated) in the layers --fp8-format quantizes; not with --fp8-format"),
    F("fp4-recipe", FLAG_STRING, fp4_recipe, TR, 0, "with --fp4-format: nvfp4 (16-element blocks, 16x16 for weights, stochastic rounding of gradients, random Hadamard transform of the weight gradient's inputs)"),
    F("moe-router-padding-for-quantization", FLAG_BOOL, moe_router_padding_for_quantization, TR, 0, "with --fp8-format / --fp4-format: round each expert's rows on every rank up to a multiple of 16 (32 mxfp8, 128 nvfp4) with tokens that did not pick it, at probability 0, as Megatron-LM (changes only what the quantizers see)"),
    F("first-last-layers-bf16", FLAG_BOOL, first_last_layers_bf16, TR, 0, "with --fp8-format / --fp4-format: keep the first and last layers' GEMMs unquantized (not with --fp8-recipe delayed)"),
    F("num-layers-at-start-in-bf16", FLAG_INT, num_layers_at_start_in_bf16, TR, 0, "--first-last-layers-bf16: the first layers kept"),
    F("num-layers-at-end-in-bf16", FLAG_INT, num_layers_at_end_in_bf16, TR, 0, "--first-last-layers-bf16: the last layers kept"),
    F("adapt-threads", FLAG_BOOL, adapt_threads, TR, 0, "use fewer OpenMP threads while other programs compete for the cores, and more again when they stop (timed steps, an occasional probe step; results do not change; --no-adapt-threads: always OpenMP's count)"),
    F("recompute-granularity", FLAG_STRING, recompute_granularity, TR, 0, "full: keep only the input of each group of decoder layers and run their forward again just before their backward (less activation memory, one more forward of those layers; results unchanged; needs --recompute-method and --recompute-num-layers); selective: recompute only the parts --recompute-modules names, in every layer"),
    F("recompute-method", FLAG_STRING, recompute_method, TR, 0, "with --recompute-granularity full: uniform (each model chunk's layers in groups of --recompute-num-layers, one input kept per group) or block (the first --recompute-num-layers layers of each chunk, each keeping its input; the rest keep everything)"),
    F("recompute-num-layers", FLAG_INT, recompute_num_layers, TR, 0, "with --recompute-granularity full: the layers of a uniform group, or the recomputed layers of each chunk (block)"),
    F("distribute-saved-activations", FLAG_BOOL, distribute_saved_activations, TR, 0, "refused: Megatron's split of full recomputation's kept inputs over the tensor-parallel ranks; --sequence-parallel keeps them split already"),
    F("recompute-activations", FLAG_BOOL, recompute_activations, TR, 0, "Megatron's shorthand for --recompute-granularity selective (with --recompute-modules, default core_attn)"),
    F("recompute-modules", FLAG_LIST, recompute_modules, TR, 0, "with --recompute-granularity selective: core_attn (attention output), moe_act (routed experts' SwiGLU), layernorm (the norms' outputs), mlp (dense FFN), shared_experts, mla_up_proj (MLA's q, k, v from the latents), moe (the whole MoE block, router to combine); one or several"),
    F("profile", FLAG_BOOL, profile, TR, 0, "print where the steps' time went per op kind (gemm, attention, norm, router, ...) at the end"),
    F("world-size", FLAG_INT, plan_world_size, CMD_PLAN, 0, "the processes of the run to plan (0 = the fewest the layout needs); moetron plan takes every flag of train besides"),
    F("use-distributed-optimizer", FLAG_BOOL, use_distributed_optimizer, TR, 0, "shard AdamW moments over the data-parallel ranks (ZeRO-1): reduce-scatter gradients, step the shard, all-gather parameters"),
    F("use-precision-aware-optimizer", FLAG_BOOL, use_precision_aware_optimizer, TR, 0, "let --exp-avg-dtype / --exp-avg-sq-dtype store the AdamW moments narrower, as Transformer Engine's FusedAdam (needs --use-distributed-optimizer, as in Megatron)"),
    F("main-grads-dtype", FLAG_STRING, main_grads_dtype, TR, 0, "fp32: the gradients the optimizer reads (moetron's are fp32; bf16 is refused)"),
    F("main-params-dtype", FLAG_STRING, main_params_dtype, TR, 0, "fp32: the optimizer's copy of the weights (moetron's weights are fp32 and are their own, as Megatron's fp32 weights are; fp16 is refused)"),
    F("exp-avg-dtype", FLAG_STRING, exp_avg_dtype, TR, 0, "with --use-precision-aware-optimizer: fp32, bf16, fp16 or fp8 (E4M3): how AdamW's first moment is stored (fp16 and fp8 with a scale per tensor shard, from its largest magnitude each step)"),
    F("optimizer-cpu-offload", FLAG_BOOL, optimizer_cpu_offload, TR, 0, "keep the optimizer's state (moments, a copy of the weights) in host memory and step it on the CPU: each step the gradients come to the host and the new weights go back (for --device cuda: frees the GPU of it; needs --use-precision-aware-optimizer, as in Megatron)"),
    F("optimizer-offload-fraction", FLAG_DOUBLE, optimizer_offload_fraction, TR, 0, "with --optimizer-cpu-offload: the fraction of the state offloaded (whole tensor shards in order until it is reached); the rest steps on the device"),
    F("exp-avg-sq-dtype", FLAG_STRING, exp_avg_sq_dtype, TR, 0, "with --use-precision-aware-optimizer: fp32, bf16, fp16 or fp8: how AdamW's second moment is stored (as --exp-avg-dtype)"),
    // data
    F("mock-data", FLAG_BOOL, mock_data, TR, 0, "built-in generated corpus (default without --data-path)"),
    F("data-path", FLAG_LIST, data_path, DT, 0, "a text file (tokenized with --tokenizer-model, else read as bytes), or Megatron .bin/.idx prefixes with optional weights: P, or 0.3 P1 0.7 P2"),
    F("train-data-path", FLAG_LIST, train_data_path, DT, 0, "Megatron prefixes (optionally weighted) for training only; with --valid/--test-data-path instead of --data-path + --split"),
    F("valid-data-path", FLAG_LIST, valid_data_path, DT, 0, "Megatron prefixes (optionally weighted) for validation"),
    F("test-data-path", FLAG_LIST, test_data_path, DT, 0, "Megatron prefixes (optionally weighted) for test"),
    F("data-cache-path", FLAG_STRING, data_cache_path, DT, 0, "directory for the sample-index caches (default: beside the data)"),
    F("split", FLAG_STRING, split, DT, 0, "train,valid,test proportions (of the documents for Megatron data, of the samples for text); as Megatron reads it, any characters separate the numbers (98,2,0 98/2/0 '99 1 0'), missing parts are 0"),
    F("eod-mask-loss", FLAG_BOOL, eod_mask_loss, DT, 0, "no loss where the input token is end-of-document (as Megatron-Core)"),
    F("reset-position-ids", FLAG_BOOL, reset_position_ids, DT, 0, "positions restart at 0 after each end-of-document"),
    F("reset-attention-mask", FLAG_BOOL, reset_attention_mask, DT, 0, "tokens attend only to earlier tokens of their own document"),
    F("mock-data-tokens", FLAG_INT64, mock_data_tokens, TR, 0, "size of the built-in corpus in tokens"),
    // checkpoints and logging
    F("save", FLAG_STRING, save, TR, 0, "checkpoint directory to write"),
    F("save-interval", FLAG_INT, save_interval, TR, 0, "save every N steps (0 = only at the end)"),
    F("load", FLAG_STRING, load, ALL, 0, "checkpoint directory to resume from / to use"),
    F("finetune", FLAG_BOOL, finetune, TR, 0, "--load the weights only: start at iteration 0 with a fresh optimizer, learning-rate schedule, random streams and data position (as Megatron)"),
    F("no-load-optim", FLAG_BOOL, no_load_optim, TR, 0, "--load the weights and trainer state (iteration, data position) but not the optimizer's: fresh AdamW moments and step count, loss scaler, and a learning-rate schedule from its start (as Megatron, whose schedule is optimizer state)"),
    F("no-load-rng", FLAG_BOOL, no_load_rng, TR, 0, "--load without the random state: the random streams (router jitter and forced-balance logits, dropout masks, stochastic rounding) start afresh at the loaded iteration, as a new run's first step"),
    F("log-interval", FLAG_INT, log_interval, TR, 0, "print a line every N steps"),
    F("log-jsonl", FLAG_STRING, log_jsonl, TR, 0, "append one JSON object per logged step to this file"),
    F("tensorboard-dir", FLAG_STRING, tensorboard_dir, TR, 0, "write TensorBoard event files here (created when missing; a resumed run adds a new file); Megatron-LM's tags, written by world rank 0"),
    F("tensorboard-log-interval", FLAG_INT, tensorboard_log_interval, TR, 0, "TensorBoard scalars of every N-th step"),
    F("tensorboard-queue-size", FLAG_INT, tensorboard_queue_size, TR, 0, "accepted for Megatron scripts: moetron writes each logged step's scalars at once (no queue)"),
    F("log-timers-to-tensorboard", FLAG_BOOL, log_timers_to_tensorboard, TR, 0, "TensorBoard: iteration-time (seconds per step), and throughput with --log-throughput"),
    F("log-validation-ppl-to-tensorboard", FLAG_BOOL, log_validation_ppl_to_tensorboard, TR, 0, "TensorBoard: lm loss validation ppl"),
    F("log-memory-to-tensorboard", FLAG_BOOL, log_memory_to_tensorboard, TR, 0, "TensorBoard: mem-peak-resident-bytes (the peak resident memory of world rank 0)"),
    F("log-world-size-to-tensorboard", FLAG_BOOL, log_world_size_to_tensorboard, TR, 0, "TensorBoard: world-size"),
    F("log-loss-scale-to-tensorboard", FLAG_BOOL, log_loss_scale_to_tensorboard, TR, 0, "TensorBoard: loss-scale (1 without loss scaling; --no-log-loss-scale-to-tensorboard: leave it out)"),
    F("log-params-norm", FLAG_BOOL, log_params_norm, TR, 0, "the L2 norm of all parameters after each logged step: console and TensorBoard params-norm, JSONL params_norm"),
    F("log-num-zeros-in-grad", FLAG_BOOL, log_num_zeros_in_grad, TR, 0, "log how many gradient elements are exactly zero after clipping, each element of the model counted once (console: zeros, JSONL: num_zeros, TensorBoard: num-zeros)"),
    F("log-throughput", FLAG_BOOL, log_throughput, TR, 0, "TensorBoard throughput (model TFLOP/s per process) with --log-timers-to-tensorboard; the console always shows TFLOP/s"),
    F("wandb-project", FLAG_STRING, wandb_project, TR, 0, "accepted for Megatron scripts: nothing is sent to Weights & Biases (a note at start-up); TensorBoard and --log-jsonl hold the values"),
    F("wandb-exp-name", FLAG_STRING, wandb_exp_name, TR, 0, "accepted, as --wandb-project"),
    F("wandb-save-dir", FLAG_STRING, wandb_save_dir, TR, 0, "accepted, as --wandb-project"),
    F("wandb-entity", FLAG_STRING, wandb_entity, TR, 0, "accepted, as --wandb-project"),
    F("peak-tflops", FLAG_DOUBLE, peak_tflops, TR, 0, "device peak for MFU (0 = measure this machine's GEMM ceiling)"),
    F("hf-architecture", FLAG_STRING, hf_architecture, TR, 1, "auto, mixtral, qwen3_moe, olmoe, deepseek_v3: the Hugging Face family checkpoints are saved as"),
    F("ckpt-dtype", FLAG_STRING, ckpt_dtype, TR, 0, "fp32, bf16, fp8: dtype of the weights in model safetensors (bf16 and fp8 keep fp32 master weights in optimizer.safetensors; fp8: DeepSeek-V3's E4M3 linear weights with 128x128 block scales, the rest bf16)"),
    F("max-shard-size", FLAG_STRING, max_shard_size, TR, 0, "split model safetensors into shards above this size (e.g. 5GB, 500MB, or bytes)"),
    F("tokenizer-model", FLAG_STRING, tokenizer_model, ALL | CMD_DATA | CMD_PREPARE, 0, "tokenizer.json (or, with --tokenizer-type, its directory or a SentencePiece .model): tokenizes --data-path text and generate's prompt, copied into checkpoints (default: the one in --load)"),
    F("tokenizer-type", FLAG_STRING, tokenizer_type, ALL | CMD_DATA | CMD_PREPARE, 0, "HuggingFaceTokenizer (--tokenizer-model DIR or tokenizer.json), GPT2BPETokenizer (--vocab-file, --merge-file), SentencePieceTokenizer, GPTSentencePieceTokenizer or Llama2Tokenizer (--tokenizer-model x.model), NullTokenizer (--vocab-size; the text is token ids, end of document vocab-size - 1); default: --tokenizer-model's tokenizer.json"),
    F("vocab-file", FLAG_STRING, vocab_file, ALL | CMD_DATA | CMD_PREPARE, 0, "GPT2BPETokenizer: GPT-2's vocab.json"),
    F("merge-file", FLAG_STRING, merge_file, ALL | CMD_DATA | CMD_PREPARE, 0, "GPT2BPETokenizer: GPT-2's merges.txt"),
    // generate
    F("prompt", FLAG_STRING, prompt, CMD_GENERATE, 0, "text to continue"),
    F("max-new-tokens", FLAG_INT, max_new_tokens, CMD_GENERATE, 0, "tokens to generate"),
    F("temperature", FLAG_DOUBLE, temperature, CMD_GENERATE, 0, "sampling temperature (0 = greedy)"),
    F("top-k", FLAG_INT, top_k, CMD_GENERATE, 0, "sample among the k most likely tokens (0 = all)"),
    F("top-p", FLAG_DOUBLE, top_p, CMD_GENERATE, 0, "nucleus sampling after --temperature and --top-k: the most likely tokens holding probability p (1 = all)"),
    // forward
    F("input", FLAG_STRING, input, CMD_FORWARD | CMD_PREPARE, 0, "forward: safetensors with input_ids (I32 or I64 [B,T]) and optional labels; prepare: a .txt or .jsonl file"),
    F("dump", FLAG_STRING, dump, CMD_FORWARD | CMD_DATA, 0, "forward: safetensors to write logits, loss and routing to; data: safetensors to write the samples to"),
    F("grads", FLAG_BOOL, grads, CMD_FORWARD, 0, "also dump every parameter gradient as grad.<name>"),
    // data
    F("num-samples", FLAG_INT64, num_samples, CMD_DATA, 0, "training samples to build and dump"),
    // prepare
    F("json-keys", FLAG_LIST, json_keys, TR | CMD_PREPARE, 0, "keys of a .jsonl input to tokenize, each into its own dataset (train: the one key of a .jsonl --data-path)"),
    F("output-prefix", FLAG_STRING, output_prefix, CMD_PREPARE, 0, "writes PREFIX_<key>_document.bin/.idx (and PREFIX_tokenizer.json when training one)"),
    F("append-eod", FLAG_BOOL, append_eod, CMD_PREPARE, 0, "end every document with the end-of-document token"),
    F("workers", FLAG_INT, workers, CMD_PREPARE, 0, "tokenizer threads"),
    F("output", FLAG_STRING, report_output, CMD_REPORT, 0, "the HTML page to write (default: the log's path with .html for .jsonl)"),
    // Megatron-LM flags accepted as no-ops or refused (docs/flags.md's status column)
#include "core/megatron_compat_flags.h"
};
#define FLAG_COUNT ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))
_Static_assert(sizeof(FLAGS) / sizeof(FLAGS[0]) <= sizeof(((Config *)0)->flag_given),
               "Config.flag_given too small for the flag table");

int config_flag_count(void) { return FLAG_COUNT; }
const FlagSpec *config_flag(int i) { return &FLAGS[i]; }

void config_defaults(Config *c) {
    memset(c, 0, sizeof(*c));
    // The default model: a small MoE that trains in minutes on a laptop CPU.
    c->num_layers = 4;
    c->hidden_size = 128;
    c->num_attention_heads = 4;
    c->num_query_groups = 1;
    c->seq_length = 256;
    c->vocab_size = 257;
    c->make_vocab_size_divisible_by = 128;
    c->norm_epsilon = 1e-5;
    c->rotary_base = 10000;
    strcpy(c->rope_type, "rope");
    c->moe_upcycling_granularity = 1;
    c->rotary_scaling_factor = 1.0;
    c->rope_scaling_factor = 8;
    c->beta_fast = 32;
    c->mtp_loss_scaling_factor = 0.1;
    c->beta_slow = 1;
    c->mscale = 1.0;
    c->init_method_std = 0.02;
    strcpy(c->qk_layernorm_scope, "head");
    c->kv_lora_rank = 32;
    c->qk_head_dim = 128;
    c->qk_pos_emb_head_dim = 64;
    c->v_head_dim = 128;
    strcpy(c->hf_architecture, "auto");
    strcpy(c->ckpt_dtype, "fp32");
    strcpy(c->moe_token_dispatcher_type, "alltoall");
    strcpy(c->cp_comm_type, "p2p");
    strcpy(c->recompute_modules, "core_attn");
    strcpy(c->main_grads_dtype, "fp32");
    strcpy(c->main_params_dtype, "fp32");
    strcpy(c->exp_avg_dtype, "fp32");
    strcpy(c->exp_avg_sq_dtype, "fp32");
    c->optimizer_offload_fraction = 1.0;
    strcpy(c->device, "auto");
    strcpy(c->max_shard_size, "5GB");
    strcpy(c->normalization, "RMSNorm");
    strcpy(c->position_embedding_type, "rope");
    c->num_experts = 8;
    c->moe_ffn_hidden_size = 256;
    c->moe_router_topk = 2;
    strcpy(c->moe_layer_freq, "1");
    strcpy(c->moe_router_score_function, "softmax");
    c->moe_router_bias_update_rate = 1e-3;
    strcpy(c->moe_router_load_balancing_type, "aux_loss");
    strcpy(c->moe_aux_loss_coeff, "0.01");
    strcpy(c->moe_router_dtype, "fp32");
    c->initial_loss_scale = 4294967296.0;  // 2^32
    c->min_loss_scale = 1;
    c->loss_scale_window = 1000;
    c->hysteresis = 2;
    strcpy(c->fp8_recipe, "delayed");  // Megatron-LM's defaults
    c->fp8_amax_history_len = 1;
    strcpy(c->fp8_amax_compute_algo, "most_recent");
    strcpy(c->fp4_recipe, "nvfp4");
    c->num_layers_at_start_in_bf16 = 1;
    c->num_layers_at_end_in_bf16 = 1;
    strcpy(c->moe_token_drop_policy, "probs");
    // Optimizer and schedule: Megatron-LM's defaults, except where it has none (lr).
    c->micro_batch_size = 4;
    c->global_batch_size = 8;
    c->train_iters = 500;
    c->lr = 3e-3;
    c->min_lr = 3e-4;
    c->lr_warmup_iters = 0;
    strcpy(c->lr_decay_style, "cosine");
    strcpy(c->lr_wsd_decay_style, "exponential");
    c->weight_decay = 0.01;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.999;
    c->adam_eps = 1e-8;
    c->clip_grad = 1.0;
    c->seed = 1234;
    c->eval_interval = 100;
    c->check_for_nan_in_loss_and_grad = 1;
    c->adapt_threads = 1;
    c->nan_skip_limit = 3;
    c->loss_spike_factor = 2.0;
    c->distributed_timeout_minutes = 10;
    c->eval_iters = 8;
    c->tensor_model_parallel_size = c->context_parallel_size = c->pipeline_model_parallel_size = 1;
    c->expert_model_parallel_size = c->expert_tensor_parallel_size = 1;
    c->decoder_first_pipeline_num_layers = c->decoder_last_pipeline_num_layers = -1;
    strcpy(c->split, "969,30,1");
    c->mock_data_tokens = 1 << 22;
    c->log_interval = 1;
    c->tensorboard_log_interval = 1;
    c->tensorboard_queue_size = 1000;
    c->log_loss_scale_to_tensorboard = 1;
    c->max_new_tokens = 100;
    strcpy(c->json_keys, "text");
    c->workers = 1;
    c->temperature = 1.0;
    c->top_p = 1.0;
    c->swiglu = c->disable_bias_linear = 1;  // what the model always is
}

// ---- parsing ------------------------------------------------------------------------

static const FlagSpec *find_flag(const char *name, int *index) {
    for (int i = 0; i < FLAG_COUNT; i++)
        if (strcmp(FLAGS[i].name, name) == 0) {
            *index = i;
            return &FLAGS[i];
        }
    return NULL;
}

// The Config whose values errors describe (set by the entry points: config_parse_args,
// config_set_flag, config_validate).
static const Config *naming;

static int flag_name_char(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-'; }

// msg with every `--NAME` whose value came from naming->values_file replaced by its key
// there ("num_attention_heads"); returns how many were replaced.
static int name_file_values(const char *msg, char *out, size_t cap) {
    size_t at = 0;
    int replaced = 0;
    for (const char *p = msg; *p && at + 1 < cap;) {
        int starts_flag = p[0] == '-' && p[1] == '-' && (p == msg || !flag_name_char(p[-1]));
        size_t len = 0;
        while (starts_flag && flag_name_char(p[2 + len])) len++;
        char name[128];
        int index;
        const FlagSpec *f = NULL;
        if (len > 0 && len < sizeof(name)) {
            memcpy(name, p + 2, len);
            name[len] = 0;
            f = find_flag(name, &index);
        }
        const char *key = f && naming ? naming->value_key[index] : NULL;
        if (!key) {
            out[at++] = *p++;
            continue;
        }
        at += snprintf(out + at, cap - at, "\"%s%s\"", naming->values_key_prefix ? naming->values_key_prefix : "", key);
        at = MT_MIN(at, cap - 1);
        p += 2 + len;
        replaced++;
    }
    out[at] = 0;
    return replaced;
}

// mt_die for the flags' errors: a value read from a config.json is named by the file and
// its key there, not by the flag the user never gave.
__attribute__((format(printf, 1, 2), noreturn)) static void config_die(const char *fmt, ...) {
    char msg[16384], named[20480];  // the longest values (lists of paths) and their keys
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (name_file_values(msg, named, sizeof(named))) mt_die("%s: %s", naming->values_file, named);
    mt_die("%s", msg);
}

void config_values_from_file(Config *c, const char *path, const char *key_prefix) {
    snprintf(c->values_file, sizeof(c->values_file), "%s", path);
    c->values_key_prefix = key_prefix;
}

int config_upcycling_reshapes(const Config *c, const char *flag) {
    return c->moe_use_upcycling && (!strcmp(flag, "num-experts") || !strncmp(flag, "moe-", 4));
}

void config_note_file_key(Config *c, const void *field, const char *key) {
    size_t offset = (size_t)((const char *)field - (const char *)c);
    for (int i = 0; i < FLAG_COUNT; i++)
        if (FLAGS[i].offset == offset) c->value_key[i] = key;
}

static long long parse_integer(const char *flag, const char *text) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end) config_die("--%s expects an integer, got '%s'", flag, text);
    return v;
}

static double parse_double(const char *flag, const char *text) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v))
        config_die("--%s expects a number, got '%s'", flag, text);
    return v;
}

// Whether value is one of the comma-separated `accepts` (numerically for a number flag).
static int value_accepted(const FlagSpec *f, const char *value) {
    char list[256];
    snprintf(list, sizeof(list), "%s", f->accepts);
    char *save;
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (f->type == FLAG_DOUBLE || f->type == FLAG_INT || f->type == FLAG_INT64) {
            if (parse_double(f->name, value) == strtod(a, NULL)) return 1;
        } else if (!strcmp(value, a)) {
            return 1;
        }
    }
    return 0;
}

// A flag of megatron_compat_flags.h (no field): an unsupported one is refused, a no-op's
// value must be of its type and, when it lists them, one of the values it accepts.
static void check_compat_flag(const FlagSpec *f, const char *value) {
    if (f->status == FLAG_UNSUPPORTED) config_die("--%s is not supported: %s", f->name, f->help);
    if (f->type == FLAG_BOOL) {
        if (strcmp(value, "1") && strcmp(value, "true") && strcmp(value, "0") && strcmp(value, "false"))
            config_die("--%s is a switch: give it without a value", f->name);
        return;
    }
    if (f->type == FLAG_INT || f->type == FLAG_INT64) parse_integer(f->name, value);
    if (f->type == FLAG_DOUBLE) parse_double(f->name, value);
    if (f->accepts && !value_accepted(f, value)) {
        char choices[256];
        snprintf(choices, sizeof(choices), "%s", f->accepts);
        char *last = strrchr(choices, ',');
        if (last) *last = '|';  // "a,b,c" -> "a, b or c"
        char listed[300];
        size_t at = 0;
        for (const char *p = choices; *p && at + 5 < sizeof(listed); p++)
            at += (size_t)snprintf(listed + at, sizeof(listed) - at, "%s", *p == ',' ? ", " : *p == '|' ? " or " : (char[]){*p, 0});
        config_die("--%s %s is not supported; give %s (%s)", f->name, value, listed, f->help);
    }
}

// Store a textual value into the field a flag describes.
void config_set_flag(Config *c, const FlagSpec *f, const char *value) {
    naming = c;
    if (f->size == 0) {
        check_compat_flag(f, value);
        return;
    }
    char *field = (char *)c + f->offset;
    switch (f->type) {
    case FLAG_INT: {
        long long v = parse_integer(f->name, value);
        if (v < -2147483647LL || v > 2147483647LL) config_die("--%s %s is out of range", f->name, value);
        *(int *)field = (int)v;
        break;
    }
    case FLAG_INT64: *(int64_t *)field = parse_integer(f->name, value); break;
    case FLAG_DOUBLE: *(double *)field = parse_double(f->name, value); break;
    case FLAG_BOOL:
        if (!strcmp(value, "1") || !strcmp(value, "true")) *(int *)field = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false")) *(int *)field = 0;
        else config_die("--%s is a switch: give it without a value", f->name);
        break;
    case FLAG_STRING:
    case FLAG_LIST:
        if (strlen(value) >= f->size)
            config_die("--%s value is too long (at most %zu characters)", f->name, f->size - 1);
        strcpy(field, value);
        break;
    }
}

// The values after a list flag up to the next flag, joined with commas.
static const char *join_list_values(char *out, size_t cap, const char *flag, int argc, char **argv, int *i) {
    size_t at = 0;
    out[0] = 0;
    while (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) {
        const char *v = argv[++*i];
        if (at + strlen(v) + 2 > cap) mt_die("--%s: too many values", flag);
        at += snprintf(out + at, cap - at, "%s%s", at ? "," : "", v);
    }
    if (at == 0) mt_die("--%s needs a value", flag);
    return out;
}

// The value of flag f written as --NAME[=VALUE]: after '=', "1" for a switch, the words up
// to the next flag for a list, else the next argument (which *i then skips).
static const char *flag_value(const FlagSpec *f, const char *name, const char *eq, char *list, size_t list_cap,
                              int argc, char **argv, int *i) {
    if (eq) return eq + 1;
    if (f->type == FLAG_BOOL) return "1";
    if (f->type == FLAG_LIST && *i + 1 < argc) return join_list_values(list, list_cap, name, argc, argv, i);
    if (*i + 1 < argc) return argv[++*i];
    mt_die("--%s needs a value", name);
}

static const char *command_name(Command cmd) {
    return cmd == CMD_TRAIN      ? "train"
           : cmd == CMD_GENERATE ? "generate"
           : cmd == CMD_FORWARD  ? "forward"
           : cmd == CMD_DATA     ? "data"
           : cmd == CMD_PLAN     ? "plan"
           : cmd == CMD_REPORT   ? "report"
                                 : "prepare";
}

// The flags a command takes: its own, and for plan every flag of train too (it plans a
// training run from the same command line).
static unsigned accepted_by(Command cmd) { return cmd == CMD_PLAN ? CMD_TRAIN | CMD_PLAN : cmd; }

void config_parse_args(Config *c, Command cmd, int argc, char **argv) {
    naming = c;
    c->command = cmd;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (cmd == CMD_REPORT && strncmp(arg, "--", 2) != 0 && !c->report_run[0]) {  // `moetron report RUN`
            if (strlen(arg) >= sizeof(c->report_run)) mt_die("%.64s...: the path is too long", arg);
            snprintf(c->report_run, sizeof(c->report_run), "%s", arg);
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            mt_die("unexpected argument '%s'; %s (see moetron %s --help)", arg,
                   cmd == CMD_REPORT ? "moetron report takes one RUN" : "flags start with --", command_name(cmd));
        char name[128];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof(name)) mt_die("unknown flag '%s' (see moetron %s --help)", arg, command_name(cmd));
        memcpy(name, arg + 2, len);
        name[len] = 0;
        for (char *p = name; *p; p++)
            if (*p == '_') *p = '-';  // --num_layers works like --num-layers
        int index;
        const FlagSpec *f = find_flag(name, &index);
        const char *value;
        if (!f && !strncmp(name, "no-", 3) && !eq) {  // --no-X turns the switch --X off (Megatron's style)
            f = find_flag(name + 3, &index);
            if (!f || f->type != FLAG_BOOL) f = NULL;
            else memmove(name, name + 3, strlen(name + 3) + 1);
            value = "0";
        } else {
            value = NULL;
        }
        if (!f) mt_die("unknown flag '--%s' (see moetron %s --help)", name, command_name(cmd));
        if (!(f->commands & accepted_by(cmd)))
            mt_die("--%s does not apply to 'moetron %s'%s", name, command_name(cmd),
                   f->architecture ? " (the model shape comes from the checkpoint)" : "");
        char list[1024];
        if (value == NULL) value = flag_value(f, name, eq, list, sizeof(list), argc, argv, &i);
        config_set_flag(c, f, value);
        c->flag_given[index] = 1;
    }
}

int config_flag_given(const Config *c, const char *name) {
    int index;
    return find_flag(name, &index) && c->flag_given[index];
}

// ---- validation -----------------------------------------------------------------------

static void require_positive(const char *flag, long long value) {
    if (value <= 0) config_die("--%s must be positive, got %lld", flag, value);
}

static void parse_moe_layer_freq(Config *c) {
    const char *s = c->moe_layer_freq;
    if (c->num_experts == 0) {
        for (int l = 0; l < c->num_layers; l++) c->moe_layer[l] = 0;
        return;
    }
    if (s[0] != '[' && s[0] != '(') {  // N; else a list expression (core/layer_pattern.h)
        long long every = parse_integer("moe-layer-freq", s);
        require_positive("moe-layer-freq", every);
        for (int l = 0; l < c->num_layers; l++) c->moe_layer[l] = (l % every == 0);
        return;
    }
    char err[128];
    int count = layer_pattern_expand(s, c->moe_layer, c->num_layers, err, sizeof(err));
    if (count < 0) config_die("--moe-layer-freq %s: %s (e.g. [0,1,1,1] or [0]*1+[1]*3)", s, err);
    if (count != c->num_layers)
        config_die("--moe-layer-freq %s has %d entries but --num-layers is %d", s, count, c->num_layers);
}

// --split as Megatron reads it (parse_and_normalize_split): every run of digits and dots is
// a proportion, whatever separates them ("969,30,1", "98/2/0", "99 1 0", "'99,1,0'");
// missing parts are 0. Signs and letters are refused rather than skipped.
static void parse_split(Config *c) {
    double parts[3] = {0, 0, 0}, total = 0;
    int n = 0;
    for (const char *p = c->split; *p;) {
        if (!isdigit((unsigned char)*p) && *p != '.') {
            if (isalpha((unsigned char)*p) || *p == '-' || *p == '+')
                config_die("--split '%s': expected non-negative proportions like 969,30,1", c->split);
            p++;
            continue;
        }
        size_t len = strspn(p, "0123456789.");
        char number[64];
        char *end;
        snprintf(number, sizeof(number), "%.*s", (int)MT_MIN(len, sizeof(number) - 1), p);
        double v = strtod(number, &end);
        if (*end || end == number || !isfinite(v)) config_die("--split '%s': '%s' is not a number", c->split, number);
        if (n == 3) config_die("--split '%s' has more than 3 parts (train,valid,test)", c->split);
        parts[n++] = v;
        total += v;
        p += len;
    }
    if (total <= 0) config_die("--split '%s' must have a positive sum", c->split);
    for (int i = 0; i < 3; i++) c->split_fraction[i] = parts[i] / total;
}

static void parse_schedule_styles(Config *c) {
    static const char *styles[] = {"constant", "linear", "cosine", "WSD"};
    static const char *wsd_styles[] = {"linear", "cosine", "exponential", "minus_sqrt"};
    int found = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(c->lr_decay_style, styles[i])) found = i;
    if (found < 0) config_die("--lr-decay-style %s: use constant, linear, cosine or WSD", c->lr_decay_style);
    c->decay_style = (LrDecayStyle)found;
    found = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(c->lr_wsd_decay_style, wsd_styles[i])) found = i;
    if (found < 0)
        config_die("--lr-wsd-decay-style %s: use linear, cosine, exponential or minus_sqrt", c->lr_wsd_decay_style);
    c->wsd_style = (WsdDecayStyle)found;
}

// Model dimensions are ints: bounded so that the sums and small multiples the validation
// derives from them (padded vocabulary, 4·hidden, MLA head widths) cannot overflow, and
// a matrix of two of them has at most 2^48 elements.
enum { MAX_DIMENSION = 1 << 24 };
// Experts per MoE layer: each is three tensors of the table.
enum { MAX_EXPERTS = 1 << 14 };
// Routing choices of a micro-batch (tokens × experts bounds tokens × top-k and the padded
// rows experts × capacity): indices into the router's and dispatcher's int32 arrays.
#define MAX_ROUTING_SLOTS INT32_MAX
// Tokens of the built-in corpus and of `moetron data`'s dump (4 TiB of int32 tokens).
#define MAX_CORPUS_TOKENS ((int64_t)1 << 40)
// Processes of one parallel dimension: products of three stay inside int64 (groups.c).
enum { MAX_PARALLEL_SIZE = 1 << 20 };
// Samples a run reads from a split (Megatron's sample indices are built for them).
#define MAX_SAMPLES ((int64_t)1 << 48)

static void require_range(const char *flag, long long value, long long lo, long long hi) {
    if (value < lo || value > hi) config_die("--%s %lld is out of range: use %lld..%lld", flag, value, lo, hi);
}

static void require_dimension(const char *flag, long long value) {
    require_positive(flag, value);
    if (value > MAX_DIMENSION) config_die("--%s %lld is larger than the supported %d", flag, value, MAX_DIMENSION);
}

// a * b, or -1 when it exceeds limit (a, b >= 0)
static int64_t product_within(int64_t a, int64_t b, int64_t limit) {
    return b == 0 || a <= limit / b ? a * b : -1;
}

// A flag given on the command line without the feature it belongs to (it would do nothing):
// refused.
static void require_flag_context(const Config *c, const char *flag, int active, const char *feature) {
    if (config_flag_given(c, flag) && !active) config_die("--%s applies to %s; give it or drop the flag", flag, feature);
}

// --rope-type and its YaRN parameters, --use-rope-scaling, --rotary-seq-len-interpolation-factor.
// Megatron-Core's MLA configuration defaults to YaRN (MLATransformerConfig); with the default
// --rotary-scaling-factor 1 YaRN is plain rotary, so an MLA run that neither names a
// --rope-type nor read one from a file takes yarn once the factor asks for scaling.
static void default_mla_rope_type(Config *c) {
    int index = 0;
    find_flag("rope-type", &index);
    if (c->multi_latent_attention && !c->flag_given[index] && !c->value_key[index] && c->rotary_scaling_factor != 1 &&
        !strcmp(c->rope_type, "rope"))
        strcpy(c->rope_type, "yarn");
}

static void validate_rope_scaling(Config *c) {
    default_mla_rope_type(c);
    int yarn = !strcmp(c->rope_type, "yarn"), mla = c->multi_latent_attention;
    if (!yarn && strcmp(c->rope_type, "rope"))
        config_die("--rope-type %s is not supported; use rope or yarn", c->rope_type);
    require_flag_context(c, "beta-fast", yarn, "--rope-type yarn");
    require_flag_context(c, "beta-slow", yarn, "--rope-type yarn");
    require_flag_context(c, "mscale", yarn, "--rope-type yarn");
    // with MLA these two also set the softmax scale's correction (Megatron-Core's), YaRN or not
    require_flag_context(c, "mscale-all-dim", yarn || mla, "--rope-type yarn (or --multi-latent-attention)");
    require_flag_context(c, "rotary-scaling-factor", yarn || mla, "--rope-type yarn (or --multi-latent-attention)");
    require_flag_context(c, "rope-scaling-factor", c->use_rope_scaling, "--use-rope-scaling");
    require_flag_context(c, "original-max-position-embeddings", yarn || c->use_rope_scaling,
                        "--rope-type yarn or --use-rope-scaling");
    if (!(c->rotary_scaling_factor >= 1))
        config_die("--rotary-scaling-factor %g must be at least 1", c->rotary_scaling_factor);
    if (c->rotary_seq_len_interpolation_factor != 0 && !(c->rotary_seq_len_interpolation_factor >= 1))
        config_die("--rotary-seq-len-interpolation-factor %g must be at least 1 (or 0: off)",
                   c->rotary_seq_len_interpolation_factor);
    if (yarn + (c->rotary_seq_len_interpolation_factor != 0) + c->use_rope_scaling > 1)
        config_die("--rope-type yarn, --rotary-seq-len-interpolation-factor and --use-rope-scaling each rescale the "
                   "frequencies; give one");
    if (c->original_max_position_embeddings < 0)
        config_die("--original-max-position-embeddings %d must be positive (or 0: the scaling's default)",
                   c->original_max_position_embeddings);
    if (c->original_max_position_embeddings == 0 && (yarn || c->use_rope_scaling))
        c->original_max_position_embeddings = yarn ? 4096 : 8192;  // Megatron-Core's defaults
    if (c->use_rope_scaling && !(c->rope_scaling_factor >= 1))
        config_die("--rope-scaling-factor %g must be at least 1", c->rope_scaling_factor);
    if (!yarn) return;
    if (!(c->beta_fast > 0) || !(c->beta_slow > 0) || c->beta_slow > c->beta_fast)
        config_die("--beta-fast %g and --beta-slow %g must be positive with beta-slow <= beta-fast", c->beta_fast,
                   c->beta_slow);
    if (!isfinite(c->mscale) || !isfinite(c->mscale_all_dim))
        config_die("--mscale and --mscale-all-dim must be finite numbers");
}

// The MLPs and experts are always SwiGLU without biases: the switches Megatron scripts pass
// say so (and checkpoints record them as true, whatever older ones wrote); their negations
// are errors.
static void validate_fixed_switches(Config *c) {
    if (config_flag_given(c, "swiglu") && !c->swiglu)
        mt_die("--no-swiglu: moetron's MLPs and experts are always SwiGLU; drop the flag");
    if (config_flag_given(c, "disable-bias-linear") && !c->disable_bias_linear)
        mt_die("--no-disable-bias-linear: moetron's linear layers have no biases; drop the flag");
    c->swiglu = c->disable_bias_linear = 1;
}

static void validate_shape(Config *c) {
    require_positive("num-layers", c->num_layers);
    if (c->num_layers > MT_MAX_LAYERS) config_die("--num-layers %d exceeds the supported %d", c->num_layers, MT_MAX_LAYERS);
    require_dimension("hidden-size", c->hidden_size);
    require_dimension("num-attention-heads", c->num_attention_heads);
    require_dimension("seq-length", c->seq_length);
    require_range("max-position-embeddings", c->max_position_embeddings, 0, MAX_DIMENSION);
    require_range("kv-channels", c->kv_channels, 0, MAX_DIMENSION);
    require_dimension("vocab-size", c->vocab_size);
    require_dimension("make-vocab-size-divisible-by", c->make_vocab_size_divisible_by);
    if (c->kv_channels == 0 && c->hidden_size % c->num_attention_heads)
        config_die("--num-attention-heads %d does not divide --hidden-size %d; change one, or set --kv-channels",
               c->num_attention_heads, c->hidden_size);
    c->head_dim = c->kv_channels ? c->kv_channels : c->hidden_size / c->num_attention_heads;
    if (c->head_dim <= 0 || c->head_dim % 2)
        config_die("head dimension %d must be even for rotary embeddings (set --kv-channels)", c->head_dim);
    c->kv_heads = c->group_query_attention ? c->num_query_groups : c->num_attention_heads;
    if (c->group_query_attention) require_positive("num-query-groups", c->num_query_groups);
    if (c->num_attention_heads % c->kv_heads)
        config_die("--num-query-groups %d does not divide --num-attention-heads %d", c->kv_heads,
               c->num_attention_heads);
    if (!c->ffn_hidden_size) c->ffn_hidden_size = 4 * c->hidden_size;
    require_dimension("ffn-hidden-size", c->ffn_hidden_size);
    // padded to a multiple of --make-vocab-size-divisible-by x TP, so that each
    // tensor-parallel rank holds the same number of rows (as Megatron-LM); a checkpoint
    // keeps the rows it was saved with, so that any layout resumes any other
    int tp = MT_MAX(c->tensor_model_parallel_size, 1), m = c->make_vocab_size_divisible_by * tp;
    c->padded_vocab_size = (c->vocab_size + m - 1) / m * m;
    if (c->checkpoint_vocab_rows >= c->vocab_size) {
        if (c->checkpoint_vocab_rows % tp)
            config_die("--load: the checkpoint's vocabulary of %d rows (padded) does not split over "
                       "--tensor-model-parallel-size %d; choose a size that divides %d", c->checkpoint_vocab_rows, tp,
                       c->checkpoint_vocab_rows);
        c->padded_vocab_size = c->checkpoint_vocab_rows;
    }
    c->max_positions = c->max_position_embeddings ? c->max_position_embeddings : c->seq_length;
    if (c->seq_length > c->max_positions)
        config_die("--seq-length %d exceeds --max-position-embeddings %d; lower --seq-length to at most %d",
                   c->seq_length, c->max_positions, c->max_positions);
    if (c->norm_epsilon <= 0) config_die("--norm-epsilon must be positive");
    if (c->rotary_base <= 1) config_die("--rotary-base must be greater than 1");
    if (strcmp(c->normalization, "RMSNorm"))
        config_die("--normalization %s is not supported; give RMSNorm (moetron's only normalisation)", c->normalization);
    if (!strcmp(c->position_embedding_type, "yarn")) strcpy(c->rope_type, "yarn");  // Megatron's non-MLA spelling
    else if (strcmp(c->position_embedding_type, "rope"))
        config_die("--position-embedding-type %s is not supported; moetron uses rope (or yarn)", c->position_embedding_type);
    validate_rope_scaling(c);
}

// Index of value in names, or -1.
static int lookup(const char *value, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (!strcmp(value, names[i])) return i;
    return -1;
}

// --moe-router-load-balancing-type and --moe-aux-loss-coeff: lists of equal length.
static void parse_balance_losses(Config *c) {
    static const char *const types[] = {"aux_loss", "seq_aux_loss", "global_aux_loss", "none", "sinkhorn",
                                        "quantile_balancing"};
    enum { TYPE_NONE = 3, TYPE_SINKHORN = 4, TYPE_QUANTILE = 5, TYPE_NAMES = 6 };
    char type_list[128], coeff_list[128];
    snprintf(type_list, sizeof(type_list), "%s", c->moe_router_load_balancing_type);
    snprintf(coeff_list, sizeof(coeff_list), "%s", c->moe_aux_loss_coeff);
    char *type_save, *coeff_save;
    char *type = strtok_r(type_list, ",", &type_save), *coeff = strtok_r(coeff_list, ",", &coeff_save);
    int n_types = 0;
    for (int t = 0; t < 3; t++) c->balance_coeff[t] = 0;
    c->sinkhorn_routing = c->quantile_balancing = 0;
    for (; type; type = strtok_r(NULL, ",", &type_save), coeff = coeff ? strtok_r(NULL, ",", &coeff_save) : NULL) {
        int kind = lookup(type, types, TYPE_NAMES);
        if (kind < 0)
            config_die("--moe-router-load-balancing-type %s: use aux_loss, seq_aux_loss, global_aux_loss, none, "
                       "sinkhorn or quantile_balancing", type);
        n_types++;
        c->sinkhorn_routing |= kind == TYPE_SINKHORN;
        c->quantile_balancing |= kind == TYPE_QUANTILE;
        if (!coeff)
            config_die("--moe-aux-loss-coeff %s has fewer values than --moe-router-load-balancing-type %s; give one "
                   "coefficient per type", c->moe_aux_loss_coeff, c->moe_router_load_balancing_type);
        double value = parse_double("moe-aux-loss-coeff", coeff);
        if (value < 0) config_die("--moe-aux-loss-coeff must be >= 0");
        if (kind < TYPE_NONE) c->balance_coeff[kind] = value;
        if (kind >= TYPE_SINKHORN && value != 0)
            config_die("--moe-router-load-balancing-type %s has no aux loss (Megatron-Core asserts it); give "
                       "--moe-aux-loss-coeff 0", types[kind]);
    }
    if ((c->sinkhorn_routing || c->quantile_balancing) && n_types > 1)
        config_die("--moe-router-load-balancing-type %s balances by itself; give it alone",
                   c->sinkhorn_routing ? "sinkhorn" : "quantile_balancing");
    if (coeff && n_types > 0)
        config_die("--moe-aux-loss-coeff %s has more values than --moe-router-load-balancing-type %s", c->moe_aux_loss_coeff,
               c->moe_router_load_balancing_type);
}

// --moe-router-load-balancing-type sinkhorn, as Megatron-Core routes it: sigmoid scores for
// top-1, otherwise the softmax over all experts (the probs not renormalised over the k); the
// router options its Sinkhorn path ignores are refused rather than silently dropped.
static void validate_sinkhorn(Config *c) {
    int k1 = c->moe_router_topk == 1;
    const char *score = k1 ? "sigmoid" : "softmax";
    if (config_flag_given(c, "moe-router-score-function") && strcmp(c->moe_router_score_function, score))
        config_die("--moe-router-load-balancing-type sinkhorn scores with %s for --moe-router-topk %d; drop "
                   "--moe-router-score-function %s", score, c->moe_router_topk, c->moe_router_score_function);
    if (c->moe_router_enable_expert_bias || c->moe_router_num_groups || c->moe_router_topk_scaling_factor > 0)
        config_die("--moe-router-load-balancing-type sinkhorn takes no expert bias, group-limited routing or top-k "
                   "scaling factor (Megatron-Core's Sinkhorn router has none)");
    snprintf(c->moe_router_score_function, sizeof c->moe_router_score_function, "%s", score);
    c->score_function = k1 ? 1 : 0;
    c->moe_router_pre_softmax = !k1;
}

// --moe-router-load-balancing-type quantile_balancing, as Megatron-Core: the picks are the
// top-k of logits − bias, the probs the configured score function's; each micro-batch's
// N·k assignments must split evenly over the experts, and k + 1 experts must exist.
static void validate_quantile_balancing(const Config *c) {
    int64_t assignments = (int64_t)c->micro_batch_size * c->seq_length * c->moe_router_topk;
    if (c->moe_router_topk >= c->num_experts)
        config_die("--moe-router-load-balancing-type quantile_balancing needs --moe-router-topk %d below --num-experts "
                   "%d (it reads each token's (k+1)-th expert)", c->moe_router_topk, c->num_experts);
    if (assignments % c->num_experts)
        config_die("--moe-router-load-balancing-type quantile_balancing needs --micro-batch-size x --seq-length x "
                   "--moe-router-topk (%lld) to be a multiple of --num-experts %d", (long long)assignments,
                   c->num_experts);
    if (c->moe_router_enable_expert_bias || c->moe_router_num_groups)
        config_die("--moe-router-load-balancing-type quantile_balancing keeps its own per-expert bias; drop "
                   "--moe-router-enable-expert-bias and group-limited routing");
    if (!(c->moe_router_quantile_balancing_ema >= 0 && c->moe_router_quantile_balancing_ema < 1))
        config_die("--moe-router-quantile-balancing-ema %g must be in [0, 1)", c->moe_router_quantile_balancing_ema);
}

static void validate_router(Config *c) {
    static const char *const scores[] = {"softmax", "sigmoid", "sqrtsoftplus"};
    static const char *const policies[] = {"probs", "position"};
    static const char *const dtypes[] = {"fp32", "fp64"};
    c->score_function = lookup(c->moe_router_score_function, scores, 3);
    if (c->score_function < 0)
        config_die("--moe-router-score-function %s: use softmax, sigmoid or sqrtsoftplus", c->moe_router_score_function);
    c->drop_policy = lookup(c->moe_token_drop_policy, policies, 2);
    if (c->drop_policy < 0) config_die("--moe-token-drop-policy %s: use probs or position", c->moe_token_drop_policy);
    int dtype = lookup(c->moe_router_dtype, dtypes, 2);
    if (dtype < 0) config_die("--moe-router-dtype %s: use fp32 or fp64", c->moe_router_dtype);
    c->router_fp64 = dtype == 1;
    parse_balance_losses(c);
    if (c->num_experts == 0) return;
    if (c->sinkhorn_routing) validate_sinkhorn(c);
    if (c->quantile_balancing) validate_quantile_balancing(c);
    require_flag_context(c, "moe-router-quantile-balancing-ema", c->quantile_balancing,
                         "--moe-router-load-balancing-type quantile_balancing");
    int softmax = c->score_function == 0;
    if (softmax && c->moe_router_topk == 1 && !c->moe_router_pre_softmax)
        config_die("--moe-router-topk 1 with softmax needs --moe-router-pre-softmax (the softmax of one logit is "
               "always 1 and the router would never learn)");
    if (c->moe_router_enable_expert_bias && softmax)
        config_die("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus");
    if (c->moe_router_topk_scaling_factor < 0) config_die("--moe-router-topk-scaling-factor must be >= 0");
    if (c->moe_router_bias_update_rate < 0) config_die("--moe-router-bias-update-rate must be >= 0");
    if (c->moe_z_loss_coeff < 0) config_die("--moe-z-loss-coeff must be >= 0");
    if (c->moe_input_jitter_eps < 0 || c->moe_input_jitter_eps >= 1) config_die("--moe-input-jitter-eps must be in [0, 1)");
    require_range("moe-shared-expert-intermediate-size", c->moe_shared_expert_intermediate_size, 0, MAX_DIMENSION);
    if (c->moe_shared_expert_gate && !c->moe_shared_expert_intermediate_size)
        config_die("--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
    if (c->moe_expert_capacity_factor < 0) c->moe_expert_capacity_factor = 0;  // Megatron: negative = dropless
    if (c->moe_pad_expert_input_to_capacity && c->moe_expert_capacity_factor == 0)
        config_die("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
    int G = c->moe_router_num_groups, g = c->moe_router_group_topk;
    if (G || g) {
        if (G <= 0 || g <= 0) config_die("--moe-router-num-groups and --moe-router-group-topk go together, both positive");
        if (c->num_experts % G)
            config_die("--moe-router-num-groups %d does not divide --num-experts %d", G, c->num_experts);
        if (g > G) config_die("--moe-router-group-topk %d exceeds --moe-router-num-groups %d", g, G);
        if (c->moe_router_topk % g)
            config_die("--moe-router-group-topk %d does not divide --moe-router-topk %d", g, c->moe_router_topk);
        if (c->moe_router_topk / g > c->num_experts / G)
            config_die("--moe-router-topk %d needs %d experts per chosen group, but a group has %d", c->moe_router_topk,
                   c->moe_router_topk / g, c->num_experts / G);
    }
}

// The query (and output) projection of all heads, heads × a per-head width, is a model
// dimension too (attention_widths, the tensor shapes).
static void require_projection_width(const char *width_flag, int width, const Config *c) {
    if (product_within(c->num_attention_heads, width, MAX_DIMENSION) < 0)
        config_die("--num-attention-heads %d times the head width %d (--%s) exceeds the supported %d; lower one",
                   c->num_attention_heads, width, width_flag, MAX_DIMENSION);
}

// --qk-layernorm-scope, --clip-qkv and Multi-Latent Attention.
static void validate_attention(Config *c) {
    if (!(c->attention_dropout >= 0 && c->attention_dropout < 1)) config_die("--attention-dropout must be in [0, 1)");
    if (!(c->hidden_dropout >= 0 && c->hidden_dropout < 1)) config_die("--hidden-dropout must be in [0, 1)");
    static const char *const scopes[] = {"head", "projection"};
    int scope = lookup(c->qk_layernorm_scope, scopes, 2);
    if (scope < 0) config_die("--qk-layernorm-scope %s: use head or projection", c->qk_layernorm_scope);
    if (scope == 1 && !c->qk_layernorm) config_die("--qk-layernorm-scope projection needs --qk-layernorm");
    c->qk_norm_whole = c->qk_layernorm && scope == 1;
    if (c->clip_qkv < 0) config_die("--clip-qkv must be >= 0 (0 = off)");
    c->rope_dim = c->head_dim;
    if (!c->multi_latent_attention) {
        require_projection_width("kv-channels", c->head_dim, c);
        return;
    }
    if (c->group_query_attention)
        config_die("--multi-latent-attention has one key/value head per query head; drop --group-query-attention");
    if (c->clip_qkv > 0) config_die("--clip-qkv applies to standard attention, not --multi-latent-attention");
    require_range("q-lora-rank", c->q_lora_rank, 0, MAX_DIMENSION);  // 0 = full-rank query projection
    require_dimension("kv-lora-rank", c->kv_lora_rank);
    require_dimension("qk-head-dim", c->qk_head_dim);
    require_dimension("qk-pos-emb-head-dim", c->qk_pos_emb_head_dim);
    require_dimension("v-head-dim", c->v_head_dim);
    if (c->qk_pos_emb_head_dim % 2) config_die("--qk-pos-emb-head-dim %d must be even for rotary embeddings", c->qk_pos_emb_head_dim);
    c->head_dim = c->qk_head_dim + c->qk_pos_emb_head_dim;  // query/key width per head
    c->kv_heads = c->num_attention_heads;
    c->rope_dim = c->qk_pos_emb_head_dim;
    require_projection_width("qk-head-dim", c->head_dim, c);
    require_projection_width("v-head-dim", c->v_head_dim, c);
}

// "5GB", "500MB", "10KB" (powers of 1000, as Hugging Face) or a number of bytes.
static int64_t parse_size(const char *flag, const char *text) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    static const struct { const char *suffix; double scale; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    for (size_t i = 0; end != text && errno == 0 && i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(end, units[i].suffix) && v * units[i].scale >= 1 && v * units[i].scale < 9e18)
            return (int64_t)(v * units[i].scale);
    config_die("--%s %s: expected a size like 5GB, 500MB or a number of bytes", flag, text);
}

// The pipeline placement (parallel/pipeline_layout.h) and the schedule's counts.
static void validate_pipeline(const Config *c) {
    require_range("num-layers-per-virtual-pipeline-stage", c->num_layers_per_virtual_pipeline_stage, 0, MT_MAX_LAYERS);
    require_range("num-virtual-stages-per-pipeline-rank", c->num_virtual_stages_per_pipeline_rank, 0, MT_MAX_LAYERS);
    require_range("microbatch-group-size-per-virtual-pipeline-stage", c->microbatch_group_size_per_vp_stage, 0,
                  1 << 24);
    require_range("decoder-first-pipeline-num-layers", c->decoder_first_pipeline_num_layers, -1, c->num_layers);
    require_range("decoder-last-pipeline-num-layers", c->decoder_last_pipeline_num_layers, -1, c->num_layers);
    PipelineLayout layout;
    char err[512];
    if (pipeline_layout_make(&layout, c, err, sizeof(err))) config_die("%s", err);
}

// The expert-parallel overlaps: Megatron-Core's conditions.
static void validate_comm_overlap(const Config *c) {
    int alltoall = !strcmp(c->moe_token_dispatcher_type, "alltoall");
    if (c->moe_shared_expert_overlap && (!c->moe_shared_expert_intermediate_size || !alltoall))
        config_die("--moe-shared-expert-overlap needs a shared expert (--moe-shared-expert-intermediate-size) and "
                   "--moe-token-dispatcher-type alltoall");
    if (c->delay_wgrad_compute && !c->overlap_moe_expert_parallel_comm)
        config_die("--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm");
    if (!c->overlap_moe_expert_parallel_comm) return;
    if (c->expert_model_parallel_size < 2 || !alltoall)
        config_die("--overlap-moe-expert-parallel-comm needs --expert-model-parallel-size above 1 and "
                   "--moe-token-dispatcher-type alltoall");
    if (c->moe_shared_expert_overlap)
        config_die("--overlap-moe-expert-parallel-comm and --moe-shared-expert-overlap exclude each other; drop one");
    PipelineLayout layout;
    char err[512];
    if (c->pipeline_model_parallel_size > 1 && !pipeline_layout_make(&layout, c, err, sizeof(err)) && layout.vp == 1)
        config_die("--overlap-moe-expert-parallel-comm with --pipeline-model-parallel-size %d needs virtual pipeline "
                   "stages (--num-virtual-stages-per-pipeline-rank)", c->pipeline_model_parallel_size);
}

const char *const RECOMPUTE_MODULE_NAMES[RECOMPUTE_MODULES] = {"core_attn", "moe_act", "layernorm", "mlp",
                                                                 "shared_experts", "mla_up_proj", "moe"};

int config_gemm_inputs(const Config *c) {
    return c->bf16 ? GEMM_INPUTS_BF16 : c->fp16 ? GEMM_INPUTS_FP16 : GEMM_INPUTS_FP32;
}

// --bf16 / --fp16 and loss scaling, with Megatron's rules.
static void validate_precision(Config *c) {
    if (c->bf16 && c->fp16) config_die("--bf16 and --fp16: use one of them");
    if (c->loss_scale < 0) config_die("--loss-scale %g: use a positive scale (or 0 for none)", c->loss_scale);
    if (c->loss_scale > 0 && !c->fp16 && !c->bf16 && !c->use_distributed_optimizer)
        config_die("--loss-scale %g needs --fp16, --bf16 or --use-distributed-optimizer (Megatron ignores it "
                   "otherwise); drop it", c->loss_scale);
    if (!c->fp16) return;  // the dynamic scaling's flags are Megatron's defaults then, and unused
    if (!(c->min_loss_scale > 0 && c->min_loss_scale <= c->initial_loss_scale))
        config_die("--min-loss-scale %g: use a positive scale no larger than --initial-loss-scale %g",
                   c->min_loss_scale, c->initial_loss_scale);
    if (!(c->initial_loss_scale <= FLT_MAX))
        config_die("--initial-loss-scale %g: use a scale an fp32 holds (at most %g)", c->initial_loss_scale,
                   (double)FLT_MAX);
    if (!(c->loss_scale_window >= 1 && c->loss_scale_window == floor(c->loss_scale_window) &&
          c->loss_scale_window <= INT_MAX))
        config_die("--loss-scale-window %g: use a whole number of steps, at least 1", c->loss_scale_window);
    require_range("hysteresis", c->hysteresis, 1, INT_MAX);
}

// --use-precision-aware-optimizer and the dtypes of the optimizer's state (Megatron's
// checks, and what moetron's fp32 weights and gradients leave to choose).
static void validate_precision_optimizer(Config *c) {
    static const char *const moments[] = {"fp32", "bf16", "fp16", "fp8"};  // MomentDtype order
    const char *flags[2] = {"exp-avg-dtype", "exp-avg-sq-dtype"}, *values[2] = {c->exp_avg_dtype, c->exp_avg_sq_dtype};
    for (int k = 0; k < 2; k++) {
        c->moment_dtype[k] = lookup(values[k], moments, 4);
        if (c->moment_dtype[k] < 0) config_die("--%s %s: use fp32, bf16, fp16 or fp8", flags[k], values[k]);
        if (c->moment_dtype[k] && !c->use_precision_aware_optimizer)
            config_die("--%s %s needs --use-precision-aware-optimizer (as in Megatron)", flags[k], values[k]);
    }
    if (strcmp(c->main_grads_dtype, "fp32"))
        config_die("--main-grads-dtype %s: moetron accumulates and reduces gradients in fp32 (its weights are fp32, "
                   "and so are Megatron's main gradients then); use fp32", c->main_grads_dtype);
    if (strcmp(c->main_params_dtype, "fp32"))
        config_die("--main-params-dtype %s: moetron's weights are fp32 and are the optimizer's own (there is no "
                   "16-bit model copy whose fp32 master could shrink, as with Megatron's fp32 weights); use fp32",
                   c->main_params_dtype);
    if (!(c->optimizer_offload_fraction >= 0 && c->optimizer_offload_fraction <= 1))
        config_die("--optimizer-offload-fraction %g: use a fraction between 0 and 1", c->optimizer_offload_fraction);
    if (c->optimizer_cpu_offload && !c->use_precision_aware_optimizer)
        config_die("--optimizer-cpu-offload needs --use-precision-aware-optimizer (as in Megatron, whose offloading "
                   "optimizer is the precision-aware one)");
    if (c->use_precision_aware_optimizer && !c->use_distributed_optimizer)
        config_die("--use-precision-aware-optimizer needs --use-distributed-optimizer (as in Megatron; it works on "
                   "one process too)");
}

// --recompute-modules into c->recompute_module_mask.
static void parse_recompute_modules(Config *c) {
    char list[sizeof(c->recompute_modules)], *save;
    snprintf(list, sizeof(list), "%s", c->recompute_modules);
    c->recompute_module_mask = 0;
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        int module = lookup(name, RECOMPUTE_MODULE_NAMES, RECOMPUTE_MODULES);
        if (module < 0)
            config_die("--recompute-modules %s: use core_attn, moe_act, layernorm, mlp, shared_experts, mla_up_proj "
                       "or moe", name);
        c->recompute_module_mask |= 1u << module;
    }
}

// Activation recomputation: Megatron-Core's rules (full granularity needs a method and a
// layer count; selective takes neither, and names its modules).
static void validate_recompute(Config *c) {
    if (c->recompute_activations) {  // as Megatron: it sets the granularity, whatever was given
        snprintf(c->recompute_granularity, sizeof(c->recompute_granularity), "%s", "selective");
        c->recompute_activations = 0;  // applied once (a checkpoint stores the granularity)
    }
    if (c->distribute_saved_activations)
        config_die("--distribute-saved-activations is not built: with --sequence-parallel the inputs full "
                   "recomputation keeps are split over the tensor-parallel ranks already (use it instead)");
    static const char *const granularities[] = {"full", "selective"}, *const methods[] = {"uniform", "block"};
    int granularity = c->recompute_granularity[0] ? lookup(c->recompute_granularity, granularities, 2) : -1;
    if (c->recompute_granularity[0] && granularity < 0)
        config_die("--recompute-granularity %s: use full or selective", c->recompute_granularity);
    if (c->recompute_method[0] && lookup(c->recompute_method, methods, 2) < 0)
        config_die("--recompute-method %s: use uniform or block", c->recompute_method);
    if (granularity != 0 && (c->recompute_method[0] || c->recompute_num_layers))
        config_die("--recompute-method and --recompute-num-layers need --recompute-granularity full");
    if (granularity != 1 && config_flag_given(c, "recompute-modules"))
        config_die("--recompute-modules needs --recompute-granularity selective");
    c->recompute_module_mask = 0;
    if (granularity == 1) parse_recompute_modules(c);
    if (granularity != 0) return;
    if (!c->recompute_method[0])
        config_die("--recompute-granularity full needs --recompute-method uniform or block");
    if (c->recompute_num_layers < 1 || c->recompute_num_layers > c->num_layers)
        config_die("--recompute-granularity full needs --recompute-num-layers between 1 and --num-layers (%d)",
                   c->num_layers);
}

static void validate_parallel(Config *c) {
    if (!device_name_known(c->device)) config_die("--device %s: use %s", c->device, DEVICE_NAMES);
    static const char *const dispatchers[] = {"alltoall", "allgather"};
    int flex = !strcmp(c->moe_token_dispatcher_type, "flex");  // Megatron's fused all-to-all (DeepEP, HybridEP)
    if (flex) strcpy(c->moe_token_dispatcher_type, "alltoall");
    require_flag_context(c, "moe-flex-dispatcher-backend", flex, "--moe-token-dispatcher-type flex");
    if (lookup(c->moe_token_dispatcher_type, dispatchers, 2) < 0)
        config_die("--moe-token-dispatcher-type %s: use alltoall, allgather or flex", c->moe_token_dispatcher_type);
}

static void validate_checkpoint_format(Config *c) {
    static const char *const dtypes[] = {"fp32", "bf16", "fp8"};
    static const char *const families[] = {"auto", "mixtral", "qwen3_moe", "olmoe", "deepseek_v3"};
    int dtype = lookup(c->ckpt_dtype, dtypes, 3);
    if (dtype < 0) config_die("--ckpt-dtype %s: use fp32, bf16 or fp8", c->ckpt_dtype);
    c->ckpt_bf16 = dtype >= 1;  // fp8 writes the tensors it does not quantize as bf16 does
    c->ckpt_fp8 = dtype == 2;
    c->max_shard_bytes = parse_size("max-shard-size", c->max_shard_size);
    if (lookup(c->hf_architecture, families, 5) < 0)
        config_die("--hf-architecture %s: use auto, mixtral, qwen3_moe, olmoe or deepseek_v3", c->hf_architecture);
}

// The GEMM widths a quantization recipe blocks along (each weight's in and out), which TE
// requires to be multiples of the recipe's alignment (16 for FP8 and NVFP4, 32 for MXFP8).
typedef struct {
    const char *what;
    int width;
} QuantWidth;

static void validate_quant_widths(const Config *c, int align, const char *recipe) {
    QuantWidth w[12];
    int n = 0, H = c->num_attention_heads;
    w[n++] = (QuantWidth){"--hidden-size", c->hidden_size};
    w[n++] = (QuantWidth){"--ffn-hidden-size", c->ffn_hidden_size};
    if (c->num_experts) w[n++] = (QuantWidth){"the expert FFN width", c->moe_ffn};
    if (c->moe_latent_size) w[n++] = (QuantWidth){"--moe-latent-size", c->moe_latent_size};
    w[n++] = (QuantWidth){"--moe-shared-expert-intermediate-size", c->moe_shared_expert_intermediate_size};
    if (c->multi_latent_attention) {
        w[n++] = (QuantWidth){"--q-lora-rank", c->q_lora_rank};
        w[n++] = (QuantWidth){"--kv-lora-rank", c->kv_lora_rank};
        w[n++] = (QuantWidth){"--kv-lora-rank + --qk-pos-emb-head-dim", c->kv_lora_rank + c->qk_pos_emb_head_dim};
        w[n++] = (QuantWidth){"heads x (--qk-head-dim + --qk-pos-emb-head-dim)", H * (c->qk_head_dim + c->qk_pos_emb_head_dim)};
        w[n++] = (QuantWidth){"heads x (--qk-head-dim + --v-head-dim)", H * (c->qk_head_dim + c->v_head_dim)};
        w[n++] = (QuantWidth){"heads x --v-head-dim", H * c->v_head_dim};
    } else {
        w[n++] = (QuantWidth){"heads x head dim", H * c->head_dim};
        w[n++] = (QuantWidth){"key/value heads x head dim", c->kv_heads * c->head_dim};
    }
    for (int i = 0; i < n; i++)
        if (w[i].width % align)
            config_die("%s: %s is %d; its GEMMs need widths that are multiples of %d (as Transformer Engine's)",
                       recipe, w[i].what, w[i].width, align);
}

// --moe-router-padding-for-quantization: Megatron-LM's rules, and padding to capacity
// (which already fixes every expert's rows) not with it.
static void validate_router_padding(const Config *c) {
    if (!c->moe_router_padding_for_quantization) return;
    if (c->quant_recipe == QUANT_OFF)
        config_die("--moe-router-padding-for-quantization needs --fp8-format or --fp4-format (as in Megatron-LM)");
    if (!strcmp(c->moe_token_dispatcher_type, "allgather"))
        config_die("--moe-router-padding-for-quantization does not work with --moe-token-dispatcher-type allgather "
                   "(as in Megatron-LM): use alltoall");
    if (c->moe_pad_expert_input_to_capacity)
        config_die("--moe-router-padding-for-quantization with --moe-pad-expert-input-to-capacity: padding to "
                   "capacity already gives every expert the same rows; choose one");
}

// --fp8-* / --fp4-* and --first-last-layers-bf16: Megatron-LM's values and rules, into
// c->quant_recipe (a QuantRecipe of ops/quantized_linear.h).
static void validate_fp8(Config *c) {
    static const char *const recipes[] = {"delayed", "tensorwise", "blockwise", "mxfp8"};  // QUANT_DELAYED..
    static const char *const algos[] = {"most_recent", "max"};
    static const char *const fp8_only[] = {"fp8-recipe", "fp8-amax-history-len", "fp8-amax-compute-algo", "fp8-margin"};
    int fp8 = c->fp8_format[0] != 0, fp4 = c->fp4_format[0] != 0;
    if (fp8 && strcmp(c->fp8_format, "e4m3") && strcmp(c->fp8_format, "hybrid"))
        config_die("--fp8-format %s: use e4m3 or hybrid", c->fp8_format);
    if (fp4 && strcmp(c->fp4_format, "e2m1")) config_die("--fp4-format %s: use e2m1 (NVFP4)", c->fp4_format);
    if (fp8 && fp4) config_die("--fp4-format and --fp8-format cannot be used together (as in Megatron-LM): choose one");
    int recipe = lookup(c->fp8_recipe, recipes, 4);
    if (recipe < 0) config_die("--fp8-recipe %s: use delayed, tensorwise, blockwise or mxfp8", c->fp8_recipe);
    if (strcmp(c->fp4_recipe, "nvfp4")) config_die("--fp4-recipe %s: use nvfp4", c->fp4_recipe);
    if (lookup(c->fp8_amax_compute_algo, algos, 2) < 0)
        config_die("--fp8-amax-compute-algo %s: use most_recent or max", c->fp8_amax_compute_algo);
    require_range("fp8-amax-history-len", c->fp8_amax_history_len, 1, 1 << 16);
    require_range("fp8-margin", c->fp8_margin, -127, 127);
    for (int i = 0; i < 4 && !fp8; i++)
        if (config_flag_given(c, fp8_only[i])) config_die("--%s needs --fp8-format", fp8_only[i]);
    if (!fp4 && config_flag_given(c, "fp4-recipe")) config_die("--fp4-recipe needs --fp4-format");
    c->quant_recipe = fp4 ? QUANT_NVFP4 : fp8 ? QUANT_DELAYED + recipe : QUANT_OFF;
    validate_router_padding(c);
    if (c->first_last_layers_bf16 && !c->quant_recipe)
        config_die("--first-last-layers-bf16 needs --fp8-format or --fp4-format");
    if (c->first_last_layers_bf16 && c->quant_recipe == QUANT_DELAYED)
        config_die("--first-last-layers-bf16 with --fp8-recipe delayed: delayed scaling does not support first / "
                   "last layers in BF16 (as in Megatron-LM); use tensorwise, blockwise or mxfp8");
    int per_stage = c->num_layers / MT_MAX(c->pipeline_model_parallel_size, 1);
    require_range("num-layers-at-start-in-bf16", c->num_layers_at_start_in_bf16, 0, per_stage);
    require_range("num-layers-at-end-in-bf16", c->num_layers_at_end_in_bf16, 0, per_stage);
    if (!c->quant_recipe) return;
    const char *name = fp4 ? "--fp4-recipe nvfp4" : c->quant_recipe == QUANT_MXFP8 ? "--fp8-recipe mxfp8" : "--fp8-format";
    validate_quant_widths(c, quant_recipe_alignment((QuantRecipe)c->quant_recipe), name);
#ifdef MT_DOUBLE
    config_die("--fp8-format / --fp4-format: the double-precision build has no quantized GEMMs");
#endif
}

// --moe-use-upcycling: an MoE model from the dense checkpoint --load names (its
// --ffn-hidden-size F): the experts are F/G wide (G the granularity), their count a
// multiple of G, as Megatron-Core's upcycling requires.
static void validate_upcycling(Config *c) {
    int G = c->moe_upcycling_granularity, F = c->ffn_hidden_size;
    if (!c->load[0]) config_die("--moe-use-upcycling starts from a dense checkpoint; give it with --load");
    if (c->num_experts == 0 || !config_flag_given(c, "num-experts"))
        config_die("--moe-use-upcycling makes an MoE model; give --num-experts");
    if (G < 1) config_die("--moe-upcycling-granularity %d must be at least 1", G);
    if (c->num_experts % G)
        config_die("--num-experts %d is not a multiple of --moe-upcycling-granularity %d", c->num_experts, G);
    if (!config_flag_given(c, "moe-ffn-hidden-size")) {
        if (F % G) config_die("the dense --ffn-hidden-size %d does not split into --moe-upcycling-granularity %d", F, G);
        c->moe_ffn_hidden_size = F / G;
    }
    if ((int64_t)c->moe_ffn_hidden_size * G != F)
        config_die("--moe-ffn-hidden-size %d times --moe-upcycling-granularity %d must be the dense --ffn-hidden-size %d",
                   c->moe_ffn_hidden_size, G, F);
}

// --moe-latent-size: a positive width, and only for a model with routed experts (a
// checkpoint's 0 restored without the flag means off).
static void validate_latent_moe(const Config *c) {
    if (!config_flag_given(c, "moe-latent-size") && c->moe_latent_size == 0) return;
    if (c->num_experts == 0)
        config_die("--moe-latent-size projects the routed experts' tokens; the model has no experts (give --num-experts "
                   "or drop the flag)");
    require_dimension("moe-latent-size", c->moe_latent_size);
    if (c->moe_use_upcycling)
        config_die("--moe-latent-size with --moe-use-upcycling: the dense MLPs the experts are copied from are "
                   "--hidden-size wide, not latent; drop one of the two");
}

static void validate_moe(Config *c) {
    require_range("num-experts", c->num_experts, 0, MAX_EXPERTS);
    validate_latent_moe(c);
    if (c->moe_use_upcycling) validate_upcycling(c);
    require_flag_context(c, "moe-upcycling-granularity", c->moe_use_upcycling, "--moe-use-upcycling");
    if (c->num_experts > 0) {
        require_positive("moe-router-topk", c->moe_router_topk);
        if (c->moe_router_topk > c->num_experts)
            config_die("--moe-router-topk %d exceeds --num-experts %d", c->moe_router_topk, c->num_experts);
        c->moe_ffn = c->moe_ffn_hidden_size ? c->moe_ffn_hidden_size : c->ffn_hidden_size;
        require_dimension("moe-ffn-hidden-size", c->moe_ffn);
    }
    parse_moe_layer_freq(c);
    validate_router(c);
    if (c->moe_enable_routing_replay && !c->moe_routing_trace_path[0])
        config_die("--moe-enable-routing-replay reads the picks from --moe-routing-trace-path; give the directory a "
                   "recording run wrote");
    if (c->moe_routing_trace_path[0] && c->num_experts == 0)
        config_die("--moe-routing-trace-path traces MoE routing; the model has no experts (--num-experts 0)");
}

// Multi-token prediction: each depth's transformer layer is of the last decoder layer's kind
// (MoE or dense), as Megatron-Core builds it; its layer index follows the decoder's.
static void validate_mtp(Config *c) {
    int D = c->mtp_num_layers, L = c->num_layers;
    require_range("mtp-num-layers", D, 0, MT_MAX_LAYERS - L);
    require_flag_context(c, "mtp-loss-scaling-factor", D > 0, "--mtp-num-layers");
    if (!(c->mtp_loss_scaling_factor >= 0))
        config_die("--mtp-loss-scaling-factor %g must be >= 0", c->mtp_loss_scaling_factor);
    if (!D) return;
    for (int k = 0; k < D; k++) c->moe_layer[L + k] = c->moe_layer[L - 1];
}

// Sizes derived from the batch flags: the routing slots of a micro-batch, the samples the
// run reads (train_iters global batches; validation (train_iters / eval_interval + 1) ·
// eval_iters micro-batch groups of a global batch) and the tokens `moetron data` dumps.
static void validate_batch_sizes(const Config *c) {
    int64_t tokens = (int64_t)c->micro_batch_size * c->seq_length;
    if (product_within(tokens, MT_MAX(c->num_experts, 1), MAX_ROUTING_SLOTS) < 0)
        config_die("--micro-batch-size %d x --seq-length %d x --num-experts %d is above the supported %lld routing "
                   "slots per micro-batch; lower one", c->micro_batch_size, c->seq_length, c->num_experts,
                   (long long)MAX_ROUTING_SLOTS);
    if (product_within(MT_MAX(c->train_iters, 0), c->global_batch_size, MAX_SAMPLES) < 0)
        config_die("--train-iters %d x --global-batch-size %d is above the supported %lld training samples; lower one",
                   c->train_iters, c->global_batch_size, (long long)MAX_SAMPLES);
    int64_t evals = c->eval_interval > 0 && c->eval_iters > 0 ? c->train_iters / c->eval_interval + 1 : 0;
    if (product_within(product_within(evals, c->eval_iters, MAX_SAMPLES), c->global_batch_size, MAX_SAMPLES) < 0)
        config_die("--eval-iters %d x --global-batch-size %d at every --eval-interval %d of --train-iters %d is above the "
                   "supported %lld validation samples; lower one", c->eval_iters, c->global_batch_size,
                   c->eval_interval, c->train_iters, (long long)MAX_SAMPLES);
    if (c->num_samples < 0 || product_within(c->num_samples, (int64_t)c->seq_length + 1, MAX_CORPUS_TOKENS) < 0)
        config_die("--num-samples %lld of --seq-length %d + 1 tokens is out of range: at most %lld tokens in all",
                   (long long)c->num_samples, c->seq_length, (long long)MAX_CORPUS_TOKENS);
}

// The logging flags of Megatron-LM that moetron takes (docs/metrics.md, "TensorBoard").
static void validate_logging(Config *c) {
    require_positive("log-interval", c->log_interval);
    require_positive("tensorboard-log-interval", c->tensorboard_log_interval);
    require_positive("tensorboard-queue-size", c->tensorboard_queue_size);
}

// Sample-based runs (--train-samples, as Megatron): the iterations, and the schedule's
// lengths in samples, refused beside their iteration-based counterparts.
static void validate_sample_based(Config *c) {
    if (c->train_samples < 0 || c->lr_warmup_samples < 0 || c->lr_decay_samples < 0 || c->lr_wsd_decay_samples < 0)
        config_die("--train-samples, --lr-warmup-samples, --lr-decay-samples and --lr-wsd-decay-samples must be >= 0");
    if (c->train_samples == 0) {
        if (c->lr_warmup_samples || c->lr_decay_samples || c->lr_wsd_decay_samples)
            config_die("--lr-warmup-samples, --lr-decay-samples and --lr-wsd-decay-samples go with --train-samples; "
                       "give it, or use --lr-warmup-iters, --lr-decay-iters, --lr-wsd-decay-iters");
        return;
    }
    if (config_flag_given(c, "train-iters"))
        config_die("--train-iters and --train-samples exclude each other (as in Megatron); give one");
    if (c->lr_warmup_iters || c->lr_decay_iters || c->lr_wsd_decay_iters)
        config_die("--train-samples counts the schedule in samples: give --lr-warmup-samples, --lr-decay-samples, "
                   "--lr-wsd-decay-samples instead of the -iters flags");
    int64_t iters = c->train_samples / c->global_batch_size;  // Megatron's floor
    if (iters > INT_MAX) config_die("--train-samples %lld is above the supported %d steps of --global-batch-size %d",
                                    (long long)c->train_samples, INT_MAX, c->global_batch_size);
    c->train_iters = (int)iters;
}

// The learning-rate schedule in optimizer steps (train/lr_schedule.h): Megatron's
// scheduler counts samples, so lengths given in samples become fractional steps.
static void validate_lr_schedule(Config *c) {
    if (c->train_iters < 0) config_die("--train-iters must be >= 0");
    if (c->lr < 0 || c->min_lr < 0) config_die("--lr and --min-lr must be >= 0");
    if (c->min_lr > c->lr) config_die("--min-lr %g is larger than --lr %g", c->min_lr, c->lr);
    if (!(c->lr_warmup_init >= 0 && c->lr_warmup_init <= c->lr))
        config_die("--lr-warmup-init %g must be in [0, --lr %g]", c->lr_warmup_init, c->lr);
    if (c->lr_warmup_iters < 0) config_die("--lr-warmup-iters must be >= 0");
    if (c->lr_decay_iters < 0 || c->lr_wsd_decay_iters < 0)
        config_die("--lr-decay-iters and --lr-wsd-decay-iters must be >= 0");
    validate_sample_based(c);
    if (!(c->lr_warmup_fraction >= 0 && c->lr_warmup_fraction < 1))
        config_die("--lr-warmup-fraction %g must be in [0, 1)", c->lr_warmup_fraction);
    if (c->lr_warmup_fraction > 0 && (c->lr_warmup_iters || c->lr_warmup_samples))
        config_die("--lr-warmup-fraction excludes --lr-warmup-iters and --lr-warmup-samples (as in Megatron); give one");
    c->decay_iters = c->lr_decay_iters ? c->lr_decay_iters : c->train_iters;
    double gbs = c->global_batch_size;
    if (c->train_samples) {
        c->decay_steps = (double)(c->lr_decay_samples ? c->lr_decay_samples : c->train_samples) / gbs;
        c->warmup_steps = (double)c->lr_warmup_samples / gbs;
        c->wsd_decay_steps = (double)c->lr_wsd_decay_samples / gbs;
    } else {
        c->decay_steps = c->decay_iters;
        c->warmup_steps = c->lr_warmup_iters;
        c->wsd_decay_steps = c->lr_wsd_decay_iters;
    }
    if (c->lr_warmup_fraction > 0) c->warmup_steps = c->lr_warmup_fraction * c->decay_steps;
    if (c->warmup_steps > c->decay_steps && c->decay_steps > 0)
        config_die("the warmup of %g steps (--lr-warmup-iters / --lr-warmup-samples) is longer than the %g decay steps "
                   "(--lr-decay-iters / --lr-decay-samples, default --train-iters / --train-samples); shorten it",
                   c->warmup_steps, c->decay_steps);
}

static void validate_training(Config *c) {
    require_positive("micro-batch-size", c->micro_batch_size);
    require_positive("global-batch-size", c->global_batch_size);
    if (c->global_batch_size % c->micro_batch_size)
        config_die("--global-batch-size %d is not a multiple of --micro-batch-size %d", c->global_batch_size,
               c->micro_batch_size);
    c->num_micro_batches = c->global_batch_size / c->micro_batch_size;
    validate_lr_schedule(c);
    if (c->adam_beta1 < 0 || c->adam_beta1 >= 1 || c->adam_beta2 < 0 || c->adam_beta2 >= 1)
        config_die("--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (c->adam_eps <= 0) config_die("--adam-eps must be positive");
    if (c->clip_grad < 0 || c->weight_decay < 0) config_die("--clip-grad and --weight-decay must be >= 0");
    if (c->eval_interval < 0 || c->eval_iters < 0 || c->save_interval < 0 || c->exit_interval < 0)
        config_die("--eval-interval, --eval-iters, --save-interval and --exit-interval must be >= 0");
    require_positive("log-interval", c->log_interval);
    require_positive("nan-skip-limit", c->nan_skip_limit);
    if (!(c->distributed_timeout_minutes > 0)) config_die("--distributed-timeout-minutes must be positive");
    if (c->exit_duration_in_mins < 0 || c->keep_checkpoints < 0 || c->loss_spike_factor < 0)
        config_die("--exit-duration-in-mins, --keep-checkpoints and --loss-spike-factor must be >= 0");
    // Products with the world size are checked by parallel_sizes_init (parallel/groups.c).
    require_range("tensor-model-parallel-size", c->tensor_model_parallel_size, 1, MAX_PARALLEL_SIZE);
    require_range("context-parallel-size", c->context_parallel_size, 1, MAX_PARALLEL_SIZE);
    require_range("pipeline-model-parallel-size", c->pipeline_model_parallel_size, 1, MAX_PARALLEL_SIZE);
    require_range("expert-model-parallel-size", c->expert_model_parallel_size, 1, MAX_PARALLEL_SIZE);
    require_range("expert-tensor-parallel-size", c->expert_tensor_parallel_size, 1, MAX_PARALLEL_SIZE);
    require_range("mock-data-tokens", c->mock_data_tokens, 1024, MAX_CORPUS_TOKENS);
    if (c->mock_data && c->data_path[0]) config_die("--mock-data and --data-path exclude each other; pick one");
    if (c->peak_tflops < 0) config_die("--peak-tflops must be >= 0");
    parse_schedule_styles(c);
    parse_split(c);
    validate_batch_sizes(c);
}

static void require_divides(const char *flag, int size, const char *what_flag, int what) {
    if (what % size)
        config_die("--%s %d does not divide --%s %d; choose a size that divides it", flag, size, what_flag, what);
}

// Tensor, sequence and expert-tensor parallelism (docs/parallelism.md): the sizes must
// split heads, FFN widths and tokens evenly.
static void validate_tensor_parallel(const Config *c) {
    int tp = c->tensor_model_parallel_size, etp = c->expert_tensor_parallel_size;
    const char *tp_flag = "tensor-model-parallel-size";
    if (tp > 1) {
        require_divides(tp_flag, tp, "num-attention-heads", c->num_attention_heads);
        if (c->kv_heads % tp && tp % c->kv_heads)
            config_die("--%s %d and the %d key/value heads (--num-query-groups): one must divide the other (kv "
                       "heads fewer than TP are replicated)", tp_flag, tp, c->kv_heads);
        if (c->num_layers > 0 && c->ffn_hidden_size) require_divides(tp_flag, tp, "ffn-hidden-size", c->ffn_hidden_size);
        if (c->moe_shared_expert_intermediate_size)
            require_divides(tp_flag, tp, "moe-shared-expert-intermediate-size", c->moe_shared_expert_intermediate_size);
        if (c->num_experts && !c->sequence_parallel)
            config_die("--%s %d with MoE layers needs --sequence-parallel (tokens enter the experts split over the "
                       "tensor-parallel ranks, as in Megatron-Core)", tp_flag, tp);
        if (c->sequence_parallel) require_divides(tp_flag, tp, "seq-length", c->seq_length);
    }
    if (etp > 1 && c->num_experts) require_divides("expert-tensor-parallel-size", etp, "moe-ffn-hidden-size", c->moe_ffn);
}

// --hierarchical-context-parallel-sizes: inner outer, their product the CP size (a2a+p2p).
static void parse_hierarchical_cp_sizes(Config *c, int needed) {
    const char *flag = "hierarchical-context-parallel-sizes";
    c->cp_a2a_size = 1;
    if (!c->hierarchical_context_parallel_sizes[0]) {
        if (needed)
            config_die("--cp-comm-type a2a+p2p needs --%s INNER OUTER (the all-to-all group and the ring; product "
                       "--context-parallel-size %d)", flag, c->context_parallel_size);
        return;
    }
    char list[sizeof(c->hierarchical_context_parallel_sizes)], *save;
    snprintf(list, sizeof(list), "%s", c->hierarchical_context_parallel_sizes);
    long long sizes[2], product = 1;
    int n = 0;
    for (char *v = strtok_r(list, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
        if (n == 2) config_die("--%s takes two sizes (inner outer), got %s", flag, c->hierarchical_context_parallel_sizes);
        sizes[n] = parse_integer(flag, v);
        if (sizes[n] < 1) config_die("--%s: sizes must be positive, got %s", flag, v);
        product *= sizes[n++];
    }
    if (n != 2 || product != c->context_parallel_size)
        config_die("--%s %s: give two sizes (inner outer) whose product is --context-parallel-size %d", flag,
                   c->hierarchical_context_parallel_sizes, c->context_parallel_size);
    c->cp_a2a_size = (int)sizes[0];
}

// Heads this rank attends with tensor parallelism, split further by an all-to-all of `size`.
static void require_a2a_heads(const Config *c, const char *type, int size) {
    int tp = c->tensor_model_parallel_size, heads = c->num_attention_heads / tp;
    int kv = c->multi_latent_attention ? heads : MT_MAX(c->kv_heads / tp, 1);
    if (heads % size || kv % size)
        config_die("--cp-comm-type %s splits the %d query and %d key/value heads of each tensor-parallel rank over %d "
                   "ranks: they must divide (choose p2p or allgather, or other sizes)", type, heads, kv, size);
}

// Context parallelism (docs/parallelism.md): --cp-comm-type per layer, sequences cut into
// 2·CP chunks, heads split by the all-to-all types.
const char *const CP_COMM_TYPE_NAMES[CP_COMM_TYPES] = {"p2p", "a2a", "allgather", "a2a+p2p"};

static void validate_context_parallel(Config *c) {
    int cp = c->context_parallel_size, n = 0, any_hierarchical = 0;
    char list[sizeof(c->cp_comm_type)], *save;
    snprintf(list, sizeof(list), "%s", c->cp_comm_type);
    for (char *v = strtok_r(list, ",", &save); v; v = strtok_r(NULL, ",", &save), n++) {
        int type = lookup(v, CP_COMM_TYPE_NAMES, CP_COMM_TYPES);
        if (type < 0) config_die("--cp-comm-type %s: use p2p, a2a, allgather or a2a+p2p", v);
        if (n < MT_MAX_LAYERS) c->cp_comm[n] = type;
    }
    if (n > 1 && n != c->num_layers)
        config_die("--cp-comm-type has %d values for %d layers; give one, or one per layer", n, c->num_layers);
    for (int l = 1; n == 1 && l < c->num_layers; l++) c->cp_comm[l] = c->cp_comm[0];
    for (int l = 0; l < c->num_layers; l++) any_hierarchical |= c->cp_comm[l] == CP_COMM_A2A_P2P;
    parse_hierarchical_cp_sizes(c, cp > 1 && any_hierarchical);
    if (cp == 1) return;
    if (c->seq_length % (2 * cp))
        config_die("--seq-length %d must be a multiple of 2 x --context-parallel-size %d (each sequence is cut into "
                   "2 x CP chunks)", c->seq_length, cp);
    if (c->sequence_parallel && c->seq_length / cp % c->tensor_model_parallel_size)
        config_die("--seq-length %d / --context-parallel-size %d must be a multiple of --tensor-model-parallel-size %d "
                   "with --sequence-parallel", c->seq_length, cp, c->tensor_model_parallel_size);
    for (int l = 0; l < c->num_layers; l++) {
        if (c->cp_comm[l] == CP_COMM_A2A) require_a2a_heads(c, "a2a", cp);
        if (c->cp_comm[l] == CP_COMM_A2A_P2P) require_a2a_heads(c, "a2a+p2p", c->cp_a2a_size);
    }
}

void config_validate(Config *c) {
    naming = c;
    validate_fixed_switches(c);
    validate_shape(c);
    validate_attention(c);
    validate_moe(c);
    validate_mtp(c);
    validate_fp8(c);
    validate_checkpoint_format(c);
    validate_parallel(c);
    validate_training(c);
    validate_logging(c);
    validate_tensor_parallel(c);
    validate_context_parallel(c);
    validate_pipeline(c);
    validate_comm_overlap(c);
    validate_recompute(c);
    validate_precision(c);
    validate_precision_optimizer(c);
    require_range("max-new-tokens", c->max_new_tokens, 0, MAX_DIMENSION);  // positions
    if (c->temperature < 0) config_die("--temperature must be >= 0");
    if (c->top_k < 0) config_die("--top-k must be >= 0");
    if (!(c->top_p > 0 && c->top_p <= 1)) config_die("--top-p %g: use a probability in (0, 1] (1 keeps every token)", c->top_p);
}

// ---- help -----------------------------------------------------------------------------

static const char *status_name(FlagStatus s) {
    return s == FLAG_IMPLEMENTED ? "implemented" : s == FLAG_NOOP ? "no-op" : "not supported";
}

static void format_default(const Config *d, const FlagSpec *f, char *out, size_t cap) {
    const char *field = (const char *)d + f->offset;
    if (f->size == 0) {  // a compat flag: off, or the first value it accepts
        snprintf(out, cap, "%s", f->type == FLAG_BOOL ? "off" : f->accepts ? f->accepts : "(any)");
        char *comma = strchr(out, ',');
        if (comma) *comma = 0;
        return;
    }
    switch (f->type) {
    case FLAG_INT: snprintf(out, cap, "%d", *(const int *)field); break;
    case FLAG_INT64: snprintf(out, cap, "%lld", (long long)*(const int64_t *)field); break;
    case FLAG_DOUBLE: snprintf(out, cap, "%g", *(const double *)field); break;
    case FLAG_BOOL: snprintf(out, cap, "%s", *(const int *)field ? "on" : "off"); break;
    case FLAG_STRING:
    case FLAG_LIST: snprintf(out, cap, "%s", *field ? field : "(none)"); break;
    }
}

void config_print_help(Command cmd, int markdown) {
    Config defaults;
    config_defaults(&defaults);
    char def[256];
    if (markdown) {
        printf("| flag | commands | default | status | meaning |\n|---|---|---|---|---|\n");
        for (int i = 0; i < FLAG_COUNT; i++) {
            const FlagSpec *f = &FLAGS[i];
            format_default(&defaults, f, def, sizeof(def));
            char cmds[64] = "";
            for (unsigned bit = CMD_TRAIN; bit <= CMD_LAST; bit <<= 1)
                if (f->commands & bit)
                    snprintf(cmds + strlen(cmds), sizeof(cmds) - strlen(cmds), "%s%s", cmds[0] ? " " : "",
                             command_name((Command)bit));
            printf("| `--%s` | %s | %s | %s | %s |\n", f->name, cmds, def, status_name(f->status), f->help);
        }
        return;
    }
    printf("usage: moetron %s%s [flags]\n\n", command_name(cmd), cmd == CMD_REPORT ? " RUN" : "");
    for (int i = 0; i < FLAG_COUNT; i++) {
        const FlagSpec *f = &FLAGS[i];
        if (!(f->commands & accepted_by(cmd))) continue;
        format_default(&defaults, f, def, sizeof(def));
        printf("  --%-36s %s%s [%s]\n", f->name, f->status == FLAG_UNSUPPORTED ? "not supported: " : "", f->help, def);
    }
}
