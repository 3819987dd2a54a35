#!/usr/bin/env bash
# bench/ep_overlap.sh [moetron [RUNS [STEPS [MICRO_BATCHES]]]] — how much of the
# expert-parallel token exchange the overlaps hide: the coarse bench model
# (bench/configs/coarse.flags) with a shared expert of 1024, EP=2 on 2 ranks x 1 thread,
# micro-batches of 2 sequences, MICRO_BATCHES of them per rank and step (default 8), run
#   blocking   every all-to-all waited for where it starts
#   shared     --moe-shared-expert-overlap
#   combined   --overlap-moe-expert-parallel-comm --delay-wgrad-compute
# for each of ROUTINGS (default "balanced routed"): balanced routing
# (--moe-router-force-load-balancing: the exchange itself), and as the model routes (load
# imbalance between the two ranks' experts shows up as waiting in the exchange too). Each layout runs RUNS times (default 2) for STEPS steps (default 8);
# per run the medians over steps 2.. of expert_comm_s (the exposed exchange), of
# expert_comm_hidden_s and of tokens/s, then the median over runs. "hidden" is
# 1 − exposed / exposed of the blocking run: the share of the blocking exchange time the
# overlap removed.
set -eu
M=${1:-build/moetron}
RUNS=${2:-2}
STEPS=${3:-8}
MICRO_BATCHES=${4:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOETRON_DEVICE=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r -a FLAGS <<<"$(grep -v '^#' "$root/bench/configs/coarse.flags" | tr '\n' ' ')"
FLAGS+=(--micro-batch-size 2 --global-batch-size $((2 * 2 * MICRO_BATCHES)) --train-iters "$STEPS" --lr-warmup-iters 1 --eval-interval 0
        --log-interval 1 --expert-model-parallel-size 2 --moe-shared-expert-intermediate-size 1024)
MPI2=(env OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to core -np 2)

# run TAG FLAGS...: RUNS runs, each leaving $work/TAG.N.jsonl
run() {
    local tag=$1
    shift
    for i in $(seq "$RUNS"); do
        "${MPI2[@]}" "$M" train "${FLAGS[@]}" "$@" --log-jsonl "$work/$tag.$i.jsonl" >"$work/$tag.log" 2>&1 ||
            { tail -3 "$work/$tag.log"; exit 1; }
    done
}

grep -m1 'model name' /proc/cpuinfo
echo "cpu flags: $(grep -o 'avx512_bf16\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for routing in ${ROUTINGS:-balanced routed}; do
    extra=()
    [ $routing = balanced ] && extra=(--moe-router-force-load-balancing)
    run "$routing.blocking" "${extra[@]}"
    run "$routing.shared" "${extra[@]}" --moe-shared-expert-overlap
    run "$routing.combined" "${extra[@]}" --overlap-moe-expert-parallel-comm --delay-wgrad-compute
done
python3 - "$work" "$RUNS" "${ROUTINGS:-balanced routed}" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
def medians(tag):
    per_run = []
    for i in range(1, runs + 1):
        steps = [r for r in map(json.loads, open(f"{work}/{tag}.{i}.jsonl")) if "loss" in r][1:]
        per_run.append([statistics.median(r[k] for r in steps)
                        for k in ("expert_comm_s", "expert_comm_hidden_s", "tokens_per_s", "load_imbalance")])
    return [statistics.median(v) for v in zip(*per_run)]
print("| routing | layout | exposed exchange s/step | in flight behind compute s/step | hidden | tokens/s | imbalance |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for routing in sys.argv[3].split():
    base = medians(f"{routing}.blocking")[0]
    for layout in ("blocking", "shared", "combined"):
        exposed, inflight, tps, imb = medians(f"{routing}.{layout}")
        hidden = 1 - exposed / base if base > 0 else 0
        print(f"| {routing} | {layout} | {exposed:.3f} | {inflight:.3f} | {100 * hidden:.0f}% | {tps:.0f} | {imb:.2f} |")
PY
