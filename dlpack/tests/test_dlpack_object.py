"""The DLPackObject side of the protocol: capsules, versions, flags, argument checking."""

import ctypes
import enum

import pytest

import dlpack
from dlpack import DLPACK_VERSION, DLDeviceType, DLPackObject, asdlpack

from ._helpers import (
    DTYPE_CODES,
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    CapsuleInfo,
    capsule_name,
    collect,
    is_capsule,
)


def _addr(buf) -> int:
    """Address of a writable buffer (bytearray) via ctypes."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


# ---------------------------------------------------------------------------
# module-level API
# ---------------------------------------------------------------------------


def test_dlpack_version():
    assert DLPACK_VERSION == (1, 3)
    assert isinstance(DLPACK_VERSION, tuple)


def test_package_version():
    assert isinstance(dlpack.__version__, str)
    assert dlpack.__version__


def test_contiguity_flags():
    src = bytearray(24)
    obj = asdlpack(memoryview(src).cast("B", shape=[4, 6]))
    assert obj.c_contiguous is True
    assert obj.f_contiguous is False
    obj = asdlpack(memoryview(src)[::2])
    assert obj.c_contiguous is False
    assert obj.f_contiguous is False
    obj = asdlpack(memoryview(src)[:5])
    assert obj.c_contiguous is True
    assert obj.f_contiguous is True


def test_device_type_enum():
    assert issubclass(DLDeviceType, enum.IntEnum)
    assert DLDeviceType.kDLCPU == 1
    assert DLDeviceType.kDLCUDA == 2
    assert DLDeviceType.kDLCUDAHost == 3
    assert DLDeviceType.kDLROCM == 10
    assert DLDeviceType.kDLCUDAManaged == 13
    assert DLDeviceType(1) is DLDeviceType.kDLCPU


def test_asdlpack_returns_dlpackobject():
    obj = asdlpack(bytearray(b"abcd"))
    assert type(obj) is DLPackObject


def test_asdlpack_of_dlpackobject():
    src = bytearray(range(8))
    inner = asdlpack(src)
    outer = asdlpack(inner)
    assert type(outer) is DLPackObject
    assert outer.shape == (8,)
    assert outer.dtype == "uint8"
    assert outer.data_ptr == inner.data_ptr == _addr(src)


def test_asdlpack_takes_obj_by_keyword():
    src = bytearray(range(8))
    assert asdlpack(obj=src).data_ptr == _addr(src)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing required argument 'obj'"),
        ((b"a", b"b"), {}, r"exactly one argument \(2 given\)"),
        ((b"a",), {"obj": b"b"}, r"exactly one argument \(2 given\)"),
        ((), {"source": b"a"}, "unexpected keyword argument 'source'"),
    ],
)
def test_asdlpack_argument_errors(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        asdlpack(*args, **kwargs)


def test_type_is_final_and_made_only_by_asdlpack():
    assert DLPackObject.__module__ == "dlpack"
    assert DLPackObject.__name__ == "DLPackObject"
    with pytest.raises(TypeError):
        DLPackObject()
    with pytest.raises(TypeError):
        type("Sub", (DLPackObject,), {})


def test_signatures():
    import inspect

    assert str(inspect.signature(asdlpack)) == "(obj)"
    params = inspect.signature(DLPackObject.__dlpack__).parameters
    assert list(params) == ["self", "stream", "max_version", "dl_device", "copy"]
    assert all(p.kind is p.KEYWORD_ONLY for name, p in params.items() if name != "self")
    assert list(inspect.signature(DLPackObject.__dlpack_device__).parameters) == ["self"]


def test_objects_reused_after_free_are_independent():
    """Freed objects are recycled: a new object must not show anything of an old one."""
    objects = [asdlpack(bytearray([k]) * (k + 1)) for k in range(40)]
    expected = [(o.shape, o.data_ptr) for o in objects]
    del objects[::2]
    fresh = [asdlpack(memoryview(bytearray(48)).cast("d", shape=[2, 3])) for _ in range(30)]
    assert [(o.shape, o.data_ptr) for o in objects] == expected[1::2]
    assert all(o.shape == (2, 3) and o.dtype == "float64" for o in fresh)


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------


def test_properties_bytearray():
    src = bytearray(range(12))
    obj = asdlpack(src)
    assert obj.shape == (12,)
    assert obj.strides == (1,)
    assert obj.dtype == "uint8"
    assert obj.device == (1, 0)
    assert obj.__dlpack_device__() == (1, 0)
    assert obj.readonly is False
    assert obj.nbytes == 12
    assert obj.ndim == 1
    assert obj.itemsize == 1
    assert obj.data_ptr == _addr(src)
    assert obj.stream is None
    assert all(type(v) is int for v in obj.shape + obj.strides + obj.__dlpack_device__())


def test_properties_multidim_cast():
    src = bytearray(48)
    mv = memoryview(src).cast("B").cast("i", shape=[3, 4])
    obj = asdlpack(mv)
    assert obj.shape == (3, 4)
    assert obj.strides == (4, 1)  # elements, not bytes
    assert obj.dtype == "int32"
    assert obj.itemsize == 4
    assert obj.nbytes == 48
    assert obj.ndim == 2
    assert obj.data_ptr == _addr(src)


def test_properties_strided_nbytes_counts_elements_not_span():
    src = bytearray(range(20))
    obj = asdlpack(memoryview(src)[3::4])
    assert obj.shape == (5,)
    assert obj.strides == (4,)
    assert obj.nbytes == 5
    assert obj.data_ptr == _addr(src) + 3


def test_properties_readonly_bytes():
    obj = asdlpack(b"hello")
    assert obj.readonly is True
    assert obj.shape == (5,)


def test_repr_mentions_shape_and_dtype():
    obj = asdlpack(memoryview(bytearray(24)).cast("d", shape=[1, 3]))
    r = repr(obj)
    assert "float64" in r
    assert "(1, 3)" in r


def test_properties_are_read_only():
    obj = asdlpack(bytearray(4))
    with pytest.raises(AttributeError):
        obj.shape = (2, 2)
    with pytest.raises(AttributeError):
        obj.dtype = "int32"


# ---------------------------------------------------------------------------
# capsule names and versions
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{}, {"max_version": None}, {"max_version": (0, 8)}])
def test_legacy_capsule(kwargs):
    src = bytearray(range(6))
    obj = asdlpack(src)
    cap = obj.__dlpack__(**kwargs)
    assert is_capsule(cap)
    assert capsule_name(cap) == "dltensor"
    info = CapsuleInfo(cap)
    assert info.shape == (6,)
    assert info.strides in (None, (1,))
    assert info.dtype == (1, 8, 1)
    assert info.device == (1, 0)
    assert info.first_element == _addr(src)
    assert info.has_deleter


@pytest.mark.parametrize(
    "max_version, expected",
    [((1, 0), (1, 0)), ((1, 1), (1, 1)), ((1, 3), (1, 3)), ((1, 7), (1, 3)), ((2, 0), (1, 3))],
)
def test_versioned_capsule(max_version, expected):
    src = bytearray(range(6))
    obj = asdlpack(memoryview(src).cast("B", shape=[2, 3]))
    cap = obj.__dlpack__(max_version=max_version)
    assert capsule_name(cap) == "dltensor_versioned"
    info = CapsuleInfo(cap)
    assert info.version == expected
    assert info.flags & FLAG_READ_ONLY == 0
    assert info.flags & FLAG_IS_COPIED == 0
    assert info.shape == (2, 3)
    assert info.strides in (None, (3, 1))
    assert info.ndim == 2
    assert info.first_element == _addr(src)
    assert info.has_deleter


def test_max_version_answered_per_call():
    # The fast path remembers the last max_version tuple; any other tuple, equal or not, and
    # tuples made afresh (at addresses freed tuples had) must each get their own answer.
    obj = asdlpack(bytearray(range(6)))

    def version_of(cap):
        return (0, 0) if capsule_name(cap) == "dltensor" else CapsuleInfo(cap).version

    same = (1, 1)
    for max_version, expected in [
        (same, (1, 1)),
        ((1, 0), (1, 0)),
        (same, (1, 1)),
        ((0, 2), (0, 0)),
        ((1, 7), (1, 3)),
        (same, (1, 1)),
        ((2, 0), (1, 3)),
        (same, (1, 1)),
    ]:
        assert version_of(obj.__dlpack__(max_version=max_version)) == expected
    for k in range(40):
        minor = k % 5
        cap = obj.__dlpack__(max_version=(k % 2, minor))  # a new tuple per call
        assert version_of(cap) == ((1, min(minor, 3)) if k % 2 else (0, 0))


def test_versioned_capsule_dtype_codes():
    src = bytearray(32)
    for fmt, name in [("b", "int8"), ("H", "uint16"), ("i", "int32"), ("q", "int64"),
                      ("f", "float32"), ("d", "float64"), ("?", "bool")]:  # fmt: skip
        obj = asdlpack(memoryview(src).cast(fmt))
        assert obj.dtype == name
        code, bits, itemsize = DTYPE_CODES[name]
        info = CapsuleInfo(obj.__dlpack__(max_version=(1, 0)))
        assert info.dtype == (code, bits, 1), name
        assert obj.itemsize == itemsize


def test_readonly_flag_set_for_readonly_source():
    obj = asdlpack(b"abcdef")
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 0)))
    assert info.flags & FLAG_READ_ONLY
    assert not info.flags & FLAG_IS_COPIED


def test_readonly_legacy_copies():
    """A legacy capsule can't say read-only: read-only memory is exported as a copy."""
    src = b"abcdef"
    obj = asdlpack(src)
    assert obj.copy_reason is None  # the memory itself is fine; only legacy exports copy
    for kwargs in [{}, {"max_version": None}, {"max_version": (0, 9)}]:
        cap = obj.__dlpack__(**kwargs)
        assert capsule_name(cap) == "dltensor"
        info = CapsuleInfo(cap)
        assert info.shape == (6,)
        assert info.first_element != obj.data_ptr
        assert ctypes.string_at(info.first_element, 6) == src
        ctypes.memset(info.first_element, ord("z"), 6)  # the copy is the consumer's to write
        assert src == bytes([97, 98, 99, 100, 101, 102])  # made apart from src's constant
        del cap
    with pytest.raises(BufferError, match="copy=False"):
        obj.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="copy=False"):
        obj.__dlpack__(max_version=(0, 9), copy=False)
    # the object is still usable afterwards
    assert capsule_name(obj.__dlpack__(max_version=(1, 1))) == "dltensor_versioned"


def test_readonly_legacy_with_copy():
    src = b"abcdef"
    obj = asdlpack(src)
    cap = obj.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor"
    info = CapsuleInfo(cap)
    assert info.shape == (6,)
    assert info.device == (1, 0)
    assert info.first_element != obj.data_ptr
    assert ctypes.string_at(info.first_element, 6) == src


def test_copy_true_versioned():
    src = bytearray(b"abcdef")
    obj = asdlpack(src)
    cap = obj.__dlpack__(max_version=(1, 3), copy=True)
    info = CapsuleInfo(cap)
    assert info.flags & FLAG_IS_COPIED
    assert not info.flags & FLAG_READ_ONLY
    assert info.first_element != _addr(src)
    assert ctypes.string_at(info.first_element, 6) == b"abcdef"
    ctypes.memset(info.first_element, ord("z"), 6)
    assert src == bytearray(b"abcdef")


def test_copy_true_of_readonly_versioned_is_writable():
    obj = asdlpack(b"abcdef")
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 3), copy=True))
    assert info.flags & FLAG_IS_COPIED
    assert not info.flags & FLAG_READ_ONLY


def test_copy_true_strided_source():
    src = bytearray(range(12))
    obj = asdlpack(memoryview(src)[1::3])
    cap = obj.__dlpack__(max_version=(1, 3), copy=True)  # keep the copy alive while reading
    info = CapsuleInfo(cap)
    assert info.shape == (4,)
    assert info.flags & FLAG_IS_COPIED
    n = 4
    stride = 1 if info.strides is None else info.strides[0]
    got = bytes(ctypes.string_at(info.first_element + i * stride, 1)[0] for i in range(n))
    assert got == bytes([1, 4, 7, 10])


def test_copy_false_when_no_copy_needed():
    src = bytearray(8)
    obj = asdlpack(src)
    for mv in [None, (1, 0)]:
        info = CapsuleInfo(obj.__dlpack__(max_version=mv, copy=False))
        assert info.first_element == _addr(src)
        if info.flags is not None:
            assert not info.flags & FLAG_IS_COPIED


def test_many_exports():
    src = bytearray(range(16))
    obj = asdlpack(src)
    caps = []
    for i in range(200):
        caps.append(obj.__dlpack__(max_version=None if i % 2 else (1, i % 5)))
    for cap in caps:
        info = CapsuleInfo(cap)
        assert info.first_element == _addr(src)
        assert info.shape == (16,)
    del caps
    collect()
    assert obj.shape == (16,)


# ---------------------------------------------------------------------------
# dl_device
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dev", [(1, 0), (DLDeviceType.kDLCPU, 0)])
def test_dl_device_same(dev):
    obj = asdlpack(bytearray(4))
    cap = obj.__dlpack__(max_version=(1, 0), dl_device=dev)
    assert CapsuleInfo(cap).device == (1, 0)
    cap = obj.__dlpack__(max_version=(1, 0), dl_device=dev, copy=True)
    assert CapsuleInfo(cap).device == (1, 0)


@pytest.mark.parametrize("dev", [(2, 0), (1, 1), (DLDeviceType.kDLCUDAHost, 0), (10, 0)])
def test_dl_device_other(dev):
    obj = asdlpack(bytearray(4))
    with pytest.raises(BufferError):
        obj.__dlpack__(max_version=(1, 0), dl_device=dev)


# ---------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [None, -1])
def test_stream_ok_on_cpu(stream):
    obj = asdlpack(bytearray(4))
    assert capsule_name(obj.__dlpack__(stream=stream)) == "dltensor"
    assert capsule_name(obj.__dlpack__(stream=stream, max_version=(1, 0))) == "dltensor_versioned"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stream": "x"},
        {"stream": 1.5},
        {"max_version": "1.0"},
        {"max_version": (1,)},
        {"max_version": (1, 0, 0)},
        {"max_version": 1},
        {"max_version": ("1", "0")},
        {"copy": "yes"},
        {"dl_device": 5},
        {"dl_device": "cpu"},
        {"dl_device": (1,)},
    ],
)
def test_argument_types(kwargs):
    obj = asdlpack(bytearray(4))
    with pytest.raises(TypeError):
        obj.__dlpack__(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stream": 0},
        {"stream": 1},
        {"stream": 2},
        {"max_version": (-1, 0)},
        {"max_version": (1, -1)},
        {"max_version": (0, -1)},
        {"max_version": (2, -1)},
    ],
)
def test_argument_values(kwargs):
    obj = asdlpack(bytearray(4))
    with pytest.raises(ValueError):
        obj.__dlpack__(**kwargs)


def test_positional_arguments_rejected():
    obj = asdlpack(bytearray(4))
    with pytest.raises(TypeError):
        obj.__dlpack__(None)
    with pytest.raises(TypeError):
        obj.__dlpack__(None, (1, 0))


def test_unknown_keyword_rejected():
    obj = asdlpack(bytearray(4))
    with pytest.raises(TypeError):
        obj.__dlpack__(bogus=1)


def test_errors_do_not_poison_object():
    src = bytearray(range(4))
    obj = asdlpack(src)
    for kwargs, exc_class in [
        ({"stream": "x"}, TypeError),
        ({"stream": 3}, ValueError),
        ({"dl_device": (2, 0)}, BufferError),
    ]:
        with pytest.raises(exc_class):
            obj.__dlpack__(**kwargs)
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 0)))
    assert info.first_element == _addr(src)


def test_rewrap_readonly_object():
    inner = asdlpack(b"xyz")
    outer = asdlpack(inner)
    assert outer.readonly is True
    info = CapsuleInfo(outer.__dlpack__())  # legacy: a copy
    assert info.first_element != inner.data_ptr
    with pytest.raises(BufferError):
        outer.__dlpack__(copy=False)
    assert CapsuleInfo(outer.__dlpack__(max_version=(1, 0))).readonly


def test_copy_false_readonly_versioned_ok():
    src = b"abcdef"
    obj = asdlpack(src)
    cap = obj.__dlpack__(max_version=(1, 2), copy=False)
    info = CapsuleInfo(cap)
    assert info.readonly
    assert not info.is_copied
    assert info.first_element == obj.data_ptr
