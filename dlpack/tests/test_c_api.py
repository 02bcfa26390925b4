"""The C API capsule ``dlpack._dlpack._C_API``, called through ctypes as a C extension calls it:
views of any array through the runtime's importers, one registry of borrowed memory, copies, and
``DLPackObject``s over a caller's memory released exactly once."""

import ctypes
import gc
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading

import pytest

import dlpack
from dlpack import _dlpack, asdlpack, copyto

from . import _c_api
from ._c_api import (
    DLPACK_ADAPTER_ABI_VERSION,
    DLPACK_ADAPTER_FEATURE_VERSION,
    DLPACK_ADAPTER_MEMORY_READONLY,
    DLPACK_ADAPTER_VIEW_C_CONTIGUOUS,
    DLPACK_ADAPTER_VIEW_MUTABLE,
    DLPACK_ADAPTER_VIEW_READONLY,
    DLPACK_ADAPTER_VIEW_SWAPPED,
    RELEASE,
    DLPackAdapterAPI,
    DLPackAdapterMemory,
    DLPackAdapterView,
    address,
    table,
)
from ._helpers import NUMPY_NATIVE_DTYPES, REQUIRABLE_SKIPS, REQUIRE_ENV, need, required, run_python

np = need("numpy")

API = table()


class Viewed:
    """A filled view, given back on exit."""

    def __init__(self, obj, flags=0):
        self.view = DLPackAdapterView()
        API.view(obj, flags, address(self.view))

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        API.release_view(address(self.view))


def _dims(pointer, ndim):
    return tuple(pointer[i] for i in range(ndim))


def test_the_table_says_its_versions_and_size():
    assert (API.abi_version, API.feature_version) == (
        DLPACK_ADAPTER_ABI_VERSION,
        DLPACK_ADAPTER_FEATURE_VERSION,
    )
    assert API.size == ctypes.sizeof(DLPackAdapterAPI)
    assert API.reserved == 0
    # The capsule is the module's one table: asking again gives the same.
    assert ctypes.addressof(table()) == ctypes.addressof(API)


HEADER = os.path.join(dlpack.get_include(), "dlpack_adapter.h")


def _header() -> str:
    with open(HEADER) as f:
        return f.read()


def test_the_header_ships_with_the_package_and_says_what_the_runtime_has():
    """``dlpack.get_include()`` holds the C header, whose versions and capsule name are the
    runtime's, and whose flags are the tests' (and so the runtime's, which the tests check)."""
    text = _header()
    defines = dict(re.findall(r"^#define (DLPACK_ADAPTER_\w+) (\S.*)$", text, re.M))
    assert int(defines["DLPACK_ADAPTER_ABI_VERSION"]) == API.abi_version
    assert int(defines["DLPACK_ADAPTER_FEATURE_VERSION"]) == API.feature_version
    name = ctypes.pythonapi.PyCapsule_GetName
    name.argtypes, name.restype = [ctypes.py_object], ctypes.c_char_p
    assert defines["DLPACK_ADAPTER_CAPSULE_NAME"] == f'"{name(_dlpack._C_API).decode()}"'
    for constant, value in vars(_c_api).items():
        if constant.startswith(("DLPACK_ADAPTER_VIEW_", "DLPACK_ADAPTER_MEMORY_")):
            assert int(defines[constant]) == value, constant
    assert defines["DLPACK_ADAPTER_VIEW_REQUESTS"] == "DLPACK_ADAPTER_VIEW_MUTABLE"


def _declared_fields(text: str, struct: str) -> list[str]:
    """The field names of ``struct``'s typedef in the header, in order."""
    body = re.search(r"typedef struct (?:\w+ )?\{([^{}]*)\} " + struct + ";", text)
    assert body, f"{struct} is not declared in {HEADER}"
    code = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    return [m.group(1) or m.group(2) for m in re.finditer(r"\(\*(\w+)\)\([^;]*\);|(\w+);", code)]


def test_the_ctypes_declaration_names_the_headers_fields_in_order():
    """The tests' ctypes structs (dlpack/tests/_c_api.py) have the header's fields, in the
    header's order (read from its text: no compiler needed)."""
    text = _header()
    for struct in _c_api.STRUCTS:
        declared = [name for name, *_ in struct._fields_]
        assert _declared_fields(text, struct.__name__) == declared, struct.__name__


def _c_compiler() -> list[str]:
    """The C compiler this Python was built with, or ``cc``; a skip where there is none or no
    Python.h (a failure where DLPACK_TESTS_REQUIRE names ``cc``)."""
    __tracebackhide__ = True
    command = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    if shutil.which(command[0]) is None:
        command = ["cc"]
    if shutil.which(command[0]) is None:
        reason = "no C compiler (cc) to compile the C header with"
    elif not os.path.exists(os.path.join(include, "Python.h")):
        reason = f"no Python.h in {include} to compile the C header with"
    else:
        return [*command, f"-I{include}", f"-I{dlpack.get_include()}"]
    if required("cc"):
        pytest.fail(f"{reason}, and {REQUIRE_ENV} requires cc", pytrace=False)
    REQUIRABLE_SKIPS.add(reason)
    pytest.skip(reason)


def test_the_ctypes_declaration_has_the_headers_offsets_and_sizes(tmp_path):
    """Every field's offset and every struct's size, as ctypes computes them, asserted of the
    header by a C compiler (a C11 program of static assertions, checked and not built); the
    header itself compiles without a warning."""
    compiler = _c_compiler()
    checks = []
    for struct in _c_api.STRUCTS:
        name = struct.__name__
        checks.append(f'_Static_assert(sizeof({name}) == {ctypes.sizeof(struct)}, "{name}");')
        for field, *_ in struct._fields_:
            offset = getattr(struct, field).offset
            checks.append(
                f"_Static_assert(offsetof({name}, {field}) == {offset}, "
                f'"{name}.{field} at {offset}");'
            )
    probe = tmp_path / "probe.c"
    probe.write_text('#include "dlpack_adapter.h"\n' + "\n".join(checks) + "\n")
    out = subprocess.run(
        [*compiler, "-std=gnu11", "-Wall", "-Wextra", "-fsyntax-only", str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "dlpack_adapter.h" not in out.stderr, out.stderr


@pytest.mark.parametrize("bit", [1 << i for i in range(1, 32)], ids=lambda bit: f"{bit:#x}")
def test_flag_bits_view_does_not_take_are_refused(bit):
    """``view`` takes DLPACK_ADAPTER_VIEW_MUTABLE alone: any other bit (the view's own output
    bits among them) is a ValueError naming it, never ignored, and nothing stays held."""
    a = np.zeros(4)
    for flags in (bit, bit | DLPACK_ADAPTER_VIEW_MUTABLE):
        with pytest.raises(ValueError, match=f"bits {bit:#x} are none it takes"):
            Viewed(a, flags)
    with Viewed(a, DLPACK_ADAPTER_VIEW_MUTABLE):  # nothing was borrowed
        pass


class _Padded(ctypes.Structure):
    """A view as a client built against a later header declares it: 16 bytes more."""

    _fields_ = [("view", DLPackAdapterView), ("later", ctypes.c_uint8 * 16)]


def test_a_view_is_written_no_further_than_the_runtime_knows_or_the_caller_declared():
    """The caller's ``size`` says how much it declared: a longer view keeps what the runtime
    doesn't know as the caller left it, and a size short of the fields is a ValueError before
    anything is written or borrowed."""
    a = np.arange(3.0)
    padded = _Padded()
    padded.view.size = ctypes.sizeof(_Padded)
    ctypes.memset(padded.later, 0xAB, 16)
    API.view(a, 0, address(padded))
    try:
        assert padded.view.size == ctypes.sizeof(_Padded)
        assert padded.view.data == a.ctypes.data and padded.view.ndim == 1
        assert bytes(padded.later) == b"\xab" * 16
    finally:
        API.release_view(address(padded))
    assert padded.view.held is None
    view = DLPackAdapterView()
    for size in (0, ctypes.sizeof(DLPackAdapterView) - 1):
        view.size = size
        with pytest.raises(ValueError, match=f"size says {size} bytes, short of the "):
            API.view(a, DLPACK_ADAPTER_VIEW_MUTABLE, address(view))
        assert view.held is None and view.data is None
    with Viewed(a, DLPACK_ADAPTER_VIEW_MUTABLE):  # nothing was borrowed
        pass


def test_functions_taking_a_view_refuse_one_of_a_short_size():
    a = np.arange(3.0)
    viewed = Viewed(a)
    viewed.view.size = 8
    out = np.empty(3)
    with pytest.raises(ValueError, match="size says 8 bytes"):
        API.copy_to(address(viewed.view), out.ctypes.data, out.nbytes)
    with pytest.raises(ValueError, match="size says 8 bytes"):
        API.release_view(address(viewed.view))
    viewed.view.size = ctypes.sizeof(DLPackAdapterView)
    API.release_view(address(viewed.view))


_AT_A_PAGES_END = """
import ctypes, mmap, sys
import numpy as np
from dlpack.tests._c_api import DLPackAdapterMemory, DLPackAdapterView, RELEASE, table

API = table()
page = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(area))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE: a touch past the first page faults

view = DLPackAdapterView.from_address(base + page - ctypes.sizeof(DLPackAdapterView))
prepared = DLPackAdapterView()
ctypes.memmove(ctypes.addressof(view), ctypes.addressof(prepared), ctypes.sizeof(view))
a = np.arange(5.0)
API.view(a, 1, ctypes.addressof(view))
out = np.empty(5)
API.copy_to(ctypes.addressof(view), out.ctypes.data, out.nbytes)
API.copy_from(ctypes.addressof(view), out.ctypes.data, out.nbytes)
API.release_view(ctypes.addressof(view))

values = (ctypes.c_double * 2)(1.0, 2.0)
shape = (ctypes.c_int64 * 1)(2)
released = []
callback = RELEASE(lambda context: released.append(context))
memory = DLPackAdapterMemory.from_address(base + page - ctypes.sizeof(DLPackAdapterMemory))
fields = DLPackAdapterMemory(data=ctypes.addressof(values), ndim=1, shape=shape, release=callback)
fields.dtype.code, fields.dtype.bits, fields.dtype.lanes = 2, 64, 1
ctypes.memmove(ctypes.addressof(memory), ctypes.addressof(fields), ctypes.sizeof(memory))
obj = API.from_memory(ctypes.addressof(memory))
print(np.from_dlpack(obj).tolist(), out.tolist())
del obj
print(len(released))
"""


def test_views_and_memory_are_read_and_written_within_their_declared_size():
    """A view and a memory description at the very end of a page followed by one no access
    reaches (in a child, which a touch past them would kill): every call reads and writes within
    the size the caller declared."""
    out = run_python("-c", _AT_A_PAGES_END, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1.0, 2.0] [0.0, 1.0, 2.0, 3.0, 4.0]", "1"]


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
        assert bool(view.flags & DLPACK_ADAPTER_VIEW_SWAPPED) is (not ref.dtype.isnative)
        assert view.flags & (DLPACK_ADAPTER_VIEW_MUTABLE | DLPACK_ADAPTER_VIEW_READONLY) == 0
        out = (ctypes.c_char * ref.nbytes)()
        API.copy_to(address(view), out, ref.nbytes)
        native = ref.astype(ref.dtype.newbyteorder("="))
        assert bytes(out) == np.ascontiguousarray(native).tobytes()


def _check_view_of(src, mutable):
    """View ``src`` (a numpy array) and a ``DLPackObject`` of it: each view says what numpy
    says of the array, and giving it back leaves the array's references as they were."""
    refs = sys.getrefcount(src)
    for obj in (src, asdlpack(src)):
        with Viewed(obj, DLPACK_ADAPTER_VIEW_MUTABLE if mutable else 0) as view:
            assert view.data == src.ctypes.data
            assert _dims(view.shape, view.ndim) == src.shape
            strides = _dims(view.byte_strides, view.ndim)
            if src.size:
                for n, mine, numpys in zip(src.shape, strides, src.strides, strict=True):
                    assert n == 1 or mine == numpys
            assert bool(view.flags & DLPACK_ADAPTER_VIEW_C_CONTIGUOUS) is src.flags.c_contiguous
            assert bool(view.flags & DLPACK_ADAPTER_VIEW_SWAPPED) is (not src.dtype.isnative)
            assert bool(view.flags & DLPACK_ADAPTER_VIEW_READONLY) is (not src.flags.writeable)
            assert view.dtype.bits == src.dtype.itemsize * 8
            out = (ctypes.c_char * src.nbytes)()
            API.copy_to(address(view), out, src.nbytes)
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
                Viewed(src, DLPACK_ADAPTER_VIEW_MUTABLE)
            mutable = False
        _check_view_of(src, mutable)


def test_read_only_memory_is_said_and_never_viewed_mutably():
    src = bytes(range(8))
    with Viewed(src) as view:
        assert view.flags & DLPACK_ADAPTER_VIEW_READONLY
    with pytest.raises(BufferError, match="read-only"):
        Viewed(src, DLPACK_ADAPTER_VIEW_MUTABLE)
    assert src == bytes(range(8))


def test_one_registry_a_mutable_view_excludes_every_other():
    """The runtime's registry holds every view made through it: a mutable view of memory
    another view holds is refused, whoever produced either (numpy here, torch over the same
    memory there), and the memory is free again once the views are given back."""
    a = np.zeros(16)
    with Viewed(a[:8]):
        with pytest.raises(BufferError, match="borrowed"):
            Viewed(a[4:], DLPACK_ADAPTER_VIEW_MUTABLE)
        torch = need("torch")
        with pytest.raises(BufferError, match="borrowed"):
            Viewed(torch.from_numpy(a), DLPACK_ADAPTER_VIEW_MUTABLE)
        with Viewed(a[8:], DLPACK_ADAPTER_VIEW_MUTABLE) as disjoint:  # other memory: allowed
            assert disjoint.flags & DLPACK_ADAPTER_VIEW_MUTABLE
    with Viewed(a, DLPACK_ADAPTER_VIEW_MUTABLE) as alone:
        with pytest.raises(BufferError, match="already borrowed mutably"):
            Viewed(a[3:5])
        assert alone.flags & DLPACK_ADAPTER_VIEW_MUTABLE


def test_copy_from_writes_any_layout_through_a_mutable_view():
    dst = np.zeros((4, 6))
    target = dst[::2, ::-3]
    values = np.arange(target.size, dtype=np.float64)
    with Viewed(target, DLPACK_ADAPTER_VIEW_MUTABLE) as view:
        API.copy_from(address(view), values.ctypes.data, values.nbytes)
    np.testing.assert_array_equal(target, values.reshape(target.shape))
    assert dst.sum() == values.sum()  # nothing outside the view was written


def test_copy_from_refuses_elements_that_share_bytes():
    cell = np.zeros(1)
    shared = np.lib.stride_tricks.as_strided(cell, (4,), (0,))
    values = np.arange(4.0)
    with Viewed(shared, DLPACK_ADAPTER_VIEW_MUTABLE) as view:
        with pytest.raises(BufferError, match="share memory"):
            API.copy_from(address(view), values.ctypes.data, values.nbytes)
    assert cell[0] == 0


def test_copy_from_needs_a_mutable_view_and_copies_need_the_exact_size():
    dst = np.zeros(3)
    values = np.ones(3)
    with Viewed(dst) as view:
        with pytest.raises(BufferError, match="must be mutable"):
            API.copy_from(address(view), values.ctypes.data, values.nbytes)
        out = (ctypes.c_char * 23)()
        with pytest.raises(ValueError, match="take 24 bytes, the buffer given 23"):
            API.copy_to(address(view), out, 23)
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
            Viewed(obj, DLPACK_ADAPTER_VIEW_MUTABLE)
    with Viewed(src) as view:
        out = np.empty(expected.shape, expected.dtype)  # C order, as copy_to writes
        API.copy_to(address(view), out.ctypes.data, out.nbytes)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("n", [8, 2 << 20], ids=["64 B", "16 MiB"])
def test_copies_between_a_view_and_its_own_memory_read_all_then_write(n):
    """A buffer overlapping the view's own memory gets what a copy made first would give
    (numpy's copy of the source, then the write), in both directions."""
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[::-1]) as view:
        API.copy_to(address(view), a.ctypes.data, a.nbytes)
    np.testing.assert_array_equal(a, np.arange(n)[::-1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[1:]) as view:  # one element further on: a memmove backwards
        API.copy_to(address(view), a.ctypes.data, a.nbytes - 8)
    np.testing.assert_array_equal(a, np.r_[np.arange(1, n), n - 1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[::-1], DLPACK_ADAPTER_VIEW_MUTABLE) as view:
        API.copy_from(address(view), a.ctypes.data, a.nbytes)
    np.testing.assert_array_equal(a, np.arange(n)[::-1])
    a = np.arange(n, dtype=np.int64)
    with Viewed(a[1:], DLPACK_ADAPTER_VIEW_MUTABLE) as view:  # a memmove forwards
        API.copy_from(address(view), a.ctypes.data, a.nbytes - 8)
    np.testing.assert_array_equal(a, np.r_[0, np.arange(n - 1)])
    # Swapped elements written over their own bytes: the values, now in native order.
    a = np.arange(n, dtype=">i8")
    with Viewed(a[::-1]) as view:
        API.copy_to(address(view), a.ctypes.data, a.nbytes)
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
    with Viewed(a, DLPACK_ADAPTER_VIEW_MUTABLE):
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
                API.copy_to(address(view), out.ctypes.data, claimed)


def test_layouts_outside_the_address_space_are_refused():
    """Memory whose elements would lie outside the address space (a foreign pointer and layout)
    is refused where it comes in, and by a view, whose registry compares address ranges that
    must not wrap (a wrapped one looked empty, and two mutable views of it were granted)."""
    owned = Owned([0.0] * 4, (4,))
    owned.memory.data = 2**64 - 16
    with pytest.raises(ValueError, match="outside the address space"):
        API.from_memory(address(owned.memory))
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

    for flags in (0, DLPACK_ADAPTER_VIEW_MUTABLE):
        with pytest.raises(ValueError, match="outside the address space"):
            Viewed(BelowZero(), flags)


_FAILING_CALLS = """
import ctypes
import os
from dlpack.tests._c_api import DLPackAdapterView, address, table

API = table()
view = DLPackAdapterView()
target = object()


def fail():
    try:
        API.view(target, 0, address(view))
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
for _ in range(25_000):
    fail()
print(rss_kib() - before)
"""


def test_failing_calls_leave_nothing_behind():
    """A failing call's exception is released when the caller is done with it: 25,000 failing
    views and memory checks (in a child, whose resident size says what stayed) grow it by less
    than 21 bytes a call, a tenth of the 110-440 bytes a call that left its exception's
    references queued kept (5-21 MiB here)."""
    out = run_python("-c", _FAILING_CALLS, timeout=600)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 1 << 10, f"RSS grew by {grown_kib} KiB over 2 x 25,000 failing calls"


def test_objects_the_runtime_cannot_read_raise_what_asdlpack_raises():
    with pytest.raises(TypeError, match="__dlpack__"):
        Viewed(object())
    with pytest.raises(TypeError, match="NULL view"):
        API.copy_to(None, None, 0)


def test_a_released_view_is_refused_and_releasing_twice_is_harmless():
    src = np.arange(3.0)
    viewed = Viewed(src)
    API.release_view(address(viewed.view))
    assert viewed.view.held is None
    API.release_view(address(viewed.view))
    with pytest.raises(ValueError, match="released"):
        API.copy_to(address(viewed.view), None, 0)
    with Viewed(src, DLPACK_ADAPTER_VIEW_MUTABLE):  # the released view holds nothing
        pass


class Owned:
    """Memory a C extension owns, with a release callback that counts its calls."""

    def __init__(self, values, shape, strides=None, readonly=False):
        self.buffer = (ctypes.c_double * len(values))(*values)
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.released = []
        self.callback = RELEASE(lambda context: self.released.append(threading.get_ident()))
        self.memory = DLPackAdapterMemory(
            data=ctypes.addressof(self.buffer),
            ndim=len(shape),
            flags=DLPACK_ADAPTER_MEMORY_READONLY if readonly else 0,
            shape=self.shape,
            byte_strides=self.strides,
            release=self.callback,
            context=None,
        )
        self.memory.dtype.code, self.memory.dtype.bits, self.memory.dtype.lanes = 2, 64, 1


def test_from_memory_is_a_dlpack_object_over_the_callers_memory():
    owned = Owned([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], (2, 3))
    obj = API.from_memory(address(owned.memory))
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
    obj = API.from_memory(address(owned.memory))
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
        API.from_memory(address(owned.memory))
    owned.memory.dtype.code = 2
    owned.memory.ndim = -1
    with pytest.raises(ValueError, match="ndim -1 is negative"):
        API.from_memory(address(owned.memory))
    # Refused once the release callback is already held by the object being made.
    owned.memory.ndim = 1
    owned.memory.data = None
    with pytest.raises(ValueError, match="null data pointer"):
        API.from_memory(address(owned.memory))
    gc.collect()
    assert owned.released == []


def test_from_memory_refuses_a_short_size_or_unknown_flags_and_keeps_the_memory_the_callers():
    """A description short of the fields (not prepared with DLPACK_ADAPTER_MEMORY_INIT) or with
    a flag bit from_memory doesn't take is a ValueError naming it; release is never called."""
    owned = Owned([1.0, 2.0], (2,))
    for size in (0, ctypes.sizeof(DLPackAdapterMemory) - 8):
        owned.memory.size = size
        with pytest.raises(ValueError, match=f"size says {size} bytes, short of the "):
            API.from_memory(address(owned.memory))
    owned.memory.size = ctypes.sizeof(DLPackAdapterMemory)
    for bit in (1 << i for i in range(1, 32)):
        owned.memory.flags = bit | DLPACK_ADAPTER_MEMORY_READONLY
        with pytest.raises(ValueError, match=f"bits {bit:#x} are none it takes"):
            API.from_memory(address(owned.memory))
    gc.collect()
    assert owned.released == []


def test_from_memory_reads_no_further_than_it_knows():
    """A description longer than the runtime's (a client built against a later header): the
    runtime reads its own fields and leaves the rest."""

    class Longer(ctypes.Structure):
        _fields_ = [("memory", DLPackAdapterMemory), ("later", ctypes.c_uint64 * 2)]

    owned = Owned([1.0, 2.0, 3.0], (3,))
    longer = Longer(memory=owned.memory)
    longer.memory.size = ctypes.sizeof(Longer)
    longer.later[:] = [2**64 - 1, 2**64 - 1]
    obj = API.from_memory(address(longer))
    assert np.from_dlpack(obj).tolist() == [1.0, 2.0, 3.0]
    del obj
    gc.collect()
    assert len(owned.released) == 1


def test_check_memory_refuses_what_this_process_cannot_have():
    assert API.check_memory(1 << 20) == 0
    with pytest.raises(MemoryError, match="can't allocate"):
        API.check_memory(1 << 62)


def test_from_memory_released_on_the_thread_that_lets_go():
    owned = Owned([1.0], (1,))
    obj = API.from_memory(address(owned.memory))
    box = [obj]
    del obj
    worker = threading.Thread(target=box.clear)
    worker.start()
    worker.join()
    gc.collect()
    assert owned.released == [worker.ident]
