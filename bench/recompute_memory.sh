#!/usr/bin/env bash
# bench/recompute_memory.sh [MOETRON] — what activation recomputation saves and costs on the
# coarse and fine bench models (bench/configs/*.flags): for no recomputation, for
# --recompute-granularity full with uniform groups of 1 and 2 layers and block 2, and for
# selective recomputation of each module alone (mlp and mla_up_proj: the bench models have no
# dense layer and no MLA) and of core_attn + moe + layernorm, the
# activation memory the trainer plans (its "memory:" line), the whole process's peak RSS
# (/usr/bin/time's maximum resident set) and the median throughput of steps 2..N (the
# JSONL log's tokens_per_s), one process, all cores.
set -eu
M=${1:-build/moetron}
STEPS=${STEPS:-4}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MOETRON_DEVICE=cpu

VARIANTS=(
    "none|"
    "uniform 1|--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    "uniform 2|--recompute-granularity full --recompute-method uniform --recompute-num-layers 2"
    "block 2|--recompute-granularity full --recompute-method block --recompute-num-layers 2"
    "core_attn|--recompute-granularity selective --recompute-modules core_attn"
    "moe_act|--recompute-granularity selective --recompute-modules moe_act"
    "layernorm|--recompute-granularity selective --recompute-modules layernorm"
    "shared_experts|--recompute-granularity selective --recompute-modules shared_experts"
    "moe|--recompute-granularity selective --recompute-modules moe"
    "core_attn moe layernorm|--recompute-granularity selective --recompute-modules core_attn moe layernorm"
)

grep -m1 'model name' /proc/cpuinfo
echo "| model | recompute | planned activations | peak RSS | tokens/s (median) |"
echo "|---|---|---|---|---|"
for model in coarse fine; do
    read -r -a FLAGS <<<"$(grep -v '^#' "$root/bench/configs/$model.flags" | tr '\n' ' ')"
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r label flags <<<"$v"
        log=$work/$model.jsonl
        rm -f "$log"
        # shellcheck disable=SC2086
        /usr/bin/time -f %M -o "$work/rss" "$M" train "${FLAGS[@]}" $flags --train-iters "$STEPS" --eval-interval 0 \
            --mock-data-tokens 65536 --peak-tflops 1 --log-interval 1 --log-jsonl "$log" >"$work/out" 2>&1 ||
            { echo "$model $label failed:"; tail -3 "$work/out"; exit 1; }
        acts=$(sed -n 's/.*activations \([0-9.]*\) for.*/\1/p' "$work/out" | head -1)
        python3 - "$model" "$label" "$acts" "$(cat "$work/rss")" "$log" <<'PY'
import json, statistics, sys
model, label, acts, rss_kb, log = sys.argv[1:]
steps = [json.loads(l) for l in open(log)]
rates = [d["tokens_per_s"] for d in steps if "tokens_per_s" in d and d.get("step", 0) >= 2]
print(f"| {model} | {label} | {float(acts):.0f} MiB | {int(rss_kb) / 1024:.0f} MiB | {statistics.median(rates):.0f} |")
PY
    done
done
