#!/bin/sh
# xmesh-train gpt plan: output and errors. $1 = xmesh-train, $2 = scratch dir.
# Every check prints what it wanted and exits non-zero on a miss.
set -u
X=$1
D=$2
rm -rf "$D" && mkdir -p "$D" || exit 1
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect RC PATTERN -- command...: exit code RC and PATTERN (grep -E) in stdout+stderr
expect() {
    rc_want=$1 pat=$2
    shift 3
    "$@" >"$D/out" 2>&1
    rc=$?
    [ "$rc" -eq "$rc_want" ] || fail "'$*': exit $rc, want $rc_want: $(tail -3 "$D/out")"
    grep -Eq -- "$pat" "$D/out" || fail "'$*': no /$pat/ in: $(tail -3 "$D/out")"
}

# a table with 3 configurations and their command lines
expect 0 '^3 +mpirun -np 8 xmesh-train gpt .*--stage-mesh' -- \
    "$X" gpt plan --ranks 8 --hosts 2 --top 3
grep -q 'nominal (uncalibrated)' "$D/out" || fail "table does not label the nominal model"
# JSON: parseable, 2 configurations, best first
"$X" gpt plan --ranks 4 --hosts 2 --top 2 --json >"$D/plan.json" 2>"$D/err" || fail "json run: $(cat "$D/err")"
python3 - "$D/plan.json" <<'PY' || fail "JSON check"
import json, sys
j = json.load(open(sys.argv[1]))
c = j["configurations"]
assert len(c) == 2, len(c)
assert c[0]["step_s"] <= c[1]["step_s"], c
for k in ("command", "layout", "stage_mesh", "stage_strategy", "memory_bytes_per_rank",
          "boxing_bytes_per_rank", "boundary_bytes_per_rank", "bubble"):
    assert k in c[0], k
assert j["cost_model"].startswith("nominal (uncalibrated)"), j["cost_model"]
assert c[0]["command"].startswith("mpirun -np 4 xmesh-train gpt"), c[0]["command"]
for x in c:
    st = x["stages"]
    assert len(st) == x["nstages"] == len(x["stage_mesh"].split(",")), x
    for v in st:
        assert v["forward_s"] > 0 and v["backward_s"] > 0 and v["param_bytes"] > 0, v
        assert 0 < v["compute_s"] <= v["forward_s"] + v["backward_s"], v
PY
# the launcher's rank count when --ranks is absent
OMPI_COMM_WORLD_SIZE=2 expect 0 'on 2 ranks' -- "$X" gpt plan --top 1
# errors, each message checked
expect 1 '7 ranks cannot be factorized' -- "$X" gpt plan --ranks 7 --channels 128 --heads 4
expect 2 '--hosts 3 does not divide --ranks 8' -- "$X" gpt plan --ranks 8 --hosts 3
expect 1 'no configuration fits --memory-limit 1024 bytes per rank: the smallest memory any configuration needs is [0-9]+ bytes' -- \
    "$X" gpt plan --ranks 4 --memory-limit 1K
expect 2 "--memory-limit '12X': not a byte count" -- "$X" gpt plan --memory-limit 12X
expect 2 "--strategies 'dp,zero': unknown name 'zero'" -- "$X" gpt plan --strategies dp,zero
printf 'nic_gbps = 1\n[collectives]\nallreduce 2 2 1 1 fast 0.3 0.9 0.1 6 65536 8388608\n' >"$D/bad.txt"
expect 2 "--cluster '.*bad.txt': .*line 3.*alpha_us.*'fast'" -- "$X" gpt plan --cluster "$D/bad.txt"
expect 2 "--cluster '.*missing.txt'" -- "$X" gpt plan --cluster "$D/missing.txt"
# a file with base keys only: the nominal model from its rates, labelled
printf 'nic_gbps = 1\nlatency_us = 20\n' >"$D/base.txt"
expect 0 'nominal \(uncalibrated\): NIC 1 Gbit/s' -- "$X" gpt plan --ranks 4 --cluster "$D/base.txt" --top 1
# a calibrated model without sgemm records: the search says what is missing
printf '[collectives]\nallreduce 2 2 1 1 10 0.3 0.9 0.1 6 65536 8388608\n' >"$D/nogemm.txt"
expect 1 'not calibrated' -- "$X" gpt plan --ranks 2 --cluster "$D/nogemm.txt"

[ "$fails" -eq 0 ] || { echo "search_cli_test: $fails failures" >&2; exit 1; }
echo "search_cli_test: OK"
