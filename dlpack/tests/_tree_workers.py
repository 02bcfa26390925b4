"""What the processes of ``test_sharing_tree`` run: importable without pytest (spawn and forkserver
children import this module), with numpy only; the containers the tests' trees are made of.

A :class:`Peer` serves this module's functions on request, as ``_sharing_workers``' does its
own; the others are plain process targets.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import time
import traceback
from collections import OrderedDict, namedtuple
from typing import Any

import numpy as np

import dlpack
from dlpack.interop._pytree import _map_leaves

from . import _sharing_workers as workers

Pair = namedtuple("Pair", "weight bias")


@dataclasses.dataclass
class Layer:
    kernel: Any
    scale: Any
    name: str = "dense"


Ordered = OrderedDict

_kept: list = []

# A tree a forked child finds here (set by the test before it forks).
inherited: Any = None


def serve(connection) -> None:
    """A peer's loop, as ``_sharing_workers.serve`` (the same answers), over this module."""
    while True:
        request = connection.recv()
        if request is None:
            return
        name, args = request
        del request
        try:
            result = globals()[name](*args)
            del args
            gc.collect()
            connection.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
            del args
            connection.send(("error", type(exc).__name__, f"{exc}\n{traceback.format_exc()}"))


class Peer(workers.Peer):
    """A process of the start method of ``context`` running :func:`serve`."""

    def __init__(self, context):
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs,), daemon=True)
        self.process.start()
        theirs.close()


def elements(leaf) -> tuple:
    """A leaf as a process sees it through ``asdlpack``: its bytes in C order, shape, dtype name,
    read-only."""
    return workers.elements(leaf)


class Leaf(tuple):
    """What a test expects ``elements`` to give for a leaf (a leaf to ``shape_of``)."""


def shape_of(tree) -> Any:
    """The tree's containers as (type name, children) and its leaves as ``elements`` gives them
    (non-array leaves as they are)."""
    if isinstance(tree, dlpack.DLPackObject):
        return elements(tree)
    if isinstance(tree, Leaf):
        return tuple(tree)
    if isinstance(tree, dict):
        return (type(tree).__name__, [(k, shape_of(v)) for k, v in tree.items()])
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = [(f.name, shape_of(getattr(tree, f.name))) for f in dataclasses.fields(tree)]
        return (type(tree).__name__, fields)
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, [shape_of(child) for child in tree])
    return tree


def open_tree(data: bytes) -> Any:
    """Unpickle a tree and read it through ``open()``."""
    return shape_of(pickle.loads(data).open())


def snapshot_tree(data: bytes) -> tuple[Any, int]:
    """Unpickle a tree and read a snapshot of it: (its shape, its generation)."""
    tree, generation = pickle.loads(data).snapshot()
    return shape_of(tree), generation


def keep_tree(data: bytes) -> tuple[int, int]:
    """Unpickle a tree and keep it: (segments mapped here, descriptors open here)."""
    _kept.append(pickle.loads(data))
    _kept[-1].open()
    return workers.live_segments(), workers.count_resources()[0]


def kept_snapshot(index: int) -> tuple[Any, int]:
    tree, generation = _kept[index].snapshot()
    return shape_of(tree), generation


def kept_open(index: int) -> Any:
    return shape_of(_kept[index].open())


def kept_update(index: int, fill: float) -> int:
    """Update a kept tree: every array leaf filled with ``fill`` (in its own type)."""
    shared = _kept[index]
    tree, _ = shared.snapshot()
    filled = _map_leaves(tree, lambda leaf, kind: np.full_like(np.asarray(leaf), fill))
    return shared.update(filled)


def kept_scribble_with_torch(index: int, path: str) -> float:
    """Write into an ``open()`` leaf of a kept tree through torch (which ignores the read-only
    flag), 1-d float leaf ``open()[path]``: what this process then reads there."""
    import torch

    leaf = _kept[index].open()[path]
    tensor = torch.from_dlpack(leaf)
    tensor.fill_(-7.0)
    return float(np.asarray(leaf)[0])


def drop_trees() -> int:
    _kept.clear()
    gc.collect()
    return workers.live_segments()


def descriptors() -> tuple[int, int]:
    """(descriptors open here, of which dlpack segments)."""
    kinds = workers.descriptor_kinds()
    return sum(kinds.values()), kinds["memfd"]


def leaves_of(count: int, size: int, generation: int) -> dict:
    """The tree the writer and readers test: ``count`` leaves of ``size`` elements, of several
    types, every element equal to ``generation``."""
    kinds = (np.float32, np.int64, np.float64, np.int32)
    tree = {
        f"leaf{k}": np.full(size, generation, dtype=kinds[k % len(kinds)]) for k in range(count)
    }
    return {"params": tree, "step": "fixed"}


def write_generations(data: bytes, count: int, size: int, start, done, connection) -> None:
    """The writer: once ``start`` is set, update the tree ``count`` times, each update writing
    its generation into every element; then set ``done``."""
    shared = pickle.loads(data)
    tree = leaves_of(count=8, size=size, generation=0)
    start.wait(60)
    for _ in range(count):
        generation = shared.generation + 1
        for leaf in tree["params"].values():
            leaf.fill(generation)
        made = shared.update(tree)
        if made != generation:
            connection.send(("wrong generation", made, generation))
            return
        time.sleep(0)  # as a learner computes between updates
    done.set()
    connection.send(("ok", shared.generation))


def read_snapshots(data: bytes, count: int, ready, done, connection) -> None:
    """A reader: take ``count`` snapshots, and go on until the writer is ``done``, then one more;
    check each holds one generation in every element of every leaf, and that generations never
    go back. Sends (snapshots taken, mixed ones, generations gone back, distinct generations
    seen, last generation)."""
    shared = pickle.loads(data)
    mixed = back = taken = 0
    seen = set()
    last = -1
    ready.set()
    while True:
        finished = done.is_set()
        tree, generation = shared.snapshot(timeout=60)
        taken += 1
        values = {int(np.asarray(leaf).min()) for leaf in tree["params"].values()}
        values |= {int(np.asarray(leaf).max()) for leaf in tree["params"].values()}
        if values != {generation}:
            mixed += 1
        if generation < last:
            back += 1
        last = generation
        seen.add(generation)
        if taken >= count and finished:
            break
    connection.send((taken, mixed, back, len(seen), last))


def update_forever(data: bytes, connection) -> None:
    """A writer updating a (large) tree back to back until it is killed."""
    shared = pickle.loads(data)
    tree, _ = shared.snapshot()
    connection.send("updating")
    while True:
        shared.update(tree)


def produce_tree(connection, fill: float) -> None:
    """A lender: send a pickled tree, then wait for the word to exit (without waiting for the
    receiver to open it)."""
    shared = dlpack.share_tree({"w": np.full(1000, fill), "n": 1})
    connection.send_bytes(pickle.dumps(shared))
    connection.recv()


def open_as(data: bytes, uid: int, connection) -> None:
    """Open a pickled tree as user ``uid``: its error's type name and message, or "opened"."""
    workers.become(uid, None)
    try:
        pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - the test checks what it was
        connection.send((type(exc).__name__, str(exc)))
        return
    connection.send(("opened", ""))


def share_under_limit(open_files: int, connection) -> None:
    """Share a tree of 1,000 leaves, and open another process's, with at most ``open_files``
    descriptors: (what was received, generation, descriptors open then)."""
    pickled = connection.recv_bytes()
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    mine = dlpack.share_tree([np.full(8, float(k)) for k in range(1000)])
    theirs = pickle.loads(pickled)
    total = float(sum(np.asarray(leaf).sum() for leaf in theirs.snapshot().tree))
    connection.send_bytes(pickle.dumps(mine))
    connection.send((total, len(os.listdir("/proc/self/fd"))))
    connection.recv()


def dask_sum(shared) -> tuple[int, float, str]:
    """On a Dask worker: (its pid, the sum of the tree's "w", its "tag")."""
    tree, _ = shared.snapshot()
    return os.getpid(), float(np.asarray(tree["w"]).sum()), tree["tag"]
