"""Move pytrees of arrays between torch, JAX and numpy, and call each framework from the other.

Conversions (zero-copy wherever the consumer can take the memory, built on ``asdlpack``):

- :func:`to_torch`, :func:`to_jax`, :func:`to_numpy` convert every array leaf of a pytree
  (tuples, lists, dicts with any keys, namedtuples, dataclasses, JAX-registered nodes) and keep
  every container's exact type and every non-array leaf as it is. :func:`is_array` says which
  leaves count as arrays.

Functions and autograd:

- :func:`torch_callable` makes a JAX function callable with torch tensors, torch autograd
  flowing through ``jax.vjp``; :class:`JaxModule` makes a JAX function with a parameter pytree a
  ``torch.nn.Module``.
- :func:`jax_callable` makes a torch function callable from JAX, under ``jax.jit``, ``jax.grad``
  and ``jax.vmap`` (``jax.custom_vjp`` over ``jax.pure_callback`` and ``torch.func.vjp``);
  :func:`module_to_jax` makes a torch module a pure JAX function of its parameters and buffers.

torch and JAX are imported only when a function needs them; numpy is needed only by
:func:`to_numpy` and the JAX paths.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import functools
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from ._dlpack import DLPackObject, asdlpack

if TYPE_CHECKING:
    import jax
    import numpy
    import torch

__all__ = [
    "DtypeNarrowingWarning",
    "JaxModule",  # noqa: F822 - created by the module's __getattr__, as it imports torch
    "is_array",
    "jax_callable",
    "module_to_jax",
    "to_jax",
    "to_numpy",
    "to_torch",
    "torch_callable",
]

DeviceLike: TypeAlias = Any
"""``None``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"gpu:N"``, a ``torch.device``, a JAX device,
or a DLPack ``(device_type, device_id)`` tuple."""


class DtypeNarrowingWarning(UserWarning):
    """A 64-bit dtype became its 32-bit counterpart in JAX because ``jax_enable_x64`` is off."""


# ---------------------------------------------------------------------------------------------
# Devices, as DLPack (device_type, device_id) tuples
# ---------------------------------------------------------------------------------------------

_KDL_CPU = 1
_KDL_CUDA = 2
_KDL_CUDA_HOST = 3
_KDL_ROCM_HOST = 11
_KDL_CUDA_MANAGED = 13
_HOST = (_KDL_CPU, 0)
# Memory numpy can read in place: host memory, pinned host memory and managed memory.
_HOST_READABLE = frozenset({_KDL_CPU, _KDL_CUDA_HOST, _KDL_ROCM_HOST, _KDL_CUDA_MANAGED})
# XLA reads imported host buffers in place only at this alignment (it copies or refuses others).
_JAX_ALIGNMENT = 64


def _device_name(device: tuple[int, int]) -> str:
    """A device tuple as users write it, for messages."""
    if device[0] == _KDL_CPU:
        return "cpu"
    if device[0] == _KDL_CUDA:
        return f"cuda:{device[1]}"
    return f"DLPack device {device}"


def _parse_device(device: DeviceLike) -> tuple[int, int] | None:
    """Read a device argument of any library into a DLPack device tuple (None stays None)."""
    if device is None:
        return None
    if isinstance(device, str):
        kind, _, index = device.strip().lower().partition(":")
        if index and not index.isdigit():
            raise ValueError(f"device {device!r}: the index after ':' must be a number")
        if kind == "cpu" and index in ("", "0"):
            return _HOST
        if kind in ("cuda", "gpu"):
            return (_KDL_CUDA, int(index) if index else _current_cuda_index())
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or 'gpu:N'")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(device, torch.device):
        if device.type == "cpu":
            return _HOST
        if device.type == "cuda":
            return (_KDL_CUDA, _current_cuda_index() if device.index is None else device.index)
        raise ValueError(f"device {device}: only CPU and CUDA devices are supported")
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(device, jax.Device):
        if device.platform == "cpu":
            return _HOST
        if device.platform in ("gpu", "cuda"):
            return (_KDL_CUDA, getattr(device, "local_hardware_id", device.id))
        raise ValueError(f"device {device}: only CPU and CUDA devices are supported")
    if isinstance(device, tuple) and len(device) == 2 and all(type(part) is int for part in device):
        return device
    raise TypeError(
        "device must be None, a string such as 'cpu' or 'cuda:0', a torch.device, a JAX device "
        f"or a DLPack (device_type, device_id) tuple, not {type(device).__name__}"
    )


def _current_cuda_index() -> int:
    """The CUDA device a bare 'cuda' means: torch's current device when torch can tell, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


def _check_copy_argument(copy: bool | None) -> None:
    """``copy`` is a tri-state flag, as in the array API's ``from_dlpack``."""
    if copy is not None and type(copy) is not bool:
        raise TypeError(f"copy must be None, True or False, not {type(copy).__name__}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Request:
    """What one conversion asks of every leaf."""

    device: tuple[int, int] | None
    copy: bool | None
    share_readonly: bool


_AS_IS = _Request(device=None, copy=None, share_readonly=False)


def _refuse_copy(what: str, reasons: list[str]) -> BufferError:
    """The error for copy=False when the conversion can't be served without a copy."""
    return BufferError(f"{what} needs a copy ({'; '.join(reasons)}), and copy=False forbids it")


class _ExportAs:
    """A DLPack producer serving ``source`` on a fixed device, with a fixed copy decision.

    Consumers' ``from_dlpack`` functions ask it with their own stream, so a move between the CPU
    and CUDA runs in our copy engine ordered on the consumer's stream.
    """

    __slots__ = ("_copy", "_device", "_source")

    def __init__(self, source: DLPackObject, device: tuple[int, int], copy: bool | None) -> None:
        self._source = source
        self._device = device
        self._copy = copy

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        move_to = None if self._device == self._source.device else self._device
        return self._source.__dlpack__(
            stream=stream, max_version=max_version, dl_device=move_to, copy=self._copy
        )


# ---------------------------------------------------------------------------------------------
# Pytrees: which leaves are arrays, and rebuilding every container with its own type
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Library helpers (imported on first use)
# ---------------------------------------------------------------------------------------------


def _require(module: str, what: str) -> Any:
    """Import ``module`` or say which function needs it."""
    try:
        return __import__(module)
    except ImportError as exc:
        raise ImportError(f"dlpack.interop.{what} needs {module}, which is not installed") from exc


@functools.cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    """torch dtypes by the names DLPackObject.dtype uses ("float32", "bfloat16", ...)."""
    import torch

    names = {}
    for value in vars(torch).values():
        if isinstance(value, torch.dtype):
            names.setdefault(str(value).removeprefix("torch."), value)
    return names


def _torch_dtype(name: str) -> torch.dtype:
    dtype = _torch_dtypes().get(name)
    if dtype is None:
        raise BufferError(f"torch has no {name} dtype")
    return dtype


def _torch_device(device: tuple[int, int]) -> torch.device:
    import torch

    if device[0] == _KDL_CPU:
        return torch.device("cpu")
    if device[0] == _KDL_CUDA:
        return torch.device("cuda", device[1])
    raise BufferError(f"{_device_name(device)}: torch conversions support CPU and CUDA devices")


def _torch_device_tuple(device: torch.device) -> tuple[int, int]:
    if device.type == "cpu":
        return _HOST
    if device.type == "cuda":
        return (_KDL_CUDA, device.index if device.index is not None else _current_cuda_index())
    return (-1, -1)  # matches no requested device, so a request moves it with torch's .to()


def _torch_source(tensor: torch.Tensor, copy: bool | None) -> tuple[torch.Tensor, bool]:
    """The tensor whose memory holds ``tensor``'s values, and whether that took a copy.

    Conversions carry values, not autograd history: a tensor requiring grad is detached (no
    copy). Lazy conjugate and negative bits (``x.conj()``, views of them) are materialised in
    one copy, since DLPack has no way to carry them.
    """
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        if copy is False:
            raise _refuse_copy("this torch tensor", ["its lazy conjugate or negative bit is set"])
        import torch

        resolved = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        resolved.copy_(tensor)
        return resolved, True
    return tensor, False


# 64-bit types JAX narrows when jax_enable_x64 is off.
_X32_NARROWING = {
    "float64": "float32",
    "int64": "int32",
    "uint64": "uint32",
    "complex128": "complex64",
}


def _x64_enabled() -> bool:
    import jax

    return bool(jax.config.jax_enable_x64)


def _warn_from_caller(message: str, category: type[Warning]) -> None:
    """Warn with the location of the first frame outside this module (the user's call)."""
    level = 2  # warnings.warn's level for the frame below
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def _narrowing_message(name: str, narrowed: str) -> str:
    return (
        f"{name} became {narrowed} in JAX: 64-bit types need jax_enable_x64 "
        "(jax.config.update('jax_enable_x64', True) or `with jax.enable_x64(True):`); "
        "pass copy=False to make this an error"
    )


class _Jaxlib:
    """jaxlib's own DLPack entry points, used for host memory when they pass a self-check.

    ``jax.dlpack.from_dlpack`` spends about 90% of a small array's conversion in Python wrappers
    (device lookup, an exception to find no stream on the CPU, ``jnp.asarray``), and
    ``jax.Array.__dlpack__`` most of its; these are the functions both end in. They are private,
    so they are used only after importing and exporting a known array gave the right result,
    once per process; otherwise (or if a call's signature ever fails) the public API is used.
    """

    checked = False
    import_capsule: Callable[[Any, Any], Any] | None = None
    export_capsule: Callable[[Any], Any] | None = None

    @classmethod
    def ensure_checked(cls) -> None:
        if cls.checked:
            return
        cls.checked = True
        try:
            from jax._src.lib import _jax, jaxlib_extension_version

            to_buffer = _jax.dlpack_managed_tensor_to_buffer
            to_capsule = _jax.buffer_to_dlpack_managed_tensor
        except (ImportError, AttributeError):
            return

        def import_capsule(capsule: Any, device: Any) -> Any:
            if jaxlib_extension_version >= 467:
                return to_buffer(capsule, device, None, None, _KDL_CPU)
            return to_buffer(capsule, device, None, None)

        def export_capsule(array: Any) -> Any:
            return to_capsule(array, stream=None)

        try:
            if cls._self_check(import_capsule, export_capsule):
                cls.import_capsule = staticmethod(import_capsule)
                cls.export_capsule = staticmethod(export_capsule)
        except Exception:  # noqa: BLE001 - any failure means: use the public API
            pass

    @staticmethod
    def _self_check(import_capsule: Callable, export_capsule: Callable) -> bool:
        import jax
        import numpy as np

        source = np.frombuffer(bytearray(24 * 4 + _JAX_ALIGNMENT), dtype=np.float32)
        skip = (-source.ctypes.data % _JAX_ALIGNMENT) // 4
        source = source[skip : skip + 24].reshape(4, 6)
        source[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
        device = jax.devices("cpu")[0]
        imported = import_capsule(asdlpack(source).__dlpack__(), device)
        if not (
            isinstance(imported, jax.Array)
            and imported.shape == (4, 6)
            and imported.dtype == np.float32
            and imported.unsafe_buffer_pointer() == source.ctypes.data
            and np.array_equal(np.asarray(imported), source)
        ):
            return False
        exported = asdlpack(export_capsule(imported))
        return (
            exported.shape == (4, 6)
            and exported.dtype == "float32"
            and exported.data_ptr == source.ctypes.data
        )

    @classmethod
    def give_up(cls) -> None:
        cls.import_capsule = None
        cls.export_capsule = None


def _jax_to_dlpack(array: jax.Array) -> DLPackObject:
    """Wrap a concrete, single-device JAX array (waits until JAX has computed it)."""
    devices = array.devices()
    if len(devices) != 1:
        raise BufferError(
            f"this JAX array is sharded over {len(devices)} devices; DLPack describes one "
            "buffer (gather it, or convert array.addressable_shards one by one)"
        )
    _Jaxlib.ensure_checked()
    try:
        if _Jaxlib.export_capsule is not None and next(iter(devices)).platform == "cpu":
            try:
                capsule = _Jaxlib.export_capsule(array)
            except TypeError:
                _Jaxlib.give_up()  # jaxlib changed its signature: from now on, the public API
            else:
                return asdlpack(capsule)
        return asdlpack(array)
    except RuntimeError as exc:  # jaxlib's errors (a deleted or donated array, ...)
        raise BufferError(f"can't export this JAX array: {exc}") from exc


def _jax_device(device: tuple[int, int]) -> jax.Device:
    """The JAX device behind a DLPack device tuple."""
    import jax

    if device == _HOST:
        return _jax_cpu_device()
    if device[0] == _KDL_CUDA:
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        for candidate in gpus:
            if getattr(candidate, "local_hardware_id", candidate.id) == device[1]:
                return candidate
        raise BufferError(
            f"JAX has no device {_device_name(device)} (its devices: {jax.devices()})"
        )
    raise BufferError(f"{_device_name(device)}: JAX conversions support CPU and CUDA devices")


@functools.cache
def _jax_dtype(name: str) -> Any:
    """The JAX dtype of a DLPackObject.dtype name (BufferError for types JAX lacks)."""
    import jax.numpy as jnp

    try:
        return jnp.dtype(name)
    except TypeError as exc:
        raise BufferError(f"JAX has no {name} dtype") from exc


@functools.cache
def _jax_cpu_device() -> jax.Device:
    import jax

    return jax.devices("cpu")[0]


def _is_compact(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """True when the strides lay the elements out densely in some dimension order.

    That is what XLA imports in place (a transpose is fine; slices with gaps, broadcasts and
    negative strides are not). Dimensions of size 1 have no stride that matters.
    """
    if strides is None:
        return False
    if 0 in shape:
        return True
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(shape, strides, strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


# ---------------------------------------------------------------------------------------------
# One leaf into each library
# ---------------------------------------------------------------------------------------------


def _tracer_error(target: str) -> TypeError:
    return TypeError(
        f"{target} got a JAX tracer: inside jax.jit, jax.grad or jax.vmap a value is abstract and "
        "has no memory to convert. Run torch code from traced JAX code through "
        "jax.pure_callback, or wrap the torch function with dlpack.interop.jax_callable, "
        "which does that (with gradients)"
    )


def _to_dlpack_object(leaf: Any, kind: int) -> DLPackObject:
    """A DLPackObject for a non-torch, non-JAX array leaf."""
    if type(leaf) is DLPackObject:
        return leaf
    if kind == _SHAPE_SPEC:
        raise TypeError("a jax.ShapeDtypeStruct describes an array but holds no data to convert")
    return asdlpack(leaf)


def _leaf_to_torch(leaf: Any, kind: int, request: _Request) -> torch.Tensor:
    """One array leaf as a torch tensor (see :func:`to_torch`)."""
    if kind == _TORCH:
        return _torch_to_torch(leaf, request)
    if kind == _TRACER:
        raise _tracer_error("to_torch")
    if kind == _JAX:
        return _dlpack_to_torch(_jax_to_dlpack(leaf), request, immutable=True)
    return _dlpack_to_torch(_to_dlpack_object(leaf, kind), request, immutable=False)


def _torch_to_torch(tensor: torch.Tensor, request: _Request) -> torch.Tensor:
    """A torch tensor stays itself unless a device or a copy is asked for (then torch's .to)."""
    moves = request.device is not None and request.device != _torch_device_tuple(tensor.device)
    if not moves and not request.copy:
        return tensor
    if moves and request.copy is False:
        raise _refuse_copy("this tensor", [f"a move to {_device_name(request.device)}"])
    target = _torch_device(request.device) if moves else tensor.device
    return tensor.to(device=target, copy=bool(request.copy))


def _dlpack_to_torch(obj: DLPackObject, request: _Request, *, immutable: bool) -> torch.Tensor:
    """Hand ``obj`` to torch: in place when torch may have it, else through exactly one copy."""
    import torch

    _torch_dtype(obj.dtype)  # BufferError for types torch lacks, before anything is copied
    source = obj.device
    if (  # the common case, checked first: host memory torch may have as it is
        request.device is None
        and not request.copy
        and source == _HOST
        and obj.c_contiguous
        and obj.copy_reason is None
        and (request.share_readonly or not (immutable or obj.readonly))
    ):
        return torch.from_dlpack(obj.__dlpack__(max_version=(1, 3)))
    target = request.device or source
    reasons = []
    if target != source:
        reasons.append(f"a move from {_device_name(source)} to {_device_name(target)}")
    if obj.copy_reason is not None:
        reasons.append(obj.copy_reason)
    elif (immutable or obj.readonly) and not request.share_readonly:
        reasons.append(
            "read-only or immutable memory, which torch can't mark read-only "
            "(share_readonly=True lends it anyway)"
        )
    if not obj.c_contiguous and (obj.strides is None or any(s < 0 for s in obj.strides)):
        reasons.append("negative strides, which torch can't represent")
    if request.copy:
        reasons.append("copy=True")
    if not reasons:
        return torch.from_dlpack(obj)
    if request.copy is False:
        raise _refuse_copy("this array", reasons)
    if target == source == _HOST:
        return torch.from_dlpack(obj.__dlpack__(max_version=(1, 3), copy=True))
    return torch.from_dlpack(_ExportAs(obj, target, True))


def _leaf_to_jax(leaf: Any, kind: int, request: _Request, x64: bool) -> jax.Array:
    """One array leaf as a JAX array (see :func:`to_jax`)."""
    if kind in (_JAX, _TRACER):
        return _jax_to_jax(leaf, request)
    if kind == _TORCH:
        tensor, copied = _torch_source(leaf, request.copy)
        if copied:  # the copy made a fresh dense tensor: that was the one copy
            request = dataclasses.replace(request, copy=None)
        return _dlpack_to_jax(asdlpack(tensor), request, x64)
    return _dlpack_to_jax(_to_dlpack_object(leaf, kind), request, x64)


def _jax_to_jax(array: Any, request: _Request) -> jax.Array:
    """A JAX array (or tracer) stays itself unless a device or a copy is asked for."""
    import jax
    import jax.numpy as jnp

    if request.device is not None:
        target = _jax_device(request.device)
        if isinstance(array, jax.core.Tracer):
            return jax.device_put(array, target)  # placement is decided when JAX compiles
        if array.devices() != {target}:
            if request.copy is False:
                raise _refuse_copy("this JAX array", [f"a move to {target}"])
            return jax.device_put(array, target)
    if request.copy:
        return jnp.array(array, copy=True)
    return array


def _dlpack_to_jax(obj: DLPackObject, request: _Request, x64: bool) -> jax.Array:
    """Hand ``obj`` to JAX: in place when XLA can read it, else through one copy."""
    name = obj.dtype
    _jax_dtype(name)  # BufferError for types JAX lacks
    if (  # the common case, checked first: dense, aligned, writable host memory
        request.device is None
        and not request.copy
        and obj.c_contiguous
        and not obj.readonly
        and obj.copy_reason is None
        and not obj.data_ptr % _JAX_ALIGNMENT
        and obj.device == _HOST
        and (x64 or name not in _X32_NARROWING)
    ):
        return _import_host_capsule(obj.__dlpack__())
    source = obj.device
    target = request.device or source
    reasons = []
    if target != source:
        reasons.append(f"a move from {_device_name(source)} to {_device_name(target)}")
    if obj.copy_reason is not None:
        reasons.append(obj.copy_reason)
    elif obj.readonly:
        reasons.append(
            "read-only memory (JAX takes only legacy DLPack capsules, which can't say so)"
        )
    if not (obj.c_contiguous or _is_compact(obj.shape, obj.strides)):
        reasons.append("a layout XLA can't read in place (only dense, in any dimension order)")
    elif obj.data_ptr % _JAX_ALIGNMENT:
        reasons.append(f"memory not aligned to {_JAX_ALIGNMENT} bytes, as XLA needs")
    if request.copy:
        reasons.append("copy=True")
    narrowed = None if x64 else _X32_NARROWING.get(name)
    if narrowed is not None and request.copy is False:
        reasons.append(f"{name} must become {narrowed} (jax_enable_x64 is off)")
    if reasons and request.copy is False:
        raise _refuse_copy("this array", reasons)
    copy = True if reasons else None
    if target == _HOST and source[0] in (_KDL_CPU, _KDL_CUDA):
        move_to = None if target == source else target
        array = _import_host_capsule(obj.__dlpack__(dl_device=move_to, copy=copy))
    else:
        import jax

        # Other memory JAX may read (pinned host memory, ...) stays where it is: JAX decides.
        device = _jax_device(target) if target[0] in (_KDL_CPU, _KDL_CUDA) else None
        array = jax.dlpack.from_dlpack(_ExportAs(obj, target, copy), device=device)
    if narrowed is not None:
        import jax.numpy as jnp

        _warn_from_caller(_narrowing_message(name, narrowed), DtypeNarrowingWarning)
        array = jnp.asarray(array, dtype=narrowed)
    return array


def _import_host_capsule(capsule: Any) -> jax.Array:
    """A JAX array on the CPU reading a host DLPack capsule in place."""
    import jax

    _Jaxlib.ensure_checked()
    if _Jaxlib.import_capsule is not None:
        try:
            return _Jaxlib.import_capsule(capsule, _jax_cpu_device())
        except TypeError:
            _Jaxlib.give_up()  # jaxlib changed its signature: from now on, the public API
    return jax.dlpack.from_dlpack(asdlpack(capsule))


def _leaf_to_numpy(leaf: Any, kind: int, request: _Request) -> numpy.ndarray | numpy.generic:
    """One array leaf as a numpy array (see :func:`to_numpy`)."""
    if kind == _NUMPY:
        return leaf.copy() if request.copy else leaf
    if kind == _NUMPY_SCALAR:
        return leaf  # numpy's own immutable values
    if kind == _TRACER:
        raise _tracer_error("to_numpy")
    if kind == _JAX:
        return _dlpack_to_numpy(_jax_to_dlpack(leaf), request, immutable=True)
    if kind == _TORCH:
        tensor, copied = _torch_source(leaf, request.copy)
        if copied:
            request = dataclasses.replace(request, copy=None)
        return _dlpack_to_numpy(asdlpack(tensor), request, immutable=False)
    return _dlpack_to_numpy(_to_dlpack_object(leaf, kind), request, immutable=False)


# The types numpy's from_dlpack reads; the others (bfloat16, float8_*) go through ml_dtypes.
_NUMPY_DLPACK_TYPES = frozenset(
    ["bool", "float16", "float32", "float64", "complex64", "complex128"]
    + [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
)


class _RawItems:
    """Host memory of a DLPackObject as an array interface of raw items of the same size.

    numpy reads bfloat16 and float8 types only through ml_dtypes, not from DLPack; viewing
    these raw items as the ml_dtypes type gives the array in place. Being the array's base, it
    keeps the memory's owner alive.
    """

    def __init__(self, obj: DLPackObject) -> None:
        self._owner = obj
        self.__array_interface__ = {
            "version": 3,
            "shape": obj.shape,
            "strides": obj.byte_strides,
            "typestr": f"|V{obj.itemsize}",
            "data": (obj.data_ptr, obj.readonly),
        }


def _dlpack_to_numpy(obj: DLPackObject, request: _Request, *, immutable: bool) -> Any:
    """Hand ``obj`` to numpy (read-only if the source is immutable); moves device memory."""
    import numpy as np

    moves = obj.device[0] not in _HOST_READABLE
    if moves and request.copy is False:
        raise _refuse_copy("this array", [f"a move from {_device_name(obj.device)} to the CPU"])
    copy = True if moves or request.copy else None
    if obj.dtype in _NUMPY_DLPACK_TYPES:
        array = np.from_dlpack(_ExportAs(obj, _HOST, copy) if moves else obj, copy=copy)
    else:
        array = _numpy_via_ml_dtypes(obj, moves, copy)
    if immutable and not copy:
        array.flags.writeable = False
    return array


def _numpy_via_ml_dtypes(obj: DLPackObject, moves: bool, copy: bool | None) -> Any:
    try:
        import ml_dtypes
    except ImportError as exc:
        raise BufferError(f"numpy reads {obj.dtype} only with ml_dtypes installed") from exc
    dtype = getattr(ml_dtypes, obj.dtype, None)
    if dtype is None:
        raise BufferError(f"neither numpy nor ml_dtypes has a {obj.dtype} dtype")
    import numpy as np

    if moves:
        obj = asdlpack(obj.__dlpack__(dl_device=_HOST, max_version=(1, 3), copy=True))
        copy = None
    if obj.nbytes == 0:
        return np.empty(obj.shape, dtype=dtype)
    array = np.asarray(_RawItems(obj)).view(dtype)
    return array.copy() if copy else array


# ---------------------------------------------------------------------------------------------
# Conversions
# ---------------------------------------------------------------------------------------------


def to_torch(
    tree: Any,
    *,
    device: DeviceLike = None,
    copy: bool | None = None,
    share_readonly: bool = False,
) -> Any:
    """Every array leaf of ``tree`` as a ``torch.Tensor``; containers and other leaves kept.

    - ``device=None`` keeps each array where it is; otherwise ``"cpu"``, ``"cuda:N"``, a
      ``torch.device``, a JAX device or a DLPack device tuple. Moves between the CPU and CUDA run
      in dlpack's copy engine, on torch's current stream of the destination.
    - Zero-copy wherever torch can take the memory. One copy for negative strides (torch has
      none), byte strides that aren't whole elements or swapped byte order, moves, and
      read-only or immutable sources (read-only numpy arrays, JAX arrays, ``asdlpack(bytes)``):
      torch can't mark a tensor read-only, so these are copied unless ``share_readonly=True``
      lends the memory anyway (writing through such a tensor then corrupts the source).
    - ``copy=True`` always copies; ``copy=False`` raises BufferError where a copy is needed.
    - torch tensors stay themselves (``Tensor.to`` when a device or copy is asked for).
    - A JAX tracer raises TypeError (see :func:`jax_callable`).
    """
    _require("torch", "to_torch")
    _check_copy_argument(copy)
    if type(share_readonly) is not bool:
        raise TypeError("share_readonly must be True or False")
    request = _Request(_parse_device(device), copy, share_readonly)
    return _map_leaves(tree, lambda leaf, kind: _leaf_to_torch(leaf, kind, request))


def to_jax(tree: Any, *, device: DeviceLike = None, copy: bool | None = None) -> Any:
    """Every array leaf of ``tree`` as a ``jax.Array``; containers and other leaves kept.

    - ``device=None`` keeps each array where it is (CPU memory goes to JAX's CPU device, CUDA
      memory to the JAX GPU with the same index); otherwise any device argument ``to_torch``
      takes.
    - Zero-copy wherever XLA can read the memory in place: dense layouts in any dimension order,
      64-byte aligned. One copy otherwise (slices with gaps, broadcasts, negative strides,
      unaligned memory, lazy conjugate/negative torch tensors, moves), and for read-only host
      memory (JAX takes only legacy DLPack capsules, which can't carry the read-only flag).
      Tensors that require grad are detached, not copied. The JAX array then shares memory with
      the source: writing to the source later changes it (``copy=True`` takes a snapshot).
    - With ``jax_enable_x64`` off, float64/int64/uint64/complex128 become their 32-bit types
      with a :class:`DtypeNarrowingWarning`, or BufferError with ``copy=False``.
    - ``copy=True`` always copies; ``copy=False`` raises BufferError where a copy is needed.
    - JAX arrays and tracers stay themselves (``jax.device_put`` when a device is asked for).
    """
    _require("jax", "to_jax")
    _check_copy_argument(copy)
    request = _Request(_parse_device(device), copy, False)
    x64 = _x64_enabled()
    return _map_leaves(tree, lambda leaf, kind: _leaf_to_jax(leaf, kind, request, x64))


def to_numpy(tree: Any, *, device: DeviceLike = None, copy: bool | None = None) -> Any:
    """Every array leaf of ``tree`` as a ``numpy.ndarray``; containers and other leaves kept.

    - ``device`` may only name the CPU: numpy arrays live there. Device memory is moved with
      one copy (BufferError with ``copy=False``).
    - Zero-copy otherwise (numpy takes any strides). Immutable JAX arrays and read-only sources
      come back read-only. bfloat16 and float8 arrays come back as ``ml_dtypes`` arrays.
    - numpy arrays and numpy scalars stay themselves (``copy=True`` copies arrays).
    - A JAX tracer raises TypeError (see :func:`jax_callable`).
    """
    _require("numpy", "to_numpy")
    _check_copy_argument(copy)
    target = _parse_device(device)
    if target not in (None, _HOST):
        raise ValueError(f"numpy arrays live on the CPU; device={device!r} can't be served")
    request = _Request(None, copy, False)
    return _map_leaves(tree, lambda leaf, kind: _leaf_to_numpy(leaf, kind, request))


# ---------------------------------------------------------------------------------------------
# JAX functions called from torch, with torch autograd through jax.vjp
# ---------------------------------------------------------------------------------------------


def torch_callable(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    has_aux: bool = False,
    share_outputs: bool = False,
) -> Any:
    """Make the JAX function ``fn`` callable with torch tensors, torch autograd flowing through.

    Use as ``torch_callable(fn)``, ``@torch_callable`` or ``@torch_callable(has_aux=True)``.
    Arguments and keyword arguments are any pytrees: array leaves become JAX arrays (tensors in
    place, see :func:`to_jax`), other leaves are passed as they are. The result may be any
    pytree; its array leaves come back as torch tensors. When torch records gradients and a
    floating-point tensor argument requires grad, the call is a ``torch.autograd.Function``
    whose backward runs ``jax.vjp``: gradients reach every such tensor, integer inputs get none,
    any gradient layout (non-contiguous, stride 0 from ``.sum()``) is accepted, complex
    gradients follow torch's convention. Differentiating twice raises. ``jax.jit`` the function
    yourself for speed.

    - ``has_aux=True``: ``fn`` returns ``(output, aux)``; ``aux`` is converted, not
      differentiated, and the call returns ``(output, aux)``.
    - ``share_outputs=False`` copies results and gradients into torch-owned memory, because JAX
      arrays are immutable and JAX may keep them (residuals, captured constants); ``True`` lends
      them in place: never write into those tensors.

    A tensor argument modified in place between the call and ``backward()`` makes backward
    raise (JAX kept a view of it), as torch does for its own saved tensors.
    """
    if fn is None:
        return functools.partial(torch_callable, has_aux=has_aux, share_outputs=share_outputs)
    if not callable(fn):
        raise TypeError(f"torch_callable wraps a function, not {type(fn).__name__}")

    @functools.wraps(fn)
    def call_from_torch(*args: Any, **kwargs: Any) -> Any:
        return _call_jax_from_torch(fn, args, kwargs, has_aux, share_outputs)

    return call_from_torch


class _JaxCall:
    """One call of a JAX function from torch: what forward learns and backward needs."""

    def __init__(
        self,
        fn: Callable[..., Any],
        skeleton: Any,
        jax_leaves: list[Any],
        tensor_positions: list[int],
        has_aux: bool,
        share_outputs: bool,
        x64: bool,
    ) -> None:
        self.fn = fn
        self.skeleton = skeleton
        self.jax_leaves = jax_leaves
        self.tensor_positions = tensor_positions
        self.has_aux = has_aux
        self.output_request = _Request(None, None, share_outputs)
        self.x64 = x64
        self.out_skeleton: Any = None
        self.out_meta: list[tuple[tuple[int, ...], Any]] = []
        self.aux: Any = None
        self.vjp_fn: Callable[[Any], Any] | None = None
        self.differentiated: list[int] = []
        self.input_meta: list[tuple[Any, Any]] = []

    def run(self, jax_leaves: list[Any]) -> tuple[list[Any], Any]:
        """Call the function on a full list of leaves: its output leaves (skeleton kept), aux."""
        args, kwargs = _unflatten(self.skeleton, jax_leaves)
        result = self.fn(*args, **kwargs)
        output, aux = _split_aux(result, self.has_aux)
        self.out_skeleton, out_leaves, _ = _flatten(output)
        return out_leaves, aux


def _split_aux(result: Any, has_aux: bool) -> tuple[Any, Any]:
    if not has_aux:
        return result, None
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise TypeError("with has_aux=True the function must return a pair (output, aux)")
    return result[0], result[1]


def _call_jax_from_torch(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    has_aux: bool,
    share_outputs: bool,
) -> Any:
    import torch

    skeleton, leaves, kinds = _flatten((args, kwargs))
    x64 = _x64_enabled()
    tensor_positions = [i for i, kind in enumerate(kinds) if kind == _TORCH]
    tensors = [leaves[i] for i in tensor_positions]
    jax_leaves = [
        leaf if kind == _TORCH else _leaf_to_jax(leaf, kind, _AS_IS, x64)
        for leaf, kind in zip(leaves, kinds, strict=True)
    ]
    call = _JaxCall(fn, skeleton, jax_leaves, tensor_positions, has_aux, share_outputs, x64)
    records_grad = torch.is_grad_enabled() and any(
        t.requires_grad and (t.is_floating_point() or t.is_complex()) for t in tensors
    )
    if not records_grad:
        for position in tensor_positions:
            jax_leaves[position] = _leaf_to_jax(leaves[position], _TORCH, _AS_IS, x64)
        out_leaves, aux = call.run(jax_leaves)
        outputs = [_array_to_torch(leaf, call.output_request) for leaf in out_leaves]
        output = _unflatten(call.out_skeleton, outputs)
        if has_aux:
            return output, to_torch(aux, share_readonly=share_outputs)
        return output
    outputs = _jax_function_class().apply(call, *tensors)
    output = _unflatten(call.out_skeleton, list(outputs))
    return (output, call.aux) if has_aux else output


def _array_to_torch(leaf: Any, request: _Request) -> torch.Tensor:
    """An array leaf of any kind as a torch tensor (its kind looked up here)."""
    kind = _KINDS.get(type(leaf))
    if kind is None:
        kind = _classify(leaf)
    return _leaf_to_torch(leaf, kind, request)


def _conj_if_complex(array: Any) -> Any:
    """torch's gradients are the conjugates of JAX's cotangents for complex values."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return array.conj() if array.is_complex() else array
    return array.conj() if array.dtype.kind == "c" else array


@functools.cache
def _jax_function_class() -> type:
    """The torch.autograd.Function running a JAX function (defined once torch is imported)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    class JaxFunction(torch.autograd.Function):
        """Forward: the JAX function under ``jax.vjp``. Backward: the VJP it returned."""

        @staticmethod
        def forward(ctx: Any, call: _JaxCall, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            ctx.set_materialize_grads(False)
            inputs = [_leaf_to_jax(t, _TORCH, _AS_IS, call.x64) for t in tensors]
            call.differentiated = [
                j
                for j, t in enumerate(tensors)
                if ctx.needs_input_grad[j + 1] and (t.is_floating_point() or t.is_complex())
            ]
            call.input_meta = [(t.dtype, t.device) for t in tensors]
            leaves = list(call.jax_leaves)
            for position, value in zip(call.tensor_positions, inputs, strict=True):
                leaves[position] = value

            def differentiable_part(*values: Any) -> Any:
                full = list(leaves)
                for j, value in zip(call.differentiated, values, strict=True):
                    full[call.tensor_positions[j]] = value
                out_leaves, aux = call.run(full)
                return (out_leaves, aux) if call.has_aux else out_leaves

            primals = [inputs[j] for j in call.differentiated]
            if call.has_aux:
                out_leaves, call.vjp_fn, aux = jax.vjp(differentiable_part, *primals, has_aux=True)
                call.aux = to_torch(aux, share_readonly=call.output_request.share_readonly)
            else:
                out_leaves, call.vjp_fn = jax.vjp(differentiable_part, *primals)
            call.out_meta = [(leaf.shape, leaf.dtype) for leaf in out_leaves]
            outputs = tuple(_array_to_torch(leaf, call.output_request) for leaf in out_leaves)
            ctx.mark_non_differentiable(
                *[out for out in outputs if not (out.is_floating_point() or out.is_complex())]
            )
            # Saved so that torch's version counters catch in-place writes before backward:
            # JAX's residuals may be views of these tensors.
            shared = outputs if call.output_request.share_readonly else ()
            ctx.save_for_backward(*tensors, *shared)
            ctx.call = call
            return outputs

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
            call: _JaxCall = ctx.call
            ctx.saved_tensors  # noqa: B018 - raises if a saved tensor was modified in place
            cotangents = []
            for grad, (shape, dtype) in zip(grads, call.out_meta, strict=True):
                if not jnp.issubdtype(dtype, jnp.inexact):
                    cotangents.append(np.zeros(shape, dtype=jax.dtypes.float0))
                elif grad is None:
                    cotangents.append(jnp.zeros(shape, dtype=dtype))
                else:
                    cotangent = _leaf_to_jax(grad, _TORCH, _AS_IS, call.x64)
                    if cotangent.dtype != dtype:
                        cotangent = cotangent.astype(dtype)
                    cotangents.append(_conj_if_complex(cotangent))
            assert call.vjp_fn is not None  # set by forward whenever backward can run
            input_grads = call.vjp_fn(cotangents)
            result: list[torch.Tensor | None] = [None] * len(call.input_meta)
            for j, grad in zip(call.differentiated, input_grads, strict=True):
                dtype, device = call.input_meta[j]
                tensor = _array_to_torch(_conj_if_complex(grad), call.output_request)
                result[j] = tensor.to(dtype=dtype, device=device)
            return (None, *result)

    return JaxFunction


# ---------------------------------------------------------------------------------------------
# torch functions called from JAX: jax.custom_vjp over jax.pure_callback and torch.func.vjp
# ---------------------------------------------------------------------------------------------

_VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims", "broadcast_all")


@dataclasses.dataclass(frozen=True)
class _TorchCallOptions:
    """How a torch function runs for JAX (see :func:`jax_callable`)."""

    result_shape: Any
    device: tuple[int, int] | None
    vmap_method: str
    copy_inputs: bool
    check: Callable[[], None] | None = None  # raises before a call that can't be pure


def jax_callable(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    result_shape: Any = None,
    device: DeviceLike = None,
    vmap_method: str = "sequential",
    copy_inputs: bool = False,
) -> Any:
    """Make the torch function ``fn`` callable from JAX, also under jit, grad and vmap.

    Use as ``jax_callable(fn)``, ``@jax_callable`` or ``@jax_callable(device="cuda")``.
    Arguments are any pytrees; array leaves reach ``fn`` as torch tensors (JAX's memory lent in
    place), other leaves as they are. The result may be any pytree of tensors and other values;
    its tensors come back as JAX arrays (copies: JAX arrays are immutable). Called with
    concrete arrays, ``fn`` runs at once; under a JAX transformation it runs in
    ``jax.pure_callback``. It is a ``jax.custom_vjp`` whose backward pass calls
    ``torch.func.vjp`` (recomputing the forward pass, so ``fn`` must be deterministic), only
    for the floating-point inputs JAX differentiates; integer inputs get no gradient.

    - ``result_shape``: the output's shapes and dtypes for tracing (a pytree of
      ``jax.ShapeDtypeStruct`` or arrays, or a function of the call's arguments returning one).
      By default they are found by running ``fn`` on torch fake tensors (no computation);
      where that fails, tracing raises TypeError asking for ``result_shape``.
    - ``device``: where ``fn`` computes (e.g. ``"cuda"``); default the CPU.
    - ``vmap_method``: passed to ``jax.pure_callback``. ``"sequential"`` (default) calls ``fn``
      once per batch element, which is always right; ``"expand_dims"`` or ``"broadcast_all"``
      call it once on the batch, which is right only if ``fn`` treats a leading dimension as a
      batch.
    - ``copy_inputs=True`` hands ``fn`` copies; by default, a function writing into its
      arguments raises RuntimeError (torch's version counters tell), and the JAX array it was
      lent then holds what was written.
    """
    if fn is None:
        return functools.partial(
            jax_callable,
            result_shape=result_shape,
            device=device,
            vmap_method=vmap_method,
            copy_inputs=copy_inputs,
        )
    if not callable(fn):
        raise TypeError(f"jax_callable wraps a function, not {type(fn).__name__}")
    options = _torch_call_options(result_shape, device, vmap_method, copy_inputs)
    return _torch_function_for_jax(fn, options)


def _torch_call_options(
    result_shape: Any,
    device: DeviceLike,
    vmap_method: str,
    copy_inputs: bool,
    check: Callable[[], None] | None = None,
) -> _TorchCallOptions:
    if vmap_method not in _VMAP_METHODS:
        raise ValueError(f"vmap_method must be one of {_VMAP_METHODS}, not {vmap_method!r}")
    if type(copy_inputs) is not bool:
        raise TypeError("copy_inputs must be True or False")
    return _TorchCallOptions(result_shape, _parse_device(device), vmap_method, copy_inputs, check)


def _torch_function_for_jax(fn: Callable[..., Any], options: _TorchCallOptions) -> Any:
    @functools.wraps(fn)
    def call_from_jax(*args: Any, **kwargs: Any) -> Any:
        return _call_torch_from_jax(fn, args, kwargs, options)

    return call_from_jax


def _call_torch_from_jax(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: _TorchCallOptions,
) -> Any:
    import jax

    skeleton, leaves, kinds = _flatten((args, kwargs))
    x64 = _x64_enabled()
    arrays = [
        leaf if kind in (_JAX, _TRACER) else _leaf_to_jax(leaf, kind, _AS_IS, x64)
        for leaf, kind in zip(leaves, kinds, strict=True)
    ]
    run = _TorchRun(fn, skeleton, options, x64, args, kwargs)
    if not arrays:  # nothing to trace or differentiate
        outputs = run.primal([])
        return _unflatten(run.out_skeleton, outputs)

    @jax.custom_vjp
    def torch_function(*values: Any) -> list[Any]:
        return run.primal(list(values))

    torch_function.defvjp(run.forward_rule, run.backward_rule, symbolic_zeros=True)
    outputs = torch_function(*arrays)
    return _unflatten(run.out_skeleton, list(outputs))


class _TorchRun:
    """One call of a torch function from JAX: the primal, its VJP rules and the host callbacks."""

    def __init__(
        self,
        fn: Callable[..., Any],
        skeleton: Any,
        options: _TorchCallOptions,
        x64: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.fn = fn
        self.skeleton = skeleton
        self.options = options
        self.x64 = x64
        self.args = args
        self.kwargs = kwargs
        self.out_skeleton: Any = None
        self.out_specs: list[Any] = []  # jax.ShapeDtypeStruct of each output array, as JAX has it
        self.perturbed: list[bool] | None = None
        # JAX's memory is lent to the function (read-only sources shared): it must not write.
        self.input_request = _Request(
            options.device or _HOST, True if options.copy_inputs else None, True
        )

    # -- the JAX side ------------------------------------------------------------------------

    def primal(self, values: list[Any]) -> list[Any]:
        """The outputs' arrays: computed now for concrete inputs, else by a host callback."""
        import jax

        if any(isinstance(value, jax.core.Tracer) for value in values):
            self._trace_output_specs(values)
            outputs = jax.pure_callback(
                self._host_forward,
                self.out_specs,
                *values,
                vmap_method=self.options.vmap_method,
            )
            return list(outputs)
        out_skeleton, leaves, kinds = self._run_forward(values)
        # JAX owns its results: copies, placed on the inputs' device.
        target = _parse_device(next(iter(values[0].devices()))) if values else None
        request = _Request(target, True, False)
        outputs = [
            _leaf_to_jax(leaf, kind, request, self.x64)
            for leaf, kind in zip(leaves, kinds, strict=True)
        ]
        self.out_skeleton = out_skeleton
        self.out_specs = [_shape_dtype_struct(output.shape, output.dtype) for output in outputs]
        return outputs

    def forward_rule(self, *primals: Any) -> tuple[list[Any], list[Any]]:
        """custom_vjp's forward: the outputs, with the inputs kept as residuals."""
        values = [primal.value for primal in primals]
        perturbed = [bool(primal.perturbed) for primal in primals]
        if self.perturbed is not None:  # traced again (remat, nested transforms): union
            perturbed = [a or b for a, b in zip(self.perturbed, perturbed, strict=True)]
        self.perturbed = perturbed
        return self.primal(values), values

    def backward_rule(self, values: list[Any], cotangents: list[Any]) -> tuple[Any, ...]:
        """custom_vjp's backward: torch.func.vjp for the perturbed floating-point inputs."""
        import jax
        import jax.numpy as jnp
        from jax.custom_derivatives import SymbolicZero

        perturbed = self.perturbed or [True] * len(values)
        wanted = [
            i
            for i, value in enumerate(values)
            if perturbed[i] and jnp.issubdtype(value.dtype, jnp.inexact)
        ]
        live = [
            i
            for i, spec in enumerate(self.out_specs)
            if jnp.issubdtype(spec.dtype, jnp.inexact)
            and not isinstance(cotangents[i], SymbolicZero)
        ]
        grads: list[Any] = [None] * len(values)
        if not wanted or not live:
            return tuple(grads)
        operands = [*values, *(cotangents[i] for i in live)]
        if any(isinstance(operand, jax.core.Tracer) for operand in operands):
            computed = jax.pure_callback(
                functools.partial(self._host_backward, wanted, live),
                [_shape_dtype_struct(values[i].shape, values[i].dtype) for i in wanted],
                *operands,
                vmap_method=self.options.vmap_method,
            )
        else:
            target = _parse_device(next(iter(values[0].devices())))
            request = _Request(target, True, False)
            computed = [
                _leaf_to_jax(grad, _TORCH, request, self.x64)
                for grad in self._torch_vjp(wanted, live, operands)
            ]
        for i, grad in zip(wanted, computed, strict=True):
            grads[i] = grad
        return tuple(grads)

    def _trace_output_specs(self, values: list[Any]) -> None:
        """Shapes and dtypes of the outputs, for pure_callback: given, or found with torch."""
        if self.options.result_shape is None:
            shapes = self._infer_output_shapes(values)
        elif callable(self.options.result_shape):
            shapes = self.options.result_shape(*self.args, **self.kwargs)
        else:
            shapes = self.options.result_shape
        self.out_skeleton, leaves, _ = _flatten(shapes)
        self.out_specs = []
        for leaf in leaves:
            name = _dtype_name(leaf.dtype)
            narrowed = None if self.x64 else _X32_NARROWING.get(name)
            if narrowed is not None:
                _warn_from_caller(_narrowing_message(name, narrowed), DtypeNarrowingWarning)
                name = narrowed
            self.out_specs.append(_shape_dtype_struct(tuple(leaf.shape), name))

    def _infer_output_shapes(self, values: list[Any]) -> Any:
        """Run the function on torch fake tensors: shapes and dtypes, no computation.

        No fallback on real values: an output whose shape depends on values (``x[x > 0]``)
        would get the shape of whatever values were tried, silently.
        """
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        device = _torch_device(self.options.device or _HOST)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                fakes = [
                    torch.empty(
                        value.shape, dtype=_torch_dtype(_dtype_name(value.dtype)), device=device
                    )
                    for value in values
                ]
                return self._call(fakes)
        except Exception as error:
            raise TypeError(
                f"can't find the output shapes of {getattr(self.fn, '__name__', self.fn)} for "
                f"tracing by running it on torch fake tensors ({error!r}); pass result_shape= "
                "to jax_callable (outputs whose shapes depend on values can't be traced at all)"
            ) from error

    # -- the torch side (runs in host callbacks, or at once for concrete arrays) --------------

    def _call(self, tensors: list[Any]) -> Any:
        if self.options.check is not None:
            self.options.check()
        args, kwargs = _unflatten(self.skeleton, tensors)
        return self.fn(*args, **kwargs)

    def _torch_inputs(self, arrays: list[Any] | tuple[Any, ...]) -> list[torch.Tensor]:
        return [_array_to_torch(array, self.input_request) for array in arrays]

    def _check_untouched(self, tensors: list[torch.Tensor], versions: list[int]) -> None:
        if self.options.copy_inputs:
            return  # the function had copies, to write into as it likes
        for index, (tensor, version) in enumerate(zip(tensors, versions, strict=True)):
            if tensor._version != version:
                raise RuntimeError(
                    f"the torch function wrote into its array argument #{index} in place; its "
                    "memory belongs to a JAX array, which now holds what was written. Pass "
                    "copy_inputs=True for functions that write into their arguments"
                )

    def _run_forward(self, values: list[Any] | tuple[Any, ...]) -> tuple[Any, list, list]:
        import torch

        tensors = self._torch_inputs(values)
        versions = [tensor._version for tensor in tensors]
        with torch.no_grad():
            result = self._call(tensors)
        self._check_untouched(tensors, versions)
        return _flatten(result)

    def _host_forward(self, *values: Any) -> list[Any]:
        """pure_callback's forward: host arrays matching the traced output specs."""
        _, leaves, kinds = self._run_forward(values)
        if len(leaves) != len(self.out_specs):
            raise RuntimeError(
                f"the torch function returned {len(leaves)} arrays, but tracing it found "
                f"{len(self.out_specs)}"
            )
        return [
            _host_result(leaf, kind, spec)
            for leaf, kind, spec in zip(leaves, kinds, self.out_specs, strict=True)
        ]

    def _host_backward(self, wanted: list[int], live: list[int], *operands: Any) -> list[Any]:
        """pure_callback's backward: host arrays of the wanted inputs' gradients."""
        grads = self._torch_vjp(wanted, live, list(operands))
        return [
            _host_result(grad, _TORCH, _shape_dtype_struct(operands[i].shape, operands[i].dtype))
            for i, grad in zip(wanted, grads, strict=True)
        ]

    def _torch_vjp(self, wanted: list[int], live: list[int], operands: list[Any]) -> list[Any]:
        """Gradients of the wanted inputs for the live outputs' cotangents (torch.func.vjp)."""
        import torch

        count = len(operands) - len(live)
        tensors = self._torch_inputs(operands[:count])
        cotangents = [_conj_if_complex(tensor) for tensor in self._torch_inputs(operands[count:])]
        versions = [tensor._version for tensor in tensors]
        expected = [_torch_dtype(_dtype_name(self.out_specs[i].dtype)) for i in live]

        def live_outputs(*differentiated: torch.Tensor) -> tuple[torch.Tensor, ...]:
            full = list(tensors)
            for i, tensor in zip(wanted, differentiated, strict=True):
                full[i] = tensor
            _, leaves, _ = _flatten(self._call(full))
            outputs = [leaves[i] for i in live]
            return tuple(
                out if out.dtype == dtype else out.to(dtype)
                for out, dtype in zip(outputs, expected, strict=True)
            )

        _, vjp_fn = torch.func.vjp(live_outputs, *[tensors[i] for i in wanted])
        grads = vjp_fn(tuple(cotangents))
        self._check_untouched(tensors, versions)
        return [
            torch.zeros_like(tensors[i]) if grad is None else _conj_if_complex(grad)
            for i, grad in zip(wanted, grads, strict=True)
        ]


def _dtype_name(dtype: Any) -> str:
    """The name DLPackObject.dtype uses for a torch, numpy or JAX dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    import jax.numpy as jnp

    return jnp.dtype(dtype).name


def _shape_dtype_struct(shape: tuple[int, ...], dtype: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(shape), _jax_dtype(_dtype_name(dtype)))


def _host_result(leaf: Any, kind: int, spec: Any) -> Any:
    """A torch result as the host array pure_callback expects (same shape, the spec's dtype)."""
    array = _leaf_to_numpy(leaf, kind, _AS_IS)
    if array.shape != spec.shape:
        raise RuntimeError(
            f"the torch function returned shape {array.shape} where tracing found {spec.shape}"
        )
    return array if array.dtype == spec.dtype else array.astype(spec.dtype)


def module_to_jax(
    module: torch.nn.Module,
    *,
    copy: bool = True,
    device: DeviceLike = None,
    vmap_method: str = "sequential",
    copy_inputs: bool = False,
) -> tuple[Callable[..., Any], dict[str, jax.Array]]:
    """A torch module as a pure JAX function: ``apply, state = module_to_jax(module)``.

    ``state`` is a dict of the module's parameters and buffers by their names (as in
    ``module.state_dict()``), as JAX arrays; ``apply(state, *args, **kwargs)`` runs the module
    with them (``torch.func.functional_call``) through :func:`jax_callable`, so it works under
    ``jax.jit``, ``jax.grad`` (with respect to the state and the inputs) and ``jax.vmap``. A
    ``state`` with only some of the names uses the module's own tensors for the others.
    Buffers are constants of the function, as in torch: their gradients are zero.

    The module must compute a pure function: Dropout (p > 0) or BatchNorm tracking running
    statistics in training mode raise ValueError, at wrapping and at each call; ``module.eval()``
    first. (BatchNorm in eval mode, and every module without such state, work.)

    - ``copy=True`` (default) makes ``state`` a snapshot; ``False`` shares the module's memory,
      so later in-place updates of the module (an optimiser step) show through.
    - ``device``: where the module computes (default: where its first parameter or buffer is).
    - ``vmap_method``, ``copy_inputs``: as for :func:`jax_callable`.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module_to_jax needs a torch.nn.Module, not {type(module).__name__}")
    _check_copy_argument(copy)
    _check_pure_module(module)
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    state = to_jax(tensors, copy=copy)
    if device is None:
        first = next(iter(tensors.values()), None)
        device = first.device if first is not None else "cpu"

    def run_module(state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(module, state, args, kwargs)

    options = _torch_call_options(
        None, device, vmap_method, copy_inputs, functools.partial(_check_pure_module, module)
    )
    run_for_jax = _torch_function_for_jax(run_module, options)
    buffer_names = frozenset(dict(module.named_buffers()))

    def apply(state: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        import jax

        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict of arrays by name, not {type(state).__name__}")
        # Buffers are constants of the function, as in torch, where they never get gradients
        # (and some ops, such as batch norm's running statistics, can't give them any).
        constants = {
            name: jax.lax.stop_gradient(value) if name in buffer_names else value
            for name, value in state.items()
        }
        return run_for_jax(constants, *args, **kwargs)

    apply.__name__ = apply.__qualname__ = f"{type(module).__name__}_as_jax"
    return apply, state


def _check_pure_module(module: torch.nn.Module) -> None:
    """Refuse modules whose forward pass is not a function of parameters, buffers and inputs."""
    import torch

    for name, sub in module.named_modules():
        if not sub.training:
            continue
        what = f"{name or 'the module'} ({type(sub).__name__}) in training mode"
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.p > 0:
            raise ValueError(
                f"{what} draws random numbers, so the backward pass (which recomputes the "
                "forward pass) would see other values; call module.eval() first"
            )
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            raise ValueError(
                f"{what} updates its running statistics in place, which a JAX function can't; "
                "call module.eval() first"
            )


# ---------------------------------------------------------------------------------------------
# JAX functions with parameters as torch modules
# ---------------------------------------------------------------------------------------------


@functools.cache
def _jax_module_class() -> type:
    """The JaxModule class (a torch.nn.Module, so it is defined once torch is imported)."""
    import torch

    class JaxModule(torch.nn.Module):
        """A JAX function with a parameter pytree, as a ``torch.nn.Module``.

        ``JaxModule(fn, params)`` holds ``params`` (any pytree of arrays) as torch parameters
        (floating-point and complex leaves, in ``self.params``) and buffers (other array
        leaves); ``module(*args, **kwargs)`` computes ``fn(params, *args, **kwargs)`` through
        :func:`torch_callable`, so gradients reach the parameters and the inputs.

        - ``copy_params=True`` (default) copies ``params``: an optimiser step updates the
          module's tensors, never the caller's (immutable) JAX arrays. ``False`` shares them,
          and the optimiser then writes into the JAX arrays' memory.
        - ``has_aux=True``: ``fn`` returns ``(output, aux)`` and so does the module.
        - ``share_outputs``: as for :func:`torch_callable`.

        ``params_tree()`` gives the current parameters in ``params``' structure (torch),
        ``jax_params()`` a JAX copy of them.
        """

        def __init__(
            self,
            fn: Callable[..., Any],
            params: Any,
            *,
            has_aux: bool = False,
            copy_params: bool = True,
            share_outputs: bool = False,
        ) -> None:
            super().__init__()
            if not callable(fn):
                raise TypeError(f"JaxModule wraps a function, not {type(fn).__name__}")
            if type(copy_params) is not bool:
                raise TypeError("copy_params must be True or False")
            skeleton, leaves, kinds = _flatten(params)
            request = _Request(None, True if copy_params else None, not copy_params)
            parameters = []
            self._skeleton = skeleton
            self._leaf_places: list[tuple[bool, int | str]] = []  # (is parameter, index/name)
            for index, (leaf, kind) in enumerate(zip(leaves, kinds, strict=True)):
                tensor = _leaf_to_torch(leaf, kind, request)
                if tensor.is_floating_point() or tensor.is_complex():
                    self._leaf_places.append((True, len(parameters)))
                    parameters.append(torch.nn.Parameter(tensor))
                else:
                    name = f"leaf_{index}"
                    self.register_buffer(name, tensor)
                    self._leaf_places.append((False, name))
            self.params = torch.nn.ParameterList(parameters)
            self.fn = fn
            self.has_aux = has_aux
            self.share_outputs = share_outputs

        def params_tree(self) -> Any:
            """The current parameters and buffers, in the structure ``params`` had."""
            values = [
                self.params[place] if is_param else getattr(self, place)
                for is_param, place in self._leaf_places
            ]
            return _unflatten(self._skeleton, values)

        def jax_params(self) -> Any:
            """A JAX copy of :meth:`params_tree` (to hand the trained values back to JAX)."""
            return to_jax(self.params_tree(), copy=True)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            arguments = (self.params_tree(), *args)
            return _call_jax_from_torch(
                self.fn, arguments, kwargs, self.has_aux, self.share_outputs
            )

        def extra_repr(self) -> str:
            return f"fn={getattr(self.fn, '__name__', self.fn)!s}, has_aux={self.has_aux}"

    # Where pickle finds the class: dlpack.interop.JaxModule (through __getattr__ below).
    JaxModule.__module__ = __name__
    JaxModule.__qualname__ = "JaxModule"
    return JaxModule


def __getattr__(name: str) -> Any:
    # JaxModule subclasses torch.nn.Module: created on first use, so importing this module
    # doesn't import torch.
    if name == "JaxModule":
        cls = _jax_module_class()
        globals()["JaxModule"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
