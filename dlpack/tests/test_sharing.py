"""dlpack.share / empty_shared between real processes, and pickling DLPackObject.

Peers (see ``_sharing_workers``) are real processes of each start method; they report what
they read as bytes in C order, compared with what the producer holds.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dlpack
from dlpack._sharing import handles, process

from . import _sharing_workers as workers
from ._helpers import NUMPY_NATIVE_DTYPES, need, need_cuda, optional, package_root, run_python

np = need("numpy")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)

METHODS = ("fork", "spawn", "forkserver")


@pytest.fixture(scope="module")
def peer_process():
    """One forkserver process serving the whole module (a fresh interpreter: nothing of the test
    process's state leaks into what it sees)."""
    serving = workers.Peer(multiprocessing.get_context("forkserver"))
    yield serving
    serving.close()


@pytest.fixture
def peer(peer_process):
    """The module's peer, holding nothing when a test starts: what a failing test left there is
    let go of after it, so the next test's `read_kept` indices are its own."""
    yield peer_process
    peer_process.call("drop_all")


def expected(array) -> tuple:
    """What a peer should report for the numpy ``array`` shared read-only."""
    return (*workers.numpy_elements(array), True)


def sources():
    """Arrays of every element type and a range of layouts."""
    base = np.arange(2 * 3 * 5 * 7, dtype=np.float64).reshape(2, 3, 5, 7)
    cases = {
        "c": base,
        "fortran": np.asfortranarray(base),
        "transposed": base.transpose(2, 0, 3, 1),
        "strided": base[:, 1:, ::2, 1::3],
        "reversed": base[::-1, :, ::-1],
        "offset-1d": base.reshape(-1)[7:100:3],
        "scalar": np.float64(3.5).reshape(()),
        "empty": base[:, :0],
        "broadcast": np.broadcast_to(np.arange(4.0), (3, 4)),
    }
    dtypes = [np.dtype(name) for name in NUMPY_NATIVE_DTYPES]
    ml_dtypes = optional("ml_dtypes")
    if ml_dtypes is not None:
        dtypes += [
            getattr(ml_dtypes, n)
            for n in dlpack._dlpack.ELEMENT_TYPES
            if n.startswith(("bfloat", "float8"))
        ]
    for dtype in dtypes:
        cases[np.dtype(dtype).name] = (np.arange(24) % 7).astype(dtype).reshape(4, 6)[::-1, 1::2]
    return cases


SOURCES = sources()


def test_importing_dlpack_leaves_sharing_unloaded():
    """``import dlpack`` stays light: the sharing machinery loads on first use of its names."""
    script = (
        "import sys, dlpack\n"
        "assert 'dlpack.sharing' not in sys.modules\n"
        "from dlpack import share, SharedHandle\n"
        "assert 'dlpack.sharing' in sys.modules and 'share' in dir(dlpack)\n"
        # Once loaded, the names are the package's own: no lookup imports again.
        "assert vars(dlpack)['share'] is share and vars(dlpack)['SharedHandle'] is SharedHandle\n"
        "assert dlpack.empty_shared is vars(dlpack)['empty_shared']\n"
    )
    result = run_python("-P", "-c", script)
    assert result.returncode == 0, result.stderr


# -- values and layouts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SOURCES))
def test_values_and_layouts_arrive(peer, name):
    source = SOURCES[name]
    handle = dlpack.share(source)
    assert peer.call("read", handle) == expected(source)
    assert handle.shape == source.shape and handle.dtype == str(source.dtype)


def test_views_of_shared_memory_are_shared_without_a_copy(peer):
    array = np.asarray(dlpack.empty_shared((6, 8), "int32"))
    array[:] = np.arange(48).reshape(6, 8)
    view = array[1:5, ::-3]
    handle = dlpack.share(view)
    assert dlpack.asdlpack(handle).data_ptr == view.__array_interface__["data"][0]
    assert peer.call("read", handle) == expected(view)
    # The peer sees the producer's memory, not a snapshot: a later write shows there too.
    array[1, 7] = -1
    assert peer.call("first_element", handle) == -1


# Forking a process that runs JAX's threads draws its warning; the child here runs none of JAX.
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
@pytest.mark.parametrize("method", METHODS)
def test_every_start_method_queue_and_pipe(method):
    context = multiprocessing.get_context(method)
    array = np.arange(1000.0) + 0.25
    queue_in, queue_out = context.Queue(), context.Queue()
    process = context.Process(target=workers.echo_first_element, args=(queue_in, queue_out))
    process.start()
    queue_in.put(dlpack.share(array))
    assert queue_out.get(timeout=60) == 0.25
    process.join(60)
    assert process.exitcode == 0

    ours, theirs = context.Pipe()
    process = context.Process(target=workers.echo_first_element_pipe, args=(theirs,))
    process.start()
    theirs.close()
    ours.send(dlpack.share(array[5:]))
    assert ours.recv() == 5.25
    process.join(60)
    assert process.exitcode == 0


def test_handle_as_process_argument():
    """A handle pickled while a process starts (spawn passes arguments by pickle)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    shared = np.asarray(dlpack.empty_shared(3, "float32"))
    shared[:] = 9
    holder = workers.Holding(dlpack.share(shared))
    process = context.Process(target=workers.echo_first_element, args=(holder, queue))
    process.start()
    assert queue.get(timeout=60) == 9.0
    process.join(60)


def test_consumers_take_it_with_from_dlpack(peer):
    torch = need("torch")
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    handle = pickle.loads(pickle.dumps(dlpack.share(array)))  # opened here, as a receiver would
    assert np.array_equal(np.from_dlpack(handle), array)
    assert torch.equal(torch.from_dlpack(handle), torch.from_numpy(array))
    assert not np.asarray(dlpack.asdlpack(handle)).flags.writeable


# -- writable and read-only sharing ------------------------------------------------------------


def test_writable_sharing_writes_reach_the_producer(peer):
    array = np.asarray(dlpack.empty_shared((2, 5), "float64"))
    array[:] = 1.5
    peer.call("add_one", dlpack.share(array[:, 1:], writable=True))
    assert array.tolist() == [[1.5, 2.5, 2.5, 2.5, 2.5]] * 2


def test_read_only_is_the_default_and_holds(peer):
    array = np.asarray(dlpack.empty_shared(64, "uint8"))
    array[:] = 3
    handle = dlpack.share(array)
    assert not handle.writable
    with pytest.raises(workers.PeerError, match="read-only"):
        peer.call("add_one", handle)
    # Writing anyway (by address) changes only the writer's own pages.
    assert peer.call("scribble", handle) == b"\x7f" * 64
    assert (array == 3).all()


def test_read_only_and_writable_handles_of_one_segment_map_once(peer):
    """A process maps a segment once, whichever of its handles arrive, in either order: a
    read-only handle's memory and a writable one's have one address, so the runtime's registry
    of borrowed memory (keyed by address) refuses a mutable C API view of the one while a shared
    view of the other is held (two mappings had let both be granted: a `&[u8]` and a `&mut [u8]`
    over the same pages); the read-only views stay read-only (their flag)."""
    array = np.asarray(dlpack.empty_shared(4096, "float64"))  # several pages
    refused = "BufferError: this memory is"
    for order in ("read-only first", "writable first"):
        array[:] = 1.0
        read_only = pickle.dumps(dlpack.share(array))
        writable = pickle.dumps(dlpack.share(array, writable=True))
        first, second = (
            (read_only, writable) if order == "read-only first" else (writable, read_only)
        )
        seen = peer.call("one_memory", first, second)
        shared_then_mutable = seen.pop("shared then mutable")
        mutable_then_shared = seen.pop("mutable then shared")
        assert seen == {
            "readonly": (True, False),
            "same address": True,
            "numpy": (False, "assignment destination is read-only"),
            "seen through the read-only view": 42.0,
            "segments": 1,
            "mappings": 1,
        }, order
        assert shared_then_mutable[0] == "granted", order
        assert shared_then_mutable[1].startswith(refused), (order, shared_then_mutable)
        assert mutable_then_shared[0] == "granted", order
        assert mutable_then_shared[1].startswith(refused), (order, mutable_then_shared)
        assert array[0] == 42.0 and (array[1:] == 1.0).all(), order  # the writable one's write
        assert peer.call("drop_all") == 0


def test_a_writable_handle_wont_open_over_written_read_only_pages(peer):
    """A process that wrote into its read-only view (pages of its own, copy-on-write) can't
    open a writable handle of the same segment while that view lives: turning its one mapping
    shared would replace the pages it wrote."""
    array = np.asarray(dlpack.empty_shared(16, "float64"))
    read_only = pickle.dumps(dlpack.share(array))
    writable = pickle.dumps(dlpack.share(array, writable=True))
    with pytest.raises(workers.PeerError, match="wrote into its read-only view") as raised:
        peer.call("write_then_open", read_only, writable)
    assert raised.value.type_name == "BufferError"
    assert not array.any()  # the producer's memory untouched
    assert peer.call("drop_all") == 0
    # Once those views are gone, it opens.
    peer.call("add_one", pickle.loads(writable))
    assert (array == 1.0).all()


def test_writable_needs_memory_shared_already():
    with pytest.raises(ValueError, match="empty_shared"):
        dlpack.share(np.zeros(4), writable=True)
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dlpack.share(frozen, writable=True)


# -- lifetime ----------------------------------------------------------------------------------


def test_same_handle_opened_twice_maps_once(peer):
    array = np.asarray(dlpack.empty_shared(10, "int64"))
    array[:] = np.arange(10)
    handle = dlpack.share(array)
    first, second = pickle.dumps(handle), pickle.dumps(handle)
    address, segments = peer.call("open_and_keep", first)
    assert peer.call("open_and_keep", second) == (address, segments)
    assert peer.call("open_and_keep", first) == (address, segments)  # the same pickle again
    assert peer.call("read_kept", 2) == expected(array)
    assert peer.call("drop_all") == 0
    # Closed there, a pickle opens again while its memory lives here (it is checked to be the
    # segment named); once it is gone here too, it is refused: its token was spent.
    assert peer.call("read_pickle", first) == expected(array)
    del array, handle
    gc.collect()
    with pytest.raises(workers.PeerError, match="already opened"):
        peer.call("read_pickle", first)


def test_producer_exit_leaves_views_valid(peer):
    context = multiprocessing.get_context("forkserver")
    # A pipe each: two processes reading one pipe can split a message between them.
    ours, theirs = context.Pipe()
    producer = context.Process(target=workers.produce, args=(theirs, 1000, 4.5))
    producer.start()
    theirs.close()
    opened = ours.recv_bytes()
    peer.call("open_and_keep", opened)
    ours_unopened, theirs_unopened = context.Pipe()
    unopened_producer = context.Process(target=workers.produce, args=(theirs_unopened, 10, 1.0))
    unopened_producer.start()
    theirs_unopened.close()
    unopened = ours_unopened.recv_bytes()
    ours.send(None)
    ours_unopened.send(None)
    producer.join(60)
    unopened_producer.join(60)
    assert producer.exitcode == 0 and unopened_producer.exitcode == 0
    data, shape, _, _ = peer.call("read_kept", 0)
    assert shape == (1000,) and np.frombuffer(data).tolist() == [4.5] * 1000
    # A handle its producer never lent before exiting: a clear error, not a hang.
    with pytest.raises(workers.PeerError, match="can't be reached"):
        peer.call("read_pickle", unopened)
    assert peer.call("drop_all") == 0


def test_consumer_sigkill_leaves_the_producer_serving():
    context = multiprocessing.get_context("forkserver")
    array = np.arange(256.0)
    pickle.loads(pickle.dumps(dlpack.share(array)))  # the lender runs before the count
    # Counted from here: earlier tests (of any module, in any order) may have left pins of
    # handles never opened, and segments kept for reuse.
    pinned_before = workers.pinned()
    pooled_before = workers.pooled()
    before = workers.descriptor_kinds()
    for _ in range(3):
        ours, theirs = context.Pipe()
        victim = context.Process(target=workers.cycles, args=(theirs,))
        victim.start()
        theirs.close()
        ours.send(dlpack.share(array))
        assert ours.recv() == 0.0
        ours.send(dlpack.share(array))  # in flight when it dies: its pin stays
        victim.kill()
        victim.join()
        assert victim.exitcode == -signal.SIGKILL
        ours.close()
    ours, theirs = context.Pipe()
    survivor = context.Process(target=workers.cycles, args=(theirs,))
    survivor.start()
    theirs.close()
    ours.send(dlpack.share(array[3:]))
    assert ours.recv() == 3.0
    ours.send(None)
    ours.recv()
    survivor.join(30)
    ours.close()
    # The lender closed the connections of the dead (and of the survivor, gone too); the only
    # segments opened since are those of pins never released by the dead, and those kept for
    # reuse (two descriptors each: the writable one, and the read-only one lent).
    unreleased = workers.pinned() - pinned_before  # first: it lets go of what was released
    assert 0 <= unreleased <= 3
    kinds = workers.descriptor_kinds()
    assert kinds["socket"] == before["socket"]
    pooled = workers.pooled() - pooled_before
    assert kinds["memfd"] - before["memfd"] == 2 * (unreleased + pooled)


def test_no_leaks_over_ten_thousand_cycles():
    """10^4 share/open cycles: file descriptors and mappings back to where they were, on both
    sides (fresh arrays each time: a new segment per share)."""
    context = multiprocessing.get_context("forkserver")
    ours, theirs = context.Pipe()
    consumer = context.Process(target=workers.cycles, args=(theirs,))
    consumer.start()
    theirs.close()
    array = np.arange(512, dtype=np.float32)
    for _warm_up in range(20):
        ours.send(dlpack.share(array))
        ours.recv()
    ours.send("resources")
    consumer_before = ours.recv()
    before = workers.count_resources()
    mapped_before = workers.memfd_mappings()
    for cycle in range(10_000):
        array[0] = cycle
        ours.send(dlpack.share(array))
        assert ours.recv() == cycle
    ours.send(None)
    consumer_after = ours.recv()
    consumer.join(30)
    ours.close()
    # Descriptors exactly; mappings within the slack the allocator's own arenas need (3.15's
    # gave one back during the loop): a leak would be one per cycle.
    assert consumer_after[0] == consumer_before[0]
    assert consumer_after[1] <= consumer_before[1] + 2
    after = workers.count_resources()
    assert after[0] <= before[0] and after[1] <= before[1] + 2
    # Only segments kept for reuse stay mapped (by their writable mappings: they are sealed).
    assert workers.memfd_mappings() <= mapped_before + process.POOL_SEGMENTS
    process.clear_pool()
    assert workers.memfd_mappings() <= mapped_before


def test_a_tiny_dev_shm_is_no_obstacle(tmp_path):
    """memfd memory is not in /dev/shm: with a 64 KiB /dev/shm (a private mount in a user
    namespace, as small as a container's can be) 16 MiB still go across, and nothing is named
    there."""
    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    if not probe or probe.returncode != 0:
        pytest.skip(
            f"no user namespaces here to mount a tiny /dev/shm in: {probe and probe.stderr}"
        )
    script = tmp_path / "tiny_shm.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, os
            import numpy as np
            import dlpack
            from dlpack.tests import _sharing_workers as workers

            if __name__ == "__main__":
                probe = os.open("/dev/shm/probe", os.O_CREAT | os.O_RDWR)
                try:
                    os.posix_fallocate(probe, 0, 16 << 20)
                    print("/dev/shm: room")
                except OSError as exc:
                    print("/dev/shm: full", exc.strerror)
                os.close(probe)
                os.unlink("/dev/shm/probe")
                context = multiprocessing.get_context("fork")
                ours, theirs = context.Pipe()
                process = context.Process(target=workers.echo_first_element_pipe, args=(theirs,))
                process.start()
                array = np.full(4 << 20, 2.0, dtype=np.float32)
                ours.send(dlpack.share(array))
                print("dlpack:", ours.recv())
                process.join()
                print("left in /dev/shm:", os.listdir("/dev/shm"))
            """
        )
    )
    command = (
        f"mount -t tmpfs -o size=64k tmpfs /dev/shm && cd {package_root()} && "
        f"{sys.executable} -P {script}"
    )
    env = {**os.environ, "PYTHONPATH": package_root()}
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "/dev/shm: full" in result.stdout
    assert "dlpack: 2.0" in result.stdout
    assert "left in /dev/shm: []" in result.stdout


# -- reuse of fresh copies' segments --------------------------------------------------------


def segment_key(handle) -> tuple[int, int]:
    return handle._memory[1]  # (pickling it would pin the segment)


def pooled_soon(count: int) -> bool:
    """Whether ``count`` segments are kept for reuse, once the releases receivers sent (which
    nothing waits for) have reached the lender."""
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        if workers.pooled() == count or time.monotonic() > deadline:
            return workers.pooled() == count
        time.sleep(0.005)


@pytest.fixture
def empty_pool():
    process.clear_pool()
    yield
    process.clear_pool()


def test_a_fresh_copy_reuses_a_segment_nothing_maps(peer, empty_pool):
    first = np.full(1000, 1.0)
    handle = dlpack.share(first)
    key = segment_key(handle)
    assert peer.call("read", handle)[0] == first.tobytes()
    del handle
    assert pooled_soon(1)
    second = np.full(1000, 2.0)
    handle = dlpack.share(second)
    assert segment_key(handle) == key and workers.pooled() == 0  # the same memory, rewritten
    assert peer.call("read", handle)[0] == second.tobytes()


def test_no_reuse_while_a_process_maps_it(peer, empty_pool):
    first = np.full(1000, 1.0)
    handle = dlpack.share(first)
    key = segment_key(handle)
    peer.call("open_and_keep", pickle.dumps(handle))
    del handle
    assert pooled_soon(1)
    handle = dlpack.share(np.full(1000, 2.0))
    assert segment_key(handle) != key  # a new segment: the peer still sees the first
    assert peer.call("read_kept", 0)[0] == first.tobytes()
    assert peer.call("drop_all") == 0
    del handle
    gc.collect()
    handle = dlpack.share(np.full(1000, 3.0))  # now the first is free again
    assert segment_key(handle) == key


def test_an_old_pickle_cannot_open_reused_memory(peer, empty_pool):
    handle = dlpack.share(np.full(1000, 1.0))
    key, old = segment_key(handle), pickle.dumps(handle)
    assert peer.call("read_pickle", old)[0] == np.full(1000, 1.0).tobytes()
    del handle
    gc.collect()
    handle = dlpack.share(np.full(1000, 2.0))
    assert segment_key(handle) == key
    # The old pickle names the segment and its descriptor, both still there, but its
    # generation is gone: refused, rather than showing the new data.
    with pytest.raises(workers.PeerError, match="reused"):
        peer.call("read_pickle", old)
    assert peer.call("read", handle)[0] == np.full(1000, 2.0).tobytes()


def test_reuse_from_many_threads_hands_each_segment_out_once(empty_pool):
    """Threads sharing fresh arrays of one size while segments die and are reused (their
    finalizers running in whichever thread): every copy holds its own values to the end."""
    failures = []

    def work(value: int) -> None:
        for _ in range(300):
            handle = dlpack.share(np.full(512, value, dtype=np.int32))
            seen = np.asarray(dlpack.asdlpack(handle))
            for _ in range(3):  # long enough for another thread's copy to land here, if shared
                if not (seen == value).all():
                    failures.append(value)
                    return
                time.sleep(0)
            del handle, seen

    threads = [threading.Thread(target=work, args=(value,)) for value in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert 0 < workers.pooled() <= process.POOL_SEGMENTS


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")  # see above
def test_a_forked_child_keeps_what_it_inherited(empty_pool):
    context = multiprocessing.get_context("fork")
    workers.inherited = dlpack.share(np.full(1000, 1.0))  # a global: the child has it by fork
    key = segment_key(workers.inherited)
    ours, theirs = context.Pipe()
    child = context.Process(target=workers.read_inherited_later, args=(theirs,), daemon=True)
    child.start()
    theirs.close()
    try:
        assert ours.poll(30) and ours.recv() == "ready"
        workers.inherited = None
        assert pooled_soon(1)
        fresh = dlpack.share(np.full(1000, 2.0))
        assert segment_key(fresh) != key  # the child still maps the first
        ours.send("read")
        assert ours.poll(30) and ours.recv() == 1.0
    finally:
        workers.inherited = None
        child.join(30)
        if child.is_alive():
            child.kill()


# -- bad handles -------------------------------------------------------------------------------


def test_forged_handles_are_refused(peer):
    array = np.arange(100.0)

    def fresh():  # each case its own pickle, so a claim in one can't spend another's token
        return workers.fields_of(dlpack.share(array))

    def forged(edit) -> bytes:
        fields = fresh()
        edit(fields, fields["segment"])
        return workers.pack(fields)

    state = workers.pack(fresh())
    other = fresh()["segment"]  # another copy's segment
    cases = {
        "not bytes": ("ValueError", "its state is not bytes", ("junk",)),
        "junk": ("ValueError", "does not start as one does", b"junk"),
        "cut short": ("ValueError", "malformed state", state[:-1]),
        "past its end": ("ValueError", "past its end", state + b"\0"),
        "format": (
            "ValueError",
            "format 99, this dlpack reads format",
            forged(lambda f, s: f.update(format=99)),
        ),
        "past the end": (
            "ValueError",
            "forged or corrupted",
            forged(lambda f, s: f.update(offset=f["offset"] + 8)),
        ),
        "dtype": (
            "ValueError",
            "element type it can't name",
            forged(lambda f, s: f.update(dtype=(99, 32, 1))),
        ),
        "lanes": (
            "ValueError",
            "element type it can't name",
            forged(lambda f, s: f.update(dtype=(2, 32, 2))),
        ),
        "byte order of bytes": (
            "ValueError",
            "element type it can't name",
            forged(lambda f, s: f.update(dtype=(0, 8, 1), swapped=True)),
        ),
        "overflow": (
            "ValueError",
            "2\\*\\*63 bytes",
            forged(lambda f, s: f.update(shape=[1 << 62, 4], strides=[8, 8])),
        ),
        "elements without memory": (
            "ValueError",
            "elements without memory",
            forged(lambda f, s: f.update(segment=None)),
        ),
        # A token the lender never gave, and a descriptor that isn't there: nothing opens.
        "token": (
            "BufferError",
            "not made by this process",
            forged(lambda f, s: s.update(token=bytes(16), fd=1 << 20)),
        ),
        "size": (
            "ValueError",
            "forged or corrupted",
            forged(lambda f, s: s.update(size=s["size"] + 4096)),
        ),
        # the (device, inode) of another segment than the one lent
        "other file": (
            "BufferError",
            "not the segment the handle names",
            forged(lambda f, s: s.update(file=other["file"])),
        ),
    }
    for name, (kind, message, state_forged) in cases.items():
        with pytest.raises(workers.PeerError, match=message) as raised:
            peer.call("rebuild", state_forged)
        assert raised.value.type_name == kind, name
    assert peer.call("rebuild", state) == expected(array)  # unaltered, it opens


def test_handles_from_another_machine_are_refused(peer):
    fields = workers.fields_of(dlpack.share(np.zeros(3)))
    fields["boot_id"] = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(workers.PeerError, match="another machine") as raised:
        peer.call("rebuild", workers.pack(fields))
    assert raised.value.type_name == "BufferError"


def test_share_arguments():
    with pytest.raises(TypeError):
        dlpack.share(np.zeros(2), writable=1)
    with pytest.raises(TypeError):
        dlpack.share(object())
    with pytest.raises(TypeError):
        handles.SharedHandle()
    with pytest.raises(ValueError, match="unknown element type"):
        dlpack.empty_shared(3, "float128x")
    with pytest.raises(ValueError, match="negative"):
        dlpack.empty_shared((2, -1), "float32")
    with pytest.raises(TypeError):
        dlpack.empty_shared(2.5, "float32")


def test_empty_shared_dtypes_and_shapes():
    torch = need("torch")
    for dtype in ("float32", np.int16, np.dtype("complex64"), torch.bfloat16):
        made = dlpack.empty_shared((3, 2), dtype)
        assert made.shape == (3, 2) and made.c_contiguous and not made.readonly
        assert np.asarray(made).tobytes() == bytes(made.nbytes)
    assert dlpack.empty_shared(0, "float64").shape == (0,)
    assert dlpack.empty_shared((), "int8").shape == ()


def test_device_memory_is_refused():
    torch = need("torch")
    need_cuda(torch.cuda.is_available(), "no CUDA device")
    on_device = dlpack.asdlpack(torch.zeros(2, device="cuda"))
    with pytest.raises(BufferError, match="host"):
        pickle.dumps(on_device)
    with pytest.raises(BufferError, match="CUDA IPC"):
        dlpack.share(on_device)
