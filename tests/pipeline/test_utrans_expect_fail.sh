#!/bin/sh
# Runs a command that must be refused: passes only if the command exits with a non-zero status
# that is not a crash (1..125) AND its output contains the expected message (fixed string).
# usage: test_utrans_expect_fail.sh 'expected message' command [args...]
want=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ] || [ "$rc" -gt 125 ]; then
    echo "expect-fail: exit status $rc (want a clean refusal, 1..125)"
    exit 1
fi
if ! printf '%s\n' "$out" | grep -qF -- "$want"; then
    echo "expect-fail: output lacks the expected message: $want"
    exit 1
fi
echo "expect-fail: refused with status $rc and the expected message"
exit 0
