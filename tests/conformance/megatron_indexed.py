#!/usr/bin/env python3
"""moetron's Megatron indexed datasets (.bin/.idx) against Megatron-Core's own.

usage: megatron_indexed.py INDEXED_PROBE [CASE ...]

For each case (a dtype and a list of documents, each a list of sequences of token ids):
  * megatron_to_moetron: Megatron-Core's IndexedDatasetBuilder writes the files (add_item +
    end_document for some documents, add_document for others); build/indexed_probe reads
    them: dtype, sequence lengths, pointers, document indices and every token must match.
  * moetron_to_megatron: build/indexed_probe writes the files; Megatron-Core's IndexedDataset
    reads them (sequence_lengths, sequence_pointers, document_indices, dtype, every token
    through ds[i], ds.get(i, offset, length) and a slice), and both files are byte-identical
    to what Megatron-Core writes for the same input.
Also: merging with add_index (Megatron) against `indexed_probe merge`, byte for byte, and
indexed_dtype_for_vocab against DType.optimal_dtype.

Prints `ok <case>` or `FAIL <case>: <why>` per case; exits non-zero on any failure.
Needs numpy, torch and megatron-core (pip install megatron-core).
"""

import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

try:
    import numpy as np
    import torch
except ImportError as exc:
    print("FAIL setup: python3 with numpy and torch is required (%s)" % exc)
    sys.exit(1)
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found"
logging.disable(logging.WARNING)
try:
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder
except Exception:  # noqa: BLE001 - any import problem of megatron-core is a setup problem
    print("FAIL setup: pip install megatron-core")
    sys.exit(1)


def random_documents(rng, n_docs, max_seqs, max_len, lo, hi):
    return [[[rng.randint(lo, hi) for _ in range(rng.randint(0, max_len))] for _ in range(rng.randint(0, max_seqs))]
            for _ in range(n_docs)]


def make_cases():
    rng = random.Random(1234)
    ranges = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767), "uint16": (0, 65535),
              "int32": (-2**31, 2**31 - 1), "int64": (-2**31, 2**31 - 1), "float32": (-2**24, 2**24),
              "float64": (-2**31, 2**31 - 1)}
    cases = []
    for dtype, (lo, hi) in ranges.items():
        docs = random_documents(rng, 12, 4, 30, lo, hi)
        docs[0] = [[lo, hi, 0], [1, lo + 1, hi - 1]]  # the extremes, several sequences in one document
        docs[3] = []                                   # an empty document
        docs[5] = [[], [7], []]                        # empty sequences
        cases.append(("%s_random" % dtype, dtype, docs))
    cases.append(("uint16_vocab_50k_many", "uint16", random_documents(rng, 400, 3, 60, 0, 50256)))
    cases.append(("int32_vocab_150k_long", "int32", [[[rng.randint(0, 151935) for _ in range(300000)]],
                                                    [[1, 2, 3]]]))
    cases.append(("int32_one_document", "int32", [[[5]]]))
    cases.append(("uint16_only_empty_sequences", "uint16", [[[], []], [[]]]))
    return cases


class Failure(Exception):
    pass


def probe(exe, *args, stdin=None):
    r = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure("indexed_probe %s: %s" % (args[0], (r.stderr or r.stdout).strip()[:300]))
    return r.stdout


def megatron_write(prefix, dtype, docs, use_add_document):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=getattr(np, dtype))
    for j, doc in enumerate(docs):
        if use_add_document and j % 2 == 1:
            flat = [t for seq in doc for t in seq]
            builder.add_document(torch.tensor(flat, dtype=torch.int64), [len(seq) for seq in doc])
        else:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
    builder.finalize(prefix + ".idx")


def expected_index(dtype, docs):
    size = np.dtype(dtype).itemsize
    lengths = [len(seq) for doc in docs for seq in doc]
    pointers = list(np.cumsum([0] + lengths[:-1]) * size) if lengths else []
    doc_indices = list(np.cumsum([0] + [len(doc) for doc in docs]))
    return lengths, [int(p) for p in pointers], [int(d) for d in doc_indices]


def check_equal(what, got, want):
    if got != want:
        raise Failure("%s differ: got %s, want %s" % (what, str(got)[:200], str(want)[:200]))


def megatron_to_moetron(exe, tmp, dtype, docs):
    prefix = os.path.join(tmp, "meg")
    megatron_write(prefix, dtype, docs, use_add_document=True)
    got = json.loads(probe(exe, "read", prefix))
    lengths, pointers, doc_indices = expected_index(dtype, docs)
    check_equal("dtype", got["dtype"], dtype)
    check_equal("sequence_lengths", got["sequence_lengths"], lengths)
    check_equal("sequence_pointers", got["sequence_pointers"], pointers)
    check_equal("document_indices", got["document_indices"], doc_indices)
    check_equal("tokens", got["documents"], docs)


def files_identical(a, b):
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as fa, open(b + ext, "rb") as fb:
            x, y = fa.read(), fb.read()
        if x != y:
            at = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            raise Failure("%s not byte-identical to Megatron's (%d vs %d bytes, first difference at byte %d)"
                          % (ext, len(x), len(y), at))


def moetron_to_megatron(exe, tmp, dtype, docs):
    prefix = os.path.join(tmp, "moe")
    probe(exe, "write", prefix, dtype, stdin=json.dumps(docs))
    reference = os.path.join(tmp, "ref")
    megatron_write(reference, dtype, docs, use_add_document=False)
    files_identical(prefix, reference)
    if os.path.getsize(prefix + ".bin") == 0:
        return  # numpy cannot memory-map an empty file, so Megatron cannot open a dataset without tokens
    ds = IndexedDataset(prefix)
    lengths, pointers, doc_indices = expected_index(dtype, docs)
    check_equal("dtype", ds.index.dtype, getattr(np, dtype))
    check_equal("sequence_lengths", ds.sequence_lengths.tolist(), lengths)
    check_equal("sequence_pointers", ds.index.sequence_pointers.tolist(), pointers)
    check_equal("document_indices", ds.document_indices.tolist(), doc_indices)
    flat = [seq for doc in docs for seq in doc]
    check_equal("tokens", [ds[i].tolist() for i in range(len(ds))], flat)
    check_equal("slice", [s.tolist() for s in ds[0:len(ds)]], flat)
    for i, seq in enumerate(flat):
        if len(seq) >= 3:
            check_equal("get(%d, 1, 2)" % i, ds.get(i, offset=1, length=2).tolist(), seq[1:3])


def merge_case(exe, tmp):
    rng = random.Random(7)
    parts = [random_documents(rng, n, 3, 20, 0, 65535) for n in (5, 1, 8)]
    prefixes = []
    for k, docs in enumerate(parts):
        prefixes.append(os.path.join(tmp, "part%d" % k))
        probe(exe, "write", prefixes[-1], "uint16", stdin=json.dumps(docs))
    merged = os.path.join(tmp, "merged")
    probe(exe, "merge", merged, *prefixes)
    reference = os.path.join(tmp, "merged_ref")
    builder = IndexedDatasetBuilder(reference + ".bin", dtype=np.uint16)
    for p in prefixes:
        builder.add_index(p)
    builder.finalize(reference + ".idx")
    files_identical(merged, reference)
    got = json.loads(probe(exe, "read", merged))
    check_equal("merged tokens", got["documents"], [doc for docs in parts for doc in docs])


def vocab_case(exe, tmp):
    for vocab in (2, 257, 32000, 50257, 65499, 65500, 65535, 100352, 151936):
        got = probe(exe, "dtype-for-vocab", str(vocab)).strip()
        check_equal("dtype for vocabulary %d" % vocab, got, DType.optimal_dtype(vocab).__name__)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    exe, only = sys.argv[1], sys.argv[2:]
    runs = []
    for name, dtype, docs in make_cases():
        runs.append(("megatron_to_moetron_" + name, lambda t, d=dtype, x=docs: megatron_to_moetron(exe, t, d, x)))
        runs.append(("moetron_to_megatron_" + name, lambda t, d=dtype, x=docs: moetron_to_megatron(exe, t, d, x)))
    runs.append(("merge_add_index_uint16", lambda t: merge_case(exe, t)))
    runs.append(("dtype_for_vocab", lambda t: vocab_case(exe, t)))
    failed = 0
    for name, fn in runs:
        if only and not any(name.startswith(o) for o in only):
            continue
        with tempfile.TemporaryDirectory(prefix="moetron_indexed_") as tmp:
            try:
                fn(tmp)
                print("ok %s" % name)
            except Failure as exc:
                print("FAIL %s: %s" % (name, exc))
                failed += 1
            except Exception as exc:  # noqa: BLE001 - a crash of the reference side is a failure too
                print("FAIL %s: %s: %s" % (name, type(exc).__name__, str(exc)[:300]))
                failed += 1
        sys.stdout.flush()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
