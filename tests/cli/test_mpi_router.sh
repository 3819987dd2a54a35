#!/usr/bin/env bash
# test_mpi_router.sh — the MoE router over a token group (sequence / tensor parallelism):
# BUILD/test_router_group (real = float) and BUILD/test_router_group_dbl (real = double)
# under mpirun -np 2, 3 and 4, each rank routing its chunk of a micro-batch with the token
# group and comparing every output with the one-process router on all of the micro-batch's
# tokens (tests/mpi/test_router_group.c). Skipped when moetron is built without MPI or when
# mpirun is missing; under CI=true either is a failure.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
if "$M" --version | grep -q 'mpi: none'; then
    if [ "${CI:-}" = "true" ]; then fail mpi_router "moetron was built without MPI under CI"; else echo "skip mpi_router: moetron was built without MPI"; fi
    exit 0
fi
if ! command -v mpirun >/dev/null; then
    if [ "${CI:-}" = "true" ]; then
        fail mpi_router "mpirun not found under CI (apt-get install openmpi-bin libopenmpi-dev)"
    else
        echo "skip mpi_router: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    fi
    exit 0
fi

# PROGRAM RANKS: the program prints ok/FAIL per case; a crash or a run that checked nothing fails
run_checks() {
    local program=$1 np=$2 name
    name="mpi_router_$(basename "$program")_np$np"
    if [ ! -x "$program" ]; then
        fail "$name" "$program is missing (make $(basename "$(dirname "$program")")/$(basename "$program"))"
        return
    fi
    timeout 120 "${MPIRUN[@]}" -np "$np" "$program" >"$work/$name.out" 2>"$work/$name.err"
    local rc=$?
    cat "$work/$name.out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/$name.out"; then
        fail "$name" "mpirun exited with status $rc: $(tail -3 "$work/$name.err" | tr '\n' ' ')"
    elif [ $rc -eq 0 ] && ! grep -q '^ok ' "$work/$name.out"; then
        fail "$name" "no check ran: $(head -3 "$work/$name.err" | tr '\n' ' ')"
    fi
}

build=$(dirname "$M")
for np in 2 3 4; do
    run_checks "$build/test_router_group" "$np"
    run_checks "$build/test_router_group_dbl" "$np"
done
