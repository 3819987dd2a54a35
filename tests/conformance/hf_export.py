#!/usr/bin/env python3
"""Hugging Face export check for moetron checkpoints: shards, BF16, tokenizer files.

usage: hf_export.py MOETRON_BINARY [CASE ...]

Each case trains a tiny model with moetron for a few steps and saves it, then checks the
checkpoint directory the way transformers uses it:

  bf16_sharded_untied  --ckpt-dtype bf16 --max-shard-size 20KB --untie-embeddings-and-output-weights
                       --tokenizer-model: several model-0000i-of-0000N.safetensors shards whose
                       weight_map and total_size are what huggingface_hub's
                       split_torch_state_dict_into_shards gives for the same tensors in moetron's
                       order; every tensor BF16; AutoModelForCausalLM loads it (as bfloat16) with
                       no missing, unexpected or mismatched keys; AutoTokenizer loads the copied
                       tokenizer and encodes as the original does.
  fp32_single_qwen3    the default F32 export in one model.safetensors (no index), Qwen3-MoE.
  bf16_deepseek_v3_f32_bias
                       a BF16 DeepSeek-V3 export whose trained expert biases
                       (e_score_correction_bias) stay F32: transformers holds them exactly.

  bpe_generate_stops   a model trained on text (--data-path .txt) with a `moetron prepare` BPE
                       tokenizer and no --vocab-size: config.json, generation_config.json and
                       tokenizer_config.json name that tokenizer's <|endoftext|>, and transformers'
                       greedy model.generate (AutoModelForCausalLM + AutoTokenizer) stops where
                       `moetron generate --temperature 0` stops, with the same text.

In the first three, the float32 logits of the transformers model (model.float()) on random tokens must
match `moetron forward` on the same checkpoint within 1e-4.

Prints `ok <case>  [details]` or `FAIL <case>: <why>` per case and exits non-zero when any
case fails. Needs python3 with torch, transformers (v5), safetensors and numpy; shares its
helpers with hf_conformance.py. HF_CONFORMANCE_KEEP=1 keeps the temporary directories.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_conformance import check, load_dump, make_inputs, maxdiff_where, run_cases, run_cmd  # noqa: E402

TRAIN_ITERS = 3
BATCH, SEQ = 2, 24
VOCAB_TOKENS = 257
LOGIT_TOL = 1e-4
SHARD_LIMIT = 20000          # --max-shard-size 20KB (powers of 1000, as Hugging Face)

BASE_TRAIN = [
    "--micro-batch-size", "2", "--global-batch-size", "2", "--seq-length", "32", "--num-layers", "2",
    "--hidden-size", "64", "--num-attention-heads", "4", "--num-experts", "4", "--moe-ffn-hidden-size", "48",
    "--moe-router-topk", "2", "--eval-interval", "0", "--log-interval", "100", "--lr-warmup-iters", "0",
]
UNTIED = ["--untie-embeddings-and-output-weights"]
# DeepSeek-V3: Multi-Latent Attention, sigmoid routing with a trained expert bias (kept F32 in
# a BF16 export), a shared expert, the first layer dense
DEEPSEEK = ["--hf-architecture", "deepseek_v3", "--multi-latent-attention", "--kv-lora-rank", "16",
            "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
            "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
            "--moe-router-bias-update-rate", "0.05", "--moe-shared-expert-intermediate-size", "48",
            "--moe-router-load-balancing-type", "none", "--num-layers", "3", "--moe-layer-freq", "[0,1,1]",
            "--ffn-hidden-size", "96"]

# name -> (shape flags, export flags, expected model_type, sharded, with a tokenizer)
CASES = [
    ("bf16_sharded_untied", UNTIED, ["--ckpt-dtype", "bf16", "--max-shard-size", "20KB"], "mixtral", True, True),
    ("fp32_single_qwen3", UNTIED + ["--qk-layernorm"], [], "qwen3_moe", False, False),
    ("bf16_deepseek_v3_f32_bias", DEEPSEEK, ["--ckpt-dtype", "bf16"], "deepseek_v3", False, False),
]


def read_header(path):
    """The safetensors header of path, in file order (without __metadata__)."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return header


def train(moetron, flags, save, iters=TRAIN_ITERS):
    run_cmd([moetron, "train", "--train-iters", str(iters)] + BASE_TRAIN + flags + ["--save", save], "moetron train")
    return os.path.join(save, f"iter_{iters:07d}")


def make_tokenizer(directory):
    """A small byte-level BPE tokenizer.json plus tokenizer_config.json; returns the tokenizer.json path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog. 12+7=19"] * 20, trainer)
    os.makedirs(directory)
    path = os.path.join(directory, "my_tokenizer.json")
    tok.save(path)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}, fh)
    return path


def model_headers(it_dir):
    """{file: header} of the model files (model.safetensors or the shards)."""
    files = sorted(f for f in os.listdir(it_dir) if f.endswith(".safetensors") and f.startswith("model"))
    return {f: read_header(os.path.join(it_dir, f)) for f in files}


def check_dtypes(headers, bf16):
    """F32, or with bf16 BF16 except the routers and expert biases (F32, as transformers keeps them)."""
    for h in headers.values():
        for k, v in h.items():
            router = k.endswith(("e_score_correction_bias", "mlp.gate.weight", "block_sparse_moe.gate.weight"))
            want = "BF16" if bf16 and not router else "F32"
            check(v["dtype"] == want, f"{k} has dtype {v['dtype']}, expected {want}")


def check_shards(moetron, it_dir, headers, shape_flags, workdir):
    """The shards and index are what huggingface_hub would write for the same tensors in moetron's order."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    files = list(headers)
    check("model.safetensors" not in files, "model.safetensors written besides the shards")
    n = len(files)
    check(n >= 3, f"expected several shards, found {files}")
    check(files == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)], f"shard names {files}")
    with open(os.path.join(it_dir, "model.safetensors.index.json")) as fh:
        text = fh.read()
    index = json.loads(text)
    check(text == json.dumps(index, indent=2, sort_keys=True) + "\n",
          "model.safetensors.index.json is not laid out as transformers writes it (sorted keys, indent 2)")
    # moetron's tensor order: the order of a single-file export of the same model
    order_dir = train(moetron, shape_flags, os.path.join(workdir, "order"), iters=1)
    order = read_header(os.path.join(order_dir, "model.safetensors"))
    stored = {k: v for h in headers.values() for k, v in h.items()}
    check(sorted(stored) == sorted(order), "the shards hold other tensors than the model")
    torch_dtype = {"BF16": torch.bfloat16, "F32": torch.float32}
    state = {k: torch.empty(stored[k]["shape"], dtype=torch_dtype[stored[k]["dtype"]]) for k in order}
    split = split_torch_state_dict_into_shards(state, max_shard_size=SHARD_LIMIT)
    check(split.is_sharded, "huggingface_hub would not shard this model; the test limit is wrong")
    check(index["weight_map"] == split.tensor_to_filename,
          "weight_map differs from huggingface_hub's split of the same tensors: " +
          str(sorted((k, v, split.tensor_to_filename.get(k)) for k, v in index["weight_map"].items()
                     if split.tensor_to_filename.get(k) != v)[:3]))
    check(index["metadata"].get("total_size") == split.metadata["total_size"],
          f"total_size {index['metadata'].get('total_size')}, huggingface_hub says {split.metadata['total_size']}")
    return n


def check_expert_bias(model, it_dir, headers):
    """transformers holds the F32 expert biases of the file exactly, in float32."""
    import torch
    from safetensors import safe_open
    biases = {n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    for f, h in headers.items():
        with safe_open(os.path.join(it_dir, f), framework="pt") as fh:
            for k in (k for k in h if k.endswith("e_score_correction_bias")):
                value = fh.get_tensor(k)
                check(k in biases, f"transformers has no buffer {k}")
                check(biases[k].dtype == torch.float32, f"transformers holds {k} as {biases[k].dtype}")
                check(torch.equal(biases[k], value), f"transformers holds other values for {k}")
                check(bool(value.any()), f"{k} is all zero; the test should train it")
                biases.pop(k)
    check(not biases, f"transformers has expert biases the checkpoint lacks: {sorted(biases)[:2]}")


def check_tokenizer(tok_path, it_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    with open(tok_path, "rb") as a, open(os.path.join(it_dir, "tokenizer.json"), "rb") as b:
        check(a.read() == b.read(), "tokenizer.json is not a copy of --tokenizer-model")
    check(os.path.isfile(os.path.join(it_dir, "tokenizer_config.json")), "tokenizer_config.json was not copied")
    text = "the lazy fox: 12+7=19"
    want = Tokenizer.from_file(tok_path).encode(text).ids
    got = AutoTokenizer.from_pretrained(it_dir)(text).input_ids
    check(got == want, f"AutoTokenizer from the checkpoint encodes {got}, the tokenizer itself {want}")


def run_case(moetron, name, shape_flags, export_flags, model_type, sharded, tokenizer, workdir):
    import torch
    from transformers import AutoModelForCausalLM

    flags = shape_flags + export_flags
    tok_path = None
    if tokenizer:
        tok_path = make_tokenizer(os.path.join(workdir, "tok"))
        flags = flags + ["--tokenizer-model", tok_path]
    it_dir = train(moetron, flags, os.path.join(workdir, "ckpt"))
    bf16 = "bf16" in export_flags
    detail = []
    headers = model_headers(it_dir)
    check_dtypes(headers, bf16)
    if sharded:
        detail.append(f"{check_shards(moetron, it_dir, headers, shape_flags, workdir)} shards")
    else:
        check(list(headers) == ["model.safetensors"], f"model files {list(headers)}, expected model.safetensors")
        check(not os.path.exists(os.path.join(it_dir, "model.safetensors.index.json")), "an index for one file")

    model, info = AutoModelForCausalLM.from_pretrained(it_dir, output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        check(not info.get(key), f"transformers reports {key}: {sorted(info[key])[:4]}")
    check(model.config.model_type == model_type, f"model_type {model.config.model_type}, expected {model_type}")
    want_dtype = torch.bfloat16 if bf16 else torch.float32
    check(model.dtype == want_dtype, f"transformers loaded the model as {model.dtype}, expected {want_dtype}")
    check_expert_bias(model, it_dir, headers)
    model = model.float().eval()

    in_path, out_path = os.path.join(workdir, "in.safetensors"), os.path.join(workdir, "out.safetensors")
    ids, _ = make_inputs(in_path, sum(map(ord, name)), VOCAB_TOKENS, BATCH, SEQ)
    run_cmd([moetron, "forward", "--load", it_dir, "--input", in_path, "--dump", out_path], "moetron forward")
    mt_logits = load_dump(out_path)["logits"]
    with torch.no_grad():
        hf_logits = model(input_ids=torch.from_numpy(ids.astype(np.int64)), use_cache=False).logits.numpy()
    check(mt_logits.shape == hf_logits.shape, f"logits shape {list(mt_logits.shape)} vs HF {list(hf_logits.shape)}")
    d, at = maxdiff_where(mt_logits, hf_logits)
    check(d <= LOGIT_TOL, f"logits max abs diff {d:.3e} at {at} (tol {LOGIT_TOL})")
    detail.append(f"logits diff {d:.1e}")
    if tok_path:
        check_tokenizer(tok_path, it_dir)
        detail.append("tokenizer loads")
    return ", ".join(detail)


GEN_DOC = "hello world this is the end"   # the model learns to end each document after "end"
GEN_PROMPT, GEN_MAX_NEW = "hello world", 12


def run_generate_case(moetron, name, workdir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = os.path.join(workdir, "docs.txt")
    with open(text, "w") as fh:
        fh.write((GEN_DOC + "\n\n") * 200)
    run_cmd([moetron, "prepare", "--input", text, "--vocab-size", "300", "--output-prefix",
             os.path.join(workdir, "bpe")], "moetron prepare")
    tok_path = os.path.join(workdir, "bpe_tokenizer.json")
    eot = [t["id"] for t in json.load(open(tok_path))["added_tokens"] if t["content"] == "<|endoftext|>"][0]
    it_dir = train(moetron, ["--tokenizer-model", tok_path, "--data-path", text, "--lr", "1e-2"],
                   os.path.join(workdir, "ckpt"), iters=60)
    for file, key in (("config.json", "eos_token_id"), ("config.json", "bos_token_id"),
                      ("generation_config.json", "eos_token_id")):
        got = json.load(open(os.path.join(it_dir, file))).get(key)
        check(got == eot, f"{file} {key} is {got}, the tokenizer's <|endoftext|> is {eot}")

    out = run_cmd([moetron, "generate", "--load", it_dir, "--prompt", GEN_PROMPT, "--temperature", "0",
                   "--max-new-tokens", str(GEN_MAX_NEW)], "moetron generate")
    # stdout carries the text, stderr (merged here) why generation stopped
    lines = out.rstrip("\n").splitlines()
    reasons = [l for l in lines if l.startswith("generate: stopped")]
    check(reasons and "end-of-document" in reasons[-1], f"moetron generate did not stop at end-of-document: {lines}")
    mt_text = [l for l in lines if not l.startswith("generate: stopped")][-1]
    tok = AutoTokenizer.from_pretrained(it_dir)
    check(tok.eos_token_id == eot, f"AutoTokenizer's eos_token_id is {tok.eos_token_id}, expected {eot}")
    model = AutoModelForCausalLM.from_pretrained(it_dir).float().eval()
    ids = tok(GEN_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GEN_MAX_NEW, do_sample=False)
    new = gen[0, ids.shape[1]:].tolist()
    check(eot in new, f"transformers' generate did not stop at <|endoftext|> ({eot}): generated {new}")
    check(new[-1] == eot, f"transformers' generate went on past <|endoftext|>: {new}")
    hf_text = GEN_PROMPT + tok.decode(new[:-1])
    check(hf_text == mt_text, f"transformers generated {hf_text!r}, moetron generate {mt_text!r}")
    return f"both stop after {len(new) - 1} tokens: {mt_text!r}"


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    moetron = os.path.abspath(sys.argv[1])
    cases = [c for c in CASES if len(sys.argv) == 2 or any(c[0].startswith(w) for w in sys.argv[2:])]
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    runs = [(c[0], run_case, c[1:]) for c in cases]
    if len(sys.argv) == 2 or any("bpe_generate_stops".startswith(w) for w in sys.argv[2:]):
        runs.append(("bpe_generate_stops", run_generate_case, ()))
    return run_cases(moetron, runs, "hfexport")


if __name__ == "__main__":
    sys.exit(main())
