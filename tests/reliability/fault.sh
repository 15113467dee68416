#!/usr/bin/env bash
# Runs fault_peer under mpiexec and judges the outcome from outside: the
# per-rank result files, mpiexec's exit status and the wall time.
#
# usage: fault.sh SCENARIO MPIEXEC FAULT_PEER NP TIMEOUT_S [fault_peer args...]
#   stop-abort   victim SIGSTOPped for good: every survivor PASSes (TIMEOUT
#                naming the victim, cleanup ok), then MPI_Abort ends the job
#                (exit 42) and no process of the job is left behind
#   stop-resume  the victim is resumed after the survivors timed out: every
#                rank, the victim too, returns and MPI_Finalize succeeds (exit 0)
#   kill         victim SIGKILLed under a plain mpiexec. What xmesh can be
#                judged on here: no survivor may report anything but PASS
#                (TIMEOUT/REMOTE naming the victim, destination untouched or
#                new, cleanup ok) -- never SUCCESS, a wrong peer or garbage;
#                if the job outlived XMESH_TIMEOUT_S after the kill, every
#                survivor must have reported (xmesh had its chance to detect
#                the death, so silence is a hang); and the job ends within the
#                timeout + margin (xmesh's own bound, not mpiexec's). Open MPI
#                4.1 usually kills the survivors within ~1 s, before the
#                timeout: then the run shows only that xmesh did not return a
#                wrong result in that window, and says so; detection itself is
#                asserted by kill-recovery, where the launcher keeps the
#                survivors alive. mpiexec's own messages are not evidence.
#   kill-recovery  the same under `mpiexec --enable-recovery` (the launcher
#                keeps the job alive): every survivor must PASS, i.e. return
#                TIMEOUT/REMOTE naming the dead rank and clean up
set -u
scenario=${1:?scenario}
mpiexec=${2:?mpiexec}
bin=${3:?fault_peer}
np=${4:?ranks}
tmo=${5:?timeout}
shift 5
# Sanitizer builds run several times slower: XMESH_TEST_TIME_SCALE (default 1)
# stretches the timeout and xmesh's margin alike, so the bounds stay the same
# bounds in units of the build's speed. The margin is fault_peer's --margin
# (given last, so it wins over the one CMake passes).
scale=${XMESH_TEST_TIME_SCALE:-1}
rmargin=$(awk -v s="$scale" 'BEGIN { print 2.5 * s }')
tmo=$(awk -v t="$tmo" -v s="$scale" 'BEGIN { print t * s }')
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export XMESH_TIMEOUT_S=$tmo
mpiflags=()
out=$(mktemp -d /tmp/xmesh-fault.XXXXXX)
trap 'rm -rf "$out"' EXIT
case $scenario in
stop-abort) args=(--mode stop) ;;
stop-resume) args=(--mode stop --resume) ;;
kill) args=(--mode kill) ;;
kill-recovery) args=(--mode kill) mpiflags=(--enable-recovery) ;;
*) echo "fault.sh: unknown scenario '$scenario'"; exit 2 ;;
esac
# Wall-time bound of the whole job: start-up and warm-up under load, the
# timeout, cleanup. CTest's TIMEOUT is the outer guard against a hang.
limit=$(awk -v t="$tmo" 'BEGIN { print t + 40 }')
t0=$(date +%s.%N)
timeout -k 5 "$limit" "$mpiexec" -n "$np" --oversubscribe "${mpiflags[@]}" "$bin" "${args[@]}" --out "$out" "$@" --margin "$rmargin" \
    >"$out/stdout" 2>"$out/stderr"
rc=$?
t1=$(date +%s.%N)
cat "$out"/stdout
sed -n '1,40p' "$out"/stderr
echo "--- per-rank result files"
cat "$out"/rank.* 2>/dev/null
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "--- mpiexec exit $rc after $wall s"
fail() { echo "FAIL ($scenario): $*"; exit 1; }
[ $rc -eq 124 ] && fail "the job hung: killed after $limit s"
victim_pid=$(sed -n 's/^inject: rank [0-9]* pid \([0-9]*\) .*/\1/p' "$out"/rank.* | head -1)
fired=$(sed -n 's/^inject: .* at t=\([0-9.]*\)$/\1/p' "$out"/rank.* | head -1)
[ -n "$victim_pid" ] && [ -n "$fired" ] || fail "the victim never raised its signal"
# No process of the job may outlive it (a stopped one keeps its SIGTERM
# pending; the launcher must follow up with SIGKILL).
for i in $(seq 1 50); do
    kill -0 "$victim_pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$victim_pid" 2>/dev/null; then
    st=$(ps -o stat= -p "$victim_pid")
    kill -KILL "$victim_pid" 2>/dev/null
    fail "victim process $victim_pid (state $st) still exists 5 s after mpiexec returned"
fi
[ "$i" -gt 1 ] && echo "note: the victim process went away $(awk -v i="$i" 'BEGIN { print (i - 1) / 10 }') s after mpiexec returned"
npass=$(cat "$out"/rank.* | grep -c '^fault: rank [0-9]*: PASS')
nfail=$(cat "$out"/rank.* | grep -c 'FAIL')
[ "$nfail" -eq 0 ] || fail "$nfail rank(s) reported FAIL"
end_after=$(awk -v a="$fired" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
case $scenario in
stop-abort)
    [ "$npass" -eq $((np - 1)) ] || fail "$npass of $((np - 1)) survivors passed"
    [ $rc -eq 42 ] || fail "mpiexec exit $rc, want 42 (the survivors' MPI_Abort)"
    ;;
stop-resume)
    [ "$npass" -eq $((np - 1)) ] || fail "$npass of $((np - 1)) survivors passed"
    grep -q '(victim, resumed): PASS' "$out"/rank.* || fail "the resumed victim did not pass"
    nfin=$(cat "$out"/rank.* | grep -c 'MPI_Finalize returned')
    [ "$nfin" -eq "$np" ] || fail "$nfin of $np ranks returned from MPI_Finalize"
    [ $rc -eq 0 ] || fail "mpiexec exit $rc, want 0"
    ;;
kill-recovery)
    [ "$npass" -eq $((np - 1)) ] || fail "$npass of $((np - 1)) survivors passed"
    # Open MPI 4.1 exits 0 here although the survivors called MPI_Abort(42).
    echo "kill-recovery: every survivor returned TIMEOUT/REMOTE naming the victim; the job ended $end_after s after SIGKILL"
    ;;
kill)
    [ $rc -ne 0 ] || fail "mpiexec exit 0 although a rank was killed"
    # Any survivor that reported said PASS (nfail = 0 above); what it saw:
    nrep=$(cat "$out"/rank.* | grep -c '^fault: rank [0-9]*: reshard -> ')
    nsucc=$(cat "$out"/rank.* | grep '^fault: rank [0-9]*: reshard -> SUCCESS' | wc -l)
    # The source is the victim (role src): nobody may claim success.
    if grep -q 'victim rank 0 ' "$out"/rank.* "$out"/stdout 2>/dev/null; then
        [ "$nsucc" -eq 0 ] || fail "$nsucc survivor(s) returned SUCCESS although the only source died"
    fi
    # xmesh's bound: a survivor returns within timeout + margin of the kill.
    margin=$(awk -v t="$tmo" -v m="$rmargin" 'BEGIN { print t + m + 3 }') # + abort and teardown of the job
    awk -v e="$end_after" -v b="$margin" 'BEGIN { exit !(e <= b) }' ||
        fail "the job ended $end_after s after the kill, want <= $margin s (XMESH_TIMEOUT_S + margin)"
    if awk -v e="$end_after" -v t="$tmo" -v m="$rmargin" 'BEGIN { exit !(e >= t + m) }'; then
        # The timeout and xmesh's margin had expired while the survivors
        # lived: each must have detected the death and passed. (Between the
        # timeout and timeout + margin a survivor may still be on its way.)
        [ "$npass" -eq $((np - 1)) ] ||
            fail "the job lived $end_after s >= XMESH_TIMEOUT_S=$tmo + margin $rmargin after the kill, but only $npass of $((np - 1)) survivors reported PASS"
        how="every survivor returned TIMEOUT/REMOTE naming the victim ($npass PASS), then MPI_Abort"
    else
        how="the launcher ended the job $end_after s after SIGKILL, before XMESH_TIMEOUT_S=$tmo + margin $rmargin expired: $npass survivor(s) had reported (all PASS), $nrep returned at all, none returned a wrong result; detection is checked by kill-recovery"
    fi
    echo "kill: $how"
    ;;
esac
echo "PASS ($scenario): mpiexec exit $rc, job ended $end_after s after the signal, wall $wall s"
exit 0
