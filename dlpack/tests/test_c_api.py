"""The C API capsule ``dlpack._dlpack._C_API``, called through ctypes as a C extension calls it:
views of any array through the runtime's importers, one registry of borrowed memory, copies, and
``DLPackObject``s over a caller's memory released exactly once."""

import ctypes
import gc
import re
import sys
import threading

import pytest

from dlpack import _dlpack, asdlpack, copyto

from ._helpers import NUMPY_NATIVE_DTYPES, DLDataType, DLDevice, need, run_python

np = need("numpy")

VIEW_MUTABLE, VIEW_SWAPPED, VIEW_INDIRECT, VIEW_C_CONTIGUOUS = 1, 2, 4, 8


class View(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("dtype", DLDataType),
        ("ndim", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("readonly", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("byte_strides", ctypes.POINTER(ctypes.c_int64)),
        ("held", ctypes.c_void_p),
    ]


RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Memory(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", DLDataType),
        ("ndim", ctypes.c_int32),
        ("readonly", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("byte_strides", ctypes.POINTER(ctypes.c_int64)),
        ("release", RELEASE),
        ("context", ctypes.c_void_p),
    ]


# PYFUNCTYPE: called holding the GIL, and a raised exception comes back as one (as in C, where
# -1 or NULL says one is set).
_VIEW = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_uint32, ctypes.POINTER(View))
_RELEASE_VIEW = ctypes.PYFUNCTYPE(None, ctypes.POINTER(View))
_COPY_TO = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(View), ctypes.c_void_p, ctypes.c_size_t)
_COPY_FROM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(View), ctypes.c_void_p, ctypes.c_size_t)
_FROM_MEMORY = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.POINTER(Memory))
_CHECK_MEMORY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_uint64)


class CApi(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("view", _VIEW),
        ("release_view", _RELEASE_VIEW),
        ("copy_to", _COPY_TO),
        ("copy_from", _COPY_FROM),
        ("from_memory", _FROM_MEMORY),
        ("check_memory", _CHECK_MEMORY),
    ]


def _table() -> CApi:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    get.restype = ctypes.c_void_p
    return CApi.from_address(get(_dlpack._C_API, b"dlpack._dlpack._C_API"))


API = _table()


class Viewed:
    """A filled view, given back on exit."""

    def __init__(self, obj, flags=0):
        self.view = View()
        API.view(obj, flags, ctypes.byref(self.view))

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        API.release_view(ctypes.byref(self.view))


def _dims(pointer, ndim):
    return tuple(pointer[i] for i in range(ndim))


def test_the_table_says_its_version_and_size():
    assert API.version == 1
    assert API.size == ctypes.sizeof(CApi)
    # The capsule is the module's one table: asking again gives the same.
    assert ctypes.addressof(_table()) == ctypes.addressof(API)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(12.0).reshape(3, 4),
        lambda: np.arange(24, dtype=np.int32).reshape(4, 6)[::-2, 1::2],
        lambda: np.arange(5, dtype=">i2"),
        lambda: bytearray(b"abc"),
    ],
    ids=["c-order", "strided", "swapped", "bytearray"],
)
def test_a_view_describes_the_memory_as_numpy_does(make):
    src = make()
    ref = np.asarray(src) if not isinstance(src, bytearray) else np.frombuffer(src, np.uint8)
    with Viewed(src) as view:
        assert view.data == ref.ctypes.data
        assert (view.device.device_type, view.device.device_id) == (1, 0)
        assert _dims(view.shape, view.ndim) == ref.shape
        assert _dims(view.byte_strides, view.ndim) == ref.strides
        assert view.dtype.bits == ref.dtype.itemsize * 8
        assert bool(view.flags & VIEW_SWAPPED) is (not ref.dtype.isnative)
        assert view.flags & VIEW_MUTABLE == 0 and view.readonly == 0
        out = (ctypes.c_char * ref.nbytes)()
        API.copy_to(ctypes.byref(view), out, ref.nbytes)
        native = ref.astype(ref.dtype.newbyteorder("="))
        assert bytes(out) == np.ascontiguousarray(native).tobytes()


def _check_view_of(src, mutable):
    """View ``src`` (a numpy array) and a ``DLPackObject`` of it: each view says what numpy
    says of the array, and giving it back leaves the array's references as they were."""
    refs = sys.getrefcount(src)
    for obj in (src, asdlpack(src)):
        with Viewed(obj, VIEW_MUTABLE if mutable else 0) as view:
            assert view.data == src.ctypes.data
            assert _dims(view.shape, view.ndim) == src.shape
            strides = _dims(view.byte_strides, view.ndim)
            if src.size:
                for n, mine, numpys in zip(src.shape, strides, src.strides, strict=True):
                    assert n == 1 or mine == numpys
            assert bool(view.flags & VIEW_C_CONTIGUOUS) is src.flags.c_contiguous
            assert bool(view.flags & VIEW_SWAPPED) is (not src.dtype.isnative)
            assert view.readonly == (not src.flags.writeable)
            assert view.dtype.bits == src.dtype.itemsize * 8
            out = (ctypes.c_char * src.nbytes)()
            API.copy_to(ctypes.byref(view), out, src.nbytes)
            native = src.astype(src.dtype.newbyteorder("="))
            assert bytes(out) == np.ascontiguousarray(native).tobytes()
        del obj
    assert sys.getrefcount(src) == refs


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:

    def test_views_of_any_numpy_layout_say_what_numpy_says():
        need("hypothesis")  # a skip with the reason, or a failure where it is required

else:

    @st.composite
    def _numpy_arrays(draw):
        dtype = np.dtype(draw(st.sampled_from(NUMPY_NATIVE_DTYPES)))
        dtype = dtype.newbyteorder(draw(st.sampled_from("<>")))
        ndim = draw(st.integers(0, 4))
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
        raw = np.arange(int(np.prod(shape)) * dtype.itemsize) % 251
        array = raw.astype(np.uint8).view(dtype).reshape(shape)
        # Any order, gaps and reversals, as numpy's slicing and transposes make them.
        for axis in range(ndim):
            step = draw(st.sampled_from([1, 1, 2, -1]))
            index = [slice(None)] * ndim
            index[axis] = slice(None, None, step)
            array = array[tuple(index)]
        array = array.transpose(draw(st.permutations(range(ndim))))
        if draw(st.booleans()):
            array.flags.writeable = False
        return array

    @settings(max_examples=150, deadline=None)
    @given(_numpy_arrays(), st.booleans())
    def test_views_of_any_numpy_layout_say_what_numpy_says(src, mutable):
        """Exact numpy arrays take the runtime's in-place path, ``DLPackObject``s their own
        tensor: both describe the memory as numpy does, a mutable view only of writable
        memory, and views made one after another (reusing what the last one held) agree."""
        if mutable and not src.flags.writeable:
            with pytest.raises(BufferError, match="read-only"):
                Viewed(src, VIEW_MUTABLE)
            mutable = False
        _check_view_of(src, mutable)


def test_read_only_memory_is_said_and_never_viewed_mutably():
    src = bytes(range(8))
    with Viewed(src) as view:
        assert view.readonly == 1
    with pytest.raises(BufferError, match="read-only"):
        Viewed(src, VIEW_MUTABLE)
    assert src == bytes(range(8))


def test_one_registry_a_mutable_view_excludes_every_other():
    """The runtime's registry holds every view made through it: a mutable view of memory
    another view holds is refused, whoever produced either (numpy here, torch over the same
    memory there), and the memory is free again once the views are given back."""
    a = np.zeros(16)
    with Viewed(a[:8]):
        with pytest.raises(BufferError, match="borrowed"):
            Viewed(a[4:], VIEW_MUTABLE)
        torch = need("torch")
        with pytest.raises(BufferError, match="borrowed"):
            Viewed(torch.from_numpy(a), VIEW_MUTABLE)
        with Viewed(a[8:], VIEW_MUTABLE) as disjoint:  # other memory: allowed
            assert disjoint.flags & VIEW_MUTABLE
    with Viewed(a, VIEW_MUTABLE) as alone:
        with pytest.raises(BufferError, match="already borrowed mutably"):
            Viewed(a[3:5])
        assert alone.flags & VIEW_MUTABLE


def test_copy_from_writes_any_layout_through_a_mutable_view():
    dst = np.zeros((4, 6))
    target = dst[::2, ::-3]
    values = np.arange(target.size, dtype=np.float64)
    with Viewed(target, VIEW_MUTABLE) as view:
        API.copy_from(ctypes.byref(view), values.ctypes.data, values.nbytes)
    np.testing.assert_array_equal(target, values.reshape(target.shape))
    assert dst.sum() == values.sum()  # nothing outside the view was written


def test_copy_from_refuses_elements_that_share_bytes():
    cell = np.zeros(1)
    shared = np.lib.stride_tricks.as_strided(cell, (4,), (0,))
    values = np.arange(4.0)
    with Viewed(shared, VIEW_MUTABLE) as view:
        with pytest.raises(BufferError, match="share memory"):
            API.copy_from(ctypes.byref(view), values.ctypes.data, values.nbytes)
    assert cell[0] == 0


def test_copy_from_needs_a_mutable_view_and_copies_need_the_exact_size():
    dst = np.zeros(3)
    values = np.ones(3)
    with Viewed(dst) as view:
        with pytest.raises(BufferError, match="must be mutable"):
            API.copy_from(ctypes.byref(view), values.ctypes.data, values.nbytes)
        out = (ctypes.c_char * 23)()
        with pytest.raises(ValueError, match="take 24 bytes, the buffer given 23"):
            API.copy_to(ctypes.byref(view), out, 23)
    assert not dst.any()


def _chunked():
    chunked = need("pyarrow").chunked_array([[1.0, 2.0], [3.0]])
    return chunked, chunked.to_numpy()


def _arrow_table():
    table = need("pyarrow").table({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    return table, np.column_stack([column.to_numpy() for column in table.columns])


def _arrow_booleans():
    booleans = need("pyarrow").array([True, False, True])
    return booleans, booleans.to_numpy(zero_copy_only=False)


def _data_frame():
    frame = need("pandas").DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    return frame, frame.to_numpy()


@pytest.mark.parametrize(
    "make", [_chunked, _arrow_table, _arrow_booleans, _data_frame], ids=lambda f: f.__name__[1:]
)
def test_a_mutable_view_of_a_copy_is_refused_naming_why(make):
    """Memory an import had to copy (chunks joined, columns gathered, bits made bytes) is not
    the object's: a write through a mutable view would never reach it, so the view is refused
    with the object's ``copy_reason``, as ``copyto`` refuses it; a shared view reads it."""
    src, expected = make()
    reason = asdlpack(src).copy_reason
    assert reason
    for obj in (src, asdlpack(src)):
        with pytest.raises(BufferError, match=re.escape(reason)):
            Viewed(obj, VIEW_MUTABLE)
    with Viewed(src) as view:
        out = np.empty(expected.shape, expected.dtype)  # C order, as copy_to writes
        API.copy_to(ctypes.byref(view), out.ctypes.data, out.nbytes)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("n", [8, 2 << 20], ids=["64 B", "16 MiB"])
def test_copies_between_a_view_and_its_own_memory_read_all_then_write(n):
    """A buffer overlapping the view's own memory gets what a copy made first would give
    (numpy's copy of the source, then the write), in both directions."""
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[::-1]) as view:
        API.copy_to(ctypes.byref(view), a.ctypes.data, a.nbytes)
    np.testing.assert_array_equal(a, np.arange(n)[::-1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[1:]) as view:  # one element further on: a memmove backwards
        API.copy_to(ctypes.byref(view), a.ctypes.data, a.nbytes - 8)
    np.testing.assert_array_equal(a, np.r_[np.arange(1, n), n - 1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[::-1], VIEW_MUTABLE) as view:
        API.copy_from(ctypes.byref(view), a.ctypes.data, a.nbytes)
    np.testing.assert_array_equal(a, np.arange(n)[::-1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[1:], VIEW_MUTABLE) as view:  # a memmove forwards
        API.copy_from(ctypes.byref(view), a.ctypes.data, a.nbytes - 8)
    np.testing.assert_array_equal(a, np.r_[0, np.arange(n - 1)])
    # Swapped elements written over their own bytes: the values, now in native order.
    a = np.arange(n, dtype=">i8")
    with Viewed(a[::-1]) as view:
        API.copy_to(ctypes.byref(view), a.ctypes.data, a.nbytes)
    np.testing.assert_array_equal(a.view(np.int64), np.arange(n)[::-1])


def test_copyto_refuses_memory_a_view_holds():
    """``copyto`` writes only memory no view holds: a shared view reads memory that must not
    change under it, a mutable one holds it alone; whoever hands the memory over (numpy, torch
    over the same memory), and disjoint memory is written."""
    a = np.zeros(8)
    with Viewed(a[2:5]):
        for dst in (a, a[4:], a[::-1]):
            with pytest.raises(BufferError, match="borrowed by a view"):
                copyto(dst, np.ones(dst.shape))
        torch = need("torch")
        with pytest.raises(BufferError, match="borrowed by a view"):
            copyto(torch.from_numpy(a), torch.ones(8, dtype=torch.float64))
        copyto(a[5:], np.ones(3))
    np.testing.assert_array_equal(a, [0, 0, 0, 0, 0, 1, 1, 1])
    with Viewed(a, VIEW_MUTABLE):
        with pytest.raises(BufferError, match="borrowed mutably by a view"):
            copyto(a[:1], np.full(1, 2.0))
    copyto(a, np.full(8, 2.0))  # given back: free again
    np.testing.assert_array_equal(a, np.full(8, 2.0))


def test_sizes_past_the_address_space_are_refused_not_wrapped():
    """A broadcast view may describe more bytes than a size_t counts (2**62 complex128: 2**66
    bytes): its copies are refused by size, never a wrapped count that a buffer could match."""
    torch = need("torch")
    huge = torch.zeros(1, dtype=torch.complex128).expand(2**62)
    out = np.zeros(2)
    with Viewed(huge) as view:
        assert _dims(view.shape, 1) == (2**62,)
        for claimed in (2**63 - 1, 2**64 - 1, 0, 16):
            with pytest.raises(ValueError, match=f"take {2**66} bytes"):
                API.copy_to(ctypes.byref(view), out.ctypes.data, claimed)


def test_layouts_outside_the_address_space_are_refused():
    """Memory whose elements would lie outside the address space (a foreign pointer and layout)
    is refused where it comes in, and by a view, whose registry compares address ranges that
    must not wrap (a wrapped one looked empty, and two mutable views of it were granted)."""
    owned = Owned([0.0] * 4, (4,))
    owned.memory.data = 2**64 - 16
    with pytest.raises(ValueError, match="outside the address space"):
        API.from_memory(ctypes.byref(owned.memory))
    gc.collect()
    assert owned.released == []

    class BelowZero:  # the last element 3 * 2**61 bytes before the first, at 4096
        __array_interface__ = {
            "shape": (4,),
            "typestr": "<f8",
            "strides": (-(2**61),),
            "data": (4096, False),
            "version": 3,
        }

    for flags in (0, VIEW_MUTABLE):
        with pytest.raises(ValueError, match="outside the address space"):
            Viewed(BelowZero(), flags)


_FAILING_CALLS = """
import ctypes
import os
from dlpack.tests.test_c_api import API, View

view = View()
target = object()


def fail():
    try:
        API.view(target, 0, ctypes.byref(view))
    except TypeError:
        pass
    try:
        API.check_memory(1 << 62)
    except MemoryError:
        pass




def rss_kib():
    # The resident size now: a child's peak (ru_maxrss) starts at its parent's.
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


for _ in range(5_000):
    fail()
before = rss_kib()
for _ in range(100_000):
    fail()
print(rss_kib() - before)
"""


def test_failing_calls_leave_nothing_behind():
    """A failing call's exception is released when the caller is done with it: 10**5 failing
    views and memory checks (in a child, whose resident size says what stayed) grow it by less than
    a tenth of the 110-440 bytes a call that left its exception's references queued kept."""
    out = run_python("-c", _FAILING_CALLS, timeout=600)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 4 << 10, f"RSS grew by {grown_kib} KiB over 2 x 10**5 failing calls"


def test_objects_the_runtime_cannot_read_raise_what_asdlpack_raises():
    with pytest.raises(TypeError, match="__dlpack__"):
        Viewed(object())
    with pytest.raises(TypeError, match="NULL view"):
        API.copy_to(None, None, 0)


def test_a_released_view_is_refused_and_releasing_twice_is_harmless():
    src = np.arange(3.0)
    viewed = Viewed(src)
    API.release_view(ctypes.byref(viewed.view))
    assert viewed.view.held is None
    API.release_view(ctypes.byref(viewed.view))
    with pytest.raises(ValueError, match="released"):
        API.copy_to(ctypes.byref(viewed.view), None, 0)
    with Viewed(src, VIEW_MUTABLE):  # the released view holds nothing
        pass


class Owned:
    """Memory a C extension owns, with a release callback that counts its calls."""

    def __init__(self, values, shape, strides=None, readonly=False):
        self.buffer = (ctypes.c_double * len(values))(*values)
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.released = []
        self.callback = RELEASE(lambda context: self.released.append(threading.get_ident()))
        self.memory = Memory(
            data=ctypes.addressof(self.buffer),
            ndim=len(shape),
            readonly=int(readonly),
            shape=self.shape,
            byte_strides=self.strides,
            release=self.callback,
            context=None,
        )
        self.memory.dtype.code, self.memory.dtype.bits, self.memory.dtype.lanes = 2, 64, 1


def test_from_memory_is_a_dlpack_object_over_the_callers_memory():
    owned = Owned([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], (2, 3))
    obj = API.from_memory(ctypes.byref(owned.memory))
    assert type(obj) is _dlpack.DLPackObject
    assert obj.data_ptr == ctypes.addressof(owned.buffer)
    out = np.from_dlpack(obj)
    assert out.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    out[1, 2] = 50.0
    assert owned.buffer[5] == 50.0
    del obj
    gc.collect()
    assert owned.released == []  # numpy's array still reaches the memory
    del out
    gc.collect()
    assert len(owned.released) == 1


def test_from_memory_strided_and_read_only():
    owned = Owned([float(i) for i in range(6)], (3,), strides=(16,), readonly=True)
    obj = API.from_memory(ctypes.byref(owned.memory))
    assert obj.readonly
    assert np.asarray(obj).tolist() == [0.0, 2.0, 4.0]
    assert asdlpack(obj) is obj
    del obj
    gc.collect()
    assert len(owned.released) == 1


def test_from_memory_refused_keeps_the_memory_the_callers():
    owned = Owned([1.0, 2.0], (2,))
    owned.memory.dtype.code = 99  # no such element type
    with pytest.raises(BufferError, match="unsupported DLPack data type"):
        API.from_memory(ctypes.byref(owned.memory))
    owned.memory.dtype.code = 2
    owned.memory.ndim = -1
    with pytest.raises(ValueError, match="ndim -1 is negative"):
        API.from_memory(ctypes.byref(owned.memory))
    # Refused once the release callback is already held by the object being made.
    owned.memory.ndim = 1
    owned.memory.data = None
    with pytest.raises(ValueError, match="null data pointer"):
        API.from_memory(ctypes.byref(owned.memory))
    gc.collect()
    assert owned.released == []


def test_check_memory_refuses_what_this_process_cannot_have():
    assert API.check_memory(1 << 20) == 0
    with pytest.raises(MemoryError, match="can't allocate"):
        API.check_memory(1 << 62)


def test_from_memory_released_on_the_thread_that_lets_go():
    owned = Owned([1.0], (1,))
    obj = API.from_memory(ctypes.byref(owned.memory))
    box = [obj]
    del obj
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    gc.collect()
    assert owned.released == [worker.ident]
