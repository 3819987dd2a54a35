#!/usr/bin/env python3
"""PyTorch training throughput of the model in a moetron checkpoint.

usage: python3 bench/pytorch_train.py CKPT_DIR [--micro-batch-size B] [--seq-length T]
           [--micro-batches M] [--steps S] [--threads N] [--label NAME]

CKPT_DIR is a moetron iteration directory (config.json + model.safetensors), e.g.
  build/moetron train --train-iters 1 --lr-warmup-iters 0 --eval-interval 0 --save /tmp/x
  python3 bench/pytorch_train.py /tmp/x/iter_0000001 --micro-batch-size 4 --seq-length 256 \
      --micro-batches 2 --steps 10
The checkpoint is loaded as transformers' own model (Mixtral or Qwen3-MoE, whatever its
config.json names) in float32 with the default attention and experts implementations.
Each step runs M micro-batches of B x T random token ids in [0, 257) through forward (LM
loss only, router aux loss off) and backward, accumulating gradients, then one AdamW step
(lr 1e-3, weight decay 0.01) and zero_grad. Two warm-up steps are left out; the median
over the timed steps of M*B*T / step time is printed as one line:
  pytorch <label> <tokens/s> tok/s (threads N, attn <impl>, experts <impl>)
"""
import argparse
import os
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

BYTE_VOCAB = 257  # 256 byte values + end-of-document, what moetron's tokenizer emits
WARMUP_STEPS = 2


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch training throughput of a moetron checkpoint")
    p.add_argument("ckpt", help="iteration directory holding config.json and model.safetensors")
    p.add_argument("--micro-batch-size", type=int, default=4, help="B: sequences per micro-batch [4]")
    p.add_argument("--seq-length", type=int, default=256, help="T: tokens per sequence [256]")
    p.add_argument("--micro-batches", type=int, default=2, help="M: micro-batches per step [2]")
    p.add_argument("--steps", type=int, default=10, help="S: timed steps, after 2 warm-up steps [10]")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads [os.cpu_count()]")
    p.add_argument("--label", default=None, help="name printed in the result line [config model_type]")
    p.add_argument("--bf16", action="store_true",
                   help="forward and backward under torch.autocast('cpu', dtype=torch.bfloat16), fp32 weights")
    a = p.parse_args()
    for name in ("micro_batch_size", "seq_length", "micro_batches", "steps", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return a


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    hf_logging.disable_progress_bar()

    model, info = AutoModelForCausalLM.from_pretrained(
        a.ckpt, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:  # a partly random model would not be the model moetron trained
        sys.exit(f"pytorch_train: checkpoint does not match {type(model).__name__}: {bad}")
    model.config.output_router_logits = False  # LM loss only
    model.config.use_cache = False
    model.train()

    cfg = model.config
    if a.seq_length > getattr(cfg, "max_position_embeddings", a.seq_length):
        print(f"pytorch_train: note: --seq-length {a.seq_length} exceeds max_position_embeddings "
              f"{cfg.max_position_embeddings}", file=sys.stderr)
    attn_impl = getattr(cfg, "_attn_implementation", None) or "unknown"
    experts_impl = getattr(cfg, "_experts_implementation", None) or "unknown"

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(42)
    B, T, M = a.micro_batch_size, a.seq_length, a.micro_batches
    tokens_per_step = M * B * T

    def step():
        for _ in range(M):
            ids = torch.randint(0, BYTE_VOCAB, (B, T), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                out = model(input_ids=ids, labels=ids, output_router_logits=False, use_cache=False)
            (out.loss / M).backward()  # gradient accumulation: mean over micro-batches
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    rates = []
    for i in range(WARMUP_STEPS + a.steps):
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        if not torch.isfinite(torch.tensor(loss)):
            sys.exit(f"pytorch_train: non-finite loss {loss} at step {i + 1}")
        if i >= WARMUP_STEPS:
            rates.append(tokens_per_step / dt)

    label = a.label or cfg.model_type
    print(f"pytorch {label} {statistics.median(rates):.0f} tok/s "
          f"(threads {a.threads}, attn {attn_impl}, experts {experts_impl}{', bf16 autocast' if a.bf16 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
