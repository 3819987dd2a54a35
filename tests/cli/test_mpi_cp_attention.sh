#!/usr/bin/env bash
# test_mpi_cp_attention.sh — attention over a context-parallel group by every
# --cp-comm-type (p2p, allgather, a2a, a2a+p2p on 4) on 2 and 4 processes:
# BUILD/test_cp_attention(_dbl) under mpirun compares each rank's out, lse, dq, dk and dv of
# its two chunks with one attention over the whole sequence (causal, GQA, MQA,
# v_head_dim ≠ head_dim, packed documents crossing chunks), in float and in double, checks
# that reruns are bit-identical, and checks the ring shift (comm_sendrecv) and its bytes.
# Skipped without an MPI build or without mpirun; under CI=true either is a failure.
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_cp_attention

build=$(dirname "$M")
for np in 2 4; do
    for program in test_cp_attention test_cp_attention_dbl; do
        run_mpi_program "mpi_cp_attention_${program}_np$np" "$np" 120 "$build/$program"
    done
done
