#!/usr/bin/env bash
# Turns xmesh-bench's gnuplot data (-D PREFIX) into PNG charts next to it:
#   PREFIX-1-to-m.dat          -> fig5-1-to-m.png       (time vs receiver mesh)
#   PREFIX-n-to-m.dat / -lb    -> fig6-n-to-m.png, fig6-n-to-m-lb.png
#   PREFIX-loadbalance-lb.dat  -> fig8-loadbalance-lb.png (and -time)
# Usage: make-charts.sh PREFIX      (needs gnuplot; Debian: gnuplot-nox)
set -u
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:?usage: make-charts.sh PREFIX}
outdir=$(dirname "$prefix")
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "make-charts: gnuplot not found (apt-get install gnuplot-nox); no charts" >&2
    exit 0
fi
chart() { # script datafile outfile ylabel title [refline]
    [ -s "$2" ] || return 0
    # Nothing to draw when every value is missing (e.g. no lower bound).
    awk -F'\t' 'NR > 1 { for (i = 2; i <= NF; i++) if ($i != "NaN") f = 1 } END { exit !f }' \
        "$2" || { echo "make-charts: $2 has no values; no $(basename "$3")"; return 0; }
    local ncol
    ncol=$(head -1 "$2" | awk -F'\t' '{ print NF }')
    local extra=""
    [ -n "${6:-}" ] && extra="refline=$6;"
    if gnuplot -e "datafile='$2'; outfile='$3'; ncol=$ncol; ylab='$4'; ttl='$5'; $extra" \
        "$here/$1" 2>"$3.log"; then
        rm -f "$3.log"
        echo "chart: $3"
    else
        echo "make-charts: gnuplot failed for $3 (see $3.log)" >&2
    fi
}
chart lines.gp "$prefix-1-to-m.dat" "$outdir/fig5-1-to-m.png" "time (s), median" \
    "1-to-m: one sender device, replicated tensor (Fig. 5)"
chart lines.gp "$prefix-1-to-m-lb.dat" "$outdir/fig5-1-to-m-lb.png" "time / lower bound" \
    "1-to-m: time over the model lower bound"
chart bars.gp "$prefix-n-to-m.dat" "$outdir/fig6-n-to-m.png" "time (s), median" \
    "n-to-m: Table 2 cases (Fig. 6)"
chart bars.gp "$prefix-n-to-m-lb.dat" "$outdir/fig6-n-to-m-lb.png" "time / lower bound" \
    "n-to-m: time over the model lower bound (dashed: 1.10 target)" 1.1
chart bars.gp "$prefix-loadbalance.dat" "$outdir/fig8-loadbalance.png" "time (s), median" \
    "load balance ablation: naive / lb / ensemble (Fig. 8)"
chart bars.gp "$prefix-loadbalance-lb.dat" "$outdir/fig8-loadbalance-lb.png" \
    "time / lower bound" "load balance ablation over the lower bound" 1.0
exit 0
