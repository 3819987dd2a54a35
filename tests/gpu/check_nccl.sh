#!/usr/bin/env bash
# check_nccl.sh [BUILD] — the NCCL collectives (src/parallel/comm_nccl.c) on a machine with
# two or more GPUs, one per rank; BUILD (default build) has moetron, its cuda plugin and
# test_comm_mpi built with MPI, CUDA and NCCL (make; make BUILD/test_comm_mpi). Prints
# "skipped: needs 2 GPUs" and exits 0 where nvidia-smi -L lists fewer.
#   1. BUILD/test_comm_mpi under MOETRON_NCCL=1 on 2 .. min(GPUs, 4) ranks: every
#      collective through NCCL against the serial references (sums bit-identical in rank
#      order, sub-groups, non-blocking overlap); its buffers are host memory, so this also
#      covers the device copies of host buffers;
#   2. with NCCL on, one rank's mt_die still ends every rank within seconds;
#   3. with moetron train --device cuda (when this moetron has --device): 10 steps of DP=2
#      (also with accumulation, the distributed optimizer, global_aux_loss), EP=2 (both
#      dispatchers), PP=2 and CP=2 (point-to-point and ring shifts staged through host
#      memory), and EP=2 x DP=2 on 4 GPUs. The trainer must turn NCCL on itself
#      (comm_use_nccl; NCCL_DEBUG=VERSION shows that NCCL started — if not, that fails and
#      the run is repeated with MOETRON_NCCL=1), two runs must give the same bits (losses
#      and gradient norms), and be within 1e-3 of the cpu run's losses (the GPU's compute
#      makes that difference); with MOETRON_NCCL=0 a multi-GPU run must refuse to start
#      with one line (MPI cannot sum device memory);
#   4. a stopped rank: the watchdog (--distributed-timeout-minutes) ends a NCCL run.
# Ends with "N passed, M failed"; exits 1 when a check failed.
set -u
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
case "$build" in /*) ;; *) build=$root/$build ;; esac
M=$build/moetron
program=$build/test_comm_mpi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -lt 2 ]; then
    echo "skipped: needs 2 GPUs (nvidia-smi -L lists ${gpus:-0})"
    exit 0
fi

# lib.sh: $work; mpi_lib.sh: MPIRUN (mpirun as root, oversubscribed, unbound), curve
export MOETRON=$M
source "$root/tests/cli/lib.sh"
source "$root/tests/cli/mpi_lib.sh"
passed=0 failed=0
ok() { echo "ok $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit; }

plugin=$build/libmoetron_cuda.so  # the cuda backend, NCCL included when the build found nccl.h
if ! "$M" --version 2>/dev/null | grep -q 'cuda: yes' || ! ldd "$plugin" 2>/dev/null | grep -q libnccl; then
    fail nccl_build "$M and $plugin are not built with CUDA and NCCL: $("$M" --version 2>&1)"
    finish
fi
command -v mpirun >/dev/null || { fail nccl_build "mpirun not found"; finish; }
# empty MOETRON_NCCL: the trainer decides (comm_use_nccl); NCCL's warnings are shown
export MOETRON_NCCL='' NCCL_DEBUG=WARN
launch() {  # ranks, command...: mpirun with a time limit, the NCCL variables passed on
    local np=$1
    shift
    timeout 300 "${MPIRUN[@]}" -x MOETRON_NCCL -x NCCL_DEBUG -np "$np" "$@"
}
nccl_started() { grep -q 'NCCL version' "$1"; }
first_error() { grep -m1 'moetron: error' "$1" || tail -1 "$1"; }

# ---- 1. every collective through NCCL -----------------------------------------------------
if [ -x "$program" ]; then
    for np in $(seq 2 $((gpus < 4 ? gpus : 4))); do
        out=$work/np$np.out
        MOETRON_NCCL=1 NCCL_DEBUG=VERSION launch "$np" "$program" >"$out" 2>&1
        rc=$?
        grep -E '^(ok|FAIL) ' "$out" | sed 's/^ok /ok nccl_/; s/^FAIL /FAIL nccl_/'
        passed=$((passed + $(grep -c '^ok ' "$out"))) failed=$((failed + $(grep -c '^FAIL ' "$out")))
        if ! nccl_started "$out"; then fail "nccl_collectives_np$np" "NCCL never started: $(first_error "$out")"
        elif [ $rc -ne 0 ] && ! grep -q '^FAIL' "$out"; then fail "nccl_collectives_np$np" "exit $rc: $(first_error "$out")"
        elif ! grep -q '^ok ' "$out"; then fail "nccl_collectives_np$np" "no check ran"
        fi
    done
    # ---- 2. one rank's error ends every rank ----------------------------------------------
    token=moetron_nccl_check_$$
    start=$SECONDS
    MOETRON_NCCL=1 launch 2 "$program" die "$token" >"$work/die.out" 2>&1
    rc=$? took=$((SECONDS - start))
    sleep 1
    if pgrep -f "$token" >/dev/null; then fail nccl_die_one_rank "processes left: $(pgrep -f "$token" | tr '\n' ' ')"
    elif [ $rc -eq 0 ] || [ $took -gt 60 ]; then fail nccl_die_one_rank "exit $rc after ${took}s"
    elif ! grep -q '^moetron: error: \[rank 1\] deliberate failure on rank 1' "$work/die.out"; then
        fail nccl_die_one_rank "no [rank 1] line: $(first_error "$work/die.out")"
    else ok nccl_die_one_rank; fi
else
    fail nccl_collectives "$program is missing (make $(basename "$build")/test_comm_mpi)"
fi

# ---- 3. training: NCCL = MPI on the same GPUs, bit for bit; both close to the cpu -------------
if ! "$M" flags 2>/dev/null | grep -q -- '--device'; then
    echo "skip nccl_training: $M has no --device flag yet"
    finish
fi
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
       --num-experts 4 --moe-ffn-hidden-size 64 --eval-interval 0 --lr-warmup-iters 2 --log-interval 1
       --mock-data-tokens 65536 --train-iters 10)
# close A B: the same steps, losses within 1e-3 relative (empty when so)
close() {
    python3 - "$1" "$2" <<'PY'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
if len(a) != len(b) or not a: print(f"{len(a)} vs {len(b)} steps"); sys.exit()
worst = max(abs(float(x[1]) - float(y[1])) / max(abs(float(x[1])), 1e-12) for x, y in zip(a, b))
if worst > 1e-3: print(f"largest relative loss difference {worst:.3g} > 1e-3")
PY
}
train() {  # train NAME RANKS DEVICE [flags...]: WORK/NAME.jsonl and .log
    local name=$1 np=$2 device=$3
    shift 3
    launch "$np" "$M" train "${SMALL[@]}" --device "$device" "$@" --log-jsonl "$work/$name.jsonl" \
        >"$work/$name.log" 2>&1 || { fail "$name" "$(first_error "$work/$name.log")"; return 1; }
    curve "$work/$name.jsonl" >"$work/$name.curve"  # repr of the floats: every bit shows
}
train_case() {  # NAME RANKS flags...
    local name=$1 np=$2
    shift 2
    train "$name.cpu" "$np" cpu "$@" || return
    train "$name.rerun" "$np" cuda "$@" || return
    NCCL_DEBUG=VERSION train "$name.nccl" "$np" cuda "$@" || return
    if ! nccl_started "$work/$name.nccl.log"; then  # then the bits are checked with NCCL forced on
        fail "${name}_trainer_uses_nccl" "NCCL never started under --device cuda (the trainer calls comm_use_nccl?)"
        MOETRON_NCCL=1 NCCL_DEBUG=VERSION train "$name.nccl" "$np" cuda "$@" || return
    fi
    local diff why
    diff=$(diff "$work/$name.rerun.curve" "$work/$name.nccl.curve" | head -2 | tr '\n' ' ')
    if [ -z "$diff" ] && [ -s "$work/$name.nccl.curve" ]; then ok "${name}_nccl_rerun_bits"
    else fail "${name}_nccl_rerun_bits" "${diff:-no steps logged}"; fi
    why=$(close "$work/$name.cpu.curve" "$work/$name.nccl.curve")
    if [ -z "$why" ]; then ok "${name}_gpu_close_to_cpu"; else fail "${name}_gpu_close_to_cpu" "$why"; fi
}
train_case dp2 2 --global-batch-size 4
train_case dp2_accumulation 2 --global-batch-size 8
train_case dp2_distributed_optimizer 2 --global-batch-size 4 --use-distributed-optimizer
train_case dp2_global_aux 2 --global-batch-size 4 --moe-router-load-balancing-type global_aux_loss \
    --moe-aux-loss-coeff 0.1
train_case ep2_alltoall 2 --global-batch-size 4 --expert-model-parallel-size 2
train_case ep2_allgather 2 --global-batch-size 4 --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather
train_case pp2 2 --global-batch-size 4 --pipeline-model-parallel-size 2
train_case cp2 2 --global-batch-size 4 --context-parallel-size 2
MOETRON_NCCL=0 launch 2 "$M" train "${SMALL[@]}" --device cuda --train-iters 1 >"$work/no_nccl.log" 2>&1
if grep -q "needs NCCL" "$work/no_nccl.log"; then ok no_nccl_refused
else fail no_nccl_refused "a 2-GPU run with MOETRON_NCCL=0: $(tail -1 "$work/no_nccl.log")"; fi
if [ "$gpus" -ge 4 ]; then
    train_case ep2_dp2 4 --global-batch-size 8 --expert-model-parallel-size 2 --use-distributed-optimizer
fi

# ---- 4. a stopped rank: the watchdog ends a run waiting in NCCL ---------------------------------
MOETRON_NCCL=1 launch 2 "$M" train "${SMALL[@]}" --device cuda --global-batch-size 4 --train-iters 100000 \
    --distributed-timeout-minutes 0.05 --log-jsonl "$work/wd.jsonl" >"$work/wd.out" 2>&1 &
for _ in $(seq 600); do grep -q '"step":2,' "$work/wd.jsonl" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f -- "^$M train .*--distributed-timeout-minutes 0.05" | tail -1)  # a rank, not mpirun
start=$SECONDS
[ -n "$victim" ] && kill -STOP "$victim"
wait %%
rc=$?
[ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "has waited [0-9]* s, more than --distributed-timeout-minutes 0.05" "$work/wd.out"; then
    ok nccl_distributed_timeout_ends_the_job
else
    fail nccl_distributed_timeout_ends_the_job "exit $rc after $((SECONDS - start)) s: $(first_error "$work/wd.out")"
fi
finish
