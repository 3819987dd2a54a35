#!/usr/bin/env bash
# test_mpi_pp.sh — pipeline parallelism under mpirun gives the single-process run: 10 steps
# of each layout reproduce the losses (lm and aux) and gradient norms of one process within
# 1e-5 relative. Cases: PP=2 and PP=4 1F1B; PP=2 and PP=4 interleaved with 2 virtual stages
# (by --num-virtual-stages-per-pipeline-rank and --num-layers-per-virtual-pipeline-stage);
# an uneven --pipeline-model-parallel-layout; --decoder-first/last-pipeline-num-layers;
# --account-for-embedding/loss-in-pipeline-split; tied and untied embeddings; PP x TP
# (sequence parallel), PP x EP, PP x ETP x EP, PP x CP, 8 ranks PP x TP x EP x DP with the distributed
# optimizer; micro-batch counts not a multiple of PP; DeepSeek-style first dense layers;
# every balance loss with z-loss, and expert bias (1F1B and interleaved); the gradient sums overlapped with
# backward (DP) and not. Expert-parallel overlap: --moe-shared-expert-overlap and the
# combined 1F1B schedule (--overlap-moe-expert-parallel-comm, --delay-wgrad-compute; EP, PP
# with virtual stages, TP, ETP, CP) each give the run without them bit for bit, and report the
# exchanges' hidden time. Also: a rerun is bit-identical; a checkpoint of PP=2 x EP=2 resumes
# under PP=4 and then in one process, continuing as the single run; each step reports the
# measured and the ideal bubble; a rank failing mid-schedule ends every rank with its
# message; bad placements and schedules are refused with one line naming the flags.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_pp
SMALL=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --ffn-hidden-size 128 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536
       --train-iters 10 --global-batch-size 8 --make-vocab-size-divisible-by 512)
MOE=(--num-experts 4 --moe-ffn-hidden-size 64 --moe-router-topk 2 --moe-aux-loss-coeff 0.01)
PP2=(--pipeline-model-parallel-size 2)
PP4=(--pipeline-model-parallel-size 4)
TP2=(--tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256)  # 256 x 2 rows, as one process pads

# Under a sanitizer build the cases marked "full" (mpi_lib.sh) run in the plain build only;
# the others take every code path once (1F1B, interleaving, the tied embedding across
# stages, TP and EP inside stages, the overlapped gradient sums, a checkpoint move).

# schedules and placements
run_case pp2_1f1b 2 "${PP2[@]}" -- "${MOE[@]}"
full pp4_1f1b run_case pp4_1f1b 4 "${PP4[@]}" -- "${MOE[@]}"
run_case pp2_interleaved 2 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 -- "${MOE[@]}"
full pp4_interleaved run_case pp4_interleaved 4 "${PP4[@]}" --num-layers-per-virtual-pipeline-stage 1 -- \
    "${MOE[@]}" --num-layers 8
full pp2_interleaved_groups run_case pp2_interleaved_groups 2 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 \
    --microbatch-group-size-per-virtual-pipeline-stage 3 -- "${MOE[@]}" --global-batch-size 10
run_case pp2_layout 2 "${PP2[@]}" --pipeline-model-parallel-layout "Et|(t)*3,L" -- "${MOE[@]}"
full pp2_layout_virtual run_case pp2_layout_virtual 2 "${PP2[@]}" --pipeline-model-parallel-layout "E|t|tt|tL" -- \
    "${MOE[@]}"
full pp2_first_last run_case pp2_first_last 2 "${PP2[@]}" --decoder-first-pipeline-num-layers 1 -- "${MOE[@]}"
full pp4_first_last run_case pp4_first_last 4 "${PP4[@]}" --decoder-first-pipeline-num-layers 1 \
    --decoder-last-pipeline-num-layers 1 -- "${MOE[@]}" --num-layers 6
full pp2_account_for run_case pp2_account_for 2 "${PP2[@]}" --account-for-embedding-in-pipeline-split \
    --account-for-loss-in-pipeline-split -- "${MOE[@]}" --num-layers 6
run_case pp2_untied 2 "${PP2[@]}" -- "${MOE[@]}" --untie-embeddings-and-output-weights
full pp2_odd_micro_batches run_case pp2_odd_micro_batches 2 "${PP2[@]}" -- "${MOE[@]}" --global-batch-size 6
full pp4_few_micro_batches run_case pp4_few_micro_batches 4 "${PP4[@]}" -- "${MOE[@]}" --global-batch-size 4

# MoE features whose statistics span the stages
full pp2_first_dense_layers run_case pp2_first_dense_layers 2 "${PP2[@]}" -- "${MOE[@]}" --moe-layer-freq "[0,1,1,1]" \
    --moe-shared-expert-intermediate-size 64
# (one data-parallel rank: global_aux_loss sums each micro-batch's counts over the DP ranks,
# so a DP layout differs from one process by design, as Megatron's)
run_case pp2_all_balance_losses_bias 2 "${PP2[@]}" -- "${MOE[@]}" \
    --moe-router-load-balancing-type aux_loss seq_aux_loss global_aux_loss --moe-aux-loss-coeff 0.01 0.02 0.005 \
    --moe-z-loss-coeff 1e-3 --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
    --moe-router-bias-update-rate 0.01
full pp2_interleaved_all_balance_losses_bias run_case pp2_interleaved_all_balance_losses_bias 2 "${PP2[@]}" \
    --num-virtual-stages-per-pipeline-rank 2 -- "${MOE[@]}" \
    --moe-router-load-balancing-type aux_loss seq_aux_loss global_aux_loss --moe-aux-loss-coeff 0.01 0.02 0.005 \
    --moe-z-loss-coeff 1e-3 --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
    --moe-router-bias-update-rate 0.01

# with the other parallelisms
run_case pp2_tp2 4 "${PP2[@]}" "${TP2[@]}" -- "${MOE[@]}"
run_case pp2_ep2 4 "${PP2[@]}" --expert-model-parallel-size 2 -- "${MOE[@]}"
full pp2_cp2 run_case pp2_cp2 4 "${PP2[@]}" --context-parallel-size 2 -- "${MOE[@]}"
full pp2_etp2_ep2 run_case pp2_etp2_ep2 8 "${PP2[@]}" --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 -- \
    "${MOE[@]}"
full pp2_tp2_ep2_dp2 run_case pp2_tp2_ep2_dp2 8 "${PP2[@]}" "${TP2[@]}" --expert-model-parallel-size 2 \
    --use-distributed-optimizer -- "${MOE[@]}"
full pp2_interleaved_dp2 run_case pp2_interleaved_dp2 4 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 -- \
    "${MOE[@]}" --global-batch-size 16

# a rerun of the same layout is bit-identical (every sum in a fixed order)
rerun_identical pp2_rerun_bit_identical pp2_1f1b 2 "${PP2[@]}" -- "${MOE[@]}"

# expert-parallel communication hidden behind compute: each overlap gives the run without
# it bit for bit (and so the single-process run within 1e-5)
SHARED=(--moe-shared-expert-intermediate-size 64 --moe-shared-expert-gate)
EP2=(--expert-model-parallel-size 2)
COMBINED=(--overlap-moe-expert-parallel-comm --delay-wgrad-compute)
run_case ep2_shared 2 "${EP2[@]}" -- "${MOE[@]}" "${SHARED[@]}"
run_case ep2_shared_overlap 2 "${EP2[@]}" --moe-shared-expert-overlap -- "${MOE[@]}" "${SHARED[@]}"
identical ep2_shared_overlap_bit_identical ep2_shared ep2_shared_overlap
run_case ep2_combined 2 "${EP2[@]}" "${COMBINED[@]}" -- "${MOE[@]}" "${SHARED[@]}"
identical ep2_combined_bit_identical ep2_shared ep2_combined
full ep2_combined_no_delay run_case ep2_combined_no_delay 2 "${EP2[@]}" --overlap-moe-expert-parallel-comm -- \
    "${MOE[@]}" "${SHARED[@]}" --moe-z-loss-coeff 1e-3 --moe-router-load-balancing-type seq_aux_loss
run_case pp2_vp2_ep2 4 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 "${EP2[@]}" -- "${MOE[@]}"
run_case pp2_vp2_ep2_combined 4 "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 "${EP2[@]}" "${COMBINED[@]}" -- \
    "${MOE[@]}"
identical pp2_vp2_ep2_combined_bit_identical pp2_vp2_ep2 pp2_vp2_ep2_combined
full tp2_ep2_shared run_case tp2_ep2_shared 4 "${TP2[@]}" "${EP2[@]}" -- "${MOE[@]}" "${SHARED[@]}"
full tp2_ep2_shared_overlap run_case tp2_ep2_shared_overlap 4 "${TP2[@]}" "${EP2[@]}" --moe-shared-expert-overlap -- \
    "${MOE[@]}" "${SHARED[@]}"
full tp2_ep2_combined run_case tp2_ep2_combined 4 "${TP2[@]}" "${EP2[@]}" "${COMBINED[@]}" -- "${MOE[@]}" "${SHARED[@]}"
full etp2_ep2_combined run_case etp2_ep2_combined 4 "${EP2[@]}" --expert-tensor-parallel-size 2 "${COMBINED[@]}" -- \
    "${MOE[@]}"
full cp2_ep2_combined run_case cp2_ep2_combined 4 --context-parallel-size 2 "${EP2[@]}" "${COMBINED[@]}" -- "${MOE[@]}"
hidden_reported() {  # the combined run reports exchanges in flight behind the other pass's compute
    python3 -c 'import json,sys; r=[x for x in map(json.loads, open(sys.argv[1])) if "loss" in x]; sys.exit(not (r and all(x["expert_comm_hidden_s"] > 0 for x in r)))' \
        "$work/ep2_combined.jsonl" && ok ep_comm_hidden_reported || fail ep_comm_hidden_reported "expert_comm_hidden_s missing or 0"
}
hidden_reported

# every step reports the bubble: measured (a share of the step) and the ideal (p-1)/(v·m+p-1)
bubble_reported() {
    python3 - "$work/pp2_1f1b.jsonl" "$work/pp2_interleaved.jsonl" <<'PY'
import json, sys
for path, ideal in zip(sys.argv[1:], (1 / 5, 1 / 9)):  # PP=2, 4 micro-batches, 1 or 2 chunks
    for r in map(json.loads, open(path)):
        if "loss" not in r: continue
        assert abs(r["pp_bubble_ideal"] - ideal) < 1e-12, (path, r["pp_bubble_ideal"])
        assert 0 <= r["pp_bubble"] < 1 and r["pp_bubble_s"] >= 0, (path, r["pp_bubble"], r["pp_bubble_s"])
PY
}
bubble_reported && ok pp_bubble_reported || fail pp_bubble_reported "pp_bubble / pp_bubble_ideal missing or wrong"

# checkpoints: PP=2 x EP=2 for 4 steps, then PP=4 for 3, then one process for the last 3,
# give the single-process 10 steps (held-out evaluation through the stages at step 5)
pp_checkpoint_chain() {
    local name=pp_checkpoint_chain ck="$work/pp_chain" log="$work/pp_chain.jsonl" eval=(--eval-interval 5 --eval-iters 2)
    reference "${MOE[@]}" "${eval[@]}" || { fail $name "single process: $(tail -1 "$ref.log")"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train "${SMALL[@]}" "${MOE[@]}" "${eval[@]}" "${PP2[@]}" \
        --expert-model-parallel-size 2 --exit-interval 4 --save "$ck" --log-jsonl "$log" >"$work/pp_chain1.log" 2>&1 ||
        { fail $name "PP=2 x EP=2 leg: $(tail -2 "$work/pp_chain1.log" | tr '\n' ' ')"; return; }
    timeout 600 "${MPIRUN[@]}" -np 4 "$M" train --load "$ck" "${PP4[@]}" --exit-interval 7 --save "$ck" \
        --log-jsonl "$log" >"$work/pp_chain2.log" 2>&1 ||
        { fail $name "PP=4 leg: $(tail -2 "$work/pp_chain2.log" | tr '\n' ' ')"; return; }
    grep -q "layout TP1 CP1 PP4 DP1" "$work/pp_chain2.log" || { fail $name "not PP=4: $(grep -m1 layout "$work/pp_chain2.log")"; return; }
    "$M" train --load "$ck" --exit-interval 0 --save "$ck" --log-jsonl "$log" >"$work/pp_chain3.log" 2>&1 ||
        { fail $name "one-process leg: $(tail -2 "$work/pp_chain3.log" | tr '\n' ' ')"; return; }
    curve "$log" >"$work/pp_chain.b"
    compare $name "$ref.a" "$work/pp_chain.b"
    local evals
    evals=$(python3 -c 'import json,sys; a=[r["eval_loss"] for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r]; b=[r["eval_loss"] for r in map(json.loads, open(sys.argv[2])) if "eval_loss" in r]; print(len(a) == len(b) == 2 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)))' "$ref.jsonl" "$log")
    [ "$evals" = True ] && ok pp_eval_through_stages || fail pp_eval_through_stages "held-out losses differ from one process"
}
pp_checkpoint_chain

# a rank failing in the middle of the schedule ends every rank, with its message, while its
# neighbours wait on point-to-point transfers (no hang: the limit is far above a run's time)
fail_mid_schedule() {
    MOETRON_TEST_FAIL_MID_SCHEDULE=2 timeout 300 "${MPIRUN[@]}" -np 4 "$M" train "${SMALL[@]}" "${MOE[@]}" "${PP4[@]}" \
        >"$work/pp_fail.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
        grep -q "moetron: error: \[rank 2\] failing in the middle of the pipeline schedule" "$work/pp_fail.log"; then
        ok pp_failure_ends_every_rank
    else
        fail pp_failure_ends_every_rank "exit $rc (124: hung): $(grep moetron "$work/pp_fail.log" | tail -2 | tr '\n' ' ')"
    fi
}
fail_mid_schedule

# bad placements and schedules: one line naming the flags
expect_error pp_layout_mtp "has 1 multi-token-prediction layers (m) but --mtp-num-layers is 0" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --pipeline-model-parallel-layout "Et|tt|m|tL"
expect_error pp_layout_count "--pipeline-model-parallel-layout has 3 decoder layers (t) but --num-layers is 4" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --pipeline-model-parallel-layout "Et|ttL"
expect_error pp_layout_stages "--pipeline-model-parallel-layout has 3 stages, not a multiple of --pipeline-model-parallel-size 2" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --pipeline-model-parallel-layout "Et|t|ttL"
expect_error pp_layout_ends "--pipeline-model-parallel-layout must end with L (the loss), once" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --pipeline-model-parallel-layout "Ett|tt"
expect_error pp_uneven "--num-layers 4 is not a multiple of --pipeline-model-parallel-size 3" -- \
    "$M" train "${SMALL[@]}" --pipeline-model-parallel-size 3
expect_error pp_first_last "leave 1 of --num-layers 4 for 0 middle stage(s)" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 2
expect_error pp_two_virtual_flags "give at most one of --num-layers-per-virtual-pipeline-stage" -- \
    "$M" train "${SMALL[@]}" "${PP2[@]}" --num-layers-per-virtual-pipeline-stage 1 --num-virtual-stages-per-pipeline-rank 2
expect_error pp_virtual_without_pp "virtual pipeline stages (2 per rank) need --pipeline-model-parallel-size above 1" -- \
    "$M" train "${SMALL[@]}" --num-virtual-stages-per-pipeline-rank 2
expect_error overlap_needs_ep "--overlap-moe-expert-parallel-comm needs --expert-model-parallel-size above 1" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" --overlap-moe-expert-parallel-comm
expect_error overlap_needs_virtual "needs virtual pipeline stages (--num-virtual-stages-per-pipeline-rank)" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" "${PP2[@]}" "${EP2[@]}" --overlap-moe-expert-parallel-comm
expect_error overlap_not_with_shared "--overlap-moe-expert-parallel-comm and --moe-shared-expert-overlap exclude each other" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" "${SHARED[@]}" "${EP2[@]}" --overlap-moe-expert-parallel-comm --moe-shared-expert-overlap
expect_error delay_needs_overlap "--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" --delay-wgrad-compute
expect_error shared_overlap_needs_shared "--moe-shared-expert-overlap needs a shared expert" -- \
    "$M" train "${SMALL[@]}" "${MOE[@]}" --moe-shared-expert-overlap
interleaved_refused() {  # the schedule's counts are known once the ranks are: every rank says why
    timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${SMALL[@]}" "${PP2[@]}" --num-virtual-stages-per-pipeline-rank 2 \
        --global-batch-size 10 >"$work/pp_interleaved_refused.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "moetron: error: .*must be 0 or at least --pipeline-model-parallel-size, not 1; change --global-batch-size" "$work/pp_interleaved_refused.log"; then
        ok pp_interleaved_group_refused
    else
        fail pp_interleaved_group_refused "exit $rc: $(grep -m1 moetron "$work/pp_interleaved_refused.log")"
    fi
}
interleaved_refused
