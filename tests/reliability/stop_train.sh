#!/usr/bin/env bash
# A rank of a training job stops answering (SIGSTOP from outside, for real) in the middle of
# training: every other rank must end with an error naming it within the deadline, and the job
# must end (issue 38 item 4). Judged from outside mpiexec:
#   - the job ends by itself (no hang) with a non-zero status, at most T + MARGIN seconds after
#     the stop and not before T - 0.5 s (nobody can know before the deadline);
#   - for every rank r other than the victim V, its line "rank r: stopped: rank V does not answer"
#     (the rank the survivor waited for, found by the engine's liveness pings, nn/coll.h), and
#     no line blaming another rank;
#   - the victim is killed at the end and no process of the job is left.
# T = XMESH_TIMEOUT_S and MARGIN are scaled by XMESH_TEST_TIME_SCALE (sanitizer builds).
#
# usage: stop_train.sh NP VICTIM T MARGIN MPIEXEC XMESH_TRAIN [xmesh-train args...]
# The job must run long enough to be stopped while it trains (many --steps, --log-steps: the
# victim is stopped once a second step line appeared).
set -u
np=${1:?ranks}
victim=${2:?victim}
T=${3:?timeout}
margin=${4:?margin}
mpiexec=${5:?mpiexec}
shift 5
scale=${XMESH_TEST_TIME_SCALE:-1}
T=$(awk -v t="$T" -v s="$scale" 'BEGIN { print t * s }')
margin=$(awk -v m="$margin" -v s="$scale" 'BEGIN { print m * s }')
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export XMESH_TIMEOUT_S=$T
# marks this job's processes (mpiexec passes the environment to its ranks)
export STOP_TRAIN_TAG="stop-train-$$-$RANDOM"
out=$(mktemp -d /tmp/xmesh-stop.XXXXXX)
vpid=""
cleanup() {
    [ -n "$vpid" ] && kill -KILL "$vpid" 2>/dev/null
    [ -n "${mpid:-}" ] && kill -KILL "$mpid" 2>/dev/null
    rm -rf "$out"
}
trap cleanup EXIT
fail() {
    echo "--- job output"
    cat "$out/log"
    echo "FAIL (stop_train): $*"
    exit 1
}

# the pid of world rank $1 of this job, empty while it does not exist
rank_pid() {
    local f p e
    for f in /proc/[0-9]*/environ; do
        p=${f#/proc/}
        p=${p%/environ}
        e=$({ tr '\0' '\n' <"$f"; } 2>/dev/null) || continue
        if printf '%s\n' "$e" | grep -qx "STOP_TRAIN_TAG=$STOP_TRAIN_TAG" &&
            printf '%s\n' "$e" | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
            echo "$p"
            return
        fi
    done
}

"$mpiexec" -n "$np" --oversubscribe "$@" >"$out/log" 2>&1 &
mpid=$!
start_limit=$(awk -v s="$scale" 'BEGIN { print int(120 * s) }')
t0=$(date +%s)
until [ "$(grep -c '^step [0-9]*:' "$out/log")" -ge 2 ]; do
    kill -0 "$mpid" 2>/dev/null || fail "the job ended before it could be stopped"
    [ $(($(date +%s) - t0)) -gt "$start_limit" ] && fail "no training step after $start_limit s"
    sleep 0.2
done
vpid=$(rank_pid "$victim")
[ -n "$vpid" ] || fail "no process of rank $victim found"
kill -STOP "$vpid" || fail "cannot stop rank $victim (pid $vpid)"
ts=$(date +%s.%N)
echo "stop_train: rank $victim (pid $vpid) stopped; XMESH_TIMEOUT_S=$T, margin $margin s"

limit=$(awk -v t="$T" -v m="$margin" 'BEGIN { print t + m }')
hung=0
while kill -0 "$mpid" 2>/dev/null; do
    el=$(awk -v a="$ts" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    if awk -v e="$el" -v l="$limit" 'BEGIN { exit !(e > l + 30) }'; then
        hung=1 # well past the bound: stop waiting, the verdict is already a failure
        break
    fi
    sleep 0.1
done
te=$(date +%s.%N)
if [ "$hung" -eq 1 ]; then
    kill -KILL "$mpid" 2>/dev/null
    fail "the job hung: still running $(awk -v a="$ts" -v b="$te" 'BEGIN { printf "%.1f", b - a }') s after the stop"
fi
wait "$mpid"
rc=$?
mpid=""
wall=$(awk -v a="$ts" -v b="$te" 'BEGIN { printf "%.2f", b - a }')
cat "$out/log" | grep -v '^step [0-9]*:' | head -60
echo "--- mpiexec exit $rc, $wall s after the stop"
[ "$rc" -ne 0 ] || fail "the job exited 0 with a stopped rank"
awk -v w="$wall" -v l="$limit" 'BEGIN { exit !(w <= l) }' ||
    fail "the job ended $wall s after the stop (limit T + margin = $limit s)"
awk -v w="$wall" -v t="$T" 'BEGIN { exit !(w >= t - 0.5) }' ||
    fail "the job ended $wall s after the stop, before the deadline T = $T s"
r=0
while [ "$r" -lt "$np" ]; do
    if [ "$r" -ne "$victim" ]; then
        grep -qF "rank $r: stopped: rank $victim does not answer" "$out/log" ||
            fail "rank $r did not end naming rank $victim"
        if grep -o "rank $r: stopped: rank [0-9]* does not answer" "$out/log" |
            grep -vqF "rank $r: stopped: rank $victim does not answer"; then
            fail "rank $r blamed another rank"
        fi
    fi
    r=$((r + 1))
done
# the victim: killed here if the launcher did not take it away
kill -KILL "$vpid" 2>/dev/null
for i in $(seq 1 50); do
    kill -0 "$vpid" 2>/dev/null || break
    sleep 0.1
done
kill -0 "$vpid" 2>/dev/null && fail "the stopped rank (pid $vpid) survived SIGKILL"
left=""
for q in $(seq 0 $((np - 1))); do
    p=$(rank_pid "$q")
    [ -n "$p" ] && left="$left $q:$p"
done
[ -z "$left" ] || fail "processes of the job left behind (rank:pid):$left"
vpid=""
echo "stop_train: every other rank of $np ended naming rank $victim, $wall s after the stop" \
    "(T = $T s, limit $limit s, exit $rc)"
exit 0
