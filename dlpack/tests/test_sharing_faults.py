"""Sharing under faults and forgery: memory that can't be had, read-only handles whose state was
altered, receivers that wrote into their copy-on-write view and share it on, producers that
are stopped while receivers open their handles, and receivers of another user or at their limit
of open files. Each case runs in child processes with limits or timeouts, so that a failing
implementation fails the test, not the machine.
"""

from __future__ import annotations

import errno
import mmap
import multiprocessing
import os
import pickle
import signal
import sys
import textwrap
import time

import pytest

import dlpack
from dlpack._sharing import handles

from . import _sharing_workers as workers
from ._helpers import need, run_python

np = need("numpy")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)

METHODS = ("fork", "spawn", "forkserver")


@pytest.fixture(scope="module")
def peer():
    serving = workers.Peer(multiprocessing.get_context("forkserver"))
    yield serving
    serving.close()


def test_memory_that_cant_be_had_is_a_memory_error():
    # Under an address-space limit: an implementation that allocates first fails with OSError
    # (mmap's ENOMEM) instead of taking the machine's memory.
    script = textwrap.dedent(
        """
        import resource
        import numpy as np
        import dlpack

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        huge = np.broadcast_to(np.zeros(1), (2**37,))  # 1 TiB once copied
        cases = {
            "share": lambda: dlpack.share(huge),
            "empty_shared": lambda: dlpack.empty_shared((2**40,), "uint8"),
            "copy": lambda: dlpack.asdlpack(huge).__dlpack__(copy=True),
        }
        for name, call in cases.items():
            try:
                call()
            except MemoryError as exc:
                text = str(exc)
                assert "1099511627776 bytes (1.0 TiB)" in text, text
                assert "can be had" in text, text
                assert any(s in text for s in ("MemAvailable", "cgroup", "RLIMIT_AS")), text
                print(name, "MemoryError")
            else:
                print(name, "no error")
        # What can be had still can.
        small = np.asarray(dlpack.empty_shared((1 << 22,), "float32"))
        small[:] = 1
        print("after", float(np.asarray(dlpack.asdlpack(dlpack.share(small)))[-1]))
        """
    )
    result = run_python("-c", script, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == [
        "share MemoryError",
        "empty_shared MemoryError",
        "copy MemoryError",
        "after 1.0",
        "",
    ], result.stdout


def test_a_read_only_handle_altered_to_writable_is_refused(peer):
    allocated = np.asarray(dlpack.empty_shared(64, "float64"))
    allocated[:] = np.arange(64.0)
    for memory in (np.arange(64.0), allocated):  # a fresh copy, and memory shared already
        fields = workers.fields_of(dlpack.share(memory))
        state = workers.pack(fields)
        forged = workers.pack({**fields, "writable": True})
        with pytest.raises(workers.PeerError, match="lent read-only") as raised:
            peer.call("rebuild", forged)
        assert raised.value.type_name == "ValueError"
        with pytest.raises(workers.PeerError, match="read-only"):
            peer.call("add_one", pickle.loads(pickle.dumps(dlpack.share(memory))))
        assert peer.call("rebuild", state)[0] == np.arange(64.0).tobytes()  # unaltered, it opens
        assert (memory == np.arange(64.0)).all()


def test_a_fresh_copy_is_sealed_against_writers():
    # Opened read-write by its path, as /proc allows whatever mode the descriptor lent has.
    handle = dlpack.share(np.arange(1024.0))
    fields = workers.fields_of(handle)  # pinned for a receiver, as by pickling
    lent = fields["segment"]["fd"]  # the number of the descriptor lent
    fd = os.open(f"/proc/self/fd/{lent}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        readable = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        assert np.frombuffer(readable, count=1024).tolist() == np.arange(1024.0).tolist()
        readable.close()
    finally:
        os.close(fd)
    assert (np.asarray(dlpack.asdlpack(handle)) == np.arange(1024.0)).all()
    # Opened here, its pin is taken back (no pin outlives the test).
    assert workers.rebuild(workers.pack(fields))[0] == np.arange(1024.0).tobytes()


def test_a_writable_handle_still_opens_writable(peer):
    array = np.asarray(dlpack.empty_shared(8, "float64"))
    peer.call("add_one", dlpack.share(array, writable=True))
    assert (array == 1).all()


def test_a_receivers_writes_travel_when_it_shares_again(peer):
    array = np.asarray(dlpack.empty_shared(3000, "float64"))
    array[:] = 1.0
    for write, expected in ((False, 1.0), (True, 7.0)):
        data = peer.call("relay", dlpack.share(array[1000:2000]), write)
        received = np.asarray(dlpack.asdlpack(pickle.loads(data)))
        assert received.shape == (1000,)
        assert (received == expected).all(), (write, received[:4])
        # Unwritten, the same segment travels on (no copy); written, a copy of what it saw.
        same = pickle.loads(data)._memory[1] == dlpack.share(array)._memory[1]
        assert same is (not write)
    assert (array == 1.0).all()  # the producer's memory is untouched


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
@pytest.mark.parametrize("method", METHODS)
def test_a_stopped_producer_never_stalls_its_receivers(method):
    count = 500  # several times what a socket buffer of release messages holds
    producing = multiprocessing.get_context(method)
    ours, theirs = producing.Pipe()
    producer = producing.Process(target=workers.produce_and_stop, args=(theirs, count), daemon=True)
    producer.start()
    theirs.close()
    try:
        pickles = ours.recv()
        os.kill(producer.pid, signal.SIGSTOP)
        receiving = multiprocessing.get_context("spawn")
        answer, answering = receiving.Pipe()
        receiver = receiving.Process(
            target=workers.open_all, args=(pickles, answering), daemon=True
        )
        receiver.start()
        answering.close()
        try:
            assert answer.poll(60), "opening handles of a stopped producer stalled"
            assert answer.recv() == 5.0 * count
        finally:
            receiver.kill()
            receiver.join()
    finally:
        os.kill(producer.pid, signal.SIGCONT)
        producer.kill()
        producer.join()


# -- receivers that can't open what a live producer sent ---------------------------------------

NOBODY = 65534  # the user (and group) "nobody"
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="running a process as another user takes root (setuid)"
)


def spawned(target, *args):
    """What ``target(*args, connection)`` sends from a spawned process (a fresh interpreter: it
    inherits none of this process's mappings)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=target, args=(*args, theirs), daemon=True)
    child.start()
    theirs.close()
    try:
        assert ours.poll(120), "the child did not answer"
        return ours.recv()
    finally:
        child.kill()
        child.join()
        ours.close()


def receive_under(pickles, *, uid=None, open_files=None):
    """What ``workers.open_under`` reports from a spawned receiver."""
    return spawned(workers.open_under_as, pickles, uid, open_files)


@pytest.fixture
def fresh_pickles():
    """``make(count)``: pickles of ``count`` handles made here, each of a fresh copy (a segment
    of its own). Afterwards this process opens them itself, which takes back the pins of those
    no receiver released (a later test counts pins)."""
    made = []

    def make(count):
        handles = [dlpack.share(np.full(4, float(i))) for i in range(count)]
        made.append((handles, [pickle.dumps(h) for h in handles]))
        return made[-1][1]

    yield make
    for _handles, pickles in made:
        for data in pickles:
            pickle.loads(data)


@as_root
def test_a_receiver_of_another_user_is_told_so(fresh_pickles):
    # This process, the producer, lives on: the receiver must hear that it runs as another
    # user, not that the producer exited.
    pickles = fresh_pickles(3)
    kind, code, message, opened, then = receive_under(pickles, uid=NOBODY)
    assert (kind, code, opened, then) == ("BufferError", None, 0, ["BufferError"] * 2), message
    assert f"(pid {os.getpid()}) runs as uid {os.geteuid()}" in message, message
    assert f"this process as uid {NOBODY}" in message, message
    assert "only in a process of the same user" in message, message
    assert "exited" not in message, message


def check_out_of_descriptors(outcome, limit, count):
    kind, code, message, opened, then = outcome
    assert (kind, code) == ("OSError", errno.EMFILE), message
    assert f"RLIMIT_NOFILE, soft limit {limit} (hard limit {limit}), is reached" in message, message
    # A descriptor for each segment kept mapped, and one for the producer (board or connection).
    assert f"{opened} segments are mapped here now" in message, message
    assert "release boards and connections hold 1." in message, message
    assert "exited" not in message, message
    assert 0 < opened < limit
    # Let go of, those arrays' descriptors serve the handles still to open.
    assert then == [float(i) for i in range(opened + 1, count)]


def test_a_receiver_at_its_limit_of_open_files_is_told_so(fresh_pickles):
    # Opened through /proc: each fresh copy a receiver keeps holds a descriptor.
    count, limit = 300, 64
    pickles = fresh_pickles(count)
    check_out_of_descriptors(receive_under(pickles, open_files=limit), limit, count)


@as_root
def test_a_receiver_at_its_limit_of_open_files_is_told_so_by_the_lender_too():
    # Producer and receiver of one user other than root: the producer is not dumpable (it
    # changed user), so /proc won't serve, and every segment is claimed from its lender.
    count, limit = 300, 64
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    producer = context.Process(target=workers.produce_as, args=(NOBODY, count, theirs), daemon=True)
    producer.start()
    theirs.close()
    try:
        assert ours.poll(120), "the producer did not answer"
        pickles = ours.recv()
        outcome = receive_under(pickles, uid=NOBODY, open_files=limit)
        ours.send(None)
    finally:
        producer.join(30)
        producer.kill()
        producer.join()
    check_out_of_descriptors(outcome, limit, count)


def test_a_receiver_gives_tokens_back_once_it_has_room_again(fresh_pickles):
    # Its segment takes the receiver's last descriptor: neither this process's release board
    # nor a connection to it can be had to give the token back. With room again (the next
    # handle), the board is had, and both tokens go back on it.
    pickles = fresh_pickles(2)
    pinned = workers.pinned()
    first, second, boards = spawned(workers.open_at_the_last_descriptor, pickles)
    assert (first, second, boards) == (0.0, 1.0, 1)
    assert workers.pinned() == pinned - 2


def test_a_lender_at_its_limit_of_open_files_refuses_and_waits():
    # Receivers that claim from its lender (here: the descriptor named is one /proc can't
    # open) are told why at once, and the lender does not spin on the connection it can't
    # take; with room again, it lends.
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    producer = context.Process(target=workers.lend_at_limit, args=(theirs, 64), daemon=True)
    producer.start()
    theirs.close()
    try:
        assert ours.poll(120), "the producer did not answer"
        states = ours.recv()
        with pytest.raises(BufferError) as raised:
            handles._rebuild(states[0])
        message = str(raised.value)
        assert f"(pid {producer.pid}) is at its limit of open files" in message, message
        assert "(RLIMIT_NOFILE, soft limit 64)" in message, message
        ours.send("wakeups")
        before = ours.recv()
        time.sleep(1)
        ours.send("wakeups")
        # Nothing to do but its look at its board each second (a lender that polls a listener
        # it can't accept from wakes without end).
        assert ours.recv() - before <= 3
        ours.send("room")
        assert ours.recv() == "done"
        assert workers.elements(handles._rebuild(states[1]))[0] == np.full(16, 3.0).tobytes()
        ours.send(None)
    finally:
        producer.join(30)
        producer.kill()
        producer.join()
        ours.close()


# -- errors alike on both sides ------------------------------------------------------------------


def test_a_producer_at_its_limit_of_open_files_is_told_so():
    limit = 64
    outcomes = spawned(workers.produce_at_limit, limit)
    assert outcomes.pop("then") == ("ok", True)
    calls = {"allocate shared memory": "memfd_create", "share this memory": "memfd_create"}
    for doing, (kind, code, message) in outcomes.items():
        assert (kind, code) == ("OSError", errno.EMFILE), (doing, message)
        call = calls.get(doing, "open")
        assert f"too many open files to {doing} ({call}: Too many open files)" in message, message
        assert f"RLIMIT_NOFILE, soft limit {limit} (hard limit " in message, message
        assert "Raise the soft limit" in message, message


def test_a_receiver_short_of_address_space_gets_a_memory_error():
    # As a producer short of memory gets one, naming the size and what can be had.
    array = np.asarray(dlpack.empty_shared(256 << 20, "uint8"))
    pickles = [pickle.dumps(dlpack.share(array)), pickle.dumps(dlpack.share(array, writable=True))]
    for kind, _code, message in spawned(workers.open_under_address_limit, pickles, 64 << 20):
        assert kind == "MemoryError", message
        assert "can't map 268435464 bytes (256.0 MiB) of shared memory" in message, message
        assert "can be had (RLIMIT_AS: limit " in message, message
