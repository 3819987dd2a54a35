#!/usr/bin/env bash
# test_tokenizer_use.sh — the run's tokenizer (docs/data.md, docs/checkpoints.md): read once
# at start-up and carried into every checkpoint (also after --load when --keep-checkpoints
# prunes the directory it came from), a file that is no tokenizer.json refused in one line,
# text --data-path tokenized with it as `moetron prepare` tokenizes the same file,
# --vocab-size defaulting to the tokenizer's, and exported special tokens.
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --num-experts 2 --moe-ffn-hidden-size 32
      --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --eval-interval 0 --lr-warmup-iters 0
      --log-interval 1 --peak-tflops 1)

# a text of paragraphs (blank lines between) and the same documents as .jsonl
words=(the quick brown fox jumps over lazy dog and cat sat on a mat while birds sing)
for p in $(seq 0 59); do
    line=""
    for w in $(seq 0 11); do line+="${words[$(((p * 7 + w * 3 + w * w) % ${#words[@]}))]} "; done
    printf '%s\n%s\n\n' "$line" "${line% }." >>"$work/x.txt"
    printf '{"text": "%s\\n%s."}\n' "$line" "${line% }" >>"$work/x.jsonl"
done
"$M" prepare --input "$work/x.txt" --vocab-size 300 --append-eod --output-prefix "$work/p" >"$work/prep.out" 2>&1 ||
    { fail prepare "$(tail -1 "$work/prep.out")"; exit 0; }
tok="$work/p_tokenizer.json"
prepared_tokens() { sed -n 's/.*documents, \([0-9]*\) tokens.*/\1/p' "$1"; }

flag_of() {  # flag_of CONFIG.JSON KEY: the value of a top-level key or of moetron.flags.KEY
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); k=sys.argv[2]
print(json.dumps(c[k] if k in c else c["moetron"]["flags"][k]))' "$1" "$2" 2>/dev/null
}

# ---- a file that is no tokenizer.json: one line at start-up, nothing written -----------------
expect_error tokenizer_not_json "--tokenizer-model /etc/passwd is not a tokenizer.json" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model /etc/passwd --save "$work/bad" || true
[ ! -e "$work/bad" ] && ! grep -q '^step' "$work/out" && ok tokenizer_not_json_before_work ||
    fail tokenizer_not_json_before_work "training ran or a checkpoint was written"

# ---- --vocab-size from the tokenizer, padded by --make-vocab-size-divisible-by -------------------
"$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model "$tok" --save "$work/v128" >"$work/v128.out" 2>&1 &&
"$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model "$tok" --make-vocab-size-divisible-by 64 \
    --save "$work/v64" >"$work/v64.out" 2>&1 &&
"$M" train "${TINY[@]}" --train-iters 1 --save "$work/bytes" >"$work/bytes.out" 2>&1 ||
    { fail vocab_size_default "train failed: $(tail -1 "$work"/v*.out "$work/bytes.out")"; exit 0; }
got="$(flag_of "$work/v128/iter_0000001/config.json" vocab-size) $(flag_of "$work/v128/iter_0000001/config.json" vocab_size)"
got+=" $(flag_of "$work/v64/iter_0000001/config.json" vocab_size) $(flag_of "$work/bytes/iter_0000001/config.json" vocab-size)"
[ "$got" = "300 384 320 257" ] && ok vocab_size_default_from_tokenizer ||
    fail vocab_size_default_from_tokenizer "vocab-size, padded (128), padded (64), byte-level: $got, expected 300 384 320 257"

# ---- exported special tokens: the tokenizer's <|endoftext|>, 256 for byte-level models ---------------
eot=$(python3 -c 'import json,sys; print([t["id"] for t in json.load(open(sys.argv[1]))["added_tokens"] if t["content"]=="<|endoftext|>"][0])' "$tok")
it="$work/v128/iter_0000001"
got="$(flag_of "$it/config.json" eos_token_id) $(flag_of "$it/config.json" bos_token_id)"
got+=" $(flag_of "$it/generation_config.json" eos_token_id) $(flag_of "$it/tokenizer_config.json" eos_token)"
got+=" $(flag_of "$work/bytes/iter_0000001/config.json" eos_token_id)"
[ "$got" = "$eot $eot $eot \"<|endoftext|>\" 256" ] && [ ! -e "$work/bytes/iter_0000001/generation_config.json" ] &&
    ok special_tokens_exported || fail special_tokens_exported "eos, bos, generation eos, eos_token, byte eos: $got (end-of-text $eot)"

# ---- text --data-path: tokenized with the run's tokenizer as prepare does --------------------------
expect_line() {  # NAME LOG PATTERN
    grep -q "$3" "$2" && ok "$1" || fail "$1" "no line '$3' in: $(grep -m1 '^data:' "$2")"
}
n_txt=$(prepared_tokens "$work/prep.out")
"$M" train "${TINY[@]}" --train-iters 2 --tokenizer-model "$tok" --data-path "$work/x.txt" --save "$work/hf" \
    >"$work/txt.out" 2>&1 || { fail text_tokenized "train failed: $(tail -1 "$work/txt.out")"; exit 0; }
expect_line text_tokenized_with_tokenizer "$work/txt.out" "^data: $work/x.txt tokenized with $tok: $n_txt tokens$"
"$M" prepare --input "$work/x.jsonl" --tokenizer-model "$tok" --append-eod --output-prefix "$work/j" >"$work/prepj.out" 2>&1
n_jsonl=$(prepared_tokens "$work/prepj.out")
"$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model "$tok" --data-path "$work/x.jsonl" >"$work/jsonl.out" 2>&1
expect_line jsonl_tokenized_with_tokenizer "$work/jsonl.out" "^data: $work/x.jsonl tokenized with $tok: $n_jsonl tokens$"
"$M" train "${TINY[@]}" --train-iters 1 --data-path "$work/x.txt" >"$work/raw.out" 2>&1
expect_line text_without_tokenizer_bytes "$work/raw.out" \
    "^data: $work/x.txt read as bytes (no tokenizer): $(($(wc -c <"$work/x.txt") + 1)) tokens$"
# fine-tuning a saved model on text: the tokenizer is the one in the loaded directory
"$M" train --load "$work/hf/iter_0000002" --train-iters 3 --data-path "$work/x.txt" >"$work/ft.out" 2>&1
expect_line finetune_uses_loaded_tokenizer "$work/ft.out" \
    "^data: $work/x.txt tokenized with $work/hf/iter_0000002/tokenizer.json: $n_txt tokens$"
expect_error tokenizer_larger_than_vocab "tokenizer .* has 300 tokens but --vocab-size is 257" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model "$tok" --vocab-size 257 --data-path "$work/x.txt" || true

# ---- --load + --keep-checkpoints pruning the checkpoint the tokenizer came from ----------------------
mkdir -p "$work/tokdir"
cp "$tok" "$work/tokdir/tokenizer.json"
printf '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}\n' >"$work/tokdir/tokenizer_config.json"
"$M" train "${TINY[@]}" --train-iters 1 --tokenizer-model "$work/tokdir/tokenizer.json" --save "$work/keep" \
    >"$work/keep1.out" 2>&1 &&
"$M" train --load "$work/keep" --train-iters 4 --save "$work/keep" --save-interval 1 --keep-checkpoints 1 \
    >"$work/keep2.out" 2>&1
rc=$?
last="$work/keep/iter_0000004"
if [ $rc -ne 0 ]; then
    fail pruned_tokenizer_still_saved "the resumed run failed: $(tail -1 "$work/keep2.out")"
elif [ -e "$work/keep/iter_0000001" ] || [ -e "$work/keep/iter_0000003" ]; then
    fail pruned_tokenizer_still_saved "--keep-checkpoints 1 kept: $(ls "$work/keep" | tr '\n' ' ')"
elif ! cmp -s "$tok" "$last/tokenizer.json" || ! cmp -s "$work/tokdir/tokenizer_config.json" "$last/tokenizer_config.json"; then
    fail pruned_tokenizer_still_saved "$last lacks the tokenizer files: $(ls "$last" | tr '\n' ' ')"
else
    ok pruned_tokenizer_still_saved
fi
