"""The Arrow PyCapsule interface out: a DLPackObject handed to pyarrow and polars."""

from __future__ import annotations

import gc

import pytest

from dlpack import asdlpack

from ._helpers import need

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
