#!/bin/sh
# Plan-creation scaling (issue item 4): xmesh-plan on RS01R -> S01RR, an
# 8192x8192x64 f16 tensor between two meshes of H x 8 devices, H = 2..64
# (32 .. 1024 devices in all). Per H: REPS runs; reports the median of the
# scheduler's plan_ms (decomposition excluded), the median wall time of the
# whole process (decompose + schedule + simulate + JSON), unit tasks, the
# makespan / lower bound ratio, the median decompose_ms, the median of
# decompose + schedule (plan creation) per run, and the median of its thread
# CPU time (decompose_cpu_ms + plan_cpu_ms: less sensitive to a loaded
# machine than wall time). Writes OUT/plan_scaling.txt and, when gnuplot
# exists, OUT/plan_scaling.png.
#
# usage: microbench/scale/plan_scaling.sh [build dir] [out dir]   (REPS=5 default)
set -eu
BUILD=${1:-build}
OUT=${2:-$BUILD/scale}
REPS=${REPS:-5}
PLAN=$BUILD/tools/xmesh-plan
[ -x "$PLAN" ] || { echo "plan_scaling: $PLAN not built" >&2; exit 2; }
mkdir -p "$OUT"
TXT=$OUT/plan_scaling.txt
echo "# H devices unit_tasks plan_ms_median wall_ms_median ratio decompose_ms_median create_ms_median create_cpu_ms_median  (REPS=$REPS, $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))" > "$TXT"
for H in 2 4 8 16 32 64; do
    plans=""; walls=""; decs=""; creates=""; cpus=""; tasks=0; ratio=0
    r=0
    while [ $r -lt "$REPS" ]; do
        t0=$(date +%s%N)
        line=$("$PLAN" --shape 8192,8192,64 --dtype f16 --src-mesh "${H}x8" --src-spec RS01R \
               --dst-mesh "${H}x8" --dst-spec S01RR --json --max-tasks 0 | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["unit_tasks"], d["plan_ms"], d["makespan_s"] / d["lower_bound_s"], d["decompose_ms"],
      d["decompose_ms"] + d["plan_ms"], d["decompose_cpu_ms"] + d["plan_cpu_ms"])')
        t1=$(date +%s%N)
        set -- $line
        tasks=$1; plans="$plans $2"; ratio=$3; decs="$decs $4"; creates="$creates $5"; cpus="$cpus $6"
        walls="$walls $(( (t1 - t0) / 1000000 ))"
        r=$((r + 1))
    done
    med() { echo "$@" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
    printf "%d %d %d %s %s %.4f %s %s %s\n" "$H" $((H * 16)) "$tasks" "$(med $plans)" "$(med $walls)" \
        "$ratio" "$(med $decs)" "$(med $creates)" "$(med $cpus)" >> "$TXT"
done
cat "$TXT"
if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<GP
set terminal pngcairo size 800,500 noenhanced
set output "$OUT/plan_scaling.png"
set logscale xy
set xlabel "devices (two meshes of H x 8)"
set ylabel "ms (median of $REPS)"
set key left top font ",9"
set grid
plot "$TXT" using 2:4 with linespoints title "scheduler plan_ms", \
     "$TXT" using 2:8 with linespoints title "plan creation (decompose + schedule), wall", \
     "$TXT" using 2:9 with linespoints title "plan creation, thread CPU time", \
     "$TXT" using 2:5 with linespoints title "xmesh-plan wall (decompose+schedule+simulate)", \
     100 with lines dashtype 2 title "100 ms target"
GP
    echo "chart: $OUT/plan_scaling.png"
fi
