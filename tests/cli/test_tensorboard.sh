#!/usr/bin/env bash
# test_tensorboard.sh — the refusals of the TensorBoard and logging flags, each one line
# before training: a --tensorboard-dir that is a regular file (or lies under one), a zero
# --tensorboard-log-interval or --tensorboard-queue-size. Megatron's flags that only change
# what is logged are accepted
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

# Megatron's logging flags are accepted; a nested directory is created; wandb gets a note
"$M" train "${TINY[@]}" --tensorboard-dir "$work/runs/a/b" --tensorboard-queue-size 10 --log-throughput \
    --no-log-loss-scale-to-tensorboard --wandb-project p --wandb-exp-name e --wandb-save-dir "$work/w" \
    --wandb-entity x >"$work/accept.log" 2>&1
files=$(ls "$work/runs/a/b" 2>/dev/null | grep -c '^events\.out\.tfevents\.')
if [ "$files" = 1 ] && [ ! -e "$work/w" ]; then ok megatron_logging_flags_accepted
else fail megatron_logging_flags_accepted "$files event files; $(tail -1 "$work/accept.log")"; fi
notes=$(grep -c 'moetron does not log to Weights & Biases' "$work/accept.log")
if [ "$notes" = 1 ]; then ok wandb_one_note; else fail wandb_one_note "$notes notes"; fi

# --log-num-zeros-in-grad: with untied embeddings the embedding rows of the tokens a step did
# not see have zero gradients, and nothing else does: whole rows of H = 64 zeros, at least
# 512 - 128 rows (a step sees 128 tokens), shown on the console as in the JSONL. The expert
# bias (never trained; a buffer in Megatron) is not counted: its 4 zeros a layer would break
# the whole rows.
NORM=("${TINY[@]}" --train-iters 3 --log-params-norm --log-num-zeros-in-grad --untie-embeddings-and-output-weights
      --moe-router-score-function sigmoid --moe-router-enable-expert-bias)
"$M" train "${NORM[@]}" --make-vocab-size-divisible-by 512 --log-jsonl "$work/norm1.jsonl" >"$work/norm1.log" 2>&1
why=$(python3 - "$work/norm1.jsonl" "$work/norm1.log" <<'PY'
import json, re, sys
zeros = [r["num_zeros"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
shown = [int(z) for z in re.findall(r"\| zeros (\d+) \|", open(sys.argv[2]).read())]
if len(zeros) != 3 or zeros != shown or any(z % 64 or not (512 - 128) * 64 <= z <= 512 * 64 for z in zeros):
    print("JSONL", zeros, "console", shown)
PY
)
if [ -z "$why" ]; then ok num_zeros_embedding_rows; else fail num_zeros_embedding_rows "$why $(tail -1 "$work/norm1.log")"; fi

# The params norm leaves the expert bias out (a buffer in Megatron, never trained): after one
# step, runs whose bias moved (update rate 1e-2) or not (0) have the same trained weights and
# log the same norm, bit for bit.
for rate in 0 1e-2; do
    "$M" train "${NORM[@]}" --train-iters 1 --moe-router-bias-update-rate $rate --make-vocab-size-divisible-by 512 \
        --log-jsonl "$work/bias_$rate.jsonl" >"$work/bias_$rate.log" 2>&1
done
norms=$(for rate in 0 1e-2; do python3 -c 'import json,sys; print([r["params_norm"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r])' "$work/bias_$rate.jsonl" 2>&1; done | sort -u)
if [ "$(echo "$norms" | wc -l)" = 1 ] && [ "$norms" != "[]" ]; then ok params_norm_without_expert_bias
else fail params_norm_without_expert_bias "$(echo "$norms" | tr '\n' ' ')"; fi

# --log-params-norm and --log-num-zeros-in-grad count each parameter once under every layout:
# tensor-parallel pieces (with the vocabulary padded to the same rows), expert-parallel experts
# with the distributed optimizer's shards, pipeline stages give the one-process norm (1e-9
# relative) and the one-process zero count (exactly)
source "$(dirname "$0")/mpi_lib.sh"
mpi_require params_norm_layouts
params_norms() { python3 -c 'import json,sys; print(json.dumps([(r["params_norm"], r["num_zeros"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]))' "$1"; }
for layout in "tp2:--tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256" \
              "ep2:--expert-model-parallel-size 2 --use-distributed-optimizer --make-vocab-size-divisible-by 512" \
              "pp2:--pipeline-model-parallel-size 2 --make-vocab-size-divisible-by 512"; do
    name=params_norm_${layout%%:*}
    # shellcheck disable=SC2086
    timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${NORM[@]}" ${layout#*:} --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1
    why=$(python3 - <(params_norms "$work/norm1.jsonl") <(params_norms "$work/$name.jsonl" 2>/dev/null) <<'PY'
import json, sys
a, b = (json.loads(open(p).read() or "[]") for p in sys.argv[1:])
if len(a) != 3 or len(a) != len(b) or any(abs(x[0] - y[0]) > 1e-9 * x[0] or x[1] != y[1] for x, y in zip(a, b)):
    print(a, b)
PY
)
    if [ -z "$why" ]; then ok "$name"; else fail "$name" "$why $(tail -1 "$work/$name.log")"; fi
done
