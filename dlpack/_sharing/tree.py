"""``share_tree()`` and ``SharedTree``: a pytree's array leaves in one shared segment, behind one
handle. The tree is walked as :mod:`dlpack.interop` walks it (``_pytree``); its structure, with
every non-array leaf, is pickled once into the segment (each array leaf a persistent id: its
index), so that a ``SharedTree`` pickles to a handle of a few hundred bytes whatever the tree.
The segment, its layout, the copies and the sequence lock that keeps snapshots whole are the
extension's (``src/share/tree.rs``, ``dlpack_core::share::{tree, seqlock}``)."""

from __future__ import annotations

import io
import numbers
import operator
import pickle
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from ..interop._pytree import _FIRST_ARRAY_KIND, _KINDS, _TORCH, _flatten, _kind, _leaf_paths, _Slot
from .process import not_linux

__all__ = ["SharedTree", "TreeSnapshot", "share_tree"]

if sys.platform == "linux":
    from .._dlpack import TreeSegment, _share_tree, _share_tree_rebuild
else:  # no shared memory here: the names exist, nothing makes a tree

    class TreeSegment:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TypeError("TreeSegment objects are made by dlpack.share_tree()")

    def _share_tree(leaves: Any, structure: Any, writable: Any, name: Any) -> TreeSegment:
        raise not_linux()

    def _share_tree_rebuild(state: Any) -> TreeSegment:
        raise not_linux()


class TreeSnapshot(NamedTuple):
    """What :meth:`SharedTree.snapshot` gives: the tree, every array leaf a ``DLPackObject`` over
    memory of this process's own, all of one ``generation``."""

    tree: Any
    generation: int


def share_tree(tree: Any, *, writable: bool = False) -> SharedTree:
    """Share a whole pytree with other processes on this machine as one segment and one handle.

    ``tree``: any pytree :mod:`dlpack.interop` walks (dicts, lists, tuples, namedtuples,
    dataclasses, JAX-registered nodes), whose array leaves (see
    :func:`dlpack.interop.is_array`) are host memory ``asdlpack`` reads. Every array leaf is
    copied once, C-ordered, into one new segment (each leaf aligned for its type, to 64 bytes at
    least); non-array leaves (numbers, strings, None) are pickled with the tree's structure into
    the segment too. The :class:`SharedTree` returned pickles to a handle of a few hundred bytes,
    whatever the tree, which any process on this machine opens (see :class:`SharedTree`).

    Receivers may update the tree only if ``writable=True``; the lender always may. Memory that
    can't be had is a MemoryError before anything is allocated; a leaf in device memory, or of a
    type a receiver could not name, is a BufferError naming where it is in the tree.
    """
    if type(writable) is not bool:
        raise TypeError(f"writable must be True or False, not {type(writable).__name__}")
    structure, leaves, kinds = _flattened(tree)
    segment = _share_tree(_detached(leaves, kinds), structure, writable, _namer(tree))
    return SharedTree._of(segment, structure)


class SharedTree:
    """A pytree shared as one segment (made by :func:`share_tree`): pickle it (``Queue.put``,
    ``Connection.send``, ``pickle.dumps``, a Dask or Ray task's argument) to send it to another
    process on this machine, where it unpickles to a ``SharedTree`` over the same memory.

    - :meth:`open` gives the tree with ``DLPackObject`` leaves over the shared memory itself
      (zero-copy, read-only): it sees updates as they land, a leaf possibly half written.
    - :meth:`snapshot` gives a consistent copy: every leaf of one generation, never a mix.
    - :meth:`update` writes new values of the same structure, shapes and types (the lender, or a
      process the tree was shared with writable), raising the generation by one.

    ``dlpack.interop.to_torch``, ``to_jax`` and ``to_numpy`` take a ``SharedTree`` as its
    snapshot. In the process that made it, it keeps the memory alive.
    """

    __slots__ = ("__weakref__", "_keys", "_segment", "_structure")

    _segment: TreeSegment
    _structure: bytes
    # A tree that is a plain dict of array leaves in order (a state dict): its keys, to make it
    # again without unpickling; None for any other tree, False until the first tree is made.
    _keys: tuple[Any, ...] | None | bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("SharedTree objects are made by dlpack.share_tree()")

    @classmethod
    def _of(cls, segment: TreeSegment, structure: bytes) -> SharedTree:
        tree = object.__new__(cls)
        tree._segment = segment
        tree._structure = structure
        tree._keys = False
        return tree

    def _tree_of(self, leaves: list[Any]) -> Any:
        """The tree with ``leaves`` in its slots."""
        keys = self._keys
        if type(keys) is tuple:
            return dict(zip(keys, leaves, strict=True))
        tree = _load(self._structure, leaves)
        if keys is False:
            flat = type(tree) is dict and len(tree) == len(leaves)
            flat = flat and all(v is leaf for v, leaf in zip(tree.values(), leaves, strict=True))
            self._keys = tuple(tree) if flat else None
        return tree

    def open(self) -> Any:
        """The tree, its array leaves ``DLPackObject``\\ s over the shared memory (zero-copy,
        read-only, the same objects at every call; containers made anew).

        They see updates as they land: a leaf read while an update writes it may hold parts of
        two generations, and two leaves may be of different generations. :meth:`snapshot` gives
        a consistent copy. Writing into them (torch ignores the read-only flag) changes this
        process's own pages only, in a receiver of a read-only tree; snapshots still read the
        tree's memory.
        """
        return self._tree_of(self._segment.leaves())

    def snapshot(self, *, timeout: float | None = None) -> TreeSnapshot:
        """A copy of the tree, every leaf of one generation, and that generation:
        ``tree, generation = shared.snapshot()``. Its leaves are ``DLPackObject``\\ s over memory
        of this process's own (writable, 64-byte aligned, one allocation for the whole tree).

        The copy is made under the segment's sequence lock: taken while no update is under way,
        and taken again if one began or ended meanwhile; readers never hold a writer up. While an
        update is under way it waits, at most ``timeout`` seconds (TimeoutError), by default as
        long as its writer lives: a writer that exited mid-update leaves a tree of two
        generations, a BufferError until the next update. A writer updating back to back,
        without a pause as long as this copy, can keep it retrying until ``timeout``.
        """
        keys = self._keys
        if type(keys) is tuple:
            # A state dict: made (or an earlier snapshot's that nothing holds, reused) in one call.
            tree, generation = self._segment.snapshot(_timeout(timeout), keys)
            return TreeSnapshot(tree, generation)
        leaves, generation = self._segment.snapshot(_timeout(timeout))
        return TreeSnapshot(self._tree_of(leaves), generation)

    def update(self, tree: Any, *, timeout: float | None = None) -> int:
        """Write ``tree``'s array leaves into the shared memory as the next generation, which it
        returns. ``tree`` has the structure and non-array leaves the tree was shared with, and
        each array leaf that leaf's shape and element type (any layout, any library, host
        memory). Only the lender, or a process the tree was shared with writable, may update
        (ValueError otherwise).

        Another update under way (another process's, or another thread's: threads take turns)
        is waited for, at most ``timeout`` seconds (TimeoutError), by default as long as it
        runs. Memory a Rust or C extension's view of
        the leaves holds here is not written (BufferError).
        """
        timeout = _timeout(timeout)
        structure, leaves, kinds = _flattened(tree)
        if structure != self._structure:
            raise ValueError(self._difference(tree))
        return self._segment.update(_detached(leaves, kinds), _namer(tree), timeout)

    @property
    def generation(self) -> int:
        """The number of updates made: 0 as shared, each update one more (one under way not
        yet)."""
        return self._segment.generation

    @property
    def writable(self) -> bool:
        """Whether this process may :meth:`update` the tree."""
        return self._segment.writable

    @property
    def nbytes(self) -> int:
        """Bytes of the array leaves' elements."""
        return self._segment.nbytes

    def __len__(self) -> int:
        """How many array leaves the tree holds."""
        return len(self._segment)

    def __repr__(self) -> str:
        return (
            f"SharedTree(leaves={len(self)}, nbytes={self.nbytes}, "
            f"generation={self.generation}, writable={self.writable})"
        )

    def __reduce__(self) -> tuple[Callable[[TreeSegment], SharedTree], tuple[TreeSegment]]:
        return (_open_tree, (self._segment,))

    def _difference(self, tree: Any) -> str:
        """Why ``tree`` can't update this tree (its structure pickles to other bytes)."""
        shared = _load(self._structure, [_Slot(k) for k in range(len(self))])
        old, new = _leaf_paths(shared), _leaf_paths(tree)
        for k, (was, now) in enumerate(zip(old, new, strict=False)):
            if was != now:
                return (
                    f"the tree's structure differs from the one it was shared with: its array "
                    f"leaf {k} is at {now}, it was at {was}"
                )
        if len(old) != len(new):
            return (
                f"the tree has {len(new)} array leaves, but was shared with {len(old)}: an update "
                "keeps the tree's structure"
            )
        return (
            "the tree's containers or non-array leaves differ from those it was shared with: "
            "they travel with its structure and can't change (make a value that changes an "
            "array leaf, e.g. numpy.int64(step))"
        )


def _open_tree(segment: TreeSegment) -> SharedTree:
    """Unpickle a tree: ``segment`` is its segment, opened (and checked) as it unpickled."""
    return SharedTree._of(segment, segment.structure())


def _flattened(tree: Any) -> tuple[bytes, list[Any], list[int]]:
    """``tree``'s structure (its skeleton's bytes, see :func:`_dump`), array leaves and their
    kinds. A state dict (a dict of str keys whose values are all array leaves) is read without
    walking it, its structure made once per set of keys (see :func:`_flat_structure`): the
    same bytes as the walk's."""
    if type(tree) is dict and tree:
        leaves = list(tree.values())
        known = list(map(_KINDS.get, map(type, leaves)))
        # Types not classified yet are, once.
        kinds = [_kind(leaf) for leaf in leaves] if None in known else cast(list[int], known)
        if min(kinds) >= _FIRST_ARRAY_KIND and set(map(type, tree)) == {str}:
            return _flat_structure(tuple(tree)), leaves, kinds
    skeleton, leaves, kinds = _flatten(tree)
    return _dump(skeleton), leaves, kinds


# The structures of the last state dicts' keys: a loop sharing or updating one model's
# weights pickles its keys once.
_FLAT_STRUCTURES: dict[tuple[str, ...], bytes] = {}
_FLAT_STRUCTURES_KEPT = 8


def _flat_structure(keys: tuple[str, ...]) -> bytes:
    """The structure of a dict of ``keys`` whose values are array leaves 0, 1, ... in order (str
    keys only: their pickle is their value, so equal keys are equal bytes)."""
    structure = _FLAT_STRUCTURES.get(keys)
    if structure is None:
        structure = _dump({key: _Slot(k) for k, key in enumerate(keys)})
        if len(_FLAT_STRUCTURES) >= _FLAT_STRUCTURES_KEPT:
            _FLAT_STRUCTURES.pop(next(iter(_FLAT_STRUCTURES)), None)
        _FLAT_STRUCTURES[keys] = structure
    return structure


# The hooks are methods of subclasses, as pickle documents them: CPython 3.13.0 refuses them
# set on a Pickler or Unpickler object ("attribute 'persistent_id' is read-only").
class _StructurePickler(pickle.Pickler):
    """Each array leaf's slot pickled as its index."""

    def persistent_id(self, obj: Any) -> int | None:
        return obj.index if type(obj) is _Slot else None


class _StructureUnpickler(pickle.Unpickler):
    """Each index read back as its leaf."""

    def __init__(self, structure: bytes, leaves: Any) -> None:
        super().__init__(io.BytesIO(structure))
        self._leaves = leaves

    def persistent_load(self, pid: Any) -> Any:
        return self._leaves[pid]


def _dump(skeleton: Any) -> bytes:
    """The structure's bytes: the skeleton pickled, each array leaf's slot as its index."""
    out = io.BytesIO()
    pickler = _StructurePickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    # No memo: equal trees pickle to equal bytes, whichever of their objects are one object.
    pickler.fast = True
    try:
        pickler.dump(skeleton)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(
            f"a shared tree's structure and non-array leaves travel pickled, and this one "
            f"doesn't pickle: {exc}"
        ) from exc
    return out.getvalue()


def _load(structure: bytes, leaves: Any) -> Any:
    """The tree ``structure`` spells, with ``leaves`` in its slots."""
    return _StructureUnpickler(structure, leaves).load()


_requires_grad = operator.attrgetter("requires_grad")


def _detached(leaves: list[Any], kinds: list[int]) -> list[Any]:
    """``leaves`` with torch tensors that require grad detached (torch won't export them; their
    values are what is shared)."""
    if _TORCH not in kinds:
        return leaves
    torch = [k for k, kind in enumerate(kinds) if kind == _TORCH]
    flags = list(
        map(_requires_grad, leaves if len(torch) == len(leaves) else map(leaves.__getitem__, torch))
    )
    if True in flags:
        for k, flag in zip(torch, flags, strict=True):
            if flag:
                leaves[k] = leaves[k].detach()
    return leaves


def _namer(tree: Any) -> Callable[[int], str]:
    """Names array leaf ``k`` of ``tree`` by its path (for errors; walked only when asked)."""
    paths: list[str] = []

    def name(k: int) -> str:
        if not paths:
            paths.extend(_leaf_paths(tree))
        return paths[k] if k < len(paths) else f"leaf {k}"

    return name


def _timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, not {timeout!r}")
    seconds = float(timeout)
    if not seconds >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")
    return seconds
