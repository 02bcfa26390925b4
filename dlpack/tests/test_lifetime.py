"""Ownership: sources outlive their exports exactly as long as needed, from any thread."""

import ctypes
import gc
import sys
import textwrap
import threading
import weakref

import pytest

from dlpack import asdlpack

from ._helpers import (
    ArrayInterface,
    ArrayStruct,
    Buf,
    DLManagedTensor,
    DLManagedTensorVersioned,
    _GetPointer,
    array_interface_of,
    capsule_name,
    collect,
    need,
    optional,
    refcount,
    run_python,
)

# ---------------------------------------------------------------------------
# keep-alive
# ---------------------------------------------------------------------------


def test_source_kept_alive_by_object():
    src = Buf(b"\x01\x02\x03")
    ref = weakref.ref(src)
    obj = asdlpack(src)
    del src
    collect()
    assert ref() is not None
    del obj
    collect()
    assert ref() is None


def test_source_kept_alive_by_unconsumed_capsule():
    src = Buf(b"\x01\x02\x03")
    ref = weakref.ref(src)
    obj = asdlpack(src)
    caps = [obj.__dlpack__(), obj.__dlpack__(max_version=(1, 0))]
    del src, obj
    collect()
    assert ref() is not None
    caps.pop()
    collect()
    assert ref() is not None
    caps.pop()
    collect()
    assert ref() is None


def test_source_deleted_before_consumer_numpy():
    np = need("numpy")
    src = Buf(bytes(range(10)))
    ref = weakref.ref(src)
    obj = asdlpack(src)
    del src
    out = np.from_dlpack(obj)
    del obj
    collect()
    assert ref() is not None
    # churn the allocator a bit, then check the data
    junk = [bytearray(b"\xff" * 10) for _ in range(100)]
    del junk
    np.testing.assert_array_equal(out, np.arange(10))
    del out
    collect()
    assert ref() is None


def test_numpy_source_deleted_before_consumer():
    np = need("numpy")
    src = np.arange(1000, dtype=np.float64)
    out = np.from_dlpack(asdlpack(src[::3]))
    del src
    collect()
    np.testing.assert_array_equal(out, np.arange(0, 1000, 3, dtype=np.float64))


def test_torch_consumer_outlives_everything():
    torch = need("torch")
    src = Buf(b"\x05" * 16)
    ref = weakref.ref(src)
    t = torch.from_dlpack(asdlpack(memoryview(src).cast("i")))
    del src
    collect()
    assert ref() is not None
    assert t.tolist() == [0x05050505] * 4
    del t
    collect()
    assert ref() is None


def test_raw_capsule_producer_released():
    np = need("numpy")
    src = np.arange(5)
    base = refcount(src)
    cap = src.__dlpack__(max_version=(1, 0))
    obj = asdlpack(cap)
    del cap
    out = np.from_dlpack(obj)
    del obj
    collect()
    np.testing.assert_array_equal(out, np.arange(5))
    del out
    assert refcount(src) == base


# ---------------------------------------------------------------------------
# reference counts return to baseline
# ---------------------------------------------------------------------------


def _sources():
    def iface():
        a = need("numpy").arange(8, dtype="int32")
        return a, ArrayInterface(array_interface_of(a), owner=a)

    def struct():
        a = need("numpy").arange(8, dtype="int32")
        return a, ArrayStruct(a)

    return {
        "bytearray": lambda: (Buf(b"abcdefgh"), None),
        "numpy": lambda: (need("numpy").arange(8, dtype="int32"), None),
        "numpy-readonly": lambda: (need("numpy").frombuffer(b"abcdefgh", dtype="uint8"), None),
        "array_interface": iface,
        "array_struct": struct,
        "memoryview": lambda: (Buf(b"abcdefgh"), "mv"),
    }


def _make(kind):
    src, wrapper = _sources()[kind]()
    if wrapper == "mv":
        return src, memoryview(src)[::2]
    return src, (src if wrapper is None else wrapper)


@pytest.mark.parametrize("kind", list(_sources()))
def test_refcount_baseline(kind):
    src, producer = _make(kind)
    is_readonly = kind == "numpy-readonly"
    base_src = refcount(src)
    base_prod = refcount(producer)

    obj = asdlpack(producer)
    base_obj = refcount(obj)
    # unconsumed exports, legacy and versioned
    for _ in range(10):
        caps = [obj.__dlpack__(max_version=(1, 0)), obj.__dlpack__(max_version=(1, 3))]
        if not is_readonly:
            caps.append(obj.__dlpack__())
        caps.append(obj.__dlpack__(max_version=(1, 0), copy=True))
        del caps
    assert refcount(obj) == base_obj

    np = optional("numpy")
    if np is not None:  # numpy is the consumer where it is here
        outs = [np.from_dlpack(obj) for _ in range(5)]
        outs.append(np.from_dlpack(obj, copy=True))
        del outs
        assert refcount(obj) == base_obj

    del obj
    assert refcount(src) == base_src
    assert refcount(producer) == base_prod


def test_refcount_after_errors():
    src = Buf(b"abcd")
    base = refcount(src)
    obj = asdlpack(src)
    for kwargs, exc_class in [
        ({"stream": "x"}, TypeError),
        ({"stream": 5}, ValueError),
        ({"dl_device": (2, 0)}, BufferError),
        ({"max_version": (1,)}, TypeError),
    ]:
        with pytest.raises(exc_class):
            obj.__dlpack__(**kwargs)
    del obj
    assert refcount(src) == base


def test_refcount_after_failed_asdlpack():
    np = need("numpy")
    src = np.zeros(3, dtype=np.complex256) if hasattr(np, "complex256") else None
    if src is None:
        pytest.skip("no long double complex")
    base = refcount(src)
    for _ in range(20):
        with pytest.raises(BufferError):
            asdlpack(src)
    assert refcount(src) == base


def test_refcount_many_objects():
    src = Buf(b"abcdefgh")
    base = refcount(src)
    objs = [asdlpack(src) for _ in range(500)]
    caps = [o.__dlpack__(max_version=(1, 0)) for o in objs]
    del objs
    collect()
    assert sys.getrefcount(src) > base
    del caps
    assert refcount(src) == base


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------


def _drop_in_threads(items, nthreads=4):
    lock = threading.Lock()
    errors = []

    def worker():
        try:
            while True:
                with lock:
                    if not items:
                        return
                    item = items.pop()
                del item
                gc.collect(0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_capsules_dropped_in_threads():
    src = Buf(bytes(range(32)))
    base = refcount(src)
    objs = [asdlpack(src) for _ in range(10)]
    caps = []
    for i in range(2000):
        o = objs[i % 10]
        caps.append(o.__dlpack__(max_version=(1, 3)) if i % 2 else o.__dlpack__())
    del objs, o
    _drop_in_threads(caps)
    assert not caps
    assert refcount(src) == base


def test_objects_dropped_in_threads():
    src = Buf(bytes(range(32)))
    base = refcount(src)
    objs = [asdlpack(memoryview(src)[i % 7 :]) for i in range(2000)]
    _drop_in_threads(objs)
    assert refcount(src) == base


def test_consumer_arrays_dropped_in_threads():
    np = need("numpy")
    src = Buf(bytes(range(32)))
    base = refcount(src)
    obj = asdlpack(src)
    arrays = [np.from_dlpack(obj) for _ in range(1000)]
    arrays += [np.from_dlpack(asdlpack(src)) for _ in range(1000)]
    del obj
    _drop_in_threads(arrays)
    assert refcount(src) == base


def test_torch_tensors_dropped_in_threads():
    torch = need("torch")
    src = Buf(bytes(range(32)))
    base = refcount(src)
    tensors = [torch.from_dlpack(asdlpack(src)) for _ in range(500)]
    _drop_in_threads(tensors)
    assert refcount(src) == base


def test_concurrent_exports():
    np = need("numpy")
    src = np.arange(64, dtype=np.int64)
    base = refcount(src)
    obj = asdlpack(src)
    errors = []

    def worker(k, obj=obj):
        try:
            for i in range(500):
                out = np.from_dlpack(asdlpack(src[k::4]) if i % 2 else obj)
                assert out[-1] in (63, 60 + k)
                cap = obj.__dlpack__(max_version=(1, 3))
                del cap, out
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    del obj, worker, threads
    assert refcount(src) == base


# ---------------------------------------------------------------------------
# reference cycles and interpreter exit
# ---------------------------------------------------------------------------


def test_cycle_through_object_is_collected():
    src = Buf(b"abc")
    ref = weakref.ref(src)
    src.obj = asdlpack(src)  # src -> obj -> src
    del src
    collect()
    assert ref() is None, "DLPackObject in a reference cycle was never collected"


def test_a_memoryview_in_a_cycle_with_its_object_never_crashes():
    # Clearing a memoryview drops its memory even while exported: the collector must never
    # get to clear one under a DLPackObject that still reads it (Dask hands buffers over as
    # memoryviews). Run in a child, as a failure is a crash.
    script = textwrap.dedent(
        """
        import gc
        from dlpack import asdlpack
        m = memoryview(bytearray(b"abcdef")).cast("B")
        obj = asdlpack(m)
        h = [m, obj]
        h.append(h)
        del m, obj, h
        gc.collect()
        keep = [memoryview(bytearray(48))]
        keep.append(asdlpack(keep[0]))
        keep.append(keep)  # left for the collector at exit
        print("ok")
        """
    )
    done = run_python("-c", script)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_collector_tracks_only_objects_that_can_be_in_a_cycle():
    # An owner the collector can't traverse (bytes, an exact numpy array) can't close a cycle
    # the collector could find, so such objects are left untracked, as CPython does for tuples
    # of atoms; an owner it does traverse (a subclass instance with a __dict__) can.
    assert not gc.is_tracked(asdlpack(b"abc"))
    assert gc.is_tracked(asdlpack(Buf(b"abc")))
    np = need("numpy")
    assert not gc.is_tracked(asdlpack(np.arange(3)))


def test_recycled_objects_keep_collecting_cycles():
    # Objects come back from a free list; they must be tracked again when their owner needs it.
    for _ in range(3):
        keep = [asdlpack(b"x") for _ in range(50)]
        del keep
        refs = []
        for _ in range(50):
            src = Buf(b"abc")
            refs.append(weakref.ref(src))
            src.obj = asdlpack(src)
            del src
        collect()
        assert all(ref() is None for ref in refs)


# sys.argv names the consumer libraries to use (those need() gives this process)
EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    from dlpack import asdlpack

    class Buf(bytearray):
        pass

    SRC = Buf(bytes(range(64)))
    OBJ = asdlpack(SRC)
    CAPS = [OBJ.__dlpack__(), OBJ.__dlpack__(max_version=(1, 0)),
            OBJ.__dlpack__(max_version=(1, 3), copy=True)]
    CYC = Buf(b"cycle")
    CYC.obj = asdlpack(CYC)
    CYC.caps = [CYC.obj.__dlpack__(max_version=(1, 1))]
    L = [asdlpack(memoryview(SRC)[::3])]
    L.append(L)
    if "numpy" in sys.argv:
        import numpy as np
        A = np.arange(100.0)
        ARRS = [np.from_dlpack(asdlpack(A)), np.from_dlpack(OBJ)]
        NCAPS = [asdlpack(A[::2]).__dlpack__(max_version=(1, 3))]
    if "torch" in sys.argv:
        import torch
        T = torch.from_dlpack(asdlpack(SRC))
        TO = asdlpack(torch.arange(5))
    print("done")
    """
)


def test_live_exports_at_interpreter_exit():
    consumers = [name for name in ("numpy", "torch") if optional(name) is not None]
    proc = run_python("-c", EXIT_SCRIPT, *consumers, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    assert "Fatal" not in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------
# a consumer calling the deleter itself, without the GIL, from any thread
# ---------------------------------------------------------------------------

_SetName = ctypes.pythonapi.PyCapsule_SetName
_SetName.restype = ctypes.c_int
_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# CFUNCTYPE (unlike PYFUNCTYPE) releases the GIL around the foreign call
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _consume_like_c(cap):
    """Do what a C consumer does: take the pointer, rename the capsule, return the deleter."""
    name = capsule_name(cap)
    ptr = _GetPointer(cap, name.encode())
    assert _SetName(cap, b"used_" + name.encode()) == 0
    struct = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    managed = struct.from_address(ptr)
    assert managed.deleter
    return _DELETER(managed.deleter), ptr


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "other-thread"])
@pytest.mark.parametrize(
    "kwargs", [{}, {"max_version": (1, 3)}, {"max_version": (1, 0), "copy": True}]
)
def test_deleter_called_without_gil(kwargs, in_thread):
    src = Buf(bytes(range(16)))
    ref = weakref.ref(src)
    obj = asdlpack(memoryview(src)[::2])
    del src
    pending = []
    for _ in range(20):
        cap = obj.__dlpack__(**kwargs)
        pending.append(_consume_like_c(cap))
        del cap  # the renamed capsule must not run the deleter again
    del obj
    collect()
    if kwargs.get("copy"):
        # copies own their memory: the source may go, the copies stay readable
        for _deleter, ptr in pending:
            t = DLManagedTensorVersioned.from_address(ptr).dl_tensor
            data = t.data + t.byte_offset
            step = t.strides[0] if t.strides else 1
            got = bytes(ctypes.string_at(data + i * step, 1)[0] for i in range(8))
            assert got == bytes(range(0, 16, 2))
    else:
        assert ref() is not None, "source freed while managed tensors are still alive"

    def run_all():
        for deleter, ptr in pending:
            deleter(ptr)

    if in_thread:
        t = threading.Thread(target=run_all)
        t.start()
        t.join()
    else:
        run_all()
    pending.clear()
    collect()
    assert ref() is None, "deleters did not release the source"


def test_deleter_from_thread_while_main_thread_runs_python():
    src = Buf(bytes(64))
    base = refcount(src)
    obj = asdlpack(src)
    pending = [_consume_like_c(obj.__dlpack__(max_version=(1, 3))) for _ in range(2000)]
    del obj
    stop = threading.Event()

    def run_all():
        for deleter, ptr in pending:
            deleter(ptr)
        stop.set()

    t = threading.Thread(target=run_all)
    t.start()
    spins = 0
    while not stop.is_set():  # keep the interpreter busy meanwhile
        spins += sum(range(100))
    t.join()
    pending.clear()
    assert refcount(src) == base


def test_copy_outlives_source_and_object():
    np = need("numpy")
    src = Buf(bytes(range(32)))
    ref = weakref.ref(src)
    out = np.from_dlpack(asdlpack(memoryview(src)[::4]), copy=True)
    del src
    collect()
    assert ref() is None, "a copy must not keep its source alive"
    np.testing.assert_array_equal(out, np.arange(0, 32, 4))
    out[0] = 200
    assert out[0] == 200
