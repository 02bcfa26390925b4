"""The Arrow PyCapsule interface out: a DLPackObject handed to pyarrow, polars, nanoarrow and
DuckDB as an array (``__arrow_c_array__``), as a stream (``__arrow_c_stream__``), and through
the C Device interface's variants of both (CPU memory)."""

from __future__ import annotations

import ctypes
import gc
import re
import textwrap
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

from dlpack import asdlpack

from ._arrow_c import (
    GET_LAST_ERROR,
    GET_NEXT,
    RELEASE,
    ArrowArray,
    ArrowArrayStream,
    ArrowDeviceArray,
    ArrowDeviceArrayStream,
)
from ._arrow_c import capsule_pointer as _pointer
from ._helpers import (
    CudaArrayInterface,
    capsule_name,
    cuda_iface,
    need,
    np_data_ptr,
    refcount,
    run_python,
    torch_cuda_available,
)

pa = need("pyarrow")
np = need("numpy")


def test_one_dimensional_numbers_are_shared_without_a_copy():
    torch = need("torch")
    t = torch.arange(6, dtype=torch.float32)
    array = pa.array(asdlpack(t))
    assert array.type == pa.float32() and array.to_pylist() == [0, 1, 2, 3, 4, 5]
    assert array.buffers()[1].address == t.data_ptr()
    for dtype in ("int8", "uint32", "int64", "float16", "float64"):
        source = np.arange(4).astype(dtype)
        np.testing.assert_array_equal(pa.array(asdlpack(source)).to_numpy(), source)


def test_the_arrow_array_keeps_the_source_alive():
    source = np.arange(1000.0)
    array = pa.array(asdlpack(source))
    del source
    gc.collect()
    assert array.to_numpy()[999] == 999.0


def test_nd_is_a_fixed_shape_tensor_and_other_layouts_one_copy():
    a = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    out = pa.array(asdlpack(a))
    assert out.type.extension_name == "arrow.fixed_shape_tensor"
    np.testing.assert_array_equal(out.to_numpy_ndarray(), a)
    np.testing.assert_array_equal(
        pa.array(asdlpack(a.transpose(0, 2, 1))).to_numpy_ndarray(), a.transpose(0, 2, 1)
    )
    np.testing.assert_array_equal(
        pa.array(asdlpack(a[:, 0, ::-1])).to_numpy_ndarray(), a[:, 0, ::-1]
    )
    np.testing.assert_array_equal(pa.array(asdlpack(np.arange(10.0)[::3])).to_numpy(), [0, 3, 6, 9])


def test_requested_schema_is_honoured_or_refused():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    wanted = pa.list_(pa.float32(), 3)
    schema, array = asdlpack(a).__arrow_c_array__(wanted.__arrow_c_schema__())
    nested = pa.Array._import_from_c_capsule(schema, array)
    assert nested.type == wanted and nested.to_pylist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="can't be given as the requested Arrow type"):
        asdlpack(np.arange(3.0)).__arrow_c_array__(pa.int64().__arrow_c_schema__())
    with pytest.raises(TypeError):
        asdlpack(np.arange(3.0)).__arrow_c_array__(object())


def test_booleans_become_bits_and_types_arrow_lacks_are_refused():
    bits = pa.array(asdlpack(np.array([True, False, True])))
    assert bits.type == pa.bool_() and bits.to_pylist() == [True, False, True]
    with pytest.raises(TypeError, match="complex64 has no Arrow type"):
        pa.array(asdlpack(np.zeros(2, np.complex64)))
    with pytest.raises(ValueError, match="0-d"):
        pa.array(asdlpack(np.float64(1.0)))


def test_polars_takes_it():
    pl = need("polars")
    s = pl.Series(asdlpack(np.arange(4.0)))
    assert s.to_list() == [0, 1, 2, 3]
    # Through Arrow and back: the same memory.
    source = np.arange(5.0)
    back = np.from_dlpack(asdlpack(pa.array(asdlpack(source))))
    assert back.ctypes.data == source.ctypes.data


def test_capsules_never_consumed_are_released():
    source = np.arange(100.0)
    base = __import__("sys").getrefcount(source)
    obj = asdlpack(source)
    for _ in range(500):
        obj.__arrow_c_array__()  # dropped unconsumed
        pa.array(obj)
    gc.collect()
    del obj
    gc.collect()
    assert __import__("sys").getrefcount(source) == base


# ---------------------------------------------------------------------------
# __arrow_c_stream__: a stream of the one array __arrow_c_array__ gives
# ---------------------------------------------------------------------------


class StreamOnly:
    """Speaks only ``__arrow_c_stream__`` (forwarded), for consumers that prefer
    ``__arrow_c_array__`` when both are there (polars)."""

    def __init__(self, inner):
        self._inner = inner

    def __arrow_c_stream__(self, requested_schema=None):
        return self._inner.__arrow_c_stream__(requested_schema)


def on_thread(fn):
    """Run ``fn`` on another thread, raising what it raises."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_the_stream_is_one_chunk_in_place():
    torch = need("torch")
    t = torch.arange(6, dtype=torch.float32)
    obj = asdlpack(t)
    capsule = obj.__arrow_c_stream__()
    assert capsule_name(capsule) == "arrow_array_stream"
    chunked = pa.chunked_array(obj)
    assert chunked.num_chunks == 1 and chunked.type == pa.float32()
    assert chunked.to_pylist() == [0, 1, 2, 3, 4, 5]
    assert chunked.chunk(0).buffers()[1].address == t.data_ptr()
    source = np.arange(5.0)
    chunk = pa.ChunkedArray._import_from_c_capsule(asdlpack(source).__arrow_c_stream__())
    assert chunk.chunk(0).buffers()[1].address == np_data_ptr(source)
    # Back through the raw stream capsule: the same memory again.
    back = np.from_dlpack(asdlpack(asdlpack(source).__arrow_c_stream__()))
    assert back.ctypes.data == np_data_ptr(source)


def test_the_stream_gives_what_the_array_gives():
    a = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    tensor = pa.chunked_array(asdlpack(a))
    assert tensor.type.extension_name == "arrow.fixed_shape_tensor"
    assert tensor.type == pa.array(asdlpack(a)).type
    np.testing.assert_array_equal(tensor.chunk(0).to_numpy_ndarray(), a)
    assert tensor.chunk(0).storage.values.buffers()[1].address == np_data_ptr(a)
    strided = a.transpose(0, 2, 1)
    np.testing.assert_array_equal(
        pa.chunked_array(asdlpack(strided)).chunk(0).to_numpy_ndarray(), strided
    )
    bits = pa.chunked_array(asdlpack(np.array([True, False])))
    assert bits.type == pa.bool_() and bits.to_pylist() == [True, False]
    with pytest.raises(TypeError, match="complex64 has no Arrow type"):
        asdlpack(np.zeros(2, np.complex64)).__arrow_c_stream__()
    with pytest.raises(ValueError, match="0-d"):
        asdlpack(np.float64(1.0)).__arrow_c_stream__()


def test_the_stream_honours_or_refuses_the_requested_schema():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    wanted = pa.list_(pa.float32(), 3)
    nested = pa.chunked_array(asdlpack(a), type=wanted)  # pyarrow passes requested_schema
    assert nested.type == wanted and nested.to_pylist() == [[0, 1, 2], [3, 4, 5]]
    capsule = asdlpack(a).__arrow_c_stream__(requested_schema=wanted.__arrow_c_schema__())
    assert pa.ChunkedArray._import_from_c_capsule(capsule).type == wanted
    obj = asdlpack(np.arange(3.0))
    with pytest.raises(ValueError, match="can't be given as the requested Arrow type"):
        pa.chunked_array(obj, type=pa.int64())
    with pytest.raises(TypeError, match="PyCapsule"):
        obj.__arrow_c_stream__(object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'schema'"):
        obj.__arrow_c_stream__(schema=None)
    with pytest.raises(TypeError, match="at most one argument"):
        obj.__arrow_c_stream__(None, None)


def test_device_memory_is_refused():
    obj = asdlpack(CudaArrayInterface(cuda_iface()))
    with pytest.raises(BufferError, match="(?i)cuda"):
        obj.__arrow_c_stream__()
    if torch_cuda_available():
        torch = need("torch")
        with pytest.raises(BufferError, match="copy it to the host"):
            asdlpack(torch.ones(3, device="cuda")).__arrow_c_stream__()


def test_nanoarrow_reads_the_stream():
    na = need("nanoarrow")
    source = np.arange(4.0)
    obj = asdlpack(source)
    chunks = list(na.ArrayStream(obj))
    assert len(chunks) == 1 and chunks[0].to_pylist() == [0, 1, 2, 3]
    stream = na.c_array_stream(obj)
    assert stream.get_schema().format == "g" and stream.get_schema().format == "g"
    array = stream.get_next()
    assert array.length == 4 and array.buffers[1] == np_data_ptr(source)
    with pytest.raises(StopIteration):
        stream.get_next()
    on_thread(stream.release)  # the stream released on another thread; the array lives on
    assert not stream.is_valid() and array.is_valid()
    assert array.view().buffer(1).element(3) == 3.0


def test_polars_takes_the_stream():
    pl = need("polars")
    source = np.arange(4.0)
    # pl.Series prefers __arrow_c_array__ when both are there; through the stream alone:
    series = pl.Series(StreamOnly(asdlpack(source)))
    assert series.dtype == pl.Float64 and series.to_list() == [0, 1, 2, 3]
    assert series.to_numpy().ctypes.data == np_data_ptr(source)
    tensor = pl.Series(StreamOnly(asdlpack(np.arange(6.0).reshape(3, 2))))
    assert tensor.to_list() == [[0, 1], [2, 3], [4, 5]]


def test_duckdb_queries_the_stream():
    duckdb = need("duckdb")
    col = asdlpack(np.arange(10.0))  # noqa: F841 (read by the query: DuckDB prefers streams)
    assert duckdb.sql("SELECT sum(value), count(*) FROM col").fetchall() == [(45.0, 10)]
    tensor = StreamOnly(asdlpack(np.arange(6, dtype=np.int32).reshape(3, 2)))  # noqa: F841
    assert duckdb.sql("SELECT value[2] FROM tensor").fetchall() == [(1,), (3,), (5,)]


def test_the_source_lives_as_long_as_the_stream_or_its_array():
    source = np.arange(1000.0)
    alive = weakref.ref(source)
    capsule = asdlpack(source).__arrow_c_stream__()
    del source
    gc.collect()
    assert alive() is not None  # the unconsumed stream holds it
    del capsule
    gc.collect()
    assert alive() is None  # released with the capsule
    source = np.arange(1000.0)
    alive = weakref.ref(source)
    chunked = pa.chunked_array(asdlpack(source))
    del source
    gc.collect()
    assert alive() is not None and chunked.chunk(0)[999].as_py() == 999.0
    del chunked
    gc.collect()
    assert alive() is None


def test_streams_never_consumed_are_released_once():
    source = np.arange(100.0)
    base = refcount(source)
    obj = asdlpack(source)
    for _ in range(300):
        obj.__arrow_c_stream__()  # dropped unconsumed
        pa.chunked_array(obj)
    # Copies (another layout) too, and capsules dropped on another thread.
    strided = asdlpack(np.arange(10.0)[::2])
    capsules = [strided.__arrow_c_stream__() for _ in range(100)]
    capsules += [obj.__arrow_c_stream__() for _ in range(100)]
    on_thread(capsules.clear)
    del obj
    assert refcount(source) == base


# The stream is driven as a C consumer does: from threads that don't hold the interpreter
# (ctypes lets go of it during foreign calls).
@pytest.mark.parametrize("device", [False, True], ids=["stream", "device_stream"])
def test_a_c_consumer_reads_and_releases_on_threads_without_the_interpreter(device):
    source = np.arange(100.0)
    address, alive = np_data_ptr(source), weakref.ref(source)
    obj = asdlpack(source)
    if device:
        capsule, name = obj.__arrow_c_device_stream__(), b"arrow_device_array_stream"
        Stream, Array = ArrowDeviceArrayStream, ArrowDeviceArray
    else:
        capsule, name = obj.__arrow_c_stream__(), b"arrow_array_stream"
        Stream, Array = ArrowArrayStream, ArrowArray
    assert capsule_name(capsule) == name.decode()
    del source, obj
    # Moved out of the capsule, as consumers take it: the capsule then releases nothing.
    held = Stream.from_address(_pointer(capsule, name))
    stream = Stream.from_buffer_copy(held)
    held.release = None
    del capsule, held
    first, end = Array(), Array()
    at = ctypes.addressof

    def read():
        assert GET_LAST_ERROR(stream.get_last_error)(at(stream)) is None
        assert GET_NEXT(stream.get_next)(at(stream), at(first)) == 0
        assert GET_NEXT(stream.get_next)(at(stream), at(end)) == 0
        assert GET_NEXT(stream.get_next)(at(stream), None) == 22  # EINVAL
        assert b"no ArrowArray" in GET_LAST_ERROR(stream.get_last_error)(at(stream))
        release = RELEASE(stream.release)
        release(at(stream))
        release(at(stream))  # a second release is nothing

    on_thread(read)
    assert stream.release is None and stream.private is None
    if device:  # the CPU's, the array inside
        assert stream.device_type == 1
        assert (first.device_type, first.device_id, first.sync_event) == (1, -1, None)
        first, end = first.array, end.array
    assert end.release is None  # the end of the stream
    assert first.length == 100 and first.buffers[1] == address
    gc.collect()
    assert alive() is not None  # the array handed out holds the source
    on_thread(lambda: RELEASE(first.release)(at(first)))
    assert first.release is None
    gc.collect()
    assert alive() is None


# ---------------------------------------------------------------------------
# The C Device interface: __arrow_c_device_array__ / __arrow_c_device_stream__ of CPU memory
# ---------------------------------------------------------------------------


def test_the_device_array_is_the_array_on_the_cpu():
    torch = need("torch")
    na = need("nanoarrow")
    nd = need("nanoarrow.device")
    t = torch.arange(6, dtype=torch.float32)
    obj = asdlpack(t)
    schema, array = obj.__arrow_c_device_array__()
    assert (capsule_name(schema), capsule_name(array)) == ("arrow_schema", "arrow_device_array")
    device = ArrowDeviceArray.from_address(_pointer(array, b"arrow_device_array"))
    assert (device.device_type, device.device_id, device.sync_event) == (1, -1, None)
    out = pa.Array._import_from_c_device_capsule(schema, array)
    assert out.to_pylist() == [0, 1, 2, 3, 4, 5]
    assert out.buffers()[1].address == t.data_ptr()  # no copy
    # pyarrow.array() prefers the device variant: the same memory.
    assert pa.array(obj).buffers()[1].address == t.data_ptr()
    read = nd.c_device_array(obj)
    assert (read.device_type, read.device_id) == (nd.DeviceType.CPU, -1)
    assert na.Array(read.array).to_pylist() == [0, 1, 2, 3, 4, 5]
    # What the array gives: N-d as a fixed-shape tensor, or nested lists when asked.
    a = np.arange(6.0).reshape(3, 2)
    tensor = pa.Array._import_from_c_device_capsule(*asdlpack(a).__arrow_c_device_array__())
    assert tensor.type.extension_name == "arrow.fixed_shape_tensor"
    np.testing.assert_array_equal(tensor.to_numpy_ndarray(), a)
    nested = pa.list_(pa.float64(), 2)
    out = pa.array(asdlpack(a), type=nested)
    assert out.type == nested and out.to_pylist() == a.tolist()


def test_device_methods_take_future_keywords_only_as_none():
    obj = asdlpack(np.arange(3.0))
    for method in (obj.__arrow_c_device_array__, obj.__arrow_c_device_stream__):
        method(None, sync_event=None)  # a keyword this version lacks, None: taken
        with pytest.raises(NotImplementedError, match="'stream'"):
            method(stream=1)
        with pytest.raises(TypeError, match="at most one"):
            method(None, None)
        with pytest.raises(TypeError, match="multiple values"):
            method(None, requested_schema=None)
    # The plain methods take no other keyword at all.
    with pytest.raises(TypeError, match="unexpected keyword"):
        obj.__arrow_c_array__(stream=None)


def test_device_memory_is_refused_by_the_device_variants():
    obj = asdlpack(CudaArrayInterface(cuda_iface()))
    for method in (obj.__arrow_c_device_array__, obj.__arrow_c_device_stream__):
        with pytest.raises(BufferError, match="(?i)cuda"):
            method()
    if torch_cuda_available():
        torch = need("torch")
        obj = asdlpack(torch.ones(3, device="cuda"))
        for method in (obj.__arrow_c_device_array__, obj.__arrow_c_device_stream__):
            with pytest.raises(BufferError, match="CPU memory only"):
                method()


def test_device_capsules_never_consumed_are_released_once():
    source = np.arange(100.0)
    base = refcount(source)
    obj = asdlpack(source)
    for _ in range(300):
        obj.__arrow_c_device_array__()  # dropped unconsumed
        obj.__arrow_c_device_stream__()
        pa.array(obj)  # consumed
    strided = asdlpack(np.arange(10.0)[::2])  # copies too, dropped on another thread
    capsules = [strided.__arrow_c_device_stream__() for _ in range(100)]
    capsules += [obj.__arrow_c_device_array__() for _ in range(100)]
    on_thread(capsules.clear)
    del obj
    gc.collect()
    assert refcount(source) == base


def test_arrow_exports_alive_at_exit_are_left_without_a_crash():
    # Consumers' arrays, streams and capsules never consumed, of every kind, still held when the
    # interpreter finalizes: their releases run then, or later without it. Run in a child, as a
    # failure is a crash.
    script = textwrap.dedent(
        """
        import numpy as np, pyarrow as pa
        from dlpack import asdlpack
        obj = asdlpack(np.arange(10.0))
        strided = asdlpack(np.arange(10.0)[::2])
        keep = [pa.array(obj), pa.chunked_array(strided), obj.__arrow_c_array__(),
                obj.__arrow_c_stream__(), obj.__arrow_c_device_array__(),
                strided.__arrow_c_device_stream__(),
                pa.Array._import_from_c_device_capsule(*strided.__arrow_c_device_array__())]
        keep.append(keep)  # a cycle, left for the collector at exit
        print("ok")
        """
    )
    done = run_python("-c", script)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_rows_past_arrows_list_size_are_a_value_error_and_misaligned_memory_a_copy():
    # Arrow's fixed-size list sizes are 32-bit: a row of 2**32 elements (none here: 0 rows)
    # must not export as a list of size 0 with a shape of 2**32 in its metadata.
    for shape in ((0, 2**32), (0, 2**16, 2**16), (0, 2**31)):
        wide = asdlpack(np.empty(shape, np.int8))
        for method in ("__arrow_c_array__", "__arrow_c_device_array__", "__arrow_c_stream__"):
            with pytest.raises(ValueError, match="more than an Arrow fixed-size list can"):
                getattr(wide, method)()
    assert pa.array(asdlpack(np.empty((0, 2**31 - 1), np.int8))).type.shape == [2**31 - 1]
    # C-ordered but not aligned to its elements: Arrow wants aligned buffers, so a copy.
    misaligned = np.frombuffer(bytearray(8 * 5 + 1), np.uint8)[1:].view(np.float64)
    misaligned[:] = np.arange(5.0) + 0.5
    assert misaligned.ctypes.data % 8 != 0
    assert pa.array(asdlpack(misaligned)).to_pylist() == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert pa.chunked_array(asdlpack(misaligned)).to_pylist() == [0.5, 1.5, 2.5, 3.5, 4.5]


# ---------------------------------------------------------------------------
# Empty arrays, and the requested fixed-shape tensor type
# ---------------------------------------------------------------------------

EMPTY_SHAPES = ((0,), (3, 0), (0, 2))
EMPTY_DTYPES = ("int8", "uint16", "int32", "int64", "float16", "float32", "float64")


def empty_arrays(dtypes=EMPTY_DTYPES):
    """(label, array) of empty arrays of torch (whose data pointer is NULL), numpy and JAX."""
    torch = need("torch")
    jnp = need("jax.numpy")
    for dtype in dtypes:
        for shape in EMPTY_SHAPES:
            yield f"torch {dtype} {shape}", torch.empty(shape, dtype=getattr(torch, dtype))
            yield f"numpy {dtype} {shape}", np.empty(shape, dtype)
            yield f"jax {dtype} {shape}", jnp.zeros(shape, dtype)


def test_empty_arrays_reach_every_arrow_consumer(x64):
    for name in ("polars", "nanoarrow", "duckdb", "torch", "jax.numpy"):
        need(name)
    check_empty_arrays_in_arrow_consumers(EMPTY_DTYPES)
    for _, source in empty_arrays(("complex128",)):
        with pytest.raises(TypeError, match="complex128 has no Arrow type"):
            pa.array(asdlpack(source))
    # Booleans in a child: bits packed from no bytes at NULL (torch's) may crash.
    done = run_python(
        "-c",
        "from dlpack.tests.test_arrow_out import check_empty_arrays_in_arrow_consumers as check\n"
        "check(('bool',))\n"
        "print('checked')",
    )
    assert done.returncode == 0 and done.stdout.endswith("checked\n"), done.stderr[-3000:]


def check_empty_arrays_in_arrow_consumers(dtypes):
    pl = need("polars")
    na = need("nanoarrow")
    duckdb = need("duckdb")
    for label, source in empty_arrays(dtypes):
        shape, dtype = tuple(source.shape), np.dtype(str(source.dtype).removeprefix("torch."))
        rows = shape[0]
        obj = asdlpack(source)
        leaf = pa.from_numpy_dtype(dtype)
        expected = leaf if len(shape) == 1 else pa.fixed_shape_tensor(leaf, list(shape[1:]))
        for read in (pa.array, pa.chunked_array):
            out = read(obj)
            assert out.type == expected and len(out) == rows, (label, read, out.type)
            out.validate(full=True)
        column = pa.array(obj)
        values = column if len(shape) == 1 else column.storage.values
        # Aligned for the elements (booleans are bits), an address however few bytes.
        address = values.buffers()[1].address
        assert address != 0 and address % dtype.itemsize == 0, (label, address)
        assert len(na.Array(obj)) == rows, label
        assert len(na.ArrayStream(obj).read_all()) == rows, label
        if shape[1:] != (0,):  # polars panics on fixed-size lists of size 0, from pyarrow too
            assert pl.Series(obj).len() == rows, label
        if dtype != np.float16:  # DuckDB has no half floats
            assert duckdb.sql("SELECT count(*) FROM obj").fetchall() == [(rows,)], label


def fixed_shape_tensor_of(obj, wanted, method="__arrow_c_array__"):
    """What ``method`` gives for ``wanted`` as requested_schema, read by pyarrow."""
    out = getattr(obj, method)(wanted.__arrow_c_schema__())
    if method == "__arrow_c_array__":
        return pa.Array._import_from_c_capsule(*out)
    if method == "__arrow_c_device_array__":
        return pa.Array._import_from_c_device_capsule(*out)
    return pa.ChunkedArray._import_from_c_capsule(out).combine_chunks()


def test_a_requested_fixed_shape_tensor_is_given_or_refused_naming_both_types():
    a = np.arange(6.0).reshape(2, 3)
    obj = asdlpack(a)
    methods = ("__arrow_c_array__", "__arrow_c_device_array__", "__arrow_c_stream__")
    # Its own element type, and a shape that is the array's last dimensions (the dimensions
    # before them are the rows) or all their elements in one list: given as asked.
    for wanted, rows in (
        (pa.fixed_shape_tensor(pa.float64(), [3]), a),
        (pa.fixed_shape_tensor(pa.float64(), [2, 3]), a[None]),
        (pa.fixed_shape_tensor(pa.float64(), [6]), a.reshape(1, 6)),
        (pa.fixed_shape_tensor(pa.float64(), [3], dim_names=["x"]), a),
        (pa.fixed_shape_tensor(pa.float64(), [2, 3], permutation=[0, 1]), a[None]),
    ):
        for method in methods:
            out = fixed_shape_tensor_of(obj, wanted, method)
            assert out.type == wanted, (wanted, method, out.type)
            np.testing.assert_array_equal(out.to_numpy_ndarray(), rows)
    # Rows merging the leading dimensions, of a 3-d array.
    cube = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    out = fixed_shape_tensor_of(asdlpack(cube), pa.fixed_shape_tensor(pa.int32(), [4]))
    np.testing.assert_array_equal(out.to_numpy_ndarray(), cube.reshape(6, 4))
    # Anything else, a ValueError naming both types, from every method.
    for wanted, why in (
        (
            pa.fixed_shape_tensor(pa.float32(), [3]),
            "its elements are Float32, this array's Float64",
        ),
        (pa.fixed_shape_tensor(pa.int64(), [3]), "its elements are Int64, this array's Float64"),
        (pa.fixed_shape_tensor(pa.float64(), [2]), r"a row of shape \[2\] is neither"),
        (pa.fixed_shape_tensor(pa.float64(), [3, 2]), r"a row of shape \[3, 2\] is neither"),
        (pa.fixed_shape_tensor(pa.float64(), [3, 2], permutation=[1, 0]), r"permuted \(\[1, 0\]\)"),
    ):
        for method in (*methods, "__arrow_c_device_stream__"):
            with pytest.raises(ValueError, match=r"this array is Float64 of shape \[2, 3\]") as err:
                getattr(obj, method)(wanted.__arrow_c_schema__())
            assert "arrow.fixed_shape_tensor" in str(err.value), err.value
            assert re.search(why, str(err.value)), err.value


def test_pyarrow_array_with_a_fixed_shape_tensor_type_gets_its_values_or_a_value_error():
    a = np.arange(6.0).reshape(2, 3)
    # pyarrow asks for the type (or, as pyarrow 26 does, for its storage, and returns that).
    for shape, rows in (([3], a), ([2, 3], a.reshape(1, 6))):
        wanted = pa.fixed_shape_tensor(pa.float64(), shape)
        for read in (pa.array, pa.chunked_array):
            out = read(asdlpack(a), type=wanted)
            assert out.type in (wanted, wanted.storage_type), (shape, out.type)
            assert out.to_pylist() == rows.tolist() or out.storage.to_pylist() == rows.tolist()
    for leaf, name in ((pa.float32(), "Float32"), (pa.int64(), "Int64")):
        for read in (pa.array, pa.chunked_array):
            with pytest.raises(ValueError, match=f"its elements are {name}, this array's Float64"):
                read(asdlpack(a), type=pa.fixed_shape_tensor(leaf, [3]))


def test_requested_nested_lists_and_columns_follow_the_same_rows():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    obj = asdlpack(a)
    nested = pa.list_(pa.list_(pa.int16(), 3), 2)
    out = pa.array(obj, type=nested)
    assert out.type == nested and out.to_pylist() == [a.tolist()]
    out = pa.array(obj, type=pa.list_(pa.int16(), 6))
    assert out.to_pylist() == [list(range(6))]
    # a column is a 1-D array's alone: flattening would pass rows off as one dimension
    with pytest.raises(ValueError, match="a column is 1-D, and this array has 2 dimensions"):
        pa.array(obj, type=pa.int16())
    out = pa.array(asdlpack(a[0]), type=pa.int16())
    assert out.type == pa.int16() and out.to_pylist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"a row of shape \[2\] is neither"):
        pa.array(obj, type=pa.list_(pa.int16(), 2))
