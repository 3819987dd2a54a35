#!/usr/bin/env python3
"""moetron's narrow number formats and its AdamW with narrow moments
(--use-precision-aware-optimizer) against torch.

usage: precision_optimizer.py MOMENT_PROBE

Casts: bfloat16, IEEE half and FP8 E4M3 bits of random and adversarial floats (zeros of
both signs, NaN, infinities, the largest finite values and just past them, every
rounding tie of each format, subnormals of each format and of float) against torch's
.bfloat16(), .half() and .to(torch.float8_e4m3fn), bit for bit. One deliberate
difference: FP8 saturates above 448 (infinities included) as Transformer Engine's
casts do, where torch's cast gives NaN from 464 up; those inputs are checked to give ±448.

Optimizer: S AdamW steps from zero moments through build/moment_probe, against a
re-derivation here of Transformer Engine FusedAdam's treatment of narrow moments (each
step: decode with the stored scale, the AdamW update in float32, then
scale = absmax / (65504 / 2) for fp16 with stored = half(m * (1 / scale)), and for FP8
quantizer scale q = 1 / (absmax / 448) with stored = e4m3(m * q), decoded as
e4m3 * (1 / q); bf16 unscaled). The AdamW arithmetic is moetron's (constants folded in
double, the element update in float32, no fused multiply-add), written in numpy float32.
Parameters, decoded moments, stored bits and every step's scales must be equal bit for bit.

Prints `ok <case>` or `FAIL <case>: <why>` per case; exits non-zero on any failure.
Needs torch, numpy and safetensors.
"""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

F32 = np.float32
failures = 0


def report(name, why):
    global failures
    if why:
        failures += 1
        print(f"FAIL {name}: {why}")
    else:
        print(f"ok {name}")


def bits_of(t, dtype):
    return t.view(dtype).numpy().astype(np.int64) & (0xFFFF if dtype == torch.int16 else 0xFF)


# ---- the inputs ----------------------------------------------------------------------------

def float_from_bits(b):
    return np.array(b, dtype=np.uint32).view(np.float32)


def adversarial():
    v = [0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, -448.0, 463.9, 464.0, 479.0, 65504.0,
         65519.0, 65520.0, 65536.0, 3.4e38, 2.0 ** -14, 2.0 ** -15, 2.0 ** -24, 2.0 ** -25, 2.0 ** -26,
         1.5 * 2.0 ** -24, 2.0 ** -6, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -126, 1e-45, 1e-40]
    out = [F32(x) for x in v]
    # every rounding tie (and its float neighbours) of each format on a range of exponents
    for mantissa_bits in (7, 10, 3):
        for e in range(-30, 20):
            for m in range(0, 1 << min(mantissa_bits, 4)):
                base = (1 + m / (1 << mantissa_bits)) * 2.0 ** e
                tie = base + 2.0 ** (e - mantissa_bits - 1)
                for x in (tie, -tie):
                    f = F32(x)
                    out.extend([f, np.nextafter(f, F32(np.inf)), np.nextafter(f, F32(-np.inf))])
    return np.array(out, dtype=np.float32)


def random_floats(rng, n):
    x = rng.standard_normal(n).astype(np.float32) * np.exp2(rng.integers(-30, 20, n)).astype(np.float32)
    raw = float_from_bits(rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32))
    return np.concatenate([x, raw[np.isfinite(raw)]])


# ---- the casts -----------------------------------------------------------------------------

def mismatch(x, got, expect, where, digits):
    """Why got differs from expect where `where` holds (the count and the first), or ""."""
    wrong = np.flatnonzero((got != expect) & where)
    if not len(wrong):
        return ""
    i = wrong[0]
    return f"{len(wrong)} values differ, e.g. {x[i]!r}: {got[i]:#0{digits}x} vs {expect[i]:#0{digits}x}"


def check_casts(out, x):
    t = torch.from_numpy(x.copy())
    nan = np.isnan(x)
    for name, dtype_bits, infinity in (("bf16", t.bfloat16(), 0x7F80), ("fp16", t.half(), 0x7C00)):
        got = out[name]
        why = mismatch(x, got, bits_of(dtype_bits, torch.int16), ~nan, 6)
        quiet = np.flatnonzero(nan & ((got & 0x7FFF) <= infinity))
        report(f"cast_{name}", why or (f"NaN gave {got[quiet[0]]:#06x}" if len(quiet) else ""))

    big = np.abs(x) > 448
    got = out["e4m3"]
    why = mismatch(x, got, bits_of(t.to(torch.float8_e4m3fn), torch.uint8), ~big & ~nan, 4)
    # above 448: saturated (torch would give NaN from 464 up); NaN stays NaN
    why = why or mismatch(x, got, np.where(np.signbit(x), 0xFE, 0x7E), big, 4)
    not_nan = np.flatnonzero(nan & ((got & 0x7F) != 0x7F))
    report("cast_e4m3", why or (f"NaN gave {got[not_nan[0]]:#04x}" if len(not_nan) else ""))


# ---- the optimizer ---------------------------------------------------------------------------

RANGE = {"fp16": F32(65504.0 / 2.0), "fp8": F32(448.0)}


def decode_stored(stored, dtype, scale):
    if dtype == "fp32":
        return stored
    f = stored.float().numpy()
    if dtype == "bf16":
        return f
    if dtype == "fp16":
        return (f * scale).astype(F32)
    return (f * (F32(1) / scale)).astype(F32)


def encode(moment, dtype):
    """The stored moment and its scale (Transformer Engine FusedAdam._apply_scale)."""
    t = torch.from_numpy(moment.copy())
    if dtype == "fp32":
        return moment.copy(), F32(1)
    if dtype == "bf16":
        return t.bfloat16(), F32(1)
    absmax = F32(np.max(np.abs(moment))) if moment.size else F32(0)
    scale = F32(absmax / RANGE[dtype])
    if dtype == "fp16":
        rscale = F32(1) / scale if scale > 0 else F32(0)
        return torch.from_numpy((moment * rscale).astype(F32)).half(), scale
    q = F32(1) / scale if scale > 0 else F32(1)  # moetron: an all-zero moment keeps scale 1
    return torch.from_numpy((moment * q).astype(F32)).to(torch.float8_e4m3fn), q


def bits(stored, dtype):
    if dtype == "fp32":
        return stored.view(np.int32).astype(np.int64)
    return bits_of(stored, torch.uint8 if dtype == "fp8" else torch.int16)


def reference_steps(p, grads, dm, dv, decay):
    lr, beta1, beta2, eps, wd = 1e-3, 0.9, 0.95, 1e-8, 0.1
    m_stored, m_scale = encode(np.zeros_like(p), dm)
    v_stored, v_scale = encode(np.zeros_like(p), dv)
    m_scale = v_scale = F32(1)  # FusedAdam starts every scale at 1
    scales = []
    for step, g in enumerate(grads, start=1):
        b1, b2, omb1, omb2 = F32(beta1), F32(beta2), F32(1.0 - beta1), F32(1.0 - beta2)
        inv_bias1 = F32(1.0 / (1.0 - math.pow(beta1, step)))
        inv_sqrt_bias2 = F32(1.0 / math.sqrt(1.0 - math.pow(beta2, step)))
        decay_factor = F32(1.0 - lr * wd) if decay else F32(1)
        m = decode_stored(m_stored, dm, m_scale)
        v = decode_stored(v_stored, dv, v_scale)
        m = (b1 * m + omb1 * g).astype(F32)
        v = (b2 * v + (omb2 * g) * g).astype(F32)
        update = ((m * inv_bias1) / (np.sqrt(v) * inv_sqrt_bias2 + F32(eps))).astype(F32)
        p = (p * decay_factor - F32(lr) * update).astype(F32)
        m_stored, m_scale = encode(m, dm)
        v_stored, v_scale = encode(v, dv)
        scales.append((m_scale, v_scale))
    return p, (m_stored, m_scale), (v_stored, v_scale), scales


def check_optimizer(probe, tmp, dm, dv, decay, rng):
    name = f"adamw_m={dm}_v={dv}{'_decay' if decay else ''}"
    n, steps = 4099, 5
    p = rng.uniform(-1, 1, n).astype(F32)
    grads = rng.standard_normal((steps, n)).astype(F32) * np.exp2(rng.integers(-20, 4, (steps, n))).astype(F32)
    grads[:, :7] = 0  # elements whose moments stay zero
    if n > 100:
        grads[2, 100] = F32(3e4)  # one large gradient: the scales move
    inp, outp = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    save_file({"x": np.zeros(1, F32), "p": p, "g": grads}, inp)
    subprocess.run([probe, inp, outp, dm, dv, str(decay)], check=True)
    out = load_file(outp)

    ref_p, (m_st, m_scale), (v_st, v_scale), scales = reference_steps(p, grads, dm, dv, decay)
    why = ""
    want = {
        "p": ref_p,
        "m": decode_stored(m_st, dm, m_scale),
        "v": decode_stored(v_st, dv, v_scale),
    }
    for key, ref in want.items():
        got = out[key]
        diff = np.flatnonzero(got.view(np.int32) != ref.astype(F32).view(np.int32))
        if len(diff) and not why:
            i = diff[0]
            why = f"{key}: {len(diff)} elements differ, e.g. [{i}] {got[i]!r} vs {ref[i]!r}"
    for key, st, dtype in (("m_bits", m_st, dm), ("v_bits", v_st, dv)):
        ref_bits = bits(st, dtype)
        if not why and np.any(out[key].astype(np.int64) != ref_bits):
            why = f"{key}: stored bits differ"
    ref_m_scales = np.array([s[0] for s in scales], F32)
    ref_v_scales = np.array([s[1] for s in scales], F32)
    if not why and (np.any(out["scale_m"].view(np.int32) != ref_m_scales.view(np.int32)) or
                    np.any(out["scale_v"].view(np.int32) != ref_v_scales.view(np.int32))):
        why = f"scales differ: {out['scale_m']} / {out['scale_v']} vs {ref_m_scales} / {ref_v_scales}"
    report(name, why)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    probe = sys.argv[1]
    rng = np.random.default_rng(1234)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        x = np.concatenate([adversarial(), random_floats(rng, 200000)])
        inp, outp = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"x": x, "p": np.zeros(1, F32), "g": np.zeros(1, F32)}, inp)
        subprocess.run([probe, inp, outp, "fp32", "fp32", "0"], check=True)
        check_casts(load_file(outp), x)
        for dm, dv, decay in (("fp32", "fp32", 1), ("bf16", "bf16", 0), ("fp16", "fp16", 1), ("fp8", "fp8", 1),
                              ("fp8", "fp16", 0), ("bf16", "fp8", 1), ("fp16", "fp32", 0)):
            check_optimizer(probe, tmp, dm, dv, decay, rng)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
