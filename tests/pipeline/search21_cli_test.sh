#!/usr/bin/env bash
# pipeline.search.ut.cli: `xmesh-train utransformer plan` (table, JSON, --exhaustive equal to the
# search on a small space, --eval, errors with their exit codes) and `gpt plan --ablate`.
# $1: xmesh-train, $2: a scratch directory.
set -u
X=$1
D=$2
mkdir -p "$D"
fail=0
err() { echo "FAIL: $*" >&2; fail=1; }
py() { python3 -c "$1" "${@:2}"; }

# table: 3 rows, each with a command line that names the model and the layout
"$X" utransformer plan --ranks 4 --hosts 2 --batch 4 --top 3 --seed 5 >"$D/t.txt" 2>&1 || err "table exit $?"
grep -q 'seed 5' "$D/t.txt" || err "the seed is not printed"
[ "$(grep -c 'xmesh-train utransformer --base-channels 8' "$D/t.txt")" = 3 ] || err "3 command lines expected: $(cat "$D/t.txt")"
# JSON: search and exhaustive give the same best step on this small space
"$X" utransformer plan --ranks 4 --hosts 2 --batch 4 --top 3 --json >"$D/s.json" || err "json exit $?"
"$X" utransformer plan --ranks 4 --hosts 2 --batch 4 --top 3 --json --exhaustive >"$D/e.json" || err "exhaustive exit $?"
py '
import json, sys
s = json.load(open(sys.argv[1])); e = json.load(open(sys.argv[2]))
assert len(s["configurations"]) == 3 and len(e["configurations"]) == 3, "3 configurations"
a, b = s["configurations"][0]["step_s"], e["configurations"][0]["step_s"]
assert abs(a - b) <= 1e-9 * b, "search %r vs exhaustive %r" % (a, b)
steps = [c["step_s"] for c in s["configurations"]]
assert steps == sorted(steps), "not sorted"
for c in s["configurations"]:
    n = sum(int(x.split("*")[1]) for x in c["layout"].split("|"))
    assert n == 13, "layout %s holds %d layers" % (c["layout"], n)

' "$D/s.json" "$D/e.json" || err "JSON checks"
# --eval of the best: the same step time
read -r lay mesh strat sched M < <(py '
import json, sys
c = json.load(open(sys.argv[1]))["configurations"][0]
print(c["layout"], c["stage_mesh"], c["stage_strategy"], c["schedule"], c["microbatches"])' "$D/s.json")
"$X" utransformer plan --eval --json --ranks 4 --hosts 2 --batch 4 --layout "$lay" --stage-mesh "$mesh" \
    --stage-strategy "$strat" --schedule "$sched" --microbatches "$M" >"$D/v.json" || err "eval exit $?"
py '
import json, sys
a = json.load(open(sys.argv[1]))["configurations"][0]["step_s"]; b = json.load(open(sys.argv[2]))["step_s"]
assert a == b, "search %r vs eval %r" % (a, b)
m = json.load(open(sys.argv[2]))["rank_memory_bytes"]
assert len(m) == 4 and max(m) == json.load(open(sys.argv[2]))["memory_bytes_per_rank"]
' "$D/s.json" "$D/v.json" || err "eval checks"
# memory limit: exit 1 and the smallest need, which then fits
"$X" utransformer plan --ranks 4 --hosts 2 --batch 4 --memory-limit 1K >"$D/m.txt" 2>&1
rc=$?
[ $rc = 1 ] || err "memory limit: exit $rc"
need=$(sed -n 's/.*any configuration needs is \([0-9]*\) bytes.*/\1/p' "$D/m.txt")
[ -n "$need" ] || err "memory limit message: $(cat "$D/m.txt")"
if [ -n "$need" ]; then
    "$X" utransformer plan --ranks 4 --hosts 2 --batch 4 --memory-limit "$need" --top 1 >/dev/null || err "limit $need: nothing found"
fi
# errors: exit 2 with the bad value named
"$X" utransformer plan --ranks 8 --hosts 3 >"$D/h.txt" 2>&1
[ $? = 2 ] && grep -q -- '--hosts 3 does not divide --ranks 8' "$D/h.txt" || err "hosts: $(cat "$D/h.txt")"
"$X" utransformer plan --ranks 4 --ablate share >"$D/a.txt" 2>&1
[ $? = 2 ] && grep -q "ablate 'share'" "$D/a.txt" || err "ablate: $(cat "$D/a.txt")"
"$X" utransformer plan --ranks 4 --strategies nosuch >"$D/n.txt" 2>&1
[ $? = 1 ] && grep -q 'cannot be factorized' "$D/n.txt" || err "unknown strategies: $(cat "$D/n.txt")"
# gpt plan --ablate boundary: accepted, a 2-stage configuration is no slower without it
g=(--ranks 8 --hosts 4 --layers 4 --heads 4 --channels 128 --seq 64 --batch 16 --layout 'E,t*2|t*2,L'
   --stage-mesh 4,4 --stage-strategy dp,dp --schedule 1f1b --microbatches 2 --eval --json)
"$X" gpt plan "${g[@]}" >"$D/g1.json" || err "gpt eval exit $?"
"$X" gpt plan "${g[@]}" --ablate boundary >"$D/g2.json" || err "gpt --ablate boundary exit $?"
py '
import json, sys
a = json.load(open(sys.argv[1]))["step_s"]; b = json.load(open(sys.argv[2]))["step_s"]
assert b < a, "without the boundary %r, with %r" % (b, a)' "$D/g1.json" "$D/g2.json" || err "ablate boundary"
exit $fail
