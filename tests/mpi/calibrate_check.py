#!/usr/bin/env python3
"""CTest mpi.calibrate: runs xmesh-calibrate quickly on one machine (4 ranks,
2 virtual hosts of 2), then checks that its JSON has a fit with R^2 and a
positive beta for every measured class, that both point-to-point classes
were measured, that the cluster file it wrote parses (xmesh-plan --cluster)
and that xmesh-plan reports the fitted values from it.

usage: calibrate_check.py MPIEXEC NPFLAG CALIBRATE PLAN WORKDIR
"""
import json
import math
import os
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    mpiexec, npflag, cal, plan, work = sys.argv[1:6]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "calibrated.cluster")
    if os.path.exists(path):
        os.remove(path)
    cmd = [mpiexec, npflag, "4", "--oversubscribe", cal, "--virtual-hosts", "2",
           "--min", "4K", "--max", "512K", "--steps", "5", "--reps", "3", "-o", path, "--json"]
    print("$ " + " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    print(r.stdout)
    print(r.stderr, file=sys.stderr)
    if r.returncode != 0:
        fail("xmesh-calibrate exited with %d" % r.returncode)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if len(lines) != 1:
        fail("expected one JSON line on stdout, got %d" % len(lines))
    doc = json.loads(lines[0])
    if doc["ranks"] != 4 or doc["hosts"] != 2:
        fail("ranks/hosts %s/%s, expected 4/2" % (doc["ranks"], doc["hosts"]))
    classes = doc["classes"]
    for name in ("p2p-intra", "p2p-inter", "chain", "allgather", "allgather-intra"):
        if name not in classes:
            fail("class %s missing" % name)
    for name in ("p2p-intra", "p2p-inter"):
        if not classes[name]["measured"]:
            fail("class %s not measured" % name)
    for name, c in classes.items():
        if not c["measured"]:
            continue
        for key in ("alpha_s", "beta_s_per_byte", "r2", "worst_rel_residual", "points"):
            if key not in c:
                fail("class %s has no %s" % (name, key))
        if not (c["beta_s_per_byte"] is not None and c["beta_s_per_byte"] > 0):
            fail("class %s: beta %s is not positive" % (name, c["beta_s_per_byte"]))
        if not (c["r2"] is not None and c["r2"] <= 1.0 + 1e-9 and math.isfinite(c["r2"])):
            fail("class %s: R^2 %s is not a finite number <= 1" % (name, c["r2"]))
        if len(c["points"]) != 5:
            fail("class %s: %d points, expected 5" % (name, len(c["points"])))
        if any(p[1] <= 0 for p in c["points"]):
            fail("class %s: a non-positive time in %s" % (name, c["points"]))
    model = doc["model"]
    nic = 8 / classes["p2p-inter"]["beta_s_per_byte"] / 1e9
    if abs(model["nic_gbps"] - nic) > 1e-6 * nic:
        fail("model nic_gbps %s != 8 / beta(p2p-inter) = %s" % (model["nic_gbps"], nic))
    with open(path) as f:
        text = f.read()
    for key in ("nic_gbps =", "intra_gbps =", "latency_us =", "p2p-inter:"):
        if key not in text:
            fail("cluster file lacks '%s':\n%s" % (key, text))
    p = subprocess.run([plan, "--case", "1", "--cluster", path, "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 0:
        fail("xmesh-plan --cluster %s failed: %s" % (path, p.stderr))
    cl = json.loads(p.stdout)["cluster"]
    for key in ("nic_gbps", "intra_gbps", "latency_us"):
        if abs(cl[key] - model[key]) > 1e-4 * max(1.0, abs(model[key])):
            fail("xmesh-plan %s = %s, the calibration wrote %s" % (key, cl[key], model[key]))
    if cl["cluster_file"] != path:
        fail("xmesh-plan names cluster file %r" % cl["cluster_file"])
    # a bad option is refused with a message naming it
    b = subprocess.run([mpiexec, npflag, "2", "--oversubscribe", cal, "--steps", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if b.returncode == 0 or "--steps" not in b.stderr:
        fail("--steps 1 accepted or not named (rc %d): %s" % (b.returncode, b.stderr))
    print("OK: fits %s" % ", ".join("%s R^2 %.4f" % (n, c["r2"]) for n, c in classes.items()
                                    if c["measured"]))


if __name__ == "__main__":
    main()
