"""``_from_buffer``: a DLPackObject of elements laid out in another object's flat memory, as
sharing and unpickling build them, checked against numpy's views of the same memory."""

import gc
import mmap
import sys
import weakref

import pytest

from dlpack._dlpack import ELEMENT_TYPES, _from_buffer

from ._helpers import need

np = need("numpy")


def _view(memory, offset, shape, strides, dtype="float32", readonly=False):
    typestr = ELEMENT_TYPES[dtype][0]
    return _from_buffer(memory, offset, shape, strides, typestr, dtype, readonly)


@pytest.mark.parametrize(
    "offset, shape, strides",
    [
        (0, (4, 6), None),
        (8, (3, 4), (24, 4)),
        (4, (6, 4), (4, 24)),  # Fortran order
        (92, (6,), (-8,)),  # reversed
        (16, (2, 3, 2), (48, 8, 4)),
        (0, (0, 5), None),
        (96, (), None),  # a scalar, the last element
    ],
)
def test_same_elements_and_address_as_numpy(offset, shape, strides):
    memory = bytearray(np.arange(25, dtype=np.float32).tobytes())
    obj = _view(memory, offset, shape, strides)
    expected = np.ndarray(shape, np.float32, memory, offset, strides)
    got = np.from_dlpack(obj)
    np.testing.assert_array_equal(got, expected)
    assert obj.shape == shape and obj.dtype == "float32" and not obj.readonly
    if expected.size:
        assert obj.data_ptr == expected.ctypes.data
    got[...] = 7  # writable: writes land in the memory
    assert expected.size == 0 or np.all(expected == 7)


def test_opaque_and_swapped_element_types():
    memory = bytearray(range(16))
    assert _view(memory, 0, (8,), None, "bfloat16").dtype == "bfloat16"
    other = ">" if sys.byteorder == "little" else "<"
    obj = _from_buffer(memory, 0, (4,), None, f"{other}i4", "int32", False)
    assert obj.copy_reason is not None  # the other byte order: exports copy
    expected = np.frombuffer(bytes(memory), f"{other}i4")
    np.testing.assert_array_equal(np.from_dlpack(obj), expected)


def test_read_only_when_asked_or_when_the_memory_is():
    assert _view(bytearray(8), 0, (2,), None, readonly=True).readonly
    assert _view(b"\0" * 8, 0, (2,), None, readonly=False).readonly
    view = np.from_dlpack(_view(b"\0" * 8, 0, (2,), None))
    assert not view.flags.writeable


def test_elements_outside_the_memory_are_refused():
    memory = bytearray(16)
    for offset, shape, strides in [(4, (4,), None), (-4, (2,), None), (0, (2,), (-4,))]:
        with pytest.raises(ValueError, match="outside"):
            _view(memory, offset, shape, strides)
    with pytest.raises(ValueError, match="outside"):
        _view(memory, 17, (0,), None)
    with pytest.raises(ValueError, match="does not spell"):
        _from_buffer(memory, 0, (2,), None, "<i4", "float32", False)
    with pytest.raises(ValueError, match="unknown element type"):
        _from_buffer(memory, 0, (2,), None, "<f4", "float31", False)
    with pytest.raises(ValueError, match="flat"):
        _view(memoryview(memory)[::2], 0, (1,), None)
    with pytest.raises(TypeError):
        _view(object(), 0, (1,), None)


def test_keeps_the_memory_alive():
    mapping = mmap.mmap(-1, 4096)
    mapping[:4] = np.float32(3.5).tobytes()
    obj = _view(mapping, 0, (1,), None)
    with pytest.raises(BufferError):
        mapping.close()  # exported: it can't be unmapped under the view
    assert np.from_dlpack(obj)[0] == 3.5

    class Memory(bytearray):
        pass

    memory = Memory(8)
    ref = weakref.ref(memory)
    obj = _view(memory, 0, (2,), None)
    del memory
    gc.collect()
    assert ref() is not None
    del obj
    gc.collect()
    assert ref() is None
