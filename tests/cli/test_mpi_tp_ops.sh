#!/usr/bin/env bash
# test_mpi_tp_ops.sh — tensor parallelism's building blocks on 2, 3 and 4 processes:
# BUILD/test_tp_mappings under mpirun checks the block mappings (parallel/tp_mappings.h, a
# column- then row-parallel linear with and without sequence parallelism) and the
# vocab-parallel embedding and cross-entropy (model/vocab_parallel.h) against the unsharded
# computation each rank does itself, and a group of one against the ops bit for bit.
# Skipped without an MPI build or without mpirun; under CI=true either is a failure.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_tp_ops

for np in 2 3 4; do run_mpi_program "mpi_tp_ops_np$np" "$np" 120 "$(dirname "$M")/test_tp_mappings"; done
