#!/usr/bin/env bash
# test_mtp.sh — multi-token prediction (--mtp-num-layers D, --mtp-loss-scaling-factor F):
# D=2 trains and evaluates with each depth's loss on the console (mtp_1, mtp_2) and in every
# JSONL step record (mtp_1_loss, mtp_2_loss), its checkpoint holding the depths (layers
# num_layers+k, MoE like the last decoder layer) and generating; the logged loss is the
# objective lm_loss + F/D x the depths' sum (without router losses); the depths learn; F=0
# leaves the model as it is without MTP, bit for bit; a resumed run (the depths restored from
# the checkpoint) continues bit for bit; dense depths (last layer dense) train; DP=2, EP=2,
# TP=2 with SP, TP=2 without SP (a dense model), the distributed optimizer, CP=2 (the depths'
# inputs rolled across the ranks' chunks) and PP=2 (the depths on the last stage with their
# copy of the embedding: tied, untied with a layout string's m) give the single-process
# numbers and MTP losses (1e-5, 10 steps); a Hugging Face family without MTP, a factor without
# depths, a negative factor, a negative depth count, another depth count than the
# checkpoint's and m placed outside the loss's stage are refused with one line.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 4
       --global-batch-size 8 --num-experts 4 --moe-ffn-hidden-size 32 --eval-interval 5 --eval-iters 1
       --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536 --train-iters 10
       --make-vocab-size-divisible-by 512)
MTP=(--mtp-num-layers 2)
# no router losses in the objective: loss is lm_loss plus the MTP share alone
NO_AUX=(--moe-aux-loss-coeff 0 --moe-router-load-balancing-type none)
# TP=2 pads the vocabulary to --make-vocab-size-divisible-by x TP: half of SMALL's, the same rows
TP2=(--tensor-model-parallel-size 2 --make-vocab-size-divisible-by 256)

# mtp_numbers FILE: each step's MTP losses of a JSONL log in Python's repr (every bit shows)
mtp_numbers() { python3 -c 'import json,sys; [print(r["step"], repr(r["mtp_1_loss"]), repr(r["mtp_2_loss"])) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1"; }

# mtp_records FILE STEPS: FILE has STEPS step records, each with mtp_1_loss and mtp_2_loss
# (finite) and no mtp_3_loss
mtp_records() {
    python3 -c 'import json,math,sys; r=[d for d in map(json.loads, open(sys.argv[1])) if "loss" in d]; sys.exit(not (len(r) == int(sys.argv[2]) and all(math.isfinite(d.get("mtp_1_loss", math.nan)) and math.isfinite(d.get("mtp_2_loss", math.nan)) and "mtp_3_loss" not in d for d in r)))' "$1" "$2"
}

# depth_tensors CKPT KIND: the checkpoint's model holds layers 2 and 3 (the depths), each with
# eh_proj, enorm, hnorm, shared_head.norm and a KIND (moe: experts and router, dense: one MLP)
# feed-forward, and no layer 4
depth_tensors() {
    python3 - "$1" "$2" <<PY
$SAFETENSORS_PY
import glob, sys
h, _ = header(sorted(glob.glob(sys.argv[1] + "/iter_*/model.safetensors"))[-1])
moe = sys.argv[2] == "moe"
for l in (2, 3):
    p = f"model.layers.{l}."
    need = ["eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "self_attn.q_proj.weight"]
    need += ["mlp.gate.weight", "mlp.experts.3.down_proj.weight"] if moe else ["mlp.down_proj.weight"]
    missing = [n for n in need if p + n not in h]
    if missing: print("layer", l, "lacks", missing); sys.exit()
    if not moe and any(k.startswith(p + "mlp.experts") for k in h): print("layer", l, "has experts"); sys.exit()
if any(k.startswith("model.layers.4.") for k in h): print("a layer 4"); sys.exit()
PY
}

# ---- one process ----
# D=2 trains and evaluates; its checkpoints (steps 5 and 10) serve the resume and generate cases
"$M" train "${SMALL[@]}" "${MTP[@]}" --save "$work/mtp.ck" --save-interval 5 --log-jsonl "$work/mtp.jsonl" \
    >"$work/mtp.log" 2>&1
if grep -q "held-out loss" "$work/mtp.log" && mtp_records "$work/mtp.jsonl" 10 &&
    [ "$(grep -c '^step .* | lm [0-9.]* | mtp_1 [0-9.]* | mtp_2 [0-9.]* |' "$work/mtp.log")" -eq 10 ]; then
    ok mtp_trains
else
    fail mtp_trains "$(tail -2 "$work/mtp.log" | tr '\n' ' ') $(grep -m1 '^step' "$work/mtp.log")"
fi
why=$(depth_tensors "$work/mtp.ck" moe 2>&1)
[ -z "$why" ] && ok mtp_checkpoint_holds_the_depths || fail mtp_checkpoint_holds_the_depths "$why"

# the logged loss is the objective: lm_loss + F/D x (mtp_1 + mtp_2), no router loss
"$M" train "${SMALL[@]}" "${MTP[@]}" "${NO_AUX[@]}" --mtp-loss-scaling-factor 0.5 --log-jsonl "$work/objective.jsonl" \
    >"$work/objective.log" 2>&1
why=$(python3 - "$work/objective.jsonl" <<'PY'
import json, sys
r = [d for d in map(json.loads, open(sys.argv[1])) if "loss" in d]
if len(r) != 10: print(len(r), "step records"); sys.exit()
for d in r:
    want = d["lm_loss"] + 0.5 / 2 * (d["mtp_1_loss"] + d["mtp_2_loss"])
    if abs(d["loss"] - want) > 1e-6 * abs(want): print(f"step {d['step']}: loss {d['loss']!r}, lm + F/D x mtp {want!r}"); sys.exit()
PY
)
[ -z "$why" ] && ok mtp_loss_is_the_objective || fail mtp_loss_is_the_objective "$why $(tail -1 "$work/objective.log")"

# the depths learn the mock data: mtp_1's mean over the last 5 of 40 steps below step 1's
# (40 steps: left to the plain build, mpi_lib.sh's full)
mtp_learns() {
    "$M" train "${SMALL[@]}" "${MTP[@]}" --train-iters 40 --eval-interval 40 --lr 3e-3 --log-jsonl "$work/learn.jsonl" \
        >"$work/learn.log" 2>&1
    local why
    why=$(python3 -c 'import json,sys; l=[r["mtp_1_loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]; print("" if len(l) == 40 and sum(l[-5:]) / 5 < l[0] else f"mtp_1_loss {l[:1]} at step 1, {l[-5:]} at the end")' \
        "$work/learn.jsonl" 2>&1)
    [ -z "$why" ] && ok mtp_learns || fail mtp_learns "$why $(tail -1 "$work/learn.log")"
}

full mtp_learns mtp_learns

# factor 0: the depths are built after the rest of the model and nothing flows back from them,
# so every step's loss, lm loss, gradient norm and the held-out losses are those without MTP
"$M" train "${SMALL[@]}" "${NO_AUX[@]}" --log-jsonl "$work/nomtp.jsonl" >"$work/nomtp.log" 2>&1
"$M" train "${SMALL[@]}" "${NO_AUX[@]}" "${MTP[@]}" --mtp-loss-scaling-factor 0 --log-jsonl "$work/zero.jsonl" \
    >"$work/zero.log" 2>&1
same_as_without() { python3 -c 'import json,sys; [print(r["step"], *(repr(r[k]) for k in ("loss", "lm_loss", "grad_norm", "eval_loss") if k in r)) for r in map(json.loads, open(sys.argv[1]))]' "$1"; }
if [ -n "$(same_as_without "$work/nomtp.jsonl")" ] && mtp_records "$work/zero.jsonl" 10 &&
    cmp -s <(same_as_without "$work/nomtp.jsonl") <(same_as_without "$work/zero.jsonl"); then
    ok mtp_off_leaves_the_model_alone
else
    fail mtp_off_leaves_the_model_alone "$(diff <(same_as_without "$work/nomtp.jsonl") <(same_as_without "$work/zero.jsonl") | head -2 | tr '\n' ' ') $(tail -1 "$work/zero.log")"
fi

# resumed at step 5 without the flag (the depths come from the checkpoint): steps 6-10 and
# their MTP losses bit for bit
"$M" train "${SMALL[@]}" --load "$work/mtp.ck/iter_0000005" --log-jsonl "$work/resumed.jsonl" >"$work/resumed.log" 2>&1
if [ -n "$(step_numbers "$work/resumed.jsonl")" ] && mtp_records "$work/resumed.jsonl" 5 &&
    cmp -s <(step_numbers "$work/resumed.jsonl") <(step_numbers "$work/mtp.jsonl" | tail -n +6) &&
    cmp -s <(mtp_numbers "$work/resumed.jsonl") <(mtp_numbers "$work/mtp.jsonl" | tail -n +6); then
    ok mtp_resumes_bit_for_bit
else
    fail mtp_resumes_bit_for_bit "$(diff <(step_numbers "$work/resumed.jsonl"; mtp_numbers "$work/resumed.jsonl") <(step_numbers "$work/mtp.jsonl" | tail -n +6; mtp_numbers "$work/mtp.jsonl" | tail -n +6) | head -2 | tr '\n' ' ') $(tail -1 "$work/resumed.log")"
fi

# generate reads the MTP checkpoint (and predicts with the decoder alone)
if "$M" generate --load "$work/mtp.ck" --prompt "the cat" --max-new-tokens 4 --temperature 0 >"$work/gen.txt" \
    2>"$work/gen.err" && grep -q "the cat" "$work/gen.txt"; then
    ok mtp_generates
else
    fail mtp_generates "$(tail -1 "$work/gen.err")"
fi

# the last decoder layer dense: the depths are dense layers
"$M" train "${SMALL[@]}" "${MTP[@]}" --moe-layer-freq [1,0] --save "$work/dense.ck" --log-jsonl "$work/dense.jsonl" \
    >"$work/dense.log" 2>&1
why=$(depth_tensors "$work/dense.ck" dense 2>&1)
if grep -q "held-out loss" "$work/dense.log" && mtp_records "$work/dense.jsonl" 10 && [ -z "$why" ]; then
    ok mtp_dense_depths
else
    fail mtp_dense_depths "$why $(tail -1 "$work/dense.log")"
fi

expect_error mtp_layout_count "--pipeline-model-parallel-layout has 1 multi-token-prediction layers (m) but --mtp-num-layers is 2" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|tmL"
expect_error mtp_layout_after_decoders "the multi-token-prediction layers (m) come after every decoder layer" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Etm|mtL"
expect_error mtp_layout_stage "runs the multi-token-prediction layers (m) in the stage of the loss" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|t|mm|L"
expect_error mtp_layout_split "runs the multi-token-prediction layers (m) in the stage of the loss" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|t|m|mL"
# a checkpoint saved before the flag existed (its flags lack the key): its model has no depths
python3 - "$work/mtp.ck/iter_0000005/config.json" "$work/old.ck" <<'PY'
import json, os, shutil, sys, zlib
src, dst = os.path.dirname(sys.argv[1]), sys.argv[2] + "/iter_0000005"
shutil.copytree(src, dst)
cfg = json.load(open(sys.argv[1]))
del cfg["moetron"]["flags"]["mtp-num-layers"]
data = json.dumps(cfg).encode()
open(dst + "/config.json", "wb").write(data)
sums = json.load(open(dst + "/checksums.json"))  # the edited file's own checksum, as a save writes it
sums["files"]["config.json"] = {"bytes": len(data), "crc32": "%08x" % zlib.crc32(data)}
json.dump(sums, open(dst + "/checksums.json", "w"))
open(sys.argv[2] + "/latest_checkpointed_iteration.txt", "w").write("5")
PY
expect_error mtp_older_checkpoint "--mtp-num-layers differs from the checkpoint .*saved before the flag existed" -- \
    "$M" train "${SMALL[@]}" --load "$work/old.ck" --mtp-num-layers 1
expect_error mtp_factor_alone "--mtp-loss-scaling-factor applies to --mtp-num-layers" -- \
    "$M" train "${SMALL[@]}" --mtp-loss-scaling-factor 0.5
expect_error mtp_factor_negative "--mtp-loss-scaling-factor -1 must be >= 0" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --mtp-loss-scaling-factor -1
expect_error mtp_layers_negative "--mtp-num-layers -1 .*range" -- \
    "$M" train "${SMALL[@]}" --mtp-num-layers -1
expect_error mtp_hf_family "--hf-architecture mixtral cannot express this model: multi-token prediction" -- \
    "$M" train "${SMALL[@]}" "${MTP[@]}" --hf-architecture mixtral
expect_error mtp_depths_of_checkpoint "--mtp-num-layers differs from the checkpoint .*(which has 2)" -- \
    "$M" train "${SMALL[@]}" --load "$work/mtp.ck/iter_0000005" --mtp-num-layers 1

# ---- under mpirun ----
# mtp_case NAME RANKS LAYOUT-FLAGS... -- FLAGS...: run_case, then the MTP losses of every step
# equal the single-process run's (1e-5)
mtp_case() {
    local name=$1
    run_case "$@" || return
    mtp_numbers "$ref.jsonl" >"$ref.mtp"
    mtp_numbers "$work/$name.jsonl" >"$work/$name.mtp"
    compare "${name}_mtp_losses" "$ref.mtp" "$work/$name.mtp"
}

# The cases that run under the sanitizers (maybe_full, mpi_lib.sh): DP (the depths' gradients
# summed over ranks) and TP with SP (the depths' tokens split); the others repeat their paths
SANITIZED=" mtp_dp2_equals_single mtp_tp2_sp_equals_single "
mpi_require mtp_mpi
maybe_full mtp_dp2_equals_single mtp_case mtp_dp2_equals_single 2 -- "${MTP[@]}"
maybe_full mtp_tp2_sp_equals_single mtp_case mtp_tp2_sp_equals_single 2 "${TP2[@]}" --sequence-parallel -- "${MTP[@]}"
maybe_full mtp_ep2_equals_single mtp_case mtp_ep2_equals_single 2 --expert-model-parallel-size 2 -- "${MTP[@]}"
# TP without SP takes dense models only (MoE layers need --sequence-parallel): dense depths
maybe_full mtp_tp2_dense_equals_single mtp_case mtp_tp2_dense_equals_single 2 "${TP2[@]}" -- "${MTP[@]}" --num-experts 0
maybe_full mtp_distopt_dp2_equals_single mtp_case mtp_distopt_dp2_equals_single 2 --use-distributed-optimizer -- \
    "${MTP[@]}"
maybe_full mtp_cp2_equals_single mtp_case mtp_cp2_equals_single 2 --context-parallel-size 2 -- "${MTP[@]}"
maybe_full mtp_pp2_equals_single mtp_case mtp_pp2_equals_single 2 --pipeline-model-parallel-size 2 -- "${MTP[@]}"
maybe_full mtp_pp2_untied_layout_equals_single mtp_case mtp_pp2_untied_layout_equals_single 2 \
    --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Et|tmmL" -- "${MTP[@]}" \
    --untie-embeddings-and-output-weights
