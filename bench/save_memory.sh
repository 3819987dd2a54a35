#!/usr/bin/env bash
# bench/save_memory.sh [MOETRON [BASELINE_MOETRON]] — peak RSS of each rank at a checkpoint
# save and at a resume against training's steady state, under EP=2 with the distributed
# optimizer, on a model whose buffers dominate the process (27.7M parameters: 8 experts of
# hidden 512 / ffn 1024 in 2 layers; ~13.8M per rank). Each figure is a whole process's
# peak (/usr/bin/time's maximum resident set, per rank):
#   steady  3 training steps, no save
#   save    the same 3 steps, then a save
#   resume  --load that checkpoint with no step left to take (the load alone)
# and the ratios save/steady, resume/steady. With a second binary (e.g. an older build)
# its figures are printed too, for comparison.
set -eu
M=${1:-build/moetron}
BASE=${2:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 MOETRON_DEVICE=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FLAGS=(--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 16 --micro-batch-size 1
       --global-batch-size 2 --num-experts 8 --moe-ffn-hidden-size 1024 --moe-router-topk 2 --eval-interval 0
       --log-interval 1 --mock-data-tokens 8192 --lr-warmup-iters 1 --lr-decay-iters 10 --train-iters 3
       --expert-model-parallel-size 2 --use-distributed-optimizer)

# peaks BINARY TAG FLAGS...: runs 2 ranks, prints "KB_rank0 KB_rank1"
peaks() {
    local bin=$1 tag=$2
    shift 2
    mpirun --oversubscribe --bind-to none -np 2 sh -c \
        'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/$tag" "$bin" train "${FLAGS[@]}" "$@" \
        >"$work/$tag.log" 2>&1 || { echo "$tag failed:"; tail -3 "$work/$tag.log"; exit 1; }
    echo "$(cat "$work/$tag.0") $(cat "$work/$tag.1")"
}

measure() {  # BINARY LABEL
    local steady save resume
    rm -rf "$work/ck"
    steady=$(peaks "$1" steady)
    save=$(peaks "$1" save --save "$work/ck")
    resume=$(peaks "$1" resume --save "$work/ck" --load "$work/ck")
    python3 - "$2" "$steady" "$save" "$resume" <<'PY'
import sys
label, steady, save, resume = sys.argv[1], *[list(map(int, a.split())) for a in sys.argv[2:]]
for r in range(2):
    s = steady[r] / 1024
    print(f"{label} rank {r}: steady {s:.1f} MB, save {save[r] / 1024:.1f} MB ({save[r] / steady[r]:.2f}x), "
          f"resume {resume[r] / 1024:.1f} MB ({resume[r] / steady[r]:.2f}x)")
PY
}

grep -m1 'model name' /proc/cpuinfo
measure "$M" "$M"
[ -z "$BASE" ] || measure "$BASE" "baseline"
