#!/usr/bin/env bash
# test_balancing_routers.sh — the routers that balance by how they pick (their picks,
# probs and gradients are checked against megatron-core, or a reference written from
# Megatron-LM's definition, by tests/conformance/megatron_router.py):
#   --moe-router-load-balancing-type sinkhorn: top-2 (softmax) and top-1 (sigmoid) train and
#     evaluate; the loads are more even than plain top-k routing's on the same model; EP=2,
#     DP=2, TP=2 with SP and CP=2 give the single-process numbers (1e-5, 10 steps);
#   --moe-router-load-balancing-type quantile_balancing: trains with its bias in the
#     checkpoint (a resumed run continues bit for bit; generate reads it), loads more even than
#     without balancing, --moe-router-quantile-balancing-ema changes the run, EP=2, DP=2, CP=2
#     and TP=2 with SP equal one process;
# and the options each ignores, an aux-loss coefficient and a Hugging Face family that cannot
# hold the bias are refused with one line.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 4
       --global-batch-size 8 --num-experts 8 --moe-ffn-hidden-size 32 --eval-interval 5 --eval-iters 1
       --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536 --train-iters 10
       --make-vocab-size-divisible-by 512)
# TP=2 pads the vocabulary to --make-vocab-size-divisible-by x TP: half of SMALL's, the same rows
TP2_SP=(--tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256)
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

# ---- quantile balancing ----
QB=(--moe-router-load-balancing-type quantile_balancing --moe-aux-loss-coeff 0 --moe-router-topk 2)
if "$M" train "${SMALL[@]}" "${QB[@]}" --save "$work/qb.ck" --save-interval 5 --log-jsonl "$work/qb.jsonl" \
    >"$work/qb.log" 2>&1 && grep -q "held-out loss" "$work/qb.log" && [ "$(losses "$work/qb.jsonl" | wc -l)" -eq 10 ]; then
    ok quantile_balancing_trains
else
    fail quantile_balancing_trains "$(tail -2 "$work/qb.log" | tr '\n' ' ')"
fi
"$M" train "${SMALL[@]}" --moe-router-topk 2 --moe-router-load-balancing-type none --moe-aux-loss-coeff 0 \
    --log-jsonl "$work/none.jsonl" >"$work/none.log" 2>&1
qb_worst=$(worst_load "$work/qb.jsonl") none_worst=$(worst_load "$work/none.jsonl")
if python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))' "$qb_worst" "$none_worst"; then
    ok quantile_balancing_balances_the_load
else
    fail quantile_balancing_balances_the_load "worst imbalance $qb_worst with quantile balancing, $none_worst without"
fi
# the bias is in the checkpoint: resuming at step 5 gives steps 6-10 bit for bit
"$M" train "${SMALL[@]}" "${QB[@]}" --load "$work/qb.ck/iter_0000005" --log-jsonl "$work/qb_resumed.jsonl" \
    >"$work/qb_resumed.log" 2>&1
if [ -n "$(step_numbers "$work/qb_resumed.jsonl")" ] &&
    cmp -s <(step_numbers "$work/qb_resumed.jsonl") <(step_numbers "$work/qb.jsonl" | tail -n +6); then
    ok quantile_balancing_resumes_bit_for_bit
else
    fail quantile_balancing_resumes_bit_for_bit "$(diff <(step_numbers "$work/qb_resumed.jsonl") <(step_numbers "$work/qb.jsonl" | tail -n +6) | head -2 | tr '\n' ' ') $(tail -1 "$work/qb_resumed.log")"
fi
if "$M" generate --load "$work/qb.ck" --prompt "the cat" --max-new-tokens 4 --temperature 0 >"$work/qb_gen.txt" \
    2>"$work/qb_gen.err"; then
    ok quantile_balancing_generates
else
    fail quantile_balancing_generates "$(tail -1 "$work/qb_gen.err")"
fi
"$M" train "${SMALL[@]}" "${QB[@]}" --moe-router-quantile-balancing-ema 0.9 --log-jsonl "$work/qb_ema.jsonl" \
    >"$work/qb_ema.log" 2>&1
if [ -n "$(step_numbers "$work/qb_ema.jsonl")" ] && ! cmp -s <(step_numbers "$work/qb_ema.jsonl") <(step_numbers "$work/qb.jsonl"); then
    ok quantile_balancing_ema_matters
else
    fail quantile_balancing_ema_matters "$(tail -1 "$work/qb_ema.log")"
fi

# replaying the run's own trace: the same numbers, and the bias still learns (the quantiles
# are taken on the replayed forwards): the same bias saved
"$M" train "${SMALL[@]}" "${QB[@]}" --train-iters 4 --moe-routing-trace-path "$work/qb.trace" --save "$work/qb_rec.ck" \
    --log-jsonl "$work/qb_rec.jsonl" >"$work/qb_rec.log" 2>&1
"$M" train "${SMALL[@]}" "${QB[@]}" --train-iters 4 --moe-routing-trace-path "$work/qb.trace" --moe-enable-routing-replay \
    --save "$work/qb_rep.ck" --log-jsonl "$work/qb_rep.jsonl" >"$work/qb_rep.log" 2>&1
if [ -n "$(step_numbers "$work/qb_rep.jsonl")" ] && cmp -s <(step_numbers "$work/qb_rec.jsonl") <(step_numbers "$work/qb_rep.jsonl") &&
    python3 - "$work/qb_rec.ck" "$work/qb_rep.ck" <<'PY'
import glob, sys
import numpy as np
from safetensors.numpy import load_file
a, b = (load_file(glob.glob(d + "/iter_*/model.safetensors")[0]) for d in sys.argv[1:3])
keys = [k for k in a if k.endswith("quantile_balancing_bias")]
sys.exit(not keys or not all(np.any(a[k] != 0) and np.array_equal(a[k], b[k]) for k in keys))
PY
then
    ok quantile_balancing_replayed_bias_learns
else
    fail quantile_balancing_replayed_bias_learns "$(tail -1 "$work/qb_rep.log")"
fi
expect_error quantile_switched_on_resume "was trained with quantile_balancing .*keep the checkpoint's balancing type" -- \
    "$M" train "${SMALL[@]}" --load "$work/qb.ck" --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.01 \
    --train-iters 12
expect_error quantile_ema_alone "--moe-router-quantile-balancing-ema applies to --moe-router-load-balancing-type quantile_balancing" -- \
    "$M" train "${SMALL[@]}" --moe-router-quantile-balancing-ema 0.5

expect_error quantile_aux_coeff "quantile_balancing has no aux loss" -- \
    "$M" train "${SMALL[@]}" --moe-router-load-balancing-type quantile_balancing --moe-aux-loss-coeff 0.01
expect_error quantile_topk_all_experts "needs --moe-router-topk 8 below --num-experts 8" -- \
    "$M" train "${SMALL[@]}" "${QB[@]}" --moe-router-topk 8
expect_error quantile_divisible "--moe-router-topk (.*) to be a multiple of --num-experts 7" -- \
    "$M" train "${SMALL[@]}" "${QB[@]}" --num-experts 7 --micro-batch-size 1 --seq-length 31
expect_error quantile_expert_bias "keeps its own per-expert bias; drop --moe-router-enable-expert-bias" -- \
    "$M" train "${SMALL[@]}" "${QB[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
expect_error quantile_ema_range "--moe-router-quantile-balancing-ema 1 must be in \[0, 1)" -- \
    "$M" train "${SMALL[@]}" "${QB[@]}" --moe-router-quantile-balancing-ema 1
expect_error quantile_hf_family "--hf-architecture mixtral cannot express this model: quantile-balancing routing" -- \
    "$M" train "${SMALL[@]}" "${QB[@]}" --hf-architecture mixtral

mpi_require balancing_routers_mpi
run_case sinkhorn_ep2_equals_single 2 --expert-model-parallel-size 2 -- "${SINKHORN[@]}" --moe-router-topk 2
run_case sinkhorn_dp2_equals_single 2 -- "${SINKHORN[@]}" --moe-router-topk 1
run_case quantile_ep2_equals_single 2 --expert-model-parallel-size 2 -- "${QB[@]}"
run_case quantile_dp2_equals_single 2 -- "${QB[@]}" --moe-router-quantile-balancing-ema 0.5
# the tokens of a micro-batch split over ranks: the logits gathered, picks and quantiles over all
run_case sinkhorn_tp2_sp_equals_single 2 "${TP2_SP[@]}" -- "${SINKHORN[@]}" --moe-router-topk 2
run_case quantile_cp2_equals_single 2 --context-parallel-size 2 -- "${QB[@]}"
full sinkhorn_cp2_equals_single run_case sinkhorn_cp2_equals_single 2 --context-parallel-size 2 -- "${SINKHORN[@]}" \
    --moe-router-topk 1
full quantile_tp2_sp_equals_single run_case quantile_tp2_sp_equals_single 2 "${TP2_SP[@]}" -- "${QB[@]}"
