"""Threads sharing the runtime at once: exchanges of one source, the C API's views, ``copyto``,
sharing, ``.dtype`` and interop pytrees. On a GIL-enabled build the threads interleave between
calls (switching every microsecond here) and run together where a call detaches (large copies);
on a free-threaded build they run together throughout. Values are exact; nothing is timed."""

from __future__ import annotations

import ctypes
import pickle
import sys
import textwrap
import threading
from collections.abc import Callable

import pytest

import dlpack
from dlpack import asdlpack, copyto

from ._c_api import DLPACK_ADAPTER_VIEW_MUTABLE, DLPackAdapterView, address, table
from ._helpers import CapsuleInfo, need, run_python

np = need("numpy")

API = table()
THREADS = 8
ROUNDS = 100


@pytest.fixture(autouse=True)
def _switch_often():
    """Thread switches every microsecond on a GIL-enabled build, so threads meet inside the
    runtime's entry points as often as they can there."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def run_threads(work: Callable[[int], None], threads: int = THREADS) -> None:
    """``work(k)`` on ``threads`` threads started together; the first failure is raised."""
    # The timeout only ends a wait for a thread that died before reaching the barrier.
    barrier = threading.Barrier(threads, timeout=300)
    failures: list[BaseException] = []

    def body(k: int) -> None:
        try:
            barrier.wait()
            work(k)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)
            barrier.abort()

    started = [threading.Thread(target=body, args=(k,)) for k in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    if failures:
        raise failures[0]


# -- exchanges -----------------------------------------------------------------------------------

DTYPES = ["float64", "float32", "int16", "uint8", "complex128", "bool"]


def _source(k: int):
    return (np.arange(1000) % 7 + k).astype(DTYPES[k % len(DTYPES)])


def test_threads_exchange_one_source_into_numpy():
    shared = np.arange(1000, dtype=np.float64)
    obj = asdlpack(shared)

    def work(k):
        own = _source(k)  # one dtype per thread: the dtype cache is read and filled at once
        for r in range(ROUNDS):
            assert np.array_equal(np.from_dlpack(obj), shared)
            assert np.array_equal(np.from_dlpack(asdlpack(shared)), shared)
            out = np.from_dlpack(asdlpack(own))
            assert out.dtype == own.dtype and np.array_equal(out, own)
            # A new max_version tuple each time, asked by every thread: the runtime's cache of
            # the last one is replaced under the others' feet.
            major = r % 2
            info = CapsuleInfo(obj.__dlpack__(max_version=tuple([major, k])))
            assert info.version == ((1, min(k, dlpack.DLPACK_VERSION[1])) if major else None)

    run_threads(work)


def test_threads_exchange_one_source_into_torch():
    torch = need("torch")
    shared = np.arange(1000, dtype=np.float32)
    obj = asdlpack(shared)
    expected = torch.arange(1000, dtype=torch.float32)

    def work(k):
        for _ in range(ROUNDS):
            assert torch.equal(torch.from_dlpack(obj), expected)
            assert torch.equal(torch.from_dlpack(asdlpack(shared)), expected)
            assert obj.__dlpack_device__() == (1, 0)

    run_threads(work)


def test_threads_exchange_one_source_into_arrow():
    pa = need("pyarrow")
    shared = np.arange(1000, dtype=np.int64)
    obj = asdlpack(shared)

    def work(k):
        for _ in range(ROUNDS):
            assert np.array_equal(pa.array(obj).to_numpy(), shared)
            assert pa.array(asdlpack(shared)).to_pylist()[k] == k

    run_threads(work)


def test_threads_read_dtype():
    objects = [asdlpack(np.zeros(3, dtype=name)) for name in DTYPES]

    def work(k):
        for r in range(ROUNDS):
            obj = objects[(k + r) % len(objects)]
            assert obj.dtype == np.dtype(DTYPES[(k + r) % len(objects)])

    run_threads(work)


# -- the C API's views ---------------------------------------------------------------------------

CELL = 8  # elements a thread's own region, and a window's step, span


def test_threads_take_and_release_c_api_views_of_overlapping_and_disjoint_memory():
    """Each thread views its own region (never refused) and windows of a common region that
    overlap its neighbours' (refused where they conflict): no two conflicting views are ever
    held at once, a mutable view's writes are its own, and nothing stays borrowed."""
    a = np.zeros(CELL * THREADS * 2, dtype=np.int64)
    common = CELL * THREADS
    lock = threading.Lock()
    holders: dict[int, list[int]] = {}  # cell -> views held there: +1 shared, -1 mutable

    def hold(cells, weight):
        with lock:
            for cell in cells:
                held = holders.setdefault(cell, [])
                conflict = held and (weight < 0 or any(w < 0 for w in held))
                assert not conflict, f"conflicting views granted over cell {cell}: {held}"
                held.append(weight)

    def unhold(cells, weight):
        with lock:
            for cell in cells:
                holders[cell].remove(weight)

    def view_and_check(region, cells, mutable, k):
        view = DLPackAdapterView()
        API.view(region, DLPACK_ADAPTER_VIEW_MUTABLE if mutable else 0, address(view))
        weight = -1 if mutable else 1
        try:
            hold(cells, weight)
            count = view.shape[0]
            if mutable:
                # Write through the view, then find our own values: no other view wrote.
                ours = np.full(count, k, np.int64)
                ctypes.memmove(view.data, ours.ctypes.data, count * 8)
                seen = np.frombuffer(ctypes.string_at(view.data, count * 8), np.int64)
                assert (seen == k).all()
            unhold(cells, weight)
        finally:
            API.release_view(address(view))

    def work(k):
        own = a[CELL * k : CELL * (k + 1)]
        for r in range(ROUNDS):
            mutable = (k + r) % 3 == 0
            view_and_check(own, [("own", k)], mutable, k)  # never refused: nobody else's
            first = (k + r) % THREADS
            window = a[common + CELL * first : common + CELL * min(first + 2, THREADS)]
            cells = [("common", c) for c in range(first, min(first + 2, THREADS))]
            try:
                view_and_check(window, cells, mutable, k)
            except BufferError as exc:
                assert "borrowed" in str(exc)

    run_threads(work)
    # Nothing stays borrowed: all of it is viewed mutably, and written by copyto.
    whole = DLPackAdapterView()
    API.view(a, DLPACK_ADAPTER_VIEW_MUTABLE, address(whole))
    API.release_view(address(whole))
    copyto(a, np.arange(a.size, dtype=np.int64))
    assert np.array_equal(a, np.arange(a.size))


# -- copyto --------------------------------------------------------------------------------------

LARGE = 1 << 16  # float64 elements: 512 KiB, copied detached


def test_threads_copyto_disjoint_and_overlapping_destinations():
    dst = np.zeros((THREADS + 1) * LARGE, dtype=np.float64)
    sources = [np.arange(LARGE, dtype=np.float64) + k for k in range(THREADS)]
    common_source = np.arange(LARGE, dtype=np.float64) * 2

    common = dst[THREADS * LARGE :]

    def work(k):
        for r in range(ROUNDS // 10):
            copyto(dst[k * LARGE : (k + 1) * LARGE], sources[k])
            # Every thread writes the same values into the last stretch, over one another: the
            # whole of it, and halves that overlap at an offset of its own.
            copyto(common, common_source)
            at = (k * LARGE // (2 * THREADS) + r) % (LARGE // 2)
            copyto(common[at : at + LARGE // 2], common_source[at : at + LARGE // 2])

    run_threads(work)
    for k in range(THREADS):
        assert np.array_equal(dst[k * LARGE : (k + 1) * LARGE], sources[k])
    assert np.array_equal(dst[THREADS * LARGE :], common_source)


def test_a_view_never_sees_copyto_write_under_it():
    """copyto holds its destination while it writes (detached, for large copies): a view taken
    meanwhile is refused, and a view held refuses copyto, so a view's memory never changes."""
    dst = np.zeros(1 << 20, dtype=np.float64)  # 8 MiB: written detached
    values = [np.full(dst.size, float(v)) for v in (1, 2)]
    done = threading.Event()
    viewed = threading.Event()  # the readers are at work before the writer starts

    def writer():
        try:
            viewed.wait()
            written = 0
            while written < 20:  # copies made, between the readers' views
                try:
                    copyto(dst, values[written % 2])
                    written += 1
                except BufferError as exc:
                    assert "borrowed by a view" in str(exc)
        finally:
            done.set()

    def reader():
        try:
            read_views()
        finally:
            viewed.set()  # a reader that failed doesn't keep the writer waiting

    def read_views():
        while not done.is_set():
            view = DLPackAdapterView()
            try:
                API.view(dst, 0, address(view))
            except BufferError as exc:
                assert "being written" in str(exc)
                continue
            try:
                first = np.frombuffer(ctypes.string_at(view.data, dst.nbytes), np.float64)
                again = np.frombuffer(ctypes.string_at(view.data, dst.nbytes), np.float64)
            finally:
                API.release_view(address(view))
            assert first.min() == first.max(), "a view saw a copy half done"
            assert np.array_equal(first, again), "a view's memory changed under it"
            viewed.set()

    run_threads(lambda k: writer() if k == 0 else reader(), threads=3)
    assert (dst == 2.0).all()  # the 20th copy's values


# -- sharing -------------------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sharing needs Linux (memfd)")
def test_threads_share_and_open_handles():
    common = np.arange(5000, dtype=np.float32)  # shared by every thread at once

    def work(k):
        own = np.arange(100, dtype=np.int32) + k
        for _ in range(ROUNDS // 5):
            handle = pickle.loads(pickle.dumps(dlpack.share(own)))  # opened here
            assert np.array_equal(np.from_dlpack(handle), own)
            blob = pickle.dumps(dlpack.share(common[k:]))
            assert np.array_equal(np.asarray(asdlpack(pickle.loads(blob))), common[k:])

    run_threads(work)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sharing needs Linux (memfd)")
def test_threads_update_and_snapshot_one_shared_tree():
    """Threads update one shared tree (through two ``SharedTree`` objects of it) while others
    take snapshots and open it: the updates take turns (each makes one generation, which counts
    every update), each snapshot holds one update's values whole, of the generation that update
    made, and no two snapshots alive share memory (nor does a held one change)."""
    size, names = 4096, [f"layer{k}.weight" for k in range(16)]  # 512 KiB: copied detached
    shared = dlpack.share_tree({name: np.zeros(size) for name in names}, writable=True)
    trees = [shared, pickle.loads(pickle.dumps(shared))]  # one mapping, one description
    writers, updates = THREADS // 2, ROUNDS // 4
    lock = threading.Lock()
    written = {0: 0.0}  # generation: the value every leaf holds in it
    seen: list[tuple[int, float]] = []
    alive: dict[int, tuple[int, int]] = {}  # a held snapshot's bytes, by its number

    def span(arrays):
        return min(a.ctypes.data for a in arrays), max(a.ctypes.data + a.nbytes for a in arrays)

    def let_go(number, arrays, value):
        assert all((a == value).all() for a in arrays), "a held snapshot changed"
        with lock:  # out of `alive` before its memory may be reused
            del alive[number]

    def work(k):
        if k < writers:
            tree = trees[k % 2]
            values = [float(k * 1000 + r + 1) for r in range(updates)]
            # Made first, so that the updates come back to back.
            sources = [{name: np.full(size, value) for name in names} for value in values]
            for value, source in zip(values, sources, strict=True):
                generation = tree.update(source)
                with lock:
                    assert generation not in written, "two updates made one generation"
                    written[generation] = value
            return
        held = []
        for r in range(ROUNDS):
            tree, generation = trees[r % 2].snapshot()
            assert list(tree) == names
            arrays = [np.asarray(leaf) for leaf in tree.values()]
            value = float(arrays[0][0])
            assert all((a == value).all() for a in arrays), "a snapshot of two updates"
            low, high = span(arrays)
            number = k * ROUNDS + r
            with lock:
                seen.append((generation, value))
                for other, (start, end) in alive.items():
                    assert high <= start or end <= low, f"snapshots {number} and {other} share"
                alive[number] = (low, high)
            held.append((number, tree, arrays, value))
            if len(held) > 2:
                oldest = held.pop(0)
                let_go(oldest[0], oldest[2], oldest[3])
                del oldest
            if r % 10 == 0:
                assert list(trees[r % 2].open()) == names
        for number, _, arrays, value in held:
            let_go(number, arrays, value)

    run_threads(work)
    assert shared.generation == writers * updates
    assert sorted(written) == list(range(writers * updates + 1))
    assert all(written[generation] == value for generation, value in seen)
    tree, generation = shared.snapshot()
    assert generation == writers * updates
    assert all((np.asarray(leaf) == written[generation]).all() for leaf in tree.values())


# -- interop pytrees -----------------------------------------------------------------------------


def test_threads_convert_interop_pytrees():
    torch = need("torch")
    from dlpack.interop import to_numpy, to_torch

    def work(k):
        for r in range(ROUNDS // 5):
            tree = {"a": np.arange(10.0) + k, "b": (np.arange(4, dtype=np.int32) * r, k), "c": []}
            there = to_torch(tree)
            assert isinstance(there["a"], torch.Tensor) and there["b"][1] == k
            back = to_numpy(there)
            assert np.array_equal(back["a"], tree["a"])
            assert np.array_equal(back["b"][0], tree["b"][0]) and back["c"] == []

    run_threads(work)


def test_threads_asking_for_jax_module_get_one_class():
    need("torch")
    need("jax")
    code = textwrap.dedent(
        f"""
        import threading
        import time
        import torch, jax
        import dlpack.interop
        barrier = threading.Barrier({THREADS})
        found = []

        def pause_in_class_body(frame, event, arg):
            # Other threads run while JaxModule's class body does: they ask at the same time.
            if event == "call" and frame.f_code.co_name == "JaxModule":
                time.sleep(0.05)

        threading.settrace(pause_in_class_body)

        def ask():
            barrier.wait()
            found.append(dlpack.interop.JaxModule)

        threads = [threading.Thread(target=ask) for _ in range({THREADS})]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(found), len(set(map(id, found))))
        """
    )
    result = run_python("-P", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(THREADS), "1"]
