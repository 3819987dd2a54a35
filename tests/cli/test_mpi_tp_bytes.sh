#!/usr/bin/env bash
# test_mpi_tp_bytes.sh — the bytes a rank sends to its tensor-parallel ranks in a step (the
# JSONL tp_bytes, parallel/comm.h's definition) equal the formula of docs/parallelism.md,
# "Bytes communicated by tensor parallelism", exactly, at every step: a dense model on TP=2
# without sequence parallelism, on TP=2 with it (untied embeddings), and on TP=4 with it; and
# the bytes sent to the expert-parallel and expert-tensor-parallel ranks (expert_bytes) by the
# allgather exchange, on ETP=2 x EP=2 (with TP=2 and SP) and on EP=2, against "Bytes
# communicated by the allgather token exchange"; with --bf16 (TP=2 with SP, ETP=2 x EP=2) the
# all-gathers only GEMMs read at half their bytes.
# Skipped without an MPI build (a failure under CI).
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
mpi_require mpi_tp_bytes

FLOAT=4 DOUBLE=8  # bytes of an element: activations and gradients, the loss statistics and norm

# ar ELEMENTS P: elements rank 0 sends in an all-reduce over P ranks (an even split, rank 0's
# block the largest: a reduce-scatter then an all-gather)
ar() { echo $(($1 + ($2 - 2) * (($1 + $2 - 1) / $2))); }

# expected_bytes P SP L H SEQ MBS MICRO_BATCHES [BF16]: tp_bytes of one step of a dense model
expected_bytes() {
    local P=$1 sp=$2 L=$3 H=$4 N=$(($5 * $6)) M=$7 bf16=${8:-0}
    local X=$((N * H)) blocks per_mb step
    if [ "$sp" = 1 ]; then
        # each of the embedding, 2 blocks per layer and the LM head: an all-gather and a
        # reduce-scatter of X (one forward, one backward), (P-1)/P of X each
        blocks=$(((8 * L + 4) * (P - 1) * X / P * FLOAT))
        # --bf16: the 4L + 1 all-gathers only GEMMs read (each block's normed input and output
        # gradient, the LM head's input) move half the bytes
        [ "$bf16" = 1 ] && blocks=$((blocks - (4 * L + 1) * (P - 1) * X / P * FLOAT / 2))
    else
        # all-reduces of X: embedding and 2 per layer forward, LM head and 2 per layer backward
        blocks=$(((4 * L + 2) * $(ar $X $P) * FLOAT))
    fi
    # cross-entropy: row maxima all-gathered, (sum of exponentials, target logit) all-reduced
    per_mb=$((blocks + (P - 1) * N * FLOAT + $(ar $((2 * N)) $P) * DOUBLE))
    step=$((M * per_mb + $(ar 1 $P) * DOUBLE))  # and the gradient norm's sum of squares
    # with SP the norms' partial gradients: both norms of each layer, the final norm
    [ "$sp" = 1 ] && step=$((step + (L * $(ar $((2 * H)) $P) + $(ar $H $P)) * FLOAT))
    echo $step
}

# check NAME RANKS P SP L H SEQ MBS GBS FLAGS...: every step's tp_bytes equals the formula
check() {
    local name=$1 np=$2 P=$3 sp=$4 L=$5 H=$6 seq=$7 mbs=$8 gbs=$9
    shift 9
    local want got bf16=0
    case " $* " in *" --bf16 "*) bf16=1 ;; esac
    want=$(expected_bytes "$P" "$sp" "$L" "$H" "$seq" "$mbs" $((gbs / mbs)) "$bf16")
    if ! timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train --num-experts 0 --num-layers "$L" --hidden-size "$H" \
        --seq-length "$seq" --micro-batch-size "$mbs" --global-batch-size "$gbs" --tensor-model-parallel-size "$P" \
        --train-iters 3 --log-interval 1 --eval-interval 0 --mock-data-tokens 65536 "$@" \
        --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1; then
        fail "$name" "run failed: $(tail -1 "$work/$name.log")"
        return
    fi
    got=$(grep -o '"tp_bytes":[0-9]*' "$work/$name.jsonl" | cut -d: -f2 | sort -u | tr '\n' ' ')
    [ "$got" = "$want " ] && ok "$name" || fail "$name" "logged tp_bytes $got, formula $want"
}

check tp2_bytes 2 2 0 2 64 32 2 8 --num-attention-heads 4 --ffn-hidden-size 128
check tp2_sequence_parallel_bytes 2 2 1 3 32 16 2 4 --num-attention-heads 4 --ffn-hidden-size 64 \
    --sequence-parallel --untie-embeddings-and-output-weights
check tp4_sequence_parallel_bytes 4 4 1 1 64 32 2 4 --num-attention-heads 4 --ffn-hidden-size 128 \
    --sequence-parallel --make-vocab-size-divisible-by 64
check tp2_sequence_parallel_bf16_bytes 2 2 1 3 32 16 2 4 --num-attention-heads 4 --ffn-hidden-size 64 \
    --sequence-parallel --untie-embeddings-and-output-weights --bf16
# one process sends nothing
check tp1_bytes_zero 1 1 0 1 32 16 2 4 --num-attention-heads 4 --ffn-hidden-size 64 2>/dev/null

# expected_expert_bytes P EP ETP L_MOE N_LOCAL H K MICRO_BATCHES [BF16]: expert_bytes of one
# step with the allgather exchange over P = ETP x EP ranks
expected_expert_bytes() {
    local P=$1 ep=$2 etp=$3 L=$4 N=$5 H=$6 k=$7 M=$8 bf16=${9:-0}
    # per MoE layer: forward all-gathers of the inputs (N,H), top-k ids, kept flags, probs
    # (N,k) and a reduce-scatter of the outputs (N,H); backward an all-gather of the output
    # gradient and reduce-scatters of the input and prob gradients: (P-1) blocks of each;
    # --bf16: the two all-gathers of (N,H) at half the bytes
    local per_layer=$(((P - 1) * (4 * N * H + 4 * N * k) * FLOAT))
    [ "$bf16" = 1 ] && per_layer=$((per_layer - (P - 1) * N * H * FLOAT))
    # and the gradient norm's expert sum of squares over the EP and the ETP group
    echo $((M * L * per_layer + ($(ar 1 "$ep") + $(ar 1 "$etp")) * DOUBLE))
}

# check_expert NAME RANKS P EP ETP L_MOE N_LOCAL H K MICRO_BATCHES FLAGS...
check_expert() {
    local name=$1 np=$2 want got bf16=0
    case " $* " in *" --bf16 "*) bf16=1 ;; esac
    want=$(expected_expert_bytes "$3" "$4" "$5" "$6" "$7" "$8" "$9" "${10}" "$bf16")
    shift 10
    if ! timeout 600 "${MPIRUN[@]}" -np "$np" "$M" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
        --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --num-experts 4 --moe-router-topk 2 \
        --moe-ffn-hidden-size 48 --train-iters 3 --log-interval 1 --eval-interval 0 --mock-data-tokens 65536 "$@" \
        --log-jsonl "$work/$name.jsonl" >"$work/$name.log" 2>&1; then
        fail "$name" "run failed: $(tail -1 "$work/$name.log")"
        return
    fi
    got=$(grep -o '"expert_bytes":[0-9]*' "$work/$name.jsonl" | cut -d: -f2 | sort -u | tr '\n' ' ')
    [ "$got" = "$want " ] && ok "$name" || fail "$name" "logged expert_bytes $got, formula $want"
}

# 4 ranks: TP=2 (DP=2: one micro-batch of 32 tokens per rank, 16 held with SP), ETP x EP = 4
check_expert etp2_ep2_allgather_bytes 4 4 2 2 2 16 32 2 1 --tensor-model-parallel-size 2 --sequence-parallel \
    --expert-model-parallel-size 2 --expert-tensor-parallel-size 2 --moe-token-dispatcher-type allgather
# 2 ranks: DP=2, one micro-batch of 32 tokens each, EP = 2
check_expert ep2_allgather_bytes 2 2 2 1 2 32 32 2 1 --expert-model-parallel-size 2 \
    --moe-token-dispatcher-type allgather
check_expert etp2_ep2_allgather_bf16_bytes 4 4 2 2 2 16 32 2 1 --tensor-model-parallel-size 2 --sequence-parallel \
    --expert-model-parallel-size 2 --expert-tensor-parallel-size 2 --moe-token-dispatcher-type allgather --bf16
