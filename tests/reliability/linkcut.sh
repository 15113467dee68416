#!/usr/bin/env bash
# A host's link cut in the middle of a reshard, on the emulated cluster
# (microbench/cluster/cluster.sh: 3 network-namespace hosts, 1 rank each,
# shaped 200 Mbit/s NICs, ranks talk TCP through the NICs).
#
# usage: linkcut.sh SOURCE_DIR FAULT_PEER src|dst [TIMEOUT_S]
#   src  the sole source (rank 0, host 0) loses its link after its 3rd
#        256 KiB chunk: both receivers must time out naming rank 0;
#   dst  receiver rank 2 (host 2) loses its link after posting its 20th
#        receive: rank 0 must time out naming rank 2, rank 1 must finish
#        with correct data.
# The victim, alive but cut off, must time out as well. Every rank then
# destroys its handles and calls MPI_Abort(42); once every rank has
# reported, the link comes back up so that the launcher can end the job.
# fault_peer marks the moment with a file (PMPI injector, INJ_MARK); this
# script, outside the namespaces, cuts the link: `ip link set eth0 down`
# inside the victim's namespace. Exit 77 if namespaces cannot be made.
set -u
src=${1:?source dir}
bin=${2:?fault_peer}
role=${3:?src or dst}
tmo=${4:-3}
cluster=$src/microbench/cluster/cluster.sh
msg=$("$cluster" check 2>&1)
if [ $? -ne 0 ]; then
    echo "${msg:-cluster.sh check failed}"
    echo "SKIP: cannot build the emulated cluster here (needs root and network namespaces)"
    exit 77
fi
out=$(mktemp -d /tmp/xmesh-linkcut.XXXXXX)
trap 'rm -rf "$out"' EXIT
case $role in
src) victim_host=0 args=(--role src --after 3) ;;
dst) victim_host=2 args=(--role dst --after 20) ;;
*) echo "linkcut.sh: role must be src or dst"; exit 2 ;;
esac
margin=2.5
export OUT=$out BIN=$bin TMO=$tmo VHOST=$victim_host MARGIN=$margin
export ARGS="${args[*]}"
# Inside cluster.sh: $PPID is cluster.sh, whose objects are named xmh<pid>-.
"$(command -v timeout)" -k 10 180 "$cluster" -H 3 -d 1 -r 200mbit -- bash -c '
    ns="xmh${PPID}-h$VHOST"
    ip netns list | grep -q "^$ns" || { echo "linkcut: namespace $ns not found"; exit 3; }
    $XMH_MPIRUN -np 3 -x XMESH_TIMEOUT_S=$TMO $BIN --mode linkcut $ARGS --per-host 0 \
        --elems 4194304 --margin $MARGIN --mark $OUT/mark --out $OUT >$OUT/stdout 2>$OUT/stderr &
    mpipid=$!
    for i in $(seq 1 3000); do
        [ -e $OUT/mark ] && break
        kill -0 $mpipid 2>/dev/null || break
        sleep 0.01
    done
    if [ ! -e $OUT/mark ]; then
        echo "linkcut: the victim never reached the marked call"
        wait $mpipid
        exit 4
    fi
    ip -n "$ns" link set eth0 down
    echo "cut $(date +%s.%N)" >$OUT/cut
    echo "linkcut: eth0 of $ns down at $(cat $OUT/cut | cut -d" " -f2) (mark: $(cat $OUT/mark))"
    # Wait until every rank reported PASS/FAIL (or a generous bound), then
    # repair the link so that mpirun reaches the victim host again.
    for i in $(seq 1 $(( (TMO + 20) * 10 ))); do
        n=$(cat $OUT/rank.* 2>/dev/null | grep -c ": PASS\|: FAIL")
        [ "$n" -ge 3 ] && break
        sleep 0.1
    done
    ip -n "$ns" link set eth0 up
    echo "linkcut: eth0 of $ns up again at $(date +%s.%N)"
    wait $mpipid
    echo "mpirun exit $?" >$OUT/rc
'
crc=$?
cat "$out"/stdout 2>/dev/null
sed -n '1,30p' "$out"/stderr 2>/dev/null
echo "--- per-rank result files"
cat "$out"/rank.* 2>/dev/null
cat "$out"/rc 2>/dev/null
fail() { echo "FAIL (linkcut $role): $*"; exit 1; }
[ $crc -eq 124 ] || [ $crc -eq 137 ] && fail "the job hung (killed after 180 s)"
[ -e "$out"/cut ] || fail "the link was never cut (cluster.sh exit $crc)"
npass=$(cat "$out"/rank.* | grep -c '^fault: rank [0-9]*: PASS')
nfail=$(cat "$out"/rank.* | grep -c 'FAIL')
[ "$nfail" -eq 0 ] || fail "$nfail rank(s) reported FAIL"
[ "$npass" -eq 3 ] || fail "$npass of 3 ranks passed"
grep -q "mpirun exit 42" "$out"/rc || fail "$(cat "$out"/rc 2>/dev/null), want 42 (MPI_Abort)"
echo "PASS (linkcut $role): every rank returned within the timeout + $margin s naming its peer and cleaned up"
exit 0
