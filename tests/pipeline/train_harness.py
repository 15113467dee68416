"""Shared by the xmesh-train test scripts (test_gpt_strategy.py, test_utrans_strategy.py,
test_overlap_utrans.py): running the trainer under mpiexec, the printed strategy of a stage, a
run checked against the serial model, editing a strategy text."""
import re
import subprocess
import sys


class Harness:
    def __init__(self, mpi, train, model, base, timeout=120):
        self.mpi, self.train, self.model, self.base = list(mpi), train, model, list(base)
        self.timeout = timeout

    def run(self, n, args):
        """(exit code, stdout + stderr) of MODEL on n ranks with the base flags and args."""
        cmd = self.mpi + ["-n", str(n), "--oversubscribe", self.train, self.model] + \
            self.base + args
        print("+", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=self.timeout)
        return p.returncode, p.stdout

    def printed_strategy(self, n, flags, stage=0):
        """The resolved text of one stage from --print-strategy (exits the test on failure)."""
        rc, out = self.run(n, flags + ["--print-strategy"])
        if rc != 0:
            sys.exit("--print-strategy failed:\n" + out)
        blocks = re.split(r"^# stage \d+: .*\n", out, flags=re.M)
        return blocks[stage + 1]

    def check_run(self, n, flags, steps=5):
        """True when the run exits 0 and its serial check compared `steps` steps, none off."""
        rc, out = self.run(n, flags + ["--steps", str(steps), "--check-serial"])
        ok = rc == 0 and f"check-serial: OK (0 mismatching of {steps} steps compared)" in out
        if not ok:
            print(out[-4000:])
        return ok


def edit(text, line):
    """The strategy text with the class line `line` replacing the class's line, or appended."""
    cls = line.split("=")[0].strip()
    lines = text.splitlines()
    if any(l.split("=")[0].strip() == cls for l in lines):
        lines = [line if l.split("=")[0].strip() == cls else l for l in lines]
    else:
        lines.append(line)
    return "\n".join(lines) + "\n"
