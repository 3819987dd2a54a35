#!/usr/bin/env bash
# test_latent_moe.sh — latent MoE (--moe-latent-size L, with a shared expert, aux loss and
# z-loss): trains; its checkpoint is moetron_moe with the latent size in config.json and
# fc1_latent_proj [L,H], fc2_latent_proj [H,L] and L-wide experts; a run resumed from it
# continues bit for bit and generate reads it. Under mpirun EP=2 (alltoall, allgather, the
# shared-expert overlap), TP=2 with SP (the projections' gradients summed over TP), ETP=2,
# CP=2 and PP=2 give the single-process losses, aux losses and gradient norms within 1e-5 over 10
# steps, and the projections' saved weights within 1e-6. A width of 0 or below, a model without experts, upcycling, a Hugging Face family
# (none has latent projections) and another width than the checkpoint's are refused with
# one line. (Its forward and gradients against a torch reference: tests/conformance/latent_moe.py.)
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2 --eval-interval 0 --lr-warmup-iters 2
       --log-interval 1 --mock-data-tokens 65536 --train-iters 10 --global-batch-size 8
       --make-vocab-size-divisible-by 512)
LATENT=(--moe-latent-size 24 --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 0.01
        --moe-z-loss-coeff 0.001)
# TP=2 pads the vocabulary to --make-vocab-size-divisible-by x TP: the same rows as SMALL's
TP2_SP=(--tensor-model-parallel-size 2 --sequence-parallel --make-vocab-size-divisible-by 256)

# ---- one process ----
if "$M" train "${SMALL[@]}" "${LATENT[@]}" --save "$work/latent.ck" --save-interval 5 \
    --log-jsonl "$work/latent.jsonl" >"$work/latent.log" 2>&1 && [ "$(losses "$work/latent.jsonl" | wc -l)" -eq 10 ]; then
    ok latent_trains
else
    fail latent_trains "$(tail -2 "$work/latent.log" | tr '\n' ' ')"
fi
# the checkpoint: moetron's family, the latent size, the projections' and experts' shapes
why=$(python3 - "$work/latent.ck/iter_0000010" <<'PY'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
if cfg["model_type"] != "moetron_moe": print("model_type", cfg["model_type"]); sys.exit()
if cfg["moetron"]["flags"].get("moe-latent-size") != 24: print("moe-latent-size", cfg["moetron"]["flags"].get("moe-latent-size")); sys.exit()
with open(d + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
want = {"model.layers.1.mlp.fc1_latent_proj.weight": [24, 64], "model.layers.1.mlp.fc2_latent_proj.weight": [64, 24],
        "model.layers.1.mlp.experts.3.gate_proj.weight": [32, 24], "model.layers.1.mlp.experts.3.down_proj.weight": [24, 32],
        "model.layers.1.mlp.shared_experts.gate_proj.weight": [32, 64], "model.layers.1.mlp.gate.weight": [4, 64]}
for name, shape in want.items():
    if name not in header or header[name]["shape"] != shape: print(name, header.get(name, {}).get("shape"), "expected", shape); sys.exit()
PY
)
[ -z "$why" ] && ok latent_checkpoint_holds_it || fail latent_checkpoint_holds_it "$why"
# resumed at step 5: steps 6-10 bit for bit; resumed without the flag (the checkpoint says it)
"$M" train "${SMALL[@]}" "${LATENT[@]}" --load "$work/latent.ck/iter_0000005" --log-jsonl "$work/resumed.jsonl" \
    >"$work/resumed.log" 2>&1
same_steps latent_resumes_bit_for_bit "$work/resumed.jsonl" "$work/latent.jsonl" 6 "$work/resumed.log"
"$M" train "${SMALL[@]}" --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 \
    --load "$work/latent.ck/iter_0000005" --log-jsonl "$work/resumed_bare.jsonl" >"$work/resumed_bare.log" 2>&1
same_steps latent_size_from_the_checkpoint "$work/resumed_bare.jsonl" "$work/latent.jsonl" 6 "$work/resumed_bare.log"
if "$M" generate --load "$work/latent.ck" --prompt "the cat" --max-new-tokens 4 --temperature 0 >"$work/gen.txt" \
    2>"$work/gen.err"; then
    ok latent_generates
else
    fail latent_generates "$(tail -1 "$work/gen.err")"
fi

expect_error latent_size_zero "--moe-latent-size must be positive, got 0" -- \
    "$M" train "${SMALL[@]}" --moe-latent-size 0
expect_error latent_size_negative "--moe-latent-size must be positive, got -8" -- \
    "$M" train "${SMALL[@]}" --moe-latent-size -8
expect_error latent_without_experts "--moe-latent-size projects the routed experts' tokens; the model has no experts" -- \
    "$M" train "${SMALL[@]}" --num-experts 0 --moe-latent-size 16
expect_error latent_hf_family "--hf-architecture qwen3_moe cannot express this model: .*latent MoE" -- \
    "$M" train "${SMALL[@]}" --qk-layernorm --hf-architecture qwen3_moe --moe-latent-size 16
expect_error latent_differs_from_checkpoint "--moe-latent-size differs from the checkpoint" -- \
    "$M" train "${SMALL[@]}" "${LATENT[@]}" --load "$work/latent.ck" --moe-latent-size 16 --train-iters 12
expect_error latent_upcycling "--moe-latent-size with --moe-use-upcycling" -- \
    "$M" train "${SMALL[@]}" --load "$work/latent.ck" --moe-use-upcycling --moe-latent-size 24 --train-iters 12

# ---- parallel layouts equal one process ----
mpi_require latent_moe_mpi

# same_projections NAME: the latent projections the last run_case saved are the single-process
# run's within 1e-6 absolute (a gradient left partial over TP moves them far more; the losses
# barely see it)
same_projections() {
    local why
    why=$(python3 - "$work/$1.ck" "$ref.ck" <<'PY'
import glob, sys
import numpy as np
from safetensors.numpy import load_file
a, b = (load_file(sorted(glob.glob(d + "/iter_*/model.safetensors"))[-1]) for d in sys.argv[1:3])
names = [k for k in a if "_latent_proj." in k]
if not names: print("no latent projections saved"); sys.exit()
for k in names:
    d = float(np.abs(a[k] - b[k]).max())
    if not d <= 1e-6: print(f"{k}: max abs difference {d}"); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1_projections" || fail "$1_projections" "$why"
}

# latent_case NAME RANKS LAYOUT-FLAGS...: run_case with LATENT, then its projections
latent_case() {
    run_case "$1" "$2" "${@:3}" -- "${LATENT[@]}" && same_projections "$1"
}

latent_case latent_ep2_alltoall 2 --expert-model-parallel-size 2
latent_case latent_tp2_sp 2 "${TP2_SP[@]}"
latent_case latent_etp2 2 --expert-tensor-parallel-size 2
full latent_ep2_allgather latent_case latent_ep2_allgather 2 --expert-model-parallel-size 2 \
    --moe-token-dispatcher-type allgather
full latent_ep2_shared_overlap latent_case latent_ep2_shared_overlap 2 --expert-model-parallel-size 2 \
    --moe-shared-expert-overlap
full latent_cp2 latent_case latent_cp2 2 --context-parallel-size 2
full latent_pp2 latent_case latent_pp2 2 --pipeline-model-parallel-size 2
