#!/usr/bin/env python3
"""The search validation's generated space (issue 40 item 1): a dry run of
microbench/search/validate.py --list for GPT-2 with 6 and 4 layers, checked."""
import re
import subprocess
import sys

ROOT = sys.argv[1]
VALIDATE = ROOT + "/microbench/search/validate.py"
fails = []


def check(ok, msg):
    if not ok:
        fails.append(msg)


def listing(model, *extra):
    p = subprocess.run([sys.executable, VALIDATE, "--list", "--model-args", model, *extra],
                       capture_output=True, text=True)
    check(p.returncode == 0, "validate.py --list %s: rc %d %s" % (model, p.returncode, p.stderr))
    lines = p.stdout.strip().splitlines()
    cfgs = []
    for ln in lines[:-1]:
        m = re.match(r"\s*(\d+)  (.*)$", ln)
        check(m is not None, "bad line: %r" % ln)
        if m:
            cfgs.append([x.strip() for x in m.group(2).split(" / ")])
    return cfgs, lines[-1] if lines else ""


def blocks(layout):
    """Block counts per stage of 'E,t*3|t*3,L'."""
    out = []
    for st in layout.split("|"):
        n = 0
        for it in st.split(","):
            if it == "t":
                n += 1
            elif it.startswith("t*"):
                n += int(it[2:])
            else:
                check(it in ("E", "L"), "layout %s: item %s" % (layout, it))
        out.append(n)
    return out


def check_space(L, heads, cfgs, ranks=8):
    stages, scheds, axes, ms = set(), set(), set(), set()
    for c in cfgs:
        lay, mesh, strat, sm = c[0], c[1], c[2], c[3]
        sched, M = sm.rsplit(" M", 1)
        M = int(M)
        b = blocks(lay)
        S = len(b)
        stages.add(S)
        check(sum(b) == L and min(b) >= 1, "%s: blocks %s, want %d layers" % (c, b, L))
        check(lay.startswith("E,") and lay.endswith(",L"), "%s: E first, L last" % c)
        ml, sl = mesh.split(","), strat.split(",")
        check(len(ml) == S and len(sl) == S, "%s: %d stages, %d meshes" % (c, S, len(ml)))
        for m, st in zip(ml, sl):
            f = [int(x) for x in m.split("x")]
            axes.add(len(f))
            p = 1
            for x in f:
                p *= x
            check(p == ranks // S, "%s: mesh %s for %d ranks" % (c, m, ranks // S))
            if st == "megatron":
                check(heads % f[-1] == 0, "%s: megatron tensor axis %d, heads %d" %
                      (c, f[-1], heads))
            if st == "dp":
                check((16 // M) % p == 0, "%s: dp over %d, %d rows" % (c, p, 16 // M))
        if S > 1:
            scheds.add(sched)
            check(M >= S, "%s: M %d < S %d" % (c, M, S))
        ms.add((S, M))
    return stages, scheds, axes, ms


# 6 layers: the model; every configuration is written for 6 layers
m6 = "--layers 6 --heads 6 --channels 192 --seq 64 --batch 16"
full6, sum6 = listing(m6)
stages, scheds, axes, ms = check_space(6, 6, full6)
check(len(full6) > 40, "6 layers: %d configurations" % len(full6))
check(stages == {1, 2, 4}, "6 layers: stage counts %s" % sorted(stages))
check(scheds == {"gpipe", "1f1b", "eager-1f1b"}, "6 layers: schedules %s" % sorted(scheds))
check(axes == {1, 2, 3}, "6 layers: mesh axes %s" % sorted(axes))
check({(2, 2), (2, 4), (4, 4), (4, 8), (1, 1), (1, 2)} <= ms, "6 layers: (S, M) %s" % sorted(ms))
lays = sorted(set(c[0] for c in full6))
check(lays == sorted(["E,t*6,L", "E,t*3|t*3,L", "E,t*2|t*4,L", "E,t|t*2|t*2|t,L"]),
      "6 layers: layouts %s" % lays)
check(not any(c[2].startswith("megatron") and c[1].split(",")[0] in ("8", "4", "2x4")
              for c in full6), "6 heads: a megatron tensor axis of 4 or 8")
check(sum6.startswith("%d configurations" % len(full6)), "summary: %s" % sum6)
# the default size of the script (40 + the five defer-grad ones), spread over S and schedules
sel6, _ = listing(m6, "--space-size", "40")
check(len(sel6) == 45, "6 layers, size 40: %d configurations" % len(sel6))
s2, k2, a2, _ = check_space(6, 6, sel6)
check(s2 == {1, 2, 4} and k2 == {"gpipe", "1f1b", "eager-1f1b"} and a2 == {1, 2, 3},
      "6 layers, size 40: stages %s schedules %s axes %s" % (s2, k2, a2))
check(all(c in full6 for c in sel6 if len(c) == 4), "size 40: not a subset of the space")
# 4 layers: the four-stage split exists; 8 layers: eight one-rank stages
full4, _ = listing("--layers 4 --heads 4 --channels 128 --seq 64 --batch 16")
st4, _, _, _ = check_space(4, 4, full4)
check(st4 == {1, 2, 4} and any(c[0] == "E,t|t|t|t,L" for c in full4), "4 layers: %s" % st4)
full8, _ = listing("--layers 8 --heads 4 --batch 16")
st8, _, _, _ = check_space(8, 4, full8)
check(8 in st8, "8 layers: stage counts %s" % sorted(st8))
# the legacy space is kept for re-scoring the 2026-11 runs
leg, _ = listing("--layers 4", "--space", "legacy")
check(len(leg) == 43, "legacy space: %d configurations" % len(leg))

for f in fails:
    print("FAIL " + f)
print("generated space: 6 layers %d (size 40: %d), 4 layers %d, 8 layers %d; %s" %
      (len(full6), len(sel6), len(full4), len(full8), "FAILED" if fails else "ok"))
sys.exit(1 if fails else 0)
