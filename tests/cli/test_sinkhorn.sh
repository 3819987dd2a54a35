#!/usr/bin/env bash
# test_sinkhorn.sh — --moe-router-load-balancing-type sinkhorn (Megatron-Core's Sinkhorn
# routing; its picks, probs and gradient are checked against megatron-core itself by
# tests/conformance/megatron_router.py): top-2 (softmax) and top-1 (sigmoid) train and
# evaluate; the training loads are more even than plain top-k routing's on the same model;
# EP=2 and DP=2 give the single-process numbers (1e-5, 10 steps); the options Megatron's
# Sinkhorn router ignores, an aux-loss coefficient and a sequence split over ranks are
# refused with one line.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 4
       --global-batch-size 8 --num-experts 8 --moe-ffn-hidden-size 32 --eval-interval 5 --eval-iters 1
       --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536 --train-iters 10)
SINKHORN=(--moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0)

# worst_load FILE: the largest load imbalance of a run's steps
worst_load() { python3 -c 'import json,sys; print(max(r["load_imbalance"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$1"; }

for k in 2 1; do
    if "$M" train "${SMALL[@]}" "${SINKHORN[@]}" --moe-router-topk $k --log-jsonl "$work/k$k.jsonl" \
        >"$work/k$k.log" 2>&1 && grep -q "held-out loss" "$work/k$k.log" && [ "$(losses "$work/k$k.jsonl" | wc -l)" -eq 10 ]; then
        ok "sinkhorn_top${k}_trains"
    else
        fail "sinkhorn_top${k}_trains" "$(tail -2 "$work/k$k.log" | tr '\n' ' ')"
    fi
done
"$M" train "${SMALL[@]}" --moe-router-topk 2 --moe-router-pre-softmax --moe-router-load-balancing-type none \
    --moe-aux-loss-coeff 0 --log-jsonl "$work/plain.jsonl" >"$work/plain.log" 2>&1
sinkhorn_worst=$(worst_load "$work/k2.jsonl") plain_worst=$(worst_load "$work/plain.jsonl")
if python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))' "$sinkhorn_worst" "$plain_worst"; then
    ok sinkhorn_balances_the_load
else
    fail sinkhorn_balances_the_load "worst imbalance $sinkhorn_worst with Sinkhorn, $plain_worst without"
fi

expect_error sinkhorn_aux_coeff "sinkhorn has no aux loss .*give --moe-aux-loss-coeff 0" -- \
    "$M" train "${SMALL[@]}" --moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0.01
expect_error sinkhorn_not_alone "sinkhorn balances by itself; give it alone" -- \
    "$M" train "${SMALL[@]}" --moe-router-load-balancing-type sinkhorn aux_loss --moe-aux-loss-coeff 0 0.01
expect_error sinkhorn_score_function "sinkhorn scores with softmax for --moe-router-topk 2; drop --moe-router-score-function sigmoid" -- \
    "$M" train "${SMALL[@]}" "${SINKHORN[@]}" --moe-router-topk 2 --moe-router-score-function sigmoid
expect_error sinkhorn_expert_bias "sinkhorn takes no expert bias, group-limited routing or top-k scaling factor" -- \
    "$M" train "${SMALL[@]}" "${SINKHORN[@]}" --moe-router-topk 1 --moe-router-enable-expert-bias
expect_error sinkhorn_sequence_parallel "sinkhorn balances over a micro-batch's tokens, which sequence or context parallelism splits" -- \
    "$M" train "${SMALL[@]}" "${SINKHORN[@]}" --tensor-model-parallel-size 2 --sequence-parallel

mpi_require sinkhorn_mpi
run_case sinkhorn_ep2_equals_single 2 --expert-model-parallel-size 2 -- "${SINKHORN[@]}" --moe-router-topk 2
run_case sinkhorn_dp2_equals_single 2 -- "${SINKHORN[@]}" --moe-router-topk 1
