"""Consumers: each library's ``from_dlpack`` (or its other way in)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._libraries import (
    Unavailable,
    cupy_cuda,
    jax_gpu,
    need,
    numba_cuda,
    require_cuda,
    torch_cuda,
    version,
)
from ._providers import PROVIDERS, Provider, buffer_address, capsule_address

# ---------------------------------------------------------------------------
# consumers: each library's from_dlpack
# ---------------------------------------------------------------------------

# what a consumer made, the values it sees (nested lists), and its data pointer (None: unknown)
Consumed = tuple[Any, list[Any], int | None]


def _np_values(np: Any, x: Any) -> Any:
    return np.asarray(x).tolist()


def _c_numpy(obj: Any, device: str) -> Consumed:
    np = need("numpy")
    if not hasattr(np, "from_dlpack"):
        raise Unavailable(f"{version('numpy')} has no from_dlpack (numpy >= 1.22)")
    out = np.from_dlpack(obj)
    return out, out.tolist(), out.__array_interface__["data"][0]


def _c_torch(obj: Any, device: str) -> Consumed:
    torch = need("torch")
    from_dlpack = getattr(torch, "from_dlpack", None)
    if from_dlpack is None:
        raise Unavailable(f"{version('torch')} has no torch.from_dlpack (torch >= 1.10)")
    if device == "cuda":
        require_cuda("torch", torch_cuda)
    t = from_dlpack(obj)
    return t, t.cpu().tolist(), t.data_ptr()


def _c_jax(obj: Any, device: str) -> Consumed:
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


def _c_cupy(obj: Any, device: str) -> Consumed:
    cupy = need("cupy")
    require_cuda("cupy", cupy_cuda)
    if not hasattr(cupy, "from_dlpack"):
        raise Unavailable(f"{version('cupy')} has no cupy.from_dlpack (cupy >= 10)")
    x = cupy.from_dlpack(obj)
    return x, x.tolist(), int(x.data.ptr)


def _c_tensorflow(obj: Any, device: str) -> Consumed:
    tf = need("tensorflow")
    dlpack = getattr(getattr(tf, "experimental", None), "dlpack", None)
    if dlpack is None:
        raise Unavailable(f"{version('tensorflow')} has no tf.experimental.dlpack")
    t = dlpack.from_dlpack(obj.__dlpack__())  # tensorflow takes a (legacy) capsule
    # TensorFlow has no pointer API: the address in the capsule it makes of its tensor
    return t, t.numpy().tolist(), capsule_address(dlpack.to_dlpack(t))


def _c_paddle(obj: Any, device: str) -> Consumed:
    paddle = need("paddle")
    from_dlpack = getattr(paddle, "from_dlpack", None) or paddle.utils.dlpack.from_dlpack
    try:
        x = from_dlpack(obj)
    except TypeError:  # older paddle takes only a capsule
        x = from_dlpack(obj.__dlpack__())
    # Paddle's own pointer where it has one, else the capsule it makes of its tensor
    if hasattr(x, "data_ptr"):
        return x, x.numpy().tolist(), x.data_ptr()
    return x, x.numpy().tolist(), capsule_address(paddle.utils.dlpack.to_dlpack(x))


def _c_array_api_strict(obj: Any, device: str) -> Consumed:
    xp = need("array_api_strict")
    np = need("numpy", "numpy (array-api-strict needs it)")
    if not hasattr(xp, "from_dlpack"):
        raise Unavailable(f"{version('array_api_strict')} has no from_dlpack")
    x = xp.from_dlpack(obj)
    inner = np.from_dlpack(x)
    return x, inner.tolist(), inner.__array_interface__["data"][0]


def _c_tvm_ffi(obj: Any, device: str) -> Consumed:
    tvm_ffi = need("tvm_ffi", "tvm-ffi")
    t = tvm_ffi.from_dlpack(obj)
    if device == "cuda":
        values = need("torch").from_dlpack(t).cpu().tolist()
    else:
        values = need("numpy").from_dlpack(t).tolist()
    return t, values, int(t.data_ptr())


def _c_memoryview(obj: Any, device: str) -> Consumed:
    # the buffer protocol: Python's own consumer (file.write, hashlib, struct use it too)
    view = memoryview(obj)
    return view, view.tolist(), buffer_address(view)


class _ArrayInterfaceOnly:
    """Exposes only ``__array_interface__`` of ``owner``, so numpy reads that and nothing else
    (it would take the buffer protocol first)."""

    def __init__(self, owner: Any) -> None:
        self._owner = owner
        self.__array_interface__ = owner.__array_interface__


def _c_numpy_array_interface(obj: Any, device: str) -> Consumed:
    np = need("numpy")
    out = np.asarray(_ArrayInterfaceOnly(obj))
    return out, out.tolist(), out.__array_interface__["data"][0]


def _c_pillow(obj: Any, device: str) -> Consumed:
    image_mod = need("PIL.Image", "pillow")
    np = need("numpy", "numpy (to read pillow's pixels back)")
    img = image_mod.fromarray(obj)
    values = np.asarray(img).reshape(obj.shape).tolist()
    return img, values, None


def _c_numba(obj: Any, device: str) -> Consumed:
    need("numba")
    require_cuda("numba", numba_cuda)
    from numba import cuda

    d = cuda.as_cuda_array(obj)
    return d, d.copy_to_host().tolist(), int(d.__cuda_array_interface__["data"][0])


# The Arrow PyCapsule interface out: each library's public way to take an object that has
# __arrow_c_array__ / __arrow_c_stream__. A 2-D array comes as an arrow.fixed_shape_tensor
# column (rows of fixed-size lists), a 1-D one as a plain column.


def _c_pyarrow(obj: Any, device: str) -> Consumed:
    pa = need("pyarrow")
    if not hasattr(pa.Array, "_import_from_c_capsule"):
        raise Unavailable(f"{version('pyarrow')} takes no Arrow PyCapsule objects (pyarrow >= 14)")
    out = pa.array(obj)
    leaf = out.storage if isinstance(out, pa.ExtensionArray) else out
    while pa.types.is_fixed_size_list(leaf.type):
        leaf = leaf.flatten()  # the values of the rows, offset included
    return out, out.to_pylist(), leaf.buffers()[1].address + leaf.offset * leaf.type.byte_width


def _c_polars(obj: Any, device: str) -> Consumed:
    pl = need("polars")
    np = need("numpy", "numpy (to find polars's memory)")
    series = pl.Series(obj)
    try:
        # a tensor column's physical type is its rows (Array), which numpy can view
        held = series.to_physical().to_numpy(allow_copy=False)
    except RuntimeError:  # polars can't show its memory without a copy: unknown
        return series, series.to_list(), None
    return series, series.to_list(), np.asarray(held).__array_interface__["data"][0]


def _c_pandas(obj: Any, device: str) -> Consumed:
    pd = need("pandas")
    need("pyarrow", "pyarrow (pandas reads Arrow through it)")
    from_arrow = getattr(pd.Series, "from_arrow", None)
    if from_arrow is None:
        raise Unavailable(f"{version('pandas')} has no Series.from_arrow (pandas >= 3.0)")
    series = from_arrow(obj)
    if series.dtype != object:
        return series, series.tolist(), series.to_numpy().__array_interface__["data"][0]
    # rows of a tensor column: an object column of one numpy array per row
    rows = list(series)
    values = [row.tolist() if hasattr(row, "tolist") else row for row in rows]
    first = getattr(rows[0], "__array_interface__", None) if rows else None
    return series, values, first["data"][0] if first else None


def _listed(value: Any) -> Any:
    """DuckDB's rows (tuples, and tuples for ARRAY values) as nested lists."""
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    return value


def _c_duckdb(obj: Any, device: str) -> Consumed:
    duckdb = need("duckdb")
    con = duckdb.connect()  # its own in-memory database, not the module's default one
    try:
        rows = con.from_arrow(obj).fetchall()
    finally:
        con.close()
    # DuckDB gives no address of what it holds: a query's result is its own memory
    return rows, [_listed(row[0]) for row in rows], None


def _c_nanoarrow(obj: Any, device: str) -> Consumed:
    na = need("nanoarrow")
    out = na.Array(obj)
    leaf, offset = out, out.offset
    while leaf.n_children:  # the values of fixed-size list rows
        offset = offset * leaf.schema.list_size
        leaf = leaf.child(0)
        offset += leaf.offset
    data = leaf.buffer(1)
    ptr = buffer_address(data) + offset * memoryview(data).itemsize
    return out, out.to_pylist(), ptr


@dataclass(frozen=True)
class Consumer:
    name: str
    module: str | None  # the library it needs (None: stdlib)
    devices: tuple[str, ...]
    consume: Callable[[Any, str], Consumed] = field(compare=False, repr=False)
    zero_copy: bool = True  # the library promises not to copy memory it can use in place
    call: str = ""  # how it is called, for the report
    # it ignores DLPack's READ_ONLY flag, so asdlpack hands it copies of read-only memory
    copies_read_only: bool = False
    # it takes DLPack (else the buffer protocol or an array interface, which carry the
    # read-only flag themselves, or the Arrow interface)
    speaks_dlpack: bool = True
    # it takes the Arrow PyCapsule interface, whose memory is immutable by contract: asdlpack
    # lends it read-only memory as it is
    speaks_arrow: bool = False


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
    # the Arrow PyCapsule interface out
    Consumer(
        "pyarrow",
        "pyarrow",
        ("cpu",),
        _c_pyarrow,
        call="pyarrow.array",
        speaks_dlpack=False,
        speaks_arrow=True,
    ),
    Consumer(
        "polars",
        "polars",
        ("cpu",),
        _c_polars,
        call="polars.Series",
        speaks_dlpack=False,
        speaks_arrow=True,
    ),
    # pandas copies a column into its own block (a tensor's rows stay views of it)
    Consumer(
        "pandas",
        "pandas",
        ("cpu",),
        _c_pandas,
        zero_copy=False,
        call="pandas.Series.from_arrow",
        speaks_dlpack=False,
        speaks_arrow=True,
    ),
    # a DuckDB query's result is its own memory, and DuckDB names no address to compare
    Consumer(
        "duckdb",
        "duckdb",
        ("cpu",),
        _c_duckdb,
        zero_copy=False,
        call="duckdb: connection.from_arrow(x).fetchall()",
        speaks_dlpack=False,
        speaks_arrow=True,
    ),
    Consumer(
        "nanoarrow",
        "nanoarrow",
        ("cpu",),
        _c_nanoarrow,
        call="nanoarrow.Array",
        speaks_dlpack=False,
        speaks_arrow=True,
    ),
]

DEVICES = ("cpu", "cuda")


def pairs(device: str) -> list[tuple[Provider, Consumer]]:
    """Every (provider, consumer) pair that can meet on ``device``."""
    return [
        (p, c) for p in PROVIDERS if device in p.devices for c in CONSUMERS if device in c.devices
    ]
