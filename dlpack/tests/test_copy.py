"""The copy engine (issue #3): copies on export and ``dlpack.copyto(dst, src)``.

Exports copy when asked (``copy=True``), for memory DLPack can't express (non-native byte order,
byte strides that are not whole elements, suboffsets) and for read-only memory asked for a legacy
capsule. ``copyto`` writes any supported source into any writable destination, checked against
``numpy.copyto`` on numpy views of the same memory.
"""

import array
import ctypes
import mmap
import sys
import threading
import time

import pytest

import dlpack
from dlpack import asdlpack, copyto

from ._helpers import (
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    CapsuleInfo,
    array_interface_of,
    capsule_name,
    contiguous_strides,
    need,
    np_data_ptr,
    torch_cuda_available,
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


@pytest.mark.parametrize("name", list(ODD))
def test_odd_layout_properties(name):
    obj, ref, view = _odd(name)
    o = asdlpack(obj)
    assert isinstance(o.copy_reason, str) and o.copy_reason
    assert "needs_copy=True" in repr(o)
    assert o.shape == ref.shape
    assert o.ndim == ref.ndim
    assert o.dtype == ref.dtype.name
    assert o.itemsize == ref.dtype.itemsize
    assert o.nbytes == ref.size * ref.dtype.itemsize
    assert o.device == (1, 0)
    assert isinstance(o.byte_strides, tuple)
    assert len(o.byte_strides) == o.ndim
    if view is not None and view.size:
        assert o.data_ptr == np_data_ptr(view)
        for n, got, exp in zip(view.shape, o.byte_strides, view.strides, strict=True):
            if n > 1:
                assert got == exp
        pairs = zip(view.shape, view.strides, strict=True)
        whole = all(s % view.itemsize == 0 for n, s in pairs if n > 1)
        if whole:
            assert o.strides is not None
            for n, got, exp in zip(view.shape, o.strides, view.strides, strict=True):
                if n > 1:
                    assert got * view.itemsize == exp
        else:
            assert o.strides is None
            assert "byte_strides=" in repr(o)


@pytest.mark.parametrize("name", list(ODD))
@pytest.mark.parametrize("copy", [None, True])
def test_odd_layout_versioned_export_copies(name, copy):
    obj, ref, view = _odd(name)
    o = asdlpack(obj)
    cap = o.__dlpack__(max_version=(1, 3), copy=copy)
    assert capsule_name(cap) == "dltensor_versioned"
    info = CapsuleInfo(cap)
    assert info.flags & FLAG_IS_COPIED
    assert not info.flags & FLAG_READ_ONLY
    assert info.dtype[2] == 1
    if ref.size:
        assert info.first_element != o.data_ptr
    got = capsule_values(cap, ref.dtype, ref.shape)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("name", list(ODD))
@pytest.mark.parametrize("copy", [None, True])
def test_odd_layout_legacy_export_copies(name, copy):
    obj, ref, _ = _odd(name)
    o = asdlpack(obj)
    cap = o.__dlpack__(copy=copy)
    assert capsule_name(cap) == "dltensor"
    np.testing.assert_array_equal(capsule_values(cap, ref.dtype, ref.shape), ref)


@pytest.mark.parametrize("name", list(ODD))
@pytest.mark.parametrize("max_version", [None, (0, 8), (1, 0), (1, 3)])
def test_odd_layout_copy_false_refused(name, max_version):
    obj, _, _ = _odd(name)
    o = asdlpack(obj)
    with pytest.raises(BufferError, match="copy=False"):
        o.__dlpack__(max_version=max_version, copy=False)
    # the object stays usable
    assert capsule_name(o.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"


@pytest.mark.parametrize("name", list(ODD))
def test_odd_layout_numpy(name):
    obj, ref, view = _odd(name)
    out = np.from_dlpack(asdlpack(obj))
    assert out.dtype == ref.dtype
    assert out.dtype.isnative
    assert out.shape == ref.shape
    assert out.flags.c_contiguous
    assert out.flags.writeable
    np.testing.assert_array_equal(out, ref)
    if view is not None and out.size:
        assert not np.shares_memory(out, view)
        before = np.array(view)
        out[...] = 0
        np.testing.assert_array_equal(view, before)  # a copy: the source is untouched


@pytest.mark.parametrize("name", list(ODD))
def test_odd_layout_numpy_copy_false(name):
    obj, _, _ = _odd(name)
    with pytest.raises(BufferError):
        np.from_dlpack(asdlpack(obj), copy=False)


@pytest.mark.parametrize("name", list(ODD))
def test_odd_layout_torch(name):
    torch = need("torch")
    obj, ref, _ = _odd(name)
    t = torch.from_dlpack(asdlpack(obj))
    assert tuple(t.shape) == ref.shape
    assert t.is_contiguous()
    np.testing.assert_array_equal(t.numpy(), ref)


@pytest.mark.parametrize("name", list(ODD))
def test_odd_layout_jax(name):
    jnp = need("jax.numpy", "jax")

    obj, ref, _ = _odd(name)
    out = jnp.from_dlpack(asdlpack(obj))  # jax asks for a legacy capsule
    assert out.shape == ref.shape
    np.testing.assert_array_equal(np.asarray(out), ref)  # values here fit 32-bit types too


def test_cuda_array_interface_odd_layouts_are_metadata_only():
    from ._helpers import CudaArrayInterface, cuda_iface

    for extra, elements in [
        ({"typestr": ">f4"}, True),
        ({"shape": (3,), "strides": (6,)}, False),
        ({"shape": (2, 2), "typestr": ">i2", "strides": (8, 3)}, False),
    ]:
        obj = asdlpack(CudaArrayInterface(cuda_iface(**extra)))
        assert isinstance(obj.copy_reason, str) and obj.copy_reason
        assert "needs_copy=True" in repr(obj)
        assert (obj.strides is not None) is elements
        assert obj.data_ptr == 0x7F0000000000
        if "strides" in extra:
            assert obj.byte_strides == extra["strides"]
        if not torch_cuda_available():
            # no driver: exporting still says why, as for any CUDA array interface object
            for kwargs in [{}, {"copy": True}, {"max_version": (1, 3)}]:
                with pytest.raises((BufferError, RuntimeError), match="(?i)cuda"):
                    obj.__dlpack__(**kwargs)


def test_normal_memory_has_no_copy_reason():
    for src in [
        bytearray(4),
        b"abc",
        np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::2],
        np.zeros((2, 3), dtype="<i4").T,
        np.broadcast_to(np.arange(3), (2, 3)),
        memoryview(bytearray(16)).cast("i", shape=[2, 2]),
        np.arange(4, dtype=">u1"),  # one-byte items have no byte order
    ]:
        obj = asdlpack(src)
        assert obj.copy_reason is None, src
        assert "needs_copy" not in repr(obj)
        assert obj.strides is not None
        assert obj.byte_strides == tuple(s * obj.itemsize for s in obj.strides)


# ---------------------------------------------------------------------------
# copy=True / None / False on normal memory
# ---------------------------------------------------------------------------


def _normal_sources():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    ro = np.arange(10, dtype=np.int16)
    ro.flags.writeable = False
    return {
        "contiguous": a,
        "strided": a[::2, 1::3],
        "reversed": a[::-1, ::-1],
        "fortran": np.asfortranarray(a),
        "transposed-3d": np.arange(60, dtype=np.int64).reshape(3, 4, 5).transpose(1, 2, 0),
        "broadcast": np.broadcast_to(np.arange(3, dtype=np.uint8), (4, 3)),
        "readonly": ro,
        "0d": np.array(2.5),
        "zero-size": np.zeros((0, 3), dtype=np.complex64),
        "bool": np.array([True, False, True, True]),
        "complex": np.arange(6).astype(np.complex128) * (1 + 2j),
        "float16": np.arange(7, dtype=np.float16),
    }


NORMAL = _normal_sources()


@pytest.mark.parametrize("name", list(NORMAL))
def test_copy_true_versioned(name):
    src = _normal_sources()[name]
    obj = asdlpack(src)
    cap = obj.__dlpack__(max_version=(1, 3), copy=True)
    info = CapsuleInfo(cap)
    assert info.flags & FLAG_IS_COPIED
    assert not info.flags & FLAG_READ_ONLY
    if src.size:
        assert info.first_element != obj.data_ptr
    np.testing.assert_array_equal(capsule_values(cap, src.dtype, src.shape), src)


@pytest.mark.parametrize("name", list(NORMAL))
def test_copy_true_legacy(name):
    src = _normal_sources()[name]
    obj = asdlpack(src)
    cap = obj.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor"
    if src.size:
        assert CapsuleInfo(cap).first_element != obj.data_ptr
    np.testing.assert_array_equal(capsule_values(cap, src.dtype, src.shape), src)


@pytest.mark.parametrize("name", list(NORMAL))
def test_copy_true_numpy_does_not_share(name):
    src = _normal_sources()[name]
    out = np.from_dlpack(asdlpack(src), copy=True)
    assert out.flags.writeable
    assert out.dtype == src.dtype
    np.testing.assert_array_equal(out, src)
    if src.size:
        assert not np.shares_memory(out, src)
        before = src.copy()
        out[...] = out.dtype.type(0)
        np.testing.assert_array_equal(src, before)


@pytest.mark.parametrize("name", list(NORMAL))
@pytest.mark.parametrize("copy", [None, False])
def test_no_copy_on_normal_memory(name, copy):
    src = _normal_sources()[name]
    obj = asdlpack(src)
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 3), copy=copy))
    assert not info.flags & FLAG_IS_COPIED
    assert bool(info.flags & FLAG_READ_ONLY) is (not src.flags.writeable)
    if src.size:
        assert info.first_element == np_data_ptr(src)


def test_copy_true_is_a_new_copy_each_time():
    obj = asdlpack(bytearray(range(8)))
    c1 = obj.__dlpack__(max_version=(1, 3), copy=True)
    c2 = obj.__dlpack__(max_version=(1, 3), copy=True)
    assert CapsuleInfo(c1).first_element != CapsuleInfo(c2).first_element


def test_copy_true_ml_dtypes():
    ml_dtypes = need("ml_dtypes")
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        src = np.arange(6, dtype=np.float32).astype(getattr(ml_dtypes, name))[::-1]
        obj = asdlpack(src)
        assert obj.dtype == name
        cap = obj.__dlpack__(max_version=(1, 3), copy=True)
        assert CapsuleInfo(cap).is_copied
        got = capsule_values(cap, src.dtype, src.shape)
        np.testing.assert_array_equal(got.astype(np.float32), src.astype(np.float32))


def test_copy_true_torch_consumer():
    torch = need("torch")
    src = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = torch.from_dlpack(asdlpack(src).__dlpack__(max_version=(1, 3), copy=True))
    np.testing.assert_array_equal(t.numpy(), src)
    t[0, 0] = 100
    assert src[0, 0] == 0


# ---------------------------------------------------------------------------
# read-only memory asked for a legacy capsule: a copy
# ---------------------------------------------------------------------------


def _readonly_sources(tmp_path):
    ro = np.arange(12, dtype=np.int32).reshape(3, 4)
    ro.flags.writeable = False
    bcast = np.broadcast_to(np.arange(3.0), (2, 3))
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes(range(32)))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return {
        "bytes": (b"\x01\x02\x03\x04\x05", np.array([1, 2, 3, 4, 5], dtype=np.uint8)),
        "numpy": (ro, ro),
        "numpy-strided": (ro[::-1, 1::2], ro[::-1, 1::2]),
        "memoryview": (memoryview(bytearray(b"xyz")).toreadonly(), np.frombuffer(b"xyz", "u1")),
        "mmap": (m, np.arange(32, dtype=np.uint8)),
        "broadcast": (bcast, bcast),
        "dlpackobject": (asdlpack(b"abc"), np.frombuffer(b"abc", "u1")),
    }


@pytest.mark.parametrize(
    "name", ["bytes", "numpy", "numpy-strided", "memoryview", "mmap", "broadcast", "dlpackobject"]
)
def test_readonly_legacy_export_is_a_writable_copy(tmp_path, name):
    src, ref = _readonly_sources(tmp_path)[name]
    obj = asdlpack(src)
    assert obj.readonly is True
    assert obj.copy_reason is None
    for kwargs in [{}, {"max_version": None}, {"max_version": (0, 5)}, {"copy": None}]:
        cap = obj.__dlpack__(**kwargs)
        assert capsule_name(cap) == "dltensor"
        info = CapsuleInfo(cap)
        assert info.first_element != obj.data_ptr
        got = capsule_values(cap, ref.dtype, ref.shape)
        np.testing.assert_array_equal(got, ref)
        # the copy belongs to the consumer: writing it leaves the source alone
        before = bytes(memoryview(np.ascontiguousarray(ref)).cast("B"))
        ctypes.memset(info.first_element, 0x5A, ref.size * ref.dtype.itemsize)
        assert bytes(memoryview(np.ascontiguousarray(ref)).cast("B")) == before
        del cap, info
    with pytest.raises(BufferError, match="copy=False"):
        obj.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="copy=False"):
        obj.__dlpack__(max_version=(0, 9), copy=False)
    del obj


@pytest.mark.parametrize(
    "name", ["bytes", "numpy", "numpy-strided", "memoryview", "mmap", "broadcast", "dlpackobject"]
)
@pytest.mark.parametrize("copy", [None, False])
def test_readonly_versioned_export_stays_zero_copy(tmp_path, name, copy):
    src, ref = _readonly_sources(tmp_path)[name]
    obj = asdlpack(src)
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 3), copy=copy))
    assert info.readonly
    assert not info.is_copied
    assert info.first_element == obj.data_ptr
    out = np.from_dlpack(obj)
    assert out.flags.writeable is False
    np.testing.assert_array_equal(out, ref)
    del out, obj, info


def test_readonly_legacy_copy_through_torch():
    torch = need("torch")
    src = np.arange(6, dtype=np.float32)
    src.flags.writeable = False
    cap = asdlpack(src).__dlpack__()  # legacy
    t = torch.from_dlpack(cap)
    assert t.data_ptr() != np_data_ptr(src)
    np.testing.assert_array_equal(t.numpy(), src)
    t += 1
    np.testing.assert_array_equal(src, np.arange(6, dtype=np.float32))


def test_readonly_through_legacy_consumer_numpy():
    src = b"\x07\x08\x09"
    out = np.from_dlpack(LegacyConsumer(asdlpack(src)))
    np.testing.assert_array_equal(out, [7, 8, 9])
    with pytest.raises(BufferError):
        np.from_dlpack(LegacyConsumer(asdlpack(src)), copy=False)


@pytest.mark.parametrize(
    "src, ref",
    [
        (b"\x01\x02\x03\x04", [1, 2, 3, 4]),
        (np.frombuffer(np.arange(5, dtype=np.float32).tobytes(), np.float32), np.arange(5.0)),
        (np.frombuffer(np.arange(12, dtype=np.int32).tobytes(), np.int32)[::-2], None),
    ],
    ids=["bytes", "readonly-numpy", "readonly-reversed"],
)
def test_jax_from_readonly_source(src, ref):
    jnp = need("jax.numpy", "jax")

    ref = np.asarray(src) if ref is None else ref
    obj = asdlpack(src)
    assert obj.readonly
    out = jnp.from_dlpack(obj)
    np.testing.assert_array_equal(np.asarray(out), ref)


def test_tvm_ffi_from_readonly_source():
    """The C exchange API can't say read-only: tvm-ffi gets a writable copy of read-only memory."""
    tvm_ffi = need("tvm_ffi")
    src = b"\x01\x02\x03"
    obj = asdlpack(src)
    t = tvm_ffi.from_dlpack(obj)
    assert t.data_ptr() != obj.data_ptr
    back = np.from_dlpack(t)
    np.testing.assert_array_equal(back, [1, 2, 3])
    assert back.flags.writeable
    back[0] = 9
    assert src == b"\x01\x02\x03"
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    t = tvm_ffi.from_dlpack(asdlpack(ro))
    np.testing.assert_array_equal(np.from_dlpack(t), ro)


# ---------------------------------------------------------------------------
# copyto: destinations x sources, against numpy.copyto on views of the same memory
# ---------------------------------------------------------------------------
# A destination factory returns (dst, whole, view): ``whole`` is a contiguous numpy array over
# all the memory the destination lives in, ``view(w)`` maps any array like ``whole`` to the
# numpy view ``dst`` stands for. The reference applies numpy.copyto to ``view(whole.copy())``.


def _np_dst(n, dtype, view):
    whole = np.zeros(n, dtype=dtype)
    return view(whole), whole, view


def _torch_dst(n, view_t, view_np):
    torch = need("torch")
    t = torch.zeros(n, dtype=torch.int32)
    return view_t(t), t.numpy(), view_np


def _odd_dst(shape, dtype, offset, strides, n=256):
    def view(w):
        return np.ndarray(shape, dtype=dtype, buffer=w, offset=offset, strides=strides)

    whole = np.zeros(n, dtype=np.uint8)
    return view(whole), whole, view


def _r34(w):
    return w.reshape(3, 4)


def _ident(w):
    return w


def _wrap_dst(wrap, make):
    """A destination factory whose destination is ``wrap`` of another factory's."""

    def factory():
        dst, whole, view = make()
        return wrap(dst), whole, view

    return factory


def _memoryview_dst():
    ba = bytearray(48)
    return memoryview(ba).cast("i", shape=[3, 4]), np.frombuffer(ba, np.int32), _r34


def _ctypes_2d_dst():
    c = ((ctypes.c_int32 * 4) * 3)()
    return c, np.ctypeslib.as_array(c).reshape(12), _r34


def _bytearray_dst():
    ba = bytearray(12)
    return ba, np.frombuffer(ba, np.uint8), _ident


def _bytearray_reversed_dst():
    ba = bytearray(24)
    return memoryview(ba)[::-2], np.frombuffer(ba, np.uint8), lambda w: w[::-2]


def _mmap_dst():
    m = mmap.mmap(-1, 12)
    return m, np.frombuffer(m, np.uint8), _ident


def _array_array_dst():
    a = array.array("B", bytes(12))
    return a, np.frombuffer(a, np.uint8), _ident


def _ctypes_dst():
    c = (ctypes.c_uint8 * 12)()
    return c, np.ctypeslib.as_array(c), _ident


def _ai(a):
    return ArrayInterface(array_interface_of(a), a)


DSTS_2D = {  # int32, shape (3, 4)
    "numpy": lambda: _np_dst(12, np.int32, _r34),
    "numpy-fortran": lambda: _np_dst(12, np.int32, lambda w: w.reshape(4, 3).T),
    "numpy-strided": lambda: _np_dst(48, np.int32, lambda w: w.reshape(6, 8)[::2, 1::2]),
    "numpy-negative": lambda: _np_dst(24, np.int32, lambda w: w.reshape(3, 8)[::-1, ::-2]),
    "numpy-big-endian": lambda: _np_dst(12, ">i4", _r34),
    "numpy-big-endian-strided": lambda: _np_dst(48, ">i4", lambda w: w.reshape(6, 8)[::-2, ::2]),
    "numpy-odd-strides": lambda: _odd_dst((3, 4), "<i4", 3, (27, 5)),
    "numpy-odd-negative-big-endian": lambda: _odd_dst((3, 4), ">i4", 3 + 2 * 27 + 3 * 5, (-27, -5)),
    "numpy-odd-fortran": lambda: _odd_dst((3, 4), "<i4", 1, (5, 17)),
    "memoryview": _memoryview_dst,
    "memoryview-of-strided-numpy": _wrap_dst(
        memoryview, lambda: _np_dst(48, np.int32, lambda w: w.reshape(6, 8)[1::2, ::-2])
    ),
    "array-interface": _wrap_dst(
        _ai, lambda: _np_dst(24, np.int32, lambda w: w.reshape(3, 8)[::-1, ::2])
    ),
    "dlpackobject": _wrap_dst(
        asdlpack, lambda: _np_dst(48, np.int32, lambda w: w.reshape(6, 8)[::2, 1::2])
    ),
    "dlpackobject-big-endian": _wrap_dst(
        asdlpack, lambda: _np_dst(12, ">i4", lambda w: w.reshape(4, 3).T)
    ),
    "dlpackobject-odd": _wrap_dst(asdlpack, lambda: _odd_dst((3, 4), "<i4", 2, (22, 5))),
    "torch": lambda: _torch_dst(12, lambda t: t.view(3, 4), _r34),
    "torch-transposed": lambda: _torch_dst(
        12, lambda t: t.view(4, 3).t(), lambda w: w.reshape(4, 3).T
    ),
    "torch-strided": lambda: _torch_dst(
        48, lambda t: t.view(6, 8)[1::2, ::2], lambda w: w.reshape(6, 8)[1::2, ::2]
    ),
    "ctypes-2d": _ctypes_2d_dst,
}

DSTS_1D = {  # uint8, shape (12,)
    "bytearray": _bytearray_dst,
    "bytearray-memoryview-reversed": _bytearray_reversed_dst,
    "mmap": _mmap_dst,
    "array-array": _array_array_dst,
    "ctypes": _ctypes_dst,
    "numpy-uint8-strided": lambda: _np_dst(36, np.uint8, lambda w: w[1::3]),
}


def _src_factories():
    """name -> (shape, dtype) -> (src, reference values broadcastable to shape)."""

    def numpy_(shape, dt):
        v = _values(shape, dt)
        return v, v

    def fortran(shape, dt):
        v = np.asfortranarray(_values(shape, dt))
        return v, v

    def reversed_(shape, dt):
        big = np.zeros(tuple(2 * n for n in shape), dtype=dt)
        view = big[tuple(slice(None, None, -2) for _ in shape)]
        view[...] = _values(shape, dt)
        return view, view

    def big_endian(shape, dt):
        v = _values(shape, dt).astype(np.dtype(dt).newbyteorder(">"))
        return v, v

    def odd(shape, dt):
        v = odd_view(shape, dt, pad=3, reverse=True, fill=_values(shape, dt))
        return v, np.array(v)

    def odd_be(shape, dt):
        v = odd_view(shape, np.dtype(dt).newbyteorder(">"), pad=1, fill=_values(shape, dt))
        return v, np.array(v)

    def readonly(shape, dt):
        v = _values(shape, dt)
        v.flags.writeable = False
        return v, v

    def broadcast_to(shape, dt):
        row = _values(shape[-1:], dt)
        v = np.broadcast_to(row, shape)
        return v, v

    def row(shape, dt):
        v = _values(shape[-1:], dt)[::-1]
        return v, v

    def column(shape, dt):
        v = _values(shape[:1] + (1,) * (len(shape) - 1), dt)
        return v, v

    def scalar(shape, dt):
        v = np.array(_values((5,), dt)[3])
        return v, v

    def memoryview_(shape, dt):
        v, ref = reversed_(shape, dt)
        return memoryview(v), ref

    def bytes_(shape, dt):
        v = _values(shape, dt)
        return memoryview(v.tobytes()).cast(np.dtype(dt).char, shape=list(shape)), v

    def array_interface(shape, dt):
        v, ref = reversed_(shape, dt)
        return ArrayInterface(array_interface_of(v), v), ref

    def array_struct(shape, dt):
        v, ref = big_endian(shape, dt)
        return ArrayStruct(v), ref

    def dlpackobject(shape, dt):
        v, ref = fortran(shape, dt)
        return asdlpack(v), ref

    def capsule(shape, dt):
        v, ref = reversed_(shape, dt)
        return v.__dlpack__(max_version=(1, 0)), ref

    def legacy_capsule(shape, dt):
        v = _values(shape, dt)
        return v.__dlpack__(), v

    def torch_(shape, dt):
        torch = need("torch")
        v = _values(shape, dt)
        reverse = tuple(range(v.ndim))[::-1]
        t = torch.from_numpy(np.ascontiguousarray(v.transpose(reverse))).permute(reverse)
        return t, v

    def jax_(shape, dt):
        jnp = need("jax.numpy", "jax")

        v = _values(shape, dt)
        return jnp.asarray(v), v

    def array_array(shape, dt):
        v = _values(shape[-1:], dt)
        return array.array(np.dtype(dt).char, v.tolist()), v

    def ctypes_(shape, dt):
        v = _values(shape, dt)
        return np.ctypeslib.as_ctypes(v), v

    def pil(shape, dt):
        v = _values(shape, dt)
        return _pil(v, np.dtype(dt).char), v

    return {
        "numpy": numpy_,
        "numpy-fortran": fortran,
        "numpy-reversed": reversed_,
        "numpy-big-endian": big_endian,
        "numpy-odd-strides": odd,
        "numpy-odd-big-endian": odd_be,
        "numpy-readonly": readonly,
        "numpy-broadcast-to": broadcast_to,
        "row": row,
        "column": column,
        "scalar": scalar,
        "memoryview": memoryview_,
        "bytes": bytes_,
        "array-interface": array_interface,
        "array-struct-big-endian": array_struct,
        "dlpackobject": dlpackobject,
        "capsule": capsule,
        "legacy-capsule": legacy_capsule,
        "torch-transposed": torch_,
        "jax": jax_,
        "array-array": array_array,
        "ctypes": ctypes_,
        "pil": pil,
    }


SRCS = _src_factories()
DSTS = {**DSTS_2D, **DSTS_1D}


def _check_copyto(dst, whole, view, src, ref):
    """copyto(dst, src) changes exactly the bytes numpy.copyto changes on a copy of the memory."""
    whole.view(np.uint8)[...] = 0xA5  # sentinel around and under the destination
    expected = whole.copy()
    np.copyto(view(expected), ref)
    assert copyto(dst, src) is None
    np.testing.assert_array_equal(whole.view(np.uint8), expected.view(np.uint8))
    target = view(whole)
    np.testing.assert_array_equal(target, np.broadcast_to(ref, target.shape))


@pytest.mark.parametrize("src_name", list(SRCS))
@pytest.mark.parametrize("dst_name", list(DSTS))
def test_copyto_matrix(dst_name, src_name):
    dst, whole, view = DSTS[dst_name]()
    target = view(whole)
    src, ref = SRCS[src_name](target.shape, target.dtype.newbyteorder("="))
    _check_copyto(dst, whole, view, src, ref)


@pytest.mark.parametrize("dtype", NUMPY_NATIVE_DTYPES)
@pytest.mark.parametrize("src_order, dst_order", [("=", "="), (">", "="), ("=", ">"), (">", ">")])
def test_copyto_dtypes_and_byte_order(dtype, src_order, dst_order):
    dt = np.dtype(dtype)
    vals = _values((4, 5), dt)
    src = vals.astype(dt.newbyteorder(src_order))[::-1]
    whole = np.zeros(40, dtype=dt.newbyteorder(dst_order))

    def view(w):
        return w.reshape(5, 8)[::-1, 1::2].T

    _check_copyto(view(whole), whole, view, src, src)
    # and through odd byte strides on both sides
    osrc = odd_view((4, 5), dt.newbyteorder(src_order), pad=1, fill=vals)
    odst = odd_view((4, 5), dt.newbyteorder(dst_order), pad=3, reverse=True)
    before = odst.base.copy()
    copyto(odst, osrc)
    np.testing.assert_array_equal(odst, vals)
    expected = before.copy()
    offset = np_data_ptr(odst) - np_data_ptr(odst.base)
    np.copyto(np.ndarray(odst.shape, odst.dtype, expected, offset, odst.strides), osrc)
    np.testing.assert_array_equal(odst.base, expected)


def test_copyto_ml_dtypes():
    ml_dtypes = need("ml_dtypes")
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        dt = np.dtype(getattr(ml_dtypes, name))
        src = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dt)
        dst = np.zeros((4, 3), dtype=dt).T
        copyto(dst, src)
        np.testing.assert_array_equal(dst.astype(np.float32), src.astype(np.float32))
        with pytest.raises(TypeError):
            copyto(dst, src.astype(np.float16))


def test_copyto_torch_bfloat16():
    torch = need("torch")
    ml_dtypes = need("ml_dtypes")
    src = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = torch.zeros(6, dtype=torch.bfloat16)
    copyto(t, src)
    assert t.float().tolist() == list(range(6))
    back = np.zeros(6, dtype=ml_dtypes.bfloat16)
    copyto(back, t * 2)
    np.testing.assert_array_equal(back.astype(np.float32), np.arange(6) * 2)


@pytest.mark.parametrize("name", list(ODD))
def test_copyto_from_odd_sources(name):
    obj, ref, _ = _odd(name)
    dst = np.zeros(ref.shape, dtype=ref.dtype)
    copyto(dst, obj)
    np.testing.assert_array_equal(dst, ref)
    fdst = np.zeros(ref.shape[::-1], dtype=ref.dtype.newbyteorder(">")).T
    copyto(fdst, obj)
    np.testing.assert_array_equal(fdst, ref)


def test_copyto_into_pil_destination():
    """Suboffsets (indirect memory) as destination: written correctly or refused, never wrong."""
    vals = _values((3, 4), np.int32)
    dst = _pil(np.zeros((3, 4), np.int32), "i", writable=True)
    try:
        copyto(dst, vals)
    except ValueError as exc:
        assert "suboffset" in str(exc)
        assert memoryview(dst).tolist() == np.zeros((3, 4), int).tolist()
    else:
        assert memoryview(dst).tolist() == vals.tolist()


def test_copyto_returns_none_and_is_exported():
    assert dlpack.copyto is copyto
    assert "copyto" in dlpack.__all__
    dst = np.zeros(3)
    assert copyto(dst, np.ones(3)) is None


def test_copyto_argument_order_like_numpy():
    dst = np.zeros(3, dtype=np.int64)
    src = np.arange(3, dtype=np.int64) + 1
    copyto(dst, src)
    np.testing.assert_array_equal(dst, [1, 2, 3])
    np.testing.assert_array_equal(src, [1, 2, 3])


# ---------------------------------------------------------------------------
# overlap: the result is numpy's (as if the source were copied first)
# ---------------------------------------------------------------------------


def _overlap_cases():
    def r2(w):
        return w.reshape(6, 6)

    def odd_pair(w):
        u8 = w.view(np.uint8)
        dst = np.ndarray((9,), "<i4", buffer=u8, offset=0, strides=(5,))
        src = np.ndarray((9,), "<i4", buffer=u8, offset=2, strides=(5,))
        return dst, src

    def odd_pair_reverse(w):
        u8 = w.view(np.uint8)
        dst = np.ndarray((9,), "<i4", buffer=u8, offset=3, strides=(5,))
        src = np.ndarray((9,), "<i4", buffer=u8, offset=3 + 8 * 5 + 1, strides=(-5,))
        return dst, src

    return {
        "shift-right": lambda w: (w[1:], w[:-1]),
        "shift-left": lambda w: (w[:-1], w[1:]),
        "shift-right-by-3": lambda w: (w[3:], w[:-3]),
        "reverse": lambda w: (w[::-1], w),
        "reverse-into-self": lambda w: (w, w[::-1]),
        "same": lambda w: (w, w),
        "transpose": lambda w: (r2(w), r2(w).T),
        "transpose-strided": lambda w: (r2(w)[::2, ::2], r2(w)[::2, ::2].T),
        "shift-2d": lambda w: (r2(w)[1:, 1:], r2(w)[:-1, :-1]),
        "shift-2d-back": lambda w: (r2(w)[:-1, :-1], r2(w)[1:, 1:]),
        "flip-columns": lambda w: (r2(w)[:, ::-1], r2(w)),
        "flip-both": lambda w: (r2(w), r2(w)[::-1, ::-1]),
        "broadcast-row-from-inside": lambda w: (r2(w), r2(w)[2]),
        "broadcast-column-from-inside": lambda w: (r2(w), r2(w)[:, 3:4]),
        "interleaved": lambda w: (w[::2], w[1::2]),
        "byteswap-in-place": lambda w: (w, w.view(">i4")),
        "byteswap-shifted": lambda w: (w[1:], w.view(">i4")[:-1]),
        "odd-strides": odd_pair,
        "odd-strides-reversed": odd_pair_reverse,
        "bytes-shift": lambda w: (w.view(np.uint8)[1:], w.view(np.uint8)[:-1]),
    }


OVERLAPS = _overlap_cases()

_WRAP = {
    "numpy": lambda a: a,
    "memoryview": memoryview,
    "dlpackobject": asdlpack,
    "array-interface": lambda a: ArrayInterface(array_interface_of(a), a),
}


@pytest.mark.parametrize("wrap", [("numpy", "numpy"), ("memoryview", "dlpackobject"),
                                  ("dlpackobject", "array-interface")])  # fmt: skip
@pytest.mark.parametrize("name", list(OVERLAPS))
def test_copyto_overlap(name, wrap):
    make = OVERLAPS[name]
    base = (np.arange(36, dtype=np.int32) * 0x01030507) ^ 0x5A5A
    expected = base.copy()
    d, s = make(expected)
    np.copyto(d, s.copy())  # numpy's answer: the source as it was before the copy
    expected_np = base.copy()
    d, s = make(expected_np)
    np.copyto(d, s)
    np.testing.assert_array_equal(expected_np, expected)  # numpy agrees with itself
    got = base.copy()
    d, s = make(got)
    copyto(_WRAP[wrap[0]](d), _WRAP[wrap[1]](s))
    np.testing.assert_array_equal(got, expected)


def test_copyto_overlap_torch_and_numpy_share_memory():
    torch = need("torch")
    t = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    a = t.numpy()
    expected = a.copy()
    np.copyto(expected, expected.T.copy())
    copyto(t, a.T)
    np.testing.assert_array_equal(a, expected)
    t2 = torch.arange(10, dtype=torch.int64)
    copyto(t2[1:], t2.numpy()[:-1])
    assert t2.tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_copyto_overlap_large():
    n = 1 << 16  # 256 KiB of int32: over the threshold where copies leave the GIL
    base = np.arange(n, dtype=np.int32)
    x = base.copy()
    copyto(x[1:], x[:-1])
    np.testing.assert_array_equal(x, np.concatenate([[0], base[:-1]]))
    x = base.copy()
    copyto(x[:-7], x[7:])
    np.testing.assert_array_equal(x[:-7], base[7:])
    x = base.copy()
    copyto(x, x[::-1])
    np.testing.assert_array_equal(x, base[::-1])
    sq = np.arange(512 * 512, dtype=np.float64).reshape(512, 512)
    ref = sq.T.copy()
    copyto(sq, sq.T)
    np.testing.assert_array_equal(sq, ref)


# ---------------------------------------------------------------------------
# broadcasting, dtypes, read-only and immutable destinations, edge shapes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dst_shape, src_shape",
    [
        ((3, 4), (3, 4)),
        ((3, 4), (4,)),
        ((3, 4), (1, 4)),
        ((3, 4), (3, 1)),
        ((3, 4), (1, 1)),
        ((3, 4), ()),
        ((2, 3, 4), (3, 1)),
        ((2, 3, 4), (2, 1, 4)),
        ((2, 3, 4), (1, 3, 1)),
        ((5,), (1,)),
        ((), ()),
        ((0, 3), (3,)),
        ((0, 3), (1, 3)),
        ((0, 3), (0, 3)),
        ((3, 0), (0,)),
        ((3, 0), (1,)),
        ((3, 0), ()),
    ],
)
def test_copyto_broadcasting(dst_shape, src_shape):
    src = _values(src_shape, np.int16) + 1
    dst = np.zeros(dst_shape, dtype=np.int16)
    expected = dst.copy()
    np.copyto(expected, src)
    copyto(dst, src)
    np.testing.assert_array_equal(dst, expected)
    # the same through other protocols
    dst2 = np.zeros(dst_shape, dtype=np.int16)
    copyto(memoryview(dst2), ArrayInterface(array_interface_of(src), src))
    np.testing.assert_array_equal(dst2, expected)


@pytest.mark.parametrize(
    "dst_shape, src_shape",
    [
        ((3, 4), (3,)),
        ((3, 4), (2, 4)),
        ((3, 4), (4, 3)),
        ((3, 4), (2, 3, 4)),
        ((3, 1), (3, 4)),
        ((3,), (0,)),
        ((0,), (2,)),
        ((), (2,)),
        ((2, 3, 4), (3, 4, 1)),
    ],
)
def test_copyto_incompatible_shapes(dst_shape, src_shape):
    src = _values(src_shape, np.int16)
    dst = np.zeros(dst_shape, dtype=np.int16)
    with pytest.raises(ValueError):
        np.copyto(dst.copy(), src)  # numpy agrees
    with pytest.raises(ValueError):
        copyto(dst, src)
    assert not dst.any()


@pytest.mark.parametrize(
    "dst_shape, src_shape", [((3, 4), (1, 3, 4)), ((), (1,)), ((), (1, 1)), ((4,), (1, 1, 4))]
)
def test_copyto_leading_unit_dimensions_like_numpy(dst_shape, src_shape):
    """numpy.copyto drops leading length-1 dimensions of the source before broadcasting."""
    src = _values(src_shape, np.int16) + 1
    expected = np.zeros(dst_shape, dtype=np.int16)
    np.copyto(expected, src)
    dst = np.zeros(dst_shape, dtype=np.int16)
    copyto(dst, src)
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.parametrize(
    "dst_dtype, src_dtype",
    [
        ("int32", "int64"),
        ("int64", "int32"),
        ("float32", "int32"),
        ("int32", "float32"),
        ("uint8", "int8"),
        ("int8", "uint8"),
        ("bool", "uint8"),
        ("uint8", "bool"),
        ("float32", "float64"),
        ("float64", "complex128"),
        ("complex64", "float64"),
        ("float16", "int16"),
        ("uint16", "float16"),
        ("uint32", "float32"),
        ("uint64", "int64"),
    ],
)
def test_copyto_dtype_mismatch(dst_dtype, src_dtype):
    dst = np.zeros(4, dtype=dst_dtype)
    src = np.ones(4, dtype=src_dtype)
    with pytest.raises(TypeError):
        copyto(dst, src)
    with pytest.raises(TypeError):
        copyto(dst, src.astype(np.dtype(src_dtype).newbyteorder(">")))
    with pytest.raises(TypeError):
        copyto(dst, np.array(src[0]))  # even a scalar is not cast
    assert not dst.any()


def test_copyto_dtype_mismatch_other_protocols():
    with pytest.raises(TypeError):
        copyto(bytearray(8), memoryview(bytearray(8)).cast("i"))
    with pytest.raises(TypeError):
        copyto(array.array("f", [0.0] * 3), array.array("i", [1, 2, 3]))
    torch = need("torch")
    with pytest.raises(TypeError):
        copyto(torch.zeros(3), np.ones(3))  # float32 <- float64


def _readonly_destinations(tmp_path):
    ro = np.zeros(4, dtype=np.uint8)
    ro.flags.writeable = False
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes(4))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = bytes(4)
    return {
        "bytes": bytes(4),
        "numpy-readonly": ro,
        "numpy-frombuffer-bytes": np.frombuffer(buf, np.uint8),
        "mmap-read": m,
        "dlpackobject-of-bytes": asdlpack(bytes(4)),
        "memoryview-readonly": memoryview(bytearray(4)).toreadonly(),
        "array-interface-readonly": ArrayInterface(array_interface_of(ro), ro),
        "broadcast-to": np.broadcast_to(np.zeros(1, np.uint8), (4,)),
    }


@pytest.mark.parametrize(
    "name",
    [
        "bytes",
        "numpy-readonly",
        "numpy-frombuffer-bytes",
        "mmap-read",
        "dlpackobject-of-bytes",
        "memoryview-readonly",
        "array-interface-readonly",
        "broadcast-to",
    ],
)
def test_copyto_readonly_destination(tmp_path, name):
    dst = _readonly_destinations(tmp_path)[name]
    with pytest.raises(ValueError):
        copyto(dst, np.full(4, 7, dtype=np.uint8))
    np.testing.assert_array_equal(np.from_dlpack(asdlpack(dst)), np.zeros(4, np.uint8))
    del dst


def _writable_view(base, shape, strides, dtype=None):
    view = np.lib.stride_tricks.as_strided(base, shape, strides, writeable=True)
    return view if dtype is None else view.view(dtype)


@pytest.mark.parametrize(
    "shape, strides",
    [
        ((3, 4), (0, 4)),  # a broadcast row
        ((6,), (2,)),  # int32 elements two bytes apart
        ((3, 4), (8, 4)),  # rows that run into each other
        ((2048, 1024), (4, 4)),  # 8 MiB of writes into 8 KiB: the threaded size
        ((1 << 21,), (3,)),  # odd byte stride, threaded size
        ((1 << 11, 1 << 11), (12, 8)),  # element (2, 0) is element (0, 3)
    ],
)
def test_copyto_refuses_destinations_whose_elements_overlap(shape, strides):
    """More than one element of the destination in the same bytes: a ValueError (as torch
    raises), never a race between copy threads, and nothing written."""
    x = np.zeros(1 << 23, dtype=np.uint8)
    dst = _writable_view(x.view(np.int32), shape, strides)
    src = np.arange(dst.size, dtype=np.int32).reshape(shape)
    with pytest.raises(ValueError, match="same memory"):
        copyto(dst, src)
    assert not x.any()
    bcast = np.broadcast_to(np.zeros(4, dtype=np.int32), (3, 4))
    with pytest.raises(ValueError):
        copyto(bcast, np.ones((3, 4), np.int32))


def test_copyto_interleaved_destination_that_does_not_overlap():
    """Strides that don't nest but never meet (elements interleaved) are written as numpy
    writes them, at a threaded size too."""
    for shape, strides in [((2, 3), (12, 8)), ((2, 1 << 21), (12, 8))]:
        itemsize = 4
        need = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + itemsize
        ours, numpys = np.zeros(need, np.uint8), np.zeros(need, np.uint8)
        src = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
        copyto(_writable_view(ours.view(np.int32)[: need // 4], shape, strides), src)
        np.copyto(_writable_view(numpys.view(np.int32)[: need // 4], shape, strides), src)
        np.testing.assert_array_equal(ours, numpys)


def test_copyto_jax_destination():
    jnp = need("jax.numpy", "jax")

    j = jnp.zeros(4, dtype=jnp.float32)
    with pytest.raises(ValueError):
        copyto(j, np.ones(4, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(j), np.zeros(4))
    # a JAX array as a source is fine
    dst = np.zeros(4, dtype=np.float32)
    copyto(dst, j + 2)
    np.testing.assert_array_equal(dst, [2, 2, 2, 2])


@pytest.mark.parametrize(
    "dst, src",
    [(5, np.ones(3)), (np.ones(3), "abc"), (np.ones(3), object()), ([0, 0], np.zeros(2))],
    ids=["int-dst", "str-src", "object-src", "list-dst"],
)
def test_copyto_no_protocol(dst, src):
    with pytest.raises(TypeError):
        copyto(dst, src)


def test_copyto_arguments():
    with pytest.raises(TypeError):
        copyto(np.zeros(3))
    with pytest.raises(TypeError):
        copyto()


def test_copyto_0d():
    dst = np.array(0, dtype=np.int32)
    copyto(dst, np.array(5, dtype=np.int32))
    assert dst == 5
    copyto(dst, np.array(-9, dtype=">i4"))
    assert dst == -9
    copyto(memoryview(dst), asdlpack(np.array(11, dtype=np.int32)))
    assert dst == 11
    be = np.array(0, dtype=">f8")
    copyto(be, np.array(2.5))
    assert be == 2.5
    assert be.tobytes() == np.array(2.5, dtype=">f8").tobytes()
    full = np.zeros((2, 3), dtype=np.float64)
    copyto(full, np.array(1.5))
    assert (full == 1.5).all()
    torch = need("torch")
    t = torch.tensor(0, dtype=torch.int64)
    copyto(t, np.array(42, dtype=np.int64))
    assert int(t) == 42


@pytest.mark.parametrize(
    "dst, src",
    [
        (np.zeros((0, 3), np.float32), np.ones(3, np.float32)),
        (np.zeros((2, 0), np.int8), np.zeros((0,), np.int8)),
        (np.zeros((0,), np.int8), np.zeros((0,), np.int8)),
        (np.zeros((4, 0, 2), ">i4")[::-1], np.zeros((0, 2), "<i4")),
        (bytearray(), b""),
        (np.zeros((0, 3), np.float32), np.ones((0, 3), ">f4")),
        (
            ArrayInterface({"shape": (0, 3), "typestr": "<f4", "data": (0, False), "version": 3}),
            np.ones(3, np.float32),
        ),
    ],
    ids=["broadcast-row", "zero-cols", "empty", "reversed-be", "bytearray", "be-src", "null-ptr"],
)
def test_copyto_zero_size(dst, src):
    assert copyto(dst, src) is None


# ---------------------------------------------------------------------------
# large copies
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_src",
    [
        lambda a: a,
        lambda a: a.T,
        lambda a: a[::-1, ::-1],
        lambda a: a.astype(">i4"),
        lambda a: a.astype(">i4").T,
        lambda a: np.asfortranarray(a),
    ],
    ids=["contiguous", "transposed", "reversed", "big-endian", "big-endian-transposed", "fortran"],
)
def test_copyto_large(make_src):
    a = np.arange(512 * 512, dtype=np.int32).reshape(512, 512) * 3
    src = make_src(a)
    for dst in (np.zeros((512, 512), np.int32), np.zeros((512, 512), np.int32).T,
                np.zeros((512, 512), ">i4")[::-1]):  # fmt: skip
        copyto(dst, src)
        np.testing.assert_array_equal(dst, src)
    out = np.from_dlpack(asdlpack(src), copy=True)
    np.testing.assert_array_equal(out, src)


def test_copyto_large_odd_strides():
    shape = (300, 70)
    vals = _values(shape, np.int32) * 1000
    src = odd_view(shape, "<i4", pad=1, fill=vals)
    dst = odd_view(shape, ">i4", pad=3, reverse=True)
    copyto(dst, src)
    np.testing.assert_array_equal(dst, vals)
    np.testing.assert_array_equal(np.from_dlpack(asdlpack(dst)), vals)


def test_large_copy_releases_the_gil():
    """A second Python thread runs while a large copy is in progress.

    With a switch interval far longer than the test, this thread keeps the GIL unless it lets
    it go itself: the other thread can count only while copyto has released it."""
    n = 2048
    src = np.arange(n * n, dtype=np.float64).reshape(n, n)
    dst = np.zeros((n, n), dtype=np.float64)
    count = 0
    stop = threading.Event()

    def worker():
        nonlocal count
        while not stop.is_set():
            count += 1
            time.sleep(0.0001)  # lets the GIL go, so the main thread gets it back at once

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    th = threading.Thread(target=worker, daemon=True)
    try:
        th.start()
        during = []
        for _ in range(5):
            before = count
            copyto(dst, src.T)  # a strided (transposing) copy of 32 MiB
            during.append(count - before)
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        th.join()
    np.testing.assert_array_equal(dst, src.T)
    assert max(during) > 0, f"no other thread ran during the copies: {during}"


def test_copyto_from_another_thread_while_reading():
    """Copies in several threads at once (the GIL is released) give the right results."""
    srcs = [np.arange(1 << 18, dtype=np.int64) * (i + 1) for i in range(4)]
    dsts = [np.zeros(1 << 18, dtype=np.int64) for _ in range(4)]
    errors = []

    def run(i):
        try:
            for _ in range(3):
                copyto(dsts[i][::-1], srcs[i][::-1])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for s, d in zip(srcs, dsts, strict=True):
        np.testing.assert_array_equal(s, d)


# ---------------------------------------------------------------------------
# property test: random layouts, dtypes and byte orders against numpy.copyto
# ---------------------------------------------------------------------------

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:

    def test_copyto_property():
        need("hypothesis")  # a skip with the reason, or a failure where it is required

else:

    @st.composite
    def _layouts(draw, shape, itemsize, *, zero_strides=False):
        """(offset, byte strides, bytes needed) of a layout of ``shape``: any order, gaps,
        reversed dimensions, byte strides that may not be whole elements, a start that may be
        unaligned; distinct elements never overlap unless ``zero_strides`` adds 0 strides."""
        ndim = len(shape)
        odd = itemsize > 1 and draw(st.booleans())
        unit = 1 if odd else itemsize
        strides = [0] * ndim
        pitch = itemsize
        for d in draw(st.permutations(range(ndim))):  # fastest-varying first
            strides[d] = pitch + draw(st.integers(0, 2)) * unit
            pitch = strides[d] * max(shape[d], 1)
        for d in range(ndim):
            if zero_strides and draw(st.integers(0, 4)) == 0:
                strides[d] = 0
            elif draw(st.booleans()):
                strides[d] = -strides[d]
        start = draw(st.integers(0, 3)) * unit
        empty = 0 in shape
        low = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0 and not empty)
        high = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0 and not empty)
        offset = start - low
        return offset, tuple(strides), offset + high + itemsize + draw(st.integers(0, 5))

    @st.composite
    def _copy_problems(draw):
        ndim = draw(st.integers(0, 4))
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
        dtype = np.dtype(draw(st.sampled_from(NUMPY_NATIVE_DTYPES)))
        dst_dtype = dtype.newbyteorder(draw(st.sampled_from("<>")))
        src_dtype = dtype.newbyteorder(draw(st.sampled_from("<>")))
        drop = draw(st.integers(0, ndim))
        src_shape = tuple(1 if draw(st.integers(0, 3)) == 0 else n for n in shape[drop:])
        dst_layout = draw(_layouts(shape, dtype.itemsize))
        src_layout = draw(_layouts(src_shape, dtype.itemsize, zero_strides=True))
        shared = dtype.kind in "iu" and draw(st.integers(0, 3)) == 0
        return {
            "shape": shape,
            "src_shape": src_shape,
            "dst_dtype": dst_dtype,
            "src_dtype": src_dtype,
            "dst_layout": dst_layout,
            "src_layout": src_layout,
            "shared": shared,
            "dst_wrap": draw(st.sampled_from([w for w in _PROP_WRAP if w != "array-struct"])),
            "src_wrap": draw(st.sampled_from(list(_PROP_WRAP))),
            "seed": draw(st.integers(0, 2**32 - 1)),
        }

    def _on(buf, shape, dtype, layout):
        offset, strides, _ = layout
        return np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset, strides=strides)

    _PROP_WRAP = {
        "numpy": lambda a: a,
        "memoryview": memoryview,
        "array-interface": lambda a: ArrayInterface(array_interface_of(a), a),
        "array-struct": ArrayStruct,
        "dlpack": asdlpack,
    }

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(p=_copy_problems())
    def test_copyto_property(p):
        rng = np.random.default_rng(p["seed"])
        bool_ = p["dst_dtype"].kind == "b"

        def random_bytes(n):
            b = rng.integers(0, 256, size=n, dtype=np.uint8)
            return b & 1 if bool_ else b  # bool memory holds 0 or 1

        dst_need, src_need = p["dst_layout"][2], p["src_layout"][2]
        if p["shared"]:
            dst_base = random_bytes(max(dst_need, src_need))
            src_base = dst_base
        else:
            dst_base = random_bytes(dst_need)
            src_base = random_bytes(src_need)
        # numpy's answer, on copies, with the source read before anything is written
        expected = dst_base.copy()
        src_values = _on(src_base, p["src_shape"], p["src_dtype"], p["src_layout"]).copy()
        np.copyto(_on(expected, p["shape"], p["dst_dtype"], p["dst_layout"]), src_values)

        dst = _on(dst_base, p["shape"], p["dst_dtype"], p["dst_layout"])
        src = _on(src_base, p["src_shape"], p["src_dtype"], p["src_layout"])
        assert copyto(_PROP_WRAP[p["dst_wrap"]](dst), _PROP_WRAP[p["src_wrap"]](src)) is None
        np.testing.assert_array_equal(dst_base, expected)
        if not p["shared"]:
            # and exporting the (possibly odd) source gives its values
            out = np.from_dlpack(asdlpack(src))
            assert out.dtype == p["src_dtype"].newbyteorder("=")
            assert out.tobytes() == src_values.astype(out.dtype).tobytes()

    def _elements_overlap(shape, strides, itemsize):
        """Reference: mark each byte of each element; any byte marked twice is an overlap."""
        seen = set()
        for index in np.ndindex(*shape):
            start = sum(i * s for i, s in zip(index, strides, strict=True))
            for b in range(start, start + itemsize):
                if b in seen:
                    return True
                seen.add(b)
        return False

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        dims=st.lists(st.tuples(st.integers(0, 5), st.integers(-12, 12)), max_size=3),
        dtype=st.sampled_from(["u1", "i2", "f4", "c8"]),
        seed=st.integers(0, 2**32 - 1),
    )
    def test_copyto_destination_overlap_property(dims, dtype, seed):
        """Any byte strides: a destination whose elements overlap is refused with nothing
        written; any other gets numpy.copyto's bytes."""
        dtype = np.dtype(dtype)
        shape = tuple(n for n, _ in dims)
        strides = tuple(s for _, s in dims)
        empty = 0 in shape
        low = sum((n - 1) * s for n, s in dims if s < 0 and not empty)
        high = sum((n - 1) * s for n, s in dims if s > 0 and not empty)
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 256, size=high - low + dtype.itemsize + 8, dtype=np.uint8)
        src = rng.integers(0, 100, size=shape).astype(dtype)

        def view(buf):
            return np.ndarray(shape, dtype, buffer=buf, offset=-low, strides=strides)

        ours = base.copy()
        if not empty and _elements_overlap(shape, strides, dtype.itemsize):
            with pytest.raises(ValueError, match="same memory"):
                copyto(view(ours), src)
            np.testing.assert_array_equal(ours, base)
        else:
            copyto(view(ours), src)
            expected = base.copy()
            np.copyto(view(expected), src)
            np.testing.assert_array_equal(ours, expected)


# copyto's stream argument, and CUDA arrays on a machine without a usable driver


@pytest.mark.parametrize("stream", [0, -1, -7])
def test_copyto_stream_must_be_a_positive_handle(stream):
    dst = np.zeros(3)
    with pytest.raises(ValueError, match="stream"):
        copyto(dst, np.ones(3), stream=stream)
    assert not dst.any()


@pytest.mark.parametrize("stream", ["1", 1.0, (1,)])
def test_copyto_stream_must_be_an_int(stream):
    with pytest.raises(TypeError, match="stream"):
        copyto(np.zeros(3), np.ones(3), stream=stream)


def test_copyto_stream_is_for_cuda_memory():
    dst = np.zeros(3)
    with pytest.raises(ValueError, match="host memory"):
        copyto(dst, np.ones(3), stream=1)
    assert not dst.any()
    copyto(dst, np.ones(3), stream=None)
    assert dst.tolist() == [1.0, 1.0, 1.0]


def test_copyto_stream_is_keyword_only():
    with pytest.raises(TypeError):
        copyto(np.zeros(3), np.ones(3), 1)


@pytest.mark.parametrize("side", ["destination", "source"])
def test_copyto_cuda_without_a_driver_says_why(side):
    from ._helpers import CudaArrayInterface, cuda_iface

    if torch_cuda_available():
        pytest.skip("a CUDA device is available")
    cuda = CudaArrayInterface(cuda_iface(shape=(2, 3), typestr="<f4"))
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = host.copy()
    dst, src = (cuda, host) if side == "destination" else (host, cuda)
    for stream in (None, 1):
        with pytest.raises((BufferError, RuntimeError), match="(?i)cuda"):
            copyto(dst, src, stream=stream)
    np.testing.assert_array_equal(host, before)
