#!/usr/bin/env bash
# Boxing bytes per rank per training step, per built-in strategy, for GPT-2 124M shapes on 8 and
# 16 ranks (issue 20 item 8; docs/BOXING_BYTES.md). Builds xmesh-boxing-bytes and xmesh-train in
# BUILD (default build/), runs scripts/boxing_bytes.py (mpirun, oversubscribed: bytes do not
# depend on load or timing), prints the table and writes JSON, Markdown, .dat and a gnuplot
# chart under microbench/charts/results/boxing-bytes/. Extra arguments go to boxing_bytes.py
# (e.g. --only 8:3d:2x2x2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=microbench/charts/results/boxing-bytes
cmake --build "$BUILD" -j2 --target xmesh-boxing-bytes xmesh-train >/dev/null
python3 scripts/boxing_bytes.py --build "$BUILD" --out "$OUT" "$@"
if command -v gnuplot >/dev/null; then
  gnuplot <<GP
set terminal pngcairo size 1000,520 font ",10"
set output "$OUT/boxing-bytes.png"
set title "GPT-2 124M (12 layers, C=768, Vp=50304), B=16, T=64: boxing bytes per rank per step (max over ranks)"
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set ylabel "MiB sent per rank (ring-equivalent)"
set xtics rotate by -30
set key at graph 0.62, graph 0.97
set grid ytics
plot "$OUT/boxing-bytes.dat" using 2:xtic(1) title "forward activations", \
     '' using 3 title "backward activations", '' using 4 title "gradient reductions", \
     '' using 5 title "storage gathers"
GP
  echo "chart: $OUT/boxing-bytes.png"
else
  echo "gnuplot not found: no chart" >&2
fi
