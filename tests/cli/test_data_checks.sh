#!/usr/bin/env bash
# test_data_checks.sh — input data refused at start-up, before step 1: a Megatron dataset
# holding a token id outside --vocab-size (any dataset of a blend, any split, `train` and
# `moetron data` alike) is one error line naming the .bin and the first offending document;
# each .bin is scanned once and its id range cached (a second start reads the cache, a
# touched file is scanned again). Input files that are not regular files (a FIFO) or far
# too large for their kind (a sparse 10 GiB config.json) are one error line, without blocking.
set -u
source "$(dirname "$0")/lib.sh"
MODEL=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --num-experts 2 --moe-ffn-hidden-size 32
       --seq-length 16 --micro-batch-size 2 --global-batch-size 2 --lr-warmup-iters 0 --log-interval 1
       --train-iters 1)
V=(--vocab-size 300)

# make_dataset PREFIX [DOC:POS:ID ...]: 30 documents of 20 uint16 tokens below 256, one
# sequence each, with token POS of document DOC set to ID.
make_dataset() {
    python3 - "$@" <<'PY'
import struct, sys
prefix, edits = sys.argv[1], [tuple(map(int, e.split(":"))) for e in sys.argv[2:]]
docs = [[(d * 7 + t * 3) % 256 for t in range(20)] for d in range(30)]
for d, pos, value in edits:
    docs[d][pos] = value
with open(prefix + ".bin", "wb") as f:
    for doc in docs:
        f.write(struct.pack("<%dH" % len(doc), *doc))
n = len(docs)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\0\0" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", n, n + 1))
    f.write(struct.pack("<%di" % n, *[len(d) for d in docs]))
    f.write(struct.pack("<%dq" % n, *[40 * i for i in range(n)]))
    f.write(struct.pack("<%dq" % (n + 1), *range(n + 1)))
PY
}

# no training step ran (the error came at start-up)
no_step_ran() { ! grep -q "^step " "$work/out"; }

test_token_ids_checked_and_cached() {
    make_dataset "$work/good" && make_dataset "$work/bad" 2:3:350 5:0:299 9:1:4000 || { fail data_checks "python3 failed"; return; }
    local CACHE=(--data-cache-path "$work/cache")
    "$M" train "${MODEL[@]}" "${V[@]}" --data-path "$work/good" "${CACHE[@]}" >"$work/first.log" 2>&1 ||
        { fail token_ids_good "$(tail -2 "$work/first.log")"; return; }
    grep -q "token ids of 1 dataset inside the vocabulary of --vocab-size 300: 1 scanned, 0 from the cache" "$work/first.log" &&
        ls "$work/cache/"*-TokenIds-all.moetron-indices >/dev/null 2>&1 && ok token_ids_scanned_and_cached ||
        fail token_ids_scanned "$(grep "token ids" "$work/first.log"; ls "$work/cache")"
    "$M" train "${MODEL[@]}" "${V[@]}" --data-path "$work/good" "${CACHE[@]}" >"$work/second.log" 2>&1 &&
        grep -q "token ids of 1 dataset .*: 0 scanned, 1 from the cache" "$work/second.log" &&
        ok token_ids_second_start_reads_cache || fail token_ids_second_start "$(grep "token ids" "$work/second.log")"
    touch -d "+1 minute" "$work/good.bin"
    "$M" train "${MODEL[@]}" "${V[@]}" --data-path "$work/good" "${CACHE[@]}" >"$work/third.log" 2>&1 &&
        grep -q "token ids of 1 dataset .*: 1 scanned, 0 from the cache" "$work/third.log" &&
        ok token_ids_touched_file_rescanned || fail token_ids_touched "$(grep "token ids" "$work/third.log")"

    # 350 is below the padded vocabulary (384) but not a token of a 300-token tokenizer.
    local WANT="bad.bin: document 2 (sequence 2, token 3) holds id 350, outside the vocabulary of --vocab-size 300"
    expect_error token_id_in_blend "$WANT" -- "$M" train "${MODEL[@]}" "${V[@]}" --data-path 0.5 "$work/good" 0.5 "$work/bad" "${CACHE[@]}" &&
        { no_step_ran && ok token_id_error_before_step_1 || fail token_id_error_before_step_1 "$(head -3 "$work/out")"; }
    expect_error token_id_cached_range_still_refused "$WANT" -- \
        "$M" train "${MODEL[@]}" "${V[@]}" --data-path 0.5 "$work/good" 0.5 "$work/bad" "${CACHE[@]}"
    expect_error token_id_in_valid_split "$WANT" -- "$M" train "${MODEL[@]}" "${V[@]}" --train-data-path "$work/good" \
        --valid-data-path "$work/bad" --eval-interval 1 --eval-iters 1 "${CACHE[@]}"
    expect_error token_id_moetron_data "$WANT" -- "$M" data --data-path "$work/bad" --vocab-size 300 --seq-length 16 \
        --num-samples 2 --dump "$work/d.safetensors" "${CACHE[@]}"
    [ ! -e "$work/d.safetensors" ] && ok token_id_moetron_data_wrote_nothing || fail token_id_moetron_data_wrote "dump exists"
    "$M" train "${MODEL[@]}" --vocab-size 4001 --data-path "$work/bad" "${CACHE[@]}" >"$work/big.log" 2>&1 &&
        ok token_ids_inside_a_larger_vocab || fail token_ids_inside_a_larger_vocab "$(tail -2 "$work/big.log")"
}

test_non_regular_and_oversized_inputs() {
    mkfifo "$work/fifo" || { fail data_checks "mkfifo failed"; return; }
    # timeout only guards against a hang (the refusal comes before any blocking open)
    expect_error text_data_fifo "fifo: not a regular file (a FIFO)" -- timeout 60 "$M" train "${MODEL[@]}" "${V[@]}" --data-path "$work/fifo"
    mkfifo "$work/fifo.txt"
    expect_error prepare_input_fifo "fifo.txt: not a regular file (a FIFO)" -- timeout 60 "$M" prepare \
        --input "$work/fifo.txt" --vocab-size 300 --output-prefix "$work/p"
    expect_error tokenizer_fifo "not a regular file (a FIFO)" -- timeout 60 "$M" train "${MODEL[@]}" "${V[@]}" \
        --tokenizer-model "$work/fifo" --save "$work/ck_fifo"
    mkdir -p "$work/ck/iter_0000007" && echo 7 >"$work/ck/latest_checkpointed_iteration.txt" &&
        truncate -s 10G "$work/ck/iter_0000007/config.json"
    expect_error config_json_10_gib "config.json: is 10737418240 bytes, more than the 256 MiB allowed" -- \
        timeout 60 "$M" generate --load "$work/ck" --prompt hi
    head -c 5000 /dev/zero | tr '\0' '7' >"$work/ck/latest_checkpointed_iteration.txt"
    expect_error latest_iteration_oversized "more than the 4 KiB allowed" -- timeout 60 "$M" generate --load "$work/ck" --prompt hi
}

test_token_ids_checked_and_cached
test_non_regular_and_oversized_inputs
