#!/usr/bin/env bash
# bench/cp_memory.sh [moetron] — long context under context parallelism: a tiny dense model
# (1 layer, hidden 64, 4 heads) trains one step on one sequence of 32768 tokens with CP=1
# and with CP=4 (4 ranks, --cp-comm-type p2p). For each it prints the run's memory report
# (the activations of this rank's micro-batch, from the buffer plan) and each rank's peak
# RSS (/usr/bin/time), and the step's loss (the same on both). Then, under a per-process
# budget of BUDGET_MB (prlimit --data), CP=1 is refused at start-up with the memory
# check's line while CP=4 trains.
set -eu
M=${1:-build/moetron}
BUDGET_MB=${BUDGET_MB:-300}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 MOETRON_DEVICE=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FLAGS=(--num-experts 0 --num-layers 1 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
       --seq-length 32768 --max-position-embeddings 32768 --micro-batch-size 1 --global-batch-size 1
       --train-iters 1 --eval-interval 0 --log-interval 1 --mock-data-tokens 200000)

# run NAME RANKS [LIMIT...] -- FLAGS...: the training run under mpirun, each rank's peak RSS in NAME.RANK
run() {
    local name=$1 np=$2 limit=()
    shift 2
    while [ "$1" != "--" ]; do limit+=("$1"); shift; done
    shift
    mpirun --oversubscribe --bind-to none -np "$np" "${limit[@]}" sh -c \
        'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/$name" "$M" train "${FLAGS[@]}" "$@" \
        >"$work/$name.log" 2>&1
}

report() {  # NAME RANKS
    local rss=""
    for r in $(seq 0 $(($2 - 1))); do rss="$rss $(($(cat "$work/$1.$r") / 1024))"; done
    echo "$1: $(grep -m1 '^memory: per process' "$work/$1.log")"
    echo "$1: peak RSS per rank (MiB):$rss; $(grep -m1 '^step' "$work/$1.log" | cut -d'|' -f2 | xargs)"
}

grep -m1 'model name' /proc/cpuinfo
run cp1 1 -- || { tail -3 "$work/cp1.log"; exit 1; }
report cp1 1
run cp4 4 -- --context-parallel-size 4 || { tail -3 "$work/cp4.log"; exit 1; }
report cp4 4
echo "under a budget of $BUDGET_MB MiB per process (prlimit --data):"
if run cp1_budget 1 prlimit --data=$((BUDGET_MB << 20)) --; then
    echo "cp1: trained (the budget is too large to show the difference)"
else
    echo "cp1: refused: $(grep -m1 'error' "$work/cp1_budget.log")"
fi
run cp4_budget 4 prlimit --data=$((BUDGET_MB << 20)) -- --context-parallel-size 4 ||
    { echo "cp4: failed under the budget: $(grep -m1 error "$work/cp4_budget.log")"; exit 1; }
report cp4_budget 4
