#!/usr/bin/env bash
# check_gpu.sh BUILD [RESULTS] — the cuda backend's checks on a GPU machine (make check-gpu):
#   1. every op against the cpu backend on random inputs (BUILD/test_backend_ops cuda);
#   2. 50 training steps on the GPU against the same 50 on the cpu, fp32 and --bf16, for a
#      Mixtral-style and a DeepSeek-V3-style model: loss curves within 1e-3 (fp32) and
#      3e-2 (bf16) relative at every step;
#   3. two GPU runs give the same bits: losses, gradient norms and saved weights;
#   4. throughput (tokens/s, model TFLOP/s, MFU against the card's measured bf16 GEMM rate)
#      of the bench models and one about 10x larger, as a markdown table (also to RESULTS,
#      default BUILD/gpu_results.md) for bench/RESULTS.md;
#   5. with two or more GPUs, the NCCL collectives (tests/gpu/check_nccl.sh).
# Exits 0 when every check passed, 1 when one failed, 2 when no GPU is visible.
set -uo pipefail
BUILD=${1:-build}
RESULTS=${2:-$BUILD/gpu_results.md}
M=$BUILD/moetron
cd "$(dirname "$0")/../.."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0
ok() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

if ! "$M" --version | grep -q 'cuda: yes'; then echo "check_gpu: $M was built without CUDA"; exit 2; fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L | grep -q GPU; then
    echo "check_gpu: no GPU is visible (nvidia-smi -L); these checks need one"; exit 2
fi
nvidia-smi -L

# ---- 1. ops -------------------------------------------------------------------------------
if "$BUILD/test_backend_ops" cuda > "$WORK/ops.log" 2>&1; then ok "ops: $(tail -1 "$WORK/ops.log")"
else grep FAIL "$WORK/ops.log" | head -20; fail ops "$(tail -1 "$WORK/ops.log")"; fi

# ---- 2. training on the GPU against the cpu -----------------------------------------------------
SMALL=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4
       --global-batch-size 8 --vocab-size 257 --moe-ffn-hidden-size 256 --train-iters 50 --lr 1e-3
       --lr-warmup-iters 5 --log-interval 1 --mock-data)
MIXTRAL=(--group-query-attention --num-query-groups 2 --num-experts 8 --moe-router-topk 2
         --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2)
DEEPSEEK=(--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 --qk-pos-emb-head-dim 16
          --v-head-dim 32 --num-experts 8 --moe-router-topk 2 --moe-router-score-function sigmoid
          --moe-router-enable-expert-bias --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-3
          --moe-shared-expert-intermediate-size 256 --moe-router-num-groups 4 --moe-router-group-topk 2)

train() {  # train NAME DEVICE [flags...]: BUILD's moetron writes WORK/NAME.jsonl
    local name=$1 device=$2; shift 2
    "$M" train --device "$device" "${SMALL[@]}" "$@" --log-jsonl "$WORK/$name.jsonl" > "$WORK/$name.log" 2>&1 ||
        { tail -3 "$WORK/$name.log"; return 1; }
}

# close NAME A B TOL: the same steps, losses within TOL relative
close() {
    local why
    why=$(python3 - "$WORK/$2.jsonl" "$WORK/$3.jsonl" "$4" <<'PY'
import json, sys
load = lambda p: [(r["step"], r["loss"]) for r in map(json.loads, open(p)) if "loss" in r]
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if len(a) != len(b) or len(a) < 50: print(f"{len(a)} vs {len(b)} steps"); sys.exit()
worst = max(abs(x[1] - y[1]) / max(abs(x[1]), 1e-12) for x, y in zip(a, b))
if worst > tol: print(f"largest relative loss difference {worst:.3g} > {tol}")
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

for model in MIXTRAL DEEPSEEK; do
    declare -n model_flags=$model
    train "$model.cpu" cpu "${model_flags[@]}" || { fail "$model cpu run" "see above"; continue; }
    if train "$model.gpu" cuda "${model_flags[@]}"; then close "$model: 50 steps fp32 GPU = cpu" "$model.cpu" "$model.gpu" 1e-3
    else fail "$model fp32 GPU run" "see above"; fi
    if train "$model.bf16" cuda --bf16 "${model_flags[@]}"; then close "$model: 50 steps bf16 GPU ~ cpu" "$model.cpu" "$model.bf16" 3e-2
    else fail "$model bf16 GPU run" "see above"; fi
done

# ---- 3. bit-identical reruns ---------------------------------------------------------------------
same_run() {  # same_run TAG [flags...]: two GPU runs, same losses, gradient norms and weights
    local tag=$1; shift
    for r in 1 2; do train "rerun$tag$r" cuda "${MIXTRAL[@]}" "$@" --save "$WORK/ckpt$tag$r" || return 1; done
    local curves
    curves=$(python3 -c 'import json,sys; [print(r["step"], repr(r["loss"]), repr(r["grad_norm"])) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$WORK/rerun${tag}1.jsonl" |
             diff - <(python3 -c 'import json,sys; [print(r["step"], repr(r["loss"]), repr(r["grad_norm"])) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$WORK/rerun${tag}2.jsonl") | head -2)
    [ -n "$curves" ] && { fail "GPU rerun$tag bit-identical" "curves differ: $curves"; return; }
    local a b
    a=$(ls "$WORK/ckpt${tag}1"/iter_*/model*.safetensors | head -1); b=${a/ckpt${tag}1/ckpt${tag}2}
    cmp -s "$a" "$b" && ok "GPU rerun$tag bit-identical (curves and $(basename "$a"))" || fail "GPU rerun$tag bit-identical" "$a and $b differ"
}
same_run fp32 || fail "GPU reruns" "a run failed"
same_run bf16 --bf16 || fail "GPU bf16 reruns" "a run failed"

# ---- 4. throughput ---------------------------------------------------------------------------------
LARGE_NOTE=$(grep '^#' bench/configs/large.flags | tr -d '#' | tr '\n' ' ')
{
    echo "| model | params | tokens/s | model TFLOP/s | MFU (vs measured bf16 GEMM) |"
    echo "|---|---|---|---|---|"
} > "$RESULTS"
for config in coarse fine large; do
    read -r -a bench_flags < <(grep -v '^#' "bench/configs/$config.flags" | tr '\n' ' ')
    if ! "$M" train --device cuda --bf16 "${bench_flags[@]}" --mock-data --train-iters 20 --lr-warmup-iters 2 \
            --log-interval 1 --log-jsonl "$WORK/tp_$config.jsonl" > "$WORK/tp_$config.log" 2>&1; then
        tail -3 "$WORK/tp_$config.log"; fail "throughput $config" "the run failed"; continue
    fi
    python3 - "$WORK/tp_$config.jsonl" "$config" "$WORK/tp_$config.log" >> "$RESULTS" <<'PY'
import json, re, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r][-10:]
med = lambda k: statistics.median(r[k] for r in rows)
params = re.search(r"([0-9.]+[MBK]) parameters", open(sys.argv[3]).read())
print(f"| {sys.argv[2]} | {params.group(1) if params else '?'} | {med('tokens_per_s'):.0f} | {med('tflops'):.1f} | {100 * med('mfu'):.1f}% |")
PY
    ok "throughput $config"
done
echo; echo "large = $LARGE_NOTE"; cat "$RESULTS"

# ---- 5. NCCL (skipped, and passing, with one GPU) ----------------------------------------------
if bash tests/gpu/check_nccl.sh "$BUILD"; then ok "NCCL checks (or skipped)"; else fail "NCCL checks" "see above"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
