#!/bin/sh
# xmesh-train gpt/tokenize end to end: valid JSON with one record per step, a checkpoint
# that --init-from reads back, token files from `tokenize`, and errors that name bad values.
# usage: gpt_cli_test.sh XMESH_TRAIN TMPDIR PYTHON3
set -u
bin=$1
tmp=$2
py=${3:-python3}
mkdir -p "$tmp"
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
tiny="--layers 2 --heads 2 --channels 32 --seq 16 --batch 2"

# 1. three steps on the shipped text, JSON checked by json.tool and by content
"$bin" gpt --serial --steps 3 $tiny --json "$tmp/run.json" --save "$tmp/ck.bin" \
    >"$tmp/out.txt" 2>&1 || fail "gpt --serial --steps 3 exited $?: $(cat "$tmp/out.txt")"
"$py" -m json.tool "$tmp/run.json" >/dev/null || fail "run.json is not valid JSON"
"$py" - "$tmp/run.json" <<'EOF' || fail "run.json content"
import json, math, sys
d = json.load(open(sys.argv[1]))
steps = d["steps"]
assert [s["step"] for s in steps] == [0, 1, 2], steps
for s in steps:
    assert math.isfinite(s["loss"]) and 4.0 < s["loss"] < 7.0, s
    assert s["step_seconds"] > 0 and s["tokens_per_s"] > 0, s
assert d["model"]["num_layers"] == 2 and d["model"]["padded_vocab_size"] == 256
t = d["train"]
assert (t["batch"], t["seq"], t["lr"], t["beta1"], t["beta2"], t["eps"],
        t["weight_decay"], t["shuffle"]) == (2, 16, 1e-4, 0.9, 0.999, 1e-8, 0, True), t
assert d["summary"]["completed"] is True and d["summary"]["steps_done"] == 3
EOF
grep -q "^gpt serial: 3 steps" "$tmp/out.txt" || fail "summary line missing: $(cat "$tmp/out.txt")"

# 2. tokenize + --data + --init-from the saved checkpoint + --bench
"$bin" tokenize --text "$(dirname "$0")/../../pipeline/data/kjv_genesis.txt" \
    --out "$tmp/train.bin" --val-out "$tmp/val.bin" --val-fraction 0.1 >"$tmp/tok.txt" 2>&1 ||
    fail "tokenize exited $?: $(cat "$tmp/tok.txt")"
[ -f "$tmp/train_tokenizer.bin" ] || fail "tokenizer file not written"
"$bin" gpt --serial --init-from "$tmp/ck.bin" --data "$tmp/train.bin" --steps 3 --seq 16 \
    --batch 2 --bench --no-shuffle >"$tmp/bench.txt" 2>&1 || fail "resume/bench exited $?"
grep -q "median" "$tmp/bench.txt" || fail "bench output: $(cat "$tmp/bench.txt")"

# 3. bad flags: nonzero exit and the bad value named
check_err() { # expected-substring args...
    want=$1
    shift
    if "$bin" "$@" >"$tmp/err.txt" 2>&1; then
        fail "'$*' succeeded"
    elif ! grep -q -- "$want" "$tmp/err.txt"; then
        fail "'$*': message lacks '$want': $(cat "$tmp/err.txt")"
    fi
}
check_err "--batch 'abc'" gpt --serial --batch abc
check_err "--lr '-1'" gpt --serial --lr -1
check_err "--serial runs one process" gpt --serial --mesh 2x1 --steps 1
check_err "--schedule 'zigzag'" gpt --schedule zigzag --steps 1
check_err "--comm 'carrier-pigeon'" gpt --comm carrier-pigeon --steps 1
check_err "unknown flag '--bogus'" gpt --serial --bogus
check_err "num_heads 3" gpt --serial --heads 3 --channels 32 --steps 1
check_err "--seq 2048 exceeds" gpt --serial --seq 2048 --steps 1
check_err "bad magic" gpt --serial --init-from "$tmp/train.bin" --steps 1
check_err "no token file matches" gpt --serial --data "$tmp/none_*.bin" --steps 1
check_err "unknown command 'gtp'" gtp

if [ $fails -ne 0 ]; then
    echo "FAILED: $fails"
    exit 1
fi
echo "OK"
