#!/usr/bin/env bash
# test_mpi_dp.sh — data parallelism under mpirun gives the single-process run: 10 steps
# of DP=2 (with gradient accumulation, with expert bias, with the distributed optimizer)
# and DP=3 with the distributed optimizer (uneven shards) reproduce the losses and gradient
# norms of one process within 1e-5 relative; global_aux_loss counts over the DP ranks; a
# distributed-optimizer checkpoint resumes in one process; a missing data file on one
# rank ends every rank with the message. Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_dp
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1
       --mock-data-tokens 65536 --train-iters 10)

run_case() {  # name, ranks, extra flags...
    local name=$1 np=$2
    shift 2
    "$M" train "${SMALL[@]}" "$@" --log-jsonl "$work/$name.single.jsonl" >"$work/$name.single.log" 2>&1 ||
        { fail "$name" "single process: $(tail -1 "$work/$name.single.log")"; return; }
    timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train "${SMALL[@]}" "$@" --log-jsonl "$work/$name.mpi.jsonl" \
        >"$work/$name.mpi.log" 2>&1 || { fail "$name" "mpirun: $(tail -2 "$work/$name.mpi.log" | tr '\n' ' ')"; return; }
    curve "$work/$name.single.jsonl" >"$work/$name.a"
    curve "$work/$name.mpi.jsonl" >"$work/$name.b"
    compare "$name" "$work/$name.a" "$work/$name.b"
}

# Under a sanitizer build the cases marked "full" (mpi_lib.sh) run in the plain build only:
# gradient accumulation over DP ranks is also in test_mpi_ep.sh's runs on 2 ranks (DP=2, two
# micro-batches a rank), expert bias over DP ranks in its checkpoint chain (DP=4).
run_case dp2_equals_single 2 --global-batch-size 4
full dp2_accumulation_equals_single run_case dp2_accumulation_equals_single 2 --global-batch-size 8
full dp2_expert_bias_equals_single run_case dp2_expert_bias_equals_single 2 --global-batch-size 4 \
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 \
    --moe-router-load-balancing-type seq_aux_loss

run_case dp2_distributed_optimizer 2 --global-batch-size 4 --use-distributed-optimizer
# three ranks: shards of unequal size, parameters not divisible by 3
run_case dp3_distributed_optimizer_uneven 3 --global-batch-size 6 --use-distributed-optimizer

# global_aux_loss sums each micro-batch's counts over the data-parallel ranks: DP=2 with one
# micro-batch of 2 per rank is the single process with one micro-batch of 4 (its counts and
# the mean of the two ranks' losses are that micro-batch's), and EP=2 on the same 2 ranks
# is the same dense data-parallel group
GLOBAL_AUX=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --num-experts 4
            --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1
            --mock-data-tokens 65536 --train-iters 10 --global-batch-size 4
            --moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 0.1)
global_aux_dp2() {
    "$M" train "${GLOBAL_AUX[@]}" --micro-batch-size 4 --log-jsonl "$work/ga1.jsonl" >"$work/ga1.log" 2>&1 ||
        { fail global_aux_dp2 "single process: $(tail -1 "$work/ga1.log")"; return; }
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${GLOBAL_AUX[@]}" --micro-batch-size 2 --log-jsonl "$work/ga2.jsonl" \
        >"$work/ga2.log" 2>&1 || { fail global_aux_dp2 "mpirun: $(tail -2 "$work/ga2.log" | tr '\n' ' ')"; return; }
    curve "$work/ga1.jsonl" >"$work/ga1.a"
    curve "$work/ga2.jsonl" >"$work/ga2.a"
    compare global_aux_dp2_equals_one_micro_batch "$work/ga1.a" "$work/ga2.a"
}
global_aux_ep2() {
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${GLOBAL_AUX[@]}" --micro-batch-size 2 \
        --expert-model-parallel-size 2 --log-jsonl "$work/ga3.jsonl" >"$work/ga3.log" 2>&1 ||
        { fail global_aux_ep2 "mpirun: $(tail -2 "$work/ga3.log" | tr '\n' ' ')"; return; }
    curve "$work/ga3.jsonl" >"$work/ga3.a"
    compare global_aux_ep2_equals_dp2 "$work/ga2.a" "$work/ga3.a"
}
global_aux_dp2
full global_aux_ep2_equals_dp2 global_aux_ep2

# checkpoints stay global: 5 steps on DP=2 with the distributed optimizer, resumed in one
# process for 5 more, give the single-process 10 steps
layout_change() {
    local ref="$work/dp2_distributed_optimizer.a"
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${SMALL[@]}" --global-batch-size 4 --use-distributed-optimizer \
        --exit-interval 5 --save "$work/lc" --log-jsonl "$work/lc.jsonl" >"$work/lc1.log" 2>&1 ||
        { fail dist_opt_checkpoint_resumes_single "first half: $(tail -2 "$work/lc1.log" | tr '\n' ' ')"; return; }
    "$M" train --load "$work/lc" --exit-interval 0 >"$work/lc2.log" 2>&1 ||
        { fail dist_opt_checkpoint_resumes_single "second half: $(tail -1 "$work/lc2.log")"; return; }
    curve "$work/lc.jsonl" >"$work/lc.b"
    compare dist_opt_checkpoint_resumes_single "$ref" "$work/lc.b"
}
layout_change

# an error on one rank (its own missing file) ends every rank, with the message
printf 'some text for rank zero\n' >"$work/r0.txt"
timeout 120 "${MPIRUN[@]}" -np 2 bash -c '
    if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then f="$1/r0.txt"; else f="$1/missing.txt"; fi
    exec "$2" train --data-path "$f" --train-iters 3 --lr-warmup-iters 1 --eval-interval 0 --seq-length 8' _ "$work" "$M" >"$work/err.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "moetron: error: .*missing.txt" "$work/err.log"; then
    ok mpi_error_on_one_rank_ends_all
else
    fail mpi_error_on_one_rank_ends_all "exit $rc (124 = hang): $(tail -3 "$work/err.log" | tr '\n' ' ')"
fi
