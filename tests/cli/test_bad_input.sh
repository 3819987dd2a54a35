#!/usr/bin/env bash
# test_bad_input.sh — values out of range, from flags and from config.json files: one line
# `moetron: error: ...` naming the flag (or the file and its key) and the range, before any
# work starts; a value that only looked too large (a huge capacity factor) just works; an
# explicit --seq-length is never lowered to a model's max_position_embeddings.
set -u
source "$(dirname "$0")/lib.sh"
FAST=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 0
      --mock-data-tokens 65536 --log-interval 1)

test_overflow_repros() {
    # each of these once overflowed a size derived from the flag
    expect_error mock_data_tokens_2pow62 "--mock-data-tokens 4611686018427387905 is out of range: use 1024\.\." -- \
        "$M" train --mock-data-tokens 4611686018427387905
    expect_error max_new_tokens_int_max "--max-new-tokens 2147483647 is out of range: use 0\.\." -- \
        "$M" generate --max-new-tokens 2147483647 --prompt hi
    # the capacity ceil(k·N/E · 2e7) is far beyond int: clamped to the micro-batch's tokens
    if "$M" train "${FAST[@]}" --train-iters 2 --moe-expert-capacity-factor 2e7 --moe-pad-expert-input-to-capacity \
        --log-jsonl "$work/capacity.jsonl" >"$work/capacity.log" 2>&1 && [ "$(losses "$work/capacity.jsonl" | wc -l)" -eq 2 ]; then
        ok capacity_factor_2e7_trains
    else
        fail capacity_factor_2e7_trains "$(tail -2 "$work/capacity.log")"
    fi
}

test_flag_bounds() {
    expect_error heads_times_head_width "--num-attention-heads 65536 times the head width 65536 (--kv-channels) exceeds" -- \
        "$M" train --num-attention-heads 65536 --kv-channels 65536
    expect_error num_experts_range "--num-experts 100000 is out of range: use 0\.\.16384" -- "$M" train --num-experts 100000
    expect_error tokens_times_experts "--micro-batch-size 100000 x --seq-length 100000 x --num-experts 8 is above" -- \
        "$M" train --micro-batch-size 100000 --global-batch-size 100000 --seq-length 100000
    expect_error validation_samples "--eval-iters 2000000000 x --global-batch-size 2000000000 .* validation samples" -- \
        "$M" train --eval-iters 2000000000 --global-batch-size 2000000000 --micro-batch-size 1 --seq-length 1
    expect_error train_samples "--train-iters 2000000000 x --global-batch-size 2000000000 is above" -- \
        "$M" train --train-iters 2000000000 --global-batch-size 2000000000 --micro-batch-size 1 --seq-length 1
    expect_error data_num_samples "--num-samples 4611686018427387904 of --seq-length 8 + 1 tokens is out of range" -- \
        "$M" data --num-samples 4611686018427387904 --seq-length 8
    expect_error max_position_negative "--max-position-embeddings -1 is out of range: use 0\.\." -- \
        "$M" train --max-position-embeddings -1
    expect_error mla_v_head_width "--num-attention-heads 4096 times the head width 16384 (--v-head-dim) exceeds" -- \
        "$M" train --multi-latent-attention --num-attention-heads 4096 --hidden-size 8192 --v-head-dim 16384
    expect_error seq_length_dimension "--seq-length 16777217 is larger than the supported" -- "$M" train --seq-length 16777217
}

# A checkpoint of the FAST model, and a Hugging Face directory made of its weights and
# its config.json without the moetron section (max_position_embeddings 32).
make_models() {
    "$M" train "${FAST[@]}" --train-iters 1 --save "$work/ckpt" >"$work/ckpt.log" 2>&1 ||
        { fail make_models "train failed: $(tail -1 "$work/ckpt.log")"; return 1; }
    mkdir -p "$work/hf"
    cp "$work/ckpt/iter_0000001/model.safetensors" "$work/hf/"
    edit_json "$work/ckpt/iter_0000001/config.json" "$work/hf/config.json" \
        'del c["moetron"]; c["max_position_embeddings"] = 32'
}

# edit_json IN OUT PYTHON: OUT is IN's JSON object c after the statements.
edit_json() {
    python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=1)' "$1" "$2" "$3"
}

# damaged_hf NAME PYTHON: a copy of the Hugging Face directory with its config.json edited
damaged_hf() {
    rm -rf "$work/$1"
    mkdir -p "$work/$1"
    cp "$work/hf/model.safetensors" "$work/$1/"
    edit_json "$work/hf/config.json" "$work/$1/config.json" "$2"
}

test_file_values_name_their_key() {
    damaged_hf heads7 'c["num_attention_heads"] = 7; c["num_key_value_heads"] = 7; del c["head_dim"]'
    expect_error hf_heads_not_dividing "heads7/config.json: \"num_attention_heads\" 7 does not divide \"hidden_size\" 64" -- \
        "$M" generate --load "$work/heads7" --prompt hi
    damaged_hf topk9 'c["num_experts_per_tok"] = 9'
    expect_error hf_topk_above_experts "topk9/config.json: \"num_experts_per_tok\" 9 exceeds \"num_local_experts\" 4" -- \
        "$M" forward --load "$work/topk9" --input "$work/none.safetensors" --dump "$work/out.safetensors"
    damaged_hf head_dim_huge 'c["head_dim"] = 16777216'
    expect_error hf_head_width "config.json: \"num_attention_heads\" 4 times the head width 16777216 (\"head_dim\") exceeds" -- \
        "$M" generate --load "$work/head_dim_huge" --prompt hi
    # a moetron checkpoint's values come from its flag section
    local iter=$work/ckpt/iter_0000001
    cp "$iter/config.json" "$work/config.json.saved"
    edit_json "$work/config.json.saved" "$iter/config.json" 'c["moetron"]["flags"]["moe-router-topk"] = 99'
    rm -f "$iter/checksums.json"  # edited on purpose: as a checkpoint without checksums, it is read
    expect_error ckpt_flag_section "config.json: \"moetron.flags.moe-router-topk\" 99 exceeds \"moetron.flags.num-experts\" 4" -- \
        "$M" generate --load "$iter" --prompt hi
    cp "$work/config.json.saved" "$iter/config.json"
    # a flag the user gave is still named as a flag, without the file
    expect_error given_flag_named_as_flag "--max-new-tokens 2147483647 is out of range" -- \
        "$M" generate --load "$work/hf" --prompt hi --max-new-tokens 2147483647 &&
        { grep -q "^moetron: error: --max-new-tokens" "$work/err" && ok given_flag_without_file ||
            fail given_flag_without_file "$(cat "$work/err")"; }
}

test_seq_length_never_lowered_silently() {
    expect_error explicit_seq_length_above_positions \
        "hf/config.json: --seq-length 64 exceeds \"max_position_embeddings\" 32; lower --seq-length to at most 32" -- \
        "$M" train --load "$work/hf" --seq-length 64 --train-iters 1
    # the default (256) is lowered, and training says so
    if "$M" train --load "$work/hf" --train-iters 1 --micro-batch-size 2 --global-batch-size 2 --mock-data-tokens 65536 \
        --eval-interval 0 --lr-warmup-iters 0 >"$work/lowered.log" 2>&1 &&
        grep -q "^note: --seq-length 256 lowered to 32, the max_position_embeddings of .*hf/config.json" "$work/lowered.log"; then
        ok default_seq_length_lowered_with_note
    else
        fail default_seq_length_lowered_with_note "$(head -3 "$work/lowered.log" | tr '\n' ' ')"
    fi
}

# --rope-type and YaRN's parameters: bad values refused by flag; YaRN changes the numbers,
# and Megatron's non-MLA spelling (--position-embedding-type yarn) is the same run.
test_rope_scaling() {
    expect_error rope_type_unknown "--rope-type ntk is not supported; use rope or yarn" -- "$M" train --rope-type ntk
    expect_error yarn_factor_below_one "--rotary-scaling-factor 0.5 must be at least 1" -- \
        "$M" train --rope-type yarn --rotary-scaling-factor 0.5
    expect_error yarn_betas_swapped "--beta-fast 1 and --beta-slow 32 must be positive with beta-slow <= beta-fast" -- \
        "$M" train --rope-type yarn --beta-fast 1 --beta-slow 32
    expect_error yarn_original_context "--original-max-position-embeddings -1 must be positive (or 0: the scaling's default)" -- \
        "$M" train --rope-type yarn --original-max-position-embeddings -1
    expect_error two_rope_scalings "--rope-type yarn, --rotary-seq-len-interpolation-factor and --use-rope-scaling each rescale" -- \
        "$M" train --rope-type yarn --use-rope-scaling
    expect_error llama3_factor_below_one "--rope-scaling-factor 0.5 must be at least 1" -- \
        "$M" train --use-rope-scaling --rope-scaling-factor 0.5
    expect_error yarn_and_linear "--rope-type yarn, --rotary-seq-len-interpolation-factor and --use-rope-scaling each" -- \
        "$M" train --rope-type yarn --rotary-seq-len-interpolation-factor 2
    expect_error linear_factor_below_one "--rotary-seq-len-interpolation-factor 0.5 must be at least 1" -- \
        "$M" train --rotary-seq-len-interpolation-factor 0.5
    expect_error yarn_parameter_without_yarn "--beta-fast applies to --rope-type yarn" -- "$M" train --beta-fast 16
    expect_error mla_scale_without_mla "--mscale-all-dim applies to --rope-type yarn (or --multi-latent-attention)" -- \
        "$M" train --mscale-all-dim 1
    expect_error llama3_factor_without_scaling "--rope-scaling-factor applies to --use-rope-scaling" -- \
        "$M" train --rope-scaling-factor 8
    expect_error position_embedding_learned "--position-embedding-type learned_absolute is not supported" -- \
        "$M" train --position-embedding-type learned_absolute
    local yarn=(--rotary-scaling-factor 4 --original-max-position-embeddings 16 --beta-slow 0.5)
    "$M" train "${FAST[@]}" --train-iters 2 --log-jsonl "$work/rope.jsonl" >"$work/rope.log" 2>&1
    "$M" train "${FAST[@]}" --train-iters 2 --rope-type yarn "${yarn[@]}" --log-jsonl "$work/yarn.jsonl" \
        >"$work/yarn.log" 2>&1
    "$M" train "${FAST[@]}" --train-iters 2 --position-embedding-type yarn "${yarn[@]}" \
        --log-jsonl "$work/yarn_pet.jsonl" >"$work/yarn_pet.log" 2>&1
    if [ "$(losses "$work/yarn.jsonl" | wc -l)" -eq 2 ] && ! cmp -s <(losses "$work/rope.jsonl") <(losses "$work/yarn.jsonl") &&
        cmp -s <(losses "$work/yarn.jsonl") <(losses "$work/yarn_pet.jsonl"); then
        ok yarn_trains_and_differs_from_rope
    else
        fail yarn_trains_and_differs_from_rope "$(tail -2 "$work/yarn.log" "$work/yarn_pet.log" | tr '\n' ' ')"
    fi
}

test_overflow_repros
test_flag_bounds
test_rope_scaling
if make_models; then
    test_file_values_name_their_key
    test_seq_length_never_lowered_silently
fi
