"""``dlpack.copyto`` at the edges: broadcasting, dtypes, read-only and immutable destinations,
edge shapes, large copies, the stream argument, and a property test of random layouts, dtypes
and byte orders against ``numpy.copyto``."""

import array
import mmap
import sys
import threading
import time

import pytest

from dlpack import asdlpack, copyto

from ._copy_helpers import _values, odd_view
from ._helpers import (
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    array_interface_of,
    need,
    torch_cuda_available,
)

np = need("numpy")


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
        with pytest.raises(BufferError, match="CUDA driver"):
            copyto(dst, src, stream=stream)
    np.testing.assert_array_equal(host, before)


def test_copyto_refuses_destinations_it_can_only_read_as_copies():
    """Joined chunks, widened bits, a table, a numpy scalar's temporary: values written there
    would never reach the destination, so each is a ValueError saying why, and nothing of the
    destination changes."""
    pa = need("pyarrow")
    pd = need("pandas")
    cases = {
        "chunks": (pa.chunked_array([[0.0], [0.0]]), np.ones(2), "2 chunks"),
        "bits": (pa.array([False, False]), np.ones(2, bool), "booleans are bits"),
        "table": (pd.DataFrame({"a": [0.0, 0.0]}), np.ones((2, 1)), "table of 1 columns"),
        "its DLPackObject": (asdlpack(pa.chunked_array([[0.0], [0.0]])), np.ones(2), "chunks"),
    }
    for name, (dst, src, why) in cases.items():
        before = np.from_dlpack(asdlpack(dst)).copy()
        with pytest.raises(ValueError, match=f"only be read as a copy.*{why}"):
            copyto(dst, src)
        assert (np.from_dlpack(asdlpack(dst)) == before).all(), name
    scalar = np.float64(0)
    with pytest.raises(ValueError, match="float64 objects are immutable"):
        copyto(scalar, np.float64(1))
    assert scalar == 0
    assert asdlpack(np.float64(1)).readonly and asdlpack(np.int8(1)).readonly
    assert not asdlpack(np.zeros(1)).readonly
