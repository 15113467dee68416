#!/usr/bin/env python3
"""Checkpoint, resume and convert with xmesh-train and xmesh-ckpt (issue 22).

Sets (each one ctest test):
  gpt_same    same layout (1 stage 2x1, and 2 stages 1x1,1x2): the per-step losses of
              "3 steps + save, then --resume to 6" are bitwise equal to one 6-step run, the
              JSON records carry the global steps 3, 4, 5, and the final parameters (--save,
              llm.c file) are byte-equal; with --grad-accum, --grad-clip and a cosine LR
              schedule, a run resumed from the step-3 directory of a 6-step run repeats its
              steps 3..5 bitwise
  gpt_other   saved on 1 stage 2x1 (dp), resumed on 2 stages 1x2,2x1 (--stage-strategy
              megatron,dp), on 3 stages (tied wte on stages 0 and 2), on an axonn 2x1x2 mesh
              (sharded storage); saved on 4 ranks (2x2 megatron) resumed on 2 and on 8 ranks:
              losses of steps 3..7 within 1e-5 relative of the uninterrupted run
  gpt_bad     corrupted shard, truncated shard, missing shard, manifest of another model,
              another format version, manifest of another configuration, other training data,
              a layout that does not fit the model, nothing left to train: non-zero
              exit, a message naming the file or field, no step trained (no JSON written)
  gpt_convert xmesh-ckpt convert: llm.c file of `--serial --save` -> checkpoint (4 ranks,
              2 stages) -> llm.c file is byte-equal; a parallel run's checkpoint converted to
              llm.c equals that run's --save file; a converted checkpoint resumes like
              --serial --init-from (1e-5)
  ut_same / ut_other / ut_bad   the same for the U-Transformer
usage: test_resume.py SET TRAIN CKPT MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

SET, TRAIN, CKPT = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
MPI = sys.argv[4:]
GPT = ["--layers", "3", "--heads", "2", "--channels", "32", "--seq", "16", "--batch", "4",
       "--no-progress"]
failures = 0
TMP = tempfile.mkdtemp(prefix="xmp_resume_")


def check(cond, what):
    global failures
    print(("ok  " if cond else "FAIL"), what)
    if not cond:
        failures += 1
    return cond


def run(n, prog, args, expect_ok=True):
    cmd = ([prog] if n == 0 else MPI + ["-n", str(n), "--oversubscribe", prog]) + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240, cwd=TMP)
    if (p.returncode == 0) != expect_ok:
        print("FAIL exit %d: %s\n%s" % (p.returncode, " ".join(args), p.stdout[-3000:]))
        global failures
        failures += 1
    return p


def gpt(n, args, expect_ok=True):
    return run(n, TRAIN, ["gpt"] + GPT + args, expect_ok)


def steps(path):
    with open(os.path.join(TMP, path)) as f:
        return [(s["step"], s["loss"]) for s in json.load(f)["steps"]]


def path(p):
    return os.path.join(TMP, p)


def same_bytes(a, b):
    with open(path(a), "rb") as f, open(path(b), "rb") as g:
        return f.read() == g.read()


def close(ref, got, tol, what):
    worst = max(abs(l - ref[s]) / abs(ref[s]) for s, l in got)
    check([s for s, _ in got] == list(range(got[0][0], len(ref))) and worst <= tol,
          "%s: steps %s, max rel %.3g <= %g" % (what, [s for s, _ in got], worst, tol))


def gpt_same():
    for tag, lay in (("s1", ["--mesh", "2x1"]),
                     ("s2", ["--stage-mesh", "1x1,1x2", "--microbatches", "2"])):
        n = 2 if tag == "s1" else 3
        gpt(n, lay + ["--steps", "6", "--json", tag + "full.json", "--save", tag + "full.bin"])
        gpt(n, lay + ["--steps", "3", "--save-dir", tag + "ck", "--json", tag + "a.json"])
        gpt(n, lay + ["--steps", "6", "--resume", tag + "ck", "--json", tag + "b.json",
                      "--save", tag + "b.bin"])
        full, a, b = steps(tag + "full.json"), steps(tag + "a.json"), steps(tag + "b.json")
        check([s for s, _ in b] == [3, 4, 5], "%s: resumed JSON records carry steps 3, 4, 5 (%s)"
              % (tag, [s for s, _ in b]))
        check(a + b == full, "%s: losses of 3 + resumed 3 steps bitwise equal the 6-step run"
              % tag)
        check(same_bytes(tag + "full.bin", tag + "b.bin"),
              "%s: final parameters byte-equal" % tag)
        with open(path(tag + "ck/step-00000003/MANIFEST")) as f:
            man = f.read()
        sizes = [int(l.split()[3]) for l in man.splitlines() if l.startswith("file ")]
        if tag == "s1":  # 2 data-parallel replicas: each writes half of every tensor
            check(len(sizes) == 2 and sizes[0] == sizes[1] > 0,
                  "s1: both replicas write half of the unique data (shards %s)" % sizes)
        for key in ("meta model gpt2", "meta config.num_layers 3", "meta adamw.t 3",
                    "meta data.batches 3", "tensor h.2.fc.w.adam_v ", "tensor wte.adam_m "):
            check(key in man, "%s: manifest has '%s'" % (tag, key.strip()))
    loop_features(gpt, 3, ["--stage-mesh", "1x1,1x2", "--microbatches", "2"], "gpt")


def loop_features(cmd, n, lay, tag):
    """--grad-accum, --grad-clip and an LR schedule (which depends on --steps, the total): one
    6-step run saving every 3 steps, then a run resumed from its step-3 directory to 6 gives
    bitwise the same losses for steps 3, 4, 5."""
    feats = ["--grad-accum", "2", "--grad-clip", "0.5", "--warmup", "1", "--lr-decay", "cosine",
             "--lr-min-frac", "0.1", "--val-every", "2", "--val-steps", "1"]
    cmd(n, lay + feats + ["--steps", "6", "--save-dir", tag + "lk", "--save-every", "3",
                          "--json", tag + "lfull.json"])
    cmd(n, lay + feats + ["--steps", "6", "--resume", path(tag + "lk/step-00000003"),
                          "--json", tag + "lb.json"])
    full, b = steps(tag + "lfull.json"), steps(tag + "lb.json")
    check(b == full[3:], "%s: --grad-accum 2 --grad-clip --warmup --lr-decay cosine --val-every "
          "2: resumed steps 3..5 bitwise equal (%s)" % (tag, [s for s, _ in b]))

    def extra(p):  # per step: the scheduled lr and the validation loss where there is one
        with open(path(p)) as f:
            return [(r["step"], r.get("lr"), r.get("val_loss")) for r in json.load(f)["steps"]]
    fe, be = extra(tag + "lfull.json"), extra(tag + "lb.json")
    check(be == fe[3:] and any(v is not None for _, _, v in be) and be[0][1] is not None,
          "%s: resumed steps' lr and validation losses equal the uninterrupted run's (%s)"
          % (tag, be))


def gpt_other():
    gpt(2, ["--mesh", "2x1", "--steps", "8", "--json", "full.json"])
    full = [l for _, l in steps("full.json")]
    gpt(2, ["--mesh", "2x1", "--strategy", "dp", "--steps", "3", "--save-dir", "ck1"])
    gpt(4, ["--mesh", "2x2", "--steps", "3", "--save-dir", "ck4", "--save-every", "1",
            "--keep", "2"])
    kept = sorted(d for d in os.listdir(path("ck4")) if d.startswith("step-"))
    check(kept == ["step-00000002", "step-00000003"], "--keep 2 keeps the 2 newest: %s" % kept)
    cases = [
        ("1 stage 2x1 dp -> 2 stages 1x2,2x1 megatron,dp", 4, "ck1",
         ["--stage-mesh", "1x2,2x1", "--stage-strategy", "megatron,dp", "--microbatches", "2"]),
        ("1 stage 2x1 -> 3 stages 1x1 (tied wte on 0 and 2)", 3, "ck1",
         ["--layout", "E,t|t,t|L", "--stage-mesh", "1x1,1x1,1x1", "--microbatches", "2",
          "--schedule", "gpipe"]),
        ("4 ranks 2x2 -> 2 ranks 2 stages", 2, "ck4",
         ["--stage-mesh", "1x1,1x1", "--microbatches", "2"]),
        ("4 ranks 2x2 -> 8 ranks 2 stages 2x2", 8, "ck4",
         ["--stage-mesh", "2x2,2x2", "--microbatches", "2"]),
        ("4 ranks 2x2 -> 4 ranks axonn 2x1x2 (sharded storage)", 4, "ck4",
         ["--stage-mesh", "2x1x2", "--strategy", "axonn"]),
    ]
    for i, (what, n, ck, args) in enumerate(cases):
        j = "o%d.json" % i
        gpt(n, args + ["--steps", "8", "--resume", ck, "--json", j])
        if os.path.exists(path(j)):
            close(full, steps(j), 1e-5, what)
        else:
            check(False, what + ": no JSON")


def write_manifest(p, edit):
    """Applies edit to the manifest text and rewrites its end CRC (a valid manifest)."""
    with open(p) as f:
        text = f.read()
    body = edit(text[:text.rindex("end ")])
    with open(p, "w") as f:
        f.write(body + "end 0x%08x\n" % (zlib.crc32(body.encode()) & 0xffffffff))


def bad_case(what, n, args, ck, mutate, needles, prog_args=None):
    d = path("bad_" + what.replace(" ", "_"))
    shutil.copytree(path(ck), d)
    mutate(d)
    j = path("bad.json")
    if os.path.exists(j):
        os.remove(j)
    p = gpt(n, args + ["--resume", d, "--json", j], expect_ok=False)
    out = p.stdout
    check(p.returncode != 0 and all(s in out for s in needles) and not os.path.exists(j)
          and "step 3" not in out.replace("at step 3", ""),
          "%s: exit %d, message names %s, no step run" % (what, p.returncode, needles))
    if not all(s in out for s in needles):
        print(out[-1500:])


def gpt_bad():
    lay = ["--mesh", "2x1", "--steps", "6"]
    gpt(2, ["--mesh", "2x1", "--steps", "3", "--save-dir", "ck"])
    step = "ck/step-00000003"

    def corrupt(d):
        with open(d + "/step-00000003/rank-00000.bin", "r+b") as f:
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0x55]))

    def truncate(d):
        with open(d + "/step-00000003/rank-00000.bin", "r+b") as f:
            f.truncate(1000)

    def missing(d):
        with open(d + "/step-00000003/rank-00001.bin", "wb"):
            pass  # rank 1 wrote nothing (replicas); remove rank 0's instead
        os.remove(d + "/step-00000003/rank-00000.bin")

    def other_model(d):
        write_manifest(d + "/step-00000003/MANIFEST",
                       lambda t: t.replace("meta model gpt2", "meta model utransformer"))

    def other_config(d):
        write_manifest(d + "/step-00000003/MANIFEST",
                       lambda t: t.replace("meta config.channels 32", "meta config.channels 64"))

    def version(d):
        write_manifest(d + "/step-00000003/MANIFEST",
                       lambda t: t.replace("xmesh-checkpoint 1", "xmesh-checkpoint 2"))

    bad_case("corrupted shard", 2, lay, "ck", corrupt, ["rank-00000.bin", "CRC32", "corrupted"])
    bad_case("truncated shard", 2, lay, "ck", truncate, ["rank-00000.bin", "1000 bytes"])
    bad_case("missing shard", 2, lay, "ck", missing, ["rank-00000.bin", "No such file"])
    bad_case("another model", 2, lay, "ck", other_model, ["MANIFEST", "'model'", "utransformer"])
    bad_case("another configuration", 2, lay, "ck", other_config, ["h.0.attproj.b", "shape"])
    bad_case("another format version", 2, lay, "ck", version, ["MANIFEST", "format version 2"])
    bad_case("layout not fitting", 4, ["--mesh", "1x4", "--steps", "6"], "ck", lambda d: None,
             ["heads", "tensor-parallel degree 4"])
    with open(path("other.txt"), "w") as f:
        f.write("another text to train on. " * 200)
    bad_case("other data", 2, lay + ["--text", path("other.txt")], "ck", lambda d: None,
             ["'data'", "other.txt"])
    bad_case("nothing left to train", 2, ["--mesh", "2x1", "--steps", "3"], "ck", lambda d: None,
             ["step 3", "--steps 3"])


def gpt_convert():
    run(0, TRAIN, ["gpt", "--serial"] + GPT + ["--steps", "2", "--save", "s.bin"])
    run(4, CKPT, ["convert", "--from-llmc", "s.bin", "--stage-mesh", "2x1,1x2", "--batch", "4",
                  "--seq", "16", "cv"])
    p = run(0, CKPT, ["info", "cv"])
    check(p.returncode == 0 and "verify      ok" in p.stdout and "h.2.qkv.w.adam_m" in p.stdout,
          "converted checkpoint verifies (info)")
    run(0, CKPT, ["convert", "cv", "--to-llmc", "back1.bin"])
    run(3, CKPT, ["convert", "cv", "--to-llmc", "back3.bin"])
    check(same_bytes("s.bin", "back1.bin"), "serial llm.c -> 2-stage checkpoint -> llm.c (1 rank): "
          "byte-equal")
    check(same_bytes("s.bin", "back3.bin"), "... -> llm.c (3 ranks): byte-equal")
    # a parallel run's checkpoint against its own gathered --save file
    gpt(4, ["--stage-mesh", "2x1,1x2", "--microbatches", "2", "--steps", "3", "--save-dir",
            "pk", "--save", "p.bin"])
    run(2, CKPT, ["convert", "pk", "--to-llmc", "pk.bin"])
    check(same_bytes("p.bin", "pk.bin"), "parallel checkpoint -> llm.c equals the run's --save")
    # a converted checkpoint resumes like --init-from
    run(0, TRAIN, ["gpt", "--serial"] + GPT + ["--steps", "4", "--init-from", "s.bin", "--json",
                                               "ser.json"])
    gpt(2, ["--mesh", "1x2", "--steps", "4", "--resume", "cv", "--json", "cvr.json"])
    close([l for _, l in steps("ser.json")], steps("cvr.json"), 1e-5,
          "--resume from a converted llm.c file vs --serial --init-from")
    p = run(0, CKPT, ["convert", "--from-llmc", "nonexistent.bin", "x"], expect_ok=False)
    check(p.returncode != 0 and "nonexistent.bin" in p.stdout, "missing llm.c file named")


UT = ["--base-channels", "8", "--batch", "4", "--no-progress"]


def ut(n, args, expect_ok=True):
    return run(n, TRAIN, ["utransformer"] + UT + args, expect_ok)


def ut_same():
    for tag, lay in (("s1", ["--stage-mesh", "2x1"]),
                     ("s2", ["--stages", "2", "--stage-mesh", "1x1,1x2", "--microbatches", "2"])):
        n = 2 if tag == "s1" else 3
        ut(n, lay + ["--steps", "6", "--json", tag + "full.json"])
        ut(n, lay + ["--steps", "3", "--save-dir", tag + "ck", "--json", tag + "a.json"])
        ut(n, lay + ["--steps", "6", "--resume", tag + "ck", "--json", tag + "b.json"])
        full, a, b = steps(tag + "full.json"), steps(tag + "a.json"), steps(tag + "b.json")
        check([s for s, _ in b] == [3, 4, 5], "ut %s: resumed JSON records carry steps 3, 4, 5 "
              "(%s)" % (tag, [s for s, _ in b]))
        check(a + b == full, "ut %s: losses of 3 + resumed 3 steps bitwise equal the 6-step run"
              % tag)
        with open(path(tag + "ck/step-00000003/MANIFEST")) as f:
            man = f.read()
        for key in ("meta model utransformer", "meta config.base 8", "meta data.step 3",
                    "tensor down1.conv1.w ", "tensor down1.conv1.w.momentum "):
            check(key in man, "ut %s: manifest has '%s'" % (tag, key.strip()))
    loop_features(ut, 3, ["--stages", "2", "--stage-mesh", "1x1,1x2", "--microbatches", "2"],
                  "ut")


def ut_other():
    ut(2, ["--stage-mesh", "2x1", "--steps", "8", "--json", "full.json"])
    full = [l for _, l in steps("full.json")]
    ut(2, ["--stage-mesh", "2x1", "--strategy", "dp", "--steps", "3", "--save-dir", "ck1"])
    ut(4, ["--stage-mesh", "2x2", "--steps", "3", "--save-dir", "ck4"])
    cases = [
        ("1 stage 2x1 dp -> 2 stages 1x2,2x1 megatron", 4, "ck1",
         ["--stages", "2", "--stage-mesh", "1x2,2x1", "--microbatches", "2"]),
        ("4 ranks 2x2 -> 2 ranks 2 stages 1x1", 2, "ck4",
         ["--stages", "2", "--stage-mesh", "1x1,1x1", "--microbatches", "2"]),
        ("4 ranks 2x2 -> 8 ranks 2 stages 2x2", 8, "ck4",
         ["--stages", "2", "--stage-mesh", "2x2,2x2", "--microbatches", "2"]),
    ]
    for i, (what, n, ck, args) in enumerate(cases):
        j = "o%d.json" % i
        ut(n, args + ["--steps", "8", "--resume", ck, "--json", j])
        if os.path.exists(path(j)):
            close(full, steps(j), 1e-5, "ut " + what)
        else:
            check(False, "ut " + what + ": no JSON")


def ut_bad():
    ut(2, ["--stage-mesh", "2x1", "--steps", "3", "--save-dir", "ck"])
    lay = ["--stage-mesh", "2x1", "--steps", "6"]

    def corrupt(d):
        with open(d + "/step-00000003/rank-00000.bin", "r+b") as f:
            f.seek(64)
            b = f.read(1)
            f.seek(64)
            f.write(bytes([b[0] ^ 0x55]))

    def missing(d):
        os.remove(d + "/step-00000003/rank-00000.bin")

    def other_model(d):
        write_manifest(d + "/step-00000003/MANIFEST",
                       lambda t: t.replace("meta model utransformer", "meta model gpt2"))

    def bad_field(d):
        write_manifest(d + "/step-00000003/MANIFEST",
                       lambda t: t.replace("meta sgd.momentum 0.", "meta sgd.momentum x0."))

    for what, mut, needles in (
            ("corrupted shard", corrupt, ["rank-00000.bin", "CRC32"]),
            ("missing shard", missing, ["rank-00000.bin", "No such file"]),
            ("another model", other_model, ["MANIFEST", "'model'", "gpt2", "utransformer"]),
            ("malformed field", bad_field, ["sgd.momentum", "x0."])):
        d = path("ubad_" + what.replace(" ", "_"))
        shutil.copytree(path("ck"), d)
        mut(d)
        j = path("bad.json")
        p = ut(2, lay + ["--resume", d, "--json", j], expect_ok=False)
        ok = p.returncode != 0 and all(s in p.stdout for s in needles) and not os.path.exists(j)
        check(ok, "ut %s: exit %d, message names %s, no step run" % (what, p.returncode, needles))
        if not ok:
            print(p.stdout[-1500:])
    # a layout that does not fit the model: the U-Transformer refuses a micro-batch
    # not divisible by the data-parallel degree (batch 4 from the checkpoint, dp 8)
    j = path("bad.json")
    p = ut(8, ["--stage-mesh", "8x1", "--steps", "6", "--resume", path("ck"), "--json", j],
           expect_ok=False)
    check(p.returncode != 0 and "data-parallel degree 8" in p.stdout and not os.path.exists(j),
          "ut layout not fitting: exit %d, message names the data-parallel degree" % p.returncode)


SETS = {"gpt_same": gpt_same, "gpt_other": gpt_other, "gpt_bad": gpt_bad,
        "gpt_convert": gpt_convert, "ut_same": ut_same, "ut_other": ut_other, "ut_bad": ut_bad}
if __name__ == "__main__":
    try:
        SETS[SET]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print("%s: %d failure(s)" % (SET, failures))
    sys.exit(1 if failures else 0)
