#!/usr/bin/env bash
# test_mixed_precision.sh — --bf16 and --fp16 on the cpu backend, and loss scaling.
#   * bf16: the emulation and the AVX-512 BF16 kernel train bit for bit alike (where the CPU
#     has the instructions); AMX within its accumulation error; bf16 is in effect (the
#     losses differ from fp32) and close to fp32; reruns and resumes are bit-identical; the
#     data- and expert-parallel layouts equal one process within 1e-6 with frozen weights,
#     within 1e-2 training (the 16-bit roundings amplify the layouts' last-bit differences).
#   * a constant power-of-2 loss scale changes nothing bit for bit (every gradient path is
#     scaled and unscaled), which pins the scaling down end to end;
#   * fp16's dynamic loss scaling from 2^32: the first steps overflow and are skipped with
#     the learning-rate schedule held, the scale backs off after --hysteresis overflows, and
#     the run then trains; a resume across overflows is bit-identical to the run straight
#     through (the scaler's state and the held schedule are saved);
#     an overflowing step still updates the expert biases (as Megatron);
#   * the fp32 tiles (AVX-512's, the portable one) train bit for bit alike, fp32 and the
#     bf16 emulation;
#   * bad values and combinations get one error line.
# The scale sequence itself is checked against megatron-core's DynamicGradScaler in
# tests/conformance/megatron_loss_scaler.py.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
      --lr-warmup-iters 1 --lr-decay-iters 10 --mock-data-tokens 16384 --log-interval 1 --eval-interval 0)

weights() { (cd "$1" && find . -name '*.safetensors' | sort | xargs md5sum); }
# scales FILE: step, loss scale and overflow flag of each JSONL record
scales() { python3 -c 'import json,sys; [print(r["step"], r.get("loss_scale"), r.get("overflow", False), r["lr"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1"; }

# run DIR [env...] -- FLAGS...: train, logging DIR/log.jsonl, saving DIR/ck
run() {
    local d=$1 envs=()
    shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    mkdir -p "$d"
    env "${envs[@]}" "$M" train "${TINY[@]}" "$@" --log-jsonl "$d/log.jsonl" --save "$d/ck" >"$d/out" 2>&1
}

# same NAME DIR_A DIR_B: equal steps (every bit) and saved files
same() {
    if [ -n "$(step_numbers "$2/log.jsonl")" ] && [ "$(step_numbers "$2/log.jsonl")" = "$(step_numbers "$3/log.jsonl")" ] &&
        [ "$(weights "$2/ck")" = "$(weights "$3/ck")" ]; then
        ok "$1"
    else
        fail "$1" "steps or saved files differ: $(diff <(step_numbers "$2/log.jsonl") <(step_numbers "$3/log.jsonl") | head -2 | tr '\n' ' ') $(grep -h -m1 error "$2/out" "$3/out")"
    fi
}

# close NAME DIR_A DIR_B RTOL: the same steps, losses and gradient norms within RTOL
close() {
    local why
    why=$(python3 - "$2/log.jsonl" "$3/log.jsonl" "$4" <<'PY'
import json, sys
rows = [[r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3]]
tol = float(sys.argv[3])
if len(rows[0]) != len(rows[1]) or not rows[0]: print(f"{len(rows[0])} vs {len(rows[1])} steps"); sys.exit()
for a, b in zip(*rows):
    for k in ("loss", "lm_loss", "grad_norm"):
        if not abs(a[k] - b[k]) <= tol * max(abs(a[k]), abs(b[k])): print(f"step {a['step']} {k}: {a[k]} vs {b[k]}"); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

# ---- bf16 ---------------------------------------------------------------------------------
run "$work/fp32" -- --train-iters 10 || true
run "$work/bf16" -- --train-iters 10 --bf16 || true
run "$work/bf16_again" -- --train-iters 10 --bf16 || true
run "$work/bf16_emulated" MOETRON_GEMM_BF16=emulated -- --train-iters 10 --bf16 || true
run "$work/bf16_avx512" MOETRON_GEMM_BF16=avx512-bf16 -- --train-iters 10 --bf16 || true
run "$work/bf16_portable" MOETRON_GEMM_BF16=portable -- --train-iters 10 --bf16 || true
same mixed_bf16_rerun_identical "$work/bf16" "$work/bf16_again"
# the fp32 tiles (AVX-512's where the CPU has it, the portable one) give the same bits, so do the
# emulation's on each
run "$work/fp32_portable" MOETRON_GEMM_FP32=portable -- --train-iters 10 || true
run "$work/bf16_emulated_portable" MOETRON_GEMM_BF16=emulated MOETRON_GEMM_FP32=portable -- --train-iters 10 --bf16 || true
grep -q "(gemm: portable fp32)" "$work/fp32_portable/out" && ok mixed_fp32_portable_named ||
    fail mixed_fp32_portable_named "banner: $(grep -o '(gemm: [^)]*)' "$work/fp32_portable/out")"
same mixed_fp32_tiles_identical "$work/fp32" "$work/fp32_portable"
same mixed_bf16_emulation_tiles_identical "$work/bf16_emulated" "$work/bf16_emulated_portable"
kernel=$(sed -n 's/.*(gemm: \([^)]*\)).*/\1/p' "$work/bf16_avx512/out")
if [ "$kernel" = "bf16 avx512-bf16" ]; then
    same mixed_bf16_avx512_is_the_emulation "$work/bf16_emulated" "$work/bf16_avx512"
elif [ "$kernel" = "bf16 emulated" ]; then
    echo "     (no AVX-512 BF16 here: both runs are the emulation)"
    same mixed_bf16_avx512_is_the_emulation "$work/bf16_emulated" "$work/bf16_avx512"
else
    fail mixed_bf16_avx512_is_the_emulation "banner names the GEMM '$kernel'"
fi
# portable: each orientation on the faster (measured) of AVX-512 BF16 and the emulation, never AMX
portable_kernel=$(sed -n 's/.*(gemm: \([^)]*\)).*/\1/p' "$work/bf16_portable/out")
case "$portable_kernel" in
"bf16 avx512-bf16" | "bf16 emulated" | "bf16 NN "*) same mixed_bf16_portable_is_the_emulation "$work/bf16_emulated" \
    "$work/bf16_portable" ;;
*) fail mixed_bf16_portable_is_the_emulation "banner names the GEMM '$portable_kernel'" ;;
esac
default_kernel=$(sed -n 's/.*(gemm: \([^)]*\)).*/\1/p' "$work/bf16/out")
case "$default_kernel" in
"bf16 amx") close mixed_bf16_amx_near_the_emulation "$work/bf16_emulated" "$work/bf16" 1e-3 ;;
"bf16 avx512-bf16" | "bf16 emulated" | "bf16 NN "*) same mixed_bf16_default_kernel "$work/bf16_emulated" "$work/bf16" ;;
*) fail mixed_bf16_default_kernel "banner names the GEMM '$default_kernel'" ;;
esac
# in effect (the losses move off fp32's after the first step) and close to fp32
why=$(python3 - "$work/fp32/log.jsonl" "$work/bf16/log.jsonl" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:])
if len(a) != 10 or len(b) != 10: print(f"{len(a)} / {len(b)} steps"); sys.exit()
if all(x["loss"] == y["loss"] for x, y in zip(a, b)): print("bf16 gave fp32's losses: not in effect"); sys.exit()
# bf16 inputs carry 8 significant bits: a relative rounding of 2^-9 per operand, which
# averages out over the sums; 10 steps of this model move the loss by well under 1%
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
if worst > 0.01: print(f"bf16 strays {worst:.4f} from fp32")
PY
)
[ -z "$why" ] && ok mixed_bf16_near_fp32 || fail mixed_bf16_near_fp32 "$why"
# The experts' gate and up projections kept as bf16, as Megatron's bf16 GEMMs return them (the
# default; MOETRON_ACTIVATIONS=gemm-inputs keeps them fp32): in effect (other steps) and within
# the rounding of those values (1e-3 over the 10 steps; measured ~1e-5 here).
run "$work/bf16_gemm_inputs" MOETRON_ACTIVATIONS=gemm-inputs -- --train-iters 10 --bf16 || true
if [ "$(step_numbers "$work/bf16/log.jsonl")" != "$(step_numbers "$work/bf16_gemm_inputs/log.jsonl")" ]; then
    ok mixed_bf16_gate_up_in_effect
else
    fail mixed_bf16_gate_up_in_effect "gate and up kept fp32 gave the same steps"
fi
close mixed_bf16_gate_up_near_kept_fp32 "$work/bf16_gemm_inputs" "$work/bf16" 1e-3
# The residual stream kept bf16 as Megatron keeps it (the default; --fp32-residual-connection keeps
# it fp32): in effect and within the rounding of those values (measured ~3e-5 over the 10 steps).
run "$work/bf16_fp32_residual" -- --train-iters 10 --bf16 --fp32-residual-connection || true
if [ -n "$(step_numbers "$work/bf16/log.jsonl")" ] &&
    [ "$(step_numbers "$work/bf16/log.jsonl")" != "$(step_numbers "$work/bf16_fp32_residual/log.jsonl")" ]; then
    ok mixed_bf16_residual_in_effect
else
    fail mixed_bf16_residual_in_effect "--fp32-residual-connection gave the same steps"
fi
close mixed_bf16_residual_near_fp32 "$work/bf16_fp32_residual" "$work/bf16" 1e-3

run "$work/bf16_first" -- --train-iters 5 --bf16 && run "$work/bf16_second" -- --train-iters 10 --bf16 --load "$work/bf16_first/ck" || true
if [ "$(step_numbers "$work/bf16/log.jsonl" | tail -5)" = "$(step_numbers "$work/bf16_second/log.jsonl")" ] &&
    [ "$(weights "$work/bf16/ck")" = "$(weights "$work/bf16_second/ck")" ]; then
    ok mixed_bf16_resume_exact
else
    fail mixed_bf16_resume_exact "resumed steps or saved files differ: $(grep -h -m1 error "$work"/bf16_*/out)"
fi

# a constant power-of-2 loss scale: exact scaling and unscaling, the same bits
run "$work/bf16_scaled" -- --train-iters 10 --bf16 --loss-scale 1024 || true
if [ "$(step_numbers "$work/bf16/log.jsonl")" = "$(step_numbers "$work/bf16_scaled/log.jsonl")" ] &&
    grep -q '"loss_scale":1024' "$work/bf16_scaled/log.jsonl" && grep -q "loss scaling: constant, scale 1024" "$work/bf16_scaled/out"; then
    ok mixed_constant_scale_exact
else
    fail mixed_constant_scale_exact "--loss-scale 1024 changed the steps: $(diff <(step_numbers "$work/bf16/log.jsonl") <(step_numbers "$work/bf16_scaled/log.jsonl") | head -2 | tr '\n' ' ')"
fi

# ---- fp16 with dynamic loss scaling ----------------------------------------------------------
# from 2^25 this model's scaled gradients overflow fp16 (65504) for five steps
FP16=(--fp16 --initial-loss-scale 33554432)
run "$work/fp16" -- --train-iters 10 "${FP16[@]}" || true
why=$(python3 - "$work/fp16/log.jsonl" "$work/fp32/log.jsonl" <<'PY'
import json, math, sys
f, g = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:])
if len(f) != 10: print(f"{len(f)} steps"); sys.exit()
overflow = [bool(r.get("overflow")) for r in f]
# from 2^25 the scaled gradients overflow fp16 (65504) at first: a run of skipped steps
first = overflow.index(False) if False in overflow else len(f)
if first == 0 or first > 8: print(f"overflows {overflow}: expected the first steps to overflow, then training"); sys.exit()
if any(bool(r.get("skipped")) != o for r, o in zip(f, overflow)): print("skipped steps are not the overflowing ones"); sys.exit()
# the scale follows the rules (hysteresis 2, window 1000): an overflow takes one from the
# hysteresis count and halves the scale once it is spent; a step logs the scale after that
scale, hysteresis = 2.0**25, 2
for r, o in zip(f, overflow):
    if o:
        hysteresis -= 1
        if hysteresis <= 0: scale = max(scale / 2, 1.0)
    if r["loss_scale"] != scale: print(f"step {r['step']}: scale {r['loss_scale']}, expected {scale}"); sys.exit()
# the learning rate does not advance on skipped steps: each step that trains has the
# schedule's value for the steps that trained before it
done = 0
for r, o in zip(f, overflow):
    if r["lr"] != g[done]["lr"]: print(f"step {r['step']}: lr {r['lr']}, expected {g[done]['lr']}"); sys.exit()
    done += not o
trained = [r for r, o in zip(f, overflow) if not o]
if not all(math.isfinite(r["grad_norm"]) for r in trained) or not trained[-1]["loss"] < trained[0]["loss"]:
    print(f"after the overflows it does not train: {[r['loss'] for r in trained]}")
PY
)
[ -z "$why" ] && ok mixed_fp16_dynamic_scaling || fail mixed_fp16_dynamic_scaling "$why $(grep -h -m1 error "$work/fp16/out")"

# an overflowing step skips the optimizer but not the expert biases' update from its token
# counts (Megatron makes it while reducing the gradients, before looking for an overflow):
# after one such step each bias is ±rate (0 where an expert met the mean exactly), not all 0
run "$work/fp16_bias" -- --train-iters 1 "${FP16[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
    --moe-router-bias-update-rate 0.001 || true
why=$(python3 - "$work/fp16_bias" <<'PY'
import json, struct, sys
import numpy as np
d = sys.argv[1]
rows = [r for r in map(json.loads, open(d + "/log.jsonl")) if "loss" in r]
if len(rows) != 1 or not rows[0].get("overflow") or not rows[0].get("skipped"): print("step 1 did not overflow"); sys.exit()
f = open(d + "/ck/iter_0000001/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
data = f.read()
biases = [np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
          for k, v in h.items() if k.endswith("e_score_correction_bias")]
if not biases: print("no expert bias saved"); sys.exit()
for b in biases:
    if not np.isin(b, np.float32([-0.001, 0, 0.001])).all() or not b.any(): print("expert bias after the overflow", b)
PY
) || why="python3 failed (numpy, the log or the checkpoint missing)"
[ -z "$why" ] && ok mixed_fp16_overflow_updates_expert_bias || fail mixed_fp16_overflow_updates_expert_bias "$why $(grep -h -m1 error "$work/fp16_bias/out")"

# a resume in the middle of the overflows (after step 2: the hysteresis spent once, the
# schedule held twice) and one after them
for cut in 2 7; do
    run "$work/fp16_first_$cut" -- --train-iters "$cut" "${FP16[@]}" &&
        run "$work/fp16_second_$cut" -- --train-iters 10 "${FP16[@]}" --load "$work/fp16_first_$cut/ck" || true
    if [ "$(step_numbers "$work/fp16/log.jsonl" | tail -$((10 - cut)))" = "$(step_numbers "$work/fp16_second_$cut/log.jsonl")" ] &&
        [ "$(scales "$work/fp16/log.jsonl" | tail -$((10 - cut)))" = "$(scales "$work/fp16_second_$cut/log.jsonl")" ] &&
        [ "$(weights "$work/fp16/ck")" = "$(weights "$work/fp16_second_$cut/ck")" ]; then
        ok "mixed_fp16_resume_after_$cut"
    else
        fail "mixed_fp16_resume_after_$cut" "resumed steps, scales or saved files differ: $(grep -h -m1 error "$work"/fp16_*_$cut/out)"
    fi
done

# ---- layouts: data- and expert-parallel runs equal one process --------------------------------
# Frozen weights (--lr 0), within 1e-6: every micro-batch's forward and backward is then the
# one-process computation and only the sums of gradients over micro-batches and ranks differ
# in their last bits (measured: at most 1.2e-8 over 8 seeds, AMX and the emulation).
# Training, within 1e-2: those last bits reach the weights, and once two runs' weights
# differ by an fp32 ulp, the 16-bit rounding of a GEMM input sometimes lands on the other
# side of a rounding boundary (about one weight or activation in 2^16 for bf16), moving that
# input by 2^-8 of itself, and a token near a tie may then pick another expert; from there
# the run follows a neighbouring curve. Measured over 10 steps, seeds 1-8, data and expert
# parallel: up to 1.0e-3 (fp32 layouts of the same model: at most 1.4e-7). The frozen cases
# are the sharp ones; the training ones hold each layout's updates to one process's.
mpi_require mixed_precision_mpi
SMALL=("${TINY[@]}" --train-iters 10)
CASE_RTOL=1e-6
full mixed_bf16_dp2_frozen run_case mixed_bf16_dp2_frozen 2 -- --seed 3 --bf16 "${FROZEN[@]}"
run_case mixed_bf16_ep2_frozen 2 --expert-model-parallel-size 2 -- --seed 3 --bf16 "${FROZEN[@]}"
# tensor- and sequence-parallel with a dense layer and a shared expert: their column-parallel
# gate and up kept bf16 (measured 2e-6: the row-parallel GEMMs' sums split over the ranks)
CASE_RTOL=1e-5
# (and with the residual stream kept bf16, a sum a last bit apart sometimes rounds to the other
# bf16 neighbour: measured 4e-6, here and in a dense model without sequence parallelism)
run_case mixed_bf16_tp2_dense_frozen 2 --tensor-model-parallel-size 2 --make-vocab-size-divisible-by 256 -- \
    --seed 3 --bf16 --num-experts 0 --make-vocab-size-divisible-by 512 "${FROZEN[@]}"
run_case mixed_bf16_tp2_sp_frozen 2 --tensor-model-parallel-size 2 --sequence-parallel \
    --make-vocab-size-divisible-by 256 -- --seed 3 --bf16 --make-vocab-size-divisible-by 512 --moe-layer-freq "[0,1]" \
    --moe-shared-expert-intermediate-size 64 "${FROZEN[@]}"
# a MoE layer's ln2 kept bf16 (the default) read by the allgather dispatcher's gather (as kept),
# the shared expert's gate, and latent MoE's projection
CASE_RTOL=1e-6
run_case mixed_bf16_ep2_allgather_frozen 2 --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather -- \
    --seed 3 --bf16 --moe-shared-expert-intermediate-size 64 --moe-shared-expert-gate "${FROZEN[@]}"
run_case mixed_bf16_ep2_latent_frozen 2 --expert-model-parallel-size 2 -- --seed 3 --bf16 --moe-latent-size 32 \
    "${FROZEN[@]}"
# the residual stream kept bf16 passed between pipeline stages as kept (virtual stages too)
run_case mixed_bf16_pp2_frozen 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 -- \
    --seed 3 --bf16 --num-layers 4 --global-batch-size 8 "${FROZEN[@]}"
# ... and split over context-parallel ranks, within 1e-3 even with frozen weights: the ring's key
# blocks round their own probabilities to bf16 for P·V (each relative to its block's partial
# softmax), so the attention's output differs from one process's in its last bits (measured: loss
# 4.7e-6, gradient norm 5.9e-5 with the stream fp32), and a residual sum a last bit apart sometimes
# rounds to the neighbouring bf16 value (2^-8 of itself): measured 1.1e-5 / 2.8e-4 over 10 steps.
CASE_RTOL=1e-3
run_case mixed_bf16_cp2_frozen 2 --context-parallel-size 2 -- --seed 3 --bf16 "${FROZEN[@]}"
CASE_RTOL=1e-6
run_case mixed_fp16_ep2_frozen 2 --expert-model-parallel-size 2 -- --seed 3 --fp16 --initial-loss-scale 4096 "${FROZEN[@]}"
CASE_RTOL=1e-2
full mixed_bf16_dp2 run_case mixed_bf16_dp2 2 -- --seed 3 --bf16
run_case mixed_bf16_ep2 2 --expert-model-parallel-size 2 -- --seed 3 --bf16
# With --bf16 the rows the experts' ranks receive and their output gradients travel as bf16
# (only bf16-input GEMMs read them): the same bits as fp32 rows at fewer bytes — two of the
# four row exchanges halved, 0.72-0.80 of the fp32 bytes per step here (the others: the probs,
# the counts; a rank sends its own rows one way, the rows it received the other).
bf16_exchange_exact mixed_bf16_ep2_rows_exact 2 expert_bytes 0.65 0.85 --expert-model-parallel-size 2 --seed 3
# With --bf16 the routed experts keep their input rows and SwiGLU output as bf16 (only their
# bf16-input GEMMs read them): with MOETRON_ACTIVATIONS=gemm-inputs (those alone), the same bits as
# keeping them fp32 (MOETRON_ACTIVATIONS=fp32), in the layer's own buffers (one process) and in the
# exchange's (the rows travel as kept), with the recomputation's shared one.
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_act_kept_bf16 1 - 0 1 --seed 3
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_act_kept_bf16_ep2 2 - 0 1 --seed 3 \
    --expert-model-parallel-size 2 --recompute-granularity selective --recompute-modules moe_act
# ... and every other SwiGLU output: a dense first layer's and a shared expert's (one GEMM per
# FFN, gemm_stored)
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_act_kept_bf16_dense 1 - 0 1 --seed 3 \
    --moe-layer-freq "[0,1]" --moe-shared-expert-intermediate-size 64
# ... and the norms' outputs only GEMMs read (every layer's ln1, a dense layer's ln2), gathered
# as kept under sequence parallelism, recomputed into the buffers every layer shares, and read
# by Multi-Latent Attention's projections
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_norms_kept_bf16_tp2_sp 2 - 0 1 --seed 3 \
    --tensor-model-parallel-size 2 --sequence-parallel --moe-layer-freq "[0,1]" \
    --moe-shared-expert-intermediate-size 64 --recompute-granularity selective --recompute-modules layernorm
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_norms_kept_bf16_mla 1 - 0 1 --seed 3 \
    --multi-latent-attention --kv-lora-rank 16 --q-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8 \
    --v-head-dim 12
# ... and the attention's q, k, v (only the attention core's GEMMs read them): after QK-norm,
# --clip-qkv and RoPE, grouped heads split over TP=2, attention dropout, the core recomputed
bf16_matches_fp32 MOETRON_ACTIVATIONS=gemm-inputs mixed_bf16_qkv_kept_bf16_tp2 2 - 0 1 --seed 3 \
    --tensor-model-parallel-size 2 --sequence-parallel --group-query-attention --num-query-groups 2 --qk-layernorm \
    --clip-qkv 0.5 --attention-dropout 0.1 --recompute-granularity selective --recompute-modules core_attn
full mixed_fp16_ep2 run_case mixed_fp16_ep2 2 --expert-model-parallel-size 2 -- --seed 3 --fp16 --initial-loss-scale 4096
unset CASE_RTOL

# ... at half the memory: `moetron plan` counts rows x (I + H) x 2 bytes less per MoE layer (2048
# rows of 512 + 256 here: 3 MiB a layer) and every layer's q, k, v (1024 tokens x 3 x 256: 1.5 MiB a
# layer; their fp32 values pass through the backward's d_q, d_k, d_v, which cost nothing more), the SwiGLU output once with moe_act recomputed (one buffer
# every layer shares), and the SwiGLU output in the exchange's bound of rows under EP=2 (4096 rows
# a layer; the received rows land in the back half of their buffer); besides, the backward's gate
# and up gradients (one workspace of the largest FFN's rows x I each: 2048 x 512, 2 MiB each; under
# EP=2 the exchange's, 4096 rows: 4 MiB each), every layer's ln1 (1024 tokens x 256: 0.5 MiB a
# layer; a MoE layer's ln2 stays fp32 here: its router reads it, below) and, without expert parallelism, the
# experts' output rows' gradients (one workspace of 2048 x 256: 1 MiB; under EP the exchange's stay fp32)
# and the final norm (1024 x 256: 0.5 MiB).
PLAN=(--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --micro-batch-size 4
      --global-batch-size 8 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --vocab-size 1024 --bf16)
# plan_saving COLUMN FLAGS...: that column (8: activations, 7: expert exchange, MiB) of rank 0's row of
# `moetron plan FLAGS` with MOETRON_ACTIVATIONS=$KEPT, minus the same with MOETRON_ACTIVATIONS=$BASE
plan_saving() {
    local column=$1
    shift
    python3 - "$column" <(MOETRON_ACTIVATIONS=$KEPT "$M" plan "${PLAN[@]}" "$@") \
        <(MOETRON_ACTIVATIONS=$BASE "$M" plan "${PLAN[@]}" "$@") <<'PY'
import sys
col = int(sys.argv[1])
kept, fp32 = (float(next(l for l in open(p) if l.startswith("| 0")).split("|")[col]) for p in sys.argv[2:4])
print(f"{fp32 - kept:.1f}")
PY
}
check_saving() {
    local name=$1 want=$2 got
    shift 2
    got=$(plan_saving "$@")
    [ "$got" = "$want" ] && ok "$name" || fail "$name" "the plan saves $got MiB, expected $want"
}
KEPT=gemm-inputs BASE=fp32
check_saving mixed_bf16_act_plan 15.5 8
check_saving mixed_bf16_act_plan_recompute 13.5 8 --recompute-granularity selective --recompute-modules moe_act
check_saving mixed_bf16_act_plan_ep2 16.0 6 --world-size 2 --expert-model-parallel-size 2
# the norms recomputed: the two ln1 are one buffer every layer shares (0.5 MiB saved, not 1; the MoE
# layers' ln2 share an fp32 one); with sequence parallelism over TP=2 a rank keeps its half of every
# ln1 and the gathered whole (0.25 + 0.5 MiB a layer, and of the final norm), its 512 tokens' expert
# rows (half of the above: 1.5 MiB a layer, 2.5 MiB of gradients) and its heads' q, k, v (0.75 MiB a
# layer)
check_saving mixed_bf16_act_plan_norms_recompute 15.0 8 --recompute-granularity selective \
    --recompute-modules layernorm
check_saving mixed_bf16_act_plan_norms_sp 9.3 8 --world-size 2 --tensor-model-parallel-size 2 --sequence-parallel
# a dense first layer (1024 tokens x 512: 1 MiB, and its ln2: 0.5 MiB) and a shared expert of 512
# (1 MiB) besides the MoE layer's 3 MiB, the gradients' 5 MiB, the two ln1, the two q, k, v and the
# final norm
check_saving mixed_bf16_act_plan_dense 15.0 8 --moe-layer-freq "[0,1]" --ffn-hidden-size 512 \
    --moe-shared-expert-intermediate-size 512
# the cuda backend keeps them fp32: a plan for it saves nothing
check_saving mixed_bf16_act_plan_cuda 0.0 8 --device cuda
# As Megatron keeps them (the default): the gate and up projections, rows x I x 2 x 2 bytes less per
# MoE layer (2048 x 512: 4 MiB a layer), the same with moe_act recomputed, 4096 rows a layer in the
# exchange's bound under EP=2, and a dense layer's and a shared expert's (1024 tokens x 512: 2 MiB
# each); the attention's output and a MoE layer's ln2 (1024 tokens x 256: 0.5 MiB a layer each; with
# core_attn recomputed one output buffer every layer shares); the residual stream (every layer's
# input and x_mid, 0.5 MiB each, and the last layer's output: 2.5 MiB).
KEPT="" BASE=gemm-inputs
check_saving mixed_bf16_megatron_plan 12.5 8
check_saving mixed_bf16_megatron_plan_moe_act 12.5 8 --recompute-granularity selective --recompute-modules moe_act
check_saving mixed_bf16_megatron_plan_ep2 16.0 6 --world-size 2 --expert-model-parallel-size 2
check_saving mixed_bf16_megatron_plan_dense 12.0 8 --moe-layer-freq "[0,1]" --ffn-hidden-size 512 \
    --moe-shared-expert-intermediate-size 512
check_saving mixed_bf16_megatron_plan_core_attn 12.0 8 --recompute-granularity selective --recompute-modules core_attn
# with context parallelism the attention's output stays fp32 (its merges sum fp32 partial outputs):
# a rank's 512 tokens' gate and up, ln2 and residual stream
check_saving mixed_bf16_megatron_plan_cp2 5.8 8 --world-size 2 --context-parallel-size 2
# --moe-input-jitter-eps keeps a MoE layer's ln2 fp32 (the jitter multiplies fp32 values)
check_saving mixed_bf16_megatron_plan_jitter 11.5 8 --moe-input-jitter-eps 0.01
check_saving mixed_bf16_megatron_plan_cuda 0.0 8 --device cuda
# --fp32-residual-connection keeps the stream fp32: 2.5 MiB more than the default
check_saving mixed_bf16_megatron_plan_fp32_residual 10.0 8 --fp32-residual-connection
expect_error mixed_bf16_act_env_typo "MOETRON_ACTIVATIONS=FP32: use gemm-inputs or fp32 (or unset it)" -- \
    env MOETRON_ACTIVATIONS=FP32 "$M" plan "${PLAN[@]}"

# ---- bad input ------------------------------------------------------------------------------
expect_error mixed_bf16_and_fp16 "--bf16 and --fp16: use one of them" -- "$M" train "${TINY[@]}" --train-iters 1 --bf16 --fp16
expect_error mixed_loss_scale_alone "--loss-scale 8 needs --fp16, --bf16 or --use-distributed-optimizer" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --loss-scale 8
expect_error mixed_min_above_initial "--min-loss-scale 100: use a positive scale no larger than --initial-loss-scale 10" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --fp16 --initial-loss-scale 10 --min-loss-scale 100
expect_error mixed_window_fraction "--loss-scale-window 2.5: use a whole number of steps" -- \
    "$M" train "${TINY[@]}" --train-iters 1 --fp16 --loss-scale-window 2.5
expect_error mixed_hysteresis_zero "hysteresis" -- "$M" train "${TINY[@]}" --train-iters 1 --fp16 --hysteresis 0
expect_error mixed_bf16_kernel_env "MOETRON_GEMM_BF16=fast: use amx, portable, avx512-bf16 or emulated" -- \
    env MOETRON_GEMM_BF16=fast "$M" train "${TINY[@]}" --train-iters 1 --bf16
expect_error mixed_fp32_kernel_env "MOETRON_GEMM_FP32=fast: use avx512 or portable" -- \
    env MOETRON_GEMM_FP32=fast "$M" train "${TINY[@]}" --train-iters 1
