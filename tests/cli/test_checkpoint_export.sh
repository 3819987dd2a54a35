#!/usr/bin/env bash
# test_checkpoint_export.sh — checkpoint export: Hugging Face shards + index above
# --max-shard-size, --ckpt-dtype bf16 (BF16 model file, F32 master weights in
# optimizer.safetensors, bit-identical resume), tokenizer files copied by
# --tokenizer-model, and one clear error line for a damaged sharded checkpoint.
# Headers are read with python3's standard library only (json + struct).
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --num-experts 4 --moe-ffn-hidden-size 32
      --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --eval-interval 0 --log-interval 1
      --lr-warmup-iters 1 --mock-data-tokens 65536)
# sigmoid routing with an expert bias: the bias is state the optimizer never steps (kept F32)
BIAS=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01)

train_tiny() {  # out_name, extra flags...: logs to $work/NAME.log and $work/NAME.jsonl
    local name=$1
    shift
    "$M" train "${TINY[@]}" --log-jsonl "$work/$name.jsonl" "$@" >"$work/$name.log" 2>&1
}

# pyst SCRIPT ARGS...: python3 (standard library only) with header(path) -> (header dict, data bytes)
pyst() {
    local script=$1
    shift
    python3 -c "$SAFETENSORS_PY
import json, struct, sys, os
$script" "$@"
}

# drop_masters OPTIMIZER_FILE [KEEP]: rewrite it without its master.* tensors (but KEEP)
drop_masters() {
    pyst '
h, data = header(sys.argv[1])
meta = h.pop("__metadata__")
keep = {k: v for k, v in h.items() if not k.startswith("master.") or k in sys.argv[2:]}
out, off, blobs = {"__metadata__": meta}, 0, []
for k, v in keep.items():
    b, e = v["data_offsets"]
    out[k] = dict(v, data_offsets=[off, off + e - b])
    off += e - b
    blobs.append(data[b:e])
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
' "$@"
}

test_sharded() {
    train_tiny shard --train-iters 2 --save "$work/shard_ckpt" --max-shard-size 20KB ||
        { fail sharded_export "train failed: $(tail -1 "$work/shard.log")"; return; }
    local it="$work/shard_ckpt/iter_0000002"
    [ ! -e "$it/model.safetensors" ] || { fail sharded_export "model.safetensors written besides the shards"; return; }
    local why
    why=$(pyst '
d, limit = sys.argv[1], 20000
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
wm = index["weight_map"]
files = sorted(f for f in os.listdir(d) if f.startswith("model-"))
n = len(files)
if n < 3: print("only %d shards" % n); sys.exit()
if files != ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]: print("shard names", files); sys.exit()
if sorted(set(wm.values())) != files: print("weight_map files", sorted(set(wm.values()))); sys.exit()
if list(wm) != sorted(wm): print("weight_map keys are not sorted"); sys.exit()
total, params, seen = 0, 0, {}
for f in files:
    h, data = header(os.path.join(d, f))
    h.pop("__metadata__")
    size = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in h.values())
    if size != len(data): print(f, "data size"); sys.exit()
    if size > limit and len(h) > 1: print(f, "holds %d bytes in %d tensors, over the limit" % (size, len(h))); sys.exit()
    total += size
    for k, v in h.items():
        seen[k] = f
        params += eval("*".join(map(str, v["shape"])) or "1")
if seen != wm: print("weight_map does not match the shards"); sys.exit()
if index["metadata"].get("total_size") != total: print("total_size", index["metadata"], "data bytes", total); sys.exit()
if index["metadata"].get("total_parameters") != params: print("total_parameters", index["metadata"], params); sys.exit()
' "$it") || why="python3 failed"
    [ -z "$why" ] || { fail sharded_export "$why"; return; }
    # the same weights as one file: same samples from both
    train_tiny whole --train-iters 2 --save "$work/whole_ckpt" || { fail sharded_export "unsharded train failed"; return; }
    [ -f "$work/whole_ckpt/iter_0000002/model.safetensors" ] || { fail sharded_export "no model.safetensors under the default limit"; return; }
    "$M" generate --load "$work/shard_ckpt" --prompt "12+7=" --max-new-tokens 16 --seed 3 >"$work/gen_shard" 2>&1 ||
        { fail sharded_export "generate: $(tail -1 "$work/gen_shard")"; return; }
    "$M" generate --load "$work/whole_ckpt" --prompt "12+7=" --max-new-tokens 16 --seed 3 >"$work/gen_whole" 2>&1
    cmp -s "$work/gen_shard" "$work/gen_whole" || { fail sharded_export "sharded and single-file checkpoints generate differently"; return; }
    ok sharded_export_layout_and_index
}

test_bf16_resume() {
    local F=(--ckpt-dtype bf16 --max-shard-size 20KB "${BIAS[@]}")
    train_tiny bf_straight --train-iters 10 --save "$work/bf_a" "${F[@]}" || { fail bf16_resume "straight: $(tail -1 "$work/bf_straight.log")"; return; }
    train_tiny bf_part1 --train-iters 10 --save "$work/bf_b" --exit-interval 5 "${F[@]}" || { fail bf16_resume "part 1"; return; }
    cp -r "$work/bf_b" "$work/bf_b5"
    "$M" train --load "$work/bf_b" --log-jsonl "$work/bf_part2.jsonl" >"$work/bf_part2.log" 2>&1 ||
        { fail bf16_resume "resume: $(tail -1 "$work/bf_part2.log")"; return; }
    if ! diff <(losses "$work/bf_straight.jsonl") <(cat <(losses "$work/bf_part1.jsonl") <(losses "$work/bf_part2.jsonl")) >/dev/null; then
        fail bf16_resume "10 straight bf16 steps differ from 5 + resume 5"; return
    fi
    [ "$(losses "$work/bf_straight.jsonl" | wc -l)" -eq 10 ] || { fail bf16_resume "expected 10 logged steps"; return; }
    local f
    for f in optimizer.safetensors model.safetensors.index.json $(cd "$work/bf_a/iter_0000010" && ls model-*); do
        cmp -s "$work/bf_a/iter_0000010/$f" "$work/bf_b/iter_0000010/$f" || { fail bf16_resume "final $f differs"; return; }
    done
    ok bf16_resume_bit_identical

    # without the master weights training resumes from the BF16 weights: no longer identical
    # (an edited file: its checksums.json entry no longer holds, so it goes)
    drop_masters "$work/bf_b5/iter_0000005/optimizer.safetensors" || { fail bf16_no_master "python3 failed"; return; }
    rm "$work/bf_b5/iter_0000005/checksums.json"
    "$M" train --load "$work/bf_b5" --save "$work/bf_c" --log-jsonl "$work/bf_nomaster.jsonl" >"$work/bf_nomaster.log" 2>&1 ||
        { fail bf16_no_master "resume without master weights: $(tail -1 "$work/bf_nomaster.log")"; return; }
    if diff <(losses "$work/bf_part2.jsonl") <(losses "$work/bf_nomaster.jsonl") >/dev/null; then
        fail bf16_no_master "resuming from the BF16 weights gave the same losses as from the masters"; return
    fi
    ok bf16_resume_uses_master_weights

    cp -r "$work/bf_a" "$work/bf_partial"
    rm "$work/bf_partial/iter_0000010/checksums.json"  # the reader's own check, on an edited file
    local opt="$work/bf_partial/iter_0000010/optimizer.safetensors"
    drop_masters "$opt" master.model.norm.weight ||
        { fail bf16_partial_master "python3 failed"; return; }
    expect_error bf16_partial_master_rejected "holds master.model.norm.weight but not master.model.embed_tokens.weight" -- \
        "$M" train --load "$work/bf_partial" --train-iters 11
}

test_bf16_dtypes() {
    # every model tensor BF16 (round to nearest even of its F32 master); the routers and the
    # expert biases F32 (their masters bit for bit)
    local it="$work/bf_a/iter_0000010" why
    [ -d "$it" ] || { fail bf16_dtypes "no bf16 checkpoint"; return; }
    why=$(pyst '
d = sys.argv[1]
masters, mdata = header(os.path.join(d, "optimizer.safetensors"))
def bf16_rne(bits):
    if (bits & 0x7FFFFFFF) > 0x7F800000: return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
n_bf16 = n_f32 = 0
for f in sorted(os.listdir(d)):
    if not f.startswith("model-"): continue
    h, data = header(os.path.join(d, f))
    h.pop("__metadata__")
    for k, v in h.items():
        m = masters.get("master." + k)
        if m is None or m["dtype"] != "F32" or m["shape"] != v["shape"]: print("no F32 master for", k); sys.exit()
        b, e = m["data_offsets"]
        words = struct.unpack("<%dI" % ((e - b) // 4), mdata[b:e])
        b, e = v["data_offsets"]
        if k.endswith(("e_score_correction_bias", ".mlp.gate.weight")):
            n_f32 += 1
            if v["dtype"] != "F32" or struct.unpack("<%dI" % len(words), data[b:e]) != words: print(k, "is not its F32 master"); sys.exit()
            continue
        n_bf16 += 1
        if v["dtype"] != "BF16": print(k, "has dtype", v["dtype"]); sys.exit()
        if struct.unpack("<%dH" % len(words), data[b:e]) != tuple(bf16_rne(w) for w in words):
            print(k, "is not its master weight rounded to nearest even"); sys.exit()
if n_f32 != 4 or n_bf16 < 10: print("found %d BF16 and %d F32 tensors" % (n_bf16, n_f32)); sys.exit()
cfg = json.load(open(os.path.join(d, "config.json")))
if cfg.get("torch_dtype") != "bfloat16": print("config.json torch_dtype", cfg.get("torch_dtype"))
' "$it") || why="python3 failed"
    [ -z "$why" ] || { fail bf16_dtypes "$why"; return; }
    "$M" generate --load "$work/bf_a" --prompt "ab" --max-new-tokens 8 --seed 1 >"$work/gen_bf16" 2>&1 ||
        { fail bf16_dtypes "generate from bf16: $(tail -1 "$work/gen_bf16")"; return; }
    ok bf16_model_dtypes_and_rounding
}

test_tokenizer() {
    mkdir -p "$work/tok"
    printf 'the lazy fox jumps over the dog\n' >"$work/tok/text.txt"
    "$M" prepare --input "$work/tok/text.txt" --vocab-size 270 --output-prefix "$work/tok/t" >/dev/null 2>&1 &&
        mv "$work/tok/t_tokenizer.json" "$work/tok/my-tokenizer.json" || { fail tokenizer_copy "prepare failed"; return; }
    printf '{"tokenizer_class": "PreTrainedTokenizerFast"}\n' >"$work/tok/tokenizer_config.json"
    printf '{"eos_token": "<eos>"}\n' >"$work/tok/special_tokens_map.json"
    train_tiny tokrun --train-iters 1 --save "$work/tok_ckpt" --tokenizer-model "$work/tok/my-tokenizer.json" ||
        { fail tokenizer_copy "train failed: $(tail -1 "$work/tokrun.log")"; return; }
    local it="$work/tok_ckpt/iter_0000001"
    cmp -s "$work/tok/my-tokenizer.json" "$it/tokenizer.json" || { fail tokenizer_copy "tokenizer.json is not a copy"; return; }
    cmp -s "$work/tok/tokenizer_config.json" "$it/tokenizer_config.json" || { fail tokenizer_copy "tokenizer_config.json not copied"; return; }
    cmp -s "$work/tok/special_tokens_map.json" "$it/special_tokens_map.json" || { fail tokenizer_copy "special_tokens_map.json not copied"; return; }
    grep -q '"eos_token_id": 269' "$it/generation_config.json" ||
        { fail tokenizer_copy "generation_config.json lacks the tokenizer's end-of-text"; return; }
    ok tokenizer_files_copied

    # saving the same iteration again replaces the directory with exactly the new files
    train_tiny tokagain --train-iters 1 --save "$work/tok_ckpt" --max-shard-size 20KB ||
        { fail checkpoint_replaced "second save failed: $(tail -1 "$work/tokagain.log")"; return; }
    local left
    left=$(cd "$work/tok_ckpt" && ls -a | grep -v -e '^\.\.\?$' -e '^iter_0000001$' -e '^latest_checkpointed_iteration.txt$' -e '^moetron.lock$')
    [ -z "$left" ] || { fail checkpoint_replaced "left in the save directory: $left"; return; }
    if ls "$it" | grep -q -e '^tokenizer' -e '^special' -e '^model.safetensors$'; then
        fail checkpoint_replaced "files of the replaced checkpoint remain: $(ls "$it" | tr '\n' ' ')"; return
    fi
    ls "$it" | grep -q '^model-00001-of-' || { fail checkpoint_replaced "the new shards are missing"; return; }
    ok checkpoint_replaced_completely

    expect_error tokenizer_missing "tokenizer-model .*no-such-tokenizer.json" -- \
        "$M" train "${TINY[@]}" --train-iters 2 --save "$work/tok_missing" --log-jsonl "$work/tok_missing.jsonl" \
        --tokenizer-model "$work/tok/no-such-tokenizer.json" || return
    if [ -e "$work/tok_missing" ]; then fail tokenizer_missing_at_startup "a checkpoint directory was written"; return; fi
    if grep -q '^step' "$work/out" || grep -qs '"loss"' "$work/tok_missing.jsonl"; then
        fail tokenizer_missing_at_startup "training ran before the error"; return
    fi
    ok tokenizer_missing_at_startup
}

# The readers' own checks on sharded checkpoints without checksums.json (as Hugging Face
# directories come); with it, damage is caught before any reader runs (test_reliability.sh).
test_damaged_shards() {
    local src="$work/shard_ckpt_unchecked"
    [ -d "$work/shard_ckpt" ] || { fail damaged_shards "no sharded checkpoint"; return; }
    cp -r "$work/shard_ckpt" "$src"
    rm "$src/iter_0000002/checksums.json"
    cp -r "$src" "$work/noshard"
    rm "$work/noshard/iter_0000002/model-00002-of-"*.safetensors
    expect_error shard_deleted "model.safetensors.index.json: weight_map names shard model-00002-of-.*which is missing" -- \
        "$M" generate --load "$work/noshard" --prompt hi
    cp -r "$src" "$work/badindex"
    local first
    first=$(cd "$src/iter_0000002" && ls model-00001-of-*)
    sed -i 's/"weight_map": {/"weight_map": {\n    "model.layers.9.mlp.gate.weight": "'"$first"'",/' \
        "$work/badindex/iter_0000002/model.safetensors.index.json"
    expect_error index_names_missing_tensor "weight_map puts tensor model.layers.9.mlp.gate.weight in $first, but that shard does not hold it" -- \
        "$M" generate --load "$work/badindex" --prompt hi
    cp -r "$src" "$work/shortindex"
    sed -i '/"model.layers.0.input_layernorm.weight"/d' "$work/shortindex/iter_0000002/model.safetensors.index.json"
    expect_error index_lacks_tensor "tensor model.layers.0.input_layernorm.weight is missing" -- \
        "$M" generate --load "$work/shortindex" --prompt hi
}

test_sharded
test_bf16_resume
test_bf16_dtypes
test_tokenizer
test_damaged_shards
