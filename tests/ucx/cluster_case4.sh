#!/usr/bin/env bash
# n-to-m case 4 ((2,4) -> (2,4), RS01R -> S01RR: 64 tasks of one holder and
# one receiver, half of them between rails) over UCX on the emulated cluster
# with 2 NICs per host (4 hosts x 4 ranks, microbench/cluster/cluster.sh):
# every element checked (xmesh-bench -c 1, one iteration), then on every host
# that sends or receives the data, both NICs must have carried about the same
# bytes (within 25%), as the plan charges them: every hop between hosts goes
# out and in on the rail the plan gave it. (Before the rails per hop, every
# hop between rails went over eth1: 4.7 MB on eth0 against 13.6 MB on eth1.)
# A correctness check, not a measurement. Skips (77) where the cluster cannot
# be built.
# usage: cluster_case4.sh SOURCE_DIR XMESH_BENCH
set -u
src=${1:?source dir}
bench=${2:?xmesh-bench}
cluster=$src/microbench/cluster/cluster.sh
msg=$("$cluster" check 2>&1)
if [ $? -ne 0 ]; then
    echo "${msg:-cluster.sh check failed}"
    echo "SKIP: cannot build the emulated cluster here (needs root and network namespaces)"
    exit 77
fi
"$cluster" -H 4 -d 4 -n 2 -r 500mbit -q -- bash -c "
    nss=\$(ip netns list | awk '{print \$1}' | grep -- \"^xmh\$PPID-h[0-9]*\$\" | sort)
    bytes() { ip -n \$1 -s link show \$2 | awk -v d=\$3 '\$1 == d\":\" { getline; print \$1 }'; }
    declare -A b0
    for ns in \$nss; do for k in 0 1; do for d in TX RX; do
        b0[\$ns.\$k.\$d]=\$(bytes \$ns eth\$k \$d)
    done; done; done
    \$XMH_MPIRUN -np \$XMH_NP $bench -s n-to-m -C 4 -b 16M -n 1 -w 0 -p 1 -k 0 -c 1 \
        -m xmesh -T ucx || { echo 'FAIL: xmesh-bench'; exit 1; }
    bad=0
    for ns in \$nss; do for d in TX RX; do
        a=\$((\$(bytes \$ns eth0 \$d) - \${b0[\$ns.0.\$d]}))
        b=\$((\$(bytes \$ns eth1 \$d) - \${b0[\$ns.1.\$d]}))
        echo \"\$ns \$d: eth0 \$a bytes, eth1 \$b bytes\"
        [ \$((a + b)) -lt 4000000 ] && continue
        if [ \$((4 * a)) -lt \$((3 * b)) ] || [ \$((4 * b)) -lt \$((3 * a)) ]; then
            echo \"FAIL: \$ns \$d: the two NICs differ by more than 25%\"
            bad=1
        fi
    done; done
    exit \$bad
"
