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
for script in "$root"/tests/cli/test_*.sh; do
    run_program "$(basename "$script")" bash "$script"
done

skipped=0
if python3 -c 'import torch, transformers, safetensors' 2>/dev/null; then
    run_program hf_conformance python3 "$root/tests/conformance/hf_conformance.py" "$MOETRON"
elif [ "${CI:-}" = "true" ]; then
    echo "FAIL hf_conformance: python3 with torch, transformers and safetensors is required under CI" | tee -a "$log"
else
    echo "skip hf_conformance: python3 with torch, transformers and safetensors not installed"
    skipped=1
fi

# Megatron-Core's own router functions on the same logits (tests/conformance/router_probe.c).
if python3 -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("torch", "safetensors", "megatron")))' 2>/dev/null; then
    run_program megatron_router python3 "$root/tests/conformance/megatron_router.py" "$bin/router_probe"
elif [ "${CI:-}" = "true" ]; then
    echo "FAIL megatron_router: python3 with torch, safetensors and megatron-core is required under CI" | tee -a "$log"
else
    echo "skip megatron_router: megatron-core not installed (pip install megatron-core)"
    skipped=$((skipped + 1))
fi

passed=$(grep -c '^ok ' "$log")
failed=$(grep -c '^FAIL ' "$log")
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
