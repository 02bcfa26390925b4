"""Every kind of producer asdlpack accepts, checked through numpy.from_dlpack."""

import pytest

from dlpack import asdlpack, copyto

from ._helpers import (
    ArrayInterface,
    ArrayStruct,
    BothArrayInterfaces,
    CudaArrayInterface,
    DLPackProducer,
    array_interface_of,
    buffer_addr,
    capsule_name,
    check_view,
    contiguous_strides,
    cuda_iface,
    need,
    np_data_ptr,
    torch_cuda_available,
)

np = need("numpy")

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
    assert obj.data_ptr == buffer_addr(buf)
    assert obj.readonly is False
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))
    out[1, 2] = 99
    assert np.frombuffer(buf, dtype=np.int32)[5] == 99


def test_array_interface_data_is_buffer_with_offset():
    buf = bytearray(np.arange(6, dtype=np.int32).tobytes())
    iface = {"shape": (4,), "typestr": "<i4", "data": buf, "offset": 8, "version": 3}
    obj = asdlpack(ArrayInterface(iface))
    assert obj.data_ptr == buffer_addr(buf) + 8
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
    assert obj.data_ptr == buffer_addr(src)
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
            return {
                "shape": (2,),
                "typestr": "<i4",
                "data": (buffer_addr(self), False),
                "version": 3,
            }

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
    with pytest.raises(ValueError, match="already consumed"):
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
    assert obj.data_ptr == buffer_addr(src)
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
        with pytest.raises(BufferError, match="CUDA driver"):
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


# ---------------------------------------------------------------------------
# numpy's __array__, the last resort
# ---------------------------------------------------------------------------


class _ArrayMethod:
    """Only numpy's ``__array__``, as numpy 2 asks for it (``dtype`` and ``copy``)."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None, copy=None):
        assert copy is False  # asdlpack asks for the object's own memory
        return self.array


class _LegacyArrayMethod:
    """An ``__array__`` written before numpy 2: no ``copy`` keyword."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None):
        return self.array


def test_array_method_is_the_objects_memory():
    a = np.arange(6.0).reshape(2, 3)
    obj = asdlpack(_ArrayMethod(a))
    out = np.from_dlpack(obj)
    assert np.shares_memory(out, a)
    assert out.flags.writeable
    np.testing.assert_array_equal(out, a)


def test_array_method_without_copy_keyword_is_read_only_with_numpys_warning():
    """numpy 2 still reads an ``__array__`` that takes no ``copy`` (warning where it asked for
    ``copy=False``); whether its array is the object's memory or a copy nobody can tell, so it is
    served read-only (a write into a copy would be lost) and the warning says so."""
    a = np.arange(6.0).reshape(2, 3)
    with pytest.warns(DeprecationWarning, match="_LegacyArrayMethod.__array__ takes no copy"):
        obj = asdlpack(_LegacyArrayMethod(a))
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, a)
    assert not out.flags.writeable
    assert obj.readonly
    with pytest.raises(ValueError, match="read-only"):  # as numpy's assignment
        copyto(obj, np.ones((2, 3)))
    np.testing.assert_array_equal(a, np.arange(6.0).reshape(2, 3))


def test_array_method_other_type_error_is_its_own():
    class Broken:
        def __array__(self, dtype=None, copy=None):
            raise TypeError("nothing to do with the keywords")

    with pytest.raises(TypeError, match="nothing to do with the keywords"):
        asdlpack(Broken())
