#!/usr/bin/env bash
# Bootstrap without MPI: one good start-up per launch style, then every
# refusal. Each rank judges its own result (ucx_boot: the code, the message
# naming what is wrong or missing, the time it took); the launcher requires
# every started rank to PASS and the whole run to end within its bound.
#
# usage: boot_refusals.sh PYTHON xmesh-launch.py ucx_boot
set -u
py=${1:?python}
launch=${2:?xmesh-launch.py}
prog=${3:?ucx_boot}
scale=${XMESH_TEST_TIME_SCALE:-1}
T=3 # XMESH_TIMEOUT_S of the refusal runs
export XMESH_TIMEOUT_S=$T
bound=$(awk -v t=$T -v s="$scale" 'BEGIN { print (t + 1) * s }')
wall=$(awk -v t=$T -v s="$scale" 'BEGIN { print (t + 4) * s }')
fails=0
run() {
    local name=$1
    shift
    echo "---- $name"
    if "$py" "$launch" --timeout 60 "$@"; then
        echo "ok: $name"
    else
        echo "FAIL: $name"
        fails=$((fails + 1))
    fi
}

# Good start-ups: every style, data checked.
run "torchrun variables, 4 ranks" -n 4 --style torchrun -- "$prog" --expect ok --data
run "Slurm variables, 3 ranks" -n 3 --style slurm -- "$prog" --expect ok --data
run "XMESH_RANK/XMESH_SIZE, 5 ranks on 2 hosts" -n 5 --hosts 2 --style xmesh -- \
    "$prog" --expect ok --data
run "one rank, no rendezvous" -n 1 --style xmesh -- "$prog" --expect ok --data

# Refusals: the message names what is wrong or missing, on every rank.
run "wrong world size" -n 3 --max-wall "$wall" --env 2:WORLD_SIZE=4 -- \
    "$prog" --expect MISMATCH --msg "says the world has 4 ranks, rank 0 says 3" --max-s "$bound" \
    --no-listener
run "two processes claim one rank" -n 3 --max-wall "$wall" --env 2:RANK=1 -- \
    "$prog" --expect MISMATCH --msg "two processes claim rank 1" --max-s "$bound" --no-listener
run "unreachable root" -n 3 --max-wall "$wall" --skip 0 -- \
    "$prog" --expect TIMEOUT --msg "cannot reach rank 0" --max-s "$bound"
run "a peer never shows up" -n 4 --max-wall "$wall" --skip 2 -- \
    "$prog" --expect TIMEOUT --msg "never connected" --msg "rank 2 missing" --max-s "$bound" \
    --no-listener
run "two peers never show up" -n 5 --max-wall "$wall" --skip 1 --skip 3 -- \
    "$prog" --expect TIMEOUT --msg "ranks 1, 3 missing" --max-s "$bound" --no-listener
run "no rank in the environment" -n 2 --max-wall "$wall" --unset '*:RANK' --unset '*:WORLD_SIZE' -- \
    "$prog" --expect INVALID_ARGUMENT --msg "no rank and world size" --max-s 1
run "bad XMESH_BOOTSTRAP" -n 2 --max-wall "$wall" --env '*:XMESH_BOOTSTRAP=nohostport' -- \
    "$prog" --expect INVALID_ARGUMENT --msg "XMESH_BOOTSTRAP 'nohostport'" --max-s 1
run "rank outside the world" -n 2 --max-wall "$wall" --skip 0 --env 1:RANK=7 -- \
    "$prog" --expect INVALID_ARGUMENT --msg "RANK/WORLD_SIZE" --max-s 1
run "XMESH_UCX_NICS names more devices on one rank" -n 3 --max-wall "$wall" \
    --env '*:XMESH_UCX_NICS=lo' --env 1:XMESH_UCX_NICS=lo,lo -- \
    "$prog" --expect INVALID_ARGUMENT --msg "UCX worker(s) (one per device)" \
    --msg "every rank must name as many devices" --max-s "$bound"
run "XMESH_UCX_NICS with an empty device" -n 2 --max-wall "$wall" \
    --env '*:XMESH_UCX_NICS=lo,,lo' -- \
    "$prog" --expect INVALID_ARGUMENT --msg "XMESH_UCX_NICS 'lo,,lo': device 1 is empty" --max-s 1
echo "boot_refusals: $fails failed"
[ $fails -eq 0 ]
