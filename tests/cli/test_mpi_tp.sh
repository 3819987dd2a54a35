#!/usr/bin/env bash
# test_mpi_tp.sh — tensor and sequence parallelism under mpirun give the single-process run:
# 10 steps of each layout reproduce the losses (lm and aux) and gradient norms of one
# process within 1e-5 relative: a dense model with TP=2 with and without
# --sequence-parallel, TP=4 with 2 kv groups (replicated kv heads), TP=2 with MLA and
# q_lora_rank, TP=2 with OLMoE's whole-projection QK-norm and clip_qkv (TP=4 with 2 kv
# groups: the key norm's statistics over replicated heads), untied and tied
# embeddings, a vocabulary of 257 on TP=2 (padded to 258), MoE layers with SP: TP=2,
# TP=2 x EP=2, TP=2 x DP=2 with the distributed optimizer, shared experts with their gate,
# capacity with drops, every balance-loss type with z-loss and expert bias, ETP=2 x EP=2
# (with and without TP; the alltoall exchange with its ETP gather, and the allgather one),
# ETP=2 alone with the distributed optimizer, 8 ranks of TP=2 x EP=4; with --bf16 and SP the
# GEMM-only all-gathers move bf16 bit for bit as fp32; bad tensor-parallel sizes are refused with one line naming the flags.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_tp
# The vocabulary is padded to --make-vocab-size-divisible-by x TP: the single-process run
# pads 257 to 512 as the layouts do (TP=2: 256 x 2, TP=4: 128 x 4).
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --ffn-hidden-size 128 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536
       --train-iters 10 --global-batch-size 8 --make-vocab-size-divisible-by 512)
MOE=(--num-experts 4 --moe-ffn-hidden-size 64 --moe-router-topk 2)
TP2=(--tensor-model-parallel-size 2 --make-vocab-size-divisible-by 256)
TP4=(--tensor-model-parallel-size 4 --make-vocab-size-divisible-by 128)
SP=(--sequence-parallel)

# Under a sanitizer build the cases marked "full" (mpi_lib.sh) run in the plain build only;
# the others cover every code path once (SP, replicated kv heads with the sharded QK-norm,
# MLA, the shared expert's gate, TP x ETP x EP: TP with EP and with ETP). Capacity with
# drops stays there in test_mpi_ep.sh, and over a token group in test_mpi_router.sh.

# dense layers
full tp2_dense run_case tp2_dense 2 "${TP2[@]}" -- --num-experts 0
run_case tp2_dense_sequence_parallel 2 "${TP2[@]}" "${SP[@]}" -- --num-experts 0 --untie-embeddings-and-output-weights
full tp4_two_kv_groups run_case tp4_two_kv_groups 4 "${TP4[@]}" "${SP[@]}" -- --num-experts 0 \
    --group-query-attention --num-query-groups 2
run_case tp4_kv2_qk_norm_projection 4 "${TP4[@]}" -- --num-experts 0 --group-query-attention \
    --num-query-groups 2 --qk-layernorm --qk-layernorm-scope projection
run_case tp2_mla_q_lora 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" --multi-latent-attention --q-lora-rank 32 \
    --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
full tp2_olmoe_qk_norm_clip run_case tp2_olmoe_qk_norm_clip 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" --qk-layernorm \
    --qk-layernorm-scope projection --clip-qkv 0.5
full tp2_vocab_257 run_case tp2_vocab_257 2 --tensor-model-parallel-size 2 --make-vocab-size-divisible-by 1 -- \
    --num-experts 0 --make-vocab-size-divisible-by 2

# MoE layers: tokens enter them sequence-parallel
full tp2_moe run_case tp2_moe 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" --moe-aux-loss-coeff 0.01
full tp2_ep2 run_case tp2_ep2 4 "${TP2[@]}" "${SP[@]}" --expert-model-parallel-size 2 -- "${MOE[@]}"
full tp2_dp2_distributed_optimizer run_case tp2_dp2_distributed_optimizer 4 "${TP2[@]}" "${SP[@]}" --use-distributed-optimizer -- "${MOE[@]}"
run_case tp2_shared_expert_gate 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" --moe-shared-expert-intermediate-size 64 \
    --moe-shared-expert-gate --moe-input-jitter-eps 0.01
capacity_drops() {
    run_case tp2_capacity_drops 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" --moe-expert-capacity-factor 0.5 \
        --moe-token-drop-policy probs && dropped tp2_capacity_drops_tokens
}
full tp2_capacity_drops capacity_drops
full tp2_capacity_padded run_case tp2_capacity_padded 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" \
    --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
full tp2_seq_aux_z_loss_bias run_case tp2_seq_aux_z_loss_bias 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" \
    --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 1e-3 \
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
full tp2_global_aux run_case tp2_global_aux 2 "${TP2[@]}" "${SP[@]}" -- "${MOE[@]}" \
    --moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 0.01
# global_aux_loss counts a micro-batch step over the data-parallel ranks (test_mpi_dp.sh: DP=2
# is one process with the step's micro-batches in one): TP=2 x DP=2 gives DP=2
tp_dp_global_aux() {
    local flags=("${SMALL[@]}" "${MOE[@]}" --moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 0.01)
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${flags[@]}" --log-jsonl "$work/ga_dp2.jsonl" >"$work/ga_dp2.log" 2>&1 ||
        { fail tp2_dp2_global_aux "DP=2: $(tail -2 "$work/ga_dp2.log" | tr '\n' ' ')"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train "${flags[@]}" "${TP2[@]}" "${SP[@]}" --log-jsonl "$work/ga_tp2.jsonl" \
        >"$work/ga_tp2.log" 2>&1 || { fail tp2_dp2_global_aux "TP=2 x DP=2: $(tail -2 "$work/ga_tp2.log" | tr '\n' ' ')"; return; }
    curve "$work/ga_dp2.jsonl" >"$work/ga_dp2.a"
    curve "$work/ga_tp2.jsonl" >"$work/ga_tp2.a"
    compare tp2_dp2_global_aux "$work/ga_dp2.a" "$work/ga_tp2.a"
}
full tp2_dp2_global_aux tp_dp_global_aux

# expert tensor parallelism: each expert's FFN split over ETP (gate/up column, down row)
full etp2_ep2 run_case etp2_ep2 4 --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 -- "${MOE[@]}" \
    --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
full etp2_distributed_optimizer run_case etp2_distributed_optimizer 2 --expert-tensor-parallel-size 2 \
    --use-distributed-optimizer -- "${MOE[@]}" --moe-shared-expert-intermediate-size 64
run_case tp2_etp2_ep2 4 "${TP2[@]}" "${SP[@]}" --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 -- \
    "${MOE[@]}" --moe-aux-loss-coeff 0.01
full tp2_etp2_ep2_allgather run_case tp2_etp2_ep2_allgather 4 "${TP2[@]}" "${SP[@]}" --expert-tensor-parallel-size 2 \
    --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather -- "${MOE[@]}" --moe-aux-loss-coeff 0.01
full tp2_ep4_8_ranks run_case tp2_ep4_8_ranks 8 "${TP2[@]}" "${SP[@]}" --expert-model-parallel-size 4 -- \
    "${MOE[@]}" --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.01

# --bf16 with sequence parallelism: the all-gathers whose rows only bf16-input GEMMs read (the
# normed inputs of attention, the MLP and the shared expert, the LM head's input; the
# row-parallel projections' output gradients) move bf16: the same bits as fp32 gathers at
# 0.7-0.9 of tp_bytes (the reduce-scatters are sums, fp32; measured 0.78-0.82)
bf16_exchange_exact tp2_sp_bf16_gathers 2 tp_bytes 0.7 0.9 "${TP2[@]}" "${SP[@]}" "${MOE[@]}" \
    --moe-shared-expert-intermediate-size 64 --moe-shared-expert-gate
full tp2_sp_bf16_gathers_dense bf16_exchange_exact tp2_sp_bf16_gathers_dense 2 tp_bytes 0.7 0.9 "${TP2[@]}" "${SP[@]}" \
    --num-experts 0 --untie-embeddings-and-output-weights

# sizes that do not split evenly: one line naming the flags
expect_error tp_heads "--tensor-model-parallel-size 3 does not divide --num-attention-heads 4" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 --tensor-model-parallel-size 3
expect_error tp_moe_needs_sp "with MoE layers needs --sequence-parallel" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" --tensor-model-parallel-size 2
expect_error tp_kv_heads "one must divide the other" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 --num-attention-heads 12 --group-query-attention --num-query-groups 3 \
    --tensor-model-parallel-size 2 --hidden-size 96
# a checkpoint keeps its padded vocabulary: one of 257 rows does not split over TP=2
"$M" train "${SMALL[@]}" --num-experts 0 --make-vocab-size-divisible-by 1 --train-iters 2 --lr-warmup-iters 1 --save "$work/v257" \
    >"$work/v257.log" 2>&1 || fail tp_vocab_rows_of_checkpoint "one process: $(tail -1 "$work/v257.log")"
expect_error tp_vocab_rows_of_checkpoint "the checkpoint's vocabulary of 257 rows (padded) does not split over --tensor-model-parallel-size 2" -- \
    "$M" train --load "$work/v257" --tensor-model-parallel-size 2
