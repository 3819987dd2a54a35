#!/usr/bin/env bash
# test_fp8.sh — FP8 / FP4 training recipes (--fp8-format, --fp8-recipe, --fp4-format; the
# GEMMs emulated: quantized, dequantized, multiplied in fp32). Per recipe, 10 steps of a tiny
# MoE model (a dense layer, routed experts, a shared expert; and MLA for one recipe): two
# runs are identical, the loss is finite and near the fp32 run's, and the recipe changes the
# results; --first-last-layers-bf16 quantizes the middle layer only; bad values and
# combinations give one error line.
#
# The tolerance: every quantized operand is within 2^-4 (E4M3), 2^-3 (E5M2) or, with NVFP4's
# block scales, about 2^-2 (E2M1) of its value relatively, and the errors of a K-long dot
# product average out (~ err/sqrt(K)); over 10 steps of a model whose loss falls from ~6 to
# ~5.4 the runs stay within about 0.02 of fp32 in practice. 0.1 (FP8) and 0.25 (NVFP4) leave
# room for that and still catch a recipe that corrupts the GEMMs (a wrong scale or a
# transposed operand moves the loss by whole units or makes it NaN).
# Under the sanitizers the cases marked "full" (mpi_lib.sh) are left to the plain build: each
# repeats a path another case takes (a second delayed variant, tensorwise with bf16, the
# delayed resume beside NVFP4's, which saves the same state).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

TINY=(--num-layers 3 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
      --moe-layer-freq "[0,1,1]" --moe-shared-expert-intermediate-size 32 --lr-warmup-iters 1
      --mock-data-tokens 16384 --log-interval 1 --train-iters 10)

# run NAME FLAGS...: 10 steps into $work/NAME.jsonl
run() {
    local name=$1
    shift
    rm -f "$work/$name.jsonl"
    "$M" train "${TINY[@]}" "$@" --log-jsonl "$work/$name.jsonl" >"$work/$name.out" 2>&1
}

last_loss() { step_numbers "$1" | tail -1 | cut -d' ' -f2; }

# check_recipe NAME TOLERANCE FLAGS...: against $work/$REF.jsonl (the fp32 run of the same model)
REF=fp32
check_recipe() {
    local name=$1 tol=$2
    shift 2
    run "$name" "$@" && run "$name.again" "$@" || { fail "$name" "$(grep -m1 error "$work/$name.out")"; return; }
    local a b
    a=$(step_numbers "$work/$name.jsonl")
    b=$(step_numbers "$work/$name.again.jsonl")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then fail "${name}_deterministic" "two runs differ"; else ok "${name}_deterministic"; fi
    if [ "$a" = "$(step_numbers "$work/$REF.jsonl")" ]; then fail "${name}_changes_results" "the same as fp32"
    else ok "${name}_changes_results"; fi
    if python3 -c "import math,sys; q,f,t=map(float,sys.argv[1:]); sys.exit(not (math.isfinite(q) and abs(q-f) <= t))" \
        "$(last_loss "$work/$name.jsonl")" "$(last_loss "$work/$REF.jsonl")" "$tol"; then
        ok "${name}_near_fp32"
    else
        fail "${name}_near_fp32" "loss $(last_loss "$work/$name.jsonl") vs fp32 $(last_loss "$work/$REF.jsonl") (tolerance $tol)"
    fi
}

run fp32 || fail fp32 "$(grep -m1 error "$work/fp32.out")"
check_recipe delayed 0.1 --fp8-format e4m3
full delayed_max check_recipe delayed_max 0.1 --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 4 --fp8-amax-compute-algo max --fp8-margin 1
check_recipe tensorwise 0.1 --fp8-format hybrid --fp8-recipe tensorwise
check_recipe blockwise 0.1 --fp8-format e4m3 --fp8-recipe blockwise
check_recipe mxfp8 0.1 --fp8-format hybrid --fp8-recipe mxfp8
check_recipe nvfp4 0.25 --fp4-format e2m1 --fp4-recipe nvfp4
full tensorwise_bf16 check_recipe tensorwise_bf16 0.1 --fp8-format hybrid --fp8-recipe tensorwise --bf16

# MLA's projections (widths multiples of 16: the latent, latent + rotary key, the heads')
MLA16=(--multi-latent-attention --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 16 --v-head-dim 16 --q-lora-rank 16)
run mla_fp32 "${MLA16[@]}" && REF=mla_fp32 check_recipe mla_blockwise 0.1 "${MLA16[@]}" --fp8-format hybrid --fp8-recipe blockwise
# tensorwise: kv_a_proj_with_mqa's two row blocks scaled from the whole weight's and both gradients' amax
REF=mla_fp32 check_recipe mla_tensorwise 0.1 "${MLA16[@]}" --fp8-format e4m3 --fp8-recipe tensorwise

# --first-last-layers-bf16: only the middle layer is quantized (neither fp32 nor all-tensorwise)
run firstlast --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16
f=$(step_numbers "$work/firstlast.jsonl")
if [ -n "$f" ] && [ "$f" != "$(step_numbers "$work/fp32.jsonl")" ] && [ "$f" != "$(step_numbers "$work/tensorwise.jsonl")" ]; then
    ok first_last_layers_bf16
else
    fail first_last_layers_bf16 "$(grep -m1 error "$work/firstlast.out")"
fi
run all_bf16 --fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-start-in-bf16 2 \
    --num-layers-at-end-in-bf16 1
if [ -n "$(step_numbers "$work/all_bf16.jsonl")" ] && [ "$(step_numbers "$work/all_bf16.jsonl")" = "$(step_numbers "$work/fp32.jsonl")" ]; then
    ok every_layer_bf16_is_fp32
else
    fail every_layer_bf16_is_fp32 "differs from fp32: $(grep -m1 error "$work/all_bf16.out")"
fi

T=("$M" train "${TINY[@]}" --train-iters 1)
expect_error fp8_and_fp4 "cannot be used together" -- "${T[@]}" --fp8-format e4m3 --fp4-format e2m1
expect_error bad_fp8_format "use e4m3 or hybrid" -- "${T[@]}" --fp8-format e5m2
expect_error bad_fp8_recipe "use delayed, tensorwise, blockwise or mxfp8" -- "${T[@]}" --fp8-format e4m3 --fp8-recipe custom
expect_error bad_fp4_format "use e2m1" -- "${T[@]}" --fp4-format nvfp4
expect_error bad_amax_algo "use most_recent or max" -- "${T[@]}" --fp8-format e4m3 --fp8-amax-compute-algo mean
expect_error bad_history "fp8-amax-history-len" -- "${T[@]}" --fp8-format e4m3 --fp8-amax-history-len 0
expect_error recipe_without_format "needs --fp8-format" -- "${T[@]}" --fp8-recipe mxfp8
expect_error first_last_delayed "delayed scaling does not support" -- "${T[@]}" --fp8-format e4m3 --first-last-layers-bf16
expect_error first_last_too_many "num-layers-at-start-in-bf16" -- "${T[@]}" --fp8-format e4m3 --fp8-recipe tensorwise \
    --first-last-layers-bf16 --num-layers-at-start-in-bf16 4
expect_error mxfp8_alignment "multiples of 32" -- "${T[@]}" --fp8-format e4m3 --fp8-recipe mxfp8 --moe-ffn-hidden-size 48
expect_error fp8_alignment "multiples of 16" -- "${T[@]}" --fp8-format e4m3 --moe-shared-expert-intermediate-size 24

# A resume takes exactly the steps of the run straight through: the quantizers' state (delayed
# scaling's amax histories and scales, NVFP4's stochastic-rounding Rng) is in trainer_state.json.
# resume_exact NAME FLAGS...: 10 steps straight against 5 and a resume for 5 more
resume_exact() {
    local name=$1
    shift
    local d="$work/resume_$name"
    mkdir -p "$d"
    "$M" train "${TINY[@]}" "$@" --save "$d/full" --log-jsonl "$d/full.jsonl" >"$d/out" 2>&1 &&
        "$M" train "${TINY[@]}" "$@" --exit-interval 5 --save "$d/half" >>"$d/out" 2>&1 &&
        "$M" train "${TINY[@]}" "$@" --load "$d/half" --log-jsonl "$d/resumed.jsonl" >>"$d/out" 2>&1 ||
        { fail "resume_exact_$name" "$(grep -m1 error "$d/out")"; return; }
    if [ -n "$(step_numbers "$d/resumed.jsonl")" ] &&
        [ "$(step_numbers "$d/full.jsonl" | tail -5)" = "$(step_numbers "$d/resumed.jsonl")" ] &&
        grep -q '"quantizer_state"' "$d/half/iter_0000005/trainer_state.json"; then
        ok "resume_exact_$name"
    else
        fail "resume_exact_$name" "the resumed steps differ: $(diff <(step_numbers "$d/full.jsonl" | tail -5) <(step_numbers "$d/resumed.jsonl") | head -2 | tr '\n' ' ')"
    fi
}
full resume_exact_delayed resume_exact delayed --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 4 --fp8-amax-compute-algo max
resume_exact nvfp4 --fp4-format e2m1 --fp4-recipe nvfp4
# One set of quantizers for each of Megatron-Core's GEMMs: q, k and v share one (linear_qkv), an
# FFN's gate and up one (linear_fc1). TINY's quantized GEMMs: the dense layer qkv, o, fc1, fc2
# (4); each MoE layer qkv, o, the shared expert's fc1 and fc2, and fc1, fc2 of 4 experts (12).
# Delayed scaling saves history_len + 2 floats (amaxes, scale, scale_inv) per operand (3 a
# GEMM) and the rounding Rng's 4 words as 16 floats: (4 + 2·12)·3·(1 + 2) + 16.
d="$work/fused"
mkdir -p "$d"
if "$M" train "${TINY[@]}" --train-iters 1 --fp8-format e4m3 --save "$d/ck" >"$d/out" 2>&1; then
    floats=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["quantizer_state"]["floats"])' \
        "$d/ck/iter_0000001/trainer_state.json")
    want=$(((4 + 2 * 12) * 3 * 3 + 16))
    [ "$floats" = "$want" ] && ok delayed_fused_gemms_share_quantizers ||
        fail delayed_fused_gemms_share_quantizers "quantizer state of $floats floats, expected $want"
else
    fail delayed_fused_gemms_share_quantizers "$(grep -m1 error "$d/out")"
fi
# a checkpoint without quantizer state (an fp32 run's) resumes with a recipe: fresh quantizers, said
d="$work/fresh"
mkdir -p "$d"
if "$M" train "${TINY[@]}" --train-iters 2 --save "$d/plain" >"$d/fresh.out" 2>&1 &&
    "$M" train "${TINY[@]}" --train-iters 4 --fp8-format e4m3 --load "$d/plain" >"$d/fresh.out" 2>&1 &&
    grep -q "quantizers start afresh" "$d/fresh.out"; then
    ok resume_without_quantizer_state
else
    fail resume_without_quantizer_state "$(grep -m1 -e error -e note "$d/fresh.out")"
fi
# a delayed-scaling state of a longer amax history (more floats than this run's quantizers
# take) is not read as this run's: fresh quantizers, said
if "$M" train "${TINY[@]}" --train-iters 2 --fp8-format e4m3 --fp8-amax-history-len 4 --save "$d/long" \
        >"$d/long.out" 2>&1 &&
    "$M" train "${TINY[@]}" --train-iters 4 --fp8-format e4m3 --fp8-amax-history-len 1 --load "$d/long" \
        >"$d/long.out" 2>&1 &&
    grep -q "quantizers start afresh" "$d/long.out"; then
    ok resume_other_history_length_afresh
else
    fail resume_other_history_length_afresh "$(grep -m1 -e error -e note "$d/long.out")"
fi
# --moe-router-padding-for-quantization: each expert's rows rounded up to the recipe's
# multiple with tokens that did not choose it, at probability 0 (Megatron's pad_routing_map;
# tests/unit/test_grad_moe.c and tests/conformance/megatron_router.py check the rows). The
# padding rows join the quantizers' amaxes and blocks, so with delayed scaling and NVFP4 the
# results move (a little), deterministically; under EP=2 (alltoall) each rank pads its own
# rows before the exchange, as Megatron does.
check_recipe padded_delayed 0.1 --fp8-format e4m3 --moe-router-padding-for-quantization
check_recipe padded_nvfp4 0.25 --fp4-format e2m1 --moe-router-padding-for-quantization
for name in padded_delayed padded_nvfp4; do
    plain=${name#padded_}
    if [ -n "$(step_numbers "$work/$name.jsonl")" ] && [ "$(step_numbers "$work/$name.jsonl")" != "$(step_numbers "$work/$plain.jsonl")" ]; then
        ok "${name}_pads"
    else
        fail "${name}_pads" "the same steps as --fp8/fp4 without padding: no padding row reached a quantizer"
    fi
done
expect_error router_padding_needs_quantization "needs --fp8-format or --fp4-format" -- "${T[@]}" \
    --moe-router-padding-for-quantization
expect_error router_padding_allgather "use alltoall" -- "${T[@]}" --fp8-format e4m3 \
    --moe-router-padding-for-quantization --moe-token-dispatcher-type allgather
expect_error router_padding_capacity "choose one" -- "${T[@]}" --fp8-format e4m3 \
    --moe-router-padding-for-quantization --moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity
mpi_require router_padding_ep
ep_padded() {
    rm -f "$work/$1.jsonl"
    timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${TINY[@]}" --expert-model-parallel-size 2 --fp8-format e4m3 \
        --moe-token-dispatcher-type alltoall "${@:2}" --log-jsonl "$work/$1.jsonl" >"$work/$1.out" 2>&1
}
if ep_padded ep_plain && ep_padded ep_padded --moe-router-padding-for-quantization &&
    [ -n "$(step_numbers "$work/ep_padded.jsonl")" ] &&
    [ "$(step_numbers "$work/ep_padded.jsonl")" != "$(step_numbers "$work/ep_plain.jsonl")" ] &&
    python3 -c "import math,sys; q,f=map(float,sys.argv[1:]); sys.exit(not (math.isfinite(q) and abs(q-f) <= 0.1))" \
        "$(last_loss "$work/ep_padded.jsonl")" "$(last_loss "$work/fp32.jsonl")"; then
    ok router_padding_ep2_alltoall
else
    fail router_padding_ep2_alltoall "$(grep -m1 error "$work/ep_padded.out" "$work/ep_plain.out")"
fi
