#!/usr/bin/env bash
# xmesh-ckpt info: a checkpoint saved by test_ckpt on 4 ranks is summarised
# and verified (exit 0, its tensors and files listed); after one byte of a
# shard is flipped it reports that file BAD and exits 1; convert --to-llmc of
# this checkpoint (not a GPT-2 one) exits 1 naming the 'model' field, no file. Usage: ckpt_info_test.sh MPIEXEC TEST_CKPT XMESH_CKPT
set -u
mpiexec=$1 test_ckpt=$2 tool=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/xmesh-ckpt-info-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$mpiexec" -n 4 --oversubscribe "$test_ckpt" --trials 0 --keep-dir "$dir" >"$dir/save.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$dir/save.log"; fail "test_ckpt --keep-dir exited $rc"; }
out=$("$tool" info "$dir"); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "info on a good checkpoint exited $rc"
grep -q '^step        7$' <<<"$out" || fail "step 7 not shown"
grep -Eq '^  w +f32 +6x5 +2x2 +B,S\(0\) +B,S\(0\) +2 +120$' <<<"$out" || fail "tensor w line"
grep -Eq '^  model +tiny$' <<<"$out" || fail "metadata model"
[ "$(grep -Ec 'rank-0000[0-3].bin .* ok$' <<<"$out")" -eq 4 ] || fail "4 files verified ok"
grep -q '^verify      ok$' <<<"$out" || fail "verify ok"
f="$dir/step-00000007/rank-00001.bin"
printf '\x55' | dd of="$f" bs=1 seek=3 conv=notrunc status=none
out=$("$tool" info "$dir"); rc=$?
echo "$out"
[ $rc -eq 1 ] || fail "info on a corrupted shard exited $rc, want 1"
grep -Eq 'rank-00001.bin .* BAD$' <<<"$out" || fail "rank-00001.bin not reported BAD"
grep -q 'CRC32' <<<"$out" || fail "no CRC32 message"
out=$("$tool" convert "$dir" --to-llmc "$dir/x.bin" 2>&1); rc=$?
echo "$out"
[ $rc -eq 1 ] || fail "convert of a non-GPT-2 checkpoint exited $rc, want 1"
grep -q "metadata 'model'" <<<"$out" || fail "convert: no message naming the 'model' field"
[ ! -e "$dir/x.bin" ] || fail "convert wrote $dir/x.bin after an error"
echo "ckpt_info_test: OK"
