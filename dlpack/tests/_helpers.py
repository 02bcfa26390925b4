"""Shared helpers for the dlpack test suite: importing array libraries (:func:`need`), ctypes
views of DLPack capsules, objects that expose exactly one protocol, child processes."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys

import pytest

from dlpack import DLPackObject, _probe, _report
from dlpack._report._libraries import PROBED

from . import _crash_report

# ---------------------------------------------------------------------------
# array libraries: every test imports them through need() or optional()
# ---------------------------------------------------------------------------

REQUIRE_ENV = "DLPACK_TESTS_REQUIRE"

# The reasons of the skips need() and need_cuda() made: DLPACK_TESTS_REQUIRE could have turned
# them into failures. The summary (conftest.py) lists every other skip apart, as ones it can't.
REQUIRABLE_SKIPS: set[str] = set()


def required(name: str) -> bool:
    """Whether ``DLPACK_TESTS_REQUIRE`` names this library (by import name, its top-level
    package, or its common name: ``PIL.Image``, ``PIL`` or ``pillow``), or ``cuda``."""
    names = {n.strip() for n in os.environ.get(REQUIRE_ENV, "").split(",") if n.strip()}
    return bool(names & {name, name.partition(".")[0], _report.label(name)})


def need(name: str, what: str | None = None):
    """The module ``name``, imported as the report does (once, guarded, after the crash probe
    of :mod:`dlpack._probe`); when it is missing, fails to import, or crashes the interpreter,
    the calling test (or module, at module level) is skipped with the reason, or fails when
    ``DLPACK_TESTS_REQUIRE`` names it."""
    __tracebackhide__ = True  # pytest reports the skip or failure at the caller's line
    try:
        module = _report.need(name, what)
    except _report.Unavailable as exc:
        reason = str(exc)
    else:
        _crash_report.rearm_after_import()  # a library loaded may have replaced the handler
        return module
    if required(name):
        pytest.fail(f"{reason}, and {REQUIRE_ENV} requires it", pytrace=False)
    REQUIRABLE_SKIPS.add(reason)
    pytest.skip(reason, allow_module_level=True)


def need_cuda(available: bool, reason: str) -> None:
    """Skip a test that needs a CUDA device where there is none (fail instead where
    ``DLPACK_TESTS_REQUIRE`` names ``cuda``: a GPU machine's run must not skip them all)."""
    __tracebackhide__ = True
    if available:
        return
    if required("cuda"):
        pytest.fail(f"{reason}, and {REQUIRE_ENV} requires cuda", pytrace=False)
    REQUIRABLE_SKIPS.add(reason)
    pytest.skip(reason)


def optional(name: str):
    """The module ``name`` as :func:`need` imports it, or None where a test can do without it
    (still a failure when ``DLPACK_TESTS_REQUIRE`` names it)."""
    __tracebackhide__ = True
    lib = _report.library(name)
    if lib.ok:
        _crash_report.rearm_after_import()  # as in need()
        return lib.module
    if required(name):
        need(name)  # fails, with the reason
    return None


def arrays_of_every_library(base) -> list:
    """(library name, array, from_dlpack) with the values of ``base`` (a 2-d float32 numpy
    array): numpy (as it is, and strided), then torch (transposed), JAX and array_api_strict
    where installed."""
    np = need("numpy")
    made = [("numpy", base, np.from_dlpack), ("numpy strided", base[::-1, ::2], np.from_dlpack)]
    torch = optional("torch")
    if torch is not None:
        made.append(("torch", torch.from_numpy(base.copy()).T, torch.from_dlpack))
    jax = optional("jax")
    if jax is not None:
        made.append(("jax", jax.numpy.asarray(base), jax.numpy.from_dlpack))
    xp = optional("array_api_strict")
    if xp is not None:
        made.append(("array_api_strict", xp.asarray(base), xp.from_dlpack))
    return made


# ---------------------------------------------------------------------------
# DLPack ABI mirrored with ctypes
# ---------------------------------------------------------------------------

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2

# DLDataTypeCode
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLOpaqueHandle = 3
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6
kDLFloat8_e3m4 = 7
kDLFloat8_e4m3 = 8
kDLFloat8_e4m3b11fnuz = 9
kDLFloat8_e4m3fn = 10
kDLFloat8_e4m3fnuz = 11
kDLFloat8_e5m2 = 12
kDLFloat8_e5m2fnuz = 13
kDLFloat8_e8m0fnu = 14

# dtype name -> (code, bits, itemsize)
DTYPE_CODES = {
    "bool": (kDLBool, 8, 1),
    "int8": (kDLInt, 8, 1),
    "int16": (kDLInt, 16, 2),
    "int32": (kDLInt, 32, 4),
    "int64": (kDLInt, 64, 8),
    "uint8": (kDLUInt, 8, 1),
    "uint16": (kDLUInt, 16, 2),
    "uint32": (kDLUInt, 32, 4),
    "uint64": (kDLUInt, 64, 8),
    "float16": (kDLFloat, 16, 2),
    "float32": (kDLFloat, 32, 4),
    "float64": (kDLFloat, 64, 8),
    "complex64": (kDLComplex, 64, 8),
    "complex128": (kDLComplex, 128, 16),
    "bfloat16": (kDLBfloat, 16, 2),
    "float8_e3m4": (kDLFloat8_e3m4, 8, 1),
    "float8_e4m3": (kDLFloat8_e4m3, 8, 1),
    "float8_e4m3b11fnuz": (kDLFloat8_e4m3b11fnuz, 8, 1),
    "float8_e4m3fn": (kDLFloat8_e4m3fn, 8, 1),
    "float8_e4m3fnuz": (kDLFloat8_e4m3fnuz, 8, 1),
    "float8_e5m2": (kDLFloat8_e5m2, 8, 1),
    "float8_e5m2fnuz": (kDLFloat8_e5m2fnuz, 8, 1),
    "float8_e8m0fnu": (kDLFloat8_e8m0fnu, 8, 1),
}

NUMPY_NATIVE_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]

ML_DTYPES_NAMES = [
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e8m0fnu",
]


class Buf(bytearray):
    """bytearray that can be weak-referenced."""


def package_root():
    """The folder holding the installed ``dlpack``: a subprocess started there imports it."""
    import dlpack

    return os.path.dirname(os.path.dirname(os.path.abspath(dlpack.__file__)))


def child_env(path=(), env=None) -> dict[str, str]:
    """This environment with the folders in ``path`` first on ``PYTHONPATH`` and ``env`` added;
    pytest's own variables are dropped, so a pytest run in a child is its own. This process's
    crash probe is handed down: a child that would probe the same libraries takes its result
    (this process probes first if it has not yet: among many large libraries a probe takes a
    minute, and every child that imports a library would otherwise make its own)."""
    child_env = dict(os.environ)
    _probe.crashes(PROBED)
    child_env.update(_probe.handed_down())
    child_env.pop("PYTEST_ADDOPTS", None)
    child_env.pop("PYTEST_CURRENT_TEST", None)
    if path:
        folders = [os.fspath(p) for p in path]
        if child_env.get("PYTHONPATH"):
            folders.append(child_env["PYTHONPATH"])
        child_env["PYTHONPATH"] = os.pathsep.join(folders)
    child_env.update(env or {})
    return child_env


# The libraries a report or a probe takes seconds to import (each, TensorFlow and Paddle
# several), by the top-level names it imports them by.
HEAVY_LIBRARIES = ("torch", "jax", "tensorflow", "paddle", "mlx", "cupy", "numba")


def leave_out_heavy_libraries(folder) -> None:
    """Stand-ins for :data:`HEAVY_LIBRARIES` in ``folder`` (not for a name it already holds),
    each raising ImportError when imported: a child that runs a report or a probe to test
    something else sees them as broken and imports none of them (nor does a library that imports
    one where it can, as tvm_ffi does torch). Start it with ``run_python(..., path=[folder],
    cwd=folder)``: started in site-packages, that folder would come first on its sys.path."""
    for name in HEAVY_LIBRARIES:
        if not any(os.path.exists(os.path.join(folder, f)) for f in (name, f"{name}.py")):
            with open(os.path.join(folder, f"{name}.py"), "w") as file:
                file.write("raise ImportError('left out by this test')\n")


# sys.path entries that make it longer (~150 KB) than one command-line argument may be (128 KiB
# on Linux); and code that adds them, for a child (whose command line can't hold them)
LONG_PATH_ENTRIES = ["/no/such/folder/" + "x" * 80 + f"/{i:04d}" for i in range(1500)]
LONG_PATH = (
    "import sys; sys.path += ['/no/such/folder/' + 'x' * 80 + f'/{i:04d}' for i in range(1500)]"
)


def run_python(*args, path=(), env=None, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    """``python ARGS`` in a child process started in :func:`package_root` (so it imports the same
    ``dlpack``), its environment made by :func:`child_env`; started in ``cwd`` instead, it finds
    that ``dlpack`` through ``PYTHONPATH``, after ``path``."""
    if cwd is not None:
        path = [*path, package_root()]
    return subprocess.run(
        [sys.executable, *map(os.fspath, args)],
        cwd=package_root() if cwd is None else cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(path, env),
    )


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_GetName = ctypes.pythonapi.PyCapsule_GetName
_GetName.restype = ctypes.c_char_p
_GetName.argtypes = [ctypes.py_object]

_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_IsValid.restype = ctypes.c_int
_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def capsule_name(cap) -> str | None:
    name = _GetName(cap)
    return None if name is None else name.decode()


class CapsuleInfo:
    """Plain-Python snapshot of the DLTensor held by an (unconsumed) DLPack capsule."""

    def __init__(self, cap):
        self.name = capsule_name(cap)
        ptr = _GetPointer(cap, self.name.encode())
        assert ptr, "capsule holds a NULL pointer"
        self.versioned = self.name == "dltensor_versioned"
        if self.versioned:
            mt = DLManagedTensorVersioned.from_address(ptr)
            self.version = (mt.version.major, mt.version.minor)
            self.flags = int(mt.flags)
        elif self.name == "dltensor":
            mt = DLManagedTensor.from_address(ptr)
            self.version = None
            self.flags = None
        else:
            raise AssertionError(f"unexpected capsule name {self.name!r}")
        self.has_deleter = bool(mt.deleter)
        t = mt.dl_tensor
        self.ndim = int(t.ndim)
        self.shape = tuple(int(t.shape[i]) for i in range(self.ndim)) if self.ndim else ()
        if self.ndim and t.strides:
            self.strides = tuple(int(t.strides[i]) for i in range(self.ndim))
        else:
            self.strides = None
        self.device = (int(t.device.device_type), int(t.device.device_id))
        self.dtype = (int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
        self.data = int(t.data or 0)
        self.byte_offset = int(t.byte_offset)

    @property
    def first_element(self) -> int:
        return self.data + self.byte_offset

    @property
    def readonly(self) -> bool:
        return bool(self.flags and self.flags & FLAG_READ_ONLY)

    @property
    def is_copied(self) -> bool:
        return bool(self.flags and self.flags & FLAG_IS_COPIED)

    def __repr__(self):
        return f"CapsuleInfo({vars(self)!r})"


def contiguous_strides(shape) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def element_strides(np_array) -> tuple[int, ...]:
    """numpy byte strides -> DLPack element strides."""
    isz = np_array.dtype.itemsize
    out = []
    for s in np_array.strides:
        assert s % isz == 0
        out.append(s // isz)
    return tuple(out)


def np_data_ptr(np_array) -> int:
    return np_array.__array_interface__["data"][0]


def collect():
    gc.collect()


def refcount(obj) -> int:
    collect()
    return sys.getrefcount(obj)


# ---------------------------------------------------------------------------
# Objects that expose exactly one protocol
# ---------------------------------------------------------------------------


class ArrayInterface:
    """Exposes only ``__array_interface__``; keeps ``owner`` alive."""

    def __init__(self, iface, owner=None):
        self.__array_interface__ = iface
        self._owner = owner


class ArrayStruct:
    """Exposes only ``__array_struct__``; keeps ``owner`` alive."""

    def __init__(self, owner):
        self._owner = owner
        self.__array_struct__ = owner.__array_struct__


class BothArrayInterfaces:
    def __init__(self, iface, owner):
        self._owner = owner
        self.__array_interface__ = iface
        self.__array_struct__ = owner.__array_struct__


class CudaArrayInterface:
    """Exposes only ``__cuda_array_interface__``."""

    def __init__(self, iface, owner=None):
        self.__cuda_array_interface__ = iface
        self._owner = owner


class DLPackProducer:
    """Exposes only ``__dlpack__``/``__dlpack_device__``, forwarding to ``inner``; ``calls``
    records the keyword arguments of each ``__dlpack__`` call."""

    def __init__(self, inner, record=None):
        self._inner = inner
        self.calls = [] if record is None else record

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self._inner.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._inner.__dlpack_device__()


def asks_for_legacy_capsule(from_dlpack, source) -> bool:
    """Whether ``from_dlpack`` asks its producer for an unversioned (legacy) capsule, which can't
    say the memory is read-only: seen through a producer over ``asdlpack(source)`` that records
    what it is asked (the last request counts: a consumer may retry with other arguments)."""
    from dlpack import asdlpack

    producer = DLPackProducer(asdlpack(source))
    from_dlpack(producer)
    assert producer.calls, "the consumer never called __dlpack__"
    return producer.calls[-1].get("max_version") is None


def array_interface_of(np_array, **overrides):
    iface = dict(np_array.__array_interface__)
    iface.update(overrides)
    return iface


def cuda_iface(shape=(2, 3), typestr="<f4", ptr=0x7F0000000000, readonly=False, **extra):
    iface = {"shape": shape, "typestr": typestr, "data": (ptr, readonly), "version": 3}
    iface.update(extra)
    return iface


def torch_cuda_available():
    """Whether an already imported torch sees a CUDA device (never imports torch itself)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:
        return False


def buffer_addr(buf) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def check_view(obj, ref, *, readonly=None, check_ptr=True):
    """``obj`` (a DLPackObject) describes exactly the memory of numpy view ``ref`` (numpy's
    from_dlpack of it reads the same elements in place)."""
    np = need("numpy")
    assert type(obj) is DLPackObject
    assert obj.shape == ref.shape
    assert obj.ndim == ref.ndim
    assert obj.dtype == ref.dtype.name
    assert obj.itemsize == ref.dtype.itemsize
    assert obj.nbytes == ref.size * ref.dtype.itemsize
    if ref.size > 0:
        expected = element_strides(ref)
        # extents of 1 may carry any stride
        for n, got, exp in zip(ref.shape, obj.strides, expected, strict=True):
            if n > 1:
                assert got == exp, (obj.strides, expected)
        if check_ptr:
            assert obj.data_ptr == np_data_ptr(ref)
    assert obj.device == (1, 0)
    if ref.size > 0 and all(n > 1 for n in ref.shape):
        assert obj.c_contiguous is bool(ref.flags.c_contiguous)
        assert obj.f_contiguous is bool(ref.flags.f_contiguous)
    if readonly is not None:
        assert obj.readonly is readonly
    out = np.from_dlpack(obj)
    assert out.dtype == ref.dtype
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)
    if ref.size > 0 and check_ptr:
        assert np_data_ptr(out) == np_data_ptr(ref)
    if readonly is not None:
        assert out.flags.writeable is (not readonly)
    return out
