"""PEP 3118 corner cases built with CPython's ``_testbuffer`` (skipped where it isn't shipped)."""

import struct
import sys

import pytest

from dlpack import asdlpack

from ._helpers import need

tb = need("_testbuffer", "CPython's _testbuffer test module")
ndarray = tb.ndarray

LITTLE = sys.byteorder == "little"


def _items(fmt, n=6):
    code = fmt.lstrip("@=<>!")
    if code == "?":
        return [bool(i % 2) for i in range(n)]
    if code in "efd":
        return [float(i) for i in range(n)]
    return list(range(n))


@pytest.mark.parametrize(
    "fmt, dtype",
    [
        ("@i", "int32"),
        ("=i", "int32"),
        ("<i", "int32"),
        ("=l", "int32"),  # standard size: 4 bytes
        ("<l", "int32"),
        ("=q", "int64"),
        ("<Q", "uint64"),
        ("=h", "int16"),
        ("<H", "uint16"),
        ("<e", "float16"),
        ("=f", "float32"),
        ("<d", "float64"),
        ("@?", "bool"),
        ("<b", "int8"),
        (">B", "uint8"),
        ("!b", "int8"),
        (">?", "bool"),
        ("@n", "int64" if sys.maxsize > 2**32 else "int32"),
    ],
)
def test_format_prefixes(fmt, dtype):
    if not LITTLE and fmt[0] in "<":
        pytest.skip("little-endian machine assumed")
    src = ndarray(_items(fmt), shape=[6], format=fmt, flags=tb.ND_WRITABLE)
    assert memoryview(src).itemsize == struct.calcsize(fmt)
    obj = asdlpack(src)
    assert obj.dtype == dtype
    assert obj.itemsize == struct.calcsize(fmt)
    assert obj.shape == (6,)
    assert obj.readonly is False
    np = need("numpy")
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, _items(fmt))


@pytest.mark.parametrize(
    "fmt, dtype",
    [
        (">h", "int16"),
        ("!h", "int16"),
        (">i", "int32"),
        ("!q", "int64"),
        (">d", "float64"),
        (">e", "float16"),
        ("!f", "float32"),
    ],
)
def test_non_native_multibyte_copied(fmt, dtype):
    """Non-native byte order is accepted; exports are native-order copies with the right values."""
    if not LITTLE:
        pytest.skip("little-endian machine assumed")
    src = ndarray(_items(fmt), shape=[6], format=fmt)
    obj = asdlpack(src)
    assert obj.dtype == dtype
    assert obj.itemsize == struct.calcsize(fmt)
    assert obj.shape == (6,)
    assert obj.strides == (1,)
    assert obj.byte_strides == (obj.itemsize,)
    assert isinstance(obj.copy_reason, str) and obj.copy_reason
    assert "needs_copy=True" in repr(obj)
    for max_version in (None, (1, 3)):
        with pytest.raises(BufferError, match="copy=False"):
            obj.__dlpack__(max_version=max_version, copy=False)
    np = need("numpy")
    out = np.from_dlpack(obj)
    assert out.dtype == np.dtype(dtype)
    assert out.flags.writeable
    np.testing.assert_array_equal(out, _items(fmt))


@pytest.mark.parametrize("fmt", ["c", "3i", "2B", "x", "s", "5s", "p"])
def test_unsupported_formats_refused(fmt):
    try:
        if fmt in ("c", "s", "5s", "p"):
            src = ndarray([b"a", b"b"], shape=[2], format=fmt)
        elif fmt == "x":
            src = ndarray([(), ()], shape=[2], format=fmt)
        else:
            n = int(fmt[0])
            src = ndarray([tuple(range(n))] * 2, shape=[2], format=fmt)
    except Exception as exc:  # this _testbuffer can't build it
        pytest.skip(f"_testbuffer cannot build format {fmt!r}: {exc}")
    with pytest.raises(BufferError):
        asdlpack(src)


def test_suboffsets_copied():
    """PIL-style buffers are accepted; exports follow the suboffsets into a fresh copy."""
    src = ndarray(list(range(12)), shape=[3, 4], format="B", flags=tb.ND_PIL)
    assert memoryview(src).suboffsets
    obj = asdlpack(src)
    assert obj.shape == (3, 4)
    assert obj.dtype == "uint8"
    assert obj.readonly is True
    assert isinstance(obj.copy_reason, str) and obj.copy_reason
    assert "needs_copy=True" in repr(obj)
    assert len(obj.byte_strides) == 2
    for max_version in (None, (1, 3)):
        with pytest.raises(BufferError, match="copy=False"):
            obj.__dlpack__(max_version=max_version, copy=False)
    np = need("numpy")
    out = np.from_dlpack(obj)
    assert out.flags.writeable
    np.testing.assert_array_equal(out, memoryview(src).tolist())
    np.testing.assert_array_equal(out, np.arange(12).reshape(3, 4))


def test_getbuffer_failure_propagates():
    src = ndarray(list(range(4)), shape=[4], format="B", flags=tb.ND_GETBUF_FAIL)
    with pytest.raises(BufferError):
        asdlpack(src)


def test_fortran_buffer():
    src = ndarray(list(range(12)), shape=[3, 4], format="i", flags=tb.ND_FORTRAN)
    mv = memoryview(src)
    assert mv.f_contiguous
    obj = asdlpack(src)
    assert obj.shape == (3, 4)
    assert obj.strides == (1, 3)
    np = need("numpy")
    out = np.from_dlpack(obj)
    np.testing.assert_array_equal(out, np.asarray(mv))


def test_scalar_buffer():
    src = ndarray(7, shape=[], format="d", flags=tb.ND_SCALAR)
    obj = asdlpack(src)
    assert obj.shape == ()
    assert obj.ndim == 0
    assert obj.nbytes == 8
    np = need("numpy")
    assert np.from_dlpack(obj) == 7.0


def test_readonly_ndarray():
    src = ndarray(list(range(4)), shape=[4], format="B")
    obj = asdlpack(src)
    assert obj.readonly is True


def test_strided_ndarray():
    src = ndarray(list(range(24)), shape=[4, 6], format="h", flags=tb.ND_WRITABLE)
    view = src[::2, ::-3]
    mv = memoryview(view)
    obj = asdlpack(view)
    assert obj.shape == mv.shape
    assert obj.strides == tuple(s // 2 for s in mv.strides)
    np = need("numpy")
    np.testing.assert_array_equal(np.from_dlpack(obj), np.asarray(mv))
