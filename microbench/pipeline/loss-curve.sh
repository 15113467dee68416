#!/usr/bin/env bash
# Loss curve of the serial GPT-2 reference on the shipped text (KJV Genesis,
# byte-level tokens), for the README: writes loss-curve.json and
# loss-curve.png into the directory given (default build/loss-curve).
#   microbench/pipeline/loss-curve.sh [OUTDIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/loss-curve}
steps=${2:-400}
mkdir -p "$out"
build/pipeline/xmesh-train gpt --serial --layers 4 --heads 4 --channels 128 --seq 64 --batch 8 \
    --lr 1e-3 --steps "$steps" --no-progress --json "$out/loss-curve.json"
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/loss-curve.json"))
with open(sys.argv[1] + "/loss-curve.tsv", "w") as f:
    for s in d["steps"]:
        f.write(f"{s['step']}\t{s['loss']}\n")
PY
gnuplot -e "set terminal pngcairo size 800,400 font ',11'; set output '$out/loss-curve.png';
 set title 'xmesh-train gpt --serial: L=4 H=4 C=128 T=64 B=8, AdamW lr 1e-3, KJV Genesis bytes';
 set xlabel 'step'; set ylabel 'train loss (nats/token)'; set grid;
 plot '$out/loss-curve.tsv' using 1:2 with lines lw 1 title 'per-step loss'"
echo "loss-curve: $out/loss-curve.png"
