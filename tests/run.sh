#!/usr/bin/env bash
# tests/run.sh BUILD_DIR — the whole suite: unit programs, command-line tests and the
# Hugging Face conformance test. Every case prints "ok <name>" or "FAIL <name>..."; this
# script counts them and ends with "N passed, M failed" (exit 1 on any failure).
# The conformance tests need python3 with torch + transformers (+ megatron-core for the
# router test); without them they are skipped locally, and count as failures under CI=true.
set -u
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$build" in /*) bin=$build ;; *) bin=$root/$build ;; esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export MOETRON="$bin/moetron"
# The suite checks the cpu backend against its references even where a GPU is visible;
# make check-gpu checks the cuda backend.
export MOETRON_DEVICE=cpu

run_program() {  # name, command...
    local name=$1
    shift
    local start=$SECONDS
    "$@" >>"$log.one" 2>&1
    local rc=$?
    cat "$log.one"
    cat "$log.one" >>"$log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$log.one"; then
        echo "FAIL $name: exited with status $rc"
        echo "FAIL $name: exited with status $rc" >>"$log"
    fi
    rm -f "$log.one"
    echo "   ($name: $((SECONDS - start))s)"
}

for program in "$bin"/tests/test_*; do
    [ -x "$program" ] || continue
    run_program "$(basename "$program")" "$program"
done
# Every op of the op list through the checks' table, the cpu backend under test
# (make check-gpu runs the same checks for cuda).
run_program test_backend_ops "$bin/test_backend_ops" cpu
# Every fuzz target on its seeds (and damaged copies of them) and its kept crashing inputs.
for replay in "$bin"/fuzz/replay_*; do
    [ -x "$replay" ] || continue
    t=${replay##*/replay_}
    run_program "fuzz_replay_$t" "$replay" "$root/tests/fuzz/corpus/$t" "$root/tests/fuzz/regressions/$t"
done
# Under a sanitizer build these scripts run in the plain suite only, for CI's time budget
# (docs/testing.md, "Sanitizers", names where their paths run under the sanitizers instead).
SANITIZER_PLAIN_ONLY=" test_first_use.sh test_fp8.sh test_mpi_cp.sh test_precision_optimizer.sh test_reliability.sh "
source "$root/tests/cli/sanitizer_build.sh"
sanitizer_build "$MOETRON" && sanitized=1 || sanitized=0
for script in "$root"/tests/cli/test_*.sh; do
    name=$(basename "$script")
    if [ "$sanitized" = 1 ] && [[ "$SANITIZER_PLAIN_ONLY" == *" $name "* ]]; then
        echo "skip $name: sanitizer build (run by the plain build)"
        continue
    fi
    run_program "$name" bash "$script"
done

# run_python NAME "PYTHON MODULES" SCRIPT ARGS...: a conformance script that needs these
# python modules; skipped locally without them, a failure under CI=true.
skipped=0
run_python() {
    local name=$1 modules=$2
    shift 2
    if python3 -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))' \
        $modules 2>/dev/null; then
        run_program "$name" python3 "$@"
    elif [ "${CI:-}" = "true" ]; then
        echo "FAIL $name: python3 with $modules is required under CI" | tee -a "$log"
    else
        echo "skip $name: python3 with $modules not installed (pip install torch transformers safetensors megatron-core torchao)"
        skipped=$((skipped + 1))
    fi
}

run_python hf_conformance "torch transformers safetensors" "$root/tests/conformance/hf_conformance.py" "$MOETRON"
run_python hf_families "torch transformers safetensors" "$root/tests/conformance/hf_families.py" "$MOETRON"
run_python hf_export "torch transformers safetensors" "$root/tests/conformance/hf_export.py" "$MOETRON"
run_python latent_moe "torch transformers safetensors" "$root/tests/conformance/latent_moe.py" "$MOETRON"
# Megatron-Core's own router functions on the same logits as build/router_probe.
run_python megatron_router "torch safetensors megatron" "$root/tests/conformance/megatron_router.py" "$bin/router_probe"
run_python megatron_loss_scaler "torch megatron" "$root/tests/conformance/megatron_loss_scaler.py" "$MOETRON"
run_python megatron_gpt_dataset "numpy torch megatron" "$root/tests/conformance/megatron_gpt_dataset.py" "$MOETRON"
run_python megatron_indexed "numpy torch megatron" "$root/tests/conformance/megatron_indexed.py" "$bin/indexed_probe"
# The narrow number formats and AdamW's narrow moments against torch's casts and FusedAdam's scaling.
run_python precision_optimizer "torch numpy safetensors" "$root/tests/conformance/precision_optimizer.py" "$bin/moment_probe"
# The quantizers (FP8 per tensor and in tiles, MXFP8, NVFP4) against torch's float8 casts and torchao's references.
run_python quantizers "torch numpy safetensors torchao" "$root/tests/conformance/quantizers.py" "$bin/quant_probe"
# The byte-level BPE tokenizer (build/tokenize_probe, moetron generate) against Hugging Face tokenizers.
run_python tokenizer_conformance "tokenizers" "$root/tests/conformance/tokenizer_conformance.py" "$bin/tokenize_probe"
# --tokenizer-type's tokenizers (SentencePiece .model BPE/Unigram, Llama-2 / DeepSeek-V3 tokenizer.json,
# GPT-2 vocab/merges, NullTokenizer) against sentencepiece and tokenizers, on random Unicode.
run_python tokenizer_types "tokenizers sentencepiece" "$root/tests/conformance/tokenizer_types.py" "$bin/tokenize_probe"
run_python prepare_conformance "tokenizers megatron numpy" "$root/tests/conformance/prepare_conformance.py" "$MOETRON"
# TensorBoard event files (--tensorboard-dir) read back by tensorboard's EventAccumulator.
run_python tensorboard_events "tensorboard numpy" "$root/tests/conformance/tensorboard_events.py" "$MOETRON"

passed=$(grep -c '^ok ' "$log")
failed=$(grep -c '^FAIL ' "$log")
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
