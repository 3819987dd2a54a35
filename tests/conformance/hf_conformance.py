#!/usr/bin/env python3
"""Hugging Face conformance check for moetron checkpoints.

usage: hf_conformance.py MOETRON_BINARY [CASE ...]

For each case: train a tiny model with moetron for a few steps, save it, run
`moetron forward` on fixed random tokens, load the saved checkpoint with
transformers (float32, CPU) and compare logits, loss, per-layer routing and
(in the grads case) every parameter gradient.

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


def make_inputs(path, seed):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB_TOKENS, size=(BATCH, SEQ)).astype(np.int32)
    labels = np.full((BATCH, SEQ), -100, dtype=np.int32)
    labels[:, :-1] = ids[:, 1:]          # aligned: label[b,t] is the target of position t
    labels[0, 5] = -1                    # a few more ignored positions exercise the "label < 0" rule
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


def compare_grads(dump, ckpt_names, grads, inter):
    dumped = {k[len("grad."):] for k in dump if k.startswith("grad.")}
    missing = sorted(set(ckpt_names) - dumped)
    extra = sorted(dumped - set(ckpt_names))
    check(not missing, f"dump lacks gradients for {len(missing)} tensors, e.g. {missing[:3]}")
    check(not extra, f"dump has gradients for tensors not in the checkpoint: {extra[:3]}")
    worst = (0.0, None)
    for name in sorted(ckpt_names):
        g_mt = to_f64(dump["grad." + name])
        g_hf = to_f64(hf_view(grads, name, inter).numpy())
        check(g_mt.shape == g_hf.shape, f"grad.{name}: shape {list(g_mt.shape)} vs HF {list(g_hf.shape)}")
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


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    moetron = os.path.abspath(sys.argv[1])
    wanted = sys.argv[2:]
    cases = [c for c in CASES if not wanted or any(c[0].startswith(w) for w in wanted)]
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
    failed = 0
    for name, flags, model_type, expect, grads in cases:
        workdir = tempfile.mkdtemp(prefix=f"hfconf_{name}_")
        try:
            detail = run_case(moetron, name, flags, model_type, expect, grads, workdir)
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


if __name__ == "__main__":
    sys.exit(main())
