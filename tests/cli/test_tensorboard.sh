#!/usr/bin/env bash
# test_tensorboard.sh — the refusals of the TensorBoard and logging flags, each one line
# before training: a --tensorboard-dir that is a regular file (or lies under one), a zero
# --tensorboard-log-interval or --tensorboard-queue-size, --log-num-zeros-in-grad (not
# supported). Megatron's flags that only change what is logged are accepted
# (--tensorboard-queue-size, --no-log-loss-scale-to-tensorboard, --wandb-*: a note that nothing
# goes to Weights & Biases). What the event files hold is checked by
# tests/conformance/tensorboard_events.py, with tensorboard's own reader.
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 32 --lr-warmup-iters 1
      --mock-data-tokens 65536 --train-iters 2 --peak-tflops 1)

touch "$work/a_file"
# refused by every process at start-up, before --save is created
expect_error tensorboard_dir_is_a_file "--tensorboard-dir $work/a_file exists and is not a directory" -- \
    "$M" train "${TINY[@]}" --tensorboard-dir "$work/a_file" --save "$work/not_saved"
if [ -e "$work/not_saved" ]; then fail tensorboard_dir_refused_first "--save was created"; else ok tensorboard_dir_refused_first; fi
expect_error tensorboard_dir_under_a_file "--tensorboard-dir $work/a_file/tb: cannot use it: Not a directory" -- \
    "$M" train "${TINY[@]}" --tensorboard-dir "$work/a_file/tb"
expect_error tensorboard_log_interval_positive "tensorboard-log-interval must be positive" -- \
    "$M" train "${TINY[@]}" --tensorboard-log-interval 0
expect_error tensorboard_queue_size_positive "tensorboard-queue-size must be positive" -- \
    "$M" train "${TINY[@]}" --tensorboard-queue-size 0
expect_error log_num_zeros_in_grad_refused "--log-num-zeros-in-grad is not supported" -- \
    "$M" train "${TINY[@]}" --log-num-zeros-in-grad

# Megatron's logging flags are accepted; a nested directory is created; wandb gets a note
"$M" train "${TINY[@]}" --tensorboard-dir "$work/runs/a/b" --tensorboard-queue-size 10 --log-throughput \
    --no-log-loss-scale-to-tensorboard --wandb-project p --wandb-exp-name e --wandb-save-dir "$work/w" \
    --wandb-entity x >"$work/accept.log" 2>&1
files=$(ls "$work/runs/a/b" 2>/dev/null | grep -c '^events\.out\.tfevents\.')
if [ "$files" = 1 ] && [ ! -e "$work/w" ]; then ok megatron_logging_flags_accepted
else fail megatron_logging_flags_accepted "$files event files; $(tail -1 "$work/accept.log")"; fi
notes=$(grep -c 'moetron does not log to Weights & Biases' "$work/accept.log")
if [ "$notes" = 1 ]; then ok wandb_one_note; else fail wandb_one_note "$notes notes"; fi

# --log-params-norm counts each parameter once under every layout: tensor-parallel pieces
# (with the vocabulary padded to the same rows), expert-parallel experts with the
# distributed optimizer's shards, pipeline stages give the one-process norm (1e-9 relative)
source "$(dirname "$0")/mpi_lib.sh"
mpi_require params_norm_layouts
NORM=("${TINY[@]}" --train-iters 3 --log-params-norm --untie-embeddings-and-output-weights)
params_norms() { python3 -c 'import json,sys; print(*[r["params_norm"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r])' "$1"; }
"$M" train "${NORM[@]}" --make-vocab-size-divisible-by 512 --log-jsonl "$work/norm1.jsonl" >"$work/norm1.log" 2>&1
for layout in "tp2:--tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256" \
              "ep2:--expert-model-parallel-size 2 --use-distributed-optimizer --make-vocab-size-divisible-by 512" \
              "pp2:--pipeline-model-parallel-size 2 --make-vocab-size-divisible-by 512"; do
    name=params_norm_${layout%%:*}
    # shellcheck disable=SC2086
    timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${NORM[@]}" ${layout#*:} --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1
    why=$(python3 - <(params_norms "$work/norm1.jsonl") <(params_norms "$work/$name.jsonl" 2>/dev/null) <<'PY'
import sys
a, b = (list(map(float, open(p).read().split())) for p in sys.argv[1:])
if len(a) != 3 or len(a) != len(b) or any(abs(x - y) > 1e-9 * x for x, y in zip(a, b)): print(a, b)
PY
)
    if [ -z "$why" ]; then ok "$name"; else fail "$name" "$why $(tail -1 "$work/$name.log")"; fi
done
