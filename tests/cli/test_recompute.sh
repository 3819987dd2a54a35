#!/usr/bin/env bash
# test_recompute.sh — activation recomputation (--recompute-granularity full, and selective
# with every module) changes memory, never results. For every model family and MoE feature (latent MoE too), and under mpirun for TP+SP, EP
# (both dispatchers, the shared-expert overlap), CP, PP (also interleaved with the combined
# 1F1B schedule) and DP with the distributed optimizer: 3 steps with the uniform method in
# groups of 1 and of 2, with the block method, and selective recomputation of core_attn,
# moe_act, layernorm, mlp, shared_experts and mla_up_proj, and of moe (the whole MoE block)
# with layernorm give the same losses, aux losses and
# gradient norms as the run without recomputation, bit for bit, and save the same weights
# and optimizer state. The activations a recomputing run plans are smaller; the flags'
# bad combinations are refused with one line.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

TINY=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
      --lr-warmup-iters 1 --mock-data-tokens 16384 --train-iters 3 --log-interval 1 --save-interval 3)
RECOMPUTE=(
    "uniform1|--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "uniform2|--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
    "block3|--recompute-granularity full --recompute-method block --recompute-num-layers 3"
    "selective|--recompute-granularity selective --recompute-modules core_attn moe_act layernorm mlp shared_experts mla_up_proj"
    "selective_moe|--recompute-granularity selective --recompute-modules moe layernorm"
)
# name | flags: every family and MoE feature (global_aux_loss, expert bias and jitter read
# the step's routing so far: a recomputed forward must route as the forward did). Under a
# sanitizer build the cases marked "sanitized" run; the others are left to the plain build
# (mpi_lib.sh, full).
CASES=(
    "dense|--num-experts 0"
    "mixtral_aux_z_jitter|--hf-architecture mixtral --moe-z-loss-coeff 0.001 --moe-input-jitter-eps 0.01"
    "qwen3_seq_global|--hf-architecture qwen3_moe --qk-layernorm --moe-router-load-balancing-type seq_aux_loss,global_aux_loss --moe-aux-loss-coeff 0.01,0.001"
    "olmoe_clip|--hf-architecture olmoe --qk-layernorm --qk-layernorm-scope projection --clip-qkv 0.9 --moe-router-pre-softmax"
    "capacity_padded|--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity"
    "deepseek_mla_bias_shared|--hf-architecture deepseek_v3 ${MLA[*]} --q-lora-rank 16 --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 2 --moe-router-group-topk 1 --moe-shared-expert-intermediate-size 64 --moe-layer-freq [0,1,1,1]"
    "forced_fp64_gate|--moe-router-force-load-balancing --moe-router-dtype fp64 --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate"
    "latent_shared_jitter|--moe-latent-size 24 --moe-shared-expert-intermediate-size 32 --moe-input-jitter-eps 0.01"
)
# name | ranks | flags: the parallel layouts
MPI_CASES=(
    "tp2_sp_capacity|2|--tensor-model-parallel-size 2 --sequence-parallel --moe-expert-capacity-factor 1.0"
    "ep2_alltoall_global|2|--expert-model-parallel-size 2 --moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 0.01 --moe-input-jitter-eps 0.01"
    "ep2_shared_overlap|2|--expert-model-parallel-size 2 --moe-shared-expert-intermediate-size 32 --moe-shared-expert-overlap"
    "ep2_allgather_capacity|2|--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather --moe-expert-capacity-factor 1.0"
    "cp2|2|--context-parallel-size 2"
    "pp2|2|--pipeline-model-parallel-size 2"
    "pp2_vp2_ep2_combined|4|--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --expert-model-parallel-size 2 --overlap-moe-expert-parallel-comm --global-batch-size 8"
    "dp2_distopt_bias|2|--use-distributed-optimizer --moe-router-score-function sigmoid --moe-router-enable-expert-bias"
)

# weights DIR: md5 of every tensor file of the last checkpoint
weights() { (cd "$1" && find . -name '*.safetensors' | sort | xargs md5sum); }

# run DIR FLAGS...: train under the caller's launch command (the array `launch`), logging
# DIR/log.jsonl and saving DIR/ck
run() {
    local d=$1
    shift
    mkdir -p "$d"
    "${launch[@]}" "$M" train "${TINY[@]}" "$@" --log-jsonl "$d/log.jsonl" --save "$d/ck" >"$d/out" 2>&1
}

# activations DIR: the MiB of activations the memory line of the run in DIR reports
activations() { sed -n 's/.*activations \([0-9.]*\) for.*/\1/p' "$1/out" | head -1; }

# recompute_case NAME LAUNCH... -- FLAGS...
recompute_case() {
    local name=$1
    shift
    local launch=()
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    local base="$work/$name/base"
    if ! run "$base" "$@"; then
        fail "recompute_$name" "the run without recomputation failed: $(grep -m1 error "$base/out")"
        return
    fi
    local r label flags d
    for r in "${RECOMPUTE[@]}"; do
        IFS='|' read -r label flags <<<"$r"
        case "$VARIANTS_RUN" in *" $label "*) ;; *) continue ;; esac
        d="$work/$name/$label"
        # shellcheck disable=SC2086
        if ! run "$d" "$@" $flags; then
            fail "recompute_${name}_$label" "training failed: $(grep -m1 -A2 error "$d/out" | tr '\n' ' ' | head -c 400)"
            continue
        fi
        if ! cmp -s <(step_numbers "$base/log.jsonl") <(step_numbers "$d/log.jsonl") || [ -z "$(step_numbers "$d/log.jsonl")" ]; then
            fail "recompute_${name}_$label" "the steps differ: $(diff <(step_numbers "$base/log.jsonl") <(step_numbers "$d/log.jsonl") | head -3 | tr '\n' ' ')"
        elif ! cmp -s <(weights "$base/ck") <(weights "$d/ck"); then
            fail "recompute_${name}_$label" "the saved weights or optimizer state differ"
        else
            ok "recompute_${name}_$label"
        fi
    done
}

# The cases run under the sanitizers (maybe_full, mpi_lib.sh); there only the variants in
# VARIANTS_RUN run (multi-layer groups, every module)
SANITIZED=" deepseek_mla_bias_shared ep2_alltoall_global "
VARIANTS_RUN=" uniform1 uniform2 block3 selective selective_moe "
if sanitizer_build "$M"; then
    VARIANTS_RUN=" uniform2 selective "
    echo "skip recompute_uniform1_block3_selective_moe: sanitizer build (run by the plain build)"
fi

for c in "${CASES[@]}"; do
    IFS='|' read -r name flags <<<"$c"
    # shellcheck disable=SC2086
    maybe_full "$name" recompute_case "$name" env -- $flags
done

# Recomputation is the launch's choice, not the checkpoint's: a checkpoint saved with full
# recomputation resumes without it, one saved without resumes with selective, and both take
# the same next step.
resumed="$work/deepseek_mla_bias_shared"
launch=(env)
run "$resumed/resume_plain" --load "$resumed/uniform2/ck" --train-iters 4
run "$resumed/resume_selective" --load "$resumed/base/ck" --train-iters 4 --recompute-granularity selective \
    --recompute-modules moe layernorm
plain=$(step_numbers "$resumed/resume_plain/log.jsonl") selective=$(step_numbers "$resumed/resume_selective/log.jsonl")
if [ -n "$plain" ] && [ "$plain" = "$selective" ]; then
    ok recompute_is_the_launchs
else
    fail recompute_is_the_launchs "resumed steps differ or failed: '$plain' vs '$selective' $(grep -h -m1 error "$resumed"/resume_*/out)"
fi

# The plan: a model whose activations dominate keeps less with recomputation.
launch=(env)
run "$work/mem_base" --num-layers 6 --seq-length 64 --train-iters 1
run "$work/mem_uniform1" --num-layers 6 --seq-length 64 --train-iters 1 --recompute-granularity full \
    --recompute-method uniform --recompute-num-layers 1
run "$work/mem_selective" --num-layers 6 --seq-length 64 --train-iters 1 --recompute-granularity selective \
    --recompute-modules core_attn moe_act layernorm
# less_memory NAME DIR FRACTION: the run in DIR plans under FRACTION of mem_base's activations
less_memory() {
    local a b
    a=$(activations "$work/mem_base") b=$(activations "$2")
    if [ -n "$a" ] && [ -n "$b" ] && python3 -c "import sys; sys.exit(not float('$b') < $3 * float('$a'))"; then
        ok "$1"
    else
        fail "$1" "activations ${a:-?} MiB without, ${b:-?} MiB with recomputation (expected under $3 of it)"
    fi
}
less_memory recompute_full_plans_less_memory "$work/mem_uniform1" 0.7
less_memory recompute_selective_plans_less_memory "$work/mem_selective" 0.9

# Megatron's --recompute-activations is selective recomputation of its default module
run "$work/mem_core_attn" --num-layers 6 --seq-length 64 --train-iters 1 --recompute-granularity selective
run "$work/mem_shorthand" --num-layers 6 --seq-length 64 --train-iters 1 --recompute-activations
if [ -n "$(activations "$work/mem_shorthand")" ] &&
    [ "$(activations "$work/mem_shorthand")" = "$(activations "$work/mem_core_attn")" ] &&
    [ "$(step_numbers "$work/mem_shorthand/log.jsonl")" = "$(step_numbers "$work/mem_core_attn/log.jsonl")" ]; then
    ok recompute_activations_is_selective
else
    fail recompute_activations_is_selective "activations $(activations "$work/mem_shorthand") vs $(activations "$work/mem_core_attn") MiB, or the steps differ"
fi

expect_error recompute_needs_method "recompute-method" -- "$M" train "${TINY[@]}" --recompute-granularity full \
    --recompute-num-layers 1
expect_error recompute_needs_layers "recompute-num-layers" -- "$M" train "${TINY[@]}" --recompute-granularity full \
    --recompute-method block
expect_error recompute_method_needs_full "recompute-granularity full" -- "$M" train "${TINY[@]}" \
    --recompute-method uniform --recompute-num-layers 1
expect_error recompute_bad_granularity "recompute-granularity" -- "$M" train "${TINY[@]}" --recompute-granularity all
expect_error recompute_selective_no_method "need --recompute-granularity full" -- "$M" train "${TINY[@]}" \
    --recompute-granularity selective --recompute-method uniform
expect_error recompute_bad_module "recompute-modules attention" -- "$M" train "${TINY[@]}" \
    --recompute-granularity selective --recompute-modules attention
expect_error recompute_modules_need_selective "needs --recompute-granularity selective" -- "$M" train "${TINY[@]}" \
    --recompute-modules mlp
expect_error recompute_distribute_saved "distribute-saved-activations is not built" -- "$M" train "${TINY[@]}" \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --distribute-saved-activations
expect_error recompute_too_many_layers "between 1 and" -- "$M" train "${TINY[@]}" --recompute-granularity full \
    --recompute-method uniform --recompute-num-layers 5

mpi_require recompute_mpi
for c in "${MPI_CASES[@]}"; do
    IFS='|' read -r name ranks flags <<<"$c"
    # shellcheck disable=SC2086
    maybe_full "$name" recompute_case "$name" "${MPIRUN[@]}" -n "$ranks" -- $flags
done
