#!/usr/bin/env bash
# test_routing_trace.sh — --moe-routing-trace-path and --moe-enable-routing-replay: a run
# records every training forward's top-k picks (one JSONL file per rank, one record per
# micro-batch and MoE layer, each token's k distinct experts); replaying its trace gives the
# recorded run bit for bit (also with full recomputation, and under EP=2 and TP=2 with SP);
# replay makes another model route as the recording did (its numbers differ from its own
# routing's) and an edited trace's picks are the ones used; a trace is never overwritten
# (nor made, nor a --save directory, by a run refused at start-up), and a missing, damaged or other-layout trace,
# replay past the recorded steps and tracing a dense model are one-line errors.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --eval-interval 2
      --eval-iters 1 --lr-warmup-iters 1 --mock-data-tokens 16384 --train-iters 3 --log-interval 1)

# record NAME LAUNCH... -- FLAGS...: a run writing its trace to $work/NAME.trace
record() {
    local name=$1 launch=()
    shift
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    "${launch[@]}" "$M" train "${TINY[@]}" "$@" --moe-routing-trace-path "$work/$name.trace" \
        --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1
}

# replay NAME TRACE LAUNCH... -- FLAGS...: a run routing on $work/TRACE.trace
replay() {
    local name=$1 trace=$2 launch=()
    shift 2
    while [ "$1" != "--" ]; do launch+=("$1"); shift; done
    shift
    "${launch[@]}" "$M" train "${TINY[@]}" "$@" --moe-routing-trace-path "$work/$trace.trace" \
        --moe-enable-routing-replay --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1
}

# same_numbers NAME A B: runs A and B logged the same losses and gradient norms bit for bit
same_numbers() {
    if [ -n "$(step_numbers "$work/$2.jsonl")" ] && cmp -s <(step_numbers "$work/$2.jsonl") <(step_numbers "$work/$3.jsonl"); then
        ok "$1"
    else
        fail "$1" "$(diff <(step_numbers "$work/$2.jsonl") <(step_numbers "$work/$3.jsonl") | head -2 | tr '\n' ' ')"
    fi
}

# trace_valid NAME DIR RANKS RECORDS: RANKS files, each a header and RECORDS records of the
# micro-batches' tokens with k distinct experts in range per token
trace_valid() {
    local why
    why=$(python3 - "$2" "$3" "$4" <<'PY'
import json, os, sys
d, ranks, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
files = sorted(os.listdir(d))
if files != [f"rank_{r:05d}.jsonl" for r in range(ranks)]: print("files", files); sys.exit()
for f in files:
    lines = [json.loads(l) for l in open(os.path.join(d, f))]
    head, recs = lines[0], lines[1:]
    if head.get("moetron_routing_trace") != 1 or head["experts"] != 4 or head["topk"] != 2: print("header", head); sys.exit()
    if len(recs) != records: print(f, len(recs), "records"); sys.exit()
    keys = {(r["sample"], r["layer"]) for r in recs}
    if len(keys) != records: print(f, "repeated records"); sys.exit()
    for r in recs:
        if len(r["topk"]) != r["tokens"] or r["tokens"] <= 0: print(f, "tokens", r["tokens"]); sys.exit()
        for picks in r["topk"]:
            if len(picks) != 2 or len(set(picks)) != 2 or not all(0 <= e < 4 for e in picks): print(f, picks); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

# one process: 3 steps x 2 micro-batches x 2 MoE layers
record plain env -- && trace_valid trace_records_every_forward "$work/plain.trace" 1 12 ||
    fail trace_records_every_forward "$(tail -2 "$work/plain.log")"
replay plain_replayed plain env -- && same_numbers replay_reproduces_recorded_run plain plain_replayed
# full recomputation replays in the recomputed forward too
RECOMPUTE=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
record recompute env -- "${RECOMPUTE[@]}" && replay recompute_replayed recompute env -- "${RECOMPUTE[@]}" &&
    same_numbers replay_with_recompute recompute recompute_replayed
# another model (seed 99) routed as the recording did: not its own routing
"$M" train "${TINY[@]}" --seed 99 --log-jsonl "$work/seed99.jsonl" >"$work/seed99.log" 2>&1
replay seed99_replayed plain env -- --seed 99
if [ -n "$(step_numbers "$work/seed99_replayed.jsonl")" ] &&
    ! cmp -s <(step_numbers "$work/seed99.jsonl") <(step_numbers "$work/seed99_replayed.jsonl"); then
    ok replay_overrides_the_router
else
    fail replay_overrides_the_router "$(tail -2 "$work/seed99_replayed.log" | tr '\n' ' ')"
fi

# an edited trace sending every token to experts 0 and 1: every step's load is then exactly
# twice the mean (the picks are the trace's, not the router's)
mkdir -p "$work/edited.trace"
python3 - "$work/plain.trace/rank_00000.jsonl" "$work/edited.trace/rank_00000.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
out = [lines[0]]
for line in lines[1:]:
    rec = json.loads(line)
    rec["topk"] = [[1, 0] for _ in rec["topk"]]
    out.append(json.dumps(rec))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
replay edited_replayed edited env --
if python3 -c 'import json,sys; l=[r["load_imbalance"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]; sys.exit(not (len(l) == 3 and all(v == 2.0 for v in l)))' \
    "$work/edited_replayed.jsonl"; then
    ok replay_routes_on_the_trace
else
    fail replay_routes_on_the_trace "$(grep -o '"load_imbalance":[0-9.]*' "$work/edited_replayed.jsonl" | tr '\n' ' ') $(tail -1 "$work/edited_replayed.log")"
fi

expect_error trace_not_overwritten "rank_00000.jsonl exists; give a new directory" -- \
    "$M" train "${TINY[@]}" --moe-routing-trace-path "$work/plain.trace"
# refused at start-up: no --save directory left behind, no trace file made
expect_error replay_refused_before_saving "nothing.trace/rank_00000.jsonl" -- \
    "$M" train "${TINY[@]}" --moe-routing-trace-path "$work/nothing.trace" --moe-enable-routing-replay \
    --save "$work/never_saved"
[ ! -e "$work/never_saved" ] && [ ! -e "$work/nothing.trace" ] && ok refused_run_leaves_nothing ||
    fail refused_run_leaves_nothing "$(ls -d "$work"/never_saved "$work"/nothing.trace 2>/dev/null | tr '\n' ' ')"
expect_error replay_needs_path "--moe-enable-routing-replay reads the picks from --moe-routing-trace-path" -- \
    "$M" train "${TINY[@]}" --moe-enable-routing-replay
expect_error replay_missing_trace "--moe-enable-routing-replay: .*nothing.trace/rank_00000.jsonl" -- \
    "$M" train "${TINY[@]}" --moe-routing-trace-path "$work/nothing.trace" --moe-enable-routing-replay
expect_error replay_past_recorded_steps "no record of sample 12, layer 0" -- \
    "$M" train "${TINY[@]}" --train-iters 4 --moe-routing-trace-path "$work/plain.trace" --moe-enable-routing-replay
expect_error trace_dense_model "--moe-routing-trace-path traces MoE routing; the model has no experts" -- \
    "$M" train "${TINY[@]}" --num-experts 0 --moe-routing-trace-path "$work/dense.trace"
mkdir -p "$work/bad.trace"
python3 - "$work/plain.trace/rank_00000.jsonl" "$work/bad.trace/rank_00000.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
rec = json.loads(lines[3])
rec["topk"][5] = [1, 1]
lines[3] = json.dumps(rec)
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
expect_error replay_damaged_trace "bad.trace/rank_00000.jsonl:4: token 5 names expert 1 twice" -- \
    "$M" train "${TINY[@]}" --moe-routing-trace-path "$work/bad.trace" --moe-enable-routing-replay

mpi_require routing_trace_mpi
# EP=2 and TP=2 with SP: each rank's picks, replayed bit for bit
record ep2 "${MPIRUN[@]}" -np 2 -- --expert-model-parallel-size 2 && trace_valid trace_ep2 "$work/ep2.trace" 2 6
replay ep2_replayed ep2 "${MPIRUN[@]}" -np 2 -- --expert-model-parallel-size 2 &&
    same_numbers replay_ep2 ep2 ep2_replayed
record tp2 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel &&
    replay tp2_replayed tp2 "${MPIRUN[@]}" -np 2 -- --tensor-model-parallel-size 2 --sequence-parallel &&
    same_numbers replay_tp2_sp tp2 tp2_replayed
# the one-process trace replayed by 2 ranks: rank 0's header names the layout (rank 1 has no
# file); every rank ends
timeout 300 "${MPIRUN[@]}" -np 2 "$M" train "${TINY[@]}" --expert-model-parallel-size 2 \
    --moe-routing-trace-path "$work/plain.trace" --moe-enable-routing-replay >"$work/layout.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "moetron: error: .*recorded with world_size 1, this run has 2" "$work/layout.log"; then
    ok replay_other_layout
else
    fail replay_other_layout "exit $rc (124 = hang): $(grep -m2 error "$work/layout.log" | tr '\n' ' ')"
fi
