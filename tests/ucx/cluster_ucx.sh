#!/usr/bin/env bash
# The UCX tier on the emulated cluster (microbench/cluster/cluster.sh): 3
# network-namespace hosts x 2 ranks, each host with K shaped NICs (-n K).
# mpirun only starts the processes (OMPI_COMM_WORLD_RANK/SIZE; nothing calls
# MPI_Init); they meet at rank 0's eth0 address (XMESH_BOOTSTRAP) and run the
# MPI tier's correctness matrix over UCX (every element checked): shared memory
# inside a host, TCP through the shaped NICs between hosts, every rank with a
# UCX worker on each of the K NICs and every hop between hosts on the rail the
# plan gave it. Then every NIC index (rail) must have carried data. Skips (77) where the
# cluster cannot be built.
# usage: cluster_ucx.sh SOURCE_DIR TEST_UCX NICS
set -u
src=${1:?source dir}
prog=${2:?test_ucx}
nics=${3:-2}
cluster=$src/microbench/cluster/cluster.sh
msg=$("$cluster" check 2>&1)
if [ $? -ne 0 ]; then
    echo "${msg:-cluster.sh check failed}"
    echo "SKIP: cannot build the emulated cluster here (needs root and network namespaces)"
    exit 77
fi
seed=${XMESH_TEST_SEED:-$(date +%s)}
"$cluster" -H 3 -d 2 -n "$nics" -r 500mbit -q -- bash -c "
    boot=\${XMH_SUBNET%.0/24}.1:\$((20000 + RANDOM % 20000))
    \$XMH_MPIRUN -np \$XMH_NP -x XMESH_BOOTSTRAP=\$boot -x XMESH_UCX_NICS -x XMESH_NICS_PER_HOST \
        -x XMESH_NIC_GBPS -x XMESH_TEST_SEED=$seed $prog --cases 40 --per-host 2 || exit 1
    # every NIC index (rail) carried data, summed over the hosts
    bad=0
    for ((k = 0; k < $nics; k++)); do
        sum=0
        # this cluster's hosts only (cluster.sh names them xmh<its pid>-h<i>)
        for ns in \$(ip netns list | awk '{print \$1}' | grep -- \"^xmh\$PPID-h[0-9]*\$\"); do
            tx=\$(ip -n \$ns -s link show eth\$k | awk '/TX:/ { getline; print \$1 }')
            echo \"\$ns eth\$k: \$tx bytes sent\"
            sum=\$((sum + \${tx:-0}))
        done
        echo \"NIC \$k of every host: \$sum bytes sent in all\"
        [ \$sum -gt 500000 ] || bad=1
    done
    [ \$bad -eq 0 ] || { echo 'FAIL: a NIC index carried (almost) nothing'; exit 1; }
"
