#!/bin/sh
# xmesh-train schedule: simulated steps checked against hand-computed timelines, and refusals
# that name the bad value. $1 = xmesh-train, $2 = scratch dir. Every check prints what it
# wanted and the test exits non-zero on a miss.
set -u
X=$1
D=$2
rm -rf "$D" && mkdir -p "$D" || exit 1
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# step S -- args: the simulated step (JSON) equals S to 1e-9
step_is() {
    want=$1
    shift 2
    "$X" schedule "$@" --json "$D/s.json" >"$D/out" 2>&1 || { fail "'$*': exit $?: $(cat "$D/out")"; return; }
    python3 - "$D/s.json" "$want" <<'PY' || fail "'$*': step is not $want"
import json, sys
j = json.load(open(sys.argv[1]))
want = float(sys.argv[2])
if abs(j["step_s"] - want) > 1e-9:
    print("step_s", j["step_s"], "want", want)
    sys.exit(1)
PY
}
# expect RC PATTERN -- args: exit code RC and PATTERN (grep -E) in stdout+stderr
expect() {
    rc_want=$1 pat=$2
    shift 3
    "$X" schedule "$@" >"$D/out" 2>&1
    rc=$?
    [ "$rc" -eq "$rc_want" ] || fail "'$*': exit $rc, want $rc_want: $(tail -3 "$D/out")"
    grep -Eq -- "$pat" "$D/out" || fail "'$*': no /$pat/ in: $(tail -3 "$D/out")"
}

# GPipe, 2 stages, 2 microbatches, unit F/I/W (a backward 2), transfers 0.5: s0 F0 [0,1] F1
# [1,2]; s1 F0 [1.5,2.5] F1 [2.5,3.5] B0 [3.5,5.5] B1 [5.5,7.5]; s0 B0 [6,8] B1 [8,10]
step_is 10 -- --schedule gpipe --stages 2 --microbatches 2 --f 1 --i 1 --w 1 --xfer 0.5
python3 - "$D/s.json" <<'PY' || fail "gpipe bubbles/busy"
import json, sys
j = json.load(open(sys.argv[1]))
assert [round(b, 9) for b in j["bubble_per_stage"]] == [0.4, 0.4], j
assert [round(b, 9) for b in j["busy_s_per_stage"]] == [6.0, 6.0], j
assert (j["schedule"], j["stages"], j["microbatches"]) == ("gpipe", 2, 2), j
PY
# 1F1B with no transfer time: s1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; s0 B1 ends at 9
step_is 9 -- --schedule 1f1b --stages 2 --microbatches 2 --f 1 --i 1 --w 1
# per-stage costs: s0 F [0,1]; s1 F [1,3] B [3,5]; s0 B [5,7]
step_is 7 -- --schedule gpipe --stages 2 --microbatches 1 --f 1,2 --i 1 --w 1
# plan order (activation, gradient): 6 + 0.5 and 6 + 0.25 on one microbatch
step_is 6.5 -- --schedule gpipe --stages 2 --microbatches 1 --f 1 --i 1 --w 1 --xfer 0.5,0
step_is 6.25 -- --schedule gpipe --stages 2 --microbatches 1 --f 1 --i 1 --w 1 --xfer 0,0.25
# a skip edge 0>2 beside the chain: s2 waits for the slower path (the skip's 3.5 s): F
# [4.5,5.5] B [5.5,7.5]; s1 B [7.5,9.5]; s0 B (both gradients in) [9.5,11.5]
step_is 11.5 -- --schedule gpipe --stages 3 --microbatches 1 --f 1 --i 1 --w 1 \
    --edges '0>1,1>2,0>2' --xfer 0,0,0,0,3.5,0
# two edges 0>1 share stage 0's NIC out and stage 1's NIC in (one transfer at a time): acts
# [1,2] [2,3], F [3,4] B [4,6], grads [6,7] [7,8], B [8,10]; --own-links: each edge its own
step_is 10 -- --schedule gpipe --stages 2 --microbatches 1 --f 1 --i 1 --w 1 --edges '0>1,0>1' \
    --xfer 1
step_is 8 -- --schedule gpipe --stages 2 --microbatches 1 --f 1 --i 1 --w 1 --edges '0>1,0>1' \
    --xfer 1 --own-links
# blocking receivers never beat posted ones; weight-gradient delay never loses here
for sch in 1f1b eager-1f1b; do
    "$X" schedule --schedule $sch --stages 4 --microbatches 8 --f 1 --i 1 --w 1 --xfer 0.7 \
        --json "$D/a.json" >/dev/null && "$X" schedule --schedule $sch --stages 4 \
        --microbatches 8 --f 1 --i 1 --w 1 --xfer 0.7 --blocking --json "$D/b.json" >/dev/null &&
        "$X" schedule --schedule $sch --stages 4 --microbatches 8 --f 1 --i 1 --w 1 --xfer 0.7 \
            --delay-wgrad --json "$D/c.json" >/dev/null || fail "$sch runs"
    python3 - "$D/a.json" "$D/b.json" "$D/c.json" <<'PY' || fail "$sch: blocking / delay order"
import json, sys
a, b, c = (json.load(open(p))["step_s"] for p in sys.argv[1:])
print("posted", a, "blocking", b, "delayed W", c)
assert b > a and c <= a, (a, b, c)
PY
done
# --render draws the timeline
expect 0 '^s1 +\|' -- --schedule 1f1b --stages 2 --microbatches 2 --f 1 --i 1 --w 1 --render

# refusals name the bad value
expect 2 "--f '1,2,3': more than the 2 values" -- --schedule 1f1b --stages 2 --microbatches 2 \
    --f 1,2,3 --i 1 --w 1
expect 2 "--w 'x': entry 1 is not a number" -- --schedule 1f1b --stages 2 --microbatches 2 \
    --f 1 --i 1 --w x
expect 2 "--i '-1': entry 1" -- --schedule 1f1b --stages 2 --microbatches 2 --f 1 --i -1 --w 1
expect 2 "--xfer '1,2,3': more than the 2 values" -- --schedule 1f1b --stages 2 \
    --microbatches 2 --f 1 --i 1 --w 1 --xfer 1,2,3
expect 2 "--edges '0>2': entry 1" -- --schedule 1f1b --stages 2 --microbatches 2 --f 1 --i 1 \
    --w 1 --edges '0>2'
expect 2 "--schedule 'zb-v': places several stages" -- --schedule zb-v --stages 2 \
    --microbatches 2 --f 1 --i 1 --w 1
expect 2 "--schedule 'nope': unknown" -- --schedule nope --stages 2 --microbatches 2 --f 1 \
    --i 1 --w 1
expect 2 "M=1.*S=2|microbatch" -- --schedule 1f1b --stages 2 --microbatches 1 --f 1 --i 1 --w 1
expect 2 "are required" -- --schedule 1f1b --stages 2
# an unwritable --json: exit 1 naming it, and no result printed as if it had worked
expect 1 "--json '$D/no/such/dir/s.json': cannot create" -- --schedule 1f1b --stages 2 \
    --microbatches 2 --f 1 --i 1 --w 1 --json "$D/no/such/dir/s.json"
grep -q '^schedule ' "$D/out" && fail "a failed --json still printed the step"

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed" >&2; exit 1; }
echo "schedule CLI: all checks passed"
