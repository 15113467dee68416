#!/usr/bin/env python3
"""Starts N processes of one program the way torchrun (or srun) does, without
mpirun: every process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (--style torchrun, the default), SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID and XMESH_BOOTSTRAP (--style slurm) or XMESH_RANK,
XMESH_SIZE and XMESH_BOOTSTRAP (--style xmesh). The rendezvous port is a free
one unless --port is given.

usage: xmesh-launch.py -n N [options] -- PROGRAM [ARGS...]
  --timeout S        kill every process after S seconds (exit 124)
  --env R:VAR=VALUE  set VAR for rank R only (repeatable; R may be '*')
  --unset R:VAR      remove VAR for rank R only (repeatable)
  --skip R           never start rank R (a peer that never shows up)
  --victim R         rank R may die by a signal or stop itself: its exit
                     status is not judged, and once every other rank has
                     exited it is continued and killed
  --hosts H          ranks i*N/H .. are "host" h: XMESH_HOST=h<h> (and
                     LOCAL_RANK counts within it)
  --max-wall S       fail (exit 3) if the ranks took longer than S seconds
Exit status: 0 when every judged rank exited 0, else the first non-zero
status (a signal: 128 + signal). Every process's output is prefixed with
its rank.
"""
import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time


def free_port():
    # Two consecutive free ports: torchrun's store would use MASTER_PORT and
    # xmesh MASTER_PORT + 1.
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p >= 65535:
            continue
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 1))
            t.close()
            return p
        except OSError:
            t.close()
    raise SystemExit("xmesh-launch: no free port pair found")


def main():
    ap = argparse.ArgumentParser(add_help=True)
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--style", choices=["torchrun", "slurm", "xmesh"], default="torchrun")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--unset", action="append", default=[])
    ap.add_argument("--skip", type=int, action="append", default=[])
    ap.add_argument("--victim", type=int, action="append", default=[])
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--max-wall", type=float, default=0)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd or a.n < 1:
        ap.error("give -n N and a program after --")
    port = a.port or free_port()
    n, hosts = a.n, max(1, min(a.hosts, a.n))
    procs = {}
    t0 = time.monotonic()
    for r in range(n):
        if r in a.skip:
            continue
        env = dict(os.environ)
        h = r * hosts // n
        first = -(-h * n // hosts)  # first rank of host h
        nlocal = -(-(h + 1) * n // hosts) - first
        local = r - first
        if hosts > 1:
            env["XMESH_HOST"] = "h%d" % h
        if a.style == "torchrun":
            env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE=str(nlocal), MASTER_ADDR=a.addr, MASTER_PORT=str(port))
        elif a.style == "slurm":
            env.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(local),
                       XMESH_BOOTSTRAP="%s:%d" % (a.addr, port + 1))
        else:
            env.update(XMESH_RANK=str(r), XMESH_SIZE=str(n),
                       XMESH_BOOTSTRAP="%s:%d" % (a.addr, port + 1))
        for spec in a.env:
            who, kv = spec.split(":", 1)
            var, val = kv.split("=", 1)
            if who == "*" or int(who) == r:
                env[var] = val
        for spec in a.unset:
            who, var = spec.split(":", 1)
            if who == "*" or int(who) == r:
                env.pop(var, None)
        procs[r] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    rc = {}
    bufs = {r: b"" for r in procs}
    fds = {p.stdout.fileno(): r for r, p in procs.items()}

    def pump(timeout):
        if not fds:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(list(fds), [], [], timeout)
        for fd in ready:
            r = fds[fd]
            data = os.read(fd, 65536)
            if not data:
                del fds[fd]
                data = b"\n" if bufs[r] else b""
            bufs[r] += data
            while b"\n" in bufs[r]:
                line, bufs[r] = bufs[r].split(b"\n", 1)
                sys.stdout.write("[%d] %s\n" % (r, line.decode(errors="replace")))
            sys.stdout.flush()

    judged = [r for r in procs if r not in a.victim]
    timed_out = False
    while True:
        pump(0.05)
        for r, p in procs.items():
            if r not in rc and p.poll() is not None:
                rc[r] = p.returncode
        if all(r in rc for r in judged):
            break
        if time.monotonic() - t0 > a.timeout:
            timed_out = True
            break
    wall = time.monotonic() - t0
    for r, p in procs.items():
        if r not in rc:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            rc.setdefault(r, p.returncode)
    end = time.monotonic() + 2
    while fds and time.monotonic() < end:
        pump(0.05)
    if timed_out:
        print("xmesh-launch: killed after %.1f s (--timeout)" % a.timeout)
        return 124
    print("xmesh-launch: %d processes, judged ranks done after %.2f s; exit codes %s" %
          (len(procs), wall, " ".join("%d:%d" % (r, rc[r]) for r in sorted(rc))))
    if a.max_wall and wall > a.max_wall:
        print("xmesh-launch: FAIL: %.2f s is more than --max-wall %.2f s" % (wall, a.max_wall))
        return 3
    for r in judged:
        if rc[r] != 0:
            return rc[r] if rc[r] > 0 else 128 - rc[r]
    return 0


if __name__ == "__main__":
    sys.exit(main())
