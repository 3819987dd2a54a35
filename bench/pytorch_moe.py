#!/usr/bin/env python3
"""moetron's model and training step in plain PyTorch (CPU, eager): the speed reference.

usage:
  python3 bench/pytorch_moe.py [--config coarse|fine] [--threads N] [--steps S]
      [--warmup-steps W] [--dtype fp32|bf16] [overrides...]
  python3 bench/pytorch_moe.py --check-against CKPT --input IN.safetensors
      [--write-input] [--moetron-dump OUT.safetensors] [--rtol 1e-4]

Timing mode (the default) builds the model of the configuration, runs W warm-up steps and
S timed steps, each forward + backward + gradient clipping + AdamW (+ the expert-bias
update) on random tokens of the configuration's batch shape, and prints one JSON line:
  {"impl": "pytorch", "config": ..., "dtype": ..., "threads": ..., "tokens_per_s": median,
   "step_s": median, "peak_rss_mb": ..., "torch": ..., "experts_impl": ..., ...}
  python3 bench/pytorch_moe.py --config fine --threads 2 --steps 5 --warmup-steps 2

The configurations (every field can be overridden by the flag of the same name):
  coarse  hidden 512, 4 layers, 8 heads / 2 KV groups (head dim 64), 8 experts top-2,
          expert FFN 1024, vocab 8192, sequence 512, micro-batch 8, softmax router,
          aux_loss coefficient 1e-2
  fine    as coarse, but 64 experts top-8, expert FFN 256, one shared expert of 1024,
          sigmoid router with expert bias (update rate 1e-3), aux_loss coefficient 1e-2
          (--aux-coeff 0 gives pure aux-loss-free balancing)

Check mode loads a moetron checkpoint (a --save directory or one of its iter_* directories:
config.json + model.safetensors, Hugging Face tensor names) into the same model code, runs
the batch of IN.safetensors (the file `moetron forward --input` takes: input_ids [B,T],
optional labels) and prints the LM loss and every MoE layer's aux_loss. With
--moetron-dump (what `moetron forward --load CKPT --input IN --dump OUT [--grads]` wrote)
it prints both side by side and exits 1 when a loss differs by more than --rtol relative
(gradients, when the dump has them, are compared as well). --write-input first writes a
fixed batch (seed 0, the checkpoint's micro-batch x sequence, ids below its vocab-size):

  build/moetron train --num-layers 2 --hidden-size 64 --num-attention-heads 8 \
      --group-query-attention --num-query-groups 2 --num-experts 8 --moe-router-topk 2 \
      --moe-ffn-hidden-size 128 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 \
      --train-iters 1 --lr-warmup-iters 0 --eval-interval 0 --save /tmp/ck
  python3 bench/pytorch_moe.py --check-against /tmp/ck --input /tmp/in.safetensors --write-input
  build/moetron forward --load /tmp/ck --input /tmp/in.safetensors --dump /tmp/out.safetensors --grads
  python3 bench/pytorch_moe.py --check-against /tmp/ck --input /tmp/in.safetensors \
      --moetron-dump /tmp/out.safetensors

What the model computes (docs/architecture.md, docs/moe.md): token embedding (vocabulary
padded to a multiple of --make-vocab-size-divisible-by); per layer
  x += o_proj(SDPA_causal_GQA(RoPE(q), RoPE(k), v)),  q, k, v from RMSNorm(x)
       (optional per-head / per-projection QK RMSNorm before RoPE; rotate-half RoPE over
       the whole head dimension, inverse frequencies rounded to fp32 as moetron does)
  x += MoE(RMSNorm(x))
final RMSNorm, LM head (tied to the embedding unless --untie), mean cross-entropy over the
padded vocabulary. MoE: router logits x·W_rᵀ in fp32; softmax router: top-k of the logits,
probs = softmax over the k chosen logits (pre-softmax checkpoints: top-k of softmax);
sigmoid / sqrtsoftplus router: top-k of score + expert bias (bias for selection only),
probs = the chosen scores over their sum (+1e-20) when k > 1; expert e on its tokens:
down(silu(gate(x)) * up(x) * prob); plus an optional shared SwiGLU expert added unscaled
(or scaled by sigmoid(x·w_g): shared-expert gate). Router losses per MoE layer, added to
the objective: aux_loss coeff·E/(k·N²)·Σ_e c_e·Σ_n ŝ[n,e] with ŝ = softmax(logits) (softmax
router) or s/Σs, c = the counts of the top-k of ŝ (constants); optional z-loss. The
expert bias moves once per step by rate·sign(mean(c) − c), c the tokens routed to each
expert in the step (outside the optimizer). AdamW as moetron's defaults (lr 3e-3,
betas 0.9/0.999, eps 1e-8, weight decay 0.01 on every matrix, none on norms), global
gradient-norm clipping at 1.0 (moetron computes the norm every step).

Implementation choices, measured forward + backward at the benchmark shapes (4096 tokens,
H 512) with 1 thread on the 2-core AVX2 development machine, torch 2.15, while a CI run
loaded both cores (so timings are noisy; each comparison was run back to back, twice for
the experts):
- Experts: tokens are sorted by expert once (a stable argsort of the N·k choices, so the
  rows are expert-major and in token order inside an expert, as moetron's dispatcher);
  gate and up are one fused [E, 2I, H] weight. `grouped_mm` runs each projection of all
  experts as one torch.nn.functional.grouped_mm call over the contiguous slices; `loop`
  runs one F.linear per expert on its slice (the weights unbound once, so the weight
  gradient is one stack). One layer's experts: coarse 1.32 / 1.78 s grouped_mm against
  1.42 / 2.00 s loop, fine 1.75 / 1.80 s against 1.79 / 2.05 s: grouped_mm won every
  pairing by 2-12% and is the default where torch has it on CPU (--experts-impl).
- Combine: each expert row is index_add-ed onto its token (backward: one index_select):
  0.014 s (k 2) and 0.16 s (k 8), against 0.037 s / 0.23 s for going back to choice
  order through the inverse permutation and summing the k choices.
- Attention: F.scaled_dot_product_attention(is_causal=True, enable_gqa=True): it stays
  on the CPU flash kernel, 0.32 s against 0.33 s with K/V expanded by repeat_interleave.
- RoPE: x·(cos, cos) + (x2, x1)·(−sin, sin), 0.024 s against 0.032 s for the
  chunk/concatenate form; q and k rotated in one pass when there is no QK-norm.
- RMSNorm: F.rms_norm. q, k, v projections one fused matrix. AdamW fused=True (its CPU
  kernel), clip_grad_norm_ foreach. Profile of a fine step: GEMMs ~70% of the time.
- bf16 (--dtype bf16): fp32 master parameters, gradients and AdamW moments; forward and
  backward under torch.autocast("cpu", dtype=torch.bfloat16) (linears, attention and
  grouped_mm in bf16: grouped_mm is not autocast-aware, so its operands are cast
  explicitly); the router logits, routing, losses and RMSNorm statistics stay fp32. On
  CPUs without native bf16 (AVX2 only, like the development machine) it is several
  times slower than fp32; it is meant for CPUs with AVX512-BF16 or AMX.
- No custom kernels, no torch.compile unless --compile (which compiles the attention
  blocks and the LM-head loss; the MoE with its data-dependent shapes stays eager;
  compilation happens in the warm-up steps, so keep --warmup-steps >= 1).
- peak_rss_mb is the process's ru_maxrss, torch's own libraries included
  (rss_after_import_mb, about 530 MiB for this CUDA build of torch, reports those).
"""
import argparse
import dataclasses
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

RSS_AFTER_IMPORT_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # torch's libraries alone

# ---- configurations ------------------------------------------------------------------------

CONFIGS = {
    "coarse": dict(layers=4, hidden=512, heads=8, kv_heads=2, experts=8, topk=2, expert_ffn=1024, shared_ffn=0,
                   vocab=8192, seq_length=512, micro_batch_size=8, router="softmax", expert_bias=False,
                   aux_coeff=1e-2),
    "fine": dict(layers=4, hidden=512, heads=8, kv_heads=2, experts=64, topk=8, expert_ffn=256, shared_ffn=1024,
                 vocab=8192, seq_length=512, micro_batch_size=8, router="sigmoid", expert_bias=True,
                 aux_coeff=1e-2),
}

HAVE_GROUPED_MM = hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")
_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
# the measured default (module docstring); loop where torch has no CPU grouped_mm
DEFAULT_EXPERTS_IMPL = "grouped_mm" if HAVE_GROUPED_MM else "loop"
NORMALIZE_EPS = 1e-20  # Megatron's (and moetron's) epsilon of the sigmoid normalisations


@dataclasses.dataclass
class ModelConfig:
    padded_vocab: int = 8192     # rows of the embedding and the LM head
    hidden: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    max_positions: int = 512
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    qk_norm: str = "none"        # none | head (one RMSNorm per head) | projection (over all heads)
    tie_embeddings: bool = True
    moe_layers: tuple = ()       # per layer: True = MoE, False = dense SwiGLU of width dense_ffn
    dense_ffn: int = 2048
    experts: int = 8
    topk: int = 2
    expert_ffn: int = 1024
    shared_ffn: int = 0
    shared_gate: bool = False
    router: str = "softmax"      # softmax | sigmoid | sqrtsoftplus
    pre_softmax: bool = False
    topk_scaling: float = 1.0
    expert_bias: bool = False
    bias_update_rate: float = 1e-3
    aux_coeff: float = 1e-2      # aux_loss
    seq_aux_coeff: float = 0.0   # seq_aux_loss
    global_aux_coeff: float = 0.0  # global_aux_loss (equal to aux_loss for one micro-batch per step)
    z_loss_coeff: float = 0.0
    init_std: float = 0.02
    experts_impl: str = DEFAULT_EXPERTS_IMPL


# ---- building blocks -----------------------------------------------------------------------

def rope_tables(c):
    """(cos, cos) and (−sin, sin), each (max_positions, head_dim), from the angles of moetron's
    rope_table: pos·inv_freq with inv_freq = base^(−2i/d) rounded to fp32 first."""
    d = c.head_dim
    inv_freq = (1.0 / (c.rope_base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))).float()
    angle = torch.arange(c.max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x (B, T, heads, d), pairs (i, i + d/2):
    (x1, x2) -> (x1·cos − x2·sin, x2·cos + x1·sin) = x·(cos, cos) + (x2, x1)·(−sin, sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[None, :, None, :].to(x.dtype) + torch.cat((x2, x1), dim=-1) * sin[None, :, None, :].to(x.dtype)


def swiglu(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Attention(nn.Module):
    """x + o_proj(attention(RoPE(qknorm(q, k)), v)), q, k, v from RMSNorm(x)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        H, d = c.hidden, c.head_dim
        self.norm = nn.Parameter(torch.ones(H))
        self.qkv = nn.Parameter(torch.empty((c.heads + 2 * c.kv_heads) * d, H))  # q, k, v rows stacked
        if c.qk_norm != "none":
            self.q_norm = nn.Parameter(torch.ones(d if c.qk_norm == "head" else c.heads * d))
            self.k_norm = nn.Parameter(torch.ones(d if c.qk_norm == "head" else c.kv_heads * d))
        self.o_proj = nn.Parameter(torch.empty(H, c.heads * d))

    def _qk_norm(self, x, w):
        c = self.c
        if c.qk_norm == "head":
            return F.rms_norm(x, (c.head_dim,), w, c.norm_eps)
        B, T, n, d = x.shape
        return F.rms_norm(x.reshape(B, T, n * d), (n * d,), w, c.norm_eps).view(B, T, n, d)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, H = x.shape
        hq, hk = c.heads, c.kv_heads
        h = F.rms_norm(x, (H,), self.norm, c.norm_eps)
        qkv = F.linear(h, self.qkv).view(B, T, hq + 2 * hk, c.head_dim)
        cos, sin = cos[:T], sin[:T]
        if c.qk_norm == "none":  # q and k rotated in one pass
            q, k = apply_rope(qkv[:, :, :hq + hk], cos, sin).split([hq, hk], dim=2)
        else:
            q = apply_rope(self._qk_norm(qkv[:, :, :hq], self.q_norm), cos, sin)
            k = apply_rope(self._qk_norm(qkv[:, :, hq:hq + hk], self.k_norm), cos, sin)
        v = qkv[:, :, hq + hk:]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hk != hq)
        out = out.transpose(1, 2).reshape(B, T, hq * c.head_dim)
        return x + F.linear(out, self.o_proj)


class DenseFFN(nn.Module):
    """x + SwiGLU(RMSNorm(x)) for layers that are not MoE."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.norm = nn.Parameter(torch.ones(c.hidden))
        self.gate_up = nn.Parameter(torch.empty(2 * c.dense_ffn, c.hidden))
        self.down = nn.Parameter(torch.empty(c.hidden, c.dense_ffn))

    def forward(self, x, record):
        h = F.rms_norm(x, (self.c.hidden,), self.norm, self.c.norm_eps)
        return x + F.linear(swiglu(F.linear(h, self.gate_up)), self.down), None


class MoE(nn.Module):
    """x + MoE(RMSNorm(x)): router, dispatch (sort by expert), experts, combine, shared expert."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        E, H, I = c.experts, c.hidden, c.expert_ffn
        self.norm = nn.Parameter(torch.ones(H))
        self.router = nn.Parameter(torch.empty(E, H))
        self.gate_up = nn.Parameter(torch.empty(E, 2 * I, H))  # rows: gate then up (transformers' fused layout)
        self.down = nn.Parameter(torch.empty(E, H, I))
        if c.expert_bias:  # not a parameter: moved by the bias update, never by the optimizer
            self.register_buffer("expert_bias", torch.zeros(E))
            self.register_buffer("bias_counts", torch.zeros(E, dtype=torch.float64))
        if c.shared_ffn:
            self.shared_gate_up = nn.Parameter(torch.empty(2 * c.shared_ffn, H))
            self.shared_down = nn.Parameter(torch.empty(H, c.shared_ffn))
            if c.shared_gate:
                self.shared_expert_gate = nn.Parameter(torch.empty(1, H))

    # -- router ---------------------------------------------------------------------------------
    def route(self, h, seq_length):
        """h (N, H) -> expert ids (N, k), probs (N, k), router objective, stats (detached)."""
        c = self.c
        E, k = c.experts, c.topk
        with torch.autocast("cpu", enabled=False):  # the router stays fp32
            logits = F.linear(h.float(), self.router)  # (N, E)
        if c.router == "softmax":
            aux_scores = logits.softmax(dim=-1)
            if c.pre_softmax:
                probs, idx = aux_scores.topk(k, dim=-1)
            else:  # top-k of the logits, softmax over the k chosen
                top, idx = logits.topk(k, dim=-1)
                probs = top.softmax(dim=-1)
            aux_idx = idx
        else:
            scores = torch.sigmoid(logits) if c.router == "sigmoid" else torch.sqrt(F.softplus(logits))
            if c.expert_bias:  # the bias steers the selection only
                with torch.no_grad():
                    idx = (scores + self.expert_bias).topk(k, dim=-1).indices
                    aux_idx = scores.topk(k, dim=-1).indices
                probs = scores.gather(1, idx)
            else:
                probs, idx = scores.topk(k, dim=-1)
                aux_idx = idx
            if k > 1:
                probs = probs / (probs.sum(dim=-1, keepdim=True) + NORMALIZE_EPS)
            aux_scores = scores / (scores.sum(dim=-1, keepdim=True) + NORMALIZE_EPS)
        if c.topk_scaling != 1.0:
            probs = probs * c.topk_scaling

        # load-balancing losses (counts of the top-k of ŝ are constants) and z-loss
        N = logits.shape[0]
        objective = logits.new_zeros(())
        stats = {}
        counts = torch.bincount(aux_idx.reshape(-1), minlength=E).to(logits.dtype)
        aux = E / (k * N * N) * (aux_scores.sum(dim=0) * counts).sum()
        stats["aux_loss"] = aux.detach()
        if c.aux_coeff or c.global_aux_coeff:  # global_aux_loss: equal to aux_loss in one forward
            objective = objective + (c.aux_coeff + c.global_aux_coeff) * aux
        if c.seq_aux_coeff:
            S = seq_length
            b = N // S
            seq_counts = torch.zeros(b, E, dtype=logits.dtype).scatter_add_(
                1, aux_idx.reshape(b, S * k), torch.ones(b, S * k, dtype=logits.dtype))
            seq_aux = E / (k * S * S) * (aux_scores.view(b, S, E).sum(dim=1) * seq_counts).sum() / b
            stats["seq_aux_loss"] = seq_aux.detach()
            objective = objective + c.seq_aux_coeff * seq_aux
        if c.z_loss_coeff:
            z = torch.logsumexp(logits, dim=-1).square().mean()
            stats["z_loss"] = z.detach()
            objective = objective + c.z_loss_coeff * z
        return idx, probs, objective, stats

    # -- experts ---------------------------------------------------------------------------------
    def experts_grouped_mm(self, rows, row_probs, counts):
        offs = counts.cumsum(0).to(torch.int32)
        w_gate_up, w_down = self.gate_up, self.down
        if torch.is_autocast_enabled("cpu"):  # grouped_mm is not autocast-aware
            dt = torch.get_autocast_dtype("cpu")
            rows, w_gate_up, w_down = rows.to(dt), w_gate_up.to(dt), w_down.to(dt)
        act = swiglu(_grouped_mm(rows, w_gate_up.transpose(1, 2), offs=offs)) * row_probs[:, None]
        return _grouped_mm(act.to(w_down.dtype), w_down.transpose(1, 2), offs=offs)

    def experts_loop(self, rows, row_probs, counts):
        sizes = counts.tolist()
        used = [e for e, n in enumerate(sizes) if n]
        # unbind once: one backward node stacks the per-expert weight gradients
        w_gate_up, w_down = self.gate_up.unbind(0), self.down.unbind(0)
        gate_up = torch.cat([F.linear(x, w_gate_up[e]) for e, x in zip(used, rows.split([sizes[e] for e in used]))])
        act = swiglu(gate_up) * row_probs[:, None]
        return torch.cat([F.linear(a, w_down[e]) for e, a in zip(used, act.split([sizes[e] for e in used]))])

    def forward(self, x, record):
        c = self.c
        B, T, H = x.shape
        N, k = B * T, c.topk
        h = F.rms_norm(x, (H,), self.norm, c.norm_eps).view(N, H)
        idx, probs, objective, stats = self.route(h, T)

        # dispatch: choices n·k + j sorted by expert (stable: token order inside an expert)
        with torch.no_grad():
            flat = idx.reshape(-1)
            order = flat.argsort(stable=True)
            token_of_row = order // k
            counts = torch.bincount(flat, minlength=c.experts)
            if record and c.expert_bias:
                self.bias_counts += counts
        rows = h.index_select(0, token_of_row)                    # (N·k, H)
        row_probs = probs.reshape(-1).index_select(0, order)      # (N·k)
        if c.experts_impl == "grouped_mm":
            rows_out = self.experts_grouped_mm(rows, row_probs, counts)
        else:
            rows_out = self.experts_loop(rows, row_probs, counts)
        # combine: every row added onto its token (the probs are already inside the rows);
        # in fp32 also under bf16 autocast, so that the k choices do not sum in bf16
        y = torch.zeros(N, H, dtype=torch.float32).index_add(0, token_of_row, rows_out.float())

        if c.shared_ffn:
            shared = F.linear(swiglu(F.linear(h, self.shared_gate_up)), self.shared_down)
            if c.shared_gate:
                shared = shared * torch.sigmoid(F.linear(h, self.shared_expert_gate))
            y = y + shared
        stats["tokens_per_expert"] = counts
        return x + y.view(B, T, H).to(x.dtype), (objective, stats)


class Block(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.attn = Attention(c)
        self.ffn = MoE(c) if moe else DenseFFN(c)

    def forward(self, x, cos, sin, record):
        return self.ffn(self.attn(x, cos, sin), record)


def lm_head_loss(x, norm, weight, targets, eps):
    """final RMSNorm, logits over the padded vocabulary, mean cross-entropy (label < 0: no loss)."""
    h = F.rms_norm(x, (x.shape[-1],), norm, eps)
    logits = F.linear(h, weight).float()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


class MoeLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        if not c.moe_layers:
            c.moe_layers = (True,) * c.layers
        self.embed = nn.Parameter(torch.empty(c.padded_vocab, c.hidden))
        self.layers = nn.ModuleList(Block(c, c.moe_layers[l]) for l in range(c.layers))
        self.final_norm = nn.Parameter(torch.ones(c.hidden))
        if not c.tie_embeddings:
            self.lm_head = nn.Parameter(torch.empty(c.padded_vocab, c.hidden))
        cos, sin = rope_tables(c)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.head_loss = lm_head_loss

    def head_weight(self):
        return self.embed if self.c.tie_embeddings else self.lm_head

    @torch.no_grad()
    def init_weights(self, seed):
        """normal(0, std) matrices, std/sqrt(2L) for output projections, ones for norms."""
        c = self.c
        g = torch.Generator().manual_seed(seed)
        out_std = c.init_std / math.sqrt(2 * c.layers)
        for name, p in self.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
                continue
            out = name.endswith(("o_proj", "down"))  # o_proj, expert / shared / dense down
            p.normal_(0.0, out_std if out else c.init_std, generator=g)

    def forward(self, tokens, targets, record=False):
        """tokens, targets (B, T) -> lm_loss, router objective (Σ over MoE layers), per-layer stats."""
        x = F.embedding(tokens, self.embed)
        objective = x.new_zeros((), dtype=torch.float32)
        stats = []
        for layer in self.layers:
            x, moe = layer(x, self.rope_cos, self.rope_sin, record)
            if moe is not None:
                objective = objective + moe[0]
                stats.append(moe[1])
        lm_loss = self.head_loss(x, self.final_norm, self.head_weight(), targets, self.c.norm_eps)
        return lm_loss, objective, stats

    @torch.no_grad()
    def update_expert_bias(self):
        """bias += rate·sign(mean(c) − c) per MoE layer, c the step's routed tokens per expert."""
        for layer in self.layers:
            ffn = layer.ffn
            if isinstance(ffn, MoE) and self.c.expert_bias:
                counts = ffn.bias_counts
                ffn.expert_bias += (self.c.bias_update_rate * torch.sign(counts.mean() - counts)).float()
                counts.zero_()


def make_optimizer(model, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
    """AdamW, decay on every matrix (embedding, router, experts, LM head), none on norms."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True), "fused"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=True), "foreach"


# ---- timing ----------------------------------------------------------------------------------

def timing_config(a):
    base = dict(CONFIGS[a.config])
    for key in base:
        value = getattr(a, key, None)
        if value is not None:
            base[key] = value
    if base["hidden"] % base["heads"] or base["heads"] % base["kv_heads"]:
        sys.exit("pytorch_moe: heads must divide hidden and kv-heads must divide heads")
    m = a.make_vocab_size_divisible_by
    c = ModelConfig(
        padded_vocab=(base["vocab"] + m - 1) // m * m, hidden=base["hidden"], layers=base["layers"],
        heads=base["heads"], kv_heads=base["kv_heads"], head_dim=base["hidden"] // base["heads"],
        max_positions=base["seq_length"], qk_norm=a.qk_norm, tie_embeddings=not a.untie,
        experts=base["experts"], topk=base["topk"], expert_ffn=base["expert_ffn"], shared_ffn=base["shared_ffn"],
        router=base["router"], expert_bias=base["expert_bias"], bias_update_rate=a.bias_update_rate,
        aux_coeff=base["aux_coeff"], experts_impl=a.experts_impl or DEFAULT_EXPERTS_IMPL)
    if c.expert_bias and c.router == "softmax":
        sys.exit("pytorch_moe: the expert bias needs --router sigmoid or sqrtsoftplus (as in moetron)")
    if c.router == "softmax" and c.topk == 1:
        c.pre_softmax = True  # moetron requires --moe-router-pre-softmax for softmax top-1
    return c, base


def run_timing(a):
    c, base = timing_config(a)
    torch.manual_seed(a.seed)
    model = MoeLM(c)
    model.init_weights(a.seed)
    model.train()
    if a.compile:
        for layer in model.layers:
            layer.attn = torch.compile(layer.attn, dynamic=False)
        model.head_loss = torch.compile(lm_head_loss, dynamic=False)
    opt, opt_impl = make_optimizer(model, a.lr, a.weight_decay)
    params = [p for p in model.parameters()]
    B, T, M, V = base["micro_batch_size"], base["seq_length"], a.micro_batches, base["vocab"]
    gen = torch.Generator().manual_seed(a.seed + 1)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step(batches):
        for seq in batches:  # M micro-batches, gradients accumulated, objective mean over them
            with autocast:
                lm_loss, objective, _ = model(seq[:, :-1], seq[:, 1:], record=True)
            ((lm_loss + objective) / M).backward()
        torch.nn.utils.clip_grad_norm_(params, a.clip_grad if a.clip_grad > 0 else float("inf"), foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.update_expert_bias()
        return lm_loss.item()

    times, loss = [], float("nan")
    for i in range(a.warmup_steps + a.steps):
        batches = [torch.randint(0, V, (B, T + 1), generator=gen) for _ in range(M)]
        t0 = time.perf_counter()
        loss = step(batches)
        dt = time.perf_counter() - t0
        if not math.isfinite(loss):
            sys.exit(f"pytorch_moe: non-finite loss {loss} at step {i + 1}")
        if a.verbose:
            print(f"step {i + 1}: {dt:.3f} s, lm loss {loss:.4f}", file=sys.stderr)
        if i >= a.warmup_steps:
            times.append(dt)
    step_s = statistics.median(times)
    result = {
        "impl": "pytorch", "config": a.config, "dtype": a.dtype, "threads": torch.get_num_threads(),
        "tokens_per_s": round(M * B * T / step_s, 1), "step_s": round(step_s, 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_after_import_mb": round(RSS_AFTER_IMPORT_MB, 1),
        "torch": torch.__version__, "experts_impl": c.experts_impl,
        "attention": "sdpa_gqa" if c.kv_heads != c.heads else "sdpa", "optimizer": f"adamw-{opt_impl}",
        "compile": a.compile, "steps": a.steps, "warmup_steps": a.warmup_steps, "tokens_per_step": M * B * T,
        "shape": {k: base[k] for k in ("layers", "hidden", "heads", "kv_heads", "experts", "topk", "expert_ffn",
                                       "shared_ffn", "vocab", "seq_length", "micro_batch_size", "router",
                                       "expert_bias", "aux_coeff")} | {"micro_batches": M},
        "last_lm_loss": round(loss, 5),
    }
    print(json.dumps(result))


# ---- check against a moetron checkpoint --------------------------------------------------------

def resolve_checkpoint(path):
    latest = os.path.join(path, "latest_checkpointed_iteration.txt")
    if os.path.exists(latest):
        with open(latest) as f:
            path = os.path.join(path, f"iter_{int(f.read().strip()):07d}")
    if not os.path.exists(os.path.join(path, "config.json")):
        sys.exit(f"pytorch_moe: {path} has no config.json (give a --save directory or an iter_* directory)")
    return path


def load_weights(path):
    from safetensors.torch import load_file
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return load_file(single)
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    weights = {}
    for shard in shards:
        weights.update(load_file(os.path.join(path, shard)))
    return weights


def _balance_coeffs(types, coeffs):
    out = {"aux_loss": 0.0, "seq_aux_loss": 0.0, "global_aux_loss": 0.0}
    for t, v in zip(str(types).split(","), str(coeffs).split(",")):
        if t in out:
            out[t] = float(v)
    return out


def config_from_checkpoint(cfg, weights, experts_impl):
    """ModelConfig of a moetron checkpoint (its moetron.flags), or of a plain HF directory."""
    family = cfg.get("model_type")
    if family not in ("mixtral", "qwen3_moe", "olmoe", "moetron_moe"):
        sys.exit(f"pytorch_moe: model_type {family} is not supported (mixtral, qwen3_moe, olmoe, moetron_moe)")
    L = cfg["num_hidden_layers"]
    router = "block_sparse_moe.gate" if family == "mixtral" else "mlp.gate"
    moe_layers = tuple(f"model.layers.{l}.{router}.weight" in weights for l in range(L))
    padded_vocab, H = weights["model.embed_tokens.weight"].shape
    f = cfg.get("moetron", {}).get("flags")
    if f is not None:
        unsupported = [("rotary-interleaved", f.get("rotary-interleaved")), ("clip-qkv", f.get("clip-qkv", 0) > 0),
                       ("multi-latent-attention", f.get("multi-latent-attention")),
                       ("moe-router-num-groups", f.get("moe-router-num-groups", 0) > 0),
                       ("moe-expert-capacity-factor", f.get("moe-expert-capacity-factor", 0) > 0),
                       ("moe-router-force-load-balancing", f.get("moe-router-force-load-balancing"))]
        bad = [name for name, on in unsupported if on]
        if bad:
            sys.exit(f"pytorch_moe: the checkpoint uses --{', --'.join(bad)}, which this reference does not model")
        heads = f["num-attention-heads"]
        coeff = _balance_coeffs(f["moe-router-load-balancing-type"], f["moe-aux-loss-coeff"])
        return ModelConfig(
            padded_vocab=padded_vocab, hidden=H, layers=L, heads=heads,
            kv_heads=f["num-query-groups"] if f["group-query-attention"] else heads,
            head_dim=f["kv-channels"] or H // heads,
            max_positions=f["max-position-embeddings"] or f["seq-length"], norm_eps=f["norm-epsilon"],
            rope_base=f["rotary-base"],
            qk_norm=("projection" if f["qk-layernorm-scope"] == "projection" else "head") if f["qk-layernorm"]
            else "none",
            tie_embeddings=not f["untie-embeddings-and-output-weights"], moe_layers=moe_layers,
            dense_ffn=f["ffn-hidden-size"] or 4 * H, experts=f["num-experts"], topk=f["moe-router-topk"],
            expert_ffn=f["moe-ffn-hidden-size"] or f["ffn-hidden-size"] or 4 * H,
            shared_ffn=f["moe-shared-expert-intermediate-size"], shared_gate=f["moe-shared-expert-gate"],
            router=f["moe-router-score-function"], pre_softmax=f["moe-router-pre-softmax"],
            topk_scaling=f["moe-router-topk-scaling-factor"] or 1.0,
            expert_bias=f["moe-router-enable-expert-bias"], bias_update_rate=f["moe-router-bias-update-rate"],
            aux_coeff=coeff["aux_loss"], seq_aux_coeff=coeff["seq_aux_loss"],
            global_aux_coeff=coeff["global_aux_loss"], z_loss_coeff=f["moe-z-loss-coeff"],
            experts_impl=experts_impl)
    if family == "moetron_moe":
        sys.exit("pytorch_moe: a moetron_moe config.json without its moetron section")
    heads = cfg["num_attention_heads"]
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    return ModelConfig(
        padded_vocab=padded_vocab, hidden=H, layers=L, heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or H // heads, max_positions=cfg["max_position_embeddings"],
        norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_base=cfg.get("rope_theta", 10000.0),
        qk_norm={"qwen3_moe": "head", "olmoe": "projection"}.get(family, "none"),
        tie_embeddings=cfg.get("tie_word_embeddings", False), moe_layers=moe_layers,
        dense_ffn=cfg.get("intermediate_size", 4 * H), experts=E, topk=cfg["num_experts_per_tok"],
        expert_ffn=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],  # Mixtral, OLMoE: the latter
        pre_softmax=family != "mixtral" and not cfg.get("norm_topk_prob", False),
        aux_coeff=cfg.get("router_aux_loss_coef", 0.001), experts_impl=experts_impl)


def hf_slices(model, family):
    """Hugging Face tensor name -> (parameter or buffer, index into it) of every weight."""
    c = model.c
    out = {"model.embed_tokens.weight": (model.embed, ()), "model.norm.weight": (model.final_norm, ())}
    if not c.tie_embeddings:
        out["lm_head.weight"] = (model.lm_head, ())
    qw, kw = c.heads * c.head_dim, c.kv_heads * c.head_dim
    mixtral = family == "mixtral"
    for l, layer in enumerate(model.layers):
        p = f"model.layers.{l}."
        a = layer.attn
        out[p + "input_layernorm.weight"] = (a.norm, ())
        out[p + "self_attn.q_proj.weight"] = (a.qkv, (slice(0, qw),))
        out[p + "self_attn.k_proj.weight"] = (a.qkv, (slice(qw, qw + kw),))
        out[p + "self_attn.v_proj.weight"] = (a.qkv, (slice(qw + kw, qw + 2 * kw),))
        if c.qk_norm != "none":
            out[p + "self_attn.q_norm.weight"] = (a.q_norm, ())
            out[p + "self_attn.k_norm.weight"] = (a.k_norm, ())
        out[p + "self_attn.o_proj.weight"] = (a.o_proj, ())
        ffn = layer.ffn
        out[p + "post_attention_layernorm.weight"] = (ffn.norm, ())
        if isinstance(ffn, DenseFFN):
            width = c.dense_ffn
            out[p + "mlp.gate_proj.weight"] = (ffn.gate_up, (slice(0, width),))
            out[p + "mlp.up_proj.weight"] = (ffn.gate_up, (slice(width, 2 * width),))
            out[p + "mlp.down_proj.weight"] = (ffn.down, ())
            continue
        moe = "block_sparse_moe" if mixtral else "mlp"
        out[p + f"{moe}.gate.weight"] = (ffn.router, ())
        I = c.expert_ffn
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for e in range(c.experts):
            q = p + f"{moe}.experts.{e}."
            out[q + f"{names[0]}.weight"] = (ffn.gate_up, (e, slice(0, I)))
            out[q + f"{names[1]}.weight"] = (ffn.gate_up, (e, slice(I, 2 * I)))
            out[q + f"{names[2]}.weight"] = (ffn.down, (e,))
        if c.expert_bias:
            out[p + "mlp.gate.e_score_correction_bias"] = (ffn.expert_bias, ())
        if c.shared_ffn:
            S = c.shared_ffn
            out[p + "mlp.shared_experts.gate_proj.weight"] = (ffn.shared_gate_up, (slice(0, S),))
            out[p + "mlp.shared_experts.up_proj.weight"] = (ffn.shared_gate_up, (slice(S, 2 * S),))
            out[p + "mlp.shared_experts.down_proj.weight"] = (ffn.shared_down, ())
            if c.shared_gate:
                out[p + "mlp.shared_expert_gate.weight"] = (ffn.shared_expert_gate, ())
    return out


def write_check_input(path, cfg, seed=0):
    import numpy as np
    from safetensors.numpy import save_file
    f = cfg.get("moetron", {}).get("flags", {})
    B, T = f.get("micro-batch-size", 2), f.get("seq-length", 32)
    vocab = f.get("vocab-size", cfg["vocab_size"])
    ids = np.random.default_rng(seed).integers(0, vocab, size=(B, T)).astype(np.int32)
    save_file({"input_ids": ids}, path)
    print(f"wrote {path}: input_ids [{B}, {T}] in [0, {vocab}), seed {seed}")


def read_check_input(path):
    """input_ids [B,T] and targets as moetron forward builds them (negative label: no loss)."""
    from safetensors.torch import load_file
    t = load_file(path)
    ids = t["input_ids"].long()
    if "labels" in t:
        targets = t["labels"].long()
    else:  # next-token targets; the last position of each row has none
        targets = torch.full_like(ids, -100)
        targets[:, :-1] = ids[:, 1:]
    return ids, targets.masked_fill(targets < 0, -100)


def run_check(a):
    path = resolve_checkpoint(a.check_against)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if a.write_input:
        write_check_input(a.input, cfg)
    if not a.input:
        sys.exit("pytorch_moe: --check-against needs --input IN.safetensors (the batch of `moetron forward`)")
    weights = {k: v.float() for k, v in load_weights(path).items()}
    c = config_from_checkpoint(cfg, weights, a.experts_impl or DEFAULT_EXPERTS_IMPL)
    model = MoeLM(c)
    slices = hf_slices(model, cfg["model_type"])
    missing, unexpected = sorted(set(slices) - set(weights)), sorted(set(weights) - set(slices))
    if missing or unexpected:
        sys.exit(f"pytorch_moe: checkpoint names do not match the model: missing {missing[:5]}, "
                 f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, (tensor, index) in slices.items():
            view = tensor[index]
            if view.shape != weights[name].shape:
                sys.exit(f"pytorch_moe: {name} has shape {tuple(weights[name].shape)}, expected {tuple(view.shape)}")
            view.copy_(weights[name])
    model.eval()  # no routing counts recorded; moetron forward applies no jitter either
    ids, targets = read_check_input(a.input)
    lm_loss, objective, stats = model(ids, targets)
    moe_layers = [l for l in range(c.layers) if c.moe_layers[l]]
    ours = {"loss": lm_loss.item()}
    for l, s in zip(moe_layers, stats):
        for key in ("aux_loss", "seq_aux_loss", "z_loss"):
            if key in s:
                ours[f"layers.{l}.{key}"] = s[key].item()
    result = {"checkpoint": path, "input": a.input, "lm_loss": ours["loss"],
              "aux_loss": [ours[f"layers.{l}.aux_loss"] for l in moe_layers],
              "objective": (lm_loss + objective).item()}
    print(f"pytorch: lm loss {ours['loss']:.7f}, aux_loss per MoE layer "
          + ", ".join(f"{v:.7f}" for v in result["aux_loss"]))
    if a.moetron_dump:
        from safetensors.torch import load_file
        dump = load_file(a.moetron_dump)
        dump_moe = sorted(int(k.split(".")[1]) for k in dump if k.endswith(".router_logits"))
        if tuple(dump["logits"].shape) != (*ids.shape, c.padded_vocab) or dump_moe != moe_layers:
            sys.exit(f"pytorch_moe: {a.moetron_dump} is not this checkpoint's forward of {a.input} (logits "
                     f"{tuple(dump['logits'].shape)}, MoE layers {dump_moe}; expected "
                     f"{(*ids.shape, c.padded_vocab)}, {moe_layers})")
        worst = 0.0
        print(f"{'value':<28} {'moetron':>14} {'pytorch':>14} {'rel. diff':>10}")
        for key, value in ours.items():
            if key not in dump:
                continue
            ref = dump[key].item()
            rel = abs(value - ref) / max(abs(ref), 1e-30)
            worst = max(worst, rel)
            print(f"{key:<28} {ref:14.7f} {value:14.7f} {rel:10.2e}")
        same_routing = [l for l, s in zip(moe_layers, stats)
                        if torch.equal(s["tokens_per_expert"].to(torch.int32), dump[f"layers.{l}.tokens_per_expert"])]
        print(f"tokens_per_expert identical in {len(same_routing)} of {len(moe_layers)} MoE layers")
        result.update(moetron_lm_loss=dump["loss"].item(), worst_loss_rel_diff=worst, ok=worst <= a.rtol,
                      same_tokens_per_expert_layers=len(same_routing))
        grads = [k for k in dump if k.startswith("grad.")]
        if grads:  # gradient of lm_loss + Σ coeff·A (moetron forward --grads)
            (lm_loss + objective).backward()
            grad_worst = 0.0
            unknown = [g for g in grads if g[len("grad."):] not in slices]
            if unknown:
                sys.exit(f"pytorch_moe: the dump's gradients name tensors this checkpoint lacks: {unknown[:3]}")
            for g in grads:
                tensor, index = slices[g[len("grad."):]]
                mine = tensor.grad[index] if tensor.grad is not None else torch.zeros_like(tensor[index])
                scale = dump[g].abs().max().item()
                if scale > 0:
                    grad_worst = max(grad_worst, (mine - dump[g]).abs().max().item() / scale)
            print(f"gradients: {len(grads)} tensors, worst max|diff|/max|moetron| {grad_worst:.2e}")
            result.update(worst_grad_rel_diff=grad_worst, ok=result["ok"] and grad_worst <= a.grad_rtol)
        print(f"{'OK' if result['ok'] else 'MISMATCH'}: worst loss difference {worst:.2e} relative "
              f"(tolerance {a.rtol:g})")
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


# ---- command line --------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description="moetron's MoE model and training step in plain PyTorch (CPU, eager)",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="coarse", help="benchmark configuration [coarse]")
    shape = p.add_argument_group("configuration overrides (default: the --config value)")
    shape.add_argument("--layers", type=int)
    shape.add_argument("--hidden", type=int)
    shape.add_argument("--heads", type=int)
    shape.add_argument("--kv-heads", type=int, help="key/value heads (query groups)")
    shape.add_argument("--experts", type=int)
    shape.add_argument("--topk", type=int)
    shape.add_argument("--expert-ffn", type=int, help="width of each routed expert")
    shape.add_argument("--shared-ffn", type=int, help="width of the shared expert (0 = none)")
    shape.add_argument("--seq-length", type=int)
    shape.add_argument("--micro-batch-size", type=int)
    shape.add_argument("--vocab", type=int, help="vocabulary before padding")
    shape.add_argument("--router", choices=("softmax", "sigmoid", "sqrtsoftplus"))
    shape.add_argument("--expert-bias", action=argparse.BooleanOptionalAction, default=None,
                       help="aux-loss-free balancing bias (sigmoid/sqrtsoftplus routers)")
    shape.add_argument("--aux-coeff", type=float, help="aux_loss coefficient (0 = off)")
    other = p.add_argument_group("model and step")
    other.add_argument("--qk-norm", choices=("none", "head", "projection"), default="none", help="QK RMSNorm [none]")
    other.add_argument("--untie", action="store_true", help="separate LM head instead of the embedding")
    other.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    other.add_argument("--bias-update-rate", type=float, default=1e-3)
    other.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step [1]")
    other.add_argument("--lr", type=float, default=3e-3)
    other.add_argument("--weight-decay", type=float, default=0.01)
    other.add_argument("--clip-grad", type=float, default=1.0, help="global gradient-norm clip (0 = off) [1.0]")
    other.add_argument("--experts-impl", choices=("grouped_mm", "loop"),
                       help=f"routed experts as one grouped_mm per projection or one linear per expert "
                            f"[{DEFAULT_EXPERTS_IMPL}]")
    other.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                       help="bf16: fp32 master weights, autocast bf16 compute [fp32]")
    other.add_argument("--compile", action="store_true", help="torch.compile the attention blocks and the LM head")
    run = p.add_argument_group("run")
    run.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads [all cores]")
    run.add_argument("--steps", type=int, default=5, help="timed steps [5]")
    run.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first [2]")
    run.add_argument("--seed", type=int, default=1234)
    run.add_argument("--verbose", action="store_true", help="per-step times on stderr")
    chk = p.add_argument_group("check against moetron")
    chk.add_argument("--check-against", metavar="CKPT_DIR", help="load this moetron checkpoint and print its losses")
    chk.add_argument("--input", metavar="IN.safetensors", help="the batch (input_ids [B,T], optional labels)")
    chk.add_argument("--write-input", action="store_true", help="first write a fixed batch to --input")
    chk.add_argument("--moetron-dump", metavar="OUT.safetensors", help="`moetron forward` dump to compare with")
    chk.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance on the losses [1e-4]")
    chk.add_argument("--grad-rtol", type=float, default=1e-3,
                     help="tolerance on max|diff|/max|moetron| per gradient tensor [1e-3]")
    a = p.parse_args()
    for name in ("threads", "steps", "micro_batches"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup_steps < 0:
        p.error("--warmup-steps must be >= 0")
    if a.experts_impl == "grouped_mm" and not HAVE_GROUPED_MM:
        p.error("this torch has no grouped_mm; use --experts-impl loop")
    return a


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    if a.check_against:
        return run_check(a)
    run_timing(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
