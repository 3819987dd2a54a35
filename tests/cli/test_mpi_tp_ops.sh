#!/usr/bin/env bash
# test_mpi_tp_ops.sh — tensor parallelism's building blocks on 2, 3 and 4 processes:
# BUILD/test_tp_mappings under mpirun checks the block mappings (parallel/tp_mappings.h, a
# column- then row-parallel linear with and without sequence parallelism) and the
# vocab-parallel embedding and cross-entropy (model/vocab_parallel.h) against the unsharded
# computation each rank does itself, and a group of one against the ops bit for bit.
# Skipped without mpirun or without an MPI build; under CI=true either is a failure.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
program=$(dirname "$M")/test_tp_mappings

skip_or_fail() {  # why: a failure under CI, else a skip
    if [ "${CI:-}" = "true" ]; then fail mpi_tp_ops "$1 under CI"; else echo "skip mpi_tp_ops: $1"; fi
    exit 0
}
command -v mpirun >/dev/null || skip_or_fail "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
if "$M" --version | grep -q 'mpi: none'; then skip_or_fail "moetron was built without MPI ($("$M" --version))"; fi
if [ ! -x "$program" ]; then
    fail mpi_tp_ops "$program is missing (make $(basename "$(dirname "$M")")/test_tp_mappings)"
    exit 0
fi

run_checks() {  # ranks: the program prints ok/FAIL per check; a crash or no check at all fails
    local np=$1
    timeout 120 "${MPIRUN[@]}" -np "$np" "$program" >"$work/np$np.out" 2>"$work/np$np.err"
    local rc=$?
    cat "$work/np$np.out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/np$np.out"; then
        fail "mpi_tp_ops_np$np" "mpirun exited with status $rc (124: over 120 s): $(tail -3 "$work/np$np.err" | tr '\n' ' ')"
    elif [ $rc -eq 0 ] && ! grep -q '^ok ' "$work/np$np.out"; then
        fail "mpi_tp_ops_np$np" "no check ran: $(head -3 "$work/np$np.err" | tr '\n' ' ')"
    fi
}

for np in 2 3 4; do run_checks "$np"; done
