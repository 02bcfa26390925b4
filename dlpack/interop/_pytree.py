"""Pytrees: which leaves are arrays, and rebuilding every container with its own type."""

from __future__ import annotations

import copy as _copy
import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from .._dlpack import DLPackObject

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
    torch = sys.modules.get("torch")
    if torch is not None:
        if issubclass(tp, torch.Tensor):
            return _TORCH
        if issubclass(tp, torch.Size):
            return _STATIC  # a shape, not a tuple of leaves
    jax = sys.modules.get("jax")
    if jax is not None:
        if issubclass(tp, jax.core.Tracer):
            return _TRACER
        if issubclass(tp, jax.Array):
            return _JAX
        if issubclass(tp, jax.ShapeDtypeStruct):
            return _SHAPE_SPEC
    numpy = sys.modules.get("numpy")
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


def _map_leaves(node: Any, convert: LeafConverter) -> Any:
    """Rebuild ``node`` with ``convert(leaf, kind)`` applied to its array leaves.

    Containers keep their exact types: a namedtuple stays that namedtuple, a dataclass instance
    becomes a shallow copy of itself with converted fields (``__init__`` and ``__post_init__``
    are not run again), a dict keeps its key order and key types, a dict subclass is a shallow
    copy with converted values (a defaultdict keeps its default factory).
    """
    kind = _KINDS.get(type(node))
    if kind is None:
        kind = _classify(node)
    if kind >= _FIRST_ARRAY_KIND:
        return convert(node, kind)
    if kind == _STATIC:
        return node
    if kind == _DICT:
        return {key: _map_leaves(value, convert) for key, value in node.items()}
    if kind == _LIST:
        return [_map_leaves(child, convert) for child in node]
    if kind == _TUPLE:
        return tuple([_map_leaves(child, convert) for child in node])
    if kind == _NAMEDTUPLE:
        return type(node)._make([_map_leaves(child, convert) for child in node])
    if kind == _DATACLASS:
        return _map_dataclass(node, convert)
    if kind == _JAX_NODE:
        import jax

        children, treedef = jax.tree_util.tree_flatten(node, is_leaf=lambda c: c is not node)
        return treedef.unflatten([_map_leaves(child, convert) for child in children])
    if kind == _DICT_SUBCLASS:
        rebuilt = _copy.copy(node)
        for key, value in node.items():
            rebuilt[key] = _map_leaves(value, convert)
        return rebuilt
    return _map_other_container(node, kind, convert)


def _map_dataclass(node: Any, convert: LeafConverter) -> Any:
    """A copy of a dataclass instance with each field converted (frozen and slotted ones too)."""
    rebuilt = _copy.copy(node)
    for field in dataclasses.fields(node):
        value = getattr(node, field.name, _Slot)  # an init=False field may never have been set
        if value is not _Slot:
            object.__setattr__(rebuilt, field.name, _map_leaves(value, convert))
    return rebuilt


def _map_other_container(node: Any, kind: int, convert: LeafConverter) -> Any:
    """List, tuple and Mapping subclasses with no known recipe: rebuilt only if holding arrays."""
    if kind == _MAPPING:
        items = {key: _map_leaves(value, convert) for key, value in node.items()}
        unchanged = all(items[key] is value for key, value in node.items())
    else:
        children = [_map_leaves(child, convert) for child in node]
        unchanged = all(new is old for new, old in zip(children, node, strict=True))
    if unchanged:
        return node
    try:
        if kind == _LIST_SUBCLASS:
            rebuilt = _copy.copy(node)
            rebuilt[:] = children
            return rebuilt
        return type(node)(items if kind == _MAPPING else children)
    except Exception as exc:
        raise TypeError(
            f"can't rebuild a {type(node).__qualname__} holding arrays; register the type with "
            "jax.tree_util (register_pytree_node) so its children can be replaced"
        ) from exc


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
