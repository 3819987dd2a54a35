#!/usr/bin/env bash
# test_dropout.sh — --hidden-dropout and --attention-dropout (docs/architecture.md, "Dropout")
# on a tiny dense + MoE model, 3 steps: dropout changes training (against p = 0); evaluation
# is unaffected (held-out loss at --lr 0 equal with and without); a rerun and a resume give the
# same losses bit for bit; --recompute-granularity full and selective core_attn equal no
# recompute bit for bit; and under mpirun DP=2, TP=2 with SP (and dense without), EP=2, PP=2 and CP=2 (p2p,
# a2a, allgather) equal one process within 1e-5 (the masks hash global coordinates). p outside [0, 1)
# is refused with one line.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

SMALL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --ffn-hidden-size 64
       --moe-layer-freq [0,1] --lr-warmup-iters 1 --mock-data-tokens 16384 --train-iters 3 --log-interval 1
       --eval-interval 0 --make-vocab-size-divisible-by 256)
DROP=(--hidden-dropout 0.2 --attention-dropout 0.3)

# train NAME FLAGS...: one process, logging $work/NAME.jsonl
train() {
    local name=$1
    shift
    "$M" train "${SMALL[@]}" "$@" --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1 ||
        { fail "$name" "$(tail -1 "$work/$name.log")"; return 1; }
}

train plain && train dropped "${DROP[@]}" && train dropped_again "${DROP[@]}"
if [ -n "$(losses "$work/dropped.jsonl")" ] && [ "$(losses "$work/plain.jsonl")" != "$(losses "$work/dropped.jsonl")" ]; then
    ok dropout_changes_training
else
    fail dropout_changes_training "the same losses with and without dropout"
fi
identical dropout_rerun_identical dropped dropped_again

# evaluation never drops: the held-out loss of the same (frozen) weights with and without
eval_loss() { python3 -c 'import json,sys; print([r["eval_loss"] for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r])' "$1"; }
EVAL=("${FROZEN[@]}" --eval-interval 1 --eval-iters 2)
if train eval_plain "${EVAL[@]}" && train eval_dropped "${EVAL[@]}" "${DROP[@]}"; then
    if [ "$(eval_loss "$work/eval_plain.jsonl")" != "[]" ] &&
        [ "$(eval_loss "$work/eval_plain.jsonl")" = "$(eval_loss "$work/eval_dropped.jsonl")" ]; then
        ok dropout_not_in_evaluation
    else
        fail dropout_not_in_evaluation "$(eval_loss "$work/eval_plain.jsonl") vs $(eval_loss "$work/eval_dropped.jsonl")"
    fi
fi

# a resume at step 2 draws the masks of steps 3 as the uninterrupted run did
if train resume_first "${DROP[@]}" --train-iters 2 --save "$work/resume.ck" &&
    train resume_second "${DROP[@]}" --load "$work/resume.ck" --save "$work/resume.ck"; then
    step3() { losses "$1" | awk '$1 == 3'; }
    if [ -n "$(step3 "$work/dropped.jsonl")" ] && [ "$(step3 "$work/dropped.jsonl")" = "$(step3 "$work/resume_second.jsonl")" ]; then
        ok dropout_resume_identical
    else
        fail dropout_resume_identical "$(step3 "$work/dropped.jsonl") vs $(step3 "$work/resume_second.jsonl")"
    fi
fi

# a recomputed forward draws the forward's masks
train recompute_full "${DROP[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 &&
    identical dropout_recompute_full_identical recompute_full dropped
train recompute_selective "${DROP[@]}" --recompute-granularity selective --recompute-modules core_attn moe layernorm &&
    identical dropout_recompute_selective_identical recompute_selective dropped

expect_error dropout_refuses_one "hidden-dropout must be in" -- "$M" train "${SMALL[@]}" --hidden-dropout 1
expect_error dropout_refuses_negative "attention-dropout must be in" -- "$M" train "${SMALL[@]}" --attention-dropout -0.1

mpi_require dropout_layouts
run_case dropout_dp2 2 -- "${DROP[@]}"
# (the vocabulary is padded to --make-vocab-size-divisible-by x TP: 128 x 2 is one process's 256)
run_case dropout_tp2_sp 2 --tensor-model-parallel-size 2 --make-vocab-size-divisible-by 128 --sequence-parallel -- "${DROP[@]}"
# under the sanitizers DP, TP with SP and the CP ring represent the layouts (mpi_lib.sh: full)
full dropout_tp2_dense run_case dropout_tp2_dense 2 --tensor-model-parallel-size 2 --make-vocab-size-divisible-by 128 -- \
    "${DROP[@]}" --num-experts 0
full dropout_ep2 run_case dropout_ep2 2 --expert-model-parallel-size 2 -- "${DROP[@]}"
full dropout_pp2 run_case dropout_pp2 2 --pipeline-model-parallel-size 2 -- "${DROP[@]}"
run_case dropout_cp2 2 --context-parallel-size 2 -- "${DROP[@]}"
full dropout_cp2_a2a run_case dropout_cp2_a2a 2 --context-parallel-size 2 --cp-comm-type a2a -- "${DROP[@]}"
full dropout_cp2_allgather run_case dropout_cp2_allgather 2 --context-parallel-size 2 --cp-comm-type allgather -- \
    "${DROP[@]}"
