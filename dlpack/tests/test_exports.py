"""Every protocol out: a DLPackObject lends its memory through the buffer protocol, describes it
with ``__array_interface__`` / ``__array_struct__`` (host memory) and ``__cuda_array_interface__``
(CUDA memory), so every provider reaches every consumer of those protocols."""

import array
import ctypes
import gc
import hashlib
import io
import os
import struct
import sys
import weakref

import pytest

from dlpack import asdlpack
from dlpack._report import PyBufferView

from ._helpers import (
    ArrayInterface,
    CudaArrayInterface,
    cuda_iface,
    need,
    need_cuda,
    np_data_ptr,
    refcount,
    torch_cuda_available,
)

np = need("numpy")


PyBUF_WRITABLE = 0x1
PyBUF_FORMAT = 0x4
PyBUF_STRIDES = 0x18
PyBUF_C_CONTIGUOUS = 0x38
PyBUF_F_CONTIGUOUS = 0x58


def _get_buffer(obj, flags):
    """What a C consumer asking `flags` gets: (buf, len, readonly, ndim, shape, strides), or the
    exporter's exception."""
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(PyBufferView), ctypes.c_int]
    get.restype = ctypes.c_int
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(PyBufferView)]
    view = PyBufferView()
    get(obj, ctypes.byref(view), flags)  # ctypes raises the exporter's exception
    try:
        ssize = ctypes.POINTER(ctypes.c_ssize_t)
        shape = ctypes.cast(view.shape, ssize) if view.shape else None
        strides = ctypes.cast(view.strides, ssize) if view.strides else None
        shape = [shape[k] for k in range(view.ndim)] if shape else None
        strides = [strides[k] for k in range(view.ndim)] if strides else None
        return view.buf, view.len, bool(view.readonly), view.ndim, shape, strides
    finally:
        release(ctypes.byref(view))


def _view_address(view: memoryview) -> int:
    """Address of a memoryview's first element (any layout, read-only too)."""
    if view.nbytes == 0:
        return 0
    return np.asarray(view).__array_interface__["data"][0]


# ---------------------------------------------------------------------------
# providers: (name, make) -> (source, numpy array with its values and memory)
# ---------------------------------------------------------------------------


def _stdlib_providers():
    def from_bytes():
        src = bytes(range(6))
        return src, np.frombuffer(src, np.uint8)

    def from_bytearray():
        src = bytearray(range(6))
        return src, np.frombuffer(src, np.uint8)

    def from_array():
        src = array.array("d", [0.5, 1.5, 2.5])
        return src, np.frombuffer(src, np.float64)

    def from_memoryview():
        raw = bytearray(struct.pack("6i", *range(6)))
        src = memoryview(raw).cast("i", [2, 3])
        return src, np.frombuffer(raw, np.int32).reshape(2, 3)

    def from_ctypes():
        src = (ctypes.c_float * 4)(1, 2, 3, 4)
        return src, np.ctypeslib.as_array(src)

    return {
        "bytes": from_bytes,
        "bytearray": from_bytearray,
        "array.array": from_array,
        "memoryview": from_memoryview,
        "ctypes": from_ctypes,
    }


def _library_providers():
    def numpy_strided():
        a = np.arange(24, dtype=np.float32).reshape(4, 6)[::2, 1::2]
        return a, a

    def numpy_readonly():
        a = np.arange(6, dtype=np.int16)
        a.flags.writeable = False
        return a, a

    def torch_tensor():
        torch = need("torch")
        t = torch.arange(12, dtype=torch.float64).reshape(3, 4).T
        return t, t.numpy()

    def jax_array():
        need("jax")
        import jax.numpy as jnp

        x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
        return x, np.from_dlpack(x)

    def pyarrow_array():
        pa = need("pyarrow")
        x = pa.array([1.0, 2.0, 3.0], type=pa.float64())
        return x, np.from_dlpack(x)

    def array_api_strict_array():
        xp = need("array_api_strict")
        x = xp.reshape(xp.arange(6, dtype=xp.int64), (2, 3))
        return x, np.from_dlpack(x)

    return {
        "numpy-strided": numpy_strided,
        "numpy-readonly": numpy_readonly,
        "torch-transposed": torch_tensor,
        "jax": jax_array,
        "pyarrow": pyarrow_array,
        "array-api-strict": array_api_strict_array,
    }


PROVIDERS = {**_stdlib_providers(), **_library_providers()}


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_memoryview_of_every_provider(name):
    """memoryview(asdlpack(x)): the same memory, values, layout and read-only flag."""
    source, ref = PROVIDERS[name]()
    obj = asdlpack(source)
    view = memoryview(obj)
    assert view.shape == ref.shape
    assert view.strides == ref.strides
    assert view.itemsize == ref.itemsize
    assert view.nbytes == ref.nbytes
    assert view.readonly is obj.readonly
    assert np.dtype(view.format) == ref.dtype.newbyteorder("=")
    assert _view_address(view) == np_data_ptr(ref)
    np.testing.assert_array_equal(np.asarray(view), ref)
    if not ref.flags.writeable:
        assert view.readonly


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_numpy_asarray_of_every_provider(name):
    """np.asarray(asdlpack(x)) shares the memory (no copy) with the right values."""
    source, ref = PROVIDERS[name]()
    obj = asdlpack(source)
    out = np.asarray(obj)
    assert out.dtype == ref.dtype.newbyteorder("=")
    assert out.shape == ref.shape
    assert np_data_ptr(out) == np_data_ptr(ref)
    np.testing.assert_array_equal(out, ref)
    assert out.flags.writeable is (not obj.readonly)


@pytest.mark.parametrize("protocol", ["__array_interface__", "__array_struct__"])
@pytest.mark.parametrize("name", list(PROVIDERS))
def test_array_interfaces_of_every_provider(name, protocol):
    """Each array interface alone (the object exposes just that one) gives numpy the memory."""
    source, ref = PROVIDERS[name]()
    obj = asdlpack(source)

    class Only:
        pass

    only = Only()
    setattr(only, protocol, getattr(obj, protocol))
    only.keep = obj
    out = np.asarray(only)
    assert np_data_ptr(out) == np_data_ptr(ref)
    assert out.shape == ref.shape and out.strides == ref.strides
    np.testing.assert_array_equal(out, ref)
    assert out.flags.writeable is (not obj.readonly)


def test_array_interface_contents():
    a = np.arange(24, dtype=">i4").reshape(4, 6)[:, ::2]
    iface = asdlpack(a).__array_interface__
    assert iface == {
        "shape": (4, 3),
        "typestr": ">i4",
        "strides": (24, 8),
        "version": 3,
        "data": (np_data_ptr(a), False),
    }
    c = np.zeros((2, 3), np.complex64)
    c.flags.writeable = False
    iface = asdlpack(c).__array_interface__
    assert iface["strides"] is None  # C-contiguous, as the interface says
    assert iface["typestr"] == "<c8" and iface["data"] == (np_data_ptr(c), True)
    assert asdlpack(np.zeros((), np.bool_)).__array_interface__["typestr"] == "|b1"


def test_array_struct_flags():
    """numpy reads flags, byte order and alignment from the struct as from its own arrays."""
    for a in [
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.arange(12, dtype=np.float64).reshape(3, 4).T,
        np.arange(12, dtype=">f8")[::3],
        np.frombuffer(bytearray(13), np.uint8)[1:].view(np.int32),  # unaligned
    ]:

        class Only:
            __array_struct__ = asdlpack(a).__array_struct__

        out = np.asarray(Only())
        assert out.flags.c_contiguous == a.flags.c_contiguous
        assert out.flags.f_contiguous == a.flags.f_contiguous
        assert out.flags.aligned == a.flags.aligned
        assert out.dtype == a.dtype
        np.testing.assert_array_equal(out, a)


# ---------------------------------------------------------------------------
# the standard library's buffer consumers
# ---------------------------------------------------------------------------


def test_stdlib_consumers_read_the_bytes():
    torch = need("torch")
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    raw = t.numpy().tobytes()
    obj = asdlpack(t)
    out = io.BytesIO()
    assert out.write(obj) == 48
    assert out.getvalue() == raw
    assert hashlib.sha256(obj).digest() == hashlib.sha256(raw).digest()
    assert struct.unpack_from("3i", obj, 4) == (1, 2, 3)
    assert bytes(obj) == raw
    assert memoryview(obj).cast("B").cast("i").tolist() == list(range(12))
    # a transposed tensor: consumers asking for contiguous bytes get them in C order
    assert (
        hashlib.sha256(asdlpack(t.T)).digest() == hashlib.sha256(t.T.contiguous().numpy()).digest()
    )
    assert bytes(asdlpack(t.T)) == t.T.contiguous().numpy().tobytes()


def test_write_through_a_writable_view():
    a = np.zeros(4, np.int32)
    view = memoryview(asdlpack(a))
    view[2] = 7
    assert a.tolist() == [0, 0, 7, 0]
    ctypes.memset((ctypes.c_char * 16).from_buffer(asdlpack(a)), 1, 4)
    assert a[0] == 0x01010101


@pytest.mark.parametrize(
    "make",
    [
        lambda: bytes(8),
        lambda: np.frombuffer(bytes(8), np.uint8),
        lambda: np.broadcast_to(np.zeros(4), (3, 4)),
    ],
    ids=["bytes", "readonly-numpy", "broadcast"],
)
def test_read_only_memory_is_never_lent_writable(make):
    obj = asdlpack(make())
    assert obj.readonly
    view = memoryview(obj)
    assert view.readonly
    with pytest.raises(TypeError):
        view.cast("B")[0] = 1
    with pytest.raises(TypeError, match="not writable"):  # a writable buffer request
        (ctypes.c_char * 1).from_buffer(obj)
    assert np.asarray(obj).flags.writeable is False


def test_contiguous_request_of_strided_memory_is_a_read_only_copy():
    a = np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2]
    obj = asdlpack(a)
    assert bytes(obj) == a.tobytes()  # bytes() asks for C-contiguous memory: a copy
    assert hashlib.md5(obj).digest() == hashlib.md5(a.tobytes()).digest()
    # a writable contiguous request can't be a copy: refused
    with pytest.raises(BufferError, match="not C-contiguous"):
        _get_buffer(obj, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
    with pytest.raises(TypeError, match="not C contiguous"):
        (ctypes.c_char * a.nbytes).from_buffer(obj)
    # the strided view itself is lent as it is
    view = memoryview(obj)
    assert not view.readonly and view.strides == a.strides


def test_buffer_requests_are_answered_as_pep_3118_says():
    """Each request gets what it asks for: no shape without PyBUF_ND (one run of bytes), no
    strides without PyBUF_STRIDES, contiguity where asked; F order lent as it is when asked."""
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    obj = asdlpack(a)
    buf, length, readonly, ndim, shape, strides = _get_buffer(obj, 0)
    assert (buf, length, readonly, ndim, shape, strides) == (
        np_data_ptr(a),
        48,
        False,
        1,
        None,
        None,
    )
    assert _get_buffer(obj, PyBUF_STRIDES)[3:] == (2, [3, 4], [16, 4])
    f = np.asfortranarray(a)
    assert _get_buffer(asdlpack(f), PyBUF_F_CONTIGUOUS)[0] == np_data_ptr(f)
    # C order asked of Fortran memory: a read-only copy in C order
    buf, _, readonly, _, _, strides = _get_buffer(asdlpack(f), PyBUF_C_CONTIGUOUS)
    assert buf != np_data_ptr(f) and readonly and strides == [16, 4]


def test_formats_of_every_dtype():
    """Each dtype's PEP 3118 format names the same type (and byte order) numpy's does."""
    for name in ["?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8",
                 "c16"]:  # fmt: skip
        for order in "<>":
            dtype = np.dtype(order + name) if name not in "?i1u1" else np.dtype(name)
            a = np.zeros(3, dtype)
            view = memoryview(asdlpack(a))
            assert np.asarray(view).dtype == dtype, (dtype, view.format)
            assert (
                struct.calcsize(view.format.replace("Z", "")) * (2 if "Z" in view.format else 1)
                == dtype.itemsize
            )


def test_types_without_a_pep3118_code_have_no_format_but_their_bytes():
    """A consumer that reads the format is refused (no code is right: pad bytes would be read
    as nothing), one that takes plain bytes gets them, and numpy reads the array interface."""
    ml_dtypes = need("ml_dtypes")
    for dtype, size in [(ml_dtypes.bfloat16, 2), (ml_dtypes.float8_e4m3fn, 1)]:
        a = np.arange(1, 5).astype(dtype)
        obj = asdlpack(a)
        with pytest.raises(BufferError, match=f"{a.dtype.name} has no buffer protocol"):
            memoryview(obj)
        assert hashlib.sha256(obj).digest() == hashlib.sha256(a.tobytes()).digest()
        assert obj.__array_interface__["typestr"] == f"|V{size}"
        got = np.asarray(obj)
        assert got.tobytes() == a.tobytes()
        assert got.ctypes.data == a.ctypes.data


# ---------------------------------------------------------------------------
# lifetime
# ---------------------------------------------------------------------------


def test_source_outlives_its_deletion_while_a_view_lives():
    a = np.arange(1000, dtype=np.float64)
    gone = weakref.ref(a)
    view = memoryview(asdlpack(a))
    del a
    gc.collect()
    assert gone() is not None  # the view keeps the source alive
    assert view[999] == 999.0
    view.release()
    gc.collect()
    assert gone() is None


def test_view_release_and_refcounts():
    src = bytearray(64)
    before = refcount(src)
    obj = asdlpack(src)
    baseline = refcount(obj)
    views = [memoryview(obj) for _ in range(10)]
    assert refcount(obj) == baseline + 10
    for v in views:
        v.release()
    assert refcount(obj) == baseline
    del views, obj
    gc.collect()
    assert refcount(src) == before


def test_bytearray_resize_refused_while_exported():
    src = bytearray(b"abc")
    obj = asdlpack(src)
    view = memoryview(obj)
    with pytest.raises(BufferError):
        src.extend(b"d")
    del view, obj
    gc.collect()
    src.extend(b"d")  # free again once nothing holds it
    assert src == b"abcd"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
def test_no_growth_over_many_views():
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = a[:, ::2]

    def batch(n):
        for _ in range(n):
            obj = asdlpack(a)
            memoryview(obj).release()
            np.asarray(obj)
            iface = obj.__array_interface__
            capsule = obj.__array_struct__
            bytes(asdlpack(s))  # a copy each time
            del iface, capsule

    batch(10_000)
    gc.collect()
    before = rss()
    batch(100_000)
    gc.collect()
    grown = rss() - before
    # a leak of one view (>= 40 bytes) per iteration would be >= 4 MiB
    assert grown < 2 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_array_struct_capsule_keeps_the_memory():
    a = np.arange(6, dtype=np.int64)
    capsule = asdlpack(a).__array_struct__
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is not None

    class Only:
        __array_struct__ = capsule

    out = np.asarray(Only())
    del capsule, Only
    gc.collect()
    assert out.tolist() == list(range(6))


# ---------------------------------------------------------------------------
# memory no protocol here can describe in place, and device memory
# ---------------------------------------------------------------------------


def test_suboffsets_are_described_as_a_read_only_copy():
    tb = need("_testbuffer", "CPython's _testbuffer test module")
    src = tb.ndarray(list(range(12)), shape=[3, 4], format="i", flags=tb.ND_PIL)
    obj = asdlpack(src)
    iface = obj.__array_interface__
    assert not isinstance(iface["data"], tuple)  # the copy's buffer
    out = np.asarray(ArrayInterface(iface))
    assert out.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert not out.flags.writeable
    assert not hasattr(obj, "__array_struct__")
    assert memoryview(obj).tolist() == out.tolist()
    assert memoryview(obj).readonly


def test_cuda_memory_has_only_the_cuda_interface():
    """Without a GPU: the metadata of a CUDA array interface object comes back out as it went
    in, and host protocols say why they can't serve device memory."""
    if torch_cuda_available():
        pytest.skip("a CUDA device is here: see test_cuda_consumers")
    iface = cuda_iface(shape=(2, 3), typestr="<f4", ptr=0x7F0000001000, stream=5)
    obj = asdlpack(CudaArrayInterface(iface))
    cai = obj.__cuda_array_interface__
    assert cai == {
        "shape": (2, 3),
        "typestr": "<f4",
        "strides": None,
        "version": 3,
        "data": (0x7F0000001000, False),
        "stream": 5,
    }
    assert not hasattr(obj, "__array_interface__")
    assert not hasattr(obj, "__array_struct__")
    with pytest.raises(BufferError, match="(?i)cuda"):
        memoryview(obj)
    strided = cuda_iface(shape=(2, 3), typestr=">i2", ptr=0x7F0000001000, strides=(12, 4))
    strided.pop("stream", None)
    cai = asdlpack(CudaArrayInterface(strided)).__cuda_array_interface__
    assert cai["strides"] == (12, 4) and cai["typestr"] == ">i2" and cai["stream"] is None


def test_host_memory_has_no_cuda_interface():
    obj = asdlpack(np.zeros(3))
    assert not hasattr(obj, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="CUDA memory only"):
        obj.__cuda_array_interface__  # noqa: B018


# ---------------------------------------------------------------------------
# other consumers: PIL, numba (CUDA)
# ---------------------------------------------------------------------------


def test_pil_image_fromarray():
    image = need("PIL.Image", "pillow")
    torch = need("torch")
    t = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    img = image.fromarray(asdlpack(t))
    assert img.size == (4, 3)
    assert np.asarray(img).tolist() == t.tolist()


def test_cuda_consumers():
    torch = need("torch")
    need_cuda(torch_cuda_available(), "needs a CUDA device")
    t = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    obj = asdlpack(t)
    cai = obj.__cuda_array_interface__
    assert cai["data"][0] == t.data_ptr()
    assert cai["stream"] == 1  # asked with stream=None: ready on the legacy default stream
    back = torch.as_tensor(obj, device="cuda")
    assert back.data_ptr() == t.data_ptr()
    cupy = need("cupy")
    assert int(cupy.asarray(obj).data.ptr) == t.data_ptr()
    need("numba")
    from numba import cuda as numba_cuda

    assert numba_cuda.as_cuda_array(obj).__cuda_array_interface__["data"][0] == t.data_ptr()
    with pytest.raises(BufferError, match="cuda"):
        memoryview(obj)


def test_dlpack_object_still_reports_itself_to_asdlpack():
    obj = asdlpack(np.zeros(3))
    before = sys.getrefcount(obj)
    again = asdlpack(obj)
    assert again is obj and sys.getrefcount(obj) == before + 1  # one new reference, no copy
    del again
    assert sys.getrefcount(obj) == before


def test_empty_arrays_have_an_aligned_address_in_every_export(x64):
    # torch's empty tensors have no address (NULL): the buffer protocol lends one aligned for
    # every element type; DLPack and the array interface say NULL (0), as torch's own do, and
    # every consumer reads them.
    torch = need("torch")
    jnp = need("jax.numpy")
    for dtype in ("int8", "float32", "float64", "complex128", "bool"):
        for shape in ((0,), (3, 0), (0, 2)):
            for source in (
                torch.empty(shape, dtype=getattr(torch, dtype)),
                np.empty(shape, dtype),
                jnp.zeros(shape, dtype),
            ):
                obj = asdlpack(source)
                expected = np.dtype(dtype)
                view = memoryview(obj)
                lent = np.asarray(view)
                assert lent.ctypes.data != 0 and lent.ctypes.data % expected.itemsize == 0
                for read in (np.from_dlpack, np.asarray, lambda o: np.asarray(memoryview(o))):
                    out = read(obj)
                    assert (out.shape, out.dtype) == (shape, expected), (source, read)
                back = torch.from_dlpack(obj)
                assert tuple(back.shape) == shape and str(back.dtype) == f"torch.{expected}"
                assert jnp.asarray(obj).shape == shape
