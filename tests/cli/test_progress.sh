#!/usr/bin/env bash
# test_progress.sh — long operations report progress with an ETA, and a run ends with a
# one-screen summary (src/core/progress.h, src/train/run_summary.h). With
# MOETRON_PROGRESS=always (the lines then follow the work, not the clock): prepare's pass,
# building Megatron data's sample index, evaluation, saving and loading a checkpoint each
# print their quarter lines and a last line with the time taken; unset, a quick run prints
# none; a bad value is one error line. The summary names the steps, the losses, the held-out
# loss, the speed, the experts and the checkpoints.
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--vocab-size 300 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 32 --eval-interval 3 --eval-iters 4
      --log-interval 1 --train-iters 6)

# has_progress NAME FILE WHAT: FILE shows WHAT's progress: lines at 25, 50 and 75 % at most,
# then exactly one final "took" line at 100 %
has_progress() {
    local name=$1 file=$2 what=$3
    if grep -Eq "^$what +[0-9.]+ / [0-9.]+ .* 100% \| .* \| took [0-9]" "$file" &&
        ! grep -E "^$what " "$file" | grep -v "took" | grep -Eqv " (2[5-9]|[3-9][0-9])% .*ETA "; then
        ok "$name"
    else
        fail "$name" "no complete progress of '$what': $(grep -E "^$what" "$file" | head -3 | tr '\n' ' ')"
    fi
}

make_corpus "$work/corpus.txt" 3 400 20 60
MOETRON_PROGRESS=always "$M" prepare --input "$work/corpus.txt" --vocab-size 300 --append-eod \
    --output-prefix "$work/data" >"$work/prepare.log" 2>&1 || fail prepare_runs "$(tail -1 "$work/prepare.log")"
has_progress progress_prepare "$work/prepare.log" "tokenizing"

MOETRON_PROGRESS=always "$M" train "${TINY[@]}" --data-path "$work/data_text_document" --tokenizer-model "$work/data_tokenizer.json" --save "$work/ck" \
    --save-interval 3 >"$work/train.log" 2>&1 || fail train_runs "$(tail -2 "$work/train.log" | tr '\n' ' ')"
has_progress progress_sample_index "$work/train.log" "sample index"
has_progress progress_evaluation "$work/train.log" "evaluation"
has_progress progress_saving "$work/train.log" "saving"
MOETRON_PROGRESS=always "$M" train "${TINY[@]}" --data-path "$work/data_text_document" --tokenizer-model "$work/data_tokenizer.json" --load "$work/ck" \
    --train-iters 7 >"$work/resume.log" 2>&1 || fail resume_runs "$(tail -2 "$work/resume.log" | tr '\n' ' ')"
has_progress progress_loading "$work/resume.log" "loading"

# a quick run says nothing about progress
"$M" train "${TINY[@]}" --save "$work/quiet" --save-interval 3 >"$work/quiet.log" 2>&1
if grep -q "held-out loss" "$work/quiet.log" && ! grep -Eq "^(evaluation|saving|loading|sample index) " "$work/quiet.log"; then
    ok progress_quiet_when_quick
else
    fail progress_quiet_when_quick "$(grep -E '^(evaluation|saving|loading|sample index) ' "$work/quiet.log" | head -2 | tr '\n' ' ')"
fi

# the summary at the end of a run
summary_ok=1
for want in "^summary: 6 steps in " "loss [0-9.]+ at step 1 -> [0-9.]+ at step 6" "^  held-out: loss [0-9.]+ at the end, best [0-9.]+ at step [36]" \
    "^  speed: [0-9]+ tokens/s" "^  experts: worst load imbalance [0-9.]+" "^  checkpoints: 2 saved, the last .*/quiet/iter_0000006"; do
    grep -Eq "$want" "$work/quiet.log" || { summary_ok=0; fail run_summary "no line matching '$want'"; }
done
[ "$summary_ok" = 1 ] && ok run_summary

# a step TensorBoard logs but the console does not is not in the summary either
"$M" train "${TINY[@]}" --train-iters 4 --log-interval 4 --eval-interval 0 --tensorboard-dir "$work/tb" >"$work/tb.log" 2>&1
if grep -Eq "^summary: 4 steps in .* \| loss [0-9.]+ at step 4 -> [0-9.]+ at step 4" "$work/tb.log"; then
    ok run_summary_follows_the_console
else
    fail run_summary_follows_the_console "$(grep -A1 '^summary' "$work/tb.log" | tr '\n' ' ')"
fi

expect_error progress_bad_value "MOETRON_PROGRESS=sometimes: use always or never" -- \
    env MOETRON_PROGRESS=sometimes "$M" train "${TINY[@]}" --train-iters 1
