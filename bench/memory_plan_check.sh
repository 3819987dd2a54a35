#!/usr/bin/env bash
# bench/memory_plan_check.sh [MOETRON] [CASE ...] — `moetron plan` against the real thing:
# for each case (default: all of CASES below), the planned total per rank, and the peak
# resident memory each rank of a 2-step run with the same flags reaches while training
# (the trainer's "peak RSS per rank before saving" line: everything the process holds, the
# program and its libraries included). Prints one line per rank:
#   case rank planned_MiB measured_MiB measured/planned
# and exits 1 when a run fails. tests/cli/test_memory_plan.sh keeps a few cases in make
# test; bench/RESULTS.md records all of them.
set -u
M=${1:-build/moetron}
shift || true
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MOETRON_DEVICE=cpu OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

# A model of about 500 MiB a process, so that the program's own few MiB are not what is measured.
BASE=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 256 --micro-batch-size 2
      --global-batch-size 8 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --ffn-hidden-size 1024
      --mock-data-tokens 65536 --lr-warmup-iters 1 --eval-interval 0)
# The expert exchange is planned for its worst case (the most rows a rank can be sent) and a
# CPU only keeps the pages a run touches: the expert-parallel cases route every token to
# every expert (top-k = E), which sends every rank exactly that worst case at once, so that
# what is measured is what is planned.
WORST="--moe-router-topk 8"
MLA_FLAGS="--multi-latent-attention --kv-lora-rank 128 --q-lora-rank 128 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64"
# name | ranks | flags
CASES=(
    "dense|1|--num-experts 0"
    "mixtral|1|--moe-aux-loss-coeff 0.01"
    "deepseek_mla_shared|1|$MLA_FLAGS --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-shared-expert-intermediate-size 512"
    "ep2_alltoall|2|--expert-model-parallel-size 2 $WORST"
    "ep2_allgather|2|--expert-model-parallel-size 2 --moe-token-dispatcher-type allgather $WORST"
    "tp2_sp|2|--tensor-model-parallel-size 2 --sequence-parallel"
    "dp2_distopt_fp8_bf16|2|--use-distributed-optimizer --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16"
    "pp2|2|--pipeline-model-parallel-size 2"
    "cp2|2|--context-parallel-size 2"
    "etp2_ep2|4|--expert-tensor-parallel-size 2 --expert-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel $WORST"
    "recompute_full|1|--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "recompute_selective_moe|1|--recompute-granularity selective --recompute-modules moe layernorm"
)

# planned_totals PLAN_OUTPUT: "rank total" per rank from the plan's table (rank lists like "0-1 4")
planned_totals() {
    python3 - "$1" <<'PY'
import sys
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 9 or not cells[0][:1].isdigit(): continue
    for part in cells[0].split():
        lo, _, hi = part.partition("-")
        for r in range(int(lo), int(hi or lo) + 1): print(r, cells[8])
PY
}

status=0
for c in "${CASES[@]}"; do
    IFS='|' read -r name ranks flags <<<"$c"
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    launch=()
    [ "$ranks" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$ranks")
    # shellcheck disable=SC2086
    "$M" plan "${BASE[@]}" $flags --world-size "$ranks" >"$work/$name.plan" 2>&1 || {
        echo "$name: plan failed: $(tail -1 "$work/$name.plan")"; status=1; continue; }
    # shellcheck disable=SC2086
    "${launch[@]}" "$M" train "${BASE[@]}" $flags --train-iters 2 --save "$work/$name.ck" >"$work/$name.out" 2>&1 || {
        echo "$name: training failed: $(grep -m1 error "$work/$name.out")"; status=1; continue; }
    measured=$(sed -n 's/^memory: peak RSS per rank before saving: \([0-9. ]*\) MB.*/\1/p' "$work/$name.out")
    planned_totals "$work/$name.plan" | while read -r rank total; do
        got=$(echo "$measured" | awk -v r="$rank" '{ print $(r + 1) }')
        awk -v n="$name" -v r="$rank" -v p="$total" -v m="$got" 'BEGIN { printf "%s %d %.1f %.1f %.3f\n", n, r, p, m, m / p }'
    done
    rm -rf "$work/$name.ck"
done
exit $status
