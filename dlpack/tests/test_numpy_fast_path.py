"""Exact numpy arrays are read from their C struct instead of their ``__dlpack__``: the result
must describe exactly what numpy's own DLPack export does."""

import gc
import sys

import pytest

from dlpack import asdlpack

from ._helpers import need

np = need("numpy")


def _arrays():
    base = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    ro = np.arange(6, dtype=np.int16)
    ro.flags.writeable = False
    yield "c", base
    yield "f", np.asfortranarray(base)
    yield "reversed", base[::-1, :, ::-2]
    yield "strided", base[:, ::2, 1:]
    yield "0-d", np.array(3.5)
    yield "zero-size", np.zeros((4, 0, 2), dtype=np.uint8)
    yield "broadcast", np.broadcast_to(np.arange(3.0), (5, 3))
    yield "read-only", ro
    for dtype in ["?", "i1", "u2", "i4", "u8", "f2", "f4", "c8", "c16"]:
        yield dtype, np.ones((2, 2), dtype=dtype)


@pytest.mark.parametrize("name,array", list(_arrays()), ids=[n for n, _ in _arrays()])
def test_struct_read_matches_numpys_dlpack_export(name, array):
    ours = asdlpack(array)
    theirs = asdlpack(array.__dlpack__(max_version=(1, 0)))  # numpy's own description
    assert ours.shape == theirs.shape
    assert ours.dtype == theirs.dtype
    assert ours.readonly == theirs.readonly
    assert ours.data_ptr == theirs.data_ptr
    if array.size:
        assert ours.strides == theirs.strides
    assert np.array_equal(np.from_dlpack(ours), array)


def test_fast_path_keeps_the_array_alive_and_releases_it():
    a = np.arange(5.0)
    baseline = sys.getrefcount(a)
    obj = asdlpack(a)
    assert sys.getrefcount(a) == baseline + 1
    view = np.from_dlpack(obj)
    del obj
    gc.collect()
    view[0] = 9
    assert a[0] == 9
    del view
    gc.collect()
    assert sys.getrefcount(a) == baseline


def test_subclasses_take_the_general_path():
    m = np.arange(4.0).view(np.recarray)
    assert np.array_equal(np.from_dlpack(asdlpack(m)), np.arange(4.0))


def test_a_class_named_numpy_ndarray_is_not_read_as_one():
    """Only numpy's own ndarray type has its struct: a class made under its name is asked for
    its protocols, not read as an array."""
    asdlpack(np.zeros(3))  # the struct's layout is known from here on
    fake = type("ndarray", (), {"__module__": "numpy"})
    for _ in range(100):
        with pytest.raises(TypeError, match="supports none"):
            asdlpack(fake())


def test_unsupported_dtypes_still_raise_numpys_error():
    with pytest.raises(BufferError):
        asdlpack(np.array(["x"]))
    with pytest.raises(BufferError):
        asdlpack(np.array([object()]))


def test_copy_of_a_view_larger_than_memory_raises():
    """A broadcast view can describe more bytes than exist: its copy is an error, not a crash."""
    huge = np.broadcast_to(np.zeros(1, dtype=np.uint8), (2**62,))
    obj = asdlpack(huge)
    assert obj.nbytes == 2**62
    with pytest.raises(MemoryError, match="can't allocate"):
        obj.__dlpack__(max_version=(1, 3), copy=True)
    cell = np.zeros(1)

    class Wider:  # numpy refuses to make this view itself
        __array_interface__ = {
            "version": 3,
            "shape": (2**60, 4),
            "strides": (0, 0),
            "typestr": "<f8",
            "data": (cell.ctypes.data, False),
        }

    obj = asdlpack(Wider())
    assert obj.nbytes == 2**63 - 1  # saturated: 2**65 bytes don't fit in the count
    with pytest.raises(MemoryError, match="can't allocate"):
        obj.__dlpack__(max_version=(1, 3), copy=True)
