#!/usr/bin/env bash
# test_mpi_comm.sh — the MPI collectives and process groups on 2, 3 and 4 processes
# (BUILD/test_comm_mpi under mpirun: every collective against a serial reference), and
# errors under MPI: one rank's mt_die, or members that disagree on a group, end every
# rank within seconds with the "[rank N]" line; a launcher whose processes see a world of
# one stops them. The mpirun part is skipped without an MPI build (NO_MPI=1, or no mpicc)
# or without mpirun; under CI=true either is a failure.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
program=$(dirname "$M")/test_comm_mpi

# A launcher's environment with a world of one process stops with one line, in either build.
if [ "$(mpi_library)" = none ]; then
    expect_error launcher_without_mpi "started 4 processes, but this moetron was built without MPI" -- \
        env OMPI_COMM_WORLD_SIZE=4 "$M" --version
else
    expect_error launcher_world_of_one "started 2 processes, but MPI sees only this one" -- \
        "${NO_LEAK_CHECK[@]}" SLURM_STEP_NUM_TASKS=2 MOETRON_MPI=1 "$M" --version
fi

mpi_require mpi_comm

# NAME PATTERN -- RANKS PROGRAM ARGS...: mpirun ends with a non-zero status (a hang ends
# at the 60 s limit, status 124), the output has the line "moetron: error: PATTERN"
# (PATTERN starts with the rank), no rank got past the failure, and no rank is left: no
# process whose command line is PROGRAM with an argument holding $token (ARGS hold it).
# The pattern starts at the program, so that it matches the ranks only, never a launcher
# or pidwait's own timeout, whose command lines hold the token further on.
expect_all_ranks_end() {
    local name=$1 pattern=$2 np=$4
    shift 4
    local ranks="^[^ ]*$(basename "$1") .*$token"
    timeout 60 "${MPIRUN[@]}" -np "$np" "$@" >"$work/$name.out" 2>&1
    local rc=$? left
    # the ranks may still be exiting after mpirun returned: wait for them to end (bounded)
    timeout 30 pidwait -f "$ranks"
    left=$(pgrep -f "$ranks")
    if [ -n "$left" ]; then
        fail "$name" "processes still running after mpirun returned: $left"
        kill $left 2>/dev/null
    elif [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
        fail "$name" "mpirun exit status $rc (124: still running after 60 s)"
    elif ! grep -q "^moetron: error: $pattern" "$work/$name.out"; then
        fail "$name" "no line 'moetron: error: $pattern' in: $(head -c 400 "$work/$name.out")"
    elif grep -q '^FAIL' "$work/$name.out"; then
        fail "$name" "$(grep '^FAIL' "$work/$name.out" | head -1)"
    else
        ok "$name"
    fi
}

for np in 2 3 4; do run_mpi_program "mpi_collectives_np$np" "$np" 60 "$program"; done
token=moetron_mpi_test_$$_$RANDOM
expect_all_ranks_end mpi_die_one_rank "\[rank 1\] deliberate failure on rank 1" -- 4 "$program" die "$token"
expect_all_ranks_end mpi_group_disagreement "\[rank 1\] process group bad: the members disagree on its ranks" -- \
    3 "$program" badgroup "$token"
expect_all_ranks_end mpi_moetron_bad_flag "\[rank [01]\] --num-layers expects an integer, got '$token'" -- \
    2 "$M" train --num-layers "$token"
