#!/bin/sh
# A rank that fails in the middle of a training step must not leave the others hanging: with
# --inject-fail STEP:RANK the trainer makes that rank's first forward of the step fail. Passes
# only if the run exits with a clean non-zero status (1..125), within the deadline T
# (XMESH_TIMEOUT_S) plus the launch and the steps before, every rank of the job prints a line
# naming the failed rank ("rank R: stopped: rank F failed" or, on F itself, the injected
# error), and --check-serial, when given, reports FAILED (an incomplete run never passes).
# usage: test_inject_fail.sh NP FAILED_RANK T MAX_WALL_S command [args...]
np=$1
failed=$2
T=$3
max_wall=$4
shift 4
export XMESH_TIMEOUT_S=$T
t0=$(date +%s)
out=$("$@" 2>&1)
rc=$?
t1=$(date +%s)
printf '%s\n' "$out"
wall=$((t1 - t0))
bad=0
if [ "$rc" -eq 0 ] || [ "$rc" -gt 125 ]; then
    echo "inject-fail: exit status $rc (want a clean failure, 1..125)"
    bad=1
fi
if [ "$wall" -gt "$max_wall" ]; then
    echo "inject-fail: the job took $wall s (limit $max_wall s with XMESH_TIMEOUT_S=$T)"
    bad=1
fi
r=0
while [ "$r" -lt "$np" ]; do
    if [ "$r" -eq "$failed" ]; then
        want="rank $r: step"
        printf '%s\n' "$out" | grep -F -- "$want" | grep -qF -- "--inject-fail" || {
            echo "inject-fail: rank $r (the failed one) did not report its injected error"
            bad=1
        }
    else
        want="rank $r: stopped: rank $failed failed"
        printf '%s\n' "$out" | grep -qF -- "$want" || {
            echo "inject-fail: no line '$want'"
            bad=1
        }
    fi
    r=$((r + 1))
done
case " $* " in
*" --check-serial "*)
    printf '%s\n' "$out" | grep -q "check-serial: FAILED" || {
        echo "inject-fail: --check-serial did not report FAILED"
        bad=1
    }
    if printf '%s\n' "$out" | grep -q "check-serial: OK"; then
        echo "inject-fail: --check-serial said OK for a failed run"
        bad=1
    fi
    ;;
esac
[ "$bad" -eq 0 ] && echo "inject-fail: every rank ended in $wall s naming rank $failed (status $rc)"
exit "$bad"
