#!/usr/bin/env python3
"""moetron's Megatron sample order against Megatron-Core's own GPTDataset / BlendedDataset.

    python3 tests/conformance/megatron_gpt_dataset.py build/moetron

Builds small corpora with megatron-core's IndexedDatasetBuilder, then for each
configuration (split, seq_length, num_samples, seed, blend) builds the training split
with BlendedMegatronDatasetBuilder and compares every sample's seq_length + 1 tokens
(Megatron's tokens plus the last label) with `moetron data --dump`. Also checks the
index cache: reuse, rebuild on changed data, recovery from a damaged file, and the
one-line errors for bad input. Prints "ok NAME" or "FAIL NAME: why" per case.
"""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import numpy  # noqa: E402
import torch  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402

MOETRON = sys.argv[1] if len(sys.argv) > 1 else "build/moetron"
VOCAB = 1000
EOD = 0
failures = 0


def report(name, ok, why=""):
    global failures
    if ok:
        print(f"ok {name}", flush=True)
    else:
        failures += 1
        print(f"FAIL {name}: {why}", flush=True)


class Tokenizer:
    """The little of a tokenizer GPTDatasetConfig and GPTDataset use."""

    vocab_size = VOCAB
    eod = EOD
    pad = -1  # never a token: Megatron replaces pad ids in its output by 0
    unique_identifiers = {"class": "Tokenizer", "vocab_size": VOCAB}


def make_corpus(prefix, n_docs, seed, dtype=numpy.uint16, sequences_per_doc=1, empty=0.0):
    """Random sequences ending in EOD: mostly 20..300 tokens, some of 1..3, a few of 1000..3000,
    and a fraction `empty` of empty ones."""
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(n_docs):
        for _ in range(sequences_per_doc):
            kind = rng.random()
            n = rng.integers(1, 4) if kind < 0.1 else rng.integers(1000, 3000) if kind > 0.97 else rng.integers(20, 300)
            if rng.random() < empty:
                n = 0
            tokens = rng.integers(1, VOCAB, size=n)
            if n:
                tokens[-1] = EOD
            builder.add_item(torch.from_numpy(tokens))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def blend_of(entries):
    """moetron's list (strings) -> Megatron's (prefixes, weights or None), as get_blend_from_list."""
    if len(entries) % 2 == 0:
        try:
            weights = [float(entries[i]) for i in range(0, len(entries), 2)]
            return [entries[i] for i in range(1, len(entries), 2)], weights
        except ValueError:
            pass
    return list(entries), None


def megatron_samples(seq_length, seed, num_samples, data_path=None, split="969,30,1", train_data_path=None,
                     cache=None):
    """The first num_samples training samples (seq_length + 1 tokens) from Megatron-Core."""
    kwargs = {}
    if data_path is not None:
        kwargs.update(blend=blend_of(data_path), split=split)
    else:
        kwargs.update(blend_per_split=[blend_of(train_data_path), None, None])
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, path_to_cache=cache, tokenizer=Tokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        **kwargs)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, 0, 0], lambda: True, config).build()
    assert len(train) >= num_samples
    out = numpy.empty((num_samples, seq_length + 1), dtype=numpy.int64)
    for i in range(num_samples):
        item = train[i]
        out[i, :seq_length] = item["tokens"].numpy()
        out[i, seq_length] = item["labels"][-1].item()
    return out


def read_tokens(path):
    """Tensor "tokens" of a safetensors file (I32, 2-D), without the safetensors package."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    t = header["tokens"]
    assert t["dtype"] == "I32", t
    begin, end = t["data_offsets"]
    return numpy.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<i4").reshape(t["shape"])


def run_moetron(tmp, seq_length, seed, num_samples, data_path=None, split=None, train_data_path=None, cache=None,
                expect_ok=True):
    out = os.path.join(tmp, "dump.safetensors")
    if os.path.exists(out):
        os.remove(out)
    cmd = [MOETRON, "data", "--seq-length", str(seq_length), "--seed", str(seed), "--num-samples", str(num_samples),
           "--dump", out]
    if data_path is not None:
        cmd += ["--data-path", *data_path]
    if train_data_path is not None:
        cmd += ["--train-data-path", *train_data_path]
    if split is not None:
        cmd += ["--split", split]
    if cache is not None:
        cmd += ["--data-cache-path", cache]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not expect_ok:
        return p, None
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    return p, read_tokens(out)


def compare(name, want, got):
    if got.shape != want.shape:
        report(name, False, f"shape {got.shape}, Megatron {want.shape}")
        return
    bad = numpy.nonzero((got != want).any(axis=1))[0]
    report(name, len(bad) == 0, f"{len(bad)} of {len(want)} samples differ, first {bad[:5].tolist()}"
           if len(bad) else "")


def cache_counts(stdout):
    """(reused, built) from moetron's summary line."""
    for line in stdout.splitlines():
        if line.startswith("megatron data:") and "reused" in line:
            tail = line.rsplit(":", 1)[1]
            reused, built = [int(part.split()[0]) for part in tail.split(",")]
            return reused, built
    return None


def split_tokens(prefix, split, index=0):
    """Tokens of split `index` of a dataset, as Megatron's split matrix cuts it."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix)
    n = len(ds.sequence_lengths)
    beg, end = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))[index]
    return int(ds.sequence_lengths[int(round(beg * n)):int(round(end * n))].sum())


def main():
    # Megatron loops forever on a split without documents; fail instead of hanging.
    signal.alarm(300)
    tmp = tempfile.mkdtemp(prefix="moetron_megatron_data_")
    try:
        A, B, C, D = (os.path.join(tmp, "data", name) for name in ("A", "B", "C", "D"))
        os.makedirs(os.path.dirname(A))
        make_corpus(A, 600, 1)
        make_corpus(B, 620, 2)
        make_corpus(C, 120, 3, dtype=numpy.int32)
        make_corpus(D, 200, 4, sequences_per_doc=3, empty=0.05)  # documents of several sequences
        cache = os.path.join(tmp, "cache")

        # Sample counts that exercise the epoch logic of the training split of A (969,30,1).
        train_tokens = split_tokens(A, "969,30,1")
        per_epoch_16 = (train_tokens - 1) // 16
        per_epoch_64 = (train_tokens - 1) // 64
        cases = [
            # name, seq_length, seed, num_samples, data_path / train_data_path, split
            ("single_1_epoch_L16", 16, 1234, per_epoch_16 // 3, dict(data_path=[A], split="969,30,1")),
            ("single_1_epoch_full_L16", 16, 1234, per_epoch_16, dict(data_path=[A], split="969,30,1")),
            ("single_3_epochs_L64", 64, 7, per_epoch_64 * 2 + per_epoch_64 * 9 // 10,
             dict(data_path=[A], split="969,30,1")),
            ("single_separate_last_epoch_L64", 64, 7, per_epoch_64 * 2 + per_epoch_64 // 10,
             dict(data_path=[A], split="969,30,1")),
            ("single_split_98_2_0_L16_seed0", 16, 0, 3000, dict(data_path=[A], split="98,2,0")),
            ("single_many_epochs_L64", 64, 99, 2000, dict(data_path=[D], split="969,30,1")),
            ("blend_0.3A_0.7B_L16", 16, 1234, 4000, dict(data_path=["0.3", A, "0.7", B], split="969,30,1")),
            ("blend_three_L64", 64, 5, 1500, dict(data_path=["0.2", A, "0.5", B, "0.3", C], split="98,2,0")),
            ("blend_weighted_single_L16", 16, 3, 700, dict(data_path=["1", A], split="969,30,1")),
            ("blend_unweighted_A_B_L16", 16, 11, 5000, dict(data_path=[A, B], split="969,30,1")),
            ("train_data_path_single_L16", 16, 1234, 900, dict(train_data_path=[C])),
            ("train_data_path_blend_L64", 64, 8, 800, dict(train_data_path=["30", B, "70", D])),
        ]
        for name, L, seed, K, paths in cases:
            want = megatron_samples(L, seed, K, cache=None, **paths)
            _, got = run_moetron(tmp, L, seed, K, cache=cache, **paths)
            compare(name, want, got)

        # Megatron's separate-final-epoch rule is what the two epoch cases above exercise.
        sep = per_epoch_64 // 10 < int(0.8 * per_epoch_64)
        nosep = per_epoch_64 * 9 // 10 < int(0.8 * per_epoch_64)
        report("cases_cover_separate_final_epoch", sep and not nosep, f"sep={sep} nosep={nosep}")

        # Cache: a second run reuses every file and gives the same samples.
        blend = dict(data_path=["0.3", A, "0.7", B], split="969,30,1")
        cache2 = os.path.join(tmp, "cache2")
        p1, first = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        p2, second = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        c1, c2 = cache_counts(p1.stdout), cache_counts(p2.stdout)
        files = sorted(os.listdir(cache2))
        report("cache_reused", c1 == (0, 3) and c2 == (3, 0) and len(files) == 3 and
               numpy.array_equal(first, second), f"first {c1}, second {c2}, files {files}")
        compare("cache_reused_matches_megatron", megatron_samples(32, 21, 2000, **blend), second)

        # The default cache directory: "cache" beside the first dataset.
        default_cache = os.path.join(os.path.dirname(A), "cache")
        p, _ = run_moetron(tmp, 16, 1, 100, data_path=[A])
        report("cache_default_dir", os.path.isdir(default_cache) and len(os.listdir(default_cache)) == 1,
               f"{default_cache}: {os.listdir(default_cache) if os.path.isdir(default_cache) else 'missing'}")

        # A damaged file is rebuilt (with a note) and gives the same samples.
        victim = os.path.join(cache2, [f for f in files if "GPTDataset" in f][0])
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        p3, third = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        report("cache_damaged_rebuilt", cache_counts(p3.stdout) == (2, 1) and "unusable" in p3.stderr and
               numpy.array_equal(first, third), f"{cache_counts(p3.stdout)} {p3.stderr.strip()}")
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) - 8)
        p3, third = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        report("cache_truncated_rebuilt", cache_counts(p3.stdout) == (2, 1) and numpy.array_equal(first, third),
               f"{cache_counts(p3.stdout)} {p3.stderr.strip()}")

        # Stale: a touched dataset gets new indices; changed data gives Megatron's new samples.
        st = os.stat(B + ".bin")
        os.utime(B + ".bin", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        p4, fourth = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        report("cache_stale_after_touch", cache_counts(p4.stdout) == (1, 2) and numpy.array_equal(first, fourth),
               f"{cache_counts(p4.stdout)}")
        make_corpus(B, 640, 12)
        p5, fifth = run_moetron(tmp, 32, 21, 2000, cache=cache2, **blend)
        report("cache_stale_after_rewrite", cache_counts(p5.stdout)[1] >= 2, f"{cache_counts(p5.stdout)}")
        # Megatron's own cache (PREFIX/cache/ when path_to_cache is None) is keyed without the
        # data files, so it would serve the old indices: clear it first.
        shutil.rmtree(B, ignore_errors=True)
        compare("rewritten_data_matches_megatron", megatron_samples(32, 21, 2000, **blend), fifth)

        # Bad input: one line naming the flag.
        tiny = os.path.join(tmp, "data", "tiny")
        make_corpus(tiny, 5, 9)
        errors = [
            ("error_zero_weight", dict(data_path=["0", A, "1", B]), "--data-path"),
            ("error_mixed_list", dict(data_path=["0.3", A, B, C]), "--data-path"),
            ("error_missing_prefix", dict(data_path=[os.path.join(tmp, "nope")]), "nope"),
            ("error_prefix_with_extension", dict(data_path=[A + ".bin"]), "without .bin"),
            ("error_empty_train_split", dict(data_path=[tiny], split="1,1,1000"), "--split"),
            ("error_unweighted_blend_too_small", dict(data_path=[A, B]), "weights"),
        ]
        for name, paths, needle in errors:
            K = 10**7 if "too_small" in name else 10
            p, _ = run_moetron(tmp, 16, 1, K, cache=cache, expect_ok=False, **paths)
            lines = p.stderr.strip().splitlines()
            report(name, p.returncode == 1 and len(lines) == 1 and needle in lines[0] and
                   lines[0].startswith("moetron: error:"), f"rc {p.returncode}: {p.stderr.strip()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
