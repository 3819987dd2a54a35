# lib.sh — helpers shared by the command-line tests (sourced, not run): the binary $M, a
# scratch directory $work removed on exit, ok/fail lines, expect_error, losses.
M=${MOETRON:?set MOETRON to the moetron binary}
source "$(dirname "${BASH_SOURCE[0]}")/sanitizer_build.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# MLA: a tiny Multi-Latent Attention (the flags the model-family tests share)
MLA=(--multi-latent-attention --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8 --v-head-dim 12)

# SAFETENSORS_PY: python source of header(path) -> (header dict, data bytes) of a safetensors
# file, for the scripts' inline python (standard library only)
SAFETENSORS_PY='
import json, struct
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        return h, f.read()
'

ok() { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }

# make_corpus FILE SEED PARAGRAPHS MIN MAX: paragraphs of MIN to MAX generated English-like
# words, each a document once prepared with --append-eod
make_corpus() {
    python3 - "$@" <<'PY'
import random, sys
path, seed, paragraphs, low, high = sys.argv[1], *map(int, sys.argv[2:6])
rng = random.Random(seed)
words = "the a cat dog sat ran on under mat tree big small red blue quickly slowly and then".split()
with open(path, "w") as f:
    for p in range(paragraphs):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(low, high))) + ".\n\n")
PY
}

# expect_error NAME PATTERN -- command...: non-zero exit, exactly one stderr line
# "moetron: error: ..." matching PATTERN, nothing half-written to stdout. Returns 1 on failure.
expect_error() {
    local name=$1 pattern=$2
    shift 3
    "$@" >"$work/out" 2>"$work/err"
    local rc=$? lines
    lines=$(wc -l <"$work/err")
    if [ $rc -eq 0 ]; then fail "$name" "exit status 0"; return 1; fi
    if [ "$lines" -ne 1 ]; then fail "$name" "expected one stderr line, got $lines: $(head -c 300 "$work/err")"; return 1; fi
    if ! grep -q "^moetron: error: .*$pattern" "$work/err"; then fail "$name" "message '$(cat "$work/err")' lacks '$pattern'"; return 1; fi
    ok "$name"
}

# losses of a JSONL log, one line per step (timings left out)
losses() { grep '"loss"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([^,]*),"lm_loss":([^,]*),"aux_loss":([^,]*),"z_loss":[^,]*,"grad_norm":([^,]*),.*/\1 \2 \3 \4 \5/'; }

# wait_for FILE PATTERN PID: returns once FILE has a line matching PATTERN (status 0), or
# once process PID has ended without it (status 1). Synchronises a test on what a program
# writes, never on how long it takes: tail follows the file as it grows (looking every 50 ms,
# so a run is seen soon after it writes) and ends with PID; the bound (10 minutes) only keeps
# a broken run from hanging the suite.
wait_for() {
    local file=$1 pattern=$2 pid=$3
    grep -q -m1 -- "$pattern" < <(timeout 600 tail --pid="$pid" -s 0.05 -n +1 -F "$file" 2>/dev/null)
}

# same_steps NAME A B [FROM [LOG]]: JSONL log A has the steps of B from its FROM-th step on
# (default 1) bit for bit (step_numbers); LOG's last line tells why A has none
same_steps() {
    local a b
    a=$(step_numbers "$2") b=$(step_numbers "$3" | tail -n +"${4:-1}")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        ok "$1"
    else
        fail "$1" "$(diff <(echo "$a") <(echo "$b") | head -2 | tr '\n' ' ') ${5:+$(tail -1 "$5")}"
    fi
}

# step_numbers FILE: each step's loss, lm loss, aux loss, z loss and gradient norm of a JSONL
# log, one line per step in Python's repr (every bit shows; no timings)
step_numbers() { python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "loss" in d: print(d["step"], d["loss"], d["lm_loss"], d["aux_loss"], d["z_loss"], d["grad_norm"])
PY
}
