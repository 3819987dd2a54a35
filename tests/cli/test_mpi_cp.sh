#!/usr/bin/env bash
# test_mpi_cp.sh — context parallelism under mpirun gives the single-process run: 10 steps
# of each layout reproduce the losses (lm and aux) and gradient norms of one process within
# 1e-5 relative. Each sequence is cut into 2·CP chunks (rank r: chunks r and 2·CP−1−r), the
# LM loss is the mean over every token of the sequence, and the router's statistics span
# the TP x CP ranks of a micro-batch. Cases: CP=2 and CP=4 with each --cp-comm-type (p2p,
# a2a, allgather, a2a+p2p, one per layer), CP=2 x TP=2 with sequence parallelism, CP=2 x
# EP=2 (EP over the CP ranks) and CP=2 x DP=2 x EP=4 (EP over CP x DP) with the distributed
# optimizer, MLA with its shared rotary key, GQA with per-head and (with TP) per-projection
# QK-norm and clip, packed documents
# (--reset-position-ids --reset-attention-mask --eod-mask-loss, documents crossing chunks),
# every balance loss (aux, seq_aux, global_aux with DP) with z-loss, expert bias, jitter and
# capacity dropping by position; reruns are bit-identical; checkpoints of CP layouts resume in others; with --bf16
# the K/V blocks travel as bf16 and train bit for bit as fp32 blocks; bad CP sizes are refused with one line
# naming the flags.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_cp
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --ffn-hidden-size 128 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536
       --train-iters 10 --global-batch-size 8 --make-vocab-size-divisible-by 512)
MOE=(--num-experts 4 --moe-ffn-hidden-size 64 --moe-router-topk 2 --moe-aux-loss-coeff 0.01)
CP2=(--context-parallel-size 2)
CP4=(--context-parallel-size 4)

# Under a sanitizer build the cases marked "full" (mpi_lib.sh) run in the plain build only;
# the others take every code path once (each comm type, TP x CP, the router's token group
# with interleaved tokens and its capacity gather, jitter, packed documents).

# dense layers, each comm type
run_case cp2_dense_p2p 2 "${CP2[@]}" -- --num-experts 0
full cp4_dense_p2p run_case cp4_dense_p2p 4 "${CP4[@]}" -- --num-experts 0
run_case cp2_a2a 2 "${CP2[@]}" --cp-comm-type a2a -- --num-experts 0
full cp4_a2a run_case cp4_a2a 4 "${CP4[@]}" --cp-comm-type a2a -- --num-experts 0
run_case cp2_allgather 2 "${CP2[@]}" --cp-comm-type allgather -- --num-experts 0
full cp4_allgather run_case cp4_allgather 4 "${CP4[@]}" --cp-comm-type allgather -- --num-experts 0
run_case cp4_a2a_p2p 4 "${CP4[@]}" --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 -- \
    --num-experts 0
full cp4_per_layer_types run_case cp4_per_layer_types 4 "${CP4[@]}" --cp-comm-type allgather a2a+p2p \
    --hierarchical-context-parallel-sizes 2 2 -- "${MOE[@]}"

# attention kinds
full cp2_gqa_qk_norm run_case cp2_gqa_qk_norm 2 "${CP2[@]}" -- --num-experts 0 --group-query-attention \
    --num-query-groups 2 --qk-layernorm
full cp2_mla run_case cp2_mla 2 "${CP2[@]}" -- "${MOE[@]}" --multi-latent-attention --q-lora-rank 32 --kv-lora-rank 32 \
    --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16
full cp2_mla_a2a run_case cp2_mla_a2a 2 "${CP2[@]}" --cp-comm-type a2a -- "${MOE[@]}" --multi-latent-attention \
    --kv-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16

# MoE: the router's statistics over the micro-batch's interleaved chunks
run_case cp2_moe_aux_z_loss 2 "${CP2[@]}" -- "${MOE[@]}" --moe-z-loss-coeff 1e-3
# a rerun of the same layout is bit-identical (every sum in a fixed order)
rerun_identical cp2_rerun_bit_identical cp2_moe_aux_z_loss 2 "${CP2[@]}" -- "${MOE[@]}" --moe-z-loss-coeff 1e-3
run_case cp4_seq_aux_bias_jitter 4 "${CP4[@]}" -- "${MOE[@]}" --moe-router-load-balancing-type seq_aux_loss \
    --moe-z-loss-coeff 1e-3 --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
    --moe-router-bias-update-rate 0.01 --moe-input-jitter-eps 0.01
full cp2_all_balance_losses run_case cp2_all_balance_losses 2 "${CP2[@]}" -- "${MOE[@]}" \
    --moe-router-load-balancing-type aux_loss seq_aux_loss global_aux_loss --moe-aux-loss-coeff 0.01 0.02 0.005
capacity_by_position() {
    run_case cp2_capacity_position 2 "${CP2[@]}" -- "${MOE[@]}" --moe-expert-capacity-factor 0.5 \
        --moe-token-drop-policy position && dropped cp2_capacity_position_drops
}
capacity_by_position
full cp2_capacity_padded run_case cp2_capacity_padded 2 "${CP2[@]}" -- "${MOE[@]}" \
    --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity --moe-shared-expert-intermediate-size 64

# with the other parallelisms (the vocabulary padded to 512 rows as one process pads it:
# 256 x TP=2): TP x CP (the router's token group both), EP over CP and over CP x DP
run_case cp2_tp2_sp 4 "${CP2[@]}" --tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256 -- "${MOE[@]}" \
    --moe-router-load-balancing-type seq_aux_loss --moe-expert-capacity-factor 1.0
full cp2_tp2_olmoe_qk_norm_allgather run_case cp2_tp2_olmoe_qk_norm_allgather 4 "${CP2[@]}" \
    --tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256 --cp-comm-type allgather -- \
    "${MOE[@]}" --qk-layernorm --qk-layernorm-scope projection --clip-qkv 0.5 --group-query-attention --num-query-groups 2
full cp2_ep2 run_case cp2_ep2 2 "${CP2[@]}" --expert-model-parallel-size 2 -- "${MOE[@]}"
full cp2_dp2_ep4_distributed_optimizer run_case cp2_dp2_ep4_distributed_optimizer 4 "${CP2[@]}" \
    --expert-model-parallel-size 4 --use-distributed-optimizer -- "${MOE[@]}"
# global_aux_loss counts over the data-parallel ranks (one member of each CP group): DP=2 reference
cp_dp_global_aux() {
    local flags=("${SMALL[@]}" "${MOE[@]}" --moe-router-load-balancing-type global_aux_loss)
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${flags[@]}" --log-jsonl "$work/ga_dp2.jsonl" >"$work/ga_dp2.log" 2>&1 ||
        { fail cp2_dp2_global_aux "DP=2: $(tail -2 "$work/ga_dp2.log" | tr '\n' ' ')"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train "${flags[@]}" "${CP2[@]}" --log-jsonl "$work/ga_cp2.jsonl" \
        >"$work/ga_cp2.log" 2>&1 || { fail cp2_dp2_global_aux "CP=2 x DP=2: $(tail -2 "$work/ga_cp2.log" | tr '\n' ' ')"; return; }
    curve "$work/ga_dp2.jsonl" >"$work/ga_dp2.a"
    curve "$work/ga_cp2.jsonl" >"$work/ga_cp2.b"
    compare cp2_dp2_global_aux "$work/ga_dp2.a" "$work/ga_cp2.b"
}
full cp2_dp2_global_aux cp_dp_global_aux

# packed documents: EOD-separated documents of 3 to 30 words, so that sequences hold an odd
# or even number of them and they cross the chunk boundaries
packed_documents() {
    make_corpus "$work/docs.txt" 11 300 3 30 || { fail cp_packed_documents "python3 failed"; return; }
    "$M" prepare --input "$work/docs.txt" --vocab-size 320 --append-eod --output-prefix "$work/docs" \
        >"$work/docs_prep.log" 2>&1 || { fail cp_packed_documents "prepare: $(tail -1 "$work/docs_prep.log")"; return; }
    local DOCS=(--data-path "$work/docs_text_document" --tokenizer-model "$work/docs_tokenizer.json" --eod-mask-loss
                --reset-position-ids --reset-attention-mask --data-cache-path "$work/docs_cache" --vocab-size 320)
    run_case cp2_packed_documents 2 "${CP2[@]}" -- "${MOE[@]}" "${DOCS[@]}"
    full cp4_packed_documents_a2a_p2p run_case cp4_packed_documents_a2a_p2p 4 "${CP4[@]}" --cp-comm-type a2a+p2p \
        --hierarchical-context-parallel-sizes 2 2 -- "${MOE[@]}" "${DOCS[@]}"
    full cp4_packed_documents_allgather run_case cp4_packed_documents_allgather 4 "${CP4[@]}" --cp-comm-type allgather \
        -- --num-experts 0 "${DOCS[@]}"
}
packed_documents

# --bf16: the K/V blocks (and the a2a's q, k, v) travel as bf16 (the cpu attention reads them
# only through bf16-input GEMMs): the same bits as fp32 at 0.6-0.9 of the bytes (the
# backward's dK/dV sums stay fp32; p2p and a2a here: 0.75, allgather 0.67)
bf16_exchange_exact cp2_bf16_kv_p2p 2 cp_bytes 0.6 0.9 "${CP2[@]}" "${MOE[@]}"
full cp2_bf16_kv_allgather bf16_exchange_exact cp2_bf16_kv_allgather 2 cp_bytes 0.6 0.9 "${CP2[@]}" --cp-comm-type allgather --num-experts 0
full cp2_bf16_qkv_a2a bf16_exchange_exact cp2_bf16_qkv_a2a 2 cp_bytes 0.6 0.9 "${CP2[@]}" --cp-comm-type a2a --num-experts 0

# checkpoints: CP=2 x EP=2 (distributed optimizer) for 4 steps, then one process for 3, then
# CP=4 for the last 3, give the single-process 10 steps
cp_checkpoint_chain() {
    local name=cp_checkpoint_chain ck="$work/cp_chain" log="$work/cp_chain.jsonl"
    reference "${MOE[@]}" || { fail $name "single process: $(tail -1 "$ref.log")"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train "${SMALL[@]}" "${MOE[@]}" "${CP2[@]}" --expert-model-parallel-size 2 \
        --use-distributed-optimizer --exit-interval 4 --save "$ck" --log-jsonl "$log" >"$work/cp_chain1.log" 2>&1 ||
        { fail $name "CP=2 leg: $(tail -2 "$work/cp_chain1.log" | tr '\n' ' ')"; return; }
    "$M" train --load "$ck" --exit-interval 7 --save "$ck" --log-jsonl "$log" >"$work/cp_chain2.log" 2>&1 ||
        { fail $name "one-process leg: $(tail -2 "$work/cp_chain2.log" | tr '\n' ' ')"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train --load "$ck" "${CP4[@]}" --exit-interval 0 --save "$ck" \
        --log-jsonl "$log" >"$work/cp_chain3.log" 2>&1 ||
        { fail $name "CP=4 leg: $(tail -2 "$work/cp_chain3.log" | tr '\n' ' ')"; return; }
    grep -q "layout TP1 CP4 PP1 DP1" "$work/cp_chain3.log" || { fail $name "not CP=4: $(grep -m1 layout "$work/cp_chain3.log")"; return; }
    curve "$log" >"$work/cp_chain.b"
    compare $name "$ref.a" "$work/cp_chain.b"
}
full cp_checkpoint_chain cp_checkpoint_chain

# bad sizes: one line naming the flags
expect_error cp_seq_length "--seq-length 36 must be a multiple of 2 x --context-parallel-size 4" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 --seq-length 36 "${CP4[@]}"
expect_error cp_a2a_heads "--cp-comm-type a2a splits the 4 query and 1 key/value heads" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 --group-query-attention --num-query-groups 1 "${CP2[@]}" --cp-comm-type a2a
expect_error cp_hierarchical_missing "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 "${CP4[@]}" --cp-comm-type a2a+p2p
expect_error cp_hierarchical_product "whose product is --context-parallel-size 4" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 "${CP4[@]}" --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 3
expect_error cp_comm_type_count "--cp-comm-type has 3 values for 2 layers" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 "${CP2[@]}" --cp-comm-type p2p p2p a2a
expect_error cp_comm_type_name "--cp-comm-type ring: use p2p, a2a, allgather or a2a+p2p" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 "${CP2[@]}" --cp-comm-type ring
