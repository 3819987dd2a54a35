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

# step loss grad_norm of a JSONL log
curve() { python3 -c 'import json,sys; [print(r["step"], repr(r["loss"]), repr(r["grad_norm"])) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1"; }

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
