#!/usr/bin/env bash
# bench/precision_curves.sh [MOETRON] [TEXT] — 200-step loss curves of a small MoE with the
# AdamW moments stored narrower (--use-precision-aware-optimizer --exp-avg-dtype /
# --exp-avg-sq-dtype), against fp32 moments on the same text and seed, with the spread
# between two fp32 runs of different seeds as the yardstick of noise. For each variant: the
# loss at steps 50, 100 and 200, the mean of the last 50 steps, and the largest gap to the
# fp32 curve (both smoothed over 20 steps) after step 20; plus the planned optimizer state.
# STEPS (default 200) steps, one process, all cores. CURVES=gemm instead compares the GEMM
# input precisions: --bf16 (the CPU's kernel, and the emulation) and --fp16 (dynamic loss
# scaling) against fp32, with the same yardstick. CURVES=recipes compares the FP8 / FP4
# recipes (delayed, tensorwise, blockwise, MXFP8, NVFP4; each with --bf16 for the GEMMs
# they leave unquantized, as Megatron runs them) against --bf16, with the spread between
# two bf16 runs of different seeds as the yardstick.
set -eu
M=${1:-build/moetron}
TEXT=${2:-$(cd "$(dirname "$0")/.." && pwd)/../shared/data/tinyshakespeare.txt}
STEPS=${STEPS:-200}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MOETRON_DEVICE=cpu

MODEL=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --num-experts 8 --moe-router-topk 2
       --moe-ffn-hidden-size 256 --seq-length 256 --micro-batch-size 4 --global-batch-size 4
       --moe-aux-loss-coeff 1e-2 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters $((STEPS / 10))
       --train-iters "$STEPS" --eval-interval 0 --log-interval 1 --data-path "$TEXT" --use-distributed-optimizer)
MOMENT_VARIANTS=(
    "fp32 (seed 1234)|--seed 1234"
    "fp32 (seed 1235: noise)|--seed 1235"
    "bf16 / bf16|--seed 1234 --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"
    "fp16 / fp16|--seed 1234 --use-precision-aware-optimizer --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16"
    "fp8 / fp16|--seed 1234 --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16"
    "fp8 / bf16|--seed 1234 --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16"
    "fp8 / fp8|--seed 1234 --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8"
)
# label|flags|environment
GEMM_VARIANTS=(
    "fp32 (seed 1234)|--seed 1234"
    "fp32 (seed 1235: noise)|--seed 1235"
    "--bf16 (the CPU's kernel)|--seed 1234 --bf16"
    "--bf16 (emulated)|--seed 1234 --bf16|MOETRON_GEMM_BF16=emulated"
    "--bf16 --fp32-residual-connection|--seed 1234 --bf16 --fp32-residual-connection"
    "--bf16, only GEMM inputs kept bf16|--seed 1234 --bf16|MOETRON_ACTIVATIONS=gemm-inputs"
    "--fp16 (dynamic loss scale)|--seed 1234 --fp16"
)
RECIPE_VARIANTS=(
    "--bf16 (seed 1234)|--seed 1234 --bf16"
    "--bf16 (seed 1235: noise)|--seed 1235 --bf16"
    "delayed (hybrid)|--seed 1234 --bf16 --fp8-format hybrid --fp8-recipe delayed"
    "tensorwise (e4m3)|--seed 1234 --bf16 --fp8-format e4m3 --fp8-recipe tensorwise"
    "blockwise (e4m3)|--seed 1234 --bf16 --fp8-format e4m3 --fp8-recipe blockwise"
    "mxfp8 (e4m3)|--seed 1234 --bf16 --fp8-format e4m3 --fp8-recipe mxfp8"
    "nvfp4|--seed 1234 --bf16 --fp4-format e2m1 --fp4-recipe nvfp4"
)
case "${CURVES:-moments}" in
moments) VARIANTS=("${MOMENT_VARIANTS[@]}") header="moments (exp_avg / exp_avg_sq)" reference=fp32 ;;
gemm) VARIANTS=("${GEMM_VARIANTS[@]}") header="GEMM inputs" reference=fp32 ;;
recipes) VARIANTS=("${RECIPE_VARIANTS[@]}") header="recipe" reference=bf16 ;;
*) echo "CURVES=$CURVES: use moments, gemm or recipes" >&2; exit 2 ;;
esac

grep -m1 'model name' /proc/cpuinfo
i=0
for v in "${VARIANTS[@]}"; do
    IFS='|' read -r label flags environment <<<"$v"
    # shellcheck disable=SC2086
    env $environment "$M" train "${MODEL[@]}" $flags --log-jsonl "$work/$i.jsonl" >"$work/$i.out" 2>&1 ||
        { echo "$label: the run failed: $(grep -m1 error "$work/$i.out")"; exit 1; }
    sed -n 's/.*AdamW moments \([0-9.]*\).*/\1/p' "$work/$i.out" | head -1 >"$work/$i.mib"
    echo "$label" >"$work/$i.label"
    i=$((i + 1))
done
python3 - "$work" "$i" "$header" "$reference" <<'PY'
import json, sys
work, n, header, reference = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def curve(i):  # the steps that trained (a step skipped for a loss-scale overflow has no update)
    return [r["lm_loss"] for r in map(json.loads, open(f"{work}/{i}.jsonl")) if "lm_loss" in r and not r.get("skipped")]
def smooth(c, w=20):
    return [sum(c[max(0, k - w + 1):k + 1]) / len(c[max(0, k - w + 1):k + 1]) for k in range(len(c))]
ref = smooth(curve(0))
print(f"| {header} | optimizer state | loss @50 | @100 | @200 | mean of last 50 | largest gap to {reference} (smoothed, after step 20) |")
print("|---|---|---|---|---|---|---|")
for i in range(n):
    c = curve(i)
    s = smooth(c)
    gap = max(abs(a - b) for a, b in zip(s[20:], ref[20:]))
    label = open(f"{work}/{i}.label").read().strip()
    mib = open(f"{work}/{i}.mib").read().strip()
    at = lambda k: f"{c[k - 1]:.4f}" if len(c) >= k else "-"
    print(f"| {label} | {mib} MiB | {at(50)} | {at(100)} | {at(200)} | {sum(c[-50:]) / len(c[-50:]):.4f} | {gap:.4f} |")
PY
