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

# prepare --output-prefix DIR/name creates DIR (and its parents).
test_prepare_creates_directory() {
    for i in $(seq 50); do printf 'the quick brown fox %d jumps over the lazy dog.\n\n' "$i"; done >"$work/p.txt"
    if "$M" prepare --input "$work/p.txt" --vocab-size 300 --output-prefix "$work/new/sub/c" >"$work/p.log" 2>&1 &&
        [ -f "$work/new/sub/c_text_document.bin" ] && [ -f "$work/new/sub/c_text_document.idx" ]; then
        ok prepare_creates_output_directory
    else
        fail prepare_creates_output_directory "$(tail -1 "$work/p.log")"
    fi
    expect_error prepare_output_under_a_file "cannot create the directory $work/p.txt/x" -- \
        "$M" prepare --input "$work/p.txt" --vocab-size 300 --output-prefix "$work/p.txt/x/c"
}

# A SwiGLU model's config.json says so (and that its linear layers have no biases).
test_config_swiglu() {
    "$M" train "${TINY[@]}" --train-iters 1 --save "$work/sw" >"$work/sw.log" 2>&1 || { fail config_swiglu "$(tail -1 "$work/sw.log")"; return; }
    if grep -q '"swiglu": true' "$work/sw/iter_0000001/config.json" &&
        grep -q '"disable-bias-linear": true' "$work/sw/iter_0000001/config.json"; then
        ok config_json_says_swiglu
    else
        fail config_swiglu "$(grep -o '"swiglu": [a-z]*' "$work/sw/iter_0000001/config.json")"
    fi
    expect_error no_swiglu_rejected "--no-swiglu: moetron's MLPs and experts are always SwiGLU" -- "$M" train "${TINY[@]}" --train-iters 1 --no-swiglu
}

# generate: the reason it stopped on stderr (stdout stays the text), --top-p, valid UTF-8.
test_generate_first_use() {
    "$M" train "${TINY[@]}" --train-iters 2 --save "$work/gen" >"$work/gen.log" 2>&1 || { fail generate "$(tail -1 "$work/gen.log")"; return; }
    local G=("$M" generate --load "$work/gen")
    "${G[@]}" --prompt "12+7=" --max-new-tokens 6 --temperature 0 >"$work/g.out" 2>"$work/g.err" || { fail generate "$(cat "$work/g.err")"; return; }
    if grep -qx "generate: stopped after 6 new tokens: --max-new-tokens reached" "$work/g.err" &&
        [ "$(wc -l <"$work/g.out")" -le 2 ] && ! grep -q stopped "$work/g.out"; then
        ok generate_says_max_new_tokens_stopped_it
    else
        fail generate_stop_length "stderr '$(cat "$work/g.err")', stdout '$(head -c 100 "$work/g.out")'"
    fi
    local seed found=0
    for seed in $(seq 200); do  # a near-uniform sampler reaches the end-of-document token in a few seeds
        "${G[@]}" --prompt "1" --max-new-tokens 30 --temperature 3 --seed "$seed" >"$work/e.out" 2>"$work/e.err" || break
        if grep -qE "^generate: stopped after ([0-9]|[12][0-9]) new tokens: end-of-document token$" "$work/e.err"; then
            found=1; break
        fi
    done
    if [ $found = 1 ]; then ok generate_says_end_of_document_stopped_it; else fail generate_stop_eod "$(cat "$work/e.err")"; fi
    # a nucleus this small keeps only the most likely token: the greedy text
    local greedy nucleus
    greedy=$("${G[@]}" --prompt "3+4=" --max-new-tokens 20 --temperature 0 2>/dev/null)
    nucleus=$("${G[@]}" --prompt "3+4=" --max-new-tokens 20 --temperature 1 --top-p 1e-6 --seed 7 2>"$work/p.err")
    if [ -n "$greedy" ] && [ "$greedy" = "$nucleus" ]; then ok generate_top_p_tiny_is_greedy; else fail generate_top_p "'$greedy' vs '$nucleus': $(cat "$work/p.err")"; fi
    expect_error top_p_range "--top-p 0: use a probability in (0, 1]" -- "${G[@]}" --prompt hi --top-p 0
    # raw bytes of a barely trained byte model, after a prompt ending mid-character
    local bad=0
    for seed in 1 2 3 4 5; do
        "${G[@]}" --prompt $'caf\xc3' --max-new-tokens 26 --temperature 2 --seed "$seed" >"$work/u.out" 2>/dev/null
        iconv -f UTF-8 -t UTF-8 "$work/u.out" >/dev/null 2>&1 || bad=$seed
    done
    if [ $bad = 0 ]; then ok generate_output_is_valid_utf8; else fail generate_utf8 "seed $bad printed invalid UTF-8"; fi
}

# forward --input takes a `moetron data --dump` file: the first training samples, whose loss
# is the first step's (with --lr 0 the saved weights are the initial ones).
test_forward_reads_data_dump() {
    for i in $(seq 50); do printf 'the quick brown fox %d jumps over the lazy dog.\n\n' "$i"; done >"$work/fw.txt"
    "$M" prepare --input "$work/fw.txt" --vocab-size 300 --output-prefix "$work/fw_c" >"$work/fw.log" 2>&1 || { fail forward_data_dump "prepare: $(tail -1 "$work/fw.log")"; return; }
    local D=(--data-path "$work/fw_c_text_document" --seq-length 32)
    "$M" train "${TINY[@]}" "${D[@]}" --vocab-size 300 --train-iters 1 --lr 0 --min-lr 0 --save "$work/fw_ckpt" \
        --log-jsonl "$work/fw.jsonl" >"$work/fw.log" 2>&1 || { fail forward_data_dump "train: $(tail -1 "$work/fw.log")"; return; }
    "$M" data "${D[@]}" --num-samples 2 --dump "$work/samples.safetensors" >"$work/fw.log" 2>&1 || { fail forward_data_dump "data: $(tail -1 "$work/fw.log")"; return; }
    local out want got
    out=$("$M" forward --load "$work/fw_ckpt" --input "$work/samples.safetensors" --dump "$work/fw_out.safetensors" 2>&1) ||
        { fail forward_data_dump "forward: $out"; return; }
    got=$(echo "$out" | sed -nE 's/.*\(B=2, T=32, loss ([0-9.]+)\)$/\1/p')
    want=$(sed -nE 's/.*"lm_loss":([0-9.]+),.*/\1/p' "$work/fw.jsonl")
    if [ -n "$got" ] && awk -v a="$got" -v b="$want" 'BEGIN {exit !(a - b < 1e-6 && b - a < 1e-6)}'; then
        ok forward_reads_data_dump
    else
        fail forward_data_dump "forward says '$out', the first step's lm_loss was $want"
    fi
}

# --hf-architecture refusing a model names every feature the family lacks, in one line.
test_family_refusal_lists_all() {
    expect_error family_refusal_lists_every_feature \
        "mixtral cannot express this model: shared experts; --qk-layernorm; --clip-qkv; choose another family" -- \
        "$M" train "${TINY[@]}" --train-iters 1 --hf-architecture mixtral --qk-layernorm --clip-qkv 5 \
        --moe-shared-expert-intermediate-size 32
}

# README's MPI example runs as printed (as root too: it says what to set), for two steps.
test_readme_mpi_example() {
    if "$M" --version | grep -q "mpi: none"; then
        echo "skip readme_mpi_example: no MPI build"; return
    fi
    local block
    block=$(sed -n '/^## Several processes/,/^## /p' "$root/README.md" | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d')
    [ -n "$block" ] || { fail readme_mpi_example "no sh block under '## Several processes' in README.md"; return; }
    local binary
    binary=$(cd "$(dirname "$M")" && pwd)/$(basename "$M")  # the block runs in $work
    block=${block//build\/moetron/$binary}
    block=${block//--save ckpt/--save $work/mpi_ckpt --train-iters 2 --eval-interval 0 --peak-tflops 1}
    # (LeakSanitizer off, as in every multi-process test: Open MPI's runtime leaks at exit)
    if (cd "$work" && env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
        "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" bash -c "$block") >"$work/mpi.log" 2>&1 &&
        [ -f "$work/mpi_ckpt/latest_checkpointed_iteration.txt" ]; then
        ok readme_mpi_example_runs_as_printed
    else
        fail readme_mpi_example "$(tail -3 "$work/mpi.log" | tr '\n' ' ')"
    fi
}

test_jsonl_dev_full
test_jsonl_full_tmpfs
test_stdout_full
test_short_run_defaults
test_banner_layout
test_per_layer_console
test_resume_jsonl_once
test_prepare_creates_directory
test_config_swiglu
test_generate_first_use
test_forward_reads_data_dump
test_family_refusal_lists_all
test_readme_mpi_example
