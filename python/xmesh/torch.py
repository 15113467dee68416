"""xmesh.torch: PyTorch DTensors between device meshes (cross-mesh resharding).

``redistribute(dtensor, device_mesh, placements)`` moves a DTensor to any
other DeviceMesh (disjoint, overlapping or the same ranks) and placements,
which ``DTensor.redistribute`` cannot do across meshes; it returns torch's
own DTensor. Every rank of the process group calls it (SPMD, like a
collective), also ranks outside both meshes. See docs/TORCH.md.

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, Replicate
    import xmesh.torch as xt

    dist.init_process_group("gloo")
    train = DeviceMesh("cpu", [[0, 1], [2, 3]])
    infer = DeviceMesh("cpu", [4, 5, 6, 7])
    w = ...                                     # a DTensor on `train`
    w2 = xt.redistribute(w, infer, [Shard(0)])  # on `infer`, torch.chunk shards

Placements map to xmesh's SBP: ``Shard(d)`` -> ``S(d)``, ``Replicate()`` ->
``B``, ``Partial("sum")`` -> ``P`` (sources only); uneven dims follow
torch.chunk (the library's XMESH_SPLIT_TORCH rule), so blocks are exactly
DTensor's local tensors. Local tensors are used without a copy (CPU,
contiguous). Plans are cached by layout (bounded LRU), so a training loop
plans once.

The context: ``init(group=None)`` (or the first call) makes one over the
process group. With a libxmesh that exports ``xmesh_ctx_create_ucx`` (the
MPI-free bootstrap) the ranks exchange addresses through the group's
all-gather (gloo, CPU byte tensors) and no MPI is needed (torchrun); without
it, the processes must run under ``mpirun`` and mpi4py's COMM_WORLD is used.
``XMESH_TORCH_BOOTSTRAP=oob|mpi`` (or ``init(bootstrap=...)``) chooses.
"""

import collections
import ctypes
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist

import xmesh as _xm
from xmesh import _capi, _lib

try:  # torch >= 2.4
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._tensor import DTensor, Replicate, Shard  # type: ignore
    from torch.distributed._tensor.placement_types import Partial  # type: ignore
    from torch.distributed.device_mesh import DeviceMesh  # type: ignore

try:
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # pragma: no cover
    _StridedShard = None

__all__ = [
    "init",
    "shutdown",
    "redistribute",
    "redistribute_many",
    "redistribute_state_dict",
    "nonmember_backward",
    "layout_of",
    "RedistributeWork",
    "PlacementError",
    "cache_info",
    "set_cache_size",
]


class PlacementError(_xm._InvalidArgument):
    """A DTensor, placement or mesh that xmesh.torch cannot move (refused
    before anything moved, on every rank: see the message)."""


# ---------------------------------------------------------------- dtypes

_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}


def _np_view(t):
    """A NumPy view of a CPU contiguous tensor (bfloat16 through ml_dtypes)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------- context


class _OobContext(_xm.Context):
    """An xmesh context made by xmesh_ctx_create_ucx over a torch process
    group: the out-of-band all-gather is the group's (CPU byte tensors)."""

    def __init__(self, group):  # noqa: D107 - no super().__init__: no MPI here
        self._group = _cpu_group(group)
        self._error = None
        size = dist.get_world_size(self._group)
        rank = dist.get_rank(self._group)

        def on_error(e):
            self._error = e

        allgather = _oob_allgather(self._group, size, on_error)
        self._cb = _OOB_FN(allgather)
        self._oob = _Oob(rank, size, self._cb, None)
        out = _lib.handle_t()
        fn = _lib.lib.xmesh_ctx_create_ucx
        fn.restype = _lib.result_t
        fn.argtypes = [ctypes.POINTER(_Oob), ctypes.c_void_p, ctypes.POINTER(_lib.handle_t)]
        rc = fn(ctypes.byref(self._oob), None, ctypes.byref(out))
        if rc < 0:
            why = f" (all-gather over the torch group failed: {self._error})" if self._error else ""
            _xm._check(rc, "xmesh_ctx_create_ucx" + why)
        self._adopt(out.value)


def _oob_allgather(group, size, on_error):
    """The xmesh_oob_t all-gather over a torch group: `nbytes` from `send`
    of every rank, in group-rank order, into `recv` (size * nbytes bytes);
    0 on success, -1 (on_error(exception)) on failure."""

    def allgather(user, send, recv, nbytes):
        try:
            mine = torch.frombuffer(bytearray(ctypes.string_at(send, nbytes)), dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
            parts = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(size)]
            dist.all_gather(parts, mine, group=group)
            for i, p in enumerate(parts):
                if nbytes:
                    ctypes.memmove(recv + i * nbytes, p.data_ptr(), nbytes)
            return 0
        except Exception as e:  # reported by the C side as a bootstrap failure
            on_error(e)
            return -1

    return allgather


# typedef struct { int rank, size; int (*allgather)(void *user, const void *send,
#                  void *recv, size_t bytes); void *user; } xmesh_oob_t;
_OOB_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Oob(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("allgather", _OOB_FN),
        ("user", ctypes.c_void_p),
    ]


def _cpu_group(group):
    """The group itself when its backend moves CPU tensors (gloo), else a
    gloo group over the same ranks (collective over them)."""
    g = group if group is not None else dist.group.WORLD
    try:
        backend = str(dist.get_backend(g)).lower()
    except Exception:  # pragma: no cover
        backend = ""
    if "gloo" in backend:
        return g
    ranks = dist.get_process_group_ranks(g)
    return dist.new_group(ranks, backend="gloo")


def have_oob_bootstrap():
    """True when libxmesh has the MPI-free bootstrap (xmesh_ctx_create_ucx)."""
    return hasattr(_lib.lib, "xmesh_ctx_create_ucx")


class _State:
    def __init__(self):
        self.ctx = None
        self.group = None
        self.vgroup = None  # CPU group for the agreement before each move
        self.ranks = None  # global torch rank -> ctx rank
        self.meshes = {}
        self.plans = collections.OrderedDict()
        self.cache_size = int(os.environ.get("XMESH_TORCH_PLAN_CACHE", "64") or 64)
        self.hits = self.misses = 0
        # moves started through one plan of many / through one plan per
        # tensor (batches of one count as "single"), and the last one's path
        self.many = self.single = 0
        self.last_path = None


_S = _State()


def init(group=None, *, bootstrap=None):
    """Makes the xmesh context over ``group`` (default: the default process
    group); collective over its ranks. Called by the first redistribute.

    bootstrap: None (the environment's XMESH_TORCH_BOOTSTRAP when set, else
    the MPI-free bootstrap when libxmesh has it, else mpi4py), "oob" (UCX,
    addresses exchanged through the group's all-gather) or "mpi" (mpi4py's
    COMM_WORLD: the processes must run under mpirun and the group's ranks
    must be MPI_COMM_WORLD's, in the same order).
    Returns the xmesh.Context.
    """
    if _S.ctx is not None:
        if group is not None and group is not _S.group:
            raise _xm._InvalidUsage("xmesh.torch is initialised over another group; call shutdown() first")
        return _S.ctx
    if not dist.is_available() or not dist.is_initialized():
        raise _xm._InvalidUsage("torch.distributed is not initialised: call torch.distributed.init_process_group first")
    g = group if group is not None else dist.group.WORLD
    how = bootstrap or os.environ.get("XMESH_TORCH_BOOTSTRAP") or ("oob" if have_oob_bootstrap() else "mpi")
    if how == "oob":
        if not have_oob_bootstrap():
            raise _xm._InvalidUsage("this libxmesh has no xmesh_ctx_create_ucx (the MPI-free bootstrap): run under mpirun")
        ctx = _OobContext(g)
    elif how == "mpi":
        ctx = _mpi_context(g)
    else:
        raise _xm._bad(f"bootstrap (or XMESH_TORCH_BOOTSTRAP) must be 'oob' or 'mpi', got {how!r}")
    _S.ctx, _S.group = ctx, g
    # a private CPU group for the agreement before each move, so that it can
    # never pair with a collective of the caller's on the same group
    _S.vgroup = dist.new_group(dist.get_process_group_ranks(g), backend="gloo")
    granks = dist.get_process_group_ranks(g)
    _S.ranks = {r: i for i, r in enumerate(granks)}
    return ctx


def _mpi_context(g):
    try:
        from mpi4py import MPI
    except ImportError:
        raise _xm._InvalidUsage(
            "xmesh.torch needs mpi4py under mpirun when libxmesh has no xmesh_ctx_create_ucx (MPI-free bootstrap)"
        ) from None
    world = MPI.COMM_WORLD
    granks = dist.get_process_group_ranks(g)
    if world.size != len(granks):
        raise _xm._InvalidUsage(
            f"MPI_COMM_WORLD has {world.size} processes but the torch group {len(granks)}: without "
            "xmesh_ctx_create_ucx (MPI-free bootstrap) xmesh.torch runs under mpirun, one rank per torch rank"
        )
    me = dist.get_rank(g)
    if world.rank != me:
        raise _xm._InvalidUsage(f"MPI rank {world.rank} is torch group rank {me}: start torch with RANK = the MPI rank")
    return _xm.Context(world)


def shutdown():
    """Closes cached plans, meshes and the context (collective-free)."""
    for p in list(_S.plans.values()):
        p.close()
    _S.plans.clear()
    for m in list(_S.meshes.values()):
        m.close()
    _S.meshes.clear()
    if _S.ctx is not None:
        _S.ctx.close()
    _S.ctx = _S.group = _S.vgroup = _S.ranks = None
    _S.hits = _S.misses = 0
    _S.many = _S.single = 0
    _S.last_path = None


def set_cache_size(n):
    """Bound of the plan cache (plans kept, least recently used evicted)."""
    if int(n) < 1:
        raise _xm._bad(f"cache size must be >= 1, got {n!r}")
    _S.cache_size = int(n)
    _evict()


_CacheInfo = collections.namedtuple("CacheInfo", "hits misses size maxsize many single last_path")


def cache_info():
    """(hits, misses, plans cached, bound, many, single, last_path): plan
    cache hits and misses; batches started through one plan of many
    (``many``) and through one plan per tensor (``single``); the last
    batch's path, "many" or "single" (None before any)."""
    return _CacheInfo(_S.hits, _S.misses, len(_S.plans), _S.cache_size, _S.many, _S.single, _S.last_path)


def _evict():
    while len(_S.plans) > _S.cache_size:
        _, p = _S.plans.popitem(last=False)
        p.close()


# ---------------------------------------------------------------- layouts


def _mesh_ranks(device_mesh):
    if not isinstance(device_mesh, DeviceMesh):
        raise PlacementError(f"device_mesh must be a torch DeviceMesh, got {type(device_mesh).__name__}")
    if not 1 <= device_mesh.ndim <= _capi.MAX_MESH_DIMS:
        raise PlacementError(f"DeviceMesh of {device_mesh.ndim} dims: xmesh takes 1 to {_capi.MAX_MESH_DIMS}")
    return tuple(int(r) for r in device_mesh.mesh.flatten().tolist()), tuple(int(s) for s in device_mesh.mesh.shape)


def _spec(placements, ndim, mesh_ndim, role, shard_order=None):
    """SBP (or GSPMD for a non-default shard order) string of placements."""
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise PlacementError(f"{role}: {len(placements)} placements for a {mesh_ndim}-dim DeviceMesh")
    toks, has_p = [], False
    for i, p in enumerate(placements):
        if _StridedShard is not None and isinstance(p, _StridedShard):
            raise PlacementError(
                f"{role}: placement {i} is {p!r}: _StridedShard (FSDP2 + TP's interleaved shards) is not "
                "supported by xmesh.torch; redistribute it to Shard/Replicate on its own mesh first"
            )
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise PlacementError(f"{role}: placement {i} {p!r} on a {ndim}-dim tensor")
            toks.append(f"S({d})")
        elif isinstance(p, Replicate):
            toks.append("B")
        elif isinstance(p, Partial):
            op = getattr(p, "reduce_op", "sum")
            op = getattr(op, "name", op)
            if str(op).lower() != "sum" or type(p) is not Partial:
                raise PlacementError(
                    f"{role}: placement {i} is {p!r}: only Partial('sum') has an SBP form (P); "
                    f"reduce op {op!r} is refused"
                )
            if "destination" in role:
                raise PlacementError(f"{role}: placement {i} is Partial: a destination holds Shard or Replicate only")
            toks.append("P")
            has_p = True
        else:
            raise PlacementError(f"{role}: placement {i} is {p!r}, which has no SBP form (Shard, Replicate, Partial('sum'))")
    default = True
    if shard_order:
        for e in shard_order:
            dims = tuple(e.mesh_dims)
            if list(dims) != sorted(dims):
                default = False
    if default:
        return ",".join(toks)
    if has_p:
        raise PlacementError(f"{role}: a non-default shard order {shard_order} together with Partial is not supported")
    axes = {}
    for e in shard_order:
        axes[int(e.tensor_dim)] = "".join(str(int(a)) for a in e.mesh_dims)
    return ",".join(("S" + axes[d]) if d in axes else "R" for d in range(ndim)) if ndim else ",".join(toks)


def _xmesh_mesh(ranks, shape):
    key = (ranks, shape)
    m = _S.meshes.get(key)
    if m is None or m.closed:
        try:
            cranks = [_S.ranks[r] for r in ranks]
        except KeyError as e:
            raise PlacementError(f"DeviceMesh rank {e.args[0]} is not in xmesh.torch's process group") from None
        m = _S.ctx.mesh(shape, cranks)
        _S.meshes[key] = m
    return m


class _Side:
    """One side of a move: mesh ranks/shape, spec, global shape, dtype."""

    __slots__ = ("ranks", "mshape", "spec", "shape", "dtype", "device_mesh", "placements")

    def __init__(self, device_mesh, placements, shape, dtype, role, shard_order=None):
        self.ranks, self.mshape = _mesh_ranks(device_mesh)
        self.device_mesh = device_mesh
        self.placements = tuple(placements)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        if dtype not in _DTYPES:
            raise PlacementError(f"{role}: dtype {dtype} is not supported ({', '.join(str(d) for d in _DTYPES)})")
        if len(self.shape) > _capi.MAX_TENSOR_DIMS:
            raise PlacementError(f"{role}: {len(self.shape)} dims, xmesh takes up to {_capi.MAX_TENSOR_DIMS}")
        self.spec = _spec(self.placements, len(self.shape), len(self.mshape), role, shard_order)

    def key(self):
        return (self.ranks, self.mshape, self.spec)

    def layout(self):
        m = _xmesh_mesh(self.ranks, self.mshape)
        return _xm.Layout(self.shape, _DTYPES[self.dtype], m, self.spec, split="torch")


def layout_of(dtensor):
    """The xmesh.Layout of a DTensor (split="torch"); initialises the context."""
    init()
    return _source_side(dtensor, "dtensor").layout()


def _source_side(dt, role):
    if not isinstance(dt, DTensor):
        raise PlacementError(f"{role}: expected a DTensor, got {type(dt).__name__}")
    spec = getattr(dt, "_spec", None)
    order = None
    if spec is not None and not getattr(spec, "use_strided_shard_as_shard_order", False):
        order = getattr(spec, "shard_order", None)
    return _Side(dt.device_mesh, dt.placements, dt.shape, dt.dtype, role, order)


# ---------------------------------------------------------------- checks before anything moves


def _hash(obj):
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=7).digest(), "little")


def _agree(key, problem):
    """Every rank of the group: the same key, and no rank refused. Raises the
    same way on every rank (the refusing rank with its own message)."""
    h = _hash(key)
    bad = 1 if problem is not None else 0
    t = torch.tensor([h, -h, bad], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_S.vgroup)
    if problem is not None:
        raise problem
    if t[2].item():
        raise PlacementError("another rank refused its input (see its error); nothing moved")
    if t[0].item() != h or -t[1].item() != h:
        raise PlacementError(
            "ranks disagree on the redistribution (source/destination mesh, placements, shape or dtype differ "
            "between ranks); nothing moved"
        )


def _local_block(dt, side, layout, role):
    """The source local tensor, checked (None when this rank holds no block)."""
    want = layout.local_shape(_S.ctx.rank)
    local = dt._local_tensor if hasattr(dt, "_local_tensor") else dt.to_local()
    if want is None:
        return None
    if local.device.type != "cpu":
        raise PlacementError(
            f"{role}: local tensor on {local.device}: this xmesh context moves CPU memory (MPI/UCX host); "
            "move the DTensor to CPU first"
        )
    if not local.is_contiguous():
        raise PlacementError(
            f"{role}: local tensor is not contiguous (shape {tuple(local.shape)}, strides {local.stride()}); "
            "pass a DTensor whose local tensor is dense row-major (.contiguous())"
        )
    if tuple(local.shape) != tuple(want):
        raise PlacementError(
            f"{role}: local tensor of shape {tuple(local.shape)}, but torch.chunk's block of rank "
            f"{dist.get_rank()} under {list(side.placements)} is {tuple(want)}"
        )
    return local


# ---------------------------------------------------------------- moving


class _Move:
    """One tensor's move, prepared and checked."""

    __slots__ = ("src", "dst", "src_local", "dst_local", "plan_key", "src_layout", "dst_layout", "stride", "requires_grad")

    def __init__(self, dt, device_mesh, placements, role):
        self.src = _source_side(dt, f"{role} source")
        self.dst = _Side(device_mesh, placements, self.src.shape, dt.dtype, f"{role} destination")
        self.stride = tuple(dt.stride())
        self.requires_grad = dt.requires_grad
        self.plan_key = (self.src.key(), self.dst.key(), self.src.shape, str(self.src.dtype))
        self.src_layout = self.src.layout()
        self.dst_layout = self.dst.layout()
        self.src_local = _local_block(dt, self.src, self.src_layout, f"{role} source")
        shp = self.dst_layout.local_shape(_S.ctx.rank)
        self.dst_local = None if shp is None else torch.empty(shp, dtype=dt.dtype)

    def result(self):
        local = self.dst_local if self.dst_local is not None else torch.empty(0, dtype=self.src.dtype)
        return DTensor.from_local(
            local, self.dst.device_mesh, self.dst.placements, run_check=False, shape=torch.Size(self.src.shape), stride=self.stride
        )


def _prepare(items, role):
    """[(dtensor, mesh, placements)] -> [_Move], agreed on every rank."""
    init()
    moves, problem = [], None
    try:
        for i, (dt, mesh, pl) in enumerate(items):
            moves.append(_Move(dt, mesh, pl, role if len(items) == 1 else f"{role} {i}"))
    except _xm.Error as e:
        problem = e
    key = tuple(m.plan_key for m in moves) if problem is None else None
    _agree(key, problem)
    return moves


def _plan(key, make):
    p = _S.plans.get(key)
    if p is not None and not p.closed:
        _S.plans.move_to_end(key)
        _S.hits += 1
        return p
    _S.misses += 1
    p = make()
    _S.plans[key] = p
    _evict()
    return p


def _start(moves, many=None):
    """Starts the moves; returns a list of requests. One plan of many when the
    package has ctx.plan_many (issue 35) and many is not False, else one plan
    per tensor, all started before any is waited."""
    ctx = _S.ctx
    use_many = (many if many is not None else True) and len(moves) > 1 and hasattr(ctx, "plan_many")
    if use_many and getattr(ctx, "_no_many", False):
        use_many = False
    if use_many:
        key = ("many",) + tuple(m.plan_key for m in moves)
        try:
            plan = _plan(key, lambda: ctx.plan_many([(m.src_layout, m.dst_layout) for m in moves]))
        except NotImplementedError:  # a transport that refuses plans of many: one plan per tensor
            # (plan creation is collective and its refusal agreed, so every rank lands here)
            ctx._no_many = True
            return _start(moves, False)
        srcs = [None if m.src_local is None else _np_view(m.src_local) for m in moves]
        dsts = [None if m.dst_local is None else _np_view(m.dst_local) for m in moves]
        req = plan.start(srcs, dsts)
        _S.many += 1
        _S.last_path = "many"
        return [req]
    reqs, seen = [], collections.Counter()
    for m in moves:
        # a plan moves one tensor at a time: the n-th tensor of one layout in
        # this batch gets the n-th plan of that layout
        n = seen[m.plan_key]
        seen[m.plan_key] += 1
        plan = _plan(m.plan_key + (n,), lambda m=m: ctx.plan(m.src_layout, m.dst_layout))
        s = None if m.src_local is None else _np_view(m.src_local)
        d = None if m.dst_local is None else _np_view(m.dst_local)
        reqs.append(plan.start(s, d))
    _S.single += 1
    _S.last_path = "single"
    return reqs


class RedistributeWork:
    """Moves in flight (``async_op=True``): ``wait()`` returns the DTensor
    (or the list / dict of them); ``is_completed()`` advances them."""

    def __init__(self, reqs, moves, finish):
        self._reqs, self._moves, self._finish = reqs, moves, finish
        self._out = None

    def is_completed(self):
        return all(r.test() for r in self._reqs)

    def wait(self):
        if self._out is None:
            for r in self._reqs:
                r.wait()
            self._out = self._finish([m.result() for m in self._moves])
            self._reqs = self._moves = None
        return self._out


def _run(items, role, async_op, finish, many=None):
    moves = _prepare(items, role)
    work = RedistributeWork(_start(moves, many), moves, finish)
    return work if async_op else work.wait()


def _grad_placements(placements):
    # the gradient of a sum over partial holders is the same on each: Replicate
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dt, device_mesh, placements):
        ctx.src_mesh = dt.device_mesh
        ctx.src_placements = _grad_placements(dt.placements)
        return _run([(dt, device_mesh, placements)], "redistribute", False, lambda r: r[0])

    @staticmethod
    def backward(ctx, grad):
        if not isinstance(grad, DTensor):  # pragma: no cover - torch hands DTensors back
            raise PlacementError("backward: the gradient is not a DTensor")
        if not grad._local_tensor.is_contiguous():
            grad = DTensor.from_local(
                grad._local_tensor.contiguous(), grad.device_mesh, grad.placements, run_check=False, shape=grad.shape, stride=grad.stride()
            )
        g = _run([(grad, ctx.src_mesh, ctx.src_placements)], "redistribute backward", False, lambda r: r[0])
        return g, None, None


def redistribute(dtensor, device_mesh, placements, *, async_op=False):
    """``dtensor`` on ``device_mesh`` with ``placements`` (Shard, Replicate):
    torch's DTensor, global shape and stride kept. Any source and destination
    mesh. Every rank of the group calls it. Differentiable (the backward moves
    the gradient back to the source mesh and placements, Partial as
    Replicate). ``async_op=True`` returns a RedistributeWork (no autograd)."""
    if async_op:
        return _run([(dtensor, device_mesh, placements)], "redistribute", True, lambda r: r[0])
    if torch.is_grad_enabled() and isinstance(dtensor, DTensor) and dtensor.requires_grad:
        return _Redistribute.apply(dtensor, device_mesh, tuple(placements))
    return _run([(dtensor, device_mesh, placements)], "redistribute", False, lambda r: r[0])


def redistribute_many(dtensors, device_mesh, placements, *, async_op=False, _many=None):
    """Several DTensors at once (one plan of many where the package has it,
    else one plan each, all started together): ``device_mesh`` one mesh or one
    per tensor, ``placements`` one sequence or one per tensor. Returns a list
    (no autograd)."""
    dtensors = list(dtensors)
    meshes = device_mesh if isinstance(device_mesh, (list, tuple)) else [device_mesh] * len(dtensors)
    per = placements and isinstance(placements[0], (list, tuple))
    pls = list(placements) if per else [placements] * len(dtensors)
    if len(meshes) != len(dtensors) or len(pls) != len(dtensors):
        raise PlacementError(f"{len(dtensors)} tensors but {len(meshes)} meshes and {len(pls)} placements")
    return _run(list(zip(dtensors, meshes, pls)), "redistribute_many", async_op, list, _many)


def redistribute_state_dict(state_dict, device_mesh, placements, *, async_op=False, _many=None):
    """A state dict of DTensors to ``device_mesh``: ``placements`` a mapping
    name -> placements, a callable (name, dtensor) -> placements, or one
    sequence for all. Entries that are not DTensors are kept as they are.
    Returns a new dict in the same order (RedistributeWork with async_op)."""
    names = [k for k, v in state_dict.items() if isinstance(v, DTensor)]
    if callable(placements):
        pls = [placements(k, state_dict[k]) for k in names]
    elif isinstance(placements, collections.abc.Mapping):
        missing = [k for k in names if k not in placements]
        if missing:
            raise PlacementError(f"no placements for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        pls = [placements[k] for k in names]
    else:
        pls = [placements] * len(names)
    items = [(state_dict[k], device_mesh, p) for k, p in zip(names, pls)]

    def finish(results):
        moved = dict(zip(names, results))
        return {k: moved.get(k, v) for k, v in state_dict.items()}

    return _run(items, "redistribute_state_dict", async_op, finish, _many)


def nonmember_backward(dtensor):
    """On a rank outside ``dtensor``'s mesh: takes part in the backward of
    the redistributions that made it (their gradient moves are collective
    over the ranks of both meshes) with an empty gradient. Members call
    their loss's backward as usual. (torch's own ``to_local()`` backward
    cannot run on a non-member, whose local tensor is 1-D and empty.)"""
    if dtensor.device_mesh.get_coordinate() is not None:
        raise _xm._InvalidUsage("nonmember_backward on a rank inside the DTensor's mesh: call backward on the loss")
    g = DTensor.from_local(
        torch.empty(0, dtype=dtensor.dtype), dtensor.device_mesh, dtensor.placements, run_check=False, shape=dtensor.shape, stride=dtensor.stride()
    )
    dtensor.backward(g)
