#!/usr/bin/env bash
# test_precision_optimizer.sh — --use-precision-aware-optimizer with narrow AdamW moments
# (--exp-avg-dtype / --exp-avg-sq-dtype bf16, fp16, fp8). fp32 moments through it are the
# plain optimizer bit for bit; narrow moments shrink the optimizer's memory line and train;
# a run saved and resumed takes exactly the steps of the run straight through (losses,
# gradient norms, saved weights and optimizer state), on one process and with the
# distributed optimizer's shards on two ranks; a checkpoint resumes with other dtypes and
# on another layout; --optimizer-cpu-offload (all of the state, half, on two ranks) gives
# the results of the run without it; the flags' bad values and combinations are refused.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
      --lr-warmup-iters 1 --lr-decay-iters 6 --mock-data-tokens 16384 --log-interval 1 --use-distributed-optimizer)
PRECISE=(--use-precision-aware-optimizer)

weights() { (cd "$1" && find . -name '*.safetensors' | sort | xargs md5sum); }
# optimizer_mib DIR: the MiB of AdamW moments the memory line of the run in DIR reports
optimizer_mib() { sed -n 's/.*AdamW moments \([0-9.]*\).*/\1/p' "$1/out" | head -1; }

# run DIR FLAGS...: train under the caller's `launch` command, logging DIR/log.jsonl, saving DIR/ck
run() {
    local d=$1
    shift
    mkdir -p "$d"
    "${launch[@]}" "$M" train "${TINY[@]}" "$@" --log-jsonl "$d/log.jsonl" --save "$d/ck" >"$d/out" 2>&1
}

launch=()
# fp32 moments through the precision-aware path: the plain optimizer's results
run "$work/plain" --train-iters 4 && run "$work/fp32" --train-iters 4 "${PRECISE[@]}" --exp-avg-dtype fp32 || true
if [ -n "$(step_numbers "$work/plain/log.jsonl")" ] &&
    [ "$(step_numbers "$work/plain/log.jsonl")" = "$(step_numbers "$work/fp32/log.jsonl")" ] &&
    [ "$(weights "$work/plain/ck")" = "$(weights "$work/fp32/ck")" ]; then
    ok precision_fp32_is_plain
else
    fail precision_fp32_is_plain "steps or saved files differ: $(grep -h -m1 error "$work"/plain/out "$work"/fp32/out)"
fi

# resume_exact NAME RANKS DTYPE_FLAGS...: 6 steps straight, and 3 + a resume for 3 more
resume_exact() {
    local name=$1 np=$2
    shift 2
    local launch=()
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np")
    local d="$work/$name"
    run "$d/straight" --train-iters 6 "${PRECISE[@]}" "$@" &&
        run "$d/first" --train-iters 3 "${PRECISE[@]}" "$@" &&
        run "$d/second" --train-iters 6 "${PRECISE[@]}" "$@" --load "$d/first/ck" || {
        fail "precision_resume_$name" "a run failed: $(grep -h -m1 error "$d"/*/out)"
        return
    }
    local straight resumed
    straight=$(step_numbers "$d/straight/log.jsonl" | tail -3)
    resumed=$(step_numbers "$d/second/log.jsonl")
    if awk '{ if ($2 != $2 + 0 || $2 == "nan") bad = 1 } END { exit bad }' <<<"$straight" && [ -n "$resumed" ] &&
        [ "$straight" = "$resumed" ] && [ "$(weights "$d/straight/ck")" = "$(weights "$d/second/ck")" ]; then
        ok "precision_resume_$name"
    else
        fail "precision_resume_$name" "resumed steps or saved files differ: '$straight' vs '$resumed'"
    fi
}

resume_exact fp16_fp16 1 --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16
resume_exact fp8_bf16 1 --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16
resume_exact bf16_fp8 1 --exp-avg-dtype bf16 --exp-avg-sq-dtype fp8
# two ranks: each shard of a tensor has its own scale
mpi_require precision_optimizer_mpi
resume_exact dp2_fp8_fp16 2 --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16
full precision_resume_ep2_fp16_bf16 resume_exact ep2_fp16_bf16 2 --exp-avg-dtype fp16 --exp-avg-sq-dtype bf16 \
    --expert-model-parallel-size 2

# the memory line: 2 + 1 bytes per element instead of 8
fp32_mib=$(optimizer_mib "$work/plain") narrow_mib=$(optimizer_mib "$work/fp8_bf16/straight")
if [ -n "$fp32_mib" ] && [ -n "$narrow_mib" ] &&
    python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(not (0.3 < b / a < 0.45))" "$fp32_mib" "$narrow_mib"; then
    ok precision_memory_line
else
    fail precision_memory_line "AdamW moments ${fp32_mib:-?} MiB with fp32, ${narrow_mib:-?} MiB with fp8 + bf16"
fi

# A checkpoint resumes with other dtypes, and on another layout (the two ranks' fp8 / fp16
# shards on one process, where each scale then comes from the loaded values)
launch=()
across="$work/across"
run "$across/to_fp32" --train-iters 5 --load "$work/fp8_bf16/first/ck" &&
    run "$across/to_one_process" --train-iters 5 "${PRECISE[@]}" --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16 \
        --load "$work/dp2_fp8_fp16/first/ck" || true
for d in to_fp32 to_one_process; do
    steps=$(step_numbers "$across/$d/log.jsonl" | wc -l)
    if [ "$steps" -eq 2 ] && grep -q "loaded" "$across/$d/out"; then
        ok "precision_resume_$d"
    else
        fail "precision_resume_$d" "$steps steps: $(grep -h -m1 error "$across/$d/out")"
    fi
done

# --optimizer-cpu-offload: the offloaded state steps on the host with the same arithmetic,
# so the results are those of the run without it, bit for bit (and its checkpoint the same)
# same_run NAME DIR_A DIR_B: equal steps and saved files
same_run() {
    if [ -n "$(step_numbers "$2/log.jsonl")" ] && [ "$(step_numbers "$2/log.jsonl")" = "$(step_numbers "$3/log.jsonl")" ] &&
        [ "$(weights "$2/ck")" = "$(weights "$3/ck")" ]; then
        ok "$1"
    else
        fail "$1" "steps or saved files differ: $(grep -h -m1 error "$2/out" "$3/out")"
    fi
}
launch=()
run "$work/offload_all" --train-iters 4 "${PRECISE[@]}" --optimizer-cpu-offload || true
same_run precision_offload_all_is_plain "$work/plain" "$work/offload_all"
run "$work/offload_half" --train-iters 6 "${PRECISE[@]}" --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16 \
    --optimizer-cpu-offload --optimizer-offload-fraction 0.5 || true
same_run precision_offload_half_fp8_bf16 "$work/fp8_bf16/straight" "$work/offload_half"
if grep -q "optimizer: the state of .* in host memory" "$work/offload_half/out" && grep -q "optimizer: the state of" "$work/offload_all/out"; then
    ok precision_offload_reported
else
    fail precision_offload_reported "no 'optimizer: the state of ... in host memory' line"
fi
# two ranks (each offloads part of its shards); under the sanitizers the one-process cases stand for it
offload_dp2() {
    local launch=("${MPIRUN[@]}" -np 2)
    run "$work/offload_dp2" --train-iters 6 "${PRECISE[@]}" --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16 \
        --optimizer-cpu-offload --optimizer-offload-fraction 0.3 || true
    same_run precision_offload_dp2 "$work/dp2_fp8_fp16/straight" "$work/offload_dp2"
}
full precision_offload_dp2 offload_dp2

expect_error precision_offload_needs_flag "optimizer-cpu-offload needs --use-precision-aware-optimizer" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --optimizer-cpu-offload
expect_error precision_offload_fraction "between 0 and 1" -- \
    "$M" train "${TINY[@]}" --train-iters 1 "${PRECISE[@]}" --optimizer-cpu-offload --optimizer-offload-fraction 1.5
expect_error precision_needs_flag "needs --use-precision-aware-optimizer" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --exp-avg-dtype fp8
expect_error precision_needs_distributed "needs --use-distributed-optimizer" -- \
    "$M" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --train-iters 1 "${PRECISE[@]}"
expect_error precision_bad_dtype "use fp32, bf16, fp16 or fp8" -- \
    "$M" train "${TINY[@]}" --train-iters 1 "${PRECISE[@]}" --exp-avg-sq-dtype int8
expect_error precision_main_grads "main-grads-dtype bf16" -- \
    "$M" train "${TINY[@]}" --train-iters 1 "${PRECISE[@]}" --main-grads-dtype bf16
expect_error precision_main_params "main-params-dtype fp16" -- \
    "$M" train "${TINY[@]}" --train-iters 1 "${PRECISE[@]}" --main-params-dtype fp16
