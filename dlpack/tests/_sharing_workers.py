"""What the processes of ``test_sharing`` run: importable without pytest (spawn and forkserver
children import this module, not the test module), with numpy only.

A :class:`Peer` is a process that runs the named functions of this module on request, so that
one process serves many cases; the others are plain process targets.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import gc
import os
import pickle
import resource
import traceback

import numpy as np

import dlpack
from dlpack._dlpack import _testing
from dlpack._sharing import handles

from . import _c_api


def live_segments() -> int:
    """How many segments this process maps."""
    return _testing.share_counts()[0]


def pooled() -> int:
    """How many segments this process keeps for reuse."""
    return _testing.share_counts()[1]


def pinned() -> int:
    """How many handles this process lent that no receiver has released yet."""
    return _testing.share_counts()[2]


def serve(connection) -> None:
    """A peer's loop: ``(name, args)`` in, ``("ok", result)`` or ``("error", type name,
    message)`` out, until ``None`` arrives."""
    while True:
        request = connection.recv()
        if request is None:
            return
        name, args = request
        del request  # what arrived is let go of before the answer (the test may count on it)
        try:
            result = globals()[name](*args)
            del args
            gc.collect()
            connection.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
            del args
            connection.send(("error", type(exc).__name__, f"{exc}\n{traceback.format_exc()}"))


class PeerError(Exception):
    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


class Peer:
    """A process of start method ``method`` running :func:`serve`."""

    def __init__(self, context):
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs,), daemon=True)
        self.process.start()
        theirs.close()

    def call(self, name: str, *args):
        self.connection.send((name, args))
        outcome = self.connection.recv()
        if outcome[0] == "error":
            raise PeerError(outcome[1], outcome[2])
        return outcome[1]

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.connection.send(None)
            except OSError:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


# -- what peers run -----------------------------------------------------------------------------

# Views opened by ``open_and_keep``, alive until ``drop_all``.
_kept: list = []


def elements(obj) -> tuple:
    """What a process sees of ``obj`` through ``asdlpack``: the elements' bytes in C order,
    shape, dtype name, read-only."""
    view = dlpack.asdlpack(obj)
    # numpy reads the object's own protocols (the array interface where the buffer protocol has
    # no format for the type: bfloat16, float8)
    return np.asarray(view).tobytes(), view.shape, str(view.dtype), view.readonly


def numpy_elements(array: np.ndarray) -> tuple:
    """What ``elements`` must find for the numpy ``array``, as numpy itself says it (not through
    ``asdlpack``): its bytes in C order, shape and dtype name."""
    return np.ascontiguousarray(array).tobytes(), array.shape, str(array.dtype)


def read(handle) -> tuple:
    return elements(handle)


def read_pickle(data: bytes) -> tuple:
    """Unpickle here (the test sends a handle's pickle as bytes, to open it more than once)."""
    return elements(pickle.loads(data))


def open_and_keep(data: bytes) -> tuple[int, int]:
    """Open a pickled handle and keep it open: (address of its first element, segments mapped)."""
    view = dlpack.asdlpack(pickle.loads(data))
    _kept.append(view)
    return view.data_ptr, live_segments()


def read_kept(index: int) -> tuple:
    return elements(_kept[index])


def drop_all() -> int:
    _kept.clear()
    gc.collect()
    return live_segments()


def first_element(handle) -> float:
    return float(np.asarray(dlpack.asdlpack(handle)).reshape(-1)[0])


def add_one(handle) -> None:
    """Write through a writable handle: every element plus one."""
    array = np.asarray(dlpack.asdlpack(handle))
    array += 1


def scribble(handle) -> bytes:
    """Write over a read-only handle's memory from here anyway (as a consumer that ignores the
    read-only flag could): returns what this process then reads there."""
    view = dlpack.asdlpack(handle)
    ctypes.memset(view.data_ptr, 0x7F, view.nbytes)
    return ctypes.string_at(view.data_ptr, view.nbytes)


def rebuild(state) -> tuple:
    """Unpickle a handle's (perhaps altered) state, as pickle would."""
    return elements(handles._rebuild(state))


def fields_of(handle) -> dict:
    """The fields of the state pickling ``handle`` carries (its segment pinned for a receiver,
    as by pickling), to alter and ``pack``."""
    rebuild, (state,) = handle.__reduce__()
    assert rebuild is handles._rebuild
    return _testing.share_state_fields(state)


def pack(fields: dict) -> bytes:
    """The state ``fields`` spell, whatever they say."""
    return _testing.share_state_pack(fields)


# -- the runtime's C API, as a C extension calls it (as test_c_api drives it) -----------------


_MUTABLE = _c_api.DLPACK_ADAPTER_VIEW_MUTABLE


def c_api_views(objects: list, flags: list[int]) -> list[str]:
    """Borrow views of ``objects`` one after another through the runtime's C API, with
    ``flags``, holding each while the next is asked for: "granted", or the error's type and
    message; all given back after."""
    api = _c_api.table()
    held, outcomes = [], []
    try:
        for obj, flag in zip(objects, flags, strict=True):
            view = _c_api.DLPackAdapterView()
            try:
                api.view(obj, flag, ctypes.addressof(view))
            except Exception as exc:  # noqa: BLE001 - the test checks what it was
                outcomes.append(f"{type(exc).__name__}: {exc}")
            else:
                held.append(view)
                outcomes.append("granted")
    finally:
        for view in held:
            api.release_view(ctypes.addressof(view))
    return outcomes


def one_memory(first: bytes, second: bytes) -> dict:
    """Open two pickled handles of one segment, one read-only and one writable (in this order),
    keeping both: what this process sees of them."""
    opened = [dlpack.asdlpack(pickle.loads(first)), dlpack.asdlpack(pickle.loads(second))]
    _kept.extend(opened)
    read_only, writable = sorted(opened, key=lambda view: not view.readonly)
    values = np.asarray(read_only)
    np.asarray(writable)[0] = 42.0
    try:
        values[1] = 1.0
        numpy_writes = "written"
    except ValueError as exc:
        numpy_writes = str(exc)
    return {
        "readonly": (read_only.readonly, writable.readonly),
        "same address": read_only.data_ptr == writable.data_ptr,
        "numpy": (values.flags.writeable, numpy_writes),
        "seen through the read-only view": float(values[0]),
        "shared then mutable": c_api_views([read_only, writable], [0, _MUTABLE]),
        "mutable then shared": c_api_views([writable, read_only], [_MUTABLE, 0]),
        "segments": live_segments(),
        "mappings": memfd_mappings(),
    }


def write_then_open(read_only: bytes, writable: bytes) -> None:
    """Open a read-only handle, write into its memory anyway (as torch does, whatever the
    flag), keep it, and open a writable handle of the same segment."""
    view = dlpack.asdlpack(pickle.loads(read_only))
    _kept.append(view)
    ctypes.memset(view.data_ptr, 0x7F, 8)
    _kept.append(dlpack.asdlpack(pickle.loads(writable)))


def count_resources() -> tuple[int, int]:
    """(open file descriptors, memory mappings) of this process."""
    gc.collect()
    with open("/proc/self/maps") as maps:
        mappings = sum(1 for _ in maps)
    return len(os.listdir("/proc/self/fd")), mappings


def descriptor_kinds() -> collections.Counter:
    """This process's open file descriptors by kind: "socket", "pipe", "memfd", ... (the
    memfd kind counts dlpack segments only)."""
    gc.collect()
    kinds: collections.Counter = collections.Counter()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            continue
        kinds["memfd" if "memfd:dlpack-share" in target else target.split(":")[0]] += 1
    return kinds


def memfd_mappings() -> int:
    """Mappings of dlpack segments in this process."""
    with open("/proc/self/maps") as maps:
        return sum("memfd:dlpack-share" in line for line in maps)


class Holding:
    """A queue-like stand-in whose ``get()`` returns the handle it was made with (to pass a
    handle as a process argument, pickled as the process starts)."""

    def __init__(self, handle):
        self.handle = handle

    def get(self):
        return self.handle


# -- process targets ----------------------------------------------------------------------------


def echo_first_element(queue_in, queue_out) -> None:
    """Read the first element of the handle that arrives on ``queue_in``, reply on ``queue_out``."""
    queue_out.put(first_element(queue_in.get()))


def echo_first_element_pipe(connection) -> None:
    connection.send(first_element(connection.recv()))


def cycles(connection) -> None:
    """Open every handle that arrives, read it, reply, drop it; ``None`` ends."""
    while True:
        handle = connection.recv()
        if handle is None:
            connection.send(count_resources())
            return
        if handle == "resources":
            connection.send(count_resources())
            continue
        connection.send(float(np.asarray(dlpack.asdlpack(handle))[0]))
        del handle


# What a forked child inherits (see test_a_forked_child_keeps_what_it_inherited).
inherited = None


def read_inherited_later(connection) -> None:
    """A forked child holding the handle it inherited: read it when asked (the parent
    meanwhile drops it and shares other data)."""
    connection.send("ready")
    connection.recv()
    connection.send(first_element(inherited))


def produce(connection, count: int, fill: float) -> None:
    """A producer: share a ``count``-element array of ``fill`` in shared memory, send the pickled
    handle, wait for the word to exit, and exit."""
    array = np.asarray(dlpack.empty_shared(count, "float64"))
    array[:] = fill
    connection.send_bytes(pickle.dumps(dlpack.share(array)))
    connection.recv()


# -- what Dask workers run ----------------------------------------------------------------------


def doubled_with_numpy(obj) -> dlpack.DLPackObject:
    """On a worker: twice what arrived (a DLPackObject), as a DLPackObject to send back."""
    return dlpack.asdlpack(np.from_dlpack(obj) * 2)


def plus_one_with_torch(obj) -> dlpack.DLPackObject:
    import torch

    return dlpack.asdlpack(torch.from_dlpack(obj) + 1)


def pid_and_sum(obj) -> tuple[int, float]:
    return os.getpid(), float(np.from_dlpack(obj).sum())


def relay(handle, write: bool) -> bytes:
    """In a peer: open ``handle`` (read-only), write 7s over it if asked (as torch does,
    whatever the read-only flag), and share it on: the pickle of the new handle."""
    view = dlpack.asdlpack(handle)
    if write:
        values = np.full(view.shape, 7, dtype=view.dtype)
        ctypes.memmove(view.data_ptr, values.ctypes.data, values.nbytes)
    return pickle.dumps(dlpack.share(view))


def produce_and_stop(connection, count: int) -> None:
    """Send ``count`` pickled handles, then wait to be stopped (and killed)."""
    array = np.asarray(dlpack.empty_shared(16, "float64"))
    array[:] = 5.0
    handles = [dlpack.share(array[i % 16 :]) for i in range(count)]
    connection.send([pickle.dumps(h) for h in handles])
    connection.recv()


def open_all(pickles: list[bytes], connection) -> None:
    total = 0.0
    for data in pickles:
        total += float(np.asarray(dlpack.asdlpack(pickle.loads(data)))[0])
    connection.send(total)


def become(uid: int | None, open_files: int | None) -> None:
    """Run as user ``uid`` (its group too) and with at most ``open_files`` descriptors from
    now on, where given (a process of another user, or one at its limit of open files)."""
    if uid is not None:
        # What the process imports later must be imported now: the installed package may lie
        # where the other user can't read it (CI's environment, under /root).
        import dlpack.sharing  # noqa: F401

        dlpack.share, dlpack.SharedHandle, dlpack.empty_shared  # noqa: B018 - bound here
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if open_files is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))


def open_under(pickles: list[bytes], connection, uid: int | None, open_files: int | None) -> None:
    """Open every pickled handle, keeping the arrays, as ``become`` says. Sends ``("ok",
    count)``, or the first failure as (type name, errno, message, handles opened before it,
    then): then, what was kept let go of, each handle not yet opened opened and let go of at
    once: its first element, or the type name of its error."""
    become(uid, open_files)
    kept = []
    for data in pickles:
        try:
            kept.append(np.asarray(dlpack.asdlpack(pickle.loads(data))))
        except Exception as exc:  # noqa: BLE001 - the test checks what it was
            failure = (type(exc).__name__, getattr(exc, "errno", None), str(exc), len(kept))
            break
    else:
        connection.send(("ok", len(kept)))
        return
    kept.clear()
    gc.collect()
    then: list[float | str] = []
    for data in pickles[failure[3] + 1 :]:
        try:
            then.append(first_element(pickle.loads(data)))
        except Exception as exc:  # noqa: BLE001 - the test checks what it was
            then.append(type(exc).__name__)
    connection.send((*failure, then))


def open_under_as(pickles: list[bytes], uid: int | None, open_files: int | None, connection):
    """``open_under``, its connection last."""
    open_under(pickles, connection, uid, open_files)


def produce_as(uid: int, count: int, connection) -> None:
    """A producer running as user ``uid``: send the pickled handles of ``count`` fresh copies,
    then wait for the word to exit."""
    become(uid, None)
    handles = [dlpack.share(np.full(4, float(i))) for i in range(count)]
    connection.send([pickle.dumps(h) for h in handles])
    connection.recv()


def mapped_file(address: int) -> tuple[str, str, bool] | None:
    """The file this process maps at ``address``: (device, inode, whether the mapping is
    shared), from /proc/self/maps; None for anonymous memory or an address nothing maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms, _, device, inode = line.split()[:5]
            low, high = (int(end, 16) for end in span.split("-"))
            if low <= address < high:
                return None if inode == "0" else (device, inode, perms.endswith("s"))
    return None


def where_and_doubled(obj) -> tuple[str, tuple[str, str, bool] | None, dlpack.DLPackObject]:
    """What arrived (its type name), the file its memory is mapped from here, and its values
    doubled (a new array, as a DLPackObject)."""
    return type(obj).__name__, mapped_file(obj.data_ptr), doubled_with_numpy(obj)


def outcome(call) -> tuple:
    """``("ok", result)``, or the failure as (type name, errno, message)."""
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        return (type(exc).__name__, getattr(exc, "errno", None), str(exc))


def mapped_bytes() -> int:
    """Bytes this process maps (its address space, as RLIMIT_AS counts it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def open_under_address_limit(pickles: list[bytes], headroom: int, connection) -> None:
    """Open each pickled handle with only ``headroom`` bytes of address space left (RLIMIT_AS):
    what each open gave, as :func:`outcome` says it."""
    limit = mapped_bytes() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    connection.send([outcome(lambda d=data: first_element(pickle.loads(d))) for data in pickles])


def fill_descriptors(limit: int) -> list[int]:
    """Lower the soft limit of open files to ``limit`` and open descriptors until no more can
    be: the ones opened (close them to have room again)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    filler = []
    try:
        while True:
            filler.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        assert exc.errno == errno.EMFILE, exc
    return filler


def lend_at_limit(connection, limit: int) -> None:
    """A producer at its limit of open files, its lender started: sends the states of two
    handles of an array of 3.0s whose descriptor number is forged to one no process has, so
    that receivers claim the segment from the lender instead of opening it through /proc.
    Then, on request: ``"wakeups"`` (its lender thread's), ``"room"`` (close the filling
    descriptors), ``None`` (exit)."""
    array = np.asarray(dlpack.empty_shared(16, "float64"))
    array[:] = 3.0
    states = []
    for _ in range(2):
        fields = fields_of(dlpack.share(array))
        fields["segment"]["fd"] = 1 << 20
        states.append(pack(fields))
    filler = fill_descriptors(limit)
    connection.send(states)
    while (request := connection.recv()) is not None:
        if request == "wakeups":
            connection.send(_testing.share_counts()[3])
        elif request == "room":
            for fd in filler:
                os.close(fd)
            filler.clear()
            connection.send("done")


def open_at_the_last_descriptor(pickles: list[bytes], connection) -> None:
    """Open the first of ``pickles`` (fresh copies of one producer) with one descriptor left
    (its segment takes it: neither its producer's release board nor a connection to it can be
    had, to release its token); then with room again, the second. Sends both first elements,
    and how many release boards this process holds then."""
    # What opening a handle reads once per process (modules, the boot id), read now.
    first_element(pickle.loads(pickle.dumps(dlpack.share(np.zeros(4)))))
    own_board = _boards()  # its own lender's
    filler = fill_descriptors(len(os.listdir("/proc/self/fd")) + 8)
    os.close(filler.pop())
    first = first_element(pickle.loads(pickles[0]))
    for fd in filler:
        os.close(fd)
    second = first_element(pickle.loads(pickles[1]))
    connection.send((first, second, _boards() - own_board))


def _boards() -> int:
    """How many lenders' release boards this process holds."""
    boards = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            boards += "dlpack-lender-board" in os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    return boards


def produce_at_limit(limit: int, connection) -> None:
    """A producer at its limit of open files (``limit``), its lender started and an
    ``empty_shared`` array kept: what allocating, sharing (a fresh copy) and pickling a handle
    each gave, as :func:`outcome` says it, and then, with room again, the last."""
    kept = np.asarray(dlpack.empty_shared(4, "float64"))
    pickle.dumps(dlpack.share(np.zeros(4)))  # the lender runs
    filler = fill_descriptors(limit)
    cases = {
        "allocate shared memory": lambda: dlpack.empty_shared(4, "float64"),
        "share this memory": lambda: dlpack.share(np.arange(4.0)),
        "pickle this handle": lambda: pickle.dumps(dlpack.share(kept)),
    }
    outcomes = {doing: outcome(call) for doing, call in cases.items()}
    for fd in filler:
        os.close(fd)
    outcomes["then"] = outcome(lambda: len(pickle.dumps(dlpack.share(kept))) > 0)
    connection.send(outcomes)
