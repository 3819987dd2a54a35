#!/bin/bash
# Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh as a moetron user runs
# it: the same argument arrays and flags, the sizes shrunk to a laptop (a 2-layer Mixtral of
# 4 experts, top-2), and `torchrun pretrain_gpt.py` replaced by `mpirun moetron train`. For
# the real model put back the sizes in the comments (and --split 99990,8,2).
#
#   usage: train_mixtral_8x7b_distributed.sh CHECKPOINT_PATH TOKENIZER_MODEL DATA_PATH
#
# TOKENIZER_MODEL is a SentencePiece .model (Llama2Tokenizer), DATA_PATH a Megatron dataset
# prefix (`moetron prepare --tokenizer-type Llama2Tokenizer --tokenizer-model ...`). Run it
# again to resume: --load and --save name the same directory, as in Megatron-LM.
# Environment: MOETRON (the binary, default moetron), PROCS (ranks, default 2), TRAIN_ITERS.

PROCS=${PROCS:-2}  # Megatron: 8 GPUs per node
MOETRON=${MOETRON:-moetron}

CHECKPOINT_PATH=$1
TOKENIZER_MODEL=$2
DATA_PATH=$3

DISTRIBUTED_ARGS=(
    -np $PROCS
    --oversubscribe
)

MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 64                 # 4096
    --max-position-embeddings 256   # 32768
    --num-layers 2                  # 32
    --hidden-size 64                # 4096
    --ffn-hidden-size 128           # 14336
    --num-attention-heads 4         # 32
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 2            # 8
    --no-masked-softmax-fusion
    --no-position-embedding
    --rotary-base 1000000
)

MOE_ARGS=(
    --num-experts 4                 # 8
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --data-path $DATA_PATH
    --split 90,8,2                  # 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 8           # 256
    --lr 1e-4
    --train-iters ${TRAIN_ITERS:-8} # 500000
    --lr-decay-iters 32             # 320000
    --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    --lr-warmup-iters 2             # 500
    --clip-grad 1.0
    --bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1  # 4
    --expert-model-parallel-size 2    # 8
    --use-distributed-optimizer
    --sequence-parallel
)

LOGGING_ARGS=(
    --log-interval 1 \
    --save-interval 4 \
    --eval-interval 4 \
    --eval-iters 2 \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH \
    --tensorboard-dir "${CHECKPOINT_PATH}/tensorboard" \
    --no-load-optim \
    --no-load-rng
)

if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${WANDB_PROJECT:-"Mixtral"}
        --wandb-exp-name ${WANDB_NAME:-"Mixtral_8x7B"}
    )
fi

mpirun ${DISTRIBUTED_ARGS[@]} $MOETRON train \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]}
