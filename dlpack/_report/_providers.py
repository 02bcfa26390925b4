"""Providers: a small array in each library (or a stdlib buffer), for the report and the
test matrix."""

from __future__ import annotations

import array
import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._libraries import (
    Unavailable,
    _quiet,
    cupy_cuda,
    jax_gpu,
    need,
    numba_cuda,
    require_cuda,
    torch_cuda,
    version,
)

VALUES_2x3 = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
VALUES_6 = [0, 1, 2, 3, 4, 5]

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


def buffer_address(obj: Any) -> int:
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


def capsule_address(capsule: Any) -> int:
    """The address of the first element a legacy DLPack capsule ("dltensor") holds, read from
    the producer's ``DLTensor`` with ctypes (``data`` + ``byte_offset``), apart from asdlpack;
    the capsule is not consumed."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    get.restype = ctypes.c_void_p
    tensor = get(capsule, b"dltensor")
    # DLTensor: data, device (2 x int32), ndim (int32), dtype (4 bytes), shape, strides,
    # byte_offset (uint64) at byte 40
    data = ctypes.c_void_p.from_address(tensor).value or 0
    return data + ctypes.c_uint64.from_address(tensor + 40).value


@dataclass
class Sample:
    obj: Any  # what asdlpack gets
    values: list[Any]  # the values a consumer must see, as nested lists
    dtype: str  # the DLPack dtype name
    ptr: int | None  # address of the source's first element; None: the producer copies
    readonly: bool = False
    keep: Any = None  # keeps owners alive


class _CudaArrayInterfaceOnly:
    """Exposes only ``__cuda_array_interface__`` of ``owner`` (so that path is the one used)."""

    def __init__(self, owner: Any) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = owner.__cuda_array_interface__


def _bytes(device: str) -> Sample:
    b = bytes(VALUES_6)
    return Sample(b, VALUES_6, "uint8", buffer_address(b), readonly=True)


def _bytearray(device: str) -> Sample:
    b = bytearray(VALUES_6)
    return Sample(b, VALUES_6, "uint8", buffer_address(b))


def _memoryview(device: str) -> Sample:
    raw = bytearray(struct.pack("6f", *range(6)))
    return Sample(memoryview(raw).cast("f", [2, 3]), VALUES_2x3, "float32", buffer_address(raw))


def _array_array(device: str) -> Sample:
    a = array.array("f", range(6))
    return Sample(a, [float(v) for v in VALUES_6], "float32", a.buffer_info()[0])


def _ctypes(device: str) -> Sample:
    a = ((ctypes.c_float * 3) * 2)()
    for i in range(2):
        for j in range(3):
            a[i][j] = 3 * i + j
    return Sample(a, VALUES_2x3, "float32", ctypes.addressof(a))


def _numpy(device: str) -> Sample:
    np = need("numpy")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    return Sample(a, VALUES_2x3, "float32", a.__array_interface__["data"][0])


def _torch(device: str) -> Sample:
    torch = need("torch")
    if device == "cuda":
        require_cuda("torch", torch_cuda)
    t = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
    return Sample(t, VALUES_2x3, "float32", t.data_ptr())


def _jax(device: str) -> Sample:
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


def _cupy(device: str) -> Sample:
    cupy = need("cupy")
    require_cuda("cupy", cupy_cuda)
    x = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    return Sample(x, VALUES_2x3, "float32", int(x.data.ptr))


def _cupy_cai(device: str) -> Sample:
    sample = _cupy(device)
    sample.keep, sample.obj = sample.obj, _CudaArrayInterfaceOnly(sample.obj)
    return sample


def _numba_cai(device: str) -> Sample:
    np = need("numpy", "numpy (numba needs it)")
    need("numba")
    require_cuda("numba", numba_cuda)
    from numba import cuda

    d = cuda.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    return Sample(d, VALUES_2x3, "float32", int(d.__cuda_array_interface__["data"][0]))


def _tensorflow(device: str) -> Sample:
    tf = need("tensorflow")
    dlpack = getattr(getattr(tf, "experimental", None), "dlpack", None)
    if dlpack is None:
        raise Unavailable(f"{version('tensorflow')} has no tf.experimental.dlpack")
    name = "/GPU:0" if device == "cuda" else "/CPU:0"
    if device == "cuda" and not _quiet(lambda: tf.config.list_physical_devices("GPU"), []):
        raise Unavailable(f"{version('tensorflow')} sees no GPU")
    with tf.device(name):
        t = tf.reshape(tf.range(6, dtype=tf.float32), (2, 3))
    # TensorFlow has no pointer API: a host tensor's own buffer protocol lends its memory in
    # place; a GPU tensor's (a host copy) can't, so there the capsule TensorFlow made is read.
    capsule = dlpack.to_dlpack(t)
    ptr = capsule_address(capsule) if device == "cuda" else buffer_address(t)
    return Sample(capsule, VALUES_2x3, "float32", ptr, keep=t)


def _pyarrow(device: str) -> Sample:
    pa = need("pyarrow")
    arr = pa.array(VALUES_6, type=pa.float32())
    if not hasattr(arr, "__dlpack__"):
        raise Unavailable(f"{version('pyarrow')} arrays have no __dlpack__ (pyarrow >= 15)")
    ptr = arr.buffers()[1].address + arr.offset * 4
    return Sample(arr, [float(v) for v in VALUES_6], "float32", ptr, readonly=True)


# Dataframe columns, read through the Arrow PyCapsule interface (``__arrow_c_stream__``,
# ``__arrow_c_array__``): Arrow memory is immutable, so asdlpack lends it read-only.
VALUES_COLUMN = [float(v) for v in VALUES_6]


def _pyarrow_stream(device: str) -> Sample:
    pa = need("pyarrow")
    # a chunked array (a table's column) has no __dlpack__: only the Arrow stream
    column = pa.chunked_array([pa.array(VALUES_COLUMN, type=pa.float32())])
    chunk = column.chunk(0)
    ptr = chunk.buffers()[1].address + chunk.offset * 4
    return Sample(column, VALUES_COLUMN, "float32", ptr, readonly=True)


def _polars(device: str) -> Sample:
    pl = need("polars")
    np = need("numpy", "numpy (to find polars's memory)")
    series = pl.Series("x", VALUES_COLUMN, dtype=pl.Float32)
    ptr = np.asarray(series.to_numpy(allow_copy=False)).__array_interface__["data"][0]
    return Sample(series, VALUES_COLUMN, "float32", ptr, readonly=True)


def _pandas(device: str) -> Sample:
    pd = need("pandas")
    # pandas builds its Arrow export with pyarrow, over the column's memory
    need("pyarrow", "pyarrow (pandas's Arrow interface needs it)")
    # the default, numpy-backed dtype: its Arrow export is the one pandas adds
    series = pd.Series(VALUES_COLUMN, dtype="float32")
    if not hasattr(series, "__arrow_c_stream__"):
        raise Unavailable(f"{version('pandas')} has no Series.__arrow_c_stream__ (pandas >= 3.0)")
    ptr = series.to_numpy().__array_interface__["data"][0]
    return Sample(series, VALUES_COLUMN, "float32", ptr, readonly=True)


def _duckdb(device: str) -> Sample:
    duckdb = need("duckdb")
    con = duckdb.connect()  # its own in-memory database, not the module's default one
    # a query result is a table (asdlpack makes rows x columns of it, one copy), computed
    # anew each time it is read: there is no memory of the source's to compare with
    result = con.sql("SELECT range::FLOAT AS x FROM range(6)")
    return Sample(result, [[v] for v in VALUES_COLUMN], "float32", None, keep=con)


def _nanoarrow(device: str) -> Sample:
    na = need("nanoarrow")
    array = na.Array(VALUES_COLUMN, na.float32())
    ptr = buffer_address(array.buffer(1)) + array.offset * 4
    return Sample(array, VALUES_COLUMN, "float32", ptr, readonly=True)


def _pillow(device: str) -> Sample:
    image_mod = need("PIL.Image", "pillow")
    img = image_mod.new("L", (3, 2))
    img.putdata(VALUES_6)
    # Pillow's __array_interface__ hands out a fresh copy of the pixels each time (ptr None)
    return Sample(img, [[0, 1, 2], [3, 4, 5]], "uint8", None)


def _mlx(device: str) -> Sample:
    mx = need("mlx.core", "mlx")
    x = mx.reshape(mx.arange(6, dtype=mx.float32), (2, 3))
    if not hasattr(x, "__dlpack__"):
        raise Unavailable(f"{version('mlx.core')} arrays have no __dlpack__")
    return Sample(x, VALUES_2x3, "float32", buffer_address(x))  # MLX's buffer protocol


def _paddle(device: str) -> Sample:
    paddle = need("paddle")
    if device == "cuda" and not _quiet(lambda: paddle.device.is_compiled_with_cuda(), False):
        raise Unavailable(f"{version('paddle')} is built without CUDA")
    place = "gpu" if device == "cuda" else "cpu"
    x = paddle.to_tensor(VALUES_2x3, dtype="float32", place=place)
    to_dlpack = paddle.utils.dlpack.to_dlpack
    # Paddle's own pointer (Tensor.data_ptr) where it has one, else the capsule Paddle makes
    ptr = x.data_ptr() if hasattr(x, "data_ptr") else capsule_address(to_dlpack(x))
    if hasattr(x, "__dlpack__"):
        return Sample(x, VALUES_2x3, "float32", ptr)
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
    # the Arrow PyCapsule interface in
    Provider("pyarrow-stream", "pyarrow", ("cpu",), _pyarrow_stream),
    Provider("polars", "polars", ("cpu",), _polars),
    Provider("pandas", "pandas", ("cpu",), _pandas),
    Provider("duckdb", "duckdb", ("cpu",), _duckdb),
    Provider("nanoarrow", "nanoarrow", ("cpu",), _nanoarrow),
    Provider("pillow", "PIL", ("cpu",), _pillow),
    Provider("mlx", "mlx.core", ("cpu",), _mlx),
    Provider("paddle", "paddle", ("cpu", "cuda"), _paddle),
]
