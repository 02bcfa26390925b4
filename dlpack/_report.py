"""The environment report of ``python -m dlpack``, and the provider/consumer catalog it shares
with the test suite (``dlpack/tests/test_matrix.py``).

A *provider* makes a small array in some library (or a stdlib buffer); ``asdlpack`` wraps it; a
*consumer* takes the ``DLPackObject`` with its ``from_dlpack``. :func:`exchange` runs one such
exchange and says whether it worked zero-copy (the consumer's data pointer is the source's), with
a copy (same values, other memory), or failed (and why). Every library import is guarded: a
library that is missing is "not installed", one that fails to import is reported as broken, one
that crashes the interpreter when imported (found by :mod:`dlpack._probe` in child processes,
before any of them is imported here) is never imported, and none of them stops the report.
"""

from __future__ import annotations

import array
import ctypes
import importlib
import importlib.metadata
import platform
import struct
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _probe

VALUES_2x3 = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
VALUES_6 = [0, 1, 2, 3, 4, 5]

# distribution names, for versions of modules without __version__
_DISTRIBUTIONS = {
    "tvm_ffi": "apache-tvm-ffi",
    "PIL": "pillow",
    "mlx.core": "mlx",
    "paddle": "paddlepaddle",
    "array_api_strict": "array-api-strict",
    "tensorflow": "tensorflow",
    "cupy": "cupy",
}


# ---------------------------------------------------------------------------
# importing libraries without letting a broken one stop us
# ---------------------------------------------------------------------------


@dataclass
class Library:
    name: str  # import name
    status: str  # "ok", "missing", "broken" or "crashes"
    module: Any = None
    version: str | None = None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "ok":
            return self.version or "(version unknown)"
        if self.status == "missing":
            return "not installed"
        if self.status == "crashes":  # the error names the library first
            return self.error.removeprefix(label(self.name)).lstrip()
        return f"import failed: {self.error}"


_LIBRARIES: dict[str, Library] = {}


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``"TypeError: first words of the message..."``, on one line."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 3)
    return text[: cut if cut > limit // 2 else limit - 3] + "..."


def _version_of(name: str, module) -> str | None:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    dist = _DISTRIBUTIONS.get(name, name.split(".")[0])
    try:
        return importlib.metadata.version(dist)
    except Exception:  # noqa: BLE001
        return None


def library(name: str) -> Library:
    """Import ``name`` once and remember how that went; never raises (except KeyboardInterrupt).

    The first call probes the libraries this module knows for crashes (in child processes); a
    library that crashes the interpreter is not imported here."""
    lib = _LIBRARIES.get(name)
    if lib is not None:
        return lib
    crash = _probe.crash_of(name, PROBED)
    if crash is not None:
        lib = _LIBRARIES[name] = Library(name, "crashes", error=crash.message(label))
        return lib
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            top = name.split(".")[0]
            if exc.name in (name, top):
                lib = Library(name, "missing")
            else:  # installed, but something it needs is missing
                lib = Library(name, "broken", error=short_error(exc))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken library is reported, not fatal
            lib = Library(name, "broken", error=short_error(exc))
        else:
            lib = Library(name, "ok", module, _version_of(name, module))
    lib.seconds = time.perf_counter() - start
    _LIBRARIES[name] = lib
    return lib


class Unavailable(Exception):
    """A library, device or feature this exchange needs is not here: a skip, with this reason."""


def label(name: str) -> str:
    """A library's common name: ``PIL`` -> ``pillow``, ``mlx.core`` -> ``mlx``."""
    return _LABELS.get(name, name.split(".")[0])


_LABELS = {
    "PIL": "pillow",
    "PIL.Image": "pillow",
    "mlx.core": "mlx",
    "tvm_ffi": "tvm-ffi",
    "array_api_strict": "array-api-strict",
}


def need(name: str, what: str | None = None):
    what = what or label(name)
    lib = library(name)
    if lib.status == "missing":
        raise Unavailable(f"{what} is not installed")
    if lib.status == "broken":
        raise Unavailable(f"{what} fails to import ({lib.error})")
    if lib.status == "crashes":
        raise Unavailable(lib.error)
    return lib.module


def version(name: str) -> str:
    """``"torch 2.15.0"``: a library's name and installed version, for messages."""
    lib = library(name)
    return f"{label(name)} {lib.version}" if lib.version else label(name)


# ---------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------


def _quiet(fn, default=None):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001
        return default


def torch_cuda() -> bool:
    lib = library("torch")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: lib.module.cuda.is_available() and lib.module.cuda.device_count()))


def cupy_cuda() -> bool:
    lib = library("cupy")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: lib.module.cuda.runtime.getDeviceCount() > 0, False))


def numba_cuda() -> bool:
    lib = library("numba")
    if not lib.ok:
        return False

    def check():
        from numba import cuda

        return cuda.is_available()

    return bool(_quiet(check, False))


def jax_gpu() -> bool:
    lib = library("jax")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: len(lib.module.devices("gpu")) > 0, False))


_CUDA: tuple[bool, str] | None = None


def cuda_devices() -> tuple[bool, str]:
    """(a CUDA device is usable here, how we know / why not); found once per process."""
    global _CUDA
    if _CUDA is None:
        _CUDA = _find_cuda()
    return _CUDA


def _find_cuda() -> tuple[bool, str]:
    seen = []
    if torch_cuda():
        torch = library("torch").module
        name = _quiet(lambda: torch.cuda.get_device_name(0), "?")
        runtime = _quiet(lambda: torch.version.cuda, None)
        built = f", CUDA {runtime}" if runtime else ""
        seen.append(f"torch: {torch.cuda.device_count()} device(s), {name}{built}")
    if cupy_cuda():
        seen.append("cupy")
    if numba_cuda():
        seen.append("numba")
    if jax_gpu():
        seen.append("jax")
    if seen:
        return True, "; ".join(seen)
    why = []
    for name in ("torch", "cupy", "numba", "jax"):
        if library(name).ok:
            why.append(f"{name}: no device")
    return False, "no CUDA device found" + (f" ({', '.join(why)})" if why else "")


def require_cuda(name: str, available: Callable[[], bool]):
    if not available():
        raise Unavailable(f"{version(name)} sees no CUDA device")


# ---------------------------------------------------------------------------
# providers: a small array in each library
# ---------------------------------------------------------------------------


class PyBufferView(ctypes.Structure):
    """CPython's ``Py_buffer``, for reading what an exporter lends (ctypes)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def buffer_address(obj) -> int:
    """Address of the memory behind any buffer-protocol object (bytes too)."""
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(PyBufferView), ctypes.c_int]
    get.restype = ctypes.c_int
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(PyBufferView)]
    release.restype = None
    view = PyBufferView()
    if get(obj, ctypes.byref(view), 0) != 0:  # PyBUF_SIMPLE
        raise BufferError("PyObject_GetBuffer failed")
    try:
        return int(view.buf or 0)
    finally:
        release(ctypes.byref(view))


def pointer_via_dlpack(obj) -> int:
    """The data pointer a DLPack producer reports (used where a library has no other way)."""
    from dlpack import asdlpack

    return asdlpack(obj).data_ptr


@dataclass
class Sample:
    obj: Any  # what asdlpack gets
    values: list  # the values a consumer must see, as nested lists
    dtype: str  # the DLPack dtype name
    ptr: int | None  # address of the source's first element; None: the producer copies
    readonly: bool = False
    keep: Any = None  # keeps owners alive


class _CudaArrayInterfaceOnly:
    """Exposes only ``__cuda_array_interface__`` of ``owner`` (so that path is the one used)."""

    def __init__(self, owner) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = owner.__cuda_array_interface__


def _bytes(device):
    b = bytes(VALUES_6)
    return Sample(b, VALUES_6, "uint8", buffer_address(b), readonly=True)


def _bytearray(device):
    b = bytearray(VALUES_6)
    return Sample(b, VALUES_6, "uint8", buffer_address(b))


def _memoryview(device):
    raw = bytearray(struct.pack("6f", *range(6)))
    return Sample(memoryview(raw).cast("f", [2, 3]), VALUES_2x3, "float32", buffer_address(raw))


def _array_array(device):
    a = array.array("f", range(6))
    return Sample(a, [float(v) for v in VALUES_6], "float32", a.buffer_info()[0])


def _ctypes(device):
    a = ((ctypes.c_float * 3) * 2)()
    for i in range(2):
        for j in range(3):
            a[i][j] = 3 * i + j
    return Sample(a, VALUES_2x3, "float32", ctypes.addressof(a))


def _numpy(device):
    np = need("numpy")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    return Sample(a, VALUES_2x3, "float32", a.__array_interface__["data"][0])


def _torch(device):
    torch = need("torch")
    if device == "cuda":
        require_cuda("torch", torch_cuda)
    t = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
    return Sample(t, VALUES_2x3, "float32", t.data_ptr())


def _jax(device):
    jax = need("jax")
    import jax.numpy as jnp

    if device == "cuda":
        require_cuda("jax", jax_gpu)
        target = jax.devices("gpu")[0]
    else:
        target = jax.devices("cpu")[0]
    x = jax.device_put(jnp.arange(6, dtype=jnp.float32).reshape(2, 3), target)
    # JAX arrays are immutable: asdlpack lends them read-only
    return Sample(x, VALUES_2x3, "float32", x.unsafe_buffer_pointer(), readonly=True)


def _cupy(device):
    cupy = need("cupy")
    require_cuda("cupy", cupy_cuda)
    x = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    return Sample(x, VALUES_2x3, "float32", int(x.data.ptr))


def _cupy_cai(device):
    sample = _cupy(device)
    sample.keep, sample.obj = sample.obj, _CudaArrayInterfaceOnly(sample.obj)
    return sample


def _numba_cai(device):
    np = need("numpy", "numpy (numba needs it)")
    need("numba")
    require_cuda("numba", numba_cuda)
    from numba import cuda

    d = cuda.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    return Sample(d, VALUES_2x3, "float32", int(d.__cuda_array_interface__["data"][0]))


def _tensorflow(device):
    tf = need("tensorflow")
    dlpack = getattr(getattr(tf, "experimental", None), "dlpack", None)
    if dlpack is None:
        raise Unavailable(f"{version('tensorflow')} has no tf.experimental.dlpack")
    name = "/GPU:0" if device == "cuda" else "/CPU:0"
    if device == "cuda" and not _quiet(lambda: tf.config.list_physical_devices("GPU"), []):
        raise Unavailable(f"{version('tensorflow')} sees no GPU")
    with tf.device(name):
        t = tf.reshape(tf.range(6, dtype=tf.float32), (2, 3))
    ptr = pointer_via_dlpack(dlpack.to_dlpack(t))
    return Sample(dlpack.to_dlpack(t), VALUES_2x3, "float32", ptr, keep=t)


def _pyarrow(device):
    pa = need("pyarrow")
    arr = pa.array(VALUES_6, type=pa.float32())
    if not hasattr(arr, "__dlpack__"):
        raise Unavailable(f"{version('pyarrow')} arrays have no __dlpack__ (pyarrow >= 15)")
    ptr = arr.buffers()[1].address + arr.offset * 4
    return Sample(arr, [float(v) for v in VALUES_6], "float32", ptr, readonly=True)


def _pillow(device):
    image_mod = need("PIL.Image", "pillow")
    img = image_mod.new("L", (3, 2))
    img.putdata(VALUES_6)
    # Pillow's __array_interface__ hands out a fresh copy of the pixels each time (ptr None)
    return Sample(img, [[0, 1, 2], [3, 4, 5]], "uint8", None)


def _mlx(device):
    mx = need("mlx.core", "mlx")
    x = mx.reshape(mx.arange(6, dtype=mx.float32), (2, 3))
    if not hasattr(x, "__dlpack__"):
        raise Unavailable(f"{version('mlx.core')} arrays have no __dlpack__")
    return Sample(x, VALUES_2x3, "float32", pointer_via_dlpack(x))


def _paddle(device):
    paddle = need("paddle")
    if device == "cuda" and not _quiet(lambda: paddle.device.is_compiled_with_cuda(), False):
        raise Unavailable(f"{version('paddle')} is built without CUDA")
    place = "gpu" if device == "cuda" else "cpu"
    x = paddle.to_tensor(VALUES_2x3, dtype="float32", place=place)
    if hasattr(x, "__dlpack__"):
        return Sample(x, VALUES_2x3, "float32", pointer_via_dlpack(x))
    to_dlpack = paddle.utils.dlpack.to_dlpack
    ptr = pointer_via_dlpack(to_dlpack(x))
    return Sample(to_dlpack(x), VALUES_2x3, "float32", ptr, keep=x)


@dataclass(frozen=True)
class Provider:
    name: str
    module: str | None  # the library it needs (None: stdlib)
    devices: tuple[str, ...]
    make: Callable[[str], Sample] = field(compare=False, repr=False)


PROVIDERS = [
    Provider("bytes", None, ("cpu",), _bytes),
    Provider("bytearray", None, ("cpu",), _bytearray),
    Provider("memoryview", None, ("cpu",), _memoryview),
    Provider("array.array", None, ("cpu",), _array_array),
    Provider("ctypes", None, ("cpu",), _ctypes),
    Provider("numpy", "numpy", ("cpu",), _numpy),
    Provider("torch", "torch", ("cpu", "cuda"), _torch),
    Provider("jax", "jax", ("cpu", "cuda"), _jax),
    Provider("cupy", "cupy", ("cuda",), _cupy),
    Provider("cupy-cai", "cupy", ("cuda",), _cupy_cai),
    Provider("numba-cai", "numba", ("cuda",), _numba_cai),
    Provider("tensorflow", "tensorflow", ("cpu", "cuda"), _tensorflow),
    Provider("pyarrow", "pyarrow", ("cpu",), _pyarrow),
    Provider("pillow", "PIL", ("cpu",), _pillow),
    Provider("mlx", "mlx.core", ("cpu",), _mlx),
    Provider("paddle", "paddle", ("cpu", "cuda"), _paddle),
]


# ---------------------------------------------------------------------------
# consumers: each library's from_dlpack
# ---------------------------------------------------------------------------


def _np_values(np, x):
    return np.asarray(x).tolist()


def _c_numpy(obj, device):
    np = need("numpy")
    if not hasattr(np, "from_dlpack"):
        raise Unavailable(f"{version('numpy')} has no from_dlpack (numpy >= 1.22)")
    out = np.from_dlpack(obj)
    return out, out.tolist(), out.__array_interface__["data"][0]


def _c_torch(obj, device):
    torch = need("torch")
    from_dlpack = getattr(torch, "from_dlpack", None)
    if from_dlpack is None:
        raise Unavailable(f"{version('torch')} has no torch.from_dlpack (torch >= 1.10)")
    if device == "cuda":
        require_cuda("torch", torch_cuda)
    t = from_dlpack(obj)
    return t, t.cpu().tolist(), t.data_ptr()


def _c_jax(obj, device):
    need("jax")
    import jax.numpy as jnp

    if device == "cuda":
        require_cuda("jax", jax_gpu)
    from_dlpack = getattr(jnp, "from_dlpack", None)
    if from_dlpack is None:
        raise Unavailable(f"{version('jax')} has no jax.numpy.from_dlpack")
    x = from_dlpack(obj)
    values = x.tolist() if hasattr(x, "tolist") else _np_values(need("numpy"), x)
    return x, values, x.unsafe_buffer_pointer()


def _c_cupy(obj, device):
    cupy = need("cupy")
    require_cuda("cupy", cupy_cuda)
    if not hasattr(cupy, "from_dlpack"):
        raise Unavailable(f"{version('cupy')} has no cupy.from_dlpack (cupy >= 10)")
    x = cupy.from_dlpack(obj)
    return x, x.tolist(), int(x.data.ptr)


def _c_tensorflow(obj, device):
    tf = need("tensorflow")
    dlpack = getattr(getattr(tf, "experimental", None), "dlpack", None)
    if dlpack is None:
        raise Unavailable(f"{version('tensorflow')} has no tf.experimental.dlpack")
    t = dlpack.from_dlpack(obj.__dlpack__())  # tensorflow takes a (legacy) capsule
    return t, t.numpy().tolist(), pointer_via_dlpack(dlpack.to_dlpack(t))


def _c_paddle(obj, device):
    paddle = need("paddle")
    from_dlpack = getattr(paddle, "from_dlpack", None) or paddle.utils.dlpack.from_dlpack
    try:
        x = from_dlpack(obj)
    except TypeError:  # older paddle takes only a capsule
        x = from_dlpack(obj.__dlpack__())
    return x, x.numpy().tolist(), pointer_via_dlpack(x)


def _c_array_api_strict(obj, device):
    xp = need("array_api_strict")
    np = need("numpy", "numpy (array-api-strict needs it)")
    if not hasattr(xp, "from_dlpack"):
        raise Unavailable(f"{version('array_api_strict')} has no from_dlpack")
    x = xp.from_dlpack(obj)
    inner = np.from_dlpack(x)
    return x, inner.tolist(), inner.__array_interface__["data"][0]


def _c_tvm_ffi(obj, device):
    tvm_ffi = need("tvm_ffi", "tvm-ffi")
    t = tvm_ffi.from_dlpack(obj)
    if device == "cuda":
        values = need("torch").from_dlpack(t).cpu().tolist()
    else:
        values = need("numpy").from_dlpack(t).tolist()
    return t, values, int(t.data_ptr())


def _c_memoryview(obj, device):
    # the buffer protocol: Python's own consumer (file.write, hashlib, struct use it too)
    view = memoryview(obj)
    return view, view.tolist(), buffer_address(view)


class _ArrayInterfaceOnly:
    """Exposes only ``__array_interface__`` of ``owner``, so numpy reads that and nothing else
    (it would take the buffer protocol first)."""

    def __init__(self, owner) -> None:
        self._owner = owner
        self.__array_interface__ = owner.__array_interface__


def _c_numpy_array_interface(obj, device):
    np = need("numpy")
    out = np.asarray(_ArrayInterfaceOnly(obj))
    return out, out.tolist(), out.__array_interface__["data"][0]


def _c_pillow(obj, device):
    image_mod = need("PIL.Image", "pillow")
    np = need("numpy", "numpy (to read pillow's pixels back)")
    img = image_mod.fromarray(obj)
    values = np.asarray(img).reshape(obj.shape).tolist()
    return img, values, None


def _c_numba(obj, device):
    need("numba")
    require_cuda("numba", numba_cuda)
    from numba import cuda

    d = cuda.as_cuda_array(obj)
    return d, d.copy_to_host().tolist(), int(d.__cuda_array_interface__["data"][0])


@dataclass(frozen=True)
class Consumer:
    name: str
    module: str | None  # the library it needs (None: stdlib)
    devices: tuple[str, ...]
    consume: Callable[[Any, str], tuple[Any, list, int | None]] = field(compare=False, repr=False)
    zero_copy: bool = True  # the library promises not to copy memory it can use in place
    call: str = ""  # how it is called, for the report
    # it ignores DLPack's READ_ONLY flag, so asdlpack hands it copies of read-only memory
    copies_read_only: bool = False
    # it takes DLPack (else the buffer protocol or an array interface, which carry the
    # read-only flag themselves)
    speaks_dlpack: bool = True


CONSUMERS = [
    Consumer("numpy", "numpy", ("cpu",), _c_numpy, call="numpy.from_dlpack"),
    Consumer("torch", "torch", ("cpu", "cuda"), _c_torch, call="torch.from_dlpack"),
    # jax copies when the memory isn't aligned as XLA wants; tensorflow and paddle may copy
    Consumer("jax", "jax", ("cpu", "cuda"), _c_jax, zero_copy=False, call="jax.numpy.from_dlpack"),
    Consumer("cupy", "cupy", ("cuda",), _c_cupy, call="cupy.from_dlpack"),
    Consumer(
        "tensorflow",
        "tensorflow",
        ("cpu", "cuda"),
        _c_tensorflow,
        zero_copy=False,
        call="tf.experimental.dlpack.from_dlpack",
    ),
    Consumer(
        "paddle", "paddle", ("cpu", "cuda"), _c_paddle, zero_copy=False, call="paddle.from_dlpack"
    ),
    Consumer(
        "array-api-strict",
        "array_api_strict",
        ("cpu",),
        _c_array_api_strict,
        call="array_api_strict.from_dlpack",
    ),
    Consumer(
        "tvm-ffi",
        "tvm_ffi",
        ("cpu", "cuda"),
        _c_tvm_ffi,
        call="tvm_ffi.from_dlpack",
        copies_read_only=True,
    ),
    # the other protocols out: buffer, array interface, CUDA array interface
    Consumer("memoryview", None, ("cpu",), _c_memoryview, call="memoryview", speaks_dlpack=False),
    Consumer(
        "np-array-interface",
        "numpy",
        ("cpu",),
        _c_numpy_array_interface,
        call="numpy.asarray, reading __array_interface__",
        speaks_dlpack=False,
    ),
    # pillow copies into its own image memory for most modes
    Consumer(
        "pillow",
        "PIL",
        ("cpu",),
        _c_pillow,
        zero_copy=False,
        call="PIL.Image.fromarray",
        speaks_dlpack=False,
    ),
    Consumer(
        "numba",
        "numba",
        ("cuda",),
        _c_numba,
        call="numba.cuda.as_cuda_array",
        speaks_dlpack=False,
    ),
]

DEVICES = ("cpu", "cuda")


def pairs(device: str) -> list[tuple[Provider, Consumer]]:
    """Every (provider, consumer) pair that can meet on ``device``."""
    return [
        (p, c) for p in PROVIDERS if device in p.devices for c in CONSUMERS if device in c.devices
    ]


# ---------------------------------------------------------------------------
# one exchange
# ---------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str  # "zero-copy", "copy", "fails" or "skip"
    reason: str = ""
    stage: str = ""  # where it failed: "provider", "asdlpack", "consumer" or "values"
    exc: BaseException | None = None
    sample: Sample | None = None
    values: Any = None
    src_ptr: int | None = None
    dst_ptr: int | None = None
    result: Any = None

    @property
    def works(self) -> bool:
        return self.status in ("zero-copy", "copy")


def exchange(provider: Provider, consumer: Consumer, device: str = "cpu") -> Outcome:
    """Make ``provider``'s sample on ``device``, wrap it with ``asdlpack``, give it to
    ``consumer``, and compare values and data pointers. Never raises (but KeyboardInterrupt)."""
    from dlpack import asdlpack

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in (provider.module, consumer.module):
            if name is not None:
                lib = library(name)
                if lib.status == "missing":
                    return Outcome("skip", f"{label(name)} is not installed")
                if lib.status == "broken":
                    return Outcome("skip", f"{label(name)} fails to import: {lib.error}")
                if lib.status == "crashes":
                    return Outcome("skip", lib.error)
        if device == "cuda" and not cuda_devices()[0]:
            return Outcome("skip", "no CUDA device")
        stage = "provider"
        sample = None
        try:
            sample = provider.make(device)
            stage = "asdlpack"
            obj = asdlpack(sample.obj)
            stage = "consumer"
            result, values, ptr = consumer.consume(obj, device)
        except Unavailable as exc:
            return Outcome("skip", str(exc), stage=stage, sample=sample)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a failing library is reported
            reason = short_error(exc)
            if stage == "asdlpack":
                reason = f"asdlpack: {reason}"
            elif stage == "provider":
                reason = f"making the {provider.name} array: {reason}"
            return Outcome("fails", reason, stage=stage, exc=exc, sample=sample)
    out = Outcome(
        "copy", sample=sample, values=values, src_ptr=sample.ptr, dst_ptr=ptr, result=result
    )
    if not _same_values(values, sample.values):
        out.status, out.stage = "fails", "values"
        out.reason = f"wrong values: {_clip(values)} (expected {_clip(sample.values)})"
    elif sample.ptr is not None and ptr == sample.ptr:
        out.status = "zero-copy"
    return out


def _same_values(got, expected) -> bool:
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same_values(g, e) for g, e in zip(got, expected, strict=True))
        )
    try:
        return float(got) == float(expected)
    except (TypeError, ValueError):
        return False


def _clip(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------

# the libraries the report lists, in order, with what they do here
REPORTED = [
    ("numpy", "numpy"),
    ("torch", "torch"),
    ("jax", "jax"),
    ("cupy", "cupy"),
    ("numba", "numba"),
    ("tensorflow", "tensorflow"),
    ("pyarrow", "pyarrow"),
    ("PIL", "pillow"),
    ("mlx.core", "mlx"),
    ("paddle", "paddle"),
    ("array_api_strict", "array-api-strict"),
    ("tvm_ffi", "tvm-ffi"),
    ("ml_dtypes", "ml_dtypes"),
]
TEST_TOOLS = [("pytest", "pytest"), ("hypothesis", "hypothesis")]
# what dlpack._probe imports in child processes, first, to find libraries that crash: those the
# report lists, by the module that loads their native code, in the report's order
PROBED = [{"PIL": "PIL.Image"}.get(module, module) for module, _ in REPORTED]


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]


def _hello(lines: list[str]) -> bool:
    """The one-line demo, and a check that our own extension works; False when it doesn't."""
    from dlpack import asdlpack

    source = bytearray(b"Hello!")
    try:
        view = asdlpack(source)
        ok = (
            view.shape == (6,) and view.dtype == "uint8" and view.data_ptr == buffer_address(source)
        )
        capsule_ok = type(view.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
    except Exception as exc:  # noqa: BLE001
        lines.append(f"asdlpack(bytearray(b'Hello!')) FAILED: {short_error(exc, 200)}")
        return False
    if not (ok and capsule_ok):
        lines.append(f"asdlpack(bytearray(b'Hello!')) gives a wrong view: {view!r}")
        return False
    shown = False
    for module, call in (("numpy", "numpy.from_dlpack"), ("torch", "torch.from_dlpack")):
        lib = library(module)
        if not lib.ok:
            continue
        try:
            result = lib.module.from_dlpack(asdlpack(source))
            text = bytes(int(x) for x in result.tolist()).decode()
        except Exception as exc:  # noqa: BLE001
            lines.append(f"{call}(asdlpack(bytearray(b'Hello!'))) FAILED: {short_error(exc)}")
            continue
        lines.append(f"{call}(asdlpack(bytearray(b'Hello!'))) -> {text!r}")
        shown = True
    if not shown:
        lines.append(f"asdlpack(bytearray(b'Hello!')) -> {view!r}")
    return True


def report(out=None) -> int:
    """Print the report; return the exit status (0 unless dlpack itself is broken)."""
    out = out or sys.stdout
    started = time.perf_counter()

    def say(line: str = "") -> None:
        print(line, file=out)
        out.flush()

    try:
        import dlpack
        from dlpack import DLPACK_VERSION, __version__
    except Exception as exc:  # noqa: BLE001
        say(f"dlpack is broken here: {short_error(exc, 300)}")
        return 1
    say(
        f"dlpack-adapter {__version__} (DLPack {DLPACK_VERSION[0]}.{DLPACK_VERSION[1]}) "
        f"at {dlpack.__path__[0]}"
    )
    say(
        f"Python {platform.python_version()} ({platform.python_implementation()}) "
        f"on {platform.system()} {platform.machine()}"
    )
    say()
    hello: list[str] = []
    ours_ok = _hello(hello)
    for line in hello:
        say(line)
    say()

    say("Array libraries:")
    rows = []
    extra = [(name, name) for name in _probe.extra_names()]
    for module, label in REPORTED + TEST_TOOLS + extra:
        lib = library(module)
        rows.append([label, lib.describe()])
    for line in _table(rows):
        say(line)
    if not library("pytest").ok:
        say('  (`python -m dlpack.tests` needs pytest: pip install "dlpack-adapter[test]")')
    say()

    cuda, how = cuda_devices()
    say("Devices:")
    say("  cpu")
    say(f"  cuda  {how}")
    say()

    notes: dict[str, int] = {}
    for device in DEVICES:
        if device == "cuda" and not cuda:
            continue
        _exchange_table(device, say, notes)
    if notes:
        say("Notes:")
        for reason, n in notes.items():
            say(f"  [{n}] {reason}")
        say()
    say("zero-copy: the consumer's array uses the source's memory; copy: same values, other")
    say("memory; fails [n]: see note n; - [n]: not tried, see note n.")
    say("`python -m dlpack.tests` runs the test suite against these libraries.")
    say(f"(report made in {time.perf_counter() - started:.1f}s)")
    return 0 if ours_ok else 1


def _exchange_table(device: str, say, notes: dict[str, int]) -> None:
    providers = [p for p in PROVIDERS if device in p.devices and _present(p.module)]
    consumers = [c for c in CONSUMERS if device in c.devices and _present(c.module)]
    say(
        f"{device.upper()} exchanges, from_dlpack(asdlpack(x)): "
        "rows make x, columns consume it (2x3 float32, or 6 bytes)"
    )
    used_here = [x.module for x in PROVIDERS + CONSUMERS if device in x.devices and x.module]
    for module in dict.fromkeys(used_here):
        if library(module).status == "crashes":
            say(f"  (left out: {library(module).error})")
    if not consumers:
        say("  (no consumer library is installed: numpy, torch, jax, cupy, ...)")
        say()
        return
    rows = [["provider \\ consumer"] + [c.name for c in consumers]]
    for p in providers:
        row = [p.name]
        for c in consumers:
            o = exchange(p, c, device)
            if o.status == "fails":
                n = notes.setdefault(o.reason, len(notes) + 1)
                row.append(f"fails [{n}]")
            elif o.status == "skip":
                n = notes.setdefault(f"not tried: {o.reason}", len(notes) + 1)
                row.append(f"- [{n}]")
            else:
                row.append(o.status)
        rows.append(row)
    for line in _table(rows):
        say(line)
    say()


def _present(module: str | None) -> bool:
    return module is None or library(module).ok
