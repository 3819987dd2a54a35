#!/usr/bin/env bash
# test_report.sh — `moetron report RUN`: a tiny MoE run (6 steps, MTP, evaluations, capacity
# drops, --moe-per-layer-logging) gives a page with its title, summary (final losses as in the
# log), every chart, and in its data each layer's tokens per expert as the log has them; no
# URL anywhere; RUN as a directory; a long synthetic run binned to bounded columns with
# exact means; a last line cut short left out; a log without per-layer keys and a dense run
# say so; names HTML-escaped; refusals with one line (missing, damaged middle line, a record
# without step, a directory with no or two logs, no RUN or two, --output the log or unwritable). In headless
# Chromium (skipped only without it, and under the sanitizer build) the script draws every
# canvas and the screenshot shows the charts and the heatmap's colours.
set -u
source "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --train-iters 6
      --log-interval 1 --eval-interval 3 --eval-iters 1 --mtp-num-layers 1 --moe-expert-capacity-factor 1.0
      --peak-tflops 1 --mock-data-tokens 16384 --make-vocab-size-divisible-by 64)

mkdir -p "$work/run"
"$M" train "${TINY[@]}" --moe-per-layer-logging --log-jsonl "$work/run/train.jsonl" >"$work/train.log" 2>&1 ||
    fail report_train "training failed: $(tail -1 "$work/train.log")"

# page_check PAGE LOG: prints what in PAGE disagrees with LOG (nothing when all agree): the
# summary's final losses, every layer's tokens per expert in the page's data, the charts'
# series, no URL
page_check() {
    python3 - "$1" "$2" <<'PY'
import json, re, sys
page, log = open(sys.argv[1]).read(), [json.loads(l) for l in open(sys.argv[2])]
steps = [r for r in log if "loss" in r]
evals = [r for r in log if "eval_loss" in r]
data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1))["series"]
problems = []
for label, value in (("Final loss", steps[-1]["loss"]), ("Final lm loss", steps[-1]["lm_loss"]),
                     ("Final MTP 1 loss", steps[-1]["mtp_1_loss"]), ("Final eval loss", evals[-1]["eval_loss"])):
    if f"<th>{label}</th><td>{value:.4f} (step" not in page: problems.append(f"summary lacks {label} {value:.4f}")
for title in ("Loss", "Throughput (tokens/s)", "Gradient norm (before clipping)", "Learning rate",
              "MoE layer 0: tokens per expert", "MoE layer 1: tokens per expert", "MoE layer 1: dropped tokens",
              "MoE layer 1: load imbalance (max / mean expert load)"):
    if f"<figcaption>{title}</figcaption>" not in page: problems.append(f"no chart {title}")
if 'data-series="loss lm_loss mtp_1_loss eval_loss"' not in page: problems.append("the loss chart's series")
for layer in (0, 1):
    key = f"moe/layer_{layer}/tokens_per_expert"
    got = data[key]
    want = [r[key] for r in steps]
    if got["value"] != want or got["step_first"] != [r["step"] for r in steps] or got["rows"] != len(want[0]):
        problems.append(f"{key}: {got} != {want}")
if data["eval_loss"]["step"] != [r["step"] for r in evals]: problems.append("eval steps")
if any(abs(a - r["lr"]) > 1e-5 * r["lr"] for a, r in zip(data["lr"]["value"], steps)): problems.append("lr values")
if re.search(r"https?:|//[a-z]|\b(src|href)=", page): problems.append("a URL or a src/href attribute")
print("; ".join(problems))
PY
}

test_page() {
    "$M" report "$work/run/train.jsonl" >"$work/report.out" 2>&1 || { fail report_page "$(tail -1 "$work/report.out")"; return; }
    local page=$work/run/train.html problems
    if [ ! -s "$page" ] || ! grep -q "wrote $page (6 step records, 2 evaluations)" "$work/report.out"; then
        fail report_page "no page at the default path: $(cat "$work/report.out")"
        return
    fi
    problems=$(page_check "$page" "$work/run/train.jsonl")
    if [ -n "$problems" ]; then fail report_page "$problems"; return; fi
    if ls "$work/run" | grep -q tmp; then fail report_page "a temporary file left: $(ls "$work/run")"; return; fi
    grep -q '<title>train - moetron report</title>' "$page" && grep -q '<h1>train</h1>' "$page" ||
        { fail report_page "title: $(grep -m1 '<title>' "$page")"; return; }
    ok report_page
}

test_directory_run() {
    "$M" report "$work/run/" --output "$work/dir.html" >"$work/out" 2>&1 &&
        grep -q '<h1>run</h1>' "$work/dir.html" && [ -z "$(page_check "$work/dir.html" "$work/run/train.jsonl")" ] &&
        ok report_directory_run || fail report_directory_run "$(tail -1 "$work/out")"
}

# A synthetic run of 3000 steps: expert 3 of layer 5 gets no token, the others 1, 2, 3 parts;
# the loss falls as 10/step; every 500th step an evaluation; lines binned to at most 1024
# columns and heatmaps to 256, each column the mean of its steps.
make_long_log() {
    python3 - "$1" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 3001):
        r = {"step": s, "loss": 10 / s, "lm_loss": 9 / s, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1000 + s % 2,
             "load_imbalance": 1.5, "dropped_frac": 0.0, "moe/layer_5/tokens_per_expert": [100, 200, 300, 0],
             "moe/layer_5/dropped_tokens": 0, "moe/layer_5/load_imbalance": 2.0 + (s == 1234)}
        f.write(json.dumps(r) + "\n")
        if s % 500 == 0: f.write(json.dumps({"step": s, "eval_loss": 5 / s, "eval_ppl": 1.0}) + "\n")
PY
}

test_binned() {
    make_long_log "$work/long.jsonl"
    "$M" report "$work/long.jsonl" >"$work/out" 2>&1 || { fail report_binned "$(tail -1 "$work/out")"; return; }
    local why
    why=$(python3 - "$work/long.html" <<'PY'
import json, re, sys
page = open(sys.argv[1]).read()
data = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))["series"]
loss, heat = data["loss"], data["moe/layer_5/tokens_per_expert"]
# 3000 points in 1024 columns: the columns merged to 4 steps each, 750 of them
if len(loss["step"]) != 750: print("loss columns", len(loss["step"])); sys.exit()
want = sum(10 / s for s in range(1, 5)) / 4
if abs(loss["value"][0] - want) > 1e-5 * want or loss["step"][0] != 2.5: print("first column", loss["value"][0], want)
elif len(heat["value"]) != 188 or heat["step_first"][:2] != [1, 17] or heat["step_last"][-1] != 3000: print("heatmap columns", len(heat["value"]), heat["step_first"][:2])
elif any(col != [100, 200, 300, 0] for col in heat["value"]): print("heatmap means", heat["value"][:2])
elif data["tokens_per_s"]["value"][0] != 1000.5: print("tokens_per_s", data["tokens_per_s"]["value"][0])
elif data["eval_loss"]["step"] != [500 * k for k in range(1, 7)]: print("eval", data["eval_loss"])
elif "<td>3.000 (MoE layer 5, step 1234)</td>" not in page: print("worst imbalance")
elif "<td>1000 tokens/s (mean of 2999 logged steps after the first)</td>" not in page: print("throughput")
PY
)
    [ -z "$why" ] && ok report_binned || fail report_binned "$why"
}

test_cut_short() {
    { cat "$work/run/train.jsonl"; printf '{"step":7,"loss":6.1'; } >"$work/cut.jsonl"  # step 7 being written
    "$M" report "$work/cut.jsonl" >"$work/out" 2>&1 &&
        grep -q "(6 step records, 2 evaluations; the last line, still being written, left out)" "$work/out" &&
        grep -q "its last line, which the run was still writing, left out" "$work/cut.html" &&
        ok report_cut_short || fail report_cut_short "$(cat "$work/out")"
    # a complete last record without its newline counts
    head -c -1 "$work/run/train.jsonl" >"$work/nonl.jsonl"
    "$M" report "$work/nonl.jsonl" >"$work/out" 2>&1 && grep -q "(6 step records, 2 evaluations)$" "$work/out" &&
        ok report_last_line_whole || fail report_last_line_whole "$(cat "$work/out")"
}

test_no_layers() {
    python3 -c 'import json,sys; [print(json.dumps({k: v for k, v in json.loads(l).items() if not k.startswith("moe/")})) for l in open(sys.argv[1])]' \
        "$work/run/train.jsonl" >"$work/flat.jsonl"
    "$M" report "$work/flat.jsonl" >"$work/out" 2>&1 && grep -q 'No per-layer data in this log' "$work/flat.html" &&
        ! grep -q '<figcaption>MoE layer' "$work/flat.html" && ok report_no_layers || fail report_no_layers "$(cat "$work/out")"
    printf '{"step":1,"loss":5.0,"lm_loss":5.0,"load_imbalance":0.0,"dropped_frac":0.0}\n' >"$work/dense.jsonl"
    "$M" report "$work/dense.jsonl" >"$work/out" 2>&1 && grep -q 'No MoE layers in this run' "$work/dense.html" &&
        ok report_dense || fail report_dense "$(cat "$work/out")"
    : >"$work/empty.jsonl"
    "$M" report "$work/empty.jsonl" >"$work/out" 2>&1 && grep -q '<td>none logged yet</td>' "$work/empty.html" &&
        ok report_empty_log || fail report_empty_log "$(cat "$work/out")"
}

test_escaped_names() {
    mkdir -p "$work/a<b>&c"
    cp "$work/dense.jsonl" "$work/a<b>&c/x.jsonl"
    "$M" report "$work/a<b>&c" >"$work/out" 2>&1 && grep -q '<h1>a&lt;b&gt;&amp;c</h1>' "$work/a<b>&c/x.html" &&
        ok report_escaped_names || fail report_escaped_names "$(cat "$work/out")"
}

test_refusals() {
    expect_error report_missing "missing.jsonl: cannot open: No such file or directory" -- "$M" report "$work/missing.jsonl"
    sed '3s/.*/{"step":3,"loss":/' "$work/run/train.jsonl" >"$work/damaged.jsonl"
    expect_error report_damaged_line "damaged.jsonl line 3: not a JSON record (column" -- "$M" report "$work/damaged.jsonl"
    printf '{"loss":1.0}\n{"step":2}\n' >"$work/nostep.jsonl"
    expect_error report_no_step 'nostep.jsonl line 1: a record without an integer "step"' -- "$M" report "$work/nostep.jsonl"
    printf '{"step":1,"moe/layer_0/tokens_per_expert":[1,2]}\n{"step":2,"moe/layer_0/tokens_per_expert":[1,2,3]}\n' >"$work/mixed.jsonl"
    expect_error report_mixed_shapes 'mixed.jsonl line 2: "moe/layer_0/tokens_per_expert" has 3 values where earlier records have 2' \
        -- "$M" report "$work/mixed.jsonl"
    mkdir -p "$work/none" "$work/two"
    expect_error report_directory_without_log "none: no .jsonl file in this directory" -- "$M" report "$work/none"
    : >"$work/two/a.jsonl"
    : >"$work/two/b.jsonl"
    expect_error report_directory_two_logs "two: 2 .jsonl files in this directory" -- "$M" report "$work/two"
    expect_error report_no_run "moetron report needs RUN" -- "$M" report
    expect_error report_two_runs "unexpected argument 'b'; moetron report takes one RUN" -- "$M" report a b
    expect_error report_output_is_log "that is the log itself" -- "$M" report "$work/dense.jsonl" --output "$work/dense.jsonl"
    expect_error report_unwritable "--output $work/none/x/p.html: cannot write the page" -- \
        "$M" report "$work/dense.jsonl" --output "$work/none/x/p.html"
}

# render NAME PAGE PNG: PAGE in headless Chromium: the DOM after the script ran (NAME.dom) and
# a screenshot at half scale
render() {
    local flags=(--headless --disable-gpu --no-sandbox --user-data-dir="$work/chromium-$1" --hide-scrollbars)
    timeout 120 "$CHROMIUM" "${flags[@]}" --dump-dom "file://$2" >"$work/$1.dom" 2>/dev/null
    timeout 120 "$CHROMIUM" "${flags[@]}" --force-device-scale-factor=0.5 --window-size=1200,2400 \
        --screenshot="$3" "file://$2" >/dev/null 2>&1
}

# The script drew every canvas (data-drawn = their count); the screenshot has many colours,
# ink on more than 5% of it, blue (lines, busy experts) and, for the synthetic run, orange (its
# idle expert).
test_render() {
    if sanitizer_build "$M"; then echo "skip report_render: sanitizer build (the plain suite renders)"; return; fi
    CHROMIUM=$(command -v chromium || command -v chromium-browser)
    if [ -z "$CHROMIUM" ]; then echo "skip report_render: chromium not installed (apt-get install chromium)"; return; fi
    local name page canvases drawn pixels
    for name in train long; do
        page=$work/$name.html
        [ "$name" = train ] && page=$work/run/train.html
        render "$name" "$page" "$work/$name.png"
        canvases=$(grep -o '<canvas width=' "$page" | wc -l)
        drawn=$(grep -o 'data-drawn="[0-9]*"' "$work/$name.dom" | grep -o '[0-9]*')
        if [ "${drawn:-none}" != "$canvases" ]; then fail "report_render_$name" "drew ${drawn:-none} of $canvases canvases"; continue; fi
        pixels=($(python3 "$here/png_pixels.py" "$work/$name.png")) || { fail "report_render_$name" "no screenshot"; continue; }
        # width height colours nonwhite blue orange (per mille)
        if [ "${pixels[2]}" -lt 200 ] || [ "${pixels[3]}" -lt 50 ] || [ "${pixels[4]}" -lt 5 ] ||
            { [ "$name" = long ] && [ "${pixels[5]}" -lt 2 ]; }; then
            fail "report_render_$name" "screenshot looks empty: ${pixels[*]}"
        else
            ok "report_render_$name"
        fi
    done
}

test_page
test_directory_run
test_binned
test_cut_short
test_no_layers
test_escaped_names
test_refusals
test_render
