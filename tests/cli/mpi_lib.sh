# mpi_lib.sh — what the multi-process tests share (sourced after lib.sh, not run):
# mpi_require NAME skips the script without an MPI build or mpirun (a failure under CI);
# MPIRUN launches oversubscribed ranks as root; run_mpi_program runs a test program of
# tests/mpi/ under it; curve and compare check a run against one process.

# mpi_library: the MPI library moetron was built with ("none" without MPI), from the
# "mpi: ..." of its --version line
mpi_library() { "$M" --version | sed -n 's/.*[(,] *mpi: \([^,)]*\).*/\1/p'; }

# mpi_require NAME: exits the sourcing script (a skip, a failure under CI=true) unless
# moetron was built with MPI and mpirun is found
mpi_require() {
    local library why
    library=$(mpi_library)
    if [ -z "$library" ]; then
        fail "$1" "no 'mpi: ...' in the version line '$("$M" --version 2>&1 | head -1)'"
        exit 0
    elif [ "$library" = none ]; then
        why="moetron was built without MPI"
    elif ! command -v mpirun >/dev/null; then
        why="mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    else
        return 0
    fi
    if [ "${CI:-}" = "true" ]; then fail "$1" "$why under CI"; else echo "skip $1: $why"; fi
    exit 0
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Open MPI's runtime leaks a few allocations at exit that LeakSanitizer cannot attribute:
# leak checks stay on for the single-process runs only
NO_LEAK_CHECK=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
MPIRUN=("${NO_LEAK_CHECK[@]}" mpirun --oversubscribe --bind-to none)

# run_mpi_program NAME RANKS SECONDS PROGRAM ARGS...: a test program of tests/mpi/ (it
# prints ok/FAIL per check) under mpirun for at most SECONDS; NAME fails when the program
# is missing, when mpirun fails without a FAIL line (a crash, a hang), or when nothing was
# checked
run_mpi_program() {
    local name=$1 np=$2 limit=$3 program=$4
    shift 3
    if [ ! -x "$program" ]; then
        fail "$name" "$program is missing (make $(basename "$(dirname "$program")")/$(basename "$program"))"
        return
    fi
    timeout "$limit" "${MPIRUN[@]}" -np "$np" "$@" >"$work/$name.out" 2>"$work/$name.err"
    local rc=$?
    cat "$work/$name.out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/$name.out"; then
        fail "$name" "mpirun exited with status $rc (124: over $limit s): $({ grep -m2 'moetron: error' "$work/$name.err" || tail -3 "$work/$name.err"; } | tr '\n' ' ')"
    elif [ $rc -eq 0 ] && ! grep -q '^ok ' "$work/$name.out"; then
        fail "$name" "no check ran: $(head -3 "$work/$name.err" | tr '\n' ' ')"
    fi
}

# step loss lm_loss grad_norm of a JSONL log: loss is lm_loss plus the router losses the run
# trains with (their coefficients times their values), so both pin the aux losses down
# (the logged aux_loss is the switch loss of each rank's micro-batch even when it is off)
curve() { python3 -c 'import json,sys; [print(r["step"], *(repr(r[k]) for k in ("loss", "lm_loss", "grad_norm"))) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1"; }

# compare NAME A B [RTOL]: the same steps, loss and gradient norm within RTOL (1e-5) relative
compare() {
    local why
    why=$(python3 - "$2" "$3" "${4:-1e-5}" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
rtol = float(sys.argv[3])
if len(a) != len(b) or not a: print(f"{len(a)} vs {len(b)} steps"); sys.exit()
for x, y in zip(a, b):
    if x[0] != y[0]: print(f"step {x[0]} vs {y[0]}"); sys.exit()
    for u, v in zip(x[1:], y[1:]):
        u, v = float(u), float(v)
        if abs(u - v) > rtol * max(abs(u), abs(v), 1e-12): print(f"step {x[0]}: {u} vs {v}"); sys.exit()
PY
)
    [ -z "$why" ] && ok "$1" || fail "$1" "$why"
}

# FROZEN: flags that keep the weights as initialised, so that a layout's every forward and
# backward is the one-process computation (only the gradient sums' order differs)
FROZEN=(--lr 0 --min-lr 0)

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
# mpirun with LAYOUT-FLAGS added (compared within $CASE_RTOL, default 1e-5); the EP run saves
# its checkpoint to $work/NAME.ck
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
    compare "$name" "$ref.a" "$work/$name.b" "${CASE_RTOL:-1e-5}"
}

# identical NAME A B: runs A and B (case names of run_case) logged the same losses and
# gradient norms bit for bit
identical() {
    if [ -n "$(losses "$work/$2.jsonl")" ] && [ "$(losses "$work/$2.jsonl")" = "$(losses "$work/$3.jsonl")" ]; then
        ok "$1"
    else
        fail "$1" "$(diff <(losses "$work/$2.jsonl") <(losses "$work/$3.jsonl") | head -2 | tr '\n' ' ')"
    fi
}

# rerun_identical NAME CASE RANKS LAYOUT-FLAGS... -- FLAGS...: the layout of run_case CASE
# (the same arguments) run again logs the same losses bit for bit
rerun_identical() {
    local name=$1 case=$2 np=$3 layout=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do layout+=("$1"); shift; done
    shift
    timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train "${SMALL[@]}" "$@" "${layout[@]}" \
        --log-jsonl "$work/$case.rerun.jsonl" >"$work/$case.rerun.log" 2>&1 ||
        { fail "$name" "$(tail -2 "$work/$case.rerun.log" | tr '\n' ' ')"; return; }
    identical "$name" "$case.rerun" "$case"
}

# bf16_matches_fp32 VAR[=VALUE] NAME RANKS BYTES_KEY LO HI FLAGS...: with --bf16 (and VAR=VALUE
# when given) the layout of FLAGS trains bit for bit as with VAR=fp32 (the same losses and gradient
# norms over the SMALL model's 10 steps): VAR is MOETRON_EXCHANGE (every exchange fp32, model.h
# model_exchanges_bf16) or MOETRON_ACTIVATIONS (every activation kept fp32, layout.h). BYTES_KEY (a
# JSONL key summed over the steps) then moves LO to HI of its fp32 bytes; "-": no byte check.
bf16_matches_fp32() {
    local var=${1%%=*} first=() name=$2 np=$3 key=$4 lo=$5 hi=$6
    [ "$var" != "$1" ] && first=("$1")
    shift 6
    env ${first[@]+"${first[@]}"} timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train "${SMALL[@]}" --bf16 "$@" \
        --log-jsonl "$work/$name.jsonl" \
        >"$work/$name.log" 2>&1 || { fail "$name" "mpirun: $(tail -2 "$work/$name.log" | tr '\n' ' ')"; return; }
    env "$var=fp32" timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train "${SMALL[@]}" --bf16 "$@" \
        --log-jsonl "$work/$name.fp32.jsonl" >"$work/$name.fp32.log" 2>&1 ||
        { fail "$name" "mpirun ($var=fp32): $(tail -2 "$work/$name.fp32.log" | tr '\n' ' ')"; return; }
    local why
    why=$(python3 - "$work/$name.jsonl" "$work/$name.fp32.jsonl" "$key" "$lo" "$hi" <<'PY'
import json, sys
bf16, fp32 = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
key, lo, hi = sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
same = len(bf16) == len(fp32) > 0 and all(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] for a, b in zip(bf16, fp32))
ratio = sum(r[key] for r in bf16) / max(sum(r[key] for r in fp32), 1) if key != "-" else (lo + hi) / 2
if not same or not lo < ratio < hi: print(f"{len(bf16)} / {len(fp32)} steps identical: {same}; {key} ratio {ratio:.3f}")
PY
)
    [ -z "$why" ] && ok "$name" || fail "$name" "$why"
}

# bf16_exchange_exact NAME RANKS BYTES_KEY LO HI FLAGS...: bf16_matches_fp32 of the exchanges
# (their values travel as bf16 at LO to HI of the fp32 bytes of BYTES_KEY, the same bits).
bf16_exchange_exact() { bf16_matches_fp32 MOETRON_EXCHANGE "$@"; }

# dropped NAME: the reference run of the last run_case dropped tokens (so that capacity is
# really exercised)
dropped() {
    python3 -c 'import json,sys; sys.exit(not any(r.get("dropped_frac", 0) > 0 for r in map(json.loads, open(sys.argv[1]))))' \
        "$ref.jsonl" && ok "$1" || fail "$1" "no step of the single-process run dropped a token"
}

# Under a sanitizer build (several times slower) the cases marked "full" run in the plain
# build only: each repeats a code path another case already takes under the sanitizers
# (both dispatchers, EP with DP, the distributed optimizer, expert bias, capacity and
# the checkpoint moves stay).
if sanitizer_build "$M"; then
    full() { echo "skip $1: sanitizer build (run by the plain build)"; }
else
    full() { "${@:2}"; }
fi
# maybe_full NAME command...: the command when NAME is in the script's SANITIZED list (the
# cases that represent the script under the sanitizers), otherwise full NAME command...
maybe_full() { case "${SANITIZED:-}" in *" $1 "*) "${@:2}" ;; *) full "$@" ;; esac; }
