"""One array leaf into each library: torch, JAX and numpy, in place where the library can take
the memory, else through exactly one copy."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from .._dlpack import CPU_READABLE_DEVICE_TYPES, DLPackObject, asdlpack
from ._jax import (
    _JAX_ALIGNMENT,
    _X32_NARROWING,
    DtypeNarrowingWarning,
    _import_host_capsule,
    _is_compact,
    _jax_device,
    _jax_dtype,
    _jax_to_dlpack,
    _narrowing_message,
    _warn_from_caller,
)
from ._pytree import (
    _JAX,
    _KINDS,
    _NUMPY,
    _NUMPY_SCALAR,
    _SHAPE_SPEC,
    _TORCH,
    _TRACER,
    _classify,
)
from ._request import (
    _CPU,
    _CUDA,
    _HOST,
    _device_name,
    _ExportAs,
    _missing,
    _refuse_copy,
    _Request,
)
from ._torch import _torch_device, _torch_device_tuple, _torch_dtype, _torch_source

if TYPE_CHECKING:
    import jax
    import numpy
    import torch


# A dtype's name by the dtype: str() of a numpy dtype runs Python code in numpy, about 2.8 µs,
# more than half again what handing over one small leaf costs. An exchange meets few dtypes, and
# numpy keeps each dtype's hash.
_dtype_name = functools.lru_cache(maxsize=64)(str)


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


def _copy_reasons(
    obj: DLPackObject,
    target: tuple[int, int],
    request: _Request,
    *,
    readonly: str | None,
    layout: str | None,
) -> list[str]:
    """Why handing ``obj`` to a library on ``target`` takes a copy (empty: it needs none).

    ``readonly`` and ``layout`` are the library's own reasons, if any: a read-only source it
    can't take as it is, and a layout it can't read. A copy the source already needs (swapped
    byte order, byte strides that aren't whole elements) stands for the read-only reason, as
    the copy makes fresh, writable memory anyway.
    """
    source = obj.device
    reasons = []
    if target != source:
        reasons.append(f"a move from {_device_name(source)} to {_device_name(target)}")
    if obj.copy_reason is not None:
        reasons.append(obj.copy_reason)
    elif readonly is not None:
        reasons.append(readonly)
    if layout is not None:
        reasons.append(layout)
    if request.copy:
        reasons.append("copy=True")
    return reasons


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
    move_to = request.device
    if move_to is not None and move_to == _torch_device_tuple(tensor.device):
        move_to = None
    if move_to is None and not request.copy:
        return tensor
    if move_to is not None and request.copy is False:
        raise _refuse_copy("this tensor", [f"a move to {_device_name(move_to)}"])
    target = _torch_device(move_to) if move_to is not None else tensor.device
    return tensor.to(device=target, copy=bool(request.copy))


def _dlpack_to_torch(obj: DLPackObject, request: _Request, *, immutable: bool) -> torch.Tensor:
    """Hand ``obj`` to torch: in place when torch may have it, else through exactly one copy."""
    import torch

    _torch_dtype(
        _dtype_name(obj.dtype)
    )  # BufferError for types torch lacks, before anything is copied
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
    reasons = _copy_reasons(
        obj,
        target,
        request,
        readonly=(
            "read-only or immutable memory, which torch can't mark read-only "
            "(share_readonly=True lends it anyway)"
            if (immutable or obj.readonly) and not request.share_readonly
            else None
        ),
        layout=(
            "negative strides, which torch can't represent"
            if not obj.c_contiguous and (obj.strides is None or any(s < 0 for s in obj.strides))
            else None
        ),
    )
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
    name = _dtype_name(obj.dtype)  # a numpy dtype's name, or the name numpy lacks
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
    if not (obj.c_contiguous or _is_compact(obj.shape, obj.strides)):
        layout = "a layout XLA can't read in place (only dense, in any dimension order)"
    elif obj.data_ptr % _JAX_ALIGNMENT:
        layout = f"memory not aligned to {_JAX_ALIGNMENT} bytes, as XLA needs"
    else:
        layout = None
    reasons = _copy_reasons(
        obj,
        target,
        request,
        readonly=(
            "read-only memory (JAX takes only legacy DLPack capsules, which can't say so)"
            if obj.readonly
            else None
        ),
        layout=layout,
    )
    narrowed = None if x64 else _X32_NARROWING.get(name)
    if narrowed is not None and request.copy is False:
        reasons.append(f"{name} must become {narrowed} (jax_enable_x64 is off)")
    if reasons and request.copy is False:
        raise _refuse_copy("this array", reasons)
    copy = True if reasons else None
    if target == _HOST and source[0] in (_CPU, _CUDA):
        move_to = None if target == source else target
        array = _import_host_capsule(obj.__dlpack__(dl_device=move_to, copy=copy))
    else:
        import jax

        # Other memory JAX may read (pinned host memory, ...) stays where it is: JAX decides.
        device = _jax_device(target) if target[0] in (_CPU, _CUDA) else None
        array = jax.dlpack.from_dlpack(_ExportAs(obj, target, copy), device=device)
    if narrowed is not None:
        import jax.numpy as jnp

        _warn_from_caller(_narrowing_message(name, narrowed), DtypeNarrowingWarning)
        array = jnp.asarray(array, dtype=narrowed)
    return array


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

    moves = obj.device[0] not in CPU_READABLE_DEVICE_TYPES
    if moves and request.copy is False:
        raise _refuse_copy("this array", [f"a move from {_device_name(obj.device)} to the CPU"])
    copy = True if moves or request.copy else None
    if _dtype_name(obj.dtype) in _NUMPY_DLPACK_TYPES:
        array = np.from_dlpack(_ExportAs(obj, _HOST, copy) if moves else obj, copy=copy)
    else:
        array = _numpy_via_ml_dtypes(obj, moves, copy)
    if immutable and not copy:
        array.flags.writeable = False
    return array


def _numpy_via_ml_dtypes(obj: DLPackObject, moves: bool, copy: bool | None) -> Any:
    name = _dtype_name(obj.dtype)
    try:
        import ml_dtypes
    except ImportError as exc:
        raise BufferError(f"numpy reads {name} only through {_missing('ml_dtypes', exc)}") from exc
    dtype = getattr(ml_dtypes, name, None)
    if dtype is None:
        raise BufferError(f"neither numpy nor ml_dtypes has a {name} dtype")
    import numpy as np

    if moves:
        obj = asdlpack(obj.__dlpack__(dl_device=_HOST, max_version=(1, 3), copy=True))
        copy = None
    if obj.nbytes == 0:
        return np.empty(obj.shape, dtype=dtype)
    array = np.asarray(_RawItems(obj)).view(dtype)
    return array.copy() if copy else array


def _array_to_torch(leaf: Any, request: _Request) -> torch.Tensor:
    """An array leaf of any kind as a torch tensor (its kind looked up here)."""
    kind = _KINDS.get(type(leaf))
    if kind is None:
        kind = _classify(leaf)
    return _leaf_to_torch(leaf, kind, request)
