"""Devices as DLPack (device_type, device_id) tuples, what one conversion asks of each leaf, and
the libraries a function needs."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TypeAlias

from .._dlpack import DLDeviceType, DLPackObject

DeviceLike: TypeAlias = Any
"""``None``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"gpu:N"``, a ``torch.device``, a JAX device,
or a DLPack ``(device_type, device_id)`` tuple."""

# Device codes as plain ints, as DLPack tuples carry them.
_CPU = int(DLDeviceType.kDLCPU)
_CUDA = int(DLDeviceType.kDLCUDA)
_HOST = (_CPU, 0)


def _device_name(device: tuple[int, int]) -> str:
    """A device tuple as users write it, for messages."""
    if device[0] == _CPU:
        return "cpu"
    if device[0] == _CUDA:
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
            return (_CUDA, int(index) if index else _current_cuda_index())
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or 'gpu:N'")
    torch = _loaded("torch")
    if torch is not None and isinstance(device, torch.device):
        if device.type == "cpu":
            return _HOST
        if device.type == "cuda":
            return (_CUDA, _current_cuda_index() if device.index is None else device.index)
        raise ValueError(f"device {device}: only CPU and CUDA devices are supported")
    jax = _loaded("jax")
    if jax is not None and isinstance(device, jax.Device):
        if device.platform == "cpu":
            return _HOST
        if device.platform in ("gpu", "cuda"):
            return (_CUDA, getattr(device, "local_hardware_id", device.id))
        raise ValueError(f"device {device}: only CPU and CUDA devices are supported")
    if isinstance(device, tuple) and len(device) == 2 and all(type(part) is int for part in device):
        return device
    raise TypeError(
        "device must be None, a string such as 'cpu' or 'cuda:0', a torch.device, a JAX device "
        f"or a DLPack (device_type, device_id) tuple, not {type(device).__name__}"
    )


def _current_cuda_index() -> int:
    """The CUDA device a bare 'cuda' means: torch's current device when torch can tell, else 0."""
    torch = _loaded("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return 0


# pip's names of the libraries interop imports, where they differ from the import name.
_PIP_NAMES = {"ml_dtypes": "ml-dtypes"}


def _missing(module: str, exc: ImportError) -> str:
    """Why ``module`` can't be used, and how to install it, for messages."""
    if isinstance(exc, ModuleNotFoundError) and exc.name == module:
        why = f"{module}, which is not installed"
    else:  # installed, but its import failed (a missing shared library, a broken install)
        why = f"{module}, which failed to import ({exc})"
    return f"{why}: pip install {_PIP_NAMES.get(module, module)}"


def _loaded(module: str) -> Any:
    """The library ``module`` if this process has imported it, else None. A folder of that name
    imported in its place (Python imports a folder without ``__init__.py``, an empty ``torch/``
    in the current folder, as a namespace package when no library has the name) is not it."""
    found = sys.modules.get(module)
    if found is None or getattr(found, "__file__", None) is None:
        return None
    return found


def _require(module: str, what: str) -> None:
    """Import ``module`` or say which function of dlpack.interop needs it and how to install it."""
    try:
        __import__(module)
    except ImportError as exc:
        raise ImportError(f"dlpack.interop.{what} needs {_missing(module, exc)}") from exc
    if _loaded(module) is None:
        folders = ", ".join(getattr(sys.modules.get(module), "__path__", None) or [])
        raise ImportError(
            f"dlpack.interop.{what} needs {module}, and '{module}' here is only a folder of that "
            f"name ({folders}), not the library: pip install {_PIP_NAMES.get(module, module)}"
        )


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
