#!/usr/bin/env python
"""Round trip of an array to another process through ``dlpack.share``, and the usual alternatives.

The alternatives: pickle over a Pipe, torch.multiprocessing queues, multiprocessing.shared_memory.

Run from the repository root with the python that has ``dlpack-adapter`` (and torch) installed::

    python -P bench/bench_sharing.py                      # full run, about three minutes
    python -P bench/bench_sharing.py --quick              # fewer repeats, no 1 GiB
    python -P bench/bench_sharing.py --sizes 4KiB 64MiB   # only these sizes
    python -P bench/bench_sharing.py --pin-cpu 0          # every process on CPU 0

A float32 array of 4 KiB, 1 MiB, 64 MiB and 1 GiB goes to another process, which reads its first
element and sends it back as a float; a round trip is timed in the sender from just before the
send (or ``share``) until that reply arrives. Rows, the array not in shared memory beforehand:

- pickle over Pipe: ``conn.send(a)`` with the default pickle protocol (the bytes go in the
  pickle);
- pickle 5, out-of-band: ``pickle.dumps(a, protocol=5, buffer_callback=...)``, then the pickle and
  each buffer with ``conn.send_bytes(buffer.raw())``; the receiver ``pickle.loads(data,
  buffers=...)``;
- torch Queue, fresh tensor: ``torch.multiprocessing`` Queue.put of a tensor not in shared memory
  (a new clone for every message, made before the clock starts), which torch moves into shared
  memory as it is put;
- ours, fresh array: ``conn.send(dlpack.share(a))`` of a numpy array not in shared memory, which
  ``share`` copies into shared memory every time (into the segment of an earlier message, kept
  for reuse once the receiver has let go of it, as any loop sending arrays of one size would
  see); the receiver ``np.asarray(asdlpack(h))[0]``;

the array in shared memory already (made and filled once per size, off the clock):

- torch Queue, shared tensor: the same tensor every time, moved once with ``share_memory_()``;
- shared_memory, attached per message: a ``multiprocessing.shared_memory.SharedMemory``; only its
  name, shape and dtype cross, and the receiver attaches by name, reads and closes for every
  message (the honest per-message path: it can't know that the next message names the same
  segment);
- ours, empty_shared: the array allocated with ``np.asarray(dlpack.empty_shared(...))``, then
  ``conn.send(dlpack.share(a))``, which copies nothing;

and for reference:

- kept rows: the same two, but the receiver keeps the last message's array (for shared_memory,
  its attachment, reused when the next message names the same segment) until the next one has
  been read, so the segment is still mapped when the next handle arrives;
- Pipe floor: a float sent and sent back, the least a message over a Pipe costs here;
- ``dlpack.share()`` alone: the copy into shared memory that ours (fresh) pays, with no receiver.

Each row has one long-lived receiver process (forkserver for the Pipe rows, torch.multiprocessing's
spawn context for the torch rows). Every message sets the array's first element to a value of its
own, which the receiver must send back (so a broken path can't look fast). What each side lets go
of after a message (the sender's tensor or handle, the receiver's array, attachment or mapping) is
let go of after the reply, off the clock, before the next message.

The rows run one after the other, each its warm-up messages (not counted: at least 20, 3 and 2
at <= 1 MiB, 64 MiB and 1 GiB, and more for 0.2 s, up to 200), then its timed ones back to back:
1,000 at 4 KiB and 1 MiB; at 64 MiB and 1 GiB at least 30 and 8, and more while the row has taken
under a second, up to 1,000, so that the fast rows get a p99 at every size. That is the steady
state of a process sending one kind of message; rows taking turns would also time their
neighbours' wake (on a 2-CPU virtual machine, a 250 µs row timed right after a row of 30 ms
messages took nearly twice as long, even after a pause). The tables give the median and the 99th
percentile (nearest rank: with fewer than 100 samples that is the largest) in microseconds, and
each row's median against ours in its group. A row whose library is missing is skipped with a
printed reason.

A round trip of a small message is mostly two wake-ups, one in each process. Where the receiver
runs on another CPU, each is a wake-up of an idle CPU, which in a virtual machine can cost tens
of microseconds and varies with where the scheduler put the two processes: on a 2-CPU VM, the
same code's kept rows measured 0.8x to 2.3x of each other across runs. ``--pin-cpu N`` runs the
sender and every receiver on CPU N, so that a round trip is the two processes' own work and two
context switches on one CPU, and the rows compare the work each method does. (The copies that
``share`` makes of fresh arrays then have one CPU instead of all.)
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import multiprocessing
import os
import pickle
import platform
import re
import statistics
import struct
import sys
import time
from multiprocessing.shared_memory import SharedMemory
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))


def _guard_sys_path() -> None:
    """Keep bench/ (the script's own directory) from shadowing anything."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


_guard_sys_path()

import numpy as np  # noqa: E402

import dlpack  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_SIZES = (4 * KiB, MiB, 64 * MiB, GiB)
RELEASED = "released"
# The number of out-of-band buffers, ahead of the protocol 5 pickle.
BUFFER_COUNT = struct.Struct("<I")
# Every element but the first, which each message sets to an integer of its own (exact in
# float32 below 2**24).
FILL_VALUE = 1.0
TORCH_MISSING = ""


def import_torch():
    """torch, or None when it can't be imported (the reason goes to TORCH_MISSING). Imported only
    where needed: every receiver imports this file, and torch costs seconds and hundreds of MiB."""
    global TORCH_MISSING
    try:
        import torch
        import torch.multiprocessing  # registers torch's reductions with multiprocessing
    except ImportError as exc:  # pragma: no cover - depends on the environment
        TORCH_MISSING = f"torch not importable ({exc})"
        return None
    return torch


# -- receivers ----------------------------------------------------------------------------------


class Attachment:
    """A ``SharedMemory`` attached by name, and the array over it."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str):
        self.name = name
        self.segment = SharedMemory(name)
        self.array = np.ndarray(shape, dtype, buffer=self.segment.buf)

    def close(self) -> None:
        self.array = None  # an array over the buffer would make close() raise
        self.segment.close()


def read_float(conn, previous):
    return conn.recv(), None


def read_pickle(conn, previous):
    array = conn.recv()
    return float(array[0]), array


def read_pickle5(conn, previous):
    message = conn.recv_bytes()
    (count,) = BUFFER_COUNT.unpack_from(message)
    buffers = [conn.recv_bytes() for _ in range(count)]
    array = pickle.loads(memoryview(message)[BUFFER_COUNT.size :], buffers=buffers)
    return float(array[0]), array


def read_shared_memory(conn, previous):
    name, shape, dtype = conn.recv()
    if isinstance(previous, Attachment) and previous.name == name:
        attachment = previous  # a kept attachment of the same segment
    else:
        attachment = Attachment(name, shape, dtype)
    return float(attachment.array[0]), attachment


def read_ours(conn, previous):
    handle = conn.recv()  # unpickling claims and maps the segment, unless mapped here already
    array = np.asarray(dlpack.asdlpack(handle))
    return float(array[0]), (handle, array)


def read_torch(queue, previous):
    tensor = queue.get()
    if tensor is None:
        raise EOFError
    return float(tensor[0]), tensor


def receive(method_key: str, channel, replies) -> None:
    """A receiver process: read each message's first element, send it back, then let go of the
    message (or, for the kept rows, of the one before) and say so, off the sender's clock."""
    method = METHODS_BY_KEY[method_key]
    if method_key in TORCH_METHODS:
        import_torch()  # before "ready", so no timed message waits for the import
    replies.send("ready")
    kept = None
    while True:
        try:
            value, held = method.read(channel, kept)
        except EOFError:
            return
        replies.send(value)
        if method.keeps_last:
            held, kept = kept, held
        if isinstance(held, Attachment) and held is not kept:
            held.close()
        del held
        replies.send(RELEASED)


# -- the arrays ---------------------------------------------------------------------------------


class SizeArrays:
    """The arrays of one size, made off the clock, and shared by the rows that can share them
    (which keeps the 1 GiB run to a few GiB)."""

    def __init__(self, size: int):
        self.source = np.full(size // 4, FILL_VALUE, dtype=np.float32)  # written: pages exist
        self._empty_shared: np.ndarray | None = None
        self._shared_memory: SharedMemory | None = None

    def empty_shared(self) -> np.ndarray:
        if self._empty_shared is None:
            self._empty_shared = np.asarray(dlpack.empty_shared(self.source.shape, "float32"))
            self._empty_shared[...] = self.source
        return self._empty_shared

    def shared_memory(self) -> tuple[SharedMemory, np.ndarray]:
        if self._shared_memory is None:
            self._shared_memory = SharedMemory(create=True, size=self.source.nbytes)
            array = np.ndarray(self.source.shape, np.float32, buffer=self._shared_memory.buf)
            array[...] = self.source
        segment = self._shared_memory
        return segment, np.ndarray(self.source.shape, np.float32, buffer=segment.buf)

    def close(self) -> None:
        self.source = self._empty_shared = None
        if self._shared_memory is not None:
            self._shared_memory.close()
            self._shared_memory.unlink()


# -- senders ------------------------------------------------------------------------------------


class Method:
    """One way of sending: its receiver, what the sender prepares per size and per message (off
    the clock), and the send (on the clock, until the reply)."""

    key = ""
    label = ""
    anchor: str | None = None  # the row of ours this one is compared with
    has_receiver = True
    keeps_last = False  # the receiver keeps the last message until the next one has been read
    read = staticmethod(read_pickle)  # the receiver's side

    def start(self) -> None:
        pass

    def load(self, arrays: SizeArrays) -> None:
        """Per size, off the clock."""
        self.array = arrays.source

    def stage(self, value: float) -> None:
        """Per message, off the clock: set the first element to ``value``."""
        self.array[0] = value

    def send(self) -> None:
        raise NotImplementedError

    def answer(self) -> float:
        raise NotImplementedError

    def done(self) -> None:
        """Per message, off the clock: let go of what was sent, and wait for the receiver to."""

    def unload(self) -> None:
        self.array = None

    def stop(self) -> None:
        pass


class PipeMethod(Method):
    """Through a ``multiprocessing.Pipe`` (forkserver); replies come back on the same pipe."""

    context = multiprocessing.get_context("forkserver")

    def start(self) -> None:
        self.conn, child_end = self.context.Pipe()
        self.process = self.context.Process(
            target=receive, args=(self.key, child_end, child_end), daemon=True
        )
        self.process.start()
        child_end.close()  # so the receiver sees end of file when we close ours
        assert self.conn.recv() == "ready"

    def answer(self) -> float:
        return self.conn.recv()

    def done(self) -> None:
        assert self.conn.recv() == RELEASED

    def stop(self) -> None:
        self.conn.close()
        self.process.join(30)
        if self.process.is_alive():
            self.process.terminate()


class PipeFloor(PipeMethod):
    key = "floor"
    label = "Pipe floor: a float there and back"
    read = staticmethod(read_float)

    def load(self, arrays: SizeArrays) -> None:
        self.value = None

    def stage(self, value: float) -> None:
        self.value = value

    def send(self) -> None:
        self.conn.send(self.value)


class PickleOverPipe(PipeMethod):
    key = "pickle"
    label = "pickle over Pipe"
    anchor = "ours-fresh"

    def send(self) -> None:
        self.conn.send(self.array)


class Pickle5OutOfBand(PipeMethod):
    key = "pickle5"
    label = "pickle 5, out-of-band buffers, over Pipe"
    anchor = "ours-fresh"
    read = staticmethod(read_pickle5)

    def send(self) -> None:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(self.array, protocol=5, buffer_callback=buffers.append)
        self.conn.send_bytes(BUFFER_COUNT.pack(len(buffers)) + data)
        for buffer in buffers:
            self.conn.send_bytes(buffer.raw())


class OursFresh(PipeMethod):
    key = "ours-fresh"
    label = "ours, fresh array (share copies)"
    anchor = "ours-fresh"
    read = staticmethod(read_ours)

    def send(self) -> None:
        # Kept until the reply, so that unmapping the sender's copy happens off the clock.
        self.handle = dlpack.share(self.array)
        self.conn.send(self.handle)

    def done(self) -> None:
        self.handle = None
        super().done()


class ShareAlone(Method):
    key = "share-alone"
    label = "dlpack.share() alone, fresh array (nothing sent)"
    has_receiver = False

    def send(self) -> None:
        self.handle = dlpack.share(self.array)

    def answer(self) -> float:
        return float(np.from_dlpack(self.handle)[0])  # the copy's, so it must have been made

    def done(self) -> None:
        self.handle = None


class SharedMemoryByHand(PipeMethod):
    key = "shared-memory"
    label = "shared_memory, attached per message"
    anchor = "ours-shared"
    read = staticmethod(read_shared_memory)

    def load(self, arrays: SizeArrays) -> None:
        self.segment, self.array = arrays.shared_memory()

    def send(self) -> None:
        self.conn.send((self.segment.name, self.array.shape, self.array.dtype.str))

    def unload(self) -> None:
        self.segment = self.array = None


class OursShared(OursFresh):
    key = "ours-shared"
    label = "ours, empty_shared array"
    anchor = "ours-shared"

    def load(self, arrays: SizeArrays) -> None:
        self.array = arrays.empty_shared()


class SharedMemoryKept(SharedMemoryByHand):
    key = "shared-memory-kept"
    label = "shared_memory, receiver keeps the attachment"
    anchor = "ours-kept"
    keeps_last = True


class OursKept(OursShared):
    key = "ours-kept"
    label = "ours, empty_shared, receiver keeps the last array"
    anchor = "ours-kept"
    keeps_last = True


class TorchMethod(Method):
    """Through a ``torch.multiprocessing`` Queue (spawn); replies come back on a Pipe."""

    read = staticmethod(read_torch)

    def start(self) -> None:
        context = import_torch().multiprocessing.get_context("spawn")
        self.queue = context.Queue()
        self.replies, child_end = context.Pipe()
        self.process = context.Process(
            target=receive, args=(self.key, self.queue, child_end), daemon=True
        )
        self.process.start()
        child_end.close()
        assert self.replies.recv() == "ready"

    def send(self) -> None:
        self.queue.put(self.tensor)

    def answer(self) -> float:
        return self.replies.recv()

    def done(self) -> None:
        assert self.replies.recv() == RELEASED

    def stop(self) -> None:
        self.queue.put(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.terminate()
        self.queue.close()
        self.queue.join_thread()


class TorchFresh(TorchMethod):
    key = "torch-fresh"
    label = "torch.multiprocessing Queue, fresh tensor"
    anchor = "ours-fresh"

    def load(self, arrays: SizeArrays) -> None:
        self.source = import_torch().from_numpy(arrays.source)
        self.tensor = None

    def stage(self, value: float) -> None:
        # A new tensor every time: putting one moves its storage into shared memory for good.
        self.tensor = None
        self.tensor = self.source.clone()
        self.tensor[0] = value

    def done(self) -> None:
        self.tensor = None
        super().done()

    def unload(self) -> None:
        self.source = self.tensor = None


class TorchShared(TorchMethod):
    key = "torch-shared"
    label = "torch.multiprocessing Queue, share_memory_() tensor"
    anchor = "ours-shared"

    def load(self, arrays: SizeArrays) -> None:
        self.tensor = import_torch().from_numpy(arrays.source).clone().share_memory_()

    def stage(self, value: float) -> None:
        self.tensor[0] = value

    def unload(self) -> None:
        self.tensor = None


METHODS = [
    PipeFloor,
    PickleOverPipe,
    Pickle5OutOfBand,
    TorchFresh,
    OursFresh,
    ShareAlone,
    TorchShared,
    SharedMemoryByHand,
    OursShared,
    SharedMemoryKept,
    OursKept,
]
METHODS_BY_KEY = {cls.key: cls for cls in METHODS}
TORCH_METHODS = {TorchFresh.key, TorchShared.key}


# -- timing -------------------------------------------------------------------------------------


class Plan(NamedTuple):
    """How many messages a row sends at one size."""

    warmups: int  # at least this many warm-up messages, and more for WARMUP_S (up to 200)
    repeats: int  # at least this many timed messages,
    most: int  # and more while the row's timed messages have taken less than budget_s
    budget_s: float


WARMUP_S = 0.2
MOST_WARMUPS = 200


def plan(size: int, quick: bool) -> Plan:
    """Fewer timed messages at the big sizes, where the slow rows take seconds a message; the
    fast rows there still get enough for a p99."""
    most, budget_s = (100, 0.3) if quick else (1000, 1.0)
    if size <= MiB:
        return Plan(10, 100, most, budget_s) if quick else Plan(20, 1000, most, budget_s)
    if size <= 64 * MiB:
        return Plan(2, 10, most, budget_s) if quick else Plan(3, 30, most, budget_s)
    return Plan(1, 3, most, budget_s) if quick else Plan(2, 8, most, budget_s)


def round_trip(method: Method, value: float) -> float:
    """Seconds from the send to the reply, for a message whose first element is ``value``."""
    method.stage(value)
    start = time.perf_counter()
    method.send()
    answer = method.answer()
    elapsed = time.perf_counter() - start
    method.done()
    if answer != value:
        raise AssertionError(f"{method.label}: the receiver read {answer}, not {value}")
    return elapsed


def measure_row(method: Method, arrays: SizeArrays, plan: Plan, values) -> list[float]:
    """Seconds per round trip of ``method``: its warm-up messages, then its timed ones, back to
    back."""
    method.load(arrays)
    try:
        warmups, started = 0, time.perf_counter()
        while warmups < plan.warmups or (
            warmups < MOST_WARMUPS and time.perf_counter() - started < WARMUP_S
        ):
            round_trip(method, next(values))
            warmups += 1
        times: list[float] = []
        while len(times) < plan.repeats or (len(times) < plan.most and sum(times) < plan.budget_s):
            times.append(round_trip(method, next(values)))
    finally:
        method.unload()
    return times


def measure(methods: list[Method], size: int, plan: Plan, values) -> dict[str, list[float]]:
    """Seconds per round trip of each method at ``size`` bytes, one method after the other."""
    arrays = SizeArrays(size)
    try:
        return {method.key: measure_row(method, arrays, plan, values) for method in methods}
    finally:
        arrays.close()
        gc.collect()


def percentile_99(samples: list[float]) -> float:
    """Nearest rank: the largest sample when there are fewer than 100."""
    ordered = sorted(samples)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


# -- report -------------------------------------------------------------------------------------


def size_name(size: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size} B"


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(gib|mib|kib|b)?\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4KiB, 64MiB, 1GiB)")
    units = {"gib": GiB, "mib": MiB, "kib": KiB, "b": 1, None: 1}
    size = int(match[1]) * units[match[2]]
    if size <= 0 or size % 4:
        raise argparse.ArgumentTypeError(f"{text!r}: a float32 array needs a multiple of 4 bytes")
    return size


def microseconds(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:,.1f}" if us < 1000 else f"{us:,.0f}"


def print_table(size: int, methods: list[Method], times: dict[str, list[float]]) -> None:
    medians = {key: statistics.median(samples) for key, samples in times.items()}
    print(f"\n### {size_name(size)} ({size // 4:,} float32)\n")
    print("| method | median µs | p99 µs | samples | median / ours |")
    print("|---|---:|---:|---:|---:|")
    for method in methods:
        samples = times[method.key]
        p99 = microseconds(percentile_99(samples))
        if len(samples) < 100:
            p99 += " (max)"
        ratio = ""
        if method.anchor in medians and method.key != method.anchor:
            ratio = f"{medians[method.key] / medians[method.anchor]:.2f}×"
        print(
            f"| {method.label} | {microseconds(medians[method.key])} | {p99} | {len(samples)} | "
            f"{ratio} |"
        )


def check_goals(results: dict[int, dict[str, list[float]]]) -> None:
    """The goals' figures, from the medians."""

    def median(size: int, key: str) -> float | None:
        samples = results.get(size, {}).get(key)
        return statistics.median(samples) if samples else None

    def verdict(parts: list[str], met: list[bool]) -> str:
        if not met:
            return "not measured"
        return f"{', '.join(parts)}: {'met' if all(met) else 'MISSED'}"

    print("\nGoals, on the medians:")
    for key, reference, how, goal in (
        (OursShared.key, SharedMemoryByHand.key, "", 1.2),
        (OursKept.key, SharedMemoryKept.key, ", receiver keeps the last array", 1.5),
    ):
        parts, met = [], []
        for size in sorted(results):
            ours, theirs = median(size, key), median(size, reference)
            if ours is not None and theirs is not None:
                parts.append(f"{size_name(size)} {ours / theirs:.2f}×")
                met.append(ours / theirs <= goal)
        print(
            f"- ours (empty_shared{how}) / shared_memory ≤ {goal}× at every size: "
            f"{verdict(parts, met)}"
        )
    parts, met = [], []
    for size in (64 * MiB, GiB):
        ours, torch_fresh = median(size, OursFresh.key), median(size, TorchFresh.key)
        if ours is not None and torch_fresh is not None:
            parts.append(f"{size_name(size)} {torch_fresh / ours:.2f}× faster")
            met.append(torch_fresh / ours >= 1.5)
    print(
        "- ours, fresh, ≥ 1.5× faster than torch.multiprocessing (fresh tensor) at 64 MiB and "
        f"1 GiB: {verdict(parts, met)}"
    )
    ours, pickled = median(GiB, OursFresh.key), median(GiB, PickleOverPipe.key)
    parts, met = [], []
    if ours is not None and pickled is not None:
        parts, met = [f"{pickled / ours:.1f}× faster"], [pickled / ours >= 10]
    print(f"- ours, fresh, ≥ 10× faster than pickle over Pipe at 1 GiB: {verdict(parts, met)}")


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer messages (100 / 10 / 3, up to 100, instead of 1000 / 30 / 8, up to 1000), "
        "and no 1 GiB unless --sizes asks",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        metavar="SIZE",
        help="array sizes in bytes, or with KiB/MiB/GiB (default: 4KiB 1MiB 64MiB 1GiB)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS_BY_KEY),
        metavar="METHOD",
        help=f"only these rows: {', '.join(METHODS_BY_KEY)}",
    )
    parser.add_argument(
        "--pin-cpu",
        type=int,
        metavar="CPU",
        help="run the sender and every receiver on this one CPU (see the module's doc)",
    )
    args = parser.parse_args()
    if args.pin_cpu is not None:
        # Before any receiver starts: each inherits the sender's affinity.
        os.sched_setaffinity(0, {args.pin_cpu})
    sizes = args.sizes or [size for size in DEFAULT_SIZES if not (args.quick and size >= GiB)]
    chosen = [cls for cls in METHODS if args.methods is None or cls.key in args.methods]

    torch = import_torch() if any(cls.key in TORCH_METHODS for cls in chosen) else None
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"torch {torch.__version__ if torch else _dist_version('torch')}, "
        f"dlpack {dlpack.__version__}, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}, {platform.system()} {platform.release()}, "
        f"default pickle protocol {pickle.DEFAULT_PROTOCOL}"
        + (f", every process on CPU {args.pin_cpu}" if args.pin_cpu is not None else "")
    )
    if torch is None and TORCH_MISSING:
        print(f"skipped the torch rows: {TORCH_MISSING}")
        chosen = [cls for cls in chosen if cls.key not in TORCH_METHODS]

    methods: list[Method] = []
    results: dict[int, dict[str, list[float]]] = {}
    try:
        for cls in chosen:
            method = cls()
            try:
                method.start()
            except Exception as exc:  # a row that can't run here is skipped, not fatal
                print(f"skipped {cls.label!r}: {type(exc).__name__}: {exc}")
                continue
            methods.append(method)
        values = (float(n) for n in itertools.count(2))
        for size in sizes:
            results[size] = measure(methods, size, plan(size, args.quick), values)
            print_table(size, methods, results[size])
            sys.stdout.flush()
    finally:
        for method in methods:
            method.stop()

    print(
        "\nRound trip: from just before the send until the receiver's reply (the first element) "
        "arrives. 'median / ours': against ours in the row's group: fresh, empty_shared, or "
        "empty_shared with the receiver keeping the last array (above 1: ours is faster). p99 is "
        "the nearest rank; '(max)': fewer than 100 samples, so it is the largest."
    )
    check_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
