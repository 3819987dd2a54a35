#!/usr/bin/env bash
# test_first_use.sh — what a first-time user meets: write errors are errors (JSONL and the
# console on a full disk), Megatron's defaults, prepare creating its output directory, the
# start-up banner's layout, per-layer expert load on the console, one JSONL record per
# step after a resume, forward reading `moetron data` dumps, family refusals listing every
# reason, config.json of a SwiGLU model, and generate's stop reason, --top-p and UTF-8.
set -u
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
SHAPE=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2
       --global-batch-size 2 --num-experts 4 --moe-ffn-hidden-size 32 --eval-interval 0
       --mock-data-tokens 16384 --log-interval 1 --peak-tflops 1)
TINY=("${SHAPE[@]}" --lr-warmup-iters 0)

# JSONL records that cannot be written stop the run with one error line naming the file.
test_jsonl_dev_full() {
    expect_error jsonl_write_error_stops "--log-jsonl /dev/full: cannot write the record of step 1: No space left" -- \
        "$M" train "${TINY[@]}" --train-iters 3 --log-jsonl /dev/full
}

# On a real full disk (a small tmpfs), the log keeps whole records of the steps before the
# one that did not fit: nothing is cut in the middle of a line.
test_jsonl_full_tmpfs() {
    local mnt="$work/small_fs"
    mkdir -p "$mnt"
    if ! mount -t tmpfs -o size=8k tmpfs "$mnt" 2>/dev/null; then
        echo "skip jsonl_full_disk_keeps_whole_records: cannot mount a tmpfs here (needs root)"
        return
    fi
    "$M" train "${TINY[@]}" --train-iters 40 --moe-per-layer-logging --log-jsonl "$mnt/m.jsonl" \
        >"$work/tmpfs.out" 2>"$work/tmpfs.err"
    local rc=$? step records last_byte
    step=$(sed -nE 's/.*cannot write the record of step ([0-9]+).*/\1/p' "$work/tmpfs.err")
    records=$(wc -l <"$mnt/m.jsonl")
    last_byte=$(tail -c 1 "$mnt/m.jsonl" | od -An -c | tr -d ' ')
    umount "$mnt"
    if [ $rc -eq 0 ] || [ -z "$step" ]; then fail jsonl_full_disk "exit $rc, stderr: $(head -c 300 "$work/tmpfs.err")"; return; fi
    if [ "$records" -ne $((step - 1)) ] || [ "$last_byte" != '\n' ]; then
        fail jsonl_full_disk "stopped at step $step but the log holds $records lines, last byte '$last_byte'"; return
    fi
    ok jsonl_full_disk_keeps_whole_records
}

# Console output lost on a full disk: the exit status says so.
test_stdout_full() {
    "$M" train "${TINY[@]}" --train-iters 2 >/dev/full 2>"$work/full.err"
    local rc=$?
    if [ $rc -ne 0 ] && grep -q "^moetron: error: writing standard output failed: No space left" "$work/full.err"; then
        ok stdout_full_disk_is_an_error
    else
        fail stdout_full_disk "exit $rc, stderr: $(head -c 300 "$work/full.err")"
    fi
}

# Runs shorter than 20 steps train with the defaults (Megatron's --lr-warmup-iters 0).
test_short_run_defaults() {
    if "$M" train "${SHAPE[@]}" --train-iters 3 >"$work/short.log" 2>&1; then
        ok short_run_with_default_warmup
    else
        fail short_run_with_default_warmup "$(tail -1 "$work/short.log")"
    fi
}

test_banner_layout() {
    "$M" train "${TINY[@]}" --train-iters 1 >"$work/banner.log" 2>&1 || { fail banner_layout "$(tail -1 "$work/banner.log")"; return; }
    if OMP_NUM_THREADS=1 "$M" train "${TINY[@]}" --train-iters 1 2>&1 |
        grep -q '^1 process x 1 thread; layout TP1 CP1 PP1 DP1 | EP1 ETP1 EDP1$'; then
        ok banner_states_processes_threads_layout
    else
        fail banner_layout "no layout line: $(head -4 "$work/banner.log" | tr '\n' ' ')"
    fi
}

test_per_layer_console() {
    "$M" train "${TINY[@]}" --train-iters 2 --moe-per-layer-logging >"$work/layers.log" 2>&1 ||
        { fail per_layer_console "$(tail -1 "$work/layers.log")"; return; }
    local n
    n=$(grep -cE '^  layer [01]: imbalance [0-9.]+ \| dropped [0-9.]+ \| max expert [0-3] \([0-9]+%\)$' "$work/layers.log")
    if [ "$n" -eq 4 ]; then ok per_layer_expert_load_on_console; else fail per_layer_console "$n summary lines: $(head -8 "$work/layers.log")"; fi
}

# A run killed after logging steps 1..6 resumes from iteration 4: the log holds each step once.
test_resume_jsonl_once() {
    local log="$work/resume.jsonl"
    "$M" train "${TINY[@]}" --train-iters 8 --eval-interval 2 --eval-iters 1 --save "$work/res_ckpt" \
        --save-interval 4 --exit-interval 6 --log-jsonl "$log" >"$work/res1.log" 2>&1 ||
        { fail resume_jsonl "first run: $(tail -1 "$work/res1.log")"; return; }
    # the checkpoint of step 6 is lost, as if the run had been killed before saving it
    rm -rf "$work/res_ckpt/iter_0000006"
    echo 4 >"$work/res_ckpt/latest_checkpointed_iteration.txt"
    printf '{"step":7,"loss":1.0' >>"$log"  # a record cut by the crash
    "$M" train --load "$work/res_ckpt" --exit-interval 0 --log-jsonl "$log" >"$work/res2.log" 2>&1 ||
        { fail resume_jsonl "resume: $(tail -1 "$work/res2.log")"; return; }
    local train_steps eval_steps
    train_steps=$(grep '"loss"' "$log" | sed -E 's/^\{"step":([0-9]+),.*/\1/' | tr '\n' ' ')
    eval_steps=$(grep '"eval_loss"' "$log" | sed -E 's/^\{"step":([0-9]+),.*/\1/' | tr '\n' ' ')
    if [ "$train_steps" = "1 2 3 4 5 6 7 8 " ] && [ "$eval_steps" = "2 4 6 8 " ] && [ "$(wc -l <"$log")" -eq 12 ]; then
        ok resume_jsonl_one_record_per_step
    else
        fail resume_jsonl "train steps '$train_steps', eval steps '$eval_steps'"
    fi
}

test_jsonl_dev_full
test_jsonl_full_tmpfs
test_stdout_full
test_short_run_defaults
test_banner_layout
test_per_layer_console
test_resume_jsonl_once
