"""pytest for xmesh.torch, one process per rank, under mpirun or torchrun
(scripts/python-torch-tests.sh --launcher mpirun|torchrun).

- torch.distributed is initialised with gloo from torchrun's RANK /
  WORLD_SIZE, else from Open MPI's OMPI_COMM_WORLD_RANK / _SIZE
  (MASTER_ADDR 127.0.0.1, MASTER_PORT from the launcher).
- The seed (XMESH_PY_SEED, else random) is rank 0's, broadcast, and shown in
  the report header: rerun with XMESH_PY_SEED=<seed> to replay.
- After each test the ranks agree on its outcome: a test that failed on any
  rank fails on all.
"""

import os
import sys
import zlib

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))


def _init():
    env = os.environ
    if "RANK" not in env:
        env["RANK"] = env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", "0"))
        env["WORLD_SIZE"] = env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", "1"))
        env["LOCAL_RANK"] = env.get("OMPI_COMM_WORLD_LOCAL_RANK", env["RANK"])
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.set_num_threads(1)


_init()
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def _seed():
    s = os.environ.get("XMESH_PY_SEED")
    t = torch.tensor([int(s) if s else int(torch.randint(0, 2**31 - 1, (1,)).item())], dtype=torch.int64)
    dist.broadcast(t, 0)
    return int(t.item())


SEED = _seed()


def pytest_report_header(config):
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "mpirun"
    return f"xmesh.torch: rank {RANK} of {SIZE} ({launcher}), torch {torch.__version__}, seed {SEED} (replay: XMESH_PY_SEED={SEED})"


def pytest_sessionstart(session):
    if RANK == 0:  # also under -q, and before a test that could hang
        print(pytest_report_header(None), file=sys.stderr, flush=True)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(pytest_report_header(None))


@pytest.fixture
def seed(request):
    return (SEED + zlib.crc32(request.node.name.encode())) % (2**31)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call":
        return
    t = torch.tensor([1 if rep.failed else 0], dtype=torch.int64)
    dist.all_reduce(t)
    failed = int(t.item())
    if failed and not rep.failed:
        rep.outcome = "failed"
        rep.longrepr = f"failed on {failed} other rank(s) (seed {SEED})"


def pytest_sessionfinish(session, exitstatus):
    import xmesh.torch as xt

    xt.shutdown()
