#!/usr/bin/env bash
# test_megatron_script.sh — a Megatron-LM user's MoE script runs unchanged but for sizes,
# paths and the launcher: examples/megatron/train_mixtral_8x7b_distributed.sh (the shape of
# Megatron-LM's examples/mixtral script: its MODEL/MOE/DATA/TRAINING/MODEL_PARALLEL/LOGGING
# argument arrays, sizes shrunk, torchrun replaced by mpirun with 2 ranks and expert
# parallelism) on a SentencePiece tokenizer (Llama2Tokenizer) and Megatron data that `moetron
# prepare` made with it. The first run starts from the empty --load/--save directory, trains,
# evaluates, saves and writes TensorBoard events with Megatron's tags; running the script
# again with more iterations resumes there (--no-load-optim --no-load-rng, as the script
# says) and adds its events; every flag of the script is accepted.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
script="$root/examples/megatron/train_mixtral_8x7b_distributed.sh"
mpi_require megatron_script

make_corpus "$work/corpus.txt" 7 600 10 40
if ! python3 - "$work/corpus.txt" "$work/tok" <<'PY' >"$work/sp.log" 2>&1; then
import sys
import sentencepiece as spm
spm.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=300, model_type="bpe",
                               byte_fallback=True, normalization_rule_name="identity", minloglevel=2)
PY
    fail megatron_script_tokenizer "sentencepiece could not train: $(tail -1 "$work/sp.log")"
    exit 0
fi
"$M" prepare --input "$work/corpus.txt" --tokenizer-type Llama2Tokenizer --tokenizer-model "$work/tok.model" \
    --append-eod --output-prefix "$work/data" >"$work/prepare.log" 2>&1 ||
    fail megatron_script_data "$(tail -1 "$work/prepare.log")"

run_script() {  # run_script ITERS LOG
    MOETRON="$M" PROCS=2 TRAIN_ITERS=$1 timeout 600 "${NO_LEAK_CHECK[@]}" bash "$script" "$work/ckpt" \
        "$work/tok.model" "$work/data_text_document" >"$2" 2>&1
}

if run_script 8 "$work/first.log" && grep -q "holds no checkpoint yet" "$work/first.log" &&
    grep -q "^saved checkpoint .*/ckpt/iter_0000008" "$work/first.log" &&
    [ "$(grep -c '^eval at step' "$work/first.log")" -eq 2 ]; then
    ok megatron_script_first_run
else
    fail megatron_script_first_run "$(grep -m1 error "$work/first.log") $(tail -2 "$work/first.log" | tr '\n' ' ')"
fi
if run_script 12 "$work/second.log" && ! grep -q "holds no checkpoint yet" "$work/second.log" &&
    grep -Eq "^step +9/12" "$work/second.log" && grep -q "^saved checkpoint .*/ckpt/iter_0000012" "$work/second.log" &&
    ! grep -Eq "^step +[1-8]/" "$work/second.log"; then
    ok megatron_script_resumes
else
    fail megatron_script_resumes "$(grep -m1 error "$work/second.log") $(tail -2 "$work/second.log" | tr '\n' ' ')"
fi

# TensorBoard: both runs' files in the script's directory, Megatron's tags, steps 1-12
why=$(python3 - "$work/ckpt/tensorboard" <<'PY' 2>&1
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
files = sorted(glob.glob(sys.argv[1] + "/events.out.tfevents.*"))
if len(files) != 2: print(f"{len(files)} event files, expected one per run"); sys.exit()
steps = []
for f in files:
    acc = EventAccumulator(f)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for want in ("lm loss", "learning-rate", "grad-norm", "load_balancing_loss", "lm loss validation"):
        if want not in tags: print(f"{f}: no '{want}' among {sorted(tags)[:8]}"); sys.exit()
    steps += [e.step for e in acc.Scalars("lm loss")]
if steps != list(range(1, 13)): print(f"lm loss at steps {steps}")
PY
)
[ -z "$why" ] && ok megatron_script_tensorboard || fail megatron_script_tensorboard "$why"
