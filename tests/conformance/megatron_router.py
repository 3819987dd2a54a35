#!/usr/bin/env python3
"""moetron's router against Megatron-Core's routing functions.

usage: megatron_router.py ROUTER_PROBE [CASE ...]

For each case: random float64 logits (rounded to float32 values, so that moetron, which
computes on float, sees exactly the same numbers), run build/router_probe (moetron's
router_forward / router_backward with moetron's own flags) and Megatron-Core's pure
routing functions (megatron.core.transformer.moe.moe_utils, CPU, float64 inputs) and
compare:
  * the chosen experts of every token (as sets) and the probs per (token, expert);
  * the capacity-dropping result (kept map, tokens per expert, padded capacity);
  * aux_loss / seq_aux_loss / global_aux_loss values (moetron logs L/coeff, Megatron
    returns coeff·L), the counts they use, and the z-loss;
  * dlogits of objective = Σ probs⊙R + Σ coeff·losses (R random) against torch autograd;
  * with --moe-router-padding-for-quantization: the aligned dispatch plan's rows of each
    expert (as a map) against Megatron's pad_routing_map of the kept map with its
    get_fp8_align_size / get_fp4_align_size, each expert's rows in token order (Megatron's
    permute), every kept choice in a row of its token.

Deliberate differences, checked against a reference of our own instead of Megatron:
  * --moe-token-drop-policy position: moetron keeps the earliest tokens of each expert;
    Megatron takes torch.topk over the 0/1 routing map, whose tie order is unspecified.
    (Megatron's own token order is s·B+b, moetron's b·T+t, so "earliest" also means
    different tokens when a micro-batch holds several sequences.)
  * sqrtsoftplus: not in megatron-core 0.16.1; compared against the sigmoid code path of
    Megatron with sqrt(softplus(l)) in place of sigmoid (what newer Megatron does).
  * --moe-router-topk 1 with softmax (no pre-softmax): moetron rejects it; Megatron
    accepts it (every prob is 1, so the router gets no gradient from the probs).

Quantile balancing (quantile_*): against a reference written here from Megatron-LM's
definition (megatron-core 0.16.1 has none): the picks of l − bias, each expert's quantile
(exactly), the probs and dlogits.

Sinkhorn routing (sinkhorn_*): the picks of Megatron-Core's own sinkhorn() (float32) on
logits whose k-th and (k+1)-th balanced values are clearly apart (moetron computes in
double), the probs (sigmoid for top-1, else the softmax over all experts) and dlogits.

Prints `ok <case>` or `FAIL <case>: <why>` per case; exits non-zero on any failure.
Needs torch, numpy, safetensors and megatron-core (pip install megatron-core).
"""

import logging
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

try:
    import numpy as np
    import torch
    from safetensors.numpy import load_file, save_file
except ImportError as exc:
    print("FAIL setup: python3 with torch, numpy and safetensors is required (%s)" % exc)
    sys.exit(1)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found"
try:
    from megatron.core.transformer.moe.moe_utils import (
        apply_router_token_dropping,
        compute_routing_scores_for_aux_loss,
        get_capacity,
        group_limited_topk,
        sinkhorn,
        switch_load_balancing_loss_func,
        topk_routing_with_score_function,
        z_loss_func,
        pad_routing_map,
    )
    from megatron.core.fp4_utils import get_fp4_align_size
    from megatron.core.fp8_utils import get_fp8_align_size
    from megatron.core.enums import Fp4Recipe, Fp8Recipe
except Exception:  # noqa: BLE001 - any import problem of megatron-core is a setup problem
    print("FAIL setup: pip install megatron-core")
    sys.exit(1)

PROBS_TOL = 1e-5      # absolute, per (token, expert)
SCORE_TOL = 1e-6      # absolute, aux scores
LOSS_RTOL = 1e-6      # relative, loss values (Megatron's softmax runs in fp32)
GRAD_RTOL = 1e-5      # max |Δ| / max |reference| of dlogits
TIE_GAP = 1e-6        # closer values than this are regenerated (torch.topk tie order is unspecified)
BALANCE_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


class Case:
    def __init__(self, name, E=8, N=16, S=None, k=2, score="softmax", pre=False, scale=0.0, groups=(0, 0),
                 bias=False, cf=0.0, policy="probs", pad=False, balance=None, z=1e-3, micro=1, seed=0, skew=0.0,
                 qpad=None):
        self.name, self.E, self.N, self.k = name, E, N, k
        self.S = S or N
        self.score, self.pre, self.scale, self.groups, self.bias = score, pre, scale, groups, bias
        self.cf, self.policy, self.pad = cf, policy, pad
        self.balance = {"aux_loss": 1e-2} if balance is None else balance
        self.z, self.micro, self.seed = z, micro, seed
        self.skew = skew  # added to the logits of the low experts (skew·(1 − e/(E−1))): some get too many tokens
        self.qpad = qpad  # --moe-router-padding-for-quantization with this recipe (tensorwise, mxfp8, nvfp4)
        assert self.N % self.S == 0

    def flags(self):
        f = ["--num-experts", str(self.E), "--moe-router-topk", str(self.k), "--seq-length", str(self.S),
             "--moe-router-score-function", self.score, "--moe-z-loss-coeff", repr(self.z)]
        if self.pre:
            f.append("--moe-router-pre-softmax")
        if self.scale:
            f += ["--moe-router-topk-scaling-factor", repr(self.scale)]
        if self.groups[0]:
            f += ["--moe-router-num-groups", str(self.groups[0]), "--moe-router-group-topk", str(self.groups[1])]
        if self.bias:
            f.append("--moe-router-enable-expert-bias")
        if self.cf:
            f += ["--moe-expert-capacity-factor", repr(self.cf), "--moe-token-drop-policy", self.policy]
            if self.pad:
                f.append("--moe-pad-expert-input-to-capacity")
        if self.balance:
            f += ["--moe-router-load-balancing-type"] + list(self.balance)
            f += ["--moe-aux-loss-coeff"] + [repr(v) for v in self.balance.values()]
        else:
            f += ["--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0"]
        if self.qpad:
            quant = ["--fp4-format", "e2m1"] if self.qpad == "nvfp4" else ["--fp8-format", "e4m3", "--fp8-recipe",
                                                                            self.qpad]
            f += quant + ["--moe-router-padding-for-quantization"]
        return f

    def qpad_multiple(self):
        if self.qpad == "nvfp4":
            return get_fp4_align_size(Fp4Recipe.nvfp4)
        return get_fp8_align_size(Fp8Recipe[self.qpad])


def build_cases():
    c = []
    # score functions and top-k
    c.append(Case("softmax_post_k2", E=8, N=16))
    c.append(Case("softmax_post_k4_e16", E=16, N=32, k=4))
    c.append(Case("softmax_pre_k1", E=8, N=16, k=1, pre=True))
    c.append(Case("softmax_pre_k2_e16", E=16, N=24, k=2, pre=True))
    for k in (1, 2, 4):
        E = 16 if k == 4 else 8
        c.append(Case("sigmoid_k%d" % k, E=E, N=20, k=k, score="sigmoid"))
        c.append(Case("sigmoid_k%d_bias" % k, E=E, N=20, k=k, score="sigmoid", bias=True))
    # topk scaling factor
    c.append(Case("softmax_post_k2_scale", E=8, N=16, scale=2.5))
    c.append(Case("softmax_pre_k2_scale", E=8, N=16, pre=True, scale=1.5))
    c.append(Case("sigmoid_k1_scale", E=8, N=16, k=1, score="sigmoid", scale=2.5))
    c.append(Case("sigmoid_k2_bias_scale", E=16, N=16, score="sigmoid", bias=True, scale=2.5))
    # group-limited routing
    c.append(Case("group_softmax_post_k4_g4of2", E=16, N=24, k=4, groups=(4, 2)))
    c.append(Case("group_softmax_post_k2_g2of1", E=8, N=16, k=2, groups=(2, 1)))
    c.append(Case("group_softmax_pre_k2_g4of2", E=8, N=16, k=2, pre=True, groups=(4, 2)))
    c.append(Case("group_sigmoid_k2_g4of2", E=8, N=16, score="sigmoid", groups=(4, 2)))
    c.append(Case("group_sigmoid_k4_bias_g8of4_scale", E=16, N=32, k=4, score="sigmoid", bias=True,
                  groups=(8, 4), scale=2.5))
    c.append(Case("group_sigmoid_k4_bias_g4of2", E=16, N=24, k=4, score="sigmoid", bias=True, groups=(4, 2)))
    # capacity dropping
    for cf in (0.5, 1.0, 1.5):
        for policy in ("probs", "position"):
            for pad in (False, True):
                name = "capacity_%s_%s%s" % (cf, policy, "_pad" if pad else "")
                # N·k/E = 5: capacities 3 (2.5 rounded up), 5 and 8 (7.5 rounded up)
                c.append(Case(name, E=8, N=20, k=2, cf=cf, policy=policy, pad=pad, seed=int(cf * 10),
                              skew=1.5 * cf + 0.5))
    c.append(Case("capacity_1.0_probs_sigmoid_k4_bias", E=16, N=32, k=4, score="sigmoid", bias=True, cf=1.0))
    c.append(Case("capacity_0.5_position_sigmoid_k1_pad", E=8, N=18, k=1, score="sigmoid", cf=0.5,
                  policy="position", pad=True))
    c.append(Case("capacity_1.5_probs_pre_k2_scale_pad", E=8, N=16, pre=True, scale=2.0, cf=1.5, pad=True, skew=1.5))
    c.append(Case("capacity_8_over_n_pad", E=8, N=12, k=2, cf=8.0, pad=True))  # capacity > N
    # load-balancing losses and z-loss
    c.append(Case("aux_loss_only", E=8, N=16, z=0.0))
    c.append(Case("z_loss_only", E=8, N=16, balance={}, z=1e-3))
    c.append(Case("no_losses", E=8, N=16, balance={}, z=0.0))
    c.append(Case("seq_aux_softmax_b3", E=8, N=24, S=8, balance={"seq_aux_loss": 1e-2}))
    c.append(Case("seq_aux_sigmoid_k4_b2", E=16, N=32, S=16, k=4, score="sigmoid", balance={"seq_aux_loss": 1e-2}))
    c.append(Case("aux_and_seq_aux_b4", E=8, N=32, S=8, balance={"aux_loss": 1e-2, "seq_aux_loss": 2e-2}))
    c.append(Case("global_aux_softmax_2mb", E=8, N=16, balance={"global_aux_loss": 1e-2}, micro=2))
    c.append(Case("global_aux_sigmoid_bias_2mb", E=16, N=24, score="sigmoid", bias=True,
                  balance={"global_aux_loss": 1e-2}, micro=2))
    c.append(Case("all_three_losses_3mb", E=8, N=24, S=12, pre=True, balance={"aux_loss": 1e-2,
                  "seq_aux_loss": 2e-2, "global_aux_loss": 3e-2}, z=1e-3, micro=3))
    c.append(Case("everything_sigmoid", E=16, N=32, S=8, k=4, score="sigmoid", bias=True, groups=(4, 2), scale=2.5,
                  cf=1.0, policy="probs", balance={"aux_loss": 1e-2, "seq_aux_loss": 1e-3, "global_aux_loss": 1e-2},
                  z=1e-3, micro=2))
    # sqrtsoftplus: our own reference (megatron-core 0.16.1 has no sqrtsoftplus)
    c.append(Case("own_sqrtsoftplus_k1", E=8, N=16, k=1, score="sqrtsoftplus"))
    c.append(Case("own_sqrtsoftplus_k2_bias_scale", E=8, N=16, score="sqrtsoftplus", bias=True, scale=2.5,
                  balance={"aux_loss": 1e-2, "seq_aux_loss": 1e-2}, z=1e-3))
    c.append(Case("own_sqrtsoftplus_k4_groups_capacity", E=16, N=32, S=16, k=4, score="sqrtsoftplus", bias=True,
                  groups=(4, 2), cf=1.0, balance={"aux_loss": 1e-2, "global_aux_loss": 1e-2}, micro=2))
    # --moe-router-padding-for-quantization: tokens without a (kept) choice pad each expert
    c.append(Case("qpad_tensorwise_k2", E=8, N=40, k=2, qpad="tensorwise"))
    c.append(Case("qpad_tensorwise_capacity", E=8, N=20, k=2, cf=1.0, skew=2.0, qpad="tensorwise"))
    c.append(Case("qpad_tensorwise_short_of_tokens", E=4, N=12, k=2, qpad="tensorwise"))  # 16 > N: all tokens
    c.append(Case("qpad_mxfp8_sigmoid_k4", E=16, N=48, k=4, score="sigmoid", bias=True, qpad="mxfp8"))
    c.append(Case("qpad_nvfp4_k1", E=8, N=160, k=1, pre=True, qpad="nvfp4", skew=3.0))
    return c


# ---- the probe --------------------------------------------------------------------------

def run_probe(probe, tmp, flags, tensors, metadata=None):
    inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    if os.path.exists(out):
        os.remove(out)
    save_file(tensors, inp, metadata=metadata)
    r = subprocess.run([probe, inp, out] + flags, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("router_probe failed (%d): %s" % (r.returncode, (r.stderr or r.stdout).strip()))
    return load_file(out)


# ---- Megatron's side ----------------------------------------------------------------------

def sqrtsoftplus_routing(logits, topk, num_groups, group_topk, scaling_factor, expert_bias):
    """Megatron's sigmoid branch with sqrt(softplus) scores (the newer Megatron code path)."""
    T, E = logits.shape
    scores = torch.nn.functional.softplus(logits.float()).sqrt().type_as(logits)

    def pick(values):
        if group_topk:
            return group_limited_topk(values, topk, T, E, num_groups, group_topk)
        return torch.topk(values, k=topk, dim=1)

    if expert_bias is not None:
        _, idx = pick(scores + expert_bias)
        scores = torch.gather(scores, 1, idx)
    else:
        scores, idx = pick(scores)
    probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else scores
    if scaling_factor:
        probs = probs * scaling_factor
    return (torch.zeros_like(logits).scatter(1, idx, probs),
            torch.zeros_like(logits).int().scatter(1, idx, 1).bool())


def aux_scores_and_map(logits, topk, score):
    if score != "sqrtsoftplus":
        return compute_routing_scores_for_aux_loss(logits, topk, score)
    s = torch.nn.functional.softplus(logits).sqrt()
    s = s / (s.sum(dim=-1, keepdim=True) + 1e-20)
    _, idx = torch.topk(s, k=topk, dim=1)
    return torch.zeros_like(logits).int().scatter(1, idx, 1).bool(), s


def megatron_reference(case, logits_mo, bias, R_mo, counts_before, batches_before):
    """Everything in moetron's token order (b·T+t); Megatron works on s·B+b."""
    N, E, k, S = case.N, case.E, case.k, case.S
    B = N // S
    to_meg = np.arange(N).reshape(B, S).T.reshape(-1)  # Megatron row i holds moetron token to_meg[i]
    to_mo = np.argsort(to_meg)                          # moetron token n is Megatron row to_mo[n]
    L = torch.tensor(logits_mo[to_meg], dtype=torch.float64, requires_grad=True)
    R = torch.tensor(R_mo[to_meg], dtype=torch.float64)
    b = torch.tensor(bias, dtype=torch.float32) if bias is not None else None
    G, g = case.groups
    kw = dict(num_groups=G or None, group_topk=g or None, scaling_factor=case.scale or None)
    if case.score == "sqrtsoftplus":
        probs, rmap = sqrtsoftplus_routing(L, k, G, g, case.scale, b)
    else:
        probs, rmap = topk_routing_with_score_function(L, k, use_pre_softmax=case.pre, score_function=case.score,
                                                      expert_bias=b, **kw)
    routed_probs = probs.detach().clone()
    final_map = rmap
    capacity = 0
    if case.cf:
        dropped_probs, final_map = apply_router_token_dropping(probs, rmap, router_topk=k, capacity_factor=case.cf,
                                                                drop_policy=case.policy, pad_to_capacity=case.pad)
        capacity = get_capacity(N * k, E, case.cf)
    megatron_kept = rmap & final_map
    if case.cf and case.policy == "position":  # our reference: the earliest tokens (moetron's order)
        kept = torch.tensor(earliest_tokens_kept(rmap.numpy()[to_mo], min(capacity, N))[to_meg])
        probs = probs * kept
    else:
        kept = megatron_kept
        if case.cf:
            probs = dropped_probs
    amap, ascores = aux_scores_and_map(L, k, case.score)
    counts = amap.sum(0).double()
    smap, sscores = amap.reshape(S, -1), ascores.reshape(S, -1)  # [S, B·E]
    seq_counts = smap.sum(0).double()
    gcounts = (torch.tensor(counts_before, dtype=torch.float64) + counts) / (batches_before + 1)

    def balance(kind, coeff):
        if kind == "aux_loss":
            return switch_load_balancing_loss_func(ascores, counts, N, k, E, coeff)
        if kind == "seq_aux_loss":
            return switch_load_balancing_loss_func(sscores, seq_counts, S, k, E, coeff) / B
        return switch_load_balancing_loss_func(ascores, gcounts, N, k, E, coeff)

    values = {kind: balance(kind, 1.0).item() for kind in BALANCE_TYPES}
    z_value = z_loss_func(L, 1.0).item()
    objective = (probs * R).sum()
    losses = 0.0
    for kind, coeff in case.balance.items():
        losses = losses + balance(kind, coeff)
    if case.z:
        losses = losses + z_loss_func(L, case.z)
    objective = objective + losses
    objective.backward()
    un = lambda t: t.detach().numpy()[to_mo]  # noqa: E731 - back to moetron's token order
    return {
        "routed_map": un(rmap), "routed_probs": un(routed_probs), "probs": un(probs), "kept": un(kept),
        "megatron_kept": un(megatron_kept),
        "final_map": un(final_map), "capacity": capacity, "aux_map": un(amap), "aux_scores": un(ascores),
        "aux_counts": counts.numpy(), "seq_counts": seq_counts.numpy().reshape(B, E), "global_counts": gcounts.numpy(),
        "values": values, "z_loss": z_value, "objective": float(losses) if torch.is_tensor(losses) else losses,
        "dlogits": un(L.grad),
    }


# ---- ties and own references ------------------------------------------------------------

def selection_values(case, logits, bias):
    l = torch.tensor(logits, dtype=torch.float64)
    if case.score == "softmax":
        v = torch.softmax(l, -1) if case.pre else l
    else:
        v = torch.sigmoid(l) if case.score == "sigmoid" else torch.nn.functional.softplus(l).sqrt()
        if bias is not None:
            v = v + torch.tensor(bias, dtype=torch.float64)
    return v


def min_gap(values):  # smallest gap between two values of each row, the minimum over rows
    s = torch.sort(values, dim=-1).values
    return (s[..., 1:] - s[..., :-1]).min().item() if s.shape[-1] > 1 else float("inf")


def ambiguous(case, logits, bias, ref):
    """Whether torch.topk's unspecified tie order could decide the outcome."""
    v = selection_values(case, logits, bias)
    if min_gap(v) < TIE_GAP or min_gap(torch.tensor(logits)) < TIE_GAP:
        return True
    G, g = case.groups
    if G:
        per = case.k // g
        gs = v.view(case.N, G, -1).topk(per, dim=-1).values.sum(-1)
        if min_gap(gs) < TIE_GAP:
            return True
    if case.cf and case.policy == "probs":
        C = ref["capacity"]
        for e in range(case.E):
            col = np.sort(ref["routed_probs"][:, e][ref["routed_map"][:, e]])[::-1]
            if len(col) > C and col[C - 1] - col[C] < TIE_GAP:
                return True
    return False


def earliest_tokens_kept(routed_map, capacity):
    kept = np.zeros_like(routed_map)
    for e in range(routed_map.shape[1]):
        tokens = np.nonzero(routed_map[:, e])[0][:capacity]
        kept[tokens, e] = True
    return kept


# ---- comparison ---------------------------------------------------------------------------

def dense(idx, values, N, E):
    out = np.zeros((N, E), dtype=np.float64)
    for n in range(N):
        for j in range(idx.shape[1]):
            out[n, idx[n, j]] = values[n, j]
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


def compare(case, mb, out, ref, notes):
    """Problems found in one micro-batch (list of strings)."""
    N, E, k = case.N, case.E, case.k
    p, tag = [], ("mb%d " % mb if case.micro > 1 else "")
    idx = out["topk_idx"]
    for n in range(N):
        got, want = sorted(idx[n].tolist()), sorted(np.nonzero(ref["routed_map"][n])[0].tolist())
        if got != want:
            p.append("%stoken %d experts %s, Megatron %s" % (tag, n, got, want))
            break
    kept_mo = dense(idx, out["kept"], N, E) > 0
    want_kept, want_probs = ref["kept"], ref["probs"]
    if case.cf and case.policy == "position" and not (ref["megatron_kept"] == want_kept).all():
        notes.add("Megatron's position policy kept other tokens than the earliest (torch.topk tie order); "
                  "compared with our earliest-token reference")
    if not (kept_mo == want_kept).all():
        diff = np.argwhere(kept_mo != want_kept)[:4].tolist()
        p.append("%skept map differs at (token, expert) %s" % (tag, diff))
    probs_mo = dense(idx, out["topk_probs"].astype(np.float64), N, E)
    d = np.abs(probs_mo - want_probs).max()
    if d > PROBS_TOL:
        n, e = np.unravel_index(np.abs(probs_mo - want_probs).argmax(), probs_mo.shape)
        p.append("%sprobs max |diff| %.3g at (%d,%d): moetron %.9g Megatron %.9g" % (tag, d, n, e, probs_mo[n, e],
                                                                                 want_probs[n, e]))
    tpe = want_kept.sum(0)
    if (out["tokens_per_expert"] != tpe).any():
        p.append("%stokens_per_expert %s, expected %s" % (tag, out["tokens_per_expert"].tolist(), tpe.tolist()))
    dropped = int(ref["routed_map"].sum() - want_kept.sum())
    if case.cf and case.cf < E / k and dropped == 0:
        p.append("%sthe logits drop nothing: the case tests no capacity limit (change its seed or skew)" % tag)
    if int(out["dropped"]) != dropped:
        p.append("%sdropped %d, expected %d" % (tag, int(out["dropped"]), dropped))
    want_cap = min(ref["capacity"], N) if case.cf and case.pad else 0
    if int(out["capacity"]) != want_cap:
        p.append("%scapacity %d, expected %d" % (tag, int(out["capacity"]), want_cap))
    if case.cf and case.pad and (ref["final_map"].sum(0) != want_cap).any():
        p.append("%sMegatron padded rows per expert %s != capacity %d" % (tag, ref["final_map"].sum(0).tolist(),
                                                                          want_cap))
    d = np.abs(out["aux_scores"].astype(np.float64) - ref["aux_scores"]).max()
    if d > SCORE_TOL:
        p.append("%saux scores max |diff| %.3g" % (tag, d))
    for name in ("aux_counts", "global_counts"):
        if np.abs(out[name].astype(np.float64) - ref[name]).max() > 1e-12:
            p.append("%s%s %s, Megatron %s" % (tag, name, out[name].tolist(), ref[name].tolist()))
    if (out["seq_counts"] != ref["seq_counts"]).any():
        p.append("%sseq_counts %s, Megatron %s" % (tag, out["seq_counts"].tolist(), ref["seq_counts"].tolist()))
    for kind in BALANCE_TYPES:
        got, want = float(out[kind]), ref["values"][kind]
        if rel(got, want) > LOSS_RTOL:
            p.append("%s%s %.12g, Megatron %.12g (rel %.2g)" % (tag, kind, got, want, rel(got, want)))
    if rel(float(out["z_loss"]), ref["z_loss"]) > LOSS_RTOL:
        p.append("%sz_loss %.12g, Megatron %.12g" % (tag, float(out["z_loss"]), ref["z_loss"]))
    want_obj = ref["objective"]
    if abs(float(out["objective"]) - want_obj) > LOSS_RTOL * max(abs(want_obj), 1e-12):
        p.append("%sobjective %.12g, Megatron %.12g" % (tag, float(out["objective"]), want_obj))
    dl, want = out["dlogits"].astype(np.float64), ref["dlogits"]
    scale = np.abs(want).max()
    err = np.abs(dl - want).max() / scale
    if err > GRAD_RTOL:
        n, e = np.unravel_index(np.abs(dl - want).argmax(), dl.shape)
        p.append("%sdlogits rel err %.3g (max |ref| %.3g) at (%d,%d): moetron %.9g autograd %.9g" % (
            tag, err, scale, n, e, dl[n, e], want[n, e]))
    if case.qpad:
        p += compare_aligned_plan(case, tag, out, want_kept)
    return p


def compare_aligned_plan(case, tag, out, kept_map):
    """The aligned plan against Megatron's pad_routing_map of the kept map."""
    N, E, k = case.N, case.E, case.k
    want = pad_routing_map(torch.tensor(kept_map), case.qpad_multiple()).numpy().astype(bool)
    offsets, token_of_row = out["aligned_offsets"], out["aligned_token_of_row"]
    got, p = np.zeros((N, E), dtype=int), []
    for e in range(E):
        tokens = token_of_row[offsets[e]:offsets[e + 1]]
        if (np.diff(tokens) <= 0).any():
            p.append("%sexpert %d's rows are not in token order: %s" % (tag, e, tokens.tolist()))
        got[tokens, e] += 1
    if not (got == want).all():
        diff = np.argwhere(got != want)[:4].tolist()
        p.append("%saligned rows differ from pad_routing_map at (token, expert) %s" % (tag, diff))
    if not (want.sum(0) > kept_map.sum(0)).any():
        p.append("%sthe case pads nothing (change its sizes)" % tag)
    idx, row_of_choice = out["topk_idx"], out["aligned_row_of_choice"]
    for n in range(N):
        for j in range(k):
            row, e = row_of_choice[n, j], idx[n, j]
            if kept_map[n, e] != (row >= 0) or (row >= 0 and not (offsets[e] <= row < offsets[e + 1]
                                                                 and token_of_row[row] == n)):
                p.append("%schoice (%d,%d) of expert %d has row %d" % (tag, n, j, e, row))
                return p
    return p


def f32(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def run_case(probe, tmp, case):
    rng = np.random.default_rng(1000 + 17 * case.seed + sum(map(ord, case.name)))
    N, E, k = case.N, case.E, case.k
    bias = f32(0.1 * rng.standard_normal(E)) if case.bias else None
    counts_before, batches = np.zeros(E), 0
    problems, notes = [], set()
    for mb in range(case.micro):
        for attempt in range(50):
            logits = f32(rng.standard_normal((N, E)) * 1.5 + case.skew * (1 - np.arange(E) / (E - 1)))
            R = f32(rng.standard_normal((N, E)))
            ref = megatron_reference(case, logits, bias, R, counts_before, batches)
            if not ambiguous(case, logits, bias, ref):
                break
        else:
            return ["no tie-free logits found"], notes
        tensors = {"logits": logits}
        meta = None
        if bias is not None:
            tensors["expert_bias"] = bias.astype(np.float32)
        if batches:
            tensors["global_counts_before"] = counts_before.astype(np.float64)
            if batches == 1:
                meta = {"global_batches_before": "1"}
            else:  # the scalar-tensor form
                tensors["global_batches_before"] = np.array(batches, dtype=np.int32)
        first = run_probe(probe, tmp, case.flags(), dict(tensors), meta)
        tensors["dprobs"] = np.take_along_axis(R, first["topk_idx"].astype(np.int64), axis=1).astype(np.float32)
        out = run_probe(probe, tmp, case.flags(), tensors, meta)
        for name in ("topk_idx", "topk_probs", "kept", "aux_counts"):
            if not np.array_equal(first[name], out[name]):
                problems.append("mb%d: %s differs between the runs with and without dprobs" % (mb, name))
        problems += compare(case, mb, out, ref, notes)
        counts_before = counts_before + out["aux_counts"].astype(np.float64)
        batches += 1
    return problems, notes


def probs_and_grad_problems(got_probs, got_dlogits, L, probs, R):
    """moetron's probs against the reference's (same layout), and its dlogits against the
    autograd gradient of Σ probs⊙R on the reference's float64 logits L."""
    problems = []
    diff = np.max(np.abs(got_probs - probs.detach().numpy()))
    if diff > PROBS_TOL:
        problems.append("probs max diff %.3g" % diff)
    (probs * torch.tensor(R, dtype=torch.float64)).sum().backward()
    want = L.grad.numpy()
    err = np.max(np.abs(got_dlogits - want)) / max(np.max(np.abs(want)), 1e-30)
    if err > GRAD_RTOL:
        problems.append("dlogits relative error %.3g" % err)
    return problems


# Sinkhorn routing (--moe-router-load-balancing-type sinkhorn): N, E, k
SINKHORN_CASES = [(16, 8, 1), (32, 8, 2), (64, 16, 4), (40, 4, 2)]
SINKHORN_GAP = 1e-3   # relative gap between the k-th and (k+1)-th Sinkhorn value of every row


def sinkhorn_reference(logits, k):
    """Megatron-Core's TopKRouter.sinkhorn_load_balancing in training: the picks of its
    sinkhorn() on the float32 logits, probs sigmoid (top-1) or the softmax over all experts
    at the picks; the probs' autograd graph on float64 logits."""
    L = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    norm = sinkhorn(torch.tensor(logits, dtype=torch.float32))
    _, idx = torch.topk(norm, k=k, dim=1)
    act = torch.sigmoid(L) if k == 1 else torch.softmax(L, dim=-1)
    routing_map = torch.zeros_like(L).scatter(1, idx, 1).bool()
    return L, norm.double().numpy(), routing_map, act * routing_map


def sinkhorn_gap_ok(norm, k):
    top = -np.sort(-norm, axis=1)
    if top.shape[1] <= k:
        return True
    return bool(np.all(top[:, k - 1] - top[:, k] > SINKHORN_GAP * top[:, k - 1]))


def check_sinkhorn(probe, tmp, N, E, k):
    """moetron's Sinkhorn picks, probs and router gradient against Megatron-Core's."""
    rng = np.random.default_rng(77 + N * E + k)
    for _attempt in range(200):
        logits = f32(rng.standard_normal((N, E)) * 1.5)
        L, norm, rmap, probs = sinkhorn_reference(logits, k)
        if sinkhorn_gap_ok(norm, k):
            break
    else:
        return ["no logits with clear Sinkhorn picks found"]
    R = f32(rng.standard_normal((N, E)))
    flags = ["--num-experts", str(E), "--moe-router-topk", str(k), "--seq-length", str(N),
             "--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0", "--moe-z-loss-coeff", "0"]
    first = run_probe(probe, tmp, flags, {"logits": logits})
    idx = first["topk_idx"].astype(np.int64)
    out = run_probe(probe, tmp, flags, {"logits": logits,
                                        "dprobs": np.take_along_axis(R, idx, axis=1).astype(np.float32)})
    problems = []
    if not np.array_equal(dense(idx, np.ones_like(idx, dtype=np.float64), N, E) > 0, rmap.numpy()):
        problems.append("picks differ from Megatron's Sinkhorn top-k")
    return problems + probs_and_grad_problems(dense(idx, out["topk_probs"].astype(np.float64), N, E), out["dlogits"],
                                              L, probs, R)


# Quantile balancing (--moe-router-load-balancing-type quantile_balancing): name, N, E, k, score, pre
QUANTILE_CASES = [("softmax_k2", 32, 8, 2, "softmax", False), ("softmax_pre_k1", 24, 4, 1, "softmax", True),
                  ("sigmoid_k4", 64, 16, 4, "sigmoid", False)]


def quantile_reference(logits, bias, k, score, pre):
    """Megatron-LM's quantile balancing (main branch; megatron-core 0.16.1 has none),
    written here from its definition: the picks are the top-k of l − bias (float32), a_n the
    token's (k+1)-th largest of l − bias, the quantile of expert e the (C+1)-th largest of
    l − a over the tokens (C = N·k/E); the probs are the score function's at the picks (the
    softmax over the picked logits, the pre-softmax scores, or sigmoid scores normalised over
    the k); their autograd graph on float64 logits."""
    l32, b32 = torch.tensor(logits, dtype=torch.float32), torch.tensor(bias, dtype=torch.float32)
    N, E = l32.shape
    top = (l32 - b32).topk(k + 1, dim=1)
    idx, alpha = top.indices[:, :k], top.values[:, -1:]
    quantile = (l32 - alpha).topk(N * k // E + 1, dim=0).values[-1]
    L = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    if score == "softmax" and not pre:
        probs = torch.softmax(L.gather(1, idx), dim=-1)
    elif score == "softmax":
        probs = torch.softmax(L, dim=-1).gather(1, idx)
    else:
        s = torch.sigmoid(L).gather(1, idx)
        probs = s / (s.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else s
    return L, idx.numpy(), quantile.numpy(), probs


def check_quantile(probe, tmp, N, E, k, score, pre):
    """moetron's quantile-balancing picks, quantiles, probs and router gradient."""
    rng = np.random.default_rng(91 + N * E + k)
    for _attempt in range(200):
        logits = f32(rng.standard_normal((N, E)) * 1.5)
        bias = f32(0.3 * rng.standard_normal(E))
        v = logits - bias
        top = -np.sort(-v, axis=1)
        if np.all(top[:, k - 1] - top[:, k] > TIE_GAP) and (k + 1 >= E or np.all(top[:, k] - top[:, k + 1] > TIE_GAP)):
            break
    else:
        return ["no tie-free logits found"]
    L, idx_ref, quantile_ref, probs = quantile_reference(logits, bias, k, score, pre)
    R = f32(rng.standard_normal((N, k)))
    flags = ["--num-experts", str(E), "--moe-router-topk", str(k), "--seq-length", str(N), "--micro-batch-size", "1",
             "--moe-router-score-function", score, "--moe-router-load-balancing-type", "quantile_balancing",
             "--moe-aux-loss-coeff", "0", "--moe-z-loss-coeff", "0"] + (["--moe-router-pre-softmax"] if pre else [])
    out = run_probe(probe, tmp, flags, {"logits": logits, "qb_bias": bias, "dprobs": R})
    problems = []
    if not np.array_equal(out["topk_idx"], idx_ref):
        problems.append("picks differ")
    if not np.array_equal(out["qb_quantile"], quantile_ref):
        problems.append("quantiles differ (max %.3g)" % np.max(np.abs(out["qb_quantile"] - quantile_ref)))
    return problems + probs_and_grad_problems(out["topk_probs"], out["dlogits"], L, probs, R)


def check_rejects_softmax_post_k1(probe, tmp):
    case = Case("x", E=8, N=8, k=1)
    try:
        run_probe(probe, tmp, case.flags(), {"logits": np.zeros((8, 8))})
    except RuntimeError as exc:
        return [] if "pre-softmax" in str(exc) else ["unexpected error: %s" % exc]
    return ["moetron accepted --moe-router-topk 1 with softmax after top-k"]


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2])
        return 2
    probe = os.path.abspath(sys.argv[1])
    if not os.access(probe, os.X_OK):
        print("FAIL setup: %s is not an executable (make %s)" % (probe, sys.argv[1]))
        return 1
    torch.manual_seed(0)
    cases = build_cases()
    only = {a[len("router_"):] if a.startswith("router_") else a for a in sys.argv[2:]}
    unknown = only - {c.name for c in cases} - {"reject_softmax_post_k1"} - \
        {"sinkhorn_n%d_e%d_k%d" % c for c in SINKHORN_CASES} - {"quantile_" + c[0] for c in QUANTILE_CASES}
    if unknown:
        print("FAIL setup: unknown case(s) %s" % ", ".join(sorted(unknown)))
        return 1
    failed = 0
    with tempfile.TemporaryDirectory(prefix="megatron_router_") as tmp:
        for case in cases:
            if only and case.name not in only:
                continue
            try:
                problems, notes = run_case(probe, tmp, case)
            except Exception as exc:  # noqa: BLE001 - report and go on with the next case
                problems, notes = ["%s: %s" % (type(exc).__name__, exc)], set()
            extra = (" (%s)" % "; ".join(sorted(notes))) if notes else ""
            if case.name.startswith("own_"):
                extra += " (own reference: megatron-core %s has no sqrtsoftplus)" % megatron_version()
            if problems:
                failed += 1
                print("FAIL router_%s: %s%s" % (case.name, "; ".join(problems[:4]), extra))
            else:
                print("ok router_%s%s" % (case.name, extra))
        for N, E, k in SINKHORN_CASES:
            name = "sinkhorn_n%d_e%d_k%d" % (N, E, k)
            if only and name not in only:
                continue
            try:
                problems = check_sinkhorn(probe, tmp, N, E, k)
            except Exception as exc:  # noqa: BLE001
                problems = ["%s: %s" % (type(exc).__name__, exc)]
            failed += bool(problems)
            print(("FAIL router_%s: %s" % (name, "; ".join(problems))) if problems else "ok router_%s" % name)
        for name, N, E, k, score, pre in QUANTILE_CASES:
            name = "quantile_" + name
            if only and name not in only:
                continue
            try:
                problems = check_quantile(probe, tmp, N, E, k, score, pre)
            except Exception as exc:  # noqa: BLE001
                problems = ["%s: %s" % (type(exc).__name__, exc)]
            failed += bool(problems)
            print(("FAIL router_%s: %s" % (name, "; ".join(problems))) if problems else
                  "ok router_%s (own reference: megatron-core %s has no quantile balancing)" % (name, megatron_version()))
        if not only or "reject_softmax_post_k1" in only:
            problems = check_rejects_softmax_post_k1(probe, tmp)
            failed += bool(problems)
            print(("FAIL router_reject_softmax_post_k1: %s" % problems[0]) if problems else
                  "ok router_reject_softmax_post_k1 (moetron-only rule; Megatron allows it)")
    return 1 if failed else 0


def megatron_version():
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
