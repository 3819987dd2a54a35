#!/usr/bin/env python3
"""moetron's --fp16 dynamic loss scaling against Megatron-Core's DynamicGradScaler.

usage: megatron_loss_scaler.py MOETRON

Trains tiny models with --fp16 under settings that make the scaled gradients overflow at
the start and again after the scale grows (a short --loss-scale-window), reads each step's
loss scale and overflow flag from the JSONL log, and replays the same overflow flags
through megatron.core.optimizer.grad_scaler.DynamicGradScaler (its own update(), run on
the CPU: the class puts its tensors on "cuda", which the test redirects to the CPU). The
scale every step used must be Megatron's scale after the previous steps' updates, and the
steps skipped must be exactly the overflowing ones. A constant --loss-scale is checked
against ConstantGradScaler the same way (it never changes, overflow or not).

Prints `ok <case>` or `FAIL <case>: <why>` per case; exits non-zero on any failure.
Needs torch and megatron-core.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from unittest import mock

warnings.filterwarnings("ignore")
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
try:
    import torch
    from megatron.core.optimizer import grad_scaler
except ImportError as exc:
    print(f"FAIL setup: python3 with torch and megatron-core is required ({exc})")
    sys.exit(1)

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--num-experts", "4", "--moe-router-topk", "2",
        "--moe-ffn-hidden-size", "32", "--ffn-hidden-size", "64", "--lr-warmup-iters", "1", "--mock-data-tokens",
        "16384", "--log-interval", "1", "--eval-interval", "0", "--lr", "3e-3"]

# name, moetron flags, Megatron scaler arguments (None: ConstantGradScaler(scale))
CASES = [
    ("dynamic_window3", ["--fp16", "--initial-loss-scale", str(2.0**25), "--loss-scale-window", "3",
                         "--hysteresis", "2", "--train-iters", "24"],
     dict(initial_scale=2.0**25, min_scale=1.0, growth_interval=3, hysteresis=2)),
    # every step overflows: the scale halves down to --min-loss-scale and stays there
    ("dynamic_min_scale", ["--fp16", "--initial-loss-scale", str(2.0**30), "--min-loss-scale", str(2.0**27),
                           "--hysteresis", "1", "--train-iters", "8"],
     dict(initial_scale=2.0**30, min_scale=2.0**27, growth_interval=1000, hysteresis=1)),
    ("dynamic_hysteresis3", ["--fp16", "--initial-loss-scale", str(2.0**26), "--loss-scale-window", "2",
                             "--hysteresis", "3", "--train-iters", "20"],
     dict(initial_scale=2.0**26, min_scale=1.0, growth_interval=2, hysteresis=3)),
    ("constant", ["--fp16", "--loss-scale", str(2.0**24), "--train-iters", "6"], None),
]


TENSOR = torch.tensor


def on_cpu(*args, **kwargs):  # torch.tensor with the device dropped
    kwargs.pop("device", None)
    return TENSOR(*args, **kwargs)


def megatron_scaler(args):
    with mock.patch.object(grad_scaler.torch, "tensor", on_cpu):
        if args is None:
            return grad_scaler.ConstantGradScaler(2.0**24)
        return grad_scaler.DynamicGradScaler(growth_factor=2.0, backoff_factor=0.5, **args)


def run_case(moetron, work, name, flags, args):
    log = os.path.join(work, name + ".jsonl")
    out = subprocess.run([moetron, "train", *TINY, *flags, "--log-jsonl", log], capture_output=True, text=True,
                         env={**os.environ, "MOETRON_DEVICE": "cpu"})
    if out.returncode != 0:
        return f"moetron failed: {out.stderr.strip()[-300:]}"
    rows = [r for r in map(json.loads, open(log)) if "loss" in r]
    scaler = megatron_scaler(args)
    overflows = 0
    for r in rows:  # each step logs its scale after the update, as Megatron's training log does
        found_inf = bool(r.get("overflow"))
        if bool(r.get("skipped")) != found_inf:
            return f"step {r['step']}: skipped {r.get('skipped')} but overflow {found_inf}"
        overflows += found_inf
        scaler.update(found_inf)
        want = float(scaler.scale.item())
        if r.get("loss_scale") != want:
            return f"step {r['step']}: moetron's scale {r.get('loss_scale')}, Megatron's {want}"
    if args is not None and overflows == 0:
        return f"no step of {len(rows)} overflowed: the case does not exercise the scaler"
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        for name, flags, args in CASES:
            why = run_case(sys.argv[1], work, name, flags, args)
            print(f"ok loss_scaler_{name}" if why is None else f"FAIL loss_scaler_{name}: {why}")
            failed += why is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
