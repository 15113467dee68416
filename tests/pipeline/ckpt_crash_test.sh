#!/usr/bin/env bash
# A save killed after half the ranks wrote their shard (XMESH_CKPT_CRASH=2:exit:
# every rank _exit()s there, as killed processes would) leaves the previous
# checkpoint loadable and verified, no step directory for the killed save,
# and the next save removes its leftovers.
# Usage: ckpt_crash_test.sh MPIEXEC TEST_CKPT XMESH_CKPT
set -u
mpiexec=$1 test_ckpt=$2 tool=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/xmesh-ckpt-crash-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; ls -laR "$dir"; exit 1; }
run() { "$mpiexec" -n 4 --oversubscribe "$test_ckpt" --save-only "$dir" "$1"; }
run 7; rc=$?; [ $rc -eq 0 ] || fail "save of step 7 exited $rc"
XMESH_CKPT_CRASH=2:exit run 8 >"$dir/crash.log" 2>&1 && fail "the killed save exited 0"
grep -q "exits after the shards" "$dir/crash.log" || { cat "$dir/crash.log"; fail "no crash"; }
[ -e "$dir/step-00000008" ] && fail "step-00000008 exists after the killed save"
[ -f "$dir/.step-00000008.tmp/rank-00000.bin" ] && [ -f "$dir/.step-00000008.tmp/rank-00001.bin" ] \
  || fail "the killed save left no partial shards (the test would prove nothing)"
[ -e "$dir/.step-00000008.tmp/rank-00002.bin" ] && fail "rank 2 wrote although it was killed first"
[ -e "$dir/.step-00000008.tmp/MANIFEST" ] && fail "the killed save wrote a manifest"
out=$("$tool" info "$dir"); rc=$?; [ $rc -eq 0 ] || fail "info after the crash exited $rc: $out"
grep -q '^step        7$' <<<"$out" || fail "info after the crash does not show step 7: $out"
grep -q '^verify      ok$' <<<"$out" || fail "step 7 does not verify after the crash"
run 9; rc=$?; [ $rc -eq 0 ] || fail "save of step 9 exited $rc"
[ -e "$dir/.step-00000008.tmp" ] && fail "the next save left .step-00000008.tmp"
out=$("$tool" info "$dir"); rc=$?; [ $rc -eq 0 ] || fail "info after step 9 exited $rc"
grep -q '^step        9$' <<<"$out" || fail "info does not show step 9"
echo "ckpt_crash_test: OK"
