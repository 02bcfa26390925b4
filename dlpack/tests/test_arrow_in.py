"""The Arrow PyCapsule interface in: pyarrow, polars, pandas, DuckDB and nanoarrow columns and
tables through asdlpack, against what those libraries say the values are; their C Device
interface variants for CPU memory."""

from __future__ import annotations

import ctypes
import gc
import threading

import pytest

from dlpack import asdlpack

from ._helpers import need

pa = need("pyarrow")
np = need("numpy")


def values(obj):
    return np.from_dlpack(asdlpack(obj))


class DeviceOnly:
    """Forwards only the Arrow C Device interface's methods of ``inner`` (pyarrow, nanoarrow
    and ours speak them), so that nothing else is read."""

    def __init__(self, inner, edit=None):
        self._inner, self._edit = inner, edit

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        pair = self._inner.__arrow_c_device_array__(requested_schema, **kwargs)
        if self._edit:
            self._edit(pair[1], b"arrow_device_array")
        return pair

    def __arrow_c_device_stream__(self, requested_schema=None, **kwargs):
        capsule = self._inner.__arrow_c_device_stream__(requested_schema, **kwargs)
        if self._edit:
            self._edit(capsule, b"arrow_device_array_stream")
        return capsule


_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def on_cuda(capsule, name):
    """Rewrite an exported device array's or stream's device type as CUDA's (2): a producer that
    says its memory is on a GPU (its device_type field: after the 80-byte ArrowArray in an
    ArrowDeviceArray, first in an ArrowDeviceArrayStream)."""
    offset = 88 if name == b"arrow_device_array" else 0
    ctypes.c_int32.from_address(_pointer(capsule, name) + offset).value = 2


def test_primitive_columns_are_served_in_place_with_their_offset():
    for dtype in ("int8", "uint16", "int32", "uint64", "float16", "float32", "float64"):
        source = np.arange(10).astype(dtype)
        array = pa.array(source)
        out = values(array.slice(3, 5))
        assert out.dtype == source.dtype
        np.testing.assert_array_equal(out, source[3:8])
        assert not out.flags.writeable  # Arrow memory is immutable
    array = pa.array(np.arange(6.0))
    obj = asdlpack(array.slice(2))
    assert obj.data_ptr == array.buffers()[1].address + 2 * 8


def test_fixed_size_lists_are_nd_and_fixed_shape_tensors_keep_their_permutation():
    nested = pa.array(
        [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]],
        pa.list_(pa.list_(pa.int32(), 2), 2),
    )
    np.testing.assert_array_equal(values(nested), np.arange(1, 13).reshape(3, 2, 2))
    np.testing.assert_array_equal(values(nested.slice(1)), np.arange(5, 13).reshape(2, 2, 2))
    tensors = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    fst = pa.FixedShapeTensorArray.from_numpy_ndarray(tensors)
    np.testing.assert_array_equal(values(fst), tensors)
    typ = pa.fixed_shape_tensor(pa.float32(), [3, 2], permutation=[1, 0])
    storage = pa.array([list(range(6)), list(range(6, 12))], pa.list_(pa.float32(), 6))
    permuted = pa.ExtensionArray.from_storage(typ, storage)
    out = values(permuted)
    np.testing.assert_array_equal(out, permuted.to_numpy_ndarray())
    assert out.shape == (2, 2, 3)


def test_booleans_are_one_copy_into_bytes():
    bits = pa.array([True, False, True, True, False, False, True, False, True])
    np.testing.assert_array_equal(values(bits.slice(1)), bits.to_numpy(zero_copy_only=False)[1:])
    obj = asdlpack(bits)
    assert obj.copy_reason == "Arrow booleans are bits: one copy makes them bytes"
    assert not obj.readonly  # the copy is the object's own
    chunked = pa.chunked_array([[True], [False, True]])
    assert "2 chunks of booleans" in asdlpack(chunked).copy_reason
    np.testing.assert_array_equal(values(chunked), [True, False, True])


def test_nulls_are_refused_naming_how_many_and_only_where_addressed():
    with_nulls = pa.array([1.0, None, 3.0, None])
    with pytest.raises(BufferError, match="has 2 nulls.*fill_null"):
        asdlpack(with_nulls)
    np.testing.assert_array_equal(values(with_nulls.slice(2, 1)), [3.0])
    # A validity bitmap without nulls is fine.
    np.testing.assert_array_equal(values(pa.array([1.0, None]).fill_null(0.0)), [1.0, 0.0])


def test_other_types_are_a_type_error_naming_the_arrow_type():
    cases = {
        "Utf8": pa.array(["a"]),
        "Dictionary": pa.array(["a"]).dictionary_encode(),
        "Decimal128": pa.array([1], pa.decimal128(5, 2)),
        "List": pa.array([[1, 2]]),
    }
    for name, array in cases.items():
        with pytest.raises(TypeError, match=name):
            asdlpack(array)


def test_streams_chunked_arrays_and_tables():
    chunked = pa.chunked_array([[1.0, 2.0], [3.0]])
    np.testing.assert_array_equal(values(chunked), [1.0, 2.0, 3.0])
    one = pa.chunked_array([np.arange(4.0)])
    obj = asdlpack(one)
    assert obj.data_ptr == one.chunk(0).buffers()[1].address  # one chunk: in place
    assert obj.copy_reason is None and obj.readonly
    assert asdlpack(chunked).copy_reason == "the Arrow stream has 2 chunks: one copy joins them"
    empty = asdlpack(pa.chunked_array([], pa.float64()))
    assert (
        empty.shape == (0,)
        and empty.copy_reason == "the Arrow stream has no chunks: a new empty array"
    )
    table = pa.table({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    np.testing.assert_array_equal(values(table), [[1, 4], [2, 5], [3, 6]])
    np.testing.assert_array_equal(values(table.slice(1)), [[2, 5], [3, 6]])
    assert asdlpack(table).copy_reason == "an Arrow table of 2 columns: one rows x columns copy"
    with pytest.raises(TypeError, match='column "b" is int64'):
        asdlpack(pa.table({"a": [1.0], "b": [1]}))
    with pytest.raises(TypeError, match='column "s".*Utf8'):
        asdlpack(pa.table({"s": ["x"]}))
    # A raw stream capsule.
    np.testing.assert_array_equal(values(chunked.__arrow_c_stream__()), [1.0, 2.0, 3.0])


def test_a_failing_stream_is_a_value_error_with_the_producers_message():
    schema = pa.schema([("x", pa.float64())])

    def batches():
        yield pa.record_batch([pa.array([1.0])], schema=schema)
        raise RuntimeError("the source went away")

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    with pytest.raises(ValueError, match="next array.*the source went away"):
        asdlpack(reader)


def test_polars_pandas_duckdb_and_nanoarrow():
    pl = need("polars")
    pd = need("pandas")
    duckdb = need("duckdb")
    na = need("nanoarrow")
    torch = need("torch")
    series = pl.Series(np.arange(5.0))
    t = torch.from_dlpack(asdlpack(series))
    assert t.tolist() == [0, 1, 2, 3, 4]
    assert asdlpack(series).data_ptr == series.to_numpy().ctypes.data  # in place
    np.testing.assert_array_equal(
        values(pl.DataFrame({"a": [1, 2], "b": [3, 4]})), [[1, 3], [2, 4]]
    )
    with pytest.raises(BufferError, match="1 null"):
        asdlpack(pl.Series([1.0, None]))
    np.testing.assert_array_equal(values(pd.Series([1.5, 2.5])), [1.5, 2.5])
    np.testing.assert_array_equal(values(pd.DataFrame({"x": [1, 2]})), [[1], [2]])
    result = duckdb.sql("select range::DOUBLE as x from range(4)")
    np.testing.assert_array_equal(values(result), [[0], [1], [2], [3]])
    np.testing.assert_array_equal(values(na.c_array([1, 2, 3], na.int64())), [1, 2, 3])


def test_numpy_array_protocol_is_the_last_resort_without_copies():
    class Wrapper:
        def __init__(self, array):
            self.array = array

        def __array__(self, dtype=None, copy=None):
            if copy is False and not self.array.flags.c_contiguous:
                raise ValueError("Wrapper can't give this without a copy")
            return self.array

    base = np.arange(6.0)
    obj = asdlpack(Wrapper(base))
    assert obj.data_ptr == base.ctypes.data
    with pytest.raises(ValueError, match="without a copy"):
        asdlpack(Wrapper(np.arange(6.0)[::2]))


@pytest.mark.parametrize("wrap", [None, DeviceOnly], ids=["as_is", "device_array"])
def test_release_runs_once_consumed_or_not_on_any_thread(wrap):
    def fresh():  # memory from pyarrow's pool, which counts it
        array = pa.array(range(1000), pa.float64())
        return wrap(array) if wrap else array

    base = pa.total_allocated_bytes()
    array = fresh()
    for _ in range(200):
        asdlpack(array)  # never consumed
        np.from_dlpack(asdlpack(array))  # consumed
    del array
    holders = [np.from_dlpack(asdlpack(fresh())) for _ in range(20)]
    assert pa.total_allocated_bytes() > base
    thread = threading.Thread(target=holders.clear)  # released on another thread
    thread.start()
    thread.join()
    gc.collect()
    assert pa.total_allocated_bytes() == base
    # A stream's one chunk, served in place, is released the same way.
    for _ in range(200):
        asdlpack(pa.chunked_array([pa.array(range(1000), pa.float64())]))
        np.from_dlpack(asdlpack(pa.chunked_array([pa.array(range(1000), pa.float64())])))
    gc.collect()
    assert pa.total_allocated_bytes() == base
    # The memory lives as long as something can reach it, and no longer.
    obj = asdlpack(fresh())
    gc.collect()
    assert pa.total_allocated_bytes() > base
    assert np.from_dlpack(obj)[999] == 999.0
    del obj
    gc.collect()
    assert pa.total_allocated_bytes() == base


def test_the_device_interface_of_cpu_memory_is_read_in_place():
    na = need("nanoarrow")
    nd = need("nanoarrow.device")
    array = pa.array(np.arange(8.0)).slice(2, 4)
    obj = asdlpack(DeviceOnly(array))
    assert obj.data_ptr == array.buffers()[1].address + 2 * 8  # in place, offset honoured
    np.testing.assert_array_equal(np.from_dlpack(obj), [2, 3, 4, 5])
    # nanoarrow's device arrays (which also speak __arrow_c_array__: the device one is read).
    device = nd.c_device_array(pa.array([1, 2, 3], pa.int32()))
    np.testing.assert_array_equal(values(device), [1, 2, 3])
    np.testing.assert_array_equal(values(nd.c_device_array(na.c_array([1.5], na.float64()))), [1.5])
    # What the plain interface makes of other arrays, the device one makes too.
    np.testing.assert_array_equal(values(DeviceOnly(pa.array([True, False]))), [True, False])
    batch = pa.record_batch({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    np.testing.assert_array_equal(values(DeviceOnly(batch)), [[1, 3], [2, 4]])
    with pytest.raises(BufferError, match="1 null"):
        asdlpack(DeviceOnly(pa.array([1.0, None])))
    with pytest.raises(TypeError, match="Utf8"):
        asdlpack(DeviceOnly(pa.array(["x"])))
    # A device stream (ours: pyarrow and nanoarrow make none) and its raw capsule.
    source = np.arange(6.0).reshape(2, 3)
    stream = DeviceOnly(asdlpack(source))
    np.testing.assert_array_equal(values(stream), source)
    assert asdlpack(stream).data_ptr == source.ctypes.data
    capsule = asdlpack(source).__arrow_c_device_stream__()
    np.testing.assert_array_equal(values(capsule), source)


def test_memory_of_another_device_is_refused_before_it_is_read_and_released():
    def fresh():  # memory from pyarrow's pool, which counts it
        return pa.array(range(1000), pa.float64())

    base = pa.total_allocated_bytes()
    for _ in range(50):
        with pytest.raises(BufferError, match=r"memory of cuda:-1 \(Arrow device type 2\)"):
            asdlpack(DeviceOnly(fresh(), edit=on_cuda))
    gc.collect()
    assert pa.total_allocated_bytes() == base  # each refused array was released
    source = np.arange(4.0)
    count = __import__("sys").getrefcount(source)
    for _ in range(50):
        with pytest.raises(BufferError, match="device type 2"):
            asdlpack(DeviceOnly(asdlpack(source), edit=on_cuda))
    gc.collect()
    assert __import__("sys").getrefcount(source) == count  # each refused stream was released


def test_a_capsule_of_the_wrong_kind_is_a_type_error():
    array = pa.array([1.0, 2.0])

    class Mixed:  # plain capsules from the device methods, and the other way round
        def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
            return array.__arrow_c_array__()

        def __arrow_c_device_stream__(self, requested_schema=None, **kwargs):
            return pa.chunked_array([array]).__arrow_c_stream__()

    class NotACapsule:
        def __arrow_c_stream__(self, requested_schema=None):
            return 1

    with pytest.raises(TypeError, match='device array must come in a PyCapsule named "arrow_dev'):
        asdlpack(Mixed())
    with pytest.raises(TypeError, match='stream must come in a PyCapsule named "arrow_array_st'):
        asdlpack(NotACapsule())
    del Mixed.__arrow_c_device_array__
    with pytest.raises(TypeError, match='named "arrow_device_array_stream"'):
        asdlpack(Mixed())
