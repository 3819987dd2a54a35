#!/usr/bin/env python3
"""moetron's TensorBoard event files (--tensorboard-dir) read back by tensorboard itself.

usage: tensorboard_events.py MOETRON

Trains a tiny MoE model with multi-token prediction a few steps with --tensorboard-dir,
evaluation, --moe-per-layer-logging and the optional tags on, then reads the directory with
tensorboard's EventAccumulator and checks: Megatron-LM's tags are there; each value equals
the JSONL's value of the same step (float32); steps (and the "vs samples" steps) are right;
each MoE layer's tokens per expert add up to the step's tokens x top-k (nothing is dropped);
every record's CRCs (tensorboard's masked_crc32c) and the file_version event; a resumed run
(its --tensorboard-dir taken from the checkpoint) adds a second file that sorts after the
first, and its steps continue; --tensorboard-log-interval thins the scalars (and TensorBoard
gets steps the console skips); --no-log-loss-scale-to-tensorboard leaves loss-scale out; a
step is in the file while the run goes on (the run stopped with SIGSTOP after its console
line of step 2, so that nothing can be written after it).

Prints `ok <case>` or `FAIL <case>: <why>` per case; exits non-zero on any failure.
Needs tensorboard (pip install tensorboard).
"""

import glob
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as exc:
    print(f"FAIL setup: python3 with tensorboard is required ({exc})")
    sys.exit(1)

SEQ, GBS, TOPK, EXPERTS = 32, 4, 2, 4
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", str(SEQ),
        "--micro-batch-size", "2", "--global-batch-size", str(GBS), "--num-experts", str(EXPERTS),
        "--moe-router-topk", str(TOPK), "--moe-ffn-hidden-size", "32", "--lr-warmup-iters", "1",
        "--mock-data-tokens", "65536", "--peak-tflops", "1", "--make-vocab-size-divisible-by", "512"]
# every optional tag on; the console and JSONL every 2nd step, TensorBoard every step
FULL = ["--mtp-num-layers", "1", "--moe-per-layer-logging", "--eval-interval", "2", "--eval-iters", "1",
        "--log-interval", "2", "--log-params-norm", "--log-validation-ppl-to-tensorboard",
        "--log-world-size-to-tensorboard", "--log-memory-to-tensorboard", "--log-timers-to-tensorboard",
        "--log-throughput"]

failures = 0


def ok(name):
    print(f"ok {name}")


def fail(name, why):
    global failures
    failures += 1
    print(f"FAIL {name}: {why}")


def check(name, cond, why):
    ok(name) if cond else fail(name, why)


def train(moetron, args, log):
    with open(log, "w") as out:
        rc = subprocess.run([moetron, "train", *args], stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"moetron train {' '.join(args)} exited {rc}: {open(log).read()[-400:]}")


def scalars(directory):
    """{tag: [(step, value)]} of every event file of the directory, as tensorboard reads it."""
    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def records(path):
    """The data of each TFRecord of a file; raises on a bad length or CRC."""
    data, out, at = open(path, "rb").read(), [], 0
    while at < len(data):
        header = data[at:at + 8]
        (length,), (length_crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[at + 8:at + 12])
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if length_crc != masked_crc32c(header) or body_crc != masked_crc32c(body):
            raise ValueError(f"{path}: bad CRC in the record at byte {at}")
        out.append(body)
        at += 16 + length
    return out


def jsonl(path):
    steps, evals = {}, {}
    for line in open(path):
        r = json.loads(line)
        (steps if "loss" in r else evals)[r["step"]] = r
    return steps, evals


def f32(x):
    return float(np.float32(x))


def same_values(tb, tag, want):
    """tb[tag] at the steps of want ({step: value}) equals want in float32; '' or why not."""
    have = dict(tb.get(tag, []))
    for step, value in want.items():
        if step not in have:
            return f"{tag}: no step {step} (has {sorted(have)})"
        if have[step] != f32(value):
            return f"{tag} at step {step}: {have[step]!r}, the JSONL's {value!r}"
    return ""


def check_full_run(tb, steps, evals):
    """The values of the JSONL steps (2 and 4) against the tags of the same steps."""
    pairs = {"lm loss": "lm_loss", "grad-norm": "grad_norm", "learning-rate": "lr", "params-norm": "params_norm",
             "load_balancing_loss": "aux_loss", "z_loss": "z_loss", "mtp_1 loss": "mtp_1_loss",
             "moe/load_imbalance": "load_imbalance", "moe/dropped_frac": "dropped_frac"}
    layers = sorted({int(k.split("/")[1][len("layer_"):]) for r in steps.values() for k in r if k.startswith("moe/layer_")})
    for layer in layers:
        key = f"moe/layer_{layer}"
        pairs.update({f"moe/load_balancing_loss_layer_{layer}": f"{key}/aux_loss", f"moe/z_loss_layer_{layer}": f"{key}/z_loss",
                      f"{key}/load_imbalance": f"{key}/load_imbalance", f"{key}/dropped_frac": f"{key}/dropped_frac",
                      f"{key}/dropped_tokens": f"{key}/dropped_tokens"})
    why = [same_values(tb, tag, {s: r[key] for s, r in steps.items()}) for tag, key in pairs.items()]
    why += [same_values(tb, "throughput", {s: r["tflops"] for s, r in steps.items()}),
            same_values(tb, "mem-peak-resident-bytes", {s: r["mem_peak_mb"] * 2**20 for s, r in steps.items()}),
            same_values(tb, "lm loss validation", {s: r["eval_loss"] for s, r in evals.items()}),
            same_values(tb, "lm loss validation ppl", {s: r["eval_ppl"] for s, r in evals.items()})]
    why = [w for w in why if w]
    check("values_equal_jsonl", not why and len(layers) == 3, "; ".join(why) or f"MoE layers {layers}")

    why = []
    for layer in layers:
        for step, r in steps.items():
            counts = [dict(tb.get(f"moe/layer_{layer}/tokens_per_expert/expert_{e}", [])).get(step) for e in range(EXPERTS)]
            if counts != [float(c) for c in r[f"moe/layer_{layer}/tokens_per_expert"]]:
                why.append(f"layer {layer} step {step}: {counts} vs {r[f'moe/layer_{layer}/tokens_per_expert']}")
        for step, _ in tb.get(f"moe/layer_{layer}/tokens_per_expert/expert_0", []):
            total = sum(dict(tb[f"moe/layer_{layer}/tokens_per_expert/expert_{e}"])[step] for e in range(EXPERTS))
            if total != GBS * SEQ * TOPK:
                why.append(f"layer {layer} step {step}: {total} tokens, not {GBS * SEQ * TOPK}")
    check("tokens_per_expert", not why, "; ".join(why))

    constants = {"batch-size": GBS, "world-size": 1, "loss-scale": 1}
    why = [f"{t}: {tb.get(t)}" for t, v in constants.items() if [x for _, x in tb.get(t, [])] != [v] * 4]
    why += [f"{t}: {tb.get(t)}" for t in ("iteration-time", "throughput") if not all(x > 0 for _, x in tb.get(t, [(0, 0)]))]
    check("constant_and_timer_tags", not why, "; ".join(why))


def check_steps(tb):
    """TensorBoard has every step (--tensorboard-log-interval 1) though the JSONL has every 2nd."""
    want = {"lm loss": [1, 2, 3, 4], "lm loss vs samples": [GBS * s for s in (1, 2, 3, 4)],
            "lm loss validation": [2, 4], "lm loss validation vs samples": [GBS * 2, GBS * 4]}
    why = [f"{t}: {[s for s, _ in tb.get(t, [])]}" for t, s in want.items() if [s for s, _ in tb.get(t, [])] != s]
    check("steps", not why, "; ".join(why))


def check_files(name, directory, count):
    """count event files, each opening with file_version, every record's CRCs right."""
    files = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    try:
        events = [[event_pb2.Event.FromString(d) for d in records(f)] for f in files]
    except ValueError as exc:
        return fail(name, exc)
    first_ok = all(e and e[0].file_version == "brain.Event:2" and not e[0].HasField("summary") for e in events)
    one_value = all(len(x.summary.value) == 1 for e in events for x in e[1:])
    check(name, len(files) == count and first_ok and one_value, f"{len(files)} files {[os.path.basename(f) for f in files]}")
    return events


def main():
    moetron = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="moetron_tb_") as work:
        run_cases(moetron, work)
    return 1 if failures else 0


def run_cases(moetron, work):
    tb_dir, log = os.path.join(work, "tb"), os.path.join(work, "run.jsonl")
    train(moetron, TINY + FULL + ["--train-iters", "4", "--tensorboard-dir", tb_dir, "--log-jsonl", log,
                                  "--save", os.path.join(work, "ck"), "--wandb-project", "p"],
          os.path.join(work, "full.log"))
    tb, (steps, evals) = scalars(tb_dir), jsonl(log)
    megatron_tags = ["lm loss", "learning-rate", "batch-size", "grad-norm", "loss-scale", "world-size", "params-norm",
                     "iteration-time", "throughput", "load_balancing_loss", "z_loss", "mtp_1 loss",
                     "moe/load_balancing_loss_layer_0", "lm loss validation", "lm loss validation ppl",
                     "lm loss vs samples", "lm loss validation ppl vs samples"]
    missing = [t for t in megatron_tags if t not in tb]
    check("megatron_tags", not missing and sorted(steps) == [2, 4], f"missing {missing}, JSONL steps {sorted(steps)}")
    check("wandb_note", "does not log to Weights & Biases" in open(os.path.join(work, "full.log")).read(),
          "no note about --wandb-project")
    check_full_run(tb, steps, evals)
    check_steps(tb)
    check_files("records", tb_dir, 1)

    # resumed from the checkpoint of step 4 to step 6: --tensorboard-dir comes from the checkpoint
    train(moetron, ["--load", os.path.join(work, "ck"), "--train-iters", "6"], os.path.join(work, "resume.log"))
    events = check_files("records_after_resume", tb_dir, 2) or [[], []]
    file_steps = [sorted({e.step for e in f if e.HasField("summary") and e.summary.value[0].tag == "lm loss"}) for f in events]
    tb, (steps, _) = scalars(tb_dir), jsonl(log)
    why = same_values(tb, "lm loss", {s: r["lm_loss"] for s, r in steps.items()})
    check("resume_new_file", file_steps == [[1, 2, 3, 4], [5, 6]] and [s for s, _ in tb["lm loss"]] == [1, 2, 3, 4, 5, 6]
          and not why, f"steps per file {file_steps}, read {[s for s, _ in tb['lm loss']]} {why}")

    # every 2nd step to TensorBoard, every 4th (and the last) to the console and JSONL
    thin_dir, thin_log = os.path.join(work, "thin"), os.path.join(work, "thin.jsonl")
    train(moetron, TINY + ["--train-iters", "5", "--log-interval", "4", "--tensorboard-log-interval", "2",
                           "--no-log-loss-scale-to-tensorboard", "--tensorboard-dir", thin_dir, "--log-jsonl", thin_log],
          os.path.join(work, "thin.log"))
    tb, (steps, _) = scalars(thin_dir), jsonl(thin_log)
    check("log_interval_thins", [s for s, _ in tb.get("lm loss", [])] == [2, 4] and sorted(steps) == [4, 5]
          and "loss-scale" not in tb and "moe/layer_0/load_imbalance" not in tb,
          f"TensorBoard steps {tb.get('lm loss')}, JSONL steps {sorted(steps)}, tags {sorted(tb)[:8]}")

    # a step is in the file while the run goes on
    live_dir = os.path.join(work, "live")
    run = subprocess.Popen([moetron, "train", *TINY, "--train-iters", "100000", "--log-interval", "1",
                            "--tensorboard-dir", live_dir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = False
    for line in iter(run.stdout.readline, ""):  # the console line of step 2 (TensorBoard has step 1 before it)
        if line.startswith("step     2/"):
            seen = True
            break
    running = run.poll() is None
    if running:
        os.kill(run.pid, signal.SIGSTOP)
    live = scalars(live_dir).get("lm loss", []) if running else []
    run.kill()
    run.wait()
    check("written_while_running", running and seen and [s for s, _ in live][:1] == [1],
          f"running {running}, lm loss {live}")


if __name__ == "__main__":
    sys.exit(main())
