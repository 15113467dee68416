#!/usr/bin/env bash
# Small correctness run on an emulated cluster of 3 hosts x 4 ranks:
# n-to-m case 7 ((1,4) -> (2,4), the only Table 2 case that fits 3 hosts)
# and the 1-to-m meshes up to (2,2), all methods, 2 MiB tensors, every
# destination element of every iteration checked. Fails on any wrong
# element, any failed row, or an xmesh row that did not run (a refused
# sendrecv-allgather strategy is only reported).
# usage: cluster-correctness.sh SOURCE_DIR XMESH_BENCH
set -u
src=${1:?source dir}
bench=${2:?xmesh-bench path}
cluster=$src/microbench/cluster/cluster.sh
msg=$("$cluster" check 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    echo "${msg:-cluster.sh check failed}"
    echo "SKIP: cannot build the emulated cluster here (needs root and network namespaces)"
    exit 77
fi
log=$(mktemp /tmp/xmesh-cluster-test.XXXXXX)
trap 'rm -f "$log"' EXIT
all=xmesh,sendrecv,sendrecv-allgather,naive,lb,mpi-bcast,mpi-ibcast,mpi-sendrecv-allgather,mpi-alltoallv
"$cluster" -H 3 -d 4 -r 1000mbit -- bash -c "
    \$XMH_MPIRUN -np \$XMH_NP $bench -s n-to-m -C 7 -m $all -b 2M -n 2 -w 0 -k 1M &&
    \$XMH_MPIRUN -np \$XMH_NP $bench -s 1-to-m -C 1x1,1x2,1x3,1x4,2x2 -m $all -b 2M -n 2 -w 0 -k 0
" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ $rc -ne 0 ]; then
    echo "FAIL: xmesh-bench exited $rc"
    exit 1
fi
# The Alpa-style strategy may be refused by the scheduler (no route model
# yet): reported, not failed. Every other row must run and be right.
if grep -q "sendrecv-allgather .*unsupported" "$log"; then
    echo "NOTE: sendrecv-allgather is unsupported by this library build"
fi
if grep -v "sendrecv-allgather .*unsupported" "$log" |
    grep -q "unsupported\|error\|WRONG\|setup-failed"; then
    echo "FAIL: some rows did not run or were wrong (see above)"
    exit 1
fi
# A run that printed no result rows proves nothing: every method must have
# produced rows (the refusable Alpa-style strategy excepted).
rowre='^ +[0-9x]+ +[a-z-]+ +[0-9]+ +[0-9.]+ '
n=$(grep -cE "$rowre" "$log")
if [ "$n" -eq 0 ]; then
    echo "FAIL: no result rows in xmesh-bench's output (nothing was checked)"
    exit 1
fi
missing=""
for m in ${all//,/ }; do
    [ "$m" = sendrecv-allgather ] && grep -q "sendrecv-allgather .*unsupported" "$log" && continue
    grep -E "$rowre" "$log" | grep -qE "^ +[0-9x]+ +$m " || missing="$missing $m"
done
if [ -n "$missing" ]; then
    echo "FAIL: $n rows, but none for:$missing"
    exit 1
fi
echo "PASS: $n rows ran, every method present, every destination element correct"
exit 0
