#!/usr/bin/env bash
# bench/busy_machine.sh [moetron] — training throughput of the default model (what `make
# run` trains) on a quiet machine and beside one competing CPU-bound process, with
# moetron's default OpenMP wait policy (passive: waiting threads sleep) and with spinning
# waits (OMP_WAIT_POLICY=active, OpenMP's own default). Prints the median tokens/s of the
# logged steps (the first 3 left out as warm-up) and each busy/quiet ratio. Quiet and busy
# runs alternate, ROUNDS times, so that a drift of the machine's speed touches both.
set -euo pipefail
M=${1:-build/moetron}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-25}
out=$(mktemp -d)
hog=
trap '[ -n "$hog" ] && kill $hog 2>/dev/null; rm -rf "$out"' EXIT

run() {  # label policy: appends the logged steps' tokens/s to $out/label
    local label=$1 policy=$2
    env ${policy:+OMP_WAIT_POLICY=$policy} "$M" train --train-iters "$STEPS" --eval-interval 0 --log-interval 1 \
        --log-jsonl "$out/$label.jsonl" >/dev/null
    python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "tokens_per_s" in l][3:]
print("\n".join(str(r["tokens_per_s"]) for r in rows))' "$out/$label.jsonl" >>"$out/$label"
    rm -f "$out/$label.jsonl"
}

for ((r = 0; r < ROUNDS; r++)); do
    for policy in "" active; do
        run "quiet_${policy:-default}" "$policy"
        bash -c 'while :; do :; done' &  # one competing CPU-bound process
        hog=$!
        run "busy_${policy:-default}" "$policy"
        kill $hog
        wait $hog 2>/dev/null || true
        hog=
    done
done

python3 - "$out" <<'PY'
import statistics, sys
d = sys.argv[1]
med = lambda name: statistics.median(float(x) for x in open(f"{d}/{name}"))
for policy, label in (("default", "moetron default (passive)"), ("active", "OMP_WAIT_POLICY=active")):
    quiet, busy = med(f"quiet_{policy}"), med(f"busy_{policy}")
    print(f"{label:<28} quiet {quiet:7.0f} tok/s   busy {busy:7.0f} tok/s   busy/quiet {busy / quiet:.2f}")
PY
