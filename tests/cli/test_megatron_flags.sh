#!/usr/bin/env bash
# test_megatron_flags.sh — the Megatron-LM flags of its MoE example scripts: every no-op flag
# of `moetron flags` changes no bit of a run; every refused flag and value stops with one
# line; --finetune, --no-load-optim, --no-load-rng, --lr-warmup-fraction, the sample-based
# schedule flags, --split's forms and --moe-layer-freq's expressions do what Megatron does.
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 32 --eval-interval 0 --lr-warmup-iters 2
      --mock-data-tokens 65536 --peak-tflops 1)

run() {  # NAME flags...: a tiny run logging to $work/NAME.jsonl (a resumed one saves to $work/NAME.save,
         # not into the checkpoint it loads)
    local name=$1
    shift
    "$M" train "${TINY[@]}" --log-jsonl "$work/$name.jsonl" --save "$work/$name.save" "$@" >"$work/$name.log" 2>&1 ||
        fail "$name" "run failed: $(tail -1 "$work/$name.log")"
}

# differ NAME A B: the JSONL logs A and B differ (the flag under test did something)
differ() {
    if [ "$(step_numbers "$2")" != "$(step_numbers "$3")" ]; then ok "$1"; else fail "$1" "the runs are identical"; fi
}

# lr_of FILE STEP: the learning rate a JSONL log records for STEP
lr_of() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get("step") == int(sys.argv[2]) and "lr" in d: print(repr(d["lr"]))' "$1" "$2"; }

# flag_rows STATUS: "name<TAB>default" of every flag of that status in `moetron flags`
flag_rows() { "$M" flags | awk -F' \\| ' -v s="$1" '$4 == s { sub(/^\| `--/, "", $1); sub(/`$/, "", $1); print $1 "\t" $3 }'; }

# ---- no-op flags: all at once, no bit changes ----------------------------------------------------
noops=(--moe-token-dispatcher-type flex)
while IFS=$'\t' read -r name default; do
    case $default in
        on | off) noops+=("--$name") ;;
        "(any)") noops+=("--$name" 1) ;;
        *) noops+=("--$name" "$default") ;;
    esac
done < <(flag_rows no-op)
[ "${#noops[@]}" -gt 60 ] || fail noop_flags_listed "only ${#noops[@]} words from moetron flags"
run plain --train-iters 3
run noops --train-iters 3 "${noops[@]}" --transformer-impl local --attention-backend unfused
same_steps noop_flags_change_nothing "$work/noops.jsonl" "$work/plain.jsonl" 1 "$work/noops.log"

# ---- refused: every unsupported flag, every no-op flag given another value -------------------------
while IFS=$'\t' read -r name default; do
    case $default in
        on | off) expect_error "unsupported_$name" "--$name is not supported: " -- "$M" train "--$name" ;;
        *) expect_error "unsupported_$name" "--$name is not supported: " -- "$M" train "--$name" 7 ;;
    esac
done < <(flag_rows "not supported")
while IFS=$'\t' read -r name default; do
    case $default in
        on | off | "(any)") continue ;;
        [0-9]*) bad=12345 ;;
        *) bad=bogus ;;
    esac
    expect_error "refused_value_$name" "--$name $bad is not supported; give " -- "$M" train "--$name" "$bad"
done < <(flag_rows no-op)
expect_error refused_layernorm "--normalization LayerNorm is not supported" -- "$M" train --normalization LayerNorm
expect_error refused_no_swiglu "--no-swiglu: moetron's MLPs and experts are always SwiGLU" -- "$M" train --no-swiglu
expect_error refused_flex_backend_alone "--moe-flex-dispatcher-backend applies to --moe-token-dispatcher-type flex" \
    -- "$M" train --moe-flex-dispatcher-backend deepep
expect_error refused_fraction_with_iters "--lr-warmup-fraction excludes --lr-warmup-iters" \
    -- "$M" train --lr-warmup-fraction 0.1 --lr-warmup-iters 3
expect_error refused_samples_with_iters "--train-iters and --train-samples exclude each other" \
    -- "$M" train --train-samples 100 --train-iters 3
expect_error refused_iters_schedule_with_samples "give --lr-warmup-samples" \
    -- "$M" train --train-samples 100 --lr-decay-iters 3
expect_error refused_samples_schedule_alone "go with --train-samples" -- "$M" train --lr-decay-samples 100
expect_error refused_split_sign "--split '98,-2,0': expected non-negative" -- "$M" train --split 98,-2,0
expect_error refused_layer_freq_expression "--moe-layer-freq \[0\]\*3+\[2\]: list entries must be 0 or 1" \
    -- "$M" train --num-layers 4 --moe-layer-freq "[0]*3+[2]"

# ---- the schedule: --lr-warmup-fraction, --lr-warmup-init, sample-based runs -----------------------
run warm_iters --train-iters 4 --lr-warmup-iters 2
run warm_fraction --train-iters 4 --lr-warmup-iters 0 --lr-warmup-fraction 0.5
same_steps warmup_fraction_of_decay_iters "$work/warm_fraction.jsonl" "$work/warm_iters.jsonl"
run warm_samples --train-samples 19 --lr-warmup-iters 0 --lr-warmup-samples 8 --lr-decay-samples 16
same_steps samples_schedule_equals_iterations "$work/warm_samples.jsonl" "$work/warm_iters.jsonl"
# fractional warmup (1.5 steps from 6 samples) and --lr-warmup-init, as Megatron's scheduler counts samples
run warm_init --train-samples 16 --lr-warmup-iters 0 --lr-warmup-samples 6 --lr-warmup-init 0.001 --lr 0.003 --min-lr 0
got="$(lr_of "$work/warm_init.jsonl" 1) $(lr_of "$work/warm_init.jsonl" 2)"
want=$(python3 -c 'print(repr(0.001), repr(0.001 + (0.003 - 0.001) * 1.0 / 1.5))')
[ "$got" = "$want" ] && ok warmup_init_and_fractional_samples || fail warmup_init_and_fractional_samples "lr $got, want $want"

# ---- --split: Megatron's forms read alike ------------------------------------------------------------
TEXT=(--train-iters 2 --eval-interval 2 --eval-iters 1)
run split_commas "${TEXT[@]}" --split 90,10,0
run split_slashes "${TEXT[@]}" --split "90/10/0"
run split_spaces "${TEXT[@]}" --split "'90 10'"
run split_other "${TEXT[@]}" --split 50,50,0
same_steps split_slashes "$work/split_slashes.jsonl" "$work/split_commas.jsonl"
same_steps split_spaces_quotes_missing_part "$work/split_spaces.jsonl" "$work/split_commas.jsonl"
if [ "$(grep -o '"eval_loss":[^,]*' "$work/split_commas.jsonl")" != "$(grep -o '"eval_loss":[^,]*' "$work/split_other.jsonl")" ] &&
   [ "$(grep -o '"eval_loss":[^,]*' "$work/split_commas.jsonl")" = "$(grep -o '"eval_loss":[^,]*' "$work/split_slashes.jsonl")" ]; then
    ok split_changes_validation
else
    fail split_changes_validation "$(grep -o '"eval_loss":[^,]*' "$work/split_commas.jsonl" "$work/split_other.jsonl" | tr '\n' ' ')"
fi

# ---- --moe-layer-freq: Megatron's Python list expressions -------------------------------------------
run freq_list --train-iters 2 --num-layers 4 --moe-layer-freq "[0,1,1,0]"
run freq_expression --train-iters 2 --num-layers 4 --moe-layer-freq "([0]+[1]*2)*1+[0]"
same_steps layer_freq_expression "$work/freq_expression.jsonl" "$work/freq_list.jsonl"

# ---- --load: --finetune, --no-load-optim, --no-load-rng --------------------------------------------
run base --train-iters 3
mv "$work/base.save" "$work/base"
run resume --train-iters 6 --load "$work/base"
run no_optim --train-iters 6 --load "$work/base" --no-load-optim
run finetune --train-iters 3 --load "$work/base" --finetune
# --finetune's logs are its own: without --log-jsonl it leaves the loaded run's log alone
"$M" train "${TINY[@]}" --train-iters 3 --load "$work/base" --finetune --save "$work/ft_own_log" >"$work/ft_own_log.log" 2>&1
if [ "$(grep -c '"loss"' "$work/base.jsonl")" = 3 ] && grep -q "^step" "$work/ft_own_log.log"; then
    ok finetune_leaves_the_loaded_runs_log
else
    fail finetune_leaves_the_loaded_runs_log "$(grep -c '"loss"' "$work/base.jsonl") records in base.jsonl; $(tail -1 "$work/ft_own_log.log")"
fi
# the references: the checkpoint with its moments zeroed and its optimizer step 0 (a fresh
# AdamW); for --no-load-optim the schedule restarting at iteration 3, for --finetune the
# iteration and data position back at 0 (three steps each: a warmup's first step has lr 0,
# so the moments show from the third step on)
reset_checkpoint() {  # SRC DEST ITERATION CONSUMED LR_START
    cp -r "$1" "$2"
    python3 - "$2/iter_0000003" "$3" "$4" "$5" <<PY
$SAFETENSORS_PY
import json, os, sys
d, iteration, consumed, lr_start = sys.argv[1], *map(int, sys.argv[2:])
os.remove(os.path.join(d, "checksums.json"))
path = os.path.join(d, "optimizer.safetensors")
h, _ = header(path)
n = __import__("struct").unpack("<Q", open(path, "rb").read(8))[0]
with open(path, "r+b") as f:
    for name, t in h.items():
        if name.startswith("exp_avg"):
            b, e = t["data_offsets"]
            f.seek(8 + n + b)
            f.write(bytes(e - b))
st = json.load(open(os.path.join(d, "trainer_state.json")))
st.update(iteration=iteration, consumed_train_samples=consumed, optimizer_step=0)
if lr_start: st["lr_schedule_start"] = lr_start
json.dump(st, open(os.path.join(d, "trainer_state.json"), "w"))
PY
}
reset_checkpoint "$work/base" "$work/fresh_moments" 3 12 3
reset_checkpoint "$work/base" "$work/fresh_start" 0 0 0
run fresh_moments --train-iters 6 --load "$work/fresh_moments"
run fresh_start --train-iters 3 --load "$work/fresh_start"
same_steps no_load_optim_is_fresh_moments_and_schedule "$work/no_optim.jsonl" "$work/fresh_moments.jsonl" 1 "$work/no_optim.log"
differ no_load_optim_differs_from_resume "$work/no_optim.jsonl" "$work/resume.jsonl"
[ "$(lr_of "$work/no_optim.jsonl" 4)" = "$(lr_of "$work/base.jsonl" 1)" ] && ok no_load_optim_restarts_schedule ||
    fail no_load_optim_restarts_schedule "lr at step 4 $(lr_of "$work/no_optim.jsonl" 4)"
same_steps finetune_is_weights_only "$work/finetune.jsonl" "$work/fresh_start.jsonl" 1 "$work/finetune.log"
differ finetune_uses_the_weights "$work/finetune.jsonl" "$work/plain.jsonl"
expect_error finetune_needs_fresh_save "--finetune starts a new run at iteration 0" \
    -- "$M" train "${TINY[@]}" --train-iters 4 --load "$work/base" --finetune --save "$work/base"

# --no-load-rng: forced-balance routing draws only random logits, so the resumed steps route as a
# new run's first steps; a full resume goes on with the streams
FORCED=(--moe-router-force-load-balancing)
run rng_fresh --train-iters 2 "${FORCED[@]}" --moe-routing-trace-path "$work/trace_fresh"
run rng_base --train-iters 2 "${FORCED[@]}"
mv "$work/rng_base.save" "$work/rng_base"
run rng_reset --train-iters 4 "${FORCED[@]}" --load "$work/rng_base" --no-load-rng --moe-routing-trace-path "$work/trace_reset"
run rng_resume --train-iters 4 "${FORCED[@]}" --load "$work/rng_base" --moe-routing-trace-path "$work/trace_resume"
picks() { grep '"topk"' "$1/rank_00000.jsonl" | sed 's/.*"topk"//'; }
[ "$(picks "$work/trace_reset")" = "$(picks "$work/trace_fresh")" ] && ok no_load_rng_restarts_streams ||
    fail no_load_rng_restarts_streams "the resumed steps routed differently from a new run's"
[ "$(picks "$work/trace_resume")" != "$(picks "$work/trace_fresh")" ] && ok full_resume_continues_streams ||
    fail full_resume_continues_streams "a full resume repeated the first steps' draws"

# Megatron's auto-resume idiom: --load and --save one directory; the first run finds nothing and
# starts afresh, the next resumes (its steps appended to the recorded --log-jsonl); elsewhere an
# empty --load stays an error
"$M" train "${TINY[@]}" --train-iters 2 --load "$work/auto" --save "$work/auto" --log-jsonl "$work/auto1.jsonl" \
    >"$work/auto1.log" 2>&1 || fail auto_resume_first_run "$(tail -1 "$work/auto1.log")"
"$M" train "${TINY[@]}" --train-iters 3 --load "$work/auto" --save "$work/auto" >"$work/auto2.log" 2>&1 ||
    fail auto_resume_second_run "$(tail -1 "$work/auto2.log")"
if grep -q "^note: --load .*auto holds no checkpoint yet (it is the --save directory): training starts from scratch" "$work/auto1.log" &&
   [ "$(step_numbers "$work/auto1.jsonl" | cut -d' ' -f1 | tr '\n' ' ')" = "1 2 3 " ] &&
   grep -q "^loaded .*auto/iter_0000002 (iteration 2)" "$work/auto2.log"; then
    ok auto_resume_idiom
else
    fail auto_resume_idiom "$(head -1 "$work/auto1.log") / $(grep loaded "$work/auto2.log")"
fi
expect_error empty_load_elsewhere "no latest_checkpointed_iteration.txt and no config.json" \
    -- "$M" train "${TINY[@]}" --train-iters 1 --load "$work/nothing_here" --save "$work/other_save"
