"""What the copy tests share: capsule and array helpers, and the catalog of sources DLPack
can't express (name -> () -> (object, reference values, numpy view or None))."""

import ctypes
import sys

import pytest

from dlpack import asdlpack

from ._helpers import (
    ArrayInterface,
    ArrayStruct,
    CapsuleInfo,
    array_interface_of,
    contiguous_strides,
    need,
)

np = need("numpy")

LITTLE = sys.byteorder == "little"


def _testbuffer():
    return pytest.importorskip("_testbuffer")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def capsule_values(cap, dtype, shape):
    """The values in a (CPU, C-contiguous) capsule, read with ctypes; the capsule stays unused."""
    info = CapsuleInfo(cap)
    assert info.shape == tuple(shape)
    assert info.device == (1, 0)
    if info.strides is not None and 0 not in info.shape:
        for n, got, exp in zip(info.shape, info.strides, contiguous_strides(shape), strict=True):
            if n > 1:
                assert got == exp, (info.strides, shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = ctypes.string_at(info.first_element, nbytes) if nbytes else b""
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def odd_view(shape, dtype, *, pad=1, offset=1, reverse=False, fill=None):
    """A numpy view whose byte strides are not multiples of the item size (for itemsize > 1)."""
    dtype = np.dtype(dtype)
    strides = []
    pitch = dtype.itemsize + pad
    for n in reversed(shape):
        strides.append(pitch)
        pitch = pitch * max(n, 1) + pad
    strides = tuple(reversed(strides))
    span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n > 0)
    base = np.zeros(offset + span + dtype.itemsize + 8, dtype=np.uint8)
    if reverse:
        offset += span
        strides = tuple(-s for s in strides)
    view = np.ndarray(shape, dtype=dtype, buffer=base, offset=offset, strides=strides)
    if fill is not None:
        view[...] = fill
    return view


def _values(shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    dtype = np.dtype(dtype)
    v = (np.arange(n, dtype=np.int64) * 7 + 3) % 101
    if dtype.kind == "b":
        return (v % 3 == 0).reshape(shape)
    if dtype.kind == "c":
        return (v + 1j * (v % 5)).astype(dtype).reshape(shape)
    if dtype.kind == "i":
        v = v - 50
    return v.astype(dtype).reshape(shape)


class LegacyConsumer:
    """Forwards to ``obj`` but always asks it for a legacy capsule (as JAX and tvm-ffi do)."""

    def __init__(self, obj):
        self._obj = obj

    def __dlpack__(self, **kwargs):
        return self._obj.__dlpack__(copy=kwargs.get("copy"))

    def __dlpack_device__(self):
        return (1, 0)


# ---------------------------------------------------------------------------
# sources DLPack can't express: name -> () -> (object, reference values, numpy view or None)
# ---------------------------------------------------------------------------


def _be(dtype):
    return np.dtype(dtype).newbyteorder(">")


def _be_array(shape, dtype):
    return _values(shape, dtype).astype(_be(dtype))


def _pil(values, fmt, writable=False):
    tb = _testbuffer()
    flags = tb.ND_PIL | (tb.ND_WRITABLE if writable else 0)
    items = values.reshape(-1).tolist()
    return tb.ndarray(items, shape=list(values.shape), format=fmt, flags=flags)


def _odd_sources():
    def be(shape, dtype, index=None, transpose=None, fortran=False):
        def make():
            a = _be_array(shape, dtype)
            if fortran:
                a = np.asfortranarray(a)
            if index is not None:
                a = a[index]
            if transpose is not None:
                a = a.transpose(transpose)
            return a, np.array(a), a

        return make

    def odd(shape, dtype, **kw):
        def make():
            v = odd_view(shape, dtype, fill=_values(shape, dtype), **kw)
            return v, np.array(v), v

        return make

    def wrapped(inner, wrap):
        def make():
            obj, ref, view = inner()
            return wrap(obj), ref, view

        return make

    def odd_overlapping():
        base = np.arange(64, dtype=np.uint8) * 3
        v = np.ndarray((7,), dtype="<u4", buffer=base, offset=1, strides=(2,))
        return v, np.array(v), v

    def ctypes_be():
        c = (ctypes.c_int32.__ctype_be__ * 5)(-2, -1, 0, 0x01020304, 7)
        return c, np.array([-2, -1, 0, 0x01020304, 7], dtype=np.int32), None

    def testbuffer_be():
        tb = _testbuffer()
        vals = _values((2, 3), np.int16)
        src = tb.ndarray(vals.reshape(-1).tolist(), shape=[2, 3], format=">h")
        return src, vals, None

    def pil(shape, dtype, fmt, index=None):
        def make():
            vals = _values(shape, dtype)
            src = _pil(vals, fmt, writable=index is not None)
            if index is not None:
                src = src[index]
                vals = vals[index]
            assert memoryview(src).suboffsets
            return src, vals, None

        return make

    be2d = be((4, 6), "float32", index=(slice(None, None, -1), slice(1, None, 2)))
    odd2d = odd((3, 4), "int16", pad=3)
    return {
        "be-float32": be((3, 4), "float32"),
        "be-int64-strided": be((6, 10), "int64", index=(slice(None, None, 2), slice(1, None, 3))),
        "be-uint16-negative": be((4, 6), "uint16", index=(slice(None, None, -1),) * 2),
        "be-complex128-fortran": be((2, 3), "complex128", fortran=True),
        "be-complex64": be((5,), "complex64"),
        "be-float16-transposed": be((2, 3, 4), "float16", transpose=(2, 0, 1)),
        "be-float64-0d": be((), "float64"),
        "be-int32-zero-size": be((0, 3), "int32"),
        "odd-int32": odd((5,), "int32"),
        "odd-int16-2d": odd2d,
        "odd-float64-reversed": odd((4,), "float64", pad=5, reverse=True),
        "odd-complex64-3d": odd((2, 2, 3), "complex64", pad=2, offset=3),
        "odd-uint32-overlapping": odd_overlapping,
        "odd-be-int32": odd((3, 2), ">i4", pad=3, reverse=True),
        "memoryview-be": wrapped(be2d, memoryview),
        "memoryview-odd": wrapped(odd2d, memoryview),
        "array-interface-be": wrapped(be2d, lambda a: ArrayInterface(array_interface_of(a), a)),
        "array-interface-odd": wrapped(odd2d, lambda a: ArrayInterface(array_interface_of(a), a)),
        "array-struct-be": wrapped(be2d, ArrayStruct),
        "array-struct-odd": wrapped(odd2d, ArrayStruct),
        "dlpackobject-be": wrapped(be2d, asdlpack),
        "ctypes-be": ctypes_be,
        "testbuffer-be": testbuffer_be,
        "pil-uint8": pil((3, 4), np.uint8, "B"),
        "pil-int32-sliced": pil((4, 5), np.int32, "i", (slice(None, None, -1), slice(1, None, 2))),
        "pil-float64": pil((2, 3), np.float64, "d"),
        "pil-big-endian-int16": pil((3, 4), np.int16, ">h"),
    }


ODD = _odd_sources()


def _odd(name):
    """(source, its values in native byte order, the numpy view it describes or None)."""
    if not LITTLE and ("be-" in name or name.endswith("-be") or "big-endian" in name):
        pytest.skip("big-endian data is native here")
    obj, ref, view = ODD[name]()
    return obj, ref.astype(ref.dtype.newbyteorder("=")), view
