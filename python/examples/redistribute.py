"""Redistribute a NumPy array between two device meshes with xmesh.

    mpirun -np 4 python python/examples/redistribute.py [ROWS COLS]

The global array (ROWS x COLS float32, default 1000 x 600) lives row-split
over mesh A (every rank, "S0R"); it moves to mesh B (the upper half of the
ranks, column-split, "RS0"). Each rank passes only its own block; the
library plans the transfers once (ctx.plan is collective) and the plan is
reused: once blocking, once nonblocking with Python work in between.
Every rank checks its destination block against the global array.
"""

import sys

import numpy as np
from mpi4py import MPI

import xmesh


def main():
    rows, cols = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) == 3 else (1000, 600)
    comm = MPI.COMM_WORLD
    n = comm.size
    with xmesh.Context(comm) as ctx:
        a = ctx.mesh((n,), list(range(n)))                  # mesh A: every rank
        b_ranks = list(range(n // 2, n))
        b = ctx.mesh((len(b_ranks),), b_ranks)              # mesh B: the upper half
        src = xmesh.Layout((rows, cols), np.float32, a, "S0R")   # rows split over A
        dst = xmesh.Layout((rows, cols), np.float32, b, "RS0")   # columns split over B

        # The global array, known here only to check the result; a real
        # program holds just its own block.
        g = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
        my_src = np.ascontiguousarray(g[src.local_slice()])

        with ctx.plan(src, dst) as plan:                    # collective
            my_dst = plan(my_src)                           # blocking; None off mesh B
            req = plan.start(my_src * 2)                    # nonblocking
            busy = 0
            while not req.test():                           # overlap: compute, poll
                busy += 1
            my_dst2 = req.wait()
            info = plan.info

        ok = True
        if my_dst is not None:
            ok = np.array_equal(my_dst, g[dst.local_slice()]) and np.array_equal(my_dst2, 2 * g[dst.local_slice()])
        ok = comm.allreduce(ok, op=MPI.LAND)
        span = ", ".join(f"{s.start}:{s.stop}" for s in dst.local_slice() or ())
        held = f"dst block {my_dst.shape} = global[{span}]" if my_dst is not None else "no dst block"
        print(f"rank {ctx.rank}: src block {my_src.shape}, {held}")
        comm.Barrier()
        if ctx.rank == 0:
            print(f"{info.unit_tasks} unit tasks, {info.bytes_total} bytes, strategy {info.strategy}, "
                  f"scheduler {info.scheduler}: {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
