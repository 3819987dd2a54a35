// megatron_compat_flags.h — the Megatron-LM flags that moetron accepts without a setting of
// its own, or refuses; entries of args.c's FLAGS table (included inside it, after the
// implemented flags), so that the parser, --help and docs/flags.md all list them.
//
// NOOP(name, type, commands, accepts, help): the flag names an implementation choice that
// moetron always makes (a fused kernel, a communication overlap, a backend); giving it
// changes nothing. `accepts` lists the values that mean what moetron does (NULL: any value
// of the type); another value asks for different math and is refused with one line.
// UNSUPPORTED(name, type, commands, help): a feature moetron does not have; refused whenever
// given, the help saying what to do instead.
//
// Sources: the flags of Megatron-LM's MoE example scripts and recipes (examples/mixtral,
// examples/gptoss, examples/megatron_fsdp's DeepSeek-V3, examples/post_training's Qwen3-MoE
// and DeepSeek confs, examples/rl's Qwen3-30B-A3B). TensorBoard / wandb / --log-* flags and
// the tokenizer flags are implemented elsewhere.

// model: what moetron's layers always are
NOOP("use-mcore-models", FLAG_BOOL, TR, NULL, "no-op: moetron's model is Megatron-Core's GPT model (the only one)"),
UNSUPPORTED("use-legacy-models", FLAG_BOOL, TR, "moetron implements Megatron-Core's model only; drop the flag"),
NOOP("transformer-impl", FLAG_STRING, TR, "transformer_engine,local", "no-op: every layer is moetron's own implementation, the same math as Transformer Engine's and local"),
NOOP("use-rotary-position-embeddings", FLAG_BOOL, TR, NULL, "no-op: rotary position embeddings are always used"),
NOOP("no-position-embedding", FLAG_BOOL, TR, NULL, "no-op: there is no learned absolute position embedding (rotary only)"),
NOOP("rotary-percent", FLAG_DOUBLE, TR, "1", "no-op at 1: rotary embeddings turn the whole head (partial rotary is not supported)"),
NOOP("softmax-type", FLAG_STRING, TR, "vanilla", "no-op at vanilla: the plain attention softmax (off-by-one and learnable sinks are not supported)"),
NOOP("glu-linear-offset", FLAG_DOUBLE, TR, "0", "no-op at 0: SwiGLU's linear half without an offset"),
UNSUPPORTED("quick-geglu", FLAG_BOOL, TR, "the MLPs are SwiGLU; drop the flag (gpt-oss's activation is not supported)"),
UNSUPPORTED("activation-func-clamp-value", FLAG_DOUBLE, TR, "the activation is never clamped; drop the flag (gpt-oss is not supported)"),
UNSUPPORTED("window-size", FLAG_STRING, TR, "attention is always full causal; drop the flag (sliding windows are not supported)"),
UNSUPPORTED("window-attn-skip-freq", FLAG_STRING, TR, "attention is always full causal; drop the flag (sliding windows are not supported)"),
UNSUPPORTED("enable-gpt-oss", FLAG_BOOL, TR, "gpt-oss's attention sinks, windows and clamped activation are not supported; drop the flag"),
// kernels: fused or not, the results are the same
NOOP("moe-grouped-gemm", FLAG_BOOL, TR, NULL, "no-op: each layer's experts always run as grouped GEMMs"),
NOOP("moe-permute-fusion", FLAG_BOOL, TR, NULL, "no-op: the token permutation is one op already"),
NOOP("use-flash-attn", FLAG_BOOL, TR, NULL, "no-op: attention is always computed blockwise without the sequence x sequence matrix"),
NOOP("attention-backend", FLAG_STRING, TR, "flash,fused,unfused,local,auto", "no-op: every backend computes the same exact attention"),
NOOP("no-masked-softmax-fusion", FLAG_BOOL, TR, NULL, "no-op: a kernel fusion choice"),
NOOP("no-bias-swiglu-fusion", FLAG_BOOL, TR, NULL, "no-op: a kernel fusion choice"),
NOOP("no-bias-gelu-fusion", FLAG_BOOL, TR, NULL, "no-op: a kernel fusion choice"),
NOOP("no-bias-dropout-fusion", FLAG_BOOL, TR, NULL, "no-op: a kernel fusion choice"),
NOOP("no-rope-fusion", FLAG_BOOL, TR, NULL, "no-op: a kernel fusion choice"),
NOOP("no-persist-layer-norm", FLAG_BOOL, TR, NULL, "no-op: a kernel choice"),
NOOP("no-gradient-accumulation-fusion", FLAG_BOOL, TR, NULL, "no-op: weight gradients are always accumulated in fp32"),
NOOP("te-rng-tracker", FLAG_BOOL, TR, NULL, "no-op: Transformer Engine's RNG tracker (moetron's dropout masks are hashes of their coordinates, with no generator state)"),
NOOP("export-force-local-attention", FLAG_BOOL, TR, NULL, "no-op: there is one attention implementation"),
// precision: what moetron always computes in fp32
NOOP("accumulate-allreduce-grads-in-fp32", FLAG_BOOL, TR, NULL, "no-op: gradients are always accumulated and reduced in fp32"),
NOOP("attention-softmax-in-fp32", FLAG_BOOL, TR, NULL, "no-op: the attention softmax is always fp32"),
NOOP("disable-bf16-reduced-precision-matmul", FLAG_BOOL, TR, NULL, "no-op: GEMMs always accumulate in fp32"),
NOOP("fp8-param-gather", FLAG_BOOL, TR, NULL, "no-op: with --fp8-format the weights are quantized from the fp32 weights at each use"),
UNSUPPORTED("calculate-per-token-loss", FLAG_BOOL, TR, "the loss is averaged over each micro-batch's tokens, then over the micro-batches (Megatron's default); drop the flag"),
NOOP("optimizer", FLAG_STRING, TR, "adam", "no-op at adam: AdamW with decoupled weight decay (Megatron's adam)"),
// communication and memory: schedules and buffers, the results unchanged
NOOP("distributed-backend", FLAG_STRING, TR, "nccl,gloo", "no-op: processes talk through MPI, GPUs through NCCL"),
NOOP("overlap-grad-reduce", FLAG_BOOL, TR, NULL, "no-op: when gradients are reduced is a schedule choice; the results are the same"),
NOOP("overlap-param-gather", FLAG_BOOL, TR, NULL, "no-op: when parameters are gathered is a schedule choice; the results are the same"),
NOOP("tp-comm-overlap", FLAG_BOOL, TR, NULL, "no-op: when tensor-parallel collectives run is a schedule choice; the results are the same"),
NOOP("use-nccl-ub", FLAG_BOOL, TR, NULL, "no-op: NCCL user buffers, a memory registration choice"),
NOOP("init-model-with-meta-device", FLAG_BOOL, TR, NULL, "no-op: each rank initialises only its own parts already"),
NOOP("manual-gc", FLAG_BOOL, TR, NULL, "no-op: there is no garbage collector to drive"),
NOOP("manual-gc-interval", FLAG_INT, TR, NULL, "no-op: there is no garbage collector to drive"),
NOOP("enable-experimental", FLAG_BOOL, TR, NULL, "no-op: nothing is gated behind it"),
NOOP("logging-level", FLAG_INT, TR, NULL, "no-op: Python's logging level (moetron prints what it prints)"),
NOOP("timing-log-level", FLAG_INT, TR, "0,1,2", "no-op: moetron's console line always carries the step time (see --profile)"),
UNSUPPORTED("use-megatron-fsdp", FLAG_BOOL, TR, "shard the optimizer state with --use-distributed-optimizer (ZeRO-1) instead"),
UNSUPPORTED("data-parallel-sharding-strategy", FLAG_STRING, TR, "Megatron FSDP is not supported; use --use-distributed-optimizer (ZeRO-1)"),
UNSUPPORTED("fsdp-double-buffer", FLAG_BOOL, TR, "Megatron FSDP is not supported; use --use-distributed-optimizer (ZeRO-1)"),
UNSUPPORTED("megatron-fsdp-grad-comm-dtype", FLAG_STRING, TR, "Megatron FSDP is not supported; gradients are reduced in fp32"),
UNSUPPORTED("megatron-fsdp-main-grads-dtype", FLAG_STRING, TR, "Megatron FSDP is not supported; the optimizer reads fp32 gradients"),
NOOP("moe-flex-dispatcher-backend", FLAG_STRING, TR, "deepep,hybridep", "no-op: --moe-token-dispatcher-type flex runs as alltoall (the same tokens reach the same experts)"),
UNSUPPORTED("moe-layer-recompute", FLAG_BOOL, TR, "use --recompute-granularity selective --recompute-modules moe"),
// checkpoints: moetron's own format, always read strictly
NOOP("ckpt-format", FLAG_STRING, TR, "torch_dist", "no-op at torch_dist: moetron writes its own checkpoints (global tensors any layout reloads, docs/checkpoints.md)"),
NOOP("auto-detect-ckpt-format", FLAG_BOOL, TR, NULL, "no-op: --load tells a moetron checkpoint from a Hugging Face directory by itself"),
NOOP("dist-ckpt-strictness", FLAG_STRING, TR, "assume_ok_unexpected,log_unexpected,log_all,raise_unexpected,raise_all,return_unexpected,return_all,ignore_all", "no-op: a load checks every tensor; moetron's checkpoints always match their model"),
NOOP("no-ckpt-fully-parallel-save", FLAG_BOOL, TR, NULL, "no-op: how ranks share the writing is moetron's choice"),
NOOP("ckpt-fully-parallel-load", FLAG_BOOL, TR, NULL, "no-op: every rank reads its own part already"),
NOOP("async-save", FLAG_BOOL, TR, NULL, "no-op: checkpoints are written before training goes on"),
// data loading
NOOP("num-workers", FLAG_INT, DT, NULL, "no-op: one thread reads the next micro-batch ahead"),
NOOP("dataloader-type", FLAG_STRING, DT, "single", "no-op at single: samples in Megatron's order, from where the run left off (cyclic's reshuffling is not supported)"),
NOOP("no-mmap-bin-files", FLAG_BOOL, DT, NULL, "no-op: .bin/.idx files are always memory-mapped"),
NOOP("no-create-attention-mask-in-dataloader", FLAG_BOOL, DT, NULL, "no-op: the attention mask is never materialised"),
