#!/usr/bin/env bash
# test_crash_resume.sh — kill -9 at any moment of training or saving never leaves a
# checkpoint that loads wrongly: the run resumes from the last complete one, exactly.
#
# A tiny sharded model saves after every step (a save takes longer than a step here, so
# most kills land inside one). A bounded loop with a fixed pseudo-random schedule
# (RANDOM=1234) starts `moetron train` (with --load once a checkpoint exists), kills it
# with SIGKILL after 0.05-1.5 s, and then checks CK:
#   - latest_checkpointed_iteration.txt, when there, holds one number that never goes
#     down and is at least every "saved checkpoint" the killed run printed;
#   - the directory it names is complete (config.json, model weights: model.safetensors
#     or the index and every shard it names, optimizer.safetensors, trainer_state.json of
#     that iteration, every file checksums.json lists at its size when there is one) with
#     no temporary file inside; leftover iter_*.tmp.PID directories
#     of the killed save are allowed (and are never what latest names);
#   - `moetron train --load CK --train-iters N+1` loads iteration N and runs exactly one
#     step whose loss, lm/aux loss and gradient norm equal the uninterrupted run's step
#     N+1 bit for bit (the JSON text of the numbers).
# The next loop iteration continues from whatever is in CK. Every step a killed run
# logged must also equal the uninterrupted run, and finally a run from CK to 10 steps past
# the last checkpoint must reproduce the reference tail. The uninterrupted reference is run
# last, exactly as long as needed (the schedule has a fixed --lr-decay-iters, and the
# built-in corpus does not depend on --train-iters, so a longer run's first steps are it).
# Under a sanitizer build (-O0, ~10x slower) the loop has 4 kills instead of 16.
set -u
source "$(dirname "$0")/lib.sh"

# --max-shard-size: the weights in four shard files plus an index (more files, more moments
# to land in); --peak-tflops: no GEMM measurement at every start.
MODEL=(--num-layers 2 --hidden-size 16 --num-attention-heads 2 --num-experts 4 --moe-ffn-hidden-size 16
       --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --eval-interval 0 --log-interval 1
       --lr-warmup-iters 2 --lr-decay-iters 1000 --mock-data-tokens 65536 --max-shard-size 16KB --peak-tflops 1)
CK=$work/ck
LATEST=$CK/latest_checkpointed_iteration.txt
TOTAL=100000  # the killed runs never finish
KILLS=16
if sanitizer_build "$M"; then
    KILLS=4
    echo "skip crash_resume_kills_5_to_16: sanitizer build, 4 kills (the plain build runs 16)"
fi
RANDOM=1234

# complete_dir DIR N: prints why DIR is not a complete checkpoint of iteration N (nothing if it is)
complete_dir() {
    local dir=$1 n=$2 f shards count
    [ -d "$dir" ] || { echo "$dir is missing"; return; }
    for f in config.json optimizer.safetensors trainer_state.json; do
        [ -s "$dir/$f" ] || { echo "$dir/$f is missing or empty"; return; }
    done
    if [ -e "$dir/model.safetensors.index.json" ]; then
        shards=$(grep -o 'model-[0-9]*-of-[0-9]*\.safetensors' "$dir/model.safetensors.index.json" | sort -u)
        count=$(echo "$shards" | grep -c .)
        [ "$count" -ge 1 ] || { echo "$dir: the index names $count shards"; return; }
        for f in $shards; do
            [ -s "$dir/$f" ] || { echo "$dir/$f (named by the index) is missing or empty"; return; }
            [ "${f#*-of-}" = "$(printf '%05d.safetensors' "$count")" ] || { echo "$dir: shard $f of $count"; return; }
        done
    else
        [ -s "$dir/model.safetensors" ] || { echo "$dir has neither model.safetensors nor an index"; return; }
    fi
    if [ -e "$dir/checksums.json" ]; then  # each file it lists has the size it records (the loader checks CRCs)
        local entry name bytes
        for entry in $(tr -d ' \n' <"$dir/checksums.json" | grep -o '"[^"]*":{"bytes":[0-9]*'); do
            name=${entry#\"} name=${name%%\"*} bytes=${entry##*:}
            [ "$(stat -c %s "$dir/$name" 2>/dev/null)" = "$bytes" ] ||
                { echo "$dir/$name is not the $bytes bytes checksums.json lists"; return; }
        done
    fi
    grep -Eq "\"iteration\": *$n *," "$dir/trainer_state.json" ||
        { echo "$dir/trainer_state.json does not say iteration $n: $(tr -d '\n' <"$dir/trainer_state.json")"; return; }
    f=$(ls "$dir" | grep '\.tmp\.' | head -3 | tr '\n' ' ')
    [ -z "$f" ] || echo "$dir holds temporary files: $f"
}

# steps FILE: "step loss lm aux grad" of each complete JSONL line (a killed run may leave half a line)
steps() { grep '^{"step".*}$' "$1" >"$work/steps.tmp" 2>/dev/null; losses "$work/steps.tmp"; }

start=$SECONDS
prev=0 checks=0 in_save=0 leftovers=0 ahead=0 bad=0 schedule=
: >"$work/expected"  # "step loss lm aux grad" lines that must equal the reference
for ((i = 1; i <= KILLS; i++)); do
    delay_ms=$((50 + RANDOM % 1451))
    schedule+=" $delay_ms"
    load=()
    [ -e "$LATEST" ] && load=(--load "$CK")
    "$M" train "${MODEL[@]}" ${load[@]+"${load[@]}"} --train-iters $TOTAL --save "$CK" --save-interval 1 \
        --log-jsonl "$work/run$i.jsonl" >"$work/run$i.log" 2>&1 &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    # a save of this process under way: its iter_N.tmp.PID directory or latest's temporary file
    ls "$CK" 2>/dev/null | grep -q "\.tmp\.$pid\$" && in_save=$((in_save + 1))
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
    if [ $rc -ne 137 ]; then
        fail crash_resume_kill_$i "the run exited with status $rc before the kill: $(tail -3 "$work/run$i.log")"
        bad=1
        break
    fi
    ls "$CK" 2>/dev/null | grep -q "^iter_[0-9]*\.tmp\.$pid\$" && leftovers=$((leftovers + 1))
    steps "$work/run$i.jsonl" >>"$work/expected"
    saved=$(grep -o 'saved checkpoint .*/iter_[0-9]*' "$work/run$i.log" | tail -1 | grep -o '[0-9]*$')
    if [ ! -e "$LATEST" ]; then
        if [ -n "$saved" ] || [ $prev -gt 0 ]; then
            fail crash_resume_kill_$i "no latest_checkpointed_iteration.txt after 'saved checkpoint' (printed: ${saved:-none}, before: $prev)"
            bad=1
            break
        fi
        continue  # killed before the first save completed: the next run starts afresh
    fi
    n=$(cat "$LATEST")
    if ! [[ $n =~ ^[0-9]+$ ]]; then
        fail crash_resume_kill_$i "latest_checkpointed_iteration.txt holds '$n'"
        bad=1
        break
    fi
    n=$((10#$n))
    if [ $n -lt $prev ] || [ $n -lt $((10#${saved:-0})) ]; then
        fail crash_resume_kill_$i "latest went back to $n (it was $prev; the killed run printed saved ${saved:-none})"
        bad=1
        break
    fi
    why=$(complete_dir "$CK/$(printf 'iter_%07d' $n)" $n)
    if [ -n "$why" ]; then
        fail crash_resume_kill_$i "latest names iteration $n: $why"
        bad=1
        break
    fi
    # a complete directory newer than latest: killed between its rename and latest's update
    for d in "$CK"/iter_???????; do
        [ -d "$d" ] && [ $((10#${d##*_})) -gt $n ] && { ahead=$((ahead + 1)); break; }
    done
    if ! "$M" train "${MODEL[@]}" --load "$CK" --train-iters $((n + 1)) --save= \
        --log-jsonl "$work/check$i.jsonl" >"$work/check$i.log" 2>&1; then
        fail crash_resume_kill_$i "resuming from iteration $n failed: $(tail -3 "$work/check$i.log")"
        bad=1
        break
    fi
    got=$(steps "$work/check$i.jsonl")
    if ! grep -q "^loaded .*iter_$(printf '%07d' $n) (iteration $n)" "$work/check$i.log" ||
        [ "$(echo "$got" | wc -l)" -ne 1 ] || [ "${got%% *}" != $((n + 1)) ] || [ "$(cat "$LATEST")" != "$n" ]; then
        fail crash_resume_kill_$i "the resume from iteration $n: $(head -1 "$work/check$i.log") / steps: $got / latest now $(cat "$LATEST")"
        bad=1
        break
    fi
    echo "$got" >>"$work/expected"
    checks=$((checks + 1))
    prev=$n
    # keep the disk use small: drop complete iterations older than latest (leftover
    # *.tmp.* directories and any newer complete directory stay for the next run)
    for d in "$CK"/iter_???????; do
        [ -d "$d" ] && [ $((10#${d##*_})) -lt $n ] && rm -rf "$d"
    done
done
loop_s=$((SECONDS - start))

if [ $bad -eq 0 ]; then
    if [ $checks -gt 0 ]; then
        ok crash_resume_latest_complete
    else
        fail crash_resume_latest_complete "no kill left a checkpoint to resume (delays ms:$schedule)"
        bad=1
    fi
    echo "info crash_resume: $KILLS kills in ${loop_s}s (delays ms:$schedule); $in_save landed during a save" \
         "(a .tmp.PID in CK just before the kill), $leftovers left an iter_*.tmp.PID directory, $ahead a complete" \
         "directory newer than latest; latest reached $prev; $checks one-step resumes"
    if [ $((in_save + leftovers)) -gt 0 ]; then
        ok crash_resume_kills_in_saves
    elif [ $KILLS -lt 16 ]; then  # 4 kills of a slow build: that none landed in a save can be chance
        echo "skip crash_resume_kills_in_saves: none of the sanitizer build's $KILLS kills landed during a save"
    else
        fail crash_resume_kills_in_saves "none of $KILLS kills landed during a save (delays ms:$schedule)"
    fi
fi

# the uninterrupted reference, 10 steps past the last checkpoint; the final run finishes there
if [ $bad -eq 0 ]; then
    final=$((prev + 10))
    "$M" train "${MODEL[@]}" --train-iters $final --log-jsonl "$work/ref.jsonl" >"$work/ref.log" 2>&1 ||
        { fail crash_resume_reference "$(tail -3 "$work/ref.log")"; bad=1; }
fi
if [ $bad -eq 0 ]; then
    steps "$work/ref.jsonl" >"$work/ref"
    # every logged step of the killed runs and every one-step resume equals the reference
    sort -u "$work/expected" >"$work/expected.sorted"
    diverged=$(comm -23 "$work/expected.sorted" <(sort -u "$work/ref") | head -3)
    if [ "$(grep -c . "$work/ref")" -ne $final ]; then
        fail crash_resume_exact "the reference logged $(grep -c . "$work/ref") of $final steps"
    elif [ -n "$diverged" ]; then
        fail crash_resume_exact "steps (step loss lm aux grad) that differ from the uninterrupted run:\
 $(echo "$diverged" | tr '\n' ';') reference: $(grep -E "^($(echo $(cut -d' ' -f1 <<<"$diverged") | tr ' ' '|')) " "$work/ref" | tr '\n' ';')"
    else
        ok "crash_resume_exact ($(grep -c . "$work/expected.sorted") steps of killed runs and resumes)"
    fi

    "$M" train "${MODEL[@]}" --load "$CK" --train-iters $final --save "$CK" --save-interval 1 \
        --log-jsonl "$work/final.jsonl" >"$work/final.log" 2>&1 ||
        { fail crash_resume_final "$(tail -3 "$work/final.log")"; bad=1; }
fi
if [ $bad -eq 0 ]; then
    steps "$work/final.jsonl" >"$work/final"
    if ! grep -q "^loaded .* (iteration $prev)" "$work/final.log"; then
        fail crash_resume_final "did not resume from iteration $prev: $(head -1 "$work/final.log")"
    elif ! diff <(sed -n "$((prev + 1)),\$p" "$work/ref") "$work/final" >"$work/final.diff"; then
        fail crash_resume_final "steps $((prev + 1))..$final differ from the uninterrupted run: $(head -4 "$work/final.diff" | tr '\n' ';')"
    elif [ "$(cat "$LATEST")" != "$final" ] || [ -n "$(complete_dir "$CK/$(printf 'iter_%07d' $final)" $final)" ]; then
        fail crash_resume_final "the last checkpoint: latest $(cat "$LATEST"), $(complete_dir "$CK/$(printf 'iter_%07d' $final)" $final)"
    else
        ok "crash_resume_final (steps $((prev + 1))..$final)"
    fi
fi
