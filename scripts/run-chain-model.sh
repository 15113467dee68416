#!/usr/bin/env bash
# The chain model against the executor (docs/EXECUTOR.md, issue 25 item 4): one sender and
# a replicated vector on H = 1..8 hosts of one rank each (H NIC hops), chunk counts K = 1..64,
# on the emulated cluster (9 hosts x 1 rank, NICs shaped to XMESH_CHAIN_RATE, token bucket
# 64 KiB so that a small transfer does not pass at line rate); for the executor's default
# (`sync`: synchronous 65408-byte chunks, 4 in flight per link; tensors 64 KiB .. 4 MiB) and
# for XMESH_SYNC_SEND=0 (`rndv`: rendezvous 256 KiB chunks, 2 in flight at the head and 1 on
# forwarders, the executor before; tensors 256 KiB .. 16 MiB).
# Prints and writes build/chain-model/<time>/chain.{md,json}: the model's prediction over the
# measured median per (H, K), with the measured median [min, max]. A benchmark, not a test.
#
#   scripts/run-chain-model.sh            Environment: XMESH_CHAIN_RATE [300mbit],
#   XMESH_CHAIN_ITERS [3], XMESH_CHAIN_K [64] (largest chunk count), XMESH_CHAIN_BURST [64kb],
#   XMESH_CHAIN_OUT [build/chain-model/<time>]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
rate=${XMESH_CHAIN_RATE:-300mbit}
iters=${XMESH_CHAIN_ITERS:-3}
burst=${XMESH_CHAIN_BURST:-64kb}
out=${XMESH_CHAIN_OUT:-$root/build/chain-model/$(date -u +%Y%m%d-%H%M%S)}
scripts/install-deps.sh >/dev/null || exit 1
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-bench >/dev/null || {
    echo "run-chain-model: build failed" >&2
    exit 1
}
why=$(microbench/cluster/cluster.sh check 2>&1) || {
    echo "run-chain-model: no emulated cluster (${why#cluster.sh: SKIP: }): nothing to measure" >&2
    exit 77
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
bench=$root/build/microbench/bench/xmesh-bench
args=()
kmax=${XMESH_CHAIN_K:-64}
for v in sync:1:65408 rndv:0:262144; do
    IFS=: read -r tag sync chunk <<<"$v"
    echo "run-chain-model: $tag (XMESH_SYNC_SEND=$sync, chunk $chunk), 9 hosts x 1 rank, NIC $rate" >&2
    microbench/cluster/cluster.sh -q -H 9 -d 1 -r "$rate" -b "$burst" -- \
        env XMESH_SYNC_SEND=$sync bash -c \
        '$XMH_MPIRUN -np $XMH_NP '"$bench -s chain -b $chunk -e $((chunk * kmax)) -f 2 -n $iters -w 1 -k 0 -J $out/$tag.json" \
        >"$out/$tag.txt" 2>&1 || { echo "run-chain-model: run failed, see $out/$tag.txt" >&2; exit 1; }
    args+=("$tag=$out/$tag.json")
done
python3 microbench/chain/summarize.py "$out/chain" "${args[@]}" || exit 1
echo "run-chain-model: results in $out" >&2
