"""The example extension, fed every kind of array Python holds, and its arrays fed to every
library: what an extension built on dlpack-adapter's Rust API sees."""

import array
import gc
import re
import threading

import dlpack_bench_rust_api as other
import dlpack_example as ex
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

import dlpack


def test_total_accepts_every_kind_of_float64_array():
    values = [1.5, 2.5, 3.0, 4.0]
    sources = [
        np.array(values),
        np.array(values + values)[::2],  # strided
        np.asfortranarray(np.array([values, values])),  # Fortran order
        torch.tensor(values, dtype=torch.float64),
        torch.tensor([values, values], dtype=torch.float64).T,
        jnp.array(values, dtype=jnp.float32).astype(np.float64)
        if jax.config.jax_enable_x64
        else np.array(values),
        array.array("d", values),
        memoryview(array.array("d", values)),
        dlpack.asdlpack(np.array(values)),
    ]
    for source in sources:
        expected = float(np.sum(np.asarray(source)))
        assert ex.total(source) == pytest.approx(expected), type(source)
        assert ex.copy_out(source) == list(np.asarray(source).ravel(order="C"))


def test_jax_arrays_are_read_in_place_and_stay_read_only():
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    assert ex.first(x) == 0.0
    shape, strides, dtype, device, readonly = ex.describe(x)
    assert (shape, strides, dtype, device) == ([2, 3], [12, 4], "float32", (1, 0))
    assert readonly
    with pytest.raises(BufferError, match="read-only"):
        ex.scale(x, 2.0)
    np.testing.assert_array_equal(np.asarray(x), np.arange(6).reshape(2, 3))


def test_describe_reports_what_numpy_says():
    a = np.zeros((4, 6), dtype=np.float32)[::2, ::-3]
    shape, strides, dtype, device, readonly = ex.describe(a)
    assert shape == list(a.shape) and strides == list(a.strides)
    assert (dtype, device, readonly) == ("float32", (1, 0), False)
    ro = np.ones(3)
    ro.flags.writeable = False
    assert ex.describe(ro)[4] is True


def test_in_place_reads_need_contiguous_memory_of_the_type():
    assert ex.total_in_place(np.arange(5.0)) == 10.0
    assert ex.total_in_place(np.arange(5.0).reshape(1, 5)) == 10.0
    with pytest.raises(BufferError, match="not C-contiguous"):
        ex.total_in_place(np.arange(10.0)[::2])
    with pytest.raises(TypeError, match="holds float32, not float64"):
        ex.total_in_place(np.arange(3, dtype=np.float32))
    with pytest.raises(TypeError, match="holds int64, not float32"):
        ex.first(torch.arange(3))
    # Non-native byte order is no slice, but copies in native order.
    swapped = np.arange(4.0).astype(">f8")
    with pytest.raises(BufferError, match="byte order"):
        ex.total_in_place(swapped)
    assert ex.total(swapped) == 6.0
    # Unaligned memory is no slice either.
    raw = np.zeros(8 * 4 + 1, dtype=np.uint8)[1:].view(np.float64)
    raw[:] = [1, 2, 3, 4]
    with pytest.raises(BufferError, match="aligned"):
        ex.total_in_place(raw)
    assert ex.total(raw) == 10.0


def test_bytes_and_buffers():
    # PyO3 returns a Vec<u8> as bytes.
    assert ex.byte_values(b"abc") == b"abc"
    assert ex.byte_values(bytearray(b"\x00\xff")) == b"\x00\xff"
    assert ex.byte_values(array.array("B", [7, 8])) == b"\x07\x08"
    with pytest.raises(TypeError, match="needs an object that supports DLPack"):
        ex.total(object())
    with pytest.raises(TypeError, match="needs an object that supports DLPack"):
        ex.total([1.0, 2.0])


def test_writes_land_in_the_callers_memory():
    a = np.ones(4, dtype=np.float32)
    ex.scale(a, 3.0)
    np.testing.assert_array_equal(a, [3, 3, 3, 3])
    t = torch.ones(2, 2)
    ex.scale(t, 0.5)
    assert torch.equal(t, torch.full((2, 2), 0.5))
    m = np.zeros((3, 4))[:, ::-2]  # strided and reversed
    ex.fill_counting(m)
    np.testing.assert_array_equal(m, np.arange(6.0).reshape(3, 2))
    ba = bytearray(8)
    with pytest.raises(TypeError, match="holds uint8, not float32"):
        ex.scale(ba, 2.0)


def test_read_only_memory_is_never_written():
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    for source in (ro, b"\x00" * 8, dlpack.asdlpack(ro)):
        with pytest.raises(BufferError, match="read-only"):
            ex.scale(source, 2.0)
    np.testing.assert_array_equal(ro, [1, 1, 1])
    broadcast = np.broadcast_to(np.zeros(1), (4,))
    with pytest.raises(BufferError):
        ex.fill_counting(broadcast)
    # A writable view whose elements share bytes: no element-by-element write is faithful.
    cell = np.zeros(1)
    shared = np.lib.stride_tricks.as_strided(cell, (4,), (0,))
    assert shared.flags.writeable
    with pytest.raises(BufferError, match="share memory"):
        ex.fill_counting(shared)
    assert cell[0] == 0


def test_writes_into_a_copy_are_refused_naming_why():
    """An object whose memory can only be read as a copy (chunks joined, columns gathered) is
    never written through a copy that would be thrown away: the mutable view is refused with the
    object's copy_reason, typed argument or not, and the object keeps its values."""
    chunked = pa.chunked_array([[1.0, 2.0], [3.0]])
    reason = dlpack.asdlpack(chunked).copy_reason
    with pytest.raises(TypeError, match="expected a writable array of float64") as info:
        ex.add_in_place(chunked, 5.0)
    assert isinstance(info.value.__cause__, BufferError)
    assert reason in str(info.value.__cause__)
    assert chunked.to_pylist() == [1.0, 2.0, 3.0]
    frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]}, dtype=np.float32)
    table = pa.table({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    for obj, write in ((frame, lambda x: ex.scale(x, 2.0)), (table, ex.fill_counting)):
        with pytest.raises(BufferError, match=re.escape(dlpack.asdlpack(obj).copy_reason)):
            write(obj)
    assert frame.to_numpy().tolist() == [[1, 3], [2, 4]]
    assert table.to_pydict() == {"a": [1.0, 2.0], "b": [3.0, 4.0]}


def test_copyto_into_memory_a_rust_view_holds_is_refused():
    """A Rust function holding a view calls back into Python, which writes the same memory with
    dlpack.copyto: refused as a second mutable view is, so the values the function reads never
    change under it."""
    a = np.zeros(4)
    for dst in (a, a[2:], torch.from_numpy(a)):
        with pytest.raises(BufferError, match="borrowed by a view"):
            ex.while_held(a, lambda d=dst: dlpack.copyto(d, np.ones(d.shape)))
        with pytest.raises(BufferError, match="borrowed mutably by a view"):
            ex.while_held_mutably(a, lambda d=dst: dlpack.copyto(d, np.ones(d.shape)))
    assert not a.any()
    # Other memory, and the same once the view is given back, are written.
    ex.while_held(a[:2], lambda: dlpack.copyto(a[2:], np.ones(2)))
    dlpack.copyto(a[:2], np.full(2, 2.0))
    np.testing.assert_array_equal(a, [2, 2, 1, 1])


def test_sizes_past_the_address_space_are_a_memory_error():
    """A broadcast view of 2**62 float64 describes 2**65 bytes, more than a usize counts: a copy
    of it is a MemoryError naming the size, never a wrapped size or a Rust panic."""
    huge = torch.zeros(1, dtype=torch.float64).expand(2**62)
    assert ex.describe(huge)[:2] == ([2**62], [0])
    with pytest.raises(MemoryError, match=f"{2**65} bytes"):
        ex.total(huge)
    with pytest.raises(MemoryError, match=f"{2**65} bytes"):
        ex.copy_out(huge)


def test_copy_to_slice_fills_a_slice_of_the_arrays_length():
    a = np.arange(6.0).reshape(2, 3).T  # any layout: C order out
    assert ex.copy_into_prefix(a, 8) == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="6 elements don't fit a buffer of 4"):
        ex.copy_into_prefix(a, 4)


def test_device_memory_is_refused_naming_the_device():
    # A DLPack producer of CUDA memory (never read: the view only describes it).
    class OnCuda:
        def __init__(self):
            self.base = np.zeros(4)
            self.__cuda_array_interface__ = {
                "shape": (4,),
                "typestr": "<f8",
                "data": (self.base.ctypes.data, False),
                "version": 3,
            }

    with pytest.raises(BufferError, match="CUDA"):
        ex.copy_out(OnCuda())
    with pytest.raises(TypeError, match="CUDA") as info:  # a typed argument names itself
        ex.total(OnCuda())
    assert isinstance(info.value.__cause__, BufferError)


def test_row_sums_through_ndarray_any_strides():
    a = np.arange(12.0).reshape(3, 4)
    for source in (a, a[:, ::-1], a.T, a[::2, 1::2], torch.from_numpy(a).T):
        expected = np.asarray(source).sum(axis=-1)
        np.testing.assert_array_equal(ex.row_sums(source), expected)
    with pytest.raises(ValueError, match="at least one dimension"):
        ex.row_sums(np.float64(1.0))


def test_arrays_made_in_rust_reach_every_library():
    obj = ex.arange(5)
    # The runtime's one type, made through its C API: the package's own objects.
    assert type(obj) is dlpack.DLPackObject and obj.shape == (5,)
    assert dlpack.asdlpack(obj) is obj
    assert dlpack.asdlpack(obj).dtype == "float32"
    np.testing.assert_array_equal(np.from_dlpack(obj), np.arange(5, dtype=np.float32))
    t = torch.from_dlpack(ex.arange(5))
    assert t.dtype == torch.float32 and t.tolist() == [0, 1, 2, 3, 4]
    j = jnp.from_dlpack(ex.arange(5))
    assert j.dtype == jnp.float32 and j.tolist() == [0, 1, 2, 3, 4]
    m = np.asarray(ex.matrix(2, 3))
    np.testing.assert_array_equal(m, np.arange(6).reshape(2, 3))
    assert m.dtype == np.int64 and m.flags.c_contiguous and m.flags.writeable
    # Zero-copy: numpy writes the Vec's memory, which the next consumer sees.
    obj = ex.arange(3)
    np.from_dlpack(obj)[0] = 42
    assert torch.from_dlpack(obj)[0] == 42
    with pytest.raises(ValueError, match=r"shape \[2, 2\] holds 4 elements, the data 3"):
        ex.mismatched()


def test_arrays_made_in_rust_pickle_as_the_packages_own():
    import pickle

    back = pickle.loads(pickle.dumps(ex.arange(4), protocol=5))
    assert isinstance(back, dlpack.DLPackObject)
    np.testing.assert_array_equal(np.asarray(back), np.arange(4, dtype=np.float32))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_the_vec_is_freed_when_the_last_consumer_lets_go():
    n = 8 << 20  # 32 MiB of float32 each
    gc.collect()
    before = _rss_bytes()
    for _ in range(40):  # 1.25 GiB in all if nothing were freed
        t = torch.from_dlpack(ex.arange(n))
        assert t[-1] == n - 1
        del t
    # Freed on another thread too (a consumer letting go where Python isn't attached).
    holders = [np.from_dlpack(ex.arange(n)) for _ in range(4)]
    thread = threading.Thread(target=holders.clear)
    thread.start()
    thread.join()
    gc.collect()
    assert _rss_bytes() - before < 200 << 20


def test_a_mutable_view_needs_its_memory_alone():
    a = np.arange(4.0)
    ex.axpy(a[:2], 10.0, a[2:])  # disjoint halves of one array
    np.testing.assert_array_equal(a, [20, 31, 2, 3])
    for x in (a, a[1:], a[::-1], torch.from_numpy(a), dlpack.asdlpack(a)):
        with pytest.raises(BufferError, match="borrowed"):
            ex.axpy(a, 1.0, x)
    np.testing.assert_array_equal(a, [20, 31, 2, 3])
    # The views are given back: the same call works again.
    ex.axpy(a[:2], 1.0, a[2:])
    np.testing.assert_array_equal(a, [22, 34, 2, 3])


def test_views_in_two_extensions_share_one_registry():
    """A mutable view held in this extension excludes every view of overlapping memory in
    another (the benchmark extension, built on the same crate), whichever producer hands the
    memory over there: one registry, the runtime's, for the whole process."""
    a = np.arange(8.0)
    for same_memory in (a, a[2:5], torch.from_numpy(a), dlpack.asdlpack(a[::-1])):
        with pytest.raises(BufferError, match="borrowed mutably"):
            ex.while_held_mutably(a, lambda x=same_memory: other.total_view(x))
    # Disjoint memory, and the same memory once the mutable view is given back, are fine.
    assert ex.while_held_mutably(a[:4], lambda: other.total_view(a[4:])) == 4 + 5 + 6 + 7
    assert other.total_view(a) == a.sum()
    # And the other way round: a shared view there (a typed argument) excludes writing here.
    b = np.zeros(3)
    with pytest.raises(BufferError, match="borrowed"):
        ex.while_held_mutably(b, lambda: ex.while_held_mutably(b, lambda: None))


def test_typed_arguments_name_the_argument():
    # PyO3 names the argument of a TypeError ("while processing 'x'").
    assert ex.total(np.arange(4.0)) == 6.0
    with pytest.raises(
        TypeError, match="(?s)expected an array of float64, got an array of float32.*'x'"
    ):
        ex.total(np.arange(4, dtype=np.float32))
    with pytest.raises(TypeError, match="(?s)expected an array of float64: .*__dlpack__.*'x'"):
        ex.total(object())
    y = np.zeros(3)
    ex.add_in_place(y, 2.0)
    np.testing.assert_array_equal(y, [2.0, 2.0, 2.0])
    read_only = np.zeros(3)
    read_only.flags.writeable = False
    with pytest.raises(
        TypeError, match="(?s)expected a writable array of float64: .*read-only.*'y'"
    ) as info:
        ex.add_in_place(read_only, 1.0)
    assert isinstance(info.value.__cause__, BufferError)
    assert not read_only.any()


def _run_child(code, tmp_path):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


# A runtime whose table is only its header, given as u32s: versions, size, reserved.
_HEADER_ONLY = """
import ctypes

__version__ = "0.0.2"
_NAME = b"dlpack._dlpack._C_API"
_table = (ctypes.c_uint32 * 4)({})
_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_C_API = _new(ctypes.addressof(_table), _NAME, None)
"""


@pytest.mark.parametrize(
    "fake, message",
    [
        ("", "needs the dlpack Python package .* ABI version 2 at feature level 1 or later: "),
        (
            "__version__ = '0.0.1'\n",
            "ABI version 2 at feature level 1 or later; the installed dlpack 0.0.1 has no C API",
        ),
        (
            # the head of ABI version 1's table: a version (1) and a size
            _HEADER_ONLY.format("1, 56, 0, 0"),
            "at feature level 1 or later; the installed dlpack 0.0.2 has C API ABI version 1 "
            "at feature level 56$",
        ),
        (
            _HEADER_ONLY.format("2, 0, 64, 0"),
            "the installed dlpack 0.0.2 has C API ABI version 2 at feature level 0$",
        ),
        (
            _HEADER_ONLY.format("2, 1, 16, 0"),
            "the installed dlpack 0.0.2 has a C API table of 16 bytes at feature level 1 "
            r"\(this crate reads \d+\)",
        ),
    ],
    ids=["missing", "no-c-api", "another-abi", "older-level", "smaller-table"],
)
def test_a_missing_or_too_old_dlpack_is_an_import_error(tmp_path, fake, message):
    """The crate finds the runtime on first use: without one (an empty dlpack package first on
    sys.path), with one that has no C API, or with a table of another ABI version, an older
    feature level or fewer functions than the crate reads, the call is an ImportError naming
    both sides."""
    package = tmp_path / "shadow" / "dlpack"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if fake:
        (package / "_dlpack.py").write_text(fake)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'shadow')!r})\n"
        "import array, dlpack_example as ex\n"
        "try:\n"
        "    ex.total_in_place(array.array('d', [1.0]))\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    out = _run_child(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(message, out.stdout), out.stdout


_FAILING_CALLS = """
import os
import dlpack_example as ex

target = object()


def fail():
    try:
        ex.total_in_place(target)
    except TypeError:
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


def test_failing_calls_leave_nothing_behind(tmp_path):
    """Each failing view's exception is released once handled: 10**5 failing calls (in a child,
    whose resident size says what stayed) grow it by less than a tenth of what calls leaving their
    exception's references queued in the runtime kept (about 440 bytes each)."""
    out = _run_child(_FAILING_CALLS, tmp_path)
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 4 << 10, f"RSS grew by {grown_kib} KiB over 10**5 failing calls"
