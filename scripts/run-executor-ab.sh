#!/usr/bin/env bash
# The MPI executor before and after a change, in one run (docs/EXECUTOR.md, issue 25):
#   part 1: the main job's n-to-m and 1-to-m suites (5 hosts x 4 ranks, 300 Mbit/s), xmesh only
#   part 2: the 2d suite on 4 hosts x 2 ranks at 400 Mbit/s with an application-style closing
#           MPI_Barrier (-B) and with a spinning one (--spin-barrier)
# each under "before" (XMESH_AB_BEFORE, default XMESH_SYNC_SEND=0 XMESH_WAIT_NICE=19: the executor of 2026-11-25
# morning, rendezvous 256 KiB chunks, 2 sends in flight at a chain's head, 1 on forwarders) and "after" (XMESH_AB_AFTER, default: the library's defaults),
# alternating before/after per suite so that both see the same machine. Writes
# build/executor-ab/<time>/{ab.md,ab.json} and the raw bench output; 0 wrong elements checked.
#
#   scripts/run-executor-ab.sh [1] [2]     (parts; default both)
# Environment: XMESH_AB_ITERS [5], XMESH_AB_BEFORE, XMESH_AB_AFTER (space-separated VAR=value),
#   XMESH_AB_2D_BYTES [128M], XMESH_AB_OUT
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
iters=${XMESH_AB_ITERS:-5}
before=${XMESH_AB_BEFORE:-XMESH_SYNC_SEND=0 XMESH_WAIT_NICE=19}
after=${XMESH_AB_AFTER:-XMESH_AB=after}
b2d=${XMESH_AB_2D_BYTES:-128M}
parts=${*:-1 2}
out=${XMESH_AB_OUT:-$root/build/executor-ab/$(date -u +%Y%m%d-%H%M%S)}
scripts/install-deps.sh >/dev/null || exit 1
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build -j "${XMESH_JOBS:-2}" --target xmesh-bench >/dev/null || {
    echo "run-executor-ab: build failed" >&2
    exit 1
}
why=$(microbench/cluster/cluster.sh check 2>&1) || {
    echo "run-executor-ab: no emulated cluster (${why#cluster.sh: SKIP: }): nothing to measure" >&2
    exit 77
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
bench=$root/build/microbench/bench/xmesh-bench
declare -A files
run() { # tag hosts pph rate env benchargs
    local tag=$1 h=$2 d=$3 r=$4 envs=$5 args=$6
    echo "run-executor-ab: $tag ($h hosts x $d ranks, $r; $envs)" >&2
    microbench/cluster/cluster.sh -q -H "$h" -d "$d" -r "$r" -- env $envs bash -c \
        '$XMH_MPIRUN -np $XMH_NP '"$bench $args -m xmesh -n $iters -w 1 -J $out/$tag.json" \
        >"$out/$tag.txt" 2>&1 || { echo "run-executor-ab: $tag failed, see $out/$tag.txt" >&2; return 1; }
}
rc=0
for p in $parts; do
    case $p in
    1) for s in n-to-m 1-to-m; do
           for v in before after; do
               envs=$before; [ $v = after ] && envs=$after
               b=32M; [ $s = 1-to-m ] && b=16M
               run "$v-$s" 5 4 300mbit "$envs" "-s $s -b $b" || rc=1
               files[$v]+="${files[$v]:+,}$out/$v-$s.json"
           done
       done ;;
    2) for bar in B spin; do
           flag=-B; [ $bar = spin ] && flag=--spin-barrier
           for v in before after; do
               envs=$before; [ $v = after ] && envs=$after
               run "$v-2d-$bar" 4 2 400mbit "$envs" "-s 2d -b $b2d $flag" || rc=1
               files[$v]+="${files[$v]:+,}$out/$v-2d-$bar.json"
           done
       done ;;
    *) echo "run-executor-ab: unknown part '$p' (1, 2)" >&2; exit 2 ;;
    esac
done
python3 microbench/charts/ab.py "$out/ab" "before=${files[before]}" "after=${files[after]}" || rc=1
echo "run-executor-ab: results in $out" >&2
exit $rc
