#!/usr/bin/env python3
"""tests/fuzz/make_seeds.py MOETRON — (re)writes the seed corpora tests/fuzz/corpus/<target>/
and the libFuzzer dictionaries tests/fuzz/<target>.dict.

Small valid inputs of every parser, most of them written by moetron itself (a checkpoint of
a tiny model for each Hugging Face family, `moetron prepare` datasets and tokenizers), the
rest built here by hand from the file formats. Needs python3 only (no numpy, no torch).
The fuzzers start from these; tests/run.sh replays them (and the regressions) every run.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def run(moetron, *args, cwd=None):
    subprocess.run([moetron, *args], check=True, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


TINY = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr-warmup-iters", "0",
        "--make-vocab-size-divisible-by", "1", "--moe-ffn-hidden-size", "8", "--ffn-hidden-size", "16"]
FAMILIES = {
    "mixtral": ["--num-experts", "4", "--moe-router-topk", "2"],
    "qwen3_moe": ["--num-experts", "4", "--moe-router-topk", "2", "--qk-layernorm", "--group-query-attention",
                  "--num-query-groups", "1", "--moe-layer-freq", "[0,1]", "--untie-embeddings-and-output-weights"],
    "olmoe": ["--num-experts", "4", "--moe-router-topk", "2", "--qk-layernorm", "--qk-layernorm-scope", "projection",
              "--clip-qkv", "8"],
    "deepseek_v3": ["--num-experts", "4", "--moe-router-topk", "2", "--multi-latent-attention", "--kv-lora-rank", "8",
                    "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8", "--q-lora-rank", "8",
                    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                    "--moe-shared-expert-intermediate-size", "8", "--moe-layer-freq", "[0,1]"],
    "moetron_moe": ["--num-experts", "4", "--moe-router-topk", "2", "--moe-expert-capacity-factor", "1.5",
                    "--moe-router-score-function", "sqrtsoftplus"],
}


def checkpoints(moetron, tmp):
    """config.json, trainer_state.json, latest file, model.safetensors, checksums.json and the
    sharded index of tiny checkpoints."""
    for family, flags in FAMILIES.items():
        save = os.path.join(tmp, "ck_" + family)
        run(moetron, "train", *TINY, *flags, "--save", save)
        it = os.path.join(save, "iter_0000001")
        with open(os.path.join(it, "config.json"), "rb") as f:
            config = f.read()
        put("hf_config", "moetron_%s.json" % family, config)
        # the same without the moetron section: a plain Hugging Face config of the family
        plain = json.loads(config)
        plain.pop("moetron", None)
        put("hf_config", "plain_%s.json" % family, json.dumps(plain, indent=2))
        # every train flag with the value the checkpoint recorded, as a command line
        words = ["train"]
        for name, value in json.loads(config)["moetron"]["flags"].items():
            if isinstance(value, bool):
                words.append("--" + name if value else "--no-" + name)
            elif value != "" and name != "load":
                words += ["--" + name, str(value)]
        put("args", "all_flags_%s" % family, "\n".join(words))
        if family == "mixtral":
            put("json", "config.json", config)
            with open(os.path.join(it, "trainer_state.json"), "rb") as f:
                state = f.read()
            put("trainer_state", "trainer_state.json", state)
            put("json", "trainer_state.json", state)
            with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "rb") as f:
                put("trainer_state", "latest.txt", f.read())
            with open(os.path.join(it, "model.safetensors"), "rb") as f:
                model = f.read()
            put("safetensors", "moetron_model.safetensors", model)
            with open(os.path.join(it, "checksums.json"), "rb") as f:
                checksums_seeds(f.read(), model)
    shard_index_seeds(moetron, tmp)


def checksums_input(manifest, data):
    """The fuzz_checksums layout: u32 len(checksums.json), checksums.json, model.safetensors."""
    if isinstance(manifest, str):
        manifest = manifest.encode()
    return struct.pack("<I", len(manifest)) + manifest + data


def checksums_seeds(manifest, model):
    """checksums.json as moetron wrote it (it lists files the target's directory lacks), the same
    reduced to model.safetensors (verifies), and small hand-made ones."""
    put("checksums", "moetron_full", checksums_input(manifest, model))
    only = json.loads(manifest)
    only["files"] = {"model.safetensors": only["files"]["model.safetensors"]}
    put("checksums", "moetron_model_only", checksums_input(json.dumps(only, indent=2) + "\n", model))
    small = b"\x00\x01moetron\xff"
    entry = {"bytes": len(small), "crc32": "%08x" % zlib.crc32(small)}
    put("checksums", "small", checksums_input(
        json.dumps({"algorithm": "crc32", "files": {"model.safetensors": entry}}, separators=(",", ":")), small))
    put("checksums", "empty_file", checksums_input(
        '{"algorithm": "crc32", "files": {"model.safetensors": {"bytes": 0, "crc32": "00000000"}}}', b""))
    put("checksums", "no_files", checksums_input('{"algorithm": "crc32", "files": {}}', small))
    wrong = dict(entry, crc32="%08x" % (zlib.crc32(small) ^ 1))
    put("checksums", "crc_mismatch", checksums_input(
        json.dumps({"algorithm": "crc32", "files": {"model.safetensors": wrong}}), small))


# The tiny sharded checkpoint of fuzz_shard_index.c: the flags of its fixture are TINY,
# FAMILIES["mixtral"] and these, so that the index moetron writes names its shards and tensors.
SHARDED = ["--max-shard-size", "8KB"]


def shard_index_seeds(moetron, tmp):
    """model.safetensors.index.json of the fixture's checkpoint as moetron writes it, and the
    same in other layouts Hugging Face indexes use (all of them load)."""
    save = os.path.join(tmp, "ck_sharded")
    run(moetron, "train", *TINY, *FAMILIES["mixtral"], *SHARDED, "--save", save)
    with open(os.path.join(save, "iter_0000001", "model.safetensors.index.json"), "rb") as f:
        index = f.read()
    put("shard_index", "moetron_index.json", index)
    parsed = json.loads(index)
    put("shard_index", "compact.json", json.dumps(parsed, separators=(",", ":")))
    weight_map = parsed["weight_map"]
    put("shard_index", "hf_reversed.json", json.dumps(
        {"metadata": {"total_size": parsed["metadata"]["total_size"]},
         "weight_map": dict(reversed(list(weight_map.items())))}, indent=2))
    put("shard_index", "weight_map_only.json", json.dumps({"weight_map": weight_map}))


def safetensors_file(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, 1e-30, -7.0)
    put("safetensors", "f32.safetensors", safetensors_file([("w", "F32", [2, 3], f32)], {"format": "pt"}))
    put("safetensors", "dtypes.safetensors", safetensors_file([
        ("a.f64", "F64", [2], struct.pack("<2d", 1.5, -2.0)),
        ("b.f16", "F16", [3], struct.pack("<3H", 0x3C00, 0x7C00, 0x0001)),
        ("c.bf16", "BF16", [2, 2], struct.pack("<4H", 0x3F80, 0xC000, 0x7FC0, 0x0000)),
        ("d.e4m3", "F8_E4M3", [4], bytes([0x38, 0x7F, 0x01, 0xB8])),
        ("e.e5m2", "F8_E5M2", [4], bytes([0x3C, 0x7C, 0x01, 0xBC])),
        ("f.i64", "I64", [1], struct.pack("<q", -5)),
        ("g.i32", "I32", [2], struct.pack("<2i", 7, -1)),
        ("h.i16", "I16", [1], struct.pack("<h", 3)),
        ("i.i8", "I8", [2], bytes([1, 255])),
        ("j.u8", "U8", [], bytes([9])),
        ("k.bool", "BOOL", [2], bytes([0, 1])),
        ("l.empty", "F32", [0, 4], b""),
    ], {"format": "pt", "step": "10"}))
    put("safetensors", "empty.safetensors", safetensors_file([], {}))
    put("safetensors", "no_metadata.safetensors", safetensors_file([("x", "F32", [], struct.pack("<f", 2.0))]))


def indexed_pair(dtype_code, fmt, docs):
    """A Megatron .idx/.bin pair packed as the fuzz target reads it: u32 len(idx), idx, bin."""
    lengths, pointers, doc_idx, binary, at = [], [], [0], b"", 0
    size = struct.calcsize("<" + fmt)
    for doc in docs:
        for seq in doc:
            lengths.append(len(seq))
            pointers.append(at)
            raw = struct.pack("<%d%s" % (len(seq), fmt), *seq)
            binary += raw
            at += len(raw)
        doc_idx.append(len(lengths))
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([dtype_code])
    idx += struct.pack("<QQ", len(lengths), len(doc_idx))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_idx), *doc_idx)
    assert at == len(binary) and size
    return struct.pack("<I", len(idx)) + idx + binary


def indexed_seeds(moetron, tmp):
    docs = [[[1, 2, 3], [4, 5]], [[6]], [[], [7, 8, 9, 10]]]
    for code, fmt, name in [(1, "B", "uint8"), (2, "b", "int8"), (3, "h", "int16"), (4, "i", "int32"),
                            (5, "q", "int64"), (6, "d", "float64"), (7, "f", "float32"), (8, "H", "uint16")]:
        put("indexed", "%s.bin" % name, indexed_pair(code, fmt, docs))
    put("indexed", "empty_dataset.bin", indexed_pair(8, "H", []))
    # a dataset and its tokenizer written by moetron prepare
    text = os.path.join(tmp, "in.jsonl")
    with open(text, "w") as f:
        for line in ["The quick brown fox.", "jumps over the lazy dog", "It's 12:45; caf\u00e9 \u65e5\u672c."]:
            f.write(json.dumps({"text": line, "title": line[:5]}) + "\n")
    prefix = os.path.join(tmp, "prep")
    run(moetron, "prepare", "--input", text, "--json-keys", "text,title", "--vocab-size", "300", "--append-eod",
        "--output-prefix", prefix)
    with open(prefix + "_text_document.idx", "rb") as f:
        idx = f.read()
    with open(prefix + "_text_document.bin", "rb") as f:
        binary = f.read()
    put("indexed", "prepared.bin", struct.pack("<I", len(idx)) + idx + binary)
    with open(prefix + "_tokenizer.json") as f:
        return json.load(f)


LLAMA3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2 = LLAMA3.replace("\\p{N}{1,3}", "\\p{N}")
GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"


def split(regex, prefix_space=False):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": prefix_space, "trim_offsets": False, "use_regex": False}]}


def tokenizer_seeds(tok):
    dump = lambda t: json.dumps(t, ensure_ascii=False, indent=1)
    put("tokenizer_json", "trained.json", dump(tok))
    n = max(tok["model"]["vocab"].values()) + 1
    t = json.loads(json.dumps(tok))
    t["normalizer"] = {"type": "NFC"}
    t["pre_tokenizer"] = split(LLAMA3, True)
    t["added_tokens"] += [
        {"id": n, "content": "<s>", "special": True, "normalized": False, "lstrip": True, "rstrip": True},
        {"id": n + 1, "content": "caf\u00e9", "special": False, "normalized": True, "lstrip": True,
         "rstrip": False, "single_word": False}]
    t["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [n], "tokens": ["<s>"]}}}
    put("tokenizer_json", "llama3_nfc_template.json", dump(t))
    t = json.loads(json.dumps(tok))
    t["pre_tokenizer"] = split(QWEN2)
    t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    t["post_processor"] = {"type": "Sequence", "processors": [{"type": "ByteLevel"}]}
    t["model"]["ignore_merges"] = True
    t["model"]["merges"] = [" ".join(m) for m in t["model"]["merges"]]
    put("tokenizer_json", "qwen2_string_merges.json", dump(t))
    t = json.loads(json.dumps(tok))
    t["pre_tokenizer"] = split(GPT2)
    t["model"]["unk_token"] = "<|endoftext|>"
    t["model"]["fuse_unk"] = True
    t["padding"] = {"strategy": "BatchLongest"}
    put("tokenizer_json", "gpt2_split_unk.json", dump(t))
    # the smallest tokenizer: the byte alphabet without merges
    t = json.loads(json.dumps(tok))
    t["model"]["merges"] = []
    t["model"]["vocab"] = {k: v for k, v in t["model"]["vocab"].items() if v < 256}
    t["added_tokens"] = []
    put("tokenizer_json", "bytes_only.json", json.dumps(t, ensure_ascii=False))


def text_seeds():
    texts = {
        "english": "Hello world! It's 2024, we've got 1234567 reasons; they'll say \"yes\".",
        "unicode": "caf\u00e9 cafe\u0301 \u65e5\u672c\u8a9e \u043f\u0440\u0438\u0432\u0435\u0442 \U0001F600\U0001F600 \u017ft",
        "whitespace": "  a\r\n\r\n\tb   \n\n\n  \u00a0\u2003x  ",
        "added": "<|endoftext|> the <s>  caf\u00e9 the end<|endoftext|>",
        "digits": "3.14159 1000000 \u0661\u0662\u0663 \u2460",
    }
    for i, (name, text) in enumerate(texts.items()):
        put("tokenizer_encode", name, bytes([i % 3]) + text.encode())
    put("tokenizer_encode", "invalid_utf8", bytes([0]) + b"ab\xff\xfe\xc3 \xe6\x97 \xf0\x9f\x98 \xed\xa0\x80")
    jsonl = ('{"text": "The quick brown fox.", "meta": "m"}\n\n  \n'
             '{"text": ["two", "sequences", ""], "meta": ["x"]}\n{"text": "caf\\u00e9 \\ud83d\\ude00", "meta": ""}\n')
    put("prepare", "jsonl_encode", bytes([0b00000]) + jsonl.encode())
    put("prepare", "jsonl_two_keys_eod", bytes([0b01010]) + jsonl.encode())
    put("prepare", "jsonl_count", bytes([0b00100]) + jsonl.encode())
    txt = "First paragraph\nstill first.\r\n\r\nSecond \u00e9 paragraph\n \t \nthird\n"
    put("prepare", "txt_encode", bytes([0b00001]) + txt.encode())
    put("prepare", "txt_count_eod", bytes([0b00111]) + txt.encode())


def json_seeds():
    put("json", "types.json", '{"n": null, "t": true, "f": false, "i": -42, "big": 18446744073709551616, '
        '"d": 2.5e-3, "s": "hi", "a": [1, [2, {}], []], "o": {"x": {"y": 1}}}')
    put("json", "escapes.json", '["\\"\\\\\\/\\b\\f\\n\\r\\t", "\\u00e9\\ud83d\\ude00\\ud800x\\u0000", "caf\u00e9"]')
    put("json", "numbers.json", "[0, -0, 1e308, -1.5E-7, 9223372036854775807, -9223372036854775808, 0.1]")
    put("json", "nested.json", "[" * 40 + "]" * 40)
    put("json", "jsonl.json", '{"step": 1, "loss": 2.5}')
    put("trainer_state", "zero.json", '{"iteration": 0, "consumed_train_samples": 0, "optimizer_step": 0}')
    put("trainer_state", "float.json", '{"iteration": 10.0, "consumed_train_samples": 1e3, "optimizer_step": 10}')
    put("trainer_state", "latest_newline.txt", "10\r\n")


def args_seeds():
    lines = {
        "defaults": "train",
        "shape": "train\n--num-layers\n2\n--hidden-size\n64\n--num-attention-heads\n4\n--num-experts\n4\n"
                 "--moe-router-topk\n2\n--seq-length\n64",
        "router": "train\n--moe-router-score-function\nsigmoid\n--moe-router-enable-expert-bias\n"
                  "--moe-router-num-groups\n2\n--moe-router-group-topk\n1\n--moe-router-topk\n2\n"
                  "--moe-router-load-balancing-type\naux_loss\nseq_aux_loss\n--moe-aux-loss-coeff\n0.01\n0.001\n"
                  "--moe-z-loss-coeff=0.001\n--moe-expert-capacity-factor\n1.5\n--moe-pad-expert-input-to-capacity",
        "mla": "train\n--multi-latent-attention\n--kv-lora-rank\n16\n--q-lora-rank\n0\n--qk-head-dim\n8\n"
               "--qk-pos-emb-head-dim\n4\n--v-head-dim\n8",
        "schedule": "train\n--lr\n1e-3\n--min-lr\n1e-4\n--lr-decay-style\nWSD\n--lr-wsd-decay-style\nminus_sqrt\n"
                    "--train-iters\n100\n--lr-warmup-iters\n10\n--split\n90,5,5\n--max-shard-size\n500MB",
        "layers": "train\n--num_layers\n4\n--moe-layer-freq\n[0,1,1,1]\n--no-check-for-nan-in-loss-and-grad",
        "data": "data\n--data-path\n0.3\nA\n0.7\nB\n--seq-length\n32\n--num-samples\n4",
        "generate": "generate\n--load\nckpt\n--prompt\nhello\n--temperature\n0.7\n--top-k\n20",
        "prepare": "prepare\n--input\nx.jsonl\n--json-keys\ntext,title\n--vocab-size\n1000\n--workers\n2",
        "bad": "train\n--num-layers\nabc",
    }
    for name, text in lines.items():
        put("args", name, text)


def quoted_words(*sources):
    """The identifiers in double quotes in these source files (JSON keys and values the parser knows)."""
    words = set()
    for src in sources:
        with open(os.path.join(HERE, "..", "..", src)) as f:
            words |= set(re.findall(r'"([A-Za-z_][A-Za-z0-9_.-]*)"', f.read()))
    return sorted(words)


def dictionaries():
    """libFuzzer dictionaries: the keys and values each parser knows, and numbers at the limits."""
    json_tokens = ["{", "}", "[", "]", ":", ",", "true", "false", "null", '"', "\\u", "\\ud800", "\\udc00",
                   "\\u0000", "\\\\", "1e308", "-0", "0.5", "-1", "2147483647", "2147483648", "4294967296",
                   "9223372036854775807", "9223372036854775808", "18446744073709551616", "300", "257"]
    numbers = ["0", "1", "-1", "2147483647", "-2147483648", "2147483648", "4294967296", "9223372036854775807",
               "1e308", "1e-308", "nan", "inf", "-0", "0x10", "300", "65536"]

    def entry(w):
        raw = w.encode() if isinstance(w, str) else w
        return '"%s"' % "".join("\\\\" if b == 0x5C else '\\"' if b == 0x22 else chr(b) if 32 <= b < 127
                                else "\\x%02x" % b for b in raw)

    def write(target, words):
        with open(os.path.join(HERE, target + ".dict"), "w") as f:
            f.write("# libFuzzer dictionary of fuzz_%s, written by tests/fuzz/make_seeds.py\n" % target)
            for w in dict.fromkeys(words):
                f.write(entry(w) + "\n")

    quoted = lambda words: ['"%s"' % w for w in words]
    write("json", json_tokens)
    write("hf_config", json_tokens + quoted(quoted_words("src/hf/hf_config_read.c", "src/hf/hf_config.c",
                                                         "src/core/args.c")))
    write("trainer_state", json_tokens + numbers + quoted(["iteration", "consumed_train_samples", "optimizer_step"]))
    write("safetensors", json_tokens + quoted(["dtype", "shape", "data_offsets", "__metadata__", "format", "pt"]) +
          quoted(["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL"]) +
          [bytes(8), b"\xff" * 8])
    write("tokenizer_json", json_tokens + quoted(quoted_words("src/tokenizer/tokenizer_load.c")) +
          [json.dumps(r) for r in (LLAMA3, QWEN2, GPT2)])
    write("checksums", json_tokens + quoted(["algorithm", "crc32", "files", "bytes", "model.safetensors",
                                             "checksums.json", "config.json", "00000000", "ffffffff", "/", "."]) +
          [bytes(4), b"\xff\xff\xff\x7f", b"\x00\x01\x00\x00"])
    with open(os.path.join(CORPUS, "shard_index", "moetron_index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    write("shard_index", json_tokens + quoted(["weight_map", "metadata", "total_size", "total_parameters",
                                               "model.safetensors", ".", "..", "/"]) +
          quoted(sorted(set(weight_map.values()))) + quoted(sorted(weight_map)))
    write("indexed", [b"MMIDIDX\x00\x00", b"\x01" + bytes(7), b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff" * 8])
    with open(os.path.join(HERE, "..", "..", "src/core/args.c")) as f:
        flags = sorted(set(re.findall(r'F\("([a-z0-9-]+)"', f.read())))
    write("args", ["--" + f for f in flags] + ["--no-", "=", "\n"] + numbers + quoted_words("src/core/args.c"))
    write("prepare", ['{"text": ', '{"text": [', '{"meta": ', "\n\n", "\r\n", " \t", "\\u", "\\ud83d\\ude00", '"}'])
    write("tokenizer_encode", ["'s", "'S", "'ll", "'re", "'ve", "'d", "'m", "<|endoftext|>", "<s>", "caf\u00e9",
                               "e\u0301", "\u017f", "\r\n", "\u00a0", "\u2003", "\u3000", "123", "\u0661",
                               "\U0001F600", " the", b"\xff", b"\xed\xa0\x80"])


def main():
    moetron = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/moetron")
    for target in os.listdir(CORPUS) if os.path.isdir(CORPUS) else []:
        shutil.rmtree(os.path.join(CORPUS, target))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints(moetron, tmp)
        tokenizer_seeds(indexed_seeds(moetron, tmp))
    safetensors_seeds()
    text_seeds()
    json_seeds()
    args_seeds()
    dictionaries()
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        print("%-18s %3d files %8d bytes" % (target, len(files), size))


if __name__ == "__main__":
    main()
