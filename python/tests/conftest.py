"""pytest under mpirun: every rank runs every test in the same order.

- The seed (XMESH_PY_SEED, else random) is rank 0's, broadcast, and shown in
  the report header: rerun with XMESH_PY_SEED=<seed> to replay.
- After each test the ranks agree on its outcome: a test that failed on any
  rank fails on all (so the report of every rank says so).
"""

import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))

COMM = MPI.COMM_WORLD


def _seed():
    s = os.environ.get("XMESH_PY_SEED")
    s = int(s) if s else int(np.random.SeedSequence().entropy % (2**31))
    return COMM.bcast(s, root=0)


SEED = _seed()


def _thread_level():
    names = {getattr(MPI, n): n for n in ("THREAD_SINGLE", "THREAD_FUNNELED", "THREAD_SERIALIZED", "THREAD_MULTIPLE")}
    return names.get(MPI.Query_thread(), str(MPI.Query_thread()))


def pytest_report_header(config):
    return (
        f"xmesh: rank {COMM.rank} of {COMM.size}, MPI {_thread_level()}, "
        f"seed {SEED} (replay: XMESH_PY_SEED={SEED})"
    )


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(pytest_report_header(None))


@pytest.fixture
def comm():
    return COMM


@pytest.fixture
def seed(request):
    # One seed per test, derived from the run's seed and the test's name.
    import zlib

    return (SEED + zlib.crc32(request.node.name.encode())) % (2**31)


@pytest.fixture
def ctx():
    import xmesh

    with xmesh.Context(COMM) as c:
        yield c


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call":
        return
    failed = COMM.allreduce(1 if rep.failed else 0, op=MPI.SUM)
    if failed and not rep.failed:
        rep.outcome = "failed"
        rep.longrepr = f"failed on {failed} other rank(s) (seed {SEED})"
