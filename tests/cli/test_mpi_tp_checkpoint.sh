#!/usr/bin/env bash
# test_mpi_tp_checkpoint.sh — checkpoints of tensor-parallel (TP, ETP) runs stay global and
# Hugging Face-named, so any TP/ETP/EP/DP layout resumes any other: BUILD/test_ckpt_tp_mpi
# under mpirun -np 4 and -np 2 walks a chain of layouts (one process -> TP=2 x ETP=2 x EP=2
# -> TP=4 x EP=2 -> EP=4 (dense DP=4) -> TP=2 x ETP=2 x EDP=2 -> one process, and on 2 ranks TP=2,
# TP=2 x ETP=2, EP=2), each loading the last one's checkpoint and checking every parameter
# and moment it holds bit for bit, each save byte for byte the one-process files.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_tp_checkpoint
program=$(dirname "$M")/test_ckpt_tp_mpi
if [ ! -x "$program" ]; then
    fail mpi_tp_checkpoint "$program is missing (make $(basename "$(dirname "$M")")/test_ckpt_tp_mpi)"
    exit 0
fi

layout_chain() {  # ranks: the program prints ok/FAIL per layout
    local np=$1
    mkdir -p "$work/np$np"
    timeout 300 "${MPIRUN[@]}" -np "$np" "$program" "$work/np$np" >"$work/np$np.out" 2>"$work/np$np.err"
    local rc=$?
    cat "$work/np$np.out"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/np$np.out"; then
        fail "mpi_tp_checkpoint_np$np" "mpirun exited with status $rc: $(grep -m2 'moetron: error' "$work/np$np.err" | tr '\n' ' ')"
    elif [ $rc -eq 0 ] && ! grep -q '^ok ' "$work/np$np.out"; then
        fail "mpi_tp_checkpoint_np$np" "no check ran: $(head -3 "$work/np$np.err" | tr '\n' ' ')"
    fi
}

for np in 4 2; do layout_chain "$np"; done
