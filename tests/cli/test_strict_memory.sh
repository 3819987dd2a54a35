#!/usr/bin/env bash
# test_strict_memory.sh — no host code touches tensor memory outside ops, communication and
# explicit copies (issue: device-resident execution). Under --device cpu-strict every tensor
# block is closed to host code except while an op, a collective or a copy runs; a host access
# ends the run naming the place. For every model family and MoE feature this trains with
# evaluation and a checkpoint, resumes from it and generates from it (sampled and greedy);
# dense, EP, DP with the distributed optimizer, TP with sequence parallelism, PP and CP (with
# multi-token prediction too) run under mpirun the same way. Every strict run gives the same losses and gradient norms as
# the plain cpu run, bit for bit, and generates the same text.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # MPI's own kernel copies bypass page protection

TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
      --eval-interval 2 --eval-iters 1 --lr-warmup-iters 1 --mock-data-tokens 16384)
# name | flags: every family and MoE feature
CASES=(
    "dense|--num-experts 0"
    "mixtral_aux_z_jitter|--hf-architecture mixtral --moe-z-loss-coeff 0.001 --moe-input-jitter-eps 0.01"
    "qwen3_seq_global_recompute|--hf-architecture qwen3_moe --qk-layernorm --moe-router-load-balancing-type seq_aux_loss,global_aux_loss --moe-aux-loss-coeff 0.01,0.001 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "olmoe_clip_presoftmax|--hf-architecture olmoe --qk-layernorm --qk-layernorm-scope projection --clip-qkv 0.9 --moe-router-pre-softmax --untie-embeddings-and-output-weights"
    "capacity_probs_drop|--moe-expert-capacity-factor 1.0"
    "capacity_position_padded|--moe-expert-capacity-factor 1.0 --moe-token-drop-policy position --moe-pad-expert-input-to-capacity"
    "deepseek_mla_bias_groups|--hf-architecture deepseek_v3 ${MLA[*]} --q-lora-rank 16 --rotary-interleaved --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-topk-scaling-factor 2.5 --moe-router-num-groups 2 --moe-router-group-topk 1 --moe-shared-expert-intermediate-size 64 --moe-layer-freq [0,1]"
    "precision_offload_fp16_bf16|--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype fp16 --exp-avg-sq-dtype bf16 --optimizer-cpu-offload --optimizer-offload-fraction 0.5"
    "mtp_latent|--mtp-num-layers 2 --moe-latent-size 16 --moe-shared-expert-intermediate-size 32"
    "shared_gate_forced_fp64_selective|--moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate --moe-router-force-load-balancing --moe-router-dtype fp64 --moe-router-score-function sqrtsoftplus --recompute-granularity selective --recompute-modules core_attn moe_act layernorm mlp shared_experts"
)
# name | ranks | flags: the parallel layouts
MPI_CASES=(
    "ep2_alltoall|2|--expert-model-parallel-size 2 --moe-z-loss-coeff 0.001 --moe-input-jitter-eps 0.01"
    "ep2_allgather_capacity|2|--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather --moe-expert-capacity-factor 1.0"
    "ep2_shared_overlap_moe_act|2|--expert-model-parallel-size 2 --moe-shared-expert-intermediate-size 32 --moe-shared-expert-overlap --recompute-granularity selective --recompute-modules moe_act shared_experts"
    "dp2_dense_distopt|2|--num-experts 0 --use-distributed-optimizer"
    "dp2_precision_fp8_fp16|2|--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16"
    "tp2_sp_capacity|2|--tensor-model-parallel-size 2 --sequence-parallel --moe-expert-capacity-factor 1.0"
    "pp2|2|--pipeline-model-parallel-size 2"
    "pp2_mtp_untied|2|--pipeline-model-parallel-size 2 --mtp-num-layers 1 --untie-embeddings-and-output-weights"
    "cp2_mtp|2|--context-parallel-size 2 --mtp-num-layers 1"
    "cp2_capacity_position|2|--context-parallel-size 2 --moe-expert-capacity-factor 1.0 --moe-token-drop-policy position"
    "cp2_a2a|2|--context-parallel-size 2 --cp-comm-type a2a"
)

# strict_case NAME LAUNCH... -- FLAGS...: train (eval, save) strict and plain, same numbers;
# resume strict; generate strict and plain, same text
strict_case() {
    local name=$1
    shift
    local launch=() flags=()
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    flags=("$@")
    local d="$work/$name"
    mkdir -p "$d"
    if ! MOETRON_DEVICE=cpu-strict "${launch[@]}" "$M" train "${TINY[@]}" "${flags[@]}" --train-iters 2 \
        --save "$d/strict" --log-jsonl "$d/strict.jsonl" >"$d/train.log" 2>&1; then
        fail "strict_$name" "strict training failed: $(grep -m1 -A3 'error' "$d/train.log" | tr '\n' ' ' | head -c 600)"
        return
    fi
    MOETRON_DEVICE=cpu "${launch[@]}" "$M" train "${TINY[@]}" "${flags[@]}" --train-iters 2 \
        --log-jsonl "$d/plain.jsonl" >"$d/plain.log" 2>&1
    if ! cmp -s <(step_numbers "$d/strict.jsonl") <(step_numbers "$d/plain.jsonl") || [ -z "$(step_numbers "$d/strict.jsonl")" ]; then
        fail "strict_$name" "strict and plain runs differ: $(diff <(step_numbers "$d/strict.jsonl") <(step_numbers "$d/plain.jsonl") | head -4 | tr '\n' ' ')"
        return
    fi
    if ! MOETRON_DEVICE=cpu-strict "${launch[@]}" "$M" train "${TINY[@]}" "${flags[@]}" --train-iters 3 \
        --load "$d/strict" --save "$d/strict" >"$d/resume.log" 2>&1; then
        fail "strict_$name" "strict resume failed: $(grep -m1 -A3 'error' "$d/resume.log" | tr '\n' ' ' | head -c 600)"
        return
    fi
    local sample
    for sample in "--temperature 0.8 --top-k 5 --top-p 0.9" "--temperature 0"; do
        # shellcheck disable=SC2086
        if ! MOETRON_DEVICE=cpu-strict "$M" generate --load "$d/strict" --prompt "the cat" --max-new-tokens 6 \
            $sample >"$d/gen_strict.txt" 2>"$d/gen.err"; then
            fail "strict_$name" "strict generation failed: $(grep -m1 -A3 'error' "$d/gen.err" | tr '\n' ' ' | head -c 600)"
            return
        fi
        # shellcheck disable=SC2086
        MOETRON_DEVICE=cpu "$M" generate --load "$d/strict" --prompt "the cat" --max-new-tokens 6 $sample \
            >"$d/gen_plain.txt" 2>/dev/null
        if ! cmp -s "$d/gen_strict.txt" "$d/gen_plain.txt"; then
            fail "strict_$name" "strict generation ($sample) differs from the plain cpu's"
            return
        fi
    done
    ok "strict_$name"
}

# The cases that run under the sanitizers (maybe_full, mpi_lib.sh): one of each kind of
# layout, MLA with expert bias and the forced-balancing/fp64 router; the others repeat their
# paths and run in the plain build.
SANITIZED=" strict_dense strict_deepseek_mla_bias_groups strict_shared_gate_forced_fp64_selective strict_ep2_alltoall 
    strict_tp2_sp_capacity strict_pp2 strict_cp2_a2a "
for c in "${CASES[@]}"; do
    IFS='|' read -r name flags <<<"$c"
    # shellcheck disable=SC2086
    maybe_full "strict_$name" strict_case "$name" env -- $flags
done

mpi_require strict_memory_mpi
for c in "${MPI_CASES[@]}"; do
    IFS='|' read -r name ranks flags <<<"$c"
    # shellcheck disable=SC2086
    maybe_full "strict_$name" strict_case "$name" "${MPIRUN[@]}" -n "$ranks" -- $flags
done
