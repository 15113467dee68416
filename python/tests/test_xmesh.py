"""xmesh's Python package under mpirun (-np 4 and -np 8): data checked
element by element against a NumPy oracle that slices the global array."""

import gc

import numpy as np
import pytest

import xmesh
from oracle import Spec, random_mesh, random_spec, values

ALL_DTYPES = list(xmesh.dtypes.values())


def test_every_dtype_is_usable(ctx):
    # float16/32/64, int8/32/64, uint8 always; bfloat16 with ml_dtypes (the test venv has it).
    names = {d.name for d in ALL_DTYPES}
    assert {"uint8", "int8", "int32", "int64", "float16", "float32", "float64"} <= names
    try:
        import ml_dtypes
    except ImportError:
        assert set(xmesh.dtypes) == {"u8", "i8", "i32", "i64", "f16", "f32", "f64"}
        with ctx.mesh((1,), [0]) as m, pytest.raises(xmesh.InvalidArgumentError, match="ml_dtypes"):
            xmesh.Layout((2,), "bfloat16", m, "R")
    else:
        assert set(xmesh.dtypes) == {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64"}
        assert xmesh.dtypes["bf16"] == np.dtype(ml_dtypes.bfloat16)


def test_constants_come_from_the_library():
    from xmesh import _capi, _lib

    for name, code, text in _capi.RESULTS:
        assert _lib.text(_lib.result_string(code)) == text
        if code < 0:
            cls = getattr(xmesh, xmesh._class_name(name))
            assert issubclass(cls, xmesh.Error) and cls.code == code and cls.code_name == name
    assert xmesh.__version__ == xmesh.version
    assert xmesh.strategies[0] and xmesh.schedulers[0]


def _global(rng, spec, dtype):
    """(global array, per-partial arrays or None)."""
    if spec.partial_axes:
        parts = [values(rng, dtype, spec.shape, small=True) for _ in range(spec.npartials())]
        total = np.sum(np.stack(parts), axis=0, dtype=np.dtype(dtype)) if parts else None
        return total.astype(dtype), parts
    return values(rng, dtype, spec.shape), None


def _src_block(spec, rank, g, parts):
    sl = spec.slices(rank)
    if sl is None:
        return None
    whole = parts[spec.partial_index(rank)] if parts is not None else g
    return np.ascontiguousarray(whole[sl])


def _check_layout(layout, spec, nranks):
    for r in range(nranks):
        want = spec.slices(r)
        assert layout.local_slice(r) == want, (layout, r)
        assert layout.local_shape(r) == (None if want is None else tuple(s.stop - s.start for s in want))


def _run_case(ctx, rng, src_spec, dst_spec, dtype, src_str, dst_str, **params):
    rank = ctx.rank
    A = ctx.mesh(src_spec.mesh_shape, src_spec.ranks)
    B = ctx.mesh(dst_spec.mesh_shape, dst_spec.ranks)
    src = xmesh.Layout(src_spec.shape, dtype, A, src_str)
    dst = xmesh.Layout(dst_spec.shape, dtype, B, dst_str)
    _check_layout(src, src_spec, ctx.size)
    _check_layout(dst, dst_spec, ctx.size)
    g, parts = _global(rng, src_spec, dtype)
    with ctx.plan(src, dst, **params) as plan:
        out = plan(_src_block(src_spec, rank, g, parts))
    want = dst_spec.slices(rank)
    if want is None:
        assert out is None
    else:
        assert out.dtype == np.dtype(dtype) and out.flags.c_contiguous
        np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(g[want]).view(np.uint8))
    A.close()
    B.close()


def test_random_layouts(ctx, seed):
    rng = np.random.default_rng(seed)
    trials = 48
    for t in range(trials):
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.integers(0 if t % 6 == 5 else 1, 10, size=ndim))
        dtype = ALL_DTYPES[int(rng.integers(len(ALL_DTYPES)))]
        sbp = bool(rng.integers(2))
        s = random_spec(rng, shape, *random_mesh(rng, ctx.size), sbp=sbp)
        d = random_spec(rng, shape, *random_mesh(rng, ctx.size), sbp=bool(rng.integers(2)))
        s_str = s.sbp() if sbp else s.gspmd(commas=bool(rng.integers(2)))
        d_str = d.sbp() if d.sbp_ok() and rng.integers(2) else d.gspmd()
        print(f"trial {t}: seed {seed} shape {shape} {dtype.name} {s.mesh_shape}{s.ranks} {s_str!r} -> "
              f"{d.mesh_shape}{d.ranks} {d_str!r}")
        _run_case(ctx, rng, s, d, dtype, s_str, d_str)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_every_dtype(ctx, seed, dtype):
    rng = np.random.default_rng(seed)
    n = ctx.size
    # Uneven dims (array_split), a 2-axis source and a 1-axis destination over other ranks.
    s = Spec((7, 5, 3), (2, n // 4), list(range(n // 2)), [[0], [], [1]])
    d = Spec((7, 5, 3), (n // 2,), list(range(n // 2, n)), [[], [0], []])
    _run_case(ctx, rng, s, d, dtype, s.gspmd(), d.sbp())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_partial_sums(ctx, seed, dtype):
    """P sources: the destination is the sum of the partials."""
    rng = np.random.default_rng(seed)
    n = ctx.size
    s = Spec((6, 9), (2, n // 2), list(range(n)), [[0], []], partial_axes=[1])  # "S(0),P"
    d = Spec((6, 9), (n // 2,), list(range(n // 2)), [[], [0]])
    assert s.sbp() == "S(0),P"
    _run_case(ctx, rng, s, d, dtype, s.sbp(), d.gspmd())


def test_random_partial_sums(ctx, seed):
    rng = np.random.default_rng(seed)
    for t in range(16):
        shape = tuple(int(x) for x in rng.integers(1, 9, size=int(rng.integers(1, 3))))
        dtype = ALL_DTYPES[int(rng.integers(len(ALL_DTYPES)))]
        s = random_spec(rng, shape, *random_mesh(rng, ctx.size), partial=True, sbp=True)
        d = random_spec(rng, shape, *random_mesh(rng, ctx.size))
        print(f"trial {t}: seed {seed} {shape} {dtype.name} {s.sbp()!r} {s.ranks} -> {d.gspmd()!r} {d.ranks}")
        _run_case(ctx, rng, s, d, dtype, s.sbp(), d.gspmd())


def _pair(ctx, shape=(12, 10), dtype=np.float32):
    n = ctx.size
    A = ctx.mesh((2, n // 2), list(range(n)))
    B = ctx.mesh((n,), list(range(n))[::-1])
    src = xmesh.Layout(shape, dtype, A, "S0S1")
    dst = xmesh.Layout(shape, dtype, B, "RS0")
    return src, dst


def _global_of(shape, dtype, k=0):
    return (np.arange(int(np.prod(shape))).reshape(shape) % 251 + k).astype(dtype)


def test_plan_reuse_and_given_destination(ctx):
    src, dst = _pair(ctx)
    with ctx.plan(src, dst, strategy=xmesh.strategies[0]) as plan:
        assert plan.info.unit_tasks > 0 and plan.info.bytes_total == 12 * 10 * 4
        assert plan.info.strategy == xmesh.strategies[0]
        out = dst.empty()
        for k in range(3):
            g = _global_of(src.shape, np.float32, k)
            got = plan(np.ascontiguousarray(g[src.local_slice()]), out)
            assert got is out  # written in place: no copy
            np.testing.assert_array_equal(out, g[dst.local_slice()])


def test_nonblocking(ctx):
    src, dst = _pair(ctx)
    back = _pair(ctx)[0]
    g = _global_of(src.shape, np.float32, 5)
    with ctx.plan(src, dst) as p1, ctx.plan(dst, back) as p2:
        # Two requests in flight; the source block is a temporary only the
        # request references, the destination is allocated by the binding.
        r1 = p1.start(np.ascontiguousarray(g[src.local_slice()]))
        other = np.ascontiguousarray(g[dst.local_slice()])
        r2 = p2.start(other)
        del other
        gc.collect()
        polls = 0
        while not (r1.test() & r2.test()):
            polls += 1
        out1, out2 = r1.wait(), r2.wait()
        assert r1.done and r2.done
        np.testing.assert_array_equal(out1, g[dst.local_slice()])
        np.testing.assert_array_equal(out2, g[back.local_slice()])
        # Reuse after a nonblocking run, and a request used as a context manager.
        with p1.start(np.ascontiguousarray(g[src.local_slice()]) + 1) as r:
            pass
        np.testing.assert_array_equal(r.wait(), g[dst.local_slice()] + 1)


def test_close_waits_for_requests_in_flight(ctx):
    src, dst = _pair(ctx)
    g = _global_of(src.shape, np.float32, 9)
    out = dst.empty()
    plan = ctx.plan(src, dst)
    req = plan.start(np.ascontiguousarray(g[src.local_slice()]), out)
    del req
    gc.collect()
    plan.close()  # waits for the request the caller dropped
    np.testing.assert_array_equal(out, g[dst.local_slice()])
    assert plan.closed
    with pytest.raises(xmesh.InvalidUsageError, match="closed"):
        plan(np.ascontiguousarray(g[src.local_slice()]))


class _DLPackOnly:
    """A producer that offers only DLPack (like a CPU torch tensor)."""

    def __init__(self, arr):
        self._a = arr

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class _FakeGPU(_DLPackOnly):
    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_zero_copy_dlpack_and_buffer_protocol(ctx):
    src, dst = _pair(ctx)
    g = _global_of(src.shape, np.float32, 3)
    with ctx.plan(src, dst) as plan:
        s = np.ascontiguousarray(g[src.local_slice()])
        d = dst.empty()
        d_obj = _DLPackOnly(d)
        got = plan(_DLPackOnly(s), d_obj)
        assert got is d_obj
        np.testing.assert_array_equal(d, g[dst.local_slice()])  # written through DLPack: no copy
        d2 = dst.empty()
        got = plan(memoryview(s), memoryview(d2))
        assert isinstance(got, memoryview)
        np.testing.assert_array_equal(d2, g[dst.local_slice()])  # written through the buffer
        with pytest.raises(xmesh.InvalidArgumentError, match="device"):
            plan(_FakeGPU(s))


def test_errors_name_the_bad_value_and_move_nothing(ctx):
    n = ctx.size
    A = ctx.mesh((2, n // 2), list(range(n)))
    with pytest.raises(xmesh.InvalidArgumentError, match="S0S0") as e:
        xmesh.Layout((8, 8), np.float32, A, "S0S0")
    assert e.value.code == xmesh.InvalidArgumentError.code and "S0S0" in e.value.message
    assert isinstance(e.value, xmesh.Error) and isinstance(e.value, ValueError)
    with pytest.raises(xmesh.InvalidArgumentError, match="complex64"):
        xmesh.Layout((8, 8), np.complex64, A, "S0R")
    with pytest.raises(xmesh.InvalidArgumentError, match="f33"):
        xmesh.Layout((8, 8), "f33", A, "S0R")
    with pytest.raises(xmesh.Error):
        ctx.mesh((2, 2), [0, 0, 1, 1][: 4])  # a rank twice
    with pytest.raises(xmesh.InvalidArgumentError, match="needs 4 ranks"):
        ctx.mesh((2, 2), [0, 1])

    src, dst = _pair(ctx)
    with pytest.raises(xmesh.InvalidArgumentError, match="warp-drive"):
        ctx.plan(src, dst, strategy="warp-drive")
    with pytest.raises(xmesh.InvalidArgumentError, match="colour"):
        ctx.plan(src, dst, colour="blue")
    g = _global_of(src.shape, np.float32, 1)
    good = np.ascontiguousarray(g[src.local_slice()])
    with ctx.plan(src, dst) as plan:
        out = np.full(dst.local_shape(), -7, np.float32)
        keep = good.copy()
        cases = [
            ((good.astype(np.float64), out), "float64"),
            ((good, out.astype(np.int32)), "int32"),
            ((good.reshape(-1), out), "shape"),
            ((good, out[:-1]), "shape"),
            ((np.ascontiguousarray(good.T).T, out), "C-contiguous"),  # Fortran order
            ((good, np.zeros((out.shape[0], out.shape[1] * 2), np.float32)[:, ::2]), "C-contiguous"),
            ((None, out), "src_local is required"),
            ((good, np.frombuffer(bytes(out.nbytes), np.float32).reshape(out.shape)), "read-only"),
            (("not a buffer", out), "neither"),
        ]
        for (s, d), what in cases:
            with pytest.raises(xmesh.InvalidArgumentError, match=what):
                plan(s, d)
            with pytest.raises(xmesh.InvalidArgumentError, match=what):
                plan.start(s, d)
            assert (out == -7).all() and (good == keep).all()  # nothing moved
        # The handles are unchanged: the plan still works.
        np.testing.assert_array_equal(plan(good, out), g[dst.local_slice()])
        with pytest.raises(xmesh.InvalidUsageError):
            src.mesh.close()  # the plan uses it
    A.close()


def test_ranks_passing_different_layouts(ctx):
    n = ctx.size
    A = ctx.mesh((n,), list(range(n)))
    src = xmesh.Layout((n, 4 + (ctx.rank == 1)), np.int32, A, "S0R")  # rank 1 disagrees
    dst = xmesh.Layout((n, 4 + (ctx.rank == 1)), np.int32, A, "RS0")
    with pytest.raises(xmesh.MismatchError) as e:
        ctx.plan(src, dst)
    assert e.value.code == xmesh.MismatchError.code and e.value.message
    A.close()


def test_transfer_timeout_is_raised_by_wait(ctx, comm):
    """Senders never call: receivers' wait() raises TimeoutError (or RemoteError)
    carrying the library's message, and the retired plan refuses further starts."""
    n = ctx.size
    A = ctx.mesh((n // 2,), list(range(n // 2)))
    B = ctx.mesh((n // 2,), list(range(n // 2, n)))
    shape = (n, 2 * n)  # every receiver gets columns from a sender
    src = xmesh.Layout(shape, np.float64, A, "S0R")
    dst = xmesh.Layout(shape, np.float64, B, "RS0")
    with ctx.plan(src, dst, timeout_s=1.0) as plan:
        try:
            if ctx.rank in B:
                out = dst.empty()
                req = plan.start(None, out)
                with pytest.raises((xmesh.TimeoutError, xmesh.RemoteError)) as e:
                    req.wait()
                assert e.value.code in (xmesh.TimeoutError.code, xmesh.RemoteError.code)
                assert "timed out" in e.value.message or "rank" in e.value.message
                assert req.done
                with pytest.raises(xmesh.Error):
                    req.wait()  # the error again, not a hang
                with pytest.raises(xmesh.InvalidUsageError):
                    plan.start(None, out)
        finally:
            comm.Barrier()  # the senders stayed out until here


def test_rank_outside_a_mesh(ctx):
    n = ctx.size
    A = ctx.mesh((n // 2,), list(range(n // 2)))
    B = ctx.mesh((n // 2,), list(range(n // 2, n)))
    src = xmesh.Layout((n, 3), np.int64, A, "S0R")
    dst = xmesh.Layout((n, 3), np.int64, B, "RS0")
    g = _global_of(src.shape, np.int64)
    with ctx.plan(src, dst) as plan:
        if ctx.rank < n // 2:
            assert dst.local_shape() is None and dst.local_slice() is None
            with pytest.raises(xmesh.InvalidArgumentError, match="holds no block"):
                plan(np.ascontiguousarray(g[src.local_slice()]), np.zeros((1, 3), np.int64))
            assert plan(np.ascontiguousarray(g[src.local_slice()])) is None
        else:
            assert src.local_shape() is None
            np.testing.assert_array_equal(plan(None), g[dst.local_slice()])


def test_context_closes_what_is_open(comm):
    ctx = xmesh.Context(comm)
    src, dst = _pair(ctx)
    plan = ctx.plan(src, dst)
    ctx.close()
    assert plan.closed and src.mesh.closed and ctx.closed
    ctx.close()  # twice is fine
    with pytest.raises(xmesh.InvalidUsageError):
        ctx.mesh((1,), [0])
    with pytest.raises(xmesh.InvalidArgumentError, match="mpi4py"):
        xmesh.Context("MPI_COMM_WORLD")


def test_readme_example(ctx):
    """README's "Using it", in Python: two 2 x n/4 meshes, i32, RS01R -> S01RR."""
    n = ctx.size
    a_ranks, b_ranks = list(range(n // 2)), list(range(n // 2, n))
    A = ctx.mesh((2, n // 4), a_ranks)
    B = ctx.mesh((2, n // 4), b_ranks)
    shape = (16, 16, 8)
    src = xmesh.Layout(shape, np.int32, A, "RS01R")
    dst = xmesh.Layout(shape, np.int32, B, "S01RR")
    g = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    with ctx.plan(src, dst) as plan:  # collective
        my_src = g[src.local_slice()] if src.local_shape() is not None else None
        my_src = None if my_src is None else np.ascontiguousarray(my_src)
        for _ in range(2):  # reusable
            my_dst = plan(my_src)
            if ctx.rank in b_ranks:
                np.testing.assert_array_equal(my_dst, g[dst.local_slice()])
            else:
                assert my_dst is None


def test_torch_split_rule(ctx):
    """split="torch": torch.chunk's blocks (6 over 4: 2, 2, 2, 0; numpy: 2, 2, 1, 1),
    a reshard from one rule to the other checked element by element, and an
    unknown rule refused by name."""
    n = ctx.size
    with ctx.mesh((n,)) as m:
        rows = n + 2
        t = xmesh.Layout((rows, 3), np.int32, m, "S(0)", split="torch")
        p = xmesh.Layout((rows, 3), np.int32, m, "S(0)")
        c = (rows + n - 1) // n
        for r in range(n):
            lo, hi = min(r * c, rows), min((r + 1) * c, rows)
            assert t.local_shape(r) == (hi - lo, 3), r
            if hi > lo:
                assert t.local_offset(r) == (lo, 0)
        assert [p.local_shape(r)[0] for r in range(n)] != [t.local_shape(r)[0] for r in range(n)]
        g = np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
        for src, dst in ((p, t), (t, p)):
            with ctx.plan(src, dst) as plan:
                out = plan(np.ascontiguousarray(g[src.local_slice()]))
            np.testing.assert_array_equal(out, g[dst.local_slice()])
        with pytest.raises(xmesh.InvalidArgumentError, match="split must be 'numpy' or 'torch'"):
            xmesh.Layout((rows,), np.int32, m, "S0", split="chunk")
    assert "split=torch" in repr(t)
