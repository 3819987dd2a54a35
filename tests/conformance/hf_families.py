#!/usr/bin/env python3
"""OLMoE and DeepSeek-V3 (Multi-Latent Attention) both ways against transformers.

usage: hf_families.py MOETRON_BINARY [CASE ...]

import_* : a tiny random model made by transformers (OlmoeConfig / DeepseekV3Config,
           save_pretrained) -> `moetron forward --load HF_DIR --grads`: same logits
           (max abs diff <= 1e-4), loss, router logits, top-k expert sets and routing
           weights, and every gradient of torch autograd (relative L2 <= 1e-4).
export_* : moetron trains a model of the family a few steps and saves it; transformers
           loads the checkpoint with AutoModelForCausalLM (clean loading info, the
           expected model_type) and gives the same logits, routing and gradients.
           import_deepseek_v3_fp8_block_scales stores the weights as F8_E4M3 with 128x128
           weight_scale_inv blocks (DeepSeek-V3's published format).
*_mtp    : a multi-token-prediction layer after the last one, read (import) and written
           (export) with DeepSeek-V3's names; its logits, loss and every gradient of lm loss +
           0.1 · mtp loss against transformers' DeepSeek-V3 modules composed as Megatron-Core's
           MTP depth.
finetune_*: `moetron train --load HF_DIR` on such a transformers-made model saves a
           checkpoint of the same family that transformers loads and agrees with.
upcycle_*: a dense Qwen3 / Llama made by transformers, upcycled by moetron
           (--moe-use-upcycling): transformers loads the Qwen3-MoE / Mixtral checkpoint and its
           logits are the dense model's.
reject_* : --hf-architecture naming a family that cannot express the model is an error
           at start-up, one line naming the feature, before anything is written; a plain
           config.json with a value moetron cannot represent (rope_scaling, gelu, ...) is
           an error naming the key.

Routing on the transformers side is read from the router modules themselves (forward
hooks on mlp.gate, which return logits, weights and expert indices in both families).
Prints `ok <case>` or `FAIL <case>: <why>` per case. Needs torch, transformers (v5),
safetensors, numpy.
"""

import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_conformance import (BASE_TRAIN, CMD_TIMEOUT, LOGIT_TOL, LOSS_TOL, PROB_TOL,  # noqa: E402
                            ROUTER_TOL, TRAIN_ITERS, CaseFailure, check, compare_grads_l2, hf_view, import_init,
                            load_dump, main_over, make_inputs, maxdiff_where, run_cmd, scalar, split_fused, to_f64)

BATCH, SEQ = 2, 20
VOCAB = 300

OLMOE_BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, intermediate_size=32,
                  max_position_embeddings=128, router_aux_loss_coef=0.0, rope_theta=10000.0,
                  rms_norm_eps=1e-5, eos_token_id=None, pad_token_id=None)
DEEPSEEK_BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                     n_shared_experts=2, routed_scaling_factor=2.5, kv_lora_rank=16, qk_rope_head_dim=8,
                     v_head_dim=12, qk_nope_head_dim=10, max_position_embeddings=128, rms_norm_eps=1e-6,
                     rope_theta=10000.0, eos_token_id=None, bos_token_id=None)

YARN_DEEPSEEK = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=12,
                     beta_fast=32.0, beta_slow=0.25, mscale=0.9, mscale_all_dim=0.7)
YARN_QWEN3 = dict(rope_type="yarn", rope_theta=1000.0, factor=8.0, original_max_position_embeddings=10,
                  beta_fast=16.0, beta_slow=0.5)

# name -> (dense config class, kwargs, the MoE model_type transformers loads back)
UPCYCLE_CASES = [
    ("upcycle_qwen3_dense", "Qwen3Config",
     dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          head_dim=16, intermediate_size=64, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6,
          tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None), "qwen3_moe"),
    ("upcycle_llama_dense", "LlamaConfig",
     dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=96, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
          tie_word_embeddings=True, eos_token_id=None, bos_token_id=None, pad_token_id=None), "mixtral"),
]


# name -> (config class, kwargs, extra config.json keys for moetron only)
IMPORT_CASES = [
    # clip_qkv small enough that the unit-RMS normalised q and k are clamped in many places
    ("import_olmoe_clip_gqa_untied", "OlmoeConfig",
     dict(OLMOE_BASE, clip_qkv=0.8, norm_topk_prob=False, tie_word_embeddings=False), {}),
    ("import_olmoe_norm_topk_tied", "OlmoeConfig",
     dict(OLMOE_BASE, clip_qkv=None, norm_topk_prob=True, num_experts_per_tok=3, tie_word_embeddings=True), {}),
    ("import_deepseek_v3_qlora_groups", "DeepseekV3Config",
     dict(DEEPSEEK_BASE, q_lora_rank=24, n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
          rope_interleave=True, norm_topk_prob=True, tie_word_embeddings=False),
     {"router_aux_loss_coef": 0.0}),
    ("import_deepseek_v3_full_q_rotate_half", "DeepseekV3Config",
     dict(DEEPSEEK_BASE, q_lora_rank=None, n_group=1, topk_group=1, num_experts_per_tok=3, first_k_dense_replace=0,
          rope_interleave=False, norm_topk_prob=True, tie_word_embeddings=True, n_shared_experts=1),
     {"router_aux_loss_coef": 0.0}),
    # YaRN as DeepSeek-V3 publishes it (mscale, mscale_all_dim: the cos/sin and softmax
    # corrections), the original context shorter than the sequence so that positions past it
    # are compared; beta_slow below 1 gives a ramp of several dimensions, one of them between
    # its ends. Written the older way (rope_scaling with "type"), as DeepSeek-V3's config.json.
    ("import_deepseek_v3_yarn", "DeepseekV3Config",
     dict(DEEPSEEK_BASE, q_lora_rank=24, n_group=1, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
          rope_interleave=True, norm_topk_prob=True, tie_word_embeddings=False, qk_rope_head_dim=16,
          rope_parameters=YARN_DEEPSEEK),
     {"router_aux_loss_coef": 0.0, "rope_parameters": None,
      "rope_scaling": dict({k: v for k, v in YARN_DEEPSEEK.items() if k != "rope_type"}, type="yarn")}),
    # dense Qwen3 and Llama read as they are (the models upcycle_* starts from)
    ("import_qwen3_dense", "Qwen3Config", UPCYCLE_CASES[0][2], {}),
    ("import_llama_dense", "LlamaConfig", UPCYCLE_CASES[1][2], {}),
    # Llama 3's RoPE scaling, its original context (16) inside the sequence: some frequencies
    # divided, some kept, some blended
    ("import_llama_dense_llama3_rope", "LlamaConfig",
     dict(UPCYCLE_CASES[1][2], rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                                    original_max_position_embeddings=16)), {}),
    # Qwen3-MoE with YaRN (no mscale terms: cos/sin times mscale(s)), and with linear interpolation
    ("import_qwen3_moe_yarn", "Qwen3MoeConfig",
     dict(OLMOE_BASE, moe_intermediate_size=32, head_dim=16, rope_parameters=YARN_QWEN3), {}),
    ("import_qwen3_moe_linear", "Qwen3MoeConfig",
     dict(OLMOE_BASE, moe_intermediate_size=32, rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                                     factor=3.0)), {}),
]

MLA_FLAGS = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
             "--v-head-dim", "12"]
DEEPSEEK_ROUTER = ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                   "--moe-router-bias-update-rate", "0.05", "--moe-router-topk-scaling-factor", "2.5",
                   "--moe-shared-expert-intermediate-size", "96", "--moe-layer-freq", "[0,1,1]", "--num-layers", "3",
                   "--ffn-hidden-size", "96"]
# name -> (train flags, model_type, expected config values)
EXPORT_CASES = [
    ("export_olmoe_clip", ["--qk-layernorm", "--qk-layernorm-scope", "projection", "--clip-qkv", "0.9",
                           "--moe-router-pre-softmax", "--moe-router-load-balancing-type", "none",
                           "--untie-embeddings-and-output-weights", "--init-method-std", "0.1"],
     "olmoe", {"clip_qkv": 0.9, "norm_topk_prob": False, "tie_word_embeddings": False}),
    ("export_deepseek_v3_qlora_groups", MLA_FLAGS + DEEPSEEK_ROUTER +
     ["--q-lora-rank", "24", "--rotary-interleaved", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
      "--moe-router-load-balancing-type", "none", "--init-method-std", "0.1"],
     "deepseek_v3", {"q_lora_rank": 24, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                     "n_shared_experts": 2, "routed_scaling_factor": 2.5, "rope_interleave": True}),
    ("export_deepseek_v3_full_q", MLA_FLAGS + DEEPSEEK_ROUTER +
     ["--moe-router-load-balancing-type", "none", "--hf-architecture", "deepseek_v3", "--init-method-std", "0.1"],
     "deepseek_v3", {"q_lora_rank": None, "n_group": 1, "rope_interleave": False}),
    # Megatron-Core's --use-rope-scaling (Llama 3's), the original context (16) inside the sequence
    ("export_mixtral_llama3_rope", ["--use-rope-scaling", "--rope-scaling-factor", "4", "--original-max-position-embeddings",
                                    "16", "--hf-architecture", "mixtral", "--moe-router-load-balancing-type", "none",
                                    "--init-method-std", "0.1"],
     "mixtral", {"rope_parameters": dict(rope_type="llama3", rope_theta=10000.0, factor=4.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=16)}),
    # Megatron-Core's MLA YaRN flags; the sequence (32) runs past the original context (12)
    ("export_deepseek_v3_yarn", MLA_FLAGS + DEEPSEEK_ROUTER +
     ["--moe-router-load-balancing-type", "none", "--hf-architecture", "deepseek_v3", "--init-method-std", "0.1",
      "--rotary-interleaved", "--rope-type", "yarn", "--rotary-scaling-factor", "4", "--original-max-position-embeddings",
      "12", "--beta-slow", "0.25", "--mscale", "0.9", "--mscale-all-dim", "0.7", "--max-position-embeddings", "64"],
     "deepseek_v3", {"rope_parameters": dict(YARN_DEEPSEEK, rope_theta=10000.0)}),
]

# name -> (train flags, text the single error line must contain)
REJECT_CASES = [
    ("reject_olmoe_for_mixtral_model", ["--hf-architecture", "olmoe"], "--hf-architecture olmoe"),
    ("reject_deepseek_without_mla", ["--hf-architecture", "deepseek_v3", "--qk-layernorm"], "multi-latent-attention"),
    ("reject_mixtral_with_shared_expert", ["--hf-architecture", "mixtral", "--moe-shared-expert-intermediate-size",
                                           "32"], "shared experts"),
]


# plain HF config.json values moetron cannot represent: name -> (model_type, config changes, key named)
UNSUPPORTED_CONFIGS = [
    ("reject_config_rope_scaling", "olmoe", {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}},
     "rope_scaling type \"longrope\""),
    ("reject_config_rope_type", "qwen3_moe", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_parameters type \"dynamic\""),
    ("reject_config_yarn_attention_factor", "qwen3_moe",
     {"rope_parameters": dict(YARN_QWEN3, attention_factor=1.5)}, "attention_factor"),
    ("reject_config_hidden_act", "mixtral", {"hidden_act": "gelu"}, "hidden_act"),
    ("reject_config_attention_bias", "olmoe", {"attention_bias": True}, "attention_bias"),
    ("reject_config_jitter", "mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("reject_config_sliding_window", "qwen3_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ("reject_config_deepseek_group_top", "deepseek_v3", {"n_group": 2, "topk_group": 1, "num_experts_per_tok": 4},
     "n_group"),
    ("reject_config_deepseek_no_norm", "deepseek_v3", {"norm_topk_prob": False}, "norm_topk_prob"),
    ("reject_config_olmoe_head_dim", "olmoe", {"head_dim": 32}, "head_dim"),
]
CONFIG_BASES = {
    "olmoe": ("OlmoeConfig", OLMOE_BASE),
    "qwen3_moe": ("Qwen3MoeConfig", dict(OLMOE_BASE, moe_intermediate_size=32)),
    "mixtral": ("MixtralConfig", dict(OLMOE_BASE, num_local_experts=4)),
    "deepseek_v3": ("DeepseekV3Config", dict(DEEPSEEK_BASE, q_lora_rank=None, num_experts_per_tok=2, n_group=1,
                                             topk_group=1)),
}


def run_unsupported_config_case(moetron, name, model_type, changes, key, workdir):
    """A config.json with one unsupported value: moetron stops with one line naming the key."""
    import transformers
    cls, kwargs = CONFIG_BASES[model_type]
    raw = getattr(transformers, cls)(**kwargs).to_dict()
    raw.update(changes)
    hf_dir = os.path.join(workdir, "hf")
    os.makedirs(hf_dir)
    with open(os.path.join(hf_dir, "config.json"), "w") as fh:
        json.dump(raw, fh)
    in_path = os.path.join(workdir, "in.safetensors")
    make_inputs(in_path, 1, 16, 1, 4, extra_ignored=False)
    p = subprocess.run([moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump",
                        os.path.join(workdir, "out.safetensors")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=CMD_TIMEOUT)
    err = p.stderr.decode(errors="replace").strip().splitlines()
    check(p.returncode != 0, f"moetron accepted {changes}")
    check(len(err) == 1 and err[0].startswith("moetron: error:") and key in err[0] and "config.json" in err[0],
          f"expected one 'moetron: error:' line naming config.json and {key!r}, got {err[:3]}")
    return err[0]


def eager_kwargs():
    if os.environ.get("HF_CONFORMANCE_EAGER"):
        return {"attn_implementation": "eager", "experts_implementation": "eager"}
    return {}


def record_routing(model):
    """Forward hooks on every MoE layer's router: layer -> (logits, weights, indices) of the last call."""
    seen, handles = {}, []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(layer.mlp, "experts"):
            continue

        def hook(_mod, _inp, out, i=i):
            seen[i] = tuple(t.detach() for t in out[:3])
        handles.append(gate.register_forward_hook(hook))
    return seen, handles


def compare_routing(dump, seen, n_tokens):
    """moetron's router logits, top-k sets and routing weights against the router modules'."""
    dumped = sorted({int(k.split(".")[1]) for k in dump if k.endswith(".router_logits")})
    check(dumped == sorted(seen), f"moetron dumped routing for layers {dumped}, transformers has MoE layers {sorted(seen)}")
    worst = 0.0
    for layer, (logits, weights, idx) in sorted(seen.items()):
        p = f"layers.{layer}."
        n_exp = logits.shape[-1]
        d, at = maxdiff_where(dump[p + "router_logits"], logits.float().numpy())
        check(d <= ROUTER_TOL, f"{p}router_logits max abs diff {d:.3e} at {at}")
        mt_idx = dump[p + "router_topk_idx"].astype(np.int64)
        hf_idx = idx.numpy().astype(np.int64)
        check(mt_idx.shape == hf_idx.shape == (n_tokens, hf_idx.shape[1]), f"{p}router_topk_idx shape {mt_idx.shape}")
        for t in range(n_tokens):
            check(set(mt_idx[t].tolist()) == set(hf_idx[t].tolist()),
                  f"{p}top-k set differs at token {t}: moetron {sorted(mt_idx[t].tolist())} vs "
                  f"transformers {sorted(hf_idx[t].tolist())}")
        dense_mt, dense_hf = np.zeros((n_tokens, n_exp)), np.zeros((n_tokens, n_exp))
        np.put_along_axis(dense_mt, mt_idx, to_f64(dump[p + "router_probs"]), axis=-1)
        np.put_along_axis(dense_hf, hf_idx, to_f64(weights.float().numpy()), axis=-1)
        d, at = maxdiff_where(dense_mt, dense_hf)
        check(d <= PROB_TOL, f"{p}routing weights max abs diff {d:.3e} at {at}")
        worst = max(worst, d)
    return worst


def hf_gradients(model):
    """Parameter gradients by name, with zeros for buffers that are checkpoint tensors (expert bias)."""
    import torch
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    for n, b in model.named_buffers():
        if n.endswith("e_score_correction_bias"):
            grads[n] = torch.zeros_like(b)
    return grads


def compare_forward(dump, model, ids, labels, n_tokens):
    """Logits, loss, routing and every gradient; returns a summary."""
    import torch
    seen, handles = record_routing(model)
    out = model(input_ids=torch.from_numpy(ids.astype(np.int64)), use_cache=False)
    for h in handles:
        h.remove()
    logits = out.logits
    check(tuple(dump["logits"].shape) == tuple(logits.shape),
          f"logits shape {list(dump['logits'].shape)} vs transformers {list(logits.shape)}")
    d_logits, at = maxdiff_where(dump["logits"], logits.detach().numpy())
    check(d_logits <= LOGIT_TOL, f"logits max abs diff {d_logits:.3e} at {at} (tol {LOGIT_TOL})")
    lab = torch.from_numpy(labels.reshape(-1).astype(np.int64))
    sel = lab >= 0
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1])[sel].double(), lab[sel])
    d_loss = abs(scalar(dump["loss"], "loss") - float(loss.detach()))
    check(d_loss <= LOSS_TOL, f"loss moetron {scalar(dump['loss'], 'loss'):.8f} vs transformers {float(loss.detach()):.8f}")
    d_route = compare_routing(dump, seen, n_tokens)
    model.zero_grad(set_to_none=True)
    loss.backward()
    names = [k[len("grad."):] for k in dump if k.startswith("grad.")]
    grads = hf_gradients(model)
    inter = getattr(model.config, "moe_intermediate_size", None) or model.config.intermediate_size
    rel, where = compare_grads_l2(dump, names, grads, inter)
    return (f"logits diff {d_logits:.1e}, loss diff {d_loss:.1e}, routing weights diff {d_route:.1e}, "
            f"{len(names)} gradients, worst rel L2 {rel:.1e} in {where}")


def randomize_expert_bias(model, seed):
    """Non-zero e_score_correction_bias so that it takes part in expert selection."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))


def save_random_model(cfg_cls, cfg_kwargs, seed, workdir, bias_seed=None, per_expert=True):
    """A transformers model with import_init weights (and a random expert bias when bias_seed
    is given), saved to workdir/hf, with per-expert tensor names when per_expert."""
    import torch
    import transformers
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM

    cfg = getattr(transformers, cfg_cls)(**cfg_kwargs)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **eager_kwargs())
    import_init(model, seed)
    if bias_seed is not None:
        randomize_expert_bias(model, bias_seed)
    model.eval()
    hf_dir = os.path.join(workdir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    st_path = os.path.join(hf_dir, "model.safetensors")
    tensors = load_file(st_path)
    if per_expert and any(k.endswith((".experts.gate_up_proj", ".experts.down_proj")) for k in tensors):
        save_file(split_fused(tensors, False), st_path, metadata={"format": "pt"})
    return model, hf_dir


def update_config(hf_dir, changes):
    """Set keys of hf_dir/config.json."""
    cfg_path = os.path.join(hf_dir, "config.json")
    with open(cfg_path) as fh:
        raw = json.load(fh)
    raw.update(changes)
    with open(cfg_path, "w") as fh:
        json.dump(raw, fh, indent=2)


def run_import_case(moetron, name, cfg_cls, cfg_kwargs, extra_keys, workdir):
    seed = sum(map(ord, name))
    model, hf_dir = save_random_model(cfg_cls, cfg_kwargs, seed, workdir, bias_seed=seed)
    if extra_keys:
        update_config(hf_dir, extra_keys)
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, seed, VOCAB, BATCH, SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump", out_path, "--grads"],
            "moetron forward")
    return compare_forward(load_dump(out_path), model, ids, labels, BATCH * SEQ)


def check_config(cfg, model_type, expect):
    check(cfg.model_type == model_type, f"config model_type {cfg.model_type}, expected {model_type}")
    for key, want in expect.items():
        got = getattr(cfg, key, None)
        ok = abs(float(got) - want) <= 1e-9 * abs(want) if isinstance(want, float) and got is not None else got == want
        check(ok, f"config {key} = {got!r}, expected {want!r}")


def run_export_case(moetron, name, flags, model_type, expect, workdir):
    save = os.path.join(workdir, "ckpt")
    run_cmd([moetron, "train"] + BASE_TRAIN + flags + ["--save", save], "moetron train")
    return check_saved_checkpoint(moetron, name, save, TRAIN_ITERS, model_type, expect, workdir)


def check_saved_checkpoint(moetron, name, save, iters, model_type, expect, workdir):
    """transformers loads moetron's checkpoint cleanly and computes what moetron computes."""
    import torch
    from transformers import AutoModelForCausalLM

    it_dir = os.path.join(save, f"iter_{iters:07d}")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(it_dir, dtype=torch.float32, output_loading_info=True,
                                                           **eager_kwargs())
    except Exception as e:
        raise CaseFailure(f"transformers could not load the checkpoint: {type(e).__name__}: {str(e)[:300]}")
    bad = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items() if v}
    check(not bad, f"transformers loading info not clean: {bad}")
    model.eval()
    check_config(model.config, model_type, expect)
    if model_type == "deepseek_v3":  # trained expert biases reach transformers
        biases = [b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
        check(biases and all(float(b.abs().max()) > 0 for b in biases), "expert biases are zero after training")
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    seed = sum(map(ord, name))
    ids, labels = make_inputs(in_path, seed, 257, BATCH, SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", save, "--input", in_path, "--dump", out_path, "--grads"], "moetron forward")
    return compare_forward(load_dump(out_path), model, ids, labels, BATCH * SEQ)


FINETUNE_ITERS = 2
FINETUNE_CASES = [
    ("finetune_from_hf_deepseek_v3", "DeepseekV3Config",
     dict(DEEPSEEK_BASE, q_lora_rank=24, n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
          rope_interleave=True, tie_word_embeddings=False), "deepseek_v3", {"n_group": 2, "q_lora_rank": 24}),
    ("finetune_from_hf_olmoe", "OlmoeConfig", dict(OLMOE_BASE, clip_qkv=0.8, tie_word_embeddings=False), "olmoe",
     {"clip_qkv": 0.8}),
]


def run_finetune_case(moetron, name, cfg_cls, cfg_kwargs, model_type, expect, workdir):
    """`moetron train --load HF_DIR` trains the transformers-made model and saves it as the same family."""
    save_random_model(cfg_cls, cfg_kwargs, sum(map(ord, name)), workdir, bias_seed=7, per_expert=False)
    hf_dir, save = os.path.join(workdir, "hf"), os.path.join(workdir, "ckpt")
    run_cmd([moetron, "train", "--load", hf_dir, "--train-iters", str(FINETUNE_ITERS), "--micro-batch-size", "2",
             "--global-batch-size", "2", "--seq-length", "32", "--eval-interval", "0", "--lr", "1e-3",
             "--lr-warmup-iters", "0", "--save", save,
             # no load-balancing loss: the checkpoint's --grads are then the LM-loss gradients transformers has
             "--moe-router-load-balancing-type", "none"], "moetron train --load HF_DIR")
    return check_saved_checkpoint(moetron, name, save, FINETUNE_ITERS, model_type, expect, workdir)


def run_upcycle_case(moetron, name, cfg_cls, cfg_kwargs, moe_type, extra_flags, expect, workdir):
    """A dense transformers model upcycled by moetron (--moe-use-upcycling, 4 experts, top-2,
    extra_flags, one step that changes no weight): transformers loads the MoE checkpoint as
    moe_type with the config values of expect, and its logits are the dense model's."""
    import torch
    from transformers import AutoModelForCausalLM
    dense, hf_dir = save_random_model(cfg_cls, cfg_kwargs, sum(map(ord, name)), workdir)
    save = os.path.join(workdir, "ckpt")
    run_cmd([moetron, "train", "--load", hf_dir, "--moe-use-upcycling", "--num-experts", "4", "--moe-router-topk", "2",
             "--moe-aux-loss-coeff", "0", "--train-iters", "1", "--lr", "0", "--min-lr", "0", "--lr-warmup-iters", "0",
             "--micro-batch-size", "2", "--global-batch-size", "2", "--seq-length", str(SEQ), "--eval-interval", "0",
             "--save", save] + extra_flags, "moetron train --moe-use-upcycling")
    moe = AutoModelForCausalLM.from_pretrained(os.path.join(save, "iter_0000001"), dtype=torch.float32,
                                               **eager_kwargs()).eval()
    check(moe.config.model_type == moe_type, f"upcycled model_type {moe.config.model_type}, expected {moe_type}")
    for key, want in expect.items():
        check(getattr(moe.config, key, None) == want, f"config {key} = {getattr(moe.config, key, None)!r}, expected {want!r}")
    ids = torch.tensor(np.random.default_rng(7).integers(0, VOCAB, size=(BATCH, SEQ)))
    with torch.no_grad():
        want, got = dense(ids).logits, moe(ids).logits
    diff = float((want - got).abs().max())
    check(diff <= LOGIT_TOL, f"the upcycled model's logits differ from the dense model's by {diff:.3g}")


MTP_FACTOR = 0.1  # --mtp-loss-scaling-factor's default
MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")  # a depth's own tensors, after its layer's
MTP_COPIES = ("embed_tokens.", "shared_head.head.")                # the copies DeepSeek-V3's files carry


def fuse_experts(sd, n_experts):
    """transformers v5's fused expert parameters from per-expert tensors (names relative to a layer)."""
    import torch
    out = {k: v for k, v in sd.items() if ".experts." not in k}
    base = "mlp.experts."
    if base + "0.gate_proj.weight" in sd:
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([sd[f"{base}{e}.gate_proj.weight"], sd[f"{base}{e}.up_proj.weight"]]) for e in range(n_experts)])
        out[base + "down_proj"] = torch.stack([sd[f"{base}{e}.down_proj.weight"] for e in range(n_experts)])
    return out


class MtpDepth:
    """One multi-token-prediction depth as DeepSeek-V3 and Megatron-Core define it, built from
    transformers' own DeepSeek-V3 modules and a checkpoint's model.layers.L.* tensors:
    out = shared_head.norm(layer_L(eh_proj([enorm(embed(token t+1)), hnorm(h_t)])))."""

    def __init__(self, cfg, tensors, layer):
        import torch
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
        H, p = cfg.hidden_size, f"model.layers.{layer}."
        own = {k[len(p):]: torch.from_numpy(np.array(v, np.float32)) for k, v in tensors.items() if k.startswith(p)}
        self.layer = DeepseekV3DecoderLayer(cfg, layer).float()
        block = {k: v for k, v in own.items() if not k.startswith(MTP_OWN + MTP_COPIES)}
        self.layer.load_state_dict(fuse_experts(block, cfg.n_routed_experts), strict=True)
        self.enorm, self.hnorm, self.final = (DeepseekV3RMSNorm(H, cfg.rms_norm_eps) for _ in range(3))
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        with torch.no_grad():
            for mod, key in ((self.enorm, "enorm.weight"), (self.hnorm, "hnorm.weight"),
                             (self.final, "shared_head.norm.weight"), (self.eh_proj, "eh_proj.weight")):
                mod.weight.copy_(own[key])
        self.prefix = p

    def forward(self, model, h, ids):
        """logits of the depth from the main model's final-norm output h and its input ids."""
        import torch
        B, T = ids.shape
        ahead = torch.roll(ids, -1, dims=1)
        ahead[:, -1] = 0
        x = self.eh_proj(torch.cat([self.enorm(model.model.embed_tokens(ahead)), self.hnorm(h)], -1))
        pos = torch.arange(T)[None].expand(B, T)
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
        x = self.layer(x, attention_mask=causal, position_ids=pos,
                       position_embeddings=model.model.rotary_emb(x, pos))
        return model.lm_head(self.final(x if not isinstance(x, tuple) else x[0]))

    def gradients(self):
        """Its parameters' gradients under their checkpoint names."""
        import torch
        mods = {"": self.layer, "enorm.": self.enorm, "hnorm.": self.hnorm, "shared_head.norm.": self.final,
                "eh_proj.": self.eh_proj}
        grads = {self.prefix + pre + n: (q.grad if q.grad is not None else torch.zeros_like(q))
                 for pre, mod in mods.items() for n, q in mod.named_parameters()}
        grads.update({self.prefix + n: torch.zeros_like(b) for n, b in self.layer.named_buffers()
                      if n.endswith("e_score_correction_bias")})  # a checkpoint tensor, not trained
        return grads


def compare_mtp(dump, model, tensors, ids, labels):
    """moetron's main and depth-0 logits and losses, and every gradient of lm loss +
    MTP_FACTOR · mtp loss, against transformers' modules composed as MtpDepth."""
    import torch
    L = model.config.num_hidden_layers
    depth = MtpDepth(model.config, tensors, L)
    ids_t = torch.from_numpy(ids.astype(np.int64))
    h = model.model(input_ids=ids_t, use_cache=False).last_hidden_state
    logits, mtp_logits = model.lm_head(h), depth.forward(model, h, ids_t)
    lab = torch.from_numpy(labels.astype(np.int64))
    ahead = torch.roll(lab, -1, dims=1)
    ahead[:, -1] = -100

    def ce(lg, lb):
        lb = lb.reshape(-1)
        return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1])[lb >= 0].double(), lb[lb >= 0])
    loss, mtp_loss = ce(logits, lab), ce(mtp_logits, ahead)
    d_logits, at = maxdiff_where(dump["logits"], logits.detach().numpy())
    check(d_logits <= LOGIT_TOL, f"logits max abs diff {d_logits:.3e} at {at}")
    d_mtp, at = maxdiff_where(dump["mtp.0.logits"], mtp_logits.detach().numpy())
    check(d_mtp <= LOGIT_TOL, f"mtp.0.logits max abs diff {d_mtp:.3e} at {at}")
    for key, want in (("loss", loss), ("mtp.0.loss", mtp_loss)):
        got = scalar(dump[key], key)
        want = want.item()
        check(abs(got - want) <= LOSS_TOL, f"{key} moetron {got:.8f} vs transformers {want:.8f}")
    model.zero_grad(set_to_none=True)
    (loss + MTP_FACTOR * mtp_loss).backward()
    grads = dict(hf_gradients(model), **depth.gradients())
    names = [k[len("grad."):] for k in dump if k.startswith("grad.")]
    check(any(n.startswith(depth.prefix + "eh_proj") for n in names), "no gradient of the MTP projection dumped")
    rel, where = compare_grads_l2(dump, names, grads, model.config.moe_intermediate_size)
    return (f"logits diff {d_logits:.1e}, mtp logits diff {d_mtp:.1e}, {len(names)} gradients, worst rel L2 "
            f"{rel:.1e} in {where}")


def random_mtp_tensors(cfg, layer, model, seed):
    """A depth's tensors as DeepSeek-V3 files hold them (import_init's scales; the copies of the
    embedding and head included), per-expert names."""
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
    torch.manual_seed(seed)
    block = DeepseekV3DecoderLayer(cfg, layer).float()
    import_init(block, seed)
    H, p = cfg.hidden_size, f"model.layers.{layer}."
    sd = {k: v.detach().numpy() for k, v in block.state_dict().items()}
    for k in list(sd):
        if k.endswith("e_score_correction_bias"):
            sd[k] = (0.05 * np.random.default_rng(seed).standard_normal(sd[k].shape)).astype(np.float32)
    sd = split_fused({p + k: v for k, v in sd.items()}, False)
    rng = np.random.default_rng(seed + 1)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        sd[p + norm + ".weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    sd[p + "eh_proj.weight"] = (0.1 * rng.standard_normal((H, 2 * H))).astype(np.float32)
    sd[p + "embed_tokens.weight"] = model.model.embed_tokens.weight.detach().numpy().copy()
    sd[p + "shared_head.head.weight"] = model.lm_head.weight.detach().numpy().copy()
    return sd


def run_mtp_import_case(moetron, name, workdir):
    """A DeepSeek-V3 checkpoint with YaRN and a multi-token-prediction layer after the last one
    (as DeepSeek-V3 publishes them: num_nextn_predict_layers, its own norms and eh_proj, copies of
    the embedding and head): moetron reads it as --mtp-num-layers 1 and computes what transformers'
    modules composed as DeepSeek-V3's MTP compute; without num_nextn_predict_layers the tensors are
    unexpected."""
    from safetensors.numpy import load_file, save_file

    # YaRN as DeepSeek-V3 publishes it, its original context inside the sequence
    kwargs = dict(DEEPSEEK_BASE, q_lora_rank=None, n_group=1, topk_group=1, num_experts_per_tok=2,
                  first_k_dense_replace=1, num_nextn_predict_layers=1, tie_word_embeddings=False,
                  qk_rope_head_dim=16, rope_parameters=YARN_DEEPSEEK)
    model, hf_dir = save_random_model("DeepseekV3Config", kwargs, 11, workdir, bias_seed=11)
    st_path = os.path.join(hf_dir, "model.safetensors")
    tensors = load_file(st_path)
    tensors.update(random_mtp_tensors(model.config, kwargs["num_hidden_layers"], model, 12))
    save_file(tensors, st_path, metadata={"format": "pt"})
    update_config(hf_dir, {"router_aux_loss_coef": 0.0})  # --grads: no load-balancing term
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, 11, VOCAB, BATCH, SEQ, extra_ignored=True)
    cmd = [moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump", out_path, "--grads"]
    run_cmd(cmd + ["--mtp-num-layers", "1"], "moetron forward --mtp-num-layers 1")
    detail = compare_mtp(load_dump(out_path), model, tensors, ids, labels)
    # without the flag the layer is skipped (with a note), as transformers does: the causal LM's numbers
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=CMD_TIMEOUT)
    check(p.returncode == 0 and b"skipped 42 tensors of 1 multi-token-prediction layer" in p.stderr,
          f"without --mtp-num-layers: {p.stderr.decode()[-300:]}")
    compare_forward(load_dump(out_path), model, ids, labels, BATCH * SEQ)
    p = subprocess.run(cmd + ["--mtp-num-layers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=CMD_TIMEOUT)
    err = p.stderr.decode().strip().splitlines()
    check(p.returncode != 0 and len(err) == 1 and "has 1 multi-token-prediction layer" in err[0],
          f"--mtp-num-layers 2 of 1: expected one error line, got {err[:3]}")
    update_config(hf_dir, {"num_nextn_predict_layers": 0})
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=CMD_TIMEOUT)
    err = p.stderr.decode().strip().splitlines()
    mtp = f"model.layers.{kwargs['num_hidden_layers']}."
    check(p.returncode != 0 and len(err) == 1 and "unexpected tensor " + mtp in err[0],
          f"without num_nextn_predict_layers: expected one 'unexpected tensor' line, got {err[:3]}")
    return detail + "; skipped without the flag, as transformers"


def run_mtp_export_case(moetron, name, workdir):
    """moetron trains a DeepSeek-V3 with YaRN and --mtp-num-layers 1 and saves it: config.json says
    num_nextn_predict_layers 1, the MTP layer's tensors carry DeepSeek-V3's names (with the
    embedding and head copies), transformers loads the rest cleanly, and moetron's forward of the
    checkpoint is what transformers' modules compute."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
    save = os.path.join(workdir, "ckpt")
    flags = MLA_FLAGS + DEEPSEEK_ROUTER + ["--hf-architecture", "deepseek_v3", "--init-method-std", "0.1",
                                           "--untie-embeddings-and-output-weights", "--mtp-num-layers", "1",
                                           "--moe-router-load-balancing-type", "none", "--rope-type", "yarn",
                                           "--rotary-scaling-factor", "4", "--original-max-position-embeddings", "12",
                                           "--beta-slow", "0.25", "--mscale", "0.9", "--mscale-all-dim", "0.7",
                                           "--max-position-embeddings", "64"]
    run_cmd([moetron, "train"] + BASE_TRAIN + flags + ["--save", save], "moetron train")
    it_dir = os.path.join(save, f"iter_{TRAIN_ITERS:07d}")
    model, info = AutoModelForCausalLM.from_pretrained(it_dir, dtype=torch.float32, output_loading_info=True,
                                                       **eager_kwargs())
    L = model.config.num_hidden_layers
    mtp = f"model.layers.{L}."
    info["unexpected_keys"] = [k for k in info.get("unexpected_keys", []) if not k.startswith(mtp)]
    bad = {k: v for k, v in info.items() if v}
    check(not bad, f"transformers loading info not clean besides the MTP layer: {bad}")
    check(model.config.num_nextn_predict_layers == 1, f"num_nextn_predict_layers {model.config.num_nextn_predict_layers}")
    tensors = load_file(os.path.join(it_dir, "model.safetensors"))
    for copy, main in (("embed_tokens.weight", "model.embed_tokens.weight"), ("shared_head.head.weight", "lm_head.weight")):
        check(np.array_equal(tensors.get(mtp + copy), tensors[main]), f"{mtp}{copy} is not a copy of {main}")
    model.eval()
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, 5, 257, BATCH, SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", save, "--input", in_path, "--dump", out_path, "--grads"], "moetron forward")
    return compare_mtp(load_dump(out_path), model, tensors, ids, labels)


FP8_BLOCK = 128


def fp8_block_quantize(w):
    """DeepSeek-V3's published layout: F8_E4M3 weights and a float32 weight_scale_inv per
    128x128 block ([ceil(r/128), ceil(c/128)]); returns (fp8 weight, scales, dequantized)."""
    import torch
    r, c = w.shape
    br, bc = -(-r // FP8_BLOCK), -(-c // FP8_BLOCK)
    scale = torch.empty(br, bc, dtype=torch.float32)
    q = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            block = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            scale[i, j] = block.abs().max().clamp(min=1e-12) / 448.0
            q[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = (block / scale[i, j]).to(
                torch.float8_e4m3fn)
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:r].repeat_interleave(FP8_BLOCK, 1)[:, :c]
    return q, scale, q.float() * full


def run_fp8_case(moetron, name, workdir):
    """FP8 weights with block scales load dequantized: the transformers model holding the
    dequantized weights computes what moetron computes. The embedding (300 rows) spans three
    row blocks; the routers and norms stay float32, as in DeepSeek-V3's files."""
    import torch
    from safetensors.torch import load_file, save_file

    kwargs = dict(DEEPSEEK_BASE, q_lora_rank=24, n_group=2, topk_group=1, num_experts_per_tok=2,
                  first_k_dense_replace=1, hidden_size=160)
    model, hf_dir = save_random_model("DeepseekV3Config", kwargs, 5, workdir)
    st_path = os.path.join(hf_dir, "model.safetensors")
    tensors = load_file(st_path)
    params = dict(model.named_parameters())
    n_fp8 = 0
    for k in sorted(tensors):
        w = tensors[k]
        if w.dim() != 2 or k.endswith("mlp.gate.weight"):
            continue
        q, scale, deq = fp8_block_quantize(w)
        tensors[k], tensors[k + "_scale_inv"] = q, scale
        n_fp8 += 1
        with torch.no_grad():  # the transformers model holds the dequantized weights
            hf_view(params, k, model.config.moe_intermediate_size).copy_(deq)
    check(n_fp8 > 20, f"only {n_fp8} FP8 tensors")
    save_file(tensors, st_path, metadata={"format": "pt"})
    update_config(hf_dir, {"router_aux_loss_coef": 0.0})
    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, 5, VOCAB, BATCH, SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump", out_path, "--grads"],
            "moetron forward (FP8)")
    return f"{n_fp8} FP8 tensors; " + compare_forward(load_dump(out_path), model, ids, labels, BATCH * SEQ)


def run_reject_case(moetron, name, flags, expect, workdir):
    save = os.path.join(workdir, "ckpt")
    p = subprocess.run([moetron, "train"] + BASE_TRAIN + flags + ["--save", save], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=CMD_TIMEOUT)
    err = p.stderr.decode(errors="replace").strip().splitlines()
    check(p.returncode != 0, f"moetron train accepted {flags}")
    check(len(err) == 1 and err[0].startswith("moetron: error:") and expect in err[0],
          f"expected one 'moetron: error:' line mentioning {expect!r}, got {err[:3]}")
    check(not os.path.exists(save), "the failed run created its --save directory")
    check(not p.stdout.strip(), f"the failed run printed training output: {p.stdout[:200]!r}")
    return err[0]


def main():
    cases = [(c[0], run_import_case, c[1:]) for c in IMPORT_CASES] + \
            [(c[0], run_export_case, c[1:]) for c in EXPORT_CASES] + \
            [(c[0], run_finetune_case, c[1:]) for c in FINETUNE_CASES] + \
            [("import_deepseek_v3_mtp", run_mtp_import_case, ()),
             ("export_deepseek_v3_mtp", run_mtp_export_case, ()),
             ("import_deepseek_v3_fp8_block_scales", run_fp8_case, ())] + \
            [(c[0], run_upcycle_case, c[1:] + ([], {})) for c in UPCYCLE_CASES] + \
            [("upcycle_qwen3_dense_layer_freq", run_upcycle_case,
              UPCYCLE_CASES[0][1:] + (["--moe-layer-freq", "[0,1]"], {"mlp_only_layers": [0]}))] + \
            [(c[0], run_reject_case, c[1:]) for c in REJECT_CASES] + \
            [(c[0], run_unsupported_config_case, c[1:]) for c in UNSUPPORTED_CONFIGS]
    return main_over(__doc__, cases, "hffam")


if __name__ == "__main__":
    sys.exit(main())
