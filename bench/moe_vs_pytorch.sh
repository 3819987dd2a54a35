#!/usr/bin/env bash
# bench/moe_vs_pytorch.sh [moetron] [steps] — the benchmark models of bench/configs
# (coarse, fine) trained by moetron and by plain PyTorch (bench/pytorch_moe.py, the same
# model) on this machine, one after the other, with the same threads (OMP_NUM_THREADS,
# default: all cores). Prints one row per model: tokens/s (median over the steps after
# the first), model TFLOP/s, percent of the GEMM ceiling (the best moetron measured at
# start-up in these runs, in the precision of the run), peak memory, PyTorch's tokens/s
# and peak memory, and moetron / PyTorch. PRECISION=bf16: moetron --bf16 against PyTorch
# under bf16 autocast (pytorch_moe.py --dtype bf16); default fp32. The last column is the
# percent of PyTorch's own GEMM ceiling (bench/pytorch_gemm_ceiling.py: torch.matmul, oneDNN,
# in the run's precision; the best of a measurement before and after the models).
# MOETRON_GEMM_BF16=portable with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 compares both without
# AMX on a CPU that has it (moetron as on a CPU with AVX-512 BF16 and no AMX: the faster of
# its AVX-512 BF16 kernel and the emulation; MOETRON_GEMM_BF16=avx512-bf16 that kernel alone).
set -euo pipefail
M=${1:-build/moetron}
steps=${2:-6}
precision=${PRECISION:-fp32}
case "$precision" in fp32) moetron_precision=() ;; bf16) moetron_precision=(--bf16) ;;
*) echo "PRECISION=$precision: use fp32 or bf16" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags_of() { grep -v '^#' "$root/bench/configs/$1.flags" | tr '\n' ' '; }

gemm_ceiling() {
    python3 "$root/bench/pytorch_gemm_ceiling.py" --dtype "$precision" --threads "$threads" >"$out/ceiling.$1" \
        2>"$out/ceiling.err" || { tail -3 "$out/ceiling.err"; exit 1; }
}
gemm_ceiling before
for model in coarse fine; do
    # shellcheck disable=SC2046
    "$M" train $(flags_of $model) "${moetron_precision[@]}" --train-iters "$steps" --lr-warmup-iters 1 --eval-interval 0 --log-interval 1 \
        --log-jsonl "$out/$model.jsonl" >"$out/$model.log" 2>&1 || { tail -3 "$out/$model.log"; exit 1; }
    python3 "$root/bench/pytorch_moe.py" --config $model --dtype "$precision" --threads "$threads" --steps $((steps - 1)) \
        --warmup-steps 1 >"$out/$model.torch" 2>"$out/$model.torch.err" || { tail -3 "$out/$model.torch.err"; exit 1; }
done
gemm_ceiling after
# The ceilings: the best GEMM rate moetron measured at start-up in these runs (in the run's
# precision, docs/metrics.md) and the best torch.matmul rate before and after the models.
python3 - "$out" "$precision" <<'PY'
import json, statistics, sys
out, precision = sys.argv[1:3]
runs = {}
for model in ("coarse", "fine"):
    rows = [json.loads(l) for l in open(f"{out}/{model}.jsonl") if '"tokens_per_s"' in l][1:]
    torch = json.loads(open(f"{out}/{model}.torch").read().strip().splitlines()[-1])
    med = lambda k: statistics.median(r[k] for r in rows)
    runs[model] = dict(tok=med("tokens_per_s"), tflops=med("tflops"), peak=max(r["tflops"] / r["mfu"] for r in rows),
                       mem=rows[-1]["mem_peak_mb"], torch_tok=torch["tokens_per_s"], torch_mem=torch["peak_rss_mb"])
ceiling = max(r["peak"] for r in runs.values())
torch_ceiling = max(json.loads(open(f"{out}/ceiling.{when}").read())["tflops"] for when in ("before", "after"))
print(f"{'model':<7} {'prec':<5} {'tok/s':>8} {'TFLOP/s':>8} {'% ceiling':>9} {'mem MiB':>8} {'torch tok/s':>12} "
      f"{'torch MiB':>10} {'ratio':>6} {'% torch ceiling':>15}")
for model, r in runs.items():
    print(f"{model:<7} {precision:<5} {r['tok']:8.0f} {r['tflops']:8.3f} {100 * r['tflops'] / ceiling:8.1f}% {r['mem']:8.0f} "
          f"{r['torch_tok']:12.0f} {r['torch_mem']:10.0f} {r['tok'] / r['torch_tok']:5.2f}x "
          f"{100 * r['tflops'] / torch_ceiling:14.1f}%")
print(f"{precision} GEMM ceiling {ceiling:.3f} TFLOP/s (moetron's probe), {torch_ceiling:.3f} (torch.matmul)", end="")
PY
echo "; $threads threads; moetron $("$M" --version | sed 's/^moetron //'); $(python3 -c 'import torch; print("torch", torch.__version__)')"
