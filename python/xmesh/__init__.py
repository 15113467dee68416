"""xmesh: cross-mesh resharding of sharded tensors, for mpi4py / NumPy / DLPack users.

A thin layer over libxmesh (the C library; include/xmesh.h and
include/xmesh/mpi.h). Typical use, under ``mpirun -np 8``::

    from mpi4py import MPI
    import numpy as np
    import xmesh

    with xmesh.Context(MPI.COMM_WORLD) as ctx:
        a = ctx.mesh((2, 2), [0, 1, 2, 3])
        b = ctx.mesh((2, 2), [4, 5, 6, 7])
        src = xmesh.Layout((64, 32), np.float32, a, "S0S1")
        dst = xmesh.Layout((64, 32), np.float32, b, "RS01")
        with ctx.plan(src, dst) as plan:          # collective
            out = plan(my_src_block)              # this rank's dst block, or None

Blocks are this rank's local pieces, dense row-major (C-contiguous), of the
shape ``layout.local_shape()``; NumPy arrays, buffer-protocol objects and
CPU DLPack tensors are passed to the library without a copy. See
docs/PYTHON.md.
"""

import atexit
import builtins
import ctypes
import sys
import weakref

import numpy as np

from . import _capi
from . import _lib

__all__ = [
    "Context",
    "Mesh",
    "Layout",
    "Plan",
    "PlanMany",
    "Request",
    "PlanInfo",
    "Error",
    "dtypes",
    "strategies",
    "schedulers",
    "version",
    "__version__",
]

__version__ = _capi.VERSION
version = _lib.text(_lib.version_string())
if version != _capi.VERSION:  # pragma: no cover - a broken installation
    raise ImportError(f"xmesh: package built for libxmesh {_capi.VERSION} but loaded {version}")

# ---------------------------------------------------------------- errors


class Error(Exception):
    """An xmesh call failed.

    ``code`` is the xmesh_result_t value, ``code_name`` its C name
    (``XMESH_ERR_INVALID_ARGUMENT``), ``text`` xmesh_result_string(code) and
    ``message`` the detailed message (xmesh_last_error(), or the binding's own
    message for checks made before calling the library).
    """

    code = None
    code_name = None

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = message
        self.text = _lib.text(_lib.result_string(self.code)) if self.code is not None else ""
        super().__init__(f"{message} [{self.code_name}: {self.text}]" if message else self.text)


# Extra built-in bases so `except ValueError` and friends work too. Keyed by
# the C names the header defines (a name that disappears just loses its base).
_BUILTIN_BASES = {
    "XMESH_ERR_INVALID_ARGUMENT": (ValueError,),
    "XMESH_ERR_INVALID_USAGE": (RuntimeError,),
    "XMESH_ERR_UNSUPPORTED": (NotImplementedError,),
    "XMESH_ERR_NO_MEMORY": (MemoryError,),
    "XMESH_ERR_TIMEOUT": (TimeoutError,),
}

_ERRORS = {}  # code -> Error subclass


def _class_name(cname):
    # XMESH_ERR_INVALID_ARGUMENT -> InvalidArgumentError
    words = cname.split("_")[2:] if cname.startswith("XMESH_ERR_") else cname.split("_")[1:]
    return "".join(w.capitalize() for w in words) + "Error"


for _cname, _code, _text in _capi.RESULTS:
    if _code >= 0:
        continue
    _cls = type(
        _class_name(_cname),
        (Error,) + _BUILTIN_BASES.get(_cname, ()),
        {"code": _code, "code_name": _cname, "__doc__": f"{_cname} ({_code}): {_text}."},
    )
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls
    if not hasattr(builtins, _cls.__name__):  # `import *` must not shadow SystemError, TimeoutError
        __all__.append(_cls.__name__)
    _ERRORS[_code] = _cls
del _cname, _code, _text, _cls

# The two the binding raises itself (by C name, so they follow the header).
_InvalidArgument = next(c for c in _ERRORS.values() if c.code_name == "XMESH_ERR_INVALID_ARGUMENT")
_InvalidUsage = next(c for c in _ERRORS.values() if c.code_name == "XMESH_ERR_INVALID_USAGE")


def _raise(rc, context=None):
    msg = _lib.text(_lib.last_error()) or ""
    if context:
        msg = f"{context}: {msg}" if msg else context
    cls = _ERRORS.get(rc)
    if cls is None:
        raise Error(msg, code=rc)
    raise cls(msg)


def _check(rc, context=None):
    if rc < 0:
        _raise(rc, context)
    return rc


def _bad(msg):
    """Refused by the binding before calling the library (nothing moved)."""
    return _InvalidArgument(msg)


# ---------------------------------------------------------------- names from the library


def _enum_names(count, name_fn):
    return tuple(_lib.text(name_fn(i)) for i in range(count))


strategies = _enum_names(_capi.STRATEGY_COUNT, _lib.strategy_name)
schedulers = _enum_names(_capi.SCHEDULER_COUNT, _lib.scheduler_name)


def _parse(fn, name, what):
    out = _lib.enum_t()
    if not isinstance(name, str):
        raise _bad(f"{what} must be a string, got {name!r}")
    rc = fn(name.encode(), ctypes.byref(out))
    _check(rc)
    return out.value


# dtypes: the library names them ("f32", alias "float32"); NumPy supplies the
# element types. The pairing goes through xmesh_dtype_parse(numpy name) and
# is checked against xmesh_dtype_size.
try:  # bfloat16 as a NumPy dtype
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

_NP_OF_CODE = {}
_CODE_OF_NP = {}


def _register_dtypes():
    candidates = [np.dtype(n) for n in ("uint8", "int8", "int32", "int64", "float16", "float32", "float64")]
    if _ml_dtypes is not None:
        candidates.append(np.dtype(_ml_dtypes.bfloat16))
    for dt in candidates:
        code = _lib.enum_t()
        if _lib.dtype_parse(dt.name.encode(), ctypes.byref(code)) != _capi.SUCCESS:
            continue
        if _lib.dtype_size(code.value) != dt.itemsize:  # pragma: no cover
            raise ImportError(f"xmesh: dtype {dt.name}: library size {_lib.dtype_size(code.value)} != {dt.itemsize}")
        _NP_OF_CODE[code.value] = dt
        _CODE_OF_NP[dt] = code.value


_register_dtypes()
#: Library dtype names ("u8", "f32", ...) -> NumPy dtype, for the dtypes usable here.
dtypes = {_lib.text(_lib.dtype_name(c)): dt for c, dt in sorted(_NP_OF_CODE.items())}


def _resolve_dtype(dtype):
    """(xmesh code, numpy dtype) of a NumPy dtype, type or name ("float32", "f32", "bfloat16")."""
    if isinstance(dtype, str):
        code = _lib.enum_t()
        if _lib.dtype_parse(dtype.encode(), ctypes.byref(code)) == _capi.SUCCESS:
            if code.value in _NP_OF_CODE:
                return code.value, _NP_OF_CODE[code.value]
            raise _bad(f"dtype {dtype!r} needs the ml_dtypes package for a NumPy type (pip install ml_dtypes)")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise _bad(f"dtype {dtype!r} is not a NumPy dtype") from None
    if dt.newbyteorder("=") != dt and dt.byteorder not in ("=", "|"):
        raise _bad(f"dtype {dt} is not in native byte order")
    code = _CODE_OF_NP.get(dt)
    if code is None:
        raise _bad(f"dtype {dt} is not supported (supported: {', '.join(d.name for d in _CODE_OF_NP)})")
    return code, dt


# ---------------------------------------------------------------- MPI


_libmpi = None


def _mpi_lib():
    """The libmpi libxmesh links (same file, so the same loaded copy)."""
    global _libmpi
    if _libmpi is None and _capi.MPI_LIBRARY:
        try:
            _libmpi = ctypes.CDLL(_capi.MPI_LIBRARY)
            for fn in (_libmpi.MPI_Initialized, _libmpi.MPI_Finalized):
                fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
                fn.restype = ctypes.c_int
        except OSError:  # pragma: no cover
            _libmpi = False
    return _libmpi or None


def _mpi_flag(name):
    lib = _mpi_lib()
    if lib is None:  # pragma: no cover - unknown library: assume the usual
        return name == "MPI_Initialized"
    flag = ctypes.c_int(0)
    getattr(lib, name)(ctypes.byref(flag))
    return bool(flag.value)


def _mpi_finalized():
    return _mpi_flag("MPI_Finalized")


def _comm_handle(comm):
    from mpi4py import MPI  # imported here: `python -m xmesh.info` needs no MPI

    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise _bad(f"comm must be an mpi4py communicator (mpi4py.MPI.Comm), got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise _bad("comm is MPI.COMM_NULL")
    if not _mpi_flag("MPI_Initialized"):
        raise _InvalidUsage(
            f"MPI is not initialised in the MPI library xmesh uses ({_capi.MPI_LIBRARY}) although mpi4py "
            f"initialised its own ({MPI.Get_library_version().splitlines()[0]}): mpi4py was built against "
            "another MPI; reinstall it with `pip install --no-binary mpi4py --force-reinstall mpi4py`"
        )
    # MPI._handleof gives the C handle's value: the MPI_Comm pointer in Open
    # MPI (an int in MPICH), which xmesh_ctx_create_mpi takes by value.
    return MPI._handleof(comm)


# ---------------------------------------------------------------- handles

_LIVE_CONTEXTS = weakref.WeakSet()
_INFLIGHT = set()  # requests in flight: kept alive (and their buffers) until they complete


class _Handle:
    """A C handle with close(), a context manager and a finaliser."""

    _h = None
    _destroy = None

    @property
    def closed(self):
        return self._h is None

    def _need(self):
        if self._h is None:
            raise _InvalidUsage(f"{type(self).__name__} is closed")
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _release(self):
        h, self._h = self._h, None
        if h is not None:
            rc = type(self)._destroy(h)
            if rc < 0:
                self._h = h
                _raise(rc, f"closing {type(self).__name__}")

    def _close_children(self, *groups):
        """Closes every handle of each group, then this handle; raises the
        first error after all ran."""
        first = None
        for group in groups:
            for h in list(group):
                try:
                    h.close()
                except Error as e:
                    first = first or e
        self._release()
        if first is not None:
            raise first

    def __del__(self):
        # Unclosed handle collected: destroy it unless MPI is gone (after
        # MPI_Finalize the handle is leaked; the process is ending anyway).
        try:
            if self._h is not None and not _mpi_finalized():
                self.close()
        except Exception:
            pass


class Context(_Handle):
    """An xmesh context over an mpi4py communicator (collective over comm).

    ``Context(comm)`` duplicates ``comm`` (the caller keeps its own). Any MPI
    thread level works: with MPI_THREAD_MULTIPLE (mpi4py's default) a progress
    thread moves transfers while Python computes; below it transfers move
    inside ``plan()``, ``Request.test()`` and ``Request.wait()``.
    ``close()`` closes the plans and meshes still open, then the context; it
    must happen before MPI_Finalize (an atexit hook closes what is left).
    """

    _destroy = staticmethod(_lib.ctx_destroy)

    def __init__(self, comm=None):
        handle = _comm_handle(comm)
        out = _lib.handle_t()
        _check(_lib.ctx_create_mpi(handle, None, ctypes.byref(out)), "xmesh_ctx_create_mpi")
        self._adopt(out.value)

    @classmethod
    def from_env(cls):
        """A context over UCX, without MPI (collective over the processes
        the environment describes: XMESH_RANK/XMESH_SIZE, torchrun's RANK/
        WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or Slurm's variables; docs/UCX.md).
        Plans, ``plan_many`` included, work as over MPI; transfers progress
        in a thread (XMESH_PROGRESS_THREAD=0: inside the calls).
        ``close()`` (or exit) ends it.
        """
        if _lib.ctx_create_ucx is None:
            unsupported = next(c for c in _ERRORS.values() if c.code_name == "XMESH_ERR_UNSUPPORTED")
            raise unsupported("xmesh.Context.from_env: this libxmesh was built without UCX")
        out = _lib.handle_t()
        _check(_lib.ctx_create_ucx(None, None, ctypes.byref(out)), "xmesh_ctx_create_ucx")
        self = cls.__new__(cls)
        self._adopt(out.value)
        return self

    @property
    def transport(self):
        """The context's transport: "mpi" or "ucx"."""
        if _lib.ctx_transport is None:
            return "mpi"
        return _lib.ctx_transport(self._need()).decode()

    def _adopt(self, h):
        self._h = h
        self._meshes = weakref.WeakSet()
        self._plans = weakref.WeakSet()
        r = ctypes.c_int()
        _check(_lib.ctx_rank(self._h, ctypes.byref(r)))
        self.rank = r.value
        _check(_lib.ctx_size(self._h, ctypes.byref(r)))
        self.size = r.value
        _LIVE_CONTEXTS.add(self)
        _register_atexit()

    def host(self, rank=None):
        """Host id of a rank (this rank by default)."""
        r = ctypes.c_int()
        _check(_lib.ctx_host(self._need(), self.rank if rank is None else int(rank), ctypes.byref(r)))
        return r.value

    def mesh(self, shape, ranks=None):
        """A mesh of ``shape`` (1..4 axes) over ``ranks`` (row-major; default 0..n-1)."""
        return Mesh(self, shape, ranks)

    def plan(self, src, dst, **params):
        """A resharding plan from Layout ``src`` to Layout ``dst`` (collective).

        Keyword parameters override the XMESH_* environment: strategy
        (one of ``xmesh.strategies``), scheduler (``xmesh.schedulers``),
        chunk_bytes, budget_us, seed, timeout_s.
        """
        return Plan(self, src, dst, **params)

    def plan_many(self, pairs, **params):
        """One plan of many tensors (collective): ``pairs`` is a list of
        ``(src, dst)`` Layout pairs, or a dict of them. Every tensor has its
        own shape, dtypes, shardings and meshes; their unit tasks are
        scheduled together and small ones share chunks (docs/MANY.md).
        Calling the plan takes and returns lists (or dicts with the same
        keys) of blocks; parameters as for ``plan``.
        """
        return PlanMany(self, pairs, **params)

    def close(self):
        """Closes open plans (after their requests complete), meshes, then the context."""
        if self._h is None:
            return
        self._close_children(list(self._plans), list(self._meshes))

    def __repr__(self):
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        return f"<xmesh.Context {state}>"


def _int_tuple(v, what):
    if isinstance(v, (int, np.integer)):
        v = (v,)
    try:
        out = tuple(int(x) for x in np.asarray(v).reshape(-1).tolist())
    except (TypeError, ValueError):
        raise _bad(f"{what} must be a sequence of integers, got {v!r}") from None
    if any(not float(x).is_integer() for x in np.asarray(v).reshape(-1).tolist()):
        raise _bad(f"{what} must hold integers, got {v!r}")
    return out


class Mesh(_Handle):
    """A device mesh: ``shape`` axes over ctx ranks (row-major)."""

    _destroy = staticmethod(_lib.mesh_destroy)

    def __init__(self, ctx, shape, ranks=None):
        ctx._need()
        self.ctx = ctx
        self.shape = _int_tuple(shape, "mesh shape")
        n = int(np.prod(self.shape)) if self.shape else 0
        self.ranks = tuple(range(n)) if ranks is None else _int_tuple(ranks, "mesh ranks")
        cshape = (ctypes.c_int * max(1, len(self.shape)))(*self.shape)
        cranks = (ctypes.c_int * max(1, len(self.ranks)))(*self.ranks)
        if len(self.ranks) != n:
            raise _bad(f"mesh of shape {self.shape} needs {n} ranks, got {len(self.ranks)}: {self.ranks}")
        out = _lib.handle_t()
        _check(_lib.mesh_create(ctx._h, len(self.shape), cshape, cranks, ctypes.byref(out)), "xmesh_mesh_create")
        self._h = out.value
        ctx._meshes.add(self)

    def close(self):
        """Destroys the mesh (InvalidUsageError while an open plan uses it)."""
        self._release()

    def __contains__(self, rank):
        return rank in self.ranks

    def __repr__(self):
        return f"<xmesh.Mesh {'x'.join(map(str, self.shape))} ranks {list(self.ranks)}{' closed' if self.closed else ''}>"


class Layout:
    """How a global tensor is laid out over a mesh.

    ``Layout(shape, dtype, mesh, spec, split="numpy")``: ``shape`` the global
    shape (0..8 dims), ``dtype`` a NumPy dtype (float16, bfloat16 with
    ml_dtypes, float32, float64, int8, uint8, int32, int64) or its name,
    ``spec`` a GSPMD (``"S0RR"``, ``"RS01R"``, ``"S1,R,R"``) or SBP
    (``"S(0),B,P"``) string. ``split`` says how an uneven dim is cut:
    ``"numpy"`` (numpy.array_split: the first n % k shards one longer) or
    ``"torch"`` (torch.chunk as DTensor's Shard does: shards of ceil(n / k),
    trailing ones short or empty; several mesh axes on one dim chunk it one
    after the other, major first). The library checks it at once (a bad spec
    raises InvalidArgumentError).
    """

    _SPLITS = {"numpy": _capi.SPLIT_NUMPY, "torch": _capi.SPLIT_TORCH}

    def __init__(self, shape, dtype, mesh, spec, split="numpy"):
        if not isinstance(mesh, Mesh):
            raise _bad(f"mesh must be an xmesh.Mesh, got {type(mesh).__name__}")
        if not isinstance(spec, str):
            raise _bad(f"spec must be a string such as 'S0R' or 'S(0),B', got {spec!r}")
        if split not in self._SPLITS:
            raise _bad(f"split must be 'numpy' or 'torch', got {split!r}")
        self.split = split
        self.shape = _int_tuple(shape, "tensor shape")
        self.code, self.dtype = _resolve_dtype(dtype)
        self.mesh = mesh
        self.spec = spec
        self._cshape = (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)
        self._cspec = spec.encode()
        mesh._need()
        self._struct()  # validates the layout through the library
        self.local_shape(mesh.ranks[0])

    @property
    def ndim(self):
        return len(self.shape)

    def _struct(self):
        return _lib.Layout(
            len(self.shape), self._cshape, self.code, self.mesh._need(), self._cspec, self._SPLITS[self.split]
        )

    def _query(self, fn, rank):
        if rank is None:
            rank = self.mesh.ctx.rank
        out = (ctypes.c_int64 * max(1, len(self.shape)))()
        holds = ctypes.c_int(0)
        st = self._struct()
        _check(fn(ctypes.byref(st), int(rank), out, ctypes.byref(holds)), f"layout {self.spec!r}")
        return tuple(out[i] for i in range(len(self.shape))) if holds.value else None

    def local_shape(self, rank=None):
        """Shape of the block ``rank`` (default: this rank) holds; None if it holds none."""
        return self._query(_lib.layout_local_shape, rank)

    def local_offset(self, rank=None):
        """Global offset of the block of ``rank``; None if it holds none."""
        return self._query(_lib.layout_local_offset, rank)

    def local_slice(self, rank=None):
        """The block of ``rank`` as a tuple of slices into the global array (None if none)."""
        shp = self.local_shape(rank)
        if shp is None:
            return None
        off = self.local_offset(rank)
        return tuple(slice(o, o + s) for o, s in zip(off, shp))

    def empty(self, rank=None):
        """A new uninitialised local block for ``rank`` (None if it holds none)."""
        shp = self.local_shape(rank)
        return None if shp is None else np.empty(shp, self.dtype)

    def __repr__(self):
        split = "" if self.split == "numpy" else f" split={self.split}"
        return f"<xmesh.Layout {self.shape} {self.dtype.name} {self.spec!r}{split} on {self.mesh!r}>"


class PlanInfo:
    """Summary of a plan (the same on every rank): see xmesh_plan_info_t."""

    __slots__ = (
        "unit_tasks",
        "bytes_total",
        "bytes_cross_host",
        "lower_bound_s",
        "predicted_s",
        "strategy",
        "scheduler",
        "chunk_bytes",
        "tensors",
        "scheduled_tasks",
    )

    def __init__(self, c):
        for name in self.__slots__:
            setattr(self, name, getattr(c, name))
        self.strategy = _lib.text(_lib.strategy_name(c.strategy))
        self.scheduler = _lib.text(_lib.scheduler_name(c.scheduler))

    def __repr__(self):
        return "PlanInfo(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"


_DLPACK_CPU = 1  # DLDeviceType kDLCPU (DLPack's own constant, not xmesh's)


def _as_array(obj, role):
    """A NumPy view of obj without a copy, or an error naming what obj is."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__dlpack_device__"):
            dev = obj.__dlpack_device__()
            if int(dev[0]) != _DLPACK_CPU:
                raise _bad(f"{role}: a DLPack tensor on device {tuple(dev)}; only CPU memory (device type 1) works here")
        try:
            return np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError) as e:
            raise _bad(f"{role}: cannot view the DLPack tensor {type(obj).__name__} without a copy: {e}") from None
    try:
        mv = memoryview(obj)
    except TypeError:
        raise _bad(
            f"{role}: {type(obj).__name__} is neither a NumPy array, a DLPack tensor nor a buffer-protocol object"
        ) from None
    try:
        return np.asarray(mv)
    except (TypeError, ValueError) as e:
        raise _bad(f"{role}: buffer of format {mv.format!r} has no NumPy dtype: {e}") from None


class _Block:
    """One local block checked against its layout: the caller's object, the
    NumPy view of it and its address."""

    __slots__ = ("obj", "arr", "ptr")

    def __init__(self, obj, arr):
        self.obj, self.arr = obj, arr
        self.ptr = arr.__array_interface__["data"][0] if arr is not None else None


class Plan(_Handle):
    """A resharding plan (``ctx.plan(src, dst)``); call it to move data.

    ``plan(src_local=None, dst_local=None)`` runs the resharding (collective
    over the ranks of both meshes) and returns this rank's destination block:
    ``dst_local`` itself when given, else a new NumPy array; None on ranks
    outside the destination mesh. ``plan.start(...)`` does the same without
    blocking and returns a Request. Plans are reusable.
    """

    _destroy = staticmethod(_lib.plan_destroy)

    def __init__(self, ctx, src, dst, **params):
        ctx._need()
        for name, l in (("src", src), ("dst", dst)):
            if not isinstance(l, Layout):
                raise _bad(f"{name} must be an xmesh.Layout, got {type(l).__name__}")
            if l.mesh.ctx is not ctx:
                raise _bad(f"{name}'s mesh belongs to another Context")
        self.ctx, self.src, self.dst = ctx, src, dst
        p = _lib.plan_params_initializer()
        for key, value in params.items():
            if value is None:
                continue
            if key == "strategy":
                p.strategy = _parse(_lib.strategy_parse, value, "strategy")
            elif key == "scheduler":
                p.scheduler = _parse(_lib.scheduler_parse, value, "scheduler")
            elif key in ("chunk_bytes", "budget_us", "seed"):
                setattr(p, key, int(value))
            elif key == "timeout_s":
                p.timeout_s = float(value)
            else:
                raise _bad(
                    f"unknown plan parameter {key!r} (strategy, scheduler, chunk_bytes, budget_us, seed, timeout_s)"
                )
        s, d = src._struct(), dst._struct()
        out = _lib.handle_t()
        _check(_lib.plan_create(ctx._h, ctypes.byref(s), ctypes.byref(d), ctypes.byref(p), ctypes.byref(out)), "xmesh_plan_create")
        self._h = out.value
        self._requests = weakref.WeakSet()
        self.src_shape = src.local_shape(ctx.rank)
        self.dst_shape = dst.local_shape(ctx.rank)
        ctx._plans.add(self)

    @property
    def info(self):
        """PlanInfo: unit tasks, bytes, lower bound, prediction, strategy, scheduler, chunk."""
        c = _lib.PlanInfo()
        _check(_lib.plan_get_info(self._need(), ctypes.byref(c)))
        return PlanInfo(c)

    def _block(self, obj, layout, shape, role, writable):
        rank = self.ctx.rank
        if shape is None:
            if obj is not None:
                raise _bad(f"{role}: rank {rank} holds no block of {layout.spec!r} on {layout.mesh!r}; pass None")
            return _Block(None, None)
        if obj is None:
            if writable:
                arr = np.empty(shape, layout.dtype)
                return _Block(None, arr)
            raise _bad(f"{role} is required on rank {rank}: it holds a block of shape {shape} ({layout.dtype.name})")
        arr = _as_array(obj, role)
        if arr.dtype != layout.dtype:
            raise _bad(f"{role}: dtype {arr.dtype.name}, but the layout's dtype is {layout.dtype.name}")
        if tuple(arr.shape) != tuple(shape):
            raise _bad(f"{role}: shape {tuple(arr.shape)}, but rank {rank}'s block of {layout.spec!r} has shape {tuple(shape)}")
        if not arr.flags.c_contiguous:
            raise _bad(f"{role}: not C-contiguous (strides {arr.strides}); pass a dense row-major block (numpy.ascontiguousarray)")
        if writable and not arr.flags.writeable:
            raise _bad(f"{role}: read-only memory; the destination block must be writable")
        if not arr.flags.aligned:
            raise _bad(f"{role}: not aligned to its dtype ({layout.dtype.name})")
        return _Block(obj, arr)

    def _blocks(self, src_local, dst_local):
        s = self._block(src_local, self.src, self.src_shape, "src_local", False)
        d = self._block(dst_local, self.dst, self.dst_shape, "dst_local", True)
        if s.arr is not None and d.arr is not None and s.arr.size and d.arr.size and np.may_share_memory(s.arr, d.arr):
            raise _bad("dst_local overlaps src_local in memory; pass separate blocks")
        return s, d

    def __call__(self, src_local=None, dst_local=None):
        h = self._need()
        s, d = self._blocks(src_local, dst_local)
        _check(_lib.reshard(h, s.ptr, d.ptr), "xmesh_reshard")
        return _result(d)

    def start(self, src_local=None, dst_local=None):
        """Starts the resharding and returns a Request (the blocks are kept
        alive, and must not be touched, until it completes)."""
        h = self._need()
        s, d = self._blocks(src_local, dst_local)
        out = _lib.handle_t()
        _check(_lib.reshard_start(h, s.ptr, d.ptr, ctypes.byref(out)), "xmesh_reshard_start")
        req = Request(self, out.value, s, d)
        self._requests.add(req)
        return req

    def close(self):
        """Waits for requests still in flight, then destroys the plan."""
        if self._h is None:
            return
        self._close_children(self._requests)

    def __repr__(self):
        return f"<xmesh.Plan {self.src.spec!r} -> {self.dst.spec!r}{' closed' if self.closed else ''}>"


def _plan_params(params):
    p = _lib.plan_params_initializer()
    for key, value in params.items():
        if value is None:
            continue
        if key == "strategy":
            p.strategy = _parse(_lib.strategy_parse, value, "strategy")
        elif key == "scheduler":
            p.scheduler = _parse(_lib.scheduler_parse, value, "scheduler")
        elif key in ("chunk_bytes", "budget_us", "seed"):
            setattr(p, key, int(value))
        elif key == "timeout_s":
            p.timeout_s = float(value)
        else:
            raise _bad(f"unknown plan parameter {key!r} (strategy, scheduler, chunk_bytes, budget_us, seed, timeout_s)")
    return p


class PlanMany(Plan):
    """A plan of many tensors (``ctx.plan_many(pairs)``); call it to move them.

    ``plan(srcs=None, dsts=None)`` takes a list (or, when the plan was made
    from a dict, a dict with the same keys) of this rank's source blocks,
    None where it holds none (``srcs=None``: none at all), and optionally
    destination blocks alike; it returns the destination blocks in the same
    form (new arrays where none were given, None where the rank holds
    none). ``plan.start(...)`` returns a Request whose ``wait()`` returns
    them. Blocks are checked before anything moves, errors naming the
    tensor (its index or key).
    """

    def __init__(self, ctx, pairs, **params):
        ctx._need()
        if isinstance(pairs, dict):
            self.keys = list(pairs.keys())
            items = [pairs[k] for k in self.keys]
        else:
            self.keys = None
            try:
                items = list(pairs)
            except TypeError:
                raise _bad(f"pairs must be a list or dict of (src, dst) Layout pairs, got {type(pairs).__name__}") from None
        if not items:
            raise _bad("pairs is empty: a plan of many needs at least one (src, dst) pair")
        srcs, dsts = [], []
        for i, pair in enumerate(items):
            name = self._name(i)
            try:
                src, dst = pair
            except (TypeError, ValueError):
                raise _bad(f"tensor {name}: expected a (src, dst) pair of Layouts, got {pair!r}") from None
            for role, l in (("src", src), ("dst", dst)):
                if not isinstance(l, Layout):
                    raise _bad(f"tensor {name}: {role} must be an xmesh.Layout, got {type(l).__name__}")
                if l.mesh.ctx is not ctx:
                    raise _bad(f"tensor {name}: {role}'s mesh belongs to another Context")
            srcs.append(src)
            dsts.append(dst)
        self.ctx, self.srcs, self.dsts = ctx, srcs, dsts
        # Plan's single-tensor attributes: the first tensor's
        self.src, self.dst = srcs[0], dsts[0]
        p = _plan_params(params)
        n = len(srcs)
        cs = (_lib.Layout * n)(*[l._struct() for l in srcs])
        cd = (_lib.Layout * n)(*[l._struct() for l in dsts])
        out = _lib.handle_t()
        _check(_lib.plan_create_many(ctx._h, n, cs, cd, ctypes.byref(p), ctypes.byref(out)), "xmesh_plan_create_many")
        self._h = out.value
        self._requests = weakref.WeakSet()
        self.src_shapes = [l.local_shape(ctx.rank) for l in srcs]
        self.dst_shapes = [l.local_shape(ctx.rank) for l in dsts]
        self.src_shape, self.dst_shape = self.src_shapes[0], self.dst_shapes[0]
        ctx._plans.add(self)

    def __len__(self):
        return len(self.srcs)

    def _name(self, i):
        return repr(self.keys[i]) if self.keys is not None else str(i)

    def _items(self, blocks, role):
        n = len(self.srcs)
        if blocks is None:
            return [None] * n
        if self.keys is not None:
            if not isinstance(blocks, dict):
                raise _bad(f"{role}: the plan was made from a dict: pass a dict with its keys, got {type(blocks).__name__}")
            extra = [k for k in blocks if k not in self.keys]
            if extra:
                raise _bad(f"{role}: key {extra[0]!r} is not a tensor of the plan")
            return [blocks.get(k) for k in self.keys]
        if isinstance(blocks, dict):
            raise _bad(f"{role}: the plan was made from a list: pass a list of {n} blocks, got a dict")
        blocks = list(blocks)
        if len(blocks) != n:
            raise _bad(f"{role}: {len(blocks)} blocks for a plan of {n} tensors")
        return blocks

    def _blocks_many(self, srcs, dsts):
        ss, ds = self._items(srcs, "srcs"), self._items(dsts, "dsts")
        S, D = [], []
        for i in range(len(self.srcs)):
            name = self._name(i)
            try:
                s = self._block(ss[i], self.srcs[i], self.src_shapes[i], f"srcs[{name}]", False)
                d = self._block(ds[i], self.dsts[i], self.dst_shapes[i], f"dsts[{name}]", True)
            except Error as e:
                raise type(e)(f"tensor {name}: {e}") from None
            S.append(s)
            D.append(d)
        # a destination must not share memory with any other block
        live = [(f"srcs[{self._name(i)}]", b.arr) for i, b in enumerate(S) if b.arr is not None and b.arr.size]
        live += [(f"dsts[{self._name(i)}]", b.arr) for i, b in enumerate(D) if b.arr is not None and b.arr.size]
        for i, (na, a) in enumerate(live):
            for nb, b in live[i + 1 :]:
                if (na.startswith("dsts") or nb.startswith("dsts")) and np.may_share_memory(a, b):
                    raise _bad(f"{nb} overlaps {na} in memory; pass separate blocks")
        n = len(S)
        cs = (ctypes.c_void_p * n)(*[b.ptr for b in S])
        cd = (ctypes.c_void_p * n)(*[b.ptr for b in D])
        return S, D, cs, cd

    def _collect(self, D):
        out = [_result(d) for d in D]
        return dict(zip(self.keys, out)) if self.keys is not None else out

    def __call__(self, srcs=None, dsts=None):
        h = self._need()
        S, D, cs, cd = self._blocks_many(srcs, dsts)
        _check(_lib.reshard_many(h, cs, cd), "xmesh_reshard_many")
        return self._collect(D)

    def start(self, srcs=None, dsts=None):
        """Starts moving every tensor and returns a Request; ``wait()``
        returns the destination blocks (list or dict)."""
        h = self._need()
        S, D, cs, cd = self._blocks_many(srcs, dsts)
        out = _lib.handle_t()
        _check(_lib.reshard_many_start(h, cs, cd, ctypes.byref(out)), "xmesh_reshard_many_start")
        req = _ManyRequest(self, out.value, S, D)
        self._requests.add(req)
        return req

    def __repr__(self):
        return f"<xmesh.PlanMany of {len(self.srcs)} tensors{' closed' if self.closed else ''}>"


def _result(d):
    if d.arr is None:
        return None
    return d.obj if d.obj is not None else d.arr


class Request:
    """A resharding in flight (``plan.start``). ``test()`` advances it and
    says whether it is complete; ``wait()`` completes it and returns the
    destination block. The source and destination objects stay referenced
    until then. A transfer error is raised by the call that sees it."""

    def __init__(self, plan, handle, src, dst):
        self.plan = plan
        self._h = handle
        self._src, self._dst = src, dst
        self._error = None
        _INFLIGHT.add(self)

    @property
    def done(self):
        return self._h is None

    def _finish(self, rc):
        self._h = None
        _INFLIGHT.discard(self)
        self._src = None
        if rc < 0:
            self._dst = None
            try:
                _raise(rc, "xmesh request")
            except Error as e:
                self._error = e
                raise

    def test(self):
        """Advances the transfer once; True when complete (then wait() returns at once)."""
        if self._h is None:
            if self._error is not None:
                raise self._error
            return True
        rc = _lib.test(self._h)
        if rc == _capi.IN_PROGRESS:
            return False
        self._finish(rc)
        return True

    def wait(self):
        """Completes the transfer (blocking) and returns this rank's destination block."""
        if self._h is not None:
            self._finish(_lib.wait(self._h))
        elif self._error is not None:
            raise self._error
        return _result(self._dst) if self._dst is not None else None

    def close(self):
        """Waits for completion if still in flight (a request cannot be cancelled)."""
        if self._h is not None:
            self.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<xmesh.Request {'done' if self.done else 'in flight'}>"


class _ManyRequest(Request):
    """A plan of many in flight: ``wait()`` returns the list (or dict) of
    destination blocks."""

    def wait(self):
        if self._h is not None:
            self._finish(_lib.wait(self._h))
        elif self._error is not None:
            raise self._error
        return self.plan._collect(self._dst) if self._dst is not None else None


_atexit_registered = False


def _register_atexit():
    # mpi4py finalises MPI in a Py_AtExit hook, which runs after every
    # atexit handler; registered with the first Context (after mpi4py.MPI
    # was imported) it would run first even if mpi4py used atexit itself.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_close_all)
        _atexit_registered = True


def _close_all():
    """Closes what the program left open, before MPI is finalised."""
    if not _LIVE_CONTEXTS or _mpi_finalized():
        return
    for ctx in list(_LIVE_CONTEXTS):
        try:
            ctx.close()
        except Exception as e:  # pragma: no cover
            print(f"xmesh: at exit: {e}", file=sys.stderr)
