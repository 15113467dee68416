"""Plans of many tensors from Python (ctx.plan_many) under mpirun: every
destination block checked element by element against the NumPy oracle, and
against one plan per tensor; lists and dicts; bad input refused naming the
tensor with nothing moved."""

import numpy as np
import pytest

import xmesh
from oracle import Spec, random_mesh, random_spec, values

ALL_DTYPES = list(xmesh.dtypes.values())


def _global(rng, spec, dtype):
    if spec.partial_axes:
        parts = [values(rng, dtype, spec.shape, small=True) for _ in range(spec.npartials())]
        total = np.sum(np.stack(parts), axis=0, dtype=np.dtype(dtype))
        return total.astype(dtype), parts
    return values(rng, dtype, spec.shape), None


def _src_block(spec, rank, g, parts):
    sl = spec.slices(rank)
    if sl is None:
        return None
    whole = parts[spec.partial_index(rank)] if parts is not None else g
    return np.ascontiguousarray(whole[sl])


def _random_tensors(ctx, rng, n, shared):
    """n random (src spec, dst spec, dtype, src str, dst str); shared: every
    tensor on one mesh pair (their small tasks get packed)."""
    pair = (random_mesh(rng, ctx.size), random_mesh(rng, ctx.size))
    out = []
    for _ in range(n):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.integers(0, 7, size=ndim))
        dtype = ALL_DTYPES[int(rng.integers(len(ALL_DTYPES)))]
        sm, dm = pair if shared else (random_mesh(rng, ctx.size), random_mesh(rng, ctx.size))
        partial = dtype.kind in "fi" and bool(rng.integers(2))
        s = random_spec(rng, shape, *sm, partial=partial, sbp=True)
        d = random_spec(rng, shape, *dm)
        s_str = s.sbp() if s.partial_axes or rng.integers(2) else s.gspmd()
        d_str = d.sbp() if d.sbp_ok() and rng.integers(2) else d.gspmd()
        out.append((s, d, dtype, s_str, d_str))
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["own-meshes", "shared-meshes"])
def test_random_plans_of_many(ctx, seed, shared):
    rng = np.random.default_rng(seed)
    rank = ctx.rank
    for trial in range(4):
        n = int(rng.integers(1, 33))
        ts = _random_tensors(ctx, rng, n, shared)
        meshes, pairs, srcs, globals_ = [], [], [], []
        for s, d, dtype, s_str, d_str in ts:
            A, B = ctx.mesh(s.mesh_shape, s.ranks), ctx.mesh(d.mesh_shape, d.ranks)
            meshes += [A, B]
            pairs.append((xmesh.Layout(s.shape, dtype, A, s_str), xmesh.Layout(d.shape, dtype, B, d_str)))
            g, parts = _global(rng, s, dtype)
            globals_.append(g)
            srcs.append(_src_block(s, rank, g, parts))
        print(f"trial {trial}: seed {seed}: {n} tensors")
        with ctx.plan_many(pairs) as plan:
            if trial % 2:
                outs = plan(srcs)
            else:
                outs = plan.start(srcs).wait()
            info = plan.info
        assert isinstance(outs, list) and len(outs) == n
        assert info.tensors == n
        # one plan per tensor (collective: every rank creates each)
        alones = []
        for k in range(n):
            with ctx.plan(*pairs[k]) as one:
                alones.append(one(srcs[k]))
        for k, ((s, d, dtype, s_str, d_str), out) in enumerate(zip(ts, outs)):
            want = d.slices(rank)
            if want is None:
                assert out is None and alones[k] is None, k
                continue
            assert out.dtype == np.dtype(dtype) and out.shape == tuple(x.stop - x.start for x in want)
            np.testing.assert_array_equal(
                out.view(np.uint8), np.ascontiguousarray(globals_[k][want]).view(np.uint8), err_msg=f"tensor {k}"
            )
            np.testing.assert_array_equal(out.view(np.uint8), alones[k].view(np.uint8), err_msg=f"tensor {k} alone")
        for m in meshes:
            m.close()


def _three(ctx):
    n = ctx.size
    A = ctx.mesh((n,), list(range(n)))
    B = ctx.mesh((n,), list(range(n))[::-1])
    pairs = {
        "w": (xmesh.Layout((2 * n, 3), np.float32, A, "S0R"), xmesh.Layout((2 * n, 3), np.float32, B, "RS0")),
        "b": (xmesh.Layout((5,), np.float64, B, "R"), xmesh.Layout((5,), np.float64, A, "S0")),
        "i": (xmesh.Layout((n, n), np.int32, A, "RS0"), xmesh.Layout((n, n), np.int32, B, "S0R")),
    }
    return (A, B), pairs


def _globals(n):
    return {
        "w": np.arange(2 * n * 3, dtype=np.float32).reshape(2 * n, 3),
        "b": np.arange(5, dtype=np.float64) * 0.5,
        "i": np.arange(n * n, dtype=np.int32).reshape(n, n),
    }


def test_dicts_in_dicts_out_and_given_destinations(ctx):
    (A, B), pairs = _three(ctx)
    g = _globals(ctx.size)
    rank = ctx.rank
    srcs = {k: (None if s.local_slice(rank) is None else np.ascontiguousarray(g[k][s.local_slice(rank)])) for k, (s, _) in pairs.items()}
    with ctx.plan_many(pairs) as plan:
        assert len(plan) == 3
        out = plan(srcs)
        assert set(out) == {"w", "b", "i"}
        for k, (_, d) in pairs.items():
            sl = d.local_slice(rank)
            if sl is None:
                assert out[k] is None
            else:
                np.testing.assert_array_equal(out[k], g[k][sl])
        # given destination blocks are filled and returned as they are
        dsts = {k: (None if d.local_shape(rank) is None else np.zeros(d.local_shape(rank), d.dtype)) for k, (_, d) in pairs.items()}
        out2 = plan.start(srcs, dsts).wait()
        for k in pairs:
            assert out2[k] is dsts[k]
            if dsts[k] is not None:
                np.testing.assert_array_equal(dsts[k], out[k])
    A.close()
    B.close()


def test_bad_input_names_the_tensor_and_moves_nothing(ctx):
    (A, B), pairs = _three(ctx)
    g = _globals(ctx.size)
    rank = ctx.rank
    with pytest.raises(xmesh.InvalidArgumentError, match="empty"):
        ctx.plan_many([])
    with pytest.raises(xmesh.InvalidArgumentError, match="tensor 1: dst must be an xmesh.Layout"):
        ctx.plan_many([pairs["w"], (pairs["b"][0], "S0")])
    with pytest.raises(xmesh.InvalidArgumentError, match="unknown plan parameter"):
        ctx.plan_many(pairs, colour="red")
    srcs = {k: (None if s.local_slice(rank) is None else np.ascontiguousarray(g[k][s.local_slice(rank)])) for k, (s, _) in pairs.items()}
    with ctx.plan_many(pairs) as plan:
        dsts = {k: (None if d.local_shape(rank) is None else np.full(d.local_shape(rank), 7, d.dtype)) for k, (_, d) in pairs.items()}
        keep = {k: (None if v is None else v.copy()) for k, v in dsts.items()}
        # every rank holds a source block of "w": leaving it out is refused everywhere
        bad = dict(srcs, w=None)
        with pytest.raises(xmesh.InvalidArgumentError, match="tensor 'w': srcs\\['w'\\] is required"):
            plan(bad, dsts)
        wrong = dict(srcs, w=srcs["w"].astype(np.float64))
        with pytest.raises(xmesh.InvalidArgumentError, match="tensor 'w': .*dtype float64"):
            plan(wrong, dsts)
        with pytest.raises(xmesh.InvalidArgumentError, match="key 'z' is not a tensor"):
            plan(dict(srcs, z=None), dsts)
        with pytest.raises(xmesh.InvalidArgumentError, match="pass a dict"):
            plan(list(srcs.values()), dsts)
        for k in dsts:
            if dsts[k] is not None:
                np.testing.assert_array_equal(dsts[k], keep[k])
        # still usable
        out = plan(srcs, dsts)
        for k, (_, d) in pairs.items():
            sl = d.local_slice(rank)
            if sl is not None:
                np.testing.assert_array_equal(out[k], g[k][sl])
    A.close()
    B.close()


def test_ranks_passing_different_layouts_to_plan_many(ctx):
    (A, B), pairs = _three(ctx)
    p = list(pairs.values())
    if ctx.rank == 0:
        p[2] = (xmesh.Layout((ctx.size, ctx.size), np.int32, A, "S0R"), p[2][1])
    with pytest.raises(xmesh.MismatchError, match="tensor 2"):
        ctx.plan_many(p)
    with pytest.raises(xmesh.MismatchError, match="numbers of tensors"):
        ctx.plan_many(p[:2] if ctx.rank == 0 else p)
    A.close()
    B.close()
