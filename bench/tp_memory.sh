#!/usr/bin/env bash
# bench/tp_memory.sh [moetron] — per-rank memory of parameters, gradients and AdamW moments
# under tensor parallelism: TP=1, 2, 4 on a dense model whose buffers dominate the process
# (50.3M parameters, sequences of 16 tokens so that activations are small). For each layout
# it prints each rank's peak RSS (/usr/bin/time's maximum resident set), what the model's
# shapes say a rank holds (16 bytes per element: fp32 parameter, gradient, two moments),
# split into the sharded part (1/TP of the projections, embedding, LM head) and the part
# every rank holds whole (the norms), and the rest of the process (RSS - expected state).
set -eu
M=${1:-build/moetron}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 MOETRON_DEVICE=cpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
L=4 H=768 HEADS=8 F=3072 V=8192
FLAGS=(--num-experts 0 --num-layers $L --hidden-size $H --num-attention-heads $HEADS --ffn-hidden-size $F
       --vocab-size $V --make-vocab-size-divisible-by 128 --untie-embeddings-and-output-weights
       --seq-length 16 --micro-batch-size 1 --global-batch-size 1 --train-iters 2 --eval-interval 0
       --log-interval 1 --mock-data-tokens 8192)

grep -m1 'model name' /proc/cpuinfo
for tp in 1 2 4; do
    mpirun --oversubscribe --bind-to none -np $tp sh -c \
        'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/tp$tp" "$M" train "${FLAGS[@]}" \
        --tensor-model-parallel-size $tp >"$work/tp$tp.log" 2>&1 || { tail -3 "$work/tp$tp.log"; exit 1; }
    python3 - $tp $L $H $F $V "$work/tp$tp" <<'PY'
import sys
tp, L, H, F, V, prefix = int(sys.argv[1]), *map(int, sys.argv[2:6]), sys.argv[6]
sharded = L * (4 * H * H + 3 * H * F) + 2 * V * H  # q, k, v, o, gate, up, down; embedding, LM head
whole = (2 * L + 1) * H                           # input / post-attention norms, final norm
MB, state = 1 << 20, 16                           # bytes of state per element
expect = state * (sharded / tp + whole)
rss = [int(open(f"{prefix}.{r}").read()) * 1024 for r in range(tp)]
print(f"TP={tp}: expected per rank {expect / MB:.1f} MB (sharded {state * sharded / tp / MB:.1f} = 1/{tp} of "
      f"{state * sharded / MB:.1f}, whole {state * whole / MB:.3f}); peak RSS per rank "
      + " ".join(f"{x / MB:.1f}" for x in rss) + " MB; rest " + " ".join(f"{(x - expect) / MB:.1f}" for x in rss) + " MB")
PY
done
