#!/usr/bin/env python3
"""Hugging Face conformance check for moetron checkpoints.

usage: hf_conformance.py MOETRON_BINARY [CASE ...]

For each case: train a tiny model with moetron for a few steps, save it, run
`moetron forward` on fixed random tokens, load the saved checkpoint with
transformers (float32, CPU) and compare logits, loss, per-layer routing and
(in the grads case) every parameter gradient.

The `import_*` cases go the other way: build a tiny random model in transformers from a
MixtralConfig / Qwen3MoeConfig, `save_pretrained` it, run `moetron forward --load` on that
plain Hugging Face directory and compare logits, loss, routing and every gradient. The
`import_qwen3_sharded_fused_bf16` case rewrites such a directory into the Hub layouts (3 shards +
model.safetensors.index.json, fused 3-D expert tensors, some BF16 tensors) and also checks that an
index naming a missing shard is rejected with one error line.

Prints one line per case, `ok <case>` or `FAIL <case>: <why>`, and exits
non-zero when any case fails. Needs python3 with torch, transformers (v5),
safetensors and numpy. Set HF_CONFORMANCE_KEEP=1 to keep the temp dirs,
HF_CONFORMANCE_EAGER=1 to force eager attention/experts in transformers.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

TRAIN_ITERS = 3
BATCH, SEQ = 2, 24
VOCAB_TOKENS = 257  # byte-level ids the built-in data uses (256 bytes + end-of-document)

BASE_TRAIN = [
    "--train-iters", str(TRAIN_ITERS), "--micro-batch-size", "2", "--global-batch-size", "2",
    "--seq-length", "32", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--num-experts", "4", "--moe-ffn-hidden-size", "48", "--moe-router-topk", "2",
    "--eval-interval", "0", "--log-interval", "100", "--lr-warmup-iters", "0",
]

QWEN_B = ["--qk-layernorm", "--untie-embeddings-and-output-weights",
          "--group-query-attention", "--num-query-groups", "2"]

# name -> (extra train flags, expected model_type, expected config values, compare grads)
CASES = [
    ("a_mixtral_tied", [], "mixtral",
     {"tie_word_embeddings": True, "num_experts_per_tok": 2}, False),
    ("b_qwen3_untied_gqa", QWEN_B, "qwen3_moe",
     {"tie_word_embeddings": False, "num_key_value_heads": 2, "norm_topk_prob": True}, False),
    ("c_qwen3_dense_moe_mix", ["--qk-layernorm", "--moe-layer-freq", "[0,1]", "--ffn-hidden-size", "96"],
     "qwen3_moe", {"mlp_only_layers": [0], "intermediate_size": 96, "tie_word_embeddings": True}, False),
    ("d_qwen3_pre_softmax_top3", ["--qk-layernorm", "--moe-router-pre-softmax", "--moe-router-topk", "3"],
     "qwen3_moe", {"norm_topk_prob": False, "num_experts_per_tok": 3}, False),
    ("e_mixtral_kv32_rope500k", ["--kv-channels", "32", "--rotary-base", "500000"], "mixtral",
     {"head_dim": 32, "rope_theta": 500000.0}, False),
    ("f_qwen3_grads", QWEN_B + ["--moe-aux-loss-coeff", "0"], "qwen3_moe",
     {"tie_word_embeddings": False, "num_key_value_heads": 2}, True),
    # tied embeddings: grad.model.embed_tokens.weight must hold both the embedding and the output-layer part
    ("g_mixtral_tied_grads", ["--kv-channels", "32", "--moe-aux-loss-coeff", "0"], "mixtral",
     {"tie_word_embeddings": True, "head_dim": 32}, True),
]

# transformers -> moetron: name -> (config class, config kwargs, aux-coefficient check).
# router_aux_loss_coef 0 so that moetron's --grads gradient is the pure LM-loss gradient; the
# aux-check case then reruns with a non-zero coefficient to check that moetron reads it.
IMPORT_BASE = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=128,
                   router_aux_loss_coef=0.0)
IMPORT_CASES = [
    ("import_mixtral_untied", "MixtralConfig",
     dict(IMPORT_BASE, head_dim=16, intermediate_size=48, num_local_experts=4, rope_theta=1e6,
          rms_norm_eps=1e-5, tie_word_embeddings=False), True),
    ("import_qwen3_tied_dense0_hd24", "Qwen3MoeConfig",
     dict(IMPORT_BASE, head_dim=24, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
          norm_topk_prob=True, mlp_only_layers=[0], rope_theta=1e6, rms_norm_eps=1e-6,
          tie_word_embeddings=True), False),
    ("import_qwen3_nonorm_top3of6", "Qwen3MoeConfig",
     dict(IMPORT_BASE, head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=6,
          num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[], rope_theta=1e6,
          rms_norm_eps=1e-6, tie_word_embeddings=False), False),
]
IMPORT_BATCH, IMPORT_SEQ = 2, 20
IMPORT_INIT_STD = 0.1      # larger than initializer_range so that routing is far from uniform
IMPORT_AUX_COEF = 0.05     # for the aux-coefficient check
IMPORT_GRAD_RTOL = 1e-4    # relative L2 error per gradient tensor

LOGIT_TOL = 1e-4
LOSS_TOL = 1e-5
ROUTER_TOL = 1e-4
PROB_TOL = 1e-4
GRAD_RTOL = 1e-4   # relative to the tensor's largest HF gradient entry
GRAD_ATOL = 1e-7
TIE_GAP = 1e-5     # top-k sets may differ only where HF's k-th and (k+1)-th probabilities are this close
CMD_TIMEOUT = 600


class CaseFailure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise CaseFailure(msg)


def run_cmd(argv, what):
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CaseFailure(f"{what} timed out after {CMD_TIMEOUT}s")
    except OSError as e:
        raise CaseFailure(f"{what} could not run: {e}")
    if p.returncode != 0:
        tail = p.stdout.decode(errors="replace").strip().splitlines()[-6:]
        raise CaseFailure(f"{what} exited {p.returncode}: " + " | ".join(tail))
    return p.stdout.decode(errors="replace")


def make_inputs(path, seed, vocab=VOCAB_TOKENS, batch=BATCH, seq=SEQ, extra_ignored=True):
    """Random input_ids and aligned next-token labels (last position -100) written to path."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int32)
    labels = np.full((batch, seq), -100, dtype=np.int32)
    labels[:, :-1] = ids[:, 1:]          # aligned: label[b,t] is the target of position t
    if extra_ignored:                    # a few more ignored positions exercise the "label < 0" rule
        labels[0, 5] = -1
        labels[1, 0] = -100
    save_file({"input_ids": ids, "labels": labels}, path)
    return ids, labels


def load_dump(path):
    from safetensors.numpy import load_file
    return load_file(path)


def to_f64(a):
    return np.asarray(a, dtype=np.float64)


def scalar(a, name):
    a = np.asarray(a)
    check(a.size == 1, f"{name} should be a scalar or [1], has shape {list(a.shape)}")
    return float(a.reshape(-1)[0])


def maxdiff_where(a, b):
    d = np.abs(to_f64(a) - to_f64(b))
    i = np.unravel_index(int(np.argmax(d)), d.shape) if d.size else ()
    return float(d.max()) if d.size else 0.0, tuple(int(x) for x in i)


EXPERT_RE = re.compile(
    r"^model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def hf_view(params, name, inter):
    """The part of a transformers v5 parameter (per-expert weights are fused there) that holds
    checkpoint tensor `name`; `params` maps parameter names to tensors (weights or gradients)."""
    m = EXPERT_RE.match(name)
    if m:
        layer, _, e, part = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        base = f"model.layers.{layer}.mlp.experts."
        if part in ("gate_proj", "w1"):
            return params[base + "gate_up_proj"][e, :inter]
        if part in ("up_proj", "w3"):
            return params[base + "gate_up_proj"][e, inter:]
        return params[base + "down_proj"][e]
    return params[name.replace(".block_sparse_moe.", ".mlp.")]


def moe_layer_indices(model):
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


def check_config(cfg, model_type, expect):
    check(cfg.model_type == model_type, f"config model_type {cfg.model_type}, expected {model_type}")
    for key, want in expect.items():
        got = cfg.rope_parameters.get("rope_theta") if key == "rope_theta" else getattr(cfg, key, None)
        if isinstance(want, float):
            ok = got is not None and math.isclose(float(got), want, rel_tol=1e-9)
        else:
            ok = got == want
        check(ok, f"config {key} = {got!r}, expected {want!r}")


def routing_from_logits(logits, k, renorm):
    """HF routing: softmax over experts in float32, top-k, optional renormalisation."""
    import torch
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = torch.topk(probs, k, dim=-1)
    if renorm:
        top = top / top.sum(-1, keepdim=True)
    return probs.numpy(), idx.numpy(), top.numpy()


def compare_routing(dump, model, router_logits, n_tokens):
    cfg = model.config
    moe_layers = moe_layer_indices(model)
    check(len(router_logits) == len(moe_layers),
          f"transformers returned {len(router_logits)} router logits for {len(moe_layers)} MoE layers")
    dumped = sorted({int(k.split(".")[1]) for k in dump if re.match(r"^layers\.\d+\.router_logits$", k)})
    check(dumped == moe_layers, f"moetron dumped router logits for layers {dumped}, HF MoE layers are {moe_layers}")
    k = cfg.num_experts_per_tok
    n_exp = cfg.num_experts if cfg.model_type == "qwen3_moe" else cfg.num_local_experts
    renorm = cfg.model_type == "mixtral" or bool(cfg.norm_topk_prob)
    for layer, hf_lg in zip(moe_layers, router_logits):
        p = f"layers.{layer}."
        for key in ("router_logits", "router_topk_idx", "router_probs", "tokens_per_expert", "aux_loss"):
            check(p + key in dump, f"dump has no {p + key}")
        hf_lg = hf_lg.detach()
        check(tuple(hf_lg.shape) == (n_tokens, n_exp), f"HF router logits shape {tuple(hf_lg.shape)}")
        mt_lg = dump[p + "router_logits"]
        check(tuple(mt_lg.shape) == (n_tokens, n_exp),
              f"{p}router_logits shape {list(mt_lg.shape)}, expected {[n_tokens, n_exp]}")
        d, at = maxdiff_where(mt_lg, hf_lg.numpy())
        check(d <= ROUTER_TOL, f"{p}router_logits max abs diff {d:.3e} at {at} (tol {ROUTER_TOL})")

        probs, hf_idx, hf_w = routing_from_logits(hf_lg, k, renorm)
        mt_idx = dump[p + "router_topk_idx"].astype(np.int64)
        mt_w = to_f64(dump[p + "router_probs"])
        check(mt_idx.shape == (n_tokens, k), f"{p}router_topk_idx shape {list(mt_idx.shape)}, expected {[n_tokens, k]}")
        check(mt_w.shape == (n_tokens, k), f"{p}router_probs shape {list(mt_w.shape)}, expected {[n_tokens, k]}")
        check(mt_idx.min() >= 0 and mt_idx.max() < n_exp, f"{p}router_topk_idx out of range [0,{n_exp})")
        sorted_p = -np.sort(-probs, axis=-1)
        for t in range(n_tokens):
            if set(mt_idx[t].tolist()) != set(hf_idx[t].tolist()):
                gap = sorted_p[t, k - 1] - sorted_p[t, k] if k < n_exp else 0.0
                check(gap < TIE_GAP, f"{p}top-k set differs at token {t}: moetron {sorted(mt_idx[t].tolist())} "
                      f"vs HF {sorted(hf_idx[t].tolist())} (HF prob gap {gap:.2e})")
        # routing weights compared per expert, whatever the order of the k slots
        dense_mt = np.zeros((n_tokens, n_exp))
        dense_hf = np.zeros((n_tokens, n_exp))
        np.put_along_axis(dense_mt, mt_idx, mt_w, axis=-1)
        np.put_along_axis(dense_hf, hf_idx, to_f64(hf_w), axis=-1)
        same = np.array([set(mt_idx[t].tolist()) == set(hf_idx[t].tolist()) for t in range(n_tokens)])
        d, at = maxdiff_where(dense_mt[same], dense_hf[same])
        check(d <= PROB_TOL, f"{p}router_probs max abs diff {d:.3e} (tol {PROB_TOL}, "
              f"norm_topk={renorm})")
        counts = dump[p + "tokens_per_expert"].astype(np.int64).reshape(-1)
        want = np.bincount(mt_idx.reshape(-1), minlength=n_exp)
        check(counts.shape == (n_exp,) and np.array_equal(counts, want),
              f"{p}tokens_per_expert {counts.tolist()} but its top-k indices count {want.tolist()}")
        aux = np.asarray(dump[p + "aux_loss"], dtype=np.float64)
        check(aux.size == 1 and np.isfinite(aux).all(), f"{p}aux_loss is not a finite scalar: {aux}")
        # Switch load-balancing loss as moetron (Megatron) defines it, before the coefficient:
        # E * sum_e (share of the N*k assignments that went to e) * (mean router probability of e).
        # (HF's load_balancing_loss_func pools all layers and omits the 1/k, so it is not used here.)
        hf_counts = np.bincount(hf_idx.reshape(-1), minlength=n_exp)
        want_aux = n_exp * float(np.sum(hf_counts / (n_tokens * k) * to_f64(probs).mean(0)))
        check(abs(float(aux.reshape(-1)[0]) - want_aux) <= 1e-5 * max(1.0, want_aux),
              f"{p}aux_loss {float(aux.reshape(-1)[0]):.7f}, from HF routing {want_aux:.7f}")


def compare_weights(ckpt_tensors, params, inter):
    for name, w in ckpt_tensors.items():
        try:
            hw = hf_view(params, name, inter)
        except KeyError:
            raise CaseFailure(f"checkpoint tensor {name} has no place in the transformers model")
        hw = hw.detach().numpy()
        check(hw.shape == w.shape, f"{name}: checkpoint shape {list(w.shape)} vs HF {list(hw.shape)}")
        check(np.array_equal(hw, w), f"{name}: transformers holds different values than the checkpoint")


def paired_grads(dump, ckpt_names, grads, inter, what=""):
    """Check the dump has exactly the checkpoint's gradients; yield (name, moetron, HF) pairs."""
    dumped = {k[len("grad."):] for k in dump if k.startswith("grad.")}
    missing = sorted(set(ckpt_names) - dumped)
    extra = sorted(dumped - set(ckpt_names))
    check(not missing, f"{what}dump lacks gradients for {len(missing)} tensors, e.g. {missing[:3]}")
    check(not extra, f"{what}dump has gradients for tensors not in the checkpoint: {extra[:3]}")
    for name in sorted(ckpt_names):
        g_mt = to_f64(dump["grad." + name])
        g_hf = to_f64(hf_view(grads, name, inter).numpy())
        check(g_mt.shape == g_hf.shape, f"{what}grad.{name}: shape {list(g_mt.shape)} vs HF {list(g_hf.shape)}")
        yield name, g_mt, g_hf


def compare_grads(dump, ckpt_names, grads, inter):
    worst = (0.0, None)
    for name, g_mt, g_hf in paired_grads(dump, ckpt_names, grads, inter):
        scale = float(np.abs(g_hf).max()) if g_hf.size else 0.0
        d, at = maxdiff_where(g_mt, g_hf)
        tol = GRAD_RTOL * scale + GRAD_ATOL
        check(d <= tol, f"grad.{name} max abs diff {d:.3e} at {at} (HF {g_hf[at]:.6e}, moetron {g_mt[at]:.6e}, "
              f"tensor max {scale:.3e}, tol {tol:.3e})")
        rel = d / (scale + 1e-30)
        if rel > worst[0]:
            worst = (rel, name)
    return worst


def run_case(moetron, name, flags, model_type, expect, grads, workdir):
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    save = os.path.join(workdir, "ckpt")
    run_cmd([moetron, "train"] + BASE_TRAIN + flags + ["--save", save], "moetron train")
    it_dir = os.path.join(save, f"iter_{TRAIN_ITERS:07d}")
    for f in ("config.json", "model.safetensors"):
        check(os.path.isfile(os.path.join(it_dir, f)), f"no {f} in {it_dir}")
    latest = os.path.join(save, "latest_checkpointed_iteration.txt")
    check(os.path.isfile(latest), "no latest_checkpointed_iteration.txt")
    with open(latest) as fh:
        check(fh.read().strip() == str(TRAIN_ITERS), "latest_checkpointed_iteration.txt does not hold "
              f"{TRAIN_ITERS}")

    in_path = os.path.join(workdir, "in.safetensors")
    out_path = os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, seed=sum(map(ord, name)))
    fwd = [moetron, "forward", "--load", save, "--input", in_path, "--dump", out_path]
    if grads:
        fwd.append("--grads")
    run_cmd(fwd, "moetron forward")
    check(os.path.isfile(out_path), "moetron forward wrote no dump")
    dump = load_dump(out_path)

    kwargs = {}
    if os.environ.get("HF_CONFORMANCE_EAGER"):
        kwargs = {"attn_implementation": "eager", "experts_implementation": "eager"}
    try:
        model, info = AutoModelForCausalLM.from_pretrained(it_dir, dtype=torch.float32,
                                                           output_loading_info=True, **kwargs)
    except Exception as e:  # a shape mismatch raises here
        raise CaseFailure(f"transformers could not load the checkpoint: {type(e).__name__}: {str(e)[:300]}")
    bad = {k: sorted(v) if isinstance(v, (set, list)) else v for k, v in info.items() if v}
    check(not bad, f"transformers loading info not clean: {bad}")
    model.eval()
    cfg = model.config
    check_config(cfg, model_type, expect)
    check(cfg.vocab_size >= VOCAB_TOKENS, f"vocab_size {cfg.vocab_size} < {VOCAB_TOKENS}")
    inter = cfg.moe_intermediate_size if cfg.model_type == "qwen3_moe" else cfg.intermediate_size

    ckpt = load_file(os.path.join(it_dir, "model.safetensors"))
    for n, t in ckpt.items():
        check(t.dtype == np.float32, f"{n} is stored as {t.dtype}, expected float32")
    check(("lm_head.weight" in ckpt) == (not cfg.tie_word_embeddings),
          f"lm_head.weight {'present' if 'lm_head.weight' in ckpt else 'absent'} with "
          f"tie_word_embeddings={cfg.tie_word_embeddings}")
    params = dict(model.named_parameters())
    compare_weights(ckpt, params, inter)

    input_ids = torch.from_numpy(ids.astype(np.int64))
    with torch.set_grad_enabled(grads):
        out = model(input_ids=input_ids, output_router_logits=True, use_cache=False)
    logits = out.logits  # [B,T,V]

    # logits
    check("logits" in dump, "dump has no logits")
    mt_logits = dump["logits"]
    check(tuple(mt_logits.shape) == tuple(logits.shape),
          f"logits shape {list(mt_logits.shape)} vs HF {list(logits.shape)}")
    d, at = maxdiff_where(mt_logits, logits.detach().numpy())
    check(d <= LOGIT_TOL, f"logits max abs diff {d:.3e} at {at} (tol {LOGIT_TOL})")

    # loss: mean cross-entropy over positions whose label is >= 0, from HF logits in float64
    check("loss" in dump, "dump has no loss")
    mt_loss = scalar(dump["loss"], "loss")
    lg = to_f64(logits.detach().numpy()).reshape(-1, logits.shape[-1])
    lab = labels.reshape(-1).astype(np.int64)
    sel = lab >= 0
    mx = lg.max(-1, keepdims=True)
    lse = (np.log(np.exp(lg - mx).sum(-1, keepdims=True)) + mx)[:, 0]
    hf_loss = float(np.mean(lse[sel] - lg[sel, lab[sel]]))
    check(abs(mt_loss - hf_loss) <= LOSS_TOL, f"loss moetron {mt_loss:.8f} vs HF {hf_loss:.8f} "
          f"(diff {abs(mt_loss - hf_loss):.3e}, tol {LOSS_TOL})")

    compare_routing(dump, model, out.router_logits, BATCH * SEQ)

    note = ""
    if grads:
        lab_t = torch.from_numpy(lab)
        sel_t = lab_t >= 0
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1])[sel_t], lab_t[sel_t])
        model.zero_grad(set_to_none=True)
        loss.backward()
        hf_grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
        rel, where = compare_grads(dump, list(ckpt.keys()), hf_grads, inter)
        note = f" (worst grad rel diff {rel:.1e} in {where})"
    return f"logits diff {d:.1e}, loss diff {abs(mt_loss - hf_loss):.1e}{note}"


def import_init(model, seed):
    """Matrices ~ N(0, IMPORT_INIT_STD²), norm weights 1 + 0.1·N(0,1); tied tensors once."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():  # deduplicated: a tied lm_head is the embedding
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * noise if p.dim() == 1 else IMPORT_INIT_STD * noise)


def fuse_note(name, keys, shapes):
    """transformers wrote fused 3-D expert tensors: name them and say the case converts them."""
    fused = [f"{k} {list(shapes[k])}" for k in keys if re.search(r"\.experts\.(gate_up_proj|down_proj)$", k)]
    print(f"note {name}: save_pretrained wrote fused expert tensors, which moetron does not read: "
          + ", ".join(fused[:4]) + (f" (+{len(fused) - 4} more)" if len(fused) > 4 else "")
          + "; converted to per-expert names for the rest of the case")
    sys.stdout.flush()


def split_fused(tensors, mixtral):
    """Per-expert tensors from transformers v5's fused layout (gate rows first in gate_up_proj)."""
    out = {}
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for k, v in tensors.items():
        m = re.match(r"^(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)$", k)
        if not m:
            out[k.replace(".mlp.gate.", ".block_sparse_moe.gate.") if mixtral else k] = v
            continue
        base = m.group(1) + (".block_sparse_moe.experts." if mixtral else ".mlp.experts.")
        for e in range(v.shape[0]):
            if m.group(2) == "down_proj":
                out[f"{base}{e}.{names[2]}.weight"] = np.ascontiguousarray(v[e])
            else:
                inter = v.shape[1] // 2
                out[f"{base}{e}.{names[0]}.weight"] = np.ascontiguousarray(v[e, :inter])
                out[f"{base}{e}.{names[1]}.weight"] = np.ascontiguousarray(v[e, inter:])
    return out


def hf_aux_objective(router_logits, dump, moe_layers):
    """Σ_l A_l as moetron defines it (docs/moe.md), from HF router logits, moetron's counts constant."""
    import torch
    total = 0.0
    for layer, lg in zip(moe_layers, router_logits):
        n, e = lg.shape
        k = dump[f"layers.{layer}.router_topk_idx"].shape[1]
        counts = torch.from_numpy(dump[f"layers.{layer}.tokens_per_expert"].astype(np.float64))
        total = total + e / (k * n * n) * (torch.softmax(lg.double(), -1).sum(0) * counts).sum()
    return total


def compare_grads_l2(dump, ckpt_names, grads, inter, what=""):
    worst = (0.0, None)
    for name, g_mt, g_hf in paired_grads(dump, ckpt_names, grads, inter, what):
        err = float(np.linalg.norm(g_mt - g_hf))
        ref = float(np.linalg.norm(g_hf))
        check(err <= IMPORT_GRAD_RTOL * ref + GRAD_ATOL,
              f"{what}grad.{name} relative L2 error {err / (ref + 1e-30):.3e} (|HF| {ref:.3e}, "
              f"|moetron| {np.linalg.norm(g_mt):.3e}, tol {IMPORT_GRAD_RTOL})")
        rel = err / (ref + 1e-30)
        if rel > worst[0]:
            worst = (rel, name)
    return worst


def run_import_case(moetron, name, cfg_cls, cfg_kwargs, aux_check, workdir):
    import torch
    import transformers
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM

    cfg = getattr(transformers, cfg_cls)(**cfg_kwargs)
    kwargs = {}
    if os.environ.get("HF_CONFORMANCE_EAGER"):
        kwargs = {"attn_implementation": "eager", "experts_implementation": "eager"}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
    seed = sum(map(ord, name))
    import_init(model, seed)
    model.eval()
    cfg = model.config
    mixtral = cfg.model_type == "mixtral"
    n_exp = cfg.num_local_experts if mixtral else cfg.num_experts
    inter = cfg.intermediate_size if mixtral else cfg.moe_intermediate_size
    check(cfg.get_text_config().rope_parameters.get("rope_theta") == cfg_kwargs["rope_theta"],
          f"transformers config rope_theta {cfg.rope_parameters}, expected {cfg_kwargs['rope_theta']}")

    hf_dir = os.path.join(workdir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    files = sorted(os.listdir(hf_dir))
    st = [f for f in files if f.endswith(".safetensors")]
    check(st == ["model.safetensors"] and not any(f.endswith(".index.json") for f in files),
          f"save_pretrained wrote {files}, expected a single model.safetensors")
    st_path = os.path.join(hf_dir, "model.safetensors")
    ckpt = load_file(st_path)
    if any(re.search(r"\.experts\.(gate_up_proj|down_proj)$", k) for k in ckpt):
        fuse_note(name, sorted(ckpt), {k: v.shape for k, v in ckpt.items()})
        ckpt = split_fused(ckpt, mixtral)
        save_file(ckpt, st_path, metadata={"format": "pt"})
    for n, t in ckpt.items():
        check(t.dtype == np.float32, f"{n} is stored as {t.dtype}, expected float32")
    n_per_expert = sum(1 for k in ckpt if EXPERT_RE.match(k))
    check(n_per_expert == 3 * n_exp * len(moe_layer_indices(model)),
          f"model.safetensors has {n_per_expert} per-expert tensors, expected "
          f"{3 * n_exp * len(moe_layer_indices(model))}")
    check(("lm_head.weight" in ckpt) == (not cfg.tie_word_embeddings),
          f"lm_head.weight {'present' if 'lm_head.weight' in ckpt else 'absent'} with "
          f"tie_word_embeddings={cfg.tie_word_embeddings}")
    params = dict(model.named_parameters())
    compare_weights(ckpt, params, inter)

    in_path = os.path.join(workdir, "in.safetensors")
    out_path = os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, seed, cfg.vocab_size, IMPORT_BATCH, IMPORT_SEQ, extra_ignored=False)

    fwd = [moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump", out_path, "--grads"]
    run_cmd(fwd, "moetron forward")  # a plain transformers directory must load as written
    dump = load_dump(out_path)

    input_ids = torch.from_numpy(ids.astype(np.int64))
    out = model(input_ids=input_ids, output_router_logits=True, use_cache=False)
    logits = out.logits

    # padded vocabulary = HF vocabulary (no extra padding for a plain HF directory)
    check("logits" in dump, "dump has no logits")
    mt_logits = dump["logits"]
    check(mt_logits.shape[-1] == cfg.vocab_size,
          f"moetron's padded vocabulary is {mt_logits.shape[-1]}, HF vocab_size is {cfg.vocab_size}")
    check(tuple(mt_logits.shape) == tuple(logits.shape),
          f"logits shape {list(mt_logits.shape)} vs HF {list(logits.shape)}")
    d_logits, at = maxdiff_where(mt_logits, logits.detach().numpy())
    check(d_logits <= LOGIT_TOL, f"logits max abs diff {d_logits:.3e} at {at} (tol {LOGIT_TOL})")

    lab_t = torch.from_numpy(labels.reshape(-1).astype(np.int64))
    sel_t = lab_t >= 0
    flat = logits.reshape(-1, logits.shape[-1])
    lm_loss = torch.nn.functional.cross_entropy(flat[sel_t], lab_t[sel_t])
    lg = to_f64(flat.detach().numpy())
    lab = lab_t.numpy()
    sel = lab >= 0
    mx = lg.max(-1, keepdims=True)
    lse = (np.log(np.exp(lg - mx).sum(-1, keepdims=True)) + mx)[:, 0]
    hf_loss = float(np.mean(lse[sel] - lg[sel, lab[sel]]))
    mt_loss = scalar(dump["loss"], "loss")
    d_loss = abs(mt_loss - hf_loss)
    check(d_loss <= LOSS_TOL, f"loss moetron {mt_loss:.8f} vs HF {hf_loss:.8f} (diff {d_loss:.3e}, tol {LOSS_TOL})")

    n_tok = IMPORT_BATCH * IMPORT_SEQ
    compare_routing(dump, model, out.router_logits, n_tok)
    moe_layers = moe_layer_indices(model)
    d_router = max(maxdiff_where(dump[f"layers.{l}.router_logits"], r.detach().numpy())[0]
                   for l, r in zip(moe_layers, out.router_logits))
    spread = [len(np.unique(dump[f"layers.{l}.router_topk_idx"].astype(np.int64), axis=0)) for l in moe_layers]

    model.zero_grad(set_to_none=True)
    lm_loss.backward(retain_graph=aux_check)
    hf_grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
    rel, where = compare_grads_l2(dump, list(ckpt.keys()), hf_grads, inter)
    detail = (f"vocab {mt_logits.shape[-1]}, logits diff {d_logits:.1e}, loss diff {d_loss:.1e}, "
              f"router logits diff {d_router:.1e}, distinct top-k sets per MoE layer {spread}, "
              f"worst grad rel L2 {rel:.1e} in {where}")

    if aux_check:  # the coefficient must come from config.json's router_aux_loss_coef
        cfg_path = os.path.join(hf_dir, "config.json")
        with open(cfg_path) as fh:
            raw = json.load(fh)
        raw["router_aux_loss_coef"] = IMPORT_AUX_COEF
        with open(cfg_path, "w") as fh:
            json.dump(raw, fh, indent=2)
        out2 = os.path.join(workdir, "out_aux.safetensors")
        run_cmd(fwd[:-2] + [out2, "--grads"], "moetron forward (router_aux_loss_coef set)")
        dump2 = load_dump(out2)
        model.zero_grad(set_to_none=True)
        (lm_loss + IMPORT_AUX_COEF * hf_aux_objective(out.router_logits, dump2, moe_layers)).backward()
        hf_grads2 = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
        rel2, where2 = compare_grads_l2(dump2, list(ckpt.keys()), hf_grads2, inter,
                                        what=f"with router_aux_loss_coef {IMPORT_AUX_COEF}: ")
        detail += f"; with aux coef {IMPORT_AUX_COEF}: worst grad rel L2 {rel2:.1e} in {where2}"

    return detail


# Hub layouts: a transformers Qwen3-MoE model rewritten as 3 shards + index.json, with fused
# 3-D expert tensors per layer and some tensors stored as BF16 (the HF model gets the same
# bf16-rounded weights, so the usual tolerances hold).
LAYOUT_CASES = [
    ("import_qwen3_sharded_fused_bf16",
     dict(IMPORT_BASE, head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
          norm_topk_prob=True, mlp_only_layers=[], rope_theta=1e6, rms_norm_eps=1e-6,
          tie_word_embeddings=False)),
]
LAYOUT_SHARDS = 3
LAYOUT_BF16_RE = re.compile(r"embed_tokens|layers\.0\.self_attn\.q_proj|layers\.1\.mlp\.experts|lm_head")


def fuse_experts(tensors):
    """transformers v5's fused layout from per-expert Qwen3-MoE tensors: per layer
    mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and mlp.experts.down_proj [E, H, I]."""
    import torch
    out, parts = {}, {}
    for k, v in tensors.items():
        m = EXPERT_RE.match(k)
        if m:
            parts.setdefault(int(m.group(1)), {})[(int(m.group(3)), m.group(4))] = v
        else:
            out[k] = v
    for layer, p in parts.items():
        n_exp = 1 + max(e for e, _ in p)
        base = f"model.layers.{layer}.mlp.experts."
        out[base + "gate_up_proj"] = torch.stack(
            [torch.cat([p[(e, "gate_proj")], p[(e, "up_proj")]], 0) for e in range(n_exp)]).contiguous()
        out[base + "down_proj"] = torch.stack([p[(e, "down_proj")] for e in range(n_exp)]).contiguous()
    return out


def write_shards(tensors, hf_dir, n_shards):
    """Round-robin the tensors (sorted by name) over n_shards files plus model.safetensors.index.json."""
    from safetensors.torch import save_file
    names = sorted(tensors)
    shard_of = {n: f"model-{i % n_shards + 1:05d}-of-{n_shards:05d}.safetensors" for i, n in enumerate(names)}
    for shard in sorted(set(shard_of.values())):
        save_file({n: tensors[n] for n in names if shard_of[n] == shard}, os.path.join(hf_dir, shard),
                  metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": shard_of}, fh, indent=2)
    os.remove(os.path.join(hf_dir, "model.safetensors"))
    return shard_of


def check_broken_index(moetron, hf_dir, workdir, in_path):
    """A weight_map naming a shard that is not there: non-zero exit, one 'moetron: error:' line."""
    bad_dir = os.path.join(workdir, "hf_bad_index")
    shutil.copytree(hf_dir, bad_dir)
    idx_path = os.path.join(bad_dir, "model.safetensors.index.json")
    with open(idx_path) as fh:
        idx = json.load(fh)
    victim = sorted(idx["weight_map"])[0]
    idx["weight_map"][victim] = "model-00009-of-00009.safetensors"
    with open(idx_path, "w") as fh:
        json.dump(idx, fh)
    p = subprocess.run([moetron, "forward", "--load", bad_dir, "--input", in_path,
                        "--dump", os.path.join(workdir, "bad.safetensors")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=CMD_TIMEOUT)
    err = p.stderr.decode(errors="replace").strip().splitlines()
    check(p.returncode != 0, "moetron forward accepted an index naming a missing shard")
    check(len(err) == 1 and err[0].startswith("moetron: error:") and "model-00009-of-00009" in err[0],
          f"broken index: expected one 'moetron: error:' line naming the missing shard, got {err[:3]}")


def run_import_layout_case(moetron, name, cfg_kwargs, workdir):
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cfg = transformers.Qwen3MoeConfig(**cfg_kwargs)
    kwargs = {}
    if os.environ.get("HF_CONFORMANCE_EAGER"):
        kwargs = {"attn_implementation": "eager", "experts_implementation": "eager"}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
    seed = sum(map(ord, name))
    import_init(model, seed)
    with torch.no_grad():  # the tensors stored as BF16 below hold bf16-exact values in the HF model too
        for n, p in model.named_parameters():
            if LAYOUT_BF16_RE.search(n):
                p.copy_(p.bfloat16().float())
    model.eval()
    cfg = model.config
    inter = cfg.moe_intermediate_size

    hf_dir = os.path.join(workdir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    check(os.path.exists(os.path.join(hf_dir, "model.safetensors")), "save_pretrained wrote no model.safetensors")
    raw = load_file(os.path.join(hf_dir, "model.safetensors"))
    if any(re.search(r"\.experts\.(gate_up_proj|down_proj)$", k) for k in raw):  # per-expert names first
        raw = {k: torch.from_numpy(v) for k, v in split_fused({k: v.numpy() for k, v in raw.items()}, False).items()}
    per_expert = sorted(raw)
    check(sum(1 for k in raw if EXPERT_RE.match(k)) == 3 * cfg.num_experts * len(moe_layer_indices(model)),
          "the per-expert checkpoint does not have 3 tensors per expert and MoE layer")
    # rewrite: fused experts, some tensors BF16, 3 shards + index
    fused = fuse_experts(raw)
    n_bf16 = 0
    for k in fused:
        if LAYOUT_BF16_RE.search(k):
            fused[k] = fused[k].bfloat16()
            n_bf16 += 1
    check(n_bf16 >= 4, f"only {n_bf16} tensors were stored as BF16")
    shard_of = write_shards(fused, hf_dir, LAYOUT_SHARDS)
    check(len(set(shard_of.values())) == LAYOUT_SHARDS, "the rewrite did not produce 3 shards")

    in_path = os.path.join(workdir, "in.safetensors")
    out_path = os.path.join(workdir, "out.safetensors")
    ids, labels = make_inputs(in_path, seed, cfg.vocab_size, IMPORT_BATCH, IMPORT_SEQ, extra_ignored=False)
    run_cmd([moetron, "forward", "--load", hf_dir, "--input", in_path, "--dump", out_path, "--grads"],
            "moetron forward (sharded, fused, bf16)")
    dump = load_dump(out_path)

    out = model(input_ids=torch.from_numpy(ids.astype(np.int64)), output_router_logits=True, use_cache=False)
    logits = out.logits
    mt_logits = dump["logits"]
    check(tuple(mt_logits.shape) == tuple(logits.shape),
          f"logits shape {list(mt_logits.shape)} vs HF {list(logits.shape)}")
    d_logits, at = maxdiff_where(mt_logits, logits.detach().numpy())
    check(d_logits <= LOGIT_TOL, f"logits max abs diff {d_logits:.3e} at {at} (tol {LOGIT_TOL})")
    lab_t = torch.from_numpy(labels.reshape(-1).astype(np.int64))
    sel_t = lab_t >= 0
    lm_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1])[sel_t], lab_t[sel_t])
    mt_loss = scalar(dump["loss"], "loss")
    d_loss = abs(mt_loss - float(lm_loss.detach()))
    check(d_loss <= LOSS_TOL, f"loss moetron {mt_loss:.8f} vs HF {float(lm_loss.detach()):.8f} (diff {d_loss:.3e})")
    compare_routing(dump, model, out.router_logits, IMPORT_BATCH * IMPORT_SEQ)

    model.zero_grad(set_to_none=True)
    lm_loss.backward()
    params = dict(model.named_parameters())
    hf_grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
    rel, where = compare_grads_l2(dump, per_expert, hf_grads, inter)

    check_broken_index(moetron, hf_dir, workdir, in_path)
    return (f"{LAYOUT_SHARDS} shards, {n_bf16} BF16 tensors, logits diff {d_logits:.1e}, loss diff {d_loss:.1e}, "
            f"worst grad rel L2 {rel:.1e} in {where}; broken index rejected")


def run_cases(moetron, cases, prefix):
    """Run (name, runner, args) cases, each in its own temp dir: one ok/FAIL line per case, then
    the summary; returns the exit status."""
    failed = 0
    for name, runner, case_args in cases:
        workdir = tempfile.mkdtemp(prefix=f"{prefix}_{name}_")
        try:
            detail = runner(moetron, name, *case_args, workdir)
            print(f"ok {name}" + (f"  [{detail}]" if os.environ.get("HF_CONFORMANCE_VERBOSE") else ""))
        except CaseFailure as e:
            failed += 1
            print(f"FAIL {name}: {e}")
        except Exception as e:  # a bug here or an unreadable dump: still one line per case
            failed += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (at line {where.lineno})")
        finally:
            sys.stdout.flush()
            if os.environ.get("HF_CONFORMANCE_KEEP"):
                print(f"  kept {workdir}", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main_over(doc, all_cases, prefix):
    """A conformance script's main: `SCRIPT MOETRON_BINARY [CASE ...]` runs the (name, runner,
    args) cases whose names start with a CASE (all without one); doc's usage line otherwise."""
    if len(sys.argv) < 2:
        print(doc.strip().splitlines()[2], file=sys.stderr)
        return 2
    moetron = os.path.abspath(sys.argv[1])
    wanted = sys.argv[2:]
    cases = [c for c in all_cases if not wanted or any(c[0].startswith(w) for w in wanted)]
    if not cases:
        print(f"no case matches {wanted}", file=sys.stderr)
        return 2
    try:
        import torch
        import transformers
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        torch.set_num_threads(min(8, os.cpu_count() or 1))
    except ImportError as e:
        print(f"FAIL setup: {e}")
        return 1
    if not os.access(moetron, os.X_OK):
        print(f"FAIL setup: {moetron} is not an executable")
        return 1
    return run_cases(moetron, cases, prefix)


def main():
    all_cases = [(c[0], run_case, c[1:]) for c in CASES] + [(c[0], run_import_case, c[1:]) for c in IMPORT_CASES]
    all_cases += [(c[0], run_import_layout_case, c[1:]) for c in LAYOUT_CASES]
    return main_over(__doc__, all_cases, "hfconf")


if __name__ == "__main__":
    sys.exit(main())
