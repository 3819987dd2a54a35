#!/usr/bin/env python3
"""`moetron prepare` against Hugging Face `tokenizers` and Megatron-Core's IndexedDataset.

usage: prepare_conformance.py MOETRON

Everything is generated here (a seeded corpus of made-up words with punctuation, numbers,
accents, CJK, emoji, newlines and runs of spaces), in a temporary directory:
  train          --vocab-size 600 on a .jsonl with keys text and title (about 1.5 MB, so
                 several batches): the tokenizer.json loads in `tokenizers` with exactly
                 600 tokens, and `tokenizers`' ids + <|endoftext|> are every document of
                 Megatron-Core's IndexedDataset, in order; empty documents have no
                 sequence (as Megatron's preprocess_data.py); the first merges are those of
                 a BPE written here (most frequent pair, ties to the smaller ids), and all
                 merges are those of `tokenizers`' BpeTrainer on the same documents
  workers        --workers 1 and 3 give byte-identical files to --workers 2
  tokenizer      --tokenizer-model with a tokenizer trained by `tokenizers`: its ids; an
                 array of strings is one sequence per string (EOD after the last); no
                 --append-eod, no EOD
  int32          a vocabulary above 65500 writes int32 tokens
  txt            a .txt input: one document per paragraph (blank-line separated, CRLF,
                 whitespace-only lines, no final newline), with a given and a trained tokenizer
  errors         invalid JSON (its line number, also deep in the file after output began),
                 a missing key, a non-string value, no tokenizer and no --vocab-size, a
                 missing input, an unknown extension, a too small --vocab-size, --append-eod
                 without an end-of-document token, no document at all, a key whose every
                 value is empty (Megatron-Core cannot open an empty .bin): exit status 1,
                 one error line, no file left behind and an existing output untouched

Prints `ok <name>` or `FAIL <name>: <why>`; exits non-zero on any failure.
"""

import collections
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
except ImportError as exc:
    print("FAIL setup: python3 with tokenizers and numpy is required (%s)" % exc)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_conformance as shared  # noqa: E402  report() and its failure count

MOETRON = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MOETRON", "build/moetron"))
EOD = "<|endoftext|>"
report = shared.report


def load_indexed(prefix):
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # torch's "No CUDA runtime" on import
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    return IndexedDataset(prefix)


def prepare(*args, cwd):
    return subprocess.run([MOETRON, "prepare", *args], cwd=cwd, capture_output=True, text=True)


# ---- generated data ----------------------------------------------------------------------

SYLLABLES = ["ka", "to", "ri", "men", "sa", "lo", "qu", "ex", "an", "der", "ing", "th", "ou", "ve", "ly", "st"]
EXTRAS = ["it's", "don't", "we'll", "café", "naïve", "Ångström", "中文字符", "東京", "😀", "🚀🚀", "12", "3.14",
          "1999", "(x)", "--", "!!", "...", "\"quoted\"", "Hello", "WORLD", "e-mail", "a/b"]
SPACES = [" "] * 12 + ["  ", "\t", "\n", "   ", " \n"]


def sentence(rng, n):
    out = []
    for _ in range(n):
        if rng.random() < 0.12:
            out.append(rng.choice(EXTRAS))
        else:
            out.append("".join(rng.choice(SYLLABLES) for _ in range(rng.choice([1, 1, 2, 2, 3, 4]))))
        out.append(rng.choice(SPACES))
    return "".join(out).strip(" ") + rng.choice([".", "!", "?", ",", ""])


def make_jsonl(path, lines, seed):
    rng = random.Random(seed)
    records = []
    for i in range(lines):
        text = " ".join(sentence(rng, rng.randrange(3, 25)) for _ in range(rng.randrange(1, 6)))
        title = "" if i % 97 == 5 else sentence(rng, rng.randrange(1, 5))
        sents = [sentence(rng, rng.randrange(1, 8)) for _ in range(rng.randrange(0, 4))] + ([""] if i % 7 == 0 else [])
        records.append({"id": i, "text": text, "title": title, "sents": sents})
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=rng.random() < 0.5) + "\n")
            if rng.random() < 0.01:
                f.write("   \n")  # whitespace-only lines are skipped
    return records


def make_txt(path, paragraphs, seed):
    rng = random.Random(seed)
    parts = []
    for i in range(paragraphs):
        lines = [sentence(rng, rng.randrange(2, 12)).replace("\n", " ") for _ in range(rng.randrange(1, 5))]
        if i % 5 == 0:
            lines[0] = "  " + lines[0]  # leading spaces belong to the document
        eol = "\r\n" if i % 4 == 1 else "\n"
        parts.append(eol.join(lines))
        parts.append(rng.choice(["\n\n", "\n\n\n", "\n  \n", "\n\t\n\n", "\r\n\r\n", "\n \r\n"]))
    text = "\n\n" + "".join(parts) + "last paragraph without a final newline"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return text.encode("utf-8")


def txt_documents(data):
    """The .txt rule: a document per paragraph (maximal run of lines that are not blank), as
    its bytes without the line break after its last line."""
    docs, start, stop, pos = [], None, None, 0
    while pos <= len(data):
        nl = data.find(b"\n", pos)
        end = nl if nl >= 0 else len(data)
        if pos < len(data) and data[pos:end].strip(b" \t\r\v\f"):
            if start is None:
                start = pos
            stop = end - 1 if nl >= 0 and end > pos and data[end - 1:end] == b"\r" else end
        elif start is not None:
            docs.append(data[start:stop].decode("utf-8"))
            start = None
        if pos == len(data):
            break
        pos = end + 1 if nl >= 0 else len(data)
    return docs


# ---- checks ------------------------------------------------------------------------------


def check_dataset(prefix, sequences_per_doc, dtype=np.uint16):
    """sequences_per_doc: for each document, its list of expected token-id sequences."""
    ds = load_indexed(prefix)
    want = [s for doc in sequences_per_doc for s in doc]
    if ds.index.dtype != dtype:
        return "dtype %s, expected %s" % (ds.index.dtype, dtype)
    if len(ds) != len(want):
        return "%d sequences, expected %d" % (len(ds), len(want))
    bounds = np.cumsum([0] + [len(doc) for doc in sequences_per_doc])
    if not np.array_equal(ds.document_indices, bounds):
        return "document_indices differ from the expected %s..." % bounds[:8].tolist()
    for i, seq in enumerate(want):
        got = ds[i].tolist()
        if got != seq:
            return "sequence %d: %s..., expected %s..." % (i, got[:12], seq[:12])
    return None


def encode_docs(tok, texts, eod):
    """Megatron's rule: a document's non-empty sequences, the EOD after the last."""
    out = []
    for seqs in texts:
        ids = [e.ids for e in tok.encode_batch(seqs)] if seqs else []
        ids = [s for s in ids if s]
        if ids and eod is not None:
            ids[-1] = ids[-1] + [eod]
        out.append(ids)
    return out


def reference_merges(corpus_texts, count):
    """The first `count` merges of the BPE rule in bpe_train.h, computed naively."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = collections.Counter()
    for text in corpus_texts:
        for piece, _ in pre.pre_tokenize_str(text):
            words[piece] += 1
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    ids = {c: i for i, c in enumerate(alphabet)}
    tokens = list(alphabet)
    split = {w: [ids[c] for c in w] for w in words}
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for w, syms in split.items():
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = tokens[best[0]] + tokens[best[1]]
        if merged not in ids:
            ids[merged] = len(tokens)
            tokens.append(merged)
        x = ids[merged]
        merges.append((tokens[best[0]], tokens[best[1]]))
        for w, syms in split.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == best:
                    out.append(x)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            split[w] = out
    return merges


def merges_of(path):
    with open(path, encoding="utf-8") as f:
        return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in json.load(f)["model"]["merges"]]


def files_in(d):
    return sorted(os.listdir(d))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_train(d, records):
    r = prepare("--input", "gen.jsonl", "--json-keys", "text", "title", "--vocab-size", "600", "--append-eod",
                "--workers", "2", "--output-prefix", "P", cwd=d)
    if r.returncode:
        return report("train", "exit %d: %s" % (r.returncode, r.stderr.strip()[-400:]))
    want_files = ["P_text_document.bin", "P_text_document.idx", "P_title_document.bin", "P_title_document.idx",
                  "P_tokenizer.json", "gen.jsonl"]
    if files_in(d) != want_files:
        return report("train", "files %s, expected %s" % (files_in(d), want_files))
    if "tokenizing" not in r.stdout or "100%" not in r.stdout:  # core/progress.h: on stdout
        return report("train", "no progress lines on stdout: %r" % r.stdout[-300:])
    tok = Tokenizer.from_file(os.path.join(d, "P_tokenizer.json"))
    if tok.get_vocab_size() != 600:
        return report("train", "vocabulary %d, expected 600" % tok.get_vocab_size())
    eod = tok.token_to_id(EOD)
    if eod != 599:
        return report("train", "%s has id %s, expected 599" % (EOD, eod))
    for key in ("text", "title"):
        problem = check_dataset(os.path.join(d, "P_%s_document" % key), encode_docs(tok, [[r[key]] for r in records], eod))
        if problem:
            return report("train", "P_%s_document: %s" % (key, problem))
    sample = records[3]["text"]
    if tok.decode(tok.encode(sample).ids) != sample:
        return report("train", "decode(encode(x)) != x for %r" % sample[:60])
    merges = merges_of(os.path.join(d, "P_tokenizer.json"))
    corpus = [r["text"] for r in records] + [r["title"] for r in records]
    ref = reference_merges(corpus, 25)
    if merges[:25] != ref:
        k = next(i for i in range(25) if i >= len(merges) or merges[i] != ref[i])
        return report("train", "merge %d is %s, a BPE written here gives %s" % (k, merges[k:k + 1], ref[k]))
    train_hf_tokenizer(os.path.join(d, "hf600.json"), corpus, 600)
    hf = merges_of(os.path.join(d, "hf600.json"))
    if merges != hf:
        k = next(i for i in range(len(merges) + 1) if i >= min(len(merges), len(hf)) or merges[i] != hf[i])
        return report("train", "%d merges, tokenizers' BpeTrainer %d; the first difference is merge %d: %s vs %s"
                      % (len(merges), len(hf), k, merges[k:k + 1], hf[k:k + 1]))
    report("train", None)


def check_workers(d):
    base = {f: read(os.path.join(d, f)) for f in files_in(d) if f.startswith("P_")}
    for workers in ("1", "3"):
        r = prepare("--input", "gen.jsonl", "--json-keys", "text", "title", "--vocab-size", "600", "--append-eod",
                    "--workers", workers, "--output-prefix", "W%s" % workers, cwd=d)
        if r.returncode:
            return report("workers", "--workers %s: exit %d: %s" % (workers, r.returncode, r.stderr.strip()[-300:]))
        for name, data in base.items():
            if read(os.path.join(d, "W%s" % workers + name[1:])) != data:
                return report("workers", "--workers %s: %s differs from --workers 2" % (workers, name))
    report("workers", None)


def train_hf_tokenizer(path, texts, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(path)
    return tok


def check_tokenizer_model(d, records):
    tok = train_hf_tokenizer(os.path.join(d, "hf.json"), [r["text"] for r in records[:1500]], 900)
    r = prepare("--input", "gen.jsonl", "--json-keys", "text", "sents", "--tokenizer-model", "hf.json", "--workers",
                "2", "--output-prefix", "H", cwd=d)
    if r.returncode:
        return report("tokenizer", "exit %d: %s" % (r.returncode, r.stderr.strip()[-300:]))
    for key, texts in (("text", [[r["text"]] for r in records]), ("sents", [r["sents"] for r in records])):
        problem = check_dataset(os.path.join(d, "H_%s_document" % key), encode_docs(tok, texts, None))
        if problem:
            return report("tokenizer", "H_%s_document: %s" % (key, problem))
    r = prepare("--input", "gen.jsonl", "--json-keys", "sents", "--tokenizer-model", "hf.json", "--append-eod",
                "--output-prefix", "E", cwd=d)
    problem = r.stderr.strip()[-300:] if r.returncode else check_dataset(
        os.path.join(d, "E_sents_document"), encode_docs(tok, [r["sents"] for r in records], tok.token_to_id(EOD)))
    report("tokenizer", problem and "--append-eod with sentences: " + problem)


def check_int32(d, records):
    """A vocabulary above 65500 (unused filler tokens, EOD at 70000) is written as int32."""
    with open(os.path.join(d, "P_tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    del vocab[EOD]
    for i in range(len(vocab), 70000):
        vocab["<filler%d>" % i] = i
    vocab[EOD] = 70000
    j["added_tokens"][0]["id"] = 70000
    with open(os.path.join(d, "big.json"), "w", encoding="utf-8") as f:
        json.dump(j, f)
    tok = Tokenizer.from_file(os.path.join(d, "big.json"))
    r = prepare("--input", "gen.jsonl", "--json-keys", "title", "--tokenizer-model", "big.json", "--append-eod",
                "--output-prefix", "B", cwd=d)
    problem = r.stderr.strip()[-300:] if r.returncode else check_dataset(
        os.path.join(d, "B_title_document"), encode_docs(tok, [[r["title"]] for r in records], 70000), np.int32)
    report("int32", problem)


def check_txt(d):
    data = make_txt(os.path.join(d, "gen.txt"), 700, 7)
    docs = txt_documents(data)
    tok = Tokenizer.from_file(os.path.join(d, "P_tokenizer.json"))
    eod = tok.token_to_id(EOD)
    r = prepare("--input", "gen.txt", "--tokenizer-model", "P_tokenizer.json", "--append-eod", "--workers", "2",
                "--output-prefix", "T", cwd=d)
    if r.returncode:
        return report("txt", "exit %d: %s" % (r.returncode, r.stderr.strip()[-300:]))
    problem = check_dataset(os.path.join(d, "T_text_document"), encode_docs(tok, [[x] for x in docs], eod))
    if problem:
        return report("txt", problem)
    r = prepare("--input", "gen.txt", "--json-keys", "body", "--vocab-size", "400", "--output-prefix", "U", cwd=d)
    if r.returncode:
        return report("txt", "--vocab-size: exit %d: %s" % (r.returncode, r.stderr.strip()[-300:]))
    tok = Tokenizer.from_file(os.path.join(d, "U_tokenizer.json"))
    problem = check_dataset(os.path.join(d, "U_body_document"), encode_docs(tok, [[x] for x in docs], None))
    report("txt", problem and "--vocab-size: " + problem)


def check_errors(records):
    good_jsonl = "".join(json.dumps({"text": r["text"], "title": r["title"]}) + "\n" for r in records)
    lines = good_jsonl.splitlines(keepends=True)
    bad_deep = "".join(lines[:2999]) + '{"text": "unterminated}\n' + "".join(lines[2999:])
    cases = [
        # name, files, args, expected text in the error line
        ("invalid_json", {"in.jsonl": bad_deep}, ["--vocab-size", "500"], "in.jsonl line 3000: invalid JSON"),
        ("invalid_json_late", {"in.jsonl": bad_deep, "tok.json": None}, ["--tokenizer-model", "tok.json"],
         "in.jsonl line 3000: invalid JSON"),
        ("not_object", {"in.jsonl": lines[0] + "[1, 2]\n"}, ["--vocab-size", "500"], "in.jsonl line 2: an array"),
        ("missing_key", {"in.jsonl": good_jsonl, "tok.json": None},
         ["--tokenizer-model", "tok.json", "--json-keys", "text", "body"], 'in.jsonl line 1: no key "body"'),
        ("not_string", {"in.jsonl": lines[0] + lines[1] + '{"text": 12}\n', "tok.json": None},
         ["--tokenizer-model", "tok.json"], 'in.jsonl line 3: "text" is a number'),
        ("no_tokenizer", {"in.jsonl": good_jsonl}, [], "--tokenizer-model"),
        ("no_input", {}, ["--vocab-size", "500"], "nothere.jsonl: cannot open"),
        ("extension", {"in.csv": "a,b\n"}, ["--vocab-size", "500"], "name it .jsonl"),
        ("small_vocab", {"in.jsonl": good_jsonl}, ["--vocab-size", "100"], "--vocab-size 100"),
        ("no_eod", {"in.jsonl": good_jsonl, "noeod.json": None}, ["--tokenizer-model", "noeod.json", "--append-eod"],
         "no end-of-document token"),
        ("no_documents", {"in.txt": "\n  \n\t\n"}, ["--vocab-size", "300"], "holds no document"),
        ("empty_key", {"in.jsonl": '{"text": "a", "title": ""}\n', "tok.json": None},
         ["--tokenizer-model", "tok.json", "--json-keys", "text", "title"], 'every "title" is empty'),
    ]
    with tempfile.TemporaryDirectory() as src:
        tok_path = os.path.join(src, "tok.json")
        train_hf_tokenizer(tok_path, [r["text"] for r in records[:300]], 400)
        with open(tok_path, encoding="utf-8") as f:
            j = json.load(f)
        j["added_tokens"] = []
        del j["model"]["vocab"][EOD]
        noeod = json.dumps(j)
        for name, files, args, expected in cases:
            with tempfile.TemporaryDirectory() as d:
                for fname, text in files.items():
                    text = read(tok_path).decode() if fname == "tok.json" else noeod if text is None else text
                    with open(os.path.join(d, fname), "w", encoding="utf-8") as f:
                        f.write(text)
                with open(os.path.join(d, "O_text_document.bin"), "wb") as f:
                    f.write(b"old")  # an earlier output must survive a failed run
                before = files_in(d)
                inp = "nothere.jsonl" if name == "no_input" else next(f for f in files if f.startswith("in."))
                r = prepare("--input", inp, "--output-prefix", "O", *args, cwd=d)
                err = r.stderr.strip().splitlines()
                problem = None
                if r.returncode != 1:
                    problem = "exit status %d, expected 1" % r.returncode
                elif len([x for x in err if x.startswith("moetron: error:")]) != 1 or not err[-1].startswith("moetron:"):
                    problem = "expected one error line, got %r" % r.stderr[-400:]
                elif expected not in err[-1]:
                    problem = "%r does not say %r" % (err[-1], expected)
                elif files_in(d) != before:
                    problem = "files left behind: %s" % sorted(set(files_in(d)) - set(before))
                elif read(os.path.join(d, "O_text_document.bin")) != b"old":
                    problem = "the existing output was changed"
                report("errors_" + name, problem)


def main():
    if not os.path.exists(MOETRON):
        print("FAIL setup: %s not found (make first)" % MOETRON)
        return 1
    with tempfile.TemporaryDirectory() as d:
        records = make_jsonl(os.path.join(d, "gen.jsonl"), 6000, 1)
        check_train(d, records)
        check_workers(d)
        check_tokenizer_model(d, records)
        check_int32(d, records)
        check_txt(d)
        check_errors(records[:4000])
    return 1 if shared.failures else 0


if __name__ == "__main__":
    sys.exit(main())
