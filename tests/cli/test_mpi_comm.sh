#!/usr/bin/env bash
# test_mpi_comm.sh — the MPI collectives and process groups on 2, 3 and 4 processes
# (BUILD/test_comm_mpi under mpirun: every collective against a serial reference), and
# errors under MPI: one rank's mt_die, or members that disagree on a group, end every
# rank within seconds with the "[rank N]" line; a launcher whose processes see a world of
# one stops them. The mpirun part is skipped when moetron is built without MPI (NO_MPI=1,
# or no mpicc); under CI=true a missing mpirun is a failure.
set -u
source "$(dirname "$0")/lib.sh"
program=$(dirname "$M")/test_comm_mpi
# mpirun refuses root without these; 4 ranks share 2 cores; Open MPI's runtime threads
# leak a few allocations at exit, so sanitizer builds check leaks outside mpirun only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0

# A launcher's environment with a world of one process stops with one line, in either build.
if "$M" --version | grep -q 'mpi: none'; then
    expect_error launcher_without_mpi "started 4 processes, but this moetron was built without MPI" -- \
        env OMPI_COMM_WORLD_SIZE=4 "$M" --version
else
    expect_error launcher_world_of_one "started 2 processes, but MPI sees only this one" -- \
        env SLURM_STEP_NUM_TASKS=2 MOETRON_MPI=1 "$M" --version
fi

if ! command -v mpirun >/dev/null; then
    if [ "${CI:-}" = "true" ]; then
        fail mpi_comm "mpirun not found under CI (apt-get install openmpi-bin libopenmpi-dev)"
    else
        echo "skip mpi_comm: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    fi
    exit 0
fi
if "$M" --version | grep -q 'mpi: none'; then
    echo "skip mpi_comm: moetron was built without MPI ($("$M" --version))"
    exit 0
fi
if [ ! -x "$program" ]; then
    fail mpi_comm "$program is missing (make $(basename "$(dirname "$M")")/test_comm_mpi)"
    exit 0
fi

launch() {  # ranks, command...: mpirun with a time limit
    local np=$1
    shift
    timeout 60 mpirun --oversubscribe -np "$np" "$@"
}

test_collectives() {  # the program prints ok/FAIL per check
    local np=$1
    launch "$np" "$program" >"$work/np$np.out" 2>"$work/np$np.err"
    local rc=$?
    cat "$work/np$np.out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/np$np.out"; then
        fail "mpi_collectives_np$np" "mpirun exited with status $rc: $(tail -3 "$work/np$np.err" | tr '\n' ' ')"
    elif [ $rc -eq 0 ] && ! grep -q '^ok ' "$work/np$np.out"; then
        fail "mpi_collectives_np$np" "no check ran: $(head -3 "$work/np$np.err" | tr '\n' ' ')"
    fi
}

# NAME PATTERN TOKEN -- RANKS command...: mpirun ends with a non-zero status (a hang ends
# at launch's timeout, status 124),
# the output has the line "moetron: error: PATTERN" (PATTERN starts with the rank), no
# rank got past the failure, and no process whose command line has TOKEN is left.
expect_all_ranks_end() {
    local name=$1 pattern=$2 token=$3
    shift 4
    launch "$@" >"$work/$name.out" 2>&1
    local rc=$? left
    # the ranks may still be exiting after mpirun returned: wait for them to end (bounded)
    timeout 30 pidwait -f "$token"
    left=$(pgrep -f "$token")
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

for np in 2 3 4; do test_collectives "$np"; done
token=moetron_mpi_test_$$_$RANDOM
expect_all_ranks_end mpi_die_one_rank "\[rank 1\] deliberate failure on rank 1" "die $token" -- \
    4 "$program" die "$token"
expect_all_ranks_end mpi_group_disagreement "\[rank 1\] process group bad: the members disagree on its ranks" \
    "badgroup $token" -- 3 "$program" badgroup "$token"
expect_all_ranks_end mpi_moetron_bad_flag "\[rank [01]\] --num-layers expects an integer, got '$token'" "$token" -- \
    2 "$M" train --num-layers "$token"
