#!/usr/bin/env bash
# test_mpi_save_memory.sh — saving and resuming fit in the memory training takes: under
# EP=2 with the distributed optimizer, on a model whose buffers (parameters, gradients,
# moments: ~50 MB per rank) dominate the process, each rank's peak RSS with the save is
# at most 1.15x its peak before it (training's steady state), and its peak after loading
# the checkpoint is at most 1.15x that steady state. The figures are the "memory:" lines
# moetron prints per rank around a save and after a load. Memory, not timing: the margin
# (a gathered model and moments would add over 1.5x) does not depend on the machine.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require save_memory
LIMIT=1.15
FLAGS=(--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 2 --num-experts 8 --moe-ffn-hidden-size 512 --moe-router-topk 2 --eval-interval 0
       --log-interval 1 --mock-data-tokens 8192 --lr-warmup-iters 1 --lr-decay-iters 10
       --expert-model-parallel-size 2 --use-distributed-optimizer --save "$work/ck")

# rank_figures LOG LABEL: the per-rank MB figures that follow LABEL on the log's memory line
rank_figures() { grep '^memory:' "$1" | sed -n "s/.*$2 \([0-9. ]*\) MB.*/\1/p" | head -1; }

# within NAME STEADY PEAK: each rank's PEAK <= LIMIT x its STEADY
within() {
    local why
    why=$(python3 - "$2" "$3" "$LIMIT" <<'PY'
import sys
steady, peak, limit = [list(map(float, a.split())) for a in sys.argv[1:3]] + [float(sys.argv[3])]
if len(steady) != 2 or len(peak) != 2: print(f"expected two ranks' figures, got '{sys.argv[1]}' and '{sys.argv[2]}'")
for r, (s, p) in enumerate(zip(steady, peak)):
    if p > limit * s: print(f"rank {r}: {p} MB against {s} MB of training ({p / s:.2f}x > {limit}x)"); break
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${FLAGS[@]}" --train-iters 3 >"$work/save.log" 2>&1 ||
    { fail save_memory "mpirun: $(tail -2 "$work/save.log" | tr '\n' ' ')"; exit 0; }
steady=$(rank_figures "$work/save.log" "before saving:")
within save_peak_within_training "$steady" "$(rank_figures "$work/save.log" "with the save:")"

# --train-iters 3 again: the run loads iteration 3 and has no step left to take
timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${FLAGS[@]}" --train-iters 3 --load "$work/ck" >"$work/load.log" 2>&1 ||
    { fail resume_memory "mpirun: $(tail -2 "$work/load.log" | tr '\n' ' ')"; exit 0; }
within resume_peak_within_training "$steady" "$(rank_figures "$work/load.log" "after loading:")"
