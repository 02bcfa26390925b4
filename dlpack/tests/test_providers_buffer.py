"""Buffer-protocol producers asdlpack accepts (bytes, bytearray, array.array, mmap, memoryview
slices, PEP 3118 formats), checked through numpy.from_dlpack."""

import array
import ctypes
import mmap
import sys

import pytest

from dlpack import asdlpack

from ._helpers import (
    FLAG_READ_ONLY,
    CapsuleInfo,
    buffer_addr,
    check_view,
    need,
)

np = need("numpy")

# ---------------------------------------------------------------------------
# buffer protocol
# ---------------------------------------------------------------------------


def test_bytes():
    src = b"\x00\x01\x02\xff"
    obj = asdlpack(src)
    out = check_view(obj, np.frombuffer(src, dtype=np.uint8), readonly=True)
    with pytest.raises(ValueError):
        out[0] = 1


def test_empty_bytes():
    obj = asdlpack(b"")
    assert obj.shape == (0,)
    assert obj.nbytes == 0
    assert np.from_dlpack(obj).shape == (0,)


def test_bytearray_shares_memory():
    src = bytearray(range(10))
    obj = asdlpack(src)
    out = check_view(obj, np.frombuffer(src, dtype=np.uint8), readonly=False)
    out[3] = 200
    assert src[3] == 200
    src[4] = 77
    assert out[4] == 77


def test_memoryview_slice():
    src = bytearray(range(16))
    obj = asdlpack(memoryview(src)[5:11])
    assert obj.data_ptr == buffer_addr(src) + 5
    out = check_view(obj, np.frombuffer(src, dtype=np.uint8)[5:11], readonly=False)
    out[0] = 99
    assert src[5] == 99


def test_memoryview_readonly_of_bytearray():
    src = bytearray(range(8))
    obj = asdlpack(memoryview(src).toreadonly())
    check_view(obj, np.frombuffer(src, dtype=np.uint8), readonly=True)


@pytest.mark.parametrize(
    "fmt, dtype",
    [
        ("b", "int8"),
        ("B", "uint8"),
        ("h", "int16"),
        ("H", "uint16"),
        ("i", "int32"),
        ("I", "uint32"),
        ("l", "int64" if ctypes.sizeof(ctypes.c_long) == 8 else "int32"),
        ("L", "uint64" if ctypes.sizeof(ctypes.c_long) == 8 else "uint32"),
        ("q", "int64"),
        ("Q", "uint64"),
        ("n", "int64" if sys.maxsize > 2**32 else "int32"),
        ("N", "uint64" if sys.maxsize > 2**32 else "uint32"),
        ("f", "float32"),
        ("d", "float64"),
        ("?", "bool"),
    ],
)
def test_memoryview_cast_formats(fmt, dtype):
    src = bytearray(64)
    mv = memoryview(src).cast(fmt)
    obj = asdlpack(mv)
    assert obj.dtype == dtype
    ref = np.frombuffer(src, dtype=dtype)
    check_view(obj, ref, readonly=False)


def test_memoryview_multidim():
    src = bytearray(range(24))
    mv = memoryview(src).cast("B", shape=[2, 3, 4])
    obj = asdlpack(mv)
    assert obj.shape == (2, 3, 4)
    assert obj.strides == (12, 4, 1)
    check_view(obj, np.frombuffer(src, dtype=np.uint8).reshape(2, 3, 4), readonly=False)


def test_memoryview_multidim_int():
    src = bytearray(48)
    mv = memoryview(src).cast("i", shape=[4, 3])
    obj = asdlpack(mv)
    assert obj.strides == (3, 1)
    check_view(obj, np.frombuffer(src, dtype=np.int32).reshape(4, 3))


def test_memoryview_noncontiguous():
    src = bytearray(range(20))
    obj = asdlpack(memoryview(src)[::2])
    assert obj.shape == (10,)
    assert obj.strides == (2,)
    out = check_view(obj, np.frombuffer(src, dtype=np.uint8)[::2], readonly=False)
    out[1] = 111
    assert src[2] == 111


def test_memoryview_negative_stride():
    src = bytearray(range(10))
    obj = asdlpack(memoryview(src)[::-3])
    assert obj.strides == (-3,)
    assert obj.data_ptr == buffer_addr(src) + 9
    check_view(obj, np.frombuffer(src, dtype=np.uint8)[::-3])


def test_memoryview_of_numpy_views():
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    for view in [base[::2, 1::3], base[::-1], base.T, base[:, ::-2], base[2:3, 4:5]]:
        obj = asdlpack(memoryview(view))
        check_view(obj, view, readonly=False)


def test_memoryview_complex_formats():
    for dt in ["complex64", "complex128"]:
        a = (np.arange(6) + 1j * np.arange(6)).astype(dt)
        mv = memoryview(a)
        assert mv.format in ("Zf", "Zd")
        obj = asdlpack(mv)
        assert obj.dtype == dt
        check_view(obj, a)


@pytest.mark.parametrize("typecode", list("bBhHiIlLqQfd"))
def test_array_array(typecode):
    values = [0, 1, 2, 3, 100, 7]
    src = array.array(typecode, values)
    obj = asdlpack(src)
    ref = np.frombuffer(src, dtype=memoryview(src).format)
    out = check_view(obj, ref, readonly=False)
    np.testing.assert_array_equal(out, values)
    out[0] = 42
    assert src[0] == 42


def test_mmap_writable():
    m = mmap.mmap(-1, 4096)
    m[:4] = b"\x01\x02\x03\x04"
    obj = asdlpack(m)
    assert obj.shape == (4096,)
    assert obj.readonly is False
    out = np.from_dlpack(obj)
    assert out.flags.writeable
    np.testing.assert_array_equal(out[:4], [1, 2, 3, 4])
    out[5] = 9
    assert m[5] == 9
    # an exported mmap can't be closed while views of it are alive
    with pytest.raises(BufferError):
        m.close()
    del out, obj
    import gc

    gc.collect()
    m.close()


def test_mmap_readonly(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(64)))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    obj = asdlpack(m)
    assert obj.readonly is True
    out = np.from_dlpack(obj)
    assert out.flags.writeable is False
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.uint8))
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 0)))
    assert info.flags & FLAG_READ_ONLY
    legacy = obj.__dlpack__()  # a legacy capsule can't say read-only: a copy
    assert CapsuleInfo(legacy).first_element != obj.data_ptr
    assert ctypes.string_at(CapsuleInfo(legacy).first_element, 64) == bytes(range(64))
    with pytest.raises(BufferError):
        obj.__dlpack__(copy=False)
    del out, obj, info, legacy
    import gc

    gc.collect()
    m.close()


@pytest.mark.parametrize("mode", ["w+", "r+", "r", "c"])
def test_numpy_memmap(tmp_path, mode):
    path = tmp_path / "mm.bin"
    np.arange(12, dtype=np.float32).tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode=mode, shape=(3, 4))
    if mode == "w+":
        mm[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    obj = asdlpack(mm)
    readonly = mode == "r"
    out = check_view(obj, mm, readonly=readonly)
    if not readonly:
        out[0, 0] = -5
        assert mm[0, 0] == -5
    del out, obj, mm


def test_ctypes_1d():
    src = (ctypes.c_int32 * 4)(1, 2, 3, 4)
    obj = asdlpack(src)
    assert obj.dtype == "int32"
    assert obj.data_ptr == ctypes.addressof(src)
    out = check_view(obj, np.ctypeslib.as_array(src), readonly=False)
    out[2] = 30
    assert src[2] == 30


def test_ctypes_2d():
    src = ((ctypes.c_int32 * 3) * 2)()
    for i in range(2):
        for j in range(3):
            src[i][j] = 10 * i + j
    obj = asdlpack(src)
    assert obj.shape == (2, 3)
    assert obj.strides == (3, 1)
    out = check_view(obj, np.ctypeslib.as_array(src))
    np.testing.assert_array_equal(out, [[0, 1, 2], [10, 11, 12]])


@pytest.mark.parametrize(
    "ctype, dtype",
    [
        (ctypes.c_double, "float64"),
        (ctypes.c_float, "float32"),
        (ctypes.c_uint8, "uint8"),
        (ctypes.c_int16, "int16"),
        (ctypes.c_uint64, "uint64"),
        (ctypes.c_int64, "int64"),
        (ctypes.c_bool, "bool"),
    ],
)
def test_ctypes_scalar_types(ctype, dtype):
    src = (ctype * 5)(*([1] * 5))
    obj = asdlpack(src)
    assert obj.dtype == dtype
    assert obj.data_ptr == ctypes.addressof(src)
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, np.ones(5, dtype=dtype))
