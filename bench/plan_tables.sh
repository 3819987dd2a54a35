#!/usr/bin/env bash
# bench/plan_tables.sh [MOETRON] — `moetron plan` for DeepSeek-V3-671B and Qwen3-235B-A22B
# (bench/configs/*.flags) with Megatron-MoE-ModelZoo's published H100 layouts
# (best_practice/deepseek-v3/run_deepseek_v3_h100.sh: 1024 GPUs, TP 2, PP 8 x VP 4, EP 64,
# layout Et|(tt|)*30mL without the MTP layer, selective recomputation of mla_up_proj and
# mlp, global batch 8192; best_practice/qwen3/run_h100_235b.sh with
# runtime_configs/benchmarking/runtime.conf: 256 GPUs, TP 2, PP 8 x VP 4, EP 32, embedding
# and loss counted in the split, selective recomputation of moe_act and layernorm, global
# batch 2048), planned for a GPU, dropless as published and with a capacity factor of 1.
# docs/memory.md derives the numbers by hand.
set -eu
M=${1:-build/moetron}
root=$(cd "$(dirname "$0")/.." && pwd)
flags() { grep -v '^#' "$root/bench/configs/$1.flags" | tr '\n' ' '; }
DEEPSEEK=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 64
          --pipeline-model-parallel-layout "Et|(tt|)*30L" --recompute-granularity selective
          --recompute-modules mla_up_proj mlp --global-batch-size 8192 --world-size 1024 --device cuda)
QWEN=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 4
      --expert-model-parallel-size 32 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
      --recompute-granularity selective --recompute-modules moe_act layernorm --global-batch-size 2048
      --world-size 256 --device cuda)
for capacity in "" "--moe-expert-capacity-factor 1"; do
    echo "### DeepSeek-V3-671B ${capacity:-dropless}"
    # shellcheck disable=SC2046
    "$M" plan $(flags deepseek_v3_671b) "${DEEPSEEK[@]}" $capacity
    echo
    echo "### Qwen3-235B-A22B ${capacity:-dropless}"
    # shellcheck disable=SC2046
    "$M" plan $(flags qwen3_235b) "${QWEN[@]}" $capacity
    echo
done
