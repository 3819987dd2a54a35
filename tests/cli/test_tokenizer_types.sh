#!/usr/bin/env bash
# test_tokenizer_types.sh — --tokenizer-type wired through the commands (docs/data.md,
# "Tokenizers"): a SentencePiece model (the fuzz seed tests/fuzz/corpus/sentencepiece_model/
# bpe.model) for prepare, training on text, the checkpoint's tokenizer.model and generate
# after --load; NullTokenizer's ids; the refusals (an unknown type listing the supported
# ones, missing companion flags, a directory without the file, a malformed .model), each one
# line before any work. Ids against the reference libraries: tests/conformance/tokenizer_types.py.
set -u
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
TINY=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --num-experts 2 --moe-ffn-hidden-size 32
      --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --eval-interval 0 --lr-warmup-iters 0
      --log-interval 1 --peak-tflops 1)
cp "$root/tests/fuzz/corpus/sentencepiece_model/bpe.model" "$work/sp.model"
sp="$work/sp.model"
make_corpus "$work/x.txt" 3 40 6 14
SP=(--tokenizer-type SentencePieceTokenizer --tokenizer-model "$sp")

# ---- refusals: one line naming the flag and the fix ------------------------------------------------
expect_error unknown_type "--tokenizer-type BertWordPieceCase is not supported; use one of HuggingFaceTokenizer, GPT2BPETokenizer, SentencePieceTokenizer" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-type BertWordPieceCase --data-path "$work/x.txt"
expect_error gpt2_needs_merge_file "--tokenizer-type GPT2BPETokenizer needs --merge-file" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-type GPT2BPETokenizer --vocab-file "$work/x.txt"
expect_error sp_directory_without_model "is a directory without tokenizer.model" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-type Llama2Tokenizer --tokenizer-model "$work"
head -c 100 "$sp" >"$work/cut.model"
expect_error sp_malformed_model "tokenizer $work/cut.model: not a SentencePiece model file" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/cut.model" \
    --save "$work/bad"
[ ! -e "$work/bad" ] && ok sp_malformed_before_work || fail sp_malformed_before_work "a checkpoint was written"
expect_error null_needs_vocab "NullTokenizer needs --vocab-size" -- \
    "$M" prepare --input "$work/x.txt" --output-prefix "$work/n" --tokenizer-type NullTokenizer

# ---- GPT2BPETokenizer: the checkpoint carries vocab.json and merges.txt (as its tokenizer.json) --------
python3 - "$work/x.txt" "$work/gpt2" <<'PY' >"$work/gpt2.log" 2>&1
import os, sys
from tokenizers import ByteLevelBPETokenizer
tok = ByteLevelBPETokenizer()
tok.train([sys.argv[1]], vocab_size=300, min_frequency=1, show_progress=False)
os.makedirs(sys.argv[2])
tok.save_model(sys.argv[2])
PY
if "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-type GPT2BPETokenizer --vocab-file "$work/gpt2/vocab.json" \
    --merge-file "$work/gpt2/merges.txt" --data-path "$work/x.txt" --save "$work/gpt2.ck" >"$work/gpt2_train.log" 2>&1 &&
    rm -r "$work/gpt2" && "$M" generate --load "$work/gpt2.ck" --prompt "the cat" --max-new-tokens 3 --temperature 0 \
    >"$work/gpt2_gen.out" 2>"$work/gpt2_gen.err" && grep -q "^the cat" "$work/gpt2_gen.out"; then
    ok gpt2_checkpoint_needs_no_original_files
else
    fail gpt2_checkpoint_needs_no_original_files "$(tail -1 "$work/gpt2.log") $(tail -1 "$work/gpt2_train.log") $(tail -1 "$work/gpt2_gen.err" 2>/dev/null)"
fi

# ---- SentencePiece: prepare, train on text, checkpoint, generate ---------------------------------------
"$M" prepare --input "$work/x.txt" "${SP[@]}" --append-eod --output-prefix "$work/sp" >"$work/prep.out" 2>&1 &&
    [ -s "$work/sp_text_document.bin" ] && ok sp_prepare || fail sp_prepare "$(tail -1 "$work/prep.out")"
"$M" train "${TINY[@]}" --train-iters 2 "${SP[@]}" --data-path "$work/x.txt" --save "$work/ck" >"$work/train.out" 2>&1 ||
    { fail sp_train "$(tail -1 "$work/train.out")"; exit 0; }
it="$work/ck/iter_0000002"
cmp -s "$sp" "$it/tokenizer.model" && [ ! -e "$it/tokenizer.json" ] && ok sp_checkpoint_carries_model ||
    fail sp_checkpoint_carries_model "$(ls "$it")"
gen=("$M" generate --load "$work/ck" --prompt "the cat sat" --max-new-tokens 4 --temperature 0)
"${gen[@]}" "${SP[@]}" >"$work/gen2.out" 2>/dev/null && rm "$sp" &&  # the checkpoint's copy from here on
"${gen[@]}" >"$work/gen.out" 2>"$work/gen.err" &&
    grep -q "^the cat sat" "$work/gen.out" && cmp -s "$work/gen.out" "$work/gen2.out" && ok sp_generate_after_load ||
    fail sp_generate_after_load "$(tail -1 "$work/gen.err") / $(head -c 200 "$work/gen.out") vs $(head -c 200 "$work/gen2.out")"

# ---- NullTokenizer: the text is ids; the end of document is vocab-size - 1 ---------------------------
printf '{"text": "5 6 7 8"}\n{"text": "1 2"}\n' >"$work/ids.jsonl"
"$M" prepare --input "$work/ids.jsonl" --tokenizer-type NullTokenizer --vocab-size 100 --append-eod \
    --output-prefix "$work/null" >"$work/null.out" 2>&1
got=$(od -An -tu2 -v "$work/null_text_document.bin" 2>/dev/null | tr -s ' \n' ' ')
[ "$got" = " 5 6 7 8 99 1 2 99 " ] && ok null_ids_and_eod || fail null_ids_and_eod "$(tail -1 "$work/null.out") / ids:$got"
expect_error null_bad_text "NullTokenizer: \"[a-z]*\" is not a token id below --vocab-size 100" -- \
    "$M" prepare --input "$work/x.txt" --output-prefix "$work/n2" --tokenizer-type NullTokenizer --vocab-size 100 \
    --json-keys text
