#!/usr/bin/env bash
# test_cli.sh — end-to-end tests of the moetron command line: bad input is rejected with
# one clear line, runs are bit-identical, resume is bit-identical, checkpoints have the
# documented layout, generate and --data-path work, docs/flags.md is current.
set -u
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
FAST=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 2
      --mock-data-tokens 65536 --log-interval 1)

test_bad_flags() {
    expect_error unknown_flag "unknown flag '--num-layer'" -- "$M" train --num-layer 2
    expect_error unknown_command "unknown command 'trian'" -- "$M" trian
    expect_error heads_not_dividing_hidden "does not divide --hidden-size" -- "$M" train --num-attention-heads 5
    expect_error topk_above_experts "exceeds --num-experts" -- "$M" train --num-experts 2 --moe-router-topk 3
    expect_error batch_not_multiple "not a multiple of --micro-batch-size" -- "$M" train --global-batch-size 6 --micro-batch-size 4
    expect_error bad_integer "expects an integer" -- "$M" train --num-layers two
    expect_error newline_in_value "expects an integer, got '2?moetron: error: x'" -- "$M" train --num-layers $'2\nmoetron: error: x'
    expect_error missing_value "needs a value" -- "$M" train --num-layers
    expect_error query_groups "does not divide --num-attention-heads" -- "$M" train --group-query-attention --num-query-groups 3
    expect_error moe_layer_freq_length "has 3 entries but --num-layers is 4" -- "$M" train --moe-layer-freq "[0,1,1]"
    expect_error bias_needs_sigmoid "needs --moe-router-score-function sigmoid" -- "$M" train --moe-router-enable-expert-bias
    expect_error groups_divide_experts "does not divide --num-experts" -- "$M" train --moe-router-num-groups 3 --moe-router-group-topk 1
    expect_error group_topk_divides_topk "does not divide --moe-router-topk" -- "$M" train --moe-router-num-groups 4 --moe-router-group-topk 3 --moe-router-topk 2
    expect_error coeff_list_shorter "fewer values than --moe-router-load-balancing-type" -- "$M" train --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01
    expect_error balance_type_unknown "use aux_loss, seq_aux_loss, global_aux_loss, none, sinkhorn or quantile_balancing" -- "$M" train --moe-router-load-balancing-type switch
    expect_error top1_softmax_needs_pre "needs --moe-router-pre-softmax" -- "$M" train --moe-router-topk 1
    expect_error pad_needs_capacity "needs --moe-expert-capacity-factor" -- "$M" train --moe-pad-expert-input-to-capacity
    expect_error score_function_unknown "use softmax, sigmoid or sqrtsoftplus" -- "$M" train --moe-router-score-function relu
    expect_error lr_style "lr-decay-style" -- "$M" train --lr-decay-style exponential
    expect_error flag_for_other_command "does not apply to 'moetron generate'" -- "$M" generate --num-layers 3
    expect_error missing_data_path "cannot open" -- "$M" train --data-path "$work/no-such-file.txt"
    : >"$work/empty.txt"
    expect_error empty_data_path "is empty" -- "$M" train --data-path "$work/empty.txt"
    expect_error missing_checkpoint "no latest_checkpointed_iteration.txt and no config.json" -- "$M" generate --load "$work/nothing" --prompt hi
}

train_small() {  # out_dir, extra flags...
    local dir=$1
    shift
    "$M" train "${FAST[@]}" --log-jsonl "$dir.jsonl" "$@" >"$dir.log" 2>&1
}

test_family_note() {
    # a configuration no Hugging Face family expresses trains, with a note at start-up
    train_small "$work/note" --train-iters 1 --lr-warmup-iters 0 --moe-layer-freq "[0,1]" ||
        { fail family_note "train failed: $(tail -1 "$work/note.log")"; return; }
    if grep -q "^note: checkpoints use moetron's own model_type.*mixtral cannot express dense layers" "$work/note.log"; then
        ok family_note_for_inexpressible_config
    else
        fail family_note "no start-up note: $(head -3 "$work/note.log" | tr '\n' ' ')"
    fi
}

test_router_modes_resume() {
    # every router feature at once: resume must stay bit-identical (expert bias in the
    # checkpoint, jitter seeded by sample position, global aux reset per step)
    local R=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01
             --moe-router-load-balancing-type seq_aux_loss global_aux_loss --moe-aux-loss-coeff 0.01 0.02
             --moe-z-loss-coeff 0.001 --moe-input-jitter-eps 0.01 --moe-expert-capacity-factor 1.25
             --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate --moe-router-topk-scaling-factor 2
             --moe-router-num-groups 2 --moe-router-group-topk 1 --moe-per-layer-logging)
    train_small "$work/rm_straight" --train-iters 8 "${R[@]}" || { fail router_modes "straight: $(tail -1 "$work/rm_straight.log")"; return; }
    train_small "$work/rm_part1" --train-iters 8 --save "$work/rm_ckpt" --exit-interval 4 "${R[@]}" || { fail router_modes "part 1"; return; }
    "$M" train --load "$work/rm_ckpt" --log-jsonl "$work/rm_part2.jsonl" >"$work/rm_part2.log" 2>&1 || { fail router_modes "resume: $(tail -1 "$work/rm_part2.log")"; return; }
    if ! diff <(losses "$work/rm_straight.jsonl") <(cat <(losses "$work/rm_part1.jsonl") <(losses "$work/rm_part2.jsonl")) >/dev/null; then
        fail router_modes "resume with every router feature is not bit-identical"; return
    fi
    for key in seq_aux_loss global_aux_loss '"moe/layer_0/load_imbalance"' '"moe/layer_1/dropped_frac"' \
               '"moe/layer_1/tokens_per_expert":\[' '"moe/layer_0/dropped_tokens"'; do
        grep -q "$key" "$work/rm_straight.jsonl" || { fail router_modes "JSONL lacks $key"; return; }
    done
    if ! grep -q '"dropped_frac":0\.[0-9]*[1-9]' "$work/rm_straight.jsonl"; then fail router_modes "no token was dropped"; return; fi
    ok router_modes_resume_bit_identical
}

test_determinism() {
    train_small "$work/run_a" --train-iters 6 || { fail determinism "run a failed: $(tail -1 "$work/run_a.log")"; return; }
    train_small "$work/run_b" --train-iters 6 || { fail determinism "run b failed"; return; }
    train_small "$work/run_c" --train-iters 6 --seed 99 || { fail determinism "run c failed"; return; }
    if [ "$(losses "$work/run_a.jsonl" | wc -l)" -ne 6 ]; then fail determinism "expected 6 logged steps"; return; fi
    if ! diff <(losses "$work/run_a.jsonl") <(losses "$work/run_b.jsonl") >/dev/null; then
        fail determinism "two runs with the same seed differ"; return
    fi
    if diff <(losses "$work/run_a.jsonl") <(losses "$work/run_c.jsonl") >/dev/null; then
        fail determinism "a different --seed gave identical losses"; return
    fi
    ok determinism_bit_identical_reruns
}

test_resume_bit_identical() {
    train_small "$work/straight" --train-iters 20 || { fail resume "straight run failed"; return; }
    train_small "$work/part1" --train-iters 20 --save "$work/ckpt" --exit-interval 10 ||
        { fail resume "first half failed: $(tail -1 "$work/part1.log")"; return; }
    if [ "$(cat "$work/ckpt/latest_checkpointed_iteration.txt")" != "10" ]; then fail resume "latest iteration is not 10"; return; fi
    # the resumed run takes every setting from the checkpoint
    "$M" train --load "$work/ckpt" --log-jsonl "$work/part2.jsonl" >"$work/part2.log" 2>&1 ||
        { fail resume "resume failed: $(tail -1 "$work/part2.log")"; return; }
    if ! diff <(losses "$work/straight.jsonl") <(cat <(losses "$work/part1.jsonl") <(losses "$work/part2.jsonl")) >"$work/resume.diff"; then
        fail resume "20 straight steps differ from 10 + resume 10: $(head -4 "$work/resume.diff" | tr '\n' ' ')"; return
    fi
    ok resume_bit_identical
}

test_checkpoint_layout() {
    train_small "$work/layout" --train-iters 3 --save "$work/layout_ckpt" --save-interval 2 || { fail checkpoint_layout "train failed"; return; }
    local d="$work/layout_ckpt"
    for f in iter_0000002/config.json iter_0000002/model.safetensors iter_0000003/optimizer.safetensors \
             iter_0000003/trainer_state.json latest_checkpointed_iteration.txt; do
        [ -f "$d/$f" ] || { fail checkpoint_layout "missing $f"; return; }
    done
    [ "$(cat "$d/latest_checkpointed_iteration.txt")" = "3" ] || { fail checkpoint_layout "latest is not 3"; return; }
    if ls "$d" | grep -q tmp; then fail checkpoint_layout "temporary files left: $(ls "$d")"; return; fi
    grep -q '"model_type": "mixtral"' "$d/iter_0000003/config.json" || { fail checkpoint_layout "config.json lacks model_type"; return; }
    ok checkpoint_layout
}

# The readers' own checks, on checkpoints without checksums.json (as Hugging Face
# directories and older checkpoints come); with it, damage is caught before any reader
# runs (test_reliability.sh).
test_bad_checkpoints() {
    train_small "$work/bad" --train-iters 1 --lr-warmup-iters 0 --save "$work/bad_ckpt" || { fail bad_checkpoints "train failed"; return; }
    local it="$work/bad_ckpt/iter_0000001"
    rm "$it/checksums.json"
    cp -r "$work/bad_ckpt" "$work/trunc"
    truncate -s -100 "$work/trunc/iter_0000001/model.safetensors"
    expect_error truncated_checkpoint "model.safetensors: .*truncated" -- "$M" generate --load "$work/trunc" --prompt hi
    cp -r "$work/bad_ckpt" "$work/noopt"
    rm "$work/noopt/iter_0000001/optimizer.safetensors"
    expect_error checkpoint_missing_optimizer "optimizer.safetensors is missing" -- "$M" train --load "$work/noopt" --train-iters 2
    cp -r "$work/bad_ckpt" "$work/badjson"
    echo '{"model_type": ' >"$work/badjson/iter_0000001/config.json"
    expect_error corrupted_config "config.json: " -- "$M" generate --load "$work/badjson" --prompt hi
    cp -r "$work/bad_ckpt" "$work/badlatest"
    echo 'seven' >"$work/badlatest/latest_checkpointed_iteration.txt"
    expect_error corrupted_latest "damaged" -- "$M" generate --load "$work/badlatest" --prompt hi
    expect_error resume_changed_shape "differs from the checkpoint" -- "$M" train --load "$work/bad_ckpt" --hidden-size 32
    cp -r "$work/bad_ckpt" "$work/flipped"
    # corrupt the header length field: 8 + N no longer fits the file
    printf '\xff\xff\xff\x7f' | dd of="$work/flipped/iter_0000001/model.safetensors" bs=1 seek=0 conv=notrunc 2>/dev/null
    expect_error corrupted_safetensors_header "model.safetensors: " -- "$M" generate --load "$work/flipped" --prompt hi
}

test_generate() {
    train_small "$work/gen" --train-iters 2 --save "$work/gen_ckpt" || { fail generate "train failed"; return; }
    local a b
    a=$("$M" generate --load "$work/gen_ckpt" --prompt "12+7=" --max-new-tokens 20 --seed 5 2>&1) || { fail generate "$a"; return; }
    b=$("$M" generate --load "$work/gen_ckpt" --prompt "12+7=" --max-new-tokens 20 --seed 5 2>&1)
    case "$a" in "12+7="*) ;; *) fail generate "output does not start with the prompt: $a"; return ;; esac
    [ "$a" = "$b" ] || { fail generate "same seed, different samples"; return; }
    ok generate_deterministic
}

test_data_path() {
    python3 -c 'print("the quick brown fox jumps over the lazy dog. " * 400)' >"$work/text.txt" 2>/dev/null ||
        for i in $(seq 400); do printf 'the quick brown fox jumps over the lazy dog. '; done >"$work/text.txt"
    train_small "$work/text" --train-iters 4 --data-path "$work/text.txt" --split 90,10,0 --eval-interval 4 --eval-iters 1 ||
        { fail data_path "$(tail -1 "$work/text.log")"; return; }
    grep -q 'held-out loss' "$work/text.log" || { fail data_path "no eval line"; return; }
    ok data_path_text_file
}

test_loss_falls() {
    train_small "$work/learn" --train-iters 60 --lr 3e-3 --lr-decay-style cosine --min-lr 3e-4 || { fail loss_falls "train failed"; return; }
    local first last
    first=$(losses "$work/learn.jsonl" | head -1 | cut -d' ' -f3)
    last=$(losses "$work/learn.jsonl" | tail -5 | awk '{s+=$3} END {print s/NR}')
    if awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < f - 2.0)}'; then ok loss_falls; else fail loss_falls "lm loss $first -> $last"; fi
}

# docs/megatron-flags.md: every Megatron-LM flag with moetron's status, from the committed
# list and `moetron flags`
test_megatron_flags_doc_current() {
    if diff <(python3 "$root/tools/megatron_flags_doc.py" "$M") "$root/docs/megatron-flags.md" >"$work/mflags.diff"; then
        ok megatron_flags_doc_current
    else
        fail megatron_flags_doc_current "docs/megatron-flags.md differs (python3 tools/megatron_flags_doc.py build/moetron > docs/megatron-flags.md): $(head -3 "$work/mflags.diff" | tr '\n' ' ')"
    fi
}

test_flags_doc_current() {
    if diff <("$M" flags) <(sed -n '/^| flag |/,/^$/p' "$root/docs/flags.md" | sed '/^$/d') >"$work/flags.diff"; then
        ok flags_doc_current
    else
        fail flags_doc_current "docs/flags.md differs from 'moetron flags' (regenerate it): $(head -3 "$work/flags.diff" | tr '\n' ' ')"
    fi
}

test_bad_flags
test_family_note
test_router_modes_resume
test_determinism
test_resume_bit_identical
test_checkpoint_layout
test_bad_checkpoints
test_generate
test_data_path
test_loss_falls
test_flags_doc_current
test_megatron_flags_doc_current
