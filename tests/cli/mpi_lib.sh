# mpi_lib.sh — what the multi-process tests share (sourced after lib.sh, not run):
# mpi_require NAME skips the script without an MPI build (a failure under CI); MPIRUN
# launches oversubscribed ranks as root; curve and compare check a run against one process.

# mpi_require NAME: exits the sourcing script unless moetron was built with MPI
mpi_require() {
    if "$M" --version | grep -q "mpi"; then return; fi
    if [ "${CI:-}" = "true" ]; then fail "$1" "moetron was built without MPI under CI"; else echo "skip $1: no MPI build"; fi
    exit 0
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Open MPI's runtime leaks a few allocations at exit that LeakSanitizer cannot attribute:
# leak checks stay on for the single-process runs only
MPIRUN=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun --oversubscribe --bind-to none)

# step loss lm_loss grad_norm of a JSONL log: loss is lm_loss plus the router losses the run
# trains with (their coefficients times their values), so both pin the aux losses down
# (the logged aux_loss is the switch loss of each rank's micro-batch even when it is off)
curve() { python3 -c 'import json,sys; [print(r["step"], *(repr(r[k]) for k in ("loss", "lm_loss", "grad_norm"))) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1"; }

# compare NAME A B: the same steps, loss and gradient norm within 1e-5 relative
compare() {
    local why
    why=$(python3 - "$2" "$3" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
if len(a) != len(b) or not a: print(f"{len(a)} vs {len(b)} steps"); sys.exit()
for x, y in zip(a, b):
    if x[0] != y[0]: print(f"step {x[0]} vs {y[0]}"); sys.exit()
    for u, v in zip(x[1:], y[1:]):
        u, v = float(u), float(v)
        if abs(u - v) > 1e-5 * max(abs(u), abs(v), 1e-12): print(f"step {x[0]}: {u} vs {v}"); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

# reference FLAGS...: the single-process run of the script's SMALL model flags and these, run once; sets $ref to its
# file prefix ($ref.a: the curve, $ref.jsonl, $ref.ck: its checkpoint)
nref=0
reference() {
    local key
    key=$(printf '%s\n' "$@" | md5sum | cut -c1-12)
    ref="$work/ref.$key"
    [ -f "$ref.a" ] && return 0
    nref=$((nref + 1))
    "$M" train "${SMALL[@]}" "$@" --save "$ref.ck" --log-jsonl "$ref.jsonl" >"$ref.log" 2>&1 || return 1
    curve "$ref.jsonl" >"$ref.a"
}

# run_case NAME RANKS LAYOUT-FLAGS... -- FLAGS...: the single-process run of FLAGS against
# mpirun with LAYOUT-FLAGS added; the EP run saves its checkpoint to $work/NAME.ck
run_case() {
    local name=$1 np=$2 layout=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do layout+=("$1"); shift; done
    shift
    reference "$@" || { fail "$name" "single process: $(tail -1 "$ref.log")"; return 1; }
    timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train "${SMALL[@]}" "$@" "${layout[@]}" --save "$work/$name.ck" \
        --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1 ||
        { fail "$name" "mpirun: $(tail -2 "$work/$name.log" | tr '\n' ' ')"; return 1; }
    curve "$work/$name.jsonl" >"$work/$name.b"
    compare "$name" "$ref.a" "$work/$name.b"
}

# dropped NAME: the reference run of the last run_case dropped tokens (so that capacity is
# really exercised)
dropped() {
    python3 -c 'import json,sys; sys.exit(not any(r.get("dropped_frac", 0) > 0 for r in map(json.loads, open(sys.argv[1]))))' \
        "$ref.jsonl" && ok "$1" || fail "$1" "no step of the single-process run dropped a token"
}

# Under a sanitizer build (-O0, ~10x slower) the cases marked "full" run in the plain
# build only: each repeats a code path another case already takes under the sanitizers
# (both dispatchers, EP with DP, the distributed optimizer, expert bias, capacity and
# the checkpoint moves stay).
if "$M" --version | grep -q sanitizers; then
    full() { echo "skip $1: sanitizer build (run by the plain build)"; }
else
    full() { "${@:2}"; }
fi
