"""Conversions of whole pytrees: to_torch, to_jax, to_numpy."""

from __future__ import annotations

import sys
from typing import Any

from ._jax import _x64_enabled
from ._leaves import _leaf_to_jax, _leaf_to_numpy, _leaf_to_torch
from ._pytree import _map_leaves
from ._request import (
    _HOST,
    DeviceLike,
    _check_copy_argument,
    _parse_device,
    _Request,
    _require,
)


def _shared_tree(tree: Any, copy: bool | None) -> tuple[Any, bool | None]:
    """A ``dlpack.SharedTree`` as its snapshot (one consistent copy, which the conversion then
    takes as it is), anything else as it is. Looked up, not imported: only a process that
    shares trees has the module."""
    module = sys.modules.get("dlpack._sharing.tree")
    if module is None or not isinstance(tree, module.SharedTree):
        return tree, copy
    if copy is False:
        raise BufferError(
            "copy=False can't be served for a SharedTree: a consistent tree is a copy (its "
            "snapshot()); its open() gives the shared memory itself, zero-copy, as updates land"
        )
    return tree.snapshot().tree, None


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
    - A ``dlpack.SharedTree`` converts as its ``snapshot()``: one consistent copy, taken by torch
      as it is (``copy=False`` is a BufferError: its ``open()`` is the shared memory itself).
    """
    _require("torch", "to_torch")
    _check_copy_argument(copy)
    if type(share_readonly) is not bool:
        raise TypeError("share_readonly must be True or False")
    tree, copy = _shared_tree(tree, copy)
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
    - A ``dlpack.SharedTree`` converts as its ``snapshot()``: one consistent copy, which XLA
      reads in place (``copy=False`` is a BufferError: its ``open()`` is the shared memory).
    """
    _require("jax", "to_jax")
    _check_copy_argument(copy)
    tree, copy = _shared_tree(tree, copy)
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
    - A ``dlpack.SharedTree`` converts as its ``snapshot()``: one consistent copy, writable
      (``copy=False`` is a BufferError: its ``open()`` is the shared memory itself).
    """
    _require("numpy", "to_numpy")
    _check_copy_argument(copy)
    target = _parse_device(device)
    if target not in (None, _HOST):
        raise ValueError(f"numpy arrays live on the CPU; device={device!r} can't be served")
    tree, copy = _shared_tree(tree, copy)
    request = _Request(None, copy, False)
    return _map_leaves(tree, lambda leaf, kind: _leaf_to_numpy(leaf, kind, request))
