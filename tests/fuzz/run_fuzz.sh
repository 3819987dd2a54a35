#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh FUZZ_BUILD TARGET... — runs each libFuzzer binary FUZZ_BUILD/fuzz_TARGET
# for FUZZ_SECONDS (default 60), FUZZ_JOBS targets at a time (default 1), on
#   FUZZ_BUILD/corpus/TARGET   the working corpus (grows; not in git)
#   tests/fuzz/corpus/TARGET   the seeds (in git)
#   tests/fuzz/regressions/TARGET  the crashing inputs kept (in git): new ones are written here
# Logs go to FUZZ_BUILD/logs/TARGET.log. Exits 1 when any target found a crash, leak,
# timeout or out-of-memory input (or its fuzzer failed otherwise); each new input is named,
# with its bytes in base64 (docs/testing.md, "Fuzzing", says how to reproduce one).
set -u
build=$1
shift
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
mkdir -p "$build/logs"

fuzz_one() {
    local t=$1 log=$build/logs/$1.log
    local regress=tests/fuzz/regressions/$t
    mkdir -p "$build/corpus/$t" "$regress"
    local dict=()
    [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
    local before
    before=$(LC_ALL=C ls "$regress")
    # -rss_limit_mb=0: no RSS-watching thread (clang 14's ASan can crash starting it on newer
    # glibc, inside the runtime, with no input to blame); -malloc_limit_mb still refuses any
    # single allocation over 2 GiB, the way an out-of-memory input shows.
    "$build/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=0 -malloc_limit_mb=2048 -max_len=65536 \
        -close_fd_mask=1 -print_final_stats=1 -artifact_prefix="$regress/" "${dict[@]}" \
        "$build/corpus/$t" "tests/fuzz/corpus/$t" "$regress" >"$log" 2>&1
    local rc=$?
    local runs
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    local new found
    new=$(LC_ALL=C comm -13 <(printf '%s\n' "$before") <(LC_ALL=C ls "$regress"))
    found=$(printf '%s' "$new" | grep -c .)
    if [ $rc -eq 0 ] && [ "$found" -eq 0 ]; then
        echo "ok fuzz_$t: ${runs:-?} runs in ${seconds}s, corpus $(ls "$build/corpus/$t" | wc -l) files"
    else
        echo "FAIL fuzz_$t: exit status $rc, $found new input(s) in $regress; see $log"
        grep -m3 -E '^(==[0-9]+==ERROR|SUMMARY|fuzz: BUG|.*runtime error)' "$log" | sed 's/^/    /'
        # each new input in base64 too, so that a CI log keeps it after the machine is gone
        local f
        for f in $new; do  # libFuzzer's names (crash-<sha1>, ...): no spaces
            echo "    $regress/$f ($(wc -c <"$regress/$f") bytes), base64 (base64 -d to restore it):"
            echo "    $(base64 -w0 "$regress/$f")"
        done
    fi
}

status=0
running=0
for t in "$@"; do
    fuzz_one "$t" >"$build/logs/$t.summary" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait
for t in "$@"; do
    cat "$build/logs/$t.summary"
    grep -q '^FAIL' "$build/logs/$t.summary" && status=1
done
exit $status
