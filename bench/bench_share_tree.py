#!/usr/bin/env python
"""A whole pytree shared with another process through ``dlpack.share_tree``: the five goals.

Run from the repository root with the python that has ``dlpack-adapter`` (and torch) installed::

    python -P bench/bench_share_tree.py             # full run, a few minutes, about 5 GiB
    python -P bench/bench_share_tree.py --quick     # fewer repeats, 256 MiB instead of 1 GiB
    python -P bench/bench_share_tree.py --pin-cpu 0 # every process on CPU 0

The rows, in one run:

1. A dict of 1,000 float32[1024] leaves (4 MiB; numpy leaves, and torch tensors as the issue
   measured) goes to another process: ``share_tree`` + ``pickle.dumps`` in the sender, the bytes
   over a Pipe, ``pickle.loads`` + ``open()`` in a receiver (a long-lived forkserver process),
   which reads the first element of the first leaf and sends it back as a float. A round trip
   is timed in the sender from just before ``share_tree`` until the reply. After the reply, off
   the clock, both sides let go of the tree (the receiver says so), so the next ``share_tree``
   writes into the segment of the one before, kept for reuse, as a loop sharing trees of one
   size does. Each message sets that element to a value of its own, which the receiver must
   send back. For reference, the same tree sent as one ``dlpack.share`` handle per leaf (a
   list of 1,000 handles, all opened), and in the full run torch's own way (each tensor, a new
   one every message, ``share_memory_()``, the dict pickled with ``ForkingPickler``, loaded).
2. Descriptors: what the sender and the receiver hold more once a tree of row 1 is shared and
   opened (the sender's lender, and the receiver's connection to it, already running: they
   serve every tree of a process), and the same for one handle per leaf.
3. A tree of 1 GiB in 200 float32 leaves (256 MiB in the quick run): ``share_tree`` against one
   ``np.copyto`` of as many bytes into an existing array (best of the repeats, interleaved):
   into memory kept from an earlier tree of the same size (``share_tree``'s steady state), and
   into new memory (the first tree of its size, its pages faulted in), beside numpy's own copy
   into new memory (``np.array``) for scale, and ``np.copyto`` of the same bytes leaf by leaf
   (200 copies: glibc's memcpy streams only copies past its non-temporal threshold, which one
   copy of all the bytes may pass where each leaf's doesn't).
4. ``update`` of that tree with new values against the same ``np.copyto``.
5. ``snapshot`` of row 1's tree in a receiver (a read-only one, through its own read-only
   mapping), holding the last snapshot while it takes the next (``snap = tree.snapshot()``),
   against ``np.copyto`` of 4 MiB there, and against ``np.copyto`` into two targets in turn
   (a loop holding its last snapshot writes into the buffer before last).

Times are wall-clock (``time.perf_counter``, or ``timeit`` through ``_bench_timing``). On a
machine shared with other work the figures move from run to run; the ratios of rows 3-5 are
measured with the two sides' repeats interleaved, so that both see the same noise. A round trip
of row 1 waits for the receiver to get a CPU, which on a loaded machine can take longer than all
the work: row 1 also gives the CPU time both processes spent on it (``time.process_time``).
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import os
import pickle
import platform
import runpy
import statistics
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))


def _guard_sys_path() -> None:
    """Keep bench/ (the script's own directory) from shadowing anything."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


_guard_sys_path()

import numpy as np  # noqa: E402

import dlpack  # noqa: E402
from dlpack._sharing import process as sharing_process  # noqa: E402

TIMING = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
LEAVES, LEAF = 1000, 1024
RELEASED = "released"


def small_tree(library: str) -> dict:
    """Row 1's tree: 1,000 float32[1024] leaves, named as a model's weights are."""
    if library == "torch":
        import torch

        return {f"layer{k}.weight": torch.ones(LEAF) for k in range(LEAVES)}
    return {f"layer{k}.weight": np.ones(LEAF, np.float32) for k in range(LEAVES)}


def first_leaf(tree: dict):
    return tree["layer0.weight"]


def open_files() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


# -- the receiver -------------------------------------------------------------------------------


def receive(connection) -> None:
    """Row 1's receiver: for each message, open it, send back the first element of the first
    leaf, then let go of it and say so (off the sender's clock)."""
    while True:
        kind = connection.recv()
        if kind is None:
            return
        if kind == "count":  # descriptors held now
            connection.send(open_files())
            continue
        cpu = time.process_time()  # waiting takes none: this is the receiver's work
        data = connection.recv_bytes()
        if kind == "tree":
            tree = pickle.loads(data).open()
            value = float(np.asarray(first_leaf(tree))[0])
        elif kind == "handles":
            handles = pickle.loads(data)
            tree = {key: dlpack.asdlpack(handle) for key, handle in handles.items()}
            value = float(np.asarray(first_leaf(tree))[0])
        elif kind == "keep tree":  # opened and kept (for the descriptor counts)
            receive.kept.append(pickle.loads(data))
            receive.kept[-1].open()
            connection.send(open_files())
            continue
        else:  # torch's own: ForkingPickler
            import torch  # noqa: F401 - registers torch's reductions

            tree = pickle.loads(data)
            value = float(first_leaf(tree)[0])
        connection.send((value, time.process_time() - cpu))
        del tree
        gc.collect()
        connection.send(RELEASED)


receive.kept = []


def snapshot_rows(data: bytes, repeats: int, seconds: float, connection) -> None:
    """Row 5, in a receiver: ``snapshot`` of the tree against ``np.copyto`` of its bytes."""
    shared = pickle.loads(data)
    source = np.ones(LEAVES * LEAF, np.float32)
    target = np.empty_like(source)
    other = np.empty_like(source)
    scope = {
        "shared": shared,
        "np": np,
        "source": source,
        "target": target,
        "other": other,
        "snap": None,
    }
    timers = {
        "snapshot": timeit.Timer("snap = shared.snapshot()", globals=scope),
        "copyto": timeit.Timer("np.copyto(target, source)", globals=scope),
        # What a loop holding its last snapshot writes into: the buffer before last, which
        # cache has less of than the one just written.
        "copyto, two targets in turn": timeit.Timer(
            "np.copyto(target, source); np.copyto(other, source)", globals=scope
        ),
    }
    _, per_call = TIMING["interleaved"](timers, repeats, seconds)
    per_call["copyto, two targets in turn"] = [
        seconds / 2 for seconds in per_call["copyto, two targets in turn"]
    ]
    connection.send(per_call)


# -- row 1 --------------------------------------------------------------------------------------


class Receiver:
    def __init__(self):
        context = multiprocessing.get_context("forkserver")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=receive, args=(theirs,), daemon=True)
        self.process.start()
        theirs.close()

    def send(self, kind: str, data: bytes) -> float:
        self.connection.send(kind)
        self.connection.send_bytes(data)
        return self.connection.recv()

    def released(self) -> None:
        if self.connection.recv() != RELEASED:
            raise AssertionError("the receiver did not let go")

    def count(self) -> int:
        self.connection.send("count")
        return self.connection.recv()

    def close(self) -> None:
        self.connection.send(None)
        self.process.join(30)


def round_trips(
    receiver: Receiver, way: str, tree: dict, count: int, warmups: int
) -> tuple[list[float], list[float]]:
    """Seconds per round trip of ``tree`` sent the ``way`` row 1 names, and the CPU time both
    processes spent on each (the sender's over the round trip, the receiver's from the message's
    arrival to its reply: time waiting for a CPU is in the first, not in the second)."""
    times, cpu_times = [], []
    for k in range(warmups + count):
        if way == "torch":  # fresh tensors each time, as a learner's new weights are
            tree = {key: tensor.clone() for key, tensor in tree.items()}
        value = float(k + 2)
        first_leaf(tree)[0] = value
        cpu = time.process_time()
        start = time.perf_counter()
        if way == "tree":
            data = pickle.dumps(dlpack.share_tree(tree))
        elif way == "handles":
            data = pickle.dumps({key: dlpack.share(leaf) for key, leaf in tree.items()})
        else:
            import io
            from multiprocessing.reduction import ForkingPickler

            import torch.multiprocessing  # noqa: F401 - registers torch's reductions there

            for tensor in tree.values():
                tensor.share_memory_()
            out = io.BytesIO()
            ForkingPickler(out, pickle.HIGHEST_PROTOCOL).dump(tree)
            data = out.getvalue()
        answer, theirs = receiver.send(way, data)
        elapsed = time.perf_counter() - start
        ours = time.process_time() - cpu
        del data
        gc.collect()
        receiver.released()
        if answer != value:
            raise AssertionError(f"{way}: the receiver read {answer}, not {value}")
        if k >= warmups:
            times.append(elapsed)
            cpu_times.append(ours + theirs)
    return times, cpu_times


def descriptors(receiver: Receiver, tree: dict) -> dict[str, tuple[int, int]]:
    """Row 2: (sender, receiver) descriptors more, for a tree and for one handle per leaf."""
    # The lender and the receiver's way to it, running before the count.
    warm = dlpack.share_tree({"w": np.ones(1)})
    receiver.connection.send("keep tree")
    receiver.connection.send_bytes(pickle.dumps(warm))
    receiver.connection.recv()
    counts = {}
    before, theirs_before = open_files(), receiver.count()
    shared = dlpack.share_tree(tree)
    data = pickle.dumps(shared)
    receiver.connection.send("keep tree")
    receiver.connection.send_bytes(data)
    theirs_after = receiver.connection.recv()
    counts["tree"] = (open_files() - before, theirs_after - theirs_before)
    before = open_files()
    handles = {key: dlpack.share(leaf) for key, leaf in tree.items()}
    data = pickle.dumps(handles)
    counts["handles (sender)"] = (open_files() - before, 0)
    del shared, handles, data
    return counts


# -- rows 3 and 4 -------------------------------------------------------------------------------


def big_rows(total: int, repeats: int) -> dict[str, list[float]]:
    """Rows 3 and 4: seconds per call (every repeat) of share_tree into kept and new memory,
    update, np.array, and np.copyto of ``total`` bytes in 200 leaves."""
    leaf = total // 200 // 4
    tree = {f"layer{k}": np.full(leaf, float(k), np.float32) for k in range(200)}
    source = np.ones(leaf * 200, np.float32)
    target = np.ones_like(source)  # written: its pages exist
    shared = dlpack.share_tree(tree)
    dlpack.share_tree(tree)  # let go of at once: its segment is kept for the first repeat
    gc.collect()
    rows = target.reshape(200, leaf)
    leaves = list(tree.values())
    times: dict[str, list[float]] = {
        key: []
        for key in (
            "copyto",
            "copyto leaf by leaf",
            "share_tree kept",
            "share_tree new",
            "np.array",
            "update",
        )
    }

    def timed(key: str, call) -> None:
        start = time.perf_counter()
        result = call()
        times[key].append(time.perf_counter() - start)
        del result

    for _ in range(repeats):
        timed("copyto", lambda: np.copyto(target, source))
        # The same bytes as 200 copies, as a tree's leaves are (glibc streams a copy past its
        # non-temporal threshold only, which one leaf may not reach where all of them do).
        timed(
            "copyto leaf by leaf",
            lambda: [np.copyto(r, x) for r, x in zip(rows, leaves, strict=True)],
        )
        timed("update", lambda: shared.update(tree))
        # The kept row: the tree of the repeat before let go of, its segment kept.
        timed("share_tree kept", lambda: dlpack.share_tree(tree))
        gc.collect()
        sharing_process.clear_pool()  # the next has new memory
        timed("share_tree new", lambda: dlpack.share_tree(tree))
        gc.collect()
        timed("np.array", lambda: np.array(source))
    return times


# -- report -------------------------------------------------------------------------------------


def percentile_99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 256 MiB, no torch's")
    parser.add_argument("--pin-cpu", type=int, metavar="CPU", help="every process on this CPU")
    args = parser.parse_args()
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    try:
        import torch
    except ImportError:
        torch = None
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"torch {torch.__version__ if torch else 'not installed'}, dlpack {dlpack.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"{platform.system()} {platform.release()}"
        + (f", every process on CPU {args.pin_cpu}" if args.pin_cpu is not None else "")
        + (", quick run" if args.quick else "")
    )
    count, warmups = (30, 5) if args.quick else (200, 20)
    goals: list[tuple[str, str, float, float, str]] = []

    receiver = Receiver()
    try:
        print("\n### 1. 1,000 float32[1024] leaves to another process (ms per round trip)\n")
        print("| way | median | p99 | CPU, both processes, median | samples |")
        print("|---|---:|---:|---:|---:|")
        libraries = ["numpy"] + (["torch"] if torch else [])
        medians, cpu_medians = {}, {}
        for library in libraries:
            ways = ["tree", "handles"] + (
                ["torch"] if library == "torch" and not args.quick else []
            )
            for way in ways:
                tree = small_tree(library)
                n = count if way != "torch" else max(3, count // 20)
                samples, cpu = round_trips(receiver, way, tree, n, warmups if way != "torch" else 1)
                medians[(library, way)] = statistics.median(samples)
                cpu_medians[(library, way)] = statistics.median(cpu)
                label = {
                    "tree": "share_tree + pickle + open",
                    "handles": "dlpack.share per leaf + pickle + open all",
                    "torch": "share_memory_() + ForkingPickler + load",
                }[way]
                print(
                    f"| {library}: {label} | {ms(statistics.median(samples))} | "
                    f"{ms(percentile_99(samples))} | {ms(statistics.median(cpu))} | "
                    f"{len(samples)} |"
                )
        main_library = "torch" if torch else "numpy"
        goals.append(
            (
                f"1,000 float32[1024] {main_library} leaves: share_tree + pickle + open there",
                "ms",
                medians[(main_library, "tree")] * 1e3,
                3.0,
                "≤",
            )
        )
        goals.append(
            (
                "the same, CPU time of both processes (no wait for a CPU)",
                "ms",
                cpu_medians[(main_library, "tree")] * 1e3,
                3.0,
                "≤",
            )
        )

        print("\n### 2. Descriptors held more, once shared and opened\n")
        counts = descriptors(receiver, small_tree("numpy"))
        print("| what | sender | receiver |")
        print("|---|---:|---:|")
        for what, (ours, theirs) in counts.items():
            print(f"| {what} | {ours} | {theirs} |")
        sender, there = counts["tree"]
        goals.append(("descriptors for one tree, lender", "", sender, 2, "≤"))
        goals.append(("descriptors for one tree, receiver", "", there, 2, "≤"))

        print("\n### 5. snapshot of row 1's tree in a receiver (µs per call)\n")
        shared = dlpack.share_tree(small_tree("numpy"))
        context = multiprocessing.get_context("forkserver")
        ours, theirs = context.Pipe()
        child = context.Process(
            target=snapshot_rows,
            args=(
                pickle.dumps(shared),
                5 if args.quick else 15,
                0.05 if args.quick else 0.2,
                theirs,
            ),
        )
        child.start()
        per_call = ours.recv()
        child.join(60)
        best = {key: min(samples) for key, samples in per_call.items()}
        med = {key: statistics.median(samples) for key, samples in per_call.items()}
        print("| what | best | median |")
        print("|---|---:|---:|")
        for key in per_call:
            print(f"| {key} | {best[key] * 1e6:,.1f} | {med[key] * 1e6:,.1f} |")
        del shared
    finally:
        receiver.close()

    total = 256 * MiB if args.quick else GiB
    name = "256 MiB" if args.quick else "1 GiB"
    print(f"\n### 3, 4. A tree of {name} in 200 leaves (ms per call)\n")
    times = big_rows(total, 3 if args.quick else 7)
    print("| what | best | median | best / np.copyto |")
    print("|---|---:|---:|---:|")
    copyto = min(times["copyto"])
    for key, samples in times.items():
        print(
            f"| {key} | {ms(min(samples))} | {ms(statistics.median(samples))} | "
            f"{min(samples) / copyto:.2f}× |"
        )
    goals.append(
        (
            f"{name} in 200 leaves: share_tree (kept memory) / np.copyto",
            "×",
            min(times["share_tree kept"]) / copyto,
            1.2,
            "≤",
        )
    )
    goals.append((f"{name}: update / np.copyto", "×", min(times["update"]) / copyto, 1.1, "≤"))
    goals.append(
        (
            "snapshot of the 4 MiB tree / np.copyto of 4 MiB",
            "×",
            best["snapshot"] / best["copyto"],
            1.5,
            "≤",
        )
    )

    print("\n### Goals\n")
    print("| what | measured | goal | |")
    print("|---|---:|---:|---|")
    for what, unit, value, goal, how in goals:
        met = value <= goal
        shown = f"{value:.2f} {unit}".strip() if isinstance(value, float) else f"{value}"
        print(f"| {what} | {shown} | {how} {goal} {unit} | {'met' if met else 'MISSED'} |")
    print(
        f"\n(For scale: np.copyto of the same bytes leaf by leaf "
        f"{min(times['copyto leaf by leaf']) / copyto:.2f}× one np.copyto, update / it "
        f"{min(times['update']) / min(times['copyto leaf by leaf']):.2f}×; np.copyto of 4 MiB "
        f"into two targets in turn {best['copyto, two targets in turn'] / best['copyto']:.2f}× "
        f"into one, snapshot / it {best['snapshot'] / best['copyto, two targets in turn']:.2f}×)"
    )
    print(
        f"\n(share_tree into new memory, the first tree of its size: "
        f"{min(times['share_tree new']) / copyto:.2f}× np.copyto; numpy's own copy into new "
        f"memory, np.array: {min(times['np.array']) / copyto:.2f}×)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
