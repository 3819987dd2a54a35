#!/usr/bin/env python3
"""Megatron's --tokenizer-type tokenizers against their reference libraries, on random Unicode.

usage: tokenizer_types.py TOKENIZE_PROBE

Everything is trained here on generated text (mixed scripts, emoji, combining marks,
whitespace runs, digits), small and fast:
  sp_bpe, sp_bpe_nofallback, sp_unigram, sp_unigram_nofallback, sp_unigram_nfkc
      SentencePiece models (sentencepiece.SentencePieceTrainer: BPE / UNIGRAM, with and
      without byte_fallback, identity normalization and the default nmt_nfkc character map,
      a user-defined symbol) against SentencePieceProcessor.encode
  hf_llama2     tokenizer.json as Llama-2 / Mixtral: BPE with byte_fallback, normalizer
                Sequence[Prepend("▁"), Replace(" ", "▁")], the Replace/ByteFallback/Fuse/Strip decoder
  hf_metaspace  the newer form: pre_tokenizer Metaspace(prepend_scheme="first", split=False)
  hf_deepseek   DeepSeek-V3's Sequence[Split x3, ByteLevel], with single_word added tokens
  gpt2_files    vocab.json + merges.txt against ByteLevelBPETokenizer(vocab, merges)
  null          NullTokenizer: the ids of the text
Each: build/tokenize_probe's ids equal the library's on every text; decode(ids) equals the
library's decode where the text is valid UTF-8. Malformed .model files give one error line.
Prints `ok <name>` or `FAIL <name>: <why>`; exits non-zero on any failure.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

try:
    import sentencepiece as spm
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.implementations import ByteLevelBPETokenizer
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tokenizer_conformance import probe_json  # build/tokenize_probe --json on a list of texts
except ImportError as exc:
    print("FAIL setup: python3 with sentencepiece and tokenizers is required (%s)" % exc)
    sys.exit(1)

failures = 0
DEEPSEEK = [r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
            r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""]


def report(name, problem):
    global failures
    if problem:
        failures += 1
    print("FAIL %s: %s" % (name, problem) if problem else "ok %s" % name)
    sys.stdout.flush()


# ---- generated text -------------------------------------------------------------------------

WORDS = ["the", "cat", "sat", "on", "mat", "hello", "world", "experts", "router", "token", "Model", "über", "café",
         "naïve", "Ελληνικά", "русский", "中文字符", "日本語のテキスト", "カタカナ", "한국어", "مرحبا", "हिन्दी", "ไทย"]
PIECES = ["😀", "👍🏽", "👨‍👩‍👧", "❤️", "e\u0301", "a\u0323\u0301", "\u0301", "ﬁ", "Ｆｕｌｌ", "①", "½", "²", "٣٤",
          "(", ")", "!!", "...", "'s", "don't", "_", "@x", "#tag", "$5", "\t", "\n", "\r\n", "  ", "   ", "\u3000",
          "\u00a0", "\u200d", "x_y", "a1b2", "2024", "3.14159", "1234567"]


def sentence(rng):
    out = []
    for _ in range(rng.randrange(2, 14)):
        r = rng.random()
        out.append(rng.choice(WORDS) if r < 0.55 else rng.choice(PIECES) if r < 0.85 else str(rng.randrange(10 ** 6)))
        out.append(rng.choice([" ", " ", " ", "", "  ", "\n"]))
    return "".join(out)


def random_unicode(rng, count):
    """Random assigned characters of many scripts mixed with spaces, digits and marks."""
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF),
              (0x3000, 0x30FF), (0x4E00, 0x4F00), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F)]
    texts = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randrange(1, 40)):
            if rng.random() < 0.3:
                chars.append(rng.choice(" \t\n  0123456789'_"))
            else:
                lo, hi = rng.choice(blocks)
                c = chr(rng.randrange(lo, hi + 1))
                if not (0xD800 <= ord(c) <= 0xDFFF):
                    chars.append(c)
        texts.append("".join(chars))
    return texts


def texts_for_tests(seed):
    rng = random.Random(seed)
    edge = ["", " ", "   ", "a", " a", "a ", "  a  b  ", "\t x", "x\n\ny", "ab" * 200, "😀" * 30, "e\u0301",
            "hello <sep> world", "<sep>", "x<sep>y", " <sep> ", "[NEW] a[NEW] [NEW]b [NEW]", "1234567 89",
            "日本語のテキストとカタカナ", "a\u0301\u0302 b", "don't I'M", "@abc #def", "  \n  \n", "\u3000\u3000x"]
    return edge + [sentence(rng) for _ in range(150)] + random_unicode(rng, 250)


# ---- helpers --------------------------------------------------------------------------------

def compare(name, probe, spec, texts, encode, decode, tmp):
    results, problem = probe_json(probe, spec, texts, tmp)
    if problem:
        return report(name, problem)
    for text, (ids, decoded) in zip(texts, results):
        want = encode(text)
        if ids != want:
            at = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
            return report(name, "encode(%a) differs at token %d: moetron %s, reference %s" %
                          (text[:80], at, ids[at:at + 6], want[at:at + 6]))
        got = decoded
        if decode and got.startswith(b" ") and spec_strips(spec):
            got = got[1:]
        if decode is not None:
            try:
                got_text = got.decode("utf-8")
            except UnicodeDecodeError:
                continue
            ref = decode(want)
            if got_text != ref and "\ufffd" not in ref:
                return report(name, "decode of encode(%a): moetron %a, reference %a" % (text[:60], got_text[:80], ref[:80]))
    report(name, None)


def spec_strips(spec):
    return spec.startswith(("sp:", "null:")) or spec.endswith("llama2.json") or spec.endswith("metaspace.json")


# ---- SentencePiece ----------------------------------------------------------------------------

def train_sp(tmp, name, corpus_path, model_type, byte_fallback, rule):
    prefix = os.path.join(tmp, name)
    spm.SentencePieceTrainer.train(input=corpus_path, model_prefix=prefix, model_type=model_type, vocab_size=400,
                                   byte_fallback=byte_fallback, normalization_rule_name=rule,
                                   character_coverage=0.995, user_defined_symbols=["<sep>"],
                                   num_threads=1, minloglevel=2)
    return prefix + ".model"


def check_sentencepiece(probe, tmp, texts, corpus_path):
    cases = [("sp_bpe", "bpe", True, "identity"), ("sp_bpe_nofallback", "bpe", False, "identity"),
             ("sp_unigram", "unigram", True, "identity"), ("sp_unigram_nofallback", "unigram", False, "identity"),
             ("sp_unigram_nfkc", "unigram", True, "nmt_nfkc"), ("sp_bpe_nfkc", "bpe", True, "nmt_nfkc")]
    models_made = {}
    for name, model_type, fallback, rule in cases:
        path = train_sp(tmp, name, corpus_path, model_type, fallback, rule)
        models_made[name] = path
        sp = spm.SentencePieceProcessor(model_file=path)
        compare(name, probe, "sp:" + path, texts, lambda t: sp.encode(t), lambda ids: sp.decode(ids), tmp)
    return models_made


def check_malformed_models(probe, tmp, good_path):
    with open(good_path, "rb") as f:
        good = f.read()
    text_path = os.path.join(tmp, "hello.txt")
    with open(text_path, "w") as f:
        f.write("hello")
    cases = {"empty": b"", "truncated": good[:len(good) // 2], "garbage": bytes(range(256)) * 4,
             "json": b'{"model": {}}', "group_wire": b"\x0b\x0c", "long_length": b"\x0a\xff\xff\xff\xff\x0f"}
    problems = []
    for name, content in cases.items():
        path = os.path.join(tmp, "bad_%s.model" % name)
        with open(path, "wb") as f:
            f.write(content)
        r = subprocess.run([probe, "sp:" + path, text_path], capture_output=True, timeout=60)
        err = r.stderr.decode(errors="replace").strip().split("\n")
        if r.returncode != 1 or len(err) != 1 or path not in err[0] or not err[0].startswith("moetron: error: "):
            problems.append("%s: exit %d, stderr %r" % (name, r.returncode, err[:3]))
    report("sp_malformed_models", "; ".join(problems))


# ---- tokenizer.json ---------------------------------------------------------------------------

def hf_llama2(corpus, metaspace):
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bytes_ = ["<0x%02X>" % b for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"] + bytes_,
                                  show_progress=False, limit_alphabet=120)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken("<sep>", special=True, normalized=False)])
    return tok


def hf_deepseek(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in DEEPSEEK] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<｜end▁of▁sentence｜>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken("[NEW]", single_word=True, normalized=False),
                    AddedToken("<sep>", single_word=True, special=True, lstrip=True)])
    return tok


def check_tokenizer_json(probe, tmp, texts, corpus):
    for name, tok in (("hf_llama2", hf_llama2(corpus, False)), ("hf_metaspace", hf_llama2(corpus, True)),
                      ("hf_deepseek", hf_deepseek(corpus))):
        path = os.path.join(tmp, name.replace("hf_", "") + ".json")
        tok.save(path)
        ref = Tokenizer.from_file(path)
        compare(name, probe, path, texts, lambda t: ref.encode(t).ids,
                lambda ids: ref.decode(ids, skip_special_tokens=False), tmp)


def check_gpt2_files(probe, tmp, texts, corpus):
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus, vocab_size=800, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save_model(tmp, "gpt2")
    vocab, merges = os.path.join(tmp, "gpt2-vocab.json"), os.path.join(tmp, "gpt2-merges.txt")
    ref = ByteLevelBPETokenizer(vocab, merges)
    compare("gpt2_files", probe, "gpt2:%s,%s" % (vocab, merges), texts, lambda t: ref.encode(t).ids,
            lambda ids: ref.decode(ids, skip_special_tokens=False), tmp)


def check_null(probe, tmp):
    rng = random.Random(7)
    texts = [" ".join(str(rng.randrange(1000)) for _ in range(rng.randrange(1, 30))) for _ in range(50)]
    compare("null", probe, "null:1000", texts, lambda t: [int(x) for x in t.split(" ")],
            lambda ids: " ".join(str(i) for i in ids), tmp)
    path = os.path.join(tmp, "bad_null.txt")
    with open(path, "w") as f:
        f.write("12 x7 3")
    r = subprocess.run([probe, "null:1000", path], capture_output=True, timeout=60)
    err = r.stderr.decode().strip().split("\n")
    report("null_bad_text", None if r.returncode == 1 and len(err) == 1 and "x7" in err[0] else
           "exit %d, stderr %r" % (r.returncode, err))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    probe = sys.argv[1]
    rng = random.Random(3)
    corpus = [sentence(rng) for _ in range(1500)]
    texts = texts_for_tests(5)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = os.path.join(tmp, "corpus.txt")
        with open(corpus_path, "w", encoding="utf-8") as f:
            f.write("\n".join(c.replace("\n", " ") for c in corpus))
        made = check_sentencepiece(probe, tmp, texts, corpus_path)
        check_malformed_models(probe, tmp, made["sp_bpe"])
        check_tokenizer_json(probe, tmp, texts, corpus)
        check_gpt2_files(probe, tmp, texts, corpus)
        check_null(probe, tmp)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
