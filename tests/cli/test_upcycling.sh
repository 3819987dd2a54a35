#!/usr/bin/env bash
# test_upcycling.sh — --moe-use-upcycling: an MoE model started from a dense moetron
# checkpoint, as Megatron-Core's upcycling. Plain upcycling (every expert a copy of its
# layer's MLP, a softmax router after top-k, a sigmoid one with expert bias) gives the dense
# model's logits at step 0 (moetron forward on both checkpoints, within 1e-5 of the largest);
# granular upcycling (--moe-upcycling-granularity 2) and pre-softmax routing write the
# experts as Megatron-Core's conversion does (slices of the dense MLP times the cube root of
# the activation scale) and the routers' rows in repeated pairs; EP=2 upcycles to the
# single-process numbers; the upcycled checkpoint loads as the MoE model it is, the dense
# directory gets nothing; a multi-token-prediction depth is upcycled as the decoder layers
# (granular, and PP=2 equal to one process); bad combinations are one-line errors.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
BASE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 2 --eval-interval 0 --lr-warmup-iters 1 --mock-data-tokens 16384 --log-interval 1)
FROZEN_STEP=(--train-iters 1 --lr 0 --min-lr 0 --moe-aux-loss-coeff 0)

"$M" train "${BASE[@]}" --num-experts 0 --ffn-hidden-size 64 --train-iters 3 --save "$work/dense" >"$work/dense.log" 2>&1 ||
    fail dense_checkpoint "$(tail -1 "$work/dense.log")"
python3 - "$work/in.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(0)
ids = rng.integers(0, 257, (2, 32)).astype(np.int32)
labels = np.full((2, 32), -100, np.int32)
labels[:, :-1] = ids[:, 1:]
save_file({"input_ids": ids, "labels": labels}, sys.argv[1])
PY
"$M" forward --load "$work/dense" --input "$work/in.safetensors" --dump "$work/dense.out" >/dev/null 2>&1

# upcycle NAME FLAGS...: the dense checkpoint ($DENSE, default $work/dense) upcycled with
# FLAGS, one step that changes no weight, saved to $work/NAME
upcycle() {
    local name=$1
    shift
    "$M" train "${BASE[@]}" --load "${DENSE:-$work/dense}" --moe-use-upcycling "$@" "${FROZEN_STEP[@]}" \
        --save "$work/$name" >"$work/$name.log" 2>&1
}

# same_logits NAME: the upcycled checkpoint's logits are the dense model's
same_logits() {
    local why
    "$M" forward --load "$work/$1" --input "$work/in.safetensors" --dump "$work/$1.out" >"$work/$1.fwd" 2>&1 ||
        { fail "$1" "$(tail -1 "$work/$1.fwd")"; return; }
    why=$(python3 - "$work/dense.out" "$work/$1.out" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1])["logits"], load_file(sys.argv[2])["logits"]
err = np.max(np.abs(a - b)) / np.max(np.abs(a))
if err > 1e-5: print(f"logits differ by {err:.3g} of the largest")
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

upcycle upcycled_softmax --num-experts 4 --moe-router-topk 2 && same_logits upcycled_softmax ||
    fail upcycled_softmax "$(tail -1 "$work/upcycled_softmax.log")"
upcycle upcycled_sigmoid_bias --num-experts 8 --moe-router-topk 2 --moe-router-score-function sigmoid \
    --moe-router-enable-expert-bias && same_logits upcycled_sigmoid_bias ||
    fail upcycled_sigmoid_bias "$(tail -1 "$work/upcycled_sigmoid_bias.log")"
if [ "$(ls "$work/dense")" = "$(printf 'iter_0000003\nlatest_checkpointed_iteration.txt\nmoetron.lock')" ]; then
    ok upcycling_leaves_the_dense_checkpoint
else
    fail upcycling_leaves_the_dense_checkpoint "$(ls "$work/dense" | tr '\n' ' ')"
fi

# megatron_weights NAME E G K PRE: the experts and routers as Megatron-Core's upcycling writes them
megatron_weights() {
    local why
    why=$(python3 - "${DENSE:-$work/dense}" "$work/$1" "$2" "$3" "$4" "$5" 2>&1 <<'PY'
import glob, re, sys
import numpy as np
from safetensors.numpy import load_file
dense_dir, moe_dir, E, G, k, pre = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
d = load_file(sorted(glob.glob(dense_dir + "/iter_*/model.safetensors"))[-1])
m = load_file(sorted(glob.glob(moe_dir + "/iter_*/model.safetensors"))[-1])
scale = np.cbrt(E * G / k if pre else G)
mixtral = any("block_sparse_moe" in name for name in m)  # the family the run chose names the experts
names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"} if mixtral else {n: n for n in ("gate_proj", "up_proj", "down_proj")}
layers = sorted({int(re.match(r"model\.layers\.(\d+)\.mlp\.gate_proj", n).group(1)) for n in d
                 if re.match(r"model\.layers\.\d+\.mlp\.gate_proj", n)})
if not layers: print("the dense checkpoint has no MLP"); sys.exit()
for layer in layers:
    p = f"model.layers.{layer}.mlp."
    moe = f"model.layers.{layer}.block_sparse_moe." if mixtral else p
    F = d[p + "gate_proj.weight"].shape[0]
    I = F // G
    for e in range(E):
        g = e % G
        want = {"gate_proj": d[p + "gate_proj.weight"][g * I:(g + 1) * I], "up_proj": d[p + "up_proj.weight"][g * I:(g + 1) * I],
                "down_proj": d[p + "down_proj.weight"][:, g * I:(g + 1) * I]}
        for part, w in want.items():
            got = m[f"{moe}experts.{e}.{names[part]}.weight"]
            if not np.allclose(got, (w.astype(np.float64) * scale).astype(np.float32), rtol=1e-6, atol=0):
                print(f"layer {layer} expert {e} {part} is not slice {g} x {scale:.6f}"); sys.exit()
    router = m[moe + "gate.weight"]
    for e in range(E):
        if not np.array_equal(router[e], router[e // G * G]): print(f"layer {layer} router row {e} != row {e // G * G}"); sys.exit()
    if G > 1 and E > G and np.array_equal(router[0], router[G]): print("router rows of different copies equal"); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}
upcycle granular_g2 --num-experts 8 --moe-router-topk 2 --moe-upcycling-granularity 2 &&
    megatron_weights granular_g2 8 2 2 0 || fail granular_g2 "$(tail -1 "$work/granular_g2.log")"
upcycle pre_softmax --num-experts 4 --moe-router-topk 1 --moe-router-pre-softmax &&
    megatron_weights pre_softmax 4 1 1 1 || fail pre_softmax "$(tail -1 "$work/pre_softmax.log")"
# a dense model with a multi-token-prediction depth: its layer (2) is upcycled as the others
"$M" train "${BASE[@]}" --num-experts 0 --ffn-hidden-size 64 --mtp-num-layers 1 --train-iters 2 --save "$work/dense_mtp" \
    >"$work/dense_mtp.log" 2>&1 || fail dense_mtp_checkpoint "$(tail -1 "$work/dense_mtp.log")"
DENSE=$work/dense_mtp upcycle granular_mtp --num-experts 4 --moe-router-topk 2 --moe-upcycling-granularity 2 \
    --mtp-num-layers 1 && DENSE=$work/dense_mtp megatron_weights granular_mtp 4 2 2 0 ||
    fail granular_mtp "$(tail -1 "$work/granular_mtp.log")"

expect_error upcycling_save_not_empty "--save .*upcycled_softmax already holds checkpoints; --moe-use-upcycling starts a new run" -- \
    "$M" train "${BASE[@]}" --load "$work/dense" --moe-use-upcycling --num-experts 4 "${FROZEN_STEP[@]}" \
    --save "$work/upcycled_softmax"
expect_error granularity_alone "--moe-upcycling-granularity applies to --moe-use-upcycling" -- \
    "$M" train "${BASE[@]}" --moe-upcycling-granularity 2
expect_error upcycling_needs_load "--moe-use-upcycling starts from a dense checkpoint; give it with --load" -- \
    "$M" train "${BASE[@]}" --moe-use-upcycling --num-experts 4
expect_error upcycling_needs_experts "--moe-use-upcycling makes an MoE model; give --num-experts" -- \
    "$M" train "${BASE[@]}" --load "$work/dense" --moe-use-upcycling --num-experts 0
expect_error upcycling_granularity_divides "--num-experts 6 is not a multiple of --moe-upcycling-granularity 4" -- \
    "$M" train "${BASE[@]}" --load "$work/dense" --moe-use-upcycling --num-experts 6 --moe-upcycling-granularity 4
expect_error upcycling_expert_width "--moe-ffn-hidden-size 48 times --moe-upcycling-granularity 1 must be the dense .*ffn-hidden-size.* 64" -- \
    "$M" train "${BASE[@]}" --load "$work/dense" --moe-use-upcycling --num-experts 4 --moe-ffn-hidden-size 48
expect_error upcycling_an_moe_checkpoint "tensor model.layers.0.mlp.gate_proj.weight (layer 0's dense MLP) is missing" -- \
    "$M" train "${BASE[@]}" --load "$work/upcycled_softmax" --moe-use-upcycling --num-experts 4 --train-iters 2

mpi_require upcycling_mpi
"$M" train "${BASE[@]}" --global-batch-size 4 --load "$work/dense" --moe-use-upcycling --num-experts 4 --train-iters 6 \
    --log-jsonl "$work/single.jsonl" >"$work/single.log" 2>&1
timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${BASE[@]}" --global-batch-size 4 --load "$work/dense" --moe-use-upcycling \
    --num-experts 4 --train-iters 6 --expert-model-parallel-size 2 --log-jsonl "$work/ep2.jsonl" >"$work/ep2.log" 2>&1
curve "$work/single.jsonl" >"$work/single.a"
curve "$work/ep2.jsonl" >"$work/ep2.b"
compare upcycled_ep2_equals_single "$work/single.a" "$work/ep2.b"
# PP=2: each stage reads its layers' dense MLPs (and leaves the other stage's)
timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${BASE[@]}" --global-batch-size 4 --load "$work/dense" --moe-use-upcycling \
    --num-experts 4 --train-iters 6 --pipeline-model-parallel-size 2 --log-jsonl "$work/pp2.jsonl" >"$work/pp2.log" 2>&1
curve "$work/pp2.jsonl" >"$work/pp2.b"
compare upcycled_pp2_equals_single "$work/single.a" "$work/pp2.b"
# PP=2 with a multi-token-prediction depth: the first stage leaves its dense MLP to the last
upcycle_mtp_pp2() {
    "$M" train "${BASE[@]}" --global-batch-size 4 --load "$work/dense_mtp" --moe-use-upcycling --num-experts 4 \
        --mtp-num-layers 1 --train-iters 4 --log-jsonl "$work/mtp_single.jsonl" >"$work/mtp_single.log" 2>&1
    timeout 600 "${MPIRUN[@]}" -np 2 "$M" train "${BASE[@]}" --global-batch-size 4 --load "$work/dense_mtp" \
        --moe-use-upcycling --num-experts 4 --mtp-num-layers 1 --train-iters 4 --pipeline-model-parallel-size 2 \
        --log-jsonl "$work/mtp_pp2.jsonl" >"$work/mtp_pp2.log" 2>&1 ||
        { fail upcycled_mtp_pp2_equals_single "$(tail -2 "$work/mtp_pp2.log" | tr '\n' ' ')"; return; }
    curve "$work/mtp_single.jsonl" >"$work/mtp_single.a"
    curve "$work/mtp_pp2.jsonl" >"$work/mtp_pp2.b"
    compare upcycled_mtp_pp2_equals_single "$work/mtp_single.a" "$work/mtp_pp2.b"
}
full upcycled_mtp_pp2_equals_single upcycle_mtp_pp2
