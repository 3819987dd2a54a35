#!/usr/bin/env bash
# bench/train_throughput.sh [moetron] — training throughput of the default model (what
# `make run` trains) and of a larger Qwen3-MoE-style configuration on this machine.
# Prints the median over logged steps (the first steps are left out as warm-up) of
# tokens/s, model TFLOP/s and MFU against this machine's measured GEMM ceiling.
set -euo pipefail
M=${1:-build/moetron}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() {  # jsonl, label
    python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][3:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f"{sys.argv[2]:<10} {med('tokens_per_s'):8.0f} tok/s  {med('tflops'):.3f} TFLOP/s  MFU {med('mfu'):.2f}  "
      f"peak memory {rows[-1]['mem_peak_mb']:.0f} MiB")
PY
}

"$M" train --train-iters 40 --lr-warmup-iters 5 --eval-interval 0 --log-interval 1 \
    --log-jsonl "$out/default.jsonl" >/dev/null
median "$out/default.jsonl" default

"$M" train --num-layers 6 --hidden-size 256 --num-attention-heads 8 --group-query-attention \
    --num-query-groups 2 --qk-layernorm --num-experts 16 --moe-router-topk 2 --moe-ffn-hidden-size 512 \
    --seq-length 512 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 \
    --lr-warmup-iters 5 --eval-interval 0 --log-interval 1 --log-jsonl "$out/large.jsonl" >/dev/null
median "$out/large.jsonl" large
