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
mpi_require mpi_router

build=$(dirname "$M")
for np in 2 3 4; do
    for program in test_router_group test_router_group_dbl; do
        run_mpi_program "mpi_router_${program}_np$np" "$np" 120 "$build/$program"
    done
done
