#!/usr/bin/env bash
# test_reliability.sh — what a run does when things go wrong (docs/reliability.md):
# non-finite steps skipped then stopped, a run too big for memory refused with its
# estimate, loss spikes reported, --no-X switches, checkpoint
# checksums catching damaged files, --keep-checkpoints, --exit-duration-in-mins and
# SIGTERM / SIGINT with --exit-signal-handler (save, exit 0, exact resume), and under MPI a
# stopped rank ending the job after --distributed-timeout-minutes.
set -u
source "$(dirname "$0")/lib.sh"
# Runs that are interrupted and resumed: long enough to be interrupted, short under the
# sanitizer build (-O0, ~10x slower).
LONG=400
sanitizer_build "$M" && LONG=40
TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 1
      --mock-data-tokens 65536 --log-interval 1)

# ---- non-finite steps -------------------------------------------------------------------------
# --lr 1e30 destroys the weights at the first real update: every later step is NaN
"$M" train "${TINY[@]}" --train-iters 10 --lr 1e30 --clip-grad 0 --nan-skip-limit 3 --log-jsonl "$work/nan.jsonl" \
    >"$work/nan.out" 2>"$work/nan.err"
rc=$?
skipped=$(grep -c '"skipped":true' "$work/nan.jsonl" 2>/dev/null)
if [ $rc -ne 0 ] && [ "$skipped" = 2 ] && grep -q "update skipped (2 in a row of --nan-skip-limit 3)" "$work/nan.out" &&
    grep -q "^moetron: error: step [0-9]*: .*3 steps in a row were not finite (--nan-skip-limit 3)" "$work/nan.err"; then
    ok nan_steps_skipped_then_stop
else
    fail nan_steps_skipped_then_stop "exit $rc, $skipped skipped records: $(tail -1 "$work/nan.err")"
fi
expect_error nan_check_off_stops_at_first "gradient norm .* are not finite; lower --lr" -- \
    "$M" train "${TINY[@]}" --train-iters 10 --lr 1e30 --clip-grad 0 --no-check-for-nan-in-loss-and-grad
expect_error no_prefix_only_for_switches "unknown flag '--no-lr'" -- "$M" train "${TINY[@]}" --no-lr
expect_error nan_skip_limit_positive "nan-skip-limit" -- "$M" train "${TINY[@]}" --nan-skip-limit 0

# ---- a run that cannot fit says so, with the estimate, before allocating: were the buffers of
# this multi-terabyte model allocated first, the run would die of that instead
expect_error too_big_for_memory "needs about [0-9.]* GiB per process (parameters .*, gradients .*, AdamW moments .*, activations .*) .* GiB are available" -- \
    "$M" train --hidden-size 8192 --num-layers 64 --num-experts 64 --moe-ffn-hidden-size 8192 --num-attention-heads 64 \
    --train-iters 2 --lr-warmup-iters 1

# ---- loss spikes: with a factor below 1 every step after the first 20 is one ---------------------
"$M" train "${TINY[@]}" --train-iters 24 --loss-spike-factor 0.5 --log-jsonl "$work/spike.jsonl" >"$work/spike.out" 2>&1
spikes=$(grep -c '"loss_spike":true' "$work/spike.jsonl")
notes=$(grep -c "note: step .* (loss spike)" "$work/spike.out")
[ "$spikes" = 4 ] && [ "$notes" = 4 ] && ok loss_spikes_reported ||
    fail loss_spikes_reported "$spikes records, $notes notes (expected 4 each: steps 21-24)"
"$M" train "${TINY[@]}" --train-iters 24 --log-jsonl "$work/calm.jsonl" >/dev/null 2>&1
! grep -q loss_spike "$work/calm.jsonl" && ok no_spike_in_a_calm_run || fail no_spike_in_a_calm_run "a spike reported"

# ---- checksums -----------------------------------------------------------------------------------
"$M" train "${TINY[@]}" --train-iters 3 --save "$work/ck" --save-interval 1 --keep-checkpoints 2 >/dev/null 2>&1
dirs=$(cd "$work/ck" && ls -d iter_* | tr '\n' ' ')
[ "$dirs" = "iter_0000002 iter_0000003 " ] && ok keep_checkpoints || fail keep_checkpoints "left: $dirs"
python3 - "$work/ck/iter_0000003" <<'PY' && ok checksums_match_zlib || fail checksums_match_zlib "see above"
import json, sys, zlib
d = sys.argv[1]
m = json.load(open(f"{d}/checksums.json"))
assert m["algorithm"] == "crc32" and set(m["files"]) >= {"config.json", "model.safetensors", "optimizer.safetensors",
                                                         "trainer_state.json"}, m
for name, e in m["files"].items():
    b = open(f"{d}/{name}", "rb").read()
    assert len(b) == e["bytes"] and f"{zlib.crc32(b):08x}" == e["crc32"], name
PY
damage() {  # name, file, how (flip|truncate|remove)
    rm -rf "$work/dmg" && cp -r "$work/ck" "$work/dmg"
    python3 - "$work/dmg/iter_0000003/$2" "$3" <<'PY'
import os, sys
path, how = sys.argv[1:]
if how == "remove":
    os.remove(path)
else:
    b = bytearray(open(path, "rb").read())
    if how == "flip": b[len(b) * 2 // 3] ^= 0x10
    else: b = b[:len(b) - 7]
    open(path, "wb").write(b)
PY
    expect_error "$1" "$2.*checkpoint is damaged\|$2.*file is damaged" -- "$M" train --load "$work/dmg" --train-iters 4
}
damage checksum_catches_flipped_weights model.safetensors flip
damage checksum_catches_flipped_moments optimizer.safetensors flip
damage checksum_catches_truncated_state trainer_state.json truncate
damage checksum_catches_missing_file optimizer.safetensors remove
"$M" train --load "$work/ck" --train-iters 4 >/dev/null 2>&1 && ok intact_checkpoint_loads || fail intact_checkpoint_loads "$?"

# ---- early exits: save, exit 0, and the resumed run continues as an uninterrupted one -------------
# The interrupted runs cannot finish before they are stopped, however fast the machine: they
# are 100000 steps long, with the reference's learning-rate schedule (the built-in corpus does
# not depend on --train-iters); their resumes end where the reference ends.
UNFINISHED=(--train-iters 100000 --lr-decay-iters "$LONG")
"$M" train "${TINY[@]}" --train-iters "$LONG" --log-jsonl "$work/ref.jsonl" >/dev/null 2>&1
resumes_exactly() {  # name, checkpoint dir, log of the interrupted run
    local name=$1 ck=$2 log=$3
    "$M" train --load "$ck" --train-iters "$LONG" --log-jsonl "$log" --exit-duration-in-mins 0 >/dev/null 2>&1 ||
        { fail "$name" "resume failed"; return; }
    if diff <(losses "$work/ref.jsonl") <(losses "$log") >/dev/null; then ok "$name"; else
        fail "$name" "losses differ from the uninterrupted run"; fi
}
"$M" train "${TINY[@]}" "${UNFINISHED[@]}" --exit-duration-in-mins 0.005 --save "$work/dur" \
    --log-jsonl "$work/dur.jsonl" >"$work/dur.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "exiting at step [0-9]*: ran for --exit-duration-in-mins 0.005 (saved)" "$work/dur.out"; then
    resumes_exactly exit_duration_saves_and_resumes "$work/dur" "$work/dur.jsonl"
else
    fail exit_duration_saves_and_resumes "exit $rc: $(tail -1 "$work/dur.out")"
fi

signal_case() {  # name, signal
    local name=$1 sig=$2 pid rc
    rm -rf "$work/sig" "$work/sig.jsonl"
    "$M" train "${TINY[@]}" "${UNFINISHED[@]}" --exit-signal-handler --save "$work/sig" --log-jsonl "$work/sig.jsonl" \
        >"$work/sig.out" 2>&1 &
    pid=$!
    wait_for "$work/sig.jsonl" '"step":3,' $pid
    kill -"$sig" $pid
    wait $pid
    rc=$?
    if [ $rc -eq 0 ] && grep -q "exiting at step [0-9]*: received SIG$sig (--exit-signal-handler) (saved)" "$work/sig.out"; then
        resumes_exactly "$name" "$work/sig" "$work/sig.jsonl"
    else
        fail "$name" "exit $rc: $(tail -1 "$work/sig.out")"
    fi
}
signal_case sigterm_saves_and_resumes TERM
signal_case sigint_saves_and_resumes INT
# the run is signalled once it has logged a step (it cannot finish first: 100000 steps), and
# without --exit-signal-handler SIGTERM keeps its default action: the process ends by it
"$M" train "${TINY[@]}" --train-iters 100000 --log-jsonl "$work/term.jsonl" >/dev/null 2>&1 &
pid=$!
if wait_for "$work/term.jsonl" '"step":1,' $pid; then
    kill -TERM $pid
    wait $pid
    rc=$?
    [ $rc -eq 143 ] && ok sigterm_without_handler_ends_the_run ||
        fail sigterm_without_handler_ends_the_run "exit $rc, not 143 (ended by SIGTERM)"
else
    wait $pid
    fail sigterm_without_handler_ends_the_run "the run ended with status $? before logging a step"
fi

# ---- a stopped rank: the others end the job after --distributed-timeout-minutes -------------------
if "$M" --version | grep -q "mpi: none"; then
    echo "skip distributed_timeout: no MPI build"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun --oversubscribe --bind-to none -np 2 \
    "$M" train "${TINY[@]}" --train-iters 100000 --distributed-timeout-minutes 0.05 --log-jsonl "$work/wd.jsonl" \
    >"$work/wd.out" 2>&1 &
wait_for "$work/wd.jsonl" '"step":2,' $!
victim=$(pgrep -f -- "--distributed-timeout-minutes 0.05" | grep -v "^$$\$" | tail -1)
start=$SECONDS
kill -STOP "$victim"
wait %%
rc=$?
kill -KILL "$victim" 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "has waited [0-9]* s, more than --distributed-timeout-minutes 0.05" "$work/wd.out"; then
    ok distributed_timeout_ends_the_job
else
    fail distributed_timeout_ends_the_job "exit $rc after $((SECONDS - start)) s: $(grep moetron "$work/wd.out" | tail -2 | tr '\n' ' ')"
fi

# ---- a slow save is not a dead rank: rank 0's first save takes 10 s longer than it would
# (MOETRON_TEST_SLOW_SAVE_S, as if it wrote a very large checkpoint), over three times a 3 s
# --distributed-timeout-minutes; the other rank waits for it without ending the job, and the
# run completes with both checkpoints. (The timeout is 3 s, not less, because the steps of
# two sanitizer-built ranks sharing two busy cores can drift apart by over a second.)
rm -rf "$work/slow"
env MOETRON_TEST_SLOW_SAVE_S=10 "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 \
    mpirun --oversubscribe --bind-to none -np 2 "$M" train "${TINY[@]}" --train-iters 4 --save "$work/slow" \
    --save-interval 2 --distributed-timeout-minutes 0.05 >"$work/slow.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(cat "$work/slow/latest_checkpointed_iteration.txt" 2>/dev/null)" = 4 ] &&
    ! grep -q "has waited" "$work/slow.out"; then
    ok slow_save_is_not_a_dead_rank
else
    fail slow_save_is_not_a_dead_rank "exit $rc: $(grep moetron "$work/slow.out" | tail -2 | tr '\n' ' ')"
fi
