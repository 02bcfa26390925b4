"""copyto_jax: write any array into an existing JAX array's memory, through JAX's own buffer
donation (JAX arrays are immutable: writing under JAX could break what it caches or shares)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .._dlpack import DLPackObject, asdlpack
from ._jax import (
    _JAX_ALIGNMENT,
    _import_host_capsule,
    _is_compact,
    _warn_from_caller,
)
from ._leaves import _dlpack_to_jax, _dlpack_to_numpy, _dtype_name
from ._pytree import _JAX, _KINDS, _TORCH, _TRACER, _classify
from ._request import _AS_IS, _HOST, _parse_device, _Request, _require
from ._torch import _torch_source

if TYPE_CHECKING:
    import jax


class DonationWarning(UserWarning):
    """:func:`copyto_jax` could not write into the destination's own memory: the result is a new
    array, and the destination is unchanged. The message says why."""


DonationWarning.__module__ = __name__.rpartition(".")[0]


def _refill(dst: jax.Array, src: jax.Array) -> jax.Array:
    """The compiled refill: ``src`` broadcast into ``dst``, whose buffer JAX donates."""
    if src.ndim > dst.ndim:  # leading dimensions of extent 1, which numpy's broadcasting drops
        src = src.reshape(src.shape[src.ndim - dst.ndim :])
    return dst.at[...].set(src)


@functools.cache
def _refill_jit() -> Callable[[Any, Any], jax.Array]:
    """One jitted function for every refill: JAX keeps its executables by the arguments' shapes,
    dtypes, devices and shardings, so a loop compiles once per destination and source shape."""
    import jax

    return jax.jit(_refill, donate_argnums=0)


def copyto_jax(dst: jax.Array, src: Any) -> jax.Array:
    """Copy ``src`` into the memory of the JAX array ``dst``, and return the array that holds it.

    JAX arrays are immutable, so :func:`dlpack.copyto` refuses them; this writes the JAX way,
    by donating ``dst``'s buffer to a compiled ``dst.at[...].set(src)``. The result occupies
    ``dst``'s memory (the same ``unsafe_buffer_pointer()``) and ``dst`` is deleted, as any
    donated argument is: use the result from now on (``buf = copyto_jax(buf, src)``).

    - ``src`` is anything :func:`dlpack.asdlpack` reads (torch, numpy, CuPy, Arrow, ...) or a
      JAX array, in any layout; it broadcasts to ``dst``'s shape and must have ``dst``'s dtype,
      as for :func:`dlpack.copyto`: a different dtype is a TypeError, a shape that doesn't
      broadcast a ValueError. Byte order is converted.
    - No buffer of ``dst``'s size is allocated where XLA can read the source in place: host
      memory aligned to 64 bytes (torch's CPU tensors are; numpy aligns large arrays to 16
      bytes only) that is C-ordered, or dense in another dimension order and writable. A
      broadcast source is broadcast inside the compiled function, so it is never expanded.
      Other sources (unaligned, slices with gaps, negative strides, swapped byte order, another
      device) are copied once, at their own size.
    - The write is complete when this returns, so ``src`` may be changed at once.
    - One function is compiled per destination and source shape, dtype and placement, then
      reused: a loop pays compilation once.
    - A destination sharded or replicated over several devices is refilled shard by shard, each
      in its own buffer.
    - Where JAX won't write into ``dst``'s buffer, the result is a new array and a
      :class:`DonationWarning` says why (``warnings.simplefilter("error", DonationWarning)``
      makes it an error): while something else refers to the buffer (an array from
      ``np.asarray(dst)``, a DLPack export such as ``torch.from_dlpack(dst)``) or on a backend
      without donation, ``dst`` is left as it was; a ``dst`` in memory JAX did not allocate
      (from :func:`to_jax`, with ``copy=True`` too, ``jnp.from_dlpack`` or
      ``jax.device_put(numpy_array)``) is deleted all the same. Buffers JAX allocated itself
      (``jnp.zeros``, ``jnp.array(x)``) are refilled in place.
    - ``dst`` deleted or donated already is a BufferError; inside ``jax.jit`` (a tracer) a
      TypeError: there, write ``dst.at[...].set(src)`` and donate ``dst`` yourself.
    """
    kind = _KINDS.get(type(dst))
    if kind is None:
        kind = _classify(dst)
    if kind != _JAX:
        _refuse_destination(dst, kind)
    if dst.is_deleted():
        raise BufferError(
            "dst was deleted or donated (array.delete(), an earlier copyto_jax, or a jax.jit "
            "function's donate_argnums): refill the array copyto_jax returned instead"
        )
    devices = dst.sharding.device_set
    shards = len(devices) > 1
    source, borrowed = _source(dst, src, devices)
    if source is dst:
        return dst  # copying an array onto itself changes nothing
    before = _buffers(dst, shards)
    result = _refill_jit()(dst, source)
    if borrowed:
        # JAX may read the source's memory in place, and after this returns: wait, so that the
        # caller may write into it at once.
        result.block_until_ready()
    if 0 not in dst.shape and _buffers(result, shards) != before:
        _warn_from_caller(_not_donated(dst), DonationWarning)
    return result


def _refuse_destination(dst: Any, kind: int) -> NoReturn:
    _require("jax", "copyto_jax")
    if kind == _TRACER:
        raise TypeError(
            "copyto_jax got a JAX tracer as dst: inside jax.jit a value has no buffer to refill. "
            "Write dst.at[...].set(src) in the jitted function and pass dst through "
            "donate_argnums instead"
        )
    raise TypeError(
        f"copyto_jax refills JAX arrays, not {type(dst).__name__}; dlpack.copyto writes into the "
        "arrays of other libraries"
    )


def _buffers(array: jax.Array, shards: bool) -> Any:
    """The address of ``array``'s buffer, or of each shard's by device."""
    if not shards:
        return array.unsafe_buffer_pointer()
    return sorted((s.device.id, s.data.unsafe_buffer_pointer()) for s in array.addressable_shards)


def _source(dst: jax.Array, src: Any, devices: set[jax.Device]) -> tuple[Any, bool]:
    """``src`` as the refill's second argument, checked as ``copyto`` checks it, and whether JAX
    may read it in memory it does not own (then the refill must finish before returning).

    Host memory goes to JAX as a numpy array, which JAX reads in place where XLA can (dense,
    aligned) and otherwise copies at the source's own size; a dense transposed layout, which
    JAX would copy from numpy, through DLPack, which XLA reads in place.
    """
    import jax

    kind = _KINDS.get(type(src))
    if kind is None:
        kind = _classify(src)
    if kind == _TRACER:
        raise TypeError(
            "copyto_jax got a JAX tracer as src: inside jax.jit a value has no memory to copy; "
            "write dst.at[...].set(src) in the jitted function"
        )
    if kind == _JAX:
        if src.is_deleted():
            raise BufferError("src was deleted or donated: its memory is gone")
        _check(dst, _dtype_name(src.dtype), src.shape)
        return _jax_source(dst, src, devices), False
    if kind == _TORCH:
        src, _ = _torch_source(src, None)  # detached; a lazy conjugate resolved
    obj = src if type(src) is DLPackObject else asdlpack(src)
    _check(dst, _dtype_name(obj.dtype), obj.shape)
    import numpy as np

    shape = obj.shape
    if (  # the common case, checked first: C-ordered host memory in native byte order
        obj.c_contiguous
        and obj.copy_reason is None
        and obj.device == _HOST
        and not (shape and shape[0] == 1)
        and len(devices) == 1
        and (dst.committed or next(iter(devices)) == _default_device())
    ):
        return (src if type(src) is np.ndarray else np.asarray(obj)), True
    index = _broadcast_index(obj)
    if obj.device != _HOST:
        if index is not None and kind == _TORCH:
            obj, index = asdlpack(src[index]), None
        if len(devices) == 1:
            # Read in place where JAX can (dense memory of dst's device), else copied once;
            # copied whole where it is broadcast, as no view of another library's device memory
            # can be made here.
            device = next(iter(devices))
            array = _dlpack_to_jax(obj, _Request(_parse_device(device), None, False), True)
            return (array if array.devices() == devices else jax.device_put(array, device)), True
        # A sharded destination takes host memory (below), which JAX splits between devices.
        host = _dlpack_to_numpy(obj, _AS_IS, immutable=False)
    else:
        host = src if type(src) is np.ndarray else np.asarray(obj)
    if index is not None:
        host = host[index]
    if host.ndim and host.shape[0] == 1:
        # Leading dimensions of extent 1 broadcast away: a row and its broadcast share one
        # compiled refill.
        ones = next((k for k, n in enumerate(host.shape) if n != 1), host.ndim)
        host = host.reshape(host.shape[ones:])
    if not host.dtype.isnative:
        # JAX reads numpy's byte order wrong (jaxlib 0.10 takes '>f4' for float32's bytes):
        # the copy engine swaps the bytes, at the source's own size.
        host = np.from_dlpack(asdlpack(host), copy=True)
    if len(devices) > 1:
        if host.shape == dst.shape:
            return jax.device_put(host, dst.sharding), True
        return host, True  # small, as broadcast dimensions are cut: JAX puts it on each device
    device = next(iter(devices))
    if not host.flags.c_contiguous and device.platform == "cpu":
        view = asdlpack(host)
        if _in_place(view):
            return _import_host_capsule(view.__dlpack__(), device), True
    if not dst.committed and device != _default_device():
        # An uncommitted dst off the default device (made under jax.default_device): a source
        # committed to its device keeps the refill there.
        return jax.device_put(host, device), True
    return host, True


def _default_device() -> jax.Device:
    """Where JAX puts a computation whose arguments are all uncommitted."""
    import jax

    chosen = jax.config.jax_default_device  # type: ignore[attr-defined]  # not in jax's stubs
    if chosen is None:
        return _first_device()
    if isinstance(chosen, str):
        return jax.devices(chosen)[0]
    return chosen


@functools.cache
def _first_device() -> jax.Device:
    import jax

    return jax.devices()[0]


def _jax_source(dst: jax.Array, src: jax.Array, devices: set[jax.Device]) -> Any:
    """A JAX ``src`` placed as ``dst`` is (moved to ``dst``'s device, or to its sharding)."""
    import jax

    shards = len(devices) > 1
    if src.sharding == dst.sharding or (not shards and src.sharding.device_set == devices):
        if src.shape == dst.shape and _buffers(src, shards) == _buffers(dst, shards):
            return dst  # the same buffer (jax.device_put(dst) may return one): nothing to do
        return src
    if not shards:
        return jax.device_put(src, next(iter(devices)))
    if src.shape == dst.shape:
        return jax.device_put(src, dst.sharding)
    import numpy as np

    return np.asarray(src)  # JAX puts it on each device


def _check(dst: jax.Array, dtype: str, shape: tuple[int, ...]) -> None:
    """``copyto``'s checks, with its messages: equal dtypes, ``shape`` broadcasts to ``dst``'s."""
    held = _dtype_name(dst.dtype)
    if held != dtype:
        raise TypeError(
            f"copyto_jax needs equal dtypes: the destination holds {held}, the source {dtype}"
        )
    target = dst.shape
    if shape == target:
        return
    extra = len(shape) - len(target)
    if not (
        all(n == 1 for n in shape[: max(extra, 0)])
        and all(
            n in (1, t)
            for n, t in zip(shape[max(extra, 0) :], target[max(-extra, 0) :], strict=True)
        )
    ):
        raise ValueError(
            f"could not broadcast source of shape {list(shape)} into destination of shape "
            f"{list(target)}"
        )


def _broadcast_index(obj: DLPackObject) -> tuple[slice, ...] | None:
    """The index that cuts each broadcast dimension of ``obj`` (stride 0) to extent 1, so that
    the source reaches JAX at its own size (the compiled refill broadcasts it again); None when
    there is none."""
    if obj.c_contiguous:
        return None
    pairs = list(zip(obj.shape, obj.byte_strides, strict=True))
    if all(s or n < 2 for n, s in pairs):
        return None
    return tuple(slice(0, 1) if not s and n > 1 else slice(None) for n, s in pairs)


def _in_place(obj: DLPackObject) -> bool:
    """Whether XLA reads this host memory in place through DLPack (as ``to_jax`` shares it)."""
    return (
        obj.copy_reason is None
        and not obj.readonly
        and not obj.data_ptr % _JAX_ALIGNMENT
        and _is_compact(obj.shape, obj.strides)
    )


@functools.cache
def _donates(device: jax.Device) -> bool:
    """Whether JAX on ``device`` refills a donated buffer in place (tried once, on 64 bytes)."""
    import jax
    import jax.numpy as jnp

    probe = jax.device_put(jnp.zeros(16, jnp.float32), device)
    before = probe.unsafe_buffer_pointer()
    return bool(_refill_jit()(probe, probe + 1).unsafe_buffer_pointer() == before)


def _not_donated(dst: jax.Array) -> str:
    """Why the refill's result is not in ``dst``'s memory, for the warning."""
    start = "copyto_jax could not write into dst's memory: "
    if dst.is_deleted():
        return (
            start + "JAX took dst but wrote the result into a new buffer, as it does when dst "
            "is in memory JAX did not allocate (from to_jax, jnp.from_dlpack or "
            "jax.device_put(numpy_array)), which it never writes into. Make dst in JAX's own "
            "memory (jnp.zeros(...), jnp.array(x)); the result is a new array"
        )
    end = "; the result is a new array, and dst is unchanged"
    devices: set[Any] = dst.sharding.device_set
    platforms = {d.platform for d in devices}
    if not all(_donates(d) for d in devices):
        return start + f"JAX on {'/'.join(sorted(platforms))} does not donate buffers" + end
    return (
        start + "JAX won't reuse its buffer while something else refers to it, an array made "
        "from dst without a copy (np.asarray(dst), torch.from_dlpack(dst)): let those go to "
        "refill in place" + end
    )
