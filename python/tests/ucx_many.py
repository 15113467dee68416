"""Plans of many tensors from Python over UCX, without MPI: started by
tests/ucx/xmesh-launch.py (no mpirun, no mpi4py), every rank builds
``xmesh.Context.from_env()`` and runs the MPI tier's plan_many tests
(test_many.py: random plans checked element by element against the NumPy
oracle and one plan per tensor; dicts in, dicts out). Ranks need the same
seed: XMESH_PY_SEED (scripts/python-tests.sh sets it). Exit 0 when every
test passed on this rank."""

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import xmesh  # noqa: E402
import test_many  # noqa: E402


def main():
    seed = int(os.environ.get("XMESH_PY_SEED") or 1)
    failed = 0
    with xmesh.Context.from_env() as ctx:
        assert ctx.transport == "ucx", ctx.transport
        if ctx.rank == 0:
            print(f"ucx_many: {ctx.size} ranks over {ctx.transport}, seed {seed} (replay: XMESH_PY_SEED={seed})")
        tests = [
            ("random plans, own meshes", lambda: test_many.test_random_plans_of_many(ctx, seed, False)),
            ("random plans, shared meshes", lambda: test_many.test_random_plans_of_many(ctx, seed + 1, True)),
            ("dicts in, dicts out", lambda: test_many.test_dicts_in_dicts_out_and_given_destinations(ctx)),
        ]
        for name, fn in tests:
            try:
                fn()
                print(f"rank {ctx.rank}: ok: {name}")
            except Exception:
                failed += 1
                print(f"rank {ctx.rank}: FAIL: {name} (seed {seed})\n{traceback.format_exc()}")
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
