"""Pytrees: which leaves are arrays, and rebuilding every container with its own type."""

from __future__ import annotations

import copy as _copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from .._dlpack import DLPackObject
from ._request import _loaded

# Node kinds. Kinds from _TORCH on are array leaves.
_STATIC = 0
_TUPLE = 1
_LIST = 2
_DICT = 3
_NAMEDTUPLE = 4
_DATACLASS = 5
_JAX_NODE = 6
_DICT_SUBCLASS = 7
_LIST_SUBCLASS = 8
_TUPLE_SUBCLASS = 9
_MAPPING = 10
_TORCH = 11
_JAX = 12
_TRACER = 13
_NUMPY = 14
_NUMPY_SCALAR = 15
_OTHER_ARRAY = 16
_SLOT = 17
_SHAPE_SPEC = 18  # jax.ShapeDtypeStruct: a leaf of result_shape trees, with no data
_FIRST_ARRAY_KIND = _TORCH

_ARRAY_PROTOCOLS = (
    "__dlpack__",
    "__cuda_array_interface__",
    "__array_interface__",
    "__array_struct__",
)


class _Slot:
    """Stands for the i-th array leaf in a flattened tree's skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


# Per-type kinds; a type's kind never changes, so each type is classified once.
_KINDS: dict[type, int] = {
    tuple: _TUPLE,
    list: _LIST,
    dict: _DICT,
    type(None): _STATIC,
    bool: _STATIC,
    int: _STATIC,
    float: _STATIC,
    complex: _STATIC,
    str: _STATIC,
    bytes: _STATIC,
    bytearray: _STATIC,
    memoryview: _STATIC,
    DLPackObject: _OTHER_ARRAY,
    _Slot: _SLOT,
}


def _classify(node: Any) -> int:
    """The kind of ``node``'s type (cached): an array leaf (see :func:`is_array`), a container
    we rebuild, or a leaf kept as it is."""
    tp = type(node)
    kind = _classify_type(tp, node)
    _KINDS[tp] = kind
    return kind


def _classify_type(tp: type, node: Any) -> int:
    if issubclass(tp, (str, bytes, bytearray, memoryview)):
        return _STATIC  # numpy's str_ and bytes_ too: text, not arrays
    torch = _loaded("torch")
    if torch is not None:
        if issubclass(tp, torch.Tensor):
            return _TORCH
        if issubclass(tp, torch.Size):
            return _STATIC  # a shape, not a tuple of leaves
    jax = _loaded("jax")
    if jax is not None:
        if issubclass(tp, jax.core.Tracer):
            return _TRACER
        if issubclass(tp, jax.Array):
            return _JAX
        if issubclass(tp, jax.ShapeDtypeStruct):
            return _SHAPE_SPEC
    numpy = _loaded("numpy")
    if numpy is not None:
        if issubclass(tp, numpy.ndarray):
            return _NUMPY
        if issubclass(tp, numpy.generic):
            return _NUMPY_SCALAR
    if tp.__name__ == "PyCapsule" and tp.__module__ == "builtins":
        return _OTHER_ARRAY
    if any(hasattr(tp, protocol) for protocol in _ARRAY_PROTOCOLS):
        return _OTHER_ARRAY
    if issubclass(tp, tuple) and hasattr(tp, "_fields"):
        return _NAMEDTUPLE
    if issubclass(tp, dict):
        # Before JAX's registry: JAX rebuilds a defaultdict with its keys sorted.
        return _DICT_SUBCLASS
    if jax is not None and _is_jax_node(node):
        return _JAX_NODE
    if dataclasses.is_dataclass(tp):
        return _DATACLASS
    if issubclass(tp, list):
        return _LIST_SUBCLASS
    if issubclass(tp, tuple):
        return _TUPLE_SUBCLASS
    if issubclass(tp, Mapping):
        return _MAPPING
    return _STATIC


def _is_jax_node(node: Any) -> bool:
    """True when ``node``'s type is registered with ``jax.tree_util`` (flax, equinox, ...)."""
    import jax

    _, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda child: child is not node)
    return not jax.tree_util.treedef_is_leaf(treedef)


def is_array(obj: Any) -> bool:
    """True when the conversions treat ``obj`` as an array leaf, False when they keep it.

    Arrays: torch tensors, JAX arrays (and tracers, which only ``to_jax`` accepts), numpy
    arrays and numpy scalars, ``DLPackObject``, raw DLPack capsules, and any object whose type
    has ``__dlpack__``, ``__cuda_array_interface__``, ``__array_interface__`` or
    ``__array_struct__`` (CuPy, Numba, pyarrow, ...). Kept: Python numbers, strings, None,
    ``torch.Size``, dtypes and devices, objects that only speak the buffer protocol (bytes,
    bytearray, memoryview, array.array, mmap: wrap one in ``asdlpack`` to convert it) or only
    ``__array__`` (pandas: ``np.asarray`` it), and every other object that is not a container.
    """
    kind = _KINDS.get(type(obj))
    if kind is None:
        kind = _classify(obj)
    return _FIRST_ARRAY_KIND <= kind < _SLOT  # slots and shape specs hold no data


LeafConverter: TypeAlias = Callable[[Any, int], Any]


def _kind(node: Any) -> int:
    kind = _KINDS.get(type(node))
    return _classify(node) if kind is None else kind


def _map_leaves(node: Any, convert: LeafConverter) -> Any:
    """Rebuild ``node`` with ``convert(leaf, kind)`` applied to its array leaves.

    Containers keep their exact types: a namedtuple stays that namedtuple, a dataclass instance
    becomes a shallow copy of itself with converted fields (``__init__`` and ``__post_init__``
    are not run again), a dict keeps its key order and key types, a dict subclass is a shallow
    copy with converted values (a defaultdict keeps its default factory).

    Trees of any depth convert (Python's recursion limit does not apply), and a container that
    holds itself, directly or further down, is a ValueError naming where: trees nested deeper
    than ``_RECURSION_DEPTH`` (and so every cycle) are walked again with a stack of their own.
    """
    try:
        return _child(node, convert, 0)
    except (_TooDeep, RecursionError):  # the latter: called from deep down a stack already
        return _map_leaves_iteratively(node, convert)


# How deep the recursive walk goes before the iterative one takes over (it is twice as fast on
# trees of small dicts, and Python's recursion limit is 1000 frames).
_RECURSION_DEPTH = 200


class _TooDeep(Exception):
    pass


def _child(node: Any, convert: LeafConverter, depth: int) -> Any:
    kind = _KINDS.get(type(node))
    if kind is None:
        kind = _classify(node)
    if kind >= _FIRST_ARRAY_KIND:
        return convert(node, kind)
    if kind == _STATIC:
        return node
    if depth >= _RECURSION_DEPTH:
        raise _TooDeep
    depth += 1
    if kind == _DICT:
        return {key: _child(value, convert, depth) for key, value in node.items()}
    if kind == _LIST:
        return [_child(child, convert, depth) for child in node]
    if kind == _TUPLE:
        return tuple([_child(child, convert, depth) for child in node])
    frame = _frame(node, kind)
    frame[4] = [_child(child, convert, depth) for child in frame[2]]
    return _rebuild(frame)


def _map_leaves_iteratively(node: Any, convert: LeafConverter) -> Any:
    """:func:`_map_leaves` with a stack of its own, and the containers open on it checked."""
    kind = _kind(node)
    if kind >= _FIRST_ARRAY_KIND:
        return convert(node, kind)
    if kind == _STATIC:
        return node
    # Each frame: [container, kind, children, how to rebuild it, converted children so far].
    root = _frame(node, kind)
    stack = [root]
    open_ids = {id(node)}
    while True:
        frame = stack[-1]
        children, done = frame[2], frame[4]
        at, count = len(done), len(children)
        # This container's leaves in a row, up to its next container child.
        while at < count:
            child = children[at]
            known = _KINDS.get(type(child))
            child_kind = _classify(child) if known is None else known
            if child_kind >= _FIRST_ARRAY_KIND:
                done.append(convert(child, child_kind))
            elif child_kind == _STATIC:
                done.append(child)
            else:
                break
            at += 1
        if at < count:
            if id(child) in open_ids:
                raise ValueError(_cycle_message(stack, child))
            open_ids.add(id(child))
            stack.append(_frame(child, child_kind))
            continue
        stack.pop()
        open_ids.discard(id(frame[0]))
        rebuilt = _rebuild(frame)
        if not stack:
            return rebuilt
        stack[-1][4].append(rebuilt)


def _frame(node: Any, kind: int) -> list[Any]:
    """A container's frame for :func:`_map_leaves`: its children in order, and what
    :func:`_rebuild` needs besides them (keys, a treedef, field names)."""
    if kind == _DICT:
        return [node, kind, list(node.values()), list(node), []]
    if kind in (_LIST, _TUPLE, _NAMEDTUPLE):
        return [node, kind, node, None, []]
    if kind in (_DICT_SUBCLASS, _MAPPING):
        keys = list(node.keys())
        return [node, kind, [node[key] for key in keys], keys, []]
    if kind == _DATACLASS:
        # An init=False field may never have been set: it is left as it is.
        names = [f.name for f in dataclasses.fields(node) if hasattr(node, f.name)]
        return [node, kind, [getattr(node, name) for name in names], names, []]
    if kind == _JAX_NODE:
        import jax

        children, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda c: c is not node)
        return [node, kind, children, treedef, []]
    return [node, kind, list(node), None, []]  # list and tuple subclasses


def _rebuild(frame: list[Any]) -> Any:
    """The container of ``frame`` with its converted children, of its own type."""
    node, kind, children, extra, done = frame
    if kind == _DICT:
        return dict(zip(extra, done, strict=True))
    if kind == _LIST:
        return done
    if kind == _TUPLE:
        return tuple(done)
    if kind == _NAMEDTUPLE:
        return type(node)._make(done)
    if kind == _DATACLASS:
        rebuilt = _copy.copy(node)
        for name, value in zip(extra, done, strict=True):
            object.__setattr__(rebuilt, name, value)
        return rebuilt
    if kind == _JAX_NODE:
        return extra.unflatten(done)
    if kind == _DICT_SUBCLASS:
        rebuilt = _copy.copy(node)
        for key, value in zip(extra, done, strict=True):
            rebuilt[key] = value
        return rebuilt
    # List, tuple and Mapping subclasses with no known recipe: rebuilt only if holding arrays.
    if all(new is old for new, old in zip(done, children, strict=True)):
        return node
    try:
        if kind == _LIST_SUBCLASS:
            rebuilt = _copy.copy(node)
            rebuilt[:] = done
            return rebuilt
        return type(node)(dict(zip(extra, done, strict=True)) if kind == _MAPPING else done)
    except Exception as exc:
        raise TypeError(
            f"can't rebuild a {type(node).__qualname__} holding arrays; register the type with "
            "jax.tree_util (register_pytree_node) so its children can be replaced"
        ) from exc


def _leaf_paths(tree: Any) -> list[str]:
    """Where each array leaf of ``tree`` is (``tree[0]['w']``), in :func:`_flatten`'s order:
    for error messages."""
    paths: list[str] = []
    stack: list[tuple[Any, str]] = [(tree, "tree")]
    while stack:
        node, path = stack.pop()
        kind = _kind(node)
        if kind >= _FIRST_ARRAY_KIND:
            paths.append(path)
        elif kind != _STATIC:
            frame = _frame(node, kind)
            keys = frame[3] if kind in (_DICT, _DICT_SUBCLASS, _MAPPING, _DATACLASS) else None
            for at in reversed(range(len(frame[2]))):
                if keys is None:
                    step = f"[{at}]"
                elif kind == _DATACLASS:
                    step = f".{keys[at]}"
                else:
                    step = f"[{keys[at]!r}]"
                stack.append((frame[2][at], path + step))
    return paths


def _cycle_message(stack: list[list[Any]], child: Any) -> str:
    """Where ``child``, a container being walked, turns up inside itself."""

    def key(frame: list[Any]) -> str:
        node, kind, _, extra, done = frame
        at = len(done)
        if kind in (_DICT, _DICT_SUBCLASS, _MAPPING):
            return f"[{extra[at]!r}]"
        if kind == _DATACLASS:
            return f".{extra[at]}"
        return f"[{at}]"

    inner = "tree" + "".join(key(frame) for frame in stack)
    depth = next(i for i, frame in enumerate(stack) if frame[0] is child)
    outer = "tree" + "".join(key(frame) for frame in stack[:depth])
    return (
        f"the tree contains itself: {inner} is the {type(child).__name__} at {outer} (a cycle); "
        "pytrees must be trees"
    )


def _flatten(tree: Any) -> tuple[Any, list[Any], list[int]]:
    """Split ``tree`` into a skeleton (array leaves replaced by slots), the leaves and kinds."""
    leaves: list[Any] = []
    kinds: list[int] = []

    def take(leaf: Any, kind: int) -> _Slot:
        leaves.append(leaf)
        kinds.append(kind)
        return _Slot(len(leaves) - 1)

    return _map_leaves(tree, take), leaves, kinds


def _unflatten(skeleton: Any, values: list[Any]) -> Any:
    """The tree of :func:`_flatten`'s skeleton with ``values`` in its slots."""
    return _map_leaves(skeleton, lambda slot, kind: values[slot.index])
