#!/usr/bin/env bash
# test_checkpoint_safety.sh — what a run does to checkpoint directories
# (docs/reliability.md, "Checkpoint directories"): deleting never follows a symlinked
# iter_*; a --save that cannot be written stops the run before the first step; a --save
# directory serves one run at a time, and the next run removes what killed runs left there;
# no checkpoint is written during a streak of non-finite (skipped) steps; checksums.json is
# verified before config.json is read.
set -u
source "$(dirname "$0")/lib.sh"
TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 1
      --mock-data-tokens 65536 --log-interval 1 --peak-tflops 1)

# fingerprint DIR: name, size and checksum of every file in DIR
fingerprint() { (cd "$1" && for f in *; do echo "$f $(cksum <"$f")"; done); }

# ---- deleting never follows a link ------------------------------------------------------------
"$M" train "${TINY[@]}" --train-iters 2 --save "$work/old" --save-interval 1 >"$work/old.out" 2>&1 ||
    fail old_checkpoints "$(tail -1 "$work/old.out")"
cp -r "$work/old" "$work/cfg"  # for the checksum case at the end
fingerprint "$work/old/iter_0000002" >"$work/old2.before"
fingerprint "$work/old/iter_0000001" >"$work/old1.before"

# --keep-checkpoints prunes a symlinked iter_* as a link, never what it points to
mkdir "$work/new"
ln -s "$work/old/iter_0000002" "$work/new/iter_0000002"
echo 2 >"$work/new/latest_checkpointed_iteration.txt"
"$M" train --load "$work/new" --save "$work/new" --train-iters 5 --save-interval 1 --keep-checkpoints 2 \
    >"$work/new.out" 2>&1 || fail prune_keeps_link_target "resume failed: $(tail -1 "$work/new.out")"
left=$(cd "$work/new" && ls -d iter_* | tr '\n' ' ')
if ! fingerprint "$work/old/iter_0000002" | cmp -s - "$work/old2.before"; then
    fail prune_keeps_link_target "the link's target changed: $(ls "$work/old/iter_0000002" | tr '\n' ' ')"
elif [ "$left" != "iter_0000004 iter_0000005 " ]; then
    fail prune_keeps_link_target "left in new: $left"
else
    ok prune_keeps_link_target
fi

# replacing a symlinked iter_* of the same iteration replaces the link, not its target
mkdir "$work/swap"
ln -s "$work/old/iter_0000001" "$work/swap/iter_0000001"
"$M" train "${TINY[@]}" --train-iters 1 --save "$work/swap" >"$work/swap.out" 2>&1 ||
    fail replace_keeps_link_target "train failed: $(tail -1 "$work/swap.out")"
if ! fingerprint "$work/old/iter_0000001" | cmp -s - "$work/old1.before"; then
    fail replace_keeps_link_target "the link's target changed: $(ls "$work/old/iter_0000001" | tr '\n' ' ')"
elif [ -L "$work/swap/iter_0000001" ] || [ ! -s "$work/swap/iter_0000001/checksums.json" ]; then
    fail replace_keeps_link_target "swap/iter_0000001 is not the new checkpoint directory"
else
    ok replace_keeps_link_target
fi

# ---- every path a run will write is checked before the first step -------------------------------
# save_refused NAME PATTERN SAVE [PREFIX...]: one error line naming --save, and no step ran
save_refused() {
    local name=$1 pattern=$2 save=$3
    shift 3
    rm -f "$work/refused.jsonl"
    expect_error "$name" "$pattern" -- "$@" "$M" train "${TINY[@]}" --train-iters 2 --save "$save" \
        --log-jsonl "$work/refused.jsonl" || return
    if grep -q '^step' "$work/out" || grep -qs '"loss"' "$work/refused.jsonl"; then
        fail "${name}_at_startup" "training ran before the error"
    else
        ok "${name}_at_startup"
    fi
}
echo "not a directory" >"$work/afile"
save_refused save_is_a_file "--save .*afile is not a directory" "$work/afile"
save_refused save_under_a_file "--save .*afile/ck: cannot create it: Not a directory" "$work/afile/ck"
# a read-only filesystem: a read-only bind mount in a private mount namespace (root only)
mkdir "$work/ro"
if unshare -m mount --bind -o ro "$work/ro" "$work/ro" 2>/dev/null; then
    # shellcheck disable=SC2016  # expanded by the inner shell
    ro_mount=(unshare -m sh -c 'mount --bind -o ro "$0" "$0" && exec "$@"' "$work/ro")
    save_refused save_read_only "--save .*ro: cannot write there: Read-only file system" "$work/ro" "${ro_mount[@]}"
    save_refused save_under_read_only "--save .*ro/ck: cannot create it: Read-only file system" "$work/ro/ck" \
        "${ro_mount[@]}"
else
    echo "skip save_read_only: cannot bind-mount read-only here (needs root and unshare -m)"
fi

# ---- a --save directory belongs to one run at a time -------------------------------------------
"$M" train "${TINY[@]}" --train-iters 100000 --save "$work/busy" --log-jsonl "$work/busy.jsonl" \
    >"$work/busy.out" 2>&1 &
holder=$!
wait_for "$work/busy.jsonl" '"step":1,' $holder
expect_error second_run_refused "--save .*busy is in use by another moetron run (process $holder holds" -- \
    "$M" train "${TINY[@]}" --train-iters 2 --save "$work/busy"
kill -9 $holder
wait $holder 2>/dev/null

# what killed runs left: a partial save, a replaced directory, latest's temporary file, a
# stale name that is a symlink (its target stays), and one holding a foreign file (kept)
for d in iter_0000009.tmp.4242 iter_0000003.old.77 iter_0000005.tmp.1; do
    mkdir "$work/busy/$d"
    echo '{}' >"$work/busy/$d/config.json"
    echo x >"$work/busy/$d/model.safetensors.tmp.4242"
done
echo notes >"$work/busy/iter_0000005.tmp.1/notes.txt"
echo 7 >"$work/busy/latest_checkpointed_iteration.txt.tmp.4242"
mkdir "$work/outside"
echo '{}' >"$work/outside/config.json"
ln -s "$work/outside" "$work/busy/iter_0000008.tmp.99"
"$M" train "${TINY[@]}" --train-iters 1 --save "$work/busy" >"$work/after.out" 2>&1
rc=$?
left=$(cd "$work/busy" && ls | tr '\n' ' ')
if [ $rc -ne 0 ]; then
    fail lock_released_at_kill "the run after kill -9 failed: $(tail -1 "$work/after.out")"
else
    ok lock_released_at_kill
fi
if [ "$left" != "iter_0000001 iter_0000005.tmp.1 latest_checkpointed_iteration.txt moetron.lock " ]; then
    fail stale_saves_removed "left: $left"
elif [ ! -s "$work/outside/config.json" ] || [ ! -s "$work/busy/iter_0000005.tmp.1/notes.txt" ]; then
    fail stale_saves_removed "removed a file moetron did not write"
elif ! grep -q "note: --save .*busy: removed 3 unfinished checkpoint directories" "$work/after.out"; then
    fail stale_saves_removed "no note: $(head -3 "$work/after.out")"
else
    ok stale_saves_removed
fi

# under MPI only the writing rank takes the lock
if "$M" --version | grep -q "mpi: none"; then
    echo "skip mpi_save_locked_once: no MPI build"
else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    if env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 mpirun --oversubscribe \
        --bind-to none -np 2 "$M" train "${TINY[@]}" --train-iters 1 --save "$work/mpi" >"$work/mpi.out" 2>&1 &&
        [ -s "$work/mpi/iter_0000001/checksums.json" ]; then
        ok mpi_save_locked_once
    else
        fail mpi_save_locked_once "$(grep moetron "$work/mpi.out" | tail -1)"
    fi
fi

# ---- a diverged run does not overwrite good checkpoints -----------------------------------------
# --lr 1e30 destroys the weights at step 2's update: steps 3 on are not finite (skipped)
nan_run() {  # name, flags...
    local name=$1
    shift
    rm -rf "$work/$name"
    "$M" train "${TINY[@]}" --lr 1e30 --clip-grad 0 --nan-skip-limit 100 --save "$work/$name" --save-interval 1 \
        --keep-checkpoints 1 "$@" >"$work/$name.out" 2>&1
}
streak_kept() {  # name, exit status: iter_0000002 alone stays, latest names it, one note
    local name=$1 rc=$2 dirs notes
    dirs=$(cd "$work/$name" && ls -d iter_* | tr '\n' ' ')
    notes=$(grep -c "note: step 3: no checkpoint while steps are skipped as not finite" "$work/$name.out")
    if [ "$rc" -ne 0 ]; then
        fail "$name" "exit $rc: $(tail -1 "$work/$name.out")"
    elif [ "$dirs" != "iter_0000002 " ] || [ "$(cat "$work/$name/latest_checkpointed_iteration.txt")" != 2 ]; then
        fail "$name" "checkpoints $dirs, latest $(cat "$work/$name/latest_checkpointed_iteration.txt")"
    elif [ "$notes" != 1 ] || grep -q "saved checkpoint .*iter_000000[3-9]" "$work/$name.out"; then
        fail "$name" "$notes notes; $(grep -c 'saved checkpoint' "$work/$name.out") saves"
    else
        return 0
    fi
    return 1
}
nan_run nan_streak_no_save --train-iters 6
streak_kept nan_streak_no_save $? && ok nan_streak_no_save
nan_run nan_streak_exit --train-iters 10 --exit-interval 5
rc=$?
if streak_kept nan_streak_exit $rc; then
    grep -q "exiting at step 5: --exit-interval 5 (not saved: the step was skipped as not finite)" \
        "$work/nan_streak_exit.out" && ok nan_streak_exit || fail nan_streak_exit "$(grep exiting "$work/nan_streak_exit.out")"
fi

# ---- checksums.json before config.json ---------------------------------------------------------
# a damaged but valid config.json is reported as damage by every reader, not as the shape
# error (3 heads do not divide 64) or memory error (hidden size 640000) it would give
damaged="config.json: .* the file is damaged"
damage_config() {  # sed expression: edits the checkpoint's config.json
    rm -rf "$work/cfg_damaged" && cp -r "$work/cfg" "$work/cfg_damaged"
    sed -i "$1" "$work/cfg_damaged/iter_0000002/config.json"
    cmp -s "$work/cfg/iter_0000002/config.json" "$work/cfg_damaged/iter_0000002/config.json" &&
        fail damage_config "the edit $1 did not apply"
}
damage_config 's/"num-attention-heads": 4/"num-attention-heads": 3/'
expect_error train_verifies_before_config "$damaged" -- "$M" train --load "$work/cfg_damaged" --train-iters 3
expect_error generate_verifies_before_config "$damaged" -- "$M" generate --load "$work/cfg_damaged" --prompt hi
expect_error forward_verifies_before_config "$damaged" -- \
    "$M" forward --load "$work/cfg_damaged" --input "$work/in.safetensors" --dump "$work/dump.safetensors"
damage_config 's/"hidden-size": 64/"hidden-size": 640000/'
expect_error train_verifies_before_memory_check "$damaged" -- "$M" train --load "$work/cfg_damaged" --train-iters 3
expect_error generate_verifies_before_allocating "$damaged" -- "$M" generate --load "$work/cfg_damaged" --prompt hi
