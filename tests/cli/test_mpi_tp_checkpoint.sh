#!/usr/bin/env bash
# test_mpi_tp_checkpoint.sh — checkpoints of tensor-parallel (TP, ETP) runs stay global and
# Hugging Face-named, so any TP/ETP/EP/DP layout resumes any other: BUILD/test_ckpt_tp_mpi
# under mpirun -np 4 and -np 2 walks a chain of layouts (one process -> TP=2 x ETP=2 x EP=2
# -> TP=4 x EP=2 -> EP=4 (dense DP=4) -> TP=2 x ETP=2 x EDP=2 -> one process, and on 2 ranks TP=2,
# TP=2 x ETP=2, EP=2), each loading the last one's checkpoint and checking every parameter
# and moment it holds bit for bit, each save byte for byte the one-process files; and
# training moves TP=2 x EP=2 -> TP=1 -> TP=4 x ETP=2 -> one process, continuing as the
# single-process run (losses, gradient norms, final weights).
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_tp_checkpoint

# the program prints ok/FAIL per layout, saving into a directory of its own per world size
for np in 4 2; do
    mkdir -p "$work/np$np"
    run_mpi_program "mpi_tp_checkpoint_np$np" "$np" 300 "$(dirname "$M")/test_ckpt_tp_mpi" "$work/np$np"
done

# Training resumes across layouts as the single run: 3 steps each of TP=2 x EP=2 with
# sequence parallelism (4 ranks, the distributed optimizer), TP=1 x EP=2 (DP=4, the
# distributed optimizer), TP=4 with ETP=2 x EP=2 (kv heads replicated over TP pairs), then
# one process, give the single-process 12
# steps (loss and gradient norm within 1e-5 relative) and its weights. The vocabulary of 257
# is padded to 512 rows by the first leg (128 x TP=2); every later leg keeps the
# checkpoint's 512 rows (one process pads 257 to 384 on its own: the reference is given 512).
SMALL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --seq-length 32 --micro-batch-size 2 --ffn-hidden-size 128 --num-experts 4 --moe-ffn-hidden-size 64
       --moe-router-topk 2 --moe-layer-freq '[0,1]' --make-vocab-size-divisible-by 128
       --eval-interval 0 --lr-warmup-iters 2 --log-interval 1 --mock-data-tokens 65536 --train-iters 12
       --global-batch-size 8)

# resume_step NAME LOG-FILE RANKS LAYOUT FLAGS...: one leg of the chain (RANKS 1: no
# mpirun), which must run the layout its banner names LAYOUT ("TP2 CP1 PP1 DP2 | EP2 ETP1 EDP2")
resume_step() {
    local name=$1 out=$2 np=$3 layout=$4
    shift 4
    local launch=("${MPIRUN[@]}" -np "$np")
    [ "$np" -eq 1 ] && launch=()
    timeout 600 "${launch[@]}" "$M" train "$@" >"$out" 2>&1 || { fail "$name" "$(tail -2 "$out" | tr '\n' ' ')"; return 1; }
    grep -q "layout $layout\$" "$out" || { fail "$name" "not the layout $layout: $(grep -m1 layout "$out")"; return 1; }
}

tp_layout_chain() {
    local name=tp2ep2_to_tp1_to_tp4_to_single ck="$work/chain" log="$work/chain.jsonl" why
    reference --sequence-parallel --make-vocab-size-divisible-by 512 || { fail $name "single process: $(tail -1 "$ref.log")"; return; }
    resume_step "$name" "$work/chain1.log" 4 "TP2 CP1 PP1 DP2 | EP2 ETP1 EDP2" "${SMALL[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
        --expert-model-parallel-size 2 --use-distributed-optimizer --exit-interval 3 --save "$ck" \
        --log-jsonl "$log" || return
    resume_step "$name" "$work/chain2.log" 4 "TP1 CP1 PP1 DP4 | EP2 ETP1 EDP2" --load "$ck" --expert-model-parallel-size 2 \
        --use-distributed-optimizer --exit-interval 6 --save "$ck" --log-jsonl "$log" || return
    resume_step "$name" "$work/chain3.log" 4 "TP4 CP1 PP1 DP1 | EP2 ETP2 EDP1" --load "$ck" --tensor-model-parallel-size 4 \
        --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 --exit-interval 9 --save "$ck" \
        --log-jsonl "$log" || return
    resume_step "$name" "$work/chain4.log" 1 "TP1 CP1 PP1 DP1 | EP1 ETP1 EDP1" --load "$ck" --exit-interval 0 --save "$ck" --log-jsonl "$log" || return
    curve "$log" >"$work/chain.b"
    compare $name "$ref.a" "$work/chain.b"
    why=$(python3 - "$ref.ck/iter_0000012/model.safetensors" "$ck/iter_0000012/model.safetensors" <<'PY'
import json, struct, sys
def load(path):
    with open(path, "rb") as f: data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + n]); h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
if sorted(a) != sorted(b): print("tensor names differ:", sorted(set(a) ^ set(b))[:6]); sys.exit()
for k in a:
    d = max(abs(x - y) for x, y in zip(a[k], b[k]))
    if d > 1e-6: print(k, "differs by", d); sys.exit()
PY
)
    [ -z "$why" ] && ok ${name}_same_weights || fail ${name}_same_weights "$why"
}
# five training runs: the plain build runs them, a sanitizer build the tables above only
full tp2ep2_to_tp1_to_tp4_to_single tp_layout_chain
