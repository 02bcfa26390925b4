"""dlpack.share_tree / SharedTree between real processes: one segment and one handle per tree,
opened zero-copy, updated in place, read as consistent snapshots.

Peers (see ``_tree_workers``) are real processes; they report what they read (each leaf's bytes
in C order, shape, dtype and read-only flag, each container's type), compared with what each
source library says of its arrays.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import textwrap
import threading
import time

import pytest

import dlpack
from dlpack._dlpack import _testing
from dlpack.interop._pytree import _map_leaves

from . import _sharing_workers as workers
from . import _tree_workers as tree_workers
from ._helpers import (
    ML_DTYPES_NAMES,
    NUMPY_NATIVE_DTYPES,
    need,
    optional,
    run_python,
)

np = need("numpy")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)

NOBODY = 65534


@pytest.fixture(scope="module")
def peer_process():
    serving = tree_workers.Peer(multiprocessing.get_context("forkserver"))
    yield serving
    serving.close()


@pytest.fixture
def peer(peer_process):
    yield peer_process
    peer_process.call("drop_trees")


@pytest.fixture
def own_peer():
    """A peer for this test alone: one that imports torch (each of the module peer's later
    collections would walk torch's objects), or that counts trips and must not pay for that."""
    serving = tree_workers.Peer(multiprocessing.get_context("forkserver"))
    yield serving
    serving.close()


def spawned(target, *args, method="spawn"):
    """Run ``target(*args, connection)`` in a new process: what it sends first."""
    context = multiprocessing.get_context(method)
    ours, theirs = context.Pipe()
    process = context.Process(target=target, args=(*args, theirs))
    process.start()
    theirs.close()
    try:
        assert ours.poll(120), "the process sent nothing"
        return ours.recv()
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()


# -- what arrives -------------------------------------------------------------------------------


def expected_leaf(leaf) -> tuple:
    """What a receiver must read of an array leaf, as its own library says: bytes in C order,
    shape, dtype name, and read-only (as ``open()`` gives them)."""
    module = type(leaf).__module__.split(".")[0]
    if module == "torch":
        torch = need("torch")
        contiguous = leaf.detach().contiguous()
        if contiguous.dtype == torch.bfloat16:
            data = contiguous.view(torch.int16).numpy().tobytes()
        else:
            data = contiguous.numpy().tobytes()
        return data, tuple(leaf.shape), str(leaf.dtype).removeprefix("torch."), True
    if module == "pyarrow":
        array = leaf.to_numpy(zero_copy_only=False)
        return array.tobytes(), array.shape, str(array.dtype), True
    if module in ("jax", "jaxlib"):
        array = np.asarray(leaf)
        return array.tobytes(), array.shape, str(array.dtype), True
    array = np.asarray(leaf)
    name = array.dtype.name if array.dtype.isnative else array.dtype.newbyteorder("=").name
    return np.ascontiguousarray(array).tobytes(), array.shape, name, True


def expected_shape(tree, readonly=True):
    """``_tree_workers.shape_of`` as the source tree must give it."""

    def leaf(value, kind):
        data, shape, dtype, _ = expected_leaf(value)
        return tree_workers.Leaf((data, shape, dtype, readonly))

    mapped = _map_leaves(tree, leaf)
    return tree_workers.shape_of(mapped)


def every_leaf() -> dict:
    """A tree of every array leaf library and element type, with containers of every kind and
    non-array leaves."""
    base = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    numpy_leaves = {
        "c": base,
        "fortran": np.asfortranarray(base),
        "transposed": base.transpose(2, 0, 1),
        "strided": base[:, ::2, 1::2],
        "reversed": base[::-1],
        "scalar array": np.array(2.5),
        "numpy scalar": np.float32(1.25),
        "empty": base[:, :0],
        "big-endian": np.arange(5, dtype=">i4"),
    }
    for name in NUMPY_NATIVE_DTYPES:
        numpy_leaves[name] = (np.arange(12) % 7).astype(name).reshape(3, 4)[::-1]
    ml_dtypes = optional("ml_dtypes")
    if ml_dtypes is not None:
        for name in ML_DTYPES_NAMES:
            numpy_leaves[name] = (np.arange(6) % 3).astype(getattr(ml_dtypes, name))
    tree: dict = {
        "numpy": numpy_leaves,
        "containers": [
            tree_workers.Pair(np.ones(3), np.zeros(2, dtype=np.int8)),
            (np.arange(4), "text", None, 7, 2.5),
            tree_workers.Layer(np.eye(2), np.float64(0.5)),
            tree_workers.Ordered(b=np.arange(2), a=np.arange(3)),
        ],
        "object": dlpack.asdlpack(np.arange(6, dtype=np.uint16).reshape(2, 3)),
    }
    torch = optional("torch")
    if torch is not None:
        tree["torch"] = {
            "float32": torch.arange(12, dtype=torch.float32).reshape(3, 4).T,
            "bfloat16": torch.arange(5, dtype=torch.bfloat16),
            "int64": torch.arange(4),
            "requires grad": torch.ones(3, requires_grad=True),
        }
    jax = optional("jax")
    if jax is not None:
        tree["jax"] = (jax.numpy.arange(6, dtype=jax.numpy.float32).reshape(2, 3),)
    pyarrow = optional("pyarrow")
    if pyarrow is not None:
        tree["pyarrow"] = [pyarrow.array(np.arange(5, dtype=np.int32))]
    return tree


def test_leaves_of_every_library_and_type_arrive_in_their_structure(peer):
    tree = every_leaf()
    shared = dlpack.share_tree(tree)
    expected = expected_shape(tree)
    data = pickle.dumps(shared)
    assert peer.call("open_tree", data) == expected
    snapshot, generation = peer.call("snapshot_tree", data)
    assert generation == 0
    assert snapshot == expected_shape(tree, readonly=False)
    # The lender reads the same.
    assert tree_workers.shape_of(shared.open()) == expected
    assert len(shared) == len(dlpack.interop._pytree._flatten(tree)[1])


def test_a_pickle_is_small_whatever_the_tree():
    one = pickle.dumps(dlpack.share_tree({"w": np.zeros(3)}))
    many = pickle.dumps(dlpack.share_tree({f"layer{k}": np.zeros(1024) for k in range(1000)}))
    assert len(one) == len(many) < 400


def test_open_is_zero_copy_over_one_mapping_and_sees_updates(peer):
    shared = dlpack.share_tree({"a": np.arange(4.0), "b": [np.zeros(2, np.int32)]})
    opened = shared.open()
    assert opened["a"] is shared.open()["a"]  # the same objects at every call
    a, b = np.asarray(opened["a"]), np.asarray(opened["b"][0])
    assert not a.flags.writeable and not b.flags.writeable
    assert a.__array_interface__["data"][0] % 64 == 0
    generation = shared.update({"a": np.full(4, 9.0), "b": [np.ones(2, np.int32)]})
    assert generation == 1 == shared.generation
    assert a.tolist() == [9.0] * 4 and b.tolist() == [1, 1]  # seen in place
    data = pickle.dumps(shared)
    segments, _ = peer.call("keep_tree", data)
    assert segments == 1
    # A receiver's views are over the same memory too: an update shows there.
    shared.update({"a": np.full(4, 3.0), "b": [np.ones(2, np.int32)]})
    opened_there = peer.call("kept_open", 0)
    assert opened_there[1][0][1] == (np.full(4, 3.0).tobytes(), (4,), "float64", True)


# -- updates -------------------------------------------------------------------------------------


def test_updates_keep_structure_shapes_and_types():
    torch = need("torch")
    tree = {"w": np.zeros((2, 3), np.float32), "meta": {"step": 3, "name": "x"}, "b": [np.zeros(2)]}
    shared = dlpack.share_tree(tree)
    # Any library and layout with the same shapes and types: torch, transposed.
    new = {
        "w": torch.arange(6, dtype=torch.float32).reshape(3, 2).T,
        "meta": {"step": 3, "name": "x"},
        "b": [np.ones(2)],
    }
    assert shared.update(new) == 1
    tree_, generation = shared.snapshot()
    assert generation == 1
    assert np.asarray(tree_["w"]).tolist() == new["w"].numpy().tolist()
    shape = r"tree\['w'\] has shape \(3, 2\), but the tree was shared with shape \(2, 3\)"
    order = r"its array leaf 0 is at tree\['b'\]\[0\], it was at tree\['w'\]"
    refusals = {
        "shape": ({**new, "w": np.zeros((3, 2), np.float32)}, ValueError, shape),
        "type": (
            {**new, "w": np.zeros((2, 3), np.float64)},
            TypeError,
            r"tree\['w'\] holds float64, but the tree was shared with float32",
        ),
        "non-array leaf": (
            {**new, "meta": {"step": 4, "name": "x"}},
            ValueError,
            "non-array leaves differ",
        ),
        "structure": (
            {"w": new["w"], "meta": new["meta"]},
            ValueError,
            "1 array leaves, but was shared with 2",
        ),
        "order": ({"b": new["b"], "w": new["w"], "meta": new["meta"]}, ValueError, order),
        "device": None,
    }
    if torch.cuda.is_available():
        refusals["device"] = ({**new, "w": new["w"].cuda()}, BufferError, "device memory")
    for name, case in refusals.items():
        if case is None:
            continue
        bad, kind, message = case
        with pytest.raises(kind, match=message):
            shared.update(bad)
        assert shared.generation == 1, name  # nothing written
    with pytest.raises(TypeError, match="timeout"):
        shared.update(new, timeout="1")
    with pytest.raises(ValueError, match="timeout"):
        shared.snapshot(timeout=-1)


def test_an_update_from_the_trees_own_memory_reads_it_first():
    shared = dlpack.share_tree([np.arange(4.0), np.arange(4.0) + 10])
    opened = shared.open()
    shared.update([opened[1], opened[0]])  # the two leaves swapped, through their own views
    assert [np.asarray(leaf).tolist() for leaf in shared.snapshot().tree] == [
        [10.0, 11.0, 12.0, 13.0],
        [0.0, 1.0, 2.0, 3.0],
    ]


def test_a_snapshot_still_held_is_never_rewritten():
    """Snapshots reuse the memory and leaves of earlier ones that nothing holds any more: a
    leaf held through an export (a numpy array, a torch tensor) keeps its snapshot's memory its
    own."""
    torch = need("torch")
    shared = dlpack.share_tree({"w": np.zeros(4), "v": [np.zeros(2, np.int32)]})
    as_numpy = np.asarray(shared.snapshot().tree["w"])  # only the export holds the leaf
    as_torch = torch.from_dlpack(shared.snapshot().tree["v"][0])
    dropped = shared.snapshot()
    first_leaf = dropped.tree["w"]
    del dropped
    for generation in range(1, 8):
        shared.update({"w": np.full(4, float(generation)), "v": [np.full(2, generation, np.int32)]})
        tree, made = shared.snapshot()
        assert made == generation
        assert np.asarray(tree["w"]).tolist() == [float(generation)] * 4
        assert np.asarray(tree["v"][0]).tolist() == [generation] * 2
        del tree
    assert as_numpy.tolist() == [0.0] * 4 and as_torch.tolist() == [0, 0]
    assert np.asarray(first_leaf).tolist() == [0.0] * 4


def test_read_only_receivers_cant_update_and_writable_ones_can(peer):
    tree = {"w": np.zeros(4)}
    read_only = dlpack.share_tree(tree)
    peer.call("keep_tree", pickle.dumps(read_only))
    with pytest.raises(workers.PeerError, match="shared read-only") as raised:
        peer.call("kept_update", 0, 5.0)
    assert raised.value.type_name == "ValueError"
    writable = dlpack.share_tree(tree, writable=True)
    peer.call("keep_tree", pickle.dumps(writable))
    assert peer.call("kept_update", 1, 5.0) == 1
    assert writable.generation == 1
    assert np.asarray(writable.snapshot().tree["w"]).tolist() == [5.0] * 4
    # And a third process sees it.
    assert tree_workers.snapshot_tree(pickle.dumps(writable))[1] == 1


def test_read_only_stays_read_only_and_snapshots_read_the_tree(own_peer):
    """A receiver that writes into its ``open()`` view anyway (torch ignores the flag) changes
    its own pages only; its snapshots still read the tree's memory, updates included. A peer of
    its own, which imports torch."""
    need("torch")
    peer = own_peer
    shared = dlpack.share_tree({"w": np.arange(1024.0)})
    peer.call("keep_tree", pickle.dumps(shared))
    assert peer.call("kept_scribble_with_torch", 0, "w") == -7.0
    assert np.asarray(shared.open()["w"])[0] == 0.0  # the lender's memory untouched
    assert peer.call("kept_snapshot", 0)[0][1][0][1][0] == np.arange(1024.0).tobytes()
    shared.update({"w": np.full(1024, 2.0)})
    tree, generation = peer.call("kept_snapshot", 0)
    assert generation == 1 and tree[1][0][1][0] == np.full(1024, 2.0).tobytes()


# -- one segment, one handle ---------------------------------------------------------------------


def test_descriptors_per_tree(peer):
    """A tree of 1,000 leaves costs its lender two descriptors (the segment, and the read-only
    open lent) and a receiver one, beyond what sharing holds per process (the lender's socket
    and board, a receiver's board of each lender)."""
    dlpack.share_tree({"warm": np.zeros(1)})
    pickle.dumps(dlpack.share_tree({"warm": np.zeros(1)}))  # the lender runs
    peer.call("keep_tree", pickle.dumps(dlpack.share_tree({"warm": np.zeros(1)})))
    before = tree_workers.descriptors()
    there_before = peer.call("descriptors")
    shared = dlpack.share_tree(
        {f"layer{k}.weight": np.zeros(1024, np.float32) for k in range(1000)}
    )
    data = pickle.dumps(shared)
    peer.call("keep_tree", data)
    after = tree_workers.descriptors()
    there_after = peer.call("descriptors")
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)
    assert (there_after[0] - there_before[0], there_after[1] - there_before[1]) == (1, 1)


def test_a_thousand_leaves_under_a_limit_of_64_open_files():
    """Sharing per leaf needs two descriptors a leaf (2,000 for this tree): a tree needs two."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=tree_workers.share_under_limit, args=(64, theirs))
    process.start()
    theirs.close()
    try:
        mine = dlpack.share_tree([np.full(8, 1.0) for _ in range(1000)])
        ours.send_bytes(pickle.dumps(mine))
        theirs_tree = pickle.loads(ours.recv_bytes())
        total, open_files = ours.recv()
        assert total == 8000.0 and open_files <= 64
        assert sum(np.asarray(leaf).sum() for leaf in theirs_tree.snapshot().tree) == 8 * 499500
    finally:
        ours.send(None)
        process.join(60)


def test_a_trees_segment_is_reused_once_nothing_maps_it(peer):
    _testing_pool_clear()
    tree = {"w": np.arange(1000.0)}
    shared = dlpack.share_tree(tree)
    key, old = shared._segment._memory, pickle.dumps(shared)
    peer.call("keep_tree", old)
    del shared
    gc.collect()
    other = dlpack.share_tree(tree)
    assert other._segment._memory != key  # the peer still maps the first
    assert peer.call("drop_trees") == 0
    del other
    gc.collect()
    again = dlpack.share_tree({"w": np.full(1000, 5.0)})
    assert again._segment._memory == key  # reused, rewritten
    # The old pickle names it still, but its generation is gone: refused, not the new tree.
    with pytest.raises(workers.PeerError, match="reused|already opened"):
        peer.call("open_tree", old)
    assert (
        peer.call("snapshot_tree", pickle.dumps(again))[0][1][0][1][0]
        == np.full(1000, 5.0).tobytes()
    )


def _testing_pool_clear():
    from dlpack._sharing import process

    process.clear_pool()


# -- a writer and readers ------------------------------------------------------------------------


def test_a_writer_updating_while_two_readers_take_snapshots():
    """A writer process makes 10^3 generations, each writing its number into every element of
    eight leaves of four types, while two reader processes take 10^4 snapshots each (from before
    the first update until after the last): every snapshot holds one generation, the one it
    says, and a reader's generations never go back."""
    context = multiprocessing.get_context("spawn")
    shared = dlpack.share_tree(
        tree_workers.leaves_of(count=8, size=2048, generation=0), writable=True
    )
    start, done = context.Event(), context.Event()
    readies = [context.Event() for _ in range(2)]
    pipes = [context.Pipe() for _ in range(3)]
    readers = [
        context.Process(
            target=tree_workers.read_snapshots,
            args=(pickle.dumps(shared), 10_000, ready, done, theirs),
        )
        for ready, (_, theirs) in zip(readies, pipes[:2], strict=True)
    ]
    writer = context.Process(
        target=tree_workers.write_generations,
        args=(pickle.dumps(shared), 1000, 2048, start, done, pipes[2][1]),
    )
    for process in (*readers, writer):
        process.start()
    for _, theirs in pipes:
        theirs.close()
    try:
        for ready in readies:
            assert ready.wait(120)
        start.set()
        assert pipes[2][0].poll(600)
        assert pipes[2][0].recv() == ("ok", 1000)
        for ours, _ in pipes[:2]:
            assert ours.poll(600)
            taken, mixed, back, distinct, last = ours.recv()
            assert (mixed, back, last) == (0, 0, 1000)
            assert taken >= 10_000 and distinct >= 2
    finally:
        for process in (*readers, writer):
            process.join(60)
            if process.is_alive():
                process.kill()
    assert shared.generation == 1000


# -- faults --------------------------------------------------------------------------------------


def stop_mid_update(shared, ours, writer) -> None:
    """Stop ``writer`` (``update_forever`` of ``shared``, saying so on ``ours``) while it
    writes: stopped, it still holds the writers' lock, and the sequence is odd."""
    assert ours.poll(120) and ours.recv() == "updating"
    deadline = time.monotonic() + 120
    while shared.generation < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the first update landed: it writes back to back from now on
    for _ in range(2000):  # stopped mid-write at last (it writes nearly all the time)
        os.kill(writer.pid, signal.SIGSTOP)
        if shared._segment._sequence % 2 == 1:
            break
        os.kill(writer.pid, signal.SIGCONT)
        time.sleep(0.003)
    assert shared._segment._sequence % 2 == 1


def test_a_writer_that_dies_mid_update_leaves_a_torn_tree_until_the_next():
    """A writer killed while it writes: readers get a BufferError saying so (never a mix, never
    a hang), until an update writes the tree whole again."""
    context = multiprocessing.get_context("spawn")
    tree = {"w": np.zeros(8 << 20, np.float32), "v": np.zeros(1024)}  # 32 MiB: updates take long
    shared = dlpack.share_tree(tree, writable=True)
    ours, theirs = context.Pipe()
    writer = context.Process(
        target=tree_workers.update_forever, args=(pickle.dumps(shared), theirs)
    )
    writer.start()
    theirs.close()
    try:
        stop_mid_update(shared, ours, writer)
        # Stopped, it still holds its lock: a reader waits for it, here at most a little.
        with pytest.raises(TimeoutError, match="a writer is still writing"):
            shared.snapshot(timeout=0.2)
        writer.kill()
        writer.join(60)
        with pytest.raises(BufferError, match="cut short: its writer exited while writing"):
            shared.snapshot()
        assert shared.update(tree) == shared.generation  # written whole again
        assert np.asarray(shared.snapshot().tree["v"]).tolist() == [0.0] * 1024
    finally:
        if writer.is_alive():
            writer.kill()
        writer.join(60)


def test_an_update_waits_for_another_threads_at_most_its_timeout():
    """A thread of this process updating (here waiting behind a stopped writer process's lock)
    has the writers' turn: another thread's update waits for it, at most its timeout, and says
    so; once the way is clear, the first writes the tree whole."""
    context = multiprocessing.get_context("spawn")
    tree = {"w": np.zeros(8 << 20, np.float32), "v": np.zeros(1024)}  # 32 MiB: updates take long
    shared = dlpack.share_tree(tree, writable=True)
    ours, theirs = context.Pipe()
    writer = context.Process(
        target=tree_workers.update_forever, args=(pickle.dumps(shared), theirs)
    )
    writer.start()
    theirs.close()
    ones = {"w": np.ones(8 << 20, np.float32), "v": np.ones(1024)}
    made: list[int] = []
    thread = threading.Thread(target=lambda: made.append(shared.update(ones)))
    try:
        stop_mid_update(shared, ours, writer)
        assert not shared._segment._updating_here
        thread.start()
        deadline = time.monotonic() + 120
        while not shared._segment._updating_here and time.monotonic() < deadline:
            time.sleep(0.001)
        assert shared._segment._updating_here
        with pytest.raises(
            TimeoutError,
            match="another thread of this process is updating this tree, and did not finish "
            "within 0.2 s",
        ):
            shared.update(tree, timeout=0.2)
        writer.kill()
        writer.join(60)
        thread.join(120)
        assert made == [shared.generation]
        assert not shared._segment._updating_here
        snapshot = shared.snapshot().tree
        assert np.asarray(snapshot["v"]).tolist() == [1.0] * 1024
        assert (np.asarray(snapshot["w"]) == 1).all()
    finally:
        if writer.is_alive():
            writer.kill()
        writer.join(60)
        if thread.is_alive():
            thread.join(120)


def test_a_lender_gone_before_the_receiver_opens_is_an_error_not_a_hang():
    context = multiprocessing.get_context("forkserver")
    ours, theirs = context.Pipe()
    lender = context.Process(target=tree_workers.produce_tree, args=(theirs, 2.0))
    lender.start()
    theirs.close()  # a lender that dies early is then an EOFError here, not a wait forever
    data = ours.recv_bytes()
    ours.send(None)
    lender.join(60)
    with pytest.raises(BufferError, match="can't be reached"):
        pickle.loads(data)


def test_a_lender_gone_after_the_receiver_opened_leaves_the_tree(peer):
    context = multiprocessing.get_context("forkserver")
    ours, theirs = context.Pipe()
    lender = context.Process(target=tree_workers.produce_tree, args=(theirs, 4.0))
    lender.start()
    theirs.close()
    data = ours.recv_bytes()
    peer.call("keep_tree", data)
    ours.send(None)
    lender.join(60)
    tree, generation = peer.call("kept_snapshot", 0)
    assert generation == 0 and tree[1][0][1][0] == np.full(1000, 4.0).tobytes()


def test_memory_that_cant_be_had_is_a_memory_error_before_allocating():
    script = textwrap.dedent(
        """
        import resource
        import numpy as np
        import dlpack

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        huge = np.broadcast_to(np.zeros(1, np.uint8), (2**40,))  # 1 TiB once copied
        try:
            dlpack.share_tree({"small": np.zeros(3), "huge": huge})
        except MemoryError as exc:
            print("MemoryError", "1.0 TiB" in str(exc))
        small = dlpack.share_tree({"w": np.ones(4)})
        print("after", small.snapshot().tree["w"].shape)
        """
    )
    result = run_python("-c", script, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == ["MemoryError True", "after (4,)", ""], result.stdout


def test_a_corrupted_segment_is_refused_where_it_opens(peer):
    import ctypes

    shared = dlpack.share_tree({"w": np.zeros(3)})
    # The segment starts a page before its one small leaf.
    address = np.asarray(shared.open()["w"]).__array_interface__["data"][0] - 4096
    ctypes.memset(address + 8, 9, 1)  # the format
    with pytest.raises(workers.PeerError, match="format 9, this dlpack reads format 1") as raised:
        peer.call("open_tree", pickle.dumps(shared))
    assert raised.value.type_name == "ValueError"


def test_forged_states_are_refused(peer):
    shared = dlpack.share_tree({"w": np.zeros(3)})
    _, (state,) = shared._segment.__reduce__()
    fields = _testing.share_state_fields(state)
    forged = _testing.share_state_pack({**fields, "offset": 64, "shape": [fields["shape"][0] - 64]})
    with pytest.raises(workers.PeerError, match="does not name the segment's bytes") as raised:
        peer.call("open_tree", pickle.dumps(_reduce_to(forged)))
    assert raised.value.type_name == "ValueError"


class _reduce_to:
    """Pickles as a tree whose segment's state is ``state``."""

    def __init__(self, state: bytes):
        self.state = state

    def __reduce__(self):
        from dlpack._sharing.tree import _open_tree

        return (_open_tree, (_Segment(self.state),))


class _Segment:
    def __init__(self, state: bytes):
        self.state = state

    def __reduce__(self):
        from dlpack._dlpack import _share_tree_rebuild

        return (_share_tree_rebuild, (self.state,))


@pytest.mark.skipif(
    os.geteuid() != 0, reason="running a process as another user takes root (setuid)"
)
def test_another_user_cant_open_a_tree():
    shared = dlpack.share_tree({"w": np.zeros(3)})
    kind, message = spawned(tree_workers.open_as, pickle.dumps(shared), NOBODY)
    assert kind == "BufferError", message
    assert f"runs as uid {os.geteuid()}" in message and f"as uid {NOBODY}" in message, message


# -- forks, Dask, interop ------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_forked_child_updates_with_a_lock_of_its_own():
    """A child forked from the lender shares its descriptors, and so their locks: it takes the
    writers' lock through a description of its own, so the two never write at once."""
    shared = dlpack.share_tree({"w": np.zeros(4)}, writable=True)
    tree_workers.inherited = shared
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def child(connection):
        made = tree_workers.inherited.update({"w": np.full(4, 3.0)})
        connection.send((made, tree_workers.inherited.snapshot().generation))

    process = context.Process(target=child, args=(theirs,))
    process.start()
    theirs.close()
    try:
        assert ours.poll(60) and ours.recv() == (1, 1)
    finally:
        process.join(60)
        tree_workers.inherited = None
    assert np.asarray(shared.snapshot().tree["w"]).tolist() == [3.0] * 4


def test_a_tree_goes_to_a_dask_worker():
    distributed = need("distributed")
    shared = dlpack.share_tree({"w": np.arange(10.0), "tag": "x"})
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as client:
        pid, total, tag = client.submit(tree_workers.dask_sum, shared, pure=False).result(
            timeout=120
        )
    assert pid != os.getpid() and total == 45.0 and tag == "x"


def test_interop_converts_a_shared_tree_as_its_snapshot():
    torch = need("torch")
    from dlpack.interop import to_numpy, to_torch

    shared = dlpack.share_tree({"w": np.arange(4, dtype=np.float32), "n": 3})
    shared.update({"w": np.full(4, 2.0, np.float32), "n": 3})
    as_torch = to_torch(shared)
    assert type(as_torch["w"]) is torch.Tensor and as_torch["n"] == 3
    assert as_torch["w"].tolist() == [2.0] * 4
    as_torch["w"][0] = 5.0  # its own memory: the tree is untouched
    assert np.asarray(shared.open()["w"])[0] == 2.0
    as_numpy = to_numpy(shared)
    assert as_numpy["w"].flags.writeable and as_numpy["w"].tolist() == [2.0] * 4
    with pytest.raises(BufferError, match="open"):
        to_numpy(shared, copy=False)
    jax = optional("jax")
    if jax is not None:
        from dlpack.interop import to_jax

        assert to_jax(shared)["w"].tolist() == [2.0] * 4


def test_share_tree_arguments():
    with pytest.raises(TypeError, match="writable"):
        dlpack.share_tree({"w": np.zeros(2)}, writable=1)
    with pytest.raises(TypeError, match="made by dlpack.share_tree"):
        dlpack.SharedTree()
    with pytest.raises(TypeError, match="doesn't pickle"):
        dlpack.share_tree({"w": np.zeros(2), "f": lambda: None})
    # numpy's own refusal, named where the leaf is.
    with pytest.raises(BufferError, match=r"^tree\['x'\]\[1\]: DLPack only supports") as raised:
        dlpack.share_tree({"x": [np.zeros(2), np.array(["a", "b"])]})
    assert type(raised.value.__cause__) is BufferError
    empty = dlpack.share_tree({"n": 1, "s": []})
    assert len(empty) == 0 and empty.snapshot() == ({"n": 1, "s": []}, 0)
    assert repr(empty) == "SharedTree(leaves=0, nbytes=0, generation=0, writable=True)"


def test_counts_stay_put_over_many_trees(own_peer):
    """Trees shared, sent and dropped: descriptors and mappings back where they were. A peer of
    its own: a trip to one that had imported torch takes 20 times as long."""
    peer = own_peer
    tree = {f"l{k}": np.full(256, float(k), np.float32) for k in range(50)}
    for _ in range(5):
        peer.call("snapshot_tree", pickle.dumps(dlpack.share_tree(tree)))
    gc.collect()
    before = workers.count_resources()
    there = peer.call("descriptors")
    for _ in range(200):
        assert peer.call("snapshot_tree", pickle.dumps(dlpack.share_tree(tree)))[1] == 0
    gc.collect()
    after = workers.count_resources()
    assert after[0] <= before[0] and after[1] <= before[1] + 2
    assert peer.call("descriptors") == there


def test_collections_counter_is_rebuilt():
    counter = collections.Counter(a=np.arange(3))
    shared = dlpack.share_tree(counter)
    assert type(shared.open()) is collections.Counter
    assert dataclasses.is_dataclass(dlpack.share_tree(tree_workers.Layer(np.ones(1), 1.0)).open())


class _Key(str):
    """A key of a str type of its own: its type travels with the tree's structure."""


def test_state_dicts_share_and_update_as_any_tree():
    """A dict of str keys and array leaves (a state dict): its structure made once per set of
    keys, its contiguous leaves copied whole, the others through the engine; every leaf's
    values, and the keys' order and types, as the walk gives them."""
    torch = need("torch")
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    big = np.arange((5 << 20) // 4, dtype=np.float32)  # past one memcpy: the engine's
    state = {
        "contiguous": base,
        "transposed": base.transpose(2, 0, 1),
        "big-endian": np.arange(5, dtype=">i4"),
        "torch": torch.arange(6, dtype=torch.float64).reshape(2, 3),
        "grad": torch.ones(3, requires_grad=True),
        "big": big,
    }
    shared = dlpack.share_tree(state)
    expected = {
        key: np.array(np.asarray(leaf.detach() if key == "grad" else leaf))
        for key, leaf in state.items()
    }
    for tree in (shared.open(), shared.snapshot().tree, pickle.loads(pickle.dumps(shared)).open()):
        assert list(tree) == list(state)
        for key, leaf in tree.items():
            got = np.asarray(leaf)
            assert got.dtype == expected[key].dtype and got.shape == expected[key].shape, key
            assert got.tolist() == expected[key].tolist(), key
    new = {
        key: np.array(np.asarray(v.detach() if key == "grad" else v)) + 1
        for key, v in state.items()
    }
    new["big-endian"] = new["big-endian"].astype("<i4")  # swapped back into the tree's order
    assert shared.update(new) == 1
    tree, generation = shared.snapshot()
    assert generation == 1
    for key, leaf in tree.items():
        assert np.asarray(leaf).tolist() == (expected[key] + 1).tolist(), key
    # Keys in another order, renamed, or of another str type: another structure.
    order = r"its array leaf 0 is at tree\['transposed'\], it was at tree\['contiguous'\]"
    swapped = dict(reversed(list(new.items())[:2]), **dict(list(new.items())[2:]))
    with pytest.raises(ValueError, match=order):
        shared.update(swapped)
    renamed = {("Contiguous" if key == "contiguous" else key): leaf for key, leaf in new.items()}
    with pytest.raises(ValueError, match="array leaf 0 is at tree\\['Contiguous'\\]"):
        shared.update(renamed)
    typed = {(_Key(key) if key == "big" else key): leaf for key, leaf in new.items()}
    with pytest.raises(ValueError, match="containers or non-array leaves differ"):
        shared.update(typed)
    assert shared.generation == 1
    # A tree of such keys keeps their type; many other state dicts later, the first updates.
    assert [type(key) for key in dlpack.share_tree(typed).open()][-1] is _Key
    for k in range(20):
        dlpack.share_tree({f"other{k}.{j}": np.zeros(1) for j in range(3)})
    assert shared.update(new) == 2
    # A dict holding anything but array leaves is walked.
    mixed = dlpack.share_tree({"w": np.ones(2), "step": 3})
    snap = mixed.snapshot().tree
    assert list(snap) == ["w", "step"] and snap["step"] == 3
    with pytest.raises(ValueError, match="non-array leaves differ"):
        mixed.update({"w": np.ones(2), "step": 4})


_BATCH_SCRIPT = """
import numpy as np, dlpack
sizes = [1, 1000, 3 << 20, 17, (5 << 20) + 3, 64, 1 << 20, 4099, 6 << 20, 2]
tree = {f"l{k}": np.arange(n, dtype=np.float32) * (k + 1) for k, n in enumerate(sizes)}
tree["t"] = np.arange(12.0).reshape(3, 4).T  # through the engine, beside the batch
shared = dlpack.share_tree(tree)
for generation in (1, 2):
    new = {key: leaf + generation for key, leaf in tree.items()}
    assert shared.update(new) == generation
    snap, made = shared.snapshot()
    assert made == generation
    for key, leaf in new.items():
        got = np.asarray(snap[key])
        assert got.dtype == leaf.dtype and np.array_equal(got, leaf), (key, generation)
print("ok")
"""


@pytest.mark.parametrize(
    "settings",
    [{}, {"DLPACK_COPY_THREADS": "2", "DLPACK_COPY_STORES": "streaming"}],
    ids=["measured", "two-threads-streaming"],
)
def test_leaves_copied_as_one_batch_hold_every_value(settings):
    """A tree's contiguous leaves are copied as one batch of their total size (past the engine's
    thresholds here, 60 MiB in all), cut between threads by bytes wherever a leaf ends: every
    leaf's values exact after share_tree and each update, as the engine measures its choice and
    with two threads and streaming stores fixed."""
    result = run_python("-c", _BATCH_SCRIPT, env=settings, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_state_dicts_snapshot_reuses_a_dict_only_when_nothing_holds_or_changed_it():
    """A state dict's snapshot is made in one call, and hands out again the dict (and leaves) of
    an earlier snapshot that nothing holds any more: never one still held, one whose leaf is
    held through an export, or one changed after it was handed out."""
    shared = dlpack.share_tree({"w": np.zeros(4), "b": np.zeros(2, np.int32)})

    def check(tree, generation):
        assert list(tree) == ["w", "b"]
        assert np.asarray(tree["w"]).tolist() == [float(generation)] * 4
        assert np.asarray(tree["b"]).tolist() == [generation] * 2

    def update(generation):
        shared.update({"w": np.full(4, float(generation)), "b": np.full(2, generation, np.int32)})

    first = shared.snapshot().tree
    first_id = id(first)
    held = shared.snapshot().tree  # held to the end: never written again
    del first
    update(1)
    reused = shared.snapshot().tree
    assert id(reused) == first_id  # the first dict, alive in the tree's keeping
    check(reused, 1)
    # Changed after it was handed out, then dropped: not handed out again.
    reused["w"] = "changed"
    del reused["b"]
    del reused
    exported = np.asarray(shared.snapshot().tree["w"])  # its leaf held through an export only
    for generation in range(2, 8):
        update(generation)
        tree = shared.snapshot().tree
        check(tree, generation)
        del tree
    check(held, 0)
    assert exported.tolist() == [1.0] * 4
    # A loop holding its last snapshot takes the dicts in turn.
    last = shared.snapshot().tree
    ids = set()
    for _ in range(6):
        last = shared.snapshot().tree
        ids.add(id(last))
        check(last, 7)
    assert len(ids) == 2


@pytest.mark.parametrize("change", ["swap values", "rename a key in place", "reorder keys"])
def test_a_state_dicts_snapshot_changed_as_counts_cant_tell_is_not_handed_out_again(change):
    """Changes that leave every leaf referenced as often and the dict as long (values swapped, a
    key renamed where it stands, keys reordered) still keep a dict from being handed out
    again."""
    shared = dlpack.share_tree({"w": np.zeros(3), "b": np.zeros(3)})
    shared.snapshot()  # the first finds the tree a state dict: the next ones are made whole
    tree = shared.snapshot().tree
    w, b = tree["w"], tree["b"]
    if change == "swap values":
        tree["w"], tree["b"] = b, w
    elif change == "rename a key in place":
        tree.clear()
        tree.update({"v": w, "b": b})
    else:
        tree["w"] = tree.pop("w")
    del tree, w, b
    for generation in range(1, 6):
        shared.update({"w": np.full(3, float(generation)), "b": np.full(3, -float(generation))})
        tree = shared.snapshot().tree
        assert list(tree) == ["w", "b"]
        assert np.asarray(tree["w"]).tolist() == [float(generation)] * 3
        assert np.asarray(tree["b"]).tolist() == [-float(generation)] * 3
        del tree
