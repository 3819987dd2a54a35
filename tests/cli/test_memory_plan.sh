#!/usr/bin/env bash
# test_memory_plan.sh — `moetron plan` tells what a training run holds before it runs: for a
# few layouts (one process; EP=2 at its exchange's worst case; PP=2, whose stages differ)
# the planned total of every rank is within 10% of the peak resident memory that rank
# reaches in a 2-step run (bench/memory_plan_check.sh measures; bench/RESULTS.md has all of
# its cases). The plan's table has a row per set of equal ranks, the trainer's start-up line
# gives the same bytes as the plan (one model of memory), and bad layouts are refused with
# the trainer's line. Under the sanitizers (their allocator and shadow memory are part of
# what is resident) only the agreement with the trainer's line and the errors are checked.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
mpi_require memory_plan

SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --global-batch-size 8 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --train-iters 1
       --mock-data-tokens 16384 --lr-warmup-iters 1 --eval-interval 0)

# the plan's total for rank 0 and the trainer's "memory: per process X MiB" agree
"$M" plan "${SMALL[@]}" --expert-model-parallel-size 2 --world-size 2 >"$work/plan.out" 2>&1
"${MPIRUN[@]}" -np 2 "$M" train "${SMALL[@]}" --expert-model-parallel-size 2 >"$work/train.out" 2>&1
planned=$(awk -F'|' '$2 ~ /^ *0/ { gsub(/ /, "", $(NF - 1)); print $(NF - 1); exit }' "$work/plan.out")
started=$(sed -n 's/^memory: per process \([0-9.]*\) MiB.*/\1/p' "$work/train.out" | head -1)
if [ -n "$planned" ] && [ "$planned" = "$started" ]; then
    ok plan_is_the_trainers
else
    fail plan_is_the_trainers "plan ${planned:-?} MiB, the trainer's line ${started:-?} MiB: $(grep -m1 error "$work"/*.out)"
fi

# one row per set of equal ranks: PP=2's two stages differ, the TP and DP ranks of a stage
# (world ranks tp + 2·dp + 4·stage) do not
"$M" plan "${SMALL[@]}" --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
    --world-size 8 >"$work/pp.out" 2>&1
rows=$(grep -c '^| [0-9]' "$work/pp.out")
if [ "$rows" -eq 2 ] && grep -q '^| 0-3 | 0 |' "$work/pp.out" && grep -q '^| 4-7 | 1 |' "$work/pp.out"; then
    ok plan_rows_per_stage
else
    fail plan_rows_per_stage "$rows rows: $(grep '^| [0-9]' "$work/pp.out" | tr '\n' ' ')"
fi

expect_error plan_world_not_divisible "world of 3 processes is not divisible" -- \
    "$M" plan "${SMALL[@]}" --tensor-model-parallel-size 2 --sequence-parallel --world-size 3
expect_error plan_batch_per_dp "global-batch-size 8 must be a multiple" -- \
    "$M" plan "${SMALL[@]}" --world-size 16

if "$M" --version | grep -q sanitizers; then
    echo "skip plan_within_10_percent: sanitizer build (its allocator is resident too)"
    exit 0
fi
bash "$root/bench/memory_plan_check.sh" "$M" mixtral ep2_alltoall pp2 >"$work/check.out" 2>&1
checked=0
while read -r name rank planned measured ratio; do
    checked=$((checked + 1))
    if python3 -c "import sys; sys.exit(not 0.9 <= float(sys.argv[1]) <= 1.1)" "$ratio"; then
        ok "plan_within_10_percent_${name}_rank$rank"
    else
        fail "plan_within_10_percent_${name}_rank$rank" "planned $planned MiB, measured $measured MiB"
    fi
done < <(grep -E '^[a-z0-9_]+ [0-9]+ [0-9.]+ [0-9.]+ [0-9.]+$' "$work/check.out")
[ "$checked" -eq 5 ] || fail plan_within_10_percent "$checked ranks checked (expected 5): $(head -3 "$work/check.out")"
