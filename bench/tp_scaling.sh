#!/usr/bin/env bash
# bench/tp_scaling.sh [moetron [RUNS [MICRO_BATCH]]] — tensor parallelism against threads on
# the same cores: the coarse bench model (bench/configs/coarse.flags) made dense (--num-experts
# 0, a SwiGLU of 2048 = top-2 x 1024), TP=2 on 2 ranks x 1 thread (with and without
# --sequence-parallel) against 1 rank x 2 threads. Each layout runs RUNS times (default 3),
# 5 steps each; per run the median tokens/s of steps 2-5, then the median over runs and the
# ratio to 1 rank x 2 threads. Also prints the logged tp_bytes of a step (docs/parallelism.md,
# "Bytes communicated by tensor parallelism"). MICRO_BATCH (default 2) replaces the
# config's 8 sequences of 512 to keep a step short on 2 cores.
set -eu
M=${1:-build/moetron}
RUNS=${2:-3}
MBS=${3:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOETRON_DEVICE=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r -a FLAGS <<<"$(grep -v '^#' "$root/bench/configs/coarse.flags" | tr '\n' ' ')"
FLAGS+=(--num-experts 0 --ffn-hidden-size 2048 --micro-batch-size "$MBS" --global-batch-size "$MBS"
        --train-iters 5 --lr-warmup-iters 1 --eval-interval 0 --log-interval 1)

# run TAG "LAUNCHER" LAYOUT-FLAGS...: RUNS runs, each leaving $work/TAG.N.jsonl
run() {
    local tag=$1 launcher
    read -r -a launcher <<<"$2"
    shift 2
    for i in $(seq "$RUNS"); do
        "${launcher[@]}" "$M" train "${FLAGS[@]}" "$@" --log-jsonl "$work/$tag.$i.jsonl" >"$work/$tag.log" 2>&1 ||
            { tail -3 "$work/$tag.log"; exit 1; }
    done
}

MPI2="env OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 2"
grep -m1 'model name' /proc/cpuinfo
echo "cpu flags: $(grep -o 'avx512_bf16\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run threads2 "env OMP_NUM_THREADS=2"
run tp2 "$MPI2" --tensor-model-parallel-size 2
run tp2_sp "$MPI2" --tensor-model-parallel-size 2 --sequence-parallel
python3 - "$work" "$RUNS" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
def layout(tag):
    per_run, tp_bytes = [], 0
    for i in range(1, runs + 1):
        rows = [json.loads(l) for l in open(f"{work}/{tag}.{i}.jsonl") if '"tokens_per_s"' in l]
        per_run.append(statistics.median(r["tokens_per_s"] for r in rows[1:]))
        tp_bytes = rows[-1]["tp_bytes"]
    return statistics.median(per_run), per_run, tp_bytes
base = layout("threads2")[0]
for tag, label in (("threads2", "1 rank x 2 threads"), ("tp2", "TP=2, 2 ranks x 1 thread"),
                   ("tp2_sp", "TP=2 + SP, 2 ranks x 1 thread")):
    med, per_run, tp_bytes = layout(tag)
    print(f"{label:<32} {med:7.0f} tok/s (runs: {', '.join(f'{x:.0f}' for x in per_run)})  "
          f"ratio {med / base:.2f}  tp_bytes/step {tp_bytes / 2**20:.2f} MiB")
PY
