#!/usr/bin/env bash
# test_ckpt_fp8.sh — --ckpt-dtype fp8: DeepSeek-V3-style FP8 model files.
#   fp8_files_*       the linear layers' matrices are F8_E4M3, each with a <name>_scale_inv F32
#                     [ceil(r/128), ceil(c/128)]; embeddings, norms, lm_head and a multi-token-
#                     prediction depth's eh_proj BF16 (their master rounded to nearest even; the
#                     depth's decoder matrices FP8), router and expert bias F32 (the master);
#                     code · scale_inv within 2^-4 of its block's amax of the F32 master weight
#                     in optimizer.safetensors, and (with torch) bit for bit the codes and
#                     scales of transformers' Fp8Quantize (scale 448/amax, scale_inv 1/scale,
#                     both divisions correctly rounded);
#                     config.json carries DeepSeek-V3's quantization_config.
#   fp8_reader_exact  moetron reads an FP8 file as its dequantized F32 copy (blocks cut short
#                     by the shape included): the same logits bit for bit.
#   fp8_transformers  AutoModelForCausalLM loads the directory (on CPU transformers dequantizes)
#                     with no missing or unexpected keys, its weights are code · scale_inv
#                     exactly, and its float32 logits match `moetron forward` within 1e-4.
#   fp8_resume        6 straight steps = 3 + resume 3, losses and final files bit for bit.
#   fp8_mpi_*         saves of TP=2 and EP=2 (distributed optimizer) under mpirun are byte for
#                     byte the one-process files (sharded).
#   fp8_unaligned_note one note when a matrix side above 128 is not a multiple of 128 (which
#                     transformers' CPU dequantization cannot place; moetron reads it).
#   ckpt_dtype_unknown one error line naming --ckpt-dtype and its values.
# The python parts need numpy (and torch + transformers + accelerate for fp8_transformers);
# without them they are skipped (failures under CI=true).
set -u
source "$(dirname "$0")/lib.sh"
COMMON=(--seq-length 32 --micro-batch-size 2 --global-batch-size 4 --eval-interval 0 --log-interval 1
        --lr-warmup-iters 1 --mock-data-tokens 65536)
# DeepSeek-V3 whose matrices have 1, 2 or 3 blocks a side, every side <= 128 or a multiple of
# 128 (transformers' CPU dequantization derives the block from the grid, so it needs that)
DS=(--hf-architecture deepseek_v3 --multi-latent-attention --kv-lora-rank 120 --qk-head-dim 8
    --qk-pos-emb-head-dim 8 --v-head-dim 8 --num-attention-heads 8 --hidden-size 256 --num-layers 2
    --moe-layer-freq '[0,1]' --ffn-hidden-size 384 --num-experts 4 --moe-ffn-hidden-size 128
    --moe-router-topk 2 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 0.01 --moe-shared-expert-intermediate-size 128 "${COMMON[@]}")
# Mixtral whose sides (160, 200, 80) cut their last block short
ODD=(--hf-architecture mixtral --hidden-size 160 --num-attention-heads 4 --group-query-attention
     --num-query-groups 2 --num-layers 2 --num-experts 4 --moe-ffn-hidden-size 200 --moe-router-topk 2
     "${COMMON[@]}")

run() {  # NAME ARGS...: moetron ARGS, output in $work/NAME.log; fails NAME on a non-zero exit
    local name=$1
    shift
    "$M" "$@" >"$work/$name.log" 2>&1 || { fail "$name" "moetron $1: $(tail -2 "$work/$name.log" | tr '\n' ' ')"; return 1; }
}

# python_has NAME MODULES...: 0 when python3 imports them all; else a skip (a failure under CI)
python_has() {
    local name=$1
    shift
    python3 -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))' "$@" \
        2>/dev/null && return 0
    if [ "${CI:-}" = "true" ]; then fail "$name" "python3 with $* is required under CI"; else echo "skip $name: python3 with $* not installed"; fi
    return 1
}

# pyfp8 SCRIPT ARGS...: python3 with numpy and the helpers header(path) -> (header, data),
# tensor(path, name) -> numpy array (F8_E4M3 as uint8 codes), e4m3(codes) -> float32 values,
# dequant(codes, scale_inv) -> float32 (each element times its block's factor) and
# model_tensors(dir) -> {name: (path, header entry)}; prints a reason on failure
pyfp8() {
    local script=$1
    shift
    python3 -c "$SAFETENSORS_PY
import json, os, struct, sys
import numpy as np
DT = {'F32': np.float32, 'BF16': np.uint16, 'F8_E4M3': np.uint8, 'I32': np.int32}
def tensor(path, name):
    h, data = header(path)
    v = h[name]
    b, e = v['data_offsets']
    return np.frombuffer(data[b:e], dtype=DT[v['dtype']]).reshape(v['shape'])
def e4m3(codes):
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    ex, man = (c >> 3) & 15, c & 7
    v = np.where(ex == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0**(ex - 7))
    v = np.where((ex == 15) & (man == 7), np.nan, v)
    return (sign * v).astype(np.float32)
def dequant(codes, scale_inv):
    r, c = codes.shape
    s = np.repeat(np.repeat(scale_inv, 128, 0), 128, 1)[:r, :c]
    return e4m3(codes) * s
def model_tensors(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.startswith('model') and f.endswith('.safetensors'):
            h, _ = header(os.path.join(d, f))
            h.pop('__metadata__', None)
            out.update({k: (os.path.join(d, f), v) for k, v in h.items()})
    return out
$script" "$@"
}

# check_fp8_files NAME ITER_DIR: the dtypes, names, scale shapes and values described above
check_fp8_files() {
    local name=$1 it=$2 why
    python_has "$name" numpy || return
    why=$(pyfp8 '
d = sys.argv[1]
opt = os.path.join(d, "optimizer.safetensors")
tensors = model_tensors(d)
try:
    import torch
except ImportError:
    torch = None
def bf16_rne(x):
    b = x.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
n_fp8 = n_bf16 = n_f32 = 0
masters = header(opt)[0]
# the copies of the embedding and the head in a multi-token-prediction depth: their masters are those
# (the head: the embedding when the two are tied)
copies = {".embed_tokens.weight": ["model.embed_tokens.weight"],
          ".shared_head.head.weight": ["lm_head.weight", "model.embed_tokens.weight"]}
def master_of(k):
    names = [k] + next((m for suffix, m in copies.items() if k.endswith(suffix)), [])
    return tensor(opt, next("master." + n for n in names if "master." + n in masters))
for k, (path, v) in tensors.items():
    if k.endswith("_scale_inv"):
        if k[:-len("_scale_inv")] not in tensors: print("scale without its tensor", k); sys.exit()
        continue
    master = master_of(k)
    routing = k.endswith((".mlp.gate.weight", ".block_sparse_moe.gate.weight", "e_score_correction_bias"))
    kept = k.endswith((".eh_proj.weight",) + tuple(copies))  # BF16 in the DeepSeek-V3 release
    linear = len(v["shape"]) == 2 and k.startswith("model.layers.") and not routing and not kept
    if not linear:
        want = "F32" if routing else "BF16"
        if v["dtype"] != want: print(k, "has dtype", v["dtype"], "expected", want); sys.exit()
        got = tensor(path, k)
        ok = np.array_equal(got, master) if routing else np.array_equal(got, bf16_rne(master))
        if not ok: print(k, "is not its master", "" if routing else "rounded to BF16"); sys.exit()
        n_f32 += routing
        n_bf16 += not routing
        continue
    n_fp8 += 1
    if v["dtype"] != "F8_E4M3": print(k, "has dtype", v["dtype"], "expected F8_E4M3"); sys.exit()
    sk = k + "_scale_inv"
    if sk not in tensors or tensors[sk][0] != path: print(k, "has no", sk, "in its shard"); sys.exit()
    r, c = v["shape"]
    grid = [-(-r // 128), -(-c // 128)]
    if tensors[sk][1]["dtype"] != "F32" or tensors[sk][1]["shape"] != grid:
        print(sk, tensors[sk][1]["dtype"], tensors[sk][1]["shape"], "expected F32", grid); sys.exit()
    codes, scale_inv = tensor(path, k), tensor(path, sk)
    pad = np.zeros((grid[0] * 128, grid[1] * 128), np.float32)
    pad[:r, :c] = np.abs(master)
    amax = pad.reshape(grid[0], 128, grid[1], 128).max(axis=(1, 3))
    bound = np.repeat(np.repeat(amax, 128, 0), 128, 1)[:r, :c] * (2.0**-4 * (1 + 2.0**-20))
    err = np.abs(dequant(codes, scale_inv).astype(np.float64) - master)
    if not (err <= bound).all():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        print(k, "element", i, "dequantizes", err[i], "away from its master; bound", bound[i]); sys.exit()
    if torch is not None:  # Fp8Quantize with tensor divisions (448.0 / t would be 448 * (1 / t) in torch)
        a = torch.from_numpy(amax)
        one = torch.ones_like(a)
        scale = torch.where(a > 0, torch.full_like(a, 448.0) / torch.where(a > 0, a, one), one)
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:r, :c]
        ref_codes = (torch.from_numpy(master.copy()) * full).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        if not np.array_equal(ref_codes.numpy(), codes): print(k, "codes differ from Fp8Quantize of its master"); sys.exit()
        if not np.array_equal((one / scale).numpy(), scale_inv): print(k, "scale_inv is not 1 / (448 / amax)"); sys.exit()
if n_fp8 < 8 or n_bf16 < 3: print("found %d FP8, %d BF16, %d F32 tensors" % (n_fp8, n_bf16, n_f32)); sys.exit()
cfg = json.load(open(os.path.join(d, "config.json")))
want = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
if cfg.get("quantization_config") != want: print("config.json quantization_config", cfg.get("quantization_config")); sys.exit()
if cfg.get("torch_dtype") != "bfloat16": print("config.json torch_dtype", cfg.get("torch_dtype"))
' "$it") || why="python3 failed"
    [ -z "$why" ] && ok "$name" || fail "$name" "$why"
}

# make_input PATH SEED: input_ids [2, 24] of random bytes for moetron forward
make_input() {
    pyfp8 '
ids = np.random.default_rng(int(sys.argv[2])).integers(0, 257, size=(2, 24)).astype(np.int32)
h = json.dumps({"input_ids": {"dtype": "I32", "shape": [2, 24], "data_offsets": [0, ids.nbytes]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + ids.tobytes())
' "$@"
}

test_files() {
    run ds_train train "${DS[@]}" --train-iters 6 --save-interval 3 --ckpt-dtype fp8 --save "$work/ds" \
        --log-jsonl "$work/ds.jsonl" || return
    check_fp8_files fp8_files_deepseek_v3 "$work/ds/iter_0000006"
    # with a multi-token-prediction depth (model.layers.2.*): its eh_proj BF16, its decoder FP8
    run ds_mtp_train train "${DS[@]}" --mtp-num-layers 1 --train-iters 2 --ckpt-dtype fp8 --save "$work/ds_mtp" || return
    check_fp8_files fp8_files_deepseek_v3_mtp "$work/ds_mtp/iter_0000002"
    python_has fp8_mtp_eh_proj_bf16 numpy || return
    local why
    why=$(pyfp8 '
t = model_tensors(sys.argv[1])
dtype = lambda k: t[k][1]["dtype"] if k in t else "absent"
eh, kv = "model.layers.2.eh_proj.weight", "model.layers.2.self_attn.kv_b_proj.weight"
if (dtype(eh), dtype(kv)) != ("BF16", "F8_E4M3"): print(eh, dtype(eh), kv, dtype(kv), "expected BF16, F8_E4M3")
' "$work/ds_mtp/iter_0000002") || why="python3 failed"
    [ -z "$why" ] && ok fp8_mtp_eh_proj_bf16 || fail fp8_mtp_eh_proj_bf16 "$why"
    run odd_train train "${ODD[@]}" --train-iters 3 --ckpt-dtype fp8 --save "$work/odd" --max-shard-size 100KB || return
    [ -f "$work/odd/iter_0000003/model.safetensors.index.json" ] || { fail fp8_files_mixtral_sharded "no shards"; return; }
    # sides of 160 and 200: the one note that transformers' CPU dequantization cannot place their blocks
    local note="note: --ckpt-dtype fp8: .* have a side above 128 that is not a multiple of 128"
    if [ "$(grep -c -- "$note" "$work/odd_train.log")" -ne 1 ] || grep -q -- "$note" "$work/ds_train.log"; then
        fail fp8_unaligned_note "expected the note once for the Mixtral model, never for the DeepSeek-V3 one"
    else
        ok fp8_unaligned_note
    fi
    check_fp8_files fp8_files_mixtral_sharded "$work/odd/iter_0000003"
}

# An F32 copy of the ODD checkpoint, each FP8 matrix replaced by code · scale_inv (float32)
test_reader_exact() {
    python_has fp8_reader_exact numpy || return
    local src="$work/odd/iter_0000003" dst="$work/odd_f32" why
    [ -d "$src" ] || { fail fp8_reader_exact "no checkpoint"; return; }
    mkdir -p "$dst" && cp "$src/config.json" "$dst/"
    why=$(pyfp8 '
src, dst = sys.argv[1:3]
tensors = model_tensors(src)
out, blobs, off = {}, [], 0
for k, (path, v) in tensors.items():
    if k.endswith("_scale_inv"): continue
    a = tensor(path, k)
    if v["dtype"] == "F8_E4M3": a = dequant(a, tensor(path, k + "_scale_inv"))
    elif v["dtype"] == "BF16": a = (a.astype(np.uint32) << 16).view(np.float32)
    b = np.ascontiguousarray(a, np.float32).tobytes()
    out[k] = {"dtype": "F32", "shape": v["shape"], "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
cfg = json.load(open(os.path.join(dst, "config.json")))
cfg.pop("quantization_config")
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
' "$src" "$dst") || why="python3 failed"
    [ -z "$why" ] || { fail fp8_reader_exact "$why"; return; }
    make_input "$work/odd_in.safetensors" 5 || { fail fp8_reader_exact "python3 failed"; return; }
    run fp8_reader_exact forward --load "$src" --input "$work/odd_in.safetensors" --dump "$work/odd_fp8.out" || return
    run fp8_reader_exact forward --load "$dst" --input "$work/odd_in.safetensors" --dump "$work/odd_f32.out" || return
    why=$(pyfp8 'print("" if np.array_equal(tensor(sys.argv[1], "logits"), tensor(sys.argv[2], "logits")) else "logits differ")' \
        "$work/odd_fp8.out" "$work/odd_f32.out")
    [ -z "$why" ] && ok fp8_reader_exact || fail fp8_reader_exact "$why"
}

# Both sides multiply the same E4M3 codes by the same F32 factors (one float32 product each)
# and widen the same BF16 tensors: the FP8 weight error is the same on both sides, so the
# logits differ only as two float32 forwards of one model do (hf_export.py's 1e-4).
test_transformers() {
    python_has fp8_transformers numpy torch transformers accelerate || return
    local it="$work/ds/iter_0000006" why
    [ -d "$it" ] || { fail fp8_transformers "no checkpoint"; return; }
    make_input "$work/ds_in.safetensors" 7 || { fail fp8_transformers "python3 failed"; return; }
    run fp8_transformers forward --load "$it" --input "$work/ds_in.safetensors" --dump "$work/ds.out" || return
    why=$(pyfp8 '
import logging, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
d, ins, dump = sys.argv[1:4]
model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
    if info.get(key): print("transformers reports", key, sorted(info[key])[:4]); sys.exit()
files = model_tensors(d)
def mine(name):
    return dequant(tensor(files[name][0], name), tensor(files[name][0], name + "_scale_inv"))
params = dict(model.named_parameters())
pairs = [("model.layers.0.self_attn.q_proj.weight", params["model.layers.0.self_attn.q_proj.weight"]),
         ("model.layers.0.mlp.down_proj.weight", params["model.layers.0.mlp.down_proj.weight"]),
         ("model.layers.1.mlp.experts.2.gate_proj.weight", params["model.layers.1.mlp.experts.gate_up_proj"][2, :128]),
         ("model.layers.1.mlp.experts.3.down_proj.weight", params["model.layers.1.mlp.experts.down_proj"][3])]
for name, p in pairs:
    if p.dtype != torch.float32 or not np.array_equal(p.detach().numpy(), mine(name)):
        print("transformers holds", name, "as", p.dtype, "not code * scale_inv"); sys.exit()
ids = torch.from_numpy(tensor(ins, "input_ids").astype(np.int64))
with torch.no_grad():
    hf = model.eval()(input_ids=ids, use_cache=False).logits.numpy()
mt = tensor(dump, "logits")
if hf.shape != mt.shape: print("logits shapes", hf.shape, mt.shape); sys.exit()
diff = float(np.abs(hf.astype(np.float64) - mt).max())
if not diff <= 1e-4: print("logits differ by %.3g (tol 1e-4)" % diff)
print("logits diff %.1e" % diff, file=sys.stderr)
' "$it" "$work/ds_in.safetensors" "$work/ds.out" 2>"$work/hf.err") || why="python3 failed: $(tail -1 "$work/hf.err")"
    [ -z "$why" ] && ok "fp8_transformers  ($(tail -1 "$work/hf.err"))" || fail fp8_transformers "$why"
}

test_resume() {
    run resume_part1 train "${DS[@]}" --train-iters 6 --ckpt-dtype fp8 --exit-interval 3 --save "$work/ds_b" \
        --log-jsonl "$work/ds_b1.jsonl" || return
    run resume_part2 train --load "$work/ds_b" --log-jsonl "$work/ds_b2.jsonl" || return
    if [ "$(losses "$work/ds.jsonl" | wc -l)" -ne 6 ] ||
        ! diff <(losses "$work/ds.jsonl") <(cat <(losses "$work/ds_b1.jsonl") <(losses "$work/ds_b2.jsonl")) >/dev/null; then
        fail fp8_resume "6 straight fp8 steps differ from 3 + resume 3"; return
    fi
    local f
    for f in model.safetensors optimizer.safetensors; do
        cmp -s "$work/ds/iter_0000006/$f" "$work/ds_b/iter_0000006/$f" || { fail fp8_resume "final $f differs"; return; }
    done
    ok fp8_resume_bit_identical
}

test_bad_input() {
    expect_error ckpt_dtype_unknown "--ckpt-dtype fp16: use fp32, bf16 or fp8" -- "$M" train --ckpt-dtype fp16
}

# One step at --lr 0 from the ODD checkpoint (the parameters stay as loaded): the sharded
# model files of TP=2 and EP=2 runs are those of one process.
test_mpi() {
    source "$(dirname "$0")/mpi_lib.sh"
    mpi_require fp8_mpi_saves
    [ -d "$work/odd" ] || { fail fp8_mpi_saves "no checkpoint"; return; }
    local STEP=(train --load "$work/odd" --train-iters 4 --lr 0 --min-lr 0 --max-shard-size 100KB) layout
    run fp8_mpi_single "${STEP[@]}" --save "$work/mpi1" || return
    for layout in "tp2 --tensor-model-parallel-size 2 --sequence-parallel" "ep2 --expert-model-parallel-size 2 --use-distributed-optimizer"; do
        set -- $layout
        local name=fp8_mpi_$1
        shift
        timeout 300 "${MPIRUN[@]}" -np 2 "$M" "${STEP[@]}" "$@" --save "$work/mpi_$name" >"$work/$name.log" 2>&1 ||
            { fail "$name" "mpirun: $(tail -2 "$work/$name.log" | tr '\n' ' ')"; continue; }
        local a b
        a=$(cd "$work/mpi1/iter_0000004" && md5sum model*)
        b=$(cd "$work/mpi_$name/iter_0000004" && md5sum model*)
        [ -n "$a" ] && [ "$a" = "$b" ] && ok "${name}_same_files" || fail "${name}_same_files" "$(diff <(echo "$a") <(echo "$b") | head -2 | tr '\n' ' ')"
    done
}

test_files
test_reader_exact
test_transformers
test_resume
test_bad_input
test_mpi
