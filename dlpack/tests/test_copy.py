"""Copies on export: memory DLPack can't express as it is (non-native byte order, byte strides
that are not whole elements, suboffsets), ``copy=True`` / ``None`` / ``False`` on normal memory,
and read-only memory asked for a legacy capsule."""

import ctypes
import mmap
import re

import pytest

from dlpack import asdlpack

from ._copy_helpers import ODD, LegacyConsumer, _odd, capsule_values
from ._helpers import (
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    CapsuleInfo,
    capsule_name,
    need,
    np_data_ptr,
    torch_cuda_available,
)

np = need("numpy")


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
                with pytest.raises(BufferError, match="CUDA driver"):
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
        # the copy belongs to the consumer: writing it leaves the source's own memory alone
        before = np.asarray(obj).tobytes()
        assert before == np.ascontiguousarray(ref).tobytes()
        ctypes.memset(info.first_element, 0x5A, ref.size * ref.dtype.itemsize)
        assert np.asarray(obj).tobytes() == before
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


# ref: numpy's own writable array of the same values and layout
@pytest.mark.parametrize(
    "src, ref",
    [
        (b"\x01\x02\x03\x04", np.array([1, 2, 3, 4], np.uint8)),
        (
            np.frombuffer(np.arange(5, dtype=np.float32).tobytes(), np.float32),
            np.arange(5, dtype=np.float32),
        ),
        (
            np.frombuffer(np.arange(12, dtype=np.int32).tobytes(), np.int32)[::-2],
            np.arange(12, dtype=np.int32)[::-2],
        ),
    ],
    ids=["bytes", "readonly-numpy", "readonly-reversed"],
)
def test_jax_from_readonly_source(src, ref):
    jnp = need("jax.numpy", "jax")

    obj = asdlpack(src)
    assert obj.readonly
    try:
        out = jnp.from_dlpack(obj)
    except Exception as refusal:
        # only what JAX refuses of numpy's array of this layout: from 0.12 it refuses negative
        # strides (and 0.10 gets a copy of read-only memory, its legacy capsule can't say so)
        with pytest.raises(type(refusal), match=re.escape(str(refusal))):
            jnp.from_dlpack(ref)
        return
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
    assert src == bytes([1, 2, 3])  # made apart from src's constant
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    t = tvm_ffi.from_dlpack(asdlpack(ro))
    np.testing.assert_array_equal(np.from_dlpack(t), ro)
