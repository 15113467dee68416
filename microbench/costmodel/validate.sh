#!/usr/bin/env bash
# Validation of the cost model (issue 13 item 2, docs/COSTMODEL.md): on the
# emulated cluster (microbench/cluster/cluster.sh, root + network namespaces)
# it calibrates the network with xmesh-calibrate, then runs the n-to-m and
# 1-to-m suites of xmesh-bench with the calibrated cluster file, and compares
# every (case, method) prediction with its measured time (compare.py).
#
#   microbench/costmodel/validate.sh [build-dir] [out-dir]
# Environment (defaults in brackets): VAL_HOSTS [4] VAL_PPH [4] VAL_RATE
#   [300mbit] VAL_NTOM [16M] VAL_1TOM [16M] VAL_ITERS [1] VAL_WARMUP [1]
#   VAL_CAL_MAX [4M] (largest calibration message)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
build=$(cd "${1:-build}" && pwd) || exit 1
out=${2:-$root/build/costmodel/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
hosts=${VAL_HOSTS:-4}
pph=${VAL_PPH:-4}
rate=${VAL_RATE:-300mbit}
ntom=${VAL_NTOM:-16M}
onetom=${VAL_1TOM:-16M}
iters=${VAL_ITERS:-1}
calmax=${VAL_CAL_MAX:-4M}
warmup=${VAL_WARMUP:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cal=$build/tools/xmesh-calibrate
bench=$build/microbench/bench/xmesh-bench
[ -x "$cal" ] && [ -x "$bench" ] || {
    echo "validate: build xmesh-calibrate and xmesh-bench in $build first" >&2
    exit 1
}
cat >"$out/inside.sh" <<INSIDE
#!/usr/bin/env bash
set -x
\$XMH_MPIRUN -np \$XMH_NP $cal --min 64K --max $calmax --steps 5 --reps 3 -o $out/cluster.txt \
    >$out/calibrate.txt 2>&1 || exit 1
\$XMH_MPIRUN -np \$XMH_NP $cal --min 64K --max $calmax --steps 5 --reps 1 --json \
    >$out/calibrate-check.json 2>/dev/null
for s in n-to-m 1-to-m; do
    b=$ntom
    [ "\$s" = 1-to-m ] && b=$onetom
    \$XMH_MPIRUN -np \$XMH_NP $bench -s \$s -b \$b -n $iters -w $warmup -p 1 -k 0 \
        --cluster $out/cluster.txt -J $out/\$s.json >$out/\$s.txt 2>&1
done
INSIDE
chmod +x "$out/inside.sh"
start=$(date +%s)
microbench/cluster/cluster.sh -H "$hosts" -d "$pph" -r "$rate" -- "$out/inside.sh"
rc=$?
echo "validate: cluster run took $(($(date +%s) - start)) s (exit $rc); results in $out"
python3 microbench/costmodel/compare.py "$out"/n-to-m.json "$out"/1-to-m.json --out "$out"
