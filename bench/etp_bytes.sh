#!/usr/bin/env bash
# bench/etp_bytes.sh [moetron [MICRO_BATCH]] — bytes rank 0 sends to its expert-parallel and
# expert-tensor-parallel ranks per step (expert_bytes, docs/metrics.md) on the coarse bench
# model (bench/configs/coarse.flags, 8 experts top-2) laid out TP=2 + SP, ETP=2 x EP=2 on 4
# ranks, with each token dispatcher; and the allgather exchange's formula (docs/parallelism.md,
# "Bytes communicated by the allgather token exchange"). MICRO_BATCH (default 2) replaces the
# config's 8 sequences of 512 to keep a step short on 2 cores; 3 steps.
set -eu
M=${1:-build/moetron}
MBS=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOETRON_DEVICE=cpu OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r -a FLAGS <<<"$(grep -v '^#' "$root/bench/configs/coarse.flags" | tr '\n' ' ')"
# global batch = 2 data-parallel ranks x MICRO_BATCH: one micro-batch per rank
FLAGS+=(--micro-batch-size "$MBS" --global-batch-size $((2 * MBS)) --train-iters 3 --lr-warmup-iters 1
        --eval-interval 0 --log-interval 1 --tensor-model-parallel-size 2 --sequence-parallel
        --expert-tensor-parallel-size 2 --expert-model-parallel-size 2)
for dispatcher in alltoall allgather; do
    mpirun --oversubscribe --bind-to none -np 4 "$M" train "${FLAGS[@]}" --moe-token-dispatcher-type "$dispatcher" \
        --log-jsonl "$work/$dispatcher.jsonl" >"$work/$dispatcher.log" 2>&1 || { tail -3 "$work/$dispatcher.log"; exit 1; }
done
python3 - "$work" "$MBS" <<'PY'
import json, sys
work, mbs = sys.argv[1], int(sys.argv[2])
L, H, k, seq, P, ep, etp = 4, 512, 2, 512, 4, 2, 2
n_local = mbs * seq // 2  # tokens a rank holds with SP over TP=2
formula = L * 16 * (P - 1) * n_local * (H + k) + ((ep - 1) + (etp - 1)) * 8
for d in ("alltoall", "allgather"):
    got = [json.loads(l)["expert_bytes"] for l in open(f"{work}/{d}.jsonl") if '"expert_bytes"' in l]
    print(f"{d:9s} expert_bytes per step: " + ", ".join(f"{b / 2**20:.3f} MiB" for b in got))
print(f"allgather formula: {formula / 2**20:.3f} MiB ({formula} bytes)")
PY
