"""``dlpack.copyto(dst, src)``: every destination x every source, checked against
``numpy.copyto`` on numpy views of the same memory, and overlapping source and destination."""

import array
import ctypes
import mmap

import pytest

import dlpack
from dlpack import asdlpack, copyto

from ._copy_helpers import ODD, _odd, _pil, _values, odd_view
from ._helpers import (
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    array_interface_of,
    need,
    np_data_ptr,
)

np = need("numpy")


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
        "byteswapped-both-shifted": lambda w: (w.view(">i4")[1:], w.view(">i4")[:-1]),
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
