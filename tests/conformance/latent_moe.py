#!/usr/bin/env python3
"""Latent MoE (--moe-latent-size) against an independent torch reference.

usage: latent_moe.py MOETRON_BINARY [CASE ...]

moetron trains a small latent MoE model a few steps and saves it (moetron_moe: no
transformers family has latent projections). The reference is transformers' Qwen3-MoE with
each MoE block replaced by the latent block written here from Megatron-LM's definition:
router on the full hidden state, fc1_latent_proj (H -> L), the routed experts L wide,
fc2_latent_proj (L -> H), the shared expert on the full hidden state added after fc2. The
checkpoint's tensors are loaded into it by name (strict: every tensor has its place), and
`moetron forward --grads` (trained without an aux loss, so the gradients are the lm
loss's) must give the same logits (max abs diff <= 1e-4), loss, router
logits, top-k sets and routing weights, and every gradient, fc1/fc2 included (relative L2
<= 1e-4). The checkpoint's config.json must say moetron_moe and carry the latent size.

Prints `ok <case>` or `FAIL <case>: <why>` per case. Needs torch, transformers (v5),
safetensors, numpy.
"""

import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_conformance import (BASE_TRAIN, TRAIN_ITERS, check, fuse_experts, load_dump, main_over,  # noqa: E402
                            make_inputs, run_cmd)
from hf_families import BATCH, SEQ, compare_forward  # noqa: E402

# name -> (latent width, shared expert width, extra train flags); BASE_TRAIN's hidden size is 64
CASES = [
    ("latent_24_shared_expert_gqa", 24, 32, ["--group-query-attention", "--num-query-groups", "2"]),
    ("latent_96_wider_than_hidden_top1", 96, 0, ["--moe-router-topk", "1", "--moe-router-pre-softmax"]),
]


def latent_block_class():
    import torch
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

    class LatentMoeBlock(torch.nn.Module):
        """Megatron-LM's MoE layer with moe_latent_size: route on x (N,H), dispatch fc1(x) (N,L),
        experts L wide, combine in L, fc2 back to H, then the shared expert of x added."""

        def __init__(self, config, latent, shared):
            super().__init__()
            latent_config = copy.copy(config)
            latent_config.hidden_size = latent
            self.gate = qm.Qwen3MoeTopKRouter(config)
            self.experts = qm.Qwen3MoeExperts(latent_config)
            self.fc1_latent_proj = torch.nn.Linear(config.hidden_size, latent, bias=False)
            self.fc2_latent_proj = torch.nn.Linear(latent, config.hidden_size, bias=False)
            self.shared_experts = qm.Qwen3MoeMLP(config, intermediate_size=shared) if shared else None

        def forward(self, hidden_states):
            batch, seq, hidden = hidden_states.shape
            x = hidden_states.reshape(-1, hidden)
            _, weights, experts = self.gate(x)
            out = self.fc2_latent_proj(self.experts(self.fc1_latent_proj(x), experts, weights))
            if self.shared_experts is not None:
                out = out + self.shared_experts(x)
            return out.reshape(batch, seq, hidden)

    return LatentMoeBlock


def reference_model(cfg, latent, shared):
    """transformers' Qwen3-MoE of the checkpoint's shape, every MoE block the latent one."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "num_experts",
            "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers"]
    config = Qwen3MoeConfig(**{k: cfg[k] for k in keys}, intermediate_size=cfg["moe_intermediate_size"],
                            rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
                            hidden_act="silu", attention_bias=False, router_aux_loss_coef=0.0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).float()
    block = latent_block_class()
    for layer in model.model.layers:
        layer.mlp = block(config, latent, shared)
    model.eval()
    return model


def run_latent_case(moetron, name, latent, shared, flags, workdir):
    import torch
    from safetensors.torch import load_file
    save = os.path.join(workdir, "ckpt")
    shared_flags = ["--moe-shared-expert-intermediate-size", str(shared)] if shared else []
    # no aux loss: the gradients are those of the lm loss alone, which the reference computes
    run_cmd([moetron, "train"] + BASE_TRAIN + ["--qk-layernorm", "--untie-embeddings-and-output-weights",
                                               "--moe-aux-loss-coeff", "0", "--moe-latent-size", str(latent)] +
            shared_flags + flags + ["--save", save], "moetron train")
    it_dir = os.path.join(save, f"iter_{TRAIN_ITERS:07d}")
    with open(os.path.join(it_dir, "config.json")) as fh:
        cfg = json.load(fh)
    check(cfg["model_type"] == "moetron_moe", f"model_type {cfg['model_type']}, expected moetron_moe")
    saved_latent = cfg.get("moetron", {}).get("flags", {}).get("moe-latent-size")
    check(saved_latent == latent, f"config.json carries moe-latent-size {saved_latent}, expected {latent}")
    model = reference_model(cfg, latent, shared)
    tensors = fuse_experts(load_file(os.path.join(it_dir, "model.safetensors")))
    check(any(".fc1_latent_proj." in k for k in tensors), "the checkpoint has no fc1_latent_proj tensors")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    check(not missing and not unexpected,
          f"checkpoint and reference differ: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, sum(map(ord, name)), 257, BATCH, SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", save, "--input", in_path, "--dump", out_path, "--grads"], "moetron forward")
    with torch.enable_grad():
        return compare_forward(load_dump(out_path), model, ids, labels, BATCH * SEQ)


def main():
    return main_over(__doc__, [(c[0], run_latent_case, c[1:]) for c in CASES], "latent")


if __name__ == "__main__":
    sys.exit(main())
