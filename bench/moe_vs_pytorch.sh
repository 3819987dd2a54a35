#!/usr/bin/env bash
# bench/moe_vs_pytorch.sh [moetron] [steps] — the benchmark models of bench/configs
# (coarse, fine) trained by moetron and by plain PyTorch (bench/pytorch_moe.py, the same
# model) on this machine, one after the other, with the same threads (OMP_NUM_THREADS,
# default: all cores). Prints one row per model: tokens/s (median over the steps after
# the first), model TFLOP/s, percent of the fp32 GEMM ceiling moetron measures at
# start-up, peak memory, PyTorch's tokens/s and peak memory, and moetron / PyTorch.
set -euo pipefail
M=${1:-build/moetron}
steps=${2:-6}
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags_of() { grep -v '^#' "$root/bench/configs/$1.flags" | tr '\n' ' '; }

printf '%-7s %-5s %10s %8s %9s %9s %12s %12s %7s\n' model prec "tok/s" TFLOP/s "% ceiling" "mem MiB" \
    "torch tok/s" "torch MiB" ratio
for model in coarse fine; do
    # shellcheck disable=SC2046
    "$M" train $(flags_of $model) --train-iters "$steps" --lr-warmup-iters 1 --eval-interval 0 --log-interval 1 \
        --log-jsonl "$out/$model.jsonl" >"$out/$model.log" 2>&1 || { tail -3 "$out/$model.log"; exit 1; }
    python3 "$root/bench/pytorch_moe.py" --config $model --threads "$threads" --steps $((steps - 1)) \
        --warmup-steps 1 >"$out/$model.torch" 2>"$out/$model.torch.err" || { tail -3 "$out/$model.torch.err"; exit 1; }
    python3 - "$out/$model.jsonl" "$out/$model.torch" "$model" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l][1:]
torch = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
med = lambda k: statistics.median(r[k] for r in rows)
tok = med("tokens_per_s")
print(f"{sys.argv[3]:<7} {'fp32':<5} {tok:10.0f} {med('tflops'):8.3f} {100 * med('mfu'):8.1f}% "
      f"{rows[-1]['mem_peak_mb']:9.0f} {torch['tokens_per_s']:12.0f} {torch['peak_rss_mb']:12.0f} "
      f"{tok / torch['tokens_per_s']:6.2f}x")
PY
done
echo "($threads threads; moetron $("$M" --version | sed 's/^moetron //'); $(python3 -c 'import torch; print("torch", torch.__version__)'))"
