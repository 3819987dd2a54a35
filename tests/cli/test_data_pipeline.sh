#!/usr/bin/env bash
# test_data_pipeline.sh — text to a trained model through Megatron data: `moetron prepare`
# trains a BPE and writes .bin/.idx, `moetron train` reads them (blended, with the
# document resets and the EOD loss mask), resumes bit-identically, and `generate` speaks
# the tokenizer. Also: bad data flags are one clear line.
set -u
source "$(dirname "$0")/lib.sh"
MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-experts 4 --moe-ffn-hidden-size 64
       --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --eval-interval 5 --eval-iters 2
       --lr-warmup-iters 2 --log-interval 1 --vocab-size 320)

test_prepare_train_generate() {
    make_corpus "$work/corpus.txt" 5 400 5 40 || { fail pipeline "python3 failed"; return; }
    "$M" prepare --input "$work/corpus.txt" --vocab-size 320 --append-eod --output-prefix "$work/c" \
        >"$work/prep.log" 2>&1 || { fail pipeline_prepare "$(tail -2 "$work/prep.log")"; return; }
    ok pipeline_prepare
    # two datasets blended 0.3 / 0.7 (the same corpus twice is enough to exercise blending)
    cp "$work/c_text_document.bin" "$work/d.bin" && cp "$work/c_text_document.idx" "$work/d.idx"
    local DATA=(--data-path 0.3 "$work/c_text_document" 0.7 "$work/d" --tokenizer-model "$work/c_tokenizer.json"
                --eod-mask-loss --reset-position-ids --reset-attention-mask --data-cache-path "$work/cache")
    "$M" train "${MODEL[@]}" "${DATA[@]}" --train-iters 10 --log-jsonl "$work/straight.jsonl" \
        --save "$work/ck_straight" >"$work/straight.log" 2>&1 || { fail pipeline_train "$(tail -2 "$work/straight.log")"; return; }
    ok pipeline_train_megatron_blend
    "$M" train "${MODEL[@]}" "${DATA[@]}" --train-iters 10 --exit-interval 5 --log-jsonl "$work/resumed.jsonl" \
        --save "$work/ck_resumed" >"$work/first.log" 2>&1 || { fail pipeline_resume "first half: $(tail -2 "$work/first.log")"; return; }
    "$M" train --load "$work/ck_resumed" --exit-interval 0 >"$work/second.log" 2>&1 ||
        { fail pipeline_resume "second half: $(tail -2 "$work/second.log")"; return; }
    if [ "$(losses "$work/straight.jsonl")" = "$(losses "$work/resumed.jsonl")" ] && [ -n "$(losses "$work/straight.jsonl")" ]; then
        ok pipeline_resume_bit_identical
    else
        fail pipeline_resume "losses differ: $(diff <(losses "$work/straight.jsonl") <(losses "$work/resumed.jsonl") | head -4 | tr '\n' ' ')"
    fi
    grep -q '"data_wait_s"' "$work/straight.jsonl" && grep -q "^data: training waited" "$work/straight.log" &&
        ok pipeline_data_wait_reported || fail pipeline_data_wait "no data_wait_s / summary line"
    [ -f "$work/ck_straight/iter_0000010/tokenizer.json" ] && ok pipeline_tokenizer_in_checkpoint ||
        fail pipeline_tokenizer_in_checkpoint "no tokenizer.json in the checkpoint"
    "$M" generate --load "$work/ck_straight" --prompt "the cat sat" --max-new-tokens 8 --temperature 0 \
        >"$work/gen.out" 2>"$work/gen.err" || { fail pipeline_generate "$(cat "$work/gen.err")"; return; }
    grep -q "^the cat sat" "$work/gen.out" && ok pipeline_generate_with_tokenizer ||
        fail pipeline_generate "output does not start with the prompt: $(head -c 200 "$work/gen.out")"
}

test_bad_data_flags() {
    expect_error megatron_missing_prefix "no-such-prefix" -- "$M" train "${MODEL[@]}" --data-path 0.5 "$work/no-such-prefix" 0.5 "$work/c_text_document"
    expect_error reset_needs_eod "tokenizer-model" -- "$M" train "${MODEL[@]}" --data-path "$work/c_text_document" --reset-attention-mask
    expect_error token_outside_vocab "vocab" -- "$M" train "${MODEL[@]}" --vocab-size 257 --make-vocab-size-divisible-by 1 --data-path "$work/c_text_document"
}

test_prepare_train_generate
test_bad_data_flags
