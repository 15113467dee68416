"""ctypes view of libxmesh: the library, its prototypes and the structs of
include/xmesh.h.

Constants come from ``_capi`` (generated at build time by python/gen_capi.c
from the header) or from the library's own name/parse functions; nothing
here copies a value from the header. The ctypes structs below mirror field
names and types, and import fails if their sizes or offsets disagree with
what the C compiler computed for ``_capi``.
"""

import ctypes
import os

from . import _capi

_HERE = os.path.dirname(os.path.abspath(_capi.__file__))
LIBRARY_PATH = os.environ.get("XMESH_PY_LIBRARY") or os.path.join(_HERE, "libxmesh.so")

try:
    lib = ctypes.CDLL(LIBRARY_PATH)
except OSError as e:  # pragma: no cover - an installation problem
    raise ImportError(f"xmesh: cannot load {LIBRARY_PATH}: {e}") from None

c_int_p = ctypes.POINTER(ctypes.c_int)
c_i64_p = ctypes.POINTER(ctypes.c_int64)
result_t = {4: ctypes.c_int, 8: ctypes.c_int64}[_capi.ENUM_SIZE]
enum_t = result_t
handle_t = ctypes.c_void_p
# MPI_Comm by value: a pointer in Open MPI, an int in MPICH.
mpi_comm_t = ctypes.c_void_p if _capi.MPI_COMM_SIZE == ctypes.sizeof(ctypes.c_void_p) else ctypes.c_int


class Layout(ctypes.Structure):
    _fields_ = [
        ("ndim", ctypes.c_int),
        ("shape", c_i64_p),
        ("dtype", enum_t),
        ("mesh", handle_t),
        ("sharding", ctypes.c_char_p),
        ("split", ctypes.c_int),
    ]


class PlanParams(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("strategy", enum_t),
        ("scheduler", enum_t),
        ("chunk_bytes", ctypes.c_int64),
        ("budget_us", ctypes.c_int64),
        ("seed", ctypes.c_int64),
        ("timeout_s", ctypes.c_double),
    ]


class PlanInfo(ctypes.Structure):
    _fields_ = [
        ("unit_tasks", ctypes.c_int),
        ("bytes_total", ctypes.c_int64),
        ("bytes_cross_host", ctypes.c_int64),
        ("lower_bound_s", ctypes.c_double),
        ("predicted_s", ctypes.c_double),
        ("strategy", enum_t),
        ("scheduler", enum_t),
        ("chunk_bytes", ctypes.c_int64),
        ("tensors", ctypes.c_int),
        ("scheduled_tasks", ctypes.c_int),
    ]


def _check_struct(cls, cname):
    want = _capi.OFFSETOF[cname]
    got = {name: getattr(cls, name).offset for name, _ in cls._fields_}
    if got != want or ctypes.sizeof(cls) != _capi.SIZEOF[cname]:
        raise ImportError(
            f"xmesh: the ctypes mirror of {cname} (size {ctypes.sizeof(cls)}, offsets {got}) "
            f"disagrees with include/xmesh.h (size {_capi.SIZEOF[cname]}, offsets {want})"
        )


_check_struct(Layout, "xmesh_layout_t")
_check_struct(PlanParams, "xmesh_plan_params_t")
_check_struct(PlanInfo, "xmesh_plan_info_t")


def plan_params_initializer():
    """XMESH_PLAN_PARAMS_INITIALIZER: every field unset (environment/defaults apply)."""
    return PlanParams(
        ctypes.sizeof(PlanParams),
        _capi.PARAMS_MAGIC,
        _capi.VERSION_CODE,
        _capi.STRATEGY_UNSET,
        _capi.SCHEDULER_UNSET,
        _capi.UNSET_I64,
        _capi.UNSET_I64,
        _capi.UNSET_I64,
        _capi.UNSET_DOUBLE,
    )


def _proto(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


result_string = _proto("xmesh_result_string", ctypes.c_char_p, result_t)
last_error = _proto("xmesh_last_error", ctypes.c_char_p)
version_string = _proto("xmesh_version_string", ctypes.c_char_p)
dtype_size = _proto("xmesh_dtype_size", ctypes.c_size_t, enum_t)
dtype_name = _proto("xmesh_dtype_name", ctypes.c_char_p, enum_t)
dtype_parse = _proto("xmesh_dtype_parse", result_t, ctypes.c_char_p, ctypes.POINTER(enum_t))
strategy_name = _proto("xmesh_strategy_name", ctypes.c_char_p, enum_t)
strategy_parse = _proto("xmesh_strategy_parse", result_t, ctypes.c_char_p, ctypes.POINTER(enum_t))
scheduler_name = _proto("xmesh_scheduler_name", ctypes.c_char_p, enum_t)
scheduler_parse = _proto("xmesh_scheduler_parse", result_t, ctypes.c_char_p, ctypes.POINTER(enum_t))

ctx_create_mpi = _proto("xmesh_ctx_create_mpi", result_t, mpi_comm_t, ctypes.c_void_p, ctypes.POINTER(handle_t))

def _optional(name, restype, *argtypes):
    """A prototype the library may lack (a build without that transport): None then."""
    return _proto(name, restype, *argtypes) if hasattr(lib, name) else None


# const xmesh_oob_t * (NULL: the environment's bootstrap) and the params.
ctx_create_ucx = _optional("xmesh_ctx_create_ucx", result_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(handle_t))
ctx_transport = _optional("xmesh_ctx_transport", ctypes.c_char_p, handle_t)
ctx_rank = _proto("xmesh_ctx_rank", result_t, handle_t, c_int_p)
ctx_size = _proto("xmesh_ctx_size", result_t, handle_t, c_int_p)
ctx_host = _proto("xmesh_ctx_host", result_t, handle_t, ctypes.c_int, c_int_p)
ctx_destroy = _proto("xmesh_ctx_destroy", result_t, handle_t)

mesh_create = _proto("xmesh_mesh_create", result_t, handle_t, ctypes.c_int, c_int_p, c_int_p, ctypes.POINTER(handle_t))
mesh_destroy = _proto("xmesh_mesh_destroy", result_t, handle_t)

layout_local_shape = _proto("xmesh_layout_local_shape", result_t, ctypes.POINTER(Layout), ctypes.c_int, c_i64_p, c_int_p)
layout_local_offset = _proto("xmesh_layout_local_offset", result_t, ctypes.POINTER(Layout), ctypes.c_int, c_i64_p, c_int_p)

plan_create = _proto(
    "xmesh_plan_create",
    result_t,
    handle_t,
    ctypes.POINTER(Layout),
    ctypes.POINTER(Layout),
    ctypes.POINTER(PlanParams),
    ctypes.POINTER(handle_t),
)
plan_create_many = _proto(
    "xmesh_plan_create_many",
    result_t,
    handle_t,
    ctypes.c_int,
    ctypes.POINTER(Layout),
    ctypes.POINTER(Layout),
    ctypes.POINTER(PlanParams),
    ctypes.POINTER(handle_t),
)
plan_destroy = _proto("xmesh_plan_destroy", result_t, handle_t)
plan_get_info = _proto("xmesh_plan_get_info", result_t, handle_t, ctypes.POINTER(PlanInfo))
reshard = _proto("xmesh_reshard", result_t, handle_t, ctypes.c_void_p, ctypes.c_void_p)
reshard_start = _proto("xmesh_reshard_start", result_t, handle_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(handle_t))
reshard_many = _proto("xmesh_reshard_many", result_t, handle_t, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))
reshard_many_start = _proto(
    "xmesh_reshard_many_start",
    result_t,
    handle_t,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(handle_t),
)
test = _proto("xmesh_test", result_t, handle_t)
wait = _proto("xmesh_wait", result_t, handle_t)

# The xmesh-info report (lib/topo/info.c): exported for this package, not
# part of the public C API; the package and the library come from one build.
info_print = _proto("xm_info_print", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)


def text(b):
    return b.decode("utf-8", "replace") if b is not None else None
