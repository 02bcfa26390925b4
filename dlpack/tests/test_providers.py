"""Every kind of producer asdlpack accepts, checked through numpy.from_dlpack."""

import array
import ctypes
import mmap
import sys

import pytest

from dlpack import DLPackObject, asdlpack, copyto

from ._helpers import (
    FLAG_READ_ONLY,
    ArrayInterface,
    ArrayStruct,
    BothArrayInterfaces,
    CapsuleInfo,
    CudaArrayInterface,
    DLPackProducer,
    array_interface_of,
    capsule_name,
    contiguous_strides,
    cuda_iface,
    element_strides,
    need,
    np_data_ptr,
    torch_cuda_available,
)

np = need("numpy")


def _addr(buf) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def check_view(obj, ref, *, readonly=None, check_ptr=True):
    """``obj`` (a DLPackObject) describes exactly the memory of numpy view ``ref``."""
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
    assert obj.data_ptr == _addr(src) + 5
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
    assert obj.data_ptr == _addr(src) + 9
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


# ---------------------------------------------------------------------------
# numpy arrays (through numpy's own __dlpack__)
# ---------------------------------------------------------------------------


def _numpy_layouts():
    a = np.arange(120, dtype=np.int32).reshape(4, 5, 6)
    return {
        "contiguous": a,
        "0d": np.array(3.5),
        "zero-size": np.zeros((0, 3), dtype=np.float32),
        "zero-size-mid": np.zeros((2, 0, 3), dtype=np.int16),
        "reversed": np.arange(10, dtype=np.float64)[::-1],
        "reversed-2d": a[::-1, :, ::-2],
        "broadcast": np.broadcast_to(np.arange(3, dtype=np.int64), (4, 3)),
        "broadcast-col": np.broadcast_to(np.arange(4.0).reshape(4, 1), (4, 5)),
        "fortran": np.asfortranarray(a),
        "strided": a[::2, 1::3],
        "transposed": a.transpose(2, 0, 1),
        "single": a[1:2, 2:3, 3:4],
        "readonly": np.frombuffer(b"abcdefgh", dtype=np.uint16),
    }


@pytest.mark.parametrize("name", list(_numpy_layouts()))
def test_numpy_layouts(name):
    ref = _numpy_layouts()[name]
    obj = asdlpack(ref)
    check_view(obj, ref, readonly=not ref.flags.writeable)


def test_numpy_broadcast_strides_are_zero():
    ref = np.broadcast_to(np.arange(3, dtype=np.int64), (4, 3))
    obj = asdlpack(ref)
    assert obj.strides == (0, 1)
    assert obj.readonly is True
    assert obj.nbytes == 12 * 8


def test_numpy_negative_strides_data_ptr():
    base = np.arange(10, dtype=np.float64)
    obj = asdlpack(base[::-1])
    assert obj.strides == (-1,)
    assert obj.data_ptr == np_data_ptr(base) + 9 * 8


def test_numpy_0d():
    obj = asdlpack(np.array(7, dtype=np.int16))
    assert obj.shape == ()
    assert obj.strides == ()
    assert obj.ndim == 0
    assert obj.nbytes == 2
    assert np.from_dlpack(obj) == 7


def test_numpy_write_both_ways():
    src = np.zeros((3, 4), dtype=np.float64)
    out = np.from_dlpack(asdlpack(src[:, 1::2]))
    out[0, 0] = 1.5
    assert src[0, 1] == 1.5
    src[2, 3] = -2
    assert out[2, 1] == -2


# ---------------------------------------------------------------------------
# __array_interface__ / __array_struct__ only
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["contiguous", "strided", "reversed-2d", "fortran", "0d"])
def test_array_interface_only(name):
    ref = _numpy_layouts()[name]
    obj = asdlpack(ArrayInterface(array_interface_of(ref), owner=ref))
    check_view(obj, ref, readonly=False)


def test_array_interface_readonly_flag():
    ref = np.arange(6, dtype=np.uint8)
    ref.flags.writeable = False
    iface = array_interface_of(ref)
    assert iface["data"][1] is True
    obj = asdlpack(ArrayInterface(iface, owner=ref))
    check_view(obj, ref, readonly=True)


def test_array_interface_strides_none_is_c_contiguous():
    ref = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    iface = array_interface_of(ref, strides=None)
    obj = asdlpack(ArrayInterface(iface, owner=ref))
    assert obj.strides == contiguous_strides((2, 3, 4))
    check_view(obj, ref)


def test_array_interface_minimal_dict():
    ref = np.arange(6, dtype=np.int64)
    iface = {"shape": (6,), "typestr": "<i8", "data": (np_data_ptr(ref), False), "version": 3}
    obj = asdlpack(ArrayInterface(iface, owner=ref))
    check_view(obj, ref, readonly=False)


def test_array_interface_keeps_interface_object_alive():
    ref = np.arange(6, dtype=np.int64)
    holder = ArrayInterface(array_interface_of(ref), owner=ref)
    obj = asdlpack(holder)
    del holder, ref
    import gc

    gc.collect()
    np.testing.assert_array_equal(np.from_dlpack(obj), np.arange(6))


def test_array_interface_data_is_buffer():
    buf = bytearray(np.arange(6, dtype=np.int32).tobytes())
    iface = {"shape": (2, 3), "typestr": "<i4", "data": buf, "version": 3}
    obj = asdlpack(ArrayInterface(iface))
    assert obj.data_ptr == _addr(buf)
    assert obj.readonly is False
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))
    out[1, 2] = 99
    assert np.frombuffer(buf, dtype=np.int32)[5] == 99


def test_array_interface_data_is_buffer_with_offset():
    buf = bytearray(np.arange(6, dtype=np.int32).tobytes())
    iface = {"shape": (4,), "typestr": "<i4", "data": buf, "offset": 8, "version": 3}
    obj = asdlpack(ArrayInterface(iface))
    assert obj.data_ptr == _addr(buf) + 8
    np.testing.assert_array_equal(np.from_dlpack(obj), [2, 3, 4, 5])


def test_array_interface_data_is_readonly_buffer():
    buf = np.arange(4, dtype=np.float64).tobytes()
    iface = {"shape": (4,), "typestr": "<f8", "data": buf, "version": 3}
    obj = asdlpack(ArrayInterface(iface))
    assert obj.readonly is True
    out = np.from_dlpack(obj)
    assert out.flags.writeable is False
    np.testing.assert_array_equal(out, [0, 1, 2, 3])


def test_array_interface_data_none_uses_own_buffer():
    class SelfBuffer(bytearray):
        @property
        def __array_interface__(self):
            return {"shape": (2, 2), "typestr": "<i2", "data": None, "version": 3}

    src = SelfBuffer(np.arange(4, dtype=np.int16).tobytes())
    obj = asdlpack(src)
    assert obj.shape == (2, 2)
    assert obj.dtype == "int16"
    assert obj.data_ptr == _addr(src)
    np.testing.assert_array_equal(np.from_dlpack(obj), [[0, 1], [2, 3]])


def _fidelity_cases():
    """(name, interface dict, owner) pairs read the same way by numpy and by asdlpack."""
    base = np.arange(12, dtype=np.int32)
    ptr = np_data_ptr(base)
    buf = bytearray(base.tobytes())
    frozen = bytes(base.tobytes())
    i64 = np.int64
    return [
        ("offset-into-buffer", {"shape": (4,), "typestr": "<i4", "data": buf, "offset": 8}, buf),
        ("offset-into-bytes", {"shape": (3,), "typestr": "<i4", "data": frozen, "offset": 4}, 0),
        (
            "offset-ignored-with-pointer",
            {"shape": (4,), "typestr": "<i4", "offset": 8, "data": (ptr, False)},
            base,
        ),
        (
            "numpy-int-shape",
            {"shape": (i64(3), i64(4)), "typestr": "<i4", "data": (ptr, False)},
            base,
        ),
        (
            "numpy-int-strides",
            {"shape": (3, 2), "typestr": "<i4", "data": (ptr, False), "strides": (i64(16), i64(4))},
            base,
        ),
        (
            "numpy-int-offset",
            {"shape": (2,), "typestr": "<i4", "data": buf, "offset": i64(40)},
            buf,
        ),
        ("readonly-1", {"shape": (12,), "typestr": "<i4", "data": (ptr, 1)}, base),
        ("readonly-0", {"shape": (12,), "typestr": "<i4", "data": (ptr, 0)}, base),
        ("readonly-empty-string", {"shape": (12,), "typestr": "<i4", "data": (ptr, "")}, base),
        ("readonly-nonempty-list", {"shape": (12,), "typestr": "<i4", "data": (ptr, [0])}, base),
        ("typestr-bytes", {"shape": (12,), "typestr": b"<i4", "data": (ptr, False)}, base),
    ]


@pytest.mark.parametrize("name, iface, owner", _fidelity_cases(), ids=lambda v: v)
def test_array_interface_read_as_numpy_reads_it(name, iface, owner):
    """The same dict means the same memory to numpy (np.asarray) and to asdlpack: address,
    shape, strides, values and writability."""
    iface = {"version": 3, **iface}
    expected = np.asarray(ArrayInterface(iface, owner))
    obj = asdlpack(ArrayInterface(iface, owner))
    assert obj.data_ptr == np_data_ptr(expected)
    assert obj.shape == expected.shape
    assert obj.byte_strides == expected.strides
    assert obj.readonly is (not expected.flags.writeable)
    got = np.from_dlpack(obj)
    np.testing.assert_array_equal(got, expected)


def test_array_interface_offset_outside_the_buffer():
    """numpy would read past the buffer; asdlpack refuses."""
    buf = bytearray(16)
    for offset in (-4, 12, 1 << 40):
        iface = {"version": 3, "shape": (2,), "typestr": "<i4", "data": buf, "offset": offset}
        with pytest.raises(ValueError, match="outside"):
            asdlpack(ArrayInterface(iface))


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("offset", 1.5, TypeError),
        ("offset", "8", TypeError),
        ("shape", (2.0,), TypeError),
        ("data", (1.0, False), TypeError),
        ("data", (np.int64(8), False), TypeError),  # numpy wants a Python int here too
    ],
)
def test_array_interface_integer_fields_are_integers(field, value, error):
    buf = bytearray(16)
    iface = {"version": 3, "shape": (2,), "typestr": "<i4", "data": buf, field: value}
    with pytest.raises(error):
        np.asarray(ArrayInterface(iface, buf))
    with pytest.raises(error):
        asdlpack(ArrayInterface(iface, buf))


@pytest.mark.parametrize("name", ["contiguous", "strided", "reversed-2d", "fortran", "0d"])
def test_array_struct_only(name):
    ref = _numpy_layouts()[name]
    obj = asdlpack(ArrayStruct(ref))
    check_view(obj, ref, readonly=False)


def test_array_struct_readonly():
    ref = np.frombuffer(bytes(range(16)), dtype=np.uint32)
    obj = asdlpack(ArrayStruct(ref))
    check_view(obj, ref, readonly=True)


def test_array_struct_preferred_over_array_interface():
    owner = np.arange(6, dtype=np.int32)
    iface = array_interface_of(owner.reshape(2, 3))  # same memory, different shape
    obj = asdlpack(BothArrayInterfaces(iface, owner))
    assert obj.shape == (6,)
    check_view(obj, owner)


# ---------------------------------------------------------------------------
# dispatch order
# ---------------------------------------------------------------------------


def test_dlpack_preferred_over_buffer():
    inner = np.arange(5, dtype=np.float32)

    class Both(bytearray):
        calls = 0

        def __dlpack__(self, **kwargs):
            type(self).calls += 1
            return inner.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (1, 0)

    obj = asdlpack(Both(3))
    assert Both.calls >= 1
    check_view(obj, inner)


def test_cuda_array_interface_preferred_over_array_interface():
    class Both:
        __cuda_array_interface__ = cuda_iface(shape=(7,), typestr="<f8")
        __array_interface__ = array_interface_of(np.arange(3, dtype=np.int8))

    obj = asdlpack(Both())
    assert obj.shape == (7,)
    assert obj.dtype == "float64"


def test_array_interface_preferred_over_buffer():
    class Both(bytearray):
        @property
        def __array_interface__(self):
            return {"shape": (2,), "typestr": "<i4", "data": (_addr(self), False), "version": 3}

    src = Both(np.array([5, 6], dtype=np.int32).tobytes())
    obj = asdlpack(src)
    assert obj.dtype == "int32"
    assert obj.shape == (2,)
    np.testing.assert_array_equal(np.from_dlpack(obj), [5, 6])


def test_dlpack_buffererror_falls_back_to_array_interface():
    ref = np.arange(4, dtype=np.int64)

    class Refuses:
        __array_interface__ = array_interface_of(ref)

        def __dlpack__(self, **kwargs):
            raise BufferError("nope")

        def __dlpack_device__(self):
            return (1, 0)

    check_view(asdlpack(Refuses()), ref)


def test_dlpack_buffererror_falls_back_to_buffer():
    class Refuses(bytearray):
        def __dlpack__(self, **kwargs):
            raise BufferError("nope")

        def __dlpack_device__(self):
            return (1, 0)

    src = Refuses(b"\x01\x02")
    obj = asdlpack(src)
    assert obj.dtype == "uint8"
    np.testing.assert_array_equal(np.from_dlpack(obj), [1, 2])


def test_dlpack_buffererror_without_fallback_propagates():
    class Refuses:
        def __dlpack__(self, **kwargs):
            raise BufferError("nope")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(BufferError):
        asdlpack(Refuses())


def test_dlpack_other_error_propagates():
    class Broken(bytearray):
        def __dlpack__(self, **kwargs):
            raise RuntimeError("boom")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(RuntimeError, match="boom"):
        asdlpack(Broken(2))


def test_dlpack_producer_versioned_and_flags():
    ref = np.arange(6, dtype=np.uint8)
    ref.flags.writeable = False
    prod = DLPackProducer(ref)
    obj = asdlpack(prod)
    assert prod.calls, "__dlpack__ was not called"
    check_view(obj, ref, readonly=True)


def test_legacy_only_producer():
    """A producer whose __dlpack__ predates max_version (only accepts ``stream``)."""
    ref = np.arange(6, dtype=np.float32)

    class Legacy:
        def __dlpack__(self, stream=None):
            return ref.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return (1, 0)

    check_view(asdlpack(Legacy()), ref)


# ---------------------------------------------------------------------------
# raw capsules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_raw_capsule(max_version):
    ref = np.arange(3)
    cap = ref.__dlpack__(max_version=max_version)
    name = capsule_name(cap)
    obj = asdlpack(cap)
    assert capsule_name(cap) == "used_" + name
    check_view(obj, ref, readonly=False)
    with pytest.raises((ValueError, BufferError)):
        asdlpack(cap)


def test_raw_capsule_readonly():
    ref = np.arange(3)
    ref.flags.writeable = False
    cap = ref.__dlpack__(max_version=(1, 0))
    obj = asdlpack(cap)
    check_view(obj, ref, readonly=True)


def test_capsule_from_dlpackobject_roundtrip():
    src = bytearray(range(6))
    cap = asdlpack(src).__dlpack__(max_version=(1, 3))
    obj = asdlpack(cap)
    assert obj.data_ptr == _addr(src)
    check_view(obj, np.frombuffer(src, dtype=np.uint8), readonly=False)


# ---------------------------------------------------------------------------
# __cuda_array_interface__ (metadata only without a GPU)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3])
def test_cuda_array_interface_metadata(version):
    obj = asdlpack(CudaArrayInterface(cuda_iface(shape=(2, 3), typestr="<f4", version=version)))
    assert obj.shape == (2, 3)
    assert obj.strides == (3, 1)
    assert obj.dtype == "float32"
    assert obj.readonly is False
    assert obj.stream is None
    assert obj.ndim == 2
    assert obj.nbytes == 24
    assert obj.data_ptr == 0x7F0000000000


def test_cuda_array_interface_strides_and_readonly():
    iface = cuda_iface(shape=(4, 5), typestr="<i2", strides=(2, 20), readonly=True)
    obj = asdlpack(CudaArrayInterface(iface))
    assert obj.strides == (1, 10)
    assert obj.readonly is True
    assert obj.dtype == "int16"


@pytest.mark.parametrize("stream", [1, 2, 12345])
def test_cuda_array_interface_stream(stream):
    obj = asdlpack(CudaArrayInterface(cuda_iface(stream=stream)))
    assert obj.stream == stream


def test_cuda_array_interface_stream_none():
    obj = asdlpack(CudaArrayInterface(cuda_iface(stream=None)))
    assert obj.stream is None


def test_cuda_array_interface_no_device_access_without_gpu():
    if torch_cuda_available():
        pytest.skip("a CUDA device is available")
    obj = asdlpack(CudaArrayInterface(cuda_iface()))
    for call in (obj.__dlpack_device__, lambda: obj.device, obj.__dlpack__):
        with pytest.raises((BufferError, RuntimeError), match="(?i)cuda"):
            call()


# ---------------------------------------------------------------------------
# numpy masked arrays: their exports drop the mask, so masked elements are refused
# ---------------------------------------------------------------------------


def test_masked_array_with_masked_elements_is_refused():
    m = np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False])
    with pytest.raises(BufferError, match=r"mask.*\.filled"):
        asdlpack(m)
    with pytest.raises(BufferError, match="mask"):
        copyto(np.zeros(3), m)
    # what the message suggests works
    np.testing.assert_array_equal(np.from_dlpack(asdlpack(m.filled(0.0))), [1.0, 0.0, 3.0])
    assert asdlpack(m.data).data_ptr == np_data_ptr(m.data)


def test_masked_array_subclass_with_masked_elements_is_refused():
    class Sub(np.ma.MaskedArray):
        pass

    m = np.ma.masked_invalid(np.array([1.0, np.nan])).view(Sub)
    with pytest.raises(BufferError, match="mask"):
        asdlpack(m)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.ma.array([1.0, 2.0, 3.0]),  # no mask at all (nomask)
        lambda: np.ma.masked_invalid(np.array([1.0, 2.0, 3.0])),  # a mask, all False
    ],
    ids=["nomask", "nothing-masked"],
)
def test_masked_array_without_masked_elements_is_its_data(make):
    m = make()
    obj = asdlpack(m)
    assert obj.data_ptr == np_data_ptr(m.data)
    np.testing.assert_array_equal(np.from_dlpack(obj), [1.0, 2.0, 3.0])


def test_array_interface_with_a_mask_is_refused():
    ref = np.arange(3.0)
    iface = array_interface_of(ref, mask=np.array([False, True, False]))
    with pytest.raises(BufferError, match="mask"):
        asdlpack(ArrayInterface(iface, ref))
