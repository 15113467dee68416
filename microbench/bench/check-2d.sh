#!/usr/bin/env bash
# CTest check of xmesh-bench's 2d suite (label mpi): 8 ranks as 4 virtual
# hosts of 2, a 64 x 64 f64 matrix, every destination element of every
# iteration checked by the bench (its #wrong column). Passes when
#   - the bench exits 0 (it exits 1 on any wrong element or failed row),
#   - xmesh ran all eight 4-rank cases with 0 wrong elements,
#   - scalapack-pdgemr2d ran the five block-layout cases it can express with
#     0 wrong elements and reported the other three as n/a; when the bench
#     was built without ScaLAPACK this part is skipped (rows say not-built).
# usage: check-2d.sh MPIEXEC NUMPROC_FLAG XMESH_BENCH [extra mpiexec flags...]
set -u
mpiexec=${1:?mpiexec}
npflag=${2:?numproc flag}
bench=${3:?xmesh-bench path}
shift 3
json=$(mktemp /tmp/xmesh-bench-2d.XXXXXX)
trap 'rm -f "$json"' EXIT
"$mpiexec" "$npflag" 8 --oversubscribe "$@" "$bench" -s 2d -b 32K -n 2 -w 1 -V 2 -k 0 -B -p 2 \
    -m xmesh,mpi-alltoallv,scalapack-pdgemr2d -J "$json"
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL: xmesh-bench exited $rc (wrong elements or failed rows, see above)"
    exit 1
fi
fail=0
# rows METHOD STATUS: how many 2d rows of METHOD have STATUS and 0 wrong.
rows() {
    grep '"suite": "2d"' "$json" | grep "\"method\": \"$1\"" | grep "\"status\": \"$2\"" |
        grep -c '"wrong": 0,'
}
allrows() { grep '"suite": "2d"' "$json" | grep -c "\"method\": \"$1\""; }
n=$(rows xmesh ok)
if [ "$n" -ne 8 ] || [ "$(allrows xmesh)" -ne 8 ]; then
    echo "FAIL: xmesh: $n of 8 cases ran with 0 wrong elements"
    fail=1
fi
if grep -q '"scalapack_built": 1' "$json"; then
    ok=$(rows scalapack-pdgemr2d ok) na=$(rows scalapack-pdgemr2d n/a)
    if [ "$ok" -ne 5 ] || [ "$na" -ne 3 ] || [ "$(allrows scalapack-pdgemr2d)" -ne 8 ]; then
        echo "FAIL: scalapack-pdgemr2d: $ok of 5 expressible cases right, $na of 3 n/a"
        fail=1
    fi
else
    echo "NOTE: scalapack-pdgemr2d not built (ScaLAPACK not found): its part is skipped"
fi
if grep '"suite": "2d"' "$json" | grep -v '"wrong": 0,' | grep -q .; then
    echo "FAIL: some row has wrong elements"
    fail=1
fi
# The same cases with -R: xmesh sees the one real host, so every hop is a
# shared-memory hop that keeps its whole window of sends in flight (8 MiB:
# tasks of several 256 KiB chunks).
"$mpiexec" "$npflag" 8 --oversubscribe "$@" "$bench" -s 2d -b 8M -n 1 -w 1 -V 2 -R -k 0 -B -p 1 \
    -m xmesh -J "$json"
rc=$?
if [ $rc -ne 0 ]; then
    echo "FAIL: xmesh-bench -R exited $rc (wrong elements or failed rows, see above)"
    fail=1
elif [ "$(rows xmesh ok)" -ne 8 ] || [ "$(allrows xmesh)" -ne 8 ]; then
    echo "FAIL: xmesh -R (one real host): $(rows xmesh ok) of 8 cases ran with 0 wrong elements"
    fail=1
fi
# -R alone is refused, naming it.
out=$("$mpiexec" "$npflag" 1 --oversubscribe "$@" "$bench" -s 2d -R 2>&1)
rc=$?
if [ $rc -ne 2 ] || ! printf '%s' "$out" | grep -q -- '-R needs -V'; then
    echo "FAIL: xmesh-bench -R without -V: exit $rc, want 2 and a message naming -R: $out"
    fail=1
fi
[ $fail -eq 0 ] && echo "PASS: 2d suite, every destination element correct (virtual and one real host)"
exit $fail
