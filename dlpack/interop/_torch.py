"""torch helpers (torch is imported on first use): dtypes, devices, a tensor's memory."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ._request import (
    _CPU,
    _CUDA,
    _HOST,
    _current_cuda_index,
    _device_name,
    _loaded,
    _refuse_copy,
)

if TYPE_CHECKING:
    import torch


@functools.cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    """torch dtypes by the names DLPackObject.dtype uses ("float32", "bfloat16", ...)."""
    import torch

    names: dict[str, torch.dtype] = {}
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

    if device[0] == _CPU:
        return torch.device("cpu")
    if device[0] == _CUDA:
        return torch.device("cuda", device[1])
    raise BufferError(f"{_device_name(device)}: torch conversions support CPU and CUDA devices")


def _torch_device_tuple(device: torch.device) -> tuple[int, int]:
    if device.type == "cpu":
        return _HOST
    if device.type == "cuda":
        return (_CUDA, device.index if device.index is not None else _current_cuda_index())
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


def _conj_if_complex(array: Any) -> Any:
    """torch's gradients are the conjugates of JAX's cotangents for complex values."""
    torch = _loaded("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        return array.conj() if array.is_complex() else array
    return array.conj() if array.dtype.kind == "c" else array
