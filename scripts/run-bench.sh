#!/usr/bin/env bash
# Builds xmesh-bench and runs the n-to-m and 1-to-m suites (paper 002
# Fig. 6 and Fig. 5) on an emulated cluster of network namespaces with
# rate-limited NICs (microbench/cluster/cluster.sh), then prints the tables,
# the issue-5 targets and where the JSON and PNG charts are.
# Without root or namespace support it says so and runs on one host with
# virtual hosts (correct data, no NIC bottleneck: times mean nothing).
#
#   scripts/run-bench.sh [--loadbalance]   also run the Fig. 8 ablation
# Environment (defaults in brackets):
#   XMESH_BENCH_HOSTS [5]  XMESH_BENCH_PPH [4]  XMESH_BENCH_RATE [300mbit]
#   XMESH_BENCH_NTOM_BYTES [32M]  XMESH_BENCH_1TOM_BYTES [16M]
#   XMESH_BENCH_ITERS [3]  XMESH_BENCH_WARMUP [1]  XMESH_BENCH_OUT [build/bench/<time>]
#   XMESH_BENCH_NO_CLUSTER=1: skip the emulated cluster even where it could run
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
hosts=${XMESH_BENCH_HOSTS:-5}
pph=${XMESH_BENCH_PPH:-4}
rate=${XMESH_BENCH_RATE:-300mbit}
ntom=${XMESH_BENCH_NTOM_BYTES:-32M}
onetom=${XMESH_BENCH_1TOM_BYTES:-16M}
iters=${XMESH_BENCH_ITERS:-3}
warmup=${XMESH_BENCH_WARMUP:-1}
out=${XMESH_BENCH_OUT:-$root/build/bench/$(date -u +%Y%m%d-%H%M%S)}
suites="n-to-m 1-to-m"
[ "${1:-}" = --loadbalance ] && suites="$suites loadbalance"

echo "run-bench: building xmesh-bench"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-bench >/dev/null || {
    echo "run-bench: build failed" >&2
    exit 1
}
mkdir -p "$out"
bench=$root/build/microbench/bench/xmesh-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The per-suite command; runs inside the cluster (XMH_MPIRUN set) or on
# this host (plain mpirun, virtual hosts).
cat >"$out/suites.sh" <<SUITES
#!/usr/bin/env bash
rc=0
for s in $suites; do
    bytes=$ntom
    [ "\$s" = 1-to-m ] && bytes=$onetom
    cmd="\$LAUNCH $bench -s \$s -b \$bytes -n $iters -w $warmup -J $out/\$s.json -D $out/bench \$EXTRA"
    echo "\$ \$cmd" | tee "$out/\$s.txt"
    \$cmd 2>&1 | tee -a "$out/\$s.txt"
    [ \${PIPESTATUS[0]} -eq 0 ] || rc=1
done
exit \$rc
SUITES
chmod +x "$out/suites.sh"

mode=cluster
why=$(microbench/cluster/cluster.sh check 2>&1) || mode=single
if [ -n "${XMESH_BENCH_NO_CLUSTER:-}" ]; then
    mode=single
    why="XMESH_BENCH_NO_CLUSTER is set"
fi
start=$(date +%s)
if [ "$mode" = cluster ]; then
    echo "run-bench: emulated cluster: $hosts hosts x $pph ranks, NIC $rate each way"
    microbench/cluster/cluster.sh -H "$hosts" -d "$pph" -r "$rate" -- \
        env EXTRA="" bash -c 'LAUNCH="$XMH_MPIRUN -np $XMH_NP" '"$out/suites.sh"
    rc=$?
else
    echo "run-bench: NO emulated cluster: ${why#cluster.sh: SKIP: }"
    echo "run-bench: running on this host only with virtual hosts of $pph ranks: data is"
    echo "run-bench: checked, but nothing limits the 'NICs', so the times say nothing of the"
    echo "run-bench: paper's claims."
    LAUNCH="mpirun --oversubscribe -np $((hosts * pph))" EXTRA="-V $pph" "$out/suites.sh"
    rc=$?
fi
echo "run-bench: suites took $(($(date +%s) - start)) s (exit $rc)"
microbench/charts/make-charts.sh "$out/bench"
if command -v python3 >/dev/null 2>&1; then
    python3 microbench/charts/json2md.py "$out"/*.json >"$out/results.md"
    echo "run-bench: targets of issue 5 (docs/BENCHMARKS.md):"
    python3 microbench/charts/targets.py "$out"/*.json | tee "$out/targets.txt"
fi
echo "run-bench: results in $out (tables *.txt, markdown results.md, JSON *.json, charts *.png)"
exit $rc
