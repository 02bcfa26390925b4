"""JAX helpers (JAX is imported on first use): devices, dtypes, x64 narrowing, and host
memory in and out of JAX through jaxlib's own DLPack entry points where they pass a check."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._dlpack import DLPackObject, asdlpack
from ._request import _CPU, _CUDA, _HOST, _device_name

if TYPE_CHECKING:
    import jax

# The package whose frames _warn_from_caller skips to reach the user's call, and the libraries
# that call into it on the user's behalf (torch.nn.Module.__call__ runs a JaxModule's forward,
# JAX runs callbacks and transformations).
_PACKAGE = __name__.rpartition(".")[0]
_CALLERS_BETWEEN = ("torch", "jax", "jaxlib")
# XLA reads imported host buffers in place only at this alignment (it copies or refuses others).
_JAX_ALIGNMENT = 64


class DtypeNarrowingWarning(UserWarning):
    """A 64-bit dtype became its 32-bit counterpart in JAX because ``jax_enable_x64`` is off."""


DtypeNarrowingWarning.__module__ = _PACKAGE


# 64-bit types JAX narrows when jax_enable_x64 is off.
_X32_NARROWING = {
    "float64": "float32",
    "int64": "int32",
    "uint64": "uint32",
    "complex128": "complex64",
}


def _x64_enabled() -> bool:
    import jax

    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]  # not in jax's stubs


def _warn_from_caller(message: str, category: type[Warning]) -> None:
    """Warn with the location of the first frame outside this package and the libraries calling
    it (the user's call)."""
    level = 2  # warnings.warn's level for the frame below
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _in_package(frame.f_globals.get("__name__")):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def _in_package(module: str | None) -> bool:
    if module is None:
        return False
    top = module.partition(".")[0]
    return module == _PACKAGE or module.startswith(_PACKAGE + ".") or top in _CALLERS_BETWEEN


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
            from jax._src.lib import _jax, jaxlib_extension_version  # type: ignore[attr-defined]

            to_buffer = _jax.dlpack_managed_tensor_to_buffer
            to_capsule = _jax.buffer_to_dlpack_managed_tensor
        except (ImportError, AttributeError):
            return

        def import_capsule(capsule: Any, device: Any) -> Any:
            if jaxlib_extension_version >= 467:
                return to_buffer(capsule, device, None, None, _CPU)
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
    def _self_check(
        import_capsule: Callable[[Any, Any], Any], export_capsule: Callable[[Any], Any]
    ) -> bool:
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
    if array.is_deleted():  # jaxlib would raise a RuntimeError from array.devices()
        raise BufferError(
            "this JAX array was deleted or donated (array.delete(), or passed to a jax.jit "
            "function through donate_argnums): its memory is gone"
        )
    devices = array.devices()
    if len(devices) != 1:
        if array.is_fully_replicated:
            raise BufferError(
                f"this JAX array is replicated on {len(devices)} devices; DLPack describes "
                "one buffer (each device holds all of it: convert "
                "array.addressable_shards[0].data)"
            )
        raise BufferError(
            f"this JAX array is sharded over {len(devices)} devices; DLPack describes one "
            "buffer (gather it onto one device with jax.device_put(array, device), or "
            "convert array.addressable_shards one by one)"
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
    except RuntimeError as exc:  # jaxlib's errors (an array deleted since the check, ...)
        raise BufferError(f"can't export this JAX array: {exc}") from exc


def _jax_device(device: tuple[int, int]) -> jax.Device:
    """The JAX device behind a DLPack device tuple."""
    import jax

    if device == _HOST:
        return _jax_cpu_device()
    if device[0] == _CUDA:
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


def _import_host_capsule(capsule: Any, device: jax.Device | None = None) -> jax.Array:
    """A JAX array on a CPU device (the first by default) reading a host DLPack capsule in
    place."""
    import jax

    _Jaxlib.ensure_checked()
    if _Jaxlib.import_capsule is not None:
        try:
            return _Jaxlib.import_capsule(capsule, device or _jax_cpu_device())
        except TypeError:
            _Jaxlib.give_up()  # jaxlib changed its signature: from now on, the public API
    return jax.dlpack.from_dlpack(asdlpack(capsule), device=device)
